//! A lock: one holder at a time ([`LockBuilder`]), plain, fair or reentrant.

use std::sync::Arc;
use std::time::Duration;

use crate::builder::sealed::{Chosen, OneLock, Sealed, StoresInfo};
use crate::builder::{AcquireBuilder, Kind, Target};
use crate::error::Error;
use crate::limits::{DEFAULT_WAITER_TIMEOUT, MAX_WAITER_TIMEOUT, MIN_WAITER_TIMEOUT};
use crate::protocols::{self, checked_owner};

/// How to take one named lock: one holder at a time. Made by
/// [`Client::lock`](crate::Client::lock); the settings every kind shares (lease, wait,
/// retries) and the acquire are [`AcquireBuilder`]'s. Not fair, not reentrant, no holder
/// info by default.
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
///
/// Its `Debug` shows the settings but not a [reentrant](Self::reentrant) owner id, which
/// lets whoever knows it reenter and release the lock.
pub type LockBuilder = AcquireBuilder<LockKind>;

/// What a [`LockBuilder`] takes: a lock, plain, [fair](LockBuilder::fair) or
/// [reentrant](LockBuilder::reentrant).
#[derive(Clone, Default)]
pub struct LockKind {
    /// Fair mode, with its waiter timeout.
    fair: Option<Duration>,
    /// Reentrant mode, with the owner id.
    owner: Option<String>,
    /// What the holder says about itself.
    info: String,
}

impl std::fmt::Debug for LockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockKind")
            .field("fair", &self.fair)
            .field("owner", &self.owner.as_ref().map(|_| "<redacted>"))
            .field("info", &self.info)
            .finish()
    }
}

impl Target for LockKind {}

impl Kind for LockKind {}

impl Sealed for LockKind {
    const BUILDER: &'static str = "LockBuilder";

    fn info(&self) -> &str {
        &self.info
    }
}

impl StoresInfo for LockKind {
    fn info_mut(&mut self) -> &mut String {
        &mut self.info
    }
}

impl OneLock for LockKind {
    fn protocol(&self, redlock: bool) -> Result<Chosen, Error> {
        if redlock && (self.fair.is_some() || self.owner.is_some()) {
            return Err(Error::invalid(
                "lock mode",
                "fair and reentrant locks need a single Redis node: a fair queue needs one \
                 authority on arrival order, and reentrant holds one place to count them; \
                 Redlock clients take plain locks",
            ));
        }
        Ok(Chosen(match (&self.fair, &self.owner) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    "lock mode",
                    "a lock cannot be both fair and reentrant; choose one",
                ));
            }
            (Some(waiter_timeout), None) => Arc::new(protocols::Fair::new(checked_waiter_timeout(
                *waiter_timeout,
            )?)),
            (None, Some(owner)) => Arc::new(protocols::Reentrant::new(checked_owner(owner)?)),
            (None, None) => Arc::new(protocols::Plain),
        }))
    }
}

/// A fair waiter timeout in range.
pub(crate) fn checked_waiter_timeout(timeout: Duration) -> Result<Duration, Error> {
    Error::check_range(
        "waiter timeout",
        timeout,
        MIN_WAITER_TIMEOUT,
        MAX_WAITER_TIMEOUT,
    )?;
    Ok(timeout)
}

impl LockBuilder {
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
    /// look at the queue. A [semaphore](crate::SemaphoreBuilder::fair) can be fair too
    /// (its waiters take freed permits in arrival order, each woken by the release that
    /// frees its permit, then with a round trip of its own); a read-write lock's readers
    /// cannot (yet).
    pub fn fair(mut self) -> Self {
        self.kind_mut().fair.get_or_insert(DEFAULT_WAITER_TIMEOUT);
        self
    }

    /// Fair mode: how long a queued waiter may stay silent before the queue drops it
    /// (default [`DEFAULT_WAITER_TIMEOUT`], 3 s; between 30 ms and 1 h). Implies
    /// [`fair`](Self::fair). Shorter bounds the stall a crashed waiter causes; longer
    /// tolerates longer pauses of a live waiter, which otherwise loses its place.
    pub fn waiter_timeout(mut self, timeout: Duration) -> Self {
        self.kind_mut().fair = Some(timeout);
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
        self.kind_mut().owner = Some(owner.into());
        self
    }
}
