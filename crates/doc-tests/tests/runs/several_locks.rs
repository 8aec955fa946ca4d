//! docs/guide/src/several-locks.md

use crate::blocks::several_locks as b;
use crate::rt;

/// Both accounts taken at once and released.
pub fn transfer() {
    rt().block_on(async {
        let (client, redis) = super::client().await;
        b::transfer::transfer(&client).await.unwrap();
        assert_eq!(redis.pttl("fencelock:{account:3}"), -2);
        assert_eq!(redis.pttl("fencelock:{account:7}"), -2);
    });
}
