//! The operators' subcommands: `status`, `list` and `break`, for people and as JSON
//! (the schema is in the guide's CLI chapter, section "JSON output").

use std::io::{self, BufRead, IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock::{BreakOutcome, Client, ClientBuilder, Error, Holder, LockState, LockStatus};
use serde_json::{Value, json};

use crate::args::{BreakArgs, Connection, ListArgs, StatusArgs, WriteArgs};
use crate::exit::{Failure, json as json_output, warn};
use fencelock::HumanDuration as Human;

/// What `run` says about itself in the lock's holder info (a JSON object).
pub(crate) fn holder_info(command: &[std::ffi::OsString]) -> String {
    let command: Vec<String> = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let since_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    json!({
        "host": hostname(),
        "pid": std::process::id(),
        "command": command.join(" "),
        "since_ms": since_ms,
    })
    .to_string()
}

/// What `elect` says about itself in the leader record (a JSON object; the record
/// says since when it leads).
pub(crate) fn elector_info(command: &[std::ffi::OsString]) -> String {
    let command: Vec<String> = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    json!({
        "host": hostname(),
        "pid": std::process::id(),
        "command": command.join(" "),
    })
    .to_string()
}

/// This machine's host name.
#[allow(unsafe_code)]
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::from("unknown")
    }
}

/// A client builder for `connection`: its URLs, key prefix, credentials and TLS files.
/// Warns (once) when the command line holds a password.
pub(crate) fn builder(connection: &Connection) -> Result<ClientBuilder, Failure> {
    warn_password_on_command_line();
    let mut builder = Client::redlock(connection.urls()).prefix(connection.prefix.as_str());
    if let Some(user) = &connection.user {
        builder = builder.username(user.as_str());
    }
    if let Some(file) = &connection.password_file {
        let text = std::fs::read_to_string(file).map_err(|e| {
            Failure::Usage(format!(
                "--password-file {}: cannot read it: {e}",
                file.display()
            ))
        })?;
        builder = builder.password(text.lines().next().unwrap_or(""));
    } else if let Some(pass) = &connection.pass {
        builder = builder.password(pass.as_str());
    }
    if let Some(ca) = &connection.cacert {
        builder = builder.tls_ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&connection.cert, &connection.key) {
        builder = builder.tls_client_cert(cert, key);
    }
    Ok(builder.tls_insecure_skip_verify(connection.insecure))
}

/// The one-time warning for a password written on fencelock's own command line (with
/// --pass/-a, or in a --redis URL): `ps` shows it to every user of the machine.
fn warn_password_on_command_line() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if password_in_args(std::env::args_os().skip(1)) {
        ONCE.call_once(|| {
            warn(format_args!(
                "a password on the command line is visible to every user of this machine \
                 (ps, /proc); give it in FENCELOCK_PASSWORD or --password-file FILE instead"
            ));
        });
    }
}

/// Whether fencelock's arguments (not COMMAND's, after `--`) hold a password.
fn password_in_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .take_while(|a| a != "--")
        .collect();
    args.iter().enumerate().any(|(i, arg)| {
        let value = |flag: &str| -> Option<&str> {
            if arg == flag {
                args.get(i + 1).map(String::as_str)
            } else {
                arg.strip_prefix(flag)?.strip_prefix('=')
            }
        };
        arg == "-a"
            || arg == "--pass"
            || arg.starts_with("--pass=")
            || (arg.starts_with("-a") && !arg.starts_with("--"))
            || value("--redis").is_some_and(url_has_password)
    })
}

/// Whether a URL (or a comma-separated list) carries a password: in its user part, or
/// in a query parameter whose name holds `pass` (`sentinel_password`, the `pass` of a
/// `redis+unix://` URL).
fn url_has_password(url: &str) -> bool {
    url.split(',').any(|url| {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        let userinfo_has_password = authority
            .rsplit_once('@')
            .is_some_and(|(userinfo, _)| userinfo.contains(':'));
        let query_has_password = url.split_once('?').is_some_and(|(_, query)| {
            query.split('&').any(|pair| {
                pair.split_once('=')
                    .is_some_and(|(key, _)| key.to_ascii_lowercase().contains("pass"))
            })
        });
        userinfo_has_password || query_has_password
    })
}

/// A client for `connection`, made lazily (nothing is sent until the first command).
pub(crate) async fn client(connection: &Connection) -> Result<Client, Failure> {
    builder(connection)?
        .restart_protection(None)
        .connect_lazy()
        .await
        .map_err(Failure::Lock)
}

/// `fencelock status NAME`.
pub(crate) async fn status(args: &StatusArgs) -> Result<u8, Failure> {
    fencelock::keys::validate_name(&args.name).map_err(Failure::Lock)?;
    let client = client(&args.connection).await?;
    let (status, eviction) = tokio::join!(client.inspect(&args.name), client.eviction_risks());
    let status = status.map_err(Failure::Lock)?;
    // A node that could not be asked is left out: the lock's status is what was asked
    // for. One that answered but would not say its policy is said.
    let (risks, unknown) = eviction.map_or_else(|_| Default::default(), |e| (e.risks, e.unknown));
    if json_output() {
        let mut out = status_json(&status);
        out["eviction"] = risks
            .iter()
            .map(|r| {
                json!({
                    "node": r.node,
                    "policy": r.policy,
                    "maxmemory": r.maxmemory,
                    "counters_too": r.counters_too,
                })
            })
            .collect();
        out["eviction_unknown"] = unknown
            .iter()
            .map(|u| json!({"node": u.node, "why": u.why}))
            .collect();
        println!("{out}");
    } else {
        print!("{}", status_text(&status));
        for risk in &risks {
            println!("warning: {risk}");
        }
        for unknown in &unknown {
            println!("warning: {unknown}");
        }
    }
    Ok(0)
}

/// `fencelock write WRITE...`: the writes, applied with the token or not at all.
pub(crate) async fn fenced_write(args: &WriteArgs) -> Result<u8, Failure> {
    let token: u64 = args.token.parse().map_err(|_| {
        Failure::Usage(format!(
            "invalid fencing token {:?}: give a whole number from 0 to {} (FENCELOCK_TOKEN under fencelock run)",
            args.token,
            u64::MAX
        ))
    })?;
    let token = fencelock::FencingToken::new(token);
    let writes = parse_writes(&args.writes)?;
    let client = client(&args.connection).await?;
    let mut write = client.fenced_write(&args.resource, token);
    for w in writes {
        write = match w {
            ResourceWrite::Set(key, value) => write.set(key, value),
            ResourceWrite::Del(key) => write.del(key),
            ResourceWrite::IncrBy(key, by) => write.incr_by(key, by),
            ResourceWrite::HSet(key, field, value) => write.hset(key, field, value),
            ResourceWrite::RPush(key, value) => write.rpush(key, value),
            ResourceWrite::LPush(key, value) => write.lpush(key, value),
            ResourceWrite::XAdd(key, field, value) => write.xadd(key, [(field, value)]),
            ResourceWrite::PExpire(key, ms) => write.expire(key, Duration::from_millis(ms)),
        };
    }
    let replies = write.apply().await.map_err(Failure::Lock)?;
    let text = |reply: &fencelock::fence::Reply| match reply {
        fencelock::fence::Reply::Ok => "OK".to_owned(),
        fencelock::fence::Reply::Integer(n) => n.to_string(),
        fencelock::fence::Reply::Text(t) => t.clone(),
        _ => String::new(),
    };
    if json_output() {
        let replies: Vec<Value> = replies
            .iter()
            .map(|r| match r {
                fencelock::fence::Reply::Integer(n) => json!(n),
                other => json!(text(other)),
            })
            .collect();
        println!(
            "{}",
            json!({ "resource": args.resource, "token": token.get(), "replies": replies })
        );
    } else {
        for reply in &replies {
            println!("{}", text(reply));
        }
    }
    Ok(0)
}

/// One WRITE of `fencelock write`.
#[derive(Debug, PartialEq, Eq)]
enum ResourceWrite {
    Set(String, String),
    Del(String),
    IncrBy(String, i64),
    HSet(String, String, String),
    RPush(String, String),
    LPush(String, String),
    XAdd(String, String, String),
    PExpire(String, u64),
}

/// The WRITEs of the command line: each command name (any case) and as many arguments
/// as it takes.
fn parse_writes(words: &[String]) -> Result<Vec<ResourceWrite>, Failure> {
    const FORMS: &str = "SET KEY VALUE, DEL KEY, INCRBY KEY N, HSET KEY FIELD VALUE, \
                         RPUSH KEY VALUE, LPUSH KEY VALUE, XADD KEY FIELD VALUE, PEXPIRE KEY MS";
    let usage = |m: String| Failure::Usage(format!("{m}; a WRITE is one of: {FORMS}"));
    let mut writes = Vec::new();
    let mut rest = words;
    while let [command, after @ ..] = rest {
        let name = command.to_ascii_uppercase();
        let arity = match name.as_str() {
            "DEL" => 1,
            "SET" | "INCRBY" | "RPUSH" | "LPUSH" | "PEXPIRE" => 2,
            "HSET" | "XADD" => 3,
            _ => return Err(usage(format!("unknown write {command:?}"))),
        };
        if after.len() < arity {
            return Err(usage(format!(
                "{name} needs {arity} argument{}",
                if arity == 1 { "" } else { "s" }
            )));
        }
        let (args, next) = after.split_at(arity);
        let arg = |i: usize| args[i].clone();
        let number = |i: usize, what: &str| {
            args[i].parse::<i64>().map_err(|_| {
                usage(format!(
                    "{name}'s {what} {:?} is not a whole number",
                    args[i]
                ))
            })
        };
        writes.push(match name.as_str() {
            "SET" => ResourceWrite::Set(arg(0), arg(1)),
            "DEL" => ResourceWrite::Del(arg(0)),
            "INCRBY" => ResourceWrite::IncrBy(arg(0), number(1, "increment")?),
            "HSET" => ResourceWrite::HSet(arg(0), arg(1), arg(2)),
            "RPUSH" => ResourceWrite::RPush(arg(0), arg(1)),
            "LPUSH" => ResourceWrite::LPush(arg(0), arg(1)),
            "XADD" => ResourceWrite::XAdd(arg(0), arg(1), arg(2)),
            _ => match u64::try_from(number(1, "MS")?) {
                Ok(ms) if ms > 0 => ResourceWrite::PExpire(arg(0), ms),
                _ => return Err(usage(format!("PEXPIRE's MS {:?} is not positive", args[1]))),
            },
        });
        rest = next;
    }
    Ok(writes)
}

/// `fencelock list [PATTERN]`.
pub(crate) async fn list(args: &ListArgs) -> Result<u8, Failure> {
    let client = client(&args.connection).await?;
    let pattern = if args.pattern == "*" {
        ""
    } else {
        &args.pattern
    };
    let listing = client.list(pattern).await.map_err(Failure::Lock)?;
    let locks = &listing.locks;
    if json_output() {
        let found: Vec<Value> = locks.iter().map(status_json).collect();
        let unanswered: Vec<Value> = listing
            .unanswered
            .iter()
            .map(|u| json!({ "node": u.node, "error": u.error.to_string() }))
            .collect();
        println!("{}", json!({ "locks": found, "unanswered": unanswered }));
        return Ok(0);
    }
    // Said first, so that "no lock held" below is read with it.
    for u in &listing.unanswered {
        warn(format_args!(
            "node {} could not be asked, so locks held only there are not listed: {}",
            u.node, u.error
        ));
    }
    if locks.is_empty() {
        if pattern.is_empty() {
            println!("no lock is held");
        } else {
            println!("no lock whose name matches {pattern:?} is held");
        }
        return Ok(0);
    }
    let width = locks.iter().map(|l| l.name.len()).max().unwrap_or(4).max(4);
    println!("{:width$}  {:>10}  HOLDER", "NAME", "LEASE LEFT");
    for lock in locks {
        let (left, who) = summary(lock);
        println!("{:width$}  {left:>10}  {who}", lock.name);
    }
    Ok(0)
}

/// `fencelock break NAME`.
pub(crate) async fn break_lock(args: &BreakArgs) -> Result<u8, Failure> {
    fencelock::keys::validate_name(&args.name).map_err(Failure::Lock)?;
    let client = client(&args.connection).await?;
    if !args.yes {
        if !io::stdin().is_terminal() {
            return Err(Failure::Usage(format!(
                "breaking lock {:?} needs --yes when stdin is not a terminal",
                args.name
            )));
        }
        let status = client.inspect(&args.name).await.map_err(Failure::Lock)?;
        let (left, who) = summary(&status);
        if who == "free" {
            println!("lock {:?} is free: nothing to break", args.name);
            return Ok(0);
        }
        eprint!(
            "break lock {:?}, held by {who} ({left} of its lease left)? [y/N] ",
            args.name
        );
        let _ = io::stderr().flush();
        let mut answer = String::new();
        let _ = io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("not broken");
            return Ok(1);
        }
    }
    let broken = client.break_lock(&args.name).await.map_err(Failure::Lock)?;
    if json_output() {
        let nodes: Vec<Value> = broken
            .nodes
            .iter()
            .map(|n| match &n.outcome {
                Ok(o) => json!({
                    "node": n.node,
                    "broke": o.broke.as_ref().map(holder_json),
                    "fencing_counter": o.fencing_counter,
                }),
                Err(e) => json!({ "node": n.node, "error": one_line(e) }),
            })
            .collect();
        println!("{}", json!({ "name": broken.name, "nodes": nodes }));
        return Ok(0);
    }
    for node in &broken.nodes {
        let prefix = if broken.nodes.len() > 1 {
            format!("{}: ", node.node)
        } else {
            String::new()
        };
        match &node.outcome {
            Ok(BreakOutcome {
                broke: Some(holder),
                fencing_counter,
                ..
            }) => println!(
                "{prefix}broke {} {:?} ({}); fencing counter now {}: a write with a lower token is stale",
                match holder {
                    Holder::Semaphore { .. } => "semaphore",
                    Holder::Readers { .. } => "read-write lock",
                    _ => "lock",
                },
                broken.name,
                holder_text(holder),
                fencing_counter.map_or_else(|| "unknown".to_owned(), |c| c.to_string()),
            ),
            Ok(_) => println!("{prefix}lock {:?} was free: nothing broken", broken.name),
            Err(e) => warn(format_args!("{prefix}{}", one_line(e))),
        }
    }
    Ok(0)
}

/// An error's message on one line, with its driver source if any.
fn one_line(e: &Error) -> String {
    e.to_string().replace('\n', " ")
}

/// The remaining lease and the holder of a lock, in a few words, from the first node
/// that answered.
fn summary(status: &LockStatus) -> (String, String) {
    let states: Vec<&LockState> = status
        .nodes
        .iter()
        .filter_map(|n| n.state.as_ref().ok())
        .collect();
    let held = states
        .iter()
        .find_map(|s| s.holder.as_ref().map(|h| (*s, h)));
    match held {
        None => ("-".to_owned(), "free".to_owned()),
        Some((state, holder)) => {
            let left =
                remaining(holder).map_or_else(|| "no expiry".to_owned(), |d| Human(d).to_string());
            let who = match state.leader() {
                Some(leader) => leader_text(&leader),
                None => state
                    .holder_info
                    .as_deref()
                    .map_or_else(|| holder_text(holder), info_text),
            };
            (left, who)
        }
    }
}

fn remaining(holder: &Holder) -> Option<Duration> {
    match holder {
        Holder::Plain { remaining } | Holder::Reentrant { remaining, .. } => *remaining,
        // When the next permit frees, the first reader's lease ends.
        Holder::Semaphore { held, .. } | Holder::Readers { held } => held.first().copied(),
        _ => None,
    }
}

/// A holder in words: what kind, and what is left of its lease.
fn holder_text(holder: &Holder) -> String {
    match holder {
        // Who it is, when it said, is the `held by` line (its holder info).
        Holder::Plain { remaining } => format!("one holder; {}", lease_text(*remaining)),
        Holder::Reentrant {
            owner,
            holds,
            remaining,
        } => format!(
            "held by owner {owner:?} ({holds} hold{}), {}",
            if *holds == 1 { "" } else { "s" },
            lease_text(*remaining)
        ),
        Holder::Foreign { found } => format!("a Redis {found} fencelock did not write"),
        Holder::Semaphore { permits, held } => permits_text(*permits, held),
        Holder::Readers { held } => readers_text(held),
        _ => "held".to_owned(),
    }
}

/// A semaphore's permits in words: `2 of 3 permits held (1 free), next lease ends in 4s`.
fn permits_text(permits: Option<u32>, held: &[Duration]) -> String {
    let count = match permits {
        Some(n) => format!(
            "{} of {n} permits held ({} free)",
            held.len(),
            (n as usize).saturating_sub(held.len())
        ),
        None => format!("{} permits held", held.len()),
    };
    match held.first() {
        Some(d) => format!("{count}, the first lease ends in {}", Human(*d)),
        None => count,
    }
}

/// A read-write lock's readers in words: `3 readers, the first lease ends in 4s`.
fn readers_text(held: &[Duration]) -> String {
    let count = match held.len() {
        1 => "1 reader".to_owned(),
        n => format!("{n} readers"),
    };
    match held.first() {
        Some(d) => format!("{count}, the first lease ends in {}", Human(*d)),
        None => count,
    }
}

fn lease_text(remaining: Option<Duration>) -> String {
    match remaining {
        Some(d) => format!("its lease ends in {}", Human(d)),
        None => "its key has no expiry".to_owned(),
    }
}

/// What `run` said about itself, in words: `sleep 100 (pid 42 on host-a), for 2m10s`.
pub(crate) fn info_text(info: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(info) else {
        return info.to_owned();
    };
    let mut text = v["command"].as_str().unwrap_or("?").to_owned();
    if let (Some(pid), Some(host)) = (v["pid"].as_u64(), v["host"].as_str()) {
        text.push_str(&format!(" (pid {pid} on {host})"));
    }
    if let Some(since) = v["since_ms"].as_u64() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        text.push_str(&format!(
            ", for {}",
            Human(Duration::from_millis(now.saturating_sub(since)))
        ));
    }
    text
}

/// An election's leader in words: its term, for how long, and who it is.
fn leader_text(leader: &fencelock::Leader) -> String {
    let led_for = SystemTime::now()
        .duration_since(leader.since)
        .unwrap_or_default();
    let who = if leader.info.is_empty() {
        "a leader that says nothing about itself".to_owned()
    } else {
        info_text(&leader.info)
    };
    format!(
        "term {}, leading for {}: {who}",
        leader.term,
        Human(led_for)
    )
}

/// `status` for people.
fn status_text(status: &LockStatus) -> String {
    let mut out = String::new();
    let redlock = status.nodes.len() > 1;
    let (_, who) = summary(status);
    let kind = kind_text(status);
    out.push_str(&format!(
        "{} {:?}: {}\n",
        kind,
        status.name,
        match (who.as_str(), kind) {
            ("free", _) => "free",
            (_, "election") => "led",
            _ => "held",
        }
    ));
    for node in &status.nodes {
        let indent = if redlock {
            out.push_str(&format!("  {}:\n", node.node));
            "    "
        } else {
            "  "
        };
        if let Some(left) = node.restart_protection {
            out.push_str(&format!(
                "{indent}restart protection: the server restarted recently; its grants do not \
                 count for {} more\n",
                Human(left)
            ));
        }
        match &node.state {
            Err(e) => out.push_str(&format!("{indent}unreachable: {}\n", one_line(e))),
            Ok(state) => {
                holder_lines(&mut out, indent, state);
                waiter_lines(&mut out, indent, state);
            }
        }
    }
    out
}

/// What the nodes say a name is: a semaphore, an election, a read-write lock, or a lock.
fn kind_text(status: &LockStatus) -> &'static str {
    let states = || status.nodes.iter().filter_map(|n| n.state.as_ref().ok());
    if states()
        .any(|s| matches!(s.holder, Some(Holder::Semaphore { .. })) || s.idle_semaphore.is_some())
    {
        "semaphore"
    } else if states().any(|s| s.leader().is_some()) {
        "election"
    } else if states()
        .any(|s| s.writers_waiting > 0 || matches!(s.holder, Some(Holder::Readers { .. })))
    {
        "read-write lock"
    } else {
        "lock"
    }
}

/// A node's lines about who holds the name, and its fencing counter.
fn holder_lines(out: &mut String, indent: &str, state: &LockState) {
    match &state.holder {
        None => match state.idle_semaphore {
            Some(n) => out.push_str(&format!(
                "{indent}permits: 0 of {n} held ({n} free); a lock cannot take \
                 this name while its permit count is recorded\n"
            )),
            None => out.push_str(&format!("{indent}holder: none\n")),
        },
        Some(holder) => {
            out.push_str(&format!("{indent}holder: {}\n", holder_text(holder)));
            if let Some(leader) = state.leader() {
                out.push_str(&format!("{indent}leader: {}\n", leader_text(&leader)));
            } else if let Some(info) = &state.holder_info {
                out.push_str(&format!("{indent}held by: {}\n", info_text(info)));
            }
        }
    }
    out.push_str(&format!(
        "{indent}fencing counter: {}\n",
        state
            .fencing_counter
            .map_or_else(|| "none yet".to_owned(), |c| c.to_string())
    ));
}

/// A node's lines about who waits for the name: its fair queue, its writers waiting, the
/// clients on its wake list.
fn waiter_lines(out: &mut String, indent: &str, state: &LockState) {
    if !state.waiters.is_empty() {
        out.push_str(&format!(
            "{indent}fair queue: {} waiting\n",
            state.waiters.len()
        ));
        for (place, waiter) in state.waiters.iter().enumerate() {
            let who = waiter.info.as_deref().map_or_else(
                || "a waiter that says nothing about itself".to_owned(),
                info_text,
            );
            out.push_str(&format!("{indent}  {}. {who}\n", place + 1));
        }
    }
    if state.writers_waiting > 0 {
        out.push_str(&format!(
            "{indent}writers waiting: {} (new readers go after them)\n",
            state.writers_waiting
        ));
    }
    if !state.waiting_clients.is_empty() {
        out.push_str(&format!(
            "{indent}clients waiting: {} (each client, such as one process, counts once however many of its acquires wait; a release wakes the first)\n",
            state.waiting_clients.len()
        ));
        for (place, waiting) in state.waiting_clients.iter().enumerate() {
            let who = if waiting.client == "*" {
                "readers or reentrant owners (a release wakes them all)".to_owned()
            } else {
                format!("client {}", waiting.client)
            };
            out.push_str(&format!(
                "{indent}  {}. {who}, waiting for {}\n",
                place + 1,
                Human(waiting.listed_for)
            ));
        }
    }
}

fn holder_json(holder: &Holder) -> Value {
    match holder {
        Holder::Plain { remaining } => json!({
            "kind": "plain",
            "remaining_ms": remaining.map(|d| d.as_millis() as u64),
        }),
        Holder::Reentrant {
            owner,
            holds,
            remaining,
        } => json!({
            "kind": "reentrant",
            "owner": owner,
            "holds": holds,
            "remaining_ms": remaining.map(|d| d.as_millis() as u64),
        }),
        Holder::Foreign { found } => json!({ "kind": "foreign", "found": found }),
        Holder::Semaphore { permits, held } => json!({
            "kind": "semaphore",
            "permits": permits,
            "held": held.len(),
            "free": permits.map(|n| (n as usize).saturating_sub(held.len())),
            "remaining_ms": held.iter().map(|d| d.as_millis() as u64).collect::<Vec<_>>(),
        }),
        Holder::Readers { held } => json!({
            "kind": "readers",
            "readers": held.len(),
            "remaining_ms": held.iter().map(|d| d.as_millis() as u64).collect::<Vec<_>>(),
        }),
        _ => json!({ "kind": "unknown" }),
    }
}

/// Holder info as JSON: `run`'s own object, or another writer's text as a string.
fn info_json(info: &str) -> Value {
    serde_json::from_str::<Value>(info).unwrap_or_else(|_| Value::String(info.to_owned()))
}

/// `status` (and each entry of `list`) as JSON.
pub(crate) fn status_json(status: &LockStatus) -> Value {
    let nodes: Vec<Value> = status
        .nodes
        .iter()
        .map(|n| {
            let mut node = status_node_json(n);
            if let Some(left) = n.restart_protection {
                node["restart_protection_ms"] = json!(left.as_millis() as u64);
            }
            node
        })
        .collect();
    let held = status
        .nodes
        .iter()
        .any(|n| n.state.as_ref().is_ok_and(|s| s.holder.is_some()));
    json!({ "name": status.name, "held": held, "nodes": nodes })
}

fn status_node_json(n: &fencelock::NodeStatus) -> Value {
    match &n.state {
        Err(e) => json!({ "node": n.node, "error": one_line(e) }),
        Ok(state) => json!({
            "node": n.node,
            "held": state.holder.is_some(),
            "holder": state.holder.as_ref().map(holder_json),
            "holder_info": state.holder_info.as_deref().map(info_json),
            "leader": state.leader().map(|l| json!({
                "term": l.term.get(),
                "since_ms": l.since.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
                "info": info_json(&l.info),
            })),
            "fencing_counter": state.fencing_counter,
            "waiters": state.waiters.iter().map(|w| json!({
                "purged_in_ms": w.timeout_left.map(|d| d.as_millis() as u64),
                "info": w.info.as_deref().map(info_json),
            })).collect::<Vec<_>>(),
            "writers_waiting": state.writers_waiting,
            "idle_semaphore": state.idle_semaphore.map(|n| json!({ "permits": n })),
            "waiting_clients": state.waiting_clients.iter().map(|w| json!({
                "client": w.client,
                "listed_ms": w.listed_for.as_millis() as u64,
            })).collect::<Vec<_>>(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_read_by_their_arity_and_bad_ones_say_the_forms() {
        let words = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            parse_writes(&words("set k v incrby n -2 hset h f v del d pexpire k 50")).unwrap(),
            [
                ResourceWrite::Set("k".into(), "v".into()),
                ResourceWrite::IncrBy("n".into(), -2),
                ResourceWrite::HSet("h".into(), "f".into(), "v".into()),
                ResourceWrite::Del("d".into()),
                ResourceWrite::PExpire("k".into(), 50),
            ]
        );
        for bad in [
            "GET k",
            "SET k",
            "INCRBY n x",
            "PEXPIRE k 0",
            "PEXPIRE k -5",
        ] {
            match parse_writes(&words(bad)) {
                Err(Failure::Usage(m)) => assert!(m.contains("a WRITE is one of"), "{bad}: {m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    fn has_password(args: &[&str]) -> bool {
        password_in_args(args.iter().map(std::ffi::OsString::from))
    }

    #[test]
    fn a_password_on_the_command_line_is_noticed() {
        for args in [
            &["run", "--pass", "x", "job", "--", "true"][..],
            &["run", "-a", "x", "job", "--", "true"],
            &["run", "-ax", "job", "--", "true"],
            &["run", "--pass=x", "job", "--", "true"],
            &["status", "--redis", "redis://u:pw@h:1", "job"],
            &["status", "--redis=redis://:pw@h:1/0", "job"],
            &[
                "list",
                "--redis",
                "redis+sentinel://h:1/s?sentinel_password=pw",
            ],
            &["list", "--redis", "redis://h:1,redis://:pw@h:2,redis://h:3"],
            &["list", "--redis", "redis+unix:///tmp/r.sock?db=1&pass=pw"],
        ] {
            assert!(has_password(args), "{args:?}");
        }
        for args in [
            &["run", "job", "--", "mysql", "-a", "--pass", "x"][..],
            &["status", "--redis", "redis://u@h:1", "job"],
            &["status", "--redis", "redis://h:1/0?x=a:b@c", "job"],
            &["run", "--password-file", "/run/secret", "job", "--", "true"],
        ] {
            assert!(!has_password(args), "{args:?}");
        }
    }
}
