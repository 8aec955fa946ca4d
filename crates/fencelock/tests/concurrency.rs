//! Mutual exclusion seen from the protected resource: 32 tasks in 4 OS processes
//! increment a plain, non-atomic counter (GET, then SET) under the lock, 2,000 times in
//! all. A lost update or an out-of-order fencing token would show in the final state.

use std::time::Duration;

use fencelock::Client;
use redis::AsyncCommands;
use testkit::RedisServer;

mod common;
use common::spawn_helper;

const PROCESSES: usize = 4;
const TASKS_PER_PROCESS: usize = 8;
const INCREMENTS: usize = 2_000;
const WORKER_ENV: &str = "FENCELOCK_TEST_WORKER";

/// Increments of task `t` (0..32): 2,000 split as evenly as it goes.
fn quota(t: usize) -> usize {
    let tasks = PROCESSES * TASKS_PER_PROCESS;
    INCREMENTS / tasks + usize::from(t < INCREMENTS % tasks)
}

/// Reads the counter, lets other tasks run, writes it back plus one: a lost update
/// unless the caller holds the lock. Logs the fencing token in increment order.
async fn increment(conn: &mut redis::aio::MultiplexedConnection, token: Option<u64>) {
    let value: u64 = conn
        .get::<_, Option<u64>>("counter")
        .await
        .unwrap()
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_micros(200)).await;
    let _: () = conn.set("counter", value + 1).await.unwrap();
    if let Some(token) = token {
        let _: () = conn.rpush("tokens", token).await.unwrap();
    }
}

/// The body of one worker process; only runs when started by `exclusive_increments`.
#[test]
#[ignore = "worker process entry point, started by exclusive_increments"]
fn worker_process() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let (url, index) = spec.split_once(' ').expect("url and process index");
    let process: usize = index.parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = Client::connect(url).await.unwrap();
        let redis = redis::Client::open(url).unwrap();
        let mut tasks = Vec::new();
        for t in 0..TASKS_PER_PROCESS {
            let client = client.clone();
            let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
            let n = quota(process * TASKS_PER_PROCESS + t);
            tasks.push(tokio::spawn(async move {
                let lock = client
                    .lock("counter")
                    .lease(Duration::from_secs(10))
                    .renew(false)
                    .wait(Duration::from_secs(120));
                for _ in 0..n {
                    let guard = lock.acquire().await.unwrap();
                    increment(&mut conn, Some(guard.fencing_token().get())).await;
                    guard.release().await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

#[test]
fn exclusive_increments() {
    let r = RedisServer::start();
    let children: Vec<_> = (0..PROCESSES)
        .map(|p| spawn_helper("worker_process", WORKER_ENV, format!("{} {p}", r.url())))
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a worker process failed");
    }
    assert_eq!(
        r.get("counter").as_deref(),
        Some("2000"),
        "every increment survived: the lock excluded all 32 tasks from each other"
    );
    let tokens: Vec<u64> = r
        .cmd(&["LRANGE", "tokens", "0", "-1"])
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), INCREMENTS);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens strictly increase in the order the increments happened"
    );
    assert!(!r.exists("fencelock:{counter}"), "released at the end");
}

/// The control: the same increments without the lock do lose updates, so the check
/// above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_lock_updates_are_lost() {
    let r = RedisServer::start();
    let redis = redis::Client::open(r.url()).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                increment(&mut conn, None).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total: u64 = r.get("counter").unwrap().parse().unwrap();
    assert!(
        total < 200,
        "8 x 25 unlocked increments should lose some, got {total}"
    );
}
