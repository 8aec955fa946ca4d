//! Running COMMAND under the lock, so that it never runs without it.
//!
//! - COMMAND runs in a process group of its own, together with a [watcher](crate::watcher)
//!   that fencelock tells each confirmed end of the lease: if fencelock dies (SIGKILL, the
//!   OOM killer), stops or hangs, the watcher kills the group before the lease ends.
//! - When fencelock runs in the terminal's foreground, COMMAND's group gets the terminal
//!   (as a shell does for its jobs) and gives it back when it stops or exits, so COMMAND
//!   can read the terminal and Ctrl-C and Ctrl-Z reach it.
//! - Ctrl-Z (COMMAND stopped by SIGTSTP, SIGTTIN or SIGTTOU, or fencelock sent SIGTSTP)
//!   suspends COMMAND and fencelock together, and the job keeps its locks: fencelock
//!   hands every one to a [keeper](crate::keeper) process, which renews them and tells
//!   the watcher (Ctrl-Z does not stop the watcher), and takes them back when resumed;
//!   if one could not be kept, the watcher has killed COMMAND's group when its lease
//!   ended, and fencelock exits 76.
//! - A watcher killed by hand while COMMAND runs is replaced at once by a new one in the
//!   group (one killed while the job is suspended, when fencelock is resumed).
//! - SIGINT, SIGTERM and SIGHUP that fencelock gets are forwarded to the group, each
//!   followed by SIGCONT so that a stopped member can act on it.
//! - When the lease is lost, the group gets SIGTERM and SIGCONT, then SIGKILL after the
//!   kill grace or at the end of the lease, whichever comes first.

use std::ffi::OsStr;
use std::future::Future;
use std::io::{self, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::pin::Pin;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use fencelock::{HumanDuration, LossCause};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::args::RunArgs;
use crate::exit::{Failure, Level, say, status_code, tell};
use crate::helper::{ignore, own_binary};
use crate::holding::Holding;
use crate::keeper::Keeper;
use crate::watcher::{self, deadline_line, deadline_ns, tell_every};

/// How COMMAND ended.
pub(crate) enum Ended {
    /// It exited with this status (see [`status_code`]), at this moment, when the lease
    /// was confirmed until the second instant.
    Exited {
        status: u8,
        at: Instant,
        valid_until: Instant,
    },
    /// The lease was lost and fencelock (or the watcher) stopped it.
    Stopped,
}

/// Starts COMMAND (with its watcher) under the lock and supervises it until it exits or
/// the lease is lost.
pub(crate) async fn run_command(
    args: &RunArgs,
    held: &mut Holding,
    signals: &mut Signals,
) -> Result<Ended, Failure> {
    let mut job = Job::start(args, held)?;
    let mut tick = tokio::time::interval(tell_every(args.ttl));
    let cause = loop {
        tokio::select! {
            // COMMAND's exit or stop first: if the lease was lost too, the release
            // decides (76 if the lease is gone by then).
            biased;
            event = signals.next() => match event {
                Event::Child => {
                    if let Some(ended) = job.child_changed(held, signals).await {
                        return Ok(ended);
                    }
                }
                Event::Stop => job.group.signal(libc::SIGTSTP),
                Event::Forward(sig) => job.group.forward(sig),
            },
            cause = &mut job.lost => break cause,
            _ = tick.tick() => job.pass_on_renewal(held),
        }
    };
    say(format_args!(
        "the lease on lock {} was lost ({}); stopping COMMAND",
        args.label(),
        held.loss_reason(cause)
    ));
    job.stop(signals).await;
    job.terminal.take_back();
    Ok(Ended::Stopped)
}

/// The end of the lease, as a future that completes when the guard loses it.
type Loss = Pin<Box<dyn Future<Output = LossCause> + Send>>;

/// COMMAND as fencelock supervises it: the child, its process group and watcher, the
/// terminal, and what the watcher was last told.
struct Job<'a> {
    args: &'a RunArgs,
    command: Child,
    pid: libc::pid_t,
    /// Taken back for fencelock's group on drop too, so that no way out of the
    /// supervision leaves the terminal to COMMAND's group.
    terminal: Terminal,
    watcher: Watcher,
    group: Group,
    /// Completes when the current guard loses the lease.
    lost: Loss,
    /// The lease's last confirmed end, as the watcher was told it.
    told: Instant,
    /// When `told` last moved forward.
    renewed_at: Instant,
    /// fencelock said Redis is not answering, and not yet that it answers again.
    silent: bool,
}

impl<'a> Job<'a> {
    /// Starts the watcher, then COMMAND in the watcher's process group.
    fn start(args: &'a RunArgs, held: &Holding) -> Result<Self, Failure> {
        let Some((program, program_args)) = args.command.split_first() else {
            return Err(Failure::Usage("no COMMAND given after '--'".to_owned()));
        };
        // So that fencelock can take the terminal back from the background.
        ignore(libc::SIGTTOU);
        let mut watcher = Watcher::start(held.valid_until(), args.kill_grace, None)?;
        let group = Group(watcher.pid);
        // When fencelock has the terminal, COMMAND's group gets it from COMMAND itself,
        // just before its exec: a COMMAND that reads the terminal at once must not find
        // itself in the background (SIGTTIN would stop it, and that stop would look like
        // Ctrl-Z), and a Ctrl-Z must always reach a group COMMAND is in (before the
        // handover it reaches fencelock, which passes it on).
        let terminal = Terminal::handed_over_if(Terminal::is_foreground());
        let spawned = spawn_command(
            program,
            program_args,
            held,
            group,
            terminal.given(),
            args.election,
        );
        let command = match spawned {
            Ok(child) => child,
            Err(error) => {
                watcher.kill_and_reap();
                return Err(Failure::Spawn {
                    program: program.clone(),
                    error,
                });
            }
        };
        Ok(Self {
            args,
            pid: command.id() as libc::pid_t,
            command,
            terminal,
            watcher,
            group,
            lost: Box::pin(held.lost()),
            told: held.valid_until(),
            renewed_at: Instant::now(),
            silent: false,
        })
    }

    /// SIGCHLD: acts on what changed (a watcher killed, COMMAND exited or stopped).
    /// `Some` when the job is over.
    async fn child_changed(&mut self, held: &mut Holding, signals: &mut Signals) -> Option<Ended> {
        match peek(self.pid) {
            // COMMAND runs on, and its watcher was killed (by hand, `kill -9`): a new one
            // joins the group, or a later death of fencelock would leave COMMAND running
            // without the lock.
            State::Running => {
                self.replace_watcher_if_gone(held);
                None
            }
            State::Exited => Some(self.exited(held)),
            State::Stopped => self.suspend(held, signals).await,
        }
    }

    /// COMMAND exited: dismisses the watcher, reaps COMMAND, takes the terminal back.
    fn exited(&mut self, held: &Holding) -> Ended {
        let at = Instant::now();
        let valid_until = held.valid_until();
        self.watcher.done();
        let status = reap(&mut self.command);
        self.terminal.take_back();
        if at >= valid_until {
            // Seen only after the lease ended: fencelock was stopped, and the watcher
            // killed the group then (and said so).
            return Ended::Stopped;
        }
        Ended::Exited {
            status,
            at,
            valid_until,
        }
    }

    /// COMMAND stopped (Ctrl-Z): suspends fencelock too, with a keeper holding every
    /// lock, and on resume goes on only if they are all still ours. `Some` when the job
    /// is over.
    async fn suspend(&mut self, held: &mut Holding, signals: &mut Signals) -> Option<Ended> {
        consume_stop(self.pid);
        self.terminal.take_back();
        // A watcher killed just before: its replacement watches the suspended job (one
        // killed during the suspension is replaced only when fencelock is resumed).
        self.replace_watcher_if_gone(held);
        // The keeper renews the leases while fencelock is stopped: the guards are
        // detached (nothing in this process renews them now).
        let keeper = Keeper::start(&mut held.guards, self.watcher.pipe_for_keeper());
        suspend_self();
        // Resumed (fg or bg): take the locks back from the keeper, and go on only if they
        // are all still ours.
        if !self.take_lock_back(keeper, held).await {
            self.stop(signals).await;
            return Some(Ended::Stopped);
        }
        self.resume(held);
        None
    }

    /// After a suspension: puts the locks back in `held` from `keeper` (when one kept
    /// them). False, once fencelock said why, when a lock may be someone else's now: the
    /// others taken back are in `held` then, to be released once COMMAND is stopped.
    async fn take_lock_back(&mut self, keeper: Option<Keeper>, held: &mut Holding) -> bool {
        if let Some(keeper) = keeper {
            if let Err(lock) = keeper.take_back(&held.client, &mut held.guards).await {
                let which = match self.args.names.len() {
                    1 => "the lock",
                    _ => "one of the locks",
                };
                say(format_args!(
                    "{which} {} could not be kept while COMMAND was suspended ({lock}); \
                     stopping COMMAND",
                    self.args.label()
                ));
                return false;
            }
            self.lost = Box::pin(held.lost());
        } else if held.loss_cause().is_some() || held.remaining().is_zero() {
            say(format_args!(
                "COMMAND was suspended longer than the lease on lock {}: the lock may be \
                 someone else's now; stopping COMMAND",
                self.args.label()
            ));
            return false;
        }
        true
    }

    /// Continues COMMAND under the lock taken back: the watcher told the lease's end,
    /// the terminal handed over again if fencelock has it, SIGCONT.
    fn resume(&mut self, held: &Holding) {
        self.told = held.valid_until();
        self.renewed_at = Instant::now();
        self.watcher.tell(self.told);
        if Terminal::is_foreground() {
            self.terminal.give(self.group);
        }
        self.group.signal(libc::SIGCONT);
    }

    /// Passes a renewed end of the lease on to the watcher, and says when Redis stops
    /// answering (no renewal for half a lease) and when it answers again.
    fn pass_on_renewal(&mut self, held: &Holding) {
        let valid_until = held.valid_until();
        if valid_until != self.told {
            self.told = valid_until;
            self.renewed_at = Instant::now();
            self.watcher.tell(valid_until);
            if std::mem::take(&mut self.silent) {
                tell(
                    Level::Notice,
                    format_args!("Redis answers again; the lease is renewed"),
                );
            }
        } else if !self.silent && self.renewed_at.elapsed() > self.args.ttl / 2 {
            // A renewal is due every third of the lease: a half without one means Redis
            // is not answering.
            self.silent = true;
            tell(
                Level::Notice,
                format_args!(
                    "Redis not answering; the lease ends in {} unless a renewal gets through",
                    HumanDuration(held.remaining())
                ),
            );
        }
    }

    /// Replaces a killed watcher (see [`Watcher::replace_if_gone`]).
    fn replace_watcher_if_gone(&mut self, held: &Holding) {
        self.watcher
            .replace_if_gone(self.group, held, self.told, self.args.kill_grace);
    }

    /// Stops COMMAND's process group: SIGTERM (and SIGCONT, so that a stopped member can
    /// act on it), up to the kill grace for COMMAND to exit (the watcher kills the group
    /// at the end of the lease if that comes first), then SIGKILL. Once COMMAND has
    /// exited, and before it is reaped, SIGKILL once more for whatever of its group
    /// outlived it. Signals fencelock gets meanwhile are forwarded to the group.
    async fn stop(&mut self, signals: &mut Signals) {
        let (pid, group) = (self.pid, self.group);
        self.watcher.lost();
        group.forward(libc::SIGTERM);
        let exited = async {
            while peek(pid) != State::Exited {
                if let Event::Forward(sig) = signals.next().await {
                    group.forward(sig);
                }
            }
        };
        if tokio::time::timeout(self.args.kill_grace, exited)
            .await
            .is_err()
        {
            group.signal(libc::SIGKILL);
            while peek(pid) != State::Exited {
                signals.next().await;
            }
        }
        group.signal(libc::SIGKILL);
        reap(&mut self.command);
        self.watcher.kill_and_reap();
    }
}

/// Starts COMMAND in `group`, with the lock's name and fencing token in its environment
/// (and, for a leader, its term, which is the same number).
#[allow(unsafe_code)]
fn spawn_command(
    program: &OsStr,
    program_args: &[std::ffi::OsString],
    held: &Holding,
    group: Group,
    take_terminal: bool,
    leader: bool,
) -> io::Result<Child> {
    let mut command = Command::new(program);
    command.args(program_args).process_group(group.0);
    if let [guard] = held.guards.as_slice() {
        command
            .env("FENCELOCK_NAME", guard.name())
            .env("FENCELOCK_TOKEN", guard.fencing_token().to_string());
        if leader {
            command.env("FENCELOCK_TERM", guard.fencing_token().to_string());
        }
    } else {
        // Names have no control characters: one per line.
        let names: Vec<&str> = held.guards().map(|g| g.name()).collect();
        let tokens: Vec<String> = held
            .guards()
            .map(|g| format!("{}={}", g.name(), g.fencing_token()))
            .collect();
        command
            .env("FENCELOCK_NAMES", names.join("\n"))
            .env("FENCELOCK_TOKENS", tokens.join("\n"))
            .env_remove("FENCELOCK_NAME")
            .env_remove("FENCELOCK_TOKEN");
    }
    let fencelock = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec only async-signal-safe calls: an atomic store,
    // sigaction(2), tcsetpgrp(3), getpgrp(2), signal(2). The child is in `group` already
    // (std sets the process group before these hooks run).
    unsafe {
        command.pre_exec(move || {
            pass_signals_to_parent_until_exec(fencelock);
            if take_terminal {
                // SIGTTOU is still ignored here (inherited), so this works from the
                // background.
                libc::tcsetpgrp(0, libc::getpgrp());
            }
            // fencelock ignores SIGTTOU; COMMAND gets the usual job control.
            libc::signal(libc::SIGTTOU, libc::SIG_DFL);
            Ok(())
        });
    }
    command.spawn()
}

/// The signals that fencelock catches and acts on for COMMAND's group.
const PASSED_ON: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGTSTP];

/// In COMMAND's child before its exec: the signals fencelock catches are sent on to
/// fencelock until the exec, which resets them to their defaults.
///
/// Once the child has given the terminal to its group, a Ctrl-Z or Ctrl-C reaches the
/// child, not fencelock. Before its exec the child still has fencelock's handlers, which
/// only note a signal in the child's own copy of fencelock's memory: the keystroke would
/// be lost (seen: a Ctrl-Z pressed as COMMAND started never suspended the job). The
/// default action is no better: a child stopped before its exec leaves fencelock waiting
/// in `spawn` for that exec. Sent on, fencelock acts on it as on any other: it passes it
/// to the group once COMMAND runs.
///
/// Only to fencelock itself: a child whose fencelock died meanwhile has been adopted by
/// another process (init, a subreaper), which must never get them (init takes SIGINT
/// for Ctrl-Alt-Del).
#[allow(unsafe_code)]
fn pass_signals_to_parent_until_exec(fencelock: libc::pid_t) {
    static FENCELOCK: AtomicI32 = AtomicI32::new(0);
    extern "C" fn pass_on(signal: libc::c_int) {
        let fencelock = FENCELOCK.load(Ordering::Relaxed);
        // SAFETY: getppid, kill and errno's location are async-signal-safe; errno is
        // restored for the code the handler interrupted.
        unsafe {
            let errno = *libc::__errno_location();
            if fencelock != 0 && libc::getppid() == fencelock {
                libc::kill(fencelock, signal);
            }
            *libc::__errno_location() = errno;
        }
    }
    // In the child's own memory, set before any handler can run.
    FENCELOCK.store(fencelock, Ordering::Relaxed);
    for signal in PASSED_ON {
        // SAFETY: `action` is a plain C struct, for which all zeroes is a valid value
        // (an empty mask, no flags); sigaction reads it and writes nothing back (null).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = pass_on as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// What a child's wait status shows, without reaping it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running,
    Stopped,
    Exited,
}

/// The state of child `pid`, leaving an exit unreaped (`WNOWAIT`): the group's ID stays
/// ours while a member is unreaped.
#[allow(unsafe_code)]
fn peek(pid: libc::pid_t) -> State {
    loop {
        // SAFETY: `siginfo_t` is a plain C struct, for which all zeroes is a valid value;
        // `si_signo` stays 0 unless waitid reports a child.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes only to `info`, which outlives the call.
        let result = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if result == 0 {
            if info.si_signo == 0 {
                return State::Running;
            }
            return match info.si_code {
                libc::CLD_STOPPED | libc::CLD_TRAPPED => State::Stopped,
                _ => State::Exited,
            };
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return State::Exited; // ECHILD: not our child any more
        }
    }
}

/// Takes the report that child `pid` stopped, so that it is not seen again.
#[allow(unsafe_code)]
fn consume_stop(pid: libc::pid_t) {
    // SAFETY: as in `peek`.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes only to `info`.
    unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WSTOPPED | libc::WNOHANG,
        );
    }
}

/// Reaps an exited child and returns its status in the shell's convention.
fn reap(child: &mut Child) -> u8 {
    match child.wait() {
        Ok(status) => status_code(status),
        Err(_) => status_code(ExitStatus::from_raw(0)),
    }
}

/// A signal that came before COMMAND started ([`Signals::recv`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BeforeCommand {
    /// SIGINT, SIGTERM or SIGHUP: give up.
    Forward(i32),
    /// SIGTSTP: stop fencelock itself ([`suspend_self`]), then go on.
    Stop,
}

/// Stops fencelock itself, so that the shell that started it sees the job stopped, and
/// returns when it is continued.
#[allow(unsafe_code)]
pub(crate) fn suspend_self() {
    // SAFETY: raise(3) touches no memory; SIGSTOP cannot be caught, so this returns once
    // the process is continued.
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
}

/// COMMAND's process group. Its ID is the first watcher's pid, and fencelock reaps that
/// watcher (and any that replaced it) only after it is done with the group, so while
/// the group is used the ID names it and nothing else.
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

    /// Sends `signal`, then SIGCONT so that a stopped member can act on it.
    fn forward(self, signal: i32) {
        self.signal(signal);
        self.signal(libc::SIGCONT);
    }
}

/// The watcher process and the pipe to it.
struct Watcher {
    child: Child,
    pid: libc::pid_t,
    pipe: Option<ChildStdin>,
    /// Watchers that died while COMMAND ran (killed by hand) and were replaced: reaped
    /// only at the end, the first one's pid being COMMAND's process group ID.
    replaced: Vec<Child>,
    /// A replacement could not start, and fencelock said so (once).
    unreplaced: bool,
}

impl Watcher {
    /// Starts `fencelock __watch` in a new process group (COMMAND joins it), or in
    /// `group` when given (a watcher that replaces a dead one), with the lease's end and
    /// the kill grace.
    #[allow(unsafe_code)]
    fn start(valid_until: Instant, grace: Duration, group: Option<Group>) -> Result<Self, Failure> {
        // Started through /proc/self/exe (this very binary, even if its file has been
        // replaced since), its command name is `exe` from the exec on, until it names
        // itself: never `fencelock`, so killing fencelock by name cannot take it along.
        let exe = own_binary()
            .map_err(|e| Failure::System(format!("cannot find fencelock's own binary: {e}")))?;
        let mut command = Command::new(exe);
        command.arg0(watcher::NAME).arg("__watch");
        if crate::exit::json() {
            command.arg("--json");
        }
        command
            .arg(deadline_ns(valid_until).to_string())
            .arg(grace.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(group.map_or(0, |g| g.0));
        // SAFETY: between fork and exec only async-signal-safe calls: signal(2). Ignored
        // signals stay ignored across exec, so no forwarded signal can kill the watcher
        // before it starts.
        unsafe {
            command.pre_exec(|| {
                for sig in watcher::IGNORED {
                    libc::signal(sig, libc::SIG_IGN);
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .map_err(|e| Failure::System(format!("cannot start the watcher: {e}")))?;
        let pipe = child.stdin.take();
        let pid = child.id() as libc::pid_t;
        Ok(Self {
            child,
            pid,
            pipe,
            replaced: Vec::new(),
            unreplaced: false,
        })
    }

    /// If the watcher has exited while COMMAND is alive and the lease still holds (it
    /// was killed: by itself it exits only once it has killed the group, itself
    /// included, at the end of the lease), starts a new one in `group`, told the lease's
    /// last confirmed end `told`. If none can start, fencelock says so once and goes
    /// on: it still stops COMMAND itself when the lease is lost.
    fn replace_if_gone(&mut self, group: Group, held: &Holding, told: Instant, grace: Duration) {
        if held.loss_cause().is_some() || told <= Instant::now() {
            return; // the group is (being) stopped; nothing left to watch for
        }
        if !matches!(peek(self.pid), State::Exited) {
            return;
        }
        if !self.unreplaced {
            tell(
                Level::Warning,
                format_args!("COMMAND's watcher was killed; a new one takes its place"),
            );
        }
        match Self::start(told, grace, Some(group)) {
            Ok(mut new) => {
                std::mem::swap(self, &mut new);
                // `new` is the dead watcher now: keep it, and those it replaced, unreaped.
                self.replaced.append(&mut new.replaced);
                self.replaced.push(new.child);
            }
            Err(e) => {
                self.pipe = None;
                if !std::mem::replace(&mut self.unreplaced, true) {
                    tell(
                        Level::Warning,
                        format_args!(
                            "a new watcher could not start ({e}): if fencelock dies now, \
                             nothing stops COMMAND"
                        ),
                    );
                }
            }
        }
    }

    /// Tells the watcher the lease's confirmed end.
    fn tell(&mut self, valid_until: Instant) {
        self.send(&deadline_line(valid_until));
    }

    /// The lease is lost: fencelock stops COMMAND; the watcher kills the group at the
    /// last end it was told, quietly.
    fn lost(&mut self) {
        self.send("L\n");
    }

    /// COMMAND exited: the watcher exits without touching the group.
    fn done(&mut self) {
        self.send("X\n");
        self.pipe = None;
        let _ = self.child.wait();
        self.reap_replaced();
    }

    fn reap_replaced(&mut self) {
        for mut child in self.replaced.drain(..) {
            let _ = child.wait();
        }
    }

    /// A second write end of the watcher's pipe, for the keeper to tell it the lease's
    /// confirmed ends while fencelock is stopped.
    fn pipe_for_keeper(&self) -> Option<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        self.pipe.as_ref()?.as_fd().try_clone_to_owned().ok()
    }

    fn send(&mut self, line: &str) {
        if let Some(pipe) = &mut self.pipe
            && pipe.write_all(line.as_bytes()).is_err()
        {
            self.pipe = None; // the watcher is gone; the group is (being) killed
        }
    }

    fn kill_and_reap(&mut self) {
        let _ = self.child.kill();
        self.pipe = None;
        let _ = self.child.wait();
        self.reap_replaced();
    }
}

/// fencelock's terminal, when it runs in the terminal's foreground.
struct Terminal {
    /// Whether COMMAND's group was given the terminal.
    given: std::cell::Cell<bool>,
}

impl Terminal {
    /// Whether fd 0 is a terminal whose foreground process group is fencelock's.
    #[allow(unsafe_code)]
    fn is_foreground() -> bool {
        // SAFETY: isatty, tcgetpgrp and getpgrp take no pointers.
        unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
    }

    /// The terminal as COMMAND's group will have it: `handed` when COMMAND takes it
    /// before its exec.
    fn handed_over_if(handed: bool) -> Self {
        Self {
            given: std::cell::Cell::new(handed),
        }
    }

    /// Whether COMMAND's group has (or is about to have) the terminal.
    fn given(&self) -> bool {
        self.given.get()
    }

    #[allow(unsafe_code)]
    fn give(&self, group: Group) {
        // SAFETY: tcsetpgrp takes no pointers.
        if unsafe { libc::tcsetpgrp(0, group.0) } == 0 {
            self.given.set(true);
        }
    }

    /// Takes the terminal back for fencelock's own group, if COMMAND's has it.
    #[allow(unsafe_code)]
    fn take_back(&self) {
        if self.given.replace(false) {
            // SAFETY: tcsetpgrp and getpgrp take no pointers; SIGTTOU is ignored, so
            // this works from the background.
            unsafe {
                libc::tcsetpgrp(0, libc::getpgrp());
            }
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.take_back();
    }
}

/// What [`Signals::next`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// SIGINT, SIGTERM or SIGHUP: forwarded to COMMAND's group.
    Forward(i32),
    /// SIGTSTP: COMMAND's group is stopped, then fencelock.
    Stop,
    /// SIGCHLD: a child changed state.
    Child,
}

/// The signals fencelock catches instead of dying or stopping: SIGINT, SIGTERM, SIGHUP,
/// which it forwards to COMMAND's process group; SIGTSTP, which stops the group (and
/// then fencelock); and SIGCHLD, to learn when COMMAND stops or exits without reaping it.
pub(crate) struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    stop: Signal,
    child: Signal,
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
            stop: catch(SignalKind::from_raw(libc::SIGTSTP))?,
            child: catch(SignalKind::child())?,
        })
    }

    /// The next SIGINT, SIGTERM or SIGHUP received (since installation), as its number;
    /// or a SIGTSTP (Ctrl-Z), for which fencelock, with no COMMAND yet, stops itself
    /// ([`suspend_self`]), as a shell user expects.
    pub(crate) async fn recv(&mut self) -> BeforeCommand {
        loop {
            match self.next().await {
                Event::Forward(signal) => return BeforeCommand::Forward(signal),
                Event::Stop => return BeforeCommand::Stop,
                Event::Child => {}
            }
        }
    }

    /// The next signal received (since installation).
    async fn next(&mut self) -> Event {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Event::Forward(libc::SIGINT),
            Some(()) = self.terminate.recv() => Event::Forward(libc::SIGTERM),
            Some(()) = self.hangup.recv() => Event::Forward(libc::SIGHUP),
            Some(()) = self.stop.recv() => Event::Stop,
            Some(()) = self.child.recv() => Event::Child,
            else => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Ctrl-Z that reaches COMMAND's child before its exec (the terminal is its group's
    /// by then) reaches fencelock: the child here stops itself with SIGTSTP between its
    /// hooks and its exec, the widest form of that moment. With fencelock's handlers
    /// inherited instead, the signal was noted in the child's memory and lost.
    #[test]
    #[allow(unsafe_code)]
    fn a_ctrl_z_before_command_s_exec_reaches_fencelock() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut stop = signal(SignalKind::from_raw(libc::SIGTSTP)).unwrap();
            let mut command = Command::new("true");
            // SAFETY: sigaction(2), getpid(2) and kill(2) are async-signal-safe.
            unsafe {
                let parent = std::process::id() as libc::pid_t;
                command.pre_exec(move || {
                    pass_signals_to_parent_until_exec(parent);
                    libc::kill(libc::getpid(), libc::SIGTSTP);
                    Ok(())
                });
            }
            let mut child = command.spawn().unwrap();
            let heard = tokio::time::timeout(Duration::from_secs(10), stop.recv()).await;
            assert!(heard.is_ok(), "fencelock did not hear the Ctrl-Z");
            assert!(
                child.wait().unwrap().success(),
                "the child went on to its exec"
            );
        });
    }

    /// A child whose fencelock is gone (adopted by init or a subreaper) passes nothing
    /// on: here the child is told that another process is its fencelock, and that
    /// process is not stopped by the child's Ctrl-Z.
    #[test]
    #[allow(unsafe_code)]
    fn a_child_passes_nothing_to_a_process_that_is_not_its_parent() {
        let mut bystander = Command::new("sleep").arg("30").spawn().unwrap();
        let not_parent = bystander.id() as libc::pid_t;
        let mut command = Command::new("true");
        // SAFETY: sigaction(2), getpid(2) and kill(2) are async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                pass_signals_to_parent_until_exec(not_parent);
                libc::kill(libc::getpid(), libc::SIGTSTP);
                Ok(())
            });
        }
        let done = command.spawn().unwrap().wait().unwrap();
        // The child's hooks ran to its exec before it exited: any signal it sent has
        // been delivered by now.
        let state = std::fs::read_to_string(format!("/proc/{not_parent}/stat")).unwrap();
        let letter = state.rsplit(") ").next().unwrap().chars().next().unwrap();
        bystander.kill().unwrap();
        bystander.wait().unwrap();
        assert!(done.success(), "the child went on to its exec");
        assert_ne!(letter, 'T', "the bystander was stopped: {state}");
    }
}
