//! The run plan: what a quick and a full run measure and for how long, the settings of the
//! scenarios, and the targets the report checks.

use std::time::Duration;

/// How long a handoff contender holds the lock (tokio's timer has 1 ms resolution, so
/// the real hold is 1 to 2 ms).
pub(crate) const HANDOFF_HOLD: Duration = Duration::from_millis(1);
/// Waiters (contenders minus the holder) of the handoff rows.
pub(crate) const WAITERS: [usize; 3] = [1, 8, 64];
/// Contenders of the hot-key run (empty critical section).
pub(crate) const HOT_KEY_CONTENDERS: usize = 64;
/// Semaphores: the permits of every semaphore under test.
pub(crate) const SEMAPHORE_PERMITS: u32 = 4;
/// Semaphores: waiters of the handoff row (contenders minus the permits' holders).
pub(crate) const SEMAPHORE_WAITERS: usize = 8;
/// Targets of the performance issue (17), as ratios within one run.
/// Uncontended p50 at most this multiple of redis-rs alone (`SET NX PX` + release script).
pub(crate) const TARGET_RAW_RATIO: f64 = 1.2;
/// Handoff p50 with 1 waiter at most this many PING round trips ...
pub(crate) const TARGET_HANDOFF_PINGS: f64 = 3.0;
/// ... and with 8 and 64 waiters at most this multiple of the 1-waiter p50.
pub(crate) const TARGET_HANDOFF_GROWTH: f64 = 1.5;
/// Hot key, fair mode: min/max acquisitions per contender at least this.
pub(crate) const TARGET_FAIRNESS: f64 = 0.8;
/// Hot key, plain mode, as the issue measured it before (one quick run): acquisitions/s
/// and Redis commands per acquisition; the target is twice the one, fewer than the other.
pub(crate) const HOT_KEY_BEFORE: f64 = 1214.0;
pub(crate) const HOT_KEY_BEFORE_COMMANDS: f64 = 73.0;
/// Redlock with one node blackholed: p50 at most this multiple of all nodes up.
pub(crate) const TARGET_BLACKHOLED_RATIO: f64 = 1.2;
/// Nodes of the Redlock clients.
pub(crate) const REDLOCK_NODES: usize = 5;
/// Issue 15: uncontended p50 through Sentinel, and through a cluster, at most this
/// multiple of a standalone node's.
pub(crate) const TARGET_TOPOLOGY_RATIO: f64 = 1.1;
/// Issue 15: the watchdog's script calls per cluster master per renewal tick.
pub(crate) const TARGET_CALLS_PER_MASTER_TICK: f64 = 1.0;

/// What a run measures and for how long: [`QUICK`] or [`FULL`].
pub(crate) struct Plan {
    pub(crate) name: &'static str,
    pub(crate) pings: usize,
    /// Per handoff row; `slow_run` for the peers that poll at 100 ms or more.
    pub(crate) handoff_run: Duration,
    pub(crate) slow_run: Duration,
    /// Per hot-key row, and per semaphore throughput row (the semaphore handoff rows
    /// take `handoff_run`).
    pub(crate) hot_key_run: Duration,
    /// Messages of each of the two handoff-floor measurements.
    pub(crate) floor_messages: usize,
    /// Acquire + release cycles per client (single node, Redlock, Python, Node).
    pub(crate) latency_cycles: usize,
    /// Locks held at once with the watchdog on, and how long they are watched.
    pub(crate) held_locks: usize,
    pub(crate) held_window: Duration,
    /// Sentinel and Cluster: per throughput row, leases held on the cluster (watched
    /// for `held_window`), and failovers of each kind.
    pub(crate) topology_run: Duration,
    pub(crate) cluster_held_locks: usize,
    pub(crate) failovers: usize,
    /// How cost grows: the held-locks run at each of these sizes (each in a process of
    /// its own), watched for `growth_window` each.
    pub(crate) growth_held: &'static [usize],
    pub(crate) growth_window: Duration,
    /// How cost grows: fencelock's handoff (plain and `fair()`) at each of these waiter
    /// counts, `handoff_run` each (those in [`WAITERS`] are the handoff rows').
    pub(crate) growth_waiters: &'static [usize],
    /// What fencing costs at the resource: writes per variant of the latency turns (one
    /// client), and throughput ([`crate::fencing::CLIENTS`] clients) for `fencing_run`
    /// per variant, in windows of `fencing_window` taking turns.
    pub(crate) fencing_ops: usize,
    pub(crate) fencing_run: Duration,
    pub(crate) fencing_window: Duration,
    /// Election takeover after a kill: rounds per way (an election's standby, a plain
    /// lock's waiter) at each lease.
    pub(crate) election_rounds: &'static [(Duration, usize)],
    pub(crate) img_dir: &'static str,
}

pub(crate) const QUICK: Plan = Plan {
    name: "quick",
    pings: 5_000,
    handoff_run: Duration::from_secs(1),
    slow_run: Duration::from_secs(2),
    hot_key_run: Duration::from_millis(1500),
    floor_messages: 1_000,
    latency_cycles: 1_000,
    held_locks: 10_000,
    held_window: Duration::from_secs(5),
    topology_run: Duration::from_secs(2),
    cluster_held_locks: 10_000,
    failovers: 1,
    growth_held: &[1_000, 10_000, 100_000],
    growth_window: Duration::from_secs(5),
    growth_waiters: &[1, 4, 16, 64, 256],
    fencing_ops: 1_000,
    fencing_run: Duration::from_millis(800),
    fencing_window: Duration::from_millis(200),
    election_rounds: &[(Duration::from_secs(1), 5)],
    img_dir: "target/bench-img",
};

pub(crate) const FULL: Plan = Plan {
    name: "full",
    pings: 50_000,
    handoff_run: Duration::from_secs(10),
    slow_run: Duration::from_secs(20),
    hot_key_run: Duration::from_secs(10),
    floor_messages: 5_000,
    latency_cycles: 20_000,
    held_locks: 100_000,
    held_window: Duration::from_secs(20),
    topology_run: Duration::from_secs(10),
    cluster_held_locks: 100_000,
    failovers: 3,
    growth_held: &[1_000, 10_000, 100_000, 200_000, 1_000_000],
    growth_window: Duration::from_secs(10),
    growth_waiters: &[1, 2, 4, 8, 16, 32, 64, 128, 256],
    fencing_ops: 10_000,
    fencing_run: Duration::from_secs(10),
    fencing_window: Duration::from_millis(500),
    election_rounds: &[(Duration::from_secs(1), 20), (Duration::from_secs(3), 5)],
    img_dir: "docs/img",
};
