//! Where a lock lives, and how to talk to it: [`Backend`].
//!
//! A backend is one Redis node, or several independent masters for Redlock. It answers
//! acquire, extend, release, abandon, the watchdog's batched renewals, and release
//! subscriptions, and hides the quorum: every operation goes to all its nodes at once
//! ([`fan_out`], each node within its timeout) and the answers are tallied by one set of
//! rules ([`quorum`]). A caller never asks how many nodes there are, except for what
//! only one node can do (a fair queue, reentrant holds, a delay queue: [`Backend::single`]).
//!
//! Below it: [`node`] (one connection, its timeouts, the mapping of driver errors to
//! fencelock's [`Error`]; a node is one server, a Sentinel-managed master, or a whole
//! Redis Cluster, [`cluster`]; what a node whose server stopped answering is not sent,
//! [`stall`]) and [`subscriber`] (one pub/sub connection per client and node).

pub(crate) mod access;
pub(crate) mod capabilities;
pub(crate) mod cluster;
pub(crate) mod errors;
pub(crate) mod eviction;
pub(crate) mod node;
pub(crate) mod quorum;
pub(crate) mod sentinel;
pub(crate) mod stall;
pub(crate) mod subscriber;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use redis::FromRedisValue;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::engine::acquire::Request;
use crate::engine::nodes::Nodes;
use crate::engine::protocol::{self, Protocol, Undo, Wake};
use crate::engine::watchdog::{Renewal, Renewer};
use crate::engine::{Grant, Outcome, lease_end};
use crate::error::{Error, LossCause, UnavailableReason};
use crate::keys::LockKeys;
use crate::observe::{self, ReleaseKind, ReleaseOutcome};
use crate::scripts::{
    self, Call,
    replies::{AcquireReply, Answer, Broke, Inspected, Owned, Renewed, Resized},
};
use crate::token::HolderToken;
pub(crate) use access::{Access, Timeouts};
pub(crate) use errors::redact;
pub(crate) use node::{AppClient, Node, is_cluster_url};
use quorum::{Confirmation, Quorum};
use subscriber::Subscription;

/// What one acquire keeps on the backend's side between its attempts.
#[derive(Default)]
pub(crate) struct Session {
    /// The take-back of the last attempt, if its answers are still awaited: the next
    /// attempt waits for them, so that the take-back, which undoes the same token,
    /// cannot reach a node after it (a reconnect, a script loaded again, a master that
    /// moved could reorder them).
    take_back: Option<tokio::task::JoinHandle<()>>,
}

/// Where a client's locks live: one node, or the Redlock nodes. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Backend {
    nodes: Vec<Node>,
    quorum: Quorum,
    /// Calls that go on after their operation answered (Redlock's stragglers), and the
    /// client's background releases: [`Client::flush`](crate::Client::flush) waits
    /// for them.
    background: TaskTracker,
    /// Turns of the background releases: at most
    /// [`BACKGROUND_RELEASES_IN_FLIGHT`](crate::limits::BACKGROUND_RELEASES_IN_FLIGHT)
    /// in flight.
    background_turns: Arc<Semaphore>,
    /// This client's name in its own release channels (random, 16 hex digits): a fair
    /// release hands the lock over on the channel of the waiter's client only.
    client_tag: String,
    /// How long a lock's fencing counter lives without a grant (zero: for ever); see
    /// [`ClientBuilder::fence_counter_idle`](crate::ClientBuilder::fence_counter_idle).
    counter_idle: Duration,
}

/// The turns of a client's background releases.
fn background_turns() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(crate::limits::BACKGROUND_RELEASES_IN_FLIGHT))
}

/// What a background release withdraws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Withdrawn {
    /// The lock of a guard dropped unreleased: counted as a release (kind `drop`).
    Guard,
    /// What an acquire that ended without the lock may have left behind.
    Acquire,
}

/// A fresh [`Backend::client_tag`].
fn client_tag() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Asks `nodes` at once, each within `within` (its own call timeout when `None`), and
/// collects what each answered, in node order. The one fan-out of fencelock: acquire,
/// extend, release, abandon and renewals all go through it.
pub(crate) async fn fan_out<'i, T: FromRedisValue>(
    nodes: &[Node],
    within: Option<Duration>,
    invocation: impl Fn(&Node) -> &'i Call,
) -> Vec<Result<T, Error>> {
    join_all(nodes.iter().map(|node| node.run(invocation(node), within))).await
}

/// Every node's call, under way together: each answer comes with its node's index.
fn under_way<T>(
    nodes: &[Node],
    within: Option<Duration>,
    invocation: impl Fn(&Node) -> Arc<Call>,
) -> FuturesUnordered<impl Future<Output = (usize, Result<T, Error>)> + Send + 'static>
where
    T: FromRedisValue + Send + 'static,
{
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let (node, call) = (node.clone(), invocation(node));
            async move { (i, node.run::<T>(&call, within).await) }
        })
        .collect()
}

/// As [`fan_out`], for Redlock's nodes: each answer goes to `answer` as it comes, and
/// this returns as soon as `answer` says the answers so far decide the operation (or
/// every node answered). The calls still under way then finish in the background, each
/// late answer going to `late`. Every call has been sent when this returns, so a node's
/// later calls on its connection run after it (a release after a late grant). The late
/// calls run on `background`.
///
/// Cancel safety: dropping the future drops the calls under way, as for [`fan_out`].
pub(crate) async fn fan_out_until<T>(
    background: &TaskTracker,
    nodes: &[Node],
    within: Option<Duration>,
    invocation: impl Fn(&Node) -> Arc<Call>,
    mut answer: impl FnMut(usize, Result<T, Error>) -> bool,
    mut late: impl FnMut(usize, Result<T, Error>) + Send + 'static,
) where
    T: FromRedisValue + Send + 'static,
{
    let mut pending = under_way(nodes, within, invocation);
    while let Some((i, result)) = pending.next().await {
        if answer(i, result) && !pending.is_empty() {
            background.spawn(async move {
                while let Some((i, result)) = pending.next().await {
                    late(i, result);
                }
            });
            return;
        }
    }
}

/// As [`fan_out`], without waiting for any answer: every call is started (polled until
/// it waits for its reply: on a connection that is up, it is then in the connection's
/// queue) and the connections' writers are given a turn before this returns; the
/// answers go to `answer` as they come, in the background, on `background`, whose task
/// the returned handle awaits (`None`: every call answered at once). A call may still be
/// sent later than that (a connection being made again, a script loaded again): a later
/// call that must come after it waits for the handle.
///
/// Cancel safety: the calls are started or spawned before its only await.
pub(crate) async fn fan_out_sent<T>(
    background: &TaskTracker,
    nodes: &[Node],
    within: Option<Duration>,
    call: &Arc<Call>,
    mut answer: impl FnMut(usize, Result<T, Error>) + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>>
where
    T: FromRedisValue + Send + 'static,
{
    let mut pending = under_way(nodes, within, |_| call.clone());
    loop {
        match futures_util::poll!(pending.next()) {
            std::task::Poll::Ready(Some((i, result))) => answer(i, result),
            std::task::Poll::Ready(None) => return None,
            std::task::Poll::Pending => break,
        }
    }
    let rest = background.spawn(async move {
        while let Some((i, result)) = pending.next().await {
            answer(i, result);
        }
    });
    // The connections' writers were woken by the calls: let them write, so that a
    // program that exits next has sent them.
    tokio::task::yield_now().await;
    Some(rest)
}

/// How long a Redlock connect waits for each node to say who it is, unless a node
/// timeout is set.
const IDENTIFY_TIMEOUT: Duration = Duration::from_millis(250);

impl Backend {
    /// Sets up one node at `url`; `eager`: connect now.
    pub async fn single(
        url: &str,
        timeouts: Timeouts,
        access: &Access,
        eager: bool,
    ) -> Result<Self, Error> {
        Ok(Self::of(
            Node::open(url, timeouts, access, eager).await?,
            timeouts,
        ))
    }

    /// Sets up the one node of an application's own driver client; `eager`: connect now.
    pub async fn app(app: &AppClient, timeouts: Timeouts, eager: bool) -> Result<Self, Error> {
        Ok(Self::of(
            Node::open_app(app, timeouts, eager).await?,
            timeouts,
        ))
    }

    fn of(node: Node, timeouts: Timeouts) -> Self {
        Self {
            nodes: vec![node],
            quorum: Quorum::single(timeouts.response),
            background: TaskTracker::new(),
            background_turns: background_turns(),
            client_tag: client_tag(),
            counter_idle: crate::limits::FENCE_COUNTER_IDLE,
        }
    }

    /// Sets up Redlock over `urls` (already checked: odd, at least 3, distinct). The
    /// nodes connect lazily, since a minority may be down. `identify`: ask each node who
    /// it is now (each within the node timeout, or 250 ms) and refuse URLs that name one
    /// server several times; a node that does not answer now is identified by its first
    /// answer to an acquire.
    pub async fn redlock(
        urls: &[String],
        timeouts: Timeouts,
        access: &Access,
        node_timeout: Option<Duration>,
        quarantine: Option<Duration>,
        identify: bool,
    ) -> Result<Self, Error> {
        if let Some(url) = urls.iter().find(|u| is_cluster_url(u)) {
            return Err(Error::invalid(
                "Redis URLs",
                format!(
                    "{} is a Redis Cluster, which Redlock cannot use as a node: restart \
                     protection tells a node by its one run id, and a cluster has one per \
                     shard; give the cluster's URL alone (its slots are one lock service)",
                    redact(url)
                ),
            ));
        }
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            nodes.push(Node::open(url, timeouts, access, false).await?);
        }
        if identify {
            let within = node_timeout
                .unwrap_or(IDENTIFY_TIMEOUT)
                .min(timeouts.connect);
            refuse_one_server_twice(urls, &nodes, within).await?;
        }
        let quorum = Quorum::redlock(nodes.len(), node_timeout, quarantine, timeouts.response);
        Ok(Self {
            nodes,
            quorum,
            background: TaskTracker::new(),
            background_turns: background_turns(),
            client_tag: client_tag(),
            counter_idle: crate::limits::FENCE_COUNTER_IDLE,
        })
    }

    /// Where calls that outlive their operation run (see [`fan_out_until`]).
    pub fn background(&self) -> &TaskTracker {
        &self.background
    }

    /// This client's own release channel for the lock of `keys`: where a fair release
    /// hands the lock to one of this client's waiters, and a plain release wakes this
    /// client by name (in the lock's slot, like its other channel).
    pub fn own_channel(&self, keys: &LockKeys) -> String {
        keys.own_channel(&self.client_tag)
    }

    /// Takes this client off the wake list of the lock of `keys` on every node: its last
    /// plain waiter of the lock ended without it. Errors are the nodes' (the listing
    /// then expires by itself, with the lease that refused the waiter).
    ///
    /// Cancel safety: it only removes; dropped, the listing expires as said.
    pub async fn unlist(&self, keys: &LockKeys) -> Result<(), Error> {
        let call = scripts::unlist(keys, &self.client_tag);
        fan_out::<i64>(&self.nodes, None, |_| &call)
            .await
            .into_iter()
            .find_map(Result::err)
            .map_or(Ok(()), Err)
    }

    /// This client's name on a lock's wake list, and in its own channels.
    pub fn client_tag(&self) -> &str {
        &self.client_tag
    }

    /// How many plain waiters of this client wait on `channel` (on the first node; a
    /// Redlock waiter subscribes on every node).
    pub fn plain_waiters(&self, channel: &str) -> usize {
        self.nodes
            .first()
            .map_or(0, |n| n.subscriber().plain_waiters(channel))
    }

    /// Every node, in the order given.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Redlock restart protection: how much longer each node's grants do not count (the
    /// client's quarantine; a longer lease is kept out for its own length), as far as
    /// this client knows (it learns a server's uptime when it connects and from its
    /// acquires); `None` for a node that counts, and for every node when the protection
    /// is off or the client is not Redlock.
    pub fn restart_protection_left(&self) -> Vec<Option<Duration>> {
        let now = Instant::now();
        self.nodes
            .iter()
            .map(|node| self.quorum.quarantine_left(node, Duration::ZERO, now))
            .collect()
    }

    /// The node, for what only one node can do (a fair queue, reentrant holds, a delay
    /// queue); `None` for Redlock.
    pub fn only_node(&self) -> Option<&Node> {
        match self.nodes.as_slice() {
            [node] => Some(node),
            _ => None,
        }
    }

    /// Sets how long a lock's fencing counter lives without a grant (zero: for ever).
    pub fn set_counter_idle(&mut self, idle: Duration) {
        self.counter_idle = idle;
    }

    /// How one call may take several lock keys at once: `keys` grouped (as indexes, in
    /// the order given) by what one script call can reach. One group on one server and
    /// with Redlock (each node gets the whole call); on a Redis Cluster, one group per
    /// slot, since one script's keys must share a slot.
    pub fn call_groups<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> Vec<Vec<usize>> {
        let cluster = self.nodes.iter().any(Node::is_cluster);
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            let slot = if cluster { cluster::key_slot(key) } else { 0 };
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, group)) => group.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        groups.into_iter().map(|(_, group)| group).collect()
    }

    /// Whether this is Redlock.
    pub fn is_redlock(&self) -> bool {
        self.nodes.len() > 1
    }

    /// A Redlock attempt: every node at once, tallied as the answers come; whether what
    /// it may have written must be taken back.
    async fn attempt_everywhere(
        &self,
        req: &Request<'_>,
        anonymous: &Arc<Call>,
        identified: &Arc<Call>,
        sent_at: Instant,
    ) -> (Result<Outcome, Error>, bool) {
        let q = &self.quorum;
        // Each node's generation when its call went out: what it says about itself
        // holds for that connection.
        let generations: Vec<u64> = self.nodes.iter().map(Node::generation).collect();
        let mut tally = q.tally(&self.nodes, sent_at, req.ttl);
        let late = {
            let (q, nodes, generations, ttl) =
                (q.clone(), self.nodes.clone(), generations.clone(), req.ttl);
            move |i, answer: Result<AcquireReply, Error>| {
                q.judge_late(&nodes[i], &answer, generations[i], ttl, Instant::now());
            }
        };
        fan_out_until(
            &self.background,
            &self.nodes,
            q.within(req.ttl),
            |node| {
                if q.identify(node) {
                    identified.clone()
                } else {
                    anonymous.clone()
                }
            },
            |i, answer| tally.add(i, answer, generations[i], Instant::now()),
            late,
        )
        .await;
        tally.verdict(req.name, Instant::now())
    }

    /// Takes back what an attempt the tally refused may have written. The call is started
    /// on every node before this returns (see [`fan_out_sent`]) and its answers are
    /// awaited in the background, so that nodes that do not answer (a majority down) do
    /// not hold up the caller; the acquire's next attempt, if any, waits for them first
    /// ([`Session`]). A take-back that is lost leaves its key to the lease; the
    /// acquire's withdrawal when it ends without the lock is sent again as a release is.
    async fn take_back(
        &self,
        req: &Request<'_>,
        token: &HolderToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let undo = self.release_args(&req.keys, token, 0, Undo::TakeBack);
        let call = Arc::new(req.protocol.withdraw(&undo));
        let name = req.name.to_owned();
        let complain = move |_, answer: Result<redis::Value, Error>| {
            if let Err(e) = answer {
                tracing::debug!(lock = name.as_str(), error = %e, "taking back a failed attempt failed on a node; its key expires after its lease");
            }
        };
        let within = self.quorum.within(req.ttl);
        fan_out_sent(&self.background, &self.nodes, within, &call, complain).await
    }

    /// Extends the lease to `ttl` from now (a renewal batch of one): a majority must
    /// confirm with time to spare. Returns when the request was sent and the new end of
    /// the lease.
    ///
    /// Errors: [`Error::LeaseLost`] when the nodes said it is gone, or confirmed too late
    /// ([`LossCause::Unconfirmed`]); a node's error when too few answered to tell (the
    /// lease may still be valid: nothing is released).
    pub async fn extend(
        &self,
        name: &str,
        keys: &LockKeys,
        holder: &str,
        ttl: Duration,
    ) -> Result<(Instant, Instant), Error> {
        let sent_at = Instant::now();
        let invocation = scripts::renew(std::iter::once((keys.lock.as_str(), holder, ttl)));
        let (confirmation, errors) = self
            .confirm_everywhere::<Renewed>(
                invocation,
                ttl,
                self.quorum.needed(),
                self.quorum.needed(),
                |r| r.0.first().copied(),
            )
            .await;
        let lost = |cause| Error::LeaseLost {
            name: name.to_owned(),
            cause,
        };
        match confirmation {
            Confirmation::Confirmed => {
                let valid_until = lease_end(sent_at, ttl);
                if valid_until <= Instant::now() {
                    return Err(lost(LossCause::Unconfirmed));
                }
                Ok((sent_at, valid_until))
            }
            Confirmation::Lost(cause) => Err(lost(cause)),
            Confirmation::Unknown => Err(errors
                .into_iter()
                .next()
                .unwrap_or_else(|| lost(LossCause::Unconfirmed))),
        }
    }

    /// Sends `call` to every node and tallies what each says about one lease:
    /// confirmed by `enough` (see [`Quorum::confirm`]). Redlock answers as soon as the
    /// answers so far are decided with `early` as the number that confirms. Returns the
    /// confirmation and the nodes' errors, in node order.
    ///
    /// Cancel safety: as [`Node::run`]; calls already left to the background finish.
    async fn confirm_everywhere<T>(
        &self,
        call: Call,
        ttl: Duration,
        early: usize,
        enough: usize,
        owned: impl Fn(&T) -> Option<Owned>,
    ) -> (Confirmation, Vec<Error>)
    where
        T: FromRedisValue + Send + 'static,
    {
        let q = &self.quorum;
        let within = q.within(ttl);
        let mut said: Vec<Option<Owned>> = vec![None; self.nodes.len()];
        if let Some(node) = self.only_node() {
            let mut errors = Vec::new();
            match node.run::<T>(&call, within).await {
                Ok(answer) => said[0] = owned(&answer),
                Err(e) => errors.push(e),
            }
            return (q.confirm(&self.nodes, said, enough), errors);
        }
        let mut errors = Vec::new();
        let call = Arc::new(call);
        // Boxed, as in `acquire`: the single node's future stays small.
        Box::pin(fan_out_until(
            &self.background,
            &self.nodes,
            within,
            |_| call.clone(),
            |i, answer: Result<T, Error>| {
                match answer {
                    Ok(answer) => said[i] = owned(&answer),
                    Err(e) => errors.push((i, e)),
                }
                q.confirm(&self.nodes, said.iter().copied(), early) != Confirmation::Unknown
            },
            |_, _| {},
        ))
        .await;
        errors.sort_by_key(|(i, _)| *i);
        let errors = errors.into_iter().map(|(_, e)| e).collect();
        (q.confirm(&self.nodes, said, enough), errors)
    }

    /// Releases a held lock on every node (and wakes its waiters): Ok if any node still
    /// held it. `fence`: Redlock raises every node's counter to the grant's token.
    ///
    /// Errors: [`Error::LeaseLost`] when no node held it any more; a node's error when
    /// too few answered to tell (the key then expires after its lease).
    pub async fn release(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &dyn Protocol,
        ttl: Duration,
        fence: u64,
    ) -> Result<(), Error> {
        // Ok if any node still held it. Redlock answers once a majority released it (so
        // that another client can take it at once) or said it is gone; the others go on
        // in the background (a node that does not answer keeps the key at most until it
        // expires).
        let call = protocol.release(&self.release_args(keys, token, fence, Undo::Release));
        let (confirmation, errors) = self
            .confirm_everywhere::<Owned>(call, ttl, self.quorum.needed(), 1, |o| Some(*o))
            .await;
        let lost = |cause| Error::LeaseLost {
            name: name.to_owned(),
            cause,
        };
        match confirmation {
            Confirmation::Confirmed => Ok(()),
            Confirmation::Lost(cause) => Err(lost(cause)),
            Confirmation::Unknown => Err(errors
                .into_iter()
                .next()
                .unwrap_or_else(|| lost(LossCause::Expired))),
        }
    }

    /// What a release or withdrawal of `token` sends. `fence`: Redlock raises every
    /// node's counter to the grant's token (one node leaves its counter alone).
    fn release_args<'a>(
        &self,
        keys: &'a LockKeys,
        token: &'a HolderToken,
        fence: u64,
        undo: Undo,
    ) -> protocol::Release<'a> {
        protocol::Release {
            keys,
            token,
            fence: if self.is_redlock() { fence } else { 0 },
            counter_idle: self.counter_idle,
            undo,
        }
    }

    /// Withdraws everything `token` may hold: its grant (on every node; Redlock raises
    /// the counters to `fence`), or in fair mode its place in the queue. `undo`: whether
    /// another attempt with the token may follow ([`Undo::TakeBack`]) or not. Succeeds
    /// when any node answered, whatever it found.
    ///
    /// Cancel safety: as [`Node::run`]; a call dropped before it went out leaves its key
    /// to expire with its lease (one that timed out or was lost with its connection is
    /// kept and sent again, if it is the token's last).
    pub async fn abandon(
        &self,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &dyn Protocol,
        ttl: Duration,
        fence: u64,
        undo: Undo,
    ) -> Result<(), Error> {
        let call = protocol.withdraw(&self.release_args(keys, token, fence, undo));
        let answers: Vec<Result<redis::Value, Error>> =
            fan_out(&self.nodes, self.quorum.within(ttl), |_| &call).await;
        if answers.iter().any(Result::is_ok) {
            return Ok(());
        }
        Err(first_error(answers, || {
            Error::invalid("nodes", "none to withdraw from")
        }))
    }

    /// Takes this client off the wake list of the lock of `keys` without waiting, once
    /// none of its plain waiters waits for that lock any more (checked when the call
    /// goes out: a waiter that came meanwhile keeps the listing). Without a Tokio
    /// runtime it does nothing, and the listing expires by itself.
    pub fn unlist_in_background(&self, keys: &LockKeys) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.clone();
        let keys = keys.clone();
        self.background.spawn_on(
            async move {
                if backend.plain_waiters(&backend.own_channel(&keys)) > 0 {
                    return;
                }
                if let Err(e) = backend.unlist(&keys).await {
                    tracing::debug!(lock = keys.name(), error = %e, "leaving the wake list failed; the listing expires by itself");
                }
            },
            &runtime,
        );
    }

    /// Withdraws a token (its grant, its queue place) without waiting, on the client's
    /// turns. Never blocks or panics; without a Tokio runtime it does nothing, and the
    /// key expires after its lease (a queue place after the waiter timeout).
    pub fn abandon_in_background(
        &self,
        what: Withdrawn,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &Arc<dyn Protocol>,
        ttl: Duration,
        fence: u64,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if what == Withdrawn::Guard {
                observe::released(ReleaseKind::Drop, ReleaseOutcome::Error, None);
            }
            tracing::warn!(
                lock = keys.name(),
                "no Tokio runtime to release the lock in; it expires after its lease"
            );
            return;
        };
        let backend = self.clone();
        let (keys, token, protocol) = (keys.clone(), token.clone(), protocol.clone());
        let turns = self.background_turns.clone();
        self.background.spawn_on(
            async move {
                // Never closed, so a permit always comes.
                let _turn = turns.acquire_owned().await;
                // A guard dropped, or an acquire cancelled: the token's last call.
                let result = backend
                    .abandon(&keys, &token, &*protocol, ttl, fence, Undo::Withdraw)
                    .await;
                if what == Withdrawn::Guard {
                    observe::released(ReleaseKind::Drop, ReleaseOutcome::of(&result), None);
                }
                match result {
                    Ok(()) if what == Withdrawn::Guard => {
                        tracing::debug!(lock = keys.name(), fencing_token = fence, "lock released in the background");
                    }
                    Ok(()) => {}
                    Err(e) => {
                        tracing::warn!(lock = keys.name(), error = %e, "background release failed; the key expires after its lease");
                    }
                }
            },
            &runtime,
        );
    }

    /// Which renewal batch a lease's `key` belongs in: on a cluster, the master that
    /// serves it (one batch goes to one master, in one call); `None` everywhere else, where
    /// every node serves every key.
    pub fn renewal_group(&self, key: &str) -> Option<String> {
        self.only_node()?.master_for(key)
    }

    /// One renewal batch: `(lock key, holder, ttl)` per lease, sent now to every node.
    /// A lease is renewed when a majority confirmed it in time; lost when so many nodes
    /// said it is gone that no majority can confirm it; otherwise unknown (retry).
    /// A node answers for each lease (a cluster, one call per master of the leases'
    /// slots; see [`cluster`]); a lease it did not answer for counts as unanswered there.
    pub async fn renew(&self, leases: &[(&str, &str, Duration)]) -> Vec<Renewal> {
        let sent_at = Instant::now();
        let shortest = leases.iter().map(|l| l.2).min().unwrap_or_default();
        let within = self.quorum.within(shortest);
        let answers: Vec<Vec<Option<Owned>>> =
            join_all(self.nodes.iter().map(|node| node.renew(leases, within))).await;
        let now = Instant::now();
        leases
            .iter()
            .enumerate()
            .map(|(i, (_, _, ttl))| {
                let owned = answers.iter().map(|a| a.get(i).copied().flatten());
                self.quorum.renewal(&self.nodes, owned, sent_at, *ttl, now)
            })
            .collect()
    }

    /// Waits for `replicas` replicas to acknowledge the writes sent so far on the node's
    /// connection (a grant just made of the lock `key`: on a cluster, its slot's master
    /// is asked), up to `within`; how many did, and how long it waited.
    pub async fn wait_replicas(
        &self,
        key: &str,
        replicas: u32,
        within: Duration,
    ) -> Result<(u32, Duration), Error> {
        match self.only_node() {
            Some(node) => node.wait_replicas(key, replicas, within).await,
            None => Err(Error::invalid(
                "replicas",
                "replica acknowledgement is for one node (a master with replicas); Redlock \
                 nodes are independent masters",
            )),
        }
    }

    /// What each node holds for the lock (read-only).
    pub async fn inspect(&self, keys: &LockKeys) -> Vec<Result<Inspected, Error>> {
        let invocation = scripts::inspect(keys);
        fan_out(&self.nodes, None, |_| &invocation).await
    }

    /// Sets a semaphore's permit count on every node (there is one: Redlock refuses
    /// semaphores before this).
    pub async fn resize(&self, keys: &LockKeys, permits: u32) -> Vec<Result<Resized, Error>> {
        let invocation = scripts::semaphore_resize(keys, permits, self.counter_idle);
        fan_out(&self.nodes, None, |_| &invocation).await
    }

    /// Breaks the lock on every node, whoever holds it.
    pub async fn break_lock(&self, keys: &LockKeys) -> Vec<Result<Broke, Error>> {
        let invocation = scripts::break_lock(keys, self.counter_idle);
        fan_out(&self.nodes, None, |_| &invocation).await
    }

    /// The keys matching `pattern` on each node.
    pub async fn scan(&self, pattern: &str) -> Vec<Result<Vec<String>, Error>> {
        join_all(self.nodes.iter().map(|n| n.scan(pattern))).await
    }

    /// Whether `channel` is subscribed on every node already (see
    /// [`Subscriber::is_subscribed`](subscriber::Subscriber::is_subscribed)), so that a
    /// waiter joins at once.
    pub fn subscribed_everywhere(&self, channel: &str) -> bool {
        self.nodes
            .iter()
            .all(|n| n.subscriber().is_subscribed(channel))
    }

    /// Registers waiter `id` for releases of `channel` on every node, once the server
    /// confirmed each subscription. A node whose subscription failed is left out (its
    /// waiters rely on their lease-bounded timers there).
    ///
    /// Cancel safe: a dropped call unregisters its waiter.
    pub async fn subscribe(&self, channel: &str, id: u64, wake: Wake<'_>) -> Vec<Subscription> {
        let subscribing = self
            .nodes
            .iter()
            .map(|n| n.subscriber().subscribe(channel, id, wake));
        join_all(subscribing)
            .await
            .into_iter()
            .zip(&self.nodes)
            .filter_map(|(result, node)| result.inspect_err(|e| node.subscription_failed(e)).ok())
            .collect()
    }
}

/// What one node's answer (come at `now`) to an acquire attempt sent at `sent_at` for a
/// `ttl` lease comes to: the attempt's outcome, and whether what the attempt may have
/// written must be taken back now. `addr`: the node, for the error of a late grant.
/// Pure: the backend and a model checker judge one node's answer alike (Redlock's are
/// tallied, [`quorum::AcquireTally`]).
pub fn judge_one(
    addr: impl FnOnce() -> String,
    answer: Result<AcquireReply, Error>,
    sent_at: Instant,
    ttl: Duration,
    now: Instant,
) -> (Result<Outcome, Error>, bool) {
    let reply = match answer {
        Ok(reply) => reply,
        Err(e) => return (Err(e), false),
    };
    match reply.answer {
        Answer::Granted { fence, fresh } => {
            if !fresh {
                tracing::debug!("acquire retry found our own token");
            }
            let grant = Grant::new(fence, sent_at, ttl);
            if grant.valid_until > now {
                let granted = Outcome::Granted {
                    grant,
                    held_as_other: reply.owner_hold,
                };
                (Ok(granted), false)
            } else {
                // The grant came back after its lease ran out (a slow network, a paused
                // client): the lock may belong to someone else already, so holding it
                // is not on offer. Take it back (owner-checked: a successor's key
                // stays) and report the attempt as timed out; the caller treats its
                // outcome as unknown.
                (Err(late_grant(addr(), sent_at, now, ttl)), true)
            }
        }
        Answer::Held(refusal) => {
            let held = Outcome::Held {
                refusal,
                nodes: Vec::new(),
            };
            (Ok(held), false)
        }
    }
}

/// The grant that came back after its lease had run out, as an error.
fn late_grant(node: String, sent_at: Instant, now: Instant, ttl: Duration) -> Error {
    Error::Unavailable {
        node,
        reason: UnavailableReason::LateGrant,
        detail: format!(
            "the grant arrived {} ms after the acquire was sent, after its {} ms lease (less the drift allowance) had run out",
            (now - sent_at).as_millis(),
            ttl.as_millis()
        ),
        source: None,
    }
}

/// The first node error among `answers`, or `otherwise()` if there is none.
fn first_error<T>(answers: Vec<Result<T, Error>>, otherwise: impl FnOnce() -> Error) -> Error {
    answers
        .into_iter()
        .find_map(Result::err)
        .unwrap_or_else(otherwise)
}

/// Asks every Redlock node who it is (its run id), each within `within`, and refuses
/// URLs that name one server several times (`localhost` and `127.0.0.1`, a `/0` added):
/// such a server would vote more than once. A node that does not answer now is
/// identified by its first answer to an acquire, and refused a second vote then.
async fn refuse_one_server_twice(
    urls: &[String],
    nodes: &[Node],
    within: Duration,
) -> Result<(), Error> {
    let ids = join_all(nodes.iter().map(|n| n.identify(within))).await;
    let mut servers: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, (node, id)) in nodes.iter().zip(ids).enumerate() {
        match id {
            Ok(id) => match servers.iter_mut().find(|(known, _)| *known == id) {
                Some((_, same)) => same.push(i),
                None => servers.push((id, vec![i])),
            },
            Err(e) => {
                tracing::debug!(node = node.addr(), error = %e, "not identified at connect");
            }
        }
    }
    let Some((_, same)) = servers.iter().find(|(_, same)| same.len() > 1) else {
        return Ok(());
    };
    let names: Vec<String> = same.iter().map(|&i| redact(&urls[i])).collect();
    Err(Error::invalid(
        "Redis URLs",
        format!(
            "{} are one Redis server (one run id); Redlock needs independent servers, \
             each named once",
            names.join(", ")
        ),
    ))
}

impl Nodes for Backend {
    type Listener = Subscription;
    type Session = Session;

    /// One acquire attempt of `req` by `token` on every node: `call`, or to a Redlock
    /// node that must say who it is first, `identified`.
    ///
    /// Errors: for one node, its own ([`Error::Unavailable`] leaves the outcome unknown:
    /// withdraw later); for Redlock, [`Error::NoQuorum`] once the take-back of
    /// everything written was sent (its answers come in the background). Cancel safety:
    /// as [`Node::run`].
    async fn attempt(
        &self,
        req: &Request<'_>,
        token: &HolderToken,
        call: &Arc<Call>,
        identified: Option<&Arc<Call>>,
        session: &mut Session,
    ) -> Result<Outcome, Error> {
        if let Some(take_back) = session.take_back.take() {
            // Bounded: each node's call ends within its timeout.
            let _ = take_back.await;
        }
        let sent_at = Instant::now();
        let (outcome, take_back) = if let Some(node) = self.only_node() {
            // One node: its own call timeout (the quorum's node timeout is Redlock's).
            let answer: Result<AcquireReply, Error> = node.run(call, None).await;
            judge_one(|| node.addr(), answer, sent_at, req.ttl, Instant::now())
        } else {
            // Boxed: the fan-out's state would otherwise make every single-node attempt's
            // future as large as a Redlock one's.
            let identified = identified.unwrap_or(call);
            Box::pin(self.attempt_everywhere(req, call, identified, sent_at)).await
        };
        if take_back {
            session.take_back = Box::pin(self.take_back(req, token)).await;
        }
        outcome
    }

    fn withdraw(
        &self,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &dyn Protocol,
        ttl: Duration,
        undo: Undo,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        self.abandon(keys, token, protocol, ttl, 0, undo)
    }

    fn withdraw_in_background(
        &self,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &Arc<dyn Protocol>,
        ttl: Duration,
    ) {
        self.abandon_in_background(Withdrawn::Acquire, keys, token, protocol, ttl, 0);
    }

    fn unlist_in_background(&self, keys: &LockKeys) {
        Backend::unlist_in_background(self, keys);
    }

    fn wait_replicas(
        &self,
        key: &str,
        replicas: u32,
        within: Duration,
    ) -> impl Future<Output = Result<(u32, Duration), Error>> + Send {
        Backend::wait_replicas(self, key, replicas, within)
    }

    fn subscribe(
        &self,
        channel: &str,
        id: u64,
        wake: Wake<'_>,
    ) -> impl Future<Output = Vec<Subscription>> + Send {
        Backend::subscribe(self, channel, id, wake)
    }

    fn subscribed_everywhere(&self, channel: &str) -> bool {
        Backend::subscribed_everywhere(self, channel)
    }

    fn own_channel(&self, keys: &LockKeys) -> String {
        Backend::own_channel(self, keys)
    }

    fn client_tag(&self) -> &str {
        Backend::client_tag(self)
    }

    fn counter_idle(&self) -> Duration {
        self.counter_idle
    }

    fn plain_waiters(&self, channel: &str) -> usize {
        Backend::plain_waiters(self, channel)
    }

    fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

impl Renewer for Backend {
    fn renewal_group(&self, key: &str) -> Option<String> {
        Backend::renewal_group(self, key)
    }

    fn renew(
        &self,
        leases: &[(&str, &str, Duration)],
    ) -> impl Future<Output = Vec<Renewal>> + Send {
        Backend::renew(self, leases)
    }

    async fn counter(&self, key: &str) -> Option<u64> {
        let keys = LockKeys {
            lock: key.to_owned(),
        };
        let answers = self.inspect(&keys).await;
        answers
            .iter()
            .flatten()
            .filter_map(|inspected| inspected.counter.parse::<u64>().ok())
            .max()
    }

    fn node_count(&self) -> usize {
        self.nodes.len()
    }
}
