//! Single-node scenarios the harness plays itself through the library, on the lock's own
//! state: the fencing counter set back by hand between two holders (C4's positive
//! control), a lease expiring under its holder followed by an unchecked `DEL` (C5's), the
//! lock key evicted by a server under memory pressure (C1's).

use std::thread;
use std::time::{Duration, Instant};

use fencelock::{Error, LossCause};
use testkit::RedisServer;
use testkit::history::{Event, HistoryWriter, Op, Phase, monotonic_ns};

use super::Scenario;
use crate::harness::{
    Harness, Lab, TOUCH_MARGIN, TTL, acquired, ns, release, release_phase, runtime,
};
use crate::outcomes::Outcome;

pub const COUNTER_REWOUND: Scenario = Scenario {
    name: "counter-rewound",
    what: "the lock's fencing counter is set an hour ahead of the server clock (as a \
        node whose clock ran ahead would leave it); A acquires and writes; the counter is set \
        back to 1 by hand; B acquires and writes",
    expected: "**positive control**: C4 flags B's lower token; the fence rejects B's write (C2 \
        holds)",
    run: |lab, tag, _| lab.counter_rewound(tag),
};

impl Lab {
    /// Positive control of C4 (and C2 at work): the counter is set an hour ahead of the
    /// server clock, A acquires and writes; the counter is set back to 1 by hand (a
    /// restored backup, a counter reset); B acquires with a lower token than A's (every
    /// token is at least the server clock, so only a counter that ran ahead of the clock
    /// can be rewound below a token handed out). C4 must flag it, and the fenced resource
    /// rejects B's write.
    fn counter_rewound(&self, tag: &str) -> Result<Outcome, String> {
        let rt = runtime()?;
        let client = rt
            .block_on(fencelock::Client::connect(&self.lock.url()))
            .map_err(|e| format!("{tag}: connect: {e}"))?;
        let lock = format!("lab:{tag}");
        let mut resource = self.resource_writer(tag)?;
        let mut histories = Vec::new();
        let mut b_write = None;
        let mut rewound_at = u64::MAX;
        for p in 1..=2 {
            let path = self.dir.join(format!("{tag}-p{p}.jsonl"));
            let mut w = HistoryWriter::create(&path).map_err(|e| e.to_string())?;
            histories.push(path);
            let counter = format!("fencelock:{{{lock}}}:fence");
            if p == 1 {
                let ahead = self.lock.server_time().as_micros() + 3_600_000_000;
                self.lock.cmd(&["SET", &counter, &ahead.to_string()]);
            } else {
                rewound_at = monotonic_ns();
                self.lock.cmd(&["SET", &counter, "1"]);
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
        let (mut o, h) = self.judge(
            tag,
            &histories,
            "the fencing counter set an hour ahead, then back to 1 between two holders".into(),
        )?;
        o.count_under_fault(&h, &[(rewound_at, u64::MAX)]);
        o.expect_clean(&[1, 2, 3, 5]);
        o.expect_detected(4, "B's token below A's");
        if b_write != Some(false) {
            o.failed
                .push("the fenced resource did not reject B's lower token".into());
        }
        Ok(o)
    }
}

pub const EXPIRED_HOLDER: Scenario = Scenario {
    name: "expired-holder",
    what: "A's lease expires, B acquires, A extends and releases late, then runs an \
        unchecked `DEL` script",
    expected: "A's extend and release report the loss (the extend without asking Redis: A's \
        guard had heard of it) and leave B's key; **positive control**: C5 flags \
        exactly the unchecked DEL",
    run: |lab, tag, _| lab.expired_holder(tag),
};

impl Lab {
    /// Extend and release after expiry, driven by the harness through the library: A
    /// acquires with a fixed 300 ms TTL, lets it run out; B acquires; A's extend and
    /// release must both report the lease lost and leave B's key alone. Then A runs the
    /// seed articles' mistake, an unchecked `DEL` script: C5 must catch it (positive
    /// control).
    fn expired_holder(&self, tag: &str) -> Result<Outcome, String> {
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
        let expired_ns = monotonic_ns();
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
        let (mut o, h) = self.judge(tag, &[hist_a, hist_b], faults)?;
        o.count_under_fault(&h, &[(expired_ns, u64::MAX)]);
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

pub const EVICTED_LOCK_KEY: Scenario = Scenario {
    name: "evicted-lock-key",
    what: "A acquires (a 30 s lease) and writes; the lock server is given a `maxmemory` just \
        above its use with `maxmemory-policy volatile-lru`, and filled with keys without an \
        expiry until Redis evicts A's lock key; B acquires and writes; A writes again",
    expected: "the client reports the server can evict lock keys \
        (`Client::eviction_risks`); **positive control**: C1 flags A and B holding at once; \
        the fence rejects A's late write (C2 holds)",
    run: |lab, tag, _| lab.evicted_lock_key(tag),
};

impl Lab {
    /// Positive control of C1 through eviction: Redis itself deletes A's lock key (it has
    /// an expiry, so `volatile-lru` picks it) while A's lease lasts, and B takes the lock.
    /// Nothing in the client can see it; only `noeviction` prevents it, and the fence
    /// keeps the data safe. The server's memory settings are restored and the filler
    /// keys deleted before B acquires. C5 is not judged: it replays each server's
    /// MONITOR stream, which does not show evictions, and would take B's key for A's.
    fn evicted_lock_key(&self, tag: &str) -> Result<Outcome, String> {
        let lease = Duration::from_secs(30);
        self.overtaken_holder(tag, &self.lock, lease, false, |h| {
            let mut failed = Vec::new();
            // Memory pressure: a limit just above what the server uses now.
            let used: u64 = self
                .lock
                .info_field("memory", "used_memory")
                .and_then(|u| u.parse().ok())
                .ok_or(format!("{tag}: no used_memory in INFO memory"))?;
            let limit = (used + (2 << 20)).to_string();
            let from_ns = monotonic_ns();
            self.lock
                .cmd(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]);
            self.lock.cmd(&["CONFIG", "SET", "maxmemory", &limit]);
            let warned = h
                .rt
                .block_on(h.client.eviction_risks())
                .map(|e| e.risks.iter().any(|r| r.policy == "volatile-lru"))
                .unwrap_or(false);
            if !warned {
                failed
                    .push("the client did not report that the server can evict lock keys".into());
            }
            let filler = "x".repeat(10_000);
            let mut filled = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            let evicted = loop {
                if self.lock.cmd(&["EXISTS", &h.key]).as_int() == Some(0) {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                let k = format!("lab:{{{tag}}}:fill:{}", filled.len());
                self.lock.cmd(&["SET", &k, &filler]);
                filled.push(k);
            };
            self.lock.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
            self.lock
                .cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
            for chunk in filled.chunks(500) {
                let mut args = vec!["DEL"];
                args.extend(chunk.iter().map(String::as_str));
                self.lock.cmd(&args);
            }
            if !evicted {
                return Err(format!(
                    "{tag}: A's lock key was not evicted after {} filler keys",
                    filled.len()
                ));
            }
            Ok(Overtaking {
                faults: format!(
                    "maxmemory {limit} with volatile-lru: A's lock key evicted after {} filler keys",
                    filled.len()
                ),
                from_ns,
                failed,
            })
        })
    }
}

/// What the fault of an [`overtaken_holder`](Lab::overtaken_holder) round did.
pub struct Overtaking {
    /// The report's "faults injected".
    pub faults: String,
    /// When the fault began (monotonic ns): acquisitions from then on are under it.
    pub from_ns: u64,
    /// Expectations about the fault itself that failed.
    pub failed: Vec<String>,
}

impl Lab {
    /// A holder overtaken by a fault that removes its lock key while its lease runs: A
    /// acquires `lease` on `server` (no renewal) and writes; `fault` runs (it must leave
    /// the lock free); B acquires and writes; A writes again, inside its lease by its own
    /// clock; both release. Expected: C1 flags A and B holding at once (a positive
    /// control), the fence rejects A's late write, C2-C4 hold, A's release reports the
    /// lock taken by another, B's succeeds. `monitored`: C5 judged too (its MONITOR
    /// replay must be able to follow the fault).
    pub fn overtaken_holder(
        &self,
        tag: &str,
        server: &RedisServer,
        lease: Duration,
        monitored: bool,
        fault: impl FnOnce(&Harness) -> Result<Overtaking, String>,
    ) -> Result<Outcome, String> {
        let harness = self.harness_on(tag, server)?;
        let Harness {
            rt, client, lock, ..
        } = &harness;
        let hist_a = self.dir.join(format!("{tag}-p1.jsonl"));
        let hist_b = self.dir.join(format!("{tag}-p2.jsonl"));
        let mut wa = HistoryWriter::create(&hist_a).map_err(|e| e.to_string())?;
        let mut wb = HistoryWriter::create(&hist_b).map_err(|e| e.to_string())?;
        let rec = |w: &mut HistoryWriter, e: Event| w.append(&e).map_err(|e| e.to_string());
        let mut resource = self.resource_writer(tag)?;

        rec(&mut wa, Event::now(1, Op::Acquire, Phase::Invoke))?;
        let guard_a = rt
            .block_on(client.lock(lock).lease(lease).renew(false).try_acquire())
            .map_err(|e| format!("{tag}: A did not acquire: {e}"))?;
        rec(&mut wa, acquired(1, &guard_a, client))?;
        let (owner_a, token_a) = (
            guard_a.holder_token().clone(),
            guard_a.fencing_token().get(),
        );
        resource.write(&mut wa, 1, token_a, owner_a.as_str(), 1)?;

        let Overtaking {
            faults,
            from_ns,
            mut failed,
        } = fault(&harness)?;

        rec(&mut wb, Event::now(2, Op::Acquire, Phase::Invoke))?;
        let guard_b = rt
            .block_on(client.lock(lock).lease(lease).renew(false).try_acquire())
            .map_err(|e| format!("{tag}: B did not acquire after the fault: {e}"))?;
        rec(&mut wb, acquired(2, &guard_b, client))?;
        let (owner_b, token_b) = (
            guard_b.holder_token().clone(),
            guard_b.fencing_token().get(),
        );
        resource.write(&mut wb, 2, token_b, owner_b.as_str(), 2)?;
        // A, unaware, writes again inside its lease: the fence refuses it.
        if resource.write(&mut wa, 1, token_a, owner_a.as_str(), 3)? {
            failed.push("the fenced resource accepted A's write after B's".into());
        }

        rec(&mut wa, release(1, Phase::Invoke, &owner_a, token_a))?;
        let r = rt.block_on(guard_a.release());
        rec(&mut wa, release(1, release_phase(&r), &owner_a, token_a))?;
        if !matches!(
            r,
            Err(Error::LeaseLost {
                cause: LossCause::TakenByOther,
                ..
            })
        ) {
            failed.push(format!(
                "A's release: expected LeaseLost(TakenByOther), got {r:?}"
            ));
        }
        rec(&mut wb, release(2, Phase::Invoke, &owner_b, token_b))?;
        let r = rt.block_on(guard_b.release());
        rec(&mut wb, release(2, release_phase(&r), &owner_b, token_b))?;
        if let Err(e) = r {
            failed.push(format!("B's release failed: {e}"));
        }
        drop((wa, wb));

        let histories = [hist_a, hist_b];
        let (mut o, h) = if monitored {
            self.judge(tag, &histories, faults)?
        } else {
            self.judge_unmonitored(tag, &histories, faults)?
        };
        o.expect_detected(1, "A and B holding at once");
        o.expect_clean(&[2, 3, 4]);
        if monitored {
            o.expect_clean(&[5]);
        }
        o.count_under_fault(&h, &[(from_ns, u64::MAX)]);
        o.failed.extend(failed);
        Ok(o)
    }
}
