//! A semaphore: up to N holders at once, each with a permit of its own
//! ([`SemaphoreBuilder`]).

use std::sync::Arc;
use std::time::Duration;

use crate::builder::sealed::{Chosen, OneLock, Sealed};
use crate::builder::{AcquireBuilder, Kind, Target};
use crate::error::Error;
use crate::limits::{DEFAULT_WAITER_TIMEOUT, MAX_PERMITS};
use crate::lock::checked_waiter_timeout;
use crate::protocols;

/// How to take a permit of one named semaphore: up to its permit count of holders at
/// once, each holding one permit as a lease of its own.
/// Made by [`Client::semaphore`](crate::Client::semaphore); the settings every kind
/// shares and the acquire are [`AcquireBuilder`]'s. Everything else is as for a lock: each permit is renewed by the watchdog (or
/// fixed, with [`renew(false)`](AcquireBuilder::renew)), bounded by [`max_hold`](AcquireBuilder::max_hold),
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
/// Cluster) only: Redlock refuses it with [`Error::InvalidArgument`]. A semaphore has
/// no reentrant owner and no holder info (yet). `permits`: 1 to 1,000,000, checked on
/// acquire.
///
/// With [`fair`](SemaphoreBuilder::fair), waiters are served in arrival order: a freed permit goes
/// to the first waiter in line (the release wakes that one only), and a newcomer does
/// not take a free permit while others wait ([`Blocker::Queue`](crate::Blocker::Queue));
/// a waiter that stops calling is purged after its [waiter
/// timeout](SemaphoreBuilder::waiter_timeout), as in a fair lock. Every client of the name must
/// agree on the mode.
pub type SemaphoreBuilder = AcquireBuilder<SemaphoreKind>;

/// What a [`SemaphoreBuilder`] takes: a permit of a semaphore of `permits` permits,
/// [fair](SemaphoreBuilder::fair) or not.
#[derive(Clone, Debug)]
pub struct SemaphoreKind {
    permits: u32,
    /// Fair mode, with its waiter timeout.
    fair: Option<Duration>,
}

impl SemaphoreKind {
    pub(crate) fn new(permits: u32) -> Self {
        Self {
            permits,
            fair: None,
        }
    }
}

impl Target for SemaphoreKind {}

impl Kind for SemaphoreKind {}

impl Sealed for SemaphoreKind {
    const BUILDER: &'static str = "SemaphoreBuilder";
}

impl OneLock for SemaphoreKind {
    fn protocol(&self, redlock: bool) -> Result<Chosen, Error> {
        check_semaphore(redlock, self.permits)?;
        let fair = self.fair.map(checked_waiter_timeout).transpose()?;
        Ok(Chosen(Arc::new(protocols::Semaphore::new(
            self.permits,
            fair,
        ))))
    }
}

impl SemaphoreBuilder {
    /// Serves waiters in arrival order (default: not fair): a freed permit goes to the
    /// first waiter in line, woken by the release that frees it, and a newcomer does not
    /// take a free permit while others wait. Every client of the name must agree.
    pub fn fair(mut self) -> Self {
        self.kind_mut().fair.get_or_insert(DEFAULT_WAITER_TIMEOUT);
        self
    }

    /// Fair mode: how long a queued waiter may stay silent before the queue drops it
    /// (default [`DEFAULT_WAITER_TIMEOUT`], 3 s; between 30 ms and 1 h), as for a
    /// [fair lock](crate::LockBuilder::waiter_timeout). Implies [`fair`](Self::fair).
    pub fn waiter_timeout(mut self, timeout: Duration) -> Self {
        self.kind_mut().fair = Some(timeout);
        self
    }
}

/// Whether a client (on Redlock or not) can hold a semaphore of `permits` permits: one
/// node, 1 to
/// [`MAX_PERMITS`].
pub(crate) fn check_semaphore(redlock: bool, permits: u32) -> Result<(), Error> {
    if redlock {
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
