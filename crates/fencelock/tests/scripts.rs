//! Every Lua script against every state its key can be in: absent, holding the caller's
//! token, holding another token, of a wrong type, expired. Scripts run with EVAL on a real
//! redis-server, exactly as the library sends them.

use testkit::{RedisServer, Reply};

const ACQUIRE: &str = include_str!("../src/scripts/acquire.lua");
const RELEASE: &str = include_str!("../src/scripts/release.lua");
const EXTEND: &str = include_str!("../src/scripts/extend.lua");

const LOCK: &str = "fencelock:{s}";
const FENCE: &str = "fencelock:{s}:fence";
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
    r.cmd(&["EVAL", RELEASE, "1", LOCK, token])
        .as_int()
        .expect("integer reply")
}

fn extend(r: &RedisServer, token: &str, ttl_ms: &str) -> i64 {
    r.cmd(&["EVAL", EXTEND, "1", LOCK, token, ttl_ms])
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

#[test]
fn scripts_declare_keys_argv_and_reply_in_their_header() {
    for (name, text) in [
        ("acquire", ACQUIRE),
        ("release", RELEASE),
        ("extend", EXTEND),
    ] {
        for needle in ["KEYS[1]", "ARGV[1]", "Reply"] {
            assert!(text.contains(needle), "{name}.lua header lacks {needle}");
        }
    }
}
