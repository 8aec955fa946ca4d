//! The replay: [`touches`] turns a recorded `MONITOR` stream into checker
//! C5's input (which owner's key each script deleted or extended).

use std::time::Duration;

use super::parser::{Entry, Source};
use crate::history::{Event, Op, Phase};

/// The only database whose keys the replay models.
const LOCK_DB: u32 = 0;

/// What [`touches`] found: C5's input and how much of the recording it could
/// judge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touches {
    /// One `release`/`extend` `ok` event per judged touch, sorted by
    /// `time_ns` (stable: recording order unless the clock stepped back),
    /// ready for [`foreign_touch`](crate::checkers::foreign_touch).
    /// See [`touches`] for the fields. Their `time_ns` is the server's
    /// **wall clock**, not `CLOCK_MONOTONIC`: judge them on their own, do not
    /// merge them into the workers' history (C1 would also take an `extend
    /// ok` without `valid_until_ns` as malformed).
    pub events: Vec<Event>,
    /// Touches judged: script commands that deleted a lock key or changed
    /// its expiry or value while its holder was known (`events.len()`).
    pub judged: usize,
    /// Script commands that may have touched a lock key but could not be
    /// judged, because the key's state was unknown then (after an
    /// interruption, an unmodelled command, an expiry too close to call,
    /// unparsable arguments) or the command itself is not modelled.
    pub skipped: usize,
    /// Interruption markers seen (monitor reconnections).
    pub interruptions: usize,
}

/// A window of microseconds in which some instant of the server lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    earliest: u64,
    latest: u64,
}

impl Window {
    fn exact(us: u64) -> Window {
        Window {
            earliest: us,
            latest: us,
        }
    }
}

/// What the replay knows about one lock key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyState {
    Absent,
    /// Holds `value`; expires within `expiry` (`None`: never).
    Present {
        value: String,
        expiry: Option<Window>,
    },
    Unknown,
}

/// The key's state as the command being replayed saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pre<'a> {
    Absent,
    Present(&'a str, Option<Window>),
    Unknown,
}

impl KeyState {
    /// The state as seen by a command whose server time lies in `now`,
    /// allowing `margin_us` of slack on both sides of every expiry.
    fn at(&self, now: Window, margin_us: u64) -> Pre<'_> {
        match self {
            KeyState::Absent => Pre::Absent,
            KeyState::Unknown => Pre::Unknown,
            KeyState::Present { value, expiry } => match expiry {
                Some(e) if e.latest.saturating_add(margin_us) <= now.earliest => Pre::Absent,
                Some(e) if e.earliest <= now.latest.saturating_add(margin_us) => Pre::Unknown,
                _ => Pre::Present(value, *expiry),
            },
        }
    }
}

/// The enclosing script call of `lua` lines.
struct ScriptCall {
    time_us: u64,
    argv: Vec<String>,
}

impl ScriptCall {
    /// `EVAL body numkeys key... arg...` (and `EVALSHA`, `FCALL`, their
    /// `_RO` forms): the args after the keys.
    fn parse(args: &[String]) -> ScriptCall {
        let argv = args
            .get(2)
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| args.get(3usize.saturating_add(n)..))
            .unwrap_or_default();
        ScriptCall {
            time_us: 0,
            argv: argv.to_vec(),
        }
    }

    /// The owner to charge with a touch of a key holding `touched`: that
    /// token if the call passed it, else a description of what it passed.
    fn owner(&self, touched: &str) -> String {
        if self.argv.iter().any(|a| a == touched) {
            touched.to_owned()
        } else {
            format!("argv: [{}]", self.argv.join(", "))
        }
    }
}

/// How a modelled write changes one key, given its state before.
enum Effect {
    /// Leaves the key as it was (`SET NX` on a present key, `DEL` of an
    /// absent one).
    Keep,
    /// The key's new state; `touch` is set if the command acted on the value
    /// the key held (deleted it, changed its expiry, overwrote it).
    Set { state: KeyState, touch: Option<Op> },
    /// The outcome depends on what is not known; `maybe_touch` is set if the
    /// command might have acted on a present key.
    Unknown { maybe_touch: bool },
}

/// Replays `entries` (a [`Monitor`](super::Monitor) recording) on the keys
/// `lock_keys` of database 0 and returns C5's events for the touches scripts
/// made.
///
/// # State
/// Each key is absent, present (a value and an expiry window), or unknown;
/// it starts unknown. Every command on a lock key, from clients and from
/// scripts, updates it: `SET` (with `NX XX GET KEEPTTL EX PX EXAT PXAT`),
/// `DEL UNLINK GETDEL`, `EXPIRE PEXPIRE EXPIREAT PEXPIREAT` (without
/// options; a non-positive relative ttl deletes), `PERSIST`, `FLUSHDB`,
/// `FLUSHALL`. Read-only commands (`GET`, `TYPE`, `PTTL`, `EXISTS`, `HGET`,
/// ...) and script calls themselves (their commands follow as `lua` lines)
/// change nothing. Any other command with a lock key among its arguments,
/// unparsable or invalid options, `SWAPDB` and an
/// [interruption](Source::Interrupted) make the key unknown, until a
/// command sets it regardless of its state (`SET` without
/// `NX`/`XX`/`KEEPTTL`, `DEL`, ...).
///
/// Every key starts **unknown**: the recording does not say what the key
/// held before it began. Start it with a definite write (`DEL` the lock keys
/// or `FLUSHALL` right after [`Monitor::start`](super::Monitor::start)), or
/// the first touches are skipped.
///
/// A present key whose expiry is at or before `margin` before the
/// command's time is absent; one whose expiry is within `margin` of it is
/// unknown for that command. The server's expiry clock has millisecond
/// resolution and is frozen at a script's start, so the command's time is
/// taken as the window from its script call's line (1 ms before that) to
/// its own line, and an expiry set with a relative ttl as the same window
/// plus the ttl. A few milliseconds is a sensible `margin`.
///
/// # Judging
/// Only `lua` commands, on behalf of the nearest preceding script call,
/// are judged. `DEL`/`UNLINK`/`GETDEL`/`FLUSH*` (op `release`) and expiry
/// changes or `SET` overwrites (op `extend`) of a key known to hold value
/// `V` produce an event: process 0, `time_ns` the line's time in
/// nanoseconds (server wall clock), phase `ok`, `touched_owner` `V`, and
/// `owner` `V` if `V` is among the call's `ARGV`, else `"argv: [a, b]"`
/// (so `foreign_touch` reports it). A key known absent was not acted on:
/// no event. A key in unknown state: counted in
/// [`skipped`](Touches::skipped). A `SET NX` never overwrites, so is never
/// a touch. Multi-key scripts are judged per key, but the owner check only
/// asks whether `V` is among *all* the call's arguments.
pub fn touches(entries: &[Entry], lock_keys: &[&str], margin: Duration) -> Touches {
    let margin_us = u64::try_from(margin.as_micros()).unwrap_or(u64::MAX);
    let mut keys: Vec<(&str, KeyState)> = Vec::new();
    for key in lock_keys {
        if !keys.iter().any(|(k, _)| k == key) {
            keys.push((key, KeyState::Unknown));
        }
    }
    let mut out = Touches::default();
    let mut script: Option<ScriptCall> = None;
    for entry in entries {
        let lua = entry.source == Source::Lua;
        if entry.is_interruption() {
            out.interruptions += 1;
            script = None;
            keys.iter_mut().for_each(|(_, s)| *s = KeyState::Unknown);
            continue;
        }
        let command = entry.command();
        if !lua {
            script = is_script_call(&command).then(|| ScriptCall {
                time_us: entry.time_us,
                ..ScriptCall::parse(&entry.args)
            });
        }
        let now = Window {
            earliest: script
                .as_ref()
                .filter(|_| lua)
                .map_or(entry.time_us, |s| s.time_us)
                .saturating_sub(1_000),
            latest: entry.time_us,
        };
        for (key, state) in keys.iter_mut() {
            let effect = if entry.db == LOCK_DB {
                apply(&command, &entry.args, key, state.at(now, margin_us), now)
            } else {
                other_db(&command, &entry.args, key)
            };
            let touch = match effect {
                Effect::Keep => None,
                Effect::Set { state: new, touch } => {
                    let touched = match (touch, state.at(now, margin_us)) {
                        (Some(op), Pre::Present(value, _)) => Some((op, value.to_owned())),
                        (Some(_), Pre::Unknown) => {
                            if lua {
                                out.skipped += 1;
                            }
                            None
                        }
                        _ => None,
                    };
                    *state = new;
                    touched
                }
                Effect::Unknown { maybe_touch } => {
                    *state = KeyState::Unknown;
                    if lua && maybe_touch {
                        out.skipped += 1;
                    }
                    None
                }
            };
            let Some((op, touched)) = touch.filter(|_| lua) else {
                continue;
            };
            let Some(call) = &script else {
                // A script command without its call line: cannot be judged.
                out.skipped += 1;
                continue;
            };
            out.events.push(
                Event::new(0, entry.time_us.saturating_mul(1_000), op, Phase::Ok)
                    .with_owner(call.owner(&touched))
                    .with_touched_owner(touched),
            );
        }
    }
    out.judged = out.events.len();
    // The recording is in execution order; a wall clock stepped back (NTP)
    // must not break the checkers' sorted-input contract.
    out.events.sort_by_key(|e| e.time_ns);
    out
}

fn is_script_call(command: &str) -> bool {
    matches!(
        command,
        "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" | "FCALL" | "FCALL_RO"
    )
}

/// Commands that never write a key named among their arguments (or whose
/// writes show up as lines of their own, like script calls).
fn is_harmless(command: &str) -> bool {
    is_script_call(command)
        || matches!(
            command,
            "GET"
                | "MGET"
                | "EXISTS"
                | "TYPE"
                | "TTL"
                | "PTTL"
                | "EXPIRETIME"
                | "PEXPIRETIME"
                | "STRLEN"
                | "GETRANGE"
                | "SUBSTR"
                | "LCS"
                | "GETBIT"
                | "BITCOUNT"
                | "BITPOS"
                | "HGET"
                | "HMGET"
                | "HEXISTS"
                | "HGETALL"
                | "HKEYS"
                | "HVALS"
                | "HLEN"
                | "HSTRLEN"
                | "LLEN"
                | "LRANGE"
                | "LINDEX"
                | "SCARD"
                | "SISMEMBER"
                | "SMEMBERS"
                | "ZCARD"
                | "ZSCORE"
                | "DUMP"
                | "OBJECT"
                | "TOUCH"
                | "MEMORY"
                | "WATCH"
                | "UNWATCH"
                | "ECHO"
                | "PING"
                | "PUBLISH"
                | "SPUBLISH"
                | "SUBSCRIBE"
                | "UNSUBSCRIBE"
                | "PSUBSCRIBE"
                | "PUNSUBSCRIBE"
                | "KEYS"
                | "SCAN"
                | "DBSIZE"
                | "RANDOMKEY"
                | "INFO"
                | "TIME"
                | "SELECT"
                | "MULTI"
                | "EXEC"
                | "DISCARD"
                | "CLIENT"
                | "HELLO"
                | "AUTH"
                | "COMMAND"
                | "MONITOR"
                | "SCRIPT"
                | "FUNCTION"
                | "READONLY"
                | "WAIT"
                | "RESET"
                | "QUIT"
        )
}

/// A command in another database: only its effects on database 0 count.
fn other_db(command: &str, args: &[String], key: &str) -> Effect {
    match command {
        "FLUSHALL" => flush(),
        "SWAPDB" => Effect::Unknown { maybe_touch: true },
        // The only other commands that reach across databases.
        "MOVE" | "COPY" if names(args, key) => Effect::Unknown { maybe_touch: true },
        _ => Effect::Keep,
    }
}

fn names(args: &[String], key: &str) -> bool {
    args.iter().skip(1).any(|a| a == key)
}

fn flush() -> Effect {
    Effect::Set {
        state: KeyState::Absent,
        touch: Some(Op::Release),
    }
}

/// The effect of `args` (in database 0) on `key`, whose state the command
/// saw as `pre`, at server time `now`.
fn apply(command: &str, args: &[String], key: &str, pre: Pre<'_>, now: Window) -> Effect {
    let unknown = Effect::Unknown {
        maybe_touch: pre != Pre::Absent,
    };
    let on_key = args.get(1).is_some_and(|k| k == key);
    match command {
        "FLUSHALL" | "FLUSHDB" => flush(),
        "SWAPDB" => unknown,
        "DEL" | "UNLINK" if names(args, key) => Effect::Set {
            state: KeyState::Absent,
            touch: Some(Op::Release),
        },
        "GETDEL" if on_key && args.len() == 2 => Effect::Set {
            state: KeyState::Absent,
            touch: Some(Op::Release),
        },
        "SET" if on_key => set(&args[2..], pre, now),
        "PEXPIRE" | "EXPIRE" | "PEXPIREAT" | "EXPIREAT" if on_key => {
            match expiry_of(command, args.get(2..).unwrap_or_default(), now) {
                None => unknown,
                Some(expiry) => retime(pre, expiry),
            }
        }
        "PERSIST" if on_key && args.len() == 2 => match pre {
            Pre::Absent | Pre::Present(_, None) => Effect::Keep,
            Pre::Present(value, Some(_)) => Effect::Set {
                state: KeyState::Present {
                    value: value.to_owned(),
                    expiry: None,
                },
                touch: Some(Op::Extend),
            },
            Pre::Unknown => unknown,
        },
        // Modelled commands that name the key elsewhere than as their key
        // (`SET other <key>`) do not write it.
        "SET" | "GETDEL" | "PEXPIRE" | "EXPIRE" | "PEXPIREAT" | "EXPIREAT" | "PERSIST" | "DEL"
        | "UNLINK"
            if !on_key =>
        {
            Effect::Keep
        }
        _ if is_harmless(command) || !names(args, key) => Effect::Keep,
        _ => unknown,
    }
}

/// A new expiry for a key: `None` deletes it at once (non-positive relative
/// ttl).
type NewExpiry = Option<Window>;

/// The new expiry of `PEXPIRE key ms` & co. (`rest` is after the key);
/// `None` if the arguments are not exactly one valid integer (options like
/// `NX`/`GT` are not modelled, and an invalid command changes nothing we
/// could know).
fn expiry_of(command: &str, rest: &[String], now: Window) -> Option<NewExpiry> {
    let [amount] = rest else {
        return None;
    };
    let amount: i64 = amount.parse().ok()?;
    let unit_us: i64 = if command.starts_with('P') {
        1_000
    } else {
        1_000_000
    };
    if command.ends_with("AT") {
        let at = u64::try_from(amount.checked_mul(unit_us)?).unwrap_or(0);
        return Some(Some(Window::exact(at)));
    }
    if amount <= 0 {
        return Some(None);
    }
    relative(u64::try_from(amount).ok()?, unit_us as u64, now).map(Some)
}

/// The expiry window of a relative ttl set at `now`.
fn relative(amount: u64, unit_us: u64, now: Window) -> Option<Window> {
    let ttl = amount.checked_mul(unit_us)?;
    Some(Window {
        earliest: now.earliest.checked_add(ttl)?,
        latest: now.latest.checked_add(ttl)?,
    })
}

/// `PEXPIRE` & co. on a key in state `pre`.
fn retime(pre: Pre<'_>, expiry: NewExpiry) -> Effect {
    match pre {
        Pre::Absent => Effect::Keep,
        Pre::Unknown => Effect::Unknown { maybe_touch: true },
        Pre::Present(value, _) => Effect::Set {
            state: match expiry {
                None => KeyState::Absent,
                Some(_) => KeyState::Present {
                    value: value.to_owned(),
                    expiry,
                },
            },
            touch: Some(Op::Extend),
        },
    }
}

/// How `SET` sets the expiry.
enum SetTtl {
    Persist,
    Keep,
    At(Window),
}

/// `SET key` + `rest` (value and options) on a key in state `pre`.
fn set(rest: &[String], pre: Pre<'_>, now: Window) -> Effect {
    let unknown = Effect::Unknown {
        maybe_touch: pre != Pre::Absent,
    };
    let Some((value, options)) = rest.split_first() else {
        return unknown;
    };
    let (mut nx, mut xx) = (false, false);
    let mut ttl = None;
    let mut i = 0;
    while let Some(option) = options.get(i) {
        i += 1;
        let option = option.to_ascii_uppercase();
        let unit_us = match option.as_str() {
            "NX" => {
                nx = true;
                continue;
            }
            "XX" => {
                xx = true;
                continue;
            }
            "GET" => continue,
            "KEEPTTL" if ttl.is_none() => {
                ttl = Some(SetTtl::Keep);
                continue;
            }
            "PX" | "PXAT" => 1_000,
            "EX" | "EXAT" => 1_000_000,
            _ => return unknown,
        };
        // Redis rejects a second expiry option and non-positive amounts.
        let amount = options.get(i).and_then(|a| a.parse::<u64>().ok());
        i += 1;
        let window = match amount {
            Some(amount) if amount > 0 && ttl.is_none() && option.ends_with("AT") => {
                amount.checked_mul(unit_us).map(Window::exact)
            }
            Some(amount) if amount > 0 && ttl.is_none() => relative(amount, unit_us, now),
            _ => None,
        };
        let Some(window) = window else {
            return unknown;
        };
        ttl = Some(SetTtl::At(window));
    }
    if nx && xx {
        return unknown;
    }
    let writes = match pre {
        Pre::Absent => !xx,
        Pre::Present(..) => !nx,
        Pre::Unknown if nx || xx => {
            // SET NX never overwrites a present key: not a possible touch.
            return Effect::Unknown { maybe_touch: !nx };
        }
        Pre::Unknown => true,
    };
    if !writes {
        return Effect::Keep;
    }
    let expiry = match ttl.unwrap_or(SetTtl::Persist) {
        SetTtl::Persist => None,
        SetTtl::At(window) => Some(window),
        SetTtl::Keep => match pre {
            Pre::Absent => None,
            Pre::Present(_, expiry) => expiry,
            Pre::Unknown => return Effect::Unknown { maybe_touch: true },
        },
    };
    let touch = match pre {
        Pre::Absent => None,
        _ => Some(Op::Extend),
    };
    Effect::Set {
        state: KeyState::Present {
            value: value.clone(),
            expiry,
        },
        touch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(time_us: u64, source: Source, args: &[&str]) -> Entry {
        Entry {
            time_us,
            db: 0,
            source,
            args: args.iter().map(|a| a.to_string()).collect(),
        }
    }

    fn client(time_us: u64, args: &[&str]) -> Entry {
        entry(time_us, Source::Client("127.0.0.1:1".into()), args)
    }

    fn lua(time_us: u64, args: &[&str]) -> Entry {
        entry(time_us, Source::Lua, args)
    }

    const K: &str = "fencelock:{lab:x}";
    const MARGIN: Duration = Duration::from_millis(2);

    #[test]
    fn checked_release_by_owner_is_judged_and_matches() {
        let log = [
            client(1_000, &["SET", K, "a", "PX", "10000"]),
            client(2_000, &["evalsha", "sha", "1", K, "a", "chan"]),
            lua(2_010, &["GET", K]),
            lua(2_020, &["DEL", K]),
            lua(2_030, &["PUBLISH", "chan", ""]),
        ];
        let t = touches(&log, &[K], MARGIN);
        assert_eq!((t.judged, t.skipped), (1, 0));
        let e = &t.events[0];
        assert_eq!(
            (e.op, e.phase, e.time_ns),
            (Op::Release, Phase::Ok, 2_020_000)
        );
        assert_eq!(e.owner.as_deref(), Some("a"));
        assert_eq!(e.touched_owner.as_deref(), Some("a"));
    }

    #[test]
    fn foreign_delete_names_the_call_arguments() {
        let log = [
            client(1_000, &["SET", K, "b"]),
            client(
                2_000,
                &["eval", "redis.call('DEL', KEYS[1])", "1", K, "a", "x"],
            ),
            lua(2_010, &["DEL", K]),
        ];
        let t = touches(&log, &[K], MARGIN);
        assert_eq!(t.events.len(), 1);
        assert_eq!(t.events[0].owner.as_deref(), Some("argv: [a, x]"));
        assert_eq!(t.events[0].touched_owner.as_deref(), Some("b"));
    }

    #[test]
    fn keys_start_unknown_and_become_known_by_definite_writes() {
        let call = client(10, &["eval", "s", "1", K, "a"]);
        let log = [
            call.clone(),
            lua(11, &["DEL", K]), // unknown: skipped
            call.clone(),
            lua(21, &["DEL", K]), // known absent: no touch
            call.clone(),
            lua(31, &["SET", K, "a", "NX", "PX", "1000"]), // absent: not a touch
            lua(32, &["PEXPIRE", K, "2000"]),              // extend
            lua(33, &["SET", K, "a", "XX", "KEEPTTL"]),    // overwrite
            lua(34, &["PERSIST", K]),                      // extend
            lua(35, &["PERSIST", K]),                      // no expiry: no-op
            lua(36, &["SET", K, "b", "NX"]),               // present: no-op
            lua(37, &["GETDEL", K]),                       // release
        ];
        let t = touches(&log, &[K], MARGIN);
        assert_eq!((t.judged, t.skipped), (4, 1));
        let ops: Vec<Op> = t.events.iter().map(|e| e.op).collect();
        assert_eq!(ops, [Op::Extend, Op::Extend, Op::Extend, Op::Release]);
        assert!(t.events.iter().all(|e| e.owner.as_deref() == Some("a")));
    }

    #[test]
    fn expiry_is_judged_with_a_margin() {
        let call = |t| client(t, &["eval", "s", "1", K, "b"]);
        let set = client(1_000_000, &["set", K, "a", "px", "50"]);
        // Expired well before: absent, so B's checked DEL acts on nothing.
        let t = touches(
            &[set.clone(), call(2_000_000), lua(2_000_100, &["DEL", K])],
            &[K],
            MARGIN,
        );
        assert_eq!((t.judged, t.skipped), (0, 0));
        // Expiring around the script's start: unknown for that command.
        let t = touches(
            &[set.clone(), call(1_050_500), lua(1_050_600, &["DEL", K])],
            &[K],
            MARGIN,
        );
        assert_eq!((t.judged, t.skipped), (0, 1));
        // Well before expiry: present, a foreign delete.
        let t = touches(
            &[set, call(1_010_000), lua(1_010_100, &["DEL", K])],
            &[K],
            MARGIN,
        );
        assert_eq!(t.judged, 1);
        assert_eq!(t.events[0].owner.as_deref(), Some("argv: [b]"));
        // A non-positive relative ttl deletes at once.
        let log = [
            client(1, &["set", K, "a"]),
            client(2, &["pexpire", K, "0"]),
            call(3),
            lua(4, &["DEL", K]),
        ];
        assert_eq!(touches(&log, &[K], MARGIN).skipped, 0);
        assert_eq!(touches(&log, &[K], MARGIN).judged, 0);
    }

    #[test]
    fn unmodelled_and_invalid_commands_make_the_key_unknown() {
        let call = client(10, &["eval", "s", "1", K, "a"]);
        for bad in [
            &["set", K, "a", "px", "0"][..],
            &["set", K, "a", "px", "abc"],
            &["set", K, "a", "bogus"],
            &["set", K, "a", "px", "10", "ex", "10"],
            &["set", K, "a", "nx", "xx"],
            &["pexpire", K, "10", "gt"],
            &["pexpire", K, "x"],
            &["rename", "other", K],
            &["hset", K, "owner", "a"],
            &["swapdb", "0", "1"],
        ] {
            let log = [
                client(1, &["set", K, "a"]),
                client(2, bad),
                call.clone(),
                lua(11, &["DEL", K]),
            ];
            let t = touches(&log, &[K], MARGIN);
            assert_eq!((t.judged, t.skipped), (0, 1), "{bad:?}");
        }
        // Read-only commands and other keys change nothing.
        let mut log = vec![
            client(1, &["set", K, "a"]),
            client(2, &["get", K]),
            client(3, &["del", "other"]),
            client(4, &["set", "other", K]),
            client(5, &["del", K]),
            call,
            lua(11, &["TYPE", K]),
            lua(12, &["DEL", K]),
        ];
        log[4].db = 1; // another database's key of the same name
        let t = touches(&log, &[K], MARGIN);
        assert_eq!((t.judged, t.skipped), (1, 0));
    }

    #[test]
    fn interruption_and_flush() {
        let call = client(10, &["eval", "s", "1", K, "a"]);
        let gap = entry(5, Source::Interrupted, &[]);
        let log = [
            client(1, &["set", K, "a"]),
            gap,
            call.clone(),
            lua(11, &["DEL", K]),
        ];
        let t = touches(&log, &[K], MARGIN);
        assert_eq!((t.judged, t.skipped, t.interruptions), (0, 1, 1));
        let log = [client(1, &["set", K, "a"]), call, lua(11, &["flushall"])];
        let t = touches(&log, &[K, "fencelock:{other}"], MARGIN);
        assert_eq!((t.judged, t.skipped), (1, 1));
        assert_eq!(t.events[0].op, Op::Release);
    }

    #[test]
    fn lua_without_a_call_line_is_skipped() {
        let log = [
            client(1, &["set", K, "a"]),
            client(2, &["get", K]),
            lua(3, &["DEL", K]),
        ];
        let t = touches(&log, &[K], MARGIN);
        assert_eq!((t.judged, t.skipped), (0, 1));
    }
}
