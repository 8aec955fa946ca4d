//! The locks benchmarked side by side: fencelock and its peers, each at its own defaults
//! and, where it has knobs, tuned; with the settings the report states, and which of them
//! a run includes. Likewise the semaphores: fencelock's and redis-semaphore's.

use std::time::Duration;

use crate::plan::SEMAPHORE_PERMITS;

/// rslock and redlock: attempts per `lock()` call (their default) and the upper bound of
/// the random pause after a failed attempt (their default: 200 ms).
pub const RUST_PEER_RETRY_COUNT: u32 = 3;
pub const RUST_PEER_DEFAULT_DELAY: Duration = Duration::from_millis(200);
/// Tuned: a random pause of 0–2 ms (1 ms on average, as redis-py's tuned sleep).
pub const RUST_PEER_TUNED_DELAY: Duration = Duration::from_millis(2);
/// redis-py `Lock(sleep=...)`: its default, and tuned.
pub const REDIS_PY_DEFAULT_SLEEP: f64 = 0.1;
pub const REDIS_PY_TUNED_SLEEP: f64 = 0.001;
/// node-redlock (npm `redlock` 5): retries after a refused try (its default `retryCount`;
/// `acquire` makes at most one more try than this, then throws).
pub const NODE_REDLOCK_RETRY_COUNT: u32 = 10;
/// node-redlock's default `retryDelay`, ms: the pause after a refused try is
/// `retryDelay ± retryJitter`.
pub const NODE_REDLOCK_DEFAULT_DELAY_MS: u32 = 200;
/// node-redlock's default `retryJitter`, ms.
pub const NODE_REDLOCK_DEFAULT_JITTER_MS: u32 = 100;
/// node-redlock tuned `retryDelay`, ms: with [`NODE_REDLOCK_TUNED_JITTER_MS`], a pause of
/// 1 ± 1 ms, the 0–2 ms of the tuned Rust peers.
pub const NODE_REDLOCK_TUNED_DELAY_MS: u32 = 1;
/// node-redlock tuned `retryJitter`, ms.
pub const NODE_REDLOCK_TUNED_JITTER_MS: u32 = 1;
/// redis-semaphore (npm) `Semaphore`: its default `retryInterval`, ms, the pause after a
/// refused try.
pub const REDIS_SEMAPHORE_DEFAULT_RETRY_MS: u32 = 10;
/// redis-semaphore's default `acquireTimeout`, ms: `tryAcquire` gives up (returns false)
/// after trying for this long.
pub const REDIS_SEMAPHORE_ACQUIRE_TIMEOUT_MS: u32 = 10_000;
/// redis-semaphore tuned `retryInterval`, ms (the 1 ms of the other tuned pollers).
pub const REDIS_SEMAPHORE_TUNED_RETRY_MS: u32 = 1;

/// One lock under test, with its settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// fencelock, default mode.
    Fencelock,
    /// fencelock `fair()` (FIFO queue).
    FencelockFair,
    /// rslock at its defaults (retry 3 × random 0–200 ms).
    Rslock,
    /// rslock with a 0–2 ms retry pause.
    RslockTuned,
    /// redlock crate at its defaults (retry 3 × random 0–200 ms).
    Redlock,
    /// redlock crate with a 0–2 ms retry pause.
    RedlockTuned,
    /// redis-py `Lock`, `sleep=0.1` (its default).
    RedisPy,
    /// redis-py `Lock`, `sleep=0.001`.
    RedisPyTuned,
    /// python-redis-lock (BLPOP signalling; no waiting knob).
    PythonRedisLock,
    /// node-redlock at its defaults (retry 10 × 200 ± 100 ms).
    NodeRedlock,
    /// node-redlock with a 1 ± 1 ms retry pause.
    NodeRedlockTuned,
    /// fencelock's semaphore ([`SEMAPHORE_PERMITS`] permits), default mode.
    FencelockSemaphore,
    /// fencelock's fair semaphore: its waiters served in arrival order.
    FencelockSemaphoreFair,
    /// redis-semaphore's `Semaphore` at its defaults (retry every 10 ms).
    RedisSemaphore,
    /// redis-semaphore's `Semaphore` with a 1 ms retry pause.
    RedisSemaphoreTuned,
}

impl Peer {
    /// Every lock, in the order of the tables.
    pub const ALL: [Peer; 11] = [
        Peer::Fencelock,
        Peer::FencelockFair,
        Peer::Rslock,
        Peer::RslockTuned,
        Peer::Redlock,
        Peer::RedlockTuned,
        Peer::RedisPy,
        Peer::RedisPyTuned,
        Peer::PythonRedisLock,
        Peer::NodeRedlock,
        Peer::NodeRedlockTuned,
    ];

    /// Every semaphore, in the order of the semaphores' table (not in [`Peer::ALL`]:
    /// the lock tables do not have them).
    pub const SEMAPHORES: [Peer; 4] = [
        Peer::FencelockSemaphore,
        Peer::FencelockSemaphoreFair,
        Peer::RedisSemaphore,
        Peer::RedisSemaphoreTuned,
    ];

    /// The name shown in the tables and charts.
    pub fn label(self) -> &'static str {
        match self {
            Peer::Fencelock => "fencelock",
            Peer::FencelockFair => "fencelock fair()",
            Peer::Rslock => "rslock",
            Peer::RslockTuned => "rslock tuned",
            Peer::Redlock => "redlock",
            Peer::RedlockTuned => "redlock tuned",
            Peer::RedisPy => "redis-py Lock",
            Peer::RedisPyTuned => "redis-py Lock tuned",
            Peer::PythonRedisLock => "python-redis-lock",
            Peer::NodeRedlock => "node-redlock",
            Peer::NodeRedlockTuned => "node-redlock tuned",
            Peer::FencelockSemaphore => "fencelock semaphore",
            Peer::FencelockSemaphoreFair => "fencelock semaphore fair()",
            Peer::RedisSemaphore => "redis-semaphore Semaphore",
            Peer::RedisSemaphoreTuned => "redis-semaphore Semaphore tuned",
        }
    }

    /// How it waits and with which settings, for the report.
    pub fn settings(self) -> String {
        let ms = |d: Duration| d.as_millis();
        match self {
            Peer::Fencelock => "fencelock 0.1.0 (this repo), `wait_forever()`, its defaults \
                                otherwise (the watchdog renews the lease): one script call to \
                                acquire; a waiter is woken by pub/sub on release"
                .to_owned(),
            Peer::FencelockFair => "as fencelock, with `.fair()`: waiters queue in FIFO order and \
                                    the release hands the lock to the head of the queue, whose \
                                    waiter takes it from the release message"
                .to_owned(),
            Peer::Rslock => format!(
                "rslock 0.10.0, `LockManager` defaults: `acquire` loops `lock()`, which tries \
                 `SET NX PX` {RUST_PEER_RETRY_COUNT} times with a random 0–{} ms pause after \
                 each failed try (and releases on every node after each failed try)",
                ms(RUST_PEER_DEFAULT_DELAY)
            ),
            Peer::RslockTuned => format!(
                "rslock 0.10.0, `set_retry({RUST_PEER_RETRY_COUNT}, {} ms)`: random 0–{} ms pause",
                ms(RUST_PEER_TUNED_DELAY),
                ms(RUST_PEER_TUNED_DELAY)
            ),
            Peer::Redlock => format!(
                "redlock 2.0.0 (synchronous; a new TCP connection per command), defaults: \
                 `lock()` tries {RUST_PEER_RETRY_COUNT} times with a random 0–{} ms sleep after \
                 each try; waiting = `lock()` in a loop (as its `acquire`), each call on tokio's \
                 blocking pool",
                ms(RUST_PEER_DEFAULT_DELAY)
            ),
            Peer::RedlockTuned => format!(
                "redlock 2.0.0, `set_retry({RUST_PEER_RETRY_COUNT}, {})`: random 0–{} ms sleep",
                ms(RUST_PEER_TUNED_DELAY),
                ms(RUST_PEER_TUNED_DELAY)
            ),
            Peer::RedisPy => format!(
                "redis-py `Lock(sleep={REDIS_PY_DEFAULT_SLEEP})` (its default): `SET NX PX`, \
                 then a fixed sleep between tries"
            ),
            Peer::RedisPyTuned => {
                format!("redis-py `Lock(sleep={REDIS_PY_TUNED_SLEEP})`")
            }
            Peer::PythonRedisLock => "python-redis-lock `Lock(expire=10)`: `SET NX EX`, \
                                      else `BLPOP` on a signal list that the release script \
                                      pushes one element to (it wakes one waiter, no polling); \
                                      no knob for waiting"
                .to_owned(),
            Peer::NodeRedlock => format!(
                "node-redlock (npm `redlock` 5.0.0-beta.2, on ioredis), `new Redlock([client])` \
                 defaults: `acquire` runs its script (`EXISTS`, then `SET PX`) and, while \
                 refused, tries again after a random pause of {NODE_REDLOCK_DEFAULT_DELAY_MS} \
                 ± {NODE_REDLOCK_DEFAULT_JITTER_MS} ms, {NODE_REDLOCK_RETRY_COUNT} times at \
                 most (`retryCount`), then runs its release script and throws \
                 `ExecutionError`; waiting = `acquire` in a loop (it has no other way to \
                 wait); contenders are async tasks of the Node driver, each with its own \
                 ioredis client"
            ),
            Peer::NodeRedlockTuned => format!(
                "node-redlock, `retryDelay: {NODE_REDLOCK_TUNED_DELAY_MS}, retryJitter: \
                 {NODE_REDLOCK_TUNED_JITTER_MS}` (`retryCount` at its default, \
                 {NODE_REDLOCK_RETRY_COUNT}): a random pause of \
                 {NODE_REDLOCK_TUNED_DELAY_MS} ± {NODE_REDLOCK_TUNED_JITTER_MS} ms, which it \
                 rounds down to 0 or 1 ms and Node's timers make at least 1 ms"
            ),
            Peer::FencelockSemaphore => format!(
                "fencelock 0.1.0 (this repo), `semaphore(name, {SEMAPHORE_PERMITS})\
                 .lease(10 s).wait_forever()`, its defaults otherwise (the watchdog renews \
                 each permit's lease): one script call to acquire (a permit is a member of a \
                 sorted set scored with its lease's end); a refused waiter lists its client \
                 on the semaphore's wake list, and a release wakes the client listed first \
                 by a message on that client's own channel (every client when none is \
                 listed)"
            ),
            Peer::FencelockSemaphoreFair => "as fencelock semaphore, with `.fair()`: waiters \
                queue in arrival order, and a release names in its message the waiters whose \
                turn it is (one per free permit), which then take their permits"
                .to_owned(),
            Peer::RedisSemaphore => format!(
                "redis-semaphore (npm) `new Semaphore(client, key, {SEMAPHORE_PERMITS}, \
                 {{ lockTimeout: 10000 }})` (its default lease), on ioredis, its defaults \
                 otherwise: `acquire` runs its script (drop the expired holders of a sorted \
                 set scored with the client's clock, then `ZADD` if fewer than the limit) \
                 and, while refused, tries again every `retryInterval` \
                 ({REDIS_SEMAPHORE_DEFAULT_RETRY_MS} ms) until `acquireTimeout` \
                 ({REDIS_SEMAPHORE_ACQUIRE_TIMEOUT_MS} ms); a held permit is refreshed by a \
                 timer every 0.8 × `lockTimeout`; a release is one `ZREM`, no signal to the \
                 waiters; waiting = `tryAcquire` in a loop until the end of the run; \
                 contenders are async tasks of the Node driver, each with its own ioredis \
                 client and `Semaphore`"
            ),
            Peer::RedisSemaphoreTuned => format!(
                "redis-semaphore, `retryInterval: {REDIS_SEMAPHORE_TUNED_RETRY_MS}` (the \
                 other options at their defaults)"
            ),
        }
    }

    /// Whether it waits by polling with a pause of up to 100 ms or more (its rows get the
    /// longer run time, so they collect enough samples).
    pub fn slow(self) -> bool {
        matches!(
            self,
            Peer::Rslock | Peer::Redlock | Peer::RedisPy | Peer::NodeRedlock
        )
    }

    /// Runs in the Python driver rather than the Rust worker.
    pub fn python(self) -> bool {
        matches!(
            self,
            Peer::RedisPy | Peer::RedisPyTuned | Peer::PythonRedisLock
        )
    }

    /// Runs in the Node driver (`bench/js/driver.js`).
    pub fn node(self) -> bool {
        matches!(
            self,
            Peer::NodeRedlock
                | Peer::NodeRedlockTuned
                | Peer::RedisSemaphore
                | Peer::RedisSemaphoreTuned
        )
    }

    /// The arguments that select it: for the Rust worker (`--lock ...`), the Python
    /// driver (`--lock ... --sleep ...`) or the Node driver (`--lock ... --retry-...`).
    pub fn lock_args(self) -> Vec<String> {
        let v: &[&str] = match self {
            Peer::Fencelock => &["--lock", "plain"],
            Peer::FencelockFair => &["--lock", "fair"],
            Peer::Rslock => &["--lock", "rslock"],
            Peer::RslockTuned => &["--lock", "rslock-tuned"],
            Peer::Redlock => &["--lock", "redlock"],
            Peer::RedlockTuned => &["--lock", "redlock-tuned"],
            Peer::RedisPy => return redis_py(REDIS_PY_DEFAULT_SLEEP),
            Peer::RedisPyTuned => return redis_py(REDIS_PY_TUNED_SLEEP),
            Peer::PythonRedisLock => &["--lock", "python-redis-lock"],
            Peer::NodeRedlock => {
                return node_redlock(
                    NODE_REDLOCK_DEFAULT_DELAY_MS,
                    NODE_REDLOCK_DEFAULT_JITTER_MS,
                );
            }
            Peer::NodeRedlockTuned => {
                return node_redlock(NODE_REDLOCK_TUNED_DELAY_MS, NODE_REDLOCK_TUNED_JITTER_MS);
            }
            Peer::FencelockSemaphore => {
                return with_permits(&["--lock", "semaphore"]);
            }
            Peer::FencelockSemaphoreFair => {
                return with_permits(&["--lock", "fair-semaphore"]);
            }
            Peer::RedisSemaphore => {
                return redis_semaphore(REDIS_SEMAPHORE_DEFAULT_RETRY_MS);
            }
            Peer::RedisSemaphoreTuned => return redis_semaphore(REDIS_SEMAPHORE_TUNED_RETRY_MS),
        };
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// A name usable in Redis keys.
    pub fn slug(self) -> &'static str {
        match self {
            Peer::Fencelock => "fencelock",
            Peer::FencelockFair => "fencelock-fair",
            Peer::Rslock => "rslock",
            Peer::RslockTuned => "rslock-tuned",
            Peer::Redlock => "redlock",
            Peer::RedlockTuned => "redlock-tuned",
            Peer::RedisPy => "redis-py",
            Peer::RedisPyTuned => "redis-py-tuned",
            Peer::PythonRedisLock => "python-redis-lock",
            Peer::NodeRedlock => "node-redlock",
            Peer::NodeRedlockTuned => "node-redlock-tuned",
            Peer::FencelockSemaphore => "fencelock-semaphore",
            Peer::FencelockSemaphoreFair => "fencelock-semaphore-fair",
            Peer::RedisSemaphore => "redis-semaphore",
            Peer::RedisSemaphoreTuned => "redis-semaphore-tuned",
        }
    }
}

/// The peers of this run: all, less the Python ones when there is no interpreter and the
/// Node ones when there is no Node.
pub fn peers(python: bool, node: bool) -> Vec<Peer> {
    Peer::ALL
        .into_iter()
        .filter(|p| (python || !p.python()) && (node || !p.node()))
        .collect()
}

/// The semaphores of this run: all, less redis-semaphore when there is no Node.
pub fn semaphores(node: bool) -> Vec<Peer> {
    Peer::SEMAPHORES
        .into_iter()
        .filter(|p| node || !p.node())
        .collect()
}

fn redis_py(sleep: f64) -> Vec<String> {
    vec![
        "--lock".to_owned(),
        "redis-py".to_owned(),
        "--sleep".to_owned(),
        sleep.to_string(),
    ]
}

fn node_redlock(delay_ms: u32, jitter_ms: u32) -> Vec<String> {
    [
        "--lock",
        "node-redlock",
        "--retry-count",
        &NODE_REDLOCK_RETRY_COUNT.to_string(),
        "--retry-delay",
        &delay_ms.to_string(),
        "--retry-jitter",
        &jitter_ms.to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// `args`, then the permits of every semaphore under test.
fn with_permits(args: &[&str]) -> Vec<String> {
    args.iter()
        .map(|s| (*s).to_owned())
        .chain(["--permits".to_owned(), SEMAPHORE_PERMITS.to_string()])
        .collect()
}

fn redis_semaphore(retry_ms: u32) -> Vec<String> {
    let mut args = with_permits(&["--lock", "redis-semaphore"]);
    args.extend(["--retry-interval".to_owned(), retry_ms.to_string()]);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_peers_get_their_sleep_settings() {
        assert_eq!(
            Peer::RedisPy.lock_args(),
            ["--lock", "redis-py", "--sleep", "0.1"]
        );
        assert_eq!(
            Peer::RedisPyTuned.lock_args(),
            ["--lock", "redis-py", "--sleep", "0.001"]
        );
        assert!(Peer::ALL.iter().filter(|p| p.python()).count() == 3);
    }

    #[test]
    fn node_peers_get_their_retry_settings() {
        assert_eq!(
            Peer::NodeRedlock.lock_args(),
            [
                "--lock",
                "node-redlock",
                "--retry-count",
                "10",
                "--retry-delay",
                "200",
                "--retry-jitter",
                "100"
            ]
        );
        assert_eq!(
            Peer::NodeRedlockTuned.lock_args()[5..],
            ["1", "--retry-jitter", "1"]
        );
        assert!(Peer::ALL.iter().all(|p| !(p.python() && p.node())));
        assert_eq!(peers(true, false).len(), Peer::ALL.len() - 2);
        assert_eq!(peers(false, true).len(), Peer::ALL.len() - 3);
    }

    #[test]
    fn semaphores_get_their_permits_and_retry_settings() {
        assert_eq!(
            Peer::FencelockSemaphore.lock_args(),
            ["--lock", "semaphore", "--permits", "4"]
        );
        assert_eq!(
            Peer::RedisSemaphore.lock_args(),
            [
                "--lock",
                "redis-semaphore",
                "--permits",
                "4",
                "--retry-interval",
                "10"
            ]
        );
        assert_eq!(Peer::RedisSemaphoreTuned.lock_args()[5], "1");
        assert!(Peer::SEMAPHORES.iter().all(|p| !Peer::ALL.contains(p)));
        assert_eq!(
            semaphores(false),
            [Peer::FencelockSemaphore, Peer::FencelockSemaphoreFair]
        );
        assert_eq!(semaphores(true).len(), Peer::SEMAPHORES.len());
    }
}
