//! Election takeover after a kill: how long a standby takes to lead once the leader's
//! process is killed (SIGKILL), against the same measurement with a plain lock (a
//! holder, and a `wait_forever` waiter: election by lock alone), the reference point
//! (no peer of the bench has an election).
//!
//! Per round, on a fresh name: a leader process (this binary re-executed as the hidden
//! `elector` subcommand) takes the name and says so; a standby process campaigns on the
//! same name, waiting for ever. Once the standby's client is on the name's wake list
//! (`Client::inspect`'s `waiting_clients`: its campaign waits), the harness reads
//! `CLOCK_MONOTONIC` and kills the leader, then reads what is left of the dead leader's
//! lease (`inspect` again). The standby reports the `CLOCK_MONOTONIC` time at which its
//! campaign returned, and its term. The two ways take turns, round by round, so that
//! drift hits them alike.

use std::fmt::Write as _;
use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{Instant, sleep, timeout};

use crate::clock::mono_ns;
use crate::plan::Plan;
use crate::report::{fmt_ns, x, yes_no};

/// How long an elector may take to connect, or to lead uncontended.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the standby may take to lead past the lease, before the round fails.
const TAKEOVER_GRACE: Duration = Duration::from_secs(10);
/// The pause between two reads of the wake list while the harness waits for the
/// standby to be listed.
const LISTED_POLL: Duration = Duration::from_millis(2);

/// What the leader holds and the standby waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Way {
    /// `client.election(name).lease(L)`: `campaign()`.
    Election,
    /// `client.lock(name).lease(L)`: `acquire()`, the waiter with `wait_forever()`.
    Lock,
}

impl Way {
    const BOTH: [Way; 2] = [Way::Election, Way::Lock];

    fn label(self) -> &'static str {
        match self {
            Way::Election => "`election(name).campaign()`",
            Way::Lock => "`lock(name).wait_forever()`",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Way::Election => "election",
            Way::Lock => "lock",
        }
    }
}

/// Arguments of the hidden `elector` subcommand (set by the harness, not by people).
#[derive(clap::Args, Clone, Debug)]
pub struct ElectorArgs {
    /// Redis URL.
    #[arg(long)]
    url: String,
    /// The election's (or lock's) name.
    #[arg(long)]
    name: String,
    /// The lease, in milliseconds (renewed by the watchdog every third of it).
    #[arg(long)]
    lease_ms: u64,
    /// What it takes.
    #[arg(long, value_enum)]
    way: Way,
    /// The standby: campaigns waiting for ever, and reports when it leads. Without it:
    /// the leader, which takes the name at once and holds it until it is killed.
    #[arg(long)]
    standby: bool,
}

/// The elector. Protocol, one line each on stdout: `tag TAG` (its client's tag, as the
/// wake list names it) once connected; the leader then `leading TERM` once it leads;
/// the standby `campaigning` just before its campaign starts, then `leads NS TERM` when
/// it returned (NS: `CLOCK_MONOTONIC`, read right after it returned); `error MSG` on a
/// failure. It exits when its stdin closes (the harness is done with it, or gone).
pub fn elector(args: ElectorArgs) -> i32 {
    std::thread::spawn(|| {
        let mut line = String::new();
        let stdin = std::io::stdin();
        loop {
            line.clear();
            match stdin.lock().read_line(&mut line) {
                Ok(0) | Err(_) => std::process::exit(0),
                Ok(_) => {}
            }
        }
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        if let Err(e) = elect(&args).await {
            println!("error {e}");
            return 1;
        }
        // Holds (the leader) or has reported (the standby) until stdin closes.
        std::future::pending::<i32>().await
    })
}

/// The elector's work, until it leads (and, the standby, has reported); the lock or
/// leadership is kept (leaked) for as long as the process lives.
async fn elect(args: &ElectorArgs) -> Result<(), String> {
    let client = fencelock::Client::connect(&args.url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    println!("tag {}", client.tag());
    let lease = Duration::from_millis(args.lease_ms);
    if args.standby {
        println!("campaigning");
    }
    let (term, guard) = match args.way {
        Way::Election => {
            let leadership = client
                .election(args.name.as_str())
                .lease(lease)
                .wait_forever()
                .campaign()
                .await
                .map_err(|e| format!("campaign: {e}"))?;
            (leadership.term().get(), leadership.into_guard())
        }
        Way::Lock => {
            let guard = client
                .lock(args.name.as_str())
                .lease(lease)
                .wait_forever()
                .acquire()
                .await
                .map_err(|e| format!("acquire: {e}"))?;
            (guard.fencing_token().get(), guard)
        }
    };
    let now = mono_ns();
    if args.standby {
        println!("leads {now} {term}");
    } else {
        println!("leading {term}");
    }
    // Held until the process ends: the leader's is killed with it, the standby's is
    // left to expire (the next round uses another name).
    std::mem::forget(guard);
    std::mem::forget(client);
    Ok(())
}

/// One round's measurement.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Round {
    /// From just before the kill until the standby's campaign (or acquire) returned, ns.
    pub(crate) takeover: u64,
    /// What was left of the dead leader's lease right after the kill, as Redis said
    /// (`PTTL`, whole ms), ns.
    pub(crate) lease_left: u64,
    /// When the read of `lease_left` was sent, from the kill, ns.
    pub(crate) read_after: u64,
    pub(crate) killed_term: u64,
    pub(crate) standby_term: u64,
}

impl Round {
    /// From the lease's end (as Redis reported it right after the kill) until the
    /// standby led, ns: the waiter's wake after the expiry.
    pub(crate) fn after_expiry(&self) -> i64 {
        self.takeover as i64 - (self.read_after + self.lease_left) as i64
    }
}

/// One way at one lease, over its rounds.
pub(crate) struct Row {
    pub(crate) way: Way,
    pub(crate) lease: Duration,
    pub(crate) rounds: Vec<Round>,
    pub(crate) errors: Vec<String>,
}

impl Row {
    /// Rounds whose standby's term is not above the killed leader's.
    fn terms_not_rising(&self) -> usize {
        self.rounds
            .iter()
            .filter(|r| r.standby_term <= r.killed_term)
            .count()
    }
}

/// The section's rows, and why it could not run, if it could not.
#[derive(Default)]
pub(crate) struct Takeover {
    pub(crate) rows: Vec<Row>,
    pub(crate) error: Option<String>,
}

impl Takeover {
    pub(crate) fn failed(&self) -> bool {
        self.error.is_some()
            || self
                .rows
                .iter()
                .any(|r| !r.errors.is_empty() || r.rounds.is_empty() || r.terms_not_rising() > 0)
    }
}

/// Runs the plan's rounds on `server`: for each lease, both ways taking turns.
pub(crate) async fn run(plan: &Plan, server: &testkit::RedisServer) -> Takeover {
    let url = server.url();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return Takeover {
                error: Some(format!("current_exe: {e}")),
                ..Takeover::default()
            };
        }
    };
    let client = match fencelock::Client::connect(&url).await {
        Ok(c) => c,
        Err(e) => {
            return Takeover {
                error: Some(format!("connect: {e}")),
                ..Takeover::default()
            };
        }
    };
    let mut rows = Vec::new();
    for &(lease, rounds) in plan.election_rounds {
        eprintln!(
            "election takeover: {rounds} rounds per way with a {lease:?} lease, the leader killed"
        );
        let mut lease_rows: Vec<Row> = Way::BOTH
            .iter()
            .map(|&way| Row {
                way,
                lease,
                rounds: Vec::new(),
                errors: Vec::new(),
            })
            .collect();
        for i in 0..rounds {
            for row in &mut lease_rows {
                let name = format!("takeover-{}-{}ms-{i}", row.way.slug(), lease.as_millis());
                match round(&exe, &url, &client, row.way, lease, &name).await {
                    Ok(r) => row.rounds.push(r),
                    Err(e) => {
                        eprintln!("election takeover ({}, {name}): {e}", row.way.slug());
                        row.errors.push(e);
                    }
                }
            }
        }
        rows.extend(lease_rows);
    }
    Takeover { rows, error: None }
}

/// An elector process and its stdout.
struct Elector {
    child: Child,
    /// Kept open: the elector exits when it closes.
    _stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Elector {
    async fn start(
        exe: &std::path::Path,
        url: &str,
        way: Way,
        lease: Duration,
        name: &str,
        standby: bool,
    ) -> Result<Elector, String> {
        let mut cmd = Command::new(exe);
        cmd.args(["elector", "--url", url, "--name", name, "--way", way.slug()])
            .args(["--lease-ms", &lease.as_millis().to_string()]);
        if standby {
            cmd.arg("--standby");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot spawn an elector: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        Ok(Elector {
            child,
            _stdin: stdin,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// The next line, which must start with `what`: the rest of it.
    async fn expect(&mut self, what: &str, within: Duration) -> Result<String, String> {
        let line = match timeout(within, self.lines.next_line()).await {
            Err(_) => return Err(format!("no `{what}` line within {within:?}")),
            Ok(Err(e)) => return Err(format!("reading an elector: {e}")),
            Ok(Ok(None)) => return Err(format!("an elector exited before `{what}`")),
            Ok(Ok(Some(l))) => l,
        };
        match line.split_once(' ').unwrap_or((line.as_str(), "")) {
            (w, rest) if w == what => Ok(rest.to_owned()),
            ("error", e) => Err(format!("elector: {e}")),
            _ => Err(format!("expected `{what}`, got {line:?}")),
        }
    }
}

fn parse<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| format!("bad {what}: {s:?}"))
}

/// One round on `name`: leader, standby listed, kill, takeover.
async fn round(
    exe: &std::path::Path,
    url: &str,
    client: &fencelock::Client,
    way: Way,
    lease: Duration,
    name: &str,
) -> Result<Round, String> {
    let mut leader = Elector::start(exe, url, way, lease, name, false).await?;
    leader.expect("tag", START_TIMEOUT).await?;
    let killed_term: u64 = parse(&leader.expect("leading", START_TIMEOUT).await?, "term")?;
    let mut standby = Elector::start(exe, url, way, lease, name, true).await?;
    let tag = standby.expect("tag", START_TIMEOUT).await?;
    standby.expect("campaigning", START_TIMEOUT).await?;
    // The standby waits once its client is on the wake list (its attempt was refused
    // and it listens for a release).
    let listed_by = Instant::now() + START_TIMEOUT;
    loop {
        let status = client
            .inspect(name)
            .await
            .map_err(|e| format!("inspect: {e}"))?;
        let listed = status.nodes.iter().any(|n| {
            n.state
                .as_ref()
                .is_ok_and(|s| s.waiting_clients.iter().any(|c| c.client == tag))
        });
        if listed {
            break;
        }
        if Instant::now() >= listed_by {
            return Err(format!(
                "the standby was not listed within {START_TIMEOUT:?}"
            ));
        }
        sleep(LISTED_POLL).await;
    }
    let pid = leader
        .child
        .id()
        .ok_or("the leader exited before the kill")?;
    let killed_at = mono_ns();
    // SAFETY: kill(2) on our own child, which has not been reaped (`child.id()` is
    // `Some` until it is), so the pid is still its.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    if rc != 0 {
        return Err(format!("kill: {}", std::io::Error::last_os_error()));
    }
    let read_at = mono_ns();
    let status = client
        .inspect(name)
        .await
        .map_err(|e| format!("inspect after the kill: {e}"))?;
    let lease_left = status
        .nodes
        .first()
        .and_then(|n| n.state.as_ref().ok())
        .and_then(|s| match &s.holder {
            Some(fencelock::Holder::Plain { remaining }) => *remaining,
            _ => None,
        })
        .ok_or_else(|| format!("no holder with a lease right after the kill: {status:?}"))?;
    let leads = standby.expect("leads", lease + TAKEOVER_GRACE).await?;
    let (at, term) = leads
        .split_once(' ')
        .ok_or_else(|| format!("bad `leads` line: {leads:?}"))?;
    let (led_at, standby_term): (u64, u64) = (parse(at, "time")?, parse(term, "term")?);
    let _ = leader.child.wait().await;
    drop(standby); // closes its stdin: it exits (and is killed on drop if not)
    Ok(Round {
        takeover: led_at.saturating_sub(killed_at),
        lease_left: lease_left.as_nanos() as u64,
        read_after: read_at - killed_at,
        killed_term,
        standby_term,
    })
}

/// The nearest-rank percentile `q` of `v` (sorted).
fn rank<T: Copy>(v: &[T], q: f64) -> T {
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[i - 1]
}

/// `-12.3 ms`, `4.56 ms`: a signed duration in ns.
fn fmt_signed(ns: i64) -> String {
    if ns < 0 {
        format!("−{}", fmt_ns(ns.unsigned_abs()))
    } else {
        fmt_ns(ns as u64)
    }
}

/// The section "Election takeover after a kill".
pub(crate) fn render(s: &mut String, t: &Takeover, plan: &Plan) {
    let _ = writeln!(s, "## Election takeover after a kill\n");
    let leases: Vec<String> = plan
        .election_rounds
        .iter()
        .map(|(lease, n)| format!("{n} rounds per way with a {} lease", fmt_dur_ms(*lease)))
        .collect();
    let _ = writeln!(
        s,
        "Per round, on a fresh name on the main server: a leader process campaigns with \
         `client.election(name).lease(L)` and leads; a standby process campaigns on the \
         same name (`wait_forever()`). Once the standby's client is on the name's wake \
         list (`client.inspect(name)`: its campaign was refused and waits), the harness \
         reads `CLOCK_MONOTONIC` and SIGKILLs the leader, some milliseconds after the \
         leader's grant: nearly a whole lease is left, as after a kill just after a \
         renewal (the watchdog renews every third of the lease, so a kill at a random \
         time leaves between about two thirds of L and L). **Takeover**: from just \
         before the kill until the standby's campaign returned (its process reads the \
         same clock), so it includes the grant's round trip. It is what was left of the \
         dead leader's lease (**lease left**, read with `inspect` right after the kill, \
         whole ms) plus the standby's wake after Redis expired the key. A kill publishes nothing and fencelock does not use \
         keyspace notifications: a waiter learns of the expiry from the lease Redis \
         reported with its last refusal (it sleeps that long plus 1 ms, then tries \
         again), so **after expiry** (takeover − the lease's end as read after the \
         kill, to within about a millisecond) is fencelock's own part. Reference, in \
         the same run, the rounds taking turns: a plain lock's holder killed and a \
         `client.lock(name).lease(L).wait_forever()` waiter (election by lock alone; \
         no peer in the bench has an election). {}. Nearest-rank percentiles: with \
         fewer than 100 rounds p99 is the max.\n",
        leases.join(", ")
    );
    if let Some(e) = &t.error {
        let _ = writeln!(s, "Not measured: {e}\n");
        return;
    }
    let _ = writeln!(
        s,
        "| lease | standby | rounds | takeover p50 | p99 | max | takeover − lease p50 | \
         max | lease left p50 | after expiry p50 | max | × lock (p50) | terms rising | \
         errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in &t.rows {
        let errors = match r.errors.first() {
            None => "0".to_owned(),
            Some(e) => format!("{} (first: {})", r.errors.len(), e.replace('|', "/")),
        };
        if r.rounds.is_empty() {
            let _ = writeln!(
                s,
                "| {} | {} | 0 | – | – | – | – | – | – | – | – | – | – | {errors} |",
                fmt_dur_ms(r.lease),
                r.way.label()
            );
            continue;
        }
        let mut takeover: Vec<u64> = r.rounds.iter().map(|x| x.takeover).collect();
        takeover.sort_unstable();
        let lease_ns = r.lease.as_nanos() as i64;
        let mut left: Vec<u64> = r.rounds.iter().map(|x| x.lease_left).collect();
        left.sort_unstable();
        let mut after: Vec<i64> = r.rounds.iter().map(Round::after_expiry).collect();
        after.sort_unstable();
        let p50 = rank(&takeover, 0.5);
        let lock_p50 = t
            .rows
            .iter()
            .find(|o| o.way == Way::Lock && o.lease == r.lease && !o.rounds.is_empty())
            .map(|o| {
                let mut v: Vec<u64> = o.rounds.iter().map(|x| x.takeover).collect();
                v.sort_unstable();
                rank(&v, 0.5)
            });
        let bad = r.terms_not_rising();
        let terms = if bad == 0 {
            format!(
                "{} ({} of {})",
                yes_no(true),
                r.rounds.len(),
                r.rounds.len()
            )
        } else {
            format!("{} ({bad} of {} not)", yes_no(false), r.rounds.len())
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {terms} | {errors} |",
            fmt_dur_ms(r.lease),
            r.way.label(),
            r.rounds.len(),
            fmt_ns(p50),
            fmt_ns(rank(&takeover, 0.99)),
            fmt_ns(*takeover.last().expect("rounds")),
            fmt_signed(p50 as i64 - lease_ns),
            fmt_signed(*takeover.last().expect("rounds") as i64 - lease_ns),
            fmt_ns(rank(&left, 0.5)),
            fmt_signed(rank(&after, 0.5)),
            fmt_signed(*after.last().expect("rounds")),
            lock_p50.map_or("–".into(), |l| x(p50 as f64 / l as f64)),
        );
    }
    let _ = writeln!(s);
    let bad: Vec<String> = t
        .rows
        .iter()
        .flat_map(|r| {
            r.rounds
                .iter()
                .filter(|x| x.standby_term <= x.killed_term)
                .map(move |x| {
                    format!(
                        "{} with a {} lease: standby term {} after the killed leader's {}",
                        r.way.slug(),
                        fmt_dur_ms(r.lease),
                        x.standby_term,
                        x.killed_term
                    )
                })
        })
        .collect();
    if bad.is_empty() {
        let _ = writeln!(
            s,
            "Every standby's term (fencing token) is above the killed leader's.\n"
        );
    } else {
        let _ = writeln!(
            s,
            "**FAILED: a standby's term is not above the killed leader's** ({}).\n",
            bad.join("; ")
        );
    }
}

/// `1 s`, `250 ms`.
fn fmt_dur_ms(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v = [1, 2, 3, 4, 5];
        assert_eq!(rank(&v, 0.5), 3);
        assert_eq!(rank(&v, 0.99), 5);
        assert_eq!(rank(&[7], 0.5), 7);
    }

    #[test]
    fn a_standby_term_not_above_the_killed_one_fails_the_section() {
        let round = |standby_term| Round {
            takeover: 1_000_000_000,
            lease_left: 900_000_000,
            read_after: 100_000,
            killed_term: 10,
            standby_term,
        };
        let t = |standby_term| Takeover {
            rows: vec![Row {
                way: Way::Election,
                lease: Duration::from_secs(1),
                rounds: vec![round(11), round(standby_term)],
                errors: Vec::new(),
            }],
            error: None,
        };
        assert!(!t(12).failed());
        assert!(t(10).failed());
        let mut s = String::new();
        render(&mut s, &t(9), &crate::plan::QUICK);
        assert!(s.contains("FAILED"), "{s}");
    }
}
