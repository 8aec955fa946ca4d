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

    fn invoke(self) -> ScriptInvocation<'static> {
        self.script().prepare_invoke()
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
) -> ScriptInvocation<'static> {
    let mut inv = Lua::Acquire.invoke();
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
pub(crate) fn release(
    keys: &LockKeys,
    token: &HolderToken,
    fence: u64,
) -> ScriptInvocation<'static> {
    let mut inv = Lua::Release.invoke();
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
pub(crate) fn renew<'a>(
    leases: impl Iterator<Item = (&'a str, &'a str, Duration)>,
) -> ScriptInvocation<'static> {
    let mut inv = Lua::Renew.invoke();
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
) -> ScriptInvocation<'static> {
    let mut inv = Lua::ReentrantAcquire.invoke();
    inv.key(&keys.lock)
        .key(keys.fence())
        .arg(owner)
        .arg(token.as_str())
        .arg(ms(ttl));
    inv
}

pub(crate) fn reentrant_release(
    keys: &LockKeys,
    owner: &str,
    token: &HolderToken,
) -> ScriptInvocation<'static> {
    let mut inv = Lua::ReentrantRelease.invoke();
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
) -> ScriptInvocation<'static> {
    let mut inv = Lua::FairAcquire.invoke();
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

pub(crate) fn fair_release(keys: &LockKeys, token: &HolderToken) -> ScriptInvocation<'static> {
    let mut inv = Lua::FairRelease.invoke();
    inv.key(&keys.lock)
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.holder_info())
        .arg(token.as_str())
        .arg(keys.channel());
    inv
}

pub(crate) fn fair_leave(keys: &LockKeys, token: &HolderToken) -> ScriptInvocation<'static> {
    let mut inv = Lua::FairLeave.invoke();
    inv.key(&keys.lock)
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.holder_info())
        .arg(token.as_str())
        .arg(keys.channel());
    inv
}

/// Reads everything of one lock name; writes nothing.
pub(crate) fn inspect(keys: &LockKeys) -> ScriptInvocation<'static> {
    let mut inv = Lua::Inspect.invoke();
    inv.key(&keys.lock)
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.holder_info());
    inv
}

/// Breaks the lock, whoever holds it.
pub(crate) fn break_lock(keys: &LockKeys) -> ScriptInvocation<'static> {
    let mut inv = Lua::Break.invoke();
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

pub(crate) fn queue_push(
    keys: &QueueKeys,
    payload: &[u8],
    delay: Duration,
) -> ScriptInvocation<'static> {
    let mut inv = Lua::QueuePush.invoke();
    inv.key(&keys.due)
        .key(&keys.items)
        .key(&keys.seq)
        .arg(payload)
        .arg(ms(delay));
    inv
}

pub(crate) fn queue_take(
    keys: &QueueKeys,
    visibility: Duration,
    receipt: &str,
) -> ScriptInvocation<'static> {
    let mut inv = Lua::QueueTake.invoke();
    inv.key(&keys.due)
        .key(&keys.in_flight)
        .key(&keys.items)
        .key(&keys.attempts)
        .key(&keys.receipts)
        .arg(ms(visibility))
        .arg(receipt);
    inv
}

pub(crate) fn queue_ack(keys: &QueueKeys, id: u64, receipt: &str) -> ScriptInvocation<'static> {
    let mut inv = Lua::QueueAck.invoke();
    inv.key(&keys.in_flight)
        .key(&keys.items)
        .key(&keys.attempts)
        .key(&keys.receipts)
        .arg(member(id))
        .arg(receipt);
    inv
}

pub(crate) fn queue_retry(
    keys: &QueueKeys,
    id: u64,
    receipt: &str,
    delay: Duration,
) -> ScriptInvocation<'static> {
    let mut inv = Lua::QueueRetry.invoke();
    inv.key(&keys.due)
        .key(&keys.in_flight)
        .key(&keys.receipts)
        .arg(member(id))
        .arg(receipt)
        .arg(ms(delay));
    inv
}

pub(crate) fn queue_extend(
    keys: &QueueKeys,
    id: u64,
    receipt: &str,
    visibility: Duration,
) -> ScriptInvocation<'static> {
    let mut inv = Lua::QueueExtend.invoke();
    inv.key(&keys.in_flight)
        .key(&keys.receipts)
        .arg(member(id))
        .arg(receipt)
        .arg(ms(visibility));
    inv
}

pub(crate) fn queue_counts(keys: &QueueKeys) -> ScriptInvocation<'static> {
    let mut inv = Lua::QueueCounts.invoke();
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
