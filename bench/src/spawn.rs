//! Running worker processes: the bench binary re-executing itself as `worker`, the
//! Python driver of the Python peers or the Node driver of node-redlock (same protocol).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::timeout;

use crate::clock::mono_ns;

/// How long a worker may take to connect and print `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long past its run a worker may take to report.
const REPORT_GRACE: Duration = Duration::from_secs(30);
/// How far ahead of `go` the run starts, so every worker has read it by then.
pub const START_DELAY: Duration = Duration::from_millis(100);
/// How long a worker may take to exit after `done`.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// What one worker process reported.
#[derive(Debug, Default)]
pub struct Report {
    /// Handoff (or acquire + release) latencies, ns.
    pub samples: Vec<u64>,
    /// PING round trips, ns (the Python and Node drivers' latency runs).
    pub pings: Vec<u64>,
    /// Acquisitions per contender (grid).
    pub counts: Vec<u64>,
    /// Acquisitions by all its contenders.
    pub acquisitions: u64,
    /// Handoffs between two tasks of the same process (not samples).
    pub same_process: u64,
    /// Acquisitions by a contender that was not waiting at the release (not samples).
    pub late: u64,
    /// The longest single acquire of any contender, ns (grid).
    pub max_wait: u64,
    /// Errors the contenders met.
    pub errors: Vec<String>,
}

struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
}

/// A set of running workers. Dropping it kills them (`kill_on_drop`); [`Workers::shutdown`]
/// kills and reaps them.
pub struct Workers {
    workers: Vec<Worker>,
}

impl Workers {
    /// Starts `program` with `prefix` then each argument list (one worker per list), and
    /// waits until every one is `ready`.
    pub async fn start(
        program: &Path,
        prefix: &[String],
        arg_lists: &[Vec<String>],
    ) -> Result<Workers, String> {
        let mut set = Workers {
            workers: Vec::new(),
        };
        for args in arg_lists {
            let spawned = Command::new(program)
                .args(prefix)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn();
            let mut child = match spawned {
                Ok(c) => c,
                Err(e) => {
                    set.shutdown().await;
                    return Err(format!("cannot spawn a worker: {e}"));
                }
            };
            let stdin = child.stdin.take();
            let stdout = child.stdout.take().expect("piped stdout");
            set.workers.push(Worker {
                child,
                stdin,
                lines: BufReader::new(stdout).lines(),
            });
        }
        for i in 0..set.workers.len() {
            let line = timeout(READY_TIMEOUT, set.workers[i].lines.next_line()).await;
            match line {
                Ok(Ok(Some(l))) if l == "ready" => {}
                other => {
                    set.shutdown().await;
                    return Err(format!("worker {i} did not get ready: {other:?}"));
                }
            }
        }
        Ok(set)
    }

    /// Starts the run in every worker (all at one `CLOCK_MONOTONIC` time, [`START_DELAY`]
    /// ahead), then collects their reports (each worker runs for
    /// `run`), waits for them to exit, and reaps them.
    pub async fn run(mut self, run: Duration) -> Result<Vec<Report>, String> {
        let go = format!("go {}\n", mono_ns() + START_DELAY.as_nanos() as u64);
        for w in &mut self.workers {
            let stdin = w.stdin.as_mut().expect("stdin open until shutdown");
            if let Err(e) = stdin.write_all(go.as_bytes()).await {
                self.shutdown().await;
                return Err(format!("cannot start a worker: {e}"));
            }
            let _ = stdin.flush().await;
        }
        let deadline = tokio::time::Instant::now() + START_DELAY + run + REPORT_GRACE;
        let mut reports = Vec::new();
        for i in 0..self.workers.len() {
            match tokio::time::timeout_at(deadline, read_report(&mut self.workers[i].lines)).await {
                Ok(Ok(r)) => reports.push(r),
                Ok(Err(e)) => {
                    self.shutdown().await;
                    return Err(format!("worker {i}: {e}"));
                }
                Err(_) => {
                    self.shutdown().await;
                    return Err(format!("worker {i} did not report in time"));
                }
            }
        }
        // Each has printed `done`: let it exit by itself, then reap it.
        for w in &mut self.workers {
            if timeout(EXIT_TIMEOUT, w.child.wait()).await.is_err() {
                let _ = w.child.kill().await; // kill() also waits
            }
            w.stdin = None;
        }
        self.workers.clear();
        Ok(reports)
    }

    /// The process ids of the workers (to pin them).
    pub fn pids(&self) -> Vec<u32> {
        self.workers.iter().filter_map(|w| w.child.id()).collect()
    }

    /// Kills every worker still running and waits for each.
    pub async fn shutdown(&mut self) {
        for w in &mut self.workers {
            w.stdin = None;
            let _ = w.child.kill().await;
        }
        self.workers.clear();
    }
}

async fn read_report(lines: &mut Lines<BufReader<ChildStdout>>) -> Result<Report, String> {
    let mut r = Report::default();
    loop {
        let line = lines
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "exited without reporting".to_owned())?;
        let (kind, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let num = || {
            rest.trim()
                .parse::<u64>()
                .map_err(|_| format!("bad line {line:?}"))
        };
        match kind {
            "done" => return Ok(r),
            "sample" => r.samples.push(num()?),
            "ping" => r.pings.push(num()?),
            "count" => r.counts.push(num()?),
            "error" => r.errors.push(rest.to_owned()),
            "stat" => {
                let (name, value) = rest.split_once(' ').unwrap_or((rest, "0"));
                let value: u64 = value.parse().map_err(|_| format!("bad line {line:?}"))?;
                match name {
                    "acquisitions" => r.acquisitions += value,
                    "same_process" => r.same_process += value,
                    "late" => r.late += value,
                    "max_wait" => r.max_wait = r.max_wait.max(value),
                    _ => {}
                }
            }
            _ => return Err(format!("unexpected line {line:?}")),
        }
    }
}
