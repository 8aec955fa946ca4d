//! The markdown report of a run, and how its figures are written (durations, yes/no).

use std::fmt::Write as _;
use std::time::Duration;

use crate::chart::Charts;
use crate::growth;
use crate::held;
use crate::latency::{BLOCK, LatencyRun, NodeLatency, Series, Summary, TTL};
use crate::launcher::{MAX_PROCS, START_SPREAD_MS};
use crate::peers::Peer;
use crate::plan::{
    HANDOFF_HOLD, HOT_KEY_BEFORE, HOT_KEY_BEFORE_COMMANDS, HOT_KEY_CONTENDERS, REDLOCK_NODES,
    TARGET_BLACKHOLED_RATIO, TARGET_FAIRNESS, TARGET_HANDOFF_GROWTH, TARGET_HANDOFF_PINGS,
    TARGET_RAW_RATIO, WAITERS,
};
use crate::results::{HandoffRow, HotKeyRow, Results};
use crate::{fencing, semaphores, topologies};

/// `12.3 µs`, `123 µs`, `4.56 ms`, `1.23 s`.
pub(crate) fn fmt_ns(ns: u64) -> String {
    let ns = ns as f64;
    if ns < 1e5 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e6 {
        format!("{:.0} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

pub(crate) fn yes_no(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

pub(crate) fn fmt_dur(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// `3.2x`, `0.45x`, `1234x`.
pub(crate) fn x(ratio: f64) -> String {
    if !ratio.is_finite() {
        "–".to_owned()
    } else if ratio >= 100.0 {
        format!("{ratio:.0}x")
    } else if ratio >= 10.0 {
        format!("{ratio:.1}x")
    } else {
        format!("{ratio:.2}x")
    }
}

fn rate(per_s: Option<f64>) -> String {
    per_s.map_or("–".to_owned(), |c| format!("{c:.0}"))
}

fn spread_cell(tasks: &[usize]) -> String {
    let (min, max) = (
        tasks.iter().min().copied().unwrap_or(0),
        tasks.iter().max().copied().unwrap_or(0),
    );
    if min == max {
        format!("{} × {min}", tasks.len())
    } else {
        format!("{} × {min}–{max}", tasks.len())
    }
}

pub(crate) fn errors_cell(errors: &[String], fatal: Option<&str>) -> String {
    match (fatal, errors.first()) {
        (Some(f), _) => format!("run failed: {}", f.replace('|', "/")),
        (None, None) => "0".to_owned(),
        (None, Some(first)) => format!("{} (first: {})", errors.len(), first.replace('|', "/")),
    }
}

/// The uncontended single-node series of `peer` (tuned variants share their default's:
/// the retry settings only matter under contention).
fn uncontended(r: &Results, peer: Peer) -> Option<&Series> {
    let base = match peer {
        Peer::FencelockFair
        | Peer::RslockTuned
        | Peer::RedlockTuned
        | Peer::RedisPyTuned
        | Peer::NodeRedlockTuned => {
            return None;
        }
        Peer::NodeRedlock => return node_redlock_cycles(r).map(|(one, _)| one),
        p => p,
    };
    if let Ok(lat) = &r.latency
        && let Some((_, s)) = lat.single.iter().find(|(p, _)| *p == base)
    {
        return Some(s);
    }
    r.python_latency
        .iter()
        .find(|(p, _)| *p == base)
        .and_then(|(_, s)| s.as_ref().ok())
        .map(|run| &run.cycles)
}

/// node-redlock's uncontended cycles in the Node driver: single node, and on the Redlock
/// nodes when that run succeeded.
fn node_redlock_cycles(r: &Results) -> Option<(&Series, Option<&Series>)> {
    let node = r.node_latency.as_ref()?;
    let one = &node.single.as_ref().ok()?.cycles;
    Some((one, node.redlock.as_ref().ok().map(|run| &run.cycles)))
}

fn handoff_row(r: &Results, peer: Peer, waiters: usize) -> Option<&HandoffRow> {
    r.handoff
        .iter()
        .find(|h| h.peer == peer && h.waiters == waiters)
}

pub(crate) fn handoff_p50(r: &Results, peer: Peer, waiters: usize) -> Option<u64> {
    handoff_row(r, peer, waiters).and_then(|h| h.summary.map(|s| s.p50))
}

fn hot_key_row(r: &Results, peer: Peer) -> Option<&HotKeyRow> {
    r.hot_key
        .iter()
        .find(|h| h.peer == peer && h.error.is_none())
}

/// The PING p50 that ratios are taken against: the one interleaved with the latency
/// cycles when there is one, else the baseline's.
fn ping_unit(r: &Results) -> u64 {
    match &r.latency {
        Ok(lat) => lat.ping.summary.p50,
        Err(_) => r.ping.p50,
    }
}

fn peers_of(r: &Results) -> Vec<Peer> {
    crate::peers::peers(r.python.is_ok(), r.node.is_ok())
}

pub fn render(r: &Results, charts: &Charts) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# fencelock-bench ({} run)\n", r.plan.name);
    machine(&mut s, r);
    settings(&mut s, r);
    side_by_side(&mut s, r);
    targets(&mut s, r);
    baseline(&mut s, r);
    uncontended_section(&mut s, r, charts);
    redlock_section(&mut s, r);
    handoff_section(&mut s, r, charts);
    hot_key_section(&mut s, r, charts);
    let unit_what = if r.latency.is_ok() {
        "the PINGs interleaved with the latency cycles, as above"
    } else {
        "the baseline PINGs"
    };
    semaphores::render(&mut s, &r.semaphores, r.plan, ping_unit(r), unit_what);
    crate::many::render(&mut s, &r.many, r.plan);
    crate::multi::render(&mut s, &r.multi, r.plan);
    crate::election::render(&mut s, &r.election, r.plan);
    crate::network::render(&mut s, &r.network, r.plan);
    fencing::render(&mut s, &r.fencing, r.plan);
    held::render(&mut s, &r.held, r.plan.held_locks, r.plan.held_window);
    let _ = writeln!(
        s,
        "The peers are not in this row: none of them renews many leases together. rslock's \
         `using` renews each lock with its own timer and one script call per lock; \
         python-redis-lock's `auto_renewal` starts one thread per lock; node-redlock's \
         `using` extends each lock with its own timer and one script call per lock; \
         redis-py's `Lock` and the redlock crate renew only when the caller calls \
         `extend`.\n"
    );
    growth::render(&mut s, r, charts);
    topologies::render(&mut s, &r.topologies, r.plan);
    s
}

fn machine(s: &mut String, r: &Results) {
    let _ = writeln!(s, "## Machine\n");
    let _ = writeln!(s, "- nproc: {}", r.nproc);
    let _ = writeln!(s, "- CPU: {}", r.cpu);
    let _ = writeln!(
        s,
        "- redis-server {} (throwaway, loopback, no persistence; started by testkit: one \
         for the handoff, hot-key and single-node latency runs, five for Redlock, one for \
         the held-locks run; a Sentinel group and clusters for the Sentinel and Cluster \
         section)",
        r.redis_version
    );
    match &r.python {
        Ok(v) => {
            let _ = writeln!(s, "- {v} (pinned in `bench/py/requirements.txt`)");
        }
        Err(e) => {
            let _ = writeln!(s, "- Python peers left out: {e}");
        }
    }
    match &r.node {
        Ok(v) => {
            let _ = writeln!(s, "- {v} (pinned in `bench/js/package-lock.json`)");
        }
        Err(e) => {
            let _ = writeln!(s, "- node-redlock and redis-semaphore left out: {e}");
        }
    }
    let _ = writeln!(
        s,
        "- load average (1/5/15 min) before: {}, after: {}",
        r.load_before, r.load_after
    );
    let _ = writeln!(s, "- run time: {:.0} s\n", r.elapsed.as_secs_f64());
}

fn settings(s: &mut String, r: &Results) {
    let _ = writeln!(s, "## Locks and their settings\n");
    let _ = writeln!(
        s,
        "Every lock takes a {TTL:?} lease (python-redis-lock: `expire=10`; its default is \
         no expiry), never reached. \"tuned\" rows change only how long a waiter pauses \
         between tries; the other knobs stay at the library's defaults.\n"
    );
    let _ = writeln!(s, "| lock | settings |\n|---|---|");
    for p in peers_of(r) {
        let _ = writeln!(s, "| {} | {} |", p.label(), p.settings());
    }
    let _ = writeln!(s);
}

fn side_by_side(s: &mut String, r: &Results) {
    let unit = ping_unit(r) as f64;
    let fence_unc = uncontended(r, Peer::Fencelock).map(|s| s.summary.p50 as f64);
    let fence_hot = hot_key_row(r, Peer::Fencelock).map(HotKeyRow::per_second);
    let _ = writeln!(s, "## Side by side\n");
    let _ = writeln!(
        s,
        "Absolute figures, with ratios in brackets: uncontended p50 as PING round trips \
         (p50 of the PINGs interleaved with the cycles, {}) and as a multiple of \
         fencelock's; handoff p50 as a multiple of fencelock's at the same waiter count \
         (above 1: slower than fencelock); hot-key acquisitions per second as a multiple \
         of fencelock's (below 1: fewer than fencelock). Details and the conditions of \
         each figure in the sections below. \"–\": not measured (tuned settings change \
         nothing uncontended; the Redlock comparison covers the libraries that do \
         Redlock).\n",
        fmt_ns(ping_unit(r))
    );
    let _ = writeln!(
        s,
        "| lock | uncontended p50 (× PING, × fencelock) | handoff p50, 1 waiter | 8 waiters | 64 waiters | hot key acq/s | hot key min/max | Redlock {n} nodes p50 ÷ single |\n|---|---|---|---|---|---|---|---|",
        n = REDLOCK_NODES
    );
    for p in peers_of(r) {
        let unc = match uncontended(r, p) {
            Some(series) => {
                let v = series.summary.p50 as f64;
                format!(
                    "{} ({}, {})",
                    fmt_ns(series.summary.p50),
                    x(v / unit),
                    fence_unc.map_or("–".into(), |f| x(v / f))
                )
            }
            None => "–".to_owned(),
        };
        let hand: Vec<String> = WAITERS
            .iter()
            .map(|&w| match handoff_p50(r, p, w) {
                Some(v) => {
                    let rel = handoff_p50(r, Peer::Fencelock, w)
                        .map_or("–".into(), |f| x(v as f64 / f as f64));
                    format!("{} ({rel})", fmt_ns(v))
                }
                None => "–".to_owned(),
            })
            .collect();
        let (hot, fair) = match hot_key_row(r, p) {
            Some(h) => (
                format!(
                    "{:.0} ({})",
                    h.per_second(),
                    fence_hot.map_or("–".into(), |f| x(h.per_second() / f))
                ),
                format!("{:.2}", h.fairness()),
            ),
            None => ("–".to_owned(), "–".to_owned()),
        };
        let pair = match &r.latency {
            Ok(lat) => lat
                .single
                .iter()
                .find(|(q, _)| *q == p)
                .map(|(_, one)| one)
                .zip(lat.redlock.iter().find(|(q, _)| *q == p).map(|(_, m)| m)),
            Err(_) => None,
        };
        let pair = match (pair, p) {
            (None, Peer::NodeRedlock) => {
                node_redlock_cycles(r).and_then(|(one, many)| Some((one, many?)))
            }
            (pair, _) => pair,
        };
        let redlock = match pair {
            Some((one, many)) => format!(
                "{} ({} / {})",
                x(many.summary.p50 as f64 / one.summary.p50 as f64),
                fmt_ns(many.summary.p50),
                fmt_ns(one.summary.p50)
            ),
            None => "–".to_owned(),
        };
        let _ = writeln!(
            s,
            "| {} | {unc} | {} | {} | {} | {hot} | {fair} | {redlock} |",
            p.label(),
            hand[0],
            hand[1],
            hand[2]
        );
    }
    let _ = writeln!(s);
}

fn targets(s: &mut String, r: &Results) {
    let _ = writeln!(s, "## Targets\n");
    let _ = writeln!(
        s,
        "The fourth performance round's targets (issue 47; ratios within this run), then \
         the earlier issues' (17, 15) for the uncontended cycle against redis-rs alone, \
         the handoff, the hot key, Redlock, the held leases and the topologies.\n"
    );
    let _ = writeln!(s, "| target | figure | met |\n|---|---|---|");
    crate::round4::rows(s, r);
    let unit = ping_unit(r);
    // 1. Uncontended: against redis-rs alone (against rslock: issue 47's bound, above).
    match &r.latency {
        Ok(lat) => {
            let p50 = |peer| {
                lat.single
                    .iter()
                    .find(|(p, _)| *p == peer)
                    .map(|(_, s)| s.summary.p50)
            };
            if let Some(f) = p50(Peer::Fencelock) {
                let raw = lat.raw.summary.p50;
                let vs = f as f64 / raw as f64;
                let _ = writeln!(
                    s,
                    "| uncontended p50 within {TARGET_RAW_RATIO}x of redis-rs alone (`SET NX \
                     PX` + release script, no fencing token) | {} / {} = {} | {} |",
                    fmt_ns(f),
                    fmt_ns(raw),
                    x(vs),
                    yes_no(vs <= TARGET_RAW_RATIO)
                );
            }
        }
        Err(e) => {
            let _ = writeln!(s, "| uncontended p50 | run failed: {e} | **no** |");
        }
    }
    // 2. Handoff: against the PING, against itself with 1 waiter, against every peer.
    let others: Vec<Peer> = peers_of(r)
        .into_iter()
        .filter(|p| !matches!(p, Peer::Fencelock | Peer::FencelockFair))
        .collect();
    for ours in [Peer::Fencelock, Peer::FencelockFair] {
        let one = handoff_p50(r, ours, WAITERS[0]);
        let mut cells = Vec::new();
        let mut ok = true;
        match one {
            Some(one) => {
                let pings = one as f64 / unit as f64;
                ok &= pings <= TARGET_HANDOFF_PINGS;
                cells.push(format!(
                    "{} waiter: {} = {:.1} PINGs",
                    WAITERS[0],
                    fmt_ns(one),
                    pings
                ));
            }
            None => {
                ok = false;
                cells.push("1 waiter: not measured".into());
            }
        }
        for &w in &WAITERS[1..] {
            match (handoff_p50(r, ours, w), one) {
                (Some(f), Some(one)) => {
                    let growth = f as f64 / one as f64;
                    ok &= growth <= TARGET_HANDOFF_GROWTH;
                    cells.push(format!(
                        "{w} waiters: {} = {} the 1-waiter p50",
                        fmt_ns(f),
                        x(growth)
                    ));
                }
                _ => {
                    ok = false;
                    cells.push(format!("{w} waiters: not measured"));
                }
            }
        }
        let mut behind = Vec::new();
        for w in WAITERS {
            let Some(f) = handoff_p50(r, ours, w) else {
                continue;
            };
            for &p in &others {
                match handoff_p50(r, p, w) {
                    Some(v) if v < f => {
                        behind.push(format!("{} with {w} ({})", p.label(), fmt_ns(v)))
                    }
                    Some(_) => {}
                    None => behind.push(format!("{} with {w}: not measured", p.label())),
                }
            }
        }
        ok &= behind.is_empty();
        let ahead = if behind.is_empty() {
            "ahead of every peer at every count".to_owned()
        } else {
            format!("behind {}", behind.join(", "))
        };
        let _ = writeln!(
            s,
            "| {}: handoff p50 at most {TARGET_HANDOFF_PINGS} PING round trips with 1 waiter, \
             at most {TARGET_HANDOFF_GROWTH}x that with {} and {} waiters, ahead of every \
             peer (tuned or not) at every count | {}; {ahead} | {} |",
            ours.label(),
            WAITERS[1],
            WAITERS[2],
            cells.join("; "),
            yes_no(ok)
        );
    }
    // 3. Hot key: fair mode fair at rslock's pace; plain mode twice the figure.
    match (
        hot_key_row(r, Peer::FencelockFair),
        hot_key_row(r, Peer::Rslock),
    ) {
        (Some(fair), Some(rs)) => {
            let _ = writeln!(
                s,
                "| hot key ({HOT_KEY_CONTENDERS} contenders): fair() min/max at least \
                 {TARGET_FAIRNESS} at no fewer acquisitions/s than rslock | min/max {:.2}; \
                 {:.0}/s vs rslock's {:.0}/s | {} |",
                fair.fairness(),
                fair.per_second(),
                rs.per_second(),
                yes_no(
                    fair.complete()
                        && fair.fairness() >= TARGET_FAIRNESS
                        && fair.per_second() >= rs.per_second()
                )
            );
        }
        _ => {
            let _ = writeln!(s, "| hot key, fair mode vs rslock | run failed | **no** |");
        }
    }
    if let Some(plain) = hot_key_row(r, Peer::Fencelock) {
        let commands = plain
            .commands_per_s
            .map(|c| c / plain.per_second())
            .unwrap_or(f64::NAN);
        let _ = writeln!(
            s,
            "| hot key: plain mode at least twice the issue's {HOT_KEY_BEFORE:.0} \
             acquisitions/s, with fewer than its {HOT_KEY_BEFORE_COMMANDS:.0} Redis commands \
             per acquisition (a figure from another run: compare with care) | {:.0}/s, {:.1} \
             commands | {} |",
            plain.per_second(),
            commands,
            yes_no(
                plain.per_second() >= 2.0 * HOT_KEY_BEFORE && commands < HOT_KEY_BEFORE_COMMANDS
            )
        );
    }
    // 4. Redlock: against rslock's Redlock, and with one node blackholed.
    if let Ok(lat) = &r.latency {
        let p50 = |peer| {
            lat.redlock
                .iter()
                .find(|(p, _)| *p == peer)
                .map(|(_, s)| s.summary.p50)
        };
        if let (Some(f), Some(rs)) = (p50(Peer::Fencelock), p50(Peer::Rslock)) {
            let _ = writeln!(
                s,
                "| Redlock ({} nodes) p50 at most rslock's | {} vs {} | {} |",
                lat.nodes,
                fmt_ns(f),
                fmt_ns(rs),
                yes_no(f <= rs)
            );
            let b = lat.blackholed.summary.p50;
            let ratio = b as f64 / f as f64;
            let _ = writeln!(
                s,
                "| Redlock with 1 of {} nodes blackholed: p50 within {TARGET_BLACKHOLED_RATIO}x \
                 of all nodes up | {} / {} = {} | {} |",
                lat.nodes,
                fmt_ns(b),
                fmt_ns(f),
                x(ratio),
                yes_no(ratio <= TARGET_BLACKHOLED_RATIO)
            );
        }
    }
    // 5. Held locks.
    match &r.held {
        Ok(h) => {
            let calls = h.calls_per_100_per_tick();
            let bytes = h.bytes_per_lock();
            let _ = writeln!(
                s,
                "| {} held locks: at most {} script call per 100 leases per renewal tick, \
                 under {} bytes of client memory per lock | {calls:.2} calls, {bytes:.0} \
                 bytes | {} |",
                h.locks,
                held::TARGET_CALLS_PER_100,
                held::TARGET_BYTES_PER_LOCK,
                yes_no(
                    calls <= held::TARGET_CALLS_PER_100
                        && bytes < held::TARGET_BYTES_PER_LOCK
                        && h.all_alive()
                )
            );
        }
        Err(e) => {
            let _ = writeln!(s, "| held locks | run failed: {e} | **no** |");
        }
    }
    // 6. Sentinel and Cluster.
    topologies::target_rows(s, &r.topologies);
    let _ = writeln!(s);
}

fn baseline(s: &mut String, r: &Results) {
    let _ = writeln!(s, "## Baseline: PING round trip\n");
    let _ = writeln!(
        s,
        "redis-rs multiplexed connection, one PING at a time, {} samples after warm-up, \
         unpinned, before the runs and again after them (how much the machine drifted). The \
         ratios above use the PINGs interleaved with the latency cycles instead (pinned like \
         them; next section).\n",
        r.ping.n
    );
    let _ = writeln!(s, "| when | p50 | p99 | max |\n|---|---|---|---|");
    for (when, p) in [("before", Some(&r.ping)), ("after", r.ping_after.as_ref())] {
        if let Some(p) = p {
            let _ = writeln!(
                s,
                "| {when} | {} | {} | {} |",
                fmt_ns(p.p50),
                fmt_ns(p.p99),
                fmt_ns(p.max)
            );
        }
    }
    let _ = writeln!(s);
}

/// A link to chart `file` of `charts` (inline for a full run), or why it was not drawn.
pub(crate) fn chart_link(s: &mut String, charts: &Charts, file: &Option<String>, alt: &str) {
    match (file, &charts.error) {
        (Some(f), _) => {
            // A full run writes into docs/img, next to this report; show it inline.
            if charts.dir.ends_with("docs/img") {
                let _ = writeln!(s, "![{alt}](img/{f})\n");
            } else {
                let _ = writeln!(s, "Chart: `{}`\n", charts.dir.join(f).display());
            }
        }
        (None, Some(e)) => {
            let _ = writeln!(s, "(Chart not drawn: {e}.)\n");
        }
        (None, None) => {}
    }
}

fn uncontended_section(s: &mut String, r: &Results, charts: &Charts) {
    let _ = writeln!(s, "## Uncontended acquire + release, one client\n");
    let lat = match &r.latency {
        Ok(l) => l,
        Err(e) => {
            let _ = writeln!(s, "Run failed: {e}\n");
            return;
        }
    };
    let _ = writeln!(
        s,
        "One client, one lock name, no contention: each cycle acquires with a {TTL:?} lease \
         and releases, awaited in turn, timed from before the acquire to the end of the \
         release. fencelock: `lock(name).lease(..).renew(false).try_acquire()` then `guard.release()`; \
         rslock: `LockManager::lock` then `Lock::release`; redlock: `RedLock::lock` then \
         `unlock` (synchronous, on the harness thread); all in the harness process, taking \
         turns in blocks of {BLOCK} with a PING loop, so the machine's drift hits them alike. \
         {} measured cycles per client after {} warm-up cycles. Placement: {}. The Python \
         peers run in the Python driver (one thread), {} cycles each after warm-up, taking \
         turns in blocks of {BLOCK} with redis-py PINGs; placement: {}. node-redlock runs \
         in the Node driver (one async task, `acquire` with `retryCount: 0`, then \
         `release`), the same way with ioredis PINGs; placement: {}.\n",
        lat.cycles,
        lat.warmup,
        lat.placement,
        lat.cycles,
        r.python_placement.as_deref().unwrap_or("–"),
        r.node_latency
            .as_ref()
            .and_then(|n| n.placement.as_deref())
            .unwrap_or("–"),
    );
    let _ = writeln!(
        s,
        "Why pinned: on a 2-CPU VM a loopback round trip costs about 10 µs when client and \
         server share a CPU and about 70 µs when the server must be woken on the other one, \
         and unpinned the scheduler picks either, differently from run to run. Client and \
         servers on separate CPUs makes every request a cross-CPU wake-up, as it would be a \
         network hop.\n"
    );
    let unit = lat.ping.summary.p50 as f64;
    let fence = lat
        .single
        .iter()
        .find(|(p, _)| *p == Peer::Fencelock)
        .map(|(_, s)| s.summary.p50 as f64);
    let _ = writeln!(
        s,
        "| client | samples | p50 | p99 | max | cycles/s | p50 × PING (redis-rs) | p50 × fencelock |\n|---|---|---|---|---|---|---|---|"
    );
    let mut rows: Vec<(String, &Series)> = lat
        .single
        .iter()
        .map(|(p, s)| (p.label().to_owned(), s))
        .collect();
    rows.push(("PING (redis-rs, interleaved)".to_owned(), &lat.ping));
    rows.push((
        "redis-rs alone: SET NX PX, then an owner-checked DEL script (interleaved)".to_owned(),
        &lat.raw,
    ));
    for (p, res) in &r.python_latency {
        match res {
            Ok(run) => rows.push((p.label().to_owned(), &run.cycles)),
            Err(e) => {
                let _ = writeln!(s, "| {} | run failed: {e} |||||||", p.label());
            }
        }
    }
    if let Some((_, Ok(run))) = r.python_latency.first() {
        rows.push(("PING (redis-py, interleaved)".to_owned(), &run.pings));
    }
    if let Some(node) = &r.node_latency {
        match &node.single {
            Ok(run) => {
                rows.push((Peer::NodeRedlock.label().to_owned(), &run.cycles));
                rows.push(("PING (ioredis, interleaved)".to_owned(), &run.pings));
            }
            Err(e) => {
                let _ = writeln!(
                    s,
                    "| {} | run failed: {e} |||||||",
                    Peer::NodeRedlock.label()
                );
            }
        }
    }
    for (label, series) in rows {
        let sm = &series.summary;
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} | {:.0} | {} | {} |",
            sm.n,
            fmt_ns(sm.p50),
            fmt_ns(sm.p99),
            fmt_ns(sm.max),
            series.per_second(),
            x(sm.p50 as f64 / unit),
            fence.map_or("–".into(), |f| x(sm.p50 as f64 / f)),
        );
    }
    let _ = writeln!(s);
    server_cpu_table(s, lat);
    chart_link(
        s,
        charts,
        &charts.latency,
        "Uncontended acquire + release latency distributions",
    );
}

/// What an uncontended cycle costs the server, per client of the harness.
fn server_cpu_table(s: &mut String, lat: &LatencyRun) {
    let _ = writeln!(
        s,
        "What a cycle costs the server: right after the turns, each single-node client of \
         the harness ran {} more cycles alone, and redis-server's main thread (which runs \
         every command and script) was timed by the scheduler (`/proc/PID/schedstat`): its \
         CPU time over those cycles ÷ {}. It includes the socket reads and writes (two \
         round trips per lock cycle, one per PING); the rest is the commands and scripts. redlock opens \
         a connection per command, and pays for it here too.\n",
        lat.cycles, lat.cycles
    );
    let _ = writeln!(
        s,
        "| client | redis-server CPU per cycle | × fencelock |\n|---|---|---|"
    );
    let fence = lat
        .server_cpu
        .iter()
        .find(|(label, _)| label == Peer::Fencelock.label())
        .and_then(|(_, r)| r.as_ref().ok().copied());
    for (label, cost) in &lat.server_cpu {
        match cost {
            Ok(ns) => {
                let _ = writeln!(
                    s,
                    "| {label} | {} | {} |",
                    fmt_ns(*ns as u64),
                    fence.map_or("–".into(), |f| x(ns / f)),
                );
            }
            Err(e) => {
                let _ = writeln!(s, "| {label} | not measured: {e} | – |");
            }
        }
    }
    let _ = writeln!(s);
}

fn redlock_section(s: &mut String, r: &Results) {
    let Ok(lat) = &r.latency else { return };
    redlock_table(s, lat, r.node_latency.as_ref());
}

fn redlock_table(s: &mut String, lat: &LatencyRun, node: Option<&NodeLatency>) {
    let n = lat.nodes;
    let _ = writeln!(s, "## Redlock over {n} nodes vs single node\n");
    let _ = writeln!(
        s,
        "The same uncontended cycle (same run, same turns as above) with each library's \
         Redlock client over {n} independent redis-server processes on this machine (a \
         majority of {} must grant): fencelock `Client::redlock(urls).restart_protection(None)` \
         (to each node at once), rslock `LockManager::new(urls)` (to each node at once), \
         redlock `RedLock::new(urls)` (one node after another, a new connection per \
         command). The Redlock nodes share the CPUs left by the client, so their work runs \
         one after another rather than in parallel as on {n} hosts. For scale: one PING to \
         each of the {n} nodes at once, until all answered, takes {} (p50). node-redlock: \
         `new Redlock(clients)` with one ioredis client per node (to each node at once), in \
         the Node driver's own two runs (single node, then the {n} nodes; each in turns \
         with its ioredis PINGs, to every node at once on the {n} nodes: {} p50).\n",
        n / 2 + 1,
        fmt_ns(lat.fan_out.summary.p50),
        node.and_then(|n| n.redlock.as_ref().ok())
            .map_or("not measured".to_owned(), |run| fmt_ns(
                run.pings.summary.p50
            )),
    );
    let _ = writeln!(
        s,
        "| lock | single p50 | single p99 | {n} nodes p50 | {n} nodes p99 | p50 ratio | p99 ratio | {n} nodes p50 × fencelock's |\n|---|---|---|---|---|---|---|---|"
    );
    let fence = lat
        .redlock
        .iter()
        .find(|(p, _)| *p == Peer::Fencelock)
        .map(|(_, s)| s.summary.p50 as f64);
    let mut rows: Vec<(Peer, &Series, &Series)> = lat
        .redlock
        .iter()
        .filter_map(|(p, many)| {
            let (_, one) = lat.single.iter().find(|(q, _)| q == p)?;
            Some((*p, one, many))
        })
        .collect();
    let mut node_failed = None;
    if let Some(node) = node {
        match (&node.single, &node.redlock) {
            (Ok(one), Ok(many)) => rows.push((Peer::NodeRedlock, &one.cycles, &many.cycles)),
            (Err(e), _) | (_, Err(e)) => node_failed = Some(e),
        }
    }
    for (p, one, many) in rows {
        let (o, m): (&Summary, &Summary) = (&one.summary, &many.summary);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            p.label(),
            fmt_ns(o.p50),
            fmt_ns(o.p99),
            fmt_ns(m.p50),
            fmt_ns(m.p99),
            x(m.p50 as f64 / o.p50 as f64),
            x(m.p99 as f64 / o.p99 as f64),
            fence.map_or("–".into(), |f| x(m.p50 as f64 / f)),
        );
    }
    if let Some(e) = node_failed {
        let _ = writeln!(
            s,
            "| {} | run failed: {e} |||||||",
            Peer::NodeRedlock.label()
        );
    }
    let _ = writeln!(s);
    if let Some(all_up) = fence {
        let b = &lat.blackholed.summary;
        let _ = writeln!(
            s,
            "With one of the {n} nodes blackholed (behind a proxy that swallows every \
             request; no reply, no error), fencelock's Redlock cycle (same turns) takes {} \
             p50 ({} the p50 with all nodes up); p99 {}. An acquire and a release answer once a majority \
             has; the call to the silent node ends at the node timeout in the background.\n",
            fmt_ns(b.p50),
            x(b.p50 as f64 / all_up),
            fmt_ns(b.p99),
        );
    }
}

fn handoff_section(s: &mut String, r: &Results, charts: &Charts) {
    let _ = writeln!(s, "## Handoff latency\n");
    let _ = writeln!(
        s,
        "From just before the holder's release until a waiter in another OS process holds \
         the lock, by CLOCK_MONOTONIC: the holder writes the time into a file that every \
         contender of the row shares, the next holder reads it, and neither costs a Redis \
         round trip (until 26 November the stamp was a Redis `SET`, whose round trip every \
         sample included, about one PING). Contenders \
         (waiters + 1) run over up to {MAX_PROCS} processes (tokio tasks in the Rust worker, \
         threads in the Python driver, async tasks in the Node driver; each process with its \
         own client; in the Python and Node drivers, each contender with its own); hold \
         {HANDOFF_HOLD:?} (1–2 ms with the timers' resolution). Strict handoff: a releaser \
         waits until another contender took the lock before it contends again, so every \
         release has waiters. Contenders start at offsets spread evenly over \
         {START_SPREAD_MS} ms, so pollers poll at spread phases (their best case). A sample \
         counts only if the previous holder was another process and the new holder was \
         already waiting at the release. {} per row, {} for the slow pollers (rslock, \
         redlock, redis-py and node-redlock at their defaults). The pollers' handoff shrinks \
         as waiters are added (N waiters at spread phases poll, together, N times as often), \
         while their load on Redis grows; python-redis-lock does not poll (BLPOP). Redis \
         commands/s: `total_commands_processed` of `INFO stats` over the row / its length \
         (commands run inside scripts count too, so it measures the work Redis does); it \
         includes the harness's own bookkeeping (a DEL, an LPUSH and a BLPOP per handoff, \
         the same for every lock).\n",
        fmt_dur(r.plan.handoff_run),
        fmt_dur(r.plan.slow_run),
    );
    let unit = ping_unit(r) as f64;
    let _ = writeln!(
        s,
        "| lock | waiters | processes × contenders | samples | p50 | p99 | max | p50 × PING | p50 × fencelock | Redis commands/s | not sampled (same process / not waiting) | errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for row in &r.handoff {
        let fence = handoff_p50(r, Peer::Fencelock, row.waiters);
        let (n, p50, p99, max, rp, rf) = match row.summary {
            Some(sum) => (
                sum.n.to_string(),
                fmt_ns(sum.p50),
                fmt_ns(sum.p99),
                fmt_ns(sum.max),
                x(sum.p50 as f64 / unit),
                fence.map_or("–".into(), |f| x(sum.p50 as f64 / f as f64)),
            ),
            None => (
                "0".into(),
                "–".into(),
                "–".into(),
                "–".into(),
                "–".into(),
                "–".into(),
            ),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {n} | {p50} | {p99} | {max} | {rp} | {rf} | {} | {} / {} | {} |",
            row.peer.label(),
            row.waiters,
            spread_cell(&row.tasks),
            rate(row.commands_per_s),
            row.report.same_process,
            row.report.late,
            errors_cell(&row.report.errors, row.error.as_deref()),
        );
    }
    let _ = writeln!(s);
    floor_text(s, r, unit);
    chart_link(s, charts, &charts.handoff, "Handoff p50 by waiter count");
}

/// The two handoff floors measured around fencelock's rows, and fencelock's handoff over
/// the release-shaped one (what the targets are against).
fn floor_text(s: &mut String, r: &Results, unit: f64) {
    match &r.floor.publish {
        Ok(f) => {
            let _ = writeln!(
                s,
                "The floor of any handoff by pub/sub on this machine: a bare `PUBLISH` from \
                 the harness to a subscriber in another process, until that process has read \
                 it, {} messages 1 ms apart before and as many after fencelock's rows: p50 {}, \
                 p99 {}, max {} ({} a PING). fencelock's 1-waiter handoff over it: {}, \
                 fair() {}.\n",
                f.n / 2,
                fmt_ns(f.p50),
                fmt_ns(f.p99),
                fmt_ns(f.max),
                x(f.p50 as f64 / unit),
                handoff_p50(r, Peer::Fencelock, WAITERS[0])
                    .map_or("–".into(), |p| x(p as f64 / f.p50 as f64)),
                handoff_p50(r, Peer::FencelockFair, WAITERS[0])
                    .map_or("–".into(), |p| x(p as f64 / f.p50 as f64)),
            );
        }
        Err(e) => {
            let _ = writeln!(
                s,
                "The handoff floor (a bare `PUBLISH`) was not measured: {e}.\n"
            );
        }
    }
    match &r.floor.release {
        Ok(f) => {
            let over = |peer| {
                WAITERS
                    .iter()
                    .map(|&w| {
                        handoff_p50(r, peer, w).map_or(format!("{w}: –"), |p| {
                            format!("{w}: {}", x(p as f64 / f.p50 as f64))
                        })
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                s,
                "The release-shaped floor, measured in the same turns: one `EVALSHA` of a \
                 script that deletes a key and publishes, to the same subscriber: p50 {}, p99 \
                 {}, max {} ({} the bare `PUBLISH`). fencelock's handoff p50 over it, by \
                 waiters: {}; fair() {}.\n",
                fmt_ns(f.p50),
                fmt_ns(f.p99),
                fmt_ns(f.max),
                r.floor
                    .publish
                    .as_ref()
                    .map_or("–".into(), |b| x(f.p50 as f64 / b.p50 as f64)),
                over(Peer::Fencelock),
                over(Peer::FencelockFair),
            );
        }
        Err(e) => {
            let _ = writeln!(
                s,
                "The release-shaped handoff floor was not measured: {e}.\n"
            );
        }
    }
}

fn hot_key_section(s: &mut String, r: &Results, charts: &Charts) {
    let _ = writeln!(s, "## Hot key\n");
    let _ = writeln!(
        s,
        "{HOT_KEY_CONTENDERS} contenders over {MAX_PROCS} processes loop acquire (waiting \
         until the end of the run) → release at once (empty critical section) → acquire \
         again, for {} per lock, all starting at one time; acquisitions counted per \
         contender (an acquisition after the end is not counted). Longest wait: the \
         longest single acquire of any contender (the run's length means one never got the \
         lock). min/max is the fairness figure: 1 when every contender got the lock as \
         often as every other. Redis commands/s: `total_commands_processed` of `INFO \
         stats` over the run / its length (commands run inside scripts count too; all of \
         it the locks' own traffic).\n",
        fmt_dur(r.plan.hot_key_run)
    );
    let fence = hot_key_row(r, Peer::Fencelock).map(HotKeyRow::per_second);
    let _ = writeln!(
        s,
        "| lock | processes × contenders | acquisitions/s | × fencelock | min / contender | max / contender | min/max | longest wait | Redis commands/s | commands / acquisition | errors |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for row in &r.hot_key {
        let counts = &row.report.counts;
        let min = counts.iter().min().copied().unwrap_or(0);
        let max = counts.iter().max().copied().unwrap_or(0);
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {} | {min} | {max} | {:.2} | {} | {} | {} | {} |",
            row.peer.label(),
            spread_cell(&row.tasks),
            row.per_second(),
            fence.map_or("–".into(), |f| x(row.per_second() / f)),
            row.fairness(),
            fmt_ns(row.report.max_wait),
            rate(row.commands_per_s),
            match row.commands_per_s {
                Some(c) if row.per_second() > 0.0 => format!("{:.1}", c / row.per_second()),
                _ => "–".to_owned(),
            },
            errors_cell(&row.report.errors, row.error.as_deref()),
        );
    }
    let _ = writeln!(s);
    chart_link(
        s,
        charts,
        &charts.fairness,
        "Hot key: min/max acquisitions per contender",
    );
}

/// `1,000`, `1,000,000`.
pub(crate) fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_in_readable_units() {
        assert_eq!(fmt_ns(12_300), "12.3 µs");
        assert_eq!(fmt_ns(4_560_000), "4.56 ms");
    }
}
