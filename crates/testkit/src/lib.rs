//! Real `redis-server` (and PostgreSQL) processes for fencelock's integration tests.
//!
//! Every [`RedisServer`] is a child process on a free loopback port (never
//! 6379) with its own temporary directory. Tests can pause it (`SIGSTOP`),
//! kill it (`SIGKILL`), restart it on the same port, and talk to it with a
//! tiny built-in RESP2 client ([`RedisServer::cmd`]) without any Redis
//! client crate. Dropping it kills the process and removes the directory.
//!
//! ```
//! use testkit::RedisServer;
//!
//! let mut server = RedisServer::start();
//! assert_eq!(server.cmd(&["SET", "k", "v"]).as_str(), Some("OK"));
//! assert_eq!(server.cmd(&["GET", "k"]).as_str(), Some("v"));
//!
//! server.kill();
//! server.restart(); // same port, no persistence: the key is gone
//! assert!(server.cmd(&["GET", "k"]).is_nil());
//! ```
//!
//! Shortcuts read state for assertions ([`RedisServer::exists`],
//! [`pttl`](RedisServer::pttl), [`get`](RedisServer::get),
//! [`server_time`](RedisServer::server_time),
//! [`info_field`](RedisServer::info_field),
//! [`connected_clients`](RedisServer::connected_clients),
//! [`unread_request_bytes`](RedisServer::unread_request_bytes): requests
//! waiting unanswered at a paused server), and [`eventually`] polls, bounded,
//! for state that no event announces (a server-side count, a client's
//! statistics).
//!
//! [`SentinelGroup`] (a master, replicas and three sentinels) and
//! [`Cluster`] (masters with replicas, created by `redis-cli --cluster
//! create`) are whole deployments of such servers, with their own faults:
//! killing or pausing the master and waiting for the failover, a graceful
//! `SENTINEL FAILOVER`, and moving a cluster slot with its keys
//! ([`Cluster::migrate_slot`]).
//!
//! [`FaultProxy`] sits between a client and a server and injects network
//! faults (delay, blackhole, dropped replies, resets); one proxy per
//! (client, node) link composes into partitions, see [`proxy`].
//!
//! [`ServerBuilder::tls`] adds a TLS port to a server, serving certificates
//! that [`TlsFiles`] makes with the `openssl` tool: a CA, a good server
//! certificate for `localhost`, a client certificate, and bad server
//! certificates (an unknown CA, another name, expired); see [`tls`].
//! [`SentinelBuilder::tls`] and [`ClusterBuilder::tls`] run whole deployments
//! over TLS (a TLS cluster on TLS ports only, its bus and replication too).
//!
//! [`Postgres`] is a real PostgreSQL server in the same spirit: a throwaway
//! `postgres` on a free loopback port in its own temporary directory, with
//! [`psql`](Postgres::psql) for queries, a database per test
//! ([`create_database`](Postgres::create_database)), and the same faults
//! (pause, kill); see [`postgres`].
//!
//! [`ServerClock`] is a wall clock a test steps forward or back under a
//! running server ([`ServerBuilder::clock`]); see [`clock`].
//!
//! For the safety lab, [`history`] is the per-process JSON Lines history
//! format (timestamps from `CLOCK_MONOTONIC`) and [`checkers`] are the
//! linear safety checkers (C1-C6) run over the merged history;
//! [`monitor`] records a server's `MONITOR` stream and replays it into C5's
//! input (which owner's key each script deleted or extended).
//!
//! Every Redis rig runs the server build it is given ([`ServerBuild`]:
//! [`ServerBuilder::server`], [`SentinelBuilder::server`], [`ClusterBuilder::server`]):
//! by default Debian's `redis-server` (Redis 7.0), taken from `$REDIS_SERVER` if set,
//! else from `$PATH`; or Redis 6.2.14 or Valkey 9.1.2, which `scripts/servers` fetches
//! into `target/servers/`; or a binary of the user's own. [`ServerBuild::from_env`]
//! reads the builds a test matrix runs on from `$FENCELOCK_TEST_SERVERS`.
//! PostgreSQL is taken from `$PG_BIN` if set, else from `/usr/lib/postgresql/*/bin`.
//! Linux only (`prctl`, `/proc`). Start servers from the test's own thread:
//! see [`RedisServer`] on `PR_SET_PDEATHSIG`.

#![warn(missing_docs)]
// Unsafe is needed for raw process and socket control that std does not offer:
// `libc::kill` (SIGSTOP/SIGCONT), a `pre_exec` hook calling
// `prctl(PR_SET_PDEATHSIG)` in the forked child, and in the fault proxy
// `setsockopt(SO_LINGER)` (RST on close) and `poll` (accept with a timeout),
// and in the history `clock_gettime(CLOCK_MONOTONIC)` (std's `Instant` does
// not expose its raw value, which must be comparable across processes), and
// `atexit` to remove the shared TLS files' directory when the process exits.
// For PostgreSQL: `geteuid` and `getpwnam_r` (to run the server as the
// `postgres` user when the tests run as root, which it refuses), the
// `pre_exec` hook with `SIGQUIT` (its immediate shutdown), and `kill` on its
// process group and on its backends (stop, continue, quit, kill), and
// `shmctl` to remove the System V shared memory segment a killed server leaves.
#![allow(unsafe_code)]

mod build;
pub mod checkers;
pub mod clock;
pub mod cluster;
pub mod history;
pub mod monitor;
pub mod postgres;
pub mod proxy;
mod resp;
pub mod sentinel;
mod server;
pub mod tls;
mod wait;

pub use build::ServerBuild;
pub use clock::ServerClock;
pub use cluster::{Cluster, ClusterBuilder, SlotMigration};
pub use postgres::Postgres;
pub use proxy::{Fault, FaultProxy};
pub use resp::Reply;
pub use sentinel::{SentinelBuilder, SentinelGroup};
pub use server::{RedisServer, ServerBuilder, free_cluster_port, free_port};
pub use tls::{ClientAuth, TlsFiles};
pub use wait::eventually;
