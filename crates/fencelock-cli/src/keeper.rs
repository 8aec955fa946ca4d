//! The keeper: while `fencelock run` is suspended (Ctrl-Z, SIGTSTP), a helper process
//! keeps the lock, so that the job resumes under the lock it had.
//!
//! A suspended process renews nothing. So when COMMAND stops, fencelock detaches its
//! guard ([`fencelock::LockGuard::detach`]), starts `fencelock __keep -- <its own
//! arguments>` (the same connection options and environment), writes the detached lock
//! to the keeper's stdin (a pipe: the holder token never appears on a command line),
//! and suspends itself. The keeper attaches the lock ([`fencelock::Client::attach`])
//! and renews it as fencelock did, up to `--max-hold`, and tells COMMAND's watcher
//! (which Ctrl-Z does not stop) each confirmed end of the lease on its stdout, a second
//! write end of the watcher's pipe, as fencelock does, until its stdin closes: when
//! fencelock resumes and takes the lock back (one owner-checked extend), or when
//! fencelock dies (then nobody renews it and the lease runs out; COMMAND's watcher
//! acts as for any other death of fencelock). The keeper lets go without a release, and
//! exits 76 if it lost the lease meanwhile (Redis unreachable for a whole lease, the
//! lock broken, the maximum hold): fencelock then finds the lock gone when it resumes,
//! and stops COMMAND.

use std::ffi::OsString;
use std::io::{BufRead, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use fencelock::{Client, DetachedLock, Error, LockGuard};
use tokio::sync::oneshot;

use crate::args::{Cli, Command, RunArgs};
use crate::exit::{EX_LEASE_LOST, EX_USAGE};
use crate::helper::{ignore, name_self, own_binary};
use crate::watcher::{deadline_line, tell_every};

/// How long fencelock waits for its keeper to exit after it took the lock back.
const KEEPER_EXIT: Duration = Duration::from_secs(2);

/// A keeper process holding fencelock's lock while fencelock is suspended.
pub(crate) struct Keeper {
    child: Child,
    lock: DetachedLock,
}

impl Keeper {
    /// Detaches the lock's `guard` and hands it to a new keeper. `None` (the guard left as
    /// it was: the lease then runs out while suspended) if the keeper cannot be started.
    /// `watcher`: a write end of the pipe to COMMAND's watcher.
    pub(crate) fn start(guard: &mut Option<LockGuard>, watcher: Option<OwnedFd>) -> Option<Self> {
        // From this very binary (helper::own_binary), with fencelock's own argv[0], so
        // that it shows in `ps` as fencelock's command line did.
        let exe = own_binary().ok()?;
        let arg0 = std::env::args_os()
            .next()
            .unwrap_or_else(|| OsString::from("fencelock"));
        let mut child = std::process::Command::new(exe)
            .arg0(arg0)
            .arg("__keep")
            .arg("--")
            .args(std::env::args_os().skip(1))
            .stdin(Stdio::piped())
            .stdout(watcher.map_or_else(Stdio::null, Stdio::from))
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let lock = guard.take()?.detach();
        // The text and an empty line: far below a pipe's buffer, so this never blocks.
        let written = child
            .stdin
            .as_mut()
            .map(|pipe| pipe.write_all(format!("{}\n", lock.to_text()).as_bytes()));
        if !matches!(written, Some(Ok(()))) {
            // The keeper has not got it: nobody renews it while suspended. The lock goes
            // back to a guard at resume, if it is still ours then.
            let _ = child.kill();
        }
        Some(Self { child, lock })
    }

    /// After fencelock resumed: tells the keeper to let go (closes its stdin) and takes
    /// the lock back with `client`. The error says why the lock is no longer ours.
    pub(crate) async fn take_back(mut self, client: &Client) -> Result<LockGuard, Error> {
        drop(self.child.stdin.take());
        let back = client.attach(self.lock).await;
        let deadline = Instant::now() + KEEPER_EXIT;
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        back
    }
}

/// The keeper process, `fencelock __keep -- RUN-ARGUMENTS`: reads the detached lock from
/// stdin (up to an empty line), attaches it with a client built from `run`'s own
/// connection options, writes each confirmed end of the lease to stdout for the watcher
/// (`D <CLOCK_MONOTONIC ns>`), and holds it until stdin closes (exit 0, the lock
/// detached again, not released) or the lease is lost (exit 76).
pub(crate) fn keep(run: Vec<OsString>) -> ExitCode {
    become_keeper();
    let Some(args) = run_args(run) else {
        return ExitCode::from(EX_USAGE);
    };
    let lock = match read_lock() {
        Ok(lock) => lock,
        Err(code) => return code,
    };
    // Then stdin's end: fencelock resumed, or died.
    let closed = stdin_closed();
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    runtime.block_on(hold(&args, lock, closed))
}

/// Names the keeper and ignores job control, which is fencelock's business: the keeper
/// is never stopped by it.
fn become_keeper() {
    // Started through /proc/self/exe, its command name is `exe`: it takes the name of
    // the binary fencelock was started as (its argv[0]'s file name), as when it was
    // started from that path, for `ps` and `pkill`.
    let arg0 = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&arg0)
        .file_name()
        .map_or("fencelock".into(), |n| n.to_string_lossy());
    name_self(&name);
    for signal in [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU, libc::SIGINT] {
        ignore(signal);
    }
}

/// fencelock's own `run` (or `elect`) arguments, for its connection options and lease.
fn run_args(run: Vec<OsString>) -> Option<RunArgs> {
    let cli = Cli::try_parse_from(std::iter::once(OsString::from("fencelock")).chain(run)).ok()?;
    match cli.command {
        Command::Run(args) => Some(args),
        Command::Elect(args) => Some(args.into_run()),
        _ => None,
    }
}

/// The detached lock, read from stdin up to an empty line; the exit code if there is
/// none.
fn read_lock() -> Result<DetachedLock, ExitCode> {
    let mut stdin = std::io::stdin().lock();
    let mut text = String::new();
    // Read line by line from a lock this thread drops before the reader thread starts:
    // the bytes after the empty line stay buffered in stdin's shared buffer.
    loop {
        let mut line = String::new();
        match stdin.read_line(&mut line) {
            Ok(0) | Err(_) => return Err(ExitCode::FAILURE),
            Ok(_) if line.trim().is_empty() => break,
            Ok(_) => text.push_str(&line),
        }
    }
    DetachedLock::from_text(&text).map_err(|_| ExitCode::from(EX_USAGE))
}

/// Completes when stdin reaches its end (fencelock resumed or died), read to it by a
/// thread of its own.
fn stdin_closed() -> oneshot::Receiver<()> {
    let (closed_tx, closed) = oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = std::io::stdin().lock().read_to_end(&mut rest);
        let _ = closed_tx.send(());
    });
    closed
}

/// Attaches `lock` and holds it, telling the watcher each confirmed end of the lease,
/// until `closed` (exit 0) or the lease is lost (exit 76); never released.
async fn hold(args: &RunArgs, lock: DetachedLock, closed: oneshot::Receiver<()>) -> ExitCode {
    let Ok(builder) = crate::ops::builder(&args.connection) else {
        return ExitCode::from(EX_USAGE);
    };
    let Ok(client) = builder.restart_protection(None).connect_lazy().await else {
        return ExitCode::FAILURE;
    };
    let Ok(guard) = client.attach(lock).await else {
        return ExitCode::from(EX_LEASE_LOST);
    };
    let lost = guard.lost();
    tokio::pin!(lost, closed);
    let mut watcher = std::io::stdout();
    let mut told = None;
    // As often as fencelock tells it.
    let mut tick = tokio::time::interval(tell_every(args.ttl));
    loop {
        tokio::select! {
            // fencelock resumed (or died): let go, without a release.
            _ = &mut closed => {
                drop(guard.detach());
                return ExitCode::SUCCESS;
            }
            // No release either: fencelock finds out at resume whether the lock
            // is still its own.
            _ = &mut lost => {
                drop(guard.detach());
                return ExitCode::from(EX_LEASE_LOST);
            }
            _ = tick.tick() => {
                let valid_until = guard.valid_until();
                if told != Some(valid_until) {
                    told = Some(valid_until);
                    let line = deadline_line(valid_until);
                    let _ = watcher.write_all(line.as_bytes()).and_then(|()| watcher.flush());
                }
            }
        }
    }
}
