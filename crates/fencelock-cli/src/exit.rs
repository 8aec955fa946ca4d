//! Exit statuses, and the one-line message that goes with each (see the table in
//! `main.rs`).

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};

use fencelock::Error;

/// Bad usage or input.
pub(crate) const EX_USAGE: u8 = 64;
/// Redis unavailable or refusing.
pub(crate) const EX_UNAVAILABLE: u8 = 69;
/// COMMAND was found but cannot be run (as `env` and `timeout` say it).
pub(crate) const EX_CANNOT_RUN: u8 = 126;
/// COMMAND was not found (as `env` and `timeout` say it).
pub(crate) const EX_NOT_FOUND: u8 = 127;
/// Internal error.
pub(crate) const EX_SOFTWARE: u8 = 70;
/// The lock was not acquired within `--wait`.
pub(crate) const EX_TEMPFAIL: u8 = 75;
/// The lease was lost while COMMAND ran (or by the time it exited); `write`: the
/// resource accepted a higher token (this holder lost its lock).
pub(crate) const EX_LEASE_LOST: u8 = 76;

/// Why fencelock exits with a status of its own rather than COMMAND's.
#[derive(Debug)]
pub(crate) enum Failure {
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
            Self::Lock(error) => lock_message(error, f),
            Self::Spawn { program, error } => match error.kind() {
                io::ErrorKind::NotFound => write!(f, "{program:?}: command not found"),
                io::ErrorKind::PermissionDenied => {
                    write!(f, "{program:?}: cannot run it: permission denied")
                }
                _ => write!(f, "cannot run {program:?}: {error}"),
            },
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

/// A library error as the CLI says it: the library's message, with the CLI's own advice
/// where it has some, and the driver's reason when the library kept it as the source.
fn lock_message(error: &Error, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match error {
        Error::Held {
            name,
            blocked_by,
            waited,
            nodes,
            ..
        } if nodes.is_empty() => {
            let (kind, free) = match blocked_by {
                fencelock::Blocker::Permits { .. } => ("semaphore", "has no free permit"),
                _ => ("lock", "is not free"),
            };
            if waited.is_zero() {
                write!(
                    f,
                    "{kind} {name:?} {free}: {blocked_by}; wait for it with --wait"
                )
            } else {
                write!(
                    f,
                    "gave up on {kind} {name:?} after waiting {}: {blocked_by}; wait longer with --wait",
                    fencelock::HumanDuration(*waited)
                )
            }
        }
        Error::WrongType { found, key, .. } => {
            fmt::Display::fmt(error, f)?;
            // The option that takes the name as what it is.
            let hint = match found.as_str() {
                "semaphore" => Some(
                    "; it is a semaphore: take it with --permits N (its count: fencelock status NAME)",
                ),
                "zset" if key.ends_with('}') => Some(
                    "; it is a semaphore: take it with --permits N (its count: fencelock status NAME)",
                ),
                "readers" => Some("; it is a read-write lock: take its read side with --shared"),
                "lock" | "string" | "hash" if key.ends_with('}') => {
                    Some("; it is a lock: take it without --permits")
                }
                _ => None,
            };
            f.write_str(hint.unwrap_or(""))
        }
        Error::NoQuorum { nodes, .. } => {
            fmt::Display::fmt(error, f)?;
            if nodes
                .iter()
                .any(|n| matches!(n.outcome, fencelock::NodeOutcome::Quarantined { .. }))
            {
                f.write_str(
                    " (restart protection: --wait waits it out, --restart-protection 0 turns it off)",
                )?;
            }
            Ok(())
        }
        // The library said what it found (not a Redis server, a certificate problem, ...):
        // the driver's own words would only add its parser's noise (`Parse error at 1
        // Unexpected ...`).
        Error::Unavailable { detail, .. } if !detail.is_empty() => fmt::Display::fmt(error, f),
        _ => {
            // The driver's reason, from the source chain, each part once.
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(e) = source {
                let part = e.to_string();
                if !text.contains(&part) {
                    text.push_str(": ");
                    text.push_str(&part);
                }
                source = e.source();
            }
            f.write_str(&text)
        }
    }
}

/// The exit status for each way of failing (see the table at the top).
pub(crate) fn exit_code(failure: &Failure) -> u8 {
    match failure {
        Failure::Usage(_) => EX_USAGE,
        Failure::Spawn { error, .. } => match error.kind() {
            io::ErrorKind::NotFound => EX_NOT_FOUND,
            _ => EX_CANNOT_RUN,
        },
        Failure::Lock(Error::InvalidArgument { .. } | Error::PermitsMismatch { .. }) => EX_USAGE,
        Failure::Lock(Error::Unavailable { .. }) => EX_UNAVAILABLE,
        Failure::Lock(Error::Rejected { .. }) => EX_UNAVAILABLE,
        Failure::Lock(Error::WrongType { .. }) => EX_UNAVAILABLE,
        Failure::Lock(Error::Unreplicated { .. }) => EX_UNAVAILABLE,
        Failure::Lock(Error::Held { .. }) => EX_TEMPFAIL,
        Failure::Lock(Error::NoQuorum { .. }) => EX_UNAVAILABLE,
        Failure::Lock(Error::Fenced { .. }) => EX_LEASE_LOST,
        Failure::Interrupted(signal) => signal_exit_code(*signal),
        Failure::LostByExit { .. } => EX_LEASE_LOST,
        Failure::Lock(_) => EX_SOFTWARE,
        Failure::System(_) => EX_SOFTWARE,
    }
}

/// Reports `failure` on stderr and picks the exit status.
pub(crate) fn fail(failure: &Failure) -> ExitCode {
    let code = exit_code(failure);
    if json() {
        use std::io::Write;
        let text = failure.to_string().replace(['\n', '\r'], " ");
        let line = serde_json::json!({ "level": "error", "message": text, "exit": code });
        let _ = writeln!(io::stderr().lock(), "{line}");
    } else {
        say(format_args!("{failure}"));
    }
    ExitCode::from(code)
}

/// How messages are written: for people (one line `fencelock: <message>`), or as JSON
/// objects, one per line. Set once, by `main`.
static JSON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
/// Whether notices (not errors or warnings) are silenced (`-q`).
static QUIET: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Chooses how messages are written, for the whole process.
pub(crate) fn set_output(json: bool, quiet: bool) {
    let _ = JSON.set(json);
    let _ = QUIET.set(quiet);
}

/// Whether messages are JSON.
pub(crate) fn json() -> bool {
    JSON.get().copied().unwrap_or(false)
}

/// Whether notices are silenced (`-q`).
pub(crate) fn quiet() -> bool {
    QUIET.get().copied().unwrap_or(false)
}

/// How important a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// fencelock stops, or COMMAND is stopped.
    Error,
    /// Something went wrong that does not change the exit status.
    Warning,
    /// What a person at a terminal likes to know (the lock is taken, Redis is slow);
    /// shown on a terminal unless `-q`, always in JSON.
    Notice,
}

/// Writes `message` on stderr, as one line: `fencelock: <message>` (warnings prefixed
/// `warning: `), or `{"level": ..., "message": ...}` with `--json`. A notice is written
/// for people only when stderr is a terminal and `-q` was not given. A stderr that
/// cannot be written (a closed pipe) is ignored: unlike `eprintln!`, this never panics,
/// so fencelock goes on to stop COMMAND or release the lock.
pub(crate) fn tell(level: Level, message: fmt::Arguments<'_>) {
    use std::io::{IsTerminal, Write};
    // One line, whatever the message holds (a driver error may span several).
    let text = message.to_string().replace(['\n', '\r'], " ");
    let mut err = io::stderr().lock();
    if json() {
        let level = match level {
            Level::Error => "error",
            Level::Warning => "warning",
            Level::Notice => "notice",
        };
        let line = serde_json::json!({ "level": level, "message": text });
        let _ = writeln!(err, "{line}");
        return;
    }
    match level {
        Level::Error => {
            let _ = writeln!(err, "fencelock: {text}");
        }
        Level::Warning => {
            let _ = writeln!(err, "fencelock: warning: {text}");
        }
        Level::Notice => {
            if !quiet() && io::stderr().is_terminal() {
                let _ = writeln!(err, "fencelock: {text}");
            }
        }
    }
}

/// An error line (see [`tell`]).
pub(crate) fn say(message: fmt::Arguments<'_>) {
    tell(Level::Error, message);
}

/// A warning line (see [`tell`]).
pub(crate) fn warn(message: fmt::Arguments<'_>) {
    tell(Level::Warning, message);
}

/// The shell's convention: the exit code, or 128+N for death by signal N.
pub(crate) fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(EX_SOFTWARE),
        (None, Some(signal)) => signal_exit_code(signal),
        (None, None) => EX_SOFTWARE,
    }
}

pub(crate) fn signal_exit_code(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(EX_SOFTWARE)
}

pub(crate) fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    use fencelock::LossCause;

    #[test]
    fn exit_codes() {
        let lock = |e| exit_code(&Failure::Lock(e));
        // Contention's exit code (75) is checked end to end by the CLI's tests: the
        // library makes Error::Held only from a server's answer.
        let invalid = fencelock::keys::validate_name("").unwrap_err();
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
