//! A server must not outlive a test process that is SIGKILLed (no destructors
//! run): `PR_SET_PDEATHSIG` takes it down.
//!
//! The test re-runs its own binary as a child process that starts a server,
//! reports the server's pid and directory, and blocks; the parent SIGKILLs
//! the child and watches the server disappear.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const CHILD_ENV: &str = "TESTKIT_PDEATHSIG_CHILD";
const TEST_NAME: &str = "server_dies_with_a_sigkilled_test_process";

/// Gone, or a zombie waiting for a (possibly absent) reaper: either way dead.
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'Z' | 'X')),
    }
}

#[test]
fn server_dies_with_a_sigkilled_test_process() {
    if std::env::var_os(CHILD_ENV).is_some() {
        let server = testkit::RedisServer::start();
        println!("REDIS_PID={}", server.pid());
        println!("REDIS_DIR={}", server.dir().display());
        // Block until the parent kills us.
        let _ = std::io::stdin().read_line(&mut String::new());
        return;
    }

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut pid = None;
    let mut dir = None;
    while pid.is_none() || dir.is_none() {
        // libtest prints "test NAME ... " first, on the same line.
        let line = lines
            .next()
            .expect("child exited before reporting")
            .unwrap();
        if let Some(p) = line.split_once("REDIS_PID=").map(|(_, p)| p) {
            pid = Some(p.parse::<u32>().unwrap());
        } else if let Some(d) = line.split_once("REDIS_DIR=").map(|(_, d)| d) {
            dir = Some(d.to_owned());
        }
    }
    let (pid, dir) = (pid.unwrap(), dir.unwrap());
    assert!(!dead(pid), "server {pid} not running before the kill");

    child.kill().unwrap(); // SIGKILL: no Drop runs in the child
    child.wait().unwrap();

    testkit::eventually(
        &format!("redis-server {pid} died with its SIGKILLed parent"),
        Duration::from_secs(5),
        || dead(pid),
    );
    // The child could not clean up its temp dir; do it for it.
    let _ = std::fs::remove_dir_all(dir);
}

const RIGS_CHILD_ENV: &str = "TESTKIT_PDEATHSIG_RIGS_CHILD";
const RIGS_TEST_NAME: &str = "sentinel_group_and_cluster_die_with_a_sigkilled_test_process";

/// The same for the processes of a `SentinelGroup` and a `Cluster`: every
/// data node, sentinel and cluster node dies with the test process.
#[test]
fn sentinel_group_and_cluster_die_with_a_sigkilled_test_process() {
    if std::env::var_os(RIGS_CHILD_ENV).is_some() {
        let group = testkit::SentinelGroup::start();
        let cluster = testkit::Cluster::builder().replicas_per_master(0).start();
        let servers = group
            .sentinels()
            .iter()
            .chain(group.nodes())
            .chain(cluster.nodes());
        for s in servers {
            println!("REDIS={} {}", s.pid(), s.dir().display());
        }
        println!("REDIS_END");
        let _ = std::io::stdin().read_line(&mut String::new());
        return;
    }

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", RIGS_TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(RIGS_CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut servers: Vec<(u32, String)> = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.ends_with("REDIS_END") {
            break;
        }
        if let Some((_, server)) = line.split_once("REDIS=") {
            let (pid, dir) = server.split_once(' ').unwrap();
            servers.push((pid.parse().unwrap(), dir.to_owned()));
        }
    }
    assert_eq!(servers.len(), 5 + 3, "child exited before reporting");
    assert!(servers.iter().all(|&(pid, _)| !dead(pid)));

    child.kill().unwrap(); // SIGKILL: no Drop runs in the child
    child.wait().unwrap();

    testkit::eventually(
        "every redis-server dies with its SIGKILLed parent",
        Duration::from_secs(5),
        || servers.iter().all(|&(pid, _)| dead(pid)),
    );
    // The child could not clean up its temp dirs; do it for it.
    for (_, dir) in servers {
        let _ = std::fs::remove_dir_all(dir);
    }
}
