//! What every lock, guard and delay queue of one [`Client`](crate::Client) shares: where
//! the locks live, the key prefix, and the watchdog.

use crate::backend::Backend;
use crate::engine::watchdog::Watchdog;

/// A client's internals, behind an `Arc`.
pub(crate) struct Shared {
    pub backend: Backend,
    pub prefix: String,
    /// Renews the leases of held locks.
    pub watchdog: Watchdog<Backend>,
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
