//! The watcher: a small process in COMMAND's process group that kills the group when
//! the lease can no longer be vouched for, whatever happened to fencelock.
//!
//! fencelock starts it (as `fencelock __watch`, named [`NAME`] in `ps`) before COMMAND,
//! in the process group COMMAND then joins, and writes to its stdin, a pipe, each
//! confirmed end of the lease as a `CLOCK_MONOTONIC` time (`D <ns>`), `L` once the lease
//! is lost (fencelock is stopping COMMAND; no later end will come, and the watcher kills
//! the group at the last one without a word), and `X` once COMMAND has exited. The
//! watcher needs nothing from fencelock to act:
//!
//! - the pipe closes without `X` (fencelock was SIGKILLed, the OOM killer, a crash):
//!   SIGTERM and SIGCONT to the group, then SIGKILL at the end of the lease, or after the
//!   kill grace if that comes first;
//! - the end of the lease passes with no later one received (fencelock stopped, hung,
//!   suspended too long): SIGKILL to the group at once.
//!
//! It ignores the signals that are forwarded to the group or that stop a job (SIGINT,
//! SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU): only SIGKILL (and SIGSTOP) reach
//! it. Its clock is the kernel's monotonic clock, the one fencelock measures the lease
//! with, so the two agree without talking.

use std::io::{self, Read};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::exit::say;
use crate::helper::{ignore, name_self};

/// The watcher's name in `ps` (its `argv[0]` and its command name): without
/// "fencelock" in it, so that killing fencelock by name (`pkill fencelock`, `pkill -f
/// fencelock`, `killall fencelock`) leaves the watcher to take COMMAND's group down, as
/// it does when fencelock alone is killed. (It is started through `/proc/self/exe`, so
/// its command name is `exe` until it sets this one.)
pub(crate) const NAME: &str = "lease-watcher";

/// The signals the watcher (and so every process started from it) ignores.
pub(crate) const IGNORED: [libc::c_int; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
];

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `std::time::Instant` on Linux, the
/// same for every process of the machine.
#[allow(unsafe_code)]
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only to `ts`, which outlives the call.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// How often fencelock (or its keeper) passes the lease's confirmed end on to the
/// watcher: a tenth of the lease `ttl`, at most 250 ms (a renewal is confirmed every third
/// of the lease).
pub(crate) fn tell_every(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(1), Duration::from_millis(250))
}

/// The line that tells the watcher the lease's confirmed end `valid_until`.
pub(crate) fn deadline_line(valid_until: Instant) -> String {
    format!("D {}\n", deadline_ns(valid_until))
}

/// `valid_until` as a `CLOCK_MONOTONIC` time in ns, for the watcher.
pub(crate) fn deadline_ns(valid_until: Instant) -> u64 {
    let now = Instant::now();
    let left = valid_until.saturating_duration_since(now);
    monotonic_ns().saturating_add(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX))
}

/// Sends `signal` to the watcher's own process group (COMMAND's).
#[allow(unsafe_code)]
fn signal_group(signal: libc::c_int) {
    // SAFETY: kill(2) touches no memory of this process; pid 0 is our own group.
    unsafe {
        libc::kill(0, signal);
    }
}

/// Waits until fd 0 is readable or `timeout` passes; true if readable (or closed).
#[allow(unsafe_code)]
fn readable_within(timeout: Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis().saturating_add(1)).unwrap_or(i32::MAX);
    // SAFETY: poll reads and writes only `fd`, which outlives the call.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    n > 0
}

/// Runs the watcher: `deadline_ns` is the end of the lease when COMMAND starts, `grace`
/// how long COMMAND gets after SIGTERM when fencelock is gone.
pub(crate) fn watch(mut deadline_ns: u64, grace: Duration) -> ExitCode {
    // Its command name comes from the binary's file name (`exe`): set it to NAME, as
    // argv[0] already is.
    name_self(NAME);
    for signal in IGNORED {
        ignore(signal);
    }
    let mut stdin = io::stdin().lock();
    let mut pending = Vec::new();
    let mut buf = [0u8; 512];
    // After `L`, fencelock has told the user and stops COMMAND itself.
    let mut quiet = false;
    loop {
        let now = monotonic_ns();
        if now >= deadline_ns {
            // Drain what fencelock wrote before acting on a deadline that passed while
            // this process was stopped along with its group (a later end may be there).
            if !readable_within(Duration::ZERO) {
                if !quiet {
                    say(format_args!(
                        "the lease ran out without a renewal (fencelock suspended, stopped or \
                         hung): killing COMMAND's process group"
                    ));
                }
                signal_group(libc::SIGKILL);
                return ExitCode::FAILURE;
            }
        } else if !readable_within(Duration::from_nanos(deadline_ns - now)) {
            continue;
        }
        let n = match stdin.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        if n == 0 {
            orphaned(deadline_ns, grace, quiet);
            return ExitCode::FAILURE;
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim();
            if line == "X" {
                return ExitCode::SUCCESS;
            }
            if line == "L" {
                quiet = true;
            } else if let Some(ns) = line.strip_prefix("D ").and_then(|n| n.parse().ok())
                && !quiet
            {
                deadline_ns = ns;
            }
        }
    }
}

/// fencelock is gone: nobody will renew the lease. COMMAND gets SIGTERM, and SIGKILL at
/// the end of the lease or after `grace`, whichever comes first.
fn orphaned(deadline_ns: u64, grace: Duration, quiet: bool) {
    if !quiet {
        say(format_args!(
            "fencelock, which holds the lock for COMMAND, is gone: stopping COMMAND's process group"
        ));
    }
    signal_group(libc::SIGTERM);
    signal_group(libc::SIGCONT);
    let grace_end =
        monotonic_ns().saturating_add(u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX));
    let end = deadline_ns.min(grace_end);
    loop {
        let now = monotonic_ns();
        if now >= end {
            break;
        }
        std::thread::sleep(Duration::from_nanos(end - now).min(Duration::from_millis(50)));
    }
    signal_group(libc::SIGKILL);
}
