//! One node of a backend: a connection with explicit timeouts, script calls on it, and
//! its release notifications; what its calls fail with is said by [`super::errors`].
//!
//! A node is a standalone server (at a fixed address, or a Sentinel-managed master whose
//! address follows failovers) or a whole Redis Cluster, which is one logical node: its
//! calls are routed by slot ([`super::cluster`]). Callers see the same methods for both;
//! what differs is behind [`Link`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind};
use tokio_util::sync::CancellationToken;

use super::access::{self, Access, Timeouts};
use super::capabilities::{self, Capabilities};
use super::cluster::{ClusterLink, ClusterUrl, MakeCluster};
use super::errors::{
    Scheme, code, is_timeout, link_broke, link_failed, map_error, new_connection_hint, refused,
    timed_out,
};
use super::eviction::{self, EvictionRisk, PolicyUnknown};
use super::sentinel::{self, SentinelUrl};
use super::stall::{self, Stall};
use super::subscriber::{HandOn, Source, Subscriber};
use crate::error::{Error, UnavailableReason};
use crate::keys::LockKeys;
use crate::scripts::replies::{Owned, Renewed};
use crate::scripts::{self, Call, Flavor, Lua};

/// One node: a connection that reconnects by itself, shared by every lock of a client.
/// Cheap to clone.
#[derive(Clone)]
pub(crate) struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    link: Link,
    timeouts: Timeouts,
    /// The longest one call may take, reconnecting included.
    call_timeout: Duration,
    /// Release notifications for waiters; connects on first use.
    subscriber: Subscriber,
    /// Redlock: what this node said about itself last.
    health: Mutex<Health>,
    /// How many calls failed: each may have made the driver reconnect (see
    /// [`Node::generation`]).
    failures: AtomicU64,
    /// The scripts known loaded on the connection of a generation.
    loaded: Loaded,
    /// What the server offers (a cluster: every master), as last learned, and the
    /// generation it holds for: a call that finds a later generation has it asked again
    /// (see [`Node::flavor`]).
    offers: Mutex<Option<(u64, Capabilities)>>,
    /// Held while the server is asked what it offers: the first time, one call asks and
    /// those beside it wait for the answer; later, one ask at a time.
    learning: tokio::sync::Mutex<()>,
    /// The server said, when asked in the background, that fencelock does not serve it
    /// (a Sentinel, a server too old): every call is refused so, until it says otherwise.
    unfit: Mutex<Option<Unfit>>,
    /// One more than the generation whose connection had its memory policy read (0:
    /// none yet): the policy is read once per connection.
    eviction_checked: AtomicU64,
    /// The servers warned about, each with the policy it was warned for: a warning is
    /// written once per server and policy.
    eviction_warned: Mutex<Vec<(String, String)>>,
    /// Whether a subscription refused by the server's ACL was warned of (once per node).
    channel_refusal_warned: AtomicBool,
    /// Cancelled when the node is dropped: its Sentinel watcher stops.
    closed: CancellationToken,
}

impl Inner {
    /// A node's shared state around its `link`, before any call.
    fn new(link: Link, timeouts: Timeouts, call_timeout: Duration, subscriber: Subscriber) -> Self {
        Inner {
            link,
            timeouts,
            call_timeout,
            subscriber,
            health: Mutex::new(Health::default()),
            failures: AtomicU64::new(0),
            loaded: Loaded::default(),
            offers: Mutex::new(None),
            learning: tokio::sync::Mutex::new(()),
            unfit: Mutex::new(None),
            eviction_checked: AtomicU64::new(0),
            eviction_warned: Mutex::new(Vec::new()),
            channel_refusal_warned: AtomicBool::new(false),
            closed: CancellationToken::new(),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// How calls reach the node.
enum Link {
    /// One server: at a fixed address, or a Sentinel-managed master.
    Standalone(Box<Standalone>),
    /// A Redis Cluster, as one logical node.
    Cluster(Box<ClusterLink>),
}

/// A standalone server's connection.
struct Standalone {
    /// Sentinel: how to find the master; `None` for a fixed address.
    sentinel: Option<SentinelUrl>,
    /// The connection in use, and the address it goes to.
    current: RwLock<Arc<Current>>,
    /// Held while the sentinels are asked, so that one caller asks and the others wait.
    resolving: tokio::sync::Mutex<()>,
    timeouts: Timeouts,
    call_timeout: Duration,
    /// Whether the server stopped answering on the connection, and what is held back
    /// meanwhile.
    stall: Stall,
    /// Releases that timed out (and may have been dropped unsent) or were lost with
    /// their connection (see [`Node::owe`]), sent again once the server answers, each
    /// with the times it was sent again; at most [`OWED_MAX`].
    owed: Mutex<VecDeque<(Call, u8)>>,
    /// Whether `owed` holds any (read on every reply).
    owing: AtomicBool,
    /// Whether a task is sending them again (one at a time).
    repaying: AtomicBool,
}

/// Why fencelock does not serve a server (a refusal of [`Node::flavor`]: code `SENTINEL`
/// or `VERSION`), as found by an ask in the background, kept to refuse every call so.
struct Unfit {
    node: String,
    code: String,
    message: String,
}

impl Unfit {
    /// The refusal `e` says, if it says fencelock does not serve the server.
    fn of(e: &Error) -> Option<Unfit> {
        match e {
            Error::Rejected {
                node,
                code,
                message,
            } if code == "SENTINEL" || code == "VERSION" => Some(Unfit {
                node: node.clone(),
                code: code.clone(),
                message: message.clone(),
            }),
            _ => None,
        }
    }

    fn error(&self) -> Error {
        Error::Rejected {
            node: self.node.clone(),
            code: self.code.clone(),
            message: self.message.clone(),
        }
    }
}

/// The scripts known loaded on the connection of one generation (see
/// [`Node::generation`]): a script's first call on a connection loads it in the same
/// write.
#[derive(Default)]
struct Loaded(Mutex<(u64, u32)>);

impl Loaded {
    /// Whether `lua` is known loaded on the connection of `generation`.
    fn has(&self, generation: u64, lua: Lua) -> bool {
        let loaded = lock(&self.0);
        loaded.0 == generation && loaded.1 & (1u32 << lua.index()) != 0
    }

    /// `lua` answered on the connection of `generation`: it is loaded there (an older
    /// generation's scripts are forgotten).
    fn mark(&self, generation: u64, lua: Lua) {
        let mut loaded = lock(&self.0);
        if loaded.0 != generation {
            *loaded = (generation, 0);
        }
        loaded.1 |= 1u32 << lua.index();
    }
}

/// How many lost releases a node keeps to send again; beyond that the oldest are
/// forgotten (their keys expire with their leases).
const OWED_MAX: usize = 1024;

/// How many times a kept release is sent again before it is forgotten.
const OWED_TRIES: u8 = 3;

/// Where calls go now; shared, since every call reads it (a clone of the client's
/// connection details would cost allocations per call).
struct Current {
    /// `host:port`, never with credentials: it goes into error messages.
    addr: String,
    client: redis::Client,
    conn: ConnectionManager,
    /// Bumped at every switch, so that a caller knows whether someone switched already.
    epoch: u64,
    /// Whether the server answered anything here yet (its setup, a script, `INFO`,
    /// `WAIT`): until it has, a connection it closes without a word says that the port
    /// is not a Redis server's (see [`first_error`]).
    answered: AtomicBool,
    /// Whether the server refused `SCRIPT LOAD` (renamed away, or not allowed to the
    /// user): scripts it lacks are then sent with `EVAL`, and `SCRIPT LOAD` is not tried
    /// again.
    no_script_load: AtomicBool,
}

/// What a Redlock client remembers of a node: who it is (two nodes that are one server
/// must not vote twice), and when it started (one that restarted recently may have lost
/// the locks it held, so it must not vote too soon).
///
/// Exported by `fencelock::model` (the `model` feature): the model checker's Redlock
/// clients keep it in their hashed state, hence `Clone`, `Eq` and `Hash`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Health {
    /// The server's run id when last seen; a change means it restarted.
    pub run_id: Option<String>,
    /// When the server process started, from its uptime when last asked (whole seconds,
    /// rounded towards earlier).
    pub up_since: Option<Instant>,
    /// The node's generation (`Node::generation`) when run id and uptime were last
    /// read: a server restarts only by closing its connections, so they stay true until
    /// the connection changes.
    pub identified_at: Option<u64>,
}

impl Health {
    /// Records what the node just said about itself on the connection of `generation`
    /// (`now`: when the answer came). Returns true if the run id replaced another one
    /// (the server restarted since it was last seen).
    pub fn observe(
        &mut self,
        run_id: &str,
        uptime: Duration,
        generation: u64,
        now: Instant,
    ) -> bool {
        let restarted = self.run_id.as_deref().is_some_and(|known| known != run_id);
        if self.run_id.as_deref() != Some(run_id) {
            self.run_id = Some(run_id.to_owned());
        }
        // Uptime counts whole seconds: the start lies up to a second before this.
        let up_since = now
            .checked_sub(uptime + Duration::from_secs(1))
            .unwrap_or(now);
        self.up_since = Some(match self.up_since {
            // The same process, asked again: both estimates lie before its true start,
            // so the later one is the closer.
            Some(known) if !restarted => known.max(up_since),
            _ => up_since,
        });
        self.identified_at = Some(generation);
        restarted
    }
}

fn manager_config(timeouts: Timeouts) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(Some(timeouts.response))
        // One quick retry: a lock caller would rather hear "unavailable" than wait
        // through a long reconnect schedule. Later calls reconnect again.
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(200))
}

/// The longest one call of a node may take, reconnecting included.
fn call_timeout(timeouts: Timeouts) -> Duration {
    timeouts.connect * 2 + timeouts.response + Duration::from_millis(250)
}

/// An application's own driver client, which fencelock connects through instead of a
/// URL ([`Client::from_redis`](crate::Client::from_redis),
/// [`Client::from_redis_cluster`](crate::Client::from_redis_cluster)).
#[derive(Clone)]
pub(crate) enum AppClient {
    /// One server, as the application's `redis::Client` reaches it.
    Redis(Box<redis::Client>),
    /// A Redis Cluster: what makes the application's cluster client builder, called for
    /// each client fencelock builds from it (commands, pub/sub).
    Cluster(MakeCluster),
}

impl std::fmt::Debug for AppClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // The address only: never the credentials the client carries.
            Self::Redis(client) => {
                write!(f, "redis::Client({})", client.get_connection_info().addr())
            }
            Self::Cluster(_) => f.write_str("redis::cluster::ClusterClientBuilder"),
        }
    }
}

/// Whether `url` names a Redis Cluster (`redis+cluster://`, `rediss+cluster://`).
pub(crate) fn is_cluster_url(url: &str) -> bool {
    url.starts_with("redis+cluster://") || url.starts_with("rediss+cluster://")
}

/// Where a standalone node's calls go first: the URL's server, or the master the
/// sentinels name (asked now if `eager`; else a placeholder that the first call
/// replaces).
async fn first_server(
    url: &str,
    sentinel: Option<&SentinelUrl>,
    access: &Access,
    call_timeout: Duration,
    eager: bool,
) -> Result<(String, redis::Client), Error> {
    match sentinel {
        None => {
            let client = access::client_for_url(url, access)?;
            Ok((client.get_connection_info().addr().to_string(), client))
        }
        Some(s) if eager => sentinel::resolve(s, call_timeout).await,
        // Not asked yet: the first call asks the sentinels.
        Some(s) => Ok((s.label(), s.master("0.0.0.0", 1)?)),
    }
}

/// A standalone node's connection to `client`: made now if `eager` (failing fast when
/// nothing answers within `call_timeout`), else by its first call.
async fn first_connection(
    addr: &str,
    client: &redis::Client,
    timeouts: Timeouts,
    call_timeout: Duration,
    eager: bool,
) -> Result<ConnectionManager, Error> {
    if !eager {
        return ConnectionManager::new_lazy_with_config(client.clone(), manager_config(timeouts))
            .map_err(|e| map_error(addr, client, &e));
    }
    let connecting = ConnectionManager::new_with_config(client.clone(), manager_config(timeouts));
    match tokio::time::timeout(call_timeout, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(first_error(addr, client, &e)),
        Err(_) => Err(timed_out(addr, call_timeout)),
    }
}

/// Release notifications from the server a standalone node talks to now: asked at every
/// (re)connection, so that a Sentinel node's subscriber follows its master.
fn following(node: &std::sync::Weak<Inner>, timeouts: Timeouts) -> Subscriber {
    let node = node.clone();
    let source = Source::Node(Arc::new(move || {
        let node = node.upgrade()?;
        match &node.link {
            Link::Standalone(s) => Some(read(&s.current).client.clone()),
            Link::Cluster(_) => None,
        }
    }));
    Subscriber::new(source, timeouts)
}

impl Node {
    /// Sets up the node at `url` (`redis://`, `redis+unix://`, `redis+sentinel://` or
    /// `redis+cluster://`, and their TLS forms). `eager`: connect now (for Sentinel:
    /// find the master now; for a cluster: learn its topology now), failing fast when
    /// nothing answers; otherwise the first call connects (a Redlock node, a minority of
    /// which may be down when the client starts, or a lazy client).
    pub async fn open(
        url: &str,
        timeouts: Timeouts,
        access: &Access,
        eager: bool,
    ) -> Result<Self, Error> {
        let call_timeout = call_timeout(timeouts);
        let node = match ClusterUrl::parse(url, access)? {
            Some(cluster) => Self::open_cluster(cluster, timeouts, call_timeout, eager).await?,
            None => {
                let sentinel = SentinelUrl::parse(url, access)?;
                let (addr, client) =
                    first_server(url, sentinel.as_ref(), access, call_timeout, eager).await?;
                Self::open_standalone(sentinel, addr, client, timeouts, call_timeout, eager).await?
            }
        };
        node.opened(eager).await
    }

    /// Sets up the node of an application's own driver client ([`AppClient`]): its
    /// address, TLS, credentials and database as the application configured them.
    pub async fn open_app(app: &AppClient, timeouts: Timeouts, eager: bool) -> Result<Self, Error> {
        let call_timeout = call_timeout(timeouts);
        let node = match app {
            AppClient::Redis(client) => {
                let addr = client.get_connection_info().addr().to_string();
                let client = (**client).clone();
                Self::open_standalone(None, addr, client, timeouts, call_timeout, eager).await?
            }
            AppClient::Cluster(make) => {
                let cluster = ClusterUrl::made_by(make.clone());
                Self::open_cluster(cluster, timeouts, call_timeout, eager).await?
            }
        };
        node.opened(eager).await
    }

    /// A node just set up: its subscriber handed on, and, `eager`, what its server offers
    /// learned now (a server too old, or not a Redis server, is refused at connect).
    async fn opened(self, eager: bool) -> Result<Self, Error> {
        let node = self.hands_on();
        if eager {
            node.learn_at_connect().await?;
        }
        Ok(node)
    }

    /// A Redis Cluster as one node, with sharded pub/sub for its release notifications.
    async fn open_cluster(
        cluster: ClusterUrl,
        timeouts: Timeouts,
        call_timeout: Duration,
        eager: bool,
    ) -> Result<Self, Error> {
        let subscriber = {
            let url = cluster.clone();
            let source =
                Source::Cluster(Arc::new(move |pushes| url.pubsub_client(timeouts, pushes)));
            Subscriber::new(source, timeouts)
        };
        let link = ClusterLink::open(cluster, timeouts, call_timeout, eager).await?;
        let link = Link::Cluster(Box::new(link));
        Ok(Self {
            inner: Arc::new(Inner::new(link, timeouts, call_timeout, subscriber)),
        })
    }

    /// A server at a fixed address or a Sentinel-managed master: its first address and
    /// connection, a subscriber that follows the server, and for Sentinel a task that
    /// follows the master's switches.
    async fn open_standalone(
        sentinel: Option<SentinelUrl>,
        addr: String,
        client: redis::Client,
        timeouts: Timeouts,
        call_timeout: Duration,
        eager: bool,
    ) -> Result<Self, Error> {
        let conn = first_connection(&addr, &client, timeouts, call_timeout, eager).await?;
        // A lazy Sentinel node has asked nobody yet: epoch 0 makes the first call ask.
        let epoch = u64::from(eager || sentinel.is_none());
        let current = Current {
            addr,
            client,
            conn,
            epoch,
            // An eager connection was set up: the server answered its setup.
            answered: AtomicBool::new(eager),
            no_script_load: AtomicBool::new(false),
        };
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| {
            let standalone = Standalone::new(sentinel, current, timeouts, call_timeout);
            let link = Link::Standalone(Box::new(standalone));
            Inner::new(link, timeouts, call_timeout, following(weak, timeouts))
        });
        if matches!(&inner.link, Link::Standalone(s) if s.sentinel.is_some()) {
            watch_switches(&inner);
        }
        Ok(Self { inner })
    }

    /// Gives the node's subscriber what hands on a wake that this client was woken by
    /// name for and had no waiter left to take (see [`HandOn`]): `lock/wake.lua`, in
    /// the background.
    fn hands_on(self) -> Self {
        let weak = Arc::downgrade(&self.inner);
        let hand_on: HandOn = Arc::new(move |keys: LockKeys| {
            let (Some(inner), Ok(rt)) = (weak.upgrade(), tokio::runtime::Handle::try_current())
            else {
                return;
            };
            let node = Node { inner };
            rt.spawn(async move {
                if let Err(e) = node.run::<i64>(&scripts::wake(&keys), None).await {
                    tracing::debug!(error = %e, "handing a release's wake on failed; the other waiters try again when the lease that refused them would have ended");
                }
            });
        });
        self.inner.subscriber.hand_on_with(hand_on);
        self
    }

    /// The node's `host:port` (a Sentinel node's current master); a cluster's seeds,
    /// `host:port,host:port`.
    pub fn addr(&self) -> String {
        match &self.inner.link {
            Link::Standalone(s) => read(&s.current).addr.clone(),
            Link::Cluster(c) => c.label(),
        }
    }

    /// The `host:port` of the server that holds `key`: on a cluster, the master of its
    /// slot now (the seeds if that is not known yet).
    pub fn addr_for(&self, key: &str) -> String {
        match &self.inner.link {
            Link::Standalone(_) => self.addr(),
            Link::Cluster(c) => c.addr_for(key),
        }
    }

    /// On a cluster, the master that serves `key` now (`None` while the slot map is not
    /// known); `None` on a standalone node, which serves every key.
    pub fn master_for(&self, key: &str) -> Option<String> {
        match &self.inner.link {
            Link::Standalone(_) => None,
            Link::Cluster(c) => c.master_for(key),
        }
    }

    /// Whether this is a Redis Cluster, where one script's keys must share a slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.link, Link::Cluster(_))
    }

    /// Redlock: who the node is, and its restart protection.
    pub fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.inner
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes whenever the node's connection may have changed: a call failed (the
    /// driver reconnects after a failed call) or a Sentinel node moved to another master.
    /// What a server said about itself holds while this stays the same.
    pub fn generation(&self) -> u64 {
        let moves = match &self.inner.link {
            Link::Standalone(s) => read(&s.current).epoch,
            Link::Cluster(_) => 0,
        };
        self.inner.failures.load(Ordering::Relaxed) + moves
    }

    /// Passes `result` on, counting a failure towards [`generation`](Self::generation).
    fn noted<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        if result.is_err() {
            self.inner.failures.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// The node's release notifications.
    pub fn subscriber(&self) -> &Subscriber {
        &self.inner.subscriber
    }

    /// Says why a waiter has no release notifications from this node: at `WARN` the
    /// first time the server's ACL refused a subscription (a misconfigured user: every
    /// waiter falls back to its lease-bounded timer, and releases go unheard), otherwise
    /// at `DEBUG`.
    pub fn subscription_failed(&self, error: &redis::RedisError) {
        let refused = error.code() == Some("NOPERM");
        if refused
            && !self
                .inner
                .channel_refusal_warned
                .swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                node = self.addr(),
                "the Redis user may not subscribe to fencelock's release channels, so \
                 waiters poll instead of being woken: give it the channel pattern of the \
                 ACL line of fencelock's guide, security chapter (ACL SETUSER fencelock ... &fencelock:*)"
            );
        } else {
            tracing::debug!(node = self.addr(), error = %error, "no release notifications from a node; its lease bound applies");
        }
    }

    /// Runs a script within `within` (a Redlock node's share of an operation), or else
    /// within the call timeout. A Sentinel node whose master answers that it is a replica
    /// or cannot be reached asks the sentinels again and, if they name another master,
    /// sends the script there once more (within what is left of the time). A cluster
    /// sends it to the master of its keys' slot, following redirections. A stalled
    /// standalone node (see [`stall`]) is not sent an acquire, nor the
    /// release of a token drawn since it stalled: [`UnavailableReason::Stalled`] at once.
    ///
    /// Cancel safety: dropping the future (or a timeout) may leave the script running on
    /// the server, or already run; callers that write must treat that as an unknown
    /// outcome.
    pub async fn run<T: FromRedisValue>(
        &self,
        call: &Call,
        within: Option<Duration>,
    ) -> Result<T, Error> {
        self.run_keeping(call, within, true).await
    }

    /// As [`run`](Self::run), cancel safety included; `keep`: a release that times out or
    /// is lost with its connection is kept to send again ([`owe`](Self::owe)), unless
    /// this is that sending.
    async fn run_keeping<T: FromRedisValue>(
        &self,
        call: &Call,
        within: Option<Duration>,
        keep: bool,
    ) -> Result<T, Error> {
        let within = within.unwrap_or(self.inner.call_timeout);
        let result = match &self.inner.link {
            Link::Standalone(s) => self.run_standalone(s, call, within, keep).await,
            // Boxed, as the rare paths below: a future is as large as its largest await,
            // and a call's future is moved several times on every call.
            Link::Cluster(c) => Box::pin(self.run_cluster(c, call, within)).await,
        };
        if result.is_ok() {
            self.check_eviction_once();
        }
        self.noted(result)
    }

    /// One call on a standalone server, step by step: held back from a server that
    /// stopped answering; sent in the flavor its server offers, its script loaded in the
    /// same write where this connection may lack it; what the answer says of the server
    /// counted (a stall begins or ends; releases kept are sent again); a release lost
    /// with its connection kept to send again (unless `keep` is false: this is that
    /// sending); the script known loaded.
    async fn run_standalone<T: FromRedisValue>(
        &self,
        s: &Standalone,
        call: &Call,
        within: Duration,
        keep: bool,
    ) -> Result<T, Error> {
        if s.stall.stalled() && s.holds_back(call) {
            // Not sent: no failure of the connection (its generation stays).
            return Err(not_sent(&read(&s.current).addr));
        }
        // A script is loaded with its first call on each connection, in the same write:
        // an EVALSHA answered NOSCRIPT is sent again after whatever this connection sent
        // meanwhile (a Redlock release after a late grant).
        let generation = self.generation();
        let known = self.inner.loaded.has(generation, call.lua());
        let started = tokio::time::Instant::now();
        let result = match self.flavor(within).await {
            Ok(flavor) => {
                let left = within.saturating_sub(started.elapsed());
                s.run(call, Some(left), !known, flavor).await
            }
            Err(e) => Err(e),
        };
        self.count_reply(s, &result);
        if keep && call.may_resend() && matches!(result, Err(ref e) if link_failed(e)) {
            self.owe(s, call.clone(), 0);
        }
        if result.is_ok() && !known {
            self.inner.loaded.mark(generation, call.lua());
        }
        result
    }

    /// One call on a cluster, in the flavor its masters offer, to the master of its keys'
    /// slot ([`ClusterLink::run`]).
    async fn run_cluster<T: FromRedisValue>(
        &self,
        c: &ClusterLink,
        call: &Call,
        within: Duration,
    ) -> Result<T, Error> {
        let started = tokio::time::Instant::now();
        let flavor = self.flavor(within).await?;
        let left = within.saturating_sub(started.elapsed());
        c.run(call, left, flavor).await
    }

    /// The flavor of the scripts for the node's server: what the server offers, as
    /// learned at connect or by an earlier call. The first time, the server is asked (one
    /// round trip, within `within`, before the call: a server fencelock does not serve is
    /// refused before anything is written; the calls beside it wait for its answer). On
    /// a later connection (another [`generation`](Self::generation): a reconnection, a
    /// failover) the server is asked again in the background, and calls go on meanwhile
    /// as the server was (it is usually the same, and a cluster's master that stopped
    /// answering must not hold every call up). A cluster's subscriber follows what its
    /// masters offer (sharded pub/sub or not).
    ///
    /// # Errors
    /// A server found to be a Redis Sentinel, or older than fencelock supports:
    /// [`Error::Rejected`] (codes `SENTINEL`, `VERSION`). The first time: the server's
    /// error, if it does not answer.
    async fn flavor(&self, within: Duration) -> Result<Flavor, Error> {
        let cluster = self.is_cluster();
        let generation = self.generation();
        let known = |generation: u64| -> Option<Result<Flavor, Error>> {
            if let Some(unfit) = lock(&self.inner.unfit).as_ref() {
                return Some(Err(unfit.error()));
            }
            let mut offers = lock(&self.inner.offers);
            let (at, known) = (*offers)?;
            if at != generation {
                // Asked again once per generation, by the call that finds it new.
                *offers = Some((generation, known));
                self.learn_again();
            }
            Some(Ok(known.flavor(cluster)))
        };
        if let Some(flavor) = known(generation) {
            return flavor;
        }
        let started = tokio::time::Instant::now();
        let Ok(_learning) = tokio::time::timeout(within, self.inner.learning.lock()).await else {
            return Err(timed_out(&self.addr(), within));
        };
        if let Some(flavor) = known(generation) {
            return flavor;
        }
        let left = within.saturating_sub(started.elapsed());
        let offers = self.ask(left).await?;
        self.learned(generation, offers);
        Ok(offers.flavor(cluster))
    }

    /// What the node's server (a cluster: every master) offers, asked within `within`.
    async fn ask(&self, within: Duration) -> Result<Capabilities, Error> {
        match &self.inner.link {
            Link::Standalone(s) => s.learn(within).await,
            Link::Cluster(c) => c.learn(within).await,
        }
    }

    /// Records what the server offers, as learned on the connection of `generation`
    /// (kept with a later generation, if one was recorded meanwhile); a cluster's
    /// subscriber follows a change of its pub/sub.
    fn learned(&self, generation: u64, offers: Capabilities) {
        lock(&self.inner.unfit).take();
        let before = {
            let mut known = lock(&self.inner.offers);
            let at = known.map_or(generation, |(at, _)| at.max(generation));
            known.replace((at, offers)).map(|(_, before)| before)
        };
        if self.is_cluster() && before.map(|b| b.sharded_pubsub) != Some(offers.sharded_pubsub) {
            self.inner.subscriber.set_sharded(offers.sharded_pubsub);
        }
        if before.is_some_and(|before| before != offers) {
            tracing::info!(node = %self.addr(), ?offers, "the server offers otherwise now; scripts follow");
        }
    }

    /// Asks the server again what it offers, in the background (one ask at a time: one
    /// under way covers the calls that find another generation meanwhile).
    fn learn_again(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let node = self.clone();
        runtime.spawn(async move {
            let Ok(_learning) = node.inner.learning.try_lock() else {
                return;
            };
            let generation = node.generation();
            match node.ask(node.inner.call_timeout).await {
                Ok(offers) => node.learned(generation, offers),
                Err(e) if Unfit::of(&e).is_some() => {
                    tracing::warn!(node = %node.addr(), error = %e, "fencelock does not serve this server; calls are refused");
                    *lock(&node.inner.unfit) = Unfit::of(&e);
                }
                Err(e) => {
                    tracing::debug!(node = %node.addr(), error = %e, "asking the server what it offers failed; as it was");
                }
            }
        });
    }

    /// The flavor of the scripts as last learned (Redis 7's before anything was): for a
    /// renewal, which is not held up to learn it (`renew.lua` is the same in every
    /// flavor; a cluster's batch across slots that a server cannot read is sent again
    /// per slot).
    fn last_flavor(&self) -> Flavor {
        lock(&self.inner.offers)
            .map_or(Capabilities::REDIS_7, |(_, offers)| offers)
            .flavor(self.is_cluster())
    }

    /// Learns what the server offers as the node connects (eagerly), which is also the
    /// first exchange on the connection: a link that fails (a TLS mistake, a port of
    /// another kind), a Redis Sentinel, or a server older than fencelock supports fails
    /// the connect. A server's other refusals (`NOAUTH`, `NOPERM`) are left to the
    /// first call, which asks again and fails as it would have.
    async fn learn_at_connect(&self) -> Result<(), Error> {
        let asked = async {
            let generation = self.generation();
            let _learning = self.inner.learning.lock().await;
            let offers = self.ask(self.inner.call_timeout).await?;
            self.learned(generation, offers);
            Ok(())
        };
        match asked.await {
            Err(Error::Rejected {
                node,
                code,
                message,
            }) if code != "SENTINEL" && code != "VERSION" => {
                tracing::debug!(
                    node,
                    code,
                    message,
                    "the server refused to say what it offers at connect; the first call asks again"
                );
                Ok(())
            }
            Err(e) => Err(e),
            Ok(_) => Ok(()),
        }
    }

    /// Counts what a call on the standalone connection `s` came to towards its stall (see
    /// [`stall`]): a timeout is one more call unanswered, which may begin a
    /// stall (and a `PING` that waits for the server to answer again); anything else
    /// (a reply, or a connection that broke and is replaced) ends one. A reply also sends
    /// again the releases kept meanwhile ([`repay`](Self::repay)); a broken link does
    /// not (they would fail again).
    fn count_reply<T>(&self, s: &Standalone, result: &Result<T, Error>) {
        match result {
            Err(e) if is_timeout(e) => {
                if s.stall.unanswered() {
                    let addr = read(&s.current).addr.clone();
                    tracing::warn!(
                        node = %addr,
                        calls = stall::STALLED_AFTER,
                        "the server stopped answering: acquires are not sent to it until it answers again"
                    );
                    ask_until_answered(&self.inner);
                }
            }
            Err(e) if link_broke(e) => s.stall.answered(),
            _ => {
                s.stall.answered();
                self.repay(s);
            }
        }
    }

    /// Keeps a release that timed out, or whose connection broke or could not be made
    /// (sent again `tries` times so far), to send again once the server answers: the
    /// driver drops a request that times out while it still waits for room in the
    /// connection's queue (a connection backed up toward a stopped server), although the
    /// acquire before it was written, and the server would keep that grant until the
    /// lease ends; a release lost with its connection (a restart, a network blip) would
    /// leave the lock held as long. Only a token's last call is kept
    /// ([`Call::may_resend`]): it acts on that token alone, so sending it again, after
    /// whatever was sent meanwhile, does no harm.
    fn owe(&self, s: &Standalone, call: Call, tries: u8) {
        if tries >= OWED_TRIES {
            tracing::debug!(node = %self.addr(), "a release sent again was lost each time; its key expires with its lease");
            return;
        }
        let mut owed = lock(&s.owed);
        if owed.len() >= OWED_MAX {
            owed.pop_front();
        }
        owed.push_back((call, tries));
        s.owing.store(true, Ordering::Release);
    }

    /// Sends again, in the background, the releases kept by [`owe`](Self::owe), one
    /// task at a time: the server answers, so what was sent before them has run
    /// (replies come in order) or will run before them. One that fails for the link
    /// again is kept, and the rest wait for the server's next answer.
    fn repay(&self, s: &Standalone) {
        if !s.owing.load(Ordering::Acquire) || s.repaying.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            s.repaying.store(false, Ordering::Release);
            return; // no runtime: the keys expire with their leases
        };
        // A weak handle: a client dropped meanwhile ends the task at its next call.
        let weak = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let node = Node { inner };
                let Link::Standalone(s) = &node.inner.link else {
                    return;
                };
                // Stalled again: the rest when it answers.
                let next = (!s.stall.stalled()).then(|| {
                    let mut owed = lock(&s.owed);
                    let next = owed.pop_front();
                    s.owing.store(!owed.is_empty(), Ordering::Release);
                    next
                });
                let Some((call, tries)) = next.flatten() else {
                    s.repaying.store(false, Ordering::Release);
                    // Kept meanwhile, after the last look: not left for the next reply.
                    if s.owing.load(Ordering::Acquire) && !s.stall.stalled() {
                        node.repay(s);
                    }
                    return;
                };
                tracing::debug!(node = %node.addr(), "sending again a release that was lost");
                let sent = node.run_keeping::<redis::Value>(&call, None, false).await;
                if matches!(sent, Err(ref e) if link_failed(e)) {
                    node.owe(s, call, tries + 1);
                    s.repaying.store(false, Ordering::Release);
                    return;
                }
            }
        });
    }

    /// Once per connection (per [`generation`](Self::generation)), in the background:
    /// [`eviction_risks`](Self::eviction_risks), unless something read them on this
    /// connection already (the CLI asks beside its acquire).
    fn check_eviction_once(&self) {
        let mark = self.generation() + 1;
        if self.inner.eviction_checked.swap(mark, Ordering::Relaxed) == mark {
            return;
        }
        let node = self.clone();
        tokio::spawn(async move {
            if let Err(e) = node.eviction_risks().await {
                tracing::debug!(node = %node.addr(), error = %e, "could not read the memory policy");
            }
        });
    }

    /// Reads the memory policy of the node's servers (`INFO memory`; a cluster: every
    /// master) and returns those that can evict lock keys (see
    /// [`eviction_risk`](eviction::eviction_risk)), and those whose policy could not be
    /// read (`INFO` refused, or an answer without it); warns of each (a `WARN` event)
    /// the first time this node sees that server with that policy. Marks the connection
    /// as checked, so the client's own check per connection does not ask again.
    ///
    /// Cancel safe: it only reads.
    pub async fn eviction_risks(&self) -> Result<(Vec<EvictionRisk>, Vec<PolicyUnknown>), Error> {
        // Claimed before asking: a call that succeeds meanwhile does not ask again.
        self.inner
            .eviction_checked
            .store(self.generation() + 1, Ordering::Relaxed);
        let servers = match self.info("memory").await {
            Ok(servers) => servers,
            Err(Error::Rejected {
                node,
                code,
                message,
            }) if code == "NOPERM" || message.contains("unknown command") => {
                let unknown = PolicyUnknown {
                    node,
                    why: format!("the server refuses INFO: {message}"),
                };
                self.warn_once(&unknown.node, "unknown", || tracing::warn!("{unknown}"));
                return Ok((Vec::new(), vec![unknown]));
            }
            Err(e) => return Err(e),
        };
        let (mut risks, mut unknown) = (Vec::new(), Vec::new());
        for (addr, text) in servers {
            match eviction::eviction_risk(&addr, &text) {
                Ok(None) => {
                    tracing::debug!(node = %addr, can_evict = false, "memory policy read");
                }
                Ok(Some(risk)) => {
                    tracing::debug!(node = %addr, can_evict = true, "memory policy read");
                    self.warn_once(&risk.node, &risk.policy, || {
                        tracing::warn!(
                            node = %risk.node,
                            policy = %risk.policy,
                            maxmemory = risk.maxmemory,
                            "{risk}"
                        );
                    });
                    risks.push(risk);
                }
                Err(why) => {
                    self.warn_once(&why.node, "unknown", || tracing::warn!("{why}"));
                    unknown.push(why);
                }
            }
        }
        Ok((risks, unknown))
    }

    /// Runs `warn` the first time this node sees the server at `node` with `policy`.
    fn warn_once(&self, node: &str, policy: &str, warn: impl FnOnce()) {
        let first = {
            let mut warned = lock(&self.inner.eviction_warned);
            let seen = (node.to_owned(), policy.to_owned());
            let first = !warned.contains(&seen);
            if first {
                warned.push(seen);
            }
            first
        };
        if first {
            warn();
        }
    }

    /// `INFO section` on the node's server (on a cluster: on every master), with each
    /// server's `host:port`.
    ///
    /// Cancel safe: it only reads.
    pub async fn info(&self, section: &str) -> Result<Vec<(String, String)>, Error> {
        let s = match &self.inner.link {
            Link::Standalone(s) => s,
            Link::Cluster(c) => return c.info_each_master(section).await,
        };
        let current = s.current().await?;
        let mut conn = current.conn.clone();
        let cmd = redis::cmd("INFO").arg(section).to_owned();
        let within = self.inner.call_timeout;
        match tokio::time::timeout(within, cmd.query_async::<String>(&mut conn)).await {
            Ok(Ok(text)) => {
                current.answered.store(true, Ordering::Relaxed);
                Ok(vec![(current.addr.clone(), text)])
            }
            Ok(Err(e)) => Err(current.error(&e)),
            Err(_) => Err(timed_out(&current.addr, within)),
        }
    }

    /// One renewal batch, `(lock key, holder, ttl)` per lease, within `within`: what the
    /// node answered for each lease, `None` where it did not answer (in time). A
    /// standalone node gets one call; a cluster one call per master (see
    /// [`ClusterLink::renew`]).
    pub async fn renew(
        &self,
        leases: &[(&str, &str, Duration)],
        within: Option<Duration>,
    ) -> Vec<Option<Owned>> {
        match &self.inner.link {
            Link::Standalone(s) => {
                let call = scripts::renew(leases.iter().copied());
                let renewed = s
                    .run::<Renewed>(&call, within, false, self.last_flavor())
                    .await;
                self.count_reply(s, &renewed);
                match renewed {
                    Ok(Renewed(codes)) if codes.len() == leases.len() => {
                        codes.into_iter().map(Some).collect()
                    }
                    Ok(_) => vec![None; leases.len()],
                    Err(e) => {
                        self.inner.failures.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(node = self.addr(), error = %e, leases = leases.len(), "renewal failed; retrying");
                        vec![None; leases.len()]
                    }
                }
            }
            Link::Cluster(c) => {
                let within = within.unwrap_or(self.inner.call_timeout);
                c.renew(leases, within, self.last_flavor()).await
            }
        }
    }

    /// Every key matching the glob `pattern`, by `SCAN` (never `KEYS`, which blocks the
    /// server), each call within the call timeout; on a cluster, on every master.
    pub async fn scan(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let result = match &self.inner.link {
            Link::Standalone(s) => s.scan(pattern).await,
            Link::Cluster(c) => c.scan(pattern).await,
        };
        self.noted(result)
    }

    /// `WAIT replicas timeout` on the server that holds `key` (a cluster's master of its
    /// slot): how many replicas acknowledged this connection's writes so far, waiting up
    /// to `within` (at most three quarters of the response timeout) for `replicas` of
    /// them; and how long that was. A server that refuses `WAIT` (some managed services
    /// do) gives [`Error::Rejected`] saying so.
    pub async fn wait_replicas(
        &self,
        key: &str,
        replicas: u32,
        within: Duration,
    ) -> Result<(u32, Duration), Error> {
        let within = within.min(self.inner.timeouts.response * 3 / 4);
        let bound = within + self.inner.timeouts.response;
        // The answer, or the driver's error with what it means for this node.
        let (addr, answer) = match &self.inner.link {
            Link::Standalone(s) => {
                let current = s.current().await?;
                let mut conn = current.conn.clone();
                let wait = redis::cmd("WAIT")
                    .arg(replicas)
                    .arg(within.as_millis() as u64)
                    .to_owned();
                match tokio::time::timeout(bound, wait.query_async::<i64>(&mut conn)).await {
                    Ok(answer) => {
                        if answer.is_ok() {
                            current.answered.store(true, Ordering::Relaxed);
                        }
                        (
                            current.addr.clone(),
                            answer.map_err(|e| (current.error(&e), e)),
                        )
                    }
                    Err(_) => return Err(timed_out(&current.addr, bound)),
                }
            }
            Link::Cluster(c) => {
                let addr = c.addr_for(key);
                let answer = c.wait(key, replicas, within, bound).await?;
                let answer = answer.map_err(|e| (c.error(&addr, &e), e));
                (addr, answer)
            }
        };
        match answer {
            Ok(n) => Ok((u32::try_from(n).unwrap_or(0), within)),
            Err((_, e))
                if e.code().is_some() && !matches!(e.code(), Some("NOAUTH" | "WRONGPASS")) =>
            {
                Err(Error::Rejected {
                    node: addr,
                    code: e.code().unwrap_or("ERR").to_owned(),
                    message: format!(
                        "the server refuses WAIT ({}), so replica acknowledgement cannot be \
                         checked there: ask for no replicas",
                        e.detail().unwrap_or_default()
                    ),
                })
            }
            Err((error, _)) => Err(error),
        }
    }

    /// Asks the server who it is, and records it in [`health`](Self::health): its run
    /// id, random for every start of a server process (two nodes with one run id are one
    /// server), and its uptime. Returns the run id. (Redlock only, which a cluster cannot
    /// be part of.)
    ///
    /// Cancel safe: it only reads; a dropped call records nothing.
    pub async fn identify(&self, within: Duration) -> Result<String, Error> {
        let generation = self.generation();
        let (run_id, uptime) = self.noted(self.who(within).await)?;
        self.health()
            .observe(&run_id, uptime, generation, Instant::now());
        Ok(run_id)
    }

    async fn who(&self, within: Duration) -> Result<(String, Duration), Error> {
        let s = match &self.inner.link {
            Link::Standalone(s) => s,
            Link::Cluster(c) => {
                return Err(Error::invalid(
                    "Redis URLs",
                    format!("{} is a Redis Cluster, which has no one run id", c.label()),
                ));
            }
        };
        let generation = self.generation();
        let current = s.current().await?;
        let mut conn = current.conn.clone();
        let info = redis::cmd("INFO").arg("server").to_owned();
        let text: String = match tokio::time::timeout(within, info.query_async(&mut conn)).await {
            Ok(Ok(text)) => {
                current.answered.store(true, Ordering::Relaxed);
                text
            }
            Ok(Err(e)) => return Err(current.error(&e)),
            Err(_) => return Err(timed_out(&current.addr, within)),
        };
        // The same answer says what the server offers: its calls need not ask.
        if let Some(server) = capabilities::Server::from_info(&text) {
            match capabilities::judge(&current.addr, Some(&server)) {
                Ok(offers) => self.learned(generation, offers),
                Err(e) => *lock(&self.inner.unfit) = Unfit::of(&e),
            }
        }
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .filter(|v| !v.is_empty())
        };
        let uptime = field("uptime_in_seconds:").and_then(|s| s.parse().ok());
        match (field("run_id:"), uptime) {
            (Some(id), Some(uptime)) => Ok((id.to_owned(), Duration::from_secs(uptime))),
            _ => Err(Error::Rejected {
                node: current.addr.clone(),
                code: "ERR".to_owned(),
                message: "INFO server has no run_id or uptime: is this a Redis server?".to_owned(),
            }),
        }
    }
}

impl Standalone {
    /// A standalone node's link, going to `current` first, not stalled, owing nothing.
    fn new(
        sentinel: Option<SentinelUrl>,
        current: Current,
        timeouts: Timeouts,
        call_timeout: Duration,
    ) -> Self {
        Standalone {
            sentinel,
            current: RwLock::new(Arc::new(current)),
            resolving: tokio::sync::Mutex::new(()),
            timeouts,
            call_timeout,
            stall: Stall::default(),
            owed: Mutex::new(VecDeque::new()),
            owing: AtomicBool::new(false),
            repaying: AtomicBool::new(false),
        }
    }

    /// Whether `call` stays unsent while the node is stalled: an acquire, or the release
    /// of a token drawn since the stall began (see [`stall`]).
    fn holds_back(&self, call: &Call) -> bool {
        call.lua().acquires()
            || call
                .undoes()
                .is_some_and(|drawn| self.stall.holds_nothing_of(drawn))
    }

    /// The connection to use now: for a Sentinel node that has not asked the sentinels
    /// yet, after asking them.
    async fn current(&self) -> Result<Arc<Current>, Error> {
        let current = read(&self.current).clone();
        if current.epoch == 0 {
            // Boxed: asking the sentinels is a large future, awaited once per node.
            Box::pin(self.switch(0)).await?;
            return Ok(read(&self.current).clone());
        }
        Ok(current)
    }

    /// As [`Node::run`]. `load`: the script may be missing on this connection, so load
    /// it in the same write; otherwise `EVALSHA` alone, and the load after a `NOSCRIPT`.
    async fn run<T: FromRedisValue>(
        &self,
        call: &Call,
        within: Option<Duration>,
        load: bool,
        flavor: Flavor,
    ) -> Result<T, Error> {
        let within = within.unwrap_or(self.call_timeout);
        let deadline = tokio::time::Instant::now() + within;
        let run = call.evalsha(flavor);
        let run = &*run;
        let send = async |current: &Current| -> redis::RedisResult<T> {
            let mut conn = current.conn.clone();
            if load {
                return Box::pin(current.load_and_run(call, run, flavor)).await;
            }
            match run.query_async::<T>(&mut conn).await {
                // The server lost its scripts (SCRIPT FLUSH, or a restart this
                // connection did not see): load it and run it again.
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    Box::pin(current.load_and_run(call, run, flavor)).await
                }
                answer => answer,
            }
        };
        let refused = |e| refused(call, e, flavor);
        let attempt = async {
            let current = self.current().await?;
            match send(&current).await {
                Ok(v) => {
                    current.answered.store(true, Ordering::Relaxed);
                    Ok(v)
                }
                Err(e) if self.sentinel.is_some() && master_may_have_moved(&e) => {
                    Box::pin(async {
                        // Ask again; go on only if the sentinels name another master.
                        let moved = self.switch(current.epoch).await.unwrap_or(false);
                        if !moved {
                            return Err(refused(current.error(&e)));
                        }
                        let current = read(&self.current).clone();
                        send(&current).await.map_err(|e| refused(current.error(&e)))
                    })
                    .await
                }
                Err(e) => Err(refused(current.error(&e))),
            }
        };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(result) => result,
            Err(_) => Err(timed_out(&read(&self.current).addr, within)),
        }
    }

    /// What the server the node talks to now offers, asked within `within` (see
    /// [`Current::offers`]).
    async fn learn(&self, within: Duration) -> Result<Capabilities, Error> {
        let asking = async {
            let current = self.current().await?;
            current.offers().await
        };
        match tokio::time::timeout(within, asking).await {
            Ok(offers) => offers,
            Err(_) => Err(timed_out(&read(&self.current).addr, within)),
        }
    }

    /// As [`Node::scan`].
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let current = self.current().await?;
        let mut conn = current.conn.clone();
        let mut keys = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let page = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .to_owned();
            let within = self.call_timeout;
            let (next, found): (u64, Vec<String>) =
                match tokio::time::timeout(within, page.query_async(&mut conn)).await {
                    Ok(Ok(reply)) => reply,
                    Ok(Err(e)) => return Err(current.error(&e)),
                    Err(_) => return Err(timed_out(&current.addr, within)),
                };
            keys.extend(found);
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    }

    /// Asks the sentinels for the master and switches to it if it is another one; true
    /// if the connection now goes elsewhere than it did at `seen` (its epoch). One caller
    /// asks at a time; one that waited finds the switch done.
    async fn switch(&self, seen: u64) -> Result<bool, Error> {
        let Some(url) = &self.sentinel else {
            return Ok(false);
        };
        let _asking = self.resolving.lock().await;
        let current = read(&self.current).clone();
        if current.epoch != seen {
            return Ok(true); // someone switched meanwhile
        }
        let (addr, client) = sentinel::resolve(url, self.call_timeout).await?;
        if addr == current.addr && current.epoch != 0 {
            return Ok(false);
        }
        let conn =
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(self.timeouts))
                .map_err(|e| map_error(&addr, &client, &e))?;
        if current.epoch != 0 {
            tracing::warn!(
                service = %url.service,
                from = %current.addr,
                to = %addr,
                "the Sentinel-managed master moved; following it"
            );
        }
        *write(&self.current) = Arc::new(Current {
            addr,
            client,
            conn,
            epoch: current.epoch + 1,
            answered: AtomicBool::new(false),
            no_script_load: AtomicBool::new(false),
        });
        // Another connection: nothing sent on the old one is waited for.
        self.stall.answered();
        Ok(true)
    }
}

/// Asks a stalled standalone node's server whether it answers again: one `PING` on a
/// connection of its own without a response timeout, outstanding until it is answered
/// (nothing piles up on the node's connection meanwhile). Its answer, or any failure of
/// that connection (something changed, which the node's next calls will show), ends the
/// stall. Every response timeout meanwhile, a Sentinel node asks the sentinels (a stopped
/// master is failed over; the acquires held back do not ask), and the task ends if the
/// stall ended otherwise (another reply on the node's connection, a switch to another
/// master) or the node was dropped.
fn ask_until_answered(inner: &Arc<Inner>) {
    let Link::Standalone(s) = &inner.link else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        s.stall.answered(); // no runtime to ask in: hold nothing back
        return;
    };
    let weak = Arc::downgrade(inner);
    let closed = inner.closed.clone();
    let every = inner.timeouts.response;
    let current = read(&s.current).clone();
    runtime.spawn(async move {
        let probe = async {
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(None)
                .set_response_timeout(None);
            let mut conn = current
                .client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("PING").query_async::<()>(&mut conn).await
        };
        // Until the stall ended otherwise; a Sentinel node asks the sentinels meanwhile.
        let meanwhile = async {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                let Link::Standalone(s) = &inner.link else { return };
                if s.sentinel.is_some() {
                    let _ = s.switch(current.epoch).await;
                }
                if !s.stall.stalled() || read(&s.current).epoch != current.epoch {
                    return;
                }
            }
        };
        let answer = tokio::select! {
            () = closed.cancelled() => return,
            answer = probe => answer,
            // Ended otherwise (a switch ends it as it replaces the connection).
            () = meanwhile => return,
        };
        let Some(inner) = weak.upgrade() else { return };
        let node = Node { inner };
        let Link::Standalone(s) = &node.inner.link else { return };
        if s.stall.stalled() {
            match &answer {
                Ok(()) => tracing::info!(node = %current.addr, "the server answers again"),
                Err(e) => {
                    tracing::info!(node = %current.addr, error = %e, "a stalled server's probe failed; acquires are sent again");
                }
            }
        }
        s.stall.answered();
        if answer.is_ok() {
            node.repay(s);
        }
    });
}

/// Follows `+switch-master` announcements of the node's service, one sentinel at a time,
/// until the node is dropped.
fn watch_switches(inner: &Arc<Inner>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return; // no runtime: errors on the old master make the node ask again
    };
    let weak = Arc::downgrade(inner);
    let closed = inner.closed.clone();
    let Link::Standalone(standalone) = &inner.link else {
        return;
    };
    let Some(url) = standalone.sentinel.clone() else {
        return;
    };
    runtime.spawn(async move {
        let mut next = 0;
        loop {
            tokio::select! {
                () = closed.cancelled() => return,
                i = sentinel::switch_announced(&url, next, Duration::from_millis(500)) => next = i,
            }
            let Some(inner) = weak.upgrade() else { return };
            let Link::Standalone(s) = &inner.link else { return };
            let seen = read(&s.current).epoch;
            if let Err(e) = s.switch(seen).await {
                tracing::debug!(service = %url.service, error = %e, "asking the sentinels after a switch failed");
            }
        }
    });
}

/// Whether an error says that a Sentinel node's master may be another one now: it was
/// demoted (`READONLY`), lost its master role (`MASTERDOWN`), or is gone.
fn master_may_have_moved(e: &RedisError) -> bool {
    matches!(code(e), Some("READONLY" | "MASTERDOWN"))
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(e.kind(), ErrorKind::Io)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A call held back, unsent, since the node's server stopped answering.
fn not_sent(addr: &str) -> Error {
    Error::Unavailable {
        node: addr.to_owned(),
        reason: UnavailableReason::Stalled,
        detail: format!(
            "not sent: its last {} calls got no answer, and acquires wait until it answers \
             again",
            stall::STALLED_AFTER
        ),
        source: None,
    }
}

/// A driver error of `client`'s connection before the server answered anything on it,
/// sorted as [`map_error`] does, except that a connection closed without a word is said
/// to be no Redis server's (see [`new_connection_hint`]).
fn first_error(addr: &str, client: &redis::Client, e: &RedisError) -> Error {
    match map_error(addr, client, e) {
        Error::Unavailable {
            node,
            reason: UnavailableReason::Io,
            detail,
            source,
        } if detail.is_empty() => {
            let tls = matches!(
                client.get_connection_info().addr(),
                redis::ConnectionAddr::TcpTls { .. }
            );
            Error::Unavailable {
                node,
                reason: UnavailableReason::Io,
                detail: new_connection_hint(e, tls, Scheme::Server).unwrap_or_default(),
                source,
            }
        }
        other => other,
    }
}

impl Current {
    /// Loads the script of `call` and runs it (`run`, its `EVALSHA`): `SCRIPT LOAD` and
    /// the `EVALSHA`, both sent before either answer is awaited (the futures are polled
    /// in order, and the connection sends in the order it is given). Where the server
    /// refuses `SCRIPT LOAD`, `EVAL` instead, from then on.
    async fn load_and_run<T: FromRedisValue>(
        &self,
        call: &Call,
        run: &redis::Cmd,
        flavor: Flavor,
    ) -> redis::RedisResult<T> {
        let mut conn = self.conn.clone();
        if self.no_script_load.load(Ordering::Relaxed) {
            return call.eval(flavor).query_async(&mut conn).await;
        }
        let mut same = conn.clone();
        let load = call.load(flavor);
        let (loaded, answer) = futures_util::join!(
            load.query_async::<()>(&mut conn),
            run.query_async::<T>(&mut same)
        );
        match (loaded, answer) {
            (Err(e), answer) if capabilities::refuses(&e) => {
                if !self.no_script_load.swap(true, Ordering::Relaxed) {
                    tracing::info!(node = %self.addr, error = %e, "the server refuses SCRIPT LOAD; scripts it lacks are sent with EVAL");
                }
                match answer {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        call.eval(flavor).query_async(&mut conn).await
                    }
                    answer => answer,
                }
            }
            (Err(e), Err(_)) => Err(e),
            (_, answer) => answer,
        }
    }

    /// What the server offers, asked with `INFO server` (`HELLO` where that is
    /// refused), judged by [`capabilities::judge`].
    async fn offers(&self) -> Result<Capabilities, Error> {
        let send = |cmd: redis::Cmd| {
            let mut conn = self.conn.clone();
            async move { cmd.query_async(&mut conn).await }
        };
        let server = match capabilities::ask(send).await {
            Ok(server) => server,
            Err(e) => return Err(self.error(&e)),
        };
        self.answered.store(true, Ordering::Relaxed);
        capabilities::judge(&self.addr, server.as_ref())
    }

    /// A driver error of this connection, sorted (see [`map_error`]); before the server
    /// answered anything here, as [`first_error`].
    fn error(&self, e: &RedisError) -> Error {
        if self.answered.load(Ordering::Relaxed) {
            map_error(&self.addr, &self.client, e)
        } else {
            first_error(&self.addr, &self.client, e)
        }
    }
}
