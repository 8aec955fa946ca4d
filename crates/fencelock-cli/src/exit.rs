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
/// The lease was lost while COMMAND ran (or by the time it exited).
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
            Self::Lock(error) => error.fmt(f),
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

/// The exit status for each way of failing (see the table at the top).
pub(crate) fn exit_code(failure: &Failure) -> u8 {
    match failure {
        Failure::Usage(_) => EX_USAGE,
        Failure::Spawn { error, .. } => match error.kind() {
            io::ErrorKind::NotFound => EX_NOT_FOUND,
            _ => EX_CANNOT_RUN,
        },
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

/// Reports `failure` on stderr and picks the exit status.
pub(crate) fn fail(failure: &Failure) -> ExitCode {
    say(format_args!("{failure}"));
    ExitCode::from(exit_code(failure))
}

/// Writes `fencelock: <message>` as one line on stderr. A stderr that cannot be written
/// (a closed pipe) is ignored: unlike `eprintln!`, this never panics, so fencelock goes
/// on to stop COMMAND or release the lock.
pub(crate) fn say(message: fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(io::stderr().lock(), "fencelock: {message}");
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
    use std::time::Duration;

    use fencelock::LossCause;

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
