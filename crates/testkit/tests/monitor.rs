//! `testkit::monitor` against real `redis-server`s: what the safety lab
//! relies on to feed checker C5 from the server's own log.

use std::time::{Duration, Instant};

use testkit::checkers::foreign_touch;
use testkit::history::Op;
use testkit::monitor::{self, Entry, Monitor, Source, Touches};
use testkit::{RedisServer, Reply, eventually};

const KEY: &str = "fencelock:{lab:monitor}";
const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const MARGIN: Duration = Duration::from_millis(5);

/// Like acquire.lua's first step: take the lock if it is free.
const ACQUIRE: &str = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])";
/// Like release.lua: delete the key only if it holds the caller's token.
const CHECKED_RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('DEL', KEYS[1]) end return 0";
/// The broken release the checker must catch: no owner check.
const UNCHECKED_RELEASE: &str = "return redis.call('DEL', KEYS[1])";

fn acquire(server: &RedisServer, owner: &str, ttl_ms: u64) -> bool {
    let reply = server.cmd(&["EVAL", ACQUIRE, "1", KEY, owner, &ttl_ms.to_string()]);
    assert!(!reply.is_error(), "{reply}");
    reply.as_str() == Some("OK")
}

fn release(server: &RedisServer, script: &str, owner: &str) -> Reply {
    let reply = server.cmd(&["EVAL", script, "1", KEY, owner, "release-channel"]);
    assert!(!reply.is_error(), "{reply}");
    reply
}

/// A monitor on `server`, with `KEY` known absent from the start (the
/// replay starts every key unknown).
fn start_monitor(server: &RedisServer) -> Monitor {
    let monitor = Monitor::start(&server.addr()).unwrap();
    server.cmd(&["DEL", KEY]);
    monitor
}

/// Syncs, stops the monitor and replays its recording.
fn replay(monitor: Monitor) -> (Vec<Entry>, Touches) {
    monitor.sync().unwrap();
    assert_eq!(monitor.malformed(), 0);
    let entries = monitor.stop();
    let touches = monitor::touches(&entries, &[KEY], MARGIN);
    (entries, touches)
}

/// Polls the server until `KEY` has expired, then until the server's clock
/// is past [`MARGIN`] (and the clock's millisecond rounding) after that, so
/// the replay can tell the expiry happened (within the margin it would
/// rightly call the key's state unknown).
fn wait_until_absent(server: &RedisServer) {
    let within = Duration::from_secs(5);
    eventually(&format!("{KEY} expired"), within, || !server.exists(KEY));
    let settled = server.server_time() + MARGIN + Duration::from_millis(3);
    eventually("the server's clock passed the margin", within, || {
        server.server_time() >= settled
    });
}

#[test]
fn checked_release_by_the_owner_is_accepted_and_by_a_stale_owner_touches_nothing() {
    let server = RedisServer::start();
    let monitor = start_monitor(&server);

    assert!(acquire(&server, A, 10_000));
    assert_eq!(release(&server, CHECKED_RELEASE, A), Reply::Int(1));
    assert!(acquire(&server, B, 10_000));
    // A's stale release finds B's token and deletes nothing.
    assert_eq!(release(&server, CHECKED_RELEASE, A), Reply::Int(0));

    let (_, t) = replay(monitor);
    assert_eq!((t.judged, t.skipped, t.interruptions), (1, 0, 0), "{t:?}");
    let e = &t.events[0];
    assert_eq!(e.op, Op::Release);
    assert_eq!(e.owner.as_deref(), Some(A));
    assert_eq!(e.touched_owner.as_deref(), Some(A));
    assert!(foreign_touch(&t.events).is_empty());
}

#[test]
fn unchecked_release_by_a_stale_owner_is_reported() {
    let server = RedisServer::start();
    let monitor = start_monitor(&server);

    assert!(acquire(&server, A, 10_000));
    assert_eq!(release(&server, CHECKED_RELEASE, A), Reply::Int(1));
    assert!(acquire(&server, B, 10_000));
    // The positive control: A's release deletes B's key.
    assert_eq!(release(&server, UNCHECKED_RELEASE, A), Reply::Int(1));

    let (_, t) = replay(monitor);
    assert_eq!((t.judged, t.skipped), (2, 0), "{t:?}");
    let foreign = &t.events[1];
    assert_eq!(foreign.touched_owner.as_deref(), Some(B));
    assert_eq!(
        foreign.owner.as_deref(),
        Some(format!("argv: [{A}, release-channel]").as_str())
    );
    let violations = foreign_touch(&t.events);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].events, std::slice::from_ref(foreign));
}

#[test]
fn an_expired_key_taken_by_another_owner_is_released_by_that_owner() {
    let server = RedisServer::start();
    let monitor = start_monitor(&server);

    assert!(acquire(&server, A, 50));
    wait_until_absent(&server);
    assert!(acquire(&server, B, 10_000));
    assert_eq!(release(&server, CHECKED_RELEASE, B), Reply::Int(1));

    let (_, t) = replay(monitor);
    assert_eq!((t.judged, t.skipped), (1, 0), "{t:?}");
    assert_eq!(t.events[0].owner.as_deref(), Some(B));
    assert!(foreign_touch(&t.events).is_empty());
}

#[test]
fn an_expired_key_deleted_without_check_is_no_touch() {
    let server = RedisServer::start();
    let monitor = start_monitor(&server);

    assert!(acquire(&server, A, 50));
    wait_until_absent(&server);
    // Deletes nothing: the replay must know the key expired, not blame B.
    assert_eq!(release(&server, UNCHECKED_RELEASE, B), Reply::Int(0));

    let (_, t) = replay(monitor);
    assert_eq!((t.judged, t.skipped), (0, 0), "{t:?}");
}

#[test]
fn a_restart_is_recorded_and_makes_the_key_unknown_until_set_again() {
    let mut server = RedisServer::start();
    let monitor = start_monitor(&server);

    assert!(acquire(&server, A, 10_000));
    monitor.sync().unwrap();
    server.kill();
    let started = Instant::now();
    assert!(
        monitor.sync().is_err(),
        "sync must fail while the server is down"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    server.restart();
    monitor.sync().unwrap(); // waits for the monitor to reconnect

    // Without persistence the key is gone, but the replay cannot know that.
    assert_eq!(release(&server, UNCHECKED_RELEASE, B), Reply::Int(0));
    // A definite write makes it known again.
    server.cmd(&["SET", KEY, A, "PX", "10000"]);
    assert_eq!(release(&server, UNCHECKED_RELEASE, B), Reply::Int(1));

    let (entries, t) = replay(monitor);
    let gaps = entries.iter().filter(|e| e.is_interruption()).count();
    assert_eq!(gaps, 1, "{entries:#?}");
    assert_eq!((t.judged, t.skipped, t.interruptions), (1, 1, 1), "{t:?}");
    assert_eq!(t.events[0].touched_owner.as_deref(), Some(A));
    assert_eq!(foreign_touch(&t.events).len(), 1);
}

#[test]
fn sync_waits_until_earlier_commands_are_recorded() {
    let server = RedisServer::start();
    let monitor = start_monitor(&server);
    for round in 0..20 {
        let value = format!("v{round}");
        server.cmd(&["SET", "sync-probe", &value]);
        monitor.sync().unwrap();
        let entries = monitor.entries();
        let last_set = entries.iter().rev().find(|e| e.command() == "SET").unwrap();
        assert_eq!(last_set.args, ["SET", "sync-probe", value.as_str()]);
    }
}

#[test]
fn real_server_lines_parse_with_escapes_and_script_order() {
    let server = RedisServer::start();
    let monitor = start_monitor(&server);
    let token = "q\"uo\\te\nnl\r\ttab\u{1}\u{7}\u{8}é ]x";
    let script =
        "redis.call('SET', KEYS[1], ARGV[1], 'PX', 1000) return redis.call('DEL', KEYS[1])";
    server.cmd(&["EVAL", script, "1", KEY, token]);
    monitor.sync().unwrap();
    assert_eq!(monitor.malformed(), 0);
    let entries = monitor.stop();

    let eval = entries.iter().position(|e| e.command() == "EVAL").unwrap();
    let [call, set, del] = &entries[eval..eval + 3] else {
        panic!("{entries:#?}")
    };
    assert!(matches!(&call.source, Source::Client(addr) if addr.starts_with("127.0.0.1:")));
    assert_eq!(call.args, ["EVAL", script, "1", KEY, token]);
    assert_eq!(set.source, Source::Lua);
    assert_eq!(set.args, ["SET", KEY, token, "PX", "1000"]);
    assert_eq!(
        (&del.source, del.args.as_slice()),
        (&Source::Lua, &["DEL".to_owned(), KEY.to_owned()][..])
    );
    assert!(call.time_us <= set.time_us && set.time_us <= del.time_us);
    assert!(entries.iter().all(|e| e.db == 0));

    // Created and deleted by the same call: its own token, no foreign touch.
    let t = monitor::touches(&entries, &[KEY], MARGIN);
    assert_eq!((t.judged, t.skipped), (1, 0), "{t:?}");
    assert_eq!(t.events[0].owner.as_deref(), Some(token));
}

#[test]
fn start_fails_without_a_server_and_drop_stops_the_thread() {
    let server = RedisServer::start();
    let addr = server.addr();
    let monitor = Monitor::start(&addr).unwrap();
    assert_eq!(monitor.addr(), addr);
    drop(server);
    drop(monitor); // reconnecting to nothing: must still stop promptly
    assert!(Monitor::start(&addr).is_err());
    assert!(Monitor::start("not an address").is_err());
}
