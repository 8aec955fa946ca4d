//! The targets of the third performance round (issue 34), checked in the report's
//! "Targets" table ahead of the earlier issues' rows: the semaphore's herd, many locks
//! through one client, the handoff under a crowd and against the floor, and the script
//! cost reported beside rslock's.

use std::fmt::Write as _;

use crate::latency::Summary;
use crate::many::Who;
use crate::peers::Peer;
use crate::plan::WAITERS;
use crate::report::{fmt_ns, handoff_p50, x, yes_no};
use crate::results::{HotKeyRow, Results};

/// A semaphore acquisition at 64 contenders: at most this many Redis commands.
pub(crate) const SEMAPHORE_COMMANDS: f64 = 15.0;
/// Plain handoff with 8 and 64 waiters: at most this multiple of the 1-waiter p50.
pub(crate) const CROWD_GROWTH: f64 = 1.2;
/// Handoff with 1, 8 and 64 waiters: at most this multiple of the release-shaped floor,
/// fair mode ...
pub(crate) const FAIR_OVER_FLOOR: f64 = 1.3;
/// ... and plain mode.
pub(crate) const PLAIN_OVER_FLOOR: f64 = 1.6;

fn sem_handoff(r: &Results, peer: Peer) -> Option<Summary> {
    r.semaphores.handoff_row(peer).and_then(|h| h.summary)
}

/// The round's rows of the targets table.
pub(crate) fn rows(s: &mut String, r: &Results) {
    semaphore_rows(s, r);
    many_row(s, r);
    crowd_rows(s, r);
    floor_rows(s, r);
    script_cost_row(s, r);
}

/// Each fencelock semaphore: commands per acquisition, throughput against
/// redis-semaphore at its defaults, handoff p50 against redis-semaphore tuned.
fn semaphore_rows(s: &mut String, r: &Results) {
    let theirs = r
        .semaphores
        .throughput_row(Peer::RedisSemaphore)
        .map(HotKeyRow::per_second);
    let tuned = sem_handoff(r, Peer::RedisSemaphoreTuned).map(|h| h.p50);
    for ours in [Peer::FencelockSemaphore, Peer::FencelockSemaphoreFair] {
        let Some(row) = r.semaphores.throughput_row(ours) else {
            let _ = writeln!(s, "| {}: herd | not measured | **no** |", ours.label());
            continue;
        };
        let per_s = row.per_second();
        let commands = row.commands_per_s.map_or(f64::NAN, |c| c / per_s);
        let hand = sem_handoff(r, ours).map(|h| h.p50);
        let mut ok = commands <= SEMAPHORE_COMMANDS;
        let vs = match theirs {
            Some(t) => {
                ok &= per_s >= t;
                format!(
                    "{per_s:.0}/s vs redis-semaphore's {t:.0}/s ({})",
                    x(per_s / t)
                )
            }
            None => {
                ok = false;
                format!("{per_s:.0}/s; redis-semaphore not measured")
            }
        };
        let handoff = match (hand, tuned) {
            (Some(h), Some(t)) => {
                ok &= h <= t;
                format!(
                    "handoff p50 {} vs redis-semaphore tuned {}",
                    fmt_ns(h),
                    fmt_ns(t)
                )
            }
            _ => {
                ok = false;
                "handoff not measured".to_owned()
            }
        };
        let _ = writeln!(
            s,
            "| {}, 64 contenders: at most {SEMAPHORE_COMMANDS} Redis commands per \
             acquisition, at least redis-semaphore's throughput at its defaults, handoff \
             p50 ahead of redis-semaphore tuned | {commands:.1} commands; {vs}; {handoff} | \
             {} |",
            ours.label(),
            yes_no(ok)
        );
    }
}

/// Many locks through one client: fencelock at least rslock's rate.
fn many_row(s: &mut String, r: &Results) {
    let rate = |who| {
        r.many
            .rows
            .iter()
            .find(|row| row.who == who && row.errors.is_empty())
            .map(crate::many::Row::per_second)
    };
    match (rate(Who::Fencelock), rate(Who::Rslock)) {
        (Some(f), Some(rs)) => {
            let _ = writeln!(
                s,
                "| many locks through one client ({} tasks): at least rslock's \
                 acquisitions/s | {f:.0}/s vs {rs:.0}/s ({}) | {} |",
                crate::many::TASKS,
                x(f / rs),
                yes_no(f >= rs)
            );
        }
        _ => {
            let _ = writeln!(
                s,
                "| many locks through one client | not measured | **no** |"
            );
        }
    }
}

/// Plain mode's handoff with 8 and 64 waiters against its own 1-waiter p50.
fn crowd_rows(s: &mut String, r: &Results) {
    let Some(one) = handoff_p50(r, Peer::Fencelock, WAITERS[0]) else {
        let _ = writeln!(s, "| plain handoff under a crowd | not measured | **no** |");
        return;
    };
    let mut ok = true;
    let mut cells = Vec::new();
    for &w in &WAITERS[1..] {
        match handoff_p50(r, Peer::Fencelock, w) {
            Some(p) => {
                let growth = p as f64 / one as f64;
                ok &= growth <= CROWD_GROWTH;
                cells.push(format!("{w} waiters {} = {}", fmt_ns(p), x(growth)));
            }
            None => {
                ok = false;
                cells.push(format!("{w} waiters: not measured"));
            }
        }
    }
    let _ = writeln!(
        s,
        "| plain handoff with {} and {} waiters at most {CROWD_GROWTH}x its 1-waiter p50 \
         ({}) | {} | {} |",
        WAITERS[1],
        WAITERS[2],
        fmt_ns(one),
        cells.join("; "),
        yes_no(ok)
    );
}

/// Handoff at 1, 8 and 64 waiters against the release-shaped floor measured around it
/// (issue 47 re-based it: one EVALSHA that deletes a key and publishes, not a bare
/// PUBLISH, which the report gives as a reference).
fn floor_rows(s: &mut String, r: &Results) {
    let floor = match &r.floor.release {
        Ok(f) => f.p50,
        Err(e) => {
            let _ = writeln!(
                s,
                "| handoff against the floor | floor not measured: {e} | **no** |"
            );
            return;
        }
    };
    for (peer, most) in [
        (Peer::FencelockFair, FAIR_OVER_FLOOR),
        (Peer::Fencelock, PLAIN_OVER_FLOOR),
    ] {
        for waiters in WAITERS {
            match handoff_p50(r, peer, waiters) {
                Some(p) => {
                    let ratio = p as f64 / floor as f64;
                    let _ = writeln!(
                        s,
                        "| {}: handoff p50 with {waiters} waiters at most {most}x the floor (an \
                         EVALSHA that deletes a key and publishes, to another process, {}) | \
                         {} = {} | {} |",
                        peer.label(),
                        fmt_ns(floor),
                        fmt_ns(p),
                        x(ratio),
                        yes_no(ratio <= most)
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "| {}: handoff with {waiters} waiters against the floor | not measured \
                         | **no** |",
                        peer.label()
                    );
                }
            }
        }
    }
}

/// Redis's CPU per uncontended cycle, fencelock's against rslock's (reported; the
/// token's cost is accepted).
fn script_cost_row(s: &mut String, r: &Results) {
    let Ok(lat) = &r.latency else { return };
    let cpu = |label: &str| {
        lat.server_cpu
            .iter()
            .find(|(l, _)| l == label)
            .and_then(|(_, c)| c.as_ref().ok().copied())
    };
    if let (Some(f), Some(rs)) = (cpu("fencelock"), cpu("rslock")) {
        let _ = writeln!(
            s,
            "| Redis CPU per uncontended cycle, beside rslock's (reported: the fencing \
             token's cost is accepted) | {:.1} µs vs {:.1} µs ({}) | – |",
            f / 1000.0,
            rs / 1000.0,
            x(f / rs)
        );
    }
}
