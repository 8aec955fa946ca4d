//! Uncontended acquire + release latency: one client, one lock name, a sequential loop,
//! on a single node and on Redlock over 5 independent nodes.
//!
//! The two clients and two PING loops (to the single node; to every Redlock node at
//! once) take turns in blocks of [`BLOCK`] cycles, so drift of a noisy machine hits them
//! alike.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::held::{command_stat, query};
use crate::{Summary, fmt_ns, summarize, yes_no};

/// Cycles per turn of each client (and PINGs per turn of the PING loop).
const BLOCK: usize = 100;
/// The fixed lease of every acquire (never reached: each is released at once).
const TTL: Duration = Duration::from_secs(10);
/// The lock name.
const NAME: &str = "bench-latency";
/// Targets from the issue.
const TARGET_REDLOCK_RATIO: f64 = 1.5;
const TARGET_PING_RATIO: f64 = 1.25;

/// The measured latencies of one run.
pub struct LatencyRun {
    /// Measured cycles per client (after warm-up).
    pub cycles: usize,
    /// Warm-up cycles per client.
    pub warmup: usize,
    /// Nodes of the Redlock client.
    pub nodes: usize,
    pub single: Summary,
    pub redlock: Summary,
    /// PINGs to the single node, interleaved with the cycles.
    pub ping: Summary,
    /// PINGs sent to every Redlock node at once, until all answered, interleaved with
    /// the cycles: the floor of one Redlock round on this machine.
    pub fan_out: Summary,
    /// Where the threads ran (the pinning), for the report.
    pub placement: String,
    /// Server time over the measured cycles, from `INFO commandstats` (µs): scripts on
    /// the single node; scripts on all Redlock nodes together, and the `INFO` calls
    /// inside them.
    pub single_script_us: Option<u64>,
    pub redlock_script_us: Option<u64>,
    pub redlock_info_us: Option<u64>,
}

/// Connects both clients, calls `pin` (which pins threads to CPUs until what it returns
/// is dropped, and describes the placement), warms up, and measures `cycles` acquire +
/// release cycles on each client, in alternating blocks.
pub async fn run<P>(
    single_url: &str,
    redlock_urls: &[String],
    cycles: usize,
    pin: impl FnOnce() -> (P, String),
) -> Result<LatencyRun, String> {
    let single = fencelock::Client::connect(single_url)
        .await
        .map_err(|e| format!("single-node connect: {e}"))?;
    let redlock = fencelock::Client::redlock(redlock_urls.iter().cloned())
        .restart_protection(None)
        .connect()
        .await
        .map_err(|e| format!("Redlock connect: {e}"))?;
    let mut ping_conn = redis::Client::open(single_url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let mut node_conns = Vec::with_capacity(redlock_urls.len());
    for url in redlock_urls {
        node_conns.push(
            redis::Client::open(url.as_str())
                .map_err(|e| e.to_string())?
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let single_lock = single.lock(NAME).ttl(TTL);
    let redlock_lock = redlock.lock(NAME).ttl(TTL);
    let (pins, placement) = pin();

    let warmup = (cycles / 10).max(BLOCK);
    for _ in 0..warmup {
        cycle(&single_lock)
            .await
            .map_err(|e| format!("single node: {e}"))?;
        cycle(&redlock_lock)
            .await
            .map_err(|e| format!("Redlock: {e}"))?;
        ping(&mut ping_conn).await?;
        ping_all(&node_conns).await?;
    }
    // Count server time from here (the main server's PINGs count too, but not as scripts).
    query::<String>(&mut ping_conn, &["CONFIG", "RESETSTAT"]).await?;
    for conn in &mut node_conns {
        query::<String>(conn, &["CONFIG", "RESETSTAT"]).await?;
    }
    let (mut s, mut r, mut p, mut f) = (
        Vec::with_capacity(cycles),
        Vec::with_capacity(cycles),
        Vec::with_capacity(cycles),
        Vec::with_capacity(cycles),
    );
    while s.len() < cycles {
        let k = BLOCK.min(cycles - s.len());
        for _ in 0..k {
            s.push(
                cycle(&single_lock)
                    .await
                    .map_err(|e| format!("single node: {e}"))?,
            );
        }
        for _ in 0..k {
            r.push(
                cycle(&redlock_lock)
                    .await
                    .map_err(|e| format!("Redlock: {e}"))?,
            );
        }
        for _ in 0..k {
            p.push(ping(&mut ping_conn).await?);
        }
        for _ in 0..k {
            f.push(ping_all(&node_conns).await?);
        }
    }
    drop(pins);
    let single_stats: String = query(&mut ping_conn, &["INFO", "commandstats"]).await?;
    let mut node_stats = Vec::new();
    for conn in &mut node_conns {
        node_stats.push(query::<String>(conn, &["INFO", "commandstats"]).await?);
    }
    let sum = |cmd: &str| -> Option<u64> {
        node_stats
            .iter()
            .map(|info| command_stat(info, cmd, "usec"))
            .sum()
    };
    single.flush().await;
    redlock.flush().await;
    let none = || "no samples".to_owned();
    Ok(LatencyRun {
        cycles,
        warmup,
        nodes: redlock_urls.len(),
        single: summarize(&s).ok_or_else(none)?,
        redlock: summarize(&r).ok_or_else(none)?,
        ping: summarize(&p).ok_or_else(none)?,
        fan_out: summarize(&f).ok_or_else(none)?,
        placement,
        single_script_us: command_stat(&single_stats, "evalsha", "usec"),
        redlock_script_us: sum("evalsha"),
        redlock_info_us: sum("info"),
    })
}

/// One cycle: `try_acquire` then `release`; its duration in ns.
async fn cycle(lock: &fencelock::LockBuilder) -> Result<u64, String> {
    let t = Instant::now();
    let guard = lock
        .try_acquire()
        .await
        .map_err(|e| format!("acquire: {e}"))?;
    guard.release().await.map_err(|e| format!("release: {e}"))?;
    Ok(t.elapsed().as_nanos() as u64)
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

/// PINGs every connection at once and waits for every answer (as Redlock's `join_all`
/// does); the time in ns.
async fn ping_all(conns: &[MultiplexedConnection]) -> Result<u64, String> {
    type Pinging = Pin<Box<dyn Future<Output = Result<u64, String>>>>;
    let t = Instant::now();
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
    .await?;
    Ok(t.elapsed().as_nanos() as u64)
}

/// Appends the section to the report. `baseline` is the harness's PING baseline.
pub fn render(s: &mut String, run: &Result<LatencyRun, String>, baseline: &Summary) {
    let _ = writeln!(
        s,
        "## Redlock vs single node: uncontended acquire + release\n"
    );
    let run = match run {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(s, "Run failed: {e}\n");
            return;
        }
    };
    let _ = writeln!(
        s,
        "One client, one lock name, no contention: each cycle is `lock(name).ttl({TTL:?})\
         .try_acquire()` then `guard.release()`, awaited in turn (a fixed lease, so no \
         watchdog), timed from before the acquire to the end of the release. Single node: \
         `Client::connect(url)` to the main redis-server. Redlock: \
         `Client::redlock(urls).restart_protection(None)` over {n} independent redis-server \
         processes on this machine (a majority of {} must grant; each acquire and each \
         release goes to all {n} at once and waits for every answer). {} measured cycles \
         per client after {} warm-up cycles each. The two clients and two PING loops (one \
         PING to the main server; one PING to each of the {n} Redlock nodes at once, until \
         all answered: the floor of one Redlock round here) take turns in blocks of \
         {BLOCK}, so the machine's drift hits them alike. Placement: {}.\n",
        run.nodes / 2 + 1,
        run.cycles,
        run.warmup,
        run.placement,
        n = run.nodes,
    );
    let _ = writeln!(
        s,
        "Why pinned: on a 2-CPU VM a loopback round trip costs about 10 µs when client and \
         server share a CPU and about 70 µs when the server must be woken on the other one \
         (`redis-benchmark -c 1` pinned with taskset), and unpinned the scheduler picks \
         either, differently for one server and for five, from run to run (unpinned runs \
         gave Redlock / single p50 ratios from 1.7x to 14x). Client and servers on separate \
         CPUs makes every request a cross-CPU wake-up, as it would be a network hop; the \
         Redlock nodes still share the CPUs left, so their five scripts run one after \
         another rather than in parallel as on five hosts. RTT units: the interleaved PING \
         p50 ({}), the unit of the targets, and the harness's baseline PING p50 ({}), \
         taken unpinned at the start.\n",
        fmt_ns(run.ping.p50),
        fmt_ns(baseline.p50),
    );
    let unit = |ns: u64, of: &Summary| format!("{:.1}", ns as f64 / of.p50 as f64);
    let _ = writeln!(
        s,
        "| measured | samples | p50 | p99 | max | p50 (interleaved PINGs) | p99 (interleaved PINGs) | p50 (baseline PINGs) |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for (label, sum) in [
        ("acquire + release, single node".to_owned(), &run.single),
        (
            format!("acquire + release, Redlock over {} nodes", run.nodes),
            &run.redlock,
        ),
        ("PING, main server".to_owned(), &run.ping),
        (
            format!("PING to all {} Redlock nodes at once", run.nodes),
            &run.fan_out,
        ),
    ] {
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} | {} | {} | {} |",
            sum.n,
            fmt_ns(sum.p50),
            fmt_ns(sum.p99),
            fmt_ns(sum.max),
            unit(sum.p50, &run.ping),
            unit(sum.p99, &run.ping),
            unit(sum.p50, baseline),
        );
    }
    let _ = writeln!(s);

    let per_cycle = |us: Option<u64>| match us {
        Some(us) => format!("{:.1} µs", us as f64 / run.cycles as f64),
        None => "–".to_owned(),
    };
    let _ = writeln!(
        s,
        "Where Redis spends the time, per measured cycle (acquire + release), from the \
         `usec` of `INFO commandstats` over the measured cycles: scripts (`evalsha`) on the \
         single node {}; scripts on the {n} Redlock nodes together {}, of which the `INFO \
         server` call inside the Redlock acquire script (it reads `run_id` and uptime for \
         restart protection, and runs even with restart protection off) {}. Where the \
         Redlock nodes share a CPU (as on 2 CPUs), their server times add up in the latency \
         rather than overlapping.\n",
        per_cycle(run.single_script_us),
        per_cycle(run.redlock_script_us),
        per_cycle(run.redlock_info_us),
        n = run.nodes,
    );

    let r50 = run.redlock.p50 as f64 / run.single.p50 as f64;
    let r99 = run.redlock.p99 as f64 / run.single.p99 as f64;
    let vs_ping = run.single.p50 as f64 / (2.0 * run.ping.p50 as f64);
    let vs_baseline = run.single.p50 as f64 / (2.0 * baseline.p50 as f64);
    let floor = run.redlock.p50 as f64 / (2.0 * run.fan_out.p50 as f64);
    let _ = writeln!(
        s,
        "| target | figure | met |\n|---|---|---|\n\
         | Redlock ({n} nodes) p50 within {TARGET_REDLOCK_RATIO}x of single node | \
         Redlock / single: p50 {r50:.2}x ({} / {}), p99 {r99:.2}x ({} / {}). \
         For scale: two {n}-node PING rounds take 2 × {} here; Redlock's p50 is \
         {floor:.2}x that | {} |\n\
         | single-node p50 within {TARGET_PING_RATIO}x of 2 × PING p50 | \
         {} / (2 × {}) = {vs_ping:.2}x against the interleaved PING; against the \
         baseline PING ({}): {vs_baseline:.2}x | {} |\n",
        fmt_ns(run.redlock.p50),
        fmt_ns(run.single.p50),
        fmt_ns(run.redlock.p99),
        fmt_ns(run.single.p99),
        fmt_ns(run.fan_out.p50),
        yes_no(r50 <= TARGET_REDLOCK_RATIO),
        fmt_ns(run.single.p50),
        fmt_ns(run.ping.p50),
        fmt_ns(baseline.p50),
        yes_no(vs_ping <= TARGET_PING_RATIO),
        n = run.nodes,
    );
}
