//! Real PostgreSQL servers for tests: [`Postgres`].
//!
//! Every [`Postgres`] is a `postgres` child process (the postmaster itself,
//! not `pg_ctl`, which daemonizes) on a free loopback port with its own
//! temporary directory, trust authentication for the superuser `postgres`,
//! and durability off (`fsync`, `synchronous_commit` and `full_page_writes`
//! off: a test server never outlives a crash of the machine). Dropping it
//! stops the server and removes the directory.
//!
//! ```
//! let pg = testkit::Postgres::start();
//! pg.psql("create table t (k text primary key, v int)");
//! pg.psql("insert into t values ('a', 1), ('b', 2)");
//! assert_eq!(pg.psql("select k, v from t order by k"), "a|1\nb|2");
//!
//! // One database per test, in one server:
//! let url = pg.create_database("orders");
//! assert_eq!(url, format!("postgres://postgres@127.0.0.1:{}/orders", pg.port()));
//! assert_eq!(pg.psql_in("orders", "select count(*) from pg_tables where tablename = 't'"), "0");
//! ```
//!
//! # Binaries
//! `initdb`, `postgres` and `psql` are taken from `$PG_BIN` if set, else from
//! the highest version's `/usr/lib/postgresql/VERSION/bin` (Debian's layout;
//! `psql` from `$PATH` if that directory has none). `apt-get install -y
//! postgresql` installs them (`scripts/lib.sh`'s `need_postgresql`).
//!
//! # The `postgres` user
//! PostgreSQL refuses to run as root. When the tests run as root, the
//! server (and `initdb`) run as the `postgres` system user, which Debian's
//! package creates, and the server's directory is handed to it; otherwise
//! they run as the current user. The temporary directory (`$TMPDIR`, else
//! `/tmp`) must then be reachable by that user.
//!
//! # Start-up time
//! `initdb` runs once per machine, user and PostgreSQL version: its result,
//! a template data directory, is kept in the temporary directory
//! (`testkit-postgres-VERSION-rREV-uidUID`, built aside and renamed into
//! place, so parallel test processes do not race) and copied (`cp -a`) for
//! each server. The copy is about a thousand small files (28 MB), so the
//! start-up time depends on how fast the file system creates files: about
//! 0.2 s on a tmpfs, and 1.5 s on one VM's ext4 disk, almost all of it the
//! copy (`TMPDIR=/dev/shm` helps there, if memory allows). The first start
//! on a machine runs `initdb` as well: 1 to 2.5 s more.

use std::ffi::{CString, OsString};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::build::is_executable;
use crate::server::{die_with_parent_by, free_port, owns_listener, process_state};

/// How long `start` waits for a freshly spawned server to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Interval between readiness probes.
const POLL: Duration = Duration::from_millis(10);
/// How many ports `start` tries when the port is taken (port race).
const START_ATTEMPTS: usize = 5;
/// How long Drop waits for the immediate shutdown (`SIGQUIT`) before it
/// `SIGKILL`s every process of the server.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `pause`, `resume` and `kill` wait for the kernel to stop,
/// continue or end the server's processes.
const SIGNAL_SETTLE_TIMEOUT: Duration = Duration::from_secs(5);
/// The bound on one whole [`Postgres::psql`] run (connect and statement).
const PSQL_TIMEOUT: Duration = Duration::from_secs(30);
/// libpq's `connect_timeout` for [`Postgres::psql_command`], in seconds.
const PSQL_CONNECT_TIMEOUT: &str = "10";
/// `connect_timeout` of one readiness probe, in seconds (libpq's minimum).
const PROBE_CONNECT_TIMEOUT: &str = "2";

/// The superuser `initdb` creates; trust authentication lets it in.
const SUPERUSER: &str = "postgres";
/// The database that [`Postgres::url`] and [`Postgres::psql`] use.
const DEFAULT_DATABASE: &str = "postgres";
/// The system user the server runs as when the tests run as root.
const SYSTEM_USER: &str = "postgres";
/// The data directory inside the server's directory.
const DATA_DIR: &str = "data";
/// The server's log (its stderr) inside the server's directory.
const LOG_FILE: &str = "postgres.log";
/// Bumped whenever `initdb`'s arguments change, so an old template is not
/// reused.
const TEMPLATE_REV: u32 = 1;

const NOT_FOUND: &str = "PostgreSQL not found: install it (apt-get install -y postgresql) \
     or set PG_BIN to the directory holding initdb and postgres";

/// A real PostgreSQL server (the `postgres` postmaster as a child process)
/// on a free loopback port with its own temporary directory, stopped and
/// cleaned up on drop. See the [module docs](crate::postgres).
///
/// The server listens on `127.0.0.1` only (and on a Unix socket in its
/// directory), trusts every connection, and logs to `postgres.log` in its
/// directory ([`log_path`](Self::log_path)).
///
/// # Process hygiene
/// As for [`RedisServer`](crate::RedisServer):
/// * **Drop** resumes a paused server and asks for PostgreSQL's immediate
///   shutdown (`SIGQUIT`: the postmaster `SIGQUIT`s its backends, waits for
///   them and exits); if it has not exited within 5 s, every process of the
///   server is `SIGKILL`ed. Then the directory is removed. Drop runs during a
///   test's panic unwinding too and never panics itself.
/// * **`PR_SET_PDEATHSIG`**: the postmaster gets `SIGQUIT` when the thread
///   that started it dies (a `SIGKILL`ed test process included), and its
///   backends die with it. Start servers from the test's own thread, not
///   from a short-lived helper thread, and do not park them in a `static`.
///   A [paused](Self::pause) server acts on that signal only once
///   continued: the kernel continues the postmaster itself (its process
///   group is orphaned), but not its stopped backends, which its shutdown
///   would `SIGKILL` only after 5 s. So while paused, a small guard process
///   (`sh`) waits on a pipe from the test process and, if that dies,
///   continues them all.
/// * **Own process group**, so a Ctrl-C in the terminal does not reach the
///   server (its backends are in sessions of their own anyway: PostgreSQL
///   calls `setsid` in every child).
#[derive(Debug)]
pub struct Postgres {
    child: Option<Child>,
    pid: u32,
    port: u16,
    psql: PathBuf,
    /// `CREATE DATABASE ... STRATEGY FILE_COPY` (PostgreSQL 15 and later):
    /// faster than the default (`WAL_LOG`) with `fsync` off.
    file_copy: bool,
    paused: Option<Paused>,
    // Declared last: the Drop impl stops the server before the dir goes away.
    dir: TempDir,
}

/// What [`Postgres::pause`] stopped, and the guard that continues it if the
/// test process dies.
#[derive(Debug)]
struct Paused {
    /// The postmaster's descendants (its backends and auxiliary processes).
    descendants: Vec<u32>,
    /// `sh` reading from a pipe whose other end is `guard_stdin`; on end of
    /// file it continues the server.
    guard: Option<Child>,
    guard_stdin: Option<ChildStdin>,
}

impl Paused {
    /// Kills and reaps the guard, so that it continues nothing later, when
    /// the pids it was given may belong to other processes.
    fn end_guard(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            let _ = guard.kill();
            let _ = guard.wait();
        }
        self.guard_stdin = None;
    }
}

impl Postgres {
    /// Starts a throwaway server and waits until it answers a query.
    ///
    /// Start it from the thread that will own it (normally the test's own
    /// thread): see [`Postgres`] on `PR_SET_PDEATHSIG`.
    ///
    /// # Panics
    /// If PostgreSQL is not installed (the message says how to install it),
    /// if the tests run as root and there is no `postgres` user, if `initdb`
    /// fails, or if the server does not come up within 15 s (the message
    /// includes the tail of its log).
    pub fn start() -> Postgres {
        Self::start_on(free_port)
    }

    /// [`start`](Self::start) on the ports `next_port` picks.
    fn start_on(next_port: fn() -> u16) -> Postgres {
        let setup = setup().unwrap_or_else(|msg| panic!("{msg}"));
        let dir = tempfile::Builder::new()
            .prefix("testkit-postgres-")
            .tempdir()
            .unwrap_or_else(|e| panic!("testkit: cannot create a temporary directory: {e}"));
        setup.owner.give(dir.path());
        copy_template(&setup.template, &dir.path().join(DATA_DIR));

        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let port = next_port();
            let mut child = spawn(setup, dir.path(), port);
            match wait_ready(&mut child, port, &setup.install.psql) {
                Ok(()) => {
                    return Postgres {
                        pid: child.id(),
                        child: Some(child),
                        port,
                        psql: setup.install.psql.clone(),
                        file_copy: setup.install.major() >= 15,
                        paused: None,
                        dir,
                    };
                }
                Err(StartError::Exited(status)) if port_taken(dir.path(), port) => {
                    failures.push(format!("port {port}: taken ({status})"));
                }
                Err(err) => {
                    kill_tree(&mut child, &dir.path().join(DATA_DIR));
                    failures.push(format!("port {port}: {err}"));
                    break;
                }
            }
        }
        panic!(
            "testkit: postgres ({}) did not start: {}\n(its data directory is a copy of \
             the template {}: if that is damaged, remove it)\n{}",
            setup.install.postgres.display(),
            failures.join("; "),
            setup.template.display(),
            log_tail(dir.path())
        );
    }

    /// `"postgres://postgres@127.0.0.1:PORT/postgres"`: the superuser on the
    /// default database, no password (trust authentication).
    pub fn url(&self) -> String {
        self.database_url(DEFAULT_DATABASE)
    }

    /// `"postgres://postgres@127.0.0.1:PORT/DATABASE"`, for a database made
    /// with [`create_database`](Self::create_database).
    pub fn database_url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// The TCP port the server listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Process id of the postmaster (the last one, after [`kill`](Self::kill)).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's temporary directory: its data directory `data`, its log
    /// and its Unix socket. Removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Path of the server's log (its stderr).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// Runs `sql` with `psql` on the default database `postgres` and
    /// returns its output, trimmed: unaligned, tuples only (one line per row,
    /// fields separated by `|`, no header, no `INSERT 0 1` notes).
    ///
    /// `sql` is a script, fed to `psql` on its stdin: several statements,
    /// separated by `;`, run one after the other, each in a transaction of
    /// its own unless the script says `begin`; `psql` stops at the first
    /// error (`ON_ERROR_STOP`), keeping what ran before it. `psql`'s
    /// backslash commands work too.
    ///
    /// # Panics
    /// If `psql` fails (the message includes its stderr) or takes more than
    /// 30 s (e.g. because the server is paused).
    pub fn psql(&self, sql: &str) -> String {
        self.psql_in(DEFAULT_DATABASE, sql)
    }

    /// [`psql`](Self::psql) on `database`.
    ///
    /// # Panics
    /// As [`psql`](Self::psql).
    pub fn psql_in(&self, database: &str, sql: &str) -> String {
        self.try_psql_in(database, sql).unwrap_or_else(|err| {
            panic!(
                "testkit: psql on 127.0.0.1:{}/{database} failed: {err}\nSQL: {sql}",
                self.port
            )
        })
    }

    /// Non-panicking [`psql`](Self::psql).
    ///
    /// # Errors
    /// `psql`'s stderr, trimmed, if it fails (an SQL error, or no
    /// connection); a message saying so if it takes more than 30 s.
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        self.try_psql_in(DEFAULT_DATABASE, sql)
    }

    /// Non-panicking [`psql_in`](Self::psql_in).
    ///
    /// # Errors
    /// As [`try_psql`](Self::try_psql).
    pub fn try_psql_in(&self, database: &str, sql: &str) -> Result<String, String> {
        let mut cmd = self.psql_command(database);
        let output = run_bounded(&mut cmd, Some(sql.as_bytes().to_vec()), PSQL_TIMEOUT)?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            Err(if stderr.is_empty() {
                format!("psql {}", output.status)
            } else {
                stderr
            })
        }
    }

    /// A `psql` command for `database`, ready for more arguments (`-c SQL`,
    /// `-f FILE`) or a piped stdin: `psql -X -q -A -t -v ON_ERROR_STOP=1
    /// -h 127.0.0.1 -p PORT -U postgres -d DATABASE` with
    /// `PGCONNECT_TIMEOUT=10` (set another value with `.env(...)`; libpq
    /// treats values below 2 as 2) and stdin from `/dev/null`. Unlike
    /// [`psql`](Self::psql) it has no bound on how long it runs.
    ///
    /// ```
    /// let pg = testkit::Postgres::start();
    /// let out = pg.psql_command("postgres").args(["-c", "select 6 * 7"]).output().unwrap();
    /// assert!(out.status.success());
    /// assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    /// ```
    pub fn psql_command(&self, database: &str) -> Command {
        let mut cmd = Command::new(&self.psql);
        psql_args(&mut cmd, self.port, database, PSQL_CONNECT_TIMEOUT);
        cmd
    }

    /// Creates database `name` and returns its URL (see
    /// [`database_url`](Self::database_url)), so that tests can share one
    /// server and still not see each other's tables.
    ///
    /// # Panics
    /// If `name` is not 1-63 ASCII letters, digits, `_` or `-`, or as
    /// [`psql`](Self::psql) (e.g. if it exists already).
    pub fn create_database(&self, name: &str) -> String {
        assert!(
            valid_database_name(name),
            "testkit: create_database({name:?}): use 1-63 ASCII letters, digits, '_' or '-'"
        );
        let strategy = if self.file_copy {
            " strategy file_copy"
        } else {
            ""
        };
        self.psql(&format!("create database \"{name}\"{strategy}"));
        self.database_url(name)
    }

    /// Whether the server is paused by [`pause`](Self::pause) (and not
    /// resumed or killed since).
    pub fn is_paused(&self) -> bool {
        self.paused.is_some()
    }

    /// Whether the postmaster is alive (a paused one counts). Reaps it if it
    /// exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.paused = None;
                false
            }
            None => false,
        }
    }

    /// Freezes the whole server with `SIGSTOP`: the postmaster (its process
    /// group) and every process below it (backends, checkpointer, ...: each
    /// in a session of its own, so a signal to the postmaster's group does
    /// not reach them), and waits until the kernel reports all of them
    /// stopped. Clients can still connect (the kernel completes the TCP
    /// handshake) but get no answer, and open sessions' statements do not
    /// run, until [`resume`](Self::resume). Idempotent.
    ///
    /// # Panics
    /// If the server is not running, or its processes do not stop within 5 s.
    pub fn pause(&mut self) {
        if self.paused.is_some() {
            return;
        }
        assert!(
            self.signal_group(libc::SIGSTOP),
            "testkit: pause: postgres on port {} is not running",
            self.port
        );
        // Stopped, the postmaster forks no more; stop what it had forked
        // (and anything they forked), until no new process turns up.
        wait_state(&[self.pid], true);
        let mut stopped: Vec<u32> = Vec::new();
        loop {
            let new: Vec<u32> = descendants(self.pid)
                .into_iter()
                .filter(|p| !stopped.contains(p))
                .collect();
            if new.is_empty() {
                break;
            }
            for &pid in &new {
                signal_pid(pid, libc::SIGSTOP);
            }
            stopped.extend(new);
        }
        let mut all = stopped.clone();
        all.push(self.pid);
        if !wait_state(&all, true) {
            self.paused = Some(Paused {
                descendants: stopped,
                guard: None,
                guard_stdin: None,
            });
            self.resume();
            panic!(
                "testkit: postgres on port {}: not every process stopped within {SIGNAL_SETTLE_TIMEOUT:?}",
                self.port
            );
        }
        let (guard, guard_stdin) = spawn_guard(&all);
        self.paused = Some(Paused {
            descendants: stopped,
            guard,
            guard_stdin,
        });
    }

    /// Undoes [`pause`](Self::pause) with `SIGCONT` and waits until the
    /// kernel reports every process running again. Idempotent; a no-op on a
    /// server that is not paused.
    pub fn resume(&mut self) {
        let Some(mut paused) = self.paused.take() else {
            return;
        };
        paused.end_guard();
        // Backends first: the postmaster, still stopped, cannot reap one
        // (so its pid stays its own) before it is continued.
        for &pid in &paused.descendants {
            signal_pid(pid, libc::SIGCONT);
        }
        if self.signal_group(libc::SIGCONT) {
            let mut all = paused.descendants;
            all.push(self.pid);
            wait_state(&all, false);
        }
    }

    /// `SIGKILL`s every process of the server (paused or not: the
    /// postmaster's group and everything below it) and reaps the
    /// postmaster: a crash, no shutdown. New connections are refused at once
    /// (only the postmaster listens); returns once the backends are gone too
    /// (bounded, 5 s). A no-op if it is not running. The directory stays
    /// until drop.
    pub fn kill(&mut self) {
        if let Some(mut paused) = self.paused.take() {
            paused.end_guard();
        }
        if let Some(mut child) = self.child.take() {
            kill_tree(&mut child, &self.dir.path().join(DATA_DIR));
        }
    }

    /// Sends `sig` to the postmaster's process group; `false` if there is no
    /// live postmaster. Checking `try_wait` first guarantees the pid has not
    /// been reaped (and so cannot have been recycled) when we signal it.
    fn signal_group(&mut self, sig: libc::c_int) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        // SAFETY: plain syscall on our own unreaped child's process group
        // (it leads the group: `process_group(0)`).
        unsafe { libc::kill(-(child.id() as libc::pid_t), sig) == 0 }
    }

    /// Resume if paused, immediate shutdown, `SIGKILL` after a bound, reap.
    /// Never panics.
    fn stop_quietly(&mut self) {
        // `resume` never panics.
        self.resume();
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            // SAFETY: plain syscall on our own unreaped child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGQUIT) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(2));
            }
        }
        kill_tree(&mut child, &self.dir.path().join(DATA_DIR));
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop_quietly();
        // `dir: TempDir` is removed after this, ignoring errors.
    }
}

/// What a start found out once per process: the binaries, who runs the
/// server, and the template data directory.
#[derive(Debug)]
struct Setup {
    install: Install,
    owner: Owner,
    template: PathBuf,
}

/// The PostgreSQL binaries in use.
#[derive(Debug)]
struct Install {
    initdb: PathBuf,
    postgres: PathBuf,
    psql: PathBuf,
    /// `15.18`, from `postgres --version`.
    version: String,
}

/// The user the server runs as.
#[derive(Clone, Copy, Debug)]
struct Owner {
    uid: u32,
    gid: u32,
    /// Whether the child must switch to this user (we are root).
    switch: bool,
}

impl Owner {
    /// The current user, or `postgres` when that is root.
    fn find() -> Result<Owner, String> {
        // SAFETY: geteuid/getegid cannot fail and touch no memory of ours.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if euid != 0 {
            return Ok(Owner {
                uid: euid,
                gid: egid,
                switch: false,
            });
        }
        let (uid, gid) = lookup_user(SYSTEM_USER).ok_or_else(|| {
            format!(
                "testkit: PostgreSQL refuses to run as root, and there is no `{SYSTEM_USER}` \
                 user to run it as: install PostgreSQL (apt-get install -y postgresql, \
                 which creates it) or run the tests as another user"
            )
        })?;
        Ok(Owner {
            uid,
            gid,
            switch: true,
        })
    }

    /// Makes `cmd` run as this user.
    fn apply(self, cmd: &mut Command) {
        if self.switch {
            cmd.uid(self.uid).gid(self.gid);
        }
    }

    /// Hands `path` to this user (when we are root).
    ///
    /// # Panics
    /// If `chown` fails.
    fn give(self, path: &Path) {
        if self.switch {
            chown(path, Some(self.uid), Some(self.gid)).unwrap_or_else(|e| {
                panic!(
                    "testkit: cannot chown {} to the {SYSTEM_USER} user: {e}",
                    path.display()
                )
            });
        }
    }
}

/// The uid and gid of user `name` (`getpwnam_r`, so NSS users count too).
fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let name = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: `passwd` is plain old data; all-zero is a valid value that
    // getpwnam_r overwrites.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; the strings getpwnam_r
    // stores in `pwd` point into `buf`, which we do not read.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some((pwd.pw_uid, pwd.pw_gid))
}

/// The [`Setup`], made on the first call (the template maybe built then);
/// other threads wait for it. An error is kept, and repeated, too.
fn setup() -> Result<&'static Setup, String> {
    static SETUP: OnceLock<Result<Setup, String>> = OnceLock::new();
    SETUP
        .get_or_init(|| {
            let install =
                find_install(std::env::var_os("PG_BIN"), Path::new("/usr/lib/postgresql"))
                    .and_then(|bin| Install::at(&bin))?;
            let owner = Owner::find()?;
            let template = ensure_template(&install, owner)?;
            Ok(Setup {
                install,
                owner,
                template,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The directory holding `initdb` and `postgres`: `pg_bin` (`$PG_BIN`) if
/// set, else the highest version's `bin` under `root`
/// (`/usr/lib/postgresql/VERSION/bin`).
fn find_install(pg_bin: Option<OsString>, root: &Path) -> Result<PathBuf, String> {
    let complete = |bin: &Path| {
        ["initdb", "postgres"]
            .iter()
            .all(|b| is_executable(&bin.join(b)))
    };
    if let Some(bin) = pg_bin.filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        return if complete(&bin) {
            Ok(bin)
        } else {
            Err(format!(
                "{NOT_FOUND} (PG_BIN={} holds no executable initdb and postgres)",
                bin.display()
            ))
        };
    }
    let mut found: Vec<(Vec<u32>, PathBuf)> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let version = name
                .to_str()?
                .split('.')
                .map(|n| n.parse::<u32>().ok())
                .collect::<Option<Vec<u32>>>()?;
            let bin = entry.path().join("bin");
            complete(&bin).then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| format!("{NOT_FOUND} (nothing in {}/*/bin)", root.display()))
}

impl Install {
    /// The binaries in `bin`, and the version `postgres --version` reports.
    fn at(bin: &Path) -> Result<Install, String> {
        let postgres = bin.join("postgres");
        let out = Command::new(&postgres)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("testkit: cannot run {} --version: {e}", postgres.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = parse_version(&text).ok_or_else(|| {
            format!(
                "testkit: cannot read the version in `{} --version`: {text:?}",
                postgres.display()
            )
        })?;
        let psql = Some(bin.join("psql"))
            .filter(|p| is_executable(p))
            .or_else(|| {
                std::env::var_os("PATH")
                    .iter()
                    .flat_map(std::env::split_paths)
                    .map(|dir| dir.join("psql"))
                    .find(|p| is_executable(p))
            })
            .ok_or_else(|| {
                format!(
                    "testkit: psql not found in {} nor on PATH: install it \
                     (apt-get install -y postgresql-client)",
                    bin.display()
                )
            })?;
        Ok(Install {
            initdb: bin.join("initdb"),
            postgres,
            psql,
            version,
        })
    }

    /// The major version: 15 for `15.18`, 9 for `9.6.24`.
    fn major(&self) -> u32 {
        major_version(&self.version)
    }
}

/// The leading number of a version: 15 for `15.18`, 17 for `17beta1`.
fn major_version(version: &str) -> u32 {
    let digits: String = version.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or(0)
}

/// `15.18` from `postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)`.
fn parse_version(text: &str) -> Option<String> {
    let version = text.split_whitespace().nth(2)?;
    version
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '.')
        .then(|| version.to_owned())
}

/// The template data directory for `install` run by `owner`, made with
/// `initdb` if it does not exist yet: built in a directory of its own and
/// renamed into place, so a template that exists is complete, and of two
/// processes building one at once, one wins and the other uses its result.
fn ensure_template(install: &Install, owner: Owner) -> Result<PathBuf, String> {
    let template = std::env::temp_dir().join(format!(
        "testkit-postgres-{}-r{TEMPLATE_REV}-uid{}",
        install.version, owner.uid
    ));
    let complete =
        |t: &Path| t.join("PG_VERSION").is_file() && t.join("global/pg_control").is_file();
    if complete(&template) {
        return Ok(template);
    }
    let build = tempfile::Builder::new()
        .prefix("testkit-postgres-initdb-")
        .tempdir()
        .map_err(|e| format!("testkit: cannot create a temporary directory: {e}"))?;
    if owner.switch {
        chown(build.path(), Some(owner.uid), Some(owner.gid)).map_err(|e| {
            format!(
                "testkit: cannot chown {} to the {SYSTEM_USER} user: {e}",
                build.path().display()
            )
        })?;
    }
    let data = build.path().join(DATA_DIR);
    let log = build.path().join("initdb.log");
    let log_file = fs::File::create(&log)
        .map_err(|e| format!("testkit: cannot create {}: {e}", log.display()))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| format!("testkit: {}: {e}", log.display()))?;
    let mut cmd = Command::new(&install.initdb);
    cmd.arg("-D")
        .arg(&data)
        .args(["-A", "trust", "-U", SUPERUSER])
        // C locale: the same everywhere, and no need for the machine's.
        .args(["-E", "UTF8", "--locale=C"])
        // No fsync (a test server), and 1 MB WAL segments (not 16): less
        // to copy per server.
        .args(["--no-sync", "--wal-segsize=1"])
        .current_dir(build.path())
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err);
    owner.apply(&mut cmd);
    let status = cmd
        .status()
        .map_err(|e| format!("testkit: cannot run {}: {e}", install.initdb.display()))?;
    if !status.success() {
        return Err(format!(
            "testkit: {} failed ({status}):\n{}",
            install.initdb.display(),
            fs::read_to_string(&log).unwrap_or_default()
        ));
    }
    match fs::rename(&data, &template) {
        Ok(()) => Ok(template),
        // Another process was first.
        Err(_) if complete(&template) => Ok(template),
        Err(e) => Err(format!(
            "testkit: cannot rename the new template {} to {}: {e} \
             (if {} exists but is incomplete, remove it)",
            data.display(),
            template.display(),
            template.display()
        )),
    }
    // `build` (the log, and the data if the rename failed) is removed here.
}

/// `cp -a template data` (ownership kept when we are root).
///
/// # Panics
/// If the copy fails.
fn copy_template(template: &Path, data: &Path) {
    let out = Command::new("cp")
        .arg("-a")
        .arg(template)
        .arg(data)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("testkit: cannot run cp: {e}"));
    assert!(
        out.status.success(),
        "testkit: cp -a {} {} failed ({}): {}",
        template.display(),
        data.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Spawns the postmaster on `port` with its data and socket in `dir`.
fn spawn(setup: &Setup, dir: &Path, port: u16) -> Child {
    let log_path = dir.join(LOG_FILE);
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .unwrap_or_else(|e| panic!("testkit: cannot open {}: {e}", log_path.display()));
    setup.owner.give(&log_path);
    let mut cmd = Command::new(&setup.install.postgres);
    cmd.arg("-D")
        .arg(dir.join(DATA_DIR))
        .arg("-p")
        .arg(port.to_string())
        .arg("-k")
        .arg(dir)
        .args(["-c", "listen_addresses=127.0.0.1"])
        .args(["-c", "fsync=off"])
        .args(["-c", "synchronous_commit=off"])
        .args(["-c", "full_page_writes=off"])
        .args(["-c", "logging_collector=off"])
        // Dynamic shared memory as files in the data directory rather than
        // in /dev/shm, where a killed server would leave them behind.
        .args(["-c", "dynamic_shared_memory_type=mmap"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0);
    setup.owner.apply(&mut cmd);
    // After the uid switch, which clears it: std runs `pre_exec` hooks last.
    die_with_parent_by(&mut cmd, libc::SIGQUIT);
    cmd.spawn().unwrap_or_else(|e| {
        panic!(
            "testkit: cannot spawn {}: {e}",
            setup.install.postgres.display()
        )
    })
}

#[derive(Debug)]
enum StartError {
    Exited(ExitStatus),
    TimedOut(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Exited(status) => write!(f, "exited early ({status})"),
            StartError::TimedOut(last) => write!(
                f,
                "no answer within {READY_TIMEOUT:?} (last attempt: {last})"
            ),
        }
    }
}

/// Polls until the child owns the listening socket on `port` (so another
/// server that holds the port is not mistaken for ours) and answers
/// `select 1`, the child exits, or the time is up.
fn wait_ready(child: &mut Child, port: u16, psql: &Path) -> Result<(), StartError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last = String::from("not listening yet");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(StartError::Exited(status));
        }
        if owns_listener(child.id(), port) {
            let mut cmd = Command::new(psql);
            psql_args(&mut cmd, port, DEFAULT_DATABASE, PROBE_CONNECT_TIMEOUT);
            cmd.args(["-c", "select 1"]);
            match run_bounded(&mut cmd, None, Duration::from_secs(5)) {
                Ok(out) if out.status.success() => return Ok(()),
                Ok(out) => last = String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                Err(e) => last = e,
            }
        }
        if Instant::now() >= deadline {
            return Err(StartError::TimedOut(last));
        }
        thread::sleep(POLL);
    }
}

/// Whether the server's log says it could not bind `port`: after `could not
/// bind IPv4 address "127.0.0.1": Address already in use` (no port there)
/// comes `HINT:  Is another postmaster already running on port PORT?` (the
/// messages are in English: `initdb --locale=C` sets `lc_messages`).
fn port_taken(dir: &Path, port: u16) -> bool {
    let hint = format!("already running on port {port}?");
    fs::read_to_string(dir.join(LOG_FILE)).is_ok_and(|log| log.contains(&hint))
}

/// `psql`'s arguments and environment for `database` on `port`.
fn psql_args(cmd: &mut Command, port: u16, database: &str, connect_timeout: &str) {
    cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .args(["-h", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(["-U", SUPERUSER, "-d", database])
        .env("PGCONNECT_TIMEOUT", connect_timeout)
        // What else libpq would take from the environment and that could
        // change the session.
        .env_remove("PGOPTIONS")
        .env_remove("PGSERVICE")
        .env_remove("PGSSLMODE")
        .env_remove("PGTARGETSESSIONATTRS")
        .stdin(Stdio::null());
}

/// Runs `cmd` with `input` on its stdin (else the stdin it has) and its
/// output captured, killing it after `timeout`.
fn run_bounded(
    cmd: &mut Command,
    input: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Output, String> {
    let program = Path::new(cmd.get_program()).display().to_string();
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A thread of its own: the program may answer before it has read
        // all of a long input. A write error means it stopped reading
        // (exited); its status tells why.
        thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    let out_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        let _ = tx.send(());
        buf
    });
    let err_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    // End of stdout: the program has exited (or closed it, about to).
    let finished = rx.recv_timeout(timeout).is_ok();
    if !finished {
        let _ = child.kill();
    }
    let status = child.wait().map_err(|e| format!("{program}: {e}"))?;
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    if !finished {
        return Err(format!("{program} did not finish within {timeout:?}"));
    }
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

fn valid_database_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `sh`, in a process group of its own (a Ctrl-C does not end it), that
/// continues `pids` when its stdin reaches end of file: when we drop the
/// returned `ChildStdin`, or when the test process dies. A paused postmaster
/// would otherwise never act on its `PR_SET_PDEATHSIG` (`SIGQUIT` waits
/// while it is stopped). `(None, None)` if `sh` cannot be started: the pause
/// works without its guard.
fn spawn_guard(pids: &[u32]) -> (Option<Child>, Option<ChildStdin>) {
    let spawned = Command::new("sh")
        .args([
            "-c",
            "read _ignored; kill -s CONT \"$@\"",
            "testkit-postgres-guard",
        ])
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    match spawned {
        Ok(mut guard) => {
            let stdin = guard.stdin.take();
            (Some(guard), stdin)
        }
        Err(_) => (None, None),
    }
}

/// Sends `sig` to `pid`, ignoring errors (it may be gone).
fn signal_pid(pid: u32, sig: libc::c_int) {
    // SAFETY: plain syscall. The pids are the postmaster's children, which
    // cannot be reaped (and their pids reused) while it is stopped.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// Stops the postmaster's group, `SIGKILL`s everything below it and the
/// group, reaps the postmaster, and waits (bounded) for the rest to be gone;
/// then removes what the crash left outside `data` (the data directory).
/// Never panics.
fn kill_tree(child: &mut Child, data: &Path) {
    if matches!(child.try_wait(), Ok(None)) {
        kill_running_tree(child);
    }
    remove_stale_shared_memory(data);
}

/// [`kill_tree`] of a postmaster that has not exited.
fn kill_running_tree(child: &mut Child) {
    let pgid = child.id() as libc::pid_t;
    // SAFETY: our own unreaped child's process group.
    unsafe { libc::kill(-pgid, libc::SIGSTOP) };
    // Once the postmaster is dead its children belong to init and can no
    // longer be found: list them while it is stopped (and forks no more).
    let _ = wait_state(&[child.id()], true);
    let below = descendants(child.id());
    for &pid in &below {
        signal_pid(pid, libc::SIGKILL);
    }
    // SAFETY: as above.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
    let deadline = Instant::now() + SIGNAL_SETTLE_TIMEOUT;
    while !below.iter().all(|&pid| dead(pid)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(2));
    }
}

/// Removes the System V shared memory segment of a postmaster that did not
/// exit cleanly (a `SIGKILL`): a clean exit removes it, and so would the
/// next start on the same data directory, which never comes. It is small
/// (PostgreSQL keeps its shared memory in an anonymous mapping) but counts
/// against the system's limits. Its key and id are on line 7 of
/// `postmaster.pid` (which a clean exit removes); it is removed only if it
/// still has that key and no process is attached.
fn remove_stale_shared_memory(data: &Path) {
    let Ok(pid_file) = fs::read_to_string(data.join("postmaster.pid")) else {
        return;
    };
    let Some((key, id)) = pid_file.lines().nth(6).and_then(|line| {
        let mut it = line.split_whitespace();
        let key: libc::c_ulong = it.next()?.parse().ok()?;
        let id: libc::c_int = it.next()?.parse().ok()?;
        Some((key, id))
    }) else {
        return;
    };
    // SAFETY: `shmid_ds` is plain old data; all-zero is a valid value that
    // IPC_STAT overwrites.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT writes into `ds`, which is valid for the call.
    if unsafe { libc::shmctl(id, libc::IPC_STAT, &mut ds) } != 0 {
        return;
    }
    // PostgreSQL writes the key (an int) as an unsigned long.
    if ds.shm_perm.__key as libc::c_ulong != key || ds.shm_nattch != 0 {
        return;
    }
    // SAFETY: IPC_RMID takes no buffer.
    unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
}

/// Every process below `root` (children, their children, ...), from the
/// parent pids in `/proc/*/stat`. Empty if `/proc` cannot be read.
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            Some((pid, parent_pid(&stat)?))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|&&(pid, ppid)| ppid == parent && !found.contains(&pid))
                .map(|&(pid, _)| pid)
                .collect::<Vec<_>>(),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// The parent pid in the text of `/proc/PID/stat`.
fn parent_pid(stat: &str) -> Option<u32> {
    // The command name is in parentheses and may contain spaces.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Gone, or a zombie: either way it runs no more.
fn dead(pid: u32) -> bool {
    process_state(pid).is_none_or(|state| matches!(state, 'Z' | 'X'))
}

/// Waits until every one of `pids` is stopped (`T`), or none is (each may
/// be gone too); `false` if that did not happen within the bound.
fn wait_state(pids: &[u32], stopped: bool) -> bool {
    let deadline = Instant::now() + SIGNAL_SETTLE_TIMEOUT;
    loop {
        let settled = pids.iter().all(|&pid| match process_state(pid) {
            None | Some('Z' | 'X') => true,
            Some(state) => (state == 'T') == stopped,
        });
        if settled {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// The last lines of the server's log, for panic messages.
fn log_tail(dir: &Path) -> String {
    const LINES: usize = 30;
    let path = dir.join(LOG_FILE);
    match fs::read_to_string(&path) {
        Ok(text) if text.trim().is_empty() => format!("({} is empty)", path.display()),
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(LINES)..].join("\n");
            format!("--- tail of {} ---\n{tail}", path.display())
        }
        Err(e) => format!("(no {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn fake_install(root: &Path, version: &str) {
        let bin = root.join(version).join("bin");
        fs::create_dir_all(&bin).unwrap();
        for name in ["initdb", "postgres"] {
            fs::write(bin.join(name), "#!/bin/sh\n").unwrap();
            fs::set_permissions(bin.join(name), fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    #[test]
    fn finds_pg_bin_else_the_highest_version() {
        let root = tempfile::tempdir().unwrap();
        let err = find_install(None, root.path()).unwrap_err();
        assert!(err.contains("apt-get install -y postgresql"), "{err}");

        fake_install(root.path(), "9.6");
        fake_install(root.path(), "15");
        fake_install(root.path(), "13");
        // Not a version, and a version without binaries: ignored.
        fake_install(root.path(), "latest");
        fs::create_dir_all(root.path().join("17/bin")).unwrap();
        assert_eq!(
            find_install(None, root.path()).unwrap(),
            root.path().join("15/bin")
        );

        let pg_bin = root.path().join("13/bin");
        assert_eq!(
            find_install(Some(pg_bin.clone().into()), root.path()).unwrap(),
            pg_bin
        );
        // An empty PG_BIN counts as unset; a wrong one is an error.
        assert_eq!(
            find_install(Some("".into()), root.path()).unwrap(),
            root.path().join("15/bin")
        );
        let err = find_install(Some("/nonexistent".into()), root.path()).unwrap_err();
        assert!(
            err.starts_with(NOT_FOUND) && err.contains("PG_BIN=/nonexistent"),
            "{err}"
        );
    }

    #[test]
    fn reads_the_version() {
        assert_eq!(
            parse_version("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)\n").as_deref(),
            Some("15.18")
        );
        assert_eq!(
            parse_version("postgres (PostgreSQL) 17beta1").as_deref(),
            Some("17beta1")
        );
        assert_eq!(parse_version("postgres"), None);
        assert_eq!(major_version("15.18"), 15);
        assert_eq!(major_version("17beta1"), 17);
        assert_eq!(major_version("9.6.24"), 9);
        assert_eq!(parse_version("a b ../x"), None);
    }

    #[test]
    fn reads_the_parent_pid_after_a_command_with_spaces_and_parens() {
        assert_eq!(parent_pid("123 (postgres: x (y)) S 45 123 123 0"), Some(45));
        assert_eq!(parent_pid("garbage"), None);
    }

    #[test]
    fn database_names() {
        assert!(valid_database_name("orders_2-b"));
        assert!(!valid_database_name(""));
        assert!(!valid_database_name("a\"b"));
        assert!(!valid_database_name("a b"));
        assert!(!valid_database_name("dbname=x"));
        assert!(!valid_database_name(&"x".repeat(64)));
    }

    /// Ports handed out by `scripted_port`.
    static SCRIPT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

    fn scripted_port() -> u16 {
        SCRIPT.lock().unwrap().pop().unwrap_or_else(free_port)
    }

    #[test]
    fn start_retries_on_a_new_port_when_the_port_is_taken() {
        let blocker = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let taken = blocker.local_addr().unwrap().port();
        *SCRIPT.lock().unwrap() = vec![taken];
        let pg = Postgres::start_on(scripted_port);
        assert_ne!(pg.port(), taken);
        assert_eq!(pg.psql("show port"), pg.port().to_string());
        // The failed attempt is in the log.
        let log = fs::read_to_string(pg.log_path()).unwrap();
        assert!(
            log.contains(&format!("already running on port {taken}?")),
            "{log}"
        );
    }

    #[test]
    fn finds_root_as_root() {
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } == 0 {
            assert!(lookup_user("root").is_some_and(|(uid, gid)| uid == 0 && gid == 0));
        }
        assert_eq!(lookup_user("no-such-user-testkit"), None);
    }
}
