//! docs/guide/src/security.md

use crate::blocks::security as b;
use crate::rt;

/// Mutual TLS with the CA and a client certificate.
pub fn tls() {
    rt().block_on(async {
        let files = testkit::TlsFiles::shared();
        let server = testkit::RedisServer::builder()
            .tls(files, testkit::ClientAuth::Yes)
            .start();
        b::tls::nightly(
            &server.tls_url().unwrap(),
            &files.ca_cert(),
            &files.client_cert(),
            &files.client_key(),
        )
        .await
        .unwrap();
    });
}

/// The guide's ACL rules for `user`, with `extra` rules (the cluster's additions).
fn guide_user(user: &str, password: &str, extra: &str) -> Vec<String> {
    let guide = include_str!("../../../../docs/guide/src/security.md");
    let line = guide
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

/// An application's client logged in as the guide's ACL user: fencelock's client made
/// from it takes a lock, as that user.
pub fn from_redis() {
    let server = testkit::RedisServer::start();
    let rules = guide_user("orders-service", "pw-1", "");
    let args: Vec<&str> = rules.iter().map(String::as_str).collect();
    assert_eq!(server.cmd(&args).as_str(), Some("OK"));
    let url = server
        .url()
        .replace("redis://", "redis://orders-service:pw-1@");
    let app = fencelock::redis::Client::open(url.as_str()).unwrap();
    rt().block_on(async {
        let locks = b::from_redis::locks_for(&app).await.unwrap();
        let guard = locks.lock("orders:1").try_acquire().await.unwrap();
        let clients = server.cmd(&["CLIENT", "LIST"]);
        assert!(
            clients.as_str().unwrap().contains("user=orders-service"),
            "{clients:?}"
        );
        guard.release().await.unwrap();
    });
}

/// The application's cluster settings on the shared cluster, as the guide's user with
/// the cluster additions.
pub fn from_redis_cluster() {
    let cluster = testkit::Cluster::shared();
    let extra = "+spublish +ssubscribe +sunsubscribe +cluster|slots +asking +readonly";
    let rules = guide_user("orders-service", "pw-2", extra);
    let args: Vec<&str> = rules.iter().map(String::as_str).collect();
    for node in cluster.nodes() {
        assert_eq!(node.cmd(&args).as_str(), Some("OK"));
    }
    let seeds: Vec<String> = cluster
        .seed_urls()
        .split(',')
        .map(|s| format!("redis://{s}"))
        .collect();
    rt().block_on(async {
        let locks = b::from_redis_cluster::cluster_locks(seeds, "pw-2".into())
            .await
            .unwrap();
        let guard = locks.lock("orders:2").try_acquire().await.unwrap();
        assert!(
            cluster
                .node_for_key("fencelock:{orders:2}")
                .exists("fencelock:{orders:2}")
        );
        guard.release().await.unwrap();
    });
}
