//! The PostgreSQL check with tokio-postgres 0.7 (0.7.17 or later): install it, and
//! run it inside a transaction.

use ::tokio_postgres::types::{ToSql, Type};
use ::tokio_postgres::{Client, Transaction};

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
/// # async fn sell(client: &mut tokio_postgres::Client, guard: &fencelock::LockGuard) -> Result<(), Box<dyn std::error::Error>> {
/// let tx = client.transaction().await?;
/// fencelock::fence::tokio_postgres::check(&tx, guard.name(), guard.fencing_token()).await?;
/// tx.execute("UPDATE stock SET count = count - 1 WHERE id = 42", &[]).await?;
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
pub async fn check(tx: &Transaction<'_>, resource: &str, token: FencingToken) -> Result<(), Error> {
    check_resource(resource)?;
    let text = token.get().to_string();
    // Typed: one round trip, where an untyped statement is prepared first on every call.
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&resource, Type::TEXT), (&text, Type::TEXT)];
    match tx.execute_typed(CHECK_SQL, &params).await {
        Ok(_) => Ok(()),
        Err(e) => Err(sort(resource, token, e)),
    }
}

/// Installs the check in the database `client` is connected to ([`POSTGRES_SETUP`]):
/// safe to run again, and by several clients at once.
///
/// # Errors
/// [`Error::Database`] with what PostgreSQL said (permissions to create a table and a
/// function, most often).
///
/// # Cancel safety
/// The setup runs in a transaction of its own: dropped, it is either installed or not.
pub async fn install(client: &Client) -> Result<(), Error> {
    client
        .batch_execute(POSTGRES_SETUP)
        .await
        .map_err(|e| sort("", FencingToken::new(0), e))
}

fn sort(resource: &str, token: FencingToken, e: ::tokio_postgres::Error) -> Error {
    let db = e.as_db_error();
    let code = e.code().map(|c| c.code().to_owned());
    let message = db.map_or_else(|| e.to_string(), |d| d.message().to_owned());
    let detail = db.and_then(|d| d.detail()).map(str::to_owned);
    sort_check_error(
        resource,
        token,
        code.as_deref(),
        message,
        detail.as_deref(),
        Box::new(e),
    )
}
