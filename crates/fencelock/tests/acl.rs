//! The least-privilege ACL user of the guide's security chapter, created from its own line (so the
//! two cannot drift), runs every feature of the library; a user that lacks a permission
//! gets a `NOPERM` error that names what was refused and points at that line.

use std::time::Duration;

use fencelock::{Client, Error};
use testkit::RedisServer;

mod common;
use common::{eventually, listed, numsub};

const PASSWORD: &str = "acl-test-pw";

/// The guide's `ACL SETUSER fencelock ...` line, as arguments, with its placeholder
/// password replaced and `edit` applied to the rules.
fn guide_acl(edit: impl Fn(&str) -> Option<String>) -> Vec<String> {
    common::guide_acl(PASSWORD, edit)
}

/// A server with the guide's user (rules edited by `edit`).
fn server_with_user(edit: impl Fn(&str) -> Option<String>) -> RedisServer {
    let server = RedisServer::start();
    let args = guide_acl(edit);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let reply = server.cmd(&args);
    assert_eq!(reply.as_str(), Some("OK"), "{args:?}: {reply:?}");
    server
}

fn as_user(server: &RedisServer) -> String {
    format!("redis://fencelock:{PASSWORD}@127.0.0.1:{}", server.port())
}

async fn client(server: &RedisServer) -> Client {
    Client::connect(&as_user(server))
        .await
        .expect("connect as the guide's user")
}

/// What a user expects of the guide's line: every single-node feature works as that user.
#[tokio::test]
async fn the_readme_user_runs_every_single_node_feature() {
    let server = server_with_user(|w| Some(w.to_owned()));
    let c = client(&server).await;

    // Plain: try, refuse a second, extend, release.
    let mut g = c.lock("plain").try_acquire().await.expect("plain acquire");
    assert!(matches!(
        c.lock("plain").try_acquire().await,
        Err(Error::Held { .. })
    ));
    g.extend(Duration::from_secs(20)).await.expect("extend");
    g.release().await.expect("release");
    assert!(!server.exists("fencelock:{plain}"));

    // Waiting, woken by the release announced on the lock's channel.
    let holder = c.lock("wait").try_acquire().await.unwrap();
    let waiter = tokio::spawn(c.lock("wait").wait(Duration::from_secs(10)).acquire());
    eventually(
        "the waiter subscribes",
        Duration::from_secs(5),
        async || numsub(&server, "fencelock:{wait}:released") == 1,
    )
    .await;
    holder.release().await.unwrap();
    let g = waiter.await.unwrap().expect("the waiter gets the lock");
    g.release().await.unwrap();

    // Fair: a queue of two, in order.
    let first = c
        .lock("fair")
        .fair()
        .try_acquire()
        .await
        .expect("fair acquire");
    let second = tokio::spawn(
        c.lock("fair")
            .fair()
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    eventually(
        "the fair waiter queues",
        Duration::from_secs(5),
        async || server.cmd(&["LLEN", "fencelock:{fair}:queue"]).as_int() == Some(1),
    )
    .await;
    first.release().await.unwrap();
    second
        .await
        .unwrap()
        .expect("the queued waiter")
        .release()
        .await
        .unwrap();

    // Reentrant: one owner twice, then both releases.
    let outer = c
        .lock("re")
        .reentrant("worker-1")
        .try_acquire()
        .await
        .unwrap();
    let inner = c
        .lock("re")
        .reentrant("worker-1")
        .try_acquire()
        .await
        .unwrap();
    inner.release().await.unwrap();
    assert!(server.exists("fencelock:{re}"));
    outer.release().await.unwrap();

    // Semaphore: two permits, a third refused (with when the first frees), renewed.
    let permits = [
        c.semaphore("sem", 2).try_acquire().await.expect("a permit"),
        c.semaphore("sem", 2).try_acquire().await.expect("a permit"),
    ];
    assert!(matches!(
        c.semaphore("sem", 2).try_acquire().await,
        Err(Error::Held { .. })
    ));
    for mut p in permits {
        p.extend(Duration::from_secs(20))
            .await
            .expect("extend a permit");
        p.release().await.expect("release a permit");
    }
    assert!(!server.exists("fencelock:{sem}"));
    assert!(!server.exists("fencelock:{re}"));

    // Read-write lock: readers, a writer that waits for them (and gives up: withdrawn),
    // a reader refused while it waits, the writer's grant, an owner's read hold.
    let reader = c.read_lock("rw").try_acquire().await.expect("a reader");
    let mut reader = reader;
    reader
        .extend(Duration::from_secs(20))
        .await
        .expect("extend a reader");
    let writer = tokio::spawn(c.lock("rw").wait(Duration::from_millis(300)).acquire());
    common::eventually("the writer waits", Duration::from_secs(5), async || {
        server.exists("fencelock:{rw}:writers")
    })
    .await;
    assert!(matches!(
        c.read_lock("rw").try_acquire().await,
        Err(Error::Held { .. })
    ));
    assert!(matches!(writer.await.unwrap(), Err(Error::Held { .. })));
    assert!(!server.exists("fencelock:{rw}:writers"), "withdrawn");
    reader.release().await.expect("release a reader");
    let w = c
        .lock("rw")
        .reentrant("o")
        .try_acquire()
        .await
        .expect("the writer");
    let r = c
        .read_lock("rw")
        .reentrant("o")
        .try_acquire()
        .await
        .expect("its owner's read hold");
    r.release().await.unwrap();
    w.release().await.unwrap();
    assert!(!server.exists("fencelock:{rw}"));

    // Watchdog: a short lease outlives its length while renewed.
    let lease = Duration::from_millis(300);
    let g = c.lock("dog").lease(lease).try_acquire().await.unwrap();
    tokio::time::sleep(lease * 3).await; // the span the lease must survive
    assert!(g.loss_cause().is_none(), "renewed as the ACL user");
    assert!(server.exists("fencelock:{dog}"));
    g.release().await.unwrap();

    // Holder info, replicas (WAIT), inspect, list and break.
    let g = c
        .lock("ops")
        .holder_info("{\"pid\":1}")
        .try_acquire()
        .await
        .unwrap();
    let status = c.inspect("ops").await.expect("inspect");
    let state = status.nodes[0].state.as_ref().expect("the node answers");
    assert!(state.holder.is_some(), "{status:?}");
    assert_eq!(c.list("").await.expect("list (SCAN)").locks.len(), 1);
    c.break_lock("ops").await.expect("break");
    g.lost().await; // the holder hears of the break
    assert!(matches!(
        c.lock("rep").replicas(1).try_acquire().await,
        Err(Error::Unreplicated { .. })
    ));

    // Delay queue: push, take, extend, retry, take again, ack, counts.
    let q = c.delay_queue("jobs").unwrap();
    q.push(b"job-1", Duration::ZERO).await.expect("push");
    let mut d = q
        .take(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("an item");
    assert!(d.extend(Duration::from_secs(10)).await.unwrap());
    assert!(d.retry_after(Duration::ZERO).await.unwrap());
    let d = q
        .take(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("again");
    assert!(d.ack().await.unwrap());
    assert_eq!(q.counts().await.unwrap().total(), 0);
    // And the deferral that puts work on it when the lock is busy.
    let busy = c.lock("busy").try_acquire().await.unwrap();
    let deferred = c
        .lock("busy")
        .acquire_or_defer(&q, b"later", Duration::from_secs(1))
        .await
        .unwrap();
    assert!(matches!(deferred, fencelock::Acquisition::Deferred(_)));
    busy.release().await.unwrap();
}

/// Redlock with restart protection on (each node is asked who it is, and how long it has
/// been up) works as the guide's user.
#[tokio::test]
async fn the_readme_user_runs_redlock_with_restart_protection() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| server_with_user(|w| Some(w.to_owned())))
        .collect();
    let c = Client::redlock(servers.iter().map(as_user))
        .restart_protection(Some(Duration::from_millis(100)))
        .connect()
        .await
        .expect("connect: every node says who it is");
    // Fresh servers are in quarantine for a moment; the wait rides it out.
    let g = c
        .lock("rl")
        .lease(Duration::from_millis(500))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("a majority grants");
    let held = servers
        .iter()
        .filter(|s| s.exists("fencelock:{rl}"))
        .count();
    assert!(held >= 2, "granted on {held} nodes");
    g.release().await.unwrap();
    assert!(servers.iter().all(|s| !s.exists("fencelock:{rl}")));
}

/// The one-line refusal for a user that lacks a permission, as the user reads it.
fn refusal(e: Error) -> String {
    let line = e.to_string();
    assert!(
        matches!(&e, Error::Rejected { code, .. } if code == "NOPERM"),
        "{e:?}"
    );
    assert!(!line.contains('\n'), "{line}");
    assert!(
        line.contains("ACL SETUSER fencelock"),
        "points at the guide's ACL line: {line}"
    );
    line
}

/// A command a script runs that the user may not run is named.
#[tokio::test]
async fn a_command_refused_inside_a_script_is_named() {
    let server = server_with_user(|w| (w != "+time").then(|| w.to_owned()));
    let c = client(&server).await;
    let line = refusal(c.lock("x").try_acquire().await.unwrap_err());
    assert!(line.contains("may not run TIME"), "{line}");
    assert!(line.contains("lock/take.lua"), "{line}");
    assert!(!server.exists("fencelock:{x}"));
}

/// A command fencelock sends itself that the user may not run is named.
#[tokio::test]
async fn a_command_refused_by_the_server_is_named() {
    let server = server_with_user(|w| (w != "+scan").then(|| w.to_owned()));
    let c = client(&server).await;
    let line = refusal(c.list("").await.unwrap_err());
    assert!(line.contains("'scan'"), "{line}");
}

/// Keys outside the user's key pattern (another prefix) are named.
#[tokio::test]
async fn keys_refused_are_named() {
    let server = server_with_user(|w| Some(w.to_owned()));
    let c = Client::builder(as_user(&server))
        .prefix("billing")
        .connect()
        .await
        .unwrap();
    let line = refusal(c.lock("x").try_acquire().await.unwrap_err());
    assert!(line.contains("billing:{x}"), "{line}");
}

/// The guide's line adapted to another prefix as the guide says (the prefix in place of
/// `fencelock` in `~fencelock:*` and `&fencelock:*`; `~{*` and `&{*` for no prefix) lets
/// a client with that prefix lock, wait woken by a release, and queue fairly, and the
/// server refused it nothing.
#[tokio::test]
async fn the_readme_line_adapted_to_another_prefix_runs_the_features() {
    for (prefix, keys, channels) in [("billing", "~billing:*", "&billing:*"), ("", "~{*", "&{*")] {
        let server = server_with_user(|w| {
            Some(match w {
                "~fencelock:*" => keys.to_owned(),
                "&fencelock:*" => channels.to_owned(),
                _ => w.to_owned(),
            })
        });
        let c = Client::builder(as_user(&server))
            .prefix(prefix)
            .connect()
            .await
            .unwrap();
        let key = |suffix: &str| match prefix {
            "" => format!("{{p}}{suffix}"),
            _ => format!("{prefix}:{{p}}{suffix}"),
        };

        let holder = c.lock("p").try_acquire().await.expect("acquire");
        assert!(server.exists(&key("")), "{prefix:?}: the lock's key");
        let waiter = tokio::spawn(c.lock("p").wait(Duration::from_secs(10)).acquire());
        eventually(
            "the waiter subscribes",
            Duration::from_secs(5),
            async || numsub(&server, &key(":released")) == 1,
        )
        .await;
        holder.release().await.expect("release");
        let g = waiter.await.unwrap().expect("the waiter gets the lock");
        g.release().await.expect("release");

        let first = c.lock("f").fair().try_acquire().await.expect("fair");
        let second = tokio::spawn(c.lock("f").fair().wait(Duration::from_secs(10)).acquire());
        eventually(
            "the fair waiter queues",
            Duration::from_secs(5),
            async || {
                let queue = key(":queue").replace("{p}", "{f}");
                server.cmd(&["LLEN", &queue]).as_int() == Some(1)
            },
        )
        .await;
        first.release().await.unwrap();
        second
            .await
            .unwrap()
            .expect("queued")
            .release()
            .await
            .unwrap();

        let log = server.cmd(&["ACL", "LOG"]);
        assert_eq!(
            log.as_array().map(<[_]>::len),
            Some(0),
            "{prefix:?}: refused {log:?}"
        );
    }
}

/// A user whose channel pattern does not cover fencelock's channels is told so by the
/// release, which names the channel refusal and points at the guide's line; the lock's
/// key is gone all the same (scripts do not roll back), and the refused subscription of
/// a waiter is warned of, not only traced.
#[tokio::test]
async fn a_channel_refused_is_named() {
    let traces = common::traces();
    let server = server_with_user(|w| (w != "&fencelock:*").then(|| w.to_owned()));
    let c = client(&server).await;
    let g = c
        .lock("ch")
        .lease(Duration::from_secs(2))
        .try_acquire()
        .await
        .expect("acquire needs no channel");
    let waiter = tokio::spawn(c.lock("ch").wait(Duration::from_secs(10)).acquire());
    eventually(
        "the refused subscription is warned of",
        Duration::from_secs(5),
        async || {
            traces.text().lines().any(|l| {
                l.contains("WARN") && l.contains("may not subscribe to fencelock's release")
            })
        },
    )
    .await;
    // The release announces only to a listed waiter: the waiter's attempt lists it after
    // its subscription is refused, and the release must come after that.
    eventually("the waiter is listed", Duration::from_secs(5), async || {
        !listed(&server, "ch").is_empty()
    })
    .await;
    let line = refusal(g.release().await.unwrap_err());
    assert!(line.contains("may not publish to the channel"), "{line}");
    assert!(line.contains("release.lua"), "{line}");
    assert!(!server.exists("fencelock:{ch}"));
    // Unwoken, the waiter still gets the lock, at its lease-bounded timer.
    let g = waiter.await.unwrap().expect("the waiter, by its timer");
    drop(g);
}

/// An observer whose user may not subscribe to the election's channel still follows it,
/// by reading: it sees the resignation at its next read (within 5 s with nobody else
/// to wait for), and does not panic for want of a channel to wait on.
#[tokio::test]
async fn an_observer_without_channels_follows_the_election_by_reading() {
    let server = server_with_user(|w| Some(w.to_owned()));
    // A second user, as the guide's but without any channel.
    let mut args = guide_acl(|w| (w != "&fencelock:*").then(|| w.to_owned()));
    args[2] = "watcher".to_owned();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(server.cmd(&args).as_str(), Some("OK"));
    let campaigner = client(&server).await;
    let watcher = Client::connect(&format!(
        "redis://watcher:{PASSWORD}@127.0.0.1:{}",
        server.port()
    ))
    .await
    .expect("connect as the watcher");
    let leader = campaigner
        .election("chair")
        .lease(Duration::from_secs(30))
        .campaign()
        .await
        .expect("campaign");
    let mut observer = watcher.election("chair").observe().await.expect("observe");
    assert_eq!(observer.leader().map(|l| l.term), Some(leader.term()));
    leader.resign().await.expect("resign");
    let changed = tokio::time::timeout(Duration::from_secs(15), observer.changed())
        .await
        .expect("the observer reads again within its recheck")
        .expect("read");
    assert_eq!(changed, None, "nobody leads after the resignation");
}

/// A user who may hear the locks' own channels (`...:released`) but not their clients'
/// (`...:released:TAG`, where a release wakes one client by name): its waiters are not
/// named, and list `*` instead, so that a release with nobody else listed (which
/// publishes nothing) still wakes them on the lock's channel, not at the lease's end.
#[tokio::test]
async fn a_waiter_that_may_not_hear_its_clients_own_channel_is_woken_with_everyone() {
    let server = server_with_user(|w| {
        Some(if w == "&fencelock:*" {
            "&fencelock:*:released".to_owned()
        } else {
            w.to_owned()
        })
    });
    let (holder_client, c) = (client(&server).await, client(&server).await);
    // A plain lock, then a semaphore of 1, each held for 60 s (not renewed).
    for semaphore in [false, true] {
        let name = if semaphore { "sem" } else { "plain" };
        let holder = if semaphore {
            holder_client
                .semaphore(name, 1)
                .lease(Duration::from_secs(60))
                .renew(false)
                .try_acquire()
                .await
        } else {
            holder_client
                .lock(name)
                .lease(Duration::from_secs(60))
                .renew(false)
                .try_acquire()
                .await
        };
        let holder = holder.unwrap();
        let waiting = if semaphore {
            let b = c
                .semaphore(name, 1)
                .lease(Duration::from_secs(60))
                .wait(Duration::from_secs(30));
            tokio::spawn(async move { b.acquire().await })
        } else {
            let b = c
                .lock(name)
                .lease(Duration::from_secs(60))
                .wait(Duration::from_secs(30));
            tokio::spawn(async move { b.acquire().await })
        };
        eventually(
            "the waiter listed as everyone",
            Duration::from_secs(5),
            async || listed(&server, name) == ["*"],
        )
        .await;
        holder.release().await.unwrap();
        // Not listed, it would sleep out the 60 s lease.
        let g = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap_or_else(|_| panic!("{name}: the waiter was woken by the release"))
            .unwrap()
            .expect("the waiter gets it");
        g.release().await.unwrap();
    }
}
