//! How cost grows: the held-locks run of [`crate::held`] at sizes from a thousand leases
//! to a million, and fencelock's handoff (plain and `fair()`) at waiter counts from 1 to
//! 256; a table and a chart of each.
//!
//! Each size of the held-locks run goes in a process of its own (this binary re-executed
//! as the hidden `held` subcommand, which runs [`held::run`] and prints what it measured,
//! one `field value` line each), so one size's heap, kept by the allocator after its
//! guards are dropped, does not hide the next size's growth of VmRSS, and the harness
//! does not keep a gigabyte after the million-lease size. The handoff rows are
//! [`launcher::measured`] runs, as the handoff section's; the waiter counts that section
//! already measured are taken from it rather than measured twice.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::chart::{Charts, FONT, color, err, fmt_ms};
use crate::held::{self, HeldRun, LEASE, TICK};
use crate::launcher::{self, Launcher, MAX_PROCS};
use crate::peers::Peer;
use crate::plan::{HANDOFF_HOLD, Plan, WAITERS};
use crate::report::{chart_link, fmt_dur, fmt_ns, thousands, yes_no};
use crate::results::{HandoffRow, Results};

/// Leases per `renew.lua` call (the library's `limits::RENEWAL_BATCH`).
const RENEWAL_BATCH: usize = fencelock::limits::RENEWAL_BATCH;
/// The locks of the handoff growth rows.
pub(crate) const HANDOFF_PEERS: [Peer; 2] = [Peer::Fencelock, Peer::FencelockFair];
/// How long one size of the held-locks run may take, start to exit, before it is killed.
const HELD_TIMEOUT: Duration = Duration::from_secs(600);
/// The size of the growth charts: three panels side by side for the held leases.
const HELD_SIZE: (u32, u32) = (1500, 520);
/// The size of the handoff growth chart.
const HANDOFF_SIZE: (u32, u32) = (1000, 600);

/// Everything the section measured.
#[derive(Default)]
pub(crate) struct Growth {
    /// One per size, smallest first.
    pub(crate) held: Vec<HeldPoint>,
    /// The handoff rows of the waiter counts the handoff section did not measure.
    pub(crate) handoff: Vec<HandoffRow>,
}

impl Growth {
    /// Whether any of its measurements failed (see [`HeldPoint::failed`]).
    pub(crate) fn failed(&self, held_locks: usize) -> bool {
        self.held.iter().any(|p| p.failed(held_locks))
            || self
                .handoff
                .iter()
                .any(|h| h.error.is_some() || !h.report.errors.is_empty())
    }
}

/// One size of the held-locks run.
pub(crate) struct HeldPoint {
    pub(crate) locks: usize,
    pub(crate) run: Result<HeldRun, String>,
    /// The whole of it, from starting its process to its exit: connecting, acquiring,
    /// the window, releasing.
    pub(crate) took: Duration,
    /// The process's peak VmRSS (`VmHWM`), bytes: with the drop of every guard at the
    /// end, whose releases are then in flight together.
    pub(crate) peak_rss: Option<u64>,
}

impl HeldPoint {
    /// Whether it counts as a failed measurement: it failed, lost a lease or timed out
    /// releasing, at a size no larger than the held-locks row's (`held_locks`). Larger
    /// sizes probe where one client on one node stops keeping up: reported, not failed.
    pub(crate) fn failed(&self, held_locks: usize) -> bool {
        self.locks <= held_locks && !matches!(&self.run, Ok(r) if r.all_alive() && r.flushed)
    }
}

/// Arguments of the hidden `held` subcommand (set by the harness, not by people).
#[derive(clap::Args, Clone, Debug)]
pub struct HeldArgs {
    /// Redis URL of the held-locks scenario's own server.
    #[arg(long)]
    pub url: String,
    /// Locks to hold.
    #[arg(long)]
    pub locks: usize,
    /// How long to watch them, in milliseconds.
    #[arg(long)]
    pub window_ms: u64,
}

/// The hidden `held` subcommand: one [`held::run`], its figures on stdout (`field value`
/// lines, then `done`; or `error MSG`); returns the exit code.
pub fn held_child(args: HeldArgs) -> i32 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let window = Duration::from_millis(args.window_ms);
    let result = runtime.block_on(held::run(&args.url, args.locks, window));
    // The peak includes the drop of every guard at the end (their releases in flight).
    if let Some(peak) = status_kib("VmHWM") {
        println!("peak_rss {}", peak * 1024);
    }
    match result {
        Ok(run) => {
            let mut out = String::new();
            for (field, value) in encode(&run) {
                let _ = writeln!(out, "{field} {value}");
            }
            println!("{out}done");
            0
        }
        Err(e) => {
            println!("error {}", e.replace('\n', " "));
            1
        }
    }
}

/// A `kB` field of `/proc/self/status` (`VmHWM`, the peak resident memory).
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse().ok())
}

/// The fields of a [`HeldRun`], as the `held` subcommand prints them (durations in ns,
/// `-` for none).
fn encode(r: &HeldRun) -> Vec<(&'static str, String)> {
    let ns = |d: Duration| d.as_nanos().to_string();
    let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    vec![
        ("locks", r.locks.to_string()),
        ("acquire_time", ns(r.acquire_time)),
        ("window", ns(r.window)),
        ("evalsha", r.evalsha.to_string()),
        ("eval", r.eval.to_string()),
        ("renewals", opt(r.renewals)),
        ("cpu", ns(r.cpu)),
        ("rss_before", r.rss_before.to_string()),
        ("rss_acquired", r.rss_acquired.to_string()),
        ("rss_end", r.rss_end.to_string()),
        ("dbsize", r.dbsize.to_string()),
        ("lost", r.lost.to_string()),
        ("watched", r.watched.to_string()),
        ("release_time", ns(r.release_time)),
        ("flushed", r.flushed.to_string()),
        ("dbsize_released", r.dbsize_released.to_string()),
        ("redis_cpu", opt(r.redis_cpu.map(|d| d.as_nanos() as u64))),
    ]
}

/// The [`HeldRun`] of the `held` subcommand's output; an error for an `error` line, a
/// missing `done` or a missing or bad field.
fn decode(out: &str) -> Result<HeldRun, String> {
    let mut fields = HashMap::new();
    let mut done = false;
    for line in out.lines() {
        let (k, v) = line.split_once(' ').unwrap_or((line, ""));
        match k {
            "error" => return Err(v.to_owned()),
            "done" => done = true,
            "peak_rss" => {}
            _ => {
                fields.insert(k, v.trim());
            }
        }
    }
    if !done {
        return Err("exited without reporting".to_owned());
    }
    let opt = |k: &str| -> Result<Option<u64>, String> {
        match fields.get(k) {
            Some(&"-") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| format!("bad {k}: {v:?}")),
            None => Err(format!("no {k}")),
        }
    };
    let num = |k: &str| opt(k)?.ok_or_else(|| format!("no value for {k}"));
    let dur = |k: &str| num(k).map(Duration::from_nanos);
    Ok(HeldRun {
        locks: num("locks")? as usize,
        acquire_time: dur("acquire_time")?,
        window: dur("window")?,
        evalsha: num("evalsha")?,
        eval: num("eval")?,
        renewals: opt("renewals")?,
        cpu: dur("cpu")?,
        rss_before: num("rss_before")?,
        rss_acquired: num("rss_acquired")?,
        rss_end: num("rss_end")?,
        dbsize: num("dbsize")?,
        lost: num("lost")? as usize,
        watched: num("watched")? as usize,
        release_time: dur("release_time")?,
        flushed: fields.get("flushed") == Some(&"true"),
        dbsize_released: num("dbsize_released")?,
        redis_cpu: opt("redis_cpu")?.map(Duration::from_nanos),
    })
}

/// One size: the `held` subcommand of `exe` on `url`, bounded by [`HELD_TIMEOUT`].
async fn held_size(exe: &Path, url: &str, locks: usize, window: Duration) -> HeldPoint {
    let started = Instant::now();
    let child = tokio::process::Command::new(exe)
        .args(["held", "--url", url, "--locks"])
        .arg(locks.to_string())
        .arg("--window-ms")
        .arg(window.as_millis().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output();
    let mut peak_rss = None;
    let run = match tokio::time::timeout(HELD_TIMEOUT, child).await {
        Err(_) => Err(format!("did not finish within {HELD_TIMEOUT:?}")),
        Ok(Err(e)) => Err(format!("cannot run the held subcommand: {e}")),
        Ok(Ok(out)) => {
            let out_text = String::from_utf8_lossy(&out.stdout);
            peak_rss = out_text
                .lines()
                .find_map(|l| l.strip_prefix("peak_rss ")?.trim().parse().ok());
            match decode(&out_text) {
                Err(e) if !out.status.success() => Err(format!("{e} ({})", out.status)),
                other => other,
            }
        }
    };
    HeldPoint {
        locks,
        run,
        took: started.elapsed(),
        peak_rss,
    }
}

/// The held-locks run at each of the plan's sizes, on `url` (the scenario's own server;
/// each run starts with `FLUSHALL`), one process each, smallest first.
pub(crate) async fn held_growth(plan: &Plan, url: &str) -> Vec<HeldPoint> {
    let exe = std::env::current_exe().unwrap_or_else(|_| "fencelock-bench".into());
    let mut points = Vec::new();
    for &locks in plan.growth_held {
        eprintln!(
            "growth: {locks} held locks, watched for {:?} (own process)",
            plan.growth_window
        );
        let point = held_size(&exe, url, locks, plan.growth_window).await;
        match &point.run {
            Err(e) => eprintln!("growth: {locks} held locks failed: {e}"),
            Ok(r) if !r.all_alive() || !r.flushed => eprintln!(
                "growth: {locks} held locks: not every lease stayed alive, or releases timed out"
            ),
            Ok(_) => {}
        }
        eprintln!("growth: {locks} held locks took {:.1?}", point.took);
        points.push(point);
    }
    points
}

/// The handoff rows of [`HANDOFF_PEERS`] at the plan's waiter counts that are not in
/// [`WAITERS`] (the handoff section's rows have those), `plan.handoff_run` each.
pub(crate) async fn handoff_growth(
    plan: &Plan,
    launch: &Launcher,
    server: &testkit::RedisServer,
) -> Vec<HandoffRow> {
    let mut rows = Vec::new();
    for peer in HANDOFF_PEERS {
        for &waiters in plan.growth_waiters {
            if WAITERS.contains(&waiters) {
                continue;
            }
            eprintln!(
                "growth: handoff, {} with {waiters} waiters, {:?}",
                peer.label(),
                plan.handoff_run
            );
            let name = format!("growth-handoff-{}-{waiters}", peer.slug());
            let row =
                launcher::handoff_row(launch, server, peer, name, waiters, plan.handoff_run).await;
            if let Some(e) = &row.error {
                eprintln!(
                    "growth: handoff, {} with {waiters} waiters: {e}",
                    peer.label()
                );
            }
            rows.push(row);
        }
    }
    rows
}

/// The row of `peer` at `waiters`: the growth run's, or the handoff section's.
fn handoff_row(r: &Results, peer: Peer, waiters: usize) -> Option<&HandoffRow> {
    r.growth
        .handoff
        .iter()
        .chain(&r.handoff)
        .find(|h| h.peer == peer && h.waiters == waiters)
}

/// Figures of one held size, derived once for the table, the chart and the summary.
struct HeldFigures {
    /// Leases held.
    locks: usize,
    /// Script calls per renewal tick, and the same per 100 held leases.
    calls_per_tick: f64,
    calls_per_100: f64,
    /// Leases renewed per script call.
    per_call: Option<f64>,
    /// Client memory per lease, bytes: after acquiring, and at the end of the window.
    bytes_acquired: f64,
    bytes_end: f64,
    /// CPU over the window, % of one core: the client's, the redis-server's.
    cpu_pct: f64,
    redis_cpu_pct: Option<f64>,
}

impl HeldFigures {
    /// The figures of one run.
    fn of(r: &HeldRun) -> Self {
        let secs = r.window.as_secs_f64();
        let ticks = secs / TICK.as_secs_f64();
        let calls = (r.evalsha + r.eval) as f64;
        let n = r.locks as f64;
        HeldFigures {
            locks: r.locks,
            calls_per_tick: calls / ticks,
            calls_per_100: r.calls_per_100_per_tick(),
            per_call: r.renewals.filter(|_| calls > 0.0).map(|x| x as f64 / calls),
            bytes_acquired: r.bytes_per_lock(),
            bytes_end: r.rss_end.saturating_sub(r.rss_before) as f64 / n,
            cpu_pct: 100.0 * r.cpu.as_secs_f64() / secs,
            redis_cpu_pct: r.redis_cpu.map(|c| 100.0 * c.as_secs_f64() / secs),
        }
    }
}

/// The figures of every size that was measured, smallest first.
fn held_figures(r: &Results) -> Vec<HeldFigures> {
    r.growth
        .held
        .iter()
        .filter_map(|p| p.run.as_ref().ok())
        .map(HeldFigures::of)
        .collect()
}

/// `123 MiB`.
fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Appends the section "How cost grows" to the report, with its charts.
pub(crate) fn render(s: &mut String, r: &Results, charts: &Charts) {
    let _ = writeln!(s, "## How cost grows\n");
    render_held(s, r);
    chart_link(
        s,
        charts,
        &charts.held_growth,
        "How cost grows with the leases held",
    );
    render_handoff(s, r);
    chart_link(
        s,
        charts,
        &charts.handoff_growth,
        "Handoff p50 and p99 against waiters",
    );
}

/// The held-leases part: how it was measured, the table, what it shows.
fn render_held(s: &mut String, r: &Results) {
    let sizes: Vec<String> = r.plan.growth_held.iter().map(|&n| thousands(n)).collect();
    let _ = writeln!(s, "### Held leases: {}\n", sizes.join(" → "));
    let _ = writeln!(
        s,
        "The held-locks run above (`.lease({LEASE:?})`, renewed every ~2 s, the watchdog \
         ticking every {TICK:?}; the same code) at each size, each in a fresh process of \
         its own (this binary as a hidden `held` subcommand, a current-thread tokio runtime) \
         so that one size's freed heap does not hide the next one's growth, on the \
         held-locks scenario's redis-server (`FLUSHALL` before each), watched for {} each. \
         Script calls per tick: `evalsha` + `eval` calls of the window / ticks; client \
         memory per lease: VmRSS after acquiring minus before, / N (and at the end of the \
         window); CPU: the client process's user + system time over the window, and the \
         redis-server's (`used_cpu_sys` + `used_cpu_user` of `INFO cpu`), as a share of one \
         core. Lock keys left: `DBSIZE` after dropping every guard and awaiting \
         `client.flush()`, less the N fence counters that stay (releases that did not \
         happen; those keys expire with their lease). Peak: the process's `VmHWM`, reached \
         while the dropped guards' releases are in flight. \"took\": the whole size, from \
         starting its process to its exit (connect, acquire, window, release).\n",
        fmt_dur(r.plan.growth_window)
    );
    let _ = writeln!(
        s,
        "| leases | acquiring took | script calls / tick | per 100 leases / tick | leases renewed / call | client memory / lease (after acquiring; end of window) | client CPU, % of one core | redis-server CPU, % of one core | all alive | drop all + flush(): time; lock keys left to expire | client VmRSS: end of window; peak | took |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let peak = |p: &HeldPoint| p.peak_rss.map_or("–".to_owned(), mib);
    let mut beyond = false;
    for p in &r.growth.held {
        let run = match &p.run {
            Ok(run) => run,
            Err(e) => {
                let what = if p.failed(r.plan.held_locks) {
                    "run failed"
                } else {
                    beyond = true;
                    "did not fit"
                };
                let _ = writeln!(
                    s,
                    "| {} | {what}: {} |||||||| –; {} | {:.1} s |",
                    thousands(p.locks),
                    e.replace('|', "/"),
                    peak(p),
                    p.took.as_secs_f64()
                );
                continue;
            }
        };
        beyond |= !(p.failed(r.plan.held_locks) || run.all_alive() && run.flushed);
        let f = HeldFigures::of(run);
        let _ = writeln!(
            s,
            "| {} | {:.2} s ({:.0}/s) | {:.1} | {:.3} | {} | {:.0} B; {:.0} B | {:.2} % | {} | {} | {:.2} s{}; {} | {}; {} | {:.1} s |",
            thousands(run.locks),
            run.acquire_time.as_secs_f64(),
            run.locks as f64 / run.acquire_time.as_secs_f64(),
            f.calls_per_tick,
            f.calls_per_100,
            f.per_call.map_or("–".to_owned(), |c| format!("{c:.0}")),
            f.bytes_acquired,
            f.bytes_end,
            f.cpu_pct,
            f.redis_cpu_pct
                .map_or("–".to_owned(), |c| format!("{c:.2} %")),
            yes_no(run.all_alive()),
            run.release_time.as_secs_f64(),
            if run.flushed { "" } else { " (**timed out**)" },
            thousands(run.dbsize_released.saturating_sub(run.locks as u64) as usize),
            mib(run.rss_end),
            peak(p),
            p.took.as_secs_f64(),
        );
    }
    let _ = writeln!(s);
    if beyond {
        let _ = writeln!(
            s,
            "Sizes above the held-locks row's {} that failed are reported, not counted as a \
             failed run: they show where one client on one redis-server stops keeping up on \
             this machine. The watchdog sends the batches of a tick (about N/2 leases, one \
             call per {} of them) one after another, so an acquire waits behind one batch at \
             most; but each renewal costs the server about 4 µs, and N leases of {:?} renewed \
             every third of it ask N × 4 µs / {:?} of the server's time per second: about \
             2 s per second for 1,000,000 leases, which no single redis-server gives, while \
             the default 30 s lease would ask about 0.4 s per second.\n",
            thousands(r.plan.held_locks),
            thousands(RENEWAL_BATCH),
            LEASE,
            LEASE / 3,
        );
    }
    let figures = held_figures(r);
    if let (Some(a), Some(b)) = (figures.first(), figures.last())
        && figures.len() > 1
    {
        let grown = b.locks as f64 / a.locks as f64;
        let (lo, hi) = figures.iter().fold((f64::MAX, 0f64), |(lo, hi), f| {
            (lo.min(f.bytes_acquired), hi.max(f.bytes_acquired))
        });
        let _ = writeln!(
            s,
            "What it shows: from {} to {} leases ({grown:.0}x), the watchdog's script calls \
             per tick grow from {:.1} to {:.1} ({:.0}x: one call per batch of up to a \
             thousand leases, so per 100 leases they go from {:.3} to {:.3}), client memory \
             per lease stays between {lo:.0} and {hi:.0} B, and the client's CPU grows from \
             {:.2} % to {:.2} % of one core ({:.0}x){}.\n",
            thousands(a.locks),
            thousands(b.locks),
            a.calls_per_tick,
            b.calls_per_tick,
            b.calls_per_tick / a.calls_per_tick,
            a.calls_per_100,
            b.calls_per_100,
            a.cpu_pct,
            b.cpu_pct,
            b.cpu_pct / a.cpu_pct,
            match (a.redis_cpu_pct, b.redis_cpu_pct) {
                (Some(x), Some(y)) => format!(", the redis-server's from {x:.2} % to {y:.2} %"),
                _ => String::new(),
            },
        );
    }
}

/// The handoff part: how it was measured (and where the waiters run), the table, what
/// it shows.
fn render_handoff(s: &mut String, r: &Results) {
    let waiters = r.plan.growth_waiters;
    let list: Vec<String> = waiters.iter().map(|w| w.to_string()).collect();
    let most = waiters.iter().max().copied().unwrap_or(1);
    let spread = launcher::spread(most + 1);
    let _ = writeln!(s, "### Handoff against waiters: {}\n", list.join(", "));
    let measured_here: Vec<String> = waiters
        .iter()
        .filter(|w| !WAITERS.contains(w))
        .map(|w| w.to_string())
        .collect();
    let _ = writeln!(
        s,
        "fencelock's handoff (plain and `fair()`), measured as in the handoff section (same \
         worker, strict handoff, hold {HANDOFF_HOLD:?}, {} per row). The rows at {} waiters \
         are that section's; those at {} were measured for this section, right after it. \
         Placement: the waiters + 1 contenders are tokio tasks spread over at most \
         {MAX_PROCS} worker processes (this binary as `worker`), each process with one \
         fencelock client shared by its tasks plus one connection per task for the \
         harness's bookkeeping (`BLPOP`); at {most} waiters that is {} processes of {}–{} \
         tasks, {} connections to Redis, all on the same {} CPUs as the redis-server. \
         Samples are handoffs to a waiter in another process; \"+ same process\" counts the \
         handoffs to a waiter in the releaser's own process, not sampled. A p99 of fewer \
         than a few hundred samples is a rough figure.\n",
        fmt_dur(r.plan.handoff_run),
        WAITERS
            .iter()
            .filter(|w| waiters.contains(w))
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        measured_here.join(", "),
        spread.len(),
        spread.iter().min().copied().unwrap_or(0),
        spread.iter().max().copied().unwrap_or(0),
        most + 1 + 2 * spread.len(),
        r.nproc,
    );
    let _ = writeln!(
        s,
        "| waiters | processes × contenders | fencelock samples (+ same process) | fencelock p50 | fencelock p99 | fair() samples (+ same process) | fair() p50 | fair() p99 | errors |\n|---|---|---|---|---|---|---|---|---|"
    );
    let cell = |row: Option<&HandoffRow>| {
        let same = row.map_or(0, |h| h.report.same_process);
        match row.and_then(|h| h.summary) {
            Some(sm) => (
                format!("{} (+{same})", sm.n),
                fmt_ns(sm.p50),
                fmt_ns(sm.p99),
            ),
            None => (format!("0 (+{same})"), "–".to_owned(), "–".to_owned()),
        }
    };
    for &w in waiters {
        let plain = handoff_row(r, Peer::Fencelock, w);
        let fair = handoff_row(r, Peer::FencelockFair, w);
        let tasks = launcher::spread(w + 1);
        let procs = tasks.len();
        let (lo, hi) = (
            tasks.iter().min().copied().unwrap_or(0),
            tasks.iter().max().copied().unwrap_or(0),
        );
        let errors: Vec<String> = [plain, fair]
            .into_iter()
            .flatten()
            .filter_map(|h| {
                h.error
                    .clone()
                    .or_else(|| h.report.errors.first().cloned())
                    .map(|e| format!("{}: {}", h.peer.label(), e.replace('|', "/")))
            })
            .collect();
        let (pn, p50, p99) = cell(plain);
        let (fnn, f50, f99) = cell(fair);
        let _ = writeln!(
            s,
            "| {w} | {procs} × {} | {pn} | {p50} | {p99} | {fnn} | {f50} | {f99} | {} |",
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}–{hi}")
            },
            if errors.is_empty() {
                "0".to_owned()
            } else {
                errors.join("; ")
            },
        );
    }
    let _ = writeln!(s);
    // The range of p50 and p99 of `peer` over the waiter counts, and their values at
    // the fewest and the most waiters.
    let spans = |peer: Peer| {
        let sums: Vec<_> = waiters
            .iter()
            .filter_map(|&w| handoff_row(r, peer, w)?.summary)
            .collect();
        let (first, last) = (sums.first()?, sums.last()?);
        let span = |f: fn(&crate::latency::Summary) -> u64| {
            let lo = sums.iter().map(f).min().unwrap_or(0);
            let hi = sums.iter().map(f).max().unwrap_or(0);
            format!(
                "between {} and {} ({} → {})",
                fmt_ns(lo),
                fmt_ns(hi),
                fmt_ns(f(first)),
                fmt_ns(f(last))
            )
        };
        Some((span(|s| s.p50), span(|s| s.p99)))
    };
    if let (Some((p50, p99)), Some((f50, f99)), Some(&w1), Some(&wn)) = (
        spans(Peer::Fencelock),
        spans(Peer::FencelockFair),
        waiters.first(),
        waiters.last(),
    ) {
        let _ = writeln!(
            s,
            "What it shows: from {w1} to {wn} waiters, fencelock's handoff p50 stays {p50} \
             and its p99 {p99}; with `fair()`, p50 {f50} and p99 {f99}.\n",
        );
    }
}

/// How [`draw`] writes one chart: its file name and what draws it at a path; the file
/// name if it was written.
pub(crate) type DrawFn<'a> =
    dyn FnMut(&str, &dyn Fn(&Path) -> Result<(), String>) -> Option<String> + 'a;

/// One point of the handoff chart: waiters, p50 and p99 (ns).
type HandoffPoint = (usize, u64, u64);

/// Draws `held-growth.png` and `handoff-growth.png` into `dir` with `draw` (which
/// reports each file written or its error); the files written.
pub(crate) fn draw(r: &Results, draw: &mut DrawFn<'_>) -> (Option<String>, Option<String>) {
    let figures = held_figures(r);
    let held = if figures.is_empty() {
        None
    } else {
        draw("held-growth.png", &|p| held_chart(p, &figures))
    };
    let rows: Vec<(Peer, Vec<HandoffPoint>)> = HANDOFF_PEERS
        .iter()
        .map(|&peer| {
            let points = r
                .plan
                .growth_waiters
                .iter()
                .filter_map(|&w| {
                    let sm = handoff_row(r, peer, w)?.summary?;
                    Some((w, sm.p50, sm.p99))
                })
                .collect();
            (peer, points)
        })
        .collect();
    let handoff = if rows.iter().all(|(_, p)| p.is_empty()) {
        None
    } else {
        draw("handoff-growth.png", &|p| handoff_chart(p, &rows))
    };
    (held, handoff)
}

/// The `(lo, hi)` of `values` (positive), widened to whole powers of ten for a log axis
/// (whose labels are at powers of ten); `default` without any.
fn log_range(values: impl Iterator<Item = f64>, default: (f64, f64)) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        default
    } else {
        (
            10f64.powf((lo * 0.9).log10().floor()),
            10f64.powf((hi * 1.1).log10().ceil()),
        )
    }
}

/// `1k`, `10k`, `1M`.
fn fmt_count(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// One line of a panel: its label, colour, points and whether it is dashed.
type Line<'a> = (&'a str, RGBAColor, Vec<(f64, f64)>, bool);

/// One panel of the held-leases chart, but for its lines.
struct Panel<'a> {
    title: &'a str,
    y_desc: &'a str,
    /// The x range (held leases, log scale).
    x: (f64, f64),
    y: (f64, f64),
    log_y: bool,
    /// A horizontal target line: its value and label.
    target: Option<(f64, &'a str)>,
}

/// Draws `lines` over held leases (log x) in `area`, as `spec` says.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    spec: &Panel<'_>,
    lines: &[Line<'_>],
) -> Result<(), String> {
    let Panel {
        title,
        y_desc,
        x,
        y,
        log_y,
        target,
    } = *spec;
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60);
    // One body for both kinds of y axis (their charts are of different types).
    macro_rules! draw_on {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc("leases held (log scale)")
                .y_desc(y_desc)
                .label_style((FONT, 13))
                .axis_desc_style((FONT, 14))
                .x_label_formatter(&|v| fmt_count(*v))
                .y_label_formatter(&|v| if log_y { fmt_ms(*v) } else { format!("{v:.0}") })
                .draw()
                .map_err(err)?;
            for (label, color, points, dashed) in lines {
                let color = *color;
                let style = color.stroke_width(2);
                if *dashed {
                    chart
                        .draw_series(DashedLineSeries::new(points.clone(), 8, 5, style))
                        .map_err(err)?
                        .label(*label)
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                        });
                } else {
                    chart
                        .draw_series(LineSeries::new(points.clone(), style))
                        .map_err(err)?
                        .label(*label)
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                        });
                }
                chart
                    .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
                    .map_err(err)?;
            }
            if let Some((value, label)) = target {
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(x.0, value), (x.1, value)],
                        RED.stroke_width(1),
                    )))
                    .map_err(err)?
                    .label(label)
                    .legend(|(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .label_font((FONT, 13))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(err)?;
        }};
    }
    if log_y {
        draw_on!(
            builder
                .build_cartesian_2d((x.0..x.1).log_scale(), (y.0..y.1).log_scale())
                .map_err(err)?
        );
    } else {
        draw_on!(
            builder
                .build_cartesian_2d((x.0..x.1).log_scale(), y.0..y.1)
                .map_err(err)?
        );
    }
    Ok(())
}

/// The held-leases chart: script calls per tick, client memory per lease and CPU, each
/// against the leases held (log x), in three panels side by side.
fn held_chart(path: &Path, figures: &[HeldFigures]) -> Result<(), String> {
    let root = BitMapBackend::new(path, HELD_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            "How cost grows with the leases held (watchdog on, one client)",
            (FONT, 22),
        )
        .map_err(err)?;
    let panels = root.split_evenly((1, 3));
    let n = |f: &HeldFigures| f.locks as f64;
    let (x0, x1) = figures
        .iter()
        .map(n)
        .fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let x = (x0 / 1.6, x1 * 1.6);
    let (blue, grey, green) = (BLUE.to_rgba(), BLACK.mix(0.6), GREEN.mix(0.9));

    let calls: Vec<(f64, f64)> = figures.iter().map(|f| (n(f), f.calls_per_tick)).collect();
    let per_100: Vec<(f64, f64)> = figures.iter().map(|f| (n(f), f.calls_per_100)).collect();
    let y = log_range(
        calls
            .iter()
            .chain(&per_100)
            .map(|p| p.1)
            .chain([held::TARGET_CALLS_PER_100]),
        (0.01, 1000.0),
    );
    panel(
        &panels[0],
        &Panel {
            title: "Script calls per renewal tick",
            y_desc: "calls (log scale)",
            x,
            y,
            log_y: true,
            target: Some((held::TARGET_CALLS_PER_100, "target: 1 per 100 leases")),
        },
        &[
            ("calls / tick", blue, calls, false),
            ("calls / tick per 100 leases", grey, per_100, true),
        ],
    )?;

    let acquired: Vec<(f64, f64)> = figures.iter().map(|f| (n(f), f.bytes_acquired)).collect();
    let end: Vec<(f64, f64)> = figures.iter().map(|f| (n(f), f.bytes_end)).collect();
    let top = acquired
        .iter()
        .chain(&end)
        .map(|p| p.1)
        .fold(held::TARGET_BYTES_PER_LOCK, f64::max);
    panel(
        &panels[1],
        &Panel {
            title: "Client memory per lease",
            y_desc: "bytes (VmRSS growth / leases)",
            x,
            y: (0.0, top * 1.25),
            log_y: false,
            target: Some((held::TARGET_BYTES_PER_LOCK, "target: under 1 KiB")),
        },
        &[
            ("after acquiring", blue, acquired, false),
            ("end of the window", grey, end, true),
        ],
    )?;

    let client: Vec<(f64, f64)> = figures.iter().map(|f| (n(f), f.cpu_pct)).collect();
    let server: Vec<(f64, f64)> = figures
        .iter()
        .filter_map(|f| Some((n(f), f.redis_cpu_pct?)))
        .collect();
    let y = log_range(client.iter().chain(&server).map(|p| p.1), (0.01, 100.0));
    let mut lines = vec![("client", blue, client, false)];
    if !server.is_empty() {
        lines.push(("redis-server", green, server, true));
    }
    panel(
        &panels[2],
        &Panel {
            title: "CPU over the window",
            y_desc: "% of one core (log scale)",
            x,
            y,
            log_y: true,
            target: None,
        },
        &lines,
    )?;
    root.present().map_err(err)
}

/// The handoff chart: p50 (solid) and p99 (dashed) against waiters, one colour per lock,
/// log-log.
fn handoff_chart(path: &Path, rows: &[(Peer, Vec<HandoffPoint>)]) -> Result<(), String> {
    let ms = |ns: u64| ns as f64 / 1e6;
    let (lo, hi) = log_range(
        rows.iter()
            .flat_map(|(_, p)| p.iter().flat_map(|&(_, a, b)| [ms(a), ms(b)])),
        (0.01, 1000.0),
    );
    let xmax = rows
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .max()
        .unwrap_or(256) as f64;
    let root = BitMapBackend::new(path, HANDOFF_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Handoff against waiters: release to next holder in another process",
            (FONT, 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((0.8f64..xmax * 1.3).log_scale(), (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("waiters (log scale)")
        .y_desc("handoff, ms (log scale)")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 16))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| fmt_ms(*v))
        .draw()
        .map_err(err)?;
    for (i, (peer, points)) in rows.iter().enumerate() {
        let color = color(peer.label(), i);
        let p50: Vec<(f64, f64)> = points.iter().map(|&(w, a, _)| (w as f64, ms(a))).collect();
        let p99: Vec<(f64, f64)> = points.iter().map(|&(w, _, b)| (w as f64, ms(b))).collect();
        chart
            .draw_series(LineSeries::new(p50.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(format!("{} p50", peer.label()))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        chart
            .draw_series(DashedLineSeries::new(
                p99.clone(),
                8,
                5,
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(format!("{} p99", peer.label()))
            .legend(move |(x, y)| {
                DashedPathElement::new(vec![(x, y), (x + 24, y)], 6, 3, color.stroke_width(2))
            });
        chart
            .draw_series(p50.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .map_err(err)?;
        chart
            .draw_series(
                p99.into_iter()
                    .map(|p| TriangleMarker::new(p, 5, color.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> HeldRun {
        HeldRun {
            locks: 1000,
            acquire_time: Duration::from_millis(25),
            window: Duration::from_secs(5),
            evalsha: 5,
            eval: 0,
            renewals: Some(2500),
            cpu: Duration::from_millis(12),
            rss_before: 1 << 20,
            rss_acquired: 2 << 20,
            rss_end: 3 << 20,
            dbsize: 2000,
            lost: 0,
            watched: 1000,
            release_time: Duration::from_millis(9),
            flushed: true,
            dbsize_released: 1000,
            redis_cpu: None,
        }
    }

    #[test]
    fn the_held_subcommand_output_reads_back() {
        let mut out = String::new();
        for (k, v) in encode(&run()) {
            out.push_str(&format!("{k} {v}\n"));
        }
        let back = decode(&format!("{out}done\n")).expect("decodes");
        assert_eq!(back.locks, 1000);
        assert_eq!(back.window, Duration::from_secs(5));
        assert_eq!(back.renewals, Some(2500));
        assert_eq!(back.redis_cpu, None);
        assert!(back.flushed && back.all_alive());
        assert!(decode(&out).is_err(), "no done, no run");
        assert_eq!(decode("error boom\n").err().as_deref(), Some("boom"));
    }

    #[test]
    fn counts_print_with_separators() {
        assert_eq!(thousands(1_000_000), "1,000,000");
        assert_eq!(thousands(100), "100");
        assert_eq!(fmt_count(1e6), "1M");
        assert_eq!(fmt_count(10_000.0), "10k");
    }
}
