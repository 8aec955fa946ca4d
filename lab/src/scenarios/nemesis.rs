//! The randomized nemesis: one long scenario whose schedule of faults is drawn from the
//! run's seed. Steady workers take the lock on the clocked lock server, each through a
//! [`FaultProxy`] of its own, while the nemesis injects one fault after another: workers
//! paused and killed (a new worker takes a killed one's place), the server paused and
//! killed (restarted at once, without persistence), a worker's link delayed, blackholed
//! (a partition) or its replies dropped, the server's wall clock stepped forward or back.
//!
//! Some faults cause violations no lock on one Redis can prevent, and the judgement
//! explains each violation by a fault or fails the scenario:
//! - two leases at once (C1) where the server's clock stepped forward, or the server was
//!   killed (its keys lost), inside the earlier lease;
//! - a write after its lease ended (C1) by a worker that was paused inside that lease;
//! - a grant recorded inside another lease with none of its own left (C1): its worker was
//!   paused between the acquire's return and the record, and records a lease that ended
//!   while it was stopped (the grant itself came before the pause);
//! - a token lower than an earlier one (C4) where the server restarted (its counters
//!   lost) with its clock behind a clock it had shown before the restart.
//!
//! Anything else prints the seed and a shortened history: the events of the processes
//! involved around the violation and the faults in that window (also written next to
//! the histories). `--seed N --only nemesis` with the same mode draws the same schedule.

use std::fmt::Write as _;
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use testkit::checkers::{Checker, Violation, leases_overlap, tokens_increase};
use testkit::history::{Event, Op, monotonic_ns};
use testkit::{Fault, FaultProxy};

use super::{STEADY_MAX, Scale, Scenario};
use crate::harness::{Lab, Resource, SCENARIO_TIMEOUT, TTL, Workers, ns, signal};
use crate::outcomes::Outcome;

pub const NEMESIS: Scenario = Scenario {
    name: "nemesis",
    what: "4 steady workers (2 with renewed leases) on the clocked lock server, each through \
        a proxy of its own, under faults drawn from the seed one after another: a worker \
        paused (0.2-1.5 s) or killed (replaced), the server paused (0.2-1 s) or killed and \
        restarted (no persistence), a worker's link delayed, blackholed or its replies \
        dropped (0.3-1.5 s, then reset), the server's clock stepped forward (0.1-1 s) or \
        back (0.1-5 s)",
    expected: "every violation explained by a fault: C1 overlaps by a clock step forward or \
        a server kill inside the earlier lease, C1 late writes by a worker paused in its \
        lease, C4 by a restart with the clock behind; C2, C3, C5 clean; otherwise the seed \
        and a shortened history",
    run: |lab, tag, scale| lab.nemesis(tag, scale),
};

/// Workers at any time.
const WORKERS: u32 = 4;

/// What the nemesis can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    WorkerPause,
    WorkerKill,
    ServerPause,
    ServerKill,
    LinkDelay,
    LinkBlackhole,
    LinkDropReplies,
    ClockForward,
    ClockBack,
}

impl Kind {
    /// Every kind with its weight in the draw.
    const DRAW: [(Kind, u32); 9] = [
        (Kind::WorkerPause, 3),
        (Kind::WorkerKill, 2),
        (Kind::ServerPause, 2),
        (Kind::ServerKill, 1),
        (Kind::LinkDelay, 2),
        (Kind::LinkBlackhole, 2),
        (Kind::LinkDropReplies, 2),
        (Kind::ClockForward, 1),
        (Kind::ClockBack, 1),
    ];

    fn draw(rng: &mut StdRng) -> Kind {
        let total: u32 = Self::DRAW.iter().map(|(_, w)| w).sum();
        let mut pick = rng.random_range(0..total);
        for (kind, weight) in Self::DRAW {
            if pick < weight {
                return kind;
            }
            pick -= weight;
        }
        unreachable!("the draw is below the total weight")
    }

    fn name(self) -> &'static str {
        match self {
            Kind::WorkerPause => "worker paused",
            Kind::WorkerKill => "worker killed",
            Kind::ServerPause => "server paused",
            Kind::ServerKill => "server killed",
            Kind::LinkDelay => "link delayed",
            Kind::LinkBlackhole => "link blackholed",
            Kind::LinkDropReplies => "replies dropped",
            Kind::ClockForward => "clock forward",
            Kind::ClockBack => "clock back",
        }
    }
}

/// One fault the nemesis injected.
struct Injected {
    kind: Kind,
    /// The worker process it hit (a pause, a kill, its link).
    process: Option<u32>,
    /// When it began and healed (monotonic ns). A kill or a clock step is over at once,
    /// but acts on the leases live at that moment: it counts as active for one TTL.
    from_ns: u64,
    to_ns: u64,
    /// A clock step, ms.
    step_ms: i64,
}

impl Injected {
    fn describe(&self) -> String {
        let mut s = format!("{} at {}", self.kind.name(), self.from_ns);
        if let Some(p) = self.process {
            let _ = write!(s, " (p{p})");
        }
        if self.step_ms != 0 {
            let _ = write!(s, " by {} ms", self.step_ms);
        }
        let _ = write!(s, " until {}", self.to_ns);
        s
    }
}

/// A worker slot: its proxy to the lock server and the process in it now.
struct Slot {
    proxy: FaultProxy,
    pid: u32,
    process: u32,
    renewed: bool,
}

impl Lab {
    /// Runs the nemesis for the scale's time, judges the histories, and explains every
    /// violation by a fault.
    fn nemesis(&mut self, tag: &str, scale: Scale) -> Result<Outcome, String> {
        let mut rng = StdRng::seed_from_u64(self.seed ^ fnv1a(tag));
        let stop_file = self.dir.join(format!("{tag}.stop"));
        let mut workers = Workers::default();
        let mut histories = Vec::new();
        let mut slots = Vec::new();
        let mut next_process = 1;
        for i in 0..WORKERS {
            let proxy = FaultProxy::start(&self.clocked.addr());
            let renewed = i % 2 == 1;
            let (pid, path) =
                self.nemesis_worker(tag, next_process, &proxy, renewed, &stop_file, &mut workers)?;
            histories.push(path);
            slots.push(Slot {
                proxy,
                pid,
                process: next_process,
                renewed,
            });
            next_process += 1;
        }
        self.wait_for_acquire(tag, &histories)?;

        let mut injected: Vec<Injected> = Vec::new();
        let end = Instant::now() + scale.nemesis;
        while Instant::now() < end {
            thread::sleep(Duration::from_millis(rng.random_range(50..=400)));
            let kind = Kind::draw(&mut rng);
            let slot = rng.random_range(0..slots.len());
            let from_ns = monotonic_ns();
            let mut fault = Injected {
                kind,
                process: None,
                from_ns,
                to_ns: from_ns + ns(TTL),
                step_ms: 0,
            };
            let lasting = |rng: &mut StdRng, lo: u64, hi: u64| {
                Duration::from_millis(rng.random_range(lo..=hi))
            };
            match kind {
                Kind::WorkerPause => {
                    fault.process = Some(slots[slot].process);
                    let d = lasting(&mut rng, 200, 1_500);
                    signal(slots[slot].pid, libc::SIGSTOP);
                    thread::sleep(d);
                    signal(slots[slot].pid, libc::SIGCONT);
                    fault.to_ns = monotonic_ns();
                }
                Kind::WorkerKill => {
                    let s = &mut slots[slot];
                    fault.process = Some(s.process);
                    workers.kill(s.pid);
                    let (pid, path) = self.nemesis_worker(
                        tag,
                        next_process,
                        &s.proxy,
                        s.renewed,
                        &stop_file,
                        &mut workers,
                    )?;
                    histories.push(path);
                    (s.pid, s.process) = (pid, next_process);
                    next_process += 1;
                }
                Kind::ServerPause => {
                    let d = lasting(&mut rng, 200, 1_000);
                    self.clocked.pause();
                    thread::sleep(d);
                    self.clocked.resume();
                    fault.to_ns = monotonic_ns();
                }
                Kind::ServerKill => {
                    self.clocked.kill();
                    self.clocked.restart();
                    fault.to_ns = monotonic_ns().max(from_ns + ns(TTL));
                }
                Kind::LinkDelay | Kind::LinkBlackhole | Kind::LinkDropReplies => {
                    let s = &slots[slot];
                    fault.process = Some(s.process);
                    let d = lasting(&mut rng, 300, 1_500);
                    s.proxy.set(match kind {
                        Kind::LinkDelay => Fault::Delay {
                            base: lasting(&mut rng, 50, 200),
                            jitter: lasting(&mut rng, 0, 200),
                        },
                        Kind::LinkBlackhole => Fault::Blackhole,
                        _ => Fault::DropReplies,
                    });
                    thread::sleep(d);
                    if kind != Kind::LinkDelay {
                        // What was swallowed is gone: the connections start over.
                        s.proxy.set(Fault::Reset);
                    }
                    s.proxy.set(Fault::Pass);
                    fault.to_ns = monotonic_ns();
                }
                Kind::ClockForward => {
                    fault.step_ms = rng.random_range(100..=1_000);
                    self.clock.step_ms(fault.step_ms);
                }
                Kind::ClockBack => {
                    fault.step_ms = -rng.random_range(100..=5_000);
                    self.clock.step_ms(fault.step_ms);
                }
            }
            injected.push(fault);
        }
        std::fs::write(&stop_file, b"").map_err(|e| format!("{}: {e}", stop_file.display()))?;
        workers.wait_all(Instant::now() + SCENARIO_TIMEOUT)?;
        self.clock.reset();
        drop(slots);

        let mut kinds: Vec<(Kind, usize)> = Vec::new();
        for f in &injected {
            match kinds.iter_mut().find(|(k, _)| *k == f.kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((f.kind, 1)),
            }
        }
        let mut faults = format!(
            "{} faults in {} s:",
            injected.len(),
            scale.nemesis.as_secs()
        );
        for (k, n) in &kinds {
            let _ = write!(faults, " {n} {},", k.name());
        }
        faults.pop();
        let (mut o, h) = self.judge(tag, &histories, faults)?;
        o.count_under_fault(
            &h,
            &injected
                .iter()
                .map(|f| (f.from_ns, f.to_ns))
                .collect::<Vec<_>>(),
        );
        o.expect_clean(&[2, 3, 5]);
        let mut explained = [0usize; 2];
        let suspects = leases_overlap(&h)
            .into_iter()
            .map(|v| (0, v))
            .chain(tokens_increase(&h).into_iter().map(|v| (1, v)));
        for (i, (which, v)) in suspects.enumerate() {
            if explain(&v, &injected).is_some() {
                explained[which] += 1;
                continue;
            }
            let story = shortened_history(&v, &h, &injected);
            let file = self.dir.join(format!("{tag}-unexpected-{i}.txt"));
            let _ = std::fs::write(&file, &story);
            eprintln!(
                "{tag}: unexpected {v}\n  seed {} (rerun: ./scripts/lab run --{} --seed {} --only nemesis)\n{story}",
                self.seed, scale.name, self.seed
            );
            o.failed.push(format!(
                "unexpected {}: seed {}, history in {}",
                v.explanation,
                self.seed,
                file.display()
            ));
        }
        let _ = write!(
            o.faults,
            "; explained by them: {} C1, {} C4",
            explained[0], explained[1]
        );
        Ok(o)
    }

    /// Starts a steady worker as `process` through `proxy`; its pid and history.
    fn nemesis_worker(
        &self,
        tag: &str,
        process: u32,
        proxy: &FaultProxy,
        renewed: bool,
        stop_file: &std::path::Path,
        workers: &mut Workers,
    ) -> Result<(u32, std::path::PathBuf), String> {
        let (mut args, path) =
            self.worker_args_on(tag, process, Resource::Fenced, STEADY_MAX, &[proxy.url()]);
        args.push(format!("--stop-file={}", stop_file.display()));
        args.push("--lock-timeout-ms=300".into());
        if renewed {
            args.push("--renewed".into());
        }
        Ok((workers.spawn(&self.exe, &args)?, path))
    }
}

/// How long after a server kill began a reply the killed server sent may still be
/// recorded (in flight through the worker's proxy).
const IN_FLIGHT: Duration = Duration::from_millis(50);

/// The fault that explains `v`, if one does (see the module's list).
fn explain<'a>(v: &Violation, faults: &'a [Injected]) -> Option<&'a Injected> {
    let first = v.events.first()?;
    let last = v.events.last()?;
    let within = |f: &&Injected, from: u64, to: u64| f.from_ns <= to && f.to_ns >= from;
    if v.checker == Checker::TokensIncrease {
        // A restart between the two grants, with the clock then behind the highest
        // clock shown before the restart: the counter's carry-over is gone.
        let offset_at = |t: u64| -> i64 {
            faults
                .iter()
                .filter(|f| f.from_ns <= t)
                .map(|f| f.step_ms)
                .sum()
        };
        // The earlier grant may be recorded just after the kill began: the killed
        // server's reply was in flight (through the worker's proxy).
        return faults.iter().find(|f| {
            f.kind == Kind::ServerKill
                && (first.time_ns.saturating_sub(ns(IN_FLIGHT))..=last.time_ns).contains(&f.from_ns)
                && offset_at(last.time_ns)
                    < faults
                        .iter()
                        .filter(|g| g.from_ns < f.from_ns)
                        .map(|g| offset_at(g.from_ns))
                        .chain([0])
                        .max()
                        .unwrap_or(0)
        });
    }
    if last.op == Op::Write {
        // A late write: its writer paused inside the lease it wrote under.
        let from = first.time_ns.min(last.time_ns.saturating_sub(ns(TTL)));
        return faults.iter().find(|f| {
            f.kind == Kind::WorkerPause
                && f.process == Some(last.process)
                && within(f, from, last.time_ns)
        });
    }
    if last.op == Op::Acquire && last.valid_until_ns.is_some_and(|end| end <= last.time_ns) {
        // A grant recorded with no lease left: its worker was paused after the acquire
        // returned and recorded it on waking (the pause ended at most IN_FLIGHT before).
        return faults.iter().find(|f| {
            f.kind == Kind::WorkerPause
                && f.process == Some(last.process)
                && (last.time_ns.saturating_sub(ns(IN_FLIGHT))..=last.time_ns).contains(&f.to_ns)
        });
    }
    // Two leases at once: the earlier key lost early, by a clock step forward or a
    // restart, inside the earlier lease (granted at most one TTL before its end).
    let granted = first
        .valid_until_ns
        .unwrap_or(first.time_ns)
        .saturating_sub(ns(TTL))
        .min(first.time_ns);
    faults.iter().find(|f| {
        matches!(f.kind, Kind::ClockForward | Kind::ServerKill)
            && (granted..=last.time_ns).contains(&f.from_ns)
    })
}

/// The events of the processes in `v` from two TTLs before it to one after, and the
/// faults overlapping that window: what a reader needs to see how it happened.
fn shortened_history(v: &Violation, h: &[Event], faults: &[Injected]) -> String {
    let from = v
        .events
        .first()
        .map_or(0, |e| e.time_ns.saturating_sub(2 * ns(TTL)));
    let to = v.events.last().map_or(u64::MAX, |e| e.time_ns + ns(TTL));
    let processes: Vec<u32> = v.events.iter().map(|e| e.process).collect();
    let mut out = String::new();
    for f in faults.iter().filter(|f| f.from_ns <= to && f.to_ns >= from) {
        let _ = writeln!(out, "  fault: {}", f.describe());
    }
    for e in h
        .iter()
        .filter(|e| (from..=to).contains(&e.time_ns) && processes.contains(&e.process))
    {
        let _ = writeln!(
            out,
            "  p{} {} {:?} {:?} token={:?} until={:?}{}",
            e.process,
            e.time_ns,
            e.op,
            e.phase,
            e.token,
            e.valid_until_ns,
            e.error
                .as_deref()
                .map(|m| format!(" error={m}"))
                .unwrap_or_default()
        );
    }
    out
}

/// FNV-1a of `s`: mixes the round's tag into the seed, so each round draws its own
/// schedule and the same seed draws the same one again.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::history::Phase;

    fn fault(kind: Kind, process: Option<u32>, from_ns: u64, to_ns: u64, step_ms: i64) -> Injected {
        Injected {
            kind,
            process,
            from_ns,
            to_ns,
            step_ms,
        }
    }

    fn ok(process: u32, time_ns: u64, op: Op, valid_until: Option<u64>) -> Event {
        let mut e = Event::new(process, time_ns, op, Phase::Ok).with_token(time_ns);
        if let Some(v) = valid_until {
            e = e.with_valid_until(v);
        }
        e
    }

    fn violation(checker: testkit::checkers::Checker, events: Vec<Event>) -> Violation {
        Violation {
            checker,
            events,
            explanation: String::new(),
        }
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn an_overlap_is_explained_only_by_a_step_forward_or_a_kill_inside_the_earlier_lease() {
        let v = violation(
            Checker::LeasesOverlap,
            vec![
                ok(1, 10 * S, Op::Acquire, Some(10 * S + ns(TTL))),
                ok(2, 10 * S + ns(TTL) / 2, Op::Acquire, Some(11 * S)),
            ],
        );
        let inside = 10 * S + ns(TTL) / 4;
        assert!(explain(&v, &[fault(Kind::ClockForward, None, inside, inside, 300)]).is_some());
        assert!(explain(&v, &[fault(Kind::ServerKill, None, inside, inside, 0)]).is_some());
        assert!(explain(&v, &[fault(Kind::ClockBack, None, inside, inside, -300)]).is_none());
        assert!(explain(&v, &[fault(Kind::ServerPause, None, inside, inside, 0)]).is_none());
        assert!(explain(&v, &[fault(Kind::ClockForward, None, 5 * S, 5 * S, 300)]).is_none());
    }

    #[test]
    fn a_late_write_is_explained_only_by_a_pause_of_its_writer() {
        let v = violation(
            Checker::LeasesOverlap,
            vec![
                ok(3, 10 * S, Op::Acquire, Some(10 * S + ns(TTL))),
                ok(3, 12 * S, Op::Write, None),
            ],
        );
        assert!(explain(&v, &[fault(Kind::WorkerPause, Some(3), 10 * S, 12 * S, 0)]).is_some());
        assert!(explain(&v, &[fault(Kind::WorkerPause, Some(4), 10 * S, 12 * S, 0)]).is_none());
        assert!(explain(&v, &[fault(Kind::ServerPause, None, 10 * S, 12 * S, 0)]).is_none());
    }

    #[test]
    fn a_grant_recorded_with_no_lease_left_is_explained_by_its_workers_pause_just_before() {
        // Seen in a long run (seed 20261129, round 5): p3's acquire returned just before
        // a pause of 858 ms, and it recorded the grant 22 us after waking, inside p7's
        // lease, with its own lease over.
        let woke = 11 * S;
        let v = violation(
            Checker::LeasesOverlap,
            vec![
                ok(7, woke - ns(TTL) / 2, Op::Acquire, Some(woke + ns(TTL) / 2)),
                ok(3, woke + 22_000, Op::Acquire, Some(woke + 22_000)),
            ],
        );
        let pause = |process, to| fault(Kind::WorkerPause, Some(process), 10 * S, to, 0);
        assert!(explain(&v, &[pause(3, woke)]).is_some());
        assert!(
            explain(&v, &[pause(7, woke)]).is_none(),
            "another worker's pause"
        );
        assert!(
            explain(&v, &[pause(3, woke - 2 * ns(IN_FLIGHT))]).is_none(),
            "a pause that ended well before the record"
        );
        // A grant recorded with lease left is not this case, pause or not.
        let with_lease = violation(
            Checker::LeasesOverlap,
            vec![
                ok(7, woke - ns(TTL) / 2, Op::Acquire, Some(woke + ns(TTL) / 2)),
                ok(3, woke + 22_000, Op::Acquire, Some(woke + ns(TTL))),
            ],
        );
        assert!(explain(&with_lease, &[pause(3, woke)]).is_none());
    }

    #[test]
    fn a_lower_token_is_explained_by_a_restart_with_the_clock_behind() {
        let v = violation(
            Checker::TokensIncrease,
            vec![
                ok(1, 10 * S, Op::Acquire, None),
                ok(2, 14 * S, Op::Acquire, None),
            ],
        );
        let back = fault(Kind::ClockBack, None, 11 * S, 11 * S, -2_000);
        let kill = fault(Kind::ServerKill, None, 12 * S, 13 * S, 0);
        assert!(explain(&v, &[back, kill]).is_some());
        // A restart with the clock where it was: tokens would not go back.
        let kill = fault(Kind::ServerKill, None, 12 * S, 13 * S, 0);
        assert!(explain(&v, &[kill]).is_none());
        // A step back without a restart: the counter carries on.
        let back = fault(Kind::ClockBack, None, 11 * S, 11 * S, -2_000);
        assert!(explain(&v, &[back]).is_none());
        // The higher token's reply recorded just after the kill began (sent before it):
        // still a restart between the grants; one recorded later is not.
        let back = fault(Kind::ClockBack, None, 9 * S, 9 * S, -2_000);
        let kill = fault(Kind::ServerKill, None, 10 * S - 1_000_000, 11 * S, 0);
        assert!(explain(&v, &[back, kill]).is_some());
        let back = fault(Kind::ClockBack, None, 9 * S, 9 * S, -2_000);
        let kill = fault(Kind::ServerKill, None, 10 * S - 100_000_000, 11 * S, 0);
        assert!(explain(&v, &[back, kill]).is_none());
    }
}
