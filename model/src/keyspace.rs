//! One Redis server's data in memory: the commands fencelock's scripts send, with
//! Redis's replies and errors (Redis 7.0's wording), expiry by the server's own
//! logical clock.
//!
//! Only what the scripts use is here (and what the differential test reads the state
//! with): strings (`GET`, `SET` with `NX`/`XX`/`GET`/`EX`/`PX`/`EXAT`/`PXAT`/`KEEPTTL`,
//! `INCR`, `INCRBY`), keys (`DEL`, `EXISTS`, `TYPE`, `PEXPIRE`, `PEXPIREAT`, `PTTL`),
//! hashes, sorted sets, lists, a stream's `XADD`, `TIME`, `INFO`'s run id and uptime,
//! and `PUBLISH`/`SPUBLISH`, whose messages are recorded for the world to deliver.
//! Expired keys are removed when the clock moves ([`Server::advance_us`]), so two
//! servers with the same live data are equal values (the checker's states hash them).
//! Redis expires a key once its clock is past the key's end (`now > end`): at the end's
//! own millisecond the key still lives, with `PTTL` 0.

use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;

pub use testkit::Reply;

/// A key, a value, a member: Redis strings are bytes.
pub type Bytes = Vec<u8>;

/// What one key holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// A string.
    Str(Bytes),
    /// A hash: field -> value.
    Hash(BTreeMap<Bytes, Bytes>),
    /// A sorted set: member -> score.
    ZSet(BTreeMap<Bytes, Score>),
    /// A list.
    List(VecDeque<Bytes>),
    /// A stream: its entries (id, fields) and the last id handed out.
    Stream(Vec<(StreamId, Vec<(Bytes, Bytes)>)>, StreamId),
}

/// Picks a collection of one kind out of a value (`None`: another kind).
macro_rules! pickers {
    ($($variant:ident: $by_ref:ident, $by_mut:ident -> $t:ty;)*) => {
        impl Value {
            $(
                /// The collection, if the value is of this kind.
                pub fn $by_ref(&self) -> Option<&$t> {
                    if let Value::$variant(c) = self { Some(c) } else { None }
                }
                /// The collection, if the value is of this kind, for a write.
                pub fn $by_mut(&mut self) -> Option<&mut $t> {
                    if let Value::$variant(c) = self { Some(c) } else { None }
                }
            )*
        }
    };
}

pickers! {
    Hash: as_hash, as_hash_mut -> BTreeMap<Bytes, Bytes>;
    ZSet: as_zset, as_zset_mut -> BTreeMap<Bytes, Score>;
    List: as_list, as_list_mut -> VecDeque<Bytes>;
}

impl Value {
    /// The name `TYPE` answers.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Hash(_) => "hash",
            Value::ZSet(_) => "zset",
            Value::List(_) => "list",
            Value::Stream(..) => "stream",
        }
    }
}

/// A stream entry's id: ms and sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u64, pub u64);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// A sorted set's score: a double (never NaN), equal and hashed by its bits.
#[derive(Clone, Copy, Debug)]
pub struct Score(pub f64);

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0) == Ordering::Equal
    }
}
impl Eq for Score {}
impl std::hash::Hash for Score {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// A key's value and when it expires (server ms since the epoch), if it does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The value.
    pub value: Value,
    /// The end of its life: the key is gone once the clock is past it.
    pub expires_ms: Option<i64>,
}

/// A message a `PUBLISH` or `SPUBLISH` sent.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Published {
    /// The channel.
    pub channel: Bytes,
    /// The message.
    pub message: Bytes,
    /// `SPUBLISH` (a shard channel) rather than `PUBLISH`.
    pub sharded: bool,
}

/// One Redis server: its keys, its clock, who it is, its subscribers, and the messages
/// its scripts published since the world last collected them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Server {
    keys: BTreeMap<Bytes, Entry>,
    now_us: i64,
    /// `INFO`'s `run_id`: 40 hex digits, new at every start.
    pub run_id: String,
    /// When the server started (server µs), for `INFO`'s `uptime_in_seconds`.
    pub started_us: i64,
    /// How many connections listen on each classic channel (`PUBLISH`'s answer).
    pub subscribers: BTreeMap<Bytes, i64>,
    /// How many connections listen on each shard channel (`SPUBLISH`'s answer).
    pub shard_subscribers: BTreeMap<Bytes, i64>,
    /// Messages published and not yet collected ([`Server::take_published`]).
    pub published: Vec<Published>,
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const NOT_FLOAT: &str = "ERR value is not a valid float";
const RANGE_NOT_FLOAT: &str = "ERR min or max is not a float";
const SYNTAX: &str = "ERR syntax error";

fn err(message: impl Into<String>) -> Reply {
    Reply::Error(message.into())
}

fn arity(command: &str) -> Reply {
    err(format!(
        "ERR wrong number of arguments for '{}' command",
        command.to_ascii_lowercase()
    ))
}

fn bulk(b: impl Into<Bytes>) -> Reply {
    Reply::Bulk(Some(b.into()))
}

const NIL: Reply = Reply::Bulk(None);

fn ok() -> Reply {
    Reply::Status("OK".into())
}

fn array(items: Vec<Reply>) -> Reply {
    Reply::Array(Some(items))
}

/// Redis's `string2ll`: a canonical decimal integer (no sign but `-`, no leading zero,
/// no space) that fits 64 bits.
pub fn parse_int(b: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(b).ok()?;
    let digits = text.strip_prefix('-').unwrap_or(text);
    let canonical = text == "0"
        || (!digits.is_empty()
            && digits.as_bytes()[0] != b'0'
            && digits.bytes().all(|c| c.is_ascii_digit()));
    if canonical { text.parse().ok() } else { None }
}

/// Redis's `string2d` (strtod over the whole text): no leading or trailing space, no
/// NaN, no overflow to infinity of a finite spelling.
pub fn parse_float(b: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(b).ok()?;
    let spaced = |c: Option<char>| c.is_some_and(|c| c.is_ascii_whitespace());
    if text.is_empty() || spaced(text.chars().next()) || spaced(text.chars().last()) {
        return None;
    }
    // strtod takes hex floats, which Rust does not: Redis accepts them, the model not.
    let value: f64 = text.parse().ok()?;
    let spelled_infinite = text.trim_start_matches(['+', '-']).to_ascii_lowercase();
    let infinite_word = spelled_infinite == "inf" || spelled_infinite == "infinity";
    if value.is_nan() || (value.is_infinite() && !infinite_word) {
        return None;
    }
    Some(value)
}

/// A double as Redis writes it in a reply and as a script's number argument becomes a
/// string: C's `%.17g` (`inf`, `-inf` for the infinities).
pub fn format_double(x: f64) -> String {
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    if x.is_nan() {
        return "nan".into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // The exponent after rounding to 17 significant digits decides the form.
    let sci = format!("{x:.16e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    if (-4..17).contains(&exp) {
        let decimals = usize::try_from(16 - exp).expect("non-negative");
        strip_zeros(format!("{x:.decimals$}"))
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!(
            "{}e{sign}{:02}",
            strip_zeros(mantissa.to_owned()),
            exp.abs()
        )
    }
}

fn strip_zeros(s: String) -> String {
    if !s.contains('.') {
        return s;
    }
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// One end of a score range (`ZRANGEBYSCORE`, `ZCOUNT`, `ZREMRANGEBYSCORE`).
#[derive(Clone, Copy)]
struct Bound {
    value: f64,
    exclusive: bool,
}

impl Bound {
    fn parse(b: &[u8]) -> Option<Bound> {
        let (exclusive, rest) = match b.first() {
            Some(b'(') => (true, &b[1..]),
            _ => (false, b),
        };
        // zslParseRange: strtod over the rest, NaN refused.
        let value = parse_float(rest)?;
        Some(Bound { value, exclusive })
    }

    fn below(self, score: f64) -> bool {
        if self.exclusive {
            self.value < score
        } else {
            self.value <= score
        }
    }

    fn above(self, score: f64) -> bool {
        if self.exclusive {
            score < self.value
        } else {
            score <= self.value
        }
    }
}

/// Clamps a `start..=stop` index pair (negative: from the end) into a length, as
/// `LRANGE` and `ZRANGE` do; `None` when empty.
fn index_range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let len = i64::try_from(len).unwrap_or(i64::MAX);
    let start = if start < 0 {
        (len + start).max(0)
    } else {
        start
    };
    let stop = if stop < 0 {
        len + stop
    } else {
        stop.min(len - 1)
    };
    if start > stop || start >= len {
        return None;
    }
    Some((usize::try_from(start).ok()?, usize::try_from(stop).ok()?))
}

impl Server {
    /// An empty server whose clock reads `now_us` (µs since the epoch), started now.
    pub fn new(now_us: i64, run_id: impl Into<String>) -> Server {
        Server {
            keys: BTreeMap::new(),
            now_us,
            run_id: run_id.into(),
            started_us: now_us,
            subscribers: BTreeMap::new(),
            shard_subscribers: BTreeMap::new(),
            published: Vec::new(),
        }
    }

    /// The server's clock, µs since the epoch.
    pub fn now_us(&self) -> i64 {
        self.now_us
    }

    /// The server's clock, ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.now_us.div_euclid(1000)
    }

    /// Moves the clock by `us` (back too: a stepped clock) and removes the keys whose
    /// end it passed.
    pub fn advance_us(&mut self, us: i64) {
        self.now_us += us;
        let now = self.now_ms();
        self.keys
            .retain(|_, entry| entry.expires_ms.is_none_or(|end| now <= end));
    }

    /// Every key, with its value and expiry, in key order.
    pub fn entries(&self) -> impl Iterator<Item = (&Bytes, &Entry)> {
        self.keys.iter()
    }

    /// A restart without persistence: every key gone, a new run id, uptime from now.
    pub fn wipe(&mut self, run_id: impl Into<String>) {
        self.keys.clear();
        self.run_id = run_id.into();
        self.started_us = self.now_us;
        self.published.clear();
    }

    /// Replaces the keys by `other`'s (a replica promoted: its data, this clock).
    pub fn replace_keys_from(&mut self, other: &Server) {
        self.keys = other.keys.clone();
        self.advance_us(0);
    }

    /// The messages published since the last call, in order.
    pub fn take_published(&mut self) -> Vec<Published> {
        std::mem::take(&mut self.published)
    }

    /// The key's entry, unless it is gone (absent, or its end passed): what a read
    /// would see, without a write (an expired key stays until a write removes it).
    pub fn entry(&self, key: &[u8]) -> Option<&Entry> {
        self.live(key)
    }

    fn live(&self, key: &[u8]) -> Option<&Entry> {
        let entry = self.keys.get(key)?;
        match entry.expires_ms {
            Some(end) if self.now_ms() > end => None,
            _ => Some(entry),
        }
    }

    fn live_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let now = self.now_ms();
        match self.keys.get(key)?.expires_ms {
            Some(end) if now > end => {
                self.keys.remove(key);
                None
            }
            _ => self.keys.get_mut(key),
        }
    }

    /// Runs one command (`args[0]` its name, any case) and answers as Redis would.
    pub fn call(&mut self, args: &[Bytes]) -> Reply {
        let Some(name) = args.first() else {
            return err("ERR empty command");
        };
        let name = String::from_utf8_lossy(name).to_ascii_uppercase();
        let a = &args[1..];
        match (name.as_str(), a.len()) {
            ("GET", 1) => self.get(&a[0]),
            ("SET", n) if n >= 2 => self.set(a),
            ("DEL", n) if n >= 1 => self.del(a),
            ("EXISTS", n) if n >= 1 => {
                let found = a.iter().filter(|k| self.live(k).is_some()).count();
                Reply::Int(i64::try_from(found).unwrap_or(i64::MAX))
            }
            ("INCR", 1) => self.incr_by(&a[0], Some(1)),
            ("INCRBY", 2) => self.incr_by(&a[0], parse_int(&a[1])),
            ("PEXPIRE", 2) => self.pexpire(&a[0], &a[1], false, "pexpire"),
            ("PEXPIREAT", 2) => self.pexpire(&a[0], &a[1], true, "pexpireat"),
            ("PTTL", 1) => self.pttl(&a[0]),
            ("TYPE", 1) => Reply::Status(
                self.live(&a[0])
                    .map_or("none", |e| e.value.type_name())
                    .into(),
            ),
            ("HGET" | "HSET" | "HDEL" | "HLEN" | "HEXISTS" | "HGETALL", _) => self.hash(&name, a),
            (
                "ZADD" | "ZREM" | "ZSCORE" | "ZCARD" | "ZRANGE" | "ZRANGEBYSCORE" | "ZCOUNT"
                | "ZREMRANGEBYSCORE",
                _,
            ) => self.zset(&name, a),
            ("RPUSH" | "LPUSH" | "LREM" | "LINDEX" | "LRANGE" | "LLEN" | "LPOS", _) => {
                self.list(&name, a)
            }
            ("XADD", n) if n >= 4 => self.xadd(a),
            ("XRANGE", 3) => self.xrange(&a[0]),
            ("TIME", 0) => array(vec![
                bulk(self.now_us.div_euclid(1_000_000).to_string()),
                bulk(self.now_us.rem_euclid(1_000_000).to_string()),
            ]),
            ("INFO", 0 | 1) => self.info(),
            ("PUBLISH", 2) => self.publish(a, false),
            ("SPUBLISH", 2) => self.publish(a, true),
            (
                "GET" | "SET" | "DEL" | "EXISTS" | "INCR" | "INCRBY" | "PEXPIRE" | "PEXPIREAT"
                | "PTTL" | "TYPE" | "XADD" | "XRANGE" | "TIME" | "INFO" | "PUBLISH" | "SPUBLISH",
                _,
            ) => arity(&name),
            _ => err(format!(
                "ERR unknown command '{}'",
                name.to_ascii_lowercase()
            )),
        }
    }

    fn get(&self, key: &[u8]) -> Reply {
        match self.live(key).map(|e| &e.value) {
            None => NIL,
            Some(Value::Str(s)) => bulk(s.clone()),
            Some(_) => err(WRONGTYPE),
        }
    }

    fn set(&mut self, a: &[Bytes]) -> Reply {
        let (key, value) = (&a[0], &a[1]);
        let (mut nx, mut xx, mut get, mut keep) = (false, false, false, false);
        // (unit in ms, the text, absolute)
        let mut expire: Option<(i64, &Bytes, bool)> = None;
        let mut i = 2;
        while i < a.len() {
            let option = String::from_utf8_lossy(&a[i]).to_ascii_uppercase();
            let next = a.get(i + 1);
            match (option.as_str(), next) {
                ("NX", _) if !xx => nx = true,
                ("XX", _) if !nx => xx = true,
                ("GET", _) => get = true,
                ("KEEPTTL", _) if expire.is_none() => keep = true,
                ("EX" | "PX" | "EXAT" | "PXAT", Some(text)) if expire.is_none() && !keep => {
                    let unit = if option.starts_with('E') { 1000 } else { 1 };
                    expire = Some((unit, text, option.ends_with("AT")));
                    i += 1;
                }
                _ => return err(SYNTAX),
            }
            i += 1;
        }
        let mut end = None;
        if let Some((unit, text, absolute)) = expire {
            let Some(n) = parse_int(text) else {
                return err(NOT_INTEGER);
            };
            let invalid = || err("ERR invalid expire time in 'set' command");
            if n <= 0 || n > i64::MAX / unit {
                return invalid();
            }
            let ms = n * unit;
            let at = if absolute {
                Some(ms)
            } else {
                self.now_ms().checked_add(ms)
            };
            match at {
                Some(at) => end = Some(at),
                None => return invalid(),
            }
        }
        let old = match self.live(key) {
            None => None,
            Some(Entry {
                value: Value::Str(s),
                ..
            }) => Some(s.clone()),
            Some(_) if get => return err(WRONGTYPE),
            Some(_) => Some(Bytes::new()),
        };
        let answer = |done: bool| match (get, done) {
            (true, _) => old.clone().map_or(NIL, bulk),
            (false, true) => ok(),
            (false, false) => NIL,
        };
        let exists = self.live(key).is_some();
        if (nx && exists) || (xx && !exists) {
            return answer(false);
        }
        let ttl = if keep {
            self.live(key).and_then(|e| e.expires_ms)
        } else {
            end
        };
        self.keys.insert(
            key.clone(),
            Entry {
                value: Value::Str(value.clone()),
                expires_ms: ttl,
            },
        );
        // An end already past (EXAT/PXAT in the past) deletes the key at once.
        self.advance_us(0);
        answer(true)
    }

    fn del(&mut self, keys: &[Bytes]) -> Reply {
        let mut n = 0;
        for key in keys {
            if self.live_mut(key).is_some() {
                self.keys.remove(key);
                n += 1;
            }
        }
        Reply::Int(n)
    }

    fn incr_by(&mut self, key: &[u8], by: Option<i64>) -> Reply {
        let Some(by) = by else {
            return err(NOT_INTEGER);
        };
        let (current, end) = match self.live(key) {
            None => (0, None),
            Some(Entry {
                value: Value::Str(s),
                expires_ms,
            }) => match parse_int(s) {
                Some(n) => (n, *expires_ms),
                None => return err(NOT_INTEGER),
            },
            Some(_) => return err(WRONGTYPE),
        };
        let Some(new) = current.checked_add(by) else {
            return err("ERR increment or decrement would overflow");
        };
        self.keys.insert(
            key.to_vec(),
            Entry {
                value: Value::Str(new.to_string().into_bytes()),
                expires_ms: end,
            },
        );
        Reply::Int(new)
    }

    fn pexpire(&mut self, key: &[u8], ms: &[u8], absolute: bool, command: &str) -> Reply {
        let Some(n) = parse_int(ms) else {
            return err(NOT_INTEGER);
        };
        let at = if absolute {
            Some(n)
        } else {
            self.now_ms().checked_add(n)
        };
        let Some(at) = at else {
            return err(format!("ERR invalid expire time in '{command}' command"));
        };
        let now = self.now_ms();
        let Some(entry) = self.live_mut(key) else {
            return Reply::Int(0);
        };
        if at <= now {
            self.keys.remove(key);
        } else {
            entry.expires_ms = Some(at);
        }
        Reply::Int(1)
    }

    fn pttl(&self, key: &[u8]) -> Reply {
        match self.live(key) {
            None => Reply::Int(-2),
            Some(Entry {
                expires_ms: None, ..
            }) => Reply::Int(-1),
            Some(Entry {
                expires_ms: Some(end),
                ..
            }) => Reply::Int((end - self.now_ms()).max(0)),
        }
    }

    /// The value at `key` if it is of the wanted kind (`Ok(None)`: absent), or the
    /// WRONGTYPE error.
    fn typed<T>(
        &self,
        key: &[u8],
        pick: impl Fn(&Value) -> Option<&T>,
    ) -> Result<Option<&T>, Reply> {
        match self.live(key) {
            None => Ok(None),
            Some(e) => pick(&e.value).map(Some).ok_or_else(|| err(WRONGTYPE)),
        }
    }

    /// The value at `key` for a write: created by `new` when absent; WRONGTYPE if of
    /// another kind (nothing created then).
    fn typed_mut<T>(
        &mut self,
        key: &[u8],
        new: impl Fn() -> Value,
        pick: impl Fn(&mut Value) -> Option<&mut T>,
    ) -> Result<&mut T, Reply> {
        if self.live_mut(key).is_none() {
            self.keys.insert(
                key.to_vec(),
                Entry {
                    value: new(),
                    expires_ms: None,
                },
            );
        }
        let entry = self.keys.get_mut(key).expect("present");
        pick(&mut entry.value).ok_or_else(|| err(WRONGTYPE))
    }

    /// Removes `key` if its collection became empty (Redis never keeps an empty one).
    fn drop_if_empty(&mut self, key: &[u8]) {
        let empty = match self.keys.get(key).map(|e| &e.value) {
            Some(Value::Hash(h)) => h.is_empty(),
            Some(Value::ZSet(z)) => z.is_empty(),
            Some(Value::List(l)) => l.is_empty(),
            _ => false,
        };
        if empty {
            self.keys.remove(key);
        }
    }

    fn hash(&mut self, name: &str, a: &[Bytes]) -> Reply {
        match (name, a.len()) {
            ("HGET", 2) => match self.typed(&a[0], Value::as_hash) {
                Err(e) => e,
                Ok(h) => h.and_then(|h| h.get(&a[1])).cloned().map_or(NIL, bulk),
            },
            ("HLEN", 1) => match self.typed(&a[0], Value::as_hash) {
                Err(e) => e,
                Ok(h) => Reply::Int(h.map_or(0, |h| h.len() as i64)),
            },
            ("HEXISTS", 2) => match self.typed(&a[0], Value::as_hash) {
                Err(e) => e,
                Ok(h) => Reply::Int(i64::from(h.is_some_and(|h| h.contains_key(&a[1])))),
            },
            ("HGETALL", 1) => match self.typed(&a[0], Value::as_hash) {
                Err(e) => e,
                Ok(h) => array(
                    h.into_iter()
                        .flatten()
                        .flat_map(|(f, v)| [bulk(f.clone()), bulk(v.clone())])
                        .collect(),
                ),
            },
            ("HSET", n) if n >= 3 && n % 2 == 1 => {
                match self.typed_mut(&a[0], || Value::Hash(BTreeMap::new()), Value::as_hash_mut) {
                    Err(e) => e,
                    Ok(h) => {
                        let added = a[1..]
                            .chunks(2)
                            .filter(|fv| h.insert(fv[0].clone(), fv[1].clone()).is_none())
                            .count();
                        Reply::Int(added as i64)
                    }
                }
            }
            ("HDEL", n) if n >= 2 => {
                let removed = match self.live_mut(&a[0]).map(|e| &mut e.value) {
                    None => 0,
                    Some(Value::Hash(h)) => {
                        a[1..].iter().filter(|f| h.remove(*f).is_some()).count()
                    }
                    Some(_) => return err(WRONGTYPE),
                };
                self.drop_if_empty(&a[0]);
                Reply::Int(removed as i64)
            }
            _ => arity(name),
        }
    }

    fn zset(&mut self, name: &str, a: &[Bytes]) -> Reply {
        let min_args = match name {
            "ZADD" => 3,
            "ZREM" | "ZSCORE" => 2,
            "ZCARD" => 1,
            _ => 3,
        };
        if a.len() < min_args
            || (matches!(name, "ZSCORE" | "ZCOUNT" | "ZREMRANGEBYSCORE") && a.len() != min_args)
            || (name == "ZCARD" && a.len() != 1)
        {
            return arity(name);
        }
        match name {
            "ZADD" => self.zadd(a),
            "ZREM" => {
                let removed = match self.live_mut(&a[0]).map(|e| &mut e.value) {
                    None => 0,
                    Some(Value::ZSet(z)) => {
                        a[1..].iter().filter(|m| z.remove(*m).is_some()).count()
                    }
                    Some(_) => return err(WRONGTYPE),
                };
                self.drop_if_empty(&a[0]);
                Reply::Int(removed as i64)
            }
            "ZSCORE" => match self.typed(&a[0], Value::as_zset) {
                Err(e) => e,
                Ok(z) => z
                    .and_then(|z| z.get(&a[1]))
                    .map_or(NIL, |s| bulk(format_double(s.0))),
            },
            "ZCARD" => match self.typed(&a[0], Value::as_zset) {
                Err(e) => e,
                Ok(z) => Reply::Int(z.map_or(0, |z| z.len() as i64)),
            },
            "ZRANGE" => self.zrange(a),
            _ => self.zrange_by_score(name, a),
        }
    }

    /// The members in score order (ties by member).
    fn ordered(z: &BTreeMap<Bytes, Score>) -> Vec<(&Bytes, f64)> {
        let mut all: Vec<(&Bytes, f64)> = z.iter().map(|(m, s)| (m, s.0)).collect();
        all.sort_by(|x, y| x.1.total_cmp(&y.1).then_with(|| x.0.cmp(y.0)));
        all
    }

    fn with_scores(members: &[(&Bytes, f64)], scores: bool) -> Reply {
        array(
            members
                .iter()
                .flat_map(|(m, s)| {
                    let mut out = vec![bulk((*m).clone())];
                    if scores {
                        out.push(bulk(format_double(*s)));
                    }
                    out
                })
                .collect(),
        )
    }

    fn zadd(&mut self, a: &[Bytes]) -> Reply {
        let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) =
            (false, false, false, false, false, false);
        let mut i = 1;
        while i < a.len() {
            match String::from_utf8_lossy(&a[i]).to_ascii_uppercase().as_str() {
                "NX" => nx = true,
                "XX" => xx = true,
                "GT" => gt = true,
                "LT" => lt = true,
                "CH" => ch = true,
                "INCR" => incr = true,
                _ => break,
            }
            i += 1;
        }
        let pairs = &a[i..];
        if pairs.is_empty() || pairs.len() % 2 == 1 {
            return err(SYNTAX);
        }
        if nx && xx {
            return err("ERR XX and NX options at the same time are not compatible");
        }
        if (nx && (gt || lt)) || (gt && lt) {
            return err("ERR GT, LT, and/or NX options at the same time are not compatible");
        }
        if incr && pairs.len() > 2 {
            return err("ERR INCR option supports a single increment-element pair");
        }
        let mut parsed = Vec::new();
        for pair in pairs.chunks(2) {
            match parse_float(&pair[0]) {
                Some(score) => parsed.push((score, pair[1].clone())),
                None => return err(NOT_FLOAT),
            }
        }
        let creates = !xx;
        if self.live(&a[0]).is_none() && !creates {
            return if incr { NIL } else { Reply::Int(0) };
        }
        let set = match self.typed_mut(&a[0], || Value::ZSet(BTreeMap::new()), Value::as_zset_mut) {
            Ok(z) => z,
            Err(e) => return e,
        };
        let (mut added, mut changed) = (0, 0);
        let mut incr_result = None;
        for (score, member) in parsed {
            match set.get(&member).map(|s| s.0) {
                None if !xx => {
                    set.insert(member, Score(score));
                    added += 1;
                    incr_result = Some(score);
                }
                None => {}
                Some(_) if nx => {}
                Some(old) => {
                    let new = if incr { old + score } else { score };
                    if new.is_nan() {
                        return err("ERR resulting score is not a number (NaN)");
                    }
                    if (gt && new <= old) || (lt && new >= old) {
                        continue;
                    }
                    incr_result = Some(new);
                    if new != old {
                        set.insert(member, Score(new));
                        changed += 1;
                    }
                }
            }
        }
        self.drop_if_empty(&a[0]);
        if incr {
            return incr_result.map_or(NIL, |s| bulk(format_double(s)));
        }
        Reply::Int(if ch { added + changed } else { added })
    }

    fn zrange(&self, a: &[Bytes]) -> Reply {
        let scores = match &a[3..] {
            [] => false,
            [w] if w.eq_ignore_ascii_case(b"WITHSCORES") => true,
            _ => return err(SYNTAX),
        };
        let (Some(start), Some(stop)) = (parse_int(&a[1]), parse_int(&a[2])) else {
            return err(NOT_INTEGER);
        };
        let z = match self.typed(&a[0], Value::as_zset) {
            Err(e) => return e,
            Ok(None) => return array(vec![]),
            Ok(Some(z)) => z,
        };
        let all = Self::ordered(z);
        match index_range(start, stop, all.len()) {
            None => array(vec![]),
            Some((from, to)) => Self::with_scores(&all[from..=to], scores),
        }
    }

    fn zrange_by_score(&mut self, name: &str, a: &[Bytes]) -> Reply {
        let (mut scores, mut limit) = (false, None);
        let mut i = 3;
        while i < a.len() {
            if a[i].eq_ignore_ascii_case(b"WITHSCORES") {
                scores = true;
                i += 1;
            } else if a[i].eq_ignore_ascii_case(b"LIMIT") && i + 2 < a.len() {
                match (parse_int(&a[i + 1]), parse_int(&a[i + 2])) {
                    (Some(offset), Some(count)) => limit = Some((offset, count)),
                    _ => return err(NOT_INTEGER),
                }
                i += 3;
            } else {
                return err(SYNTAX);
            }
        }
        // The options are read before the range.
        let (Some(min), Some(max)) = (Bound::parse(&a[1]), Bound::parse(&a[2])) else {
            return err(RANGE_NOT_FLOAT);
        };
        let z = match self.typed(&a[0], Value::as_zset) {
            Err(e) => return e,
            Ok(z) => z,
        };
        let chosen: Vec<(Bytes, f64)> = z
            .map(|z| {
                Self::ordered(z)
                    .into_iter()
                    .filter(|(_, s)| min.below(*s) && max.above(*s))
                    .map(|(m, s)| (m.clone(), s))
                    .collect()
            })
            .unwrap_or_default();
        match name {
            "ZCOUNT" => Reply::Int(chosen.len() as i64),
            "ZREMRANGEBYSCORE" => {
                if let Some(Entry {
                    value: Value::ZSet(z),
                    ..
                }) = self.keys.get_mut(&a[0])
                {
                    for (m, _) in &chosen {
                        z.remove(m);
                    }
                }
                self.drop_if_empty(&a[0]);
                Reply::Int(chosen.len() as i64)
            }
            _ => {
                let window: Vec<(&Bytes, f64)> = match limit {
                    Some((offset, _)) if offset < 0 => vec![],
                    Some((offset, count)) => chosen
                        .iter()
                        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
                        .take(usize::try_from(count).unwrap_or(usize::MAX))
                        .map(|(m, s)| (m, *s))
                        .collect(),
                    None => chosen.iter().map(|(m, s)| (m, *s)).collect(),
                };
                Self::with_scores(&window, scores)
            }
        }
    }

    fn list(&mut self, name: &str, a: &[Bytes]) -> Reply {
        match (name, a.len()) {
            ("RPUSH" | "LPUSH", n) if n >= 2 => {
                let list = match self.typed_mut(
                    &a[0],
                    || Value::List(VecDeque::new()),
                    Value::as_list_mut,
                ) {
                    Ok(l) => l,
                    Err(e) => return e,
                };
                for v in &a[1..] {
                    if name == "RPUSH" {
                        list.push_back(v.clone());
                    } else {
                        list.push_front(v.clone());
                    }
                }
                Reply::Int(list.len() as i64)
            }
            ("LLEN", 1) => match self.typed(&a[0], Value::as_list) {
                Err(e) => e,
                Ok(l) => Reply::Int(l.map_or(0, |l| l.len() as i64)),
            },
            ("LINDEX", 2) => match self.typed(&a[0], Value::as_list) {
                // The key is looked up before the index is read.
                Err(e) => e,
                Ok(None) => NIL,
                Ok(Some(l)) => {
                    let Some(index) = parse_int(&a[1]) else {
                        return err(NOT_INTEGER);
                    };
                    let len = l.len() as i64;
                    let at = if index < 0 { len + index } else { index };
                    usize::try_from(at)
                        .ok()
                        .and_then(|at| l.get(at))
                        .cloned()
                        .map_or(NIL, bulk)
                }
            },
            ("LRANGE", 3) => {
                let (Some(start), Some(stop)) = (parse_int(&a[1]), parse_int(&a[2])) else {
                    return err(NOT_INTEGER);
                };
                match self.typed(&a[0], Value::as_list) {
                    Err(e) => e,
                    Ok(None) => array(vec![]),
                    Ok(Some(l)) => match index_range(start, stop, l.len()) {
                        None => array(vec![]),
                        Some((from, to)) => {
                            array(l.range(from..=to).map(|v| bulk(v.clone())).collect())
                        }
                    },
                }
            }
            ("LPOS", 2) => match self.typed(&a[0], Value::as_list) {
                Err(e) => e,
                Ok(l) => l
                    .and_then(|l| l.iter().position(|v| *v == a[1]))
                    .map_or(NIL, |at| Reply::Int(at as i64)),
            },
            ("LREM", 3) => {
                let Some(count) = parse_int(&a[1]) else {
                    return err(NOT_INTEGER);
                };
                let removed = match self.live_mut(&a[0]).map(|e| &mut e.value) {
                    None => 0,
                    Some(Value::List(l)) => lrem(l, count, &a[2]),
                    Some(_) => return err(WRONGTYPE),
                };
                self.drop_if_empty(&a[0]);
                Reply::Int(removed)
            }
            _ => arity(name),
        }
    }

    fn xadd(&mut self, a: &[Bytes]) -> Reply {
        if a[1] != b"*" {
            return err("ERR the model's XADD takes only the id '*'");
        }
        if a.len() % 2 == 1 {
            return arity("XADD");
        }
        let now = u64::try_from(self.now_ms()).unwrap_or(0);
        let stream = match self.typed_mut(
            &a[0],
            || Value::Stream(Vec::new(), StreamId::default()),
            |v| {
                if let Value::Stream(..) = v {
                    Some(v)
                } else {
                    None
                }
            },
        ) {
            Ok(Value::Stream(entries, last)) => (entries, last),
            Ok(_) => unreachable!("picked a stream"),
            Err(e) => return e,
        };
        let (entries, last) = stream;
        let id = if now > last.0 {
            StreamId(now, 0)
        } else {
            StreamId(last.0, last.1 + 1)
        };
        *last = id;
        entries.push((
            id,
            a[2..]
                .chunks(2)
                .map(|fv| (fv[0].clone(), fv[1].clone()))
                .collect(),
        ));
        bulk(id.to_string())
    }

    /// `XRANGE key - +`, the whole stream (the differential test's read).
    fn xrange(&self, key: &[u8]) -> Reply {
        match self.live(key).map(|e| &e.value) {
            None => array(vec![]),
            Some(Value::Stream(entries, _)) => array(
                entries
                    .iter()
                    .map(|(id, fields)| {
                        array(vec![
                            bulk(id.to_string()),
                            array(
                                fields
                                    .iter()
                                    .flat_map(|(f, v)| [bulk(f.clone()), bulk(v.clone())])
                                    .collect(),
                            ),
                        ])
                    })
                    .collect(),
            ),
            Some(_) => err(WRONGTYPE),
        }
    }

    fn info(&self) -> Reply {
        let uptime = (self.now_us - self.started_us).div_euclid(1_000_000);
        bulk(format!(
            "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\nrun_id:{}\r\n\
             uptime_in_seconds:{uptime}\r\n",
            self.run_id
        ))
    }

    fn publish(&mut self, a: &[Bytes], sharded: bool) -> Reply {
        let listeners = if sharded {
            &self.shard_subscribers
        } else {
            &self.subscribers
        };
        let count = listeners.get(&a[0]).copied().unwrap_or(0);
        self.published.push(Published {
            channel: a[0].clone(),
            message: a[1].clone(),
            sharded,
        });
        Reply::Int(count)
    }
}

/// `LREM`: up to `count` elements equal to `value` (0: all; negative: from the tail).
fn lrem(list: &mut VecDeque<Bytes>, count: i64, value: &[u8]) -> i64 {
    let limit = if count == 0 {
        usize::MAX
    } else {
        count.unsigned_abs() as usize
    };
    let mut removed = 0;
    let mut kept: VecDeque<Bytes> = VecDeque::with_capacity(list.len());
    let items: Vec<Bytes> = if count < 0 {
        list.drain(..).rev().collect()
    } else {
        list.drain(..).collect()
    };
    for item in items {
        if removed < limit && item == value {
            removed += 1;
        } else {
            kept.push_back(item);
        }
    }
    if count < 0 {
        kept = kept.into_iter().rev().collect();
    }
    *list = kept;
    removed as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_print_as_c_does_with_17_digits() {
        assert_eq!(format_double(0.1), "0.10000000000000001");
        assert_eq!(format_double(1.5), "1.5");
        assert_eq!(format_double(3.0), "3");
        assert_eq!(format_double(1e20), "1e+20");
        assert_eq!(format_double(1_732_700_000_123_456.0), "1732700000123456");
        assert_eq!(format_double(1e17), "1e+17");
        assert_eq!(format_double(0.0001), "0.0001");
        assert_eq!(format_double(0.00001), "1.0000000000000001e-05");
        assert_eq!(format_double(f64::INFINITY), "inf");
        assert_eq!(format_double(-2.5), "-2.5");
    }

    #[test]
    fn integers_parse_as_string2ll_does() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-12"), Some(-12));
        for bad in [
            &b"-0"[..],
            b"012",
            b"+1",
            b" 1",
            b"1 ",
            b"",
            b"1.0",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_int(bad), None, "{}", bad.escape_ascii());
        }
    }
}
