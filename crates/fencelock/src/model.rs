//! **Unstable**: what the model checker of the scripts (the workspace's `model/` crate)
//! drives, behind the `model` feature. Not part of fencelock's API: it changes with the
//! engine, without notice or semver.
//!
//! The model runs the library's own parts without I/O: the acquire engine's transitions
//! ([`Acquiring`]: an [`Event`] and the time in, one [`Command`] out), each protocol's
//! script calls ([`Acquiring::call`] for an attempt, [`Protocol::release`] and
//! [`Protocol::withdraw`] for the rest: the [`Call`]'s script and its keys and
//! arguments, [`call_parts`]), the decoding of an
//! acquire script's reply ([`AcquireReply`]), and the tally of the nodes' answers
//! ([`judge_one`] for one node, [`Quorum::tally`] for Redlock, [`Quorum::judge_late`]
//! for a Redlock node's answer that comes after the verdict, [`Quorum::confirm`] for a
//! release or a renewal; a Redlock client's memory of each node, [`Health`], which
//! [`Voter::observe`] updates), with the holder tokens and the retry jitter it chooses
//! ([`holder_token`], the seed of [`Acquiring::new`]).
//!
//! The watchdog's decisions for one held lease, on a value the model keeps in its state
//! ([`Watched`], from the lease's [`Terms`] and its grant): when it is lost or due for
//! renewal ([`Watched::look`], on the watchdog's [`tick`]), the renewal's call
//! ([`renew`], one lease), what the node's answer came to ([`decode_renewed`],
//! [`Quorum::renewal`]) and what that does to the lease ([`Watched::answered`]).
//!
//! One acquire by hand, as the driver (`engine/driver.rs`) does it:
//!
//! ```
//! # #[cfg(feature = "model")] {
//! use std::sync::Arc;
//! use std::time::{Duration, Instant};
//!
//! use fencelock::model::*;
//!
//! let t0 = Instant::now();
//! let request = Request {
//!     name: "stock",
//!     keys: LockKeys::new("fl", "stock").unwrap(),
//!     protocol: Arc::new(Plain),
//!     ttl: Duration::from_secs(10),
//!     wait: Some(Duration::ZERO),
//!     retry: fencelock::Retry::default(),
//!     info: "",
//!     replicas: 0,
//!     renew: true,
//! };
//! let mut acquire = Acquiring::new(request, holder_token("ab".repeat(16)), 7, t0);
//! let Command::Attempt(attempt) = acquire.start(t0) else { unreachable!() };
//! // The protocol builds the call: script, keys, arguments.
//! let call = acquire.call(&attempt, &Site::default(), false);
//! let parts = call_parts(&call);
//! // The common attempt's own script (one node, no holder info, not listed).
//! assert_eq!(parts.file, "lock/take.lua");
//! // ... the model runs `parts.source` on its keyspace, which grants: the token, 42 ...
//! let reply = decode_acquire(redis::Value::Int(42)).unwrap();
//! let lease = Duration::from_secs(10);
//! let (outcome, _take_back) = judge_one(|| "model:1".into(), Ok(reply), t0, lease, t0);
//! match acquire.on(Event::Answered(outcome), t0) {
//!     Command::Done(done) => assert_eq!(done.result.unwrap().grant.fence.get(), 42),
//!     other => panic!("{other:?}"),
//! }
//! # }
//! ```

use std::sync::Arc;

pub use crate::backend::judge_one;
pub use crate::backend::node::Health;
pub use crate::backend::quorum::{AcquireTally, Confirmation, Quorum, Voter};
pub use crate::engine::acquire::{
    Acquired, Acquiring, Attempt, Channels, Cleanup, Command, Done, Event, Found, Handover,
    LISTING_MARGIN, Request, Site, Subscribe, Woken,
};
pub use crate::engine::protocol::{Acquire, Listed, Protocol, Release, Undo, Waiting, Wake};
pub use crate::engine::retry::Retry;
pub use crate::engine::watchdog::{Answered, Look, Renewal, Terms, Watched, tick};
pub use crate::engine::{Grant, Outcome, Refusal, drift, lease_end};
pub use crate::keys::LockKeys;
pub use crate::observe::{ModeLabel, WokenBy};
pub use crate::protocols::{Election, Fair, Multi, Plain, Read, Reentrant, Semaphore};
pub use crate::scripts::replies::{AcquireReply, Answer, Code, Identity, Owned, Renewed};
pub use crate::scripts::{Call, CallParts, Flavor, Listing, renew};
pub use crate::token::HolderToken;

/// A holder token with the text the model chose (32 lowercase hex digits, as the
/// library draws them).
pub fn holder_token(text: String) -> HolderToken {
    HolderToken::from_stored(text)
}

/// A call's script (its file and its source, composed for a standalone node) and its
/// keys and arguments, as sent.
pub fn call_parts(call: &Call) -> CallParts<'_> {
    call.parts(Flavor::STANDALONE)
}

/// An acquire script's reply decoded, as the nodes' connections decode it.
pub fn decode_acquire(reply: redis::Value) -> Result<AcquireReply, redis::ParsingError> {
    redis::FromRedisValue::from_redis_value(reply)
}

/// `renew.lua`'s reply decoded, as a node's connection decodes it: what the node said
/// of each lease of the batch.
pub fn decode_renewed(reply: redis::Value) -> Result<Renewed, redis::ParsingError> {
    redis::FromRedisValue::from_redis_value(reply)
}

/// A protocol, shared as the engine holds it.
pub type SharedProtocol = Arc<dyn Protocol>;

/// A multi-lock over `names` (its keys, in the global order the library sorts them
/// into), as `MultiLockBuilder` builds it.
pub fn multi(names: Vec<LockKeys>) -> Multi {
    Multi::new(names)
}

/// A multi-lock's `names` sorted into the global order every caller takes them in, each
/// with its keys (no prefix), as `MultiLockBuilder` sorts them before it acquires.
pub fn multi_order(names: &[String]) -> Result<Vec<(String, LockKeys)>, crate::Error> {
    crate::multi::global_order("", names)
}

/// What a node's subscriber runs when a wake by name finds no waiter of its client left
/// (`lock/wake.lua`, the `HandOn` of `backend/subscriber.rs`): the wake goes on to the
/// next client of the wake list.
pub fn hand_on(keys: &LockKeys) -> Call {
    crate::scripts::wake(keys)
}

/// The release channel of the client tagged `tag` on the lock of `keys` (where a wake by
/// name or a fair handover reaches it).
pub fn own_channel(keys: &LockKeys, tag: &str) -> String {
    keys.own_channel(tag)
}

/// The error of a call whose reply did not come back in time (a lost reply), as the
/// node's connection reports it: its outcome is unknown.
pub fn timed_out(node: &str) -> crate::Error {
    crate::Error::Unavailable {
        node: node.to_owned(),
        reason: crate::UnavailableReason::TimedOut,
        detail: "the reply was lost".to_owned(),
        source: None,
    }
}

/// The error of a call whose connection closed before its reply came (a Redlock node
/// that restarted: a server restarts only by closing its connections), as the node's
/// connection reports it: its outcome is unknown, and the node's connection changes
/// (its generation: see [`Voter::generation`]).
pub fn broken(node: &str) -> crate::Error {
    crate::Error::Unavailable {
        node: node.to_owned(),
        reason: crate::UnavailableReason::Io,
        detail: "the connection closed (the server restarted)".to_owned(),
        source: None,
    }
}

/// The error of a script that answered an error reply (`message`, without the `-`).
pub fn rejected(node: &str, message: &str) -> crate::Error {
    crate::Error::Rejected {
        node: node.to_owned(),
        code: message.split(' ').next().unwrap_or_default().to_owned(),
        message: message.to_owned(),
    }
}

impl std::fmt::Debug for Acquiring<'_> {
    /// Its token and the number of attempts: the rest is read through its accessors.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquiring")
            .field("token", &self.token().as_str())
            .field("attempts", &self.attempts())
            .finish_non_exhaustive()
    }
}
