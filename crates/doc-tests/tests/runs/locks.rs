//! docs/guide/src/locks.md

use crate::blocks::locks as b;
use crate::rt;

/// Two holds of one owner, one token; the lock is free after the last release.
pub fn reentrant() {
    rt().block_on(async {
        let (client, redis) = super::client().await;
        b::reentrant::import(&client).await.unwrap();
        assert_eq!(redis.pttl("fencelock:{import}"), -2);
    });
}

/// A detached lock attached again, then released.
pub fn detach() {
    rt().block_on(async {
        let (client, redis) = super::client().await;
        b::detach::hand_over(&client).await.unwrap();
        assert_eq!(redis.pttl("fencelock:{report}"), -2);
    });
}
