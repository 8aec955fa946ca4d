//! The read side of a read-write lock ([`ReadLockBuilder`]); its write side is the
//! lock of the same name.

use std::sync::Arc;

use crate::builder::sealed::{Chosen, OneLock, Sealed};
use crate::builder::{AcquireBuilder, Kind, Target};
use crate::error::Error;
use crate::protocols::{self, checked_owner};

/// How to take the read side of one named read-write lock. Made by
/// [`Client::read_lock`](crate::Client::read_lock); the settings every kind shares and
/// the acquire are [`AcquireBuilder`]'s. Its write side is the
/// [lock](crate::Client::lock) of the same name, plain or
/// [reentrant](crate::LockBuilder::reentrant). Many
/// readers hold it at once, each with a lease of its own, while no writer does; a
/// writer holds it alone. Leases, renewal, [`max_hold`](AcquireBuilder::max_hold), release,
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
/// and wakes them. A writer that only tries ([`try_acquire`](AcquireBuilder::try_acquire))
/// does not register. Waiting readers are all woken by a writer's release.
///
/// **Reentrancy by owner**, with [`reentrant`](ReadLockBuilder::reentrant) on both sides: a
/// reader whose owner holds the reentrant write lock gets the read side as one more
/// hold of that lock (same fencing token; the write lock stays held until every hold
/// is released); a reader whose owner already reads gets in even while writers wait
/// (its owner would otherwise wait for a writer that waits for it). A plain writer
/// has no owner, so it cannot take the read side while it writes: that waits for
/// itself, until the wait runs out.
///
/// One node (standalone, Sentinel or Cluster): Redlock refuses it with
/// [`Error::InvalidArgument`]. Readers are not fair and store no holder info (yet).
/// Every writer of the name must be a
/// plain or reentrant lock: a fair lock or a semaphore on a name readers hold gets
/// [`Error::WrongType`], and a reader on a semaphore's name likewise.
pub type ReadLockBuilder = AcquireBuilder<ReadLockKind>;

/// What a [`ReadLockBuilder`] takes: the read side of a read-write lock, with an owner
/// or not.
#[derive(Clone, Default)]
pub struct ReadLockKind {
    /// The owner id, for reentrancy by owner.
    owner: Option<String>,
}

impl std::fmt::Debug for ReadLockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadLockKind")
            .field("owner", &self.owner.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Target for ReadLockKind {}

impl Kind for ReadLockKind {}

impl Sealed for ReadLockKind {
    const BUILDER: &'static str = "ReadLockBuilder";
}

impl OneLock for ReadLockKind {
    fn protocol(&self, redlock: bool) -> Result<Chosen, Error> {
        if redlock {
            return Err(Error::invalid(
                "lock mode",
                "a read-write lock needs a single Redis node (standalone, Sentinel or \
                 Cluster): its readers are counted in one place, and independent majorities \
                 of readers and of a writer could overlap",
            ));
        }
        let owner = match &self.owner {
            Some(owner) => checked_owner(owner)?,
            None => String::new(),
        };
        Ok(Chosen(Arc::new(protocols::Read::new(owner))))
    }
}

impl ReadLockBuilder {
    /// Gives this reader an owner (default: none): a reader whose owner holds the
    /// [reentrant](crate::LockBuilder::reentrant) write lock of the name gets the read
    /// side as one more hold of it, and one whose owner already reads gets in even
    /// while writers wait. The owner id: 1 to 256 bytes, no control characters.
    pub fn reentrant(mut self, owner: impl Into<String>) -> Self {
        self.kind_mut().owner = Some(owner.into());
        self
    }
}
