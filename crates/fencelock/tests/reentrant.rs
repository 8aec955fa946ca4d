//! Reentrancy by owner identity (not by thread): the same owner id, from any task or
//! process, adds holds; the last release frees the lock. Against a real redis-server.

use std::time::Duration;

use fencelock::{Client, Error};
use testkit::RedisServer;

#[tokio::test]
async fn one_owner_in_two_processes_shares_the_lock_and_the_last_release_frees_it() {
    let r = RedisServer::start();
    // Two clients with their own connections stand for two processes of one job.
    let service_a = Client::connect(&r.url()).await.unwrap();
    let service_b = Client::connect(&r.url()).await.unwrap();
    let other = Client::connect(&r.url()).await.unwrap();

    let first = service_a
        .lock("order:7")
        .reentrant("job-42")
        .try_acquire()
        .await
        .unwrap();
    let second = service_b
        .lock("order:7")
        .reentrant("job-42")
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(
        first.fencing_token(),
        second.fencing_token(),
        "reentry issues no new token"
    );
    assert_eq!(
        r.cmd(&["HGET", "fencelock:{order:7}", "owner"]).as_str(),
        Some("job-42")
    );

    // Another owner, and a plain caller, find it held.
    assert!(matches!(
        other
            .lock("order:7")
            .reentrant("job-43")
            .try_acquire()
            .await,
        Err(Error::Held { .. })
    ));
    assert!(matches!(
        other.lock("order:7").try_acquire().await,
        Err(Error::Held { .. })
    ));

    let waiter = tokio::spawn(
        other
            .lock("order:7")
            .reentrant("job-43")
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    let shared_token = first.fencing_token();
    first.release().await.unwrap();
    assert!(r.exists("fencelock:{order:7}"), "one hold is left");
    second.release().await.unwrap();
    let next = waiter
        .await
        .unwrap()
        .expect("the next owner gets it after the last release");
    assert!(
        next.fencing_token() > shared_token,
        "a new owner gets a new token"
    );
    next.release().await.unwrap();
    assert!(!r.exists("fencelock:{order:7}"));
}

#[tokio::test]
async fn a_dropped_hold_gives_its_hold_back() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let outer = c.lock("d").reentrant("me").try_acquire().await.unwrap();
    let inner = c.lock("d").reentrant("me").try_acquire().await.unwrap();
    drop(inner);
    c.flush().await;
    assert_eq!(
        r.cmd(&["HLEN", "fencelock:{d}"]).as_int(),
        Some(3),
        "owner, fence, one hold"
    );
    drop(outer);
    c.flush().await;
    assert!(!r.exists("fencelock:{d}"));
}

#[tokio::test]
async fn the_watchdog_renews_a_reentrant_lease() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let g = c
        .lock("w")
        .reentrant("me")
        .lease(Duration::from_millis(600))
        .try_acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await; // 2.5 leases
    assert!(r.exists("fencelock:{w}"), "renewed by owner id");
    assert!(g.loss_cause().is_none());
    g.release().await.unwrap();
    assert!(!r.exists("fencelock:{w}"));
}

#[tokio::test]
async fn bad_reentrant_arguments_are_invalid() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    for (case, lock) in [
        ("fair and reentrant", c.lock("x").reentrant("me").fair()),
        ("empty owner", c.lock("x").reentrant("")),
        ("control character", c.lock("x").reentrant("a\nb")),
        ("too long", c.lock("x").reentrant("o".repeat(257))),
    ] {
        assert!(
            matches!(lock.try_acquire().await, Err(Error::InvalidArgument { .. })),
            "{case}"
        );
    }
    assert_eq!(r.cmd(&["DBSIZE"]).as_int(), Some(0));
}
