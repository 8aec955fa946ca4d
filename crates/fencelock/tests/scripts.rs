//! Every Lua script against every state its key can be in: absent, holding the caller's
//! token, holding another token, of a wrong type, expired. Scripts run with EVAL on a real
//! redis-server, exactly as the library sends them.

use std::sync::LazyLock;
use std::time::Duration;

use testkit::{RedisServer, Reply};

/// A script as the library sends it (its fragments in front), by file name.
fn source(name: &str) -> &'static str {
    static SCRIPTS: LazyLock<Vec<(&'static str, String)>> =
        LazyLock::new(|| fencelock::lua_scripts().collect());
    SCRIPTS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| s.as_str())
        .unwrap_or_else(|| panic!("no script {name}"))
}

static ACQUIRE: LazyLock<&str> = LazyLock::new(|| source("lock/acquire.lua"));
static RELEASE: LazyLock<&str> = LazyLock::new(|| source("lock/release.lua"));
static RENEW: LazyLock<&str> = LazyLock::new(|| source("lock/renew.lua"));
static REENTRANT_ACQUIRE: LazyLock<&str> = LazyLock::new(|| source("lock/reentrant_acquire.lua"));
static REENTRANT_RELEASE: LazyLock<&str> = LazyLock::new(|| source("lock/reentrant_release.lua"));
static FAIR_ACQUIRE: LazyLock<&str> = LazyLock::new(|| source("lock/fair_acquire.lua"));
static FAIR_RELEASE: LazyLock<&str> = LazyLock::new(|| source("lock/fair_release.lua"));
static FAIR_LEAVE: LazyLock<&str> = LazyLock::new(|| source("lock/fair_leave.lua"));

/// Asserts that `reply` is the wrong-type error every script returns, naming `key` and
/// the type found.
fn assert_wrong_type(reply: &Reply, key: &str, found: &str) {
    assert_eq!(
        reply.as_error(),
        Some(format!("FENCELOCK-WRONGTYPE {found} {key}").as_str()),
        "{reply:?}"
    );
}

const LOCK: &str = "fencelock:{s}";
const FENCE: &str = "fencelock:{s}:fence";
const QUEUE: &str = "fencelock:{s}:queue";
const WAITERS: &str = "fencelock:{s}:waiters";
const CHANNEL: &str = "fencelock:{s}:released";
const INFO: &str = "fencelock:{s}:holder";
const GRANTS: &str = "fencelock:{s}:grants";
/// The waiting client's own release channel (`fair_acquire.lua`'s ARGV[7]).
const OWN_CHANNEL: &str = "fencelock:{s}:released:0123456789abcdef";
const MINE: &str = "0123456789abcdef0123456789abcdef";
const THEIRS: &str = "ffffffffffffffffffffffffffffffff";

/// acquire.lua as one node uses it: counter + 1, no identity.
fn acquire_raw(r: &RedisServer, token: &str, ttl_ms: &str) -> Reply {
    r.cmd(&["EVAL", &ACQUIRE, "2", LOCK, FENCE, token, ttl_ms, "0"])
}

fn acquire(r: &RedisServer, token: &str, ttl_ms: &str) -> Vec<Reply> {
    let reply = acquire_raw(r, token, ttl_ms);
    reply
        .as_array()
        .unwrap_or_else(|| panic!("acquire replied {reply:?}"))
        .to_vec()
}

fn release_raw(r: &RedisServer, token: &str) -> Reply {
    r.cmd(&[
        "EVAL", &RELEASE, "3", LOCK, FENCE, INFO, token, CHANNEL, "0",
    ])
}

fn release(r: &RedisServer, token: &str) -> i64 {
    release_raw(r, token).as_int().expect("integer reply")
}

fn extend(r: &RedisServer, token: &str, ttl_ms: &str) -> i64 {
    // An extend is a renewal batch of one.
    let reply = r.cmd(&["EVAL", &RENEW, "2", LOCK, INFO, token, ttl_ms]);
    reply.as_array().expect("array reply")[0]
        .clone()
        .as_int()
        .expect("integer reply")
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
    let now_us = r.server_time().as_micros() as i64;
    assert!(
        reply[1] > now_us - 60_000_000 && reply[1] <= now_us,
        "{reply:?}"
    );
    assert_eq!(
        r.get(LOCK).as_deref(),
        Some(MINE),
        "the key is a plain string holding the token"
    );
    assert_eq!(r.get(FENCE), Some(reply[1].to_string()));
    let ttl = r.pttl(LOCK);
    assert!((9_000..=10_000).contains(&ttl), "PTTL {ttl}");
    assert_eq!(r.pttl(FENCE), -1, "the counter never expires");
}

#[test]
fn acquire_again_with_own_token_returns_the_same_grant_and_resets_ttl() {
    let r = RedisServer::start();
    let first = ints(&acquire(&r, MINE, "5000"));
    r.cmd(&["PEXPIRE", LOCK, "100"]);
    let again = ints(&acquire(&r, MINE, "5000"));
    assert_eq!(again, vec![2, first[1]], "same fence, flagged as a retry");
    assert_eq!(
        r.get(FENCE),
        Some(first[1].to_string()),
        "no second token minted"
    );
    assert!(r.pttl(LOCK) > 4_000, "expiry reset to the full TTL");
}

#[test]
fn acquire_again_with_own_token_after_counter_wipe_mints_a_higher_fence() {
    let r = RedisServer::start();
    // A counter ahead of the clock (another node's, say) goes up by one.
    let ahead = (r.server_time().as_micros() as i64 + 3_600_000_000).to_string();
    r.cmd(&["SET", FENCE, &ahead]);
    let first = ints(&acquire(&r, MINE, "5000"));
    assert_eq!(first, vec![1, ahead.parse::<i64>().unwrap() + 1]);
    r.cmd(&["DEL", FENCE]);
    let again = ints(&acquire(&r, MINE, "5000"));
    assert_eq!(again[0], 2);
    assert!(
        again[1] > r.server_time().as_micros() as i64 - 1_000_000,
        "{again:?}"
    );
}

#[test]
fn tokens_are_at_least_the_server_clock_so_a_counter_left_behind_cannot_lower_them() {
    // A replica promoted after missing the last grants holds an older counter: the
    // clock floor keeps the next token above every token granted before it.
    let r = RedisServer::start();
    let before = ints(&acquire(&r, THEIRS, "1"));
    testkit::eventually("the lock key expired", Duration::from_secs(5), || {
        !r.exists(LOCK)
    });
    r.cmd(&["SET", FENCE, "7"]); // the counter a stale replica would hold
    let after = ints(&acquire(&r, MINE, "10000"));
    assert!(after[1] > before[1], "{before:?} then {after:?}");
    let now_us = r.server_time().as_micros() as i64;
    assert!(
        after[1] <= now_us && after[1] > now_us - 60_000_000,
        "{after:?}"
    );
}

#[test]
fn acquire_on_key_held_by_another_reports_remaining_ttl_and_changes_nothing() {
    let r = RedisServer::start();
    r.cmd(&["SET", LOCK, THEIRS, "PX", "7000"]);
    r.cmd(&["SET", FENCE, "10"]);
    let reply = ints(&acquire(&r, MINE, "10000"));
    assert_eq!(reply[0], 0);
    assert!((6_000..=7_000).contains(&reply[1]), "{reply:?}");
    assert_eq!(r.get(LOCK).as_deref(), Some(THEIRS));
    assert_eq!(r.get(FENCE).as_deref(), Some("10"));

    // A foreign key without expiry reports -1: it will never free itself.
    r.cmd(&["SET", LOCK, "written-by-hand"]);
    assert_eq!(ints(&acquire(&r, MINE, "10000")), vec![0, -1]);
}

#[test]
fn acquire_after_expiry_takes_the_lock_with_a_higher_fence() {
    let r = RedisServer::start();
    let first = ints(&acquire(&r, THEIRS, "1"));
    testkit::eventually("the lock key expired", Duration::from_secs(5), || {
        !r.exists(LOCK)
    });
    let second = ints(&acquire(&r, MINE, "10000"));
    assert_eq!(second[0], 1);
    assert!(second[1] > first[1], "{first:?} then {second:?}");
    assert_eq!(r.get(LOCK).as_deref(), Some(MINE));
}

#[test]
fn acquire_never_overwrites_keys_of_a_wrong_type() {
    let r = RedisServer::start();
    r.cmd(&["HSET", LOCK, "f", "v"]);
    assert_wrong_type(&acquire_raw(&r, MINE, "10000"), LOCK, "hash");
    assert_eq!(
        r.cmd(&["HGET", LOCK, "f"]).as_str(),
        Some("v"),
        "hash untouched"
    );
    assert!(!r.exists(FENCE), "no counter written");

    // A counter of the wrong type is caught before the lock key is written, so a Lua
    // error can never leave a lock behind that nobody was granted.
    let r = RedisServer::start();
    r.cmd(&["RPUSH", FENCE, "x"]);
    assert_wrong_type(&acquire_raw(&r, MINE, "10000"), FENCE, "list");
    assert!(!r.exists(LOCK), "lock not taken");

    for bad in ["abc", "-5", "1.5", "9999999999999999999"] {
        r.cmd(&["DEL", FENCE]);
        r.cmd(&["SET", FENCE, bad]);
        assert_wrong_type(&acquire_raw(&r, MINE, "10000"), FENCE, "string");
        assert_eq!(r.get(FENCE).as_deref(), Some(bad), "counter untouched");
        assert!(!r.exists(LOCK), "lock not taken");
    }
}

#[test]
fn release_in_every_key_state() {
    let r = RedisServer::start();
    assert_eq!(release(&r, MINE), 0, "absent");

    acquire(&r, MINE, "10000");
    assert_eq!(release(&r, MINE), 1, "own token");
    assert!(!r.exists(LOCK));
    assert!(r.get(FENCE).is_some(), "the counter survives release");

    r.cmd(&["SET", LOCK, THEIRS, "PX", "10000"]);
    assert_eq!(release(&r, MINE), -1, "other token");
    assert_eq!(
        r.get(LOCK).as_deref(),
        Some(THEIRS),
        "other's lock untouched"
    );

    r.cmd(&["DEL", LOCK]);
    r.cmd(&["HSET", LOCK, "f", "v"]);
    assert_wrong_type(&release_raw(&r, MINE), LOCK, "hash");
    assert_eq!(r.cmd(&["HGET", LOCK, "f"]).as_str(), Some("v"));

    r.cmd(&["DEL", LOCK]);
    acquire(&r, MINE, "1");
    testkit::eventually("the lock key expired", Duration::from_secs(5), || {
        !r.exists(LOCK)
    });
    assert_eq!(release(&r, MINE), 0, "expired");
}

#[test]
fn extend_in_every_key_state_and_never_recreates() {
    let r = RedisServer::start();
    assert_eq!(extend(&r, MINE, "10000"), 0, "absent");
    assert!(!r.exists(LOCK), "extend never creates the key");

    acquire(&r, MINE, "1000");
    assert_eq!(extend(&r, MINE, "20000"), 1, "own token");
    assert!(r.pttl(LOCK) > 19_000);
    assert_eq!(r.get(LOCK).as_deref(), Some(MINE));

    r.cmd(&["SET", LOCK, THEIRS, "PX", "5000"]);
    assert_eq!(extend(&r, MINE, "20000"), -1, "other token");
    assert!(r.pttl(LOCK) <= 5_000, "other's expiry untouched");

    r.cmd(&["DEL", LOCK]);
    r.cmd(&["LPUSH", LOCK, "x"]);
    assert_eq!(extend(&r, MINE, "20000"), -1, "not ours: a wrong type");
    assert_eq!(r.pttl(LOCK), -1, "list untouched");

    r.cmd(&["DEL", LOCK]);
    acquire(&r, MINE, "1");
    testkit::eventually("the lock key expired", Duration::from_secs(5), || {
        !r.exists(LOCK)
    });
    assert_eq!(extend(&r, MINE, "20000"), 0, "expired");
    assert!(!r.exists(LOCK), "expired lease stays lost");
}

fn fair_acquire_raw(r: &RedisServer, token: &str, join: bool) -> Reply {
    let join = if join { "1" } else { "0" };
    r.cmd(&[
        "EVAL",
        &FAIR_ACQUIRE,
        "6",
        LOCK,
        FENCE,
        QUEUE,
        WAITERS,
        INFO,
        GRANTS,
        token,
        "10000",
        "3000",
        CHANNEL,
        join,
        "",
        OWN_CHANNEL,
    ])
}

/// fair_acquire.lua's reply as an array: its grant of a lock that nobody held or waited
/// for, a bare integer, as {1, token} (as the library decodes it).
fn fair_acquire(r: &RedisServer, token: &str, join: bool) -> Vec<Reply> {
    let reply = fair_acquire_raw(r, token, join);
    if let Some(fence) = reply.as_int() {
        return vec![Reply::Int(1), Reply::Int(fence)];
    }
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

fn fair_release_raw(r: &RedisServer, token: &str) -> Reply {
    r.cmd(&[
        "EVAL",
        &FAIR_RELEASE,
        "6",
        LOCK,
        QUEUE,
        WAITERS,
        INFO,
        FENCE,
        GRANTS,
        token,
        CHANNEL,
    ])
}

fn fair_release(r: &RedisServer, token: &str) -> i64 {
    fair_release_raw(r, token).as_int().expect("integer reply")
}

fn fair_leave_raw(r: &RedisServer, token: &str) -> Reply {
    r.cmd(&[
        "EVAL",
        &FAIR_LEAVE,
        "5",
        LOCK,
        QUEUE,
        WAITERS,
        INFO,
        GRANTS,
        token,
        CHANNEL,
    ])
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
    let now = r.server_time().as_millis() as i64;
    assert!(
        (now + 2_000..=now + 3_000).contains(&deadline),
        "deadline {deadline}, now {now}"
    );

    // Calling again keeps the place (no duplicate entry).
    fair_acquire(&r, &c, true);
    assert_eq!(queue(&r), vec![b.clone(), c.clone()]);

    // Released: it is b's turn; c may not take the free lock ahead of b.
    r.cmd(&["DEL", LOCK]);
    let counter: i64 = r.get(FENCE).unwrap().parse().unwrap();
    assert_eq!(
        ints(&fair_acquire(&r, &c, true)),
        vec![0, -2, counter],
        "not yet, and the counter now"
    );
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
    r.cmd(&[
        "ZADD",
        WAITERS,
        &(r.server_time().as_millis() as i64 - 1).to_string(),
        &dead,
    ]);
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
    let fair = |join| fair_acquire_raw(&r, MINE, join);
    assert_wrong_type(&fair(true), QUEUE, "string");
    assert!(!r.exists(LOCK));
    assert_wrong_type(&fair_leave_raw(&r, MINE), QUEUE, "string");
    assert_eq!(r.get(QUEUE).as_deref(), Some("not-a-list"));
    r.cmd(&["DEL", QUEUE]);
    r.cmd(&["SET", GRANTS, "not-a-hash"]);
    assert_wrong_type(&fair(true), GRANTS, "string");
    assert!(!r.exists(LOCK));
    assert_eq!(r.get(GRANTS).as_deref(), Some("not-a-hash"));
    r.cmd(&["DEL", GRANTS]);
    r.cmd(&["SET", WAITERS, "not-a-zset"]);
    assert_wrong_type(&fair(true), WAITERS, "string");
    assert!(!r.exists(LOCK));
    assert!(!r.exists(QUEUE));
    assert_eq!(r.get(WAITERS).as_deref(), Some("not-a-zset"));
}

#[test]
fn fair_release_and_leave_in_every_key_state() {
    let r = RedisServer::start();
    let release = |t: &str| fair_release(&r, t);
    let leave = |t: &str| fair_leave_raw(&r, t).as_int().unwrap();
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
    assert!(!r.exists(LOCK));

    // An acquire whose reply was lost, then abandoned: leave also drops the grant.
    fair_acquire(&r, MINE, true);
    assert_eq!(r.get(LOCK).as_deref(), Some(MINE));
    assert_eq!(leave(MINE), 1);
    assert!(!r.exists(LOCK));
    r.cmd(&["HSET", LOCK, "f", "v"]);
    assert_wrong_type(&fair_release_raw(&r, MINE), LOCK, "hash");
    r.cmd(&["DEL", LOCK]);

    // Queue keys of another type: released, and nobody is woken through them.
    for key in [QUEUE, WAITERS, GRANTS] {
        fair_acquire(&r, THEIRS, true);
        fair_acquire(&r, MINE, true);
        r.cmd(&["DEL", key]);
        r.cmd(&["SET", key, "not ours"]);
        assert_eq!(release(THEIRS), 1, "released with {key} of another type");
        assert!(!r.exists(LOCK), "not handed on through {key}");
        assert_eq!(r.get(key).as_deref(), Some("not ours"));
        r.cmd(&["DEL", QUEUE, WAITERS, GRANTS]);
    }
}

#[test]
fn fair_release_hands_the_lock_to_the_head_of_the_queue() {
    let r = RedisServer::start();
    let client = redis::Client::open(r.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let mut messages = conn.as_pubsub();
    messages.subscribe(&[CHANNEL, OWN_CHANNEL]).unwrap();
    messages
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let release = |t: &str| fair_release(&r, t);
    let (dead, next, old) = ("d".repeat(32), "n".repeat(32), "o".repeat(32));
    assert_eq!(ints(&fair_acquire(&r, THEIRS, true))[0], 1);
    // In line: a waiter that crashed (its deadline passed; put at the head after the
    // live one's call, which would have purged it), then a live one, then one of a
    // client that registers no grant (an older fencelock).
    assert_eq!(ints(&fair_acquire(&r, &next, true))[0], 0);
    r.cmd(&["LPUSH", QUEUE, &dead]);
    r.cmd(&[
        "ZADD",
        WAITERS,
        &(r.server_time().as_millis() as i64 - 1).to_string(),
        &dead,
    ]);
    r.cmd(&["HSET", GRANTS, &dead, &format!("10000 {OWN_CHANNEL} ")]);
    r.cmd(&["RPUSH", QUEUE, &old]);
    r.cmd(&[
        "ZADD",
        WAITERS,
        &(r.server_time().as_millis() as i64 + 3000).to_string(),
        &old,
    ]);
    let before: u64 = r.get(FENCE).unwrap().parse().unwrap();

    assert_eq!(release(THEIRS), 1);
    assert_eq!(
        r.get(LOCK).as_deref(),
        Some(next.as_str()),
        "handed to the live head"
    );
    let fence: u64 = r.get(FENCE).unwrap().parse().unwrap();
    assert!(
        fence > before,
        "a new fencing token: {fence} after {before}"
    );
    // Its lease ends at its own deadline to call again (3 s after its call), not after
    // its 10 s TTL: a head that crashed since holds the queue up no longer than that.
    let pttl = r.cmd(&["PTTL", LOCK]).as_int().unwrap();
    assert!((1..=3000).contains(&pttl), "PTTL {pttl}");
    assert_eq!(
        queue(&r),
        vec![old.clone()],
        "the head and the dead waiter left"
    );
    assert_eq!(r.cmd(&["HLEN", GRANTS]).as_int(), Some(0));
    // Told on its client's own channel only.
    let message = messages.get_message().unwrap();
    assert_eq!(message.get_channel_name(), OWN_CHANNEL);
    let message: String = message.get_payload().unwrap();
    let fields: Vec<&str> = message.split(' ').collect();
    assert_eq!(
        fields[..3],
        ["G", next.as_str(), fence.to_string().as_str()]
    );
    let px: i64 = fields[3].parse().unwrap();
    assert!(pttl <= px && px <= 3000, "PX {px}, PTTL {pttl}");
    // The new holder took the lease: a retried acquire finds it (and renews it).
    assert_eq!(ints(&fair_acquire(&r, &next, true)), vec![2, fence as i64]);

    // Its release finds a head with no grant registered: that one is told its turn and
    // takes the lock by its own call.
    assert_eq!(release(&next), 1);
    assert!(!r.exists(LOCK));
    let message = messages.get_message().unwrap();
    assert_eq!(message.get_channel_name(), CHANNEL);
    let message: String = message.get_payload().unwrap();
    assert_eq!(message, old);
    assert_eq!(ints(&fair_acquire(&r, &old, true))[0], 1);
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
        "EVAL", &RENEW, "8", a, "ia", b, "ib", c, "ic", d, "id", MINE, "20000", MINE, "20000",
        MINE, "20000", MINE, "20000",
    ]);
    assert_eq!(ints(reply.as_array().unwrap()), vec![1, -1, 0, -1]);
    assert!(r.pttl(a) > 19_000, "ours renewed");
    assert!(r.pttl(b) <= 1_000, "theirs untouched");
    assert!(!r.exists(c), "absent stays absent");
    assert_eq!(r.pttl(d), -1, "the list untouched");
}

fn reentrant_acquire(r: &RedisServer, owner: &str, token: &str) -> Vec<i64> {
    let reply = r.cmd(&[
        "EVAL",
        &REENTRANT_ACQUIRE,
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
    r.cmd(&["EVAL", &REENTRANT_RELEASE, "1", LOCK, owner, token, CHANNEL])
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
    assert!(r.exists(LOCK), "one hold left");
    assert_eq!(
        reentrant_release(&r, "job-7", MINE),
        -1,
        "that hold is gone already"
    );
    assert_eq!(reentrant_release(&r, "job-7", THEIRS), 1);
    assert!(!r.exists(LOCK), "the last hold freed it");
    assert_eq!(reentrant_release(&r, "job-7", THEIRS), 0, "absent");

    // A renewal compares the owner id.
    reentrant_acquire(&r, "job-7", MINE);
    let reply = r.cmd(&["EVAL", &RENEW, "2", LOCK, INFO, "job-7", "30000"]);
    assert_eq!(ints(reply.as_array().unwrap()), vec![1]);
    assert!(r.pttl(LOCK) > 29_000);

    // A plain lock in the way: the reentrant caller waits; a foreign hash is refused.
    r.cmd(&["DEL", LOCK]);
    r.cmd(&["SET", LOCK, THEIRS, "PX", "5000"]);
    assert_eq!(reentrant_acquire(&r, "job-7", MINE)[0], 0);
    r.cmd(&["DEL", LOCK]);
    r.cmd(&["HSET", LOCK, "f", "v"]);
    let reply = r.cmd(&[
        "EVAL",
        &REENTRANT_ACQUIRE,
        "2",
        LOCK,
        FENCE,
        "job-7",
        MINE,
        "10000",
    ]);
    assert_wrong_type(&reply, LOCK, "hash");
    assert_eq!(
        r.cmd(&["HGETALL", LOCK]).as_array().unwrap().len(),
        2,
        "untouched"
    );
}

#[test]
fn a_redlock_node_floors_tokens_at_its_clock_says_who_it_is_and_raises_its_counter() {
    let r = RedisServer::start();
    r.cmd(&["SET", FENCE, "5"]);
    let reply = r.cmd(&["EVAL", &ACQUIRE, "2", LOCK, FENCE, MINE, "10000", "1"]);
    let items = reply.as_array().unwrap();
    assert_eq!(items.len(), 4, "{reply:?}");
    assert_eq!(items[0].as_int(), Some(1));
    let now_us = r.server_time().as_micros() as i64;
    let fence = items[1].as_int().unwrap();
    assert!(
        fence > now_us - 60_000_000 && fence <= now_us,
        "the token is at least the clock: {fence} vs {now_us}"
    );
    let run_id = r.info_field("server", "run_id").unwrap();
    assert_eq!(items[2].as_str(), Some(run_id.as_str()));
    assert!(items[3].as_int().unwrap() >= 0);

    // Released by a Redlock holder whose grant carried a higher token (from another
    // node): the counter is raised to it, whoever holds the key.
    let higher = (fence + 1_000_000).to_string();
    let released = r.cmd(&[
        "EVAL", &RELEASE, "3", LOCK, FENCE, INFO, MINE, CHANNEL, &higher,
    ]);
    assert_eq!(released.as_int(), Some(1));
    assert_eq!(r.get(FENCE), Some(higher.clone()));
    let lower = r.cmd(&["EVAL", &RELEASE, "3", LOCK, FENCE, INFO, MINE, CHANNEL, "7"]);
    assert_eq!(lower.as_int(), Some(0), "absent now");
    assert_eq!(r.get(FENCE), Some(higher), "never lowered");
}

#[test]
fn holder_info_lives_and_dies_with_the_lease() {
    let r = RedisServer::start();
    let info = r#"{"host":"h","pid":7}"#;
    let acquired = r.cmd(&[
        "EVAL", &ACQUIRE, "3", LOCK, FENCE, INFO, MINE, "5000", "0", info,
    ]);
    assert_eq!(acquired.as_array().unwrap()[0].as_int(), Some(1));
    assert_eq!(r.get(INFO).as_deref(), Some(info));
    assert!(
        (1..=5000).contains(&r.pttl(INFO)),
        "with the lease's expiry"
    );
    // Renewed with the lease, and only for its holder.
    r.cmd(&["PEXPIRE", INFO, "100"]);
    assert_eq!(extend(&r, MINE, "20000"), 1);
    assert!(r.pttl(INFO) > 19_000);
    // Not written for another holder, nor when the lock is held.
    assert_eq!(ints(&acquire(&r, THEIRS, "5000"))[0], 0);
    assert_eq!(r.get(INFO).as_deref(), Some(info));
    // Deleted with the lock.
    assert_eq!(release(&r, MINE), 1);
    assert_eq!(r.cmd(&["EXISTS", INFO]).as_int(), Some(0));
}

static SEMAPHORE_ACQUIRE: LazyLock<&str> = LazyLock::new(|| source("semaphore/acquire.lua"));
const PERMITS: &str = "fencelock:{s}:permits";
const WAKES: &str = "fencelock:{s}:wakes";

/// semaphore/acquire.lua, a semaphore of 2 permits, not fair; `tag`: a waiting
/// acquire's client, listed when refused.
fn permit_raw(r: &RedisServer, token: &str, tag: &str) -> Reply {
    r.cmd(&[
        "EVAL",
        &SEMAPHORE_ACQUIRE,
        "6",
        LOCK,
        FENCE,
        PERMITS,
        QUEUE,
        WAITERS,
        WAKES,
        token,
        "10000",
        "2",
        "0",
        "0",
        "0",
        "",
        tag,
        "500",
        "0",
        "0",
    ])
}

fn permit(r: &RedisServer, token: &str, tag: &str) -> Vec<i64> {
    let reply = permit_raw(r, token, tag);
    ints(reply.as_array().unwrap_or_else(|| panic!("{reply:?}")))
}

#[test]
fn semaphore_acquire_grants_retries_refuses_and_lists_the_refused_client() {
    let r = RedisServer::start();
    let first = permit(&r, MINE, "");
    assert_eq!(first[0], 1, "granted: {first:?}");
    assert_eq!(r.cmd(&["ZCARD", LOCK]).as_int(), Some(1));
    let pttl = r.cmd(&["PTTL", LOCK]).as_int().unwrap();
    assert!(
        (9_000..=10_000).contains(&pttl),
        "the set lives with the lease: {pttl}"
    );
    assert_eq!(r.get(PERMITS).as_deref(), Some("2"));
    // The same token again (a retry whose first reply was lost): the same grant.
    assert_eq!(permit(&r, MINE, ""), vec![2, first[1]]);
    assert_eq!(r.cmd(&["ZCARD", LOCK]).as_int(), Some(1));

    let second = permit(&r, THEIRS, "");
    assert_eq!(second[0], 1);
    assert!(second[1] > first[1], "a higher token: {second:?}");
    // Full: refused with the time until the first lease ends, and the waiting client
    // listed; nothing else written.
    let third = "11111111111111111111111111111111";
    let refused = permit(&r, third, "0123456789abcdef");
    assert_eq!((refused[0], refused[2]), (3, 2), "{refused:?}");
    assert!((9_000..=10_000).contains(&refused[1]), "{refused:?}");
    assert_eq!(r.cmd(&["ZCARD", LOCK]).as_int(), Some(2));
    assert_eq!(
        r.cmd(&["ZRANGE", WAKES, "0", "-1"])
            .as_array()
            .map(<[Reply]>::len),
        Some(1)
    );
    let wakes_ttl = r.cmd(&["PTTL", WAKES]).as_int().unwrap();
    assert!(
        (9_000..=10_500).contains(&wakes_ttl),
        "the listing lasts until the first lease ends and its margin: {wakes_ttl}"
    );
}

#[test]
fn semaphore_acquire_never_writes_over_keys_of_a_wrong_type() {
    for (key, setup, found) in [
        (LOCK, ["SET", LOCK, "x"], "string"),
        (PERMITS, ["RPUSH", PERMITS, "x"], "list"),
        (FENCE, ["HSET", FENCE, "f"], "hash"),
    ] {
        let r = RedisServer::start();
        if setup[0] == "HSET" {
            r.cmd(&["HSET", FENCE, "f", "v"]);
        } else {
            r.cmd(&setup);
        }
        assert_wrong_type(&permit_raw(&r, MINE, "0123456789abcdef"), key, found);
        assert_eq!(r.cmd(&["DBSIZE"]).as_int(), Some(1), "only {key} there");
    }
    // A read-write lock's readers.
    let r = RedisServer::start();
    r.cmd(&["ZADD", LOCK, "+inf", "rwlock"]);
    assert_wrong_type(&permit_raw(&r, MINE, "0123456789abcdef"), LOCK, "readers");
    assert_eq!(r.cmd(&["ZCARD", LOCK]).as_int(), Some(1));
    assert_eq!(r.cmd(&["DBSIZE"]).as_int(), Some(1));
}

/// How many `PUBLISH`es the server ran (from scripts too), from `INFO commandstats`.
fn publishes(r: &RedisServer) -> u64 {
    r.info_field("commandstats", "cmdstat_publish")
        .map_or(0, |stats| {
            let calls = stats.strip_prefix("calls=").expect("calls= first");
            calls.split(',').next().unwrap().parse().unwrap()
        })
}

/// release.lua as the library sends it: with the wake list.
fn release_listed(r: &RedisServer, token: &str) -> i64 {
    r.cmd(&[
        "EVAL", &RELEASE, "4", LOCK, FENCE, INFO, WAKES, token, CHANNEL, "0",
    ])
    .as_int()
    .expect("integer reply")
}

/// acquire.lua for a waiting acquire whose client is listed as `tag` when refused.
fn acquire_listed(r: &RedisServer, token: &str, tag: &str) -> Vec<i64> {
    let reply = r.cmd(&[
        "EVAL",
        &ACQUIRE,
        "5",
        LOCK,
        FENCE,
        INFO,
        "fencelock:{s}:writers",
        WAKES,
        token,
        "10000",
        "0",
        "",
        "0",
        "1",
        "0",
        tag,
        "500",
        "0",
        "0",
    ]);
    ints(reply.as_array().unwrap_or_else(|| panic!("{reply:?}")))
}

fn wakes(r: &RedisServer) -> Vec<String> {
    r.cmd(&["ZRANGE", WAKES, "0", "-1"])
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_release_announces_itself_only_when_someone_may_listen() {
    let r = RedisServer::start();
    let cycle = |release: &dyn Fn() -> i64| {
        assert_eq!(acquire(&r, MINE, "10000")[0].as_int(), Some(1));
        let before = publishes(&r);
        assert_eq!(release(), 1);
        publishes(&r) - before
    };
    // Nobody listed (the list key absent): nobody waits, nothing is published.
    assert_eq!(cycle(&|| release_listed(&r, MINE)), 0, "uncontended");
    // '*' listed (a waiter that hears releases only on the lock's channel): the
    // release is announced there, and '*' is taken off.
    r.cmd(&["ZADD", WAKES, "1", "*"]);
    assert_eq!(cycle(&|| release_listed(&r, MINE)), 1, "'*' listed");
    assert!(!r.exists(WAKES));
    // A listed client that nobody listens for: its own channel, then the lock's.
    r.cmd(&["ZADD", WAKES, "1", "0123456789abcdef"]);
    assert_eq!(
        cycle(&|| release_listed(&r, MINE)),
        2,
        "listed clients all gone"
    );
    // A list of another type, and no list key at all: the lock's channel.
    r.cmd(&["SET", WAKES, "x"]);
    assert_eq!(
        cycle(&|| release_listed(&r, MINE)),
        1,
        "a list of another type"
    );
    r.cmd(&["DEL", WAKES]);
    assert_eq!(cycle(&|| release(&r, MINE)), 1, "no list key given");
}

#[test]
fn a_waiter_listed_as_everyone_stays_listed_until_a_release() {
    let r = RedisServer::start();
    assert_eq!(acquire(&r, THEIRS, "10000")[0].as_int(), Some(1));
    // Refused, a waiter that is not heard by name lists '*', for the holder's lease and
    // the margin.
    assert_eq!(acquire_listed(&r, MINE, "*")[0], 0);
    assert_eq!(wakes(&r), ["*"]);
    let ttl = r.pttl(WAKES);
    assert!((10_000..=10_500).contains(&ttl), "PTTL {ttl}");
    // Its grant leaves '*' (others may have listed it: a reader, a fair waiter).
    r.cmd(&["DEL", LOCK]);
    assert_eq!(acquire_listed(&r, MINE, "*")[0], 1);
    assert_eq!(wakes(&r), ["*"], "a grant leaves '*'");
    // The release wakes every client, and takes it off.
    let before = publishes(&r);
    assert_eq!(release_listed(&r, MINE), 1);
    assert_eq!(publishes(&r), before + 1);
    assert!(!r.exists(WAKES));
}

#[test]
fn a_fair_waiter_refused_by_a_plain_holder_lists_everyone() {
    let r = RedisServer::start();
    assert_eq!(acquire(&r, THEIRS, "10000")[0].as_int(), Some(1));
    let wait = |token: &str| {
        let reply = r.cmd(&[
            "EVAL",
            &FAIR_ACQUIRE,
            "7",
            LOCK,
            FENCE,
            QUEUE,
            WAITERS,
            INFO,
            GRANTS,
            WAKES,
            token,
            "10000",
            "3000",
            CHANNEL,
            "1",
            "",
            OWN_CHANNEL,
            "0",
            "500",
        ]);
        let reply = ints(reply.as_array().unwrap_or_else(|| panic!("{reply:?}")));
        assert_eq!(reply[0], 0, "{reply:?}");
    };
    wait(MINE);
    assert_eq!(queue(&r), [MINE], "queued");
    assert_eq!(wakes(&r), ["*"], "and, first in line, listed as '*'");
    let ttl = r.pttl(WAKES);
    assert!((10_000..=10_500).contains(&ttl), "PTTL {ttl}");
    // Only the head can take the lock when it is free: a waiter behind it lists nothing.
    r.cmd(&["DEL", WAKES]);
    let second = "22222222222222222222222222222222";
    wait(second);
    assert_eq!(queue(&r), [MINE, second]);
    assert!(!r.exists(WAKES), "not first: not listed");
    wait(MINE);
    assert_eq!(wakes(&r), ["*"], "the head listed again");
    // The plain holder's release wakes every client: the fair waiter among them.
    let before = publishes(&r);
    assert_eq!(release_listed(&r, THEIRS), 1);
    assert_eq!(publishes(&r), before + 1);
}

static TAKE: LazyLock<&str> = LazyLock::new(|| source("lock/take.lua"));
const WRITERS: &str = "fencelock:{s}:writers";

/// The lock's keys as a comparable text: each key's type and contents (ZSET members
/// without their scores, which are times; a counter minted from the clock as "clock").
fn lock_keys(r: &RedisServer, ahead: i64) -> Vec<String> {
    let mut out = Vec::new();
    for key in [LOCK, FENCE, WRITERS] {
        let kind = r.cmd(&["TYPE", key]).as_str().unwrap_or("?").to_owned();
        let value = match kind.as_str() {
            "string" => match r.get(key).and_then(|v| v.parse::<i64>().ok()) {
                Some(n) if n > 1_000_000_000_000 && n != ahead && n != ahead + 1 => {
                    "clock".to_owned()
                }
                _ => format!("{:?}", r.get(key)),
            },
            "hash" => format!("{:?}", r.cmd(&["HGETALL", key])),
            "zset" | "list" => {
                let read = if kind == "zset" { "ZRANGE" } else { "LRANGE" };
                format!("{:?}", r.cmd(&[read, key, "0", "-1"]))
            }
            _ => String::new(),
        };
        out.push(format!("{key} {kind} {value}"));
    }
    out
}

/// A reply with its times rounded away: a PTTL or a wait to the second, a token minted
/// from the clock as "clock"; take.lua's bare token as acquire.lua's {1, token}.
fn comparable(reply: &Reply, ahead: i64) -> String {
    let norm = |n: i64| {
        if n > 1_000_000_000_000 && n != ahead && n != ahead + 1 {
            "clock".to_owned()
        } else if n > 100 {
            format!("~{}s", (n + 500) / 1000)
        } else {
            n.to_string()
        }
    };
    match (reply.as_int(), reply.as_array()) {
        (Some(n), _) => format!("[1, {}]", norm(n)),
        (None, Some(items)) => {
            let items: Vec<String> = items
                .iter()
                .map(|i| i.as_int().map_or_else(|| format!("{i:?}"), norm))
                .collect();
            format!("[{}]", items.join(", "))
        }
        _ => format!("{reply:?}"),
    }
}

/// A fast path's reply and the keys it left (`fast`) are the full path's (`full`) in
/// the key state and variant `case` names; in the state "free", its grant is a bare
/// integer, the token after the counter `ahead`.
fn assert_as_full_path(
    (state, variant): (&str, String),
    fast: (&Reply, Vec<String>),
    full: (&Reply, Vec<String>),
    ahead: i64,
) {
    assert_eq!(
        comparable(fast.0, ahead),
        comparable(full.0, ahead),
        "{state}, {variant}: the reply"
    );
    assert_eq!(fast.1, full.1, "{state}, {variant}: the keys");
    if state == "free" {
        assert_eq!(fast.0.as_int(), Some(ahead + 1), "a bare integer");
    }
}

/// How a state of the lock's keys is made.
type SetUp<'a> = Box<dyn Fn(&RedisServer) + 'a>;

/// take.lua answers and writes what acquire.lua does for the attempts it serves (one
/// node, no holder info, not listed, never queued among writers; waiting or not), in
/// every state the lock's keys can be in; its grant alone is a bare integer.
#[test]
fn take_answers_and_writes_as_acquire_does_in_every_key_state() {
    let r = RedisServer::start();
    let ahead = r.server_time().as_micros() as i64 + 3_600_000_000;
    let ahead_text = ahead.to_string();
    let counter = |r: &RedisServer| {
        r.cmd(&["SET", FENCE, &ahead_text]);
    };
    let states: Vec<(&str, SetUp<'_>)> = vec![
        ("free", Box::new(counter)),
        ("free, no counter", Box::new(|_: &RedisServer| {})),
        (
            "mine",
            Box::new(move |r: &RedisServer| {
                counter(r);
                r.cmd(&["SET", LOCK, MINE, "PX", "3000"]);
            }),
        ),
        (
            "mine, counter wiped",
            Box::new(|r: &RedisServer| {
                r.cmd(&["SET", LOCK, MINE, "PX", "3000"]);
            }),
        ),
        (
            "theirs",
            Box::new(move |r: &RedisServer| {
                counter(r);
                r.cmd(&["SET", LOCK, THEIRS, "PX", "7000"]);
            }),
        ),
        (
            "theirs, no expiry",
            Box::new(|r: &RedisServer| {
                r.cmd(&["SET", LOCK, THEIRS]);
            }),
        ),
        (
            "a reentrant holder",
            Box::new(|r: &RedisServer| {
                r.cmd(&["HSET", LOCK, "owner", "job", "fence", "5"]);
                r.cmd(&["PEXPIRE", LOCK, "4000"]);
            }),
        ),
        (
            "a hash of someone else's",
            Box::new(|r: &RedisServer| {
                r.cmd(&["HSET", LOCK, "f", "v"]);
            }),
        ),
        (
            "a semaphore's permits",
            Box::new(|r: &RedisServer| {
                r.cmd(&["ZADD", LOCK, "99999999999999", MINE]);
            }),
        ),
        (
            "readers",
            Box::new(move |r: &RedisServer| {
                counter(r);
                r.cmd(&["ZADD", LOCK, "+inf", "rwlock", "99999999999999", THEIRS]);
            }),
        ),
        (
            "readers whose leases ended",
            Box::new(move |r: &RedisServer| {
                counter(r);
                r.cmd(&["ZADD", LOCK, "+inf", "rwlock", "1", THEIRS]);
            }),
        ),
        (
            "readers, writers of another type",
            Box::new(|r: &RedisServer| {
                r.cmd(&["ZADD", LOCK, "+inf", "rwlock", "99999999999999", THEIRS]);
                r.cmd(&["SET", WRITERS, "x"]);
            }),
        ),
        (
            "a counter of another type",
            Box::new(|r: &RedisServer| {
                r.cmd(&["RPUSH", FENCE, "x"]);
            }),
        ),
        (
            "a counter that is no number",
            Box::new(|r: &RedisServer| {
                r.cmd(&["SET", FENCE, "12ab"]);
            }),
        ),
        (
            "a counter too long",
            Box::new(|r: &RedisServer| {
                r.cmd(&["SET", FENCE, "9999999999999999999"]);
            }),
        ),
        (
            "a semaphore's counter",
            Box::new(|r: &RedisServer| {
                r.cmd(&["SET", FENCE, "s12"]);
            }),
        ),
    ];
    for (state, set_up) in &states {
        for join in [false, true] {
            // Not waiting, take.lua is not given the writers' key, so it does not see
            // it is of another type; it refuses for the readers, writing nothing.
            if !join && *state == "readers, writers of another type" {
                continue;
            }
            let join_flag = if join { "1" } else { "0" };
            r.cmd(&["FLUSHALL"]);
            set_up(&r);
            let general = r.cmd(&[
                "EVAL", &ACQUIRE, "4", LOCK, FENCE, INFO, WRITERS, MINE, "10000", "0", "", "0",
                join_flag, "0",
            ]);
            let general_keys = lock_keys(&r, ahead);
            r.cmd(&["FLUSHALL"]);
            set_up(&r);
            let take = if join {
                r.cmd(&["EVAL", &TAKE, "3", LOCK, FENCE, WRITERS, MINE, "10000", "0"])
            } else {
                r.cmd(&["EVAL", &TAKE, "2", LOCK, FENCE, MINE, "10000", "0"])
            };
            let case = (*state, format!("waiting {join}"));
            let keys = lock_keys(&r, ahead);
            assert_as_full_path(case, (&take, keys), (&general, general_keys), ahead);
        }
    }
}

static READ_RELEASE: LazyLock<&str> = LazyLock::new(|| source("rwlock/read_release.lua"));

/// The last reader's release announces itself only when someone may wait for it: a
/// writer waiting among the writers, or a client listed on the wake list.
#[test]
fn the_last_readers_release_announces_itself_only_when_someone_may_wait() {
    let r = RedisServer::start();
    let far = (r.server_time().as_millis() as u64 + 60_000).to_string();
    let release = |keys: &[&str]| {
        r.cmd(&["ZADD", LOCK, "+inf", "rwlock", &far, MINE]);
        let before = publishes(&r);
        let mut args = vec!["EVAL", *READ_RELEASE];
        let n = keys.len().to_string();
        args.push(&n);
        args.extend_from_slice(keys);
        args.extend_from_slice(&[MINE, CHANNEL]);
        assert_eq!(r.cmd(&args).as_int(), Some(1), "released");
        assert!(!r.exists(LOCK), "the last reader took the key with it");
        publishes(&r) - before
    };
    assert_eq!(release(&[LOCK, WRITERS, WAKES]), 0, "nobody waits");
    r.cmd(&["ZADD", WRITERS, &far, THEIRS]);
    assert_eq!(release(&[LOCK, WRITERS, WAKES]), 1, "a writer waits");
    r.cmd(&["DEL", WRITERS]);
    r.cmd(&["ZADD", WAKES, "1", "*"]);
    assert_eq!(release(&[LOCK, WRITERS, WAKES]), 1, "a client is listed");
    r.cmd(&["DEL", WAKES]);
    assert_eq!(release(&[LOCK]), 1, "a caller that names neither key");
    // A reader that is not the last one announces nothing.
    r.cmd(&["ZADD", WRITERS, &far, THEIRS]);
    r.cmd(&["ZADD", LOCK, "+inf", "rwlock", &far, THEIRS]);
    let before = publishes(&r);
    r.cmd(&["ZADD", LOCK, &far, MINE]);
    let n = r.cmd(&[
        "EVAL",
        &READ_RELEASE,
        "3",
        LOCK,
        WRITERS,
        WAKES,
        MINE,
        CHANNEL,
    ]);
    assert_eq!(n.as_int(), Some(1));
    assert_eq!(publishes(&r) - before, 0, "readers remain");
}

/// A semaphore's keys as a comparable text: each key's type, contents (ZSET members
/// without their scores, which are times; a counter minted from the clock as "clock",
/// its semaphore's mark kept) and time to live to the second.
fn semaphore_keys(r: &RedisServer, ahead: i64) -> Vec<String> {
    let mut out = Vec::new();
    for key in [LOCK, FENCE, PERMITS, QUEUE, WAITERS, WAKES] {
        let kind = r.cmd(&["TYPE", key]).as_str().unwrap_or("?").to_owned();
        let value = match kind.as_str() {
            "string" => {
                let text = r.get(key).unwrap_or_default();
                let (mark, digits) = text.strip_prefix('s').map_or(("", &*text), |d| ("s", d));
                match digits.parse::<i64>() {
                    Ok(n) if n > 1_000_000_000_000 && n != ahead && n != ahead + 1 => {
                        format!("{mark}clock")
                    }
                    _ => text.clone(),
                }
            }
            "zset" => format!("{:?}", r.cmd(&["ZRANGE", key, "0", "-1"])),
            "list" => format!("{:?}", r.cmd(&["LRANGE", key, "0", "-1"])),
            "hash" => format!("{:?}", r.cmd(&["HGETALL", key])),
            _ => String::new(),
        };
        let pttl = r.cmd(&["PTTL", key]).as_int().unwrap_or(-3);
        let lives = if pttl > 0 {
            format!("~{}s", (pttl + 500) / 1000)
        } else {
            pttl.to_string()
        };
        out.push(format!("{key} {kind} {value} {lives}"));
    }
    out
}

/// A state of plain strings: each (key, value) set, without expiry.
fn strings<'a>(pairs: &'a [(&'a str, &'a str)]) -> SetUp<'a> {
    Box::new(move |r: &RedisServer| {
        for (key, value) in pairs {
            r.cmd(&["SET", key, value]);
        }
    })
}

/// A semaphore's state: its counter (`marked`) and permit count (2) stored, and
/// `members` (score, holder token) holding permits in a set living `pttl` ms.
fn holding<'a>(marked: &'a str, members: Vec<(&'a str, &'a str)>, pttl: &'a str) -> SetUp<'a> {
    Box::new(move |r: &RedisServer| {
        r.cmd(&["SET", FENCE, marked, "PX", "60000"]);
        r.cmd(&["SET", PERMITS, "2", "PX", "60000"]);
        add_permits(r, &members, pttl);
    })
}

/// Adds each (score, member) to the permit set, which then lives `pttl` ms. A score of
/// [`LATER`] or [`ENDED`] is a lease's end 7 s after or 1 s before the server's clock
/// now, read at each set-up: a refusal's wait, computed from it, is then the same for
/// the two scripts a state is given to, however long the test has run.
fn add_permits(r: &RedisServer, members: &[(&str, &str)], pttl: &str) {
    let now_ms = r.server_time().as_millis() as i64;
    for (score, member) in members {
        let score = match *score {
            LATER => (now_ms + 7_000).to_string(),
            ENDED => (now_ms - 1_000).to_string(),
            other => other.to_owned(),
        };
        let added = r.cmd(&["ZADD", LOCK, &score, member]);
        assert_eq!(added.as_int(), Some(1), "ZADD {score} {member}");
    }
    r.cmd(&["PEXPIRE", LOCK, pttl]);
}

/// A permit's score: its lease ends 7 s from the set-up ([`add_permits`]).
const LATER: &str = "later";
/// A permit's score: its lease ended 1 s before the set-up ([`add_permits`]).
const ENDED: &str = "ended";

/// semaphore/acquire.lua's common case (not fair, not listed: three keys, four
/// arguments, which the library sends for such an attempt) answers and writes what its
/// full path does for the same attempt (six keys, eleven arguments, no client tag), in
/// every state the semaphore's keys can be in; its grant alone is a bare integer.
#[test]
fn a_permits_common_case_answers_and_writes_as_the_full_path_in_every_key_state() {
    let r = RedisServer::start();
    let ahead = r.server_time().as_micros() as i64 + 3_600_000_000;
    let marked = format!("s{ahead}");
    let (later, ended, marked) = (LATER, ENDED, marked.as_str());
    let stored = move |r: &RedisServer| {
        r.cmd(&["SET", FENCE, marked, "PX", "60000"]);
        r.cmd(&["SET", PERMITS, "2", "PX", "60000"]);
    };
    let other = "22222222222222222222222222222222";
    // Both stored, and these permits held (score, member) in a set living `pttl` ms.
    let holding = |members, pttl| holding(marked, members, pttl);
    let states: Vec<(&str, SetUp<'_>)> = vec![
        ("free", Box::new(stored)),
        ("free, nothing stored", Box::new(|_: &RedisServer| {})),
        ("free, no permit count", strings(&[(FENCE, "s5")])),
        ("free, no counter", strings(&[(PERMITS, "2")])),
        (
            "free, counter and count that never expire",
            strings(&[(FENCE, "s5"), (PERMITS, "2")]),
        ),
        (
            "another permit count",
            strings(&[(FENCE, "s5"), (PERMITS, "3")]),
        ),
        (
            "a lock's counter, unmarked",
            strings(&[(FENCE, "5"), (PERMITS, "2")]),
        ),
        ("mine (a retry)", holding(vec![(later, MINE)], "7000")),
        (
            "mine, counter wiped",
            Box::new(move |r: &RedisServer| {
                r.cmd(&["SET", PERMITS, "2"]);
                add_permits(r, &[(later, MINE)], "7000");
            }),
        ),
        ("mine, its lease over", holding(vec![(ended, MINE)], "7000")),
        (
            "one of two held, the set living longer",
            holding(vec![(later, THEIRS)], "30000"),
        ),
        (
            "one of two held, the set living shorter",
            holding(vec![(later, THEIRS)], "3000"),
        ),
        (
            "every permit held",
            holding(vec![(later, THEIRS), (later, other)], "7000"),
        ),
        (
            "every permit held, mine among them",
            holding(vec![(later, THEIRS), (later, MINE)], "7000"),
        ),
        (
            "every permit held, one lease over",
            holding(vec![(later, THEIRS), (ended, other)], "7000"),
        ),
        (
            "every lease over",
            holding(vec![(ended, THEIRS), (ended, other)], "7000"),
        ),
        (
            "readers",
            holding(vec![("+inf", "rwlock"), (later, THEIRS)], "7000"),
        ),
        (
            "a lock",
            Box::new(move |r: &RedisServer| {
                stored(r);
                r.cmd(&["SET", LOCK, THEIRS, "PX", "7000"]);
            }),
        ),
        (
            "a permit count of another type",
            Box::new(|r: &RedisServer| {
                r.cmd(&["SET", FENCE, "s5"]);
                r.cmd(&["RPUSH", PERMITS, "x"]);
            }),
        ),
        (
            "a counter of another type",
            Box::new(|r: &RedisServer| {
                r.cmd(&["HSET", FENCE, "f", "v"]);
                r.cmd(&["SET", PERMITS, "2"]);
            }),
        ),
        (
            "a counter that is no number",
            strings(&[(FENCE, "s12ab"), (PERMITS, "2")]),
        ),
        (
            "a counter too long",
            strings(&[(FENCE, "s9999999999999999999"), (PERMITS, "2")]),
        ),
    ];
    for (state, set_up) in &states {
        for idle in ["0", "60000"] {
            r.cmd(&["FLUSHALL"]);
            set_up(&r);
            let full = r.cmd(&[
                "EVAL",
                &SEMAPHORE_ACQUIRE,
                "6",
                LOCK,
                FENCE,
                PERMITS,
                QUEUE,
                WAITERS,
                WAKES,
                MINE,
                "10000",
                "2",
                idle,
                "0",
                "0",
                "",
                "",
                "500",
                "0",
                "0",
            ]);
            let full_keys = semaphore_keys(&r, ahead);
            r.cmd(&["FLUSHALL"]);
            set_up(&r);
            let common = r.cmd(&[
                "EVAL",
                &SEMAPHORE_ACQUIRE,
                "3",
                LOCK,
                FENCE,
                PERMITS,
                MINE,
                "10000",
                "2",
                idle,
            ]);
            let case = (*state, format!("idle {idle}"));
            let keys = semaphore_keys(&r, ahead);
            assert_as_full_path(case, (&common, keys), (&full, full_keys), ahead);
        }
    }
}
