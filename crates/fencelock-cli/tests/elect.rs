//! `fencelock elect` end to end: real `fencelock` processes against a real
//! `redis-server`: one leader's COMMAND at a time, a kill -9 of the leader taken over by
//! a standby only after the old lease, terms increasing, leadership lost and won again,
//! COMMAND's own exit ending elect with its status, `status` naming the leader.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use testkit::RedisServer;

mod common;
use common::{command, fencelock};

/// Bound of every wait for an event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(15);

/// A `fencelock elect` process, killed and reaped if the test fails half-way.
struct Elector(Child);

impl Drop for Elector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one COMMAND run recorded: its pid, FENCELOCK_TERM, FENCELOCK_TOKEN,
/// FENCELOCK_NAME, and when it started (wall clock, ns).
#[derive(Debug)]
struct Started {
    pid: u32,
    term: u64,
    token: u64,
    name: String,
    at_ns: u128,
}

/// Starts `fencelock elect --redis URL --ttl TTL NAME -- COMMAND`, whose COMMAND records
/// its start in a file of `dir` and then runs `then` (a shell snippet).
fn elector(server: &RedisServer, ttl: &str, name: &str, dir: &Path, then: &str) -> Elector {
    let script = format!(
        r#"echo "$$ $FENCELOCK_TERM $FENCELOCK_TOKEN $FENCELOCK_NAME $(date +%s%N)" > "$0/started.$$.tmp" && mv "$0/started.$$.tmp" "$0/started.$$"; {then}"#
    );
    let url = server.url();
    let args = [
        "elect",
        "--redis",
        &url,
        "--ttl",
        ttl,
        name,
        "--",
        "sh",
        "-c",
        &script,
        dir.to_str().unwrap(),
    ];
    Elector(command(&args, &[]).spawn().expect("spawn fencelock elect"))
}

/// Every COMMAND start recorded in `dir`, in the order they started.
fn starts(dir: &Path) -> Vec<Started> {
    let mut found: Vec<Started> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("started.") && !name.ends_with(".tmp")
        })
        .map(|e| {
            let text = fs::read_to_string(e.path()).unwrap();
            let words: Vec<&str> = text.split_whitespace().collect();
            Started {
                pid: words[0].parse().unwrap(),
                term: words[1].parse().unwrap(),
                token: words[2].parse().unwrap(),
                name: words[3].to_owned(),
                at_ns: words[4].parse().unwrap(),
            }
        })
        .collect();
    found.sort_by_key(|s| s.at_ns);
    found
}

/// Waits until `dir` has recorded `n` starts.
fn wait_for_starts(dir: &Path, n: usize, electors: &mut [&mut Elector]) -> Vec<Started> {
    let mut found = Vec::new();
    testkit::eventually(&format!("{n} COMMAND starts"), EVENT_TIMEOUT, || {
        for e in electors.iter_mut() {
            if let Some(status) = e.0.try_wait().unwrap() {
                panic!("fencelock elect exited early: {status}");
            }
        }
        found = starts(dir);
        found.len() >= n
    });
    found
}

/// The parent of process `pid`, from `/proc`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Whether process `pid` is gone (or a zombie).
fn process_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn tempdir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    (dir, path)
}

#[test]
fn a_killed_leaders_standby_runs_command_only_after_the_old_lease_with_a_higher_term() {
    let server = RedisServer::start();
    let (_keep, dir) = tempdir();
    let ttl = Duration::from_secs(2);
    let mut a = elector(&server, "2s", "svc", &dir, "exec sleep 600");
    let mut b = elector(&server, "2s", "svc", &dir, "exec sleep 600");
    let first = wait_for_starts(&dir, 1, &mut [&mut a, &mut b]).remove(0);
    assert_eq!(first.name, "svc");
    assert_eq!(
        first.term, first.token,
        "FENCELOCK_TERM is the fencing token"
    );
    // One leader: the standby's COMMAND does not start meanwhile.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(starts(&dir).len(), 1, "two COMMANDs at once");
    // kill -9 of the leading fencelock: its lease runs out by itself.
    let leading = parent_of(first.pid).expect("COMMAND's parent");
    let (leader, standby) = if leading == a.0.id() {
        (&mut a, &mut b)
    } else {
        assert_eq!(leading, b.0.id(), "COMMAND runs under one of the electors");
        (&mut b, &mut a)
    };
    let asked_ns = now_ns();
    let pttl = server
        .cmd(&["PTTL", "fencelock:{svc}"])
        .as_int()
        .expect("PTTL");
    assert!(pttl > 0, "the leader holds the lease: {pttl}");
    leader.0.kill().unwrap();
    let killed = Instant::now();
    leader.0.wait().unwrap();
    // Its watcher takes its COMMAND down.
    testkit::eventually("the old COMMAND is gone", EVENT_TIMEOUT, || {
        process_gone(first.pid)
    });
    let second = wait_for_starts(&dir, 2, &mut [standby]).remove(1);
    let old_lease_end_ns = asked_ns + pttl as u128 * 1_000_000;
    assert!(
        second.at_ns >= old_lease_end_ns,
        "the standby's COMMAND started {} ms before the old lease ended",
        (old_lease_end_ns - second.at_ns) / 1_000_000
    );
    assert!(
        killed.elapsed() < ttl + Duration::from_secs(3),
        "took over {:?} after the kill",
        killed.elapsed()
    );
    assert!(second.term > first.term, "terms increase");
    assert_eq!(parent_of(second.pid), Some(standby.0.id()));
    // SIGTERM: COMMAND stops (sleep dies of it), fencelock resigns and exits with
    // COMMAND's status.
    let killed = Command::new("kill")
        .args(["-TERM", &standby.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = standby.0.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    assert!(!server.exists("fencelock:{svc}"), "resigned");
}

#[test]
fn a_command_that_exits_on_its_own_ends_elect_with_its_status_and_a_standby_leads_at_once() {
    let server = RedisServer::start();
    let (_keep, dir) = tempdir();
    // A long lease: only the resignation can let the standby in soon.
    let mut a = elector(
        &server,
        "60s",
        "once",
        &dir,
        r#"while [ ! -e "$0/go" ]; do sleep 0.01; done; exit 3"#,
    );
    let first = wait_for_starts(&dir, 1, &mut [&mut a]).remove(0);
    let mut b = elector(&server, "60s", "once", &dir, "exec sleep 600");
    testkit::eventually("the standby campaigns", EVENT_TIMEOUT, || {
        server
            .cmd(&["ZCARD", "fencelock:{once}:wakes"])
            .as_int()
            .is_some_and(|n| n == 1)
    });
    fs::write(dir.join("go"), "").unwrap();
    let exited = Instant::now();
    let status = a.0.wait().unwrap();
    assert_eq!(status.code(), Some(3), "COMMAND's status");
    let second = wait_for_starts(&dir, 2, &mut [&mut b]).remove(1);
    assert!(
        exited.elapsed() < Duration::from_secs(30),
        "woken by the resignation"
    );
    assert!(second.term > first.term);
}

#[test]
fn lost_leadership_stops_command_and_elect_campaigns_and_leads_again() {
    let server = RedisServer::start();
    let (_keep, dir) = tempdir();
    let mut a = elector(&server, "3s", "lost", &dir, "exec sleep 600");
    let first = wait_for_starts(&dir, 1, &mut [&mut a]).remove(0);
    // An operator breaks the lock: the next renewal finds it gone.
    fencelock(&["break", "--redis", &server.url(), "--yes", "lost"]).succeeded();
    testkit::eventually("the old COMMAND is stopped", EVENT_TIMEOUT, || {
        process_gone(first.pid)
    });
    let second = wait_for_starts(&dir, 2, &mut [&mut a]).remove(1);
    assert!(second.term > first.term, "a new term after the break");
    assert_eq!(parent_of(second.pid), Some(a.0.id()), "the same elector");
}

#[test]
fn status_names_the_leader_with_its_term() {
    let server = RedisServer::start();
    let (_keep, dir) = tempdir();
    let mut a = elector(&server, "30s", "shown", &dir, "exec sleep 600");
    let first = wait_for_starts(&dir, 1, &mut [&mut a]).remove(0);
    let url = server.url();
    let text = fencelock(&["status", "--redis", &url, "shown"]);
    let text = text.succeeded();
    assert!(text.starts_with("election \"shown\": led\n"), "{text}");
    assert!(
        text.contains(&format!("leader: term {}, leading for", first.term)),
        "{text}"
    );
    assert!(text.contains(&format!("(pid {} on ", a.0.id())), "{text}");
    let json = fencelock(&["status", "--json", "--redis", &url, "shown"]);
    let json: serde_json::Value = serde_json::from_str(json.succeeded()).unwrap();
    let leader = &json["nodes"][0]["leader"];
    assert_eq!(leader["term"], first.term, "{json}");
    assert_eq!(leader["info"]["pid"], a.0.id(), "{json}");
}

#[test]
fn bad_input_is_one_line_and_exit_64() {
    let run = fencelock(&[
        "elect",
        "--redis",
        "redis://127.0.0.1:1",
        "a{b}",
        "--",
        "true",
    ]);
    run.fails_with(64);
    let run = fencelock(&["elect", "--ttl", "0s", "x", "--", "true"]);
    run.fails_with(64);
    let run = fencelock(&["elect", "x"]);
    run.fails_with(64);
}
