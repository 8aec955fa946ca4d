//! Single-node scenarios with a faulty link: a [`FaultProxy`] between one worker and the
//! lock server delays every chunk, or drops the replies while the requests still run.

use std::thread;
use std::time::{Duration, Instant};

use testkit::history::{Event, HistoryWriter, Op, Phase, monotonic_ns};
use testkit::{Fault, FaultProxy};

use super::{AVAILABILITY_SLACK, STEADY_MAX, Scenario, WITHIN, wait_until};
use crate::harness::{
    Harness, Lab, Resource, SCENARIO_TIMEOUT, TTL, Workers, acquired, release, release_phase,
};
use crate::outcomes::Outcome;
use testkit::history::read_history;

pub const DELAYED_REPLIES: Scenario = Scenario {
    name: "delayed-replies",
    what: "p1's link to Redis delayed 150-450 ms each way (TTL 500 ms) by the proxy; p2, p3 \
        direct; p1 goes on after them until a grant of its arrived late",
    expected: "a grant arriving after its lease is refused, never a guard; every checker holds",
    run: |lab, tag, scale| lab.delayed_replies(tag, scale.faulty),
};

impl Lab {
    /// Worker 1 reaches the lock server through a proxy that delays every chunk by
    /// 150-450 ms each way, so most of its grants come back after their 500 ms lease;
    /// workers 2 and 3 are direct. A grant that arrives late must not become a guard.
    ///
    /// While 2 and 3 hammer the lock, p1 rarely wins it (its wake-up and its SET come
    /// 300-900 ms late): with many iterations it may never be granted at all. So p1
    /// goes on after they are done, until a grant of its was refused for arriving late
    /// and it made at least [`P1_MIN_ATTEMPTS`] attempts; then its stop file ends it.
    fn delayed_replies(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        const P1_MIN_ATTEMPTS: usize = 3;
        let proxy = FaultProxy::start(&self.lock.addr());
        let delayed_from = monotonic_ns();
        proxy.set(Fault::Delay {
            base: TTL * 3 / 10,
            jitter: TTL * 6 / 10,
        });
        let (mut p1, mut direct) = (Workers::default(), Workers::default());
        let stop_file = self.dir.join(format!("{tag}.stop"));
        let (mut args, p1_history) =
            self.worker_args_on(tag, 1, Resource::Fenced, STEADY_MAX, &[proxy.url()]);
        args.extend([
            "--lock-timeout-ms=3000".into(),
            "--wait-ms=2000".into(),
            format!("--stop-file={}", stop_file.display()),
        ]);
        p1.spawn(&self.exe, &args)?;
        let mut histories = vec![p1_history.clone()];
        for p in 2..=3 {
            let (args, path) = self.worker_args(tag, p, Resource::Fenced, iterations);
            direct.spawn(&self.exe, &args)?;
            histories.push(path);
        }
        let deadline = Instant::now() + self.timeout(iterations) + SCENARIO_TIMEOUT;
        direct.wait_all(deadline)?;
        wait_until(tag, "p1 had a grant refused for arriving late", || {
            read_history(&p1_history).is_ok_and(|h| {
                let attempts = h.iter().filter(|e| e.op == Op::Acquire).count() / 2;
                attempts >= P1_MIN_ATTEMPTS && h.iter().any(is_late_refusal)
            })
        })?;
        std::fs::write(&stop_file, b"").map_err(|e| format!("{}: {e}", stop_file.display()))?;
        p1.wait_all(deadline + WITHIN)?;
        drop(proxy);
        let delayed_to = monotonic_ns();

        let faults = format!(
            "p1's link delayed {}-{} ms each way (TTL {} ms)",
            (TTL * 3 / 10).as_millis(),
            (TTL * 9 / 10).as_millis(),
            TTL.as_millis()
        );
        let (mut o, h) = self.judge(tag, &histories, faults)?;
        // p1's link is delayed from start to end: every acquisition is under the fault.
        o.count_under_fault(&h, &[(delayed_from, delayed_to)]);
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        let late_refusals = h
            .iter()
            .filter(|e| e.process == 1 && is_late_refusal(e))
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
}

/// A failed acquire whose grant came back after its lease (the error names the lease).
fn is_late_refusal(e: &Event) -> bool {
    e.op == Op::Acquire
        && e.phase == Phase::Fail
        && e.error.as_deref().is_some_and(|m| m.contains("lease"))
}

pub const DROPPED_REPLIES: Scenario = Scenario {
    name: "dropped-replies",
    what: "p1 waits for the harness's lock (2 s lease) through a proxy that drops its \
        replies (its requests still run) from 150 ms before that lease ends until 3 TTLs \
        after, and resets its connections; p2, p3 start once someone took the lock in the \
        fault",
    expected: "a grant p1 has not heard of holds the lock (exercised); p1 holds it only once a \
        retry of the same acquire is answered, else it is withdrawn or expires; C6: the \
        lock back within one TTL of the heal; every checker holds",
    run: |lab, tag, scale| lab.dropped_replies(tag, scale.faulty),
};

impl Lab {
    /// The unknown outcome, for real. The harness holds the lock (fixed TTL) while
    /// worker 1, which reaches the lock server through a proxy, waits for it. Then the
    /// proxy forwards worker 1's requests but drops every reply: the harness's lease runs
    /// out, worker 1's timer-driven attempt takes the lock on the server, and worker 1
    /// never hears of it. Workers 2 and 3 (direct) start then and find the lock held by
    /// that grant. 3 TTLs after the harness's lease ended the proxy resets worker 1's
    /// connections and passes again. Such a grant must never become a guard unseen, must
    /// be withdrawn or expire, and the lock must come back within one TTL of the heal.
    fn dropped_replies(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
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
        // The fault starts shortly before the harness's lease ends, so that worker 1's
        // attempt at its end goes out in the fault before its client could count the
        // node as stalled (8 calls in a row unanswered: it would then send no acquire
        // until the heal, and nobody would take the lock in the fault).
        if let Some(wait) = holder_until
            .checked_sub(Duration::from_millis(150))
            .and_then(|start| start.checked_duration_since(Instant::now()))
        {
            thread::sleep(wait);
        }
        proxy.set(Fault::DropReplies);
        let dropped = Instant::now();
        let dropped_ns = monotonic_ns();
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
        o.count_under_fault(&h, &[(dropped_ns, healed_at)]);
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
}
