//! Helpers shared by the integration tests (each test file is its own crate and takes
//! what it needs with `mod common;`).

#![allow(dead_code)] // not every test crate uses every helper

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Polls (bounded) until `cond` holds; panics with `"{what}: not within {within:?}"`
/// otherwise. For state that no event announces (a server-side count, a client's
/// statistics, an item coming due).
///
/// The async twin of [`testkit::eventually`], the only one for async tests: it checks
/// every 2 ms as that one does, but sleeps with Tokio, so the tasks under test go on
/// running on the test's runtime; and `cond` may await (`async || ...`), e.g. to take
/// from a queue.
pub async fn eventually(what: &str, within: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// How many clients `server` has subscribed to the classic pub/sub `channel`
/// (`PUBSUB NUMSUB`): a waiter's subscription, seen from Redis.
pub fn numsub(server: &testkit::RedisServer, channel: &str) -> i64 {
    let reply = server.cmd(&["PUBSUB", "NUMSUB", channel]);
    reply
        .as_array()
        .and_then(|a| a.get(1)?.as_int())
        .unwrap_or_else(|| panic!("PUBSUB NUMSUB {channel}: {reply:?}"))
}

/// Starts this test binary again as another OS process that runs only the ignored test
/// `entry`, with `spec` in the environment variable `env` (the entry reads it and
/// returns at once when it is unset, as in a normal test run).
pub fn spawn_helper(entry: &str, env: &str, spec: impl AsRef<str>) -> Helper {
    let child = Command::new(std::env::current_exe().expect("current_exe"))
        .args([entry, "--exact", "--ignored", "--nocapture"])
        .env(env, spec.as_ref())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn helper process {entry}: {e}"));
    Helper(child)
}

/// The body of a helper process's entry point (the ignored test [`spawn_helper`]
/// starts): when `env` is set, to `URL WORD...`, connects a client to URL and runs
/// `body(client, words)` on a single-threaded runtime; when it is not (a normal test
/// run), returns at once.
pub fn helper_entry(env: &str, body: impl AsyncFnOnce(fencelock::Client, Vec<String>)) {
    let Ok(spec) = std::env::var(env) else {
        return;
    };
    let mut words = spec.split(' ').map(str::to_owned);
    let url = words.next().expect("a helper spec starts with a URL");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let client = fencelock::Client::connect(&url).await.expect("connect");
        body(client, words.collect()).await;
    });
}

/// A helper process, killed and reaped when dropped: a test that fails half-way leaves
/// none behind (one would hold the test runner's output pipe open).
pub struct Helper(pub Child);

impl std::ops::Deref for Helper {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Helper {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Everything fencelock traces, at TRACE level, as plain text in memory: the global
/// default subscriber, installed once per test binary. Global, not a thread's: with a
/// single subscriber, tracing caches each callsite's interest as the first thread to
/// reach it saw it, so another test's thread (without a subscriber) could switch
/// fencelock's events off for a thread-scoped one. Every test's events land here.
pub fn traces() -> &'static TraceLog {
    static LOG: std::sync::OnceLock<TraceLog> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log = TraceLog::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(log.clone())
            .with_ansi(false) // plain text whatever features the workspace turns on
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        log
    })
}

/// Loads the lock scripts on `client`'s connections (an acquire and a release of `name`),
/// so that the test's later attempts are one `EVALSHA` each, not `SCRIPT LOAD` and
/// `EVALSHA` (which a count of the requests reaching a server would take for two).
pub async fn load_scripts(client: &fencelock::Client, name: &str) {
    client
        .lock(name)
        .try_acquire()
        .await
        .expect("the warm-up acquire")
        .release()
        .await
        .expect("the warm-up release");
}

/// Sets the fencing counter of lock `name` (default prefix) an hour ahead of `server`'s
/// clock and returns it: each token minted from it is then exactly one higher than the
/// last, so the counter counts the grants the server made.
pub fn counter_ahead(server: &testkit::RedisServer, name: &str) -> u64 {
    let ahead = server.server_time().as_micros() as u64 + 3_600_000_000;
    server.cmd(&[
        "SET",
        &format!("fencelock:{{{name}}}:fence"),
        &ahead.to_string(),
    ]);
    ahead
}

/// Waits until the client has read the memory policy of the server at `addr` (the one
/// `INFO memory` a client sends per connection, in the background after its first call):
/// for tests that then count or hold back the requests that reach the server. The test
/// must have installed [`traces`] before the client's first call.
pub async fn memory_policy_read(addr: &str) {
    eventually(
        "the client read the memory policy",
        Duration::from_secs(5),
        async || {
            traces()
                .text()
                .lines()
                .any(|l| l.contains("memory policy read") && l.contains(addr))
        },
    )
    .await;
}

/// A `tracing-subscriber` writer into memory (see [`traces`]).
#[derive(Clone, Default)]
pub struct TraceLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl TraceLog {
    /// What was traced so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for TraceLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for TraceLog {
    type Writer = TraceLog;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// How soon a connect that cannot succeed (a TLS mistake, bad settings) must say so: a
/// refused handshake fails at once, one that never comes ends with the default
/// timeouts (about 2 s).
pub const CONNECT_PROMPT: Duration = Duration::from_secs(5);

/// Connects (eagerly) with `builder`, expecting an error within [`CONNECT_PROMPT`].
pub async fn connect_error(builder: fencelock::ClientBuilder) -> fencelock::Error {
    let started = Instant::now();
    let err = builder
        .connect()
        .await
        .expect_err("the connect should fail");
    assert!(
        started.elapsed() < CONNECT_PROMPT,
        "the error took {:?}: {err}",
        started.elapsed()
    );
    err
}

/// Asserts that `err` is a TLS failure whose message is one line, and returns the line.
#[track_caller]
pub fn tls_line(err: &fencelock::Error) -> String {
    assert!(
        matches!(
            err,
            fencelock::Error::Unavailable {
                reason: fencelock::UnavailableReason::Tls,
                ..
            }
        ),
        "expected Unavailable with reason Tls, got {err:?}"
    );
    let line = err.to_string();
    assert_eq!(line.lines().count(), 1, "one line: {line:?}");
    line
}

/// Releases `guard` and awaits `waiter`, an acquire of the same lock started (and
/// subscribed) while `guard` held it: the waiter's guard, once it is certain it came
/// within 2 s of the release, woken by it rather than by the holder's lease running out.
pub async fn handed_to(
    guard: fencelock::LockGuard,
    waiter: tokio::task::JoinHandle<Result<fencelock::LockGuard, fencelock::Error>>,
) -> fencelock::LockGuard {
    let released = Instant::now();
    guard.release().await.expect("the holder releases");
    let next = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter returns")
        .expect("the waiter's task")
        .expect("the waiter gets the lock");
    let latency = released.elapsed();
    assert!(
        latency < Duration::from_secs(2),
        "woken by the release, not by the lease running out: {latency:?}"
    );
    next
}

/// The clients on the wake list of the lock or semaphore `name` (`*` for waiting
/// readers).
pub fn listed(r: &testkit::RedisServer, name: &str) -> Vec<String> {
    let key = format!("fencelock:{{{name}}}:wakes");
    r.cmd(&["ZRANGE", &key, "0", "-1"])
        .as_array()
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// The guide's `ACL SETUSER fencelock ...` line (its security chapter), as arguments, with `password` in place
/// of its placeholder and `edit` applied to each word (`None` leaves it out): the user the
/// guide documents, read from the guide so that the two cannot drift.
pub fn guide_acl(password: &str, edit: impl Fn(&str) -> Option<String>) -> Vec<String> {
    const GUIDE: &str = include_str!("../../../../docs/guide/src/security.md");
    let line = GUIDE
        .lines()
        .find(|l| l.starts_with("ACL SETUSER fencelock "))
        .expect("the security chapter has a line starting `ACL SETUSER fencelock`");
    line.split_whitespace()
        .map(|word| match word {
            ">CHANGE-ME" => format!(">{password}"),
            _ => word.to_owned(),
        })
        .filter_map(|word| edit(&word))
        .collect()
}

/// Counts commands from now on: `INFO commandstats` reset, and every command logged in
/// `SLOWLOG` (with its arguments) from now on.
pub fn count_commands(r: &testkit::RedisServer) {
    r.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    r.cmd(&["SLOWLOG", "RESET"]);
    r.cmd(&["CONFIG", "RESETSTAT"]);
}

/// Calls per command since the last `CONFIG RESETSTAT`, from `INFO commandstats`,
/// leaving out the test's own commands.
pub fn commands_run(r: &testkit::RedisServer) -> Vec<(String, u64)> {
    let stats = r.cmd(&["INFO", "commandstats"]);
    let mut calls: Vec<(String, u64)> = stats
        .as_str()
        .expect("INFO's text")
        .lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let n = fields
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            let command = name.split('|').next()?;
            (!matches!(command, "info" | "config" | "slowlog")).then(|| (name.to_owned(), n))
        })
        .collect();
    calls.sort();
    calls
}

/// Each `EVALSHA` in `SLOWLOG` (logged with `slowlog-log-slower-than` 0), sorted: its key
/// count, and its keys and arguments in all.
pub fn script_sizes(r: &testkit::RedisServer) -> Vec<(String, usize)> {
    let log = r.cmd(&["SLOWLOG", "GET", "100"]);
    let mut sizes: Vec<(String, usize)> = log
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|entry| {
            let args = entry.as_array()?.get(3)?.as_array()?.to_vec();
            (args.first()?.as_str()?.eq_ignore_ascii_case("evalsha"))
                .then(|| (args[2].as_str().unwrap().to_owned(), args.len() - 3))
        })
        .collect();
    sizes.sort();
    sizes
}
