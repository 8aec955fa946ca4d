//! Distributed locks on Redis, with fencing tokens that the protected resource checks.
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
//! This page is a map: each primitive, what it guarantees, and the chapter of the guide
//! (`docs/guide` in the repository; `./scripts/docs` builds it) that explains it. The
//! README has a first program; the guide has the rest.
//!
//! # The primitives
//!
//! Every one is started from a [`Client`] and held with a lease that the client's
//! watchdog renews while its guard lives; every grant carries a [`FencingToken`] higher
//! than every token of that name before it.
//!
//! | primitive | start with | what is guaranteed while the leases last | guide |
//! |---|---|---|---|
//! | lock | [`Client::lock`] → [`LockBuilder`] → [`LockGuard`] | one holder at a time (on one node; by majority with Redlock) | *Locks* |
//! | fair lock | [`LockBuilder::fair`] | one holder, waiters served in arrival order | *Locks* |
//! | reentrant lock | [`LockBuilder::reentrant`] | one owner, which may hold it several times with one token | *Locks* |
//! | semaphore | [`Client::semaphore`] → [`SemaphoreBuilder`] | at most N holders, each with its own lease and token | *Semaphores* |
//! | read-write lock | [`Client::read_lock`] → [`ReadLockBuilder`]; its writer is [`Client::lock`] | readers together or one writer; a waiting writer is not starved | *Read-write locks* |
//! | several locks | [`Client::lock_all`] → [`MultiLockBuilder`] → [`MultiGuard`] | every name or none, each with its token; no deadlock in any order | *Several locks at once* |
//! | election | [`Client::election`] → [`Election`] → [`Leadership`] | one leader at a time; each term higher than the last | *Leader election* |
//! | delay queue | [`Client::delay_queue`] → [`DelayQueue`] | every item delivered at least once, when due | *Delay queues* |
//!
//! What no lease-based lock guarantees: that your code finishes inside the lease (a GC
//! pause, swap or `SIGSTOP` can outlast any lease), or exclusion across a failover to a
//! replica that missed the grant. For correctness, have the resource check the fencing
//! token: [`fence`] has the checks for PostgreSQL ([`fence::POSTGRES_SETUP`], and with a
//! feature, the checks for tokio-postgres and sqlx) and Redis ([`Client::fenced_write`])
//! (guide: *Fencing*). The guarantees, each with how the safety lab checks it:
//! *Guarantees and the safety lab*.
//!
//! Holding and waiting: [`AcquireBuilder::run`] and [`AcquireBuilder::try_run`] run work
//! under the lock and cancel it if the lease is lost; a [`LockGuard`] is released with
//! [`LockGuard::release`] and says a loss through [`LockGuard::lost`]. A waiter is woken
//! by the release, never polls, and leaves nothing behind when cancelled (guide:
//! *Getting started*, *Waiting and leases*). Every failure is one [`Error`] variant that
//! says what to do.
//!
//! # Where the locks live
//!
//! One URL for [`Client::connect`] or [`Client::builder`]: a server (`redis://`,
//! `redis+unix://`), a Sentinel-managed master (`redis+sentinel://...`, followed across
//! failovers), a Redis Cluster (`redis+cluster://...`, one lock service); `rediss...` for
//! TLS ([`ClientBuilder::tls_ca_file`]). Or independent masters with [`Client::redlock`],
//! whose restart protection keeps a node that lost its keys from voting too soon. Or the
//! application's own redis-rs client, [`Client::from_redis`] and
//! [`Client::from_redis_cluster`] (the driver is re-exported as [`redis`]). Guide:
//! *Topologies and servers*, *Security*.
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `tokio-postgres` | `fence::tokio_postgres`: the PostgreSQL check inside a tokio-postgres 0.7 transaction |
//! | `sqlx` | `fence::sqlx`: the same with sqlx 0.8 |
//! | `blocking` | `blocking`: the same primitives for code without an async runtime, on a runtime of the client's own (guide: *Without async*) |
//! | `model` | unstable, not part of the API: the engine's transitions for the repository's model checker of the scripts (`model/`) |
//!
//! None is on by default; the SQL setup ([`fence::POSTGRES_SETUP`]) needs neither client.
//!
//! # Operations
//!
//! [`Client::inspect`], [`Client::list`], [`Client::break_lock`] and
//! [`Client::eviction_risks`] are what the `fencelock` CLI's `status`, `list` and
//! `break` show. fencelock logs with [`tracing`] and counts with [`metrics`] (free until
//! a recorder is installed); [`observe`] names every metric and span. Keys: [`keys`];
//! bounds: [`limits`]. Guide: *The CLI*, *Operations*, *Upgrading*.
//!
//! # How it is built
//!
//! Lua scripts ([`lua_scripts`] shows them as sent) → the engine (the acquire state
//! machine, its driver, the watchdog: what the library decides, without I/O) → protocols
//! (one per primitive) → backend (one node, Sentinel, Cluster, Redlock's tally) → this
//! API. `docs/design.md` in the repository traces one acquire through them.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod admin;
mod backend;
#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;
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
#[cfg(feature = "model")]
#[doc(hidden)]
pub mod model;
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
pub use builder::{AcquireBuilder, Acquisition, Kind, Target};
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
pub use multi::{LostLock, MultiGuard, MultiLockBuilder, MultiLockKind};
pub use rwlock::{ReadLockBuilder, ReadLockKind};
pub use scripts::lua_scripts;
pub use semaphore::{SemaphoreBuilder, SemaphoreKind};
pub use token::{FencingToken, HolderToken};

/// The Redis driver fencelock is built on (redis-rs), for
/// [`Client::from_redis`] and [`Client::from_redis_cluster`]: the application's client
/// must be of this version.
pub use redis;
