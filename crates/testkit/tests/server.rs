//! Behaviour of `testkit::RedisServer` against real `redis-server` processes.

// `libc::kill(pid, 0)` is the independent check that a process is gone.
#![allow(unsafe_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use testkit::{RedisServer, Reply};

/// `true` if `kill(pid, 0)` fails with `ESRCH`: no such process (not even a
/// zombie).
fn process_gone(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence; nothing is delivered.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

fn refuses_connections(port: u16) -> bool {
    matches!(
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.kind()),
        Err(ErrorKind::ConnectionRefused)
    )
}

#[test]
fn start_answers_ping_and_round_trips_set_get() {
    let server = RedisServer::start();
    assert_ne!(server.port(), 6379);
    assert_eq!(server.addr(), format!("127.0.0.1:{}", server.port()));
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.cmd(&["PING"]), Reply::Status("PONG".into()));
    assert_eq!(
        server.cmd(&["SET", "greeting", "hello world"]).as_str(),
        Some("OK")
    );
    assert_eq!(
        server.cmd(&["GET", "greeting"]).as_str(),
        Some("hello world")
    );
    assert!(server.cmd(&["GET", "missing"]).is_nil());
    assert_eq!(server.cmd(&["INCR", "n"]), Reply::Int(1));
    assert!(server.cmd(&["NOSUCHCOMMAND"]).is_error());

    server.cmd(&["RPUSH", "list", "a", "b", ""]);
    let list = server.cmd(&["LRANGE", "list", "0", "-1"]);
    let items: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(items, ["a", "b", ""]);
}

#[test]
fn servers_are_independent() {
    let servers = RedisServer::start_many(3);
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    assert_ne!(servers[0].pid(), servers[1].pid());

    servers[0].cmd(&["SET", "k", "zero"]);
    assert_eq!(servers[0].cmd(&["GET", "k"]).as_str(), Some("zero"));
    assert!(servers[1].cmd(&["GET", "k"]).is_nil());
    assert!(servers[2].cmd(&["GET", "k"]).is_nil());

    let other = RedisServer::start();
    assert!(!servers.iter().any(|s| s.port() == other.port()));
}

#[test]
fn drop_kills_the_process_frees_the_port_and_removes_the_dir() {
    let server = RedisServer::start();
    let (pid, port, dir) = (server.pid(), server.port(), server.dir().to_owned());
    assert!(!process_gone(pid));
    assert!(dir.join("redis.log").exists());
    drop(server);
    assert!(process_gone(pid), "pid {pid} still exists after drop");
    assert!(
        refuses_connections(port),
        "port {port} still accepts connections"
    );
    assert!(!dir.exists());
}

#[test]
fn drop_of_a_paused_server_kills_it() {
    let mut server = RedisServer::start();
    let pid = server.pid();
    server.pause();
    drop(server);
    assert!(process_gone(pid));
}

#[test]
fn paused_server_does_not_answer_until_resumed() {
    let mut server = RedisServer::start();
    server.pause();
    server.pause(); // idempotent
    assert!(
        server.is_running(),
        "a paused server is still a live process"
    );

    // The kernel still accepts the connection, but nobody answers.
    let mut stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    stream.write_all(b"PING\r\n").unwrap();
    let mut buf = [0u8; 64];
    let err = stream.read(&mut buf).expect_err("a paused server answered");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );
    let err = server
        .try_cmd(&["PING"], Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(
        err.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut
    ));

    server.resume();
    server.resume(); // idempotent

    // The request queued while paused is answered now...
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let n = stream.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"+PONG\r\n");
    // ...and new connections work as usual.
    assert_eq!(server.cmd(&["PING"]).as_str(), Some("PONG"));
}

#[test]
fn kill_works_on_a_paused_server() {
    let mut server = RedisServer::start();
    let (pid, port) = (server.pid(), server.port());
    server.pause();
    server.kill();
    assert!(!server.is_running());
    assert!(process_gone(pid));
    assert!(refuses_connections(port));
    server.resume(); // no-op on a dead server
    server.kill(); // no-op too
}

#[test]
fn restart_without_persistence_loses_data() {
    let mut server = RedisServer::start();
    let (port, old_pid) = (server.port(), server.pid());
    server.cmd(&["SET", "k", "v"]);
    server.kill();
    assert!(!server.is_running());
    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert!(process_gone(old_pid));
    assert!(server.cmd(&["GET", "k"]).is_nil());
}

#[test]
fn restart_with_persistence_keeps_acknowledged_writes() {
    let mut server = RedisServer::builder().persistence(true).start();
    let port = server.port();
    assert_eq!(server.cmd(&["SET", "k", "v"]).as_str(), Some("OK"));
    assert_eq!(server.cmd(&["INCR", "n"]), Reply::Int(1));
    server.kill();
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.cmd(&["GET", "k"]).as_str(), Some("v"));
    assert_eq!(server.cmd(&["GET", "n"]).as_int(), Some(1));
}

#[test]
fn restart_of_a_running_or_paused_server_kills_it_first() {
    let mut server = RedisServer::builder().persistence(true).start();
    server.cmd(&["SET", "k", "v"]);
    let first = server.pid();
    server.restart();
    assert!(process_gone(first));
    assert_eq!(server.cmd(&["GET", "k"]).as_str(), Some("v"));

    let second = server.pid();
    server.pause();
    server.restart();
    assert!(process_gone(second));
    assert_eq!(server.cmd(&["GET", "k"]).as_str(), Some("v"));
}

#[test]
fn requirepass_is_enforced_and_cmd_as_authenticates() {
    let mut server = RedisServer::builder()
        .arg("--requirepass")
        .arg("pw")
        .start();
    let reply = server.cmd(&["PING"]);
    assert!(
        reply.as_error().is_some_and(|e| e.starts_with("NOAUTH")),
        "{reply}"
    );
    assert_eq!(server.cmd_as("pw", &["PING"]).as_str(), Some("PONG"));
    assert_eq!(server.cmd_as("pw", &["SET", "k", "v"]).as_str(), Some("OK"));
    assert_eq!(server.cmd_as("pw", &["GET", "k"]).as_str(), Some("v"));
    let wrong = server.cmd_as("nope", &["GET", "k"]);
    assert!(wrong.is_error(), "{wrong}");

    // Extra args survive a restart.
    server.restart();
    assert!(server.cmd(&["PING"]).is_error());
    assert_eq!(server.cmd_as("pw", &["PING"]).as_str(), Some("PONG"));
}

#[test]
fn drop_during_a_panic_kills_the_server() {
    let mut recorded = None;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let server = RedisServer::start();
        recorded = Some((server.pid(), server.port(), server.dir().to_owned()));
        panic!("test failure while the server is up");
    }));
    assert!(result.is_err());
    let (pid, port, dir) = recorded.unwrap();
    assert!(process_gone(pid), "pid {pid} survived the panic");
    assert!(refuses_connections(port));
    assert!(!dir.exists());
}

#[test]
fn cmd_panics_with_the_command_and_port_when_the_server_is_down() {
    let mut server = RedisServer::start();
    let port = server.port();
    server.kill();
    let err = catch_unwind(AssertUnwindSafe(|| server.cmd(&["GET", "k"]))).unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(msg.contains("GET k"), "{msg}");
    assert!(msg.contains(&port.to_string()), "{msg}");
}

#[test]
fn start_failure_panics_with_the_servers_complaint() {
    let err = catch_unwind(|| {
        RedisServer::builder()
            .arg("--no-such-option")
            .arg("1")
            .start()
    })
    .unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(msg.contains("did not start"), "{msg}");
    assert!(msg.contains("no-such-option"), "{msg}");
}

/// The message of a caught panic.
fn panic_message(err: &(dyn std::any::Any + Send)) -> &str {
    err.downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .expect("a panic message")
}

#[test]
fn exists_pttl_and_get_read_one_key() {
    let server = RedisServer::start();
    assert!(!server.exists("k"));
    assert_eq!(server.pttl("k"), -2);
    assert_eq!(server.get("k"), None);

    server.cmd(&["SET", "k", "hello world"]);
    assert!(server.exists("k"));
    assert_eq!(server.pttl("k"), -1);
    assert_eq!(server.get("k").as_deref(), Some("hello world"));

    server.cmd(&["PEXPIRE", "k", "60000"]);
    let pttl = server.pttl("k");
    assert!((1..=60_000).contains(&pttl), "{pttl}");

    server.cmd(&["SET", "empty", ""]);
    assert_eq!(server.get("empty").as_deref(), Some(""));
}

#[test]
fn get_panics_on_a_key_that_holds_no_text() {
    let server = RedisServer::start();
    server.cmd(&["HSET", "h", "f", "v"]);
    let err = catch_unwind(AssertUnwindSafe(|| server.get("h"))).unwrap_err();
    let msg = panic_message(&*err);
    assert!(msg.contains("GET h") && msg.contains("WRONGTYPE"), "{msg}");

    server.cmd(&[
        "EVAL",
        "return redis.call('SET', KEYS[1], '\\255')",
        "1",
        "bin",
    ]);
    assert!(server.exists("bin"));
    let err = catch_unwind(AssertUnwindSafe(|| server.get("bin"))).unwrap_err();
    let msg = panic_message(&*err);
    assert!(msg.contains("GET bin") && msg.contains("\\xff"), "{msg}");
}

#[test]
fn key_helpers_panic_on_an_error_reply() {
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg("pw")
        .start();
    for (what, f) in [
        (
            "EXISTS k",
            Box::new(|| _ = server.exists("k")) as Box<dyn Fn()>,
        ),
        ("PTTL k", Box::new(|| _ = server.pttl("k"))),
        ("GET k", Box::new(|| _ = server.get("k"))),
        ("TIME", Box::new(|| _ = server.server_time())),
    ] {
        let err = catch_unwind(AssertUnwindSafe(f)).unwrap_err();
        let msg = panic_message(&*err);
        assert!(msg.contains(what) && msg.contains("NOAUTH"), "{msg}");
        assert!(msg.contains(&server.port().to_string()), "{msg}");
    }
}

#[test]
fn server_time_is_the_local_wall_clock_in_microseconds() {
    use std::time::{SystemTime, UNIX_EPOCH};

    let server = RedisServer::start();
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let time = server.server_time();
    let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    // Same machine, same clock; TIME truncates to microseconds.
    assert!(
        before.saturating_sub(Duration::from_micros(1)) <= time && time <= after,
        "{before:?} <= {time:?} <= {after:?}"
    );
    assert_eq!(time.subsec_nanos() % 1_000, 0, "{time:?}");
}

#[test]
fn info_field_reads_one_field_of_a_section() {
    let server = RedisServer::start();
    let port = server.port().to_string();
    assert_eq!(server.info_field("server", "tcp_port"), Some(port));
    assert_eq!(
        server.info_field("stats", "expired_keys").as_deref(),
        Some("0")
    );
    // A prefix of a field's name is not that field.
    assert_eq!(server.info_field("server", "tcp_po"), None);
    assert_eq!(server.info_field("stats", "tcp_port"), None);
    assert_eq!(server.info_field("no-such-section", "tcp_port"), None);

    server.cmd(&["SET", "k", "v", "PX", "1"]);
    testkit::eventually("the key expired", Duration::from_secs(5), || {
        server.info_field("stats", "expired_keys").as_deref() == Some("1")
    });
    assert!(!server.exists("k"));
}

#[test]
fn info_field_panics_on_an_unreadable_reply() {
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg("pw")
        .start();
    let err = catch_unwind(AssertUnwindSafe(|| {
        server.info_field("stats", "expired_keys")
    }))
    .unwrap_err();
    let msg = panic_message(&*err);
    assert!(
        msg.contains("INFO stats") && msg.contains("NOAUTH"),
        "{msg}"
    );
    let err = catch_unwind(AssertUnwindSafe(|| server.connected_clients())).unwrap_err();
    assert!(panic_message(&*err).contains("NOAUTH"));
    let err = catch_unwind(AssertUnwindSafe(|| server.script_calls())).unwrap_err();
    let msg = panic_message(&*err);
    assert!(
        msg.contains("INFO commandstats") && msg.contains("NOAUTH"),
        "{msg}"
    );
}

#[test]
fn connected_clients_counts_open_connections_and_its_own() {
    // A connection closed just before (the start-up probe, an earlier
    // query) may still be counted for a moment.
    let within = Duration::from_secs(5);
    let server = RedisServer::start();
    testkit::eventually("only this query's client", within, || {
        server.connected_clients() == 1
    });

    let mut other = TcpStream::connect(server.addr()).unwrap();
    other.write_all(b"PING\r\n").unwrap();
    let mut pong = [0; 7];
    other.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"+PONG\r\n");
    assert!(server.connected_clients() >= 2);
    testkit::eventually("the other client and this query's", within, || {
        server.connected_clients() == 2
    });

    drop(other);
    testkit::eventually("the other client is gone", within, || {
        server.connected_clients() == 1
    });
}

#[test]
fn script_calls_counts_eval_and_evalsha() {
    let server = RedisServer::start();
    assert_eq!(server.script_calls(), 0);
    let sha = server.cmd(&["SCRIPT", "LOAD", "return 1"]);
    let sha = sha.as_str().unwrap();
    assert_eq!(server.script_calls(), 0);

    server.cmd(&["EVAL", "return 1", "0"]);
    server.cmd(&["EVAL", "return 2", "0"]);
    assert_eq!(server.script_calls(), 2);
    assert_eq!(server.cmd(&["EVALSHA", sha, "0"]), Reply::Int(1));
    assert_eq!(server.script_calls(), 3);
    // Other commands, and the read-only variants, are not counted.
    server.cmd(&["EVAL_RO", "return 1", "0"]);
    server.cmd(&["GET", "k"]);
    assert_eq!(server.script_calls(), 3);

    server.cmd(&["CONFIG", "RESETSTAT"]);
    assert_eq!(server.script_calls(), 0);
}

#[test]
fn config_file_comes_first_and_survives_restart() {
    let mut server = RedisServer::builder()
        .config_file("maxmemory-policy allkeys-lru\nhz 50\n")
        .arg("--hz")
        .arg("20")
        .start();
    let path = server.config_path().unwrap();
    assert_eq!(path, server.dir().join("redis.conf"));
    let config = |s: &RedisServer, name: &str| {
        s.cmd(&["CONFIG", "GET", name]).as_array().unwrap()[1]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(config(&server, "maxmemory-policy"), "allkeys-lru");
    // Arguments override the file.
    assert_eq!(config(&server, "hz"), "20");
    // The server may rewrite its file; a restart reads it as left.
    server.cmd(&["CONFIG", "SET", "maxmemory-policy", "volatile-ttl"]);
    assert_eq!(server.cmd(&["CONFIG", "REWRITE"]).as_str(), Some("OK"));
    server.restart();
    assert_eq!(config(&server, "maxmemory-policy"), "volatile-ttl");

    assert_eq!(RedisServer::start().config_path(), None);
}

#[test]
fn port_source_picks_the_port_and_cluster_ports_leave_the_bus_port_free() {
    let server = RedisServer::builder()
        .port_source(testkit::free_cluster_port)
        .args(["--cluster-enabled", "yes"])
        .start();
    let port = server.port();
    assert!((10000..=55535).contains(&port), "{port}");
    assert_eq!(
        server.info_field("cluster", "cluster_enabled").as_deref(),
        Some("1")
    );
    // The cluster bus listens on port + 10000.
    assert!(TcpStream::connect(("127.0.0.1", port + 10000)).is_ok());
}

#[test]
fn is_paused_and_try_cmd_as() {
    let mut server = RedisServer::builder()
        .arg("--requirepass")
        .arg("pw")
        .start();
    assert!(!server.is_paused());
    let timeout = Duration::from_millis(200);
    assert_eq!(
        server
            .try_cmd_as("pw", &["PING"], timeout)
            .unwrap()
            .as_str(),
        Some("PONG")
    );
    assert!(
        server
            .try_cmd_as("wrong", &["PING"], timeout)
            .unwrap()
            .as_error()
            .unwrap()
            .starts_with("WRONGPASS")
    );
    server.pause();
    assert!(server.is_paused());
    assert!(server.try_cmd_as("pw", &["PING"], timeout).is_err());
    server.resume();
    assert!(!server.is_paused());
    server.pause();
    server.kill();
    assert!(!server.is_paused());
}

#[test]
fn unread_request_bytes_shows_requests_waiting_at_a_paused_server() {
    let within = Duration::from_secs(5);
    let mut server = RedisServer::start();
    let mut client = TcpStream::connect(server.addr()).unwrap();
    client.set_read_timeout(Some(within)).unwrap();
    let mut pong = [0; 7];
    client.write_all(b"PING\r\n").unwrap();
    client.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"+PONG\r\n");
    assert_eq!(server.unread_request_bytes(), 0, "a running server reads");

    // The connection of this command closes just before the pause: the server
    // may not see its end before it stops, and that end is no request.
    server.cmd(&["PING"]);
    server.pause();
    assert_eq!(server.unread_request_bytes(), 0);
    client.write_all(b"PING\r\n").unwrap();
    testkit::eventually("the PING waits at the paused server", within, || {
        server.unread_request_bytes() == 6
    });
    // A connection the paused server has not even accepted counts too.
    let mut fresh = TcpStream::connect(server.addr()).unwrap();
    fresh.set_read_timeout(Some(within)).unwrap();
    fresh.write_all(b"ECHO hi\r\n").unwrap();
    testkit::eventually("both requests wait", within, || {
        server.unread_request_bytes() == 6 + 9
    });

    server.resume();
    client.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"+PONG\r\n");
    let mut hi = [0; 8];
    fresh.read_exact(&mut hi).unwrap();
    assert_eq!(&hi, b"$2\r\nhi\r\n");
    assert_eq!(server.unread_request_bytes(), 0, "everything was read");
}
