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
use std::os::unix::process::CommandExt;
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use fencelock::{Client, DetachedLock, Error, LockGuard};

use crate::Held;
use crate::args::{Cli, Command};
use crate::exit::EX_LEASE_LOST;

/// How long fencelock waits for its keeper to exit after it took the lock back.
const KEEPER_EXIT: Duration = Duration::from_secs(2);

/// A keeper process holding fencelock's lock while fencelock is suspended.
pub(crate) struct Keeper {
    child: Child,
    lock: DetachedLock,
}

impl Keeper {
    /// Detaches `held`'s guard and hands it to a new keeper. `None` (the guard left as it
    /// was: the lease then runs out while suspended) if the keeper cannot be started.
    /// `watcher`: a write end of the pipe to COMMAND's watcher.
    pub(crate) fn start(held: &mut Held, watcher: Option<std::os::fd::OwnedFd>) -> Option<Self> {
        // From this very binary (supervise::own_binary), with fencelock's own argv[0], so
        // that it shows in `ps` as fencelock's command line did.
        let exe = crate::supervise::own_binary().ok()?;
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
        let lock = held.guard.take()?.detach();
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
    // Started through /proc/self/exe, its command name is `exe`: it takes the name of
    // the binary fencelock was started as (its argv[0]'s file name), as when it was
    // started from that path, for `ps` and `pkill`.
    let arg0 = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&arg0)
        .file_name()
        .map_or("fencelock".into(), |n| n.to_string_lossy());
    crate::watcher::name_self(&name);
    // Job control is fencelock's business: the keeper is never stopped by it.
    for signal in [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU, libc::SIGINT] {
        crate::supervise::ignore(signal);
    }
    let Ok(cli) = Cli::try_parse_from(std::iter::once(OsString::from("fencelock")).chain(run))
    else {
        return ExitCode::from(crate::exit::EX_USAGE);
    };
    let Command::Run(args) = cli.command else {
        return ExitCode::from(crate::exit::EX_USAGE);
    };
    // The lock, up to an empty line.
    let mut stdin = std::io::stdin().lock();
    let mut text = String::new();
    // Read line by line from a lock this thread drops before the reader thread starts:
    // the bytes after the empty line stay buffered in stdin's shared buffer.
    loop {
        let mut line = String::new();
        match stdin.read_line(&mut line) {
            Ok(0) | Err(_) => return ExitCode::FAILURE,
            Ok(_) if line.trim().is_empty() => break,
            Ok(_) => text.push_str(&line),
        }
    }
    let Ok(lock) = DetachedLock::from_text(&text) else {
        return ExitCode::from(crate::exit::EX_USAGE);
    };
    // Then stdin's end: fencelock resumed, or died.
    drop(stdin);
    let (closed_tx, closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = std::io::stdin().lock().read_to_end(&mut rest);
        let _ = closed_tx.send(());
    });
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    runtime.block_on(async move {
        let Ok(builder) = crate::ops::builder(&args.connection) else {
            return ExitCode::from(crate::exit::EX_USAGE);
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
        let mut tick = tokio::time::interval(crate::supervise::tick_for(&args));
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
                        let line = format!("D {}\n", crate::supervise::deadline_ns(valid_until));
                        let _ = watcher.write_all(line.as_bytes()).and_then(|()| watcher.flush());
                    }
                }
            }
        }
    })
}
