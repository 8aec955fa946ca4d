//! docs/guide/src/waiting-and-leases.md

use std::time::Duration;

use crate::blocks::waiting_and_leases as b;
use crate::rt;

/// The worker does jobs until the shutdown signal, then stops acquiring, and returns
/// with nothing of its own left in Redis or in flight.
pub fn shutdown() {
    rt().block_on(async {
        // The worker reaches Redis through a proxy, so that it can be slowed down below.
        let redis = testkit::RedisServer::start();
        let proxy = testkit::FaultProxy::start(&redis.addr());
        let client = fencelock::Client::connect(&proxy.url()).await.unwrap();
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
        // Another holder, so that the worker is waiting when it is told to stop. A plain
        // lock lets a releaser take it back at once (barging), and the worker always
        // does: its next acquire follows its release, while the other waits for the
        // release's message. With 5 ms each way between the worker and Redis, the other,
        // woken by the release, comes first.
        proxy.set(testkit::Fault::Delay {
            base: Duration::from_millis(5),
            jitter: Duration::ZERO,
        });
        let other = fencelock::Client::connect(&redis.url()).await.unwrap();
        let held = other
            .lock("jobs:report")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        testkit::eventually("the worker waits, listed", Duration::from_secs(10), || {
            redis
                .cmd(&["ZCARD", "fencelock:{jobs:report}:wakes"])
                .as_int()
                == Some(1)
        });
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
