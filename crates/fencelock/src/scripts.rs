//! The Lua scripts, each in its own `.lua` file whose header states KEYS, ARGV and the
//! reply, and typed wrappers that turn their replies into Rust values.
//!
//! Scripts run through [`redis::Script`], which sends `EVALSHA` and falls back to loading
//! the script when the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use crate::error::Blocker;
use crate::keys::LockKeys;
use crate::token::{FencingToken, HolderToken};

/// An acquire script with `_counter.lua` (the fencing counter's functions) in front.
macro_rules! with_counter {
    ($file:literal) => {
        concat!(include_str!("scripts/_counter.lua"), include_str!($file))
    };
}

/// A release script with `_holder.lua` (the owner check) in front.
macro_rules! with_holder {
    ($file:literal) => {
        concat!(include_str!("scripts/_holder.lua"), include_str!($file))
    };
}

static ACQUIRE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(with_counter!("scripts/acquire.lua")));
static RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(with_holder!("scripts/release.lua")));
static REENTRANT_ACQUIRE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(with_counter!("scripts/reentrant_acquire.lua")));
static REENTRANT_RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/reentrant_release.lua")));
static FAIR_ACQUIRE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/_queue.lua"),
        with_counter!("scripts/fair_acquire.lua")
    ))
});
static FAIR_RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/_queue.lua"),
        with_holder!("scripts/fair_release.lua")
    ))
});
static FAIR_LEAVE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/fair_leave.lua")));

/// What `acquire.lua` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The lock is ours; `fresh` is false when it already held our token (a retry).
    Acquired { fence: FencingToken, fresh: bool },
    /// Another owner holds it, or in fair mode it is free but another waiter is first in
    /// line.
    Held { blocked_by: Blocker },
    /// `key` holds a `found` fencelock did not write.
    WrongType { key: String, found: String },
}

/// What the release scripts and each lease of `renew.lua` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnedReply {
    /// The key held our token and the operation happened.
    Done,
    /// The key was absent.
    Absent,
    /// The key held another owner's token.
    Other,
    /// The key holds a non-string type.
    WrongType,
}

pub(crate) fn acquire(
    keys: &LockKeys,
    token: &HolderToken,
    ttl: Duration,
) -> redis::ScriptInvocation<'static> {
    let mut inv = ACQUIRE.prepare_invoke();
    inv.key(&keys.lock)
        .key(keys.fence())
        .arg(token.as_str())
        .arg(ttl_ms(ttl));
    inv
}

pub(crate) fn release(keys: &LockKeys, token: &HolderToken) -> redis::ScriptInvocation<'static> {
    let mut inv = RELEASE.prepare_invoke();
    inv.key(&keys.lock).arg(token.as_str()).arg(keys.channel());
    inv
}

/// `join`: enter the queue when it is not our turn (a waiting acquire), or only try.
pub(crate) fn fair_acquire(
    keys: &LockKeys,
    token: &HolderToken,
    ttl: Duration,
    waiter_timeout: Duration,
    join: bool,
) -> redis::ScriptInvocation<'static> {
    let mut inv = FAIR_ACQUIRE.prepare_invoke();
    inv.key(&keys.lock)
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.waiters())
        .arg(token.as_str())
        .arg(ttl_ms(ttl))
        .arg(ttl_ms(waiter_timeout))
        .arg(keys.channel())
        .arg(if join { "1" } else { "0" });
    inv
}

pub(crate) fn fair_release(
    keys: &LockKeys,
    token: &HolderToken,
) -> redis::ScriptInvocation<'static> {
    let mut inv = FAIR_RELEASE.prepare_invoke();
    inv.key(&keys.lock)
        .key(keys.queue())
        .key(keys.waiters())
        .arg(token.as_str())
        .arg(keys.channel());
    inv
}

pub(crate) fn fair_leave(keys: &LockKeys, token: &HolderToken) -> redis::ScriptInvocation<'static> {
    let mut inv = FAIR_LEAVE.prepare_invoke();
    inv.key(&keys.lock)
        .key(keys.queue())
        .key(keys.waiters())
        .arg(token.as_str())
        .arg(keys.channel());
    inv
}

pub(crate) fn reentrant_acquire(
    keys: &LockKeys,
    owner: &str,
    token: &HolderToken,
    ttl: Duration,
) -> redis::ScriptInvocation<'static> {
    let mut inv = REENTRANT_ACQUIRE.prepare_invoke();
    inv.key(&keys.lock)
        .key(keys.fence())
        .arg(owner)
        .arg(token.as_str())
        .arg(ttl_ms(ttl));
    inv
}

pub(crate) fn reentrant_release(
    keys: &LockKeys,
    owner: &str,
    token: &HolderToken,
) -> redis::ScriptInvocation<'static> {
    let mut inv = REENTRANT_RELEASE.prepare_invoke();
    inv.key(&keys.lock)
        .arg(owner)
        .arg(token.as_str())
        .arg(keys.channel());
    inv
}

/// Durations in whole milliseconds (validated before they get here; queue delays may be 0).
fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(v: Value) -> Result<Self, redis::ParsingError> {
        let bad = || ParsingError::from(format!("acquire.lua replied with {v:?}"));
        let Value::Array(items) = &v else {
            return Err(bad());
        };
        let int = |i: usize| match items.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            _ => Err(bad()),
        };
        let text = |i: usize| match items.get(i) {
            Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
            Some(Value::SimpleString(s)) => Ok(s.clone()),
            _ => Err(bad()),
        };
        match int(0)? {
            code @ (1 | 2) => {
                let fence = u64::try_from(int(1)?).map_err(|_| bad())?;
                Ok(Self::Acquired {
                    fence: FencingToken::new(fence),
                    fresh: code == 1,
                })
            }
            0 => {
                // The PTTL of the holder's key; -1: no expiry; -2 (only fair_acquire.lua
                // says it): free, with another waiter first in line.
                let blocked_by = match int(1)? {
                    -2 => Blocker::Queue,
                    -1 => Blocker::NoExpiry,
                    pttl => Blocker::Lease(Duration::from_millis(
                        u64::try_from(pttl).map_err(|_| bad())?,
                    )),
                };
                Ok(Self::Held { blocked_by })
            }
            -1 => Ok(Self::WrongType {
                key: text(1)?,
                found: text(2)?,
            }),
            _ => Err(bad()),
        }
    }
}

impl OwnedReply {
    pub(crate) fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(Self::Done),
            0 => Some(Self::Absent),
            -1 => Some(Self::Other),
            -2 => Some(Self::WrongType),
            _ => None,
        }
    }
}

impl FromRedisValue for OwnedReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(code) => Self::from_code(code),
            _ => None,
        }
        .ok_or_else(|| ParsingError::from(format!("release script replied with {v:?}")))
    }
}

static QUORUM_ACQUIRE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(with_counter!("scripts/quorum_acquire.lua")));
static QUORUM_RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(with_holder!("scripts/quorum_release.lua")));

/// `identify`: have each node report its run id and uptime (restart protection).
pub(crate) fn quorum_acquire(
    keys: &LockKeys,
    token: &HolderToken,
    ttl: Duration,
    identify: bool,
) -> redis::ScriptInvocation<'static> {
    let mut inv = QUORUM_ACQUIRE.prepare_invoke();
    inv.key(&keys.lock)
        .key(keys.fence())
        .arg(token.as_str())
        .arg(ttl_ms(ttl))
        .arg(if identify { "1" } else { "0" });
    inv
}

/// `fence`: the grant's token, raised into every node's counter (0: none).
pub(crate) fn quorum_release(
    keys: &LockKeys,
    token: &HolderToken,
    fence: u64,
) -> redis::ScriptInvocation<'static> {
    let mut inv = QUORUM_RELEASE.prepare_invoke();
    inv.key(&keys.lock)
        .key(keys.fence())
        .arg(token.as_str())
        .arg(keys.channel())
        .arg(fence);
    inv
}

/// One node's answer to `quorum_acquire.lua`: the acquire reply, and who the node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QuorumReply {
    pub reply: AcquireReply,
    /// `(run_id, uptime in seconds)`; absent on a wrong-type reply.
    pub identity: Option<(String, u64)>,
}

impl FromRedisValue for QuorumReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let identity = match &v {
            Value::Array(items) if items.len() == 4 => match (&items[2], &items[3]) {
                (Value::BulkString(id), Value::Int(up)) if !id.is_empty() => Some((
                    String::from_utf8_lossy(id).into_owned(),
                    u64::try_from(*up).unwrap_or(0),
                )),
                _ => None,
            },
            _ => None,
        };
        let reply = match v {
            Value::Array(mut items) if items.len() == 4 => {
                items.truncate(2);
                AcquireReply::from_redis_value(Value::Array(items))?
            }
            other => AcquireReply::from_redis_value(other)?,
        };
        Ok(Self { reply, identity })
    }
}

static RENEW: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/renew.lua")));

/// One batch of the watchdog: `(lock key, owner token, ttl)` per lease.
pub(crate) fn renew<'a>(
    leases: impl Iterator<Item = (&'a str, &'a str, Duration)>,
) -> redis::ScriptInvocation<'static> {
    let mut inv = RENEW.prepare_invoke();
    for (key, token, ttl) in leases {
        inv.key(key).arg(token).arg(ttl_ms(ttl));
    }
    inv
}

// ---------------------------------------------------------------------------------------
// Delay queue (`delay_queue.rs`): the `queue_*.lua` scripts and their replies.
// ---------------------------------------------------------------------------------------

use crate::delay_queue::{ItemId, QueueKeys};

static QUEUE_PUSH: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/queue_push.lua")));
static QUEUE_TAKE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/queue_take.lua")));
static QUEUE_ACK: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/queue_ack.lua")));
static QUEUE_RETRY: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/queue_retry.lua")));
static QUEUE_EXTEND: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/queue_extend.lua")));
static QUEUE_COUNTS: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/queue_counts.lua")));

/// What a `queue_*.lua` script found: its own outcome `T`, or the `{-1, key, type}`
/// marker every queue script replies with for a key of the wrong type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum QueueReply<T> {
    Done(T),
    /// `key` holds a `found` fencelock did not write; nothing was written.
    WrongType {
        key: String,
        found: String,
    },
}

/// An item `queue_take.lua` delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taken {
    pub id: ItemId,
    pub payload: Vec<u8>,
    pub attempt: u32,
}

/// The counts `queue_counts.lua` replies with: ready, delayed, in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub ready: u64,
    pub delayed: u64,
    pub in_flight: u64,
}

/// The reply of one queue script, after its leading code (other than -1).
pub(crate) trait QueueOutcome: Sized {
    /// The script's file name, for parse errors.
    const SCRIPT: &'static str;
    /// `None` when the reply does not fit the script's header.
    fn parse(code: i64, rest: &[Value]) -> Option<Self>;
}

/// `queue_push.lua`: the new item's id.
impl QueueOutcome for ItemId {
    const SCRIPT: &'static str = "queue_push.lua";
    fn parse(code: i64, rest: &[Value]) -> Option<Self> {
        match (code, rest) {
            (1, [Value::Int(id)]) => u64::try_from(*id).ok().map(ItemId::new),
            _ => None,
        }
    }
}

/// `queue_take.lua`: the delivered item, or `None` when nothing is due.
impl QueueOutcome for Option<Taken> {
    const SCRIPT: &'static str = "queue_take.lua";
    fn parse(code: i64, rest: &[Value]) -> Option<Self> {
        match (code, rest) {
            (0, []) => Some(None),
            (
                1,
                [
                    Value::Int(id),
                    Value::BulkString(payload),
                    Value::Int(attempt),
                ],
            ) => Some(Some(Taken {
                id: ItemId::new(u64::try_from(*id).ok()?),
                payload: payload.clone(),
                attempt: u32::try_from(*attempt).unwrap_or(u32::MAX),
            })),
            _ => None,
        }
    }
}

/// `queue_ack.lua`, `queue_retry.lua`, `queue_extend.lua`: whether the item was still in
/// flight under the caller's receipt (and the operation happened).
impl QueueOutcome for bool {
    const SCRIPT: &'static str = "queue_ack/retry/extend.lua";
    fn parse(code: i64, rest: &[Value]) -> Option<Self> {
        match (code, rest) {
            (1, []) => Some(true),
            (0, []) => Some(false),
            _ => None,
        }
    }
}

/// `queue_counts.lua`.
impl QueueOutcome for Counts {
    const SCRIPT: &'static str = "queue_counts.lua";
    fn parse(code: i64, rest: &[Value]) -> Option<Self> {
        let count = |v: &Value| match v {
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        };
        match (code, rest) {
            (1, [ready, delayed, in_flight]) => Some(Counts {
                ready: count(ready)?,
                delayed: count(delayed)?,
                in_flight: count(in_flight)?,
            }),
            _ => None,
        }
    }
}

impl<T: QueueOutcome> FromRedisValue for QueueReply<T> {
    fn from_redis_value(v: Value) -> Result<Self, redis::ParsingError> {
        let bad = |v: &Value| ParsingError::from(format!("{} replied with {v:?}", T::SCRIPT));
        let Value::Array(items) = &v else {
            return Err(bad(&v));
        };
        let text = |v: &Value| match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        match items.as_slice() {
            [Value::Int(-1), key, found] => match (text(key), text(found)) {
                (Some(key), Some(found)) => Ok(Self::WrongType { key, found }),
                _ => Err(bad(&v)),
            },
            [Value::Int(code), rest @ ..] => {
                T::parse(*code, rest).map(Self::Done).ok_or_else(|| bad(&v))
            }
            _ => Err(bad(&v)),
        }
    }
}

pub(crate) fn queue_push(
    keys: &QueueKeys,
    payload: &[u8],
    delay: Duration,
) -> redis::ScriptInvocation<'static> {
    let mut inv = QUEUE_PUSH.prepare_invoke();
    inv.key(&keys.due)
        .key(&keys.items)
        .key(&keys.seq)
        .arg(payload)
        .arg(ttl_ms(delay));
    inv
}

pub(crate) fn queue_take(
    keys: &QueueKeys,
    visibility: Duration,
    receipt: &str,
) -> redis::ScriptInvocation<'static> {
    let mut inv = QUEUE_TAKE.prepare_invoke();
    inv.key(&keys.due)
        .key(&keys.in_flight)
        .key(&keys.items)
        .key(&keys.attempts)
        .key(&keys.receipts)
        .arg(ttl_ms(visibility))
        .arg(receipt);
    inv
}

pub(crate) fn queue_ack(
    keys: &QueueKeys,
    id: ItemId,
    receipt: &str,
) -> redis::ScriptInvocation<'static> {
    let mut inv = QUEUE_ACK.prepare_invoke();
    inv.key(&keys.in_flight)
        .key(&keys.items)
        .key(&keys.attempts)
        .key(&keys.receipts)
        .arg(id.member())
        .arg(receipt);
    inv
}

pub(crate) fn queue_retry(
    keys: &QueueKeys,
    id: ItemId,
    receipt: &str,
    delay: Duration,
) -> redis::ScriptInvocation<'static> {
    let mut inv = QUEUE_RETRY.prepare_invoke();
    inv.key(&keys.due)
        .key(&keys.in_flight)
        .key(&keys.receipts)
        .arg(id.member())
        .arg(receipt)
        .arg(ttl_ms(delay));
    inv
}

pub(crate) fn queue_extend(
    keys: &QueueKeys,
    id: ItemId,
    receipt: &str,
    visibility: Duration,
) -> redis::ScriptInvocation<'static> {
    let mut inv = QUEUE_EXTEND.prepare_invoke();
    inv.key(&keys.in_flight)
        .key(&keys.receipts)
        .arg(id.member())
        .arg(receipt)
        .arg(ttl_ms(visibility));
    inv
}

pub(crate) fn queue_counts(keys: &QueueKeys) -> redis::ScriptInvocation<'static> {
    let mut inv = QUEUE_COUNTS.prepare_invoke();
    inv.key(&keys.due).key(&keys.in_flight);
    inv
}
