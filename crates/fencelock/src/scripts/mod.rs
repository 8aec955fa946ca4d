//! The Lua scripts, and typed invocations of them.
//!
//! Each script is a file whose header states KEYS, ARGV and every reply: `lock/` holds
//! the lock's scripts, `queue/` the delay queue's. The functions several scripts share
//! are fragments in `fragments/`, put in front of a script when it is loaded, as
//! [`Lua::parts`] lists: that table is the only place that says which fragment goes
//! where. Every script refuses a key that holds data fencelock did not write the same
//! way (`types.lua`'s error reply, decoded in one place, [`replies::wrong_type`]).
//!
//! Scripts run through [`redis::Script`], which sends `EVALSHA` and falls back to loading
//! the script when the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
//! [`lua_scripts`] gives the composed sources, as sent, for review and for the tests that
//! run them by hand.

pub(crate) mod replies;

use std::sync::LazyLock;
use std::time::Duration;

use redis::ScriptInvocation;

use crate::keys::{LockKeys, QueueKeys};
use crate::token::HolderToken;

/// A Lua file shared by several scripts: functions only.
#[derive(Clone, Copy)]
struct Fragment(&'static str);

/// `server_us()`, `server_ms()`.
const CLOCK: Fragment = Fragment(include_str!("fragments/clock.lua"));
/// `wrong_type()`, `check_types()`.
const TYPES: Fragment = Fragment(include_str!("fragments/types.lua"));
/// `lock_holder()`.
const HOLDER: Fragment = Fragment(include_str!("fragments/holder.lua"));
/// `read_counter()`, `next_fence()`; needs [`CLOCK`].
const FENCE: Fragment = Fragment(include_str!("fragments/fence.lua"));
/// `purge_waiters()`.
const FAIR_QUEUE: Fragment = Fragment(include_str!("fragments/fair_queue.lua"));

/// Every script fencelock runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lua {
    Acquire,
    Release,
    Renew,
    ReentrantAcquire,
    ReentrantRelease,
    FairAcquire,
    FairRelease,
    FairLeave,
    Inspect,
    Break,
    QueuePush,
    QueueTake,
    QueueAck,
    QueueRetry,
    QueueExtend,
    QueueCounts,
}

impl Lua {
    const ALL: [Lua; 16] = [
        Lua::Acquire,
        Lua::Release,
        Lua::Renew,
        Lua::ReentrantAcquire,
        Lua::ReentrantRelease,
        Lua::FairAcquire,
        Lua::FairRelease,
        Lua::FairLeave,
        Lua::Inspect,
        Lua::Break,
        Lua::QueuePush,
        Lua::QueueTake,
        Lua::QueueAck,
        Lua::QueueRetry,
        Lua::QueueExtend,
        Lua::QueueCounts,
    ];

    /// The table: each script's file, the fragments put in front of it (in this order),
    /// and its own source.
    fn parts(self) -> (&'static str, &'static [Fragment], &'static str) {
        use Lua::*;
        match self {
            Acquire => (
                "lock/acquire.lua",
                &[TYPES, HOLDER, CLOCK, FENCE],
                include_str!("lock/acquire.lua"),
            ),
            Release => (
                "lock/release.lua",
                &[TYPES, HOLDER, CLOCK, FENCE],
                include_str!("lock/release.lua"),
            ),
            Renew => ("lock/renew.lua", &[HOLDER], include_str!("lock/renew.lua")),
            ReentrantAcquire => (
                "lock/reentrant_acquire.lua",
                &[TYPES, HOLDER, CLOCK, FENCE],
                include_str!("lock/reentrant_acquire.lua"),
            ),
            ReentrantRelease => (
                "lock/reentrant_release.lua",
                &[TYPES, HOLDER],
                include_str!("lock/reentrant_release.lua"),
            ),
            FairAcquire => (
                "lock/fair_acquire.lua",
                &[TYPES, HOLDER, CLOCK, FENCE, FAIR_QUEUE],
                include_str!("lock/fair_acquire.lua"),
            ),
            FairRelease => (
                "lock/fair_release.lua",
                &[TYPES, HOLDER, CLOCK, FAIR_QUEUE],
                include_str!("lock/fair_release.lua"),
            ),
            FairLeave => (
                "lock/fair_leave.lua",
                &[TYPES, HOLDER],
                include_str!("lock/fair_leave.lua"),
            ),
            Inspect => (
                "lock/inspect.lua",
                &[TYPES, HOLDER, CLOCK, FENCE],
                include_str!("lock/inspect.lua"),
            ),
            Break => (
                "lock/break.lua",
                &[TYPES, HOLDER, CLOCK, FENCE],
                include_str!("lock/break.lua"),
            ),
            QueuePush => (
                "queue/push.lua",
                &[TYPES, CLOCK],
                include_str!("queue/push.lua"),
            ),
            QueueTake => (
                "queue/take.lua",
                &[TYPES, CLOCK],
                include_str!("queue/take.lua"),
            ),
            QueueAck => ("queue/ack.lua", &[TYPES], include_str!("queue/ack.lua")),
            QueueRetry => (
                "queue/retry.lua",
                &[TYPES, CLOCK],
                include_str!("queue/retry.lua"),
            ),
            QueueExtend => (
                "queue/extend.lua",
                &[TYPES, CLOCK],
                include_str!("queue/extend.lua"),
            ),
            QueueCounts => (
                "queue/counts.lua",
                &[TYPES, CLOCK],
                include_str!("queue/counts.lua"),
            ),
        }
    }

    /// The script as sent: its fragments, then its own source.
    fn source(self) -> String {
        let (_, fragments, body) = self.parts();
        fragments.iter().map(|f| f.0).chain([body]).collect()
    }

    fn script(self) -> &'static redis::Script {
        static SCRIPTS: LazyLock<Vec<redis::Script>> = LazyLock::new(|| {
            Lua::ALL
                .iter()
                .map(|lua| redis::Script::new(&lua.source()))
                .collect()
        });
        &SCRIPTS[Lua::ALL.iter().position(|l| *l == self).unwrap_or(0)]
    }
}

/// One call of a script: the invocation sent, and what error messages name (the script
/// and the keys it was given).
pub(crate) struct Call {
    lua: Lua,
    keys: Vec<String>,
    invocation: ScriptInvocation<'static>,
}

impl Call {
    fn new(lua: Lua) -> Self {
        Self {
            lua,
            keys: Vec::new(),
            invocation: lua.script().prepare_invoke(),
        }
    }

    fn key(&mut self, key: impl AsRef<str>) -> &mut Self {
        let key = key.as_ref();
        self.invocation.key(key);
        self.keys.push(key.to_owned());
        self
    }

    fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        self.invocation.arg(arg);
        self
    }

    /// What is sent.
    pub(crate) fn invocation(&self) -> &ScriptInvocation<'static> {
        &self.invocation
    }

    /// An ACL refusal of this call, said so that the user knows what to allow: the command
    /// the server names, or else the command the script's refused line runs, and the keys
    /// the call was given. `None` for any other error message.
    pub(crate) fn refusal(&self, message: &str) -> Option<String> {
        let (file, _, _) = self.lua.parts();
        let keys = self.keys.join(", ");
        if message.contains("no permissions to run the") {
            return Some(format!("{message} (running {file})"));
        }
        if message.contains("no permissions to access one of the keys") {
            return Some(format!(
                "the Redis user may not access these keys, which {file} was given: {keys}"
            ));
        }
        let command_refused = message.contains("script can't run this command");
        let key_refused = message.contains("script can't access at least one of the keys");
        if !command_refused && !key_refused {
            return None;
        }
        // "... script: <sha>, on @user_script:<line>."
        let line: Option<usize> = message
            .rsplit("@user_script:")
            .next()
            .and_then(|rest| rest.trim_end_matches(['.', ' ']).parse().ok());
        let source = self.lua.source();
        let text = line
            .and_then(|n| source.lines().nth(n.checked_sub(1)?))
            .map(str::trim)
            .unwrap_or_default();
        let command = text
            .split_once("call('")
            .and_then(|(_, rest)| rest.split_once('\''))
            .map(|(command, _)| command.to_owned());
        let at = match line {
            Some(n) => format!("{file}, line {n} as sent: {text}"),
            None => file.to_owned(),
        };
        Some(match (command_refused, command) {
            (true, Some(command)) => format!(
                "the Redis user may not run {command}, which a fencelock script runs ({at})"
            ),
            (true, None) => format!("the Redis user may not run a command of {at}"),
            (false, _) => format!(
                "the Redis user may not access a key that {at} touches; the call's keys: {keys}"
            ),
        })
    }
}

/// Every Lua script fencelock sends, by file name (`lock/acquire.lua`, ...), composed as
/// sent: the shared fragments, then the script's own source, whose header states its
/// KEYS, ARGV and replies. For review (what runs on your Redis, with which keys), and for
/// running a script by hand with `EVAL`.
pub fn lua_scripts() -> impl Iterator<Item = (&'static str, String)> {
    Lua::ALL
        .into_iter()
        .map(|lua| (lua.parts().0, lua.source()))
}

/// Durations in whole milliseconds (validated before they get here; queue delays may be
/// 0).
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

/// `identify`: report run id and uptime; `info`: the holder info to store with the
/// grant ("" for none).
pub(crate) fn acquire(
    keys: &LockKeys,
    token: &HolderToken,
    ttl: Duration,
    identify: bool,
    info: &str,
) -> Call {
    let mut inv = Call::new(Lua::Acquire);
    inv.key(&keys.lock)
        .key(keys.fence())
        .arg(token.as_str())
        .arg(ms(ttl))
        .arg(flag(identify));
    if !info.is_empty() {
        inv.key(keys.holder_info()).arg(info);
    }
    inv
}

/// `fence`: the grant's token, raised into the counter (0: none).
pub(crate) fn release(keys: &LockKeys, token: &HolderToken, fence: u64) -> Call {
    let mut inv = Call::new(Lua::Release);
    inv.key(&keys.lock)
        .key(keys.fence())
        .key(keys.holder_info())
        .arg(token.as_str())
        .arg(keys.channel())
        .arg(fence);
    inv
}

/// One batch: `(lock key, holder, ttl)` per lease; the holder is the token, or a
/// reentrant lock's owner id. Each lease's holder info is renewed with it.
pub(crate) fn renew<'a>(leases: impl Iterator<Item = (&'a str, &'a str, Duration)>) -> Call {
    let mut inv = Call::new(Lua::Renew);
    for (key, holder, ttl) in leases {
        inv.key(key)
            .key(format!("{key}:holder"))
            .arg(holder)
            .arg(ms(ttl));
    }
    inv
}

pub(crate) fn reentrant_acquire(
    keys: &LockKeys,
    owner: &str,
    token: &HolderToken,
    ttl: Duration,
) -> Call {
    let mut inv = Call::new(Lua::ReentrantAcquire);
    inv.key(&keys.lock)
        .key(keys.fence())
        .arg(owner)
        .arg(token.as_str())
        .arg(ms(ttl));
    inv
}

pub(crate) fn reentrant_release(keys: &LockKeys, owner: &str, token: &HolderToken) -> Call {
    let mut inv = Call::new(Lua::ReentrantRelease);
    inv.key(&keys.lock)
        .arg(owner)
        .arg(token.as_str())
        .arg(keys.channel());
    inv
}

/// `join`: enter the queue when it is not our turn (a waiting acquire), or only try;
/// `info`: the holder info to store with the grant ("" for none).
pub(crate) fn fair_acquire(
    keys: &LockKeys,
    token: &HolderToken,
    ttl: Duration,
    waiter_timeout: Duration,
    join: bool,
    info: &str,
) -> Call {
    let mut inv = Call::new(Lua::FairAcquire);
    inv.key(&keys.lock)
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.holder_info())
        .arg(token.as_str())
        .arg(ms(ttl))
        .arg(ms(waiter_timeout))
        .arg(keys.channel())
        .arg(flag(join))
        .arg(info);
    inv
}

pub(crate) fn fair_release(keys: &LockKeys, token: &HolderToken) -> Call {
    let mut inv = Call::new(Lua::FairRelease);
    inv.key(&keys.lock)
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.holder_info())
        .arg(token.as_str())
        .arg(keys.channel());
    inv
}

pub(crate) fn fair_leave(keys: &LockKeys, token: &HolderToken) -> Call {
    let mut inv = Call::new(Lua::FairLeave);
    inv.key(&keys.lock)
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.holder_info())
        .arg(token.as_str())
        .arg(keys.channel());
    inv
}

/// Reads everything of one lock name; writes nothing.
pub(crate) fn inspect(keys: &LockKeys) -> Call {
    let mut inv = Call::new(Lua::Inspect);
    inv.key(&keys.lock)
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.holder_info());
    inv
}

/// Breaks the lock, whoever holds it.
pub(crate) fn break_lock(keys: &LockKeys) -> Call {
    let mut inv = Call::new(Lua::Break);
    inv.key(&keys.lock)
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.holder_info())
        .arg(keys.channel());
    inv
}

/// A queue item's id as stored: 20 zero-padded decimal digits, so that items due in the
/// same millisecond sort by id.
fn member(id: u64) -> String {
    format!("{id:020}")
}

pub(crate) fn queue_push(keys: &QueueKeys, payload: &[u8], delay: Duration) -> Call {
    let mut inv = Call::new(Lua::QueuePush);
    inv.key(&keys.due)
        .key(&keys.items)
        .key(&keys.seq)
        .arg(payload)
        .arg(ms(delay));
    inv
}

pub(crate) fn queue_take(keys: &QueueKeys, visibility: Duration, receipt: &str) -> Call {
    let mut inv = Call::new(Lua::QueueTake);
    inv.key(&keys.due)
        .key(&keys.in_flight)
        .key(&keys.items)
        .key(&keys.attempts)
        .key(&keys.receipts)
        .arg(ms(visibility))
        .arg(receipt);
    inv
}

pub(crate) fn queue_ack(keys: &QueueKeys, id: u64, receipt: &str) -> Call {
    let mut inv = Call::new(Lua::QueueAck);
    inv.key(&keys.in_flight)
        .key(&keys.items)
        .key(&keys.attempts)
        .key(&keys.receipts)
        .arg(member(id))
        .arg(receipt);
    inv
}

pub(crate) fn queue_retry(keys: &QueueKeys, id: u64, receipt: &str, delay: Duration) -> Call {
    let mut inv = Call::new(Lua::QueueRetry);
    inv.key(&keys.due)
        .key(&keys.in_flight)
        .key(&keys.receipts)
        .arg(member(id))
        .arg(receipt)
        .arg(ms(delay));
    inv
}

pub(crate) fn queue_extend(keys: &QueueKeys, id: u64, receipt: &str, visibility: Duration) -> Call {
    let mut inv = Call::new(Lua::QueueExtend);
    inv.key(&keys.in_flight)
        .key(&keys.receipts)
        .arg(member(id))
        .arg(receipt)
        .arg(ms(visibility));
    inv
}

pub(crate) fn queue_counts(keys: &QueueKeys) -> Call {
    let mut inv = Call::new(Lua::QueueCounts);
    inv.key(&keys.due).key(&keys.in_flight);
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_members_sort_like_ids() {
        assert_eq!(member(42), "00000000000000000042");
        assert!(member(9) < member(10));
        assert_eq!(member(u64::MAX).len(), 20);
    }

    #[test]
    fn every_script_has_a_header_and_the_fragments_its_functions_need() {
        let defined_in = [
            ("server_us(", CLOCK),
            ("server_ms(", CLOCK),
            ("wrong_type(", TYPES),
            ("check_types(", TYPES),
            ("lock_holder(", HOLDER),
            ("read_counter(", FENCE),
            ("next_fence(", FENCE),
            ("purge_waiters(", FAIR_QUEUE),
        ];
        for lua in Lua::ALL {
            let (file, fragments, body) = lua.parts();
            let name = file.rsplit('/').next().unwrap_or(file);
            assert!(
                body.starts_with(&format!("-- {name}:")),
                "{file} starts with its header"
            );
            for word in ["KEYS", "ARGV", "Reply"] {
                assert!(body.contains(word), "{file}'s header states {word}");
            }
            // Each function used comes with its fragment, and a fragment comes after
            // those it uses.
            let source = lua.source();
            for (call, fragment) in defined_in {
                if body.contains(call) {
                    assert!(
                        fragments.iter().any(|f| f.0 == fragment.0),
                        "{file} calls {call}) without its fragment"
                    );
                }
            }
            if fragments.iter().any(|f| f.0 == FENCE.0) {
                let clock = source
                    .find("local function server_us")
                    .unwrap_or(usize::MAX);
                let fence = source.find("local function next_fence").unwrap_or(0);
                assert!(clock < fence, "{file}: clock.lua comes before fence.lua");
            }
        }
    }
}
