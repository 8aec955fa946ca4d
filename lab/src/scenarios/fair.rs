//! Fair mode, whose release hands the lock to the head of the queue inside its script
//! (the waiter takes it from the release message, without a call of its own): waiters
//! paused and killed while they wait in line.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use testkit::history::{Op, Phase, monotonic_ns};

use super::{STEADY_MAX, Scale, Scenario, count, wait_until};
use crate::harness::{Lab, Resource, SCENARIO_TIMEOUT, TTL, Workers, ns, signal};
use crate::outcomes::Outcome;

/// The fair workers' waiter timeout: a waiter silent this long is dropped from the
/// line, and a lease handed to it ends by then.
const WAITER_TIMEOUT: Duration = TTL;

pub const FAIR_HANDOVER: Scenario = Scenario {
    name: "fair-handover",
    what: "4 fair workers, renewed leases, each release handing the lock to the next in \
        line; p3 SIGSTOPped for 3 waiter timeouts (waiting or holding), p4 SIGKILLed, \
        once per fault round",
    expected: "every checker holds; releases did hand the lock over (counted from their messages); the line goes on past the \
        stopped and the killed worker",
    run: |lab, tag, scale| lab.fair_handover(tag, scale),
};

/// After rounds that stopped p3 and replaced p4 by a fresh worker each time: waits
/// until p1, p2, p3 and the last fresh worker have each acquired twice more, then has
/// every worker stop (`stop_file`) and waits for them.
pub(super) fn live_workers_go_on(
    tag: &str,
    histories: &[std::path::PathBuf],
    stop_file: &std::path::Path,
    workers: &mut Workers,
) -> Result<(), String> {
    let healed_at = monotonic_ns();
    let live = [
        &histories[0],
        &histories[1],
        &histories[2],
        &histories[histories.len() - 1],
    ];
    wait_until(tag, "every live worker acquires after the faults", || {
        live.iter()
            .all(|h| count(h, healed_at, Op::Acquire, Phase::Ok).unwrap_or(0) >= 2)
    })?;
    std::fs::write(stop_file, b"").map_err(|e| format!("{}: {e}", stop_file.display()))?;
    workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)
}

/// Counts release messages of a lock: on its clients' own channels, the handovers (`G
/// TOKEN FENCE PX`) of fair releases; or on the lock's channel itself, the plain
/// releases that wake every client.
pub(super) struct Handovers {
    seen: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<Result<(), String>>,
}

impl Handovers {
    /// Listens on `channel` (`own`: on every client's own channel of the lock whose
    /// release channel it is), counting the messages whose payload `counts`. (Not on the
    /// clients' own channels for plain releases: a pattern subscription there counts as
    /// a listener of every client, dead ones included, which a release would then not
    /// skip.)
    pub(super) fn listen(
        url: &str,
        channel: &str,
        own: bool,
        counts: fn(&[u8]) -> bool,
    ) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut conn = client.get_connection().map_err(|e| e.to_string())?;
        conn.set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(|e| e.to_string())?;
        let (seen, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (tally, done) = (seen.clone(), stop.clone());
        let channel = channel.to_owned();
        // Subscribed before the workers start, so no handover goes uncounted.
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let thread = thread::spawn(move || {
            let mut messages = conn.as_pubsub();
            // Each client's own channel: the lock's channel, then ":" and the client.
            if own {
                messages.psubscribe(format!("{channel}:*"))
            } else {
                messages.subscribe(&channel)
            }
            .map_err(|e| e.to_string())?;
            let _ = ready_tx.send(());
            while !done.load(Ordering::Relaxed) {
                match messages.get_message() {
                    Ok(m) => {
                        if counts(m.get_payload_bytes()) {
                            tally.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) if e.is_timeout() => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(())
        });
        ready
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| "the handover listener never subscribed".to_owned())?;
        Ok(Self { seen, stop, thread })
    }

    /// Stops listening: how many messages were counted.
    pub(super) fn stop(self) -> Result<usize, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| "the handover listener panicked".to_owned())??;
        Ok(self.seen.load(Ordering::Relaxed))
    }
}

impl Lab {
    /// Four fair workers with renewed leases (so a release's handover is taken as it
    /// is) on the fenced resource, steady until the faults are done. Per fault round:
    /// p3 SIGSTOPped for three waiter timeouts (the lease a release hands it runs out at
    /// its deadline to call again; on waking it must not use that stale handover) and
    /// p4 SIGKILLed (the line must go on without it); then the others must acquire
    /// again.
    fn fair_handover(&self, tag: &str, scale: Scale) -> Result<Outcome, String> {
        let handovers = Handovers::listen(
            &self.lock.url(),
            &format!("fencelock:{{lab:{tag}}}:released"),
            true,
            |payload| payload.starts_with(b"G "),
        )?;
        let stop_file = self.dir.join(format!("{tag}.stop"));
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        let mut pids = Vec::new();
        let spawn = |workers: &mut Workers, p: u32| {
            let (mut args, path) = self.worker_args(tag, p, Resource::Fenced, STEADY_MAX);
            args.extend([
                "--renewed".into(),
                format!("--fair-waiter-timeout-ms={}", WAITER_TIMEOUT.as_millis()),
                format!("--stop-file={}", stop_file.display()),
            ]);
            workers.spawn(&self.exe, &args).map(|pid| (pid, path))
        };
        let rounds = scale.failovers;
        for p in 1..=4 {
            let (pid, path) = spawn(&mut workers, p)?;
            pids.push(pid);
            histories.push(path);
        }
        self.wait_for_acquire(tag, &histories)?;
        let mut faults = Vec::new();
        let mut windows = Vec::new();
        for round in 0..rounds {
            // A few handovers under way before each fault.
            let from = monotonic_ns();
            wait_until(tag, "acquisitions before the fault", || {
                histories
                    .iter()
                    .map(|h| count(h, from, Op::Acquire, Phase::Ok).unwrap_or(0))
                    .sum::<usize>()
                    >= 8
            })?;
            let stopped = monotonic_ns();
            signal(pids[2], libc::SIGSTOP);
            thread::sleep(3 * WAITER_TIMEOUT);
            signal(pids[2], libc::SIGCONT);
            workers.kill(pids[3]);
            // The pause, and the killed waiter's place in line until its timeout.
            windows.push((stopped, monotonic_ns() + ns(WAITER_TIMEOUT)));
            faults.push(format!(
                "round {}: SIGSTOP p3 for {} ms, SIGKILL p{}",
                round + 1,
                (3 * WAITER_TIMEOUT).as_millis(),
                4 + round
            ));
            // The killed worker's place goes to a fresh one.
            let (pid, path) = spawn(&mut workers, 5 + round)?;
            pids[3] = pid;
            histories.push(path);
        }
        // The line goes on: every live worker acquires again after the last fault.
        live_workers_go_on(tag, &histories, &stop_file, &mut workers)?;
        let handed = handovers.stop()?;

        faults.push(format!("{handed} handovers"));
        let (mut o, h) = self.judge(tag, &histories, faults.join("; "))?;
        o.count_under_fault(&h, &windows);
        o.expect_clean(&[1, 2, 3, 4, 5]);
        if handed == 0 {
            o.failed
                .push("no release handed the lock over (nothing exercised)".into());
        }
        o.details
            .push(format!("{handed} releases handed the lock over"));
        Ok(o)
    }
}
