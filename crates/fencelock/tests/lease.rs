//! Leases: the watchdog keeps a held lock alive, tells the holder at once when it is
//! lost, stops renewing the moment the guard goes, and batches renewals. Against real
//! redis-server processes, with real faults (SIGKILL, SIGSTOP, keys changed from outside).

use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

use fencelock::{Client, Error, LossCause};
use testkit::RedisServer;

mod common;
use common::{eventually, spawn_helper};

const HELPER_ENV: &str = "FENCELOCK_LEASE_HELPER";

/// A process that holds `name` under a renewed lease of `lease_ms` and never releases.
fn lease_holder(r: &RedisServer, name: &str, lease_ms: u64) -> common::Helper {
    spawn_helper(
        "helper_process",
        HELPER_ENV,
        format!("{} {name} {lease_ms}", r.url()),
    )
}

#[test]
#[ignore = "helper process entry point, started by the tests below"]
fn helper_process() {
    common::helper_entry(HELPER_ENV, async |c, words| {
        let [name, lease] = &words[..] else {
            panic!("bad spec {words:?}")
        };
        let lease = Duration::from_millis(lease.parse().unwrap());
        let _guard = c.lock(name).lease(lease).try_acquire().await.unwrap();
        std::future::pending::<()>().await;
    });
}

#[tokio::test]
async fn a_renewed_lease_outlives_its_length_while_the_guard_lives() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lease = Duration::from_secs(2);
    let guard = c.lock("long").lease(lease).try_acquire().await.unwrap();
    let started = Instant::now();
    let first_valid_until = guard.valid_until();
    while started.elapsed() < Duration::from_secs(10) {
        assert_eq!(
            r.get("fencelock:{long}").as_deref(),
            Some(guard.holder_token().as_str()),
            "still ours after {:?}",
            started.elapsed()
        );
        assert!(r.pttl("fencelock:{long}") > 0);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(guard.loss_cause().is_none());
    assert!(
        guard.valid_until() > first_valid_until + Duration::from_secs(7),
        "renewals moved valid_until"
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn the_key_of_a_sigkilled_holder_expires_within_one_lease() {
    let r = RedisServer::start();
    let lease = Duration::from_millis(1500);
    let mut holder = lease_holder(&r, "k9", lease.as_millis() as u64);
    eventually(
        "the holder took the lock",
        Duration::from_secs(10),
        async || r.exists("fencelock:{k9}"),
    )
    .await;
    // Renewed past its first lease: the watchdog in the other process works.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    assert!(r.exists("fencelock:{k9}"));
    holder.kill().unwrap();
    let killed = Instant::now();
    holder.wait().unwrap();
    eventually(
        "the key expired",
        lease + Duration::from_secs(1),
        async || !r.exists("fencelock:{k9}"),
    )
    .await;
    // Due one lease after the kill at the latest (renewed every third of a lease, it
    // had 1 to 1.5 s left); the margin is for seeing it (a poll every 2 ms, each on a
    // new connection) on a loaded machine. A TTL of two leases would still fail.
    assert!(
        killed.elapsed() <= lease + Duration::from_millis(500),
        "{:?}",
        killed.elapsed()
    );
}

#[tokio::test]
async fn deleting_or_overwriting_the_key_fires_the_loss_signal_within_one_renewal() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lease = Duration::from_millis(900); // renewed every 300 ms
    for (how, expected) in [
        ("delete", LossCause::Deleted),
        ("overwrite", LossCause::TakenByOther),
    ] {
        let guard = c.lock("sig").lease(lease).try_acquire().await.unwrap();
        let lost = guard.lost();
        let changed = Instant::now();
        if how == "delete" {
            r.cmd(&["DEL", "fencelock:{sig}"]);
        } else {
            r.cmd(&["SET", "fencelock:{sig}", "intruder", "PX", "60000"]);
        }
        let cause = tokio::time::timeout(Duration::from_secs(5), lost)
            .await
            .expect("the loss signal fired");
        assert_eq!(cause, expected, "{how}");
        // The next renewal is at most a third of the lease away; the margin is for a
        // loaded machine's delay in sending it and in waking this task. (Without that
        // renewal the loss would come at the loss deadline, about 800 ms, as Unconfirmed.)
        assert!(
            changed.elapsed() <= lease / 3 + Duration::from_millis(300),
            "{how}: {:?}",
            changed.elapsed()
        );
        assert_eq!(guard.loss_cause(), Some(expected));
        assert!(matches!(
            guard.release().await,
            Err(Error::LeaseLost { .. })
        ));
        r.cmd(&["DEL", "fencelock:{sig}"]);
    }
}

#[tokio::test]
async fn run_cancels_the_work_when_the_lease_is_lost() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finished_tx, mut finished_rx) = tokio::sync::oneshot::channel::<()>();
    let lock = c.lock("job").lease(Duration::from_millis(600));
    let running = tokio::spawn(async move {
        lock.run(|token| async move {
            started_tx.send(token).unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            finished_tx.send(()).unwrap(); // never reached
        })
        .await
    });
    let token = started_rx.await.unwrap();
    assert!(token.get() > 0);
    r.cmd(&["DEL", "fencelock:{job}"]);
    let result = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert!(
        finished_rx.try_recv().is_err(),
        "the work was cancelled, not finished"
    );

    // And when the lease holds, run returns the work's output and releases.
    let out = c
        .lock("job")
        .run(|token| async move { token.get() * 2 })
        .await
        .unwrap();
    assert!(out > 0);
    assert!(!r.exists("fencelock:{job}"));
}

#[tokio::test]
async fn a_paused_redis_fires_the_loss_signal_before_valid_until() {
    let mut r = RedisServer::start();
    let c = Client::builder(r.url())
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let guard = c
        .lock("stop")
        .lease(Duration::from_secs(1))
        .try_acquire()
        .await
        .unwrap();
    r.pause(); // longer than the lease: no renewal can be confirmed
    let cause = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss fired");
    let fired = Instant::now();
    let valid_until = guard.valid_until();
    r.resume();
    assert_eq!(cause, LossCause::Unconfirmed);
    assert!(
        fired < valid_until,
        "fired {:?} before valid_until",
        valid_until - fired
    );
}

#[tokio::test]
async fn release_during_an_in_flight_renewal_leaves_no_renewal_behind() {
    let mut r = RedisServer::start();
    // Every script loaded: no renewal or release needs a second try after a NOSCRIPT, so
    // the server runs them in the order they were sent.
    // (Redis 6.2 reads no `#!lua` line: it gets those scripts in their `no-flags/` form.)
    let reads_flags = !r.version().starts_with("Redis 6.");
    for (_, source) in fencelock::lua_scripts().filter(|(_, s)| reads_flags || !s.starts_with("#!"))
    {
        assert!(!r.cmd(&["SCRIPT", "LOAD", &source]).is_error());
    }
    common::traces();
    // However long a loaded machine makes the fault below, the release behind the
    // renewal does not time out.
    let c = Client::builder(r.url())
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let lease = Duration::from_secs(1); // renewed every 333 ms
    let mut guard = c.lock("rel").lease(lease).try_acquire().await.unwrap();
    // The fault below is meant to be shorter than the lease. Neither the key (which
    // expires by the server's clock, going on while Redis is stopped) nor the lease as
    // the watchdog reckons it (which it gives up shortly before its end) may run out
    // however long a loaded machine makes the fault: an extend moves both a minute
    // ahead. Renewals still come every third of the lease, each for one lease.
    guard.extend(Duration::from_secs(60)).await.unwrap();
    common::memory_policy_read(&r.addr()).await;
    r.cmd(&["CONFIG", "RESETSTAT"]);
    // Stop Redis, and wait until the next renewal has reached it: it sits there unread,
    // unanswered. (Had Redis read a renewal just before it stopped, the response
    // timeout would send it again: the bound covers that.)
    r.pause();
    eventually(
        "a renewal reached the stopped server",
        Duration::from_secs(10),
        async || r.unread_request_bytes() > 0,
    )
    .await;
    assert_eq!(c.stats().watched_leases, 1);
    // Release behind it: the release's first poll unregisters the lease.
    let mut releasing = std::pin::pin!(guard.release());
    let first_poll = std::future::poll_fn(|cx| Poll::Ready(releasing.as_mut().poll(cx))).await;
    assert!(
        first_poll.is_pending(),
        "released while Redis is stopped: {first_poll:?}"
    );
    assert_eq!(c.stats().watched_leases, 0, "unregistered synchronously");
    r.resume();
    releasing.await.unwrap();
    assert!(!r.exists("fencelock:{rel}"));
    assert!(
        r.script_calls() >= 2,
        "the renewal that waited, then the release, ran"
    );
    r.cmd(&["CONFIG", "RESETSTAT"]);
    tokio::time::sleep(lease * 3).await; // three lease lengths: nine renewal periods
    assert_eq!(r.script_calls(), 0, "no renewal sent after the release");
    assert!(!r.exists("fencelock:{rel}"), "never re-created");
}

#[tokio::test]
async fn a_maximum_hold_stops_renewals_and_the_lease_runs_out() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let guard = c
        .lock("cap")
        .lease(Duration::from_millis(600))
        .max_hold(Duration::from_millis(1000))
        .try_acquire()
        .await
        .unwrap();
    let acquired = Instant::now();
    let cause = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .unwrap();
    assert_eq!(cause, LossCause::MaxHold);
    eventually("the key expired", Duration::from_secs(3), async || {
        !r.exists("fencelock:{cap}")
    })
    .await;
    let held = acquired.elapsed();
    assert!(
        held >= Duration::from_millis(900) && held <= Duration::from_millis(1400),
        "held {held:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_are_renewed_in_batches() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lease = Duration::from_secs(3); // renewed every 0.5 s to 1 s
    let n = 10_000;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut guards = Vec::new();
            for i in (t..n).step_by(8) {
                guards.push(
                    c.lock(format!("many:{i}"))
                        .lease(lease)
                        .try_acquire()
                        .await
                        .unwrap(),
                );
            }
            guards
        }));
    }
    let mut guards = Vec::new();
    for t in tasks {
        guards.extend(t.await.unwrap());
    }
    assert_eq!(c.stats().watched_leases, n);
    r.cmd(&["CONFIG", "RESETSTAT"]);
    let window = Duration::from_secs(4); // more than one whole lease
    tokio::time::sleep(window).await;
    let calls = i64::try_from(r.script_calls()).unwrap();
    // Every lease alive: lock key and fence counter each.
    assert_eq!(
        r.cmd(&["DBSIZE"]).as_int(),
        Some(2 * n as i64),
        "a lease ran out"
    );
    assert!(guards.iter().all(|g| g.loss_cause().is_none()));
    // The watchdog ticks every sixth of the lease (and wakes at most twice a tick: a
    // lease falls due a third of it after its last renewal, up to half a tick early);
    // each wake costs one call per batch of up to 1,000 due leases, and the leases due
    // in one tick are at most half of them. The promise is at most one call per 100
    // leases a tick.
    let ticks = (window.as_secs_f64() / (lease.as_secs_f64() / 6.0)).ceil() as i64 + 1;
    let batched = ticks * (n as i64 / 1000 + 1);
    let promised = ticks * (n as i64 / 100);
    assert!(
        calls <= batched,
        "{calls} script calls for {n} leases in {window:?}, batching allows {batched}"
    );
    assert!(calls > 0, "renewals happened");
    assert!(
        calls <= promised,
        "{calls} script calls for {n} leases in {window:?} (promise: {promised})"
    );
    eprintln!("{calls} renewal calls for {n} leases over {window:?}");
    drop(guards);
}

/// Puts the client's watchdog on a long tick: a lock with the default 30 s lease (renewed
/// every 10 s, tick 5 s), and a yield so that the watchdog task (on this current-thread
/// runtime) runs once and goes to sleep before the caller registers the next lease.
async fn watchdog_asleep_on_a_long_tick(c: &Client) -> fencelock::LockGuard {
    let long = c.lock("long-lease").try_acquire().await.unwrap();
    tokio::task::yield_now().await;
    long
}

#[tokio::test]
async fn a_capped_lease_is_reported_lost_before_it_ends_even_while_the_watchdog_sleeps() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let _long = watchdog_asleep_on_a_long_tick(&c).await;
    let started = Instant::now();
    let guard = c
        .lock("capped")
        .max_hold(Duration::from_millis(1500))
        .try_acquire()
        .await
        .unwrap();
    let valid_until = guard.valid_until();
    let cause = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the loss signal fires");
    let heard = Instant::now();
    assert_eq!(cause, LossCause::MaxHold);
    assert!(
        heard < valid_until,
        "the loss was heard {:?} after valid_until",
        heard - valid_until
    );
    assert!(
        heard - started >= Duration::from_millis(1200),
        "the loss was reported after {:?} of a 1.5 s hold",
        heard - started
    );
}

#[tokio::test]
async fn max_hold_reports_the_loss_just_before_the_capped_lease_ends() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // With the default 30 s lease, the first grant is the cap itself.
    for cap_ms in [500, 3000] {
        let cap = Duration::from_millis(cap_ms);
        let name = format!("cap-{cap_ms}");
        let started = Instant::now();
        let guard = c.lock(&name).max_hold(cap).try_acquire().await.unwrap();
        let valid_until = guard.valid_until();
        let cause = tokio::time::timeout(cap * 3, guard.lost()).await.unwrap();
        let heard = Instant::now();
        assert_eq!(cause, LossCause::MaxHold);
        assert!(heard < valid_until, "{cap:?}: heard after valid_until");
        // The margin is a tenth of the capped lease, not of the 30 s one.
        assert!(
            heard - started >= cap * 8 / 10,
            "{cap:?}: the loss was reported after only {:?}",
            heard - started
        );
        // And the key is gone soon after: nobody holds it for long with nobody working.
        // It is due about a tenth of the cap after the loss; the second on top is for a
        // loaded machine, and still far from the 30 s of a lease left uncapped.
        eventually(
            "the capped key expired",
            cap / 5 + Duration::from_secs(1),
            async || !r.exists(&format!("fencelock:{{{name}}}")),
        )
        .await;
    }
}

#[tokio::test]
async fn an_extend_to_a_shorter_ttl_is_renewed_before_it_runs_out() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let _long = watchdog_asleep_on_a_long_tick(&c).await;
    let mut guard = c.lock("shortened").try_acquire().await.unwrap();
    guard.extend(Duration::from_secs(1)).await.unwrap();
    assert!(r.pttl("fencelock:{shortened}") <= 1000);
    // The watchdog renews a renewed lease to its own length (30 s) again, before the
    // second that the extend asked for runs out: a renewal never re-creates an expired
    // key, so a TTL above a second proves it came in time, and the lease was not given
    // up as unconfirmed either. The bound only ends a hang.
    eventually(
        "the watchdog renewed the lease",
        Duration::from_secs(5),
        async || r.pttl("fencelock:{shortened}") > 1000,
    )
    .await;
    assert_eq!(guard.loss_cause(), None);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn an_extend_never_goes_past_the_maximum_hold() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let mut guard = c
        .lock("capped-extend")
        .max_hold(Duration::from_millis(1500))
        .try_acquire()
        .await
        .unwrap();
    guard.extend(Duration::from_secs(60)).await.unwrap();
    let left = r.pttl("fencelock:{capped-extend}");
    assert!((1..=1500).contains(&left), "extended to {left} ms");
    let cause = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .unwrap();
    assert_eq!(cause, LossCause::MaxHold);
    let err = guard.extend(Duration::from_secs(60)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseLost {
                cause: LossCause::MaxHold | LossCause::Expired,
                ..
            }
        ),
        "{err:?}"
    );
}

/// The renewals Redis ran for `key` (each one `PEXPIRE` by `renew.lua`), as `MONITOR`
/// recorded them.
fn renewals_of(entries: &[testkit::monitor::Entry], key: &str) -> usize {
    entries
        .iter()
        .filter(|e| {
            e.source == testkit::monitor::Source::Lua
                && e.command() == "PEXPIRE"
                && e.args.get(1).map(String::as_str) == Some(key)
        })
        .count()
}

#[tokio::test]
async fn a_lease_is_renewed_every_third_of_it_as_documented() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lease = Duration::from_millis(1200); // documented: renewed every 400 ms
    let monitor = testkit::monitor::Monitor::start(&r.addr()).unwrap();
    let guard = c.lock("cadence").lease(lease).try_acquire().await.unwrap();
    let held = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    monitor.sync().unwrap();
    let elapsed = held.elapsed();
    let renewals = renewals_of(&monitor.stop(), "fencelock:{cadence}");
    assert!(guard.loss_cause().is_none());
    guard.release().await.unwrap();
    // Every third of the lease, up to a twelfth early (to share a call): between a
    // quarter and a third of the lease apart. A count, not a speed: at most one more
    // than a quarter allows, and at least half of what a third gives (a loaded machine
    // may send late). Renewed every sixth, it would be about twice the upper bound.
    let most = (elapsed.as_secs_f64() / (lease.as_secs_f64() / 4.0)).floor() as usize + 1;
    let least = (elapsed.as_secs_f64() / (lease.as_secs_f64() / 3.0) / 2.0).floor() as usize;
    assert!(
        (least..=most).contains(&renewals),
        "{renewals} renewals of a {lease:?} lease in {elapsed:?}: expected {least} to {most}"
    );
}

#[tokio::test]
async fn a_deleted_key_and_a_broken_lock_are_reported_by_their_cause() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lease = Duration::from_millis(900);
    for (how, expected) in [("delete", LossCause::Deleted), ("break", LossCause::Broken)] {
        let result = c
            .lock("cause")
            .lease(lease)
            .try_run(|_token| async {
                if how == "delete" {
                    r.cmd(&["DEL", "fencelock:{cause}"]);
                } else {
                    c.break_lock("cause").await?;
                }
                // Works on until the loss cancels it.
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok::<_, Error>(())
            })
            .await;
        let Err(Error::LeaseLost { cause, .. }) = &result else {
            panic!("{how}: {result:?}")
        };
        assert_eq!(*cause, expected, "{how}");
        let message = result.unwrap_err().to_string();
        let (says, advice) = match expected {
            LossCause::Deleted => (
                "was deleted while the lease was still running",
                "find what deletes the key",
            ),
            _ => (
                "was broken (fencelock break)",
                "someone forced the lock free",
            ),
        };
        assert!(message.contains(says), "{how}: {message}");
        assert!(message.contains(advice), "{how}: {message}");
        assert!(!message.contains("longer lease"), "{how}: {message}");
    }
    // A key that ran out while the holder was not renewing (a fixed lease) expired.
    let fixed = c
        .lock("cause")
        .lease(Duration::from_millis(100))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(fixed.lost().await, LossCause::Expired);
    assert!(
        Error::lease_lost("cause", LossCause::Expired)
            .to_string()
            .contains("use a longer lease or extend sooner")
    );
}

#[tokio::test]
async fn try_run_returns_the_works_error_after_releasing() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    #[derive(Debug)]
    enum JobError {
        Lock(Error),
        Failed(u64),
    }
    impl From<Error> for JobError {
        fn from(e: Error) -> Self {
            JobError::Lock(e)
        }
    }
    let failed: Result<(), JobError> = c
        .lock("try")
        .try_run(|token| async move { Err(JobError::Failed(token.get())) })
        .await;
    assert!(
        matches!(failed, Err(JobError::Failed(t)) if t > 0),
        "{failed:?}"
    );
    assert!(!r.exists("fencelock:{try}"), "released before returning");
    // The lock's own errors arrive through From.
    let holder = c.lock("try").try_acquire().await.unwrap();
    let held: Result<(), JobError> = c.lock("try").try_run(|_| async { Ok(()) }).await;
    assert!(
        matches!(held, Err(JobError::Lock(Error::Held { .. }))),
        "{held:?}"
    );
    holder.release().await.unwrap();
    let ok: Result<u64, JobError> = c.lock("try").try_run(|t| async move { Ok(t.get()) }).await;
    assert!(ok.unwrap() > 0);
    assert!(!r.exists("fencelock:{try}"));
}

#[tokio::test]
async fn run_from_a_temporary_builder_can_be_kept_and_spawned() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    // The builder is a temporary: the futures own their settings.
    let kept = c.lock("kept").run(|token| async move { token.get() });
    let spawned = tokio::spawn(
        c.lock("spawned")
            .try_run(|token| async move { Ok::<_, Error>(token.get()) }),
    );
    assert!(kept.await.unwrap() > 0);
    assert!(spawned.await.unwrap().unwrap() > 0);
    assert!(!r.exists("fencelock:{kept}") && !r.exists("fencelock:{spawned}"));
}
