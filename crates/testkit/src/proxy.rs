//! A TCP proxy that injects network faults between a client and one server.
//!
//! A [`FaultProxy`] listens on a free loopback port and forwards every
//! connection to one upstream address (normally a [`RedisServer`]). Its
//! [`Fault`] can be changed at any time with [`FaultProxy::set`]; the change
//! applies at once to the connections already open *and* to new ones:
//!
//! | [`Fault`]                | client → server          | server → client          |
//! |--------------------------|--------------------------|--------------------------|
//! | [`Pass`](Fault::Pass)    | forwarded                | forwarded                |
//! | [`Delay`](Fault::Delay)  | forwarded late, in order | forwarded late, in order |
//! | [`Blackhole`](Fault::Blackhole) | read and discarded | read and discarded      |
//! | [`DropReplies`](Fault::DropReplies) | forwarded     | read and discarded       |
//! | [`Reset`](Fault::Reset)  | connection reset (RST)   | connection reset (RST)   |
//! | [`Rewrite`](Fault::Rewrite) | forwarded             | forwarded, bytes replaced |
//!
//! # Partitions are compositions
//!
//! A proxy sits on one *link*. To give each client its own view of the
//! cluster, start one proxy per (client, node) pair and point each client at
//! its own proxies. "Client A sees nodes 1-2, client B sees nodes 3-5" is
//! then A's proxies to nodes 3-5 and B's proxies to nodes 1-2 in
//! [`Fault::Blackhole`]; healing the partition is setting them back to
//! [`Fault::Pass`].
//!
//! ```
//! use std::io::{Read, Write};
//! use std::net::TcpStream;
//! use std::time::Duration;
//! use testkit::RedisServer;
//! use testkit::proxy::{Fault, FaultProxy};
//!
//! /// `PING` through `addr`: did `+PONG` come back within 200 ms?
//! fn answers(addr: &str) -> bool {
//!     let mut s = TcpStream::connect(addr).unwrap();
//!     s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
//!     s.write_all(b"PING\r\n").unwrap();
//!     let mut reply = [0; 7];
//!     s.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
//! }
//!
//! let nodes = RedisServer::start_many(3);
//! // One proxy per (client, node) link; client A uses `a[i]` to reach node i.
//! let a: Vec<FaultProxy> = nodes.iter().map(|n| FaultProxy::start(&n.addr())).collect();
//! let b: Vec<FaultProxy> = nodes.iter().map(|n| FaultProxy::start(&n.addr())).collect();
//!
//! // Partition: A sees nodes 0-1, B sees node 2.
//! a[2].set(Fault::Blackhole);
//! b[0].set(Fault::Blackhole);
//! b[1].set(Fault::Blackhole);
//! let view = |links: &[FaultProxy]| links.iter().map(|p| answers(&p.addr())).collect::<Vec<_>>();
//! assert_eq!(view(&a), [true, true, false]);
//! assert_eq!(view(&b), [false, false, true]);
//!
//! // Heal.
//! for p in a.iter().chain(&b) {
//!     p.set(Fault::Pass);
//! }
//! assert_eq!(view(&b), [true, true, true]);
//! ```
//!
//! # Semantics worth knowing
//!
//! * Bytes are forwarded in the chunks they were read in; faults apply per
//!   chunk, decided when the chunk is read. Bytes the proxy had already read
//!   when [`FaultProxy::set`] was called may still be delivered under the old
//!   fault (they were "in flight").
//! * Bytes swallowed by [`Fault::Blackhole`] or [`Fault::DropReplies`]
//!   (including chunks still queued by a previous [`Fault::Delay`]) are
//!   **lost**, like packets in a real blackhole: switching back to
//!   [`Fault::Pass`] does not deliver them. A request/response protocol such
//!   as RESP is then usually out of step on that connection (a reply, or a
//!   request, is missing), so lock clients should time out and reconnect.
//! * End of stream (FIN) always travels client → server, so a client that
//!   closes also closes its upstream connection. Server → client, it is held
//!   back while replies are not forwarded (`Blackhole`, `DropReplies`) and
//!   delivered when they are again.
//! * If the upstream refuses the connection (e.g. the server was killed), a
//!   new client connection is reset, except under [`Fault::Blackhole`], where
//!   it is accepted and silently drained like any other blackholed
//!   connection (and reset once the fault changes).
//!
//! [`RedisServer`]: crate::RedisServer

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often blocked proxy threads wake up to notice fault changes and
/// shutdown (read/write/poll timeout).
const TICK: Duration = Duration::from_millis(20);
/// Timeout for connecting to the upstream.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long [`FaultProxy::set`]`(Fault::Reset)` waits for open connections
/// to be reset before returning anyway.
const RESET_WAIT: Duration = Duration::from_secs(1);
/// Read buffer size per direction.
const CHUNK: usize = 16 * 1024;
/// Stand-in for "never" when a delay is too large to add to an `Instant`.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What a [`FaultProxy`] does to the traffic of its connections.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Forward everything unchanged (the default).
    #[default]
    Pass,
    /// Forward each chunk, in both directions, `base + uniform(0..=jitter)`
    /// after it was read. Order is preserved per direction: a chunk is never
    /// delivered before the one read ahead of it, so a round trip takes at
    /// least `2 * base`. Chunks already queued keep their due time when the
    /// fault changes to another `Delay`; switching to [`Fault::Pass`] or
    /// [`Fault::DropReplies`] delivers them at once.
    Delay {
        /// Fixed part of the delay.
        base: Duration,
        /// Upper bound of the random extra delay added to each chunk.
        jitter: Duration,
    },
    /// Accept connections and read from both sides, but forward nothing in
    /// either direction: requests vanish and no replies come back. The
    /// swallowed bytes are lost for good.
    Blackhole,
    /// Forward client → server but discard server → client: commands run on
    /// the server, the client never hears back (the "unknown outcome" case).
    DropReplies,
    /// Abort every open connection (`SO_LINGER` 0, so both the client and
    /// the server get a TCP RST) and reset new connections right after
    /// accepting them.
    Reset,
    /// Forward everything, but replace every occurrence of `from` in the
    /// server's replies with `to`, of the same length (so that RESP's bulk
    /// lengths still hold): a server that says something else about itself,
    /// e.g. an older `redis_version` in `INFO`. Each chunk is rewritten as it
    /// was read: an occurrence split across two chunks is left as it is.
    ///
    /// # Panics
    /// [`FaultProxy::set`] panics if `from` is empty or the lengths differ.
    Rewrite {
        /// The bytes to replace.
        from: Vec<u8>,
        /// What replaces them: as long as `from`.
        to: Vec<u8>,
    },
}

impl Fault {
    /// Whether bytes travelling in `dir` reach the other side.
    fn forwards(&self, dir: Dir) -> bool {
        match self {
            Fault::Pass | Fault::Delay { .. } | Fault::Rewrite { .. } => true,
            Fault::DropReplies => dir == Dir::ClientToServer,
            Fault::Blackhole | Fault::Reset => false,
        }
    }
}

/// A TCP proxy on a free loopback port in front of one upstream address,
/// injecting the current [`Fault`] into every connection. See the
/// [module docs](self) for semantics and partitions.
///
/// Each client connection gets its own upstream connection and two threads
/// (one per direction); blocked threads wake every 20 ms to notice fault
/// changes. Dropping the proxy stops accepting, closes all connections
/// (clients see end of stream), frees the port and joins every thread; it
/// never panics.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy on `127.0.0.1:<free port>` forwarding to `upstream`
    /// (e.g. `"127.0.0.1:6390"`, see [`RedisServer::addr`]), in
    /// [`Fault::Pass`]. The upstream need not be up yet: it is connected to
    /// once per accepted client connection.
    ///
    /// # Panics
    /// If `upstream` does not resolve, or no loopback port can be bound.
    ///
    /// [`RedisServer::addr`]: crate::RedisServer::addr
    pub fn start(upstream: &str) -> FaultProxy {
        let upstream_addr = upstream
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .unwrap_or_else(|| panic!("testkit: FaultProxy: cannot resolve upstream {upstream:?}"));
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .unwrap_or_else(|e| panic!("testkit: FaultProxy: cannot bind 127.0.0.1:0: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("testkit: FaultProxy: no local address: {e}"));
        let shared = Arc::new(Shared {
            upstream: upstream_addr,
            state: Mutex::new(State {
                fault: Fault::Pass,
                open: 0,
            }),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            workers: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("faultproxy-{}", addr.port()))
                .spawn(move || accept_loop(&listener, &shared))
                .unwrap_or_else(|e| panic!("testkit: FaultProxy: cannot spawn a thread: {e}"))
        };
        FaultProxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `"127.0.0.1:PORT"`: where clients should connect.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// `"redis://127.0.0.1:PORT"`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The upstream address, as resolved by [`start`](Self::start).
    pub fn upstream(&self) -> String {
        self.shared.upstream.to_string()
    }

    /// Switches to `fault`, for open connections and new ones alike.
    ///
    /// Bytes read after this call are handled under `fault`. For
    /// [`Fault::Reset`] it also waits (up to 1 s) until every open connection
    /// has been reset, so a client's next read fails right away.
    pub fn set(&self, fault: Fault) {
        if let Fault::Rewrite { from, to } = &fault {
            assert!(
                !from.is_empty() && from.len() == to.len(),
                "testkit: Fault::Rewrite needs a non-empty `from` as long as `to`"
            );
        }
        let reset = fault == Fault::Reset;
        let mut state = self.shared.lock();
        state.fault = fault;
        self.shared.changed.notify_all();
        if reset {
            let deadline = Instant::now() + RESET_WAIT;
            while state.open > 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                state = self
                    .shared
                    .changed
                    .wait_timeout(state, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        self.shared.fault()
    }

    /// How many client connections are currently open through the proxy
    /// (accepted and not yet fully closed).
    pub fn connections(&self) -> usize {
        self.shared.lock().open
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("fault", &state.fault)
            .field("connections", &state.open)
            .finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        {
            let _state = self.shared.lock();
            self.shared.changed.notify_all();
        }
        // The acceptor exits within a TICK and drops the listener (freeing
        // the port); after it is joined no new workers can appear.
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let workers = std::mem::take(
            &mut *self
                .shared
                .workers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for worker in workers {
            let _ = worker.join();
        }
    }
}

/// State shared by the proxy handle and all its threads.
struct Shared {
    upstream: SocketAddr,
    state: Mutex<State>,
    /// Notified when the fault changes, a connection closes, or on shutdown.
    changed: Condvar,
    stopping: AtomicBool,
    /// One thread per client connection (each runs both directions).
    workers: Mutex<Vec<JoinHandle<()>>>,
}

struct State {
    fault: Fault,
    /// Open client connections.
    open: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fault(&self) -> Fault {
        self.lock().fault.clone()
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Sleeps until the fault changes, shutdown, or `timeout`.
    fn wait_change(&self, timeout: Duration) {
        let state = self.lock();
        if self.stopping() {
            return;
        }
        let _ = self.changed.wait_timeout(state, timeout);
    }
}

/// Counts one open client connection; decrements (and notifies) on drop.
struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.open = state.open.saturating_sub(1);
        self.0.changed.notify_all();
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stopping() {
        if !wait_readable(listener.as_raw_fd(), TICK) {
            continue;
        }
        match listener.accept() {
            Ok((client, _)) => admit(client, shared),
            Err(e) if is_transient(&e) => {}
            // E.g. out of file descriptors: back off instead of spinning.
            Err(_) => thread::sleep(TICK),
        }
    }
}

/// Takes over a freshly accepted client connection.
fn admit(client: TcpStream, shared: &Arc<Shared>) {
    if shared.stopping() {
        return; // dropped: closed
    }
    let guard = {
        let mut state = shared.lock();
        if state.fault == Fault::Reset {
            drop(state);
            abort_close(client);
            return;
        }
        state.open += 1;
        OpenGuard(Arc::clone(shared))
    };
    let worker_shared = Arc::clone(shared);
    let spawned = thread::Builder::new()
        .name(format!("faultproxy-conn-{}", shared.upstream.port()))
        .spawn(move || serve(client, &worker_shared, guard));
    // On spawn failure the closure is dropped: the client is closed and the
    // guard uncounts it.
    if let Ok(handle) = spawned {
        let mut workers = shared
            .workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        workers.retain(|w| !w.is_finished());
        workers.push(handle);
    }
}

/// Runs one client connection to completion: connects upstream, pumps both
/// directions, closes (abortively after a reset).
fn serve(client: TcpStream, shared: &Shared, guard: OpenGuard) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_nodelay(true);
    let _ = client.set_write_timeout(Some(TICK));
    let server = match TcpStream::connect_timeout(&shared.upstream, CONNECT_TIMEOUT) {
        Ok(server) => server,
        Err(_) => {
            drain_unreachable(client, shared);
            drop(guard);
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let _ = server.set_write_timeout(Some(TICK));
    let link = Link {
        client,
        server,
        aborted: AtomicBool::new(false),
        reset: AtomicBool::new(false),
        client_eof: AtomicBool::new(false),
    };
    thread::scope(|scope| {
        let replies = thread::Builder::new()
            .name(format!("faultproxy-s2c-{}", shared.upstream.port()))
            .spawn_scoped(scope, || pump(&link, shared, Dir::ServerToClient));
        if replies.is_err() {
            return;
        }
        pump(&link, shared, Dir::ClientToServer);
    });
    if link.reset.load(Ordering::SeqCst) {
        set_linger_zero(&link.client);
        set_linger_zero(&link.server);
    }
    drop(link); // closes both sockets ...
    drop(guard); // ... before the connection stops being counted
}

/// The upstream refused or timed out. Under `Blackhole` nobody could tell,
/// so drain the client like a blackholed connection until the fault changes;
/// otherwise reset it at once.
fn drain_unreachable(client: TcpStream, shared: &Shared) {
    let _ = client.set_read_timeout(Some(TICK));
    let mut reader = &client;
    let mut buf = vec![0; CHUNK];
    loop {
        if shared.stopping() {
            return; // normal close, like every connection on shutdown
        }
        if shared.fault() != Fault::Blackhole {
            break;
        }
        match reader.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if is_transient(&e) => {}
            Err(_) => return,
        }
    }
    abort_close(client);
}

/// Direction of a byte stream through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    ClientToServer,
    ServerToClient,
}

/// One proxied connection: the client socket, its upstream socket, and
/// flags the two pumps share.
struct Link {
    client: TcpStream,
    server: TcpStream,
    /// An I/O error on either side: both pumps stop, sockets close.
    aborted: AtomicBool,
    /// `Fault::Reset` seen: both pumps stop, sockets close with RST.
    reset: AtomicBool,
    /// The client sent FIN (and the client → server pump has finished).
    client_eof: AtomicBool,
}

impl Link {
    /// `(source, destination)` for a direction.
    fn ends(&self, dir: Dir) -> (&TcpStream, &TcpStream) {
        match dir {
            Dir::ClientToServer => (&self.client, &self.server),
            Dir::ServerToClient => (&self.server, &self.client),
        }
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
    }

    fn done(&self) -> bool {
        self.aborted.load(Ordering::SeqCst) || self.reset.load(Ordering::SeqCst)
    }
}

/// Moves bytes from one side of `link` to the other under the current fault
/// until end of stream, an error, a reset or shutdown.
fn pump(link: &Link, shared: &Shared, dir: Dir) {
    let (mut src, dst) = link.ends(dir);
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0; CHUNK];
    let mut rng = SplitMix64::new();
    let mut eof = false;
    loop {
        if shared.stopping() || link.done() {
            return;
        }
        let fault = shared.fault();
        if fault == Fault::Reset {
            link.reset.store(true, Ordering::SeqCst);
            return;
        }
        if fault.forwards(dir) {
            let delayed = matches!(fault, Fault::Delay { .. });
            while let Some((due, _)) = queue.front() {
                if delayed && *due > Instant::now() {
                    break;
                }
                let Some((_, chunk)) = queue.pop_front() else {
                    break;
                };
                if !write_all(link, shared, dst, &chunk, dir) {
                    break; // re-check faults and flags at the top
                }
            }
        } else {
            queue.clear(); // in flight into a blackhole: lost
        }

        if eof {
            // The client's FIN always goes through; the server's waits until
            // replies flow again, unless the client is gone too.
            let finish = match dir {
                Dir::ClientToServer => true,
                Dir::ServerToClient => {
                    fault.forwards(dir) || link.client_eof.load(Ordering::SeqCst)
                }
            };
            if queue.is_empty() && finish {
                let _ = dst.shutdown(Shutdown::Write);
                if dir == Dir::ClientToServer {
                    link.client_eof.store(true, Ordering::SeqCst);
                }
                return;
            }
            shared.wait_change(until_due(&queue));
            continue;
        }

        // A chunk waits in the queue: wait for the next one only until it is due (a
        // socket's read timeout would round up to the kernel's tick, several ms).
        if let Some(due_in) = until_head(&queue)
            && !wait_readable(src.as_raw_fd(), due_in)
        {
            continue;
        }
        let _ = src.set_read_timeout(Some(until_due(&queue)));
        match src.read(&mut buf) {
            Ok(0) => eof = true,
            Ok(n) => {
                // The fault at the time the chunk arrived decides its fate.
                let fault = shared.fault();
                if let Fault::Rewrite { from, to } = &fault
                    && dir == Dir::ServerToClient
                {
                    replace_all(&mut buf[..n], from, to);
                }
                match fault {
                    Fault::Reset => {
                        link.reset.store(true, Ordering::SeqCst);
                        return;
                    }
                    _ if !fault.forwards(dir) => {} // swallowed
                    Fault::Delay { base, jitter } => {
                        let delay = base.saturating_add(rng.up_to(jitter));
                        let now = Instant::now();
                        let due = now.checked_add(delay).unwrap_or_else(|| now + FAR_FUTURE);
                        queue.push_back((due, buf[..n].to_vec()));
                    }
                    _ if queue.is_empty() => {
                        write_all(link, shared, dst, &buf[..n], dir);
                    }
                    _ => queue.push_back((Instant::now(), buf[..n].to_vec())),
                }
            }
            Err(e) if is_transient(&e) => {}
            Err(_) => {
                link.abort();
                return;
            }
        }
    }
}

/// Replaces every occurrence of `from` in `chunk` with `to` (as long).
fn replace_all(chunk: &mut [u8], from: &[u8], to: &[u8]) {
    let mut at = 0;
    while at + from.len() <= chunk.len() {
        if &chunk[at..at + from.len()] == from {
            chunk[at..at + from.len()].copy_from_slice(to);
            at += from.len();
        } else {
            at += 1;
        }
    }
}

/// Time until the head of `queue` is due, clamped to `1 ms..=TICK`.
fn until_due(queue: &VecDeque<(Instant, Vec<u8>)>) -> Duration {
    queue
        .front()
        .map_or(TICK, |(due, _)| {
            due.saturating_duration_since(Instant::now()).min(TICK)
        })
        .max(Duration::from_millis(1))
}

/// Writes all of `data` to `dst`, waking every TICK to give up on shutdown,
/// abort, reset, or if `dir` stops being forwarded (the rest is then lost).
/// `false` if not everything was written; I/O errors abort the link.
fn write_all(link: &Link, shared: &Shared, mut dst: &TcpStream, data: &[u8], dir: Dir) -> bool {
    let mut written = 0;
    while written < data.len() {
        match dst.write(&data[written..]) {
            Ok(0) => {
                link.abort();
                return false;
            }
            Ok(n) => written += n,
            Err(e) if is_transient(&e) => {
                if shared.stopping() || link.done() || !shared.fault().forwards(dir) {
                    return false;
                }
            }
            Err(_) => {
                link.abort();
                return false;
            }
        }
    }
    true
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Closes `stream` with a TCP RST instead of a FIN.
fn abort_close(stream: TcpStream) {
    set_linger_zero(&stream);
    drop(stream);
}

/// `SO_LINGER {on, 0}`: closing the socket then sends RST and discards any
/// unsent data (std has no stable API for it).
fn set_linger_zero(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: the fd is open for the lifetime of `stream`; the pointer and
    // length describe `linger`, which outlives the call.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast::<libc::c_void>(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Waits up to `timeout` for `fd` to become readable (for a listener: a
/// connection to accept). `false` on timeout or error.
fn wait_readable(fd: RawFd, timeout: Duration) -> bool {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // ppoll, not poll: its timeout is exact to the microsecond (a delayed chunk may be
    // due in 250 us), where poll's rounds up to whole milliseconds.
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: one valid, exclusively borrowed pollfd and a valid timespec for the whole
    // call; no signal mask is changed (null).
    let ready = unsafe { libc::ppoll(&mut pollfd, 1, &ts, std::ptr::null()) };
    ready > 0
}

/// Time until the head of `queue` is due, exactly (at most [`TICK`]); `None` for an
/// empty queue.
fn until_head(queue: &VecDeque<(Instant, Vec<u8>)>) -> Option<Duration> {
    queue
        .front()
        .map(|(due, _)| due.saturating_duration_since(Instant::now()).min(TICK))
}

/// A tiny PRNG for delay jitter (std has none); seeded from `RandomState`.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new() -> Self {
        SplitMix64(RandomState::new().hash_one(0u8))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=max` (nanosecond resolution, saturating at ~584 years).
    fn up_to(&mut self, max: Duration) -> Duration {
        let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        if max == 0 {
            return Duration::ZERO;
        }
        let scaled = (u128::from(self.next()) * (u128::from(max) + 1)) >> 64;
        Duration::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_forward_the_right_directions() {
        use Dir::{ClientToServer as Up, ServerToClient as Down};
        let delay = Fault::Delay {
            base: Duration::from_millis(1),
            jitter: Duration::ZERO,
        };
        for (fault, up, down) in [
            (Fault::Pass, true, true),
            (delay, true, true),
            (Fault::Blackhole, false, false),
            (Fault::DropReplies, true, false),
            (Fault::Reset, false, false),
            (
                Fault::Rewrite {
                    from: b"a".to_vec(),
                    to: b"b".to_vec(),
                },
                true,
                true,
            ),
        ] {
            assert_eq!(fault.forwards(Up), up, "{fault:?}");
            assert_eq!(fault.forwards(Down), down, "{fault:?}");
        }
        assert_eq!(Fault::default(), Fault::Pass);
    }

    #[test]
    fn jitter_is_bounded_and_varies() {
        let mut rng = SplitMix64::new();
        assert_eq!(rng.up_to(Duration::ZERO), Duration::ZERO);
        let max = Duration::from_millis(10);
        let samples: Vec<Duration> = (0..1000).map(|_| rng.up_to(max)).collect();
        assert!(samples.iter().all(|d| *d <= max));
        assert!(samples.iter().any(|d| *d < max / 4));
        assert!(samples.iter().any(|d| *d > max * 3 / 4));
        assert!(rng.up_to(Duration::MAX) <= Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn rewrite_replaces_each_whole_occurrence() {
        let mut chunk = b"redis_version:7.0.15\r\nxx7.0.15".to_vec();
        replace_all(&mut chunk, b"7.0.15", b"6.0.15");
        assert_eq!(chunk, b"redis_version:6.0.15\r\nxx6.0.15");
        let mut overlapping = b"aaa".to_vec();
        replace_all(&mut overlapping, b"aa", b"bb");
        assert_eq!(overlapping, b"bba");
    }

    #[test]
    fn until_due_is_clamped() {
        let mut queue = VecDeque::new();
        assert_eq!(until_due(&queue), TICK);
        queue.push_back((Instant::now(), vec![]));
        assert_eq!(until_due(&queue), Duration::from_millis(1));
        queue[0].0 = Instant::now() + Duration::from_secs(60);
        assert_eq!(until_due(&queue), TICK);
    }
}
