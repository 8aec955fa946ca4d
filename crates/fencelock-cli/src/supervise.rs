//! Running COMMAND under the lock: its own process group, signals forwarded to it, and
//! stopping the whole group when the lease is lost.

use std::io;
use std::time::Duration;

use tokio::process::Child;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::Held;
use crate::args::RunArgs;
use crate::exit::{Failure, say, status_code};

/// How COMMAND ended.
pub(crate) enum Ended {
    /// It exited with this status (see [`status_code`]).
    Exited(u8),
    /// The lease was lost and fencelock stopped it.
    Stopped,
}

/// Starts COMMAND in its own process group under the lock and waits for it, forwarding
/// signals to the group; if the lease is lost first, stops the group.
pub(crate) async fn run_command(
    args: &RunArgs,
    held: &Held,
    signals: &mut Signals,
) -> Result<Ended, Failure> {
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
pub(crate) async fn stop(child: &mut Child, group: Group, grace: Duration, signals: &mut Signals) {
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

/// COMMAND's process group. Its ID is COMMAND's pid, so while COMMAND is not reaped (it
/// may have exited) the ID names this group and nothing else: every method here is
/// called only before COMMAND is reaped.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Group(libc::pid_t);

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
pub(crate) struct Signals {
    pub(crate) interrupt: Signal,
    pub(crate) terminate: Signal,
    pub(crate) hangup: Signal,
    pub(crate) child: Signal,
}

impl Signals {
    pub(crate) fn install() -> Result<Self, Failure> {
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
    pub(crate) async fn recv(&mut self) -> i32 {
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
