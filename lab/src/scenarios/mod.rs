//! The scenarios: each runs one round under a tag of its own (its lock name, resource
//! keys and history files), judges the merged history and returns an
//! [`Outcome`](crate::outcomes::Outcome) with the expectations that failed. Every fault
//! is really caused: a worker process stops itself (SIGSTOP) or is SIGKILLed, a
//! redis-server is paused, killed or restarted, or a [`FaultProxy`](testkit::FaultProxy)
//! on the link delays, blackholes or partitions the traffic.
//!
//! The scenarios are grouped by fault:
//! - [`baseline`]: no faults;
//! - [`pauses_kills`]: one lock server; a worker paused or killed holding the lock, the
//!   resource server killed, the lock server paused;
//! - [`network`]: one lock server; a worker's link delayed or its replies dropped;
//! - [`lock_state`]: one lock server, the harness as the clients; the fencing counter
//!   set back, a lease expiring under its holder;
//! - [`redlock_restart`]: Redlock, a node crashing and restarting under a holder;
//! - [`redlock`]: Redlock, a minority or majority of nodes failing, split clients.

mod baseline;
mod lock_state;
mod network;
mod pauses_kills;
mod redlock;
mod redlock_restart;

use std::time::Duration;

pub use redlock::Minority;
pub use redlock_restart::Restart;

/// Slack on top of a TTL for "the next holder gets the lock within one TTL": the
/// waiters' wake-up and one round trip on a loaded 2-core machine.
const AVAILABILITY_SLACK: Duration = Duration::from_millis(300);
