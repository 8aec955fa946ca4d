//! One decoder per kind of script reply, each following the script headers, and the one
//! decoder of the wrong-type error reply every script shares.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, RedisError, Value};

use crate::error::Blocker;
use crate::token::FencingToken;

/// The error code of `types.lua`'s `wrong_type()`.
const WRONG_TYPE: &str = "FENCELOCK-WRONGTYPE";

/// The key and the type found, if `e` is a script's wrong-type reply
/// (`FENCELOCK-WRONGTYPE <found> <key>`).
pub(crate) fn wrong_type(e: &RedisError) -> Option<(String, String)> {
    if e.code() != Some(WRONG_TYPE) {
        return None;
    }
    let (found, key) = e.detail()?.split_once(' ')?;
    Some((key.to_owned(), found.to_owned()))
}

/// The error code of a semaphore acquire that names another permit count.
const PERMITS: &str = "FENCELOCK-PERMITS";

/// `semaphore/acquire.lua`'s refusal of another permit count: `(key, count, asked)`.
pub(crate) fn permits_mismatch(e: &RedisError) -> Option<(String, u32, u32)> {
    if e.code() != Some(PERMITS) {
        return None;
    }
    let mut words = e.detail()?.splitn(3, ' ');
    let count = words.next()?.parse().ok()?;
    let asked = words.next()?.parse().ok()?;
    Some((words.next()?.to_owned(), count, asked))
}

/// Who a node said it is, when asked (`acquire.lua` with `ARGV[3]` "1").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Random for every start of a server process.
    pub run_id: String,
    /// Whole seconds.
    pub uptime: Duration,
}

/// What an acquire script answered: `acquire.lua`, `reentrant_acquire.lua`,
/// `fair_acquire.lua`, `semaphore/acquire.lua`, `rwlock/read_acquire.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireReply {
    /// What it says.
    pub answer: Answer,
    /// Present when asked for.
    pub identity: Option<Identity>,
    /// `read_acquire.lua`'s code 4: the read side was granted as one more hold of the
    /// owner's reentrant write lock (released and renewed as such).
    pub owner_hold: bool,
}

/// What one node answered to an acquire, whatever the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The lock is the caller's; `fresh` is false when the key already held its token (a
    /// retry).
    Granted {
        /// The grant's fencing token.
        fence: FencingToken,
        /// False when the key already held the token (a retry).
        fresh: bool,
    },
    /// Another holder has it, or in fair mode it is free but another waiter is first.
    Held(Refusal),
}

/// A refusal, as an acquire script says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// What stands in the way.
    pub blocked_by: Blocker,
    /// The fencing counter when it said so (`fair_acquire.lua` only): a handover with a
    /// higher token came after this answer.
    pub fence_seen: Option<FencingToken>,
    /// Which name of a multi-lock's call is held (its place in the call, from 0;
    /// `multi_acquire.lua` only).
    pub at: Option<usize>,
}

impl Refusal {
    /// A refusal by `blocked_by` that says nothing more.
    pub(crate) fn by(blocked_by: Blocker) -> Self {
        Self {
            blocked_by,
            fence_seen: None,
            at: None,
        }
    }
}

/// The first field of an acquire script's reply: what it says, as the scripts' headers
/// number it. Parsed here only (`Code::parse`); the fields after it follow from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// 0: another holder has it: its PTTL (-1: no expiry; -2, `fair_acquire.lua` only:
    /// free, another waiter first in line), and in fair mode the fencing counter.
    Held,
    /// 1: acquired now: the new fencing token.
    Granted,
    /// 2: the key already held this token (a retry whose first reply was lost): the
    /// same grant, and its fencing token.
    Regranted,
    /// 3: a semaphore's permits are all held: ms until the first lease ends, and the
    /// permit count.
    PermitsTaken,
    /// 4: `read_acquire.lua`: the read side granted as one more hold of the owner's
    /// reentrant write lock, and its fencing token.
    OwnerHold,
    /// 5: a reader finds writers waiting: ms until the first deadline or lease ends, and
    /// how many.
    WritersWaiting,
    /// 6: a writer finds readers: ms until the first of their leases ends, and how many.
    Readers,
    /// 7: `multi_acquire.lua`: a name is held by another holder: its PTTL (-1: no
    /// expiry), and the name's place in the call, from 1.
    NameHeld,
}

impl Code {
    /// The code a reply's first field says; `None` for a number no script answers.
    pub(crate) fn parse(code: i64) -> Option<Self> {
        Some(match code {
            0 => Self::Held,
            1 => Self::Granted,
            2 => Self::Regranted,
            3 => Self::PermitsTaken,
            4 => Self::OwnerHold,
            5 => Self::WritersWaiting,
            6 => Self::Readers,
            7 => Self::NameHeld,
            _ => return None,
        })
    }
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let items = match &v {
            Value::Array(items) => items,
            // A fast path's grant (take.lua, fair_acquire.lua, read_acquire.lua,
            // semaphore/acquire.lua): the new fencing token alone.
            Value::Int(fence) if *fence > 0 => {
                return Ok(Self {
                    answer: Answer::Granted {
                        fence: FencingToken::new(fence.unsigned_abs()),
                        fresh: true,
                    },
                    identity: None,
                    owner_hold: false,
                });
            }
            _ => return Err(Fields(&[], &v).bad()),
        };
        let fields = Fields(items, &v);
        let code = Code::parse(fields.int(0)?).ok_or_else(|| fields.bad())?;
        let (answer, used) = fields.answer(code)?;
        // What the node said about itself, when asked, comes after the code's fields.
        let identity = match &items[used.min(items.len())..] {
            [] => None,
            [Value::BulkString(id), Value::Int(up)] => Some(Identity {
                run_id: String::from_utf8_lossy(id).into_owned(),
                uptime: Duration::from_secs(u64::try_from(*up).unwrap_or(0)),
            })
            .filter(|i| !i.run_id.is_empty()),
            _ => return Err(fields.bad()),
        };
        Ok(Self {
            answer,
            identity,
            owner_hold: code == Code::OwnerHold,
        })
    }
}

/// An acquire script's reply array (and the whole reply, for the error).
struct Fields<'a>(&'a [Value], &'a Value);

impl Fields<'_> {
    fn bad(&self) -> ParsingError {
        ParsingError::from(format!("an acquire script replied with {:?}", self.1))
    }

    fn int(&self, i: usize) -> Result<i64, ParsingError> {
        match self.0.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            _ => Err(self.bad()),
        }
    }

    fn unsigned(&self, i: usize) -> Result<u64, ParsingError> {
        u64::try_from(self.int(i)?).map_err(|_| self.bad())
    }

    fn ms(&self, i: usize) -> Result<Duration, ParsingError> {
        self.unsigned(i).map(Duration::from_millis)
    }

    fn count(&self, i: usize) -> Result<u32, ParsingError> {
        u32::try_from(self.int(i)?).map_err(|_| self.bad())
    }

    /// A holder's PTTL as what blocks: -1 no expiry; -2 (`fair_acquire.lua` only) free,
    /// another waiter first in line.
    fn lease(&self, i: usize) -> Result<Blocker, ParsingError> {
        Ok(match self.int(i)? {
            -2 => Blocker::Queue,
            -1 => Blocker::NoExpiry,
            _ => Blocker::Lease(self.ms(i)?),
        })
    }

    /// The answer the fields after `code` give, and how many fields it took (the code
    /// included).
    fn answer(&self, code: Code) -> Result<(Answer, usize), ParsingError> {
        let held = |blocked_by| Answer::Held(Refusal::by(blocked_by));
        Ok(match code {
            Code::Granted | Code::Regranted | Code::OwnerHold => {
                let fence = FencingToken::new(self.unsigned(1)?);
                let fresh = code != Code::Regranted;
                (Answer::Granted { fence, fresh }, 2)
            }
            // A fair refusal says the fencing counter too (and never who the node is).
            Code::Held => match self.0 {
                [_, _, Value::Int(_)] => {
                    let answer = Answer::Held(Refusal {
                        fence_seen: Some(FencingToken::new(self.unsigned(2)?)),
                        ..Refusal::by(self.lease(1)?)
                    });
                    (answer, 3)
                }
                _ => (held(self.lease(1)?), 2),
            },
            Code::NameHeld => {
                let blocked_by = match self.lease(1)? {
                    Blocker::Queue => return Err(self.bad()),
                    other => other,
                };
                let at = usize::try_from(self.int(2)?)
                    .ok()
                    .and_then(|i| i.checked_sub(1))
                    .ok_or_else(|| self.bad())?;
                let answer = Answer::Held(Refusal {
                    at: Some(at),
                    ..Refusal::by(blocked_by)
                });
                (answer, 3)
            }
            Code::PermitsTaken => {
                let blocked_by = Blocker::Permits {
                    permits: self.count(2)?,
                    frees_in: self.ms(1)?,
                };
                (held(blocked_by), 3)
            }
            Code::WritersWaiting => {
                let blocked_by = Blocker::WritersWaiting {
                    writers: self.count(2)?,
                    within: self.ms(1)?,
                };
                (held(blocked_by), 3)
            }
            Code::Readers => {
                let blocked_by = Blocker::Readers {
                    readers: self.count(2)?,
                    frees_in: self.ms(1)?,
                };
                (held(blocked_by), 3)
            }
        })
    }
}

/// What a release script answered, and what `renew.lua` answered for each lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// The key held the caller and the operation happened.
    Done,
    /// The key was absent.
    Absent,
    /// Another holder has the key (or data fencelock did not write, for `renew.lua`).
    Other,
}

impl Owned {
    fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(Self::Done),
            0 => Some(Self::Absent),
            -1 => Some(Self::Other),
            _ => None,
        }
    }
}

impl FromRedisValue for Owned {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(code) => Self::from_code(code),
            _ => None,
        }
        .ok_or_else(|| ParsingError::from(format!("a release script replied with {v:?}")))
    }
}

/// `renew.lua`'s answer: one [`Owned`] per lease, in the order sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewed(pub Vec<Owned>);

impl FromRedisValue for Renewed {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let bad = || ParsingError::from(format!("renew.lua replied with {v:?}"));
        let Value::Array(items) = &v else {
            return Err(bad());
        };
        items
            .iter()
            .map(|item| match item {
                Value::Int(code) => Owned::from_code(*code).ok_or_else(bad),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

/// `lock/inspect.lua`'s answer, as its header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inspected {
    /// "none", "plain", "reentrant", "semaphore", "readers", or a foreign Redis type.
    pub kind: String,
    pub pttl: i64,
    pub holds: u64,
    pub owner: String,
    /// The counter as text; empty if absent or not a counter.
    pub counter: String,
    pub info: String,
    /// Fair waiters in queue order: ms left before each is purged (-1: no deadline).
    pub waiters: Vec<i64>,
    /// A semaphore's permit count (0: none stored).
    pub permits: u64,
    /// A semaphore's held permits, or a read-write lock's readers: ms left of each
    /// lease, soonest first.
    pub permit_leases: Vec<i64>,
    /// A read-write lock's writers waiting for its readers.
    pub writers: u64,
    /// What each of `waiters` said about itself ("": nothing).
    pub waiter_info: Vec<String>,
    /// The wake list: each listed client's tag and the ms since it was listed.
    pub listed: Vec<(String, i64)>,
}

/// `semaphore/resize.lua`'s answer: the count before (0: none), the permits held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resized {
    pub previous: u64,
    pub held: u64,
}

impl FromRedisValue for Resized {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(previous), Value::Int(held)] => Ok(Self {
                    previous: u64::try_from(*previous).unwrap_or(0),
                    held: u64::try_from(*held).unwrap_or(0),
                }),
                _ => Err(format!("resize.lua replied with {items:?}").into()),
            },
            other => Err(format!("resize.lua replied with {other:?}").into()),
        }
    }
}

/// `lock/break.lua`'s answer, as its header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Broke {
    /// "none", "plain", "reentrant", "semaphore" or "readers".
    pub kind: String,
    pub owner: String,
    pub pttl: i64,
    /// The counter after the break, as text (empty: free and no counter).
    pub counter: String,
    /// A semaphore's broken permits, or readers: ms left of each lease, soonest first.
    pub permit_leases: Vec<i64>,
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Every item an integer.
fn ints(items: &[Value]) -> Option<Vec<i64>> {
    items
        .iter()
        .map(|x| match x {
            Value::Int(n) => Some(*n),
            _ => None,
        })
        .collect()
}

impl FromRedisValue for Inspected {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let bad = || ParsingError::from(format!("inspect.lua replied with {v:?}"));
        let Value::Array(items) = &v else {
            return Err(bad());
        };
        match items.as_slice() {
            [
                kind,
                Value::Int(pttl),
                Value::Int(holds),
                owner,
                counter,
                info,
                Value::Array(w),
                Value::Int(permits),
                Value::Array(leases),
                Value::Int(writers),
                Value::Array(waiter_info),
                Value::Array(listed),
            ] => Ok(Self {
                kind: text(kind).ok_or_else(bad)?,
                pttl: *pttl,
                holds: u64::try_from(*holds).unwrap_or(0),
                owner: text(owner).ok_or_else(bad)?,
                counter: text(counter).ok_or_else(bad)?,
                info: text(info).ok_or_else(bad)?,
                waiters: ints(w).ok_or_else(bad)?,
                permits: u64::try_from(*permits).unwrap_or(0),
                permit_leases: ints(leases).ok_or_else(bad)?,
                writers: u64::try_from(*writers).unwrap_or(0),
                waiter_info: waiter_info
                    .iter()
                    .map(text)
                    .collect::<Option<_>>()
                    .ok_or_else(bad)?,
                listed: listed
                    .chunks(2)
                    .map(|pair| match pair {
                        [tag, Value::Int(ms)] => Some((text(tag)?, *ms)),
                        _ => None,
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(bad)?,
            }),
            _ => Err(bad()),
        }
    }
}

impl FromRedisValue for Broke {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let bad = || ParsingError::from(format!("break.lua replied with {v:?}"));
        let Value::Array(items) = &v else {
            return Err(bad());
        };
        let (kind, owner, pttl, counter, leases) = match items.as_slice() {
            [kind, owner, Value::Int(pttl), counter] => (kind, owner, pttl, counter, &[][..]),
            [kind, owner, Value::Int(pttl), counter, Value::Array(leases)] => {
                (kind, owner, pttl, counter, leases.as_slice())
            }
            _ => return Err(bad()),
        };
        Ok(Self {
            kind: text(kind).ok_or_else(bad)?,
            owner: text(owner).ok_or_else(bad)?,
            pttl: *pttl,
            counter: text(counter).ok_or_else(bad)?,
            permit_leases: ints(leases).ok_or_else(bad)?,
        })
    }
}

/// What one write of a [`FencedWrite`](crate::fence::FencedWrite) replied, as Redis
/// would have.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// `SET`'s `OK`.
    Ok,
    /// An integer: `DEL`'s count of keys deleted, the value after `INCRBY`, the field
    /// count `HSET` added, the list's length after `RPUSH` or `LPUSH`, `PEXPIRE`'s 1
    /// (set) or 0 (no such key).
    Integer(i64),
    /// Text: the ID `XADD` gave the new entry.
    Text(String),
}

/// What `fence/write.lua` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FencedWriteReply {
    /// Every write applied, the token recorded: each write's reply, in order.
    Accepted(Vec<Reply>),
    /// A higher token was accepted before: nothing written.
    Refused(FencingToken),
}

impl FromRedisValue for FencedWriteReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let bad = || ParsingError::from(format!("fence/write.lua replied with {v:?}"));
        let Value::Array(items) = &v else {
            return Err(bad());
        };
        match items.as_slice() {
            [Value::Int(0), highest] => text(highest)
                .and_then(|t| t.parse().ok())
                .map(|t| Self::Refused(FencingToken::new(t)))
                .ok_or_else(bad),
            [Value::Int(1), replies @ ..] => replies
                .iter()
                .map(|r| match r {
                    Value::Okay => Some(Reply::Ok),
                    Value::Int(n) => Some(Reply::Integer(*n)),
                    Value::SimpleString(s) if s == "OK" => Some(Reply::Ok),
                    other => text(other).map(Reply::Text),
                })
                .collect::<Option<_>>()
                .map(Self::Accepted)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

/// An item `queue/take.lua` delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taken {
    pub id: u64,
    pub payload: Vec<u8>,
    pub attempt: u32,
}

/// The counts `queue/counts.lua` replies with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub ready: u64,
    pub delayed: u64,
    pub in_flight: u64,
}

/// `queue/push.lua`'s answer: the new item's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pushed(pub u64);

/// The reply of one queue script: `{code, ...}` as its header says.
pub(crate) trait QueueOutcome: Sized {
    /// The script's file, for parse errors.
    const SCRIPT: &'static str;
    /// `None` when the reply does not fit the script's header.
    fn parse(code: i64, rest: &[Value]) -> Option<Self>;
}

impl QueueOutcome for Pushed {
    const SCRIPT: &'static str = "queue/push.lua";
    fn parse(code: i64, rest: &[Value]) -> Option<Self> {
        match (code, rest) {
            (1, [Value::Int(id)]) => u64::try_from(*id).ok().map(Self),
            _ => None,
        }
    }
}

/// `queue/take.lua`: the delivered item, or `None` when nothing is due.
impl QueueOutcome for Option<Taken> {
    const SCRIPT: &'static str = "queue/take.lua";
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
                id: u64::try_from(*id).ok()?,
                payload: payload.clone(),
                attempt: u32::try_from(*attempt).unwrap_or(u32::MAX),
            })),
            _ => None,
        }
    }
}

/// `queue/ack.lua`, `queue/retry.lua`, `queue/extend.lua`: whether the item was still in
/// flight under the caller's receipt (and the operation happened).
impl QueueOutcome for bool {
    const SCRIPT: &'static str = "queue/ack, retry or extend.lua";
    fn parse(code: i64, rest: &[Value]) -> Option<Self> {
        match (code, rest) {
            (1, []) => Some(true),
            (0, []) => Some(false),
            _ => None,
        }
    }
}

impl QueueOutcome for Counts {
    const SCRIPT: &'static str = "queue/counts.lua";
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

/// A queue script's reply, decoded by its [`QueueOutcome`].
pub(crate) struct Queue<T>(pub T);

impl<T: QueueOutcome> FromRedisValue for Queue<T> {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let parsed = match &v {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(code), rest @ ..] => T::parse(*code, rest),
                _ => None,
            },
            _ => None,
        };
        parsed
            .map(Self)
            .ok_or_else(|| ParsingError::from(format!("{} replied with {v:?}", T::SCRIPT)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode<T: FromRedisValue>(v: Value) -> Result<T, ParsingError> {
        T::from_redis_value(v)
    }

    /// An acquire script's reply, as the node sends it.
    fn acquire(items: Vec<Value>) -> Result<AcquireReply, ParsingError> {
        decode::<AcquireReply>(Value::Array(items))
    }

    /// What `items` answer, decoded.
    fn answer(items: &[i64]) -> Answer {
        acquire(items.iter().map(|i| Value::Int(*i)).collect())
            .unwrap()
            .answer
    }

    #[test]
    fn every_code_is_named_and_no_other_number() {
        for (code, number) in [
            (Code::Held, 0),
            (Code::Granted, 1),
            (Code::Regranted, 2),
            (Code::PermitsTaken, 3),
            (Code::OwnerHold, 4),
            (Code::WritersWaiting, 5),
            (Code::Readers, 6),
            (Code::NameHeld, 7),
        ] {
            assert_eq!(Code::parse(number), Some(code));
        }
        assert!(
            acquire(vec![Value::Int(8), Value::Int(1)]).is_err(),
            "no script says 8"
        );
    }

    #[test]
    fn refusals_decode_as_their_headers_say() {
        let held = |pttl| answer(&[0, pttl]);
        let lease = |ms| Answer::Held(Refusal::by(Blocker::Lease(Duration::from_millis(ms))));
        assert_eq!(
            held(0),
            lease(0),
            "a lease ending now is a lease, not a queue"
        );
        assert_eq!(held(-2), Answer::Held(Refusal::by(Blocker::Queue)));
        assert_eq!(held(-1), Answer::Held(Refusal::by(Blocker::NoExpiry)));
        let fair = Answer::Held(Refusal {
            fence_seen: Some(FencingToken::new(42)),
            ..Refusal::by(Blocker::Queue)
        });
        assert_eq!(
            answer(&[0, -2, 42]),
            fair,
            "fair_acquire.lua says the counter"
        );
        let multi = Answer::Held(Refusal {
            at: Some(1),
            ..Refusal::by(Blocker::Lease(Duration::from_millis(1500)))
        });
        assert_eq!(
            answer(&[7, 1500, 2]),
            multi,
            "the held name's place, from 1"
        );
        assert!(acquire(vec![Value::Int(7), Value::Int(10), Value::Int(0)]).is_err());
        let readers = Blocker::Readers {
            readers: 3,
            frees_in: Duration::from_millis(250),
        };
        assert_eq!(answer(&[6, 250, 3]), Answer::Held(Refusal::by(readers)));
        assert!(
            acquire(vec![Value::Int(5), Value::Int(1)]).is_err(),
            "no count"
        );
    }

    #[test]
    fn grants_decode_with_the_nodes_identity_when_asked() {
        let with_id = acquire(vec![
            Value::Int(2),
            Value::Int(7),
            Value::BulkString(b"abc".to_vec()),
            Value::Int(42),
        ])
        .unwrap();
        let regranted = Answer::Granted {
            fence: FencingToken::new(7),
            fresh: false,
        };
        assert_eq!(with_id.answer, regranted);
        let identity = Identity {
            run_id: "abc".into(),
            uptime: Duration::from_secs(42),
        };
        assert_eq!(with_id.identity, Some(identity));
        assert!(
            acquire(vec![Value::Int(4), Value::Int(9)])
                .unwrap()
                .owner_hold
        );
        assert!(acquire(vec![Value::Int(1)]).is_err());
        assert!(acquire(vec![Value::Int(1), Value::Int(-3)]).is_err());
    }

    #[test]
    fn owned_renewed_left_and_queue_replies_decode() {
        assert_eq!(decode::<Owned>(Value::Int(-1)).unwrap(), Owned::Other);
        assert!(decode::<Owned>(Value::Int(-2)).is_err());
        let batch = Value::Array(vec![Value::Int(1), Value::Int(0), Value::Int(-1)]);
        assert_eq!(
            decode::<Renewed>(batch).unwrap(),
            Renewed(vec![Owned::Done, Owned::Absent, Owned::Other])
        );
        let pushed = Value::Array(vec![Value::Int(1), Value::Int(9)]);
        assert_eq!(decode::<Queue<Pushed>>(pushed).unwrap().0, Pushed(9));
        let none = Value::Array(vec![Value::Int(0)]);
        assert_eq!(decode::<Queue<Option<Taken>>>(none).unwrap().0, None);
        assert!(decode::<Queue<bool>>(Value::Array(vec![Value::Int(-1)])).is_err());
    }
}
