//! The PostgreSQL check: its SQL, and what the clients of both features share.

// Without a client feature only the SQL is used.
#![cfg_attr(
    not(any(feature = "sqlx", feature = "tokio-postgres")),
    allow(dead_code)
)]

use crate::error::Error;
use crate::token::FencingToken;

/// The SQL that installs the PostgreSQL check: the table `fencelock_fence` (the highest
/// token accepted per resource) and the function `fencelock_check(resource text, token
/// numeric)`. Run it once per database; running it again is safe (it creates what is
/// missing, replaces the function, and keeps every token). `fencelock sql` prints it.
///
/// In each transaction that writes to a guarded resource, call `SELECT
/// fencelock_check('orders:42', 9071)` before the writes; a stale token raises SQLSTATE
/// `FL001` ("stale fencing token"), whose `DETAIL` is `token=T highest=H`, and counts in
/// the sequence `fencelock_refusals` (`SELECT fencelock_refusals()`), which the rollback
/// does not undo. Bad input
/// (an empty resource name, a token that is not a whole number from 0 to 2^64 - 1)
/// raises SQLSTATE `22023`.
pub const POSTGRES_SETUP: &str = include_str!("postgres.sql");

/// The SQLSTATE `fencelock_check` raises for a stale token.
pub const STALE_TOKEN_SQLSTATE: &str = "FL001";

/// The highest token from a stale check's `DETAIL` (`token=T highest=H`).
pub(crate) fn highest_in_detail(detail: &str) -> Option<FencingToken> {
    let highest = detail.split_once("highest=")?.1.split_whitespace().next()?;
    highest.parse().ok().map(FencingToken::new)
}

/// An empty resource name, refused before anything is sent.
pub(crate) fn check_resource(resource: &str) -> Result<(), Error> {
    if resource.is_empty() {
        return Err(Error::invalid(
            "resource name",
            "it is empty; name the resource after the lock that guards it",
        ));
    }
    Ok(())
}

/// A failed check, sorted: a stale token, or the database's error.
pub(crate) fn sort_check_error(
    resource: &str,
    token: FencingToken,
    code: Option<&str>,
    message: String,
    detail: Option<&str>,
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
) -> Error {
    if code == Some(STALE_TOKEN_SQLSTATE)
        && let Some(highest) = detail.and_then(highest_in_detail)
    {
        crate::observe::fence_refused(
            crate::observe::Store::Postgres,
            resource,
            token.get(),
            highest.get(),
        );
        return Error::Fenced {
            resource: resource.to_owned(),
            token,
            highest,
        };
    }
    Error::Database {
        resource: resource.to_owned(),
        code: code.map(str::to_owned),
        message,
        source,
    }
}

/// The statement of a check: the token as text, so that tokens above 2^63 (beyond
/// PostgreSQL's `bigint`) arrive whole.
pub(super) const CHECK_SQL: &str = "SELECT fencelock_check($1, $2::text::numeric)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_token_is_read_from_the_detail() {
        assert_eq!(
            highest_in_detail("token=5 highest=18446744073709551615"),
            Some(FencingToken::new(u64::MAX))
        );
        assert_eq!(highest_in_detail("token=5"), None);
        assert_eq!(highest_in_detail("token=5 highest=x"), None);
    }

    #[test]
    fn a_missing_setup_is_told_from_other_errors() {
        use crate::error::setup_missing;
        assert!(setup_missing(
            Some("42883"),
            "function fencelock_check(text, numeric) does not exist"
        ));
        assert!(setup_missing(
            Some("42P01"),
            "relation \"fencelock_fence\" does not exist"
        ));
        assert!(!setup_missing(
            Some("42P01"),
            "relation \"stock\" does not exist"
        ));
        assert!(!setup_missing(Some("40001"), "fencelock_check"));
    }
}
