//! The watchdog: keeps the leases of held locks alive while their guards live, and tells
//! each holder the moment its lease is lost.
//!
//! One task per client serves every lease. It wakes on a fixed tick (a sixth of the
//! shortest renewed lease) and renews, in batches, every lease that falls due before the
//! next tick: one `renew.lua` call per node carries up to [`BATCH`] leases, so 100,000
//! held locks cost about 100 calls per renewal round. A lease is renewed once a third of
//! its length has passed since the last renewal was sent (up to one tick earlier); a
//! failed renewal is retried on the next tick. A guard that is released or dropped unregisters its
//! lease synchronously: no renewal is sent for it afterwards.
//!
//! The loss signal fires when a renewal finds the key gone or someone else's, or when no
//! renewal was confirmed and the lease is about to run out by the local monotonic clock
//! (at `valid_until` minus a tenth of the lease, at most 1 s), whether or not Redis ever
//! answers. `valid_until` only moves forward when Redis confirmed a renewal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use futures_util::future::join_all;

use crate::algorithms::quorum::Quorum;
use crate::algorithms::single_node::{drift, lease_end};
use crate::backend::Node;
use crate::error::LossCause;
use crate::scripts;

/// Leases per `renew.lua` call.
pub(crate) const BATCH: usize = 1000;

/// The watchdog of one client.
#[derive(Clone)]
pub(crate) struct Watchdog {
    inner: Arc<Inner>,
}

struct Inner {
    /// One node, or the Redlock nodes.
    nodes: Vec<Node>,
    quorum: Option<Quorum>,
    leases: Mutex<Leases>,
    /// Wakes the task: a lease was added that needs a shorter tick.
    changed: Notify,
    /// The task's current tick, in ms.
    tick_ms: AtomicU64,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Leases {
    by_id: HashMap<u64, Arc<Lease>>,
    /// The task, while it runs. A runtime that shut down takes its tasks with it, so a
    /// finished handle means the next lease starts a new task.
    task: Option<tokio::task::JoinHandle<()>>,
}

/// One held lock's lease, shared by its guard and the watchdog.
pub(crate) struct Lease {
    key: String,
    token: String,
    ttl: Duration,
    /// `false` for a fixed lease: watched for expiry, never renewed.
    renew: bool,
    /// Renewals stop here (the maximum hold); the lease then runs out.
    hold_until: Option<Instant>,
    state: Mutex<State>,
    lost: CancellationToken,
    cause: OnceLock<LossCause>,
}

struct State {
    valid_until: Instant,
    /// When the next renewal is due.
    next_renewal: Instant,
    in_flight: bool,
}

/// Keeps a lease watched; dropping it stops the watch at once.
pub(crate) struct Registration {
    inner: Weak<Inner>,
    id: u64,
    lease: Arc<Lease>,
}

impl Watchdog {
    pub fn new(nodes: Vec<Node>, quorum: Option<Quorum>) -> Self {
        Self {
            inner: Arc::new(Inner {
                nodes,
                quorum,
                leases: Mutex::new(Leases::default()),
                changed: Notify::new(),
                tick_ms: AtomicU64::new(u64::MAX),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// Starts watching a lease granted until `valid_until`, whose request was sent at
    /// `sent_at`.
    #[allow(clippy::too_many_arguments)]
    pub fn watch(
        &self,
        key: String,
        token: String,
        ttl: Duration,
        renew: bool,
        hold_until: Option<Instant>,
        sent_at: Instant,
        valid_until: Instant,
    ) -> Registration {
        let lease = Arc::new(Lease {
            key,
            token,
            ttl,
            renew,
            hold_until,
            state: Mutex::new(State {
                valid_until,
                next_renewal: sent_at + ttl / 3,
                in_flight: false,
            }),
            lost: CancellationToken::new(),
            cause: OnceLock::new(),
        });
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let mut leases = lock(&self.inner.leases);
        leases.by_id.insert(id, lease.clone());
        if leases.task.as_ref().is_none_or(|t| t.is_finished()) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => leases.task = Some(rt.spawn(run(Arc::downgrade(&self.inner)))),
                Err(_) => tracing::warn!("no Tokio runtime: the lease is not renewed"),
            }
        }
        drop(leases);
        // A lease whose renewal or loss falls before the next tick needs an earlier one.
        let tick = Duration::from_millis(self.inner.tick_ms.load(Ordering::Relaxed));
        if !renew || ttl / 6 < tick {
            self.inner.changed.notify_one();
        }
        Registration {
            inner: Arc::downgrade(&self.inner),
            id,
            lease,
        }
    }

    /// How many leases are watched.
    pub fn len(&self) -> usize {
        lock(&self.inner.leases).by_id.len()
    }
}

impl Registration {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn lease_arc(&self) -> Arc<Lease> {
        self.lease.clone()
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.lease.key)
            .field("ttl", &self.lease.ttl)
            .field("renew", &self.lease.renew)
            .field("valid_until", &self.lease.valid_until())
            .field("lost", &self.lease.cause())
            .finish()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            lock(&inner.leases).by_id.remove(&self.id);
        }
    }
}

impl Lease {
    pub fn valid_until(&self) -> Instant {
        lock(&self.state).valid_until
    }

    /// Records an extend that Redis confirmed (a manual one).
    pub fn extended(&self, sent_at: Instant, valid_until: Instant) {
        let mut st = lock(&self.state);
        st.valid_until = valid_until;
        st.next_renewal = sent_at + self.ttl / 3;
    }

    pub fn lose(&self, cause: LossCause) {
        if self.cause.set(cause).is_ok() {
            tracing::warn!(key = %self.key, %cause, "lease lost");
        }
        self.lost.cancel();
    }

    pub fn cause(&self) -> Option<LossCause> {
        self.cause.get().copied()
    }

    pub fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// When to give up on a lease whose renewal Redis has not confirmed: a little before
    /// `valid_until`, so the holder can stop before the lease really ends.
    fn loss_deadline(&self, valid_until: Instant) -> Instant {
        let margin = (self.ttl / 10).min(Duration::from_secs(1));
        valid_until.checked_sub(margin).unwrap_or(valid_until)
    }

    /// The TTL the next renewal asks for (shortened to end at the maximum hold), or
    /// `None` if the lease must not be renewed any more.
    fn renewal_ttl(&self, now: Instant) -> Option<Duration> {
        let ttl = match self.hold_until {
            Some(end) => self.ttl.min(end.saturating_duration_since(now)),
            None => self.ttl,
        };
        let ttl = Duration::from_millis(ttl.as_millis() as u64);
        (ttl >= Duration::from_millis(1)).then_some(ttl)
    }
}

/// The watchdog task. It runs on a fixed tick (a sixth of the shortest renewed lease),
/// and on each tick renews, in batches, every lease that would fall due before the next
/// tick, so leases taken at scattered times still share calls. Losses are checked on
/// the tick and at each lease's own deadline. Ends when no lease is left (the next one
/// starts it again).
async fn run(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let changed = inner.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let now = Instant::now();
        let mut due: Vec<(Arc<Lease>, Duration)> = Vec::new();
        let mut tick = Duration::from_secs(10);
        let mut wake;
        {
            let mut leases = lock(&inner.leases);
            if leases.by_id.is_empty() {
                leases.task = None;
                return;
            }
            for lease in leases.by_id.values() {
                if lease.renew {
                    tick = tick.min(lease.ttl / 6);
                }
            }
            tick = tick.max(Duration::from_millis(5));
            inner
                .tick_ms
                .store(tick.as_millis() as u64, Ordering::Relaxed);
            wake = now + tick;
            for lease in leases.by_id.values() {
                if lease.lost.is_cancelled() {
                    continue;
                }
                let mut st = lock(&lease.state);
                let give_up = lease.loss_deadline(st.valid_until);
                if now >= give_up {
                    let cause = if !lease.renew {
                        LossCause::Expired
                    } else if lease
                        .hold_until
                        .is_some_and(|end| st.valid_until + drift(lease.ttl) >= end)
                    {
                        // Renewed right up to the maximum hold: it ran out as asked.
                        LossCause::MaxHold
                    } else {
                        LossCause::Unconfirmed
                    };
                    drop(st);
                    lease.lose(cause);
                    continue;
                }
                wake = wake.min(give_up);
                if !lease.renew || st.in_flight || st.next_renewal > now + tick {
                    continue;
                }
                if let Some(ttl) = lease.renewal_ttl(now) {
                    st.in_flight = true;
                    due.push((lease.clone(), ttl));
                }
            }
        }
        while !due.is_empty() {
            let batch: Vec<_> = due.drain(..due.len().min(BATCH)).collect();
            tokio::spawn(renew(inner.clone(), batch));
        }
        // Holding `inner` while asleep is fine: the task ends once no lease is left.
        tokio::select! {
            () = tokio::time::sleep_until(wake.into()) => {}
            () = changed => {}
        }
    }
}

/// Sends one batch (to every node, for Redlock) and applies the answers. A lease is
/// renewed when a majority confirmed it; lost when so many nodes said it is gone that no
/// majority can confirm it; otherwise retried on the next tick.
async fn renew(inner: Arc<Inner>, batch: Vec<(Arc<Lease>, Duration)>) {
    let sent_at = Instant::now();
    let invocation = scripts::renew(
        batch
            .iter()
            .map(|(l, ttl)| (l.key.as_str(), l.token.as_str(), *ttl)),
    );
    let shortest = batch.iter().map(|(_, ttl)| *ttl).min().unwrap_or_default();
    let size = batch.len();
    let answers: Vec<Option<Vec<i64>>> = join_all(inner.nodes.iter().map(|node| {
        let invocation = &invocation;
        let within = inner
            .quorum
            .as_ref()
            .map(|q| q.node_timeout(shortest));
        async move {
            let answer: Result<Vec<i64>, _> = match within {
                Some(within) => node.run_within(within, invocation).await,
                None => node.run(invocation).await,
            };
            match answer {
                Ok(codes) if codes.len() == size => Some(codes),
                Ok(_) => None,
                Err(e) => {
                    tracing::debug!(node = node.addr(), error = %e, leases = size, "renewal failed; retrying");
                    None
                }
            }
        }
    }))
    .await;
    let n = inner.nodes.len();
    let majority = n / 2 + 1;
    let now = Instant::now();
    for (i, (lease, ttl)) in batch.iter().enumerate() {
        let codes = answers.iter().flatten().map(|codes| codes[i]);
        let (mut renewed, mut gone, mut taken) = (0, 0, 0);
        for code in codes {
            match code {
                1 => renewed += 1,
                0 => gone += 1,
                _ => taken += 1,
            }
        }
        let mut st = lock(&lease.state);
        st.in_flight = false;
        let valid_until = lease_end(sent_at, *ttl);
        if renewed >= majority && valid_until > now {
            st.valid_until = st.valid_until.max(valid_until);
            st.next_renewal = sent_at + lease.ttl / 3;
        } else if gone + taken > n - majority {
            drop(st);
            lease.lose(if taken > 0 {
                LossCause::TakenByOther
            } else {
                LossCause::Expired
            });
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
