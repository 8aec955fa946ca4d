//! The CLI on a Redis Cluster over TLS (`rediss+cluster://`), end to end: the real
//! binary against one shared cluster on TLS ports only (testkit's `ClusterBuilder::tls`;
//! testkit talks TLS to its nodes too), each test with lock names of its own. `run`
//! with `--cacert` runs the command under the lock; without it, exit 69 with one line
//! naming the certificate problem and the command never run (also when `run` would
//! wait); `status` and `list` over it.
//!
//! Its own file (not `tls.rs` or `cluster.rs`) so that one TLS cluster serves these
//! tests and no other test binary starts one.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::{Cluster, TlsFiles};

/// No single `fencelock` run in these tests may take longer than this.
const RUN_TIMEOUT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(10);

/// The variables of the caller that would change what a run does: none reaches it.
const CALLERS_VARIABLES: &[&str] = &[
    "FENCELOCK_REDIS",
    "FENCELOCK_CACERT",
    "FENCELOCK_CERT",
    "FENCELOCK_KEY",
    "FENCELOCK_INSECURE",
    "FENCELOCK_USER",
    "FENCELOCK_PASSWORD",
    "FENCELOCK_PASSWORD_FILE",
];

/// The binary under test: `FENCELOCK_BIN` if set, else the one Cargo built for these
/// tests.
fn bin() -> std::ffi::OsString {
    std::env::var_os("FENCELOCK_BIN")
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_fencelock").into())
}

/// What a user sees of one finished `fencelock` run.
#[derive(Debug)]
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Run {
    /// Asserts the exit code, and that stderr is one `fencelock: ...` line; returns it.
    #[track_caller]
    fn fails_with(&self, code: i32) -> &str {
        assert_eq!(self.status.code(), Some(code), "{self:#?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "stderr should be one line: {self:#?}");
        assert!(lines[0].starts_with("fencelock: "), "{self:#?}");
        lines[0]
    }

    /// Asserts exit 0, and returns stdout.
    #[track_caller]
    fn succeeded(&self) -> &str {
        assert_eq!(self.status.code(), Some(0), "{self:#?}");
        &self.stdout
    }
}

/// A `fencelock` command with `args` and none of the caller's variables.
fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in CALLERS_VARIABLES {
        cmd.env_remove(var);
    }
    cmd
}

/// Runs `fencelock args` to the end (at most [`RUN_TIMEOUT`]), asserting that it did not
/// panic.
#[track_caller]
fn fencelock(args: &[&str]) -> Run {
    let started = Instant::now();
    let mut child = command(args).spawn().expect("spawn fencelock");
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fencelock {args:?} did not exit within {RUN_TIMEOUT:?}");
        }
        thread::sleep(POLL);
    };
    let took = started.elapsed();
    let read = |pipe: Option<Box<dyn Read>>| {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            pipe.read_to_string(&mut text)
                .expect("read fencelock's output");
        }
        text
    };
    let stdout = read(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>));
    let stderr = read(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>));
    let run = Run {
        status,
        stdout,
        stderr,
        took,
    };
    assert_ne!(run.status.code(), Some(101), "fencelock panicked: {run:#?}");
    assert!(!run.stderr.contains("panicked"), "{run:#?}");
    run
}

/// A path as an argument.
fn arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

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
        let child = command(&args("run", &options, &[name, "--", "sleep", "60"]))
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
