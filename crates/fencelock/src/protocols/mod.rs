//! One protocol per primitive: how a plain lock, a fair lock, a reentrant lock, a
//! semaphore's permit, a read-write lock's read side, several plain locks at once and a
//! leader election's leadership are taken, released, renewed and waited for.
//!
//! A [`Protocol`] says which script an acquire attempt calls and with what, which script
//! releases (or, for an acquire that ends without the lock, withdraws), what the lock key
//! holds for its holder (what renewals and extends compare against), which release
//! messages wake its waiters and how they wait, and how it is written into a
//! [`DetachedLock`](crate::DetachedLock). The acquire engine, the backend and the
//! watchdog only ever call it: none of them knows which primitive it serves. Every
//! protocol's acquire script answers in one shape
//! ([`Answer`](crate::scripts::replies::Answer)), decoded once.
//!
//! A new primitive is a module here, its scripts in `scripts/` (listed in `Lua`, and in
//! `Lua::acquires` and `Call::may_resend` where they acquire or release), a builder kind,
//! its docs and its tests; [`from_text`] learns its name. docs/design.md has the steps.

mod election;
mod fair;
mod multi;
mod plain;
mod read;
mod reentrant;
mod semaphore;
mod text;

use std::sync::Arc;

pub use election::Election;
pub use fair::Fair;
pub use multi::Multi;
pub use plain::Plain;
pub use read::Read;
pub use reentrant::Reentrant;
pub use semaphore::Semaphore;

use crate::engine::Protocol;
use crate::error::Error;
use text::bad;
pub(crate) use text::checked_owner;

/// The protocol a detached lock's `mode=` line names ([`Protocol::to_text`]).
///
/// # Errors
/// [`Error::InvalidArgument`] naming what is wrong.
pub(crate) fn from_text(mode: &str) -> Result<Arc<dyn Protocol>, Error> {
    let (kind, rest) = mode.split_once(' ').unwrap_or((mode, ""));
    match kind {
        "plain" if rest.is_empty() => Ok(Arc::new(Plain)),
        "fair" => Fair::from_text(rest),
        "reentrant" => Reentrant::from_text(rest),
        "semaphore" => Semaphore::from_text(rest),
        "read" => Read::from_text(rest),
        "election" if rest.is_empty() => Ok(Arc::new(Election)),
        _ => Err(bad("mode is not one fencelock writes")),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn every_protocol_reads_back_what_it_writes() {
        let protocols: Vec<Arc<dyn Protocol>> = vec![
            Arc::new(Plain),
            Arc::new(Election),
            Arc::new(Fair::new(Duration::from_millis(3000))),
            Arc::new(Reentrant::new("job-42".into())),
            Arc::new(Semaphore::new(5, None)),
            Arc::new(Semaphore::new(5, Some(Duration::from_millis(250)))),
            Arc::new(Read::new(String::new())),
            Arc::new(Read::new("job-42".into())),
        ];
        for p in protocols {
            let back = from_text(&p.to_text()).unwrap();
            assert_eq!(back.to_text(), p.to_text());
            assert_eq!(back.label(), p.label());
        }
        for bad in [
            "",
            "plain x",
            "fair",
            "fair x",
            "semaphore x",
            "reentrant ",
            "odd",
        ] {
            assert!(from_text(bad).is_err(), "{bad:?}");
        }
    }
}
