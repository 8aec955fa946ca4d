//! Many independent locks through one client: one process (this harness, on its
//! current-thread runtime), [`TASKS`] concurrent tasks, each locking a name of its own
//! in a loop (acquire, hold nothing, release), all through one client: fencelock's
//! `Client`, rslock's `LockManager`, and redis-rs alone (`SET NX PX` and the owner-checked
//! `DEL` script of the latency rows, on one multiplexed connection). What a web service
//! that locks per request gets from its one client. Measured: acquisitions per second and
//! the redis-server main thread's CPU time per acquisition; the clients take turns,
//! [`ROUNDS`] rounds of a share of the plan's hot-key time each, so that drift hits them
//! alike.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::latency::{RAW_RELEASE, TTL, raw_cycle, thread_cpu_ns};
use crate::plan::Plan;
use crate::report::{errors_cell, fmt_dur, x};

/// Concurrent tasks, each with a name of its own.
pub(crate) const TASKS: usize = 64;
/// Turns of each client.
const ROUNDS: u32 = 3;

/// One client of the rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Who {
    Fencelock,
    Rslock,
    Raw,
}

impl Who {
    const ALL: [Who; 3] = [Who::Fencelock, Who::Rslock, Who::Raw];

    fn label(self) -> &'static str {
        match self {
            Who::Fencelock => "fencelock",
            Who::Rslock => "rslock",
            Who::Raw => "redis-rs alone",
        }
    }

    fn settings(self) -> &'static str {
        match self {
            Who::Fencelock => {
                "one `Client`; each task `client.lock(own name).try_acquire()`, then \
                 `release()`; the library's defaults (a lease of 30 s renewed by the \
                 watchdog while held)"
            }
            Who::Rslock => "one `LockManager`; each task `lock(own name, 10 s)`, then `release()`",
            Who::Raw => {
                "one redis-rs `MultiplexedConnection`, cloned per task: `SET name token NX \
                 PX 10000`, then an owner-checked `DEL` script; no fencing token"
            }
        }
    }
}

/// What one client did over all its rounds.
pub(crate) struct Row {
    pub(crate) who: Who,
    pub(crate) acquisitions: u64,
    pub(crate) elapsed: Duration,
    /// redis-server main thread CPU time per acquisition (ns).
    pub(crate) server_cpu_ns: Result<f64, String>,
    pub(crate) errors: Vec<String>,
}

impl Row {
    pub(crate) fn per_second(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The section's rows (empty when it could not run) and why it failed, if it did.
#[derive(Default)]
pub(crate) struct Many {
    pub(crate) rows: Vec<Row>,
    pub(crate) error: Option<String>,
}

impl Many {
    pub(crate) fn failed(&self) -> bool {
        self.error.is_some() || self.rows.iter().any(|r| !r.errors.is_empty())
    }
}

/// A connected client.
pub(crate) enum Client {
    Fence(fencelock::Client),
    Rslock(Arc<rslock::LockManager>),
    Raw(redis::aio::MultiplexedConnection, Arc<redis::Script>),
}

impl Client {
    async fn connect(who: Who, url: &str) -> Result<Client, String> {
        Ok(match who {
            Who::Fencelock => Client::Fence(
                fencelock::Client::connect(url)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
            Who::Rslock => Client::Rslock(Arc::new(rslock::LockManager::new(vec![url.to_owned()]))),
            Who::Raw => {
                let client = redis::Client::open(url).map_err(|e| e.to_string())?;
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                Client::Raw(conn, Arc::new(redis::Script::new(RAW_RELEASE)))
            }
        })
    }

    /// One acquire and release of `name`.
    async fn cycle(&self, name: &str) -> Result<(), String> {
        match self {
            Client::Fence(c) => {
                let guard = c
                    .lock(name)
                    .try_acquire()
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                guard.release().await.map_err(|e| format!("release: {e}"))
            }
            Client::Rslock(m) => {
                let lock = m
                    .lock(name.as_bytes(), TTL)
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                lock.release().await;
                Ok(())
            }
            Client::Raw(conn, release) => raw_cycle(&mut conn.clone(), release, name).await,
        }
    }
}

/// Runs [`TASKS`] tasks of `client` for `window`: acquisitions, and the errors (each
/// ends its task).
pub(crate) async fn round(client: &Arc<Client>, who: Who, window: Duration) -> (u64, Vec<String>) {
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let (client, count) = (client.clone(), count.clone());
        let name = format!("bench-many-{}-{t}", who.label().replace(' ', "-"));
        tasks.spawn(async move {
            while Instant::now() < deadline {
                client.cycle(&name).await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        });
    }
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(format!("task: {e}")),
        }
    }
    (count.load(Ordering::Relaxed), errors)
}

/// The section on `server`: each client connects once, warms up, then the clients take
/// [`ROUNDS`] turns.
pub(crate) async fn run(plan: &Plan, server: &testkit::RedisServer) -> Many {
    let url = server.url();
    let mut clients = Vec::new();
    for who in Who::ALL {
        match Client::connect(who, &url).await {
            Ok(c) => clients.push((who, Arc::new(c))),
            Err(e) => {
                return Many {
                    rows: Vec::new(),
                    error: Some(format!("{}: {e}", who.label())),
                };
            }
        }
    }
    let window = plan.hot_key_run / ROUNDS;
    let mut rows: Vec<Row> = Who::ALL
        .iter()
        .map(|&who| Row {
            who,
            acquisitions: 0,
            elapsed: Duration::ZERO,
            server_cpu_ns: Ok(0.0),
            errors: Vec::new(),
        })
        .collect();
    // Warm-up: scripts loaded, connections and the watchdog up.
    for (who, c) in &clients {
        let _ = round(c, *who, Duration::from_millis(100)).await;
    }
    let pid = server.pid();
    for r in 0..ROUNDS {
        eprintln!(
            "many locks through one client: round {} of {ROUNDS}, {TASKS} tasks, {:?} each",
            r + 1,
            window
        );
        for ((who, c), row) in clients.iter().zip(&mut rows) {
            let cpu_before = thread_cpu_ns(pid);
            let started = Instant::now();
            let (n, errors) = round(c, *who, window).await;
            row.elapsed += started.elapsed();
            row.acquisitions += n;
            row.errors.extend(errors);
            let used = cpu_before.and_then(|b| Ok(thread_cpu_ns(pid)?.saturating_sub(b)));
            row.server_cpu_ns = match (row.server_cpu_ns.clone(), used) {
                (Ok(sum), Ok(u)) => Ok(sum + u as f64),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
    }
    for row in &mut rows {
        let n = row.acquisitions.max(1) as f64;
        row.server_cpu_ns = row.server_cpu_ns.clone().map(|total| total / n);
    }
    // Releases and watchdog work left in the background end here.
    if let Some((_, c)) = clients.first()
        && let Client::Fence(f) = &**c
    {
        let _ = tokio::time::timeout(Duration::from_secs(5), f.flush()).await;
    }
    Many { rows, error: None }
}

/// The section "Many locks through one client".
pub(crate) fn render(s: &mut String, many: &Many, plan: &Plan) {
    let _ = writeln!(s, "## Many locks through one client\n");
    let _ = writeln!(
        s,
        "One process (the harness, a current-thread Tokio runtime), {TASKS} tasks at once, \
         each locking a name of its own in a loop (acquire, hold nothing, release), all \
         through one client; the clients take {ROUNDS} turns of {} each. Acquisitions per \
         second over all turns; redis-server's main-thread CPU time per acquisition \
         (`/proc/<pid>/schedstat`).\n",
        fmt_dur(plan.hot_key_run / ROUNDS)
    );
    if let Some(e) = &many.error {
        let _ = writeln!(s, "Not measured: {e}\n");
        return;
    }
    let _ = writeln!(s, "| client | settings |\n|---|---|");
    for r in &many.rows {
        let _ = writeln!(s, "| {} | {} |", r.who.label(), r.who.settings());
    }
    let _ = writeln!(s);
    let fence = many
        .rows
        .iter()
        .find(|r| r.who == Who::Fencelock)
        .map(Row::per_second);
    let _ = writeln!(
        s,
        "| client | acquisitions/s | × fencelock | Redis CPU / acquisition | errors |\n|---|---|---|---|---|"
    );
    for r in &many.rows {
        let cpu = match &r.server_cpu_ns {
            Ok(ns) => format!("{:.1} µs", ns / 1000.0),
            Err(e) => format!("– ({e})"),
        };
        let errors = errors_cell(&r.errors, None);
        let _ = writeln!(
            s,
            "| {} | {:.0} | {} | {cpu} | {errors} |",
            r.who.label(),
            r.per_second(),
            fence.map_or("–".into(), |f| x(r.per_second() / f)),
        );
    }
    let _ = writeln!(s);
}
