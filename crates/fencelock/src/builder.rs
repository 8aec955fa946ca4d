//! What every acquire shares, whatever it takes: [`AcquireBuilder`], its lease settings,
//! and the acquire itself. What differs between a lock, a semaphore and a read lock is
//! its [`Kind`] (`lock.rs`, `semaphore.rs`, `rwlock.rs`).

use std::sync::Arc;
use std::time::Duration;

use crate::delay_queue::{DelayQueue, ItemId};
use crate::engine::acquire::{Acquired, Request};
use crate::engine::driver;
use crate::engine::retry::Retry;
use crate::error::Error;
use crate::guard::{Holding, LockGuard};
use crate::keys::LockKeys;
use crate::limits::{DEFAULT_LEASE, MAX_HOLD, MIN_LEASE, checked_ttl};
use crate::shared::Shared;
use crate::token::FencingToken;

/// How to take one named lock, semaphore permit or read side: its lease, how long to
/// wait, how to pace retries. Used as [`LockBuilder`](crate::LockBuilder) (from
/// [`Client::lock`](crate::Client::lock)), [`SemaphoreBuilder`](crate::SemaphoreBuilder)
/// ([`Client::semaphore`](crate::Client::semaphore)) and
/// [`ReadLockBuilder`](crate::ReadLockBuilder)
/// ([`Client::read_lock`](crate::Client::read_lock)); what only one of them has is on
/// its page.
///
/// Defaults: a 30 s lease renewed while the guard lives
/// ([`DEFAULT_LEASE`]), no maximum hold, no waiting (one attempt), [`Retry::default`].
/// The builder can be kept and used again; each acquire draws a fresh owner token.
///
/// # Leases
/// The client's watchdog renews the lease (to the [`lease`](Self::lease) length, every
/// third of it) for as long as the guard lives, so a crashed holder blocks others for at
/// most one lease while a slow one keeps its lock. [`max_hold`](Self::max_hold) caps the
/// renewals; with [`renew(false)`](Self::renew) the lease is fixed: it ends after one
/// lease unless you [`extend`](LockGuard::extend) it. Either way the guard's
/// [`lost`](LockGuard::lost) signal fires the moment the lease is known to be lost.
///
/// Pub/sub is never trusted alone: every wait is also bounded by the holder's remaining
/// lease as Redis reported it, so a lost message, a dropped subscription or a holder
/// that died without releasing costs at most that lease.
///
/// # Which strategy fits on contention
/// - *Fail fast* ([`try_acquire`](Self::try_acquire), or no wait): for requests a
///   person is waiting on. [`Error::Held`] carries what blocks it (the holder's
///   remaining lease), to show or to retry after.
/// - *Wait* ([`wait`](Self::wait), [`wait_forever`](Self::wait_forever)): for
///   background work that must happen now and can afford to block a task.
/// - *Defer* ([`acquire_or_defer`](Self::acquire_or_defer)): for message processing,
///   where blocking would hold up the messages behind this one: push the work on a
///   [`DelayQueue`](crate::DelayQueue) and take it again later.
///
/// What each kind refuses is a compile error where the types can say so: a lock has no
/// permits, a semaphore no reentrant owner, a read lock is not fair, and only a lock
/// carries holder info. None of these compiles:
/// ```compile_fail
/// # fn f(client: fencelock::Client) {
/// client.lock("pool").permits(2); // a semaphore is client.semaphore("pool", 2)
/// # }
/// ```
/// ```compile_fail
/// # fn f(client: fencelock::Client) {
/// client.semaphore("pool", 2).reentrant("job-42");
/// # }
/// ```
/// ```compile_fail
/// # fn f(client: fencelock::Client) {
/// client.read_lock("prices").fair(); // readers are not fair (yet)
/// # }
/// ```
/// ```compile_fail
/// # fn f(client: fencelock::Client) {
/// client.read_lock("prices").holder_info("host a");
/// # }
/// ```
/// Several locks at once ([`MultiLockBuilder`](crate::MultiLockBuilder)) are neither fair
/// nor reentrant:
/// ```compile_fail
/// # fn f(client: fencelock::Client) {
/// client.lock_all(["a", "b"]).fair(); // take fair locks one by one
/// # }
/// ```
/// ```compile_fail
/// # fn f(client: fencelock::Client) {
/// client.lock_all(["a", "b"]).reentrant("job-42");
/// # }
/// ```
/// What depends on the servers (Redlock refuses fair, reentrant, semaphore and read
/// locks) or on two settings together (a lock both fair and reentrant) stays an
/// [`Error::InvalidArgument`] from the acquire, with nothing sent.
/// ```
/// # fn f(client: fencelock::Client) {
/// client.lock("pool").fair(); // what the examples above get wrong, right
/// client.semaphore("pool", 2).fair();
/// client.read_lock("prices").reentrant("job-42");
/// client.lock("report").holder_info("host a");
/// client.lock_all(["a", "b"]).holder_info("host a").wait(std::time::Duration::from_secs(1));
/// # }
/// ```
#[derive(Clone)]
pub struct AcquireBuilder<K: Target> {
    shared: Arc<Shared>,
    name: String,
    settings: Settings,
    kind: K,
}

/// The lease settings every kind shares (and a multi-lock, `multi.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub lease: Duration,
    /// Whether the watchdog renews the lease.
    pub renew: bool,
    pub max_hold: Option<Duration>,
    /// `None`: wait for ever.
    pub wait: Option<Duration>,
    pub retry: Retry,
    /// Replicas that must acknowledge a grant.
    pub replicas: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lease: DEFAULT_LEASE,
            renew: true,
            max_hold: None,
            wait: Some(Duration::ZERO),
            retry: Retry::default(),
            replicas: 0,
        }
    }
}

/// The leases an acquire asks for, once its [`Settings`] were checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Leases {
    /// Each renewal's lease.
    pub ttl: Duration,
    /// The first lease (no longer than the maximum hold).
    pub acquire_ttl: Duration,
    /// Whether the maximum hold shortened the first lease.
    pub capped: bool,
}

impl Settings {
    /// Checks the settings and the holder info before anything is sent: typed errors.
    pub(crate) fn check(&self, shared: &Shared, info: &str) -> Result<Leases, Error> {
        let ttl = checked_ttl(self.lease)?;
        if let Some(max_hold) = self.max_hold {
            Error::check_range("maximum hold", max_hold, MIN_LEASE, MAX_HOLD)?;
        }
        self.retry.validate()?;
        if self.replicas > 0 && shared.backend.is_redlock() {
            return Err(Error::invalid(
                "replicas",
                "replica acknowledgement is for one node (a master with replicas); Redlock \
                 nodes are independent masters",
            ));
        }
        if info.len() > 4096 {
            return Err(Error::invalid(
                "holder info",
                format!("it is {} bytes long; the limit is 4096", info.len()),
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
        Ok(Leases {
            ttl,
            acquire_ttl,
            capped,
        })
    }

    /// The guard of `acquired` (an acquire's, or one name of a multi-lock's grant). No
    /// await: a grant becomes its guard in the poll it arrives in.
    pub(crate) fn guard(
        &self,
        shared: &Arc<Shared>,
        name: String,
        acquired: Acquired,
        leases: Leases,
    ) -> LockGuard {
        let Acquired {
            keys,
            token,
            protocol,
            grant,
        } = acquired;
        LockGuard::watched(
            shared.clone(),
            name,
            Holding {
                keys,
                token,
                protocol,
                asked_ttl: leases.acquire_ttl,
                ttl: leases.ttl,
                renew: self.renew,
                hold_until: self.max_hold.map(|h| grant.sent_at + h),
            },
            &grant,
            // A handover's lease may end before the maximum hold does.
            leases.capped && grant.ttl == leases.acquire_ttl,
        )
    }
}

/// What an [`AcquireBuilder`] takes: one lock of a [`Kind`], or several plain locks at
/// once ([`MultiLockKind`](crate::MultiLockKind)). The lease settings are every
/// target's; the acquire gives a [`LockGuard`] for a `Kind`, a
/// [`MultiGuard`](crate::MultiGuard) for several. Sealed: the targets are fencelock's.
pub trait Target: sealed::Sealed + Clone + std::fmt::Debug + Send + Sync + 'static {}

/// A kind of one lock an [`AcquireBuilder`] takes: [`LockKind`](crate::LockKind),
/// [`SemaphoreKind`](crate::SemaphoreKind) or [`ReadLockKind`](crate::ReadLockKind).
/// Sealed: the kinds are fencelock's.
pub trait Kind: Target + sealed::OneLock {}

pub(crate) mod sealed {
    use std::sync::Arc;

    use crate::engine::Protocol;
    use crate::error::Error;

    /// The protocol a kind's settings ask for.
    pub struct Chosen(pub(crate) Arc<dyn Protocol>);

    pub trait Sealed {
        /// The builder's name, for `Debug`.
        const BUILDER: &'static str;
        /// What the holder says about itself (only a lock, a multi-lock and a campaign
        /// store it).
        fn info(&self) -> &str {
            ""
        }
    }

    /// A kind that takes one lock, permit or read side: its acquire gives a
    /// [`LockGuard`](crate::LockGuard).
    pub trait OneLock: Sealed {
        /// The protocol its settings ask for, on a Redlock client or not; what the
        /// types cannot refuse, refused here with [`Error::InvalidArgument`].
        fn protocol(&self, redlock: bool) -> Result<Chosen, Error>;
    }

    /// A kind whose holder can say something about itself
    /// ([`holder_info`](crate::AcquireBuilder::holder_info)).
    pub trait StoresInfo: Sealed {
        fn info_mut(&mut self) -> &mut String;
    }
}

impl<K: Target> std::fmt::Debug for AcquireBuilder<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(K::BUILDER)
            .field("client", &self.shared)
            .field("name", &self.name)
            .field("settings", &self.settings)
            .field("kind", &self.kind)
            .finish()
    }
}

impl<K: Target> AcquireBuilder<K> {
    pub(crate) fn new(shared: Arc<Shared>, name: String, kind: K) -> Self {
        Self {
            shared,
            name,
            settings: Settings::default(),
            kind,
        }
    }

    /// The client it belongs to.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The kind's settings, for its own builder methods.
    pub(crate) fn kind_mut(&mut self) -> &mut K {
        &mut self.kind
    }

    /// How long one lease lasts (default 30 s, [`DEFAULT_LEASE`]; between [`MIN_LEASE`]
    /// and [`MAX_LEASE`](crate::limits::MAX_LEASE), checked on acquire; whole
    /// milliseconds count). A holder that crashes blocks others for at most this long.
    /// Unless [`renew`](Self::renew) is turned off, the watchdog renews it to this
    /// length every third of it while the guard lives, so a slow holder keeps its lock.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// Whether the watchdog renews the lease while the guard lives (default `true`).
    /// With `false` the lease is fixed: the lock is held for one [lease](Self::lease)
    /// unless you [`extend`](LockGuard::extend) or release it.
    pub fn renew(mut self, renew: bool) -> Self {
        self.settings.renew = renew;
        self
    }

    /// The longest the lock may be held, counted from the acquire (default: no limit).
    /// Renewals stop there and the lease runs out, so a holder stuck for ever does not
    /// hold the lock for ever; its [`lost`](LockGuard::lost) signal then fires.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.settings.max_hold = Some(max_hold);
        self
    }

    /// How long [`acquire`](Self::acquire) waits for a held lock before giving up with
    /// [`Error::Held`] (default zero: one attempt).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.settings.wait = Some(wait);
        self
    }

    /// Makes [`acquire`](Self::acquire) wait until the lock is free, however long that
    /// takes. Cancel the future (drop it, or race it in `tokio::select!`) to stop.
    pub fn wait_forever(mut self) -> Self {
        self.settings.wait = None;
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
        self.settings.replicas = replicas;
        self
    }

    /// How to pace attempts while waiting when release notifications are unavailable
    /// (default [`Retry::default`]).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.settings.retry = retry;
        self
    }

    /// What the holder says about itself, for operators: stored in a key next to the
    /// lock's ([`keys`](crate::keys)) for as long as this holder holds it (renewed and
    /// released with the lease), and shown by [`Client::inspect`](crate::Client::inspect)
    /// (the CLI's `fencelock status`). Never in the lock key itself, whose format stays
    /// the plain token other libraries read. Default: nothing. Plain and fair locks, and
    /// every name of a multi-lock; up to 4 KiB, checked on acquire.
    pub fn holder_info(mut self, info: impl Into<String>) -> Self
    where
        K: sealed::StoresInfo,
    {
        *self.kind.info_mut() = info.into();
        self
    }

    /// The client, name and settings, for a kind's own acquire (`multi.rs`).
    pub(crate) fn parts(&self) -> (&Arc<Shared>, &Settings, &K) {
        (&self.shared, &self.settings, &self.kind)
    }
}

impl<K: Kind> AcquireBuilder<K> {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes one attempt: the lock is taken or not, in one round trip.
    ///
    /// # Errors
    /// [`Error::Held`] (with what blocks it) when another owner holds it;
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
    ) -> impl Future<Output = Result<LockGuard, Error>> + Send + 'static + use<K> {
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
    ) -> impl Future<Output = Result<LockGuard, Error>> + Send + 'static + use<K> {
        let this = self.clone();
        async move { this.run_acquire(this.settings.wait).await }
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
    ///
    /// The lock is released before this returns (the release awaited, not left to a
    /// background task), so a program that returns from `main` right after leaves no key
    /// behind. For work that can fail, see [`try_run`](Self::try_run).
    ///
    /// The returned future owns a copy of the settings (as [`acquire`](Self::acquire)'s),
    /// so `client.lock(name).run(work)` can be kept and awaited later.
    pub fn run<F, Fut, T>(
        &self,
        work: F,
    ) -> impl Future<Output = Result<T, Error>> + use<K, F, Fut, T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let this = self.clone();
        async move {
            let guard = this.acquire().await?;
            let lost = guard.lost();
            let output = tokio::select! {
                output = work(guard.fencing_token()) => output,
                cause = lost => {
                    return Err(Error::LeaseLost { name: this.name.clone(), cause });
                }
            };
            this.release_after_work(guard).await?;
            Ok(output)
        }
    }

    /// [`run`](Self::run) for work that can fail: `work` returns a `Result`, and its
    /// error comes back as it is, after the lock was released. The lock's own errors
    /// (taking it, a lease lost) come back converted with `From`, as `?` would convert
    /// them: so the error type is yours (an enum with a `fencelock::Error` variant,
    /// `Box<dyn std::error::Error>`, `anyhow::Error`), and `?` works inside `work`.
    ///
    /// ```
    /// #[derive(Debug)]
    /// enum SaleError {
    ///     Lock(fencelock::Error),
    ///     OutOfStock,
    /// }
    /// impl From<fencelock::Error> for SaleError {
    ///     fn from(e: fencelock::Error) -> Self {
    ///         SaleError::Lock(e)
    ///     }
    /// }
    ///
    /// async fn sell(client: &fencelock::Client, left: u32) -> Result<u32, SaleError> {
    ///     client
    ///         .lock("stock:42")
    ///         .try_run(|token| async move {
    ///             let left = left.checked_sub(1).ok_or(SaleError::OutOfStock)?;
    ///             println!("sold one under fencing token {token}; {left} left");
    ///             Ok(left)
    ///         })
    ///         .await
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let redis = testkit::RedisServer::start();
    /// # let client = fencelock::Client::connect(&redis.url()).await.unwrap();
    /// assert_eq!(sell(&client, 1).await.unwrap(), 0);
    /// assert!(matches!(sell(&client, 0).await, Err(SaleError::OutOfStock)));
    /// # }
    /// ```
    ///
    /// # Errors
    /// `work`'s error, after the release; the errors of [`run`](Self::run), converted
    /// with `From`. When `work` failed and the lease turned out lost at its release,
    /// `work`'s error is returned (its result was not kept anyway).
    ///
    /// # Cancel safety
    /// As [`run`](Self::run).
    pub fn try_run<F, Fut, T, E>(
        &self,
        work: F,
    ) -> impl Future<Output = Result<T, E>> + use<K, F, Fut, T, E>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let this = self.clone();
        async move {
            let guard = this.acquire().await?;
            let lost = guard.lost();
            let output = tokio::select! {
                output = work(guard.fencing_token()) => output,
                cause = lost => {
                    return Err(Error::LeaseLost { name: this.name.clone(), cause }.into());
                }
            };
            let released = this.release_after_work(guard).await;
            let output = output?;
            released?;
            Ok(output)
        }
    }

    /// Releases the lock after [`run`](Self::run)'s work: `Err` only when the lease had
    /// been lost (the work may have overlapped another holder's).
    async fn release_after_work(&self, guard: LockGuard) -> Result<(), Error> {
        match guard.release().await {
            Ok(()) => Ok(()),
            Err(e @ Error::LeaseLost { .. }) => Err(e),
            Err(e) => {
                // The lease held until now; the key expires by itself.
                tracing::warn!(lock = self.name.as_str(), error = %e, "release after the work failed");
                Ok(())
            }
        }
    }

    async fn run_acquire(&self, wait: Option<Duration>) -> Result<LockGuard, Error> {
        let info = self.kind.info();
        let leases = self.settings.check(&self.shared, info)?;
        let request = Request {
            name: &self.name,
            keys: LockKeys::new(&self.shared.prefix, &self.name)?,
            protocol: self.kind.protocol(self.shared.backend.is_redlock())?.0,
            ttl: leases.acquire_ttl,
            wait,
            retry: self.settings.retry,
            info,
            replicas: self.settings.replicas,
            renew: self.settings.renew,
        };
        let acquired = driver::acquire(&self.shared.backend, request).await?;
        // No await from here on: the grant becomes a guard in this poll, so a dropped
        // future cannot lose it in between.
        Ok(self
            .settings
            .guard(&self.shared, self.name.clone(), acquired, leases))
    }
}

/// The outcome of [`AcquireBuilder::acquire_or_defer`].
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
