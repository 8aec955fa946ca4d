//! Leader election: [`Election`] (campaign, ask who leads, follow changes),
//! [`Leadership`] (leading, with a term that fences), [`Leader`], [`Observer`].

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::admin;
use crate::admin::{Holder, LockState};
use crate::backend::subscriber::Subscription;
use crate::builder::sealed::{Chosen, OneLock, Sealed};
use crate::builder::{AcquireBuilder, Kind, Target};
use crate::engine::driver::next_waiter_id;
use crate::engine::nodes::Listener;
use crate::engine::protocol::Wake;
use crate::error::{Error, LossCause};
use crate::guard::LockGuard;
use crate::keys::LockKeys;
use crate::protocols;
use crate::shared::Shared;
use crate::token::FencingToken;

/// With nobody leading, an [`Observer`] reads the leader again at least this often,
/// in case a message was lost (pub/sub is a hint): with a leader, it reads again when
/// that leader's lease would end.
const RECHECK: Duration = Duration::from_secs(5);

/// After a leader's lease would have ended, an [`Observer`] waits this much more before
/// it reads again (Redis expires the key by its own clock).
const EXPIRY_MARGIN: Duration = Duration::from_millis(5);

/// A leader election: many campaigners, one leader at a time, each leadership with a
/// term that is higher than every term before it. Made by
/// [`Client::election`](crate::Client::election).
///
/// The leader holds the election's lock (a plain lock of the same name, with a lease
/// the client's watchdog renews); its term is that grant's fencing token. What fencelock
/// adds over electing by lock alone: a campaign that wins announces the new leader on the
/// election's channel, a resignation announces that nobody leads, and the leader record
/// (term, when it began by the server's clock, what the leader said about itself) lives
/// beside the lock key, so followers learn of a change by pub/sub ([`observe`](Self::observe)),
/// and anyone can ask who leads ([`leader`](Self::leader)).
///
/// ```
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fencelock::Error> {
/// # let redis = testkit::RedisServer::start();
/// # let client = fencelock::Client::connect(&redis.url()).await?;
/// let election = client
///     .election("scheduler")
///     .lease(Duration::from_secs(10)) // a dead leader is replaced within 10 s
///     .holder_info("host a, pid 4242");
/// let leadership = election.campaign().await?; // waits until it leads
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.term, leadership.term());
/// tokio::select! {
///     cause = leadership.lost() => println!("no longer leading: {cause}"),
///     () = async { /* lead: write with leadership.term() as the fencing token */ } => {}
/// }
/// leadership.resign().await?;
/// # Ok(())
/// # }
/// ```
///
/// # What the term fences, and what it does not
/// Two campaigners may each believe they lead for a moment: a leader paused (GC, a
/// stopped process) past its lease, or cut off from Redis, goes on until its
/// [`lost`](Leadership::lost) signal fires, and a standby may lead by then. Leader
/// election on leases alone (Kubernetes' client-go says so of its own) cannot prevent
/// that; what can is the resource refusing the old leader: send [`term`](Leadership::term)
/// with every write, and have the resource keep the highest term it accepted
/// ([`Client::fenced_write`](crate::Client::fenced_write), [`fence`](crate::fence)).
/// Terms strictly increase across leaders on one Redis (the lock's fencing counter),
/// including across a failover to a replica that missed the last grant, as long as the
/// server clocks do not step back (see [`FencingToken`]). Work that does not go through
/// such a resource is not fenced: the term says who should win, not who runs.
///
/// # Limits
/// One node (a standalone server, a Sentinel-managed master, or a Redis Cluster):
/// Redlock clients get [`Error::InvalidArgument`]. Campaigners are not served in arrival
/// order: a resignation wakes one waiting client, the first listed, as a plain lock's
/// release does.
#[derive(Clone, Debug)]
pub struct Election {
    builder: AcquireBuilder<ElectionKind>,
}

/// What a campaign takes: the election's lock, as a leader.
#[derive(Clone, Debug, Default)]
pub(crate) struct ElectionKind {
    info: String,
}

impl Target for ElectionKind {}

impl Kind for ElectionKind {}

impl Sealed for ElectionKind {
    const BUILDER: &'static str = "Election";

    fn info(&self) -> &str {
        &self.info
    }
}

impl OneLock for ElectionKind {
    fn protocol(&self, redlock: bool) -> Result<Chosen, Error> {
        if redlock {
            return Err(redlock_refused());
        }
        Ok(Chosen(Arc::new(protocols::Election)))
    }
}

fn redlock_refused() -> Error {
    Error::invalid(
        "election",
        "leader election needs a single Redis node (standalone, Sentinel or Cluster): the \
         leader record and its announcements live on one server",
    )
}

impl Election {
    pub(crate) fn new(shared: Arc<Shared>, name: String) -> Self {
        Self {
            builder: AcquireBuilder::new(shared, name, ElectionKind::default()).wait_forever(),
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.builder.name()
    }

    /// How long a leadership's lease lasts (default 30 s; as
    /// [`AcquireBuilder::lease`]): renewed every third of it while the
    /// [`Leadership`] lives, so a leader that dies is replaced within this long.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.builder = self.builder.lease(lease);
        self
    }

    /// How long [`campaign`](Self::campaign) waits to lead before giving up with
    /// [`Error::Held`] (default: for ever; zero: one attempt).
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.builder = self.builder.wait(wait);
        self
    }

    /// Makes [`campaign`](Self::campaign) wait until it leads, however long that takes
    /// (the default).
    #[must_use]
    pub fn wait_forever(mut self) -> Self {
        self.builder = self.builder.wait_forever();
        self
    }

    /// Replicas of the master that must acknowledge a win before it counts (default 0;
    /// as [`AcquireBuilder::replicas`]).
    #[must_use]
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.builder = self.builder.replicas(replicas);
        self
    }

    /// Who campaigns, as [`leader`](Self::leader) and `fencelock status` show it while
    /// it leads: host, process, anything an operator needs (up to 4 KiB; default
    /// nothing). Part of the leader record, beside the term and when it began.
    #[must_use]
    pub fn holder_info(mut self, info: impl Into<String>) -> Self {
        self.builder.kind_mut().info = info.into();
        self
    }

    /// Campaigns: returns once this caller leads, or when the [wait](Self::wait) runs
    /// out. A win announces the new leader to the followers in the same script call.
    /// While another leads, the campaign waits as a lock's waiter does: a resignation
    /// wakes it at once by pub/sub, and a leader that died is replaced when its lease
    /// ends.
    ///
    /// # Errors
    /// [`Error::Held`] when the wait runs out; [`Error::InvalidArgument`] for a bad name,
    /// lease or holder info, or on a Redlock client; [`Error::WrongType`] when the name
    /// holds another kind of lock; [`Error::Unavailable`], [`Error::Rejected`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`AcquireBuilder::acquire`]: a dropped campaign takes back, in
    /// the background, a win whose reply was under way (and that take-back tells the
    /// followers).
    pub fn campaign(
        &self,
    ) -> impl Future<Output = Result<Leadership, Error>> + Send + 'static + use<> {
        let acquiring = self.builder.acquire();
        async move {
            let guard = acquiring.await?;
            Ok(Leadership { guard })
        }
    }

    /// Who leads now, as Redis says in one read: `None` when nobody does (never elected,
    /// resigned, or the leader's lease ran out).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name or on a Redlock client;
    /// [`Error::WrongType`] when the name is held by a lock that is not an election's;
    /// the node's error.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        read_leader(self.shared(), self.name()).await
    }

    /// Starts following the election: subscribes to its channel, then reads who leads,
    /// so that no change after this call is missed. [`Observer::changed`] then waits for
    /// the next change.
    ///
    /// How a change is heard: a win and a resignation publish on the election's channel,
    /// which wakes the observer at once; a leader that dies publishes nothing, so the
    /// observer reads again when that leader's lease would end (Redis reported what was
    /// left of it), and sees the election without a leader, or the standby that took over
    /// (whose win it also hears). Pub/sub is a hint, never the only way: with nobody
    /// leading, the observer also reads again every 5 s, in case a message was lost, and
    /// after the pub/sub connection comes back.
    ///
    /// # Errors
    /// As [`leader`](Self::leader).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call unsubscribes.
    pub async fn observe(&self) -> Result<Observer, Error> {
        let shared = self.shared().clone();
        if shared.backend.is_redlock() {
            return Err(redlock_refused());
        }
        let keys = LockKeys::new(&shared.prefix, self.name())?;
        let subscriptions = shared
            .backend
            .subscribe(&keys.leader_channel(), next_waiter_id(), Wake::Owner)
            .await;
        let read_at = Instant::now();
        let current = read_leader(&shared, self.name()).await?;
        Ok(Observer {
            shared,
            name: self.name().to_owned(),
            subscriptions,
            current,
            read_at,
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        self.builder.shared()
    }
}

/// Who leads, from one read of the leader record.
async fn read_leader(shared: &Arc<Shared>, name: &str) -> Result<Option<Leader>, Error> {
    if shared.backend.is_redlock() {
        return Err(redlock_refused());
    }
    let status = admin::inspect(&shared.backend, &shared.prefix, name).await?;
    let node = status.nodes.into_iter().next().map(|n| (n.node, n.state));
    let Some((node, state)) = node else {
        return Ok(None);
    };
    leader_of(&node, name, state?)
}

/// The leader a node's lock state names.
fn leader_of(node: &str, name: &str, state: LockState) -> Result<Option<Leader>, Error> {
    match (&state.holder, state.leader()) {
        (None, _) => Ok(None),
        (Some(_), Some(leader)) => Ok(Some(leader)),
        (Some(Holder::Plain { .. }), None) => Err(not_an_election(
            node,
            name,
            "a plain lock without a leader record",
        )),
        (Some(_), None) => Err(not_an_election(node, name, "a lock of another kind")),
    }
}

impl LockState {
    /// The leader of an election ([`Client::election`](crate::Client::election)) that
    /// this state shows: `None` when nobody holds the lock, or its holder is not an
    /// election's leader (it left no leader record).
    pub fn leader(&self) -> Option<Leader> {
        let Some(Holder::Plain { remaining }) = self.holder else {
            return None;
        };
        let (term, since_ms, info) = Leader::parse(self.holder_info.as_deref()?)?;
        Some(Leader {
            term: FencingToken::new(term),
            since: UNIX_EPOCH + Duration::from_millis(since_ms),
            info: info.to_owned(),
            remaining: remaining.unwrap_or(Duration::MAX),
        })
    }
}

fn not_an_election(node: &str, name: &str, found: &str) -> Error {
    Error::WrongType {
        node: node.to_owned(),
        key: name.to_owned(),
        found: found.to_owned(),
    }
}

/// Who leads an election, as one read found it ([`Election::leader`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leadership's term: its fencing token.
    pub term: FencingToken,
    /// When it began, by the Redis server's clock.
    pub since: SystemTime,
    /// What the leader said about itself ([`Election::holder_info`]).
    pub info: String,
    /// What was left of its lease when Redis answered (`Duration::MAX`: the key has no
    /// expiry, which fencelock never sets).
    pub remaining: Duration,
}

impl Leader {
    /// Reads a leader record, `term=<term> since_ms=<ms> <info>`.
    fn parse(record: &str) -> Option<(u64, u64, &str)> {
        let rest = record.strip_prefix("term=")?;
        let (term, rest) = rest.split_once(' ')?;
        let rest = rest.strip_prefix("since_ms=")?;
        let (since, info) = rest.split_once(' ').unwrap_or((rest, ""));
        Some((term.parse().ok()?, since.parse().ok()?, info))
    }
}

/// Leading an election, until [`resign`](Self::resign)ed, dropped, or
/// [lost](Self::lost). Its lease is renewed by the client's watchdog as a
/// [`LockGuard`]'s is; dropped unresigned, it resigns in the background.
///
/// Its `Debug` shows the name, the term and the lease, never the holder token.
#[derive(Debug)]
#[must_use = "leadership is resigned when it is dropped"]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &str {
        self.guard.name()
    }

    /// This leadership's term: higher than every term of this election before it. Send
    /// it with every write a resource must refuse from an older leader, as the fencing
    /// token it is.
    pub fn term(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// Completes when leadership is lost, with the reason, as
    /// [`LockGuard::lost`]: a renewal found the lease gone or someone else's, or no
    /// renewal was confirmed in time. Stop leading then: a standby may lead already.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub fn lost(&self) -> impl Future<Output = LossCause> + Send + 'static + use<> {
        self.guard.lost()
    }

    /// Whether leadership is known to be lost, and why.
    pub fn loss_cause(&self) -> Option<LossCause> {
        self.guard.loss_cause()
    }

    /// How much of the lease is left by the local monotonic clock (as
    /// [`LockGuard::remaining`]).
    pub fn remaining(&self) -> Duration {
        self.guard.remaining()
    }

    /// Steps down: stops renewing, deletes the lease if it is still this leader's, wakes
    /// one campaigner and tells the followers that nobody leads.
    ///
    /// # Errors
    /// As [`LockGuard::release`]: [`Error::LeaseLost`] when leadership had already been
    /// lost.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before the reply, the resignation is sent again in the
    /// background.
    pub async fn resign(self) -> Result<(), Error> {
        self.guard.release().await
    }

    /// The lock guard the leadership is: for code that supervises any lock (the CLI's
    /// `elect` hands it to the supervision `run` uses). Releasing the guard resigns.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}

/// Follows an election's leader ([`Election::observe`]).
pub struct Observer {
    shared: Arc<Shared>,
    name: String,
    /// On the election's channel (none if the subscription failed: then only the reads
    /// on a timer find changes).
    subscriptions: Vec<Subscription>,
    current: Option<Leader>,
    /// When the read of `current` was sent.
    read_at: Instant,
}

/// The longest an observer waits between reads while a leader leads (its lease is at
/// most a day).
const LONGEST_WAIT: Duration = Duration::from_secs(86_400);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("name", &self.name)
            .field("subscribed", &!self.subscriptions.is_empty())
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// The leader as last read: by [`observe`](Election::observe) or the last
    /// [`changed`](Self::changed).
    pub fn leader(&self) -> Option<&Leader> {
        self.current.as_ref()
    }

    /// Waits for the leader to change (another term, or nobody leading, or someone
    /// leading again) and returns the new one. A leader that renews its lease is no
    /// change.
    ///
    /// # Errors
    /// A read's error ([`Election::leader`]); the observer stays usable.
    ///
    /// # Cancel safety
    /// Cancel safe: [`leader`](Self::leader) moves to another term only when a change
    /// is returned.
    pub async fn changed(&mut self) -> Result<Option<Leader>, Error> {
        loop {
            // With a leader: when its lease would end, counted from the read that
            // reported it.
            let until_read = match &self.current {
                Some(leader) => {
                    (self.read_at + leader.remaining.min(LONGEST_WAIT))
                        .saturating_duration_since(Instant::now())
                        + EXPIRY_MARGIN
                }
                None => RECHECK,
            };
            if self.subscriptions.is_empty() {
                // No channel (refused by the server's ACL, say): reading is all there is.
                tokio::time::sleep(until_read.min(RECHECK)).await;
            } else {
                // Built only over a non-empty list: `select_all` of nothing panics.
                let notified = futures_util::future::select_all(
                    self.subscriptions.iter().map(|s| Box::pin(s.notified())),
                );
                let _ = tokio::time::timeout(until_read, notified).await;
            }
            let read_at = Instant::now();
            let now = read_leader(&self.shared, &self.name).await?;
            self.read_at = read_at;
            let same = match (&now, &self.current) {
                (Some(a), Some(b)) => a.term == b.term,
                (None, None) => true,
                _ => false,
            };
            if same {
                // Renewed: its lease now ends later.
                self.current = now;
            } else {
                self.current.clone_from(&now);
                return Ok(now);
            }
        }
    }
}
