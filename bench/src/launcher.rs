//! Launching the contended runs (handoff, hot key, and the semaphores' throughput and
//! handoff) over worker processes: this binary re-executed as `worker`, the Python driver
//! for the Python peers, or the Node driver for node-redlock and redis-semaphore; and
//! checking the Python interpreter and the Node install those need.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::latency::summarize;
use crate::peers::Peer;
use crate::plan::{HANDOFF_HOLD, SEMAPHORE_PERMITS, SEMAPHORE_WAITERS};
use crate::results::HandoffRow;
use crate::servers;
use crate::spawn::{Report, Workers};

/// At most this many worker processes per scenario (the machine may have 2 cores).
pub(crate) const MAX_PROCS: usize = 8;
/// Handoff contenders make their first attempt at offsets spread over this, so pollers
/// poll at spread phases (their best case) rather than all at once.
pub(crate) const START_SPREAD_MS: u64 = 100;

/// Spreads `contenders` over at most [`MAX_PROCS`] processes: tasks per process.
pub(crate) fn spread(contenders: usize) -> Vec<usize> {
    let procs = contenders.clamp(1, MAX_PROCS);
    (0..procs)
        .map(|i| contenders / procs + usize::from(i < contenders % procs))
        .collect()
}

/// What the contenders of a run do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    Handoff,
    HotKey,
    /// The handoff of a semaphore: its releases' stamps queued in a list.
    SemaphoreHandoff,
}

/// One contended run: what its contenders do, with which lock, how many, how long each
/// holds the lock and for how long the run lasts.
pub(crate) struct Run {
    pub(crate) scenario: Scenario,
    pub(crate) peer: Peer,
    pub(crate) name: String,
    pub(crate) contenders: usize,
    pub(crate) hold: Duration,
    pub(crate) duration: Duration,
}

/// How to start worker processes: this binary, and the Python and Node drivers when
/// there are interpreters for them.
pub(crate) struct Launcher {
    exe: PathBuf,
    pub(crate) python: Result<PathBuf, String>,
    pub(crate) driver: PathBuf,
    pub(crate) node: Result<PathBuf, String>,
    pub(crate) node_driver: PathBuf,
}

impl Launcher {
    /// This binary (re-executed as `worker`), `python` with `bench/py/driver.py`, and
    /// `node` with `bench/js/driver.js`.
    pub(crate) fn new(python: Result<PathBuf, String>, node: Result<PathBuf, String>) -> Self {
        Launcher {
            exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("fencelock-bench")),
            python,
            driver: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/py/driver.py")),
            node,
            node_driver: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/js/driver.js")),
        }
    }
}

/// Runs one scenario over worker processes; the merged reports.
async fn run_workers(
    launch: &Launcher,
    url: &str,
    run: &Run,
) -> Result<(Vec<usize>, Report), String> {
    let tasks = spread(run.contenders);
    let (program, prefix) = if run.peer.python() {
        let python = launch.python.as_ref().map_err(Clone::clone)?;
        (python.clone(), vec![launch.driver.display().to_string()])
    } else if run.peer.node() {
        let node = launch.node.as_ref().map_err(Clone::clone)?;
        (node.clone(), vec![launch.node_driver.display().to_string()])
    } else {
        (launch.exe.clone(), vec!["worker".to_owned()])
    };
    // The lock handoff's stamps (worker.rs's StampFile): a file made empty for the run,
    // shared by its workers, removed after it (however the run ends).
    let stamp_file = match run.scenario {
        Scenario::Handoff => Some(
            tempfile::Builder::new()
                .prefix("fencelock-bench-stamps-")
                .tempfile()
                .map_err(|e| format!("the handoff's stamp file: {e}"))?
                .into_temp_path(),
        ),
        _ => None,
    };
    let arg_lists: Vec<Vec<String>> = tasks
        .iter()
        .enumerate()
        .map(|(proc_index, t)| {
            let scenario = match run.scenario {
                Scenario::Handoff => "handoff",
                Scenario::HotKey => "hot-key",
                Scenario::SemaphoreHandoff => "semaphore-handoff",
            };
            let mut args: Vec<String> = [
                "--url",
                url,
                "--scenario",
                scenario,
                "--name",
                &run.name,
                "--tasks",
                &t.to_string(),
                "--hold-us",
                &run.hold.as_micros().to_string(),
                "--duration-ms",
                &run.duration.as_millis().to_string(),
                "--spread-ms",
                &START_SPREAD_MS.to_string(),
                "--proc-index",
                &proc_index.to_string(),
                "--procs",
                &tasks.len().to_string(),
                "--contenders",
                &run.contenders.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if let Some(path) = &stamp_file {
                args.push("--stamp-file".to_owned());
                args.push(path.display().to_string());
            }
            args.extend(run.peer.lock_args());
            args
        })
        .collect();
    let workers = Workers::start(&program, &prefix, &arg_lists).await?;
    let reports = workers.run(run.duration).await?;
    drop(stamp_file);
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

/// One handoff row: `peer` with `waiters` waiters for `duration`, run on `server` under
/// the worker name `name`.
pub(crate) async fn handoff_row(
    launch: &Launcher,
    server: &testkit::RedisServer,
    peer: Peer,
    name: String,
    waiters: usize,
    duration: Duration,
) -> HandoffRow {
    handoff_row_at(launch, server, &server.url(), peer, name, waiters, duration).await
}

/// [`handoff_row`] with the workers connecting to `url` (a proxy in front of `server`).
pub(crate) async fn handoff_row_at(
    launch: &Launcher,
    server: &testkit::RedisServer,
    url: &str,
    peer: Peer,
    name: String,
    waiters: usize,
    duration: Duration,
) -> HandoffRow {
    let run = Run {
        scenario: Scenario::Handoff,
        peer,
        name,
        contenders: waiters + 1,
        hold: HANDOFF_HOLD,
        duration,
    };
    let (tasks, report, commands_per_s, error) = measured_at(launch, server, url, &run).await;
    HandoffRow {
        peer,
        waiters,
        tasks,
        summary: summarize(&report.samples),
        report,
        commands_per_s,
        error,
    }
}

/// The semaphore handoff row of `peer` (a semaphore of [`SEMAPHORE_PERMITS`] permits,
/// every permit held, [`SEMAPHORE_WAITERS`] waiters) for `duration`, run on `server`
/// under the worker name `name`.
pub(crate) async fn semaphore_handoff_row(
    launch: &Launcher,
    server: &testkit::RedisServer,
    peer: Peer,
    name: String,
    duration: Duration,
) -> HandoffRow {
    let run = Run {
        scenario: Scenario::SemaphoreHandoff,
        peer,
        name,
        contenders: SEMAPHORE_PERMITS as usize + SEMAPHORE_WAITERS,
        hold: HANDOFF_HOLD,
        duration,
    };
    let (tasks, report, commands_per_s, error) = measured(launch, server, &run).await;
    HandoffRow {
        peer,
        waiters: SEMAPHORE_WAITERS,
        tasks,
        summary: summarize(&report.samples),
        report,
        commands_per_s,
        error,
    }
}

/// Runs `run` on `server`: tasks per process, the merged reports, the commands per
/// second Redis processed in the run's window, and why the run failed, if it did.
pub(crate) async fn measured(
    launch: &Launcher,
    server: &testkit::RedisServer,
    run: &Run,
) -> (Vec<usize>, Report, Option<f64>, Option<String>) {
    measured_at(launch, server, &server.url(), run).await
}

/// [`measured`] with the workers connecting to `url` (a proxy in front of `server`).
async fn measured_at(
    launch: &Launcher,
    server: &testkit::RedisServer,
    url: &str,
    run: &Run,
) -> (Vec<usize>, Report, Option<f64>, Option<String>) {
    let before = servers::commands_processed(server);
    let result = run_workers(launch, url, run).await;
    // Over the run's window (the workers' connecting before it sends a handful).
    let window = run.duration.as_secs_f64();
    let per_s = match (before, servers::commands_processed(server)) {
        (Some(b), Some(a)) if window > 0.0 => Some(a.saturating_sub(b) as f64 / window),
        _ => None,
    };
    match result {
        Ok((t, r)) => (t, r, per_s, None),
        Err(e) => (spread(run.contenders), Report::default(), per_s, Some(e)),
    }
}

/// `Python 3.11.7, redis-py 8.1.0, python-redis-lock 4.0.1`, or why the interpreter cannot be used.
pub(crate) async fn python_version(python: &Path) -> Result<String, String> {
    let out = tokio::process::Command::new(python)
        .args([
            "-c",
            "import sys, redis, redis_lock; \
             print(f'Python {sys.version.split()[0]}, redis-py {redis.__version__}, \
             python-redis-lock {redis_lock.__version__}')",
        ])
        .output()
        .await
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} cannot import redis and redis_lock: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `Node v20.19.2, redlock v5.0.0-beta.2, ioredis 5.9.3, redis-semaphore 5.8.0` (what
/// `driver.js --versions` prints once it has loaded them), or why node-redlock and
/// redis-semaphore cannot be run.
pub(crate) async fn node_version(node: &Path, driver: &Path) -> Result<String, String> {
    let out = tokio::process::Command::new(node)
        .arg(driver)
        .arg("--versions")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("{}: {e}", node.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} cannot load redlock, ioredis and redis-semaphore (scripts/bench installs \
             them with npm ci): {}",
            node.display(),
            driver.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_spread_evenly_over_at_most_max_procs_processes() {
        assert_eq!(spread(2), vec![1, 1]);
        assert_eq!(spread(9), vec![2, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(spread(65).iter().sum::<usize>(), 65);
        assert_eq!(spread(65).len(), MAX_PROCS);
        assert_eq!(spread(0), vec![0]);
    }

    #[test]
    fn node_redlock_is_left_out_with_the_reason_when_node_cannot_run() {
        let launch = Launcher::new(Err("none".to_owned()), Err("none".to_owned()));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let missing = Path::new("/nonexistent/node");
        let e = runtime
            .block_on(node_version(missing, &launch.node_driver))
            .expect_err("no such node");
        assert!(e.contains("/nonexistent/node"), "{e}");
        assert!(
            launch.node_driver.is_file(),
            "{}",
            launch.node_driver.display()
        );
    }
}
