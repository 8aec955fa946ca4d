//! docs/guide/src/read-write.md

use crate::blocks::read_write as b;
use crate::rt;

/// A reader, then the writer.
pub fn prices() {
    rt().block_on(async {
        let (client, redis) = super::client().await;
        b::prices::prices(&client).await.unwrap();
        assert_eq!(redis.pttl("fencelock:{prices}"), -2);
    });
}
