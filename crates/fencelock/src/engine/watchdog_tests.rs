//! The watchdog against a fake [`Renewer`] under paused time: when it renews, what each
//! answer does to the lease, and when the loss signal fires without one. The same
//! behaviours are tested against real servers in `tests/lease.rs`.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::watchdog::{Registration, Renewal, Renewer, Watchdog};
use super::{Grant, clock, lease_end};
use crate::error::LossCause;
use crate::token::FencingToken;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// What the fake answers for every lease of a batch.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// Confirmed: the lease ends its TTL (less the drift) after the send.
    Renew,
    /// The nodes said it is gone.
    Lost(LossCause),
    /// Too few answers.
    Unknown,
}

/// A renewer whose batches are answered by a script (the last answer repeated), and a
/// log of when each batch went out and how many leases it carried.
struct Fake {
    answers: Mutex<VecDeque<Answer>>,
    batches: Mutex<Vec<(Instant, usize)>>,
    /// What the nodes say the counter is, for a key found gone early.
    counter: Option<u64>,
}

impl Fake {
    fn new(answers: impl IntoIterator<Item = Answer>) -> Self {
        Self {
            answers: Mutex::new(answers.into_iter().collect()),
            batches: Mutex::new(Vec::new()),
            counter: None,
        }
    }

    fn with_counter(mut self, counter: u64) -> Self {
        self.counter = Some(counter);
        self
    }
}

impl Renewer for &'static Fake {
    fn renewal_group(&self, _key: &str) -> Option<String> {
        None
    }

    async fn renew(&self, leases: &[(&str, &str, Duration)]) -> Vec<Renewal> {
        let sent_at = clock();
        self.batches.lock().unwrap().push((sent_at, leases.len()));
        let answer = {
            let mut answers = self.answers.lock().unwrap();
            match answers.len() {
                0 => Answer::Renew,
                1 => answers[0],
                _ => answers.pop_front().unwrap(),
            }
        };
        leases
            .iter()
            .map(|(_, _, ttl)| match answer {
                Answer::Renew => Renewal::Renewed {
                    valid_until: lease_end(sent_at, *ttl),
                },
                Answer::Lost(cause) => Renewal::Lost(cause),
                Answer::Unknown => Renewal::Unknown,
            })
            .collect()
    }

    async fn counter(&self, _key: &str) -> Option<u64> {
        self.counter
    }

    fn node_count(&self) -> usize {
        1
    }
}

/// A watchdog on `fake` (leaked: the watchdog's task outlives the test's borrow).
fn watchdog(fake: Fake) -> (Watchdog<&'static Fake>, &'static Fake) {
    let fake: &'static Fake = Box::leak(Box::new(fake));
    (Watchdog::new(fake, 1000), fake)
}

/// Watches a lease of `ttl` (fencing token 5, one holder at a time) granted now.
fn watch(
    w: &Watchdog<&'static Fake>,
    ttl: Duration,
    renew: bool,
    hold: Option<Duration>,
) -> Registration {
    let now = clock();
    let grant = Grant::new(FencingToken::new(5), now, ttl);
    let hold_until = hold.map(|h| now + h);
    let capped = hold.is_some_and(|h| h <= ttl);
    w.watch(
        "fl:{stock}".to_owned(),
        "token".to_owned(),
        true,
        ttl,
        renew,
        hold_until,
        &grant,
        capped,
    )
}

/// When each batch went out, from `start`.
fn sent(fake: &Fake, start: Instant) -> Vec<Duration> {
    fake.batches
        .lock()
        .unwrap()
        .iter()
        .map(|(at, _)| *at - start)
        .collect()
}

/// Lets the watchdog run for `d` of paused time.
async fn run_for(d: Duration) {
    tokio::time::sleep(d).await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_is_renewed_every_third_of_it_and_kept() {
    let (w, fake) = watchdog(Fake::new([]));
    let start = clock();
    let lease = watch(&w, 30 * S, true, None);
    run_for(95 * S).await;
    let at = sent(fake, start);
    assert_eq!(at.len(), 9, "{at:?}");
    // Between a quarter and a third of the lease after the last send (the first one
    // counts from the grant).
    let mut last = Duration::ZERO;
    for t in at {
        let gap = t - last;
        assert!(gap >= 30 * S / 4 && gap <= 10 * S, "{gap:?}");
        last = t;
    }
    assert_eq!(lease.lease().cause(), None);
    assert!(lease.lease().valid_until() > clock());
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_finds_another_holder_fires_the_loss_signal() {
    let (w, _fake) = watchdog(Fake::new([Answer::Lost(LossCause::TakenByOther)]));
    let start = clock();
    let lease = watch(&w, 30 * S, true, None);
    let lost = lease.lease().lost_token();
    tokio::time::timeout(11 * S, lost.cancelled())
        .await
        .expect("lost at the first renewal");
    assert_eq!(lease.lease().cause(), Some(LossCause::TakenByOther));
    assert!(clock() - start <= 10 * S);
}

#[tokio::test(start_paused = true)]
async fn a_key_gone_early_is_broken_when_the_counter_moved_past_its_token() {
    for (counter, cause) in [(9, LossCause::Broken), (5, LossCause::Deleted)] {
        let fake = Fake::new([Answer::Lost(LossCause::Expired)]).with_counter(counter);
        let (w, _fake) = watchdog(fake);
        let lease = watch(&w, 30 * S, true, None);
        let lost = lease.lease().lost_token();
        tokio::time::timeout(11 * S, lost.cancelled())
            .await
            .expect("lost at the first renewal");
        assert_eq!(lease.lease().cause(), Some(cause), "counter {counter}");
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_confirmed_renewal_the_loss_fires_before_the_lease_ends() {
    let (w, fake) = watchdog(Fake::new([Answer::Unknown]));
    let start = clock();
    let lease = watch(&w, 30 * S, true, None);
    let valid_until = lease.lease().valid_until();
    let lost = lease.lease().lost_token();
    tokio::time::timeout(31 * S, lost.cancelled())
        .await
        .expect("lost before the lease ends");
    assert_eq!(lease.lease().cause(), Some(LossCause::Unconfirmed));
    // A tenth of the lease before its end, at most 1 s: here 1 s.
    assert_eq!(clock(), valid_until - S);
    assert!(
        sent(fake, start).len() >= 2,
        "retried on the ticks meanwhile"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fixed_lease_is_never_renewed_and_expires() {
    let (w, fake) = watchdog(Fake::new([]));
    let start = clock();
    let lease = watch(&w, 2 * S, false, None);
    let lost = lease.lease().lost_token();
    tokio::time::timeout(3 * S, lost.cancelled())
        .await
        .expect("expired");
    assert_eq!(lease.lease().cause(), Some(LossCause::Expired));
    assert!(sent(fake, start).is_empty());
    // 2 s less the drift (22 ms), less a tenth of the lease.
    assert_eq!(clock() - start, 2 * S - 22 * MS - 200 * MS);
}

#[tokio::test(start_paused = true)]
async fn the_maximum_hold_caps_the_renewals_and_then_the_lease_runs_out() {
    let (w, fake) = watchdog(Fake::new([]));
    let start = clock();
    let lease = watch(&w, 3 * S, true, Some(5 * S));
    let lost = lease.lease().lost_token();
    tokio::time::timeout(6 * S, lost.cancelled())
        .await
        .expect("lost at the maximum hold");
    assert_eq!(lease.lease().cause(), Some(LossCause::MaxHold));
    assert!(clock() - start <= 5 * S, "before the maximum hold");
    // Batches carried each renewal until the hold; none asked past it.
    let at = sent(fake, start);
    assert!(!at.is_empty() && at.iter().all(|t| *t < 5 * S), "{at:?}");
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_not_renewed_any_more() {
    let (w, fake) = watchdog(Fake::new([]));
    let start = clock();
    let lease = watch(&w, 3 * S, true, None);
    run_for(2500 * MS).await;
    let before = sent(fake, start).len();
    assert!(before >= 2, "renewed while held");
    drop(lease);
    run_for(10 * S).await;
    assert_eq!(sent(fake, start).len(), before);
    assert_eq!(w.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn leases_due_together_share_one_batch() {
    let (w, fake) = watchdog(Fake::new([]));
    let start = clock();
    let leases: Vec<Registration> = (0..5).map(|_| watch(&w, 30 * S, true, None)).collect();
    run_for(11 * S).await;
    let batches = fake.batches.lock().unwrap().clone();
    assert_eq!(batches.len(), 1, "{batches:?}");
    assert_eq!(batches[0].1, 5);
    assert!(batches[0].0 - start <= 10 * S);
    drop(leases);
}
