//! `fencelock-lab`: the safety lab of fencelock.
//!
//! `fencelock-lab run --short [--seed N]` starts a lock `redis-server` and a resource
//! `redis-server` (testkit), runs seeded scenarios with worker processes (this binary
//! re-executed as the hidden `worker` subcommand, each writing its own JSON Lines
//! history), merges the histories, runs the checkers C1-C5 and prints a markdown table.
//! It exits non-zero when any scenario's expectation fails, including a positive control
//! (a known anomaly) that its checker missed.

// Unsafe is needed for process control std does not offer: `libc::kill` (SIGSTOP and
// SIGCONT of a worker) and `prctl(PR_SET_PDEATHSIG)` in the forked worker, so workers
// die with the harness even when it is SIGKILLed.
#![allow(unsafe_code)]

mod worker;

use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use testkit::RedisServer;
use testkit::checkers::{fenced_order, leases_overlap, lost_writes, tokens_increase};
use testkit::history::{Event, Op, Phase, read_histories, read_history};

use crate::worker::{ResourceKeys, WorkerArgs};

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
struct RunArgs {
    /// Short mode (under a minute): no-faults and paused-worker (fenced and unfenced).
    #[arg(long)]
    short: bool,
    /// Seed of the workers' random waits (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the histories in DIR (default: a temporary directory, removed at exit).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Fixed lease of every acquire.
const TTL: Duration = Duration::from_millis(500);
/// How long an acquire waits for a held lock.
const WAIT: Duration = Duration::from_secs(5);
/// A scenario's workers must all have exited by then.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the paused worker holds the lock before writing (first iteration), so the
/// harness can stop it inside its lease.
const HOLD_BEFORE_PAUSE: Duration = Duration::from_millis(200);

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

/// Worker processes of one scenario: SIGCONTed, SIGKILLed and reaped on drop.
struct Workers {
    children: Vec<Child>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.children {
            signal(c.id(), libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: plain kill(2) on a child we spawned and have not reaped yet.
    unsafe {
        libc::kill(pid, sig);
    }
}

impl Workers {
    fn spawn(&mut self, exe: &Path, args: &[String]) -> Result<u32, String> {
        let mut cmd = Command::new(exe);
        cmd.arg("worker")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: the hook only calls prctl, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot spawn a worker: {e}"))?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    /// Waits for every worker to exit; an error if one fails or the deadline passes.
    fn wait_all(&mut self, deadline: Instant) -> Result<(), String> {
        for c in &mut self.children {
            loop {
                match c.try_wait().map_err(|e| e.to_string())? {
                    Some(status) if status.success() => break,
                    Some(status) => return Err(format!("worker {} exited: {status}", c.id())),
                    None if Instant::now() > deadline => {
                        return Err(format!("worker {} still running at the deadline", c.id()));
                    }
                    None => thread::sleep(Duration::from_millis(10)),
                }
            }
        }
        Ok(())
    }
}

/// Which resource the workers write to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Resource {
    Fenced,
    Unfenced,
}

/// What one scenario produced.
struct Outcome {
    name: String,
    acquisitions: usize,
    faults: String,
    /// Violations of C1..C4.
    violations: [usize; 4],
    /// Acknowledged writes vs the final counter (a lost update shows as counter < acked).
    acked: usize,
    counter: i64,
    /// Failed expectations (empty: the scenario passed).
    failed: Vec<String>,
    /// Checker reports, for the details below the table.
    details: Vec<String>,
}

struct Lab {
    exe: PathBuf,
    lock: RedisServer,
    resource: RedisServer,
    dir: PathBuf,
    seed: u64,
}

impl Lab {
    fn worker_args(
        &self,
        scenario: &str,
        process: u32,
        resource: Resource,
        iterations: u32,
        hold_first: Duration,
    ) -> (Vec<String>, PathBuf) {
        let history = self.dir.join(format!("{scenario}-p{process}.jsonl"));
        let mut args = vec![
            format!("--process={process}"),
            format!("--lock-url={}", self.lock.url()),
            format!("--resource-url={}", self.resource.url()),
            format!("--lock=lab:{scenario}"),
            format!("--prefix=res:{scenario}"),
            format!("--iterations={iterations}"),
            format!("--ttl-ms={}", TTL.as_millis()),
            format!("--wait-ms={}", WAIT.as_millis()),
            format!("--hold-first-ms={}", hold_first.as_millis()),
            format!("--seed={}", self.seed),
            format!("--history={}", history.display()),
        ];
        if resource == Resource::Fenced {
            args.push("--fenced".into());
        }
        (args, history)
    }

    /// Merges the histories, reads the resource's final state, runs the checkers.
    fn judge(
        &self,
        name: &str,
        histories: &[PathBuf],
        faults: String,
    ) -> Result<(Outcome, Vec<Event>), String> {
        let h = read_histories(histories).map_err(|e| e.to_string())?;
        let keys = ResourceKeys::new(&format!("res:{name}"));
        let members = self.resource.cmd(&["SMEMBERS", &keys.values]);
        let final_values: Vec<i64> = members
            .as_array()
            .unwrap_or_default()
            .iter()
            .filter_map(|r| r.as_str().and_then(|s| s.parse().ok()))
            .collect();
        let counter = self
            .resource
            .cmd(&["GET", &keys.counter])
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let results = [
            leases_overlap(&h),
            fenced_order(&h),
            lost_writes(&h, &final_values),
            tokens_increase(&h),
        ];
        let details = results
            .iter()
            .flatten()
            .map(|v| format!("{name}: {v}"))
            .collect();
        let count = |op, phase| h.iter().filter(|e| e.op == op && e.phase == phase).count();
        let outcome = Outcome {
            name: name.to_owned(),
            acquisitions: count(Op::Acquire, Phase::Ok),
            faults,
            violations: results.each_ref().map(Vec::len),
            acked: count(Op::Write, Phase::Ok),
            counter,
            failed: Vec::new(),
            details,
        };
        Ok((outcome, h))
    }

    /// 3 workers x 30 iterations on the fenced resource, no faults.
    fn no_faults(&self) -> Result<Outcome, String> {
        let name = "no-faults";
        let mut workers = Workers {
            children: Vec::new(),
        };
        let mut histories = Vec::new();
        for p in 1..=3 {
            let (args, path) = self.worker_args(name, p, Resource::Fenced, 30, Duration::ZERO);
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;
        let (mut o, _) = self.judge(name, &histories, "none".into())?;
        for (i, &n) in o.violations.iter().enumerate() {
            if n != 0 {
                o.failed.push(format!("C{} found {n} violation(s)", i + 1));
            }
        }
        if o.acked as i64 != o.counter {
            o.failed.push(format!(
                "counter {} != {} acknowledged writes",
                o.counter, o.acked
            ));
        }
        if o.acquisitions == 0 {
            o.failed.push("no acquisition".into());
        }
        Ok(o)
    }

    /// Worker 1 takes the lock and is SIGSTOPped for 3 TTLs inside its lease; worker 2
    /// acquires and writes meanwhile; worker 1 then writes late with its old token.
    fn paused_worker(&self, resource: Resource) -> Result<Outcome, String> {
        let name = match resource {
            Resource::Fenced => "paused-worker-fenced",
            Resource::Unfenced => "paused-worker-unfenced",
        };
        let mut workers = Workers {
            children: Vec::new(),
        };
        let (args_a, hist_a) = self.worker_args(name, 1, resource, 3, HOLD_BEFORE_PAUSE);
        let (args_b, hist_b) = self.worker_args(name, 2, resource, 10, Duration::ZERO);
        let pid_a = workers.spawn(&self.exe, &args_a)?;
        // Stop A right after its first `acquire ok` (it then holds for 200 ms).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let acquired = hist_a.exists()
                && read_history(&hist_a)
                    .map_err(|e| e.to_string())?
                    .iter()
                    .any(|e| e.op == Op::Acquire && e.phase == Phase::Ok);
            if acquired {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{name}: worker 1 never acquired"));
            }
            thread::sleep(Duration::from_millis(1));
        }
        signal(pid_a, libc::SIGSTOP);
        let stopped_at = Instant::now();
        workers.spawn(&self.exe, &args_b)?;
        thread::sleep((3 * TTL).saturating_sub(stopped_at.elapsed()));
        signal(pid_a, libc::SIGCONT);
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;

        let faults = format!("SIGSTOP p1 for {} ms", (3 * TTL).as_millis());
        let (mut o, h) = self.judge(name, &[hist_a, hist_b], faults)?;
        // A's late write: its first write completion.
        let late = h
            .iter()
            .find(|e| e.process == 1 && e.op == Op::Write && e.phase != Phase::Invoke);
        let b_wrote_first = match late {
            Some(l) => h.iter().any(|e| {
                e.process == 2 && e.op == Op::Write && e.phase == Phase::Ok && e.time_ns < l.time_ns
            }),
            None => false,
        };
        if !b_wrote_first {
            o.failed
                .push("p2 did not write while p1 was paused (no fault exercised)".into());
        }
        let [c1, c2, c3, c4] = o.violations;
        match resource {
            Resource::Fenced => {
                if late.map(|e| e.phase) != Some(Phase::Fail) {
                    o.failed
                        .push("the fenced resource did not reject p1's late write".into());
                }
                for (i, n) in [c1, c2, c3, c4].into_iter().enumerate() {
                    if n != 0 {
                        o.failed.push(format!("C{} found {n} violation(s)", i + 1));
                    }
                }
            }
            Resource::Unfenced => {
                if late.map(|e| e.phase) != Some(Phase::Ok) {
                    o.failed
                        .push("the unfenced resource did not take p1's late write".into());
                }
                // Positive controls.
                if c1 == 0 {
                    o.failed
                        .push("positive control missed: C1 did not flag p1's late write".into());
                }
                if c2 == 0 {
                    o.failed.push(
                        "positive control missed: C2 did not flag the stale token accepted".into(),
                    );
                }
                if o.counter >= o.acked as i64 {
                    o.failed.push(format!(
                        "positive control missed: no lost update (counter {} >= {} acked writes)",
                        o.counter, o.acked
                    ));
                }
                for (i, n) in [(3, c3), (4, c4)] {
                    if n != 0 {
                        o.failed.push(format!("C{i} found {n} violation(s)"));
                    }
                }
            }
        }
        Ok(o)
    }
}

fn run(args: &RunArgs) -> Result<bool, String> {
    if !args.short {
        return Err("only the short mode exists so far: pass --short".into());
    }
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    println!("fencelock-lab run --short --seed {seed}\n");
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
    let lab = Lab {
        exe,
        lock: RedisServer::start(),
        resource: RedisServer::start(),
        dir,
        seed,
    };

    let outcomes = [
        lab.no_faults()?,
        lab.paused_worker(Resource::Fenced)?,
        lab.paused_worker(Resource::Unfenced)?,
    ];

    println!(
        "| scenario | acquisitions | faults injected | C1 | C2 | C3 | C4 | C5 | acked writes / final counter | expectations |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for o in &outcomes {
        let [c1, c2, c3, c4] = o.violations;
        println!(
            "| {} | {} | {} | {c1} | {c2} | {c3} | {c4} | n/a | {} / {} | {} |",
            o.name,
            o.acquisitions,
            o.faults,
            o.acked,
            o.counter,
            if o.failed.is_empty() {
                "held".to_owned()
            } else {
                format!("FAILED: {}", o.failed.join("; "))
            }
        );
    }
    println!(
        "\nC5 (foreign_touch) not judged: workers cannot observe `touched_owner` yet. \
         Positive controls (unfenced paused worker): C1 and C2 must flag the late write and \
         the final counter must be below the acknowledged writes (lost update)."
    );
    let details: Vec<&String> = outcomes.iter().flat_map(|o| &o.details).collect();
    if !details.is_empty() {
        println!("\nViolations found:");
        for d in details {
            println!("- {d}");
        }
    }
    let ok = outcomes.iter().all(|o| o.failed.is_empty());
    println!(
        "\n{} in {:.1} s (seed {seed})",
        if ok { "PASS" } else { "FAIL" },
        started.elapsed().as_secs_f64()
    );
    if args.out.is_some() {
        println!("histories in {}", lab.dir.display());
    }
    Ok(ok)
}
