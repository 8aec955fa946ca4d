//! Semaphore scenarios: a semaphore of 2 permits on the single lock server, its holders
//! working at once, paused and killed. C1 counts leases against the permits
//! ([`leases_over`](testkit::checkers::leases_over)): never more than 2 at once, every
//! write inside its writer's lease.

use std::thread;
use std::time::Instant;

use testkit::checkers::leases_over;
use testkit::history::{Event, Op, Phase, monotonic_ns};

use super::{AVAILABILITY_SLACK, STEADY_MAX, Scenario, WITHIN, wait_until};
use crate::harness::{Lab, Resource, SCENARIO_TIMEOUT, TTL, Workers, process_stopped, signal};
use crate::outcomes::Outcome;

/// The permits of every semaphore scenario.
pub(super) const PERMITS: u32 = 2;

pub const SEMAPHORE_STEADY: Scenario = Scenario {
    name: "semaphore-steady",
    what: "4 workers share a semaphore of 2 permits (fixed 500 ms leases), no faults",
    expected: "two holders at once (exercised), never three: C1 per permits, C3, C4 hold",
    run: |lab, tag, scale| lab.semaphore_steady(tag, scale.faulty),
};

pub const SEMAPHORE_PAUSED_RENEWED: Scenario = Scenario {
    name: "semaphore-paused-renewed",
    what: "semaphore of 2: p1 SIGSTOPs itself between read and write, for 3 TTLs, holding a \
        renewed permit; p2, p3 take both permits meanwhile",
    expected: "p1's guard reports the permit lost and p1 skips its late write; never three \
        holders: C1 per permits, C3, C4 hold",
    run: |lab, tag, _| lab.semaphore_paused(tag, true),
};

pub const SEMAPHORE_PAUSED_FIXED: Scenario = Scenario {
    name: "semaphore-paused-fixed",
    what: "the same with a fixed lease, which p1 does not check before its late write",
    expected: "**positive control**: C1 flags p1's write after its permit ended, while p2 \
        and p3 held both permits",
    run: |lab, tag, _| lab.semaphore_paused(tag, false),
};

pub const SEMAPHORE_PERMIT_REMOVED: Scenario = Scenario {
    name: "semaphore-permit-removed",
    what: "semaphore of 2: p1's permit removed from the set (ZREM, as a failover or an \
        operator would lose it) while p1 holds it; p2 and p3 then hold both permits",
    expected: "**positive control**: C1 flags three holders at once (more than the permits)",
    run: |lab, tag, _| lab.semaphore_permit_removed(tag),
};

pub const SEMAPHORE_HOLDERS_KILLED: Scenario = Scenario {
    name: "semaphore-holders-killed",
    what: "semaphore of 2: p1 and p2 SIGKILLed holding renewed permits; p3 waiting",
    expected: "C6: p3 gets a permit within one TTL + 300 ms of the kill; C1 per permits, \
        C3, C4 hold",
    run: |lab, tag, _| lab.semaphore_holders_killed(tag),
};

impl Lab {
    /// Worker arguments for the semaphore of `tag` (unfenced resource: holders at once
    /// write with interleaved tokens).
    pub(super) fn semaphore_worker(
        &self,
        tag: &str,
        p: u32,
        iterations: u32,
    ) -> (Vec<String>, std::path::PathBuf) {
        let (mut args, path) = self.worker_args(tag, p, Resource::Unfenced, iterations);
        args.push(format!("--permits={PERMITS}"));
        (args, path)
    }

    /// 4 workers, 2 permits: the semaphore must be used by two at once (C1 with one
    /// permit finds overlaps) and never by three (C1 with two finds none).
    fn semaphore_steady(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        let specs = (1..=4)
            .map(|p| self.semaphore_worker(tag, p, iterations))
            .collect();
        let (mut workers, histories) = self.spawn_all(specs)?;
        workers.wait_all(Instant::now() + self.timeout(iterations))?;
        let (mut o, h) = self.judge_semaphore(tag, &histories, "none".into(), PERMITS as usize)?;
        o.expect_clean(&[1, 3, 4]);
        expect_two_at_once(&mut o, &h);
        Ok(o)
    }

    /// Worker 1 takes a permit and stops itself between its read and its write for 3
    /// TTLs while workers 2 and 3 take both permits; then it writes late (fixed lease)
    /// or finds its guard lost and skips the write (renewed).
    fn semaphore_paused(&self, tag: &str, renewed: bool) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let (mut args_a, hist_a) = self.semaphore_worker(tag, 1, 2);
        args_a.push("--stop-after-first-read".into());
        if renewed {
            args_a.push("--renewed".into());
        }
        let pid_a = workers.spawn(&self.exe, &args_a)?;
        wait_until(tag, "p1 stopped holding a permit", || {
            process_stopped(pid_a)
        })?;
        let stopped_at = Instant::now();
        let stopped_ns = monotonic_ns();
        let mut histories = vec![hist_a];
        // p2 and p3 work through the whole pause (p1's permit ends a TTL into it), and
        // stop once p1 resumes.
        let stop_file = self.dir.join(format!("{tag}.stop"));
        for p in 2..=3 {
            let (mut args, path) = self.semaphore_worker(tag, p, STEADY_MAX);
            args.push(format!("--stop-file={}", stop_file.display()));
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        // The pause is the fault: 3 TTLs.
        thread::sleep((3 * TTL).saturating_sub(stopped_at.elapsed()));
        signal(pid_a, libc::SIGCONT);
        let resumed_ns = monotonic_ns();
        std::fs::write(&stop_file, b"").map_err(|e| format!("{}: {e}", stop_file.display()))?;
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;

        let faults = format!(
            "SIGSTOP p1 for {} ms holding a {} permit",
            (3 * TTL).as_millis(),
            if renewed { "renewed" } else { "fixed" }
        );
        let (mut o, h) = self.judge_semaphore(tag, &histories, faults, PERMITS as usize)?;
        o.count_under_fault(&h, &[(stopped_ns, resumed_ns)]);
        // p2 and p3 held both permits at once while p1 was stopped.
        let both_during_pause = leases_over(&h, 1).iter().any(|v| {
            v.events
                .iter()
                .all(|e| e.process != 1 && (stopped_ns..resumed_ns).contains(&e.time_ns))
        });
        if !both_during_pause {
            o.failed.push(
                "p2 and p3 never held both permits while p1 was stopped (no fault exercised)"
                    .into(),
            );
        }
        let first_token = h
            .iter()
            .find(|e| e.process == 1 && e.op == Op::Acquire && e.phase == Phase::Ok)
            .and_then(|e| e.token);
        let late_write = h.iter().any(|e| {
            e.process == 1 && e.op == Op::Write && e.phase == Phase::Ok && e.token == first_token
        });
        if renewed {
            if late_write {
                o.failed
                    .push("p1 wrote with the permit its guard had lost".into());
            }
            o.expect_clean(&[1, 3, 4]);
        } else {
            if !late_write {
                o.failed
                    .push("p1 never wrote late (no fault exercised)".into());
            }
            o.expect_detected(1, "p1's write after its permit ended");
            o.expect_clean(&[3, 4]);
        }
        Ok(o)
    }

    /// Workers 1 and 2 take both permits (renewed, held for a minute); worker 3 waits;
    /// both holders are SIGKILLed, their leases fresh from the watchdog. C6: p3 holds a
    /// permit within one TTL (plus slack) of the kill.
    fn semaphore_holders_killed(&self, tag: &str) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        let mut pids = Vec::new();
        for p in 1..=2 {
            let (mut args, path) = self.semaphore_worker(tag, p, 1);
            args.extend(["--renewed".into(), "--hold-first-ms=60000".into()]);
            pids.push(workers.spawn(&self.exe, &args)?);
            self.wait_for_acquire(tag, std::slice::from_ref(&path))?;
            histories.push(path);
        }
        let (args, path) = self.semaphore_worker(tag, 3, 3);
        workers.spawn(&self.exe, &args)?;
        histories.push(path.clone());
        wait_until(tag, "p3 waits for a permit", || {
            testkit::history::read_history(&path)
                .is_ok_and(|h| h.iter().any(|e| e.op == Op::Acquire))
        })?;
        // The kill falls after at least one renewal of both leases (every third of them).
        thread::sleep(TTL / 2);
        let killed_at = monotonic_ns();
        for pid in pids {
            workers.kill(pid);
        }
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT + WITHIN)?;

        let (mut o, h) = self.judge_semaphore(
            tag,
            &histories,
            "SIGKILL p1 and p2 holding both renewed permits".into(),
            PERMITS as usize,
        )?;
        o.count_under_fault(&h, &[(killed_at, u64::MAX)]);
        o.expect_clean(&[1, 3, 4]);
        o.judge_availability(&h, killed_at, TTL + AVAILABILITY_SLACK, true);
        Ok(o)
    }
}

impl Lab {
    /// Positive control of C1's permit count: p1 holds a fixed permit for most of its
    /// lease; the harness removes its token from the permit set; p2 and p3 then each
    /// hold a permit for 200 ms, inside p1's lease. Three holders believe they hold one
    /// of two permits: C1 must say so.
    fn semaphore_permit_removed(&self, tag: &str) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let (mut args, hist_a) = self.semaphore_worker(tag, 1, 1);
        args.push(format!("--hold-first-ms={}", (TTL * 8 / 10).as_millis()));
        workers.spawn(&self.exe, &args)?;
        self.wait_for_acquire(tag, std::slice::from_ref(&hist_a))?;
        let key = format!("fencelock:{{lab:{tag}}}");
        let held = self.lock.cmd(&["ZRANGE", &key, "0", "-1"]);
        let [member] = held.as_array().unwrap_or_default() else {
            return Err(format!("{tag}: expected p1's one permit, found {held}"));
        };
        let member = member.as_str().unwrap_or_default().to_owned();
        self.lock.cmd(&["ZREM", &key, &member]);
        let removed_ns = monotonic_ns();
        let mut histories = vec![hist_a];
        for p in 2..=3 {
            let (mut args, path) = self.semaphore_worker(tag, p, 1);
            args.push(format!("--hold-first-ms={}", (TTL * 4 / 10).as_millis()));
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;
        let (mut o, h) = self.judge_semaphore(
            tag,
            &histories,
            "ZREM of p1's token from the permit set while p1 holds it".into(),
            PERMITS as usize,
        )?;
        o.count_under_fault(&h, &[(removed_ns, u64::MAX)]);
        let three = leases_over(&h, PERMITS as usize)
            .iter()
            .any(|v| v.explanation.contains("more than 2 at once"));
        if !three {
            o.failed
                .push("positive control missed: C1 did not flag three holders at once".into());
        }
        o.expect_detected(1, "three holders of two permits");
        o.expect_clean(&[3, 4]);
        Ok(o)
    }
}

/// Fails `o` unless two leases were ever live at once: a semaphore of 2 that behaved as
/// a lock would pass C1 per permits without being exercised.
fn expect_two_at_once(o: &mut Outcome, h: &[Event]) {
    if leases_over(h, 1).is_empty() {
        o.failed
            .push("never two holders at once (the permits were not exercised)".into());
    }
}
