//! A wall clock that a test can step under a running `redis-server`.
//!
//! Redis expires keys by its wall clock (`CLOCK_REALTIME`): a clock stepped
//! forward expires every lease early, one stepped back keeps keys alive
//! longer and moves `TIME` (and tokens seeded from it) back. [`ServerClock`]
//! lets a test do that to one server and to nothing else:
//!
//! ```
//! use std::time::{SystemTime, UNIX_EPOCH};
//! use testkit::{RedisServer, ServerClock};
//!
//! let clock = ServerClock::new().expect("cc builds the clock shim");
//! let server = RedisServer::builder().clock(&clock).start();
//! server.cmd(&["SET", "k", "v", "PX", "10000"]);
//! clock.step_ms(20_000); // the server's clock jumps 20 s ahead
//! assert!(!server.exists("k")); // and the key's 10 s are over
//! clock.step_ms(-3_620_000); // now an hour behind
//! let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
//! assert!((now - server.server_time()).as_secs() >= 3_599);
//! ```
//!
//! How: a small `LD_PRELOAD` library, compiled from C with the machine's
//! `cc` when the clock is created, defines `clock_gettime`, `gettimeofday`
//! and `time`. Each asks the kernel directly (`syscall`: no `dlsym`, no
//! allocation, which is what breaks libfaketime under Redis's jemalloc) and
//! adds to `CLOCK_REALTIME` (and its coarse variant) an offset in
//! nanoseconds that it reads, on every call, from an 8-byte file mapped into
//! its memory. The test writes that file ([`ServerClock::step_ms`]); the
//! server sees the new time on its next call. `CLOCK_MONOTONIC` and every
//! other clock are untouched, as is every process other than the servers
//! started with [`ServerBuilder::clock`](crate::ServerBuilder::clock).
//!
//! [`ServerClock::freeze`] stops the wall clock instead: the servers read
//! the same instant (to the nanosecond) until the test steps it, so that
//! `TIME`, every TTL and every expiry are exact (a model that runs beside
//! the server on its own logical clock compares equal). The second 8 bytes
//! of the file hold that instant (0: not frozen).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tempfile::TempDir;

/// How long [`ServerClock::step_ms`] waits after a step: longer than the
/// millisecond for which Valkey 9 goes on using the time it read last.
pub const STEP_SETTLE: std::time::Duration = std::time::Duration::from_millis(2);

/// The environment variable naming the offset file, for the shim.
pub(crate) const OFFSET_FILE_ENV: &str = "TESTKIT_CLOCK_OFFSET_FILE";

/// The shim's source. The offset file is mapped on first use (by whichever
/// thread gets there; a second mapping of a race is harmless). An offset file
/// that cannot be mapped leaves the clock as the kernel gives it.
const SHIM_SOURCE: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *offset_ns_at = 0;
static volatile int unavailable = 0;

/* The offset, and (the next 8 bytes) the frozen instant or 0. */
static int map_file(void) {
    if (offset_ns_at == 0 && !unavailable) {
        const char *path = getenv("TESTKIT_CLOCK_OFFSET_FILE");
        long fd = path ? syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC) : -1;
        if (fd < 0) {
            unavailable = 1;
            return 0;
        }
        long at = syscall(SYS_mmap, 0, 2 * sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
        syscall(SYS_close, fd);
        if (at == -1) {
            unavailable = 1;
            return 0;
        }
        offset_ns_at = (const int64_t *)at;
    }
    return offset_ns_at != 0;
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
    if (map_file()) {
        int64_t frozen = offset_ns_at[1];
        ns = frozen != 0 ? frozen : ns + offset_ns_at[0];
    }
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    if (ts->tv_nsec < 0) {
        ts->tv_sec -= 1;
        ts->tv_nsec += 1000000000;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (syscall(SYS_clock_gettime, id, ts) != 0) {
        return -1;
    }
    if (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE) {
        shift(ts);
    }
    return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return -1;
    }
    if (tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
"#;

/// A wall clock for the servers started with
/// [`ServerBuilder::clock`](crate::ServerBuilder::clock): the real one plus
/// an offset that [`step_ms`](Self::step_ms) moves while they run. Clones
/// share the clock; its files live as long as the last clone (a server's
/// configuration keeps one, so a restart finds them).
#[derive(Clone)]
pub struct ServerClock {
    inner: Arc<Inner>,
}

struct Inner {
    dir: TempDir,
    offset: Mutex<Offset>,
}

/// The offset file, open for writing, and what it holds.
struct Offset {
    file: File,
    /// The offset from the real time (ns).
    ns: i64,
    /// The instant the clock stands at (ns since the epoch), when frozen.
    frozen_ns: Option<i64>,
}

impl Offset {
    /// One 8-byte write at `at` of a file that keeps its size: the shim's
    /// aligned read sees the old value or the new one.
    fn write(&self, at: u64, value: i64) {
        self.file
            .write_all_at(&value.to_ne_bytes(), at)
            .unwrap_or_else(|e| panic!("testkit: cannot step the server clock: {e}"));
    }
}

impl std::fmt::Debug for ServerClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerClock")
            .field("offset_ms", &self.offset_ms())
            .finish()
    }
}

impl ServerClock {
    /// A clock at offset zero: compiles the shim with `cc` into a temporary
    /// directory and creates its offset file.
    ///
    /// # Errors
    /// If `cc` is missing or fails (its output is in the error), or the
    /// files cannot be written.
    pub fn new() -> io::Result<ServerClock> {
        let dir = tempfile::Builder::new()
            .prefix("testkit-clock-")
            .tempdir()?;
        let source = dir.path().join("clock.c");
        fs::write(&source, SHIM_SOURCE)?;
        let out = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(dir.path().join(LIBRARY))
            .arg(&source)
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "cc could not build the clock shim: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.path().join(OFFSET_FILE))?;
        file.write_all_at(&[0u8; 16], 0)?;
        Ok(ServerClock {
            inner: Arc::new(Inner {
                dir,
                offset: Mutex::new(Offset {
                    file,
                    ns: 0,
                    frozen_ns: None,
                }),
            }),
        })
    }

    /// Steps the clock by `ms` milliseconds (negative: back); the servers
    /// see it on their next reading of the time, and every command sent
    /// after this returns runs at the new time. A frozen clock stays frozen,
    /// at the instant stepped to.
    ///
    /// Redis reads the clock for every command. Valkey 9 reads it again only
    /// once its monotonic clock has moved on by about a millisecond: commands
    /// within 0.3-0.9 ms of a step still saw the old time (an expired key
    /// still there), and none did 1.1 ms after it (40 steps). So this returns
    /// [`STEP_SETTLE`] after the write.
    ///
    /// # Panics
    /// If the offset file cannot be written (its directory was removed).
    pub fn step_ms(&self, ms: i64) {
        self.step_us(ms.saturating_mul(1_000));
    }

    /// [`step_ms`](Self::step_ms) in microseconds (it returns
    /// [`STEP_SETTLE`] after the write too).
    ///
    /// # Panics
    /// If the offset file cannot be written (its directory was removed).
    pub fn step_us(&self, us: i64) {
        {
            let mut offset = self.lock();
            let by = us.saturating_mul(1_000);
            match offset.frozen_ns {
                Some(at) => {
                    let at = at.saturating_add(by).max(1);
                    offset.write(8, at);
                    offset.frozen_ns = Some(at);
                }
                None => {
                    let ns = offset.ns.saturating_add(by);
                    offset.write(0, ns);
                    offset.ns = ns;
                }
            }
        }
        std::thread::sleep(STEP_SETTLE);
    }

    /// Stops the clock at `at` (since the Unix epoch): every reading of the
    /// servers' wall clock gives exactly that instant until the test steps
    /// it ([`step_ms`](Self::step_ms) moves the frozen instant), freezes it
    /// again, or [`thaw`](Self::thaw)s it. A server's `TIME`, `PTTL` and
    /// expiries then follow only the test's steps. Returns [`STEP_SETTLE`]
    /// after the write, as [`step_ms`](Self::step_ms) does.
    ///
    /// # Panics
    /// If `at` is before the epoch's first nanosecond or after 2262, or the
    /// offset file cannot be written.
    pub fn freeze(&self, at: Duration) {
        let ns = i64::try_from(at.as_nanos())
            .ok()
            .filter(|ns| *ns > 0)
            .expect("testkit: a frozen instant between 1970 and 2262");
        {
            let mut offset = self.lock();
            offset.write(8, ns);
            offset.frozen_ns = Some(ns);
        }
        std::thread::sleep(STEP_SETTLE);
    }

    /// Lets a frozen clock run again, at the real time plus the offset.
    ///
    /// # Panics
    /// If the offset file cannot be written.
    pub fn thaw(&self) {
        {
            let mut offset = self.lock();
            offset.write(8, 0);
            offset.frozen_ns = None;
        }
        std::thread::sleep(STEP_SETTLE);
    }

    /// The instant a frozen clock stands at (since the Unix epoch), or
    /// `None` when it runs.
    pub fn frozen_at(&self) -> Option<Duration> {
        self.lock()
            .frozen_ns
            .map(|ns| Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Offset> {
        self.inner.offset.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the offset back to zero and thaws a frozen clock: the servers
    /// see the real time again.
    ///
    /// # Panics
    /// If the offset file cannot be written.
    pub fn reset(&self) {
        {
            let mut offset = self.lock();
            offset.write(8, 0);
            offset.frozen_ns = None;
            offset.write(0, 0);
            offset.ns = 0;
        }
        std::thread::sleep(STEP_SETTLE);
    }

    /// The clock's offset from the real time, ms.
    pub fn offset_ms(&self) -> i64 {
        self.lock().ns / 1_000_000
    }

    /// The environment a server needs to run on this clock.
    pub(crate) fn env(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("LD_PRELOAD", self.path(LIBRARY)),
            (OFFSET_FILE_ENV, self.path(OFFSET_FILE)),
        ]
    }

    fn path(&self, name: &str) -> PathBuf {
        Path::new(self.inner.dir.path()).join(name)
    }
}

const LIBRARY: &str = "libtestkit-clock.so";
const OFFSET_FILE: &str = "offset";
