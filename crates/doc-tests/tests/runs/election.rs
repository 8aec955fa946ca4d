//! docs/guide/src/election.md

use crate::blocks::election as b;
use crate::rt;

/// A campaign that leads and resigns while an observer follows.
pub fn scheduler() {
    rt().block_on(async {
        let (client, redis) = super::client().await;
        let following = tokio::spawn({
            let client = client.clone();
            async move { b::scheduler::follow(&client).await }
        });
        b::scheduler::scheduler(&client).await.unwrap();
        following.abort();
        assert_eq!(redis.pttl("fencelock:{scheduler}"), -2, "resigned");
    });
}
