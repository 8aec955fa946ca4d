//! Waiting for a held lock: release notifications by pub/sub, the lease bound that backs
//! them up, cancellation, and fair (FIFO) mode, against real redis-server processes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock::{Blocker, Client, Error};
use testkit::RedisServer;

mod common;
use common::{eventually, listed, numsub, spawn_helper};

const HELPER_ENV: &str = "FENCELOCK_WAITING_HELPER";

fn llen(r: &RedisServer, key: &str) -> i64 {
    r.cmd(&["LLEN", key]).as_int().unwrap()
}

/// Another OS process running the library: `hold TTL_MS` takes the lock and never
/// releases it; `wait 0` waits for it for ever; `fair-wait TIMEOUT_MS` joins the fair
/// queue and waits for ever.
fn helper(r: &RedisServer, name: &str, mode: &str, arg: u64) -> common::Helper {
    spawn_helper(
        "helper_process",
        HELPER_ENV,
        format!("{} {name} {mode} {arg}", r.url()),
    )
}

#[test]
#[ignore = "helper process entry point, started by the tests below"]
fn helper_process() {
    common::helper_entry(HELPER_ENV, async |c, words| {
        let [name, mode, arg] = &words[..] else {
            panic!("bad spec {words:?}")
        };
        let arg = Duration::from_millis(arg.parse().unwrap());
        let guard = match mode.as_str() {
            "hold" => c
                .lock(name)
                .lease(arg)
                .renew(false)
                .try_acquire()
                .await
                .unwrap(),
            "wait" => c.lock(name).wait_forever().acquire().await.unwrap(),
            "fair-wait" => c
                .lock(name)
                .waiter_timeout(arg)
                .wait_forever()
                .acquire()
                .await
                .unwrap(),
            _ => panic!("unknown mode {mode}"),
        };
        std::mem::forget(guard); // a holder that never releases: only SIGKILL ends it
        std::future::pending::<()>().await;
    });
}

#[tokio::test]
async fn a_release_wakes_the_waiter_at_once() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // A long lease: only the release message can end this wait quickly.
    let holder = c
        .lock("n")
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(c.lock("n").wait(Duration::from_secs(30)).acquire());
    eventually(
        "the waiter subscribed",
        Duration::from_secs(5),
        async || c.stats().waiters == 1,
    )
    .await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let guard = waiter.await.unwrap().unwrap();
    let handoff = released.elapsed();
    // A handoff takes milliseconds; the bound leaves a loaded machine seconds, far from
    // the 30 s wait or the 60 s lease.
    assert!(
        handoff < Duration::from_secs(5),
        "woken by the release, not the 60 s lease: {handoff:?}"
    );
    guard.release().await.unwrap();
    assert_eq!(c.stats().waiters, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sets_off_one_attempt_not_one_per_waiter() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // Long fixed leases: no waiter's lease-bound timer runs out during the test, and no
    // watchdog sends renewals, so every script call is an attempt or a release.
    let ttl = Duration::from_secs(60);
    let holder = c
        .lock("herd")
        .lease(ttl)
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let n: u64 = 20;
    let before_waiters = r.script_calls();
    let mut waiters = Vec::new();
    for _ in 0..n {
        let lock = c
            .lock("herd")
            .lease(ttl)
            .renew(false)
            .wait(Duration::from_secs(30));
        waiters.push(tokio::spawn(async move {
            lock.acquire().await.unwrap().release().await.unwrap();
        }));
    }
    // Every waiter made its two refused attempts (before and after subscribing) and
    // waits: the server counted them.
    eventually("20 waiters waiting", Duration::from_secs(5), async || {
        c.stats().waiters == 20 && r.script_calls() >= before_waiters + 2 * n
    })
    .await;
    let before = r.script_calls();
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    // The holder's release; each waiter's one woken attempt, which wins, and its
    // release. Waking every waiter on each release would cost about n^2 / 2 attempts
    // more (190 here). The slack covers a first `NOSCRIPT` of the release script.
    let calls = r.script_calls() - before;
    let one_each = 1 + 2 * n;
    assert!(
        calls <= one_each + 2,
        "{calls} script calls for {n} handoffs; one woken attempt per release needs {one_each}"
    );
}

#[tokio::test]
async fn a_woken_waiter_dropped_before_its_attempt_hands_the_wake_on() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let other = Client::connect(&r.url()).await.unwrap();
    // Long leases: a waiter left asleep would wait out 30 s, not the 5 s allowed below.
    let ttl = Duration::from_secs(60);
    // Load the scripts first, so that the counts below are of script runs only.
    let warm_up = other.lock("warm-up").try_acquire().await.unwrap();
    warm_up.release().await.unwrap();
    let holder = other
        .lock("baton")
        .lease(ttl)
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let _probe_holder = other
        .lock("probe")
        .lease(ttl)
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let waiting = |name: &str| {
        c.lock(name)
            .lease(ttl)
            .renew(false)
            .wait(Duration::from_secs(30))
    };

    // The first waiter's future is polled only until it waits, then never again: it
    // stands for a task that is woken but cancelled before it runs.
    let first_lock = waiting("baton");
    let mut first = Box::pin(first_lock.acquire());
    let calls = r.script_calls();
    tokio::select! {
        result = &mut first => panic!("acquired a held lock: {result:?}"),
        () = eventually("the first waiter waits", Duration::from_secs(5), async || {
            c.stats().waiters == 1 && r.script_calls() == calls + 2
        }) => {}
    }
    let second_lock = waiting("baton");
    let second = tokio::spawn(async move { second_lock.acquire().await.unwrap() });
    // A waiter on another lock of the same client: its wake comes on the same pub/sub
    // connection, after the release's, so its attempt shows the release was dispatched.
    let probe_lock = waiting("probe");
    let probe = tokio::spawn(async move { probe_lock.acquire().await });
    eventually("all three wait", Duration::from_secs(5), async || {
        c.stats().waiters == 3 && r.script_calls() == calls + 6
    })
    .await;

    holder.release().await.unwrap();
    r.cmd(&["PUBLISH", "fencelock:{probe}:released", ""]);
    eventually("the probe's attempt", Duration::from_secs(5), async || {
        r.script_calls() >= calls + 8
    })
    .await;
    assert_eq!(
        r.script_calls(),
        calls + 8,
        "the release and the probe's attempt only: the second waiter was not woken"
    );
    assert!(
        !r.exists("fencelock:{baton}"),
        "the release woke only the first waiter, which did not run: the lock is free"
    );

    let dropped = Instant::now();
    drop(first);
    let guard = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second waiter got the wake the first one left")
        .unwrap();
    assert!(dropped.elapsed() < Duration::from_secs(5));
    guard.release().await.unwrap();
    probe.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_owner_all_get_the_lock_at_the_release() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // Another owner holds it for a minute: only the release message ends these waits
    // quickly, and one message wakes one waiter per owner.
    let holder = c
        .lock("shared")
        .reentrant("other-job")
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let lock = c
            .lock("shared")
            .reentrant("job-7")
            .lease(Duration::from_secs(60))
            .renew(false)
            .wait(Duration::from_secs(30));
        // Each keeps its hold: all three are held together once the other job left.
        waiters.push(tokio::spawn(async move { lock.acquire().await.unwrap() }));
    }
    eventually("3 waiters subscribed", Duration::from_secs(5), async || {
        c.stats().waiters == 3
    })
    .await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let mut guards = Vec::new();
    for w in waiters {
        guards.push(w.await.unwrap());
    }
    let elapsed = released.elapsed();
    assert!(
        elapsed < Duration::from_secs(5),
        "every hold of job-7 came with the release, not the 60 s lease: {elapsed:?}"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    assert!(!r.exists("fencelock:{shared}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_their_subscription_being_killed() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let ttl = Duration::from_secs(2);
    let holder = c
        .lock("k")
        .lease(ttl)
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let acquired = Arc::new(Mutex::new(0usize));
    let mut waiters = Vec::new();
    for _ in 0..20 {
        let lock = c
            .lock("k")
            .lease(ttl)
            .renew(false)
            .wait(Duration::from_secs(30));
        let acquired = acquired.clone();
        waiters.push(tokio::spawn(async move {
            let g = lock.acquire().await.unwrap();
            *acquired.lock().unwrap() += 1;
            g.release().await.unwrap();
        }));
    }
    // Registered in the client, and subscribed on the server: the client counts a
    // waiter before its SUBSCRIBE has gone through.
    eventually(
        "20 waiters subscribed",
        Duration::from_secs(5),
        async || c.stats().waiters == 20 && numsub(&r, "fencelock:{k}:released") > 0,
    )
    .await;
    assert_eq!(
        numsub(&r, "fencelock:{k}:released"),
        1,
        "one subscription serves all 20"
    );
    let killed = r
        .cmd(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .as_int()
        .unwrap();
    assert_eq!(killed, 1, "the client's one pub/sub connection");
    let started = Instant::now();
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*acquired.lock().unwrap(), 20);
    let elapsed = started.elapsed();
    // Woken by the restored subscription, or at worst by the holder's TTL, then 20
    // handoffs: the margin is for those on a loaded machine, far below 20 waiters
    // each waiting a lease out (40 s).
    assert!(
        elapsed < ttl + Duration::from_secs(3),
        "within the TTL plus a margin: {elapsed:?}"
    );
    // The subscription came back by itself.
    eventually(
        "resubscribed or cleaned up",
        Duration::from_secs(5),
        async || c.stats().subscribed_channels == 0,
    )
    .await;
}

#[tokio::test]
async fn a_holder_killed_without_releasing_frees_the_lock_after_its_ttl() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let ttl = Duration::from_millis(800);
    let mut holder = helper(&r, "crash", "hold", ttl.as_millis() as u64);
    eventually(
        "the holder process took the lock",
        Duration::from_secs(10),
        async || r.exists("fencelock:{crash}"),
    )
    .await;
    let waiter = tokio::spawn(c.lock("crash").wait(Duration::from_secs(30)).acquire());
    holder.kill().unwrap();
    let killed = Instant::now();
    holder.wait().unwrap();
    let guard = waiter.await.unwrap().expect("the waiter gets the lock");
    let waited = killed.elapsed();
    // The waiter sleeps exactly the TTL Redis reported, then tries again; the margin
    // is for a loaded machine, far from the 30 s a waiter for a release message would
    // wait.
    assert!(
        waited <= ttl + Duration::from_secs(1),
        "TTL plus a small margin: {waited:?}"
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_wait_leaves_no_key_queue_entry_or_subscription() {
    let log = common::traces();
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    for fair in [false, true] {
        let name = if fair { "cf" } else { "cp" };
        let holder = c.lock(name).fair().try_acquire().await.unwrap();
        let keys_before = r.cmd(&["DBSIZE"]).as_int();
        let mut lock = c.lock(name).wait_forever();
        if fair {
            lock = lock.fair();
        }
        let waiting = tokio::spawn(lock.acquire());
        let queue = format!("fencelock:{{{name}}}:queue");
        // Registered, and its attempt after registering answered: it sleeps until a
        // release (cancelled while an attempt is in flight, the acquire must withdraw
        // what that attempt may have written, which the plain case checks it does not
        // do needlessly).
        let asleep = format!("lock=\"{name}\" ");
        eventually(
            "the waiter is registered and asleep",
            Duration::from_secs(5),
            async || {
                c.stats().waiters == 1
                    && (!fair || llen(&r, &queue) == 1)
                    && log
                        .text()
                        .lines()
                        .any(|l| l.contains(&asleep) && l.contains("lock still held"))
            },
        )
        .await;
        let calls = r.script_calls();
        waiting.abort();
        assert!(waiting.await.unwrap_err().is_cancelled());
        assert_eq!(c.stats().waiters, 0, "unregistered in the client at once");
        c.flush().await;
        // Every attempt was answered: nothing to withdraw, no release sent for nothing.
        // One call cleans up: the fair waiter leaves the queue, the plain waiter's client
        // the wake list.
        assert_eq!(r.script_calls(), calls + 1, "one clean-up call");
        assert_eq!(llen(&r, &queue), 0, "no queue entry left");
        assert_eq!(
            r.cmd(&["ZCARD", &format!("fencelock:{{{name}}}:waiters")])
                .as_int(),
            Some(0)
        );
        // A plain waiter's client left the wake list its attempts put it on. A fair
        // waiter listed `*` (the holder might have been a plain lock's, whose release
        // then wakes every client), which stays for others until the holder's lease
        // ends and a margin: a key that expires.
        if fair {
            assert_eq!(listed(&r, name), ["*"]);
            // (The lock's first: the list's, read after it, can only be lower; a few
            // ms for the rounding of each.)
            let lease_left = r.pttl(&format!("fencelock:{{{name}}}"));
            let wakes_ttl = r.pttl(&format!("fencelock:{{{name}}}:wakes"));
            assert!(
                wakes_ttl > 0 && wakes_ttl <= lease_left + 1_000 + 5,
                "{wakes_ttl} ms left, the lease {lease_left}"
            );
            r.cmd(&["DEL", &format!("fencelock:{{{name}}}:wakes")]);
        }
        assert_eq!(r.cmd(&["DBSIZE"]).as_int(), keys_before, "no key left");
        let channel = format!("fencelock:{{{name}}}:released");
        eventually(
            "unsubscribed on the server",
            Duration::from_secs(5),
            async || numsub(&r, &channel) == 0 && c.stats().subscribed_channels == 0,
        )
        .await;
        holder.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_wait_that_times_out_in_fair_mode_leaves_the_queue() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let holder = c.lock("ft").fair().try_acquire().await.unwrap();
    let err = c
        .lock("ft")
        .fair()
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Held { .. }), "{err:?}");
    assert_eq!(
        llen(&r, "fencelock:{ft}:queue"),
        0,
        "left the queue before returning"
    );
    holder.release().await.unwrap();
}

#[tokio::test]
async fn a_fair_release_hands_the_lock_to_the_next_waiter_without_a_call_of_its_own() {
    let log = common::traces();
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // A waiter timeout long enough that no periodic call of the waiter falls in the
    // handover (it calls again every 10 s); a lease longer than it, so that the
    // handover's lease (bounded by the waiter's deadline) is shorter than asked for.
    let lock = |name: &str, renew: bool| {
        c.lock(name)
            .fair()
            .waiter_timeout(Duration::from_secs(30))
            .lease(Duration::from_secs(40))
            .renew(renew)
    };
    for (name, renew) in [("handover", true), ("handover-fixed", false)] {
        let holder = lock(name, renew).try_acquire().await.unwrap();
        let waiting = tokio::spawn(lock(name, renew).wait(Duration::from_secs(20)).acquire());
        let asleep = format!("lock=\"{name}\" ");
        eventually("the waiter is asleep", Duration::from_secs(5), async || {
            log.text()
                .lines()
                .any(|l| l.contains(&asleep) && l.contains("lock still held"))
        })
        .await;
        let before = r.script_calls();
        let released_fence = holder.fencing_token();
        holder.release().await.unwrap();
        let guard = waiting.await.unwrap().expect("the waiter gets the lock");
        let calls = r.script_calls() - before;
        assert!(guard.fencing_token() > released_fence);
        assert_eq!(
            r.get(&format!("fencelock:{{{name}}}")).as_deref(),
            Some(guard.holder_token().as_str())
        );
        let pttl = r
            .cmd(&["PTTL", &format!("fencelock:{{{name}}}")])
            .as_int()
            .unwrap();
        if renew {
            // The release's call alone: the waiter took the lock from the message. Its
            // lease ends at its deadline (30 s), which the watchdog extends to 40 s.
            assert_eq!(calls, 1, "the release only");
            assert!(pttl <= 30_000, "PTTL {pttl}");
            assert!(guard.remaining() <= Duration::from_millis(pttl as u64));
        } else {
            // Nobody would extend a 30 s lease to the 40 s asked for: the waiter's own
            // call confirms the grant and sets its lease.
            assert_eq!(calls, 2, "the release, then the waiter's call");
            assert!(pttl > 30_000, "PTTL {pttl}");
        }
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_fair_waiter_beside_another_of_its_client_asks_once_before_its_turn() {
    let log = common::traces();
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // Long enough that no waiter calls again (every 10 s) and no lease is renewed
    // (after 10 s) before the end.
    let lock = || {
        c.lock("beside")
            .fair()
            .waiter_timeout(Duration::from_secs(30))
            .lease(Duration::from_secs(30))
            .wait(Duration::from_secs(20))
    };
    let lines = |event: &str| {
        log.text()
            .lines()
            .filter(|l| l.contains("lock=\"beside\" ") && l.contains(event))
            .count()
    };
    let holder = lock().try_acquire().await.unwrap();
    let first = tokio::spawn(lock().acquire());
    eventually(
        "the first waiter is asleep",
        Duration::from_secs(5),
        async || lines("lock still held") == 1,
    )
    .await;
    // The first waiter keeps the lock's channels open: the second joins them before its
    // first attempt, so that one refusal is all it needs before its turn.
    let before = r.script_calls();
    let second = tokio::spawn(lock().acquire());
    eventually(
        "the second waiter was refused",
        Duration::from_secs(5),
        async || lines("waiting for the lock to be released") == 2,
    )
    .await;
    assert_eq!(
        r.cmd(&["LLEN", "fencelock:{beside}:queue"]).as_int(),
        Some(2)
    );
    // Each is handed the lock in its turn by the release before it.
    let first = common::handed_to(holder, first).await;
    let second = common::handed_to(first, second).await;
    assert_eq!(
        r.script_calls() - before,
        3,
        "the second waiter's one attempt and the two releases"
    );
    assert_eq!(
        lines("lock still held"),
        1,
        "the first waiter's second attempt only"
    );
    second.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_dropped_as_the_lock_is_handed_to_it_leaves_nothing_behind() {
    let log = common::traces();
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lock = || c.lock("handed-drop").fair();
    let holder = lock().try_acquire().await.unwrap();
    let waiting = tokio::spawn(lock().wait(Duration::from_secs(20)).acquire());
    eventually("the waiter is asleep", Duration::from_secs(5), async || {
        log.text()
            .lines()
            .any(|l| l.contains("lock=\"handed-drop\" ") && l.contains("lock still held"))
    })
    .await;
    // The release hands the lock to the waiter in Redis; the waiter's task is dropped
    // before it can take it (or, if it already has, its guard is dropped unreleased).
    holder.release().await.unwrap();
    waiting.abort();
    if let Ok(Ok(guard)) = waiting.await {
        drop(guard);
    }
    c.flush().await;
    for key in ["", ":queue", ":waiters", ":grants", ":holder"] {
        assert!(
            !r.exists(&format!("fencelock:{{handed-drop}}{key}")),
            "{key} left"
        );
    }
    lock()
        .try_acquire()
        .await
        .expect("free at once")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_serves_fifty_waiters_in_arrival_order() {
    let r = RedisServer::start();
    let clients = [
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
    ];
    let holder = clients[0]
        .lock("q")
        .fair()
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..50 {
        let lock = clients[i % 3]
            .lock("q")
            .fair()
            .lease(Duration::from_secs(60))
            .renew(false)
            .wait(Duration::from_secs(60));
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let g = lock.acquire().await.unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        // Arrival order is the order of entering the queue.
        eventually("the waiter queued", Duration::from_secs(5), async || {
            llen(&r, "fencelock:{q}:queue") == i as i64 + 1
        })
        .await;
    }
    // A newcomer cannot jump the queue, not even when the lock is free.
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..50).collect::<Vec<_>>());
}

#[tokio::test]
async fn fair_mode_try_does_not_barge_ahead_of_waiters() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let holder = c.lock("b").fair().try_acquire().await.unwrap();
    // A waiter that is slow to react: its task runs only when we yield.
    let waiter = tokio::spawn(c.lock("b").fair().wait(Duration::from_secs(10)).acquire());
    eventually("queued", Duration::from_secs(5), async || {
        llen(&r, "fencelock:{b}:queue") == 1
    })
    .await;
    r.cmd(&["DEL", "fencelock:{b}"]); // the lock is free, the waiter is first in line
    match c.lock("b").fair().try_acquire().await {
        Err(Error::Held {
            blocked_by: Blocker::Queue,
            ..
        }) => {}
        Ok(_) => panic!("a newcomer took the lock ahead of the queue"),
        Err(e) => panic!("unexpected {e:?}"),
    }
    let g = waiter.await.unwrap().unwrap();
    g.release().await.unwrap();
    drop(holder);
}

#[tokio::test]
async fn a_crashed_head_waiter_delays_the_queue_by_at_most_its_timeout() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let timeout = Duration::from_millis(600);
    let holder = c
        .lock("h")
        .fair()
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let mut head = helper(&r, "h", "fair-wait", timeout.as_millis() as u64);
    eventually(
        "the other process queued first",
        Duration::from_secs(10),
        async || llen(&r, "fencelock:{h}:queue") == 1,
    )
    .await;
    let second = tokio::spawn(
        c.lock("h")
            .waiter_timeout(timeout)
            .wait(Duration::from_secs(30))
            .acquire(),
    );
    eventually("we queued second", Duration::from_secs(5), async || {
        llen(&r, "fencelock:{h}:queue") == 2
    })
    .await;
    head.kill().unwrap();
    head.wait().unwrap();
    let crashed = Instant::now();
    holder.release().await.unwrap(); // wakes the dead head, which cannot answer
    let g = second
        .await
        .unwrap()
        .expect("the second waiter gets its turn");
    let stall = crashed.elapsed();
    let bound = timeout + timeout / 3;
    assert!(
        stall <= bound + Duration::from_millis(300),
        "stalled {stall:?}, bound {bound:?}"
    );
    g.release().await.unwrap();
}

#[tokio::test]
async fn deleting_a_fair_lock_by_hand_does_not_stall_the_queue() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let timeout = Duration::from_millis(600);
    let holder = c
        .lock("del")
        .fair()
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(
        c.lock("del")
            .waiter_timeout(timeout)
            .wait(Duration::from_secs(30))
            .acquire(),
    );
    eventually("queued", Duration::from_secs(5), async || {
        llen(&r, "fencelock:{del}:queue") == 1
    })
    .await;
    let deleted = Instant::now();
    r.cmd(&["DEL", "fencelock:{del}"]); // no release message is published
    let g = waiter.await.unwrap().unwrap();
    assert!(
        deleted.elapsed() <= timeout / 3 + Duration::from_millis(300),
        "{:?}",
        deleted.elapsed()
    );
    g.release().await.unwrap();
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscription_is_restored_and_wakes_waiters_again() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // A long lease: if notifications were not restored, waiters would sit out 10 s.
    let holder = c
        .lock("re")
        .lease(Duration::from_secs(10))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for _ in 0..20 {
        let lock = c.lock("re").wait(Duration::from_secs(30));
        waiters.push(tokio::spawn(async move {
            lock.acquire().await.unwrap().release().await.unwrap();
        }));
    }
    let channel = "fencelock:{re}:released";
    // Registered in the client, and subscribed on the server (the client counts a
    // waiter before its SUBSCRIBE has gone through): there is a subscription to kill.
    eventually(
        "20 waiters subscribed",
        Duration::from_secs(5),
        async || c.stats().waiters == 20 && numsub(&r, channel) > 0,
    )
    .await;
    assert_eq!(
        r.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).as_int(),
        Some(1)
    );
    eventually("subscribed again", Duration::from_secs(5), async || {
        numsub(&r, channel) == 1
    })
    .await;
    let released = Instant::now();
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    let elapsed = released.elapsed();
    assert!(
        elapsed < Duration::from_secs(5),
        "woken by messages, not by the 10 s lease: {elapsed:?}"
    );
}

#[tokio::test]
async fn a_busy_lock_defers_the_work_to_the_delay_queue() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let queue = c.delay_queue("audits").unwrap();
    // Free: acquired at once, nothing queued.
    match c
        .lock("order:9")
        .acquire_or_defer(&queue, b"audit 9", Duration::ZERO)
        .await
        .unwrap()
    {
        fencelock::Acquisition::Acquired(g) => {
            // Busy now: the same request is deferred instead of failing or blocking.
            let deferred = c
                .lock("order:9")
                .acquire_or_defer(&queue, b"audit 9", Duration::ZERO)
                .await
                .unwrap();
            let fencelock::Acquisition::Deferred(id) = deferred else {
                panic!("a held lock was acquired twice");
            };
            g.release().await.unwrap();
            let item = queue
                .take(Duration::from_secs(5))
                .await
                .unwrap()
                .expect("the deferred item");
            assert_eq!(item.id(), id);
            assert_eq!(item.payload(), b"audit 9");
            assert!(item.ack().await.unwrap());
        }
        fencelock::Acquisition::Deferred(_) => panic!("a free lock was deferred"),
    }
}

/// The connections the server has open (`CLIENT LIST`), by their last command
/// (`cmd=...`), without the one asking.
fn connections_by_last_command(r: &RedisServer) -> Vec<String> {
    let list = r.cmd(&["CLIENT", "LIST"]);
    list.as_str()
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("cmd=")))
        .filter(|cmd| *cmd != "client|list")
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn dropped_clients_that_waited_close_their_pubsub_connections() {
    let r = RedisServer::start();
    let holder = Client::connect(&r.url()).await.unwrap();
    let _held = holder.lock("busy").try_acquire().await.unwrap();
    let before = connections_by_last_command(&r);
    let mut clients = Vec::new();
    for _ in 0..5 {
        let c = Client::connect(&r.url()).await.unwrap();
        let err = c
            .lock("busy")
            .wait(Duration::from_millis(50))
            .acquire()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Held { .. }), "{err:?}");
        clients.push(c);
    }
    eventually(
        "each waiter unsubscribed",
        Duration::from_secs(5),
        async || {
            let now = connections_by_last_command(&r);
            now.iter().filter(|c| *c == "unsubscribe").count() == 5
        },
    )
    .await;
    drop(clients);
    // Counted, not compared command by command: the holder's own connection goes on
    // (its memory-policy INFO after the acquire, a renewal), and a renewal is 10 s away.
    eventually(
        "every dropped client closed its connections",
        Duration::from_secs(5),
        async || connections_by_last_command(&r).len() == before.len(),
    )
    .await;
}

#[tokio::test]
async fn the_queue_keys_of_crashed_waiters_expire_by_themselves() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let timeout = Duration::from_millis(300);
    let _holder = c
        .lock("q")
        .fair()
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let mut waiter = helper(&r, "q", "fair-wait", timeout.as_millis() as u64);
    eventually(
        "the other process queued",
        Duration::from_secs(10),
        async || llen(&r, "fencelock:{q}:queue") == 1,
    )
    .await;
    let ttl = r.pttl("fencelock:{q}:queue");
    assert!(
        (1..=2 * 300).contains(&ttl),
        "the queue expires with its waiters' heartbeats: PTTL {ttl}"
    );
    waiter.kill().unwrap();
    waiter.wait().unwrap();
    // Nobody calls the fair scripts on this name again: the keys go by themselves,
    // within two waiter timeouts of the last heartbeat.
    eventually(
        "the queue keys expired",
        Duration::from_secs(2),
        async || !r.exists("fencelock:{q}:queue") && !r.exists("fencelock:{q}:waiters"),
    )
    .await;
}

/// A client holding `name` for 60 s, not renewed (no waiter's lease-bound timer runs
/// out in a test; no renewal is counted among its script calls), its scripts loaded.
async fn held_for_a_minute(r: &RedisServer, name: &str) -> (Client, fencelock::LockGuard) {
    let c = Client::connect(&r.url()).await.unwrap();
    common::load_scripts(&c, "warm-up").await;
    let held = c
        .lock(name)
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    (c, held)
}

/// A waiting acquire of `name` on its own task, which reports on `done` when it got the
/// lock, then holds it until told on the returned sender to release it.
fn waiter(
    c: &Client,
    name: &str,
    done: tokio::sync::mpsc::UnboundedSender<usize>,
    id: usize,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let lock = c
        .lock(name)
        .lease(Duration::from_secs(60))
        .renew(false)
        .wait(Duration::from_secs(30));
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let guard = lock.acquire().await.unwrap();
        done.send(id).unwrap();
        let _ = released.await;
        guard.release().await.unwrap();
    });
    (task, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiting_client_by_name_not_every_client() {
    let r = RedisServer::start();
    let holder_client = Client::connect(&r.url()).await.unwrap();
    common::load_scripts(&holder_client, "warm-up").await;
    // A 60 s lease, not renewed: no waiter's lease-bound timer runs out during the test,
    // and every script call counted is an attempt or a release.
    let holder = holder_client
        .lock("herd")
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Client::connect(&r.url()).await.unwrap());
    }
    let (done, mut got) = tokio::sync::mpsc::unbounded_channel();
    let before_waiters = r.script_calls();
    let mut releases = Vec::new();
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let (task, release) = waiter(c, "herd", done.clone(), i);
        tasks.push(task);
        releases.push(Some(release));
    }
    // Each waiter's two refused attempts (before and after subscribing); the second
    // listed its client.
    eventually("3 clients listed", Duration::from_secs(5), async || {
        listed(&r, "herd").len() == 3 && r.script_calls() == before_waiters + 6
    })
    .await;

    let before = r.script_calls();
    holder.release().await.unwrap();
    let first = got.recv().await.unwrap();
    // The release and one attempt: the client named was woken, the other two were not
    // (waking every client would make it 4).
    assert_eq!(r.script_calls(), before + 2, "one attempt for the release");
    assert_eq!(
        listed(&r, "herd").len(),
        2,
        "the client woken left the list"
    );
    assert_eq!(clients[(first + 1) % 3].stats().waiters, 1);
    assert_eq!(clients[(first + 2) % 3].stats().waiters, 1);

    // Each release hands the lock to the next client the same way: one attempt each.
    let before = r.script_calls();
    releases[first].take().unwrap().send(()).unwrap();
    let second = got.recv().await.unwrap();
    releases[second].take().unwrap().send(()).unwrap();
    let third = got.recv().await.unwrap();
    releases[third].take().unwrap().send(()).unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    // Three releases and two attempts.
    assert_eq!(r.script_calls(), before + 5);
    assert!(listed(&r, "herd").is_empty());
    assert!(
        !r.exists("fencelock:{herd}:wakes"),
        "an empty list leaves no key"
    );
}

/// Two clients waiting for `name`, held by a third for 60 s (not renewed), the first
/// listed before the second. The first client's waiter is a future that only its caller
/// polls (here, until its client was listed): a task that is woken but does not run.
struct TwoListed {
    holder_client: Client,
    holder: fencelock::LockGuard,
    first: std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<fencelock::LockGuard, Error>> + Send>,
    >,
    first_tag: String,
    second: tokio::task::JoinHandle<fencelock::LockGuard>,
    second_tag: String,
    _clients: [Client; 2],
}

async fn two_listed(r: &RedisServer, name: &str) -> TwoListed {
    let (holder_client, holder) = held_for_a_minute(r, name).await;
    let clients = [
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
    ];
    let waiting = |c: &Client| {
        c.lock(name)
            .lease(Duration::from_secs(60))
            .renew(false)
            .wait(Duration::from_secs(30))
    };
    let first_lock = waiting(&clients[0]);
    let mut first: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> =
        Box::pin(async move { first_lock.acquire().await });
    tokio::select! {
        result = &mut first => panic!("acquired a held lock: {result:?}"),
        () = eventually("the first client listed", Duration::from_secs(5), async || {
            listed(r, name).len() == 1
        }) => {}
    }
    let first_tag = listed(r, name).remove(0);
    // The server's clock moves on, so that the second client is listed after the first
    // (a tie would go by tag).
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second_lock = waiting(&clients[1]);
    let second = tokio::spawn(async move { second_lock.acquire().await.unwrap() });
    eventually("both clients listed", Duration::from_secs(5), async || {
        listed(r, name).len() == 2
    })
    .await;
    let order = listed(r, name);
    assert_eq!(order[0], first_tag, "the first client first");
    TwoListed {
        holder_client,
        holder,
        first,
        first_tag,
        second,
        second_tag: order[1].clone(),
        _clients: clients,
    }
}

#[tokio::test]
async fn a_client_woken_by_name_whose_waiter_was_cancelled_hands_the_wake_on() {
    let r = RedisServer::start();
    let TwoListed {
        holder,
        first,
        second,
        ..
    } = two_listed(&r, "baton").await;

    let before = r.script_calls();
    holder.release().await.unwrap();
    eventually(
        "the first client taken off the list",
        Duration::from_secs(5),
        async || listed(&r, "baton").len() == 1,
    )
    .await;
    assert_eq!(
        r.script_calls(),
        before + 1,
        "the release only: the first client's waiter was woken and did not run, the second was not woken"
    );
    assert!(!r.exists("fencelock:{baton}"), "the lock is free");

    drop(first);
    // Asleep, it would wait out the 60 s lease.
    let guard = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second client got the wake the first one handed on")
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_release_skips_a_listed_client_that_was_killed() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    common::load_scripts(&c, "warm-up").await;
    let holder = c
        .lock("n")
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    // Another process waits, listed first; then it is SIGKILLed (its connections go).
    let mut dead = helper(&r, "n", "wait", 0);
    eventually(
        "the other process listed",
        Duration::from_secs(10),
        async || listed(&r, "n").len() == 1,
    )
    .await;
    let dead_tag = listed(&r, "n").remove(0);
    let waiter = Client::connect(&r.url()).await.unwrap();
    let lock = waiter
        .lock("n")
        .lease(Duration::from_secs(60))
        .renew(false)
        .wait(Duration::from_secs(30));
    let waiting = tokio::spawn(async move { lock.acquire().await.unwrap() });
    eventually("both listed", Duration::from_secs(5), async || {
        listed(&r, "n").len() == 2
    })
    .await;
    dead.kill().unwrap();
    eventually(
        "the killed process's subscriptions gone",
        Duration::from_secs(10),
        async || {
            let own = r.cmd(&["PUBSUB", "CHANNELS", "fencelock:{n}:released:*"]);
            own.as_array().is_some_and(|a| a.len() == 1)
        },
    )
    .await;
    assert_eq!(
        listed(&r, "n")[0],
        dead_tag,
        "the killed process is still listed, first"
    );

    let released = Instant::now();
    holder.release().await.unwrap();
    // Named, it would swallow the wake, and the live waiter would sleep out the 60 s
    // lease; the release finds nobody listening for it and wakes the next.
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the live waiter was woken")
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(5));
    assert!(listed(&r, "n").is_empty());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_owner_waiting_behind_a_plain_holder_is_woken_with_everyone() {
    let r = RedisServer::start();
    let (_holder_client, holder) = held_for_a_minute(&r, "mixed").await;
    // Two plain waiters in two clients, listed; each holds the lock until told.
    let plain = [
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
    ];
    let (done, mut got) = tokio::sync::mpsc::unbounded_channel();
    let mut releases = Vec::new();
    for (i, c) in plain.iter().enumerate() {
        releases.push(Some(waiter(c, "mixed", done.clone(), i).1));
    }
    // A reentrant owner waits too: a plain holder's refusal lists it as `*`.
    let owner_client = Client::connect(&r.url()).await.unwrap();
    let owner_lock = owner_client
        .lock("mixed")
        .reentrant("job-7")
        .lease(Duration::from_secs(60))
        .renew(false)
        .wait(Duration::from_secs(30));
    let mut owner = tokio::spawn(async move { owner_lock.acquire().await.unwrap() });
    eventually("every waiter listed", Duration::from_secs(5), async || {
        let mut l = listed(&r, "mixed");
        l.sort();
        l.len() == 3 && l[0] == "*"
    })
    .await;

    let before = r.script_calls();
    holder.release().await.unwrap();
    // Every client tried: the owner too, not only the plain client listed first (which
    // would hold the lock, then the next, while the owner slept out the 60 s lease).
    eventually(
        "three attempts after the release",
        Duration::from_secs(5),
        async || r.script_calls() >= before + 4,
    )
    .await;
    // Whoever won, the others get the lock in turn.
    let (mut owner_done, mut plain_done) = (false, 0);
    let all = async {
        while !owner_done || plain_done < 2 {
            tokio::select! {
                Some(i) = got.recv(), if plain_done < 2 => {
                    releases[i].take().unwrap().send(()).unwrap();
                    plain_done += 1;
                }
                guard = &mut owner, if !owner_done => {
                    guard.unwrap().release().await.unwrap();
                    owner_done = true;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .expect("every waiter got the lock in turn");
}

#[tokio::test]
async fn a_client_woken_by_name_that_another_caller_beat_keeps_the_head_of_the_list() {
    let r = RedisServer::start();
    let TwoListed {
        holder_client,
        holder,
        mut first,
        first_tag: a_tag,
        second,
        second_tag: b_tag,
        ..
    } = two_listed(&r, "head").await;

    holder.release().await.unwrap();
    eventually(
        "A woken and taken off",
        Duration::from_secs(5),
        async || listed(&r, "head") == [b_tag.clone()],
    )
    .await;
    // Another caller takes the free lock before A's waiter runs.
    let barger = holder_client
        .lock("head")
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    // A's waiter runs: refused, its client goes back to the head of the list, not
    // behind B (who would then be woken next, and A again only after everyone).
    tokio::select! {
        result = &mut first => panic!("acquired a held lock: {result:?}"),
        () = eventually("A listed again, first", Duration::from_secs(5), async || {
            listed(&r, "head") == [a_tag.clone(), b_tag.clone()]
        }) => {}
    }
    barger.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), &mut first)
        .await
        .expect("A woken again (asleep, it would wait out the 60 s lease)")
        .unwrap();
    assert!(!second.is_finished(), "B still waits");
    guard.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("B woken next")
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_client_beaten_to_the_lock_alone_on_the_list_leaves_a_list_that_expires() {
    let r = RedisServer::start();
    let holder_client = Client::connect(&r.url()).await.unwrap();
    common::load_scripts(&holder_client, "warm-up").await;
    let lock = |c: &Client| c.lock("alone").lease(Duration::from_secs(60)).renew(false);
    let holder = lock(&holder_client).try_acquire().await.unwrap();
    let a = Client::connect(&r.url()).await.unwrap();
    let a_lock = lock(&a).wait(Duration::from_secs(30));
    let mut waiting = Box::pin(a_lock.acquire());
    tokio::select! {
        result = &mut waiting => panic!("acquired a held lock: {result:?}"),
        () = eventually("listed", Duration::from_secs(5), async || {
            listed(&r, "alone").len() == 1
        }) => {}
    }
    holder.release().await.unwrap();
    eventually("woken and taken off", Duration::from_secs(5), async || {
        !r.exists("fencelock:{alone}:wakes")
    })
    .await;
    let barger = lock(&holder_client).try_acquire().await.unwrap();
    // Its waiter runs: refused, the client goes back to the head of an empty list.
    tokio::select! {
        result = &mut waiting => panic!("acquired a held lock: {result:?}"),
        () = eventually("listed again", Duration::from_secs(5), async || {
            listed(&r, "alone").len() == 1
        }) => {}
    }
    let left = r
        .cmd(&["PTTL", "fencelock:{alone}:wakes"])
        .as_int()
        .unwrap();
    assert!(
        left > 0 && left <= 61_000,
        "the list lasts as long as the barger's lease and a second: {left} ms"
    );
    barger.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("woken by the barger's release")
        .unwrap();
    guard.release().await.unwrap();
}

/// How many `PUBLISH`es the server ran (from scripts too), from `INFO commandstats`.
fn publishes(r: &RedisServer) -> u64 {
    r.info_field("commandstats", "cmdstat_publish")
        .map_or(0, |stats| {
            let calls = stats.strip_prefix("calls=").expect("calls= first");
            calls.split(',').next().unwrap().parse().unwrap()
        })
}

#[tokio::test]
async fn an_uncontended_release_publishes_nothing() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let before = publishes(&r);
    for _ in 0..3 {
        let g = c.lock("quiet").try_acquire().await.unwrap();
        g.release().await.unwrap();
        let permit = c.semaphore("pool", 2).try_acquire().await.unwrap();
        permit.release().await.unwrap();
    }
    // Grown with nobody waiting: no permit's release to announce either.
    c.set_permits("pool", 3).await.unwrap();
    assert_eq!(publishes(&r), before, "nobody waits: nothing to announce");

    // With a waiter, the release is announced (to its client, by name).
    let holder = c.lock("quiet").try_acquire().await.unwrap();
    let other = Client::connect(&r.url()).await.unwrap();
    let waiting = tokio::spawn(other.lock("quiet").wait(Duration::from_secs(30)).acquire());
    eventually("the waiter listed", Duration::from_secs(5), async || {
        listed(&r, "quiet").len() == 1
    })
    .await;
    holder.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .unwrap();
    assert_eq!(publishes(&r), before + 1, "one wake, by name");
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_fair_waiter_behind_a_plain_holder_is_woken_by_its_release() {
    let r = RedisServer::start();
    // A plain holder of the name for 60 s, and a fair waiter of the same name that
    // calls again only every 20 s (a third of its waiter timeout) by itself.
    let (_holder_client, holder) = held_for_a_minute(&r, "kinds").await;
    let c = Client::connect(&r.url()).await.unwrap();
    let lock = c
        .lock("kinds")
        .fair()
        .waiter_timeout(Duration::from_secs(60))
        .lease(Duration::from_secs(60))
        .renew(false)
        .wait(Duration::from_secs(30));
    let waiting = tokio::spawn(lock.acquire());
    // The plain holder's refusal listed it as '*'.
    eventually(
        "the fair waiter queued and listed",
        Duration::from_secs(5),
        async || llen(&r, "fencelock:{kinds}:queue") == 1 && listed(&r, "kinds") == ["*"],
    )
    .await;
    holder.release().await.unwrap();
    // Not listed, it would hear nothing and sleep 20 s.
    let g = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the fair waiter was woken by the plain release")
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
}
