//! `rediss+cluster://` against a real Redis Cluster on TLS ports only (testkit's
//! `ClusterBuilder::tls`: 3 masters with a replica each, no plain port, the cluster bus
//! and replication over TLS too): a lock taken on the master of its slot and released,
//! a waiter in another client woken by the release over sharded pub/sub, and the bad
//! days, one line each: no CA or another CA (the certificate problem named, never
//! "every seed is down", never a hang), a wrong password (never shown).
//!
//! Its own file rather than part of `tls.rs` or `cluster.rs`: the tests share one TLS
//! cluster ([`Cluster::shared_tls`], each with lock names of its own), started once per
//! test binary, and neither of the others needs one. The shared cluster asks clients
//! for no certificate; mutual TLS has a cluster of its own that requires one
//! (`ClusterBuilder::tls_client_auth`).

use std::error::Error as _;
use std::time::{Duration, Instant};

use fencelock::{Client, ClientBuilder, Error};
use testkit::{ClientAuth, Cluster, RedisServer, TlsFiles};

mod common;
use common::{connect_error, eventually, tls_line};

/// The key of lock `name` under the default prefix.
fn key(name: &str) -> String {
    format!("fencelock:{{{name}}}")
}

/// A client builder for the TLS cluster, trusting testkit's CA (`--cacert`).
fn over_tls(cluster: &Cluster) -> ClientBuilder {
    Client::builder(cluster.url()).tls_ca_file(TlsFiles::shared().ca_cert())
}

/// The number of sharded subscribers `node` has for `channel` (`PUBSUB SHARDNUMSUB`).
fn shard_subscribers(node: &RedisServer, channel: &str) -> i64 {
    let reply = node.cmd(&["PUBSUB", "SHARDNUMSUB", channel]);
    reply
        .as_array()
        .and_then(|a| a.get(1)?.as_int())
        .unwrap_or_else(|| panic!("PUBSUB SHARDNUMSUB: {reply:?}"))
}

/// Asserts that `err` is a TLS failure said in one line that names the untrusted CA
/// and does not blame the seeds, and returns the line.
#[track_caller]
fn untrusted_ca(err: &Error) -> String {
    let line = tls_line(err);
    assert!(line.contains("CA this client does not trust"), "{line}");
    assert!(!line.contains("every seed"), "{line}");
    line
}

/// A user giving the CA takes a lock over rediss+cluster://: its key is on the master
/// of its slot, reached by its TLS port; another attempt is refused while it is held;
/// the release deletes the key.
#[tokio::test]
async fn a_lock_over_a_tls_cluster_is_held_and_released() {
    let cluster = Cluster::shared_tls();
    assert!(
        cluster.url().starts_with("rediss+cluster://"),
        "{}",
        cluster.url()
    );
    let client = over_tls(cluster).connect().await.unwrap();
    let guard = client.lock("report").try_acquire().await.unwrap();
    let owner = cluster.node_for_key(&key("report"));
    assert_eq!(
        owner.get(&key("report")).as_deref(),
        Some(guard.holder_token().as_str()),
        "the key on {} holds the guard's token",
        owner.addr()
    );
    let again = client.lock("report").try_acquire().await;
    assert!(matches!(again, Err(Error::Held { .. })), "{again:?}");
    guard.release().await.unwrap();
    assert!(!owner.exists(&key("report")), "released");
}

/// A waiter in another client subscribes on the master of the lock's slot (sharded
/// pub/sub, over TLS) and is woken by the release: the holder's lease is 30 s, and the
/// waiter's only timer is that lease, so a grant within 2 s came from the message.
#[tokio::test]
async fn a_release_wakes_a_waiter_in_another_client_by_sharded_pub_sub_over_tls() {
    let cluster = Cluster::shared_tls();
    let holder = over_tls(cluster).connect().await.unwrap();
    let other = over_tls(cluster).connect().await.unwrap();
    let guard = holder
        .lock("wake")
        .lease(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(other.lock("wake").wait(Duration::from_secs(60)).acquire());
    eventually(
        "the waiter subscribed",
        Duration::from_secs(10),
        async || {
            let stats = other.stats();
            // The lock's channel and this client's own.
            stats.waiters == 1 && stats.subscribed_channels == 2
        },
    )
    .await;
    let channel = format!("{}:released", key("wake"));
    let owner = cluster.node_for_key(&key("wake"));
    eventually(
        "the master of the lock's slot has the sharded subscription",
        Duration::from_secs(10),
        async || shard_subscribers(owner, &channel) == 1,
    )
    .await;
    let next = common::handed_to(guard, waiter).await;
    assert_eq!(
        owner.get(&key("wake")).as_deref(),
        Some(next.holder_token().as_str()),
        "the waiter holds it"
    );
    next.release().await.unwrap();
    eventually(
        "the waiter unsubscribed",
        Duration::from_secs(10),
        async || other.stats().subscribed_channels == 0,
    )
    .await;
    assert_eq!(shard_subscribers(owner, &channel), 0);
}

/// Without the CA (the system's roots do not hold testkit's), or trusting another CA,
/// every seed refuses the handshake: the error is reason Tls and names the certificate
/// problem in one line, promptly, rather than "every seed is down". A lazy client's
/// waiting acquire, `inspect` and `list` say the same at once, not when the wait ends.
#[tokio::test]
async fn without_the_ca_the_certificate_problem_is_named_not_every_seed_down() {
    let cluster = Cluster::shared_tls();
    let files = TlsFiles::shared();
    let mistakes = [
        ("no CA given", Client::builder(cluster.url())),
        (
            "another CA",
            Client::builder(cluster.url()).tls_ca_file(files.other_ca_cert()),
        ),
    ];
    for (mistake, builder) in mistakes {
        let line = untrusted_ca(&connect_error(builder.clone()).await);
        eprintln!("{mistake}: {line}");

        let lazy = builder.connect_lazy().await.unwrap();
        let started = Instant::now();
        let err = lazy
            .lock("no-ca")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap_err();
        untrusted_ca(&err);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{mistake}: reported after {:?}, not at once",
            started.elapsed()
        );
        untrusted_ca(&lazy.inspect("no-ca").await.unwrap_err());
        untrusted_ca(&lazy.list("").await.unwrap_err());
    }
}

/// A user that exists on every node, given with a wrong password: refused as WRONGPASS
/// in one line, by an eager connect and by a lazy client's first call, which never
/// shows the password (nor its `Debug`, nor any source); with the right password the
/// same user takes a lock.
#[tokio::test]
async fn a_wrong_password_over_tls_is_one_line_and_never_shown() {
    const USER: &str = "tls-cluster-app";
    const RIGHT: &str = "the-right-one";
    const WRONG: &str = "WRONG-MARKER-3b9e";
    let cluster = Cluster::shared_tls();
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
    let cases = [
        (
            "in the URL",
            Client::builder(format!("rediss+cluster://{USER}:{WRONG}@{seeds}")),
        ),
        (
            "given apart",
            Client::builder(cluster.url())
                .username(USER)
                .password(WRONG),
        ),
    ];
    for (how, builder) in cases {
        let builder = builder.tls_ca_file(TlsFiles::shared().ca_cert());
        // A lazy client hears the same from its first call.
        let lazy = builder.clone().connect_lazy().await.unwrap();
        let lazy_err = lazy.lock("wrong-pw").try_acquire().await.unwrap_err();
        assert!(
            matches!(&lazy_err, Error::Rejected { code, .. } if code == "WRONGPASS"),
            "{how}, lazily: {lazy_err:?}"
        );
        let err = connect_error(builder.clone()).await;
        assert!(
            matches!(&err, Error::Rejected { code, .. } if code == "WRONGPASS"),
            "{how}: {err:?}"
        );
        let line = err.to_string();
        assert_eq!(line.lines().count(), 1, "{how}: {line:?}");
        assert!(
            line.contains("wrong user name or password"),
            "{how}: {line}"
        );
        let mut shown = vec![
            line,
            format!("{err:?}"),
            format!("{err:#?}"),
            lazy_err.to_string(),
            format!("{lazy_err:?}"),
        ];
        let mut source = err.source();
        while let Some(s) = source {
            shown.push(s.to_string());
            shown.push(format!("{s:?}"));
            source = s.source();
        }
        shown.push(format!("{builder:?}"));
        for text in shown {
            assert!(!text.contains(WRONG), "{how}: the password shows in {text}");
        }
    }
    let right = Client::builder(format!("rediss+cluster://{USER}:{RIGHT}@{seeds}"))
        .tls_ca_file(TlsFiles::shared().ca_cert())
        .connect()
        .await
        .unwrap();
    right
        .lock("wrong-pw")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Mutual TLS over rediss+cluster://: on a cluster of its own whose every node requires
/// a client certificate, a client without one is refused in one line naming it (not
/// "every seed is down"), as is one with a certificate from another CA; a client with
/// the right one takes the lock on the master of its slot (a node the driver found from
/// the seeds), holds and releases it, and a waiter in another client is woken by the
/// release over sharded pub/sub (connections of their own, with the certificate too).
#[tokio::test]
async fn mutual_tls_refuses_a_client_without_its_certificate_and_takes_one_with_it() {
    let files = TlsFiles::shared();
    let cluster = Cluster::builder()
        .tls(files)
        .tls_client_auth(ClientAuth::Yes)
        .start();
    // Seeded by one master only: the other nodes are found, and reached with the
    // certificate, from what it says.
    let seed = cluster.masters()[0].addr();
    let url = format!("rediss+cluster://{seed}");
    let over_tls = || Client::builder(&url).tls_ca_file(files.ca_cert());

    let line = tls_line(&connect_error(over_tls()).await);
    assert!(line.contains("requires a client certificate"), "{line}");
    assert!(!line.contains("every seed"), "{line}");

    let stranger =
        over_tls().tls_client_cert(files.other_ca_server_cert(), files.other_ca_server_key());
    let line = tls_line(&connect_error(stranger).await);
    assert!(
        line.contains("refused the client certificate (UnknownCA)"),
        "{line}"
    );

    let with_cert = || over_tls().tls_client_cert(files.client_cert(), files.client_key());
    let holder = with_cert().connect().await.unwrap();
    let other = with_cert().connect().await.unwrap();
    // A lock whose slot is not served by the seed.
    let name = (0..)
        .map(|i| format!("mtls-{i}"))
        .find(|name| cluster.node_for_key(&key(name)).addr() != seed)
        .unwrap();
    let owner = cluster.node_for_key(&key(&name));
    let guard = holder
        .lock(&name)
        .lease(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(
        owner.get(&key(&name)).as_deref(),
        Some(guard.holder_token().as_str()),
        "the key on {} holds the guard's token",
        owner.addr()
    );
    let again = other.lock(&name).try_acquire().await;
    assert!(matches!(again, Err(Error::Held { .. })), "{again:?}");

    let waiter = tokio::spawn(other.lock(&name).wait(Duration::from_secs(60)).acquire());
    let channel = format!("{}:released", key(&name));
    eventually(
        "the master of the lock's slot has the sharded subscription",
        Duration::from_secs(10),
        async || shard_subscribers(owner, &channel) == 1,
    )
    .await;
    let next = common::handed_to(guard, waiter).await;
    assert_eq!(
        owner.get(&key(&name)).as_deref(),
        Some(next.holder_token().as_str()),
        "the waiter holds it"
    );
    next.release().await.unwrap();
    assert!(!owner.exists(&key(&name)), "released");
}

/// `tls_insecure_skip_verify` over rediss+cluster://: without the CA, where every seed
/// refuses the handshake (the other test), skipping the verification reaches the
/// seed and every node found from it, and a lock is taken on the master of its slot.
/// (Against the shared cluster's own certificate: a cluster serving a certificate for
/// another name would need testkit's own client to skip names too.)
#[tokio::test]
async fn insecure_skips_the_verification_of_every_nodes_certificate() {
    let cluster = Cluster::shared_tls();
    let seed = cluster.masters()[0].addr();
    let url = format!("rediss+cluster://{seed}");
    untrusted_ca(&connect_error(Client::builder(&url)).await);

    let client = Client::builder(&url)
        .tls_insecure_skip_verify(true)
        .connect()
        .await
        .unwrap();
    // A lock on each master: the seed and the nodes found from it.
    for master in cluster.masters() {
        let name = (0..)
            .map(|i| format!("insecure-{i}"))
            .find(|name| cluster.node_for_key(&key(name)).addr() == master.addr())
            .unwrap();
        let guard = client.lock(&name).try_acquire().await.unwrap();
        assert_eq!(
            master.get(&key(&name)).as_deref(),
            Some(guard.holder_token().as_str()),
            "the key on {} holds the guard's token",
            master.addr()
        );
        guard.release().await.unwrap();
        assert!(!master.exists(&key(&name)), "released");
    }
}
