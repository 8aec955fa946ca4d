//! Every Lua script against every state its key can be in: absent, holding the caller's
//! token, holding another token, of a wrong type, expired. Scripts run with EVAL on a real
//! redis-server, exactly as the library sends them.

use testkit::{RedisServer, Reply};

const ACQUIRE: &str = concat!(
    include_str!("../src/scripts/_counter.lua"),
    include_str!("../src/scripts/acquire.lua")
);
const RELEASE: &str = concat!(
    include_str!("../src/scripts/_holder.lua"),
    include_str!("../src/scripts/release.lua")
);
const RENEW: &str = include_str!("../src/scripts/renew.lua");
const REENTRANT_ACQUIRE: &str = concat!(
    include_str!("../src/scripts/_counter.lua"),
    include_str!("../src/scripts/reentrant_acquire.lua")
);
const REENTRANT_RELEASE: &str = include_str!("../src/scripts/reentrant_release.lua");
const FAIR_ACQUIRE: &str = concat!(
    include_str!("../src/scripts/_queue.lua"),
    include_str!("../src/scripts/_counter.lua"),
    include_str!("../src/scripts/fair_acquire.lua")
);
const FAIR_RELEASE: &str = concat!(
    include_str!("../src/scripts/_queue.lua"),
    include_str!("../src/scripts/_holder.lua"),
    include_str!("../src/scripts/fair_release.lua")
);
const FAIR_LEAVE: &str = include_str!("../src/scripts/fair_leave.lua");

const LOCK: &str = "fencelock:{s}";
const FENCE: &str = "fencelock:{s}:fence";
const QUEUE: &str = "fencelock:{s}:queue";
const WAITERS: &str = "fencelock:{s}:waiters";
const CHANNEL: &str = "fencelock:{s}:released";
const MINE: &str = "0123456789abcdef0123456789abcdef";
const THEIRS: &str = "ffffffffffffffffffffffffffffffff";

fn acquire(r: &RedisServer, token: &str, ttl_ms: &str) -> Vec<Reply> {
    let reply = r.cmd(&["EVAL", ACQUIRE, "2", LOCK, FENCE, token, ttl_ms]);
    reply
        .as_array()
        .unwrap_or_else(|| panic!("acquire replied {reply:?}"))
        .to_vec()
}

fn release(r: &RedisServer, token: &str) -> i64 {
    r.cmd(&["EVAL", RELEASE, "1", LOCK, token, CHANNEL])
        .as_int()
        .expect("integer reply")
}

fn extend(r: &RedisServer, token: &str, ttl_ms: &str) -> i64 {
    // An extend is a renewal batch of one.
    let reply = r.cmd(&["EVAL", RENEW, "1", LOCK, token, ttl_ms]);
    reply.as_array().expect("array reply")[0]
        .clone()
        .as_int()
        .expect("integer reply")
}

fn get(r: &RedisServer, key: &str) -> Option<String> {
    r.cmd(&["GET", key]).as_str().map(str::to_owned)
}

fn pttl(r: &RedisServer, key: &str) -> i64 {
    r.cmd(&["PTTL", key]).as_int().expect("PTTL is an integer")
}

/// Waits (bounded) until `key` is gone, i.e. its expiry really happened.
fn wait_until_absent(r: &RedisServer, key: &str) {
    for _ in 0..500 {
        if r.cmd(&["EXISTS", key]).as_int() == Some(0) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    panic!("{key} did not expire");
}

fn ints(reply: &[Reply]) -> Vec<i64> {
    reply.iter().map(|r| r.as_int().expect("integer")).collect()
}

#[test]
fn acquire_on_absent_key_sets_token_with_ttl_and_mints_a_fence() {
    let r = RedisServer::start();
    let reply = ints(&acquire(&r, MINE, "10000"));
    assert_eq!(reply[0], 1, "acquired fresh");
    // A missing counter is seeded from the server clock in microseconds.
    let now_us = r.cmd(&["TIME"]).as_array().unwrap()[0]
        .as_str()
        .unwrap()
        .parse::<i64>()
        .unwrap()
        * 1_000_000;
    assert!(
        reply[1] > now_us - 60_000_000 && reply[1] <= now_us + 2_000_000,
        "{reply:?}"
    );
    assert_eq!(
        get(&r, LOCK).as_deref(),
        Some(MINE),
        "the key is a plain string holding the token"
    );
    assert_eq!(get(&r, FENCE), Some(reply[1].to_string()));
    let ttl = pttl(&r, LOCK);
    assert!((9_000..=10_000).contains(&ttl), "PTTL {ttl}");
    assert_eq!(pttl(&r, FENCE), -1, "the counter never expires");
}

#[test]
fn acquire_again_with_own_token_returns_the_same_grant_and_resets_ttl() {
    let r = RedisServer::start();
    let first = ints(&acquire(&r, MINE, "5000"));
    r.cmd(&["PEXPIRE", LOCK, "100"]);
    let again = ints(&acquire(&r, MINE, "5000"));
    assert_eq!(again, vec![2, first[1]], "same fence, flagged as a retry");
    assert_eq!(
        get(&r, FENCE),
        Some(first[1].to_string()),
        "no second token minted"
    );
    assert!(pttl(&r, LOCK) > 4_000, "expiry reset to the full TTL");
}

#[test]
fn acquire_again_with_own_token_after_counter_wipe_mints_a_higher_fence() {
    let r = RedisServer::start();
    r.cmd(&["SET", FENCE, "41"]);
    let first = ints(&acquire(&r, MINE, "5000"));
    assert_eq!(first, vec![1, 42]);
    r.cmd(&["DEL", FENCE]);
    let again = ints(&acquire(&r, MINE, "5000"));
    assert_eq!(again[0], 2);
    assert!(again[1] > 42, "{again:?}");
}

#[test]
fn acquire_on_key_held_by_another_reports_remaining_ttl_and_changes_nothing() {
    let r = RedisServer::start();
    r.cmd(&["SET", LOCK, THEIRS, "PX", "7000"]);
    r.cmd(&["SET", FENCE, "10"]);
    let reply = ints(&acquire(&r, MINE, "10000"));
    assert_eq!(reply[0], 0);
    assert!((6_000..=7_000).contains(&reply[1]), "{reply:?}");
    assert_eq!(get(&r, LOCK).as_deref(), Some(THEIRS));
    assert_eq!(get(&r, FENCE).as_deref(), Some("10"));

    // A foreign key without expiry reports -1: it will never free itself.
    r.cmd(&["SET", LOCK, "written-by-hand"]);
    assert_eq!(ints(&acquire(&r, MINE, "10000")), vec![0, -1]);
}

#[test]
fn acquire_after_expiry_takes_the_lock_with_a_higher_fence() {
    let r = RedisServer::start();
    let first = ints(&acquire(&r, THEIRS, "1"));
    wait_until_absent(&r, LOCK);
    let second = ints(&acquire(&r, MINE, "10000"));
    assert_eq!(second, vec![1, first[1] + 1]);
    assert_eq!(get(&r, LOCK).as_deref(), Some(MINE));
}

#[test]
fn acquire_never_overwrites_keys_of_a_wrong_type() {
    let r = RedisServer::start();
    r.cmd(&["HSET", LOCK, "f", "v"]);
    let reply = acquire(&r, MINE, "10000");
    assert_eq!(reply[0].as_int(), Some(-1));
    assert_eq!(reply[1].as_str(), Some(LOCK));
    assert_eq!(reply[2].as_str(), Some("hash"));
    assert_eq!(
        r.cmd(&["HGET", LOCK, "f"]).as_str(),
        Some("v"),
        "hash untouched"
    );
    assert_eq!(
        r.cmd(&["EXISTS", FENCE]).as_int(),
        Some(0),
        "no counter written"
    );

    // A counter of the wrong type is caught before the lock key is written, so a Lua
    // error can never leave a lock behind that nobody was granted.
    let r = RedisServer::start();
    r.cmd(&["RPUSH", FENCE, "x"]);
    let reply = acquire(&r, MINE, "10000");
    assert_eq!(reply[0].as_int(), Some(-1));
    assert_eq!(reply[1].as_str(), Some(FENCE));
    assert_eq!(reply[2].as_str(), Some("list"));
    assert_eq!(r.cmd(&["EXISTS", LOCK]).as_int(), Some(0), "lock not taken");

    for bad in ["abc", "-5", "1.5", "9999999999999999999"] {
        r.cmd(&["DEL", FENCE]);
        r.cmd(&["SET", FENCE, bad]);
        let reply = acquire(&r, MINE, "10000");
        assert_eq!(reply[0].as_int(), Some(-1), "counter {bad:?}");
        assert_eq!(reply[2].as_str(), Some("string"));
        assert_eq!(get(&r, FENCE).as_deref(), Some(bad), "counter untouched");
        assert_eq!(r.cmd(&["EXISTS", LOCK]).as_int(), Some(0), "lock not taken");
    }
}

#[test]
fn release_in_every_key_state() {
    let r = RedisServer::start();
    assert_eq!(release(&r, MINE), 0, "absent");

    acquire(&r, MINE, "10000");
    assert_eq!(release(&r, MINE), 1, "own token");
    assert_eq!(r.cmd(&["EXISTS", LOCK]).as_int(), Some(0));
    assert!(get(&r, FENCE).is_some(), "the counter survives release");

    r.cmd(&["SET", LOCK, THEIRS, "PX", "10000"]);
    assert_eq!(release(&r, MINE), -1, "other token");
    assert_eq!(
        get(&r, LOCK).as_deref(),
        Some(THEIRS),
        "other's lock untouched"
    );

    r.cmd(&["DEL", LOCK]);
    r.cmd(&["HSET", LOCK, "f", "v"]);
    assert_eq!(release(&r, MINE), -2, "wrong type");
    assert_eq!(r.cmd(&["HGET", LOCK, "f"]).as_str(), Some("v"));

    r.cmd(&["DEL", LOCK]);
    acquire(&r, MINE, "1");
    wait_until_absent(&r, LOCK);
    assert_eq!(release(&r, MINE), 0, "expired");
}

#[test]
fn extend_in_every_key_state_and_never_recreates() {
    let r = RedisServer::start();
    assert_eq!(extend(&r, MINE, "10000"), 0, "absent");
    assert_eq!(
        r.cmd(&["EXISTS", LOCK]).as_int(),
        Some(0),
        "extend never creates the key"
    );

    acquire(&r, MINE, "1000");
    assert_eq!(extend(&r, MINE, "20000"), 1, "own token");
    assert!(pttl(&r, LOCK) > 19_000);
    assert_eq!(get(&r, LOCK).as_deref(), Some(MINE));

    r.cmd(&["SET", LOCK, THEIRS, "PX", "5000"]);
    assert_eq!(extend(&r, MINE, "20000"), -1, "other token");
    assert!(pttl(&r, LOCK) <= 5_000, "other's expiry untouched");

    r.cmd(&["DEL", LOCK]);
    r.cmd(&["LPUSH", LOCK, "x"]);
    assert_eq!(extend(&r, MINE, "20000"), -2, "wrong type");
    assert_eq!(pttl(&r, LOCK), -1, "list untouched");

    r.cmd(&["DEL", LOCK]);
    acquire(&r, MINE, "1");
    wait_until_absent(&r, LOCK);
    assert_eq!(extend(&r, MINE, "20000"), 0, "expired");
    assert_eq!(
        r.cmd(&["EXISTS", LOCK]).as_int(),
        Some(0),
        "expired lease stays lost"
    );
}

fn fair_acquire(r: &RedisServer, token: &str, join: bool) -> Vec<Reply> {
    let join = if join { "1" } else { "0" };
    let reply = r.cmd(&[
        "EVAL",
        FAIR_ACQUIRE,
        "4",
        LOCK,
        FENCE,
        QUEUE,
        WAITERS,
        token,
        "10000",
        "3000",
        CHANNEL,
        join,
    ]);
    reply
        .as_array()
        .unwrap_or_else(|| panic!("fair_acquire replied {reply:?}"))
        .to_vec()
}

fn queue(r: &RedisServer) -> Vec<String> {
    let reply = r.cmd(&["LRANGE", QUEUE, "0", "-1"]);
    reply
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_owned())
        .collect()
}

fn server_ms(r: &RedisServer) -> i64 {
    let t = r.cmd(&["TIME"]);
    let t = t.as_array().unwrap();
    t[0].as_int().unwrap() * 1000 + t[1].as_int().unwrap() / 1000
}

#[test]
fn fair_acquire_serves_the_queue_in_order() {
    let r = RedisServer::start();
    let (a, b, c) = ("a".repeat(32), "b".repeat(32), "c".repeat(32));
    assert_eq!(
        ints(&fair_acquire(&r, &a, true))[0],
        1,
        "free and nobody waits: acquired"
    );
    assert!(queue(&r).is_empty(), "the holder is not in the queue");

    // Held: waiters join in arrival order, with a deadline from the server clock.
    for t in [&b, &c] {
        let reply = ints(&fair_acquire(&r, t, true));
        assert_eq!(reply[0], 0);
        assert!(reply[1] > 9_000, "reports the holder's TTL: {reply:?}");
    }
    assert_eq!(queue(&r), vec![b.clone(), c.clone()]);
    let deadline = r
        .cmd(&["ZSCORE", WAITERS, &c])
        .as_str()
        .unwrap()
        .parse::<f64>()
        .unwrap() as i64;
    let now = server_ms(&r);
    assert!(
        (now + 2_000..=now + 3_000).contains(&deadline),
        "deadline {deadline}, now {now}"
    );

    // Calling again keeps the place (no duplicate entry).
    fair_acquire(&r, &c, true);
    assert_eq!(queue(&r), vec![b.clone(), c.clone()]);

    // Released: it is b's turn; c may not take the free lock ahead of b.
    r.cmd(&["DEL", LOCK]);
    assert_eq!(ints(&fair_acquire(&r, &c, true)), vec![0, -2]);
    assert_eq!(ints(&fair_acquire(&r, &b, true))[0], 1, "the head takes it");
    assert_eq!(queue(&r), vec![c.clone()]);
    assert!(
        r.cmd(&["ZSCORE", WAITERS, &b]).is_nil(),
        "b left the waiters set"
    );

    // try (join = 0) never enters the queue.
    let d = "d".repeat(32);
    assert_eq!(ints(&fair_acquire(&r, &d, false))[0], 0);
    assert_eq!(queue(&r), vec![c.clone()]);

    // A retried acquire by the holder gets its grant back.
    assert_eq!(ints(&fair_acquire(&r, &b, true))[0], 2);
}

#[test]
fn fair_acquire_purges_waiters_that_stopped_calling() {
    let r = RedisServer::start();
    let (dead, live) = ("d".repeat(32), "l".repeat(32));
    // A waiter whose deadline passed (it crashed) stands at the head of the line.
    r.cmd(&["RPUSH", QUEUE, &dead]);
    r.cmd(&["ZADD", WAITERS, &(server_ms(&r) - 1).to_string(), &dead]);
    assert_eq!(
        ints(&fair_acquire(&r, &live, true))[0],
        1,
        "the dead head is skipped"
    );
    assert!(queue(&r).is_empty());
    assert_eq!(r.cmd(&["ZCARD", WAITERS]).as_int(), Some(0));
}

#[test]
fn fair_scripts_never_touch_keys_of_a_wrong_type() {
    let r = RedisServer::start();
    r.cmd(&["SET", QUEUE, "not-a-list"]);
    let reply = fair_acquire(&r, MINE, true);
    assert_eq!(reply[0].as_int(), Some(-1));
    assert_eq!(reply[1].as_str(), Some(QUEUE));
    assert_eq!(r.cmd(&["EXISTS", LOCK]).as_int(), Some(0));
    assert_eq!(
        r.cmd(&["EVAL", FAIR_LEAVE, "3", LOCK, QUEUE, WAITERS, MINE, CHANNEL])
            .as_int(),
        Some(-2)
    );
    assert_eq!(r.cmd(&["GET", QUEUE]).as_str(), Some("not-a-list"));
}

#[test]
fn fair_release_and_leave_in_every_key_state() {
    let r = RedisServer::start();
    let release = |t: &str| {
        r.cmd(&["EVAL", FAIR_RELEASE, "3", LOCK, QUEUE, WAITERS, t, CHANNEL])
            .as_int()
            .unwrap()
    };
    let leave = |t: &str| {
        r.cmd(&["EVAL", FAIR_LEAVE, "3", LOCK, QUEUE, WAITERS, t, CHANNEL])
            .as_int()
            .unwrap()
    };
    assert_eq!(release(MINE), 0, "absent");
    fair_acquire(&r, THEIRS, true);
    assert_eq!(release(MINE), -1, "other token");
    fair_acquire(&r, MINE, true);
    assert_eq!(queue(&r), vec![MINE.to_owned()]);
    assert_eq!(leave(MINE), 1, "a waiter leaves the queue");
    assert!(queue(&r).is_empty());
    assert_eq!(r.cmd(&["ZCARD", WAITERS]).as_int(), Some(0));
    assert_eq!(leave(MINE), 0, "nothing left to remove");
    assert_eq!(release(THEIRS), 1, "own token");
    assert_eq!(r.cmd(&["EXISTS", LOCK]).as_int(), Some(0));

    // An acquire whose reply was lost, then abandoned: leave also drops the grant.
    fair_acquire(&r, MINE, true);
    assert_eq!(r.cmd(&["GET", LOCK]).as_str(), Some(MINE));
    assert_eq!(leave(MINE), 1);
    assert_eq!(r.cmd(&["EXISTS", LOCK]).as_int(), Some(0));
    r.cmd(&["HSET", LOCK, "f", "v"]);
    assert_eq!(release(MINE), -2, "wrong type");
}

#[test]
fn scripts_declare_keys_argv_and_reply_in_their_header() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scripts");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let header: String = text.lines().take_while(|l| l.starts_with("--")).collect();
        for needle in ["KEYS[", "ARGV[", "Reply"] {
            assert!(
                header.contains(needle),
                "{} header lacks {needle}",
                path.display()
            );
        }
        seen += 1;
    }
    assert!(seen >= 10, "found only {seen} scripts in {}", dir.display());
}

#[test]
fn renew_handles_a_batch_of_leases_in_mixed_states() {
    let r = RedisServer::start();
    let (a, b, c, d) = (
        "fencelock:{a}",
        "fencelock:{b}",
        "fencelock:{c}",
        "fencelock:{d}",
    );
    r.cmd(&["SET", a, MINE, "PX", "1000"]);
    r.cmd(&["SET", b, THEIRS, "PX", "1000"]);
    r.cmd(&["LPUSH", d, "x"]);
    let reply = r.cmd(&[
        "EVAL", RENEW, "4", a, b, c, d, MINE, "20000", MINE, "20000", MINE, "20000", MINE, "20000",
    ]);
    assert_eq!(ints(reply.as_array().unwrap()), vec![1, -1, 0, -2]);
    assert!(pttl(&r, a) > 19_000, "ours renewed");
    assert!(pttl(&r, b) <= 1_000, "theirs untouched");
    assert_eq!(
        r.cmd(&["EXISTS", c]).as_int(),
        Some(0),
        "absent stays absent"
    );
    assert_eq!(pttl(&r, d), -1, "the list untouched");
}

fn reentrant_acquire(r: &RedisServer, owner: &str, token: &str) -> Vec<i64> {
    let reply = r.cmd(&[
        "EVAL",
        REENTRANT_ACQUIRE,
        "2",
        LOCK,
        FENCE,
        owner,
        token,
        "10000",
    ]);
    ints(
        reply
            .as_array()
            .unwrap_or_else(|| panic!("replied {reply:?}")),
    )
}

fn reentrant_release(r: &RedisServer, owner: &str, token: &str) -> i64 {
    r.cmd(&["EVAL", REENTRANT_RELEASE, "1", LOCK, owner, token, CHANNEL])
        .as_int()
        .unwrap()
}

#[test]
fn reentrant_holds_count_per_owner_and_the_last_release_frees() {
    let r = RedisServer::start();
    let first = reentrant_acquire(&r, "job-7", MINE);
    assert_eq!(first[0], 1);
    let again = reentrant_acquire(&r, "job-7", THEIRS);
    assert_eq!(
        again,
        vec![2, first[1]],
        "a second hold, same fencing token"
    );
    assert_eq!(
        reentrant_acquire(&r, "job-7", THEIRS),
        vec![2, first[1]],
        "a retried hold is idempotent"
    );
    assert_eq!(
        r.cmd(&["HLEN", LOCK]).as_int(),
        Some(4),
        "owner, fence, two holds"
    );
    assert_eq!(
        reentrant_acquire(&r, "job-8", &"e".repeat(32))[0],
        0,
        "another owner waits"
    );
    // A plain caller sees the lock as held, and cannot release it.
    assert_eq!(acquire(&r, MINE, "1000")[0].as_int(), Some(0));
    assert_eq!(release(&r, MINE), -1);

    assert_eq!(reentrant_release(&r, "job-8", MINE), -1, "not the owner");
    assert_eq!(reentrant_release(&r, "job-7", MINE), 1);
    assert_eq!(r.cmd(&["EXISTS", LOCK]).as_int(), Some(1), "one hold left");
    assert_eq!(
        reentrant_release(&r, "job-7", MINE),
        -1,
        "that hold is gone already"
    );
    assert_eq!(reentrant_release(&r, "job-7", THEIRS), 1);
    assert_eq!(
        r.cmd(&["EXISTS", LOCK]).as_int(),
        Some(0),
        "the last hold freed it"
    );
    assert_eq!(reentrant_release(&r, "job-7", THEIRS), 0, "absent");

    // A renewal compares the owner id.
    reentrant_acquire(&r, "job-7", MINE);
    let reply = r.cmd(&["EVAL", RENEW, "1", LOCK, "job-7", "30000"]);
    assert_eq!(ints(reply.as_array().unwrap()), vec![1]);
    assert!(pttl(&r, LOCK) > 29_000);

    // A plain lock in the way: the reentrant caller waits; a foreign hash is refused.
    r.cmd(&["DEL", LOCK]);
    r.cmd(&["SET", LOCK, THEIRS, "PX", "5000"]);
    assert_eq!(reentrant_acquire(&r, "job-7", MINE)[0], 0);
    r.cmd(&["DEL", LOCK]);
    r.cmd(&["HSET", LOCK, "f", "v"]);
    let reply = r.cmd(&[
        "EVAL",
        REENTRANT_ACQUIRE,
        "2",
        LOCK,
        FENCE,
        "job-7",
        MINE,
        "10000",
    ]);
    assert_eq!(reply.as_array().unwrap()[0].as_int(), Some(-1));
    assert_eq!(
        r.cmd(&["HGETALL", LOCK]).as_array().unwrap().len(),
        2,
        "untouched"
    );
}
