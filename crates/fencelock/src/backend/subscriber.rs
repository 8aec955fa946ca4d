//! Release notifications: one pub/sub connection per client and node, shared by every
//! waiter of that client.
//!
//! Waiters register on a channel and get an [`Arc<Notify>`] each. A message with an
//! empty payload wakes every waiter of the channel; a message carrying an owner token
//! wakes only the waiter with that token (the head of a fair queue). A `Notify` keeps one
//! permit, so a message that arrives between a failed attempt and the wait is not lost.
//!
//! Pub/sub is a hint, never the only way out of a wait: callers bound every wait by the
//! holder's remaining lease. When the connection drops (a restart, `CLIENT KILL TYPE
//! pubsub`), the dispatcher reconnects, subscribes again to every channel that still has
//! waiters, and then wakes them all, since messages may have been missed in between.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::Notify;

use super::Timeouts;

/// The shared pub/sub connection of one client to one node.
#[derive(Clone)]
pub(crate) struct Subscriber {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    timeouts: Timeouts,
    /// Channels with at least one waiter (or an unsubscribe still in flight).
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    /// The live connection and its epoch; `None` while disconnected.
    conn: Mutex<Option<(PubSubSink, u64)>>,
    /// Held only while connecting, so one caller connects and the others reuse it.
    connecting: tokio::sync::Mutex<()>,
    epoch: AtomicU64,
    next_waiter: AtomicU64,
}

struct Channel {
    name: String,
    /// The connection epoch on which the server confirmed SUBSCRIBE; the async mutex
    /// orders SUBSCRIBE and UNSUBSCRIBE of this channel (and of no other).
    subscribed: tokio::sync::Mutex<Option<u64>>,
    waiters: Mutex<HashMap<u64, Waiter>>,
}

struct Waiter {
    /// `Some`: woken only by messages carrying this owner token (or an empty payload).
    token: Option<Vec<u8>>,
    notify: Arc<Notify>,
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
    pub fn new(client: redis::Client, timeouts: Timeouts) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                timeouts,
                channels: Mutex::new(HashMap::new()),
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                epoch: AtomicU64::new(0),
                next_waiter: AtomicU64::new(0),
            }),
        }
    }

    /// Registers a waiter on `channel` and returns once the server confirmed the
    /// subscription, so any message published afterwards reaches the waiter.
    ///
    /// Cancel safe: a dropped call unregisters its waiter.
    pub async fn subscribe(
        &self,
        channel: &str,
        token: Option<&str>,
    ) -> Result<Subscription, redis::RedisError> {
        let inner = &self.inner;
        let id = inner.next_waiter.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        let ch = {
            let mut channels = lock(&inner.channels);
            let ch = channels
                .entry(channel.to_owned())
                .or_insert_with(|| {
                    Arc::new(Channel {
                        name: channel.to_owned(),
                        subscribed: tokio::sync::Mutex::new(None),
                        waiters: Mutex::new(HashMap::new()),
                    })
                })
                .clone();
            lock(&ch.waiters).insert(
                id,
                Waiter {
                    token: token.map(|t| t.as_bytes().to_vec()),
                    notify: notify.clone(),
                },
            );
            ch
        };
        let subscription = Subscription {
            inner: inner.clone(),
            channel: ch,
            id,
            notify,
        };
        let (sink, epoch) = inner.connection().await?;
        inner
            .ensure_subscribed(&subscription.channel, sink, epoch)
            .await?;
        Ok(subscription)
    }

    pub fn stats(&self) -> SubscriberStats {
        let channels = lock(&self.inner.channels);
        SubscriberStats {
            channels: channels.len(),
            waiters: channels.values().map(|c| lock(&c.waiters).len()).sum(),
        }
    }
}

impl Subscription {
    /// Waits for a message meant for this waiter (or returns at once if one came since
    /// the last call).
    pub async fn notified(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = {
            let _channels = lock(&self.inner.channels);
            let mut waiters = lock(&self.channel.waiters);
            waiters.remove(&self.id);
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
    async fn connection(self: &Arc<Self>) -> Result<(PubSubSink, u64), redis::RedisError> {
        if let Some(conn) = lock(&self.conn).clone() {
            return Ok(conn);
        }
        let (conn, stream) = self.connect().await?;
        if let Some(stream) = stream {
            tokio::spawn(dispatch(Arc::downgrade(self), stream, conn.1));
        }
        Ok(conn)
    }

    /// Connects unless another caller already did; the stream comes back only to the
    /// caller that made the connection, which must read it.
    async fn connect(
        &self,
    ) -> Result<((PubSubSink, u64), Option<PubSubStream>), redis::RedisError> {
        let _connecting = self.connecting.lock().await;
        if let Some(conn) = lock(&self.conn).clone() {
            return Ok((conn, None));
        }
        let pubsub = tokio::time::timeout(self.timeouts.connect, self.client.get_async_pubsub())
            .await
            .map_err(|_| io_timeout("connecting for pub/sub"))??;
        let (sink, stream) = pubsub.split();
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed) + 1;
        *lock(&self.conn) = Some((sink.clone(), epoch));
        Ok(((sink, epoch), Some(stream)))
    }

    /// Subscribes `ch` on connection `epoch` unless that already happened.
    async fn ensure_subscribed(
        &self,
        ch: &Channel,
        mut sink: PubSubSink,
        epoch: u64,
    ) -> Result<(), redis::RedisError> {
        let mut subscribed = ch.subscribed.lock().await;
        if *subscribed != Some(epoch) {
            tokio::time::timeout(self.timeouts.response, sink.subscribe(&ch.name))
                .await
                .map_err(|_| io_timeout("SUBSCRIBE"))??;
            *subscribed = Some(epoch);
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
        if let (Some(epoch), Some((mut sink, live_epoch))) = (*subscribed, live)
            && epoch == live_epoch
        {
            let unsub = tokio::time::timeout(self.timeouts.response, sink.unsubscribe(&ch.name));
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
            return;
        };
        for waiter in lock(&ch.waiters).values() {
            if payload.is_empty() || waiter.token.as_deref() == Some(payload) {
                waiter.notify.notify_one();
            }
        }
    }

    fn wake_all(&self) {
        for ch in self.channels_snapshot() {
            for waiter in lock(&ch.waiters).values() {
                waiter.notify.notify_one();
            }
        }
    }
}

/// Reads messages; when the connection drops, reconnects, resubscribes every channel
/// that still has waiters, wakes them all (messages may have been missed), and goes on
/// reading the new connection. Ends when nobody waits any more or the client is gone.
async fn dispatch(inner: Weak<Inner>, mut stream: PubSubStream, mut epoch: u64) {
    loop {
        while let Some(msg) = stream.next().await {
            let Some(inner) = inner.upgrade() else { return };
            inner.deliver(msg.get_channel_name(), msg.get_payload_bytes());
        }
        {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            let mut conn = lock(&strong.conn);
            if conn.as_ref().is_some_and(|(_, e)| *e == epoch) {
                *conn = None;
            }
            drop(conn);
            tracing::debug!("pub/sub connection lost; reconnecting");
            // Until the resubscribe succeeds, waiters rely on their lease-bounded timers.
            strong.wake_all();
        }
        let mut delay = Duration::from_millis(20);
        loop {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            if strong.channels_snapshot().is_empty() {
                return; // nobody waits: the next subscribe connects again
            }
            match strong.connect().await {
                Ok(((sink, new_epoch), new_stream)) => {
                    for ch in strong.channels_snapshot() {
                        if !lock(&ch.waiters).is_empty()
                            && let Err(e) =
                                strong.ensure_subscribed(&ch, sink.clone(), new_epoch).await
                        {
                            tracing::debug!(error = %e, channel = %ch.name, "resubscribe failed");
                        }
                    }
                    strong.wake_all();
                    match new_stream {
                        Some(s) => {
                            stream = s;
                            epoch = new_epoch;
                            break;
                        }
                        None => return, // another caller connected; its dispatcher reads
                    }
                }
                Err(e) => tracing::debug!(error = %e, "pub/sub reconnect failed"),
            }
            drop(strong);
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
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
