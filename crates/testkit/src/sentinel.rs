//! A Redis Sentinel deployment of real processes: a master, its replicas and
//! the sentinels that monitor them, with faults (kill, pause, failover).
//!
//! See [`SentinelGroup`].

use std::io;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use crate::build::ServerBuild;
use crate::resp::Reply;
use crate::server::{RedisServer, ServerBuilder, TlsConfig, info_value, start_all};
use crate::tls::{ClientAuth, TlsFiles};

/// How long [`SentinelBuilder::start`] waits for replication and for the
/// sentinels to agree.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`SentinelGroup::failover`] waits for the new master.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(15);
/// Timeout of one query to a sentinel or node while polling: a paused
/// process must not stall a poll for long.
const QUERY_TIMEOUT: Duration = Duration::from_millis(500);
/// Interval between two polls.
const POLL: Duration = Duration::from_millis(10);

/// Configures a [`SentinelGroup`] before starting it. Get one from
/// [`SentinelGroup::builder`].
///
/// Defaults: 1 replica, 3 sentinels, service `"mymaster"`, quorum 2,
/// `down-after-milliseconds` 1000, `failover-timeout` 3000, no passwords, no TLS,
/// [`ServerBuild::Redis7`].
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until .start() is called"]
pub struct SentinelBuilder {
    replicas: usize,
    sentinels: usize,
    service: String,
    quorum: usize,
    down_after: Duration,
    failover_timeout: Duration,
    password: Option<String>,
    sentinel_password: Option<String>,
    tls: Option<TlsConfig>,
    build: ServerBuild,
}

impl Default for SentinelBuilder {
    fn default() -> Self {
        SentinelBuilder {
            replicas: 1,
            sentinels: 3,
            service: "mymaster".to_owned(),
            quorum: 2,
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(3000),
            password: None,
            sentinel_password: None,
            tls: None,
            build: ServerBuild::Redis7,
        }
    }
}

impl SentinelBuilder {
    /// Number of replicas of the master (at least 1; default 1).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// Number of sentinels (at least the quorum; default 3).
    pub fn sentinels(mut self, n: usize) -> Self {
        self.sentinels = n;
        self
    }

    /// The service (master) name the sentinels monitor (default `"mymaster"`).
    pub fn service(mut self, name: impl Into<String>) -> Self {
        self.service = name.into();
        self
    }

    /// How many sentinels must agree that the master is down before a
    /// failover (default 2).
    pub fn quorum(mut self, n: usize) -> Self {
        self.quorum = n;
        self
    }

    /// `sentinel down-after-milliseconds` (default 1 s): how long a node may
    /// not answer before a sentinel considers it down.
    pub fn down_after(mut self, d: Duration) -> Self {
        self.down_after = d;
        self
    }

    /// `sentinel failover-timeout` (default 3 s).
    pub fn failover_timeout(mut self, d: Duration) -> Self {
        self.failover_timeout = d;
        self
    }

    /// A password for the master and replicas (`requirepass`, and
    /// `masterauth` so replicas can sync); the sentinels get it as
    /// `sentinel auth-pass`. Default: none.
    pub fn password(mut self, pw: impl Into<String>) -> Self {
        self.password = Some(pw.into());
        self
    }

    /// A password for the sentinels themselves (`requirepass` in their
    /// config; they also use it with each other), independent of
    /// [`password`](Self::password). Default: none.
    pub fn sentinel_password(mut self, pw: impl Into<String>) -> Self {
        self.sentinel_password = Some(pw.into());
        self
    }

    /// Which server binary the data nodes and the sentinels run (default
    /// [`ServerBuild::Redis7`]); a sentinel is the same binary with `--sentinel`
    /// (`valkey-server sentinel.conf --sentinel` for Valkey).
    ///
    /// ```
    /// use testkit::{SentinelGroup, ServerBuild};
    ///
    /// let group = SentinelGroup::builder().server(ServerBuild::Valkey91).start();
    /// assert_eq!(group.master().version(), "Valkey 9.1.2");
    /// ```
    ///
    /// # Panics
    /// [`start`](Self::start) panics as [`ServerBuilder::server`] does: a missing
    /// binary, or [`tls`](Self::tls) on a build without TLS.
    pub fn server(mut self, build: ServerBuild) -> Self {
        self.build = build;
        self
    }

    /// TLS throughout: every data node and sentinel gets a TLS port serving the good
    /// certificate of `files` (valid for `127.0.0.1`, which the sentinels name nodes
    /// by), clients need no certificate, and replicas replicate, and sentinels talk to
    /// the nodes and to each other, over TLS (`tls-replication yes`). The sentinels
    /// monitor the TLS ports, so every address the group takes or gives
    /// ([`master_addr`](SentinelGroup::master_addr),
    /// [`sentinel_urls`](SentinelGroup::sentinel_urls), ...) is a TLS port's, and
    /// [`url`](SentinelGroup::url) is `rediss+sentinel://...`. The plain ports stay
    /// open for testkit's own queries ([`RedisServer::cmd`] and the rest).
    ///
    /// The files are copied when the group starts (see
    /// [`ServerBuilder::tls_with`]). For another certificate, or clients that must
    /// present one, see [`tls_with`](Self::tls_with).
    ///
    /// ```no_run
    /// use testkit::{SentinelGroup, TlsFiles};
    ///
    /// let group = SentinelGroup::builder().tls(TlsFiles::shared()).start();
    /// assert!(group.url().starts_with("rediss+sentinel://127.0.0.1:"));
    /// // A client trusting TlsFiles::shared().ca_cert() finds the master over TLS.
    /// ```
    pub fn tls(self, files: &TlsFiles) -> Self {
        self.tls_with(
            files,
            files.server_cert(),
            files.server_key(),
            ClientAuth::No,
        )
    }

    /// As [`tls`](Self::tls), every data node and sentinel serving certificate `cert`
    /// with its key `key` (e.g. [`TlsFiles::wrong_name_server_cert`]: the nodes and
    /// sentinels check each other's chain, not names, so the group still forms) and
    /// asking clients for a certificate as `clients` says
    /// (`--tls-auth-clients`), as [`ServerBuilder::tls_with`].
    ///
    /// The nodes and sentinels present [`TlsFiles::client_cert`] when they connect to
    /// each other over TLS (`--tls-client-cert-file`), so with [`ClientAuth::Yes`]
    /// the group still forms and fails over: only a client without a certificate
    /// signed by the CA is refused, by every TLS port, sentinels' included.
    /// testkit's own queries use the plain ports, which ask for none.
    ///
    /// ```no_run
    /// use testkit::{ClientAuth, SentinelGroup, TlsFiles};
    ///
    /// let files = TlsFiles::shared();
    /// let group = SentinelGroup::builder()
    ///     .tls_with(files, files.server_cert(), files.server_key(), ClientAuth::Yes)
    ///     .start();
    /// // A client needs the CA and TlsFiles::client_cert() (with its key).
    /// ```
    pub fn tls_with(
        mut self,
        files: &TlsFiles,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
        clients: ClientAuth,
    ) -> Self {
        self.tls = Some(TlsConfig {
            cert: cert.as_ref().to_owned(),
            key: key.as_ref().to_owned(),
            ca: files.ca_cert(),
            clients,
            client: Some((files.client_cert(), files.client_key())),
            only: false,
        });
        self
    }

    /// Starts the master, then the replicas, waits until every replica is
    /// `state=online` in the master's `INFO replication`, then starts the
    /// sentinels and waits until every sentinel names the master
    /// (`SENTINEL get-master-addr-by-name`), lists every replica as a healthy
    /// `slave` with its link to the master up (`SENTINEL replicas`), and
    /// knows all the other sentinels (`num-other-sentinels`), so that a
    /// failover can start at once. Takes about 3 s, mostly the sentinels'
    /// discovery of each other (they announce themselves every 2 s).
    ///
    /// Call it from the thread that will own the group (see
    /// [`RedisServer`] on `PR_SET_PDEATHSIG`).
    ///
    /// # Panics
    /// On an invalid configuration (no replica, quorum 0 or above the number
    /// of sentinels), if a process does not start, or if the group does not
    /// settle within 30 s (the message tells what was missing). Processes
    /// started so far are killed.
    pub fn start(self) -> SentinelGroup {
        assert!(
            self.replicas >= 1,
            "testkit: a SentinelGroup needs a replica"
        );
        assert!(
            self.quorum >= 1 && self.quorum <= self.sentinels,
            "testkit: quorum {} with {} sentinels",
            self.quorum,
            self.sentinels
        );
        // The build, TLS ports, and TLS for replication and the sentinels' links.
        let tls_args = |b: ServerBuilder| -> ServerBuilder {
            let b = b.server(self.build.clone());
            match &self.tls {
                Some(tls) => b.tls_config(tls.clone()).args(["--tls-replication", "yes"]),
                None => b,
            }
        };
        let data_args = |b: ServerBuilder| -> ServerBuilder {
            // Redis 7 syncs replicas diskless after a 5 s delay by default.
            let b = tls_args(b).args(["--repl-diskless-sync-delay", "0"]);
            match &self.password {
                Some(pw) => b.args(["--requirepass", pw, "--masterauth", pw]),
                None => b,
            }
        };
        let master = data_args(RedisServer::builder()).start();
        let master_port = announced_port(&master, self.tls.is_some());
        let replicas = start_all(
            (0..self.replicas)
                .map(|_| {
                    data_args(RedisServer::builder()).args([
                        "--replicaof".to_owned(),
                        "127.0.0.1".to_owned(),
                        master_port.to_string(),
                    ])
                })
                .collect(),
        );
        let mut nodes = vec![master];
        nodes.extend(replicas);

        let mut group = SentinelGroup {
            sentinels: Vec::new(),
            nodes,
            service: self.service.clone(),
            quorum: self.quorum,
            password: self.password.clone(),
            sentinel_password: self.sentinel_password.clone(),
            tls: self.tls.is_some(),
            paused_master: None,
            build: self.build.clone(),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        group.settle("replicas online", deadline, SentinelGroup::replication_gap);

        let conf = self.sentinel_config(&group);
        group.sentinels = start_all(
            (0..self.sentinels)
                .map(|_| {
                    tls_args(RedisServer::builder())
                        .config_file(conf.clone())
                        .arg("--sentinel")
                })
                .collect(),
        );
        group.settle("sentinels agree", deadline, SentinelGroup::sentinel_gap);
        group
    }

    fn sentinel_config(&self, group: &SentinelGroup) -> String {
        let svc = &self.service;
        let master = &group.nodes[0];
        let mut conf = format!(
            "sentinel monitor {svc} 127.0.0.1 {} {}\n\
             sentinel down-after-milliseconds {svc} {}\n\
             sentinel failover-timeout {svc} {}\n",
            group.announced_port(master),
            self.quorum,
            self.down_after.as_millis(),
            self.failover_timeout.as_millis(),
        );
        for replica in &group.nodes[1..] {
            conf.push_str(&format!(
                "sentinel known-replica {svc} 127.0.0.1 {}\n",
                group.announced_port(replica)
            ));
        }
        if let Some(pw) = &self.password {
            conf.push_str(&format!("sentinel auth-pass {svc} {}\n", quote(pw)));
        }
        if let Some(pw) = &self.sentinel_password {
            conf.push_str(&format!("requirepass {}\n", quote(pw)));
        }
        conf
    }
}

/// A config-file string literal: double quotes, with `"` and `\\` escaped
/// and every byte outside printable ASCII as `\xHH` (what Redis' config
/// parser reads back).
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for b in s.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(char::from(b));
            }
            b' '..=b'~' => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('"');
    out
}

/// A master, its replicas and (by default three) sentinels, all real
/// `redis-server` processes on free loopback ports, each a [`RedisServer`]
/// with its own directory (a sentinel's holds the config file it rewrites).
///
/// The data nodes ([`nodes`](Self::nodes)) keep their handles across
/// failovers; [`master`](Self::master) and [`replicas`](Self::replicas) ask
/// the sentinels which is which *now*. Faults: [`kill_master`](Self::kill_master)
/// (`SIGKILL`), [`pause_master`](Self::pause_master) /
/// [`resume_master`](Self::resume_master) and
/// [`pause_node`](Self::pause_node) / [`resume_node`](Self::resume_node)
/// (`SIGSTOP`/`SIGCONT`), [`failover`](Self::failover) (`SENTINEL
/// FAILOVER`), and [`wait_for_new_master`](Self::wait_for_new_master) to
/// wait for the sentinels' verdict.
///
/// ```
/// use std::time::Duration;
///
/// let mut group = testkit::SentinelGroup::start();
/// assert!(group.url().starts_with("redis+sentinel://127.0.0.1:"));
/// assert!(group.url().ends_with("/mymaster"));
/// group.master().cmd(&["SET", "k", "v"]);
///
/// let old = group.kill_master();
/// let new = group.wait_for_new_master(&old, Duration::from_secs(10));
/// assert_ne!(new, old);
/// assert_eq!(group.master().addr(), new);
/// ```
///
/// Addresses are as the sentinels name them: `"127.0.0.1:PORT"` with the plain port,
/// or in a group with [TLS](SentinelBuilder::tls) the TLS port (where a
/// [`RedisServer::addr`] still names the plain one).
///
/// Dropping the group kills every process (sentinels first) and removes
/// their directories; `PR_SET_PDEATHSIG` covers them as for any
/// [`RedisServer`], so start the group from the test's own thread.
#[derive(Debug)]
pub struct SentinelGroup {
    // Dropped first: sentinels must not react to the data nodes' teardown.
    sentinels: Vec<RedisServer>,
    nodes: Vec<RedisServer>,
    service: String,
    quorum: usize,
    password: Option<String>,
    sentinel_password: Option<String>,
    /// Whether the nodes and sentinels are named by their TLS ports.
    tls: bool,
    paused_master: Option<String>,
    /// What the nodes and sentinels run.
    build: ServerBuild,
}

impl SentinelGroup {
    /// Starts a group with the defaults; see [`SentinelBuilder::start`].
    pub fn start() -> SentinelGroup {
        Self::builder().start()
    }

    /// A builder for a group with other sizes, timings or passwords.
    pub fn builder() -> SentinelBuilder {
        SentinelBuilder::default()
    }

    /// The build the nodes and sentinels run ([`SentinelBuilder::server`]).
    pub fn build(&self) -> &ServerBuild {
        &self.build
    }

    /// The service (master) name the sentinels monitor.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The data nodes' password, if any ([`SentinelBuilder::password`]).
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The sentinels' password, if any ([`SentinelBuilder::sentinel_password`]).
    pub fn sentinel_password(&self) -> Option<&str> {
        self.sentinel_password.as_deref()
    }

    /// The sentinels, in start order.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// One sentinel by index, to kill, pause or restart it. Queries of the
    /// group skip sentinels that are paused or do not answer. A sentinel
    /// paused for more than 2 s enters TILT mode when resumed and takes part
    /// in no failover for the next 30 s.
    ///
    /// # Panics
    /// If there is no sentinel `i`.
    pub fn sentinel_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.sentinels[i]
    }

    /// The sentinels' addresses, comma-separated:
    /// `"127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"` (their TLS ports in a TLS
    /// group).
    pub fn sentinel_urls(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| self.announced(s))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `"redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/mymaster"`:
    /// the sentinels and the service, without credentials (a plain string;
    /// testkit does not parse it). In a TLS group:
    /// `"rediss+sentinel://..."` with the sentinels' TLS ports.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!(
            "{scheme}+sentinel://{}/{}",
            self.sentinel_urls(),
            self.service
        )
    }

    /// Whether the group runs [TLS](SentinelBuilder::tls).
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The address of a node or sentinel of the group as the sentinels name it:
    /// `"127.0.0.1:PORT"`, with its TLS port in a TLS group.
    pub fn announced(&self, server: &RedisServer) -> String {
        format!("127.0.0.1:{}", self.announced_port(server))
    }

    fn announced_port(&self, server: &RedisServer) -> u16 {
        announced_port(server, self.tls)
    }

    /// All data nodes (master and replicas) in start order: the first was
    /// the master at start. Handles are stable across failovers.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The data node at `addr` (`"127.0.0.1:PORT"`), to kill, pause or
    /// restart it.
    ///
    /// # Panics
    /// If no data node has that address.
    pub fn node_mut(&mut self, addr: &str) -> &mut RedisServer {
        let i = self.node_index(addr);
        &mut self.nodes[i]
    }

    /// The address of the master as the sentinels name it now
    /// (`SENTINEL get-master-addr-by-name`, from the first sentinel that
    /// answers). Right after the master dies this is still the dead one,
    /// until the sentinels have failed over.
    ///
    /// # Panics
    /// If no sentinel answers.
    pub fn master_addr(&self) -> String {
        for sentinel in self.sentinels.iter().filter(|s| !s.is_paused()) {
            if let Some(addr) = self.sentinel_master_addr(sentinel) {
                return addr;
            }
        }
        panic!(
            "testkit: no sentinel of {} named a master for {}",
            self.sentinel_urls(),
            self.service
        )
    }

    /// The data node the sentinels name as master now; see
    /// [`master_addr`](Self::master_addr).
    ///
    /// # Panics
    /// If no sentinel answers, or the sentinels name a node that is not one
    /// of this group's.
    pub fn master(&self) -> &RedisServer {
        &self.nodes[self.node_index(&self.master_addr())]
    }

    /// Every data node but the [`master`](Self::master), in start order. A
    /// killed former master stays among them (until it is restarted, the
    /// sentinels list it as a replica that is down).
    pub fn replicas(&self) -> Vec<&RedisServer> {
        let master = self.master_addr();
        self.nodes
            .iter()
            .filter(|n| self.announced(n) != master)
            .collect()
    }

    /// Runs one command on the data node or sentinel at `addr`,
    /// authenticating first with the matching password if one is set.
    ///
    /// # Panics
    /// If no process of the group has that address, and as
    /// [`RedisServer::cmd`].
    pub fn cmd(&self, addr: &str, args: &[&str]) -> Reply {
        let (server, password) =
            if let Some(s) = self.sentinels.iter().find(|s| self.announced(s) == addr) {
                (s, self.sentinel_password.as_deref())
            } else {
                (&self.nodes[self.node_index(addr)], self.password.as_deref())
            };
        match password {
            Some(pw) => server.cmd_as(pw, args),
            None => server.cmd(args),
        }
    }

    /// `SIGKILL`s the current master (see [`master`](Self::master)) and
    /// returns its address, for
    /// [`wait_for_new_master`](Self::wait_for_new_master). Its handle stays
    /// in [`nodes`](Self::nodes); [`RedisServer::restart`] brings it back
    /// empty, as a master until the sentinels turn it into a replica.
    pub fn kill_master(&mut self) -> String {
        let addr = self.master_addr();
        self.node_mut(&addr).kill();
        addr
    }

    /// Pauses the current master (`SIGSTOP`) and returns its address. Paused
    /// longer than `down-after-milliseconds`, it is failed over.
    pub fn pause_master(&mut self) -> String {
        let addr = self.master_addr();
        self.node_mut(&addr).pause();
        self.paused_master = Some(addr.clone());
        addr
    }

    /// Resumes the node [`pause_master`](Self::pause_master) paused (even
    /// if it is no longer the master). A no-op if none is paused.
    pub fn resume_master(&mut self) {
        if let Some(addr) = self.paused_master.take() {
            self.node_mut(&addr).resume();
        }
    }

    /// Pauses the data node at `addr` (`SIGSTOP`). A paused replica still
    /// gets what the master sends it (the kernel buffers it until the
    /// replica resumes): to keep writes from it, use
    /// [`isolate_replica`](Self::isolate_replica).
    ///
    /// # Panics
    /// If no data node has that address or it is not running.
    pub fn pause_node(&mut self, addr: &str) {
        self.node_mut(addr).pause();
    }

    /// Pauses the replica at `addr` and closes its replication link at the
    /// master (`CLIENT KILL ADDR`), so writes the master takes from now on
    /// never reach it. Stages a lost write: isolate the replica, write to
    /// the master, [`kill_master`](Self::kill_master),
    /// [`resume_node`](Self::resume_node) the replica; the sentinels promote
    /// it without the write. (If the master lives on instead, the resumed
    /// replica reconnects and catches up.)
    ///
    /// # Panics
    /// If `addr` is not a replica connected to the current master.
    pub fn isolate_replica(&mut self, addr: &str) {
        let master = self.master_addr();
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
        self.pause_node(addr);
        let reply = self.cmd(&master, &["CLIENT", "KILL", "ADDR", &link]);
        // The filter form answers with the number of clients closed.
        assert!(
            reply == Reply::Int(1),
            "testkit: closing replica {addr}'s link ({link}) at master {master}: {reply}"
        );
    }

    /// Resumes the data node at `addr` (`SIGCONT`); a no-op if it is not
    /// paused.
    ///
    /// # Panics
    /// If no data node has that address.
    pub fn resume_node(&mut self, addr: &str) {
        self.node_mut(addr).resume();
    }

    /// Brings a killed former master back as a replica of the current master, ready
    /// for the next failover: restarts it (empty, on its port) with `--replicaof` the
    /// master, instead of leaving the sentinels to convert it (they wait 8 s before
    /// reconfiguring a node that reports itself master, and a sentinel that saw it as
    /// a master asks again only 10 s later), and
    /// waits until it is `state=online` in the master's `INFO replication` and every
    /// running sentinel lists it as a healthy `slave` with its link to the master up.
    ///
    /// Call it from the thread that owns the group (see [`RedisServer`] on
    /// `PR_SET_PDEATHSIG`).
    ///
    /// # Panics
    /// If no data node has that address, it is the current master, or it is not back
    /// as a replica within `within` (the message tells what was missing).
    #[track_caller]
    pub fn restart_as_replica(&mut self, addr: &str, within: Duration) {
        let master = self.master_addr();
        assert!(
            master != addr,
            "testkit: {addr} is the master of {}",
            self.service
        );
        let (host, port) = master.rsplit_once(':').unwrap_or((&master, ""));
        let (host, port) = (host.to_owned(), port.to_owned());
        self.node_mut(addr)
            .restart_with_args(&["--replicaof", &host, &port]);
        let deadline = Instant::now() + within;
        loop {
            let Some(missing) = self.replica_gap(&master, addr) else {
                return;
            };
            assert!(
                Instant::now() < deadline,
                "testkit: {addr} not back as a replica of {master} within {within:?}: {missing}"
            );
            thread::sleep(POLL);
        }
    }

    /// What keeps the node at `addr` from being a healthy replica of `master` in
    /// the master's and every running sentinel's view, if anything.
    fn replica_gap(&self, master: &str, addr: &str) -> Option<String> {
        let port = addr.rsplit_once(':').map_or("", |(_, p)| p);
        let node = &self.nodes[self.node_index(master)];
        let info = match query(node, self.password.as_deref(), &["INFO", "replication"]) {
            Ok(reply) => reply.as_str().unwrap_or_default().to_owned(),
            Err(e) => return Some(format!("master {master}: {e}")),
        };
        let online = (0..self.nodes.len()).any(|i| {
            info_value(&info, &format!("slave{i}"))
                .is_some_and(|v| v.contains(&format!("port={port},")) && v.contains("state=online"))
        });
        if !online {
            return Some(format!("not online at the master:\n{info}"));
        }
        for s in self.sentinels.iter().filter(|s| !s.is_paused()) {
            let listed = match self.query_sentinel(s, &["SENTINEL", "REPLICAS", &self.service]) {
                Ok(reply) => reply,
                Err(e) => return Some(format!("sentinel {}: {e}", s.addr())),
            };
            let healthy = listed.as_array().unwrap_or_default().iter().any(|r| {
                let r = pairs(r);
                field(&r, "port") == Some(port)
                    && field(&r, "flags") == Some("slave")
                    && field(&r, "master-link-status") == Some("ok")
            });
            if !healthy {
                return Some(format!(
                    "sentinel {} does not list it as a healthy replica",
                    s.addr()
                ));
            }
        }
        None
    }

    /// A graceful switch: `SENTINEL FAILOVER` (no agreement needed; the
    /// sentinel promotes the best replica), then
    /// [`wait_for_new_master`](Self::wait_for_new_master) (up to 15 s).
    /// Returns the new master's address.
    ///
    /// The old master keeps running and, for a few seconds, keeps calling
    /// itself master (it accepts writes the new master never sees) until the
    /// sentinels reconfigure it as a replica of the new one.
    ///
    /// # Panics
    /// If the sentinel refuses (e.g. `NOGOODSLAVE`, `INPROG`) or no new
    /// master appears in time.
    pub fn failover(&mut self) -> String {
        let old = self.master_addr();
        let sentinel = self
            .sentinels
            .iter()
            .find(|s| !s.is_paused())
            .map(|s| self.announced(s))
            .expect("testkit: no sentinel is running");
        let reply = self.cmd(&sentinel, &["SENTINEL", "FAILOVER", &self.service]);
        assert!(
            reply.as_str() == Some("OK"),
            "testkit: SENTINEL FAILOVER {} on {sentinel}: {reply}",
            self.service
        );
        self.wait_for_new_master(&old, FAILOVER_TIMEOUT)
    }

    /// Polls every sentinel (`SENTINEL get-master-addr-by-name`, every
    /// 10 ms) until all that answer (at least a quorum of them; paused
    /// sentinels are skipped) name the same master, other than `old_addr`,
    /// and that node answers and reports `ROLE` master. Returns its address.
    ///
    /// # Panics
    /// If that does not happen within `within`; the message shows the last
    /// answers.
    #[track_caller]
    pub fn wait_for_new_master(&self, old_addr: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let answers: Vec<Option<String>> = self
                .sentinels
                .iter()
                .filter(|s| !s.is_paused())
                .map(|s| self.sentinel_master_addr(s))
                .collect();
            let named: Vec<&String> = answers.iter().flatten().collect();
            let agreed = named.len() >= self.quorum
                && named.iter().all(|a| *a == named[0])
                && named[0] != old_addr;
            if agreed && self.reports_master(named[0]) {
                return named[0].clone();
            }
            assert!(
                Instant::now() < deadline,
                "testkit: no new master (other than {old_addr}) for {} within {within:?}; \
                 the sentinels {} named {answers:?}",
                self.service,
                self.sentinel_urls(),
            );
            thread::sleep(POLL);
        }
    }

    fn node_index(&self, addr: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| self.announced(n) == addr)
            .unwrap_or_else(|| {
                panic!(
                    "testkit: {addr} is not a data node of this group ({})",
                    self.nodes
                        .iter()
                        .map(|n| self.announced(n))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }

    fn query_sentinel(&self, sentinel: &RedisServer, args: &[&str]) -> io::Result<Reply> {
        query(sentinel, self.sentinel_password.as_deref(), args)
    }

    /// `SENTINEL get-master-addr-by-name` as `"ip:port"`; `None` if the
    /// sentinel does not answer or answers anything else.
    fn sentinel_master_addr(&self, sentinel: &RedisServer) -> Option<String> {
        let reply = self
            .query_sentinel(
                sentinel,
                &["SENTINEL", "get-master-addr-by-name", &self.service],
            )
            .ok()?;
        match reply.as_array()? {
            [ip, port] => Some(format!("{}:{}", ip.as_str()?, port.as_str()?)),
            _ => None,
        }
    }

    /// Whether the data node at `addr` answers `ROLE` with `master`.
    fn reports_master(&self, addr: &str) -> bool {
        let Some(node) = self.nodes.iter().find(|n| self.announced(n) == addr) else {
            return false;
        };
        if node.is_paused() {
            return false;
        }
        query(node, self.password.as_deref(), &["ROLE"])
            .ok()
            .and_then(|r| r.as_array()?.first()?.as_str().map(|s| s == "master"))
            .unwrap_or(false)
    }

    /// Polls `gap` until it reports nothing missing; panics at `deadline`
    /// with the last gap.
    fn settle(&self, what: &str, deadline: Instant, gap: fn(&Self) -> Option<String>) {
        loop {
            let Some(missing) = gap(self) else { return };
            assert!(
                Instant::now() < deadline,
                "testkit: sentinel group did not start ({what}) within {START_TIMEOUT:?}: {missing}"
            );
            thread::sleep(POLL);
        }
    }

    /// What keeps the replicas from being online at the master, if anything.
    fn replication_gap(&self) -> Option<String> {
        let master = &self.nodes[0];
        let info = match query(master, self.password.as_deref(), &["INFO", "replication"]) {
            Ok(reply) => reply.as_str().unwrap_or_default().to_owned(),
            Err(e) => return Some(format!("master {}: {e}", master.addr())),
        };
        for replica in &self.nodes[1..] {
            let online = (0..self.nodes.len()).any(|i| {
                info_value(&info, &format!("slave{i}")).is_some_and(|v| {
                    v.contains(&format!("port={},", self.announced_port(replica)))
                        && v.contains("state=online")
                })
            });
            if !online {
                return Some(format!(
                    "replica {} not online at the master:\n{info}",
                    replica.addr()
                ));
            }
        }
        None
    }

    /// What some sentinel does not know yet, if anything.
    fn sentinel_gap(&self) -> Option<String> {
        let master = self.announced(&self.nodes[0]);
        for s in &self.sentinels {
            let named = self.sentinel_master_addr(s);
            if named.as_deref() != Some(master.as_str()) {
                return Some(format!("sentinel {} names master {named:?}", s.addr()));
            }
            let state = self.query_sentinel(s, &["SENTINEL", "MASTER", &self.service]);
            let state = state.as_ref().map(pairs);
            let others = state
                .as_ref()
                .ok()
                .and_then(|p| field(p, "num-other-sentinels"));
            let want = (self.sentinels.len() - 1).to_string();
            if others != Some(want.as_str()) {
                return Some(format!(
                    "sentinel {} knows {others:?} other sentinels, not {want}",
                    s.addr()
                ));
            }
            let replicas = match self.query_sentinel(s, &["SENTINEL", "REPLICAS", &self.service]) {
                Ok(reply) => reply,
                Err(e) => return Some(format!("sentinel {}: {e}", s.addr())),
            };
            let listed: Vec<Vec<(String, String)>> = replicas
                .as_array()
                .unwrap_or_default()
                .iter()
                .map(pairs)
                .collect();
            for replica in &self.nodes[1..] {
                let port = self.announced_port(replica).to_string();
                let healthy = listed.iter().any(|r| {
                    field(r, "port") == Some(port.as_str())
                        && field(r, "flags") == Some("slave")
                        && field(r, "master-link-status") == Some("ok")
                });
                if !healthy {
                    return Some(format!(
                        "sentinel {} does not list replica {} as healthy: {listed:?}",
                        s.addr(),
                        replica.addr()
                    ));
                }
            }
        }
        None
    }
}

/// The port the sentinels name `server` by: its TLS port with `tls`.
fn announced_port(server: &RedisServer, tls: bool) -> u16 {
    match (tls, server.tls_port()) {
        (true, Some(port)) => port,
        _ => server.port(),
    }
}

/// One command on a fresh connection with [`QUERY_TIMEOUT`], after `AUTH`
/// if a password is given.
fn query(server: &RedisServer, password: Option<&str>, args: &[&str]) -> io::Result<Reply> {
    match password {
        Some(pw) => server.try_cmd_as(pw, args, QUERY_TIMEOUT),
        None => server.try_cmd(args, QUERY_TIMEOUT),
    }
}

/// A flat `[key, value, key, value, ...]` reply (as `SENTINEL MASTER` and
/// each entry of `SENTINEL REPLICAS`) as pairs; empty for anything else.
fn pairs(reply: &Reply) -> Vec<(String, String)> {
    reply
        .as_array()
        .unwrap_or_default()
        .chunks(2)
        .filter_map(|kv| match kv {
            [k, v] => Some((k.as_str()?.to_owned(), v.as_str()?.to_owned())),
            _ => None,
        })
        .collect()
}

fn field<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_reads_a_flat_key_value_reply() {
        let bulk = |s: &str| Reply::Bulk(Some(s.as_bytes().to_vec()));
        let reply = Reply::Array(Some(vec![
            bulk("name"),
            bulk("127.0.0.1:7001"),
            bulk("flags"),
            bulk("slave"),
        ]));
        let p = pairs(&reply);
        assert_eq!(field(&p, "flags"), Some("slave"));
        assert_eq!(field(&p, "port"), None);
        assert!(pairs(&Reply::Error("ERR".into())).is_empty());
    }

    #[test]
    fn sentinel_config_monitors_the_master_with_the_timings_and_passwords() {
        let builder = SentinelGroup::builder()
            .service("svc")
            .quorum(2)
            .down_after(Duration::from_millis(1500))
            .failover_timeout(Duration::from_secs(4))
            .password("data pw")
            .sentinel_password("s\"pw");
        let group = SentinelGroup {
            sentinels: Vec::new(),
            nodes: RedisServer::start_many(2),
            service: "svc".into(),
            quorum: 2,
            password: None,
            sentinel_password: None,
            tls: false,
            paused_master: None,
            build: ServerBuild::Redis7,
        };
        let conf = builder.sentinel_config(&group);
        let (m, r) = (group.nodes[0].port(), group.nodes[1].port());
        assert_eq!(
            conf,
            format!(
                "sentinel monitor svc 127.0.0.1 {m} 2\n\
                 sentinel down-after-milliseconds svc 1500\n\
                 sentinel failover-timeout svc 4000\n\
                 sentinel known-replica svc 127.0.0.1 {r}\n\
                 sentinel auth-pass svc \"data pw\"\n\
                 requirepass \"s\\\"pw\"\n"
            )
        );
    }
}
