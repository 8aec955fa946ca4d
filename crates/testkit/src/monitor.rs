//! The server's own account of what happened to the lock keys: a `MONITOR`
//! recorder and a replay that turns it into checker C5's input.
//!
//! [`checkers::foreign_touch`](crate::checkers::foreign_touch) (C5) needs,
//! for every release or extend that acted on a lock key, the owner token the
//! key held at that moment (`touched_owner`). The scripts under test could
//! report it themselves, but then a buggy script would also report wrongly.
//! Here the ground truth comes from the server instead: a [`Monitor`] records
//! every command the server executes, and [`touches`] replays the commands
//! on the lock keys to know which token each key held when a script deleted
//! it or changed its expiry.
//!
//! ```no_run
//! use std::time::Duration;
//! use testkit::{RedisServer, checkers, monitor::{self, Monitor}};
//!
//! let server = RedisServer::start();
//! let monitor = Monitor::start(&server.addr()).unwrap();
//! // ... run the workload against `server` ...
//! monitor.sync().unwrap(); // everything run so far is recorded
//! let entries = monitor.stop();
//! let t = monitor::touches(&entries, &["fencelock:{lab:x}"], Duration::from_millis(5));
//! println!("C5 judged {} touches, skipped {}", t.judged, t.skipped);
//! assert!(checkers::foreign_touch(&t.events).is_empty());
//! ```
//!
//! # What `MONITOR` shows (checked on redis-server 7.0)
//!
//! * One line per executed command, in execution order, as a RESP simple
//!   string: `1795325555.103104 [0 127.0.0.1:58326] "set" "k" "v"`: the
//!   server's wall clock (seconds and microseconds), the client's database,
//!   the source (`lua` for commands a script runs, `unix:PATH` for a unix
//!   socket client, else the client's address) and the arguments, quoted
//!   with C-like escapes. Clients' command names appear as the client sent
//!   them (usually lower case), scripts' as the script wrote them.
//! * A script call (`EVAL`, `EVALSHA`, `FCALL`, ...) is shown **before** the
//!   commands it runs; every other command **after** it ran (so `SELECT 3`
//!   already shows database 3).
//! * Commands that fail while executing are shown (`SET k v PX 0`,
//!   `WRONGTYPE` errors, a failing `redis.call`): a line does not mean the
//!   command took effect, so the replay treats arguments it cannot parse as
//!   "state unknown". Commands rejected before executing (unknown command,
//!   wrong number of arguments) are not shown.
//! * Administrative commands (`CONFIG`, `DEBUG`, `REPLICAOF`, ...) are never
//!   shown, nor are expirations and evictions: the replay computes expiry
//!   itself, and a test must not use the others on lock keys.
//!
//! # Cost
//!
//! The server formats every command for every monitor: expect throughput to
//! drop noticeably (Redis' documentation mentions up to half) while a
//! [`Monitor`] is attached, which widens race windows rather than hiding
//! them. Entries are kept in memory until [`Monitor::stop`].

use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::history::{Event, Op, Phase};
use crate::resp::{encode_command, read_reply};

/// Connect, write and handshake timeout of the monitor and `sync` connections.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the monitor thread wakes up from a silent connection to check
/// whether it was stopped.
const READ_POLL: Duration = Duration::from_millis(50);
/// Pause between reconnection attempts after the connection dropped.
const RECONNECT_INTERVAL: Duration = Duration::from_millis(10);
/// How long [`Monitor::sync`] waits in total.
const SYNC_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `sync` waits for one `ECHO` before sending another (the first
/// may have run while the monitor was reconnecting, and so go unrecorded).
const SYNC_ATTEMPT: Duration = Duration::from_millis(250);
/// Longest monitor line kept; longer ones (huge values) are counted as
/// malformed and skipped without losing the connection.
const MAX_LINE: usize = 64 * 1024 * 1024;
/// The only database whose keys the replay models.
const LOCK_DB: u32 = 0;

/// Where a monitored command came from, or the interruption marker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// Run by a script (`redis.call`/`redis.pcall`), shown as `lua`. It
    /// belongs to the nearest preceding script call (`EVAL`, `FCALL`, ...).
    Lua,
    /// A TCP client, by its address as the server prints it
    /// (`127.0.0.1:58326`, `[::1]:58326`).
    Client(String),
    /// A client on the server's unix socket, by the socket's path.
    Unix(String),
    /// Not a server line: the monitor connection dropped here (the server
    /// was killed or restarted), so commands may have run unseen and the
    /// keys' state is unknown from here on. `time_us` is the local wall
    /// clock when the drop was noticed; `db` is 0 and `args` empty.
    Interrupted,
}

/// One recorded monitor line (or an interruption marker, see
/// [`Source::Interrupted`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The server's wall clock when it printed the line, in microseconds
    /// since the Unix epoch.
    pub time_us: u64,
    /// The database the command ran in.
    pub db: u32,
    /// Who ran the command.
    pub source: Source,
    /// The command's arguments, name first, unescaped (bytes that are not
    /// UTF-8 become U+FFFD).
    pub args: Vec<String>,
}

impl Entry {
    /// `true` for the marker of a dropped monitor connection.
    pub fn is_interruption(&self) -> bool {
        self.source == Source::Interrupted
    }

    /// The command name in upper case (`""` for an interruption).
    pub fn command(&self) -> String {
        self.args
            .first()
            .map(|a| a.to_ascii_uppercase())
            .unwrap_or_default()
    }
}

/// Parses one monitor line, with or without the RESP `+` in front:
/// `1795325555.103214 [0 lua] "SET" "k" "tok\"en" "NX" "PX" "500"`.
///
/// `None` if the line does not have exactly that shape (timestamp with six
/// digits of microseconds, `[db source]`, at least one argument, every
/// argument quoted, only the escapes Redis writes: `\\ \" \n \r \t \a \b
/// \xHH`). Never panics.
pub fn parse_line(line: &str) -> Option<Entry> {
    let line = line.strip_prefix('+').unwrap_or(line);
    let (time, rest) = line.split_once(' ')?;
    let (secs, micros) = time.split_once('.')?;
    if micros.len() != 6 {
        return None;
    }
    let time_us = parse_digits(secs)?
        .checked_mul(1_000_000)?
        .checked_add(parse_digits(micros)?)?;
    let rest = rest.strip_prefix('[')?;
    let (db, rest) = rest.split_once(' ')?;
    let db = u32::try_from(parse_digits(db)?).ok()?;
    // The source may itself contain `]` (an IPv6 address); the arguments
    // start at the first `] "`.
    let end = rest.find("] \"")?;
    let source = match &rest[..end] {
        "" => return None,
        "lua" => Source::Lua,
        s => match s.strip_prefix("unix:") {
            Some(path) => Source::Unix(path.to_owned()),
            None => Source::Client(s.to_owned()),
        },
    };
    let args = parse_args(&rest[end + 2..])?;
    Some(Entry {
        time_us,
        db,
        source,
        args,
    })
}

/// A non-empty run of ASCII digits as a number (no sign, no spaces).
fn parse_digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `"a" "b\n"` → `["a", "b\n"]`: Redis' `sdscatrepr` quoting undone.
fn parse_args(s: &str) -> Option<Vec<String>> {
    let mut args = Vec::new();
    let mut bytes = s.bytes();
    loop {
        if bytes.next()? != b'"' {
            return None;
        }
        let mut arg = Vec::new();
        loop {
            match bytes.next()? {
                b'"' => break,
                b'\\' => arg.push(match bytes.next()? {
                    b'\\' => b'\\',
                    b'"' => b'"',
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'a' => 0x07,
                    b'b' => 0x08,
                    b'x' => {
                        let hex = [bytes.next()?, bytes.next()?];
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?
                    }
                    _ => return None,
                }),
                b => arg.push(b),
            }
        }
        args.push(String::from_utf8_lossy(&arg).into_owned());
        match bytes.next() {
            None => return Some(args),
            Some(b' ') => {}
            Some(_) => return None,
        }
    }
}

/// Records a server's `MONITOR` stream on a background thread.
///
/// [`start`](Monitor::start) returns once the server has acknowledged
/// `MONITOR`, so every command executed after it returns is recorded. If
/// the connection drops (the server was killed or restarted) the thread
/// records a [`Source::Interrupted`] entry and reconnects every ~10 ms until
/// it is stopped; commands run while it was disconnected are lost, which is
/// what the marker says. Dropping the monitor stops the thread (without
/// panicking); [`stop`](Monitor::stop) also hands back the entries.
#[derive(Debug)]
pub struct Monitor {
    addr: String,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    log: Mutex<Log>,
    /// Signalled whenever an entry is recorded.
    grew: Condvar,
    stop: AtomicBool,
}

#[derive(Debug, Default)]
struct Log {
    entries: Vec<Entry>,
    malformed: usize,
}

impl Shared {
    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, entry: Option<Entry>) {
        let mut log = self.log();
        match entry {
            Some(e) => log.entries.push(e),
            None => log.malformed += 1,
        }
        drop(log);
        self.grew.notify_all();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

impl Monitor {
    /// Connects to `addr` (`"127.0.0.1:PORT"`), sends `MONITOR`, waits for
    /// its `+OK` and starts recording.
    ///
    /// # Errors
    /// The server cannot be reached or does not acknowledge `MONITOR` (for
    /// example because it requires a password) within a second.
    pub fn start(addr: &str) -> io::Result<Monitor> {
        let conn = subscribe(addr)?;
        let shared = Arc::new(Shared::default());
        let thread = {
            let (shared, addr) = (Arc::clone(&shared), addr.to_owned());
            thread::Builder::new()
                .name(format!("testkit-monitor-{addr}"))
                .spawn(move || record_until_stopped(&shared, &addr, conn))?
        };
        Ok(Monitor {
            addr: addr.to_owned(),
            shared,
            thread: Some(thread),
        })
    }

    /// The server address this monitor records.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// A barrier: returns once everything the server executed before this
    /// call is recorded.
    ///
    /// Sends `ECHO <nonce>` on a separate short connection and waits until
    /// the monitor has recorded it (the server writes monitor lines in
    /// execution order). If the monitor is reconnecting, the `ECHO` may run
    /// unseen, so a fresh one is sent every 250 ms. The `ECHO` lines stay in
    /// the recording; they touch no key.
    ///
    /// # Errors
    /// [`io::ErrorKind::TimedOut`] if no `ECHO` was recorded within 5 s (the
    /// server is down, paused, or refuses the connection).
    pub fn sync(&self) -> io::Result<()> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let deadline = Instant::now() + SYNC_TIMEOUT;
        let mut last_error = None;
        while Instant::now() < deadline {
            let nonce = format!(
                "testkit-monitor-sync:{}:{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            );
            // Lines recorded before the ECHO was sent cannot be it.
            let mut scanned = self.shared.log().entries.len();
            if let Err(e) = echo(&self.addr, &nonce) {
                last_error = Some(e);
                thread::sleep(RECONNECT_INTERVAL);
                continue;
            }
            let attempt_end = deadline.min(Instant::now() + SYNC_ATTEMPT);
            let mut log = self.shared.log();
            loop {
                let seen = log.entries[scanned..].iter().any(|e| {
                    e.source != Source::Lua
                        && e.args.len() == 2
                        && e.args[0].eq_ignore_ascii_case("echo")
                        && e.args[1] == nonce
                });
                if seen {
                    return Ok(());
                }
                scanned = log.entries.len();
                let now = Instant::now();
                if now >= attempt_end {
                    break;
                }
                log = self
                    .shared
                    .grew
                    .wait_timeout(log, attempt_end - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "monitor of {}: sync ECHO not recorded within {SYNC_TIMEOUT:?}{}",
                self.addr,
                last_error.map_or_else(String::new, |e| format!(" (last error: {e})"))
            ),
        ))
    }

    /// A snapshot of the entries recorded so far, in order.
    pub fn entries(&self) -> Vec<Entry> {
        self.shared.log().entries.clone()
    }

    /// How many lines so far were not monitor lines [`parse_line`] accepts
    /// (skipped, not recorded).
    pub fn malformed(&self) -> usize {
        self.shared.log().malformed
    }

    /// Stops the thread and returns every entry recorded. Call
    /// [`sync`](Monitor::sync) first to be sure the last commands are in.
    pub fn stop(mut self) -> Vec<Entry> {
        self.halt();
        std::mem::take(&mut self.shared.log().entries)
    }

    /// Stops and joins the thread; it notices within [`READ_POLL`] (or
    /// one connect timeout while reconnecting).
    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The first of `addr`'s resolved addresses.
fn resolve(addr: &str) -> io::Result<std::net::SocketAddr> {
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr}: no address to connect to"),
        )
    })
}

/// A fresh connection to `addr` that has been acknowledged as a monitor.
fn subscribe(addr: &str) -> io::Result<BufReader<TcpStream>> {
    let stream = TcpStream::connect_timeout(&resolve(addr)?, CONNECT_TIMEOUT)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    stream.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    let mut out = Vec::new();
    encode_command(&mut out, &["MONITOR"]);
    (&stream).write_all(&out)?;
    let mut reader = BufReader::new(stream);
    let reply = read_reply(&mut reader)?;
    if reply.as_str() != Some("OK") {
        return Err(io::Error::other(format!(
            "{addr}: MONITOR answered {reply}"
        )));
    }
    reader.get_ref().set_read_timeout(Some(READ_POLL))?;
    Ok(reader)
}

/// One `ECHO nonce` round trip on a short connection.
fn echo(addr: &str, nonce: &str) -> io::Result<()> {
    let stream = TcpStream::connect_timeout(&resolve(addr)?, CONNECT_TIMEOUT)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    stream.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    let mut out = Vec::new();
    encode_command(&mut out, &["ECHO", nonce]);
    (&stream).write_all(&out)?;
    let reply = read_reply(&mut BufReader::new(stream))?;
    if reply.as_str() == Some(nonce) {
        Ok(())
    } else {
        Err(io::Error::other(format!("{addr}: ECHO answered {reply}")))
    }
}

/// The monitor thread: record, and on a dropped connection mark the gap and
/// reconnect, until stopped.
fn record_until_stopped(shared: &Shared, addr: &str, mut conn: BufReader<TcpStream>) {
    loop {
        // Returns on stop (Ok) or when the connection is gone (Err).
        if pump(shared, &mut conn).is_ok() || shared.stopped() {
            return;
        }
        shared.record(Some(Entry {
            time_us: wall_clock_us(),
            db: 0,
            source: Source::Interrupted,
            args: Vec::new(),
        }));
        conn = loop {
            if shared.stopped() {
                return;
            }
            match subscribe(addr) {
                Ok(conn) => break conn,
                Err(_) => thread::sleep(RECONNECT_INTERVAL),
            }
        };
    }
}

/// Reads monitor lines into `shared` until stopped (`Ok`) or the connection
/// fails (`Err`). Read timeouts only wake it up to check for a stop.
fn pump(shared: &Shared, conn: &mut BufReader<TcpStream>) -> io::Result<()> {
    let mut line = Vec::new();
    let mut overlong = false;
    while !shared.stopped() {
        let buf = match conn.fill_buf() {
            Ok([]) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "monitor connection closed",
                ));
            }
            Ok(buf) => buf,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        let (chunk, complete) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        if !overlong {
            line.extend_from_slice(chunk);
        }
        let used = chunk.len();
        conn.consume(used);
        if line.len() > MAX_LINE {
            overlong = true;
            line.clear();
        }
        if complete {
            let entry = if overlong {
                None
            } else {
                line.strip_suffix(b"\r\n")
                    .and_then(|l| l.strip_prefix(b"+"))
                    .and_then(|l| std::str::from_utf8(l).ok())
                    .and_then(parse_line)
            };
            shared.record(entry);
            line.clear();
            overlong = false;
        }
    }
    Ok(())
}

/// Microseconds since the Unix epoch by the local wall clock (the clock the
/// server's timestamps use, on the same machine).
fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// What [`touches`] found: C5's input and how much of the recording it could
/// judge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touches {
    /// One `release`/`extend` `ok` event per judged touch, sorted by
    /// `time_ns` (stable: recording order unless the clock stepped back),
    /// ready for [`foreign_touch`](crate::checkers::foreign_touch).
    /// See [`touches`] for the fields. Their `time_ns` is the server's
    /// **wall clock**, not `CLOCK_MONOTONIC`: judge them on their own, do not
    /// merge them into the workers' history (C1 would also take an `extend
    /// ok` without `valid_until_ns` as malformed).
    pub events: Vec<Event>,
    /// Touches judged: script commands that deleted a lock key or changed
    /// its expiry or value while its holder was known (`events.len()`).
    pub judged: usize,
    /// Script commands that may have touched a lock key but could not be
    /// judged, because the key's state was unknown then (after an
    /// interruption, an unmodelled command, an expiry too close to call,
    /// unparsable arguments) or the command itself is not modelled.
    pub skipped: usize,
    /// Interruption markers seen (monitor reconnections).
    pub interruptions: usize,
}

/// A window of microseconds in which some instant of the server lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    earliest: u64,
    latest: u64,
}

impl Window {
    fn exact(us: u64) -> Window {
        Window {
            earliest: us,
            latest: us,
        }
    }
}

/// What the replay knows about one lock key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyState {
    Absent,
    /// Holds `value`; expires within `expiry` (`None`: never).
    Present {
        value: String,
        expiry: Option<Window>,
    },
    Unknown,
}

/// The key's state as the command being replayed saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pre<'a> {
    Absent,
    Present(&'a str, Option<Window>),
    Unknown,
}

impl KeyState {
    /// The state as seen by a command whose server time lies in `now`,
    /// allowing `margin_us` of slack on both sides of every expiry.
    fn at(&self, now: Window, margin_us: u64) -> Pre<'_> {
        match self {
            KeyState::Absent => Pre::Absent,
            KeyState::Unknown => Pre::Unknown,
            KeyState::Present { value, expiry } => match expiry {
                Some(e) if e.latest.saturating_add(margin_us) <= now.earliest => Pre::Absent,
                Some(e) if e.earliest <= now.latest.saturating_add(margin_us) => Pre::Unknown,
                _ => Pre::Present(value, *expiry),
            },
        }
    }
}

/// The enclosing script call of `lua` lines.
struct ScriptCall {
    time_us: u64,
    argv: Vec<String>,
}

impl ScriptCall {
    /// `EVAL body numkeys key... arg...` (and `EVALSHA`, `FCALL`, their
    /// `_RO` forms): the args after the keys.
    fn parse(args: &[String]) -> ScriptCall {
        let argv = args
            .get(2)
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| args.get(3usize.saturating_add(n)..))
            .unwrap_or_default();
        ScriptCall {
            time_us: 0,
            argv: argv.to_vec(),
        }
    }

    /// The owner to charge with a touch of a key holding `touched`: that
    /// token if the call passed it, else a description of what it passed.
    fn owner(&self, touched: &str) -> String {
        if self.argv.iter().any(|a| a == touched) {
            touched.to_owned()
        } else {
            format!("argv: [{}]", self.argv.join(", "))
        }
    }
}

/// How a modelled write changes one key, given its state before.
enum Effect {
    /// Leaves the key as it was (`SET NX` on a present key, `DEL` of an
    /// absent one).
    Keep,
    /// The key's new state; `touch` is set if the command acted on the value
    /// the key held (deleted it, changed its expiry, overwrote it).
    Set { state: KeyState, touch: Option<Op> },
    /// The outcome depends on what is not known; `maybe_touch` is set if the
    /// command might have acted on a present key.
    Unknown { maybe_touch: bool },
}

/// Replays `entries` (a [`Monitor`] recording) on the keys `lock_keys` of
/// database 0 and returns C5's events for the touches scripts made.
///
/// # State
/// Each key is absent, present (a value and an expiry window), or unknown;
/// it starts unknown. Every command on a lock key, from clients and from
/// scripts, updates it: `SET` (with `NX XX GET KEEPTTL EX PX EXAT PXAT`),
/// `DEL UNLINK GETDEL`, `EXPIRE PEXPIRE EXPIREAT PEXPIREAT` (without
/// options; a non-positive relative ttl deletes), `PERSIST`, `FLUSHDB`,
/// `FLUSHALL`. Read-only commands (`GET`, `TYPE`, `PTTL`, `EXISTS`, `HGET`,
/// ...) and script calls themselves (their commands follow as `lua` lines)
/// change nothing. Any other command with a lock key among its arguments,
/// unparsable or invalid options, `SWAPDB` and an
/// [interruption](Source::Interrupted) make the key unknown, until a
/// command sets it regardless of its state (`SET` without
/// `NX`/`XX`/`KEEPTTL`, `DEL`, ...).
///
/// Every key starts **unknown**: the recording does not say what the key
/// held before it began. Start it with a definite write (`DEL` the lock keys
/// or `FLUSHALL` right after [`Monitor::start`]), or the first touches are
/// skipped.
///
/// A present key whose expiry is at or before `margin` before the
/// command's time is absent; one whose expiry is within `margin` of it is
/// unknown for that command. The server's expiry clock has millisecond
/// resolution and is frozen at a script's start, so the command's time is
/// taken as the window from its script call's line (1 ms before that) to
/// its own line, and an expiry set with a relative ttl as the same window
/// plus the ttl. A few milliseconds is a sensible `margin`.
///
/// # Judging
/// Only `lua` commands, on behalf of the nearest preceding script call,
/// are judged. `DEL`/`UNLINK`/`GETDEL`/`FLUSH*` (op `release`) and expiry
/// changes or `SET` overwrites (op `extend`) of a key known to hold value
/// `V` produce an event: process 0, `time_ns` the line's time in
/// nanoseconds (server wall clock), phase `ok`, `touched_owner` `V`, and
/// `owner` `V` if `V` is among the call's `ARGV`, else `"argv: [a, b]"`
/// (so `foreign_touch` reports it). A key known absent was not acted on:
/// no event. A key in unknown state: counted in
/// [`skipped`](Touches::skipped). A `SET NX` never overwrites, so is never
/// a touch. Multi-key scripts are judged per key, but the owner check only
/// asks whether `V` is among *all* the call's arguments.
pub fn touches(entries: &[Entry], lock_keys: &[&str], margin: Duration) -> Touches {
    let margin_us = u64::try_from(margin.as_micros()).unwrap_or(u64::MAX);
    let mut keys: Vec<(&str, KeyState)> = Vec::new();
    for key in lock_keys {
        if !keys.iter().any(|(k, _)| k == key) {
            keys.push((key, KeyState::Unknown));
        }
    }
    let mut out = Touches::default();
    let mut script: Option<ScriptCall> = None;
    for entry in entries {
        let lua = entry.source == Source::Lua;
        if entry.is_interruption() {
            out.interruptions += 1;
            script = None;
            keys.iter_mut().for_each(|(_, s)| *s = KeyState::Unknown);
            continue;
        }
        let command = entry.command();
        if !lua {
            script = is_script_call(&command).then(|| ScriptCall {
                time_us: entry.time_us,
                ..ScriptCall::parse(&entry.args)
            });
        }
        let now = Window {
            earliest: script
                .as_ref()
                .filter(|_| lua)
                .map_or(entry.time_us, |s| s.time_us)
                .saturating_sub(1_000),
            latest: entry.time_us,
        };
        for (key, state) in keys.iter_mut() {
            let effect = if entry.db == LOCK_DB {
                apply(&command, &entry.args, key, state.at(now, margin_us), now)
            } else {
                other_db(&command, &entry.args, key)
            };
            let touch = match effect {
                Effect::Keep => None,
                Effect::Set { state: new, touch } => {
                    let touched = match (touch, state.at(now, margin_us)) {
                        (Some(op), Pre::Present(value, _)) => Some((op, value.to_owned())),
                        (Some(_), Pre::Unknown) => {
                            if lua {
                                out.skipped += 1;
                            }
                            None
                        }
                        _ => None,
                    };
                    *state = new;
                    touched
                }
                Effect::Unknown { maybe_touch } => {
                    *state = KeyState::Unknown;
                    if lua && maybe_touch {
                        out.skipped += 1;
                    }
                    None
                }
            };
            let Some((op, touched)) = touch.filter(|_| lua) else {
                continue;
            };
            let Some(call) = &script else {
                // A script command without its call line: cannot be judged.
                out.skipped += 1;
                continue;
            };
            out.events.push(
                Event::new(0, entry.time_us.saturating_mul(1_000), op, Phase::Ok)
                    .with_owner(call.owner(&touched))
                    .with_touched_owner(touched),
            );
        }
    }
    out.judged = out.events.len();
    // The recording is in execution order; a wall clock stepped back (NTP)
    // must not break the checkers' sorted-input contract.
    out.events.sort_by_key(|e| e.time_ns);
    out
}

fn is_script_call(command: &str) -> bool {
    matches!(
        command,
        "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" | "FCALL" | "FCALL_RO"
    )
}

/// Commands that never write a key named among their arguments (or whose
/// writes show up as lines of their own, like script calls).
fn is_harmless(command: &str) -> bool {
    is_script_call(command)
        || matches!(
            command,
            "GET"
                | "MGET"
                | "EXISTS"
                | "TYPE"
                | "TTL"
                | "PTTL"
                | "EXPIRETIME"
                | "PEXPIRETIME"
                | "STRLEN"
                | "GETRANGE"
                | "SUBSTR"
                | "LCS"
                | "GETBIT"
                | "BITCOUNT"
                | "BITPOS"
                | "HGET"
                | "HMGET"
                | "HEXISTS"
                | "HGETALL"
                | "HKEYS"
                | "HVALS"
                | "HLEN"
                | "HSTRLEN"
                | "LLEN"
                | "LRANGE"
                | "LINDEX"
                | "SCARD"
                | "SISMEMBER"
                | "SMEMBERS"
                | "ZCARD"
                | "ZSCORE"
                | "DUMP"
                | "OBJECT"
                | "TOUCH"
                | "MEMORY"
                | "WATCH"
                | "UNWATCH"
                | "ECHO"
                | "PING"
                | "PUBLISH"
                | "SPUBLISH"
                | "SUBSCRIBE"
                | "UNSUBSCRIBE"
                | "PSUBSCRIBE"
                | "PUNSUBSCRIBE"
                | "KEYS"
                | "SCAN"
                | "DBSIZE"
                | "RANDOMKEY"
                | "INFO"
                | "TIME"
                | "SELECT"
                | "MULTI"
                | "EXEC"
                | "DISCARD"
                | "CLIENT"
                | "HELLO"
                | "AUTH"
                | "COMMAND"
                | "MONITOR"
                | "SCRIPT"
                | "FUNCTION"
                | "READONLY"
                | "WAIT"
                | "RESET"
                | "QUIT"
        )
}

/// A command in another database: only its effects on database 0 count.
fn other_db(command: &str, args: &[String], key: &str) -> Effect {
    match command {
        "FLUSHALL" => flush(),
        "SWAPDB" => Effect::Unknown { maybe_touch: true },
        // The only other commands that reach across databases.
        "MOVE" | "COPY" if names(args, key) => Effect::Unknown { maybe_touch: true },
        _ => Effect::Keep,
    }
}

fn names(args: &[String], key: &str) -> bool {
    args.iter().skip(1).any(|a| a == key)
}

fn flush() -> Effect {
    Effect::Set {
        state: KeyState::Absent,
        touch: Some(Op::Release),
    }
}

/// The effect of `args` (in database 0) on `key`, whose state the command
/// saw as `pre`, at server time `now`.
fn apply(command: &str, args: &[String], key: &str, pre: Pre<'_>, now: Window) -> Effect {
    let unknown = Effect::Unknown {
        maybe_touch: pre != Pre::Absent,
    };
    let on_key = args.get(1).is_some_and(|k| k == key);
    match command {
        "FLUSHALL" | "FLUSHDB" => flush(),
        "SWAPDB" => unknown,
        "DEL" | "UNLINK" if names(args, key) => Effect::Set {
            state: KeyState::Absent,
            touch: Some(Op::Release),
        },
        "GETDEL" if on_key && args.len() == 2 => Effect::Set {
            state: KeyState::Absent,
            touch: Some(Op::Release),
        },
        "SET" if on_key => set(&args[2..], pre, now),
        "PEXPIRE" | "EXPIRE" | "PEXPIREAT" | "EXPIREAT" if on_key => {
            match expiry_of(command, args.get(2..).unwrap_or_default(), now) {
                None => unknown,
                Some(expiry) => retime(pre, expiry),
            }
        }
        "PERSIST" if on_key && args.len() == 2 => match pre {
            Pre::Absent | Pre::Present(_, None) => Effect::Keep,
            Pre::Present(value, Some(_)) => Effect::Set {
                state: KeyState::Present {
                    value: value.to_owned(),
                    expiry: None,
                },
                touch: Some(Op::Extend),
            },
            Pre::Unknown => unknown,
        },
        // Modelled commands that name the key elsewhere than as their key
        // (`SET other <key>`) do not write it.
        "SET" | "GETDEL" | "PEXPIRE" | "EXPIRE" | "PEXPIREAT" | "EXPIREAT" | "PERSIST" | "DEL"
        | "UNLINK"
            if !on_key =>
        {
            Effect::Keep
        }
        _ if is_harmless(command) || !names(args, key) => Effect::Keep,
        _ => unknown,
    }
}

/// A new expiry for a key: `None` deletes it at once (non-positive relative
/// ttl).
type NewExpiry = Option<Window>;

/// The new expiry of `PEXPIRE key ms` & co. (`rest` is after the key);
/// `None` if the arguments are not exactly one valid integer (options like
/// `NX`/`GT` are not modelled, and an invalid command changes nothing we
/// could know).
fn expiry_of(command: &str, rest: &[String], now: Window) -> Option<NewExpiry> {
    let [amount] = rest else {
        return None;
    };
    let amount: i64 = amount.parse().ok()?;
    let unit_us: i64 = if command.starts_with('P') {
        1_000
    } else {
        1_000_000
    };
    if command.ends_with("AT") {
        let at = u64::try_from(amount.checked_mul(unit_us)?).unwrap_or(0);
        return Some(Some(Window::exact(at)));
    }
    if amount <= 0 {
        return Some(None);
    }
    relative(u64::try_from(amount).ok()?, unit_us as u64, now).map(Some)
}

/// The expiry window of a relative ttl set at `now`.
fn relative(amount: u64, unit_us: u64, now: Window) -> Option<Window> {
    let ttl = amount.checked_mul(unit_us)?;
    Some(Window {
        earliest: now.earliest.checked_add(ttl)?,
        latest: now.latest.checked_add(ttl)?,
    })
}

/// `PEXPIRE` & co. on a key in state `pre`.
fn retime(pre: Pre<'_>, expiry: NewExpiry) -> Effect {
    match pre {
        Pre::Absent => Effect::Keep,
        Pre::Unknown => Effect::Unknown { maybe_touch: true },
        Pre::Present(value, _) => Effect::Set {
            state: match expiry {
                None => KeyState::Absent,
                Some(_) => KeyState::Present {
                    value: value.to_owned(),
                    expiry,
                },
            },
            touch: Some(Op::Extend),
        },
    }
}

/// How `SET` sets the expiry.
enum SetTtl {
    Persist,
    Keep,
    At(Window),
}

/// `SET key` + `rest` (value and options) on a key in state `pre`.
fn set(rest: &[String], pre: Pre<'_>, now: Window) -> Effect {
    let unknown = Effect::Unknown {
        maybe_touch: pre != Pre::Absent,
    };
    let Some((value, options)) = rest.split_first() else {
        return unknown;
    };
    let (mut nx, mut xx) = (false, false);
    let mut ttl = None;
    let mut i = 0;
    while let Some(option) = options.get(i) {
        i += 1;
        let option = option.to_ascii_uppercase();
        let unit_us = match option.as_str() {
            "NX" => {
                nx = true;
                continue;
            }
            "XX" => {
                xx = true;
                continue;
            }
            "GET" => continue,
            "KEEPTTL" if ttl.is_none() => {
                ttl = Some(SetTtl::Keep);
                continue;
            }
            "PX" | "PXAT" => 1_000,
            "EX" | "EXAT" => 1_000_000,
            _ => return unknown,
        };
        // Redis rejects a second expiry option and non-positive amounts.
        let amount = options.get(i).and_then(|a| a.parse::<u64>().ok());
        i += 1;
        let window = match amount {
            Some(amount) if amount > 0 && ttl.is_none() && option.ends_with("AT") => {
                amount.checked_mul(unit_us).map(Window::exact)
            }
            Some(amount) if amount > 0 && ttl.is_none() => relative(amount, unit_us, now),
            _ => None,
        };
        let Some(window) = window else {
            return unknown;
        };
        ttl = Some(SetTtl::At(window));
    }
    if nx && xx {
        return unknown;
    }
    let writes = match pre {
        Pre::Absent => !xx,
        Pre::Present(..) => !nx,
        Pre::Unknown if nx || xx => {
            // SET NX never overwrites a present key: not a possible touch.
            return Effect::Unknown { maybe_touch: !nx };
        }
        Pre::Unknown => true,
    };
    if !writes {
        return Effect::Keep;
    }
    let expiry = match ttl.unwrap_or(SetTtl::Persist) {
        SetTtl::Persist => None,
        SetTtl::At(window) => Some(window),
        SetTtl::Keep => match pre {
            Pre::Absent => None,
            Pre::Present(_, expiry) => expiry,
            Pre::Unknown => return Effect::Unknown { maybe_touch: true },
        },
    };
    let touch = match pre {
        Pre::Absent => None,
        _ => Some(Op::Extend),
    };
    Effect::Set {
        state: KeyState::Present {
            value: value.clone(),
            expiry,
        },
        touch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(time_us: u64, source: Source, args: &[&str]) -> Entry {
        Entry {
            time_us,
            db: 0,
            source,
            args: args.iter().map(|a| a.to_string()).collect(),
        }
    }

    fn client(time_us: u64, args: &[&str]) -> Entry {
        entry(time_us, Source::Client("127.0.0.1:1".into()), args)
    }

    fn lua(time_us: u64, args: &[&str]) -> Entry {
        entry(time_us, Source::Lua, args)
    }

    const K: &str = "fencelock:{lab:x}";
    const MARGIN: Duration = Duration::from_millis(2);

    #[test]
    fn parses_lines_with_escapes() {
        let e = parse_line(
            r#"+1795325555.103104 [0 127.0.0.1:58326] "eval" "redis.call(...)" "1" "fencelock:{lab:x}" "tok\"en\\n\x01\xff\t\xc3\xa9\r\n\a\b""#,
        )
        .unwrap();
        assert_eq!(e.time_us, 1_795_325_555_103_104);
        assert_eq!(e.db, 0);
        assert_eq!(e.source, Source::Client("127.0.0.1:58326".into()));
        assert_eq!(e.command(), "EVAL");
        assert_eq!(
            e.args,
            [
                "eval",
                "redis.call(...)",
                "1",
                "fencelock:{lab:x}",
                "tok\"en\\n\u{1}\u{fffd}\té\r\n\u{7}\u{8}"
            ]
        );
        let e = parse_line(r#"1795325555.000001 [3 lua] "DEL" """#).unwrap();
        assert_eq!((e.time_us, e.db), (1_795_325_555_000_001, 3));
        assert_eq!(
            (e.source, e.args),
            (Source::Lua, vec!["DEL".into(), "".into()])
        );
        let e = parse_line(r#"1.000000 [0 unix:/tmp/r.sock] "ping""#).unwrap();
        assert_eq!(e.source, Source::Unix("/tmp/r.sock".into()));
        let e = parse_line(r#"1.000000 [0 [::1]:6000] "ping""#).unwrap();
        assert_eq!(e.source, Source::Client("[::1]:6000".into()));
    }

    #[test]
    fn malformed_lines_are_none() {
        for line in [
            "",
            "+",
            "+OK",
            "-ERR x",
            "1795325555.103104",
            "1795325555.1031 [0 lua] \"DEL\"",
            "x.103104 [0 lua] \"DEL\"",
            "-1.103104 [0 lua] \"DEL\"",
            "99999999999999999999.000000 [0 lua] \"DEL\"",
            "1.000000 [0 lua]",
            "1.000000 [0 lua] ",
            "1.000000 [0 lua] DEL",
            "1.000000 [x lua] \"DEL\"",
            "1.000000 [0 ] \"DEL\"",
            "1.000000 0 lua] \"DEL\"",
            "1.000000 [0 lua] \"DEL",
            "1.000000 [0 lua] \"DEL\"  \"k\"",
            "1.000000 [0 lua] \"DEL\"x",
            "1.000000 [0 lua] \"D\\qEL\"",
            "1.000000 [0 lua] \"D\\x4\"",
            "1.000000 [0 lua] \"D\\xzz\"",
            "1.000000 [0 lua] \"D\\x+f\"",
            "1.000000 [0 lua] \"D\\",
            "1.000000 [0 lua] \"é\\xé\"",
        ] {
            assert_eq!(parse_line(line), None, "{line:?}");
        }
    }

    #[test]
    fn checked_release_by_owner_is_judged_and_matches() {
        let log = [
            client(1_000, &["SET", K, "a", "PX", "10000"]),
            client(2_000, &["evalsha", "sha", "1", K, "a", "chan"]),
            lua(2_010, &["GET", K]),
            lua(2_020, &["DEL", K]),
            lua(2_030, &["PUBLISH", "chan", ""]),
        ];
        let t = touches(&log, &[K], MARGIN);
        assert_eq!((t.judged, t.skipped), (1, 0));
        let e = &t.events[0];
        assert_eq!(
            (e.op, e.phase, e.time_ns),
            (Op::Release, Phase::Ok, 2_020_000)
        );
        assert_eq!(e.owner.as_deref(), Some("a"));
        assert_eq!(e.touched_owner.as_deref(), Some("a"));
    }

    #[test]
    fn foreign_delete_names_the_call_arguments() {
        let log = [
            client(1_000, &["SET", K, "b"]),
            client(
                2_000,
                &["eval", "redis.call('DEL', KEYS[1])", "1", K, "a", "x"],
            ),
            lua(2_010, &["DEL", K]),
        ];
        let t = touches(&log, &[K], MARGIN);
        assert_eq!(t.events.len(), 1);
        assert_eq!(t.events[0].owner.as_deref(), Some("argv: [a, x]"));
        assert_eq!(t.events[0].touched_owner.as_deref(), Some("b"));
    }

    #[test]
    fn keys_start_unknown_and_become_known_by_definite_writes() {
        let call = client(10, &["eval", "s", "1", K, "a"]);
        let log = [
            call.clone(),
            lua(11, &["DEL", K]), // unknown: skipped
            call.clone(),
            lua(21, &["DEL", K]), // known absent: no touch
            call.clone(),
            lua(31, &["SET", K, "a", "NX", "PX", "1000"]), // absent: not a touch
            lua(32, &["PEXPIRE", K, "2000"]),              // extend
            lua(33, &["SET", K, "a", "XX", "KEEPTTL"]),    // overwrite
            lua(34, &["PERSIST", K]),                      // extend
            lua(35, &["PERSIST", K]),                      // no expiry: no-op
            lua(36, &["SET", K, "b", "NX"]),               // present: no-op
            lua(37, &["GETDEL", K]),                       // release
        ];
        let t = touches(&log, &[K], MARGIN);
        assert_eq!((t.judged, t.skipped), (4, 1));
        let ops: Vec<Op> = t.events.iter().map(|e| e.op).collect();
        assert_eq!(ops, [Op::Extend, Op::Extend, Op::Extend, Op::Release]);
        assert!(t.events.iter().all(|e| e.owner.as_deref() == Some("a")));
    }

    #[test]
    fn expiry_is_judged_with_a_margin() {
        let call = |t| client(t, &["eval", "s", "1", K, "b"]);
        let set = client(1_000_000, &["set", K, "a", "px", "50"]);
        // Expired well before: absent, so B's checked DEL acts on nothing.
        let t = touches(
            &[set.clone(), call(2_000_000), lua(2_000_100, &["DEL", K])],
            &[K],
            MARGIN,
        );
        assert_eq!((t.judged, t.skipped), (0, 0));
        // Expiring around the script's start: unknown for that command.
        let t = touches(
            &[set.clone(), call(1_050_500), lua(1_050_600, &["DEL", K])],
            &[K],
            MARGIN,
        );
        assert_eq!((t.judged, t.skipped), (0, 1));
        // Well before expiry: present, a foreign delete.
        let t = touches(
            &[set, call(1_010_000), lua(1_010_100, &["DEL", K])],
            &[K],
            MARGIN,
        );
        assert_eq!(t.judged, 1);
        assert_eq!(t.events[0].owner.as_deref(), Some("argv: [b]"));
        // A non-positive relative ttl deletes at once.
        let log = [
            client(1, &["set", K, "a"]),
            client(2, &["pexpire", K, "0"]),
            call(3),
            lua(4, &["DEL", K]),
        ];
        assert_eq!(touches(&log, &[K], MARGIN).skipped, 0);
        assert_eq!(touches(&log, &[K], MARGIN).judged, 0);
    }

    #[test]
    fn unmodelled_and_invalid_commands_make_the_key_unknown() {
        let call = client(10, &["eval", "s", "1", K, "a"]);
        for bad in [
            &["set", K, "a", "px", "0"][..],
            &["set", K, "a", "px", "abc"],
            &["set", K, "a", "bogus"],
            &["set", K, "a", "px", "10", "ex", "10"],
            &["set", K, "a", "nx", "xx"],
            &["pexpire", K, "10", "gt"],
            &["pexpire", K, "x"],
            &["rename", "other", K],
            &["hset", K, "owner", "a"],
            &["swapdb", "0", "1"],
        ] {
            let log = [
                client(1, &["set", K, "a"]),
                client(2, bad),
                call.clone(),
                lua(11, &["DEL", K]),
            ];
            let t = touches(&log, &[K], MARGIN);
            assert_eq!((t.judged, t.skipped), (0, 1), "{bad:?}");
        }
        // Read-only commands and other keys change nothing.
        let mut log = vec![
            client(1, &["set", K, "a"]),
            client(2, &["get", K]),
            client(3, &["del", "other"]),
            client(4, &["set", "other", K]),
            client(5, &["del", K]),
            call,
            lua(11, &["TYPE", K]),
            lua(12, &["DEL", K]),
        ];
        log[4].db = 1; // another database's key of the same name
        let t = touches(&log, &[K], MARGIN);
        assert_eq!((t.judged, t.skipped), (1, 0));
    }

    #[test]
    fn interruption_and_flush() {
        let call = client(10, &["eval", "s", "1", K, "a"]);
        let gap = entry(5, Source::Interrupted, &[]);
        let log = [
            client(1, &["set", K, "a"]),
            gap,
            call.clone(),
            lua(11, &["DEL", K]),
        ];
        let t = touches(&log, &[K], MARGIN);
        assert_eq!((t.judged, t.skipped, t.interruptions), (0, 1, 1));
        let log = [client(1, &["set", K, "a"]), call, lua(11, &["flushall"])];
        let t = touches(&log, &[K, "fencelock:{other}"], MARGIN);
        assert_eq!((t.judged, t.skipped), (1, 1));
        assert_eq!(t.events[0].op, Op::Release);
    }

    #[test]
    fn lua_without_a_call_line_is_skipped() {
        let log = [
            client(1, &["set", K, "a"]),
            client(2, &["get", K]),
            lua(3, &["DEL", K]),
        ];
        let t = touches(&log, &[K], MARGIN);
        assert_eq!((t.judged, t.skipped), (0, 1));
    }
}
