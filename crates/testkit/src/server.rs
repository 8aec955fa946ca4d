//! Spawning, controlling and talking to `redis-server` child processes.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::build::{NOT_FOUND, ServerBuild};
use crate::clock::ServerClock;
use crate::resp::{Reply, encode_command, read_reply};
use crate::tls::{ClientAuth, TlsFiles};

/// How long `start` waits for a freshly spawned server to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Interval between readiness probes.
const POLL: Duration = Duration::from_millis(10);
/// How many ports `start` tries when the server exits early (port race).
const START_ATTEMPTS: usize = 5;
/// How long `restart` keeps retrying to bind the old port.
const RESTART_BIND_WINDOW: Duration = Duration::from_secs(5);
/// Connect/read/write timeout of [`RedisServer::cmd`].
const CMD_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeouts of a single readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long `pause`/`resume` wait for the kernel to (un)stop the process.
const SIGNAL_SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Server log file name inside the server's directory.
const LOG_FILE: &str = "redis.log";
/// Where the server's stderr goes, inside its directory.
const STDERR_FILE: &str = "redis.stderr";
/// The config file written by [`ServerBuilder::config_file`], inside the
/// server's directory.
const CONFIG_FILE: &str = "redis.conf";
/// The directory inside the server's directory that holds the copies of
/// what it serves over TLS (see [`ServerBuilder::tls_with`]).
const TLS_DIR: &str = "tls";
/// Redis Cluster's bus listens on the client port plus this offset.
const CLUSTER_BUS_OFFSET: u16 = 10000;

/// Returns a TCP port on 127.0.0.1 that was free a moment ago: binds
/// `127.0.0.1:0`, reads the port the kernel chose, and closes the socket.
///
/// Another process may take the port before you bind it; [`RedisServer::start`]
/// handles that race by retrying on a new port.
///
/// # Panics
/// If binding a loopback socket fails.
pub fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("testkit: cannot bind 127.0.0.1:0 to find a free port: {e}"))
}

/// Returns a TCP port `P` on 127.0.0.1 such that both `P` and `P + 10000`
/// (Redis Cluster's bus port) were free a moment ago, for servers started
/// with `--cluster-enabled yes` (see [`ServerBuilder::port_source`]).
///
/// The kernel's ephemeral ports (`/proc/sys/net/ipv4/ip_local_port_range`,
/// 32768-60999 by default) are avoided for both: a bus port in that range
/// may be taken at any moment by some outgoing connection, and one above
/// 65535 does not exist. With the default range `P` lies in 10000-22767.
/// Candidates are drawn at random (so parallel tests and other test
/// processes rarely collide) and checked by binding both ports; the race
/// that remains is handled by [`RedisServer::start`]'s retry on a new port.
///
/// A port is handed out at most once per process, even after its server is
/// gone: the nodes of a cluster go on calling a killed node's address, and
/// a node of another cluster answering there gets the dead node flagged
/// `noaddr`, which Redis never times out, so it is never failed (a test
/// waiting for `cluster_state:fail` waited in vain).
///
/// # Panics
/// If no such pair is found after many attempts.
pub fn free_cluster_port() -> u16 {
    let ephemeral = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut it = text.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    let (lo, hi) = cluster_port_range(ephemeral);
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let port = lo + (next_random() % u64::from(hi - lo + 1)) as u16;
        if handed_out.contains(&port) {
            continue;
        }
        let both_free = TcpListener::bind(("127.0.0.1", port))
            .and_then(|a| {
                TcpListener::bind(("127.0.0.1", port + CLUSTER_BUS_OFFSET)).map(|b| (a, b))
            })
            .is_ok();
        if both_free {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("testkit: found no free port P in {lo}-{hi} with P + 10000 free as well")
}

/// The range to draw cluster ports from: ports `P >= 10000` where neither
/// `P` nor `P + 10000` is in the ephemeral range `(elo, ehi)` and
/// `P + 10000 <= 65535`; the largest such stretch, or all of
/// 10000-55535 if the ephemeral range leaves none worth having.
fn cluster_port_range((elo, ehi): (u16, u16)) -> (u16, u16) {
    const LO: u32 = 10000;
    const HI: u32 = 65535 - CLUSTER_BUS_OFFSET as u32;
    let off = u32::from(CLUSTER_BUS_OFFSET);
    let (elo, ehi) = (u32::from(elo), u32::from(ehi));
    // Below the ephemeral range (bus port too), or above it.
    let below = (LO, elo.saturating_sub(off + 1).min(HI));
    let above = ((ehi + 1).max(LO), HI);
    let len = |(a, b): (u32, u32)| b.saturating_sub(a) + u32::from(b >= a);
    let best = if len(below) >= len(above) {
        below
    } else {
        above
    };
    let best = if len(best) >= 1000 { best } else { (LO, HI) };
    (best.0 as u16, best.1 as u16)
}

/// A cheap pseudo-random number (splitmix64 over the clock, the pid and a
/// counter): enough to spread port picks, no dependency needed.
fn next_random() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut z = nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_mul(3);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Clone, Debug, Default)]
struct Config {
    extra_args: Vec<String>,
    persistence: bool,
    /// Contents of a config file passed as the first argument.
    config_file: Option<String>,
    /// How to pick a port; `None`: [`free_port`].
    port_source: Option<fn() -> u16>,
    /// A TLS port besides the plain one.
    tls: Option<TlsConfig>,
    /// A wall clock the test steps.
    clock: Option<ServerClock>,
    /// The server binary.
    build: ServerBuild,
}

/// What [`ServerBuilder::tls_with`] asked for: the files are copied into the
/// server's directory when it is created.
#[derive(Clone, Debug)]
pub(crate) struct TlsConfig {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    pub(crate) ca: PathBuf,
    pub(crate) clients: ClientAuth,
    /// A client certificate and its key, which the server presents when it connects
    /// to another server over TLS (`--tls-client-cert-file`, `--tls-client-key-file`:
    /// the cluster bus and replication), and testkit's own client presents to a
    /// [TLS-only](Self::only) server.
    pub(crate) client: Option<(PathBuf, PathBuf)>,
    /// The TLS port only (`--port 0`): testkit's own client talks TLS to it.
    pub(crate) only: bool,
}

impl TlsConfig {
    /// The copies in the server's directory: (certificate, key, CA).
    pub(crate) fn copies(dir: &Path) -> [PathBuf; 3] {
        let tls = dir.join(TLS_DIR);
        ["server.crt", "server.key", "ca.crt"].map(|name| tls.join(name))
    }

    /// The copies of the client certificate and key in the server's directory.
    pub(crate) fn client_copies(dir: &Path) -> [PathBuf; 2] {
        let tls = dir.join(TLS_DIR);
        ["client.crt", "client.key"].map(|name| tls.join(name))
    }
}

impl Config {
    /// The value following `--requirepass` in the extra args, if any; used
    /// so the readiness probe can authenticate.
    fn password(&self) -> Option<&str> {
        self.extra_args
            .iter()
            .rposition(|a| a == "--requirepass")
            .and_then(|i| self.extra_args.get(i + 1))
            .map(String::as_str)
    }
}

/// Configures a [`RedisServer`] before starting it. Get one from
/// [`RedisServer::builder`].
///
/// ```
/// let server = testkit::RedisServer::builder()
///     .arg("--requirepass")
///     .arg("s3cret")
///     .start();
/// assert_eq!(server.cmd_as("s3cret", &["PING"]).as_str(), Some("PONG"));
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until .start() is called"]
pub struct ServerBuilder {
    config: Config,
}

impl ServerBuilder {
    /// Appends one extra `redis-server` command-line argument. Extra args come
    /// after testkit's own, so they override them (`.arg("--save").arg("60 1")`).
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.config.extra_args.push(a.into());
        self
    }

    /// Appends several extra arguments, see [`ServerBuilder::arg`].
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config
            .extra_args
            .extend(args.into_iter().map(Into::into));
        self
    }

    /// Renames each of `commands` away (`--rename-command NAME ""`): the server then
    /// answers them as unknown, as managed services do with the admin commands they keep
    /// to themselves ([`ServerBuilder::MANAGED_AWAY`]).
    ///
    /// ```
    /// let server = testkit::RedisServer::builder()
    ///     .rename_away(["SCRIPT"])
    ///     .start();
    /// assert!(server.cmd(&["SCRIPT", "LOAD", "return 1"]).is_error());
    /// ```
    pub fn rename_away<'a>(mut self, commands: impl IntoIterator<Item = &'a str>) -> Self {
        for command in commands {
            self = self.arg("--rename-command").arg(command).arg("");
        }
        self
    }

    /// The admin commands that managed Redis services commonly rename away:
    /// `CONFIG`, `CLIENT`, `DEBUG`, `MODULE` and `SCRIPT`.
    pub const MANAGED_AWAY: [&'static str; 5] = ["CONFIG", "CLIENT", "DEBUG", "MODULE", "SCRIPT"];

    /// Durable persistence. Off (the default): `--save "" --appendonly no`,
    /// so a killed server loses everything. On: `--appendonly yes
    /// --appendfsync always` (RDB snapshots stay off), so every acknowledged
    /// write survives [`RedisServer::kill`] + [`RedisServer::restart`].
    pub fn persistence(mut self, on: bool) -> Self {
        self.config.persistence = on;
        self
    }

    /// A config file for the server: `contents` is written to `redis.conf`
    /// in the server's directory before it first starts, and its path is
    /// passed as the first argument (so testkit's own arguments and
    /// [`arg`](Self::arg)s override it). Sentinels need one
    /// (`.config_file("sentinel monitor ...").arg("--sentinel")`): they
    /// rewrite it with what they learn. A [`restart`](RedisServer::restart)
    /// reads the file as the server left it.
    pub fn config_file(mut self, contents: impl Into<String>) -> Self {
        self.config.config_file = Some(contents.into());
        self
    }

    /// How to pick the server's port (and a new one if the server exits at
    /// start, e.g. because another process took the port): [`free_port`] by
    /// default; [`free_cluster_port`] for `--cluster-enabled yes`, whose bus
    /// port (port + 10000) must be free as well.
    pub fn port_source(mut self, pick: fn() -> u16) -> Self {
        self.config.port_source = Some(pick);
        self
    }

    /// A TLS port as well, serving the good certificate of `files`
    /// ([`TlsFiles::server_cert`], valid for `localhost` and `127.0.0.1`) and
    /// trusting `files`' CA for client certificates; see
    /// [`tls_with`](Self::tls_with).
    ///
    /// ```
    /// use testkit::{ClientAuth, RedisServer, TlsFiles};
    ///
    /// let server = RedisServer::builder()
    ///     .tls(TlsFiles::shared(), ClientAuth::Yes)
    ///     .start();
    /// assert_ne!(server.tls_port(), Some(server.port()));
    /// ```
    pub fn tls(self, files: &TlsFiles, clients: ClientAuth) -> Self {
        self.tls_with(files, files.server_cert(), files.server_key(), clients)
    }

    /// A TLS port as well, on another free port ([`RedisServer::tls_port`],
    /// [`RedisServer::tls_url`]), serving certificate `cert` with its key
    /// `key` (e.g. [`TlsFiles::expired_server_cert`] and
    /// [`TlsFiles::expired_server_key`]), trusting [`TlsFiles::ca_cert`] for
    /// client certificates, and asking clients for one as `clients` says:
    /// `--tls-port P --tls-cert-file --tls-key-file --tls-ca-cert-file
    /// --tls-auth-clients`, before the [`arg`](Self::arg)s (which can
    /// override them).
    ///
    /// The plain port stays open: testkit's own client ([`RedisServer::cmd`]
    /// and the rest) and its readiness checks use it. Replication and
    /// cluster links stay plain too.
    ///
    /// The three files are copied into the server's directory when it
    /// starts, so the server does not depend on `files` living on (a
    /// [`restart`](RedisServer::restart) serves the same copies).
    ///
    /// # Panics
    /// [`start`](Self::start) panics if a file cannot be copied.
    pub fn tls_with(
        self,
        files: &TlsFiles,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
        clients: ClientAuth,
    ) -> Self {
        self.tls_config(TlsConfig {
            cert: cert.as_ref().to_owned(),
            key: key.as_ref().to_owned(),
            ca: files.ca_cert(),
            clients,
            client: None,
            only: false,
        })
    }

    /// Runs the server on `clock`, a wall clock the test can step while the
    /// server runs (see [`clock`](crate::clock)); restarts keep it.
    pub fn clock(mut self, clock: &ServerClock) -> Self {
        self.config.clock = Some(clock.clone());
        self
    }

    /// Which server binary to run (default [`ServerBuild::Redis7`]): Redis 6.2,
    /// Valkey 9.1 or a binary of the user's own; see [`ServerBuild`].
    ///
    /// ```
    /// use testkit::{RedisServer, ServerBuild};
    ///
    /// let server = RedisServer::builder().server(ServerBuild::Valkey91).start();
    /// assert_eq!(server.version(), "Valkey 9.1.2");
    /// ```
    ///
    /// # Panics
    /// [`start`](Self::start) panics if the binary is missing (for the fetched builds
    /// the message says to run `scripts/servers`), and with [`tls`](Self::tls) on a
    /// build without TLS ([`ServerBuild::has_tls`]).
    pub fn server(mut self, build: ServerBuild) -> Self {
        self.config.build = build;
        self
    }

    /// [`tls_with`](Self::tls_with), from what it was given.
    pub(crate) fn tls_config(mut self, tls: TlsConfig) -> Self {
        self.config.tls = Some(tls);
        self
    }

    /// Starts the server and waits until it answers `PING`.
    ///
    /// Start it from the thread that will own it (normally the test's own
    /// thread): see [`RedisServer`] on `PR_SET_PDEATHSIG`.
    ///
    /// # Panics
    /// If `redis-server` cannot be found, or does not come up (the message
    /// includes the tail of its log file).
    pub fn start(self) -> RedisServer {
        self.launch().finish()
    }

    /// Spawns the server without waiting for it.
    fn launch(self) -> Launch {
        if self.config.tls.is_some() {
            self.config.build.require_tls();
        }
        let next_port = self.config.port_source.unwrap_or(free_port);
        Launch::begin(self.config.build.binary(), self.config, next_port)
    }
}

/// Starts several servers, each configured by its builder: all are spawned
/// first (from the calling thread, see `PDEATHSIG` on [`RedisServer`]) and
/// boot concurrently, then each is waited for. If one fails, the panic drops
/// (kills) all the others.
pub(crate) fn start_all(builders: Vec<ServerBuilder>) -> Vec<RedisServer> {
    let launches: Vec<Launch> = builders.into_iter().map(ServerBuilder::launch).collect();
    launches.into_iter().map(Launch::finish).collect()
}

/// A real `redis-server` child process on a free loopback port with its own
/// temporary directory, killed and cleaned up on drop.
///
/// The server runs with `--bind 127.0.0.1 --protected-mode no --daemonize no`,
/// its data directory and `redis.log` in a fresh temporary directory (removed
/// on drop), stdio to `/dev/null`, and no persistence unless
/// [`ServerBuilder::persistence`] is on.
///
/// # Process hygiene
/// * **Drop** resumes a paused server, sends `SIGKILL` and reaps it, then
///   removes the directory. It runs during a test's panic unwinding too and
///   never panics itself.
/// * **`PR_SET_PDEATHSIG`**: the child asks the kernel for `SIGKILL` when its
///   parent dies, so servers do not outlive a test process that is itself
///   `SIGKILL`ed (or killed by Ctrl-C, which skips destructors). Linux ties
///   this to the *thread* that spawned the server, not the process: start
///   (and [`restart`](RedisServer::restart)) servers from the test's own
///   thread, not from a short-lived helper thread, or the server is killed as
///   soon as that thread exits. For the same reason, do not park servers in a
///   `static` shared across tests: the first test's thread would own them.
/// * **Own process group** (`setpgid(0, 0)`): a Ctrl-C in the terminal signals
///   the whole foreground process group. Without this, `redis-server` would
///   get `SIGINT` and run its own graceful shutdown (possibly writing files and
///   logging) concurrently with the test's teardown. In its own group it is
///   untouched, and the dying test process takes it down deterministically
///   via `PDEATHSIG`.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    pid: u32,
    port: u16,
    /// The TLS port, with [`ServerBuilder::tls_with`].
    tls_port: Option<u16>,
    /// testkit's own TLS client, for a server with a TLS port only.
    tls_client: Option<Arc<rustls::ClientConfig>>,
    paused: bool,
    binary: PathBuf,
    config: Config,
    // Declared last: the Drop impl kills the child before the dir goes away.
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server with default settings; see [`ServerBuilder::start`].
    pub fn start() -> RedisServer {
        Self::builder().start()
    }

    /// A builder for a server with extra arguments or persistence.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// Starts `n` independent default servers (different ports and
    /// directories). They boot concurrently but are all spawned from the
    /// calling thread (see `PDEATHSIG` in the type docs).
    pub fn start_many(n: usize) -> Vec<RedisServer> {
        start_all((0..n).map(|_| Self::builder()).collect())
    }

    /// The TCP port the server listens on (stable across [`restart`](Self::restart)).
    /// For a server with a TLS port only (the nodes of a
    /// [TLS cluster](crate::ClusterBuilder::tls)), that port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `"redis://127.0.0.1:PORT"`; for a server with a TLS port only,
    /// `"rediss://127.0.0.1:PORT"` (the certificate names the address too).
    pub fn url(&self) -> String {
        let scheme = if self.tls_client.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The TLS port of a server started with [`ServerBuilder::tls`] or
    /// [`tls_with`](ServerBuilder::tls_with) (a free port other than
    /// [`port`](Self::port), stable across [`restart`](Self::restart)),
    /// `None` without TLS.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// `"rediss://localhost:TLS_PORT"`, `None` without TLS. The host is
    /// `localhost` (which `/etc/hosts` maps to 127.0.0.1) rather than the
    /// address, as clients check the name in the certificate and the good
    /// one ([`TlsFiles::server_cert`]) names `localhost` (and
    /// `IP:127.0.0.1`, for clients that check addresses).
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port.map(|p| format!("rediss://localhost:{p}"))
    }

    /// The build the server runs ([`ServerBuilder::server`]).
    pub fn build(&self) -> &ServerBuild {
        &self.config.build
    }

    /// The server's name and version as it reports them in `INFO server`:
    /// `"Redis 6.2.14"`, `"Redis 7.0.15"`, `"Valkey 9.1.2"` (Valkey's own version
    /// from `valkey_version`, not the Redis version it claims compatibility with).
    ///
    /// # Panics
    /// As [`info_field`](Self::info_field), and if `INFO server` has no version.
    pub fn version(&self) -> String {
        let info = self.info("server");
        version_from_info(&info).unwrap_or_else(|| {
            panic!(
                "testkit: INFO server on port {} names no version:\n{info}",
                self.port
            )
        })
    }

    /// Process id of the current (or, after [`kill`](Self::kill), the last)
    /// server process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's temporary data directory (holds `redis.log` and any
    /// AOF files). Removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Path of the server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// Path of the config file given with [`ServerBuilder::config_file`]
    /// (as the server may have rewritten it), `None` without one.
    pub fn config_path(&self) -> Option<PathBuf> {
        self.config
            .config_file
            .as_ref()
            .map(|_| self.dir.path().join(CONFIG_FILE))
    }

    /// Whether the server is paused by [`pause`](Self::pause) (and not
    /// resumed, killed or restarted since).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Freezes the server with `SIGSTOP` and waits until the kernel reports
    /// it stopped. Clients can still connect (the kernel completes the
    /// handshake) but get no replies until [`resume`](Self::resume).
    /// Idempotent.
    ///
    /// # Panics
    /// If the server is not running.
    pub fn pause(&mut self) {
        if self.paused {
            return;
        }
        if !self.signal(libc::SIGSTOP) {
            panic!(
                "testkit: pause: redis-server on port {} is not running",
                self.port
            );
        }
        self.paused = true;
        self.wait_stopped_state(true);
    }

    /// Undoes [`pause`](Self::pause) with `SIGCONT`. Idempotent; a no-op on a
    /// server that is not paused (including a killed one).
    pub fn resume(&mut self) {
        if !self.paused {
            return;
        }
        self.paused = false;
        if self.signal(libc::SIGCONT) {
            self.wait_stopped_state(false);
        }
    }

    /// `SIGKILL`s the server (paused or not) and reaps it. No data is flushed.
    /// A no-op if it is not running.
    pub fn kill(&mut self) {
        self.stop_quietly();
    }

    /// Starts the server again on the **same port and directory** (killing
    /// it first if it is running) and waits until it answers. Data survives
    /// only with [`ServerBuilder::persistence`] on. Retries the bind for a
    /// few seconds in case the old socket lingers.
    ///
    /// Call it from the thread that should own the server (see the type docs
    /// on `PDEATHSIG`).
    ///
    /// # Panics
    /// If the server does not come back up.
    pub fn restart(&mut self) {
        self.kill();
        let bind_deadline = Instant::now() + RESTART_BIND_WINDOW;
        let mut failures = Vec::new();
        loop {
            let mut child = spawn(
                &self.binary,
                &self.config,
                self.port,
                self.tls_port,
                self.dir.path(),
            );
            let ready_deadline = Instant::now() + READY_TIMEOUT;
            match wait_ready(
                &mut child,
                self.port,
                self.tls_port,
                self.tls_client.as_ref(),
                self.config.password(),
                ready_deadline,
            ) {
                Ok(()) => {
                    self.pid = child.id();
                    self.child = Some(child);
                    return;
                }
                Err(StartError::Exited(status)) if Instant::now() < bind_deadline => {
                    failures.push(format!("exited early ({status})"));
                    thread::sleep(Duration::from_millis(50));
                }
                Err(err) => {
                    kill_and_reap(&mut child);
                    failures.push(err.to_string());
                    panic!(
                        "testkit: redis-server did not restart on port {}: {}\n{}",
                        self.port,
                        failures.join("; "),
                        log_tail(self.dir.path())
                    );
                }
            }
        }
    }

    /// [`restart`](Self::restart) with `args` after the server's own for this start
    /// only (a later `restart` starts it as configured).
    pub(crate) fn restart_with_args(&mut self, args: &[&str]) {
        let configured = self.config.extra_args.clone();
        self.config
            .extra_args
            .extend(args.iter().map(|a| (*a).to_owned()));
        self.restart();
        self.config.extra_args = configured;
    }

    /// Whether the server process is alive (a paused server counts as
    /// running). Reaps it if it exited on its own.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.paused = false;
                false
            }
            None => false,
        }
    }

    /// Runs one command on a fresh connection (RESP2, 5 s timeouts) and
    /// returns the reply; Redis errors come back as [`Reply::Error`].
    ///
    /// The connection is plain TCP to the plain port; to a server with a TLS
    /// port only (the nodes of a [TLS cluster](crate::ClusterBuilder::tls))
    /// it is TLS, trusting the server's CA and presenting the client
    /// certificate the server was given.
    ///
    /// # Panics
    /// On connection or protocol failure, including a timeout (e.g. because
    /// the server is paused); the message names the command and the port.
    pub fn cmd(&self, args: &[&str]) -> Reply {
        self.try_cmd(args, CMD_TIMEOUT)
            .unwrap_or_else(|e| self.cmd_panic(args, e))
    }

    /// Like [`cmd`](Self::cmd), but first sends `AUTH password` on the same
    /// connection. If `AUTH` fails, its error reply is returned instead.
    ///
    /// # Panics
    /// As [`cmd`](Self::cmd).
    pub fn cmd_as(&self, password: &str, args: &[&str]) -> Reply {
        let mut replies = self
            .exchange(&[&["AUTH", password], args], CMD_TIMEOUT)
            .unwrap_or_else(|e| self.cmd_panic(args, e));
        let reply = replies.pop().expect("two replies");
        let auth = replies.pop().expect("two replies");
        if auth.is_error() { auth } else { reply }
    }

    /// Whether `key` exists (`EXISTS key`).
    ///
    /// # Panics
    /// As [`cmd`](Self::cmd), and if the reply is not `0` or `1` (for
    /// example `NOAUTH` on a server with a password).
    pub fn exists(&self, key: &str) -> bool {
        match self.cmd(&["EXISTS", key]) {
            Reply::Int(0) => false,
            Reply::Int(1) => true,
            other => self.reply_panic(&["EXISTS", key], &other),
        }
    }

    /// The raw `PTTL key` reply: the remaining time to live in milliseconds,
    /// `-2` if the key does not exist, `-1` if it exists without an expiry.
    ///
    /// # Panics
    /// As [`cmd`](Self::cmd), and if the reply is not an integer.
    pub fn pttl(&self, key: &str) -> i64 {
        match self.cmd(&["PTTL", key]) {
            Reply::Int(ms) => ms,
            other => self.reply_panic(&["PTTL", key], &other),
        }
    }

    /// The string value of `key` (`GET key`); `None` if the key does not
    /// exist.
    ///
    /// # Panics
    /// As [`cmd`](Self::cmd), on an error reply (e.g. `WRONGTYPE` for a key
    /// that holds no string), and on a value that is not UTF-8 (read those
    /// with `cmd(&["GET", key])` and [`Reply::as_bytes`]).
    pub fn get(&self, key: &str) -> Option<String> {
        match self.cmd(&["GET", key]) {
            Reply::Bulk(None) => None,
            Reply::Bulk(Some(value)) => match String::from_utf8(value) {
                Ok(value) => Some(value),
                Err(e) => self.reply_panic(&["GET", key], &Reply::Bulk(Some(e.into_bytes()))),
            },
            other => self.reply_panic(&["GET", key], &other),
        }
    }

    /// The server's clock from `TIME`: the time since the Unix epoch, with
    /// microsecond precision. It is the clock of the server's expiries and of
    /// its `MONITOR` lines (see [`monitor`](crate::monitor)); on this machine it
    /// is the local wall clock.
    ///
    /// # Panics
    /// As [`cmd`](Self::cmd), and if the reply is not two non-negative
    /// integers (seconds, microseconds).
    pub fn server_time(&self) -> Duration {
        let reply = self.cmd(&["TIME"]);
        let parts = reply.as_array().map(|p| {
            p.iter()
                .map(|r| r.as_int().and_then(|n| u64::try_from(n).ok()))
                .collect::<Vec<_>>()
        });
        match parts.as_deref() {
            Some(&[Some(secs), Some(micros)]) if micros < 1_000_000 => {
                Duration::from_secs(secs) + Duration::from_micros(micros)
            }
            _ => self.reply_panic(&["TIME"], &reply),
        }
    }

    /// One field of `INFO <section>`, e.g. `info_field("stats",
    /// "expired_keys")` or `info_field("clients", "connected_clients")`: the
    /// text after `field:` on its line, `None` if the section has no such
    /// field (or there is no such section: the server then answers with an
    /// empty text).
    ///
    /// For state that no event announces (a server-side count, a client's
    /// statistics), poll it with [`eventually`](crate::eventually).
    ///
    /// # Panics
    /// As [`cmd`](Self::cmd), and if the reply is not the text of an `INFO`
    /// section (an error reply such as `NOAUTH`): an unreadable reply must
    /// not pass for a missing field.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        info_value(&self.info(section), field).map(str::to_owned)
    }

    /// The number of clients connected to the server, from `INFO clients`
    /// (`connected_clients`). It counts the connection this call opens
    /// itself, so an otherwise idle server reports 1; a connection closed just
    /// before (an earlier [`cmd`](Self::cmd)) may still be counted for a
    /// moment, until the server has seen it close.
    ///
    /// For state that no event announces (a server-side count, a client's
    /// statistics), poll it with [`eventually`](crate::eventually).
    ///
    /// # Panics
    /// As [`info_field`](Self::info_field), and if the field is missing or
    /// not a number.
    pub fn connected_clients(&self) -> usize {
        let value = self.info_field("clients", "connected_clients");
        value
            .as_deref()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "testkit: INFO clients on port {}: connected_clients is {value:?}",
                    self.port
                )
            })
    }

    /// Script calls (`EVALSHA` and `EVAL`) the server has run since it started
    /// or since `CONFIG RESETSTAT`, from `INFO commandstats` (`calls`; whether
    /// a rejected call such as `NOSCRIPT` counts depends on the server version,
    /// so tests that count exactly load their scripts first).
    ///
    /// # Panics
    /// As [`cmd`](Self::cmd), and if the reply cannot be read as command stats.
    pub fn script_calls(&self) -> u64 {
        // One INFO reply for both counts (a consistent snapshot), read as
        // `info_field` reads it; an unreadable reply panics in `info`
        // rather than passing for "no calls".
        let info = self.info("commandstats");
        ["cmdstat_evalsha", "cmdstat_eval"]
            .into_iter()
            .filter_map(|field| info_value(&info, field)?.strip_prefix("calls="))
            .map(|rest| {
                let calls = rest.split(',').next().unwrap_or(rest);
                calls
                    .parse::<u64>()
                    .unwrap_or_else(|e| panic!("INFO commandstats calls={calls:?}: {e}"))
            })
            .sum()
    }

    /// Bytes that clients have sent to the server and it has not read yet,
    /// summed over its connections (including any it has not accepted yet),
    /// as the kernel counts them: `rx_queue` in `/proc/net/tcp{,6}`, for the
    /// connections whose local port is the server's.
    ///
    /// A running server reads what arrives at once, so this is mostly 0. On a
    /// [paused](Self::pause) server it is how a test sees that a request has
    /// reached the server and waits there unanswered, without a sleep:
    ///
    /// ```
    /// use std::io::Write;
    /// use std::time::Duration;
    ///
    /// let mut server = testkit::RedisServer::start();
    /// let mut client = std::net::TcpStream::connect(server.addr()).unwrap();
    /// server.pause();
    /// client.write_all(b"PING\r\n").unwrap();
    /// testkit::eventually("the PING reached the server", Duration::from_secs(5), || {
    ///     server.unread_request_bytes() == 6
    /// });
    /// server.resume();
    /// ```
    ///
    /// Works while the server is paused (it asks the kernel, not the server).
    ///
    /// # Panics
    /// If `/proc/net/tcp` cannot be read.
    pub fn unread_request_bytes(&self) -> usize {
        self.sum_over_tcp_tables("unread_request_bytes", |table| {
            unread_bytes_in(table, self.port)
        })
    }

    /// Bytes that clients have written toward the server and it has not read
    /// yet, wherever they wait: [`unread_request_bytes`](Self::unread_request_bytes)
    /// plus what is still in the clients' own send queues to it (`tx_queue`
    /// of the connections whose remote port is the server's, on this host).
    ///
    /// A paused server's receive queues fill up (the kernel stops taking
    /// more than the socket's buffer holds), and what a client writes after
    /// that waits in the client's send queue instead, passing into the
    /// server's queue bit by bit as the kernel packs it: to count every
    /// request written to a paused server, count both.
    ///
    /// # Panics
    /// If `/proc/net/tcp` cannot be read.
    pub fn pending_request_bytes(&self) -> usize {
        self.sum_over_tcp_tables("pending_request_bytes", |table| {
            unread_bytes_in(table, self.port) + unsent_bytes_in(table, self.port)
        })
    }

    /// `count` of `/proc/net/tcp` plus `count` of `/proc/net/tcp6` (each read once);
    /// panics, naming `caller`, if neither can be read.
    fn sum_over_tcp_tables(&self, caller: &str, count: impl Fn(&str) -> usize) -> usize {
        let mut readable = false;
        let mut sum = 0;
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            if let Ok(text) = fs::read_to_string(table) {
                readable = true;
                sum += count(&text);
            }
        }
        assert!(readable, "testkit: {caller}: cannot read /proc/net/tcp");
        sum
    }

    /// Non-panicking [`cmd`](Self::cmd) with a caller-chosen timeout for
    /// connect, write and read (e.g. to assert that a paused or killed server
    /// does *not* answer).
    ///
    /// # Errors
    /// Connection, I/O, timeout (`WouldBlock`/`TimedOut`) or protocol errors.
    pub fn try_cmd(&self, args: &[&str], timeout: Duration) -> io::Result<Reply> {
        let mut replies = self.exchange(&[args], timeout)?;
        Ok(replies.pop().expect("one reply"))
    }

    /// Non-panicking [`cmd_as`](Self::cmd_as): `AUTH password`, then
    /// `args`, on one fresh connection with `timeout` for connect, write and
    /// read. If `AUTH` fails, its error reply is returned instead.
    ///
    /// # Errors
    /// As [`try_cmd`](Self::try_cmd).
    pub fn try_cmd_as(
        &self,
        password: &str,
        args: &[&str],
        timeout: Duration,
    ) -> io::Result<Reply> {
        let mut replies = self.exchange(&[&["AUTH", password], args], timeout)?;
        let reply = replies.pop().expect("two replies");
        let auth = replies.pop().expect("two replies");
        Ok(if auth.is_error() { auth } else { reply })
    }

    fn exchange(&self, cmds: &[&[&str]], timeout: Duration) -> io::Result<Vec<Reply>> {
        assert!(
            cmds.iter().all(|c| !c.is_empty()),
            "testkit: cmd needs at least one argument"
        );
        exchange(self.port, self.tls_client.as_ref(), cmds, timeout)
    }

    fn cmd_panic(&self, args: &[&str], e: io::Error) -> ! {
        let why = match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                "timed out after {CMD_TIMEOUT:?}{}",
                if self.paused {
                    " (the server is paused)"
                } else {
                    ""
                }
            ),
            _ => e.to_string(),
        };
        panic!(
            "testkit: command `{}` to redis-server on 127.0.0.1:{} failed: {why}",
            args.join(" "),
            self.port
        )
    }

    /// The text of `INFO section`.
    ///
    /// # Panics
    /// As [`cmd`](Self::cmd), and if the reply is not text.
    fn info(&self, section: &str) -> String {
        let info = self.cmd(&["INFO", section]);
        // `as_str` is `None` for error replies too.
        match info.as_str() {
            Some(text) => text.to_owned(),
            None => panic!("INFO {section} on port {}: {info:?}", self.port),
        }
    }

    /// Panics because `args` got a reply of an unexpected kind.
    fn reply_panic(&self, args: &[&str], reply: &Reply) -> ! {
        panic!(
            "testkit: command `{}` to redis-server on 127.0.0.1:{} answered {reply}",
            args.join(" "),
            self.port
        )
    }

    /// Sends `sig` to the live child; `false` if there is none. Checking
    /// `try_wait` first guarantees the pid has not been reaped (and so cannot
    /// have been recycled) when we signal it.
    fn signal(&mut self, sig: libc::c_int) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        // SAFETY: plain syscall on our own unreaped child's pid.
        unsafe { libc::kill(child.id() as libc::pid_t, sig) == 0 }
    }

    /// Polls `/proc/PID/stat` until the process is (or is no longer) in the
    /// stopped state `T`, so `pause` returns only once the server is frozen.
    fn wait_stopped_state(&mut self, stopped: bool) {
        let deadline = Instant::now() + SIGNAL_SETTLE_TIMEOUT;
        loop {
            match process_state(self.pid) {
                Some(state) if (state == 'T') == stopped => return,
                None => return, // gone (or no /proc): nothing to wait for
                Some(_) => {}
            }
            if Instant::now() >= deadline {
                panic!(
                    "testkit: redis-server pid {} did not {} within {:?}",
                    self.pid,
                    if stopped { "stop" } else { "continue" },
                    SIGNAL_SETTLE_TIMEOUT
                );
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGCONT (if paused), SIGKILL, reap. Never panics.
    fn stop_quietly(&mut self) {
        if self.paused {
            self.signal(libc::SIGCONT);
            self.paused = false;
        }
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop_quietly();
        // `dir: TempDir` is removed after this, ignoring errors.
    }
}

/// One server being brought up: spawned, not yet known to be ready. Wraps a
/// `RedisServer` so its Drop cleans up if anything panics half-way (e.g. one
/// of several servers in `start_many` fails).
struct Launch {
    server: RedisServer,
    next_port: fn() -> u16,
}

impl Launch {
    fn begin(binary: PathBuf, config: Config, next_port: fn() -> u16) -> Launch {
        let dir = tempfile::Builder::new()
            .prefix("testkit-redis-")
            .tempdir()
            .unwrap_or_else(|e| panic!("testkit: cannot create a temporary directory: {e}"));
        if let Some(contents) = &config.config_file {
            let path = dir.path().join(CONFIG_FILE);
            fs::write(&path, contents)
                .unwrap_or_else(|e| panic!("testkit: cannot write {}: {e}", path.display()));
        }
        if let Some(tls) = &config.tls {
            copy_tls_files(tls, dir.path());
        }
        let tls_client = config
            .tls
            .as_ref()
            .filter(|tls| tls.only)
            .map(|tls| tls_client(tls, dir.path()));
        let port = next_port();
        let tls_port = tls_port_for(&config, port);
        let child = spawn(&binary, &config, port, tls_port, dir.path());
        Launch {
            server: RedisServer {
                pid: child.id(),
                child: Some(child),
                port,
                tls_port,
                tls_client,
                paused: false,
                binary,
                config,
                dir,
            },
            next_port,
        }
    }

    /// Waits for readiness, retrying on new ports if the server exits early.
    fn finish(mut self) -> RedisServer {
        let s = &mut self.server;
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            if attempt > 1 {
                s.port = (self.next_port)();
                s.tls_port = tls_port_for(&s.config, s.port);
                let child = spawn(&s.binary, &s.config, s.port, s.tls_port, s.dir.path());
                s.pid = child.id();
                s.child = Some(child);
            }
            let child = s.child.as_mut().expect("just spawned");
            let deadline = Instant::now() + READY_TIMEOUT;
            let ports = match s.tls_port {
                Some(tls) if tls == s.port => format!("TLS port {tls}"),
                Some(tls) => format!("port {} (TLS {tls})", s.port),
                None => format!("port {}", s.port),
            };
            match wait_ready(
                child,
                s.port,
                s.tls_port,
                s.tls_client.as_ref(),
                s.config.password(),
                deadline,
            ) {
                Ok(()) => return self.server,
                Err(err @ StartError::Exited(_)) => {
                    failures.push(format!("{ports}: {err}"));
                }
                Err(err @ StartError::TimedOut) => {
                    s.kill();
                    failures.push(format!("{ports}: {err}"));
                    break;
                }
            }
        }
        panic!(
            "testkit: redis-server ({}) did not start: {}\n{}",
            s.binary.display(),
            failures.join("; "),
            log_tail(s.dir.path())
        );
    }
}

#[derive(Debug)]
enum StartError {
    Exited(ExitStatus),
    TimedOut,
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Exited(status) => write!(f, "exited early ({status})"),
            StartError::TimedOut => write!(f, "no PONG within {READY_TIMEOUT:?}"),
        }
    }
}

/// Copies what [`TlsConfig`] names into the server's directory (see
/// [`TlsConfig::copies`]).
fn copy_tls_files(tls: &TlsConfig, dir: &Path) {
    let tls_dir = dir.join(TLS_DIR);
    fs::create_dir_all(&tls_dir)
        .unwrap_or_else(|e| panic!("testkit: cannot create {}: {e}", tls_dir.display()));
    let client = tls.client.iter().flat_map(|(cert, key)| [cert, key]);
    for (from, to) in [&tls.cert, &tls.key, &tls.ca]
        .into_iter()
        .zip(TlsConfig::copies(dir))
        .chain(client.zip(TlsConfig::client_copies(dir)))
    {
        fs::copy(from, &to).unwrap_or_else(|e| {
            panic!(
                "testkit: cannot copy TLS file {} to {}: {e}",
                from.display(),
                to.display()
            )
        });
    }
}

/// The TLS port of a server on `port`, if it has one: `port` itself for a
/// server with a TLS port only, else another free one.
fn tls_port_for(config: &Config, port: u16) -> Option<u16> {
    let tls = config.tls.as_ref()?;
    Some(if tls.only { port } else { free_tls_port(port) })
}

/// A free port for TLS, other than the plain `port` and its cluster bus
/// port.
fn free_tls_port(port: u16) -> u16 {
    loop {
        let tls = free_port();
        if tls != port && Some(tls) != port.checked_add(CLUSTER_BUS_OFFSET) {
            return tls;
        }
    }
}

/// `--tls-port ... --tls-auth-clients ...` for a TLS port on `tls_port`,
/// serving the copies in `dir`.
fn tls_args(tls: &TlsConfig, tls_port: u16, dir: &Path) -> Vec<OsString> {
    let [cert, key, ca] = TlsConfig::copies(dir);
    let mut args: Vec<OsString> = vec!["--tls-port".into(), tls_port.to_string().into()];
    for (flag, path) in [
        ("--tls-cert-file", cert),
        ("--tls-key-file", key),
        ("--tls-ca-cert-file", ca),
    ] {
        args.push(flag.into());
        args.push(path.into());
    }
    args.push("--tls-auth-clients".into());
    args.push(tls.clients.as_arg().into());
    if tls.client.is_some() {
        let [cert, key] = TlsConfig::client_copies(dir);
        for (flag, path) in [
            ("--tls-client-cert-file", cert),
            ("--tls-client-key-file", key),
        ] {
            args.push(flag.into());
            args.push(path.into());
        }
    }
    args
}

fn spawn(binary: &Path, config: &Config, port: u16, tls_port: Option<u16>, dir: &Path) -> Child {
    let mut cmd = Command::new(binary);
    if config.config_file.is_some() {
        cmd.arg(dir.join(CONFIG_FILE));
    }
    // A server with a TLS port only has no plain one.
    let plain_port = match &config.tls {
        Some(tls) if tls.only => 0,
        _ => port,
    };
    cmd.arg("--port")
        .arg(plain_port.to_string())
        .args(["--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(LOG_FILE))
        .args(["--daemonize", "no", "--protected-mode", "no", "--save", ""]);
    if config.persistence {
        cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
    } else {
        cmd.args(["--appendonly", "no"]);
    }
    if let (Some(tls), Some(tls_port)) = (&config.tls, tls_port) {
        cmd.args(tls_args(tls, tls_port, dir));
    }
    // stderr goes to a file rather than /dev/null: redis reports bad
    // arguments there (before it opens its log file), and the start-up panic
    // message includes it.
    let stderr = fs::File::create(dir.join(STDERR_FILE))
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null());
    if let Some(clock) = &config.clock {
        cmd.envs(clock.env());
    }
    cmd.args(&config.extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .process_group(0);
    die_with_parent(&mut cmd);
    cmd.spawn().unwrap_or_else(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            panic!("{NOT_FOUND} (tried {})", binary.display());
        }
        panic!("testkit: cannot spawn {}: {e}", binary.display())
    })
}

/// Makes the child that `cmd` spawns ask the kernel for `SIGKILL` when the
/// spawning thread dies (`PR_SET_PDEATHSIG`, see [`RedisServer`]); the spawn
/// fails if the parent is already gone.
pub(crate) fn die_with_parent(cmd: &mut Command) {
    die_with_parent_by(cmd, libc::SIGKILL);
}

/// [`die_with_parent`] with `signal` instead of `SIGKILL` (PostgreSQL's
/// postmaster gets `SIGQUIT`, its immediate shutdown, which ends its
/// backends too). The hook runs after a [`CommandExt::uid`] switch (which
/// would clear the setting), so it holds for a child that runs as another
/// user.
pub(crate) fn die_with_parent_by(cmd: &mut Command, signal: libc::c_int) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec; it only makes
    // async-signal-safe syscalls (prctl, getppid) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Polls until the child answers `PING` on `port` *and* owns the listening
/// socket (so a different server that grabbed the same port is not mistaken
/// for ours) and the one on `tls_port` if any, the child exits, or the
/// deadline passes.
fn wait_ready(
    child: &mut Child,
    port: u16,
    tls_port: Option<u16>,
    tls_client: Option<&Arc<rustls::ClientConfig>>,
    password: Option<&str>,
    deadline: Instant,
) -> Result<(), StartError> {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(StartError::Exited(status));
        }
        if probe(port, tls_client, password)
            && owns_listener(child.id(), port)
            && tls_port.is_none_or(|tls| owns_listener(child.id(), tls))
        {
            // Re-check: if it lost a bind race it may have just exited.
            if let Ok(Some(status)) = child.try_wait() {
                return Err(StartError::Exited(status));
            }
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(StartError::TimedOut);
        }
        thread::sleep(POLL);
    }
}

/// `PING` (after `AUTH` if the password is known): `+PONG` means up; so does
/// `-NOAUTH` when the password is unknown. `-LOADING` and anything else: not yet.
fn probe(port: u16, tls: Option<&Arc<rustls::ClientConfig>>, password: Option<&str>) -> bool {
    let result = match password {
        Some(pw) => exchange(port, tls, &[&["AUTH", pw], &["PING"]], PROBE_TIMEOUT),
        None => exchange(port, tls, &[&["PING"]], PROBE_TIMEOUT),
    };
    match result.ok().and_then(|mut r| r.pop()) {
        Some(Reply::Status(s)) => s == "PONG",
        Some(Reply::Error(e)) => e.starts_with("NOAUTH"),
        _ => false,
    }
}

/// Sends all commands pipelined on one fresh connection (TLS with `tls`),
/// reads one reply each.
fn exchange(
    port: u16,
    tls: Option<&Arc<rustls::ClientConfig>>,
    cmds: &[&[&str]],
    timeout: Duration,
) -> io::Result<Vec<Reply>> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let mut out = Vec::new();
    for args in cmds {
        encode_command(&mut out, args);
    }
    let Some(tls) = tls else {
        let replies = talk(&stream, &out, cmds.len())?;
        let _ = stream.shutdown(Shutdown::Both);
        return Ok(replies);
    };
    // The certificates name 127.0.0.1 as well as localhost.
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let conn = rustls::ClientConnection::new(tls.clone(), name).map_err(io::Error::other)?;
    let mut tls_stream = rustls::StreamOwned::new(conn, stream);
    let replies = talk(&mut tls_stream, &out, cmds.len())?;
    tls_stream.conn.send_close_notify();
    let _ = tls_stream.flush();
    let _ = tls_stream.sock.shutdown(Shutdown::Both);
    Ok(replies)
}

/// Writes `out` (encoded commands) to `stream` and reads `replies` replies.
fn talk(mut stream: impl Read + Write, out: &[u8], replies: usize) -> io::Result<Vec<Reply>> {
    stream.write_all(out)?;
    stream.flush()?;
    let mut reader = BufReader::new(stream);
    (0..replies).map(|_| read_reply(&mut reader)).collect()
}

/// testkit's own TLS client for a server with a TLS port only: trusts the
/// server's CA, presents the client certificate if the server was given one
/// (the copies in its directory `dir`). ring as the crypto provider, named
/// rather than taken from the process's default (the tests may install
/// another or none).
///
/// # Panics
/// If a file cannot be read or does not hold what it should.
fn tls_client(tls: &TlsConfig, dir: &Path) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let [_, _, ca] = TlsConfig::copies(dir);
    let certs = |path: &Path| -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect)
            .unwrap_or_else(|e| panic!("testkit: cannot read {}: {e}", path.display()))
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs(&ca) {
        roots
            .add(cert)
            .unwrap_or_else(|e| panic!("testkit: bad CA certificate {}: {e}", ca.display()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("testkit: TLS client: {e}"))
        .with_root_certificates(roots);
    let config = match &tls.client {
        None => builder.with_no_client_auth(),
        Some(_) => {
            let [cert, key] = TlsConfig::client_copies(dir);
            let key_der = PrivateKeyDer::from_pem_file(&key)
                .unwrap_or_else(|e| panic!("testkit: cannot read {}: {e}", key.display()));
            builder
                .with_client_auth_cert(certs(&cert), key_der)
                .unwrap_or_else(|e| panic!("testkit: TLS client certificate: {e}"))
        }
    };
    Arc::new(config)
}

/// Whether process `pid` holds a TCP socket listening on `port`, judged from
/// `/proc/net/tcp{,6}` and `/proc/PID/fd`. If `/proc` cannot be read, assumes
/// yes (falls back to trusting the `PING`).
pub(crate) fn owns_listener(pid: u32, port: u16) -> bool {
    let mut inodes = Vec::new();
    let mut readable = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if *state == "0A" && local_port == Some(port) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if !readable {
        return true;
    }
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return true;
    };
    fds.flatten().any(|fd| {
        fs::read_link(fd.path())
            .ok()
            .and_then(|target| target.to_str().map(|t| inodes.iter().any(|i| i == t)))
            .unwrap_or(false)
    })
}

/// The bytes received and not yet read (`rx_queue`) on the sockets of one
/// `/proc/net/tcp` table whose local port is `port`, except the listening
/// socket (whose `rx_queue` is its accept backlog).
///
/// A FIN takes a sequence number too: a socket whose peer closed it
/// (`CLOSE_WAIT`, `LAST_ACK`, `CLOSING`) counts one more until the
/// application reads the end of stream. That one is not a byte of a request.
fn unread_bytes_in(table: &str, port: u16) -> usize {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state, queues) = (fields.get(1)?, fields.get(3)?, fields.get(4)?);
            let local_port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            if local_port != port || *state == "0A" {
                return None;
            }
            let (_tx, rx) = queues.split_once(':')?;
            let rx = usize::from_str_radix(rx, 16).ok()?;
            let fin_received = matches!(*state, "08" | "09" | "0B");
            Some(if fin_received {
                rx.saturating_sub(1)
            } else {
                rx
            })
        })
        .sum()
}

/// What the client ends of connections to `port` in one `/proc/net/tcp{,6}`
/// table have not yet had taken by the other end: their `tx_queue`.
fn unsent_bytes_in(table: &str, port: u16) -> usize {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (remote, queues) = (fields.get(2)?, fields.get(4)?);
            let remote_port = u16::from_str_radix(remote.rsplit(':').next()?, 16).ok()?;
            if remote_port != port {
                return None;
            }
            let (tx, _rx) = queues.split_once(':')?;
            usize::from_str_radix(tx, 16).ok()
        })
        .sum()
}

/// The state letter from `/proc/PID/stat` (`R`, `S`, `T`, `Z`, ...).
pub(crate) fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces.
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// `"Valkey 9.1.2"` or `"Redis 7.0.15"` from the text of `INFO server`.
fn version_from_info(info: &str) -> Option<String> {
    match info_value(info, "server_name").map(str::trim) {
        Some("valkey") => Some(format!(
            "Valkey {}",
            info_value(info, "valkey_version")?.trim()
        )),
        _ => Some(format!(
            "Redis {}",
            info_value(info, "redis_version")?.trim()
        )),
    }
}

/// The value of `field` in the text of an `INFO` reply: what follows
/// `field:` on its line (`# Section` headers and blank lines never match).
pub(crate) fn info_value<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The last lines of the server's log and stderr, for panic messages.
fn log_tail(dir: &Path) -> String {
    const LINES: usize = 30;
    let mut out = String::new();
    for name in [LOG_FILE, STDERR_FILE] {
        let path = dir.join(name);
        match fs::read_to_string(&path) {
            Ok(text) if text.trim().is_empty() => {}
            Ok(text) => {
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(LINES)..].join("\n");
                out.push_str(&format!("--- tail of {} ---\n{tail}\n", path.display()));
            }
            Err(e) => out.push_str(&format!("(no {}: {e})\n", path.display())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn the_version_is_valkeys_own_on_valkey() {
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        assert_eq!(version_from_info(valkey).as_deref(), Some("Valkey 9.1.2"));
        let redis = "# Server\r\nredis_version:6.2.14\r\nredis_git_sha1:0\r\n";
        assert_eq!(version_from_info(redis).as_deref(), Some("Redis 6.2.14"));
        assert_eq!(version_from_info("# Server\r\n"), None);
    }

    #[test]
    fn password_is_taken_from_requirepass_arg() {
        let c = RedisServer::builder().arg("--requirepass").arg("pw").config;
        assert_eq!(c.password(), Some("pw"));
        assert_eq!(Config::default().password(), None);
    }

    /// Ports handed out to `Launch::begin` by `scripted_port`.
    static SCRIPT: Mutex<Vec<u16>> = Mutex::new(Vec::new());

    fn scripted_port() -> u16 {
        SCRIPT.lock().unwrap().pop().unwrap_or_else(free_port)
    }

    #[test]
    fn start_retries_on_a_new_port_when_the_port_is_taken() {
        // A plain listener holds port A; then a real redis holds port B.
        // A server started on A, then B, must fail both and land elsewhere,
        // and must not mistake the redis on B for itself.
        let blocker = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let taken = blocker.local_addr().unwrap().port();
        let other = RedisServer::start();
        other.cmd(&["SET", "owner", "other"]);
        *SCRIPT.lock().unwrap() = vec![other.port(), taken];

        let server = Launch::begin(
            ServerBuild::Redis7.binary(),
            Config::default(),
            scripted_port,
        )
        .finish();
        assert_ne!(server.port(), taken);
        assert_ne!(server.port(), other.port());
        assert!(server.cmd(&["GET", "owner"]).is_nil());
        assert_eq!(other.cmd(&["GET", "owner"]).as_str(), Some("other"));
    }

    #[test]
    fn cluster_ports_avoid_the_ephemeral_range_for_the_bus_port_too() {
        // Linux's default ephemeral range: below it, bus port included.
        assert_eq!(cluster_port_range((32768, 60999)), (10000, 22767));
        // IANA's: below it still.
        assert_eq!(cluster_port_range((49152, 65535)), (10000, 39151));
        // A low range: above it.
        assert_eq!(cluster_port_range((1024, 20000)), (20001, 55535));
        // Everything ephemeral: anything with a bus port <= 65535.
        assert_eq!(cluster_port_range((1024, 65535)), (10000, 55535));
        for _ in 0..20 {
            let port = free_cluster_port();
            assert!((10000..=55535).contains(&port), "{port}");
        }
    }

    #[test]
    fn a_cluster_port_is_never_handed_out_twice() {
        // Not even once its server is gone (here: never started), so no
        // node of a new cluster answers at a killed node's address.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            let port = free_cluster_port();
            assert!(seen.insert(port), "{port} handed out twice");
        }
    }

    #[test]
    fn tls_args_name_the_copies_in_the_server_dir() {
        let tls = TlsConfig {
            cert: "/elsewhere/expired-server.crt".into(),
            key: "/elsewhere/expired-server.key".into(),
            ca: "/elsewhere/ca.crt".into(),
            clients: ClientAuth::Optional,
            client: None,
            only: false,
        };
        let args = tls_args(&tls, 7001, Path::new("/srv/d"));
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "--tls-port",
                "7001",
                "--tls-cert-file",
                "/srv/d/tls/server.crt",
                "--tls-key-file",
                "/srv/d/tls/server.key",
                "--tls-ca-cert-file",
                "/srv/d/tls/ca.crt",
                "--tls-auth-clients",
                "optional",
            ]
        );
    }

    #[test]
    fn a_client_certificate_is_what_the_server_presents_when_it_connects_out() {
        let tls = TlsConfig {
            cert: "/elsewhere/server.crt".into(),
            key: "/elsewhere/server.key".into(),
            ca: "/elsewhere/ca.crt".into(),
            clients: ClientAuth::No,
            client: Some((
                "/elsewhere/client.crt".into(),
                "/elsewhere/client.key".into(),
            )),
            only: true,
        };
        let args = tls_args(&tls, 7001, Path::new("/srv/d"));
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args[args.len() - 4..],
            [
                "--tls-client-cert-file",
                "/srv/d/tls/client.crt",
                "--tls-client-key-file",
                "/srv/d/tls/client.key",
            ]
        );
    }

    #[test]
    fn the_tls_port_is_neither_the_port_nor_its_bus_port() {
        for _ in 0..50 {
            let port = free_port();
            let tls = free_tls_port(port);
            assert_ne!(tls, port);
            assert_ne!(Some(tls), port.checked_add(CLUSTER_BUS_OFFSET));
        }
    }

    #[test]
    fn unread_bytes_are_summed_over_the_ports_connections_but_not_its_listener() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000002 00:00000000 00000000     0        0 11 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D431 01 00000000:0000001A 00:00000000 00000000     0        0 12 1 0 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:D432 01 00000000:00000006 00:00000000 00000000     0        0 13 1 0 20 4 30 10 -1
   3: 0100007F:D431 0100007F:1F90 01 00000009:00000007 00:00000000 00000000     0        0 14 1 0 20 4 30 10 -1
   4: 0100007F:1F91 0100007F:D433 01 00000000:00000100 00:00000000 00000000     0        0 15 1 0 20 4 30 10 -1
   5: 0100007F:1F90 0100007F:D434 08 00000000:00000001 00:00000000 00000000     0        0 16 1 0 20 4 30 10 -1
   6: 0100007F:1F90 0100007F:D435 08 00000000:00000008 00:00000000 00000000     0        0 17 1 0 20 4 30 10 -1
   7: 0100007F:1F90 0100007F:D436 08 00000000:00000000 00:00000000 00000000     0        0 18 1 0 20 4 30 10 -1
";
        // Port 0x1F90: its connections (0x1A + 6, and 7 before a FIN), not
        // its listener's backlog (2), nor the client end of a connection to
        // it (7), nor another port's connection, nor an unread FIN (one
        // sequence number, of a client that closed its connection, rows 5
        // and 6; row 7 read it).
        assert_eq!(unread_bytes_in(table, 0x1F90), 0x1A + 6 + 7);
        assert_eq!(unread_bytes_in(table, 0x1F91), 0x100);
        assert_eq!(unread_bytes_in(table, 1234), 0);
        assert_eq!(unread_bytes_in("", 0x1F90), 0);
        // The client end of a connection to 0x1F90 has 9 bytes not yet taken.
        assert_eq!(unsent_bytes_in(table, 0x1F90), 9);
        assert_eq!(unsent_bytes_in(table, 0x1F91), 0);
        assert_eq!(unsent_bytes_in("", 0x1F90), 0);
    }

    #[test]
    fn process_state_reports_running_process() {
        let state = process_state(std::process::id()).unwrap();
        assert!(matches!(state, 'R' | 'S'), "{state}");
    }
}
