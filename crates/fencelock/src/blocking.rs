//! The same primitives for code without an async runtime: CLIs, build tools, sync web
//! frameworks, tests (feature `blocking`).
//!
//! A thin layer over the async API, as reqwest's `blocking` is over its async client:
//! each [`Client`] starts a Tokio runtime of its own (one worker thread, which also runs
//! the watchdog that renews the leases while your thread works), and every call blocks
//! the calling thread on the async call of the same name. Nothing is implemented twice:
//! the guarantees, the errors and the cancel behaviour are those of the async API.
//!
//! What differs:
//!
//! - **Guards are released on drop, and the release is waited for.** A blocking drop can
//!   wait for Redis, unlike an async one: a [`LockGuard`] (or [`MultiGuard`],
//!   [`Leadership`]) dropped at the end of a scope, by an early `?` or a panic, releases
//!   the lock before the scope is left. [`LockGuard::release`] says how the release went;
//!   a drop cannot, and logs a failed release at `WARN`. Dropping the last clone of the
//!   [`Client`] waits for the releases still in flight ([`crate::Client::flush`]) before
//!   its runtime stops.
//! - **Work is not cancelled.** [`LockBuilder::run`] cannot cancel a closure that blocks:
//!   it runs to its end, and a lease lost meanwhile is reported then
//!   ([`Error::LeaseLost`], the work's result dropped). Check
//!   [`LockGuard::loss_cause`] between steps, and have the resource check the fencing
//!   token ([`crate::fence`]).
//! - **Not from inside a Tokio runtime.** Blocking there would stall the runtime's thread
//!   (Tokio panics when asked to): every call made from a thread that is inside a Tokio
//!   runtime (an async task, or `spawn_blocking`) returns [`Error::Blocking`] instead,
//!   having sent nothing. Use the async [`crate::Client`] there.
//!
//! ```
//! use std::time::Duration;
//!
//! fn sell_one(url: &str) -> Result<(), fencelock::Error> {
//!     let client = fencelock::blocking::Client::connect(url)?; // "redis://127.0.0.1:6379"
//!     let guard = client.lock("stock:42").wait(Duration::from_secs(5)).acquire()?;
//!     println!("holding stock:42 under fencing token {}", guard.fencing_token());
//!     Ok(()) // `guard` dropped: the lock is released, and the release waited for
//! }
//! # let redis = testkit::RedisServer::start();
//! # sell_one(&redis.url()).unwrap();
//! # assert!(!redis.exists("fencelock:{stock:42}"));
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{
    AcquireBuilder, DetachedLock, Error, FencingToken, HolderToken, Kind, Leader, Listing,
    LockKind, LockStatus, LossCause, LostLock, ReadLockKind, Resize, Retry, SemaphoreKind,
};

/// Setters that hand their arguments on to the setter of the same name of the async
/// value underneath (through the type's `map`), documented as that one (`$doc`).
macro_rules! forward {
    ($doc:literal: $($name:ident($($arg:ident: $t:ty),*)),* $(,)?) => {
        $(
            #[doc = concat!("[`", $doc, "::", stringify!($name), "`].")]
            pub fn $name(self $(, $arg: $t)*) -> Self {
                self.map(|inner| inner.$name($($arg),*))
            }
        )*
    };
}

/// The runtime of a blocking client, and the async client that lives on it.
struct Shared {
    /// `None` once dropped (see `Drop`).
    runtime: Option<tokio::runtime::Runtime>,
    client: crate::Client,
}

impl Shared {
    /// Runs `future` to its end on this client's runtime, blocking the calling thread;
    /// [`Error::Blocking`] from inside a Tokio runtime, with nothing run. There the
    /// future is dropped in the context of this client's runtime: a guard it owns
    /// releases in the background on this runtime, which outlives the caller's (a
    /// caller's runtime stopped first would cancel that release, leaving the key to
    /// expire), and a client dropped outside a runtime waits for it.
    fn block_on<F: Future>(&self, future: F) -> Result<F::Output, Error> {
        let runtime = self.runtime.as_ref().expect("the runtime lives until Drop");
        if let Err(e) = outside_runtime() {
            let _own = runtime.enter();
            drop(future);
            return Err(e);
        }
        Ok(runtime.block_on(future))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        if outside_runtime().is_ok() {
            // Releases of dropped guards and abandoned acquires finish before the
            // runtime stops (a stopped runtime cancels them: their keys would wait out
            // their leases).
            runtime.block_on(self.client.flush());
            drop(runtime);
        } else {
            // Inside another runtime nothing may block, not even a runtime's shutdown.
            runtime.shutdown_background();
        }
    }
}

/// `Err(Error::Blocking)` when the calling thread is inside a Tokio runtime.
fn outside_runtime() -> Result<(), Error> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::Blocking {
            reason: "called from inside a Tokio runtime, whose thread it would block; use \
                     the async fencelock::Client there"
                .to_owned(),
        });
    }
    Ok(())
}

/// A blocking client: the async [`crate::Client`] on a runtime of its own. Cheap to
/// clone; clones share the connection and the runtime, which stops (after the
/// releases in flight) when the last clone is dropped.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Client")
            .field(&self.shared.client)
            .finish()
    }
}

impl Client {
    /// Connects with default settings ([`crate::Client::connect`]).
    ///
    /// # Errors
    /// As [`crate::Client::connect`]; [`Error::Blocking`] from inside a Tokio runtime or
    /// when the client's runtime cannot be started.
    pub fn connect(url: &str) -> Result<Self, Error> {
        Self::from_builder(crate::Client::builder(url))
    }

    /// Connects with the settings of an async [`ClientBuilder`](crate::ClientBuilder):
    /// TLS, credentials, timeouts, Redlock, an application's `redis::Client`, ...
    ///
    /// ```
    /// # let redis = testkit::RedisServer::start();
    /// # let url = redis.url();
    /// let builder = fencelock::Client::builder(&url).prefix("jobs");
    /// let client = fencelock::blocking::Client::from_builder(builder)?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`ClientBuilder::connect`](crate::ClientBuilder::connect); [`Error::Blocking`]
    /// as [`connect`](Self::connect).
    pub fn from_builder(builder: crate::ClientBuilder) -> Result<Self, Error> {
        outside_runtime()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fencelock-blocking")
            .enable_all()
            .build()
            .map_err(|e| Error::Blocking {
                reason: format!("cannot start its runtime: {e}"),
            })?;
        let client = runtime.block_on(builder.connect())?;
        Ok(Self {
            shared: Arc::new(Shared {
                runtime: Some(runtime),
                client,
            }),
        })
    }

    /// The async client underneath, for what this module does not wrap (delay queues,
    /// metrics of [`stats`](crate::Client::stats), ...). Its futures must run on an
    /// async runtime: use it from async code, not to block on.
    pub fn as_async(&self) -> &crate::Client {
        &self.shared.client
    }

    /// Starts configuring the lock called `name` ([`crate::Client::lock`]).
    pub fn lock(&self, name: impl Into<String>) -> LockBuilder {
        self.builder(self.shared.client.lock(name))
    }

    /// Starts configuring the semaphore called `name`, with `permits` permits
    /// ([`crate::Client::semaphore`]).
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> SemaphoreBuilder {
        self.builder(self.shared.client.semaphore(name, permits))
    }

    /// Starts configuring the read side of the read-write lock called `name`
    /// ([`crate::Client::read_lock`]); its write side is [`lock`](Self::lock).
    pub fn read_lock(&self, name: impl Into<String>) -> ReadLockBuilder {
        self.builder(self.shared.client.read_lock(name))
    }

    fn builder<K: Kind>(&self, inner: AcquireBuilder<K>) -> AcquireBuilderBlocking<K> {
        AcquireBuilderBlocking {
            inner,
            shared: self.shared.clone(),
        }
    }

    /// Starts configuring several locks taken at once, every one or none
    /// ([`crate::Client::lock_all`]).
    pub fn lock_all<I>(&self, names: I) -> MultiLockBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        MultiLockBuilder {
            inner: self.shared.client.lock_all(names),
            shared: self.shared.clone(),
        }
    }

    /// Starts a leader election called `name` ([`crate::Client::election`]).
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election {
            inner: self.shared.client.election(name),
            shared: self.shared.clone(),
        }
    }

    /// Writes to a resource kept in this client's Redis, applied only under a current
    /// fencing token ([`crate::Client::fenced_write`]).
    pub fn fenced_write(
        &self,
        resource: impl Into<String>,
        token: FencingToken,
    ) -> FencedWrite<'_> {
        FencedWrite {
            inner: self.shared.client.fenced_write(resource, token),
            shared: &self.shared,
        }
    }

    /// Takes over a detached lock ([`crate::Client::attach`]).
    ///
    /// # Errors
    /// As [`crate::Client::attach`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn attach(&self, lock: DetachedLock) -> Result<LockGuard, Error> {
        let guard = self.shared.block_on(self.shared.client.attach(lock))??;
        Ok(LockGuard::new(guard, &self.shared))
    }

    /// What Redis holds for the lock `name` ([`crate::Client::inspect`]).
    ///
    /// # Errors
    /// As [`crate::Client::inspect`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn inspect(&self, name: &str) -> Result<LockStatus, Error> {
        self.shared.block_on(self.shared.client.inspect(name))?
    }

    /// The held locks whose names match `pattern` ([`crate::Client::list`]).
    ///
    /// # Errors
    /// As [`crate::Client::list`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn list(&self, pattern: &str) -> Result<Listing, Error> {
        self.shared.block_on(self.shared.client.list(pattern))?
    }

    /// Breaks a stuck lock, whoever holds it ([`crate::Client::break_lock`]).
    ///
    /// # Errors
    /// As [`crate::Client::break_lock`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn break_lock(&self, name: &str) -> Result<crate::Broken, Error> {
        self.shared.block_on(self.shared.client.break_lock(name))?
    }

    /// Sets a semaphore's permit count ([`crate::Client::set_permits`]).
    ///
    /// # Errors
    /// As [`crate::Client::set_permits`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn set_permits(&self, name: &str, permits: u32) -> Result<Resize, Error> {
        self.shared
            .block_on(self.shared.client.set_permits(name, permits))?
    }

    /// Waits until every release sent in the background has finished
    /// ([`crate::Client::flush`]). Dropping the last clone of the client does it too.
    ///
    /// # Errors
    /// [`Error::Blocking`] inside a Tokio runtime.
    pub fn flush(&self) -> Result<(), Error> {
        self.shared.block_on(self.shared.client.flush())
    }
}

/// Settings of a lock, semaphore or read lock to take with a blocking call: the
/// settings of the async [`AcquireBuilder`], the same methods.
pub struct AcquireBuilderBlocking<K: Kind> {
    inner: AcquireBuilder<K>,
    shared: Arc<Shared>,
}

/// A lock to take ([`Client::lock`]).
pub type LockBuilder = AcquireBuilderBlocking<LockKind>;
/// A semaphore's permit to take ([`Client::semaphore`]).
pub type SemaphoreBuilder = AcquireBuilderBlocking<SemaphoreKind>;
/// A read-write lock's read side to take ([`Client::read_lock`]).
pub type ReadLockBuilder = AcquireBuilderBlocking<ReadLockKind>;

impl<K: Kind> std::fmt::Debug for AcquireBuilderBlocking<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<K: Kind> AcquireBuilderBlocking<K> {
    fn map(mut self, f: impl FnOnce(AcquireBuilder<K>) -> AcquireBuilder<K>) -> Self {
        self.inner = f(self.inner);
        self
    }

    forward!("AcquireBuilder":
        lease(lease: Duration),
        renew(renew: bool),
        max_hold(max_hold: Duration),
        wait(wait: Duration),
        wait_forever(),
        replicas(replicas: u32),
        retry(retry: Retry),
    );

    /// The name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// One attempt ([`AcquireBuilder::try_acquire`]).
    ///
    /// # Errors
    /// As [`AcquireBuilder::try_acquire`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn try_acquire(&self) -> Result<LockGuard, Error> {
        let guard = self.shared.block_on(self.inner.try_acquire())??;
        Ok(LockGuard::new(guard, &self.shared))
    }

    /// Takes it, waiting as configured ([`AcquireBuilder::acquire`]).
    ///
    /// # Errors
    /// As [`AcquireBuilder::acquire`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn acquire(&self) -> Result<LockGuard, Error> {
        let guard = self.shared.block_on(self.inner.acquire())??;
        Ok(LockGuard::new(guard, &self.shared))
    }

    /// Runs `work` under the lock and releases it when `work` returns (the release
    /// waited for). `work` is not cancelled if the lease is lost meanwhile (a blocking
    /// closure cannot be): the loss is reported when it returns, as
    /// [`Error::LeaseLost`], and its result dropped, since it may have overlapped
    /// another holder's work.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); [`Error::LeaseLost`] as above.
    pub fn run<T>(&self, work: impl FnOnce(FencingToken) -> T) -> Result<T, Error> {
        let guard = self.acquire()?;
        let output = work(guard.fencing_token());
        after_work(guard.release())?;
        Ok(output)
    }

    /// [`run`](Self::run) for work that can fail: its error comes back as it is, after
    /// the release; the lock's errors through `From`.
    ///
    /// # Errors
    /// `work`'s error, and those of [`run`](Self::run) converted with `From`.
    pub fn try_run<T, E: From<Error>>(
        &self,
        work: impl FnOnce(FencingToken) -> Result<T, E>,
    ) -> Result<T, E> {
        let guard = self.acquire()?;
        let output = work(guard.fencing_token());
        let released = after_work(guard.release());
        let output = output?;
        released?;
        Ok(output)
    }
}

/// A release after `run`'s work: only a lost lease fails it (the work may have
/// overlapped another holder's); a release that could not reach Redis leaves the key to
/// its lease, as the async `run` does.
fn after_work(released: Result<(), Error>) -> Result<(), Error> {
    match released {
        Err(e @ Error::LeaseLost { .. }) => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, "release after the work failed");
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

impl LockBuilder {
    forward!("crate::LockBuilder":
        fair(),
        waiter_timeout(timeout: Duration),
        reentrant(owner: impl Into<String>),
        holder_info(info: impl Into<String>),
    );
}

impl SemaphoreBuilder {
    forward!("crate::SemaphoreBuilder": fair(), waiter_timeout(timeout: Duration));
}

impl ReadLockBuilder {
    forward!("crate::ReadLockBuilder": reentrant(owner: impl Into<String>));
}

/// A held lock, permit or read side, released when dropped (the release waited for).
/// The async [`crate::LockGuard`] underneath renews its lease meanwhile.
pub struct LockGuard {
    inner: Option<crate::LockGuard>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockGuard")
            .field(&self.inner)
            .finish()
    }
}

impl LockGuard {
    fn new(inner: crate::LockGuard, shared: &Arc<Shared>) -> Self {
        Self {
            inner: Some(inner),
            shared: shared.clone(),
        }
    }

    fn guard(&self) -> &crate::LockGuard {
        self.inner
            .as_ref()
            .expect("held until release, detach or drop")
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.guard().name()
    }

    /// The fencing token of this holding ([`crate::LockGuard::fencing_token`]).
    pub fn fencing_token(&self) -> FencingToken {
        self.guard().fencing_token()
    }

    /// The random token that says who holds the lock ([`crate::LockGuard::holder_token`]).
    pub fn holder_token(&self) -> &HolderToken {
        self.guard().holder_token()
    }

    /// Until when the lease is known to last ([`crate::LockGuard::valid_until`]).
    pub fn valid_until(&self) -> Instant {
        self.guard().valid_until()
    }

    /// What is left of the lease ([`crate::LockGuard::remaining`]).
    pub fn remaining(&self) -> Duration {
        self.guard().remaining()
    }

    /// Why the lease was lost, once it was ([`crate::LockGuard::loss_cause`]): check it
    /// between the steps of long work.
    pub fn loss_cause(&self) -> Option<LossCause> {
        self.guard().loss_cause()
    }

    /// Blocks until the lease is lost or `timeout` has passed: the cause, or `None`.
    ///
    /// # Errors
    /// [`Error::Blocking`] inside a Tokio runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<Option<LossCause>, Error> {
        let lost = self.guard().lost();
        self.shared
            .block_on(async { tokio::time::timeout(timeout, lost).await.ok() })
    }

    /// Resets the lease to `ttl` from now ([`crate::LockGuard::extend`]).
    ///
    /// # Errors
    /// As [`crate::LockGuard::extend`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let guard = self
            .inner
            .as_mut()
            .expect("held until release, detach or drop");
        self.shared.block_on(guard.extend(ttl))?
    }

    /// Releases the lock and says how that went ([`crate::LockGuard::release`]).
    ///
    /// # Errors
    /// As [`crate::LockGuard::release`]; [`Error::Blocking`] inside a Tokio runtime (the
    /// guard is then released as a dropped async guard is: in the background, on the
    /// client's runtime).
    pub fn release(mut self) -> Result<(), Error> {
        let guard = self
            .inner
            .take()
            .expect("held until release, detach or drop");
        self.shared.block_on(guard.release())?
    }

    /// Lets go of the lock without releasing it ([`crate::LockGuard::detach`]).
    pub fn detach(mut self) -> DetachedLock {
        self.inner
            .take()
            .expect("held until release, detach or drop")
            .detach()
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(guard) = self.inner.take() {
            release_on_drop(&self.shared, guard.name().to_owned(), guard.release());
        }
    }
}

/// A guard's release when it is dropped: waited for, outside a runtime. Inside one the
/// future is dropped unrun (see [`Shared::block_on`]): the async guard's own drop
/// releases in the background, on the client's runtime.
fn release_on_drop(
    shared: &Shared,
    name: String,
    release: impl Future<Output = Result<(), Error>>,
) {
    match shared.block_on(release) {
        Ok(Ok(())) | Err(_) => {}
        Ok(Err(e)) => {
            tracing::warn!(lock = name.as_str(), error = %e, "release of a dropped guard failed");
        }
    }
}

/// Several locks to take at once ([`Client::lock_all`]): the settings of the async
/// [`crate::MultiLockBuilder`].
pub struct MultiLockBuilder {
    inner: crate::MultiLockBuilder,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MultiLockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl MultiLockBuilder {
    fn map(mut self, f: impl FnOnce(crate::MultiLockBuilder) -> crate::MultiLockBuilder) -> Self {
        self.inner = f(self.inner);
        self
    }

    forward!("crate::MultiLockBuilder":
        lease(lease: Duration),
        renew(renew: bool),
        max_hold(max_hold: Duration),
        wait(wait: Duration),
        wait_forever(),
        retry(retry: Retry),
        replicas(replicas: u32),
        holder_info(info: impl Into<String>),
    );

    /// One attempt at every name ([`crate::MultiLockBuilder::try_acquire`]).
    ///
    /// # Errors
    /// As [`crate::MultiLockBuilder::try_acquire`]; [`Error::Blocking`] inside a Tokio
    /// runtime.
    pub fn try_acquire(&self) -> Result<MultiGuard, Error> {
        let guard = self.shared.block_on(self.inner.try_acquire())??;
        Ok(MultiGuard::new(guard, &self.shared))
    }

    /// Takes every name, waiting as configured ([`crate::MultiLockBuilder::acquire`]).
    ///
    /// # Errors
    /// As [`crate::MultiLockBuilder::acquire`]; [`Error::Blocking`] inside a Tokio
    /// runtime.
    pub fn acquire(&self) -> Result<MultiGuard, Error> {
        let guard = self.shared.block_on(self.inner.acquire())??;
        Ok(MultiGuard::new(guard, &self.shared))
    }
}

/// Several held locks, released when dropped (the release waited for).
pub struct MultiGuard {
    inner: Option<crate::MultiGuard>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::MultiGuard")
            .field(&self.inner)
            .finish()
    }
}

impl MultiGuard {
    fn new(inner: crate::MultiGuard, shared: &Arc<Shared>) -> Self {
        Self {
            inner: Some(inner),
            shared: shared.clone(),
        }
    }

    fn guard(&self) -> &crate::MultiGuard {
        self.inner.as_ref().expect("held until release or drop")
    }

    /// The names held, in the order they were taken.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.guard().names()
    }

    /// The fencing token of `name`, if it is one of the names held.
    pub fn fencing_token(&self, name: &str) -> Option<FencingToken> {
        self.guard().fencing_token(name)
    }

    /// Each name with its fencing token.
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, FencingToken)> {
        self.guard().fencing_tokens()
    }

    /// The first lease lost, once one was ([`crate::MultiGuard::loss`]).
    pub fn loss(&self) -> Option<LostLock> {
        self.guard().loss()
    }

    /// Releases every name ([`crate::MultiGuard::release`]).
    ///
    /// # Errors
    /// As [`crate::MultiGuard::release`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn release(mut self) -> Result<(), Error> {
        let guard = self.inner.take().expect("held until release or drop");
        self.shared.block_on(guard.release())?
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        if let Some(guard) = self.inner.take() {
            let name = guard.names().collect::<Vec<_>>().join(", ");
            release_on_drop(&self.shared, name, guard.release());
        }
    }
}

/// A leader election ([`Client::election`]): the settings and calls of the async
/// [`crate::Election`].
pub struct Election {
    inner: crate::Election,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Election {
    fn map(mut self, f: impl FnOnce(crate::Election) -> crate::Election) -> Self {
        self.inner = f(self.inner);
        self
    }

    forward!("crate::Election":
        lease(lease: Duration),
        wait(wait: Duration),
        wait_forever(),
        replicas(replicas: u32),
        holder_info(info: impl Into<String>),
    );

    /// Campaigns until this caller leads ([`crate::Election::campaign`]).
    ///
    /// # Errors
    /// As [`crate::Election::campaign`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn campaign(&self) -> Result<Leadership, Error> {
        let leadership = self.shared.block_on(self.inner.campaign())??;
        Ok(Leadership {
            inner: Some(leadership),
            shared: self.shared.clone(),
        })
    }

    /// Follows the election's leader ([`crate::Election::observe`]).
    ///
    /// # Errors
    /// As [`crate::Election::observe`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn observe(&self) -> Result<Observer, Error> {
        let observer = self.shared.block_on(self.inner.observe())??;
        Ok(Observer {
            inner: observer,
            shared: self.shared.clone(),
        })
    }

    /// Who leads now ([`crate::Election::leader`]).
    ///
    /// # Errors
    /// As [`crate::Election::leader`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn leader(&self) -> Result<Option<Leader>, Error> {
        self.shared.block_on(self.inner.leader())?
    }
}

/// Who leads an election, followed as it changes ([`Election::observe`]).
pub struct Observer {
    inner: crate::Observer,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Observer {
    /// The leader as last seen ([`crate::Observer::leader`]).
    pub fn leader(&self) -> Option<&Leader> {
        self.inner.leader()
    }

    /// Blocks until the leader changes, and says who leads then
    /// ([`crate::Observer::changed`]).
    ///
    /// # Errors
    /// As [`crate::Observer::changed`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn changed(&mut self) -> Result<Option<Leader>, Error> {
        self.shared.block_on(self.inner.changed())?
    }
}

/// This caller's leadership, resigned when dropped (the resignation waited for).
pub struct Leadership {
    inner: Option<crate::Leadership>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Leadership")
            .field(&self.inner)
            .finish()
    }
}

impl Leadership {
    fn leadership(&self) -> &crate::Leadership {
        self.inner.as_ref().expect("held until resign or drop")
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.leadership().name()
    }

    /// The term: higher than every term before it, a fencing token.
    pub fn term(&self) -> FencingToken {
        self.leadership().term()
    }

    /// Why the leadership was lost, once it was.
    pub fn loss_cause(&self) -> Option<LossCause> {
        self.leadership().loss_cause()
    }

    /// What is left of the leader's lease.
    pub fn remaining(&self) -> Duration {
        self.leadership().remaining()
    }

    /// Steps down ([`crate::Leadership::resign`]).
    ///
    /// # Errors
    /// As [`crate::Leadership::resign`]; [`Error::Blocking`] inside a Tokio runtime.
    pub fn resign(mut self) -> Result<(), Error> {
        let leadership = self.inner.take().expect("held until resign or drop");
        self.shared.block_on(leadership.resign())?
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(leadership) = self.inner.take() {
            let name = leadership.name().to_owned();
            release_on_drop(&self.shared, name, leadership.resign());
        }
    }
}

/// A fenced write to build and apply ([`Client::fenced_write`]): the writes of the
/// async [`crate::fence::FencedWrite`].
pub struct FencedWrite<'c> {
    inner: crate::fence::FencedWrite<'c>,
    shared: &'c Shared,
}

impl std::fmt::Debug for FencedWrite<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<'c> FencedWrite<'c> {
    fn map(
        mut self,
        f: impl FnOnce(crate::fence::FencedWrite<'c>) -> crate::fence::FencedWrite<'c>,
    ) -> Self {
        self.inner = f(self.inner);
        self
    }

    forward!("crate::fence::FencedWrite":
        set(key: impl Into<String>, value: impl AsRef<[u8]>),
        del(key: impl Into<String>),
        incr_by(key: impl Into<String>, by: i64),
        hset(key: impl Into<String>, field: impl AsRef<[u8]>, value: impl AsRef<[u8]>),
        rpush(key: impl Into<String>, value: impl AsRef<[u8]>),
        lpush(key: impl Into<String>, value: impl AsRef<[u8]>),
    );

    /// `XADD key * field value ...`.
    pub fn xadd<F, V>(
        self,
        key: impl Into<String>,
        fields: impl IntoIterator<Item = (F, V)>,
    ) -> Self
    where
        F: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        self.map(|w| w.xadd(key, fields))
    }

    forward!("crate::fence::FencedWrite": expire(key: impl Into<String>, ttl: Duration));

    /// Applies every write, or none ([`crate::fence::FencedWrite::apply`]).
    ///
    /// # Errors
    /// As [`crate::fence::FencedWrite::apply`] ([`Error::Fenced`] for a stale token);
    /// [`Error::Blocking`] inside a Tokio runtime.
    pub fn apply(self) -> Result<Vec<crate::fence::Reply>, Error> {
        self.shared.block_on(self.inner.apply())?
    }
}
