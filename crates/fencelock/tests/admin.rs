//! An operator's view: inspect one lock, list the held ones, break a stuck one, against
//! real redis-server processes.

use std::time::Duration;

use fencelock::{Client, Error, Holder, LossCause};
use testkit::RedisServer;

mod common;
use common::eventually;

async fn client(r: &RedisServer) -> Client {
    Client::connect(&r.url()).await.unwrap()
}

#[tokio::test]
async fn inspect_shows_the_holder_its_lease_the_counter_the_queue_and_what_it_said() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let free = c.inspect("stock:42").await.unwrap();
    assert_eq!(free.nodes.len(), 1);
    let state = free.nodes[0].state.as_ref().unwrap();
    assert_eq!(state.holder, None);
    assert_eq!(state.fencing_counter, None);

    let guard = c
        .lock("stock:42")
        .fair()
        .holder_info("host=a pid=1")
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(
        c.lock("stock:42")
            .fair()
            .holder_info("host=b pid=2")
            .wait(Duration::from_secs(30))
            .acquire(),
    );
    eventually("the waiter queued", Duration::from_secs(5), async || {
        r.cmd(&["LLEN", "fencelock:{stock:42}:queue"]).as_int() == Some(1)
    })
    .await;
    let status = c.inspect("stock:42").await.unwrap();
    let state = status.nodes[0].state.as_ref().unwrap();
    match &state.holder {
        Some(Holder::Plain {
            remaining: Some(left),
        }) => assert!(*left > Duration::from_secs(25), "{left:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(state.fencing_counter, Some(guard.fencing_token().get()));
    assert_eq!(state.holder_info.as_deref(), Some("host=a pid=1"));
    assert_eq!(state.waiters.len(), 1);
    assert!(
        state.waiters[0]
            .timeout_left
            .is_some_and(|d| d <= Duration::from_secs(3))
    );
    // Who waits: the holder info it will hold the lock with.
    assert_eq!(state.waiters[0].info.as_deref(), Some("host=b pid=2"));
    assert_eq!(status.nodes[0].restart_protection, None, "not Redlock");
    guard.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    let state = c.inspect("stock:42").await.unwrap().nodes[0]
        .state
        .as_ref()
        .unwrap()
        .clone();
    // The next holder, with what it said about itself (the first's info went with it).
    assert!(state.holder.is_some());
    assert_eq!(state.holder_info.as_deref(), Some("host=b pid=2"));
    next.release().await.unwrap();

    // Reentrant holds are counted per owner.
    let a = c
        .lock("job")
        .reentrant("job-7")
        .try_acquire()
        .await
        .unwrap();
    let b = c
        .lock("job")
        .reentrant("job-7")
        .try_acquire()
        .await
        .unwrap();
    let state = c
        .inspect("job")
        .await
        .unwrap()
        .nodes
        .remove(0)
        .state
        .unwrap();
    assert!(
        matches!(&state.holder, Some(Holder::Reentrant { owner, holds: 2, .. }) if owner == "job-7"),
        "{state:?}"
    );
    drop((a, b));
}

#[tokio::test]
async fn list_finds_the_held_locks_by_pattern_with_scan() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let _a = c.lock("orders:1").try_acquire().await.unwrap();
    let _b = c.lock("orders:2").try_acquire().await.unwrap();
    let _other = c.lock("stock:1").try_acquire().await.unwrap();
    let released = c.lock("orders:3").try_acquire().await.unwrap();
    released.release().await.unwrap(); // free: its counter stays, but it is not held

    let names = |list: fencelock::Listing| -> Vec<String> {
        assert!(list.unanswered.is_empty(), "{list:?}");
        list.locks.into_iter().map(|s| s.name).collect()
    };
    assert_eq!(
        names(c.list("orders:*").await.unwrap()),
        ["orders:1", "orders:2"]
    );
    assert_eq!(
        names(c.list("").await.unwrap()),
        ["orders:1", "orders:2", "stock:1"]
    );
    let stats = r.cmd(&["INFO", "commandstats"]);
    let stats = stats.as_str().unwrap();
    assert!(stats.contains("cmdstat_scan:"), "{stats}");
    assert!(
        !stats.contains("cmdstat_keys:"),
        "KEYS blocks the server: {stats}"
    );
    assert!(matches!(
        c.list("bad{").await,
        Err(Error::InvalidArgument { .. })
    ));
}

#[tokio::test]
async fn break_frees_a_stuck_lock_wakes_its_waiter_and_fences_the_evicted_holder() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let stuck = c
        .lock("stuck")
        .lease(Duration::from_millis(900))
        .try_acquire()
        .await
        .unwrap();
    let old_token = stuck.fencing_token();
    let lost = stuck.lost();
    let waiter = tokio::spawn(c.lock("stuck").wait(Duration::from_secs(30)).acquire());
    eventually(
        "the waiter subscribed",
        Duration::from_secs(5),
        async || c.stats().waiters == 1,
    )
    .await;

    let broken = c.break_lock("stuck").await.unwrap();
    let outcome = broken.nodes[0].outcome.as_ref().unwrap();
    assert!(
        matches!(outcome.broke, Some(Holder::Plain { remaining: Some(_) })),
        "{outcome:?}"
    );
    let counter = outcome.fencing_counter.unwrap();
    assert!(counter > old_token.get());
    // The waiter is woken at once, not when the stuck lease would have ended, and its
    // token is above every token of the evicted holder.
    let next = tokio::time::timeout(Duration::from_millis(500), waiter)
        .await
        .expect("woken by the break")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token().get() > counter);
    // The evicted holder hears of it at its next renewal.
    let cause = tokio::time::timeout(Duration::from_secs(2), lost)
        .await
        .unwrap();
    assert_eq!(cause, LossCause::TakenByOther);
    next.release().await.unwrap();

    // A free lock: nothing is broken, no token burnt.
    let broken = c.break_lock("stuck").await.unwrap();
    let outcome = broken.nodes[0].outcome.as_ref().unwrap();
    assert_eq!(outcome.broke, None);
    // Data fencelock did not write is left alone.
    r.cmd(&["HSET", "fencelock:{foreign}", "f", "v"]);
    let broken = c.break_lock("foreign").await;
    assert!(matches!(broken, Err(Error::WrongType { .. })), "{broken:?}");
    assert!(r.exists("fencelock:{foreign}"));
}

#[tokio::test]
async fn redlock_status_and_break_go_to_every_node() {
    let servers = RedisServer::start_many(3);
    let c = Client::redlock(servers.iter().map(RedisServer::url))
        .restart_protection(None)
        .connect()
        .await
        .unwrap();
    let guard = c.lock("rl").try_acquire().await.unwrap();
    let status = c.inspect("rl").await.unwrap();
    assert_eq!(status.nodes.len(), 3);
    for (node, server) in status.nodes.iter().zip(&servers) {
        assert_eq!(node.node, server.addr());
        assert!(node.state.as_ref().unwrap().holder.is_some());
    }
    let broken = c.break_lock("rl").await.unwrap();
    assert!(
        broken
            .nodes
            .iter()
            .all(|n| n.outcome.as_ref().is_ok_and(|o| o.broke.is_some()))
    );
    assert!(servers.iter().all(|s| !s.exists("fencelock:{rl}")));
    drop(guard);
}

/// With a Redlock node down, `list` lists what the others hold and names the node it
/// could not ask (its locks may be missing), instead of a silent partial answer.
#[tokio::test]
async fn redlock_list_names_a_node_it_could_not_ask() {
    let mut servers = RedisServer::start_many(3);
    let c = Client::redlock(servers.iter().map(RedisServer::url))
        .restart_protection(None)
        .connect()
        .await
        .unwrap();
    let _guard = c.lock("listed").try_acquire().await.unwrap();
    let down = servers[1].addr();
    servers[1].kill();
    let listing = c.list("").await.unwrap();
    assert_eq!(listing.locks.len(), 1, "{listing:?}");
    assert_eq!(listing.locks[0].name, "listed");
    assert_eq!(listing.unanswered.len(), 1, "{listing:?}");
    assert_eq!(listing.unanswered[0].node, down);
    assert!(matches!(
        listing.unanswered[0].error,
        Error::Unavailable { .. }
    ));
}

/// The client's own eviction warnings about the server at `addr` traced so far.
fn eviction_warnings(addr: &str) -> usize {
    common::traces()
        .text()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("may evict lock keys") && l.contains(addr))
        .count()
}

#[tokio::test]
async fn a_server_that_can_evict_lock_keys_is_reported_and_warned_about_once() {
    common::traces();
    let volatile = RedisServer::builder()
        .args(["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"])
        .start();
    let c = client(&volatile).await;
    let found = c.eviction_risks().await.unwrap();
    assert!(found.unanswered.is_empty());
    assert_eq!(found.risks.len(), 1, "{found:?}");
    let risk = &found.risks[0];
    assert_eq!(risk.node, volatile.addr());
    assert_eq!(risk.policy, "volatile-lru");
    assert_eq!(risk.maxmemory, 64 << 20);
    assert!(!risk.counters_too);
    assert!(risk.to_string().contains("noeviction"), "{risk}");

    // The client reads the policy by itself on its first call of a connection, and
    // warns once, not once per call.
    for _ in 0..3 {
        c.lock("ev")
            .try_acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    eventually(
        "the client's own warning",
        Duration::from_secs(5),
        async || eviction_warnings(&volatile.addr()) > 0,
    )
    .await;
    for _ in 0..3 {
        c.lock("ev")
            .try_acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    c.flush().await;
    assert_eq!(eviction_warnings(&volatile.addr()), 1);

    // allkeys-*: the fencing counters can go too.
    let allkeys = RedisServer::builder()
        .args(["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"])
        .start();
    let found = client(&allkeys).await.eviction_risks().await.unwrap();
    assert!(found.risks[0].counters_too);

    // The default (no maxmemory): no risk, no warning.
    let safe = RedisServer::start();
    let c = client(&safe).await;
    assert!(c.eviction_risks().await.unwrap().risks.is_empty());
    c.lock("ev")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    eventually(
        "the client's own check of the default server",
        Duration::from_secs(5),
        async || {
            common::traces()
                .text()
                .lines()
                .any(|l| l.contains("memory policy read") && l.contains(&safe.addr()))
        },
    )
    .await;
    assert_eq!(eviction_warnings(&safe.addr()), 0);
}

/// A Redlock client's status says which nodes restart protection leaves out, and for
/// how much longer (it learns their uptime when it connects and from its acquires); a
/// node that counts says nothing.
#[tokio::test]
async fn redlock_status_names_the_nodes_restart_protection_leaves_out() {
    let started = std::time::Instant::now();
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let c = Client::redlock(nodes.iter().map(RedisServer::url))
        .restart_protection(Some(Duration::from_secs(20)))
        .connect()
        .await
        .unwrap();
    let refused = c
        .lock("q")
        .lease(Duration::from_secs(2))
        .try_acquire()
        .await;
    assert!(refused.is_err(), "every node just started: {refused:?}");
    let status = c.inspect("q").await.unwrap();
    // Each node's uptime is at most the time since before it started (INFO gives whole
    // seconds: one more), so what is left is at least the rest of the 20 s.
    let at_least = Duration::from_secs(19).saturating_sub(started.elapsed());
    for node in &status.nodes {
        let left = node.restart_protection.expect("left out");
        assert!(
            left >= at_least && left <= Duration::from_secs(21),
            "{left:?}, not in {at_least:?}..=21s"
        );
    }
    let counted = Client::redlock(nodes.iter().map(RedisServer::url))
        .restart_protection(None)
        .connect()
        .await
        .unwrap();
    let status = counted.inspect("q").await.unwrap();
    assert!(
        status.nodes.iter().all(|n| n.restart_protection.is_none()),
        "protection off: {status:?}"
    );
}
