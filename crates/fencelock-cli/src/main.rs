//! `fencelock`: run a command while holding a distributed lock on Redis.
//!
//! ```text
//! fencelock run [OPTIONS] NAME -- COMMAND [ARGS...]
//! ```
//!
//! Takes the lock `NAME` (waiting up to `--wait`), runs `COMMAND` without a shell, in
//! its own process group, with `FENCELOCK_NAME` and `FENCELOCK_TOKEN` (the fencing
//! token, decimal) in its environment, waits for it, releases the lock, and exits with
//! the command's status. SIGINT, SIGTERM and SIGHUP are forwarded to the command's
//! process group while it runs.
//!
//! The lease (`--ttl`) is renewed by the library's watchdog every third of it for as
//! long as the command runs, up to `--max-hold` if given. If the lease is lost
//! ([`LockGuard::lost`]), fencelock stops the command's whole process group: SIGTERM
//! (and SIGCONT, so a stopped member can act on it), up to `--kill-grace` for the
//! command to exit, SIGKILL; once the command has exited, SIGKILL once more for anything
//! of its group that outlived it. Then it releases the lock if the key still holds its
//! token (at the maximum hold, or with a renewal unconfirmed, it may, for a moment) and
//! exits 76.
//!
//! # Exit status
//!
//! | code | meaning |
//! |---|---|
//! | the command's | the command ran and exited under the lock: its exit code, or 128+N if signal N killed it |
//! | 64 | bad usage or input: the command line does not parse (bad option, DURATION, missing COMMAND); [`Error::InvalidArgument`] (lock name, TTL, key prefix, Redis URL); COMMAND not found or not executable (the lock is released first) |
//! | 69 | Redis unavailable or refusing: [`Error::Unavailable`], [`Error::Rejected`] (`NOAUTH`, `READONLY`, ...), [`Error::WrongType`] (a lock key holds data fencelock did not write), [`Error::NoQuorum`] (Redlock: too few nodes reachable or out of quarantine) |
//! | 70 | internal error: the runtime or signal handlers could not be set up, or a library error this version does not know |
//! | 75 | lock not acquired within `--wait`: [`Error::Held`] (with Redlock: held on enough nodes to block a majority) |
//! | 76 | the lease was lost while the command ran: its process group was stopped (SIGTERM, then SIGKILL after `--kill-grace`); also when the release finds the lease already lost ([`Error::LeaseLost`]) as the command exits: its work may have overlapped another holder's |
//! | 128+N | fencelock got signal N (SIGINT, SIGTERM, SIGHUP) before the command started |
//!
//! Every error is one line on stderr: `fencelock: <message>`.

mod duration;

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fencelock::limits::{MAX_HOLD, MAX_LEASE, MIN_LEASE};
use fencelock::{Client, Error, LockGuard, LossCause};
use tokio::process::Child;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Bad usage or input.
const EX_USAGE: u8 = 64;
/// Redis unavailable or refusing.
const EX_UNAVAILABLE: u8 = 69;
/// Internal error.
const EX_SOFTWARE: u8 = 70;
/// The lock was not acquired within `--wait`.
const EX_TEMPFAIL: u8 = 75;
/// The lease was lost while COMMAND ran (or by the time it exited).
const EX_LEASE_LOST: u8 = 76;

const AFTER_HELP: &str = "\
Exit status:
  COMMAND's   COMMAND ran and exited under the lock: its exit code, or 128+N if
              signal N killed it
  64          bad usage or input: an invalid option, DURATION, lock name, TTL,
              key prefix or Redis URL; no COMMAND; COMMAND not found or not
              executable (the lock is released first)
  69          Redis unavailable or refusing: unreachable or not answering, an
              error reply such as NOAUTH or READONLY, or a lock key that holds
              data fencelock did not write (left untouched); with Redlock, too
              few nodes reachable (or out of restart quarantine)
  70          internal error
  75          lock not acquired within --wait: another owner holds it (with
              Redlock: holds enough nodes to block a majority)
  76          the lease was lost while COMMAND ran: COMMAND's process group was
              stopped (SIGTERM, then SIGKILL after --kill-grace); also when the
              release finds the lease already lost as COMMAND exits, whatever
              COMMAND's status: its work may have overlapped another holder's
  128+N       fencelock got signal N (SIGINT, SIGTERM, SIGHUP) before COMMAND
              started

The lease: fencelock renews it (to --ttl, every third of --ttl) for as long as
COMMAND runs, up to --max-hold if given. If fencelock itself dies, the lock frees
itself within --ttl (while COMMAND, in its own process group, runs on). If the
lease is lost (its key expired or was deleted,
another owner holds the lock, Redis did not confirm a renewal in time, or
--max-hold was reached), fencelock prints one line on stderr, sends SIGTERM and
SIGCONT to COMMAND's process group, waits up to --kill-grace for COMMAND to
exit, sends SIGKILL to the group, deletes the lock key if it still holds
fencelock's token (at --max-hold it does, for a moment), and exits 76.
Anything of the group still running once COMMAND has exited gets SIGKILL too.

Process group: COMMAND runs in a process group of its own, so that its children
can be stopped with it; SIGINT, SIGTERM and SIGHUP that fencelock gets are
forwarded to that whole group, and fencelock waits for COMMAND to exit, then
releases the lock. COMMAND is therefore not in the terminal's foreground process
group: if it reads from the terminal, it is stopped (SIGTTIN); give it its input
another way (< file, a pipe). Processes that leave the group (setsid, setpgid)
are not signalled.";

/// Distributed locks on Redis with fencing tokens.
#[derive(Debug, Parser)]
#[command(
    name = "fencelock",
    version,
    subcommand_value_name = "SUBCOMMAND",
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run COMMAND while holding the lock NAME, then release it.
    ///
    /// COMMAND runs without a shell, in its own process group, with stdin, stdout and
    /// stderr inherited, and with FENCELOCK_NAME (the lock name) and FENCELOCK_TOKEN
    /// (the fencing token: a number higher than every earlier grant of NAME) in its
    /// environment. The lease is renewed while COMMAND runs; if it is lost, COMMAND's
    /// process group is stopped and fencelock exits 76.
    #[command(after_help = AFTER_HELP)]
    Run(RunArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Redis server URL: redis://[user:password@]host[:port][/db]. Give it an odd number
    /// of times, at least 3 (or a comma-separated list in FENCELOCK_REDIS), to lock with
    /// Redlock on independent masters: a majority must grant the lock.
    #[arg(
        long,
        value_name = "URL",
        env = "FENCELOCK_REDIS",
        hide_env_values = true,
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:6379"
    )]
    redis: Vec<String>,

    /// How long the lease lasts (10ms to 24h). It is renewed every third of that while
    /// COMMAND runs, so COMMAND may take longer; a crashed fencelock blocks others for at
    /// most this long. DURATION: a whole number with a unit (ms, s, m, h), like 500ms,
    /// 30s, 2m, 1h.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_ttl, allow_hyphen_values = true)]
    ttl: Duration,

    /// The longest the lock is held, from the acquire (10ms to 8760h; default: no limit).
    /// Renewals stop there and the lease runs out: COMMAND is then stopped as for a lost
    /// lease, and fencelock exits 76.
    #[arg(long, value_name = "DURATION", value_parser = parse_max_hold, allow_hyphen_values = true)]
    max_hold: Option<Duration>,

    /// Once the lease is lost: how long COMMAND gets to exit after SIGTERM before its
    /// process group gets SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::parse, allow_hyphen_values = true)]
    kill_grace: Duration,

    /// Redlock: a node that restarted less than this ago (or less than --ttl, if longer)
    /// may have lost locks it held, so it does not vote until then; 0 turns the
    /// protection off.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration::parse, allow_hyphen_values = true)]
    restart_protection: Duration,

    /// How long to wait for a lock held by another owner; 0 tries once.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = duration::parse, allow_hyphen_values = true)]
    wait: Duration,

    /// Prefix of the Redis keys: the lock key is PREFIX:{NAME}.
    #[arg(long, value_name = "PREFIX", default_value = "fencelock")]
    prefix: String,

    /// Serve waiters in arrival order (a FIFO queue in Redis). Every user of NAME must
    /// agree on this.
    #[arg(long)]
    fair: bool,

    /// The lock name.
    #[arg(value_name = "NAME")]
    name: String,

    /// The command to run, and its arguments, after `--`.
    #[arg(value_name = "COMMAND", last = true, required = true)]
    command: Vec<OsString>,
}

/// Why fencelock exits with a status of its own rather than COMMAND's.
#[derive(Debug)]
enum Failure {
    /// The command line does not parse.
    Usage(String),
    /// Connecting or acquiring failed.
    Lock(Error),
    /// COMMAND could not be started.
    Spawn { program: OsString, error: io::Error },
    /// fencelock got this signal before COMMAND started.
    Interrupted(i32),
    /// The operating system refused something fencelock needs.
    System(String),
    /// COMMAND exited with `status`, but by then the lease was lost (`reason`).
    LostByExit {
        name: String,
        reason: String,
        status: u8,
    },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(message) | Self::System(message) => f.write_str(message),
            Self::Lock(error) => error.fmt(f),
            Self::Spawn { program, error } => write!(f, "cannot run {program:?}: {error}"),
            Self::Interrupted(signal) => write!(
                f,
                "interrupted by {} before the command started; it was not run",
                signal_name(*signal)
            ),
            Self::LostByExit {
                name,
                reason,
                status,
            } => write!(
                f,
                "the lease on lock {name:?} was lost ({reason}) by the time COMMAND exited \
                 (with status {status}); its work may have overlapped another holder's"
            ),
        }
    }
}

/// The exit status for each way of failing (see the table at the top).
fn exit_code(failure: &Failure) -> u8 {
    match failure {
        Failure::Usage(_) => EX_USAGE,
        Failure::Spawn { .. } => EX_USAGE,
        Failure::Lock(Error::InvalidArgument { .. }) => EX_USAGE,
        Failure::Lock(Error::Unavailable { .. }) => EX_UNAVAILABLE,
        Failure::Lock(Error::Rejected { .. }) => EX_UNAVAILABLE,
        Failure::Lock(Error::WrongType { .. }) => EX_UNAVAILABLE,
        Failure::Lock(Error::Held { .. }) => EX_TEMPFAIL,
        Failure::Lock(Error::NoQuorum { .. }) => EX_UNAVAILABLE,
        Failure::Interrupted(signal) => signal_exit_code(*signal),
        Failure::LostByExit { .. } => EX_LEASE_LOST,
        Failure::Lock(_) => EX_SOFTWARE,
        Failure::System(_) => EX_SOFTWARE,
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version: clap prints them to stdout.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(&Failure::Usage(one_line(&e))),
    };
    let Command::Run(args) = cli.command;
    match run(args) {
        Ok(status) => ExitCode::from(status),
        Err(failure) => fail(&failure),
    }
}

/// Reports `failure` on stderr and picks the exit status.
fn fail(failure: &Failure) -> ExitCode {
    say(format_args!("{failure}"));
    ExitCode::from(exit_code(failure))
}

/// Squeezes a clap error (message, blank line, usage, hint) into its message, on one line.
fn one_line(error: &clap::Error) -> String {
    if error.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // Bare `fencelock`: clap would print the whole help.
        return "no subcommand given; usage: fencelock run [OPTIONS] NAME -- COMMAND [ARGS...]"
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
    format!("{message} (see 'fencelock run --help')")
}

/// `--ttl`: a DURATION within the library's range.
fn parse_ttl(text: &str) -> Result<Duration, String> {
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
fn parse_max_hold(text: &str) -> Result<Duration, String> {
    let max_hold = duration::parse(text)?;
    if (MIN_LEASE..=MAX_HOLD).contains(&max_hold) {
        Ok(max_hold)
    } else {
        Err(format!(
            "{text:?} is out of range; give between 10ms and 8760h (365 days)"
        ))
    }
}

/// Runs `fencelock run` to the end; `Ok` carries the exit status.
fn run(args: RunArgs) -> Result<u8, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::System(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(run_locked(args))
}

async fn run_locked(args: RunArgs) -> Result<u8, Failure> {
    // Installed first: from here on no signal ends fencelock while it may hold the lock.
    let mut signals = Signals::install()?;
    let held = acquire(&args, &mut signals).await?;
    match run_command(&args, &held, &mut signals).await {
        Ok(Ended::Stopped) => {
            // Owner-checked: deletes the key only if it is still ours (at the maximum
            // hold, or with a renewal unconfirmed, it is, for a moment), so that the
            // next holder need not wait for it to expire. Nothing to report otherwise.
            let _ = held.guard.release().await;
            Ok(EX_LEASE_LOST)
        }
        Ok(Ended::Exited(status)) => release_after(held, status).await,
        Err(failure) => {
            release(held.guard).await;
            Err(failure)
        }
    }
}

/// The lock as fencelock holds it.
struct Held {
    guard: LockGuard,
}

impl Held {
    /// Why the lease was lost, for messages.
    fn loss_reason(&self, cause: LossCause) -> String {
        match cause {
            LossCause::MaxHold => "--max-hold was reached".to_owned(),
            other => other.to_string(),
        }
    }
}

/// Connects and takes the lock; a signal abandons the attempt.
async fn acquire(args: &RunArgs, signals: &mut Signals) -> Result<Held, Failure> {
    // Checked before connecting, so a bad name is bad input whatever state Redis is in.
    fencelock::keys::validate_name(&args.name).map_err(Failure::Lock)?;
    let protection = Some(args.restart_protection).filter(|d| !d.is_zero());
    let builder = Client::redlock(args.redis.iter().map(String::as_str))
        .prefix(args.prefix.as_str())
        .restart_protection(protection);
    // One node: lazily, so that a node down now (a restart, a failover) is retried for
    // the whole --wait by the acquire, which then says it was unreachable. Redlock
    // connects tolerate a minority down anyway, and ask every node who it is, to refuse
    // one server named twice.
    let connecting = async {
        match args.redis.len() {
            1 => builder.connect_lazy().await,
            _ => builder.connect().await,
        }
    };
    let client = tokio::select! {
        result = connecting => result.map_err(Failure::Lock)?,
        signal = signals.recv() => return Err(Failure::Interrupted(signal)),
    };
    let mut lock = client
        .lock(args.name.as_str())
        .lease(args.ttl)
        .wait(args.wait);
    if let Some(max_hold) = args.max_hold {
        lock = lock.max_hold(max_hold);
    }
    if args.fair {
        lock = lock.fair();
    }
    let acquiring = lock.acquire();
    let signal = tokio::select! {
        result = acquiring => {
            let guard = result.map_err(Failure::Lock)?;
            return Ok(Held { guard });
        }
        signal = signals.recv() => signal,
    };
    // Dropping `acquiring` made the library withdraw, in the background, whatever its
    // last attempt may have written; let that finish before the runtime goes away.
    client.flush().await;
    Err(Failure::Interrupted(signal))
}

/// How COMMAND ended.
enum Ended {
    /// It exited with this status (see [`status_code`]).
    Exited(u8),
    /// The lease was lost and fencelock stopped it.
    Stopped,
}

/// Starts COMMAND in its own process group under the lock and waits for it, forwarding
/// signals to the group; if the lease is lost first, stops the group.
async fn run_command(args: &RunArgs, held: &Held, signals: &mut Signals) -> Result<Ended, Failure> {
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(Failure::Usage("no COMMAND given after '--'".to_owned()));
    };
    let guard = &held.guard;
    let mut child = tokio::process::Command::new(program)
        .args(program_args)
        .env("FENCELOCK_NAME", guard.name())
        .env("FENCELOCK_TOKEN", guard.fencing_token().to_string())
        .process_group(0)
        .spawn()
        .map_err(|error| Failure::Spawn {
            program: program.clone(),
            error,
        })?;
    let Some(group) = child.id().and_then(|pid| libc::pid_t::try_from(pid).ok()) else {
        return Err(Failure::System("the command has no process ID".to_owned()));
    };
    // The group's ID is COMMAND's pid (process_group(0)).
    let group = Group(group);
    let lost = guard.lost();
    tokio::pin!(lost);
    let cause = loop {
        tokio::select! {
            // COMMAND's exit first: if both happened, the release decides (76 if the
            // lease is gone by then).
            biased;
            status = child.wait() => {
                let status = status.map_err(|e| {
                    Failure::System(format!("cannot wait for the command: {e}"))
                })?;
                return Ok(Ended::Exited(status_code(status)));
            }
            signal = signals.recv() => group.signal(signal),
            cause = &mut lost => break cause,
        }
    };
    say(format_args!(
        "the lease on lock {:?} was lost ({}); stopping COMMAND",
        guard.name(),
        held.loss_reason(cause)
    ));
    stop(&mut child, group, args.kill_grace, signals).await;
    Ok(Ended::Stopped)
}

/// Stops COMMAND's process group: SIGTERM (and SIGCONT, so that a stopped member can
/// act on it), up to `grace` for COMMAND to exit, then SIGKILL. Once COMMAND has exited,
/// and before it is reaped, SIGKILL once more for whatever of its group outlived it.
/// Signals fencelock gets meanwhile are forwarded to the group.
async fn stop(child: &mut Child, group: Group, grace: Duration, signals: &mut Signals) {
    group.signal(libc::SIGTERM);
    group.signal(libc::SIGCONT);
    if tokio::time::timeout(grace, group.leader_exit(signals))
        .await
        .is_err()
    {
        group.signal(libc::SIGKILL);
        group.leader_exit(signals).await;
    }
    group.signal(libc::SIGKILL);
    // Reaps COMMAND; its status does not matter any more.
    let _ = child.wait().await;
}

/// Releases the lock after COMMAND exited with `status`: `Ok(status)`, unless the lease
/// turned out lost by then.
async fn release_after(held: Held, status: u8) -> Result<u8, Failure> {
    let name = held.guard.name().to_owned();
    // What the watchdog knew before the release stops it.
    let known_loss = held.guard.loss_cause().map(|cause| held.loss_reason(cause));
    let lost = |reason: String| {
        Err(Failure::LostByExit {
            name: name.clone(),
            reason,
            status,
        })
    };
    match (held.guard.release().await, known_loss) {
        (Ok(()), _) => Ok(status),
        (Err(Error::LeaseLost { cause, .. }), known) => {
            lost(known.unwrap_or_else(|| cause.to_string()))
        }
        // Redis could not tell, but the lease had already been given up for lost.
        (Err(_), Some(reason)) => lost(reason),
        (Err(e), None) => {
            warn_unreleased(&name, &e);
            Ok(status)
        }
    }
}

/// Releases the lock after COMMAND could not run; a failure is a warning, since the
/// error that stopped fencelock is what counts.
async fn release(guard: LockGuard) {
    let name = guard.name().to_owned();
    match guard.release().await {
        Ok(()) => {}
        Err(e @ Error::LeaseLost { .. }) => say(format_args!("warning: {e}")),
        Err(e) => warn_unreleased(&name, &e),
    }
}

fn warn_unreleased(name: &str, error: &Error) {
    say(format_args!(
        "warning: could not release lock {name:?}; it stays held until its TTL runs out: {error}"
    ));
}

/// Writes `fencelock: <message>` as one line on stderr. A stderr that cannot be written
/// (a closed pipe) is ignored: unlike `eprintln!`, this never panics, so fencelock goes
/// on to stop COMMAND or release the lock.
fn say(message: fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(io::stderr().lock(), "fencelock: {message}");
}

/// The shell's convention: the exit code, or 128+N for death by signal N.
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(EX_SOFTWARE),
        (None, Some(signal)) => signal_exit_code(signal),
        (None, None) => EX_SOFTWARE,
    }
}

fn signal_exit_code(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(EX_SOFTWARE)
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// COMMAND's process group. Its ID is COMMAND's pid, so while COMMAND is not reaped (it
/// may have exited) the ID names this group and nothing else: every method here is
/// called only before COMMAND is reaped.
#[derive(Clone, Copy, Debug)]
struct Group(libc::pid_t);

impl Group {
    /// Sends `signal` to every process of the group. Fails only if no process of it is
    /// left (or it is not ours to signal): nothing to do then.
    #[allow(unsafe_code)]
    fn signal(self, signal: i32) {
        // SAFETY: kill(2) touches no memory of this process. The group ID is our
        // unreaped child's pid, so it names no other process group (see above).
        unsafe {
            libc::kill(-self.0, signal);
        }
    }

    /// Whether the group's leader, COMMAND, has exited. Leaves it unreaped (`WNOWAIT`),
    /// so the group ID stays ours.
    #[allow(unsafe_code)]
    fn leader_exited(self) -> bool {
        loop {
            // SAFETY: `siginfo_t` is a plain C struct, for which all zeroes is a valid
            // value; `si_signo` stays 0 unless waitid reports a child.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid writes only to `info`, which outlives the call.
            let result = unsafe {
                libc::waitid(
                    libc::P_PID,
                    self.0 as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            if result == 0 {
                return info.si_signo != 0;
            }
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                // ECHILD: not our child any more, so it has exited.
                return true;
            }
        }
    }

    /// Waits until COMMAND has exited, without reaping it; forwards the signals
    /// fencelock gets meanwhile to the group.
    async fn leader_exit(self, signals: &mut Signals) {
        // Every SIGCHLD after the check wakes the wait below: none is missed.
        while !self.leader_exited() {
            if let Some(signal) = signals.next(true).await {
                self.signal(signal);
            }
        }
    }
}

/// The signals fencelock catches instead of dying: SIGINT, SIGTERM, SIGHUP, which it
/// forwards to COMMAND's process group; and SIGCHLD, to learn when COMMAND exits without
/// reaping it.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    child: Signal,
}

impl Signals {
    fn install() -> Result<Self, Failure> {
        let catch = |kind: SignalKind| {
            signal(kind)
                .map_err(|e| Failure::System(format!("cannot install a signal handler: {e}")))
        };
        Ok(Self {
            interrupt: catch(SignalKind::interrupt())?,
            terminate: catch(SignalKind::terminate())?,
            hangup: catch(SignalKind::hangup())?,
            child: catch(SignalKind::child())?,
        })
    }

    /// The next SIGINT, SIGTERM or SIGHUP received (since installation), as its number.
    async fn recv(&mut self) -> i32 {
        loop {
            if let Some(signal) = self.next(false).await {
                return signal;
            }
        }
    }

    /// The next signal received (since installation): SIGINT, SIGTERM or SIGHUP as its
    /// number, or `None` for a SIGCHLD if `with_child`.
    async fn next(&mut self, with_child: bool) -> Option<i32> {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Some(libc::SIGINT),
            Some(()) = self.terminate.recv() => Some(libc::SIGTERM),
            Some(()) = self.hangup.recv() => Some(libc::SIGHUP),
            Some(()) = self.child.recv(), if with_child => None,
            else => std::future::pending().await,
        }
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

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let mut argv = vec!["fencelock", "run"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| {
            let Command::Run(args) = cli.command;
            args
        })
    }

    #[test]
    fn defaults() {
        let args = parse(&["job", "--", "true"]).unwrap();
        assert_eq!(args.ttl, Duration::from_secs(30));
        assert_eq!(args.max_hold, None);
        assert_eq!(args.kill_grace, Duration::from_secs(10));
        assert_eq!(args.wait, Duration::ZERO);
        assert_eq!(args.prefix, "fencelock");
        assert_eq!(args.name, "job");
        assert_eq!(args.command, [OsString::from("true")]);
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
    fn command_needs_the_double_dash() {
        assert!(parse(&["job", "true"]).is_err());
        assert!(parse(&["job"]).is_err());
        assert!(parse(&["job", "--"]).is_err());
        let args = parse(&["job", "--", "sh", "-c", "exit 1"]).unwrap();
        assert_eq!(args.command.len(), 3);
    }

    #[test]
    fn exit_codes() {
        let lock = |e| exit_code(&Failure::Lock(e));
        let held = Error::Held {
            name: "x".into(),
            blocked_by: fencelock::Blocker::NoExpiry,
            waited: Duration::ZERO,
            nodes: Vec::new(),
        };
        assert_eq!(lock(held), EX_TEMPFAIL);
        let invalid = Error::InvalidArgument {
            what: "lock name",
            reason: "empty".into(),
        };
        assert_eq!(lock(invalid), EX_USAGE);
        assert_eq!(exit_code(&Failure::Interrupted(libc::SIGTERM)), 143);
        let lost = Failure::LostByExit {
            name: "job".into(),
            reason: LossCause::Expired.to_string(),
            status: 0,
        };
        assert_eq!(exit_code(&lost), EX_LEASE_LOST);
        let message = lost.to_string();
        assert!(
            message.contains("lease") && message.contains("\"job\""),
            "{message}"
        );
        assert!(!message.contains('\n'), "{message}");
        assert_eq!(status_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(status_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
