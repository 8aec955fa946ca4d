//! One worker process: acquire, read the resource, wait, write with the fencing token,
//! release; every step recorded in its own JSON Lines history.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use testkit::history::{Event, HistoryWriter, Op, Phase, monotonic_ns};

use crate::store::{Store, StoreKind};

/// Arguments of the hidden `worker` subcommand.
#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// Process id recorded in the history (unique per scenario).
    #[arg(long)]
    pub process: u32,
    /// `redis://` URL of the lock server; repeat it (an odd number, at least 3) for a
    /// Redlock client over independent nodes.
    #[arg(long, required = true)]
    pub lock_url: Vec<String>,
    /// Redlock: per-node timeout, ms.
    #[arg(long, default_value_t = 50)]
    pub node_timeout_ms: u64,
    /// Redlock: restart protection quarantine, ms (default: off; fresh servers are young).
    #[arg(long)]
    pub restart_protection_ms: Option<u64>,
    /// Connect and response timeout of the lock client, ms.
    #[arg(long, default_value_t = 1000, overrides_with = "lock_timeout_ms")]
    pub lock_timeout_ms: u64,
    /// URL of the resource: the resource `redis-server`, or PostgreSQL with `--store
    /// postgres`.
    #[arg(long)]
    pub resource_url: String,
    /// Where the resource lives.
    #[arg(long, value_enum, default_value = "redis")]
    pub store: StoreKind,
    /// Lock name.
    #[arg(long)]
    pub lock: String,
    /// Key prefix of the resource.
    #[arg(long)]
    pub prefix: String,
    /// Write through fencelock's check of the token (`Client::fenced_write`, or
    /// `fencelock_check` in PostgreSQL); otherwise plain writes.
    #[arg(long)]
    pub fenced: bool,
    /// Iterations (acquire .. release).
    #[arg(long)]
    pub iterations: u32,
    /// Fixed lock TTL, ms.
    #[arg(long, overrides_with = "ttl_ms")]
    pub ttl_ms: u64,
    /// How long an acquire waits for a held lock, ms.
    #[arg(long, overrides_with = "wait_ms")]
    pub wait_ms: u64,
    /// Extra wait between read and write in the first iteration, ms (a window for the
    /// harness to pause this process while it holds the lock).
    #[arg(long, default_value_t = 0, overrides_with = "hold_first_ms")]
    pub hold_first_ms: u64,
    /// Stop this process (SIGSTOP to itself) between the read and the write of the first
    /// iteration, holding the lock: the harness resumes it later (a process pause).
    #[arg(long)]
    pub stop_after_first_read: bool,
    /// Stop this process (SIGSTOP to itself) once connected, before its first acquire:
    /// the harness resumes it when a fault is staged (a grant taken at that moment).
    #[arg(long)]
    pub stop_before_first_acquire: bool,
    /// Replicas that must acknowledge each grant (`LockBuilder::replicas`; 0: none).
    #[arg(long, default_value_t = 0)]
    pub replicas: u32,
    /// Stop, before the next iteration, once this file exists (`--iterations` is then
    /// an upper bound): the harness ends steady traffic when its faults are done.
    #[arg(long)]
    pub stop_file: Option<PathBuf>,
    /// Take a renewed lease (`lease(ttl)`: the watchdog extends it) instead of a fixed
    /// TTL; the write is skipped when the guard reports the lease lost.
    #[arg(long)]
    pub renewed: bool,
    /// Fair mode (`LockBuilder::waiter_timeout`, or the semaphore's) with this waiter
    /// timeout, ms: waiters in line,
    /// the lock handed to the next one by the release.
    #[arg(long)]
    pub fair_waiter_timeout_ms: Option<u64>,
    /// A semaphore with this many permits (`Client::semaphore`) instead of a lock.
    #[arg(long)]
    pub permits: Option<u32>,
    /// A read-write lock's reader (`Client::read_lock`; not fair, not a semaphore): it reads the resource at the
    /// end of each hold (after the wait, and after the `--stop-after-first-read` stop,
    /// which for a reader comes before its read) and writes nothing. Without it, a
    /// worker of the same lock name is its writer.
    #[arg(long)]
    pub shared: bool,
    /// Other lock names taken with `--lock`, all at once (`Client::lock_all`; a plain
    /// lock only): the history, the token and the resource are `--lock`'s, the others
    /// only make the sets of several workers overlap. Repeat it for more.
    #[arg(long)]
    pub also: Vec<String>,
    /// Lead instead of lock: campaign in the election named `--lock`
    /// (`Client::election`, up to `--wait-ms`, with `--replicas`), the term as the
    /// token, resign as the release. A leadership's lease is always renewed: as
    /// `--renewed`, the write is skipped once it is reported lost.
    #[arg(long)]
    pub election: bool,
    /// A renewed lease's holder writes without checking first that it was not reported
    /// lost (as one paused between its check and its write would): only the fence stands
    /// between a stale holder's write and the resource.
    #[arg(long)]
    pub unchecked: bool,
    /// Seed of the random 0-5 ms waits.
    #[arg(long)]
    pub seed: u64,
    /// History file (JSON Lines) to append to.
    #[arg(long)]
    pub history: PathBuf,
}

/// Runs the worker on a single-threaded runtime.
pub fn main(args: WorkerArgs) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    rt.block_on(run(args))
}

/// How much lease a holder wants left after its wait, for the write itself.
const WRITE_MARGIN: Duration = Duration::from_millis(10);

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

async fn run(args: WorkerArgs) -> Result<(), String> {
    let p = args.process;
    let mut hist = HistoryWriter::create(&args.history)
        .map_err(|e| format!("{}: {e}", args.history.display()))?;
    let mut record = |e: Event| {
        hist.append(&e)
            .map_err(|err| format!("history append: {err}"))
    };
    let lock_timeout = Duration::from_millis(args.lock_timeout_ms);
    let builder = if args.lock_url.len() == 1 {
        fencelock::Client::builder(args.lock_url[0].as_str())
    } else {
        fencelock::Client::redlock(args.lock_url.iter().map(String::as_str))
            .restart_protection(args.restart_protection_ms.map(Duration::from_millis))
            .node_timeout(Duration::from_millis(args.node_timeout_ms))
    };
    let client = builder
        .connect_timeout(lock_timeout)
        .response_timeout(lock_timeout)
        .connect()
        .await
        .map_err(|e| format!("lock connect: {e}"))?;
    let nodes: Vec<String> = client.nodes();
    let mut store = Store::connect(args.store, &args.resource_url, &args.prefix).await?;
    let fenced = args.fenced.then_some(args.lock.as_str());
    let mut rng =
        StdRng::seed_from_u64(args.seed ^ u64::from(p).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let ttl = Duration::from_millis(args.ttl_ms);
    let wait = Duration::from_millis(args.wait_ms);
    // A leadership's lease is renewed, as `--renewed` asks of a lock's.
    let renewed = args.renewed || args.election;

    if args.stop_before_first_acquire {
        // SAFETY: raise(3) only sends a signal to this process; SIGSTOP stops it until
        // the harness sends SIGCONT.
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
    }
    for i in 0..args.iterations {
        if args.stop_file.as_ref().is_some_and(|f| f.exists()) {
            break;
        }
        record(Event::now(p, Op::Acquire, Phase::Invoke))?;
        let waiter_timeout = args.fair_waiter_timeout_ms.map(Duration::from_millis);
        // `--also`: the other names' guards, released after `--lock`'s.
        let mut others: Vec<fencelock::LockGuard> = Vec::new();
        let acquire = match args.permits {
            None if args.election => client
                .election(&args.lock)
                .wait(wait)
                .replicas(args.replicas)
                .lease(ttl)
                .campaign()
                .await
                .map(fencelock::Leadership::into_guard),
            None if !args.also.is_empty() => {
                let names = std::iter::once(&args.lock).chain(&args.also).cloned();
                let all = client
                    .lock_all(names)
                    .wait(wait)
                    .replicas(args.replicas)
                    .lease(ttl)
                    .renew(args.renewed)
                    .acquire()
                    .await;
                all.map(|all| {
                    let (mut main, rest): (Vec<_>, Vec<_>) = all
                        .into_guards()
                        .into_iter()
                        .partition(|g| g.name() == args.lock);
                    others = rest;
                    main.remove(0)
                })
            }
            Some(n) => {
                let builder = lease(client.semaphore(&args.lock, n), &args, wait, ttl);
                match waiter_timeout {
                    Some(timeout) => builder.waiter_timeout(timeout).acquire().await,
                    None => builder.acquire().await,
                }
            }
            None if args.shared => {
                lease(client.read_lock(&args.lock), &args, wait, ttl)
                    .acquire()
                    .await
            }
            None => {
                let builder = lease(client.lock(&args.lock), &args, wait, ttl);
                match waiter_timeout {
                    Some(timeout) => builder.waiter_timeout(timeout).acquire().await,
                    None => builder.acquire().await,
                }
            }
        };
        let guard = match acquire {
            Ok(g) => g,
            Err(e) => {
                record(Event::now(p, Op::Acquire, Phase::Fail).with_error(e.to_string()))?;
                continue;
            }
        };
        let now_ns = monotonic_ns();
        let valid_until_ns = now_ns
            + ns(guard
                .valid_until()
                .saturating_duration_since(Instant::now()));
        let token = guard.fencing_token().get();
        let owner = guard.holder_token().as_str().to_owned();
        let granted = Event::new(p, now_ns, Op::Acquire, Phase::Ok)
            .with_token(token)
            .with_owner(owner.as_str())
            .with_valid_until(valid_until_ns)
            .with_nodes(nodes.iter().map(String::as_str));
        record(if args.shared {
            granted.shared()
        } else {
            granted
        })?;

        let mut pause = Duration::from_micros(rng.random_range(0..=5_000));
        if i == 0 {
            pause += Duration::from_millis(args.hold_first_ms);
        }
        if args.shared {
            // A reader: its read is what it holds the lock for, so it comes last. A
            // careful reader reads only while its lease lasts (as a writer writes).
            let in_time = renewed || guard.remaining() > pause + WRITE_MARGIN;
            if in_time {
                if i == 0 && args.stop_after_first_read {
                    // SAFETY: as below.
                    unsafe {
                        libc::raise(libc::SIGSTOP);
                    }
                }
                tokio::time::sleep(pause).await;
                if !(renewed && (guard.loss_cause().is_some() || guard.remaining() <= WRITE_MARGIN))
                {
                    record(Event::now(p, Op::Read, Phase::Invoke))?;
                    record(match store.read().await {
                        Ok(v) => Event::now(p, Op::Read, Phase::Ok).with_value(v),
                        Err(e) => Event::now(p, Op::Read, Phase::Info).with_error(e),
                    })?;
                }
            }
            release_recorded(&mut record, guard, p, token, &owner).await?;
            release_all(others).await;
            continue;
        }

        record(Event::now(p, Op::Read, Phase::Invoke))?;
        let current = match store.read().await {
            Ok(v) => {
                record(Event::now(p, Op::Read, Phase::Ok).with_value(v))?;
                Some(v)
            }
            Err(e) => {
                record(Event::now(p, Op::Read, Phase::Info).with_error(e))?;
                None
            }
        };

        // A careful holder writes only while its lease lasts: a fixed lease must outlast
        // the wait before the write (with a margin for the write itself); a renewed one
        // must not be reported lost (checked again right before the write).
        let in_time = renewed || guard.remaining() > pause + WRITE_MARGIN;
        if let Some(current) = current.filter(|_| in_time) {
            if i == 0 && args.stop_after_first_read {
                // SAFETY: raise(3) only sends a signal to this process; SIGSTOP stops it
                // until the harness sends SIGCONT.
                unsafe {
                    libc::raise(libc::SIGSTOP);
                }
            }
            tokio::time::sleep(pause).await;
            // A renewed lease: not reported lost, and not about to end (a renewal held
            // up by a paused server or a slow link ends it without a loss report yet).
            if renewed
                && !args.unchecked
                && (guard.loss_cause().is_some() || guard.remaining() <= WRITE_MARGIN)
            {
                record(
                    Event::now(p, Op::Release, Phase::Invoke)
                        .with_token(token)
                        .with_owner(owner.as_str()),
                )?;
                let released = guard.release().await;
                release_all(others).await;
                record(
                    Event::now(p, Op::Release, Phase::Fail)
                        .with_token(token)
                        .with_owner(owner.as_str())
                        .with_error(format!("lease lost before the write: {released:?}")),
                )?;
                continue;
            }

            let value = i64::from(p) * 1_000_000 + i64::from(i);
            let next = current + 1;
            let write_event = |phase| {
                Event::now(p, Op::Write, phase)
                    .with_token(token)
                    .with_owner(owner.as_str())
                    .with_value(value)
            };
            record(write_event(Phase::Invoke))?;
            let outcome = store.write(fenced, token, next, value).await;
            match outcome {
                Ok(true) => record(write_event(Phase::Ok))?,
                Ok(false) => record(write_event(Phase::Fail).with_error("stale fencing token"))?,
                Err(e) => record(write_event(Phase::Info).with_error(e))?,
            }
        }

        release_recorded(&mut record, guard, p, token, &owner).await?;
        release_all(others).await;
    }
    Ok(())
}

/// Releases the other names of a `--also` acquire (not recorded: the history is
/// `--lock`'s); a failure leaves the key to its lease.
async fn release_all(guards: Vec<fencelock::LockGuard>) {
    for guard in guards {
        let _ = guard.release().await;
    }
}

/// The lease settings of every kind of lock the worker takes.
fn lease<K: fencelock::Kind>(
    builder: fencelock::AcquireBuilder<K>,
    args: &WorkerArgs,
    wait: Duration,
    ttl: Duration,
) -> fencelock::AcquireBuilder<K> {
    builder
        .wait(wait)
        .replicas(args.replicas)
        .lease(ttl)
        .renew(args.renewed)
}

/// Releases `guard`, recorded as `release invoke`, then `ok` or `fail` with the error.
async fn release_recorded(
    record: &mut impl FnMut(Event) -> Result<(), String>,
    guard: fencelock::LockGuard,
    p: u32,
    token: u64,
    owner: &str,
) -> Result<(), String> {
    let event = |phase| {
        Event::now(p, Op::Release, phase)
            .with_token(token)
            .with_owner(owner)
    };
    record(event(Phase::Invoke))?;
    match guard.release().await {
        Ok(()) => record(event(Phase::Ok)),
        Err(e) => record(event(Phase::Fail).with_error(e.to_string())),
    }
}
