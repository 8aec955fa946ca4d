//! `fencelock::blocking` (feature `blocking`) against real servers: guards released on
//! drop *and waited for*, leases renewed while the caller's thread works, a typed error
//! (no panic) from inside a Tokio runtime, `run` reporting a lease lost under blocking
//! work, and every primitive through the blocking client.

use std::time::Duration;

use fencelock::Error;
use fencelock::blocking::Client;
use testkit::{Fault, FaultProxy, RedisServer};

/// A dropped guard's release is done when the drop returns: with every chunk between
/// client and server delayed 150 ms, a release left to the background would still be on
/// its way when the caller looks.
#[test]
fn a_dropped_guard_is_released_before_the_drop_returns() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(&redis.addr());
    let client = Client::connect(&proxy.url()).unwrap();
    proxy.set(Fault::Delay {
        base: Duration::from_millis(150),
        jitter: Duration::ZERO,
    });
    {
        let guard = client.lock("scoped").try_acquire().unwrap();
        assert!(redis.exists("fencelock:{scoped}"));
        let _ = guard.fencing_token();
    } // dropped here
    assert!(
        !redis.exists("fencelock:{scoped}"),
        "the drop returned before the release reached Redis"
    );
    // The same for an early return through `?`.
    let sell = || -> Result<(), Error> {
        let _guard = client.lock("early").try_acquire()?;
        client.lock("early").try_acquire()?; // held: Err, returned at once
        Ok(())
    };
    assert!(matches!(sell(), Err(Error::Held { .. })));
    assert!(!redis.exists("fencelock:{early}"));
}

/// The lease is renewed by the client's own runtime while the caller's thread sleeps
/// (works) without calling into fencelock.
#[test]
fn the_lease_is_renewed_while_the_thread_works() {
    let redis = RedisServer::start();
    let client = Client::connect(&redis.url()).unwrap();
    let guard = client
        .lock("long-job")
        .lease(Duration::from_millis(600))
        .try_acquire()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2000)); // three leases and more
    assert_eq!(guard.loss_cause(), None);
    assert!(redis.pttl("fencelock:{long-job}") > 0);
    let other = Client::connect(&redis.url()).unwrap();
    assert!(matches!(
        other.lock("long-job").try_acquire(),
        Err(Error::Held { .. })
    ));
    guard.release().unwrap();
    assert!(!redis.exists("fencelock:{long-job}"));
}

/// From inside a Tokio runtime every blocking call is `Error::Blocking`, with nothing
/// sent, and dropping blocking guards and clients there does not panic either.
#[test]
fn inside_a_tokio_runtime_calls_are_refused_without_a_panic() {
    let redis = RedisServer::start();
    let client = Client::connect(&redis.url()).unwrap();
    let guard = client.lock("outside").try_acquire().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (url, inside) = (redis.url(), client.clone());
    rt.block_on(async move {
        assert!(matches!(Client::connect(&url), Err(Error::Blocking { .. })));
        match inside.lock("inside").try_acquire() {
            Err(e @ Error::Blocking { .. }) => {
                assert!(e.to_string().contains("inside a Tokio runtime"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            inside.inspect("outside"),
            Err(Error::Blocking { .. })
        ));
        // A guard and a client dropped in here: no panic.
        drop(guard);
        drop(inside);
    });
    assert!(!redis.exists("fencelock:{inside}"), "nothing was sent");
    // The same from a task's blocking thread.
    let client2 = client.clone();
    let task = rt.spawn_blocking(move || client2.lock("pool").try_acquire().map(|_| ()));
    let refused = rt.block_on(task).unwrap();
    assert!(
        matches!(refused, Err(Error::Blocking { .. })),
        "{refused:?}"
    );
    drop(rt);
    // The guard dropped inside the runtime was released in the background.
    testkit::eventually(
        "the guard dropped in a runtime is released",
        Duration::from_secs(5),
        || !redis.exists("fencelock:{outside}"),
    );
}

/// A guard dropped or released inside a caller's runtime that stops at once is still
/// released: its release runs on the blocking client's own runtime, not the caller's.
#[test]
fn a_guard_let_go_in_a_runtime_that_stops_at_once_is_still_released() {
    let redis = RedisServer::start();
    let client = Client::connect(&redis.url()).unwrap();
    let dropped = client.lock("dropped").try_acquire().unwrap();
    let released = client.lock("released").try_acquire().unwrap();
    // A current-thread runtime runs nothing spawned on it after block_on's future ends.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let refused = rt.block_on(async move {
        drop(dropped);
        released.release()
    });
    assert!(
        matches!(refused, Err(Error::Blocking { .. })),
        "{refused:?}"
    );
    drop(rt);
    for name in ["dropped", "released"] {
        testkit::eventually(
            &format!("the guard of {name} is released"),
            Duration::from_secs(5),
            || !redis.exists(&format!("fencelock:{{{name}}}")),
        );
    }
}

/// `run` cannot cancel blocking work: it runs to its end, and a lease lost meanwhile
/// (the lock broken under it) comes back as `LeaseLost`, the work's result dropped.
#[test]
fn run_reports_a_lease_lost_under_blocking_work() {
    let redis = RedisServer::start();
    let client = Client::connect(&redis.url()).unwrap();
    let breaker = Client::connect(&redis.url()).unwrap();
    let mut finished = false;
    let result = client
        .lock("job")
        .lease(Duration::from_millis(600))
        .run(|token| {
            breaker.break_lock("job").unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            finished = true;
            token
        });
    assert!(finished, "the work ran to its end");
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    // And work that ends under its lease gets its value, the lock released.
    assert_eq!(client.lock("job").run(|_| 7).unwrap(), 7);
    assert!(!redis.exists("fencelock:{job}"));
}

/// Every primitive through the blocking client: semaphore, read-write lock, several
/// locks, election (a dropped leadership resigns at once), fenced write.
#[test]
fn every_primitive_works_blocking() {
    let redis = RedisServer::start();
    let client = Client::connect(&redis.url()).unwrap();

    let first = client.semaphore("pool", 2).try_acquire().unwrap();
    let second = client.semaphore("pool", 2).try_acquire().unwrap();
    assert!(matches!(
        client.semaphore("pool", 2).try_acquire(),
        Err(Error::Held { .. })
    ));
    drop(first);
    let third = client.semaphore("pool", 2).try_acquire().unwrap();
    drop((second, third));

    let reader = client.read_lock("doc").try_acquire().unwrap();
    assert!(client.read_lock("doc").try_acquire().is_ok());
    assert!(matches!(
        client.lock("doc").try_acquire(),
        Err(Error::Held { .. })
    ));
    drop(reader);

    let both = client.lock_all(["a", "b"]).try_acquire().unwrap();
    assert_eq!(both.names().count(), 2);
    let token = both.fencing_token("a").unwrap();
    drop(both);
    assert!(!redis.exists("fencelock:{a}") && !redis.exists("fencelock:{b}"));

    {
        let leadership = client.election("sched").campaign().unwrap();
        assert!(leadership.term() > fencelock::FencingToken::new(0));
        let leader = client.election("sched").leader().unwrap().unwrap();
        assert_eq!(leader.term, leadership.term());
    } // resigned when dropped
    assert_eq!(client.election("sched").leader().unwrap(), None);

    client
        .fenced_write("a", token)
        .incr_by("{a}:count", 2)
        .apply()
        .unwrap();
    assert_eq!(redis.get("{a}:count").as_deref(), Some("2"));
    let stale = client
        .fenced_write("a", fencelock::FencingToken::new(token.get() - 1))
        .incr_by("{a}:count", 2)
        .apply();
    assert!(matches!(stale, Err(Error::Fenced { .. })), "{stale:?}");
}
