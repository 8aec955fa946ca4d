//! Every default and every limit of fencelock, in one place. The builders' docs refer
//! here; the CLI takes its ranges from here too.

use std::time::Duration;

use crate::error::Error;

/// The lease of a lock when none is given: 30 s, renewed by the watchdog every 10 s
/// while the guard lives ([`LockBuilder::lease`](crate::LockBuilder::lease)).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The shortest lease accepted: 10 ms. A lease must outlast the clock-drift allowance
/// (1% of it plus 2 ms) and a round trip, or no grant would ever be valid when it
/// arrives.
pub const MIN_LEASE: Duration = Duration::from_millis(10);

/// The longest lease accepted: 24 hours. A lease longer than that is a deadlock in
/// waiting if its holder dies; hold long work under a shorter lease that is renewed.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// The longest [maximum hold](crate::LockBuilder::max_hold) accepted: 365 days (the
/// shortest is [`MIN_LEASE`]).
pub const MAX_HOLD: Duration = Duration::from_secs(365 * 24 * 3600);

/// Fair mode: how long a queued waiter may go without calling Redis before it is purged
/// from the queue, unless set with
/// [`LockBuilder::waiter_timeout`](crate::LockBuilder::waiter_timeout): 3 s.
pub const DEFAULT_WAITER_TIMEOUT: Duration = Duration::from_secs(3);

/// The shortest waiter timeout accepted: 30 ms.
pub const MIN_WAITER_TIMEOUT: Duration = Duration::from_millis(30);

/// The longest waiter timeout accepted: 1 hour.
pub const MAX_WAITER_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long one connection attempt may take, unless set with
/// [`ClientBuilder::connect_timeout`](crate::ClientBuilder::connect_timeout): 1 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long to wait for the reply to one command, unless set with
/// [`ClientBuilder::response_timeout`](crate::ClientBuilder::response_timeout): 1 s.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest connect or response timeout accepted: 1 hour (the shortest is 1 ms).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// Redlock: how long a node that restarted is kept from voting, unless set with
/// [`ClientBuilder::restart_protection`](crate::ClientBuilder::restart_protection): 30 s
/// (or the longest lease in use, if that is longer).
pub const DEFAULT_RESTART_PROTECTION: Duration = Duration::from_secs(30);

/// The longest lock name (and key prefix) accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// The most names one multi-lock takes
/// ([`Client::lock_all`](crate::Client::lock_all)): 64. On one node they are taken in
/// one script call, which holds the server while it checks and writes three keys per
/// name; a larger set is better split into coarser locks.
pub const MAX_MULTI_NAMES: usize = 64;

/// The key prefix when none is given.
pub const DEFAULT_PREFIX: &str = "fencelock";

/// How long a lock's fencing counter stays in Redis after the last grant, by default:
/// a lock name that is not taken again for this long leaves no key behind. A client may
/// set its own ([`ClientBuilder::fence_counter_idle`](crate::ClientBuilder::fence_counter_idle)).
pub const FENCE_COUNTER_IDLE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Leases renewed by one `renew.lua` call of the watchdog. The batches of one tick go
/// out one after another, so a call sent meanwhile (an acquire, a release) waits behind
/// one batch at most, not behind all of them.
/// A client may set its own ([`ClientBuilder::renewal_batch`](crate::ClientBuilder::renewal_batch)).
pub const RENEWAL_BATCH: usize = 1000;

/// The largest [`ClientBuilder::renewal_batch`](crate::ClientBuilder::renewal_batch)
/// accepted: a call of that many leases holds a server for about half a second.
pub const MAX_RENEWAL_BATCH: usize = 100_000;

/// Background releases (of dropped guards, of abandoned acquires) in flight at once per
/// client; the others wait their turn before they are sent, so that dropping many guards
/// together does not queue so many calls that the later ones time out unsent.
pub const BACKGROUND_RELEASES_IN_FLIGHT: usize = 64;

/// The first pause of a waiting acquire's backoff, when release notifications are
/// unavailable ([`Retry::default`](crate::Retry)): 5 ms.
pub const DEFAULT_RETRY_MIN: Duration = Duration::from_millis(5);

/// The longest pause of the default backoff: 100 ms.
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_millis(100);

/// The longest backoff pause accepted: 60 s.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);

/// Delay queue: the largest payload accepted, 16 MiB.
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;

/// Delay queue: the longest delay accepted, 30 days.
pub const MAX_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);

/// Delay queue: the shortest visibility timeout accepted, 1 ms.
pub const MIN_VISIBILITY: Duration = Duration::from_millis(1);

/// Delay queue: the longest visibility timeout accepted, 24 hours.
pub const MAX_VISIBILITY: Duration = Duration::from_secs(24 * 3600);

/// The most permits a semaphore may have ([`SemaphoreBuilder`](crate::SemaphoreBuilder)):
/// each held permit is a member of one zset, which every acquire trims and counts.
pub const MAX_PERMITS: u32 = 1_000_000;

/// The most writes one [fenced write](crate::Client::fenced_write) carries: 1,000 (one
/// script call; Redis runs nothing else meanwhile).
pub const MAX_FENCED_WRITES: usize = 1000;

/// A lease length in range, in whole milliseconds.
pub(crate) fn checked_ttl(ttl: Duration) -> Result<Duration, Error> {
    Error::check_range("lease", ttl, MIN_LEASE, MAX_LEASE)?;
    Ok(Duration::from_millis(ttl.as_millis() as u64))
}
