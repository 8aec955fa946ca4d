//! What fencing costs at the resource: the same write with and without the resource's
//! own check of the fencing token (`fencelock::fence`), in the same run.
//!
//! Two pairs:
//!
//! - **PostgreSQL** (a throwaway server of its own, testkit's): `BEGIN; UPDATE` one row
//!   (a statement prepared once per connection) `; COMMIT`, unfenced, against the same
//!   transaction with `fencelock::fence::tokio_postgres::check` first (fenced); one
//!   tokio-postgres connection per client, each client its own row of a table made for
//!   the run, the setup installed with `fencelock::fence::tokio_postgres::install`.
//! - **Redis** (the main server): `SET` one key and `INCRBY` another, as a `MULTI`/`EXEC`
//!   pipeline on one redis-rs multiplexed connection (unfenced), against
//!   `Client::fenced_write(..).set(..).incr_by(..).apply()` (fenced).
//!
//! Each client is one holder writing many times: its token stays the same through a
//! turn and rises by one at the next. Latency: one client, one write at a time, the
//! variants taking turns in blocks of [`BLOCK`] (A B A B ...), pinned as the latency
//! run is, with the server's CPU time (`/proc/PID/schedstat` of redis-server's main
//! thread, or of the client's PostgreSQL backend) read around every turn. Throughput:
//! [`CLIENTS`] clients at once, the variants taking turns in windows of the plan's
//! `fencing_window`.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use fencelock::FencingToken;
use redis::aio::MultiplexedConnection;

use crate::affinity;
use crate::latency::{self, BLOCK, Series, thread_cpu_ns};
use crate::plan::Plan;
use crate::report::{fmt_dur, fmt_ns, x};

/// Clients of the throughput windows (the latency turns use the first).
pub(crate) const CLIENTS: usize = 8;
/// What the Redis writes `SET` (16 bytes).
const VALUE: &str = "0123456789abcdef";
/// The table of the PostgreSQL writes (one row per client).
const TABLE: &str = "bench_fencing";
/// The first token of every client.
const FIRST_TOKEN: u64 = 1_000;

/// How a write is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Without a check.
    Plain,
    /// With fencelock's check: `tokio_postgres::check` first in the transaction, or
    /// `Client::fenced_write`.
    Fenced,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Plain => "unfenced",
            Mode::Fenced => "fenced",
        }
    }
}

/// What one variant measured.
pub(crate) struct Variant {
    pub(crate) mode: Mode,
    /// One client, one write at a time, in turns.
    pub(crate) latency: Series,
    /// The server's CPU time per write over the latency turns (ns), or why it could not
    /// be read.
    pub(crate) cpu: Result<f64, String>,
    /// [`CLIENTS`] clients at once, in windows: writes, and how long the windows lasted.
    pub(crate) throughput: Option<Throughput>,
}

/// Writes of [`CLIENTS`] clients at once over the windows of one variant.
pub(crate) struct Throughput {
    pub(crate) writes: u64,
    pub(crate) time: Duration,
    /// The server's CPU time per write over the windows (ns).
    pub(crate) cpu: Result<f64, String>,
}

impl Throughput {
    /// Writes per second, all clients.
    pub(crate) fn per_second(&self) -> f64 {
        if self.time.is_zero() {
            0.0
        } else {
            self.writes as f64 / self.time.as_secs_f64()
        }
    }
}

/// One store's variants, measured in the same turns.
pub(crate) struct Pair {
    /// The unfenced variant first, then the fenced one.
    pub(crate) variants: Vec<Variant>,
    pub(crate) warmup: usize,
    /// Where the client and the server ran during the latency turns.
    pub(crate) placement: String,
}

impl Pair {
    fn variant(&self, mode: Mode) -> Option<&Variant> {
        self.variants.iter().find(|v| v.mode == mode)
    }
}

/// Everything the section measured.
pub(crate) struct Fencing {
    /// The PostgreSQL server's version, or why PostgreSQL was left out.
    pub(crate) postgres_version: Result<String, String>,
    pub(crate) postgres: Result<Pair, String>,
    /// PostgreSQL is not installed: its rows are left out, which is no failure.
    pub(crate) postgres_missing: bool,
    pub(crate) redis: Result<Pair, String>,
    pub(crate) elapsed: Duration,
}

impl Fencing {
    /// Whether any measurement failed (PostgreSQL left out for want of it is not).
    pub(crate) fn failed(&self) -> bool {
        (self.postgres.is_err() && !self.postgres_missing) || self.redis.is_err()
    }
}

/// The turns of `ops` writes per variant over `variants` variants: `(variant, writes)`
/// in order, each variant in turn for up to `block` writes (A B A B ...).
pub(crate) fn turns(ops: usize, variants: usize, block: usize) -> Vec<(usize, usize)> {
    let block = block.max(1);
    let mut out = Vec::new();
    let mut done = 0;
    while done < ops {
        let k = block.min(ops - done);
        out.extend((0..variants).map(|v| (v, k)));
        done += k;
    }
    out
}

/// Windows of `window` per variant that make up at least `run` (at least one).
pub(crate) fn windows(run: Duration, window: Duration) -> usize {
    if window.is_zero() {
        return 1;
    }
    (run.as_nanos().div_ceil(window.as_nanos()) as usize).max(1)
}

/// CPU time per write (ns); an error without writes.
fn per_write(cpu_ns: u64, writes: u64) -> Result<f64, String> {
    if writes == 0 {
        Err("no writes".to_owned())
    } else {
        Ok(cpu_ns as f64 / writes as f64)
    }
}

/// The ratio of `mode`'s figure to the unfenced one's, by `figure`.
fn ratio(pair: &Pair, mode: Mode, figure: impl Fn(&Variant) -> Option<f64>) -> Option<f64> {
    let plain = figure(pair.variant(Mode::Plain)?)?;
    let other = figure(pair.variant(mode)?)?;
    (plain > 0.0).then(|| other / plain)
}

/// A PostgreSQL client: its connection, its statements, its row.
struct PgClient {
    client: tokio_postgres::Client,
    update: tokio_postgres::Statement,
    id: i32,
    /// The pid of its backend (for its CPU time, and pinning).
    backend: u32,
}

/// Where a client writes.
enum Target {
    Postgres(PgClient),
    Redis {
        conn: MultiplexedConnection,
        fence: fencelock::Client,
        /// The unfenced write's keys, and the fenced write's.
        plain: [String; 2],
        fenced: [String; 2],
    },
}

/// One client: where it writes, the resource its writes are fenced under, its token.
struct Writer {
    target: Target,
    resource: String,
    token: u64,
}

impl Writer {
    /// A new holder: the token rises by one.
    fn next_holder(&mut self) {
        self.token += 1;
    }

    /// One write.
    async fn once(&mut self, mode: Mode) -> Result<(), String> {
        let token = FencingToken::new(self.token);
        match (&mut self.target, mode) {
            (Target::Postgres(pg), mode) => {
                let tx = pg
                    .client
                    .transaction()
                    .await
                    .map_err(|e| format!("BEGIN: {e}"))?;
                match mode {
                    Mode::Plain => {}
                    Mode::Fenced => {
                        fencelock::fence::tokio_postgres::check(&tx, &self.resource, token)
                            .await
                            .map_err(|e| format!("check: {e}"))?;
                    }
                }
                let n = tx
                    .execute(&pg.update, &[&pg.id])
                    .await
                    .map_err(|e| format!("UPDATE: {e}"))?;
                if n != 1 {
                    return Err(format!("UPDATE: {n} rows updated, not 1"));
                }
                tx.commit().await.map_err(|e| format!("COMMIT: {e}"))?;
            }
            (Target::Redis { conn, plain, .. }, Mode::Plain) => {
                redis::pipe()
                    .atomic()
                    .set(&plain[0], VALUE)
                    .ignore()
                    .incr(&plain[1], 1)
                    .ignore()
                    .query_async::<()>(conn)
                    .await
                    .map_err(|e| format!("MULTI/EXEC: {e}"))?;
            }
            (Target::Redis { fence, fenced, .. }, _) => {
                let replies = fence
                    .fenced_write(self.resource.as_str(), token)
                    .set(fenced[0].as_str(), VALUE)
                    .incr_by(fenced[1].as_str(), 1)
                    .apply()
                    .await
                    .map_err(|e| format!("fenced write: {e}"))?;
                if replies.len() != 2 {
                    return Err(format!("fenced write: {} replies, not 2", replies.len()));
                }
            }
        }
        Ok(())
    }
}

/// The server CPU time (ns) of the threads `pids` together.
fn cpu_ns(pids: &[u32]) -> Result<u64, String> {
    pids.iter().map(|&p| thread_cpu_ns(p)).sum()
}

/// Adds to `sum` the CPU time `pids` used since they had used `before` (the first
/// failure to read it sticks).
fn add_cpu(sum: &mut Result<u64, String>, before: Result<u64, String>, pids: &[u32]) {
    let used = before.and_then(|b| Ok(cpu_ns(pids)?.saturating_sub(b)));
    if let Ok(total) = sum {
        match used {
            Ok(u) => *total += u,
            Err(e) => *sum = Err(e),
        }
    }
}

/// The latency turns of `writer`: warm-up, then `ops` writes of each of `modes`, in
/// turns of [`BLOCK`], the token rising at every turn; each write timed, and the CPU
/// time of the server threads `pids` read around every turn. Per mode: its samples and
/// its server CPU per write; and the warm-up writes per mode.
async fn latency_turns(
    writer: &mut Writer,
    modes: &[Mode],
    ops: usize,
    pids: &[u32],
) -> Result<(usize, Vec<(Vec<u64>, Result<f64, String>)>), String> {
    let warmup = (ops / 10).max(BLOCK);
    for _ in 0..warmup {
        for &mode in modes {
            writer
                .once(mode)
                .await
                .map_err(|e| format!("{}: {e}", mode.label()))?;
        }
    }
    let mut samples: Vec<Vec<u64>> = modes.iter().map(|_| Vec::with_capacity(ops)).collect();
    let mut cpu: Vec<Result<u64, String>> = modes.iter().map(|_| Ok(0)).collect();
    for (v, k) in turns(ops, modes.len(), BLOCK) {
        let mode = modes[v];
        writer.next_holder();
        let before = cpu_ns(pids);
        for _ in 0..k {
            let t = Instant::now();
            writer
                .once(mode)
                .await
                .map_err(|e| format!("{}: {e}", mode.label()))?;
            samples[v].push(t.elapsed().as_nanos() as u64);
        }
        add_cpu(&mut cpu[v], before, pids);
    }
    let out = samples
        .into_iter()
        .zip(cpu)
        .map(|(s, c)| {
            let n = s.len() as u64;
            (s, c.and_then(|c| per_write(c, n)))
        })
        .collect();
    Ok((warmup, out))
}

type Loop<'a> = Pin<Box<dyn Future<Output = Result<u64, String>> + 'a>>;

/// Runs every loop at once; their results in order, or the first error.
async fn join_all(loops: Vec<Loop<'_>>) -> Result<Vec<u64>, String> {
    let mut pending: Vec<Option<Loop<'_>>> = loops.into_iter().map(Some).collect();
    let mut done: Vec<u64> = vec![0; pending.len()];
    std::future::poll_fn(|cx| {
        for (slot, out) in pending.iter_mut().zip(done.iter_mut()) {
            if let Some(fut) = slot
                && let Poll::Ready(r) = fut.as_mut().poll(cx)
            {
                *out = r?;
                *slot = None;
            }
        }
        if pending.iter().all(Option::is_none) {
            Poll::Ready(Ok::<(), String>(()))
        } else {
            Poll::Pending
        }
    })
    .await?;
    Ok(done)
}

/// Every writer writing with `mode` as fast as it can until `window` has passed: the
/// writes, and how long until the last one ended.
async fn window(
    writers: &mut [Writer],
    mode: Mode,
    window: Duration,
) -> Result<(u64, Duration), String> {
    let start = Instant::now();
    let deadline = start + window;
    let loops: Vec<Loop<'_>> = writers
        .iter_mut()
        .map(|w| {
            Box::pin(async move {
                let mut n: u64 = 0;
                while Instant::now() < deadline {
                    w.once(mode)
                        .await
                        .map_err(|e| format!("{}: {e}", mode.label()))?;
                    n += 1;
                }
                Ok(n)
            }) as Loop<'_>
        })
        .collect();
    let counts = join_all(loops).await?;
    Ok((counts.iter().sum(), start.elapsed()))
}

/// The throughput windows: a short warm-up window of each of `modes`, then `plan`'s
/// windows, taking turns (A B A B ...), the tokens rising at every window; per mode.
async fn throughput_windows(
    writers: &mut [Writer],
    modes: &[Mode],
    plan: &Plan,
    pids: &[u32],
) -> Result<Vec<Throughput>, String> {
    let warm = plan.fencing_window.min(Duration::from_millis(100));
    for &mode in modes {
        window(writers, mode, warm).await?;
    }
    let mut out: Vec<(u64, Duration, Result<u64, String>)> =
        modes.iter().map(|_| (0, Duration::ZERO, Ok(0))).collect();
    for _ in 0..windows(plan.fencing_run, plan.fencing_window) {
        for (&mode, (writes, time, cpu)) in modes.iter().zip(out.iter_mut()) {
            writers.iter_mut().for_each(Writer::next_holder);
            let before = cpu_ns(pids);
            let (n, t) = window(writers, mode, plan.fencing_window).await?;
            add_cpu(cpu, before, pids);
            *writes += n;
            *time += t;
        }
    }
    Ok(out
        .into_iter()
        .map(|(writes, time, cpu)| Throughput {
            writes,
            time,
            cpu: cpu.and_then(|c| per_write(c, writes)),
        })
        .collect())
}

/// Pins the harness thread to the first CPU it may use and the server thread `server`
/// to the next, until the result is dropped; and says where each runs.
fn pin(server: u32, what: &str) -> (affinity::Pins, String) {
    let cpus = affinity::allowed_cpus();
    if cpus.len() < 2 {
        return (
            affinity::Pins::default(),
            format!("not pinned ({} CPU allowed)", cpus.len()),
        );
    }
    let mut pins = affinity::Pins::default();
    let pinned = pins
        .pin_thread(cpus[0])
        .and_then(|()| pins.pin_process(server, cpus[1]));
    match pinned {
        Ok(()) => (
            pins,
            format!(
                "the harness (one thread) pinned to CPU {}, {what} to CPU {}",
                cpus[0], cpus[1]
            ),
        ),
        Err(e) => {
            drop(pins);
            (affinity::Pins::default(), format!("not pinned ({e})"))
        }
    }
}

/// Measures `writers` with `modes` (the throughput windows only with the first two):
/// the latency turns on the first writer, pinned with its server thread `latency_pid`,
/// then the windows, the CPU of `pids` counted.
async fn measure(
    plan: &Plan,
    writers: &mut [Writer],
    modes: &[Mode],
    latency_pid: u32,
    what: &str,
    pids: &[u32],
) -> Result<Pair, String> {
    let (pins, placement) = pin(latency_pid, what);
    let turns = latency_turns(&mut writers[0], modes, plan.fencing_ops, &[latency_pid]).await;
    drop(pins);
    let (warmup, per_mode) = turns?;
    let throughput = throughput_windows(writers, &modes[..2], plan, pids).await?;
    let mut throughput = throughput.into_iter();
    let mut variants = Vec::new();
    for (&mode, (samples, cpu)) in modes.iter().zip(per_mode) {
        variants.push(Variant {
            mode,
            latency: Series::new(samples)?,
            cpu,
            throughput: throughput.next(),
        });
    }
    Ok(Pair {
        variants,
        warmup,
        placement,
    })
}

/// The Redis pair on `server`.
async fn redis_pair(plan: &Plan, server: &testkit::RedisServer) -> Result<Pair, String> {
    let url = server.url();
    let conn = latency::connect(&url).await?;
    let fence = fencelock::Client::connect(&url)
        .await
        .map_err(|e| format!("fencelock connect: {e}"))?;
    let mut writers: Vec<Writer> = (0..CLIENTS)
        .map(|i| {
            let resource = format!("bench-fencing:{i}");
            Writer {
                target: Target::Redis {
                    conn: conn.clone(),
                    fence: fence.clone(),
                    plain: [
                        format!("bench-fencing-plain:{i}:value"),
                        format!("bench-fencing-plain:{i}:count"),
                    ],
                    fenced: [
                        format!("{{{resource}}}:value"),
                        format!("{{{resource}}}:count"),
                    ],
                },
                resource,
                token: FIRST_TOKEN,
            }
        })
        .collect();
    let modes = [Mode::Plain, Mode::Fenced];
    let pid = server.pid();
    let pair = measure(plan, &mut writers, &modes, pid, "redis-server", &[pid]).await;
    drop(writers);
    fence.flush().await;
    pair
}

/// A PostgreSQL client of the run: connected, its statements prepared, its backend's pid.
async fn pg_client(url: &str, id: i32) -> Result<PgClient, String> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("fencing: a PostgreSQL connection ended: {e}");
        }
    });
    let update = client
        .prepare(&format!("UPDATE {TABLE} SET v = v + 1 WHERE id = $1"))
        .await
        .map_err(|e| format!("prepare the UPDATE: {e}"))?;
    let backend: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| format!("pg_backend_pid(): {e}"))?;
    Ok(PgClient {
        client,
        update,
        id,
        backend: backend as u32,
    })
}

/// The PostgreSQL pair on the server at `url`; and its version.
async fn postgres_pair(plan: &Plan, url: &str) -> Result<(Pair, String), String> {
    let (setup, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    fencelock::fence::tokio_postgres::install(&setup)
        .await
        .map_err(|e| format!("install the check: {e}"))?;
    setup
        .batch_execute(&format!(
            "CREATE TABLE {TABLE} (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
             INSERT INTO {TABLE} (id) SELECT generate_series(0, {})",
            CLIENTS - 1
        ))
        .await
        .map_err(|e| format!("create {TABLE}: {e}"))?;
    let version: String = setup
        .query_one("SHOW server_version", &[])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| format!("server_version: {e}"))?;
    drop(setup);
    let mut writers = Vec::with_capacity(CLIENTS);
    for i in 0..CLIENTS {
        writers.push(Writer {
            target: Target::Postgres(pg_client(url, i as i32).await?),
            resource: format!("bench-fencing:{i}"),
            token: FIRST_TOKEN,
        });
    }
    let backends: Vec<u32> = writers
        .iter()
        .filter_map(|w| match &w.target {
            Target::Postgres(pg) => Some(pg.backend),
            Target::Redis { .. } => None,
        })
        .collect();
    let modes = [Mode::Plain, Mode::Fenced];
    let pair = measure(
        plan,
        &mut writers,
        &modes,
        backends[0],
        "its PostgreSQL backend",
        &backends,
    )
    .await?;
    Ok((pair, version))
}

/// The message of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "it panicked".to_owned())
}

/// Runs the section: Redis on `server` (the main one), then PostgreSQL on a throwaway
/// server started here, on the calling thread (testkit ties its `PR_SET_PDEATHSIG` to
/// it), and stopped before this returns.
pub(crate) async fn run(plan: &Plan, server: &testkit::RedisServer) -> Fencing {
    let started = Instant::now();
    eprintln!(
        "fencing: Redis, {} writes per variant in turns, then {CLIENTS} clients for {:?} per \
         variant",
        plan.fencing_ops, plan.fencing_run
    );
    let redis = redis_pair(plan, server).await;
    if let Err(e) = &redis {
        eprintln!("fencing: Redis failed: {e}");
    }
    eprintln!(
        "fencing: PostgreSQL, {} transactions per variant in turns, then {CLIENTS} clients \
         for {:?} per variant",
        plan.fencing_ops, plan.fencing_run
    );
    let mut postgres_missing = false;
    // testkit panics when PostgreSQL is missing or does not start: that message is told
    // below, without the default hook's backtrace.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let started_pg = std::panic::catch_unwind(testkit::Postgres::start);
    std::panic::set_hook(hook);
    let (postgres, postgres_version) = match started_pg {
        Err(payload) => {
            let message = panic_message(&*payload);
            // testkit's message when it finds no initdb and postgres.
            postgres_missing = message.starts_with("PostgreSQL not found");
            let e = if postgres_missing {
                format!("left out: {message}")
            } else {
                format!("PostgreSQL did not start: {message}")
            };
            (Err(e.clone()), Err(e))
        }
        Ok(pg) => {
            let r = postgres_pair(plan, &pg.url()).await;
            drop(pg);
            match r {
                Ok((pair, version)) => (Ok(pair), Ok(version)),
                Err(e) => (Err(e), Err("unknown".to_owned())),
            }
        }
    };
    match &postgres {
        Err(e) if postgres_missing => eprintln!("fencing: PostgreSQL {e}"),
        Err(e) => eprintln!("fencing: PostgreSQL failed: {e}"),
        Ok(_) => {}
    }
    Fencing {
        postgres_version,
        postgres,
        postgres_missing,
        redis,
        elapsed: started.elapsed(),
    }
}

/// The section "What fencing costs at the resource".
pub(crate) fn render(s: &mut String, f: &Fencing, plan: &Plan) {
    let _ = writeln!(s, "## What fencing costs at the resource\n");
    let version = match &f.postgres_version {
        Ok(v) => format!("PostgreSQL {v}"),
        Err(_) => "PostgreSQL".to_owned(),
    };
    let _ = writeln!(
        s,
        "The same write with and without the resource's own check of the fencing token \
         (README, \"Make the resource check the token\"), in the same run, the variants \
         taking turns (A B A B ...) so that the machine's drift hits them alike.\n"
    );
    let _ = writeln!(
        s,
        "- **{version}** (testkit's throwaway server, loopback, durability off: `fsync`, \
         `synchronous_commit` and `full_page_writes` off): `BEGIN; UPDATE {TABLE} SET v = v \
         + 1 WHERE id = $1; COMMIT` (the `UPDATE` prepared once per connection), one \
         tokio-postgres connection per client, each client its own row of a table made \
         for the run. Fenced: the same transaction with \
         `fencelock::fence::tokio_postgres::check(&tx, resource, token)` first (the setup \
         installed with `fencelock::fence::tokio_postgres::install`; it sends its \
         statement with its parameters' types, in one round trip).\n\
         - **Redis** (the main server): `SET` one key (16 bytes) and `INCRBY` another. \
         Unfenced: a `MULTI`/`EXEC` pipeline (redis crate, one multiplexed connection, one \
         round trip). Fenced: `Client::fenced_write(resource, token).set(..).incr_by(..)\
         .apply()` (one script call).\n"
    );
    let _ = writeln!(
        s,
        "Each client is one holder writing many times: its token stays the same through a \
         turn and rises by one at the next (a fenced turn's first write records a new \
         token, the others pass with the same one). Latency: one client, one write at a \
         time, {} writes per variant after {} warm-up writes each, in turns of {BLOCK}; \
         placement: {}. Throughput: {CLIENTS} clients at once (PostgreSQL: {CLIENTS} \
         connections; Redis: all on the one multiplexed connection, or the one fencelock \
         `Client`, so their writes are pipelined), {} per variant in windows of {} taking \
         turns (after a short warm-up window of each). Server CPU per write: the CPU time \
         of redis-server's main thread, or of the clients' PostgreSQL backends, from \
         `/proc/PID/schedstat`, over the turns (one client) and over the windows \
         ({CLIENTS} clients) ÷ the writes; it includes the socket reads and writes. \
         Writes/s, 1 client: the latency samples one after another (their count ÷ their \
         summed time). Section time: {:.1} s.\n",
        plan.fencing_ops,
        match (&f.redis, &f.postgres) {
            (Ok(p), _) | (_, Ok(p)) => p.warmup,
            _ => 0,
        },
        placements(f),
        fmt_dur(plan.fencing_run),
        fmt_dur(plan.fencing_window),
        f.elapsed.as_secs_f64(),
    );
    let _ = writeln!(
        s,
        "| resource | write | samples | p50 | p99 | p50 × unfenced | p99 × unfenced | writes/s, 1 client | writes/s, {CLIENTS} clients | × unfenced | server CPU / write, 1 client | × unfenced | server CPU / write, {CLIENTS} clients | × unfenced |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for (store, pair) in [("PostgreSQL", &f.postgres), ("Redis", &f.redis)] {
        let pair = match pair {
            Ok(p) => p,
            Err(e) => {
                let why = if e.starts_with("left out") {
                    e.clone()
                } else {
                    format!("run failed: {e}")
                };
                let _ = writeln!(s, "| {store} | {} |||||||||||||", why.replace('|', "/"));
                continue;
            }
        };
        for v in &pair.variants {
            let l = &v.latency.summary;
            let rel = |figure: &dyn Fn(&Variant) -> Option<f64>| {
                ratio(pair, v.mode, figure).map_or("–".to_owned(), x)
            };
            let cpu = |c: &Result<f64, String>| match c {
                Ok(ns) => fmt_ns(*ns as u64),
                Err(e) => format!("not measured: {}", e.replace('|', "/")),
            };
            let _ = writeln!(
                s,
                "| {store} | {} | {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} |",
                v.mode.label(),
                l.n,
                fmt_ns(l.p50),
                fmt_ns(l.p99),
                rel(&|v| Some(v.latency.summary.p50 as f64)),
                rel(&|v| Some(v.latency.summary.p99 as f64)),
                v.latency.per_second(),
                v.throughput
                    .as_ref()
                    .map_or("–".to_owned(), |t| format!("{:.0}", t.per_second())),
                rel(&|v| v.throughput.as_ref().map(Throughput::per_second)),
                cpu(&v.cpu),
                rel(&|v| v.cpu.as_ref().ok().copied()),
                v.throughput
                    .as_ref()
                    .map_or("–".to_owned(), |t| cpu(&t.cpu)),
                rel(&|v| v
                    .throughput
                    .as_ref()
                    .and_then(|t| t.cpu.as_ref().ok().copied())),
            );
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "Fenced ÷ unfenced, measured in the same turns: above 1 for a time or a CPU cost, \
         below 1 for writes per second; it is what the check costs a write that passes \
         it, on this machine.\n"
    );
    if let Ok(pair) = &f.postgres {
        let _ = writeln!(
            s,
            "- **PostgreSQL**: {}. The check's cost is one extra statement and a row lock \
             per transaction: `fencelock_check` inserts the resource's row of \
             `fencelock_fence` once, locks it `FOR UPDATE` to the end of the transaction, \
             and rewrites it when the token rises (once per turn here). With durability \
             off a commit waits for no disk flush: on a server that flushes at commit the \
             unfenced transaction is slower, and the same added cost is a smaller ratio.",
            summary(pair),
        );
    }
    if let Ok(pair) = &f.redis {
        let _ = writeln!(
            s,
            "- **Redis**: {}. The check's cost is a script call (the fenced write runs as \
             one script, which checks the keys' types before it writes) and a fence read \
             and write: a `GET` of `fencelock:{{RESOURCE}}:accepted` every time, a `SET` of \
             it when the token rises; against a `MULTI`/`EXEC` of the same two writes, \
             one round trip each.",
            summary(pair),
        );
    }
    let _ = writeln!(s);
}

/// `p50 1.52x (+48 µs), p99 1.40x, 8 clients: 0.66x the writes/s, server CPU 1.8x per write`.
fn summary(pair: &Pair) -> String {
    let p50 = |v: &Variant| Some(v.latency.summary.p50 as f64);
    let mut parts = Vec::new();
    if let (Some(r), Some(plain), Some(fenced)) = (
        ratio(pair, Mode::Fenced, p50),
        pair.variant(Mode::Plain),
        pair.variant(Mode::Fenced),
    ) {
        let added = fenced.latency.summary.p50 as i64 - plain.latency.summary.p50 as i64;
        let sign = if added < 0 { "−" } else { "+" };
        parts.push(format!(
            "p50 {} ({sign}{})",
            x(r),
            fmt_ns(added.unsigned_abs())
        ));
    }
    if let Some(r) = ratio(pair, Mode::Fenced, |v| Some(v.latency.summary.p99 as f64)) {
        parts.push(format!("p99 {}", x(r)));
    }
    if let Some(r) = ratio(pair, Mode::Fenced, |v| {
        v.throughput.as_ref().map(Throughput::per_second)
    }) {
        parts.push(format!("{CLIENTS} clients: {} the writes/s", x(r)));
    }
    if let Some(r) = ratio(pair, Mode::Fenced, |v| v.cpu.as_ref().ok().copied()) {
        parts.push(format!("server CPU per write {}", x(r)));
    }
    if parts.is_empty() {
        "not measured".to_owned()
    } else {
        format!("fenced ÷ unfenced: {}", parts.join(", "))
    }
}

/// Where the latency turns ran, per store.
fn placements(f: &Fencing) -> String {
    let mut out = Vec::new();
    for (store, pair) in [("Redis", &f.redis), ("PostgreSQL", &f.postgres)] {
        if let Ok(p) = pair {
            out.push(format!("{store}: {}", p.placement));
        }
    }
    if out.is_empty() {
        "–".to_owned()
    } else {
        out.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_take_turns_in_blocks_and_each_gets_every_write() {
        assert_eq!(
            turns(250, 2, 100),
            vec![(0, 100), (1, 100), (0, 100), (1, 100), (0, 50), (1, 50)]
        );
        let three = turns(1_000, 3, 100);
        for v in 0..3 {
            let n: usize = three.iter().filter(|t| t.0 == v).map(|t| t.1).sum();
            assert_eq!(n, 1_000);
        }
        // Never two turns of one variant in a row.
        assert!(three.windows(2).all(|w| w[0].0 != w[1].0));
        assert!(turns(0, 2, 100).is_empty());
    }

    #[test]
    fn windows_cover_the_run() {
        let ms = Duration::from_millis;
        assert_eq!(windows(ms(1_000), ms(200)), 5);
        assert_eq!(windows(ms(1_100), ms(200)), 6);
        assert_eq!(windows(ms(50), ms(200)), 1);
        assert_eq!(windows(ms(1_000), Duration::ZERO), 1);
    }

    #[test]
    fn ratios_are_fenced_over_unfenced() {
        let variant = |mode, samples: Vec<u64>, writes| Variant {
            mode,
            latency: Series::new(samples).expect("samples"),
            cpu: per_write(3_000, 100),
            throughput: Some(Throughput {
                writes,
                time: Duration::from_secs(2),
                cpu: Err("no".to_owned()),
            }),
        };
        let pair = Pair {
            variants: vec![
                variant(Mode::Plain, vec![100_000; 10], 2_000),
                variant(Mode::Fenced, vec![150_000; 10], 1_000),
            ],
            warmup: 100,
            placement: String::new(),
        };
        let r = ratio(&pair, Mode::Fenced, |v| Some(v.latency.summary.p50 as f64))
            .expect("both measured");
        assert!((r - 1.5).abs() < 0.01, "{r}");
        let t = ratio(&pair, Mode::Fenced, |v| {
            v.throughput.as_ref().map(Throughput::per_second)
        })
        .expect("both measured");
        assert!((t - 0.5).abs() < 1e-9, "{t}");
        assert!(per_write(5, 0).is_err());
        let text = summary(&pair);
        assert!(text.contains("p50 1.50x (+50.0 µs)"), "{text}");
        assert!(text.contains("0.50x the writes/s"), "{text}");
    }
}
