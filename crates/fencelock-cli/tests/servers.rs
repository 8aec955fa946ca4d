//! The compatibility suite: every primitive of the library and every command of the CLI
//! on every server build users run (Redis 6.2, Redis 7.0, Valkey 9.1) in every topology
//! (one server, a Sentinel group, a Cluster): 9 pairs, each rig started once and a
//! matrix of short cases run against it, with a waiter's wake-up after a release
//! measured. Prints the matrix, the wake-up table and every failure at the end of the
//! run; fails if any case failed.
//!
//! `FENCELOCK_TEST_SERVERS` chooses the builds (testkit's `ServerBuild::from_env`:
//! `redis-6.2`, `redis-7`, `valkey-9.1` or the path of a server binary of your own,
//! comma-separated; all three by default); Redis 6.2 and Valkey 9.1 are fetched by
//! `scripts/servers`. Arguments choose pairs and cases by substring, as test filters do:
//!
//! ```text
//! FENCELOCK_TEST_SERVERS=/opt/redis/bin/redis-server cargo test -p fencelock-cli --test servers
//! cargo test -p fencelock-cli --test servers -- valkey cluster   # Valkey's pairs, and every Cluster
//! cargo test -p fencelock-cli --test servers -- --list
//! ```
//!
//! A waiter's wake-up: the time from the holder's release call to the waiter holding the
//! lock, p50 over [`HANDOFFS`] handoffs each for a plain and a fair waiter. The case
//! asserts by events (the library's `fencelock_waiter_wakeups_total` metric, recorded
//! per pair), not by times: every handoff woke the waiter by the release notification
//! and none by its timer. The measurements run one pair at a time; the rest of the
//! suite runs pairs side by side.

mod common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{Run, fencelock_with};
use fencelock::observe::{ACQUIRE_CONTENDED, WAITER_WAKEUPS};
use fencelock::{Client, Error, FencingToken};
use futures_util::FutureExt;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use testkit::{Cluster, RedisServer, SentinelGroup, ServerBuild};

/// Handoffs measured per waiter kind and pair.
const HANDOFFS: usize = 30;
/// The longest a case may take before it counts as failed (a hang must not stall the
/// suite).
const CASE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pairs run side by side.
const WORKERS: usize = 3;

/// How the servers are deployed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topology {
    Standalone,
    Sentinel,
    Cluster,
}

impl Topology {
    const ALL: [Topology; 3] = [Self::Standalone, Self::Sentinel, Self::Cluster];

    fn name(self) -> &'static str {
        match self {
            Self::Standalone => "standalone",
            Self::Sentinel => "sentinel",
            Self::Cluster => "cluster",
        }
    }
}

/// A started deployment.
enum Rig {
    Standalone(RedisServer),
    Sentinel(SentinelGroup),
    Cluster(Cluster),
}

impl Rig {
    fn start(build: &ServerBuild, topology: Topology) -> Rig {
        let build = build.clone();
        match topology {
            Topology::Standalone => Rig::Standalone(RedisServer::builder().server(build).start()),
            Topology::Sentinel => Rig::Sentinel(SentinelGroup::builder().server(build).start()),
            Topology::Cluster => Rig::Cluster(Cluster::builder().server(build).start()),
        }
    }

    fn url(&self) -> String {
        match self {
            Rig::Standalone(server) => server.url(),
            Rig::Sentinel(group) => group.url(),
            Rig::Cluster(cluster) => cluster.url(),
        }
    }

    /// The server that holds `key` now: for reading what a write left.
    fn node_for(&self, key: &str) -> &RedisServer {
        match self {
            Rig::Standalone(server) => server,
            Rig::Sentinel(group) => group.master(),
            Rig::Cluster(cluster) => cluster.node_for_key(key),
        }
    }
}

/// What a case gets: the rig, and the pair's metrics.
struct Ctx {
    rig: Rig,
    metrics: RefCell<Counters>,
    /// The wake-ups measured: (kind, p50, timer wake-ups).
    wakes: RefCell<Vec<Wake>>,
}

impl Ctx {
    async fn client(&self) -> Client {
        Client::connect(&self.rig.url())
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.rig.url()))
    }

    /// `fencelock args` against this rig, to the end.
    fn fencelock(&self, args: &[&str]) -> Run {
        let url = self.rig.url();
        fencelock_with(&with_redis(args, &url), &[])
    }

    fn counter(&self, name: &str, label: (&str, &str)) -> u64 {
        self.metrics.borrow_mut().get(name, label)
    }
}

/// `args` with `--redis url` after the subcommand (its first argument).
fn with_redis<'a>(args: &[&'a str], url: &'a str) -> Vec<&'a str> {
    let mut out = vec![args[0], "--redis", url];
    out.extend(&args[1..]);
    out
}

/// The counters of one pair's `DebuggingRecorder`, kept as totals: each snapshot drains
/// what it returns.
struct Counters {
    snapshotter: Snapshotter,
    totals: HashMap<(String, Vec<(String, String)>), u64>,
}

impl Counters {
    fn get(&mut self, name: &str, (key, value): (&str, &str)) -> u64 {
        for (k, _, _, v) in self.snapshotter.snapshot().into_vec() {
            if let DebugValue::Counter(n) = v {
                let key = k.key();
                let labels = key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                *self
                    .totals
                    .entry((key.name().to_owned(), labels))
                    .or_default() += n;
            }
        }
        self.totals
            .iter()
            .filter(|((n, labels), _)| {
                n == name && labels.iter().any(|(k, v)| k == key && v == value)
            })
            .map(|(_, n)| n)
            .sum()
    }
}

/// One wake-up measurement.
struct Wake {
    kind: &'static str,
    p50: Duration,
    timer: u64,
}

type CaseFn = for<'a> fn(&'a Ctx) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

/// A case of the matrix.
struct Case {
    name: &'static str,
    run: CaseFn,
    /// Measures time: runs while no other pair runs a measuring case.
    measures: bool,
}

macro_rules! case {
    ($name:literal, $f:ident) => {
        Case {
            name: $name,
            run: |cx| Box::pin($f(cx)),
            measures: false,
        }
    };
    ($name:literal, $f:ident, measures) => {
        Case {
            measures: true,
            ..case!($name, $f)
        }
    };
}

const CASES: &[Case] = &[
    case!("plain", plain),
    case!("reentrant", reentrant),
    case!("semaphore", semaphore),
    case!("read-write", read_write),
    case!("lock_all", lock_all),
    case!("election", election),
    case!("delay queue", delay_queue),
    case!("fenced write", fenced_write),
    case!("admin status/list/break", admin),
    case!("wake-up plain", wake_plain, measures),
    case!("wake-up fair", wake_fair, measures),
    case!("cli run", cli_run),
    case!("cli elect", cli_elect),
    case!("cli write", cli_write),
    case!("cli status", cli_status),
    case!("cli list", cli_list),
    case!("cli break", cli_break),
];

// ---------------------------------------------------------------------------------------
// The library's cases. Each uses lock names of its own.

fn held<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) {
    assert!(
        matches!(result, Err(Error::Held { .. })),
        "{what}: expected Error::Held, got {result:?}"
    );
}

/// A lock for one owner at a time: refused to a second, extended, released, then
/// taken by the other with a higher fencing token.
async fn plain(cx: &Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let mut guard = a.lock("plain").try_acquire().await.expect("acquire");
    held("a second owner", b.lock("plain").try_acquire().await);
    guard.extend(Duration::from_secs(20)).await.expect("extend");
    let token = guard.fencing_token();
    guard.release().await.expect("release");
    let next = b
        .lock("plain")
        .try_acquire()
        .await
        .expect("free after release");
    assert!(next.fencing_token() > token, "tokens increase");
    next.release().await.expect("release");
}

/// One owner holds a reentrant lock several times (from two clients); another owner
/// gets it after the last release only.
async fn reentrant(cx: &Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let first = a.lock("re").reentrant("owner-1").try_acquire().await;
    let first = first.expect("the owner's first hold");
    let second = b.lock("re").reentrant("owner-1").try_acquire().await;
    let second = second.expect("the owner's second hold");
    held(
        "another owner",
        b.lock("re").reentrant("owner-2").try_acquire().await,
    );
    first.release().await.expect("release one hold");
    held(
        "another owner after one release",
        b.lock("re").reentrant("owner-2").try_acquire().await,
    );
    second.release().await.expect("release the last hold");
    let other = b.lock("re").reentrant("owner-2").try_acquire().await;
    other
        .expect("free after the last release")
        .release()
        .await
        .unwrap();
}

/// Two permits: two holders, a third refused until one releases.
async fn semaphore(cx: &Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let one = a.semaphore("sem", 2).try_acquire().await.expect("permit 1");
    let two = b.semaphore("sem", 2).try_acquire().await.expect("permit 2");
    held("a third permit", a.semaphore("sem", 2).try_acquire().await);
    one.release().await.expect("release a permit");
    let three = b.semaphore("sem", 2).try_acquire().await;
    three
        .expect("a permit after a release")
        .release()
        .await
        .unwrap();
    two.release().await.unwrap();
}

/// Readers share, a writer waits for them, readers wait for the writer.
async fn read_write(cx: &Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let r1 = a.read_lock("rw").try_acquire().await.expect("reader 1");
    let r2 = b.read_lock("rw").try_acquire().await.expect("reader 2");
    held("a writer while read", a.lock("rw").try_acquire().await);
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let writer = a.lock("rw").try_acquire().await.expect("the writer");
    held(
        "a reader while written",
        b.read_lock("rw").try_acquire().await,
    );
    writer.release().await.unwrap();
    let r3 = b
        .read_lock("rw")
        .try_acquire()
        .await
        .expect("a reader after");
    r3.release().await.unwrap();
}

/// Several locks at once, all or none (on a Cluster the names lie in several slots).
async fn lock_all(cx: &Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let names = ["multi:a", "multi:b", "multi:c", "multi:d"];
    let other = b.lock("multi:c").try_acquire().await.expect("one of them");
    held(
        "all while one is held",
        a.lock_all(names).try_acquire().await,
    );
    // None was kept.
    let free = b.lock("multi:a").try_acquire().await;
    free.expect("none taken by the refused lock_all")
        .release()
        .await
        .unwrap();
    other.release().await.unwrap();
    let all = a.lock_all(names).try_acquire().await.expect("all of them");
    assert_eq!(all.names().count(), names.len());
    for name in names {
        held(name, b.lock(name).try_acquire().await);
    }
    all.release().await.expect("release all");
    let again = b.lock("multi:d").try_acquire().await;
    again.expect("free after").release().await.unwrap();
}

/// One leader; a standby woken by the resignation leads with a higher term.
async fn election(cx: &Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let first = a.election("elect").holder_info("a").campaign().await;
    let first = first.expect("the first campaign leads");
    let leader = b.election("elect").leader().await.expect("read the leader");
    assert_eq!(leader.map(|l| l.term), Some(first.term()));
    let standby = tokio::spawn(b.election("elect").holder_info("b").campaign());
    wait_for("the standby waits", async || b.stats().waiters == 1).await;
    let term = first.term();
    first.resign().await.expect("resign");
    let second = standby.await.unwrap().expect("the standby leads");
    assert!(second.term() > term, "terms increase");
    second.resign().await.unwrap();
    let nobody = a.election("elect").leader().await.expect("read the leader");
    assert_eq!(nobody, None);
}

/// An item due now is delivered, acknowledged, gone; one due later waits.
async fn delay_queue(cx: &Ctx) {
    let a = cx.client().await;
    let queue = a.delay_queue("jobs").expect("a queue");
    queue.push(b"now", Duration::ZERO).await.expect("push");
    queue
        .push(b"later", Duration::from_secs(600))
        .await
        .expect("push");
    let item = queue.take(Duration::from_secs(30)).await.expect("take");
    let item = item.expect("the item due now");
    assert_eq!(item.payload(), b"now");
    assert!(item.ack().await.expect("ack"), "acknowledged");
    let next = queue.take(Duration::from_secs(30)).await.expect("take");
    assert!(next.is_none(), "the later item is not due: {next:?}");
    assert_eq!(queue.counts().await.expect("counts").total(), 1);
}

/// A fenced write with the holder's token applies; one with an older token is refused
/// whole.
async fn fenced_write(cx: &Ctx) {
    let a = cx.client().await;
    let guard = a.lock("res").try_acquire().await.expect("acquire");
    let token = guard.fencing_token();
    let replies = a
        .fenced_write("res", token)
        .set("{res}:count", "17")
        .incr_by("{res}:sold", 2)
        .apply()
        .await
        .expect("the holder's write");
    assert_eq!(replies.len(), 2);
    let stale = a
        .fenced_write("res", FencingToken::new(token.get() - 1))
        .set("{res}:count", "0")
        .apply()
        .await;
    assert!(
        matches!(stale, Err(Error::Fenced { .. })),
        "an older token: {stale:?}"
    );
    let node = cx.rig.node_for("{res}:count");
    assert_eq!(node.get("{res}:count").as_deref(), Some("17"));
    guard.release().await.unwrap();
}

/// What an operator does: inspect a held lock, find it in a listing, break it.
async fn admin(cx: &Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let guard = a.lock("adm").holder_info("me").try_acquire().await;
    let guard = guard.expect("acquire");
    let status = b.inspect("adm").await.expect("inspect");
    let state = status.nodes[0].state.as_ref().expect("the node answers");
    assert!(state.holder.is_some(), "held: {status:?}");
    assert_eq!(state.holder_info.as_deref(), Some("me"));
    let listing = b.list("adm*").await.expect("list");
    assert!(
        listing.locks.iter().any(|l| l.name == "adm"),
        "listed: {listing:?}"
    );
    assert!(listing.unanswered.is_empty(), "{listing:?}");
    let broken = b.break_lock("adm").await.expect("break");
    let outcome = broken.nodes[0].outcome.as_ref().expect("broken");
    assert!(outcome.broke.is_some(), "it broke a holder: {broken:?}");
    assert!(outcome.fencing_counter > Some(guard.fencing_token().get()));
    let after = b
        .lock("adm")
        .try_acquire()
        .await
        .expect("free after the break");
    after.release().await.unwrap();
    drop(guard);
}

/// Measures [`HANDOFFS`] handoffs from a holder to a waiter (fair or not) on two
/// clients, and asserts that the release notification woke the waiter each time.
async fn wake(cx: &Ctx, kind: &'static str, fair: bool) {
    let (holder, waiter) = (cx.client().await, cx.client().await);
    let name = format!("wake-{kind}");
    let lock = |c: &Client| {
        let b = c.lock(name.clone()).lease(Duration::from_secs(30));
        if fair { b.fair() } else { b }
    };
    let mode = ("mode", if fair { "fair" } else { "plain" });
    let notified_before = cx.counter(WAITER_WAKEUPS, ("by", "notification"));
    let timer_before = cx.counter(WAITER_WAKEUPS, ("by", "timer"));
    let mut times = Vec::with_capacity(HANDOFFS);
    for _ in 0..HANDOFFS {
        let held = lock(&holder)
            .try_acquire()
            .await
            .expect("the holder's acquire");
        let refused = cx.counter(ACQUIRE_CONTENDED, mode);
        let waiting = lock(&waiter).wait(Duration::from_secs(10)).acquire();
        let waiting = tokio::spawn(async move {
            let guard = waiting.await;
            (Instant::now(), guard)
        });
        // The waiter's first attempt found the lock held: it waits now.
        wait_for("the waiter is refused once", async || {
            cx.counter(ACQUIRE_CONTENDED, mode) > refused
        })
        .await;
        let released = Instant::now();
        held.release().await.expect("release");
        let (got, guard) = waiting.await.unwrap();
        times.push(got - released);
        guard.expect("the waiter holds").release().await.unwrap();
    }
    let notified = cx.counter(WAITER_WAKEUPS, ("by", "notification")) - notified_before;
    let timer = cx.counter(WAITER_WAKEUPS, ("by", "timer")) - timer_before;
    times.sort();
    cx.wakes.borrow_mut().push(Wake {
        kind,
        p50: times[times.len() / 2],
        timer,
    });
    assert_eq!(
        timer, 0,
        "{timer} wake-ups by the waiter's timer in {HANDOFFS} handoffs \
         ({notified} by notification): releases are not announced to it"
    );
    // A release that lands between the waiter's refusal and its pause sends it
    // straight to its next attempt, with no pause to end: most handoffs, not all,
    // count a wake-up.
    assert!(
        notified > HANDOFFS as u64 / 2,
        "{notified} wake-ups by notification in {HANDOFFS} handoffs"
    );
}

async fn wake_plain(cx: &Ctx) {
    wake(cx, "plain", false).await;
}

async fn wake_fair(cx: &Ctx) {
    wake(cx, "fair", true).await;
}

/// Polls (bounded, 10 s) until `cond` holds.
async fn wait_for(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond().await {
        assert!(Instant::now() < deadline, "{what}: not within 10s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

// ---------------------------------------------------------------------------------------
// The CLI's cases: the real binary against the rig.

/// `run` in each of its modes: plain, waiting fair, semaphore, shared, several names.
async fn cli_run(cx: &Ctx) {
    let token = cx.fencelock(&["run", "cli-run", "--", "sh", "-c", "echo $FENCELOCK_TOKEN"]);
    let token = token.succeeded().trim().to_owned();
    assert!(token.parse::<u64>().is_ok(), "a token: {token:?}");
    for mode in [
        &["--fair", "--wait", "5s"][..],
        &["--permits", "2"],
        &["--shared"],
    ] {
        // One name per mode: a name is one kind of primitive.
        let name = format!("cli-run{}", mode[0]);
        let mut args = vec!["run"];
        args.extend(mode);
        args.extend([name.as_str(), "--", "echo", "ran"]);
        cx.fencelock(&args).ran();
    }
    let several = cx.fencelock(&[
        "run",
        "cli-a",
        "cli-b",
        "cli-c",
        "--",
        "sh",
        "-c",
        "echo $FENCELOCK_NAMES",
    ]);
    assert_eq!(several.succeeded(), "cli-a cli-b cli-c\n");
}

/// `elect` leads, runs its command with the term, resigns.
async fn cli_elect(cx: &Ctx) {
    let run = cx.fencelock(&[
        "elect",
        "cli-elect",
        "--",
        "sh",
        "-c",
        "echo $FENCELOCK_TERM",
    ]);
    let term = run.succeeded().trim().to_owned();
    assert!(term.parse::<u64>().is_ok(), "a term: {term:?}");
    let b = cx.client().await;
    let leader = b.election("cli-elect").leader().await.expect("read");
    assert_eq!(leader, None, "resigned at the end");
}

/// `write` applies with a current token, refuses an older one with exit status 76.
async fn cli_write(cx: &Ctx) {
    let ok = cx.fencelock(&[
        "write",
        "--resource",
        "cli-res",
        "--token",
        "5",
        "SET",
        "{cli-res}:k",
        "v",
    ]);
    assert_eq!(ok.succeeded(), "OK\n");
    let stale = cx.fencelock(&[
        "write",
        "--resource",
        "cli-res",
        "--token",
        "4",
        "SET",
        "{cli-res}:k",
        "w",
    ]);
    stale.fails_with(76);
    assert_eq!(
        cx.rig.node_for("{cli-res}:k").get("{cli-res}:k").as_deref(),
        Some("v")
    );
}

/// A lock held by the library, for the operator commands.
async fn held_by_library(cx: &Ctx, name: &str) -> (Client, fencelock::LockGuard) {
    let a = cx.client().await;
    let guard = a.lock(name).holder_info("suite").try_acquire().await;
    (a, guard.expect("acquire"))
}

/// `status --json` of a held lock says it is held.
async fn cli_status(cx: &Ctx) {
    let (_a, guard) = held_by_library(cx, "cli-status").await;
    let run = cx.fencelock(&["status", "--json", "cli-status"]);
    let json: serde_json::Value = serde_json::from_str(run.succeeded()).expect("JSON");
    assert_eq!(json["held"], true, "{json}");
    guard.release().await.unwrap();
}

/// `list --json` finds a held lock.
async fn cli_list(cx: &Ctx) {
    let (_a, guard) = held_by_library(cx, "cli-list").await;
    let run = cx.fencelock(&["list", "--json", "cli-list*"]);
    let json: serde_json::Value = serde_json::from_str(run.succeeded()).expect("JSON");
    let names: Vec<&str> = json["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(names, ["cli-list"], "{json}");
    guard.release().await.unwrap();
}

/// `break --yes` frees a held lock and fences its holder out.
async fn cli_break(cx: &Ctx) {
    let (a, guard) = held_by_library(cx, "cli-break").await;
    cx.fencelock(&["break", "--yes", "cli-break"]).succeeded();
    let after = a
        .lock("cli-break")
        .try_acquire()
        .await
        .expect("free after the break");
    assert!(after.fencing_token() > guard.fencing_token());
    after.release().await.unwrap();
    drop(guard);
}

/// The commands that need no server, once: `sql`, `completions`, `man`.
fn server_free_commands() -> Result<(), String> {
    catch(|| {
        let sql = fencelock_with(&["sql"], &[]);
        assert!(sql.succeeded().contains("fencelock_check"));
        let completions = fencelock_with(&["completions", "bash"], &[]);
        assert!(completions.succeeded().contains("fencelock"));
        let man = fencelock_with(&["man"], &[]);
        assert!(man.succeeded().contains(".TH"));
    })
}

// ---------------------------------------------------------------------------------------
// The runner.

/// One build x topology, and what its cases did.
struct Pair {
    build: ServerBuild,
    /// `Redis 6.2.14`.
    version: String,
    topology: Topology,
    /// Per case of [`CASES`]: `None` if filtered out.
    results: Vec<Option<Result<(), String>>>,
    wakes: Vec<Wake>,
}

impl Pair {
    fn label(&self) -> String {
        format!("{} {}", self.version, self.topology.name())
    }

    /// `6.2/sa`: the matrix's column.
    fn column(&self) -> String {
        let number = self.version.rsplit(' ').next().unwrap_or("?");
        let short: Vec<&str> = number.split('.').take(2).collect();
        let name = if self.version.starts_with("Valkey") {
            "vk"
        } else {
            ""
        };
        let topology = match self.topology {
            Topology::Standalone => "one",
            Topology::Sentinel => "sen",
            Topology::Cluster => "cl",
        };
        format!("{name}{}/{topology}", short.join("."))
    }
}

/// Measuring cases run one at a time across pairs.
static MEASURING: Mutex<()> = Mutex::new(());

thread_local! {
    /// Where this thread's last panic was, and what it said.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The panic of `f`, as its message and location.
fn catch(f: impl FnOnce()) -> Result<(), String> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|_| last_panic())
}

fn last_panic() -> String {
    LAST_PANIC
        .with(|p| p.borrow_mut().take())
        .unwrap_or_else(|| "panicked".to_owned())
}

/// Starts the rig and runs the chosen cases on it.
fn run_pair(pair: &mut Pair, chosen: &[bool]) {
    let rig =
        match std::panic::catch_unwind(AssertUnwindSafe(|| Rig::start(&pair.build, pair.topology)))
        {
            Ok(rig) => rig,
            Err(_) => {
                let why = format!("the rig did not start: {}", last_panic());
                pair.results = chosen
                    .iter()
                    .map(|&c| c.then(|| Err(why.clone())))
                    .collect();
                return;
            }
        };
    let recorder = DebuggingRecorder::new();
    let cx = Ctx {
        rig,
        metrics: RefCell::new(Counters {
            snapshotter: recorder.snapshotter(),
            totals: HashMap::new(),
        }),
        wakes: RefCell::new(Vec::new()),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    metrics::with_local_recorder(&recorder, || {
        for (case, &chosen) in CASES.iter().zip(chosen) {
            if !chosen {
                pair.results.push(None);
                continue;
            }
            let _alone = case
                .measures
                .then(|| MEASURING.lock().unwrap_or_else(|e| e.into_inner()));
            let outcome = rt.block_on(async {
                let run = AssertUnwindSafe((case.run)(&cx)).catch_unwind();
                match tokio::time::timeout(CASE_TIMEOUT, run).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(_)) => Err(last_panic()),
                    Err(_) => Err(format!("did not finish within {CASE_TIMEOUT:?}")),
                }
            });
            pair.results.push(Some(outcome));
        }
    });
    pair.wakes = cx.wakes.take();
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Ignored tests only: this suite has none.
    if args.iter().any(|a| a == "--ignored") {
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let builds = ServerBuild::from_env();
    let mut pairs: Vec<Pair> = builds
        .iter()
        .flat_map(|build| {
            let version = build.version();
            Topology::ALL.into_iter().map(move |topology| Pair {
                build: build.clone(),
                version: version.clone(),
                topology,
                results: Vec::new(),
                wakes: Vec::new(),
            })
        })
        .collect();
    // A filter matching a pair runs all its cases; one matching a case runs it on every pair.
    let matches = |text: &str| filters.iter().any(|f| text.contains(f));
    let chosen: Vec<Vec<bool>> = pairs
        .iter()
        .map(|pair| {
            let whole = filters.is_empty()
                || matches(&pair.label())
                || matches(&pair.build.name())
                || matches(&pair.column());
            CASES.iter().map(|c| whole || matches(c.name)).collect()
        })
        .collect();
    if args.iter().any(|a| a == "--list") {
        for (pair, chosen) in pairs.iter().zip(&chosen) {
            for (case, _) in CASES.iter().zip(chosen).filter(|(_, c)| **c) {
                println!("{}: {}: test", pair.label(), case.name);
            }
        }
        return ExitCode::SUCCESS;
    }

    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| {
                info.payload()
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
            })
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" (at {}:{})", l.file(), l.line()))
            .unwrap_or_default();
        LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{message}{at}")));
    }));

    let started = Instant::now();
    let run_free = filters.is_empty() || matches("cli");
    let free = run_free.then(server_free_commands);

    // Clusters first: they take longest to start.
    let mut order: Vec<usize> = (0..pairs.len())
        .filter(|&i| chosen[i].iter().any(|&c| c))
        .collect();
    order.sort_by_key(|&i| match pairs[i].topology {
        Topology::Cluster => 0,
        Topology::Sentinel => 1,
        Topology::Standalone => 2,
    });
    let queue = Mutex::new(order);
    let slots: Vec<Mutex<Option<Pair>>> = pairs.drain(..).map(|p| Mutex::new(Some(p))).collect();
    std::thread::scope(|scope| {
        for worker in 0..WORKERS {
            let (queue, slots, chosen) = (&queue, &slots, &chosen);
            std::thread::Builder::new()
                .name(format!("servers-{worker}"))
                .spawn_scoped(scope, move || {
                    loop {
                        let next = queue.lock().unwrap().pop();
                        let Some(i) = next else { break };
                        let mut pair = slots[i].lock().unwrap().take().expect("a pair");
                        let t = Instant::now();
                        run_pair(&mut pair, &chosen[i]);
                        eprintln!("{}: {:.1?}", pair.label(), t.elapsed());
                        *slots[i].lock().unwrap() = Some(pair);
                    }
                })
                .expect("spawn a worker");
        }
    });
    let pairs: Vec<Pair> = slots
        .into_iter()
        .map(|s| s.into_inner().unwrap().expect("a pair"))
        .collect();
    let failed = report(&pairs, free.as_ref(), started.elapsed());
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `0.42 ms`.
fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Prints the matrix, the wake-ups and the failures; whether anything failed.
fn report(pairs: &[Pair], free: Option<&Result<(), String>>, took: Duration) -> bool {
    let ran: Vec<&Pair> = pairs
        .iter()
        .filter(|p| p.results.iter().any(Option::is_some))
        .collect();
    println!();
    println!(
        "compatibility suite: {} server x topology pairs, {:.0?}",
        ran.len(),
        took
    );
    for pair in &ran {
        println!("  {:>9} = {}", pair.column(), pair.label());
    }
    println!();
    let width = CASES.iter().map(|c| c.name.len()).max().unwrap_or(0);
    print!("{:width$}", "");
    for pair in &ran {
        print!(" {:>9}", pair.column());
    }
    println!();
    for (i, case) in CASES.iter().enumerate() {
        if ran
            .iter()
            .all(|p| p.results.get(i).is_none_or(Option::is_none))
        {
            continue;
        }
        print!("{:width$}", case.name);
        for pair in &ran {
            let cell = match pair.results.get(i) {
                Some(Some(Ok(()))) => "ok",
                Some(Some(Err(_))) => "FAIL",
                _ => "-",
            };
            print!(" {cell:>9}");
        }
        println!();
    }
    if let Some(free) = free {
        println!(
            "sql, completions, man (no server): {}",
            if free.is_ok() { "ok" } else { "FAIL" }
        );
    }

    let measured: Vec<&&Pair> = ran.iter().filter(|p| !p.wakes.is_empty()).collect();
    if !measured.is_empty() {
        println!();
        println!(
            "a waiter woken by a release: release called -> the waiter holds, p50 of {HANDOFFS} \
             handoffs (timer wake-ups, if any, in brackets)"
        );
        println!("{:24} {:>14} {:>14}", "", "plain", "fair");
        for pair in measured {
            print!("{:24}", pair.label());
            for kind in ["plain", "fair"] {
                let cell = match pair.wakes.iter().find(|w| w.kind == kind) {
                    Some(w) if w.timer > 0 => format!("{} [{}]", ms(w.p50), w.timer),
                    Some(w) => ms(w.p50),
                    None => "-".to_owned(),
                };
                print!(" {cell:>14}");
            }
            println!();
        }
    }

    let mut failed = false;
    let mut first = true;
    for pair in &ran {
        for (case, result) in CASES.iter().zip(&pair.results) {
            if let Some(Err(why)) = result {
                if first {
                    println!();
                    println!("failures:");
                    first = false;
                }
                failed = true;
                println!("  {} / {}: {why}", pair.label(), case.name);
            }
        }
    }
    if let Some(Err(why)) = free {
        failed = true;
        println!("  sql, completions, man: {why}");
    }
    println!();
    failed
}
