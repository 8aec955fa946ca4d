//! Semaphores: fencelock's semaphore side by side with redis-semaphore's `Semaphore`
//! (npm, on ioredis, in the Node driver), each with [`SEMAPHORE_PERMITS`] permits, on the
//! main Redis in the same run as the lock rows.
//!
//! Two measurements per semaphore, over worker processes as the lock rows:
//!
//! - **Throughput**: the hot-key run with a semaphore: [`HOT_KEY_CONTENDERS`] contenders
//!   loop acquire (waiting) → release at once, for the plan's `hot_key_run`; acquisitions
//!   per second and per contender.
//! - **Handoff**: every permit held and [`SEMAPHORE_WAITERS`] waiters; the time from a
//!   release to a waiter in another process holding the freed permit, with the stamps
//!   of the releases queued in a list (the worker's `Scenario::SemaphoreHandoff`), for
//!   the plan's `handoff_run`.

use std::fmt::Write as _;
use std::time::Duration;

use crate::launcher::{self, Launcher, MAX_PROCS, Run, Scenario, measured};
use crate::peers::{self, Peer};
use crate::plan::{HANDOFF_HOLD, HOT_KEY_CONTENDERS, Plan, SEMAPHORE_PERMITS, SEMAPHORE_WAITERS};
use crate::report::{errors_cell, fmt_dur, fmt_ns, x};
use crate::results::{HandoffRow, HotKeyRow};

/// Everything the section measured: per semaphore, a throughput row and a handoff row.
#[derive(Default)]
pub(crate) struct Semaphores {
    pub(crate) throughput: Vec<HotKeyRow>,
    pub(crate) handoff: Vec<HandoffRow>,
}

impl Semaphores {
    /// Whether any measurement failed.
    pub(crate) fn failed(&self) -> bool {
        self.throughput
            .iter()
            .any(|r| r.error.is_some() || !r.report.errors.is_empty())
            || self
                .handoff
                .iter()
                .any(|r| r.error.is_some() || !r.report.errors.is_empty())
    }

    pub(crate) fn throughput_row(&self, peer: Peer) -> Option<&HotKeyRow> {
        self.throughput
            .iter()
            .find(|r| r.peer == peer && r.error.is_none())
    }

    pub(crate) fn handoff_row(&self, peer: Peer) -> Option<&HandoffRow> {
        self.handoff.iter().find(|r| r.peer == peer)
    }
}

/// Runs the section on `server`: the semaphores of [`peers::semaphores`] (redis-semaphore
/// only with Node), throughput then handoff for each.
pub(crate) async fn run(
    plan: &Plan,
    launch: &Launcher,
    server: &testkit::RedisServer,
    node: bool,
) -> Semaphores {
    let mut sem = Semaphores::default();
    for peer in peers::semaphores(node) {
        let run = Run {
            scenario: Scenario::HotKey,
            peer,
            name: format!("sem-hot-{}", peer.slug()),
            contenders: HOT_KEY_CONTENDERS,
            hold: Duration::ZERO,
            duration: plan.hot_key_run,
        };
        eprintln!(
            "semaphores: {} throughput, {SEMAPHORE_PERMITS} permits, {HOT_KEY_CONTENDERS} \
             contenders, {:?}",
            peer.label(),
            plan.hot_key_run
        );
        let (tasks, report, commands_per_s, error) = measured(launch, server, &run).await;
        sem.throughput.push(HotKeyRow {
            peer,
            tasks,
            report,
            duration: plan.hot_key_run,
            commands_per_s,
            error,
        });
        eprintln!(
            "semaphores: {} handoff, {SEMAPHORE_PERMITS} permits held, {SEMAPHORE_WAITERS} \
             waiters, {:?}",
            peer.label(),
            plan.handoff_run
        );
        let name = format!("sem-handoff-{}", peer.slug());
        let row =
            launcher::semaphore_handoff_row(launch, server, peer, name, plan.handoff_run).await;
        sem.handoff.push(row);
    }
    sem
}

/// The section "Semaphores": what is measured, the settings, and one table. `unit` is
/// the PING p50 the ratios are taken against, and `unit_what` says which PINGs those are.
pub(crate) fn render(s: &mut String, sem: &Semaphores, plan: &Plan, unit: u64, unit_what: &str) {
    let _ = writeln!(s, "## Semaphores\n");
    let _ = writeln!(
        s,
        "fencelock's semaphore against redis-semaphore's `Semaphore` (npm, in the Node \
         driver), {SEMAPHORE_PERMITS} permits each, on the same Redis in the same run. \
         Throughput: {HOT_KEY_CONTENDERS} contenders over {MAX_PROCS} processes loop \
         acquire (waiting) → release at once → acquire again, {} per semaphore, counted \
         per contender as in the hot-key run. Handoff: {} contenders, so every permit is \
         held and {SEMAPHORE_WAITERS} wait; hold {HANDOFF_HOLD:?} (1–2 ms); {} per \
         semaphore; strict handoff and the sampling rules of the lock handoff, but since \
         permits are interchangeable each holder pushes its stamp (CLOCK_MONOTONIC) onto a \
         list just before it releases and each new holder pops the oldest: the time from \
         a release (its push's round trip included, which the lock handoff's stamp file \
         avoids) to a waiter in another process holding a permit, releases and \
         acquisitions paired in order. An acquisition by a contender that was not waiting \
         at its paired release (most often a releaser back from its notification, taking \
         a permit the waiters have not noticed yet) is not a sample: that leaves out \
         releases the waiters were slow to notice, which flatters the pollers. p50 × PING: as a multiple of the PING p50 ({}, {unit_what}); \
         × fencelock: of fencelock's semaphore in this run. \"–\": not measured.\n",
        fmt_dur(plan.hot_key_run),
        SEMAPHORE_PERMITS as usize + SEMAPHORE_WAITERS,
        fmt_dur(plan.handoff_run),
        fmt_ns(unit),
    );
    let _ = writeln!(s, "| semaphore | settings |\n|---|---|");
    let rows: Vec<Peer> = Peer::SEMAPHORES
        .into_iter()
        .filter(|p| sem.throughput.iter().any(|r| r.peer == *p))
        .collect();
    for p in &rows {
        let _ = writeln!(s, "| {} | {} |", p.label(), p.settings());
    }
    let _ = writeln!(s);
    if !rows.iter().any(|p| p.node()) {
        let _ = writeln!(s, "redis-semaphore left out: no Node (see Machine).\n");
    }
    let fence_hot = sem
        .throughput_row(Peer::FencelockSemaphore)
        .map(HotKeyRow::per_second);
    let fence_hand = sem
        .handoff_row(Peer::FencelockSemaphore)
        .and_then(|h| h.summary);
    let _ = writeln!(
        s,
        "| semaphore | acquisitions/s | × fencelock | min / max per contender | Redis commands / acquisition | handoff samples | handoff p50 | handoff p99 | p50 × PING | p50 × fencelock | p99 × fencelock | not sampled (same process / not waiting) | errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for p in rows {
        let (hot, rel, spread, commands, hot_errors) = match sem.throughput_row(p) {
            Some(h) => {
                let counts = &h.report.counts;
                let min = counts.iter().min().copied().unwrap_or(0);
                let max = counts.iter().max().copied().unwrap_or(0);
                (
                    format!("{:.0}", h.per_second()),
                    fence_hot.map_or("–".into(), |f| x(h.per_second() / f)),
                    format!("{min} / {max} ({:.2})", h.fairness()),
                    match h.commands_per_s {
                        Some(c) if h.per_second() > 0.0 => format!("{:.1}", c / h.per_second()),
                        _ => "–".to_owned(),
                    },
                    errors_cell(&h.report.errors, None),
                )
            }
            None => {
                let failed = sem.throughput.iter().find(|r| r.peer == p);
                (
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    failed.map_or("–".into(), |r| {
                        errors_cell(&r.report.errors, r.error.as_deref())
                    }),
                )
            }
        };
        let hand = sem.handoff_row(p);
        let (n, p50, p99, rp, rf50, rf99, skipped, hand_errors) =
            match (hand, hand.and_then(|h| h.summary)) {
                (Some(h), Some(sum)) => (
                    sum.n.to_string(),
                    fmt_ns(sum.p50),
                    fmt_ns(sum.p99),
                    x(sum.p50 as f64 / unit as f64),
                    fence_hand.map_or("–".into(), |f| x(sum.p50 as f64 / f.p50 as f64)),
                    fence_hand.map_or("–".into(), |f| x(sum.p99 as f64 / f.p99 as f64)),
                    format!("{} / {}", h.report.same_process, h.report.late),
                    errors_cell(&h.report.errors, h.error.as_deref()),
                ),
                (h, _) => (
                    "0".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    h.map_or("–".into(), |h| {
                        format!("{} / {}", h.report.same_process, h.report.late)
                    }),
                    h.map_or("–".into(), |h| {
                        errors_cell(&h.report.errors, h.error.as_deref())
                    }),
                ),
            };
        let errors = if hot_errors == "0" && hand_errors == "0" {
            "0".to_owned()
        } else {
            format!("throughput: {hot_errors}; handoff: {hand_errors}")
        };
        let _ = writeln!(
            s,
            "| {} | {hot} | {rel} | {spread} | {commands} | {n} | {p50} | {p99} | {rp} | {rf50} | {rf99} | {skipped} | {errors} |",
            p.label(),
        );
    }
    let _ = writeln!(s);
}
