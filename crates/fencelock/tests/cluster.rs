//! Locks on a Redis Cluster (real redis-server processes, 3 masters): every lock name on
//! the master of its slot, waiters woken by sharded pub/sub, renewals batched per node,
//! a slot migrated and a master killed while locks are held; and the bad days, one line
//! each.
//!
//! Tests that only take locks share one cluster ([`Cluster::shared`], each with lock
//! names of its own); those that kill, reshard or break a cluster start their own.

use std::time::{Duration, Instant};

use fencelock::{Client, Error, Holder, LossCause, UnavailableReason};
use futures_util::future::join_all;
use testkit::{Cluster, RedisServer};

mod common;
use common::eventually;

/// The key of lock `name` under the default prefix.
fn key(name: &str) -> String {
    format!("fencelock:{{{name}}}")
}

/// How long a failover may take here: a master's death is noticed after the 1 s node
/// timeout, its replica promoted in about 1.3 s more (2.3 s measured for `cluster_state`
/// to be ok again), with room for a loaded 2-core machine.
const FAILOVER: Duration = Duration::from_secs(15);

/// Every key of `node` matching `pattern`, by SCAN.
fn keys_on(node: &RedisServer, pattern: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let page = node.cmd(&["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"]);
        let page = page.as_array().expect("SCAN replies with an array");
        cursor = page[0].as_str().expect("a cursor").to_owned();
        keys.extend(
            page[1]
                .as_array()
                .expect("keys")
                .iter()
                .map(|k| k.as_str().expect("a key").to_owned()),
        );
        if cursor == "0" {
            return keys;
        }
    }
}

/// Whether the cluster's servers have sharded pub/sub (Redis 7 and Valkey; Redis 6.2,
/// which `REDIS_SERVER` may name, has not: fencelock then announces with classic
/// `PUBLISH` and subscribes with classic `SUBSCRIBE` on the lock's master).
fn sharded(cluster: &Cluster) -> bool {
    !cluster.masters()[0].version().starts_with("Redis 6.")
}

/// `PUBSUB SHARDNUMSUB` on a cluster with sharded pub/sub, else `PUBSUB NUMSUB`: how
/// fencelock's subscriptions are counted there.
fn numsub_kind(cluster: &Cluster) -> &'static str {
    if sharded(cluster) {
        "SHARDNUMSUB"
    } else {
        "NUMSUB"
    }
}

/// The number of subscribers `node` has for `channel`: `PUBSUB SHARDNUMSUB` (sharded)
/// or `PUBSUB NUMSUB` (classic).
fn subscribers(node: &RedisServer, kind: &str, channel: &str) -> i64 {
    let reply = node.cmd(&["PUBSUB", kind, channel]);
    reply
        .as_array()
        .and_then(|a| a.get(1)?.as_int())
        .unwrap_or_else(|| panic!("PUBSUB {kind}: {reply:?}"))
}

/// Takes lock `name` with `lease`, once.
async fn take(c: &Client, name: &str, lease: Duration) -> Result<fencelock::LockGuard, Error> {
    c.lock(name).lease(lease).try_acquire().await
}

/// The node of `cluster` at `addr`.
fn node<'a>(cluster: &'a Cluster, addr: &str) -> &'a RedisServer {
    cluster
        .nodes()
        .iter()
        .find(|n| n.addr() == addr)
        .unwrap_or_else(|| panic!("no node {addr}"))
}

/// A lock name (`{prefix}-{i}` for the first fitting `i`) whose slot `fits`.
fn name_where(prefix: &str, mut fits: impl FnMut(&str) -> bool) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|name| fits(name))
        .unwrap_or_else(|| panic!("no name {prefix}-N fits"))
}

#[tokio::test]
async fn a_thousand_locks_over_every_master_are_taken_renewed_waited_on_and_released() {
    let cluster = Cluster::shared();
    let c = Client::connect(&cluster.url()).await.unwrap();
    let names: Vec<String> = (0..1000).map(|i| format!("spread-{i}")).collect();
    // A short lease, renewed every 500 ms: held for 3 s, each is renewed several times.
    let lease = Duration::from_millis(1500);
    let taken = Instant::now();
    let mut guards: Vec<_> = join_all(names.iter().map(|n| take(&c, n, lease)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    eprintln!("1,000 locks taken in {:?}", taken.elapsed());
    // Each lock on the master of its slot, and every master has some.
    let masters = cluster.masters();
    let per_master: Vec<usize> = masters
        .iter()
        .map(|m| keys_on(m, "fencelock:{spread-*}").len())
        .collect();
    eprintln!("locks per master: {per_master:?}");
    assert!(per_master.iter().all(|&n| n > 100), "{per_master:?}");
    assert_eq!(per_master.iter().sum::<usize>(), 1000);

    tokio::time::sleep(lease * 2).await;
    assert!(guards.iter().all(|g| g.loss_cause().is_none()));
    // Held past twice the lease: renewed on every master. `list` scans every master.
    let held = c.list("spread-*").await.unwrap();
    assert!(held.unanswered.is_empty(), "{:?}", held.unanswered);
    assert_eq!(held.locks.len(), 1000);
    for status in &held.locks {
        match &status.nodes[0].state.as_ref().unwrap().holder {
            Some(Holder::Plain {
                remaining: Some(left),
            }) => assert!(*left > Duration::ZERO),
            other => panic!("{}: {other:?}", status.name),
        }
    }

    // A waiter on every lock, from another client. The leases are 30 s now, so a waiter
    // that gets its lock within a few seconds of the releases was woken by one.
    for result in join_all(guards.iter_mut().map(|g| g.extend(Duration::from_secs(30)))).await {
        result.unwrap();
    }
    let other = Client::connect(&cluster.url()).await.unwrap();
    let waiters: Vec<_> = names
        .iter()
        .map(|n| {
            let acquire = other.lock(n).wait(Duration::from_secs(60)).acquire();
            tokio::spawn(async move {
                let guard = acquire.await;
                (guard, Instant::now())
            })
        })
        .collect();
    eventually(
        "every waiter subscribed",
        Duration::from_secs(30),
        async || {
            masters
                .iter()
                .map(|m| {
                    let kind = if sharded(cluster) {
                        "SHARDCHANNELS"
                    } else {
                        "CHANNELS"
                    };
                    m.cmd(&["PUBSUB", kind, "fencelock:{spread-*}:released"])
                        .as_array()
                        .map_or(0, <[_]>::len)
                })
                .sum::<usize>()
                == 1000
        },
    )
    .await;
    let released = Instant::now();
    for result in join_all(guards.into_iter().map(|g| g.release())).await {
        result.unwrap();
    }
    let mut latencies = Vec::new();
    let mut next = Vec::new();
    for waiter in join_all(waiters).await {
        let (guard, at) = waiter.unwrap();
        next.push(guard.unwrap());
        latencies.push(at - released);
    }
    latencies.sort();
    let (median, slowest) = (latencies[500], latencies[999]);
    eprintln!("releases to the waiters' grants: median {median:?}, slowest {slowest:?}");
    assert!(slowest < Duration::from_secs(10), "{slowest:?}");

    for result in join_all(next.into_iter().map(|g| g.release())).await {
        result.unwrap();
    }
    assert!(c.list("spread-*").await.unwrap().locks.is_empty());
    for m in &masters {
        assert!(keys_on(m, "fencelock:{spread-*}").is_empty());
    }
}

#[tokio::test]
async fn a_release_wakes_a_waiter_by_sharded_pub_sub_at_once() {
    let cluster = Cluster::shared();
    let holder = Client::connect(&cluster.url()).await.unwrap();
    let other = Client::connect(&cluster.url()).await.unwrap();
    // A 30 s lease: a waiter woken within a second was woken by the release.
    let guard = holder
        .lock("wake")
        .lease(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(other.lock("wake").wait(Duration::from_secs(60)).acquire());
    eventually(
        "the waiter subscribed",
        Duration::from_secs(10),
        async || other.stats().waiters == 1,
    )
    .await;
    let channel = format!("{}:released", key("wake"));
    let owner = cluster.node_for_key(&key("wake"));
    let kind = numsub_kind(cluster);
    eventually(
        "the master of the lock's slot has the subscription",
        Duration::from_secs(10),
        async || subscribers(owner, kind, &channel) == 1,
    )
    .await;
    for node in cluster.nodes() {
        // Sharded: no classic subscription anywhere; classic (Redis 6.2): on the lock's
        // master only.
        let classic = i64::from(!sharded(cluster) && node.addr() == owner.addr());
        assert_eq!(
            subscribers(node, "NUMSUB", &channel),
            classic,
            "classic subscriptions on {}",
            node.addr()
        );
    }
    let released = Instant::now();
    guard.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    let latency = released.elapsed();
    eprintln!("release to the waiter's grant: {latency:?}");
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    next.release().await.unwrap();
    eventually(
        "the waiter unsubscribed",
        Duration::from_secs(10),
        async || other.stats().subscribed_channels == 0,
    )
    .await;
    assert_eq!(subscribers(owner, kind, &channel), 0);
}

/// Holds 1,000 leases of 3 s (over about 970 slots, renewed every second, the watchdog
/// ticking every 500 ms; taken together, so that they fall due together) through `c`
/// for 4 s after the first renewals (which load the script on every master), and
/// returns the renewal script calls each master ran in those 4 s. Every lease must stay
/// alive; they are released at the end.
async fn renewal_calls_per_master(cluster: &Cluster, c: &Client) -> Vec<u64> {
    let lease = Duration::from_secs(3);
    let names: Vec<String> = (0..1000).map(|i| format!("batch-{i}")).collect();
    let guards: Vec<_> = join_all(names.iter().map(|n| take(c, n, lease)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let masters = cluster.masters();
    let first = Instant::now() + lease / 3;
    tokio::time::sleep_until((first + Duration::from_millis(200)).into()).await;
    for m in &masters {
        m.cmd(&["CONFIG", "RESETSTAT"]);
    }
    let window = Duration::from_secs(4);
    tokio::time::sleep(window).await;
    let calls: Vec<u64> = masters.iter().map(|m| m.script_calls()).collect();
    assert!(guards.iter().all(|g| g.loss_cause().is_none()));
    eprintln!("renewal script calls per master in {window:?}: {calls:?}");
    for result in join_all(guards.into_iter().map(|g| g.release())).await {
        result.unwrap();
    }
    calls
}

#[tokio::test]
async fn renewals_cost_about_one_call_per_master_and_tick_not_one_per_slot() {
    let cluster = Cluster::builder().replicas_per_master(0).start();
    let c = Client::connect(&cluster.url()).await.unwrap();
    let calls = renewal_calls_per_master(&cluster, &c).await;
    // About 4 renewal rounds in the window, each due within one or two ticks (so one or
    // two batches); per slot it would be about 330 calls per master and round.
    for n in &calls {
        assert!((3..=16).contains(n), "{calls:?}");
    }
}

#[tokio::test]
async fn a_renewal_batch_goes_to_one_master_with_that_masters_leases() {
    let cluster = Cluster::builder().replicas_per_master(0).start();
    // Batches of 400: 1,000 leases cut into batches as they fall due, 400, 400 and 200
    // over every master, would cost each master 3 calls per tick; grouped by master
    // first, each master's third fits in one batch: 1 call per tick.
    let c = Client::builder(cluster.url())
        .renewal_batch(400)
        .connect()
        .await
        .unwrap();
    let calls = renewal_calls_per_master(&cluster, &c).await;
    // About 4 rounds, each due within one or two ticks: 4 to 9 calls per master;
    // ungrouped, at least 12.
    for n in &calls {
        assert!((3..=9).contains(n), "{calls:?}");
    }
}

#[tokio::test]
async fn fair_reentrant_and_delay_queues_work_on_a_cluster() {
    let cluster = Cluster::shared();
    let c = Client::connect(&cluster.url()).await.unwrap();

    // Fair: waiters served in arrival order, woken by the queue's own messages.
    let holder = c.lock("fair-c").fair().try_acquire().await.unwrap();
    let first = tokio::spawn(
        c.lock("fair-c")
            .fair()
            .wait(Duration::from_secs(30))
            .acquire(),
    );
    eventually(
        "the first waiter queued",
        Duration::from_secs(10),
        async || c.stats().waiters == 1,
    )
    .await;
    let second = tokio::spawn(
        c.lock("fair-c")
            .fair()
            .wait(Duration::from_secs(30))
            .acquire(),
    );
    eventually(
        "the second waiter queued",
        Duration::from_secs(10),
        async || c.stats().waiters == 2,
    )
    .await;
    holder.release().await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert!(!second.is_finished());
    let token = first.fencing_token();
    first.release().await.unwrap();
    let second = second.await.unwrap().unwrap();
    assert!(second.fencing_token() > token);
    second.release().await.unwrap();

    // Reentrant: holds of one owner add up; the last release frees the lock.
    let outer = c
        .lock("re-c")
        .reentrant("job-1")
        .try_acquire()
        .await
        .unwrap();
    let inner = c
        .lock("re-c")
        .reentrant("job-1")
        .try_acquire()
        .await
        .unwrap();
    assert!(matches!(
        c.lock("re-c").reentrant("job-2").try_acquire().await,
        Err(Error::Held { .. })
    ));
    inner.release().await.unwrap();
    assert!(cluster.node_for_key(&key("re-c")).exists(&key("re-c")));
    outer.release().await.unwrap();
    assert!(!cluster.node_for_key(&key("re-c")).exists(&key("re-c")));

    // A delay queue: its keys on the master of its slot.
    let q = c.delay_queue("dq-c").unwrap();
    q.push("a", Duration::ZERO).await.unwrap();
    q.push("b", Duration::from_secs(60)).await.unwrap();
    let counts = q.counts().await.unwrap();
    assert_eq!((counts.ready, counts.delayed), (1, 1));
    let item = q.take(Duration::from_secs(30)).await.unwrap().unwrap();
    assert_eq!(item.payload(), b"a");
    assert!(item.ack().await.unwrap());
    assert!(q.take(Duration::from_secs(30)).await.unwrap().is_none());
}

#[tokio::test]
async fn inspect_list_and_break_work_on_a_cluster() {
    let cluster = Cluster::shared();
    let c = Client::connect(&cluster.url()).await.unwrap();
    let names = ["adm-a", "adm-b", "adm-c", "adm-d", "adm-e", "adm-f"];
    let mut guards = Vec::new();
    for name in names {
        guards.push(
            c.lock(name)
                .lease(Duration::from_secs(1))
                .holder_info("host=h pid=1")
                .try_acquire()
                .await
                .unwrap(),
        );
    }
    let on: Vec<String> = names
        .iter()
        .map(|n| cluster.node_for_key(&key(n)).addr())
        .collect();
    assert!(
        on.iter().any(|a| *a != on[0]),
        "the names span masters: {on:?}"
    );

    let status = c.inspect("adm-a").await.unwrap();
    assert_eq!(status.nodes.len(), 1, "a cluster is one node");
    assert_eq!(
        status.nodes[0].node, on[0],
        "named by the master of its slot"
    );
    let state = status.nodes[0].state.as_ref().unwrap();
    assert_eq!(state.fencing_counter, Some(guards[0].fencing_token().get()));
    assert_eq!(state.holder_info.as_deref(), Some("host=h pid=1"));

    let listed: Vec<String> = c
        .list("adm-*")
        .await
        .unwrap()
        .locks
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(listed, names);

    let victim = guards.remove(1);
    let lost = victim.lost();
    let broken = c.break_lock("adm-b").await.unwrap();
    assert_eq!(broken.nodes[0].node, on[1]);
    let outcome = broken.nodes[0].outcome.as_ref().unwrap();
    assert!(matches!(outcome.broke, Some(Holder::Plain { .. })));
    assert!(outcome.fencing_counter > Some(victim.fencing_token().get()));
    // The evicted holder hears of it at its next renewal.
    let cause = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("the holder heard of the break");
    assert_eq!(cause, LossCause::Broken);
    for g in guards {
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_slot_migrated_while_its_lock_is_held_keeps_the_lock_and_its_waiter() {
    let cluster = Cluster::builder().replicas_per_master(0).start();
    let c = Client::connect(&cluster.url()).await.unwrap();
    let waiting = Client::connect(&cluster.url()).await.unwrap();
    // `mig-held` is renewed every 333 ms; `mig-wait` has a waiter, and a 30 s lease, so
    // that only the release can wake it in time.
    let held = c
        .lock("mig-held")
        .lease(Duration::from_secs(1))
        .try_acquire()
        .await
        .unwrap();
    let blocking = c
        .lock("mig-wait")
        .lease(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(
        waiting
            .lock("mig-wait")
            .wait(Duration::from_secs(60))
            .acquire(),
    );
    eventually(
        "the waiter subscribed",
        Duration::from_secs(10),
        async || waiting.stats().waiters == 1,
    )
    .await;

    for name in ["mig-held", "mig-wait"] {
        let slot = cluster.slot_of(&key(name));
        let from = cluster.master_of_slot(slot).addr();
        let to = cluster
            .masters()
            .into_iter()
            .find(|m| m.addr() != from)
            .unwrap()
            .addr();
        let moved = cluster.migrate_slot(slot, &to);
        assert!(moved >= 2, "the lock key and its counter moved: {moved}");
    }
    let held_on = cluster.node_for_key(&key("mig-held"));
    // The holder keeps its lock: renewals follow the slot to its new master.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(held.loss_cause(), None);
    assert!(held_on.pttl(&key("mig-held")) > 0);
    // The waiter's subscription followed its slot too (Redis unsubscribed it on the old
    // master). A classic one (Redis 6.2) stays where it is: the cluster sends a classic
    // PUBLISH on to every node.
    let wait_on = cluster.node_for_key(&key("mig-wait"));
    let channel = format!("{}:released", key("mig-wait"));
    if sharded(&cluster) {
        eventually(
            "subscribed on the new master",
            Duration::from_secs(10),
            async || subscribers(wait_on, "SHARDNUMSUB", &channel) == 1,
        )
        .await;
    }
    let released = Instant::now();
    blocking.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    let latency = released.elapsed();
    eprintln!("after the migration, release to the waiter's grant: {latency:?}");
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    next.release().await.unwrap();

    // New acquires on the migrated slot work, from a client that never knew the old map.
    held.release().await.unwrap();
    let fresh = Client::connect(&cluster.url()).await.unwrap();
    let again = fresh.lock("mig-held").try_acquire().await.unwrap();
    assert!(held_on.exists(&key("mig-held")));
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_over_and_locks_elsewhere_are_untouched() {
    let mut cluster = Cluster::start();
    let c = Client::connect(&cluster.url()).await.unwrap();
    let doomed = cluster.node_for_key(&key("fo-a")).addr();
    // Another lock on the same master, taken after the failover; one on another master.
    let same = name_where("fo-same", |n| {
        cluster.node_for_key(&key(n)).addr() == doomed
    });
    let elsewhere = name_where("fo-else", |n| {
        cluster.node_for_key(&key(n)).addr() != doomed
    });
    let elsewhere_on = cluster.node_for_key(&key(&elsewhere)).addr();

    // fo-a counts only once its grant reached the replica (`WAIT`, on its master).
    let a = c
        .lock("fo-a")
        .lease(Duration::from_secs(8))
        .replicas(1)
        .try_acquire()
        .await
        .unwrap();
    let lost_a = a.lost();
    let b = c
        .lock(&elsewhere)
        .lease(Duration::from_secs(2))
        .try_acquire()
        .await
        .unwrap();
    let replica = cluster.replicas_of(&doomed)[0].addr();

    assert_eq!(cluster.kill_master_of(&key("fo-a")), doomed);
    let killed = Instant::now();
    // A new lock on the dead master's slots: the acquire waits out the failover.
    let next = c.lock(&same).wait(FAILOVER).acquire().await.unwrap();
    let back = killed.elapsed();
    eprintln!("master killed to a grant on its slots: {back:?}");
    assert!(back < FAILOVER, "{back:?}");
    // The grant came from the promoted replica; every live node's view agrees on it
    // once gossip has spread (a node may still show the dead master for a moment).
    let slot = cluster.slot_of(&key(&same));
    let promoted = tokio::task::block_in_place(|| cluster.wait_for_failover(slot, FAILOVER));
    assert_eq!(promoted, replica);

    // The lock on another master was renewed all along (its lease is 2 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(b.loss_cause(), None);
    assert!(node(&cluster, &elsewhere_on).pttl(&key(&elsewhere)) > 0);
    // The lock on the dead master reached its replica before the death: kept, renewed
    // on the promoted replica; had it not, its holder would have heard.
    match a.loss_cause() {
        None => assert!(node(&cluster, &replica).pttl(&key("fo-a")) > 0),
        Some(cause) => eprintln!("fo-a lost across the failover: {cause:?}"),
    }
    assert!(a.fencing_token() < next.fencing_token());
    next.release().await.unwrap();
    b.release().await.unwrap();
    if a.loss_cause().is_none() {
        a.release().await.unwrap();
    } else {
        assert!(
            tokio::time::timeout(Duration::from_secs(1), lost_a)
                .await
                .is_ok()
        );
    }
}

#[tokio::test]
async fn a_cluster_with_uncovered_slots_says_it_is_down() {
    let mut cluster = Cluster::builder().replicas_per_master(0).start();
    let c = Client::connect(&cluster.url()).await.unwrap();
    // A master without a replica dies: its slots have no master any more, and with the
    // default cluster-require-full-coverage the other masters stop serving too.
    let dead = cluster.kill_master_of(&key("down-x"));
    let alive = name_where("down", |n| cluster.node_for_key(&key(n)).addr() != dead);
    let alive_on = cluster.node_for_key(&key(&alive)).addr();
    eventually("the cluster is down", Duration::from_secs(20), async || {
        node(&cluster, &alive_on)
            .cmd(&["CLUSTER", "INFO"])
            .as_str()
            .is_some_and(|i| i.contains("cluster_state:fail"))
    })
    .await;
    let e = c.lock(&alive).try_acquire().await.unwrap_err();
    eprintln!("{e}");
    assert!(
        matches!(&e, Error::Unavailable { reason: UnavailableReason::ClusterDown, node, .. } if *node == alive_on),
        "{e:?}"
    );
    assert!(e.to_string().contains("the cluster is down"), "{e}");
    assert_eq!(e.to_string().lines().count(), 1);
}

#[tokio::test]
async fn bad_urls_and_bad_days_are_one_line_each() {
    let cluster = Cluster::shared();
    let one_line = |e: &Error| {
        let text = e.to_string();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.contains("s3cret"), "no password: {text}");
        text
    };

    // A cluster URL at a node without cluster mode.
    let plain = RedisServer::start();
    let url = format!("redis+cluster://{}", plain.addr());
    let e = Client::connect(&url).await.unwrap_err();
    let text = one_line(&e);
    assert!(matches!(e, Error::Rejected { .. }), "{e:?}");
    assert!(text.contains("not a Redis Cluster node"), "{text}");

    // Credentials the cluster refuses.
    let url = format!("redis+cluster://u:s3cret@{}", cluster.seed_urls());
    let e = Client::connect(&url).await.unwrap_err();
    assert!(one_line(&e).contains("wrong user name or password"), "{e}");
    assert!(
        matches!(&e, Error::Rejected { code, .. } if code == "WRONGPASS"),
        "{e:?}"
    );

    // A plain URL at a cluster node: it redirects the keys it does not serve.
    let masters = cluster.masters();
    let node = masters[0];
    let elsewhere = name_where("plain", |n| {
        cluster.node_for_key(&key(n)).addr() != node.addr()
    });
    let c = Client::connect(&node.url()).await.unwrap();
    let e = c.lock(&elsewhere).try_acquire().await.unwrap_err();
    let text = one_line(&e);
    assert!(
        matches!(&e, Error::Rejected { code, .. } if code == "MOVED"),
        "{e:?}"
    );
    assert!(
        text.contains("this is a Redis Cluster node: use redis+cluster://"),
        "{text}"
    );

    // Every seed down.
    let (p1, p2) = (testkit::free_cluster_port(), testkit::free_cluster_port());
    let url = format!("redis+cluster://u:s3cret@127.0.0.1:{p1},127.0.0.1:{p2}");
    let e = Client::connect(&url).await.unwrap_err();
    let text = one_line(&e);
    assert!(
        matches!(
            &e,
            Error::Unavailable {
                reason: UnavailableReason::Refused,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(text.contains("every seed is down"), "{text}");

    // Redlock over clusters.
    let e = Client::redlock([cluster.url(), node.url(), plain.url()])
        .connect()
        .await
        .unwrap_err();
    let text = one_line(&e);
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(text.contains("Redlock"), "{text}");

    // TLS settings for a cluster URL without TLS, and a database other than 0.
    let e = Client::builder(cluster.url())
        .tls_insecure_skip_verify(true)
        .connect()
        .await
        .unwrap_err();
    assert!(one_line(&e).contains("rediss+cluster://"), "{e}");
    let e = Client::connect(&format!("{}/3", cluster.url()))
        .await
        .unwrap_err();
    assert!(one_line(&e).contains("only database 0"), "{e}");

    // A replica count asked of a cluster goes to the lock's master.
    let c = Client::connect(&cluster.url()).await.unwrap();
    let g = c.lock("bad-repl").replicas(1).try_acquire().await.unwrap();
    // (A replica redirects GET to its master; SCAN it answers.)
    let replica_has_it = cluster
        .replicas_of(&cluster.node_for_key(&key("bad-repl")).addr())
        .iter()
        .any(|r| keys_on(r, &key("bad-repl")) == [key("bad-repl")]);
    assert!(
        replica_has_it,
        "the grant reached the replica before it counted"
    );
    g.release().await.unwrap();
}

/// The guide's least-privilege user, with the additions its Cluster section lists, runs
/// the cluster's features: locks, waits woken by sharded pub/sub, renewals across slots,
/// `list`, `WAIT`.
#[tokio::test]
async fn the_guide_user_with_the_cluster_additions_runs_the_cluster_features() {
    const GUIDE: &str = include_str!("../../../docs/guide/src/security.md");
    let base = GUIDE
        .lines()
        .find(|l| l.starts_with("ACL SETUSER fencelock "))
        .expect("the guide's ACL line");
    let prose: String = GUIDE.split_whitespace().collect::<Vec<_>>().join(" ");
    let additions = prose
        .split("On a Redis Cluster, add what sharded pub/sub and the cluster protocol need, on every node: `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .expect("the guide's cluster additions");
    let user = "fencelock-cluster";
    // Redis 6.2 knows no sharded pub/sub commands: the README says to leave them out.
    let cluster = Cluster::shared();
    let sharded_commands = ["+spublish", "+ssubscribe", "+sunsubscribe"];
    let rules: Vec<String> = base
        .split_whitespace()
        .chain(additions.split_whitespace())
        .filter(|w| sharded(cluster) || !sharded_commands.contains(w))
        .map(|w| match w {
            "fencelock" => user.to_owned(),
            ">CHANGE-ME" => ">cluster-pw".to_owned(),
            w => w.to_owned(),
        })
        .collect();
    for node in cluster.nodes() {
        let args: Vec<&str> = rules.iter().map(String::as_str).collect();
        assert_eq!(node.cmd(&args).as_str(), Some("OK"), "{args:?}");
    }
    let url = cluster
        .url()
        .replacen("://", &format!("://{user}:cluster-pw@"), 1);
    let c = Client::connect(&url).await.unwrap();
    let other = Client::connect(&url).await.unwrap();

    let names: Vec<String> = (0..30).map(|i| format!("acl-c-{i}")).collect();
    let guards: Vec<_> = join_all(
        names
            .iter()
            .map(|n| take(&c, n, Duration::from_millis(600))),
    )
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let waiter = tokio::spawn(
        other
            .lock("acl-c-0")
            .wait(Duration::from_secs(30))
            .acquire(),
    );
    eventually(
        "the waiter subscribed",
        Duration::from_secs(10),
        async || {
            subscribers(
                cluster.node_for_key(&key("acl-c-0")),
                numsub_kind(cluster),
                &format!("{}:released", key("acl-c-0")),
            ) == 1
        },
    )
    .await;
    // Held past several renewals, batched across slots.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(guards.iter().all(|g| g.loss_cause().is_none()));
    assert_eq!(c.list("acl-c-*").await.unwrap().locks.len(), 30);
    for g in guards {
        g.release().await.unwrap();
    }
    waiter.await.unwrap().unwrap().release().await.unwrap();
    c.lock("acl-c-r")
        .replicas(1)
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// `renew_across_slots.lua` as a cluster gets it: keys of several slots of one master in
/// one call; a key of another master's slot is an error whose text the client reads to
/// send that master's leases per slot instead.
#[tokio::test]
async fn the_batch_across_slots_renews_one_masters_slots_and_refuses_another_masters() {
    let cluster = Cluster::shared();
    // Redis 6.2 reads no flags line, and lets a script touch several slots of its node
    // without one.
    let name = if sharded(cluster) {
        "cluster/lock/renew_across_slots.lua"
    } else {
        "no-flags/cluster/lock/renew_across_slots.lua"
    };
    let source = fencelock::lua_scripts()
        .find(|(n, _)| *n == name)
        .map(|(_, source)| source)
        .expect("the cluster's batch script");
    assert_eq!(
        source.starts_with("#!lua flags=allow-cross-slot-keys\n"),
        sharded(cluster)
    );
    let masters = cluster.masters();
    let here = masters[0];
    let mut mine = (0..10_000)
        .map(|i| format!("xs-{i}"))
        .filter(|n| cluster.node_for_key(&key(n)).addr() == here.addr());
    let (a, b) = (mine.next().unwrap(), mine.next().unwrap());
    assert_ne!(cluster.slot_of(&key(&a)), cluster.slot_of(&key(&b)));
    let other = name_where("xs-other", |n| {
        cluster.node_for_key(&key(n)).addr() != here.addr()
    });
    here.cmd(&["SET", &key(&a), "tok-a", "PX", "10000"]);
    let lease = |n: &str, holder: &str| {
        [
            key(n),
            format!("{}:holder", key(n)),
            holder.to_owned(),
            "20000".to_owned(),
        ]
    };
    let args = |leases: &[[String; 4]]| {
        let mut args = vec!["EVAL".to_owned(), source.clone(), "0".to_owned()];
        args.extend(leases.iter().flatten().cloned());
        args
    };
    let run = |args: Vec<String>| here.cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let reply = run(args(&[lease(&a, "tok-a"), lease(&b, "tok-b")]));
    let codes: Vec<i64> = reply
        .as_array()
        .unwrap_or_else(|| panic!("{reply:?}"))
        .iter()
        .map(|r| r.as_int().unwrap())
        .collect();
    assert_eq!(codes, [1, 0], "renewed across two slots of one master");
    assert!(here.pttl(&key(&a)) > 10_000);
    let reply = run(args(&[lease(&a, "tok-a"), lease(&other, "tok-o")]));
    let error = reply.as_error().unwrap_or_else(|| panic!("{reply:?}"));
    assert!(error.contains("non local key"), "{error}");
    here.cmd(&["DEL", &key(&a)]);
}

/// A grant whose master is killed while its `WAIT` blocks (its replica isolated, so the
/// replica never had it) is not reported as replicated: the `WAIT` goes to the master
/// that took the grant or nowhere, never to another master, whose own replicas would
/// answer for writes they never saw.
#[tokio::test]
async fn a_grant_whose_master_dies_during_its_wait_is_not_reported_replicated() {
    let mut cluster = Cluster::start();
    // WAIT may block for a second (a tenth of the lease, at most three quarters of the
    // response timeout): time enough to kill the master while it does.
    let c = Client::builder(cluster.url())
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let master = cluster.node_for_key(&key("wait-dies")).addr();
    let replica = cluster.replicas_of(&master)[0].addr();
    cluster.isolate_replica(&replica);
    let acquiring = tokio::spawn(
        c.lock("wait-dies")
            .lease(Duration::from_secs(10))
            .replicas(1)
            .try_acquire(),
    );
    eventually(
        "the grant's WAIT blocks",
        Duration::from_secs(10),
        async || {
            node(&cluster, &master)
                .info_field("clients", "blocked_clients")
                .as_deref()
                == Some("1")
        },
    )
    .await;
    cluster.node_mut(&master).kill();
    match acquiring.await.unwrap() {
        Err(e) => eprintln!("refused: {e}"),
        Ok(g) => panic!(
            "granted as replicated (token {}) by a master killed before its replica had it",
            g.fencing_token()
        ),
    }
    cluster.resume_node(&replica);
}
