//! Safety checkers over a merged [history](crate::history).
//!
//! Every checker takes the whole history of one lock, **sorted by
//! `time_ns`** as [`read_histories`](crate::history::read_histories) returns
//! it, makes one pass over it (O(n) after the O(n log n) sort), and returns
//! the [`Violation`]s it found: an empty vector means the history passed.
//!
//! | Checker                     | Property                                                        | Extra input              |
//! |-----------------------------|-----------------------------------------------------------------|--------------------------|
//! | C1 [`leases_overlap`]       | leases of different owners never overlap; writes lie in a lease | —                        |
//! | C1 [`leases_over`]          | a semaphore's: at most N leases at once; writes lie in a lease  | N, the permits           |
//! | C1 [`readers_beside_writer`] | a read-write lock's: readers together, a writer alone; reads and writes lie in a lease | `shared` records |
//! | C2 [`fenced_order`]         | the resource never accepts a lower token after a higher one     | —                        |
//! | C3 [`lost_writes`]          | every acknowledged write is in the final resource state         | final set of values      |
//! | C4 [`tokens_increase`]      | tokens of successful acquires strictly increase                 | —                        |
//! | C5 [`foreign_touch`]        | release/extend never acted on another holder's key              | `touched_owner` records  |
//! | C6 [`availability`]         | after a kill, the next acquire succeeds within a bound          | kill time, bound         |
//!
//! A record a checker needs but that lacks a field it needs (say an
//! `acquire ok` without `valid_until_ns`) is reported as a violation whose
//! explanation starts with `malformed:`, never silently skipped: a checker
//! that cannot see its input must not pass.
//!
//! "Happened before" is judged conservatively from client-side timestamps:
//! operation A precedes operation B only if A's completion was recorded
//! *strictly* before B's invocation. Concurrent operations (overlapping
//! invoke..completion spans) are never ordered, so slow acknowledgements
//! cannot produce false positives.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use crate::history::{Event, Op, Phase};

/// Which checker found a [`Violation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Checker {
    /// C1, [`leases_overlap`].
    LeasesOverlap,
    /// C2, [`fenced_order`].
    FencedOrder,
    /// C3, [`lost_writes`].
    LostWrites,
    /// C4, [`tokens_increase`].
    TokensIncrease,
    /// C5, [`foreign_touch`].
    ForeignTouch,
    /// C6, [`availability`].
    Availability,
}

impl Checker {
    /// Short name, like `"C1 leases_overlap"`.
    pub fn name(self) -> &'static str {
        match self {
            Checker::LeasesOverlap => "C1 leases_overlap",
            Checker::FencedOrder => "C2 fenced_order",
            Checker::LostWrites => "C3 lost_writes",
            Checker::TokensIncrease => "C4 tokens_increase",
            Checker::ForeignTouch => "C5 foreign_touch",
            Checker::Availability => "C6 availability",
        }
    }
}

impl fmt::Display for Checker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken property, found by one checker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The checker that found it.
    pub checker: Checker,
    /// The events involved, earliest first (may be empty, e.g. "no acquire
    /// at all after the kill").
    pub events: Vec<Event>,
    /// One line saying what is wrong.
    pub explanation: String,
}

impl Violation {
    fn new(checker: Checker, events: &[&Event], explanation: String) -> Self {
        Violation {
            checker,
            events: events.iter().map(|e| (*e).clone()).collect(),
            explanation,
        }
    }
}

impl fmt::Display for Violation {
    /// `C2 fenced_order: ... [p1@100 write ok token=5, p2@300 write ok token=4]`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.checker, self.explanation)?;
        if !self.events.is_empty() {
            f.write_str(" [")?;
            for (i, e) in self.events.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "p{}@{} {:?} {:?}", e.process, e.time_ns, e.op, e.phase)?;
                if let Some(t) = e.token {
                    write!(f, " token={t}")?;
                }
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

fn is(e: &Event, op: Op, phase: Phase) -> bool {
    e.op == op && e.phase == phase
}

fn debug_assert_sorted(history: &[Event]) {
    debug_assert!(
        history.is_sorted_by_key(|e| e.time_ns),
        "checkers need a history sorted by time_ns (use read_histories)"
    );
}

fn malformed(checker: Checker, e: &Event, what: &str) -> Violation {
    Violation::new(checker, &[e], format!("malformed: {what}"))
}

/// A lease a process believes it holds: `[start.time_ns, end_ns)`.
struct Lease<'a> {
    start: &'a Event,
    owner: &'a str,
    end_ns: u64,
}

/// Which leases may be live at once, for C1.
#[derive(Clone, Copy)]
enum Sharing {
    /// Up to this many owners (a lock: 1; a semaphore: its permits).
    Permits(usize),
    /// A read-write lock: readers (`shared` leases) together, a writer alone.
    ReadWrite,
}

/// C1: leases of different owners never overlap, and every acknowledged
/// write lies inside its writer's lease.
///
/// A process's lease starts at its `acquire ok` (which must carry `owner`
/// and `valid_until_ns`) and ends at the earlier of `valid_until_ns` and the
/// process's next `release invoke`; the interval is half-open
/// `[time_ns, end)`. An `extend ok` (with `valid_until_ns`) moves the end of
/// the process's live lease, or, if its lease had already ended, starts a new
/// one at the `extend ok` (the worker believes it holds the lock again).
///
/// Violations:
/// * a lease starts while a lease of a **different owner** is live (events:
///   the live lease's start, the new start);
/// * a `write ok` of a process with no live lease at that time (events: the
///   process's last lease start, if any, and the write).
///
/// Events with the same `time_ns` are taken ends first, then starts, then
/// writes, so back-to-back leases (`release invoke` and the next `acquire
/// ok` at the same nanosecond) do not overlap. Cost: O(n·p) where p is the
/// number of simultaneously live leases (1 in a correct history).
pub fn leases_overlap(history: &[Event]) -> Vec<Violation> {
    leases_over(history, 1)
}

/// C1 for a semaphore of `permits` permits: never more than `permits` leases of
/// different owners at once, and every acknowledged write inside its writer's lease.
/// [`leases_overlap`] is this with one permit; the rules are its rules. A lease that
/// starts while `permits` leases of other owners are live is one violation (events:
/// their starts, then the new one).
pub fn leases_over(history: &[Event], permits: usize) -> Vec<Violation> {
    leases_with(history, Sharing::Permits(permits))
}

/// C1 for a read-write lock: a writer's lease (`acquire ok` without
/// [`shared`](Event::shared)) never overlaps another owner's lease, readers'
/// leases overlap freely, and every acknowledged write **and read** lies inside
/// a lease of its process (a reader that reads after its lease ended may read
/// beside a writer). The other rules are [`leases_overlap`]'s. A lease that
/// starts beside a lease it may not share is one violation per lease in the way
/// (events: its start, then the new one).
pub fn readers_beside_writer(history: &[Event]) -> Vec<Violation> {
    leases_with(history, Sharing::ReadWrite)
}

fn leases_with(history: &[Event], sharing: Sharing) -> Vec<Violation> {
    const C: Checker = Checker::LeasesOverlap;
    debug_assert_sorted(history);
    let mut out = Vec::new();
    let mut live: HashMap<u32, Lease<'_>> = HashMap::new();
    let mut last_start: HashMap<u32, &Event> = HashMap::new();
    for chunk in history.chunk_by(|a, b| a.time_ns == b.time_ns) {
        let t = chunk[0].time_ns;
        for e in chunk.iter().filter(|e| is(e, Op::Release, Phase::Invoke)) {
            live.remove(&e.process);
        }
        live.retain(|_, l| l.end_ns > t);
        let starts = chunk
            .iter()
            .filter(|e| e.phase == Phase::Ok && matches!(e.op, Op::Acquire | Op::Extend));
        for e in starts {
            let (Some(owner), Some(until)) = (e.owner.as_deref(), e.valid_until_ns) else {
                out.push(malformed(
                    C,
                    e,
                    "lease start without owner or valid_until_ns",
                ));
                continue;
            };
            // A grant whose lease had run out when its acquire returned (the process was
            // paused between the grant and its record: the worker records `valid_until`
            // as the moment of the record then) held nothing, and overlaps nobody; a
            // write it makes lies outside its lease, which the write check flags.
            if e.op == Op::Acquire && until <= t {
                continue;
            }
            if e.op == Op::Extend
                && let Some(l) = live.get_mut(&e.process).filter(|l| l.owner == owner)
            {
                l.end_ns = until;
                continue;
            }
            let mut others: Vec<&Lease<'_>> = live.values().filter(|l| l.owner != owner).collect();
            if let Sharing::ReadWrite = sharing {
                let role = |e: &Event| if e.shared { "reader" } else { "writer" };
                for other in others.iter().filter(|l| !(e.shared && l.start.shared)) {
                    out.push(Violation::new(
                        C,
                        &[other.start, e],
                        format!(
                            "{} {owner:?} (p{}) got a lease at {t} while {} {:?} (p{}) held one until {}",
                            role(e),
                            e.process,
                            role(other.start),
                            other.owner,
                            other.start.process,
                            other.end_ns
                        ),
                    ));
                }
            } else if let Sharing::Permits(1) = sharing {
                for other in others {
                    out.push(Violation::new(
                        C,
                        &[other.start, e],
                        format!(
                            "owner {owner:?} (p{}) got a lease at {t} while owner {:?} (p{}) held one until {}",
                            e.process, other.owner, other.start.process, other.end_ns
                        ),
                    ));
                }
            } else if let Sharing::Permits(permits) = sharing
                && others.len() >= permits
            {
                others.sort_by_key(|l| l.start.time_ns);
                let mut events: Vec<&Event> = others.iter().map(|l| l.start).collect();
                events.push(e);
                out.push(Violation::new(
                    C,
                    &events,
                    format!(
                        "owner {owner:?} (p{}) got a lease at {t} while {} other owners held one: more than {permits} at once",
                        e.process,
                        others.len()
                    ),
                ));
            }
            last_start.insert(e.process, e);
            if until > t {
                live.insert(
                    e.process,
                    Lease {
                        start: e,
                        owner,
                        end_ns: until,
                    },
                );
            } else {
                live.remove(&e.process);
            }
        }
        let used = |e: &&Event| {
            is(e, Op::Write, Phase::Ok)
                || (matches!(sharing, Sharing::ReadWrite) && is(e, Op::Read, Phase::Ok))
        };
        for e in chunk.iter().filter(used) {
            if !live.contains_key(&e.process) {
                let mut events: Vec<&Event> =
                    last_start.get(&e.process).copied().into_iter().collect();
                events.push(e);
                out.push(Violation::new(
                    C,
                    &events,
                    format!(
                        "p{} had a {} acknowledged at {t} outside any lease it held",
                        e.process,
                        if e.op == Op::Read { "read" } else { "write" }
                    ),
                ));
            }
        }
    }
    out
}

/// Shared pass of C2 and C4: completions `(op, ok)` must carry a token
/// greater (`strict`) or not lower than every token of an `(op, ok)` that
/// completed strictly before their invocation.
fn token_order(history: &[Event], op: Op, strict: bool, c: Checker) -> Vec<Violation> {
    debug_assert_sorted(history);
    let mut out = Vec::new();
    // The completed `ok` with the highest token so far.
    let mut max: Option<(u64, &Event)> = None;
    // Per process: `max` as it was when the process invoked its operation.
    let mut at_invoke: HashMap<u32, Option<(u64, &Event)>> = HashMap::new();
    for chunk in history.chunk_by(|a, b| a.time_ns == b.time_ns) {
        let before = max;
        for e in chunk.iter().filter(|e| is(e, op, Phase::Invoke)) {
            at_invoke.insert(e.process, before);
        }
        for e in chunk
            .iter()
            .filter(|e| e.op == op && e.phase != Phase::Invoke)
        {
            let bound = at_invoke.remove(&e.process).unwrap_or(before);
            if e.phase != Phase::Ok {
                continue;
            }
            let Some(token) = e.token else {
                out.push(malformed(c, e, "ok without token"));
                continue;
            };
            if let Some((high, high_event)) = bound
                && (token < high || (strict && token == high))
            {
                out.push(Violation::new(
                    c,
                    &[high_event, e],
                    format!(
                        "token {token} (p{}) {} after token {high} (p{}) had been",
                        e.process,
                        if op == Op::Write {
                            "accepted"
                        } else {
                            "granted"
                        },
                        high_event.process
                    ),
                ));
            }
        }
        for e in chunk.iter().filter(|e| is(e, op, Phase::Ok)) {
            if let Some(token) = e.token
                && max.is_none_or(|(high, _)| token > high)
            {
                max = Some((token, e));
            }
        }
    }
    out
}

/// C2: the fenced resource never accepts a lower token after a higher one.
///
/// Input: `write ok` events (the resource accepted the write) with the
/// `token` presented, and their `write invoke`. A violation is a `write ok`
/// with token `t` whose invocation came after another `write ok` with a
/// token greater than `t` had completed (events: that write, this write).
/// Equal tokens are fine (one holder writes many times). A `write ok` with
/// no preceding `write invoke` of its process counts as invoked at its own
/// time, which also suits a resource that logs its accepted writes itself as
/// atomic events.
pub fn fenced_order(history: &[Event]) -> Vec<Violation> {
    token_order(history, Op::Write, false, Checker::FencedOrder)
}

/// C3: no acknowledged write is lost.
///
/// Model: each write puts a distinct `value` into a set (the resource keeps
/// every value it accepted); `final_values` is that set read from the
/// resource at the end of the run. Violations:
/// * a `write ok` whose `value` is missing from `final_values` (events: the
///   write);
/// * a value in `final_values` that no `write` event of any phase carries
///   (a phantom write; no events).
///
/// Writes that ended `fail` or `info`, or never completed, may be present or
/// absent.
pub fn lost_writes(history: &[Event], final_values: &[i64]) -> Vec<Violation> {
    const C: Checker = Checker::LostWrites;
    debug_assert_sorted(history);
    let present: HashSet<i64> = final_values.iter().copied().collect();
    let mut written = HashSet::new();
    let mut out = Vec::new();
    for e in history.iter().filter(|e| e.op == Op::Write) {
        if let Some(v) = e.value {
            written.insert(v);
        }
        if e.phase == Phase::Ok {
            match e.value {
                None => out.push(malformed(C, e, "write ok without value")),
                Some(v) if !present.contains(&v) => out.push(Violation::new(
                    C,
                    &[e],
                    format!(
                        "acknowledged write of {v} (p{}) is missing from the final state",
                        e.process
                    ),
                )),
                Some(_) => {}
            }
        }
    }
    let mut reported = HashSet::new();
    for &v in final_values {
        if !written.contains(&v) && reported.insert(v) {
            out.push(Violation::new(
                C,
                &[],
                format!("final state holds {v}, which nobody wrote"),
            ));
        }
    }
    out
}

/// C4: fencing tokens of successful acquires strictly increase.
///
/// Input: `acquire ok` events with `token` and their `acquire invoke`
/// (one lock per history). Violations:
/// * an `acquire ok` with a token not greater than that of an `acquire ok`
///   completed before its invocation (events: both);
/// * two `acquire ok` with the same token, even if concurrent (events: both).
pub fn tokens_increase(history: &[Event]) -> Vec<Violation> {
    const C: Checker = Checker::TokensIncrease;
    let mut out = token_order(history, Op::Acquire, true, C);
    let mut seen: HashMap<u64, &Event> = HashMap::new();
    for e in history.iter().filter(|e| is(e, Op::Acquire, Phase::Ok)) {
        let Some(token) = e.token else { continue }; // reported by token_order
        if let Some(first) = seen.insert(token, e) {
            let pair = [first.clone(), e.clone()];
            let already = out.iter().any(|v| v.events == pair);
            if !already {
                out.push(Violation::new(
                    C,
                    &[first, e],
                    format!(
                        "token {token} granted twice (p{} and p{})",
                        first.process, e.process
                    ),
                ));
            }
        }
    }
    out
}

/// C5: no release or renewal ever acted on another holder's key.
///
/// Input: `release` / `extend` events (any phase) whose
/// [`touched_owner`](Event::touched_owner) records the owner token the key
/// held when the operation deleted it or changed its expiry. Release and
/// extend are compare-and-act scripts, so a client only sees "acted / did
/// not act"; the lab records `touched_owner` with an instrumented script that
/// returns the value it found, or from its server-side log of the lock key.
/// Events without `touched_owner` are not judged. Violation: `touched_owner`
/// differs from the event's `owner` (events: the event); a `touched_owner`
/// without `owner` is malformed.
pub fn foreign_touch(history: &[Event]) -> Vec<Violation> {
    const C: Checker = Checker::ForeignTouch;
    debug_assert_sorted(history);
    let mut out = Vec::new();
    for e in history
        .iter()
        .filter(|e| matches!(e.op, Op::Release | Op::Extend))
    {
        let Some(touched) = e.touched_owner.as_deref() else {
            continue;
        };
        match e.owner.as_deref() {
            None => out.push(malformed(C, e, "touched_owner without owner")),
            Some(owner) if owner != touched => out.push(Violation::new(
                C,
                &[e],
                format!(
                    "{:?} by owner {owner:?} (p{}) acted on the key of owner {touched:?}",
                    e.op, e.process
                ),
            )),
            Some(_) => {}
        }
    }
    out
}

/// C6: after a holder is killed at `killed_at_ns` (`CLOCK_MONOTONIC`), the
/// first `acquire ok` at or after that time comes within `bound` (normally
/// TTL plus the retry bounds).
///
/// Violations: that acquire is later than `killed_at_ns + bound` (events:
/// it), or there is none at all (no events).
pub fn availability(history: &[Event], killed_at_ns: u64, bound: Duration) -> Vec<Violation> {
    const C: Checker = Checker::Availability;
    debug_assert_sorted(history);
    let bound_ns = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    let first = history
        .iter()
        .find(|e| e.time_ns >= killed_at_ns && is(e, Op::Acquire, Phase::Ok));
    match first {
        None => vec![Violation::new(
            C,
            &[],
            format!("no acquire succeeded after the kill at {killed_at_ns}"),
        )],
        Some(e) if e.time_ns - killed_at_ns > bound_ns => vec![Violation::new(
            C,
            &[e],
            format!(
                "first acquire after the kill at {killed_at_ns} came {:?} later, bound {bound:?}",
                Duration::from_nanos(e.time_ns - killed_at_ns)
            ),
        )],
        Some(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(p: u32, t: u64, op: Op, phase: Phase) -> Event {
        Event::new(p, t, op, phase)
    }

    fn acquire_ok(p: u32, t: u64, token: u64, owner: &str, until: u64) -> Event {
        ev(p, t, Op::Acquire, Phase::Ok)
            .with_token(token)
            .with_owner(owner)
            .with_valid_until(until)
    }

    fn write(p: u32, t: u64, phase: Phase, token: u64, value: i64) -> Event {
        ev(p, t, Op::Write, phase)
            .with_token(token)
            .with_value(value)
    }

    fn sorted(mut h: Vec<Event>) -> Vec<Event> {
        h.sort_by_key(|e| e.time_ns);
        h
    }

    /// Two processes take turns correctly: p1 holds [10, 50) (released),
    /// p2 holds [50, 200) (extended from 120 to 200, then expires).
    fn good_history() -> Vec<Event> {
        sorted(vec![
            ev(1, 0, Op::Acquire, Phase::Invoke),
            acquire_ok(1, 10, 1, "a", 100),
            write(1, 20, Phase::Invoke, 1, 10),
            write(1, 30, Phase::Ok, 1, 10),
            ev(1, 50, Op::Release, Phase::Invoke).with_owner("a"),
            ev(1, 60, Op::Release, Phase::Ok)
                .with_owner("a")
                .with_touched_owner("a"),
            ev(2, 40, Op::Acquire, Phase::Invoke),
            acquire_ok(2, 50, 2, "b", 120),
            write(2, 70, Phase::Invoke, 2, 20),
            write(2, 80, Phase::Ok, 2, 20),
            ev(2, 90, Op::Extend, Phase::Invoke).with_owner("b"),
            ev(2, 100, Op::Extend, Phase::Ok)
                .with_owner("b")
                .with_valid_until(200)
                .with_touched_owner("b"),
            write(2, 150, Phase::Invoke, 2, 21),
            write(2, 160, Phase::Ok, 2, 21),
            // An unknown-outcome write: may or may not be in the final state.
            write(2, 170, Phase::Invoke, 2, 22),
            write(2, 190, Phase::Info, 2, 22).with_error("timeout"),
            ev(3, 300, Op::Acquire, Phase::Invoke),
            acquire_ok(3, 310, 3, "c", 400),
        ])
    }

    #[test]
    fn good_history_passes_every_checker() {
        let h = good_history();
        assert_eq!(leases_overlap(&h), []);
        assert_eq!(fenced_order(&h), []);
        assert_eq!(lost_writes(&h, &[10, 20, 21]), []);
        assert_eq!(lost_writes(&h, &[10, 20, 21, 22]), []);
        assert_eq!(tokens_increase(&h), []);
        assert_eq!(foreign_touch(&h), []);
        assert_eq!(availability(&h, 200, Duration::from_nanos(110)), []);
    }

    #[test]
    fn c1_flags_overlapping_leases() {
        let h = sorted(vec![
            acquire_ok(1, 10, 1, "a", 100),
            acquire_ok(2, 50, 2, "b", 150),
        ]);
        let v = leases_overlap(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].checker, Checker::LeasesOverlap);
        assert_eq!(v[0].events, h);
        // Expired exactly at the next start: no overlap.
        let h = sorted(vec![
            acquire_ok(1, 10, 1, "a", 50),
            acquire_ok(2, 50, 2, "b", 150),
        ]);
        assert_eq!(leases_overlap(&h), []);
    }

    #[test]
    fn c1_ignores_a_grant_whose_lease_ran_out_before_its_acquire_returned() {
        // b was paused after its grant, past its lease: it records its acquire at 60
        // with nothing left of the lease (valid until 60), while a holds until 150.
        let h = sorted(vec![
            acquire_ok(1, 50, 1, "a", 150),
            acquire_ok(2, 60, 2, "b", 60),
        ]);
        assert_eq!(leases_overlap(&h), []);
        // One nanosecond of lease left is a lease: flagged.
        let h = sorted(vec![
            acquire_ok(1, 50, 1, "a", 150),
            acquire_ok(2, 60, 2, "b", 61),
        ]);
        assert_eq!(leases_overlap(&h).len(), 1);
        // And its write, outside any lease it held, is flagged.
        let h = sorted(vec![
            acquire_ok(1, 50, 1, "a", 150),
            acquire_ok(2, 60, 2, "b", 60),
            write(2, 70, Phase::Invoke, 2, 20),
            write(2, 80, Phase::Ok, 2, 20),
        ]);
        assert_eq!(leases_overlap(&h).len(), 1);
    }

    #[test]
    fn c1_with_permits_flags_only_more_holders_than_permits() {
        // Two permits: two holders at once are fine, the third while both live is not.
        let h = sorted(vec![
            acquire_ok(1, 10, 1, "a", 100),
            acquire_ok(2, 20, 2, "b", 100),
            write(2, 30, Phase::Ok, 2, 1),
            ev(1, 40, Op::Release, Phase::Invoke).with_owner("a"),
            acquire_ok(3, 40, 3, "c", 100),
            acquire_ok(4, 50, 4, "d", 150),
        ]);
        let v = leases_over(&h, 2);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].checker, Checker::LeasesOverlap);
        assert!(v[0].explanation.contains("more than 2 at once"), "{v:?}");
        assert_eq!(
            v[0].events.iter().map(|e| e.process).collect::<Vec<_>>(),
            [2, 3, 4]
        );
        assert_eq!(leases_over(&h, 3), []);
        // A write after its own lease ended is flagged whatever the permits.
        let h = sorted(vec![
            acquire_ok(1, 10, 1, "a", 50),
            write(1, 60, Phase::Ok, 1, 1),
        ]);
        assert_eq!(leases_over(&h, 5).len(), 1);
    }

    #[test]
    fn c1_for_a_read_write_lock_lets_readers_share_and_no_one_beside_a_writer() {
        let read = |p, t, owner: &str, until| acquire_ok(p, t, p.into(), owner, until).shared();
        let readers = sorted(vec![
            read(1, 10, "r1", 100),
            read(2, 20, "r2", 100),
            ev(2, 30, Op::Read, Phase::Ok),
            ev(1, 40, Op::Read, Phase::Ok),
        ]);
        assert!(readers_beside_writer(&readers).is_empty());
        assert_eq!(leases_overlap(&readers).len(), 1, "as a lock they overlap");

        // A writer beside two readers: one violation per reader.
        let mut h = readers.clone();
        h.push(acquire_ok(3, 50, 3, "w", 150));
        let v = readers_beside_writer(&sorted(h));
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(
            v[0].explanation.starts_with("writer \"w\" (p3)"),
            "{}",
            v[0]
        );
        // A reader beside a writer.
        let h = sorted(vec![acquire_ok(3, 10, 3, "w", 100), read(1, 20, "r1", 100)]);
        let v = readers_beside_writer(&h);
        assert_eq!(v.len(), 1);
        assert!(v[0].explanation.contains("while writer \"w\""), "{}", v[0]);
        // A reader's read after its lease ended.
        let h = sorted(vec![
            read(1, 10, "r1", 100),
            ev(1, 150, Op::Read, Phase::Ok),
        ]);
        let v = readers_beside_writer(&h);
        assert_eq!(v.len(), 1);
        assert!(v[0].explanation.contains("read acknowledged"), "{}", v[0]);
    }

    #[test]
    fn c1_flags_overlap_created_by_a_late_extend() {
        let h = sorted(vec![
            acquire_ok(1, 10, 1, "a", 50),
            acquire_ok(2, 60, 2, "b", 150),
            ev(1, 70, Op::Extend, Phase::Ok)
                .with_owner("a")
                .with_valid_until(170),
        ]);
        let v = leases_overlap(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].events, [h[1].clone(), h[2].clone()]);
    }

    #[test]
    fn c1_flags_writes_outside_the_lease() {
        // After expiry, after release, and without ever acquiring.
        let h = sorted(vec![
            acquire_ok(1, 10, 1, "a", 100),
            write(1, 120, Phase::Ok, 1, 1),
            acquire_ok(2, 200, 2, "b", 400),
            ev(2, 250, Op::Release, Phase::Invoke).with_owner("b"),
            write(2, 260, Phase::Ok, 2, 2),
            write(3, 270, Phase::Ok, 9, 3),
        ]);
        let v = leases_overlap(&h);
        assert_eq!(v.len(), 3, "{v:?}");
        assert_eq!(v[0].events, [h[0].clone(), h[1].clone()]);
        assert_eq!(v[1].events, [h[2].clone(), h[4].clone()]);
        assert_eq!(v[2].events, [h[5].clone()]);
        assert!(v.iter().all(|v| v.explanation.contains("outside")));
    }

    #[test]
    fn c1_reports_malformed_lease_starts() {
        let h = vec![ev(1, 10, Op::Acquire, Phase::Ok).with_owner("a")];
        let v = leases_overlap(&h);
        assert_eq!(v.len(), 1);
        assert!(v[0].explanation.starts_with("malformed:"));
    }

    #[test]
    fn c2_flags_lower_token_accepted_after_higher() {
        let h = sorted(vec![
            write(2, 10, Phase::Invoke, 5, 1),
            write(2, 20, Phase::Ok, 5, 1),
            write(1, 30, Phase::Invoke, 4, 2),
            write(1, 40, Phase::Ok, 4, 2),
        ]);
        let v = fenced_order(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].checker, Checker::FencedOrder);
        assert_eq!(v[0].events, [h[1].clone(), h[3].clone()]);
        // Resource-side log (no invokes): same verdict.
        let h = vec![write(0, 20, Phase::Ok, 5, 1), write(0, 40, Phase::Ok, 4, 2)];
        assert_eq!(fenced_order(&h).len(), 1);
    }

    #[test]
    fn c2_ignores_concurrent_writes_and_rejected_ones() {
        // Token 4's write was invoked before token 5's completed: concurrent,
        // the resource may have applied 4 first. A rejected stale write is fine.
        let h = sorted(vec![
            write(1, 10, Phase::Invoke, 4, 1),
            write(2, 15, Phase::Invoke, 5, 2),
            write(2, 20, Phase::Ok, 5, 2),
            write(1, 30, Phase::Ok, 4, 1),
            write(1, 40, Phase::Invoke, 4, 3),
            write(1, 50, Phase::Fail, 4, 3).with_error("stale token"),
        ]);
        assert_eq!(fenced_order(&h), []);
    }

    #[test]
    fn c3_flags_lost_and_phantom_writes() {
        let h = good_history();
        let v = lost_writes(&h, &[10, 21, 99]);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().all(|v| v.checker == Checker::LostWrites));
        assert_eq!(v[0].events[0].value, Some(20));
        assert!(v[0].explanation.contains("missing"));
        assert_eq!(v[1].events, []);
        assert!(v[1].explanation.contains("99"));
    }

    #[test]
    fn c4_flags_decreasing_and_duplicate_tokens() {
        let h = sorted(vec![
            ev(1, 0, Op::Acquire, Phase::Invoke),
            acquire_ok(1, 10, 5, "a", 20),
            ev(2, 30, Op::Acquire, Phase::Invoke),
            acquire_ok(2, 40, 4, "b", 50),
        ]);
        let v = tokens_increase(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].checker, Checker::TokensIncrease);
        assert_eq!(v[0].events, [h[1].clone(), h[3].clone()]);

        // Sequential equal tokens: reported once.
        let h = vec![acquire_ok(1, 10, 5, "a", 20), acquire_ok(2, 40, 5, "b", 50)];
        assert_eq!(tokens_increase(&h).len(), 1);

        // Concurrent acquires may complete in any order, but not share a token.
        let concurrent = |second: u64| {
            sorted(vec![
                ev(1, 0, Op::Acquire, Phase::Invoke),
                ev(2, 1, Op::Acquire, Phase::Invoke),
                acquire_ok(2, 10, 6, "b", 20),
                acquire_ok(1, 11, second, "a", 20),
            ])
        };
        assert_eq!(tokens_increase(&concurrent(5)), []);
        let v = tokens_increase(&concurrent(6));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].explanation.contains("twice"));
    }

    #[test]
    fn c5_flags_release_or_extend_of_a_foreign_key() {
        let h = sorted(vec![
            ev(1, 10, Op::Release, Phase::Ok)
                .with_owner("a")
                .with_touched_owner("b"),
            ev(1, 20, Op::Extend, Phase::Info)
                .with_owner("a")
                .with_touched_owner("c"),
            ev(1, 30, Op::Release, Phase::Ok)
                .with_owner("a")
                .with_touched_owner("a"),
            ev(1, 40, Op::Release, Phase::Ok).with_touched_owner("a"),
        ]);
        let v = foreign_touch(&h);
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v.iter().all(|v| v.checker == Checker::ForeignTouch));
        assert_eq!(v[0].events, [h[0].clone()]);
        assert_eq!(v[1].events, [h[1].clone()]);
        assert!(v[2].explanation.starts_with("malformed:"));
    }

    #[test]
    fn c6_flags_late_or_missing_acquire() {
        let h = good_history();
        // Killed at 200; first acquire ok at 310: 110 ns later.
        let v = availability(&h, 200, Duration::from_nanos(109));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].checker, Checker::Availability);
        assert_eq!(v[0].events[0].time_ns, 310);
        let v = availability(&h, 311, Duration::from_secs(1));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].events, []);
    }

    #[test]
    fn violations_display_on_one_line() {
        let h = vec![acquire_ok(1, 10, 5, "a", 20), acquire_ok(2, 40, 4, "b", 50)];
        let text = tokens_increase(&h)[0].to_string();
        assert!(text.starts_with("C4 tokens_increase: token 4"), "{text}");
        assert!(text.contains("p2@40 Acquire Ok token=4"), "{text}");
        assert!(!text.contains('\n'));
    }
}
