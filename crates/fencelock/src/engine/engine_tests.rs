//! The acquire engine, run by its driver against a scripted fake of the nodes
//! ([`FakeNodes`]), under paused time: the interleavings that real servers give only when the timing happens to fall
//! that way (a lost reply, a late grant, a handover racing a cancel, a release heard
//! before the holder's lease ends). Each test names the interleaving it pins down; the
//! real-server tests (`tests/`) and the lab cover the same ground end to end.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::Request;
use super::driver::acquire;
use super::fake::{FakeNodes, ListingSent, Scripted, Sent, granted, held, held_by, unavailable};
use super::protocol::{Protocol, Undo};
use super::retry::Retry;
use crate::error::{Blocker, Error, UnavailableReason};
use crate::keys::LockKeys;
use crate::protocols::{Fair, Plain};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// An acquire of `stock` with `protocol`, waiting `wait` (`None`: for ever).
pub(super) fn request(protocol: Arc<dyn Protocol>, wait: Option<Duration>) -> Request<'static> {
    Request {
        name: "stock",
        keys: LockKeys::new("fl", "stock").unwrap(),
        protocol,
        ttl: 30 * S,
        wait,
        retry: Retry::default(),
        info: "",
        replicas: 0,
        renew: true,
    }
}

fn plain(wait: Option<Duration>) -> Request<'static> {
    request(Arc::new(Plain), wait)
}

/// Lets the other tasks run (without moving the paused clock) until `cond` holds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{what}: never happened");
}

/// `n` refusals by a holder whose lease ends in `left`.
fn refusals(n: usize, left: Duration) -> impl Iterator<Item = Scripted> {
    (0..n).map(move |_| Scripted::Now(held(left)))
}

/// The withdrawals (foreground or background) among what was sent.
fn withdrawals(sent: &[Sent]) -> Vec<Sent> {
    sent.iter()
        .filter(|s| matches!(s, Sent::Abandon { .. } | Sent::AbandonInBackground { .. }))
        .cloned()
        .collect()
}

#[tokio::test(start_paused = true)]
async fn granted_at_once_one_attempt_nothing_owed() {
    let nodes = FakeNodes::new([Scripted::Now(granted(7, 30 * S))]);
    let g = acquire(&nodes, plain(Some(Duration::ZERO))).await.unwrap();
    assert_eq!(g.grant.fence.get(), 7);
    assert_eq!(nodes.attempts(), 1);
    assert!(withdrawals(&nodes.sent()).is_empty(), "{:?}", nodes.sent());
}

#[tokio::test(start_paused = true)]
async fn held_without_a_wait_fails_at_once_and_owes_nothing() {
    let nodes = FakeNodes::new([Scripted::Now(held(9 * S))]);
    let e = acquire(&nodes, plain(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Held { blocked_by: Blocker::Lease(d), waited, .. } if d == 9 * S && waited.is_zero()),
        "{e:?}"
    );
    let sent = nodes.sent();
    assert_eq!(sent.len(), 1, "one attempt, no subscription: {sent:?}");
    assert!(withdrawals(&sent).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_lost_reply_then_held_is_withdrawn_when_the_wait_runs_out() {
    // The first attempt times out (its grant may have landed); the next ones find the
    // lock held until the wait ends: the unknown first attempt is withdrawn then.
    let nodes = FakeNodes::new(
        std::iter::once(Scripted::Now(unavailable(UnavailableReason::TimedOut)))
            .chain(refusals(10, 10 * S)),
    );
    let e = acquire(&nodes, plain(Some(2 * S))).await.unwrap_err();
    assert!(matches!(e, Error::Held { .. }), "{e:?}");
    let w = withdrawals(&nodes.sent());
    assert!(
        matches!(
            w.as_slice(),
            [Sent::Abandon {
                undo: Undo::Withdraw,
                ..
            }]
        ),
        "{w:?}"
    );
    // Every attempt asked with one token: a late grant and a retry are one grant.
    let tokens: Vec<String> = nodes
        .sent()
        .into_iter()
        .filter_map(|s| match s {
            Sent::Attempt { token, .. } => Some(token),
            _ => None,
        })
        .collect();
    assert!(tokens.windows(2).all(|w| w[0] == w[1]), "{tokens:?}");
}

#[tokio::test(start_paused = true)]
async fn a_grant_found_by_the_retry_after_a_lost_reply_owes_nothing() {
    // The reply of the first attempt was lost, the retry finds the token in the key (the
    // late grant): one grant, nothing to withdraw.
    let nodes = FakeNodes::new([
        Scripted::Now(unavailable(UnavailableReason::TimedOut)),
        Scripted::Now(granted(11, 30 * S)),
    ]);
    let g = acquire(&nodes, plain(Some(5 * S))).await.unwrap();
    assert_eq!(g.grant.fence.get(), 11);
    assert!(withdrawals(&nodes.sent()).is_empty(), "{:?}", nodes.sent());
}

#[tokio::test(start_paused = true)]
async fn an_attempt_a_stalled_node_did_not_send_owes_no_withdrawal() {
    let nodes = FakeNodes::new([Scripted::Now(unavailable(UnavailableReason::Stalled))]);
    let e = acquire(&nodes, plain(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unavailable {
                reason: UnavailableReason::Stalled,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(withdrawals(&nodes.sent()).is_empty(), "{:?}", nodes.sent());
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_without_a_wait_is_withdrawn_before_the_error() {
    let nodes = FakeNodes::new([Scripted::Now(unavailable(UnavailableReason::TimedOut))]);
    let e = acquire(&nodes, plain(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(
        matches!(
            withdrawals(&nodes.sent()).as_slice(),
            [Sent::Abandon {
                undo: Undo::Withdraw,
                ..
            }]
        ),
        "{:?}",
        nodes.sent()
    );
}

#[tokio::test(start_paused = true)]
async fn an_acquire_dropped_with_its_attempt_in_flight_withdraws_in_the_background() {
    let nodes = FakeNodes::new([Scripted::Never]);
    let attempt = acquire(&nodes, plain(Some(Duration::ZERO)));
    // The attempt hangs; the caller gives up.
    assert!(
        tokio::time::timeout(S, attempt).await.is_err(),
        "no answer came"
    );
    let w = withdrawals(&nodes.sent());
    assert!(
        matches!(w.as_slice(), [Sent::AbandonInBackground { .. }]),
        "{w:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_subscribes_then_tries_once_more_before_it_sleeps() {
    // The refusal it sleeps on came after its subscription: no release can go unheard.
    let nodes = FakeNodes::new([
        Scripted::Now(held(3 * S)),
        Scripted::Now(held(3 * S)),
        Scripted::Now(granted(5, 30 * S)),
    ]);
    acquire(&nodes, plain(Some(10 * S))).await.unwrap();
    let sent = nodes.sent();
    let subscribe_at = sent
        .iter()
        .position(|s| matches!(s, Sent::Subscribe { .. }))
        .expect("subscribed");
    let attempts_before = sent[..subscribe_at]
        .iter()
        .filter(|s| matches!(s, Sent::Attempt { .. }))
        .count();
    assert_eq!(attempts_before, 1, "{sent:?}");
    let times = nodes.attempt_times();
    assert_eq!(
        times[1], times[0],
        "the second attempt right after subscribing"
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_release_message_the_waiter_tries_when_the_holders_lease_ends() {
    let nodes = FakeNodes::new([
        Scripted::Now(held(2 * S)),
        Scripted::Now(held(2 * S)),
        Scripted::Now(granted(5, 30 * S)),
    ]);
    let start = Instant::now();
    acquire(&nodes, plain(Some(10 * S))).await.unwrap();
    let times = nodes.attempt_times();
    assert_eq!(times[2] - start, 2 * S + MS, "the lease left, and 1 ms");
}

#[tokio::test(start_paused = true)]
async fn a_release_message_wakes_the_waiter_long_before_the_holders_lease_ends() {
    let nodes = Arc::new(FakeNodes::new([
        Scripted::Now(held(20 * S)),
        Scripted::Now(held(20 * S)),
        Scripted::Now(granted(5, 30 * S)),
    ]));
    let channel = LockKeys::new("fl", "stock").unwrap().channel();
    let waiting = tokio::spawn({
        let nodes = nodes.clone();
        async move {
            acquire(&*nodes, plain(Some(60 * S)))
                .await
                .map(|g| g.grant.fence)
        }
    });
    until("asleep after its second attempt", || nodes.attempts() == 2).await;
    tokio::time::sleep(S).await;
    assert_eq!(nodes.attempts(), 2, "still asleep a second later");
    nodes.publish(&channel, b"");
    let fence = waiting.await.unwrap().unwrap();
    assert_eq!(fence.get(), 5);
    let times = nodes.attempt_times();
    assert!(
        times[2] - times[1] < 2 * S,
        "woken at the release, not at the lease's end"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fair_handover_grants_without_an_attempt_of_its_own() {
    // Fair mode: refused (a queue ahead, the counter at 10); the release hands the lock
    // to this waiter (token 11) on its client's own channel.
    let fair: Arc<dyn Protocol> = Arc::new(Fair::new(3 * S));
    let nodes = Arc::new(FakeNodes::new([
        Scripted::Now(held_by(Blocker::Queue, Some(10))),
        Scripted::Now(held_by(Blocker::Queue, Some(10))),
    ]));
    let waiting = tokio::spawn({
        let nodes = nodes.clone();
        async move { acquire(&*nodes, request(fair, Some(60 * S))).await }
    });
    until("asleep after its second attempt", || nodes.attempts() == 2).await;
    let token = match &nodes.sent()[0] {
        Sent::Attempt { token, .. } => token.clone(),
        other => panic!("{other:?}"),
    };
    let own = format!(
        "{}:{}",
        LockKeys::new("fl", "stock").unwrap().channel(),
        "00000000000000aa"
    );
    nodes.publish(&own, format!("G {token} 11 30000").as_bytes());
    let g = waiting.await.unwrap().unwrap();
    assert_eq!(g.grant.fence.get(), 11);
    assert_eq!(g.grant.ttl, 30 * S);
    assert_eq!(nodes.attempts(), 2, "no attempt after the handover");
    assert!(withdrawals(&nodes.sent()).is_empty(), "{:?}", nodes.sent());
}

#[tokio::test(start_paused = true)]
async fn a_handover_older_than_the_last_refusal_is_not_trusted() {
    // Its token (9) is not above the counter the last refusal saw (10): a stale message,
    // read late. The waiter asks again instead.
    let fair: Arc<dyn Protocol> = Arc::new(Fair::new(3 * S));
    let nodes = Arc::new(FakeNodes::new([
        Scripted::Now(held_by(Blocker::Queue, Some(10))),
        Scripted::Now(held_by(Blocker::Queue, Some(10))),
        Scripted::Now(granted(12, 30 * S)),
    ]));
    let waiting = tokio::spawn({
        let nodes = nodes.clone();
        async move { acquire(&*nodes, request(fair, Some(60 * S))).await }
    });
    until("asleep after its second attempt", || nodes.attempts() == 2).await;
    let token = match &nodes.sent()[0] {
        Sent::Attempt { token, .. } => token.clone(),
        other => panic!("{other:?}"),
    };
    let own = format!(
        "{}:{}",
        LockKeys::new("fl", "stock").unwrap().channel(),
        "00000000000000aa"
    );
    nodes.publish(&own, format!("G {token} 9 30000").as_bytes());
    let g = waiting.await.unwrap().unwrap();
    assert_eq!(g.grant.fence.get(), 12, "from its own attempt");
    assert_eq!(nodes.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_handover_racing_a_cancel_is_withdrawn() {
    // The release hands the lock over while the waiter's caller drops it: the grant it
    // never took (and its place in the queue) is withdrawn.
    let fair: Arc<dyn Protocol> = Arc::new(Fair::new(3 * S));
    let nodes = Arc::new(FakeNodes::new([
        Scripted::Now(held_by(Blocker::Queue, Some(10))),
        Scripted::Now(held_by(Blocker::Queue, Some(10))),
    ]));
    let waiting = tokio::spawn({
        let nodes = nodes.clone();
        async move { acquire(&*nodes, request(fair, Some(60 * S))).await }
    });
    until("asleep after its second attempt", || nodes.attempts() == 2).await;
    let token = match &nodes.sent()[0] {
        Sent::Attempt { token, .. } => token.clone(),
        other => panic!("{other:?}"),
    };
    let own = format!(
        "{}:{}",
        LockKeys::new("fl", "stock").unwrap().channel(),
        "00000000000000aa"
    );
    nodes.publish(&own, format!("G {token} 11 30000").as_bytes());
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    let w = withdrawals(&nodes.sent());
    assert!(
        matches!(w.as_slice(), [Sent::AbandonInBackground { token: t }] if *t == token),
        "{w:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_plain_waiter_woken_by_name_and_beaten_goes_back_to_the_head_of_the_list() {
    let nodes = Arc::new(FakeNodes::new([
        Scripted::Now(held(20 * S)),
        Scripted::Now(held(20 * S)),
        Scripted::Now(held(20 * S)),
        Scripted::Now(granted(5, 30 * S)),
    ]));
    let own = format!(
        "{}:{}",
        LockKeys::new("fl", "stock").unwrap().channel(),
        "00000000000000aa"
    );
    let waiting = tokio::spawn({
        let nodes = nodes.clone();
        async move { acquire(&*nodes, plain(Some(60 * S))).await }
    });
    tokio::time::sleep(100 * MS).await;
    // Woken by name: its next attempt is refused (another caller took the free lock).
    nodes.publish(&own, b"");
    tokio::time::sleep(100 * MS).await;
    nodes.publish(&own, b"");
    waiting.await.unwrap().unwrap();
    let listings: Vec<Option<ListingSent>> = nodes
        .sent()
        .into_iter()
        .filter_map(|s| match s {
            Sent::Attempt { listing, .. } => Some(listing),
            _ => None,
        })
        .collect();
    let front = |l: &Option<ListingSent>| l.is_some_and(|l| l.front);
    assert_eq!(listings[0], None, "the first attempt: not a waiter yet");
    assert!(
        listings[1].is_some() && !front(&listings[1]),
        "{listings:?}"
    );
    assert!(
        front(&listings[2]),
        "woken by name: back to the head: {listings:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_leaves_without_the_lock_takes_its_client_off_the_wake_list() {
    let nodes = FakeNodes::new(refusals(10, 20 * S));
    acquire(&nodes, plain(Some(S))).await.unwrap_err();
    assert!(nodes.sent().contains(&Sent::Unlist), "{:?}", nodes.sent());
}

#[tokio::test(start_paused = true)]
async fn too_few_replicas_take_the_grant_back_and_say_how_many() {
    let nodes = FakeNodes::new([Scripted::Now(granted(5, 30 * S))]).replicas([Ok((1, 100 * MS))]);
    let mut req = plain(Some(Duration::ZERO));
    req.replicas = 2;
    let e = acquire(&nodes, req).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unreplicated {
                wanted: 2,
                acknowledged: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        matches!(
            withdrawals(&nodes.sent()).as_slice(),
            [Sent::Abandon {
                undo: Undo::TakeBack,
                ..
            }]
        ),
        "{:?}",
        nodes.sent()
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_node_is_waited_out_until_the_deadline_and_its_error_returned() {
    let nodes = FakeNodes::new(
        (0..100).map(|_| Scripted::After(100 * MS, unavailable(UnavailableReason::TimedOut))),
    )
    .without_pub_sub();
    let start = Instant::now();
    let e = acquire(&nodes, plain(Some(2 * S))).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    let took = start.elapsed();
    assert!(took >= 2 * S && took < 3 * S, "{took:?}");
    assert!(nodes.attempts() > 2, "retried while it waited");
    assert!(
        matches!(
            withdrawals(&nodes.sent()).as_slice(),
            [Sent::Abandon {
                undo: Undo::Withdraw,
                ..
            }]
        ),
        "its unanswered attempts withdrawn: {:?}",
        nodes.sent()
    );
}

#[tokio::test(start_paused = true)]
async fn a_certificate_problem_ends_a_wait_at_once() {
    let nodes = FakeNodes::new([Scripted::Now(unavailable(UnavailableReason::Tls))]);
    let e = acquire(&nodes, plain(Some(60 * S))).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unavailable {
                reason: UnavailableReason::Tls,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(nodes.attempts(), 1);
}

/// A majority down: the quorum failed with nodes that timed out, whose take-back the
/// backend sent but nobody heard. The caller hears at once; the withdrawal that backs the
/// take-back up goes in the background, not in front of the error (which would make the
/// caller wait for the dead nodes once more).
#[tokio::test(start_paused = true)]
async fn a_quorum_lost_to_timed_out_nodes_fails_at_once_and_withdraws_in_the_background() {
    let nodes = FakeNodes::new([Scripted::Now(super::fake::no_quorum_with_nodes_timed_out())]);
    let started = Instant::now();
    let e = acquire(&nodes, plain(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoQuorum { .. }), "{e:?}");
    assert_eq!(started.elapsed(), Duration::ZERO);
    let token = match &nodes.sent()[0] {
        Sent::Attempt { token, .. } => token.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        withdrawals(&nodes.sent()),
        [Sent::AbandonInBackground { token }],
        "{:?}",
        nodes.sent()
    );
}

/// Too few replicas, and the take-back of the grant fails too (the master went away
/// during `WAIT`): the error comes after that one take-back, not after a second
/// withdrawal in front of the caller; what is still owed goes to the background.
#[tokio::test(start_paused = true)]
async fn too_few_replicas_and_a_failed_take_back_leave_the_rest_to_the_background() {
    let nodes = FakeNodes::new([Scripted::Now(granted(5, 30 * S))])
        .replicas([Ok((1, 100 * MS))])
        .failing_withdrawals();
    let mut req = plain(Some(Duration::ZERO));
    req.replicas = 2;
    let e = acquire(&nodes, req).await.unwrap_err();
    assert!(matches!(e, Error::Unreplicated { .. }), "{e:?}");
    assert!(
        matches!(
            withdrawals(&nodes.sent()).as_slice(),
            [
                Sent::Abandon {
                    undo: Undo::TakeBack,
                    ..
                },
                Sent::AbandonInBackground { .. }
            ]
        ),
        "{:?}",
        nodes.sent()
    );
}

/// A multi-lock's refusal at place `at` of its call, by a lease with 20 s left.
fn held_at(at: usize) -> Scripted {
    Scripted::Now(Ok(super::Outcome::Held {
        refusal: super::Refusal {
            at: Some(at),
            ..super::Refusal::by(Blocker::Lease(20 * S))
        },
        nodes: Vec::new(),
    }))
}

#[tokio::test(start_paused = true)]
async fn a_multi_lock_waits_for_the_name_that_refused_it_and_follows_a_new_one() {
    let (a, b) = (
        LockKeys::new("fl", "a").unwrap(),
        LockKeys::new("fl", "b").unwrap(),
    );
    let multi: Arc<dyn Protocol> =
        Arc::new(crate::protocols::Multi::new(vec![a.clone(), b.clone()]));
    let nodes = FakeNodes::new([
        held_at(1),
        held_at(1),
        held_at(0),
        held_at(0),
        Scripted::Now(granted(5, 30 * S)),
    ]);
    let g = acquire(&nodes, request(multi.clone(), Some(60 * S)))
        .await
        .unwrap();
    assert_eq!(g.grant.fence.get(), 5);
    let subscribed: Vec<String> = nodes
        .sent()
        .into_iter()
        .filter_map(|s| match s {
            Sent::Subscribe { channel } => Some(channel),
            _ => None,
        })
        .collect();
    let own = |k: &LockKeys| k.own_channel("00000000000000aa");
    assert_eq!(
        subscribed,
        [b.channel(), own(&b), a.channel(), own(&a)],
        "b's channels while b refused it, then a's"
    );
    // Each subscription is followed by one more attempt before a sleep.
    let times = nodes.attempt_times();
    assert_eq!(times[1], times[0]);
    assert_eq!(times[3], times[2]);

    // A wait that runs out names the name that refused it last.
    let nodes = FakeNodes::new([held_at(1), held_at(1), held_at(1)]);
    match acquire(&nodes, request(multi, Some(S))).await {
        Err(Error::Held { name, .. }) => assert_eq!(name, "b"),
        other => panic!("{other:?}"),
    }
}
