//! Redis Cluster: the `redis+cluster://` URL, and a cluster as one logical node.
//!
//! Every key of one lock shares a hash tag, so every script call of a lock goes to the
//! master of one slot: the driver's cluster connection routes it there and follows
//! `MOVED` (a slot that moved, a failover) and `ASK` (a slot migrating) by itself. What
//! the driver does not do, this module does:
//!
//! - **Renewals per node.** The watchdog groups the leases that fall due by the master
//!   that serves each one's slot now, as the driver last saw the topology (kept by
//!   [`MasterReads`]), and cuts each group into batches of up to
//!   [`renewal_batch`](crate::ClientBuilder::renewal_batch) leases; a batch goes to its
//!   master in one call of `renew_across_slots.lua` (`#!lua flags=allow-cross-slot-keys`),
//!   however many slots it spans: one call per master and tick for up to a batch of
//!   leases due there, and one per further batch. (A batch that spans masters, after the
//!   map changed between grouping and sending, is split again here, one call per
//!   master.) A group whose master no longer serves one of its slots (a stale map, a
//!   migration under way) or that refuses the flag is sent again at once per slot with
//!   `renew.lua`, which the driver routes and redirects; a group whose master cannot be
//!   reached stays unknown until the next tick, except one slot of it, sent per slot at
//!   once so that the driver learns where the slots went (a failover).
//! - `SCAN` on every master, and `WAIT` on the master of the lock's slot.
//! - Errors said for a cluster: a node without cluster mode, a cluster that is down
//!   (`CLUSTERDOWN`: a slot without a master), every seed down.
//!
//! Release notifications use sharded pub/sub (`SSUBSCRIBE`, in the node's
//! [`Subscriber`](super::subscriber::Subscriber)); the scripts announce with `SPUBLISH`
//! ([`Flavor::CLUSTER`]). A cluster without sharded pub/sub (Redis 6.2, as
//! [`ClusterLink::learn`] finds its masters) announces with classic `PUBLISH`, and the
//! subscriber listens with classic `SUBSCRIBE` on the lock's master.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::future::join_all;
use redis::cluster::{ClusterClient, ClusterClientBuilder, NodeAddress};
use redis::cluster_async::ClusterConnection;
use redis::cluster_read_routing::{
    ClusterTopology, ReadCandidates, ReadRoutingStrategy, ReadRoutingStrategyFactory,
};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionAddr, FromRedisValue, IntoConnectionInfo, RedisError};

use super::access::{self, Access, Timeouts, TlsSettings};
use super::capabilities::{self, Capabilities};
use super::errors::{
    Scheme, certificate_problem, code, new_connection_hint, not_a_server, port_hint_reason, redact,
    refused, sort_error, timed_out,
};
use crate::error::{Error, UnavailableReason};
use crate::scripts::replies::{Owned, Renewed};
use crate::scripts::{self, Call, Flavor};

/// What makes an application's cluster client builder
/// ([`Client::from_redis_cluster`](crate::Client::from_redis_cluster)).
pub(crate) type MakeCluster = Arc<dyn Fn() -> ClusterClientBuilder + Send + Sync>;

/// A parsed `redis+cluster://[user:password@]host:port[,host:port...]` URL (or
/// `rediss+cluster://`): the seed nodes, any of which tells the driver the rest.
#[derive(Clone)]
pub(crate) struct ClusterUrl {
    seeds: Vec<(String, u16)>,
    username: Option<String>,
    password: Option<String>,
    /// `rediss+cluster://`: every node over TLS, with these settings.
    tls: Option<TlsSettings>,
    /// An application's cluster client builder, in place of the seeds, credentials and
    /// TLS above: its settings are kept, fencelock's needs added.
    made_by: Option<MakeCluster>,
}

impl std::fmt::Debug for ClusterUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

impl ClusterUrl {
    /// `Ok(None)` when `url` is not a cluster URL. The user and password of `access`, when
    /// given, replace the URL's.
    pub fn parse(url: &str, access: &Access) -> Result<Option<Self>, Error> {
        let (rest, tls) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
            (rest, None)
        } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
            (rest, Some(access.tls.clone()))
        } else {
            return Ok(None);
        };
        let bad = |why: &str| {
            Error::invalid(
                "Redis URL",
                format!(
                    "{} does not parse ({why}); expected \
                     redis+cluster://[user:password@]host:port[,host:port...]",
                    redact(url)
                ),
            )
        };
        if rest.contains('?') {
            return Err(bad("a cluster URL takes no query parameters"));
        }
        let (username, password, rest) = access::split_credentials(rest);
        let hosts = match rest.split_once('/') {
            // A cluster has one database, 0.
            Some((hosts, "" | "0")) => hosts,
            Some(_) => return Err(bad("a Redis Cluster has only database 0")),
            None => rest,
        };
        let seeds = access::host_list(hosts, "node", bad)?;
        if tls.is_none() && access.tls.given() {
            return Err(Error::invalid(
                "TLS settings",
                "TLS settings were given for a URL without TLS: use rediss+cluster://",
            ));
        }
        Ok(Some(Self {
            seeds,
            username: access.username.clone().or(username),
            password: access.password.clone().or(password),
            tls,
            made_by: None,
        }))
    }

    /// The cluster of an application's own cluster client builder.
    pub fn made_by(make: MakeCluster) -> Self {
        Self {
            seeds: Vec::new(),
            username: None,
            password: None,
            tls: None,
            made_by: Some(make),
        }
    }

    /// For messages: the seeds, `host:port,host:port`, never a password.
    pub fn label(&self) -> String {
        if self.made_by.is_some() {
            return "the application's cluster".to_owned();
        }
        let seeds: Vec<String> = self.seeds.iter().map(|(h, p)| format!("{h}:{p}")).collect();
        seeds.join(",")
    }

    /// A driver client for the cluster: the seeds, the credentials, TLS, and timeouts and
    /// retries fit for locks (quick retries; fencelock bounds every call itself).
    fn builder(&self, timeouts: Timeouts) -> Result<ClusterClientBuilder, Error> {
        if let Some(make) = &self.made_by {
            // The application's seeds, credentials, TLS, timeouts and retries, as they are.
            access::install_provider();
            return Ok(make());
        }
        let mut seeds = Vec::with_capacity(self.seeds.len());
        for (host, port) in &self.seeds {
            let addr = match &self.tls {
                None => ConnectionAddr::Tcp(host.clone(), *port),
                Some(tls) => ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: tls.insecure,
                    tls_params: None,
                },
            };
            seeds.push(
                addr.into_connection_info()
                    .map_err(|e| Error::invalid("Redis URL", e.to_string()))?,
            );
        }
        let mut builder = ClusterClientBuilder::new(seeds)
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            .overall_response_timeout(None)
            .retries(8)
            .min_retry_wait(20)
            .max_retry_wait(500);
        if let Some(user) = &self.username {
            builder = builder.username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.password(password);
        }
        if let Some(tls) = &self.tls {
            access::install_provider();
            builder = builder.certs(tls.certificates()?);
            if tls.insecure {
                builder = builder.tls(redis::TlsMode::Insecure);
            }
        }
        Ok(builder)
    }

    /// The client of a node's commands, whose connection records each topology it learns
    /// in `topology`.
    fn command_client(
        &self,
        timeouts: Timeouts,
        topology: &Arc<Topology>,
    ) -> Result<ClusterClient, Error> {
        self.builder(timeouts)?
            .read_routing_strategy(MasterReads(topology.clone()))
            .build()
            .map_err(|e| Error::invalid("Redis URL", e.to_string()))
    }

    /// A client for sharded pub/sub: RESP3, every push (messages, confirmations, lost
    /// connections) sent to `pushes`.
    pub fn pubsub_client(
        &self,
        timeouts: Timeouts,
        pushes: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
    ) -> Result<ClusterClient, RedisError> {
        let builder = self.builder(timeouts).map_err(|e| {
            RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "cluster URL",
                e.to_string(),
            ))
        })?;
        builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(pushes)
            .build()
    }
}

/// The cluster's topology as the driver last learned it: which master serves each slot.
#[derive(Default)]
pub(crate) struct Topology(RwLock<Option<ClusterTopology>>);

impl Topology {
    /// The master serving `slot` now, if the driver knows one.
    fn master_of(&self, slot: u16) -> Option<NodeAddress> {
        let topology = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(topology.as_ref()?.shard_for_slot(slot)?.primary().clone())
    }

    /// Whether the driver learned a topology in which no node serves any slot (a node
    /// of a cluster not created yet).
    fn is_empty(&self) -> bool {
        let topology = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        topology
            .as_ref()
            .is_some_and(|t| t.shards().next().is_none())
    }

    /// Every master that serves slots now.
    fn masters(&self) -> Vec<NodeAddress> {
        let topology = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        topology
            .iter()
            .flat_map(|t| t.shards().map(|s| s.primary().clone()))
            .collect()
    }
}

/// Routes every read to its slot's master (as the driver does without a strategy: a
/// lock must never be read from a replica that lags), and keeps each topology the
/// driver learns, so that renewals can be grouped by master.
struct MasterReads(Arc<Topology>);

impl ReadRoutingStrategyFactory for MasterReads {
    fn create_strategy(&self) -> Box<dyn ReadRoutingStrategy> {
        Box::new(MasterReads(self.0.clone()))
    }
}

impl ReadRoutingStrategy for MasterReads {
    fn on_topology_changed(&self, topology: ClusterTopology) {
        *self
            .0
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(topology);
    }

    fn route_read<'a>(&self, candidates: &ReadCandidates<'a>) -> &'a NodeAddress {
        match candidates {
            ReadCandidates::AnyNode(c) => c.primary(),
            // Only for reads that demand a replica, which fencelock never sends.
            ReadCandidates::ReplicasOnly(c) => c.replicas().first(),
        }
    }
}

/// One Redis Cluster, as one logical node: its connection and what it knows of the
/// topology.
pub(crate) struct ClusterLink {
    url: ClusterUrl,
    client: ClusterClient,
    /// The driver's connection: made by [`open`](Self::open) when eager, else by the
    /// first call (and by the next call, while connecting fails). Not the driver's
    /// pending connection, which answers every call with "no connections found" for as
    /// long as no node can be reached, whatever the cause: a certificate the client
    /// does not trust, or a wrong password, would pass for every seed being down (and a
    /// waiting acquire would wait it out). A connect that fails says why.
    conn: tokio::sync::OnceCell<ClusterConnection>,
    topology: Arc<Topology>,
    /// Set once a node refused the batch across slots (a server that cannot read its
    /// flag, where it was sent with it): renewals then go per slot.
    per_slot: AtomicBool,
    /// Whether the cluster refused `SCRIPT LOAD` (see [`ClusterLink::evaluate`]).
    no_script_load: AtomicBool,
    call_timeout: Duration,
}

impl ClusterLink {
    /// Connects to the cluster at `url`: now if `eager` (asking the seeds for the
    /// topology, failing fast), or with the first call.
    pub async fn open(
        url: ClusterUrl,
        timeouts: Timeouts,
        call_timeout: Duration,
        eager: bool,
    ) -> Result<Self, Error> {
        let topology = Arc::new(Topology::default());
        let client = url.command_client(timeouts, &topology)?;
        let conn = if eager {
            match tokio::time::timeout(call_timeout, client.get_async_connection()).await {
                Ok(Ok(conn)) => tokio::sync::OnceCell::from(conn),
                Ok(Err(e)) => return Err(connect_error(&url, &e)),
                Err(_) => return Err(timed_out(&url.label(), call_timeout)),
            }
        } else {
            tokio::sync::OnceCell::new()
        };
        Ok(Self {
            url,
            client,
            conn,
            topology,
            per_slot: AtomicBool::new(false),
            no_script_load: AtomicBool::new(false),
            call_timeout,
        })
    }

    /// The driver's connection, connecting first if no call has made it yet (see
    /// [`ClusterLink::conn`]). Cancel safety: a connect dropped half-way leaves none
    /// made, and the next call connects.
    async fn connection(&self) -> Result<ClusterConnection, RedisError> {
        self.conn
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
    }

    /// Sends `cmd` where `routing` says; a server's error reply as an error.
    async fn send(
        &self,
        cmd: redis::Cmd,
        routing: RoutingInfo,
    ) -> Result<redis::Value, RedisError> {
        self.connection()
            .await?
            .route_command(cmd, routing)
            .await?
            .extract_error()
    }

    /// The seeds, for messages about the cluster as a whole.
    pub fn label(&self) -> String {
        self.url.label()
    }

    /// The master that serves `key` now (`host:port`), or the seeds if that is not known.
    pub fn addr_for(&self, key: &str) -> String {
        match self.topology.master_of(key_slot(key)) {
            Some(addr) => addr.to_string(),
            None => self.label(),
        }
    }

    /// The master of `key`'s slot now, if the slot map is known.
    pub fn master_for(&self, key: &str) -> Option<String> {
        self.topology
            .master_of(key_slot(key))
            .map(|addr| addr.to_string())
    }

    /// Runs a script (in `flavor`) on the master of its keys' slot, within `within`.
    /// Cancel safety: as [`super::Node::run`].
    pub async fn run<T: FromRedisValue>(
        &self,
        call: &Call,
        within: Duration,
        flavor: Flavor,
    ) -> Result<T, Error> {
        let node = || {
            call.first_key()
                .map_or_else(|| self.label(), |k| self.addr_for(k))
        };
        let attempt = async {
            let value = self.evaluate(call, flavor, None).await?;
            T::from_redis_value(value).map_err(RedisError::from)
        };
        match tokio::time::timeout(within, attempt).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(refused(call, self.error(&node(), &e), flavor)),
            Err(_) => Err(timed_out(&node(), within)),
        }
    }

    /// Sends `call` (in `flavor`) to the node at `at`, or else routed by its first key,
    /// as `EVALSHA`; where the node lacks the script, loads it there (`SCRIPT LOAD`) and
    /// sends the `EVALSHA` again, or where the cluster refuses `SCRIPT LOAD` (renamed
    /// away, or not allowed to the user), sends `EVAL`, from then on. An error reply
    /// comes back as an error.
    async fn evaluate(
        &self,
        call: &Call,
        flavor: Flavor,
        at: Option<&NodeAddress>,
    ) -> Result<redis::Value, RedisError> {
        let evalsha = call.evalsha(flavor);
        match self.send_to(&evalsha, at).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {}
            answer => return answer,
        }
        if !self.no_script_load.load(Ordering::Relaxed) {
            // Loaded where it runs: on the node at `at`, or the master of its keys' slot
            // (the driver would send SCRIPT LOAD to every node, and wait for a replica
            // that does not answer).
            let load = call.load(flavor);
            let loaded = match (at, call.first_key()) {
                (Some(addr), _) => self.send(load, by_address(addr)).await,
                (None, Some(key)) => {
                    let master = Route::new(key_slot(key), SlotAddr::Master);
                    let route =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(master));
                    self.send(load, route).await
                }
                (None, None) => self.send_to(&load, None).await,
            };
            match loaded {
                Ok(_) => match self.send_to(&evalsha, at).await {
                    // Loaded on a node that no longer serves the keys (the driver's slot
                    // map is behind a failover; the EVALSHA was redirected): EVAL, which
                    // goes where the keys are.
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {}
                    answer => return answer,
                },
                Err(e) if capabilities::refuses(&e) => {
                    if !self.no_script_load.swap(true, Ordering::Relaxed) {
                        tracing::info!(cluster = %self.label(), error = %e, "the cluster refuses SCRIPT LOAD; scripts a node lacks are sent with EVAL");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.send_to(&call.eval(flavor), at).await
    }

    /// Sends `cmd` to the node at `at`, or else where the driver routes it (a script
    /// call by its first key); a server's error reply as an error.
    async fn send_to(
        &self,
        cmd: &redis::Cmd,
        at: Option<&NodeAddress>,
    ) -> Result<redis::Value, RedisError> {
        match at {
            Some(addr) => self.send(cmd.clone(), by_address(addr)).await,
            None => {
                use redis::aio::ConnectionLike as _;
                let mut conn = self.connection().await?;
                conn.req_packed_command(cmd).await?.extract_error()
            }
        }
    }

    /// What every master of the cluster offers, each asked with `INFO server` (`HELLO`
    /// where that is refused) within `within`: what they all have (a cluster amid a
    /// rolling upgrade). A master that does not answer is left out, unless none does.
    ///
    /// # Errors
    /// No master answers: the first's error. A master that is a Sentinel or older than
    /// fencelock supports: [`Error::Rejected`] (see [`capabilities::judge`]).
    pub async fn learn(&self, within: Duration) -> Result<Capabilities, Error> {
        let asking = async {
            let masters = self.known_masters().await?;
            let asks = masters.iter().map(|master| async move {
                let send = |cmd: redis::Cmd| self.send(cmd, by_address(master));
                (master.to_string(), capabilities::ask(send).await)
            });
            let mut offers: Option<Capabilities> = None;
            let mut failed = None;
            for (addr, answer) in join_all(asks).await {
                match answer {
                    Ok(server) => {
                        let these = capabilities::judge(&addr, server.as_ref())?;
                        offers = Some(offers.map_or(these, |all| all.and(these)));
                    }
                    Err(e) => failed = failed.or(Some(self.error(&addr, &e))),
                }
            }
            match (offers, failed) {
                (Some(offers), _) => Ok(offers),
                (None, Some(e)) => Err(e),
                (None, None) => Err(Error::Unavailable {
                    node: self.label(),
                    reason: UnavailableReason::ClusterDown,
                    detail: "no master serves a slot".to_owned(),
                    source: None,
                }),
            }
        };
        match tokio::time::timeout(within, asking).await {
            Ok(offers) => offers,
            Err(_) => Err(timed_out(&self.label(), within)),
        }
    }

    /// One renewal batch (`(lock key, holder, ttl)` per lease), within `within`, its
    /// scripts in `flavor`: what the cluster answered for each lease, `None` where it did
    /// not answer in time. See the module docs for how the leases are grouped.
    pub async fn renew(
        &self,
        leases: &[(&str, &str, Duration)],
        within: Duration,
        flavor: Flavor,
    ) -> Vec<Option<Owned>> {
        let deadline = tokio::time::Instant::now() + within;
        let mut answers = vec![None; leases.len()];
        let mut by_master: HashMap<NodeAddress, Vec<usize>> = HashMap::new();
        let mut per_slot = Vec::new();
        for (i, (key, _, _)) in leases.iter().enumerate() {
            match self.topology.master_of(key_slot(key)) {
                Some(master) if !self.per_slot.load(Ordering::Relaxed) => {
                    by_master.entry(master).or_default().push(i)
                }
                _ => per_slot.push(i),
            }
        }
        let batches = by_master.into_iter().map(|(master, group)| async move {
            let call = scripts::renew_across_slots(group.iter().map(|&i| leases[i]));
            let result =
                tokio::time::timeout_at(deadline, self.run_on(&master, &call, flavor)).await;
            (master, group, result)
        });
        for (master, group, result) in join_all(batches).await {
            match result {
                Ok(Ok(Renewed(codes))) if codes.len() == group.len() => {
                    for (i, code) in group.into_iter().zip(codes) {
                        answers[i] = Some(code);
                    }
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) if resend_per_slot(&e) => {
                    if flag_refused(&e) && !self.per_slot.swap(true, Ordering::Relaxed) {
                        tracing::warn!(node = %master, error = %e, "the cluster refuses renewals across slots; renewing per slot");
                    } else {
                        tracing::debug!(node = %master, error = %e, leases = group.len(), "renewing this node's leases per slot");
                    }
                    per_slot.extend(group);
                }
                Ok(Err(e)) => {
                    // The master is unreachable (dead, failing over): its leases wait for
                    // the next tick, but one slot of them goes now, routed by slot, so
                    // that the driver finds out where the slots went meanwhile.
                    tracing::debug!(node = %master, error = %e, leases = group.len(), "renewal failed; retrying");
                    let probe = key_slot(leases[group[0]].0);
                    per_slot.extend(
                        group
                            .into_iter()
                            .filter(|&i| key_slot(leases[i].0) == probe),
                    );
                }
                Err(_) => {}
            }
        }
        if !per_slot.is_empty() {
            self.renew_per_slot(leases, per_slot, deadline, flavor, &mut answers)
                .await;
        }
        answers
    }

    /// The leases of `renew`'s batch at `per_slot` renewed one slot per call, routed by
    /// slot (the driver follows a slot that moved), until `deadline`; their answers put
    /// into `answers`.
    async fn renew_per_slot(
        &self,
        leases: &[(&str, &str, Duration)],
        per_slot: Vec<usize>,
        deadline: tokio::time::Instant,
        flavor: Flavor,
        answers: &mut [Option<Owned>],
    ) {
        let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
        for i in per_slot {
            by_slot.entry(key_slot(leases[i].0)).or_default().push(i);
        }
        let calls = by_slot.into_values().map(|group| async move {
            let call = scripts::renew(group.iter().map(|&i| leases[i]));
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            (group, self.run::<Renewed>(&call, left, flavor).await)
        });
        for (group, result) in join_all(calls).await {
            match result {
                Ok(Renewed(codes)) if codes.len() == group.len() => {
                    for (i, code) in group.into_iter().zip(codes) {
                        answers[i] = Some(code);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, leases = group.len(), "renewal of a slot failed; retrying")
                }
            }
        }
    }

    /// Sends `call` (in `flavor`) to the node at `addr` (and only there: an error comes
    /// back as it is, never redirected by this method), loading its script first if the
    /// node lacks it.
    async fn run_on<T: FromRedisValue>(
        &self,
        addr: &NodeAddress,
        call: &Call,
        flavor: Flavor,
    ) -> Result<T, RedisError> {
        let value = self.evaluate(call, flavor, Some(addr)).await?;
        T::from_redis_value(value).map_err(RedisError::from)
    }

    /// Every key matching `pattern` on every master, by `SCAN`.
    pub async fn scan(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let masters = self.known_masters().await?;
        let scans = masters.iter().map(|m| self.scan_master(m, pattern));
        let mut keys = Vec::new();
        for found in join_all(scans).await {
            keys.extend(found?);
        }
        Ok(keys)
    }

    /// Every master that serves slots now; before the first command, after one that
    /// makes the driver learn the topology.
    async fn known_masters(&self) -> Result<Vec<NodeAddress>, Error> {
        let masters = self.topology.masters();
        if !masters.is_empty() {
            return Ok(masters);
        }
        let random = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let ping = self.send(redis::cmd("PING"), random);
        match tokio::time::timeout(self.call_timeout, ping).await {
            Ok(Ok(_)) => Ok(self.topology.masters()),
            Ok(Err(e)) => Err(self.error(&self.label(), &e)),
            Err(_) => Err(timed_out(&self.label(), self.call_timeout)),
        }
    }

    /// `INFO section` on every master, with each master's `host:port`. Cancel safe: it
    /// only reads.
    pub async fn info_each_master(&self, section: &str) -> Result<Vec<(String, String)>, Error> {
        let masters = self.known_masters().await?;
        let asks = masters.iter().map(|master| async move {
            let addr = master.to_string();
            let route = by_address(master);
            let info = redis::cmd("INFO").arg(section).to_owned();
            let value = match tokio::time::timeout(self.call_timeout, self.send(info, route)).await
            {
                Ok(Ok(value)) => value,
                Ok(Err(e)) => return Err(self.error(&addr, &e)),
                Err(_) => return Err(timed_out(&addr, self.call_timeout)),
            };
            let text: String = FromRedisValue::from_redis_value(value)
                .map_err(|e| self.error(&addr, &RedisError::from(e)))?;
            Ok((addr, text))
        });
        join_all(asks).await.into_iter().collect()
    }

    async fn scan_master(&self, master: &NodeAddress, pattern: &str) -> Result<Vec<String>, Error> {
        let addr = master.to_string();
        let mut keys = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut page = redis::cmd("SCAN");
            page.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            let route = by_address(master);
            let value = match tokio::time::timeout(self.call_timeout, self.send(page, route)).await
            {
                Ok(Ok(value)) => value,
                Ok(Err(e)) => return Err(self.error(&addr, &e)),
                Err(_) => return Err(timed_out(&addr, self.call_timeout)),
            };
            let (next, found): (u64, Vec<String>) = FromRedisValue::from_redis_value(value)
                .map_err(|e| self.error(&addr, &RedisError::from(e)))?;
            keys.extend(found);
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    }

    /// `WAIT replicas timeout` on the master that serves `key` as the driver last saw
    /// it (the one that just took the grant, on the connection that sent it), by its
    /// address. Routed by the key instead, the driver sends it elsewhere while that
    /// master's connection is down (a failover under way): to the slot's replica, or to
    /// any other master, which answers at once for its own replicas and the writes of
    /// its own connection, so a grant no replica had counted as replicated.
    pub async fn wait(
        &self,
        key: &str,
        replicas: u32,
        within: Duration,
        bound: Duration,
    ) -> Result<Result<i64, RedisError>, Error> {
        let Some(master) = self.topology.master_of(key_slot(key)) else {
            return Err(Error::Unavailable {
                node: self.label(),
                reason: UnavailableReason::SlotMoving,
                detail: "no master known for the lock's slot".to_owned(),
                source: None,
            });
        };
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(within.as_millis() as u64);
        let route = by_address(&master);
        let waited = tokio::time::timeout(bound, self.send(wait, route)).await;
        match waited {
            Ok(Ok(v)) => Ok(i64::from_redis_value(v).map_err(RedisError::from)),
            Ok(Err(e)) if e.kind() == redis::ErrorKind::ClusterConnectionNotFound => {
                Err(Error::Unavailable {
                    node: master.to_string(),
                    reason: UnavailableReason::Refused,
                    detail: "the master that took the grant is not connected (a failover \
                             under way?)"
                        .to_owned(),
                    source: None,
                })
            }
            Ok(Err(e)) => Ok(Err(e)),
            Err(_) => Err(timed_out(&self.addr_for(key), bound)),
        }
    }

    /// A driver error of a call to `node` (a master's `host:port`, or the seeds), sorted:
    /// seeds that answered but serve no slot are said so (the driver finds no connection
    /// for any slot, as when every node is down), seeds of the wrong kind as
    /// [`seeds_unanswered`] says, else as [`cluster_error`].
    pub fn error(&self, node: &str, e: &RedisError) -> Error {
        if e.kind() == redis::ErrorKind::ClusterConnectionNotFound && self.topology.is_empty() {
            return Error::Unavailable {
                node: node.to_owned(),
                reason: UnavailableReason::ClusterDown,
                detail: "the seeds answer, but serve no slot: this node is in no cluster yet \
                         (redis-cli --cluster create), or name nodes of one that is"
                    .to_owned(),
                source: None,
            };
        }
        seeds_unanswered(&self.url, node, e).unwrap_or_else(|| cluster_error(node, e))
    }
}

/// Where a command for the node at `addr` goes.
fn by_address(addr: &NodeAddress) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: addr.host().to_owned(),
        port: addr.port(),
    })
}

/// The hash slot of `key`, as Redis computes it: CRC16 (XMODEM) of its hash tag (what is
/// between the first `{` and the next `}`, if that is not empty) or else of the whole
/// key, modulo 16384.
pub(crate) fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// Whether a node's batch failed for a reason that sending its leases per slot gets
/// past: the node no longer serves a slot of it, or a slot is migrating (the script
/// touched a key that is elsewhere), or the flag across slots is refused.
fn resend_per_slot(e: &RedisError) -> bool {
    let text = e.to_string();
    matches!(code(e), Some("MOVED" | "ASK" | "TRYAGAIN" | "CROSSSLOT"))
        || text.contains("non local key")
        || text.contains("do not hash to the same slot")
        || flag_refused(e)
}

/// Whether the server refused the `#!lua flags=allow-cross-slot-keys` line: a server
/// older than Redis 7 cannot compile it, a later one might not know the flag.
fn flag_refused(e: &RedisError) -> bool {
    let text = e.to_string();
    text.contains("Error compiling script")
        || text.contains("shebang")
        || text.contains("Unexpected flag")
        || text.contains("Unknown lua")
}

/// Sorts a driver error of a call to `node` (a master's `host:port`, or the seeds): the
/// cluster's own troubles first (the driver wraps what the seeds answered when it
/// connects in an I/O error, whose text tells them apart), then as for any node.
fn cluster_error(node: &str, e: &RedisError) -> Error {
    let text = e.to_string();
    let rejected = |code: &str, message: &str| Error::Rejected {
        node: node.to_owned(),
        code: code.to_owned(),
        message: message.to_owned(),
    };
    if let Some(sentinel) = not_a_server(node, e) {
        return sentinel;
    }
    if text.contains("cluster support disabled") {
        return rejected(
            "ERR",
            "it is not a Redis Cluster node (cluster support disabled): use \
             redis://host:port for a standalone node",
        );
    }
    if certificate_problem(e).is_none() {
        if text.contains("AuthenticationFailed") || text.contains("WRONGPASS") {
            return rejected(
                "WRONGPASS",
                "authentication failed: wrong user name or password",
            );
        }
        if text.contains("NOAUTH") {
            return rejected("NOAUTH", "NOAUTH authentication required");
        }
        if text.contains("initial connections")
            || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
        {
            return Error::Unavailable {
                node: node.to_owned(),
                reason: UnavailableReason::Refused,
                detail: "no node of the cluster answers: every seed is down or unreachable"
                    .to_owned(),
                source: None,
            };
        }
    }
    // Valkey's answer to a script whose key's slot this node no longer serves (a
    // failover demoted it): the slot moved, as MOVED says elsewhere; nothing was written
    // (a lock's keys share one slot, so its first key access fails).
    let moved_away = text.contains("non local key");
    let reason = match code(e) {
        _ if moved_away => UnavailableReason::SlotMoving,
        Some("CLUSTERDOWN") => UnavailableReason::ClusterDown,
        // Still redirected after the driver followed several redirections; or sent to a
        // node that is a replica (the driver's map still names a master that a failover
        // demoted, or one not yet promoted): a failover under way, which a wait rides out.
        Some("MOVED" | "ASK" | "TRYAGAIN" | "READONLY") => UnavailableReason::SlotMoving,
        _ => return sort_error(node, e),
    };
    Error::Unavailable {
        node: node.to_owned(),
        reason,
        detail: format!(
            "{} {}",
            code(e).unwrap_or_default(),
            e.detail().unwrap_or_default()
        ),
        source: None,
    }
}

/// Why no seed of the cluster at `url` could be connected to, when their ports are of
/// the wrong kind (TLS or not, or not Redis at all: see [`new_connection_hint`]) or do
/// not answer in time; `None` for any other error. `node`: the master called, or the
/// seeds.
fn seeds_unanswered(url: &ClusterUrl, node: &str, e: &RedisError) -> Option<Error> {
    let text = e.to_string();
    if !text.contains("initial connections") || certificate_problem(e).is_some() {
        return None;
    }
    let unavailable = |reason, detail: String| Error::Unavailable {
        node: node.to_owned(),
        reason,
        detail,
        source: None,
    };
    if let Some(hint) = new_connection_hint(e, url.tls.is_some(), Scheme::Cluster) {
        return Some(unavailable(port_hint_reason(&hint), hint));
    }
    text.contains("timed out").then(|| {
        unavailable(
            UnavailableReason::TimedOut,
            "no seed answered in time: are they Redis Cluster nodes, and their ports?".to_owned(),
        )
    })
}

/// An error connecting to the cluster at `url`: as [`seeds_unanswered`], then as
/// [`cluster_error`], a connection refused or broken meaning that no seed answers.
fn connect_error(url: &ClusterUrl, e: &RedisError) -> Error {
    if let Some(error) = seeds_unanswered(url, &url.label(), e) {
        return error;
    }
    match cluster_error(&url.label(), e) {
        Error::Unavailable {
            node,
            reason: UnavailableReason::Refused | UnavailableReason::Io,
            detail,
            ..
        } if detail.is_empty() => Error::Unavailable {
            node,
            reason: UnavailableReason::Refused,
            detail: "no node of the cluster answers: every seed is down or unreachable".to_owned(),
            source: None,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_computed_as_redis_does() {
        // CLUSTER KEYSLOT on Redis 7.0.
        assert_eq!(key_slot("fencelock:{a}"), 15495);
        assert_eq!(key_slot("fencelock:{b}:holder"), 3300);
        assert_eq!(key_slot("{b}"), 3300);
        // The CRC16 check value of the XMODEM variant.
        assert_eq!(key_slot("123456789"), 0x31c3);
        // An empty hash tag: the whole key is hashed.
        assert_ne!(key_slot("x{}{a}"), key_slot("{a}"));
    }

    #[test]
    fn cluster_urls_parse() {
        let plain = Access::default();
        let u = ClusterUrl::parse(
            "redis+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2:7001",
            &plain,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            u.seeds,
            [("10.0.0.1".to_owned(), 7000), ("10.0.0.2".to_owned(), 7001)]
        );
        assert_eq!(u.username.as_deref(), Some("app"));
        assert_eq!(u.password.as_deref(), Some("s@cret"));
        assert!(u.tls.is_none());
        assert_eq!(u.label(), "10.0.0.1:7000,10.0.0.2:7001");
        assert!(!format!("{u:?}").contains("cret"));
        let tls = ClusterUrl::parse("rediss+cluster://h:1/0", &plain)
            .unwrap()
            .unwrap();
        assert!(tls.tls.is_some());
        assert!(ClusterUrl::parse("redis://h:1", &plain).unwrap().is_none());
        for bad in [
            "redis+cluster://h",
            "redis+cluster://h:x",
            "redis+cluster://:1",
            "redis+cluster://h:1/2",
            "redis+cluster://h:1?x=1",
        ] {
            let e = ClusterUrl::parse(bad, &plain).err();
            assert!(
                matches!(e, Some(Error::InvalidArgument { .. })),
                "{bad}: {e:?}"
            );
        }
    }
}
