//! Every example in `examples/` run as a user would run it, as its own process against
//! servers of the test kit, and its output checked. `cargo test` builds the examples
//! (with `--all-features`, those that need a database feature too); this test finds
//! them next to its own binary.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use testkit::{Postgres, RedisServer};

/// The built example `name`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo test -p fencelock --all-features` (which builds the \
         examples), not this test alone",
        path.display()
    );
    path
}

/// Runs the example `name` with `env`, up to 60 s.
fn run(name: &str, env: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = Command::new(example(name));
    cmd.envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn finish(name: &str, child: std::process::Child) -> (Output, String) {
    let out = child.wait_with_output().expect("wait");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} exited {:?}\nstdout:\n{text}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

/// Two blocking programs at once take turns on one lock: both write their report, with
/// rising tokens, and leave the lock free.
#[test]
fn blocking_programs_take_turns_and_leave_the_lock_free() {
    let r = RedisServer::start();
    let url = r.url();
    let env = [("FENCELOCK_REDIS", url.as_str()), ("WORK_MS", "500")];
    let first = run("blocking", &env);
    testkit::eventually("the first holds the lock", Duration::from_secs(10), || {
        r.exists("fencelock:{reports:daily}")
    });
    let second = run("blocking", &env);
    let token = |text: &str| -> u64 {
        let line = text.lines().next().unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (_, a) = finish("blocking", first);
    let (_, b) = finish("blocking", second);
    assert!(a.ends_with("done\n") && b.ends_with("done\n"), "{a}{b}");
    assert!(token(&b) > token(&a), "{a}{b}");
    assert!(!r.exists("fencelock:{reports:daily}"));
}

#[test]
fn once_at_a_time_runs_the_job_on_one_host_and_skips_it_on_the_others() {
    let r = RedisServer::start();
    let url = r.url();
    let env = [("FENCELOCK_REDIS", url.as_str()), ("JOB_MS", "1500")];
    let first = run("once_at_a_time", &env);
    // The second starts once the first holds the lock.
    testkit::eventually("the first holds the lock", Duration::from_secs(10), || {
        r.exists("fencelock:{jobs:nightly-report}")
    });
    let second = run("once_at_a_time", &env);
    let (_, a) = finish("once_at_a_time", first);
    let (_, b) = finish("once_at_a_time", second);
    assert!(a.contains("done, 42 rows"), "{a}");
    assert!(b.contains("skipped"), "{b}");
    // `run` waited for the release: nothing left behind when the process ended.
    assert!(!r.exists("fencelock:{jobs:nightly-report}"));
    // Run again alone: it does the job.
    let (_, c) = finish("once_at_a_time", run("once_at_a_time", &env));
    assert!(c.contains("done"), "{c}");
}

#[test]
fn per_order_serialises_one_orders_requests_and_times_out_the_late_ones() {
    let r = RedisServer::start();
    let url = r.url();
    // 4 requests per order, 300 ms each, 2 s of wait: every one is served, one at a time.
    let (_, text) = finish(
        "per_order",
        run(
            "per_order",
            &[("FENCELOCK_REDIS", &url), ("WORK_MS", "300")],
        ),
    );
    assert!(!text.contains("OVERLAP"), "{text}");
    for order in [42, 7] {
        let tokens: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("200 order {order} reserved")))
            .map(|l| l.rsplit(' ').next().unwrap())
            .collect();
        assert_eq!(tokens.len(), 4, "order {order}: {text}");
        let mut distinct = tokens.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "one token per holder: {text}");
    }
    // 900 ms each: the fourth request of an order cannot get the lock within 2 s.
    let (_, text) = finish(
        "per_order",
        run(
            "per_order",
            &[("FENCELOCK_REDIS", &url), ("WORK_MS", "900")],
        ),
    );
    assert!(!text.contains("OVERLAP"), "{text}");
    assert!(text.contains("409 order 42 is busy; retry"), "{text}");
    assert!(text.contains("200 order 42 reserved"), "{text}");
}

#[test]
fn api_limit_keeps_three_calls_in_flight_across_processes() {
    let r = RedisServer::start();
    let url = r.url();
    let env = [
        ("FENCELOCK_REDIS", url.as_str()),
        ("CALLS", "8"),
        ("CALL_MS", "150"),
    ];
    let children: Vec<_> = (0..2).map(|_| run("api_limit", &env)).collect();
    for child in children {
        let (_, text) = finish("api_limit", child);
        let last = text.lines().last().unwrap_or_default();
        assert!(last.starts_with("8 calls made, at most"), "{text}");
        let most: u32 = last
            .split("at most ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            (1..=3).contains(&most),
            "{most} calls in flight at once: {text}"
        );
    }
}

#[test]
fn fenced_postgres_sells_one_under_the_check() {
    let r = RedisServer::start();
    let pg = Postgres::start();
    let (redis_url, db_url) = (r.url(), pg.url());
    let env = [
        ("FENCELOCK_REDIS", redis_url.as_str()),
        ("DATABASE_URL", db_url.as_str()),
    ];
    let (_, first) = finish("fenced_postgres", run("fenced_postgres", &env));
    assert!(first.contains("; 9 left"), "{first}");
    let (_, second) = finish("fenced_postgres", run("fenced_postgres", &env));
    assert!(second.contains("; 8 left"), "{second}");
    // The check recorded the highest token it accepted for the resource.
    let accepted = pg.psql("SELECT token FROM fencelock_fence WHERE resource = 'stock:42'");
    assert!(
        accepted.trim().parse::<u64>().is_ok_and(|t| t >= 2),
        "{accepted:?}"
    );
}

/// One HTTP/1.0 GET of `path` at `addr`; the whole response, or "" if nothing answers.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

#[test]
fn prometheus_serves_fencelocks_metrics() {
    let r = RedisServer::start();
    let url = r.url();
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut child = Command::new(example("prometheus"))
        .arg(&addr)
        .env("FENCELOCK_REDIS", &url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus example");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let served = loop {
        let metrics = http_get(&addr, "/metrics");
        if metrics.contains("fencelock_") || std::time::Instant::now() > deadline {
            break metrics;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        served.contains("fencelock_"),
        "no fencelock_ metrics at {addr}: {served}"
    );
}

#[test]
fn paused_holder_is_refused_by_postgresql_after_its_lease_ran_out() {
    use std::io::{BufRead, BufReader, Write};
    let r = RedisServer::start();
    let pg = Postgres::start();
    pg.psql(
        "CREATE TABLE stock (id int PRIMARY KEY, count int); INSERT INTO stock VALUES (42, 10);",
    );
    pg.psql(fencelock::fence::POSTGRES_SETUP);
    let (redis_url, db_url) = (r.url(), pg.url());
    let mut child = Command::new(example("paused_holder"))
        .arg("--check")
        .env("FENCELOCK_REDIS", &redis_url)
        .env("DATABASE_URL", &db_url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("paused_holder example");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let holds = lines.next().unwrap().unwrap();
    assert!(
        holds.starts_with("A holds stock:42 with fencing token"),
        "{holds}"
    );
    // The pause: stopped, its 1 s lease runs out; B takes the lock and sells one.
    let pid = child.id().to_string();
    let signal = |sig: &str| {
        assert!(
            Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal("-STOP");
    testkit::eventually("A's lease runs out", Duration::from_secs(10), || {
        !r.exists("fencelock:{stock:42}")
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = fencelock::Client::connect(&redis_url).await.unwrap();
        let guard = client.lock("stock:42").acquire().await.unwrap();
        let (mut db, connection) = tokio_postgres::connect(&db_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let tx = db.transaction().await.unwrap();
        fencelock::fence::tokio_postgres::check(&tx, "stock:42", guard.fencing_token())
            .await
            .unwrap();
        tx.execute("UPDATE stock SET count = count - 1 WHERE id = 42", &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        guard.release().await.unwrap();
    });
    // A resumes and writes with its old token: refused, exit 76, B's sale kept.
    signal("-CONT");
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(76), "{rest:?}");
    assert!(
        rest.iter().any(|l| l.starts_with("A was refused")),
        "{rest:?}"
    );
    assert_eq!(pg.psql("SELECT count FROM stock WHERE id = 42").trim(), "9");
}
