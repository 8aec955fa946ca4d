//! `fencelock-bench`: fencelock side by side with its peers (the Rust crates rslock and
//! redlock, redis-py's `Lock`, python-redis-lock and node-redlock), on the same throwaway
//! Redis in one run: uncontended acquire + release, release-to-waiter handoff, one hot
//! key, Redlock vs single node; fencelock's semaphore against redis-semaphore's
//! (throughput and handoff); many locks through one client; an election's takeover after
//! the leader's kill against a plain lock's waiter; the uncontended and handoff
//! rows through a proxy adding a 0.5 ms round trip; the handoff floor (a bare `PUBLISH`
//! to another process); what fencing costs at the resource (a PostgreSQL
//! transaction and a Redis write, with and without the token's check); what keeping
//! many fencelock leases alive costs; how those costs grow (held leases by the thousand
//! to the million, handoff against 1 to 256 waiters); and fencelock through Sentinel and
//! Cluster (latency, throughput, renewals, failover).
//!
//! One run starts throwaway `redis-server`s (testkit): one for the handoff, hot-key,
//! single-node latency and fencing runs, five for Redlock, one for the held-locks run,
//! and a Sentinel group and clusters for the Sentinel and Cluster runs; and a throwaway
//! PostgreSQL server (testkit) for the fencing run. It measures,
//! prints a markdown report on stdout (progress goes to stderr) and draws PNG charts.
//! Contenders run in worker processes: this binary re-executed as the hidden `worker`
//! subcommand, `bench/py/driver.py` for the Python peers, or `bench/js/driver.js` for
//! node-redlock and redis-semaphore; each size of the held-leases growth run in this
//! binary re-executed as the hidden `held` subcommand; the election takeover's leaders
//! and standbys as the hidden `elector` subcommand.

mod affinity;
mod builds;
mod chart;
mod clock;
mod cost;
mod election;
mod fencing;
mod floor;
mod growth;
mod held;
mod latency;
mod launcher;
mod many;
mod multi;
mod network;
mod peers;
mod plan;
mod report;
mod results;
mod round4;
mod semaphores;
mod servers;
mod spawn;
mod topologies;
mod worker;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use crate::latency::Summary;
use crate::launcher::{Launcher, Run, Scenario, measured};
use crate::peers::Peer;
use crate::plan::{FULL, HOT_KEY_CONTENDERS, Plan, QUICK, REDLOCK_NODES, WAITERS};
use crate::results::{HotKeyRow, Results};
use crate::semaphores::Semaphores;
use crate::servers::Servers;
use crate::worker::WorkerArgs;

/// Benchmarks fencelock against its peers on throwaway redis-servers, prints the results
/// as markdown and draws PNG charts.
#[derive(Parser, Debug)]
#[command(name = "fencelock-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Short run (about 2 minutes): 1 s per handoff row (2 s for peers polling at
    /// 100 ms or more), 1.5 s per hot-key row, 1,000 latency cycles per client, 10,000
    /// held locks watched for 5 s; how cost grows: 1,000 to 100,000 held locks, 5 s
    /// each, and fencelock's handoff at 1 to 256 waiters (five counts); Sentinel and
    /// Cluster: 2 s per throughput row, 10,000 leases on the cluster, one failover each;
    /// semaphores: 1.5 s per throughput row, 1 s per handoff row; fencing at the
    /// resource (PostgreSQL and Redis, fenced and not): 1,000 writes per variant one at a
    /// time, then 8 clients for 0.8 s per variant (about 10 s); many locks through one
    /// client: 3 turns of 0.5 s per client; election takeover after a kill: 5 rounds
    /// per way with a 1 s lease (about 11 s); on a network: 200 cycles per client and the
    /// 1-waiter handoff rows; the floor: 1,000 messages twice. Charts go to
    /// target/bench-img.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Full run (the default; about 40 minutes): 10 s per handoff row (20 s for slow
    /// pollers), 10 s per hot-key row, 20,000 latency cycles per client, 100,000 held
    /// locks watched for 20 s; how cost grows: 1,000 to 1,000,000 held locks, 10 s
    /// each, and fencelock's handoff at 1 to 256 waiters (nine counts); Sentinel and
    /// Cluster: 10 s per throughput row, 100,000 leases on the cluster, three failovers
    /// each; semaphores: 10 s per throughput row, 10 s per handoff row; fencing at the
    /// resource: 10,000 writes per variant one at a time, then 8 clients for 10 s per
    /// variant (about 90 s); many locks through one client: 3 turns of 3.3 s per
    /// client; election takeover after a kill: 20 rounds per way with a 1 s lease and
    /// 5 with a 3 s one (about 75 s); on a network: 2,000 cycles per client and
    /// the 1-waiter handoff rows; the floor: 5,000 messages twice. Charts go to
    /// docs/img.
    #[arg(long)]
    full: bool,
    /// Also write the markdown report to FILE.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Python interpreter with redis-py and python-redis-lock installed (scripts/bench
    /// makes a venv); without it the Python peers are left out.
    #[arg(long, env = "FENCELOCK_BENCH_PYTHON", value_name = "PATH")]
    python: Option<PathBuf>,
    /// Node.js, to run node-redlock and redis-semaphore in bench/js/driver.js
    /// (scripts/bench installs their packages with npm ci into bench/js/node_modules);
    /// without it both are left out.
    #[arg(long, env = "FENCELOCK_BENCH_NODE", value_name = "PATH")]
    node: Option<PathBuf>,
    /// Where to write the PNG charts (default: docs/img for a full run, target/bench-img
    /// for a quick one).
    #[arg(long, value_name = "DIR")]
    img_dir: Option<PathBuf>,
    /// TrueType font for the charts' text (default: DejaVu Sans from the usual places).
    #[arg(long, value_name = "FILE")]
    font: Option<PathBuf>,
    /// Run one section alone and print only it; no charts. For working on that section:
    /// `semaphores` (a PING baseline first, for its ratios), `fencing` (what fencing
    /// costs at the resource: PostgreSQL and Redis, fenced and not), `many` (many
    /// locks through one client), `multi` (several locks at once), `election`
    /// (election takeover after a kill), `cost` (where Redis's work per lock goes:
    /// callgrind on the build `scripts/servers --symbols` makes), or `servers`
    /// (fencelock on Redis 6.2, 7.0 and Valkey 9.1, whose builds `scripts/servers`
    /// fetches).
    #[arg(long, value_enum, hide = true, value_name = "SECTION")]
    only: Option<Only>,
}

/// The sections `--only` can run alone.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Only {
    /// fencelock's semaphore against redis-semaphore's.
    Semaphores,
    /// What fencing costs at the resource: PostgreSQL and Redis, fenced and not.
    Fencing,
    /// Many independent locks through one client.
    Many,
    /// Several locks at once against the same locks taken in turn.
    Multi,
    /// Election takeover after the leader's kill, against a plain lock's waiter.
    Election,
    /// The uncontended and 1-waiter handoff rows through a 0.5 ms round trip.
    Network,
    /// fencelock's handoff rows (plain and fair, 1, 8 and 64 waiters) between the two
    /// handoff floors: a bare PUBLISH and a release-shaped EVALSHA to another process.
    Handoff,
    /// Where Redis's work per lock goes: each kind of lock and its peers, broken down
    /// inside redis-server (callgrind on a build with symbols; commandstats, SLOWLOG).
    Cost,
    /// fencelock on each server build: Redis 6.2, Redis 7.0, Valkey 9.1 (I/O threads off
    /// and on).
    Servers,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Internal: one worker process of a run (started by the harness).
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// Internal: one size of the held-leases growth run (started by the harness).
    #[command(hide = true)]
    Held(growth::HeldArgs),
    /// Internal: the subscriber of the handoff floor (started by the harness).
    #[command(hide = true)]
    Floor(floor::FloorArgs),
    /// Internal: a leader or standby of the election takeover (started by the harness).
    #[command(hide = true)]
    Elector(election::ElectorArgs),
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Worker(args)) => std::process::exit(worker::run(args)),
        Some(Command::Held(args)) => std::process::exit(growth::held_child(args)),
        Some(Command::Floor(args)) => std::process::exit(floor::subscriber(args)),
        Some(Command::Elector(args)) => std::process::exit(election::elector(args)),
        None => {}
    }
    let plan = if cli.quick { &QUICK } else { &FULL };
    let python = match cli.python.as_deref() {
        Some(p) if p.is_file() => Ok(p.to_owned()),
        Some(p) => Err(format!("{} is not a file", p.display())),
        None => Err("no --python given (scripts/bench makes a venv and passes it)".to_owned()),
    };
    if let Err(e) = &python {
        eprintln!("Python peers left out: {e}");
    }
    let node = match cli.node.as_deref() {
        Some(p) if p.is_file() => Ok(p.to_owned()),
        Some(p) => Err(format!("{} is not a file", p.display())),
        None => Err("no --node given (scripts/bench passes it when node is installed)".to_owned()),
    };
    if let Some(section) = cli.only {
        only(section, plan, node, cli.out.as_deref());
        return;
    }
    let img_dir = cli
        .img_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(plan.img_dir));
    // Started from the main thread, which lives as long as the server should
    // (testkit ties the server's PR_SET_PDEATHSIG to the starting thread).
    let server = testkit::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (results, failed) = runtime.block_on(bench(plan, &server, python, node));
    drop(runtime);
    drop(server);
    let charts = chart::draw_charts(&results, &img_dir, cli.font.as_deref());
    let md = report::render(&results, &charts);
    print!("{md}");
    if let Some(path) = &cli.out
        && let Err(e) = std::fs::write(path, &md)
    {
        eprintln!("cannot write {}: {e}", path.display());
        std::process::exit(1);
    }
    if failed {
        eprintln!("some measurements failed; see the report");
        std::process::exit(1);
    }
}

/// `--only SECTION`: that section alone on a throwaway server; prints it (and writes it
/// to `out`), and exits 1 if anything failed.
fn only(section: Only, plan: &'static Plan, node: Result<PathBuf, String>, out: Option<&Path>) {
    // From the main thread, as in `main`.
    let server = testkit::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (md, failed) = runtime.block_on(async {
        match section {
            Only::Semaphores => only_semaphores(plan, node, &server).await,
            Only::Fencing => {
                let f = fencing::run(plan, &server).await;
                let mut s = format!(
                    "# fencelock-bench ({} run, fencing at the resource only)\n\n",
                    plan.name
                );
                s.push_str(&format!(
                    "- redis-server {}\n\n",
                    servers::redis_version(&server)
                ));
                fencing::render(&mut s, &f, plan);
                (s, f.failed())
            }
            Only::Network => {
                let launch = Launcher::new(Err("not needed".to_owned()), node);
                let with_node = match &launch.node {
                    Ok(n) => launcher::node_version(n, &launch.node_driver).await.is_ok(),
                    Err(_) => false,
                };
                let n = network::run(plan, &launch, &server, false, with_node).await;
                let mut s = format!(
                    "# fencelock-bench ({} run, on a network only)\n\n",
                    plan.name
                );
                network::render(&mut s, &n, plan);
                (s, n.failed())
            }
            Only::Multi => {
                let m = multi::run(plan, &server).await;
                let mut s = format!(
                    "# fencelock-bench ({} run, several locks at once only)\n\n",
                    plan.name
                );
                multi::render(&mut s, &m, plan);
                (s, m.failed())
            }
            Only::Election => {
                let t = election::run(plan, &server).await;
                let mut s = format!(
                    "# fencelock-bench ({} run, election takeover only)\n\n",
                    plan.name
                );
                s.push_str(&format!(
                    "- redis-server {}\n\n",
                    servers::redis_version(&server)
                ));
                election::render(&mut s, &t, plan);
                (s, t.failed())
            }
            Only::Handoff => {
                let launch = Launcher::new(Err("not needed".to_owned()), node);
                let rows = async {
                    let mut rows = Vec::new();
                    for peer in [Peer::Fencelock, Peer::FencelockFair] {
                        for waiters in WAITERS {
                            eprintln!("handoff: {} with {waiters} waiters", peer.label());
                            let name = format!("handoff-{}-{waiters}", peer.slug());
                            rows.push(
                                launcher::handoff_row(
                                    &launch,
                                    &server,
                                    peer,
                                    name,
                                    waiters,
                                    plan.handoff_run,
                                )
                                .await,
                            );
                        }
                    }
                    rows
                };
                let (floors, rows) = floor::around(&server.url(), plan.floor_messages, rows).await;
                let mut s = format!(
                    "# fencelock-bench ({} run, handoff against its floors only)\n\n",
                    plan.name
                );
                floor::render(&mut s, &floors, &rows);
                let failed = floors.publish.is_err()
                    || floors.release.is_err()
                    || rows
                        .iter()
                        .any(|r| r.error.is_some() || !r.report.errors.is_empty());
                (s, failed)
            }
            Only::Cost => {
                let c = cost::run(plan, &server).await;
                let mut s = format!(
                    "# fencelock-bench ({} run, Redis's work per lock only)\n\n",
                    plan.name
                );
                cost::render(&mut s, &c);
                (s, c.failed())
            }
            Only::Servers => {
                let launch = Launcher::new(Err("not needed".to_owned()), node);
                let b = builds::run(plan, &launch).await;
                let mut s = format!(
                    "# fencelock-bench ({} run, server builds only)\n\n",
                    plan.name
                );
                builds::render(&mut s, &b, plan);
                (s, b.failed())
            }
            Only::Many => {
                let m = many::run(plan, &server).await;
                let mut s = format!(
                    "# fencelock-bench ({} run, many locks through one client only)\n\n",
                    plan.name
                );
                many::render(&mut s, &m, plan);
                (s, m.failed())
            }
        }
    });
    drop(runtime);
    drop(server);
    print!("{md}");
    if let Some(path) = out
        && let Err(e) = std::fs::write(path, &md)
    {
        eprintln!("cannot write {}: {e}", path.display());
        std::process::exit(1);
    }
    if failed {
        eprintln!("some measurements failed; see the report");
        std::process::exit(1);
    }
}

/// `--only semaphores`: a PING baseline, then the semaphores' section alone on `server`;
/// the markdown, and whether anything failed.
async fn only_semaphores(
    plan: &'static Plan,
    node: Result<PathBuf, String>,
    server: &testkit::RedisServer,
) -> (String, bool) {
    let launch = Launcher::new(Err("not needed".to_owned()), node);
    let node_version = match &launch.node {
        Ok(n) => launcher::node_version(n, &launch.node_driver).await,
        Err(e) => Err(e.clone()),
    };
    if let Err(e) = &node_version {
        eprintln!("redis-semaphore left out: {e}");
    }
    eprintln!("baseline: {} PINGs", plan.pings);
    let ping = latency::ping_baseline(&server.url(), plan.pings).await;
    let unit = ping.as_ref().map_or(1, |p| p.p50);
    let sem = semaphores::run(plan, &launch, server, node_version.is_ok()).await;
    let mut s = format!(
        "# fencelock-bench ({} run, semaphores only)

",
        plan.name
    );
    s.push_str(&format!(
        "- redis-server {}; {}

",
        servers::redis_version(server),
        node_version.as_deref().unwrap_or_else(|e| e)
    ));
    semaphores::render(&mut s, &sem, plan, unit, "the baseline PINGs, unpinned");
    (s, sem.failed() || ping.is_err())
}

/// Runs everything; the results and whether anything failed.
async fn bench(
    plan: &'static Plan,
    server: &testkit::RedisServer,
    python: Result<PathBuf, String>,
    node: Result<PathBuf, String>,
) -> (Results, bool) {
    let started = Instant::now();
    let url = server.url();
    let launch = Launcher::new(python, node);
    let python_version = match &launch.python {
        Ok(p) => launcher::python_version(p).await,
        Err(e) => Err(e.clone()),
    };
    let with_python = python_version.is_ok();
    let node_version = match &launch.node {
        Ok(n) => launcher::node_version(n, &launch.node_driver).await,
        Err(e) => Err(e.clone()),
    };
    if let Err(e) = &node_version {
        eprintln!("node-redlock and redis-semaphore left out: {e}");
    }
    let with_node = node_version.is_ok();
    let mut failed = false;
    let (cpu, load_before) = servers::machine();
    let redis_version = servers::redis_version(server);
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());

    // 1. Baseline.
    eprintln!("baseline: {} PINGs", plan.pings);
    let ping = match latency::ping_baseline(&url, plan.pings).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("PING baseline failed: {e}");
            Summary {
                n: 0,
                p50: 1,
                p99: 1,
                max: 1,
            }
        }
    };
    failed |= ping.n == 0;

    // The other scenarios' servers, started after the baseline so it is taken with only
    // the main server running. Still on the main thread (the current-thread runtime
    // polls this future on the thread that called `block_on`), which testkit ties their
    // PR_SET_PDEATHSIG to; dropped at the end of this function.
    let servers = Servers::start();

    // 2. Uncontended acquire + release: Rust clients, single node and Redlock.
    eprintln!(
        "latency: {} acquire + release cycles per client, single node and Redlock over \
         {REDLOCK_NODES} nodes",
        plan.latency_cycles
    );
    let redlock_urls: Vec<String> = servers.redlock.iter().map(|s| s.url()).collect();
    let latency = latency::run(
        &url,
        server.pid(),
        &redlock_urls,
        plan.latency_cycles,
        || servers::pin_for_latency(None, server, &servers.redlock),
    )
    .await;
    if let Err(e) = &latency {
        eprintln!("latency run failed: {e}");
        failed = true;
    }
    // ... and the Python peers (redis-py's sleep only matters under contention).
    let mut python_latency = Vec::new();
    let mut python_placement = None;
    if let Ok(py) = &launch.python
        && with_python
    {
        for peer in [Peer::RedisPy, Peer::PythonRedisLock] {
            eprintln!(
                "latency: {}, {} cycles (Python driver)",
                peer.label(),
                plan.latency_cycles
            );
            let urls = [url.clone()];
            let r = latency::in_driver(
                py,
                &launch.driver,
                &urls,
                peer,
                plan.latency_cycles,
                |pid| servers::pin_for_latency(Some(pid), server, &[]),
            )
            .await;
            let r = match r {
                Ok((run, placement)) => {
                    python_placement = Some(placement);
                    Ok(run)
                }
                Err(e) => {
                    eprintln!("{} latency failed: {e}", peer.label());
                    failed = true;
                    Err(e)
                }
            };
            python_latency.push((peer, r));
        }
    }
    // ... and node-redlock in the Node driver, on the single node and on the Redlock
    // nodes (its retry settings only matter under contention).
    let mut node_latency = None;
    if let Ok(node) = &launch.node
        && with_node
    {
        let peer = Peer::NodeRedlock;
        let mut placement = None;
        let mut runs = Vec::new();
        for (urls, nodes) in [
            (vec![url.clone()], &[][..]),
            (redlock_urls.clone(), &servers.redlock[..]),
        ] {
            let what = if nodes.is_empty() {
                "single node".to_owned()
            } else {
                format!("Redlock over {REDLOCK_NODES} nodes")
            };
            eprintln!(
                "latency: {}, {} cycles, {what} (Node driver)",
                peer.label(),
                plan.latency_cycles
            );
            let pin = |pid| servers::pin_for_latency(Some(pid), server, nodes);
            let r = latency::in_driver(
                node,
                &launch.node_driver,
                &urls,
                peer,
                plan.latency_cycles,
                pin,
            )
            .await;
            runs.push(match r {
                Ok((run, p)) => {
                    placement = Some(p);
                    Ok(run)
                }
                Err(e) => {
                    eprintln!("{} latency ({what}) failed: {e}", peer.label());
                    failed = true;
                    Err(e)
                }
            });
        }
        let redlock = runs.pop().expect("two runs");
        let single = runs.pop().expect("two runs");
        node_latency = Some(latency::NodeLatency {
            single,
            redlock,
            placement,
        });
    }

    // 3. Handoff: fencelock's rows between two measurements of the floor (a bare
    // PUBLISH to another process), then the peers'.
    let handoff_rows = async |peers: Vec<Peer>| {
        let mut rows = Vec::new();
        for peer in peers {
            for waiters in WAITERS {
                let duration = if peer.slow() {
                    plan.slow_run
                } else {
                    plan.handoff_run
                };
                eprintln!(
                    "handoff: {} with {waiters} waiters, {duration:?}",
                    peer.label()
                );
                let name = format!("handoff-{}-{waiters}", peer.slug());
                rows.push(
                    launcher::handoff_row(&launch, server, peer, name, waiters, duration).await,
                );
            }
        }
        rows
    };
    let (ours, others): (Vec<Peer>, Vec<Peer>) = peers::peers(with_python, with_node)
        .into_iter()
        .partition(|p| matches!(p, Peer::Fencelock | Peer::FencelockFair));
    eprintln!(
        "handoff floors: {} PUBLISHes and as many release-shaped EVALSHAs to another process",
        plan.floor_messages
    );
    let (floor, mut handoff) = floor::around(&url, plan.floor_messages, handoff_rows(ours)).await;
    for e in [&floor.publish, &floor.release]
        .into_iter()
        .filter_map(|f| f.as_ref().err())
    {
        eprintln!("handoff floor failed: {e}");
        failed = true;
    }
    handoff.extend(handoff_rows(others).await);
    for row in &handoff {
        failed |= row.error.is_some() || !row.report.errors.is_empty();
    }

    // 3b. How cost grows: fencelock's handoff at the waiter counts the handoff rows do
    // not have.
    let mut growth = growth::Growth {
        handoff: growth::handoff_growth(plan, &launch, server).await,
        ..growth::Growth::default()
    };

    // 4. Hot key.
    let mut hot_key = Vec::new();
    for peer in peers::peers(with_python, with_node) {
        let run = Run {
            scenario: Scenario::HotKey,
            peer,
            name: format!("hot-key-{}", peer.slug()),
            contenders: HOT_KEY_CONTENDERS,
            hold: Duration::ZERO,
            duration: plan.hot_key_run,
        };
        eprintln!(
            "hot key: {} with {HOT_KEY_CONTENDERS} contenders, {:?}",
            peer.label(),
            plan.hot_key_run
        );
        let (tasks, report, commands_per_s, error) = measured(&launch, server, &run).await;
        failed |= error.is_some() || !report.errors.is_empty();
        hot_key.push(HotKeyRow {
            peer,
            tasks,
            report,
            duration: plan.hot_key_run,
            commands_per_s,
            error,
        });
    }

    // 4b. Semaphores: fencelock's and redis-semaphore's (with Node), throughput and
    // handoff, on the main server.
    let semaphores: Semaphores = semaphores::run(plan, &launch, server, with_node).await;
    failed |= semaphores.failed();
    let many = many::run(plan, server).await;
    failed |= many.failed();
    let multi = multi::run(plan, server).await;
    failed |= multi.failed();
    let election = election::run(plan, server).await;
    failed |= election.failed();
    let network = network::run(plan, &launch, server, with_python, with_node).await;
    failed |= network.failed();

    // 4c. What fencing costs at the resource: Redis on the main server, PostgreSQL on a
    // throwaway server of its own (started and stopped on this thread).
    let fencing = fencing::run(plan, server).await;
    failed |= fencing.failed();

    // 5. Many locks held at once, watchdog on (fencelock only).
    eprintln!(
        "held: {} locks with a {:?} lease, watched for {:?}",
        plan.held_locks,
        held::LEASE,
        plan.held_window
    );
    let held = held::run(&servers.held.url(), plan.held_locks, plan.held_window).await;
    match &held {
        Err(e) => {
            eprintln!("held-locks run failed: {e}");
            failed = true;
        }
        Ok(h) if !h.all_alive() || !h.flushed => {
            eprintln!("held-locks run: not every lease stayed alive, or releases timed out");
            failed = true;
        }
        Ok(_) => {}
    }

    // 5b. How cost grows: the held-locks run at each size, on the same server.
    growth.held = growth::held_growth(plan, &servers.held.url()).await;
    failed |= growth.failed(plan.held_locks);

    // 6. Sentinel and Cluster (fencelock only), on deployments of their own; the
    // standalone figures on the main node.
    let topologies = topologies::run(plan, server).await;
    failed |= topologies.failed();

    eprintln!("baseline again: {} PINGs", plan.pings);
    let ping_after = latency::ping_baseline(&url, plan.pings).await.ok();
    let (_, load_after) = servers::machine();
    let results = Results {
        plan,
        nproc,
        cpu,
        load_before,
        load_after,
        redis_version,
        python: python_version,
        node: node_version,
        ping,
        ping_after,
        latency,
        python_latency,
        python_placement,
        node_latency,
        handoff,
        hot_key,
        semaphores,
        many,
        multi,
        election,
        network,
        floor,
        fencing,
        held,
        growth,
        topologies,
        elapsed: started.elapsed(),
    };
    (results, failed)
}
