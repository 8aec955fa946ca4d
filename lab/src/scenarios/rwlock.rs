//! Read-write lock scenarios on the single lock server: readers (workers with
//! `--shared`, which read and never write) and writers (plain workers, fenced writes) of
//! one name, with readers paused, killed and removed, and a waiting writer killed. C1 is
//! [`readers_beside_writer`](testkit::checkers::readers_beside_writer): readers
//! together, a writer alone, every read and write inside its process's lease.

use std::thread;
use std::time::Instant;

use testkit::checkers::{leases_overlap, readers_beside_writer};
use testkit::history::{Event, Op, Phase, monotonic_ns, read_history};

use super::{AVAILABILITY_SLACK, STEADY_MAX, Scenario, WITHIN, wait_until};
use crate::harness::{Lab, Resource, SCENARIO_TIMEOUT, TTL, Workers, process_stopped, signal};
use crate::outcomes::Outcome;

pub const RW_STEADY: Scenario = Scenario {
    name: "rwlock-steady",
    what: "3 readers and 2 writers of one read-write lock (fixed 500 ms leases), no faults",
    expected: "readers together (exercised), a writer alone, every writer's acquire \
        succeeds (not starved): C1 per read-write lock, C2, C3, C4 hold",
    run: |lab, tag, scale| lab.rw_steady(tag, scale.faulty),
};

pub const RW_READER_PAUSED_RENEWED: Scenario = Scenario {
    name: "rwlock-reader-paused-renewed",
    what: "p1 reads under a renewed lease and SIGSTOPs itself before its read, for 3 TTLs; \
        writer p2 and reader p3 work meanwhile",
    expected: "p2 writes during the pause; p1's guard reports the lease lost and p1 skips \
        its late read: C1 per read-write lock, C2, C3, C4 hold",
    run: |lab, tag, _| lab.rw_reader_paused(tag, true),
};

pub const RW_READER_PAUSED_FIXED: Scenario = Scenario {
    name: "rwlock-reader-paused-fixed",
    what: "the same with a fixed lease, which p1 does not check before its late read",
    expected: "**positive control**: C1 flags p1's read after its lease ended (beside the \
        writer's)",
    run: |lab, tag, _| lab.rw_reader_paused(tag, false),
};

pub const RW_READER_REMOVED: Scenario = Scenario {
    name: "rwlock-reader-removed",
    what: "p1's read lease removed from the readers (ZREM, as a failover or an operator \
        would lose it) while p1 holds it; writer p2 then takes the lock",
    expected: "**positive control**: C1 flags a writer beside a reader",
    run: |lab, tag, _| lab.rw_reader_removed(tag),
};

pub const RW_READERS_KILLED: Scenario = Scenario {
    name: "rwlock-readers-killed",
    what: "readers p1 and p2 SIGKILLed holding renewed leases; writer p3 waiting",
    expected: "C6: p3 writes within one TTL + 300 ms of the kill; C1 per read-write lock, \
        C2, C3, C4 hold",
    run: |lab, tag, _| lab.rw_readers_killed(tag),
};

pub const RW_WAITING_WRITER_KILLED: Scenario = Scenario {
    name: "rwlock-waiting-writer-killed",
    what: "reader p1 holds; writer p2 waits for it (new readers queue behind) and is \
        SIGKILLed; reader p3 is waiting",
    expected: "C6: p3 reads within one TTL + 300 ms of the kill (the dead writer's place \
        lapses); C1 per read-write lock, C3, C4 hold",
    run: |lab, tag, _| lab.rw_waiting_writer_killed(tag),
};

impl Lab {
    /// Worker arguments for a reader (`shared`) or a writer of the read-write lock of
    /// `tag`; the writers' resource is fenced (one writer at a time).
    fn rw_worker(
        &self,
        tag: &str,
        p: u32,
        shared: bool,
        iterations: u32,
    ) -> (Vec<String>, std::path::PathBuf) {
        let (mut args, path) = self.worker_args(tag, p, Resource::Fenced, iterations);
        if shared {
            args.push("--shared".into());
        }
        (args, path)
    }

    /// 3 readers, 2 writers: readers must be seen together, writers never beside anyone,
    /// and every writer's acquire must succeed within its wait while readers come and go.
    fn rw_steady(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        let specs = (1..=5)
            .map(|p| self.rw_worker(tag, p, p <= 3, iterations))
            .collect();
        let (mut workers, histories) = self.spawn_all(specs)?;
        workers.wait_all(Instant::now() + self.timeout(iterations))?;
        let (mut o, h) = self.judge_rwlock(tag, &histories, "none".into())?;
        o.expect_clean(&[1, 2, 3, 4]);
        expect_readers_together(&mut o, &h, 3);
        let starved = h
            .iter()
            .filter(|e| e.process > 3 && e.op == Op::Acquire && e.phase == Phase::Fail)
            .count();
        if starved > 0 {
            o.failed.push(format!(
                "{starved} writer acquire(s) ran out of wait (starved)"
            ));
        }
        Ok(o)
    }

    /// Reader p1 stops itself before its first read for 3 TTLs while writer p2 and
    /// reader p3 work; then it reads late (fixed lease) or finds its guard lost and
    /// skips the read (renewed).
    fn rw_reader_paused(&self, tag: &str, renewed: bool) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let (mut args_a, hist_a) = self.rw_worker(tag, 1, true, 1);
        args_a.push("--stop-after-first-read".into());
        if renewed {
            args_a.push("--renewed".into());
        }
        let pid_a = workers.spawn(&self.exe, &args_a)?;
        wait_until(tag, "p1 stopped holding a read lease", || {
            process_stopped(pid_a)
        })?;
        let stopped_at = Instant::now();
        let stopped_ns = monotonic_ns();
        let mut histories = vec![hist_a];
        let stop_file = self.dir.join(format!("{tag}.stop"));
        for (p, shared) in [(2, false), (3, true)] {
            let (mut args, path) = self.rw_worker(tag, p, shared, STEADY_MAX);
            args.push(format!("--stop-file={}", stop_file.display()));
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        thread::sleep((3 * TTL).saturating_sub(stopped_at.elapsed()));
        signal(pid_a, libc::SIGCONT);
        let resumed_ns = monotonic_ns();
        std::fs::write(&stop_file, b"").map_err(|e| format!("{}: {e}", stop_file.display()))?;
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;

        let faults = format!(
            "SIGSTOP reader p1 for {} ms holding a {} lease",
            (3 * TTL).as_millis(),
            if renewed { "renewed" } else { "fixed" }
        );
        let (mut o, h) = self.judge_rwlock(tag, &histories, faults)?;
        o.count_under_fault(&h, &[(stopped_ns, resumed_ns)]);
        let wrote_during_pause = h.iter().any(|e| {
            e.process == 2
                && e.op == Op::Write
                && e.phase == Phase::Ok
                && (stopped_ns..resumed_ns).contains(&e.time_ns)
        });
        if !wrote_during_pause {
            o.failed
                .push("writer p2 never wrote while p1 was stopped (no fault exercised)".into());
        }
        let late_read = h
            .iter()
            .any(|e| e.process == 1 && e.op == Op::Read && e.phase == Phase::Ok);
        if renewed {
            if late_read {
                o.failed
                    .push("p1 read under the lease its guard had lost".into());
            }
            o.expect_clean(&[1, 2, 3, 4]);
        } else {
            if !late_read {
                o.failed
                    .push("p1 never read late (no fault exercised)".into());
            }
            o.expect_detected(1, "p1's read after its lease ended");
            o.expect_clean(&[2, 3, 4]);
        }
        Ok(o)
    }

    /// Positive control of "no reader beside a writer": reader p1 holds a fixed lease
    /// for most of it; the harness removes p1 from the readers; writer p2 then takes
    /// the lock and writes inside p1's lease.
    fn rw_reader_removed(&self, tag: &str) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let (mut args, hist_a) = self.rw_worker(tag, 1, true, 1);
        args.push(format!("--hold-first-ms={}", (TTL * 8 / 10).as_millis()));
        workers.spawn(&self.exe, &args)?;
        self.wait_for_acquire(tag, std::slice::from_ref(&hist_a))?;
        let key = format!("fencelock:{{lab:{tag}}}");
        // The reader's member: the one that is not the readers' mark (scored +inf).
        let held = self.lock.cmd(&["ZRANGEBYSCORE", &key, "-inf", "(inf"]);
        let [member] = held.as_array().unwrap_or_default() else {
            return Err(format!("{tag}: expected p1's one read lease, found {held}"));
        };
        let member = member.as_str().unwrap_or_default().to_owned();
        self.lock.cmd(&["ZREM", &key, &member]);
        let removed_ns = monotonic_ns();
        let (mut args, hist_b) = self.rw_worker(tag, 2, false, 1);
        args.push(format!("--hold-first-ms={}", (TTL * 3 / 10).as_millis()));
        workers.spawn(&self.exe, &args)?;
        let histories = vec![hist_a, hist_b];
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;
        let (mut o, h) = self.judge_rwlock(
            tag,
            &histories,
            "ZREM of reader p1's lease from the readers while p1 holds it".into(),
        )?;
        o.count_under_fault(&h, &[(removed_ns, u64::MAX)]);
        if !writer_beside_reader(&h) {
            o.failed.push(
                "positive control missed: C1 did not flag the writer beside the reader".into(),
            );
        }
        o.expect_detected(1, "a writer beside a reader");
        o.expect_clean(&[2, 3, 4]);
        Ok(o)
    }

    /// Readers p1 and p2 hold renewed leases for a minute; writer p3 waits; both
    /// readers are SIGKILLed, their leases fresh from the watchdog. C6: p3 holds the
    /// lock within one TTL (plus slack) of the kill.
    fn rw_readers_killed(&self, tag: &str) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        let mut pids = Vec::new();
        for p in 1..=2 {
            let (mut args, path) = self.rw_worker(tag, p, true, 1);
            args.extend(["--renewed".into(), "--hold-first-ms=60000".into()]);
            pids.push(workers.spawn(&self.exe, &args)?);
            self.wait_for_acquire(tag, std::slice::from_ref(&path))?;
            histories.push(path);
        }
        let (args, path) = self.rw_worker(tag, 3, false, 3);
        workers.spawn(&self.exe, &args)?;
        histories.push(path);
        let writers = format!("fencelock:{{lab:{tag}}}:writers");
        wait_until(tag, "p3 waits among the writers", || {
            self.lock.cmd(&["ZCARD", &writers]).as_int() == Some(1)
        })?;
        thread::sleep(TTL / 2);
        let killed_at = monotonic_ns();
        for pid in pids {
            workers.kill(pid);
        }
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT + WITHIN)?;
        let (mut o, h) = self.judge_rwlock(
            tag,
            &histories,
            "SIGKILL readers p1 and p2 holding renewed leases".into(),
        )?;
        o.count_under_fault(&h, &[(killed_at, u64::MAX)]);
        o.expect_clean(&[1, 2, 3, 4]);
        o.judge_availability(&h, killed_at, TTL + AVAILABILITY_SLACK, true);
        Ok(o)
    }

    /// Reader p1 holds (renewed) until it is killed at the end; writer p2 waits for it,
    /// registered; reader p3 queues behind p2; p2 is SIGKILLed. C6: p3 reads within one
    /// TTL (the dead writer's registration) plus slack of the kill.
    fn rw_waiting_writer_killed(&self, tag: &str) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let (mut args, hist_a) = self.rw_worker(tag, 1, true, 1);
        args.extend(["--renewed".into(), "--hold-first-ms=60000".into()]);
        let pid_a = workers.spawn(&self.exe, &args)?;
        self.wait_for_acquire(tag, std::slice::from_ref(&hist_a))?;
        let (args, hist_b) = self.rw_worker(tag, 2, false, 1);
        let pid_b = workers.spawn(&self.exe, &args)?;
        let writers = format!("fencelock:{{lab:{tag}}}:writers");
        wait_until(tag, "p2 waits among the writers", || {
            self.lock.cmd(&["ZCARD", &writers]).as_int() == Some(1)
        })?;
        let (args, hist_c) = self.rw_worker(tag, 3, true, 1);
        workers.spawn(&self.exe, &args)?;
        wait_until(tag, "p3 asked for a read lease", || {
            read_history(&hist_c).is_ok_and(|h| h.iter().any(|e| e.op == Op::Acquire))
        })?;
        let killed_at = monotonic_ns();
        workers.kill(pid_b);
        // p1's history has no record of its renewals: it ends killed, not reading.
        wait_until(tag, "p3 read and released", || {
            read_history(&hist_c).is_ok_and(|h| h.iter().any(|e| e.op == Op::Release))
        })?;
        workers.kill(pid_a);
        let histories = vec![hist_a, hist_b, hist_c];
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT + WITHIN)?;
        let (mut o, h) = self.judge_rwlock(
            tag,
            &histories,
            "SIGKILL writer p2 waiting for reader p1".into(),
        )?;
        o.count_under_fault(&h, &[(killed_at, u64::MAX)]);
        o.expect_clean(&[1, 3, 4]);
        o.judge_availability(&h, killed_at, TTL + AVAILABILITY_SLACK, true);
        Ok(o)
    }
}

/// Whether C1 flagged a writer's lease beside a reader's in `h`.
fn writer_beside_reader(h: &[Event]) -> bool {
    readers_beside_writer(h)
        .iter()
        .any(|v| v.explanation.starts_with("writer") && v.explanation.contains("while reader"))
}

/// Fails `o` unless two readers (processes 1 to `readers`) ever held the lock at once:
/// readers that took turns as writers do would pass C1 without the sharing being
/// exercised.
fn expect_readers_together(o: &mut Outcome, h: &[Event], readers: u32) {
    let readers: Vec<Event> = h.iter().filter(|e| e.process <= readers).cloned().collect();
    if leases_overlap(&readers).is_empty() {
        o.failed
            .push("never two readers at once (the sharing was not exercised)".into());
    }
}
