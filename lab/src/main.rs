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

mod outcomes;
mod report;
mod scenarios;
mod worker;

use std::cell::RefCell;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use fencelock::HolderToken;
use testkit::RedisServer;
use testkit::checkers::{
    Violation, fenced_order, foreign_touch, leases_overlap, lost_writes, tokens_increase,
};
use testkit::history::{
    Event, HistoryWriter, Op, Phase, monotonic_ns, read_histories, read_history,
};
use testkit::monitor::{self, Monitor};

use crate::outcomes::Outcome;
use crate::scenarios::{Minority, Restart};
use crate::worker::{FENCED_WRITE, ResourceKeys, WorkerArgs};

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

/// Fixed lease of every acquire.
const TTL: Duration = Duration::from_millis(500);
/// How long an acquire waits for a held lock.
const WAIT: Duration = Duration::from_secs(5);
/// A scenario's workers must all have exited by then.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(30);
/// Independent Redlock nodes.
const REDLOCK_NODES: usize = 5;
/// Redlock per-node timeout.
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Connect and response timeout of the Redlock workers' client: bounds how long a
/// release waits for a blackholed node.
const REDLOCK_CLIENT_TIMEOUT: Duration = Duration::from_millis(150);
/// C5: how close to a key's computed expiry a command must be for the key's state to
/// count as unknown (the server's expiry is known to the millisecond, and scripts see a
/// clock frozen at their start).
const TOUCH_MARGIN: Duration = Duration::from_millis(5);
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
#[derive(Default)]
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

    /// SIGKILLs one worker (the fault) and reaps it; it no longer counts for `wait_all`.
    fn kill(&mut self, pid: u32) {
        if let Some(i) = self.children.iter().position(|c| c.id() == pid) {
            let mut c = self.children.swap_remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
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

struct Lab {
    exe: PathBuf,
    lock: RedisServer,
    resource: RedisServer,
    /// Independent lock nodes of the Redlock scenarios.
    nodes: Vec<RedisServer>,
    /// A node with `appendfsync always`, standing in for n2 in the persistent
    /// crash-restart scenario.
    persistent: RedisServer,
    /// MONITOR recorders of the lock server and every node (C5's input), replaced by
    /// fresh ones at each judgement so memory stays bounded by one scenario.
    monitors: RefCell<Vec<Monitor>>,
    dir: PathBuf,
    seed: u64,
}

impl Lab {
    /// Arguments of a worker on the single lock server; its history file.
    fn worker_args(
        &self,
        tag: &str,
        process: u32,
        resource: Resource,
        iterations: u32,
    ) -> (Vec<String>, PathBuf) {
        self.worker_args_on(tag, process, resource, iterations, &[self.lock.url()])
    }

    /// [`worker_args`](Self::worker_args) with the lock taken on `lock_urls` (several:
    /// Redlock).
    fn worker_args_on(
        &self,
        tag: &str,
        process: u32,
        resource: Resource,
        iterations: u32,
        lock_urls: &[String],
    ) -> (Vec<String>, PathBuf) {
        let history = self.dir.join(format!("{tag}-p{process}.jsonl"));
        let mut args = vec![format!("--process={process}")];
        args.extend(lock_urls.iter().map(|u| format!("--lock-url={u}")));
        args.extend([
            format!("--resource-url={}", self.resource.url()),
            format!("--lock=lab:{tag}"),
            format!("--prefix=res:{tag}"),
            format!("--iterations={iterations}"),
            format!("--ttl-ms={}", TTL.as_millis()),
            format!("--wait-ms={}", WAIT.as_millis()),
            format!("--seed={}", self.seed),
            format!("--history={}", history.display()),
        ]);
        if resource == Resource::Fenced {
            args.push("--fenced".into());
        }
        (args, history)
    }

    /// Deletes the lock key of `tag` on every lock server, which it never held: the
    /// MONITOR replay (C5) then knows its state from the start instead of skipping
    /// commands until a release deletes it.
    fn start_from_nothing(&self, tag: &str) {
        let key = format!("fencelock:{{lab:{tag}}}");
        for server in [&self.lock, &self.persistent]
            .into_iter()
            .chain(&self.nodes)
        {
            server.cmd(&["DEL", &key]);
        }
    }

    /// How long workers of `iterations` may take (generous: contended Redlock acquires
    /// with blackholed nodes take over 100 ms each on a loaded 2-core machine).
    fn timeout(&self, iterations: u32) -> Duration {
        SCENARIO_TIMEOUT + Duration::from_millis(500) * iterations
    }

    /// Waits until every worker of `histories` has connected and invoked an acquire,
    /// and one of them holds the lock: the moment to inject a fault.
    fn wait_for_acquire(&self, tag: &str, histories: &[PathBuf]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (mut started, mut acquired) = (0, false);
            for h in histories.iter().filter(|h| h.exists()) {
                let events = read_history(h).map_err(|e| e.to_string())?;
                started += usize::from(events.iter().any(|e| e.op == Op::Acquire));
                acquired |= events
                    .iter()
                    .any(|e| e.op == Op::Acquire && e.phase == Phase::Ok);
            }
            if started == histories.len() && acquired {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{tag}: the workers never all started and acquired"));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// A writer to the fenced resource of `tag`, for scenarios the harness drives.
    fn resource_writer(&self, tag: &str) -> Result<ResourceWriter, String> {
        let conn = redis::Client::open(self.resource.url().as_str())
            .and_then(|c| c.get_connection())
            .map_err(|e| format!("{tag}: resource connect: {e}"))?;
        Ok(ResourceWriter {
            conn,
            keys: ResourceKeys::new(&format!("res:{tag}")),
        })
    }

    /// Merges the histories, reads the resource's final state, runs the checkers.
    fn judge(
        &self,
        tag: &str,
        histories: &[PathBuf],
        faults: String,
    ) -> Result<(Outcome, Vec<Event>), String> {
        let h = read_histories(histories).map_err(|e| e.to_string())?;
        let keys = ResourceKeys::new(&format!("res:{tag}"));
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
        let results: [Vec<Violation>; 4] = [
            leases_overlap(&h),
            fenced_order(&h),
            lost_writes(&h, &final_values),
            tokens_increase(&h),
        ];
        let mut details: Vec<String> = results
            .iter()
            .flatten()
            .map(|v| format!("{tag}: {v}"))
            .collect();
        // C5 from the servers' own account of the lock key.
        let key = format!("fencelock:{{lab:{tag}}}");
        let mut touched = Vec::new();
        let (mut judged, mut skipped) = (0, 0);
        for m in self.monitors.borrow_mut().iter_mut() {
            m.sync()
                .map_err(|e| format!("{tag}: MONITOR of {}: {e}", m.addr()))?;
            let fresh = Monitor::start(m.addr())
                .map_err(|e| format!("{tag}: MONITOR of {}: {e}", m.addr()))?;
            let t = monitor::touches(&std::mem::replace(m, fresh).stop(), &[&key], TOUCH_MARGIN);
            touched.extend(t.events);
            judged += t.judged;
            skipped += t.skipped;
        }
        touched.sort_by_key(|e| e.time_ns);
        let c5 = foreign_touch(&touched);
        details.extend(c5.iter().map(|v| format!("{tag}: {v}")));
        let count = |op, phase| h.iter().filter(|e| e.op == op && e.phase == phase).count();
        let [c1, c2, c3, c4] = results.each_ref().map(|v| Some(v.len()));
        let mut outcome = Outcome {
            name: tag.to_owned(),
            rounds: 1,
            acquisitions: count(Op::Acquire, Phase::Ok),
            attempts: count(Op::Acquire, Phase::Invoke),
            failed_acquires: count(Op::Acquire, Phase::Fail),
            longest_acquire_ns: longest(&h, Op::Acquire),
            faults,
            violations: [c1, c2, c3, c4, Some(c5.len()), None],
            touches: (judged, skipped),
            recovery_ns: None,
            acked: count(Op::Write, Phase::Ok),
            counter,
            failed: Vec::new(),
            details,
        };
        if outcome.acquisitions > 0 && judged == 0 {
            outcome
                .failed
                .push("C5 judged no script write to the lock key (MONITOR replay blind)".into());
        }
        Ok((outcome, h))
    }
}

/// The longest completed `op` of any process in `h`, ns.
fn longest(h: &[Event], op: Op) -> u64 {
    let mut invoked = std::collections::HashMap::new();
    let mut max = 0;
    for e in h.iter().filter(|e| e.op == op) {
        if e.phase == Phase::Invoke {
            invoked.insert(e.process, e.time_ns);
        } else if let Some(start) = invoked.remove(&e.process) {
            max = max.max(e.time_ns.saturating_sub(start));
        }
    }
    max
}

/// Writes of the harness itself to a fenced resource, recorded in a history.
struct ResourceWriter {
    conn: redis::Connection,
    keys: ResourceKeys,
}

impl ResourceWriter {
    /// Writes `value` with fencing token `token` as process `p`; whether the resource
    /// accepted it.
    fn write(
        &mut self,
        hist: &mut HistoryWriter,
        p: u32,
        token: u64,
        owner: &str,
        value: i64,
    ) -> Result<bool, String> {
        let event = |phase| {
            Event::now(p, Op::Write, phase)
                .with_token(token)
                .with_owner(owner)
                .with_value(value)
        };
        hist.append(&event(Phase::Invoke))
            .map_err(|e| e.to_string())?;
        let accepted: i64 = redis::Script::new(FENCED_WRITE)
            .key(&self.keys.max_token)
            .key(&self.keys.counter)
            .key(&self.keys.values)
            .key(&self.keys.log)
            .arg(token)
            .arg(value)
            .arg(value)
            .invoke(&mut self.conn)
            .map_err(|e| format!("fenced write: {e}"))?;
        let done = if accepted == 1 {
            event(Phase::Ok)
        } else {
            event(Phase::Fail).with_error("stale fencing token")
        };
        hist.append(&done).map_err(|e| e.to_string())?;
        Ok(accepted == 1)
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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
        .with_owner(guard.holder_token().as_str())
        .with_valid_until(now_ns + u64::try_from(left.as_nanos()).unwrap_or(u64::MAX))
        .with_nodes(client.nodes())
}

fn release(p: u32, phase: Phase, owner: &HolderToken, token: u64) -> Event {
    Event::now(p, Op::Release, phase)
        .with_token(token)
        .with_owner(owner.as_str())
}

fn release_phase(r: &Result<(), fencelock::Error>) -> Phase {
    if r.is_ok() { Phase::Ok } else { Phase::Fail }
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
    let lock = RedisServer::start();
    let nodes = RedisServer::start_many(REDLOCK_NODES);
    let persistent = RedisServer::builder().persistence(true).start();
    let monitors = [&lock, &persistent]
        .into_iter()
        .chain(&nodes)
        .map(|s| Monitor::start(&s.addr()).map_err(|e| format!("MONITOR of {}: {e}", s.addr())))
        .collect::<Result<_, _>>()?;
    let mut lab = Lab {
        exe,
        lock,
        resource: RedisServer::start(),
        nodes,
        persistent,
        monitors: RefCell::new(monitors),
        dir,
        seed,
    };

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
