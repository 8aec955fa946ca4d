//! The COMMAND that the CLI scenarios run under `fencelock run`: it records its hold in a
//! history of its own and writes the fenced resource with the token fencelock gave it.
//!
//! On start it records an acquire with `FENCELOCK_TOKEN` and an owner of its own, then
//! every 20 ms reads the resource's counter and writes it back plus one (through the
//! fenced write), recording each step, and at the end records its release. COMMAND does
//! not know its lease's end: its hold lasts until its release, or, when it was killed,
//! until its last recorded step (the harness records that release for it, see
//! [`close_history`]). So C1 judges what matters here: no two COMMANDs ever act at once.
//!
//! `fencelock elect` runs a COMMAND each time it leads: a second COMMAND of one elector
//! continues its history (the first one's hold closed as the harness would, then an
//! acquire of its own), with `--again-iterations` writes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::Args;
use testkit::history::{Event, HistoryWriter, Op, Phase, read_history};

use crate::store::{Store, StoreKind};

/// Arguments of the hidden `command` subcommand.
#[derive(Args, Debug, Clone)]
pub struct CommandArgs {
    /// Process id recorded in the history.
    #[arg(long)]
    pub process: u32,
    /// `redis://` URL of the resource server.
    #[arg(long)]
    pub resource_url: String,
    /// Key prefix of the resource.
    #[arg(long)]
    pub prefix: String,
    /// Writes (one every 20 ms).
    #[arg(long)]
    pub iterations: u32,
    /// History file (JSON Lines) to append to.
    #[arg(long)]
    pub history: PathBuf,
    /// Writes of a COMMAND that continues a history (its elector leads again; default:
    /// `--iterations`).
    #[arg(long)]
    pub again_iterations: Option<u32>,
    /// Escape supervision: do the work in a child in a session of its own (as a
    /// daemonizing program would), which fencelock's watcher cannot stop, and wait for it.
    #[arg(long)]
    pub escape: bool,
}

/// The pause between two writes.
const STEP: Duration = Duration::from_millis(20);

/// Runs the COMMAND (or, with `--escape`, a copy of it in a session of its own).
pub fn main(args: CommandArgs) -> Result<(), String> {
    if args.escape {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut child = Command::new(exe);
        child.args(std::env::args_os().skip(1).filter(|a| a != "--escape"));
        // SAFETY: setsid(2) is async-signal-safe and allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut child, || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let status = child
            .status()
            .map_err(|e| format!("cannot start the escaped copy: {e}"))?;
        return if status.success() {
            Ok(())
        } else {
            Err(format!("the escaped copy exited: {status}"))
        };
    }
    let token: u64 = std::env::var("FENCELOCK_TOKEN")
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or("FENCELOCK_TOKEN missing or not a number: not run by fencelock?")?;
    let p = args.process;
    let owner = format!("command-p{p}-{token}");
    let again = continue_history(&args.history, p)?;
    let iterations = match args.again_iterations {
        Some(n) if again => n,
        _ => args.iterations,
    };
    let mut hist = HistoryWriter::create(&args.history)
        .map_err(|e| format!("{}: {e}", args.history.display()))?;
    let mut record = |e: Event| {
        hist.append(&e.with_token(token).with_owner(owner.as_str()))
            .map_err(|err| format!("history append: {err}"))
    };
    record(Event::now(p, Op::Acquire, Phase::Ok).with_valid_until(u64::MAX))?;
    // The resource is named after the lock, which fencelock says in FENCELOCK_NAME.
    let lock = std::env::var("FENCELOCK_NAME").map_err(|_| "FENCELOCK_NAME missing")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    // Suspended with its job (Ctrl-Z) for seconds, perhaps with a request in flight.
    let mut store = rt.block_on(Store::connect_with(
        StoreKind::Redis,
        &args.resource_url,
        &args.prefix,
        Some(Duration::from_secs(60)),
    ))?;
    for i in 0..iterations {
        record(Event::now(p, Op::Read, Phase::Invoke))?;
        let current = rt
            .block_on(store.read())
            .map_err(|e| format!("resource read: {e}"))?;
        record(Event::now(p, Op::Read, Phase::Ok).with_value(current))?;
        let value = i64::from(p) * 1_000_000 + i64::from(i);
        record(Event::now(p, Op::Write, Phase::Invoke).with_value(value))?;
        let accepted = rt
            .block_on(store.write(Some(&lock), token, current + 1, value))
            .map_err(|e| format!("resource write: {e}"))?;
        record(if accepted {
            Event::now(p, Op::Write, Phase::Ok).with_value(value)
        } else {
            Event::now(p, Op::Write, Phase::Fail)
                .with_value(value)
                .with_error("stale fencing token")
        })?;
        std::thread::sleep(STEP);
    }
    record(Event::now(p, Op::Release, Phase::Invoke))?;
    record(Event::now(p, Op::Release, Phase::Ok))
}

/// Before a COMMAND records its grant: when the history already holds an earlier
/// COMMAND's (its elector leads again), closes that hold ([`close_history`]) and records
/// this one's acquire as begun now (later than the campaign began: C1 and C4 judge the
/// grant, not its start). Returns whether it continued an earlier COMMAND's history.
fn continue_history(path: &Path, process: u32) -> Result<bool, String> {
    let events = read_history(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let fresh = matches!(events.as_slice(), [e] if e.op == Op::Acquire && e.phase == Phase::Invoke);
    if fresh || events.is_empty() {
        return Ok(false);
    }
    close_history(path)?;
    HistoryWriter::create(path)
        .and_then(|mut w| w.append(&Event::now(process, Op::Acquire, Phase::Invoke)))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(true)
}

/// Ends the hold of a COMMAND that did not record its release (it was killed): a release
/// right after its last recorded step. Returns whether it had to.
pub fn close_history(path: &Path) -> Result<bool, String> {
    let events = read_history(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(last) = events.last() else {
        return Ok(false);
    };
    if last.op == Op::Release {
        return Ok(false);
    }
    let mut w = HistoryWriter::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut release = Event::new(last.process, last.time_ns + 1, Op::Release, Phase::Invoke);
    if let (Some(t), Some(o)) = (last.token, last.owner.as_deref()) {
        release = release.with_token(t).with_owner(o);
    }
    w.append(&release).map_err(|e| e.to_string())?;
    Ok(true)
}
