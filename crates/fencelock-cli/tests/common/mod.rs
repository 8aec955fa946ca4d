//! Runs of the real `fencelock` binary, as the TLS test files make them (each test file
//! is its own crate and takes what it needs with `mod common;`).

#![allow(dead_code)] // not every test crate uses every helper

use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// No single `fencelock` run in these tests may take longer than this.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(20);
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

/// The binary under test: `FENCELOCK_BIN` if set (another build, such as the one
/// `cargo build` makes at the workspace root), else the one Cargo built for these tests.
pub fn bin() -> OsString {
    std::env::var_os("FENCELOCK_BIN")
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_fencelock").into())
}

/// What a user sees of one finished `fencelock` run.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From the spawn to the exit.
    pub took: Duration,
}

impl Run {
    /// Asserts the exit code, and that stderr is one `fencelock: ...` line; returns it.
    #[track_caller]
    pub fn fails_with(&self, code: i32) -> &str {
        assert_eq!(self.status.code(), Some(code), "{self:#?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "stderr should be one line: {self:#?}");
        assert!(lines[0].starts_with("fencelock: "), "{self:#?}");
        lines[0]
    }

    /// Asserts exit 0, and returns stdout.
    #[track_caller]
    pub fn succeeded(&self) -> &str {
        assert_eq!(self.status.code(), Some(0), "{self:#?}");
        &self.stdout
    }

    /// Asserts that the run exited 0 after COMMAND printed `ran`.
    #[track_caller]
    pub fn ran(&self) {
        assert_eq!(self.succeeded(), "ran\n", "{self:#?}");
    }
}

/// A `fencelock` command with `args` and `vars`, and none of the caller's variables.
pub fn command(args: &[&str], vars: &[(&str, &Path)]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in CALLERS_VARIABLES {
        cmd.env_remove(var);
    }
    for (var, value) in vars {
        cmd.env(var, value);
    }
    cmd
}

/// Runs `fencelock` to the end (at most [`RUN_TIMEOUT`]), and asserts that it did not
/// panic, whatever else it did: a panic exits 101 and says "panicked" on stderr.
#[track_caller]
pub fn fencelock_with(args: &[&str], vars: &[(&str, &Path)]) -> Run {
    let started = Instant::now();
    let mut child = command(args, vars).spawn().expect("spawn fencelock");
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

/// [`fencelock_with`] without variables.
#[track_caller]
pub fn fencelock(args: &[&str]) -> Run {
    fencelock_with(args, &[])
}

/// A path as an argument.
pub fn arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// Creates the guide's `ACL SETUSER fencelock ...` user (its security chapter) on `server`, with `password`:
/// the user the guide documents, read from the guide so that the two cannot drift.
pub fn add_guide_user(server: &testkit::RedisServer, password: &str) {
    const GUIDE: &str = include_str!("../../../../docs/guide/src/security.md");
    let line = GUIDE
        .lines()
        .find(|l| l.starts_with("ACL SETUSER fencelock "))
        .expect("the security chapter has a line starting `ACL SETUSER fencelock`");
    let password = format!(">{password}");
    let args: Vec<&str> = line
        .split_whitespace()
        .map(|w| if w == ">CHANGE-ME" { &password } else { w })
        .collect();
    let reply = server.cmd(&args);
    assert_eq!(reply.as_str(), Some("OK"), "{args:?}: {reply:?}");
}
