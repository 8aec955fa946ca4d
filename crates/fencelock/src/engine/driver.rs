//! Runs the acquire machine (`acquire.rs`) on the nodes: the machine says what to do
//! next, this does it (sends the attempt its protocol builds, subscribes, sleeps,
//! withdraws) and tells the machine what came of it, until the outcome. One driver for
//! the backend and for the tests' fake ([`Nodes`]); the clock is Tokio's, which those
//! tests pause.
//!
//! It also keeps what the machine has no business knowing: the script calls built so
//! far ([`Calls`]), the waiter's subscriptions, and the acquire's span, events and
//! metrics ([`Report`], see [`observe`](crate::observe)).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::select_all;
use tracing::Instrument;

use super::acquire::{
    Acquired, Acquiring, Attempt, Channels, Cleanup, Command, Event, Request, Site, Subscribe,
    Woken,
};
use super::nodes::{Listener, Nodes};
use super::protocol::Listed;
use super::{Outcome, clock};
use crate::error::{Blocker, Error, NodeList, NodeReport};
use crate::observe::{self, AcquireOutcome, ModeLabel, WokenBy};
use crate::scripts::Call;
use crate::token::HolderToken;

/// Takes the lock as `req` says, inside an `acquire` span, and reports the outcome
/// (tracing event and metrics, see [`observe`](crate::observe)).
///
/// Errors: [`Error::Held`] when the wait ran out (at once with a zero wait), an
/// unreachable node's error when the wait ran out while it was unreachable, and any
/// other error at once.
///
/// Cancel safety: dropping the future withdraws in the background whatever it may have
/// written (the machine's [`cancel`](Acquiring::cancel)), and reports the acquire as
/// cancelled.
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
    let machine = Acquiring::new(req, HolderToken::generate(), rand::random(), clock());
    let mut run = Run {
        nodes,
        machine,
        calls: Calls::default(),
        session: N::Session::default(),
        listeners: Vec::new(),
        own_from: 0,
        own_channel: None,
        listens_at: None,
        done: false,
    };
    let result = run.go(&mut report).instrument(span).await;
    report.finish(&result);
    result
}

/// Waiter ids, increasing in arrival order across every client and node of the process,
/// so one acquire has the same place in line on every node of a Redlock client.
static NEXT_WAITER: AtomicU64 = AtomicU64::new(0);

/// A fresh waiter id: take one per waiting acquire, for all its subscriptions.
pub(crate) fn next_waiter_id() -> u64 {
    NEXT_WAITER.fetch_add(1, Ordering::Relaxed)
}

/// One acquire being driven.
struct Run<'a, N: Nodes> {
    nodes: &'a N,
    machine: Acquiring<'a>,
    calls: Calls,
    session: N::Session,
    /// The waiter's subscriptions: the lock's channel on each node, then (from
    /// `own_from`) its client's own channel of the lock on each node.
    listeners: Vec<N::Listener>,
    own_from: usize,
    /// Its client's own channel of the lock, when subscribed.
    own_channel: Option<String>,
    /// A multi-lock's waiter: the place of the name it listens on.
    listens_at: Option<usize>,
    /// The machine is done: nothing is owed.
    done: bool,
}

impl<N: Nodes> Run<'_, N> {
    /// Carries out the machine's commands until its outcome.
    async fn go(&mut self, report: &mut Report) -> Result<Acquired, Error> {
        let mut command = self.machine.start(clock());
        loop {
            report.follow(&self.machine);
            let event = match command {
                Command::Attempt(attempt) => self.attempt(attempt, report).await,
                Command::Subscribe(subscribe) => Event::Subscribed(self.subscribe(subscribe).await),
                Command::WaitReplicas { replicas, within } => {
                    let key = &self.machine.request().keys.lock;
                    Event::Replicas(self.nodes.wait_replicas(key, replicas, within).await)
                }
                Command::Sleep { until } => Event::Woken(self.sleep(until).await),
                Command::Withdraw(undo) => {
                    let (req, token) = (self.machine.request(), self.machine.token());
                    let withdrawn =
                        self.nodes
                            .withdraw(&req.keys, token, &*req.protocol, req.ttl, undo);
                    Event::Withdrawn(withdrawn.await)
                }
                Command::Done(done) => {
                    self.done = true;
                    self.clean_up(done.cleanup);
                    return done.result;
                }
            };
            command = self.machine.on(event, clock());
        }
    }

    /// Sends one attempt: the call its protocol builds (built once per shape, see
    /// [`Calls`]), to every node.
    async fn attempt(&mut self, attempt: Attempt, report: &mut Report) -> Event {
        // The wakes this attempt answers: once Redis answered it, whatever it found,
        // they are used (an attempt that failed on an error leaves them: if the wait
        // ends on that error, the wake passes on to the next waiter).
        let marks: Vec<u64> = self.listeners.iter().map(Listener::wake_mark).collect();
        let call = self.call(attempt, false);
        let identified = (self.nodes.node_count() > 1).then(|| self.call(attempt, true));
        let (req, token) = (self.machine.request(), self.machine.token());
        let outcome = self
            .nodes
            .attempt(req, token, &call, identified.as_ref(), &mut self.session)
            .await;
        if outcome.is_ok() {
            for (listener, mark) in self.listeners.iter().zip(marks) {
                listener.settle(mark);
            }
        }
        if let Ok(Outcome::Held { refusal, nodes }) = &outcome {
            let waits = self.machine.waits();
            report.held(waits, self.machine.attempts(), refusal.blocked_by, nodes);
        }
        Event::Answered(outcome)
    }

    /// The script call of `attempt` (`identify`: asking the node who it is), as its
    /// protocol builds it with what the nodes add: the client's tag, whether other
    /// waiters of the client keep it listed, the counter's idle time.
    fn call(&mut self, attempt: Attempt, identify: bool) -> Arc<Call> {
        let nodes = self.nodes;
        let stays = attempt.listed == Listed::ByName
            && self
                .own_channel
                .as_deref()
                .is_some_and(|own| nodes.plain_waiters(own) > 1);
        let shape = Shape {
            attempt,
            stays,
            identify,
        };
        let site = Site {
            client_tag: nodes.client_tag(),
            counter_idle: nodes.counter_idle(),
            stays,
        };
        let machine = &self.machine;
        self.calls
            .get(shape, || machine.call(&attempt, &site, identify))
    }

    /// Subscribes the waiter on every node: the lock's channel, and for a protocol that
    /// listens there its client's own channel of the lock (where a fair release hands
    /// it the lock, and a plain release wakes its client by name). A node whose
    /// subscription fails is left to the lease bound. `None` when asked to subscribe
    /// only channels open already and they are not.
    async fn subscribe(&mut self, subscribe: Subscribe) -> Option<Channels> {
        let (nodes, req) = (self.nodes, self.machine.request());
        let keys = listened(req, subscribe.at);
        let channel = keys.channel();
        let own = req
            .protocol
            .waiting()
            .own_channel
            .then(|| nodes.own_channel(keys));
        let open = || {
            nodes.subscribed_everywhere(&channel)
                && own
                    .as_deref()
                    .is_none_or(|own| nodes.subscribed_everywhere(own))
        };
        if subscribe.only_if_open && !open() {
            return None;
        }
        // One place in line on every node.
        let id = next_waiter_id();
        let wake = req.protocol.wake(self.machine.token());
        let (mut listeners, own_listeners) =
            futures_util::future::join(nodes.subscribe(&channel, id, wake), async {
                match &own {
                    Some(own) => nodes.subscribe(own, id, wake).await,
                    None => Vec::new(),
                }
            })
            .await;
        let count = nodes.node_count();
        let channels = Channels {
            everywhere: listeners.len() == count,
            own_everywhere: own_listeners.len() == count,
            named_wakes: own_listeners.iter().map(Listener::wake_mark).sum(),
        };
        self.own_from = listeners.len();
        listeners.extend(own_listeners);
        self.listeners = listeners;
        self.own_channel = own;
        self.listens_at = subscribe.at;
        Some(channels)
    }

    /// Sleeps until a release notification from any node, or `until`; says which, and
    /// what the waiter heard.
    async fn sleep(&self, until: Instant) -> Woken {
        let deadline = tokio::time::Instant::from_std(until);
        let by = if self.listeners.is_empty() {
            tokio::time::sleep_until(deadline).await;
            WokenBy::Timer
        } else {
            let any_release = async {
                match self.listeners.as_slice() {
                    // The usual cases (one node: its channel, and its client's own for
                    // plain and fair waiters): no boxes to poll through.
                    [one] => one.notified().await,
                    [one, two] => {
                        tokio::select! {
                            () = one.notified() => {}
                            () = two.notified() => {}
                        }
                    }
                    many => {
                        select_all(many.iter().map(|l| Box::pin(l.notified()))).await;
                    }
                }
            };
            tokio::select! {
                () = any_release => WokenBy::Notification,
                () = tokio::time::sleep_until(deadline) => WokenBy::Timer,
            }
        };
        observe::woken(by);
        tracing::trace!(by = by.as_str(), "woken");
        Woken {
            by,
            named_wakes: self.listeners[self.own_from..]
                .iter()
                .map(Listener::wake_mark)
                .sum(),
            handover: self.listeners.iter().find_map(Listener::handover),
        }
    }

    /// Leaves to the background what an acquire that ended without the lock owes.
    fn clean_up(&self, cleanup: Cleanup) {
        let (req, token) = (self.machine.request(), self.machine.token());
        if cleanup.unlist {
            self.nodes
                .unlist_in_background(listened(req, self.listens_at));
        }
        if cleanup.withdraw {
            self.nodes
                .withdraw_in_background(&req.keys, token, &req.protocol, req.ttl);
        }
    }
}

impl<N: Nodes> Drop for Run<'_, N> {
    /// The caller dropped the acquire before its end.
    fn drop(&mut self) {
        if !self.done {
            let cleanup = self.machine.cancel();
            self.clean_up(cleanup);
        }
    }
}

/// The keys whose release a waiter of `req` listens for: those of the name at `at` of a
/// multi-lock's call, or the lock's.
fn listened<'r>(req: &'r Request<'_>, at: Option<usize>) -> &'r crate::keys::LockKeys {
    at.and_then(|at| req.protocol.keys_at(at))
        .unwrap_or(&req.keys)
}

/// What varies between the script calls of one acquire: the attempt, whether other
/// waiters of the client keep it listed, and whether the node is asked who it is.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Shape {
    attempt: Attempt,
    stays: bool,
    identify: bool,
}

/// The script calls one acquire has built, each with its [`Shape`]: a later attempt of
/// the same shape sends that call again, built once (with its command). A few are
/// kept, the one used least recently replaced.
#[derive(Default)]
struct Calls {
    /// The most recently used first.
    kept: [Option<(Shape, Arc<Call>)>; 4],
}

impl Calls {
    /// The call of `shape`, built by `build` unless kept.
    fn get(&mut self, shape: Shape, build: impl FnOnce() -> Call) -> Arc<Call> {
        let found = self
            .kept
            .iter()
            .position(|kept| kept.as_ref().is_some_and(|(s, _)| *s == shape));
        // The slot it leaves (or, for a new call, the one dropped) goes to the front.
        let (slot, kept) = match found {
            Some(at) => (at, self.kept[at].take()),
            None => (self.kept.len() - 1, None),
        };
        self.kept[..=slot].rotate_right(1);
        let call = match kept {
            Some((_, call)) => call,
            None => Arc::new(build()),
        };
        self.kept[0] = Some((shape, call.clone()));
        call
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
            started: clock(),
            span,
            attempts: 0,
            waiting_since: None,
            contended: false,
            done: false,
        }
    }

    /// Keeps up with the machine's counts.
    fn follow(&mut self, machine: &Acquiring<'_>) {
        self.attempts = machine.attempts();
        self.waiting_since = machine.waiting_since();
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
        self.report(AcquireOutcome::of(result), Some(result.as_ref()));
    }

    /// Emits the outcome: its metrics, the span's fields, and one event. `result`:
    /// `None` for a cancelled acquire.
    fn report(&self, outcome: AcquireOutcome, result: Option<Result<&Acquired, &Error>>) {
        let now = clock();
        let elapsed = now.saturating_duration_since(self.started);
        let waited = self.waiting_since.map(|t| now.saturating_duration_since(t));
        // The lock was held when this acquire first asked, and it got it: handed over.
        let handoff = matches!(result, Some(Ok(_))) && self.contended;
        observe::acquire_ended(self.mode, outcome, elapsed, waited, handoff);
        let span = &self.span;
        span.record("outcome", outcome.as_str());
        span.record("elapsed_ms", observe::ms(elapsed));
        let _in = span.enter();
        let (attempts, elapsed_ms, waited_ms) =
            (self.attempts, observe::ms(elapsed), waited.map(observe::ms));
        let outcome = outcome.as_str();
        match result {
            None => {
                tracing::debug!(
                    outcome,
                    attempts,
                    elapsed_ms,
                    waited_ms,
                    "acquire cancelled"
                );
            }
            Some(Ok(acquired)) => {
                let fencing_token = acquired.grant.fence.get();
                span.record("fencing_token", fencing_token);
                tracing::debug!(
                    outcome,
                    fencing_token,
                    attempts,
                    elapsed_ms,
                    waited_ms,
                    handoff,
                    "lock acquired"
                );
            }
            Some(Err(Error::Held {
                blocked_by, nodes, ..
            })) if nodes.is_empty() => {
                tracing::debug!(outcome, attempts, elapsed_ms, waited_ms, %blocked_by, "lock not acquired");
            }
            Some(Err(Error::Held {
                blocked_by, nodes, ..
            })) => {
                tracing::debug!(outcome, attempts, elapsed_ms, waited_ms, %blocked_by, nodes = %NodeList(nodes), "lock not acquired");
            }
            Some(Err(e)) => {
                tracing::debug!(outcome, attempts, elapsed_ms, waited_ms, error = %e, "lock not acquired");
            }
        }
    }
}

impl Drop for Report {
    /// The acquire's future was dropped.
    fn drop(&mut self) {
        if !self.done {
            self.report(AcquireOutcome::Cancelled, None);
        }
    }
}
