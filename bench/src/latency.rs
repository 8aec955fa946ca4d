//! Uncontended acquire + release latency: one client, one lock name, a sequential loop,
//! for fencelock and each Rust peer, on a single node and on Redlock over 5 independent
//! nodes; for the Python peers, in the Python driver; and for node-redlock, in the Node
//! driver, on a single node and on Redlock.
//!
//! The Rust clients and two PING loops (to the single node; to every Redlock node at
//! once) take turns in blocks of [`BLOCK`] cycles, so drift of a noisy machine hits them
//! alike. The Python and Node drivers do the same with their lock and their client's
//! PINGs.
//!
//! Also the percentiles every latency figure is reported with ([`Summary`]), and the PING
//! baseline of a run ([`ping_baseline`]).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;

use crate::affinity;
use crate::peers::Peer;
use crate::spawn::Workers;
use crate::worker::{redlock_manager, rslock_manager};

/// Cycles per turn of each client (and PINGs per turn of the PING loops).
pub const BLOCK: usize = 100;
/// The fixed lease of every acquire (never reached: each is released at once).
pub const TTL: Duration = Duration::from_secs(10);
/// The lock name (a suffix per client).
const NAME: &str = "bench-latency";

/// Latency percentiles of one set of samples (ns).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Summary {
    pub(crate) n: u64,
    pub(crate) p50: u64,
    pub(crate) p99: u64,
    pub(crate) max: u64,
}

/// The percentiles of `samples` (ns); `None` without samples.
pub(crate) fn summarize(samples: &[u64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).ok()?;
    for &s in samples {
        h.saturating_record(s.max(1));
    }
    Some(Summary {
        n: h.len(),
        p50: h.value_at_quantile(0.50),
        p99: h.value_at_quantile(0.99),
        max: h.max(),
    })
}

/// One measured series: its samples (ns, sorted) and their summary.
pub struct Series {
    pub samples: Vec<u64>,
    pub summary: Summary,
}

impl Series {
    /// Sorts `samples` and summarizes them; an error without samples.
    pub(crate) fn new(mut samples: Vec<u64>) -> Result<Series, String> {
        samples.sort_unstable();
        let summary = summarize(&samples).ok_or_else(|| "no samples".to_owned())?;
        Ok(Series { samples, summary })
    }

    /// Cycles per second, one after another: samples / their summed time.
    pub fn per_second(&self) -> f64 {
        let total: u64 = self.samples.iter().sum();
        if total == 0 {
            0.0
        } else {
            self.samples.len() as f64 * 1e9 / total as f64
        }
    }
}

/// The measured latencies of one run.
pub struct LatencyRun {
    /// Measured cycles per client (after warm-up).
    pub cycles: usize,
    /// Warm-up cycles per client.
    pub warmup: usize,
    /// Nodes of the Redlock clients.
    pub nodes: usize,
    /// Single node: fencelock, rslock, redlock.
    pub single: Vec<(Peer, Series)>,
    /// Redlock over [`LatencyRun::nodes`] nodes: fencelock, rslock, redlock.
    pub redlock: Vec<(Peer, Series)>,
    /// PINGs to the single node, interleaved with the cycles.
    pub ping: Series,
    /// PINGs sent to every Redlock node at once, until all answered, interleaved with
    /// the cycles: the floor of one Redlock round on this machine.
    pub fan_out: Series,
    /// redis-rs alone on the single node: `SET NX PX`, then an owner-checked release
    /// script ([`Cycler::Raw`]), interleaved with the cycles.
    pub raw: Series,
    /// fencelock's Redlock over the same nodes with the first one behind a blackholed
    /// proxy (requests vanish, no reply comes), interleaved with the cycles.
    pub blackholed: Series,
    /// Where the threads ran (the pinning), for the report.
    pub placement: String,
    /// redis-server's CPU time per cycle (ns) of each single-node client run alone for
    /// [`LatencyRun::cycles`] cycles right after the turns: label, ns per cycle (or why
    /// it could not be read).
    pub server_cpu: Vec<(String, Result<f64, String>)>,
}

/// One client of the rotation.
pub(crate) enum Cycler {
    Fence(fencelock::LockBuilder),
    /// A permit of fencelock's semaphore.
    Semaphore(fencelock::SemaphoreBuilder),
    /// The read side of fencelock's read-write lock.
    Read(fencelock::ReadLockBuilder),
    Rslock(rslock::LockManager, String),
    Redlock(redlock::RedLock, String),
    Ping(MultiplexedConnection),
    FanOut(Vec<MultiplexedConnection>),
    /// The floor of a library on redis-rs: `SET key token NX PX ttl`, then a one-line
    /// owner-checked `DEL` script, on one multiplexed connection (no fencing token).
    Raw(MultiplexedConnection, redis::Script, String),
}

/// The raw pair's release: delete the key only if it holds the token.
pub(crate) const RAW_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The floor of a library on redis-rs, once: `SET key token NX PX ttl`, then `release`
/// ([`RAW_RELEASE`]) on `conn`.
pub(crate) async fn raw_cycle(
    conn: &mut MultiplexedConnection,
    release: &redis::Script,
    key: &str,
) -> Result<(), String> {
    let token = "0123456789abcdef0123456789abcdef";
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(TTL.as_millis() as u64)
        .query_async(conn)
        .await
        .map_err(|e| format!("SET NX: {e}"))?;
    set.ok_or("SET NX: not set, uncontended")?;
    let deleted: i64 = release
        .key(key)
        .arg(token)
        .invoke_async(conn)
        .await
        .map_err(|e| format!("release: {e}"))?;
    if deleted == 1 {
        Ok(())
    } else {
        Err("release: the key was not ours".into())
    }
}

impl Cycler {
    /// One acquire + release (or PING round); its duration in ns.
    pub(crate) async fn once(&mut self) -> Result<u64, String> {
        let t = Instant::now();
        match self {
            Cycler::Fence(lock) => {
                let guard = lock
                    .try_acquire()
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                guard.release().await.map_err(|e| format!("release: {e}"))?;
            }
            Cycler::Semaphore(permit) => {
                let guard = permit
                    .try_acquire()
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                guard.release().await.map_err(|e| format!("release: {e}"))?;
            }
            Cycler::Read(read) => {
                let guard = read
                    .try_acquire()
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                guard.release().await.map_err(|e| format!("release: {e}"))?;
            }
            Cycler::Rslock(manager, key) => {
                let lock = manager
                    .lock(key.as_bytes(), TTL)
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                lock.release().await;
            }
            // Synchronous: blocks this (the only) thread, as it would its caller's.
            Cycler::Redlock(manager, key) => {
                let lock = manager
                    .lock(key.as_bytes(), TTL.as_millis() as usize)
                    .map_err(|e| format!("acquire: {e}"))?
                    .ok_or("acquire: not granted, uncontended")?;
                manager.unlock(&lock);
            }
            Cycler::Ping(conn) => {
                ping(conn).await?;
            }
            Cycler::FanOut(conns) => ping_all(conns).await?,
            Cycler::Raw(conn, release, key) => raw_cycle(conn, release, key).await?,
        }
        Ok(t.elapsed().as_nanos() as u64)
    }
}

/// Connects every client, calls `pin` (which pins threads to CPUs until what it returns
/// is dropped, and describes the placement), warms up, and measures `cycles` acquire +
/// release cycles on each client, in turns of [`BLOCK`].
pub async fn run<P>(
    single_url: &str,
    single_pid: u32,
    redlock_urls: &[String],
    cycles: usize,
    pin: impl FnOnce() -> (P, String),
) -> Result<LatencyRun, String> {
    let single_urls = [single_url.to_owned()];
    let fence_single = fencelock::Client::connect(single_url)
        .await
        .map_err(|e| format!("single-node connect: {e}"))?;
    let fence_redlock = fencelock::Client::redlock(redlock_urls.iter().cloned())
        .restart_protection(None)
        .connect()
        .await
        .map_err(|e| format!("Redlock connect: {e}"))?;
    let node_conns = {
        let mut v = Vec::with_capacity(redlock_urls.len());
        for url in redlock_urls {
            v.push(connect(url).await?);
        }
        v
    };
    // One node blackholed: connected through a proxy that then swallows everything.
    let proxy = testkit::FaultProxy::start(redlock_urls[0].trim_start_matches("redis://"));
    let blackholed_urls = std::iter::once(proxy.url()).chain(redlock_urls[1..].iter().cloned());
    let fence_blackholed = fencelock::Client::redlock(blackholed_urls)
        .restart_protection(None)
        .connect()
        .await
        .map_err(|e| format!("Redlock connect through the proxy: {e}"))?;
    proxy.set(testkit::Fault::Blackhole);
    let key = |p: Peer| format!("{NAME}:{}", p.slug());
    // Who each client of the rotation is, for sorting the samples out.
    #[derive(Debug, Clone, Copy)]
    enum Who {
        Lock(Peer, bool),
        Ping,
        FanOut,
        Blackholed,
        Raw,
    }
    let mut clients: Vec<(Who, Cycler)> = vec![
        (
            Who::Lock(Peer::Fencelock, false),
            Cycler::Fence(fence_single.lock(NAME).lease(TTL).renew(false)),
        ),
        (
            Who::Lock(Peer::Fencelock, true),
            Cycler::Fence(fence_redlock.lock(NAME).lease(TTL).renew(false)),
        ),
        (
            Who::Lock(Peer::Rslock, false),
            Cycler::Rslock(rslock_manager(&single_urls, false), key(Peer::Rslock)),
        ),
        (
            Who::Lock(Peer::Rslock, true),
            Cycler::Rslock(rslock_manager(redlock_urls, false), key(Peer::Rslock)),
        ),
        (
            Who::Lock(Peer::Redlock, false),
            Cycler::Redlock(redlock_manager(&single_urls, false)?, key(Peer::Redlock)),
        ),
        (
            Who::Lock(Peer::Redlock, true),
            Cycler::Redlock(redlock_manager(redlock_urls, false)?, key(Peer::Redlock)),
        ),
        (Who::Ping, Cycler::Ping(connect(single_url).await?)),
        (
            Who::Raw,
            Cycler::Raw(
                connect(single_url).await?,
                redis::Script::new(RAW_RELEASE),
                format!("{NAME}:raw"),
            ),
        ),
        (Who::FanOut, Cycler::FanOut(node_conns)),
        (
            Who::Blackholed,
            Cycler::Fence(
                fence_blackholed
                    .lock(format!("{NAME}:blackholed"))
                    .lease(TTL)
                    .renew(false),
            ),
        ),
    ];
    let (pins, placement) = pin();
    let (warmup, samples) = in_turns(&mut clients, cycles).await?;
    let mut server_cpu = Vec::new();
    for (who, c) in &mut clients {
        let label = match who {
            Who::Lock(peer, false) => peer.label().to_owned(),
            Who::Raw => "redis-rs alone".to_owned(),
            Who::Ping => "PING".to_owned(),
            _ => continue,
        };
        server_cpu.push((label, server_cpu_per_cycle(single_pid, c, cycles).await));
    }
    drop(pins);
    fence_single.flush().await;
    fence_redlock.flush().await;
    fence_blackholed.flush().await;
    drop(proxy);
    let mut single = Vec::new();
    let mut redlock = Vec::new();
    let (mut ping, mut fan_out, mut blackholed, mut raw) = (None, None, None, None);
    for ((who, _), s) in clients.into_iter().zip(samples) {
        let series = Series::new(s)?;
        match who {
            Who::Lock(peer, false) => single.push((peer, series)),
            Who::Lock(peer, true) => redlock.push((peer, series)),
            Who::Ping => ping = Some(series),
            Who::FanOut => fan_out = Some(series),
            Who::Blackholed => blackholed = Some(series),
            Who::Raw => raw = Some(series),
        }
    }
    let (ping, fan_out) = (ping.ok_or("no PINGs")?, fan_out.ok_or("no fan-out PINGs")?);
    let blackholed = blackholed.ok_or("no blackholed Redlock cycles")?;
    let raw = raw.ok_or("no raw redis-rs cycles")?;
    Ok(LatencyRun {
        cycles,
        warmup,
        nodes: redlock_urls.len(),
        single,
        redlock,
        ping,
        fan_out,
        blackholed,
        raw,
        placement,
        server_cpu,
    })
}

/// The CPU time the thread `pid` (a redis-server's main thread, which runs every
/// command) has used, ns, from `/proc/PID/schedstat`: the scheduler's own count, to the
/// nanosecond (`getrusage` and `INFO cpu` may count in ticks of several ms).
pub(crate) fn thread_cpu_ns(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/schedstat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    text.split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| format!("{path}: unexpected {text:?}"))
}

/// redis-server `pid`'s CPU time per cycle of `client` (ns), over `cycles` cycles of it
/// alone: what one acquire + release costs the server (its commands, scripts and the
/// socket reads and writes), without the other clients' work mixed in.
async fn server_cpu_per_cycle(pid: u32, client: &mut Cycler, cycles: usize) -> Result<f64, String> {
    let before = thread_cpu_ns(pid)?;
    for _ in 0..cycles {
        client.once().await?;
    }
    let used = thread_cpu_ns(pid)?.saturating_sub(before);
    Ok(used as f64 / cycles.max(1) as f64)
}

/// Warms every client up (a tenth of `cycles`, at least [`BLOCK`], taking turns cycle by
/// cycle), then measures `cycles` cycles of each, taking turns in blocks of [`BLOCK`] so
/// that the machine's drift hits them alike. Returns the warm-up cycles and each client's
/// samples (ns, in `clients`' order); the first error, labelled with its client, ends it.
pub(crate) async fn in_turns<W: std::fmt::Debug>(
    clients: &mut [(W, Cycler)],
    cycles: usize,
) -> Result<(usize, Vec<Vec<u64>>), String> {
    let warmup = (cycles / 10).max(BLOCK);
    for _ in 0..warmup {
        for (who, c) in clients.iter_mut() {
            c.once().await.map_err(|e| format!("{who:?}: {e}"))?;
        }
    }
    let mut samples: Vec<Vec<u64>> = clients.iter().map(|_| Vec::with_capacity(cycles)).collect();
    let mut done = 0;
    while done < cycles {
        let k = BLOCK.min(cycles - done);
        for ((who, c), s) in clients.iter_mut().zip(&mut samples) {
            for _ in 0..k {
                s.push(c.once().await.map_err(|e| format!("{who:?}: {e}"))?);
            }
        }
        done += k;
    }
    Ok((warmup, samples))
}

/// What the Python or Node driver measured for one peer.
pub struct DriverRun {
    /// Acquire + release cycles.
    pub cycles: Series,
    /// The driver's PINGs (redis-py's, ioredis'), interleaved with the cycles: to every
    /// node at once on Redlock.
    pub pings: Series,
}

/// node-redlock's uncontended runs in the Node driver.
pub struct NodeLatency {
    /// On the single node.
    pub single: Result<DriverRun, String>,
    /// On the Redlock nodes.
    pub redlock: Result<DriverRun, String>,
    /// Where the driver and the servers ran, for the report.
    pub placement: Option<String>,
}

/// A driver's uncontended run of one peer: its cycles and its PINGs (interleaved in turns
/// of [`BLOCK`]), with the driver pinned by `pin`. `program` runs `driver` (the Python or
/// Node driver); with more than one of `urls`, the lock is a Redlock over all of them.
pub async fn in_driver(
    program: &Path,
    driver: &Path,
    urls: &[String],
    peer: Peer,
    cycles: usize,
    pin: impl FnOnce(u32) -> (affinity::Pins, String),
) -> Result<(DriverRun, String), String> {
    let mut args = Vec::new();
    for url in urls {
        args.extend(["--url".to_owned(), url.clone()]);
    }
    args.extend([
        "--scenario".to_owned(),
        "latency".to_owned(),
        "--name".to_owned(),
        format!("{NAME}:{}", peer.slug()),
        "--cycles".to_owned(),
        cycles.to_string(),
        "--ttl-ms".to_owned(),
        TTL.as_millis().to_string(),
    ]);
    args.extend(peer.lock_args());
    let prefix = [driver.display().to_string()];
    let workers = Workers::start(program, &prefix, &[args]).await?;
    let pid = workers.pids().first().copied().ok_or("no driver process")?;
    let (pins, placement) = pin(pid);
    // Warm-up happens before `go`; the run itself is bounded by its cycles, not a time.
    let reports = workers.run(Duration::from_secs(600)).await;
    drop(pins);
    let mut report = reports?.pop().ok_or("no report")?;
    if let Some(e) = report.errors.first() {
        return Err(e.clone());
    }
    let pings = std::mem::take(&mut report.pings);
    let run = DriverRun {
        cycles: Series::new(report.samples)?,
        pings: Series::new(pings)?,
    };
    Ok((run, placement))
}

/// The PING baseline: `n` PINGs one after another on one connection, after a tenth as
/// many as warm-up.
pub(crate) async fn ping_baseline(url: &str, n: usize) -> Result<Summary, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        let pong: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let dt = t.elapsed();
        if pong != "PONG" {
            return Err(format!("PING answered {pong:?}"));
        }
        if i >= n / 10 {
            samples.push(dt.as_nanos() as u64); // the first tenth is warm-up
        }
    }
    summarize(&samples).ok_or_else(|| "no samples".to_owned())
}

/// A redis-rs multiplexed connection to `url` (a plain node, not a cluster).
pub(crate) async fn connect(url: &str) -> Result<MultiplexedConnection, String> {
    redis::Client::open(url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())
}

async fn ping(conn: &mut MultiplexedConnection) -> Result<u64, String> {
    let t = Instant::now();
    let pong: String = redis::cmd("PING")
        .query_async(conn)
        .await
        .map_err(|e| format!("PING: {e}"))?;
    let dt = t.elapsed().as_nanos() as u64;
    if pong != "PONG" {
        return Err(format!("PING answered {pong:?}"));
    }
    Ok(dt)
}

/// PINGs every connection at once and waits for every answer (as a Redlock round
/// does).
async fn ping_all(conns: &[MultiplexedConnection]) -> Result<(), String> {
    type Pinging = Pin<Box<dyn Future<Output = Result<u64, String>>>>;
    let mut pending: Vec<Option<Pinging>> = conns
        .iter()
        .map(|c| {
            let mut c = c.clone();
            Some(Box::pin(async move { ping(&mut c).await }) as Pinging)
        })
        .collect();
    std::future::poll_fn(|cx| {
        for slot in &mut pending {
            if let Some(fut) = slot
                && let Poll::Ready(r) = fut.as_mut().poll(cx)
            {
                r?;
                *slot = None;
            }
        }
        if pending.iter().all(Option::is_none) {
            Poll::Ready(Ok::<(), String>(()))
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_count_their_samples() {
        let s = summarize(&[100, 200, 300]).expect("samples");
        assert_eq!((s.n, s.max), (3, 300));
        assert!(summarize(&[]).is_none());
    }
}
