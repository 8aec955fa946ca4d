//! Locks on a Sentinel-managed master (a master, a replica, three sentinels, all real
//! redis-server processes): found through the sentinels, followed across a failover,
//! losses heard, tokens increasing; and the bad days, one clear line each.

use std::time::{Duration, Instant};

use fencelock::{Client, Error, LossCause};
use testkit::{RedisServer, SentinelGroup};

mod common;
use common::eventually;

/// How long a failover may take here: the sentinels notice the master down after 1 s
/// and elect and promote in about 1.2 s more (measured 2.2-2.4 s), with room for a
/// loaded 2-core machine.
const FAILOVER: Duration = Duration::from_secs(8);

#[tokio::test]
async fn a_lock_on_a_sentinel_managed_master_works_like_one_on_a_plain_node() {
    let group = SentinelGroup::start();
    let c = Client::connect(&group.url()).await.unwrap();
    assert_eq!(c.node(), group.master_addr());
    let guard = c.lock("s").try_acquire().await.unwrap();
    assert!(group.master().exists("fencelock:{s}"));
    // A waiter is woken by the release, through the master's pub/sub.
    let waiter = tokio::spawn(c.lock("s").wait(Duration::from_secs(20)).acquire());
    eventually(
        "the waiter subscribed",
        Duration::from_secs(5),
        async || c.stats().waiters == 1,
    )
    .await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by the release"
    );
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_failover_is_followed_the_holder_keeps_a_replicated_lease_and_tokens_go_on_up() {
    let mut group = SentinelGroup::start();
    let c = Client::connect(&group.url()).await.unwrap();
    let guard = c
        .lock("f")
        .lease(Duration::from_secs(8))
        .try_acquire()
        .await
        .unwrap();
    let before = guard.fencing_token();
    // The grant reaches the replica before the master dies.
    let replica = group.replicas()[0].addr();
    eventually(
        "the replica has the grant",
        Duration::from_secs(5),
        async || group.node_mut(&replica).exists("fencelock:{f}"),
    )
    .await;
    let old = group.kill_master();
    let killed = Instant::now();
    let new = group.wait_for_new_master(&old, FAILOVER);
    assert_eq!(new, replica);
    // The client follows the new master: an acquire that waits rides out the failover
    // and gets another lock there.
    let other = c.lock("g").wait(FAILOVER).acquire().await.unwrap();
    assert!(killed.elapsed() < FAILOVER, "back within {FAILOVER:?}");
    assert_eq!(c.node(), new);
    assert!(
        other.fencing_token() > before,
        "tokens go on up across the failover"
    );
    // The holder renewed on the new master and never lost its lease.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(guard.loss_cause(), None);
    assert!(group.master().exists("fencelock:{f}"));
    guard.release().await.unwrap();
    other.release().await.unwrap();
}

#[tokio::test]
async fn a_grant_lost_in_the_failover_is_heard_by_its_holder_and_tokens_stay_higher() {
    let mut group = SentinelGroup::start();
    let c = Client::connect(&group.url()).await.unwrap();
    // The replica is cut off: what the master grants now never reaches it.
    let replica = group.replicas()[0].addr();
    group.isolate_replica(&replica);
    let guard = c
        .lock("lost")
        .lease(Duration::from_secs(6))
        .try_acquire()
        .await
        .unwrap();
    let lost = guard.lost();
    let before = guard.fencing_token();
    // The master dies before the replica comes back, so the replica cannot catch up.
    let old = group.kill_master();
    group.resume_node(&replica);
    group.wait_for_new_master(&old, FAILOVER);
    // The holder hears of it at its next renewal on the new master: never silent.
    let cause = tokio::time::timeout(Duration::from_secs(6), lost)
        .await
        .expect("the loss is heard before the lease would have ended");
    assert!(
        matches!(
            cause,
            LossCause::Deleted | LossCause::Expired | LossCause::Unconfirmed
        ),
        "{cause:?}"
    );
    // The promoted replica never saw the grant, nor its counter: the next token is
    // still higher (every token is at least the server clock).
    let next = c
        .lock("lost")
        .try_acquire()
        .await
        .expect("the lost grant is not on the new master");
    assert!(next.fencing_token() > before);
    next.release().await.unwrap();
}

#[tokio::test]
async fn sentinel_credentials_apart_from_the_masters_and_bad_days_in_one_line() {
    let group = SentinelGroup::builder()
        .password("data-pw")
        .sentinel_password("sentinel-pw")
        .start();
    let url = format!(
        "redis+sentinel://:data-pw@{}/{}?sentinel_password=sentinel-pw",
        group.sentinel_urls(),
        group.service()
    );
    let c = Client::connect(&url).await.unwrap();
    c.lock("c")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // A service no sentinel knows.
    let unknown = format!(
        "redis+sentinel://:data-pw@{}/nosuch?sentinel_password=sentinel-pw",
        group.sentinel_urls()
    );
    let err = Client::connect(&unknown).await.unwrap_err();
    assert!(
        matches!(&err, Error::Rejected { message, .. } if message.contains("no sentinel knows the service \"nosuch\"")),
        "{err}"
    );
    // Every sentinel down (nothing listens there).
    let nowhere = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/mymaster",
        testkit::free_port(),
        testkit::free_port()
    );
    let started = Instant::now();
    let err = Client::connect(&nowhere).await.unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable { detail, .. } if detail.contains("every sentinel")),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "never a hang");
    // A plain Redis server where a sentinel should be: it answers, so it is not "down".
    let plain = RedisServer::start();
    let err = Client::connect(&format!("redis+sentinel://{}/mymaster", plain.addr()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Rejected { code, message, .. }
            if code == "NOTSENTINEL" && message.contains("is not a sentinel")),
        "{err}"
    );
    // A bad URL: invalid, and the passwords are not in the message.
    let err = Client::connect("redis+sentinel://:pw-secret@h/svc")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(!err.to_string().contains("pw-secret"), "{err}");
    for e in [err.to_string(), format!("{err:?}")] {
        assert!(!e.contains("sentinel-pw") && !e.contains("data-pw"), "{e}");
    }
}
