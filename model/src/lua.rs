//! Scripts run as Redis runs them: the exact text, in a real Lua 5.1 (Redis embeds
//! 5.1), with `redis.call` and `redis.pcall` served by a [`Server`].
//!
//! What is Redis's here, after Redis 7.0: a `#!lua` first line (its flags checked, the
//! line blanked so that line numbers stay), `KEYS` and `ARGV`, globals that a script
//! may neither read undefined nor create, the conversions between Lua values and
//! replies (a number argument becomes `%.17g` text; a reply's integer a number, a nil
//! `false`, a status `{ok=...}`, an error `{err=...}`; a returned number an integer
//! truncated, `true` 1, `false` nil, a table an array up to its first nil, `{err=...}`
//! an error and `{ok=...}` a status), `redis.call` raising the error table that
//! `redis.pcall` returns, `redis.error_reply` and `redis.status_reply`. What is not:
//! `cjson`, `bit`, `struct`, `cmsgpack` and `redis.sha1hex` (no shipped script uses
//! them), the debug library, and the text Redis adds to an error that ends a script
//! (`" script: <sha>, on @user_script:<line>."`): the model gives the message alone.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use mlua::{Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value, VmState};

use crate::keyspace::{Bytes, Reply, Server, format_double};

/// The Lua side of the host: the `redis` table, whose `call` and `pcall` go through
/// `host.raw` (set for each run to a function that reaches that run's server), the
/// globals' guard, and the runner that turns a script's error into a value.
const PRELUDE: &str = r#"
local host = {}
local function call(...)
  local ok, reply = host.raw(...)
  if not ok then
    error(reply, 0)
  end
  return reply
end
local function pcall_(...)
  local _, reply = host.raw(...)
  return reply
end
local function error_reply(message)
  if type(message) ~= 'string' then
    error('wrong number or type of arguments', 2)
  end
  return {err = message}
end
local function status_reply(message)
  if type(message) ~= 'string' then
    error('wrong number or type of arguments', 2)
  end
  return {ok = message}
end
rawset(_G, 'redis', {
  call = call, pcall = pcall_, error_reply = error_reply, status_reply = status_reply,
})
rawset(_G, 'loadfile', nil)
rawset(_G, 'dofile', nil)
setmetatable(_G, {
  __index = function(_, name)
    error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
  end,
  __newindex = function()
    error('Attempt to modify a readonly table', 2)
  end,
})
function host.run(script)
  local ok, reply = pcall(script)
  if ok then
    return true, reply
  elseif type(reply) == 'table' and type(reply.err) == 'string' then
    return false, reply.err
  end
  return false, 'ERR ' .. tostring(reply)
end
return host
"#;

/// The flags a `#!lua` line may carry (Redis 7.0).
const FLAGS: [&str; 5] = [
    "no-writes",
    "allow-oom",
    "allow-stale",
    "no-cluster",
    "allow-cross-slot-keys",
];

/// Commands a `no-writes` script may not run (of those the model serves).
const WRITES: [&str; 18] = [
    "SET",
    "DEL",
    "INCR",
    "INCRBY",
    "PEXPIRE",
    "PEXPIREAT",
    "HSET",
    "HDEL",
    "ZADD",
    "ZREM",
    "ZREMRANGEBYSCORE",
    "RPUSH",
    "LPUSH",
    "LREM",
    "XADD",
    "PUBLISH",
    "SPUBLISH",
    "EXPIRE",
];

/// How many Lua instructions one script run may take before the model fails the
/// case: a shipped script takes a few thousand; a loop that a bad argument makes
/// unbounded (a count of 1.8e15 or `inf`) would otherwise hang the checker or the
/// differential test for hours, as it hangs a real server (BUSY until `SCRIPT KILL`).
pub const INSTRUCTION_BUDGET: u64 = 10_000_000;
/// The hook runs every this many instructions.
const HOOK_EVERY: u32 = 1_000;

/// One thread's Lua state and its compiled scripts.
struct Host {
    lua: Lua,
    /// Hook calls in the current run (each `HOOK_EVERY` instructions).
    hooks: Rc<Cell<u64>>,
    host: Table,
    run: Function,
    /// By script text: the compiled chunk and whether its `#!lua` line said `no-writes`,
    /// or the error Redis gives when loading it.
    compiled: HashMap<String, Result<(Function, bool), String>>,
}

thread_local! {
    static HOST: RefCell<Option<Host>> = const { RefCell::new(None) };
}

impl Host {
    fn new() -> mlua::Result<Host> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )?;
        let host: Table = lua.load(PRELUDE).set_name("@host").eval()?;
        let run = host.get("run")?;
        let hooks = Rc::new(Cell::new(0));
        let seen = Rc::clone(&hooks);
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(HOOK_EVERY),
            move |_, _| {
                seen.set(seen.get() + 1);
                if seen.get() * u64::from(HOOK_EVERY) > INSTRUCTION_BUDGET {
                    return Err(mlua::Error::runtime(
                        "the model's instruction budget ran out",
                    ));
                }
                Ok(VmState::Continue)
            },
        )?;
        Ok(Host {
            lua,
            hooks,
            host,
            run,
            compiled: HashMap::new(),
        })
    }

    fn compile(&mut self, text: &str) -> Result<(Function, bool), String> {
        if let Some(done) = self.compiled.get(text) {
            return done.clone();
        }
        let done = shebang(text).and_then(|(body, no_writes)| {
            self.lua
                .load(body)
                .set_name("@user_script")
                .into_function()
                .map(|f| (f, no_writes))
                .map_err(|e| format!("ERR Error compiling script (new function): {e}"))
        });
        self.compiled.insert(text.to_owned(), done.clone());
        done
    }
}

/// The script's body with its `#!` line blanked (its newline kept), and whether it
/// said `no-writes`; or Redis's error for a bad `#!` line.
fn shebang(text: &str) -> Result<(String, bool), String> {
    let Some(rest) = text.strip_prefix("#!") else {
        return Ok((text.to_owned(), false));
    };
    let line_end = rest.find('\n').unwrap_or(rest.len());
    let mut words = rest[..line_end].split(' ').filter(|w| !w.is_empty());
    let engine = words.next().unwrap_or("");
    if engine != "lua" {
        return Err(format!("ERR Could not find engine '{engine}'"));
    }
    let mut no_writes = false;
    for word in words {
        let Some(flags) = word.strip_prefix("flags=") else {
            return Err(format!("ERR Unknown lua shebang option: {word}"));
        };
        for flag in flags.split(',').filter(|f| !f.is_empty()) {
            if !FLAGS.contains(&flag) {
                return Err(format!("ERR Unexpected flag in script shebang: {flag}"));
            }
            no_writes |= flag == "no-writes";
        }
    }
    Ok((rest[line_end..].to_owned(), no_writes))
}

/// Runs `script` (the exact text as sent) on `server` with `keys` and `argv`, as
/// `EVAL` would, and returns its reply.
///
/// # Panics
///
/// When the script runs past [`INSTRUCTION_BUDGET`] instructions (a loop that its
/// arguments made unbounded), naming the script (its last `-- name.lua:` header) and its keys
/// and arguments: the case fails instead of hanging.
pub fn eval(server: &mut Server, script: &str, keys: &[Bytes], argv: &[Bytes]) -> Reply {
    HOST.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Host::new().expect("the Lua host starts"));
        }
        let host = slot.as_mut().expect("set above");
        host.hooks.set(0);
        let reply = run(host, server, script, keys, argv);
        if host.hooks.get() * u64::from(HOOK_EVERY) > INSTRUCTION_BUDGET {
            host.hooks.set(0);
            // Its own header comes after its fragments': the last "-- name.lua:".
            let name = script
                .lines()
                .filter_map(|l| l.strip_prefix("-- ")?.split_once(": ").map(|(n, _)| n))
                .rfind(|n| n.ends_with(".lua"))
                .unwrap_or("a script");
            let shown = |items: &[Bytes]| -> Vec<String> {
                items
                    .iter()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .collect()
            };
            panic!(
                "{name} ran past {INSTRUCTION_BUDGET} Lua instructions (a loop its arguments \
                 left unbounded): keys {:?}, argv {:?}",
                shown(keys),
                shown(argv)
            );
        }
        match reply {
            Ok(reply) => reply,
            Err(e) => Reply::Error(format!("ERR the model's Lua host failed: {e}")),
        }
    })
}

fn run(
    host: &mut Host,
    server: &mut Server,
    script: &str,
    keys: &[Bytes],
    argv: &[Bytes],
) -> mlua::Result<Reply> {
    let (function, no_writes) = match host.compile(script) {
        Ok(done) => done,
        Err(message) => return Ok(Reply::Error(message)),
    };
    let lua = &host.lua;
    let globals = lua.globals();
    globals.raw_set("KEYS", strings(lua, keys)?)?;
    globals.raw_set("ARGV", strings(lua, argv)?)?;
    let server = RefCell::new(server);
    let (ok, value): (bool, Value) = lua.scope(|scope| {
        let raw = scope.create_function(|lua, args: MultiValue| {
            let command = match command_args(lua, args) {
                Ok(command) => command,
                Err(message) => return Ok((false, error_table(lua, &message)?)),
            };
            let name = String::from_utf8_lossy(&command[0]).to_ascii_uppercase();
            if no_writes && WRITES.contains(&name.as_str()) {
                let message = "ERR Write commands are not allowed from read-only scripts.";
                return Ok((false, error_table(lua, message)?));
            }
            let reply = server.borrow_mut().call(&command);
            let ok = !reply.is_error();
            Ok((ok, to_lua(lua, &reply)?))
        })?;
        host.host.set("raw", raw)?;
        host.run.call::<(bool, Value)>(function)
    })?;
    if !ok {
        let message = match &value {
            Value::String(s) => s.to_string_lossy().to_string(),
            _ => "ERR the script failed".into(),
        };
        return Ok(Reply::Error(message));
    }
    from_lua(&value)
}

fn strings(lua: &Lua, items: &[Bytes]) -> mlua::Result<Table> {
    let table = lua.create_table_with_capacity(items.len(), 0)?;
    for (i, item) in items.iter().enumerate() {
        table.raw_set(i + 1, lua.create_string(item)?)?;
    }
    Ok(table)
}

fn error_table(lua: &Lua, message: &str) -> mlua::Result<Value> {
    let table = lua.create_table()?;
    table.raw_set("err", message)?;
    Ok(Value::Table(table))
}

/// A `redis.call`'s arguments as a command, or the error Redis raises for them.
fn command_args(lua: &Lua, args: MultiValue) -> Result<Vec<Bytes>, String> {
    if args.is_empty() {
        return Err("ERR Please specify at least one argument for this redis lib call".into());
    }
    let _ = lua;
    args.into_iter()
        .map(|arg| match arg {
            Value::String(s) => Ok(s.as_bytes().to_vec()),
            Value::Number(n) => Ok(format_double(n).into_bytes()),
            Value::Integer(n) => Ok(format_double(n as f64).into_bytes()),
            _ => Err("ERR Lua redis lib command arguments must be strings or integers".into()),
        })
        .collect()
}

/// A reply as Redis gives it to a script.
fn to_lua(lua: &Lua, reply: &Reply) -> mlua::Result<Value> {
    Ok(match reply {
        Reply::Int(n) => Value::Number(*n as f64),
        Reply::Bulk(Some(b)) => Value::String(lua.create_string(b)?),
        Reply::Bulk(None) | Reply::Array(None) => Value::Boolean(false),
        Reply::Status(s) => {
            let table = lua.create_table()?;
            table.raw_set("ok", s.as_str())?;
            Value::Table(table)
        }
        Reply::Error(e) => error_table(lua, e)?,
        Reply::Array(Some(items)) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                table.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(table)
        }
    })
}

/// A script's returned value as Redis replies with it.
fn from_lua(value: &Value) -> mlua::Result<Reply> {
    Ok(match value {
        Value::String(s) => Reply::Bulk(Some(s.as_bytes().to_vec())),
        Value::Boolean(true) => Reply::Int(1),
        Value::Number(n) => Reply::Int(truncate(*n)),
        Value::Integer(n) => Reply::Int(*n),
        Value::Table(t) => {
            if let Value::String(e) = t.raw_get::<Value>("err")? {
                return Ok(Reply::Error(e.to_string_lossy().to_string()));
            }
            if let Value::String(s) = t.raw_get::<Value>("ok")? {
                return Ok(Reply::Status(s.to_string_lossy().to_string()));
            }
            let mut items = Vec::new();
            for i in 1.. {
                let item: Value = t.raw_get(i)?;
                if item.is_nil() {
                    break;
                }
                items.push(from_lua(&item)?);
            }
            Reply::Array(Some(items))
        }
        _ => Reply::Bulk(None),
    })
}

/// C's `(long long)` of a double as x86-64 computes it: toward zero, and the "integer
/// indefinite" value (`i64::MIN`) for NaN and whatever is out of range (an infinite
/// score returned as a number, say).
fn truncate(n: f64) -> i64 {
    const LIMIT: f64 = 9_223_372_036_854_775_808.0; // 2^63
    if n.is_nan() || !(-LIMIT..LIMIT).contains(&n) {
        return i64::MIN;
    }
    n.trunc() as i64
}
