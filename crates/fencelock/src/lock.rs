//! Taking a lock ([`LockBuilder`]) and holding it ([`LockGuard`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Withdrawn;
use crate::delay_queue::{DelayQueue, ItemId};
use crate::engine::acquire::{self, Request};
use crate::engine::retry::Retry;
use crate::engine::watchdog::{Grant, Registration};
use crate::error::{Error, LossCause};
use crate::keys::LockKeys;
use crate::limits::{
    DEFAULT_LEASE, DEFAULT_WAITER_TIMEOUT, MAX_HOLD, MAX_LEASE, MAX_PERMITS, MAX_WAITER_TIMEOUT,
    MIN_LEASE, MIN_WAITER_TIMEOUT,
};
use crate::observe::{self, ReleaseKind, ReleaseOutcome};
use crate::protocols::{self, Protocol, checked_owner};
use crate::shared::Shared;
use crate::token::{FencingToken, HolderToken};

/// How to take one named lock: its TTL, how long to wait, in which order waiters are
/// served, and how to pace retries.
///
/// Made by [`Client::lock`](crate::Client::lock). Defaults: a 30 s lease renewed while the guard lives
/// ([`DEFAULT_LEASE`]), no maximum hold, no waiting (one attempt), not fair,
/// [`Retry::default`]. The builder can be kept and used again; each acquire draws a fresh
/// owner token.
///
/// # Leases
/// The client's watchdog renews the lease (to the [`lease`](Self::lease) length, every
/// third of it) for as long as the guard lives, so a crashed holder blocks others for at
/// most one lease while a slow one keeps its lock. [`max_hold`](Self::max_hold) caps the
/// renewals; with [`renew(false)`](Self::renew) the lease is fixed: it ends after one
/// lease unless you [`extend`](LockGuard::extend) it. Either way the guard's
/// [`lost`](LockGuard::lost) signal fires the moment the lease is known to be lost.
///
/// # How waiting works
/// A waiting acquire that finds the lock held subscribes to the lock's release channel
/// and then tries again, so the refusal it waits on came after the subscription and a
/// release after it is never missed. A release wakes at once one waiting
/// [`Client`](crate::Client) (one pub/sub message, then one round trip), rather than every
/// waiter when only one can win: each refused attempt lists its client on the lock's
/// wake list in Redis, and the release wakes the client listed earliest, whose
/// longest-waiting plain waiter then tries (beaten to the free lock by another caller,
/// that client goes back to the head of the list). A client whose connections are gone
/// (exited, crashed) is skipped; a woken waiter that is cancelled or fails before Redis
/// answered its attempt hands the wake to the next waiter of its client, or to the next
/// client; a client that hangs swallows one wake, and the others try again when the
/// lease that refused them would have ended. With nobody listed, or readers or reentrant
/// owners waiting behind the plain holder, a release wakes one plain waiter of every
/// client. A waiting acquire that ends without the lock takes its client off the list
/// (in the background) when no other waiter of the client waits for the lock.
/// Waiters with an [`reentrant`](Self::reentrant) owner are all woken (holds of one owner can be held
/// together). A [fair](Self::fair) release hands the lock to the waiter at the head of
/// the queue and wakes only that one.
///
/// Pub/sub is never trusted alone: every wait is also bounded by the holder's remaining
/// lease as Redis reported it, so a lost message, a dropped subscription or a holder
/// that died without releasing costs at most that lease. All waiters of one [`Client`](crate::Client)
/// share one subscription connection.
///
/// # Example
/// ```
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fencelock::Error> {
/// # let redis = testkit::RedisServer::start();
/// # let client = fencelock::Client::connect(&redis.url()).await?;
/// let orders = client
///     .lock("order:1042")
///     .lease(Duration::from_secs(10)) // renewed every 3.3 s while held
///     .max_hold(Duration::from_secs(60)) // never held longer than this
///     .wait(Duration::from_secs(2)) // wait for a holder to release
///     .fair(); // in arrival order
/// let guard = orders.acquire().await?;
/// // The builder can be kept; a try fails fast and says what blocks it.
/// match orders.try_acquire().await {
///     Err(fencelock::Error::Held { blocked_by, .. }) => println!("busy: {blocked_by}"),
///     other => panic!("{other:?}"),
/// }
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// # Which strategy fits on contention
/// - *Fail fast* ([`try_acquire`](Self::try_acquire), or no wait): for requests a
///   person is waiting on. [`Error::Held`] carries the holder's remaining lease, to
///   show or to retry after.
/// - *Wait* ([`wait`](Self::wait), [`wait_forever`](Self::wait_forever)): for
///   background work that must happen now and can afford to block a task.
/// - *Defer*: for message processing, where blocking would hold up the messages behind
///   this one: push the work on a [`DelayQueue`](crate::DelayQueue) and take it again
///   later.
///
/// Its `Debug` shows the settings but not a [reentrant](Self::reentrant) owner id, which
/// lets whoever knows it reenter and release the lock.
#[derive(Clone)]
pub struct LockBuilder {
    shared: Arc<Shared>,
    name: String,
    lease: Duration,
    /// Whether the watchdog renews the lease.
    renew: bool,
    max_hold: Option<Duration>,
    /// `None`: wait for ever.
    wait: Option<Duration>,
    /// Fair mode, with its waiter timeout.
    fair: Option<Duration>,
    /// Reentrant mode, with the owner id.
    owner: Option<String>,
    /// A semaphore, with its permit count.
    permits: Option<u32>,
    /// A read-write lock's read side.
    reader: bool,
    retry: Retry,
    /// What the holder says about itself.
    info: String,
    /// Replicas that must acknowledge a grant.
    replicas: u32,
}

impl std::fmt::Debug for LockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockBuilder")
            .field("client", &self.shared)
            .field("name", &self.name)
            .field("lease", &self.lease)
            .field("renew", &self.renew)
            .field("max_hold", &self.max_hold)
            .field("wait", &self.wait)
            .field("fair", &self.fair)
            .field("owner", &self.owner.as_ref().map(|_| "<redacted>"))
            .field("permits", &self.permits)
            .field("reader", &self.reader)
            .field("retry", &self.retry)
            .field("info", &self.info)
            .field("replicas", &self.replicas)
            .finish()
    }
}

impl LockBuilder {
    pub(crate) fn new(shared: Arc<Shared>, name: String) -> Self {
        Self {
            shared,
            name,
            lease: DEFAULT_LEASE,
            renew: true,
            max_hold: None,
            wait: Some(Duration::ZERO),
            fair: None,
            owner: None,
            permits: None,
            reader: false,
            retry: Retry::default(),
            info: String::new(),
            replicas: 0,
        }
    }

    /// How long one lease lasts (default 30 s, [`DEFAULT_LEASE`]; between [`MIN_LEASE`]
    /// and [`MAX_LEASE`], checked on acquire; whole milliseconds count). A holder that
    /// crashes blocks others for at most this long. Unless [`renew`](Self::renew) is
    /// turned off, the watchdog renews it to this length every third of it while the
    /// guard lives, so a slow holder keeps its lock.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Whether the watchdog renews the lease while the guard lives (default `true`).
    /// With `false` the lease is fixed: the lock is held for one [lease](Self::lease)
    /// unless you [`extend`](LockGuard::extend) or release it.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// The longest the lock may be held, counted from the acquire (default: no limit).
    /// Renewals stop there and the lease runs out, so a holder stuck for ever does not
    /// hold the lock for ever; its [`lost`](LockGuard::lost) signal then fires.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// How long [`acquire`](Self::acquire) waits for a held lock before giving up with
    /// [`Error::Held`] (default zero: one attempt).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Makes [`acquire`](Self::acquire) wait until the lock is free, however long that
    /// takes. Cancel the future (drop it, or race it in `tokio::select!`) to stop.
    pub fn wait_forever(mut self) -> Self {
        self.wait = None;
        self
    }

    /// Serves waiters in arrival order (default: not fair, the first attempt after a
    /// release wins).
    ///
    /// Waiters queue in Redis. A release hands the lock to the first in line inside its
    /// script, with a new fencing token, and its message tells that waiter, which then
    /// holds the lock without another round trip (if the lease handed over is shorter
    /// than the one asked for, because it ends at the waiter's deadline to call again,
    /// the watchdog extends it; with [`renew(false)`](Self::renew) the waiter's own call
    /// sets the lease first). A caller that arrives while others wait cannot take a free
    /// lock ahead of them, even with [`try_acquire`](Self::try_acquire). Each waiter
    /// calls Redis at least every
    /// third of the [waiter timeout](Self::waiter_timeout); one that stops (crashed,
    /// paused, cancelled without cleanup) is purged once its timeout runs out, so it
    /// delays the queue by at most the waiter timeout plus a third of it. Deadlines come
    /// from Redis's clock, never from comparing the clients' wall clocks.
    ///
    /// Every client of one lock name must agree on the mode: a plain acquire does not
    /// look at the queue. A [semaphore](Self::permits) can be fair too (its waiters take
    /// freed permits in arrival order, each woken by the release that frees its permit,
    /// then with a round trip of its own); a read-write lock's readers cannot (yet).
    pub fn fair(mut self) -> Self {
        self.fair.get_or_insert(DEFAULT_WAITER_TIMEOUT);
        self
    }

    /// Fair mode: how long a queued waiter may stay silent before the queue drops it
    /// (default [`DEFAULT_WAITER_TIMEOUT`], 3 s; between 30 ms and 1 h). Implies
    /// [`fair`](Self::fair). Shorter bounds the stall a crashed waiter causes; longer
    /// tolerates longer pauses of a live waiter, which otherwise loses its place.
    pub fn waiter_timeout(mut self, timeout: Duration) -> Self {
        self.fair = Some(timeout);
        self
    }

    /// Makes the lock reentrant for `owner` (default: not reentrant). The same owner
    /// acquiring again, from this process or any other that uses the same owner id (a
    /// job id passed between services, say), adds a hold instead of waiting; each
    /// release gives one hold back, and the last one frees the lock.
    ///
    /// Reentry does not issue a new fencing token: every hold of one owner shares the
    /// token of its first hold, since they are one critical section. In this mode the
    /// lock key is a hash (`owner`, `fence`, one `hold:<token>` field per hold) instead
    /// of the plain string of the other modes; plain callers see it as held. Not
    /// combinable with [`fair`](Self::fair). The owner id: 1 to 256 bytes, no control
    /// characters.
    pub fn reentrant(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Makes this a semaphore with `permits` permits (default: a lock, one holder):
    /// up to that many holders at once, each holding one permit as a lease of its own.
    /// Everything else is as for a lock: each permit is renewed by the watchdog (or
    /// fixed, with [`renew(false)`](Self::renew)), bounded by [`max_hold`](Self::max_hold),
    /// released by its owner only, withdrawn when an acquire is cancelled, and gone one
    /// lease after its holder crashed; each grant gets a fencing token of its own, higher
    /// than every token granted before it under this name. Waiting is as for a plain
    /// lock with nobody on its wake list: a release wakes one waiter per
    /// [`Client`](crate::Client), and every wait is
    /// also bounded by the end of the first held permit's lease. [`Error::Held`] says
    /// [`Blocker::Permits`](crate::Blocker::Permits): how many permits there are and when
    /// the first frees.
    ///
    /// The first acquire sets the semaphore's permit count; one that asks for another
    /// count gets [`Error::PermitsMismatch`], and nothing changes (the count is kept for
    /// as long as the fencing counter,
    /// [`fence_counter_idle`](crate::ClientBuilder::fence_counter_idle));
    /// [`Client::set_permits`](crate::Client::set_permits) changes it. A name is one
    /// kind of primitive: a lock acquire on a semaphore's name, or the other way round,
    /// gets [`Error::WrongType`] naming the kind found. One node (standalone, Sentinel or
    /// Cluster) only: Redlock refuses it with [`Error::InvalidArgument`]. Not combinable
    /// (yet) with [`reentrant`](Self::reentrant), [`shared`](Self::shared) or
    /// [`holder_info`](Self::holder_info): [`Error::InvalidArgument`] too. `permits`: 1
    /// to 1,000,000, checked on acquire.
    ///
    /// With [`fair`](Self::fair), waiters are served in arrival order: a freed permit goes
    /// to the first waiter in line (the release wakes that one only), and a newcomer does
    /// not take a free permit while others wait ([`Blocker::Queue`](crate::Blocker::Queue));
    /// a waiter that stops calling is purged after its [waiter
    /// timeout](Self::waiter_timeout), as in a fair lock. Every client of the name must
    /// agree on the mode.
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    /// Makes this the read side of a read-write lock (default: the write side, which is
    /// the plain lock, or with [`reentrant`](Self::reentrant) the reentrant one). Many
    /// readers hold it at once, each with a lease of its own, while no writer does; a
    /// writer holds it alone. Leases, renewal, [`max_hold`](Self::max_hold), release,
    /// cancellation and crashed holders are as for a lock; every grant on either side
    /// gets a fencing token from the one counter of the name, so a writer's token is
    /// higher than every reader's granted before it (and the other way round).
    ///
    /// **Writers are not starved.** A writer that finds readers and waits registers as
    /// waiting; from then on new readers queue behind it ([`Error::Held`] with
    /// [`Blocker::WritersWaiting`](crate::Blocker::WritersWaiting)), and it gets the lock
    /// when the readers already in have left (or their leases ran out). It stays
    /// registered for one lease from each of its attempts, and it calls again at least
    /// every third of its lease: a writer that crashes while waiting holds new readers
    /// back for at most one lease; one that gives up or is cancelled withdraws at once
    /// and wakes them. A writer that only tries ([`try_acquire`](Self::try_acquire))
    /// does not register. Waiting readers are all woken by a writer's release.
    ///
    /// **Reentrancy by owner**, with [`reentrant`](Self::reentrant) on both sides: a
    /// reader whose owner holds the reentrant write lock gets the read side as one more
    /// hold of that lock (same fencing token; the write lock stays held until every hold
    /// is released); a reader whose owner already reads gets in even while writers wait
    /// (its owner would otherwise wait for a writer that waits for it). A plain writer
    /// has no owner, so it cannot take the read side while it writes: that waits for
    /// itself, until the wait runs out.
    ///
    /// One node (standalone, Sentinel or Cluster): Redlock refuses it with
    /// [`Error::InvalidArgument`]; so do [`fair`](Self::fair), [`permits`](Self::permits)
    /// and [`holder_info`](Self::holder_info) with it. Every writer of the name must be a
    /// plain or reentrant lock: a fair lock or a semaphore on a name readers hold gets
    /// [`Error::WrongType`], and a reader on a semaphore's name likewise.
    pub fn shared(mut self) -> Self {
        self.reader = true;
        self
    }

    fn protocol(&self) -> Result<Arc<dyn Protocol>, Error> {
        if let Some(permits) = self.permits {
            return self.semaphore_mode(permits);
        }
        if self.reader {
            return self.read_mode();
        }
        if self.shared.backend.is_redlock() && (self.fair.is_some() || self.owner.is_some()) {
            return Err(Error::invalid(
                "lock mode",
                "fair and reentrant locks need a single Redis node: a fair queue needs one \
                 authority on arrival order, and reentrant holds one place to count them; \
                 Redlock clients take plain locks",
            ));
        }
        match (&self.fair, &self.owner) {
            (Some(_), Some(_)) => Err(Error::invalid(
                "lock mode",
                "a lock cannot be both fair and reentrant; choose one",
            )),
            (Some(waiter_timeout), None) => {
                Error::check_range(
                    "waiter timeout",
                    *waiter_timeout,
                    MIN_WAITER_TIMEOUT,
                    MAX_WAITER_TIMEOUT,
                )?;
                Ok(Arc::new(protocols::Fair::new(*waiter_timeout)))
            }
            (None, Some(owner)) => Ok(Arc::new(protocols::Reentrant::new(checked_owner(owner)?))),
            (None, None) => Ok(Arc::new(protocols::Plain)),
        }
    }

    fn read_mode(&self) -> Result<Arc<dyn Protocol>, Error> {
        if self.shared.backend.is_redlock() {
            return Err(Error::invalid(
                "lock mode",
                "a read-write lock needs a single Redis node (standalone, Sentinel or \
                 Cluster): its readers are counted in one place, and independent majorities \
                 of readers and of a writer could overlap",
            ));
        }
        if self.fair.is_some() {
            return Err(Error::invalid(
                "lock mode",
                "a read-write lock's readers are not fair (yet): writers already go before \
                 new readers; drop fair()",
            ));
        }
        if !self.info.is_empty() {
            return Err(Error::invalid(
                "holder info",
                "readers do not store holder info (yet): one key, many readers",
            ));
        }
        Ok(Arc::new(protocols::Read::new(match &self.owner {
            Some(owner) => checked_owner(owner)?,
            None => String::new(),
        })))
    }

    fn semaphore_mode(&self, permits: u32) -> Result<Arc<dyn Protocol>, Error> {
        check_semaphore(&self.shared.backend, permits)?;
        if self.owner.is_some() || self.reader {
            return Err(Error::invalid(
                "lock mode",
                "a semaphore is not reentrant (yet), nor a read-write lock: drop reentrant() \
                 or shared()",
            ));
        }
        if let Some(waiter_timeout) = self.fair {
            Error::check_range(
                "waiter timeout",
                waiter_timeout,
                MIN_WAITER_TIMEOUT,
                MAX_WAITER_TIMEOUT,
            )?;
        }
        if !self.info.is_empty() {
            return Err(Error::invalid(
                "holder info",
                "a semaphore does not store holder info (yet): one permit set, many holders",
            ));
        }
        Ok(Arc::new(protocols::Semaphore::new(permits, self.fair)))
    }

    /// What the holder says about itself, for operators: stored in a key next to the
    /// lock's ([`keys`](crate::keys)) for as long as this holder holds it (renewed and
    /// released with the lease), and shown by [`Client::inspect`](crate::Client::inspect)
    /// (the CLI's `fencelock status`). Never in the lock key itself, whose format stays
    /// the plain token other libraries read. Default: nothing. Plain and fair locks; up
    /// to 4 KiB, checked on acquire.
    pub fn holder_info(mut self, info: impl Into<String>) -> Self {
        self.info = info.into();
        self
    }

    /// How many replicas of the node must acknowledge a grant before it counts (default
    /// 0: none). After the grant, `WAIT replicas` runs for up to a tenth of the lease (at
    /// most 1 s); a grant that fewer replicas acknowledged is released again and
    /// reported as [`Error::Unreplicated`].
    ///
    /// What it shrinks: the window in which a failover to a replica loses a fresh grant
    /// (replication is asynchronous; without it, a grant the master acknowledged may not
    /// have reached any replica when the master dies). What it cannot fix: a replica
    /// that acknowledged can still be passed over by the failover, and a renewal or a
    /// release is not waited for, so a failover can still lose the lease's later state
    /// (the fencing token, which is at least the server clock, keeps working across it).
    /// A server that refuses `WAIT` (some managed services) gives [`Error::Rejected`]
    /// saying so. One node only: Redlock refuses it with [`Error::InvalidArgument`].
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.replicas = replicas;
        self
    }

    /// How to pace attempts while waiting when release notifications are unavailable
    /// (default [`Retry::default`]).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes one attempt: the lock is taken or not, in one round trip.
    ///
    /// # Errors
    /// [`Error::Held`] (with the holder's remaining lease) when another owner holds it;
    /// [`Error::InvalidArgument`], [`Error::WrongType`], [`Error::Unavailable`],
    /// [`Error::Rejected`] as their docs say.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped after the attempt was sent, a release of
    /// this attempt's token is sent in the background, so nothing is left behind (at
    /// worst a key that expires after the TTL, if Redis is unreachable).
    ///
    /// The returned future owns a copy of the settings, so it is `'static` and can be
    /// spawned.
    pub fn try_acquire(
        &self,
    ) -> impl Future<Output = Result<LockGuard, Error>> + Send + 'static + use<> {
        let this = self.clone();
        async move { this.run_acquire(Some(Duration::ZERO)).await }
    }

    /// Takes the lock, waiting for it as configured with [`wait`](Self::wait) or
    /// [`wait_forever`](Self::wait_forever).
    ///
    /// Every attempt of one call uses the same owner token, so an attempt whose reply
    /// was lost (a timeout) and a later attempt that finds the token in Redis resolve to
    /// one grant with one fencing token. While waiting, an unreachable node is retried
    /// until the deadline; its error is returned if the deadline passes.
    ///
    /// # Errors
    /// [`Error::Held`] when the wait runs out (at once with a zero wait), and the
    /// errors of [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`try_acquire`](Self::try_acquire): a dropped wait leaves no key
    /// behind that it may have written.
    ///
    /// The returned future owns a copy of the settings, so it is `'static` and can be
    /// spawned.
    pub fn acquire(
        &self,
    ) -> impl Future<Output = Result<LockGuard, Error>> + Send + 'static + use<> {
        let this = self.clone();
        async move { this.run_acquire(this.wait).await }
    }

    /// Takes the lock in one attempt, or, if another owner holds it, defers the work:
    /// pushes `payload` on `queue`, due after `delay`, for a consumer to
    /// [`take`](crate::DelayQueue::take) and try again later. The third answer to
    /// contention, beside failing fast and waiting: right for message processing, where
    /// waiting would hold up the messages behind this one.
    ///
    /// # Errors
    /// The errors of [`try_acquire`](Self::try_acquire) other than [`Error::Held`]
    /// (which becomes [`Acquisition::Deferred`]), and those of
    /// [`DelayQueue::push`](crate::DelayQueue::push).
    ///
    /// # Cancel safety
    /// Cancel safe as far as the lock goes (see [`try_acquire`](Self::try_acquire)). If
    /// dropped during the push, the item may or may not have been queued.
    pub async fn acquire_or_defer(
        &self,
        queue: &DelayQueue,
        payload: impl AsRef<[u8]>,
        delay: Duration,
    ) -> Result<Acquisition, Error> {
        match self.try_acquire().await {
            Ok(guard) => Ok(Acquisition::Acquired(guard)),
            Err(Error::Held { .. }) => Ok(Acquisition::Deferred(queue.push(payload, delay).await?)),
            Err(e) => Err(e),
        }
    }

    /// Runs `work` under the lock: acquires (waiting as configured), gives `work` the
    /// fencing token, and releases when it finishes. If the lease is lost first, `work`
    /// is cancelled (its future dropped at its next await point) and the result is
    /// [`Error::LeaseLost`]: the caller cannot forget to check.
    ///
    /// # Errors
    /// The errors of [`acquire`](Self::acquire); [`Error::LeaseLost`] when the lease was
    /// lost while `work` ran (then `work` was cancelled) or by the time it finished (its
    /// result is then dropped, since it may have overlapped another holder's work).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future cancels `work` and releases the lock in the
    /// background.
    pub async fn run<F, Fut, T>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire().await?;
        let lost = guard.lost();
        let output = tokio::select! {
            output = work(guard.fencing_token()) => output,
            cause = lost => {
                return Err(Error::LeaseLost { name: self.name.clone(), cause });
            }
        };
        match guard.release().await {
            Ok(()) => Ok(output),
            Err(e @ Error::LeaseLost { .. }) => Err(e),
            Err(e) => {
                // The lease held until now; the key expires by itself.
                tracing::warn!(lock = self.name.as_str(), error = %e, "release after the work failed");
                Ok(output)
            }
        }
    }

    async fn run_acquire(&self, wait: Option<Duration>) -> Result<LockGuard, Error> {
        let ttl = checked_ttl(self.lease)?;
        if let Some(max_hold) = self.max_hold {
            Error::check_range("maximum hold", max_hold, MIN_LEASE, MAX_HOLD)?;
        }
        self.retry.validate()?;
        if self.replicas > 0 && self.shared.backend.is_redlock() {
            return Err(Error::invalid(
                "replicas",
                "replica acknowledgement is for one node (a master with replicas); Redlock \
                 nodes are independent masters",
            ));
        }
        if self.info.len() > 4096 {
            return Err(Error::invalid(
                "holder info",
                format!("it is {} bytes long; the limit is 4096", self.info.len()),
            ));
        }
        // The first lease may not outlast the maximum hold either.
        let (acquire_ttl, capped) = match self.max_hold {
            Some(h) => {
                let cap = Duration::from_millis(h.as_millis() as u64).max(MIN_LEASE);
                (ttl.min(cap), cap <= ttl)
            }
            None => (ttl, false),
        };
        let request = Request {
            name: &self.name,
            keys: LockKeys::new(&self.shared.prefix, &self.name)?,
            protocol: self.protocol()?,
            ttl: acquire_ttl,
            wait,
            retry: self.retry,
            info: &self.info,
            replicas: self.replicas,
            renew: self.renew,
        };
        let granted = acquire::acquire(&self.shared.backend, request).await?;
        // No await from here on: the grant becomes a guard in this poll, so a dropped
        // future cannot lose it in between.
        Ok(LockGuard::watched(
            self.shared.clone(),
            self.name.clone(),
            Held {
                keys: granted.keys,
                token: granted.token,
                protocol: granted.protocol,
                fence: granted.fence,
                asked_ttl: acquire_ttl,
                ttl,
                renew: self.renew,
                hold_until: self.max_hold.map(|h| granted.sent_at + h),
            },
            Grant {
                sent_at: granted.sent_at,
                ttl: granted.ttl,
                // A handover's lease may end before the maximum hold does.
                capped: capped && granted.ttl == acquire_ttl,
                valid_until: granted.valid_until,
            },
        ))
    }
}

/// What a guard holds, apart from its client and name: for a guard made from a grant or
/// from a [`DetachedLock`](crate::DetachedLock) taken over.
pub(crate) struct Held {
    pub keys: LockKeys,
    pub token: HolderToken,
    pub protocol: Arc<dyn Protocol>,
    pub fence: FencingToken,
    /// The TTL the grant asked for (a Redlock release gives each node a share of it).
    pub asked_ttl: Duration,
    /// The lease each renewal asks for.
    pub ttl: Duration,
    pub renew: bool,
    /// The maximum hold's end.
    pub hold_until: Option<Instant>,
}

fn checked_ttl(ttl: Duration) -> Result<Duration, Error> {
    Error::check_range("lease", ttl, MIN_LEASE, MAX_LEASE)?;
    Ok(Duration::from_millis(ttl.as_millis() as u64))
}

/// Whether `backend` can hold a semaphore of `permits` permits: one node, 1 to
/// [`MAX_PERMITS`].
pub(crate) fn check_semaphore(
    backend: &crate::backend::Backend,
    permits: u32,
) -> Result<(), Error> {
    if backend.is_redlock() {
        return Err(Error::invalid(
            "lock mode",
            "a semaphore needs a single Redis node (standalone, Sentinel or Cluster): its \
             permits are counted in one place, and Redlock's majority of independent counts \
             would not bound the holders",
        ));
    }
    if !(1..=MAX_PERMITS).contains(&permits) {
        return Err(Error::invalid(
            "permits",
            format!("{permits} must be 1 to {MAX_PERMITS}"),
        ));
    }
    Ok(())
}

/// The outcome of [`LockBuilder::acquire_or_defer`].
#[derive(Debug)]
#[must_use = "an acquired lock is released when the guard is dropped"]
// Returned once per call and matched at once; boxing the guard would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Acquisition {
    /// The lock was free: do the work now.
    Acquired(LockGuard),
    /// The lock was held: the work item went on the delay queue under this id.
    Deferred(ItemId),
}

/// A held lock. Release it with [`release`](Self::release); a guard dropped unreleased
/// releases in the background.
///
/// What holding means: until [`valid_until`](Self::valid_until), no other client of any
/// library that follows the protocol holds this lock on this Redis node, as long as that
/// node keeps its data (no failover to a replica that missed the key, no restart without
/// persistence) and the clocks' rates agree within the allowed drift. It does not mean
/// your code finishes before then: a pause (GC, swap, a stopped process) can outlast the
/// lease. Protect writes that must never interleave with the [fencing
/// token](Self::fencing_token).
///
/// ```
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fencelock::Error> {
/// # let redis = testkit::RedisServer::start();
/// # let client = fencelock::Client::connect(&redis.url()).await?;
/// # async fn write_with_token(_token: fencelock::FencingToken) {}
/// let guard = client.lock("stock:42").try_acquire().await?;
/// tokio::select! {
///     cause = guard.lost() => return Err(fencelock::Error::LeaseLost {
///         name: guard.name().to_owned(),
///         cause,
///     }),
///     () = write_with_token(guard.fencing_token()) => {}
/// }
/// assert!(guard.remaining() > Duration::from_secs(25)); // of the 30 s lease
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// Its `Debug` shows the lock name, the fencing token and the lease, but neither the
/// [holder token](Self::holder_token) nor a reentrant owner id: either lets whoever
/// knows it release the lock or, for the owner id, reenter it.
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    shared: Arc<Shared>,
    name: String,
    keys: LockKeys,
    token: HolderToken,
    protocol: Arc<dyn Protocol>,
    /// The TTL of the grant (Redlock nodes get a share of it to answer a release).
    ttl: Duration,
    fence: FencingToken,
    /// The watched lease; `None` once released (which stops its renewal).
    lease: Option<Registration>,
    /// Whether a release is still owed (false after release, or once the lease is known
    /// to be lost).
    held: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("client", &self.shared)
            .field("name", &self.name)
            .field("fencing_token", &self.fence)
            .field("mode", &self.protocol)
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// A guard of `held`, granted (or confirmed) by `grant`, its lease watched from now.
    pub(crate) fn watched(shared: Arc<Shared>, name: String, held: Held, grant: Grant) -> Self {
        let registration = shared.watchdog.watch(
            held.keys.lock.clone(),
            held.protocol.holder_id(&held.token).into_owned(),
            held.ttl,
            held.renew,
            held.hold_until,
            grant,
        );
        LockGuard {
            shared,
            name,
            keys: held.keys,
            token: held.token,
            protocol: held.protocol,
            ttl: held.asked_ttl,
            fence: held.fence,
            lease: Some(registration),
            held: true,
        }
    }

    /// Lets go of the lock without releasing it, for another guard to take over with
    /// [`Client::attach`](crate::Client::attach) — in this process, or in another that
    /// gets [`DetachedLock::to_text`](crate::DetachedLock::to_text). Nothing is sent:
    /// renewal stops, the key keeps its lease in Redis, and nobody renews it until it is
    /// attached again; if that does not happen within the lease, the lock expires (the
    /// attach then fails with [`Error::LeaseLost`]).
    ///
    /// What it is for: keeping a lock across something that stops this process, such as
    /// the CLI keeping the lease of a job suspended with Ctrl-Z from a helper process,
    /// or handing a lock to a process started to do the work.
    pub fn detach(mut self) -> crate::DetachedLock {
        let registration = self.lease.take();
        self.held = false; // no release on drop
        crate::DetachedLock {
            name: std::mem::take(&mut self.name),
            token: self.token.clone(),
            protocol: self.protocol.clone(),
            fence: self.fence,
            ttl: registration.as_ref().map_or(self.ttl, Registration::ttl),
            renew: registration.as_ref().is_some_and(Registration::renews),
            max_hold_end: registration
                .as_ref()
                .and_then(Registration::hold_until)
                .map(|end| {
                    std::time::SystemTime::now() + end.saturating_duration_since(Instant::now())
                }),
        }
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of this grant: higher than every token handed out for this lock
    /// name before. Send it with every write to the protected resource.
    pub fn fencing_token(&self) -> FencingToken {
        self.fence
    }

    /// The random token stored in the lock key while this guard holds it.
    pub fn holder_token(&self) -> &HolderToken {
        &self.token
    }

    /// When the lease ends, at the latest, by this process's monotonic clock: measured
    /// from just before the request that Redis last confirmed (the acquire, a renewal,
    /// an extend) was sent, minus an allowance for clock drift of 1% of the TTL plus
    /// 2 ms. Only a confirmed renewal moves it forward; never taken from the wall clock.
    pub fn valid_until(&self) -> Instant {
        self.lease()
            .map_or_else(Instant::now, |l| l.lease().valid_until())
    }

    /// How much of the lease is left by the local monotonic clock (zero once past
    /// [`valid_until`](Self::valid_until)).
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Completes when the lease is lost, with the reason: a renewal found the key gone
    /// or someone else's, or no renewal was confirmed and the lease is about to run out
    /// by the local clock (at [`valid_until`](Self::valid_until) minus a tenth of the
    /// TTL last granted, at most 1 s), or a fixed lease or the
    /// [maximum hold](LockBuilder::max_hold) reached that point. Never completes for a
    /// lease that is kept, or after the guard was released.
    ///
    /// Race your work against it (`tokio::select!`), or let
    /// [`LockBuilder::run`] do that for you.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub fn lost(&self) -> impl Future<Output = LossCause> + Send + 'static + use<> {
        let watched = self
            .lease
            .as_ref()
            .map(|r| (r.lease().lost_token(), r.lease_arc()));
        async move {
            match watched {
                Some((token, lease)) => {
                    token.cancelled().await;
                    lease.cause().unwrap_or(LossCause::Expired)
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Whether the loss signal has fired, and why.
    pub fn loss_cause(&self) -> Option<LossCause> {
        self.lease().and_then(|r| r.lease().cause())
    }

    fn lease(&self) -> Option<&Registration> {
        self.lease.as_ref()
    }

    /// Resets the lease to `ttl` from now, if this guard still holds the lock. Never
    /// re-creates an expired lock, and never goes past the
    /// [maximum hold](LockBuilder::max_hold) (the TTL is shortened to end there). The
    /// watchdog, if it renews this lease, goes on renewing it to its own lease length
    /// afterwards, starting within a third of `ttl`.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the key expired or belongs to another owner now (the
    /// guard then owes no release), the maximum hold was reached, or the loss signal
    /// ([`lost`](Self::lost)) has fired already;
    /// [`Error::InvalidArgument`] for a TTL out of range;
    /// [`Error::Unavailable`], [`Error::Rejected`], [`Error::WrongType`].
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the extend may or may not have happened on the server,
    /// and [`valid_until`](Self::valid_until) keeps its earlier value.
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let ttl = checked_ttl(ttl)?;
        // Once the holder has been told of a loss, the lease stays lost: work raced
        // against `lost()` has stopped, and a later extend must not pretend otherwise.
        if let Some(cause) = self.loss_cause() {
            return Err(Error::LeaseLost {
                name: self.name.clone(),
                cause,
            });
        }
        // Not past the maximum hold either.
        let (ttl, capped) = match self.lease() {
            Some(r) => match r.lease().capped_ttl(ttl, Instant::now()) {
                Some(capped) => capped,
                None => {
                    r.lease().lose(LossCause::MaxHold);
                    return Err(Error::LeaseLost {
                        name: self.name.clone(),
                        cause: LossCause::MaxHold,
                    });
                }
            },
            None => (ttl, false),
        };
        let holder = self.protocol.holder_id(&self.token);
        let extended = self
            .shared
            .backend
            .extend(&self.name, &self.keys, &holder, ttl)
            .await;
        match extended {
            Ok((sent_at, valid_until)) => {
                if let Some(r) = self.lease() {
                    r.extended(Grant {
                        sent_at,
                        ttl,
                        capped,
                        valid_until,
                    });
                }
                Ok(())
            }
            Err(e @ Error::LeaseLost { .. }) => {
                self.held = false;
                if let (Some(r), Error::LeaseLost { cause, .. }) = (self.lease(), &e) {
                    r.lease().lose(*cause);
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases the lock: stops its renewal at once, then deletes the key if it still
    /// holds this guard's token.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease had already ended (the key expired, or another
    /// owner holds it now): the lock is not yours and nothing was deleted, but work done
    /// under it may have overlapped. [`Error::Unavailable`] when Redis could not be
    /// reached or did not answer in time: on a standalone, Sentinel or Redlock node a
    /// release that timed out or was lost with its connection is kept and sent again
    /// (up to three times) once that server answers a later call of this client;
    /// otherwise the key expires after its TTL. [`Error::Rejected`],
    /// [`Error::WrongType`].
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped before the reply, the guard's drop sends the release again
    /// in the background (releasing twice is harmless: the second finds the key gone).
    pub async fn release(mut self) -> Result<(), Error> {
        // No renewal is sent for this lease from here on.
        self.lease = None;
        let started = Instant::now();
        let result = self
            .shared
            .backend
            .release(
                &self.name,
                &self.keys,
                &self.token,
                &*self.protocol,
                self.ttl,
                self.fence.get(),
            )
            .await;
        if !matches!(result, Err(Error::Unavailable { .. })) {
            self.held = false;
        }
        let elapsed = started.elapsed();
        let outcome = ReleaseOutcome::of(&result);
        observe::released(ReleaseKind::Release, outcome, Some(elapsed));
        let (lock, fencing_token) = (self.name.as_str(), self.fence.get());
        let (outcome, elapsed_ms) = (outcome.as_str(), observe::ms(elapsed));
        match &result {
            Ok(()) => {
                tracing::debug!(lock, outcome, fencing_token, elapsed_ms, "lock released");
            }
            Err(e) => {
                tracing::debug!(lock, outcome, fencing_token, elapsed_ms, error = %e, "release failed");
            }
        }
        result
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.lease = None; // stop renewing before anything else
        if self.held {
            self.shared.backend.abandon_in_background(
                Withdrawn::Guard,
                &self.keys,
                &self.token,
                &self.protocol,
                self.ttl,
                self.fence.get(),
            );
        }
    }
}
