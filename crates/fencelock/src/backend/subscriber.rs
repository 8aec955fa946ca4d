//! Release notifications: one pub/sub connection per client and node, shared by every
//! waiter of that client.
//!
//! Waiters register on a channel and get an [`Arc<Notify>`] each, as one of three kinds
//! ([`Wake`]). A message with an empty payload (a plain or reentrant release) wakes
//! **one** plain waiter of this client, every reentrant waiter (any number of holds of
//! one owner can be held together, so no one of them can stand for the others) and
//! every fair waiter. A message carrying an owner token wakes only the fair waiter with
//! that token (the head of the queue); so does a handover (`G TOKEN FENCE PX`: a fair
//! release gave that waiter the lock), which the waiter reads with
//! [`Subscription::handover`]. Waking one plain waiter, not all of them, keeps a
//! release from setting off one acquire per waiter when only one can win: every client
//! still hears of the release, so the lock goes to one of them, and the next release
//! wakes the next waiter. The one woken is the longest-waiting plain waiter that is not
//! still busy with an earlier wake (a waiter whose future is not being polled must not
//! swallow every wake), else the longest-waiting.
//!
//! A plain release usually wakes one client only: the one its lock's wake list names
//! (`fragments/wakes.lua`), with an empty message on that client's own channel
//! (`<lock key>:released:<client tag>`), where every plain waiter of the client also
//! listens; it wakes one of them as above. When none is left to take it (they all
//! left), the wake is handed on to the next client of the list ([`HandOn`]: the node runs
//! `lock/wake.lua` for the lock the channel's name says).
//!
//! A woken plain waiter owes an answered attempt for its wake. Its caller reads a mark
//! before each attempt and settles it once Redis answered; a plain waiter dropped with a
//! wake it has not settled (cancelled, or failed on an error) passes the wake on to the
//! next plain waiter (on its client's own channel, with none left, to the next client),
//! so a free lock is never left with only sleeping waiters of this client. (A fair
//! waiter that leaves has its successor told by the queue script.) A `Notify` keeps one
//! permit, so a message that arrives between a failed attempt and the
//! wait is not lost.
//!
//! Pub/sub is a hint, never the only way out of a wait: callers bound every wait by the
//! holder's remaining lease. When the connection drops (a restart, `CLIENT KILL TYPE
//! pubsub`), the dispatcher reconnects, subscribes again to every channel that still has
//! waiters, and then wakes them all, since messages may have been missed in between.
//!
//! On a Redis Cluster the connection is a cluster connection with **sharded** pub/sub
//! (`SSUBSCRIBE`; the scripts announce with `SPUBLISH`), so a release reaches only the
//! nodes of the lock's shard, never every node of the cluster. The driver keeps one
//! connection per node and routes each channel to the master of its slot. A cluster
//! without sharded pub/sub (Redis 6.2: the node learns what its masters offer and says
//! so with [`Subscriber::set_sharded`]) announces with classic `PUBLISH`, which the
//! cluster sends on to every node; its channels are subscribed with classic `SUBSCRIBE`,
//! routed the same way, so that a release is heard from the lock's own master, as
//! quickly as on a standalone server. When what the masters offer changes (a rolling
//! upgrade), every channel is subscribed again the new way, as after a lost node. Two things
//! mean messages may have been missed, and make the dispatcher subscribe again to every
//! channel with waiters (the driver sends each to the master that serves its slot now)
//! and wake them all, as after a reconnection: a node's connection dropped (a failover,
//! a restart), or the server unsubscribed a channel by itself (its slot moved to another
//! master: Redis then sends `sunsubscribe`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, RedisError, Value};
use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

use super::access::Timeouts;
use crate::engine::acquire::Handover;
use crate::engine::nodes::Listener;
use crate::engine::protocol::Wake;
use crate::keys::LockKeys;

/// The shared pub/sub connection of one client to one node.
#[derive(Clone)]
pub(crate) struct Subscriber {
    inner: Arc<Inner>,
}

/// Where the pub/sub connection goes.
#[derive(Clone)]
pub(crate) enum Source {
    /// A standalone node: asked at every (re)connection, so that a Sentinel node's
    /// subscriber follows its master. `None` once the node is gone.
    Node(Arc<dyn Fn() -> Option<redis::Client> + Send + Sync>),
    /// A Redis Cluster: a client whose connection sends every push (messages,
    /// confirmations, lost node connections) to the sender it is given.
    Cluster(
        Arc<dyn Fn(UnboundedSender<PushInfo>) -> Result<ClusterClient, RedisError> + Send + Sync>,
    ),
}

/// The live pub/sub connection: one connection to a standalone node, or a cluster
/// connection that subscribes each channel on the master of its slot, sharded (`true`)
/// or classic.
#[derive(Clone)]
enum Link {
    Node(PubSubSink),
    Cluster(ClusterConnection, bool),
}

impl Link {
    async fn subscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        match self {
            Link::Node(sink) => sink.subscribe(channel).await,
            Link::Cluster(conn, true) => conn.ssubscribe(channel).await,
            Link::Cluster(conn, false) => conn.subscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        match self {
            Link::Node(sink) => sink.unsubscribe(channel).await,
            Link::Cluster(conn, true) => conn.sunsubscribe(channel).await,
            Link::Cluster(conn, false) => conn.unsubscribe(channel).await,
        }
    }
}

/// What the live connection reports.
enum Messages {
    Node(PubSubStream),
    Cluster(UnboundedReceiver<PushInfo>),
}

/// One report of the connection.
enum Event {
    /// A release message: its channel and payload.
    Message(String, Vec<u8>),
    /// A cluster node's connection dropped: its messages may have been missed.
    NodeLost,
    /// The server unsubscribed this channel (its slot moved away), unless it was ours.
    Unsubscribed(String),
}

impl Messages {
    /// The next report; `None` when the connection is gone.
    async fn next(&mut self) -> Option<Event> {
        match self {
            Messages::Node(stream) => {
                let msg = stream.next().await?;
                Some(Event::Message(
                    msg.get_channel_name().to_owned(),
                    msg.get_payload_bytes().to_vec(),
                ))
            }
            Messages::Cluster(pushes) => loop {
                let push = pushes.recv().await?;
                let text = |v: Option<&Value>| match v {
                    Some(Value::BulkString(b)) => Some(b.clone()),
                    Some(Value::SimpleString(s)) => Some(s.clone().into_bytes()),
                    _ => None,
                };
                match push.kind {
                    PushKind::SMessage | PushKind::Message => {
                        if let (Some(channel), Some(payload)) =
                            (text(push.data.first()), text(push.data.get(1)))
                        {
                            let channel = String::from_utf8_lossy(&channel).into_owned();
                            return Some(Event::Message(channel, payload));
                        }
                    }
                    PushKind::Disconnection => return Some(Event::NodeLost),
                    PushKind::SUnsubscribe => {
                        if let Some(channel) = text(push.data.first()) {
                            let channel = String::from_utf8_lossy(&channel).into_owned();
                            return Some(Event::Unsubscribed(channel));
                        }
                    }
                    _ => {} // confirmations
                }
            },
        }
    }
}

struct Inner {
    source: Source,
    timeouts: Timeouts,
    /// Channels with at least one waiter (or an unsubscribe still in flight).
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    /// The live connection and its epoch; `None` while disconnected. A cluster
    /// connection gets a new epoch when its channels must be subscribed again.
    conn: Mutex<Option<(Link, u64)>>,
    /// Held only while connecting, so one caller connects and the others reuse it.
    connecting: tokio::sync::Mutex<()>,
    epoch: AtomicU64,
    /// See [`Subscriber::hand_on_with`].
    hand_on: OnceLock<HandOn>,
    /// A cluster's channels go by sharded pub/sub (see [`Subscriber::set_sharded`]).
    sharded: AtomicBool,
    /// Told when `sharded` changed: the dispatcher subscribes every channel again.
    regroup: Arc<Notify>,
    /// Cancelled when the last handle goes (the client was dropped): the dispatcher,
    /// which holds only a weak reference, then drops the connection at once instead of
    /// waiting for a message that will never come.
    closed: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

struct Channel {
    name: String,
    /// The connection epoch on which SUBSCRIBE was sent, and whether the server
    /// confirmed it; the async mutex orders SUBSCRIBE and UNSUBSCRIBE of this channel (and
    /// of no other). A SUBSCRIBE whose caller was cancelled before the confirmation stays
    /// recorded unconfirmed, so that the channel is still unsubscribed when its waiters
    /// are gone: the server may have run it.
    subscribed: tokio::sync::Mutex<Option<(u64, bool)>>,
    /// By waiter id, so in arrival order.
    waiters: Mutex<BTreeMap<u64, Waiter>>,
}

/// How a waiter is woken, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    /// One plain waiter per empty payload.
    Plain,
    /// Every reentrant waiter on each empty payload.
    Owner,
    /// A fair waiter's owner token.
    Turn(Vec<u8>),
}

struct Waiter {
    kind: Kind,
    notify: Arc<Notify>,
    /// A handover delivered and not yet taken.
    handover: Option<Handover>,
    /// Wakes delivered to this waiter so far.
    wakes: u64,
    /// Wakes that an answered attempt has covered (see [`Subscription::settle`]).
    settled: u64,
}

impl Waiter {
    fn wake(&mut self) {
        self.wakes += 1;
        self.notify.notify_one();
    }
}

/// Wakes one plain waiter: the longest-waiting one that has settled every earlier wake,
/// or else the longest-waiting one. Nothing if there is no plain waiter: says whether
/// there was one.
fn wake_one_plain(waiters: &mut BTreeMap<u64, Waiter>) -> bool {
    let mut members = waiters.values_mut().filter(|w| w.kind == Kind::Plain);
    let Some(oldest) = members.next() else {
        return false;
    };
    if oldest.wakes == oldest.settled {
        oldest.wake();
    } else if let Some(idle) = members.find(|w| w.wakes == w.settled) {
        idle.wake();
    } else {
        oldest.wake();
    }
    true
}

/// Hands on a wake that a client's own channel got when none of its plain waiters was
/// left to take it: the node runs `lock/wake.lua` for the lock, in the background.
pub(crate) type HandOn = Arc<dyn Fn(LockKeys) + Send + Sync>;

/// The lock whose client's own channel `channel` is (`<lock key>:released:<tag>`, the
/// tag 16 hex digits), or `None` for any other channel.
fn own_channel_lock(channel: &str) -> Option<LockKeys> {
    let (lock, tag) = channel.rsplit_once(":released:")?;
    (tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit())).then(|| LockKeys {
        lock: lock.to_owned(),
    })
}

/// One waiter's registration. Dropping it unregisters the waiter, and unsubscribes the
/// channel in the background once no waiter of this client is left on it.
pub(crate) struct Subscription {
    inner: Arc<Inner>,
    channel: Arc<Channel>,
    id: u64,
    notify: Arc<Notify>,
}

/// What the client's subscriber holds right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SubscriberStats {
    pub channels: usize,
    pub waiters: usize,
}

impl Subscriber {
    /// A subscriber that connects on its first subscription.
    pub fn new(source: Source, timeouts: Timeouts) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                timeouts,
                channels: Mutex::new(HashMap::new()),
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                epoch: AtomicU64::new(0),
                hand_on: OnceLock::new(),
                sharded: AtomicBool::new(true),
                regroup: Arc::new(Notify::new()),
                closed: CancellationToken::new(),
            }),
        }
    }

    /// Whether `channel` is subscribed now, confirmed by the server on the live
    /// connection (another waiter of this client holds it open): a waiter that joins it
    /// then does so without a round trip, and hears every message published after.
    pub fn is_subscribed(&self, channel: &str) -> bool {
        let Some(live) = lock(&self.inner.conn).as_ref().map(|(_, epoch)| *epoch) else {
            return false;
        };
        let Some(ch) = lock(&self.inner.channels).get(channel).cloned() else {
            return false;
        };
        // Busy: a subscribe or unsubscribe is under way; not known to be live.
        ch.subscribed
            .try_lock()
            .is_ok_and(|subscribed| *subscribed == Some((live, true)))
    }

    /// Registers a waiter on `channel` and returns once the server confirmed the
    /// subscription, so any message published afterwards reaches the waiter.
    ///
    /// Cancel safe: a dropped call unregisters its waiter.
    pub async fn subscribe(
        &self,
        channel: &str,
        id: u64,
        wake: Wake<'_>,
    ) -> Result<Subscription, redis::RedisError> {
        let subscription = self.register(channel, id, wake);
        let inner = &self.inner;
        let (sink, epoch) = inner.connection().await?;
        inner
            .ensure_subscribed(&subscription.channel, sink, epoch)
            .await?;
        Ok(subscription)
    }

    /// Registers a waiter on `channel`, not yet subscribed.
    fn register(&self, channel: &str, id: u64, wake: Wake<'_>) -> Subscription {
        let inner = &self.inner;
        let kind = match wake {
            Wake::Plain => Kind::Plain,
            Wake::Owner => Kind::Owner,
            Wake::Turn(token) => Kind::Turn(token.as_bytes().to_vec()),
        };
        let notify = Arc::new(Notify::new());
        let ch = {
            let mut channels = lock(&inner.channels);
            let ch = channels
                .entry(channel.to_owned())
                .or_insert_with(|| {
                    Arc::new(Channel {
                        name: channel.to_owned(),
                        subscribed: tokio::sync::Mutex::new(None),
                        waiters: Mutex::new(BTreeMap::new()),
                    })
                })
                .clone();
            lock(&ch.waiters).insert(
                id,
                Waiter {
                    kind,
                    notify: notify.clone(),
                    handover: None,
                    wakes: 0,
                    settled: 0,
                },
            );
            ch
        };
        Subscription {
            inner: inner.clone(),
            channel: ch,
            id,
            notify,
        }
    }

    /// How many plain waiters of this client wait on `channel`.
    pub fn plain_waiters(&self, channel: &str) -> usize {
        let Some(ch) = lock(&self.inner.channels).get(channel).cloned() else {
            return 0;
        };
        lock(&ch.waiters)
            .values()
            .filter(|w| w.kind == Kind::Plain)
            .count()
    }

    /// On a cluster, whether its channels go by sharded pub/sub (`SSUBSCRIBE`; the
    /// default) or classic (`SUBSCRIBE`), as the scripts announce: the node says so once
    /// it learned what its masters offer. A change subscribes every channel with waiters
    /// again, the new way, and wakes them (a release may have gone the other way
    /// meanwhile). No effect on a standalone node's subscriber.
    pub fn set_sharded(&self, sharded: bool) {
        // Under the connection's lock: a connection made meanwhile reads the new way.
        let live = lock(&self.inner.conn);
        if self.inner.sharded.swap(sharded, Ordering::Relaxed) != sharded && live.is_some() {
            tracing::debug!(sharded, "the cluster's release notifications change ways");
            self.inner.regroup.notify_one();
        }
    }

    /// Sets what hands on a wake that a client's own channel got with no plain waiter
    /// left to take it (the node's `lock/wake.lua`); until then such a wake is dropped.
    pub fn hand_on_with(&self, hand_on: HandOn) {
        let _ = self.inner.hand_on.set(hand_on);
    }

    pub fn stats(&self) -> SubscriberStats {
        let channels = lock(&self.inner.channels);
        // A plain or fair waiter listens on two channels (the lock's and its client's
        // own): it counts once.
        let mut ids: Vec<u64> = channels
            .values()
            .flat_map(|c| lock(&c.waiters).keys().copied().collect::<Vec<_>>())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        SubscriberStats {
            channels: channels.len(),
            waiters: ids.len(),
        }
    }
}

impl Listener for Subscription {
    async fn notified(&self) {
        self.notify.notified().await;
    }

    fn handover(&self) -> Option<Handover> {
        lock(&self.channel.waiters)
            .get_mut(&self.id)
            .and_then(|w| w.handover.take())
    }

    fn wake_mark(&self) -> u64 {
        lock(&self.channel.waiters)
            .get(&self.id)
            .map_or(0, |w| w.wakes)
    }

    fn settle(&self, mark: u64) {
        if let Some(w) = lock(&self.channel.waiters).get_mut(&self.id) {
            w.settled = w.settled.max(mark);
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = {
            let _channels = lock(&self.inner.channels);
            let mut waiters = lock(&self.channel.waiters);
            let gone = waiters.remove(&self.id);
            // A wake this plain waiter never answered with an attempt: the lock may be
            // free and no other plain waiter awake, so the next one takes it over; on
            // the client's own channel, with none left, the next listed client does.
            if gone.is_some_and(|w| w.kind == Kind::Plain && w.wakes > w.settled)
                && !wake_one_plain(&mut waiters)
            {
                self.inner.hand_on(&self.channel.name);
            }
            waiters.is_empty()
        };
        if !last {
            return;
        }
        let inner = self.inner.clone();
        let channel = self.channel.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move { inner.unsubscribe_if_unused(channel).await });
            }
            // No runtime: forget the channel; the server side goes with the connection.
            Err(_) => inner.forget_if_unused(&channel),
        }
    }
}

impl Inner {
    /// The live connection, connecting (and starting its dispatcher) if there is none.
    async fn connection(self: &Arc<Self>) -> Result<(Link, u64), redis::RedisError> {
        if let Some(conn) = lock(&self.conn).clone() {
            return Ok(conn);
        }
        let (conn, stream) = self.connect().await?;
        if let Some(stream) = stream {
            let closed = self.closed.clone();
            tokio::spawn(dispatch(Arc::downgrade(self), closed, stream, conn.1));
        }
        Ok(conn)
    }

    /// Connects unless another caller already did; the stream comes back only to the
    /// caller that made the connection, which must read it.
    async fn connect(&self) -> Result<((Link, u64), Option<Messages>), redis::RedisError> {
        let _connecting = self.connecting.lock().await;
        if let Some(conn) = lock(&self.conn).clone() {
            return Ok((conn, None));
        }
        let (link, messages) = match &self.source {
            Source::Node(source) => {
                let client = source().ok_or_else(|| io_timeout("the node is gone"))?;
                let pubsub = tokio::time::timeout(self.timeouts.connect, client.get_async_pubsub())
                    .await
                    .map_err(|_| io_timeout("connecting for pub/sub"))??;
                let (sink, stream) = pubsub.split();
                (Link::Node(sink), Messages::Node(stream))
            }
            Source::Cluster(source) => {
                let (pushes, messages) = tokio::sync::mpsc::unbounded_channel();
                let client = source(pushes)?;
                // A cluster connection asks a seed for the topology, then connects to
                // every node.
                let within = self.timeouts.connect * 2 + self.timeouts.response;
                let conn = tokio::time::timeout(within, client.get_async_connection())
                    .await
                    .map_err(|_| io_timeout("connecting to the cluster for pub/sub"))??;
                (Link::Cluster(conn, true), Messages::Cluster(messages))
            }
        };
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed) + 1;
        let mut live = lock(&self.conn);
        // The way a cluster's channels go, read under the lock that set_sharded takes:
        // a change after this finds the connection and has it subscribed again.
        let link = match link {
            Link::Cluster(conn, _) => Link::Cluster(conn, self.sharded.load(Ordering::Relaxed)),
            link => link,
        };
        *live = Some((link.clone(), epoch));
        drop(live);
        Ok(((link, epoch), Some(messages)))
    }

    /// A cluster connection missed or lost subscriptions: a new epoch for the same
    /// connection, so that every channel is subscribed again on it. `None` while
    /// disconnected.
    fn renew_epoch(&self) -> Option<(Link, u64)> {
        let mut conn = lock(&self.conn);
        let link = match &conn.as_ref()?.0 {
            // The way its channels go now (see Subscriber::set_sharded).
            Link::Cluster(cluster, _) => {
                Link::Cluster(cluster.clone(), self.sharded.load(Ordering::Relaxed))
            }
            link => link.clone(),
        };
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed) + 1;
        *conn = Some((link.clone(), epoch));
        Some((link.clone(), epoch))
    }

    /// Subscribes again every channel that has waiters, on connection `epoch`; whether
    /// every subscription was confirmed.
    async fn resubscribe(&self, link: &Link, epoch: u64) -> bool {
        let mut all = true;
        for ch in self.channels_snapshot() {
            if !lock(&ch.waiters).is_empty()
                && let Err(e) = self.ensure_subscribed(&ch, link.clone(), epoch).await
            {
                tracing::debug!(error = %e, channel = %ch.name, "resubscribe failed");
                all = false;
            }
        }
        all
    }

    fn has_waiters(&self, channel: &str) -> bool {
        lock(&self.channels)
            .get(channel)
            .is_some_and(|ch| !lock(&ch.waiters).is_empty())
    }

    /// Subscribes `ch` on connection `epoch` unless that already happened.
    async fn ensure_subscribed(
        &self,
        ch: &Channel,
        mut link: Link,
        epoch: u64,
    ) -> Result<(), redis::RedisError> {
        let mut subscribed = ch.subscribed.lock().await;
        if *subscribed != Some((epoch, true)) {
            *subscribed = Some((epoch, false));
            let sent = tokio::time::timeout(self.timeouts.response, link.subscribe(&ch.name))
                .await
                .map_err(|_| io_timeout("SUBSCRIBE"))
                .and_then(|r| r);
            // Failed or timed out: left recorded unconfirmed, so the last waiter to leave
            // still unsubscribes (UNSUBSCRIBE of a channel never subscribed is harmless).
            sent?;
            *subscribed = Some((epoch, true));
        }
        Ok(())
    }

    /// Unsubscribes `ch` if no waiter joined it again meanwhile, then forgets it.
    async fn unsubscribe_if_unused(&self, ch: Arc<Channel>) {
        let mut subscribed = ch.subscribed.lock().await;
        if !lock(&ch.waiters).is_empty() {
            return;
        }
        let live = lock(&self.conn).clone();
        // A standalone connection of an earlier epoch is gone, and its subscriptions with
        // it; a cluster connection lives on through its epochs.
        if let (Some((epoch, _)), Some((mut link, live_epoch))) = (*subscribed, live)
            && (epoch == live_epoch || matches!(link, Link::Cluster(..)))
        {
            let unsub = tokio::time::timeout(self.timeouts.response, link.unsubscribe(&ch.name));
            if !matches!(unsub.await, Ok(Ok(()))) {
                tracing::debug!(channel = %ch.name, "UNSUBSCRIBE failed; the channel goes with the connection");
            }
        }
        *subscribed = None;
        self.forget_if_unused(&ch);
    }

    fn forget_if_unused(&self, ch: &Arc<Channel>) {
        let mut channels = lock(&self.channels);
        if lock(&ch.waiters).is_empty()
            && channels.get(&ch.name).is_some_and(|c| Arc::ptr_eq(c, ch))
        {
            channels.remove(&ch.name);
        }
    }

    fn channels_snapshot(&self) -> Vec<Arc<Channel>> {
        lock(&self.channels).values().cloned().collect()
    }

    /// Wakes the waiters of `channel` that `payload` is meant for.
    fn deliver(&self, channel: &str, payload: &[u8]) {
        let Some(ch) = lock(&self.channels).get(channel).cloned() else {
            // A wake by name for a client whose last waiter of the lock left just before
            // (the server counted this connection when it published): handed on.
            if payload.is_empty() {
                self.hand_on(channel);
            }
            return;
        };
        let mut waiters = lock(&ch.waiters);
        if payload.is_empty() {
            // A plain release: the fair waiters sort out among themselves whose turn it
            // is; of the plain waiters one is enough (see the module docs).
            for waiter in waiters.values_mut().filter(|w| w.kind != Kind::Plain) {
                waiter.wake();
            }
            if !wake_one_plain(&mut waiters) {
                self.hand_on(channel);
            }
        } else {
            let (token, handover) = match Handover::parse(payload) {
                Some((token, handover)) => (token, Some(handover)),
                None => (payload, None),
            };
            for waiter in waiters.values_mut() {
                if matches!(&waiter.kind, Kind::Turn(t) if t.as_slice() == token) {
                    waiter.handover = handover.or(waiter.handover);
                    waiter.wake();
                }
            }
        }
    }

    /// A wake of `ch` found no plain waiter: on a client's own channel, it goes on to
    /// the next client of the lock's wake list (the release took this one off it).
    fn hand_on(&self, channel: &str) {
        if let (Some(keys), Some(hand_on)) = (own_channel_lock(channel), self.hand_on.get()) {
            tracing::trace!(
                channel,
                "woken by name with no waiter left; handing the wake on"
            );
            hand_on(keys);
        }
    }

    fn wake_all(&self) {
        for ch in self.channels_snapshot() {
            for waiter in lock(&ch.waiters).values_mut() {
                waiter.wake();
            }
        }
    }

    /// A cluster node's pub/sub was lost or a slot moved: subscribes every channel with
    /// waiters again on a new epoch of the live connection and wakes them all (messages
    /// may have been missed). Returns that epoch and when to try again if a subscription
    /// did not get through (after `retry`'s delay, doubled); `None` while disconnected.
    async fn resync(&self, retry: Backoff) -> Option<(u64, Backoff)> {
        tracing::debug!("a cluster node's pub/sub was lost or moved; subscribing again");
        let (link, epoch) = self.renew_epoch()?;
        let done = self.resubscribe(&link, epoch).await;
        self.wake_all();
        let retry = if done {
            None
        } else {
            let delay = retry.map_or(Duration::from_millis(20), |(_, d)| {
                (d * 2).min(Duration::from_secs(1))
            });
            Some((tokio::time::Instant::now() + delay, delay))
        };
        Some((epoch, retry))
    }

    /// The connection of `epoch` was lost: forgets it (unless a newer one replaced it)
    /// and wakes every waiter.
    fn disconnected(&self, epoch: u64) {
        let mut conn = lock(&self.conn);
        if conn.as_ref().is_some_and(|(_, e)| *e == epoch) {
            *conn = None;
        }
        drop(conn);
        tracing::debug!("pub/sub connection lost; reconnecting");
        // Until the resubscribe succeeds, waiters rely on their lease-bounded timers.
        self.wake_all();
    }
}

/// Reads messages; when the connection drops, reconnects, resubscribes every channel
/// that still has waiters, wakes them all (messages may have been missed), and goes on
/// reading the new connection. On a cluster, a node's lost connection or a channel the
/// server unsubscribed (its slot moved) does the same on the live connection, retrying
/// (with backoff) until every channel is subscribed again. Ends, closing the connection,
/// when nobody waits any more after a disconnection, or at once when the client is gone
/// (`closed`).
async fn dispatch(
    inner: Weak<Inner>,
    closed: CancellationToken,
    mut stream: Messages,
    mut epoch: u64,
) {
    loop {
        let Some(lost) = read(&inner, &closed, &mut stream, epoch).await else {
            return;
        };
        {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            strong.disconnected(lost);
        }
        let Some((new_stream, new_epoch)) = reconnect(&inner, &closed).await else {
            return;
        };
        stream = new_stream;
        epoch = new_epoch;
    }
}

/// A cluster resubscription that did not get through: when to try again, and the delay
/// that led there (doubled at each try, up to a second).
type Backoff = Option<(tokio::time::Instant, Duration)>;

/// Reads the connection of `epoch` until it is lost, delivering each message; on a
/// cluster, subscribes again whatever a lost node or a moved slot took (see
/// [`Inner::resync`]). Returns the epoch of the connection lost, or `None` when the
/// client is gone.
async fn read(
    inner: &Weak<Inner>,
    closed: &CancellationToken,
    stream: &mut Messages,
    mut epoch: u64,
) -> Option<u64> {
    let mut retry: Backoff = None;
    let regroup = inner.upgrade()?.regroup.clone();
    loop {
        let again = async {
            match retry {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            event = stream.next() => event,
            () = again => Some(Event::NodeLost),
            // Subscribed again, the new way, as after a lost node.
            () = regroup.notified(), if matches!(stream, Messages::Cluster(_)) => Some(Event::NodeLost),
            () = closed.cancelled() => return None,
        };
        let Some(event) = event else {
            return Some(epoch);
        };
        let strong = inner.upgrade()?;
        let resync = match event {
            Event::Message(channel, payload) => {
                strong.deliver(&channel, &payload);
                false
            }
            Event::NodeLost => true,
            Event::Unsubscribed(channel) => strong.has_waiters(&channel),
        };
        if resync && let Some((new_epoch, next)) = strong.resync(retry).await {
            epoch = new_epoch;
            retry = next;
        }
    }
}

/// Connects again after the connection was lost, with backoff, then resubscribes every
/// channel with waiters and wakes them all. Returns the new connection's reports and
/// epoch; `None` when nobody waits any more (the next subscribe connects), the client
/// is gone, or another caller connected meanwhile (its dispatcher reads).
async fn reconnect(inner: &Weak<Inner>, closed: &CancellationToken) -> Option<(Messages, u64)> {
    let mut delay = Duration::from_millis(20);
    loop {
        let strong = inner.upgrade()?;
        if strong.channels_snapshot().is_empty() {
            return None; // nobody waits: the next subscribe connects again
        }
        match strong.connect().await {
            Ok(((link, new_epoch), new_stream)) => {
                strong.resubscribe(&link, new_epoch).await;
                strong.wake_all();
                // None: another caller connected; its dispatcher reads.
                return new_stream.map(|stream| (stream, new_epoch));
            }
            Err(e) => tracing::debug!(error = %e, "pub/sub reconnect failed"),
        }
        drop(strong);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = closed.cancelled() => return None,
        }
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

fn io_timeout(what: &str) -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what} timed out")).into()
}

/// Locks a std mutex, ignoring poisoning: every critical section here leaves the maps
/// consistent, so a panic elsewhere does not make them unusable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::driver::next_waiter_id;
    use testkit::RedisServer;

    const WITHIN: Duration = Duration::from_secs(5);

    #[test]
    fn a_clients_own_channel_names_its_lock_and_no_other_channel_does() {
        let keys = LockKeys::new("fencelock", "orders:42").unwrap();
        let own = format!("{}:{:016x}", keys.channel(), 0xabcu64);
        assert_eq!(own_channel_lock(&own), Some(keys.clone()));
        assert_eq!(own_channel_lock(&keys.channel()), None);
        assert_eq!(own_channel_lock(&format!("{}:abc", keys.channel())), None);
        // A name that looks like a tag inside its hash tag is still the lock's channel.
        let odd = LockKeys::new("fencelock", "a:released:0123456789abcdef").unwrap();
        assert_eq!(own_channel_lock(&odd.channel()), None);
    }

    fn subscriber(r: &RedisServer) -> Subscriber {
        let timeouts = Timeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(2),
        };
        let client = redis::Client::open(r.url()).unwrap();
        Subscriber::new(
            Source::Node(Arc::new(move || Some(client.clone()))),
            timeouts,
        )
    }

    async fn woken(s: &Subscription, who: &str) {
        tokio::time::timeout(WITHIN, s.notified())
            .await
            .unwrap_or_else(|_| panic!("{who} was not woken within {WITHIN:?}"));
    }

    /// The server's count of subscribers to `channel`.
    fn numsub(r: &RedisServer, channel: &str) -> Option<i64> {
        r.cmd(&["PUBSUB", "NUMSUB", channel])
            .as_array()
            .and_then(|a| a.get(1)?.as_int())
    }

    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + WITHIN;
        while !cond() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {WITHIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    #[tokio::test]
    async fn a_subscribe_cancelled_after_it_reached_the_server_is_undone() {
        let mut r = RedisServer::start();
        let sub = subscriber(&r);
        // The pub/sub connection is up (and stays: this waiter keeps it).
        let _keep = sub
            .subscribe("warm", next_waiter_id(), Wake::Plain)
            .await
            .unwrap();
        r.pause();
        let subscribing = {
            let sub = sub.clone();
            tokio::spawn(async move { sub.subscribe("ch", next_waiter_id(), Wake::Plain).await })
        };
        until("the SUBSCRIBE waits at the paused server", || {
            r.unread_request_bytes() > 0
        })
        .await;
        subscribing.abort(); // the waiter gives up before the server answers
        let _ = subscribing.await;
        r.resume();
        until("the client forgets the channel", || {
            sub.stats().channels == 1
        })
        .await;
        until("the server read every request", || {
            r.unread_request_bytes() == 0
        })
        .await;
        assert_eq!(
            numsub(&r, "ch"),
            Some(0),
            "the server still sends `ch` here"
        );
        assert_eq!(numsub(&r, "warm"), Some(1));
    }

    #[tokio::test]
    async fn a_release_wakes_one_plain_waiter_and_a_dropped_unanswered_wake_moves_on() {
        let r = RedisServer::start();
        let sub = subscriber(&r);
        let first = sub
            .subscribe("ch", next_waiter_id(), Wake::Plain)
            .await
            .unwrap();
        let second = sub
            .subscribe("ch", next_waiter_id(), Wake::Plain)
            .await
            .unwrap();
        let fair = sub
            .subscribe("ch", next_waiter_id(), Wake::Turn("t1"))
            .await
            .unwrap();

        r.cmd(&["PUBLISH", "ch", ""]);
        woken(&first, "the longest-waiting plain waiter").await;
        woken(&fair, "the fair waiter, on an empty payload").await;
        // Messages are delivered in order: once this one arrived, the first is done.
        r.cmd(&["PUBLISH", "ch", "t1"]);
        woken(&fair, "the fair waiter, on its own token").await;
        assert_eq!(first.wake_mark(), 1);
        assert_eq!(
            second.wake_mark(),
            0,
            "one plain waiter per release, not all"
        );
        assert_eq!(fair.wake_mark(), 2);

        // `first` is cancelled before an answered attempt: its wake goes to `second`.
        drop(first);
        woken(&second, "the next plain waiter").await;
        assert_eq!(second.wake_mark(), 1);

        // `second` answers its wake with an attempt, then leaves: nobody else is woken.
        let third = sub
            .subscribe("ch", next_waiter_id(), Wake::Plain)
            .await
            .unwrap();
        second.settle(second.wake_mark());
        drop(second);
        assert_eq!(third.wake_mark(), 0, "a settled wake is not passed on");

        // A token for someone else wakes no plain waiter and no other fair waiter.
        r.cmd(&["PUBLISH", "ch", "t2"]);
        r.cmd(&["PUBLISH", "ch", "t1"]);
        woken(&fair, "the fair waiter").await;
        assert_eq!(fair.wake_mark(), 3);
        assert_eq!(third.wake_mark(), 0);
    }

    #[tokio::test]
    async fn a_release_wakes_every_reentrant_waiter_and_skips_a_plain_waiter_still_busy() {
        let r = RedisServer::start();
        let sub = subscriber(&r);
        let join = |wake| sub.subscribe("ch", next_waiter_id(), wake);
        let plain_1 = join(Wake::Plain).await.unwrap();
        let plain_2 = join(Wake::Plain).await.unwrap();
        let owner_1 = join(Wake::Owner).await.unwrap();
        let owner_2 = join(Wake::Owner).await.unwrap();
        let fair = join(Wake::Turn("t")).await.unwrap();
        // A message for the fair waiter after each release: once it is delivered, the
        // release before it has been dispatched in full.
        let release = || async {
            r.cmd(&["PUBLISH", "ch", ""]);
            r.cmd(&["PUBLISH", "ch", "t"]);
            woken(&fair, "the fair waiter").await;
            woken(&fair, "the fair waiter, on its token").await;
        };
        let marks = || [&plain_1, &plain_2, &owner_1, &owner_2].map(Subscription::wake_mark);

        release().await;
        assert_eq!(
            marks(),
            [1, 0, 1, 1],
            "one plain waiter, every reentrant one"
        );

        // plain_1 has not answered its wake yet (its future is not polled): the next
        // release goes to plain_2 instead.
        release().await;
        assert_eq!(marks(), [1, 1, 2, 2]);

        // Both busy: the longest-waiting gets it.
        release().await;
        assert_eq!(marks(), [2, 1, 3, 3]);

        // A reentrant waiter leaving passes nothing on: its peers were woken too.
        plain_1.settle(plain_1.wake_mark());
        drop(owner_1);
        assert_eq!(
            [&plain_1, &plain_2, &owner_2].map(Subscription::wake_mark),
            [2, 1, 3]
        );
    }
}
