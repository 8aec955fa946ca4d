//! The targets of the fourth performance round (issue 47), checked in the report's
//! "Targets" table ahead of the earlier issues' rows: many locks through one client,
//! Redis's CPU per uncontended acquire + release and the uncontended p50 against
//! rslock's, the handoff against the release-shaped floor, and the semaphore's
//! throughput against redis-semaphore's. Each target is a ratio within the run and a
//! [`Bound`] on it; the figures are taken from the results first ([`Figures`]), so the
//! verdicts can be checked without a run.

use std::fmt::Write as _;

use crate::many::Who;
use crate::peers::Peer;
use crate::plan::{HOT_KEY_CONTENDERS, WAITERS};
use crate::report::{fmt_ns, handoff_p50, x, yes_no};
use crate::results::{HotKeyRow, Results};

/// A bound on a ratio.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Bound {
    AtLeast(f64),
    AtMost(f64),
}

impl Bound {
    /// Whether `ratio` is within the bound (a ratio that is not a number never is).
    pub(crate) fn met(self, ratio: f64) -> bool {
        match self {
            Bound::AtLeast(b) => ratio >= b,
            Bound::AtMost(b) => ratio <= b,
        }
    }

    fn text(self) -> String {
        match self {
            Bound::AtLeast(b) => format!("at least {b}x"),
            Bound::AtMost(b) => format!("at most {b}x"),
        }
    }
}

/// Many locks through one client: fencelock's acquisitions/s over rslock's.
pub(crate) const MANY_LOCKS: Bound = Bound::AtLeast(0.7);
/// Redis's CPU per uncontended acquire + release, fencelock's over rslock's: measured
/// where the issue measured it (31.6 against 9.6 µs), in the many-locks run, whose
/// requests come pipelined, so that the scripts' own work shows.
pub(crate) const REDIS_CPU: Bound = Bound::AtMost(1.5);
/// Uncontended p50 on loopback: rslock's p50 over fencelock's (fencelock's speed
/// against rslock's).
pub(crate) const UNCONTENDED: Bound = Bound::AtLeast(0.9);
/// Handoff p50 over the release-shaped floor's p50, at each of [`WAITERS`]: fair mode
/// ...
pub(crate) const FAIR_HANDOFF: Bound = Bound::AtMost(1.3);
/// ... and plain mode.
pub(crate) const PLAIN_HANDOFF: Bound = Bound::AtMost(1.6);
/// The semaphore at [`HOT_KEY_CONTENDERS`] contenders: fencelock's acquisitions/s over
/// redis-semaphore's at its defaults (the condition on which its commands per
/// acquisition are accepted).
pub(crate) const SEMAPHORE_RATE: Bound = Bound::AtLeast(1.0);

/// What the targets are checked on, from one run: each pair is fencelock's figure and
/// the one it is held against; `None` when either was not measured.
#[derive(Clone, Debug)]
pub(crate) struct Figures {
    /// Many locks through one client: acquisitions/s.
    pub(crate) many: Option<(f64, f64)>,
    /// Redis's CPU per acquisition (ns) in the many-locks run.
    pub(crate) redis_cpu: Option<(f64, f64)>,
    /// Redis's CPU per uncontended cycle (ns), one cycle at a time: shown beside.
    pub(crate) cycle_cpu: Option<(f64, f64)>,
    /// Uncontended p50 (ns).
    pub(crate) uncontended: Option<(u64, u64)>,
    /// The release-shaped floor's p50 (ns), or why it was not measured.
    pub(crate) floor: Result<u64, String>,
    /// Handoff p50 (ns) by mode and waiters.
    pub(crate) handoff: Vec<(Peer, usize, u64)>,
    /// The semaphore: acquisitions/s, fencelock's against redis-semaphore's.
    pub(crate) semaphore: Option<(f64, f64)>,
    /// The semaphore's Redis commands per acquisition: shown beside.
    pub(crate) semaphore_commands: Option<f64>,
}

impl Figures {
    /// The figures of `r`.
    pub(crate) fn of(r: &Results) -> Self {
        let many = |who| {
            r.many
                .rows
                .iter()
                .find(|row| row.who == who && row.errors.is_empty())
        };
        let (fence, rslock) = (many(Who::Fencelock), many(Who::Rslock));
        let cycle = |label: &str| {
            r.latency.as_ref().ok().and_then(|lat| {
                lat.server_cpu
                    .iter()
                    .find(|(l, _)| l == label)
                    .and_then(|(_, c)| c.as_ref().ok().copied())
            })
        };
        let p50 = |peer| {
            r.latency.as_ref().ok().and_then(|lat| {
                lat.single
                    .iter()
                    .find(|(p, _)| *p == peer)
                    .map(|(_, s)| s.summary.p50)
            })
        };
        let handoff = [Peer::FencelockFair, Peer::Fencelock]
            .into_iter()
            .flat_map(|peer| WAITERS.map(|w| (peer, w)))
            .filter_map(|(peer, w)| handoff_p50(r, peer, w).map(|p| (peer, w, p)))
            .collect();
        let sem = r.semaphores.throughput_row(Peer::FencelockSemaphore);
        let theirs = r.semaphores.throughput_row(Peer::RedisSemaphore);
        Figures {
            many: fence
                .zip(rslock)
                .map(|(f, rs)| (f.per_second(), rs.per_second())),
            redis_cpu: fence
                .and_then(|f| f.server_cpu_ns.as_ref().ok().copied())
                .zip(rslock.and_then(|rs| rs.server_cpu_ns.as_ref().ok().copied())),
            cycle_cpu: cycle("fencelock").zip(cycle("rslock")),
            uncontended: p50(Peer::Fencelock).zip(p50(Peer::Rslock)),
            floor: r
                .floor
                .release
                .as_ref()
                .map(|f| f.p50)
                .map_err(Clone::clone),
            handoff,
            semaphore: sem
                .zip(theirs)
                .map(|(s, t)| (HotKeyRow::per_second(s), HotKeyRow::per_second(t))),
            semaphore_commands: sem
                .and_then(|s| s.commands_per_s.map(|c| c / HotKeyRow::per_second(s))),
        }
    }
}

/// One row of the table.
#[derive(Debug, PartialEq)]
pub(crate) struct Row {
    pub(crate) target: String,
    pub(crate) figure: String,
    pub(crate) met: bool,
}

impl Row {
    fn new(target: String, figure: String, met: bool) -> Self {
        Self {
            target,
            figure,
            met,
        }
    }

    fn not_measured(target: String, why: &str) -> Self {
        Self::new(target, format!("not measured{why}"), false)
    }
}

/// The round's rows of the targets table.
pub(crate) fn rows(s: &mut String, r: &Results) {
    for row in rows_of(&Figures::of(r)) {
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            row.target,
            row.figure,
            yes_no(row.met)
        );
    }
}

/// The rows for `f`: many locks, Redis's CPU, the uncontended p50, the handoff of each
/// mode at each of [`WAITERS`], the semaphore.
pub(crate) fn rows_of(f: &Figures) -> Vec<Row> {
    let mut rows = Vec::new();
    let target = format!(
        "many locks through one client ({} tasks): {} rslock's acquisitions/s",
        crate::many::TASKS,
        MANY_LOCKS.text()
    );
    rows.push(match f.many {
        Some((ours, theirs)) => {
            let ratio = ours / theirs;
            Row::new(
                target,
                format!("{ours:.0}/s vs {theirs:.0}/s ({})", x(ratio)),
                MANY_LOCKS.met(ratio),
            )
        }
        None => Row::not_measured(target, ""),
    });
    let target = format!(
        "Redis CPU per uncontended acquire + release {} rslock's (per acquisition of the \
         many-locks run, as issue 47 measured it)",
        REDIS_CPU.text()
    );
    let beside = f.cycle_cpu.map_or(String::new(), |(ours, theirs)| {
        format!(
            "; one cycle at a time: {:.1} vs {:.1} µs ({})",
            ours / 1e3,
            theirs / 1e3,
            x(ours / theirs)
        )
    });
    rows.push(match f.redis_cpu {
        Some((ours, theirs)) => {
            let ratio = ours / theirs;
            Row::new(
                target,
                format!(
                    "{:.1} vs {:.1} µs ({}){beside}",
                    ours / 1e3,
                    theirs / 1e3,
                    x(ratio)
                ),
                REDIS_CPU.met(ratio),
            )
        }
        None => Row::not_measured(target, &beside),
    });
    let target = format!(
        "uncontended acquire + release p50 on loopback: {} rslock's speed (rslock's p50 \
         over fencelock's)",
        UNCONTENDED.text()
    );
    rows.push(match f.uncontended {
        Some((ours, theirs)) => {
            let ratio = theirs as f64 / ours as f64;
            Row::new(
                target,
                format!("{} vs {} ({})", fmt_ns(ours), fmt_ns(theirs), x(ratio)),
                UNCONTENDED.met(ratio),
            )
        }
        None => Row::not_measured(target, ""),
    });
    for (peer, bound) in [
        (Peer::FencelockFair, FAIR_HANDOFF),
        (Peer::Fencelock, PLAIN_HANDOFF),
    ] {
        for waiters in WAITERS {
            let floor = f.floor.as_ref().map_or("–".to_owned(), |p| fmt_ns(*p));
            let target = format!(
                "{}: handoff p50 with {waiters} {} {} the release-shaped floor (an \
                 EVALSHA that deletes a key and publishes, to another process: {floor})",
                peer.label(),
                if waiters == 1 { "waiter" } else { "waiters" },
                bound.text()
            );
            let p50 = f
                .handoff
                .iter()
                .find(|(p, w, _)| *p == peer && *w == waiters)
                .map(|(_, _, p50)| *p50);
            rows.push(match (p50, &f.floor) {
                (Some(p50), Ok(floor)) => {
                    let ratio = p50 as f64 / *floor as f64;
                    Row::new(
                        target,
                        format!("{} = {}", fmt_ns(p50), x(ratio)),
                        bound.met(ratio),
                    )
                }
                (_, Err(e)) => Row::not_measured(target, &format!(": the floor: {e}")),
                (None, Ok(_)) => Row::not_measured(target, ""),
            });
        }
    }
    let target = format!(
        "fencelock semaphore, {HOT_KEY_CONTENDERS} contenders: {} redis-semaphore's \
         acquisitions/s at its defaults (its Redis commands per acquisition accepted while \
         it is)",
        SEMAPHORE_RATE.text()
    );
    let commands = f.semaphore_commands.map_or(String::new(), |c| {
        format!("; {c:.1} commands per acquisition")
    });
    rows.push(match f.semaphore {
        Some((ours, theirs)) => {
            let ratio = ours / theirs;
            Row::new(
                target,
                format!("{ours:.0}/s vs {theirs:.0}/s ({}){commands}", x(ratio)),
                SEMAPHORE_RATE.met(ratio),
            )
        }
        None => Row::not_measured(target, &commands),
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figures whose ratios are the ones given: many locks, Redis's CPU, the uncontended
    /// speed (rslock's p50 over fencelock's), fair() and plain handoff over the floor at
    /// every waiter count, the semaphore.
    fn figures(many: f64, cpu: f64, uncontended: f64, fair: f64, plain: f64, sem: f64) -> Figures {
        let floor = 100_000u64;
        let mut handoff = Vec::new();
        for w in WAITERS {
            handoff.push((Peer::FencelockFair, w, (fair * floor as f64) as u64));
            handoff.push((Peer::Fencelock, w, (plain * floor as f64) as u64));
        }
        Figures {
            many: Some((many * 100_000.0, 100_000.0)),
            redis_cpu: Some((cpu * 10_000.0, 10_000.0)),
            cycle_cpu: Some((60_000.0, 55_000.0)),
            // rslock's p50 over fencelock's is the ratio.
            uncontended: Some((100_000, (uncontended * 100_000.0) as u64)),
            floor: Ok(floor),
            handoff,
            semaphore: Some((sem * 5_000.0, 5_000.0)),
            semaphore_commands: Some(38.6),
        }
    }

    fn verdicts(f: &Figures) -> Vec<(String, bool)> {
        rows_of(f).into_iter().map(|r| (r.target, r.met)).collect()
    }

    fn met(f: &Figures) -> Vec<bool> {
        rows_of(f).into_iter().map(|r| r.met).collect()
    }

    #[test]
    fn each_target_is_met_just_inside_its_bound_and_missed_just_outside() {
        // Two percent inside and outside each bound of issue 47: many locks 0.7x,
        // Redis CPU 1.5x, uncontended 0.9x, fair() 1.3x and plain 1.6x the floor at 1,
        // 8 and 64 waiters, the semaphore 1.0x.
        let inside = figures(0.714, 1.47, 0.918, 1.274, 1.568, 1.02);
        let outside = figures(0.686, 1.53, 0.882, 1.326, 1.632, 0.98);
        assert_eq!(rows_of(&inside).len(), 10, "{:#?}", verdicts(&inside));
        assert!(met(&inside).iter().all(|m| *m), "{:#?}", verdicts(&inside));
        assert!(
            met(&outside).iter().all(|m| !*m),
            "{:#?}",
            verdicts(&outside)
        );
    }

    #[test]
    fn fair_and_plain_are_held_to_their_own_bounds() {
        // 1.45x the floor: within plain mode's 1.6x, beyond fair()'s 1.3x.
        let f = figures(1.0, 1.0, 1.0, 1.45, 1.45, 1.0);
        for (target, met) in verdicts(&f) {
            if target.starts_with("fencelock fair(): handoff") {
                assert!(!met, "{target}");
            } else {
                assert!(met, "{target}");
            }
        }
    }

    #[test]
    fn the_full_run_of_29_november_meets_only_the_uncontended_target() {
        let mut f = Figures {
            many: Some((53_763.0, 113_661.0)),
            redis_cpu: Some((11_900.0, 3_800.0)),
            cycle_cpu: Some((63_000.0, 55_400.0)),
            uncontended: Some((122_000, 110_000)),
            floor: Ok(52_500),
            handoff: Vec::new(),
            semaphore: Some((6_644.0, 10_104.0)),
            semaphore_commands: Some(39.6),
        };
        for (w, fair, plain) in [
            (1, 131_000, 286_000),
            (8, 197_000, 280_000),
            (64, 187_000, 310_000),
        ] {
            f.handoff.push((Peer::FencelockFair, w, fair));
            f.handoff.push((Peer::Fencelock, w, plain));
        }
        let rows = rows_of(&f);
        let met: Vec<&str> = rows
            .iter()
            .filter(|r| r.met)
            .map(|r| r.target.as_str())
            .collect();
        assert_eq!(met.len(), 1, "{met:#?}");
        assert!(met[0].starts_with("uncontended"), "{met:#?}");
        assert!(rows[1].figure.contains("(3.13x)"), "{}", rows[1].figure);
        assert!(
            rows[3].figure.contains("131 µs = 2.50x"),
            "{}",
            rows[3].figure
        );
    }

    #[test]
    fn a_target_not_measured_is_not_met() {
        let mut f = figures(1.0, 1.0, 1.0, 1.0, 1.0, 1.0);
        f.many = None;
        f.semaphore = None;
        f.floor = Err("the subscriber did not start".to_owned());
        let rows = rows_of(&f);
        assert!(!rows[0].met && rows[0].figure == "not measured");
        for row in &rows[3..9] {
            assert!(!row.met, "{row:?}");
            assert!(
                row.figure.contains("the subscriber did not start"),
                "{row:?}"
            );
        }
        assert!(!rows[9].met, "{:?}", rows[9]);
        assert!(rows[1].met && rows[2].met, "{rows:#?}");
    }
}
