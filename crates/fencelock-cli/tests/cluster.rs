//! The CLI on a Redis Cluster (`redis+cluster://`, the seeds in one comma-separated URL):
//! `run`, `status` and `list`, end to end, the real binary against one shared cluster
//! of real redis-servers (each test with lock names of its own).

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use testkit::Cluster;

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

/// Runs `fencelock args` to the end, with `FENCELOCK_REDIS` naming the cluster.
fn fencelock(cluster: &Cluster, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FENCELOCK_REDIS", cluster.url())
        .stdin(Stdio::null())
        .output()
        .expect("run fencelock")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn key(name: &str) -> String {
    format!("fencelock:{{{name}}}")
}

/// A `fencelock run NAME -- sleep 60` in the background, once it holds the lock.
struct Holder(Child);

impl Holder {
    fn start(cluster: &Cluster, name: &str) -> Self {
        let child = Command::new(BIN)
            .args(["run", "--redis", &cluster.url(), name, "--", "sleep", "60"])
            .env_remove("FENCELOCK_REDIS")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fencelock");
        let holder = Self(child);
        let owner = cluster.node_for_key(&key(name));
        testkit::eventually("the lock is taken", Duration::from_secs(10), || {
            owner.exists(&key(name))
        });
        holder
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn run_takes_the_lock_on_the_master_of_its_slot_and_releases_it() {
    let cluster = Cluster::shared();
    let out = fencelock(
        cluster,
        &["run", "cli-run", "--", "sh", "-c", "echo $FENCELOCK_TOKEN"],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).trim().parse::<u64>().is_ok(), "{out:?}");
    assert!(
        !cluster
            .node_for_key(&key("cli-run"))
            .exists(&key("cli-run"))
    );

    // A second `run` waits for the first, woken by its release (sharded pub/sub).
    let first = Holder::start(cluster, "cli-wait");
    let waiting = Command::new(BIN)
        .args(["run", "--wait", "30s", "cli-wait", "--", "true"])
        .env("FENCELOCK_REDIS", cluster.url())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fencelock");
    let mut waiting = Holder(waiting);
    let channel = format!("{}:released", key("cli-wait"));
    let owner = cluster.node_for_key(&key("cli-wait"));
    testkit::eventually("the second run waits", Duration::from_secs(10), || {
        owner
            .cmd(&["PUBSUB", "SHARDNUMSUB", &channel])
            .as_array()
            .and_then(|a| a[1].as_int())
            == Some(1)
    });
    drop(first); // killed: its lease (30 s) would outlast the test's wait
    let out = fencelock(cluster, &["break", "--yes", "cli-wait"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status = waiting.0.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn status_and_list_see_locks_on_every_master() {
    let cluster = Cluster::shared();
    let names: Vec<String> = (0..12).map(|i| format!("cli-list-{i}")).collect();
    let masters: std::collections::BTreeSet<String> = names
        .iter()
        .map(|n| cluster.node_for_key(&key(n)).addr())
        .collect();
    assert!(masters.len() > 1, "the names span masters");
    let _holders: Vec<Holder> = names.iter().map(|n| Holder::start(cluster, n)).collect();

    let out = fencelock(cluster, &["status", "cli-list-0"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("lock \"cli-list-0\": held"), "{text}");
    assert!(text.contains("sleep 60"), "who: {text}");
    let v: Value = serde_json::from_str(
        stdout(&fencelock(cluster, &["--json", "status", "cli-list-0"])).trim(),
    )
    .unwrap();
    assert_eq!(v["held"], true);
    assert_eq!(
        v["nodes"][0]["node"],
        cluster.node_for_key(&key("cli-list-0")).addr(),
        "named by the master of its slot"
    );

    let all: Value =
        serde_json::from_str(stdout(&fencelock(cluster, &["--json", "list", "cli-list-*"])).trim())
            .unwrap();
    let mut listed: Vec<&str> = all["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    listed.sort();
    let mut expected: Vec<&str> = names.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(listed, expected);
}

#[test]
fn a_plain_url_at_a_cluster_node_says_to_use_the_cluster_url() {
    let cluster = Cluster::shared();
    let masters = cluster.masters();
    let node = masters[0];
    let name = (0..1000)
        .map(|i| format!("cli-plain-{i}"))
        .find(|n| cluster.node_for_key(&key(n)).addr() != node.addr())
        .unwrap();
    let out = Command::new(BIN)
        .args(["run", "--redis", &node.url(), &name, "--", "true"])
        .env_remove("FENCELOCK_REDIS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("this is a Redis Cluster node: use redis+cluster://"),
        "{err}"
    );
}

/// The guide's local cluster recipe (topologies chapter), run as written on six ports of
/// the test's choosing: it makes a cluster, `fencelock --redis redis+cluster://...
/// run` works on it, and the stop block takes it down.
#[test]
fn the_guide_local_cluster_recipe_makes_a_cluster_fencelock_runs_on() {
    const GUIDE: &str = include_str!("../../../docs/guide/src/topologies.md");
    let section = &GUIDE[GUIDE
        .find("### A local cluster in a minute")
        .expect("the recipe")..];
    let mut blocks = section
        .split("```sh\n")
        .skip(1)
        .map(|b| &b[..b.find("\n```").unwrap()]);
    let (start, stop) = (blocks.next().unwrap(), blocks.next().unwrap());
    let ports: Vec<String> = (0..6)
        .map(|_| testkit::free_cluster_port().to_string())
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    // Whatever happens, no server outlives the test: each left its pid file under TMPDIR.
    struct Reap(std::path::PathBuf);
    impl Drop for Reap {
        fn drop(&mut self) {
            let Ok(out) = Command::new("find")
                .arg(&self.0)
                .args(["-name", "*.pid"])
                .output()
            else {
                return;
            };
            for file in String::from_utf8_lossy(&out.stdout).lines() {
                if let Ok(pid) = std::fs::read_to_string(file) {
                    let _ = Command::new("kill").args(["-9", pid.trim()]).status();
                }
            }
        }
    }
    let _reap = Reap(tmp.path().to_owned());
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .args(["-e", "-c", &format!("{start}\n{stop}\n")])
        .env("PORTS", ports.join(" "))
        .env("TMPDIR", tmp.path())
        .env("PATH", path)
        .env_remove("FENCELOCK_REDIS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "sold\n", "{out:?}");
}
