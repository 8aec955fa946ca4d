//! Many locks held at once with the watchdog on: what keeping their leases alive costs
//! Redis (script calls) and the client (CPU, memory).
//!
//! One client in the harness process acquires N distinct locks with a renewed lease,
//! then the harness resets Redis's command statistics and watches a window: script
//! calls, leases renewed, client CPU. Runs on its own redis-server, so the counts and
//! `DBSIZE` are this scenario's alone.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::clock::cpu_time;
use crate::report::{fmt_dur, yes_no};

/// The renewed lease of every lock: renewed every third of it (2 s), the watchdog ticking
/// every sixth (1 s).
pub const LEASE: Duration = Duration::from_secs(6);
/// The watchdog's tick for [`LEASE`].
pub const TICK: Duration = Duration::from_secs(1);
/// Concurrent acquiring tasks.
pub const TASKS: usize = 8;
/// Targets from the issue: script calls per tick per 100 held leases, and client memory
/// per held lock.
pub const TARGET_CALLS_PER_100: f64 = 1.0;
pub const TARGET_BYTES_PER_LOCK: f64 = 1024.0;
/// How long the background releases of the dropped guards may take.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(120);

/// What one run measured.
pub struct HeldRun {
    pub locks: usize,
    pub acquire_time: Duration,
    /// The measuring window, as it really lasted.
    pub window: Duration,
    pub evalsha: u64,
    pub eval: u64,
    /// Leases renewed: `PEXPIRE` calls inside scripts / 2 (`renew_lease` in
    /// `fragments/lease.lua` extends the lock key and its holder-info key, renew.lua's
    /// only writes).
    pub renewals: Option<u64>,
    pub cpu: Duration,
    /// VmRSS, bytes.
    pub rss_before: u64,
    pub rss_acquired: u64,
    pub rss_end: u64,
    /// `DBSIZE` at the end of the window.
    pub dbsize: u64,
    /// Guards whose `loss()` is `Some` at the end of the window.
    pub lost: usize,
    /// Leases the client's watchdog watches at the end of the window.
    pub watched: usize,
    pub release_time: Duration,
    /// Whether every background release finished within [`FLUSH_TIMEOUT`].
    pub flushed: bool,
    /// `DBSIZE` after the releases (the fence counters stay).
    pub dbsize_released: u64,
    /// CPU time the redis-server used over the window (`used_cpu_sys` + `used_cpu_user`
    /// of `INFO cpu`, all its threads); `None` if it did not say.
    pub redis_cpu: Option<Duration>,
}

impl HeldRun {
    /// Script calls per renewal tick per 100 held leases (the target: at most 1).
    pub fn calls_per_100_per_tick(&self) -> f64 {
        let ticks = self.window.as_secs_f64() / TICK.as_secs_f64();
        (self.evalsha + self.eval) as f64 / ticks / (self.locks as f64 / 100.0)
    }

    /// Client memory per held lock, bytes (VmRSS growth while acquiring / locks).
    pub fn bytes_per_lock(&self) -> f64 {
        self.rss_acquired.saturating_sub(self.rss_before) as f64 / self.locks as f64
    }

    /// Every lease stayed alive through the window.
    pub fn all_alive(&self) -> bool {
        self.dbsize == 2 * self.locks as u64 && self.lost == 0 && self.watched == self.locks
    }
}

/// Runs the scenario: `locks` held, watched for `window`.
pub async fn run(url: &str, locks: usize, window: Duration) -> Result<HeldRun, String> {
    let mut admin = redis::Client::open(url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let client = fencelock::Client::connect(url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    // Warm up (scripts loaded, connection buffers, the watchdog task), then start from
    // an empty database.
    for i in 0..100 {
        let guard = client
            .lock(format!("held-warmup:{i}"))
            .lease(LEASE)
            .try_acquire()
            .await
            .map_err(|e| format!("warm-up acquire: {e}"))?;
        guard
            .release()
            .await
            .map_err(|e| format!("warm-up release: {e}"))?;
    }
    query::<String>(&mut admin, &["FLUSHALL"]).await?;

    let rss_before = vm_rss()?;
    let started = Instant::now();
    let held = acquire_many(&client, locks).await?;
    let acquire_time = started.elapsed();
    let rss_acquired = vm_rss()?;

    query::<String>(&mut admin, &["CONFIG", "RESETSTAT"]).await?;
    let redis_cpu0 = redis_cpu(&mut admin).await?;
    let (t0, cpu0) = (Instant::now(), cpu_time());
    tokio::time::sleep(window).await;
    let (cpu1, window) = (cpu_time(), t0.elapsed());
    let redis_cpu1 = redis_cpu(&mut admin).await?;
    let stats: String = query(&mut admin, &["INFO", "commandstats"]).await?;
    let rss_end = vm_rss()?;
    let calls = |cmd: &str| command_stat(&stats, cmd, "calls");
    let dbsize: u64 = query(&mut admin, &["DBSIZE"]).await?;
    let lost = held
        .iter()
        .flatten()
        .filter(|g| g.loss_cause().is_some())
        .count();
    let watched = client.stats().watched_leases;

    let released = Instant::now();
    drop(held);
    let flushed = tokio::time::timeout(FLUSH_TIMEOUT, client.flush())
        .await
        .is_ok();
    let release_time = released.elapsed();
    let dbsize_released: u64 = query(&mut admin, &["DBSIZE"]).await?;
    Ok(HeldRun {
        locks,
        acquire_time,
        window,
        evalsha: calls("evalsha").unwrap_or(0),
        eval: calls("eval").unwrap_or(0),
        renewals: calls("pexpire").map(|n| n / 2),
        cpu: cpu1.saturating_sub(cpu0),
        rss_before,
        rss_acquired,
        rss_end,
        dbsize,
        lost,
        watched,
        release_time,
        flushed,
        dbsize_released,
        redis_cpu: redis_cpu0.zip(redis_cpu1).map(|(a, b)| b.saturating_sub(a)),
    })
}

/// The CPU time the server has used so far: `used_cpu_sys` + `used_cpu_user` of `INFO
/// cpu`; `None` if it does not say.
async fn redis_cpu(admin: &mut MultiplexedConnection) -> Result<Option<Duration>, String> {
    let info: String = query(admin, &["INFO", "cpu"]).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    Ok(field("used_cpu_sys")
        .zip(field("used_cpu_user"))
        .map(|(sys, user)| Duration::from_secs_f64(sys + user)))
}

/// Acquires `locks` distinct locks (`held:0`, `held:1`, ...) with a renewed [`LEASE`],
/// [`TASKS`] tasks taking turns, `try_acquire` each; the guards, per task. On the first
/// failure, drops what it holds, awaits `client.flush()` (bounded) and returns the error.
pub async fn acquire_many(
    client: &fencelock::Client,
    locks: usize,
) -> Result<Vec<Vec<fencelock::LockGuard>>, String> {
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let client = client.clone();
        tasks.spawn(async move {
            let mut guards = Vec::with_capacity(locks / TASKS + 1);
            for i in (t..locks).step_by(TASKS) {
                let guard = client
                    .lock(format!("held:{i}"))
                    .lease(LEASE)
                    .try_acquire()
                    .await
                    .map_err(|e| format!("acquire held:{i}: {e}"))?;
                guards.push(guard);
            }
            Ok::<_, String>(guards)
        });
    }
    let mut held: Vec<Vec<fencelock::LockGuard>> = Vec::with_capacity(TASKS);
    let mut failure = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(guards)) => held.push(guards),
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(e) => failure = failure.or(Some(format!("acquiring task failed: {e}"))),
        }
    }
    if let Some(e) = failure {
        drop(held);
        tokio::time::timeout(FLUSH_TIMEOUT, client.flush())
            .await
            .ok();
        return Err(e);
    }
    Ok(held)
}

/// One command on `conn`: `args[0]` with the rest as its arguments; errors name the
/// command.
pub async fn query<T: redis::FromRedisValue>(
    conn: &mut MultiplexedConnection,
    args: &[&str],
) -> Result<T, String> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn)
        .await
        .map_err(|e| format!("{}: {e}", args.join(" ")))
}

/// `field` (`calls`, `usec`) of `cmdstat_<cmd>` in `INFO commandstats`; `None` if the
/// command was never called.
pub fn command_stat(info: &str, cmd: &str, field: &str) -> Option<u64> {
    let prefix = format!("cmdstat_{cmd}:");
    let field = format!("{field}=");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(field.as_str()))
                .and_then(|n| n.parse().ok())
        })
}

/// This process's resident memory (VmRSS), bytes.
fn vm_rss() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| "no VmRSS in /proc/self/status".to_owned())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Appends the section to the report.
pub fn render(s: &mut String, run: &Result<HeldRun, String>, locks: usize, window: Duration) {
    let _ = writeln!(s, "## {locks} locks held at once, watchdog on\n");
    let _ = writeln!(
        s,
        "One client in the harness process (a current-thread tokio runtime) acquires {locks} \
         distinct locks with `.lease({LEASE:?})` ({TASKS} tasks taking turns, `try_acquire` \
         each) and keeps every guard: the watchdog renews each lease every third of it (~2 \
         s) and ticks every sixth ({TICK:?}), batching the leases that fall due into \
         `renew.lua` calls. Then `CONFIG RESETSTAT` on its own redis-server, and a window of \
         {} in which the client does nothing else. Script calls: `calls` of \
         `cmdstat_evalsha` + `cmdstat_eval` in `INFO commandstats`; leases renewed: \
         `cmdstat_pexpire` / 2 (commands run by scripts are counted too; `renew.lua` runs two \
         `PEXPIRE`s per lease it renews, on the lock key and its holder-info key, and nothing \
         else runs in the window). Ticks = \
         window / {TICK:?}. CPU: `getrusage(RUSAGE_SELF)` user + system over the window, as \
         a share of one core. Memory: VmRSS after acquiring minus before (after a warm-up), \
         divided by the locks; approximate, as it includes the allocator's slack and the \
         growth of the Redis connection's buffers, and the guards themselves (the caller's \
         `Vec<LockGuard>`). Alive: `DBSIZE` = 2N (lock key + fence counter per lock), no \
         guard's `loss()` is `Some`, and the watchdog still watches N leases. At the end the \
         guards are dropped (released in the background) and `client.flush()` awaited.\n",
        fmt_dur(window),
    );
    let run = match run {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(s, "Run failed: {e}\n");
            return;
        }
    };
    let n = run.locks as f64;
    let secs = run.window.as_secs_f64();
    let ticks = secs / TICK.as_secs_f64();
    let calls = run.evalsha + run.eval;
    let per_tick = calls as f64 / ticks;
    let per_100 = per_tick / (n / 100.0);
    let cpu_pct = 100.0 * run.cpu.as_secs_f64() / secs;
    let grown = run.rss_acquired.saturating_sub(run.rss_before);
    let grown_end = run.rss_end.saturating_sub(run.rss_before);
    let per_lock = grown as f64 / n;
    let per_lock_end = grown_end as f64 / n;
    let (renewals, per_call, per_lease) = match run.renewals {
        Some(r) if calls > 0 => (
            r.to_string(),
            format!("{:.0}", r as f64 / calls as f64),
            format!("{:.2}", r as f64 / n),
        ),
        Some(r) => (r.to_string(), "–".into(), format!("{:.2}", r as f64 / n)),
        None => ("0".into(), "–".into(), "0".into()),
    };
    let _ = writeln!(s, "| measure | value |\n|---|---|");
    let rows: Vec<(&str, String)> = vec![
        ("locks held", run.locks.to_string()),
        (
            "acquiring them took",
            format!(
                "{:.2} s ({:.0} acquires/s)",
                run.acquire_time.as_secs_f64(),
                n / run.acquire_time.as_secs_f64()
            ),
        ),
        (
            "window",
            format!("{secs:.2} s = {ticks:.1} ticks of {TICK:?}"),
        ),
        (
            "script calls in the window (evalsha + eval)",
            format!("{calls} ({} + {})", run.evalsha, run.eval),
        ),
        ("script calls / s", format!("{:.1}", calls as f64 / secs)),
        ("script calls / tick", format!("{per_tick:.1}")),
        (
            "script calls / tick per 100 held leases",
            format!("{per_100:.3}"),
        ),
        ("leases renewed in the window (PEXPIRE / 2)", renewals),
        ("leases renewed / script call", per_call),
        (
            "renewals / lease in the window",
            format!("{per_lease} (one per ~2 s expected: {:.1})", secs / 2.0),
        ),
        (
            "client CPU over the window",
            format!(
                "{:.3} s = {cpu_pct:.2} % of one core",
                run.cpu.as_secs_f64()
            ),
        ),
        (
            "redis-server CPU over the window (INFO cpu)",
            run.redis_cpu.map_or("–".to_owned(), |c| {
                format!(
                    "{:.3} s = {:.2} % of one core",
                    c.as_secs_f64(),
                    100.0 * c.as_secs_f64() / secs
                )
            }),
        ),
        (
            "client VmRSS before / after acquiring / end of window",
            format!(
                "{} / {} / {}",
                mib(run.rss_before),
                mib(run.rss_acquired),
                mib(run.rss_end)
            ),
        ),
        (
            "client memory / held lock (approx.)",
            format!(
                "{per_lock:.0} B after acquiring; {per_lock_end:.0} B at the end of the window"
            ),
        ),
        (
            "DBSIZE at the end of the window",
            format!("{} (2N = {})", run.dbsize, 2 * run.locks),
        ),
        ("guards with loss() = Some", run.lost.to_string()),
        ("leases watched by the watchdog", run.watched.to_string()),
        (
            "drop all + flush()",
            format!(
                "{:.2} s{}; DBSIZE after: {} (the {} fence counters stay)",
                run.release_time.as_secs_f64(),
                if run.flushed { "" } else { " (**timed out**)" },
                run.dbsize_released,
                run.locks
            ),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| target | figure | met |\n|---|---|---|\n\
         | at most {TARGET_CALLS_PER_100} script call per 100 leases per tick | \
         {per_tick:.1} calls/tick for {} leases = {per_100:.3} per 100 | {} |\n\
         | under 1 KiB client memory per held lock | {per_lock:.0} B (VmRSS after acquiring \
         − before, / N) | {} |\n\
         | (the same, at the end of the window: with the watchdog's renewal working set) | \
         {per_lock_end:.0} B | {} |\n\
         | every lease stayed alive | DBSIZE {} of {}, {} lost, {} watched | {} |\n",
        run.locks,
        yes_no(per_100 <= TARGET_CALLS_PER_100),
        yes_no(per_lock < TARGET_BYTES_PER_LOCK),
        yes_no(per_lock_end < TARGET_BYTES_PER_LOCK),
        run.dbsize,
        2 * run.locks,
        run.lost,
        run.watched,
        yes_no(run.all_alive()),
    );
}
