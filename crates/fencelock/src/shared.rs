//! What every lock, guard and delay queue of one [`Client`](crate::Client) shares: where
//! the locks live, the key prefix, the watchdog, and the releases sent in the background.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::algorithms::watchdog::Watchdog;
use crate::backend::{Backend, Mode, Undo};
use crate::keys::LockKeys;
use crate::observe::{self, ReleaseKind, ReleaseOutcome};
use crate::token::HolderToken;

/// A client's internals, behind an `Arc`.
pub(crate) struct Shared {
    pub backend: Backend,
    pub prefix: String,
    /// Releases sent in the background by dropped guards and abandoned acquires.
    pub background: TaskTracker,
    /// Turns of the background releases: at most
    /// [`BACKGROUND_RELEASES_IN_FLIGHT`](crate::limits::BACKGROUND_RELEASES_IN_FLIGHT)
    /// in flight.
    pub background_turns: Arc<Semaphore>,
    /// Renews the leases of held locks.
    pub watchdog: Watchdog,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field(
                "nodes",
                &self
                    .backend
                    .nodes()
                    .iter()
                    .map(|n| n.addr())
                    .collect::<Vec<_>>(),
            )
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// What a background release withdraws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Withdrawn {
    /// The lock of a guard dropped unreleased: counted as a release (kind `drop`).
    Guard,
    /// What an acquire that ended without the lock may have left behind.
    Acquire,
}

impl Shared {
    /// Takes this client off the wake list of the lock of `keys` without waiting, once
    /// none of its plain waiters waits for that lock any more (checked when the call
    /// goes out: a waiter that came meanwhile keeps the listing). Without a Tokio
    /// runtime it does nothing, and the listing expires by itself.
    pub fn unlist_in_background(&self, keys: &LockKeys) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let keys = keys.clone();
        self.background.spawn_on(
            async move {
                if backend.plain_waiters(&backend.own_channel(&keys)) > 0 {
                    return;
                }
                if let Err(e) = backend.unlist(&keys).await {
                    tracing::debug!(lock = keys.name(), error = %e, "leaving the wake list failed; the listing expires by itself");
                }
            },
            &runtime,
        );
    }

    /// Withdraws a token (its grant, its queue place) without waiting. Never blocks or
    /// panics; without a Tokio runtime it does nothing, and the key expires after its
    /// lease (a queue place after the waiter timeout).
    pub fn abandon_in_background(
        &self,
        what: Withdrawn,
        keys: &LockKeys,
        token: &HolderToken,
        mode: &Mode,
        ttl: Duration,
        fence: u64,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if what == Withdrawn::Guard {
                observe::released(ReleaseKind::Drop, ReleaseOutcome::Error, None);
            }
            tracing::warn!(
                lock = keys.name(),
                "no Tokio runtime to release the lock in; it expires after its lease"
            );
            return;
        };
        let backend = self.backend.clone();
        let (keys, token, mode) = (keys.clone(), token.clone(), mode.clone());
        let turns = self.background_turns.clone();
        self.background.spawn_on(
            async move {
                // Never closed, so a permit always comes.
                let _turn = turns.acquire_owned().await;
                // A guard dropped, or an acquire cancelled: the token's last call.
                let result = backend
                    .abandon(&keys, &token, &mode, ttl, fence, Undo::Withdraw)
                    .await;
                if what == Withdrawn::Guard {
                    observe::released(ReleaseKind::Drop, ReleaseOutcome::of(&result), None);
                }
                match result {
                    Ok(()) if what == Withdrawn::Guard => {
                        tracing::debug!(lock = keys.name(), fencing_token = fence, "lock released in the background");
                    }
                    Ok(()) => {}
                    Err(e) => {
                        tracing::warn!(lock = keys.name(), error = %e, "background release failed; the key expires after its lease");
                    }
                }
            },
            &runtime,
        );
    }
}
