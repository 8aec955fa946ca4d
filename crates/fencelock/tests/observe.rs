//! Observability against real redis-server processes: the metrics a user would check
//! move as the locks are taken, waited for, handed over, released and lost (recorded by
//! a local `DebuggingRecorder`, so tests do not share a global recorder), and the
//! tracing output names the lock but never a holder token, an owner id or the password
//! of the Redis URL.

use std::collections::HashMap;
use std::time::Duration;

use fencelock::observe::{
    ACQUIRE_CONTENDED, ACQUIRE_DURATION, ACQUIRE_HANDOFFS, ACQUIRE_WAIT, LEASES_HELD, LEASES_LOST,
    RELEASE_DURATION, RELEASES, RENEWAL_BATCH_SIZE, RENEWAL_BATCHES, RENEWAL_DURATION, RENEWALS,
    WAITER_WAKEUPS,
};
use fencelock::{Client, Error, LossCause};
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use testkit::RedisServer;

mod common;
use common::eventually;

const SECOND: Duration = Duration::from_secs(1);

/// A metric's name and labels (sorted), as the tests name them.
type Id = (String, Vec<(String, String)>);

fn id(name: &str, labels: &[(&str, &str)]) -> Id {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    (name.to_owned(), labels)
}

/// What a `DebuggingRecorder` recorded so far. Each of its snapshots drains what it
/// returns (a counter's increments, a gauge's, a histogram's samples), so the totals
/// are kept here across snapshots (fencelock only increments and decrements its gauge).
struct Recorded {
    snapshotter: Snapshotter,
    counters: HashMap<Id, u64>,
    gauges: HashMap<Id, f64>,
    histograms: HashMap<Id, Vec<f64>>,
    /// The unit each metric was described with (`observe::describe`).
    units: HashMap<String, Unit>,
}

impl Recorded {
    fn new(snapshotter: Snapshotter) -> Self {
        Self {
            snapshotter,
            counters: HashMap::new(),
            gauges: HashMap::new(),
            histograms: HashMap::new(),
            units: HashMap::new(),
        }
    }

    fn refresh(&mut self) {
        for (key, unit, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            if let Some(unit) = unit {
                self.units.insert(key.name().to_owned(), unit);
            }
            let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let id = id(key.name(), &labels);
            match value {
                DebugValue::Counter(n) => *self.counters.entry(id).or_default() += n,
                DebugValue::Gauge(g) => *self.gauges.entry(id).or_default() += g.0,
                DebugValue::Histogram(samples) => self
                    .histograms
                    .entry(id)
                    .or_default()
                    .extend(samples.into_iter().map(|s| s.0)),
            }
        }
    }

    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.refresh();
        self.counters
            .get(&id(name, labels))
            .copied()
            .unwrap_or_default()
    }

    fn gauge(&mut self, name: &str) -> f64 {
        self.refresh();
        self.gauges.get(&id(name, &[])).copied().unwrap_or_default()
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.refresh();
        self.histograms
            .get(&id(name, labels))
            .cloned()
            .unwrap_or_default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const PLAIN: (&str, &str) = ("mode", "plain");

fn outcome(o: &str) -> (&str, &str) {
    ("outcome", o)
}

#[test]
fn metrics_follow_acquires_waits_handoffs_releases_and_losses() {
    let r = RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let mut m = Recorded::new(recorder.snapshotter());
    metrics::with_local_recorder(&recorder, || {
        runtime().block_on(async {
            fencelock::observe::describe();
            let c = Client::connect(&r.url()).await.unwrap();

            // Uncontended: one acquire, one release, nothing waited.
            let guard = c.lock("obs:free").try_acquire().await.unwrap();
            assert_eq!(m.gauge(LEASES_HELD), 1.0);
            guard.release().await.unwrap();
            assert_eq!(m.gauge(LEASES_HELD), 0.0);
            let took = m.histogram(ACQUIRE_DURATION, &[PLAIN, outcome("acquired")]);
            assert_eq!(took.len(), 1);
            assert!(took[0] > 0.0 && took[0] < 5.0, "{took:?}");
            assert_eq!(m.counter(ACQUIRE_CONTENDED, &[PLAIN]), 0);
            assert!(
                m.histogram(ACQUIRE_WAIT, &[PLAIN, outcome("acquired")])
                    .is_empty()
            );
            let release = [("kind", "release"), outcome("released")];
            assert_eq!(m.counter(RELEASES, &release), 1);
            assert_eq!(
                m.histogram(RELEASE_DURATION, &[outcome("released")]).len(),
                1
            );
            // Described with their units.
            assert_eq!(m.units.get(ACQUIRE_DURATION), Some(&Unit::Seconds));
            assert_eq!(m.units.get(RELEASES), Some(&Unit::Count));

            // Contention: a single attempt fails fast, a short wait runs out.
            let holder = c.lock("obs:busy").try_acquire().await.unwrap();
            let refused = c.lock("obs:busy").try_acquire().await.unwrap_err();
            assert!(refused.is_contention());
            assert_eq!(m.counter(ACQUIRE_CONTENDED, &[PLAIN]), 1);
            assert_eq!(
                m.histogram(ACQUIRE_DURATION, &[PLAIN, outcome("held")])
                    .len(),
                1
            );
            // A single attempt does not wait.
            assert!(
                m.histogram(ACQUIRE_WAIT, &[PLAIN, outcome("held")])
                    .is_empty()
            );
            let short = c.lock("obs:busy").wait(Duration::from_millis(100));
            assert!(short.acquire().await.unwrap_err().is_contention());
            let waited = m.histogram(ACQUIRE_WAIT, &[PLAIN, outcome("held")]);
            assert_eq!(waited.len(), 1);
            assert!(waited[0] >= 0.09 && waited[0] < 5.0, "{waited:?}");
            assert!(m.counter(WAITER_WAKEUPS, &[("by", "timer")]) >= 1);
            assert_eq!(
                m.histogram(ACQUIRE_DURATION, &[PLAIN, outcome("held")])
                    .len(),
                2
            );

            // A wait given up by the caller is an acquire cancelled.
            let forever = c.lock("obs:busy").wait_forever().acquire();
            assert!(
                tokio::time::timeout(Duration::from_millis(50), forever)
                    .await
                    .is_err()
            );
            let cancelled = m.histogram(ACQUIRE_DURATION, &[PLAIN, outcome("cancelled")]);
            assert_eq!(cancelled.len(), 1);

            // A handoff: a waiter asleep on the lock's channel gets it when it is released.
            let contended = m.counter(ACQUIRE_CONTENDED, &[PLAIN]);
            let waiter = tokio::spawn(c.lock("obs:busy").wait(10 * SECOND).acquire());
            // Its first attempt, and the one after it subscribed: then it sleeps.
            eventually("the waiter sleeps", 5 * SECOND, async || {
                m.counter(ACQUIRE_CONTENDED, &[PLAIN]) == contended + 2 && c.stats().waiters == 1
            })
            .await;
            let notified = m.counter(WAITER_WAKEUPS, &[("by", "notification")]);
            holder.release().await.unwrap();
            let handed = waiter.await.unwrap().unwrap();
            assert_eq!(m.counter(ACQUIRE_HANDOFFS, &[PLAIN]), 1);
            assert_eq!(
                m.counter(WAITER_WAKEUPS, &[("by", "notification")]),
                notified + 1
            );
            let waited = m.histogram(ACQUIRE_WAIT, &[PLAIN, outcome("acquired")]);
            assert_eq!(waited.len(), 1);
            assert!(waited[0] > 0.0 && waited[0] < 10.0, "{waited:?}");
            // obs:free, the holder, the waiter.
            let took = m.histogram(ACQUIRE_DURATION, &[PLAIN, outcome("acquired")]);
            assert_eq!(took.len(), 3);

            // A guard dropped unreleased is released in the background.
            drop(handed);
            c.flush().await;
            assert_eq!(
                m.counter(RELEASES, &[("kind", "drop"), outcome("released")]),
                1
            );
            assert_eq!(m.counter(RELEASES, &release), 2);

            // Modes are told apart.
            let fair = c.lock("obs:fair").fair().try_acquire().await.unwrap();
            fair.release().await.unwrap();
            let took = m.histogram(ACQUIRE_DURATION, &[("mode", "fair"), outcome("acquired")]);
            assert_eq!(took.len(), 1);

            // Leases lost: a key deleted by hand, and one overwritten by another owner.
            let lease = Duration::from_millis(300);
            let gone = c.lock("obs:gone").lease(lease).try_acquire().await.unwrap();
            let taken = c
                .lock("obs:taken")
                .lease(lease)
                .try_acquire()
                .await
                .unwrap();
            assert_eq!(m.gauge(LEASES_HELD), 2.0);
            r.cmd(&["DEL", "fencelock:{obs:gone}"]);
            r.cmd(&[
                "SET",
                "fencelock:{obs:taken}",
                "another-owner",
                "PX",
                "60000",
            ]);
            let gone_lost = tokio::time::timeout(2 * SECOND, gone.lost()).await;
            assert_eq!(gone_lost.unwrap(), LossCause::Deleted);
            let taken_lost = tokio::time::timeout(2 * SECOND, taken.lost()).await;
            assert_eq!(taken_lost.unwrap(), LossCause::TakenByOther);
            assert_eq!(m.counter(LEASES_LOST, &[("cause", "deleted")]), 1);
            assert_eq!(m.counter(LEASES_LOST, &[("cause", "taken_by_other")]), 1);
            assert!(m.counter(RENEWALS, &[outcome("lost")]) >= 2);
            let batches = m.counter(RENEWAL_BATCHES, &[]);
            assert!(batches >= 1);
            let sizes = m.histogram(RENEWAL_BATCH_SIZE, &[]);
            assert_eq!(sizes.len() as u64, batches);
            assert!(sizes.iter().all(|&s| (1.0..=2.0).contains(&s)), "{sizes:?}");
            let durations = m.histogram(RENEWAL_DURATION, &[]);
            assert_eq!(durations.len() as u64, batches);
            assert!(
                durations.iter().all(|&d| d > 0.0 && d < 2.0),
                "{durations:?}"
            );

            // Releasing a lost lease says so, and does not count the loss twice.
            for guard in [gone, taken] {
                let released = guard.release().await;
                assert!(
                    matches!(released, Err(Error::LeaseLost { .. })),
                    "{released:?}"
                );
            }
            assert_eq!(
                m.counter(RELEASES, &[("kind", "release"), outcome("lost")]),
                2
            );
            assert_eq!(m.histogram(RELEASE_DURATION, &[outcome("lost")]).len(), 2);
            assert_eq!(m.counter(LEASES_LOST, &[("cause", "deleted")]), 1);
            assert_eq!(m.counter(LEASES_LOST, &[("cause", "taken_by_other")]), 1);
            assert_eq!(m.gauge(LEASES_HELD), 0.0);

            // Redis unreachable: outcome `unavailable`.
            let nowhere = format!("redis://127.0.0.1:{}", testkit::free_port());
            let down = Client::builder(nowhere).connect_lazy().await.unwrap();
            let failed = down.lock("obs:down").try_acquire().await.unwrap_err();
            assert!(matches!(failed, Error::Unavailable { .. }), "{failed:?}");
            let took = m.histogram(ACQUIRE_DURATION, &[PLAIN, outcome("unavailable")]);
            assert_eq!(took.len(), 1);
        });
    });
}

const PASSWORD: &str = "SECRETMARKER";
const OWNER: &str = "OWNERMARKER";

#[test]
fn traces_name_the_lock_but_never_a_token_an_owner_or_the_password() {
    let r = RedisServer::builder()
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", r.port());
    // Every test's events of this binary land here, and are checked for secrets alike.
    let log = common::traces();
    let mut tokens: Vec<String> = Vec::new();
    {
        runtime().block_on(async {
            let c = Client::connect(&url).await.unwrap();
            let mut token = |g: &fencelock::LockGuard| tokens.push(g.holder_token().to_string());

            // Acquire, wait, hand over, release: plain and fair (whose release messages
            // carry the next waiter's token).
            for fair in [false, true] {
                let name = if fair {
                    "obs:fair-traced"
                } else {
                    "obs:traced"
                };
                let lock = |wait| {
                    let lock = c.lock(name).wait(wait);
                    if fair { lock.fair() } else { lock }
                };
                let holder = lock(Duration::ZERO).acquire().await.unwrap();
                token(&holder);
                assert!(lock(Duration::ZERO).acquire().await.is_err());
                let waiter = tokio::spawn(lock(10 * SECOND).acquire());
                eventually("the waiter subscribed", 5 * SECOND, async || {
                    c.stats().waiters == 1
                })
                .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                holder.release().await.unwrap();
                let handed = waiter.await.unwrap().unwrap();
                token(&handed);
                handed.release().await.unwrap();
            }

            // Reentrant holds of one owner.
            let reentrant = c.lock("obs:reentrant-traced").reentrant(OWNER);
            let first = reentrant.try_acquire().await.unwrap();
            let second = reentrant.try_acquire().await.unwrap();
            token(&first);
            token(&second);
            second.release().await.unwrap();
            first.release().await.unwrap();

            // A lease lost: its key deleted by hand.
            let lost = c
                .lock("obs:lost-traced")
                .lease(Duration::from_millis(300))
                .try_acquire()
                .await
                .unwrap();
            token(&lost);
            r.cmd_as(PASSWORD, &["DEL", "fencelock:{obs:lost-traced}"]);
            let cause = tokio::time::timeout(2 * SECOND, lost.lost()).await.unwrap();
            assert_eq!(cause, LossCause::Deleted);
            assert!(lost.release().await.is_err());

            // A guard dropped unreleased.
            let dropped = c.lock("obs:dropped-traced").try_acquire().await.unwrap();
            token(&dropped);
            drop(dropped);
            c.flush().await;
        });
    }
    let text = log.text();
    // Each (lock name, message) has a line of its own.
    for (lock, message) in [
        ("obs:traced", "waiting for the lock to be released"),
        ("obs:traced", "woken"),
        ("obs:traced", "lock acquired"),
        ("obs:traced", "lock released"),
        ("obs:fair-traced", "waiting for the lock to be released"),
        ("obs:fair-traced", "lock acquired"),
        ("obs:reentrant-traced", "lock acquired"),
        ("obs:reentrant-traced", "lock released"),
        ("obs:lost-traced", "lease lost"),
        ("obs:lost-traced", "release failed"),
        ("obs:dropped-traced", "lock released in the background"),
    ] {
        let lock = format!("\"{lock}\"");
        assert!(
            text.lines()
                .any(|l| l.contains(&lock) && l.contains(message)),
            "no {message:?} about {lock} in the trace:\n{text}"
        );
    }
    assert!(text.contains("renewal batch"), "{text}");
    assert!(text.contains("fencing_token="), "{text}");
    assert_eq!(tokens.len(), 8);
    let mut secrets: Vec<&str> = tokens.iter().map(String::as_str).collect();
    secrets.extend([PASSWORD, OWNER]);
    for secret in secrets {
        let leaks: Vec<&str> = text.lines().filter(|l| l.contains(secret)).collect();
        assert!(
            leaks.is_empty(),
            "{secret:?} is in the trace:\n{}",
            leaks.join("\n")
        );
    }
}
