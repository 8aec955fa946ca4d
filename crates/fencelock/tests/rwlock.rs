//! Read-write locks: many readers or one writer, each with a lease and a fencing token
//! from one counter; a waiting writer goes before new readers; reentrancy by owner.
//! Against real redis-server processes (single, Cluster, Sentinel), with real faults.

use std::time::{Duration, Instant};

use fencelock::{Blocker, Client, Error, Holder, LossCause};
use testkit::{Cluster, RedisServer, SentinelGroup};

mod common;
use common::{commands_run, count_commands, eventually, numsub, script_sizes, spawn_helper};

const HELPER_ENV: &str = "FENCELOCK_RWLOCK_HELPER";

/// Readers holding `name` (the ZSET without its mark).
fn readers(r: &RedisServer, name: &str) -> i64 {
    let key = format!("fencelock:{{{name}}}");
    match r.cmd(&["TYPE", &key]).as_str() {
        Some("zset") => r.cmd(&["ZCARD", &key]).as_int().expect("ZCARD") - 1,
        _ => 0,
    }
}

/// Writers registered as waiting for `name`'s readers.
fn writers_waiting(r: &RedisServer, name: &str) -> i64 {
    r.cmd(&["ZCARD", &format!("fencelock:{{{name}}}:writers")])
        .as_int()
        .expect("ZCARD")
}

#[test]
#[ignore = "helper process entry point, started by the tests below"]
fn helper_process() {
    common::helper_entry(HELPER_ENV, async |c, words| {
        let [name, role, lease] = &words[..] else {
            panic!("bad spec {words:?}")
        };
        let lease = Duration::from_millis(lease.parse().unwrap());
        match role.as_str() {
            // Holds the read side until killed.
            "reader" => {
                let _held = c.read_lock(name).lease(lease).try_acquire().await.unwrap();
                std::future::pending::<()>().await;
            }
            // Waits for the write side until killed.
            "writer" => {
                let _ = c.lock(name).lease(lease).wait_forever().acquire().await;
                unreachable!("killed while waiting");
            }
            other => panic!("unknown role {other}"),
        }
    });
}

#[tokio::test]
async fn many_readers_or_one_writer_and_every_grant_has_a_higher_token() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(c.read_lock("doc").try_acquire().await.unwrap());
    }
    let tokens: Vec<u64> = held.iter().map(|g| g.fencing_token().get()).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert_eq!(readers(&r, "doc"), 3);

    // A writer that only tries finds the readers, and is told how many and until when;
    // it does not register as waiting.
    let e = c.lock("doc").try_acquire().await.unwrap_err();
    match &e {
        Error::Held {
            blocked_by: Blocker::Readers {
                readers, frees_in, ..
            },
            ..
        } => {
            assert_eq!(*readers, 3);
            assert!(*frees_in > Duration::from_secs(25), "{frees_in:?}");
        }
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(text.contains("3 readers hold it"), "{text}");
    assert_eq!(text.lines().count(), 1);
    assert_eq!(writers_waiting(&r, "doc"), 0);
    // A reentrant writer is held off alike.
    assert!(matches!(
        c.lock("doc").reentrant("job").try_acquire().await,
        Err(Error::Held {
            blocked_by: Blocker::Readers { readers: 3, .. },
            ..
        })
    ));

    for g in held {
        g.release().await.unwrap();
    }
    assert!(
        !r.exists("fencelock:{doc}"),
        "the last reader out deletes the key"
    );
    let writer = c.lock("doc").try_acquire().await.unwrap();
    assert!(writer.fencing_token().get() > tokens[2]);
    assert!(matches!(
        c.read_lock("doc").try_acquire().await,
        Err(Error::Held {
            blocked_by: Blocker::Lease(_),
            ..
        })
    ));
    let writer_token = writer.fencing_token();
    writer.release().await.unwrap();
    let reader = c.read_lock("doc").try_acquire().await.unwrap();
    assert!(reader.fencing_token() > writer_token);
    reader.release().await.unwrap();
}

#[tokio::test]
async fn a_waiting_writer_goes_before_new_readers_and_its_release_wakes_them_all() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let other = Client::connect(&r.url()).await.unwrap();
    // 30 s leases: only release messages can end the waits below in time.
    let first = c.read_lock("report").try_acquire().await.unwrap();
    let writer = tokio::spawn(other.lock("report").wait(Duration::from_secs(10)).acquire());
    eventually(
        "the writer waits among the writers",
        Duration::from_secs(5),
        async || writers_waiting(&r, "report") == 1,
    )
    .await;

    // A new reader queues behind the waiting writer.
    let e = c.read_lock("report").try_acquire().await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Held {
                blocked_by: Blocker::WritersWaiting { writers: 1, .. },
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("a writer waits for the readers"),
        "{e}"
    );
    let late_readers: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn(
                c.read_lock("report")
                    .wait(Duration::from_secs(10))
                    .acquire(),
            )
        })
        .collect();
    eventually(
        "the late readers and the writer are subscribed",
        Duration::from_secs(5),
        async || numsub(&r, "fencelock:{report}:released") == 2,
    )
    .await;

    let released_at = Instant::now();
    let first_token = first.fencing_token();
    first.release().await.unwrap();
    let writer = writer
        .await
        .unwrap()
        .expect("woken by the last reader's release");
    assert!(released_at.elapsed() < Duration::from_secs(5));
    assert!(writer.fencing_token() > first_token);
    assert_eq!(
        writers_waiting(&r, "report"),
        0,
        "a grant leaves the writers"
    );
    assert!(late_readers.iter().all(|h| !h.is_finished()));

    let released_at = Instant::now();
    let writer_token = writer.fencing_token();
    writer.release().await.unwrap();
    for h in late_readers {
        let g = h
            .await
            .unwrap()
            .expect("every reader woken by the writer's release");
        assert!(g.fencing_token() > writer_token);
        g.release().await.unwrap();
    }
    assert!(released_at.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_writer_that_gives_up_or_is_cancelled_lets_the_readers_in_at_once() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let reader = c.read_lock("feed").try_acquire().await.unwrap();

    // Gives up: its withdrawal leaves the writers.
    let e = c
        .lock("feed")
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Held {
                blocked_by: Blocker::Readers { readers: 1, .. },
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(writers_waiting(&r, "feed"), 0);
    c.read_lock("feed")
        .try_acquire()
        .await
        .expect("no writer waits")
        .release()
        .await
        .unwrap();

    // Cancelled: withdrawn in the background, and the reader that queued behind it is
    // woken at once (its fallback would be the writer's 30 s registration).
    let writer = tokio::spawn(c.lock("feed").wait_forever().acquire());
    eventually("the writer waits", Duration::from_secs(5), async || {
        writers_waiting(&r, "feed") == 1
    })
    .await;
    let queued = tokio::spawn(c.read_lock("feed").wait(Duration::from_secs(10)).acquire());
    eventually("both are subscribed", Duration::from_secs(5), async || {
        numsub(&r, "fencelock:{feed}:released") == 1 && c.stats().waiters == 2
    })
    .await;
    let cancelled_at = Instant::now();
    writer.abort();
    assert!(writer.await.unwrap_err().is_cancelled());
    let second = queued
        .await
        .unwrap()
        .expect("woken when the writer withdrew");
    assert!(cancelled_at.elapsed() < Duration::from_secs(5));
    assert_eq!(writers_waiting(&r, "feed"), 0);
    assert_eq!(readers(&r, "feed"), 2);
    second.release().await.unwrap();
    reader.release().await.unwrap();
}

#[tokio::test]
async fn a_sigkilled_waiting_writer_holds_readers_back_for_one_lease_at_most() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let reader = c.read_lock("nightly").try_acquire().await.unwrap();
    let lease = Duration::from_millis(1500);
    let mut writer = spawn_helper(
        "helper_process",
        HELPER_ENV,
        format!("{} nightly writer {}", r.url(), lease.as_millis()),
    );
    eventually(
        "the helper waits as a writer",
        Duration::from_secs(10),
        async || writers_waiting(&r, "nightly") == 1,
    )
    .await;
    writer.kill().unwrap();
    writer.wait().unwrap();
    let killed_at = Instant::now();
    assert!(matches!(
        c.read_lock("nightly").try_acquire().await,
        Err(Error::Held {
            blocked_by: Blocker::WritersWaiting { .. },
            ..
        })
    ));
    let next = c
        .read_lock("nightly")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the dead writer's registration runs out");
    let after = killed_at.elapsed();
    assert!(after <= lease + Duration::from_millis(500), "{after:?}");
    next.release().await.unwrap();
    reader.release().await.unwrap();
}

#[tokio::test]
async fn a_sigkilled_readers_lease_ends_after_one_lease_and_not_before() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lease = Duration::from_millis(1500);
    let mut reader = spawn_helper(
        "helper_process",
        HELPER_ENV,
        format!("{} ledger reader {}", r.url(), lease.as_millis()),
    );
    eventually("the helper reads", Duration::from_secs(10), async || {
        readers(&r, "ledger") == 1
    })
    .await;
    reader.kill().unwrap();
    reader.wait().unwrap();
    let killed_at = Instant::now();
    let writer = c
        .lock("ledger")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the dead reader's lease runs out");
    let after = killed_at.elapsed();
    assert!(
        after >= lease / 2 && after <= lease + Duration::from_millis(500),
        "{after:?}"
    );
    writer.release().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_renews_readers_and_a_reader_removed_from_outside_hears_of_it() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lease = Duration::from_millis(300);
    let a = c
        .read_lock("cache")
        .lease(lease)
        .try_acquire()
        .await
        .unwrap();
    let b = c
        .read_lock("cache")
        .lease(lease)
        .try_acquire()
        .await
        .unwrap();
    tokio::time::sleep(lease * 4).await;
    assert!(a.loss_cause().is_none() && b.loss_cause().is_none());
    assert_eq!(readers(&r, "cache"), 2, "renewed past four leases");
    r.cmd(&["ZREM", "fencelock:{cache}", b.holder_token().as_str()]);
    let cause = tokio::time::timeout(Duration::from_secs(2), b.lost())
        .await
        .expect("the next renewal notices");
    assert_eq!(cause, LossCause::Deleted);
    assert!(a.loss_cause().is_none());
    a.release().await.unwrap();
    assert!(!r.exists("fencelock:{cache}"));
}

#[tokio::test]
async fn an_owner_reads_under_its_own_write_lock_and_past_writers_it_would_block() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();

    // The read side of the owner's write lock: one more hold, the same token.
    let write = c
        .lock("acct")
        .reentrant("job-7")
        .try_acquire()
        .await
        .unwrap();
    let read = c
        .read_lock("acct")
        .reentrant("job-7")
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(read.fencing_token(), write.fencing_token());
    assert!(matches!(
        c.read_lock("acct").try_acquire().await,
        Err(Error::Held { .. })
    ));
    assert!(matches!(
        c.read_lock("acct").reentrant("job-8").try_acquire().await,
        Err(Error::Held { .. })
    ));
    // Releasing the write side leaves the owner's read hold: still nobody else's.
    write.release().await.unwrap();
    assert!(matches!(
        c.read_lock("acct").try_acquire().await,
        Err(Error::Held { .. })
    ));
    read.release().await.unwrap();
    assert!(!r.exists("fencelock:{acct}"));

    // An owner that reads gets in again past a waiting writer (which waits for it);
    // another owner does not.
    let first = c
        .read_lock("acct")
        .reentrant("job-7")
        .try_acquire()
        .await
        .unwrap();
    let writer = tokio::spawn(c.lock("acct").wait(Duration::from_secs(10)).acquire());
    eventually("the writer waits", Duration::from_secs(5), async || {
        writers_waiting(&r, "acct") == 1
    })
    .await;
    let again = c
        .read_lock("acct")
        .reentrant("job-7")
        .try_acquire()
        .await
        .expect("its owner already reads");
    assert!(again.fencing_token() > first.fencing_token());
    assert!(matches!(
        c.read_lock("acct").reentrant("job-8").try_acquire().await,
        Err(Error::Held {
            blocked_by: Blocker::WritersWaiting { .. },
            ..
        })
    ));
    first.release().await.unwrap();
    again.release().await.unwrap();
    writer
        .await
        .unwrap()
        .expect("the writer after both")
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn bad_combinations_are_invalid_and_a_name_is_one_kind_of_primitive() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // A fair, permit-counting or holder-info reader does not compile (ReadLockBuilder
    // has no such methods; the compile_fail examples on AcquireBuilder show it).
    let cases = [(c.read_lock("d").reentrant(""), "owner id")];
    for (builder, field) in cases {
        let e = builder.try_acquire().await.unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { what, .. } if *what == field),
            "{e:?}"
        );
    }
    assert_eq!(r.cmd(&["DBSIZE"]).as_int(), Some(0));

    // Readers' key refused to a semaphore and a fair lock, named as what it is.
    let reader = c.read_lock("d").try_acquire().await.unwrap();
    for e in [
        c.semaphore("d", 2).try_acquire().await.unwrap_err(),
        c.lock("d").fair().try_acquire().await.unwrap_err(),
        c.set_permits("d", 3).await.unwrap_err(),
    ] {
        assert!(
            matches!(&e, Error::WrongType { found, .. } if found == "readers"),
            "{e:?}"
        );
        assert!(e.to_string().contains("a read-write lock's readers"), "{e}");
        assert_eq!(e.to_string().lines().count(), 1);
    }
    assert_eq!(readers(&r, "d"), 1);
    assert!(!r.exists("fencelock:{d}:permits"));
    reader.release().await.unwrap();

    // A reader on a semaphore's name.
    let permit = c.semaphore("s", 2).try_acquire().await.unwrap();
    let e = c.read_lock("s").try_acquire().await.unwrap_err();
    assert!(e.to_string().contains("holds a semaphore"), "{e}");
    assert_eq!(r.cmd(&["ZCARD", "fencelock:{s}"]).as_int(), Some(1));
    permit.release().await.unwrap();

    let nodes = RedisServer::start_many(3);
    let redlock = Client::redlock(nodes.iter().map(RedisServer::url))
        .connect()
        .await
        .unwrap();
    let e = redlock.read_lock("d").try_acquire().await.unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { reason, .. } if reason.contains("single Redis node")),
        "{e:?}"
    );
    for n in &nodes {
        assert_eq!(n.cmd(&["DBSIZE"]).as_int(), Some(0));
    }
}

#[tokio::test]
async fn inspect_list_and_break_show_and_free_the_readers() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let mut a = c.read_lock("board").try_acquire().await.unwrap();
    let b = c.read_lock("board").try_acquire().await.unwrap();
    let writer = tokio::spawn(c.lock("board").wait(Duration::from_secs(10)).acquire());
    eventually("the writer waits", Duration::from_secs(5), async || {
        writers_waiting(&r, "board") == 1
    })
    .await;

    let status = c.inspect("board").await.unwrap();
    let state = status.nodes[0].state.as_ref().unwrap();
    match &state.holder {
        Some(Holder::Readers { held }) => {
            assert_eq!(held.len(), 2);
            assert!(held[0] > Duration::from_secs(25), "{held:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(state.writers_waiting, 1);
    let listing = c.list("*").await.unwrap();
    assert_eq!(listing.locks.len(), 1, "{listing:?}");
    assert_eq!(listing.locks[0].name, "board");

    // A break frees every reader; the waiting writer gets it with a higher token.
    let broken = c.break_lock("board").await.unwrap();
    let outcome = broken.nodes[0].outcome.as_ref().unwrap();
    match &outcome.broke {
        Some(Holder::Readers { held }) => assert_eq!(held.len(), 2, "{held:?}"),
        other => panic!("{other:?}"),
    }
    let counter = outcome.fencing_counter.unwrap();
    assert!(counter > b.fencing_token().get());
    let writer = writer.await.unwrap().expect("woken by the break");
    assert!(writer.fencing_token().get() > counter);
    assert!(matches!(
        a.extend(Duration::from_secs(30)).await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(b.release().await, Err(Error::LeaseLost { .. })));
    let state = c
        .inspect("board")
        .await
        .unwrap()
        .nodes
        .remove(0)
        .state
        .unwrap();
    assert!(matches!(state.holder, Some(Holder::Plain { .. })));
    assert_eq!(state.writers_waiting, 0);
    writer.release().await.unwrap();
}

#[tokio::test]
async fn readers_and_a_writer_on_a_cluster() {
    let cluster = Cluster::shared();
    let c = Client::connect(&cluster.url()).await.unwrap();
    let lease = Duration::from_millis(600);
    let a = c.read_lock("crw").lease(lease).try_acquire().await.unwrap();
    let b = c.read_lock("crw").lease(lease).try_acquire().await.unwrap();
    let writer = tokio::spawn(
        c.lock("crw")
            .lease(lease)
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    // Renewed across several leases while the writer waits, and it keeps waiting.
    tokio::time::sleep(lease * 3).await;
    assert!(a.loss_cause().is_none() && b.loss_cause().is_none());
    assert!(!writer.is_finished());
    assert!(matches!(
        c.read_lock("crw").try_acquire().await,
        Err(Error::Held {
            blocked_by: Blocker::WritersWaiting { .. },
            ..
        })
    ));
    let last = b.fencing_token();
    a.release().await.unwrap();
    b.release().await.unwrap();
    let w = writer.await.unwrap().expect("woken by sharded pub/sub");
    assert!(w.fencing_token() > last);
    w.release().await.unwrap();
}

#[tokio::test]
async fn readers_and_a_writer_on_a_sentinel_managed_master() {
    let group = SentinelGroup::start();
    let c = Client::connect(&group.url()).await.unwrap();
    let a = c.read_lock("srw").try_acquire().await.unwrap();
    let b = c.read_lock("srw").try_acquire().await.unwrap();
    assert!(matches!(
        c.lock("srw").try_acquire().await,
        Err(Error::Held {
            blocked_by: Blocker::Readers { readers: 2, .. },
            ..
        })
    ));
    let last = b.fencing_token();
    a.release().await.unwrap();
    b.release().await.unwrap();
    let w = c.lock("srw").try_acquire().await.unwrap();
    assert!(w.fencing_token() > last);
    w.release().await.unwrap();
}

/// A read hold made under its owner's write lock by an acquire whose reply was lost (or
/// that was cancelled) is withdrawn by `read_release.lua`: the write lock frees with its
/// own release, not one lease later.
#[tokio::test]
async fn a_withdrawn_read_hold_under_its_owners_write_lock_is_given_back() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let w = c.lock("h").reentrant("o").try_acquire().await.unwrap();
    let source = fencelock::lua_scripts()
        .find(|(name, _)| *name == "rwlock/read_release.lua")
        .map(|(_, s)| s)
        .unwrap();
    let token = "ab".repeat(16);
    // What read_acquire.lua's grant left, its reply never read.
    r.cmd(&["HSET", "fencelock:{h}", &format!("hold:{token}"), "1"]);
    let member = format!("{token}:o");
    let withdraw = |member: &str| {
        r.cmd(&[
            "EVAL",
            &source,
            "1",
            "fencelock:{h}",
            member,
            "fencelock:{h}:released",
        ])
        .as_int()
    };
    assert_eq!(
        withdraw(&format!("{token}:other")),
        Some(-1),
        "another owner's: left"
    );
    assert_eq!(withdraw(&member), Some(1));
    assert_eq!(withdraw(&member), Some(-1), "once only");
    w.release().await.unwrap();
    assert!(
        !r.exists("fencelock:{h}"),
        "free with the writer's own release"
    );
}

/// What an uncontended read costs Redis (docs/benchmarks.md, "Redis's work per lock"):
/// with nobody holding the lock or waiting, the acquire's common case and the last
/// reader's release run the fewest commands, and the release announces nothing.
#[tokio::test]
async fn an_uncontended_read_runs_the_fewest_commands() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // Once first: the scripts loaded, the server asked what it offers.
    let g = c.read_lock("report").try_acquire().await.unwrap();
    g.release().await.unwrap();
    count_commands(&r);
    let g = c.read_lock("report").try_acquire().await.unwrap();
    g.release().await.unwrap();
    let expected = [
        ("del", 1),     // the last reader's release
        ("evalsha", 2), // read_acquire.lua, read_release.lua
        ("exists", 2),  // no holder nor waiting writer; nobody waits for the release
        ("get", 1),     // the counter
        ("pexpire", 1), // the readers' set lives as long as the lease
        ("set", 1),     // the counter
        ("time", 2),    // the token's floor and the lease's end; the lease not over
        ("zadd", 1),    // the reader and the readers' mark
        ("zcard", 1),   // the last reader
        ("zscore", 1),  // the reader's lease
    ];
    let expected: Vec<(String, u64)> = expected.iter().map(|(n, c)| ((*n).into(), *c)).collect();
    assert_eq!(commands_run(&r), expected);
    assert_eq!(
        script_sizes(&r),
        [("3".to_owned(), 5), ("3".to_owned(), 7)],
        "(keys, keys + arguments)"
    );
    assert!(
        !r.exists("fencelock:{report}"),
        "the last reader took the key with it"
    );
}
