//! Distributed locks on Redis, with fencing tokens.
//!
//! ```
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), fencelock::Error> {
//! # let redis = testkit::RedisServer::start();
//! # let url = redis.url();
//! let client = fencelock::Client::connect(&url).await?; // url: "redis://127.0.0.1:6379"
//! let guard = client
//!     .lock("stock:42")
//!     .wait(Duration::from_secs(5))
//!     .acquire()
//!     .await?; // a 30 s lease, renewed while `guard` lives
//! // Send the fencing token with every write; the resource rejects lower ones.
//! println!("holding stock:42 with fencing token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What the lock guarantees, and what it does not
//!
//! A lock is taken with one script: `SET key token NX PX ttl`, and in the same script an
//! increment of a per-lock counter that becomes the [`FencingToken`]. Release and extend
//! are owner-checked scripts: they act only while the key holds this holder's random
//! [`HolderToken`].
//!
//! | | |
//! |---|---|
//! | **Guaranteed** | While a guard's lease lasts, no other owner holds the same lock on that Redis node. |
//! | **Guaranteed** | A holder never deletes or extends a lock it no longer holds. |
//! | **Guaranteed** | Fencing tokens of one lock name strictly increase with every grant: each is the counter plus one and at least the server clock in µs, so across the counter's loss or a failover too, while the server clocks do not step back (see [`FencingToken`]). |
//! | **Guaranteed** | A crashed holder blocks others for at most one lease; a live one keeps its lock while its guard lives (watchdog renewal). |
//! | **Guaranteed** | The holder hears of a lost lease ([`LockGuard::lost`]) before [`LockGuard::valid_until`]. |
//! | **Guaranteed** | A waiter is woken by the release; a lost notification costs it at most the holder's remaining lease. |
//! | **Not guaranteed** | That your code finishes inside the lease: a pause (GC, swap, `SIGSTOP`) can outlast it. Have the resource check the fencing token. |
//! | **Not guaranteed** | Mutual exclusion across a failover: replication is asynchronous, so a promoted replica may not have the key. Likewise a restart without persistence. |
//!
//! In Martin Kleppmann's terms: for *efficiency* (avoid doing work twice) this lock is
//! enough on its own. For *correctness* (data must never be corrupted), the lock narrows
//! the window but only the fencing token, checked by the resource, closes it.
//!
//! # Redlock
//!
//! [`Client::redlock`] takes a lock on N independent Redis masters (N odd, at least 3):
//! every node is asked at once, each with a short timeout, and the lock is held when a
//! majority granted it with time to spare (validity = TTL − elapsed − 1% of the TTL −
//! 2 ms). It survives a minority of nodes being down, and there is no replica to fail
//! over to, so the failover hazard of a single master is gone. Errors name each node and
//! what it said ([`Error::NoQuorum`]).
//!
//! What it does not fix: it still assumes bounded pauses and clock drift (a holder
//! paused past its lease is not stopped), and a node that restarts without the keys it
//! held can vote again. fencelock closes the second hole on the client side: a node
//! that came back less than the longest lease ago (at least 30 s, configurable with
//! [`ClientBuilder::restart_protection`]) does not count until that time has passed.
//! Fencing tokens are the highest of the granting nodes' counters, and release raises
//! every counter to it: they increase across holders while a majority keeps its
//! counters, and across the wipe of a majority as long as the nodes' clocks agree
//! better than the time between two grants. Fair mode, reentrancy, semaphores,
//! read-write locks and delay queues need a single node.
//!
//! # Semaphores and read-write locks
//!
//! [`Client::semaphore`] is a lock that up to N holders hold at once, each permit a lease
//! of its own with its own fencing token ([`SemaphoreBuilder`]); optionally fair.
//! [`Client::read_lock`] is the read side of a read-write lock whose write side is the
//! lock of the same name: many readers or one writer, and once a writer waits, new
//! readers queue behind it ([`ReadLockBuilder`]). Both have everything a lock's lease
//! has: renewal, loss signals, owner-checked release, cancel-safe waiting woken by
//! pub/sub.
//!
//! # Where a lock lives
//!
//! One URL: a standalone node (`redis://`, `redis+unix://`), a Sentinel-managed master
//! (`redis+sentinel://host:port[,...]/SERVICE`, followed across failovers), or a Redis
//! Cluster (`redis+cluster://host:port[,...]`: each lock on the master of its slot,
//! releases on sharded pub/sub, renewals batched per master); `rediss...` for TLS. Or
//! several independent masters for Redlock, above.
//!
//! # Layers
//! Each layer uses only the ones before it (`docs/design.md` traces one acquire
//! through them):
//!
//! 0. **Vocabulary**: [`FencingToken`], [`limits`], [`Error`], [`keys`], [`observe`].
//! 1. **Lua scripts** (`src/scripts/`): `lock/*.lua`, `semaphore/*.lua`,
//!    `rwlock/*.lua` (a read-write lock's readers; its writer is `lock/`),
//!    `queue/*.lua` and `fence/write.lua`, each with a header stating KEYS, ARGV and
//!    every reply; `fragments/*.lua`, the functions they share, put in front of them by
//!    one table; one decoder per reply (`replies.rs`). [`lua_scripts`] shows them as
//!    sent.
//! 2. **Protocols** (`src/protocols/`): one module per primitive (plain, fair,
//!    reentrant, semaphore, read side) that says which script takes, releases and
//!    withdraws it, what its holder's key holds, who a release wakes, and how it is
//!    written into a [`DetachedLock`].
//! 3. **Backend** (`src/backend/`): where a lock lives. `Backend` is one node or the
//!    Redlock nodes: it sends a protocol's calls to all of them at once, each within
//!    its timeout, and tallies the answers by one set of rules (`quorum.rs`: majority,
//!    validity, loss, restart protection); `node.rs` is one server, a Sentinel-managed
//!    master (`sentinel.rs`) or a Redis Cluster (`cluster.rs`); `subscriber.rs` the
//!    shared pub/sub connection; `errors.rs` the driver's errors as fencelock's.
//! 4. **Engine** (`src/engine/`): the acquire state machine (`acquire.rs`; it sees the
//!    backend through the `Nodes` trait, so its tests run on a scripted fake under
//!    paused time), the retry schedule, and the watchdog that renews leases.
//! 5. **Public API**: [`Client`] and [`ClientBuilder`] (`client.rs`), the builders
//!    ([`AcquireBuilder`] in `builder.rs`, with one [`Kind`] each in `lock.rs`,
//!    `semaphore.rs` and `rwlock.rs`), [`LockGuard`] (`guard.rs`), [`DetachedLock`]
//!    (`detach.rs`), [`DelayQueue`] (`delay_queue.rs`), [`fence`], the administration
//!    calls (`admin.rs`); `shared.rs` holds what a client's locks and queues share.
//!
//! Beside them, [`observe`] (`observe.rs`): the names, units and labels of the metrics
//! and the fields of the tracing spans and events that the acquire engine, the
//! watchdog and the guards emit.
//!
//! # Observability
//! fencelock emits [`tracing`] spans and events (an `acquire` span per acquire; the
//! outcome, waits, renewal batches and releases at `debug`; lost leases at `warn`) and
//! [`metrics`] (acquire latency, wait time, contention, handoffs, renewal batches,
//! releases, leases lost by cause) through the `metrics` facade, free when no recorder
//! is installed. Holder tokens and passwords are never logged. [`observe`] lists every
//! name; `examples/prometheus.rs` exports them for Prometheus.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod admin;
mod backend;
mod builder;
mod client;
mod delay_queue;
mod detach;
mod election;
mod engine;
mod error;
pub mod fence;
mod guard;
pub mod keys;
pub mod limits;
mod lock;
mod multi;
pub mod observe;
mod protocols;
mod rwlock;
mod scripts;
mod semaphore;
mod shared;
mod token;

pub use admin::{
    BreakOutcome, Broken, Eviction, Holder, Listing, LockState, LockStatus, NodeBroken, NodeStatus,
    QueuedWaiter, Resize, Unanswered, WaitingClient,
};
pub use backend::eviction::{EvictionRisk, PolicyUnknown};
pub use builder::{AcquireBuilder, Acquisition, Kind};
pub use client::{Client, ClientBuilder, ClientStats};
pub use delay_queue::{DelayQueue, Delivery, ItemId, QueueCounts};
pub use detach::DetachedLock;
pub use election::{Election, Leader, Leadership, Observer};
pub use engine::retry::Retry;
pub use error::{
    Blocker, DriverError, Error, HumanDuration, LossCause, NodeOutcome, NodeReport,
    UnavailableReason,
};
pub use guard::LockGuard;
pub use lock::{LockBuilder, LockKind};
pub use multi::{LostLock, MultiGuard, MultiLockBuilder};
pub use rwlock::{ReadLockBuilder, ReadLockKind};
pub use scripts::lua_scripts;
pub use semaphore::{SemaphoreBuilder, SemaphoreKind};
pub use token::{FencingToken, HolderToken};

/// The README's examples, compiled as doc tests (with every feature: some examples use
/// the PostgreSQL checks).
#[cfg(all(doctest, feature = "sqlx", feature = "tokio-postgres"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
