//! The harness: starts the lock, resource and Redlock servers (each lock server with a
//! MONITOR recorder) and the worker processes, signals and reaps the workers, acts as a
//! client itself where a scenario needs one, and judges a scenario's merged histories
//! with the checkers C1-C6 into an [`Outcome`].

use std::cell::RefCell;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::HolderToken;
use testkit::checkers::{
    Violation, fenced_order, foreign_touch, leases_over, lost_writes, readers_beside_writer,
    tokens_increase,
};
use testkit::history::{
    Event, HistoryWriter, Op, Phase, monotonic_ns, read_histories, read_history,
};
use testkit::monitor::{self, Monitor};
use testkit::{Postgres, RedisServer, ServerBuild, ServerClock};

use crate::outcomes::Outcome;
use crate::store::{POSTGRES_TABLES, Store, StoreKind};

/// Fixed lease of every acquire.
pub const TTL: Duration = Duration::from_millis(500);
/// How long an acquire waits for a held lock.
pub const WAIT: Duration = Duration::from_secs(5);
/// A scenario's workers must all have exited by then.
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(30);
/// Independent Redlock nodes.
pub const REDLOCK_NODES: usize = 5;
/// C5: how close to a key's computed expiry a command must be for the key's state to
/// count as unknown (the server's expiry is known to the millisecond, and scripts see a
/// clock frozen at their start).
pub const TOUCH_MARGIN: Duration = Duration::from_millis(5);

/// Worker processes of one scenario: SIGCONTed, SIGKILLed and reaped on drop.
#[derive(Default)]
pub struct Workers {
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
pub fn process_stopped(pid: u32) -> bool {
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

pub fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: plain kill(2) on a child we spawned and have not reaped yet.
    unsafe {
        libc::kill(pid, sig);
    }
}

impl Workers {
    pub fn spawn(&mut self, exe: &Path, args: &[String]) -> Result<u32, String> {
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
    pub fn kill(&mut self, pid: u32) {
        if let Some(i) = self.children.iter().position(|c| c.id() == pid) {
            let mut c = self.children.swap_remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether the worker `pid` has exited (reaped; `wait_all` still sees its status).
    pub fn exited(&mut self, pid: u32) -> bool {
        self.children
            .iter_mut()
            .find(|c| c.id() == pid)
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// Waits for every worker to exit; an error if one fails or the deadline passes.
    pub fn wait_all(&mut self, deadline: Instant) -> Result<(), String> {
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

/// Which resource the workers write to (see [`store`](crate::store)).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// The resource server, through fencelock's Redis check (`Client::fenced_write`).
    Fenced,
    /// The resource server, plain writes.
    Unfenced,
    /// PostgreSQL, through fencelock's check (`fencelock_check`).
    FencedPostgres,
    /// PostgreSQL, plain writes.
    UnfencedPostgres,
}

impl Resource {
    /// Whether the resource checks the token.
    pub fn fenced(self) -> bool {
        matches!(self, Self::Fenced | Self::FencedPostgres)
    }

    /// Where it lives.
    pub fn store(self) -> StoreKind {
        match self {
            Self::Fenced | Self::Unfenced => StoreKind::Redis,
            Self::FencedPostgres | Self::UnfencedPostgres => StoreKind::Postgres,
        }
    }
}

/// The servers every scenario runs against, where histories go, and the seed of the
/// workers.
pub struct Lab {
    pub exe: PathBuf,
    pub lock: RedisServer,
    pub resource: RedisServer,
    /// The PostgreSQL resource, with fencelock's check and the lab's tables installed.
    pub postgres: Postgres,
    /// The scenarios (tags) whose workers wrote to PostgreSQL.
    pub postgres_tags: RefCell<std::collections::HashSet<String>>,
    /// Independent lock nodes of the Redlock scenarios.
    pub nodes: Vec<RedisServer>,
    /// A node with `appendfsync always`, standing in for n2 in the persistent
    /// crash-restart scenario.
    pub persistent: RedisServer,
    /// A lock server on a wall clock the scenarios step ([`clock`](Self::clock)).
    pub clocked: RedisServer,
    /// The clocked server's wall clock, at offset zero between scenarios.
    pub clock: ServerClock,
    /// MONITOR recorders of the lock server and every node (C5's input), replaced by
    /// fresh ones at each judgement so memory stays bounded by one scenario.
    pub monitors: RefCell<Vec<Monitor>>,
    pub dir: PathBuf,
    pub seed: u64,
    /// What every Redis server of the run runs (`--server`), the scenarios' own
    /// Sentinel groups and clusters included.
    pub server: ServerBuild,
}

impl Lab {
    /// Starts the lock server, the Redlock nodes, the persistent node and a MONITOR
    /// recorder on each of them, then the resource server and PostgreSQL (with
    /// fencelock's check installed), every Redis server running `server`; histories go
    /// to `dir`.
    pub fn start(
        exe: PathBuf,
        dir: PathBuf,
        seed: u64,
        server: ServerBuild,
    ) -> Result<Self, String> {
        let redis = || RedisServer::builder().server(server.clone());
        let lock = redis().start();
        let nodes = (0..REDLOCK_NODES).map(|_| redis().start()).collect();
        let persistent = redis().persistence(true).start();
        let clock = ServerClock::new().map_err(|e| format!("server clock: {e}"))?;
        let clocked = redis().clock(&clock).start();
        let monitors = [&lock, &persistent, &clocked]
            .into_iter()
            .chain(&nodes)
            .map(|s| Monitor::start(&s.addr()).map_err(|e| format!("MONITOR of {}: {e}", s.addr())))
            .collect::<Result<_, _>>()?;
        let postgres = Postgres::start();
        postgres
            .try_psql(fencelock::fence::POSTGRES_SETUP)
            .and_then(|_| postgres.try_psql(POSTGRES_TABLES))
            .map_err(|e| format!("PostgreSQL setup: {e}"))?;
        Ok(Self {
            exe,
            lock,
            resource: redis().start(),
            postgres,
            postgres_tags: RefCell::default(),
            nodes,
            persistent,
            clocked,
            clock,
            monitors: RefCell::new(monitors),
            dir,
            seed,
            server,
        })
    }

    /// Arguments of a worker on the single lock server; its history file.
    pub fn worker_args(
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
    pub fn worker_args_on(
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
        let resource_url = match resource.store() {
            StoreKind::Redis => self.resource.url(),
            StoreKind::Postgres => {
                self.postgres_tags.borrow_mut().insert(tag.to_owned());
                self.postgres.url()
            }
        };
        args.extend([
            format!("--resource-url={resource_url}"),
            format!(
                "--store={}",
                match resource.store() {
                    StoreKind::Redis => "redis",
                    StoreKind::Postgres => "postgres",
                }
            ),
            format!("--lock=lab:{tag}"),
            format!("--prefix=res:{tag}"),
            format!("--iterations={iterations}"),
            format!("--ttl-ms={}", TTL.as_millis()),
            format!("--wait-ms={}", WAIT.as_millis()),
            format!("--seed={}", self.seed),
            format!("--history={}", history.display()),
        ]);
        if resource.fenced() {
            args.push("--fenced".into());
        }
        (args, history)
    }

    /// Deletes the lock key of `tag` on every lock server, which it never held: the
    /// MONITOR replay (C5) then knows its state from the start instead of skipping
    /// commands until a release deletes it.
    pub fn start_from_nothing(&self, tag: &str) {
        let key = format!("fencelock:{{lab:{tag}}}");
        for server in [&self.lock, &self.persistent, &self.clocked]
            .into_iter()
            .chain(&self.nodes)
        {
            server.cmd(&["DEL", &key]);
        }
    }

    /// How long workers of `iterations` may take (generous: contended Redlock acquires
    /// with blackholed nodes take over 100 ms each on a loaded 2-core machine).
    pub fn timeout(&self, iterations: u32) -> Duration {
        SCENARIO_TIMEOUT + Duration::from_millis(500) * iterations
    }

    /// Waits until every worker of `histories` has connected and invoked an acquire,
    /// and one of them holds the lock: the moment to inject a fault.
    pub fn wait_for_acquire(&self, tag: &str, histories: &[PathBuf]) -> Result<(), String> {
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

    /// A writer to the fenced resource of `tag` (in Redis), for scenarios the harness
    /// drives.
    pub fn resource_writer(&self, tag: &str) -> Result<ResourceWriter, String> {
        let rt = runtime()?;
        let store = rt
            .block_on(Store::connect(
                StoreKind::Redis,
                &self.resource.url(),
                &format!("res:{tag}"),
            ))
            .map_err(|e| format!("{tag}: {e}"))?;
        Ok(ResourceWriter {
            rt,
            store,
            lock: format!("lab:{tag}"),
        })
    }

    /// The final state of `tag`'s resource: the values written, and the counter.
    fn resource_state(&self, tag: &str) -> Result<(Vec<i64>, i64), String> {
        let prefix = format!("res:{tag}");
        if self.postgres_tags.borrow().contains(tag) {
            let read = |sql: String| {
                self.postgres
                    .try_psql(&sql)
                    .map_err(|e| format!("{tag}: PostgreSQL resource: {e}"))
            };
            let values = read(format!(
                "SELECT value FROM lab_values WHERE tag = '{prefix}'"
            ))?;
            let counter = read(format!("SELECT n FROM lab_counter WHERE tag = '{prefix}'"))?;
            return Ok((
                values.lines().filter_map(|l| l.parse().ok()).collect(),
                counter.parse().unwrap_or(0),
            ));
        }
        let members = self.resource.cmd(&["HKEYS", &format!("{prefix}:values")]);
        let values = members
            .as_array()
            .unwrap_or_default()
            .iter()
            .filter_map(|r| r.as_str().and_then(|s| s.parse().ok()))
            .collect();
        let counter = self
            .resource
            .cmd(&["GET", &format!("{prefix}:counter")])
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Ok((values, counter))
    }

    /// Merges the histories, reads the resource's final state, runs the checkers.
    pub fn judge(
        &self,
        tag: &str,
        histories: &[PathBuf],
        faults: String,
    ) -> Result<(Outcome, Vec<Event>), String> {
        self.judge_with(tag, histories, faults, true, Sharing::Permits(1))
    }

    /// [`judge`](Self::judge) for a semaphore of `permits` permits: C1 allows that many
    /// leases at once ([`leases_over`]); C2 and C5 are not judged (holders at once write
    /// with interleaved tokens, which a fence rejects by design; the MONITOR replay
    /// models a lock key, not a permit set).
    pub fn judge_semaphore(
        &self,
        tag: &str,
        histories: &[PathBuf],
        faults: String,
        permits: usize,
    ) -> Result<(Outcome, Vec<Event>), String> {
        self.judge_with(tag, histories, faults, false, Sharing::Permits(permits))
    }

    /// [`judge`](Self::judge) for a read-write lock: C1 lets readers share and no one
    /// beside a writer, and places every read and write inside a lease
    /// ([`readers_beside_writer`]); C2 is judged (the writers alone write); C5 is not
    /// (the MONITOR replay models a lock key, not readers).
    pub fn judge_rwlock(
        &self,
        tag: &str,
        histories: &[PathBuf],
        faults: String,
    ) -> Result<(Outcome, Vec<Event>), String> {
        self.judge_with(tag, histories, faults, false, Sharing::ReadWrite)
    }

    /// [`judge`](Self::judge) without C5, for a lock on servers the lab's MONITOR
    /// recorders do not follow (a Sentinel group, a cluster: the lock key moves to
    /// another server in a failover, and its killed master's stream ends mid-way).
    pub fn judge_unmonitored(
        &self,
        tag: &str,
        histories: &[PathBuf],
        faults: String,
    ) -> Result<(Outcome, Vec<Event>), String> {
        self.judge_with(tag, histories, faults, false, Sharing::Permits(1))
    }

    fn judge_with(
        &self,
        tag: &str,
        histories: &[PathBuf],
        faults: String,
        monitored: bool,
        sharing: Sharing,
    ) -> Result<(Outcome, Vec<Event>), String> {
        // C2 when one holder at a time writes.
        let fenced = !matches!(sharing, Sharing::Permits(2..));
        let h = read_histories(histories).map_err(|e| e.to_string())?;
        let (final_values, counter) = self.resource_state(tag)?;
        let results: [Vec<Violation>; 4] = [
            match sharing {
                Sharing::Permits(permits) => leases_over(&h, permits),
                Sharing::ReadWrite => readers_beside_writer(&h),
            },
            if fenced { fenced_order(&h) } else { Vec::new() },
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
        for m in self.monitors.borrow_mut().iter_mut().filter(|_| monitored) {
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
        let c2 = c2.filter(|_| fenced);
        let mut outcome = Outcome {
            name: tag.to_owned(),
            rounds: 1,
            acquisitions: count(Op::Acquire, Phase::Ok),
            attempts: count(Op::Acquire, Phase::Invoke),
            failed_acquires: count(Op::Acquire, Phase::Fail),
            longest_acquire_ns: longest(&h, Op::Acquire),
            faults,
            under_fault: 0,
            violations: [c1, c2, c3, c4, monitored.then_some(c5.len()), None],
            touches: (judged, skipped),
            recovery_ns: None,
            acked: count(Op::Write, Phase::Ok),
            // C1's overlaps (its other violations are reads and writes outside a lease).
            double_grants: results[0]
                .iter()
                .filter(|v| {
                    v.events
                        .last()
                        .is_some_and(|e| !matches!(e.op, Op::Write | Op::Read))
                })
                .count(),
            rejected_writes: count(Op::Write, Phase::Fail),
            counter,
            failed: Vec::new(),
            details,
        };
        if monitored && outcome.acquisitions > 0 && judged == 0 {
            outcome
                .failed
                .push("C5 judged no script write to the lock key (MONITOR replay blind)".into());
        }
        Ok((outcome, h))
    }

    /// Spawns one worker per `(args, history)`; the workers and their histories.
    pub fn spawn_all(
        &self,
        specs: Vec<(Vec<String>, PathBuf)>,
    ) -> Result<(Workers, Vec<PathBuf>), String> {
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        for (args, path) in specs {
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        Ok((workers, histories))
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

/// `(invoke time, completion time, duration)` of every completed `op` in `h`, per
/// process (a process runs one operation at a time).
pub fn durations(h: &[Event], op: Op) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
    let mut invoked = std::collections::HashMap::new();
    h.iter().filter(move |e| e.op == op).filter_map(move |e| {
        if e.phase == Phase::Invoke {
            invoked.insert(e.process, e.time_ns);
            None
        } else {
            invoked
                .remove(&e.process)
                .map(|start| (start, e.time_ns, e.time_ns.saturating_sub(start)))
        }
    })
}

/// How many `op`s were invoked before `from` and completed after `to`.
pub fn spans(h: &[Event], op: Op, from: u64, to: u64) -> usize {
    durations(h, op)
        .filter(|&(start, end, _)| start < from && end > to)
        .count()
}

/// Writes of the harness itself to the fenced resource (fencelock's Redis check),
/// recorded in a history.
pub struct ResourceWriter {
    rt: tokio::runtime::Runtime,
    store: Store,
    /// The lock, after which the resource is named.
    lock: String,
}

impl ResourceWriter {
    /// Writes `value` with fencing token `token` as process `p`; whether the resource
    /// accepted it.
    pub fn write(
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
        let accepted = self
            .rt
            .block_on(self.store.write(Some(&self.lock), token, value, value))
            .map_err(|e| format!("fenced write: {e}"))?;
        let done = if accepted {
            event(Phase::Ok)
        } else {
            event(Phase::Fail).with_error("stale fencing token")
        };
        hist.append(&done).map_err(|e| e.to_string())?;
        Ok(accepted)
    }
}

pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The `acquire ok` record of a guard just acquired.
pub fn acquired(p: u32, guard: &fencelock::LockGuard, client: &fencelock::Client) -> Event {
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

pub fn release(p: u32, phase: Phase, owner: &HolderToken, token: u64) -> Event {
    Event::now(p, Op::Release, phase)
        .with_token(token)
        .with_owner(owner.as_str())
}

pub fn release_phase(r: &Result<(), fencelock::Error>) -> Phase {
    if r.is_ok() { Phase::Ok } else { Phase::Fail }
}

/// Which leases C1 lets live at once.
#[derive(Clone, Copy)]
enum Sharing {
    /// Up to this many owners: a lock (1), a semaphore's permits.
    Permits(usize),
    /// A read-write lock's readers together, a writer alone.
    ReadWrite,
}

/// The harness acting as a client of the lock server itself, for one scenario's lock.
pub struct Harness {
    pub rt: tokio::runtime::Runtime,
    pub client: fencelock::Client,
    /// The lock's name, and its key in Redis.
    pub lock: String,
    pub key: String,
}

impl Lab {
    /// The harness as a client of the lock server.
    pub fn harness(&self, tag: &str) -> Result<Harness, String> {
        self.harness_on(tag, &self.lock)
    }

    /// The harness as a client of `server`.
    pub fn harness_on(&self, tag: &str, server: &RedisServer) -> Result<Harness, String> {
        let rt = runtime()?;
        let client = rt
            .block_on(fencelock::Client::connect(&server.url()))
            .map_err(|e| format!("{tag}: connect: {e}"))?;
        let lock = format!("lab:{tag}");
        let key = format!("fencelock:{{{lock}}}");
        Ok(Harness {
            rt,
            client,
            lock,
            key,
        })
    }
}

/// A current-thread Tokio runtime for the harness's own clients.
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}
