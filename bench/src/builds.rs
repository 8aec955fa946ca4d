//! fencelock on each server build users run: Redis 6.2, Redis 7.0 and Valkey 9.1 (with
//! its I/O threads off, and on with `--io-threads 2`), one throwaway server each, one
//! after another in one run: the uncontended acquire + release cycle, the handoff to a
//! waiter at 1 and 8 waiters, and many locks through one client, each with the server's
//! CPU time per acquisition. Redis 6.2 and Valkey 9.1 are testkit's fetched builds
//! (`scripts/servers`).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use testkit::{RedisServer, ServerBuild};

use crate::latency::{Cycler, Series, TTL, in_turns};
use crate::launcher::{Launcher, handoff_row};
use crate::many::{self, Who};
use crate::peers::Peer;
use crate::plan::Plan;
use crate::report::{fmt_dur, fmt_ns};

/// The handoff rows' waiters.
const WAITERS: [usize; 2] = [1, 8];

/// One server to measure: a build and its extra arguments.
struct Config {
    build: ServerBuild,
    args: &'static [&'static str],
    /// What the arguments do, for the report.
    note: &'static str,
}

fn configs() -> Vec<Config> {
    vec![
        Config {
            build: ServerBuild::Redis62,
            args: &[],
            note: "",
        },
        Config {
            build: ServerBuild::Redis7,
            args: &[],
            note: "",
        },
        Config {
            build: ServerBuild::Valkey91,
            args: &["--io-threads", "1"],
            note: "I/O threads off",
        },
        Config {
            build: ServerBuild::Valkey91,
            args: &["--io-threads", "2"],
            note: "`--io-threads 2`",
        },
    ]
}

/// A measurement and the server's CPU time per acquisition (ns) over it.
pub(crate) struct Measured {
    /// p50 of a latency (ns), or acquisitions per second.
    pub(crate) value: f64,
    pub(crate) server_cpu_ns: Result<f64, String>,
}

/// What one server measured; each cell an error if it failed.
pub(crate) struct Row {
    /// `Valkey 9.1.2, `--io-threads 2``.
    pub(crate) server: String,
    pub(crate) uncontended: Result<Measured, String>,
    pub(crate) handoff: Vec<(usize, Result<Measured, String>)>,
    pub(crate) many: Result<Measured, String>,
}

/// The section's rows.
#[derive(Default)]
pub(crate) struct Builds {
    pub(crate) rows: Vec<Row>,
}

impl Builds {
    pub(crate) fn failed(&self) -> bool {
        self.rows.iter().any(|r| {
            r.uncontended.is_err() || r.many.is_err() || r.handoff.iter().any(|(_, h)| h.is_err())
        })
    }
}

/// The CPU time of every thread of process `pid` (ns), from `/proc/PID/task/*/schedstat`:
/// with I/O threads the main thread no longer does all the work.
fn process_cpu_ns(pid: u32) -> Result<u64, String> {
    let dir = format!("/proc/{pid}/task");
    let tasks = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
    let mut total = 0;
    for task in tasks.flatten() {
        let path = task.path().join("schedstat");
        // A thread that ended meanwhile has nothing left to count.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        total += text
            .split_whitespace()
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| format!("{}: unexpected {text:?}", path.display()))?;
    }
    Ok(total)
}

/// The server's CPU time from `before` to now, per acquisition.
fn cpu_per(pid: u32, before: &Result<u64, String>, acquisitions: u64) -> Result<f64, String> {
    let before = before.clone()?;
    let used = process_cpu_ns(pid)?.saturating_sub(before);
    Ok(used as f64 / acquisitions.max(1) as f64)
}

/// Every build, one server at a time (started from the calling thread, which testkit ties
/// the server's life to).
pub(crate) async fn run(plan: &Plan, launch: &Launcher) -> Builds {
    let mut rows = Vec::new();
    for config in configs() {
        let server = RedisServer::builder()
            .server(config.build.clone())
            .args(config.args.iter().copied())
            .start();
        let mut label = server.version();
        if !config.note.is_empty() {
            label = format!("{label}, {}", config.note);
        }
        eprintln!("server builds: {label}");
        rows.push(measure(plan, launch, &server, label).await);
    }
    Builds { rows }
}

async fn measure(plan: &Plan, launch: &Launcher, server: &RedisServer, label: String) -> Row {
    let pid = server.pid();
    let uncontended = uncontended(plan, server).await;
    let mut handoff = Vec::new();
    for waiters in WAITERS {
        let before = process_cpu_ns(pid);
        let name = format!("bench-builds-handoff-{waiters}");
        let row = handoff_row(
            launch,
            server,
            Peer::Fencelock,
            name,
            waiters,
            plan.handoff_run,
        )
        .await;
        let cell = match (row.error, row.summary) {
            (Some(e), _) => Err(e),
            (None, None) => Err("no handoffs".to_owned()),
            (None, Some(summary)) => Ok(Measured {
                value: summary.p50 as f64,
                server_cpu_ns: cpu_per(pid, &before, row.report.acquisitions),
            }),
        };
        handoff.push((waiters, cell));
    }
    let many = many_locks(plan, server).await;
    Row {
        server: label,
        uncontended,
        handoff,
        many,
    }
}

/// The uncontended cycle: p50, and the server's CPU over the measured cycles.
async fn uncontended(plan: &Plan, server: &RedisServer) -> Result<Measured, String> {
    let client = fencelock::Client::connect(&server.url())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let lock = client.lock("bench-builds").lease(TTL).renew(false);
    let mut clients = [("fencelock", Cycler::Fence(lock))];
    let before = process_cpu_ns(server.pid());
    let (warmup, mut samples) = in_turns(&mut clients, plan.latency_cycles).await?;
    let cycles = (warmup + plan.latency_cycles) as u64;
    let server_cpu_ns = cpu_per(server.pid(), &before, cycles);
    let series = Series::new(samples.pop().unwrap_or_default())?;
    Ok(Measured {
        value: series.summary.p50 as f64,
        server_cpu_ns,
    })
}

/// Many locks through one client ([`many::TASKS`] tasks, fencelock's client only) for
/// the plan's hot-key time: acquisitions per second.
async fn many_locks(plan: &Plan, server: &RedisServer) -> Result<Measured, String> {
    let fence = fencelock::Client::connect(&server.url())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let client = Arc::new(many::Client::Fence(fence.clone()));
    // Warm-up: scripts loaded, connections and the watchdog up.
    let _ = many::round(
        &client,
        Who::Fencelock,
        std::time::Duration::from_millis(100),
    )
    .await;
    let before = process_cpu_ns(server.pid());
    let started = Instant::now();
    let (n, errors) = many::round(&client, Who::Fencelock, plan.hot_key_run).await;
    let elapsed = started.elapsed();
    let server_cpu_ns = cpu_per(server.pid(), &before, n);
    // Releases left in the background end here, before the next measurement.
    fence.flush().await;
    if let Some(first) = errors.first() {
        return Err(format!("{} errors (first: {first})", errors.len()));
    }
    Ok(Measured {
        value: n as f64 / elapsed.as_secs_f64().max(1e-9),
        server_cpu_ns,
    })
}

/// The section "fencelock on each server build".
pub(crate) fn render(s: &mut String, builds: &Builds, plan: &Plan) {
    let _ = writeln!(s, "## fencelock on each server build\n");
    let _ = writeln!(
        s,
        "One throwaway server of each build in turn (Redis 6.2 and Valkey 9.1 from \
         `scripts/servers`, Redis 7.0 from Debian; not pinned: Valkey's I/O threads need a \
         CPU of their own to do anything): fencelock's uncontended acquire + release \
         ({} cycles, one client, p50), the handoff to a waiter at 1 and 8 waiters ({} per \
         row, worker processes, p50 from the release to the next holder), and many locks \
         through one client ({} tasks for {}, acquisitions per second). \"CPU\": the \
         server's CPU time per acquisition over the measurement, all its threads \
         (`/proc/<pid>/task/*/schedstat`).\n",
        plan.latency_cycles,
        fmt_dur(plan.handoff_run),
        many::TASKS,
        fmt_dur(plan.hot_key_run),
    );
    let _ = write!(s, "| server | uncontended p50 | CPU |");
    for w in WAITERS {
        let _ = write!(
            s,
            " handoff p50, {w} waiter{} | CPU |",
            if w == 1 { "" } else { "s" }
        );
    }
    let _ = writeln!(s, " many locks, acquisitions/s | CPU |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    let cells = |m: &Result<Measured, String>, value: &dyn Fn(f64) -> String| match m {
        Ok(m) => format!(
            "{} | {}",
            value(m.value),
            match &m.server_cpu_ns {
                Ok(ns) => format!("{:.1} µs", ns / 1000.0),
                Err(e) => format!("– ({})", e.replace('|', "/")),
            }
        ),
        Err(e) => format!("failed: {} | –", e.replace('|', "/")),
    };
    let latency = |ns: f64| fmt_ns(ns as u64);
    let rate = |r: f64| format!("{r:.0}");
    for row in &builds.rows {
        let _ = write!(
            s,
            "| {} | {} |",
            row.server,
            cells(&row.uncontended, &latency)
        );
        for (_, h) in &row.handoff {
            let _ = write!(s, " {} |", cells(h, &latency));
        }
        let _ = writeln!(s, " {} |", cells(&row.many, &rate));
    }
    let _ = writeln!(s);
}
