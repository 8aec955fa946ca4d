//! The watchdog: keeps the leases of held locks alive while their guards live, and tells
//! each holder the moment its lease is lost.
//!
//! One task per client serves every lease. It wakes on a fixed tick (a sixth of the
//! shortest renewed lease), and at each lease's own renewal time, and renews, in
//! batches, every lease that falls due within half a tick: one `renew.lua` call per
//! node carries up to
//! [`RENEWAL_BATCH`](crate::limits::RENEWAL_BATCH) leases (the client's
//! [`renewal_batch`](crate::ClientBuilder::renewal_batch)), so 100,000 held locks cost
//! about 100 calls per renewal round, sent one after another (a call sent meanwhile waits
//! behind one batch, not a round). On a cluster the leases are grouped by the master that
//! serves them first: each call goes to one master with a full batch, and the masters
//! are renewed at once. A lease is renewed once a
//! third of its length has passed since the last renewal was sent, or up to half a tick
//! (a twelfth of the shortest lease) earlier, to share a call with a lease renewed then:
//! so a lease is renewed every third of it, to within a twelfth (between a quarter and a
//! third of it after the last renewal was sent). A failed renewal is retried on the next
//! tick. A guard that is released or
//! dropped unregisters its lease synchronously: no renewal is sent for it afterwards.
//!
//! The loss signal fires when a renewal finds the key gone or someone else's, or when no
//! renewal was confirmed and the lease is about to run out by the local monotonic clock
//! (at `valid_until` minus a tenth of the TTL last granted, at most 1 s), whether or not
//! Redis ever answers. `valid_until` only moves forward when Redis confirmed a renewal.
//!
//! The task sleeps until the earliest of its next tick, every lease's loss deadline and
//! every lease's next renewal. Anything that brings one of those before the wake it
//! chose (a new lease, such as one capped by a short maximum hold, or an extend to a
//! shorter TTL) wakes it at once, so no deadline waits for a tick.
//!
//! As the acquire engine, it decides without I/O, lease by lease, on a plain value
//! ([`Watched`]: the lease's [`Terms`] and where it stands, which the model checker
//! keeps too): [`Watched::look`] says at a given time whether a lease is lost, due for
//! renewal, or when to look again, and [`plan`] gathers that over the table;
//! [`Watched::answered`] turns a renewal's answer into the lease's new end or its loss,
//! and [`apply`] does so for a batch; [`Terms::why_gone`] names the loss of a key
//! found gone early. The task around them sends the batches through a [`Renewer`] (the
//! backend, or the tests' fake under paused time) on the engine's clock.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Grant, clock};
use crate::error::LossCause;
use crate::keys::name_in;
use crate::observe;

/// What the watchdog asks of the nodes: the backend, or the tests' fake.
pub(crate) trait Renewer: Send + Sync + 'static {
    /// Which renewal batch a lease's `key` belongs in: on a cluster, the master that
    /// serves it (one batch goes to one master, in one call); `None` where every node
    /// serves every key.
    fn renewal_group(&self, key: &str) -> Option<String>;

    /// One renewal batch: `(lock key, holder, ttl)` per lease, sent now to every node;
    /// what came of each lease, in order.
    fn renew(&self, leases: &[(&str, &str, Duration)])
    -> impl Future<Output = Vec<Renewal>> + Send;

    /// The highest fencing counter the nodes report for the lock `key` (for a key found
    /// gone early); `None` if none does.
    fn counter(&self, key: &str) -> impl Future<Output = Option<u64>> + Send;

    /// How many nodes there are (for the batch's event).
    fn node_count(&self) -> usize;
}

/// What a renewal batch did for one lease (the backend's verdict:
/// [`Quorum::renewal`](crate::backend::quorum::Quorum::renewal)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Renewal {
    /// Confirmed with time to spare: the lease now lasts until then.
    Renewed {
        /// Its new end, by the local clock.
        valid_until: Instant,
    },
    /// It is gone.
    Lost(LossCause),
    /// No verdict this time (too few answers, or too late): retry.
    Unknown,
}

/// The watchdog of one client.
pub(crate) struct Watchdog<R: Renewer> {
    inner: Arc<Inner<R>>,
}

struct Inner<R> {
    /// Where the leases live.
    renewer: R,
    /// Leases per renewal call (see [`crate::ClientBuilder::renewal_batch`]).
    batch: usize,
    table: Arc<Table>,
}

/// The leases watched, shared with their registrations.
struct Table {
    leases: Mutex<Leases>,
    /// Wakes the task: a lease needs attention before the task's next wake. Shared, so
    /// that the idle task can wait on it without keeping the client alive.
    changed: Arc<Notify>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Leases {
    by_id: HashMap<u64, Arc<Lease>>,
    /// When the task wakes next (`None` before it first went to sleep; after a task
    /// ended, a time past, which the next task's first scan makes moot). A lease whose
    /// renewal or loss deadline comes earlier must wake it.
    next_wake: Option<Instant>,
    /// The task, while it runs. A runtime that shut down takes its tasks with it, so a
    /// finished handle means the next lease starts a new task.
    task: Option<tokio::task::JoinHandle<()>>,
}

/// One held lock's lease, shared by its guard and the watchdog.
pub(crate) struct Lease {
    key: String,
    token: String,
    /// Its terms, fixed (also in `watched`, read here without the lock).
    terms: Terms,
    watched: Mutex<Watched>,
    lost: CancellationToken,
    cause: OnceLock<LossCause>,
}

/// What the watchdog decides a lease by, fixed when it is granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Terms {
    /// The lease each renewal asks for.
    pub ttl: Duration,
    /// `false` for a fixed lease: watched for expiry, never renewed.
    pub renew: bool,
    /// Renewals stop here (the maximum hold); the lease then runs out.
    pub hold_until: Option<Instant>,
    /// The grant's fencing token, for a lock with one holder at a time (plain, fair,
    /// reentrant): a key found gone early is told broken from deleted by the counter
    /// (see [`Terms::why_gone`]). `None` for a permit or a reader, whose counter others
    /// move.
    pub fence: Option<u64>,
}

/// One lease as the watchdog sees it: its [`Terms`] and where it stands, a plain value.
/// The watchdog's task decides every lease by it ([`Watched::look`] at a given time,
/// [`Watched::answered`] for a renewal's answer), each behind its lease's mutex; the
/// model checker keeps a copy in its state and runs the same decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Watched {
    terms: Terms,
    /// When the lease ends, by the local clock: only a confirmed renewal moves it on.
    valid_until: Instant,
    /// The TTL of the grant that set `valid_until` (the acquire, a renewal, an extend):
    /// the loss margin is a tenth of it, since that is the lease the key really has.
    granted: Duration,
    /// Whether that grant was shortened to end at the maximum hold.
    capped: bool,
    /// When the next renewal is due.
    next_renewal: Instant,
    /// A renewal was sent and not answered yet.
    in_flight: bool,
}

/// What the watchdog does about one lease at a given time ([`Watched::look`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Look {
    /// It is lost, and why.
    Lost(LossCause),
    /// Renew it now, to `ttl` (`capped`: shortened to end at the maximum hold); it is
    /// marked in flight until [`Watched::answered`]. Look again by `wake` (its loss
    /// deadline).
    Renew {
        /// The TTL the renewal asks for.
        ttl: Duration,
        /// Whether that TTL was shortened to end at the maximum hold.
        capped: bool,
        /// When to look again at the latest.
        wake: Instant,
    },
    /// Nothing to do now: look again by then (its loss deadline, or its renewal).
    Wait(Instant),
}

/// What a renewal's answer did to a lease ([`Watched::answered`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answered {
    /// Still held: renewed, or no verdict this time (the next tick retries).
    Kept,
    /// Lost, and why.
    Lost(LossCause),
    /// Its key was gone while its lease still ran (by the local clock, so not an
    /// expiry): [`Terms::why_gone`] tells the cause from the fencing counter.
    GoneEarly,
}

impl Watched {
    /// A lease of `terms` watched from its `grant` (whose TTL was shortened to end at the
    /// maximum hold if `capped`): its first renewal is due a third of the lease after
    /// the grant's request was sent.
    pub fn new(terms: Terms, grant: &Grant, capped: bool) -> Self {
        let mut watched = Self {
            terms,
            valid_until: grant.valid_until,
            granted: grant.ttl,
            capped,
            next_renewal: grant.sent_at,
            in_flight: false,
        };
        watched.extended(grant, capped);
        watched
    }

    /// Its terms (the watchdog's task reads its lease's own copy).
    #[cfg(feature = "model")]
    pub fn terms(&self) -> &Terms {
        &self.terms
    }

    /// When the lease ends, by the local clock (a guard's `valid_until()`).
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// Records an extend that Redis confirmed (`capped`: its TTL was shortened to end at
    /// the maximum hold): the lease ends at the extend's end, the loss margin follows
    /// the extend's TTL, and a renewed lease is renewed again to its own length within
    /// a third of the extend's TTL.
    pub fn extended(&mut self, grant: &Grant, capped: bool) {
        self.valid_until = grant.valid_until;
        self.granted = grant.ttl;
        self.capped = capped;
        self.next_renewal = grant.sent_at + self.terms.ttl.min(grant.ttl) / 3;
    }

    /// When to give up on the lease if no renewal is confirmed first: a little before
    /// `valid_until`, so the holder can stop before the lease really ends.
    pub fn loss_deadline(&self) -> Instant {
        let margin = (self.granted / 10).min(Duration::from_secs(1));
        self.valid_until
            .checked_sub(margin)
            .unwrap_or(self.valid_until)
    }

    /// The earliest moment the watchdog must look at this lease.
    fn first_event(&self) -> Instant {
        let loss = self.loss_deadline();
        if self.terms.renew {
            loss.min(self.next_renewal)
        } else {
            loss
        }
    }

    /// At `now`, on the watchdog's `tick` ([`tick`]): lost past its loss deadline; due
    /// for renewal within half a tick of its renewal time (and then marked in
    /// flight); else when to look again.
    pub fn look(&mut self, now: Instant, tick: Duration) -> Look {
        let give_up = self.loss_deadline();
        if now >= give_up {
            let cause = if self.capped {
                // Granted right up to the maximum hold: it ran out as asked.
                LossCause::MaxHold
            } else if !self.terms.renew {
                LossCause::Expired
            } else {
                LossCause::Unconfirmed
            };
            return Look::Lost(cause);
        }
        if !self.terms.renew || self.in_flight {
            return Look::Wait(give_up);
        }
        if self.next_renewal > now + early_window(tick) {
            return Look::Wait(give_up.min(self.next_renewal));
        }
        match self.terms.capped_ttl(self.terms.ttl, now) {
            Some((ttl, capped)) => {
                self.in_flight = true;
                Look::Renew {
                    ttl,
                    capped,
                    wake: give_up,
                }
            }
            None => Look::Wait(give_up),
        }
    }

    /// Applies the answer to its renewal to `ttl` (`capped` as [`Look::Renew`] said), sent
    /// at `sent_at` and answered at `now`: a renewed lease ends later and is renewed
    /// again a third of its lease after the send; a lease the nodes said is gone is
    /// lost, unless its key was gone while its lease still ran; no verdict leaves it to
    /// the next tick.
    pub fn answered(
        &mut self,
        ttl: Duration,
        capped: bool,
        renewal: Renewal,
        sent_at: Instant,
        now: Instant,
    ) -> Answered {
        self.in_flight = false;
        match renewal {
            Renewal::Renewed { valid_until } => {
                if valid_until > self.valid_until {
                    self.valid_until = valid_until;
                    self.granted = ttl;
                    self.capped = capped;
                }
                self.next_renewal = sent_at + self.terms.ttl / 3;
                Answered::Kept
            }
            Renewal::Lost(LossCause::Expired) if now < self.valid_until => Answered::GoneEarly,
            Renewal::Lost(cause) => Answered::Lost(cause),
            Renewal::Unknown => Answered::Kept,
        }
    }
}

impl Terms {
    /// `ttl`, shortened to end at the maximum hold (then `true`), in whole milliseconds;
    /// `None` once the maximum hold is reached.
    pub fn capped_ttl(&self, ttl: Duration, now: Instant) -> Option<(Duration, bool)> {
        let (ttl, capped) = match self.hold_until {
            Some(end) => {
                let left = end.saturating_duration_since(now);
                (ttl.min(left), left <= ttl)
            }
            None => (ttl, false),
        };
        let ttl = Duration::from_millis(ttl.as_millis() as u64);
        (ttl >= Duration::from_millis(1)).then_some((ttl, capped))
    }

    /// Why the key of a lease was gone while its lease still ran (by the local clock, so
    /// not an expiry), from the fencing `counter` a node reported: [`LossCause::Broken`]
    /// when it moved past the lease's token (a break burns one; no grant can have
    /// followed, since the key is absent), else [`LossCause::Deleted`].
    pub fn why_gone(&self, counter: Option<u64>) -> LossCause {
        match (self.fence, counter) {
            (Some(fence), Some(counter)) if counter > fence => LossCause::Broken,
            _ => LossCause::Deleted,
        }
    }
}

/// The watchdog's tick for leases of these terms: a sixth of the shortest renewed
/// lease (10 s when none is renewed), at least 5 ms.
pub fn tick<'a>(leases: impl IntoIterator<Item = &'a Terms>) -> Duration {
    leases
        .into_iter()
        .filter(|terms| terms.renew)
        .map(|terms| terms.ttl / 6)
        .fold(Duration::from_secs(10), Duration::min)
        .max(Duration::from_millis(5))
}

/// Keeps a lease watched; dropping it stops the watch at once.
pub(crate) struct Registration {
    table: Weak<Table>,
    id: u64,
    lease: Arc<Lease>,
}

impl<R: Renewer> Watchdog<R> {
    /// A watchdog renewing on `renewer`, `batch` leases per call.
    pub fn new(renewer: R, batch: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                renewer,
                batch,
                table: Arc::new(Table {
                    leases: Mutex::new(Leases::default()),
                    changed: Arc::new(Notify::new()),
                    next_id: AtomicU64::new(0),
                }),
            }),
        }
    }

    /// Starts watching a lease of `ttl` (renewed to that length if `renew`) from its
    /// `grant` (whose TTL was shortened to end at the maximum hold if `capped`).
    /// `exclusive`: the lock has one holder at a time, so a key found gone early is told
    /// broken from deleted by its fencing counter.
    #[allow(clippy::too_many_arguments)]
    pub fn watch(
        &self,
        key: String,
        token: String,
        exclusive: bool,
        ttl: Duration,
        renew: bool,
        hold_until: Option<Instant>,
        grant: &Grant,
        capped: bool,
    ) -> Registration {
        let terms = Terms {
            ttl,
            renew,
            hold_until,
            fence: exclusive.then_some(grant.fence.get()),
        };
        let watched = Watched::new(terms, grant, capped);
        let first_event = watched.first_event();
        let lease = Arc::new(Lease {
            key,
            token,
            terms,
            watched: Mutex::new(watched),
            lost: CancellationToken::new(),
            cause: OnceLock::new(),
        });
        let table = &self.inner.table;
        let id = table.next_id.fetch_add(1, Ordering::Relaxed);
        let mut leases = lock(&table.leases);
        leases.by_id.insert(id, lease.clone());
        if leases.task.as_ref().is_none_or(|t| t.is_finished()) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => leases.task = Some(rt.spawn(run(Arc::downgrade(&self.inner)))),
                Err(_) => tracing::warn!(
                    lock = name_in(&lease.key),
                    "no Tokio runtime: the lease is not renewed"
                ),
            }
        }
        table.wake_before(&leases, first_event);
        drop(leases);
        observe::lease_held(true);
        Registration {
            table: Arc::downgrade(table),
            id,
            lease,
        }
    }

    /// How many leases are watched.
    pub fn len(&self) -> usize {
        lock(&self.inner.table.leases).by_id.len()
    }
}

impl Table {
    /// Wakes the task unless it wakes by `when` anyway. Called with the leases locked,
    /// which the task also holds while it picks its next wake, so no wake is missed.
    fn wake_before(&self, leases: &Leases, when: Instant) {
        if leases.next_wake.is_none_or(|wake| when < wake) {
            self.changed.notify_one();
        }
    }
}

impl Registration {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The lease each renewal asks for.
    pub fn ttl(&self) -> Duration {
        self.lease.terms().ttl
    }

    /// Whether the watchdog renews it (false: a fixed lease).
    pub fn renews(&self) -> bool {
        self.lease.terms().renew
    }

    /// The maximum hold's end, if there is one.
    pub fn hold_until(&self) -> Option<Instant> {
        self.lease.terms().hold_until
    }

    /// Records an extend that Redis confirmed (a manual one; `capped`: its TTL was
    /// shortened to end at the maximum hold). A renewed lease is renewed again to its
    /// own length within a third of the extend's TTL, and the loss margin follows the
    /// extend's TTL: the watchdog is woken if that comes before its next wake.
    pub fn extended(&self, grant: &Grant, capped: bool) {
        let first_event = {
            let mut watched = lock(&self.lease.watched);
            watched.extended(grant, capped);
            watched.first_event()
        };
        if let Some(table) = self.table.upgrade() {
            table.wake_before(&lock(&table.leases), first_event);
        }
    }

    pub fn lease_arc(&self) -> Arc<Lease> {
        self.lease.clone()
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let watched = *lock(&self.lease.watched);
        f.debug_struct("Lease")
            .field("key", &self.lease.key)
            .field("ttl", &watched.terms.ttl)
            .field("renew", &watched.terms.renew)
            .field("valid_until", &watched.valid_until)
            .field("lost", &self.lease.cause())
            .finish()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(table) = self.table.upgrade() {
            lock(&table.leases).by_id.remove(&self.id);
        }
        observe::lease_held(false);
    }
}

impl Lease {
    pub fn valid_until(&self) -> Instant {
        lock(&self.watched).valid_until()
    }

    fn terms(&self) -> &Terms {
        &self.terms
    }

    /// Fires the loss signal with `cause` (the first cause sticks), and reports the loss
    /// once.
    pub fn lose(&self, cause: LossCause) {
        if self.cause.set(cause).is_ok() {
            observe::lease_lost(cause);
            tracing::warn!(
                lock = name_in(&self.key),
                cause = observe::cause_label(cause),
                "lease lost: {cause}"
            );
        }
        self.lost.cancel();
    }

    pub fn cause(&self) -> Option<LossCause> {
        self.cause.get().copied()
    }

    pub fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// `ttl`, shortened to end at the maximum hold (then `true`), in whole milliseconds;
    /// `None` once the maximum hold is reached ([`Terms::capped_ttl`]).
    pub fn capped_ttl(&self, ttl: Duration, now: Instant) -> Option<(Duration, bool)> {
        self.terms().capped_ttl(ttl, now)
    }
}

/// A lease that falls due: the lease, the TTL to renew it to, and whether that TTL was
/// shortened to end at the maximum hold.
type Due = (Arc<Lease>, Duration, bool);

/// What the watchdog does at a given time ([`plan`]).
struct Plan {
    /// The leases lost by now, and why.
    lost: Vec<(Arc<Lease>, LossCause)>,
    /// The leases to renew now (each marked in flight).
    due: Vec<Due>,
    /// When to look again.
    wake: Instant,
}

/// What one batch's renewals came to ([`apply`]).
#[derive(Default)]
struct Applied {
    /// The leases lost, and why.
    lost: Vec<(Arc<Lease>, LossCause)>,
    /// The leases whose key was gone while their lease still ran: [`Terms::why_gone`] tells
    /// their cause.
    gone_early: Vec<Arc<Lease>>,
}

/// At `now`: the leases past their loss deadline (lost), those due for renewal within
/// [`early_window`] (marked in flight), and when to look again (the next tick, a lease's
/// loss deadline or renewal, whichever comes first; recorded as the next wake).
fn plan(leases: &mut Leases, now: Instant) -> Plan {
    let tick = tick(leases.by_id.values().map(|lease| lease.terms()));
    let mut plan = Plan {
        lost: Vec::new(),
        due: Vec::new(),
        wake: now + tick,
    };
    for lease in leases.by_id.values() {
        if lease.lost.is_cancelled() {
            continue;
        }
        let look = lock(&lease.watched).look(now, tick);
        match look {
            Look::Lost(cause) => plan.lost.push((lease.clone(), cause)),
            Look::Renew { ttl, capped, wake } => {
                plan.wake = plan.wake.min(wake);
                plan.due.push((lease.clone(), ttl, capped));
            }
            Look::Wait(wake) => plan.wake = plan.wake.min(wake),
        }
    }
    leases.next_wake = Some(plan.wake);
    plan
}

/// How early a lease may be renewed to share a call: half a tick. With the tick a sixth
/// of the shortest lease, a lease is renewed between a quarter and a third of its length
/// after its last renewal was sent (every third, as documented, up to a twelfth early).
/// A whole tick would renew every lease one tick early, every sixth of it: twice the
/// load on the server for the same safety.
fn early_window(tick: Duration) -> Duration {
    tick / 2
}

/// Applies one batch's `renewals` (sent at `sent_at`, answered at `now`): a renewed
/// lease ends later and is renewed again a third of its lease after the send; a lease
/// the nodes said is gone is lost, unless its key was gone while its lease still ran
/// (see [`Terms::why_gone`]); no verdict leaves it to the next tick.
fn apply(batch: &[Due], renewals: Vec<Renewal>, sent_at: Instant, now: Instant) -> Applied {
    let mut applied = Applied::default();
    for ((lease, ttl, capped), renewal) in batch.iter().zip(renewals) {
        let answered = lock(&lease.watched).answered(*ttl, *capped, renewal, sent_at, now);
        match answered {
            Answered::Kept => {}
            Answered::Lost(cause) => applied.lost.push((lease.clone(), cause)),
            Answered::GoneEarly => applied.gone_early.push(lease.clone()),
        }
    }
    applied
}

/// The watchdog task. It runs on a fixed tick (a sixth of the shortest renewed lease)
/// and wakes at each lease's renewal time, and then renews, in batches, every lease that
/// falls due within half a tick ([`early_window`]), so leases taken at scattered times
/// still share calls. Losses are checked on
/// the tick and at each lease's own deadline. Ends once no lease has been left for
/// [`IDLE_LINGER`] (the next lease starts it again), or when the client is gone.
async fn run<R: Renewer>(weak: Weak<Inner<R>>) {
    // Since when no lease has been left.
    let mut idle_since: Option<Instant> = None;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let notify = inner.table.changed.clone();
        let changed = notify.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let now = clock();
        match idle(&inner.table, &mut idle_since, now) {
            Idle::End => return,
            // Idle: wait a little for the next lease without keeping the client alive.
            Idle::Until(until) => {
                drop(inner);
                tokio::select! {
                    () = tokio::time::sleep_until(until.into()) => {}
                    () = &mut changed => {}
                }
                continue;
            }
            Idle::Busy => {}
        }
        let Plan { lost, due, wake } = plan(&mut lock(&inner.table.leases), now);
        for (lease, cause) in lost {
            lease.lose(cause);
        }
        if !due.is_empty() {
            tokio::spawn(renew_in_turn(inner.clone(), due));
        }
        // Holding `inner` while asleep is fine: the task ends once no lease is left.
        tokio::select! {
            () = tokio::time::sleep_until(wake.into()) => {}
            () = changed => {}
        }
    }
}

/// What the watchdog task does when it finds no lease.
enum Idle {
    /// Leases are left: renew them.
    Busy,
    /// None left for a while: wait until then for the next lease (a client that locks
    /// and unlocks in turn would start a task for each).
    Until(Instant),
    /// None left for [`IDLE_LINGER`]: end (the next lease starts a task again).
    End,
}

fn idle(table: &Table, idle_since: &mut Option<Instant>, now: Instant) -> Idle {
    let mut leases = lock(&table.leases);
    if !leases.by_id.is_empty() {
        *idle_since = None;
        return Idle::Busy;
    }
    let idle = now.duration_since(*idle_since.get_or_insert(now));
    if idle >= IDLE_LINGER {
        leases.task = None;
        return Idle::End;
    }
    // A new lease wakes the task only if it falls due before the wait ends (else the
    // task finds it then): a client that locks and unlocks in turn would wake it for
    // every lease.
    let until = now + (IDLE_LINGER - idle);
    leases.next_wake = Some(until);
    Idle::Until(until)
}

/// How long the watchdog task waits for a new lease once none is left, before it ends.
const IDLE_LINGER: Duration = Duration::from_secs(1);

/// Renews `due` in batches of up to the client's
/// [`renewal_batch`](crate::ClientBuilder::renewal_batch) leases. On a cluster, the leases
/// are first grouped by the master that serves them, so each batch is one call to one
/// master (rather than a call to every master with a third of a batch each). The
/// batches of one group go one after another: a call the client sends meanwhile waits
/// behind one batch at most, not behind a whole tick's (100 batches for 200,000 leases
/// renewed every 2 s would hold the connection for about half a second of Redis time,
/// longer than a call's response timeout allows). The groups go at once.
async fn renew_in_turn<R: Renewer>(inner: Arc<Inner<R>>, due: Vec<Due>) {
    let mut groups: HashMap<Option<String>, Vec<Due>> = HashMap::new();
    for lease in due {
        let group = inner.renewer.renewal_group(&lease.0.key);
        groups.entry(group).or_default().push(lease);
    }
    join_all(groups.into_values().map(|mut due| {
        let inner = inner.clone();
        async move {
            while !due.is_empty() {
                let rest = due.split_off(due.len().min(inner.batch));
                renew(&inner, std::mem::replace(&mut due, rest)).await;
            }
        }
    }))
    .await;
}

/// Sends one batch (to every node, for Redlock) and applies the answers ([`apply`]): a
/// lease is renewed when a majority confirmed it in time, lost when so many nodes said
/// it is gone that no majority can confirm it, and otherwise retried on the next tick.
async fn renew<R: Renewer>(inner: &Inner<R>, batch: Vec<Due>) {
    let sent_at = clock();
    let leases: Vec<(&str, &str, Duration)> = batch
        .iter()
        .map(|(l, ttl, _)| (l.key.as_str(), l.token.as_str(), *ttl))
        .collect();
    let renewals = inner.renewer.renew(&leases).await;
    let now = clock();
    let elapsed = now.saturating_duration_since(sent_at);
    let (mut renewed, mut lost, mut unknown) = (0u64, 0u64, 0u64);
    for r in &renewals {
        match r {
            Renewal::Renewed { .. } => renewed += 1,
            Renewal::Lost(_) => lost += 1,
            Renewal::Unknown => unknown += 1,
        }
    }
    observe::renewal_batch(batch.len(), elapsed, renewed, lost, unknown);
    tracing::debug!(
        leases = batch.len(),
        nodes = inner.renewer.node_count(),
        renewed,
        lost,
        unknown,
        elapsed_ms = observe::ms(elapsed),
        "renewal batch"
    );
    let applied = apply(&batch, renewals, sent_at, now);
    for (lease, cause) in applied.lost {
        lease.lose(cause);
    }
    join_all(applied.gone_early.into_iter().map(|lease| async move {
        // Only a lock with one holder at a time is told broken from deleted: one
        // `inspect.lua` call, only on this loss path, bounded (then: deleted).
        let terms = *lease.terms();
        let counter = match terms.fence {
            Some(_) => tokio::time::timeout(WHY_GONE_WITHIN, inner.renewer.counter(&lease.key))
                .await
                .unwrap_or(None),
            None => None,
        };
        lease.lose(terms.why_gone(counter));
    }))
    .await;
}

/// How long the watchdog waits for the counter of a key found gone early before it
/// reports the loss as a deletion: the loss signal waits for it.
const WHY_GONE_WITHIN: Duration = Duration::from_millis(250);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
