//! A Redis Cluster of real processes: masters with replicas, created by
//! `redis-cli --cluster create`, with faults (kill, pause, failover) and
//! slot migration.
//!
//! See [`Cluster`].

use std::io::{self, Read, Seek};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use crate::build::ServerBuild;
use crate::resp::Reply;
use crate::server::{
    RedisServer, TlsConfig, die_with_parent, free_cluster_port, info_value, start_all,
};
use crate::tls::{ClientAuth, TlsFiles};

/// The number of hash slots.
const SLOTS: usize = 16384;
/// How long [`ClusterBuilder::start`] waits for `redis-cli` and for the
/// cluster to settle.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a migration waits for every node to agree on the slot's owner.
const MIGRATION_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout of one query to a node while polling or looking up the topology:
/// a paused node must not stall a lookup for long.
const QUERY_TIMEOUT: Duration = Duration::from_millis(500);
/// `MIGRATE`'s own timeout, in milliseconds.
const MIGRATE_TIMEOUT_MS: &str = "5000";
/// Keys per `MIGRATE` in [`Cluster::migrate_slot`] (as `redis-cli`'s
/// default pipeline).
const MIGRATE_BATCH: usize = 10;
/// Interval between two polls.
const POLL: Duration = Duration::from_millis(10);

/// Configures a [`Cluster`] before starting it. Get one from
/// [`Cluster::builder`].
///
/// Defaults: 3 masters, 1 replica per master, `cluster-node-timeout` 1000 ms, no TLS,
/// [`ServerBuild::Redis7`].
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until .start() is called"]
pub struct ClusterBuilder {
    masters: usize,
    replicas_per_master: usize,
    node_timeout: Duration,
    tls: Option<TlsConfig>,
    /// `--tls-auth-clients` with [`tls`](Self::tls).
    tls_clients: ClientAuth,
    build: ServerBuild,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            masters: 3,
            replicas_per_master: 1,
            node_timeout: Duration::from_millis(1000),
            tls: None,
            tls_clients: ClientAuth::No,
            build: ServerBuild::Redis7,
        }
    }
}

impl ClusterBuilder {
    /// Number of masters (default 3). `redis-cli --cluster create` needs at
    /// least 3; a cluster of 1 or 2 masters (say, the baseline of a
    /// throughput comparison) is built without it and without replicas:
    /// see [`start`](Self::start).
    pub fn masters(mut self, n: usize) -> Self {
        self.masters = n;
        self
    }

    /// Replicas per master (default 1; 0 for a cluster without failover).
    pub fn replicas_per_master(mut self, n: usize) -> Self {
        self.replicas_per_master = n;
        self
    }

    /// `cluster-node-timeout` (default 1 s): how long a node may not answer
    /// before it is considered failing; a failover takes about twice this.
    pub fn node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = d;
        self
    }

    /// Which server binary every node runs (default [`ServerBuild::Redis7`]); the
    /// cluster is created by the build's [`cli`](ServerBuild::cli) (Debian's
    /// `redis-cli` for the fetched builds).
    ///
    /// ```
    /// use testkit::{Cluster, ServerBuild};
    ///
    /// let cluster = Cluster::builder().server(ServerBuild::Redis62).start();
    /// assert_eq!(cluster.masters()[0].version(), "Redis 6.2.14");
    /// ```
    ///
    /// # Panics
    /// [`start`](Self::start) panics as [`ServerBuilder::server`](crate::ServerBuilder::server)
    /// does: a missing binary, or [`tls`](Self::tls) on a build without TLS.
    pub fn server(mut self, build: ServerBuild) -> Self {
        self.build = build;
        self
    }

    /// TLS throughout, and nothing else: every node listens on a TLS port only
    /// (`--port 0 --tls-port P`), serving the good certificate of `files`
    /// (valid for `127.0.0.1`, which the nodes name each other by); clients need
    /// no certificate (unless [`tls_client_auth`](Self::tls_client_auth) says
    /// otherwise); the cluster bus (`--tls-cluster yes`, on P + 10000) and
    /// replication (`--tls-replication yes`) run over TLS too. Every address the
    /// cluster takes or gives ([`RedisServer::addr`], [`seed_urls`](Cluster::seed_urls),
    /// `CLUSTER SLOTS`) is a TLS port's, [`url`](Cluster::url) is
    /// `rediss+cluster://...`, and testkit's own queries ([`Cluster::cmd`],
    /// [`RedisServer::cmd`] on a node) go over TLS.
    ///
    /// The nodes are given [`TlsFiles::client_cert`] to present when they connect
    /// to each other (`--tls-client-cert-file`): a node accepting a bus connection
    /// always asks for a client certificate, whatever `tls-auth-clients` says,
    /// and refuses the server certificate, which is for server use only
    /// (`extendedKeyUsage serverAuth`).
    ///
    /// The files are copied when the cluster starts (see
    /// [`ServerBuilder::tls_with`](crate::ServerBuilder::tls_with)).
    ///
    /// ```no_run
    /// use testkit::{Cluster, TlsFiles};
    ///
    /// let cluster = Cluster::builder().tls(TlsFiles::shared()).start();
    /// assert!(cluster.url().starts_with("rediss+cluster://127.0.0.1:"));
    /// // A client trusting TlsFiles::shared().ca_cert() reaches every node over TLS.
    /// assert_eq!(cluster.masters()[0].cmd(&["PING"]).as_str(), Some("PONG"));
    /// ```
    pub fn tls(mut self, files: &TlsFiles) -> Self {
        self.tls = Some(TlsConfig {
            cert: files.server_cert(),
            key: files.server_key(),
            ca: files.ca_cert(),
            clients: ClientAuth::No,
            client: Some((files.client_cert(), files.client_key())),
            only: true,
        });
        self
    }

    /// With [`tls`](Self::tls), whether the nodes ask clients for a certificate
    /// (`--tls-auth-clients`; default [`ClientAuth::No`]). With [`ClientAuth::Yes`] a
    /// client without a certificate signed by the CA ([`TlsFiles::client_cert`]) is
    /// refused by every node; the cluster itself still forms and fails over, since the
    /// nodes, `redis-cli --cluster create` and testkit's own queries all present that
    /// certificate.
    ///
    /// ```no_run
    /// use testkit::{ClientAuth, Cluster, TlsFiles};
    ///
    /// let cluster = Cluster::builder()
    ///     .tls(TlsFiles::shared())
    ///     .tls_client_auth(ClientAuth::Yes)
    ///     .start();
    /// // A client needs the CA and TlsFiles::client_cert() (with its key).
    /// assert_eq!(cluster.masters()[0].cmd(&["PING"]).as_str(), Some("PONG"));
    /// ```
    ///
    /// # Panics
    /// [`start`](Self::start) panics if this is given without [`tls`](Self::tls).
    pub fn tls_client_auth(mut self, clients: ClientAuth) -> Self {
        self.tls_clients = clients;
        self
    }

    /// Starts `masters × (1 + replicas_per_master)` servers with
    /// `--cluster-enabled yes` on ports from [`free_cluster_port`] (the bus
    /// port, port + 10000, must be free too), runs
    /// `redis-cli --cluster create ... --cluster-replicas N --cluster-yes`,
    /// and waits until every node reports `cluster_state:ok` with all 16384
    /// slots ok, knows every other node, and shares one view of the roles and
    /// slots (`CLUSTER NODES`), and every replica's link to its master is up
    /// (a replica that never synced would refuse to fail over). Takes about
    /// 3 s; `redis-cli` polls the join once a second.
    ///
    /// Call it from the thread that will own the cluster (see
    /// [`RedisServer`] on `PR_SET_PDEATHSIG`; `redis-cli` gets the same
    /// treatment).
    ///
    /// With 1 or 2 masters (which `redis-cli --cluster create` refuses) and
    /// no replicas, the slots are split between the masters with `CLUSTER
    /// ADDSLOTS` and the nodes introduced with `CLUSTER MEET` instead;
    /// the cluster then settles the same way (well under a second).
    ///
    /// # Panics
    /// With no master, or fewer than 3 masters with replicas; if a process
    /// does not start, if `redis-cli` (or a node) fails (the message has its
    /// output), or if the cluster does not settle within 30 s. Processes
    /// started so far are killed.
    ///
    /// With [`tls`](Self::tls), `redis-cli --tls` creates the cluster, and the
    /// nodes' ports (TLS ports) are drawn as the plain ones are, since the
    /// bus port is then the TLS port + 10000.
    pub fn start(mut self) -> Cluster {
        assert!(
            self.masters >= 3 || (self.masters >= 1 && self.replicas_per_master == 0),
            "testkit: a Cluster needs at least 3 masters, or 1 or 2 without replicas \
             (redis-cli --cluster create refuses fewer than 3)"
        );
        match &mut self.tls {
            Some(tls) => tls.clients = self.tls_clients,
            None => assert!(
                self.tls_clients == ClientAuth::No,
                "testkit: tls_client_auth({:?}) without tls: call ClusterBuilder::tls too",
                self.tls_clients
            ),
        }
        let total = self.masters * (1 + self.replicas_per_master);
        let timeout_ms = self.node_timeout.as_millis().to_string();
        let nodes = start_all(
            (0..total)
                .map(|_| {
                    let builder = RedisServer::builder().server(self.build.clone());
                    let builder = match &self.tls {
                        Some(tls) => builder.tls_config(tls.clone()).args([
                            "--tls-cluster",
                            "yes",
                            "--tls-replication",
                            "yes",
                        ]),
                        None => builder,
                    };
                    builder.port_source(free_cluster_port).args([
                        "--cluster-enabled",
                        "yes",
                        // Relative to the node's own directory.
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        &timeout_ms,
                        // Redis 7 syncs replicas diskless after a 5 s
                        // delay by default.
                        "--repl-diskless-sync-delay",
                        "0",
                    ])
                })
                .collect(),
        );
        let deadline = Instant::now() + START_TIMEOUT;
        if self.masters >= 3 {
            let mut args: Vec<String> = Vec::new();
            if self.tls.is_some() {
                // The first node's copies: the files given may be gone by now.
                let [_, _, ca] = TlsConfig::copies(nodes[0].dir());
                let [cert, key] = TlsConfig::client_copies(nodes[0].dir());
                args.push("--tls".into());
                for (flag, path) in [("--cacert", ca), ("--cert", cert), ("--key", key)] {
                    args.push(flag.into());
                    args.push(path.display().to_string());
                }
            }
            args.extend(["--cluster".into(), "create".into()]);
            args.extend(nodes.iter().map(RedisServer::addr));
            args.extend([
                "--cluster-replicas".into(),
                self.replicas_per_master.to_string(),
                "--cluster-yes".into(),
            ]);
            run_redis_cli(&self.build.cli(), &args, deadline);
        } else {
            create_small(&nodes);
        }

        let ids = nodes
            .iter()
            .map(|n| {
                let reply = n.cmd(&["CLUSTER", "MYID"]);
                reply
                    .as_str()
                    .unwrap_or_else(|| panic!("testkit: CLUSTER MYID on {}: {reply}", n.addr()))
                    .to_owned()
            })
            .collect();
        let mut cluster = Cluster {
            nodes,
            ids,
            seeds: Vec::new(),
            tls: self.tls.is_some(),
            build: self.build,
        };
        while let Some(missing) = cluster.settle_gap(self.masters) {
            assert!(
                Instant::now() < deadline,
                "testkit: cluster did not settle within {START_TIMEOUT:?}: {missing}"
            );
            thread::sleep(POLL);
        }
        cluster.seeds = cluster.masters().iter().map(|m| m.addr()).collect();
        cluster
    }
}

/// Makes a cluster of `masters` (1 or 2, no replicas) by hand, as `redis-cli
/// --cluster create` would: each gets an even share of the slots (`CLUSTER
/// ADDSLOTS`, slot by slot: Redis 6.2 has no `ADDSLOTSRANGE`) and its own config
/// epoch, then every node meets the first.
fn create_small(masters: &[RedisServer]) {
    let expect_ok = |node: &RedisServer, args: &[&str]| {
        let reply = node.cmd(args);
        assert!(
            reply.as_str() == Some("OK"),
            "testkit: `{}` on {}: {reply}",
            args.join(" "),
            node.addr()
        );
    };
    let n = masters.len();
    for (i, node) in masters.iter().enumerate() {
        // A node that has met no other does not know its own address: CLUSTER NODES
        // and CLUSTER SLOTS would name it ":PORT", which no client can reach.
        expect_ok(node, &["CONFIG", "SET", "cluster-announce-ip", "127.0.0.1"]);
        let (first, last) = (i * SLOTS / n, (i + 1) * SLOTS / n - 1);
        let slots: Vec<String> = (first..=last).map(|slot| slot.to_string()).collect();
        let mut addslots = vec!["CLUSTER", "ADDSLOTS"];
        addslots.extend(slots.iter().map(String::as_str));
        expect_ok(node, &addslots);
        let epoch = (i + 1).to_string();
        expect_ok(node, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]);
    }
    for node in &masters[1..] {
        let port = masters[0].port().to_string();
        expect_ok(node, &["CLUSTER", "MEET", "127.0.0.1", &port]);
    }
}

/// Runs `redis-cli args` (dying with its parent like the servers), killing
/// it at `deadline`; panics with its output unless it exits with success.
fn run_redis_cli(binary: &std::path::Path, args: &[String], deadline: Instant) {
    let mut output =
        tempfile::tempfile().unwrap_or_else(|e| panic!("testkit: cannot create a temp file: {e}"));
    let stderr = output
        .try_clone()
        .unwrap_or_else(|e| panic!("testkit: cannot clone a file handle: {e}"));
    let mut cmd = Command::new(binary);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(output.try_clone().unwrap_or_else(|e| {
            panic!("testkit: cannot clone a file handle: {e}")
        })))
        .stderr(Stdio::from(stderr))
        .process_group(0);
    die_with_parent(&mut cmd);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("testkit: cannot spawn {}: {e}", binary.display()));
    let status = loop {
        if let Some(status) = child.try_wait().ok().flatten() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(POLL);
    };
    if status.is_some_and(|s| s.success()) {
        return;
    }
    let mut text = String::new();
    let _ = output.rewind();
    let _ = output.read_to_string(&mut text);
    panic!(
        "testkit: `redis-cli {}` {}:\n{text}",
        args.join(" "),
        match status {
            Some(s) => format!("failed ({s})"),
            None => "did not finish in time".to_owned(),
        }
    );
}

/// A Redis Cluster of real `redis-server` processes on loopback (by default
/// 3 masters with a replica each), each a [`RedisServer`] with its own
/// directory (holding its `nodes.conf`).
///
/// The topology is read from the nodes themselves (`CLUSTER NODES`, asking
/// the first node that answers within 500 ms, skipping paused ones), so
/// [`masters`](Self::masters), [`master_of_slot`](Self::master_of_slot) and
/// [`node_for_key`](Self::node_for_key) follow failovers and migrations.
/// Faults: [`kill_master_of`](Self::kill_master_of) then
/// [`wait_for_failover`](Self::wait_for_failover) (and
/// [`restart_as_replica`](Self::restart_as_replica) for the next one; before it,
/// [`isolate_replica`](Self::isolate_replica) to have the failover lose writes),
/// [`pause_node`](Self::pause_node) / [`resume_node`](Self::resume_node),
/// and [`migrate_slot`](Self::migrate_slot) (or its steps,
/// [`begin_migration`](Self::begin_migration),
/// [`migrate_keys`](Self::migrate_keys) and
/// [`finish_migration`](Self::finish_migration)), which moves a slot with
/// its keys the way `redis-cli --cluster reshard` does.
///
/// ```
/// let cluster = testkit::Cluster::start();
/// assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
///
/// let owner = cluster.node_for_key("lock:a").addr();
/// let slot = cluster.slot_of("lock:a");
/// cluster.cmd(&owner, &["SET", "lock:a", "me", "PX", "30000"]);
///
/// let other = cluster.masters().into_iter().find(|m| m.addr() != owner).unwrap().addr();
/// assert_eq!(cluster.migrate_slot(slot, &other), 1);
/// assert_eq!(cluster.master_of_slot(slot).addr(), other);
/// assert_eq!(cluster.cmd(&other, &["GET", "lock:a"]).as_str(), Some("me"));
/// ```
///
/// Dropping the cluster kills every process and removes their directories;
/// `PR_SET_PDEATHSIG` covers them as for any [`RedisServer`], so start the
/// cluster from the test's own thread.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<RedisServer>,
    /// Node ids (`CLUSTER MYID`), by index in `nodes`.
    ids: Vec<String>,
    /// The masters right after start, the seeds of [`Cluster::url`].
    seeds: Vec<String>,
    /// Whether the nodes talk [TLS](ClusterBuilder::tls) only.
    tls: bool,
    /// What every node runs.
    build: ServerBuild,
}

/// A slot being moved from one master to another; see
/// [`Cluster::begin_migration`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a migration stays half-done until Cluster::finish_migration"]
pub struct SlotMigration {
    slot: u16,
    from: String,
    to: String,
}

impl SlotMigration {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The source master's address (the slot is `MIGRATING` there).
    pub fn from(&self) -> &str {
        &self.from
    }

    /// The destination master's address (the slot is `IMPORTING` there).
    pub fn to(&self) -> &str {
        &self.to
    }
}

/// The cluster of [`Cluster::shared`].
static SHARED: OnceLock<&'static Cluster> = OnceLock::new();
/// The cluster of [`Cluster::shared_tls`].
static SHARED_TLS: OnceLock<&'static Cluster> = OnceLock::new();

/// Kills the shared clusters' servers and removes their directories at process exit
/// (see [`Cluster::shared`]).
extern "C" fn stop_shared_cluster() {
    for cluster in [&SHARED, &SHARED_TLS].into_iter().filter_map(|s| s.get()) {
        for node in &cluster.nodes {
            // SAFETY: sends a signal to a child process of ours; nothing else.
            unsafe {
                libc::kill(node.pid() as libc::pid_t, libc::SIGKILL);
            }
            let _ = std::fs::remove_dir_all(node.dir());
        }
    }
}

impl Cluster {
    /// One cluster with the defaults (3 masters, a replica each), started on first use
    /// and shared by every test of the test binary, for tests that only take locks on
    /// it (each with lock names of its own): starting a cluster takes about 3 s.
    /// Never kill, pause or reshard it: tests that do need a cluster of their own.
    ///
    /// A thread of its own starts it and lives as long as the process (the servers
    /// die with the thread that started them, see [`RedisServer`] on
    /// `PR_SET_PDEATHSIG`); at process exit the servers are killed and their
    /// directories removed.
    ///
    /// # Panics
    /// As [`ClusterBuilder::start`], in the first caller (and every later one).
    pub fn shared() -> &'static Cluster {
        Self::shared_in(&SHARED, Cluster::start)
    }

    /// As [`shared`](Self::shared), a [TLS](ClusterBuilder::tls) cluster with the
    /// defaults and [`TlsFiles::shared`], one per test binary (beside the plain one,
    /// if that is used too).
    ///
    /// # Panics
    /// As [`ClusterBuilder::start`], in the first caller (and every later one).
    pub fn shared_tls() -> &'static Cluster {
        Self::shared_in(&SHARED_TLS, || {
            Cluster::builder().tls(TlsFiles::shared()).start()
        })
    }

    fn shared_in(
        cell: &'static OnceLock<&'static Cluster>,
        start: fn() -> Cluster,
    ) -> &'static Cluster {
        cell.get_or_init(|| {
            let (started, start_rx) = std::sync::mpsc::channel();
            let owner = thread::Builder::new()
                .name("testkit-shared-cluster".to_owned())
                .spawn(move || {
                    let cluster: &'static Cluster = Box::leak(Box::new(start()));
                    let _ = started.send(cluster);
                    loop {
                        thread::park();
                    }
                });
            if let Err(e) = owner {
                panic!("testkit: cannot spawn the shared cluster's thread: {e}");
            }
            let cluster = start_rx
                .recv()
                .unwrap_or_else(|_| panic!("testkit: the shared cluster did not start"));
            // Once for both clusters: the handler stops them all.
            static REGISTERED: std::sync::Once = std::sync::Once::new();
            // SAFETY: registers a plain `extern "C" fn` that never unwinds.
            REGISTERED.call_once(|| unsafe {
                libc::atexit(stop_shared_cluster);
            });
            cluster
        })
    }

    /// Starts a cluster with the defaults; see [`ClusterBuilder::start`].
    pub fn start() -> Cluster {
        Self::builder().start()
    }

    /// A builder for a cluster of another size or node timeout.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// The build every node runs ([`ClusterBuilder::server`]).
    pub fn build(&self) -> &ServerBuild {
        &self.build
    }

    /// All nodes in start order. Handles are stable across failovers.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node at `addr` (`"127.0.0.1:PORT"`), to kill, pause or restart
    /// it.
    ///
    /// # Panics
    /// If no node has that address.
    pub fn node_mut(&mut self, addr: &str) -> &mut RedisServer {
        let i = self.index(addr);
        &mut self.nodes[i]
    }

    /// The cluster node id of the node at `addr`.
    ///
    /// # Panics
    /// If no node has that address.
    pub fn node_id(&self, addr: &str) -> &str {
        &self.ids[self.index(addr)]
    }

    /// Runs one command on the node at `addr`; see [`RedisServer::cmd`].
    /// (Keys must hash to a slot the node serves, or the reply is a
    /// `MOVED`/`ASK` error.)
    ///
    /// # Panics
    /// If no node has that address, and as [`RedisServer::cmd`].
    pub fn cmd(&self, addr: &str, args: &[&str]) -> Reply {
        self.nodes[self.index(addr)].cmd(args)
    }

    /// The seed nodes' addresses, comma-separated:
    /// `"127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"`. The seeds are the masters
    /// right after start (they stay the seeds after a failover).
    pub fn seed_urls(&self) -> String {
        self.seeds.join(",")
    }

    /// `"redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"` with the
    /// [`seed_urls`](Self::seed_urls) (a plain string; testkit does not
    /// parse it); `"rediss+cluster://..."` for a [TLS](ClusterBuilder::tls)
    /// cluster.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}+cluster://{}", self.seed_urls())
    }

    /// Whether the cluster runs [TLS](ClusterBuilder::tls) only.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The masters that serve slots now, in start order (a master that is
    /// flagged `fail` is left out).
    ///
    /// # Panics
    /// If no node answers `CLUSTER NODES`.
    pub fn masters(&self) -> Vec<&RedisServer> {
        let view = self.view();
        self.nodes
            .iter()
            .filter(|n| {
                view.iter().any(|l| {
                    l.addr == n.addr() && l.is_master() && !l.failed() && !l.slots.is_empty()
                })
            })
            .collect()
    }

    /// The replicas of the master at `master_addr` now, in start order (a
    /// replica flagged `fail` is left out).
    ///
    /// # Panics
    /// If no node answers `CLUSTER NODES`, or no node has that address.
    pub fn replicas_of(&self, master_addr: &str) -> Vec<&RedisServer> {
        let id = self.node_id(master_addr);
        let view = self.view();
        self.nodes
            .iter()
            .filter(|n| {
                view.iter().any(|l| {
                    l.addr == n.addr() && l.master_id.as_deref() == Some(id) && !l.failed()
                })
            })
            .collect()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of the first node
    /// that answers).
    ///
    /// # Panics
    /// If no node answers.
    pub fn slot_of(&self, key: &str) -> u16 {
        let (node, reply) = self.ask_any(&["CLUSTER", "KEYSLOT", key]);
        reply
            .as_int()
            .and_then(|n| u16::try_from(n).ok())
            .unwrap_or_else(|| panic!("testkit: CLUSTER KEYSLOT {key} on {node}: {reply}"))
    }

    /// The master that serves `slot` now.
    ///
    /// # Panics
    /// If no node answers, or the slot has no master in its view (e.g. while
    /// a failover is pending the failed master still holds it).
    pub fn master_of_slot(&self, slot: u16) -> &RedisServer {
        let view = self.view();
        let owner = owner_of(&view, slot).unwrap_or_else(|| {
            panic!("testkit: no master serves slot {slot}: {view:?}");
        });
        &self.nodes[self.index(&owner.addr)]
    }

    /// The master that serves `key`'s slot now.
    ///
    /// # Panics
    /// As [`slot_of`](Self::slot_of) and [`master_of_slot`](Self::master_of_slot).
    pub fn node_for_key(&self, key: &str) -> &RedisServer {
        self.master_of_slot(self.slot_of(key))
    }

    /// `SIGKILL`s the master that serves `key` and returns its address;
    /// follow with [`wait_for_failover`](Self::wait_for_failover). Its handle
    /// stays in [`nodes`](Self::nodes).
    pub fn kill_master_of(&mut self, key: &str) -> String {
        let addr = self.node_for_key(key).addr();
        self.node_mut(&addr).kill();
        addr
    }

    /// Pauses the node at `addr` (`SIGSTOP`). Paused longer than the node
    /// timeout, a master is failed over.
    ///
    /// # Panics
    /// If no node has that address or it is not running.
    pub fn pause_node(&mut self, addr: &str) {
        self.node_mut(addr).pause();
    }

    /// Resumes the node at `addr` (`SIGCONT`); a no-op if it is not paused.
    ///
    /// # Panics
    /// If no node has that address.
    pub fn resume_node(&mut self, addr: &str) {
        self.node_mut(addr).resume();
    }

    /// Polls (every 10 ms) until every live node (one that answers; paused
    /// nodes are skipped) reports `cluster_state:ok` and names the same
    /// master for `slot`, and that master is itself live and calls itself
    /// master. Returns its address. After [`kill_master_of`](Self::kill_master_of)
    /// (or a pause) this is the promoted replica: a dead or paused node
    /// never counts as live.
    ///
    /// # Panics
    /// If that does not happen within `within`; the message shows each
    /// live node's last verdict.
    #[track_caller]
    pub fn wait_for_failover(&self, slot: u16, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            match self.slot_agreement(slot) {
                Ok(addr) => return addr,
                Err(why) => assert!(
                    Instant::now() < deadline,
                    "testkit: slot {slot} not served by a live master with cluster_state:ok \
                     everywhere within {within:?}: {why}"
                ),
            }
            thread::sleep(POLL);
        }
    }

    /// Polls until every live node reports `cluster_state:ok` (e.g. after a
    /// paused master is resumed).
    ///
    /// # Panics
    /// If that does not happen within `within`.
    #[track_caller]
    pub fn wait_for_state_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let states: Vec<(String, String)> = self
                .live()
                .map(|n| {
                    let state = query(n, &["CLUSTER", "INFO"])
                        .ok()
                        .and_then(|r| info_value(r.as_str()?, "cluster_state").map(str::to_owned))
                        .unwrap_or_else(|| "?".to_owned());
                    (n.addr(), state)
                })
                .collect();
            if !states.is_empty() && states.iter().all(|(_, s)| s == "ok") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "testkit: cluster_state not ok everywhere within {within:?}: {states:?}"
            );
            thread::sleep(POLL);
        }
    }

    /// Pauses the replica at `addr` (`SIGSTOP`) and closes its replication link at
    /// its master (`CLIENT KILL ADDR`), so writes the master takes from now on never
    /// reach it (a paused replica alone would still get them: the kernel buffers
    /// the stream until it resumes). Stages a lost write, as
    /// [`SentinelGroup::isolate_replica`](crate::SentinelGroup::isolate_replica)
    /// does: isolate the replica, write to the master,
    /// [`kill_master_of`](Self::kill_master_of) the key,
    /// [`resume_node`](Self::resume_node) the replica; the cluster promotes it
    /// without the write.
    ///
    /// The replica stays eligible for the failover: its data age, which
    /// `cluster-replica-validity-factor` bounds (10 node timeouts +
    /// `repl-ping-replica-period`, 20 s with the defaults), counts from when it
    /// sees its link closed, which is after it resumes.
    ///
    /// # Panics
    /// If `addr` is not a node, or not a replica with a link to a master.
    pub fn isolate_replica(&mut self, addr: &str) {
        // The replica's end of its link: the master's client with flag M.
        let clients = self.cmd(addr, &["CLIENT", "LIST"]);
        let link = clients
            .as_str()
            .unwrap_or_default()
            .lines()
            .find(|l| l.split(' ').any(|f| f == "flags=M"))
            .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("laddr=")))
            .map(str::to_owned)
            .unwrap_or_else(|| {
                panic!("testkit: replica {addr} has no link to a master: {clients}")
            });
        let master = self
            .own_view(addr)
            .and_then(|view| {
                let me = view.iter().find(|l| l.is_myself())?;
                let id = me.master_id.as_deref()?;
                view.iter().find(|l| l.id == id).map(|l| l.addr.clone())
            })
            .unwrap_or_else(|| panic!("testkit: {addr} does not name its master"));
        self.pause_node(addr);
        let reply = self.cmd(&master, &["CLIENT", "KILL", "ADDR", &link]);
        // The filter form answers with the number of clients closed.
        assert!(
            reply == Reply::Int(1),
            "testkit: closing replica {addr}'s link ({link}) at master {master}: {reply}"
        );
    }

    /// Brings a killed former master back as a replica, ready for the next
    /// failover: restarts it in place (empty, on its port, with its own
    /// `nodes.conf`, so with its node id), where it learns from the other nodes
    /// that its slots went to a master of a newer epoch and turns itself into
    /// that master's replica. Waits until it calls itself a replica with its link
    /// up, its master lists it `state=online`, and every live node reports
    /// `cluster_state:ok` and sees it as a connected, healthy replica of that
    /// master. Returns the master's address.
    ///
    /// Call it from the thread that owns the cluster (see [`RedisServer`] on
    /// `PR_SET_PDEATHSIG`).
    ///
    /// # Panics
    /// If no node has that address, or it is not back as a replica within
    /// `within` (the message tells what was missing).
    #[track_caller]
    pub fn restart_as_replica(&mut self, addr: &str, within: Duration) -> String {
        self.node_mut(addr).restart();
        let deadline = Instant::now() + within;
        loop {
            match self.replica_gap(addr) {
                Ok(master) => return master,
                Err(missing) => assert!(
                    Instant::now() < deadline,
                    "testkit: {addr} not back as a replica within {within:?}: {missing}"
                ),
            }
            thread::sleep(POLL);
        }
    }

    /// The master of the node at `addr` if it is a healthy replica in its own, its
    /// master's and every live node's view; else what is missing.
    fn replica_gap(&self, addr: &str) -> Result<String, String> {
        let view = self
            .own_view(addr)
            .ok_or_else(|| format!("{addr} does not answer CLUSTER NODES"))?;
        let me = view
            .iter()
            .find(|l| l.is_myself())
            .ok_or_else(|| format!("{addr} has no myself line"))?;
        let master_id = match (&me.master_id, me.is_master()) {
            (Some(id), false) => id.clone(),
            _ => return Err(format!("{addr} says {:?}", me.flags)),
        };
        let master = view
            .iter()
            .find(|l| l.id == master_id)
            .map(|l| l.addr.clone())
            .ok_or_else(|| format!("{addr} does not know its master {master_id}"))?;
        let node = &self.nodes[self.index(addr)];
        let link = query(node, &["INFO", "replication"])
            .ok()
            .and_then(|r| info_value(r.as_str()?, "master_link_status").map(str::to_owned));
        if link.as_deref() != Some("up") {
            return Err(format!("{addr}: master_link_status {link:?}"));
        }
        let port = addr.rsplit_once(':').map_or("", |(_, p)| p);
        let info = query(&self.nodes[self.index(&master)], &["INFO", "replication"])
            .map_err(|e| format!("master {master}: {e}"))?;
        let info = info.as_str().unwrap_or_default();
        let online = (0..self.nodes.len()).any(|i| {
            info_value(info, &format!("slave{i}"))
                .is_some_and(|v| v.contains(&format!("port={port},")) && v.contains("state=online"))
        });
        if !online {
            return Err(format!("not online at master {master}:\n{info}"));
        }
        for n in self.live() {
            let state = query(n, &["CLUSTER", "INFO"])
                .ok()
                .and_then(|r| info_value(r.as_str()?, "cluster_state").map(str::to_owned));
            if state.as_deref() != Some("ok") {
                return Err(format!("{}: cluster_state {state:?}", n.addr()));
            }
            let seen = node_view(n)
                .ok()
                .and_then(|v| v.into_iter().find(|l| l.addr == addr));
            let healthy = seen.as_ref().is_some_and(|l| {
                l.connected
                    && l.master_id.as_deref() == Some(master_id.as_str())
                    && l.flags
                        .iter()
                        .all(|f| matches!(f.as_str(), "myself" | "slave"))
            });
            if !healthy {
                return Err(format!("{} sees {seen:?}", n.addr()));
            }
        }
        Ok(master)
    }

    /// `CLUSTER NODES` of the node at `addr` itself, parsed (`None` if it does
    /// not answer).
    fn own_view(&self, addr: &str) -> Option<Vec<NodeLine>> {
        node_view(&self.nodes[self.index(addr)]).ok()
    }

    /// Moves `slot` and all its keys to the master at `to_master`, as
    /// `redis-cli --cluster reshard` does:
    /// [`begin_migration`](Self::begin_migration), `MIGRATE` of the keys in
    /// batches of 10 ([`migrate_keys`](Self::migrate_keys)) until none is
    /// left, then [`finish_migration`](Self::finish_migration). Returns the
    /// number of keys moved. Keys keep their TTLs, so a test can move the
    /// slot of a held lock.
    ///
    /// # Panics
    /// As the three steps.
    pub fn migrate_slot(&self, slot: u16, to_master: &str) -> usize {
        let migration = self.begin_migration(slot, to_master);
        let mut moved = 0;
        loop {
            let n = self.migrate_keys(&migration, MIGRATE_BATCH);
            if n == 0 {
                break;
            }
            moved += n;
        }
        self.finish_migration(migration);
        moved
    }

    /// First step of a slot migration: `CLUSTER SETSLOT slot IMPORTING
    /// <source>` on the destination, then `CLUSTER SETSLOT slot MIGRATING
    /// <destination>` on the source (the master that serves it now). From
    /// here on, the source answers commands for keys of the slot that it no
    /// longer has with `-ASK` redirections to the destination.
    ///
    /// # Panics
    /// If `to_master` is not a node, not a master, or already serves the
    /// slot, or a node refuses.
    pub fn begin_migration(&self, slot: u16, to_master: &str) -> SlotMigration {
        let from = self.master_of_slot(slot).addr();
        assert!(
            from != to_master,
            "testkit: {to_master} already serves slot {slot}"
        );
        let view = self.view();
        assert!(
            view.iter().any(|l| l.addr == to_master && l.is_master()),
            "testkit: {to_master} is not a master: {view:?}"
        );
        let s = slot.to_string();
        self.expect_ok(
            to_master,
            &["CLUSTER", "SETSLOT", &s, "IMPORTING", self.node_id(&from)],
        );
        self.expect_ok(
            &from,
            &[
                "CLUSTER",
                "SETSLOT",
                &s,
                "MIGRATING",
                self.node_id(to_master),
            ],
        );
        SlotMigration {
            slot,
            from,
            to: to_master.to_owned(),
        }
    }

    /// Moves up to `count` keys of the migrating slot (`CLUSTER
    /// GETKEYSINSLOT`, then one `MIGRATE ... KEYS ...`) and returns how many
    /// it moved; 0 once the source has none left.
    ///
    /// # Panics
    /// If a node refuses (e.g. `BUSYKEY`: the destination has the key
    /// already), or a key is not UTF-8 (testkit sends text only).
    pub fn migrate_keys(&self, migration: &SlotMigration, count: usize) -> usize {
        let (slot, n) = (migration.slot.to_string(), count.to_string());
        let reply = self.cmd(&migration.from, &["CLUSTER", "GETKEYSINSLOT", &slot, &n]);
        let keys: Vec<&str> = reply
            .as_array()
            .unwrap_or_else(|| {
                panic!(
                    "testkit: CLUSTER GETKEYSINSLOT on {}: {reply}",
                    migration.from
                )
            })
            .iter()
            .map(|k| {
                k.as_str().unwrap_or_else(|| {
                    panic!("testkit: migrate_keys: key {k} of slot {slot} is not UTF-8")
                })
            })
            .collect();
        if keys.is_empty() {
            return 0;
        }
        let port = migration
            .to
            .rsplit(':')
            .next()
            .expect("an address has a port");
        let mut args = vec![
            "MIGRATE",
            "127.0.0.1",
            port,
            "",
            "0",
            MIGRATE_TIMEOUT_MS,
            "KEYS",
        ];
        args.extend(&keys);
        let reply = self.cmd(&migration.from, &args);
        // NOKEY: the keys expired in between; nothing to move.
        assert!(
            matches!(reply.as_str(), Some("OK" | "NOKEY")),
            "testkit: MIGRATE of slot {slot} from {} to {}: {reply}",
            migration.from,
            migration.to
        );
        keys.len()
    }

    /// Last step of a slot migration: `CLUSTER SETSLOT slot NODE
    /// <destination>` on the destination, the source, and every other live
    /// master, then waits (up to 10 s) until every live node names the
    /// destination as the slot's master. Keys still left at the source
    /// become unreachable: move them first ([`migrate_keys`](Self::migrate_keys)
    /// until it returns 0).
    ///
    /// # Panics
    /// If a node refuses, or the nodes do not agree in time.
    pub fn finish_migration(&self, migration: SlotMigration) {
        let slot = migration.slot.to_string();
        let to_id = self.node_id(&migration.to).to_owned();
        let setslot = ["CLUSTER", "SETSLOT", &slot, "NODE", &to_id];
        self.expect_ok(&migration.to, &setslot);
        self.expect_ok(&migration.from, &setslot);
        let view = self.view();
        for other in self.live() {
            let addr = other.addr();
            let is_master = view.iter().any(|l| l.addr == addr && l.is_master());
            if is_master && addr != migration.to && addr != migration.from {
                self.expect_ok(&addr, &setslot);
            }
        }
        let deadline = Instant::now() + MIGRATION_SETTLE_TIMEOUT;
        loop {
            let owners: Vec<(String, Option<String>)> = self
                .live()
                .map(|n| {
                    let owner = node_view(n)
                        .ok()
                        .and_then(|v| owner_of(&v, migration.slot).map(|l| l.addr.clone()));
                    (n.addr(), owner)
                })
                .collect();
            if owners
                .iter()
                .all(|(_, o)| o.as_deref() == Some(migration.to.as_str()))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "testkit: after moving slot {slot} to {}, the nodes name {owners:?}",
                migration.to
            );
            thread::sleep(POLL);
        }
    }

    fn index(&self, addr: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.addr() == addr)
            .unwrap_or_else(|| {
                panic!(
                    "testkit: {addr} is not a node of this cluster ({})",
                    self.nodes
                        .iter()
                        .map(RedisServer::addr)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }

    /// The nodes that are not paused (whether they answer is up to the
    /// caller's query).
    fn live(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| !n.is_paused())
    }

    /// Runs `args` on the first node that answers; its address and reply.
    fn ask_any(&self, args: &[&str]) -> (String, Reply) {
        self.live()
            .find_map(|n| query(n, args).ok().map(|r| (n.addr(), r)))
            .unwrap_or_else(|| {
                panic!(
                    "testkit: no node of the cluster answered `{}`",
                    args.join(" ")
                )
            })
    }

    /// `CLUSTER NODES` of the first node that answers, parsed.
    fn view(&self) -> Vec<NodeLine> {
        self.live()
            .find_map(|n| node_view(n).ok())
            .unwrap_or_else(|| panic!("testkit: no node of the cluster answered CLUSTER NODES"))
    }

    fn expect_ok(&self, addr: &str, args: &[&str]) {
        let reply = self.cmd(addr, args);
        assert!(
            reply.as_str() == Some("OK"),
            "testkit: `{}` on {addr}: {reply}",
            args.join(" ")
        );
    }

    /// The address of the master for `slot` if every live node has
    /// `cluster_state:ok` and names that master, which is live and calls
    /// itself master; else what is missing.
    fn slot_agreement(&self, slot: u16) -> Result<String, String> {
        let mut owner: Option<String> = None;
        let mut verdicts = Vec::new();
        for n in self.live() {
            let Ok(info) = query(n, &["CLUSTER", "INFO"]) else {
                continue; // dead: not live
            };
            let state = info
                .as_str()
                .and_then(|i| info_value(i, "cluster_state"))
                .unwrap_or("?")
                .to_owned();
            let named = node_view(n)
                .ok()
                .and_then(|v| owner_of(&v, slot).map(|l| l.addr.clone()));
            verdicts.push(format!("{} says {state}, {named:?}", n.addr()));
            if state != "ok" || named.is_none() || (owner.is_some() && owner != named) {
                return Err(verdicts.join("; "));
            }
            owner = named;
        }
        let Some(owner) = owner else {
            return Err("no node answers".to_owned());
        };
        let myself_master = self
            .nodes
            .iter()
            .find(|n| n.addr() == owner && !n.is_paused())
            .and_then(|n| node_view(n).ok())
            .is_some_and(|v| v.iter().any(|l| l.is_myself() && l.is_master()));
        if myself_master {
            Ok(owner)
        } else {
            Err(format!(
                "{}; {owner} does not answer as master",
                verdicts.join("; ")
            ))
        }
    }

    /// What keeps a freshly created cluster from being settled, if anything.
    fn settle_gap(&self, masters: usize) -> Option<String> {
        // The first node's view: its address and (id, master id, slots)
        // of every node.
        type Roles = Vec<(String, Option<String>, Vec<(u16, u16)>)>;
        let mut first: Option<(String, Roles)> = None;
        for n in &self.nodes {
            let info = match query(n, &["CLUSTER", "INFO"]) {
                Ok(r) => r.as_str().unwrap_or_default().to_owned(),
                Err(e) => return Some(format!("{}: {e}", n.addr())),
            };
            let want = [
                ("cluster_state", "ok".to_owned()),
                ("cluster_slots_ok", SLOTS.to_string()),
                ("cluster_known_nodes", self.nodes.len().to_string()),
                ("cluster_size", masters.to_string()),
            ];
            for (field, value) in want {
                if info_value(&info, field) != Some(value.as_str()) {
                    return Some(format!("{}: {field} is not {value}:\n{info}", n.addr()));
                }
            }
            let view = match node_view(n) {
                Ok(v) => v,
                Err(e) => return Some(format!("{}: CLUSTER NODES: {e}", n.addr())),
            };
            if let Some(l) = view.iter().find(|l| {
                !l.connected
                    || l.flags
                        .iter()
                        .any(|f| !matches!(f.as_str(), "myself" | "master" | "slave"))
            }) {
                return Some(format!("{} sees {l:?}", n.addr()));
            }
            let mut roles: Vec<_> = view
                .iter()
                .map(|l| (l.id.clone(), l.master_id.clone(), l.slots.clone()))
                .collect();
            roles.sort();
            match &first {
                None => first = Some((n.addr(), roles)),
                Some((addr, seen)) if *seen != roles => {
                    return Some(format!(
                        "{} and {addr} disagree on roles or slots",
                        n.addr()
                    ));
                }
                Some(_) => {}
            }
            let me = view.iter().find(|l| l.is_myself());
            if me.is_some_and(|l| !l.is_master()) {
                let link = query(n, &["INFO", "replication"])
                    .ok()
                    .and_then(|r| info_value(r.as_str()?, "master_link_status").map(str::to_owned));
                if link.as_deref() != Some("up") {
                    return Some(format!("replica {}: master_link_status {link:?}", n.addr()));
                }
            }
        }
        None
    }
}

/// One command on a fresh connection with [`QUERY_TIMEOUT`].
fn query(node: &RedisServer, args: &[&str]) -> io::Result<Reply> {
    node.try_cmd(args, QUERY_TIMEOUT)
}

/// `CLUSTER NODES` of one node, parsed.
fn node_view(node: &RedisServer) -> io::Result<Vec<NodeLine>> {
    let reply = query(node, &["CLUSTER", "NODES"])?;
    reply
        .as_str()
        .map(parse_nodes)
        .ok_or_else(|| io::Error::other(format!("CLUSTER NODES answered {reply}")))
}

/// The master that holds `slot` in a view (not one flagged `fail`: a failed
/// master keeps its slots in the view until a replica takes them over).
fn owner_of(view: &[NodeLine], slot: u16) -> Option<&NodeLine> {
    view.iter().find(|l| {
        l.is_master() && !l.failed() && l.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    })
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NodeLine {
    id: String,
    /// `"ip:port"` (without the bus port and hostname).
    addr: String,
    flags: Vec<String>,
    /// The master's id, for a replica.
    master_id: Option<String>,
    connected: bool,
    /// Slot ranges served (migrating/importing markers left out).
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
    fn is_master(&self) -> bool {
        self.has_flag("master")
    }
    fn is_myself(&self) -> bool {
        self.has_flag("myself")
    }
    fn failed(&self) -> bool {
        self.has_flag("fail")
    }
}

/// Parses the text of `CLUSTER NODES`: `<id> <ip:port@cport[,hostname]>
/// <flags> <master> <ping-sent> <pong-recv> <config-epoch> <link-state>
/// <slot> ...`.
fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let addr = f[1].split(['@', ',']).next().unwrap_or(f[1]).to_owned();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeLine {
                id: f[0].to_owned(),
                addr,
                flags: f[2].split(',').map(str::to_owned).collect(),
                master_id: (f[3] != "-").then(|| f[3].to_owned()),
                connected: f[7] == "connected",
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@40004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@40002,host2 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@40003 master - 0 1426238318243 3 connected 10923-16383 [10924->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5459 5460
824fe116063bc5fcf9f4ffd895bc17aee7731ac3 127.0.0.1:30006@40006 master,fail - 1426238316232 1426238315232 6 disconnected 100
";

    #[test]
    fn parses_cluster_nodes() {
        let view = parse_nodes(NODES);
        assert_eq!(view.len(), 5);
        assert_eq!(view[0].addr, "127.0.0.1:30004");
        assert!(!view[0].is_master());
        assert_eq!(
            view[0].master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert_eq!(view[1].addr, "127.0.0.1:30002");
        assert_eq!(view[1].slots, [(5461, 10922)]);
        assert_eq!(view[2].slots, [(10923, 16383)]);
        assert!(view[3].is_myself() && view[3].is_master());
        assert_eq!(view[3].slots, [(0, 5459), (5460, 5460)]);
        assert!(view[4].failed() && !view[4].connected);
    }

    #[test]
    fn owner_of_skips_failed_masters() {
        let view = parse_nodes(NODES);
        assert_eq!(owner_of(&view, 0).unwrap().addr, "127.0.0.1:30001");
        assert_eq!(owner_of(&view, 5460).unwrap().addr, "127.0.0.1:30001");
        assert_eq!(owner_of(&view, 5461).unwrap().addr, "127.0.0.1:30002");
        assert_eq!(owner_of(&view, 10924).unwrap().addr, "127.0.0.1:30003");
        // Slot 100 is 30001's; the failed 30006 is ignored either way.
        assert_eq!(owner_of(&view, 100).unwrap().addr, "127.0.0.1:30001");
        let only_failed = parse_nodes(NODES.lines().nth(4).unwrap());
        assert!(owner_of(&only_failed, 100).is_none());
    }
}
