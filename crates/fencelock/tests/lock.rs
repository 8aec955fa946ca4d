//! The public API against a real redis-server: acquire, wait, extend, release, drop,
//! cancellation, and the typed error for every bad input.

use std::time::{Duration, Instant};

use fencelock::{Client, Error, LockGuard, LossCause, Retry, UnavailableReason};
use testkit::{Fault, FaultProxy, RedisServer};

mod common;
use common::{commands_run, count_commands, eventually, script_sizes};

async fn client(r: &RedisServer) -> Client {
    Client::connect(&r.url()).await.expect("connect")
}

#[tokio::test]
async fn acquire_and_release_round_trip() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let guard = c.lock("stock:42").try_acquire().await.unwrap();
    assert_eq!(guard.name(), "stock:42");
    assert_eq!(
        r.get("fencelock:{stock:42}").as_deref(),
        Some(guard.holder_token().as_str()),
        "the key holds this guard's owner token"
    );
    assert_eq!(
        r.get("fencelock:{stock:42}:fence").as_deref(),
        Some(guard.fencing_token().to_string().as_str())
    );
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    assert!(!r.exists("fencelock:{stock:42}"), "released");

    let guard = c.lock("stock:42").try_acquire().await.unwrap();
    assert!(
        guard.fencing_token() > first,
        "tokens increase across holders"
    );
    assert_ne!(guard.holder_token().as_str(), "", "owner token present");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn custom_prefix_and_empty_prefix_shape_the_keys() {
    let r = RedisServer::start();
    let c = Client::builder(r.url())
        .prefix("app")
        .connect()
        .await
        .unwrap();
    let g = c.lock("a").try_acquire().await.unwrap();
    assert!(r.exists("app:{a}"));
    g.release().await.unwrap();
    let c = Client::builder(r.url()).prefix("").connect().await.unwrap();
    let g = c.lock("a").try_acquire().await.unwrap();
    assert!(r.exists("{a}"));
    assert!(r.exists("{a}:fence"));
    g.release().await.unwrap();
}

#[tokio::test]
async fn held_lock_fails_fast_with_the_remaining_ttl() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let holder = c
        .lock("h")
        .lease(Duration::from_secs(20))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let err = c.lock("h").try_acquire().await.unwrap_err();
    match &err {
        Error::Held {
            name, blocked_by, ..
        } => {
            assert_eq!(name, "h");
            let rem = blocked_by
                .remaining()
                .expect("the holder's key has an expiry");
            assert!(
                rem > Duration::from_secs(18) && rem <= Duration::from_secs(20),
                "{rem:?}"
            );
        }
        other => panic!("expected Held, got {other:?}"),
    }
    assert!(err.to_string().contains("another owner holds it"), "{err}");
    // A zero wait through acquire() is the same single attempt.
    assert!(matches!(
        c.lock("h").acquire().await,
        Err(Error::Held { .. })
    ));
    holder.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_gets_the_lock_once_the_holder_releases() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let holder = c.lock("w").try_acquire().await.unwrap();
    let holder_fence = holder.fencing_token();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            tx.send(()).unwrap();
            c.lock("w").wait(Duration::from_secs(10)).acquire().await
        })
    };
    rx.await.unwrap();
    holder.release().await.unwrap();
    let guard = waiter
        .await
        .unwrap()
        .expect("the waiter acquires after the release");
    assert!(guard.fencing_token() > holder_fence);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_gets_the_lock_when_the_holders_lease_expires() {
    let r = RedisServer::start();
    let c = client(&r).await;
    // A holder that never releases (a crashed process): only its TTL frees the lock.
    r.cmd(&["SET", "fencelock:{crash}", "crashed-holder", "PX", "300"]);
    let started = Instant::now();
    let guard = c
        .lock("crash")
        .wait(Duration::from_secs(10))
        .retry(Retry::backoff(
            Duration::from_millis(5),
            Duration::from_secs(5),
        ))
        .acquire()
        .await
        .unwrap();
    // The wait is bounded by the holder's remaining TTL, not by the 5 s backoff cap.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_wait_that_runs_out_reports_how_long_it_waited() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let holder = c.lock("t").try_acquire().await.unwrap();
    let started = Instant::now();
    let err = c
        .lock("t")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    match err {
        Error::Held {
            waited, blocked_by, ..
        } => {
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
            assert!(blocked_by.remaining().is_some());
        }
        other => panic!("expected Held after the wait, got {other:?}"),
    }
    assert!(elapsed >= Duration::from_millis(300));
    assert_eq!(
        r.get("fencelock:{t}").as_deref(),
        Some(holder.holder_token().as_str()),
        "the holder's key is untouched"
    );
    holder.release().await.unwrap();
}

#[tokio::test]
async fn valid_until_is_measured_from_before_the_acquire_was_sent() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let ttl = Duration::from_secs(10);
    let before = Instant::now();
    let guard = c
        .lock("v")
        .lease(ttl)
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let after = Instant::now();
    let drift = ttl / 100 + Duration::from_millis(2);
    assert!(guard.valid_until() >= before + ttl - drift);
    assert!(guard.valid_until() <= after + ttl - drift);
    assert!(guard.remaining() <= ttl);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn extend_prolongs_only_a_lease_still_held() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let mut g = c
        .lock("e")
        .lease(Duration::from_secs(2))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let before = g.valid_until();
    g.extend(Duration::from_secs(30)).await.unwrap();
    assert!(g.valid_until() > before);
    let pttl = r.pttl("fencelock:{e}");
    assert!(pttl > 29_000, "PTTL {pttl}");
    assert!(matches!(
        g.extend(Duration::ZERO).await,
        Err(Error::InvalidArgument { what: "lease", .. })
    ));

    // Deleted from outside: the lease is lost and extend does not re-create the key.
    r.cmd(&["DEL", "fencelock:{e}"]);
    let until = g.valid_until();
    match g.extend(Duration::from_secs(30)).await {
        Err(Error::LeaseLost {
            cause: LossCause::Expired,
            ..
        }) => {}
        other => panic!("expected LeaseLost(Expired), got {other:?}"),
    }
    assert_eq!(
        g.valid_until(),
        until,
        "valid_until only moves on a confirmed extend"
    );
    assert!(!r.exists("fencelock:{e}"));
    drop(g);

    // Taken by another owner: extend reports it and leaves their key alone.
    let mut g = c.lock("e").try_acquire().await.unwrap();
    r.cmd(&["SET", "fencelock:{e}", "someone-else", "PX", "5000"]);
    match g.extend(Duration::from_secs(30)).await {
        Err(Error::LeaseLost {
            cause: LossCause::TakenByOther,
            ..
        }) => {}
        other => panic!("expected LeaseLost(TakenByOther), got {other:?}"),
    }
    assert_eq!(r.get("fencelock:{e}").as_deref(), Some("someone-else"));
    assert!(r.pttl("fencelock:{e}") <= 5_000);
}

#[tokio::test]
async fn release_after_the_lease_ended_says_so_and_deletes_nothing() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let g = c
        .lock("x")
        .lease(Duration::from_millis(50))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let key = "fencelock:{x}";
    eventually("the lease expires", Duration::from_secs(5), async || {
        !r.exists(key)
    })
    .await;
    match g.release().await {
        Err(Error::LeaseLost {
            cause: LossCause::Expired,
            ..
        }) => {}
        other => panic!("expected LeaseLost(Expired), got {other:?}"),
    }

    let g = c
        .lock("x")
        .lease(Duration::from_millis(50))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    eventually("the lease expires", Duration::from_secs(5), async || {
        !r.exists(key)
    })
    .await;
    let next = c.lock("x").try_acquire().await.unwrap();
    let err = g.release().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseLost {
                cause: LossCause::TakenByOther,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("fencing token"),
        "the message says what to do: {err}"
    );
    assert_eq!(
        r.get(key).as_deref(),
        Some(next.holder_token().as_str()),
        "the next holder's lock survives the late release"
    );
    next.release().await.unwrap();
}

#[tokio::test]
async fn dropping_a_guard_releases_in_the_background() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let g = c
        .lock("d")
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    assert!(r.exists("fencelock:{d}"));
    drop(g);
    c.flush().await;
    assert!(
        !r.exists("fencelock:{d}"),
        "released long before the 60 s TTL"
    );
}

#[test]
fn dropping_a_guard_outside_a_runtime_does_not_panic() {
    let r = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let g = rt.block_on(async {
        let c = Client::connect(&r.url()).await.unwrap();
        c.lock("n")
            .lease(Duration::from_millis(200))
            .renew(false)
            .try_acquire()
            .await
            .unwrap()
    });
    drop(rt);
    drop(g); // no runtime: nothing to spawn on; the key expires by its TTL
    testkit::eventually("the key expired", Duration::from_secs(5), || {
        !r.exists("fencelock:{n}")
    });
}

#[tokio::test]
async fn a_cancelled_wait_leaves_nothing_behind() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let holder = c.lock("c").try_acquire().await.unwrap();
    let keys_before = r.cmd(&["DBSIZE"]).as_int();
    let mut waiting = Box::pin(c.lock("c").wait_forever().acquire());
    // Cancelled once it waits.
    tokio::select! {
        result = &mut waiting => panic!("still waiting when cancelled: {result:?}"),
        () = eventually(
            "the waiter waits",
            Duration::from_secs(5),
            async || c.stats().waiters == 1,
        ) => {}
    }
    drop(waiting);
    // Its client leaves the wake list in the background.
    c.flush().await;
    assert_eq!(
        r.cmd(&["DBSIZE"]).as_int(),
        keys_before,
        "no key added by the waiter"
    );
    assert_eq!(
        r.get("fencelock:{c}").as_deref(),
        Some(holder.holder_token().as_str())
    );
    holder.release().await.unwrap();
}

/// An acquire cancelled while its request sits unanswered (Redis paused) may still be
/// executed when Redis resumes. The abandoned token must then be released in the
/// background rather than block the lock for its whole TTL.
#[tokio::test]
async fn an_acquire_cancelled_in_flight_releases_what_it_may_have_written() {
    common::traces();
    let mut r = RedisServer::start();
    let c = client(&r).await;
    c.lock("f")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap(); // scripts loaded
    common::memory_policy_read(&r.addr()).await;
    r.cmd(&["CONFIG", "RESETSTAT"]);
    r.pause();
    let mut attempt = Box::pin(
        c.lock("f")
            .lease(Duration::from_secs(60))
            .renew(false)
            .try_acquire(),
    );
    // Cancelled once its request has reached the stopped server, where it waits unread.
    tokio::select! {
        result = &mut attempt => panic!("no reply while Redis is paused: {result:?}"),
        () = eventually(
            "the acquire reached the stopped server",
            Duration::from_secs(5),
            async || r.unread_request_bytes() > 0,
        ) => {}
    }
    drop(attempt);
    r.resume();
    // The server runs the acquire, then the release sent after it.
    eventually(
        "the orphaned key is released",
        Duration::from_secs(5),
        async || r.script_calls() >= 2 && !r.exists("fencelock:{f}"),
    )
    .await;
    // And the lock is free for others well before the 60 s TTL.
    c.lock("f")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn an_acquire_that_times_out_is_unavailable_and_cleans_up() {
    let mut r = RedisServer::start();
    let c = Client::builder(r.url())
        .response_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    common::load_scripts(&c, "p").await;
    r.pause();
    let started = Instant::now();
    let err = c
        .lock("p")
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    r.resume();
    match &err {
        Error::Unavailable { node, reason, .. } => {
            assert_eq!(node, &r.addr());
            assert_eq!(*reason, UnavailableReason::TimedOut);
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        elapsed < Duration::from_secs(3),
        "bounded by the timeouts: {elapsed:?}"
    );
    eventually(
        "the maybe-written key is released",
        Duration::from_secs(5),
        async || !r.exists("fencelock:{p}"),
    )
    .await;
}

/// A server that stops answering while its connection stays open (stopped with
/// SIGSTOP) is not sent acquire after acquire: once several calls in a row got no
/// answer, an acquire fails at once as `Stalled`, unsent, with nothing to take back.
/// When the server answers again, acquires go out again, and what the timed-out
/// attempts may have written was withdrawn (their withdrawals were sent after them).
#[tokio::test]
async fn acquires_are_held_back_from_a_server_that_stopped_answering() {
    common::traces();
    let mut r = RedisServer::start();
    let c = Client::builder(r.url())
        .response_timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    common::load_scripts(&c, "stall").await;
    common::memory_policy_read(&r.addr()).await;
    // It counts the attempts the server ran.
    let last_fence = common::counter_ahead(&r, "stall");
    r.pause();
    let attempt = async || {
        c.lock("stall")
            .lease(Duration::from_secs(60))
            .renew(false)
            .try_acquire()
            .await
            .unwrap_err()
    };
    // Each attempt that times out sends its withdrawal, which times out as well.
    let mut timed_out = 0;
    let err = loop {
        match attempt().await {
            Error::Unavailable {
                reason: UnavailableReason::TimedOut,
                ..
            } => timed_out += 1,
            other => break other,
        }
        assert!(timed_out <= 8, "held back after at most 8 calls unanswered");
    };
    assert!(timed_out >= 2, "a few timeouts are not yet a stall");
    match &err {
        Error::Unavailable { node, reason, .. } => {
            assert_eq!(node, &r.addr());
            assert_eq!(*reason, UnavailableReason::Stalled);
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("it stopped answering") && text.contains("not sent"),
        "{text}"
    );
    for _ in 0..20 {
        let err = attempt().await;
        assert!(
            matches!(
                err,
                Error::Unavailable {
                    reason: UnavailableReason::Stalled,
                    ..
                }
            ),
            "{err:?}"
        );
    }
    r.resume();
    // It runs what was sent before the stall: each timed-out attempt (a grant, the key
    // free again after the withdrawals sent after it), and none of the 21 held back.
    let fence = || {
        r.get("fencelock:{stall}:fence")
            .and_then(|f| f.parse::<u64>().ok())
    };
    eventually(
        "the timed-out attempts ran and were withdrawn",
        Duration::from_secs(5),
        async || fence() >= Some(last_fence + timed_out) && !r.exists("fencelock:{stall}"),
    )
    .await;
    // The server answers: the stall is over, and a waiting acquire gets the lock (and
    // the next token: no attempt held back ran).
    let g = c
        .lock("stall")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("acquires go out again");
    assert_eq!(g.fencing_token().get(), last_fence + timed_out + 1);
    assert_eq!(
        r.get("fencelock:{stall}").as_deref(),
        Some(g.holder_token().as_str())
    );
    g.release().await.unwrap();
    assert!(
        common::traces()
            .text()
            .lines()
            .any(|l| l.contains("stopped answering") && l.contains(&r.addr())),
        "the stall is reported"
    );
}

/// A release lost with its connection (the link reset: a network blip, a restart) fails
/// for the caller, but is kept and sent again once the server answers, so the lock is
/// free well before its lease would end; a guard dropped meanwhile is released the same
/// way. The connections really are reset, by a TCP proxy.
#[tokio::test]
async fn a_release_lost_with_its_connection_is_sent_again_once_the_server_answers() {
    let r = RedisServer::start();
    let proxy = FaultProxy::start(&r.addr());
    let c = Client::builder(proxy.url()).connect().await.unwrap();
    let lock = |name| c.lock(name).lease(Duration::from_secs(60)).renew(false);
    let released = lock("reset").try_acquire().await.unwrap();
    let dropped = lock("dropped").try_acquire().await.unwrap();
    proxy.set(Fault::Reset);
    let err = released.release().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unavailable {
                reason: UnavailableReason::Io | UnavailableReason::Refused,
                ..
            }
        ),
        "{err:?}"
    );
    drop(dropped);
    c.flush().await;
    assert!(r.exists("fencelock:{reset}") && r.exists("fencelock:{dropped}"));
    proxy.set(Fault::Pass);
    // Any call that gets an answer sends them again (the first after the reset may still
    // meet the connection's failed reconnect).
    eventually(
        "a call gets an answer",
        Duration::from_secs(5),
        async || match lock("other").try_acquire().await {
            Ok(guard) => guard.release().await.is_ok(),
            Err(_) => false,
        },
    )
    .await;
    eventually(
        "both lost releases are sent again",
        Duration::from_secs(5),
        async || !r.exists("fencelock:{reset}") && !r.exists("fencelock:{dropped}"),
    )
    .await;
}

/// A grant whose reply comes back after its lease ran out is no grant: the acquire
/// reports a late grant instead of a guard whose lease is already over (another client
/// may hold the lock by then), with advice for a slow link, not for a server that is
/// down. Replies are delayed by a real TCP proxy.
#[tokio::test]
async fn a_grant_that_arrives_after_its_lease_is_refused() {
    let r = RedisServer::start();
    let proxy = FaultProxy::start(&r.addr());
    let c = Client::builder(proxy.url())
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    // 150 ms each way: a round trip of at least 300 ms.
    proxy.set(Fault::Delay {
        base: Duration::from_millis(150),
        jitter: Duration::ZERO,
    });
    let err = c
        .lock("slow")
        .lease(Duration::from_millis(200))
        .renew(false)
        .try_acquire()
        .await
        .unwrap_err();
    match &err {
        Error::Unavailable { reason, detail, .. } => {
            assert_eq!(*reason, UnavailableReason::LateGrant);
            assert!(detail.contains("after its 200 ms lease"), "{detail}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("the grant came back too late") && text.contains("use a longer lease"),
        "{text}"
    );
    assert!(!text.contains("check that it is running"), "{text}");
    // A lease longer than the round trip is granted through the same slow link.
    let g = c
        .lock("slow")
        .lease(Duration::from_secs(2))
        .renew(false)
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    assert!(g.remaining() > Duration::from_millis(1000), "{g:?}");
    g.release().await.unwrap();
}

/// A waiting acquire whose first reply is lost (Redis paused past the response timeout)
/// retries with the same owner token; when Redis resumes, the queued first attempt takes
/// the lock and the retry finds its own token: one grant, one fencing token.
#[tokio::test]
async fn a_retried_acquire_whose_reply_was_lost_gets_the_same_grant() {
    common::traces();
    let mut r = RedisServer::start();
    let response_timeout = Duration::from_millis(150);
    let c = Client::builder(r.url())
        .response_timeout(response_timeout)
        .connect()
        .await
        .unwrap();
    // Scripts loaded on this connection first, so that an attempt is one EVALSHA (not
    // SCRIPT LOAD and EVALSHA, which the checks below would take for two attempts); and
    // the client's one memory-policy read of the connection done before the fault.
    common::load_scripts(&c, "warm").await;
    common::memory_policy_read(&r.addr()).await;
    let last_fence = common::counter_ahead(&r, "i");

    r.pause();
    let started = Instant::now();
    let acquiring = tokio::spawn(c.lock("i").wait(Duration::from_secs(20)).acquire());
    // The fault: Redis stays stopped until the first attempt's reply was given up on (the
    // response timeout) and the retry has reached it too, behind the first attempt.
    let within = Duration::from_secs(5);
    eventually(
        "the first attempt reached the stopped server",
        within,
        async || r.unread_request_bytes() > 0,
    )
    .await;
    let first = r.unread_request_bytes();
    eventually("the retry reached the stopped server", within, async || {
        r.unread_request_bytes() > first
    })
    .await;
    assert!(!acquiring.is_finished(), "no grant while Redis is stopped");
    r.resume();
    let guard = acquiring
        .await
        .unwrap()
        .expect("acquired after Redis resumed");
    assert!(
        started.elapsed() >= response_timeout,
        "the first reply was lost"
    );
    assert_eq!(
        guard.fencing_token().get(),
        last_fence + 1,
        "exactly one token minted for the retried acquisition"
    );
    assert_eq!(
        r.get("fencelock:{i}:fence").as_deref(),
        Some((last_fence + 1).to_string().as_str())
    );
    assert_eq!(
        r.get("fencelock:{i}").as_deref(),
        Some(guard.holder_token().as_str())
    );
    guard.release().await.unwrap();
}

// ---- bad input: a typed error each, no panic, no key touched ----

#[tokio::test]
async fn bad_lock_arguments_are_invalid_and_send_nothing() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let cases: Vec<(&str, fencelock::LockBuilder, &str)> = vec![
        ("empty name", c.lock(""), "lock name"),
        ("open brace", c.lock("a{b"), "lock name"),
        ("close brace", c.lock("a}b"), "lock name"),
        (
            "zero TTL",
            c.lock("ok").lease(Duration::ZERO).renew(false),
            "lease",
        ),
        (
            "sub-ms TTL",
            c.lock("ok").lease(Duration::from_micros(500)).renew(false),
            "lease",
        ),
        (
            "TTL above max",
            c.lock("ok")
                .lease(fencelock::limits::MAX_LEASE + Duration::from_millis(1))
                .renew(false),
            "lease",
        ),
        (
            "bad backoff",
            c.lock("ok").retry(Retry::backoff(
                Duration::from_secs(2),
                Duration::from_secs(1),
            )),
            "retry backoff",
        ),
    ];
    for (case, builder, expected) in cases {
        match builder.try_acquire().await {
            Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, expected, "{case}"),
            other => panic!("{case}: expected InvalidArgument, got {other:?}"),
        }
    }
    assert_eq!(r.cmd(&["DBSIZE"]).as_int(), Some(0), "nothing was written");
    // The edges are accepted.
    for ttl in [fencelock::limits::MIN_LEASE, fencelock::limits::MAX_LEASE] {
        c.lock("ok")
            .lease(ttl)
            .renew(false)
            .try_acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn bad_client_settings_are_invalid() {
    for (url, builder) in [
        (
            "prefix",
            Client::builder("redis://127.0.0.1:1").prefix("a{b}"),
        ),
        (
            "timeout",
            Client::builder("redis://127.0.0.1:1").connect_timeout(Duration::ZERO),
        ),
        (
            "renewal batch",
            Client::builder("redis://127.0.0.1:1").renewal_batch(0),
        ),
        (
            "fence counter idle time",
            Client::builder("redis://127.0.0.1:1").fence_counter_idle(Duration::from_millis(999)),
        ),
        (
            "renewal batch",
            Client::builder("redis://127.0.0.1:1")
                .renewal_batch(fencelock::limits::MAX_RENEWAL_BATCH + 1),
        ),
    ] {
        assert!(
            matches!(builder.connect().await, Err(Error::InvalidArgument { .. })),
            "{url}"
        );
    }
}

#[tokio::test]
async fn an_unparsable_url_is_invalid_and_hides_the_password() {
    for url in [
        "not a url",
        "http://127.0.0.1:6379",
        "redis://user:s3cret@:notaport",
    ] {
        match Client::connect(url).await {
            Err(
                e @ Error::InvalidArgument {
                    what: "Redis URL", ..
                },
            ) => {
                assert!(!e.to_string().contains("s3cret"), "password leaked: {e}");
            }
            other => panic!("{url}: expected InvalidArgument, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_url_where_nothing_listens_is_unavailable_naming_the_node() {
    let port = testkit::free_port();
    let started = Instant::now();
    match Client::connect(&format!("redis://127.0.0.1:{port}")).await {
        Err(e @ Error::Unavailable { .. }) => {
            let Error::Unavailable { node, reason, .. } = &e else {
                unreachable!()
            };
            assert_eq!(node, &format!("127.0.0.1:{port}"));
            assert_eq!(*reason, UnavailableReason::Refused);
            assert!(e.to_string().contains(&format!("127.0.0.1:{port}")));
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "fails fast: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_server_that_answers_with_an_error_is_rejected() {
    let r = RedisServer::builder()
        .arg("--requirepass")
        .arg("pw")
        .start();
    // No password: the connection opens, the first command gets NOAUTH.
    let c = Client::connect(&r.url())
        .await
        .expect("connect without AUTH");
    match c.lock("a").try_acquire().await {
        Err(e @ Error::Rejected { .. }) => {
            let Error::Rejected { code, node, .. } = &e else {
                unreachable!()
            };
            assert_eq!(code, "NOAUTH", "{e}");
            assert_eq!(node, &r.addr());
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    // A wrong password is refused at connect time.
    let url = format!("redis://:wrong@{}", r.addr());
    match Client::connect(&url).await {
        Err(Error::Rejected { message, .. }) => assert!(!message.contains("wrong@"), "{message}"),
        other => panic!("expected Rejected, got {other:?}"),
    }
    // The right one works.
    let c = Client::connect(&format!("redis://:pw@{}", r.addr()))
        .await
        .unwrap();
    c.lock("a")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_reported_and_left_alone() {
    let r = RedisServer::start();
    let c = client(&r).await;
    r.cmd(&["HSET", "fencelock:{wt}", "field", "value"]);
    match c.lock("wt").try_acquire().await {
        Err(Error::WrongType {
            key, found, node, ..
        }) => {
            assert_eq!(key, "fencelock:{wt}");
            assert_eq!(found, "hash");
            assert_eq!(node, r.addr());
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
    // Waiting does not turn it into a timeout either.
    assert!(matches!(
        c.lock("wt").wait(Duration::from_secs(5)).acquire().await,
        Err(Error::WrongType { .. })
    ));
    assert_eq!(
        r.cmd(&["HGET", "fencelock:{wt}", "field"]).as_str(),
        Some("value")
    );
    assert!(!r.exists("fencelock:{wt}:fence"));

    r.cmd(&["SET", "fencelock:{wc}:fence", "not-a-number"]);
    assert!(
        matches!(c.lock("wc").try_acquire().await, Err(Error::WrongType { found, .. }) if found == "string")
    );
    assert!(!r.exists("fencelock:{wc}"), "no lock left behind");
}

#[tokio::test]
async fn a_wait_covers_a_server_that_is_down_and_comes_back() {
    let mut r = RedisServer::start();
    let c = Client::builder(r.url()).connect_lazy().await.unwrap();
    r.kill();
    // Down for the whole wait: the error says the node was unreachable, after the wait.
    let started = Instant::now();
    let err = c
        .lock("back")
        .wait(Duration::from_millis(400))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );

    // Back within the wait (a restart): the waiter gets the lock.
    let waiting = tokio::spawn(c.lock("back").wait(Duration::from_secs(10)).acquire());
    tokio::time::sleep(Duration::from_millis(300)).await; // the outage the waiter rides out
    r.restart();
    let guard = waiting
        .await
        .unwrap()
        .expect("acquired once the server is back");
    assert!(r.exists("fencelock:{back}"));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_lazy_client_needs_no_server_to_be_made_and_reports_it_at_the_acquire() {
    let nowhere = format!("redis://127.0.0.1:{}", testkit::free_port());
    let c = Client::builder(&nowhere).connect_lazy().await.unwrap();
    let err = c.lock("x").try_acquire().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    // An eager connect fails at once.
    assert!(matches!(
        Client::connect(&nowhere).await,
        Err(Error::Unavailable { .. })
    ));
}

/// The futures of `try_acquire`, `acquire` and `lost` borrow neither the builder nor the
/// guard: a closure may return them (as `tokio::time::timeout(d, g.lost())`), and they
/// outlive the temporaries they came from.
#[tokio::test]
async fn the_returned_futures_borrow_nothing() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let acquire = |name: &str| c.lock(name).lease(Duration::from_millis(300)).try_acquire();
    let g = acquire("free-futures").await.unwrap();
    let lost_within = |g: &LockGuard| tokio::time::timeout(Duration::from_secs(5), g.lost());
    let lost = lost_within(&g);
    r.cmd(&["DEL", "fencelock:{free-futures}"]);
    assert_eq!(lost.await, Ok(LossCause::Deleted));
    drop(g);
}

/// A server that lost its scripts while the client's connection stayed up (`SCRIPT
/// FLUSH`, a failover to a replica that never ran them) answers `NOSCRIPT`; the client
/// loads the script and runs the call again, once, and the caller sees nothing of it.
#[tokio::test]
async fn scripts_flushed_on_the_server_are_loaded_again() {
    let r = RedisServer::start();
    let c = client(&r).await;
    let lock = c
        .lock("flushed")
        .lease(Duration::from_secs(10))
        .renew(false);
    lock.try_acquire().await.unwrap().release().await.unwrap();
    // Redis 6.2 counts subcommands with their command (`cmdstat_script`).
    let loads = |r: &RedisServer| {
        r.info_field("commandstats", "cmdstat_script|load")
            .or_else(|| r.info_field("commandstats", "cmdstat_script"))
            .and_then(|c| {
                c.strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    r.cmd(&["SCRIPT", "FLUSH"]);
    let before = loads(&r);
    let guard = lock
        .try_acquire()
        .await
        .expect("acquired after SCRIPT FLUSH");
    assert_eq!(
        r.get("fencelock:{flushed}").as_deref(),
        Some(guard.holder_token().as_str())
    );
    guard.release().await.expect("released after SCRIPT FLUSH");
    assert!(!r.exists("fencelock:{flushed}"));
    assert_eq!(
        loads(&r) - before,
        2,
        "acquire.lua and release.lua loaded again"
    );
}

/// Operators watch `INFO errorstats`: the library's normal use, in every mode, must not
/// add to it (a script probing a key with the wrong command would count a WRONGTYPE).
#[tokio::test]
async fn normal_use_counts_no_errors_in_redis() {
    let r = RedisServer::start();
    let c = client(&r).await;
    for (name, fair) in [("e:plain", false), ("e:fair", true)] {
        let lock = || {
            let l = c.lock(name);
            if fair { l.fair() } else { l }
        };
        let mut holder = lock().try_acquire().await.unwrap();
        assert!(matches!(
            lock().try_acquire().await,
            Err(Error::Held { .. })
        ));
        let waiter = tokio::spawn(lock().wait(Duration::from_secs(10)).acquire());
        eventually("the waiter waits", Duration::from_secs(5), async || {
            c.stats().waiters == 1
        })
        .await;
        holder.extend(Duration::from_secs(1)).await.unwrap();
        holder.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
    }
    let outer = c.lock("e:re").reentrant("me").try_acquire().await.unwrap();
    let inner = c.lock("e:re").reentrant("me").try_acquire().await.unwrap();
    assert!(matches!(
        c.lock("e:re").reentrant("other").try_acquire().await,
        Err(Error::Held { .. })
    ));
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    // Each new connection's CLIENT SETINFO (the driver's, unknown before Redis 7.2)
    // counts one ERR; nothing else may count.
    let info = |section: &str| {
        r.cmd(&["INFO", section])
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let field = |text: &str, name: &str| -> i64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    let errors = info("errorstats");
    let connections = field(&info("stats"), "total_connections_received:");
    let setinfo = field(&errors, "errorstat_ERR:count=");
    assert!(setinfo <= connections, "{errors}");
    let others: Vec<&str> = errors
        .lines()
        .filter(|l| l.starts_with("errorstat_") && !l.starts_with("errorstat_ERR:"))
        .collect();
    assert!(others.is_empty(), "errors counted: {others:?}");
}

/// Dropping many guards together releases every one: the background releases take
/// turns instead of queueing so many calls at once that the later ones time out (with
/// all 100,000 sent at once, about a third of them did, their keys left to expire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_many_guards_at_once_releases_every_one() {
    const LOCKS: usize = 100_000;
    let r = RedisServer::start();
    let c = Client::builder(r.url())
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let mut guards = Vec::with_capacity(LOCKS);
    // Taken 100 at a time: a thousand at once can outlast the short response timeout on
    // a loaded machine (it did, once, while the lab ran beside it); the releases below
    // are what this test floods.
    for chunk in (0..LOCKS).collect::<Vec<_>>().chunks(100) {
        let acquiring = chunk.iter().map(|i| {
            let lock = c.lock(format!("drop:{i}")).renew(false);
            async move { lock.try_acquire().await }
        });
        for g in futures_util::future::join_all(acquiring).await {
            guards.push(g.unwrap());
        }
    }
    drop(guards);
    c.flush().await;
    // Lock keys only (they end at the name's closing brace; the counters do not).
    let left = r.cmd(&["KEYS", "fencelock:{drop:*}"]);
    assert_eq!(
        left.as_array().map(<[_]>::len),
        Some(0),
        "lock keys left behind of {LOCKS}"
    );
}

fn dbsize(r: &RedisServer) -> i64 {
    r.cmd(&["DBSIZE"]).as_int().expect("DBSIZE is an integer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_locked_once_leave_no_key_behind_after_the_counter_idle_time() {
    use futures_util::stream::{self, StreamExt};

    let r = RedisServer::start();
    let idle = Duration::from_secs(1);
    let c = Client::builder(r.url())
        .fence_counter_idle(idle)
        .connect()
        .await
        .unwrap();
    // 100,000 names (one per order, say), each locked and released once.
    let names = 100_000;
    let first = c.lock("order:0").try_acquire().await.unwrap();
    let first_token = first.fencing_token();
    first.release().await.unwrap();
    let taken = stream::iter(1..names)
        .map(|i| {
            let c = c.clone();
            async move {
                let g = c.lock(format!("order:{i}")).try_acquire().await?;
                g.release().await
            }
        })
        .buffer_unordered(64)
        .filter(|r| std::future::ready(r.is_err()))
        .count()
        .await;
    assert_eq!(taken, 0, "every acquire and release succeeded");
    // What is left: at most the fencing counters (the ones taken first may have gone
    // already), each with its idle expiry.
    assert!(dbsize(&r) <= names);
    c.lock("probe")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let pttl = r.pttl("fencelock:{probe}:fence");
    assert!(pttl > 0 && pttl <= 1000, "counter PTTL {pttl}");
    // After the idle time, nothing.
    testkit::eventually("every counter expired", Duration::from_secs(60), || {
        dbsize(&r) == 0
    });
    // A name taken again after its counter expired still gets a higher token: the
    // counter is reseeded from the server clock.
    let again = c.lock("order:0").try_acquire().await.unwrap();
    assert!(again.fencing_token() > first_token);
    again.release().await.unwrap();

    // Zero: counters for ever, as before the setting.
    let forever = Client::builder(r.url())
        .fence_counter_idle(Duration::ZERO)
        .connect()
        .await
        .unwrap();
    forever
        .lock("kept")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(r.pttl("fencelock:{kept}:fence"), -1);
    // The default: a week.
    let default = Client::connect(&r.url()).await.unwrap();
    default
        .lock("week")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let pttl = r.pttl("fencelock:{week}:fence");
    assert!(
        pttl > 6 * 24 * 3600 * 1000 && pttl <= 7 * 24 * 3600 * 1000,
        "{pttl}"
    );

    // Every other script that writes a counter sets the expiry too: a fair grant (and
    // the handover inside a fair release), a reentrant grant, a break.
    let minute = Client::builder(r.url())
        .fence_counter_idle(Duration::from_secs(60))
        .connect()
        .await
        .unwrap();
    let counter_pttl = |name: &str| r.pttl(&format!("fencelock:{{{name}}}:fence"));
    let in_a_minute = |pttl: i64| pttl > 0 && pttl <= 60_000;
    let fair = minute.lock("fair").fair().try_acquire().await.unwrap();
    assert!(in_a_minute(counter_pttl("fair")));
    let waiter = tokio::spawn(
        minute
            .lock("fair")
            .fair()
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    eventually(
        "the fair waiter queued",
        Duration::from_secs(5),
        async || minute.stats().waiters == 1,
    )
    .await;
    r.cmd(&["PERSIST", "fencelock:{fair}:fence"]);
    fair.release().await.unwrap();
    let handed = waiter.await.unwrap().unwrap();
    assert!(in_a_minute(counter_pttl("fair")), "handed over");
    handed.release().await.unwrap();
    let re = minute
        .lock("re")
        .reentrant("job")
        .try_acquire()
        .await
        .unwrap();
    assert!(in_a_minute(counter_pttl("re")));
    r.cmd(&["PERSIST", "fencelock:{re}:fence"]);
    minute.break_lock("re").await.unwrap();
    assert!(in_a_minute(counter_pttl("re")), "broken");
    drop(re);
    minute.flush().await;
}

/// An uncontended acquire and release run no command for a read-write lock's waiting
/// writers (a plain lock's first attempt was never among them, and a grant left them):
/// each Redis call inside a script costs about as much as a small command.
#[tokio::test]
async fn an_uncontended_acquire_and_release_leave_the_waiting_writers_alone() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    for _ in 0..10 {
        c.lock("quiet")
            .try_acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let waited = c
            .lock("quiet")
            .wait(Duration::from_secs(1))
            .acquire()
            .await
            .unwrap();
        waited.release().await.unwrap();
    }
    assert_eq!(
        r.info_field("commandstats", "cmdstat_zrem"),
        None,
        "no ZREM"
    );
    assert!(
        r.info_field("commandstats", "cmdstat_evalsha").is_some(),
        "the scripts ran"
    );
}

/// What an uncontended acquire and release cost Redis (docs/benchmarks.md, "Redis's
/// work per lock"): the common case's scripts, with the fewest keys and arguments, and
/// the fewest commands inside them; a release that nobody waits for reads the wake list
/// once and announces nothing.
#[tokio::test]
async fn an_uncontended_acquire_and_release_run_the_fewest_commands() {
    let r = RedisServer::start();
    let c = client(&r).await;
    // Once first: the scripts loaded, the server asked what it offers.
    c.lock("stock:42")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    count_commands(&r);
    let guard = c.lock("stock:42").try_acquire().await.unwrap();
    guard.release().await.unwrap();
    let expected = [
        ("del", 1),     // the lock key and its holder info
        ("evalsha", 2), // take.lua, release.lua
        ("exists", 1),  // the wake list: nobody listed, nothing announced
        ("get", 2),     // the counter, then (release) the lock key
        ("set", 2),     // the lock key NX, the counter
        ("time", 1),    // the token's floor
    ];
    let expected: Vec<(String, u64)> = expected.iter().map(|(n, c)| ((*n).into(), *c)).collect();
    assert_eq!(commands_run(&r), expected);
    // Each script's keys and arguments (SLOWLOG keeps each command's): take.lua 2 keys
    // and 3 arguments, release.lua 4 keys and 2 arguments.
    let sizes = script_sizes(&r);
    assert_eq!(
        sizes,
        [("2".to_owned(), 5), ("4".to_owned(), 6)],
        "(keys, keys + arguments)"
    );
}

/// What an uncontended fair lock costs Redis (docs/benchmarks.md, "Redis's work per
/// lock"): with nobody holding it or in line, its acquire and release run the fewest
/// commands.
#[tokio::test]
async fn an_uncontended_fair_lock_runs_the_fewest_commands() {
    let r = RedisServer::start();
    let c = client(&r).await;
    // Once first: the scripts loaded, the server asked what it offers.
    let g = c.lock("stock:42").fair().try_acquire().await.unwrap();
    g.release().await.unwrap();
    count_commands(&r);
    let g = c.lock("stock:42").fair().try_acquire().await.unwrap();
    g.release().await.unwrap();
    let expected = [
        ("del", 1),     // the lock key and its holder info
        ("evalsha", 2), // fair_acquire.lua, fair_release.lua
        ("exists", 2),  // nobody holds it or is in line; nobody in line for the release
        ("get", 2),     // the counter, then (release) the lock key
        ("set", 2),     // the lock key, the counter
        ("time", 1),    // the token's floor
    ];
    let expected: Vec<(String, u64)> = expected.iter().map(|(n, c)| ((*n).into(), *c)).collect();
    assert_eq!(commands_run(&r), expected);
}
