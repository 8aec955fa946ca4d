//! `testkit::SentinelGroup` against real `redis-server` processes (a master,
//! a replica, three sentinels).

// `libc::kill(pid, 0)` is the independent check that a process is gone.
#![allow(unsafe_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use testkit::{RedisServer, SentinelGroup, TlsFiles};

/// `true` if `kill(pid, 0)` fails with `ESRCH`: no such process.
fn process_gone(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence; nothing is delivered.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

fn role(server: &RedisServer, password: Option<&str>) -> String {
    let reply = match password {
        Some(pw) => server.cmd_as(pw, &["ROLE"]),
        None => server.cmd(&["ROLE"]),
    };
    reply.as_array().unwrap()[0].as_str().unwrap().to_owned()
}

#[test]
fn a_group_starts_with_the_replica_online_and_every_sentinel_agreeing() {
    let t = Instant::now();
    let group = SentinelGroup::start();
    eprintln!("sentinel group started in {:?}", t.elapsed());

    assert_eq!(group.service(), "mymaster");
    assert_eq!(group.sentinels().len(), 3);
    let ports: Vec<u16> = group.sentinels().iter().map(RedisServer::port).collect();
    assert_eq!(
        group.sentinel_urls(),
        format!(
            "127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
            ports[0], ports[1], ports[2]
        )
    );
    assert_eq!(
        group.url(),
        format!("redis+sentinel://{}/mymaster", group.sentinel_urls())
    );

    let master = group.master();
    assert_eq!(master.addr(), group.nodes()[0].addr());
    assert_eq!(role(master, None), "master");
    let replicas = group.replicas();
    assert_eq!(replicas.len(), 1);
    assert_eq!(role(replicas[0], None), "slave");
    assert_eq!(
        replicas[0]
            .info_field("replication", "master_link_status")
            .as_deref(),
        Some("up")
    );

    for s in group.sentinels() {
        let addr = s.cmd(&["SENTINEL", "get-master-addr-by-name", "mymaster"]);
        let addr = addr.as_array().unwrap();
        assert_eq!(addr[1].as_str(), Some(master.port().to_string().as_str()));
        // Sentinels rewrite their own config file, each its own.
        let conf = std::fs::read_to_string(s.config_path().unwrap()).unwrap();
        assert!(conf.contains("sentinel myid"), "{conf}");
    }

    // Writes replicate.
    master.cmd(&["SET", "k", "v"]);
    testkit::eventually("k replicated", Duration::from_secs(5), || {
        replicas[0].get("k").as_deref() == Some("v")
    });
}

#[test]
fn kill_master_then_the_sentinels_promote_the_replica() {
    let mut group = SentinelGroup::start();
    let replica = group.replicas()[0].addr();
    group.master().cmd(&["SET", "k", "v"]);
    // On the replica (WAIT on `cmd`'s fresh connection would wait for nothing).
    testkit::eventually("the replica has the write", Duration::from_secs(5), || {
        group.replicas()[0].get("k").as_deref() == Some("v")
    });

    let old = group.kill_master();
    assert_eq!(old, group.nodes()[0].addr());
    let t = Instant::now();
    let new = group.wait_for_new_master(&old, Duration::from_secs(10));
    eprintln!("kill -9 of the master: new master after {:?}", t.elapsed());

    assert_eq!(new, replica);
    assert_eq!(group.master().addr(), new);
    assert_eq!(role(group.master(), None), "master");
    assert_eq!(group.master().get("k").as_deref(), Some("v"));
    // The dead former master is the one replica left.
    let replicas = group.replicas();
    assert_eq!(replicas.len(), 1);
    assert_eq!(replicas[0].addr(), old);
}

#[test]
fn failover_is_a_graceful_switch_to_the_replica() {
    let mut group = SentinelGroup::start();
    let old = group.master().addr();
    let replica = group.replicas()[0].addr();

    let t = Instant::now();
    let new = group.failover();
    eprintln!("SENTINEL FAILOVER: new master after {:?}", t.elapsed());
    assert_eq!(new, replica);
    assert_eq!(group.master().addr(), new);

    // The old master, still running, calls itself master for a while (about
    // 10 s here) until the sentinels turn it into a replica of the new one.
    assert_eq!(group.nodes()[0].addr(), old);
    assert_eq!(role(&group.nodes()[0], None), "master");
}

#[test]
fn a_tls_group_replicates_and_fails_over_by_its_tls_ports() {
    let mut group = SentinelGroup::builder().tls(TlsFiles::shared()).start();
    assert!(group.is_tls());
    let tls_addr = |s: &RedisServer| format!("127.0.0.1:{}", s.tls_port().unwrap());
    let sentinels: Vec<String> = group.sentinels().iter().map(tls_addr).collect();
    assert_eq!(group.sentinel_urls(), sentinels.join(","));
    assert_eq!(
        group.url(),
        format!("rediss+sentinel://{}/mymaster", sentinels.join(","))
    );
    // The sentinels name the master by its TLS port; testkit still talks plain.
    let old = group.master_addr();
    assert_eq!(old, tls_addr(&group.nodes()[0]));
    assert_eq!(group.announced(&group.nodes()[0]), old);
    let replica = tls_addr(&group.nodes()[1]);
    assert_eq!(group.replicas()[0].tls_port(), group.nodes()[1].tls_port());
    // Replication runs over TLS (the replica was told the master's TLS port).
    group.master().cmd(&["SET", "k", "v"]);
    // On the replica (WAIT on `cmd`'s fresh connection would wait for nothing).
    testkit::eventually("the replica has the write", Duration::from_secs(5), || {
        group.replicas()[0].get("k").as_deref() == Some("v")
    });

    let old = group.kill_master();
    let new = group.wait_for_new_master(&old, Duration::from_secs(10));
    assert_eq!(new, replica);
    assert_eq!(group.master().get("k").as_deref(), Some("v"));
    assert_eq!(role(group.master(), None), "master");
}

#[test]
fn data_nodes_and_sentinels_have_separate_passwords() {
    let mut group = SentinelGroup::builder()
        .password("data-pw")
        .sentinel_password("sentinel pw")
        .start();
    assert_eq!(group.password(), Some("data-pw"));
    assert_eq!(group.sentinel_password(), Some("sentinel pw"));

    let master = group.master();
    assert!(
        master
            .cmd(&["PING"])
            .as_error()
            .unwrap()
            .starts_with("NOAUTH"),
        "the master needs its password"
    );
    assert_eq!(master.cmd_as("data-pw", &["PING"]).as_str(), Some("PONG"));

    let sentinel = &group.sentinels()[0];
    assert!(
        sentinel
            .cmd(&["SENTINEL", "get-master-addr-by-name", "mymaster"])
            .as_error()
            .unwrap()
            .starts_with("NOAUTH")
    );
    assert!(sentinel.cmd_as("data-pw", &["PING"]).is_error());
    assert_eq!(
        sentinel.cmd_as("sentinel pw", &["PING"]).as_str(),
        Some("PONG")
    );
    // `cmd` picks the right password by address.
    assert_eq!(
        group.cmd(&master.addr(), &["SET", "k", "v"]).as_str(),
        Some("OK")
    );
    assert_eq!(
        group.cmd(&sentinel.addr(), &["PING"]).as_str(),
        Some("PONG")
    );

    // The sentinels fail over with `auth-pass` and agree with each other
    // through their own password.
    let replica = group.replicas()[0].addr();
    let old = group.kill_master();
    let t = Instant::now();
    let new = group.wait_for_new_master(&old, Duration::from_secs(10));
    eprintln!(
        "with passwords, kill -9 of the master: new master after {:?}",
        t.elapsed()
    );
    assert_eq!(new, replica);
}

#[test]
fn an_isolated_replica_is_promoted_without_the_writes_it_missed() {
    let mut group = SentinelGroup::start();
    let replica = group.replicas()[0].addr();
    group.master().cmd(&["SET", "before", "1"]);
    // On the replica (WAIT on `cmd`'s fresh connection would wait for nothing).
    testkit::eventually("the replica has the write", Duration::from_secs(5), || {
        group.replicas()[0].get("before").as_deref() == Some("1")
    });

    group.isolate_replica(&replica);
    group.master().cmd(&["SET", "lost", "1"]);
    let old = group.kill_master();
    group.resume_node(&replica);

    let t = Instant::now();
    let new = group.wait_for_new_master(&old, Duration::from_secs(10));
    eprintln!("lost write: replica promoted after {:?}", t.elapsed());
    assert_eq!(new, replica);
    let master = group.master();
    assert_eq!(master.get("before").as_deref(), Some("1"));
    assert_eq!(master.get("lost"), None, "the write the replica missed");
}

#[test]
fn a_killed_master_restarts_as_a_replica_and_is_promoted_by_the_next_failover() {
    let mut group = SentinelGroup::start();
    let first = group.kill_master();
    let second = group.wait_for_new_master(&first, Duration::from_secs(10));
    group.master().cmd(&["SET", "k", "v"]);

    let t = Instant::now();
    group.restart_as_replica(&first, Duration::from_secs(10));
    eprintln!("back as a replica after {:?}", t.elapsed());
    assert_eq!(role(&group.nodes()[0], None), "slave");
    assert_eq!(group.nodes()[0].get("k").as_deref(), Some("v"), "synced");

    // The next failover promotes it again.
    let old = group.kill_master();
    assert_eq!(old, second);
    assert_eq!(
        group.wait_for_new_master(&old, Duration::from_secs(10)),
        first
    );
}

#[test]
fn dropping_a_group_during_a_panic_kills_every_process_and_removes_the_dirs() {
    let mut seen: Vec<(u32, PathBuf)> = Vec::new();
    let err = catch_unwind(AssertUnwindSafe(|| {
        let mut group = SentinelGroup::start();
        let master = group.master().addr();
        group.pause_master();
        assert!(group.node_mut(&master).is_paused());
        for s in group.sentinels().iter().chain(group.nodes()) {
            seen.push((s.pid(), s.dir().to_owned()));
        }
        panic!("test failure");
    }))
    .unwrap_err();
    assert_eq!(err.downcast_ref::<&str>(), Some(&"test failure"));
    assert_eq!(seen.len(), 5);
    for (pid, dir) in seen {
        assert!(process_gone(pid), "pid {pid} outlived the group");
        assert!(!dir.exists(), "{} outlived the group", dir.display());
    }
}
