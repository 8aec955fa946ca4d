//! docs/guide/src/blocking.md

use crate::blocks::blocking as b;

/// The blocking program, on a plain thread (no runtime): the write applied under the
/// token, and the lock free when the function has returned.
pub fn sell_one() {
    let redis = testkit::RedisServer::start();
    let token = b::sell_one::sell_one(&redis.url()).unwrap();
    assert!(token > 0);
    assert_eq!(redis.get("{stock:42}:sold").as_deref(), Some("1"));
    assert!(
        !redis.exists("fencelock:{stock:42}"),
        "released before the return"
    );
}
