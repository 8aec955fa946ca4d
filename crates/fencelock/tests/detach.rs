//! A held lock passed on without a release: `LockGuard::detach` lets go of it (nothing
//! sent, the key keeps its lease), `Client::attach` takes it over — here or in another
//! client, as another process would from `to_text` — with the same fencing token, and
//! renews it; a lease that ran out meanwhile, or a maximum hold that is over, is refused.
//! Against a real redis-server.

use std::time::Duration;

use fencelock::{Client, DetachedLock, Error, LossCause};
use testkit::RedisServer;

mod common;

#[tokio::test]
async fn a_detached_lock_keeps_its_key_and_another_client_takes_it_over_and_renews_it() {
    let r = RedisServer::start();
    let first = Client::connect(&r.url()).await.unwrap();
    let guard = first
        .lock("job")
        .lease(Duration::from_secs(1))
        .try_acquire()
        .await
        .unwrap();
    let fence = guard.fencing_token();
    let stored = r.get("fencelock:{job}").expect("held");
    let text = guard.detach().to_text();
    assert_eq!(
        r.get("fencelock:{job}").as_ref(),
        Some(&stored),
        "detach releases nothing"
    );
    assert!(!format!("{:?}", DetachedLock::from_text(&text).unwrap()).contains(&stored));

    // Another client, as another process would: from the text alone.
    let second = Client::connect(&r.url()).await.unwrap();
    let guard = second
        .attach(DetachedLock::from_text(&text).unwrap())
        .await
        .expect("still held");
    assert_eq!(guard.fencing_token(), fence, "the grant's own token");
    assert!(r.pttl("fencelock:{job}") > 800, "the lease reset");
    // Renewed by the second client's watchdog, past the lease's own length.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(r.get("fencelock:{job}").as_ref(), Some(&stored));
    assert!(guard.loss_cause().is_none());
    guard.release().await.expect("released by the new guard");
    assert!(!r.exists("fencelock:{job}"));
}

#[tokio::test]
async fn a_lease_that_ran_out_or_was_taken_is_not_attached() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let detached = c
        .lock("brief")
        .lease(Duration::from_millis(300))
        .try_acquire()
        .await
        .unwrap()
        .detach();
    common::eventually("the lease ran out", Duration::from_secs(5), async || {
        !r.exists("fencelock:{brief}")
    })
    .await;
    let taken = c.lock("brief").try_acquire().await.unwrap();
    let refused = c.attach(detached).await;
    assert!(
        matches!(
            refused,
            Err(Error::LeaseLost {
                cause: LossCause::TakenByOther,
                ..
            })
        ),
        "{refused:?}"
    );
    assert!(taken.loss_cause().is_none(), "the new holder keeps it");
    taken.release().await.unwrap();
}

#[tokio::test]
async fn the_maximum_hold_goes_with_the_detached_lock() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let detached = c
        .lock("capped")
        .lease(Duration::from_secs(10))
        .max_hold(Duration::from_secs(2))
        .try_acquire()
        .await
        .unwrap()
        .detach();
    let guard = c.attach(detached.clone()).await.unwrap();
    assert!(
        r.pttl("fencelock:{capped}") <= 2000,
        "the extend ends at the maximum hold"
    );
    let cause = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost at the maximum hold");
    assert_eq!(cause, LossCause::MaxHold);
    common::eventually("the key ran out", Duration::from_secs(5), async || {
        !r.exists("fencelock:{capped}")
    })
    .await;
    let late = c.attach(detached).await;
    assert!(matches!(late, Err(Error::LeaseLost { .. })), "{late:?}");
}

/// Every mode goes through the text and back: a reentrant hold, a semaphore's permit
/// and a reader are attached and released as what they are.
#[tokio::test]
async fn holds_permits_and_readers_are_attached_as_what_they_are() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();

    let outer = c
        .lock("re")
        .reentrant("owner 1")
        .try_acquire()
        .await
        .unwrap();
    let inner = c
        .lock("re")
        .reentrant("owner 1")
        .try_acquire()
        .await
        .unwrap();
    let text = inner.detach().to_text();
    let inner = c
        .attach(DetachedLock::from_text(&text).unwrap())
        .await
        .unwrap();
    inner.release().await.unwrap();
    assert!(r.exists("fencelock:{re}"), "the outer hold remains");
    outer.release().await.unwrap();
    assert!(!r.exists("fencelock:{re}"));

    let permit = c.semaphore("pool", 2).fair().try_acquire().await.unwrap();
    let text = permit.detach().to_text();
    let permit = c
        .attach(DetachedLock::from_text(&text).unwrap())
        .await
        .unwrap();
    permit.release().await.unwrap();
    assert_eq!(r.cmd(&["ZCARD", "fencelock:{pool}"]).as_int(), Some(0));

    let reader = c.read_lock("doc").try_acquire().await.unwrap();
    let text = reader.detach().to_text();
    let reader = c
        .attach(DetachedLock::from_text(&text).unwrap())
        .await
        .unwrap();
    reader.release().await.unwrap();
    assert!(!r.exists("fencelock:{doc}"), "the last reader gone");

    let fair = c.lock("line").fair().try_acquire().await.unwrap();
    let text = fair.detach().to_text();
    let fair = c
        .attach(DetachedLock::from_text(&text).unwrap())
        .await
        .unwrap();
    fair.release().await.unwrap();
    assert!(!r.exists("fencelock:{line}"));
}

#[test]
fn text_in_another_format_is_refused_by_field_never_showing_the_token() {
    let good = "fencelock detached lock 1\nname=a\ntoken=0123456789abcdef0123456789abcdef\n\
                fence=7\nttl_ms=30000\nrenew=1\nmax_hold_end_unix_ms=none\nmode=plain\n";
    let lock = DetachedLock::from_text(good).expect("the format to_text writes");
    assert_eq!(lock.name(), "a");
    assert_eq!(lock.fencing_token().get(), 7);
    assert_eq!(lock.to_text(), good, "written back the same");
    for (bad, names) in [
        (good.replace("lock 1", "lock 2"), "does not start"),
        (good.replace("token=0123", "token=zz23"), "token"),
        (good.replace("ttl_ms=30000", "ttl_ms=0"), "lease"),
        (good.replace("renew=1", "renew=yes"), "renew"),
        (good.replace("mode=plain", "mode=exclusive"), "mode"),
        (good.replace("name=a", "name=a{b}"), "lock name"),
        (good.replace("fence=7\n", ""), "no fence field"),
        (good.replace("mode=plain", "mode=reentrant "), "owner id"),
        (
            good.replace("mode=plain", "mode=reentrant a\tb"),
            "owner id",
        ),
    ] {
        let e = DetachedLock::from_text(&bad).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        let line = e.to_string();
        assert!(line.contains(names), "{line}");
        assert!(!line.contains("0123456789abcdef"), "{line}");
    }
}
