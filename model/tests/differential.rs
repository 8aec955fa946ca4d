//! The model's keyspace proven against real servers: random command sequences, and
//! every shipped script with random arguments (well-typed and ill-typed), run on the
//! in-memory [`Server`] and on a real server that testkit starts, with identical
//! replies and identical keyspaces required after every step.
//!
//! The clock: the real server runs on a [`ServerClock`] frozen at one instant, which
//! the test steps by exactly what it steps the model's clock by, so `TIME`, `PTTL`,
//! every expiry and every token minted from the clock compare exactly (no tolerance).
//! The model is told the server's `run_id` and start, so `INFO`'s answers agree too.
//!
//! Valkey 9.1 is the exception: its clock moves under a frozen wall clock (see
//! [`Dialect::drifts`]), so against it times and TTLs compare within 10 ms, keys with
//! 10 ms or less to live are left out of the comparison, doubles compare by value
//! (Valkey writes the shortest text, Redis `%.17g`), and "-0" is not sent.
//!
//! Keyspaces compare without `DUMP`: for every key (`KEYS *`), its type, its value (a
//! hash's fields sorted, a sorted set's members in order with their scores as the
//! server writes them, a list, a stream's entries) and its `PTTL`.
//!
//! Replies compare exactly. Errors: what a server adds around an error raised inside a
//! script is taken off first (Redis 7 appends where the script stopped: " script:
//! <sha>, on @user_script:<line>."; Redis 6.2 wraps the message: "Error running script
//! (call to f_<sha>): @user_script:<line>: ..."; the model gives the message alone);
//! then against Redis 7.0, whose wording the model copies, the message must be the
//! same, and against the other builds, which word some errors their own way, the kind
//! (the first word; `ERR` for a Lua runtime error).
//!
//! Against every build of `$FENCELOCK_TEST_SERVERS` (default: Redis 6.2, Redis 7 and
//! Valkey 9.1; `scripts/servers` fetches the first and the last). On Redis 6.2, scripts
//! with a `#!lua` line and `SPUBLISH` are left out (6.2 has neither).
//!
//! Seeded: `MODEL_SEED=<n>` replays a run (default 2: CI runs one known run);
//! `MODEL_CASES` and `MODEL_STEPS` size it. A
//! failure prints the seed and the shortest sequence found that still fails.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use model::keyspace::{Reply, Server, format_double};
use model::lua::eval;
use model::scripts::Scripts;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use testkit::{RedisServer, ServerBuild, ServerClock};

const KEYS: [&str; 4] = ["k1", "k2", "k3", "k4"];
/// Arguments of every kind: counts and ttls, flags, tokens, the wildcard, channel
/// names, a token past 2^53, and text no number parse takes. Floats are dyadic, so
/// that every build writes them alike (Valkey writes the shortest form, Redis 17
/// digits).
const ARGS: [&str; 24] = [
    "0",
    "1",
    "1",
    "2",
    "3",
    "100",
    "1000",
    "1000",
    "2500",
    "-1",
    "",
    "t1",
    "t2",
    "*",
    "ch",
    "x",
    "1.5",
    "abc",
    "-0",
    "01",
    "1800000000000000",
    "18000000000000000000",
    "+inf",
    "(2",
];
const CLOCK_STEPS_US: [i64; 9] = [
    1, 999, 1_000, 2_000, 100_000, 999_000, 1_000_000, 1_001_000, 2_500_000,
];

/// One step of a case.
#[derive(Clone, Debug)]
enum Step {
    /// A command, as sent.
    Command(Vec<String>),
    /// A script by name, with its keys and arguments (sent with `EVAL`).
    Script {
        name: String,
        keys: Vec<String>,
        argv: Vec<String>,
    },
    /// Both clocks move by this many µs.
    Clock(i64),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Command(args) => write!(f, "{}", args.join(" ")),
            Step::Script { name, keys, argv } => {
                write!(
                    f,
                    "EVAL <{name}> {} {} {}",
                    keys.len(),
                    keys.join(" "),
                    quoted(argv)
                )
            }
            Step::Clock(us) => write!(f, "(clock +{us} µs)"),
        }
    }
}

fn quoted(items: &[String]) -> String {
    items
        .iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a build can run.
struct Dialect {
    shebang: bool,
    spublish: bool,
    /// Redis 7.0, whose wording of errors the model copies.
    exact_errors: bool,
    /// Valkey: its clock is the wall clock read at the start of an event loop turn
    /// plus the processor's counter since (its log says "monotonic clock: X86 TSC"),
    /// which no shim stops, so a frozen clock still moves there, by some hundred µs
    /// and, on a loaded machine, by ms. Against it numbers compare within a
    /// tolerance ([`close_numbers`]), the only build where they do.
    drifts: bool,
}

/// Whether two numbers agree on a drifting build: equal, or both at least 100 (a
/// time, a TTL; never a reply code or a count the scripts make) and within 10 ms, or
/// 10,000 µs for µs-scale values (16 digits).
fn close_numbers(a: i128, b: i128) -> bool {
    let tolerance = if a.abs().max(b.abs()) >= 1_000_000_000_000_000 {
        10_000
    } else {
        10
    };
    a == b || (a.abs() >= 100 && b.abs() >= 100 && a.abs_diff(b) <= tolerance)
}

/// A real server on a frozen clock, reset to the same start for every case.
struct Real {
    server: RedisServer,
    clock: ServerClock,
    start: Duration,
    run_id: String,
    started_us: i64,
    dialect: Dialect,
}

impl Real {
    fn start(build: &ServerBuild) -> Real {
        let clock = ServerClock::new().expect("cc builds the clock shim");
        let server = RedisServer::builder()
            .server(build.clone())
            .clock(&clock)
            .start();
        // Now; a µs part that is not zero (TIME's second half exercised) but where the
        // clock drifts (below).
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let start = Duration::from_secs(now.as_secs() + 10);
        clock.freeze(start);
        let run_id = server
            .info_field("server", "run_id")
            .expect("INFO has run_id");
        let version = server
            .info_field("server", "redis_version")
            .unwrap_or_default();
        let valkey = server.info_field("server", "valkey_version").is_some();
        let six = version.starts_with("6.") && !valkey;
        let start = if valkey {
            start
        } else {
            start + Duration::from_micros(123_457)
        };
        clock.freeze(start);
        let mut real = Real {
            server,
            clock,
            start,
            run_id,
            started_us: 0,
            dialect: Dialect {
                shebang: !six,
                spublish: !six,
                exact_errors: version.starts_with("7.0") && !valkey,
                drifts: valkey,
            },
        };
        real.reset();
        let uptime: i64 = real
            .server
            .info_field("server", "uptime_in_seconds")
            .and_then(|u| u.parse().ok())
            .expect("INFO has uptime_in_seconds");
        real.started_us = (i64::try_from(start.as_secs()).unwrap() - uptime) * 1_000_000;
        real
    }

    fn reset(&mut self) {
        self.server.cmd(&["FLUSHALL"]);
        self.clock.freeze(self.start);
        if self.dialect.drifts {
            self.await_clock();
        }
    }

    fn model(&self) -> Server {
        let now = i64::try_from(self.start.as_micros()).unwrap();
        let mut server = Server::new(now, self.run_id.clone());
        server.started_us = self.started_us;
        server
    }

    fn run(&self, scripts: &Scripts, step: &Step) -> Reply {
        match step {
            Step::Command(args) => self.cmd(args),
            Step::Script { name, keys, argv } => {
                let mut args = vec!["EVAL".to_owned(), scripts.get(name).to_owned()];
                args.push(keys.len().to_string());
                args.extend(keys.iter().cloned());
                args.extend(argv.iter().cloned());
                self.cmd(&args)
            }
            Step::Clock(us) => {
                self.clock.step_us(*us);
                if self.dialect.drifts {
                    self.await_clock();
                }
                Reply::Status("OK".into())
            }
        }
    }

    /// Waits (bounded) until a drifting build reads its stepped clock: it rereads the
    /// wall clock only now and then.
    fn await_clock(&self) {
        let wanted = self.clock.frozen_at().expect("frozen");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.server.server_time().abs_diff(wanted) > Duration::from_millis(1) {
            assert!(
                std::time::Instant::now() < deadline,
                "the server never read its stepped clock"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn cmd(&self, args: &[String]) -> Reply {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.server.cmd(&args)
    }
}

fn run_model(model: &mut Server, scripts: &Scripts, step: &Step) -> Reply {
    let bytes = |items: &[String]| -> Vec<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    };
    match step {
        Step::Command(args) => model.call(&bytes(args)),
        Step::Script { name, keys, argv } => {
            eval(model, scripts.get(name), &bytes(keys), &bytes(argv))
        }
        Step::Clock(us) => {
            model.advance_us(*us);
            Reply::Status("OK".into())
        }
    }
}

/// A key as compared: type, value, PTTL.
type KeyState = (String, Reply, i64);

/// Every live key's state, read with commands (the same reads on both sides).
fn snapshot(
    names: Vec<String>,
    mut call: impl FnMut(&[&str]) -> Reply,
) -> BTreeMap<String, KeyState> {
    let mut out = BTreeMap::new();
    for name in names {
        let kind = call(&["TYPE", &name]).as_str().unwrap_or("?").to_owned();
        let value = match kind.as_str() {
            "string" => call(&["GET", &name]),
            "hash" => {
                let all = call(&["HGETALL", &name]);
                let mut pairs: Vec<(Reply, Reply)> = all
                    .as_array()
                    .unwrap_or(&[])
                    .chunks(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect();
                pairs.sort_by_key(|(f, _)| f.as_bytes().map(<[u8]>::to_vec));
                Reply::Array(Some(pairs.into_iter().flat_map(|(f, v)| [f, v]).collect()))
            }
            "zset" => call(&["ZRANGE", &name, "0", "-1", "WITHSCORES"]),
            "list" => call(&["LRANGE", &name, "0", "-1"]),
            "stream" => call(&["XRANGE", &name, "-", "+"]),
            _ => Reply::Bulk(None),
        };
        let pttl = call(&["PTTL", &name]).as_int().unwrap_or(-3);
        out.insert(name, (kind, value, pttl));
    }
    out
}

/// An error a script raised, as the model words it: Redis 7's without where the script
/// stopped (" script: <sha>, on @user_script:<line>."), Redis 6.2's unwrapped
/// ("ERR Error running script (call to f_<sha>): @user_script:<line>: <message>", a Lua
/// runtime error's message with "ERR " in front). Any other error as it is.
fn unwrapped(message: &str) -> String {
    if let Some(at) = message.find(" script: ") {
        return message[..at].to_owned();
    }
    if let Some(rest) = message.strip_prefix("ERR Error running script") {
        let inner = rest
            .split_once("@user_script:")
            .and_then(|(_, r)| r.split_once(": "))
            .map_or(rest, |(_, m)| m);
        let inner = inner.trim_end();
        return if inner.starts_with("user_script:") {
            format!("ERR {inner}")
        } else {
            inner.to_owned()
        };
    }
    message.to_owned()
}

/// An error's kind: its first word, `ERR` for a Lua runtime error however worded.
fn kind(message: &str) -> &str {
    let first = message.split_whitespace().next().unwrap_or("");
    if first.contains("user_script") {
        "ERR"
    } else {
        first
    }
}

/// Whether two replies agree. Errors: the model words them as Redis 7.0 does, so
/// against it they compare exactly (`exact_errors`); other builds word some in their
/// own way (Redis 6.2: "ERR invalid expire time in set", "Lua redis() command
/// arguments must be strings or integers"), so there they compare by kind.
fn same(model: &Reply, real: &Reply, dialect: &Dialect) -> bool {
    match (model, real) {
        (Reply::Int(m), Reply::Int(r)) if dialect.drifts => close_numbers((*m).into(), (*r).into()),
        (Reply::Bulk(Some(m)), Reply::Bulk(Some(r))) if dialect.drifts => {
            close(&String::from_utf8_lossy(m), &String::from_utf8_lossy(r))
        }
        (Reply::Error(m), Reply::Error(r)) => {
            let r = unwrapped(r);
            if dialect.exact_errors {
                *m == r
            } else {
                kind(m) == kind(&r)
            }
        }
        (Reply::Array(Some(m)), Reply::Array(Some(r))) => {
            m.len() == r.len() && m.iter().zip(r).all(|(m, r)| same(m, r, dialect))
        }
        _ => model == real,
    }
}

/// Whether two texts are the same but for numbers that agree by [`close_numbers`].
fn close(model: &str, real: &str) -> bool {
    fn runs(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut start = 0;
        let digit = |i: usize| text.as_bytes()[i].is_ascii_digit();
        for i in 1..text.len() {
            if digit(i) != digit(i - 1) {
                out.push(&text[start..i]);
                start = i;
            }
        }
        out.push(&text[start..]);
        out
    }
    // A double: Valkey writes the shortest text that reads back (18000001795916022000),
    // Redis C's %.17g (1.800000179591602e+19).
    if let (Ok(a), Ok(b)) = (model.parse::<f64>(), real.parse::<f64>())
        && (a - b).abs() <= 10f64.max(a.abs() * 1e-12)
    {
        return true;
    }
    let (m, r) = (runs(model), runs(real));
    m.len() == r.len()
        && m.iter().zip(&r).all(|(mt, rt)| {
            mt == rt
                || matches!((mt.parse::<i128>(), rt.parse::<i128>()), (Ok(a), Ok(b)) if close_numbers(a, b))
        })
}

/// Where a sequence first differs.
struct Mismatch {
    at: usize,
    what: String,
}

/// Script calls run, and those that answered without an error (how much of the
/// scripts' paths the random arguments reach).
static SCRIPT_CALLS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

fn run_case(real: &mut Real, scripts: &Scripts, steps: &[Step]) -> Result<(), Mismatch> {
    real.reset();
    let mut model = real.model();
    for (at, step) in steps.iter().enumerate() {
        let mine = run_model(&mut model, scripts, step);
        if matches!(step, Step::Script { .. }) {
            SCRIPT_CALLS[0].fetch_add(1, Ordering::Relaxed);
            if !mine.is_error() {
                SCRIPT_CALLS[1].fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut theirs = real.run(scripts, step);
        if real.dialect.drifts && matches!(step, Step::Command(c) if c[0] == "TIME") {
            // TIME's µs, on a drifting build: only the model's is exact.
            if let (Reply::Array(Some(m)), Reply::Array(Some(r))) = (&mine, &mut theirs) {
                r[1] = m[1].clone();
            }
        }
        if !same(&mine, &theirs, &real.dialect) {
            return Err(Mismatch {
                at,
                what: format!("reply differs:\n  model: {mine}\n  real:  {theirs}"),
            });
        }
        let names = model
            .entries()
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect();
        let mine = snapshot(names, |args| {
            model.call(
                &args
                    .iter()
                    .map(|a| a.as_bytes().to_vec())
                    .collect::<Vec<_>>(),
            )
        });
        let mut real_names: Vec<String> = real
            .server
            .cmd(&["KEYS", "*"])
            .as_array()
            .unwrap_or(&[])
            .iter()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect();
        real_names.sort();
        let theirs = snapshot(real_names, |args| real.server.cmd(args));
        let (mine, theirs) = if real.dialect.drifts {
            (settled(mine), settled(theirs))
        } else {
            (mine, theirs)
        };
        let agree = mine.len() == theirs.len()
            && mine
                .iter()
                .zip(&theirs)
                .all(|((mk, (mt, mv, mp)), (rk, (rt, rv, rp)))| {
                    mk == rk
                        && mt == rt
                        && same(mv, rv, &real.dialect)
                        && (mp == rp || (real.dialect.drifts && mp.abs_diff(*rp) <= 10))
                });
        if !agree {
            return Err(Mismatch {
                at,
                what: format!(
                    "keyspace differs:\n  model: {}\n  real:  {}",
                    show(&mine),
                    show(&theirs)
                ),
            });
        }
    }
    Ok(())
}

/// The keys not at the edge of their expiry (more than 10 ms left, or none): on a
/// drifting build a key with a few ms left may be gone on one side only.
fn settled(keys: BTreeMap<String, KeyState>) -> BTreeMap<String, KeyState> {
    keys.into_iter()
        .filter(|(_, (_, _, pttl))| !(0..=10).contains(pttl))
        .collect()
}

fn show(keys: &BTreeMap<String, KeyState>) -> String {
    let items: Vec<String> = keys
        .iter()
        .map(|(k, (kind, value, pttl))| format!("{k}: {kind} {value} pttl {pttl}"))
        .collect();
    format!("{{{}}}", items.join("; "))
}

/// Random arguments for `fence/write.lua` with each write's argument count (the
/// third item of a write, read by `tonumber`) between -2 and 10,000: the script loops
/// that many times, so a count of 1.8e15 or `+inf` has it loop for hours, on a real
/// server too (BUSY until `SCRIPT KILL`; MODEL_SEED 1 and 8 drew them). The library
/// never sends such a count: it sends exactly the number of arguments that follow
/// (`scripts::fenced_write`), and a count of -3 or less steps the script's walk back
/// onto the same write forever. Ill-formed counts stay (text, a fraction, -1, more than
/// the arguments given): the script must answer those as a real server does.
fn bounded_counts(mut argv: Vec<String>) -> Vec<String> {
    // The script's walk: a write at ARGV[i] (from 2), its count at ARGV[i + 2], the
    // next write at i + 3 + count (a negative count steps back; a fraction indexes
    // nothing after it, and the script stops there with an error).
    let mut at: i64 = 2;
    while at >= 1 && at + 2 <= argv.len() as i64 {
        let slot = (at + 1) as usize; // ARGV[at + 2], 0-based
        let Ok(mut count) = argv[slot].trim().parse::<f64>() else {
            break; // not a number: the script stops there with an error
        };
        // NaN, past 10,000, or low enough to step back onto itself (-3: a loop
        // forever).
        if !(-2.0..=10_000.0).contains(&count) {
            argv[slot] = "1".into();
            count = 1.0;
        }
        if count.fract() != 0.0 {
            break;
        }
        at += 3 + count as i64;
    }
    argv
}

/// The highest literal `NAME[n]` in a script (`KEYS`, `ARGV`).
fn highest_index(text: &str, name: &str) -> usize {
    let pattern = format!("{name}[");
    text.match_indices(&pattern)
        .filter_map(|(at, _)| {
            let rest = &text[at + pattern.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            (rest[digits.len()..].starts_with(']'))
                .then(|| digits.parse().ok())
                .flatten()
        })
        .max()
        .unwrap_or(0)
}

struct Generator<'a> {
    rng: StdRng,
    scripts: Vec<(&'a str, &'a str)>,
    dialect: &'a Dialect,
}

impl Generator<'_> {
    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items.choose(&mut self.rng).expect("not empty").clone()
    }

    fn key(&mut self) -> String {
        self.pick(&KEYS).to_owned()
    }

    fn arg(&mut self) -> String {
        loop {
            let arg = self.pick(&ARGS);
            // Valkey writes a script's number -0 as "0" (the shortest form), Redis as
            // "-0", which no integer parse takes: a difference the model does not copy.
            if !(self.dialect.drifts && arg == "-0") {
                return arg.to_owned();
            }
        }
    }

    fn step(&mut self) -> Step {
        match self.rng.random_range(0..10) {
            0..=1 => {
                let us = self.pick(&CLOCK_STEPS_US);
                // Whole ms where the clock drifts, so that its ms stay exact.
                Step::Clock(if self.dialect.drifts {
                    us.max(1000) / 1000 * 1000
                } else {
                    us
                })
            }
            2..=5 => self.script(),
            _ => Step::Command(self.command()),
        }
    }

    fn script(&mut self) -> Step {
        let (name, text) = self.pick(&self.scripts.clone());
        let n_keys = highest_index(text, "KEYS").max(1);
        let n_argv = highest_index(text, "ARGV");
        let (n_keys, n_argv) = if self.rng.random_bool(0.8) {
            (n_keys, n_argv)
        } else {
            (
                self.rng.random_range(0..=n_keys + 2),
                self.rng.random_range(0..=n_argv + 3),
            )
        };
        let keys = (0..n_keys).map(|_| self.key()).collect();
        let argv = if name.ends_with("fence/write.lua") {
            if self.rng.random_bool(0.7) {
                self.fenced_writes(n_keys)
            } else {
                bounded_counts((0..n_argv).map(|_| self.arg()).collect())
            }
        } else {
            (0..n_argv).map(|_| self.arg()).collect()
        };
        Step::Script {
            name: name.to_owned(),
            keys,
            argv,
        }
    }

    /// A token and well-formed writes for `fence/write.lua`.
    fn fenced_writes(&mut self, n_keys: usize) -> Vec<String> {
        let mut argv = vec![
            self.pick(&["1", "5", "17", "0", "18000000000000000000"])
                .to_owned(),
        ];
        for _ in 0..self.rng.random_range(0..4) {
            let index = self.rng.random_range(1..=n_keys.max(1)).to_string();
            let (command, args): (&str, Vec<String>) = match self.rng.random_range(0..8) {
                0 => ("SET", vec![self.arg()]),
                1 => ("DEL", vec![]),
                2 => (
                    "INCRBY",
                    vec![
                        self.pick(&["1", "-3", "x", "4611686018427387904"])
                            .to_owned(),
                    ],
                ),
                3 => ("HSET", vec!["f".into(), self.arg()]),
                4 => ("RPUSH", vec![self.arg()]),
                5 => ("LPUSH", vec![self.arg()]),
                6 => ("XADD", vec!["f".into(), self.arg()]),
                _ => ("PEXPIRE", vec![self.pick(&["1", "1000"]).to_owned()]),
            };
            argv.extend([command.to_owned(), index, args.len().to_string()]);
            argv.extend(args);
        }
        argv
    }

    fn command(&mut self) -> Vec<String> {
        let k = self.key();
        let mut c: Vec<String> = match self.rng.random_range(0..32) {
            0 => vec!["GET".into(), k],
            1 | 2 => {
                let mut c = vec!["SET".into(), k, self.arg()];
                if self.rng.random_bool(0.5) {
                    c.push(self.pick(&["NX", "XX"]).into());
                }
                match self.rng.random_range(0..4) {
                    0 => c.extend(["PX".into(), self.arg()]),
                    1 => c.extend(["EX".into(), self.pick(&["1", "2", "0", "x"]).into()]),
                    2 => c.push("KEEPTTL".into()),
                    _ => {}
                }
                if self.rng.random_bool(0.2) && !c.iter().any(|a| a == "NX") {
                    c.push("GET".into());
                }
                c
            }
            3 => vec!["DEL".into(), k, self.key()],
            4 => vec!["EXISTS".into(), k, self.key()],
            5 => vec!["INCR".into(), k],
            6 => vec!["INCRBY".into(), k, self.arg()],
            7 => vec!["PEXPIRE".into(), k, self.arg()],
            8 => vec!["PTTL".into(), k],
            9 => vec!["TYPE".into(), k],
            10 | 11 => vec![
                "HSET".into(),
                k,
                self.pick(&["owner", "fence", "f"]).into(),
                self.arg(),
            ],
            12 => vec!["HGET".into(), k, self.pick(&["owner", "fence", "f"]).into()],
            13 => vec!["HDEL".into(), k, self.pick(&["owner", "fence", "f"]).into()],
            14 => vec![self.pick(&["HLEN", "ZCARD", "LLEN"]).into(), k],
            15 => vec!["HEXISTS".into(), k, "f".into()],
            16 | 17 => {
                let mut c = vec!["ZADD".into(), k];
                if self.rng.random_bool(0.3) {
                    c.push(self.pick(&["NX", "XX"]).into());
                }
                c.extend([
                    self.pick(&["1", "2.5", "-inf", "+inf", "100", "x"]).into(),
                    self.pick(&["a", "b", "rwlock", "t1"]).into(),
                ]);
                c
            }
            18 => vec![
                "ZREM".into(),
                k,
                self.pick(&["a", "b", "rwlock", "t1"]).into(),
            ],
            19 => vec!["ZSCORE".into(), k, self.pick(&["a", "b", "rwlock"]).into()],
            20 => {
                let mut c = vec![
                    "ZRANGE".into(),
                    k,
                    self.pick(&["0", "-1", "1", "x"]).into(),
                    self.pick(&["0", "-1", "5"]).into(),
                ];
                if self.rng.random_bool(0.5) {
                    c.push("WITHSCORES".into());
                }
                c
            }
            21 | 22 => {
                let command = self.pick(&["ZRANGEBYSCORE", "ZCOUNT", "ZREMRANGEBYSCORE"]);
                let mut c = vec![
                    command.into(),
                    k,
                    self.pick(&["-inf", "(1", "1", "x"]).into(),
                    self.pick(&["+inf", "(inf", "2.5", "100"]).into(),
                ];
                if command == "ZRANGEBYSCORE" && self.rng.random_bool(0.5) {
                    c.push("WITHSCORES".into());
                    if self.rng.random_bool(0.5) {
                        c.extend([
                            "LIMIT".into(),
                            "0".into(),
                            self.pick(&["1", "-1", "0"]).into(),
                        ]);
                    }
                }
                c
            }
            23 => vec![
                self.pick(&["RPUSH", "LPUSH"]).into(),
                k,
                self.pick(&["t1", "t2", "a"]).into(),
            ],
            24 => vec![
                "LREM".into(),
                k,
                self.pick(&["0", "1", "-1"]).into(),
                self.pick(&["t1", "t2"]).into(),
            ],
            25 => vec!["LINDEX".into(), k, self.pick(&["0", "-1", "1", "x"]).into()],
            26 => vec![
                "LRANGE".into(),
                k,
                "0".into(),
                self.pick(&["-1", "0"]).into(),
            ],
            27 => vec!["LPOS".into(), k, self.pick(&["t1", "t2"]).into()],
            28 => vec!["XADD".into(), k, "*".into(), "f".into(), self.arg()],
            29 => vec!["TIME".into()],
            30 if self.dialect.spublish && self.rng.random_bool(0.5) => {
                vec!["SPUBLISH".into(), "ch".into(), self.arg()]
            }
            30 => vec!["PUBLISH".into(), "ch".into(), self.arg()],
            _ => vec![
                "PEXPIREAT".into(),
                k,
                self.pick(&["1", "1800000000000"]).into(),
            ],
        };
        // Now and then a command with an argument too few (its error compared).
        if self.rng.random_range(0..40) == 0 && c.len() > 1 {
            c.pop();
        }
        c
    }
}

/// `steps` cut down, one step at a time, while they still fail.
fn shortest(real: &mut Real, scripts: &Scripts, mut steps: Vec<Step>) -> (Vec<Step>, Mismatch) {
    let mut failure = run_case(real, scripts, &steps).expect_err("it failed before");
    steps.truncate(failure.at + 1);
    let mut i = 0;
    while i < steps.len() {
        let mut fewer = steps.clone();
        fewer.remove(i);
        match run_case(real, scripts, &fewer) {
            Err(f) => {
                fewer.truncate(f.at + 1);
                steps = fewer;
                failure = f;
            }
            Ok(()) => i += 1,
        }
    }
    (steps, failure)
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn differential(build: &ServerBuild) {
    // A fixed seed by default, so that a run in CI is one known run; MODEL_SEED explores
    // others (1 to 10 pass; a script that loops fails its case by name, lua.rs).
    let seed = env_number("MODEL_SEED", 2);
    let cases = env_number("MODEL_CASES", 200);
    let steps_per_case = env_number("MODEL_STEPS", 30) as usize;
    let mut real = Real::start(build);
    let shipped = Scripts::shipped();
    let scripts: Vec<(&str, &str)> = shipped
        .iter()
        .filter(|(_, text)| real.dialect.shebang || !text.starts_with("#!"))
        .filter(|(_, text)| real.dialect.spublish || !text.contains("'SPUBLISH'"))
        .collect();
    assert!(
        scripts.len() > 20,
        "the scripts are found: {}",
        scripts.len()
    );
    let n_scripts = scripts.len();
    let mut generator = Generator {
        rng: StdRng::seed_from_u64(seed),
        scripts,
        dialect: &real.dialect,
    };
    let mut all = Vec::new();
    for _ in 0..cases {
        all.push(
            (0..steps_per_case)
                .map(|_| generator.step())
                .collect::<Vec<_>>(),
        );
    }
    drop(generator);
    for (case, steps) in all.into_iter().enumerate() {
        if run_case(&mut real, &shipped, &steps).is_err() {
            let (steps, failure) = shortest(&mut real, &shipped, steps);
            let listing: Vec<String> = steps
                .iter()
                .enumerate()
                .map(|(i, s)| format!("  {i}: {s}"))
                .collect();
            panic!(
                "{}: the model and the server differ (MODEL_SEED={seed}, case {case}); the \
                 shortest failing sequence ({} steps):\n{}\nat step {}: {}",
                build.name(),
                steps.len(),
                listing.join("\n"),
                failure.at,
                failure.what,
            );
        }
    }
    eprintln!(
        "{}: {cases} cases of {steps_per_case} steps agree, over {n_scripts} scripts, {} script \
         calls so far of which {} answered without an error (MODEL_SEED={seed})",
        build.name(),
        SCRIPT_CALLS[0].load(Ordering::Relaxed),
        SCRIPT_CALLS[1].load(Ordering::Relaxed),
    );
}

#[test]
fn the_keyspace_and_the_scripts_answer_as_real_servers_do() {
    for build in ServerBuild::from_env() {
        differential(&build);
    }
}

#[test]
fn doubles_in_replies_are_the_servers_text() {
    // The one place the model writes a double itself; a wrong form shows up in every
    // sorted set the differential test reads.
    assert_eq!(format_double(1_800_000_000_123.0), "1800000000123");
}
