//! Replica acknowledgement (`LockBuilder::replicas`): a grant counts only once enough
//! replicas have it, against a real master and replica.

use std::time::{Duration, Instant};

use fencelock::{Client, Error};
use testkit::RedisServer;

mod common;
use common::eventually;

/// A master and a replica of it, once the replica is in sync.
async fn master_and_replica() -> (RedisServer, RedisServer) {
    // No delay before the first full sync (Redis 7 waits 5 s by default).
    let master = RedisServer::builder()
        .arg("--repl-diskless-sync-delay")
        .arg("0")
        .start();
    let replica = RedisServer::start();
    replica.cmd(&["REPLICAOF", "127.0.0.1", &master.port().to_string()]);
    eventually(
        "the replica is online",
        Duration::from_secs(10),
        // Both sides: the master may call the replica online (the snapshot sent) before
        // the replica has loaded it and acknowledges writes.
        async || {
            master
                .info_field("replication", "slave0")
                .is_some_and(|s| s.contains("state=online"))
                && replica
                    .info_field("replication", "master_link_status")
                    .as_deref()
                    == Some("up")
        },
    )
    .await;
    // And its stream flows: after a diskless first sync the master may call the replica
    // online while it starts sending it the writes only on the replica's next periodic
    // acknowledgement, up to a second later (the replica's first one can arrive before
    // the master has marked it online). A write made now can only reach the replica by
    // that stream, not in the snapshot.
    master.cmd(&["SET", "after-sync", "1"]);
    eventually(
        "the replica receives the master's writes",
        Duration::from_secs(10),
        async || replica.get("after-sync").as_deref() == Some("1"),
    )
    .await;
    (master, replica)
}

#[tokio::test]
async fn a_grant_counts_once_the_replicas_have_it_and_is_released_when_they_do_not() {
    let (master, mut replica) = master_and_replica().await;
    let c = Client::connect(&master.url()).await.unwrap();
    let guard = c.lock("r").replicas(1).try_acquire().await.unwrap();
    assert_eq!(
        replica.get("fencelock:{r}").as_deref(),
        Some(guard.holder_token().as_str()),
        "the replica has the grant"
    );
    guard.release().await.unwrap();

    // The replica stops acknowledging: the grant is taken back, within a tenth of the
    // lease (1 s at most with the default 30 s lease), and says why.
    replica.pause();
    let started = Instant::now();
    let err = c.lock("r").replicas(1).try_acquire().await.unwrap_err();
    let took = started.elapsed();
    replica.resume();
    match &err {
        Error::Unreplicated {
            wanted: 1,
            acknowledged: 0,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("replicas"), "{err}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(!master.exists("fencelock:{r}"), "released again");
}

#[tokio::test]
async fn a_master_without_enough_replicas_or_refusing_wait_says_so() {
    let lonely = RedisServer::start();
    let c = Client::connect(&lonely.url()).await.unwrap();
    let err = c
        .lock("r")
        .lease(Duration::from_millis(500))
        .replicas(2)
        .try_acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unreplicated {
                wanted: 2,
                acknowledged: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!lonely.exists("fencelock:{r}"));

    // A managed service that refuses WAIT: one clear line, nothing left held.
    let no_wait = RedisServer::builder()
        .arg("--rename-command")
        .arg("WAIT")
        .arg("")
        .start();
    let c = Client::connect(&no_wait.url()).await.unwrap();
    let err = c.lock("r").replicas(1).try_acquire().await.unwrap_err();
    match &err {
        Error::Rejected { message, .. } => assert!(message.contains("refuses WAIT"), "{err}"),
        other => panic!("{other:?}"),
    }
    assert!(!no_wait.exists("fencelock:{r}"));

    // Redlock nodes are independent masters: refused before anything is sent.
    let servers = RedisServer::start_many(3);
    let rl = Client::redlock(servers.iter().map(RedisServer::url))
        .connect()
        .await
        .unwrap();
    assert!(matches!(
        rl.lock("r").replicas(1).try_acquire().await,
        Err(Error::InvalidArgument { .. })
    ));
}

/// A master that stops answering while the grant waits for its replicas (a failover
/// under way) does not end a waiting acquire: it tries again, as after any attempt that
/// found the node unreachable, and gets the lock once the master and replica are back.
#[tokio::test]
async fn a_waiting_acquire_retries_when_the_master_stops_answering_during_wait() {
    let (mut master, mut replica) = master_and_replica().await;
    // WAIT may block for a second (a tenth of the lease, at most three quarters of the
    // response timeout): time enough to stop the master while it does.
    let c = Client::builder(master.url())
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let log = common::traces();
    replica.pause();
    let acquire = c
        .lock("w")
        .lease(Duration::from_secs(10))
        .replicas(1)
        .wait(Duration::from_secs(30))
        .acquire();
    let acquiring = tokio::spawn(acquire);
    // The grant is made and its WAIT blocks (the replica acknowledges nothing); then
    // the master stops too, so the WAIT's answer never comes.
    eventually(
        "the grant's WAIT blocks",
        Duration::from_secs(10),
        async || master.info_field("clients", "blocked_clients").as_deref() == Some("1"),
    )
    .await;
    master.pause();
    eventually(
        "the acquire saw no answer and tries again",
        Duration::from_secs(10),
        async || {
            log.text()
                .contains("no answer from the replicas' master; retrying")
        },
    )
    .await;
    master.resume();
    replica.resume();
    let guard = acquiring
        .await
        .unwrap()
        .expect("the lock, once both are back");
    assert_eq!(
        master.get("fencelock:{w}").as_deref(),
        Some(guard.holder_token().as_str())
    );
    eventually(
        "the replica has the grant",
        Duration::from_secs(5),
        async || replica.get("fencelock:{w}").as_deref() == Some(guard.holder_token().as_str()),
    )
    .await;
    guard.release().await.unwrap();
}
