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
//! COMMAND never runs without the lock: see `supervise.rs` for how (a watcher in
//! COMMAND's process group, the terminal handed over, Ctrl-Z suspending both),
//! `watcher.rs` for the watcher and `keeper.rs` for the keeper of a suspended job's
//! lock. The lease (`--ttl`) is renewed by the library's watchdog every third of it for
//! as long as the command runs, up to `--max-hold` if given. If the lease is lost
//! ([`LockGuard::lost`]), fencelock stops the command's whole process group: SIGTERM
//! (and SIGCONT, so a stopped member can act on it), up to `--kill-grace` (never past
//! the end of the lease) for the command to exit, SIGKILL. Then it releases the lock if
//! the key still holds its token (at the maximum hold, or with a renewal unconfirmed, it
//! may, for a moment) and exits 76.
//!
//! # Exit status
//!
//! | code | meaning |
//! |---|---|
//! | the command's | the command ran and exited under the lock: its exit code, or 128+N if signal N killed it |
//! | 64 | bad usage or input: the command line does not parse (bad option, DURATION, missing COMMAND); [`Error::InvalidArgument`] (lock name, TTL, key prefix, Redis URL, permits); [`Error::PermitsMismatch`] (`--permits` other than the semaphore's) |
//! | 69 | Redis unavailable or refusing: [`Error::Unavailable`], [`Error::Rejected`] (`NOAUTH`, `READONLY`, ...), [`Error::WrongType`] (a lock key holds data fencelock did not write), [`Error::NoQuorum`] (Redlock: too few nodes reachable or out of quarantine) |
//! | 70 | internal error: the runtime or signal handlers could not be set up, or a library error this version does not know |
//! | 75 | lock not acquired within `--wait`: [`Error::Held`] (with Redlock: held on enough nodes to block a majority) |
//! | 76 | the lease was lost while the command ran: its process group was stopped (SIGTERM, then SIGKILL after `--kill-grace`); also when the release finds the lease already lost ([`Error::LeaseLost`]) as the command exits: its work may have overlapped another holder's |
//! | 126 | COMMAND was found but could not be run (the lock is released first) |
//! | 127 | COMMAND was not found (the lock is released first) |
//! | 128+N | fencelock got signal N (SIGINT, SIGTERM, SIGHUP) before the command started |
//!
//! Every error is one line on stderr: `fencelock: <message>`.

mod args;
mod duration;
mod exit;
mod helper;
mod holding;
mod keeper;
mod man;
mod ops;
mod status_line;
mod supervise;
mod watcher;

use std::io::{IsTerminal, Write as _};
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use clap::CommandFactory;
use fencelock::{AcquireBuilder, Error, Kind, LockGuard, Target};

use args::{Cli, Command, RunArgs, one_line};
use exit::{EX_LEASE_LOST, Failure, Level, fail, tell, warn};
use holding::Holding;
use status_line::StatusLine;
use supervise::{BeforeCommand, Ended, Signals, run_command, suspend_self};

fn main() -> ExitCode {
    let cli = match args::parse(std::env::args_os()) {
        Ok(cli) => cli,
        // --help and --version: clap prints them to stdout.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
            return fail(&Failure::Usage(args::with_hint(one_line(&e), &e, &args)));
        }
    };
    exit::set_output(cli.json, cli.quiet);
    if cli.verbose || std::env::var_os("RUST_LOG").is_some_and(|v| !v.is_empty()) {
        trace_to_stderr();
    }
    let outcome = match cli.command {
        Command::Watch(w) => {
            return watcher::watch(w.deadline_ns, Duration::from_millis(w.grace_ms));
        }
        Command::Keep(k) => return keeper::keep(k.run),
        Command::Completions(c) => {
            // Generated into memory: clap_complete panics on a failed write.
            let mut script = Vec::new();
            let mut command = Cli::command();
            clap_complete::generate(c.shell, &mut command, "fencelock", &mut script);
            let mut stdout = std::io::stdout().lock();
            return match stdout.write_all(&script).and_then(|()| stdout.flush()) {
                // A reader that stopped early wanted no more.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => fail(&Failure::System(format!(
                    "cannot write the completions: {e}"
                ))),
                Ok(()) => ExitCode::SUCCESS,
            };
        }
        Command::Man(m) => {
            return match man::print(&m) {
                Ok(()) => ExitCode::SUCCESS,
                Err(failure) => fail(&failure),
            };
        }
        Command::Run(args) => block_on(run_locked(args)),
        Command::Elect(args) => block_on(elect(args.into_run())),
        Command::Status(args) => block_on(async move { ops::status(&args).await }),
        Command::List(args) => block_on(async move { ops::list(&args).await }),
        Command::Break(args) => block_on(async move { ops::break_lock(&args).await }),
        Command::Write(args) => block_on(async move { ops::fenced_write(&args).await }),
        Command::Sql => {
            let mut stdout = std::io::stdout().lock();
            let written = stdout
                .write_all(fencelock::fence::POSTGRES_SETUP.as_bytes())
                .and_then(|()| stdout.flush());
            return match written {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    fail(&Failure::System(format!("cannot write the SQL: {e}")))
                }
                _ => ExitCode::SUCCESS,
            };
        }
    };
    match outcome {
        Ok(status) => ExitCode::from(status),
        Err(failure) => fail(&failure),
    }
}

/// `-v`: the library's tracing (debug and up, or what RUST_LOG says) on stderr.
fn trace_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("fencelock=debug"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Runs `future` to the end on a current-thread runtime.
fn block_on(future: impl Future<Output = Result<u8, Failure>>) -> Result<u8, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::System(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(future)
}

async fn run_locked(args: RunArgs) -> Result<u8, Failure> {
    // Installed first: from here on no signal ends fencelock while it may hold the lock.
    let mut signals = Signals::install()?;
    let mut held = acquire(&args, &mut signals).await?;
    let tokens: Vec<String> = held
        .guards()
        .map(|g| format!("{:?} (fencing token {})", g.name(), g.fencing_token()))
        .collect();
    tell(
        Level::Notice,
        format_args!("holding lock {}", tokens.join(", ")),
    );
    match run_command(&args, &mut held, &mut signals).await {
        Ok(Ended::Stopped) => {
            // Owner-checked: deletes the key only if it is still ours (at the maximum
            // hold, or with a renewal unconfirmed, it is, for a moment), so that the
            // next holder need not wait for it to expire. Nothing to report otherwise.
            let _ = held.release().await;
            Ok(EX_LEASE_LOST)
        }
        Ok(Ended::Exited {
            status,
            at,
            valid_until,
        }) => release_after(held, status, at, valid_until).await,
        Err(failure) => {
            release(held).await;
            Err(failure)
        }
    }
}

/// `elect`: campaigns for `args.name`; runs COMMAND while leading, under `run`'s
/// supervision; campaigns again when leadership is lost; resigns and exits with
/// COMMAND's status when COMMAND exits.
async fn elect(args: RunArgs) -> Result<u8, Failure> {
    // Installed first: from here on no signal ends fencelock while it may lead.
    let mut signals = Signals::install()?;
    // `elect` takes one name (ElectArgs::into_run).
    let name = args.names[0].as_str();
    // Checked before connecting, so a bad name is bad input whatever state Redis is in.
    fencelock::keys::validate_name(name).map_err(Failure::Lock)?;
    // Lazily: a Redis down now is retried by the campaign, for ever.
    let client = connected(ops::builder(&args.connection)?.connect_lazy(), &mut signals).await?;
    let election = client
        .election(name)
        .lease(args.ttl)
        .holder_info(ops::elector_info(&args.command));
    loop {
        tell(Level::Notice, format_args!("campaigning for {:?}", name));
        // Boxed, so that a signal can drop it before the flush below.
        let mut campaign = Box::pin(election.campaign());
        let leadership = loop {
            tokio::select! {
                result = &mut campaign => break result.map_err(Failure::Lock)?,
                signal = signals.recv() => match signal {
                    BeforeCommand::Forward(signal) => {
                        // The dropped campaign takes back, in the background, a win
                        // whose reply was under way: let that finish before the
                        // runtime goes away.
                        drop(campaign);
                        client.flush().await;
                        return Err(Failure::Interrupted(signal));
                    }
                    // Ctrl-Z while campaigning: the job stops (its campaign with it, as
                    // a waiting `run`'s acquire); `fg` or `bg` goes on campaigning.
                    BeforeCommand::Stop => suspend_self(),
                },
            }
        };
        tell(
            Level::Notice,
            format_args!(
                "leading {:?} (term {})",
                leadership.name(),
                leadership.term()
            ),
        );
        let mut held = Holding {
            guards: vec![leadership.into_guard()],
            client: client.clone(),
        };
        match run_command(&args, &mut held, &mut signals).await {
            Ok(Ended::Stopped) => {
                // Owner-checked: resigns only if the lease is still ours (a renewal
                // unconfirmed: it may be, for a moment), so that a standby need not wait
                // for it to expire.
                let _ = held.release().await;
                tell(
                    Level::Notice,
                    format_args!("no longer leading {:?}; campaigning again", name),
                );
            }
            Ok(Ended::Exited {
                status,
                at,
                valid_until,
            }) => return release_after(held, status, at, valid_until).await,
            Err(failure) => {
                release(held).await;
                return Err(failure);
            }
        }
    }
}

/// Awaits `connecting`: a forwarded signal (Ctrl-C, SIGTERM, SIGHUP) abandons it, and
/// Ctrl-Z stops the job meanwhile (`fg` or `bg` goes on connecting).
async fn connected(
    connecting: impl Future<Output = Result<fencelock::Client, Error>>,
    signals: &mut Signals,
) -> Result<fencelock::Client, Failure> {
    tokio::pin!(connecting);
    loop {
        tokio::select! {
            result = &mut connecting => return result.map_err(Failure::Lock),
            signal = signals.recv() => match signal {
                BeforeCommand::Forward(signal) => return Err(Failure::Interrupted(signal)),
                BeforeCommand::Stop => suspend_self(),
            },
        }
    }
}

/// Connects and takes the lock; a signal abandons the attempt.
async fn acquire(args: &RunArgs, signals: &mut Signals) -> Result<Holding, Failure> {
    check_names(args)?;
    let client = connect(args, signals).await?;
    // Asked beside the acquire: a server that can evict lock keys gets a warning line
    // before COMMAND starts.
    let eviction = tokio::spawn({
        let client = client.clone();
        async move { client.eviction_risks().await }
    });
    // What this run says about itself, by which the status line finds its place in line.
    let info = ops::holder_info(&args.command);
    let mut acquiring = start_acquire(&client, args, &info);
    // On a terminal, a line that says what the wait is waiting for.
    let several = args.names.len() > 1;
    let own_info = (args.permits.is_none() && !args.shared && !several).then_some(info);
    let mut status_line = StatusLine::new(&client, &args.names[0], args.wait, own_info);
    let signal = loop {
        tokio::select! {
            result = &mut acquiring => {
                status_line.clear();
                let guards = result.map_err(Failure::Lock)?;
                warn_eviction(eviction).await;
                return Ok(Holding { guards, client });
            }
            signal = signals.recv() => match signal {
                BeforeCommand::Forward(signal) => break signal,
                // Ctrl-Z while waiting: the job stops, as any other would (its waiting
                // acquire with it); `fg` or `bg` goes on waiting.
                BeforeCommand::Stop => {
                    status_line.clear();
                    suspend_self();
                }
            },
            () = status_line.tick() => {}
        }
    };
    status_line.clear();
    // Dropping `acquiring` makes the library withdraw, in the background, whatever its
    // attempts may have written (a grant whose reply is under way, a place in a fair
    // queue); let that finish before the runtime goes away.
    drop(acquiring);
    client.flush().await;
    Err(Failure::Interrupted(signal))
}

/// Bad lock names, and what several names cannot be, as bad input (before connecting,
/// so whatever state Redis is in).
fn check_names(args: &RunArgs) -> Result<(), Failure> {
    for name in &args.names {
        fencelock::keys::validate_name(name).map_err(Failure::Lock)?;
    }
    if args.names.len() > 1 && (args.fair || args.shared || args.permits.is_some()) {
        return Err(Failure::Usage(
            "several lock names are taken as plain locks: not with --fair, --shared or \
             --permits"
                .to_owned(),
        ));
    }
    if args.names.len() > fencelock::limits::MAX_MULTI_NAMES {
        return Err(Failure::Usage(format!(
            "{} lock names; at most {} are taken at once",
            args.names.len(),
            fencelock::limits::MAX_MULTI_NAMES
        )));
    }
    Ok(())
}

/// The client of `run`: one node lazily, so that a node down now (a restart, a
/// failover) is retried for the whole --wait by the acquire, which then says it was
/// unreachable. Redlock connects tolerate a minority down anyway, and ask every node who
/// it is, to refuse one server named twice. A signal abandons the connect.
async fn connect(args: &RunArgs, signals: &mut Signals) -> Result<fencelock::Client, Failure> {
    let protection = Some(args.restart_protection).filter(|d| !d.is_zero());
    let connection = &args.connection;
    let builder = ops::builder(connection)?.restart_protection(protection);
    let connecting = async {
        match connection.urls().len() {
            1 => builder.connect_lazy().await,
            _ => builder.connect().await,
        }
    };
    connected(connecting, signals).await
}

/// The acquire `run`'s arguments ask for, under way: every name at once, a semaphore's
/// permit, a read lock, or a lock. Boxed, so that a signal can drop it before the flush.
fn start_acquire(
    client: &fencelock::Client,
    args: &RunArgs,
    info: &str,
) -> Pin<Box<dyn Future<Output = Result<Vec<LockGuard>, Error>> + Send>> {
    let name = args.names[0].as_str();
    match args.permits {
        _ if args.names.len() > 1 => {
            let all = client.lock_all(args.names.iter().cloned());
            let acquire = lease_settings(all, args).holder_info(info).acquire();
            Box::pin(async move { acquire.await.map(fencelock::MultiGuard::into_guards) })
        }
        // A semaphore's many holders share one key, as readers do: no holder info (yet).
        Some(permits) => one(lease_settings(client.semaphore(name, permits), args), |s| {
            if args.fair { s.fair() } else { s }
        }),
        None if args.shared => one(lease_settings(client.read_lock(name), args), |r| r),
        None => one(lease_settings(client.lock(name), args), |lock| {
            let lock = lock.holder_info(info);
            if args.fair { lock.fair() } else { lock }
        }),
    }
}

/// The acquire of one lock (`builder`, finished by `finish`), as a list of one guard.
fn one<K: Kind>(
    builder: AcquireBuilder<K>,
    finish: impl FnOnce(AcquireBuilder<K>) -> AcquireBuilder<K>,
) -> Pin<Box<dyn Future<Output = Result<Vec<LockGuard>, Error>> + Send>> {
    let acquire = finish(builder).acquire();
    Box::pin(async move { acquire.await.map(|guard| vec![guard]) })
}

/// The settings every kind of lock (and several at once) takes from `run`'s arguments.
fn lease_settings<K: Target>(builder: AcquireBuilder<K>, args: &RunArgs) -> AcquireBuilder<K> {
    let mut builder = builder.lease(args.ttl).wait(args.wait);
    if let Some(max_hold) = args.max_hold {
        builder = builder.max_hold(max_hold);
    }
    if args.replicas > 0 {
        builder = builder.replicas(args.replicas);
    }
    builder
}

/// Writes a warning line per server that can evict lock keys, if the check asked beside
/// the acquire has answered by now or within a moment more (a server that does not
/// answer `INFO` is not waited for: COMMAND starts).
async fn warn_eviction(
    check: tokio::task::JoinHandle<Result<fencelock::Eviction, fencelock::Error>>,
) {
    let answer = tokio::time::timeout(Duration::from_millis(200), check).await;
    if let Ok(Ok(Ok(found))) = answer {
        for risk in &found.risks {
            warn(format_args!("{risk}"));
        }
    }
}

/// Releases the lock after COMMAND exited with `status` at `ended`, when the lease was
/// confirmed until `valid_until`: `Ok(status)`, unless the lease turned out lost while
/// COMMAND ran. A release answered only after `valid_until` (Redis paused, a slow
/// network) that finds the key gone says nothing about COMMAND's work, which ended
/// inside the lease: a warning, and COMMAND's status.
async fn release_after(
    mut held: Holding,
    status: u8,
    ended: std::time::Instant,
    valid_until: std::time::Instant,
) -> Result<u8, Failure> {
    let mut name = held.first_name();
    // What the watchdog knew before the release stops it.
    let known_loss = held.guards().find_map(|g| {
        g.loss_cause()
            .map(|cause| (g.name().to_owned(), held.loss_reason(cause)))
    });
    if let Some((lost, _)) = &known_loss {
        name.clone_from(lost);
    }
    let known_loss = known_loss.map(|(_, reason)| reason);
    let released = held.release().await;
    if let Err(Error::LeaseLost { name: lost, .. }) = &released {
        name.clone_from(lost);
    }
    let lost = |reason: String| {
        Err(Failure::LostByExit {
            name: name.clone(),
            reason,
            status,
        })
    };
    let too_late = ended < valid_until && std::time::Instant::now() >= valid_until;
    match (released, known_loss) {
        (Ok(()), _) => Ok(status),
        (Err(Error::LeaseLost { cause, .. }), None) if too_late => {
            warn(format_args!(
                "COMMAND ended within its lease on lock {name:?}, but the release came after \
                 the lease ran out ({cause}); nothing was released"
            ));
            Ok(status)
        }
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
async fn release(mut held: Holding) {
    let name = held.first_name();
    match held.release().await {
        Ok(()) => {}
        Err(e @ Error::LeaseLost { .. }) => warn(format_args!("{e}")),
        Err(e) => warn_unreleased(&name, &e),
    }
}

fn warn_unreleased(name: &str, error: &Error) {
    warn(format_args!(
        "could not release lock {name:?}: {error}; unless Redis deleted it before the \
         failure, it stays held until its lease runs out"
    ));
}
