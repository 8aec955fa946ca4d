//! Every rig on every server build: Redis 6.2.14 and Valkey 9.1.2 (fetched by
//! `scripts/servers`) beside Debian's Redis 7.0, standalone, Sentinel, Cluster, with ACL
//! users, and TLS refused clearly where the build has none.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use testkit::{Cluster, RedisServer, SentinelGroup, ServerBuild, TlsFiles};

/// The version each build's server reports, as `INFO server` says it.
fn expected_version(build: &ServerBuild) -> &'static str {
    match build {
        ServerBuild::Redis62 => "Redis 6.2.14",
        ServerBuild::Redis7 => "Redis 7.0",
        ServerBuild::Valkey91 => "Valkey 9.1.2",
        ServerBuild::Custom(_) => unreachable!("not tested here"),
    }
}

/// `AUTH user password` then `GET key` on one connection, as a client of that ACL user:
/// the two replies' first lines.
fn get_as(server: &RedisServer, user: &str, password: &str, key: &str) -> (String, String) {
    let stream = TcpStream::connect(server.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    (&stream)
        .write_all(format!("AUTH {user} {password}\r\nGET {key}\r\n").as_bytes())
        .unwrap();
    let mut reader = BufReader::new(&stream);
    let line = |reader: &mut BufReader<&TcpStream>| {
        let mut l = String::new();
        reader.read_line(&mut l).unwrap();
        l.trim_end().to_owned()
    };
    let auth = line(&mut reader);
    let mut get = line(&mut reader);
    if get.starts_with('$') && get != "$-1" {
        get = line(&mut reader);
    }
    (auth, get)
}

/// What a test of another build relies on: the server runs that build (its binary's
/// `--version` and its `INFO server` agree), keeps its data across a kill with
/// persistence on (its own AOF in its own directory), and serves an ACL user limited to
/// some keys.
#[test]
fn a_server_of_each_build_runs_that_build_persists_and_serves_acl_users() {
    for build in ServerBuild::all() {
        let mut server = RedisServer::builder()
            .server(build.clone())
            .persistence(true)
            .start();
        assert_eq!(server.build(), &build);
        let version = server.version();
        assert!(
            version.starts_with(expected_version(&build)),
            "{build}: {version}"
        );
        assert_eq!(
            build.version(),
            version,
            "{build}: --version and INFO agree"
        );

        server.cmd(&["SET", "app:k", "v"]);
        server.kill();
        server.restart();
        assert_eq!(server.get("app:k").as_deref(), Some("v"), "{build}");

        let setuser = ["ACL", "SETUSER", "app", "on", ">pw", "~app:*", "+get"];
        assert_eq!(server.cmd(&setuser).as_str(), Some("OK"), "{build}");
        assert_eq!(
            get_as(&server, "app", "pw", "app:k"),
            ("+OK".to_owned(), "v".to_owned()),
            "{build}"
        );
        let (_, refused) = get_as(&server, "app", "pw", "other");
        assert!(refused.starts_with("-NOPERM"), "{build}: {refused}");
    }
}

/// A Sentinel group forms on each build (the sentinels are that build too, Valkey's as
/// `valkey-server CONF --sentinel`) and fails over when its master is killed.
#[test]
fn a_sentinel_group_of_each_build_fails_over() {
    for build in ServerBuild::all() {
        let mut group = SentinelGroup::builder().server(build.clone()).start();
        assert_eq!(group.build(), &build);
        for server in group.nodes().iter().chain(group.sentinels()) {
            assert!(
                server.version().starts_with(expected_version(&build)),
                "{build}: {}",
                server.version()
            );
        }
        let old = group.kill_master();
        let new = group.wait_for_new_master(&old, Duration::from_secs(15));
        assert_ne!(new, old, "{build}");
        assert_eq!(group.master().cmd(&["SET", "k", "v"]).as_str(), Some("OK"));
    }
}

/// A Cluster forms on each build (created by Debian's redis-cli), 3 masters with a
/// replica each and a single master made by hand (`CLUSTER ADDSLOTS`, which Redis 6.2
/// has where `ADDSLOTSRANGE` is 7.0's), and serves keys on their slots' masters.
#[test]
fn a_cluster_of_each_build_forms_and_serves_keys() {
    for build in ServerBuild::all() {
        let cluster = Cluster::builder().server(build.clone()).start();
        assert_eq!(cluster.build(), &build);
        assert_eq!(cluster.masters().len(), 3, "{build}");
        for node in cluster.nodes() {
            assert!(node.version().starts_with(expected_version(&build)));
        }
        let owner = cluster.node_for_key("lock:a").addr();
        assert_eq!(
            cluster.cmd(&owner, &["SET", "lock:a", "v"]).as_str(),
            Some("OK"),
            "{build}"
        );

        let single = Cluster::builder()
            .server(build.clone())
            .masters(1)
            .replicas_per_master(0)
            .start();
        let node = single.masters()[0].addr();
        assert_eq!(
            single.cmd(&node, &["SET", "k", "v"]).as_str(),
            Some("OK"),
            "{build}"
        );
    }
}

/// The panic message of `start`.
fn start_panic(start: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(start)).expect_err("the rig must not start");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// TLS on a build made without OpenSSL is refused before anything starts, with a
/// message that says why, for every rig.
#[test]
fn tls_on_a_build_without_it_is_refused_with_a_clear_message() {
    let files = TlsFiles::shared();
    for build in [ServerBuild::Redis62, ServerBuild::Valkey91] {
        assert!(!build.has_tls());
        let messages = [
            start_panic(|| {
                RedisServer::builder()
                    .server(build.clone())
                    .tls(files, testkit::ClientAuth::No)
                    .start();
            }),
            start_panic(|| {
                SentinelGroup::builder()
                    .server(build.clone())
                    .tls(files)
                    .start();
            }),
            start_panic(|| {
                Cluster::builder().server(build.clone()).tls(files).start();
            }),
        ];
        for message in messages {
            assert!(
                message.contains("has no TLS") && message.contains("without OpenSSL"),
                "{build}: {message}"
            );
        }
    }
    assert!(ServerBuild::Redis7.has_tls());
}
