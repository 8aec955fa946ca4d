//! The stepping server clock's frozen mode, against a real server.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use testkit::{RedisServer, ServerClock};

#[test]
fn a_frozen_clock_gives_one_instant_until_stepped_then_thaws() {
    let clock = ServerClock::new().expect("cc builds the clock shim");
    let server = RedisServer::builder().clock(&clock).start();
    let at = Duration::from_micros(1_800_000_000_123_456);
    clock.freeze(at);
    assert_eq!(clock.frozen_at(), Some(at));
    assert_eq!(server.server_time(), at, "TIME reads the frozen instant");
    server.cmd(&["SET", "k", "v", "PX", "1000"]);
    // Real time passes; the server's does not.
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(server.pttl("k"), 1000);
    assert_eq!(server.server_time(), at);

    clock.step_us(999_000);
    assert_eq!(server.pttl("k"), 1);
    assert_eq!(server.server_time(), at + Duration::from_micros(999_000));
    // Expired only once the clock is past the key's end (Redis: now > end).
    clock.step_ms(1);
    assert_eq!(server.pttl("k"), 0);
    clock.step_ms(1);
    assert!(!server.exists("k"));

    clock.thaw();
    assert_eq!(clock.frozen_at(), None);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let skew = now.abs_diff(server.server_time());
    assert!(
        skew < Duration::from_secs(5),
        "thawed: the real time, off by {skew:?}"
    );
}
