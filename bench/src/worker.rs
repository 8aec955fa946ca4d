//! The hidden `worker` subcommand: one OS process running several contenders as tokio
//! tasks.
//!
//! Protocol with the harness, one line each on stdout: `ready` once connected; then,
//! after the harness writes `go START_NS` on stdin (a `CLOCK_MONOTONIC` time shortly
//! ahead, the same for every worker), the contenders run from START_NS for
//! `--duration-ms`; then the results (`sample NS`, `count N`, `stat NAME N`,
//! `error MSG`) and `done`.
//! A worker exits as soon as its stdin closes (the harness died), so none outlives it.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::time::{Instant, sleep, sleep_until};

use crate::clock::mono_ns;
use crate::peers;

/// The lock under test (the Rust ones; see [`crate::peers::Peer`] for their settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LockKind {
    /// fencelock, default (plain) mode, waiting for ever.
    Plain,
    /// fencelock in fair (FIFO) mode, waiting for ever.
    Fair,
    /// rslock at its default retry settings.
    Rslock,
    /// rslock with a short retry pause.
    RslockTuned,
    /// redlock crate at its default retry settings.
    Redlock,
    /// redlock crate with a short retry pause.
    RedlockTuned,
    /// fencelock's semaphore with `--permits` permits, default mode, waiting for ever.
    Semaphore,
    /// The same, fair: its waiters served in arrival order.
    FairSemaphore,
}

/// What the contenders do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Strict handoff: measure release → another process holds.
    Handoff,
    /// Hot key: acquire, release at once, again; count acquisitions per contender.
    HotKey,
    /// Semaphore handoff: measure release → another process holds the freed permit,
    /// releases and acquisitions paired in order through a list of stamps.
    SemaphoreHandoff,
}

/// Arguments of the hidden `worker` subcommand (set by the harness, not by people).
#[derive(clap::Args, Clone, Debug)]
pub struct WorkerArgs {
    /// Redis URL.
    #[arg(long)]
    pub url: String,
    /// What the contenders do.
    #[arg(long, value_enum)]
    pub scenario: Scenario,
    /// Which lock.
    #[arg(long, value_enum)]
    pub lock: LockKind,
    /// Lock name (also the prefix of the bench's own keys).
    #[arg(long)]
    pub name: String,
    /// Contenders (tokio tasks) in this process.
    #[arg(long)]
    pub tasks: usize,
    /// How long each acquisition holds the lock, in microseconds.
    #[arg(long)]
    pub hold_us: u64,
    /// How long the contenders run, from the start time the harness sends with `go`, in
    /// milliseconds.
    #[arg(long)]
    pub duration_ms: u64,
    /// This process's index among the run's worker processes.
    #[arg(long, default_value_t = 0)]
    pub proc_index: usize,
    /// How many worker processes the run has.
    #[arg(long, default_value_t = 1)]
    pub procs: usize,
    /// How many contenders the run has, over all its processes.
    #[arg(long, default_value_t = 1)]
    pub contenders: usize,
    /// Handoff: contenders make their first attempt at evenly spread offsets over this
    /// many milliseconds, so polling waiters poll at spread phases.
    #[arg(long, default_value_t = 100)]
    pub spread_ms: u64,
    /// Lock TTL in milliseconds (fixed lease, never reached in practice).
    #[arg(long, default_value_t = 10_000)]
    pub ttl_ms: u64,
    /// `--lock semaphore`: the semaphore's permits.
    #[arg(long, default_value_t = 1)]
    pub permits: u32,
    /// Handoff: the file through which each holder tells the next one when it released
    /// (see [`StampFile`]); the harness makes it, empty, for the run.
    #[arg(long, value_name = "PATH")]
    pub stamp_file: Option<std::path::PathBuf>,
}

/// How a process takes and gives back the lock under test. One per process, shared by
/// its tasks (as an application would share its client).
enum Locker {
    Fence(fencelock::LockBuilder),
    /// fencelock's semaphore.
    Permit(fencelock::SemaphoreBuilder),
    Rslock {
        manager: rslock::LockManager,
        key: String,
        ttl: Duration,
    },
    /// Synchronous: every call runs on tokio's blocking pool, so one waiting contender
    /// does not stall the other tasks of the process.
    Redlock {
        manager: Arc<redlock::RedLock>,
        key: String,
        ttl_ms: usize,
    },
}

enum Held {
    Fence(Box<fencelock::LockGuard>),
    Rslock(rslock::Lock),
    /// The lock's value (its owner token).
    Redlock(Vec<u8>),
}

/// A fencelock acquire, or `None` when `deadline` comes first.
async fn fence_acquire(
    acquire: impl Future<Output = Result<fencelock::LockGuard, fencelock::Error>>,
    deadline: Instant,
) -> Result<Option<Held>, String> {
    tokio::select! {
        r = acquire => r.map(|g| Some(Held::Fence(Box::new(g)))).map_err(|e| e.to_string()),
        () = sleep_until(deadline) => Ok(None),
    }
}

impl Locker {
    /// Waits for the lock; `Ok(None)` when `deadline` comes first.
    async fn acquire(&self, deadline: Instant) -> Result<Option<Held>, String> {
        match self {
            Locker::Fence(builder) => fence_acquire(builder.acquire(), deadline).await,
            Locker::Permit(builder) => fence_acquire(builder.acquire(), deadline).await,
            // The library's own waiting loop.
            Locker::Rslock { manager, key, ttl } => tokio::select! {
                r = manager.acquire_no_guard(key.as_bytes(), *ttl) => r.map(|l| Some(Held::Rslock(l))).map_err(|e| e.to_string()),
                () = sleep_until(deadline) => Ok(None),
            },
            // As the library's `acquire` (`lock()` until it succeeds), checking the
            // deadline between calls.
            Locker::Redlock {
                manager,
                key,
                ttl_ms,
            } => loop {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                let (manager, key, ttl_ms) = (manager.clone(), key.clone(), *ttl_ms);
                let got = tokio::task::spawn_blocking(move || {
                    manager
                        .lock(key.as_bytes(), ttl_ms)
                        .map(|l| l.map(|l| l.val))
                })
                .await
                .map_err(|e| format!("blocking task: {e}"))?
                .map_err(|e| e.to_string())?;
                if let Some(val) = got {
                    return Ok(Some(Held::Redlock(val)));
                }
            },
        }
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Locker::Fence(_) | Locker::Permit(_), Held::Fence(guard)) => {
                guard.release().await.map_err(|e| e.to_string())
            }
            // Best effort, no outcome reported (the library's API).
            (Locker::Rslock { .. }, Held::Rslock(lock)) => {
                lock.release().await;
                Ok(())
            }
            (Locker::Redlock { manager, key, .. }, Held::Redlock(val)) => {
                let (manager, key) = (manager.clone(), key.clone());
                tokio::task::spawn_blocking(move || redlock_unlock(&manager, key, val))
                    .await
                    .map_err(|e| format!("blocking task: {e}"))
            }
            _ => Err("a lock released by a locker that did not make it".to_owned()),
        }
    }
}

/// Releases a redlock-crate lock known by its key and value (the library releases a
/// `Lock`, which borrows the manager, so it cannot cross to another thread).
pub fn redlock_unlock(manager: &redlock::RedLock, key: String, val: Vec<u8>) {
    manager.unlock(&redlock::Lock {
        resource: key.into_bytes(),
        val,
        validity_time: 0,
        lock_manager: manager,
    });
}

/// An rslock manager over `urls`, with the retry pause of `lock`.
pub fn rslock_manager(urls: &[String], tuned: bool) -> rslock::LockManager {
    let mut manager = rslock::LockManager::new(urls.to_vec());
    manager.set_retry(
        peers::RUST_PEER_RETRY_COUNT,
        if tuned {
            peers::RUST_PEER_TUNED_DELAY
        } else {
            peers::RUST_PEER_DEFAULT_DELAY
        },
    );
    manager
}

/// A redlock-crate manager over `urls`, with the retry pause of `lock`; an error for a
/// URL it cannot parse (its constructor would panic).
pub fn redlock_manager(urls: &[String], tuned: bool) -> Result<redlock::RedLock, String> {
    for url in urls {
        redis::Client::open(url.as_str()).map_err(|e| format!("{url}: {e}"))?;
    }
    let mut manager = redlock::RedLock::new(urls.to_vec());
    let delay = if tuned {
        peers::RUST_PEER_TUNED_DELAY
    } else {
        peers::RUST_PEER_DEFAULT_DELAY
    };
    manager.set_retry(peers::RUST_PEER_RETRY_COUNT, delay.as_millis() as u32);
    Ok(manager)
}

#[derive(Default)]
struct TaskResult {
    /// Handoff latencies, ns.
    samples: Vec<u64>,
    acquisitions: u64,
    /// Handoffs between two tasks of this process (not counted as samples).
    same_process: u64,
    /// Acquisitions that started after the previous release (the contender was not
    /// waiting at the release, so it is not a handoff sample).
    late: u64,
    /// The longest single acquire, ns.
    max_wait: u64,
    errors: Vec<String>,
}

struct Ctx {
    args: WorkerArgs,
    locker: Locker,
    conn: MultiplexedConnection,
    pid: u32,
    /// Handoff: where the holders' stamps go.
    stamps: Option<StampFile>,
}

/// The lock handoff's stamps: one record at the start of a file (in the temporary
/// directory, so in the page cache), which each holder overwrites with `"<pid> <ns>
/// <task>"` just before it releases and the next holder reads once it holds the lock. The
/// lock orders the write before the read, and neither costs a Redis round trip, so a
/// sample is the handoff alone (until 26 November the stamp was a Redis `SET`, whose
/// round trip each sample included). All the workers of a run, whatever their language,
/// share the file and write the record the same way.
struct StampFile(std::fs::File);

impl StampFile {
    /// A record's length: written padded with spaces, so that a longer record never
    /// leaves a tail of an earlier one.
    const LEN: usize = 64;

    fn open(path: &std::path::Path) -> Result<Self, String> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map(StampFile)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    fn write(&self, stamp: &str) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let record = format!("{stamp:<width$}", width = Self::LEN);
        self.0.write_all_at(record.as_bytes(), 0)
    }

    /// The last record written; `None` before the first.
    fn read(&self) -> std::io::Result<Option<String>> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; Self::LEN];
        let mut read = 0;
        while read < buf.len() {
            match self.0.read_at(&mut buf[read..], read as u64)? {
                0 => break,
                n => read += n,
            }
        }
        let text = String::from_utf8_lossy(&buf[..read]).trim().to_owned();
        Ok((!text.is_empty()).then_some(text))
    }
}

/// Runs the worker; returns the process exit code.
pub fn run(args: WorkerArgs) -> i32 {
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<u64>();
    // Stdin watcher: `go START_NS` starts the run; end of file (the harness is gone)
    // ends the process at once.
    std::thread::spawn(move || {
        let mut go = Some(go_tx);
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.lock().read_line(&mut line) {
                Ok(0) | Err(_) => std::process::exit(3),
                Ok(_) => {
                    let start = line.trim().strip_prefix("go ").and_then(|n| n.parse().ok());
                    if let (Some(start), Some(tx)) = (start, go.take()) {
                        let _ = tx.send(start);
                    }
                }
            }
        }
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run_async(args, go_rx)) {
        Ok(()) => 0,
        Err(e) => {
            println!("error {e}");
            println!("done");
            1
        }
    }
}

async fn run_async(
    args: WorkerArgs,
    go: tokio::sync::oneshot::Receiver<u64>,
) -> Result<(), String> {
    let redis_client = redis::Client::open(args.url.as_str()).map_err(|e| e.to_string())?;
    let conn = redis_client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let mut fence_client = None;
    let locker = match args.lock {
        LockKind::Plain | LockKind::Fair => {
            let client = fencelock::Client::connect(&args.url)
                .await
                .map_err(|e| e.to_string())?;
            // The library's defaults but the lease (the watchdog renews it): a fair
            // waiter takes a handover from the release message only with it on, when
            // the lease handed over ends at its deadline, before the lease asked for.
            let mut builder = client
                .lock(args.name.as_str())
                .lease(Duration::from_millis(args.ttl_ms))
                .wait_forever();
            if args.lock == LockKind::Fair {
                builder = builder.fair();
            }
            fence_client = Some(client);
            Locker::Fence(builder)
        }
        LockKind::Semaphore | LockKind::FairSemaphore => {
            let client = fencelock::Client::connect(&args.url)
                .await
                .map_err(|e| e.to_string())?;
            // As the plain lock: the library's defaults but the lease.
            let mut builder = client
                .semaphore(args.name.as_str(), args.permits)
                .lease(Duration::from_millis(args.ttl_ms))
                .wait_forever();
            if args.lock == LockKind::FairSemaphore {
                builder = builder.fair();
            }
            fence_client = Some(client);
            Locker::Permit(builder)
        }
        LockKind::Rslock | LockKind::RslockTuned => {
            let urls = [args.url.clone()];
            let manager = rslock_manager(&urls, args.lock == LockKind::RslockTuned);
            Locker::Rslock {
                manager,
                key: format!("{}:lock", args.name),
                ttl: Duration::from_millis(args.ttl_ms),
            }
        }
        LockKind::Redlock | LockKind::RedlockTuned => {
            let urls = [args.url.clone()];
            let manager = redlock_manager(&urls, args.lock == LockKind::RedlockTuned)?;
            Locker::Redlock {
                manager: Arc::new(manager),
                key: format!("{}:lock", args.name),
                ttl_ms: args.ttl_ms as usize,
            }
        }
    };
    // Handoff: one connection per task for the blocking BLPOP that tells a releaser
    // another contender took the lock.
    let mut blpop_conns = Vec::new();
    if matches!(
        args.scenario,
        Scenario::Handoff | Scenario::SemaphoreHandoff
    ) {
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(5)));
        for _ in 0..args.tasks {
            blpop_conns.push(
                redis_client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
    }
    let stamps = match (&args.scenario, &args.stamp_file) {
        (Scenario::Handoff, Some(path)) => Some(StampFile::open(path)?),
        (Scenario::Handoff, None) => return Err("a handoff needs --stamp-file".to_owned()),
        _ => None,
    };
    let ctx = Arc::new(Ctx {
        locker,
        conn,
        pid: std::process::id(),
        stamps,
        args,
    });
    emit(&["ready".to_owned()]);
    let start_ns = go.await.map_err(|_| "no go from the harness".to_owned())?;
    let start = instant_at(start_ns);
    let deadline = start + Duration::from_millis(ctx.args.duration_ms);
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..ctx.args.tasks {
        let ctx = ctx.clone();
        match ctx.args.scenario {
            Scenario::Handoff | Scenario::SemaphoreHandoff => {
                let blpop = blpop_conns.pop().expect("one per task");
                // Contender `g` (interleaved across processes: task `t` of process `p` is
                // `t * procs + p`) makes its first attempt `g / contenders` of the spread
                // after the start. So a FIFO queue starts out alternating between
                // processes rather than grouped by process, and polling waiters poll at
                // spread phases rather than all at once.
                let g = task * ctx.args.procs + ctx.args.proc_index;
                let spacing =
                    Duration::from_millis(ctx.args.spread_ms) / ctx.args.contenders.max(1) as u32;
                let first = start + spacing * g as u32;
                tasks.spawn(async move {
                    sleep_until(first).await;
                    handoff_task(&ctx, blpop, task, deadline).await
                });
            }
            Scenario::HotKey => {
                tasks.spawn(async move {
                    sleep_until(start).await;
                    hot_key_task(&ctx, deadline).await
                });
            }
        }
    }
    let mut out = Vec::new();
    let mut totals = TaskResult::default();
    while let Some(joined) = tasks.join_next().await {
        let r = joined.map_err(|e| format!("contender task failed: {e}"))?;
        if ctx.args.scenario == Scenario::HotKey {
            out.push(format!("count {}", r.acquisitions));
        }
        totals.samples.extend(r.samples);
        totals.acquisitions += r.acquisitions;
        totals.same_process += r.same_process;
        totals.late += r.late;
        totals.max_wait = totals.max_wait.max(r.max_wait);
        totals.errors.extend(r.errors);
    }
    // Releases of acquires cancelled at the deadline go out in the background.
    if let Some(client) = &fence_client {
        tokio::time::timeout(Duration::from_secs(5), client.flush())
            .await
            .ok();
    }
    out.extend(totals.samples.iter().map(|s| format!("sample {s}")));
    out.push(format!("stat acquisitions {}", totals.acquisitions));
    out.push(format!("stat same_process {}", totals.same_process));
    out.push(format!("stat late {}", totals.late));
    out.push(format!("stat max_wait {}", totals.max_wait));
    out.extend(
        totals
            .errors
            .iter()
            .map(|e| format!("error {}", e.replace('\n', " "))),
    );
    out.push("done".to_owned());
    emit(&out);
    Ok(())
}

/// The tokio instant of a `CLOCK_MONOTONIC` time.
fn instant_at(mono: u64) -> Instant {
    let (now, now_ns) = (Instant::now(), mono_ns());
    if mono >= now_ns {
        now + Duration::from_nanos(mono - now_ns)
    } else {
        now.checked_sub(Duration::from_nanos(now_ns - mono))
            .unwrap_or(now)
    }
}

fn emit(lines: &[String]) {
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    for l in lines {
        let _ = writeln!(w, "{l}");
    }
    let _ = w.flush();
}

/// The previous holder's stamp: `"<pid> <ns> <task>"`.
fn parse_stamp(s: &str) -> Option<(u32, u64, String)> {
    let mut it = s.split(' ');
    let pid = it.next()?.parse().ok()?;
    let ns = it.next()?.parse().ok()?;
    let task = it.next()?.to_owned();
    Some((pid, ns, format!("{pid}:{task}")))
}

/// One contender of the handoff scenario. Each loop: acquire (waiting for ever) → read
/// the clock → read the stamp of the previous holder → record a sample if that holder was
/// another process and this contender was already waiting when it released → tell the
/// previous holder its lock was taken → hold → write our stamp → release → wait until
/// another contender has taken the lock (strict handoff, no barging: the releaser
/// always rejoins the waiters instead of retaking a lock it just freed).
///
/// The lock handoff's stamps go through a file ([`StampFile`]), so a sample runs from
/// just before the release to the next holder holding the lock. The semaphore handoff
/// ([`Scenario::SemaphoreHandoff`]) keeps them in Redis: a semaphore's releases may
/// overlap, so one record will not do. Each holder pushes its stamp onto a list
/// (`RPUSH`) just before it releases, and each new holder takes the oldest stamp there
/// (`LPOP`); each of its samples includes that push's round trip. Permits are
/// interchangeable, so which release freed the permit taken is not known; releases and
/// acquisitions are paired in order (once the first `permits` acquisitions have taken
/// the free permits, every acquisition needed a release, and the list holds one stamp
/// per permit freed and not taken again). The stamp's holder is told its permit was
/// taken, and only then contends again.
async fn handoff_task(
    ctx: &Ctx,
    mut blpop: MultiplexedConnection,
    task: usize,
    deadline: Instant,
) -> TaskResult {
    let mut r = TaskResult::default();
    let mut conn = ctx.conn.clone();
    let name = &ctx.args.name;
    let me = format!("{}:{task}", ctx.pid);
    let stamp_list = format!("{name}:stamps");
    let my_inbox = format!("{name}:taken:{me}");
    let hold = Duration::from_micros(ctx.args.hold_us);
    while Instant::now() < deadline {
        let started = mono_ns();
        let held = match ctx.locker.acquire(deadline).await {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) => {
                r.errors.push(format!("acquire: {e}"));
                break;
            }
        };
        let now = mono_ns();
        r.acquisitions += 1;
        let prev: Result<Option<String>, String> = match &ctx.stamps {
            Some(file) => file.read().map_err(|e| format!("stamp file: {e}")),
            None => conn
                .lpop(&stamp_list, None)
                .await
                .map_err(|e| format!("LPOP: {e}")),
        };
        let prev = match prev {
            Ok(p) => p,
            Err(e) => {
                r.errors.push(e);
                let _ = ctx.locker.release(held).await;
                break;
            }
        };
        // While the lock is held: a "taken" for the previous holder, and none left for us.
        let mut pipe = redis::pipe();
        pipe.del(&my_inbox).ignore();
        if let Some((pid, ns, prev_id)) = prev.as_deref().and_then(parse_stamp) {
            if pid == ctx.pid {
                r.same_process += 1;
            } else if started <= ns {
                r.samples.push(now.saturating_sub(ns));
            } else {
                r.late += 1;
            }
            if prev_id != me {
                pipe.lpush(format!("{name}:taken:{prev_id}"), 1).ignore();
            }
        }
        let told: Result<(), _> = pipe.query_async(&mut conn).await;
        if let Err(e) = told {
            r.errors.push(format!("DEL/LPUSH: {e}"));
        }
        sleep(hold).await;
        let stamp = format!("{} {} {task}", ctx.pid, mono_ns());
        let wrote = match &ctx.stamps {
            Some(file) => file.write(&stamp).map_err(|e| format!("stamp file: {e}")),
            None => conn
                .rpush::<_, _, ()>(&stamp_list, stamp)
                .await
                .map_err(|e| format!("RPUSH stamp: {e}")),
        };
        if let Err(e) = wrote {
            r.errors.push(e);
        }
        if let Err(e) = ctx.locker.release(held).await {
            r.errors.push(format!("release: {e}"));
            break;
        }
        // Wait (bounded by the deadline) until someone else took the lock.
        loop {
            if Instant::now() >= deadline {
                return r;
            }
            let popped = tokio::select! {
                p = blpop.blpop::<_, Option<(String, String)>>(&my_inbox, 0.5) => p,
                () = sleep_until(deadline) => return r,
            };
            match popped {
                Ok(Some(_)) => break,
                Ok(None) => {}
                Err(e) => {
                    r.errors.push(format!("BLPOP: {e}"));
                    return r;
                }
            }
        }
    }
    r
}

/// One contender of the hot-key run: acquire (waiting for ever) → hold → release, as
/// fast as it can, until the deadline. Counts its acquisitions.
async fn hot_key_task(ctx: &Ctx, deadline: Instant) -> TaskResult {
    let mut r = TaskResult::default();
    let hold = Duration::from_micros(ctx.args.hold_us);
    while Instant::now() < deadline {
        let asked = mono_ns();
        let acquired = ctx.locker.acquire(deadline).await;
        r.max_wait = r.max_wait.max(mono_ns() - asked);
        let held = match acquired {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) => {
                r.errors.push(format!("acquire: {e}"));
                break;
            }
        };
        if Instant::now() >= deadline {
            // Past the window (a synchronous peer's attempt ran over): not counted.
            let _ = ctx.locker.release(held).await;
            break;
        }
        r.acquisitions += 1;
        if !hold.is_zero() {
            sleep(hold).await;
        }
        if let Err(e) = ctx.locker.release(held).await {
            r.errors.push(format!("release: {e}"));
            break;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_file_gives_back_the_last_stamp_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stamps");
        std::fs::write(&path, b"").unwrap();
        let writer = StampFile::open(&path).unwrap();
        let reader = StampFile::open(&path).unwrap();
        assert_eq!(
            reader.read().unwrap(),
            None,
            "nothing before the first stamp"
        );
        writer.write("12345 987654321012 63").unwrap();
        assert_eq!(
            reader.read().unwrap().as_deref(),
            Some("12345 987654321012 63")
        );
        // A shorter stamp after a longer one leaves nothing of the longer behind.
        writer.write("7 5 0").unwrap();
        let last = reader.read().unwrap();
        assert_eq!(last.as_deref(), Some("7 5 0"));
        assert_eq!(
            parse_stamp(last.as_deref().unwrap()),
            Some((7, 5, "7:0".to_owned()))
        );
    }
}
