//! Semaphores: up to N holders at once, each permit a lease of its own with its own
//! fencing token, renewed by the watchdog, freed one lease after its holder crashed,
//! waited for by pub/sub. Against real redis-server processes (single, Cluster,
//! Sentinel), with real faults.

use std::time::{Duration, Instant};

use fencelock::{Blocker, Client, Error, Holder, LossCause};
use testkit::{Cluster, RedisServer, SentinelGroup};

mod common;
use common::{
    commands_run, count_commands, eventually, listed, numsub, script_sizes, spawn_helper,
};

const HELPER_ENV: &str = "FENCELOCK_SEMAPHORE_HELPER";

/// The server's clock, ms (the clock fair queues' deadlines are on).
fn server_ms(r: &RedisServer) -> u64 {
    let time = r.cmd(&["TIME"]);
    let parts = time.as_array().expect("TIME");
    let secs: u64 = parts[0].as_str().unwrap().parse().unwrap();
    let micros: u64 = parts[1].as_str().unwrap().parse().unwrap();
    secs * 1000 + micros / 1000
}

fn zcard(r: &RedisServer, key: &str) -> i64 {
    r.cmd(&["ZCARD", key]).as_int().expect("ZCARD")
}

#[test]
#[ignore = "helper process entry point, started by the tests below"]
fn helper_process() {
    common::helper_entry(HELPER_ENV, async |c, words| {
        let [name, permits, lease] = &words[..] else {
            panic!("bad spec {words:?}")
        };
        let lease = Duration::from_millis(lease.parse().unwrap());
        let _permit = c
            .semaphore(name, permits.parse().unwrap())
            .lease(lease)
            .try_acquire()
            .await
            .unwrap();
        std::future::pending::<()>().await;
    });
}

#[tokio::test]
async fn n_holders_at_once_each_with_its_own_token_and_a_release_wakes_a_waiter() {
    let r = RedisServer::start();
    let clients = [
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
    ];
    let mut held = Vec::new();
    for c in &clients[..3] {
        held.push(c.semaphore("exports", 3).try_acquire().await.unwrap());
    }
    let tokens: Vec<u64> = held.iter().map(|g| g.fencing_token().get()).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "each grant has a higher token: {tokens:?}"
    );
    assert_eq!(zcard(&r, "fencelock:{exports}"), 3);
    assert_eq!(r.get("fencelock:{exports}:permits").as_deref(), Some("3"));

    // The fourth finds every permit held and is told when the first frees.
    let e = clients[3]
        .semaphore("exports", 3)
        .try_acquire()
        .await
        .unwrap_err();
    match &e {
        Error::Held {
            blocked_by: Blocker::Permits {
                permits, frees_in, ..
            },
            ..
        } => {
            assert_eq!(*permits, 3);
            assert!(
                *frees_in > Duration::from_secs(25) && *frees_in <= Duration::from_secs(30),
                "{frees_in:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("semaphore \"exports\" has no free permit: all 3 permits are held"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1);

    // A waiter is woken by the release: the 30 s leases run far beyond its 10 s wait,
    // so only the release message can get it the permit in time.
    let waiter = tokio::spawn(
        clients[3]
            .semaphore("exports", 3)
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    eventually(
        "the waiter is subscribed",
        Duration::from_secs(5),
        async || numsub(&r, "fencelock:{exports}:released") == 1,
    )
    .await;
    let released_at = Instant::now();
    held.remove(0).release().await.unwrap();
    let fourth = waiter.await.unwrap().expect("woken by the release");
    assert!(
        released_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        released_at.elapsed()
    );
    assert!(fourth.fencing_token().get() > tokens[2]);
    assert_eq!(zcard(&r, "fencelock:{exports}"), 3);
    for g in held {
        g.release().await.unwrap();
    }
    fourth.release().await.unwrap();
    assert!(
        !r.exists("fencelock:{exports}"),
        "the last release empties the set"
    );
}

#[tokio::test]
async fn a_sigkilled_holders_permit_frees_after_one_lease_and_not_before() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lease = Duration::from_millis(1500);
    let mut holder = spawn_helper(
        "helper_process",
        HELPER_ENV,
        format!("{} pool 1 {}", r.url(), lease.as_millis()),
    );
    eventually(
        "the helper holds the permit",
        Duration::from_secs(10),
        async || zcard(&r, "fencelock:{pool}") == 1,
    )
    .await;
    holder.kill().unwrap();
    holder.wait().unwrap();
    let killed_at = Instant::now();
    assert!(matches!(
        c.semaphore("pool", 1).try_acquire().await,
        Err(Error::Held {
            blocked_by: Blocker::Permits { permits: 1, .. },
            ..
        })
    ));
    let next = c
        .semaphore("pool", 1)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the dead holder's permit frees");
    let after = killed_at.elapsed();
    assert!(after <= lease + Duration::from_millis(500), "{after:?}");
    assert_eq!(zcard(&r, "fencelock:{pool}"), 1, "only the new holder");
    next.release().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_renews_a_permit_and_a_fixed_one_is_lost_when_it_ends() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lease = Duration::from_millis(300);
    let renewed = c
        .semaphore("jobs", 2)
        .lease(lease)
        .try_acquire()
        .await
        .unwrap();
    let fixed = c
        .semaphore("jobs", 2)
        .lease(lease)
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let fixed_token = fixed.holder_token().as_str().to_owned();
    // The fixed permit's loss is an event; by then the renewed one has outlived its
    // lease several times over.
    assert_eq!(fixed.lost().await, LossCause::Expired);
    let started = Instant::now();
    while started.elapsed() < lease * 3 {
        assert!(renewed.loss_cause().is_none());
        assert!(
            r.cmd(&[
                "ZSCORE",
                "fencelock:{jobs}",
                renewed.holder_token().as_str()
            ])
            .as_str()
            .is_some(),
            "still held after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The ended permit counts no more: another holder gets it.
    let other = c.semaphore("jobs", 2).try_acquire().await.unwrap();
    assert!(
        r.cmd(&["ZSCORE", "fencelock:{jobs}", &fixed_token])
            .as_str()
            .is_none()
    );
    assert!(matches!(
        fixed.release().await,
        Err(Error::LeaseLost {
            cause: LossCause::Expired,
            ..
        })
    ));
    other.release().await.unwrap();
    renewed.release().await.unwrap();
}

#[tokio::test]
async fn a_permit_removed_from_outside_is_reported_lost_by_the_watchdog() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let g = c
        .semaphore("ops", 2)
        .lease(Duration::from_millis(300))
        .try_acquire()
        .await
        .unwrap();
    r.cmd(&["ZREM", "fencelock:{ops}", g.holder_token().as_str()]);
    let cause = tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("the next renewal notices");
    assert_eq!(cause, LossCause::Deleted);
}

#[tokio::test]
async fn another_permit_count_is_refused_and_changes_nothing() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let g = c.semaphore("db", 2).try_acquire().await.unwrap();
    let e = c.semaphore("db", 3).try_acquire().await.unwrap_err();
    assert!(
        matches!(&e, Error::PermitsMismatch { name, count: 2, asked: 3, .. } if name == "db"),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("semaphore \"db\"") && text.contains("has 2 permits, not the 3 asked for"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1);
    assert_eq!(r.get("fencelock:{db}:permits").as_deref(), Some("2"));
    assert_eq!(zcard(&r, "fencelock:{db}"), 1);
    // Still refused once no permit is held: the count is the semaphore's.
    g.release().await.unwrap();
    assert!(matches!(
        c.semaphore("db", 1).try_acquire().await,
        Err(Error::PermitsMismatch {
            count: 2,
            asked: 1,
            ..
        })
    ));
    assert!(!r.exists("fencelock:{db}"));
}

#[tokio::test]
async fn a_name_is_one_kind_of_primitive() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lock = c.lock("taken").try_acquire().await.unwrap();
    let e = c.semaphore("taken", 2).try_acquire().await.unwrap_err();
    assert!(
        matches!(&e, Error::WrongType { found, .. } if found == "string"),
        "{e:?}"
    );
    assert!(e.to_string().contains("holds a lock"), "{e}");
    assert_eq!(
        r.get("fencelock:{taken}").as_deref(),
        Some(lock.holder_token().as_str())
    );

    let reentrant = c.lock("mine").reentrant("me").try_acquire().await.unwrap();
    let e = c.semaphore("mine", 2).try_acquire().await.unwrap_err();
    assert!(e.to_string().contains("holds a reentrant lock"), "{e}");

    let permit = c.semaphore("pool", 2).try_acquire().await.unwrap();
    for e in [
        c.lock("pool").try_acquire().await.unwrap_err(),
        c.lock("pool")
            .reentrant("me")
            .try_acquire()
            .await
            .unwrap_err(),
        c.lock("pool").fair().try_acquire().await.unwrap_err(),
    ] {
        // Its permits' key says so, or (a plain lock reads it first) its fencing counter.
        assert!(
            matches!(&e, Error::WrongType { found, .. } if found == "zset" || found == "semaphore"),
            "{e:?}"
        );
        assert!(e.to_string().contains("holds a semaphore"), "{e}");
        assert_eq!(e.to_string().lines().count(), 1);
    }
    assert_eq!(zcard(&r, "fencelock:{pool}"), 1);
    permit.release().await.unwrap();
    reentrant.release().await.unwrap();
    lock.release().await.unwrap();

    // Idle, each name stays its kind while its fencing counter lives: no permit held
    // (its permits' key gone), the semaphore's name is refused to every lock and a
    // reader; a free lock's name to a semaphore. Nothing is written.
    assert!(!r.exists("fencelock:{pool}"));
    for e in [
        c.lock("pool").try_acquire().await.unwrap_err(),
        c.lock("pool").fair().try_acquire().await.unwrap_err(),
        c.lock("pool")
            .reentrant("me")
            .try_acquire()
            .await
            .unwrap_err(),
        c.read_lock("pool").try_acquire().await.unwrap_err(),
    ] {
        assert!(
            matches!(&e, Error::WrongType { found, .. } if found == "semaphore"),
            "{e:?}"
        );
    }
    assert!(!r.exists("fencelock:{pool}"));
    let again = c.semaphore("pool", 2).try_acquire().await.unwrap();
    again.release().await.unwrap();
    assert!(!r.exists("fencelock:{taken}"));
    let e = c.semaphore("taken", 2).try_acquire().await.unwrap_err();
    assert!(
        matches!(&e, Error::WrongType { found, .. } if found == "lock"),
        "{e:?}"
    );
    assert!(e.to_string().contains("the name is a lock's"), "{e}");
    assert!(!r.exists("fencelock:{taken}:permits"));
    // A semaphore of an earlier version (its counter unmarked, its count stored) is
    // taken as before, and its counter marked from then on.
    r.cmd(&["SET", "fencelock:{old}:fence", "5"]);
    r.cmd(&["SET", "fencelock:{old}:permits", "2"]);
    let old = c.semaphore("old", 2).try_acquire().await.unwrap();
    assert!(old.fencing_token().get() > 5);
    assert_eq!(
        r.get("fencelock:{old}:fence"),
        Some(format!("s{}", old.fencing_token()))
    );
    old.release().await.unwrap();
}

#[tokio::test]
async fn bad_permit_counts_and_combinations_are_invalid_and_write_nothing() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let cases = [
        (c.semaphore("s", 0), "permits"),
        (c.semaphore("s", 1_000_001), "permits"),
        // A reentrant semaphore or one with holder info does not compile (the
        // compile_fail examples on AcquireBuilder show it).
    ];
    for (builder, field) in cases {
        let e = builder.try_acquire().await.unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { what, .. } if *what == field),
            "{e:?}"
        );
    }
    assert_eq!(r.cmd(&["DBSIZE"]).as_int(), Some(0));

    let nodes = RedisServer::start_many(3);
    let redlock = Client::redlock(nodes.iter().map(RedisServer::url))
        .connect()
        .await
        .unwrap();
    let e = redlock.semaphore("s", 2).try_acquire().await.unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { reason, .. } if reason.contains("single Redis node")),
        "{e:?}"
    );
    for n in &nodes {
        assert_eq!(n.cmd(&["DBSIZE"]).as_int(), Some(0));
    }
}

#[tokio::test]
async fn permits_on_a_cluster_are_held_renewed_and_waited_for() {
    let cluster = Cluster::shared();
    let c = Client::connect(&cluster.url()).await.unwrap();
    let lease = Duration::from_millis(600);
    let a = c
        .semaphore("cpool", 2)
        .lease(lease)
        .try_acquire()
        .await
        .unwrap();
    let b = c
        .semaphore("cpool", 2)
        .lease(lease)
        .try_acquire()
        .await
        .unwrap();
    assert!(b.fencing_token() > a.fencing_token());
    let waiter = tokio::spawn(
        c.semaphore("cpool", 2)
            .lease(lease)
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    // Renewed across several leases while the waiter waits.
    tokio::time::sleep(lease * 3).await;
    assert!(a.loss_cause().is_none() && b.loss_cause().is_none());
    assert!(!waiter.is_finished());
    a.release().await.unwrap();
    let third = waiter.await.unwrap().expect("woken by sharded pub/sub");
    assert!(third.fencing_token() > b.fencing_token());
    third.release().await.unwrap();
    b.release().await.unwrap();
}

#[tokio::test]
async fn permits_on_a_sentinel_managed_master() {
    let group = SentinelGroup::start();
    let c = Client::connect(&group.url()).await.unwrap();
    let a = c.semaphore("spool", 1).try_acquire().await.unwrap();
    assert!(matches!(
        c.semaphore("spool", 1).try_acquire().await,
        Err(Error::Held { .. })
    ));
    a.release().await.unwrap();
    c.semaphore("spool", 1)
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn inspect_and_list_show_permits_held_and_free() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let short = c
        .semaphore("pool:a", 3)
        .lease(Duration::from_secs(10))
        .try_acquire()
        .await
        .unwrap();
    let long = c.semaphore("pool:a", 3).try_acquire().await.unwrap();
    let _lock = c.lock("pool:b").try_acquire().await.unwrap();

    let status = c.inspect("pool:a").await.unwrap();
    let state = status.nodes[0].state.as_ref().unwrap();
    match &state.holder {
        Some(Holder::Semaphore { permits, held }) => {
            assert_eq!(*permits, Some(3));
            assert_eq!(held.len(), 2, "{held:?}");
            assert!(
                held[0] <= Duration::from_secs(10),
                "soonest first: {held:?}"
            );
            assert!(held[1] > Duration::from_secs(25), "{held:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(state.fencing_counter, Some(long.fencing_token().get()));

    let names: Vec<String> = c
        .list("pool:*")
        .await
        .unwrap()
        .locks
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["pool:a", "pool:b"]);

    short.release().await.unwrap();
    long.release().await.unwrap();
    let state = c
        .inspect("pool:a")
        .await
        .unwrap()
        .nodes
        .remove(0)
        .state
        .unwrap();
    assert_eq!(state.holder, None, "no permit held: free");
    let names: Vec<String> = c
        .list("pool:*")
        .await
        .unwrap()
        .locks
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["pool:b"]);
}

#[tokio::test]
async fn growing_wakes_waiters_and_shrinking_revokes_nothing() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let first = c.semaphore("lanes", 1).try_acquire().await.unwrap();
    // A waiter for the count the semaphore has. Another count is refused at once:
    // the count is the semaphore's, changed only by set_permits.
    let other = Client::connect(&r.url()).await.unwrap();
    assert!(matches!(
        other.semaphore("lanes", 3).try_acquire().await,
        Err(Error::PermitsMismatch {
            count: 1,
            asked: 3,
            ..
        })
    ));
    let waiter = tokio::spawn(
        other
            .semaphore("lanes", 1)
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    eventually(
        "the waiter is subscribed",
        Duration::from_secs(5),
        async || numsub(&r, "fencelock:{lanes}:released") == 1,
    )
    .await;

    // Grown to 3: the resize wakes the waiter (the 30 s lease of `first` runs far past
    // its 10 s wait), which learns at once that the count changed.
    let resized_at = Instant::now();
    let resized = c.set_permits("lanes", 3).await.unwrap();
    assert_eq!(resized.previous, Some(1));
    assert_eq!(resized.held, 1);
    assert!(matches!(
        waiter.await.unwrap(),
        Err(Error::PermitsMismatch {
            count: 3,
            asked: 1,
            ..
        })
    ));
    assert!(
        resized_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        resized_at.elapsed()
    );
    let mut granted = Vec::new();
    for _ in 0..2 {
        granted.push(
            other
                .semaphore("lanes", 3)
                .try_acquire()
                .await
                .expect("a grown permit"),
        );
    }
    assert_eq!(zcard(&r, "fencelock:{lanes}"), 3);

    // Shrunk to 1 with 3 held: nobody loses a permit, nobody new gets one until the
    // holders are under 1.
    let resized = c.set_permits("lanes", 1).await.unwrap();
    assert_eq!((resized.previous, resized.held), (Some(3), 3));
    assert_eq!(zcard(&r, "fencelock:{lanes}"), 3);
    assert!(first.loss_cause().is_none());
    assert!(matches!(
        c.semaphore("lanes", 1).try_acquire().await,
        Err(Error::Held {
            blocked_by: Blocker::Permits { permits: 1, .. },
            ..
        })
    ));
    first.release().await.unwrap();
    granted.pop().unwrap().release().await.unwrap();
    assert!(
        c.semaphore("lanes", 1).try_acquire().await.is_err(),
        "1 still held"
    );
    granted.pop().unwrap().release().await.unwrap();
    c.semaphore("lanes", 1)
        .try_acquire()
        .await
        .expect("under the new count")
        .release()
        .await
        .unwrap();

    for bad in [0, 1_000_001] {
        assert!(matches!(
            c.set_permits("lanes", bad).await,
            Err(Error::InvalidArgument { .. })
        ));
    }
    let _lock = c.lock("plain").try_acquire().await.unwrap();
    assert!(matches!(
        c.set_permits("plain", 2).await,
        Err(Error::WrongType { .. })
    ));
}

#[tokio::test]
async fn a_cancelled_wait_for_a_permit_leaves_nothing_behind() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let held = c.semaphore("one", 1).try_acquire().await.unwrap();
    let waiting = tokio::spawn(c.semaphore("one", 1).wait_forever().acquire());
    eventually(
        "the waiter is subscribed",
        Duration::from_secs(5),
        async || numsub(&r, "fencelock:{one}:released") == 1,
    )
    .await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    eventually(
        "the subscription is gone",
        Duration::from_secs(5),
        async || numsub(&r, "fencelock:{one}:released") == 0,
    )
    .await;
    assert_eq!(zcard(&r, "fencelock:{one}"), 1, "only the holder's permit");
    eventually(
        "the client is off the wake list",
        Duration::from_secs(5),
        async || !r.exists("fencelock:{one}:wakes"),
    )
    .await;
    held.release().await.unwrap();
    assert!(!r.exists("fencelock:{one}"));
}

#[tokio::test]
async fn break_frees_every_permit_wakes_waiters_and_fences_the_evicted_holders() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // 30 s leases: only the break's messages can get the waiter a permit within its wait.
    let mut a = c.semaphore("stuck", 2).try_acquire().await.unwrap();
    let b = c.semaphore("stuck", 2).try_acquire().await.unwrap();
    let other = Client::connect(&r.url()).await.unwrap();
    let waiter = tokio::spawn(
        other
            .semaphore("stuck", 2)
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    eventually(
        "the waiter is subscribed",
        Duration::from_secs(5),
        async || numsub(&r, "fencelock:{stuck}:released") == 1,
    )
    .await;

    let broken_at = Instant::now();
    let broken = c.break_lock("stuck").await.unwrap();
    let outcome = broken.nodes[0].outcome.as_ref().unwrap();
    match &outcome.broke {
        Some(Holder::Semaphore { held, .. }) => assert_eq!(held.len(), 2, "{held:?}"),
        other => panic!("{other:?}"),
    }
    let counter = outcome.fencing_counter.unwrap();
    assert!(counter > a.fencing_token().get() && counter > b.fencing_token().get());
    let next = waiter.await.unwrap().expect("a permit freed by the break");
    assert!(
        broken_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        broken_at.elapsed()
    );
    assert!(next.fencing_token().get() > counter);
    // The evicted holders find their permits gone.
    assert!(matches!(
        a.extend(Duration::from_secs(30)).await,
        Err(Error::LeaseLost {
            cause: LossCause::Expired,
            ..
        })
    ));
    assert!(matches!(b.release().await, Err(Error::LeaseLost { .. })));
    assert_eq!(zcard(&r, "fencelock:{stuck}"), 1, "only the new holder");
    assert_eq!(r.get("fencelock:{stuck}:permits").as_deref(), Some("2"));
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_fair_semaphore_serves_its_waiters_in_arrival_order() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let other = Client::connect(&r.url()).await.unwrap();
    let fair = |c: &Client| c.semaphore("line", 2).fair().wait(Duration::from_secs(10));
    // A newcomer that only tries does not take a free permit while as many others wait
    // as there are free permits (waiters written by hand, with deadlines far ahead).
    let far = (server_ms(&r) + 60_000).to_string();
    for ghost in ["deadbeef".repeat(4), "feedface".repeat(4)] {
        r.cmd(&["RPUSH", "fencelock:{line}:queue", &ghost]);
        r.cmd(&["ZADD", "fencelock:{line}:waiters", &far, &ghost]);
    }
    let e = fair(&c).try_acquire().await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Held {
                blocked_by: Blocker::Queue,
                ..
            }
        ),
        "{e:?}"
    );
    r.cmd(&["DEL", "fencelock:{line}:queue", "fencelock:{line}:waiters"]);
    let a = fair(&c).acquire().await.unwrap();
    let b = fair(&c).acquire().await.unwrap();
    // Three waiters, from two clients, queue in this order.
    let mut waiting = Vec::new();
    for (i, client) in [&c, &other, &c].into_iter().enumerate() {
        waiting.push(tokio::spawn(fair(client).acquire()));
        eventually(
            "the waiter is in line",
            Duration::from_secs(5),
            async || r.cmd(&["LLEN", "fencelock:{line}:queue"]).as_int() == Some(i as i64 + 1),
        )
        .await;
    }
    let first_token = a.fencing_token();
    a.release().await.unwrap();
    let first = waiting.remove(0).await.unwrap().expect("the first in line");
    assert!(first.fencing_token() > first_token);
    assert!(waiting.iter().all(|w| !w.is_finished()));
    b.release().await.unwrap();
    let second = waiting
        .remove(0)
        .await
        .unwrap()
        .expect("the second in line");
    assert!(!waiting[0].is_finished());
    let e = fair(&other).try_acquire().await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Held {
                blocked_by: Blocker::Permits { .. },
                ..
            }
        ),
        "{e:?}"
    );
    first.release().await.unwrap();
    let third = waiting.remove(0).await.unwrap().expect("the third in line");
    assert!(third.fencing_token() > second.fencing_token());
    // A permit free while a waiter is in line goes to the waiter, not to a newcomer.
    let queued = tokio::spawn(fair(&other).acquire());
    eventually(
        "the fourth is in line",
        Duration::from_secs(5),
        async || r.cmd(&["LLEN", "fencelock:{line}:queue"]).as_int() == Some(1),
    )
    .await;
    second.release().await.unwrap();
    let fourth = queued.await.unwrap().expect("the waiter in line");
    third.release().await.unwrap();
    fourth.release().await.unwrap();
    assert!(!r.exists("fencelock:{line}:queue"));
}

#[tokio::test]
async fn a_fair_semaphores_crashed_or_cancelled_waiter_does_not_block_the_line() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let timeout = Duration::from_millis(300);
    let fair = || {
        c.semaphore("q", 1)
            .waiter_timeout(timeout)
            .wait(Duration::from_secs(10))
    };
    let held = fair().acquire().await.unwrap();
    // A waiter cancelled in line leaves it at once.
    let cancelled = tokio::spawn(fair().acquire());
    eventually("in line", Duration::from_secs(5), async || {
        r.cmd(&["LLEN", "fencelock:{q}:queue"]).as_int() == Some(1)
    })
    .await;
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    eventually(
        "the cancelled waiter left",
        Duration::from_secs(5),
        async || r.cmd(&["LLEN", "fencelock:{q}:queue"]).as_int() == Some(0),
    )
    .await;
    // A waiter that stopped calling (its entry written by hand, as a crashed client
    // leaves it: first in line, silent from now) is purged once its timeout ran out;
    // the live waiter behind it gets the freed permit then.
    let ghost = "deadbeefdeadbeefdeadbeefdeadbeef";
    let deadline = (server_ms(&r) + timeout.as_millis() as u64).to_string();
    r.cmd(&["RPUSH", "fencelock:{q}:queue", ghost]);
    r.cmd(&["ZADD", "fencelock:{q}:waiters", &deadline, ghost]);
    let next = tokio::spawn(fair().acquire());
    eventually(
        "the live waiter is in line",
        Duration::from_secs(5),
        async || r.cmd(&["LLEN", "fencelock:{q}:queue"]).as_int() == Some(2),
    )
    .await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let next = next.await.unwrap().expect("the dead waiter was purged");
    // Within the dead waiter's timeout and a third of it (the live one's next call).
    assert!(released_at.elapsed() < timeout * 4 / 3 + Duration::from_millis(300));
    assert_eq!(r.cmd(&["LLEN", "fencelock:{q}:queue"]).as_int(), Some(0));
    next.release().await.unwrap();
}

/// Both permits of the semaphore `name` of 2, held for 60 s (not renewed: every script
/// call counted is an attempt or a release), by a client with its scripts loaded.
async fn both_permits_held(r: &RedisServer, name: &str) -> (Client, [fencelock::LockGuard; 2]) {
    let c = Client::connect(&r.url()).await.unwrap();
    let permit = || {
        c.semaphore(name, 2)
            .lease(Duration::from_secs(60))
            .renew(false)
            .try_acquire()
    };
    let held = [permit().await.unwrap(), permit().await.unwrap()];
    (c, held)
}

/// A waiting acquire of a permit of `name` (of 2), 60 s leases not renewed.
fn permit_waiter(
    c: &Client,
    name: &str,
) -> impl std::future::Future<Output = Result<fencelock::LockGuard, Error>> + Send + 'static {
    c.semaphore(name, 2)
        .lease(Duration::from_secs(60))
        .renew(false)
        .wait(Duration::from_secs(30))
        .acquire()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_permit_wakes_one_waiting_client_by_name_not_every_client() {
    let r = RedisServer::start();
    let (_holder_client, [first_permit, second_permit]) = both_permits_held(&r, "herd").await;
    let clients = [
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
    ];
    let before_waiters = r.script_calls();
    let mut waiting: Vec<_> = clients
        .iter()
        .map(|c| Some(tokio::spawn(permit_waiter(c, "herd"))))
        .collect();
    // Each waiter's two refused attempts (before and after subscribing); the second
    // listed its client.
    eventually("3 clients listed", Duration::from_secs(5), async || {
        listed(&r, "herd").len() == 3 && r.script_calls() == before_waiters + 6
    })
    .await;
    let order = listed(&r, "herd");

    let before = r.script_calls();
    first_permit.release().await.unwrap();
    // The client listed first was woken and took the permit; the other two were not
    // woken (a release to every client would make it 4 calls).
    eventually(
        "a client's waiter is done",
        Duration::from_secs(5),
        async || clients.iter().any(|c| c.stats().waiters == 0),
    )
    .await;
    let woken = clients.iter().position(|c| c.stats().waiters == 0).unwrap();
    let permit = tokio::time::timeout(Duration::from_secs(5), waiting[woken].take().unwrap())
        .await
        .expect("the woken client got the permit")
        .unwrap()
        .unwrap();
    assert_eq!(r.script_calls(), before + 2, "the release and one attempt");
    assert_eq!(
        listed(&r, "herd"),
        order[1..],
        "the first client left the list"
    );
    assert_eq!(
        clients.iter().map(|c| c.stats().waiters).sum::<usize>(),
        2,
        "the others still wait"
    );

    // Each release hands a permit to the next client listed, one attempt each.
    let before = r.script_calls();
    second_permit.release().await.unwrap();
    permit.release().await.unwrap();
    for w in waiting.into_iter().flatten() {
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("woken by a release")
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // Four releases and two attempts.
    assert_eq!(r.script_calls(), before + 6);
    assert!(
        !r.exists("fencelock:{herd}:wakes"),
        "an empty list leaves no key"
    );
}

#[tokio::test]
async fn a_client_woken_for_a_permit_whose_waiter_was_cancelled_hands_the_wake_on() {
    let r = RedisServer::start();
    let (_holder_client, [first_permit, _second_permit]) = both_permits_held(&r, "baton").await;
    let clients = [
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
    ];
    // The first client's waiter is a future only this test polls: woken, it does not
    // run until polled again.
    let mut first = Box::pin(permit_waiter(&clients[0], "baton"));
    tokio::select! {
        result = &mut first => panic!("got a permit of a full semaphore: {result:?}"),
        () = eventually("the first client listed", Duration::from_secs(5), async || {
            listed(&r, "baton").len() == 1
        }) => {}
    }
    // The server's clock moves on, so that the second client is listed after the first.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = tokio::spawn(permit_waiter(&clients[1], "baton"));
    eventually("both clients listed", Duration::from_secs(5), async || {
        listed(&r, "baton").len() == 2
    })
    .await;

    let before = r.script_calls();
    first_permit.release().await.unwrap();
    eventually(
        "the first client taken off the list",
        Duration::from_secs(5),
        async || listed(&r, "baton").len() == 1,
    )
    .await;
    assert_eq!(
        r.script_calls(),
        before + 1,
        "the release only: the first client's waiter did not run, the second was not woken"
    );
    assert_eq!(zcard(&r, "fencelock:{baton}"), 1, "a permit is free");

    drop(first);
    // Asleep, it would wait out the 60 s leases.
    let permit = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second client got the wake the first one handed on")
        .unwrap()
        .unwrap();
    permit.release().await.unwrap();
}

#[tokio::test]
async fn a_fair_semaphores_waiters_wait_for_their_turn_without_polling() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // Leases and waiter timeouts long enough that no waiter calls again (every 10 s)
    // and nothing is renewed before the end.
    let permit = || {
        c.semaphore("line", 1)
            .fair()
            .waiter_timeout(Duration::from_secs(30))
            .lease(Duration::from_secs(30))
            .wait(Duration::from_secs(20))
    };
    let holder = permit().try_acquire().await.unwrap();
    let queue = || r.cmd(&["LLEN", "fencelock:{line}:queue"]).as_int();
    let start = r.script_calls();
    let first = tokio::spawn(permit().acquire());
    // In line, subscribed, and done with its attempts: the one that joined the line and
    // the one after subscribing.
    eventually(
        "the first waiter in line",
        Duration::from_secs(5),
        async || {
            queue() == Some(1)
                && numsub(&r, "fencelock:{line}:released") == 1
                && r.script_calls() == start + 2
        },
    )
    .await;
    // The first waiter keeps the channel open: the second joins it before its first
    // attempt, so one refusal is all it sends before its turn.
    let before = r.script_calls();
    let second = tokio::spawn(permit().acquire());
    eventually(
        "the second waiter in line",
        Duration::from_secs(5),
        async || queue() == Some(2),
    )
    .await;
    // The release frees the permit while both wait: the first is named and takes it;
    // the second, refused as "others first" if it tried, waits for its turn.
    holder.release().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the first waiter's turn")
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        r.script_calls() - before,
        3,
        "the second waiter's one attempt, the release and the first waiter's attempt"
    );
    first.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second waiter's turn")
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// What an uncontended permit costs Redis (docs/benchmarks.md, "Redis's work per lock"):
/// its release, with nobody listed on the wake list, runs four commands and announces
/// nothing.
#[tokio::test]
async fn an_uncontended_permit_release_runs_the_fewest_commands() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // Once first: the scripts loaded, the server asked what it offers.
    let g = c.semaphore("pool", 4).try_acquire().await.unwrap();
    g.release().await.unwrap();
    let g = c.semaphore("pool", 4).try_acquire().await.unwrap();
    count_commands(&r);
    g.release().await.unwrap();
    let expected = [
        ("evalsha", 1), // release.lua
        ("exists", 1),  // the wake list: nobody listed, nothing announced
        ("time", 1),    // the lease not over
        ("zrem", 1),    // the permit
        ("zscore", 1),  // the permit's lease
    ];
    let expected: Vec<(String, u64)> = expected.iter().map(|(n, c)| ((*n).into(), *c)).collect();
    assert_eq!(commands_run(&r), expected);
}

/// What an uncontended permit costs Redis (docs/benchmarks.md, "Redis's work per lock"):
/// its acquire, a free permit of a semaphore that is not fair with nobody waiting,
/// sends three keys and four arguments and runs the fewest commands (no expired permit
/// to drop from an empty set, one TIME), answering its fencing token.
#[tokio::test]
async fn an_uncontended_permit_acquire_runs_the_fewest_commands() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // Once first: the scripts loaded, the server asked what it offers, the counter and
    // the permit count stored.
    let g = c.semaphore("pool", 4).try_acquire().await.unwrap();
    let first = g.fencing_token();
    g.release().await.unwrap();
    count_commands(&r);
    let g = c.semaphore("pool", 4).try_acquire().await.unwrap();
    assert!(g.fencing_token() > first, "a higher token");
    let expected = [
        ("evalsha", 1), // acquire.lua
        ("get", 2),     // the counter, the permit count
        ("pexpire", 1), // the permit set lives with its lease
        ("set", 2),     // the permit count, the counter
        ("time", 1),    // the lease's end, the token's floor
        ("zadd", 1),    // the permit
        ("zcard", 1),   // the permits held: none
    ];
    let expected: Vec<(String, u64)> = expected.iter().map(|(n, c)| ((*n).into(), *c)).collect();
    assert_eq!(commands_run(&r), expected);
    assert_eq!(
        script_sizes(&r),
        [("3".to_owned(), 7)],
        "(keys, keys + arguments)"
    );
    g.release().await.unwrap();
}
