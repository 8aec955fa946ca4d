//! Leader election against real servers: one leader among three electors, handovers
//! with increasing terms, a dead leader replaced after its lease and never before,
//! followers woken by pub/sub, a paused old leader's write refused by the fenced
//! resource, a Sentinel failover, a Redis Cluster (sharded pub/sub); bad input refused.

use std::time::{Duration, Instant};

use fencelock::{Client, Error, Leadership};
use testkit::{Cluster, RedisServer, SentinelGroup};

mod common;
use common::eventually;

/// Three electors on three clients, each campaigning in a task.
async fn three_electors(
    url: &str,
    lease: Duration,
) -> Vec<tokio::task::JoinHandle<Result<Leadership, Error>>> {
    let mut campaigns = Vec::new();
    for who in ["a", "b", "c"] {
        let client = Client::connect(url).await.unwrap();
        let election = client.election("sched").lease(lease).holder_info(who);
        campaigns.push(tokio::spawn(election.campaign()));
    }
    campaigns
}

/// Waits until exactly one campaign of `campaigns` has won, and takes it out.
async fn the_one_winner(
    campaigns: &mut Vec<tokio::task::JoinHandle<Result<Leadership, Error>>>,
    within: Duration,
) -> Leadership {
    let deadline = Instant::now() + within;
    loop {
        let done: Vec<usize> = (0..campaigns.len())
            .filter(|&i| campaigns[i].is_finished())
            .collect();
        assert!(done.len() <= 1, "two campaigns won at once");
        if let [i] = done[..] {
            return campaigns.remove(i).await.unwrap().unwrap();
        }
        assert!(Instant::now() < deadline, "nobody won within {within:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn one_of_three_leads_the_others_wait_and_each_resignation_hands_over_with_a_higher_term() {
    let redis = RedisServer::start();
    let lease = Duration::from_secs(30);
    let mut campaigns = three_electors(&redis.url(), lease).await;
    let observer_client = Client::connect(&redis.url()).await.unwrap();
    let election = observer_client.election("sched");

    let first = the_one_winner(&mut campaigns, Duration::from_secs(10)).await;
    let leader = election.leader().await.unwrap().expect("someone leads");
    assert_eq!(leader.term, first.term());
    let first_info = leader.info.clone();
    assert!(["a", "b", "c"].contains(&first_info.as_str()), "{leader:?}");
    assert!(leader.remaining > Duration::from_secs(25), "{leader:?}");
    // The others wait: nobody else wins while the first leads.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(campaigns.iter().all(|c| !c.is_finished()));

    // A resignation wakes a campaigner at once, long before the lease would have ended.
    let resigned = Instant::now();
    first.resign().await.unwrap();
    let second = the_one_winner(&mut campaigns, Duration::from_secs(10)).await;
    assert!(resigned.elapsed() < lease / 2, "woken by the resignation");
    assert!(second.term() > leader.term, "terms increase");
    let now = election.leader().await.unwrap().expect("the second leads");
    assert_eq!(now.term, second.term());
    assert_ne!(now.info, first_info);

    second.resign().await.unwrap();
    let third = the_one_winner(&mut campaigns, Duration::from_secs(10)).await;
    assert!(third.term() > now.term);
    third.resign().await.unwrap();
    assert_eq!(election.leader().await.unwrap(), None, "nobody leads now");
}

#[tokio::test]
async fn a_leader_gone_without_resigning_is_replaced_after_its_lease_and_never_before() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(1500);
    let a = Client::connect(&redis.url()).await.unwrap();
    let b = Client::connect(&redis.url()).await.unwrap();
    let old = a.election("e").lease(lease).campaign().await.unwrap();
    let old_term = old.term();
    let standby = tokio::spawn(b.election("e").lease(lease).campaign());
    eventually("the standby waits", Duration::from_secs(5), async || {
        b.stats().waiters == 1
    })
    .await;
    // The leader's task is gone without a word: nothing renews or releases its lease
    // (detach sends nothing), as when its process dies.
    let asked = Instant::now();
    let left = b.election("e").leader().await.unwrap().unwrap().remaining;
    let _ = old.into_guard().detach();
    let gone = Instant::now();
    let new = standby.await.unwrap().unwrap();
    let won = Instant::now();
    // Never while the old lease ran: Redis said it had `left` when asked.
    assert!(
        won >= asked + left.saturating_sub(Duration::from_millis(2)),
        "the standby led {:?} before the old lease ended",
        (asked + left) - won
    );
    // And within the lease plus a margin of the wake (the waiter's timer, one
    // attempt).
    assert!(
        won - gone < lease + Duration::from_secs(1),
        "took over after {:?}",
        won - gone
    );
    assert!(new.term() > old_term);
    new.resign().await.unwrap();
}

#[tokio::test]
async fn an_observer_hears_each_change_by_pubsub_and_an_expiry_when_the_lease_ends() {
    let redis = RedisServer::start();
    let a = Client::connect(&redis.url()).await.unwrap();
    let b = Client::connect(&redis.url()).await.unwrap();
    let watcher = Client::connect(&redis.url()).await.unwrap();
    let mut observer = watcher.election("obs").observe().await.unwrap();
    assert_eq!(observer.leader(), None);
    // Woken well within its 5 s re-read with nobody leading, and the 30 s lease: by the
    // win's message.
    let soon = Duration::from_millis(2500);

    let changed = tokio::spawn(async move {
        let seen = observer.changed().await;
        (observer, seen, Instant::now())
    });
    let started = Instant::now();
    let first = a.election("obs").holder_info("a").campaign().await.unwrap();
    let first_term = first.term();
    let (mut observer, seen, at) = changed.await.unwrap();
    let seen = seen.unwrap().expect("a leads");
    assert_eq!((seen.term, seen.info.as_str()), (first.term(), "a"));
    assert!(
        at - started < soon,
        "heard the win after {:?}",
        at - started
    );

    // A resignation: heard at once, not when the 30 s lease would have ended.
    let resigned = Instant::now();
    first.resign().await.unwrap();
    assert_eq!(observer.changed().await.unwrap(), None);
    assert!(resigned.elapsed() < soon, "{:?}", resigned.elapsed());

    // A leader whose task is gone without resigning: no message; heard once its lease
    // has ended (the observer reads again then), and not before.
    let lease = Duration::from_millis(1200);
    let second = b
        .election("obs")
        .lease(lease)
        .holder_info("b")
        .campaign()
        .await
        .unwrap();
    let seen = observer.changed().await.unwrap().expect("b leads");
    assert_eq!(seen.term, second.term());
    assert!(seen.term > first_term);
    let asked = Instant::now();
    let left = watcher
        .election("obs")
        .leader()
        .await
        .unwrap()
        .unwrap()
        .remaining;
    let _ = second.into_guard().detach();
    assert_eq!(observer.changed().await.unwrap(), None);
    let heard = Instant::now();
    assert!(
        heard >= asked + left.saturating_sub(Duration::from_millis(2)),
        "nobody leads only once the lease ran out"
    );
    assert!(
        heard - asked < left + Duration::from_secs(1),
        "heard {:?} after the lease ended",
        heard - (asked + left)
    );
}

#[tokio::test]
async fn a_paused_old_leaders_write_is_refused_by_the_fenced_resource() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(800);
    let a = Client::connect(&redis.url()).await.unwrap();
    let b = Client::connect(&redis.url()).await.unwrap();
    let old = a.election("writer").lease(lease).campaign().await.unwrap();
    let old_term = old.term();
    a.fenced_write("writer", old_term)
        .set("{writer}:value", "from the old leader")
        .apply()
        .await
        .unwrap();
    // The old leader stops renewing (paused: nothing sent) and does not know it lost.
    let _paused = old.into_guard().detach();
    let new = b.election("writer").lease(lease).campaign().await.unwrap();
    b.fenced_write("writer", new.term())
        .set("{writer}:value", "from the new leader")
        .apply()
        .await
        .unwrap();
    // It wakes and writes with its old term: refused, nothing written.
    let err = a
        .fenced_write("writer", old_term)
        .set("{writer}:value", "stale")
        .apply()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Fenced { highest, .. } if highest == new.term()),
        "{err:?}"
    );
    assert_eq!(
        redis.get("{writer}:value").as_deref(),
        Some("from the new leader")
    );
    new.resign().await.unwrap();
}

#[tokio::test]
async fn a_dropped_leadership_resigns_in_the_background_and_tells_the_followers() {
    let redis = RedisServer::start();
    let a = Client::connect(&redis.url()).await.unwrap();
    let watcher = Client::connect(&redis.url()).await.unwrap();
    let leadership = a.election("drop").campaign().await.unwrap();
    let mut observer = watcher.election("drop").observe().await.unwrap();
    assert_eq!(observer.leader().map(|l| l.term), Some(leadership.term()));
    let dropped = Instant::now();
    drop(leadership);
    assert_eq!(observer.changed().await.unwrap(), None);
    assert!(
        dropped.elapsed() < Duration::from_secs(10),
        "not the 30 s lease"
    );
    assert!(!redis.exists("fencelock:{drop}"));
    assert!(!redis.exists("fencelock:{drop}:holder"));
}

#[tokio::test]
async fn bad_input_other_locks_and_redlock_are_refused_with_typed_errors() {
    let redis = RedisServer::start();
    let c = Client::connect(&redis.url()).await.unwrap();
    // A bad name: nothing sent.
    for bad in ["", "a{b}"] {
        let err = c.election(bad).campaign().await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        let err = c.election(bad).leader().await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    }
    let err = c
        .election("e")
        .lease(Duration::ZERO)
        .campaign()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    // A name a plain lock holds has no leader record: not an election.
    let lock = c.lock("plain").try_acquire().await.unwrap();
    let err = c.election("plain").leader().await.unwrap_err();
    assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    let err = c
        .election("plain")
        .wait(Duration::ZERO)
        .campaign()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Held { .. }), "{err:?}");
    lock.release().await.unwrap();
    // Another kind of lock under the name: refused, and left as it was.
    let reentrant = c
        .lock("owned")
        .reentrant("job")
        .try_acquire()
        .await
        .unwrap();
    let err = c.election("owned").campaign().await.unwrap_err();
    assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    reentrant.release().await.unwrap();
    // Redlock: refused before anything is sent.
    let (r1, r2, r3) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    );
    let redlock = Client::redlock([r1.url(), r2.url(), r3.url()])
        .connect()
        .await
        .unwrap();
    let err = redlock.election("e").campaign().await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let err = redlock.election("e").observe().await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(!r1.exists("fencelock:{e}"));
}

/// How long a failover may take here (as in tests/sentinel.rs).
const FAILOVER: Duration = Duration::from_secs(8);

#[tokio::test]
async fn the_leader_keeps_leading_across_a_sentinel_failover_and_terms_go_on_up() {
    let mut group = SentinelGroup::start();
    let a = Client::connect(&group.url()).await.unwrap();
    let b = Client::connect(&group.url()).await.unwrap();
    let lease = Duration::from_secs(8);
    let leader = a
        .election("f")
        .lease(lease)
        .holder_info("a")
        .campaign()
        .await
        .unwrap();
    let replica = group.replicas()[0].addr();
    eventually(
        "the replica has the leader record",
        Duration::from_secs(5),
        async || group.node_mut(&replica).exists("fencelock:{f}:holder"),
    )
    .await;
    let standby = tokio::spawn(b.election("f").lease(lease).campaign());
    let old = group.kill_master();
    group.wait_for_new_master(&old, FAILOVER);
    // The leader renews on the new master and never loses its leadership; the new
    // master names it.
    eventually(
        "the new master names the leader",
        FAILOVER,
        async || matches!(a.election("f").leader().await, Ok(Some(l)) if l.term == leader.term()),
    )
    .await;
    tokio::time::sleep(lease / 2).await;
    assert_eq!(leader.loss_cause(), None);
    assert!(!standby.is_finished(), "one leader at a time");
    // Its resignation goes to the new master and hands over with a higher term.
    let term = leader.term();
    leader.resign().await.unwrap();
    let next = tokio::time::timeout(FAILOVER, standby)
        .await
        .expect("the standby leads")
        .unwrap()
        .unwrap();
    assert!(next.term() > term);
    next.resign().await.unwrap();
}

#[tokio::test]
async fn on_a_cluster_followers_hear_wins_and_resignations_by_sharded_pubsub() {
    let cluster = Cluster::shared();
    let a = Client::connect(&cluster.url()).await.unwrap();
    let b = Client::connect(&cluster.url()).await.unwrap();
    let watcher = Client::connect(&cluster.url()).await.unwrap();
    let mut observer = watcher.election("elect-cluster").observe().await.unwrap();
    assert_eq!(observer.leader(), None);
    // Well within the observer's 5 s re-read with nobody leading: by the message.
    let soon = Duration::from_millis(2500);
    let asked = Instant::now();
    let first = a
        .election("elect-cluster")
        .holder_info("a")
        .campaign()
        .await
        .unwrap();
    let seen = observer.changed().await.unwrap().expect("a leads");
    assert_eq!((seen.term, seen.info.as_str()), (first.term(), "a"));
    assert!(
        asked.elapsed() < soon,
        "heard the win after {:?}",
        asked.elapsed()
    );
    // b stands by; a's resignation wakes it, long before the 30 s lease would end.
    let standby = tokio::spawn(b.election("elect-cluster").holder_info("b").campaign());
    eventually("the standby waits", Duration::from_secs(5), async || {
        b.stats().waiters == 1
    })
    .await;
    let resigned = Instant::now();
    let term = first.term();
    first.resign().await.unwrap();
    let second = standby.await.unwrap().unwrap();
    assert!(
        resigned.elapsed() < Duration::from_secs(10),
        "woken by the resignation"
    );
    assert!(second.term() > term);
    // The observer hears the resignation (nobody) or already the new leader.
    let mut now = observer.changed().await.unwrap();
    if now.is_none() {
        now = observer.changed().await.unwrap();
    }
    assert_eq!(now.map(|l| l.term), Some(second.term()));
    assert!(
        resigned.elapsed() < Duration::from_secs(10),
        "not by a re-read on a timer"
    );
    second.resign().await.unwrap();
}
