//! The engine: the acquire state machine (`acquire.rs`: attempts, waiting for a
//! release, clean-up; pure transitions, no I/O), the driver that runs it on the nodes
//! (`driver.rs`), the retry schedule of a waiting acquire, and the watchdog that renews
//! held leases. The driver sees the nodes only through [`nodes::Nodes`], which the
//! backend implements and the tests' scripted fake (`fake.rs`) does too; the primitive
//! only through its [`Protocol`], which `src/protocols/` implement.
//!
//! The engine owns the types it is driven with: what a primitive must answer
//! ([`Protocol`], `protocol.rs`), what an attempt came to ([`Outcome`]) and the one
//! [`Grant`] that goes from the tally of a script's reply to the guard.

pub(crate) mod acquire;
pub(crate) mod driver;
#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod fake;
pub(crate) mod nodes;
pub(crate) mod protocol;
pub(crate) mod retry;
pub(crate) mod watchdog;
#[cfg(test)]
mod watchdog_tests;

use std::time::{Duration, Instant};

pub(crate) use protocol::Protocol;

use crate::error::NodeReport;
pub use crate::scripts::replies::Refusal;
use crate::token::FencingToken;

/// A grant of a lock: made by the tally of a script's reply (or by a fair release's
/// handover), and carried as it is to the guard and its watched lease. A confirmed
/// extend is a grant too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    /// Its fencing token.
    pub fence: FencingToken,
    /// When the request that got it was sent: Redis set the lease no earlier (for a
    /// handover, the last attempt Redis refused, which came before it).
    pub sent_at: Instant,
    /// The lease it set.
    pub ttl: Duration,
    /// The end of that lease, less the drift allowance ([`lease_end`]).
    pub valid_until: Instant,
}

impl Grant {
    /// The grant of a `ttl` lease with `fence`, asked for at `sent_at`.
    pub(crate) fn new(fence: FencingToken, sent_at: Instant, ttl: Duration) -> Self {
        Self {
            fence,
            sent_at,
            ttl,
            valid_until: lease_end(sent_at, ttl),
        }
    }
}

/// What one acquire attempt came to, once the nodes' answers were tallied: the engine's
/// reply. (An attempt that could not be decided is an error instead.)
#[derive(Debug)]
pub enum Outcome {
    /// The lock is the caller's.
    Granted {
        /// The grant.
        grant: Grant,
        /// The script says the grant is held under another protocol from now on
        /// ([`Protocol::held_as`]).
        held_as_other: bool,
    },
    /// Another holder (or a queue ahead) stands in the way.
    Held {
        /// What the refusal said (for Redlock, the soonest of the nodes' leases).
        refusal: Refusal,
        /// Redlock: what each node answered; empty for one node.
        nodes: Vec<NodeReport>,
    },
}

/// How much of a lease the client gives up to clock-rate drift between itself and
/// Redis: 1% of the TTL plus 2 ms, as in Redlock.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The end of a lease that Redis started no earlier than `sent_at`.
pub fn lease_end(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl.saturating_sub(drift(ttl))
}

/// The engine's clock: Tokio's, which its tests pause and advance (without Tokio's
/// test-util, exactly `std::time::Instant`). What it hands over is `std`'s: with time
/// paused by a user's test-util build, a grant's lease end is converted from the paused
/// clock, and may lie later than the real one.
pub(crate) fn clock() -> Instant {
    tokio::time::Instant::now().into_std()
}
