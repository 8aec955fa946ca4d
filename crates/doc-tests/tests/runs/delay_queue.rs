//! docs/guide/src/delay-queue.md

use std::time::Duration;

use crate::blocks::delay_queue as b;
use crate::rt;

/// A free lock does the work at once; a held one defers it, and the consumer does it
/// once the lock is free and the item due.
pub fn defer() {
    rt().block_on(async {
        let (client, redis) = super::client().await;
        b::defer::on_message(&client).await.unwrap();
        let queue = client.delay_queue("stock-updates").unwrap();
        let counts = queue.counts().await.unwrap();
        assert_eq!(counts.ready + counts.delayed, 0, "nothing deferred");
        let holder = client.lock("stock:42").try_acquire().await.unwrap();
        b::defer::on_message(&client).await.unwrap();
        assert_eq!(
            redis
                .cmd(&["ZCARD", "fencelock:{stock-updates}:dq:due"])
                .as_int(),
            Some(1)
        );
        holder.release().await.unwrap();
        // Due in 5 s: the consumer takes nothing before, then does the work.
        b::defer::consume(&client).await.unwrap();
        assert_eq!(
            redis
                .cmd(&["ZCARD", "fencelock:{stock-updates}:dq:due"])
                .as_int(),
            Some(1)
        );
        tokio::time::sleep(Duration::from_millis(5100)).await;
        b::defer::consume(&client).await.unwrap();
        assert_eq!(
            redis
                .cmd(&["ZCARD", "fencelock:{stock-updates}:dq:due"])
                .as_int(),
            Some(0)
        );
        assert_eq!(
            redis
                .cmd(&["HLEN", "fencelock:{stock-updates}:dq:items"])
                .as_int(),
            Some(0),
            "acknowledged"
        );
    });
}
