//! The operators' subcommands (`status`, `list`, `break`), `--json` and its schema,
//! `completions` and `man`, end to end: the real binary against real redis-servers.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use testkit::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

/// Runs `fencelock args` to the end, with `FENCELOCK_REDIS` pointing at `redis`.
fn fencelock(redis: &RedisServer, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FENCELOCK_REDIS", redis.url())
        .stdin(Stdio::null())
        .output()
        .expect("run fencelock")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A `fencelock run NAME -- sleep 60` in the background, once it holds the lock.
struct Holder(Child);

impl Holder {
    fn start(redis: &RedisServer, extra: &[&str], name: &str) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.arg("run")
            .args(extra)
            .arg(name)
            .args(["--", "sleep", "60"])
            .env("FENCELOCK_REDIS", redis.url())
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        let holder = Self(cmd.spawn().expect("spawn fencelock"));
        let key = format!("fencelock:{{{name}}}");
        testkit::eventually("the lock is taken", Duration::from_secs(10), || {
            redis.exists(&key)
        });
        holder
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn parse(out: &Output) -> Value {
    serde_json::from_str(stdout(out).trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(out)))
}

#[test]
fn status_says_who_holds_a_lock_for_people_and_as_json() {
    let redis = RedisServer::start();
    let free = fencelock(&redis, &["status", "job"]);
    assert_eq!(free.status.code(), Some(0), "{free:?}");
    assert!(stdout(&free).contains("lock \"job\": free"), "{free:?}");

    let holder = Holder::start(&redis, &[], "job");
    let out = fencelock(&redis, &["status", "job"]);
    let text = stdout(&out);
    assert!(text.contains("lock \"job\": held"), "{text}");
    assert!(text.contains("sleep 60"), "who: {text}");
    assert!(text.contains(&format!("pid {}", holder.0.id())), "{text}");
    assert!(text.contains("fencing counter"), "{text}");

    // The JSON schema, as the guide's CLI chapter documents it.
    let v = parse(&fencelock(&redis, &["--json", "status", "job"]));
    assert_eq!(v["name"], "job");
    assert_eq!(v["held"], true);
    let node = &v["nodes"][0];
    assert_eq!(node["node"], redis.addr());
    assert_eq!(node["held"], true);
    assert_eq!(node["holder"]["kind"], "plain");
    assert!(node["holder"]["remaining_ms"].as_u64().unwrap() > 25_000);
    assert_eq!(node["holder_info"]["command"], "sleep 60");
    assert_eq!(node["holder_info"]["pid"], holder.0.id());
    assert!(node["holder_info"]["host"].is_string());
    assert!(node["holder_info"]["since_ms"].is_u64());
    assert!(node["fencing_counter"].is_u64());
    assert_eq!(node["waiters"], Value::Array(Vec::new()));
}

/// A plain lock's waiting runs are listed from its wake list (the client that a release
/// wakes first, first), for people and as JSON.
#[test]
fn status_lists_the_clients_waiting_for_a_plain_lock() {
    let redis = RedisServer::start();
    let _holder = Holder::start(&redis, &[], "plainq");
    let free = parse(&fencelock(&redis, &["--json", "status", "plainq"]));
    assert_eq!(
        free["nodes"][0]["waiting_clients"],
        Value::Array(Vec::new())
    );
    let waiter = Command::new(BIN)
        .args(["run", "--wait", "60s", "plainq", "--", "echo", "next"])
        .env("FENCELOCK_REDIS", redis.url())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _waiter = Holder(waiter);
    testkit::eventually("the waiter is listed", Duration::from_secs(10), || {
        redis.cmd(&["ZCARD", "fencelock:{plainq}:wakes"]).as_int() == Some(1)
    });
    let tag = redis.cmd(&["ZRANGE", "fencelock:{plainq}:wakes", "0", "0"]);
    let tag = tag.as_array().unwrap()[0].as_str().unwrap().to_owned();
    let text = stdout(&fencelock(&redis, &["status", "plainq"]));
    assert!(text.contains("clients waiting: 1 (each client"), "{text}");
    assert!(
        text.contains(&format!("1. client {tag}, waiting for ")),
        "{text}"
    );
    let v = parse(&fencelock(&redis, &["--json", "status", "plainq"]));
    let listed = &v["nodes"][0]["waiting_clients"];
    assert_eq!(listed[0]["client"], tag.as_str(), "{v}");
    assert!(listed[0]["listed_ms"].is_u64(), "{v}");
}

/// Two waiting acquires of one client (two requests of one service process) are one
/// client on the wake list: status says it counts clients, not the acquires they wait
/// with.
#[test]
fn status_counts_clients_and_says_so() {
    let redis = RedisServer::start();
    let _holder = Holder::start(&redis, &[], "twoq");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt
        .block_on(fencelock::Client::connect(&redis.url()))
        .unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let client = client.clone();
            rt.spawn(async move {
                client
                    .lock("twoq")
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
            })
        })
        .collect();
    testkit::eventually("both acquires wait", Duration::from_secs(10), || {
        client.stats().waiters == 2
    });
    let text = stdout(&fencelock(&redis, &["status", "twoq"]));
    assert!(
        text.contains("clients waiting: 1 (each client, such as one process, counts once however many of its acquires wait"),
        "{text}"
    );
    for w in waiters {
        w.abort();
    }
}

/// A semaphore with no permit held is still a semaphore while its permit count is
/// recorded: a plain run of its name is refused (and the other way round: a semaphore
/// run of a free lock's name), and status says what it is.
#[test]
fn an_idle_semaphore_keeps_its_name_and_status_says_so() {
    let redis = RedisServer::start();
    let sem = fencelock(&redis, &["run", "--permits", "2", "pool", "--", "true"]);
    assert_eq!(sem.status.code(), Some(0), "{sem:?}");
    assert!(!redis.exists("fencelock:{pool}"), "no permit held");
    let plain = fencelock(&redis, &["run", "pool", "--", "true"]);
    assert_eq!(plain.status.code(), Some(69), "{plain:?}");
    assert!(
        stderr(&plain).contains("the name holds a semaphore (whether or not a permit is held now)"),
        "{plain:?}"
    );
    // ... and says which option takes it.
    assert!(
        stderr(&plain).contains("it is a semaphore: take it with --permits N"),
        "{plain:?}"
    );
    let text = stdout(&fencelock(&redis, &["status", "pool"]));
    assert!(text.contains("semaphore \"pool\": free"), "{text}");
    assert!(text.contains("permits: 0 of 2 held (2 free)"), "{text}");
    let v = parse(&fencelock(&redis, &["--json", "status", "pool"]));
    assert_eq!(v["held"], false, "{v}");
    assert_eq!(v["nodes"][0]["idle_semaphore"]["permits"], 2, "{v}");
    // A semaphore is refused a free lock's name in turn.
    let lock = fencelock(&redis, &["run", "plain", "--", "true"]);
    assert_eq!(lock.status.code(), Some(0), "{lock:?}");
    let sem = fencelock(&redis, &["run", "--permits", "2", "plain", "--", "true"]);
    assert_eq!(sem.status.code(), Some(69), "{sem:?}");
    assert!(stderr(&sem).contains("the name is a lock's"), "{sem:?}");
    assert!(
        stderr(&sem).contains("it is a lock: take it without --permits"),
        "{sem:?}"
    );
    let v = parse(&fencelock(&redis, &["--json", "status", "plain"]));
    assert_eq!(v["nodes"][0]["idle_semaphore"], Value::Null, "{v}");
}

/// A fair queue's waiters are listed in line order with who each is (command and pid,
/// from the holder info each will hold the lock with), for people and as JSON.
#[test]
fn status_lists_a_fair_queues_waiters_with_who_they_are() {
    let redis = RedisServer::start();
    let _holder = Holder::start(&redis, &["--fair"], "line");
    let waiter = Command::new(BIN)
        .args([
            "run", "--fair", "--wait", "60s", "line", "--", "echo", "next",
        ])
        .env("FENCELOCK_REDIS", redis.url())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let waiter = Holder(waiter);
    testkit::eventually("the waiter queued", Duration::from_secs(10), || {
        redis.cmd(&["LLEN", "fencelock:{line}:queue"]).as_int() == Some(1)
    });
    let text = stdout(&fencelock(&redis, &["status", "line"]));
    assert!(text.contains("fair queue: 1 waiting"), "{text}");
    assert!(
        text.contains(&format!("1. echo next (pid {} on ", waiter.0.id())),
        "{text}"
    );
    let v = parse(&fencelock(&redis, &["--json", "status", "line"]));
    let queued = &v["nodes"][0]["waiters"][0];
    assert_eq!(queued["info"]["command"], "echo next");
    assert_eq!(queued["info"]["pid"], waiter.0.id());
    assert!(queued["purged_in_ms"].is_u64(), "{queued}");
    assert!(v["nodes"][0].get("restart_protection_ms").is_none(), "{v}");
}

#[test]
fn list_shows_the_held_locks_matching_a_pattern() {
    let redis = RedisServer::start();
    let _a = Holder::start(&redis, &[], "orders:1");
    let _b = Holder::start(&redis, &[], "stock:1");
    let out = fencelock(&redis, &["list", "orders:*"]);
    let text = stdout(&out);
    assert!(
        text.contains("orders:1") && !text.contains("stock:1"),
        "{text}"
    );
    assert!(
        text.lines().next().unwrap().contains("LEASE LEFT"),
        "{text}"
    );
    let all = parse(&fencelock(&redis, &["--json", "list"]));
    let names: Vec<&str> = all["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["orders:1", "stock:1"]);
    let none = fencelock(&redis, &["list", "nothing:*"]);
    assert_eq!(
        stdout(&none).trim(),
        r#"no lock whose name matches "nothing:*" is held"#,
        "{none:?}"
    );
}

#[test]
fn break_needs_yes_off_a_terminal_then_frees_the_lock_and_the_holder_is_stopped() {
    let redis = RedisServer::start();
    let mut holder = Holder::start(&redis, &["--ttl", "900ms"], "stuck");
    let refused = fencelock(&redis, &["break", "stuck"]);
    assert_eq!(refused.status.code(), Some(64), "{refused:?}");
    assert!(stderr(&refused).contains("--yes"), "{refused:?}");
    assert!(
        redis.exists("fencelock:{stuck}"),
        "nothing broken without --yes"
    );

    let out = fencelock(&redis, &["--json", "break", "--yes", "stuck"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = parse(&out);
    assert_eq!(v["nodes"][0]["broke"]["kind"], "plain");
    let counter = v["nodes"][0]["fencing_counter"].as_u64().unwrap();
    assert!(!redis.exists("fencelock:{stuck}"));
    assert_eq!(
        redis.get("fencelock:{stuck}:fence"),
        Some(counter.to_string())
    );
    // The evicted holder hears of it at its next renewal and stops its COMMAND: 76.
    let status = holder.0.wait().unwrap();
    assert_eq!(status.code(), Some(76));

    let again = fencelock(&redis, &["break", "--yes", "stuck"]);
    assert!(stdout(&again).contains("was free"), "{again:?}");
}

#[test]
fn errors_are_one_line_for_people_and_one_json_object_with_the_exit_status() {
    let redis = RedisServer::start();
    let _holder = Holder::start(&redis, &[], "busy");
    let out = fencelock(&redis, &["run", "busy", "--", "true"]);
    assert_eq!(out.status.code(), Some(75));
    let text = stderr(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with("fencelock: lock \"busy\" is not free"),
        "{text}"
    );
    assert!(
        text.contains("--wait") && !text.contains("defer"),
        "advice that applies: {text}"
    );

    let out = fencelock(&redis, &["--json", "run", "busy", "--", "true"]);
    let line: Value = serde_json::from_str(stderr(&out).trim()).unwrap();
    assert_eq!(line["level"], "error");
    assert_eq!(line["exit"], 75);
    assert!(line["message"].as_str().unwrap().contains("busy"));

    // A server that is not Redis at all: still one line.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Answers every connection (the client reconnects after a reply it cannot read);
    // the thread ends with the test binary.
    std::thread::spawn(move || {
        use std::io::Write;
        for mut s in listener.incoming().flatten() {
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let out = Command::new(BIN)
        .args([
            "run",
            "--redis",
            &format!("redis://127.0.0.1:{port}"),
            "x",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert_eq!(stderr(&out).lines().count(), 1, "{out:?}");
    assert!(
        stderr(&out).contains("does not answer in Redis's protocol"),
        "says it is not Redis: {out:?}"
    );
}

#[test]
fn completions_and_the_man_page_come_from_the_same_definitions() {
    let redis = RedisServer::start();
    for shell in ["bash", "zsh", "fish"] {
        let out = fencelock(&redis, &["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}: {out:?}");
        let text = stdout(&out);
        for word in ["run", "status", "list", "break", "max-hold"] {
            assert!(text.contains(word), "{shell} completes {word}");
        }
    }
    let man = fencelock(&redis, &["man"]);
    let text = stdout(&man);
    assert!(
        text.starts_with(".ie") || text.contains(".TH"),
        "roff: {text:.200}"
    );
    assert!(
        text.contains("fencelock") && text.contains("status"),
        "{text:.400}"
    );
    let bad = fencelock(&redis, &["completions", "cmd.exe"]);
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
}

#[test]
fn completions_and_the_man_page_into_a_closed_pipe_end_quietly() {
    for args in [
        &["completions", "bash"][..],
        &["completions", "zsh"],
        &["completions", "fish"],
        &["man"],
        &["man", "run"],
    ] {
        // A reader gone before the first byte (`| head -0`): every write fails.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(BIN)
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(out.stderr.is_empty(), "{args:?}: {out:?}");
    }
}

/// The exit statuses `run` documents, as the tags of the EXIT STATUS items.
const EXIT_CODES: [&str; 9] = [
    "COMMAND's",
    "64",
    "69",
    "70",
    "75",
    "76",
    "126",
    "127",
    "128+N",
];

/// `fencelock args` to the end, without Redis: stdout, once it exited 0.
fn fencelock_ok(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run fencelock");
    assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
    stdout(&out)
}

/// Roff source as text: escapes and font changes undone.
fn roff_text(roff: &str) -> String {
    roff.replace(r"\-", "-")
        .replace(r"\*(Aq", "'")
        .replace(r"\fB", "")
        .replace(r"\fI", "")
        .replace(r"\fR", "")
}

/// The lines of `section` (from its `.SH` to the next) of a roff page.
fn roff_section<'a>(page: &'a str, section: &str) -> Vec<&'a str> {
    let heading = format!(".SH {section}");
    let quoted = format!(".SH \"{section}\"");
    page.lines()
        .skip_while(|line| *line != heading && *line != quoted)
        .skip(1)
        .take_while(|line| !line.starts_with(".SH "))
        .collect()
}

#[test]
fn man_pages_for_every_subcommand_with_run_options_and_an_exit_item_per_code() {
    let dir = tempfile::tempdir().unwrap();
    let written = fencelock_ok(&["man", "--dir", dir.path().to_str().unwrap()]);
    let mut files: Vec<String> = written
        .lines()
        .map(|path| {
            let path = std::path::Path::new(path);
            assert_eq!(path.parent(), Some(dir.path()), "{written}");
            path.file_name().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    files.sort();
    let mut on_disk: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    assert_eq!(files, on_disk, "the paths printed are the pages written");
    let page = |file: &str| std::fs::read_to_string(dir.path().join(file)).unwrap();

    // `man` alone prints fencelock(1) as before, and it is the page `--dir` writes.
    let top = fencelock_ok(&["man"]);
    assert_eq!(top, page("fencelock.1"));
    assert!(top.contains(".TH fencelock 1"), "{top:.300}");
    // Every subcommand the page names has a page of its own, and no other page is
    // written (no `help`, no hidden watcher).
    let named: Vec<String> = roff_section(&top, "SUBCOMMANDS")
        .iter()
        .filter_map(|line| roff_text(line).strip_suffix("(1)").map(str::to_owned))
        .collect();
    for sub in ["run", "status", "list", "break", "completions", "man"] {
        assert!(
            named.contains(&format!("fencelock-{sub}")),
            "{sub}: {named:?}"
        );
    }
    let mut expected: Vec<String> = named.iter().map(|name| format!("{name}.1")).collect();
    expected.push("fencelock.1".to_owned());
    expected.sort();
    assert_eq!(files, expected);

    // A subcommand's page, on stdout as in DIR: its own options and the global ones.
    let run = fencelock_ok(&["man", "run"]);
    assert_eq!(run, page("fencelock-run.1"));
    assert!(run.contains(".TH fencelock-run 1"), "{run:.300}");
    let options = roff_text(&roff_section(&run, "OPTIONS").join("\n"));
    for option in [
        "--ttl <DURATION>",
        "--wait <DURATION>",
        "--fair",
        "--kill-grace <DURATION>",
        "--max-hold <DURATION>",
        "--redis <URL>",
        "--permits <N>",
        "--json",
    ] {
        assert!(
            options.contains(option),
            "run's page lacks {option}: {options}"
        );
    }
    let status = page("fencelock-status.1");
    assert!(roff_text(&status).contains("fencelock status"), "{status}");
    assert!(roff_text(&roff_section(&status, "SEE ALSO").join("")).contains("fencelock(1)"));

    // The exit statuses: one `.TP` item per code, its tag on the line after the `.TP`
    // and its text on the next, never a table laid out with spaces (that roff refills).
    for (file, text) in [("fencelock.1", &top), ("fencelock-run.1", &run)] {
        let section = roff_section(text, "EXIT STATUS");
        let tags: Vec<String> = section
            .windows(2)
            .filter(|pair| pair[0].starts_with(".TP"))
            .map(|pair| roff_text(pair[1]))
            .collect();
        assert_eq!(tags, EXIT_CODES, "{file}: {section:#?}");
        assert_eq!(section.len(), 3 * EXIT_CODES.len(), "{file}: {section:#?}");
        assert!(
            section.iter().all(|line| !line.contains("  ")),
            "{file}: {section:#?}"
        );
    }

    // And as `man` shows it, when groff is installed: at 80 columns, each code starts a
    // line of the section, every other line being the continuation of an item's text.
    let groff = Command::new("groff")
        .args(["-man", "-Tutf8", "-P-cbou", "-rLL=80n"])
        .arg(dir.path().join("fencelock-run.1"))
        .output();
    if let Some(out) = groff.ok().filter(|out| out.status.success()) {
        let shown = stdout(&out);
        let section: Vec<&str> = shown
            .lines()
            .skip_while(|line| *line != "EXIT STATUS")
            .skip(1)
            .take_while(|line| line.is_empty() || line.starts_with(' '))
            .filter(|line| !line.trim().is_empty())
            .collect();
        let indent = |line: &str| line.len() - line.trim_start().len();
        let tag_column = section.iter().map(|line| indent(line)).min().unwrap();
        let starts: Vec<&str> = section
            .iter()
            .filter(|line| indent(line) == tag_column)
            .map(|line| line.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(starts, EXIT_CODES, "{shown}");
        assert!(
            section
                .iter()
                .all(|line| indent(line) == tag_column || indent(line) > tag_column + 9),
            "{section:#?}"
        );
    }
}

#[test]
fn json_run_messages_say_the_lock_is_held_and_when_redis_stops_answering() {
    let mut redis = RedisServer::start();
    let mut child = Command::new(BIN)
        .args([
            "--json", "run", "--ttl", "1500ms", "slow", "--", "sleep", "10",
        ])
        .env("FENCELOCK_REDIS", redis.url())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Paused once fencelock says it holds the lock (the key alone may be there before
    // the grant's reply has left a server paused in between).
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut text = String::new();
    std::io::BufRead::read_line(&mut err, &mut text).unwrap();
    redis.pause();
    std::io::Read::read_to_string(&mut err, &mut text).unwrap();
    let status = child.wait().unwrap();
    redis.resume();
    assert_eq!(status.code(), Some(76), "{status:?}: {text}");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let messages: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l["level"].as_str().unwrap(), l["message"].as_str().unwrap()))
        .collect();
    assert!(
        messages[0].0 == "notice" && messages[0].1.contains("holding lock"),
        "{messages:?}"
    );
    let silent = messages
        .iter()
        .position(|(_, m)| m.contains("Redis not answering"))
        .unwrap_or_else(|| panic!("{messages:?}"));
    let lost = messages
        .iter()
        .position(|(l, m)| *l == "error" && m.contains("was lost"))
        .unwrap_or_else(|| panic!("{messages:?}"));
    assert!(silent < lost, "told before the loss: {messages:?}");
}

#[test]
fn a_redlock_node_in_restart_quarantine_is_named_with_the_option_that_turns_it_off() {
    // Just started: every node is younger than the 30 s restart protection.
    let servers = RedisServer::start_many(3);
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let out = Command::new(BIN)
        .args(["run", "--wait", "1s", "q", "--", "true"])
        .env("FENCELOCK_REDIS", urls.join(","))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let text = stderr(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("restart protection keeps its vote out")
            && text.contains("--restart-protection 0"),
        "{text}"
    );
    // With the protection off, the same nodes grant it.
    let out = Command::new(BIN)
        .args(["run", "--restart-protection", "0", "q", "--", "true"])
        .env("FENCELOCK_REDIS", urls.join(","))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn replicas_n_refuses_a_grant_no_replica_acknowledged_with_69() {
    let redis = RedisServer::start(); // a master without replicas
    let out = fencelock(
        &redis,
        &["run", "--replicas", "1", "--ttl", "1s", "r", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let text = stderr(&out);
    assert!(text.contains("0 of 1 replicas"), "{text}");
    assert!(!redis.exists("fencelock:{r}"), "released again");
}

#[test]
fn run_and_status_take_a_sentinel_url() {
    let group = testkit::SentinelGroup::start();
    let out = Command::new(BIN)
        .args([
            "run",
            "--redis",
            &group.url(),
            "s",
            "--",
            "sh",
            "-c",
            "echo $FENCELOCK_TOKEN",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).trim().parse::<u64>().is_ok(), "{out:?}");
    let status = Command::new(BIN)
        .args(["--json", "status", "--redis", &group.url(), "s"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(stdout(&status).trim()).unwrap();
    assert_eq!(v["nodes"][0]["node"], group.master_addr());
}

#[test]
fn a_server_that_can_evict_lock_keys_is_said_by_status_and_once_by_run() {
    let evicting = RedisServer::builder()
        .args(["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"])
        .start();
    let warning = "may evict lock keys before their lease ends (maxmemory-policy volatile-lru";

    let out = fencelock(&evicting, &["status", "stock"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.lines().any(|l| l.starts_with("warning: ")
            && l.contains(warning)
            && l.contains(&evicting.addr())),
        "{text}"
    );
    let json = parse(&fencelock(&evicting, &["--json", "status", "stock"]));
    assert_eq!(json["eviction"][0]["policy"], "volatile-lru");
    assert_eq!(json["eviction"][0]["maxmemory"], 64u64 << 20);
    assert_eq!(json["eviction"][0]["counters_too"], false);

    // `run` says it once, on stderr, and runs COMMAND.
    let out = fencelock(&evicting, &["run", "stock", "--", "echo", "ran"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "ran\n");
    let err = stderr(&out);
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("fencelock: warning: ") && l.contains(warning))
            .count(),
        1,
        "{err}"
    );

    // The default server: nothing said.
    let safe = RedisServer::start();
    let out = fencelock(&safe, &["run", "stock", "--", "true"]);
    assert!(!stderr(&out).contains("evict"), "{}", stderr(&out));
    let out = fencelock(&safe, &["status", "stock"]);
    assert!(!stdout(&out).contains("evict"), "{}", stdout(&out));
    assert_eq!(
        parse(&fencelock(&safe, &["--json", "status", "stock"]))["eviction"],
        serde_json::json!([])
    );
}

/// A server on a Unix socket, by `redis+unix://` and `unix://`: `run` runs COMMAND under
/// the lock there and `status` reads it.
#[test]
fn unix_socket_urls_reach_a_server_on_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock");
    let socket = socket.to_str().unwrap();
    let redis = RedisServer::builder()
        .args(["--unixsocket", socket, "--unixsocketperm", "700"])
        .start();
    for url in [format!("redis+unix://{socket}"), format!("unix://{socket}")] {
        let out = Command::new(BIN)
            .args(["run", "--redis", &url, "sock", "--", "sh", "-c"])
            .arg(r#"echo "token $FENCELOCK_TOKEN""#)
            .output()
            .unwrap();
        assert!(out.status.success(), "{url}: {out:?}");
        assert!(stdout(&out).starts_with("token "), "{url}: {out:?}");
        let status = Command::new(BIN)
            .args(["status", "--redis", &url, "sock"])
            .output()
            .unwrap();
        assert!(
            stdout(&status).contains("fencing counter"),
            "{url}: {status:?}"
        );
    }
    assert!(
        redis.get("fencelock:{sock}:fence").is_some(),
        "taken on that server"
    );
}

/// A database index the server does not have is one line that says so, with no advice
/// about credentials, and exit 69.
#[test]
fn a_bad_database_index_is_one_line_without_credentials_advice() {
    let redis = RedisServer::start();
    let url = format!("{}/99", redis.url());
    let out = Command::new(BIN)
        .args(["run", "--redis", &url, "db", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("DB index is out of range"), "{err}");
    assert!(!err.to_lowercase().contains("password"), "{err}");
}
