//! docs/guide/src/semaphores.md

use crate::blocks::semaphores as b;
use crate::rt;

/// A permit of a semaphore of 4, taken and given back.
pub fn export() {
    rt().block_on(async {
        let (client, redis) = super::client().await;
        b::export::export(&client, 7).await.unwrap();
        assert_eq!(
            redis.cmd(&["ZCARD", "fencelock:{warehouse-api}"]).as_int(),
            Some(0)
        );
    });
}
