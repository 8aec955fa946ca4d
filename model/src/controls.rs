//! The controls: mutations of the shipped scripts that a property must catch, each a
//! textual patch of the script as the library ships it ([`Patch`]: a patch that no
//! longer applies fails loudly).

use crate::scripts::Patch;

/// A mutation and the property that must catch it.
#[derive(Clone, Copy, Debug)]
pub struct Control {
    /// What the mutation breaks, for reports.
    pub name: &'static str,
    /// The patches.
    pub patches: &'static [Patch],
    /// The property that must be violated.
    pub caught_by: &'static str,
}

/// The property every lock world checks first.
pub const ONE_HOLDER: &str = crate::world::ONE_HOLDER;

/// Release without the owner check: a release deletes the lock whoever holds it.
pub const RELEASE_WITHOUT_OWNER_CHECK: Control = Control {
    name: "release without the owner check",
    patches: &[Patch {
        script: "lock/release.lua",
        find: "local own = found == ARGV[1] and not KEYS[5]",
        replace: "local own = found and not KEYS[5]",
    }],
    caught_by: ONE_HOLDER,
};

/// Acquire without NX: an acquire overwrites the holder.
pub const ACQUIRE_WITHOUT_NX: Control = Control {
    name: "acquire without NX",
    patches: &[Patch {
        script: "lock/acquire.lua",
        find: "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
        replace: "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])",
    }],
    caught_by: ONE_HOLDER,
};

/// A fencing counter not raised: a grant mints the counter's value again, not above it.
pub const TOKEN_NOT_RAISED: Control = Control {
    name: "a grant that does not raise the fencing counter",
    patches: &[Patch {
        script: "lock/acquire.lua",
        find: "local fence = math.max((value or 0) + 1, now_us or server_us())",
        replace: "local fence = math.max(value or 0, now_us or server_us())",
    }],
    caught_by: crate::world::TOKENS_RISE,
};

/// A fenced write that skips the token check: the resource takes an older token.
pub const FENCE_CHECK_SKIPPED: Control = Control {
    name: "a fenced write without the token check",
    patches: &[Patch {
        script: "fence/write.lua",
        find: "  if lower(token, highest) then",
        replace: "  if false then",
    }],
    caught_by: crate::world::RESOURCE,
};

/// The plain attempt's fast path (`lock/take.lua`, a first attempt's script) without
/// NX: it overwrites the holder.
pub const TAKE_WITHOUT_NX: Control = Control {
    name: "a first attempt (take.lua) without NX",
    patches: &[Patch {
        script: "lock/take.lua",
        find: "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
        replace: "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])",
    }],
    caught_by: ONE_HOLDER,
};

/// The plain attempt's fast path minting the counter's value again, not above it.
pub const TAKE_TOKEN_NOT_RAISED: Control = Control {
    name: "a first attempt (take.lua) that does not raise the fencing counter",
    patches: &[Patch {
        script: "lock/take.lua",
        find: "local fence = math.max((tonumber(raw) or 0) + 1,",
        replace: "local fence = math.max(tonumber(raw) or 0,",
    }],
    caught_by: crate::world::TOKENS_RISE,
};

/// A writer that does not check for readers: its attempts (`take.lua` first, then
/// `acquire.lua`) set the lock key without NX, over the readers' set.
pub const WRITER_OVER_READERS: Control = Control {
    name: "a writer's acquire without NX (a writer and 2 readers)",
    patches: &[
        Patch {
            script: "lock/take.lua",
            find: "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
            replace: "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])",
        },
        Patch {
            script: "lock/acquire.lua",
            find: "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
            replace: "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])",
        },
    ],
    caught_by: ONE_HOLDER,
};

/// Every control of the plain lock world.
pub const PLAIN: [Control; 6] = [
    RELEASE_WITHOUT_OWNER_CHECK,
    ACQUIRE_WITHOUT_NX,
    TOKEN_NOT_RAISED,
    FENCE_CHECK_SKIPPED,
    TAKE_WITHOUT_NX,
    TAKE_TOKEN_NOT_RAISED,
];

/// A Redlock release that does not raise the nodes' fencing counters to the grant's
/// token (`release.lua`'s `raise_counter`): a majority that did not grant it may then
/// mint a token no higher.
pub const REDLOCK_COUNTER_NOT_RAISED: Control = Control {
    name: "a Redlock release that does not raise the counters",
    patches: &[Patch {
        script: "lock/release.lua",
        find: "  if floor > 0 then",
        replace: "  if false then",
    }],
    caught_by: crate::world::TOKENS_RISE,
};

/// The fair acquire's fast path (a free lock, nobody queued) that does not look at the
/// lock itself: it grants a held lock.
pub const FAIR_FAST_PATH_IGNORES_HOLDER: Control = Control {
    name: "a fair acquire's fast path that ignores the holder",
    patches: &[Patch {
        script: "lock/fair_acquire.lua",
        find: "redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4], KEYS[6]) == 0",
        replace: "redis.call('EXISTS', KEYS[3], KEYS[4], KEYS[6]) == 0",
    }],
    caught_by: ONE_HOLDER,
};

/// The fair acquire's fast path minting the counter's value again.
pub const FAIR_FAST_TOKEN_NOT_RAISED: Control = Control {
    name: "a fair acquire's fast path that does not raise the fencing counter",
    patches: &[Patch {
        script: "lock/fair_acquire.lua",
        find: "local fence = math.max((tonumber(raw) or 0) + 1,",
        replace: "local fence = math.max(tonumber(raw) or 0,",
    }],
    caught_by: crate::world::TOKENS_RISE,
};

/// The read acquire's fast path (no writer, no readers) minting the counter's value
/// again.
pub const READ_FAST_TOKEN_NOT_RAISED: Control = Control {
    name: "a read acquire's fast path that does not raise the fencing counter",
    patches: &[Patch {
        script: "rwlock/read_acquire.lua",
        find: "local fence = math.max((tonumber(raw) or 0) + 1, now_us)",
        replace: "local fence = math.max(tonumber(raw) or 0, now_us)",
    }],
    caught_by: crate::world::TOKENS_RISE,
};

/// The semaphore's fast path (a free permit, not fair, not listed) granting one permit
/// more than the semaphore has.
pub const SEMAPHORE_FAST_PATH_ONE_TOO_MANY: Control = Control {
    name: "a semaphore acquire's fast path that grants one permit too many",
    patches: &[Patch {
        script: "semaphore/acquire.lua",
        find: "      if held < tonumber(ARGV[3]) then",
        replace: "      if held <= tonumber(ARGV[3]) then",
    }],
    caught_by: ONE_HOLDER,
};

/// A wake list that drops its waiter: a refused waiting attempt does not list its
/// client, so a release wakes nobody and the waiter sleeps until the lease's bound.
pub const WAKE_LIST_DROPS_A_WAITER: Control = Control {
    name: "a wake list that drops a waiter",
    patches: &[Patch {
        script: "lock/acquire.lua",
        find: "redis.pcall('ZADD', list, 'NX', now or server_ms(), member)",
        replace: "local _ = member",
    }],
    caught_by: crate::world::NO_LOST_WAKEUP,
};

/// A fair lock that grants a free lock to whoever asks, ahead of its queue.
pub const FAIR_QUEUE_JUMPED: Control = Control {
    name: "a fair acquire that ignores the queue",
    patches: &[Patch {
        script: "lock/fair_acquire.lua",
        find: "if kind == 'none' and (not head or head == ARGV[1]) then",
        replace: "if kind == 'none' then",
    }],
    caught_by: crate::world::FAIR_ORDER,
};

/// A campaign without NX: a candidate takes the leadership from the leader, two
/// leaders in one term.
pub const CAMPAIGN_WITHOUT_NX: Control = Control {
    name: "a campaign without NX",
    patches: &[Patch {
        script: "election/campaign.lua",
        find: "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
        replace: "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])",
    }],
    caught_by: ONE_HOLDER,
};

/// A fair acquire that never purges a dead head: a waiter whose deadline to call again
/// passed (it crashed) stays first in line, and the live waiters behind it wait on it
/// for as long as they call.
pub const FAIR_DEAD_HEAD_KEPT: Control = Control {
    name: "a fair queue that never purges a dead head",
    patches: &[Patch {
        script: "lock/fair_acquire.lua",
        find: "purge_overdue(KEYS[3], KEYS[4], dead, now, KEYS[6])",
        replace: "dead = {}",
    }],
    caught_by: crate::world::DEAD_HEAD,
};

/// A fair release that does not purge the overdue waiters: a head of the queue past
/// its deadline (crashed, or paused as long) stays first in line. Its handover is
/// still capped at that head's deadline (`px`), so the dead head is not granted the
/// lock: the release leaves it free, the dead head first in line, and the live waiter
/// behind it waits for its own next call.
pub const FAIR_RELEASE_KEEPS_DEAD_HEAD: Control = Control {
    name: "a fair release that never purges a dead head",
    patches: &[Patch {
        script: "lock/fair_release.lua",
        find: "purge_overdue(KEYS[2], KEYS[3], dead, now, grants and KEYS[6] or nil)",
        replace: "dead = {}",
    }],
    caught_by: crate::world::DEAD_HEAD,
};

/// A refusal that reports a longer wait than the lease in the way: a waiting attempt
/// (`acquire.lua`) refused by another holder answers its PTTL and 3 s more, and the
/// waiter's fallback timer (what it sleeps on when a release message is lost) runs
/// past the lease.
pub const REFUSAL_OVERSTATES_THE_LEASE: Control = Control {
    name: "a refusal that reports 3 s more than the lease (acquire.lua)",
    patches: &[Patch {
        script: "lock/acquire.lua",
        find: "  relist(pttl)\n  return reply(0, pttl)",
        replace: "  relist(pttl)\n  return reply(0, pttl + 3000)",
    }],
    caught_by: crate::world::FALLBACK_BOUND,
};

/// The same for several locks at once: `multi_acquire.lua`'s refusal names the held
/// name's place and reports its PTTL and 3 s more.
pub const MULTI_REFUSAL_OVERSTATES_THE_LEASE: Control = Control {
    name: "a multi-lock refusal that reports 3 s more than the lease",
    patches: &[Patch {
        script: "lock/multi_acquire.lua",
        find: "    return reply(7, pttl, i + 1)",
        replace: "    return reply(7, pttl + 3000, i + 1)",
    }],
    caught_by: crate::world::FALLBACK_BOUND,
};

/// A renewal without the owner check (`renew.lua`, through `renew_lease`): it extends
/// the lock key whoever holds it, so a holder whose renewal reaches the server after
/// its lease ran out and another took the lock is told its lease was renewed.
pub const RENEW_WITHOUT_OWNER_CHECK: Control = Control {
    name: "a renewal without the owner check (renew.lua)",
    patches: &[Patch {
        script: "lock/renew.lua",
        find: "elseif (kind == 'plain' or kind == 'reentrant') and found == holder then",
        replace: "elseif kind == 'plain' or kind == 'reentrant' then",
    }],
    caught_by: ONE_HOLDER,
};
