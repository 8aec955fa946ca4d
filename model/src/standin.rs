//! STAND-IN, to be replaced: a minimal scripted plain-lock client that sends the
//! library's real script calls directly.
//!
//! Issue 46 requires the checker's clients to BE the library's engine (the sans-I/O
//! acquire/wait/renew/release transitions of issue 45), not a rewrite of it. Until that
//! engine lands (branch `engine`), this module builds the calls a plain lock makes the
//! way `protocols/plain.rs` does (its keys and arguments in the order of the scripts'
//! headers, the key layout of `keys.rs`) and decodes their replies as `replies.rs`
//! does, so that the worlds, the faults and the properties can be built and checked
//! now. Nothing here decides what the library does: when the engine lands, a world's
//! client becomes the engine, fed the replies, messages and timers as events, and
//! this module goes.

use crate::keyspace::{Bytes, Reply};

/// The lock's name in every world.
pub const NAME: &str = "x";
/// The counter idle time the library uses by default (7 days), ms.
const COUNTER_IDLE_MS: &str = "604800000";
/// The wake list's margin (the engine's `LISTING_MARGIN`, 1 s), ms.
const LISTING_MARGIN_MS: &str = "1000";

/// One lock's keys, as `keys.rs` lays them out (no prefix: `{x}`, `{x}:fence`, ...).
pub fn key(suffix: &str) -> String {
    format!("{{{NAME}}}{suffix}")
}

/// A client's tag (its own release channel is the lock's channel, `:`, the tag).
pub fn tag(client: usize) -> String {
    format!("c{client}")
}

/// The lock's release channel.
pub fn channel() -> String {
    key(":released")
}

/// A client's own release channel.
pub fn own_channel(client: usize) -> String {
    format!("{}:{}", channel(), tag(client))
}

/// A script call: the script's name in the library's registry, its keys and arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Call {
    /// The script (`lock/acquire.lua`, ...).
    pub script: &'static str,
    /// KEYS.
    pub keys: Vec<Bytes>,
    /// ARGV.
    pub argv: Vec<Bytes>,
}

fn bytes(items: &[String]) -> Vec<Bytes> {
    items.iter().map(|s| s.clone().into_bytes()).collect()
}

/// A plain lock's acquire (`Plain::acquire`): `waiting` lists the client on the wake
/// list (a waiting acquire's later attempts), `woken` when a release woke it by name.
pub fn acquire(token: &str, ttl_ms: i64, client: usize, waiting: bool, woken: bool) -> Call {
    let mut keys = vec![key(""), key(":fence"), key(":holder"), key(":writers")];
    let mut argv = vec![
        token.to_owned(),
        ttl_ms.to_string(),
        "0".into(), // identify: Redlock only
        String::new(),
        COUNTER_IDLE_MS.into(),
        "0".into(), // join the writers: read-write locks only
        "0".into(), // never queued among writers
    ];
    if waiting {
        keys.push(key(":wakes"));
        argv.extend([
            tag(client),
            LISTING_MARGIN_MS.into(),
            "0".into(),
            if woken { "1" } else { "0" }.into(),
        ]);
    }
    Call {
        script: "lock/acquire.lua",
        keys: bytes(&keys),
        argv: bytes(&argv),
    }
}

/// A plain lock's release (`Plain::release`, a holder's own release on one node: no
/// fencing token to raise the counter to).
pub fn release(token: &str) -> Call {
    Call {
        script: "lock/release.lua",
        keys: bytes(&[key(""), key(":fence"), key(":holder"), key(":wakes")]),
        argv: bytes(&[
            token.to_owned(),
            channel(),
            "0".into(),
            COUNTER_IDLE_MS.into(),
        ]),
    }
}

/// A fenced write of `value` to the resource's key with `fence` (`fence/write.lua`).
pub fn fenced_write(fence: i64, value: &str) -> Call {
    Call {
        script: "fence/write.lua",
        keys: bytes(&["{resource}:accepted".into(), "{resource}".into()]),
        argv: bytes(&[
            fence.to_string(),
            "SET".into(),
            "2".into(),
            "1".into(),
            value.into(),
        ]),
    }
}

/// An acquire's answer, as `replies.rs` reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Code 1 or 2: granted, with this fencing token.
    Granted(i64),
    /// Code 0 (or 6): held, for this many ms more (-1: no expiry).
    Held(i64),
    /// Anything else (an error): the attempt failed.
    Failed(String),
}

/// Decodes an acquire's reply.
pub fn answer(reply: &Reply) -> Answer {
    let items = reply.as_array().unwrap_or(&[]);
    match (
        items.first().and_then(Reply::as_int),
        items.get(1).and_then(Reply::as_int),
    ) {
        (Some(1 | 2), Some(fence)) => Answer::Granted(fence),
        (Some(0 | 6), Some(ms)) => Answer::Held(ms),
        _ => Answer::Failed(reply.to_string()),
    }
}
