//! Several locks at once: `client.lock_all(n names)` against the same `n` names taken
//! as single locks one after the other (each `lock(name).try_acquire()`, then each
//! released), for `n` in [`SIZES`]. One task of the harness's current-thread runtime,
//! one client, uncontended: what a caller that needs `n` locks pays either way. The two
//! ways take turns, [`ROUNDS`] rounds of a share of the plan's hot-key time each per
//! size, so that drift hits them alike. Measured: sets taken per second, and the
//! redis-server main thread's CPU time per set.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use crate::latency::thread_cpu_ns;
use crate::plan::Plan;
use crate::report::{errors_cell, fmt_dur, x};

/// How many names a set has.
pub(crate) const SIZES: [usize; 3] = [2, 4, 16];
/// Turns of each way, per size.
const ROUNDS: u32 = 3;

/// One way of taking a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Way {
    /// `client.lock_all(names)`.
    All,
    /// `client.lock(name)` for each, in turn.
    InTurn,
}

impl Way {
    const BOTH: [Way; 2] = [Way::All, Way::InTurn];

    fn label(self) -> &'static str {
        match self {
            Way::All => "`lock_all(names)`",
            Way::InTurn => "`lock(name)` in turn",
        }
    }
}

/// What one way did for one size, over all its rounds.
pub(crate) struct Row {
    pub(crate) names: usize,
    pub(crate) way: Way,
    pub(crate) sets: u64,
    pub(crate) elapsed: Duration,
    /// redis-server main thread CPU time per set (ns).
    pub(crate) server_cpu_ns: Result<f64, String>,
    pub(crate) errors: Vec<String>,
}

impl Row {
    pub(crate) fn per_second(&self) -> f64 {
        self.sets as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The section's rows, and why it could not run, if it could not.
#[derive(Default)]
pub(crate) struct Multi {
    pub(crate) rows: Vec<Row>,
    pub(crate) error: Option<String>,
}

impl Multi {
    pub(crate) fn failed(&self) -> bool {
        self.error.is_some() || self.rows.iter().any(|r| !r.errors.is_empty())
    }
}

/// Takes `names` once the `way` says, holds nothing, releases them all.
async fn cycle(client: &fencelock::Client, way: Way, names: &[String]) -> Result<(), String> {
    match way {
        Way::All => {
            let guard = client
                .lock_all(names.iter().cloned())
                .try_acquire()
                .await
                .map_err(|e| format!("acquire: {e}"))?;
            guard.release().await.map_err(|e| format!("release: {e}"))
        }
        Way::InTurn => {
            let mut guards = Vec::with_capacity(names.len());
            for name in names {
                guards.push(
                    client
                        .lock(name.as_str())
                        .try_acquire()
                        .await
                        .map_err(|e| format!("acquire: {e}"))?,
                );
            }
            for released in join_all(guards.into_iter().map(fencelock::LockGuard::release)).await {
                released.map_err(|e| format!("release: {e}"))?;
            }
            Ok(())
        }
    }
}

/// Runs `way` on `names` for `window`: sets taken, and the error that ended it, if any.
async fn round(
    client: &fencelock::Client,
    way: Way,
    names: &[String],
    window: Duration,
) -> (u64, Option<String>) {
    let deadline = Instant::now() + window;
    let mut sets = 0;
    while Instant::now() < deadline {
        if let Err(e) = cycle(client, way, names).await {
            return (sets, Some(e));
        }
        sets += 1;
    }
    (sets, None)
}

/// The section on `server`.
pub(crate) async fn run(plan: &Plan, server: &testkit::RedisServer) -> Multi {
    let client = match fencelock::Client::connect(&server.url()).await {
        Ok(c) => c,
        Err(e) => {
            return Multi {
                rows: Vec::new(),
                error: Some(e.to_string()),
            };
        }
    };
    let window = plan.hot_key_run / ROUNDS;
    let pid = server.pid();
    let mut rows = Vec::new();
    for n in SIZES {
        for way in Way::BOTH {
            // Names of their own per way: no way finds the other's keys.
            let names: Vec<String> = (0..n)
                .map(|i| format!("bench-multi-{n}-{way:?}-{i}"))
                .collect();
            // Warm-up: scripts loaded, the watchdog up.
            let _ = round(&client, way, &names, Duration::from_millis(100)).await;
            rows.push((
                names,
                Row {
                    names: n,
                    way,
                    sets: 0,
                    elapsed: Duration::ZERO,
                    server_cpu_ns: Ok(0.0),
                    errors: Vec::new(),
                },
            ));
        }
    }
    for r in 0..ROUNDS {
        eprintln!(
            "several locks at once: round {} of {ROUNDS}, {:?} per size and way",
            r + 1,
            window
        );
        for (names, row) in &mut rows {
            let cpu_before = thread_cpu_ns(pid);
            let started = Instant::now();
            let (sets, error) = round(&client, row.way, names, window).await;
            row.elapsed += started.elapsed();
            row.sets += sets;
            row.errors.extend(error);
            let used = cpu_before.and_then(|b| Ok(thread_cpu_ns(pid)?.saturating_sub(b)));
            row.server_cpu_ns = match (row.server_cpu_ns.clone(), used) {
                (Ok(sum), Ok(u)) => Ok(sum + u as f64),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
    }
    let mut rows: Vec<Row> = rows.into_iter().map(|(_, row)| row).collect();
    for row in &mut rows {
        let n = row.sets.max(1) as f64;
        row.server_cpu_ns = row.server_cpu_ns.clone().map(|total| total / n);
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), client.flush()).await;
    Multi { rows, error: None }
}

/// The section "Several locks at once".
pub(crate) fn render(s: &mut String, multi: &Multi, plan: &Plan) {
    let _ = writeln!(s, "## Several locks at once\n");
    let _ = writeln!(
        s,
        "One task, one client, uncontended: a set of N names taken with \
         `client.lock_all(names).try_acquire()` and released with the guard's \
         `release()`, against the same N names taken one after the other with \
         `client.lock(name).try_acquire()` and then released together. The ways take \
         {ROUNDS} turns of {} each per size. Sets per second over all turns; \
         redis-server's main-thread CPU time per set (`/proc/<pid>/schedstat`).\n",
        fmt_dur(plan.hot_key_run / ROUNDS)
    );
    if let Some(e) = &multi.error {
        let _ = writeln!(s, "Not measured: {e}\n");
        return;
    }
    let _ = writeln!(
        s,
        "| names | way | sets/s | × in turn | Redis CPU / set | errors |\n|---|---|---|---|---|---|"
    );
    for r in &multi.rows {
        let in_turn = multi
            .rows
            .iter()
            .find(|o| o.names == r.names && o.way == Way::InTurn)
            .map(Row::per_second);
        let cpu = match &r.server_cpu_ns {
            Ok(ns) => format!("{:.1} µs", ns / 1000.0),
            Err(e) => format!("– ({e})"),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {} | {cpu} | {} |",
            r.names,
            r.way.label(),
            r.per_second(),
            in_turn.map_or("–".into(), |t| x(r.per_second() / t)),
            errors_cell(&r.errors, None),
        );
    }
    let _ = writeln!(s);
}
