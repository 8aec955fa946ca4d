//! docs/guide/src/getting-started.md

use crate::blocks::getting_started as b;
use crate::rt;

/// `try_run`: the work's value comes back, and the lock is released first.
pub fn try_run() {
    rt().block_on(async {
        let (client, redis) = super::client().await;
        assert_eq!(b::try_run::sell_one(&client).await.unwrap(), 2);
        assert_eq!(redis.pttl("fencelock:{stock:42}"), -2);
    });
}

/// The guard, then `run`: both end with the lock free.
pub fn guard() {
    rt().block_on(async {
        let redis = testkit::RedisServer::start();
        b::guard::sell_one(&redis.url()).await.unwrap();
        assert_eq!(redis.pttl("fencelock:{stock:42}"), -2);
    });
}
