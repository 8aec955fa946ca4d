//! A fencelock client made from the application's own redis-rs client
//! (`Client::from_redis`, `Client::from_redis_cluster`), against real servers: over
//! mutual TLS as the guide's least-privilege ACL user (the settings come with the
//! application's client, and fencelock's connections log in with them), waits woken by
//! pub/sub through it, a wrong password refused, and the builder's own TLS and login
//! settings refused as a conflict.

use std::time::Duration;

use fencelock::redis::cluster::ClusterClientBuilder;
use fencelock::redis::{ClientTlsConfig, TlsCertificates};
use fencelock::{Client, Error};
use testkit::{ClientAuth, Cluster, RedisServer, TlsFiles};

const GUIDE: &str = include_str!("../../../docs/guide/src/security.md");

/// The guide's `ACL SETUSER fencelock ...` rules for `user` with `password`, plus
/// `extra` rules.
fn guide_user(user: &str, password: &str, extra: &str) -> Vec<String> {
    let line = GUIDE
        .lines()
        .find(|l| l.starts_with("ACL SETUSER fencelock "))
        .expect("the guide's ACL line");
    line.split_whitespace()
        .chain(extra.split_whitespace())
        .map(|w| match w {
            "fencelock" => user.to_owned(),
            ">CHANGE-ME" => format!(">{password}"),
            w => w.to_owned(),
        })
        .collect()
}

fn create_user(node: &RedisServer, rules: &[String]) {
    let args: Vec<&str> = rules.iter().map(String::as_str).collect();
    let reply = node.cmd(&args);
    assert_eq!(reply.as_str(), Some("OK"), "{}: {reply:?}", node.addr());
}

fn certificates(files: &TlsFiles, client: bool) -> TlsCertificates {
    let read = |p: std::path::PathBuf| std::fs::read(p).unwrap();
    TlsCertificates {
        client_tls: client.then(|| ClientTlsConfig {
            client_cert: read(files.client_cert()),
            client_key: read(files.client_key()),
        }),
        root_cert: Some(read(files.ca_cert())),
    }
}

/// The application's client: mutual TLS and the ACL user, in its URL and certificates.
fn app_client(server: &RedisServer, password: &str) -> fencelock::redis::Client {
    let files = TlsFiles::shared();
    let url = server
        .tls_url()
        .unwrap()
        .replace("rediss://", &format!("rediss://app-user:{password}@"));
    fencelock::redis::Client::build_with_tls(url, certificates(files, true)).unwrap()
}

// Two workers: the test's own waits block its thread while the waiter runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_client_with_mutual_tls_and_an_acl_user_is_reused() {
    let server = RedisServer::builder()
        .tls(TlsFiles::shared(), ClientAuth::Yes)
        .start();
    create_user(&server, &guide_user("app-user", "app-pw", ""));
    let locks = Client::from_redis(app_client(&server, "app-pw"))
        .connect()
        .await
        .unwrap();
    let guard = locks.lock("orders:7").try_acquire().await.unwrap();
    // fencelock's connections logged in as the application's user.
    let clients = server.cmd(&["CLIENT", "LIST"]);
    let clients = clients.as_str().unwrap_or_default().to_owned();
    assert!(clients.contains("user=app-user"), "{clients}");
    // A waiter in another client of the same application client, woken by the release
    // (pub/sub through the application's settings too).
    let other = Client::from_redis(app_client(&server, "app-pw"))
        .connect()
        .await
        .unwrap();
    a_waiter_is_woken_by_the_release(guard, other).await;
}

/// Releases `guard` while `other` waits for the same lock: the waiter is woken by the
/// release (pub/sub through `other`'s connections), well before its wait's end.
async fn a_waiter_is_woken_by_the_release(guard: fencelock::LockGuard, other: Client) {
    let name = guard.name().to_owned();
    let watched = other.clone();
    let waiter = tokio::spawn(async move {
        other
            .lock(name)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    testkit::eventually("the waiter waits", Duration::from_secs(10), || {
        watched.stats().waiters == 1
    });
    let started = std::time::Instant::now();
    guard.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken, not timed out"
    );
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_wrong_password_in_the_application_client_is_refused_in_one_line() {
    let server = RedisServer::builder()
        .tls(TlsFiles::shared(), ClientAuth::Yes)
        .start();
    create_user(&server, &guide_user("app-user", "app-pw", ""));
    let err = Client::from_redis(app_client(&server, "WRONG-7f3a"))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Rejected { code, .. } if code == "WRONGPASS"),
        "{err:?}"
    );
    assert!(!err.to_string().contains("WRONG-7f3a"), "{err}");
}

#[tokio::test]
async fn the_builder_refuses_login_and_tls_settings_of_its_own() {
    let server = RedisServer::start();
    let app = fencelock::redis::Client::open(server.url().as_str()).unwrap();
    let ca = TlsFiles::shared().ca_cert();
    for builder in [
        Client::from_redis(app.clone()).username("x"),
        Client::from_redis(app.clone()).password("x"),
        Client::from_redis(app.clone()).tls_ca_file(ca),
    ] {
        let err = builder.connect().await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        assert!(err.to_string().contains("redis-rs client"), "{err}");
    }
    // Without them it connects, with fencelock's own settings.
    let locks = Client::from_redis(app)
        .prefix("app")
        .connect()
        .await
        .unwrap();
    let guard = locks.lock("x").try_acquire().await.unwrap();
    assert!(server.exists("app:{x}"));
    guard.release().await.unwrap();
}

/// The application's cluster builder, on the TLS cluster as the guide's ACL user with
/// the cluster additions: locks on the masters, a waiter woken over sharded pub/sub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_client_builder_with_tls_and_an_acl_user_is_reused() {
    const USER: &str = "app-cluster";
    let cluster = Cluster::shared_tls();
    let additions = "+spublish +ssubscribe +sunsubscribe +cluster|slots +asking +readonly";
    for node in cluster.nodes() {
        create_user(node, &guide_user(USER, "cluster-pw", additions));
    }
    let seeds: Vec<String> = cluster
        .seed_urls()
        .split(',')
        .map(|s| format!("rediss://{s}"))
        .collect();
    let app = {
        let seeds = seeds.clone();
        move || {
            ClusterClientBuilder::new(seeds.clone())
                .username(USER)
                .password("cluster-pw")
                .certs(certificates(TlsFiles::shared(), false))
        }
    };
    let locks = Client::from_redis_cluster(app.clone())
        .connect()
        .await
        .unwrap();
    let other = Client::from_redis_cluster(app).connect().await.unwrap();
    let guard = locks.lock("app-cluster:1").try_acquire().await.unwrap();
    assert!(
        cluster
            .node_for_key("fencelock:{app-cluster:1}")
            .exists("fencelock:{app-cluster:1}")
    );
    a_waiter_is_woken_by_the_release(guard, other).await;
    // A wrong password: refused, not "every seed is down".
    let wrong = {
        let seeds = seeds.clone();
        move || {
            ClusterClientBuilder::new(seeds.clone())
                .username(USER)
                .password("WRONG-c3")
                .certs(certificates(TlsFiles::shared(), false))
        }
    };
    let err = Client::from_redis_cluster(wrong)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Rejected { code, .. } if code == "WRONGPASS"),
        "{err:?}"
    );
}
