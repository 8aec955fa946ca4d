//! `fencelock run` in a real terminal, driven through tmux as a person would use it: a
//! COMMAND that reads the terminal, Ctrl-C, Ctrl-Z then `fg`, Ctrl-Z for longer than the
//! lease. What the person sees is read from the screen.

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
    _dir: tempfile::TempDir,
}

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
        let terminal = Self { socket, _dir: dir };
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
    term.type_line(&format!(
        r#"{BIN} run ask -- sh -c 'printf "%s? " name; read a; echo "hello $a"'; echo "exit=$?""#
    ));
    term.wait_for("name?"); // the screen shows no trailing space
    assert!(redis.exists("fencelock:{ask}"), "held while COMMAND asks");
    term.type_line("world");
    term.wait_for("hello world");
    term.wait_for("exit=0");
    assert!(!redis.exists("fencelock:{ask}"), "released after");
}

#[test]
fn ctrl_c_stops_command_and_releases_the_lock() {
    let redis = RedisServer::start();
    let term = Terminal::start(&redis);
    term.type_line(&format!(r#"{BIN} run int -- sleep 100; echo "exit=$?""#));
    testkit::eventually("the lock is taken", SCREEN_TIMEOUT, || {
        redis.exists("fencelock:{int}")
    });
    term.keys("C-c");
    term.wait_for("exit=130");
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
    term.type_line("fg");
    term.type_line("yes");
    term.wait_for("got yes");
    term.type_line(r#"echo "exit=$?""#);
    term.wait_for("exit=0");
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
    term.type_line("fg");
    term.type_line("yes");
    term.wait_for("got yes");
    term.type_line(r#"echo "exit=$?""#);
    term.wait_for("exit=0");
    assert!(!redis.exists("fencelock:{long}"), "released after");
    // The keeper let go and is gone (fencelock waited for it before going on).
    let keepers: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
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
    term.type_line("fg");
    term.wait_for("could not be kept while COMMAND was suspended");
    term.type_line(r#"echo "exit=$?""#);
    term.wait_for("exit=76");
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
    term.type_line(&format!(
        r#"{BIN} run --fair --wait 20s line -- echo done; echo "exit=$?""#
    ));
    term.wait_for(&format!("held by sleep 4 (pid {} on ", holder.id()));
    term.wait_for("1st of 1 in line");
    term.wait_for("exit=0");
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
    term.type_line(&format!(
        r#"{BIN} run {} --ttl 2s --restart-protection 4s --wait 20s quarantined -- echo done; echo "exit=$?""#,
        redis.join(" ")
    ));
    term.wait_for("restart protection leaves out 3 nodes that restarted recently");
    term.wait_for("exit=0");
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
    term.type_line(&format!(r#"{BIN} break held; echo "exit=$?""#));
    term.wait_for("held by sleep 30");
    term.wait_for("[y/N]");
    term.type_line("n");
    term.wait_for("exit=");
    assert!(redis.exists("fencelock:{held}"), "not broken without a yes");
    term.type_line("clear");
    term.type_line(&format!(r#"{BIN} break held; echo "broke=$?""#));
    term.wait_for("[y/N]");
    term.type_line("y");
    term.wait_for("broke=0");
    assert!(!redis.exists("fencelock:{held}"));
    assert_eq!(
        holder.wait().unwrap().code(),
        Some(76),
        "the holder hears it"
    );

    term.type_line("clear");
    term.type_line(&format!(r#"{BIN} run loud -- echo ran-loud"#));
    term.type_line(&format!(r#"{BIN} -q run quiet -- echo ran-quiet"#));
    // Printed only once both runs are over (the typed line says `$((40+2))`: the
    // commands' own words are on screen as soon as they are typed).
    term.type_line(r#"echo "both-done-$((40+2))""#);
    term.wait_for("both-done-42");
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
    term.type_line("fg");
    testkit::eventually(
        "COMMAND ran after fg",
        SCREEN_TIMEOUT,
        || ran(term.screen()),
    );
    term.type_line(r#"echo "exit=$?""#);
    term.wait_for("exit=0");
    assert!(!redis.exists("fencelock:{zwait}"), "released after COMMAND");
}
