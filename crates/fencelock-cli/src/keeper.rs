//! The keeper: while `fencelock run` is suspended (Ctrl-Z, SIGTSTP), a helper process
//! keeps the run's locks (one, or every name of `run NAME...`), so that the job resumes
//! under the locks it had.
//!
//! A suspended process renews nothing. So when COMMAND stops, fencelock detaches every
//! guard ([`fencelock::LockGuard::detach`]), starts `fencelock __keep -- <its own
//! arguments>` (the same connection options and environment), writes the detached locks
//! to the keeper's stdin (a pipe: the holder tokens never appear on a command line), and
//! suspends itself. The framing on that pipe: each lock's
//! [`to_text`](fencelock::DetachedLock::to_text) (a header line and `key=value` lines,
//! never an empty one), followed by an empty line, in the global order; after the last,
//! the line `end`. One lock is the same with one text.
//!
//! The keeper attaches every lock ([`fencelock::Client::attach`]) and renews them as
//! fencelock did, up to `--max-hold`, and tells COMMAND's watcher (which Ctrl-Z does not
//! stop) each confirmed end of the first lease to end on its stdout, a second write end
//! of the watcher's pipe, as fencelock does, until its stdin closes: when fencelock
//! resumes and takes the locks back (one owner-checked extend each), or when fencelock
//! dies (then nobody renews them and the leases run out; COMMAND's watcher acts as for
//! any other death of fencelock). The keeper lets go of all without a release, and exits
//! 76 as soon as it lost any lease meanwhile (Redis unreachable for a whole lease, a lock
//! broken, the maximum hold), letting go of the others the same way: fencelock then
//! finds a lock gone when it resumes, and stops COMMAND.

use std::ffi::OsString;
use std::io::{BufRead, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant};

use fencelock::{Client, DetachedLock, Error, LockGuard};
use futures_util::future::{join_all, select_all};
use tokio::sync::oneshot;

use crate::args::{Command, RunArgs};
use crate::exit::{EX_LEASE_LOST, EX_USAGE};
use crate::helper::{ignore, name_self, own_binary};
use crate::watcher::{deadline_line, tell_every};

/// How long fencelock waits for its keeper to exit after it took the lock back.
const KEEPER_EXIT: Duration = Duration::from_secs(2);

/// The line that follows the last lock on the keeper's stdin.
const END: &str = "end";

/// A keeper process holding fencelock's locks while fencelock is suspended.
pub(crate) struct Keeper {
    child: Child,
    locks: Vec<DetachedLock>,
}

impl Keeper {
    /// Detaches every guard of `guards` (leaving it empty) and hands them all to a new
    /// keeper. `None` (the guards left as they were: the leases then run out while
    /// suspended) if the keeper cannot be started. `watcher`: a write end of the pipe to
    /// COMMAND's watcher.
    pub(crate) fn start(guards: &mut Vec<LockGuard>, watcher: Option<OwnedFd>) -> Option<Self> {
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
        let locks: Vec<DetachedLock> = guards.drain(..).map(LockGuard::detach).collect();
        let mut framed = String::new();
        for lock in &locks {
            framed.push_str(&lock.to_text());
            framed.push('\n');
        }
        framed.push_str(END);
        framed.push('\n');
        // Far below a pipe's buffer for one lock; for many, the keeper reads them all
        // before anything else, so this waits for it at most.
        let written = child
            .stdin
            .as_mut()
            .map(|pipe| pipe.write_all(framed.as_bytes()));
        if !matches!(written, Some(Ok(()))) {
            // The keeper has not got them: nobody renews them while suspended. The locks
            // go back to guards at resume, if they are still ours then.
            let _ = child.kill();
        }
        Some(Self { child, locks })
    }

    /// After fencelock resumed: tells the keeper to let go (closes its stdin) and takes
    /// every lock back with `client`, into `guards` (in the global order). The error, for
    /// the first lock that could not be taken back, says why it is no longer ours; the
    /// locks that were taken back are in `guards` all the same, held (and renewed) until
    /// fencelock has stopped COMMAND and releases them, as after any lost lease.
    pub(crate) async fn take_back(
        mut self,
        client: &Client,
        guards: &mut Vec<LockGuard>,
    ) -> Result<(), Error> {
        drop(self.child.stdin.take());
        let back = join_all(self.locks.into_iter().map(|lock| client.attach(lock))).await;
        let deadline = Instant::now() + KEEPER_EXIT;
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut first_error = None;
        for result in back {
            match result {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The keeper process, `fencelock __keep -- RUN-ARGUMENTS`: reads the detached locks from
/// stdin (up to the line `end`, see the [module](self)), attaches them with a client
/// built from `run`'s own connection options, writes each confirmed end of the first
/// lease to end to stdout for the watcher (`D <CLOCK_MONOTONIC ns>`), and holds them
/// until stdin closes (exit 0, the locks detached again, not released) or any lease is
/// lost (exit 76, the others detached, not released).
pub(crate) fn keep(run: Vec<OsString>) -> ExitCode {
    become_keeper();
    let Some(args) = run_args(run) else {
        return ExitCode::from(EX_USAGE);
    };
    let locks = match read_locks() {
        Ok(locks) => locks,
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
    runtime.block_on(hold(&args, locks, closed))
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
    let cli = crate::args::parse(std::iter::once(OsString::from("fencelock")).chain(run)).ok()?;
    match cli.command {
        Command::Run(args) => Some(args),
        Command::Elect(args) => Some(args.into_run()),
        _ => None,
    }
}

/// The detached locks, read from stdin up to the line `end`; the exit code if they are
/// not all there.
fn read_locks() -> Result<Vec<DetachedLock>, ExitCode> {
    let mut stdin = std::io::stdin().lock();
    let mut locks = Vec::new();
    let mut text = String::new();
    // Read line by line from a lock this thread drops before the reader thread starts:
    // the bytes after `end` stay buffered in stdin's shared buffer.
    loop {
        let mut line = String::new();
        match stdin.read_line(&mut line) {
            Ok(0) | Err(_) => return Err(ExitCode::FAILURE),
            Ok(_) if text.is_empty() && line.trim_end() == END => break,
            Ok(_) if line.trim().is_empty() => {
                let lock = DetachedLock::from_text(&std::mem::take(&mut text));
                locks.push(lock.map_err(|_| ExitCode::from(EX_USAGE))?);
            }
            Ok(_) => text.push_str(&line),
        }
    }
    if locks.is_empty() {
        return Err(ExitCode::from(EX_USAGE));
    }
    Ok(locks)
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

/// Attaches `locks` and holds them, telling the watcher each confirmed end of the first
/// lease to end, until `closed` (exit 0) or any lease is lost (exit 76); never released.
async fn hold(args: &RunArgs, locks: Vec<DetachedLock>, closed: oneshot::Receiver<()>) -> ExitCode {
    let Ok(builder) = crate::ops::builder(&args.connection) else {
        return ExitCode::from(EX_USAGE);
    };
    let Ok(client) = builder.restart_protection(None).connect_lazy().await else {
        return ExitCode::FAILURE;
    };
    let all = locks.len();
    let attached = join_all(locks.into_iter().map(|lock| client.attach(lock))).await;
    let guards: Vec<LockGuard> = attached.into_iter().flatten().collect();
    // Let go of all without a release, whatever the outcome: fencelock finds out at
    // resume whether each lock is still its own.
    let let_go = |guards: Vec<LockGuard>, code: ExitCode| {
        guards.into_iter().for_each(|guard| drop(guard.detach()));
        code
    };
    if guards.len() < all {
        return let_go(guards, ExitCode::from(EX_LEASE_LOST));
    }
    // Not empty (read_locks reads at least one), as select_all needs.
    let lost = select_all(guards.iter().map(|guard| Box::pin(guard.lost())));
    tokio::pin!(lost, closed);
    let mut watcher = std::io::stdout();
    let mut told = None;
    // As often as fencelock tells it.
    let mut tick = tokio::time::interval(tell_every(args.ttl));
    loop {
        tokio::select! {
            // fencelock resumed (or died): let go.
            _ = &mut closed => return let_go(guards, ExitCode::SUCCESS),
            _ = &mut lost => return let_go(guards, ExitCode::from(EX_LEASE_LOST)),
            _ = tick.tick() => {
                let valid_until = guards.iter().map(LockGuard::valid_until).min();
                if told != valid_until {
                    told = valid_until;
                    if let Some(valid_until) = valid_until {
                        let line = deadline_line(valid_until);
                        let _ = watcher.write_all(line.as_bytes()).and_then(|()| watcher.flush());
                    }
                }
            }
        }
    }
}
