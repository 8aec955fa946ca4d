//! The command line: its definition (clap), the DURATION checks that need the
//! library's limits, and clap's errors squeezed into one line.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fencelock::limits::{MAX_HOLD, MAX_LEASE, MIN_LEASE};

use crate::duration;

pub(crate) const AFTER_HELP: &str = "\
Exit status:
  COMMAND's   COMMAND ran and exited under the lock: its exit code, or 128+N if
              signal N killed it
  64          bad usage or input: an invalid option, DURATION, lock name, TTL,
              key prefix or Redis URL; no COMMAND
  69          Redis unavailable or refusing: unreachable or not answering (for
              all of --wait), an error reply such as NOAUTH or READONLY, or a
              lock key that holds data fencelock did not write (left untouched);
              with Redlock, too few nodes reachable (or out of restart
              quarantine)
  70          internal error
  75          lock not acquired within --wait: another owner holds it (with
              Redlock: holds enough nodes to block a majority)
  76          the lease was lost while COMMAND ran: COMMAND's process group was
              stopped; also when the release finds the lease lost while COMMAND
              ran, whatever COMMAND's status: its work may have overlapped
              another holder's
  126         COMMAND was found but could not be run (not executable)
  127         COMMAND was not found
  128+N       fencelock got signal N (SIGINT, SIGTERM, SIGHUP) before COMMAND
              started

COMMAND never runs without the lock. fencelock renews the lease (to --ttl, every
third of --ttl) for as long as COMMAND runs, up to --max-hold if given, and
tells a watcher in COMMAND's process group (`lease-watcher` in ps) each renewed
end of the lease. If fencelock dies (SIGKILL, the OOM killer, pkill fencelock),
the watcher stops COMMAND's group (SIGTERM, then SIGKILL at the end of the
lease); if fencelock is stopped or hangs, the watcher kills the group when the
lease ends.

If the lease is lost (its key expired or was deleted, the lock was broken,
another owner holds the lock, Redis did not confirm a renewal in time, or
--max-hold was reached),
fencelock prints one line on stderr, sends SIGTERM and SIGCONT to COMMAND's
process group, sends SIGKILL after --kill-grace or at the end of the lease,
whichever comes first, deletes the lock key if it still holds fencelock's token
(at --max-hold it does, for a moment), and exits 76. A release that Redis only
answers after the lease ended, for a COMMAND that ended inside it, is a warning,
and fencelock exits with COMMAND's status.

Terminal and jobs: COMMAND runs in a process group of its own, so that its
children are stopped with it. When fencelock runs in the terminal's foreground,
COMMAND's group gets the terminal while it runs (it can read it; Ctrl-C reaches
it). Ctrl-Z (or SIGTSTP to fencelock) suspends COMMAND and fencelock together,
and the suspended job keeps the lock: a keeper process renews the lease (up to
--max-hold) until `fg` or `bg`, and COMMAND goes on under the same lock. If the
lock could not be kept meanwhile, the watcher has killed COMMAND's group when
the lease ended, and fencelock exits 76. SIGINT, SIGTERM and SIGHUP that fencelock gets
are forwarded to COMMAND's group, each followed by SIGCONT. Processes that leave
the group (setsid, setpgid) are not signalled.

Several names (run NAME... -- COMMAND): fencelock takes every lock or none, in
one global order (sorted), so that runs over overlapping sets never deadlock;
while it waits for one of them it holds none of the others. COMMAND then gets
FENCELOCK_NAMES (the names, sorted, one per line) and FENCELOCK_TOKENS (one
NAME=TOKEN per line, each name's own fencing token; split a line at its last
'=') instead of FENCELOCK_NAME and FENCELOCK_TOKEN. Not with --fair, --shared
or --permits (exit 64). Ctrl-Z keeps every lock, as it keeps one: the keeper
renews all the leases until `fg` or `bg`; if one could not be kept, fencelock
exits 76 and releases the others once COMMAND is stopped.";

/// `elect`'s help after the options: exit statuses, and what it does when.
pub(crate) const ELECT_AFTER_HELP: &str = "\
Exit status:
  COMMAND's   COMMAND exited while leading (on its own, or after the SIGTERM
              fencelock forwarded): its exit code, or 128+N if signal N killed
              it; fencelock resigned first
  64          bad usage or input (as for run)
  69          Redis refusing: an error reply such as NOAUTH, or NAME held by a
              lock that is not an election's (left untouched)
  70          internal error
  76          leadership was lost just as COMMAND exited: its work may have
              overlapped the next leader's
  126, 127    COMMAND could not be run, or was not found (resigned first)
  128+N       fencelock got signal N (SIGINT, SIGTERM, SIGHUP) while standing by

While another process leads, fencelock waits: a resignation wakes it at once,
and a leader that died (kill -9, a lost host) is replaced when its lease (--ttl)
ends, never before. Redis unreachable meanwhile is retried, for ever.

While it leads, COMMAND is supervised as under run (see fencelock run --help):
the lease is renewed every third of --ttl, a watcher in COMMAND's group kills it
if fencelock dies or stops, and signals are forwarded. When leadership is lost
(a renewal refused or unconfirmed for the rest of the lease), fencelock stops
COMMAND's group (SIGTERM, SIGKILL after --kill-grace or at the end of the
lease), says so on stderr, and campaigns again.

When COMMAND exits on its own, fencelock resigns (a standby leads at once) and
exits with COMMAND's status rather than restarting it: a COMMAND that keeps
failing on one host then hands leadership to another, and the service manager
(systemd's Restart=, a container's restart policy) decides about restarts, as
it does for any service. SIGTERM (systemctl stop) reaches COMMAND; fencelock
resigns once it exited. A standby stopped by SIGTERM exits 143: list it in
systemd's SuccessExitStatus= if that is a clean stop for you.

The term fences only what checks it: a leader paused past its lease still runs
until fencelock notices (the watcher kills COMMAND at the end of the lease if
fencelock itself is stopped); a resource that keeps the highest term it
accepted (fencelock write, fencelock sql) refuses its late writes.";

/// The top level's help after the options: where the rest is (the exit statuses and the
/// supervision of COMMAND are `run`'s, on its help and on the fencelock(1) page).
pub(crate) const TOP_AFTER_HELP: &str = "\
Connection options (--redis, --user, --cacert, ...) go before or after the
subcommand. Exit statuses, and how COMMAND is supervised: fencelock run --help.
Each subcommand: fencelock help SUBCOMMAND. Manual pages: fencelock man --dir DIR.";

/// Distributed locks on Redis with fencing tokens.
#[derive(Debug, Parser)]
#[command(
    name = "fencelock",
    version,
    subcommand_value_name = "SUBCOMMAND",
    after_help = TOP_AFTER_HELP
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,

    /// Messages as JSON objects, one per line (`run`'s on stderr; reports on stdout)
    #[arg(long, global = true)]
    pub(crate) json: bool,

    /// Only errors: no status line while waiting, no notices.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub(crate) quiet: bool,

    /// The library's tracing on stderr too, debug and up (or what RUST_LOG says)
    #[arg(short, long, global = true)]
    pub(crate) verbose: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run COMMAND while holding the lock NAME (or every lock NAME...), then release it.
    ///
    /// COMMAND runs without a shell, in its own process group, with stdin, stdout and
    /// stderr inherited, and with FENCELOCK_NAME (the lock name) and FENCELOCK_TOKEN
    /// (the fencing token: a number higher than every earlier grant of NAME) in its
    /// environment (with several names, FENCELOCK_NAMES and FENCELOCK_TOKENS: see
    /// below). The lease is renewed while COMMAND runs; if it is lost, or
    /// fencelock dies or stops, COMMAND's process group is stopped.
    #[command(after_help = AFTER_HELP)]
    Run(RunArgs),

    /// Lead the election NAME, running COMMAND while leading; stand by otherwise.
    ///
    /// Campaigns (waits to lead, for ever); once it leads, runs COMMAND as `run` does,
    /// supervised the same way, with FENCELOCK_TERM (the leadership's term: higher than
    /// every earlier term of NAME; send it with writes a fenced resource must refuse from
    /// an old leader), FENCELOCK_TOKEN (the same number) and FENCELOCK_NAME in its
    /// environment. If leadership is lost, COMMAND's process group is stopped and
    /// fencelock campaigns again. When COMMAND exits, fencelock resigns and exits with
    /// COMMAND's status: a service manager restarts it.
    #[command(after_help = ELECT_AFTER_HELP)]
    Elect(ElectArgs),

    /// Show the lock NAME: who holds it, its lease, its fencing counter.
    ///
    /// Held or free, the remaining lease, who holds it (host, pid, command, since when,
    /// when the holder is fencelock), the fencing counter and the fair queue; per node
    /// for Redlock.
    Status(StatusArgs),

    /// List the held locks whose names match PATTERN.
    ///
    /// PATTERN is a glob (*, ?, [...]; default all); each lock with its remaining
    /// lease, found with SCAN on every node.
    List(ListArgs),

    /// Break the lock NAME, whoever holds it, and fence its holder out.
    ///
    /// Deletes its key, wakes its waiters, and advances its fencing counter so that a
    /// resource that checks tokens refuses the evicted holder's late writes. Asks first
    /// on a terminal; give --yes otherwise.
    Break(BreakArgs),

    /// Write to a resource kept in Redis, only under a current fencing token.
    ///
    /// The writes are applied, all of them, only if TOKEN is at least the highest token
    /// the resource accepted. For a COMMAND under `fencelock run`, whose FENCELOCK_NAME and FENCELOCK_TOKEN
    /// are the defaults of --resource and --token: a holder that was paused past its
    /// lease and resumes after a newer holder wrote gets exit status 76 and writes
    /// nothing. WRITE is one or more of: SET KEY VALUE, DEL KEY, INCRBY KEY N, HSET KEY
    /// FIELD VALUE, RPUSH KEY VALUE, LPUSH KEY VALUE, XADD KEY FIELD VALUE (entry ID *),
    /// PEXPIRE KEY MS, each with its arguments, in order; the replies are printed one
    /// per line. On a Redis Cluster, every KEY must carry the resource's name as its
    /// hash tag: {NAME}:...
    #[command(after_help = WRITE_AFTER_HELP)]
    Write(WriteArgs),

    /// Print the SQL that installs the fencing check in a PostgreSQL database.
    ///
    /// Install it with `fencelock sql | psql "$DATABASE_URL"`. Then a transaction calls
    /// `SELECT fencelock_check('NAME', TOKEN)` before its writes, and rolls back with
    /// SQLSTATE FL001 when a newer holder's token was accepted. Running the SQL again
    /// is safe.
    Sql,

    /// Print a shell completion script to stdout (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),

    /// Print a manual page (roff), or write them all into a directory.
    ///
    /// Without arguments, the page of fencelock itself: `fencelock man > fencelock.1`.
    /// With SUBCOMMAND, that subcommand's page: `fencelock man run > fencelock-run.1`.
    /// With --dir, every page: fencelock.1 and a fencelock-SUBCOMMAND.1 for each
    /// subcommand, written into DIR (created if missing), their paths printed one per
    /// line: `fencelock man --dir ~/.local/share/man/man1`.
    Man(ManArgs),

    /// The watcher of COMMAND's process group (started by `run`; not for people).
    #[command(name = "__watch", hide = true)]
    Watch(WatchArgs),

    /// The keeper of a suspended run's lock (started by `run`; not for people).
    #[command(name = "__keep", hide = true)]
    Keep(KeepArgs),
}

/// Where the locks live: the options every subcommand that talks to Redis takes.
/// (Its `Debug` shows no URL or password.)
#[derive(Args)]
pub(crate) struct Connection {
    /// Redis URL: redis://[user:password@]host[:port][/db],
    /// redis+unix:///path/to/socket[?db=N], a Sentinel-managed master
    /// redis+sentinel://host:port[,host:port...]/SERVICE[/DB], or a Redis Cluster
    /// redis+cluster://host:port[,host:port...] (rediss... for TLS). Give it an odd
    /// number of times, at least 3 (or a comma-separated list in FENCELOCK_REDIS), to
    /// lock with Redlock on independent masters: a majority must grant the lock.
    #[arg(
        long,
        value_name = "URL",
        env = "FENCELOCK_REDIS",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    redis: Vec<String>,

    /// Prefix of the Redis keys: the lock key is PREFIX:{NAME}.
    #[arg(long, value_name = "PREFIX", default_value = "fencelock")]
    pub(crate) prefix: String,

    /// ACL user to log in as (instead of the URL's).
    #[arg(
        long,
        value_name = "USER",
        env = "FENCELOCK_USER",
        hide_env_values = true
    )]
    pub(crate) user: Option<String>,

    /// Password to log in with (instead of the URL's). Prefer FENCELOCK_PASSWORD or
    /// --password-file: a command line is visible to every user of the machine.
    #[arg(
        long = "pass",
        short = 'a',
        value_name = "PASSWORD",
        env = "FENCELOCK_PASSWORD",
        hide_env_values = true,
        conflicts_with = "password_file",
        // A password may start with '-': taken as the value, not echoed back in an
        // "unexpected argument" error.
        allow_hyphen_values = true
    )]
    pub(crate) pass: Option<String>,

    /// Read the password from FILE (its first line).
    #[arg(
        long,
        value_name = "FILE",
        env = "FENCELOCK_PASSWORD_FILE",
        hide_env_values = true
    )]
    pub(crate) password_file: Option<PathBuf>,

    /// TLS (rediss:// URLs): trust the CA certificate(s) in this PEM file instead of the
    /// system's roots.
    #[arg(
        long,
        value_name = "FILE",
        env = "FENCELOCK_CACERT",
        hide_env_values = true
    )]
    pub(crate) cacert: Option<PathBuf>,

    /// TLS: client certificate (PEM) for servers that require one; needs --key.
    #[arg(
        long,
        value_name = "FILE",
        env = "FENCELOCK_CERT",
        hide_env_values = true,
        requires = "key"
    )]
    pub(crate) cert: Option<PathBuf>,

    /// TLS: private key (PEM) of the --cert certificate.
    #[arg(
        long,
        value_name = "FILE",
        env = "FENCELOCK_KEY",
        hide_env_values = true,
        requires = "cert"
    )]
    pub(crate) key: Option<PathBuf>,

    /// TLS: do not verify the server's certificate or host name. Anyone on the path can
    /// then pose as the server. (FENCELOCK_INSECURE takes 1/0, true/false, yes/no,
    /// on/off.)
    #[arg(
        long,
        env = "FENCELOCK_INSECURE",
        hide_env_values = true,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub(crate) insecure: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("urls", &self.redis.len())
            .field("prefix", &self.prefix)
            .field("user", &self.user)
            .field("pass", &self.pass.as_ref().map(|_| "<redacted>"))
            .field("password_file", &self.password_file)
            .field("cacert", &self.cacert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("insecure", &self.insecure)
            .finish()
    }
}

impl Connection {
    /// The URLs given: each `--redis`, and each URL of a comma-separated list (a comma
    /// starts a new URL only where a scheme follows, so the sentinels' or a cluster's
    /// `host:port,host:port` list stays in one URL).
    pub(crate) fn urls(&self) -> Vec<String> {
        let mut urls: Vec<String> = Vec::new();
        for value in &self.redis {
            for (i, part) in value.split(',').enumerate() {
                match urls.last_mut() {
                    Some(last) if i > 0 && !part.contains("://") => {
                        last.push(',');
                        last.push_str(part);
                    }
                    _ => urls.push(part.trim().to_owned()),
                }
            }
        }
        urls
    }
}

/// `fencelock elect`.
#[derive(Debug, Args)]
pub(crate) struct ElectArgs {
    #[command(flatten)]
    pub(crate) connection: Connection,

    /// How long a leadership's lease lasts (10ms to 24h): renewed every third of that
    /// while COMMAND runs; a leader that dies is replaced once it ends. DURATION as for
    /// run.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_ttl, allow_hyphen_values = true)]
    pub(crate) ttl: Duration,

    /// Once leadership is lost: how long COMMAND gets to exit after SIGTERM before its
    /// process group gets SIGKILL (never past the end of the lease).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::parse, allow_hyphen_values = true)]
    pub(crate) kill_grace: Duration,

    /// The election's name (a lock name: give other locks other names).
    #[arg(value_name = "NAME")]
    pub(crate) name: String,

    /// The command to run while leading, and its arguments, after `--`.
    #[arg(value_name = "COMMAND", last = true, required = true)]
    pub(crate) command: Vec<OsString>,
}

impl ElectArgs {
    /// As `run`'s arguments, for the supervision `run` uses (and the keeper of a
    /// suspended leader).
    pub(crate) fn into_run(self) -> RunArgs {
        RunArgs {
            connection: self.connection,
            ttl: self.ttl,
            max_hold: None,
            kill_grace: self.kill_grace,
            restart_protection: Duration::ZERO,
            wait: Duration::ZERO,
            fair: false,
            shared: false,
            permits: None,
            replicas: 0,
            names: vec![self.name],
            command: self.command,
            election: true,
        }
    }
}

/// `fencelock status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) connection: Connection,

    /// The lock name.
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
}

/// `fencelock list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub(crate) connection: Connection,

    /// Which lock names: a glob (*, ?, [...]); default all.
    #[arg(value_name = "PATTERN", default_value = "*")]
    pub(crate) pattern: String,
}

/// `fencelock break`.
#[derive(Debug, Args)]
pub(crate) struct BreakArgs {
    #[command(flatten)]
    pub(crate) connection: Connection,

    /// Break without asking (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,

    /// The lock name.
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
}

/// The exit statuses of `fencelock write`.
pub(crate) const WRITE_AFTER_HELP: &str = "\
Exit status:
  0    every write applied, TOKEN recorded
  64   bad usage or input: a WRITE, TOKEN, resource name or Redis URL; a key
       in another Redis Cluster slot than the resource
  69   Redis unavailable or refusing: unreachable, an error reply such as
       NOAUTH or READONLY, a write that the key's type refuses (WRONGTYPE:
       nothing written), a fence key that holds data fencelock did not write;
       after a timeout the writes may have been applied (all) or not: read the
       resource to know
  76   refused: the resource accepted a higher token, so this holder lost its
       lock; nothing written

Example, under the lock that guards the resource:
  fencelock run stock:42 -- fencelock write INCRBY '{stock:42}:sold' 1";

/// `fencelock write`.
#[derive(Debug, Args)]
pub(crate) struct WriteArgs {
    #[command(flatten)]
    pub(crate) connection: Connection,

    /// The resource: the name of the lock that guards it (FENCELOCK_NAME under
    /// `fencelock run`).
    #[arg(
        long,
        value_name = "NAME",
        env = "FENCELOCK_NAME",
        hide_env_values = true
    )]
    pub(crate) resource: String,

    /// The fencing token, decimal (FENCELOCK_TOKEN under `fencelock run`).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "FENCELOCK_TOKEN",
        hide_env_values = true,
        allow_hyphen_values = true
    )]
    pub(crate) token: String,

    /// The writes: a command (SET, DEL, INCRBY, HSET, RPUSH, LPUSH, XADD, PEXPIRE)
    /// followed by its arguments, then the next.
    #[arg(value_name = "WRITE", required = true, num_args = 1.., allow_hyphen_values = true)]
    pub(crate) writes: Vec<String>,
}

/// `fencelock completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    #[arg(value_name = "SHELL")]
    pub(crate) shell: clap_complete::Shell,
}

/// The subcommands that have a manual page of their own: every visible one.
pub(crate) const MAN_PAGES: [&str; 9] = [
    "run",
    "elect",
    "status",
    "list",
    "break",
    "write",
    "sql",
    "completions",
    "man",
];

/// `fencelock man`.
#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// Write every page (fencelock.1, fencelock-run.1, ...) into DIR, creating it if
    /// missing, and print the path of each page written.
    #[arg(long, value_name = "DIR", conflicts_with = "subcommand")]
    pub(crate) dir: Option<PathBuf>,

    /// Print this subcommand's page (fencelock-SUBCOMMAND(1)) instead of fencelock(1).
    #[arg(value_name = "SUBCOMMAND", value_parser = MAN_PAGES)]
    pub(crate) subcommand: Option<String>,
}

/// The keeper's arguments.
#[derive(Debug, Args)]
pub(crate) struct KeepArgs {
    /// The arguments of the `run` whose lock it keeps (after `fencelock`).
    #[arg(last = true, value_name = "RUN-ARGS")]
    pub(crate) run: Vec<std::ffi::OsString>,
}

/// The watcher's arguments.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// The end of the lease when COMMAND starts, as CLOCK_MONOTONIC ns.
    pub(crate) deadline_ns: u64,
    /// How long COMMAND gets after SIGTERM once fencelock is gone, in ms.
    pub(crate) grace_ms: u64,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) connection: Connection,

    /// How long the lease lasts (10ms to 24h). It is renewed every third of that while
    /// COMMAND runs (--ttl 6s: every 2 s), so COMMAND may take longer; a crashed fencelock blocks others for at
    /// most this long. DURATION: a whole number with a unit (ms, s, m, h), like 500ms,
    /// 30s, 2m, 1h.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_ttl, allow_hyphen_values = true)]
    pub(crate) ttl: Duration,

    /// The longest the lock is held, from the acquire (10ms to 8760h; default: no limit).
    /// Renewals stop there and the lease runs out: COMMAND is then stopped as for a lost
    /// lease, and fencelock exits 76.
    #[arg(long, value_name = "DURATION", value_parser = parse_max_hold, allow_hyphen_values = true)]
    pub(crate) max_hold: Option<Duration>,

    /// Once the lease is lost: how long COMMAND gets to exit after SIGTERM before its
    /// process group gets SIGKILL (never past the end of the lease).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::parse, allow_hyphen_values = true)]
    pub(crate) kill_grace: Duration,

    /// Redlock: a node that restarted less than this ago (or less than --ttl, if longer)
    /// may have lost locks it held, so it does not vote until then; 0 turns the
    /// protection off.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration::parse, allow_hyphen_values = true)]
    pub(crate) restart_protection: Duration,

    /// How long to wait for a lock held by another owner; 0 tries once.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = duration::parse, allow_hyphen_values = true)]
    pub(crate) wait: Duration,

    /// Serve waiters in arrival order (a FIFO queue in Redis), with --permits too. Every
    /// user of NAME must agree on this.
    #[arg(long, conflicts_with = "shared")]
    pub(crate) fair: bool,

    /// Take NAME's read side: many `--shared` commands run at once, while no plain `run
    /// NAME` (the writer) does. A writer that waits for the readers goes before new ones.
    #[arg(long, conflicts_with = "permits")]
    pub(crate) shared: bool,

    /// NAME is a semaphore with N permits (1 to 1000000): up to N commands run at once,
    /// each under a permit that is a lease of its own, supervised as for a lock. Every
    /// user of NAME must give the same N (another N: exit 64).
    #[arg(long, value_name = "N")]
    pub(crate) permits: Option<u32>,

    /// A grant counts only once N replicas of the master acknowledged it (WAIT, up to a
    /// tenth of --ttl): shrinks the window in which a failover loses a fresh grant.
    /// Default 0. A grant too few replicas acknowledged is released: exit 69.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) replicas: u32,

    /// The lock name; several: all of them are taken, or none (at most 64).
    #[arg(value_name = "NAME", required = true, num_args = 1..)]
    pub(crate) names: Vec<String>,

    /// The command to run, and its arguments, after `--`.
    #[arg(value_name = "COMMAND", last = true, required = true)]
    pub(crate) command: Vec<OsString>,

    /// Set by `elect`: COMMAND runs as a leader, with FENCELOCK_TERM.
    #[arg(skip)]
    pub(crate) election: bool,
}

impl RunArgs {
    /// The lock names for messages: `"job"`, or `"a", "b"`.
    pub(crate) fn label(&self) -> String {
        self.names
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The connection options that take a value (see [`Connection`]), long and short.
const CONNECTION_VALUED: [&str; 9] = [
    "--redis",
    "--prefix",
    "--user",
    "--pass",
    "-a",
    "--password-file",
    "--cacert",
    "--cert",
    "--key",
];

/// Parses the command line, with the connection options (`--redis URL`, `--user`, ...)
/// accepted before the subcommand too, as `--json` and `-q` are: `fencelock --redis URL
/// status NAME` is `fencelock status --redis URL NAME`. They belong to the subcommands
/// that talk to Redis, so clap takes them there; those given before the subcommand's
/// name are moved after it.
pub(crate) fn parse<I>(argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    Cli::try_parse_from(connection_after_subcommand(
        argv.into_iter().map(Into::into).collect(),
    ))
}

/// `argv` with the connection options found before the subcommand moved right after it.
fn connection_after_subcommand(argv: Vec<OsString>) -> Vec<OsString> {
    let mut before = Vec::new();
    let mut moved = Vec::new();
    let mut args = argv.into_iter();
    let program = args.next();
    let mut subcommand = None;
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy();
        if !text.starts_with('-') || text == "--" {
            subcommand = Some(arg);
            break;
        }
        let name = text.split_once('=').map_or(&*text, |(name, _)| name);
        if name == "--insecure" {
            moved.push(arg);
        } else if CONNECTION_VALUED.contains(&name) {
            let has_value = text.contains('=');
            moved.push(arg);
            if !has_value && let Some(value) = args.next() {
                moved.push(value);
            }
        } else if text.len() > 2 && text.starts_with("-a") && !text.starts_with("--") {
            // -aPASSWORD
            moved.push(arg);
        } else {
            before.push(arg);
        }
    }
    program
        .into_iter()
        .chain(before)
        .chain(subcommand)
        .chain(moved)
        .chain(args)
        .collect()
}

/// Squeezes a clap error (message, blank line, usage, hint) into its message, on one line.
pub(crate) fn one_line(error: &clap::Error) -> String {
    if error.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // Bare `fencelock`: clap would print the whole help.
        return "no subcommand given; usage: fencelock run|elect|status|list|break ... (see 'fencelock --help')"
            .to_owned();
    }
    let rendered = error.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    format!("{message} (see --help)")
}

/// `message` (from [`one_line`]), with a hint for the mistake behind `error` when it is
/// a known one: `fencelock run NAME COMMAND` (or `elect`) without the `--` that COMMAND
/// comes after.
pub(crate) fn with_hint(message: String, error: &clap::Error, args: &[OsString]) -> String {
    use clap::error::ErrorKind;
    // The subcommand: the first word that is not an option.
    let subcommand = args
        .iter()
        .skip(1)
        .find(|a| !a.to_string_lossy().starts_with('-'))
        .and_then(|a| a.to_str())
        .filter(|a| matches!(*a, "run" | "elect"));
    let dashes = args.iter().any(|a| a == "--");
    let kind = error.kind();
    match subcommand {
        // `run` takes every word before `--` as a lock name; `elect` takes one.
        Some(sub)
            if !dashes
                && matches!(
                    kind,
                    ErrorKind::UnknownArgument | ErrorKind::MissingRequiredArgument
                ) =>
        {
            let names = if sub == "run" {
                " (every word before -- is a lock name)"
            } else {
                ""
            };
            format!(
                "{message}; put COMMAND after --: fencelock {sub} NAME -- COMMAND [ARGS...]{names}"
            )
        }
        _ => message,
    }
}

/// `--ttl`: a DURATION within the library's range.
pub(crate) fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = duration::parse(text)?;
    if (MIN_LEASE..=MAX_LEASE).contains(&ttl) {
        Ok(ttl)
    } else {
        Err(format!(
            "{text:?} is out of range; give between 10ms and 24h"
        ))
    }
}

/// `--max-hold`: a DURATION within the library's range.
pub(crate) fn parse_max_hold(text: &str) -> Result<Duration, String> {
    let max_hold = duration::parse(text)?;
    if (MIN_LEASE..=MAX_HOLD).contains(&max_hold) {
        Ok(max_hold)
    } else {
        Err(format!(
            "{text:?} is out of range; give between 10ms and 8760h (365 days)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn every_visible_subcommand_has_a_man_page() {
        use clap::CommandFactory;
        let visible: Vec<String> = Cli::command()
            .get_subcommands()
            .filter(|sub| !sub.is_hide_set())
            .map(|sub| sub.get_name().to_owned())
            .collect();
        assert_eq!(visible, MAN_PAGES);
    }

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let mut argv = vec!["fencelock", "run"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Run(args) => args,
            other => unreachable!("parsed `run`, got {other:?}"),
        })
    }

    #[test]
    fn connection_options_go_before_or_after_the_subcommand() {
        let status = |argv: &[&str]| match parse_argv(argv).map(|cli| cli.command) {
            Ok(Command::Status(args)) => {
                Ok((args.connection.urls(), args.connection.user, args.name))
            }
            Ok(other) => panic!("parsed {other:?}"),
            Err(e) => Err(e.to_string()),
        };
        let expected = Ok((
            vec!["redis://h:1".to_owned()],
            Some("u".to_owned()),
            "x".to_owned(),
        ));
        assert_eq!(
            status(&["status", "--redis", "redis://h:1", "--user", "u", "x"]),
            expected
        );
        assert_eq!(
            status(&["--redis", "redis://h:1", "--user", "u", "status", "x"]),
            expected
        );
        assert_eq!(
            status(&["--redis=redis://h:1", "-q", "--user=u", "status", "x"]),
            expected
        );
        assert_eq!(
            status(&[
                "--json",
                "--user",
                "u",
                "status",
                "--redis",
                "redis://h:1",
                "x"
            ]),
            expected
        );
        // A subcommand that does not connect still refuses them.
        assert!(parse_argv(&["--redis", "redis://h:1", "sql"]).is_err());
    }

    fn parse_argv(argv: &[&str]) -> Result<Cli, clap::Error> {
        super::parse(std::iter::once("fencelock").chain(argv.iter().copied()))
    }

    #[test]
    fn defaults() {
        let args = parse(&["job", "--", "true"]).unwrap();
        assert_eq!(args.ttl, Duration::from_secs(30));
        assert_eq!(args.max_hold, None);
        assert_eq!(args.kill_grace, Duration::from_secs(10));
        assert_eq!(args.wait, Duration::ZERO);
        assert_eq!(args.connection.prefix, "fencelock");
        assert_eq!(args.names, ["job"]);
        assert_eq!(args.command, [OsString::from("true")]);
    }

    #[test]
    fn every_name_before_the_double_dash_is_taken() {
        let args = parse(&["c", "a", "b", "--", "true", "x"]).unwrap();
        assert_eq!(args.names, ["c", "a", "b"]);
        assert_eq!(args.command, [OsString::from("true"), OsString::from("x")]);
        assert_eq!(args.label(), r#""c", "a", "b""#);
        assert!(parse(&["--", "true"]).is_err());
    }

    #[test]
    fn negative_durations_reach_the_parser_and_are_rejected() {
        let err = parse(&["--wait", "-1s", "job", "--", "true"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("negative"), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }

    #[test]
    fn ttl_must_be_in_range() {
        for bad in ["0", "0s", "25h", "9ms"] {
            assert!(
                parse(&["--ttl", bad, "job", "--", "true"]).is_err(),
                "{bad}"
            );
        }
        assert!(parse(&["--ttl", "24h", "job", "--", "true"]).is_ok());
        assert!(parse(&["--ttl", "10ms", "job", "--", "true"]).is_ok());
    }

    #[test]
    fn max_hold_must_be_in_range() {
        for bad in ["0", "0s", "9ms", "8761h", "-1s"] {
            assert!(
                parse(&["--max-hold", bad, "job", "--", "true"]).is_err(),
                "{bad}"
            );
        }
        let args = parse(&["--max-hold", "8760h", "job", "--", "true"]).unwrap();
        assert_eq!(args.max_hold, Some(MAX_HOLD));
        let args = parse(&[
            "--max-hold",
            "10ms",
            "--kill-grace",
            "0",
            "job",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(args.max_hold, Some(Duration::from_millis(10)));
        assert_eq!(args.kill_grace, Duration::ZERO);
    }

    #[test]
    fn a_comma_starts_a_new_url_only_before_a_scheme() {
        let urls = |values: &[&str]| {
            Connection {
                redis: values.iter().map(|v| (*v).to_owned()).collect(),
                prefix: String::new(),
                user: None,
                pass: None,
                password_file: None,
                cacert: None,
                cert: None,
                key: None,
                insecure: false,
            }
            .urls()
        };
        assert_eq!(
            urls(&["redis://a:1,redis://b:2", "redis://c:3"]),
            ["redis://a:1", "redis://b:2", "redis://c:3"]
        );
        assert_eq!(
            urls(&["redis+sentinel://a:1,b:2,c:3/svc"]),
            ["redis+sentinel://a:1,b:2,c:3/svc"]
        );
        assert_eq!(
            urls(&["redis+sentinel://a:1,b:2/s1,redis+sentinel://c:3,d:4/s2,redis://e:5"]),
            [
                "redis+sentinel://a:1,b:2/s1",
                "redis+sentinel://c:3,d:4/s2",
                "redis://e:5"
            ]
        );
    }

    #[test]
    fn command_needs_the_double_dash() {
        assert!(parse(&["job", "true"]).is_err());
        assert!(parse(&["job"]).is_err());
        assert!(parse(&["job", "--"]).is_err());
        let args = parse(&["job", "--", "sh", "-c", "exit 1"]).unwrap();
        assert_eq!(args.command.len(), 3);
    }
}
