//! The Lua scripts, each in its own `.lua` file whose header states KEYS, ARGV and the
//! reply, and typed wrappers that turn their replies into Rust values.
//!
//! Scripts run through [`redis::Script`], which sends `EVALSHA` and falls back to loading
//! the script when the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use crate::keys::LockKeys;
use crate::token::{FencingToken, OwnerToken};

static ACQUIRE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/acquire.lua")));
static RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/release.lua")));
static EXTEND: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/extend.lua")));

/// What `acquire.lua` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The lock is ours; `fresh` is false when it already held our token (a retry).
    Acquired { fence: FencingToken, fresh: bool },
    /// Another owner holds it; `None` when the key has no expiry.
    Held { remaining: Option<Duration> },
    /// `key` holds a `found` fencelock did not write.
    WrongType { key: String, found: String },
}

/// What `release.lua` and `extend.lua` found.
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
    token: &OwnerToken,
    ttl: Duration,
) -> redis::ScriptInvocation<'static> {
    let mut inv = ACQUIRE.prepare_invoke();
    inv.key(&keys.lock)
        .key(&keys.fence)
        .arg(token.as_str())
        .arg(ttl_ms(ttl));
    inv
}

pub(crate) fn release(keys: &LockKeys, token: &OwnerToken) -> redis::ScriptInvocation<'static> {
    let mut inv = RELEASE.prepare_invoke();
    inv.key(&keys.lock).arg(token.as_str());
    inv
}

pub(crate) fn extend(
    keys: &LockKeys,
    token: &OwnerToken,
    ttl: Duration,
) -> redis::ScriptInvocation<'static> {
    let mut inv = EXTEND.prepare_invoke();
    inv.key(&keys.lock).arg(token.as_str()).arg(ttl_ms(ttl));
    inv
}

/// TTLs are validated to whole milliseconds >= 1 before they get here.
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
                let pttl = int(1)?;
                Ok(Self::Held {
                    remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
                })
            }
            -1 => Ok(Self::WrongType {
                key: text(1)?,
                found: text(2)?,
            }),
            _ => Err(bad()),
        }
    }
}

impl FromRedisValue for OwnedReply {
    fn from_redis_value(v: Value) -> Result<Self, redis::ParsingError> {
        match v {
            Value::Int(1) => Ok(Self::Done),
            Value::Int(0) => Ok(Self::Absent),
            Value::Int(-1) => Ok(Self::Other),
            Value::Int(-2) => Ok(Self::WrongType),
            other => Err(ParsingError::from(format!(
                "release/extend script replied with an unexpected value: {other:?}"
            ))),
        }
    }
}
