//! What fencelock tells about itself: metrics through the [`metrics`] facade, and
//! [`tracing`] spans and events. The names here are the contract; dashboards and alerts
//! can rely on them.
//!
//! # Metrics
//!
//! fencelock records into whatever [`metrics`] recorder the program installed (an
//! exporter such as `metrics-exporter-prometheus`, or a local one in tests); call
//! [`describe`] once after installing it to give each metric its unit and help text.
//! Without a recorder every update is a no-op that neither allocates nor formats: keys
//! and labels are `static`, built at compile time.
//!
//! Names follow Prometheus conventions (unit suffix, `_total` for counters); durations
//! are in seconds. Labels take a handful of fixed values each, listed below. The lock
//! name is never a label: names can be unbounded (order ids, user ids), and a label
//! value per name would make one time series per name. Find a lock's story in the
//! tracing events instead, which carry the name.
//!
//! | name | kind | unit | labels | what |
//! |---|---|---|---|---|
//! | [`fencelock_acquire_duration_seconds`](ACQUIRE_DURATION) | histogram | seconds | `mode`, `outcome` | every acquire, from the call to its outcome, waiting included |
//! | [`fencelock_acquire_wait_seconds`](ACQUIRE_WAIT) | histogram | seconds | `mode`, `outcome` | acquires that waited: from the first attempt that found the lock held (or a node unreachable) to the outcome |
//! | [`fencelock_acquire_contended_total`](ACQUIRE_CONTENDED) | counter | attempts | `mode` | attempts that found the lock held (by another owner, or by a fair queue) |
//! | [`fencelock_acquire_handoffs_total`](ACQUIRE_HANDOFFS) | counter | acquires | `mode` | acquires that got the lock after waiting for it to be released |
//! | [`fencelock_waiter_wakeups_total`](WAITER_WAKEUPS) | counter | wake-ups | `by` | how waiting acquires woke for their next attempt |
//! | [`fencelock_releases_total`](RELEASES) | counter | releases | `kind`, `outcome` | releases of held locks |
//! | [`fencelock_release_duration_seconds`](RELEASE_DURATION) | histogram | seconds | `outcome` | [`LockGuard::release`](crate::LockGuard::release) calls, from the call to the answer |
//! | [`fencelock_leases_held`](LEASES_HELD) | gauge | leases | – | guards alive now whose lease the watchdog watches |
//! | [`fencelock_renewal_batches_total`](RENEWAL_BATCHES) | counter | batches | – | renewal batches the watchdog sent (one script call per node each) |
//! | [`fencelock_renewal_batch_size`](RENEWAL_BATCH_SIZE) | histogram | leases | – | leases per renewal batch |
//! | [`fencelock_renewal_duration_seconds`](RENEWAL_DURATION) | histogram | seconds | – | renewal batches, from sending to the tally |
//! | [`fencelock_renewals_total`](RENEWALS) | counter | leases | `outcome` | what renewal batches did for each lease in them |
//! | [`fencelock_leases_lost_total`](LEASES_LOST) | counter | leases | `cause` | leases whose loss signal ([`LockGuard::lost`](crate::LockGuard::lost)) fired |
//!
//! The labels and their values:
//!
//! | label | values |
//! |---|---|
//! | `mode` | `plain`, `fair` ([`LockBuilder::fair`](crate::LockBuilder::fair)), `reentrant` ([`LockBuilder::reentrant`](crate::LockBuilder::reentrant)), `semaphore` ([`SemaphoreBuilder`](crate::SemaphoreBuilder)), `read` (a read-write lock's reader, [`ReadLockBuilder`](crate::ReadLockBuilder); its writer counts as `plain` or `reentrant`), `election` (a campaign, [`Election`](crate::Election)), `multi` (an acquire of a [multi-lock](crate::MultiLockBuilder)'s names, or of one slot group of them on a Cluster, its wait included) |
//! | `outcome` of an acquire | `acquired`; `held` ([`Error::Held`]: the wait ran out, or a single attempt found it held); `unavailable` ([`Error::Unavailable`], [`Error::NoQuorum`]); `error` (any other error from Redis: [`Error::Rejected`], [`Error::WrongType`]); `cancelled` (the acquire's future was dropped before an outcome) |
//! | `outcome` of a release | `released`; `lost` ([`Error::LeaseLost`]: the lease had already ended); `unavailable`; `error` |
//! | `kind` of a release | `release` ([`LockGuard::release`](crate::LockGuard::release)); `drop` (a guard dropped unreleased, released in the background: its `outcome` is `released` once a node answered, whatever it found, else `unavailable` or `error`) |
//! | `by` | `notification` (a release message on the lock's channel); `timer` (the pause ran out: the holder's remaining lease, or the backoff) |
//! | `outcome` of a renewal | `renewed`; `lost`; `unknown` (no verdict this time, retried on the next tick) |
//! | `cause` | `expired`, `deleted`, `broken`, `taken_by_other`, `unconfirmed`, `max_hold`: the [`LossCause`] variants |
//!
//! Acquires refused before anything was sent (an invalid argument) are not measured.
//! A release that finds the lease already lost counts in [`RELEASES`] with outcome
//! `lost`, not in [`LEASES_LOST`], which counts the loss signals fired by the watchdog
//! or by [`LockGuard::extend`](crate::LockGuard::extend).
//!
//! # Tracing
//!
//! Spans and events come from targets under `fencelock` (the module paths). Routine
//! events are at `debug` (`trace` for each attempt of a wait); a lost lease and a failed
//! background release are at `warn`. Durations are in milliseconds (`elapsed_ms`,
//! `waited_ms`, floating point).
//!
//! Never logged: holder tokens ([`HolderToken`](crate::HolderToken)), reentrant owner ids,
//! Redis URLs and passwords (nodes appear as `host:port`). The fencing token is logged:
//! it is an ordering number, not a secret.
//!
//! | span or event | level | fields |
//! |---|---|---|
//! | span `acquire`, around each acquire | debug | `lock` (the name), `mode`, `waits` (whether it may wait), and once it ends `outcome`, `fencing_token` (when acquired), `elapsed_ms` |
//! | "waiting for the lock to be released" (first refusal of a waiting acquire) | debug | `blocked_by` (what holds it, and for how long), `nodes` (Redlock: what each node answered) |
//! | "lock still held" (each later refusal) | trace | `attempt`, `blocked_by` |
//! | "woken" (a waiter's pause ended) | trace | `by` |
//! | "acquire attempt failed; retrying" (a node unreachable, or no quorum) | debug | `attempt`, `error` (Redlock: per node) |
//! | "lock acquired" / "lock not acquired" / "acquire cancelled" (the outcome) | debug | `outcome`, `attempts`, `elapsed_ms`, `waited_ms` (if it waited), `fencing_token` (if acquired), `handoff` (if acquired: whether an attempt had found it held), `blocked_by` and (Redlock) `nodes`, or `error` (if not) |
//! | "lock released" / "release failed" ([`LockGuard::release`](crate::LockGuard::release)) | debug | `lock`, `outcome`, `fencing_token`, `elapsed_ms`, `error` (if it failed) |
//! | "lock released in the background" (a dropped guard) / "background release failed; ..." | debug / warn | `lock`, `fencing_token`, `error` |
//! | "release after the work failed" ([`LockBuilder::run`](crate::LockBuilder::run)) | warn | `lock`, `error` |
//! | "renewal batch" | debug | `leases`, `nodes`, `renewed`, `lost`, `unknown`, `elapsed_ms` |
//! | "lease lost: ..." | warn | `lock`, `cause` (the label above) |
//!
//! Events inside the `acquire` span carry its fields rather than repeating `lock`.
//!
//! # Example
//!
//! `examples/prometheus.rs` installs the Prometheus exporter, takes a few locks and
//! serves the metrics for scraping:
//! `cargo run -p fencelock --example prometheus -- 127.0.0.1:9898`.

use std::time::Duration;

use metrics::{Key, Label, Level, Metadata, Unit};

use crate::error::{Error, LossCause};

/// Histogram, seconds, labels `mode` and `outcome`: how long each acquire took, from the
/// call to its outcome, waiting included. Its count per `outcome` is the number of
/// acquires that ended so.
pub const ACQUIRE_DURATION: &str = "fencelock_acquire_duration_seconds";

/// Histogram, seconds, labels `mode` and `outcome`: for acquires that waited, the time
/// from the first attempt that found the lock held (or a node unreachable) to the
/// outcome. Acquires granted at the first attempt, and single attempts, are not in it.
pub const ACQUIRE_WAIT: &str = "fencelock_acquire_wait_seconds";

/// Counter, label `mode`: acquire attempts that found the lock held by another owner, or
/// (fair mode) other waiters first in line. A waiting acquire counts once per attempt.
pub const ACQUIRE_CONTENDED: &str = "fencelock_acquire_contended_total";

/// Counter, label `mode`: acquires that got the lock after an attempt of theirs found
/// it held: the lock passed from one holder to a waiter.
pub const ACQUIRE_HANDOFFS: &str = "fencelock_acquire_handoffs_total";

/// Counter, label `by` (`notification` or `timer`): the pauses of waiting acquires, by
/// what ended them. Many `timer` wake-ups where releases happen mean release messages
/// do not arrive (the wait is then bounded by the holder's lease or the backoff).
pub const WAITER_WAKEUPS: &str = "fencelock_waiter_wakeups_total";

/// Counter, labels `kind` (`release` or `drop`) and `outcome` (`released`, `lost`,
/// `unavailable`, `error`): releases of held locks.
pub const RELEASES: &str = "fencelock_releases_total";

/// Histogram, seconds, label `outcome` (as [`RELEASES`]): how long each
/// [`LockGuard::release`](crate::LockGuard::release) took.
pub const RELEASE_DURATION: &str = "fencelock_release_duration_seconds";

/// Gauge, no labels: guards alive now whose lease the watchdog watches (renewed, or
/// watched for expiry), summed over every client of the process.
pub const LEASES_HELD: &str = "fencelock_leases_held";

/// Counter, no labels: renewal batches the watchdog sent. Each batch is one
/// `renew.lua` call per node, for up to [`RENEWAL_BATCH`](crate::limits::RENEWAL_BATCH)
/// leases.
pub const RENEWAL_BATCHES: &str = "fencelock_renewal_batches_total";

/// Histogram, leases, no labels: how many leases each renewal batch carried.
pub const RENEWAL_BATCH_SIZE: &str = "fencelock_renewal_batch_size";

/// Histogram, seconds, no labels: how long each renewal batch took, from sending it to
/// every node to the tally of their answers.
pub const RENEWAL_DURATION: &str = "fencelock_renewal_duration_seconds";

/// Counter, label `outcome` (`renewed`, `lost`, `unknown`): what renewal batches did
/// for each lease in them. `unknown`: too few answers, or too late; retried on the next
/// tick.
pub const RENEWALS: &str = "fencelock_renewals_total";

/// Counter, label `cause` (`expired`, `taken_by_other`, `unconfirmed`, `max_hold`):
/// leases whose loss signal fired ([`LockGuard::lost`](crate::LockGuard::lost)), once
/// per lease, with its [`LossCause`].
pub const LEASES_LOST: &str = "fencelock_leases_lost_total";

/// Counter, label `store` (`postgres`, `redis`): stale fencing tokens refused by the
/// resource, as the library's checks reported them
/// ([`fence::tokio_postgres::check`](crate::fence), [`fence::sqlx::check`](crate::fence),
/// [`FencedWrite::apply`](crate::fence::FencedWrite::apply)): each a holder that lost its
/// lock and tried to write. A `WARN` event names the resource and both tokens.
pub const FENCE_REFUSALS: &str = "fencelock_fence_refusals_total";

/// Gives every metric above its unit and help text in the installed recorder (an
/// exporter shows them as `# HELP` and `# TYPE` lines). Call it once, after installing
/// the recorder; recording works without it.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        ACQUIRE_DURATION,
        Unit::Seconds,
        "Acquires, from the call to the outcome, waiting included"
    );
    describe_histogram!(
        ACQUIRE_WAIT,
        Unit::Seconds,
        "Acquires that waited: from the first attempt that found the lock held to the outcome"
    );
    describe_counter!(
        ACQUIRE_CONTENDED,
        Unit::Count,
        "Acquire attempts that found the lock held"
    );
    describe_counter!(
        ACQUIRE_HANDOFFS,
        Unit::Count,
        "Acquires that got the lock after waiting for its release"
    );
    describe_counter!(
        WAITER_WAKEUPS,
        Unit::Count,
        "Pauses of waiting acquires, by what ended them"
    );
    describe_counter!(RELEASES, Unit::Count, "Releases of held locks");
    describe_histogram!(
        RELEASE_DURATION,
        Unit::Seconds,
        "LockGuard::release calls, from the call to the answer"
    );
    describe_gauge!(
        LEASES_HELD,
        Unit::Count,
        "Guards alive whose lease the watchdog watches"
    );
    describe_counter!(
        RENEWAL_BATCHES,
        Unit::Count,
        "Renewal batches sent by the watchdog"
    );
    describe_histogram!(RENEWAL_BATCH_SIZE, Unit::Count, "Leases per renewal batch");
    describe_histogram!(
        RENEWAL_DURATION,
        Unit::Seconds,
        "Renewal batches, from sending to the tally"
    );
    describe_counter!(
        RENEWALS,
        Unit::Count,
        "Leases in renewal batches, by outcome"
    );
    describe_counter!(LEASES_LOST, Unit::Count, "Leases lost, by cause");
    describe_counter!(
        FENCE_REFUSALS,
        Unit::Count,
        "Stale fencing tokens refused by the resource, by store"
    );
}

// What follows is fencelock's side: the label values, and one static key per label
// set, so that recording builds nothing at run time.

/// The `mode` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeLabel {
    /// A plain lock.
    Plain = 0,
    /// A fair lock.
    Fair = 1,
    /// A reentrant lock.
    Reentrant = 2,
    /// A semaphore's permit.
    Semaphore = 3,
    /// A read-write lock's read side.
    Read = 4,
    /// A leader election's campaign.
    Election = 5,
    /// Several locks at once.
    Multi = 6,
}

impl ModeLabel {
    /// Its label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Fair => "fair",
            Self::Reentrant => "reentrant",
            Self::Semaphore => "semaphore",
            Self::Read => "read",
            Self::Election => "election",
            Self::Multi => "multi",
        }
    }
}

/// The `outcome` label of an acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    Acquired = 0,
    Held = 1,
    Unavailable = 2,
    Error = 3,
    Cancelled = 4,
}

impl AcquireOutcome {
    pub fn of<T>(result: &Result<T, Error>) -> Self {
        match result {
            Ok(_) => Self::Acquired,
            Err(Error::Held { .. }) => Self::Held,
            Err(Error::Unavailable { .. } | Error::NoQuorum { .. }) => Self::Unavailable,
            Err(_) => Self::Error,
        }
    }

    /// Its label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Held => "held",
            Self::Unavailable => "unavailable",
            Self::Error => "error",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The `kind` label of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleaseKind {
    Release = 0,
    Drop = 1,
}

/// The `outcome` label of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleaseOutcome {
    Released = 0,
    Lost = 1,
    Unavailable = 2,
    Error = 3,
}

impl ReleaseOutcome {
    pub fn of<T>(result: &Result<T, Error>) -> Self {
        match result {
            Ok(_) => Self::Released,
            Err(Error::LeaseLost { .. }) => Self::Lost,
            Err(Error::Unavailable { .. } | Error::NoQuorum { .. }) => Self::Unavailable,
            Err(_) => Self::Error,
        }
    }

    /// Its label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Lost => "lost",
            Self::Unavailable => "unavailable",
            Self::Error => "error",
        }
    }
}

/// The `by` label: what ended a waiter's pause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WokenBy {
    /// A release message.
    Notification = 0,
    /// The pause ran out.
    Timer = 1,
}

impl WokenBy {
    /// Its label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Notification => "notification",
            Self::Timer => "timer",
        }
    }
}

/// The `cause` label of a lost lease.
pub(crate) fn cause_label(cause: LossCause) -> &'static str {
    match cause {
        LossCause::Expired => "expired",
        LossCause::TakenByOther => "taken_by_other",
        LossCause::Unconfirmed => "unconfirmed",
        LossCause::MaxHold => "max_hold",
        LossCause::Deleted => "deleted",
        LossCause::Broken => "broken",
    }
}

fn cause_index(cause: LossCause) -> usize {
    match cause {
        LossCause::Expired => 0,
        LossCause::TakenByOther => 1,
        LossCause::Unconfirmed => 2,
        LossCause::MaxHold => 3,
        LossCause::Deleted => 4,
        LossCause::Broken => 5,
    }
}

/// Milliseconds to the microsecond, for the `elapsed_ms` and `waited_ms` fields of
/// events.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// An acquire ended: its duration; how long it waited, if it did; whether the lock was
/// handed over to it after a release.
pub(crate) fn acquire_ended(
    mode: ModeLabel,
    outcome: AcquireOutcome,
    elapsed: Duration,
    waited: Option<Duration>,
    handoff: bool,
) {
    let (m, o) = (mode as usize, outcome as usize);
    histogram(&ACQUIRE_DURATION_KEYS[m][o], elapsed.as_secs_f64());
    if let Some(waited) = waited {
        histogram(&ACQUIRE_WAIT_KEYS[m][o], waited.as_secs_f64());
    }
    if handoff {
        counter(&ACQUIRE_HANDOFFS_KEYS[m], 1);
    }
}

/// An attempt found the lock held.
pub(crate) fn contended(mode: ModeLabel) {
    counter(&ACQUIRE_CONTENDED_KEYS[mode as usize], 1);
}

/// A waiter's pause ended.
pub(crate) fn woken(by: WokenBy) {
    counter(&WAITER_WAKEUPS_KEYS[by as usize], 1);
}

/// A held lock was released (`elapsed`: for an explicit release).
pub(crate) fn released(kind: ReleaseKind, outcome: ReleaseOutcome, elapsed: Option<Duration>) {
    counter(&RELEASES_KEYS[kind as usize][outcome as usize], 1);
    if let Some(elapsed) = elapsed {
        histogram(
            &RELEASE_DURATION_KEYS[outcome as usize],
            elapsed.as_secs_f64(),
        );
    }
}

/// A lease started (`true`) or stopped (`false`) being watched.
pub(crate) fn lease_held(held: bool) {
    metrics::with_recorder(|r| {
        let gauge = r.register_gauge(&LEASES_HELD_KEY, &METADATA);
        if held {
            gauge.increment(1.0);
        } else {
            gauge.decrement(1.0);
        }
    });
}

/// A renewal batch of `size` leases was tallied.
pub(crate) fn renewal_batch(size: usize, elapsed: Duration, renewed: u64, lost: u64, unknown: u64) {
    counter(&RENEWAL_BATCHES_KEY, 1);
    histogram(&RENEWAL_BATCH_SIZE_KEY, size as f64);
    histogram(&RENEWAL_DURATION_KEY, elapsed.as_secs_f64());
    for (i, n) in [renewed, lost, unknown].into_iter().enumerate() {
        if n > 0 {
            counter(&RENEWALS_KEYS[i], n);
        }
    }
}

/// A lease's loss signal fired.
pub(crate) fn lease_lost(cause: LossCause) {
    counter(&LEASES_LOST_KEYS[cause_index(cause)], 1);
}

/// Where a stale token was refused: the `store` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Store {
    Postgres = 0,
    Redis = 1,
}

/// A resource refused a stale fencing token: counted, and said at `WARN` (the stale
/// holder's own logs are where a refusal shows per resource: the database rolled it back).
pub(crate) fn fence_refused(store: Store, resource: &str, token: u64, highest: u64) {
    counter(&FENCE_REFUSALS_KEYS[store as usize], 1);
    tracing::warn!(
        resource,
        token,
        highest,
        store = STORE[store as usize][0].value(),
        "stale fencing token refused: this holder lost its lock"
    );
}

fn counter(key: &'static Key, n: u64) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(n));
}

fn histogram(key: &'static Key, value: f64) {
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(value));
}

/// Where fencelock's metrics come from, for recorders that filter on it.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// `[[label, ...], ...]`: one array of labels per value of the label `$k`, or per
/// combination of a value of `$k1` and one of `$k2` (`[[[label, label], ...], ...]`).
macro_rules! label_table {
    ($k:literal: [$($v:literal),*]) => {
        [$( [Label::from_static_parts($k, $v)] ),*]
    };
    ($k1:literal: [$($v1:literal),*], $k2:literal: $v2:tt) => {
        [$( label_table!(@row $k1, $v1, $k2, $v2) ),*]
    };
    (@row $k1:literal, $v1:literal, $k2:literal, [$($v2:literal),*]) => {
        [$( [Label::from_static_parts($k1, $v1), Label::from_static_parts($k2, $v2)] ),*]
    };
}

/// One static key of metric `$name` per entry of the label table `$labels`, indexed
/// like it.
macro_rules! key_table {
    ($name:expr, $labels:ident, [$($i:literal),*]) => {
        [$( Key::from_static_parts($name, &$labels[$i]) ),*]
    };
    ($name:expr, $labels:ident, [$($i:literal),*], $js:tt) => {
        [$( key_table!(@row $name, $labels, $i, $js) ),*]
    };
    (@row $name:expr, $labels:ident, $i:literal, [$($j:literal),*]) => {
        [$( Key::from_static_parts($name, &$labels[$i][$j]) ),*]
    };
}

// Indexed by the enums' discriminants; the tests check every entry against `as_str`.
static MODE: [[Label; 1]; 7] =
    label_table!("mode": ["plain", "fair", "reentrant", "semaphore", "read", "election", "multi"]);
static MODE_OUTCOME: [[[Label; 2]; 5]; 7] = label_table!(
    "mode": ["plain", "fair", "reentrant", "semaphore", "read", "election", "multi"],
    "outcome": ["acquired", "held", "unavailable", "error", "cancelled"]
);
static WAKE: [[Label; 1]; 2] = label_table!("by": ["notification", "timer"]);
static RELEASE_OUTCOME: [[Label; 1]; 4] =
    label_table!("outcome": ["released", "lost", "unavailable", "error"]);
static KIND_OUTCOME: [[[Label; 2]; 4]; 2] = label_table!(
    "kind": ["release", "drop"],
    "outcome": ["released", "lost", "unavailable", "error"]
);
static RENEWAL_OUTCOME: [[Label; 1]; 3] = label_table!("outcome": ["renewed", "lost", "unknown"]);
static STORE: [[Label; 1]; 2] = label_table!("store": ["postgres", "redis"]);
static CAUSE: [[Label; 1]; 6] = label_table!(
    "cause": ["expired", "taken_by_other", "unconfirmed", "max_hold", "deleted", "broken"]
);

static ACQUIRE_DURATION_KEYS: [[Key; 5]; 7] = key_table!(
    ACQUIRE_DURATION,
    MODE_OUTCOME,
    [0, 1, 2, 3, 4, 5, 6],
    [0, 1, 2, 3, 4]
);
static ACQUIRE_WAIT_KEYS: [[Key; 5]; 7] = key_table!(
    ACQUIRE_WAIT,
    MODE_OUTCOME,
    [0, 1, 2, 3, 4, 5, 6],
    [0, 1, 2, 3, 4]
);
static ACQUIRE_CONTENDED_KEYS: [Key; 7] =
    key_table!(ACQUIRE_CONTENDED, MODE, [0, 1, 2, 3, 4, 5, 6]);
static ACQUIRE_HANDOFFS_KEYS: [Key; 7] = key_table!(ACQUIRE_HANDOFFS, MODE, [0, 1, 2, 3, 4, 5, 6]);
static WAITER_WAKEUPS_KEYS: [Key; 2] = key_table!(WAITER_WAKEUPS, WAKE, [0, 1]);
static RELEASES_KEYS: [[Key; 4]; 2] = key_table!(RELEASES, KIND_OUTCOME, [0, 1], [0, 1, 2, 3]);
static RELEASE_DURATION_KEYS: [Key; 4] =
    key_table!(RELEASE_DURATION, RELEASE_OUTCOME, [0, 1, 2, 3]);
static LEASES_HELD_KEY: Key = Key::from_static_name(LEASES_HELD);
static RENEWAL_BATCHES_KEY: Key = Key::from_static_name(RENEWAL_BATCHES);
static RENEWAL_BATCH_SIZE_KEY: Key = Key::from_static_name(RENEWAL_BATCH_SIZE);
static RENEWAL_DURATION_KEY: Key = Key::from_static_name(RENEWAL_DURATION);
static RENEWALS_KEYS: [Key; 3] = key_table!(RENEWALS, RENEWAL_OUTCOME, [0, 1, 2]);
static FENCE_REFUSALS_KEYS: [Key; 2] = key_table!(FENCE_REFUSALS, STORE, [0, 1]);
static LEASES_LOST_KEYS: [Key; 6] = key_table!(LEASES_LOST, CAUSE, [0, 1, 2, 3, 4, 5]);

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(key: &Key) -> Vec<(&str, &str)> {
        key.labels().map(|l| (l.key(), l.value())).collect()
    }

    const MODES: [ModeLabel; 7] = [
        ModeLabel::Plain,
        ModeLabel::Fair,
        ModeLabel::Reentrant,
        ModeLabel::Semaphore,
        ModeLabel::Read,
        ModeLabel::Election,
        ModeLabel::Multi,
    ];
    const OUTCOMES: [AcquireOutcome; 5] = [
        AcquireOutcome::Acquired,
        AcquireOutcome::Held,
        AcquireOutcome::Unavailable,
        AcquireOutcome::Error,
        AcquireOutcome::Cancelled,
    ];
    const RELEASE_OUTCOMES: [ReleaseOutcome; 4] = [
        ReleaseOutcome::Released,
        ReleaseOutcome::Lost,
        ReleaseOutcome::Unavailable,
        ReleaseOutcome::Error,
    ];
    const CAUSES: [LossCause; 6] = [
        LossCause::Expired,
        LossCause::TakenByOther,
        LossCause::Unconfirmed,
        LossCause::MaxHold,
        LossCause::Deleted,
        LossCause::Broken,
    ];

    #[test]
    fn every_static_key_has_the_labels_its_index_stands_for() {
        for m in MODES {
            assert_eq!(
                labels(&ACQUIRE_CONTENDED_KEYS[m as usize]),
                [("mode", m.as_str())]
            );
            assert_eq!(
                labels(&ACQUIRE_HANDOFFS_KEYS[m as usize]),
                [("mode", m.as_str())]
            );
            for o in OUTCOMES {
                let want = [("mode", m.as_str()), ("outcome", o.as_str())];
                let key = &ACQUIRE_DURATION_KEYS[m as usize][o as usize];
                assert_eq!((key.name(), labels(key)), (ACQUIRE_DURATION, want.to_vec()));
                let key = &ACQUIRE_WAIT_KEYS[m as usize][o as usize];
                assert_eq!((key.name(), labels(key)), (ACQUIRE_WAIT, want.to_vec()));
            }
        }
        for (kind, k) in [
            (ReleaseKind::Release, "release"),
            (ReleaseKind::Drop, "drop"),
        ] {
            for o in RELEASE_OUTCOMES {
                assert_eq!(
                    labels(&RELEASES_KEYS[kind as usize][o as usize]),
                    [("kind", k), ("outcome", o.as_str())]
                );
                assert_eq!(
                    labels(&RELEASE_DURATION_KEYS[o as usize]),
                    [("outcome", o.as_str())]
                );
            }
        }
        for by in [WokenBy::Notification, WokenBy::Timer] {
            assert_eq!(
                labels(&WAITER_WAKEUPS_KEYS[by as usize]),
                [("by", by.as_str())]
            );
        }
        for (i, o) in ["renewed", "lost", "unknown"].into_iter().enumerate() {
            assert_eq!(labels(&RENEWALS_KEYS[i]), [("outcome", o)]);
        }
        for c in CAUSES {
            assert_eq!(
                labels(&LEASES_LOST_KEYS[cause_index(c)]),
                [("cause", cause_label(c))]
            );
        }
    }

    /// Counts the allocations of the calling thread, to show that recording without a
    /// recorder allocates nothing.
    #[allow(unsafe_code)] // a global allocator is an unsafe trait; this one only counts
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
        }

        pub struct Counting;

        // SAFETY: every call is passed on to `System` unchanged.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
                // SAFETY: the caller upholds `alloc`'s contract, which is `System`'s.
                unsafe { System.alloc(layout) }
            }

            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                // SAFETY: as above.
                unsafe { System.dealloc(ptr, layout) }
            }
        }

        #[global_allocator]
        static COUNTING: Counting = Counting;

        pub fn allocations() -> u64 {
            ALLOCATIONS.with(Cell::get)
        }
    }

    #[test]
    fn without_a_recorder_recording_allocates_nothing() {
        // The counter counts.
        let before = counting::allocations();
        drop(std::hint::black_box(Vec::<u8>::with_capacity(8)));
        assert_eq!(counting::allocations(), before + 1);

        let before = counting::allocations();
        for m in MODES {
            for o in OUTCOMES {
                acquire_ended(
                    m,
                    o,
                    Duration::from_millis(3),
                    Some(Duration::from_millis(2)),
                    true,
                );
            }
            contended(m);
        }
        woken(WokenBy::Notification);
        woken(WokenBy::Timer);
        for o in RELEASE_OUTCOMES {
            released(ReleaseKind::Release, o, Some(Duration::from_millis(1)));
            released(ReleaseKind::Drop, o, None);
        }
        lease_held(true);
        lease_held(false);
        renewal_batch(12, Duration::from_millis(4), 10, 1, 1);
        for c in CAUSES {
            lease_lost(c);
        }
        assert_eq!(counting::allocations(), before);
    }
}
