//! Behaviour of `testkit::FaultProxy` in front of real `redis-server`s.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use testkit::{Fault, FaultProxy, RedisServer};

/// How long a request must go unanswered to count as "no reply".
const SILENCE: Duration = Duration::from_millis(300);
/// Upper bound for anything that should happen "promptly".
const PROMPTLY: Duration = Duration::from_secs(2);

/// A raw client connection through `proxy`.
fn connect(proxy: &FaultProxy) -> TcpStream {
    let stream = TcpStream::connect(proxy.addr()).unwrap();
    stream.set_read_timeout(Some(PROMPTLY)).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// Sends one command as a RESP array of bulk strings.
fn send(stream: &mut TcpStream, args: &[&str]) {
    let mut out = format!("*{}\r\n", args.len());
    for arg in args {
        out.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(out.as_bytes()).unwrap();
}

/// Reads exactly `expected.len()` bytes (within [`PROMPTLY`]) and compares.
fn expect(stream: &mut TcpStream, expected: &[u8]) {
    let mut got = vec![0; expected.len()];
    stream
        .read_exact(&mut got)
        .unwrap_or_else(|e| panic!("waiting for {:?}: {e}", expected.escape_ascii().to_string()));
    assert_eq!(
        got.escape_ascii().to_string(),
        expected.escape_ascii().to_string()
    );
}

/// Sends `args` and expects `reply`.
fn round_trip(stream: &mut TcpStream, args: &[&str], reply: &[u8]) {
    send(stream, args);
    expect(stream, reply);
}

/// Asserts that nothing arrives for [`SILENCE`].
fn assert_silent(stream: &mut TcpStream) {
    stream.set_read_timeout(Some(SILENCE)).unwrap();
    let mut buf = [0; 64];
    match stream.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!(
            "expected silence, got {other:?} {:?}",
            buf.escape_ascii().to_string()
        ),
    }
    stream.set_read_timeout(Some(PROMPTLY)).unwrap();
}

/// Asserts that the next read fails or sees end of stream, within
/// [`PROMPTLY`]; returns the error kind (`None` for end of stream).
fn assert_closed(stream: &mut TcpStream) -> Option<ErrorKind> {
    stream.set_read_timeout(Some(PROMPTLY)).unwrap();
    let started = Instant::now();
    let mut buf = [0; 64];
    let result = stream.read(&mut buf);
    assert!(
        started.elapsed() < PROMPTLY,
        "not closed promptly: {result:?}"
    );
    match result {
        Ok(0) => None,
        Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Some(e.kind())
        }
        other => panic!("connection still open: {other:?}"),
    }
}

/// Whether this test process holds a socket listening on `port`, judged
/// from `/proc/net/tcp` and `/proc/self/fd`. (Connecting to the port would
/// not do: tests running concurrently may reuse a freed port at any time.)
fn listening_here(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields[1].rsplit(':').next()?;
            let listening =
                fields[3] == "0A" && u16::from_str_radix(local_port, 16).ok() == Some(port);
            listening.then(|| format!("socket:[{}]", fields[9]))
        })
        .collect();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| inodes.iter().any(|i| target.to_str() == Some(i)))
        })
}

#[test]
fn pass_forwards_ping_and_set_get() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(&server.addr());
    assert_ne!(proxy.port(), server.port());
    assert_eq!(proxy.addr(), format!("127.0.0.1:{}", proxy.port()));
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
    assert_eq!(proxy.upstream(), server.addr());
    assert_eq!(proxy.fault(), Fault::Pass);

    let mut client = connect(&proxy);
    round_trip(&mut client, &["PING"], b"+PONG\r\n");
    round_trip(&mut client, &["SET", "k", "v"], b"+OK\r\n");
    round_trip(&mut client, &["GET", "k"], b"$1\r\nv\r\n");
    assert_eq!(server.cmd(&["GET", "k"]).as_str(), Some("v"));

    // A reply much larger than one read chunk arrives intact.
    let big = "x".repeat(200_000);
    round_trip(&mut client, &["SET", "big", &big], b"+OK\r\n");
    send(&mut client, &["GET", "big"]);
    expect(&mut client, format!("$200000\r\n{big}\r\n").as_bytes());
}

#[test]
fn delay_holds_both_directions_and_pass_is_fast_again() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let mut client = connect(&proxy);
    round_trip(&mut client, &["PING"], b"+PONG\r\n");

    let base = Duration::from_millis(200);
    proxy.set(Fault::Delay {
        base,
        jitter: Duration::ZERO,
    });
    let started = Instant::now();
    round_trip(&mut client, &["PING"], b"+PONG\r\n");
    let took = started.elapsed();
    // Request and reply are each held for `base`.
    assert!(took >= 2 * base, "round trip took only {took:?}");
    assert!(took < PROMPTLY, "round trip took {took:?}");

    // The same connection is fast again once the fault is lifted.
    proxy.set(Fault::Pass);
    let started = Instant::now();
    round_trip(&mut client, &["PING"], b"+PONG\r\n");
    assert!(started.elapsed() < base, "took {:?}", started.elapsed());

    // New connections see the delay too.
    proxy.set(Fault::Delay {
        base,
        jitter: Duration::ZERO,
    });
    let mut fresh = connect(&proxy);
    let started = Instant::now();
    round_trip(&mut fresh, &["PING"], b"+PONG\r\n");
    assert!(started.elapsed() >= 2 * base);
}

#[test]
fn delay_with_jitter_preserves_order() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(&server.addr());
    proxy.set(Fault::Delay {
        base: Duration::from_millis(5),
        jitter: Duration::from_millis(40),
    });
    let mut client = connect(&proxy);
    // Separate writes, so they are separate chunks with independent jitter.
    for _ in 0..20 {
        send(&mut client, &["INCR", "n"]);
        thread::sleep(Duration::from_millis(2));
    }
    let expected: String = (1..=20).map(|i| format!(":{i}\r\n")).collect();
    expect(&mut client, expected.as_bytes());
    assert_eq!(server.cmd(&["GET", "n"]).as_int(), Some(20));
}

#[test]
fn blackhole_swallows_requests_and_replies_for_good() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let mut client = connect(&proxy);
    round_trip(&mut client, &["PING"], b"+PONG\r\n");

    proxy.set(Fault::Blackhole);
    assert_eq!(proxy.fault(), Fault::Blackhole);
    send(&mut client, &["PING"]);
    assert_silent(&mut client);
    send(&mut client, &["SET", "k", "v"]);
    assert_silent(&mut client);
    assert!(server.cmd(&["GET", "k"]).is_nil(), "the SET went through");

    // New connections are accepted but get nothing either.
    let mut fresh = connect(&proxy);
    send(&mut fresh, &["SET", "k2", "v"]);
    assert_silent(&mut fresh);
    assert!(server.cmd(&["GET", "k2"]).is_nil());

    // Lifting the blackhole does not deliver the swallowed bytes: the next
    // reply on the old connection answers the next request.
    proxy.set(Fault::Pass);
    round_trip(&mut client, &["ECHO", "fresh"], b"$5\r\nfresh\r\n");
    round_trip(&mut fresh, &["ECHO", "again"], b"$5\r\nagain\r\n");
    assert!(server.cmd(&["GET", "k"]).is_nil());
    assert!(server.cmd(&["GET", "k2"]).is_nil());
}

#[test]
fn rewrite_replaces_bytes_in_replies_only() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let mut client = connect(&proxy);
    proxy.set(Fault::Rewrite {
        from: b"seven".to_vec(),
        to: b"eight".to_vec(),
    });
    // The request goes as sent: the key holds what the client wrote.
    round_trip(&mut client, &["SET", "k", "seven-seven"], b"+OK\r\n");
    assert_eq!(server.get("k").as_deref(), Some("seven-seven"));
    round_trip(&mut client, &["GET", "k"], b"$11\r\neight-eight\r\n");
    proxy.set(Fault::Pass);
    round_trip(&mut client, &["GET", "k"], b"$11\r\nseven-seven\r\n");
}

#[test]
fn drop_replies_runs_the_command_but_hides_the_outcome() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let mut client = connect(&proxy);
    round_trip(&mut client, &["PING"], b"+PONG\r\n");

    proxy.set(Fault::DropReplies);
    send(&mut client, &["SET", "k", "v"]);
    assert_silent(&mut client);
    testkit::eventually("the SET to run on the server", PROMPTLY, || {
        server.cmd(&["GET", "k"]).as_str() == Some("v")
    });

    // The dropped reply is gone for good.
    proxy.set(Fault::Pass);
    round_trip(&mut client, &["ECHO", "next"], b"$4\r\nnext\r\n");
}

#[test]
fn reset_aborts_open_and_new_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let mut client = connect(&proxy);
    round_trip(&mut client, &["PING"], b"+PONG\r\n");
    testkit::eventually("the connection to be counted", PROMPTLY, || {
        proxy.connections() == 1
    });

    proxy.set(Fault::Reset);
    assert_eq!(
        proxy.connections(),
        0,
        "set(Reset) returns once all are reset"
    );
    assert_eq!(assert_closed(&mut client), Some(ErrorKind::ConnectionReset));

    // New connections are accepted, then reset.
    let mut fresh = connect(&proxy);
    assert_eq!(assert_closed(&mut fresh), Some(ErrorKind::ConnectionReset));
    assert_eq!(proxy.connections(), 0);

    proxy.set(Fault::Pass);
    let mut again = connect(&proxy);
    round_trip(&mut again, &["PING"], b"+PONG\r\n");
}

#[test]
fn connections_counts_open_client_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(&server.addr());
    assert_eq!(proxy.connections(), 0);

    let mut clients: Vec<TcpStream> = (0..3).map(|_| connect(&proxy)).collect();
    for c in &mut clients {
        round_trip(c, &["PING"], b"+PONG\r\n");
    }
    assert_eq!(proxy.connections(), 3);
    clients.truncate(1);
    testkit::eventually("two connections to close", PROMPTLY, || {
        proxy.connections() == 1
    });

    // A client leaving a blackholed connection closes it too.
    proxy.set(Fault::Blackhole);
    drop(clients);
    testkit::eventually("the last connection to close", PROMPTLY, || {
        proxy.connections() == 0
    });

    // Everything was closed upstream as well (only our own CLIENT LIST
    // connection is left on the server).
    testkit::eventually("upstream connections to close", PROMPTLY, || {
        server
            .cmd(&["CLIENT", "LIST"])
            .as_str()
            .unwrap()
            .lines()
            .count()
            == 1
    });
}

#[test]
fn server_end_of_stream_reaches_the_client_unless_replies_are_blocked() {
    let mut server = RedisServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let mut passing = connect(&proxy);
    let mut held = connect(&proxy);
    round_trip(&mut passing, &["PING"], b"+PONG\r\n");
    round_trip(&mut held, &["PING"], b"+PONG\r\n");

    proxy.set(Fault::DropReplies);
    // Kill the server; while replies are dropped its FIN is held back...
    server.kill();
    assert_silent(&mut held);
    // ...and a new connection fails at once: the upstream refuses it.
    let mut refused = connect(&proxy);
    assert!(assert_closed(&mut refused).is_some());

    // Under Blackhole a refused upstream is indistinguishable from silence.
    proxy.set(Fault::Blackhole);
    let mut drained = connect(&proxy);
    send(&mut drained, &["PING"]);
    assert_silent(&mut drained);
    assert_silent(&mut held);

    // Once replies flow again, the held end of stream arrives, and the
    // drained connection is reset.
    proxy.set(Fault::Pass);
    assert_eq!(assert_closed(&mut held), None);
    assert_eq!(assert_closed(&mut passing), None);
    assert!(assert_closed(&mut drained).is_some());
    // The clients' ends are still open (half-closed) until they close them.
    drop((passing, held));
    testkit::eventually("all connections to close", PROMPTLY, || {
        proxy.connections() == 0
    });
}

#[test]
fn drop_closes_connections_promptly_and_frees_the_port() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let port = proxy.port();
    assert!(listening_here(port));
    let mut idle = connect(&proxy);
    round_trip(&mut idle, &["PING"], b"+PONG\r\n");
    let mut delayed = connect(&proxy);
    round_trip(&mut delayed, &["PING"], b"+PONG\r\n");
    proxy.set(Fault::Delay {
        base: Duration::from_secs(3600),
        jitter: Duration::ZERO,
    });
    send(&mut delayed, &["PING"]); // queued for an hour

    let started = Instant::now();
    drop(proxy);
    // Its threads notice within a 20 ms tick; the bound leaves a loaded machine its
    // margin and is still far from the hour the delayed PING waits for.
    assert!(
        started.elapsed() < PROMPTLY,
        "drop took {:?}",
        started.elapsed()
    );
    assert_closed(&mut idle);
    assert_closed(&mut delayed);
    assert!(!listening_here(port), "port {port} still listened on");
}

#[test]
fn drop_after_a_panic_closes_connections() {
    let server = RedisServer::start();
    let mut recorded = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let proxy = FaultProxy::start(&server.addr());
        let mut client = connect(&proxy);
        round_trip(&mut client, &["PING"], b"+PONG\r\n");
        recorded = Some((proxy.port(), client));
        panic!("test failure while the proxy is up");
    }));
    assert!(result.is_err());
    let (port, mut client) = recorded.unwrap();
    assert_closed(&mut client);
    assert!(!listening_here(port), "port {port} still listened on");
}
