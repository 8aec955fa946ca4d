//! Single-node scenarios where a process is paused or killed: a worker SIGSTOPped between
//! its read and its write or SIGKILLed holding the lock, the resource server killed, the
//! lock server SIGSTOPped while workers acquire.

use std::thread;
use std::time::{Duration, Instant};

use testkit::history::{Op, Phase, monotonic_ns};

use super::{AVAILABILITY_SLACK, Scenario};
use crate::harness::{
    Lab, Resource, SCENARIO_TIMEOUT, TTL, Workers, process_stopped, signal, spans,
};
use crate::outcomes::Outcome;

pub const PAUSED_WORKER_FENCED: Scenario = Scenario {
    name: "paused-worker-fenced",
    what: "p1 SIGSTOPs itself between read and write, for 3 TTLs; p2 works meanwhile",
    expected: "the fenced resource rejects p1's late write; every checker holds",
    run: |lab, tag, _| lab.paused_worker(tag, Resource::Fenced, Hold::Fixed),
};

pub const PAUSED_WORKER_UNFENCED: Scenario = Scenario {
    name: "paused-worker-unfenced",
    what: "the same on an unfenced resource",
    expected: "**positive control**: C1 and C2 flag the late write, the counter shows the \
        lost update",
    run: |lab, tag, _| lab.paused_worker(tag, Resource::Unfenced, Hold::Fixed),
};

pub const PAUSED_WORKER_RENEWED: Scenario = Scenario {
    name: "paused-worker-renewed",
    what: "the same with a watchdog-renewed lease (renewals stop while p1 is stopped)",
    expected: "p1's guard reports the loss before the write (or the fence rejects it); its \
        renewals never touch p2's key",
    run: |lab, tag, _| lab.paused_worker(tag, Resource::Fenced, Hold::Renewed),
};

pub const PAUSED_WORKER_POSTGRES: Scenario = Scenario {
    name: "paused-worker-postgres",
    what: "paused-worker-fenced with the resource in PostgreSQL, checked by \
        `fencelock_check` in each write's transaction",
    expected: "PostgreSQL rolls back p1's late write; every checker holds",
    run: |lab, tag, _| lab.paused_worker(tag, Resource::FencedPostgres, Hold::Fixed),
};

pub const PAUSED_WORKER_POSTGRES_RENEWED: Scenario = Scenario {
    name: "paused-worker-postgres-renewed",
    what: "paused-worker-renewed with the resource in PostgreSQL",
    expected: "p1's guard reports the loss before the write, or PostgreSQL rolls it back",
    run: |lab, tag, _| lab.paused_worker(tag, Resource::FencedPostgres, Hold::Renewed),
};

pub const PAUSED_WORKER_POSTGRES_UNFENCED: Scenario = Scenario {
    name: "paused-worker-postgres-unfenced",
    what: "paused-worker-postgres without the check",
    expected: "**positive control**: C1 and C2 flag the late write, the counter in \
        PostgreSQL shows the lost update",
    run: |lab, tag, _| lab.paused_worker(tag, Resource::UnfencedPostgres, Hold::Fixed),
};

pub const ELECT_PAUSED_LEADER: Scenario = Scenario {
    name: "elect-paused-leader",
    what: "p1 and p2 elect (`Client::election`, a renewed 500 ms lease): p1 leads and \
        SIGSTOPs itself between read and write, for 3 TTLs; p2 leads and writes \
        meanwhile; p1 resumes and writes with its old term without a look at its loss \
        signal (as one paused between that look and its write)",
    expected: "the fenced resource refuses p1's late write (its term lower than p2's); \
        every checker holds",
    run: |lab, tag, _| lab.paused_worker(tag, Resource::Fenced, Hold::Leader),
};

/// What the paused worker holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// A lock with a fixed lease.
    Fixed,
    /// A lock with a watchdog-renewed lease.
    Renewed,
    /// Leadership (both workers elect); the paused leader writes without checking its
    /// loss signal.
    Leader,
}

impl Lab {
    /// Worker 1 takes the lock and stops itself (SIGSTOP) between its read and its write
    /// for 3 TTLs; worker 2 acquires and writes meanwhile; worker 1 then writes late with
    /// its old token. `Hold::Renewed`: worker 1 holds a watchdog-renewed lease, whose
    /// renewals stop while it is stopped (and must not touch worker 2's key when it
    /// resumes); `Hold::Leader`: both lead an election instead, worker 1's write unchecked.
    fn paused_worker(&self, tag: &str, resource: Resource, hold: Hold) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let (mut args_a, hist_a) = self.worker_args(tag, 1, resource, 3);
        let (mut args_b, hist_b) = self.worker_args(tag, 2, resource, 10);
        args_a.push("--stop-after-first-read".into());
        match hold {
            Hold::Fixed => {}
            Hold::Renewed => args_a.push("--renewed".into()),
            Hold::Leader => {
                args_a.extend(["--election".into(), "--unchecked".into()]);
                args_b.push("--election".into());
            }
        }
        let renewed = hold != Hold::Fixed;
        let pid_a = workers.spawn(&self.exe, &args_a)?;
        // A stops itself inside its lease: wait until the kernel shows it stopped.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !process_stopped(pid_a) {
            if Instant::now() > deadline {
                return Err(format!("{tag}: worker 1 never stopped holding the lock"));
            }
            thread::sleep(Duration::from_millis(1));
        }
        let stopped_at = Instant::now();
        let stopped_ns = monotonic_ns();
        workers.spawn(&self.exe, &args_b)?;
        thread::sleep((3 * TTL).saturating_sub(stopped_at.elapsed()));
        signal(pid_a, libc::SIGCONT);
        let resumed_ns = monotonic_ns();
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;

        let faults = format!(
            "SIGSTOP p1 for {} ms holding a {} lease{}",
            (3 * TTL).as_millis(),
            match hold {
                Hold::Fixed => "fixed",
                Hold::Renewed => "renewed",
                Hold::Leader => "leader's",
            },
            if resource.store() == crate::store::StoreKind::Postgres {
                " (resource in PostgreSQL)"
            } else {
                ""
            }
        );
        let (mut o, h) = self.judge(tag, &[hist_a, hist_b], faults)?;
        o.count_under_fault(&h, &[(stopped_ns, resumed_ns)]);
        // A's late write: the completion of its write with its first token (renewed: none,
        // if the guard reported the loss before it).
        let first_token = h
            .iter()
            .find(|e| e.process == 1 && e.op == Op::Acquire && e.phase == Phase::Ok)
            .and_then(|e| e.token);
        let late_write = h.iter().find(|e| {
            e.process == 1
                && e.op == Op::Write
                && e.phase != Phase::Invoke
                && e.token == first_token
        });
        let first_acquire_b = h
            .iter()
            .find(|e| e.process == 2 && e.op == Op::Acquire && e.phase == Phase::Ok);
        let b_during_pause = first_acquire_b.is_some_and(|b| {
            h.iter()
                .find(|e| e.process == 1 && e.op != Op::Acquire && e.op != Op::Read)
                .is_some_and(|a_next| b.time_ns < a_next.time_ns)
        });
        if !b_during_pause {
            o.failed
                .push("p2 did not acquire while p1 was paused (no fault exercised)".into());
        }
        match (resource.fenced(), renewed && hold != Hold::Leader) {
            (true, false) => {
                if late_write.map(|e| e.phase) != Some(Phase::Fail) {
                    o.failed
                        .push("the fenced resource did not reject p1's late write".into());
                }
                o.expect_clean(&[1, 2, 3, 4, 5]);
            }
            (true, true) => {
                // Either the guard reported the loss before the write (no write at all) or
                // the write was rejected by the fence.
                if late_write.is_some_and(|e| e.phase == Phase::Ok) {
                    o.failed
                        .push("p1's late write was accepted despite the fence".into());
                }
                o.expect_clean(&[1, 2, 3, 4, 5]);
            }
            (false, _) => {
                if late_write.map(|e| e.phase) != Some(Phase::Ok) {
                    o.failed
                        .push("the unfenced resource did not take p1's late write".into());
                }
                // Positive controls.
                o.expect_detected(1, "p1's late write outside its lease");
                o.expect_detected(2, "the stale token the unfenced resource accepted");
                if o.counter >= o.acked as i64 {
                    o.failed.push(format!(
                        "positive control missed: no lost update (counter {} >= {} acked writes)",
                        o.counter, o.acked
                    ));
                }
                o.expect_clean(&[3, 4, 5]);
            }
        }
        Ok(o)
    }
}

pub const HOLDER_KILLED: Scenario = Scenario {
    name: "holder-killed",
    what: "p1 SIGKILLed while holding a renewed lease; p2, p3 waiting",
    expected: "C6: the next acquire within one TTL + 300 ms of the kill",
    run: |lab, tag, _| lab.holder_killed(tag, Resource::Fenced, false),
};

pub const HOLDER_KILLED_POSTGRES: Scenario = Scenario {
    name: "holder-killed-postgres",
    what: "holder-killed with the resource in PostgreSQL, checked by `fencelock_check`",
    expected: "C6: the next acquire within one TTL + 300 ms of the kill; every checker \
        holds",
    run: |lab, tag, _| lab.holder_killed(tag, Resource::FencedPostgres, false),
};

pub const HOLDER_KILLED_LONG_LEASE: Scenario = Scenario {
    name: "holder-killed-long-lease",
    what: "the same, p1's lease 2 s (four times the TTL C6 judges by)",
    expected: "**positive control**: C6 flags the late next holder",
    run: |lab, tag, _| lab.holder_killed(tag, Resource::Fenced, true),
};

impl Lab {
    /// Worker 1 holds a renewed lease and is SIGKILLed while holding it; workers 2 and 3
    /// wait for the lock. C6: the next acquire comes within one TTL (plus slack) of the
    /// kill, not at the end of some retry schedule.
    fn holder_killed(
        &self,
        tag: &str,
        resource: Resource,
        control: bool,
    ) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let (mut args_a, hist_a) = self.worker_args(tag, 1, resource, 1);
        args_a.extend(["--renewed".into(), "--hold-first-ms=60000".into()]);
        if control {
            // A lease four times longer than the bound C6 judges by.
            args_a.push(format!("--ttl-ms={}", (4 * TTL).as_millis()));
        }
        let pid_a = workers.spawn(&self.exe, &args_a)?;
        self.wait_for_acquire(tag, std::slice::from_ref(&hist_a))?;
        let mut histories = vec![hist_a];
        for p in 2..=3 {
            let (args, path) = self.worker_args(tag, p, resource, 5);
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        self.wait_for_acquire(tag, &histories)?;
        // The kill falls after at least one renewal of p1's lease (every third of it).
        thread::sleep(TTL / 2);
        let killed_at = monotonic_ns();
        workers.kill(pid_a);
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;

        let faults = format!(
            "SIGKILL p1 holding a renewed {} ms lease{}",
            if control { 4 * TTL } else { TTL }.as_millis(),
            if resource.store() == crate::store::StoreKind::Postgres {
                " (resource in PostgreSQL)"
            } else {
                ""
            }
        );
        let (mut o, h) = self.judge(tag, &histories, faults)?;
        // The dead holder stays dead: every acquisition after the kill is under it.
        o.count_under_fault(&h, &[(killed_at, u64::MAX)]);
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        o.judge_availability(&h, killed_at, TTL + AVAILABILITY_SLACK, !control);
        if control {
            o.expect_detected(6, "the next holder coming a 2 s lease after the kill");
        }
        Ok(o)
    }
}

pub const RESOURCE_CRASH: Scenario = Scenario {
    name: "resource-crash",
    what: "3 workers write to the fenced resource; then its server is kill -9ed and \
        restarted without persistence",
    expected: "**positive control**: C3 flags every acknowledged write as lost",
    run: |lab, tag, _| lab.resource_crash(tag),
};

impl Lab {
    /// Positive control of C3: workers write to the fenced resource, then the resource
    /// server is SIGKILLed and restarted without persistence. C3 must report every
    /// acknowledged write as lost.
    fn resource_crash(&mut self, tag: &str) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        for p in 1..=3 {
            let (args, path) = self.worker_args(tag, p, Resource::Fenced, 5);
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;
        // The fault comes after the last acquisition: none is under it.
        self.resource.kill();
        self.resource.restart();
        let (mut o, _) = self.judge(
            tag,
            &histories,
            "kill -9 + restart the resource server (no persistence)".into(),
        )?;
        o.expect_clean(&[1, 2, 4, 5]);
        if o.violations[2] != Some(o.acked) || o.acked == 0 {
            o.failed.push(format!(
                "positive control: C3 should flag all {} acknowledged writes, found {:?}",
                o.acked, o.violations[2]
            ));
        }
        Ok(o)
    }
}

pub const QUEUED_SET_NX: Scenario = Scenario {
    name: "queued-set-nx",
    what: "the Redis server SIGSTOPped for 3 TTLs while workers acquire (their SET NX \
        queue in its socket, their clients time out and retry)",
    expected: "C6: the lock back within one TTL of SIGCONT; every checker holds",
    run: |lab, tag, scale| lab.queued_set_nx(tag, scale.faulty),
};

impl Lab {
    /// The lock server is SIGSTOPped for 3 TTLs while the workers acquire (their
    /// response timeout is 200 ms, so they give up and retry while their `SET NX` sits
    /// queued in the server's socket); on SIGCONT the queued scripts run. The lock must
    /// come back within one TTL of the resume, and no late grant may overlap another.
    fn queued_set_nx(&mut self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        for p in 1..=3 {
            let (mut args, path) = self.worker_args(tag, p, Resource::Fenced, iterations);
            args.push("--lock-timeout-ms=200".into());
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        self.wait_for_acquire(tag, &histories)?;
        let paused_at = monotonic_ns();
        self.lock.pause();
        thread::sleep(3 * TTL);
        self.lock.resume();
        let resumed_at = monotonic_ns();
        workers.wait_all(Instant::now() + self.timeout(iterations) + SCENARIO_TIMEOUT)?;

        let faults = format!("SIGSTOP the lock server for {} ms", (3 * TTL).as_millis());
        let (mut o, h) = self.judge(tag, &histories, faults)?;
        o.count_under_fault(&h, &[(paused_at, resumed_at)]);
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        // Exercised: an acquire sent while the server was stopped completed after it
        // resumed.
        let spanning = spans(&h, Op::Acquire, paused_at, resumed_at);
        if spanning == 0 {
            o.failed
                .push("no acquire was in flight across the pause (no fault exercised)".into());
        }
        o.judge_availability(&h, resumed_at, TTL + AVAILABILITY_SLACK, true);
        Ok(o)
    }
}
