//! `fencelock-lab`: the safety lab of fencelock.
//!
//! `fencelock-lab run --short|--long [--seed N] [--out DIR] [--report FILE]` starts a
//! lock `redis-server`, a resource `redis-server`, a PostgreSQL server (the resource of
//! the `*-postgres` scenarios) and 5 Redlock nodes (testkit; the
//! failover scenarios start a Sentinel group or a Redis Cluster of their own each
//! round), runs the seeded fault scenarios with worker processes (this binary
//! re-executed as the hidden
//! `worker` subcommand, each writing its own JSON Lines history), merges the histories,
//! runs the checkers C1-C6 and prints a markdown table (and writes it to FILE). The long
//! mode repeats every scenario for many rounds with more iterations (the scenarios with
//! faults alone make well over 100,000 acquisitions). It exits non-zero when any scenario's expectation fails,
//! including a positive control (a known anomaly) that its checker missed.
//!
//! This file holds the command line and the run loop. The rest of the lab:
//! [`harness`] (servers, proxies, workers, judging histories with the checkers),
//! [`outcomes`] (what a scenario produced, its expectations), [`report`] (the markdown
//! report), [`scenarios`] (each scenario with its description, grouped by fault),
//! [`worker`] (the worker process), [`store`] (the resource it writes, through
//! fencelock's checks or without) and [`command`] (the COMMAND of the CLI scenarios).

// Unsafe is needed for process control std does not offer: `libc::kill` (SIGSTOP and
// SIGCONT of a worker) and `prctl(PR_SET_PDEATHSIG)` in the forked worker, so workers
// die with the harness even when it is SIGKILLed.
#![allow(unsafe_code)]

mod command;
mod harness;
mod outcomes;
mod report;
mod scenarios;
mod store;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};

use crate::command::CommandArgs;
use crate::harness::Lab;
use crate::outcomes::Outcome;
use crate::scenarios::{LONG, SHORT, chosen};
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
    /// Internal: the COMMAND of the CLI scenarios (run by `fencelock run`).
    #[command(hide = true)]
    Command(CommandArgs),
    /// Prints the model checker's section of the report (docs/model.md's table), which
    /// `scripts/model --docs` puts at the end of docs/safety.md.
    ModelSection,
}

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["short", "long"])))]
struct RunArgs {
    /// Short mode (about a minute and a half, run by CI): one round of every scenario.
    #[arg(long)]
    short: bool,
    /// Long mode (about 36 minutes on 2 cores): many rounds with more iterations; the
    /// scenarios with faults alone make well over 100,000 acquisitions.
    #[arg(long)]
    long: bool,
    /// Seed of the workers' random waits (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the histories in DIR, which must be new or empty (default: a temporary
    /// directory, removed at exit).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Run only the scenarios whose name contains TEXT (repeatable).
    #[arg(long, value_name = "TEXT")]
    only: Vec<String>,
    /// Also write the report (markdown) to FILE, e.g. docs/safety.md.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// The server build every Redis server of the run runs: `redis-7` (Debian's
    /// redis-server, or $REDIS_SERVER), `redis-6.2` or `valkey-9.1` (fetched by
    /// scripts/servers), or the path of a server binary.
    #[arg(
        long,
        value_name = "BUILD",
        env = "FENCELOCK_LAB_SERVER",
        default_value = "redis-7"
    )]
    server: testkit::ServerBuild,
}

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
        Cmd::Command(args) => match command::main(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fencelock-lab command: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::ModelSection => {
            print!("{}", report::model_section());
            ExitCode::SUCCESS
        }
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

/// Runs every chosen scenario for each round of the scale, prints the report (and
/// writes it to `--report`); whether every expectation held.
fn run(args: &RunArgs) -> Result<bool, String> {
    let scale = if args.long { LONG } else { SHORT };
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    if chosen(&args.only).is_empty() {
        return Err(format!(
            "no scenario's name contains {} (the scenarios are listed in docs/safety.md)",
            args.only.join(" or ")
        ));
    }
    eprintln!(
        "fencelock-lab run --{} --seed {seed} --server {}",
        scale.name, args.server
    );
    let started = Instant::now();
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let temp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = match &args.out {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            // Histories are appended to: an earlier run's would be judged with this one's.
            let used = std::fs::read_dir(d)
                .map_err(|e| format!("{}: {e}", d.display()))?
                .next()
                .is_some();
            if used {
                return Err(format!(
                    "{} is not empty: give --out a new or empty directory (histories are \
                     appended to, and an earlier run's would be judged with this one's)",
                    d.display()
                ));
            }
            d.clone()
        }
        None => temp.path().to_path_buf(),
    };
    let mut lab = Lab::start(exe, dir, seed, args.server.clone())?;

    let mut outcomes: Vec<Outcome> = Vec::new();
    for round in 1..=scale.rounds {
        for (i, sc) in chosen(&args.only).into_iter().enumerate() {
            let name = sc.name;
            let tag = if scale.rounds == 1 {
                name.to_owned()
            } else {
                format!("{name}-r{round}")
            };
            lab.start_from_nothing(&tag);
            let t = Instant::now();
            let mut o = (sc.run)(&mut lab, &tag, scale)?;
            eprintln!(
                "  {tag}: {} acquisitions ({} under faults) in {:.1} s{}",
                o.acquisitions,
                o.under_fault,
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
        &chosen(&args.only),
        scale,
        seed,
        &args.server,
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
