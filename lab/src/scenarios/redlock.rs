//! Redlock over 5 nodes reached through [`FaultProxy`]s: a minority of the nodes
//! blackholed, paused or killed, a majority partitioned away, the clients partitioned
//! from each other.

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::Error;
use testkit::history::{Op, Phase, monotonic_ns};
use testkit::{Fault, FaultProxy};

use super::{AVAILABILITY_SLACK, Scenario};
use crate::harness::{Lab, Resource, SCENARIO_TIMEOUT, TTL, Workers, runtime};
use crate::outcomes::Outcome;

/// Redlock per-node timeout.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// Connect and response timeout of the Redlock workers' client: bounds how long a
/// release waits for a blackholed node.
const REDLOCK_CLIENT_TIMEOUT: Duration = Duration::from_millis(150);

/// A link that delivers nothing until it heals (set to [`Fault::Pass`], which delivers
/// everything held back, in order).
const PARTITIONED: Fault = Fault::Delay {
    base: Duration::from_secs(3600),
    jitter: Duration::ZERO,
};

/// Which minority fault a Redlock scenario injects on nodes n2 and n4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Minority {
    /// Their proxies swallow every byte.
    Blackholed,
    /// The redis-servers are SIGSTOPped (requests queue in their sockets).
    Paused,
    /// The redis-servers are SIGKILLed, restarted (empty) at the end of the round.
    Killed,
}

pub const REDLOCK_MINORITY_BLACKHOLED: Scenario = Scenario {
    name: "redlock-minority-blackholed",
    what: "Redlock, 3 workers; n2, n4 blackholed by their proxies after the first acquire",
    expected: "a probe meanwhile finds n2, n4 silent; ≥ 80% of later acquires succeed; every \
        checker holds",
    run: |lab, tag, scale| lab.redlock_minority(tag, Minority::Blackholed, scale.faulty),
};

pub const REDLOCK_MINORITY_PAUSED: Scenario = Scenario {
    name: "redlock-minority-paused",
    what: "the same with n2, n4 SIGSTOPped",
    expected: "a probe meanwhile finds n2, n4 silent; ≥ 80% of later acquires succeed; every \
        checker holds",
    run: |lab, tag, scale| lab.redlock_minority(tag, Minority::Paused, scale.faulty),
};

pub const REDLOCK_MINORITY_KILLED: Scenario = Scenario {
    name: "redlock-minority-killed",
    what: "the same with n2, n4 SIGKILLed (restarted empty at the end)",
    expected: "a probe meanwhile finds n2, n4 silent; ≥ 80% of later acquires succeed; every \
        checker holds",
    run: |lab, tag, scale| lab.redlock_minority(tag, Minority::Killed, scale.faulty),
};

impl Lab {
    /// Redlock over 5 nodes, each behind its own proxy; 3 workers on the fenced
    /// resource; once they run, n2 and n4 fail (blackholed, paused or killed). Acquires
    /// must keep succeeding on the majority, and every checker must hold.
    fn redlock_minority(
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
        // The fault is live: the harness's own client asks every node about the lock,
        // waiting for each; n2 and n4 cannot say. (The workers' acquires no longer show
        // it: they answer once a majority has, without waiting for the faulty nodes.)
        let rt = runtime()?;
        let probe = rt.block_on(async {
            let c = fencelock::Client::redlock(urls.iter().map(String::as_str))
                .node_timeout(NODE_TIMEOUT)
                .restart_protection(None)
                .connect_timeout(REDLOCK_CLIENT_TIMEOUT)
                .response_timeout(REDLOCK_CLIENT_TIMEOUT)
                .connect()
                .await?;
            c.inspect(&format!("lab:{tag}")).await
        });
        let silent: Vec<usize> = match &probe {
            Ok(status) => (0..status.nodes.len())
                .filter(|&i| status.nodes[i].state.is_err())
                .collect(),
            Err(_) => Vec::new(),
        };
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
        let healed_at = monotonic_ns();

        let faults = format!("{fault:?} n2, n4 of 5 after the first acquire").to_lowercase();
        let (mut o, h) = self.judge(tag, &histories, faults)?;
        o.count_under_fault(&h, &[(fault_at, healed_at)]);
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        let after = |phase| {
            h.iter()
                .filter(|e| e.op == Op::Acquire && e.phase == phase && e.time_ns > fault_at)
                .count()
        };
        let (ok, failed) = (after(Phase::Ok), after(Phase::Fail));
        // Exercised: the probe found exactly n2 and n4 unable to answer.
        if silent != [1, 3] {
            o.failed.push(format!(
                "the probe during the fault: {} (expected n2 and n4 not answering: fault not \
                 exercised)",
                match &probe {
                    Ok(_) => format!("nodes {silent:?} (from 0) did not answer"),
                    Err(e) => e.to_string(),
                }
            ));
        }
        o.faults.push_str(&format!(
            "; probe: n2, n4 silent: {}; after it {ok} acquires ok, {failed} failed",
            silent == [1, 3]
        ));
        if ok == 0 || ok * 5 < (ok + failed) * 4 {
            o.failed.push(format!(
                "only {ok} of {} acquires after the fault succeeded (need >= 80%)",
                ok + failed
            ));
        }
        Ok(o)
    }
}

pub const REDLOCK_MAJORITY_DOWN: Scenario = Scenario {
    name: "redlock-majority-down",
    what: "n1-n3 partitioned away for 3 TTLs, then healed",
    expected: "a try-acquire meanwhile fails fast (NoQuorum); C6: the lock back within one \
        TTL of the heal; every checker holds",
    run: |lab, tag, scale| lab.redlock_majority_down(tag, scale.faulty),
};

impl Lab {
    /// Redlock with n1-n3 partitioned away (a majority) for 3 TTLs once the workers run. A
    /// try-acquire by the harness during the outage must fail fast with NoQuorum (within
    /// the node timeout plus slack); after the heal the lock comes back within one TTL.
    fn redlock_majority_down(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
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
        let fault_at = monotonic_ns();
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
        o.count_under_fault(&h, &[(fault_at, healed_at)]);
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
}

pub const REDLOCK_PARTITIONED: Scenario = Scenario {
    name: "redlock-partitioned",
    what: "per-client partitions: p1 sees n1-n2 only, p2 sees n3-n5 only",
    expected: "p1 (a minority) stops acquiring, p2 goes on; every checker holds",
    run: |lab, tag, scale| lab.redlock_partitioned(tag, scale.faulty),
};

impl Lab {
    /// Per-client partitions over Redlock: each worker reaches the 5 nodes through
    /// proxies of its own; once they run, p1 sees only n1-n2 and p2 only n3-n5. p1 must
    /// stop getting the lock (a minority), p2 must keep getting it, and nothing overlaps.
    fn redlock_partitioned(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
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
        // The partition lasts to the end.
        o.count_under_fault(&h, &[(fault_at, u64::MAX)]);
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
}

impl Lab {
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
