//! fencelock on the servers users run besides Debian's Redis 7.0, as a user would find
//! it: Redis 6.2 (no `#!lua` lines, no sharded pub/sub) on each topology, a server
//! older than fencelock supports (a real server whose `INFO` a proxy rewrites), and a
//! managed Redis that renamed its admin commands away, used as the guide's ACL user.
//! (The matrix of every primitive on every server and topology is the compatibility
//! suite's; these are the cases that once failed.)
//!
//! Redis 6.2 comes from `scripts/servers` (testkit says so when it is missing).

use std::time::Duration;

use fencelock::{Client, Error, FencingToken};
use testkit::{Cluster, Fault, FaultProxy, RedisServer, SentinelGroup, ServerBuild, ServerBuilder};

mod common;
use common::eventually;

/// A Redis 6.2 Cluster (3 masters, 3 replicas), one per test: its servers die with the
/// thread that started them.
fn cluster_6_2() -> Cluster {
    Cluster::builder().server(ServerBuild::Redis62).start()
}

/// A fenced write as `fencelock write` makes it: applied with the highest token, refused
/// with a lower one, on the server behind `url`; `read` reads a key there.
async fn fenced_write_works(url: &str, read: impl Fn(&str) -> Option<String>) {
    let c = Client::connect(url).await.expect("connect");
    let replies = c
        .fenced_write("stock:62", FencingToken::new(7))
        .set("{stock:62}:count", "17")
        .apply()
        .await
        .expect("the fenced write applies (the script without its #!lua line)");
    assert_eq!(replies.len(), 1);
    assert_eq!(read("{stock:62}:count").as_deref(), Some("17"));
    let refused = c
        .fenced_write("stock:62", FencingToken::new(6))
        .set("{stock:62}:count", "16")
        .apply()
        .await;
    assert!(
        matches!(refused, Err(Error::Fenced { .. })),
        "a lower token is refused: {refused:?}"
    );
    assert_eq!(read("{stock:62}:count").as_deref(), Some("17"));
}

#[tokio::test]
async fn a_fenced_write_works_on_a_redis_6_2_server() {
    let redis = RedisServer::builder().server(ServerBuild::Redis62).start();
    fenced_write_works(&redis.url(), |k| redis.get(k)).await;
}

#[tokio::test]
async fn a_fenced_write_works_on_a_redis_6_2_sentinel_managed_master() {
    let group = SentinelGroup::builder()
        .server(ServerBuild::Redis62)
        .start();
    fenced_write_works(&group.url(), |k| group.master().get(k)).await;
}

#[tokio::test]
async fn a_fenced_write_works_on_a_redis_6_2_cluster() {
    let cluster = &cluster_6_2();
    fenced_write_works(&cluster.url(), |k| cluster.node_for_key(k).get(k)).await;
}

/// The campaign announces the new leader on the election's channel: on a 6.2 Cluster,
/// with classic pub/sub (it has no `SPUBLISH`), which a follower hears.
#[tokio::test]
async fn an_election_on_a_redis_6_2_cluster_elects_and_its_followers_hear_it() {
    let cluster = &cluster_6_2();
    let a = Client::connect(&cluster.url()).await.unwrap();
    let b = Client::connect(&cluster.url()).await.unwrap();
    let mut observer = b.election("elect-62").observe().await.unwrap();
    let leading = a
        .election("elect-62")
        .holder_info("a")
        .campaign()
        .await
        .expect("elected on a Redis 6.2 Cluster");
    let seen = tokio::time::timeout(Duration::from_secs(10), observer.changed())
        .await
        .expect("the follower hears the win")
        .unwrap()
        .expect("a leads");
    assert_eq!((seen.term, seen.info.as_str()), (leading.term(), "a"));
    // A standby is woken by the resignation, long before the 30 s lease would end.
    let standby = tokio::spawn(b.election("elect-62").holder_info("b").campaign());
    eventually("the standby waits", Duration::from_secs(10), async || {
        b.stats().waiters == 1
    })
    .await;
    leading.resign().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), standby)
        .await
        .expect("the standby is elected once a resigns")
        .unwrap()
        .unwrap();
    assert!(next.term() > seen.term);
    next.resign().await.unwrap();
}

/// On a 6.2 Cluster the release is announced with classic `PUBLISH` and heard on the
/// lock's master: the waiter is woken by that message, not by its lease-bounded timer
/// (which would wake it once the holder's 5 s lease would have ended).
#[tokio::test]
async fn a_waiter_on_a_redis_6_2_cluster_is_woken_by_the_release() {
    let cluster = &cluster_6_2();
    let log = common::traces();
    let holder = Client::connect(&cluster.url()).await.unwrap();
    let waiter = Client::connect(&cluster.url()).await.unwrap();
    for name in ["woken-62-plain", "woken-62-fair"] {
        let fair = name.ends_with("fair");
        let lock = |c: &Client| {
            let lock = c.lock(name).lease(Duration::from_secs(5));
            if fair { lock.fair() } else { lock }
        };
        let held = lock(&holder).try_acquire().await.unwrap();
        let waiting = tokio::spawn(lock(&waiter).wait(Duration::from_secs(60)).acquire());
        eventually("the waiter waits", Duration::from_secs(10), async || {
            waiter.stats().waiters == 1
        })
        .await;
        let channel = format!("fencelock:{{{name}}}:released");
        let master = cluster.node_for_key(&channel);
        eventually(
            "subscribed with classic SUBSCRIBE on the lock's master",
            Duration::from_secs(10),
            async || {
                let subscribed = master.cmd(&["PUBSUB", "NUMSUB", &channel]);
                subscribed.as_array().and_then(|a| a.get(1)?.as_int()) == Some(1)
            },
        )
        .await;
        held.release().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(20), waiting)
            .await
            .unwrap_or_else(|_| panic!("{name}: the waiter got the lock"))
            .unwrap()
            .unwrap();
        // Inside the acquire span, which names the lock.
        let woken: Vec<String> = log
            .text()
            .lines()
            .filter(|l| l.contains(&format!("lock=\"{name}\"")) && l.contains(" woken "))
            .map(str::to_owned)
            .collect();
        assert!(
            !woken.is_empty() && woken.iter().all(|l| l.contains("by=\"notification\"")),
            "{name}: woken by the release's message, never by a timer: {woken:#?}"
        );
        got.release().await.unwrap();
    }
}

/// A server that says it is older than fencelock supports is refused at connect, in one
/// line naming the version found and the one needed (never a Lua compile error later):
/// a real server whose `INFO` a proxy rewrites to an older `redis_version`.
#[tokio::test]
async fn a_server_older_than_6_2_is_refused_naming_the_version_found_and_the_one_needed() {
    let redis = RedisServer::start();
    let info = redis.cmd(&["INFO", "server"]);
    let version = info
        .as_str()
        .and_then(|i| i.lines().find_map(|l| l.strip_prefix("redis_version:")))
        .expect("a redis_version")
        .trim()
        .to_owned();
    let (major, rest) = version.split_once('.').expect("major.minor.patch");
    assert_eq!(major.len(), 1, "{version}: a one-digit major to rewrite");
    let older = format!("5.{rest}");
    let proxy = FaultProxy::start(&redis.addr());
    proxy.set(Fault::Rewrite {
        from: format!("redis_version:{version}").into_bytes(),
        to: format!("redis_version:{older}").into_bytes(),
    });
    let expect_refusal = |e: Error| {
        let line = e.to_string();
        assert!(
            matches!(&e, Error::Rejected { code, .. } if code == "VERSION"),
            "{e:?}"
        );
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.contains(&format!(" {older}")),
            "names what it found: {line}"
        );
        assert!(line.contains("needs Redis 6.2 or later"), "{line}");
        assert!(!line.contains("Lua") && !line.contains("script"), "{line}");
    };
    expect_refusal(
        Client::connect(&proxy.url())
            .await
            .expect_err("refused at connect"),
    );
    // A lazy client is refused by its first call, the same way, with nothing written.
    let lazy = Client::builder(proxy.url()).connect_lazy().await.unwrap();
    expect_refusal(lazy.lock("old").try_acquire().await.unwrap_err());
    assert!(!redis.exists("fencelock:{old}"));
    // Told the truth, the same server is used.
    proxy.set(Fault::Pass);
    let c = Client::connect(&proxy.url()).await.unwrap();
    c.lock("old")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

const PASSWORD: &str = "managed-pw";

/// A server as some managed services run it: `CONFIG`, `CLIENT`, `DEBUG`, `MODULE` and
/// `SCRIPT` renamed away (and `extra` too), with the guide's ACL user.
fn managed(extra: &[&str]) -> RedisServer {
    let server = RedisServer::builder()
        .rename_away(ServerBuilder::MANAGED_AWAY)
        .rename_away(extra.iter().copied())
        .start();
    let args = common::guide_acl(PASSWORD, |w| Some(w.to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(server.cmd(&args).as_str(), Some("OK"), "{args:?}");
    assert!(server.cmd(&["SCRIPT", "LOAD", "return 1"]).is_error());
    server
}

/// How many errors of code `ERR` the server answered so far (`INFO errorstats`).
fn errors(server: &RedisServer) -> u64 {
    server
        .info_field("errorstats", "errorstat_ERR")
        .and_then(|c| c.strip_prefix("count=")?.parse().ok())
        .unwrap_or(0)
}

/// Every primitive on `c`, a client of `server`.
async fn every_primitive(c: &Client, server: &RedisServer) {
    // Plain, waiting (woken by the release), fair, reentrant.
    let g = c.lock("plain").try_acquire().await.expect("plain");
    let waiter = tokio::spawn(c.lock("plain").wait(Duration::from_secs(10)).acquire());
    eventually("the waiter waits", Duration::from_secs(5), async || {
        c.stats().waiters == 1
    })
    .await;
    g.release().await.unwrap();
    waiter
        .await
        .unwrap()
        .expect("the waiter")
        .release()
        .await
        .unwrap();
    c.lock("fair")
        .fair()
        .try_acquire()
        .await
        .expect("fair")
        .release()
        .await
        .unwrap();
    let outer = c
        .lock("re")
        .reentrant("o")
        .try_acquire()
        .await
        .expect("reentrant");
    let inner = c.lock("re").reentrant("o").try_acquire().await.unwrap();
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    // Semaphore, read-write lock, several locks at once.
    let permit = c.semaphore("sem", 2).try_acquire().await.expect("a permit");
    permit.release().await.unwrap();
    let reader = c.read_lock("rw").try_acquire().await.expect("a reader");
    reader.release().await.unwrap();
    let all = c
        .lock_all(["m1", "m2"])
        .try_acquire()
        .await
        .expect("several");
    all.release().await.unwrap();
    // Election, delay queue, fenced write.
    let leading = c.election("el").campaign().await.expect("elected");
    assert_eq!(
        c.election("el").leader().await.unwrap().map(|l| l.term),
        Some(leading.term())
    );
    leading.resign().await.unwrap();
    let q = c.delay_queue("jobs").unwrap();
    q.push(b"job", Duration::ZERO).await.expect("push");
    let item = q
        .take(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("an item");
    assert!(item.ack().await.unwrap());
    c.fenced_write("res", FencingToken::new(3))
        .set("fencelock:res", "v")
        .apply()
        .await
        .expect("fenced write");
    assert_eq!(server.get("fencelock:res").as_deref(), Some("v"));
    // Status, list, break.
    let held = c.lock("ops").try_acquire().await.unwrap();
    assert!(
        c.inspect("ops").await.unwrap().nodes[0]
            .state
            .as_ref()
            .unwrap()
            .holder
            .is_some()
    );
    assert_eq!(c.list("ops").await.unwrap().locks.len(), 1);
    c.break_lock("ops").await.expect("break");
    held.lost().await;
}

/// A managed Redis with its admin commands renamed away, as the guide's ACL user: every
/// primitive works (the scripts it lacks sent with `EVAL`, `SCRIPT LOAD` tried once per
/// connection, not on every call), and nothing is called a Sentinel.
#[tokio::test]
async fn a_managed_redis_with_admin_commands_renamed_away_runs_every_primitive() {
    let server = managed(&[]);
    let url = format!("redis://fencelock:{PASSWORD}@{}", server.addr());
    let c = Client::connect(&url)
        .await
        .expect("connect as the guide's ACL user");
    let before = errors(&server);
    every_primitive(&c, &server).await;
    // One refused SCRIPT LOAD for the client's connection; every script after that is
    // sent with EVAL, once, then EVALSHA.
    let refused = errors(&server) - before;
    assert!(refused <= 1, "SCRIPT LOAD refused {refused} times");
    // The memory policy is still read (INFO is not renamed): none to warn of.
    let eviction = c.eviction_risks().await.unwrap();
    assert!(
        eviction.risks.is_empty() && eviction.unknown.is_empty(),
        "{eviction:?}"
    );
}

/// With `INFO` renamed away too, what the server offers is asked with `HELLO`, every
/// primitive still works, and the eviction policy is said to be unknown, with why.
#[tokio::test]
async fn without_info_the_eviction_policy_is_unknown_and_says_why() {
    let server = managed(&["INFO"]);
    let url = format!("redis://fencelock:{PASSWORD}@{}", server.addr());
    let c = Client::connect(&url)
        .await
        .expect("connect as the guide's ACL user");
    every_primitive(&c, &server).await;
    let eviction = c.eviction_risks().await.expect("the node answered");
    assert!(eviction.risks.is_empty(), "{eviction:?}");
    let [unknown] = eviction.unknown.as_slice() else {
        panic!("one server whose policy is unknown: {eviction:?}");
    };
    assert_eq!(unknown.node, server.addr());
    assert!(unknown.why.contains("refuses INFO"), "{unknown}");
    let line = unknown.to_string();
    assert!(
        line.contains("eviction policy of") && line.contains("is unknown"),
        "{line}"
    );
}
