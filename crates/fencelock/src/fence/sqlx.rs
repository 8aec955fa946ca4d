//! The PostgreSQL check with sqlx 0.8: install it, and run it inside a
//! transaction.

use ::sqlx::postgres::{PgDatabaseError, Postgres};
use ::sqlx::{Executor, Transaction};

use super::postgres::{CHECK_SQL, POSTGRES_SETUP, check_resource, sort_check_error};
use crate::error::Error;
use crate::token::FencingToken;

/// Checks `token` for `resource` inside the transaction `tx`, before its writes: passes
/// when `token` is at least the highest token the resource accepted (and records it),
/// and fails otherwise, so that the caller rolls the transaction back. The resource's
/// row stays locked until `tx` ends: a concurrent check of the same resource waits for
/// it.
///
/// ```no_run
/// # async fn sell(pool: &sqlx::PgPool, guard: &fencelock::LockGuard) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// fencelock::fence::sqlx::check(&mut tx, guard.name(), guard.fencing_token()).await?;
/// sqlx::query("UPDATE stock SET count = count - 1 WHERE id = 42")
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Fenced`] when the resource accepted a higher token (this holder lost its
/// lock: stop writing); [`Error::Database`] for any other failure, the setup not
/// installed among them (the message says to run `fencelock sql`);
/// [`Error::InvalidArgument`] for an empty resource name (nothing sent). After either
/// of the first two, the transaction is aborted: roll it back (dropping `tx` does).
///
/// # Cancel safety
/// Dropping the future leaves the transaction in an unknown state: roll it back.
pub async fn check(
    tx: &mut Transaction<'_, Postgres>,
    resource: &str,
    token: FencingToken,
) -> Result<(), Error> {
    check_resource(resource)?;
    ::sqlx::query(CHECK_SQL)
        .bind(resource)
        .bind(token.get().to_string())
        .execute(&mut **tx)
        .await
        .map(|_| ())
        .map_err(|e| sort(resource, token, e))
}

/// Installs the check in the database of `executor` (a pool or a connection, not a
/// transaction: the setup commits on its own) with [`POSTGRES_SETUP`]: safe to run
/// again, and by several clients at once.
///
/// # Errors
/// [`Error::Database`] with what PostgreSQL said (permissions to create a table and a
/// function, most often).
///
/// # Cancel safety
/// The setup runs in a transaction of its own: dropped, it is either installed or not.
pub async fn install<'c, E>(executor: E) -> Result<(), Error>
where
    E: Executor<'c, Database = Postgres>,
{
    ::sqlx::raw_sql(POSTGRES_SETUP)
        .execute(executor)
        .await
        .map(|_| ())
        .map_err(|e| sort("", FencingToken::new(0), e))
}

fn sort(resource: &str, token: FencingToken, e: ::sqlx::Error) -> Error {
    let (code, message, detail) = match &e {
        ::sqlx::Error::Database(db) => (
            db.code().map(|c| c.into_owned()),
            db.message().to_owned(),
            db.try_downcast_ref::<PgDatabaseError>()
                .and_then(PgDatabaseError::detail)
                .map(str::to_owned),
        ),
        other => (None, other.to_string(), None),
    };
    sort_check_error(
        resource,
        token,
        code.as_deref(),
        message,
        detail.as_deref(),
        Box::new(e),
    )
}
