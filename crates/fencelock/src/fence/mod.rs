//! Make the resource check the token: the checks that refuse a stale holder's writes.
//!
//! A lock on its own cannot stop a holder that was paused past its lease (a GC pause,
//! swap, `SIGSTOP`, a slow network): it still believes it holds the lock, and writes.
//! Only the resource can refuse that write, by comparing [`FencingToken`](crate::FencingToken)s: every grant
//! of a lock name carries a higher token than the grants before it, so a resource that
//! remembers the highest token it accepted can refuse every lower one. This module is
//! that check, for the two stores a Redis lock most often guards:
//!
//! - **PostgreSQL**: [`POSTGRES_SETUP`] (also printed by `fencelock sql`) installs a
//!   table of the highest token per resource and a function, `fencelock_check(resource,
//!   token)`, to call inside the transaction that writes: it records the token, or
//!   raises SQLSTATE `FL001` so that the whole transaction rolls back. From Rust, with
//!   the `sqlx` or the `tokio-postgres` feature: [`sqlx::check`][sqlx-check] and
//!   [`tokio_postgres::check`][tokio-postgres-check], which return [`Error::Fenced`](crate::Error::Fenced) for a stale holder and
//!   [`Error::Database`](crate::Error::Database) for everything else.
//! - **Redis**: [`Client::fenced_write`](crate::Client::fenced_write) applies a few
//!   writes (SET, DEL, INCRBY, HSET, RPUSH, LPUSH, XADD, PEXPIRE) in one script, all of
//!   them only if the token is at least the highest the resource accepted
//!   ([`Error::Fenced`](crate::Error::Fenced) otherwise, nothing written). The resource's Redis may be
//!   another than the lock's.
//!
//! Name the resource after the lock that guards it, and guard it with that one lock
//! name only: tokens of different lock names are unrelated.
//!
//! # What this guarantees, and what it does not
//!
//! | | |
//! |---|---|
//! | **Guaranteed** | A write checked with token T is refused, with nothing of it applied, once the resource has accepted a token above T. |
//! | **Guaranteed** | Checks of one resource are serialised: PostgreSQL holds the resource's row until the transaction ends; a Redis write is one script. |
//! | **Guaranteed** | Writes carrying the same token all pass (one holder's retries). |
//! | **Not guaranteed** | Exclusion without the check: a resource that does not check the token gains nothing, and neither do writes made outside the check (another table, a key not in the fenced write). |
//! | **Not guaranteed** | That a stale holder's write *before* the newer holder's first write is refused: it is accepted (it comes first in the resource's order), and the newer write follows it. |
//! | **Not guaranteed** | PostgreSQL: progress while a stale holder keeps its transaction open after the check: the next check of the resource waits for it (a row lock). Check right before the writes, keep the transaction short, and set `idle_in_transaction_session_timeout` or `lock_timeout`. |
//! | **Not guaranteed** | A check that outlives its store: a PostgreSQL restore to an older backup, or a Redis failover that loses the last writes, can forget the highest token with the data. |
//!
//! # The per-row pattern
//!
//! A PostgreSQL table that carries its own fence column needs no setup: write with
//! `UPDATE stock SET count = $2, fence = $3 WHERE id = $1 AND fence <= $3` and treat
//! zero rows updated as refused (the row is locked by the update, so a concurrent
//! writer with another token waits, then sees the committed fence).
//!
// The checks' links go to the function in a build with its feature, else to the crate's
// list of features: a link to a module the build lacks would be broken.
#![cfg_attr(feature = "sqlx", doc = "[sqlx-check]: crate::fence::sqlx::check")]
#![cfg_attr(not(feature = "sqlx"), doc = "[sqlx-check]: crate#features")]
#![cfg_attr(
    feature = "tokio-postgres",
    doc = "[tokio-postgres-check]: crate::fence::tokio_postgres::check"
)]
#![cfg_attr(
    not(feature = "tokio-postgres"),
    doc = "[tokio-postgres-check]: crate#features"
)]

mod postgres;
pub(crate) mod redis;
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod sqlx;
#[cfg(feature = "tokio-postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio-postgres")))]
pub mod tokio_postgres;

pub use self::postgres::{POSTGRES_SETUP, STALE_TOKEN_SQLSTATE};
pub use self::redis::{FencedWrite, Reply};
