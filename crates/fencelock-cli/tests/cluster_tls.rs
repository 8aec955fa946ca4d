//! The CLI on a Redis Cluster over TLS (`rediss+cluster://`), end to end: the real
//! binary against one shared cluster on TLS ports only (testkit's `ClusterBuilder::tls`;
//! testkit talks TLS to its nodes too), each test with lock names of its own. `run`
//! with `--cacert` runs the command under the lock; without it, exit 69 with one line
//! naming the certificate problem and the command never run (also when `run` would
//! wait); `status` and `list` over it.
//!
//! Its own file (not `tls.rs` or `cluster.rs`) so that one TLS cluster serves these
//! tests and no other test binary starts one.

use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;
use testkit::{Cluster, TlsFiles};

mod common;
use common::{arg, command, fencelock};

fn key(name: &str) -> String {
    format!("fencelock:{{{name}}}")
}

/// `--redis URL --cacert CA` for the shared TLS cluster.
fn with_ca(cluster: &Cluster) -> Vec<String> {
    let ca = TlsFiles::shared().ca_cert();
    vec![
        "--redis".to_owned(),
        cluster.url(),
        "--cacert".to_owned(),
        arg(&ca).to_owned(),
    ]
}

/// `SUB ... NAME -- COMMAND...` as arguments.
fn args<'a>(sub: &'a str, options: &'a [String], rest: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec![sub];
    all.extend(options.iter().map(String::as_str));
    all.extend_from_slice(rest);
    all
}

/// A `fencelock run --redis URL --cacert CA NAME -- sleep 60` in the background, once
/// it holds the lock; killed and reaped when dropped.
struct Holder(Child);

impl Holder {
    fn start(cluster: &Cluster, name: &str) -> Self {
        let options = with_ca(cluster);
        let child = command(&args("run", &options, &[name, "--", "sleep", "60"]), &[])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fencelock run");
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

/// With `--cacert`, `run` over rediss+cluster:// runs the command under the lock (it
/// gets a fencing token, from the counter on the master of the lock's slot) and
/// releases the lock after.
#[test]
fn run_over_a_tls_cluster_with_the_ca_runs_the_command_under_the_lock() {
    let cluster = Cluster::shared_tls();
    let options = with_ca(cluster);
    let run = fencelock(&args(
        "run",
        &options,
        &["cli-tls-run", "--", "sh", "-c", "echo ran $FENCELOCK_TOKEN"],
    ));
    let out = run.succeeded();
    let token = out
        .strip_prefix("ran ")
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("the command ran with a token: {run:#?}"));
    let owner = cluster.node_for_key(&key("cli-tls-run"));
    assert_eq!(
        owner.get(&format!("{}:fence", key("cli-tls-run"))),
        Some(token.to_string()),
        "the token is the fencing counter of the slot's master, {}",
        owner.addr()
    );
    assert!(!owner.exists(&key("cli-tls-run")), "released after");
}

/// Without `--cacert` (the system's roots do not hold testkit's CA), `run` exits 69 with
/// one line naming the untrusted CA, not "every seed is down", and the command never
/// runs; a `run --wait` says the same at once rather than when its wait ends.
#[test]
fn without_the_ca_run_exits_69_in_one_line_and_the_command_never_runs() {
    let cluster = Cluster::shared_tls();
    let url = cluster.url();
    for wait in [None, Some("60s")] {
        let mut options = vec!["--redis".to_owned(), url.clone()];
        if let Some(wait) = wait {
            options.extend(["--wait".to_owned(), wait.to_owned()]);
        }
        let run = fencelock(&args(
            "run",
            &options,
            &["cli-tls-no-ca", "--", "sh", "-c", "echo ran"],
        ));
        let line = run.fails_with(69);
        assert!(line.contains("CA this client does not trust"), "{line}");
        assert!(line.contains("--cacert"), "says what to do: {line}");
        assert!(!line.contains("every seed"), "{line}");
        assert_eq!(run.stdout, "", "the command never ran");
        assert!(
            run.took < Duration::from_secs(10),
            "--wait {wait:?}: reported after {:?}, not at once",
            run.took
        );
    }
    let owner = cluster.node_for_key(&key("cli-tls-no-ca"));
    assert!(!owner.exists(&format!("{}:fence", key("cli-tls-no-ca"))));
}

/// `status` and `list` over rediss+cluster:// with the CA see locks held on every
/// master, each named by the master of its slot; without the CA they exit 69 naming the
/// CA problem.
#[test]
fn status_and_list_work_over_a_tls_cluster() {
    let cluster = Cluster::shared_tls();
    let names: Vec<String> = (0..6).map(|i| format!("cli-tls-list-{i}")).collect();
    let masters: std::collections::BTreeSet<String> = names
        .iter()
        .map(|n| cluster.node_for_key(&key(n)).addr())
        .collect();
    assert!(masters.len() > 1, "the names span masters");
    let holders: Vec<Holder> = names.iter().map(|n| Holder::start(cluster, n)).collect();
    let options = with_ca(cluster);

    let status = fencelock(&args("status", &options, &["cli-tls-list-0"]));
    let text = status.succeeded();
    assert!(text.contains("lock \"cli-tls-list-0\": held"), "{text}");
    assert!(
        text.contains(&format!("pid {}", holders[0].0.id())),
        "who: {text}"
    );
    let json = fencelock(
        &[
            &["--json"],
            &args("status", &options, &["cli-tls-list-0"])[..],
        ]
        .concat(),
    );
    let v: Value = serde_json::from_str(json.succeeded().trim()).unwrap();
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(
        v["nodes"][0]["node"],
        cluster.node_for_key(&key("cli-tls-list-0")).addr(),
        "named by the master of its slot"
    );

    let json = fencelock(
        &[
            &["--json"],
            &args("list", &options, &["cli-tls-list-*"])[..],
        ]
        .concat(),
    );
    let all: Value = serde_json::from_str(json.succeeded().trim()).unwrap();
    let mut listed: Vec<&str> = all["locks"]
        .as_array()
        .unwrap_or_else(|| panic!("{all}"))
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    listed.sort();
    let mut expected: Vec<&str> = names.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(listed, expected);

    let url = cluster.url();
    for sub in [
        vec!["status", "--redis", &url, "cli-tls-list-0"],
        vec!["list", "--redis", &url],
    ] {
        let run = fencelock(&sub);
        assert!(
            run.fails_with(69).contains("CA this client does not trust"),
            "{run:#?}"
        );
    }
}
