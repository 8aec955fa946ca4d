//! Where Redis's work per lock goes: one uncontended acquire + release of each kind of
//! lock, and of its peers, broken down inside redis-server.
//!
//! Two measurements of the same cycles, each on a server of its own:
//! - **Instructions**: a Redis 7.0.15 built with its symbols from Debian's source
//!   (`scripts/servers --symbols`) runs under callgrind; its counters are zeroed after
//!   a warm-up and dumped after [`CYCLES`] cycles, and the instructions of each part of
//!   the server are read off the dump (inclusive costs of the functions that bound the
//!   part, [`Part`]). Instructions, not seconds: repeatable whatever else the machine
//!   does, so two builds of fencelock compare exactly.
//! - **Time**: on the server the other sections use (Debian's 7.0), `INFO commandstats`
//!   (microseconds per command, a script's inner commands counted too) and `SLOWLOG`
//!   at 0 (every script's own run time), over the same cycles.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::latency::{Cycler, RAW_RELEASE};
use crate::plan::Plan;
use crate::report::thousands;

/// Measured cycles per kind of lock (after a warm-up of [`WARMUP`]); under callgrind a
/// cycle costs the server about a millisecond.
const CYCLES: usize = 1000;
const WARMUP: usize = 50;

/// The kinds of lock measured, and their peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Who {
    Plain,
    Fair,
    Semaphore,
    Read,
    Rslock,
    Raw,
}

impl Who {
    const ALL: [Who; 6] = [
        Who::Plain,
        Who::Fair,
        Who::Semaphore,
        Who::Read,
        Who::Rslock,
        Who::Raw,
    ];

    fn label(self) -> &'static str {
        match self {
            Who::Plain => "fencelock",
            Who::Fair => "fencelock fair()",
            Who::Semaphore => "fencelock semaphore (4 permits)",
            Who::Read => "fencelock read lock",
            Who::Rslock => "rslock",
            Who::Raw => "redis-rs alone",
        }
    }

    async fn cycler(self, url: &str) -> Result<Cycler, String> {
        let name = "cost";
        let fence = || async {
            fencelock::Client::connect(url)
                .await
                .map_err(|e| format!("connect: {e}"))
        };
        Ok(match self {
            Who::Plain => Cycler::Fence(fence().await?.lock(name)),
            Who::Fair => Cycler::Fence(fence().await?.lock(name).fair()),
            Who::Semaphore => Cycler::Semaphore(fence().await?.semaphore(name, 4)),
            Who::Read => Cycler::Read(fence().await?.read_lock(name)),
            Who::Rslock => {
                Cycler::Rslock(rslock::LockManager::new(vec![url.to_owned()]), name.into())
            }
            Who::Raw => {
                let client = redis::Client::open(url).map_err(|e| e.to_string())?;
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                Cycler::Raw(conn, redis::Script::new(RAW_RELEASE), name.into())
            }
        })
    }
}

/// A part of redis-server's work, bounded by functions of its source: the part's
/// instructions are the inclusive cost of `plus` less that of `minus`.
struct Part {
    label: &'static str,
    what: &'static str,
    plus: &'static [&'static str],
    minus: &'static [&'static str],
}

/// The parts, in the order of a command's way through the server. Functions of Redis
/// 7.0.15 (`src/server.c`, `eval.c`, `script_lua.c`, `script.c`) and its Lua 5.1.
const PARTS: &[Part] = &[
    Part {
        label: "network and parsing",
        what: "reading and parsing the commands, writing the replies, the event loop",
        plus: &["main"],
        minus: &["call"],
    },
    Part {
        label: "commands sent directly",
        what: "commands the client sends itself, not a script (rslock's SET NX)",
        plus: &["call"],
        minus: &["evalGenericCommand"],
    },
    Part {
        label: "script start and end",
        what: "finding the script, the KEYS and ARGV tables, the reply, the GC step",
        plus: &["evalGenericCommand"],
        minus: &[
            "lua_pcall",
            "luaCreateArray",
            "lua_gc",
            "luaReplyToRedisReply",
        ],
    },
    Part {
        label: "KEYS and ARGV",
        what: "the tables of the script's keys and arguments",
        plus: &["luaCreateArray"],
        minus: &[],
    },
    Part {
        label: "Lua GC step",
        what: "the garbage collector's step after each script",
        plus: &["lua_gc"],
        minus: &[],
    },
    Part {
        label: "script reply",
        what: "turning the script's return value into a reply",
        plus: &["luaReplyToRedisReply"],
        minus: &[],
    },
    Part {
        label: "Lua code",
        what: "the script's own Lua: function definitions (closures), string and table work",
        plus: &["lua_pcall"],
        minus: &["luaRedisGenericCommand"],
    },
    Part {
        label: "redis.call overhead",
        what: "each redis.call/pcall less the command itself: arguments in, reply back to Lua",
        plus: &["luaRedisGenericCommand"],
        minus: &["call'2"],
    },
    Part {
        label: "commands in scripts",
        what: "the commands the scripts run (each listed below)",
        plus: &["call'2"],
        minus: &[],
    },
];

/// Command implementations whose instructions are listed one by one (those run from a
/// script, and the direct ones).
const COMMANDS: &[(&str, &str)] = &[
    ("setCommand", "SET"),
    ("getCommand", "GET"),
    ("delCommand", "DEL"),
    ("timeCommand", "TIME"),
    ("pttlCommand", "PTTL"),
    ("zrangeCommand", "ZRANGE"),
    ("zaddCommand", "ZADD"),
    ("zremCommand", "ZREM"),
    ("zcardCommand", "ZCARD"),
    ("zscoreCommand", "ZSCORE"),
    ("zremrangebyscoreCommand", "ZREMRANGEBYSCORE"),
    ("existsCommand", "EXISTS"),
    ("typeCommand", "TYPE"),
    ("publishCommand", "PUBLISH"),
    ("pexpireCommand", "PEXPIRE"),
    ("hgetCommand", "HGET"),
    ("hsetCommand", "HSET"),
    ("incrCommand", "INCR"),
];

/// One kind's figures, per acquire + release.
pub(crate) struct Row {
    who: Who,
    /// Instructions per cycle: in all, each part, each command (with its calls per
    /// cycle).
    total: Result<f64, String>,
    parts: Vec<f64>,
    commands: Vec<(&'static str, f64, f64)>,
    /// Microseconds per cycle in commandstats (EVALSHA and direct commands), and the
    /// scripts' median run times from SLOWLOG (by file, or a peer script's hash).
    usec: Result<(f64, Vec<(String, f64)>), String>,
}

/// The section.
#[derive(Default)]
pub(crate) struct Cost {
    rows: Vec<Row>,
    error: Option<String>,
    server: String,
}

impl Cost {
    pub(crate) fn failed(&self) -> bool {
        self.error.is_some()
            || self
                .rows
                .iter()
                .any(|r| r.total.is_err() || r.usec.is_err())
    }
}

/// The Redis build with symbols (`scripts/servers --symbols` puts it there).
fn symbols_build() -> Result<PathBuf, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = target.join("servers/redis-7.0.15-symbols/redis-server");
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: run scripts/servers --symbols (it builds Redis 7.0.15 from \
             Debian's source)",
            path.display()
        ))
    }
}

/// A redis-server under callgrind, on a port of its own; killed on drop.
struct Profiled {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Profiled {
    fn start(binary: &Path) -> Result<Profiled, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = testkit::free_port();
        let child = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!(
                "--callgrind-out-file={}/callgrind.out",
                dir.path().display()
            ))
            .arg(binary)
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("valgrind: {e} (apt-get install valgrind)"))?;
        let server = Profiled { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server under callgrind did not listen within 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn control(&self, flag: &str) -> Result<(), String> {
        let out = Command::new("callgrind_control")
            .arg(flag)
            .arg(self.child.id().to_string())
            .output()
            .map_err(|e| format!("callgrind_control: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "callgrind_control {flag}: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// The inclusive instructions of every function in the dump taken now.
    fn dump(&self) -> Result<Vec<(String, u64)>, String> {
        self.control("-d")?;
        let dump = std::fs::read_dir(self.dir.path())
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with("callgrind.out.1"))
            .ok_or("callgrind wrote no dump")?;
        let out = Command::new("callgrind_annotate")
            .args(["--inclusive=yes", "--threshold=100"])
            .arg(&dump)
            .output()
            .map_err(|e| format!("callgrind_annotate: {e}"))?;
        Ok(inclusive_costs(&String::from_utf8_lossy(&out.stdout)))
    }
}

impl Drop for Profiled {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `callgrind_annotate --inclusive=yes` lines (`1,234 (5.6%)  file:function [object]`)
/// as (function, instructions); a function listed twice (by its file and by its object)
/// keeps its larger figure.
fn inclusive_costs(text: &str) -> Vec<(String, u64)> {
    let mut costs: Vec<(String, u64)> = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        let Some((count, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(count) = count.replace(',', "").parse::<u64>() else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix('(') else {
            continue;
        };
        let Some((_, location)) = rest.split_once(')') else {
            continue;
        };
        let location = location.trim();
        let location = location.split(" [").next().unwrap_or(location);
        let function = location.rsplit(':').next().unwrap_or(location).to_owned();
        match costs.iter_mut().find(|(f, _)| *f == function) {
            Some((_, c)) => *c = (*c).max(count),
            None => costs.push((function, count)),
        }
    }
    costs
}

fn cost_of(costs: &[(String, u64)], function: &str) -> u64 {
    costs
        .iter()
        .find(|(f, _)| f == function)
        .map_or(0, |(_, c)| *c)
}

/// Calls of `function` in the dump, from its `calls=` lines (callgrind's format: a
/// `cfn=` line names the function called, `calls=N` follows; a name is given once, with
/// its id, by the first `fn=` or `cfn=` line that mentions it).
fn calls_in(dump: &str, function: &str) -> u64 {
    let mut ids: Vec<&str> = Vec::new();
    let mut called: Option<&str> = None;
    let mut total = 0;
    for line in dump.lines() {
        let (is_call, rest) = match (line.strip_prefix("cfn="), line.strip_prefix("fn=")) {
            (Some(rest), _) => (true, rest),
            (None, Some(rest)) => (false, rest),
            (None, None) => {
                if let (Some(rest), Some(id)) = (line.strip_prefix("calls="), called.take())
                    && ids.contains(&id)
                {
                    total += rest
                        .split_whitespace()
                        .next()
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
                continue;
            }
        };
        let (id, name) = rest.split_once(' ').unwrap_or((rest, ""));
        if name == function && !ids.contains(&id) {
            ids.push(id);
        }
        called = is_call.then_some(id);
    }
    total
}

/// Runs the section: every kind of lock under callgrind, then on Debian's server.
pub(crate) async fn run(_plan: &Plan, server: &testkit::RedisServer) -> Cost {
    let binary = match symbols_build() {
        Ok(b) => b,
        Err(e) => {
            return Cost {
                error: Some(e),
                ..Cost::default()
            };
        }
    };
    let mut cost = Cost {
        server: format!(
            "instructions: Redis 7.0.15 built from Debian's source with symbols ({}), under \
             callgrind; time: {} with INFO commandstats and SLOWLOG at 0",
            binary.display(),
            crate::servers::redis_version(server)
        ),
        ..Cost::default()
    };
    for who in Who::ALL {
        eprintln!("cost: {} under callgrind", who.label());
        let instructions = instructions(who, &binary).await;
        eprintln!("cost: {} on {}", who.label(), server.url());
        let usec = timed(who, server).await;
        let (total, parts, commands) = match instructions {
            Ok((t, p, c)) => (Ok(t), p, c),
            Err(e) => (Err(e), Vec::new(), Vec::new()),
        };
        cost.rows.push(Row {
            who,
            total,
            parts,
            commands,
            usec,
        });
    }
    cost
}

type Instructions = (f64, Vec<f64>, Vec<(&'static str, f64, f64)>);

async fn instructions(who: Who, binary: &Path) -> Result<Instructions, String> {
    let server = Profiled::start(binary)?;
    let mut cycler = who.cycler(&server.url()).await?;
    // The first calls under callgrind (the scripts compiled, the server's code first
    // run) may outlast the client's call timeout on a loaded machine: the warm-up is
    // there to take them, and goes on past an error.
    for _ in 0..WARMUP {
        if let Err(e) = cycler.once().await {
            eprintln!("cost: {} warm-up: {e}", who.label());
        }
    }
    server.control("-z")?;
    for _ in 0..CYCLES {
        cycler.once().await?;
    }
    let costs = server.dump()?;
    let dump_path = std::fs::read_dir(server.dir.path())
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with("callgrind.out.1"))
        .ok_or("no dump")?;
    let dump = std::fs::read_to_string(dump_path).map_err(|e| e.to_string())?;
    drop(cycler);
    let n = CYCLES as f64;
    let total = cost_of(&costs, "main") as f64 / n;
    let parts = PARTS
        .iter()
        .map(|p| {
            let plus: u64 = p.plus.iter().map(|f| cost_of(&costs, f)).sum();
            let minus: u64 = p.minus.iter().map(|f| cost_of(&costs, f)).sum();
            plus.saturating_sub(minus) as f64 / n
        })
        .collect();
    let commands = COMMANDS
        .iter()
        .filter_map(|(f, name)| {
            let c = cost_of(&costs, f);
            (c > 0).then(|| (*name, c as f64 / n, calls_in(&dump, f) as f64 / n))
        })
        .collect();
    Ok((total, parts, commands))
}

/// The same cycles on Debian's server: commandstats and SLOWLOG at 0.
async fn timed(
    who: Who,
    server: &testkit::RedisServer,
) -> Result<(f64, Vec<(String, f64)>), String> {
    let cmd = |args: &[&str]| server.cmd(args);
    cmd(&["FLUSHALL"]);
    let mut cycler = who.cycler(&server.url()).await?;
    for _ in 0..WARMUP {
        cycler.once().await?;
    }
    cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    // Every command is logged, a script's inner ones too.
    cmd(&[
        "CONFIG",
        "SET",
        "slowlog-max-len",
        &(CYCLES * 40).to_string(),
    ]);
    cmd(&["SLOWLOG", "RESET"]);
    cmd(&["CONFIG", "RESETSTAT"]);
    for _ in 0..CYCLES {
        cycler.once().await?;
    }
    let stats = cmd(&["INFO", "commandstats"]);
    let slowlog = cmd(&["SLOWLOG", "GET", &(CYCLES * 40).to_string()]);
    cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "10000"]);
    drop(cycler);
    let stats = stats.as_str().unwrap_or_default().to_owned();
    // The client's own commands (scripts, and rslock's SET): what the cycle costs in
    // commandstats, scripts' inner commands inside their EVALSHA.
    let mut usec = 0.0;
    for line in stats.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let (name, fields) = rest.split_once(':').unwrap_or((rest, ""));
        let field = |k: &str| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(k))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        if matches!(name, "evalsha" | "eval")
            || matches!(who, Who::Rslock | Who::Raw) && name == "set"
        {
            usec += field("usec=");
        }
    }
    usec /= CYCLES as f64;
    // SLOWLOG entries: [id, time, duration_us, [args...], ...]; EVALSHA's args[1] is the
    // script's hash.
    let mut per_script: Vec<(String, Vec<f64>)> = Vec::new();
    for entry in slowlog.as_array().unwrap_or_default() {
        let Some(fields) = entry.as_array() else {
            continue;
        };
        let (Some(us), Some(args)) = (
            fields.get(2).and_then(|f| f.as_int()),
            fields.get(3).and_then(|f| f.as_array()),
        ) else {
            continue;
        };
        let name = args.first().and_then(|a| a.as_str()).unwrap_or_default();
        if !name.eq_ignore_ascii_case("evalsha") {
            continue;
        }
        let sha = args.get(1).and_then(|a| a.as_str()).unwrap_or("?");
        let sha = sha.get(..8).unwrap_or(sha).to_owned();
        match per_script.iter_mut().find(|(s, _)| *s == sha) {
            Some((_, v)) => v.push(us as f64),
            None => per_script.push((sha, vec![us as f64])),
        }
    }
    let medians = per_script
        .into_iter()
        .filter(|(_, v)| v.len() >= CYCLES / 2)
        .map(|(sha, mut v)| {
            v.sort_by(f64::total_cmp);
            (script_name(&sha), v[v.len() / 2])
        })
        .collect();
    Ok((usec, medians))
}

/// The file of the fencelock script whose hash starts with `sha` (as sent to a
/// standalone server), or the hash itself for a peer's script.
fn script_name(sha: &str) -> String {
    fencelock::lua_scripts()
        .find(|(_, source)| redis::Script::new(source).get_hash().starts_with(sha))
        .map_or_else(|| format!("`{sha}`"), |(name, _)| name.to_owned())
}

/// The section's markdown.
pub(crate) fn render(s: &mut String, c: &Cost) {
    let _ = writeln!(s, "## Where Redis's work per lock goes\n");
    if let Some(e) = &c.error {
        let _ = writeln!(s, "Not measured: {e}\n");
        return;
    }
    let _ = writeln!(
        s,
        "One uncontended acquire + release, {CYCLES} times after {WARMUP} for warm-up, one \
         round trip at a time, the same name each time. {}.\n",
        c.server
    );
    let rs = c
        .rows
        .iter()
        .find(|r| r.who == Who::Rslock)
        .and_then(|r| r.total.as_ref().ok().copied());
    let _ = write!(s, "| instructions per acquire + release |");
    for r in &c.rows {
        let _ = write!(s, " {} |", r.who.label());
    }
    let _ = write!(s, "\n|---|");
    for _ in &c.rows {
        let _ = write!(s, "---:|");
    }
    let _ = writeln!(s);
    for (i, p) in PARTS.iter().enumerate() {
        let _ = write!(s, "| {} ({}) |", p.label, p.what);
        for r in &c.rows {
            match r.parts.get(i) {
                Some(v) => {
                    let _ = write!(s, " {} |", thousands(v.round() as usize));
                }
                None => {
                    let _ = write!(s, " - |");
                }
            }
        }
        let _ = writeln!(s);
    }
    let _ = write!(s, "| **in all** |");
    for r in &c.rows {
        match &r.total {
            Ok(t) => {
                let ratio = rs
                    .map(|rs| format!(" ({:.2}x rslock)", t / rs))
                    .unwrap_or_default();
                let _ = write!(s, " **{}**{ratio} |", thousands(t.round() as usize));
            }
            Err(e) => {
                let _ = write!(s, " failed: {e} |");
            }
        }
    }
    let _ = writeln!(s, "\n");
    let _ = writeln!(
        s,
        "Each command, instructions per acquire + release (calls per cycle):\n"
    );
    let _ = write!(s, "| command |");
    for r in &c.rows {
        let _ = write!(s, " {} |", r.who.label());
    }
    let _ = write!(s, "\n|---|");
    for _ in &c.rows {
        let _ = write!(s, "---:|");
    }
    let _ = writeln!(s);
    for (_, name) in COMMANDS {
        if !c
            .rows
            .iter()
            .any(|r| r.commands.iter().any(|(n, _, _)| n == name))
        {
            continue;
        }
        let _ = write!(s, "| {name} |");
        for r in &c.rows {
            match r.commands.iter().find(|(n, _, _)| n == name) {
                Some((_, ir, calls)) => {
                    let _ = write!(s, " {} ({calls:.1}) |", thousands(ir.round() as usize));
                }
                None => {
                    let _ = write!(s, " |");
                }
            }
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "On Debian's server, without callgrind: microseconds per acquire + release in \
         `INFO commandstats` (the client's own commands; a script's inner commands inside \
         it), and each script's median run time in `SLOWLOG` at 0:\n"
    );
    let _ = writeln!(
        s,
        "| | µs per cycle (commandstats) | scripts' medians (SLOWLOG, µs) |"
    );
    let _ = writeln!(s, "|---|---:|---|");
    for r in &c.rows {
        match &r.usec {
            Ok((usec, scripts)) => {
                let scripts: Vec<String> = scripts
                    .iter()
                    .map(|(script, us)| format!("{script} {us:.0}"))
                    .collect();
                let _ = writeln!(
                    s,
                    "| {} | {usec:.1} | {} |",
                    r.who.label(),
                    scripts.join(", ")
                );
            }
            Err(e) => {
                let _ = writeln!(s, "| {} | failed: {e} | |", r.who.label());
            }
        }
    }
    let _ = writeln!(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inclusive_lines_are_read_with_the_larger_figure() {
        let text = "\
--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
153,796,162 (100.0%)  redis-7.0.15/src/server.c:main [/x/redis-server]
128,589,683 (83.61%)  /x/src/eval.c:evalShaCommand
128,567,683 (83.60%)  redis-7.0.15/src/eval.c:evalShaCommand [/x/redis-server]
 81,393,831 (52.92%)  ???:lua_pcall [/x/redis-server]
 21,765,761 (14.15%)  redis-7.0.15/src/server.c:call'2 [/x/redis-server]
";
        let costs = inclusive_costs(text);
        assert_eq!(cost_of(&costs, "main"), 153_796_162);
        assert_eq!(cost_of(&costs, "evalShaCommand"), 128_589_683);
        assert_eq!(cost_of(&costs, "lua_pcall"), 81_393_831);
        assert_eq!(cost_of(&costs, "call'2"), 21_765_761);
        assert_eq!(cost_of(&costs, "missing"), 0);
    }
}
