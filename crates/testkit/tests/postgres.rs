//! Behaviour of `testkit::Postgres` against real PostgreSQL servers.

// `libc::kill(pid, 0)` is the independent check that a process is gone.
#![allow(unsafe_code)]

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::TcpStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::{Postgres, eventually};

/// `true` if `kill(pid, 0)` fails with `ESRCH`: no such process (not even a
/// zombie).
fn process_gone(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence; nothing is delivered.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Gone, or a zombie waiting for a (possibly absent) reaper: either way dead.
fn dead(pid: u32) -> bool {
    state(pid).is_none_or(|s| matches!(s, 'Z' | 'X'))
}

/// The state letter in `/proc/PID/stat`, `None` if there is no such process.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// The parent pid in `/proc/PID/stat`.
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The postmaster's children (backends, checkpointer, ...), from `/proc`.
fn children(postmaster: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| parent(pid) == Some(postmaster))
        .collect()
}

/// The System V shared memory segment a running server names on line 7 of
/// its `postmaster.pid`: (key, id).
fn shared_memory_of(pg: &Postgres) -> (u64, i32) {
    let pid_file = std::fs::read_to_string(pg.dir().join("data/postmaster.pid")).unwrap();
    let line = pid_file.lines().nth(6).unwrap();
    let mut it = line.split_whitespace();
    (
        it.next().unwrap().parse().unwrap(),
        it.next().unwrap().parse().unwrap(),
    )
}

/// Whether System V shared memory segment `id` exists with key `key`.
fn shared_memory_exists((key, id): (u64, i32)) -> bool {
    // SAFETY: all-zero is a valid `shmid_ds`, which IPC_STAT overwrites.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: `ds` is valid for the call.
    let rc = unsafe { libc::shmctl(id, libc::IPC_STAT, &mut ds) };
    rc == 0 && ds.shm_perm.__key as u64 == key
}

fn refuses_connections(port: u16) -> bool {
    matches!(
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.kind()),
        Err(ErrorKind::ConnectionRefused)
    )
}

fn panic_message(err: &(dyn std::any::Any + Send)) -> &str {
    err.downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("")
}

#[test]
fn start_answers_queries() {
    let pg = Postgres::start();
    assert_ne!(pg.port(), 5432);
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port())
    );
    assert!(pg.dir().join("data/PG_VERSION").is_file());
    assert!(pg.log_path().starts_with(pg.dir()));
    assert!(!dead(pg.pid()));

    assert_eq!(pg.psql("select 1 + 1"), "2");
    assert_eq!(pg.psql("select current_user"), "postgres");
    pg.psql("create table t (k text primary key, v int); insert into t values ('a', 1), ('b', 2)");
    assert_eq!(pg.psql("select k, v from t order by k"), "a|1\nb|2");
    assert_eq!(pg.psql("select v from t where k = 'zzz'"), "");

    let err = pg.try_psql("select * from no_such_table").unwrap_err();
    assert!(err.contains("no_such_table"), "{err}");
    // A script: each statement on its own, and ON_ERROR_STOP: what ran
    // before the failing statement stays, nothing after it runs.
    let err = pg
        .try_psql("insert into t values ('c', 3); selec 1; insert into t values ('d', 4)")
        .unwrap_err();
    assert!(err.contains("syntax error"), "{err}");
    assert_eq!(
        pg.psql("select string_agg(k, ',' order by k) from t"),
        "a,b,c"
    );
    // Statements that cannot run in a transaction block, and the last
    // statement without its `;`.
    assert_eq!(pg.psql("create database d; select 'x'"), "x");
    assert_eq!(
        pg.psql("select count(*) from pg_database where datname = 'd'"),
        "1"
    );

    let err = catch_unwind(AssertUnwindSafe(|| pg.psql("selec 1"))).unwrap_err();
    let msg = panic_message(&*err);
    assert!(
        msg.contains(&format!("127.0.0.1:{}", pg.port())) && msg.contains("syntax error"),
        "{msg}"
    );
}

#[test]
fn two_servers_run_at_once() {
    let a = Postgres::start();
    let b = Postgres::start();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.pid(), b.pid());
    assert_ne!(a.dir(), b.dir());

    a.psql("create table only_in_a (x int)");
    assert_eq!(
        a.psql("select count(*) from pg_tables where tablename = 'only_in_a'"),
        "1"
    );
    assert_eq!(
        b.psql("select count(*) from pg_tables where tablename = 'only_in_a'"),
        "0"
    );
    assert_eq!(
        a.psql("show port"),
        a.port().to_string(),
        "a answers on its own port"
    );
    assert_eq!(b.psql("show port"), b.port().to_string());
}

#[test]
fn create_database_isolates_tests_in_one_server() {
    let pg = Postgres::start();
    let one = pg.create_database("one");
    let two = pg.create_database("two-2");
    assert_eq!(
        one,
        format!("postgres://postgres@127.0.0.1:{}/one", pg.port())
    );
    assert_eq!(two, pg.database_url("two-2"));

    pg.psql_in("one", "create table t (x int); insert into t values (1)");
    assert_eq!(pg.psql_in("one", "select x from t"), "1");
    assert_eq!(pg.psql_in("one", "select current_database()"), "one");
    let err = pg.try_psql_in("two-2", "select x from t").unwrap_err();
    assert!(err.contains("does not exist"), "{err}");
    assert!(pg.try_psql("select x from t").is_err());

    // Taken, and not a name we allow: both panic.
    let err = catch_unwind(AssertUnwindSafe(|| pg.create_database("one"))).unwrap_err();
    assert!(
        panic_message(&*err).contains("already exists"),
        "{}",
        panic_message(&*err)
    );
    let err = catch_unwind(AssertUnwindSafe(|| pg.create_database("x\"; drop"))).unwrap_err();
    assert!(panic_message(&*err).contains("create_database"));
}

#[test]
fn drop_stops_every_process_frees_the_port_and_removes_the_dir() {
    let pg = Postgres::start();
    let (pid, port, dir) = (pg.pid(), pg.port(), pg.dir().to_owned());
    let children = children(pid);
    let shared_memory = shared_memory_of(&pg);
    assert!(!children.is_empty(), "a postmaster without children?");
    assert!(dir.exists());

    drop(pg);
    assert!(
        process_gone(pid),
        "postmaster {pid} still exists after drop"
    );
    for child in children {
        assert!(dead(child), "postgres child {child} still runs after drop");
    }
    assert!(refuses_connections(port), "port {port} still accepts");
    assert!(!dir.exists(), "{} still exists", dir.display());
    assert!(!shared_memory_exists(shared_memory));
}

#[test]
fn pause_freezes_every_process_until_resume() {
    let mut pg = Postgres::start();
    // An open session, to show that its backend stops too.
    let mut session = pg
        .psql_command("postgres")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = session.stdin.take().unwrap();
    let mut output = BufReader::new(session.stdout.take().unwrap()).lines();
    writeln!(input, "select 'before';").unwrap();
    assert_eq!(output.next().unwrap().unwrap(), "before");

    pg.pause();
    pg.pause(); // idempotent
    assert!(pg.is_paused() && pg.is_running());
    let processes: Vec<u32> = children(pg.pid()).into_iter().chain([pg.pid()]).collect();
    assert!(processes.len() > 2, "{processes:?}");
    for &pid in &processes {
        // (A backend that was exiting, e.g. of a query just before, may be
        // gone.)
        assert!(
            matches!(state(pid), Some('T' | 'Z') | None),
            "process {pid} of the server runs: {:?}",
            state(pid)
        );
    }

    // A new connection gets no answer: libpq gives up after its timeout.
    let started = Instant::now();
    let out = pg
        .psql_command("postgres")
        .env("PGCONNECT_TIMEOUT", "2")
        .args(["-c", "select 1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("timeout expired"), "{stderr}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // The open session's statement waits at its stopped backend.
    writeln!(input, "select 'during';").unwrap();

    pg.resume();
    pg.resume(); // idempotent
    assert!(!pg.is_paused());
    for &pid in &processes {
        assert_ne!(state(pid), Some('T'), "process {pid} still stopped");
    }
    assert_eq!(output.next().unwrap().unwrap(), "during");
    assert_eq!(pg.psql("select 'after'"), "after");
    drop(input);
    assert!(session.wait().unwrap().success());
}

#[test]
fn drop_of_a_paused_server_stops_it() {
    let mut pg = Postgres::start();
    let pid = pg.pid();
    let children = children(pid);
    let dir = pg.dir().to_owned();
    pg.pause();
    drop(pg);
    assert!(process_gone(pid));
    assert!(children.iter().all(|&c| dead(c)));
    assert!(!dir.exists());
}

#[test]
fn kill_crashes_every_process_paused_or_not() {
    for pause_first in [false, true] {
        let mut pg = Postgres::start();
        let (pid, port) = (pg.pid(), pg.port());
        let children = children(pid);
        let shared_memory = shared_memory_of(&pg);
        assert!(shared_memory_exists(shared_memory));
        if pause_first {
            pg.pause();
        }
        pg.kill();
        // A crash leaves the segment behind; kill removes it. (Dynamic
        // shared memory lives in the data directory, removed on drop.)
        assert!(
            !shared_memory_exists(shared_memory),
            "{shared_memory:?} left"
        );
        assert!(!pg.is_running() && !pg.is_paused());
        assert!(process_gone(pid));
        assert!(children.iter().all(|&c| dead(c)), "{children:?}");
        assert!(refuses_connections(port));
        assert!(pg.try_psql("select 1").is_err());
        pg.resume(); // no-op on a dead server
        pg.kill(); // no-op too
        assert!(pg.dir().exists(), "the directory stays until drop");
    }
}

const CHILD_ENV: &str = "TESTKIT_POSTGRES_PDEATHSIG_CHILD";
const CHILD_TEST: &str = "servers_die_with_a_sigkilled_test_process";

/// A test process that is SIGKILLed (no destructors run) leaves no postgres
/// behind: `PR_SET_PDEATHSIG` makes the postmaster shut down, and a paused
/// server's guard continues it so that it can.
///
/// The test re-runs its own binary as a child process that starts two
/// servers, pauses one, reports their processes and directories, and blocks;
/// the parent SIGKILLs the child and watches the processes disappear.
#[test]
fn servers_die_with_a_sigkilled_test_process() {
    if std::env::var_os(CHILD_ENV).is_some() {
        let running = Postgres::start();
        let mut paused = Postgres::start();
        paused.pause();
        for pg in [&running, &paused] {
            // The postmaster first.
            let pids: Vec<String> = [pg.pid()]
                .into_iter()
                .chain(children(pg.pid()))
                .map(|p| p.to_string())
                .collect();
            println!("POSTGRES={} {}", pg.dir().display(), pids.join(" "));
        }
        println!("POSTGRES_END");
        // Block until the parent kills us.
        let _ = std::io::stdin().read_line(&mut String::new());
        return;
    }

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut dirs = Vec::new();
    let mut postmasters = Vec::new();
    let mut pids: Vec<u32> = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.ends_with("POSTGRES_END") {
            break;
        }
        // libtest prints "test NAME ... " first, on the same line.
        if let Some((_, rest)) = line.split_once("POSTGRES=") {
            let mut fields = rest.split(' ');
            dirs.push(fields.next().unwrap().to_owned());
            let server: Vec<u32> = fields.map(|p| p.parse().unwrap()).collect();
            postmasters.push(server[0]);
            pids.extend(server);
        }
    }
    assert_eq!(dirs.len(), 2, "child exited before reporting");
    // (Only the postmasters: a backend that was exiting may be gone.)
    assert!(postmasters.iter().all(|&pid| !dead(pid)));
    assert!(pids.len() > 4, "{pids:?}");

    child.kill().unwrap(); // SIGKILL: no Drop runs in the child
    child.wait().unwrap();

    eventually(
        "every postgres process dies with its SIGKILLed parent",
        Duration::from_secs(10),
        || pids.iter().all(|&pid| dead(pid)),
    );
    // The child could not clean up its temporary directories; do it for it.
    for dir in dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}
