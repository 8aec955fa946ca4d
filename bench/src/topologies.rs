//! Sentinel and Cluster: what fencelock costs through `redis+sentinel://` and
//! `redis+cluster://` rather than a standalone node (issue 15).
//!
//! Four measurements, on testkit's real deployments (a Sentinel group: a master, a
//! replica, three sentinels; clusters of real nodes):
//!
//! - **Latency**: the uncontended cycle of [`crate::latency`] through a standalone node,
//!   through Sentinel and through a 3-master cluster, in turns (with a PING to each path's
//!   node) so the machine's drift hits them alike, pinned as the latency run is.
//! - **Throughput**: many tasks of one client, each acquiring and releasing its own lock
//!   names as fast as it can, on a standalone node, a 1-master and a 3-master cluster.
//! - **Renewals**: many leases held on the 3-master cluster, the watchdog's script calls
//!   counted per master (`INFO commandstats`, as [`crate::held`] counts them).
//! - **Failover**: the time from `SIGKILL` of the master to the first successful
//!   `try_acquire` through the Sentinel or cluster URL.
//!
//! Every server is started here, on the calling thread (testkit ties each server's
//! `PR_SET_PDEATHSIG` to it), and dropped before [`run`] returns.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use testkit::{Cluster, RedisServer, SentinelGroup};

use crate::clock::{cpu_time, process_cpu_time};
use crate::held::{self, LEASE, TICK, command_stat, query};
use crate::latency::{self, Cycler, Series, TTL};
use crate::plan::{Plan, TARGET_CALLS_PER_MASTER_TICK, TARGET_TOPOLOGY_RATIO};
use crate::report::{self, fmt_ns, x, yes_no};
use crate::servers;

/// Sentinel's `down-after-milliseconds`: how long the master may not answer before the
/// sentinels call it down.
pub(crate) const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// Sentinel's `failover-timeout`.
pub(crate) const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);
/// `cluster-node-timeout`: how long a master may not answer before it is failed over.
pub(crate) const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Masters of the clusters of the latency, renewal and failover runs.
pub(crate) const MASTERS: usize = 3;
/// Tasks of a throughput row, and the lock names each goes through in turn.
pub(crate) const THROUGHPUT_TASKS: usize = 32;
pub(crate) const NAMES_PER_TASK: usize = 16;
/// Cycles of a throughput row before its window starts (connections, scripts loaded).
const THROUGHPUT_WARMUP: Duration = Duration::from_millis(300);
/// How long a failover may take before the run gives up on it.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
/// Pause between two attempts after the kill (and between two polls of the promotion).
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(10);
/// Bound of one attempt, should the library's own timeouts not end it.
const ATTEMPT_LIMIT: Duration = Duration::from_secs(10);
/// Hash slots of a cluster.
const SLOTS: u16 = 16384;

/// Everything the section measured.
pub(crate) struct Topologies {
    pub(crate) latency: Result<TopologyLatency, String>,
    pub(crate) throughput: Vec<ThroughputRow>,
    pub(crate) renewals: Result<ClusterRenewals, String>,
    pub(crate) failovers: Vec<Failover>,
}

impl Topologies {
    /// Whether any measurement failed.
    pub(crate) fn failed(&self) -> bool {
        self.latency.is_err()
            || self
                .throughput
                .iter()
                .any(|r| r.error.is_some() || r.errors > 0)
            || match &self.renewals {
                Ok(r) => !r.all_alive() || !r.flushed,
                Err(_) => true,
            }
            || self.failovers.iter().any(|f| f.result.is_err())
    }
}

/// The uncontended cycle through each path, measured in turns.
pub(crate) struct TopologyLatency {
    pub(crate) cycles: usize,
    pub(crate) warmup: usize,
    pub(crate) standalone: Series,
    pub(crate) sentinel: Series,
    pub(crate) cluster: Series,
    /// In the same turns, to tell the library's path from the servers': the cycle through
    /// a plain `redis://` URL at Sentinel's master and at the cluster master of the
    /// name's slot, and a redis-rs PING (one connection each) to each path's node.
    pub(crate) diagnostics: Vec<(&'static str, Series)>,
    pub(crate) placement: String,
}

/// One throughput row.
pub(crate) struct ThroughputRow {
    pub(crate) label: &'static str,
    pub(crate) acquisitions: u64,
    /// The measured window, as it really lasted.
    pub(crate) window: Duration,
    /// Failed cycles, and the first failure.
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    /// CPU over the window: the harness process, and every master together.
    pub(crate) client_cpu: Duration,
    pub(crate) server_cpu: Option<Duration>,
    /// Why the row could not run.
    pub(crate) error: Option<String>,
}

impl ThroughputRow {
    fn failed(label: &'static str, error: String) -> Self {
        ThroughputRow {
            label,
            acquisitions: 0,
            window: Duration::ZERO,
            errors: 0,
            first_error: None,
            client_cpu: Duration::ZERO,
            server_cpu: None,
            error: Some(error),
        }
    }

    /// Acquisitions (each released) per second.
    pub(crate) fn per_second(&self) -> f64 {
        if self.window.is_zero() {
            0.0
        } else {
            self.acquisitions as f64 / self.window.as_secs_f64()
        }
    }
}

/// The watchdog's calls on one cluster master in the window.
pub(crate) struct MasterCalls {
    pub(crate) addr: String,
    /// `evalsha` + `eval` calls.
    pub(crate) calls: u64,
    /// Leases renewed: `PEXPIRE` calls (inside the scripts) / 2, as a renewal extends
    /// the lock key and its holder-info key (`renew_lease` in `fragments/lease.lua`).
    pub(crate) renewals: u64,
    pub(crate) dbsize: u64,
}

/// Many leases held on the cluster, the watchdog on.
pub(crate) struct ClusterRenewals {
    pub(crate) locks: usize,
    pub(crate) acquire_time: Duration,
    pub(crate) window: Duration,
    pub(crate) masters: Vec<MasterCalls>,
    pub(crate) lost: usize,
    pub(crate) watched: usize,
    pub(crate) release_time: Duration,
    pub(crate) flushed: bool,
}

impl ClusterRenewals {
    /// Renewal ticks in the window.
    pub(crate) fn ticks(&self) -> f64 {
        self.window.as_secs_f64() / TICK.as_secs_f64()
    }

    /// Script calls per tick, all masters.
    pub(crate) fn calls_per_tick(&self) -> f64 {
        self.masters.iter().map(|m| m.calls).sum::<u64>() as f64 / self.ticks()
    }

    /// Script calls per tick of the busiest master.
    pub(crate) fn max_calls_per_master_tick(&self) -> f64 {
        self.masters.iter().map(|m| m.calls).max().unwrap_or(0) as f64 / self.ticks()
    }

    /// Leases renewed per tick, all masters.
    pub(crate) fn renewals_per_tick(&self) -> f64 {
        self.masters.iter().map(|m| m.renewals).sum::<u64>() as f64 / self.ticks()
    }

    /// The fewest calls per tick the watchdog could send one master: its share of the
    /// leases renewed per tick / the batch size (the watchdog groups the due leases by
    /// master, then cuts each group into batches, one call each).
    pub(crate) fn floor_calls_per_master_tick(&self) -> f64 {
        self.renewals_per_tick()
            / self.masters.len().max(1) as f64
            / fencelock::limits::RENEWAL_BATCH as f64
    }

    /// Every lease stayed alive through the window.
    pub(crate) fn all_alive(&self) -> bool {
        self.masters.iter().map(|m| m.dbsize).sum::<u64>() == 2 * self.locks as u64
            && self.lost == 0
            && self.watched == self.locks
    }
}

/// Which deployment failed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    Sentinel,
    Cluster,
}

/// One failover.
pub(crate) struct Failover {
    pub(crate) topology: Topology,
    pub(crate) result: Result<FailoverRun, String>,
}

/// What one failover took.
pub(crate) struct FailoverRun {
    /// From the kill until the sentinels named another master / the replica answered
    /// `ROLE` master (polled every [`RETRY_PAUSE`]); `None` if not seen.
    pub(crate) promoted: Option<Duration>,
    /// From the kill until a `try_acquire` returned a guard.
    pub(crate) acquired: Duration,
    /// Attempts that failed before, and the last failure.
    pub(crate) failed_attempts: u64,
    /// The longest attempt (an attempt sent while the master is down may wait out the
    /// driver's retries).
    pub(crate) longest_attempt: Duration,
    pub(crate) last_error: Option<String>,
}

/// Runs the section: starts the deployments, measures, stops them. `standalone` is the
/// run's main node.
pub(crate) async fn run(plan: &Plan, standalone: &RedisServer) -> Topologies {
    let started = Instant::now();
    let mut sentinel = sentinel_group();
    let mut cluster = Cluster::builder()
        .masters(MASTERS)
        .replicas_per_master(1)
        .node_timeout(NODE_TIMEOUT)
        .start();

    eprintln!(
        "topologies: latency, {} cycles per path (standalone, Sentinel, cluster)",
        plan.latency_cycles
    );
    let latency = latency(plan.latency_cycles, standalone, &sentinel, &cluster).await;
    if let Err(e) = &latency {
        eprintln!("topologies latency failed: {e}");
    }

    let mut failovers = Vec::new();
    for i in 0..plan.failovers {
        eprintln!("topologies: Sentinel failover {}", i + 1);
        if i > 0 {
            // Each failover leaves the group without a replica: a fresh one each time.
            sentinel = sentinel_group();
        }
        let result = sentinel_failover(&mut sentinel, i).await;
        if let Err(e) = &result {
            eprintln!("Sentinel failover failed: {e}");
        }
        failovers.push(Failover {
            topology: Topology::Sentinel,
            result,
        });
    }
    drop(sentinel);

    let mut throughput = Vec::new();
    for masters in [0, 1, MASTERS] {
        let label = match masters {
            0 => "standalone node",
            1 => "cluster, 1 master",
            _ => "cluster, 3 masters",
        };
        eprintln!(
            "topologies: throughput, {label}, {THROUGHPUT_TASKS} tasks, {:?}",
            plan.topology_run
        );
        let row = if masters == 0 {
            throughput_row(label, &standalone.url(), &[standalone], plan.topology_run).await
        } else {
            // Without replicas, so that the two clusters differ in their masters only.
            let c = Cluster::builder()
                .masters(masters)
                .replicas_per_master(0)
                .start();
            throughput_row(label, &c.url(), &c.masters(), plan.topology_run).await
        };
        if let Some(e) = row.error.as_ref().or(row.first_error.as_ref()) {
            eprintln!("throughput {label}: {e}");
        }
        throughput.push(row);
    }

    eprintln!(
        "topologies: {} leases held on the cluster, watched for {:?}",
        plan.cluster_held_locks, plan.held_window
    );
    let renewals = renewals(&cluster, plan.cluster_held_locks, plan.held_window).await;
    match &renewals {
        Err(e) => eprintln!("cluster renewals failed: {e}"),
        Ok(r) if !r.all_alive() || !r.flushed => {
            eprintln!("cluster renewals: not every lease stayed alive, or releases timed out")
        }
        Ok(_) => {}
    }

    // Each failover kills another of the masters that still have a replica.
    for i in 0..plan.failovers.min(MASTERS) {
        eprintln!("topologies: cluster failover {}", i + 1);
        let result = cluster_failover(&mut cluster, i).await;
        if let Err(e) = &result {
            eprintln!("cluster failover failed: {e}");
        }
        failovers.push(Failover {
            topology: Topology::Cluster,
            result,
        });
    }
    drop(cluster);
    eprintln!(
        "topologies: done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Topologies {
        latency,
        throughput,
        renewals,
        failovers,
    }
}

fn sentinel_group() -> SentinelGroup {
    SentinelGroup::builder()
        .down_after(DOWN_AFTER)
        .failover_timeout(FAILOVER_TIMEOUT)
        .start()
}

async fn latency(
    cycles: usize,
    standalone: &RedisServer,
    sentinel: &SentinelGroup,
    cluster: &Cluster,
) -> Result<TopologyLatency, String> {
    let connect = |url: String| async move {
        fencelock::Client::connect(&url)
            .await
            .map_err(|e| format!("connect {url}: {e}"))
    };
    let via_standalone = connect(standalone.url()).await?;
    let via_sentinel = connect(sentinel.url()).await?;
    let via_cluster = connect(cluster.url()).await?;
    const NAME: &str = "bench-topology-latency";
    let sentinel_master = sentinel.master();
    let cluster_master = cluster.node_for_key(NAME);
    let lock = |c: &fencelock::Client| Cycler::Fence(c.lock(NAME).lease(TTL).renew(false));
    // A plain client at a cluster node works for the names of that node's slots.
    let at_sentinel_master = connect(sentinel_master.url()).await?;
    let at_cluster_master = connect(cluster_master.url()).await?;
    let mut clients = vec![
        ("standalone", lock(&via_standalone)),
        ("Sentinel", lock(&via_sentinel)),
        ("cluster", lock(&via_cluster)),
        (
            "Sentinel's master through redis:// (a plain client, no Sentinel)",
            lock(&at_sentinel_master),
        ),
        (
            "the cluster master through redis:// (a plain client, no cluster routing)",
            lock(&at_cluster_master),
        ),
        (
            "PING, standalone node",
            Cycler::Ping(latency::connect(&standalone.url()).await?),
        ),
        (
            "PING, Sentinel's master",
            Cycler::Ping(latency::connect(&sentinel_master.url()).await?),
        ),
        (
            "PING, the cluster master of the name's slot",
            Cycler::Ping(latency::connect(&cluster_master.url()).await?),
        ),
    ];
    // The data path first, so that with more than two CPUs it gets CPUs of its own.
    let mut servers: Vec<(&str, &RedisServer)> = vec![
        ("the standalone node", standalone),
        ("Sentinel's master", sentinel_master),
        ("the cluster master of the lock's slot", cluster_master),
    ];
    let data_path: Vec<u32> = servers.iter().map(|(_, s)| s.pid()).collect();
    let others = sentinel
        .nodes()
        .iter()
        .chain(sentinel.sentinels())
        .chain(cluster.nodes())
        .filter(|s| !data_path.contains(&s.pid()));
    servers.extend(others.map(|s| ("the other nodes and the sentinels", s)));
    let (pins, placement) = servers::pin_apart(&servers);
    let measured = latency::in_turns(&mut clients, cycles).await;
    drop(pins);
    via_standalone.flush().await;
    via_sentinel.flush().await;
    via_cluster.flush().await;
    at_sentinel_master.flush().await;
    at_cluster_master.flush().await;
    let (warmup, samples) = measured?;
    let mut series = Vec::new();
    for ((label, _), s) in clients.into_iter().zip(samples) {
        series.push((label, Series::new(s)?));
    }
    let mut series = series.into_iter();
    let mut next = || {
        series
            .next()
            .map(|(_, s)| s)
            .ok_or("missing series".to_owned())
    };
    Ok(TopologyLatency {
        cycles,
        warmup,
        standalone: next()?,
        sentinel: next()?,
        cluster: next()?,
        diagnostics: series.collect(),
        placement,
    })
}

/// One throughput row: [`THROUGHPUT_TASKS`] tasks of one client on `url`, each cycling
/// through [`NAMES_PER_TASK`] lock names of its own (acquire, release at once), for
/// `window` after a warm-up; `masters` are the servers whose CPU is counted.
async fn throughput_row(
    label: &'static str,
    url: &str,
    masters: &[&RedisServer],
    window: Duration,
) -> ThroughputRow {
    let client = match fencelock::Client::connect(url).await {
        Ok(c) => c,
        Err(e) => return ThroughputRow::failed(label, format!("connect: {e}")),
    };
    let pids: Vec<u32> = masters.iter().map(|m| m.pid()).collect();
    let server_cpu = || {
        pids.iter()
            .map(|&p| process_cpu_time(p))
            .sum::<Option<Duration>>()
    };
    let start = Instant::now() + THROUGHPUT_WARMUP;
    let end = start + window;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..THROUGHPUT_TASKS {
        let client = client.clone();
        tasks.spawn(async move {
            let (mut done, mut errors, mut first_error) = (0u64, 0u64, None);
            for i in 0.. {
                if Instant::now() >= end {
                    break;
                }
                let lock = client
                    .lock(format!("throughput:{t}:{}", i % NAMES_PER_TASK))
                    .lease(TTL)
                    .renew(false);
                let cycle = async { lock.try_acquire().await?.release().await }.await;
                match cycle {
                    Ok(()) => {
                        let now = Instant::now();
                        done += u64::from(now >= start && now < end);
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            (done, errors, first_error)
        });
    }
    tokio::time::sleep_until(start.into()).await;
    let (cpu0, server0, t0) = (cpu_time(), server_cpu(), Instant::now());
    tokio::time::sleep_until(end.into()).await;
    let (cpu1, server1, measured) = (cpu_time(), server_cpu(), t0.elapsed());
    let mut row = ThroughputRow {
        window: measured,
        client_cpu: cpu1.saturating_sub(cpu0),
        server_cpu: server0.zip(server1).map(|(a, b)| b.saturating_sub(a)),
        ..ThroughputRow::failed(label, String::new())
    };
    row.error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((done, errors, first)) => {
                row.acquisitions += done;
                row.errors += errors;
                if row.first_error.is_none() {
                    row.first_error = first;
                }
            }
            Err(e) => row.error = Some(format!("a task failed: {e}")),
        }
    }
    client.flush().await;
    row
}

/// Holds `locks` leases on `cluster` with the watchdog on (as [`held::run`] does on one
/// node) and counts, per master, the script calls and renewals of a `window`.
async fn renewals(
    cluster: &Cluster,
    locks: usize,
    window: Duration,
) -> Result<ClusterRenewals, String> {
    let client = fencelock::Client::connect(&cluster.url())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    for i in 0..100 {
        let guard = client
            .lock(format!("held-warmup:{i}"))
            .lease(LEASE)
            .try_acquire()
            .await
            .map_err(|e| format!("warm-up acquire: {e}"))?;
        guard
            .release()
            .await
            .map_err(|e| format!("warm-up release: {e}"))?;
    }
    let mut admins = Vec::new();
    for m in cluster.masters() {
        let mut conn = latency::connect(&m.url()).await?;
        query::<String>(&mut conn, &["FLUSHALL"]).await?;
        admins.push((m.addr(), conn));
    }

    let started = Instant::now();
    let held = held::acquire_many(&client, locks).await?;
    let acquire_time = started.elapsed();
    for (_, conn) in &mut admins {
        query::<String>(conn, &["CONFIG", "RESETSTAT"]).await?;
    }
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let window = t0.elapsed();
    let mut masters = Vec::new();
    for (addr, conn) in &mut admins {
        let stats: String = query(conn, &["INFO", "commandstats"]).await?;
        let calls = |cmd: &str| command_stat(&stats, cmd, "calls").unwrap_or(0);
        masters.push(MasterCalls {
            addr: addr.clone(),
            calls: calls("evalsha") + calls("eval"),
            renewals: calls("pexpire") / 2,
            dbsize: query(conn, &["DBSIZE"]).await?,
        });
    }
    let lost = held
        .iter()
        .flatten()
        .filter(|g| g.loss_cause().is_some())
        .count();
    let watched = client.stats().watched_leases;

    let released = Instant::now();
    drop(held);
    let flushed = tokio::time::timeout(held::FLUSH_TIMEOUT, client.flush())
        .await
        .is_ok();
    Ok(ClusterRenewals {
        locks,
        acquire_time,
        window,
        masters,
        lost,
        watched,
        release_time: released.elapsed(),
        flushed,
    })
}

/// Kills Sentinel's master and times the first successful acquire of a new name through
/// the Sentinel URL (a client connected before the kill, retrying every
/// [`RETRY_PAUSE`]), while polling a sentinel for the promotion.
async fn sentinel_failover(group: &mut SentinelGroup, rep: usize) -> Result<FailoverRun, String> {
    let client = fencelock::Client::connect(&group.url())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    warm_up(&client, &format!("sentinel-warm:{rep}")).await?;
    let old = group.master_addr();
    let service = group.service().to_owned();
    let mut sentinel = latency::connect(&group.sentinels()[0].url()).await?;
    let killed = Instant::now();
    group.node_mut(&old).kill();
    let promoted = async {
        while killed.elapsed() < FAILOVER_LIMIT {
            let named: Result<Vec<String>, _> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&service)
                .query_async(&mut sentinel)
                .await;
            if let Ok(named) = named
                && named.join(":") != old
            {
                return Some(killed.elapsed());
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        None
    };
    let names = (0..).map(|i| format!("sentinel-failover:{rep}:{i}"));
    let (promoted, acquired) = tokio::join!(promoted, first_acquire(&client, killed, names));
    client.flush().await;
    let (acquired, failed_attempts, longest_attempt, last_error) = acquired?;
    Ok(FailoverRun {
        promoted,
        acquired,
        failed_attempts,
        longest_attempt,
        last_error,
    })
}

/// Kills a master that still has a replica and times the first successful acquire of a new name of that
/// master's slots through the cluster URL (a client connected before the kill, retrying
/// every [`RETRY_PAUSE`]), while polling the replica's `ROLE` for its promotion.
async fn cluster_failover(cluster: &mut Cluster, rep: usize) -> Result<FailoverRun, String> {
    let client = fencelock::Client::connect(&cluster.url())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let victim = cluster
        .masters()
        .into_iter()
        .map(RedisServer::addr)
        .find(|m| !cluster.replicas_of(m).is_empty())
        .ok_or("no master with a replica left")?;
    let replica = cluster.replicas_of(&victim)[0].url();
    let ranges = slot_ranges(cluster, &victim)?;
    let mut names = (0..)
        .map(move |i| format!("cluster-failover:{rep}:{i}"))
        .filter(move |n| {
            let slot = key_slot(n);
            ranges.iter().any(|&(a, b)| a <= slot && slot <= b)
        });
    // The client learns the topology, and the first name is checked against the cluster's
    // own hash (the lock key is `{name}`, hashed on the name alone).
    let warm = names.next().ok_or("no name")?;
    if cluster.slot_of(&warm) != key_slot(&warm) {
        return Err(format!(
            "CLUSTER KEYSLOT {warm} disagrees with the bench's hash"
        ));
    }
    warm_up(&client, &warm).await?;
    let mut role = latency::connect(&replica).await?;
    let killed = Instant::now();
    cluster.node_mut(&victim).kill();
    let promoted = async {
        while killed.elapsed() < FAILOVER_LIMIT {
            let reply: Result<redis::Value, _> = redis::cmd("ROLE").query_async(&mut role).await;
            if let Ok(redis::Value::Array(fields)) = reply
                && matches!(fields.first(), Some(redis::Value::BulkString(b)) if b == b"master")
            {
                return Some(killed.elapsed());
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        None
    };
    let (promoted, acquired) = tokio::join!(promoted, first_acquire(&client, killed, names));
    client.flush().await;
    let (acquired, failed_attempts, longest_attempt, last_error) = acquired?;
    // Settled everywhere before the next kill.
    let slot = key_slot(&warm);
    let settle = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cluster.wait_for_failover(slot, FAILOVER_LIMIT)
    }));
    settle.map_err(|_| format!("slot {slot} not settled after the failover"))?;
    Ok(FailoverRun {
        promoted,
        acquired,
        failed_attempts,
        longest_attempt,
        last_error,
    })
}

/// One acquire + release of `name`, so the client has its connections and scripts.
async fn warm_up(client: &fencelock::Client, name: &str) -> Result<(), String> {
    let guard = client
        .lock(name)
        .lease(TTL)
        .renew(false)
        .try_acquire()
        .await
        .map_err(|e| format!("warm-up acquire: {e}"))?;
    guard
        .release()
        .await
        .map_err(|e| format!("warm-up release: {e}"))
}

/// Tries to acquire the next of `names` until one attempt succeeds (a new name each
/// time, so that an attempt whose outcome was unknown cannot make a later one find its
/// lock held); the time since `since`, the failed attempts, the longest attempt and the
/// last failure.
async fn first_acquire(
    client: &fencelock::Client,
    since: Instant,
    names: impl Iterator<Item = String>,
) -> Result<(Duration, u64, Duration, Option<String>), String> {
    let (mut failed, mut longest, mut last_error) = (0, Duration::ZERO, None);
    for name in names {
        let attempt = client.lock(name).lease(TTL).renew(false).try_acquire();
        let sent = Instant::now();
        let outcome = tokio::time::timeout(ATTEMPT_LIMIT, attempt).await;
        longest = longest.max(sent.elapsed());
        match outcome {
            Ok(Ok(guard)) => {
                let took = since.elapsed();
                let _ = guard.release().await;
                return Ok((took, failed, longest, last_error));
            }
            Ok(Err(e)) => last_error = Some(e.to_string()),
            Err(_) => last_error = Some(format!("no answer within {ATTEMPT_LIMIT:?}")),
        }
        failed += 1;
        if since.elapsed() > FAILOVER_LIMIT {
            return Err(format!(
                "no acquire within {FAILOVER_LIMIT:?} of the kill ({failed} attempts; last: {})",
                last_error.unwrap_or_default()
            ));
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    Err("ran out of names".to_owned())
}

/// The slot ranges `master` serves, from its `CLUSTER SLOTS`.
fn slot_ranges(cluster: &Cluster, master: &str) -> Result<Vec<(u16, u16)>, String> {
    let port: i64 = master
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("no port in {master}"))?;
    let reply = cluster.cmd(master, &["CLUSTER", "SLOTS"]);
    let ranges: Vec<(u16, u16)> = reply
        .as_array()
        .ok_or_else(|| format!("CLUSTER SLOTS: {reply}"))?
        .iter()
        .filter_map(|r| {
            let r = r.as_array()?;
            let owner = r.get(2)?.as_array()?;
            (owner.get(1)?.as_int()? == port).then_some((
                u16::try_from(r.first()?.as_int()?).ok()?,
                u16::try_from(r.get(1)?.as_int()?).ok()?,
            ))
        })
        .collect();
    if ranges.is_empty() {
        Err(format!("{master} serves no slot"))
    } else {
        Ok(ranges)
    }
}

/// The hash slot of a lock name: its key is `{name}` (under the default prefix
/// `fencelock:{name}`), hashed on the name alone (CRC16/XMODEM mod 16384, as Redis; the
/// names here hold no braces).
fn key_slot(name: &str) -> u16 {
    let mut crc: u16 = 0;
    for &byte in name.as_bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

/// The Targets table's rows of this section.
pub(crate) fn target_rows(s: &mut String, t: &Topologies) {
    match &t.latency {
        Ok(l) => {
            let base = l.standalone.summary.p50;
            for (what, series) in [("Sentinel", &l.sentinel), ("Cluster", &l.cluster)] {
                let ratio = series.summary.p50 as f64 / base as f64;
                let _ = writeln!(
                    s,
                    "| uncontended acquire + release p50 through {what} within \
                     {TARGET_TOPOLOGY_RATIO}x of a standalone node's | {} / {} = {} | {} |",
                    fmt_ns(series.summary.p50),
                    fmt_ns(base),
                    x(ratio),
                    yes_no(ratio <= TARGET_TOPOLOGY_RATIO)
                );
            }
            // The library's own share: the same cycle through a plain `redis://` client
            // at the same master (which also streams to its replica and shares its CPU
            // with its neighbours), so only the Sentinel or cluster path differs.
            for (what, series, plain) in [
                (
                    "Sentinel",
                    &l.sentinel,
                    "Sentinel's master through redis://",
                ),
                ("Cluster", &l.cluster, "the cluster master through redis://"),
            ] {
                let Some((_, at_master)) = l.diagnostics.iter().find(|(d, _)| d.starts_with(plain))
                else {
                    continue;
                };
                let ratio = series.summary.p50 as f64 / at_master.summary.p50 as f64;
                let _ = writeln!(
                    s,
                    "| the library's {what} path: p50 through {what} within \
                     {TARGET_TOPOLOGY_RATIO}x of a plain `redis://` client at the same \
                     master | {} / {} = {} | {} |",
                    fmt_ns(series.summary.p50),
                    fmt_ns(at_master.summary.p50),
                    x(ratio),
                    yes_no(ratio <= TARGET_TOPOLOGY_RATIO)
                );
            }
        }
        Err(e) => {
            let _ = writeln!(
                s,
                "| Sentinel and Cluster latency | run failed: {e} | **no** |"
            );
        }
    }
    match &t.renewals {
        Ok(r) => {
            let _ = writeln!(
                s,
                "| {} leases held on a {}-master cluster: about \
                 {TARGET_CALLS_PER_MASTER_TICK} watchdog call per master per renewal tick | \
                 busiest master {:.1} calls/tick (a master's share of the renewals per tick \
                 needs at least {:.1} calls of up to {} leases) | {} |",
                r.locks,
                r.masters.len(),
                r.max_calls_per_master_tick(),
                r.floor_calls_per_master_tick(),
                fencelock::limits::RENEWAL_BATCH,
                yes_no(
                    r.max_calls_per_master_tick() <= 1.5 * TARGET_CALLS_PER_MASTER_TICK
                        && r.all_alive()
                ),
            );
        }
        Err(e) => {
            let _ = writeln!(s, "| leases held on a cluster | run failed: {e} | **no** |");
        }
    }
}

/// Appends the section to the report.
pub(crate) fn render(s: &mut String, t: &Topologies, plan: &Plan) {
    let _ = writeln!(s, "## Sentinel and Cluster\n");
    let _ = writeln!(
        s,
        "fencelock only, on testkit's deployments of real redis-servers on this machine: a \
         Sentinel group (a master, a replica, three sentinels; `down-after-milliseconds` \
         {}, `failover-timeout` {}) reached through `redis+sentinel://`, and Redis Clusters \
         (`cluster-node-timeout` {}) reached through `redis+cluster://`. On {} CPUs every \
         server shares the CPUs with the others and with the client, so a cluster's masters \
         work one after another, not side by side as on separate hosts.\n",
        DOWN_AFTER.as_millis(),
        FAILOVER_TIMEOUT.as_millis(),
        NODE_TIMEOUT.as_millis(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    latency_table(s, t);
    throughput_table(s, t, plan);
    renewals_table(s, t, plan);
    failover_table(s, t);
}

fn latency_table(s: &mut String, t: &Topologies) {
    let _ = writeln!(s, "### Uncontended acquire + release by path\n");
    let l = match &t.latency {
        Ok(l) => l,
        Err(e) => {
            let _ = writeln!(s, "Run failed: {e}\n");
            return;
        }
    };
    let _ = writeln!(
        s,
        "The cycle of the uncontended run (`lock(name).lease({TTL:?}).renew(false)\
         .try_acquire()` then `release()`, one name, one client per path, each \
         `Client::connect(url)`) through a standalone node (the main node), through \
         Sentinel (its master has a replica, so every write is also streamed to it) and \
         through a {MASTERS}-master cluster with a replica per master (the name's slot on \
         one master); to tell the library's path from the servers', the same cycle through a \
         plain `redis://` URL at Sentinel's master and at that cluster master, and a \
         redis-rs PING to each path's node; all taking turns in blocks of {} so drift hits \
         them alike. {} measured cycles per client after {} warm-up \
         cycles. Placement: {}. Ratio: p50 ÷ the standalone node's p50 (target \
         ≤ {TARGET_TOPOLOGY_RATIO}x).\n",
        latency::BLOCK,
        l.cycles,
        l.warmup,
        l.placement
    );
    let _ = writeln!(
        s,
        "| path | samples | p50 | p99 | max | p50 ÷ standalone | p99 ÷ standalone |\n\
         |---|---|---|---|---|---|---|"
    );
    let base = &l.standalone.summary;
    let mut rows = vec![
        ("standalone node (`redis://`)", &l.standalone),
        ("Sentinel (`redis+sentinel://`)", &l.sentinel),
        ("Cluster, 3 masters (`redis+cluster://`)", &l.cluster),
    ];
    rows.extend(l.diagnostics.iter().map(|(label, s)| (*label, s)));
    for (label, series) in rows {
        let sm = &series.summary;
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} | {} | {} |",
            sm.n,
            fmt_ns(sm.p50),
            fmt_ns(sm.p99),
            fmt_ns(sm.max),
            x(sm.p50 as f64 / base.p50 as f64),
            x(sm.p99 as f64 / base.p99 as f64),
        );
    }
    let _ = writeln!(s);
}

fn throughput_table(s: &mut String, t: &Topologies, plan: &Plan) {
    let _ = writeln!(
        s,
        "### Independent locks: throughput, 1 vs {MASTERS} masters\n"
    );
    let _ = writeln!(
        s,
        "One client (the harness's current-thread runtime, so one CPU at most) runs \
         {THROUGHPUT_TASKS} tasks; each acquires and at once releases its own lock names \
         ({NAMES_PER_TASK} per task, in turn: no contention) as fast as it can for {} after \
         {} ms of warm-up. The clusters have no replicas, so they differ in their masters \
         only; the lock names spread over every master's slots. Not pinned. Acquisitions: \
         cycles that ended in the window. CPU: the harness process (`getrusage`) and the \
         masters together (`/proc/PID/stat`), as a share of one CPU over the window: \
         whichever is near 100 % is what limits the row on this machine.\n",
        report::fmt_dur(plan.topology_run),
        THROUGHPUT_WARMUP.as_millis(),
    );
    let _ = writeln!(
        s,
        "| servers | acquisitions/s | × 1-master cluster | client CPU | masters' CPU | errors |\n\
         |---|---|---|---|---|---|"
    );
    let one = t
        .throughput
        .iter()
        .find(|r| r.label == "cluster, 1 master" && r.error.is_none())
        .map(ThroughputRow::per_second);
    for row in &t.throughput {
        if let Some(e) = &row.error {
            let _ = writeln!(s, "| {} | run failed: {e} ||||", row.label);
            continue;
        }
        let secs = row.window.as_secs_f64();
        let pct = |d: Duration| format!("{:.0} %", 100.0 * d.as_secs_f64() / secs);
        let errors = match &row.first_error {
            Some(e) => format!("{} (first: {})", row.errors, e.replace('|', "/")),
            None => row.errors.to_string(),
        };
        let _ = writeln!(
            s,
            "| {} | {:.0} | {} | {} | {} | {errors} |",
            row.label,
            row.per_second(),
            one.map_or("–".into(), |o| x(row.per_second() / o)),
            pct(row.client_cpu),
            row.server_cpu.map_or("–".into(), pct),
        );
    }
    let _ = writeln!(s);
}

fn renewals_table(s: &mut String, t: &Topologies, plan: &Plan) {
    let _ = writeln!(
        s,
        "### {} leases held on the {MASTERS}-master cluster, watchdog on\n",
        plan.cluster_held_locks
    );
    let r = match &t.renewals {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(s, "Run failed: {e}\n");
            return;
        }
    };
    let _ = writeln!(
        s,
        "As the held-locks run above, on the cluster of the latency run: one client \
         acquires {} locks with `.lease({LEASE:?})` ({} tasks), `CONFIG RESETSTAT` on each \
         master, a window of {:.2} s = {:.1} ticks of {TICK:?}, then `INFO commandstats` on \
         each master: script calls (`evalsha` + `eval`) and leases renewed (`pexpire` calls, \
         run by the scripts, / 2: a renewal extends the lock key and its holder-info key). \
         The watchdog groups the leases that fall due by master and cuts each group into \
         batches of up to {} leases (`fencelock::limits::RENEWAL_BATCH`), one \
         `renew_across_slots.lua` call each, so the floor per master is its share of the \
         renewals over the batch size: at least {:.1} calls per master and tick here ({:.0} \
         leases renewed per tick / the masters / {}). Calls per batch: a master's calls per \
         tick / that floor (above 1 when ticks carry partial batches). Acquiring took {:.2} s; dropping them all and `flush()` {:.2} s{}.\n",
        r.locks,
        held::TASKS,
        r.window.as_secs_f64(),
        r.ticks(),
        fencelock::limits::RENEWAL_BATCH,
        r.floor_calls_per_master_tick(),
        r.renewals_per_tick(),
        fencelock::limits::RENEWAL_BATCH,
        r.acquire_time.as_secs_f64(),
        r.release_time.as_secs_f64(),
        if r.flushed { "" } else { " (**timed out**)" },
    );
    let _ = writeln!(
        s,
        "| master | script calls | calls / tick | leases renewed | renewed / call | calls per \
         batch | DBSIZE |\n|---|---|---|---|---|---|---|"
    );
    let ticks = r.ticks();
    let batches = r.floor_calls_per_master_tick();
    for m in &r.masters {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {} | {} | {} | {} |",
            m.addr,
            m.calls,
            m.calls as f64 / ticks,
            m.renewals,
            if m.calls > 0 {
                format!("{:.0}", m.renewals as f64 / m.calls as f64)
            } else {
                "–".into()
            },
            if batches > 0.0 {
                format!("{:.2}", m.calls as f64 / ticks / batches)
            } else {
                "–".into()
            },
            m.dbsize,
        );
    }
    let calls: u64 = r.masters.iter().map(|m| m.calls).sum();
    let _ = writeln!(
        s,
        "| all {} | {calls} | {:.1} | {} | – | – | {} (2N = {}) |\n",
        r.masters.len(),
        r.calls_per_tick(),
        r.masters.iter().map(|m| m.renewals).sum::<u64>(),
        r.masters.iter().map(|m| m.dbsize).sum::<u64>(),
        2 * r.locks,
    );
    let _ = writeln!(
        s,
        "Alive at the end of the window: {} guards with `loss()` = Some, {} of {} leases \
         watched: {}.\n",
        r.lost,
        r.watched,
        r.locks,
        yes_no(r.all_alive()),
    );
}

fn failover_table(s: &mut String, t: &Topologies) {
    let _ = writeln!(
        s,
        "### Failover: from the kill to the first successful acquire\n"
    );
    let _ = writeln!(
        s,
        "A client connected (and warmed up) before the kill; `SIGKILL` of Sentinel's \
         master, or of a cluster master that has a replica (another one each time); then \
         `try_acquire` of a new lock name (for the cluster, a name of the killed master's \
         slots) every {} ms until one succeeds (each attempt a new name, so an attempt whose \
         outcome was unknown cannot hold up the next). Meanwhile, every {} ms: a sentinel's \
         `SENTINEL get-master-addr-by-name`, or the killed master's replica's `ROLE`, to \
         time the promotion itself. The failover settings dominate: Sentinel calls the \
         master down after `down-after-milliseconds` ({} ms), a cluster after \
         `cluster-node-timeout` ({} ms) and then elects the replica. The client's own \
         timeouts are the defaults (connect and response 1 s).\n",
        RETRY_PAUSE.as_millis(),
        RETRY_PAUSE.as_millis(),
        DOWN_AFTER.as_millis(),
        NODE_TIMEOUT.as_millis(),
    );
    let _ = writeln!(
        s,
        "| deployment | failover settings | promoted after | first acquire after | failed \
         attempts | longest attempt | last failure |\n|---|---|---|---|---|---|---|"
    );
    for f in &t.failovers {
        let (what, settings) = match f.topology {
            Topology::Sentinel => (
                "Sentinel",
                format!(
                    "down-after-milliseconds {}, failover-timeout {}",
                    DOWN_AFTER.as_millis(),
                    FAILOVER_TIMEOUT.as_millis()
                ),
            ),
            Topology::Cluster => (
                "Cluster",
                format!("cluster-node-timeout {}", NODE_TIMEOUT.as_millis()),
            ),
        };
        match &f.result {
            Ok(r) => {
                let _ = writeln!(
                    s,
                    "| {what} | {settings} | {} | {} | {} | {} | {} |",
                    r.promoted
                        .map_or("not seen".into(), |d| fmt_ns(d.as_nanos() as u64)),
                    fmt_ns(r.acquired.as_nanos() as u64),
                    r.failed_attempts,
                    fmt_ns(r.longest_attempt.as_nanos() as u64),
                    r.last_error
                        .as_deref()
                        .map_or("–".into(), |e| e.replace('|', "/")),
                );
            }
            Err(e) => {
                let _ = writeln!(
                    s,
                    "| {what} | {settings} | run failed: {} |||||",
                    e.replace('|', "/")
                );
            }
        }
    }
    let _ = writeln!(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_hash_to_redis_slots() {
        // CLUSTER KEYSLOT answers, from Redis's documentation and a server.
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("123456789"), 12739);
    }
}
