//! TLS (`rediss://`) against real redis-servers with a TLS port: locks over TLS, mutual
//! TLS, each certificate mistake as one line naming it, the TLS/plain mix-ups with their
//! hints, bad TLS settings refused before anything is sent, and sentinels over TLS
//! (`rediss+sentinel://`), mutual TLS and `--insecure` included. The certificates are
//! testkit's (see `testkit::tls`); testkit itself talks to the servers' plain ports.

use std::time::Duration;

use fencelock::{Client, ClientBuilder, Error, UnavailableReason};
use testkit::{ClientAuth, RedisServer, SentinelGroup, TlsFiles};

mod common;
use common::{connect_error, eventually, tls_line};

/// A client builder for the server's TLS port, trusting testkit's CA (`--cacert`).
fn over_tls(server: &RedisServer) -> ClientBuilder {
    Client::builder(server.tls_url().expect("a TLS port")).tls_ca_file(TlsFiles::shared().ca_cert())
}

/// A server with a TLS port serving `cert` and `key` (signed as their names say).
fn serving(cert: impl AsRef<std::path::Path>, key: impl AsRef<std::path::Path>) -> RedisServer {
    let files = TlsFiles::shared();
    RedisServer::builder()
        .tls_with(files, cert, key, ClientAuth::No)
        .start()
}

/// Asserts that `err` is `InvalidArgument` about `what`, and returns its message.
#[track_caller]
fn invalid(err: &Error, what: &str) -> String {
    assert!(
        matches!(err, Error::InvalidArgument { what: w, .. } if *w == what),
        "expected InvalidArgument about {what}, got {err:?}"
    );
    err.to_string()
}

/// A user giving the CA (`--cacert`) takes, holds and releases a lock over rediss://,
/// and the key is on the server while it is held.
#[tokio::test]
async fn a_lock_over_tls_is_taken_held_and_released() {
    let server = RedisServer::builder()
        .tls(TlsFiles::shared(), ClientAuth::No)
        .start();
    let client = over_tls(&server).connect().await.unwrap();
    assert_eq!(
        client.node(),
        format!("localhost:{}", server.tls_port().unwrap())
    );
    let guard = client.lock("report").try_acquire().await.unwrap();
    assert_eq!(
        server.get("fencelock:{report}").as_deref(),
        Some(guard.holder_token().as_str()),
        "the key holds the guard's token"
    );
    // Held: another attempt over TLS is refused.
    let again = client.lock("report").try_acquire().await;
    assert!(matches!(again, Err(Error::Held { .. })), "{again:?}");
    guard.release().await.unwrap();
    assert!(!server.exists("fencelock:{report}"), "released");

    // The certificate names the address too.
    let by_address = Client::builder(format!("rediss://127.0.0.1:{}", server.tls_port().unwrap()))
        .tls_ca_file(TlsFiles::shared().ca_cert())
        .connect()
        .await
        .unwrap();
    let guard = by_address.lock("report").try_acquire().await.unwrap();
    assert!(server.exists("fencelock:{report}"));
    guard.release().await.unwrap();
}

/// A waiter over TLS is woken by the holder's release (pub/sub over TLS), long before
/// the holder's lease would have run out.
#[tokio::test]
async fn a_waiter_over_tls_is_woken_by_the_release() {
    let server = RedisServer::builder()
        .tls(TlsFiles::shared(), ClientAuth::No)
        .start();
    let client = over_tls(&server).connect().await.unwrap();
    let guard = client
        .lock("queue")
        .lease(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(client.lock("queue").wait(Duration::from_secs(20)).acquire());
    eventually(
        "the waiter subscribed",
        Duration::from_secs(5),
        async || {
            let stats = client.stats();
            // The lock's channel and this client's own.
            stats.waiters == 1 && stats.subscribed_channels == 2
        },
    )
    .await;
    let next = common::handed_to(guard, waiter).await;
    assert!(server.exists("fencelock:{queue}"), "the waiter holds it");
    next.release().await.unwrap();
}

/// Mutual TLS: a server that requires a client certificate refuses a client without
/// one, saying so in one line, and a client certificate signed by another CA, and lets
/// in a client with the right one.
#[tokio::test]
async fn mutual_tls_refuses_a_client_without_its_certificate_and_takes_one_with_it() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder().tls(files, ClientAuth::Yes).start();

    let line = tls_line(&connect_error(over_tls(&server)).await);
    assert!(line.contains("requires a client certificate"), "{line}");

    let stranger = over_tls(&server)
        .tls_client_cert(files.other_ca_server_cert(), files.other_ca_server_key());
    let line = tls_line(&connect_error(stranger).await);
    assert!(
        line.contains("refused the client certificate (UnknownCA)"),
        "{line}"
    );

    let client = over_tls(&server)
        .tls_client_cert(files.client_cert(), files.client_key())
        .connect()
        .await
        .unwrap();
    let guard = client.lock("mtls").try_acquire().await.unwrap();
    assert!(server.exists("fencelock:{mtls}"));
    guard.release().await.unwrap();
    assert!(!server.exists("fencelock:{mtls}"));
}

/// Over TLS 1.2, where a server has no alert of its own for a missing client
/// certificate, the message still points at the client certificate.
#[tokio::test]
async fn mutual_tls_over_tls_1_2_still_points_at_the_client_certificate() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder()
        .tls(files, ClientAuth::Yes)
        .args(["--tls-protocols", "TLSv1.2"])
        .start();
    let line = tls_line(&connect_error(over_tls(&server)).await);
    assert!(line.contains("client certificate"), "{line}");

    let client = over_tls(&server)
        .tls_client_cert(files.client_cert(), files.client_key())
        .connect()
        .await
        .unwrap();
    client
        .lock("tls12")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Each certificate mistake is its own one-line message, naming it: a CA the client
/// was not given, a server certificate from another CA, one for another name, an
/// expired one, and no client certificate for a server that requires one.
#[tokio::test]
async fn each_certificate_mistake_is_one_line_naming_it() {
    let files = TlsFiles::shared();
    let good = RedisServer::builder().tls(files, ClientAuth::No).start();
    let other_ca = serving(files.other_ca_server_cert(), files.other_ca_server_key());
    let wrong_name = serving(
        files.wrong_name_server_cert(),
        files.wrong_name_server_key(),
    );
    let expired = serving(files.expired_server_cert(), files.expired_server_key());
    let mutual = RedisServer::builder().tls(files, ClientAuth::Yes).start();

    const WORDS: [&str; 4] = ["not trust", "host name", "expired", "client certificate"];
    let mistakes = [
        (
            "no CA given (the system's roots do not know testkit's)",
            Client::builder(good.tls_url().unwrap()),
            "not trust",
        ),
        (
            "a server certificate from another CA",
            over_tls(&other_ca),
            "not trust",
        ),
        (
            "a server certificate for another name",
            over_tls(&wrong_name),
            "host name",
        ),
        (
            "an expired server certificate",
            over_tls(&expired),
            "expired",
        ),
        (
            "no client certificate for mutual TLS",
            over_tls(&mutual),
            "client certificate",
        ),
    ];
    for (mistake, builder, word) in mistakes {
        let err = connect_error(builder).await;
        let line = tls_line(&err);
        assert!(line.contains(word), "{mistake}: {line}");
        for other in WORDS.iter().filter(|w| **w != word) {
            assert!(!line.contains(other), "{mistake} says {other:?}: {line}");
        }
    }
}

/// A waiting acquire does not wait out a certificate problem: it is configuration,
/// and the user hears of it at once, not when the wait ends.
#[tokio::test]
async fn a_wait_does_not_wait_out_a_certificate_problem() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder().tls(files, ClientAuth::No).start();
    let client = Client::builder(server.tls_url().unwrap())
        .connect_lazy()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let err = client
        .lock("w")
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap_err();
    assert!(tls_line(&err).contains("not trust"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "reported after {:?}, not at once",
        started.elapsed()
    );
}

/// `tls_insecure_skip_verify` (`--insecure`) lets a client in where verification
/// would refuse the certificate: another name, another CA.
#[tokio::test]
async fn insecure_skips_the_verification_of_the_servers_certificate() {
    let files = TlsFiles::shared();
    let wrong_name = serving(
        files.wrong_name_server_cert(),
        files.wrong_name_server_key(),
    );
    let other_ca = serving(files.other_ca_server_cert(), files.other_ca_server_key());
    for server in [&wrong_name, &other_ca] {
        let client = Client::builder(server.tls_url().unwrap())
            .tls_insecure_skip_verify(true)
            .connect()
            .await
            .unwrap();
        let guard = client.lock("insecure").try_acquire().await.unwrap();
        assert!(server.exists("fencelock:{insecure}"));
        guard.release().await.unwrap();
    }
}

/// A TLS/plain mix-up says which scheme to use: rediss:// to a plain port (no
/// handshake ever comes) and redis:// to a TLS port (the connection is dropped).
#[tokio::test]
async fn a_tls_plain_mix_up_gets_a_hint_to_use_the_other_scheme() {
    let server = RedisServer::builder()
        .tls(TlsFiles::shared(), ClientAuth::No)
        .start();

    let tls_to_plain = Client::builder(format!("rediss://localhost:{}", server.port()))
        .tls_ca_file(TlsFiles::shared().ca_cert());
    let err = connect_error(tls_to_plain).await;
    assert!(
        matches!(&err, Error::Unavailable { reason: UnavailableReason::TimedOut, detail, .. }
            if detail.contains("no TLS handshake") && detail.contains("use redis://")),
        "{err:?}"
    );
    assert_eq!(err.to_string().lines().count(), 1, "{err}");

    let plain_to_tls = Client::builder(format!("redis://localhost:{}", server.tls_port().unwrap()));
    let err = connect_error(plain_to_tls).await;
    assert!(
        matches!(&err, Error::Unavailable { reason: UnavailableReason::Io, detail, .. }
            if detail.contains("TLS port") && detail.contains("use rediss://")),
        "{err:?}"
    );
    assert_eq!(err.to_string().lines().count(), 1, "{err}");
}

/// A CA file that is missing or holds no certificate, a client key that is not a key,
/// and TLS settings with a URL without TLS are bad input, said before anything is sent
/// (a lazy client too).
#[tokio::test]
async fn bad_tls_files_and_tls_settings_without_tls_are_invalid_arguments() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder().tls(files, ClientAuth::No).start();
    let url = server.tls_url().unwrap();

    let missing = Client::builder(&url).tls_ca_file("/nonexistent/ca.crt");
    let message = invalid(&connect_error(missing).await, "TLS CA file");
    assert!(
        message.contains("cannot read /nonexistent/ca.crt"),
        "{message}"
    );

    // (The server's directory is a temporary one, removed with it.)
    let not_pem = server.dir().join("not-a-certificate.crt");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
    let message = invalid(
        &connect_error(Client::builder(&url).tls_ca_file(&not_pem)).await,
        "TLS CA file",
    );
    assert!(message.contains("holds no PEM certificate"), "{message}");
    // A key where the CA should be: not a certificate either, and found without a
    // connection.
    let lazy = Client::builder(&url)
        .tls_ca_file(files.ca_key())
        .connect_lazy()
        .await;
    invalid(&lazy.unwrap_err(), "TLS CA file");

    let key_not_a_key = Client::builder(&url)
        .tls_ca_file(files.ca_cert())
        .tls_client_cert(files.client_cert(), files.client_cert());
    let message = invalid(&connect_error(key_not_a_key).await, "TLS client key");
    assert!(message.contains("holds no PEM private key"), "{message}");

    for plain in [
        server.url(),
        format!("redis+sentinel://127.0.0.1:{}/mymaster", server.port()),
    ] {
        for builder in [
            Client::builder(&plain).tls_ca_file(files.ca_cert()),
            Client::builder(&plain).tls_client_cert(files.client_cert(), files.client_key()),
            Client::builder(&plain).tls_insecure_skip_verify(true),
        ] {
            let message = invalid(&connect_error(builder).await, "TLS settings");
            assert!(message.contains("use rediss://"), "{plain}: {message}");
        }
    }
}

/// rediss+sentinel://: the sentinels, and the master they name, over TLS. A lock is
/// taken on the master and a waiter woken by its release; without the CA, the
/// certificate problem is named, not hidden behind "every sentinel is down".
#[tokio::test]
async fn locks_through_sentinels_over_tls() {
    let files = TlsFiles::shared();
    let group = SentinelGroup::builder().tls(files).start();
    assert!(
        group.url().starts_with("rediss+sentinel://"),
        "{}",
        group.url()
    );

    let client = Client::builder(group.url())
        .tls_ca_file(files.ca_cert())
        .connect()
        .await
        .unwrap();
    assert_eq!(client.node(), group.master_addr());
    let guard = client.lock("svc").try_acquire().await.unwrap();
    assert!(group.master().exists("fencelock:{svc}"));
    let waiter = tokio::spawn(client.lock("svc").wait(Duration::from_secs(20)).acquire());
    eventually(
        "the waiter subscribed",
        Duration::from_secs(5),
        async || client.stats().waiters == 1,
    )
    .await;
    let next = common::handed_to(guard, waiter).await;
    next.release().await.unwrap();
    assert!(!group.master().exists("fencelock:{svc}"));

    let line = tls_line(&connect_error(Client::builder(group.url())).await);
    assert!(line.contains("not trust"), "{line}");
}

/// Mutual TLS through sentinels (`rediss+sentinel://`): with every sentinel and data
/// node requiring a client certificate, a client without one is refused in one line
/// naming it (not "every sentinel is down"), and a client with it finds the master
/// through the sentinels, takes, holds and releases a lock, and a waiter is woken by
/// the release (its subscription is a connection of its own, with the certificate too).
#[tokio::test]
async fn mutual_tls_through_sentinels_refuses_a_client_without_its_certificate() {
    let files = TlsFiles::shared();
    let group = SentinelGroup::builder()
        .tls_with(
            files,
            files.server_cert(),
            files.server_key(),
            ClientAuth::Yes,
        )
        .start();
    let over_tls = || Client::builder(group.url()).tls_ca_file(files.ca_cert());

    let line = tls_line(&connect_error(over_tls()).await);
    assert!(line.contains("requires a client certificate"), "{line}");
    assert!(!line.contains("every sentinel"), "{line}");
    // The master requires one too (the sentinels above refused first).
    let master =
        Client::builder(format!("rediss://{}", group.master_addr())).tls_ca_file(files.ca_cert());
    let line = tls_line(&connect_error(master).await);
    assert!(line.contains("requires a client certificate"), "{line}");

    let stranger =
        over_tls().tls_client_cert(files.other_ca_server_cert(), files.other_ca_server_key());
    let line = tls_line(&connect_error(stranger).await);
    assert!(
        line.contains("refused the client certificate (UnknownCA)"),
        "{line}"
    );

    let client = over_tls()
        .tls_client_cert(files.client_cert(), files.client_key())
        .connect()
        .await
        .unwrap();
    assert_eq!(client.node(), group.master_addr());
    let guard = client
        .lock("mtls-svc")
        .lease(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(
        group.master().get("fencelock:{mtls-svc}").as_deref(),
        Some(guard.holder_token().as_str()),
        "the key on the master holds the guard's token"
    );
    let again = client.lock("mtls-svc").try_acquire().await;
    assert!(matches!(again, Err(Error::Held { .. })), "{again:?}");
    let waiter = tokio::spawn(
        client
            .lock("mtls-svc")
            .wait(Duration::from_secs(20))
            .acquire(),
    );
    eventually(
        "the waiter subscribed",
        Duration::from_secs(5),
        async || {
            let stats = client.stats();
            // The lock's channel and this client's own.
            stats.waiters == 1 && stats.subscribed_channels == 2
        },
    )
    .await;
    let next = common::handed_to(guard, waiter).await;
    next.release().await.unwrap();
    assert!(!group.master().exists("fencelock:{mtls-svc}"));
}

/// `tls_insecure_skip_verify` through sentinels: every sentinel and data node serves a
/// certificate for another name (the group still forms: Redis checks chains, not
/// names). Verified, the name is refused, in one line naming it; skipping the
/// verification, the sentinels and the master they name are reached and a lock taken.
#[tokio::test]
async fn insecure_through_sentinels_skips_the_name_check() {
    let files = TlsFiles::shared();
    let group = SentinelGroup::builder()
        .tls_with(
            files,
            files.wrong_name_server_cert(),
            files.wrong_name_server_key(),
            ClientAuth::No,
        )
        .start();

    let verified = Client::builder(group.url()).tls_ca_file(files.ca_cert());
    let line = tls_line(&connect_error(verified).await);
    assert!(line.contains("host name"), "{line}");

    let client = Client::builder(group.url())
        .tls_insecure_skip_verify(true)
        .connect()
        .await
        .unwrap();
    assert_eq!(client.node(), group.master_addr());
    let guard = client.lock("insecure-svc").try_acquire().await.unwrap();
    assert!(group.master().exists("fencelock:{insecure-svc}"));
    guard.release().await.unwrap();
    assert!(!group.master().exists("fencelock:{insecure-svc}"));
}
