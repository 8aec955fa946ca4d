//! The entry point: a [`Client`] holds the connection to Redis and hands out locks.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::admin::{self, Broken, Eviction, Listing, LockStatus, Resize};
use crate::engine::Grant;
use crate::engine::watchdog::Watchdog;

use crate::backend::{Access, AppClient, Backend, Timeouts, redact};
use crate::delay_queue::DelayQueue;
use crate::detach::DetachedLock;
use crate::election::Election;
use crate::error::Error;
use crate::fence::FencedWrite;
use crate::guard::{Holding, LockGuard};
use crate::keys;
use crate::keys::LockKeys;
use crate::limits::MIN_LEASE;
use crate::limits::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_RESPONSE_TIMEOUT, DEFAULT_RESTART_PROTECTION,
    MAX_TIMEOUT,
};
use crate::lock::{LockBuilder, LockKind};
use crate::multi::MultiLockBuilder;
use crate::rwlock::{ReadLockBuilder, ReadLockKind};
use crate::semaphore::{SemaphoreBuilder, SemaphoreKind};
use crate::shared::Shared;

/// A connection to one Redis node, shared by every lock taken through it.
///
/// Cheap to clone; clones share the connection. The connection is multiplexed (many
/// locks, one socket) and reconnects by itself after a failure. A client belongs to the
/// Tokio runtime it was connected in: its connection and its watchdog run there, so
/// create one client per runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fencelock::Error> {
/// # let redis = testkit::RedisServer::start();
/// # let url = redis.url();
/// let client = fencelock::Client::connect(&url).await?; // url: "redis://127.0.0.1:6379"
/// let guard = client.lock("nightly-job").try_acquire().await?;
/// // Another holder of the same client (or any other) is refused while it is held.
/// assert!(client.lock("nightly-job").try_acquire().await.is_err());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Shared>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Client {
    /// Connects with default settings. See [`ClientBuilder`] for what they are.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the URL does not parse, [`Error::Unavailable`]
    /// when nothing answers there within the connect timeout, [`Error::Rejected`] when
    /// the server refuses the credentials.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-made connection.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::builder(url).connect().await
    }

    /// Starts configuring a client for the Redis node at `url`:
    /// `redis://[user:password@]host[:port][/db]`, `redis+unix:///path[?db=N]`, a
    /// Sentinel-managed master (`redis+sentinel://host:port[,host:port...]/SERVICE[/DB]`),
    /// or a Redis Cluster (`redis+cluster://host:port[,host:port...]`, one lock service:
    /// each lock on the master of its slot); `rediss...` for TLS.
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        Self::redlock([url])
    }

    /// Starts configuring a client that reaches Redis through the application's own
    /// `redis::Client` (redis-rs, re-exported as [`fencelock::redis`](crate::redis)),
    /// reusing what it was configured with: its address (a server or a Unix socket),
    /// TLS with its certificates and verification choice, its user and password, its
    /// database and protocol. fencelock opens its own connections from it (a multiplexed
    /// one for its calls, one for release notifications), never the application's.
    ///
    /// The timeouts of a connection are not part of a `redis::Client` (redis-rs sets
    /// them per connection): fencelock's apply ([`ClientBuilder::connect_timeout`],
    /// [`ClientBuilder::response_timeout`]), as do its other settings. The TLS, user and
    /// password settings of the builder are the client's, and refused
    /// ([`Error::InvalidArgument`] at connect); a `redis::Client` is one node, not
    /// Redlock or Sentinel.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let redis = testkit::RedisServer::start();
    /// # let url = redis.url();
    /// // The application's client, configured once.
    /// let app = fencelock::redis::Client::open(url.as_str())?;
    /// let locks = fencelock::Client::from_redis(app.clone()).connect().await?;
    /// locks.lock("nightly").try_acquire().await?.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn from_redis(client: redis::Client) -> ClientBuilder {
        ClientBuilder {
            app: Some(AppClient::Redis(Box::new(client))),
            ..Self::redlock(Vec::<String>::new())
        }
    }

    /// Starts configuring a client of a Redis Cluster that the application already
    /// reaches with redis-rs: `make` builds the application's
    /// [`ClusterClientBuilder`](redis::cluster::ClusterClientBuilder) (its seeds, TLS
    /// certificates, user and password, connection and response timeouts, retries).
    /// fencelock calls it for each cluster client it needs (its calls, its sharded
    /// pub/sub) and adds only what it needs: reads from masters only (a lock must never
    /// be read from a replica that lags), and RESP3 pushes for pub/sub. The bound on each
    /// call is still fencelock's ([`ClientBuilder::response_timeout`]).
    ///
    /// A builder rather than a `ClusterClient`: a built cluster client cannot be given
    /// a routing strategy or a push sender any more. The builder's user, password and
    /// TLS settings are refused as for [`from_redis`](Self::from_redis).
    pub fn from_redis_cluster<F>(make: F) -> ClientBuilder
    where
        F: Fn() -> redis::cluster::ClusterClientBuilder + Send + Sync + 'static,
    {
        ClientBuilder {
            app: Some(AppClient::Cluster(Arc::new(make))),
            ..Self::redlock(Vec::<String>::new())
        }
    }

    /// Starts configuring a Redlock client over independent Redis masters (not replicas
    /// of each other, not a Redis Cluster, whose URLs are refused with
    /// [`Error::InvalidArgument`]): an odd number, at least 3. With one URL this is
    /// [`Client::builder`].
    ///
    /// Every node is asked at once, each with a short timeout, and a lock is held when a
    /// majority granted it with time to spare (validity = TTL − elapsed − 1% of the TTL
    /// − 2 ms). It survives a minority of nodes being down, and there is no replica to
    /// fail over to, so the failover hazard of a single master is gone. Errors name each
    /// node and what it said ([`Error::NoQuorum`]). What it does not fix: it still
    /// assumes bounded pauses and clock drift (a holder paused past its lease is not
    /// stopped: fence the resource), and a node that restarts without the keys it held
    /// could vote again, which restart protection prevents
    /// ([`ClientBuilder::restart_protection`]). Fencing tokens are the highest of the
    /// granting nodes' counters, and a release raises every counter to it. (Guide:
    /// *Topologies and servers*.)
    ///
    /// Nodes are told apart by what each server says it is (its run id), not by the URL
    /// text: URLs that name one server twice (`localhost` and `127.0.0.1`, a `/0` added)
    /// are refused at connect with [`Error::InvalidArgument`]; a node that could not be
    /// asked then is identified by its first answer, and a second name of a server gets
    /// no vote.
    ///
    /// Redlock locks support waiting, leases and fencing tokens; fair mode, reentrancy
    /// and delay queues need a single node, and say so with
    /// [`Error::InvalidArgument`].
    pub fn redlock<I, S>(urls: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder {
            urls: urls.into_iter().map(Into::into).collect(),
            node_timeout: None,
            restart_protection: Some(DEFAULT_RESTART_PROTECTION),
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            renewal_batch: crate::limits::RENEWAL_BATCH,
            counter_idle: crate::limits::FENCE_COUNTER_IDLE,
            access: Access::default(),
            app: None,
        }
    }

    /// Starts configuring the lock called `name`. Nothing is sent until
    /// [`LockBuilder::acquire`] or [`LockBuilder::try_acquire`].
    pub fn lock(&self, name: impl Into<String>) -> LockBuilder {
        LockBuilder::new(self.inner.clone(), name.into(), LockKind::default())
    }

    /// Starts a leader election called `name`: campaign to lead it, ask who leads,
    /// follow changes ([`Election`]). Nothing is sent until one of those is called. The
    /// name is a lock's name (the leader holds the lock of that name): give other locks
    /// other names.
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(self.inner.clone(), name.into())
    }

    /// Starts configuring several locks taken at once, every one or none
    /// ([`MultiLockBuilder`]): one guard holds them all, each name with its own
    /// fencing token. Callers may give the names in any order: they are taken in one
    /// global order, so overlapping sets never deadlock. Nothing is sent until
    /// [`MultiLockBuilder::acquire`] or [`MultiLockBuilder::try_acquire`].
    pub fn lock_all<I>(&self, names: I) -> MultiLockBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        MultiLockBuilder::for_names(
            self.inner.clone(),
            names.into_iter().map(Into::into).collect(),
        )
    }

    /// Takes over a lock another guard let go of with [`LockGuard::detach`], in this
    /// process or in another (see [`DetachedLock::from_text`]): one owner-checked extend confirms that the lock is
    /// still held with that holder token and resets its lease, then the guard renews it
    /// as the detached one did (its lease length, its renewal setting, what was left of
    /// its maximum hold) and keeps its fencing token. The client must reach the same
    /// servers with the same key prefix.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), fencelock::Error> {
    /// # let server = testkit::RedisServer::start();
    /// # let client = fencelock::Client::connect(&server.url()).await?;
    /// let guard = client.lock("report").try_acquire().await?;
    /// let text = guard.detach().to_text(); // for another process, through a pipe
    /// // ... in that process:
    /// let lock = fencelock::DetachedLock::from_text(&text)?;
    /// let guard = client.attach(lock).await?; // held, renewed, the same fencing token
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease ran out meanwhile or another holder has the
    /// lock (cause [`MaxHold`](crate::LossCause::MaxHold) when the maximum hold is
    /// over); [`Error::InvalidArgument`] for a name this client's prefix cannot make a
    /// key of; [`Error::Unavailable`], [`Error::Rejected`], [`Error::WrongType`].
    ///
    /// A detached lock is attached once per holding: once its guard released it (even
    /// if that release failed: one that could not reach Redis may be sent again later,
    /// see [`LockGuard::release`]), its text must not be attached again.
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the extend may or may not have happened, and no guard
    /// holds the lock: attach a clone of the detached lock again.
    pub async fn attach(&self, lock: DetachedLock) -> Result<LockGuard, Error> {
        attach(&self.inner, lock).await
    }

    /// Starts configuring the semaphore called `name`, with `permits` permits: a lock that
    /// up to `permits` holders hold at once, each its own permit as a lease
    /// ([`SemaphoreBuilder`], which says what differs from a lock). Nothing is sent
    /// until an acquire.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), fencelock::Error> {
    /// # let redis = testkit::RedisServer::start();
    /// # let client = fencelock::Client::connect(&redis.url()).await?;
    /// let exports = client.semaphore("exports", 2); // at most 2 exports at once
    /// let first = exports.try_acquire().await?;
    /// let second = exports.try_acquire().await?;
    /// assert_ne!(first.fencing_token(), second.fencing_token());
    /// match exports.try_acquire().await {
    ///     // "all 2 permits are held; the first lease ends in about 30s"
    ///     Err(fencelock::Error::Held { blocked_by, .. }) => println!("busy: {blocked_by}"),
    ///     other => panic!("{other:?}"),
    /// }
    /// first.release().await?;
    /// let third = exports.try_acquire().await?; // the freed permit
    /// # second.release().await?;
    /// # third.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> SemaphoreBuilder {
        SemaphoreBuilder::new(self.inner.clone(), name.into(), SemaphoreKind::new(permits))
    }

    /// Starts configuring the read side of the read-write lock called `name`: many
    /// readers at once, each with a lease of its own, while no writer holds it. Its write
    /// side is [`lock`](Self::lock) of the same name (plain or
    /// [reentrant](LockBuilder::reentrant)). A writer that waits goes before new readers
    /// ([`ReadLockBuilder`] states the policy and what differs from a lock). Nothing
    /// is sent until an acquire.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), fencelock::Error> {
    /// # let redis = testkit::RedisServer::start();
    /// # let client = fencelock::Client::connect(&redis.url()).await?;
    /// let a = client.read_lock("prices").try_acquire().await?;
    /// let b = client.read_lock("prices").try_acquire().await?; // readers share it
    /// match client.lock("prices").try_acquire().await {
    ///     // "2 readers hold it; the first lease ends in about 30s"
    ///     Err(fencelock::Error::Held { blocked_by, .. }) => println!("busy: {blocked_by}"),
    ///     other => panic!("{other:?}"),
    /// }
    /// let last = b.fencing_token();
    /// a.release().await?;
    /// b.release().await?;
    /// let writer = client.lock("prices").try_acquire().await?;
    /// assert!(writer.fencing_token() > last); // higher than every reader's
    /// # writer.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn read_lock(&self, name: impl Into<String>) -> ReadLockBuilder {
        ReadLockBuilder::new(self.inner.clone(), name.into(), ReadLockKind::default())
    }

    /// The delay queue called `name` on this client's node, under its key prefix. Nothing
    /// is sent to Redis; the queue's keys appear with the first push.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name lock names would not accept either (see
    /// [`keys::validate_name`]), or on a Redlock client: a queue lives on one Redis, so
    /// use a single-node client for it.
    pub fn delay_queue(&self, name: impl Into<String>) -> Result<DelayQueue, Error> {
        if self.inner.backend.is_redlock() {
            return Err(Error::invalid(
                "delay queue",
                "a delay queue lives on one Redis node; make it with a single-node client",
            ));
        }
        DelayQueue::new(self.inner.clone(), name.into())
    }

    /// Writes to a resource kept in the Redis of this client, applied only if `token`
    /// is at least the highest fencing token the resource `resource` accepted: the
    /// resource's own check of the token (see [`fence`](crate::fence)). Add the writes
    /// to the [`FencedWrite`], then [`apply`](FencedWrite::apply) it. Name the resource
    /// after the lock whose token it checks (`guard.name()`). This client may be
    /// another than the lock's: the resource's Redis need not hold the lock.
    pub fn fenced_write(
        &self,
        resource: impl Into<String>,
        token: crate::FencingToken,
    ) -> FencedWrite<'_> {
        FencedWrite::new(&self.inner, resource.into(), token)
    }

    /// What Redis holds for the lock `name`, on each node, read in one consistent
    /// snapshot per node: who holds it and for how long, the fencing counter, the fair
    /// queue, and what the holder said about itself. Writes nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name; a node's error when no node answered.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn inspect(&self, name: &str) -> Result<LockStatus, Error> {
        admin::inspect(&self.inner.backend, &self.inner.prefix, name).await
    }

    /// Sets the permit count of the semaphore `name` ([`semaphore`](Self::semaphore))
    /// to `permits`, and wakes as many waiters as that frees permits. Held permits are
    /// never revoked: after a shrink below what is held, no permit is granted until
    /// releases and expiries bring the holders under the new count. Clients that still
    /// ask for the old count get [`Error::PermitsMismatch`] from then on: change the
    /// count they ask for with it. Says the count before and the permits held.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name or count, or on Redlock;
    /// [`Error::WrongType`] if the name is another kind of primitive; the node's error.
    ///
    /// # Cancel safety
    /// If dropped, the count may or may not have changed.
    pub async fn set_permits(&self, name: &str, permits: u32) -> Result<Resize, Error> {
        admin::set_permits(&self.inner.backend, &self.inner.prefix, name, permits).await
    }

    /// The locks held now whose names match `pattern` (a Redis glob over names: `*`,
    /// `?`, `[...]`; empty for all), under this client's prefix, found by `SCAN` (never
    /// `KEYS`) on every node, sorted by name; with the nodes that could not be asked
    /// (a Redlock node down), whose locks may be missing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad pattern; a node's error when no node
    /// answered, or when a lock could not be read.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list(&self, pattern: &str) -> Result<Listing, Error> {
        admin::list(&self.inner.backend, &self.inner.prefix, pattern).await
    }

    /// Which of this client's servers can evict lock keys (a `maxmemory` limit with a
    /// `maxmemory-policy` other than `noeviction`; see [`EvictionRisk`](crate::EvictionRisk) for what that
    /// costs), read with `INFO memory` on every node (every master of a cluster). The
    /// client also reads it by itself, once per connection, and warns (a `WARN` tracing
    /// event, once per server and policy). A server that refuses `INFO` (renamed away, as
    /// some managed services do, or not allowed to the Redis user), or whose answer
    /// lacks the policy, is listed in [`Eviction::unknown`] with why: whether it can
    /// evict lock keys is unknown (warned of too).
    ///
    /// # Errors
    /// A node's error when no node answered; the others are listed in
    /// [`Eviction::unanswered`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn eviction_risks(&self) -> Result<Eviction, Error> {
        admin::eviction_risks(&self.inner.backend).await
    }

    /// Breaks a stuck lock, whoever holds it: deletes its key (and holder info) on every
    /// node, wakes its waiters, and advances the fencing counter past every token handed
    /// out, so that a resource that checks tokens refuses the evicted holder's late
    /// writes once the next holder has written. Says what it broke. For operators: the
    /// evicted holder is not told, and learns of it at its next renewal. On a
    /// [semaphore](Self::semaphore) it breaks every permit held (its count stays), and
    /// wakes a waiter per permit.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name; [`Error::WrongType`] (per node) for a
    /// key of data fencelock did not write, which is left alone; a node's error when no
    /// node answered.
    ///
    /// # Cancel safety
    /// If dropped, the break may or may not have happened on each node.
    pub async fn break_lock(&self, name: &str) -> Result<Broken, Error> {
        admin::break_lock(&self.inner.backend, &self.inner.prefix, name).await
    }

    /// The node this client talks to, as `host:port` (the first one, for Redlock; the
    /// current master, for a Sentinel-managed one; the seeds, `host:port,host:port`, for a
    /// Redis Cluster).
    pub fn node(&self) -> String {
        self.inner.backend.nodes()[0].addr()
    }

    /// Every node, as `host:port`, in the order given.
    pub fn nodes(&self) -> Vec<String> {
        self.inner
            .backend
            .nodes()
            .iter()
            .map(|n| n.addr())
            .collect()
    }

    /// This client's random tag: how a lock's wake list names it while one of its
    /// acquires waits ([`LockState::waiting_clients`](crate::LockState::waiting_clients)),
    /// and the end of its own release channels ([`keys`](crate::keys)).
    pub fn tag(&self) -> &str {
        self.inner.backend.client_tag()
    }

    /// What this client holds open right now: channels it is subscribed to, waiters
    /// registered on them, and background releases in flight. Meant for monitoring and
    /// for tests that check a cancelled wait left nothing behind.
    pub fn stats(&self) -> ClientStats {
        let (mut channels, mut waiters) = (0, 0);
        for node in self.inner.backend.nodes() {
            let sub = node.subscriber().stats();
            channels += sub.channels;
            waiters += sub.waiters;
        }
        ClientStats {
            subscribed_channels: channels,
            waiters,
            background_tasks: self.inner.backend.background().len(),
            watched_leases: self.inner.watchdog.len(),
        }
    }

    /// Waits until every release this client sent in the background has finished: those
    /// of guards dropped unreleased and of acquires abandoned with an unknown outcome,
    /// and a Redlock operation's calls to the nodes that had not answered when it did.
    ///
    /// Call it before a short-lived program exits, since a runtime that shuts down
    /// cancels its tasks, and a cancelled release leaves the key to its TTL. Each
    /// background release is bounded by the client's timeouts, so this returns within
    /// twice the connect timeout plus the response timeout of the last one started.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits; the releases go on in the background.
    pub async fn flush(&self) {
        let tracker = self.inner.backend.background();
        tracker.close();
        tracker.wait().await;
        tracker.reopen();
    }
}

/// A snapshot of what a [`Client`] holds open; see [`Client::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Release channels subscribed to (one per lock name with waiters, and for plain and
    /// fair waiters also this client's own channel of that name, until the unsubscribe
    /// after the last waiter left has gone through), summed over the nodes of a Redlock
    /// client.
    pub subscribed_channels: usize,
    /// Waiters registered for release notifications (a Redlock waiter registers on
    /// every node, and counts once per node).
    pub waiters: usize,
    /// Releases of dropped guards and abandoned acquires still in flight, and Redlock
    /// calls still under way after their operation answered.
    pub background_tasks: usize,
    /// Leases of held locks the watchdog keeps alive or watches for expiry.
    pub watched_leases: usize,
}

/// Settings of a [`Client`]. Every setting has a default, listed with its method.
#[derive(Clone)]
pub struct ClientBuilder {
    urls: Vec<String>,
    node_timeout: Option<Duration>,
    restart_protection: Option<Duration>,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    renewal_batch: usize,
    counter_idle: Duration,
    access: Access,
    /// The application's own driver client, in place of `urls`.
    app: Option<AppClient>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field(
                "urls",
                &self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>(),
            )
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("node_timeout", &self.node_timeout)
            .field("restart_protection", &self.restart_protection)
            .field("renewal_batch", &self.renewal_batch)
            .field("counter_idle", &self.counter_idle)
            .field("access", &self.access)
            .field("app", &self.app)
            .finish()
    }
}

impl ClientBuilder {
    /// The prefix of every key (default `"fencelock"`; may be empty). It may not contain
    /// `{` or `}`. See the [key layout](crate::keys).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one connection attempt may take (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for a reply to one command (default 1 s). A command that gets no
    /// reply in time fails with [`Error::Unavailable`]; no call ever takes longer than
    /// twice the connect timeout plus the response timeout, reconnecting included.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Redlock: how long each node may take to answer its share of an acquire or
    /// extend (default: a twentieth of the lease, between 5 ms and the response
    /// timeout). A node slower than this counts as unavailable for that attempt.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// Redlock restart protection (default on, with 30 s). A node that restarted less
    /// than `quarantine` ago — or less than the longest lease this client asks for, if
    /// that is longer — may have lost keys it held when it went down, so its grants do
    /// not count until that much time has passed since it came back. `None` turns it
    /// off: only do that if every node persists every write (`appendfsync always`) or
    /// you accept two holders after a crash and restart.
    pub fn restart_protection(mut self, quarantine: Option<Duration>) -> Self {
        self.restart_protection = quarantine;
        self
    }

    /// How many leases the watchdog renews with one script call (default
    /// [`RENEWAL_BATCH`](crate::limits::RENEWAL_BATCH), 1,000; from 1 to
    /// [`MAX_RENEWAL_BATCH`](crate::limits::MAX_RENEWAL_BATCH)). One node runs one call
    /// at a time, and a renewal costs it a few microseconds (docs/benchmarks.md), so a
    /// batch of 1,000 holds the server for a few milliseconds, during which every other
    /// client's command waits; the batches of one node
    /// go one after another. A client holding many leases may raise it to send fewer
    /// calls (on a cluster, one call per master and tick needs a batch as large as the
    /// leases due on one master in a tick: about a sixth of them), at the price of
    /// longer stalls for everyone else on that server; lower it to shorten them.
    pub fn renewal_batch(mut self, leases: usize) -> Self {
        self.renewal_batch = leases;
        self
    }

    /// How long a lock's fencing counter (`PREFIX:{NAME}:fence`) stays in Redis after
    /// the last grant of that lock (default
    /// [`FENCE_COUNTER_IDLE`](crate::limits::FENCE_COUNTER_IDLE), 7 days; at least 1 s;
    /// `Duration::ZERO`: for ever). A service that locks one
    /// name per order or per user leaves no key behind for the names it stops using.
    ///
    /// Tokens keep increasing when a counter expired: the next grant reseeds it from
    /// the server clock in microseconds, and every token is at least that clock when it
    /// was minted. So they hold as long as the server clock has not stepped back by more
    /// than this idle time since the lock's last grant (and tokens were not minted faster
    /// than one per microsecond, which one server cannot do). Every client that takes a
    /// lock sets its counter's expiry at each grant: clients with different settings
    /// leave the one of the last grant.
    pub fn fence_counter_idle(mut self, idle: Duration) -> Self {
        self.counter_idle = idle;
        self
    }

    /// The ACL user to log in as on every node, instead of the one in the URLs (for a
    /// Sentinel URL: on the master; the sentinels' own user goes in the URL's
    /// `sentinel_username`). See the guide's security chapter for the least privilege a
    /// fencelock user needs.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.access.username = Some(username.into());
        self
    }

    /// The password to log in with on every node, instead of the one in the URLs, so that
    /// it need not be written into a URL. Never shown: not in errors, `Debug` output or
    /// traces.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.access.password = Some(password.into());
        self
    }

    /// TLS (`rediss://` URLs): trust the CA certificate(s) in this PEM file instead of
    /// the system's roots (default: the system's roots). Read when the client connects;
    /// an unreadable file is [`Error::InvalidArgument`].
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.access.tls.ca_file = Some(path.into());
        self
    }

    /// TLS: present this client certificate and key (PEM files) to servers that ask for
    /// one (mutual TLS, `tls-auth-clients yes`). Default: none.
    pub fn tls_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.access.tls.client = Some((cert.into(), key.into()));
        self
    }

    /// TLS: skip verifying the server's certificate and host name (default `false`).
    /// Anyone on the path can then pose as the server: only for tests, or a server
    /// reached through a tunnel you trust.
    pub fn tls_insecure_skip_verify(mut self, skip: bool) -> Self {
        self.access.tls.insecure = skip;
        self
    }

    /// Validates the settings and connects. A Redlock client asks every node who it is
    /// (each within the node timeout if set, else 250 ms) but does not need them all to
    /// answer: a minority may be down.
    ///
    /// # Errors
    /// As [`Client::connect`], and [`Error::InvalidArgument`] for a bad prefix, a zero
    /// timeout, or Redlock URLs that name one server more than once.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect(self) -> Result<Client, Error> {
        self.open(true).await
    }

    /// Validates the settings and sets the client up without waiting for its node to
    /// answer: the first acquire connects. For a program that may start while Redis is
    /// down or restarting: with a [wait](crate::LockBuilder::wait), an acquire rides out
    /// an unreachable node until the wait ends (then [`Error::Unavailable`]). A Redlock
    /// client is made this way whatever the method (a minority may be down), except
    /// that [`connect`](Self::connect) asks every node that answers who it is.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad URL or setting; connection problems come
    /// with the first acquire.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect_lazy(self) -> Result<Client, Error> {
        self.open(false).await
    }

    async fn open(self, eager: bool) -> Result<Client, Error> {
        let timeouts = self.checked()?;
        let mut backend = self.backend(timeouts, eager).await?;
        backend.set_counter_idle(self.counter_idle);
        Ok(Client {
            inner: Arc::new(Shared {
                watchdog: Watchdog::new(backend.clone(), self.renewal_batch),
                backend,
                prefix: self.prefix,
            }),
        })
    }

    /// The settings checked (typed errors, nothing sent), and the timeouts.
    fn checked(&self) -> Result<Timeouts, Error> {
        keys::validate_prefix(&self.prefix)?;
        for (what, t) in [
            ("connect timeout", self.connect_timeout),
            ("response timeout", self.response_timeout),
        ] {
            Error::check_range(what, t, Duration::from_millis(1), MAX_TIMEOUT)?;
        }
        if !self.counter_idle.is_zero() {
            Error::check_range(
                "fence counter idle time",
                self.counter_idle,
                Duration::from_secs(1),
                Duration::from_secs(100 * 365 * 24 * 3600),
            )?;
        }
        if !(1..=crate::limits::MAX_RENEWAL_BATCH).contains(&self.renewal_batch) {
            return Err(Error::invalid(
                "renewal batch",
                format!(
                    "{} leases per call; give 1 to {}",
                    self.renewal_batch,
                    crate::limits::MAX_RENEWAL_BATCH
                ),
            ));
        }
        Ok(Timeouts {
            connect: self.connect_timeout,
            response: self.response_timeout,
        })
    }

    /// Where the locks will live: the application's client, one node, or Redlock's.
    async fn backend(&self, timeouts: Timeouts, eager: bool) -> Result<Backend, Error> {
        Ok(match (&self.app, self.urls.len()) {
            (Some(app), _) => {
                if self.access.username.is_some()
                    || self.access.password.is_some()
                    || self.access.tls.given()
                {
                    return Err(Error::invalid(
                        "client settings",
                        "the user, password and TLS settings come with the application's \
                         redis-rs client: set them there",
                    ));
                }
                Backend::app(app, timeouts, eager).await?
            }
            (None, 1) => Backend::single(&self.urls[0], timeouts, &self.access, eager).await?,
            (None, n) if n >= 3 && n % 2 == 1 => {
                for (i, url) in self.urls.iter().enumerate() {
                    if self.urls[..i].contains(url) {
                        return Err(Error::invalid(
                            "Redis URLs",
                            format!("{} is given twice", redact(url)),
                        ));
                    }
                }
                Backend::redlock(
                    &self.urls,
                    timeouts,
                    &self.access,
                    self.node_timeout,
                    self.restart_protection,
                    eager,
                )
                .await?
            }
            (None, n) => {
                return Err(Error::invalid(
                    "Redis URLs",
                    format!("{n} given; give one, or an odd number of at least 3 for Redlock"),
                ));
            }
        })
    }
}

/// [`Client::attach`]: confirms with one owner-checked extend that `lock` is still held,
/// and watches its lease from then on.
async fn attach(shared: &Arc<Shared>, lock: DetachedLock) -> Result<LockGuard, Error> {
    let keys = LockKeys::new(&shared.prefix, &lock.name)?;
    let max_hold_left = lock.max_hold_end.map(|end| {
        end.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    });
    let hold_until = max_hold_left.map(|left| Instant::now() + left);
    // Not past the maximum hold: the confirming extend ends there at the latest.
    let (ttl, capped) = match max_hold_left {
        Some(left) if left < MIN_LEASE => {
            return Err(Error::LeaseLost {
                name: lock.name,
                cause: crate::LossCause::MaxHold,
            });
        }
        Some(left) if left <= lock.ttl => (left, true),
        _ => (lock.ttl, false),
    };
    let holder = lock.protocol.holder_id(&lock.token).into_owned();
    let (sent_at, valid_until) = shared
        .backend
        .extend(&lock.name, &keys, &holder, ttl)
        .await?;
    let grant = Grant {
        fence: lock.fence,
        sent_at,
        ttl,
        valid_until,
    };
    Ok(LockGuard::watched(
        shared.clone(),
        lock.name,
        Holding {
            keys,
            token: lock.token,
            protocol: lock.protocol,
            asked_ttl: ttl,
            ttl: lock.ttl,
            renew: lock.renew,
            hold_until,
        },
        &grant,
        capped,
    ))
}
