//! Two versions of fencelock side by side on one Redis (a rolling deploy): the scripts
//! of an earlier version, kept under `tests/compat/<version>/` exactly as that version
//! sent them, run by hand with `EVAL` next to this version's client. A lock taken by
//! either is respected by the other, and a release by either wakes the other's waiter.
//! The key layout and the scripts' KEYS and ARGV that these calls use are the
//! compatibility promise of the guide's upgrading chapter; a change that breaks it fails
//! here.
//!
//! `FENCELOCK_SNAPSHOT=DIR cargo test --test compat snapshot -- --ignored` writes this
//! version's scripts to DIR (done for each release, which becomes the next one's
//! earlier version).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use fencelock::{Client, Error};
use testkit::RedisServer;

/// The earlier versions whose scripts are kept: `tests/compat/<dir>/`.
fn versions() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "no earlier version under {}",
        root.display()
    );
    dirs
}

/// An earlier version's script, as it sent it.
fn script(version: &Path, name: &str) -> String {
    let path = version.join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The keys of the lock `name` under the default prefix.
struct Keys {
    lock: String,
    fence: String,
    info: String,
    writers: String,
    wakes: String,
    channel: String,
}

fn keys(name: &str) -> Keys {
    let base = format!("fencelock:{{{name}}}");
    Keys {
        lock: base.clone(),
        fence: format!("{base}:fence"),
        info: format!("{base}:holder"),
        writers: format!("{base}:writers"),
        wakes: format!("{base}:wakes"),
        channel: format!("{base}:released"),
    }
}

/// An earlier version's acquire of the plain lock `name` with a 30 s lease; its reply's
/// code (1 granted, 0 held) and value (the fencing token, or the holder's ms left).
/// `listed`: a waiting acquire's client tag, which a refusal puts on the wake list.
fn old_acquire(
    r: &RedisServer,
    version: &Path,
    name: &str,
    token: &str,
    listed: &str,
) -> (i64, i64) {
    let k = keys(name);
    let lua = script(version, "lock/acquire.lua");
    let mut args = vec![
        "EVAL", &lua, "5", &k.lock, &k.fence, &k.info, &k.writers, &k.wakes, token, "30000", "0",
        "", "0", "0", "0",
    ];
    if !listed.is_empty() {
        args.extend([listed, "2000", "0", "0"]);
    }
    let reply = r.cmd(&args);
    let parts = reply
        .as_array()
        .unwrap_or_else(|| panic!("{}: acquire replied {reply:?}", version.display()));
    (
        parts[0].as_int().expect("code"),
        parts[1].as_int().expect("value"),
    )
}

/// An earlier version's release of `name` held with `token`: 1 released, 0 absent, -1
/// someone else's.
fn old_release(r: &RedisServer, version: &Path, name: &str, token: &str) -> i64 {
    let k = keys(name);
    let lua = script(version, "lock/release.lua");
    r.cmd(&[
        "EVAL", &lua, "4", &k.lock, &k.fence, &k.info, &k.wakes, token, &k.channel, "0", "0",
    ])
    .as_int()
    .unwrap_or_else(|| panic!("{}: release did not answer an integer", version.display()))
}

const OLD: &str = "0123456789abcdef0123456789abcdef";

#[tokio::test]
async fn a_lock_taken_by_an_earlier_version_is_respected() {
    let r = RedisServer::start();
    let client = Client::connect(&r.url()).await.unwrap();
    for version in versions() {
        let (code, old_token) = old_acquire(&r, &version, "job", OLD, "");
        assert_eq!(
            code,
            1,
            "{}: the earlier version takes the lock",
            version.display()
        );
        match client.lock("job").try_acquire().await {
            Err(Error::Held { .. }) => {}
            other => panic!(
                "{}: this version took a held lock: {other:?}",
                version.display()
            ),
        }
        let status = client.inspect("job").await.unwrap();
        let state = status.nodes[0].state.as_ref().unwrap();
        assert!(state.holder.is_some(), "inspect sees the holder: {state:?}");
        assert_eq!(old_release(&r, &version, "job", OLD), 1);
        let guard = client.lock("job").try_acquire().await.unwrap();
        assert!(
            guard.fencing_token().get() > old_token as u64,
            "{}: tokens go on rising across versions",
            version.display()
        );
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn an_earlier_version_respects_this_versions_lock() {
    let r = RedisServer::start();
    let client = Client::connect(&r.url()).await.unwrap();
    for version in versions() {
        let guard = client.lock("job").try_acquire().await.unwrap();
        let (code, left) = old_acquire(&r, &version, "job", OLD, "");
        assert_eq!(
            code,
            0,
            "{}: the earlier version took a held lock",
            version.display()
        );
        assert!(left > 0, "the holder's lease left: {left}");
        assert_eq!(
            old_release(&r, &version, "job", OLD),
            -1,
            "not its lock to release"
        );
        assert!(r.exists("fencelock:{job}"));
        guard.release().await.unwrap();
        let (code, token) = old_acquire(&r, &version, "job", OLD, "");
        assert_eq!(code, 1);
        assert!(token as u64 > 0);
        assert_eq!(old_release(&r, &version, "job", OLD), 1);
    }
}

#[tokio::test]
async fn an_earlier_versions_release_wakes_this_versions_waiter() {
    let r = RedisServer::start();
    let client = Client::connect(&r.url()).await.unwrap();
    for version in versions() {
        let (code, _) = old_acquire(&r, &version, "job", OLD, "");
        assert_eq!(code, 1);
        // Waits up to 10 s for a lock whose lease has 30 s left: only a release that
        // wakes it gets it the lock in time.
        let waiter = tokio::spawn({
            let client = client.clone();
            async move {
                client
                    .lock("job")
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
            }
        });
        common::eventually("the waiter listed", Duration::from_secs(5), async || {
            !common::listed(&r, "job").is_empty()
        })
        .await;
        assert_eq!(old_release(&r, &version, "job", OLD), 1);
        let guard = waiter
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{}: the waiter was not woken: {e}", version.display()));
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn this_versions_release_wakes_an_earlier_versions_waiter() {
    let r = RedisServer::start();
    let client = Client::connect(&r.url()).await.unwrap();
    let k = keys("job");
    let redis = redis::Client::open(r.url()).unwrap();
    for version in versions() {
        let guard = client.lock("job").try_acquire().await.unwrap();
        // The earlier version's waiter: its client listens on its own channel, and its
        // refused attempt lists it.
        let tag = "fedcba9876543210";
        let mut conn = redis.get_connection().unwrap();
        let mut messages = conn.as_pubsub();
        messages.subscribe(format!("{}:{tag}", k.channel)).unwrap();
        messages
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let (code, _) = old_acquire(&r, &version, "job", OLD, tag);
        assert_eq!(code, 0);
        assert_eq!(common::listed(&r, "job"), [tag]);
        guard.release().await.unwrap();
        let message = messages.get_message().unwrap_or_else(|e| {
            panic!(
                "{}: no wake on the waiter's own channel: {e}",
                version.display()
            )
        });
        assert_eq!(message.get_channel_name(), format!("{}:{tag}", k.channel));
        let (code, _) = old_acquire(&r, &version, "job", OLD, tag);
        assert_eq!(code, 1, "the woken waiter takes the lock");
        assert_eq!(old_release(&r, &version, "job", OLD), 1);
    }
}

/// The scripts kept of each version: those the tests above run.
const KEPT: [&str; 2] = ["lock/acquire.lua", "lock/release.lua"];

/// Writes this version's [`KEPT`] scripts (as [`fencelock::lua_scripts`] gives them)
/// under `$FENCELOCK_SNAPSHOT`; does nothing without it.
#[test]
#[ignore = "writes the scripts of a release: FENCELOCK_SNAPSHOT=DIR"]
fn snapshot() {
    let Some(dir) = std::env::var_os("FENCELOCK_SNAPSHOT") else {
        return;
    };
    for (name, source) in fencelock::lua_scripts().filter(|(n, _)| KEPT.contains(n)) {
        let path = Path::new(&dir).join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, source).unwrap();
    }
}
