//! The scenarios: each runs one round under a tag of its own (its lock name, resource
//! keys and history files), judges the merged history and returns an [`Outcome`] with
//! the expectations that failed. Every fault is really caused: a worker process stops
//! itself (SIGSTOP) or is SIGKILLed, a redis-server is paused, killed or restarted, or a
//! [`FaultProxy`] on the link delays, blackholes or partitions the traffic.

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{Error, LossCause, NodeOutcome};
use testkit::history::{Event, HistoryWriter, Op, Phase, monotonic_ns};
use testkit::{Fault, FaultProxy, RedisServer};

use crate::harness::{
    Harness, Lab, Resource, SCENARIO_TIMEOUT, TOUCH_MARGIN, TTL, Workers, acquired, durations, ns,
    process_stopped, release, release_phase, runtime, signal, spans,
};
use crate::outcomes::Outcome;

/// Redlock per-node timeout.
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Connect and response timeout of the Redlock workers' client: bounds how long a
/// release waits for a blackholed node.
const REDLOCK_CLIENT_TIMEOUT: Duration = Duration::from_millis(150);
/// Fixed lease of A in the crash-restart scenarios (and their quarantine when protected).
const RESTART_TTL: Duration = Duration::from_secs(3);

/// Slack on top of a TTL for "the next holder gets the lock within one TTL": the
/// waiters' wake-up and one round trip on a loaded 2-core machine.
const AVAILABILITY_SLACK: Duration = Duration::from_millis(300);

/// A link that delivers nothing until it heals (set to [`Fault::Pass`], which delivers
/// everything held back, in order).
const PARTITIONED: Fault = Fault::Delay {
    base: Duration::from_secs(3600),
    jitter: Duration::ZERO,
};

/// How the crashed node of a Redlock crash-restart scenario comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// Empty (no persistence), restart protection off.
    Unprotected,
    /// Empty, restart protection on (quarantine = the TTL).
    Protected,
    /// With its data (`appendfsync always`), restart protection off.
    Persistent,
}

/// Which minority fault a Redlock scenario injects on nodes n2 and n4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Minority {
    /// Their proxies swallow every byte.
    Blackholed,
    /// The redis-servers are SIGSTOPped (requests queue in their sockets).
    Paused,
    /// The redis-servers are SIGKILLed, restarted (empty) at the end of the round.
    Killed,
}

impl Lab {
    /// Workers on the fenced resource, no faults: the baseline every checker must pass.
    pub fn no_faults(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        let (mut workers, histories) = self.spawn_all(
            (1..=3)
                .map(|p| self.worker_args(tag, p, Resource::Fenced, iterations))
                .collect(),
        )?;
        workers.wait_all(Instant::now() + self.timeout(iterations))?;
        let (mut o, _) = self.judge(tag, &histories, "none".into())?;
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        if o.acquisitions == 0 {
            o.failed.push("no acquisition".into());
        }
        Ok(o)
    }

    /// Worker 1 takes the lock and stops itself (SIGSTOP) between its read and its write
    /// for 3 TTLs; worker 2 acquires and writes meanwhile; worker 1 then writes late with
    /// its old token. `renewed`: worker 1 holds a watchdog-renewed lease, whose renewals
    /// stop while it is stopped (and must not touch worker 2's key when it resumes).
    pub fn paused_worker(
        &self,
        tag: &str,
        resource: Resource,
        renewed: bool,
    ) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let (mut args_a, hist_a) = self.worker_args(tag, 1, resource, 3);
        args_a.push("--stop-after-first-read".into());
        if renewed {
            args_a.push("--renewed".into());
        }
        let (args_b, hist_b) = self.worker_args(tag, 2, resource, 10);
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
        workers.spawn(&self.exe, &args_b)?;
        thread::sleep((3 * TTL).saturating_sub(stopped_at.elapsed()));
        signal(pid_a, libc::SIGCONT);
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;

        let faults = format!(
            "SIGSTOP p1 for {} ms holding a {} lease",
            (3 * TTL).as_millis(),
            if renewed { "renewed" } else { "fixed" }
        );
        let (mut o, h) = self.judge(tag, &[hist_a, hist_b], faults)?;
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
        match (resource, renewed) {
            (Resource::Fenced, false) => {
                if late_write.map(|e| e.phase) != Some(Phase::Fail) {
                    o.failed
                        .push("the fenced resource did not reject p1's late write".into());
                }
                o.expect_clean(&[1, 2, 3, 4, 5]);
            }
            (Resource::Fenced, true) => {
                // Either the guard reported the loss before the write (no write at all) or
                // the write was rejected by the fence.
                if late_write.is_some_and(|e| e.phase == Phase::Ok) {
                    o.failed
                        .push("p1's late write was accepted despite the fence".into());
                }
                o.expect_clean(&[1, 2, 3, 4, 5]);
            }
            (Resource::Unfenced, _) => {
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

    /// Worker 1 holds a renewed lease and is SIGKILLed while holding it; workers 2 and 3
    /// wait for the lock. C6: the next acquire comes within one TTL (plus slack) of the
    /// kill, not at the end of some retry schedule.
    pub fn holder_killed(&self, tag: &str, control: bool) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let (mut args_a, hist_a) = self.worker_args(tag, 1, Resource::Fenced, 1);
        args_a.extend(["--renewed".into(), "--hold-first-ms=60000".into()]);
        if control {
            // A lease four times longer than the bound C6 judges by.
            args_a.push(format!("--ttl-ms={}", (4 * TTL).as_millis()));
        }
        let pid_a = workers.spawn(&self.exe, &args_a)?;
        self.wait_for_acquire(tag, std::slice::from_ref(&hist_a))?;
        let mut histories = vec![hist_a];
        for p in 2..=3 {
            let (args, path) = self.worker_args(tag, p, Resource::Fenced, 5);
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        self.wait_for_acquire(tag, &histories)?;
        // The kill falls after at least one renewal of p1's lease (every sixth of it).
        thread::sleep(TTL / 2);
        let killed_at = monotonic_ns();
        workers.kill(pid_a);
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;

        let faults = format!(
            "SIGKILL p1 holding a renewed {} ms lease",
            if control { 4 * TTL } else { TTL }.as_millis()
        );
        let (mut o, h) = self.judge(tag, &histories, faults)?;
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        o.judge_availability(&h, killed_at, TTL + AVAILABILITY_SLACK, !control);
        if control {
            o.expect_detected(6, "the next holder coming a 2 s lease after the kill");
        }
        Ok(o)
    }

    /// Positive control of C3: workers write to the fenced resource, then the resource
    /// server is SIGKILLed and restarted without persistence. C3 must report every
    /// acknowledged write as lost.
    pub fn resource_crash(&mut self, tag: &str) -> Result<Outcome, String> {
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        for p in 1..=3 {
            let (args, path) = self.worker_args(tag, p, Resource::Fenced, 5);
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;
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

    /// Positive control of C4 (and C2 at work): A acquires and writes; the lock's fencing
    /// counter is set back to 1 by hand (a restored backup, a counter reset); B acquires
    /// with a lower token than A's. C4 must flag it, and the fenced resource rejects B's
    /// write.
    pub fn counter_rewound(&self, tag: &str) -> Result<Outcome, String> {
        let rt = runtime()?;
        let client = rt
            .block_on(fencelock::Client::connect(&self.lock.url()))
            .map_err(|e| format!("{tag}: connect: {e}"))?;
        let lock = format!("lab:{tag}");
        let mut resource = self.resource_writer(tag)?;
        let mut histories = Vec::new();
        let mut b_write = None;
        for p in 1..=2 {
            let path = self.dir.join(format!("{tag}-p{p}.jsonl"));
            let mut w = HistoryWriter::create(&path).map_err(|e| e.to_string())?;
            histories.push(path);
            if p == 2 {
                self.lock
                    .cmd(&["SET", &format!("fencelock:{{{lock}}}:fence"), "1"]);
            }
            w.append(&Event::now(p, Op::Acquire, Phase::Invoke))
                .map_err(|e| e.to_string())?;
            let g = rt
                .block_on(client.lock(&lock).lease(TTL).renew(false).try_acquire())
                .map_err(|e| format!("{tag}: p{p} did not acquire: {e}"))?;
            w.append(&acquired(p, &g, &client))
                .map_err(|e| e.to_string())?;
            let (owner, token) = (g.holder_token().clone(), g.fencing_token().get());
            let accepted = resource.write(&mut w, p, token, owner.as_str(), i64::from(p))?;
            if p == 2 {
                b_write = Some(accepted);
            }
            w.append(&release(p, Phase::Invoke, &owner, token))
                .map_err(|e| e.to_string())?;
            let r = rt.block_on(g.release());
            w.append(&release(p, release_phase(&r), &owner, token))
                .map_err(|e| e.to_string())?;
        }
        let (mut o, _) = self.judge(
            tag,
            &histories,
            "the fencing counter set back to 1 between two holders".into(),
        )?;
        o.expect_clean(&[1, 2, 3, 5]);
        o.expect_detected(4, "B's token below A's");
        if b_write != Some(false) {
            o.failed
                .push("the fenced resource did not reject B's lower token".into());
        }
        Ok(o)
    }

    /// Worker 1 reaches the lock server through a proxy that delays every chunk by
    /// 150-450 ms each way, so most of its grants come back after their 500 ms lease;
    /// workers 2 and 3 are direct. A grant that arrives late must not become a guard.
    pub fn delayed_replies(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        let proxy = FaultProxy::start(&self.lock.addr());
        proxy.set(Fault::Delay {
            base: TTL * 3 / 10,
            jitter: TTL * 6 / 10,
        });
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        let (mut args, path) = self.worker_args_on(tag, 1, Resource::Fenced, 3, &[proxy.url()]);
        args.extend(["--lock-timeout-ms=3000".into(), "--wait-ms=2000".into()]);
        workers.spawn(&self.exe, &args)?;
        histories.push(path);
        for p in 2..=3 {
            let (args, path) = self.worker_args(tag, p, Resource::Fenced, iterations);
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        workers.wait_all(Instant::now() + self.timeout(iterations) + SCENARIO_TIMEOUT)?;
        drop(proxy);

        let faults = format!(
            "p1's link delayed {}-{} ms each way (TTL {} ms)",
            (TTL * 3 / 10).as_millis(),
            (TTL * 9 / 10).as_millis(),
            TTL.as_millis()
        );
        let (mut o, h) = self.judge(tag, &histories, faults)?;
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        let late_refusals = h
            .iter()
            .filter(|e| {
                e.process == 1
                    && e.op == Op::Acquire
                    && e.phase == Phase::Fail
                    && e.error.as_deref().is_some_and(|m| m.contains("lease"))
            })
            .count();
        let short_grants = h
            .iter()
            .filter(|e| e.process == 1 && e.op == Op::Acquire && e.phase == Phase::Ok)
            .filter(|e| e.valid_until_ns.is_some_and(|v| v <= e.time_ns))
            .count();
        if late_refusals == 0 {
            o.failed
                .push("p1 never had a grant refused for arriving late (no fault exercised)".into());
        }
        if short_grants > 0 {
            o.failed.push(format!(
                "p1 got {short_grants} guard(s) whose lease was over when it arrived"
            ));
        }
        o.faults
            .push_str(&format!("; {late_refusals} late grants refused"));
        Ok(o)
    }

    /// The lock server is SIGSTOPped for 3 TTLs while the workers acquire (their
    /// response timeout is 200 ms, so they give up and retry while their `SET NX` sits
    /// queued in the server's socket); on SIGCONT the queued scripts run. The lock must
    /// come back within one TTL of the resume, and no late grant may overlap another.
    pub fn queued_set_nx(&mut self, tag: &str, iterations: u32) -> Result<Outcome, String> {
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

    /// The unknown outcome, for real. The harness holds the lock (fixed TTL) while
    /// worker 1, which reaches the lock server through a proxy, waits for it. Then the
    /// proxy forwards worker 1's requests but drops every reply: the harness's lease runs
    /// out, worker 1's timer-driven attempt takes the lock on the server, and worker 1
    /// never hears of it. Workers 2 and 3 (direct) start then and find the lock held by
    /// that grant. 3 TTLs after the harness's lease ended the proxy resets worker 1's
    /// connections and passes again. Such a grant must never become a guard unseen, must be withdrawn or
    /// expire, and the lock must come back within one TTL of the heal.
    pub fn dropped_replies(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        let Harness {
            rt,
            client,
            lock,
            key,
        } = self.harness(tag)?;
        let hist_h = self.dir.join(format!("{tag}-p4.jsonl"));
        let mut wh = HistoryWriter::create(&hist_h).map_err(|e| e.to_string())?;
        wh.append(&Event::now(4, Op::Acquire, Phase::Invoke))
            .map_err(|e| e.to_string())?;
        // Long enough for worker 1 to start and queue up behind it on a loaded machine.
        let holder = rt
            .block_on(client.lock(&lock).lease(4 * TTL).renew(false).try_acquire())
            .map_err(|e| format!("{tag}: the harness did not acquire: {e}"))?;
        wh.append(&acquired(4, &holder, &client))
            .map_err(|e| e.to_string())?;
        let holder_owner = holder.holder_token().as_str().to_owned();
        let holder_until = holder.valid_until();

        let proxy = FaultProxy::start(&self.lock.addr());
        let (mut args, hist_1) =
            self.worker_args_on(tag, 1, Resource::Fenced, iterations, &[proxy.url()]);
        args.push("--lock-timeout-ms=200".into());
        let (mut workers, mut histories) = self.spawn_all(vec![(args, hist_1)])?;
        // Worker 1 waits once the server confirmed its subscription to the lock's
        // release channel (it subscribes after its first refusal).
        let channel = format!("{key}:released");
        while self
            .lock
            .cmd(&["PUBSUB", "NUMSUB", &channel])
            .as_array()
            .and_then(|a| a.get(1)?.as_int())
            != Some(1)
        {
            if Instant::now() > holder_until {
                return Err(format!(
                    "{tag}: worker 1 did not queue up within the harness's {} ms lease",
                    (4 * TTL).as_millis()
                ));
            }
            thread::sleep(Duration::from_millis(1));
        }
        proxy.set(Fault::DropReplies);
        let dropped = Instant::now();
        // Until 3 TTLs after the harness's lease ends: worker 1's lease-bound timer fires
        // then, and its attempt takes the free lock on the server.
        let heal_at = holder_until + 3 * TTL;
        // Sample who holds the lock while worker 1 hears nothing; start workers 2 and 3
        // once a holder other than the harness shows up (worker 1's grant: nobody else
        // runs yet).
        let mut seen_holders = std::collections::HashSet::new();
        let mut started_others = false;
        while Instant::now() < heal_at {
            if let Some(owner) = self.lock.cmd(&["GET", &key]).as_str() {
                if owner != holder_owner && !started_others {
                    for p in 2..=3 {
                        let (args, path) = self.worker_args(tag, p, Resource::Fenced, iterations);
                        workers.spawn(&self.exe, &args)?;
                        histories.push(path);
                    }
                    started_others = true;
                }
                seen_holders.insert(owner.to_owned());
            }
            thread::sleep(Duration::from_millis(2));
        }
        proxy.set(Fault::Reset);
        proxy.set(Fault::Pass);
        let healed_at = monotonic_ns();
        let fault = dropped.elapsed();
        workers.wait_all(Instant::now() + self.timeout(iterations) + SCENARIO_TIMEOUT)?;
        drop(proxy);
        // The harness's lease ran out long ago: its release reports the loss.
        wh.append(&release(
            4,
            Phase::Invoke,
            holder.holder_token(),
            holder.fencing_token().get(),
        ))
        .map_err(|e| e.to_string())?;
        let (owner_h, token_h) = (holder.holder_token().clone(), holder.fencing_token().get());
        let released = rt.block_on(holder.release());
        wh.append(&release(4, release_phase(&released), &owner_h, token_h))
            .map_err(|e| e.to_string())?;
        histories.push(hist_h);

        let (mut o, h) = self.judge(tag, &histories, String::new())?;
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        // A holder seen in the fault whose client learned of its grant only after the
        // heal (a retry of the same acquire found its own token) or never.
        let told = |owner: &str| {
            h.iter()
                .find(|e| {
                    e.op == Op::Acquire && e.phase == Phase::Ok && e.owner.as_deref() == Some(owner)
                })
                .map(|e| e.time_ns)
        };
        let (mut late, mut never) = (0, 0);
        for owner in &seen_holders {
            match told(owner) {
                None => never += 1,
                Some(t) if t >= healed_at => late += 1,
                Some(_) => {}
            }
        }
        if late + never == 0 {
            o.failed.push(
                "no holder during the fault was a grant its client had not heard of (no fault \
                 exercised)"
                    .into(),
            );
        }
        if !started_others {
            o.failed
                .push("workers 2 and 3 never started: nobody took the lock in the fault".into());
        }
        o.judge_availability(&h, healed_at, TTL + AVAILABILITY_SLACK, true);
        o.faults = format!(
            "p1's replies dropped for {} ms, then its connections reset; grants unheard of \
             in the fault: {late} confirmed by a retry after the heal, {never} never",
            fault.as_millis()
        );
        Ok(o)
    }

    /// Extend and release after expiry, driven by the harness through the library: A
    /// acquires with a fixed 300 ms TTL, lets it run out; B acquires; A's extend and
    /// release must both report the lease lost and leave B's key alone. Then A runs the
    /// seed articles' mistake, an unchecked `DEL` script: C5 must catch it (positive
    /// control).
    pub fn expired_holder(&self, tag: &str) -> Result<Outcome, String> {
        let Harness {
            rt,
            client,
            lock,
            key,
        } = self.harness(tag)?;
        let ttl = Duration::from_millis(300);
        let hist_a = self.dir.join(format!("{tag}-p1.jsonl"));
        let hist_b = self.dir.join(format!("{tag}-p2.jsonl"));
        let mut wa = HistoryWriter::create(&hist_a).map_err(|e| e.to_string())?;
        let mut wb = HistoryWriter::create(&hist_b).map_err(|e| e.to_string())?;
        let rec = |w: &mut HistoryWriter, e: Event| w.append(&e).map_err(|e| e.to_string());
        let mut o_failed = Vec::new();

        rec(&mut wa, Event::now(1, Op::Acquire, Phase::Invoke))?;
        let guard_a = rt
            .block_on(client.lock(&lock).lease(ttl).renew(false).try_acquire())
            .map_err(|e| format!("{tag}: A did not acquire: {e}"))?;
        rec(&mut wa, acquired(1, &guard_a, &client))?;
        let (owner_a, token_a) = (
            guard_a.holder_token().clone(),
            guard_a.fencing_token().get(),
        );
        // Wait for the server to expire A's key (an observed state, not a guess).
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.lock.cmd(&["EXISTS", &key]).as_int() != Some(0) {
            if Instant::now() > deadline {
                return Err(format!("{tag}: A's key never expired"));
            }
            thread::sleep(Duration::from_millis(5));
        }
        // ...and let its clock move past C5's margin around that expiry, so the replay
        // knows the key was free when B takes it.
        let expired_at = server_time_us(&self.lock);
        while server_time_us(&self.lock) < expired_at + 2 * ns(TOUCH_MARGIN) / 1000 {
            if Instant::now() > deadline {
                return Err(format!("{tag}: the server's clock does not move"));
            }
            thread::sleep(Duration::from_millis(1));
        }
        rec(&mut wb, Event::now(2, Op::Acquire, Phase::Invoke))?;
        let guard_b = rt
            .block_on(
                client
                    .lock(&lock)
                    .lease(Duration::from_secs(5))
                    .renew(false)
                    .try_acquire(),
            )
            .map_err(|e| format!("{tag}: B did not acquire: {e}"))?;
        rec(&mut wb, acquired(2, &guard_b, &client))?;
        let owner_b = guard_b.holder_token().clone();

        // A extends, then releases, after its lease ran out.
        let mut guard_a = guard_a;
        let ev = |op, phase| {
            Event::now(1, op, phase)
                .with_token(token_a)
                .with_owner(owner_a.as_str())
        };
        rec(&mut wa, ev(Op::Extend, Phase::Invoke))?;
        let extended = rt.block_on(guard_a.extend(ttl));
        rec(
            &mut wa,
            ev(
                Op::Extend,
                if extended.is_ok() {
                    Phase::Ok
                } else {
                    Phase::Fail
                },
            ),
        )?;
        // A's guard heard of the loss before its lease ended, so the extend is refused
        // without asking Redis; the release below still asks, owner-checked.
        if !matches!(extended, Err(Error::LeaseLost { .. })) {
            o_failed.push(format!(
                "A's late extend: expected LeaseLost, got {extended:?}"
            ));
        }
        rec(&mut wa, release(1, Phase::Invoke, &owner_a, token_a))?;
        let released = rt.block_on(guard_a.release());
        rec(
            &mut wa,
            release(1, release_phase(&released), &owner_a, token_a),
        )?;
        if !matches!(
            released,
            Err(Error::LeaseLost {
                cause: LossCause::TakenByOther,
                ..
            })
        ) {
            o_failed.push(format!(
                "A's late release: expected LeaseLost(TakenByOther), got {released:?}"
            ));
        }
        let b_intact = self.lock.cmd(&["GET", &key]).as_str() == Some(owner_b.as_str());
        if !b_intact {
            o_failed.push("B's key changed after A's late extend and release".into());
        }

        // The mistake the seeds warn about: a release that does not check the owner.
        let unchecked = self.lock.cmd(&[
            "EVAL",
            "return redis.call('DEL', KEYS[1])",
            "1",
            &key,
            owner_a.as_str(),
        ]);
        if unchecked.as_int() != Some(1) {
            o_failed.push(format!(
                "the unchecked DEL did not delete B's key: {unchecked}"
            ));
        }
        drop(guard_b); // B's key is gone already; its drop release finds nothing.
        rt.block_on(client.flush());
        drop((wa, wb));

        let faults = "A's 300 ms lease expires; B acquires; A extends, releases, then runs an \
                      unchecked DEL script"
            .to_owned();
        let (mut o, _) = self.judge(tag, &[hist_a, hist_b], faults)?;
        o.failed.extend(o_failed);
        o.expect_clean(&[1, 2, 3, 4]);
        // Positive control: exactly the unchecked DEL, nothing else.
        match o.violations[4] {
            Some(1) => {}
            other => o.failed.push(format!(
                "positive control: C5 should flag exactly the unchecked DEL, found {other:?}"
            )),
        }
        Ok(o)
    }

    /// Redlock over 5 nodes, each behind its own proxy; 3 workers on the fenced
    /// resource; once they run, n2 and n4 fail (blackholed, paused or killed). Acquires
    /// must keep succeeding on the majority, and every checker must hold.
    pub fn redlock_minority(
        &mut self,
        tag: &str,
        fault: Minority,
        iterations: u32,
    ) -> Result<Outcome, String> {
        let proxies = self.proxied_nodes();
        let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
        let (mut workers, histories) = self.spawn_all(
            (1..=3)
                .map(|p| self.redlock_worker(tag, p, iterations, &urls))
                .collect(),
        )?;
        self.wait_for_acquire(tag, &histories)?;
        let fault_at = monotonic_ns();
        for i in [1, 3] {
            match fault {
                Minority::Blackholed => proxies[i].set(Fault::Blackhole),
                Minority::Paused => self.nodes[i].pause(),
                Minority::Killed => self.nodes[i].kill(),
            }
        }
        let waited = workers.wait_all(Instant::now() + self.timeout(iterations) + SCENARIO_TIMEOUT);
        for i in [1, 3] {
            match fault {
                Minority::Blackholed => {}
                Minority::Paused => self.nodes[i].resume(),
                Minority::Killed => self.nodes[i].restart(),
            }
        }
        waited?;
        drop(proxies);

        let faults = format!("{fault:?} n2, n4 of 5 after the first acquire").to_lowercase();
        let (mut o, h) = self.judge(tag, &histories, faults)?;
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        let after = |phase| {
            h.iter()
                .filter(|e| e.op == Op::Acquire && e.phase == phase && e.time_ns > fault_at)
                .count()
        };
        let (ok, failed) = (after(Phase::Ok), after(Phase::Fail));
        // Exercised: acquires invoked after the fault wait out the node timeout of the
        // faulty nodes (blackholed and paused nodes do not answer; killed ones refuse at
        // once, so there the fault shows in the node reports instead).
        if fault != Minority::Killed {
            let fast = durations(&h, Op::Acquire)
                .filter(|&(start, _, d)| start > fault_at && d < ns(NODE_TIMEOUT))
                .count();
            if fast > 0 {
                o.failed.push(format!(
                    "{fast} acquire(s) after the fault took less than the node timeout \
                     (fault not exercised)"
                ));
            }
        }
        o.faults
            .push_str(&format!("; after it {ok} acquires ok, {failed} failed"));
        if ok == 0 || ok * 5 < (ok + failed) * 4 {
            o.failed.push(format!(
                "only {ok} of {} acquires after the fault succeeded (need >= 80%)",
                ok + failed
            ));
        }
        Ok(o)
    }

    /// Redlock with n1-n3 partitioned away (a majority) for 3 TTLs once the workers run. A
    /// try-acquire by the harness during the outage must fail fast with NoQuorum (within
    /// the node timeout plus slack); after the heal the lock comes back within one TTL.
    pub fn redlock_majority_down(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        let proxies = self.proxied_nodes();
        let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
        let (mut workers, histories) = self.spawn_all(
            (1..=3)
                .map(|p| self.redlock_worker(tag, p, iterations, &urls))
                .collect(),
        )?;
        self.wait_for_acquire(tag, &histories)?;
        // A partition as TCP sees it: nothing gets through, and what was sent arrives, in
        // order, when the link heals (a blackhole that drops bytes for good would break
        // the byte stream, which a real partition never does to a live connection).
        for p in &proxies[..3] {
            p.set(PARTITIONED);
        }
        // The harness probes with its own client while the majority is down.
        let rt = runtime()?;
        let probe = rt
            .block_on(
                fencelock::Client::redlock(urls.iter().map(String::as_str))
                    .node_timeout(NODE_TIMEOUT)
                    .restart_protection(None)
                    .connect_timeout(REDLOCK_CLIENT_TIMEOUT)
                    .response_timeout(REDLOCK_CLIENT_TIMEOUT)
                    .connect(),
            )
            .map_err(|e| format!("{tag}: probe connect: {e}"));
        let started = Instant::now();
        let probed = match &probe {
            Ok(c) => rt.block_on(c.lock(format!("lab:{tag}")).try_acquire()),
            Err(e) => return Err(e.clone()),
        };
        let probe_took = started.elapsed();
        thread::sleep((3 * TTL).saturating_sub(started.elapsed()));
        let healed_at = monotonic_ns();
        for p in &proxies[..3] {
            p.set(Fault::Pass);
        }
        workers.wait_all(Instant::now() + self.timeout(iterations) + SCENARIO_TIMEOUT)?;
        drop(proxies);

        let faults = format!(
            "partition n1-n3 of 5 for {} ms; probe: {} in {} ms",
            (3 * TTL).as_millis(),
            match &probed {
                Ok(_) => "acquired".to_owned(),
                Err(Error::NoQuorum { granted, .. }) => format!("NoQuorum ({granted} granted)"),
                Err(e) => format!("{e}"),
            },
            probe_took.as_millis()
        );
        let (mut o, h) = self.judge(tag, &histories, faults)?;
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        if !matches!(probed, Err(Error::NoQuorum { .. })) {
            o.failed
                .push("the probe during the outage did not fail with NoQuorum".into());
        }
        let fast_bound = NODE_TIMEOUT + REDLOCK_CLIENT_TIMEOUT + AVAILABILITY_SLACK;
        if probe_took > fast_bound {
            o.failed.push(format!(
                "the probe took {probe_took:?} to fail (bound {fast_bound:?}): not fail-fast"
            ));
        }
        o.judge_availability(&h, healed_at, TTL + AVAILABILITY_SLACK, true);
        Ok(o)
    }

    /// Per-client partitions over Redlock: each worker reaches the 5 nodes through
    /// proxies of its own; once they run, p1 sees only n1-n2 and p2 only n3-n5. p1 must
    /// stop getting the lock (a minority), p2 must keep getting it, and nothing overlaps.
    pub fn redlock_partitioned(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        let links: Vec<Vec<FaultProxy>> = (0..2).map(|_| self.proxied_nodes()).collect();
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        for (p, proxies) in (1..).zip(&links) {
            let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
            // p1 will fail after the partition: keep its waits short, and its attempts few.
            let iterations = if p == 1 {
                iterations.min(30)
            } else {
                iterations
            };
            let (mut args, path) = self.redlock_worker(tag, p, iterations, &urls);
            if p == 1 {
                args.push("--wait-ms=300".into());
            }
            workers.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        self.wait_for_acquire(tag, &histories)?;
        let fault_at = monotonic_ns();
        for proxy in &links[0][2..] {
            proxy.set(Fault::Blackhole);
        }
        for proxy in &links[1][..2] {
            proxy.set(Fault::Blackhole);
        }
        workers.wait_all(Instant::now() + self.timeout(iterations) + SCENARIO_TIMEOUT)?;
        drop(links);

        let (mut o, h) = self.judge(
            tag,
            &histories,
            "p1 sees n1-n2 only, p2 sees n3-n5 only".into(),
        )?;
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        let after = |p, phase| {
            h.iter()
                .filter(|e| {
                    e.process == p
                        && e.op == Op::Acquire
                        && e.phase == phase
                        && e.time_ns > fault_at
                })
                .count()
        };
        // An acquire of p1 already in flight at the fault may still succeed.
        if after(1, Phase::Ok) > 1 {
            o.failed.push(format!(
                "p1 (a minority) acquired {} times after the partition",
                after(1, Phase::Ok)
            ));
        }
        if after(1, Phase::Fail) == 0 {
            o.failed
                .push("p1 never failed after the partition (no fault exercised)".into());
        }
        let (ok2, failed2) = (after(2, Phase::Ok), after(2, Phase::Fail));
        if ok2 == 0 || ok2 * 5 < (ok2 + failed2) * 4 {
            o.failed.push(format!(
                "p2 (a majority) succeeded only {ok2} of {} times after the partition",
                ok2 + failed2
            ));
        }
        o.faults.push_str(&format!(
            "; after it p1 {} ok / {} failed, p2 {ok2} ok / {failed2} failed",
            after(1, Phase::Ok),
            after(1, Phase::Fail)
        ));
        Ok(o)
    }

    /// Kleppmann's crash-restart, with the harness itself acting as clients A (process 1)
    /// and B (process 2) through the library: A acquires on all 5 nodes (TTL 3 s); its
    /// key is deleted by hand on n4 and n5 (they "missed" the grant); n2 is SIGKILLed and
    /// restarted without persistence; then B tries once. Unprotected: B gets n2, n4, n5,
    /// a majority, and C1 must flag the overlap (positive control), while the fenced
    /// resource, written by B and then late by A, keeps C2 and C3. Protected (quarantine
    /// = TTL, every node up longer than that): n2's vote does not count, B gets NoQuorum.
    /// Persistent (n2 is a server with `appendfsync always`, protection off): A's key
    /// survives the crash, B finds the lock held.
    pub fn redlock_restart(&mut self, tag: &str, restart: Restart) -> Result<Outcome, String> {
        let protected = restart == Restart::Protected;
        let persistent = restart == Restart::Persistent;
        let quarantine = protected.then_some(RESTART_TTL);
        if protected {
            // Uptime counts whole seconds: wait for quarantine + 1 s on every node.
            let min_up = RESTART_TTL.as_secs() + 1;
            let deadline = Instant::now() + RESTART_TTL + Duration::from_secs(5);
            while self.nodes.iter().any(|n| uptime_secs(n) < min_up) {
                if Instant::now() > deadline {
                    return Err(format!("{tag}: nodes not up for {min_up} s"));
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
        let rt = runtime()?;
        let mut urls: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        if persistent {
            urls[1] = self.persistent.url();
        }
        let connect = |urls: Vec<String>| {
            fencelock::Client::redlock(urls)
                .restart_protection(quarantine)
                .node_timeout(NODE_TIMEOUT)
                .connect()
        };
        let lock = format!("lab:{tag}");
        let key = format!("fencelock:{{{lock}}}");
        let hist_a = self.dir.join(format!("{tag}-p1.jsonl"));
        let hist_b = self.dir.join(format!("{tag}-p2.jsonl"));
        let mut wa = HistoryWriter::create(&hist_a).map_err(|e| e.to_string())?;
        let mut wb = HistoryWriter::create(&hist_b).map_err(|e| e.to_string())?;
        let rec = |w: &mut HistoryWriter, e: Event| w.append(&e).map_err(|e| e.to_string());
        let mut resource = self.resource_writer(tag)?;

        // A acquires on every node.
        let client_a = rt
            .block_on(connect(urls.clone()))
            .map_err(|e| format!("{tag}: A connect: {e}"))?;
        rec(&mut wa, Event::now(1, Op::Acquire, Phase::Invoke))?;
        let guard_a = rt
            .block_on(
                client_a
                    .lock(&lock)
                    .lease(RESTART_TTL)
                    .renew(false)
                    .try_acquire(),
            )
            .map_err(|e| format!("{tag}: A did not acquire: {e}"))?;
        rec(&mut wa, acquired(1, &guard_a, &client_a))?;
        let owner_a = guard_a.holder_token().clone();
        let token_a = guard_a.fencing_token().get();

        // n4 and n5 lose A's grant; n2 crashes and comes back empty.
        for n in &self.nodes[3..5] {
            if n.cmd(&["DEL", &key]).as_int() != Some(1) {
                return Err(format!("{tag}: A's key {key} not found on {}", n.addr()));
            }
        }
        let n2 = if persistent {
            &mut self.persistent
        } else {
            &mut self.nodes[1]
        };
        n2.kill();
        n2.restart();

        // B: a fresh client, one attempt.
        let client_b = rt
            .block_on(connect(urls))
            .map_err(|e| format!("{tag}: B connect: {e}"))?;
        rec(&mut wb, Event::now(2, Op::Acquire, Phase::Invoke))?;
        let b = rt.block_on(
            client_b
                .lock(&lock)
                .lease(RESTART_TTL)
                .renew(false)
                .try_acquire(),
        );
        let mut b_outcome = "B: other error";
        let mut b_refused_by_quarantine = false;
        match &b {
            Ok(g) => {
                rec(&mut wb, acquired(2, g, &client_b))?;
                b_outcome = "B acquired";
            }
            Err(e) => {
                match e {
                    Error::NoQuorum { nodes, .. } => {
                        b_refused_by_quarantine = nodes
                            .iter()
                            .any(|r| matches!(r.outcome, NodeOutcome::Quarantined { .. }));
                        b_outcome = "B: NoQuorum";
                    }
                    Error::Held { nodes, .. } => {
                        let held = nodes
                            .iter()
                            .filter(|r| matches!(r.outcome, NodeOutcome::Held { .. }))
                            .count();
                        if held * 2 > nodes.len() {
                            b_outcome = "B: held on a majority";
                        }
                    }
                    _ => {}
                }
                rec(
                    &mut wb,
                    Event::now(2, Op::Acquire, Phase::Fail).with_error(e.to_string()),
                )?;
            }
        }
        // B writes, then A (still inside its lease, by its clock) writes late.
        let mut a_late_write = None;
        if let Ok(g) = &b {
            resource.write(
                &mut wb,
                2,
                g.fencing_token().get(),
                g.holder_token().as_str(),
                2,
            )?;
            a_late_write = Some(resource.write(&mut wa, 1, token_a, owner_a.as_str(), 1)?);
        }
        // Release B, then A.
        if let Ok(g) = b {
            let (owner, token) = (g.holder_token().clone(), g.fencing_token().get());
            rec(&mut wb, release(2, Phase::Invoke, &owner, token))?;
            let r = rt.block_on(g.release());
            rec(&mut wb, release(2, release_phase(&r), &owner, token))?;
        }
        rec(&mut wa, release(1, Phase::Invoke, &owner_a, token_a))?;
        let r = rt.block_on(guard_a.release());
        rec(&mut wa, release(1, release_phase(&r), &owner_a, token_a))?;
        rt.block_on(async {
            client_a.flush().await;
            client_b.flush().await;
        });
        drop((wa, wb));

        let faults = format!(
            "DEL A's key on n4, n5; kill -9 + restart n2 ({}); {b_outcome}",
            if persistent {
                "appendfsync always"
            } else {
                "no persistence"
            }
        );
        let (mut o, _) = self.judge(tag, &[hist_a, hist_b], faults)?;
        if persistent {
            o.expect_clean(&[1, 2, 3, 4, 5]);
            if b_outcome != "B: held on a majority" {
                o.failed.push(
                    "B was not refused by a majority holding A's key (lost despite persistence?)"
                        .into(),
                );
            }
        } else if protected {
            o.expect_clean(&[1, 2, 3, 4, 5]);
            if !b_refused_by_quarantine {
                o.failed
                    .push("B was not refused with NoQuorum naming a quarantined node".into());
            }
        } else {
            o.expect_clean(&[2, 3, 4, 5]);
            if b_outcome != "B acquired" {
                o.failed
                    .push("B did not get a majority (no fault exercised)".into());
            }
            if a_late_write != Some(false) {
                o.failed
                    .push("the fenced resource did not reject A's write after B's".into());
            }
            o.expect_detected(1, "A's and B's overlapping leases");
        }
        Ok(o)
    }

    /// A fresh fault proxy in front of every Redlock node, in node order.
    fn proxied_nodes(&self) -> Vec<FaultProxy> {
        self.nodes
            .iter()
            .map(|n| FaultProxy::start(&n.addr()))
            .collect()
    }

    /// Arguments of a Redlock worker on `urls` (node timeout 50 ms, client timeouts
    /// 150 ms, restart protection off: the nodes are young).
    fn redlock_worker(
        &self,
        tag: &str,
        p: u32,
        iterations: u32,
        urls: &[String],
    ) -> (Vec<String>, PathBuf) {
        let (mut args, path) = self.worker_args_on(tag, p, Resource::Fenced, iterations, urls);
        args.push(format!("--node-timeout-ms={}", NODE_TIMEOUT.as_millis()));
        args.push(format!(
            "--lock-timeout-ms={}",
            REDLOCK_CLIENT_TIMEOUT.as_millis()
        ));
        (args, path)
    }
}

/// The server's clock (`TIME`), µs; 0 if unreadable.
fn server_time_us(server: &RedisServer) -> u64 {
    let reply = server.cmd(&["TIME"]);
    let parts: Vec<u64> = reply
        .as_array()
        .unwrap_or_default()
        .iter()
        .filter_map(|r| r.as_str().and_then(|s| s.parse().ok()))
        .collect();
    match parts[..] {
        [secs, micros] => secs * 1_000_000 + micros,
        _ => 0,
    }
}

/// `uptime_in_seconds` of `INFO server` (0 if unreadable).
fn uptime_secs(node: &RedisServer) -> u64 {
    node.cmd(&["INFO", "server"])
        .as_str()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}
