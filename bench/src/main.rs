//! `fencelock-bench`: how fast a released fencelock reaches a waiter in another process,
//! compared with a polling lock, and how fairly contenders share it; what Redlock adds
//! to an uncontended acquire + release; and what keeping many leases alive costs.
//!
//! One run starts throwaway `redis-server`s (testkit): one for the handoff and fairness
//! runs and the single-node latency, five for Redlock, one for the held-locks run. It
//! measures, and prints a markdown report on stdout (progress goes to stderr).
//! Contenders run in worker processes: this binary re-executed as the hidden `worker`
//! subcommand.

mod affinity;
mod clock;
mod held;
mod latency;
mod spawn;
mod worker;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;

use crate::spawn::{Report, Workers};
use crate::worker::{LockKind, Scenario, WorkerArgs};

/// Benchmarks fencelock's release-to-waiter handoff and fairness on a throwaway
/// redis-server, and prints the results as markdown.
#[derive(Parser, Debug)]
#[command(name = "fencelock-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Short run (under 2 minutes): 3 s per fencelock handoff row (5 s polling), 2 s
    /// per fairness cell, 2,000 latency cycles per client, 20,000 held locks watched
    /// for 10 s.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Full run (the default; about 5 minutes): 10 s per fencelock handoff row (20 s
    /// polling), 10 s per fairness cell, 20,000 latency cycles per client, 100,000 held
    /// locks watched for 20 s.
    #[arg(long)]
    full: bool,
    /// Also write the markdown report to FILE.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Internal: one worker process of a run (started by the harness).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

/// At most this many worker processes per scenario (the machine may have 2 cores).
const MAX_PROCS: usize = 8;
/// How long a handoff contender holds the lock (tokio's timer has 1 ms resolution, so
/// the real hold is 1 to 2 ms).
const HANDOFF_HOLD: Duration = Duration::from_millis(1);
/// Waiters (contenders minus the holder) of the handoff rows.
const WAITERS: [usize; 3] = [1, 8, 64];
/// Contenders of the fairness grid.
const GRID_CLIENTS: [usize; 3] = [2, 8, 32];
/// Hold times of the fairness grid.
const GRID_HOLDS_MS: [u64; 3] = [0, 1, 10];
/// Polling lock: redis-py's `Lock(sleep=0.1)` default.
const POLL_SLEEP_MS: u64 = 100;
/// Targets from the issue.
const TARGET_P50: Duration = Duration::from_millis(1);
const TARGET_P99: Duration = Duration::from_millis(5);
const TARGET_RATIO: f64 = 20.0;
const TARGET_FAIRNESS: f64 = 0.8;

struct Plan {
    name: &'static str,
    pings: usize,
    handoff_run: Duration,
    poll_run: Duration,
    grid_run: Duration,
    /// Acquire + release cycles per client (single node, Redlock).
    latency_cycles: usize,
    /// Locks held at once with the watchdog on, and how long they are watched.
    held_locks: usize,
    held_window: Duration,
}

const QUICK: Plan = Plan {
    name: "quick",
    pings: 5_000,
    handoff_run: Duration::from_secs(3),
    poll_run: Duration::from_secs(5),
    grid_run: Duration::from_secs(2),
    latency_cycles: 2_000,
    held_locks: 20_000,
    held_window: Duration::from_secs(10),
};

const FULL: Plan = Plan {
    name: "full",
    pings: 50_000,
    handoff_run: Duration::from_secs(10),
    poll_run: Duration::from_secs(20),
    grid_run: Duration::from_secs(10),
    latency_cycles: 20_000,
    held_locks: 100_000,
    held_window: Duration::from_secs(20),
};

fn main() {
    let cli = Cli::parse();
    if let Some(Command::Worker(args)) = cli.command {
        std::process::exit(worker::run(args));
    }
    let plan = if cli.quick { &QUICK } else { &FULL };
    // Started from the main thread, which lives as long as the server should
    // (testkit ties the server's PR_SET_PDEATHSIG to the starting thread).
    let server = testkit::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (report, failed) = runtime.block_on(bench(plan, &server));
    print!("{report}");
    if let Some(path) = &cli.out
        && let Err(e) = std::fs::write(path, &report)
    {
        eprintln!("cannot write {}: {e}", path.display());
        std::process::exit(1);
    }
    drop(runtime);
    drop(server);
    if failed {
        eprintln!("some measurements failed; see the report");
        std::process::exit(1);
    }
}

/// Nodes of the Redlock client.
const REDLOCK_NODES: usize = 5;

/// The servers of the scenarios that do not use the main one.
struct Servers {
    /// Independent nodes for the Redlock client.
    redlock: Vec<testkit::RedisServer>,
    /// The held-locks scenario's own node.
    held: testkit::RedisServer,
}

/// Pins the harness thread to the first CPU it may use and every server to the others
/// (round robin), until the result is dropped; and says where each runs.
fn pin_for_latency(
    main: &testkit::RedisServer,
    redlock: &[testkit::RedisServer],
) -> (affinity::Pins, String) {
    let cpus = affinity::allowed_cpus();
    if cpus.len() < 2 {
        return (
            affinity::Pins::default(),
            format!("not pinned ({} CPU allowed)", cpus.len()),
        );
    }
    let (client, rest) = (cpus[0], &cpus[1..]);
    let mut pins = affinity::Pins::default();
    let pinned = (|| {
        pins.pin_thread(client)?;
        pins.pin_process(main.pid(), rest[0])?;
        for (i, s) in redlock.iter().enumerate() {
            pins.pin_process(s.pid(), rest[i % rest.len()])?;
        }
        Ok::<_, std::io::Error>(())
    })();
    if let Err(e) = pinned {
        drop(pins);
        return (affinity::Pins::default(), format!("not pinned ({e})"));
    }
    let placement = if rest.len() == 1 {
        format!(
            "the harness (one thread) pinned to CPU {client}, every redis-server to CPU {}",
            rest[0]
        )
    } else {
        let nodes: Vec<String> = (0..redlock.len())
            .map(|i| rest[i % rest.len()].to_string())
            .collect();
        format!(
            "the harness (one thread) pinned to CPU {client}, the single node to CPU {}, the \
             Redlock nodes to CPUs {}",
            rest[0],
            nodes.join(", ")
        )
    };
    (pins, placement)
}

/// Latency percentiles of one set of samples (ns).
#[derive(Clone, Copy, Debug)]
struct Summary {
    n: u64,
    p50: u64,
    p99: u64,
    max: u64,
}

fn summarize(samples: &[u64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram");
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

/// `12.3 µs`, `123 µs`, `4.56 ms`, `1.23 s`.
fn fmt_ns(ns: u64) -> String {
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

fn yes_no(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

/// Spreads `contenders` over at most [`MAX_PROCS`] processes: tasks per process.
fn spread(contenders: usize) -> Vec<usize> {
    let procs = contenders.clamp(1, MAX_PROCS);
    (0..procs)
        .map(|i| contenders / procs + usize::from(i < contenders % procs))
        .collect()
}

fn fmt_spread(tasks: &[usize]) -> String {
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

struct Run {
    scenario: Scenario,
    lock: LockKind,
    name: String,
    contenders: usize,
    hold: Duration,
    duration: Duration,
}

/// Runs one scenario over worker processes; the merged reports.
async fn run_workers(exe: &Path, url: &str, run: &Run) -> Result<(Vec<usize>, Report), String> {
    let tasks = spread(run.contenders);
    let arg_lists: Vec<Vec<String>> = tasks
        .iter()
        .enumerate()
        .map(|(proc_index, t)| {
            let scenario = match run.scenario {
                Scenario::Handoff => "handoff",
                Scenario::Grid => "grid",
            };
            let lock = match run.lock {
                LockKind::Plain => "plain",
                LockKind::Fair => "fair",
                LockKind::Poll => "poll",
            };
            [
                "--url",
                url,
                "--scenario",
                scenario,
                "--lock",
                lock,
                "--name",
                &run.name,
                "--tasks",
                &t.to_string(),
                "--hold-us",
                &run.hold.as_micros().to_string(),
                "--duration-ms",
                &run.duration.as_millis().to_string(),
                "--poll-sleep-ms",
                &POLL_SLEEP_MS.to_string(),
                "--proc-index",
                &proc_index.to_string(),
                "--procs",
                &tasks.len().to_string(),
                "--contenders",
                &run.contenders.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        })
        .collect();
    let workers = Workers::start(exe, &arg_lists).await?;
    let reports = workers.run(run.duration).await?;
    let mut merged = Report::default();
    for r in reports {
        merged.samples.extend(r.samples);
        merged.counts.extend(r.counts);
        merged.acquisitions += r.acquisitions;
        merged.same_process += r.same_process;
        merged.late += r.late;
        merged.max_wait = merged.max_wait.max(r.max_wait);
        merged.errors.extend(r.errors);
    }
    Ok((tasks, merged))
}

fn machine() -> (String, String) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned());
    (cpu, load)
}

struct HandoffRow {
    lock: LockKind,
    waiters: usize,
    tasks: Vec<usize>,
    summary: Option<Summary>,
    report: Report,
    error: Option<String>,
}

struct GridRow {
    lock: LockKind,
    clients: usize,
    hold_ms: u64,
    tasks: Vec<usize>,
    report: Report,
    duration: Duration,
    error: Option<String>,
}

/// Runs everything; the markdown report and whether anything failed.
async fn bench(plan: &Plan, server: &testkit::RedisServer) -> (String, bool) {
    let started = Instant::now();
    let url = server.url();
    let exe = std::env::current_exe().expect("path of this binary");
    let mut failed = false;
    let (cpu, load_before) = machine();
    let info = server.cmd(&["INFO", "server"]);
    let redis_version = info
        .as_str()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("redis_version:")))
        .unwrap_or("unknown")
        .trim()
        .to_owned();
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());

    // 1. Baseline.
    eprintln!("baseline: {} PINGs", plan.pings);
    let ping = match ping_baseline(&url, plan.pings).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("PING baseline failed: {e}");
            return (format!("PING baseline failed: {e}\n"), true);
        }
    };

    // The other scenarios' servers, started after the baseline so it is taken with only
    // the main server running, as before they existed. Still on the main thread (the
    // current-thread runtime polls this future on the thread that called `block_on`),
    // which testkit ties their PR_SET_PDEATHSIG to; dropped at the end of this function.
    let servers = Servers {
        redlock: testkit::RedisServer::start_many(REDLOCK_NODES),
        held: testkit::RedisServer::start(),
    };

    // 2. Uncontended acquire + release, single node vs Redlock.
    eprintln!(
        "latency: {} acquire + release cycles, single node and Redlock over {REDLOCK_NODES} nodes",
        plan.latency_cycles
    );
    let redlock_urls: Vec<String> = servers.redlock.iter().map(|s| s.url()).collect();
    let latency = latency::run(&url, &redlock_urls, plan.latency_cycles, || {
        pin_for_latency(server, &servers.redlock)
    })
    .await;
    if let Err(e) = &latency {
        eprintln!("latency run failed: {e}");
        failed = true;
    }

    // 3. Handoff.
    let mut handoff = Vec::new();
    for lock in [LockKind::Plain, LockKind::Fair, LockKind::Poll] {
        for waiters in WAITERS {
            let duration = if lock == LockKind::Poll {
                plan.poll_run
            } else {
                plan.handoff_run
            };
            let run = Run {
                scenario: Scenario::Handoff,
                lock,
                name: format!("handoff-{lock:?}-{waiters}").to_lowercase(),
                contenders: waiters + 1,
                hold: HANDOFF_HOLD,
                duration,
            };
            eprintln!(
                "handoff: {} with {waiters} waiters, {duration:?}",
                lock.label()
            );
            let (tasks, report, error) = match run_workers(&exe, &url, &run).await {
                Ok((t, r)) => (t, r, None),
                Err(e) => (spread(run.contenders), Report::default(), Some(e)),
            };
            failed |= error.is_some() || !report.errors.is_empty();
            handoff.push(HandoffRow {
                lock,
                waiters,
                tasks,
                summary: summarize(&report.samples),
                report,
                error,
            });
        }
    }

    // 4. Fairness grid.
    let mut grid = Vec::new();
    for lock in [LockKind::Plain, LockKind::Fair] {
        for clients in GRID_CLIENTS {
            for hold_ms in GRID_HOLDS_MS {
                let run = Run {
                    scenario: Scenario::Grid,
                    lock,
                    name: format!("grid-{lock:?}-{clients}-{hold_ms}").to_lowercase(),
                    contenders: clients,
                    hold: Duration::from_millis(hold_ms),
                    duration: plan.grid_run,
                };
                eprintln!(
                    "grid: {} with {clients} clients, hold {hold_ms} ms, {:?}",
                    lock.label(),
                    plan.grid_run
                );
                let (tasks, report, error) = match run_workers(&exe, &url, &run).await {
                    Ok((t, r)) => (t, r, None),
                    Err(e) => (spread(clients), Report::default(), Some(e)),
                };
                failed |= error.is_some() || !report.errors.is_empty();
                grid.push(GridRow {
                    lock,
                    clients,
                    hold_ms,
                    tasks,
                    report,
                    duration: plan.grid_run,
                    error,
                });
            }
        }
    }

    // 5. Many locks held at once, watchdog on.
    eprintln!(
        "held: {} locks with a {:?} lease, watched for {:?}",
        plan.held_locks,
        held::LEASE,
        plan.held_window
    );
    let held = held::run(&servers.held.url(), plan.held_locks, plan.held_window).await;
    match &held {
        Err(e) => {
            eprintln!("held-locks run failed: {e}");
            failed = true;
        }
        Ok(h) if !h.all_alive() || !h.flushed => {
            eprintln!("held-locks run: not every lease stayed alive, or releases timed out");
            failed = true;
        }
        Ok(_) => {}
    }

    eprintln!("baseline again: {} PINGs", plan.pings);
    let ping_after = ping_baseline(&url, plan.pings).await.ok();
    let (_, load_after) = machine();
    let md = render(&RenderInput {
        plan,
        nproc,
        cpu: &cpu,
        load: (&load_before, &load_after),
        redis_version: &redis_version,
        ping: &ping,
        ping_after: ping_after.as_ref(),
        handoff: &handoff,
        grid: &grid,
        latency: &latency,
        held: &held,
        elapsed: started.elapsed(),
    });
    (md, failed)
}

async fn ping_baseline(url: &str, n: usize) -> Result<Summary, String> {
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

struct RenderInput<'a> {
    plan: &'a Plan,
    nproc: usize,
    cpu: &'a str,
    load: (&'a str, &'a str),
    redis_version: &'a str,
    ping: &'a Summary,
    ping_after: Option<&'a Summary>,
    handoff: &'a [HandoffRow],
    grid: &'a [GridRow],
    latency: &'a Result<latency::LatencyRun, String>,
    held: &'a Result<held::HeldRun, String>,
    elapsed: Duration,
}

fn render(input: &RenderInput<'_>) -> String {
    let mut s = String::new();
    let ping = input.ping;
    let rtts = |ns: u64| format!("{:.1}", ns as f64 / ping.p50 as f64);
    let _ = writeln!(s, "# fencelock-bench ({} run)\n", input.plan.name);
    let _ = writeln!(s, "## Machine\n");
    let _ = writeln!(s, "- nproc: {}", input.nproc);
    let _ = writeln!(s, "- CPU: {}", input.cpu);
    let _ = writeln!(
        s,
        "- redis-server {} (throwaway, loopback, no persistence; started by testkit: one for the handoff, fairness and single-node latency runs, five for Redlock, one for the held-locks run)",
        input.redis_version
    );
    let _ = writeln!(
        s,
        "- load average (1/5/15 min) before: {}, after: {}",
        input.load.0, input.load.1
    );
    let _ = writeln!(s, "- run time: {:.0} s\n", input.elapsed.as_secs_f64());

    let _ = writeln!(s, "## Baseline: PING round trip\n");
    let _ = writeln!(
        s,
        "redis-rs multiplexed connection, one PING at a time, {} samples after warm-up, \
         before the runs (the unit: \"RTTs\" below are multiples of its p50) and again \
         after them (how much the machine drifted).\n",
        ping.n
    );
    let _ = writeln!(s, "| when | p50 | p99 | max |\n|---|---|---|---|");
    for (when, p) in [("before", Some(ping)), ("after", input.ping_after)] {
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

    let _ = writeln!(s, "## Handoff latency\n");
    let _ = writeln!(
        s,
        "From just before the holder's release (its stamp write, then release) until a \
         waiter in another OS process holds the lock, by CLOCK_MONOTONIC. Contenders \
         (waiters + 1) are tokio tasks over up to {MAX_PROCS} processes; hold {:?} \
         (1–2 ms with tokio's timer). Strict handoff: a releaser waits until another \
         contender took the lock before it contends again, so every release has waiters. \
         Contenders start at evenly spread offsets over one polling interval \
         ({POLL_SLEEP_MS} ms), so the polling waiters' phases are spread (their best \
         case). A sample counts only if the previous holder was another process and the \
         new holder was already waiting at the release. {} per fencelock row, {} per \
         polling row.\n",
        HANDOFF_HOLD,
        fmt_dur(input.plan.handoff_run),
        fmt_dur(input.plan.poll_run)
    );
    let _ = writeln!(
        s,
        "| lock | waiters | processes × tasks | samples | p50 | p99 | max | p50 (RTTs) | p99 (RTTs) | not sampled (same process / not waiting) | errors |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for row in input.handoff {
        let (n, p50, p99, max, r50, r99) = match row.summary {
            Some(sum) => (
                sum.n.to_string(),
                fmt_ns(sum.p50),
                fmt_ns(sum.p99),
                fmt_ns(sum.max),
                rtts(sum.p50),
                rtts(sum.p99),
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
            "| {} | {} | {} | {n} | {p50} | {p99} | {max} | {r50} | {r99} | {} / {} | {} |",
            row.lock.label(),
            row.waiters,
            fmt_spread(&row.tasks),
            row.report.same_process,
            row.report.late,
            errors_cell(&row.report.errors, row.error.as_deref()),
        );
    }
    let _ = writeln!(s);

    let _ = writeln!(s, "## Targets: fencelock vs the polling lock\n");
    let _ = writeln!(
        s,
        "Targets: p50 < {:?} and p99 < {:?} on loopback, and at least {TARGET_RATIO}x lower \
         than the polling lock (ratio = polling / fencelock, at p50 and at p99). N polling \
         waiters at spread phases poll, together, every {POLL_SLEEP_MS}/N ms, so the \
         polling lock's handoff shrinks as waiters are added.\n",
        TARGET_P50, TARGET_P99
    );
    let _ = writeln!(
        s,
        "| lock | waiters | p50 ratio | p99 ratio | p50 < 1 ms | p99 < 5 ms | ≥ 20x at p50 and p99 |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for lock in [LockKind::Plain, LockKind::Fair] {
        for waiters in WAITERS {
            let find = |l: LockKind| {
                input
                    .handoff
                    .iter()
                    .find(|r| r.lock == l && r.waiters == waiters)
                    .and_then(|r| r.summary)
            };
            let (Some(f), Some(p)) = (find(lock), find(LockKind::Poll)) else {
                let _ = writeln!(s, "| {} | {waiters} | – | – | – | – | – |", lock.label());
                continue;
            };
            let r50 = p.p50 as f64 / f.p50 as f64;
            let r99 = p.p99 as f64 / f.p99 as f64;
            let _ = writeln!(
                s,
                "| {} | {waiters} | {r50:.0}x | {r99:.0}x | {} | {} | {} |",
                lock.label(),
                yes_no(f.p50 < TARGET_P50.as_nanos() as u64),
                yes_no(f.p99 < TARGET_P99.as_nanos() as u64),
                yes_no(r50 >= TARGET_RATIO && r99 >= TARGET_RATIO),
            );
        }
    }
    let _ = writeln!(s);

    let _ = writeln!(s, "## Fairness grid\n");
    let _ = writeln!(
        s,
        "python-redis-lock's method: every contender loops acquire (wait for ever) → hold → \
         release for {} per cell (a releaser contends again at once); acquisitions \
         counted per contender. Contenders are tokio tasks over up to {MAX_PROCS} \
         processes (one fencelock Client per process), all starting at one time. Holds \
         are tokio sleeps (1 ms ≈ 1–2 ms). Longest wait: the longest single acquire of \
         any contender (the cell length means one never got the lock). Target: fair mode min/max ≥ {TARGET_FAIRNESS}.\n",
        fmt_dur(input.plan.grid_run)
    );
    let _ = writeln!(
        s,
        "| mode | clients | hold | processes × tasks | min / client | max / client | min/max | total / s | longest wait | target met | errors |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for row in input.grid {
        let counts = &row.report.counts;
        let min = counts.iter().min().copied().unwrap_or(0);
        let max = counts.iter().max().copied().unwrap_or(0);
        let complete = counts.len() == row.clients;
        let ratio = if max > 0 && complete {
            min as f64 / max as f64
        } else {
            0.0
        };
        let total: u64 = counts.iter().sum();
        let target = if row.lock == LockKind::Fair {
            yes_no(complete && ratio >= TARGET_FAIRNESS)
        } else {
            "(none)"
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} ms | {} | {min} | {max} | {ratio:.2} | {:.0} | {} | {target} | {} |",
            if row.lock == LockKind::Fair {
                "fair()"
            } else {
                "plain"
            },
            row.clients,
            row.hold_ms,
            fmt_spread(&row.tasks),
            total as f64 / row.duration.as_secs_f64(),
            fmt_ns(row.report.max_wait),
            errors_cell(&row.report.errors, row.error.as_deref()),
        );
    }
    let _ = writeln!(s);

    latency::render(&mut s, input.latency, ping);
    held::render(
        &mut s,
        input.held,
        input.plan.held_locks,
        input.plan.held_window,
    );
    s
}

fn fmt_dur(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

fn errors_cell(errors: &[String], fatal: Option<&str>) -> String {
    match (fatal, errors.first()) {
        (Some(f), _) => format!("run failed: {}", f.replace('|', "/")),
        (None, None) => "0".to_owned(),
        (None, Some(first)) => format!("{} (first: {})", errors.len(), first.replace('|', "/")),
    }
}
