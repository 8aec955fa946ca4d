//! The acquire engine: a state machine of attempts, waits for a release, and the
//! clean-up an acquire owes when it ends without the lock.
//!
//! ```text
//!              ┌───────────── woken, or the pause ran out ──────────────┐
//!              v                                                        │
//!   ──> Attempt ── granted ──> [Replicas] ── acknowledged ──> Done(granted)
//!        │ ^  │                  ├── master unreachable, waiting ──> Wait
//!        │ │  │                  └── too few, or an error ──> GaveUp(error)
//!        │ │  ├── held, first refusal of a waiting acquire: subscribe ─┘ (to Attempt)
//!        │ │  ├── held ──────────> Wait ──── handed over ──> Done(granted)
//!        │ │  ├── held, wait over ─────> Done(Held)
//!        │ │  ├── unreachable (a node timed out, a quorum failed) ──> Wait,
//!        │ │  │                     or Done(error) once the wait is over
//!        │ │  └── failed (anything else) ──> Done(error)
//!        └─┴── Wait ──> Attempt
//! ```
//!
//! The first attempt goes out at once, so an uncontended acquire costs one round trip. A
//! waiting acquire that finds the lock held becomes a [`Waiter`]: it subscribes to the
//! lock's release channel on every node and then tries again, so the refusal it waits on
//! came after the subscription and no release after it can go unnoticed. (A fair waiter
//! whose channels another waiter of its client keeps open joins them before its first
//! attempt instead, at no cost, and needs no second one.) Between attempts it sleeps
//! until a release notification or the pause [`next_pause`] chose, which is never longer
//! than the holder's remaining lease as Redis reported it: pub/sub is never trusted
//! alone.
//!
//! A fair waiter may get the lock without an attempt of its own: the release that ends
//! its predecessor's hold hands the lock to the head of the queue inside its script and
//! says so in its message ([`Handover`]). The waiter then counts its lease from the
//! send time of its last attempt that Redis refused (the handover came after that
//! refusal), so the lease it reports never outlasts the one Redis keeps.
//!
//! Every attempt of one acquire uses the same holder token, so an attempt whose reply was
//! lost and a later attempt that finds the token in Redis resolve to one grant with one
//! fencing token. Whatever an acquire may have left in Redis when it ends without the
//! lock ([`Owed`]: a grant whose reply was lost, a place in a queue, its client on the
//! wake list) is withdrawn before it returns, or in the background if its future is
//! dropped ([`Pending`]). Two things go to the background even so: the backup of a
//! Redlock take-back already sent to nodes that did not answer (waiting for them again
//! would only delay the error), and what a failed take-back after too few replicas left
//! ([`Step::GaveUp`]); the wake list's listing always does.
//!
//! The engine talks to the nodes through [`Nodes`] only, and to the primitive through
//! its [`Protocol`]: it runs against a scripted fake in its tests.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_all;
// The engine's own clock: Tokio's, which its tests pause and advance (without Tokio's
// test-util, exactly `std::time::Instant`). What it hands over is `std`'s: with time
// paused by a user's test-util build, a handover's lease end is converted from the
// paused clock, and may lie later than the real one.
use tokio::time::Instant;
use tracing::Instrument;

use super::nodes::Nodes;
use super::protocol::{Listed, Protocol};
use super::retry::Retry;
use super::{Grant, Outcome, Refusal};
use crate::backend::subscriber::{Handover, Subscription, next_waiter_id};
use crate::backend::{AcquireCalls, AcquireRequest, Listing, Undo};
use crate::error::{Blocker, Error, NodeList, NodeOutcome, NodeReport, UnavailableReason};
use crate::keys::LockKeys;
use crate::observe::{self, AcquireOutcome, ModeLabel, WokenBy};
use crate::token::{FencingToken, HolderToken};

/// What to acquire, and how long to wait for it.
pub(crate) struct Request<'a> {
    pub name: &'a str,
    pub keys: LockKeys,
    pub protocol: Arc<dyn Protocol>,
    /// The TTL each attempt asks for.
    pub ttl: Duration,
    /// `None`: wait for ever; zero: one attempt.
    pub wait: Option<Duration>,
    pub retry: Retry,
    /// What the holder says about itself ("" for nothing).
    pub info: &'a str,
    /// Replicas that must acknowledge a grant (0: none asked for).
    pub replicas: u32,
    /// Whether the watchdog renews the lease: a handover that gives a shorter lease
    /// than `ttl` (bounded by the waiter's deadline) is taken as it is only then.
    pub renew: bool,
}

/// A lock that was granted: its keys, the holder token that holds it, the protocol it
/// is held under (a reader's grant may be its owner's write lock's), and the grant.
#[derive(Debug)]
pub(crate) struct Acquired {
    pub keys: LockKeys,
    pub token: HolderToken,
    pub protocol: Arc<dyn Protocol>,
    pub grant: Grant,
}

/// Takes the lock as `req` says, inside an `acquire` span, and reports the outcome
/// (tracing event and metrics, see [`observe`](crate::observe)).
///
/// Errors: [`Error::Held`] when the wait ran out (at once with a zero wait), an
/// unreachable node's error when the wait ran out while it was unreachable, and any
/// other error at once.
///
/// Cancel safety: dropping the future withdraws in the background whatever it may have
/// written ([`Pending`]), and reports the acquire as cancelled.
pub(crate) async fn acquire<N: Nodes>(nodes: &N, req: Request<'_>) -> Result<Acquired, Error> {
    let waits = req.wait != Some(Duration::ZERO);
    let span = tracing::debug_span!(
        "acquire",
        lock = req.name,
        mode = req.protocol.label().as_str(),
        waits,
        outcome = tracing::field::Empty,
        fencing_token = tracing::field::Empty,
        elapsed_ms = tracing::field::Empty,
    );
    let mut report = Report::new(req.protocol.label(), span.clone());
    let result = Acquiring::new(nodes, req, waits, &mut report)
        .run()
        .instrument(span)
        .await;
    report.finish(&result);
    result
}

/// Where an acquire stands.
enum Step {
    /// Send an attempt.
    Attempt,
    /// Granted; the replicas asked for must acknowledge it.
    Replicas(Grant),
    /// Wait for a release, or for the pause [`next_pause`] gives what the last attempt
    /// found.
    Wait(Found),
    /// The outcome; an error once whatever is owed was withdrawn (but for a take-back
    /// already sent: its backup goes in the background).
    Done(Result<Acquired, Error>),
    /// An error at once, whatever is still owed withdrawn in the background: the grant
    /// was taken back already, and a take-back that failed is not tried twice in front
    /// of the caller.
    GaveUp(Error),
}

/// One acquire on its way: its state between steps.
struct Acquiring<'a, N: Nodes> {
    nodes: &'a N,
    name: &'a str,
    info: &'a str,
    ttl: Duration,
    retry: Retry,
    replicas: u32,
    renew: bool,
    waits: bool,
    started: Instant,
    /// `None`: waits for ever.
    deadline: Option<Instant>,
    pending: Pending<'a, N>,
    waiter: Option<Waiter>,
    /// Attempts sent so far.
    attempt: u32,
    /// The last attempt Redis answered "not yours" (fair mode): when it was sent, and the
    /// fencing counter it reported. A handover minted a higher token than that counter
    /// only if it came after that answer, so its lease started after that send; one
    /// with a lower token is older (its message read late) and is not trusted.
    refused: Option<(Instant, Option<FencingToken>)>,
    calls: AcquireCalls,
    report: &'a mut Report,
    /// A multi-lock: which of its names the last refusal named ([`Protocol::name_at`]).
    held_at: Option<usize>,
}

impl<'a, N: Nodes> Acquiring<'a, N> {
    fn new(nodes: &'a N, req: Request<'a>, waits: bool, report: &'a mut Report) -> Self {
        let started = report.started;
        Self {
            nodes,
            name: req.name,
            info: req.info,
            ttl: req.ttl,
            retry: req.retry,
            replicas: req.replicas,
            renew: req.renew,
            waits,
            started,
            deadline: req.wait.map(|w| started + w),
            pending: Pending {
                nodes,
                keys: req.keys,
                token: HolderToken::generate(),
                protocol: req.protocol,
                ttl: req.ttl,
                owed: Owed::default(),
            },
            waiter: None,
            attempt: 0,
            refused: None,
            calls: AcquireCalls::default(),
            report,
            held_at: None,
        }
    }

    /// Runs the steps to the outcome; whatever only a withdrawal undoes is withdrawn
    /// before an error (see [`Step`]).
    async fn run(mut self) -> Result<Acquired, Error> {
        let mut step = Step::Attempt;
        loop {
            step = match step {
                Step::Attempt => self.attempt().await,
                Step::Replicas(grant) => self.replicas(grant).await,
                Step::Wait(found) => self.wait(found).await,
                Step::Done(Ok(granted)) => return Ok(granted),
                Step::GaveUp(e) => return Err(e),
                Step::Done(Err(e)) => {
                    // A take-back that nodes did not answer in time was sent; the
                    // withdrawal that backs it up goes in the background (the drop), so
                    // that nodes that are down do not hold up the caller once more.
                    if self.pending.owed.waits_for_withdrawal() {
                        self.pending.withdraw(Undo::Withdraw).await;
                    }
                    return Err(e);
                }
            };
        }
    }

    /// Sends one attempt and takes the transition its answer calls for.
    async fn attempt(&mut self) -> Step {
        // A fair waiter joins before its first attempt when that costs no round trip
        // (other waiters of this client keep its channels open): a refusal then needs no
        // second attempt to cover a release between it and the join.
        if self.waits && self.waiter.is_none() && self.attempt == 0 {
            self.waiter = Waiter::join_if_open(self.nodes, &self.pending).await;
        }
        let sent = Instant::now();
        // The wakes this attempt answers (see `Waiter::settle`).
        let marks = self.waiter.as_ref().map(Waiter::marks);
        let listing = self
            .waiter
            .as_mut()
            .and_then(|w| w.listing(self.nodes, &self.pending));
        self.pending
            .owed
            .sending(listing.is_some_and(|l| l.by_name()));
        self.attempt = self.attempt.saturating_add(1);
        self.report.attempts = self.attempt;
        let outcome = self
            .nodes
            .acquire(&AcquireRequest {
                name: self.name,
                keys: &self.pending.keys,
                token: &self.pending.token,
                ttl: self.ttl,
                protocol: &*self.pending.protocol,
                join: self.waits,
                info: self.info,
                // A place among waiting writers: taken by a refusal that said so, or
                // maybe by an attempt that was not answered.
                queued: self.pending.owed.queued || (self.waits && self.pending.owed.unanswered),
                listing,
                calls: &self.calls,
            })
            .await;
        // Answered: the wakes read before it are used, whatever it found, except an
        // attempt that failed on an error (if the wait ends on that error, the wake passes
        // on to the next waiter).
        if let (Some(w), Some(marks), Ok(_)) = (&self.waiter, &marks, &outcome) {
            w.settle(marks);
        }
        match outcome {
            Ok(Outcome::Granted { grant, owner_hold }) => self.granted(grant, owner_hold),
            Ok(Outcome::Held { refusal, nodes }) => {
                let Refusal {
                    blocked_by,
                    fence_seen,
                    at,
                } = refusal;
                self.held_at = at;
                self.held(sent, blocked_by, nodes, fence_seen).await
            }
            Err(e) => self.failed(e),
        }
    }

    /// Transition *granted*: the lock is ours, once the replicas asked for have it.
    fn granted(&mut self, grant: Grant, owner_hold: bool) -> Step {
        if owner_hold && let Some(hold) = self.pending.protocol.owner_hold() {
            // The read side of the owner's write lock: one more hold of it.
            self.pending.protocol = hold;
        }
        if self.replicas > 0 {
            Step::Replicas(grant)
        } else {
            Step::Done(Ok(self.pending.granted(grant)))
        }
    }

    /// The grant counts only once enough replicas have it: a failover before that could
    /// lose it. Too few: taken back (another attempt may follow, with the same token).
    async fn replicas(&mut self, grant: Grant) -> Step {
        let acked = self
            .nodes
            .wait_replicas(
                &self.pending.keys.lock,
                self.replicas,
                replica_wait(self.ttl),
            )
            .await;
        if matches!(acked, Ok((n, _)) if n >= self.replicas) {
            return Step::Done(Ok(self.pending.granted(grant)));
        }
        self.pending.withdraw(Undo::TakeBack).await;
        match acked {
            Ok((acknowledged, within)) => Step::GaveUp(Error::Unreplicated {
                name: self.name.to_owned(),
                wanted: self.replicas,
                acknowledged,
                within,
            }),
            // The master went away before it said (a failover under way): a waiting
            // acquire tries again, as after any attempt that found a node unreachable.
            Err(e @ Error::Unavailable { reason, .. })
                if reason != UnavailableReason::Tls
                    && self.waits
                    && self.deadline.is_none_or(|d| Instant::now() < d) =>
            {
                self.report.waiting_since.get_or_insert_with(Instant::now);
                tracing::debug!(attempt = self.attempt, error = %e, "no answer from the replicas' master; retrying");
                Step::Wait(Found::Unreachable)
            }
            Err(e) => Step::GaveUp(e),
        }
    }

    /// Transition *held*: another holder (or a queue ahead) stands in the way. A waiting
    /// acquire subscribes and tries once more, then waits; one whose wait ran out ends.
    async fn held(
        &mut self,
        sent: Instant,
        blocked_by: Blocker,
        nodes: Vec<NodeReport>,
        fence_seen: Option<FencingToken>,
    ) -> Step {
        // A definite answer (a failed Redlock quorum was already taken back everywhere);
        // only an earlier unanswered attempt is still a maybe.
        self.pending.owed.answered(any_timed_out(&nodes));
        self.refused = Some((sent, fence_seen));
        self.report
            .held(self.waits, self.attempt, blocked_by, &nodes);
        // A place in line to take back if this acquire ends without the lock: in a fair
        // queue, or among a read-write lock's waiting writers.
        self.pending.owed.queued |= self.waits
            && (self.pending.protocol.waiting().queue.is_some()
                || matches!(blocked_by, Blocker::Readers { .. }));
        if self.waits && self.waiter.is_none() {
            self.waiter = Some(Waiter::join(self.nodes, &self.pending).await);
            return Step::Attempt;
        }
        let now = Instant::now();
        if self.deadline.is_some_and(|d| now >= d) {
            return Step::Done(Err(self.timed_out(blocked_by, nodes, now)));
        }
        Step::Wait(Found::Held(blocked_by))
    }

    /// Transition *timed out*: the wait ran out with the lock held.
    fn timed_out(&self, blocked_by: Blocker, nodes: Vec<NodeReport>, now: Instant) -> Error {
        Error::Held {
            name: self
                .held_at
                .and_then(|at| self.pending.protocol.name_at(at))
                .unwrap_or(self.name)
                .to_owned(),
            blocked_by,
            waited: if self.waits {
                now - self.started
            } else {
                Duration::ZERO
            },
            nodes,
        }
    }

    /// An attempt that failed: a node that could not be reached is waited out (its
    /// outcome unknown); anything else ends the acquire.
    fn failed(&mut self, e: Error) -> Step {
        match e {
            // A certificate problem is configuration: waiting will not fix it.
            Error::Unavailable {
                reason: UnavailableReason::Tls,
                ..
            } => Step::Done(Err(e)),
            Error::Unavailable { .. } | Error::NoQuorum { .. } => self.unreachable(e),
            e => Step::Done(Err(e)),
        }
    }

    /// Transition *unreachable*: a node did not answer (the attempt's outcome unknown,
    /// unless it was not sent), or the quorum failed (taken back everywhere already). A
    /// waiting acquire waits on until its deadline.
    fn unreachable(&mut self, e: Error) -> Step {
        self.pending.owed.unreachable(&e);
        if !self.waits || self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Step::Done(Err(e));
        }
        self.report.waiting_since.get_or_insert_with(Instant::now);
        tracing::debug!(attempt = self.attempt, error = %e, "acquire attempt failed; retrying");
        Step::Wait(Found::Unreachable)
    }

    /// Sleeps until a release notification or the pause; then the lock if a release
    /// handed it over, else another attempt.
    async fn wait(&mut self, found: Found) -> Step {
        // A writer waiting for readers is registered for one lease from each attempt.
        let keep_place = match found {
            Found::Held(Blocker::Readers { .. }) => Some(self.ttl / 3),
            _ => self.pending.protocol.waiting().queue.map(|t| t / 3),
        };
        let pause = next_pause(Pause {
            found,
            backoff: self.retry.delay(self.attempt.saturating_sub(1)),
            keep_place,
            notified_everywhere: self.waiter.as_ref().is_some_and(|w| w.everywhere),
            left: self
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now())),
        });
        let woken_by = match &self.waiter {
            Some(w) => w.wait(pause).await,
            None => {
                tokio::time::sleep(pause).await;
                WokenBy::Timer
            }
        };
        observe::woken(woken_by);
        tracing::trace!(by = woken_by.as_str(), "woken");
        match self.handed_over() {
            Some(granted) => Step::Done(Ok(granted)),
            None => Step::Attempt,
        }
    }

    /// Transition *handed over*: a fair release gave this waiter the lock after the last
    /// refusal (its token is higher than the counter that refusal saw). Taken as it is if
    /// its lease is the one asked for, or the watchdog will renew it to that; with
    /// replicas asked for, the next attempt confirms it and waits for them, as it does
    /// when the reply says the key is ours.
    fn handed_over(&mut self) -> Option<Acquired> {
        let h = self.waiter.as_ref().and_then(Waiter::handover)?;
        let (refused_at, Some(seen)) = self.refused? else {
            return None;
        };
        if h.fence <= seen.get() {
            return None;
        }
        let ttl = Duration::from_millis(h.px);
        let grant = Grant::new(FencingToken::new(h.fence), refused_at.into_std(), ttl);
        let usable = self.replicas == 0
            && (ttl >= self.ttl || self.renew)
            && grant.valid_until > Instant::now().into_std();
        if !usable {
            return None;
        }
        tracing::trace!(
            fence = h.fence,
            lease_ms = h.px,
            "handed the lock by the release"
        );
        Some(self.pending.granted(grant))
    }
}

/// How much longer than the lease that refused a listed attempt the lock's wake list is
/// kept (`fragments/waiting.lua`): its waiters try again by themselves when that lease
/// ends, and list their clients again if refused; the margin covers their wake-up.
const LISTING_MARGIN: Duration = Duration::from_secs(1);

/// Whether a Redlock node got no answer in time (or none before the verdict).
fn any_timed_out(nodes: &[NodeReport]) -> bool {
    nodes.iter().any(|n| {
        matches!(
            n.outcome,
            NodeOutcome::Unavailable(UnavailableReason::TimedOut)
        )
    })
}

/// How long a grant may wait for its replicas: a tenth of the lease, at most 1 s, at
/// least 10 ms.
fn replica_wait(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// What an acquire that ends without the lock owes Redis: whatever its attempts may have
/// written, and whatever they did write that only a grant would have made good.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Owed {
    /// An attempt is on its way: until it is answered, its grant may land.
    in_flight: bool,
    /// An earlier attempt got no definite answer (a timeout, a dropped connection): its
    /// grant may still land.
    unanswered: bool,
    /// A Redlock take-back may have been lost on a node that did not answer in time
    /// (the driver drops a request that times out before it is written).
    take_back_unheard: bool,
    /// A place in line: in a fair queue, or among a read-write lock's waiting writers.
    queued: bool,
    /// The client is (or, not yet answered, may be) on the lock's wake list.
    listed: bool,
}

impl Owed {
    /// An attempt goes out; `listing`: it lists the client by name if refused.
    fn sending(&mut self, listing: bool) {
        self.in_flight = true;
        self.listed |= listing;
    }

    /// A definite answer came; `take_back_unheard`: a node of a failed quorum did not
    /// hear its take-back.
    fn answered(&mut self, take_back_unheard: bool) {
        self.in_flight = false;
        self.take_back_unheard |= take_back_unheard;
    }

    /// The attempt failed on `e`: one node's unavailability leaves its outcome unknown,
    /// unless it was not sent (a stalled node); a failed quorum was taken back already.
    fn unreachable(&mut self, e: &Error) {
        self.in_flight = false;
        self.unanswered |=
            matches!(e, Error::Unavailable { reason, .. } if *reason != UnavailableReason::Stalled);
        self.take_back_unheard |=
            matches!(e, Error::NoQuorum { nodes, .. } if any_timed_out(nodes));
    }

    /// Whether a withdrawal is owed.
    fn withdrawal(&self) -> bool {
        self.waits_for_withdrawal() || self.take_back_unheard
    }

    /// Whether an acquire that ends without the lock withdraws before it returns: for
    /// what only its withdrawal undoes, not for a take-back already sent.
    fn waits_for_withdrawal(&self) -> bool {
        self.in_flight || self.unanswered || self.queued
    }
}

/// What an acquire tells about itself: its span, and at the end the outcome event and
/// metrics. Dropped before [`finish`](Self::finish) (the acquire's future was dropped),
/// it reports the acquire as cancelled.
struct Report {
    mode: ModeLabel,
    started: Instant,
    span: tracing::Span,
    /// Attempts sent so far.
    attempts: u32,
    /// When an attempt first found the lock held or a node unreachable, and the acquire
    /// waited on.
    waiting_since: Option<Instant>,
    /// Whether an attempt found the lock held.
    contended: bool,
    done: bool,
}

impl Report {
    fn new(mode: ModeLabel, span: tracing::Span) -> Self {
        Self {
            mode,
            started: Instant::now(),
            span,
            attempts: 0,
            waiting_since: None,
            contended: false,
            done: false,
        }
    }

    /// Attempt number `attempt` (from 1) found the lock held.
    fn held(&mut self, waits: bool, attempt: u32, blocked_by: Blocker, nodes: &[NodeReport]) {
        observe::contended(self.mode);
        let first = !self.contended;
        self.contended = true;
        if !waits {
            return;
        }
        if first {
            self.waiting_since.get_or_insert_with(Instant::now);
            if nodes.is_empty() {
                tracing::debug!(%blocked_by, "waiting for the lock to be released");
            } else {
                tracing::debug!(%blocked_by, nodes = %NodeList(nodes), "waiting for the lock to be released");
            }
        } else {
            tracing::trace!(attempt, %blocked_by, "lock still held");
        }
    }

    /// The acquire ended with `result`.
    fn finish(&mut self, result: &Result<Acquired, Error>) {
        self.done = true;
        self.report(
            AcquireOutcome::of(result),
            result.as_ref().err(),
            result.as_ref().ok(),
        );
    }

    fn report(&self, outcome: AcquireOutcome, error: Option<&Error>, granted: Option<&Acquired>) {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.started);
        let waited = self.waiting_since.map(|t| now.saturating_duration_since(t));
        // The lock was held when this acquire first asked, and it got it: handed over.
        let handoff = granted.is_some() && self.contended;
        observe::acquire_ended(self.mode, outcome, elapsed, waited, handoff);
        let span = &self.span;
        span.record("outcome", outcome.as_str());
        span.record("elapsed_ms", observe::ms(elapsed));
        let _in = span.enter();
        let (attempts, elapsed_ms, waited_ms) =
            (self.attempts, observe::ms(elapsed), waited.map(observe::ms));
        let outcome = outcome.as_str();
        match (granted, error) {
            (Some(g), _) => {
                span.record("fencing_token", g.grant.fence.get());
                tracing::debug!(
                    outcome,
                    fencing_token = g.grant.fence.get(),
                    attempts,
                    elapsed_ms,
                    waited_ms,
                    handoff,
                    "lock acquired"
                );
            }
            (
                None,
                Some(Error::Held {
                    blocked_by, nodes, ..
                }),
            ) => {
                if nodes.is_empty() {
                    tracing::debug!(outcome, attempts, elapsed_ms, waited_ms, %blocked_by, "lock not acquired");
                } else {
                    tracing::debug!(outcome, attempts, elapsed_ms, waited_ms, %blocked_by, nodes = %NodeList(nodes), "lock not acquired");
                }
            }
            (None, Some(e)) => {
                tracing::debug!(outcome, attempts, elapsed_ms, waited_ms, error = %e, "lock not acquired");
            }
            (None, None) => {
                tracing::debug!(
                    outcome,
                    attempts,
                    elapsed_ms,
                    waited_ms,
                    "acquire cancelled"
                );
            }
        }
    }
}

impl Drop for Report {
    /// Transition *cancelled*: the acquire's future was dropped.
    fn drop(&mut self) {
        if !self.done {
            self.report(AcquireOutcome::Cancelled, None, None);
        }
    }
}

/// What the last attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// Another holder, or a fair queue, stands in the way.
    Held(Blocker),
    /// A node could not be reached, or the quorum failed.
    Unreachable,
}

/// What decides the pause before the next attempt.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pause {
    pub found: Found,
    /// The retry schedule's pause for this attempt (drawn by the caller).
    pub backoff: Duration,
    /// A waiter with a place in line (fair mode: a third of the waiter timeout; a writer
    /// waiting for readers: a third of its lease): it calls again within this, or
    /// loses the place.
    pub keep_place: Option<Duration>,
    /// Whether release notifications come from every node.
    pub notified_everywhere: bool,
    /// What is left of the caller's wait (`None`: for ever).
    pub left: Option<Duration>,
}

/// The longest a waiter sleeps before its next attempt, if no release notification
/// comes first: what Redis said is left of the lease in the way (the holder's, the first
/// permit's or reader's, a waiting writer's registration: it is gone once that runs
/// out, message or not), else the backoff; at most [`Pause::keep_place`] for a waiter
/// that must call again to keep its place in line; the backoff at most where
/// notifications are missing from a node; never past the caller's wait.
pub(crate) fn next_pause(p: Pause) -> Duration {
    let mut pause = match p.found {
        Found::Held(blocker) => match (blocker.remaining(), p.keep_place) {
            (Some(left), _) if !left.is_zero() => left + Duration::from_millis(1),
            // Free, but others are first in line: its turn comes by message, and it
            // calls again when its place needs keeping (which purges a crashed head).
            (None, Some(keep)) if blocker == Blocker::Queue => keep,
            _ => p.backoff,
        },
        Found::Unreachable => p.backoff,
    };
    if let Found::Held(_) = p.found {
        if let Some(keep) = p.keep_place {
            pause = pause.min(keep);
        }
        if !p.notified_everywhere {
            pause = pause.min(p.backoff);
        }
    }
    match p.left {
        Some(left) => pause.min(left),
        None => pause,
    }
}

/// A waiting acquire's registration for release notifications, on every node with one
/// place in line, and the wakes it has answered.
struct Waiter {
    subscriptions: Vec<Subscription>,
    /// Whether every node's subscription was confirmed.
    everywhere: bool,
    /// A plain waiter whose client's own channel is subscribed on every node: its
    /// attempts list the client on the lock's wake list, and a release wakes it by name.
    named: bool,
    /// Where the own channel's subscriptions start in `subscriptions`.
    own_from: usize,
    /// The wakes by name seen by the last attempt's listing.
    named_seen: u64,
}

impl Waiter {
    /// A fair waiter: joins as [`join`](Self::join) if every channel it listens on is
    /// subscribed already (so it joins without a round trip); `None` otherwise, and for
    /// the other modes. Its turn comes with a handover, which a second attempt right
    /// after joining cannot hasten; a plain waiter's second attempt often finds a busy
    /// key free, so plain waiters keep it (docs/design.md, "Measured choices").
    async fn join_if_open<N: Nodes>(nodes: &N, pending: &Pending<'_, N>) -> Option<Self> {
        let waiting = pending.protocol.waiting();
        // A queue kept in Redis, whose turn comes by message: a fair lock (on the own
        // channel) or a fair semaphore (on the lock's).
        waiting.queue?;
        let open = nodes.subscribed_everywhere(&pending.keys.channel())
            && (!waiting.own_channel
                || nodes.subscribed_everywhere(&nodes.own_channel(&pending.keys)));
        if open {
            Some(Self::join(nodes, pending).await)
        } else {
            None
        }
    }

    /// Subscribes on every node; a node whose subscription fails is left to the lease
    /// bound.
    async fn join<N: Nodes>(nodes: &N, pending: &Pending<'_, N>) -> Self {
        let channel = pending.keys.channel();
        // One place in line on every node.
        let id = next_waiter_id();
        let wake = pending.protocol.wake(&pending.token);
        let waiting = pending.protocol.waiting();
        // A fair waiter also listens on its client's own channel, where the release that
        // hands it the lock says so (only that client hears it); a plain waiter, where
        // a release that woke its client by name says so.
        let own = waiting
            .own_channel
            .then(|| nodes.own_channel(&pending.keys));
        let (mut subscriptions, own) =
            futures_util::future::join(nodes.subscribe(&channel, id, wake), async {
                match &own {
                    Some(own) => nodes.subscribe(own, id, wake).await,
                    None => Vec::new(),
                }
            })
            .await;
        let count = nodes.node_count();
        let everywhere = subscriptions.len() == count;
        let named = waiting.listing == Listed::ByName && own.len() == count;
        let own_from = subscriptions.len();
        subscriptions.extend(own);
        Self {
            subscriptions,
            everywhere,
            named,
            own_from,
            named_seen: 0,
        }
    }

    /// Where this waiter's client stands on the lock's wake list after its next
    /// attempt: a named plain waiter's client is listed if refused, and after a grant if
    /// other plain waiters of the client wait for the lock too; a waiting reader,
    /// reentrant owner or fair waiter lists `*` when a plain holder refuses it (whose
    /// release then wakes every client, these waiters among them), and so does a plain
    /// waiter that is not named (its client's own channel is not subscribed on every
    /// node): a release that finds nobody listed publishes nothing. `None`: not listed.
    ///
    /// A plain waiter woken by name since its last attempt goes back to the head of the
    /// list if refused (another caller took the free lock first).
    fn listing<'n, N: Nodes>(
        &mut self,
        nodes: &'n N,
        pending: &Pending<'_, N>,
    ) -> Option<Listing<'n>> {
        match pending.protocol.waiting().listing {
            Listed::ByName if self.named => {
                let named: u64 = self.subscriptions[self.own_from..]
                    .iter()
                    .map(Subscription::wake_mark)
                    .sum();
                let front = named > self.named_seen;
                self.named_seen = named;
                Some(Listing {
                    tag: nodes.client_tag(),
                    margin: LISTING_MARGIN,
                    stays: nodes.plain_waiters(&nodes.own_channel(&pending.keys)) > 1,
                    front,
                })
            }
            Listed::ByName | Listed::Everyone => Some(Listing {
                tag: Listing::EVERYONE,
                margin: LISTING_MARGIN,
                stays: false,
                front: false,
            }),
            Listed::No => None,
        }
    }

    /// The wakes delivered so far: read them before sending an attempt.
    fn marks(&self) -> Vec<u64> {
        self.subscriptions
            .iter()
            .map(Subscription::wake_mark)
            .collect()
    }

    /// Redis answered an attempt sent after `marks` were read: those wakes are used, and
    /// dropping this waiter no longer passes them on.
    fn settle(&self, marks: &[u64]) {
        for (s, mark) in self.subscriptions.iter().zip(marks) {
            s.settle(*mark);
        }
    }

    /// The lock, if a release handed it to this waiter (fair mode, one node).
    fn handover(&self) -> Option<Handover> {
        self.subscriptions.iter().find_map(Subscription::handover)
    }

    /// Sleeps until a release notification from any node, or `pause`; says which.
    async fn wait(&self, pause: Duration) -> WokenBy {
        if self.subscriptions.is_empty() {
            tokio::time::sleep(pause).await;
            return WokenBy::Timer;
        }
        let any_release = async {
            match self.subscriptions.as_slice() {
                // The usual cases (one node: its channel, and its client's own for plain
                // and fair waiters): no boxes to poll through.
                [one] => one.notified().await,
                [one, two] => {
                    tokio::select! {
                        () = one.notified() => {}
                        () = two.notified() => {}
                    }
                }
                many => {
                    select_all(many.iter().map(|s| Box::pin(s.notified()))).await;
                }
            }
        };
        tokio::select! {
            _ = any_release => WokenBy::Notification,
            () = tokio::time::sleep(pause) => WokenBy::Timer,
        }
    }
}

/// An acquire in progress and what it owes ([`Owed`]): withdrawn before the acquire
/// returns without the lock, or in the background if the acquire's future is dropped.
struct Pending<'a, N: Nodes> {
    nodes: &'a N,
    keys: LockKeys,
    token: HolderToken,
    protocol: Arc<dyn Protocol>,
    ttl: Duration,
    owed: Owed,
}

impl<N: Nodes> Pending<'_, N> {
    /// The grant: nothing is owed any more.
    fn granted(&mut self, grant: Grant) -> Acquired {
        self.owed = Owed::default();
        // Nothing is owed, so the drop needs none of them.
        let token = std::mem::replace(&mut self.token, HolderToken::from_stored(String::new()));
        Acquired {
            keys: LockKeys {
                lock: std::mem::take(&mut self.keys.lock),
            },
            token,
            protocol: self.protocol.clone(),
            grant,
        }
    }

    /// Withdraws what the acquire may have written, now, so the caller's error comes
    /// after the cleanup; on failure (or if this future is dropped) the drop retries in
    /// the background. `undo`: [`Undo::Withdraw`] when the acquire ends,
    /// [`Undo::TakeBack`] when it may try again with the same token.
    async fn withdraw(&mut self, undo: Undo) {
        if !self.owed.withdrawal() {
            return;
        }
        match self
            .nodes
            .abandon(&self.keys, &self.token, &*self.protocol, self.ttl, undo)
            .await
        {
            // A take-back undoes this attempt's grant and place; what earlier attempts
            // may have left is still owed. A withdrawal undoes all of it.
            Ok(()) if undo == Undo::TakeBack => {
                self.owed.in_flight = false;
                self.owed.queued = false;
            }
            // (The wake list's listing is not a withdrawal's: the drop unlists.)
            Ok(()) => {
                self.owed = Owed {
                    listed: self.owed.listed,
                    ..Owed::default()
                };
            }
            Err(e) => {
                tracing::debug!(error = %e, "withdrawing an acquire failed; retrying in the background");
            }
        }
    }
}

impl<N: Nodes> Drop for Pending<'_, N> {
    fn drop(&mut self) {
        if self.owed.listed {
            self.nodes.unlist_in_background(&self.keys);
        }
        if self.owed.withdrawal() {
            self.nodes
                .abandon_in_background(&self.keys, &self.token, &self.protocol, self.ttl);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn pause(found: Found) -> Pause {
        Pause {
            found,
            backoff: 40 * MS,
            keep_place: None,
            notified_everywhere: true,
            left: None,
        }
    }

    #[test]
    fn a_waiter_sleeps_until_the_holders_lease_runs_out_at_most() {
        let held = |ms| Found::Held(Blocker::Lease(ms * MS));
        assert_eq!(next_pause(pause(held(900))), 901 * MS);
        // A lease ending now, a key without expiry, a queue: the backoff.
        assert_eq!(next_pause(pause(held(0))), 40 * MS);
        assert_eq!(next_pause(pause(Found::Held(Blocker::NoExpiry))), 40 * MS);
        assert_eq!(next_pause(pause(Found::Held(Blocker::Queue))), 40 * MS);
        assert_eq!(next_pause(pause(Found::Unreachable)), 40 * MS);
    }

    #[test]
    fn fair_waiters_call_again_within_a_third_of_their_timeout() {
        let p = Pause {
            keep_place: Some(100 * MS),
            ..pause(Found::Held(Blocker::Lease(900 * MS)))
        };
        assert_eq!(next_pause(p), 100 * MS);
    }

    #[test]
    fn a_waiter_in_line_behind_others_waits_for_its_turn_not_the_backoff() {
        // Free, but others are first: its turn comes by message; it calls again only
        // to keep its place. Polling at the backoff made every waiter of a fair
        // semaphore try again after each release.
        let p = Pause {
            keep_place: Some(1000 * MS),
            ..pause(Found::Held(Blocker::Queue))
        };
        assert_eq!(next_pause(p), 1000 * MS);
        // Without notifications from every node, the backoff still bounds it.
        let p = Pause {
            notified_everywhere: false,
            ..p
        };
        assert_eq!(next_pause(p), 40 * MS);
    }

    #[test]
    fn without_notifications_from_every_node_the_backoff_bounds_the_pause() {
        let p = Pause {
            notified_everywhere: false,
            ..pause(Found::Held(Blocker::Lease(900 * MS)))
        };
        assert_eq!(next_pause(p), 40 * MS);
    }

    #[test]
    fn the_pause_never_runs_past_the_callers_wait() {
        let p = Pause {
            left: Some(7 * MS),
            ..pause(Found::Held(Blocker::Lease(900 * MS)))
        };
        assert_eq!(next_pause(p), 7 * MS);
        let p = Pause {
            left: Some(Duration::ZERO),
            ..pause(Found::Unreachable)
        };
        assert_eq!(next_pause(p), Duration::ZERO);
    }
}
