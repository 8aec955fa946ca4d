//! `fencelock-lab`: the safety lab of fencelock.
//!
//! `fencelock-lab run --short [--seed N]` starts a lock `redis-server`, a resource
//! `redis-server` and 5 Redlock nodes (testkit), runs seeded scenarios with worker processes (this binary
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
use fencelock::{NodeOutcome, OwnerToken};
use testkit::checkers::{fenced_order, leases_overlap, lost_writes, tokens_increase};
use testkit::history::{
    Event, HistoryWriter, Op, Phase, monotonic_ns, read_histories, read_history,
};
use testkit::{Fault, FaultProxy, RedisServer};

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
    /// Short mode (under a minute): no-faults, paused-worker (fenced and unfenced),
    /// Redlock with a blackholed minority, Redlock crash-restart (unprotected, protected).
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
/// Independent Redlock nodes.
const REDLOCK_NODES: usize = 5;
/// Redlock per-node timeout.
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Connect and response timeout of the Redlock workers' client: bounds how long a
/// release waits for a blackholed node.
const REDLOCK_CLIENT_TIMEOUT: Duration = Duration::from_millis(150);
/// Fixed lease of A in the crash-restart scenarios (and their quarantine when protected).
const RESTART_TTL: Duration = Duration::from_secs(3);

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

/// Whether `pid` is stopped (state `T` in /proc/PID/stat).
fn process_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after_name = stat.rsplit_once(')')?.1;
            after_name
                .split_whitespace()
                .next()
                .map(|state| state == "T")
        })
        .unwrap_or(false)
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
    /// Independent lock nodes of the Redlock scenarios.
    nodes: Vec<RedisServer>,
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
        self.worker_args_on(
            scenario,
            process,
            resource,
            iterations,
            hold_first,
            &[self.lock.url()],
        )
    }

    /// [`worker_args`](Self::worker_args) with the lock taken on `lock_urls` (several:
    /// Redlock).
    fn worker_args_on(
        &self,
        scenario: &str,
        process: u32,
        resource: Resource,
        iterations: u32,
        hold_first: Duration,
        lock_urls: &[String],
    ) -> (Vec<String>, PathBuf) {
        let history = self.dir.join(format!("{scenario}-p{process}.jsonl"));
        let mut args = vec![format!("--process={process}")];
        args.extend(lock_urls.iter().map(|u| format!("--lock-url={u}")));
        args.extend([
            format!("--resource-url={}", self.resource.url()),
            format!("--lock=lab:{scenario}"),
            format!("--prefix=res:{scenario}"),
            format!("--iterations={iterations}"),
            format!("--ttl-ms={}", TTL.as_millis()),
            format!("--wait-ms={}", WAIT.as_millis()),
            format!("--hold-first-ms={}", hold_first.as_millis()),
            format!("--seed={}", self.seed),
            format!("--history={}", history.display()),
        ]);
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
        let (mut args_a, hist_a) = self.worker_args(name, 1, resource, 3, Duration::ZERO);
        args_a.push("--stop-after-first-read".into());
        let (args_b, hist_b) = self.worker_args(name, 2, resource, 10, Duration::ZERO);
        let pid_a = workers.spawn(&self.exe, &args_a)?;
        // A stops itself (SIGSTOP) between its first read and write, inside its lease:
        // wait until the kernel shows it stopped.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !process_stopped(pid_a) {
            if Instant::now() > deadline {
                return Err(format!("{name}: worker 1 never stopped holding the lock"));
            }
            thread::sleep(Duration::from_millis(1));
        }
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

    /// Redlock over 5 nodes, each behind its own fault proxy; 3 workers on the fenced
    /// resource; once they run, 2 of the 5 proxies blackhole everything for good.
    fn redlock_minority_blackholed(&self) -> Result<Outcome, String> {
        let name = "redlock-minority-blackholed";
        let proxies: Vec<FaultProxy> = self
            .nodes
            .iter()
            .map(|n| FaultProxy::start(&n.addr()))
            .collect();
        let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
        let mut workers = Workers {
            children: Vec::new(),
        };
        let mut histories = Vec::new();
        for p in 1..=3 {
            let (mut args, path) =
                self.worker_args_on(name, p, Resource::Fenced, 12, Duration::ZERO, &urls);
            args.push(format!("--node-timeout-ms={}", NODE_TIMEOUT.as_millis()));
            args.push(format!(
                "--lock-timeout-ms={}",
                REDLOCK_CLIENT_TIMEOUT.as_millis()
            ));
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        // Fault once the workers are acquiring.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut acquired = false;
            for h in histories.iter().filter(|h| h.exists()) {
                acquired |= read_history(h)
                    .map_err(|e| e.to_string())?
                    .iter()
                    .any(|e| e.op == Op::Acquire && e.phase == Phase::Ok);
            }
            if acquired {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{name}: no worker ever acquired"));
            }
            thread::sleep(Duration::from_millis(1));
        }
        let fault_at = monotonic_ns();
        proxies[1].set(Fault::Blackhole);
        proxies[3].set(Fault::Blackhole);
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;
        drop(proxies);

        let faults = "blackhole n2, n4 of 5 after the first acquire".to_owned();
        let (mut o, h) = self.judge(name, &histories, faults)?;
        fail_on_violations(&mut o, [1, 2, 3, 4]);
        if o.acked as i64 != o.counter {
            o.failed.push(format!(
                "counter {} != {} acknowledged writes",
                o.counter, o.acked
            ));
        }
        let after = |phase| {
            h.iter()
                .filter(|e| e.op == Op::Acquire && e.phase == phase && e.time_ns > fault_at)
                .count()
        };
        let (ok, failed) = (after(Phase::Ok), after(Phase::Fail));
        // Exercised: an acquire invoked after the fault waits out the node timeout of the
        // blackholed nodes.
        let mut invoked: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
        let mut fast = 0;
        for e in h.iter().filter(|e| e.op == Op::Acquire) {
            if e.phase == Phase::Invoke {
                invoked.insert(e.process, e.time_ns);
            } else if let Some(&start) = invoked.get(&e.process)
                && start > fault_at
                && e.time_ns - start < u64::try_from(NODE_TIMEOUT.as_nanos()).unwrap_or(0)
            {
                fast += 1;
            }
        }
        if fast > 0 {
            o.failed.push(format!(
                "{fast} acquire(s) after the fault took less than the node timeout \
                 (blackhole not exercised)"
            ));
        }
        o.faults
            .push_str(&format!("; after it {ok} acquires ok, {failed} failed"));
        if ok == 0 || ok * 5 < (ok + failed) * 4 {
            o.failed.push(format!(
                "only {ok} of {} acquires after the fault succeeded (need >= 80%)",
                ok + failed
            ));
        }
        Ok(o)
    }

    /// Kleppmann's crash-restart, with the harness itself acting as clients A (process 1)
    /// and B (process 2) through the library: A acquires on all 5 nodes (TTL 3 s); its
    /// key is deleted by hand on n4 and n5 (they "missed" the grant); n2 is SIGKILLed and
    /// restarted without persistence; then B tries once. Unprotected: B gets n2, n4, n5,
    /// a majority, and C1 must flag the overlap (positive control). Protected (quarantine
    /// = TTL, every node up longer than that): n2's vote does not count, B gets NoQuorum.
    fn redlock_restart(&mut self, protected: bool) -> Result<Outcome, String> {
        let name = if protected {
            "redlock-restart-protected"
        } else {
            "redlock-restart-unprotected"
        };
        let quarantine = protected.then_some(RESTART_TTL);
        if protected {
            // Uptime counts whole seconds: wait for quarantine + 1 s on every node.
            let min_up = RESTART_TTL.as_secs() + 1;
            let deadline = Instant::now() + RESTART_TTL + Duration::from_secs(5);
            while self.nodes.iter().any(|n| uptime_secs(n) < min_up) {
                if Instant::now() > deadline {
                    return Err(format!("{name}: nodes not up for {min_up} s"));
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let urls: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        let connect = |urls: Vec<String>| {
            fencelock::Client::redlock(urls)
                .restart_protection(quarantine)
                .node_timeout(NODE_TIMEOUT)
                .connect()
        };
        let lock = format!("lab:{name}");
        let key = format!("fencelock:{{{lock}}}");
        let hist_a = self.dir.join(format!("{name}-p1.jsonl"));
        let hist_b = self.dir.join(format!("{name}-p2.jsonl"));
        let mut wa = HistoryWriter::create(&hist_a).map_err(|e| e.to_string())?;
        let mut wb = HistoryWriter::create(&hist_b).map_err(|e| e.to_string())?;
        let rec = |w: &mut HistoryWriter, e: Event| w.append(&e).map_err(|e| e.to_string());

        // A acquires on every node.
        let client_a = rt
            .block_on(connect(urls.clone()))
            .map_err(|e| format!("{name}: A connect: {e}"))?;
        rec(&mut wa, Event::now(1, Op::Acquire, Phase::Invoke))?;
        let guard_a = rt
            .block_on(client_a.lock(&lock).ttl(RESTART_TTL).try_acquire())
            .map_err(|e| format!("{name}: A did not acquire: {e}"))?;
        rec(&mut wa, acquired(1, &guard_a, &client_a))?;
        let owner_a = guard_a.owner_token().clone();
        let token_a = guard_a.fencing_token().get();

        // n4 and n5 lose A's grant; n2 crashes and comes back empty.
        for n in &self.nodes[3..5] {
            if n.cmd(&["DEL", &key]).as_int() != Some(1) {
                return Err(format!("{name}: A's key {key} not found on {}", n.addr()));
            }
        }
        self.nodes[1].kill();
        self.nodes[1].restart();

        // B: a fresh client, one attempt.
        let client_b = rt
            .block_on(connect(urls))
            .map_err(|e| format!("{name}: B connect: {e}"))?;
        rec(&mut wb, Event::now(2, Op::Acquire, Phase::Invoke))?;
        let b = rt.block_on(client_b.lock(&lock).ttl(RESTART_TTL).try_acquire());
        let mut b_outcome = String::new();
        let mut b_refused_by_quarantine = false;
        match &b {
            Ok(g) => {
                rec(&mut wb, acquired(2, g, &client_b))?;
                b_outcome = "B acquired".into();
            }
            Err(e) => {
                if let fencelock::Error::NoQuorum { nodes, .. } = e {
                    b_refused_by_quarantine = nodes
                        .iter()
                        .any(|r| matches!(r.outcome, NodeOutcome::Quarantined { .. }));
                    b_outcome = "B: NoQuorum".into();
                }
                rec(
                    &mut wb,
                    Event::now(2, Op::Acquire, Phase::Fail).with_error(e.to_string()),
                )?;
            }
        }
        // Release B, then A.
        if let Ok(g) = b {
            let (owner, token) = (g.owner_token().clone(), g.fencing_token().get());
            rec(&mut wb, release(2, Phase::Invoke, &owner, token))?;
            let r = rt.block_on(g.release());
            rec(&mut wb, release(2, release_phase(&r), &owner, token))?;
        }
        rec(&mut wa, release(1, Phase::Invoke, &owner_a, token_a))?;
        let r = rt.block_on(guard_a.release());
        rec(&mut wa, release(1, release_phase(&r), &owner_a, token_a))?;
        rt.block_on(async {
            client_a.flush().await;
            client_b.flush().await;
        });
        drop((wa, wb));

        let faults = format!(
            "DEL A's key on n4, n5; kill -9 + restart n2 (no persistence); {}",
            if b_outcome.is_empty() {
                "B: other error"
            } else {
                &b_outcome
            }
        );
        let (mut o, _) = self.judge(name, &[hist_a, hist_b], faults)?;
        if protected {
            fail_on_violations(&mut o, [1, 2, 3, 4]);
            if !b_refused_by_quarantine {
                o.failed
                    .push("B was not refused with NoQuorum naming a quarantined node".into());
            }
        } else {
            fail_on_violations(&mut o, [2, 3, 4]);
            if b_outcome != "B acquired" {
                o.failed
                    .push("B did not get a majority (no fault exercised)".into());
            }
            if o.violations[0] == 0 {
                o.failed.push(
                    "positive control missed: C1 did not flag A's and B's overlapping leases"
                        .into(),
                );
            }
        }
        Ok(o)
    }
}

/// Adds a failed expectation for each listed checker (1-based) that found violations.
fn fail_on_violations<const N: usize>(o: &mut Outcome, checkers: [usize; N]) {
    for c in checkers {
        let n = o.violations[c - 1];
        if n != 0 {
            o.failed.push(format!("C{c} found {n} violation(s)"));
        }
    }
}

/// `uptime_in_seconds` of `INFO server` (0 if unreadable).
fn uptime_secs(node: &RedisServer) -> u64 {
    node.cmd(&["INFO", "server"])
        .as_str()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The `acquire ok` record of a guard just acquired.
fn acquired(p: u32, guard: &fencelock::LockGuard, client: &fencelock::Client) -> Event {
    let now_ns = monotonic_ns();
    let left = guard
        .valid_until()
        .saturating_duration_since(Instant::now());
    Event::new(p, now_ns, Op::Acquire, Phase::Ok)
        .with_token(guard.fencing_token().get())
        .with_owner(guard.owner_token().as_str())
        .with_valid_until(now_ns + u64::try_from(left.as_nanos()).unwrap_or(u64::MAX))
        .with_nodes(client.nodes())
}

fn release(p: u32, phase: Phase, owner: &OwnerToken, token: u64) -> Event {
    Event::now(p, Op::Release, phase)
        .with_token(token)
        .with_owner(owner.as_str())
}

fn release_phase(r: &Result<(), fencelock::Error>) -> Phase {
    if r.is_ok() { Phase::Ok } else { Phase::Fail }
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
    let mut lab = Lab {
        exe,
        lock: RedisServer::start(),
        resource: RedisServer::start(),
        nodes: RedisServer::start_many(REDLOCK_NODES),
        dir,
        seed,
    };

    // The protected crash-restart runs before the unprotected one: it needs every node
    // up longer than its quarantine, and the unprotected one restarts n2.
    let outcomes = [
        lab.no_faults()?,
        lab.paused_worker(Resource::Fenced)?,
        lab.paused_worker(Resource::Unfenced)?,
        lab.redlock_minority_blackholed()?,
        lab.redlock_restart(true)?,
        lab.redlock_restart(false)?,
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
         the final counter must be below the acknowledged writes (lost update); \
         redlock-restart-unprotected: C1 must flag A's and B's overlapping leases. \
         The redlock-restart rows are driven by the harness itself as clients A (p1) and B \
         (p2) through the library."
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
