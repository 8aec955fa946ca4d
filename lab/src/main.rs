//! `fencelock-lab`: the safety lab of fencelock.
//!
//! `fencelock-lab run --short|--long [--seed N] [--out DIR] [--report FILE]` starts a
//! lock `redis-server`, a resource `redis-server` and 5 Redlock nodes (testkit), runs the
//! seeded fault scenarios with worker processes (this binary re-executed as the hidden
//! `worker` subcommand, each writing its own JSON Lines history), merges the histories,
//! runs the checkers C1-C6 and prints a markdown table (and writes it to FILE). The long
//! mode repeats every scenario for many rounds with more iterations (at least 100,000
//! acquisitions in all). It exits non-zero when any scenario's expectation fails,
//! including a positive control (a known anomaly) that its checker missed.

// Unsafe is needed for process control std does not offer: `libc::kill` (SIGSTOP and
// SIGCONT of a worker) and `prctl(PR_SET_PDEATHSIG)` in the forked worker, so workers
// die with the harness even when it is SIGKILLed.
#![allow(unsafe_code)]

mod harness;
mod outcomes;
mod report;
mod scenarios;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};

use crate::harness::{Lab, Resource};
use crate::outcomes::Outcome;
use crate::scenarios::{Minority, Restart};
use crate::worker::WorkerArgs;

/// Safety lab of fencelock: fault scenarios judged by history checkers.
#[derive(Parser, Debug)]
#[command(name = "fencelock-lab", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Runs the scenarios and prints the table; exits 1 if an expectation fails.
    Run(RunArgs),
    /// Internal: one worker process (started by `run`).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["short", "long"])))]
struct RunArgs {
    /// Short mode (about a minute, run by CI): one round of every scenario.
    #[arg(long)]
    short: bool,
    /// Long mode (about half an hour on 2 cores): many rounds with more iterations, at
    /// least 100,000 acquisitions in all.
    #[arg(long)]
    long: bool,
    /// Seed of the workers' random waits (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the histories in DIR (default: a temporary directory, removed at exit).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Run only the scenarios whose name contains TEXT (repeatable).
    #[arg(long, value_name = "TEXT")]
    only: Vec<String>,
    /// Also write the report (markdown) to FILE, e.g. docs/safety.md.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
}

/// How much of each scenario one run does.
#[derive(Clone, Copy, Debug)]
struct Scale {
    name: &'static str,
    /// Rounds of every scenario.
    rounds: u32,
    /// Iterations per worker of the no-faults scenario.
    steady: u32,
    /// Iterations per worker of the fault scenarios with steady traffic.
    faulty: u32,
}

const SHORT: Scale = Scale {
    name: "short",
    rounds: 1,
    steady: 30,
    faulty: 12,
};

const LONG: Scale = Scale {
    name: "long",
    rounds: 5,
    steady: 7_000,
    faulty: 150,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Worker(args) => match worker::main(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fencelock-lab worker: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Run(args) => match run(&args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("fencelock-lab: {e}");
                ExitCode::from(2)
            }
        },
    }
}

/// One scenario of the run: its name, what it does and expects (for the report), and
/// how to run one round of it under a tag.
struct Scenario {
    name: &'static str,
    what: &'static str,
    expected: &'static str,
    run: RoundFn,
}

type RoundFn = Box<dyn Fn(&mut Lab, &str) -> Result<Outcome, String>>;

fn scenario(
    name: &'static str,
    what: &'static str,
    expected: &'static str,
    run: impl Fn(&mut Lab, &str) -> Result<Outcome, String> + 'static,
) -> Scenario {
    Scenario {
        name,
        what,
        expected,
        run: Box::new(run),
    }
}

/// Every scenario, in run order. The protected crash-restart runs before the
/// unprotected one: it needs every node up longer than its quarantine, and the
/// unprotected one (like the killed minority) restarts nodes.
fn scenarios(scale: Scale) -> Vec<Scenario> {
    let (steady, faulty) = (scale.steady, scale.faulty);
    vec![
        scenario(
            "no-faults",
            "3 workers on one Redis, fenced resource",
            "every checker holds; the counter equals the acknowledged writes",
            move |lab, tag| lab.no_faults(tag, steady),
        ),
        scenario(
            "paused-worker-fenced",
            "p1 SIGSTOPs itself between read and write, for 3 TTLs; p2 works meanwhile",
            "the fenced resource rejects p1's late write; every checker holds",
            |lab, tag| lab.paused_worker(tag, Resource::Fenced, false),
        ),
        scenario(
            "paused-worker-unfenced",
            "the same on an unfenced resource",
            "**positive control**: C1 and C2 flag the late write, the counter shows the lost update",
            |lab, tag| lab.paused_worker(tag, Resource::Unfenced, false),
        ),
        scenario(
            "paused-worker-renewed",
            "the same with a watchdog-renewed lease (renewals stop while p1 is stopped)",
            "p1's guard reports the loss before the write (or the fence rejects it); its \
             renewals never touch p2's key",
            |lab, tag| lab.paused_worker(tag, Resource::Fenced, true),
        ),
        scenario(
            "holder-killed",
            "p1 SIGKILLed while holding a renewed lease; p2, p3 waiting",
            "C6: the next acquire within one TTL + 300 ms of the kill",
            |lab, tag| lab.holder_killed(tag, false),
        ),
        scenario(
            "holder-killed-long-lease",
            "the same, p1's lease 2 s (four times the TTL C6 judges by)",
            "**positive control**: C6 flags the late next holder",
            |lab, tag| lab.holder_killed(tag, true),
        ),
        scenario(
            "resource-crash",
            "3 workers write to the fenced resource; then its server is kill -9ed and \
             restarted without persistence",
            "**positive control**: C3 flags every acknowledged write as lost",
            |lab, tag| lab.resource_crash(tag),
        ),
        scenario(
            "counter-rewound",
            "A acquires and writes; the lock's fencing counter is set back to 1 by hand; \
             B acquires and writes",
            "**positive control**: C4 flags B's lower token; the fence rejects B's write (C2 \
             holds)",
            |lab, tag| lab.counter_rewound(tag),
        ),
        scenario(
            "delayed-replies",
            "p1's link to Redis delayed 150-450 ms each way (TTL 500 ms) by the proxy",
            "a grant arriving after its lease is refused, never a guard; every checker holds",
            move |lab, tag| lab.delayed_replies(tag, faulty),
        ),
        scenario(
            "dropped-replies",
            "p1 waits for the harness's lock (2 s lease) through a proxy that then drops its \
             replies (its requests still run) until 3 TTLs after that lease ended, and resets \
             its connections; p2, p3 start once someone took the lock in the fault",
            "a grant p1 has not heard of holds the lock (exercised); p1 holds it only once a \
             retry of the same acquire is answered, else it is withdrawn or expires; C6: the \
             lock back within one TTL of the heal; every checker holds",
            move |lab, tag| lab.dropped_replies(tag, faulty),
        ),
        scenario(
            "queued-set-nx",
            "the Redis server SIGSTOPped for 3 TTLs while workers acquire (their SET NX \
             queue in its socket, their clients time out and retry)",
            "C6: the lock back within one TTL of SIGCONT; every checker holds",
            move |lab, tag| lab.queued_set_nx(tag, faulty),
        ),
        scenario(
            "expired-holder",
            "A's lease expires, B acquires, A extends and releases late, then runs an \
             unchecked `DEL` script",
            "A's extend and release report the loss (the extend without asking Redis: A's \
             guard had heard of it) and leave B's key; **positive control**: C5 flags \
             exactly the unchecked DEL",
            |lab, tag| lab.expired_holder(tag),
        ),
        scenario(
            "redlock-restart-protected",
            "Redlock, 5 nodes: A holds; n4, n5 lose A's key; n2 kill -9 + restart \
             without persistence; B tries; restart protection on",
            "B refused (NoQuorum naming the quarantined node); every checker holds",
            |lab, tag| lab.redlock_restart(tag, Restart::Protected),
        ),
        scenario(
            "redlock-restart-unprotected",
            "the same with restart protection off; B and then A write to the fenced resource",
            "**positive control**: C1 flags A's and B's overlap, while the fence keeps C2 and C3",
            |lab, tag| lab.redlock_restart(tag, Restart::Unprotected),
        ),
        scenario(
            "redlock-restart-persistent",
            "the same, but n2 runs with `appendfsync always`; restart protection off",
            "A's key survives the crash: B finds the lock held; every checker holds",
            |lab, tag| lab.redlock_restart(tag, Restart::Persistent),
        ),
        scenario(
            "redlock-minority-blackholed",
            "Redlock, 3 workers; n2, n4 blackholed by their proxies after the first acquire",
            "≥ 80% of later acquires succeed; every checker holds",
            move |lab, tag| lab.redlock_minority(tag, Minority::Blackholed, faulty),
        ),
        scenario(
            "redlock-minority-paused",
            "the same with n2, n4 SIGSTOPped",
            "≥ 80% of later acquires succeed; every checker holds",
            move |lab, tag| lab.redlock_minority(tag, Minority::Paused, faulty),
        ),
        scenario(
            "redlock-minority-killed",
            "the same with n2, n4 SIGKILLed (restarted empty at the end)",
            "≥ 80% of later acquires succeed; every checker holds",
            move |lab, tag| lab.redlock_minority(tag, Minority::Killed, faulty),
        ),
        scenario(
            "redlock-majority-down",
            "n1-n3 partitioned away for 3 TTLs, then healed",
            "a try-acquire meanwhile fails fast (NoQuorum); C6: the lock back within one \
             TTL of the heal; every checker holds",
            move |lab, tag| lab.redlock_majority_down(tag, faulty),
        ),
        scenario(
            "redlock-partitioned",
            "per-client partitions: p1 sees n1-n2 only, p2 sees n3-n5 only",
            "p1 (a minority) stops acquiring, p2 goes on; every checker holds",
            move |lab, tag| lab.redlock_partitioned(tag, faulty),
        ),
    ]
}

/// The scenarios whose name contains one of `only` (all if empty).
fn chosen(scale: Scale, only: &[String]) -> Vec<Scenario> {
    scenarios(scale)
        .into_iter()
        .filter(|sc| only.is_empty() || only.iter().any(|o| sc.name.contains(o.as_str())))
        .collect()
}

fn run(args: &RunArgs) -> Result<bool, String> {
    let scale = if args.long { LONG } else { SHORT };
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    eprintln!("fencelock-lab run --{} --seed {seed}", scale.name);
    let started = Instant::now();
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let temp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = match &args.out {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            d.clone()
        }
        None => temp.path().to_path_buf(),
    };
    let mut lab = Lab::start(exe, dir, seed)?;

    let mut outcomes: Vec<Outcome> = Vec::new();
    for round in 1..=scale.rounds {
        for (i, sc) in chosen(scale, &args.only).into_iter().enumerate() {
            let name = sc.name;
            let tag = if scale.rounds == 1 {
                name.to_owned()
            } else {
                format!("{name}-r{round}")
            };
            lab.start_from_nothing(&tag);
            let t = Instant::now();
            let mut o = (sc.run)(&mut lab, &tag)?;
            eprintln!(
                "  {tag}: {} acquisitions in {:.1} s{}",
                o.acquisitions,
                t.elapsed().as_secs_f64(),
                if o.failed.is_empty() { "" } else { " FAILED" }
            );
            if scale.rounds > 1 {
                o.failed = o
                    .failed
                    .into_iter()
                    .map(|f| format!("{tag}: {f}"))
                    .collect();
            }
            o.name = name.to_owned();
            match outcomes.get_mut(i) {
                Some(total) => total.merge(o),
                None => outcomes.push(o),
            }
        }
    }
    let ok = outcomes.iter().all(|o| o.failed.is_empty());
    let report = report::report(
        &outcomes,
        &chosen(scale, &args.only),
        scale,
        seed,
        started.elapsed(),
        ok,
    );
    print!("{report}");
    if let Some(path) = &args.report {
        std::fs::write(path, &report).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if args.out.is_some() {
        println!("\nhistories in {}", lab.dir.display());
    }
    Ok(ok)
}
