//! The acquire engine: attempts, waiting for a release, and the clean-up an acquire owes
//! when it ends without the lock.
//!
//! The first attempt goes out at once, so an uncontended acquire costs one round trip. A
//! waiting acquire that finds the lock held becomes a [`Waiter`]: it subscribes to the
//! lock's release channel on every node and then tries again, so the refusal it waits on
//! came after the subscription and no release after it can go unnoticed. (A fair waiter
//! whose channels another waiter of its client keeps open joins them before its first
//! attempt instead, at no cost, and needs no second one.) Between
//! attempts it sleeps until a release notification or the pause [`next_pause`] chose,
//! which is never longer than the holder's remaining lease as Redis reported it:
//! pub/sub is never trusted alone.
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
//! lock (a grant whose reply was lost, a place in a fair queue) is withdrawn before it
//! returns, or in the background if its future is dropped ([`Pending`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::select_all;
use tracing::Instrument;

use crate::algorithms::retry::Retry;
use crate::backend::quorum::lease_end;
use crate::backend::subscriber::{Handover, Subscription, next_waiter_id};
use crate::backend::{AcquireCalls, AcquireRequest, Attempt, Backend, Listing, Mode, Undo};
use crate::error::{Blocker, Error, NodeList, NodeOutcome, NodeReport, UnavailableReason};
use crate::keys::LockKeys;
use crate::observe::{self, AcquireOutcome, ModeLabel, WokenBy};
use crate::shared::{Shared, Withdrawn};
use crate::token::{FencingToken, HolderToken};

/// What to acquire, and how long to wait for it.
pub(crate) struct Request<'a> {
    pub name: &'a str,
    pub keys: LockKeys,
    pub mode: Mode,
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

/// A lock that was granted.
pub(crate) struct Granted {
    pub keys: LockKeys,
    pub token: HolderToken,
    pub mode: Mode,
    pub fence: FencingToken,
    /// When the request that got the grant was sent (for a handover: the last attempt
    /// Redis refused, which came before it).
    pub sent_at: Instant,
    /// The lease the grant set (the request's TTL, or a handover's shorter one).
    pub ttl: Duration,
    pub valid_until: Instant,
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
pub(crate) async fn acquire(shared: &Arc<Shared>, req: Request<'_>) -> Result<Granted, Error> {
    let waits = req.wait != Some(Duration::ZERO);
    let span = tracing::debug_span!(
        "acquire",
        lock = req.name,
        mode = req.mode.label().as_str(),
        waits,
        outcome = tracing::field::Empty,
        fencing_token = tracing::field::Empty,
        elapsed_ms = tracing::field::Empty,
    );
    let mut report = Report {
        mode: req.mode.label(),
        started: Instant::now(),
        span,
        attempts: 0,
        waiting_since: None,
        contended: false,
        done: false,
    };
    let span = report.span.clone();
    let result = attempts(shared, req, waits, &mut report)
        .instrument(span)
        .await;
    report.finish(&result);
    result
}

/// The attempts of one acquire, until its outcome.
async fn attempts(
    shared: &Arc<Shared>,
    req: Request<'_>,
    waits: bool,
    report: &mut Report,
) -> Result<Granted, Error> {
    let started = report.started;
    let deadline = req.wait.map(|w| started + w);
    let fair_timeout = match req.mode {
        Mode::Fair { waiter_timeout }
        | Mode::Semaphore {
            fair: Some(waiter_timeout),
            ..
        } => Some(waiter_timeout),
        _ => None,
    };
    let mut pending = Pending {
        shared: shared.clone(),
        keys: req.keys,
        token: HolderToken::generate(),
        mode: req.mode,
        ttl: req.ttl,
        maybe_written: false,
        queued: false,
        listed: false,
    };
    let backend = &shared.backend;
    let mut waiter: Option<Waiter> = None;
    let mut attempt: u32 = 0;
    // Whether an attempt that went out got no definite answer (a timeout, a dropped
    // connection): its write may still land, so it must be withdrawn at the end.
    let mut unanswered = false;
    // Whether a Redlock attempt's take-back may have been lost on a node that did not
    // answer in time (the driver drops a request that times out before it is written):
    // the acquire's last withdrawal, which is sent again if need be, covers it.
    let mut taken_back_unheard = false;
    // The last attempt Redis answered "not yours" (fair mode): when it was sent, and the
    // fencing counter it reported. A handover minted a higher token than that counter
    // only if it came after that answer, so its lease started after that send; one
    // with a lower token is older (its message read late) and is not trusted.
    let mut refused: Option<(Instant, Option<FencingToken>)> = None;
    let calls = AcquireCalls::default();
    loop {
        // A fair waiter joins before its first attempt when that costs no round trip
        // (other waiters of this client keep its channels open): a refusal then needs no
        // second attempt to cover a release between it and the join.
        if waits && waiter.is_none() && attempt == 0 {
            waiter = Waiter::join_if_open(backend, &pending).await;
        }
        // Until this attempt is answered, its outcome is unknown too.
        pending.maybe_written = true;
        let sent = Instant::now();
        // The wakes this attempt answers (see `Waiter::settle`).
        let marks = waiter.as_ref().map(Waiter::marks);
        let listing = waiter.as_mut().and_then(|w| w.listing(backend, &pending));
        // Until this attempt is answered, it may have listed the client, so an acquire
        // dropped meanwhile takes the client off the list too.
        pending.listed |= matches!(pending.mode, Mode::Plain) && listing.is_some();
        report.attempts = attempt.saturating_add(1);
        let outcome = backend
            .acquire(&AcquireRequest {
                name: req.name,
                keys: &pending.keys,
                token: &pending.token,
                ttl: req.ttl,
                mode: &pending.mode,
                join: waits,
                info: req.info,
                // A place among waiting writers: taken by a refusal that said so, or
                // maybe by an attempt that was not answered.
                queued: pending.queued || (waits && unanswered),
                listing,
                calls: &calls,
            })
            .await;
        let found = match outcome {
            Ok(Attempt::Acquired {
                fence,
                sent_at,
                valid_until,
                owner_hold,
            }) => {
                if owner_hold && let Mode::Read { owner } = &pending.mode {
                    // The read side of the owner's write lock: one more hold of it.
                    pending.mode = Mode::Reentrant {
                        owner: owner.clone(),
                    };
                }
                if let (Some(w), Some(marks)) = (&waiter, &marks) {
                    w.settle(marks);
                }
                if req.replicas > 0 {
                    // The grant counts only once enough replicas have it: a failover
                    // before that could lose it.
                    let acked = backend
                        .wait_replicas(&pending.keys.lock, req.replicas, replica_wait(req.ttl))
                        .await;
                    if !matches!(acked, Ok((n, _)) if n >= req.replicas) {
                        // Another attempt may follow, with the same token.
                        pending.withdraw(Undo::TakeBack).await;
                        match acked {
                            Ok((acknowledged, within)) => {
                                return Err(Error::Unreplicated {
                                    name: req.name.to_owned(),
                                    wanted: req.replicas,
                                    acknowledged,
                                    within,
                                });
                            }
                            // The master went away before it said (a failover under
                            // way): a waiting acquire tries again, as after any attempt
                            // that found a node unreachable.
                            Err(e @ Error::Unavailable { reason, .. })
                                if reason != UnavailableReason::Tls
                                    && waits
                                    && deadline.is_none_or(|d| Instant::now() < d) =>
                            {
                                report.waiting_since.get_or_insert_with(Instant::now);
                                tracing::debug!(attempt = attempt + 1, error = %e, "no answer from the replicas' master; retrying");
                                Found::Unreachable
                            }
                            Err(e) => return Err(e),
                        }
                    } else {
                        return Ok(pending.granted(fence, sent_at, req.ttl, valid_until));
                    }
                } else {
                    return Ok(pending.granted(fence, sent_at, req.ttl, valid_until));
                }
            }
            Ok(Attempt::Held {
                blocked_by,
                nodes,
                fence_seen,
            }) => {
                // A definite answer (a failed Redlock quorum was already taken back
                // everywhere); only an earlier unanswered attempt is still a maybe.
                taken_back_unheard |= any_timed_out(&nodes);
                pending.maybe_written = unanswered || taken_back_unheard;
                refused = Some((sent, fence_seen));
                report.held(waits, attempt, blocked_by, &nodes);
                // The lock is someone else's: their release will wake a waiter. An
                // attempt that failed on an error settles nothing, so if this wait ends
                // on that error the wake passes to the next waiter.
                if let (Some(w), Some(marks)) = (&waiter, &marks) {
                    w.settle(marks);
                }
                // A place in line to take back if this acquire ends without the lock: in
                // a fair queue, or among a read-write lock's waiting writers.
                pending.queued |= waits
                    && (fair_timeout.is_some() || matches!(blocked_by, Blocker::Readers { .. }));
                if waits && waiter.is_none() {
                    waiter = Some(Waiter::join(backend, &pending).await);
                    attempt = attempt.saturating_add(1);
                    continue;
                }
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    pending.withdraw(Undo::Withdraw).await;
                    return Err(Error::Held {
                        name: req.name.to_owned(),
                        blocked_by,
                        waited: if waits { now - started } else { Duration::ZERO },
                        nodes,
                    });
                }
                Found::Held(blocked_by)
            }
            // A certificate problem is configuration: waiting will not fix it.
            Err(
                e @ Error::Unavailable {
                    reason: UnavailableReason::Tls,
                    ..
                },
            ) => {
                pending.withdraw(Undo::Withdraw).await;
                return Err(e);
            }
            Err(e @ (Error::Unavailable { .. } | Error::NoQuorum { .. })) => {
                // One node's Unavailable leaves the outcome unknown, unless the attempt
                // was not sent (a stalled node); a failed quorum was taken back
                // everywhere already.
                unanswered |= matches!(e, Error::Unavailable { reason, .. } if reason != UnavailableReason::Stalled);
                taken_back_unheard |=
                    matches!(&e, Error::NoQuorum { nodes, .. } if any_timed_out(nodes));
                pending.maybe_written = unanswered || taken_back_unheard;
                if !waits || deadline.is_some_and(|d| Instant::now() >= d) {
                    pending.withdraw(Undo::Withdraw).await;
                    return Err(e);
                }
                report.waiting_since.get_or_insert_with(Instant::now);
                tracing::debug!(attempt = attempt + 1, error = %e, "acquire attempt failed; retrying");
                Found::Unreachable
            }
            Err(e) => {
                pending.withdraw(Undo::Withdraw).await;
                return Err(e);
            }
        };
        // A writer waiting for readers is registered for one lease from each attempt.
        let keep_place = match found {
            Found::Held(Blocker::Readers { .. }) => Some(req.ttl / 3),
            _ => fair_timeout.map(|t| t / 3),
        };
        let pause = next_pause(Pause {
            found,
            backoff: req.retry.delay(attempt),
            keep_place,
            notified_everywhere: waiter.as_ref().is_some_and(|w| w.everywhere),
            left: deadline.map(|d| d.saturating_duration_since(Instant::now())),
        });
        let woken_by = match &waiter {
            Some(w) => w.wait(pause).await,
            None => {
                tokio::time::sleep(pause).await;
                WokenBy::Timer
            }
        };
        observe::woken(woken_by);
        tracing::trace!(by = woken_by.as_str(), "woken");
        let handover = waiter.as_ref().and_then(Waiter::handover);
        if let (Some(h), Some((refused_at, Some(seen)))) = (handover, refused)
            && h.fence > seen.get()
        {
            let ttl = Duration::from_millis(h.px);
            let valid_until = lease_end(refused_at, ttl);
            // Taken as it is if the lease is the one asked for, or the watchdog will
            // renew it to that; with replicas asked for, the next attempt confirms it
            // and waits for them, as it does when the reply says the key is ours.
            if req.replicas == 0 && (ttl >= req.ttl || req.renew) && valid_until > Instant::now() {
                tracing::trace!(
                    fence = h.fence,
                    lease_ms = h.px,
                    "handed the lock by the release"
                );
                return Ok(pending.granted(
                    FencingToken::new(h.fence),
                    refused_at,
                    ttl,
                    valid_until,
                ));
            }
        }
        attempt = attempt.saturating_add(1);
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
    /// Attempt number `attempt` (from 0) found the lock held.
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
            tracing::trace!(attempt = attempt + 1, %blocked_by, "lock still held");
        }
    }

    /// The acquire ended with `result`.
    fn finish(&mut self, result: &Result<Granted, Error>) {
        self.done = true;
        self.report(
            AcquireOutcome::of(result),
            result.as_ref().err(),
            result.as_ref().ok(),
        );
    }

    fn report(&self, outcome: AcquireOutcome, error: Option<&Error>, granted: Option<&Granted>) {
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
                span.record("fencing_token", g.fence.get());
                tracing::debug!(
                    outcome,
                    fencing_token = g.fence.get(),
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
        Found::Held(blocker) => match blocker.remaining() {
            Some(left) if !left.is_zero() => left + Duration::from_millis(1),
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
    /// key free (one process, 8 tasks on one key: without it, a third fewer attempts
    /// but 40% fewer acquisitions per second, the wakes' round trips coming one by one).
    async fn join_if_open(backend: &Backend, pending: &Pending) -> Option<Self> {
        let Mode::Fair { .. } = pending.mode else {
            return None;
        };
        let open = backend.subscribed_everywhere(&pending.keys.channel())
            && backend.subscribed_everywhere(&backend.own_channel(&pending.keys));
        if open {
            Some(Self::join(backend, pending).await)
        } else {
            None
        }
    }

    /// Subscribes on every node; a node whose subscription fails is left to the lease
    /// bound.
    async fn join(backend: &Backend, pending: &Pending) -> Self {
        let channel = pending.keys.channel();
        // One place in line on every node.
        let id = next_waiter_id();
        let wake = pending.mode.wake(&pending.token);
        // A fair waiter also listens on its client's own channel, where the release that
        // hands it the lock says so (only that client hears it); a plain waiter, where
        // a release that woke its client by name says so.
        let own = match pending.mode {
            Mode::Fair { .. } | Mode::Plain => Some(backend.own_channel(&pending.keys)),
            _ => None,
        };
        let (mut subscriptions, own) =
            futures_util::future::join(backend.subscribe(&channel, id, wake), async {
                match &own {
                    Some(own) => backend.subscribe(own, id, wake).await,
                    None => Vec::new(),
                }
            })
            .await;
        let everywhere = subscriptions.len() == backend.nodes().len();
        let named = matches!(pending.mode, Mode::Plain) && own.len() == backend.nodes().len();
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
    /// other plain waiters of the client wait for the lock too; a waiting reader or
    /// reentrant owner lists `*` when a plain holder refuses it (whose release then
    /// wakes every client, these waiters among them). `None`: not listed.
    ///
    /// A plain waiter woken by name since its last attempt goes back to the head of the
    /// list if refused (another caller took the free lock first).
    fn listing<'a>(&mut self, backend: &'a Backend, pending: &Pending) -> Option<Listing<'a>> {
        let tag = backend.client_tag();
        match pending.mode {
            Mode::Plain if self.named => {
                let named: u64 = self.subscriptions[self.own_from..]
                    .iter()
                    .map(Subscription::wake_mark)
                    .sum();
                let front = named > self.named_seen;
                self.named_seen = named;
                Some(Listing {
                    tag,
                    margin: LISTING_MARGIN,
                    stays: backend.plain_waiters(&backend.own_channel(&pending.keys)) > 1,
                    front,
                })
            }
            Mode::Read { .. } | Mode::Reentrant { .. } => Some(Listing {
                tag,
                margin: LISTING_MARGIN,
                stays: false,
                front: false,
            }),
            _ => None,
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

/// An acquire in progress. If it ends without the lock, it may have left something in
/// Redis: a grant whose reply was lost (timeout, cancellation), or a place in a fair
/// queue. It withdraws both: before the acquire returns, or in the background if the
/// acquire's future is dropped.
struct Pending {
    shared: Arc<Shared>,
    keys: LockKeys,
    token: HolderToken,
    mode: Mode,
    ttl: Duration,
    maybe_written: bool,
    queued: bool,
    /// A plain waiter's attempt listed its client on the lock's wake list (or, not yet
    /// answered, may have), and no grant took it off: when the acquire ends without the
    /// lock, its client leaves the list unless another of its waiters waits for it.
    listed: bool,
}

impl Pending {
    fn owes_cleanup(&self) -> bool {
        self.maybe_written || self.queued
    }

    /// The grant: nothing is owed any more.
    fn granted(
        mut self,
        fence: FencingToken,
        sent_at: Instant,
        ttl: Duration,
        valid_until: Instant,
    ) -> Granted {
        self.maybe_written = false;
        self.queued = false;
        self.listed = false;
        // Nothing is owed, so the drop needs none of them.
        let token = std::mem::replace(&mut self.token, HolderToken::from_stored(String::new()));
        Granted {
            keys: LockKeys {
                lock: std::mem::take(&mut self.keys.lock),
            },
            token,
            mode: self.mode.clone(),
            fence,
            sent_at,
            ttl,
            valid_until,
        }
    }

    /// Withdraws what the acquire may have written, now, so the caller's error comes
    /// after the cleanup; on failure (or if this future is dropped) the drop retries in
    /// the background. `undo`: [`Undo::Withdraw`] when the acquire ends,
    /// [`Undo::TakeBack`] when it may try again with the same token.
    async fn withdraw(&mut self, undo: Undo) {
        if !self.owes_cleanup() {
            return;
        }
        let backend = &self.shared.backend;
        match backend
            .abandon(&self.keys, &self.token, &self.mode, self.ttl, 0, undo)
            .await
        {
            Ok(()) => {
                self.maybe_written = false;
                self.queued = false;
            }
            Err(e) => {
                tracing::debug!(error = %e, "withdrawing an acquire failed; retrying in the background");
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.listed {
            self.shared.unlist_in_background(&self.keys);
        }
        if self.owes_cleanup() {
            self.shared.abandon_in_background(
                Withdrawn::Acquire,
                &self.keys,
                &self.token,
                &self.mode,
                self.ttl,
                0,
            );
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
