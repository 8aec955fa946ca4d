//! The lock server's wall clock steps, the harness as the clients. The clocked lock
//! server runs under a shim whose offset the harness moves
//! ([`testkit::ServerClock`]): Redis expires keys, and scripts read `TIME`, by that clock.
//!
//! - A step **forward** expires every lease early by the step: the next client gets the
//!   lock while the holder's lease, by its own monotonic clock, still runs (C1's positive
//!   control; only the fence keeps the data safe).
//! - A step **back** keeps every key longer by the step (a crashed holder's lock stays
//!   taken that much longer) and moves the clock that tokens are seeded from back. Tokens
//!   still increase while the lock's fencing counter exists (a token is the counter + 1
//!   when that is higher); they go back only when the counter is gone (its idle expiry, an
//!   eviction, a restart without persistence, a failover to a replica that missed it)
//!   and the clock is behind the last token: C4's positive control.

use std::time::Duration;

use testkit::history::{Event, HistoryWriter, Op, Phase, monotonic_ns};

use super::Scenario;
use super::lock_state::Overtaking;
use crate::harness::{Harness, Lab, TTL, acquired, release, release_phase};
use crate::outcomes::Outcome;

pub const CLOCK_STEP_FORWARD: Scenario = Scenario {
    name: "clock-step-forward",
    what: "A acquires a 30 s lease and writes; the lock server's wall clock steps 60 s \
        forward; B acquires and writes; A writes again",
    expected: "**positive control**: C1 flags A and B holding at once (Redis expired A's \
        key by its clock); the fence rejects A's late write (C2 holds); A's release reports \
        the lock taken by another",
    run: |lab, tag, _| lab.clock_step_forward(tag),
};

impl Lab {
    /// Positive control of C1 through the server's clock: a step forward longer than A's
    /// lease makes Redis expire A's key while A, by its own clock, still holds the lock.
    fn clock_step_forward(&self, tag: &str) -> Result<Outcome, String> {
        const STEP_MS: i64 = 60_000;
        let clock = &self.clock;
        let outcome =
            self.overtaken_holder(tag, &self.clocked, Duration::from_secs(30), true, |h| {
                let stepped_at = monotonic_ns();
                clock.step_ms(STEP_MS);
                let expired = !self.clocked.exists(&h.key);
                Ok(Overtaking {
                    faults: format!(
                        "the lock server's clock stepped {} s forward",
                        STEP_MS / 1000
                    ),
                    from_ns: stepped_at,
                    failed: if expired {
                        Vec::new()
                    } else {
                        vec!["A's key outlived a clock step past its lease".into()]
                    },
                })
            });
        clock.reset();
        outcome
    }
}

pub const CLOCK_STEP_BACK: Scenario = Scenario {
    name: "clock-step-back",
    what: "A acquires, writes, releases; B acquires; the lock server's wall clock steps an \
        hour back; B releases; C acquires and writes; the lock's fencing counter is deleted \
        (as its idle expiry, an eviction or a failover to a replica that missed it would); \
        D acquires and writes",
    expected: "B's key lives an hour longer (a crashed holder would block the lock that \
        long); C's token is above B's (the counter carries on); **positive control**: C4 \
        flags exactly D's token, seeded from the clock an hour behind; the fence rejects \
        D's write",
    run: |lab, tag, _| lab.clock_step_back(tag),
};

impl Lab {
    /// What a step back does: keys live longer by the step; tokens keep increasing
    /// through the counter, and go back only once the counter is gone too.
    fn clock_step_back(&self, tag: &str) -> Result<Outcome, String> {
        const STEP_MS: i64 = -3_600_000;
        let Harness {
            rt,
            client,
            lock,
            key,
        } = self.harness_on(tag, &self.clocked)?;
        let counter = format!("{key}:fence");
        let mut resource = self.resource_writer(tag)?;
        let mut failed = Vec::new();
        let mut histories = Vec::new();
        let mut tokens = Vec::new();
        let mut stepped_at = 0;
        for p in 1..=4u32 {
            let path = self.dir.join(format!("{tag}-p{p}.jsonl"));
            let mut w = HistoryWriter::create(&path).map_err(|e| e.to_string())?;
            histories.push(path);
            if p == 4 {
                self.clocked.cmd(&["DEL", &counter]);
            }
            w.append(&Event::now(p, Op::Acquire, Phase::Invoke))
                .map_err(|e| e.to_string())?;
            let g = rt
                .block_on(client.lock(&lock).lease(TTL).renew(false).try_acquire())
                .map_err(|e| format!("{tag}: p{p} did not acquire: {e}"))?;
            w.append(&acquired(p, &g, &client))
                .map_err(|e| e.to_string())?;
            let (owner, token) = (g.holder_token().clone(), g.fencing_token().get());
            tokens.push(token);
            if p == 2 {
                // B holds: the step back lengthens its key's life by the step.
                stepped_at = monotonic_ns();
                self.clock.step_ms(STEP_MS);
                let pttl = self.clocked.pttl(&key);
                if pttl < -STEP_MS - 1_000 {
                    failed.push(format!(
                        "B's key should live an hour longer after the step back, PTTL {pttl} ms"
                    ));
                }
            } else {
                let accepted = resource.write(&mut w, p, token, owner.as_str(), i64::from(p))?;
                if accepted != (p != 4) {
                    failed.push(format!(
                        "the fenced resource {} p{p}'s write with token {token}",
                        if accepted { "accepted" } else { "rejected" }
                    ));
                }
            }
            w.append(&release(p, Phase::Invoke, &owner, token))
                .map_err(|e| e.to_string())?;
            let r = rt.block_on(g.release());
            w.append(&release(p, release_phase(&r), &owner, token))
                .map_err(|e| e.to_string())?;
            if let Err(e) = r {
                failed.push(format!("p{p}'s release failed: {e}"));
            }
        }
        if tokens[2] <= tokens[1] {
            failed.push(format!(
                "C's token {} is not above B's {} after the step back",
                tokens[2], tokens[1]
            ));
        }
        let (mut o, h) = self.judge(
            tag,
            &histories,
            format!(
                "the lock server's clock stepped {} h back while B held; the fencing \
                 counter deleted before D",
                -STEP_MS / 3_600_000
            ),
        )?;
        self.clock.reset();
        o.failed.extend(failed);
        o.expect_clean(&[1, 2, 3, 5]);
        // Positive control: exactly D's token, nothing before it.
        if o.violations[3] != Some(1) {
            o.failed.push(format!(
                "positive control: C4 should flag exactly D's token, found {:?}",
                o.violations[3]
            ));
        }
        o.count_under_fault(&h, &[(stepped_at, u64::MAX)]);
        Ok(o)
    }
}
