//! `fencelock`: run a command while holding a distributed lock on Redis.
//!
//! ```text
//! fencelock run [OPTIONS] NAME -- COMMAND [ARGS...]
//! ```
//!
//! Takes the lock `NAME` (waiting up to `--wait`), runs `COMMAND` without a shell, with
//! `FENCELOCK_NAME` and `FENCELOCK_TOKEN` (the fencing token, decimal) in its
//! environment, waits for it, releases the lock, and exits with the command's status.
//! SIGINT, SIGTERM and SIGHUP are forwarded to the command while it runs.
//!
//! # Exit status
//!
//! | code | meaning |
//! |---|---|
//! | the command's | the command ran: its exit code, or 128+N if signal N killed it |
//! | 64 | bad usage or input: the command line does not parse (bad option, DURATION, missing COMMAND); [`Error::InvalidArgument`] (lock name, TTL, key prefix, Redis URL); COMMAND not found or not executable (the lock is released first) |
//! | 69 | Redis unavailable or refusing: [`Error::Unavailable`], [`Error::Rejected`] (`NOAUTH`, `READONLY`, ...), [`Error::WrongType`] (a lock key holds data fencelock did not write) |
//! | 70 | internal error: the runtime or signal handlers could not be set up, or a library error this version does not know |
//! | 75 | lock not acquired within `--wait`: [`Error::Held`], [`Error::WaitTimedOut`] |
//! | 128+N | fencelock got signal N (SIGINT, SIGTERM, SIGHUP) before the command started |
//!
//! For now the lock is held for at most `--ttl`: it is not extended while the command
//! runs. If the lease ran out ([`Error::LeaseLost`] on release), fencelock prints a
//! warning and still exits with the command's status.
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
use fencelock::{Client, Error, LockGuard, MAX_TTL, MIN_TTL};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Bad usage or input.
const EX_USAGE: u8 = 64;
/// Redis unavailable or refusing.
const EX_UNAVAILABLE: u8 = 69;
/// Internal error.
const EX_SOFTWARE: u8 = 70;
/// The lock was not acquired within `--wait`.
const EX_TEMPFAIL: u8 = 75;

const AFTER_HELP: &str = "\
Exit status:
  COMMAND's   COMMAND ran: its exit code, or 128+N if signal N killed it
  64          bad usage or input: an invalid option, DURATION, lock name, TTL,
              key prefix or Redis URL; no COMMAND; COMMAND not found or not
              executable (the lock is released first)
  69          Redis unavailable or refusing: unreachable or not answering, an
              error reply such as NOAUTH or READONLY, or a lock key that holds
              data fencelock did not write (left untouched)
  70          internal error
  75          lock not acquired within --wait: another owner holds it
  128+N       fencelock got signal N (SIGINT, SIGTERM, SIGHUP) before COMMAND
              started

While COMMAND runs, SIGINT, SIGTERM and SIGHUP are forwarded to it; fencelock
waits for it to exit, then releases the lock.

For now the lock is held for at most --ttl: it is not extended while COMMAND
runs, so give a TTL longer than COMMAND takes. If the lease ran out, fencelock
warns on stderr and still exits with COMMAND's status.";

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
    /// COMMAND runs without a shell, with stdin, stdout and stderr inherited, and with
    /// FENCELOCK_NAME (the lock name) and FENCELOCK_TOKEN (the fencing token: a number
    /// higher than every earlier grant of NAME) in its environment.
    #[command(after_help = AFTER_HELP)]
    Run(RunArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Redis server URL: redis://[user:password@]host[:port][/db].
    #[arg(
        long,
        value_name = "URL",
        env = "FENCELOCK_REDIS",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    redis: String,

    /// How long the lease lasts (1ms to 24h). DURATION: a whole number with a unit
    /// (ms, s, m, h), like 500ms, 30s, 2m, 1h.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_ttl, allow_hyphen_values = true)]
    ttl: Duration,

    /// How long to wait for a lock held by another owner; 0 tries once.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = duration::parse, allow_hyphen_values = true)]
    wait: Duration,

    /// Prefix of the Redis keys: the lock key is PREFIX:{NAME}.
    #[arg(long, value_name = "PREFIX", default_value = "fencelock")]
    prefix: String,

    /// The lock name.
    #[arg(value_name = "NAME")]
    name: String,

    /// The command to run, and its arguments, after `--`.
    #[arg(value_name = "COMMAND", last = true, required = true)]
    command: Vec<OsString>,
}

/// Why fencelock stopped without running COMMAND to completion.
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
        Failure::Lock(Error::WaitTimedOut { .. }) => EX_TEMPFAIL,
        Failure::Interrupted(signal) => signal_exit_code(*signal),
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
    eprintln!("fencelock: {failure}");
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
    if (MIN_TTL..=MAX_TTL).contains(&ttl) {
        Ok(ttl)
    } else {
        Err(format!(
            "{text:?} is out of range; give between 1ms and 24h"
        ))
    }
}

/// Runs `fencelock run` to the end; `Ok` carries COMMAND's exit status.
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
    let guard = acquire(&args, &mut signals).await?;
    let outcome = run_command(&args.command, &guard, &mut signals).await;
    release(guard).await;
    outcome
}

/// Connects and takes the lock; a signal abandons the attempt.
async fn acquire(args: &RunArgs, signals: &mut Signals) -> Result<LockGuard, Failure> {
    // Checked before connecting, so a bad name is bad input whatever state Redis is in.
    fencelock::keys::validate_name(&args.name).map_err(Failure::Lock)?;
    let connecting = Client::builder(args.redis.as_str())
        .prefix(args.prefix.as_str())
        .connect();
    let client = tokio::select! {
        result = connecting => result.map_err(Failure::Lock)?,
        signal = signals.recv() => return Err(Failure::Interrupted(signal)),
    };
    let acquiring = client
        .lock(args.name.as_str())
        .ttl(args.ttl)
        .wait(args.wait)
        .acquire();
    let signal = tokio::select! {
        result = acquiring => return result.map_err(Failure::Lock),
        signal = signals.recv() => signal,
    };
    // Dropping `acquiring` made the library withdraw, in the background, whatever its
    // last attempt may have written; let that finish before the runtime goes away.
    client.flush().await;
    Err(Failure::Interrupted(signal))
}

/// Starts COMMAND under the lock and waits for it, forwarding signals; returns its
/// exit status.
async fn run_command(
    command: &[OsString],
    guard: &LockGuard,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let Some((program, program_args)) = command.split_first() else {
        return Err(Failure::Usage("no COMMAND given after '--'".to_owned()));
    };
    let mut child = tokio::process::Command::new(program)
        .args(program_args)
        .env("FENCELOCK_NAME", guard.name())
        .env("FENCELOCK_TOKEN", guard.fencing_token().to_string())
        .spawn()
        .map_err(|error| Failure::Spawn {
            program: program.clone(),
            error,
        })?;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| Failure::System(format!("cannot wait for the command: {e}")))?;
                return Ok(status_code(status));
            }
            signal = signals.recv() => {
                if let Some(pid) = child.id() {
                    send_signal(pid, signal);
                }
            }
        }
    }
}

/// Releases the lock; a failure is a warning, since COMMAND's status is what counts.
async fn release(guard: LockGuard) {
    let name = guard.name().to_owned();
    match guard.release().await {
        Ok(()) => {}
        Err(e @ Error::LeaseLost { .. }) => eprintln!("fencelock: warning: {e}"),
        Err(e) => eprintln!(
            "fencelock: warning: could not release lock {name:?}; it stays held until its TTL runs out: {e}"
        ),
    }
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

/// Sends `signal` to the child `pid`.
#[allow(unsafe_code)]
fn send_signal(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) touches no memory of this process. `pid` is our child, not yet
    // reaped (tokio's `Child::id` is `None` once it is), so it names no other process.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// The signals fencelock catches instead of dying: SIGINT, SIGTERM, SIGHUP.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
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
        })
    }

    /// The next signal received (since installation), as its number.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            Some(()) = self.interrupt.recv() => libc::SIGINT,
            Some(()) = self.terminate.recv() => libc::SIGTERM,
            Some(()) = self.hangup.recv() => libc::SIGHUP,
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
        for bad in ["0", "0s", "25h"] {
            assert!(
                parse(&["--ttl", bad, "job", "--", "true"]).is_err(),
                "{bad}"
            );
        }
        assert!(parse(&["--ttl", "24h", "job", "--", "true"]).is_ok());
        assert!(parse(&["--ttl", "1ms", "job", "--", "true"]).is_ok());
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
            remaining: None,
        };
        assert_eq!(lock(held), EX_TEMPFAIL);
        let invalid = Error::InvalidArgument {
            what: "lock name",
            reason: "empty".into(),
        };
        assert_eq!(lock(invalid), EX_USAGE);
        assert_eq!(exit_code(&Failure::Interrupted(libc::SIGTERM)), 143);
        assert_eq!(status_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(status_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
