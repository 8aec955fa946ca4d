//! Kleppmann's crash-restart over Redlock: a node forgets a holder's key in a crash,
//! with restart protection, without it (C1's positive control) and with persistence.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::{Error, NodeOutcome};
use testkit::RedisServer;
use testkit::history::{Event, HistoryWriter, Op, Phase, monotonic_ns};

use super::Scenario;
use super::redlock::NODE_TIMEOUT;
use crate::harness::{Lab, acquired, release, release_phase, runtime};
use crate::outcomes::Outcome;

/// Fixed lease of A in the crash-restart scenarios (and their quarantine when protected).
const RESTART_TTL: Duration = Duration::from_secs(3);

/// How the crashed node of a Redlock crash-restart scenario comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Restart {
    /// Empty (no persistence), restart protection off.
    Unprotected,
    /// Empty, restart protection on (quarantine = the TTL).
    Protected,
    /// With its data (`appendfsync always`), restart protection off.
    Persistent,
}

pub const REDLOCK_RESTART_PROTECTED: Scenario = Scenario {
    name: "redlock-restart-protected",
    what: "Redlock, 5 nodes: A holds; n4, n5 lose A's key; n2 kill -9 + restart \
        without persistence; B tries; restart protection on",
    expected: "B refused (NoQuorum naming the quarantined node); every checker holds",
    run: |lab, tag, _| lab.redlock_restart(tag, Restart::Protected),
};

pub const REDLOCK_RESTART_UNPROTECTED: Scenario = Scenario {
    name: "redlock-restart-unprotected",
    what: "the same with restart protection off; B and then A write to the fenced resource",
    expected: "**positive control**: C1 flags A's and B's overlap, while the fence keeps C2 and C3",
    run: |lab, tag, _| lab.redlock_restart(tag, Restart::Unprotected),
};

pub const REDLOCK_RESTART_PERSISTENT: Scenario = Scenario {
    name: "redlock-restart-persistent",
    what: "the same, but n2 runs with `appendfsync always`; restart protection off",
    expected: "A's key survives the crash: B finds the lock held; every checker holds",
    run: |lab, tag, _| lab.redlock_restart(tag, Restart::Persistent),
};

impl Lab {
    /// Kleppmann's crash-restart, with the harness itself acting as clients A (process 1)
    /// and B (process 2) through the library: A acquires on all 5 nodes (TTL 3 s); its
    /// key is deleted by hand on n4 and n5 (they "missed" the grant); n2 is SIGKILLed and
    /// restarted without persistence; then B tries once. Unprotected: B gets n2, n4, n5,
    /// a majority, and C1 must flag the overlap (positive control), while the fenced
    /// resource, written by B and then late by A, keeps C2 and C3. Protected (quarantine
    /// = TTL, every node up longer than that): n2's vote does not count, B gets NoQuorum.
    /// Persistent (n2 is a server with `appendfsync always`, protection off): A's key
    /// survives the crash, B finds the lock held.
    fn redlock_restart(&mut self, tag: &str, restart: Restart) -> Result<Outcome, String> {
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

        // A acquires, on every node.
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

        // The acquire answered once a majority granted; the last grants land after it.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let n2 = if persistent {
                &self.persistent
            } else {
                &self.nodes[1]
            };
            let everywhere = std::iter::once(n2)
                .chain(
                    self.nodes
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i != 1)
                        .map(|(_, n)| n),
                )
                .all(|n| n.get(&key).as_deref() == Some(owner_a.as_str()));
            if everywhere {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{tag}: A's grant did not reach every node"));
            }
            thread::sleep(Duration::from_millis(5));
        }
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
        let restarted_at = monotonic_ns();
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
        let (mut o, h) = self.judge(tag, &[hist_a, hist_b], faults)?;
        // A's lost keys stay lost: B's attempt is under the fault.
        o.count_under_fault(&h, &[(restarted_at, u64::MAX)]);
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
