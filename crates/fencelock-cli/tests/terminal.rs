//! `fencelock run` in a real terminal, driven through tmux as a person would use it: a
//! COMMAND that reads the terminal, Ctrl-C, Ctrl-Z then `fg`, Ctrl-Z for longer than the
//! lease. What the person sees is read from the screen.
//!
//! As a person would, a test types the next command line only once the last command has
//! ended ([`Terminal::run`], [`Terminal::wait_end`]), and types a job's input only once
//! the job asks for it or holds the terminal ([`Terminal::wait_foreground`]): a line
//! typed while a command still prints is echoed into its output (a busy machine once
//! showed `echo "both-done-$((40+2))"ran-loud`, and the test looking for a line
//! `ran-loud` failed).

use std::cell::Cell;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use testkit::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");
/// Bound of every wait for the screen to show something.
const SCREEN_TIMEOUT: Duration = Duration::from_secs(15);

/// A tmux server of its own (its socket in a temporary directory) running an
/// interactive bash with job control, with `FENCELOCK_REDIS` pointing at `redis`.
struct Terminal {
    socket: PathBuf,
    /// Commands started with [`Terminal::begin`] so far: each one's end marker is its own.
    started: Cell<u32>,
    _dir: tempfile::TempDir,
}

/// A command line typed by [`Terminal::begin`]: the shell prints `ended-N-status=S` once
/// it is over.
#[must_use = "wait for the command's end before typing the next"]
struct Started(u32);

impl Terminal {
    fn start(redis: &RedisServer) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tmux.sock");
        let shell = format!(
            "env -i PATH={} HOME={} TERM=xterm FENCELOCK_REDIS={} PS1='sh> ' bash --norc --noprofile -i",
            std::env::var("PATH").unwrap_or_default(),
            dir.path().display(),
            redis.url()
        );
        let terminal = Self {
            socket,
            started: Cell::new(0),
            _dir: dir,
        };
        terminal.tmux(
            &[
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "160",
                "-y",
                "40",
            ],
            &shell,
        );
        terminal.wait_for("sh>");
        terminal
    }

    fn tmux(&self, args: &[&str], last: &str) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .arg(last)
            .output()
            .expect("run tmux (install it: apt-get install tmux)");
        assert!(out.status.success(), "tmux {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `text` and presses Enter.
    fn type_line(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "0", "-l"], text);
        self.keys("Enter");
    }

    /// Types `command` as a command line of its own, and has the shell print a marker
    /// when it is over (with its exit status): wait for it with
    /// [`wait_end`](Self::wait_end) before typing the next command. The marker's number
    /// is computed by the shell, so the typed line does not show it. Not for a job that
    /// will be suspended: bash goes on with the rest of the line when a job stops.
    fn begin(&self, command: &str) -> Started {
        let n = self.started.get() + 1;
        self.started.set(n);
        self.type_line(&format!(r#"{command}; echo "ended-$(({n}+0))-status=$?""#));
        Started(n)
    }

    /// Waits until the command `started` is over; its exit status.
    fn wait_end(&self, started: Started) -> i32 {
        let marker = format!("ended-{}-status=", started.0);
        let mut status = None;
        testkit::eventually(
            &format!("the screen shows {marker:?}"),
            SCREEN_TIMEOUT,
            || {
                status = self.screen().lines().find_map(|line| {
                    let (_, rest) = line.split_once(&marker)?;
                    rest.trim().parse::<i32>().ok()
                });
                status.is_some()
            },
        );
        status.expect("the marker")
    }

    /// Types `command`, waits until it is over; its exit status.
    fn run(&self, command: &str) -> i32 {
        let started = self.begin(command);
        self.wait_end(started)
    }

    /// Waits until the process whose command line contains `needle` holds the terminal
    /// and runs: its process group is the terminal's foreground group, and it is not
    /// stopped. What is typed then is its input (typed before, say right after `fg`,
    /// it may reach the shell instead).
    fn wait_foreground(&self, needle: &str) {
        testkit::eventually(
            &format!("{needle:?} runs in the foreground"),
            SCREEN_TIMEOUT,
            || {
                processes().iter().any(|(cmdline, stat)| {
                    // After the command name: state, ppid, pgrp, session, tty, tpgid.
                    let fields: Vec<&str> = stat.split_whitespace().collect();
                    cmdline.contains(needle)
                        && fields.len() > 5
                        && fields[0] != "T"
                        && fields[2] == fields[5]
                })
            },
        );
    }

    /// Presses keys by tmux name (`C-c`, `C-z`, `Enter`).
    fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", "0"], keys);
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t"], "0")
    }

    /// Waits until the screen shows `text`.
    fn wait_for(&self, text: &str) {
        testkit::eventually(
            &format!("the screen shows {text:?}"),
            SCREEN_TIMEOUT,
            || self.screen().contains(text),
        );
    }
}

/// Every process's command line (arguments joined by spaces) and the fields of its
/// `/proc/PID/stat` after the command name.
fn processes() -> Vec<(String, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let after_name = stat.get(stat.rfind(')')? + 1..)?.to_owned();
            Some((
                String::from_utf8_lossy(&cmdline).replace('\0', " "),
                after_name,
            ))
        })
        .collect()
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the screen when the test failed:\n{}", self.screen());
        }
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

#[test]
fn a_command_reads_the_terminal_and_the_lock_is_released_after() {
    let redis = RedisServer::start();
    let term = Terminal::start(&redis);
    // The prompt is printed from its parts, so that the typed command line does not
    // show it.
    let ask = term.begin(&format!(
        r#"{BIN} run ask -- sh -c 'printf "%s? " name; read a; echo "hello $a"'"#
    ));
    term.wait_for("name?"); // the screen shows no trailing space
    assert!(redis.exists("fencelock:{ask}"), "held while COMMAND asks");
    term.type_line("world");
    term.wait_for("hello world");
    assert_eq!(term.wait_end(ask), 0);
    assert!(!redis.exists("fencelock:{ask}"), "released after");
}

#[test]
fn ctrl_c_stops_command_and_releases_the_lock() {
    let redis = RedisServer::start();
    let term = Terminal::start(&redis);
    let run = term.begin(&format!("{BIN} run int -- sleep 100"));
    testkit::eventually("the lock is taken", SCREEN_TIMEOUT, || {
        redis.exists("fencelock:{int}")
    });
    term.keys("C-c");
    assert_eq!(term.wait_end(run), 130);
    assert!(!redis.exists("fencelock:{int}"));
}

#[test]
fn ctrl_z_suspends_the_job_and_fg_resumes_it_under_the_lock() {
    let redis = RedisServer::start();
    let term = Terminal::start(&redis);
    term.type_line(&format!(
        r#"{BIN} run sus -- sh -c 'read a; echo "got $a"'"#
    ));
    testkit::eventually("the lock is taken", SCREEN_TIMEOUT, || {
        redis.exists("fencelock:{sus}")
    });
    term.keys("C-z");
    term.wait_for("Stopped");
    assert!(
        redis.exists("fencelock:{sus}"),
        "still held while suspended"
    );
    let fg = term.begin("fg");
    term.wait_foreground("got $a");
    term.type_line("yes");
    term.wait_for("got yes");
    assert_eq!(term.wait_end(fg), 0, "fg: the job's exit status");
    assert!(!redis.exists("fencelock:{sus}"));
}

/// Ctrl-Z for longer than the lease: the suspended job keeps the lock (its keeper renews
/// it: the same token stays in the key, another run is refused), and `fg` goes on under
/// it to the end.
#[test]
fn ctrl_z_for_longer_than_the_lease_keeps_the_lock_and_fg_goes_on() {
    let redis = RedisServer::start();
    let term = Terminal::start(&redis);
    term.type_line(&format!(
        r#"{BIN} run --ttl 1s long -- sh -c 'read a; echo "got $a"'"#
    ));
    testkit::eventually("the lock is taken", SCREEN_TIMEOUT, || {
        redis.exists("fencelock:{long}")
    });
    let token = redis.get("fencelock:{long}");
    term.keys("C-z");
    term.wait_for("Stopped");
    // Three leases suspended: still this job's.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        assert_eq!(redis.get("fencelock:{long}"), token, "kept while suspended");
        std::thread::sleep(Duration::from_millis(100));
    }
    let other = Command::new(BIN)
        .args(["run", "long", "--", "true"])
        .env("FENCELOCK_REDIS", redis.url())
        .output()
        .unwrap();
    assert_eq!(other.status.code(), Some(75), "{other:?}");
    let fg = term.begin("fg");
    term.wait_foreground("got $a");
    term.type_line("yes");
    term.wait_for("got yes");
    assert_eq!(term.wait_end(fg), 0);
    assert!(!redis.exists("fencelock:{long}"), "released after");
    // The keeper let go and is gone (fencelock waited for it before going on).
    let keepers: Vec<String> = processes()
        .into_iter()
        .map(|(cmdline, _)| cmdline)
        .filter(|cmdline| cmdline.contains("__keep -- run --ttl 1s long"))
        .collect();
    assert!(keepers.is_empty(), "a keeper is left: {keepers:?}");
}

/// A lock broken while its job is suspended is not kept: at `fg` fencelock says so,
/// COMMAND is gone (its watcher killed it when the lease ended), and it exits 76.
#[test]
fn a_lock_broken_while_suspended_ends_the_job_on_fg() {
    let redis = RedisServer::start();
    let term = Terminal::start(&redis);
    term.type_line(&format!(
        r#"{BIN} run --ttl 1s broken -- sh -c 'read a; echo "got $a"'"#
    ));
    testkit::eventually("the lock is taken", SCREEN_TIMEOUT, || {
        redis.exists("fencelock:{broken}")
    });
    term.keys("C-z");
    term.wait_for("Stopped");
    let broke = Command::new(BIN)
        .args(["break", "--yes", "broken"])
        .env("FENCELOCK_REDIS", redis.url())
        .output()
        .unwrap();
    assert!(broke.status.success(), "{broke:?}");
    term.wait_for("the lease ran out without a renewal");
    let fg = term.begin("fg");
    term.wait_for("could not be kept while COMMAND was suspended");
    assert_eq!(term.wait_end(fg), 76);
    assert!(
        !term.screen().lines().any(|l| l.starts_with("got")),
        "COMMAND never went on"
    );
}

/// While `run --wait` waits at a terminal, its status line says who holds the lock (the
/// holder's command and pid, from the holder info `run` writes) and its own place in a
/// fair queue; then COMMAND runs once the holder is done.
#[test]
fn a_waiting_run_shows_who_holds_the_lock_and_its_place_in_line() {
    let redis = RedisServer::start();
    let mut holder = Command::new(BIN)
        .args(["run", "--fair", "line", "--", "sleep", "4"])
        .env("FENCELOCK_REDIS", redis.url())
        .spawn()
        .unwrap();
    testkit::eventually("the holder has the lock", SCREEN_TIMEOUT, || {
        redis.exists("fencelock:{line}")
    });
    let term = Terminal::start(&redis);
    let run = term.begin(&format!("{BIN} run --fair --wait 20s line -- echo done"));
    term.wait_for(&format!("held by sleep 4 (pid {} on ", holder.id()));
    term.wait_for("1st of 1 in line");
    assert_eq!(term.wait_end(run), 0);
    assert!(term.screen().contains("done"));
    assert!(holder.wait().unwrap().success());
}

/// A Redlock `run --wait` through restart protection says that it waits for it (the
/// nodes just started), instead of calling the lock free, and then gets the lock.
#[test]
fn a_wait_through_restart_protection_says_so() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let term = Terminal::start(&nodes[0]);
    let redis: Vec<String> = nodes
        .iter()
        .map(|n| format!("--redis {}", n.url()))
        .collect();
    let run = term.begin(&format!(
        "{BIN} run {} --ttl 2s --restart-protection 4s --wait 20s quarantined -- echo done",
        redis.join(" ")
    ));
    term.wait_for("restart protection leaves out 3 nodes that restarted recently");
    assert_eq!(term.wait_end(run), 0);
    assert!(term.screen().contains("done"));
}

/// On a terminal, `break` asks first: "n" leaves the lock held, "y" breaks it and says
/// what it broke. `-q` keeps a run's notices off the screen (COMMAND's own output stays).
#[test]
fn break_asks_on_a_terminal_and_quiet_runs_say_nothing() {
    let redis = RedisServer::start();
    let mut holder = Command::new(BIN)
        .args(["run", "held", "--", "sleep", "30"])
        .env("FENCELOCK_REDIS", redis.url())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    testkit::eventually("the holder has the lock", SCREEN_TIMEOUT, || {
        redis.exists("fencelock:{held}")
    });
    let term = Terminal::start(&redis);
    let ask = term.begin(&format!("{BIN} break held"));
    term.wait_for("held by sleep 30");
    term.wait_for("[y/N]");
    term.type_line("n");
    assert_eq!(term.wait_end(ask), 1, "not broken");
    assert!(redis.exists("fencelock:{held}"), "not broken without a yes");
    assert_eq!(term.run("clear"), 0);
    let ask = term.begin(&format!("{BIN} break held"));
    term.wait_for("[y/N]");
    term.type_line("y");
    assert_eq!(term.wait_end(ask), 0);
    assert!(!redis.exists("fencelock:{held}"));
    assert_eq!(
        holder.wait().unwrap().code(),
        Some(76),
        "the holder hears it"
    );

    assert_eq!(term.run("clear"), 0);
    assert_eq!(term.run(&format!("{BIN} run loud -- echo ran-loud")), 0);
    assert_eq!(
        term.run(&format!("{BIN} -q run quiet -- echo ran-quiet")),
        0
    );
    let screen = term.screen();
    assert!(
        screen.contains("\nran-loud") && screen.contains("\nran-quiet"),
        "{screen}"
    );
    assert!(screen.contains(r#"holding lock "loud""#), "{screen}");
    assert!(!screen.contains(r#"holding lock "quiet""#), "{screen}");
}

/// Ctrl-Z while `run --wait` still waits for the lock (no COMMAND yet) stops fencelock,
/// as it would any job: the stopped waiter takes nothing when the lock frees, and `fg`
/// goes on waiting, then runs COMMAND.
#[test]
fn ctrl_z_while_waiting_stops_the_job_and_fg_goes_on_waiting() {
    let redis = RedisServer::start();
    let mut holder = Command::new(BIN)
        .args(["run", "zwait", "--", "sleep", "3"])
        .env("FENCELOCK_REDIS", redis.url())
        .spawn()
        .unwrap();
    testkit::eventually("the holder has the lock", SCREEN_TIMEOUT, || {
        redis.exists("fencelock:{zwait}")
    });
    let term = Terminal::start(&redis);
    term.type_line(&format!("{BIN} run --wait 60s zwait -- echo done"));
    // Waiting: its client is on the lock's wake list.
    testkit::eventually("the run waits", SCREEN_TIMEOUT, || {
        redis.cmd(&["ZCARD", "fencelock:{zwait}:wakes"]).as_int() == Some(1)
    });
    term.keys("C-z");
    term.wait_for("Stopped");
    assert!(holder.wait().unwrap().success());
    // The holder is done and the stopped waiter cannot take the lock.
    assert!(!redis.exists("fencelock:{zwait}"), "taken while stopped");
    // COMMAND's output, a line of its own (the typed line has "echo done" in it).
    let ran = |screen: String| screen.lines().any(|l| l.trim() == "done");
    assert!(!ran(term.screen()), "COMMAND ran while stopped");
    let fg = term.begin("fg");
    testkit::eventually(
        "COMMAND ran after fg",
        SCREEN_TIMEOUT,
        || ran(term.screen()),
    );
    assert_eq!(term.wait_end(fg), 0);
    assert!(!redis.exists("fencelock:{zwait}"), "released after COMMAND");
}
