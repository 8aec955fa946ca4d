//! A password never leaks, against real redis-server processes: on every failing path a
//! user can meet (nothing listening, a paused server, a wrong password, an ACL user with
//! too few rights, TLS failures, a Redis Cluster over TLS refusing the certificate or
//! the password, malformed URLs, Redlock with failing nodes, Sentinel
//! with an unknown service or every sentinel down), with marker passwords given in the
//! URL (plainly, percent-encoded, as a Sentinel query parameter) or apart from it
//! ([`ClientBuilder::password`]), no error message, no error `Debug` or source in its
//! chain, no `Debug` of a builder, client, lock builder, guard or report, and no line of
//! the TRACE-level tracing output holds a password, in any of its forms. A lock that is
//! taken shows its name and fencing token, but neither the holder token nor a
//! reentrant owner id.
//!
//! No library path panics with a URL (the URL parsers return errors), so there is no
//! panic message to check here.

use std::error::Error as _;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fencelock::{Client, ClientBuilder, Error, UnavailableReason};
use futures_util::future::join_all;
use testkit::{ClientAuth, Cluster, RedisServer, SentinelGroup, TlsFiles};

mod common;

/// The password of the tests' Redis servers and ACL users.
const PASSWORD: &str = "S3CRET-MARKER-7f3a";
/// The sentinels' own password.
const SENTINEL_PASSWORD: &str = "S3NTINEL-MARKER-91c2";
/// A password with the characters a URL must percent-encode (`@`, `:`)...
const AWKWARD: &str = "P@SS:MARKER-5e1d";
/// ...as it is written in a URL.
const AWKWARD_ENCODED: &str = "P%40SS%3AMARKER-5e1d";
/// A reentrant owner id, which lets whoever knows it release the lock.
const OWNER: &str = "OWNER-MARKER-c0de";

/// What no output may hold: every marker, in every form it is given in, and the part of
/// the awkward one that is left when its `@` and `:` are taken as separators.
const SECRETS: &[&str] = &[
    PASSWORD,
    SENTINEL_PASSWORD,
    AWKWARD,
    AWKWARD_ENCODED,
    "MARKER-5e1d",
    OWNER,
];

/// Short timeouts, so that a failing path fails fast.
const FAST: Duration = Duration::from_millis(300);

fn fast(builder: ClientBuilder) -> ClientBuilder {
    builder.connect_timeout(FAST).response_timeout(FAST)
}

fn trace() -> &'static common::TraceLog {
    common::traces()
}

/// The outputs a user could see, collected from concurrent attempts, and checked for
/// secrets at the end.
#[derive(Default)]
struct Seen(Mutex<Vec<(String, String)>>);

impl Seen {
    fn text(&self, what: impl Into<String>, text: impl Into<String>) {
        self.0.lock().unwrap().push((what.into(), text.into()));
    }

    fn debug(&self, what: &str, value: &impl Debug) {
        self.text(what, format!("{value:?}"));
        self.text(what, format!("{value:#?}"));
    }

    /// An error's message, its `Debug`, and every source in its chain (message and
    /// `Debug`).
    fn error(&self, what: &str, e: &Error) {
        self.text(what, e.to_string());
        self.debug(what, e);
        let mut source = e.source();
        while let Some(s) = source {
            self.text(format!("{what} (source)"), s.to_string());
            self.text(format!("{what} (source)"), format!("{s:?}"));
            source = s.source();
        }
    }

    /// Asserts that nothing seen, nor the trace so far, holds a secret.
    fn assert_no_secret(&self) {
        let seen = self.0.lock().unwrap();
        assert!(!seen.is_empty());
        let trace = trace().text();
        let all = seen
            .iter()
            .map(|(what, text)| (what.as_str(), text.as_str()))
            .chain(trace.lines().map(|line| ("trace", line)));
        for (what, text) in all {
            for secret in SECRETS {
                assert!(
                    !text.contains(secret),
                    "{what} shows the secret {secret:?}:\n{text}"
                );
            }
        }
    }
}

/// Everything a user can do with a client that `builder` makes: connect (at once, and
/// lazily), take a lock, read its state, list the locks, break one, push on a delay
/// queue. Records what each shows, and returns the errors, for the caller to check they
/// are the failure it set up.
async fn probe(seen: &Seen, what: &str, builder: ClientBuilder) -> Vec<Error> {
    let mut errors = Vec::new();
    seen.debug(&format!("{what}: builder"), &builder);
    match builder.clone().connect().await {
        Ok(client) => seen.debug(&format!("{what}: client"), &client),
        Err(e) => {
            seen.error(&format!("{what}: connect"), &e);
            errors.push(e);
        }
    }
    let client = match builder.connect_lazy().await {
        Ok(client) => client,
        Err(e) => {
            seen.error(&format!("{what}: lazy connect"), &e);
            errors.push(e);
            return errors;
        }
    };
    seen.debug(&format!("{what}: lazy client"), &client);
    seen.text(format!("{what}: nodes"), client.nodes().join(","));
    let lock = client.lock("secrets").lease(Duration::from_secs(5));
    seen.debug(&format!("{what}: lock builder"), &lock);
    match lock.try_acquire().await {
        Ok(guard) => {
            seen.debug(&format!("{what}: guard"), &guard);
            let _ = guard.release().await;
        }
        Err(e) => {
            seen.error(&format!("{what}: acquire"), &e);
            errors.push(e);
        }
    }
    match client.inspect("secrets").await {
        Ok(status) => {
            seen.debug(&format!("{what}: status"), &status);
            for node in status.nodes {
                if let Err(e) = node.state {
                    seen.error(&format!("{what}: status of a node"), &e);
                    errors.push(e);
                }
            }
        }
        Err(e) => {
            seen.error(&format!("{what}: status"), &e);
            errors.push(e);
        }
    }
    match client.list("").await {
        Ok(listing) => {
            seen.debug(&format!("{what}: list"), &listing);
            for u in &listing.unanswered {
                seen.error(&format!("{what}: list, a node unanswered"), &u.error);
            }
        }
        Err(e) => {
            seen.error(&format!("{what}: list"), &e);
            errors.push(e);
        }
    }
    match client.break_lock("secrets").await {
        Ok(broken) => {
            seen.debug(&format!("{what}: break"), &broken);
            for node in broken.nodes {
                if let Err(e) = node.outcome {
                    seen.error(&format!("{what}: break on a node"), &e);
                    errors.push(e);
                }
            }
        }
        Err(e) => {
            seen.error(&format!("{what}: break"), &e);
            errors.push(e);
        }
    }
    if let Ok(queue) = client.delay_queue("secrets") {
        seen.debug(&format!("{what}: delay queue"), &queue);
        if let Err(e) = queue.push(b"work", Duration::ZERO).await {
            seen.error(&format!("{what}: push"), &e);
            errors.push(e);
        }
    }
    errors
}

/// Probes every case at once; for each, asserts that it failed, and only as `expected`
/// says (with the error in the message if not).
async fn probe_all(
    seen: &Seen,
    cases: Vec<(String, ClientBuilder)>,
    expected: impl Fn(&Error) -> bool,
) {
    let outcomes = join_all(
        cases
            .iter()
            .map(|(what, builder)| probe(seen, what, builder.clone())),
    )
    .await;
    for ((what, _), errors) in cases.iter().zip(outcomes) {
        assert!(!errors.is_empty(), "{what}: nothing failed");
        for e in &errors {
            assert!(expected(e), "{what}: unexpected error {e}");
        }
    }
}

/// `redis://:PASSWORD@host:port` and the like, for each way of writing the marker into a
/// URL: plain, percent-encoded, and with its `@` and `:` left unencoded.
fn urls_with_passwords(host_port: &str) -> Vec<(String, String)> {
    vec![
        (
            "password in the URL".to_owned(),
            format!("redis://:{PASSWORD}@{host_port}"),
        ),
        (
            "user and password in the URL".to_owned(),
            format!("redis://default:{PASSWORD}@{host_port}"),
        ),
        (
            "percent-encoded password in the URL".to_owned(),
            format!("redis://:{AWKWARD_ENCODED}@{host_port}"),
        ),
        (
            "unencoded @ and : in the URL's password".to_owned(),
            format!("redis://:{AWKWARD}@{host_port}"),
        ),
    ]
}

/// The cases of one failing address: each URL form with a password, and the plain URL
/// with the password given apart (with and without a user name).
fn cases_for(host_port: &str) -> Vec<(String, ClientBuilder)> {
    let mut cases: Vec<(String, ClientBuilder)> = urls_with_passwords(host_port)
        .into_iter()
        .map(|(what, url)| (what, fast(Client::builder(url))))
        .collect();
    let plain = format!("redis://{host_port}");
    cases.push((
        "password given apart".to_owned(),
        fast(Client::builder(&plain)).password(PASSWORD),
    ));
    cases.push((
        "user and awkward password given apart".to_owned(),
        fast(Client::builder(&plain))
            .username("default")
            .password(AWKWARD),
    ));
    cases
}

/// A user pointing fencelock at a port where nothing listens sees "connection refused"
/// for every operation, and no password, however it was given.
#[tokio::test]
async fn nothing_listening_never_shows_the_password() {
    trace();
    let seen = Seen::default();
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    probe_all(&seen, cases_for(&addr), |e| {
        matches!(
            e,
            Error::Unavailable {
                reason: UnavailableReason::Refused,
                node,
                ..
            } if *node == addr
        )
    })
    .await;
    // The failed attempts are traced, naming the node (so the trace holds what a
    // password could have leaked into).
    let trace = trace().text();
    assert!(
        trace
            .lines()
            .any(|l| l.contains("lock not acquired") && l.contains(&addr)),
        "{trace}"
    );
    seen.assert_no_secret();
}

/// A paused server (it accepts connections but never answers) times out, and the
/// timeout says where, not with which password.
#[tokio::test]
async fn a_paused_server_times_out_without_showing_the_password() {
    trace();
    let seen = Seen::default();
    let mut server = RedisServer::builder()
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    server.pause();
    let addr = server.addr();
    let mut cases = cases_for(&addr);
    // Fewer cases than elsewhere: each waits out its timeouts.
    cases.truncate(1);
    cases.push((
        "password given apart".to_owned(),
        fast(Client::builder(server.url())).password(AWKWARD),
    ));
    let started = Instant::now();
    probe_all(&seen, cases, |e| {
        matches!(
            e,
            Error::Unavailable {
                reason: UnavailableReason::TimedOut,
                node,
                ..
            } if *node == addr
        )
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(30));
    seen.assert_no_secret();
    server.resume();
}

/// A server that has another password refuses the marker with WRONGPASS, and the
/// message says to check the password without showing it.
#[tokio::test]
async fn a_wrong_password_is_refused_without_being_shown() {
    trace();
    let seen = Seen::default();
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg("the-right-one")
        .start();
    let addr = server.addr();
    probe_all(&seen, cases_for(&addr), |e| {
        matches!(e, Error::Rejected { code, node, .. } if code == "WRONGPASS" && *node == addr)
            && e.to_string().contains("check the user name and password")
    })
    .await;
    seen.assert_no_secret();
}

/// An ACL user with the right password but too few rights is refused with NOPERM, and
/// the message names what to allow, not the password.
#[tokio::test]
async fn an_acl_user_without_the_rights_gets_noperm_without_the_password() {
    trace();
    let seen = Seen::default();
    let server = RedisServer::start();
    for (user, password) in [("limited", PASSWORD), ("awkward", AWKWARD)] {
        let created = server.cmd(&[
            "ACL",
            "SETUSER",
            user,
            "on",
            &format!(">{password}"),
            "~*",
            "&*",
            "+ping",
            "+hello",
            "+client",
        ]);
        assert_eq!(created.as_str(), Some("OK"), "{created:?}");
    }
    let addr = server.addr();
    let cases = vec![
        (
            "ACL user and password in the URL".to_owned(),
            fast(Client::builder(format!(
                "redis://limited:{PASSWORD}@{addr}"
            ))),
        ),
        (
            "ACL user and percent-encoded password in the URL".to_owned(),
            fast(Client::builder(format!(
                "redis://awkward:{AWKWARD_ENCODED}@{addr}"
            ))),
        ),
        (
            "ACL user and password given apart".to_owned(),
            fast(Client::builder(server.url()))
                .username("limited")
                .password(PASSWORD),
        ),
    ];
    probe_all(
        &seen,
        cases,
        |e| matches!(e, Error::Rejected { code, node, .. } if code == "NOPERM" && *node == addr),
    )
    .await;
    seen.assert_no_secret();
}

/// TLS failures (a CA the client does not trust, a certificate for another name, a
/// client certificate required, TLS to a plain port and plain to a TLS port, an
/// unreadable CA file, TLS settings for a plain URL) each say what is wrong, never with
/// the password. With the right CA, the lock is taken over TLS.
#[tokio::test]
async fn tls_failures_never_show_the_password() {
    trace();
    let seen = Seen::default();
    let files = TlsFiles::shared();
    let server = RedisServer::builder()
        .tls(files, ClientAuth::No)
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let wrong_name = RedisServer::builder()
        .tls_with(
            files,
            files.wrong_name_server_cert(),
            files.wrong_name_server_key(),
            ClientAuth::No,
        )
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let mutual = RedisServer::builder()
        .tls(files, ClientAuth::Yes)
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let tls_port = |s: &RedisServer| s.tls_port().expect("a TLS port");
    let tls =
        |s: &RedisServer, password: &str| format!("rediss://:{password}@localhost:{}", tls_port(s));
    let is_tls = |e: &Error, says: &str| matches!(e, Error::Unavailable { reason: UnavailableReason::Tls, detail, .. } if detail.contains(says));

    // The system's roots do not hold the test CA; another CA does not either.
    let unknown_ca = vec![
        (
            "unknown CA, password in the URL".to_owned(),
            fast(Client::builder(tls(&server, PASSWORD))),
        ),
        (
            "unknown CA, percent-encoded password in the URL".to_owned(),
            fast(Client::builder(tls(&server, AWKWARD_ENCODED))),
        ),
        (
            "another CA, password given apart".to_owned(),
            fast(Client::builder(format!(
                "rediss://localhost:{}",
                tls_port(&server)
            )))
            .tls_ca_file(files.other_ca_cert())
            .password(PASSWORD),
        ),
    ];
    probe_all(&seen, unknown_ca, |e| {
        is_tls(e, "CA this client does not trust")
    })
    .await;

    let trusted = |url: String| fast(Client::builder(url)).tls_ca_file(files.ca_cert());
    probe_all(
        &seen,
        vec![(
            "a certificate for another name".to_owned(),
            trusted(tls(&wrong_name, PASSWORD)),
        )],
        |e| is_tls(e, "not valid for the host name"),
    )
    .await;
    probe_all(
        &seen,
        vec![(
            "no client certificate".to_owned(),
            trusted(tls(&mutual, PASSWORD)),
        )],
        |e| is_tls(e, "requires a client certificate"),
    )
    .await;
    // The plain port with rediss://, the TLS port with redis://: a hint about TLS.
    probe_all(
        &seen,
        vec![
            (
                "rediss:// to a plain port".to_owned(),
                trusted(format!("rediss://:{PASSWORD}@localhost:{}", server.port())),
            ),
            (
                "redis:// to a TLS port".to_owned(),
                fast(Client::builder(format!(
                    "redis://:{PASSWORD}@localhost:{}",
                    tls_port(&server)
                ))),
            ),
        ],
        |e| matches!(e, Error::Unavailable { detail, .. } if detail.contains("TLS port")),
    )
    .await;
    // Settings that cannot be used: nothing is sent.
    probe_all(
        &seen,
        vec![
            (
                "an unreadable CA file".to_owned(),
                fast(Client::builder(tls(&server, PASSWORD))).tls_ca_file("/nonexistent/ca.pem"),
            ),
            (
                "TLS settings for a plain URL".to_owned(),
                trusted(format!("redis://:{PASSWORD}@localhost:{}", server.port())),
            ),
        ],
        |e| matches!(e, Error::InvalidArgument { .. }),
    )
    .await;

    // With the CA, over TLS: the lock is taken, and nothing shows the password.
    for builder in [
        trusted(tls(&server, PASSWORD)),
        trusted(format!("rediss://localhost:{}", tls_port(&server))).password(PASSWORD),
    ] {
        let client = builder.connect().await.expect("TLS with the right CA");
        seen.debug("client over TLS", &client);
        let guard = client.lock("tls").try_acquire().await.unwrap();
        seen.debug("guard over TLS", &guard);
        guard.release().await.unwrap();
    }
    seen.assert_no_secret();
}

/// A Redis Cluster over TLS (`rediss+cluster://`, nodes on TLS ports only): without
/// the CA, or trusting another CA, every operation fails with the certificate problem;
/// with the CA, a user that exists on every node with another password is refused
/// (WRONGPASS); with its right password the lock is taken. No output shows the marker,
/// given in the URL (plainly or percent-encoded) or apart. Default timeouts, not
/// [`fast`]: a TLS handshake with each node of a cluster on a loaded machine may take
/// longer than 300 ms, and a timeout is not the failure under test.
#[tokio::test]
async fn tls_cluster_failures_never_show_the_password() {
    trace();
    let seen = Seen::default();
    let files = TlsFiles::shared();
    let cluster = Cluster::shared_tls();
    const USER: &str = "secrets-app";
    const RIGHT: &str = "the-right-one";
    for node in cluster.nodes() {
        let reply = node.cmd(&[
            "ACL",
            "SETUSER",
            USER,
            "on",
            &format!(">{RIGHT}"),
            "~*",
            "&*",
            "+@all",
        ]);
        assert_eq!(reply.as_str(), Some("OK"), "{}: {reply:?}", node.addr());
    }
    let seeds = cluster.seed_urls();
    let url = |password: &str| format!("rediss+cluster://{USER}:{password}@{seeds}");
    let is_tls = |e: &Error| matches!(e, Error::Unavailable { reason: UnavailableReason::Tls, detail, .. } if detail.contains("CA this client does not trust"));

    let untrusted = vec![
        (
            "cluster, unknown CA, password in the URL".to_owned(),
            Client::builder(url(PASSWORD)),
        ),
        (
            "cluster, unknown CA, percent-encoded password in the URL".to_owned(),
            Client::builder(url(AWKWARD_ENCODED)),
        ),
        (
            "cluster, another CA, password given apart".to_owned(),
            Client::builder(cluster.url())
                .tls_ca_file(files.other_ca_cert())
                .username(USER)
                .password(PASSWORD),
        ),
    ];
    probe_all(&seen, untrusted, is_tls).await;

    let trusted = |builder: ClientBuilder| builder.tls_ca_file(files.ca_cert());
    let wrong = vec![
        (
            "cluster, wrong password in the URL".to_owned(),
            trusted(Client::builder(url(PASSWORD))),
        ),
        (
            "cluster, wrong percent-encoded password in the URL".to_owned(),
            trusted(Client::builder(url(AWKWARD_ENCODED))),
        ),
        (
            "cluster, unencoded @ and : in the URL's wrong password".to_owned(),
            trusted(Client::builder(url(AWKWARD))),
        ),
        (
            "cluster, wrong awkward password given apart".to_owned(),
            trusted(Client::builder(cluster.url()))
                .username(USER)
                .password(AWKWARD),
        ),
    ];
    probe_all(
        &seen,
        wrong,
        |e| matches!(e, Error::Rejected { code, .. } if code == "WRONGPASS"),
    )
    .await;

    let client = trusted(Client::builder(url(RIGHT)))
        .connect()
        .await
        .expect("the right password over TLS");
    seen.debug("cluster client over TLS", &client);
    let guard = client.lock("secrets").try_acquire().await.unwrap();
    seen.debug("guard on the cluster over TLS", &guard);
    guard.release().await.unwrap();
    seen.assert_no_secret();
}

/// A URL that does not parse is refused as invalid input, naming the URL with its
/// credentials masked (`***`), whatever part of it is wrong and wherever the password
/// sits in it.
#[tokio::test]
async fn a_bad_url_is_named_with_its_passwords_masked() {
    trace();
    let seen = Seen::default();
    let bad = [
        format!("redis://:{PASSWORD}@127.0.0.1:notaport"),
        format!("redis://user:{AWKWARD_ENCODED}@127.0.0.1:notaport"),
        format!("redis://:{AWKWARD}@127.0.0.1:notaport"),
        format!("redis://:{PASSWORD}@127.0.0.1:6379/notadb"),
        format!("redis://:{PASSWORD}@0.0.0.0:6379"),
        format!("rediss://:{PASSWORD}@localhost:6379/#bogus"),
        format!("redis://:{PASSWORD}@127.0.0.1:6379/?protocol=9"),
        format!("http://:{PASSWORD}@127.0.0.1:6379"),
        format!(":{PASSWORD}@127.0.0.1:6379"),
        format!("redis+unix:///tmp/fencelock.sock?db=x&pass={PASSWORD}"),
        format!("redis+sentinel://:{PASSWORD}@127.0.0.1:26379"),
        format!(
            "redis+sentinel://:{PASSWORD}@127.0.0.1:x/svc?sentinel_password={SENTINEL_PASSWORD}"
        ),
        format!("redis+sentinel://127.0.0.1:26379/svc?sentinel_password={SENTINEL_PASSWORD}&x=1"),
        format!("redis+sentinel://127.0.0.1:26379/svc?sentinel_password={AWKWARD}&x=1"),
        format!("redis+sentinel://127.0.0.1:26379/svc/x?sentinel_password={AWKWARD_ENCODED}"),
    ];
    let cases: Vec<(String, ClientBuilder)> = bad
        .iter()
        .enumerate()
        .map(|(i, url)| (format!("bad URL #{i}"), fast(Client::builder(url))))
        .collect();
    probe_all(&seen, cases, |e| {
        matches!(
            e,
            Error::InvalidArgument {
                what: "Redis URL",
                ..
            }
        )
    })
    .await;
    // Each names the URL it refuses, masked.
    for url in &bad {
        let e = Client::builder(url).connect_lazy().await.unwrap_err();
        let message = e.to_string();
        assert!(message.contains("***"), "{url}: {message}");
    }

    // Redlock: an even number of URLs, one URL twice, one server named twice.
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let with = |host: &str| format!("redis://:{PASSWORD}@{host}:{}", server.port());
    let free = format!("redis://:{PASSWORD}@127.0.0.1:{}", testkit::free_port());
    let redlocks = vec![
        (
            "two URLs".to_owned(),
            fast(Client::redlock([with("127.0.0.1"), free.clone()])),
        ),
        (
            "one URL twice".to_owned(),
            fast(Client::redlock([
                with("127.0.0.1"),
                with("127.0.0.1"),
                free.clone(),
            ])),
        ),
    ];
    probe_all(&seen, redlocks, |e| {
        matches!(
            e,
            Error::InvalidArgument {
                what: "Redis URLs",
                ..
            }
        )
    })
    .await;
    let twice = fast(Client::redlock([
        with("127.0.0.1"),
        with("localhost"),
        free.clone(),
    ]));
    seen.debug("one server named twice: builder", &twice);
    let e = twice.connect().await.unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { reason, .. } if reason.contains("***")),
        "{e}"
    );
    seen.error("one server named twice", &e);
    seen.assert_no_secret();
}

/// Redlock with some nodes failing (down, or refusing the password): the quorum error
/// names each node and what it answered, never a password; with a majority up the lock
/// is taken, and the failing node's refusal in the trace does not show one either.
#[tokio::test]
async fn redlock_with_failing_nodes_never_shows_a_password() {
    trace();
    let seen = Seen::default();
    let servers: Vec<RedisServer> = (0..3)
        .map(|i| {
            let password = if i == 2 { "another-one" } else { PASSWORD };
            RedisServer::builder()
                .arg("--requirepass")
                .arg(password)
                .start()
        })
        .collect();
    let url = |port: u16, password: &str| format!("redis://:{password}@127.0.0.1:{port}");
    let down = || url(testkit::free_port(), PASSWORD);

    // Two of three down: no quorum.
    let minority = vec![
        (
            "passwords in the URLs".to_owned(),
            fast(Client::redlock([
                url(servers[0].port(), PASSWORD),
                down(),
                url(testkit::free_port(), AWKWARD_ENCODED),
            ])),
        ),
        (
            "password given apart".to_owned(),
            fast(Client::redlock([
                format!("redis://127.0.0.1:{}", servers[0].port()),
                format!("redis://127.0.0.1:{}", testkit::free_port()),
                format!("redis://127.0.0.1:{}", testkit::free_port()),
            ]))
            .password(PASSWORD),
        ),
    ];
    probe_all(&seen, minority, |e| match e {
        Error::NoQuorum { .. } => true,
        // What a node that is down says, reading or breaking (per node).
        Error::Unavailable {
            reason: UnavailableReason::Refused,
            ..
        } => true,
        _ => false,
    })
    .await;

    // A majority up, one refusing the password: the lock is taken.
    let majority = fast(Client::redlock([
        url(servers[0].port(), PASSWORD),
        url(servers[1].port(), PASSWORD),
        url(servers[2].port(), PASSWORD),
    ]));
    seen.debug("majority: builder", &majority);
    let client = majority
        .restart_protection(None)
        .connect()
        .await
        .expect("a majority answers");
    seen.debug("majority: client", &client);
    let lock = client.lock("redlock");
    seen.debug("majority: lock builder", &lock);
    let guard = lock.try_acquire().await.expect("a majority grants it");
    seen.debug("majority: guard", &guard);
    let refused = client.lock("redlock").try_acquire().await.unwrap_err();
    assert!(refused.is_contention(), "{refused}");
    seen.error("majority: contention", &refused);
    let status = client.inspect("redlock").await.unwrap();
    let wrongpass = status.nodes[2].state.as_ref().unwrap_err();
    assert!(
        matches!(wrongpass, Error::Rejected { code, .. } if code == "WRONGPASS"),
        "{wrongpass}"
    );
    seen.debug("majority: status", &status);
    guard.release().await.unwrap();
    seen.assert_no_secret();
}

/// Sentinel: an unknown service, a wrong sentinel password, a wrong master password and
/// every sentinel down each fail in one line without either password, given in the URL
/// (plainly or percent-encoded) or apart; with both passwords right, the lock is taken.
/// A wrong password says whose credentials were refused.
#[tokio::test]
async fn sentinel_failures_never_show_either_password() {
    trace();
    let seen = Seen::default();
    let group = SentinelGroup::builder()
        .password(PASSWORD)
        .sentinel_password(SENTINEL_PASSWORD)
        .start();
    let sentinels = group.sentinel_urls();
    let service = group.service();
    let url = |master: &str, service: &str, sentinel: &str| {
        format!("redis+sentinel://:{master}@{sentinels}/{service}?sentinel_password={sentinel}")
    };
    let apart = |service: &str| {
        fast(Client::builder(format!(
            "redis+sentinel://{sentinels}/{service}?sentinel_password={SENTINEL_PASSWORD}"
        )))
    };

    let unknown = vec![
        (
            "unknown service".to_owned(),
            fast(Client::builder(url(PASSWORD, "nosuch", SENTINEL_PASSWORD))),
        ),
        (
            "unknown service, password apart".to_owned(),
            apart("nosuch").password(AWKWARD),
        ),
    ];
    probe_all(
        &seen,
        unknown,
        |e| matches!(e, Error::Rejected { code, .. } if code == "NOSERVICE"),
    )
    .await;

    let wrong_sentinel_password = vec![(
        "wrong sentinel password".to_owned(),
        fast(Client::builder(url(PASSWORD, service, AWKWARD_ENCODED))),
    )];
    probe_all(
        &seen,
        wrong_sentinel_password,
        |e| matches!(e, Error::Rejected { message, .. } if message.contains("sentinel refuses the credentials")),
    )
    .await;

    let wrong_master_password = vec![
        (
            "wrong master password".to_owned(),
            fast(Client::builder(url(
                AWKWARD_ENCODED,
                service,
                SENTINEL_PASSWORD,
            ))),
        ),
        (
            "wrong master password apart".to_owned(),
            apart(service).password(AWKWARD),
        ),
    ];
    probe_all(&seen, wrong_master_password, |e| {
        matches!(e, Error::Rejected { message, .. } if message.contains("master refuses the credentials"))
    })
    .await;

    let nowhere = format!(
        "127.0.0.1:{},127.0.0.1:{}",
        testkit::free_port(),
        testkit::free_port()
    );
    let all_down = vec![
        (
            "every sentinel down".to_owned(),
            fast(Client::builder(format!(
                "redis+sentinel://:{PASSWORD}@{nowhere}/{service}?sentinel_password={SENTINEL_PASSWORD}"
            ))),
        ),
        (
            "every sentinel down, awkward passwords".to_owned(),
            fast(Client::builder(format!(
                "redis+sentinel://:{AWKWARD_ENCODED}@{nowhere}/{service}?sentinel_password={AWKWARD}"
            ))),
        ),
    ];
    probe_all(
        &seen,
        all_down,
        |e| matches!(e, Error::Unavailable { detail, .. } if detail.contains("every sentinel")),
    )
    .await;

    for builder in [
        fast(Client::builder(url(PASSWORD, service, SENTINEL_PASSWORD))),
        apart(service).password(PASSWORD),
    ] {
        seen.debug("sentinel: builder", &builder);
        let client = builder.connect().await.expect("both passwords right");
        seen.debug("sentinel: client", &client);
        let guard = client.lock("sentinel").try_acquire().await.unwrap();
        seen.debug("sentinel: guard", &guard);
        guard.release().await.unwrap();
    }
    seen.assert_no_secret();
}

/// A lock taken with a password shows, in `Debug`, its name and fencing token, and
/// neither the password, the holder token nor a reentrant owner id: not in the client,
/// the lock builder, the guard, an acquisition, a delay queue, or a contention error.
#[tokio::test]
async fn a_held_lock_shows_its_name_and_token_but_no_secret() {
    trace();
    let seen = Seen::default();
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let mut tokens = Vec::new();
    for builder in [
        Client::builder(format!("redis://:{PASSWORD}@{}", server.addr())),
        Client::builder(server.url()).password(PASSWORD),
    ] {
        seen.debug("builder", &builder);
        let client = builder.connect().await.unwrap();
        let shown = format!("{client:?}");
        assert!(shown.contains(&server.addr()), "{shown}");
        seen.text("client", shown);

        for (what, lock) in [
            ("plain", client.lock("held")),
            ("fair", client.lock("held").fair()),
            ("reentrant", client.lock("held").reentrant(OWNER)),
        ] {
            seen.debug(&format!("{what}: lock builder"), &lock);
            let guard = lock.try_acquire().await.unwrap();
            tokens.push(guard.holder_token().to_string());
            let shown = format!("{guard:?}");
            assert!(shown.contains("\"held\""), "{shown}");
            assert!(
                shown.contains(&guard.fencing_token().to_string()),
                "{shown}"
            );
            seen.text(format!("{what}: guard"), shown);
            seen.text(format!("{what}: guard"), format!("{guard:#?}"));
            let refused = client.lock("held").try_acquire().await.unwrap_err();
            assert!(refused.is_contention(), "{refused}");
            seen.error(&format!("{what}: contention"), &refused);
            guard.release().await.unwrap();
        }

        let queue = client.delay_queue("held").unwrap();
        seen.debug("delay queue", &queue);
        let acquired = client
            .lock("held")
            .acquire_or_defer(&queue, b"work", Duration::ZERO)
            .await
            .unwrap();
        seen.debug("acquisition", &acquired);
        if let fencelock::Acquisition::Acquired(guard) = acquired {
            tokens.push(guard.holder_token().to_string());
            guard.release().await.unwrap();
        }
        client.flush().await;
    }
    seen.assert_no_secret();
    // Nor a holder token, anywhere.
    let trace = trace().text();
    let seen = seen.0.lock().unwrap();
    let all = seen
        .iter()
        .map(|(what, text)| (what.as_str(), text.as_str()))
        .chain(trace.lines().map(|line| ("trace", line)));
    for (what, text) in all {
        for token in &tokens {
            assert!(
                !text.contains(token),
                "{what} shows a holder token:\n{text}"
            );
        }
    }
}
