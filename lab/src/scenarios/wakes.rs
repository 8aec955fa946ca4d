//! Wakes by name: a plain lock's release, and a semaphore's, wakes one listed client on
//! its own channel, not every client. Counted without listening there (see [`Handovers::listen`]). Listed clients stopped (a wake they swallow) and killed (a wake
//! the release must not send them).

use std::thread;

use testkit::history::{Op, Phase, monotonic_ns};

use super::fair::{Handovers, live_workers_go_on};
use super::semaphore::PERMITS;
use super::{AVAILABILITY_SLACK, STEADY_MAX, Scale, Scenario, count, wait_until};
use crate::harness::{Lab, Resource, TTL, Workers, signal};
use crate::outcomes::Outcome;

pub const PLAIN_NAMED_WAKES: Scenario = Scenario {
    name: "plain-named-wakes",
    what: "4 plain workers waiting on one lock, renewed leases, each release waking one \
        listed client by name; p3 SIGSTOPped for 3 TTLs (listed, it swallows the wakes \
        sent to it), p4 SIGKILLed (listed, waiting or holding), once per fault round",
    expected: "every checker holds; releases did wake clients by name (the server's \
        PUBLISH count less the releases heard on the lock's channel); the others go on \
        past the stopped and the killed worker, the next acquire within one TTL of the \
        kill",
    run: |lab, tag, scale| lab.named_wakes(tag, scale, None),
};

pub const SEMAPHORE_NAMED_WAKES: Scenario = Scenario {
    name: "semaphore-named-wakes",
    what: "4 workers waiting on a semaphore of 2 permits, renewed leases, each release \
        waking one listed client by name; p3 SIGSTOPped for 3 TTLs (listed, it swallows \
        the wakes sent to it), p4 SIGKILLed (listed, waiting or holding), once per fault \
        round",
    expected: "C1 per permits, C3, C4 hold; releases did wake clients by name; the others \
        go on past the stopped and the killed worker, the next acquire within one TTL of \
        the kill",
    run: |lab, tag, scale| lab.named_wakes(tag, scale, Some(PERMITS)),
};

impl Lab {
    /// Four workers with renewed leases, steady until the faults are done: plain ones on
    /// the fenced resource, or with `permits` the holders of a semaphore's permits (on
    /// the unfenced resource, which holders at once write with interleaved tokens). Per fault round: p3 SIGSTOPped for three TTLs (a release that
    /// names it is heard by nobody who acts on it: the others must go on when the lease
    /// that refused them ends, as without the message) and p4 SIGKILLed (its listing
    /// stays until a release finds nobody listening on its channel and skips it); then
    /// every live worker must acquire again.
    fn named_wakes(
        &self,
        tag: &str,
        scale: Scale,
        permits: Option<u32>,
    ) -> Result<Outcome, String> {
        // Releases that woke every client, heard on the lock's channel; each other
        // PUBLISH went to a client's own channel (a wake by name, or one skipped).
        let everyone = Handovers::listen(
            &self.lock.url(),
            &format!("fencelock:{{lab:{tag}}}:released"),
            false,
            <[u8]>::is_empty,
        )?;
        let published = || publishes(&self.lock.url());
        let published_before = published()?;
        let stop_file = self.dir.join(format!("{tag}.stop"));
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        let mut pids = Vec::new();
        let spawn = |workers: &mut Workers, p: u32| {
            let (mut args, path) = match permits {
                Some(_) => self.semaphore_worker(tag, p, STEADY_MAX),
                None => self.worker_args(tag, p, Resource::Fenced, STEADY_MAX),
            };
            args.extend([
                "--renewed".into(),
                format!("--stop-file={}", stop_file.display()),
            ]);
            workers.spawn(&self.exe, &args).map(|pid| (pid, path))
        };
        for p in 1..=4 {
            let (pid, path) = spawn(&mut workers, p)?;
            pids.push(pid);
            histories.push(path);
        }
        self.wait_for_acquire(tag, &histories)?;
        let mut faults = Vec::new();
        let mut windows = Vec::new();
        let mut kills = Vec::new();
        for round in 0..scale.failovers {
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
            thread::sleep(3 * TTL);
            signal(pids[2], libc::SIGCONT);
            let killed = monotonic_ns();
            workers.kill(pids[3]);
            kills.push(killed);
            windows.push((stopped, killed));
            faults.push(format!(
                "round {}: SIGSTOP p3 for {} ms, SIGKILL p{}",
                round + 1,
                (3 * TTL).as_millis(),
                4 + round
            ));
            let (pid, path) = spawn(&mut workers, 5 + round)?;
            pids[3] = pid;
            histories.push(path);
        }
        live_workers_go_on(tag, &histories, &stop_file, &mut workers)?;
        let broadcasts = everyone.stop()?;
        let woken = (published()? - published_before).saturating_sub(broadcasts as u64);

        faults.push(format!(
            "{woken} wakes by name, {broadcasts} releases to every client"
        ));
        let faults = faults.join("; ");
        let (mut o, h) = match permits {
            Some(n) => self.judge_semaphore(tag, &histories, faults, n as usize)?,
            None => self.judge(tag, &histories, faults)?,
        };
        o.count_under_fault(&h, &windows);
        if permits.is_some() {
            o.expect_clean(&[1, 3, 4]);
        } else {
            o.expect_clean(&[1, 2, 3, 4, 5]);
        }
        for killed in kills {
            o.judge_availability(&h, killed, TTL + AVAILABILITY_SLACK, true);
        }
        if woken == 0 {
            o.failed
                .push("no release woke a client by name (nothing exercised)".into());
        }
        o.details
            .push(format!("{woken} releases woke one client by name"));
        Ok(o)
    }
}

/// How many PUBLISH commands the server at `url` ran so far, scripts' included.
fn publishes(url: &str) -> Result<u64, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client.get_connection().map_err(|e| e.to_string())?;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    Ok(stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_publish:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0))
}
