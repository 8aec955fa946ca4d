//! docs/guide/src/waiting-and-leases.md

use std::time::Duration;

use crate::blocks::waiting_and_leases as b;
use crate::rt;

/// The worker does jobs until the shutdown signal, then stops acquiring, and returns
/// with nothing of its own left in Redis or in flight.
pub fn shutdown() {
    rt().block_on(async {
        let (client, redis) = super::client().await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let worker = tokio::spawn(b::shutdown::worker(client.clone(), async {
            let _ = stopped.await;
        }));
        testkit::eventually("some jobs done", Duration::from_secs(10), || {
            redis
                .cmd(&["GET", "fencelock:{jobs:report}:fence"])
                .as_str()
                .is_some()
        });
        // Another holder, so that the worker is waiting when it is told to stop.
        let other = fencelock::Client::connect(&redis.url()).await.unwrap();
        let held = other
            .lock("jobs:report")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        stop.send(()).unwrap();
        let done = tokio::time::timeout(Duration::from_secs(10), worker)
            .await
            .expect("the worker stops")
            .unwrap()
            .unwrap();
        assert!(done >= 1, "{done}");
        let stats = client.stats();
        assert_eq!(stats.background_tasks, 0, "{stats:?}");
        assert_eq!(stats.watched_leases, 0, "{stats:?}");
        assert_eq!(
            redis
                .cmd(&["ZCARD", "fencelock:{jobs:report}:wakes"])
                .as_int(),
            Some(0),
            "the waiting acquire withdrew from the wake list"
        );
        held.release().await.unwrap();
        let _ = b::shutdown::main; // needs a server at 6379 and a signal: compiled only
    });
}
