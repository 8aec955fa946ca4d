//! The scenarios: each runs one round under a tag of its own (its lock name, resource
//! keys and history files), judges the merged history and returns an
//! [`Outcome`](crate::outcomes::Outcome) with the expectations that failed. Every fault
//! is really caused: a worker process stops itself (SIGSTOP) or is SIGKILLed, a
//! redis-server is paused, killed or restarted, or a [`FaultProxy`](testkit::FaultProxy)
//! on the link delays, blackholes or partitions the traffic.
//!
//! Each scenario's [`Scenario`] descriptor (its name, what happens and what is expected,
//! as the report shows them, and how to run one round) sits next to the code that runs
//! it, grouped by fault:
//! - [`baseline`]: no faults;
//! - [`pauses_kills`]: one lock server; a worker paused or killed holding the lock (or
//!   leading an election), the resource server killed, the lock server paused;
//! - [`network`]: one lock server; a worker's link delayed or its replies dropped;
//! - [`lock_state`]: one lock server, the harness as the clients; the fencing counter
//!   set back, a lease expiring under its holder, the lock key evicted under memory
//!   pressure;
//! - [`clock`]: the lock server's wall clock stepped forward (leases expire early) and
//!   back (keys live longer; tokens hold through the counter, not without it);
//! - [`cli`]: `fencelock run` itself SIGKILLed, SIGSTOPped, sent SIGTSTP while its
//!   COMMAND works, judged from COMMAND's history (and a COMMAND escaping supervision);
//!   the leader of `fencelock elect` SIGKILLed or SIGSTOPped past its lease, its standby
//!   taking over;
//! - [`redlock_restart`]: Redlock, a node crashing and restarting under a holder;
//! - [`redlock`]: Redlock, a minority or majority of nodes failing, split clients;
//! - [`fair`]: fair mode, whose release hands the lock to the next waiter; waiters
//!   paused and killed in line;
//! - [`wakes`]: plain mode and a semaphore, whose release wakes one listed client by
//!   name; listed clients paused and killed;
//! - [`semaphore`]: a semaphore of 2 permits, its holders at once, paused and killed;
//! - [`multi`]: several locks at once, sets overlapping in a cycle;
//! - [`rwlock`]: a read-write lock's readers and writers; readers paused, killed and
//!   removed, a waiting writer killed;
//! - [`failover`]: a Sentinel group's master, or a cluster's master of the lock's slot,
//!   killed right after a grant its replica missed, with and without replica
//!   acknowledgement; and the same under leader election;
//! - [`nemesis`]: a schedule of faults of every kind drawn from the seed, each violation
//!   explained by a fault or reported with the seed and a shortened history.
//!
//! [`ALL`] lists them in run order.

mod baseline;
mod cli;
mod clock;
mod failover;
mod fair;
mod lock_state;
mod multi;
mod nemesis;
mod network;
mod pauses_kills;
mod redlock;
mod redlock_restart;
mod rwlock;
mod semaphore;
mod wakes;

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use testkit::history::{Op, Phase, read_history};

use crate::harness::Lab;
use crate::outcomes::Outcome;

/// How much of each scenario one run does.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub name: &'static str,
    /// Rounds of every scenario.
    pub rounds: u32,
    /// Iterations per worker of the no-faults scenario.
    pub steady: u32,
    /// Iterations per worker of the fault scenarios with steady traffic.
    pub faulty: u32,
    /// Failovers per round of the failover scenarios.
    pub failovers: u32,
    /// How long the nemesis injects faults per round.
    pub nemesis: Duration,
}

pub const SHORT: Scale = Scale {
    name: "short",
    rounds: 1,
    steady: 30,
    faulty: 12,
    failovers: 1,
    nemesis: Duration::from_secs(6),
};

/// About an hour on 2 cores; the fault scenarios alone make well over 100,000
/// acquisitions (the nemesis about half of them).
pub const LONG: Scale = Scale {
    name: "long",
    rounds: 5,
    steady: 3_000,
    faulty: 1_000,
    failovers: 3,
    nemesis: Duration::from_secs(120),
};

/// Slack on top of a TTL for "the next holder gets the lock within one TTL": the
/// waiters' wake-up and one round trip on a loaded 2-core machine.
const AVAILABILITY_SLACK: Duration = Duration::from_millis(300);

/// One scenario of the run: its name, what it does and expects (for the report), and
/// how to run one round of it under a tag.
pub struct Scenario {
    /// Its name in the report and for `--only`, and the stem of its round's tag.
    pub name: &'static str,
    /// The report's "what happens".
    pub what: &'static str,
    /// The report's "expected".
    pub expected: &'static str,
    /// Runs one round.
    pub run: RoundFn,
}

/// Runs one round of a scenario under a tag, at the run's scale.
pub type RoundFn = fn(&mut Lab, &str, Scale) -> Result<Outcome, String>;

/// Every scenario, in run order. The protected crash-restart runs before the
/// unprotected one: it needs every node up longer than its quarantine, and the
/// unprotected one (like the killed minority) restarts nodes.
pub const ALL: &[Scenario] = &[
    baseline::NO_FAULTS,
    pauses_kills::PAUSED_WORKER_FENCED,
    pauses_kills::PAUSED_WORKER_UNFENCED,
    pauses_kills::PAUSED_WORKER_RENEWED,
    pauses_kills::PAUSED_WORKER_POSTGRES,
    pauses_kills::PAUSED_WORKER_POSTGRES_UNFENCED,
    pauses_kills::PAUSED_WORKER_POSTGRES_RENEWED,
    pauses_kills::ELECT_PAUSED_LEADER,
    pauses_kills::HOLDER_KILLED,
    pauses_kills::HOLDER_KILLED_POSTGRES,
    pauses_kills::HOLDER_KILLED_LONG_LEASE,
    pauses_kills::RESOURCE_CRASH,
    lock_state::COUNTER_REWOUND,
    network::DELAYED_REPLIES,
    network::DROPPED_REPLIES,
    pauses_kills::QUEUED_SET_NX,
    fair::FAIR_HANDOVER,
    wakes::PLAIN_NAMED_WAKES,
    semaphore::SEMAPHORE_STEADY,
    multi::OVERLAPPING_SETS,
    wakes::SEMAPHORE_NAMED_WAKES,
    semaphore::SEMAPHORE_PAUSED_RENEWED,
    semaphore::SEMAPHORE_PAUSED_FIXED,
    semaphore::SEMAPHORE_PERMIT_REMOVED,
    semaphore::SEMAPHORE_HOLDERS_KILLED,
    rwlock::RW_STEADY,
    rwlock::RW_READER_PAUSED_RENEWED,
    rwlock::RW_READER_PAUSED_FIXED,
    rwlock::RW_READER_REMOVED,
    rwlock::RW_READERS_KILLED,
    rwlock::RW_WAITING_WRITER_KILLED,
    lock_state::EXPIRED_HOLDER,
    lock_state::EVICTED_LOCK_KEY,
    clock::CLOCK_STEP_FORWARD,
    clock::CLOCK_STEP_BACK,
    cli::CLI_KILLED,
    cli::CLI_STOPPED,
    cli::CLI_SUSPENDED,
    cli::CLI_UNSUPERVISED,
    cli::ELECT_KILLED,
    cli::ELECT_STOPPED,
    redlock_restart::REDLOCK_RESTART_PROTECTED,
    redlock_restart::REDLOCK_RESTART_UNPROTECTED,
    redlock_restart::REDLOCK_RESTART_PERSISTENT,
    redlock::REDLOCK_MINORITY_BLACKHOLED,
    redlock::REDLOCK_MINORITY_PAUSED,
    redlock::REDLOCK_MINORITY_KILLED,
    redlock::REDLOCK_MAJORITY_DOWN,
    redlock::REDLOCK_PARTITIONED,
    failover::SENTINEL_FAILOVER,
    failover::SENTINEL_FAILOVER_REPLICAS,
    failover::ELECT_SENTINEL_FAILOVER,
    failover::ELECT_SENTINEL_FAILOVER_REPLICAS,
    failover::CLUSTER_FAILOVER,
    failover::CLUSTER_FAILOVER_REPLICAS,
    nemesis::NEMESIS,
];

/// The scenarios whose name contains one of `only` (all if empty).
pub fn chosen(only: &[String]) -> Vec<&'static Scenario> {
    ALL.iter()
        .filter(|sc| only.is_empty() || only.iter().any(|o| sc.name.contains(o.as_str())))
        .collect()
}

/// Steady workers: an upper bound on their iterations (the harness's stop file ends
/// them).
const STEADY_MAX: u32 = 1_000_000;

/// How long a failover, a rejoin or a worker's next step may take here.
const WITHIN: Duration = Duration::from_secs(20);

/// How many `op`/`phase` records of the history at `path` come after `from_ns`.
fn count(path: &Path, from_ns: u64, op: Op, phase: Phase) -> Result<usize, String> {
    if !path.exists() {
        return Ok(0);
    }
    Ok(read_history(path)
        .map_err(|e| e.to_string())?
        .iter()
        .filter(|e| e.time_ns > from_ns && e.op == op && e.phase == phase)
        .count())
}

fn has(path: &Path, from_ns: u64, op: Op, phase: Phase) -> Result<bool, String> {
    count(path, from_ns, op, phase).map(|n| n > 0)
}

/// Polls `done` every 20 ms (it reads whole histories) until it holds; an error after
/// [`WITHIN`].
fn wait_until(tag: &str, what: &str, mut done: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + WITHIN;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("{tag}: {what}: not within {WITHIN:?}"));
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
