//! The recorder: [`Monitor`] connects to a server, sends `MONITOR` and
//! records the stream on a background thread, reconnecting after a drop.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::parser::{Entry, Source, parse_line};
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
