//! Redlock over five independent redis-server processes: availability with a minority
//! down, failure naming the nodes with a majority down, the crash-restart hazard (shown
//! real with restart protection off, refused with it on), fencing across wipes, extends
//! that miss quorum, and stale requests that land late.

use std::time::{Duration, Instant};

use fencelock::{Client, Error, NodeOutcome};
use testkit::RedisServer;

mod common;
use common::eventually;

const KEY: &str = "fencelock:{rl}";

async fn redlock(servers: &[RedisServer], protection: Option<Duration>) -> Client {
    Client::redlock(servers.iter().map(RedisServer::url))
        .restart_protection(protection)
        .node_timeout(Duration::from_millis(100))
        .connect()
        .await
        .expect("connect")
}

fn holds(r: &RedisServer, token: &str) -> bool {
    r.get(KEY).as_deref() == Some(token)
}

#[tokio::test]
async fn acquires_with_two_of_five_nodes_killed_or_paused() {
    let mut servers = RedisServer::start_many(5);
    let c = redlock(&servers, None).await;
    servers[0].kill();
    servers[1].kill();
    let g = c
        .lock("rl")
        .lease(Duration::from_secs(10))
        .renew(false)
        .try_acquire()
        .await
        .expect("3 of 5 suffice");
    let held = servers[2..]
        .iter()
        .filter(|r| holds(r, g.holder_token().as_str()))
        .count();
    assert_eq!(held, 3);
    g.release().await.unwrap();
    assert!(
        servers[2..].iter().all(|r| !r.exists(KEY)),
        "released everywhere"
    );

    servers[0].restart();
    servers[1].restart();
    servers[3].pause();
    servers[4].pause();
    let started = Instant::now();
    let g = c
        .lock("rl")
        .lease(Duration::from_secs(10))
        .renew(false)
        .try_acquire()
        .await
        .expect("3 of 5 suffice");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "paused nodes cost only their timeout"
    );
    g.release().await.unwrap();
    servers[3].resume();
    servers[4].resume();
}

/// A node whose server stops answering while its connection stays open (stopped with
/// SIGSTOP) is sent nothing new once it counts as stalled: however many locks the others
/// grant meanwhile, requests do not pile up for it (in the client's memory and on the
/// connection). When it answers again, the grants it made late are released well before
/// their lease ends (by the releases sent after them, or, where the driver dropped a
/// release that timed out before it could be written, the connection backed up with
/// requests to the stopped server, by that release sent again), and acquires reach it
/// again.
#[tokio::test]
async fn a_stalled_node_is_not_sent_every_acquire_and_release() {
    common::traces();
    let mut servers = RedisServer::start_many(3);
    let c = redlock(&servers, None).await;
    const LEASE: Duration = Duration::from_secs(30);
    let acquire = async || {
        c.lock("rl")
            .lease(LEASE)
            .renew(false)
            .try_acquire()
            .await
            .expect("2 of 3 suffice")
    };
    let cycle = async || acquire().await.release().await.unwrap();
    cycle().await; // scripts loaded
    let addr = servers[2].addr();
    common::memory_policy_read(&addr).await;
    servers[2].pause();
    // What one acquire and release leave queued at the stopped server.
    cycle().await;
    c.flush().await; // the calls to it timed out
    let one_cycle = servers[2].pending_request_bytes();
    assert!(one_cycle > 0, "the cycle's calls wait there");
    let stalled = || {
        common::traces()
            .text()
            .lines()
            .any(|l| l.contains("stopped answering") && l.contains(&addr))
    };
    let mut cycles = 0;
    while !stalled() {
        cycle().await;
        cycles += 1;
        assert!(cycles < 100_000, "the node never counted as stalled");
    }
    c.flush().await; // the last calls to it timed out
    let queued = servers[2].pending_request_bytes();
    for _ in 0..200 {
        cycle().await;
    }
    c.flush().await;
    // Less than one cycle's calls (a connection of the client's own that asks whether
    // it answers again may have sent its PING meanwhile).
    let grew = servers[2].pending_request_bytes().saturating_sub(queued);
    assert!(
        grew < one_cycle,
        "{grew} bytes sent to the stalled node over 200 cycles (one cycle: {one_cycle})"
    );

    servers[2].resume();
    eventually(
        "acquires reach it again",
        Duration::from_secs(5),
        async || {
            let g = acquire().await;
            c.flush().await; // the acquire answers at a majority: wait for the third
            let reached = holds(&servers[2], g.holder_token().as_str());
            g.release().await.unwrap();
            reached
        },
    )
    .await;
    c.flush().await;
    assert!(!servers[2].exists(KEY), "released there too");
}

#[tokio::test]
async fn fails_with_three_of_five_down_naming_each_node() {
    let mut servers = RedisServer::start_many(5);
    let c = redlock(&servers, None).await;
    servers[0].kill();
    servers[1].pause();
    servers[2].pause();
    let started = Instant::now();
    let err = c
        .lock("rl")
        .lease(Duration::from_secs(10))
        .renew(false)
        .try_acquire()
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    servers[1].resume();
    servers[2].resume();
    // The attempt waits out the 100 ms node timeout on the stopped nodes; the take-back
    // of its two grants is sent, and answered in the background. The margin is for a
    // loaded machine; a wait for the 1 s response timeout would still exceed the bound.
    assert!(elapsed < Duration::from_millis(800), "{elapsed:?}");
    c.flush().await;
    match &err {
        Error::NoQuorum {
            needed,
            granted,
            nodes,
            ..
        } => {
            assert_eq!(*needed, 3);
            assert_eq!(*granted, 2);
            assert_eq!(nodes.len(), 5);
            for (i, report) in nodes.iter().enumerate() {
                assert_eq!(report.node, servers[i].addr());
                let unavailable = matches!(report.outcome, NodeOutcome::Unavailable(_));
                assert_eq!(unavailable, i < 3, "node {i}: {:?}", report.outcome);
            }
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    let text = err.to_string();
    for s in &servers {
        assert!(
            text.contains(&s.addr()),
            "the message names {}: {text}",
            s.addr()
        );
    }
    // The two grants were taken back.
    assert!(servers[3..].iter().all(|r| !r.exists(KEY)));
}

/// Kleppmann's scenario: A holds nodes 0, 1, 2 (3 and 4 missed its grant); node 2
/// crashes and restarts empty; B locks 2, 3, 4.
async fn crash_restart_scenario(
    protection: Option<Duration>,
) -> (
    Result<fencelock::LockGuard, Error>,
    fencelock::LockGuard,
    Vec<RedisServer>,
) {
    let mut servers = RedisServer::start_many(5);
    let up = Instant::now(); // every node has been up at least this long
    if let Some(q) = protection {
        // Let the nodes be up longer than the quarantine, so only the restart counts. As
        // their uptime cannot be long enough before then, there is nothing to poll for
        // until that much time has passed; then each node must report it (in whole
        // seconds).
        let long_enough = q + Duration::from_secs(1);
        tokio::time::sleep_until((up + long_enough).into()).await;
        eventually(
            "every node reports an uptime past the quarantine",
            Duration::from_secs(5),
            async || {
                servers.iter().all(|s| {
                    let up = s.info_field("server", "uptime_in_seconds").unwrap();
                    up.parse::<u64>().unwrap() >= long_enough.as_secs()
                })
            },
        )
        .await;
    }
    let a = redlock(&servers, protection).await;
    // A lease no longer than the quarantine: restart protection waits out the longest
    // lease in use, so the quarantine is max(configured, TTL). A's lease must last
    // until B's acquire: restarting a node and connecting B take a few hundred ms, and
    // took close to 3 s on a loaded machine.
    let ttl = Duration::from_secs(5);
    let held_by_a = a
        .lock("rl")
        .lease(ttl)
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    // The acquire answered once a majority granted; the last grants land after it.
    eventually(
        "A holds the lock on every node",
        Duration::from_secs(5),
        async || {
            servers
                .iter()
                .all(|s| holds(s, held_by_a.holder_token().as_str()))
        },
    )
    .await;
    servers[3].cmd(&["DEL", KEY]);
    servers[4].cmd(&["DEL", KEY]);
    servers[2].kill();
    servers[2].restart(); // no persistence: the key is gone
    // B first meets node 2 after its restart (a client connected before would see one
    // broken connection there first).
    let b = redlock(&servers, protection).await;
    let b_result = b.lock("rl").lease(ttl).renew(false).try_acquire().await;
    (b_result, held_by_a, servers)
}

#[tokio::test]
async fn without_restart_protection_a_crash_restart_gives_two_holders() {
    let (b, a, _servers) = crash_restart_scenario(None).await;
    let b = b.expect("the hazard is real: B gets a majority");
    assert!(
        !a.remaining().is_zero() && !b.remaining().is_zero(),
        "both leases run at once"
    );
    assert_ne!(
        a.holder_token(),
        b.holder_token(),
        "two holders of one lock at once"
    );
}

#[tokio::test]
async fn with_restart_protection_the_restarted_node_does_not_vote() {
    let (b, a, _servers) = crash_restart_scenario(Some(Duration::from_secs(5))).await;
    match b {
        Err(Error::NoQuorum { nodes, .. }) => {
            assert!(
                matches!(nodes[2].outcome, NodeOutcome::Quarantined { .. }),
                "{:?}",
                nodes[2]
            );
            assert!(matches!(nodes[0].outcome, NodeOutcome::Held { .. }));
        }
        other => panic!("B must be refused, naming the quarantined node, got {other:?}"),
    }
    assert!(!a.remaining().is_zero(), "A still holds the lock");
}

#[tokio::test]
async fn fencing_tokens_increase_across_a_thousand_handoffs_with_wipes() {
    let servers = RedisServer::start_many(5);
    let c = redlock(&servers, None).await;
    let mut last = 0;
    for i in 0..1000 {
        if i % 10 == 5 {
            servers[(i / 10) % 5].cmd(&["FLUSHALL"]); // one node at a time loses everything
        }
        let g = c
            .lock("rl")
            .lease(Duration::from_secs(5))
            .renew(false)
            .try_acquire()
            .await
            .unwrap();
        let token = g.fencing_token().get();
        assert!(token > last, "handoff {i}: token {token} after {last}");
        last = token;
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn an_extend_that_misses_quorum_once_releases_nothing() {
    let mut servers = RedisServer::start_many(5);
    let c = redlock(&servers, None).await;
    let mut g = c
        .lock("rl")
        .lease(Duration::from_secs(10))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let token = g.holder_token().as_str().to_owned();
    for s in &mut servers[..3] {
        s.pause();
    }
    let missed = g.extend(Duration::from_secs(20)).await;
    for s in &mut servers[..3] {
        s.resume();
    }
    assert!(
        matches!(missed, Err(Error::Unavailable { .. })),
        "{missed:?}"
    );
    assert!(g.loss_cause().is_none(), "not counted as lost");
    assert!(
        servers.iter().all(|s| holds(s, &token)),
        "still held on every node"
    );
    g.extend(Duration::from_secs(20))
        .await
        .expect("the next extend reaches a quorum");
    // It answered once a majority confirmed; the others follow.
    eventually(
        "extended on every node",
        Duration::from_secs(5),
        async || servers.iter().all(|s| s.pttl(KEY) > 15_000),
    )
    .await;
    g.release().await.unwrap();
}

/// A's acquire and release to a paused node, and B's acquire, land there only after it
/// resumes, in an order nobody controls. Whatever the order, A's late requests never
/// leave A's token there and never remove B's key: every script checks the owner token.
#[tokio::test]
async fn stale_requests_from_a_paused_node_never_touch_another_holders_key() {
    let mut servers = RedisServer::start_many(5);
    let a = redlock(&servers, None).await;
    let b = redlock(&servers, None).await;
    for c in [&a, &b] {
        common::load_scripts(c, "warm").await;
    }
    servers[4].cmd(&["CONFIG", "RESETSTAT"]);
    servers[4].pause();
    let ga = a
        .lock("rl")
        .lease(Duration::from_secs(10))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let a_token = ga.holder_token().as_str().to_owned();
    ga.release().await.unwrap();
    // The release answered once a majority had it; B acquires after it reached the
    // other live node too (else B may find A's key there, and hold a majority without
    // it).
    eventually(
        "A's release reached every live node",
        Duration::from_secs(5),
        async || !servers[..4].iter().any(|s| holds(s, &a_token)),
    )
    .await;
    let gb = b
        .lock("rl")
        .lease(Duration::from_secs(10))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    servers[4].resume();
    // A's acquire, A's release and B's acquire all reach node 4 now.
    eventually(
        "node 4 ran the 3 queued scripts",
        Duration::from_secs(5),
        async || servers[4].script_calls() >= 3,
    )
    .await;
    let late = servers[4].get(KEY);
    assert_ne!(late.as_deref(), Some(a_token.as_str()), "never A's token");
    assert!(
        late.is_none() || late.as_deref() == Some(gb.holder_token().as_str()),
        "{late:?}"
    );
    assert!(
        servers[..4]
            .iter()
            .all(|s| holds(s, gb.holder_token().as_str())),
        "B's majority intact"
    );
    gb.release().await.unwrap();
    assert!(servers.iter().all(|s| !s.exists(KEY)));
}

#[tokio::test]
async fn a_redlock_waiter_is_woken_by_the_release() {
    let servers = RedisServer::start_many(3);
    let c = redlock(&servers, None).await;
    let holder = c
        .lock("rl")
        .lease(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(
        c.lock("rl")
            .lease(Duration::from_secs(60))
            .renew(false)
            .wait(Duration::from_secs(30))
            .acquire(),
    );
    eventually(
        "the waiter listens on every node",
        Duration::from_secs(5),
        async || c.stats().waiters >= 3,
    )
    .await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let g = waiter.await.unwrap().unwrap();
    // A handoff takes milliseconds; the bound leaves a loaded machine seconds, far from
    // the 30 s wait or the 60 s lease.
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woken, not timed out: {:?}",
        released.elapsed()
    );
    assert_eq!(c.stats().waiters, 0, "unregistered on every node");
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_renewed_redlock_lease_outlives_its_length() {
    let servers = RedisServer::start_many(3);
    let c = redlock(&servers, None).await;
    let g = c
        .lock("rl")
        .lease(Duration::from_millis(900))
        .try_acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(g.loss_cause().is_none());
    assert!(servers.iter().all(|s| holds(s, g.holder_token().as_str())));
    g.release().await.unwrap();
}

#[tokio::test]
async fn redlock_settings_are_checked() {
    let servers = RedisServer::start_many(3);
    for n in [2, 4] {
        let urls: Vec<String> = (0..n).map(|i| servers[i % 3].url()).collect();
        assert!(
            matches!(
                Client::redlock(urls).connect().await,
                Err(Error::InvalidArgument { .. })
            ),
            "{n} nodes"
        );
    }
    let twice = vec![servers[0].url(), servers[0].url(), servers[1].url()];
    assert!(matches!(
        Client::redlock(twice).connect().await,
        Err(Error::InvalidArgument { .. })
    ));
    let c = redlock(&servers, None).await;
    assert!(matches!(
        c.lock("x").fair().try_acquire().await,
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        c.lock("x").reentrant("me").try_acquire().await,
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        c.delay_queue("q"),
        Err(Error::InvalidArgument { .. })
    ));
}

#[tokio::test]
async fn one_server_named_three_ways_is_refused_naming_the_urls() {
    let servers = RedisServer::start_many(1);
    let port = servers[0].port();
    let urls = [
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}"),
        format!("redis://127.0.0.1:{port}/0"),
    ];
    let err = Client::redlock(urls.clone())
        .restart_protection(None)
        .connect()
        .await
        .unwrap_err();
    let Error::InvalidArgument { what, reason, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*what, "Redis URLs");
    for url in &urls {
        assert!(reason.contains(url.as_str()), "{url} not named: {reason}");
    }
    // Two names of one server among three nodes are refused too.
    let other = RedisServer::start();
    let two = [urls[0].clone(), other.url(), urls[1].clone()];
    let err = Client::redlock(two).connect().await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
}

#[tokio::test]
async fn a_second_name_of_one_server_unreachable_at_connect_gets_no_vote_later() {
    use testkit::{Fault, FaultProxy};
    let server = RedisServer::start();
    // Node 2 reaches the same server through a proxy that refuses connections while the
    // client connects, so it cannot be identified then. Node 3 is down.
    let proxy = FaultProxy::start(&server.addr());
    proxy.set(Fault::Reset);
    let down = format!("redis://127.0.0.1:{}", testkit::free_port());
    let c = Client::redlock([server.url(), proxy.url(), down])
        .restart_protection(None)
        .node_timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect: the second name is not known yet");
    proxy.set(Fault::Pass);
    // One real server of three: no majority, whatever the second name answers.
    let err = c.lock("rl").try_acquire().await.unwrap_err();
    let Error::NoQuorum { granted, nodes, .. } = &err else {
        panic!("a fake majority: {err:?}")
    };
    assert_eq!(*granted, 1, "{err}");
    assert!(
        matches!(&nodes[1].outcome, NodeOutcome::Refused(why) if why.contains("same Redis server")),
        "{err}"
    );
    assert!(!holds(&server, "x") && !server.exists(KEY));
}

/// Answers are tallied as they come: a second name of one server that answers first
/// still gives that server one vote, and the name given first keeps it.
#[tokio::test]
async fn a_server_named_twice_votes_once_whichever_name_answers_first() {
    use testkit::{Fault, FaultProxy};
    let server = RedisServer::start();
    // Node 1 reaches the server through a proxy: refusing while the client connects (so
    // only node 2's name is known then), then slow, so node 2 answers first.
    let proxy = FaultProxy::start(&server.addr());
    proxy.set(Fault::Reset);
    let down = format!("redis://127.0.0.1:{}", testkit::free_port());
    // Long enough for the slow name's first call: its connection, the question of what
    // the server offers, the script, each a round trip of 200 ms.
    let c = Client::redlock([proxy.url(), server.url(), down])
        .restart_protection(None)
        .node_timeout(Duration::from_millis(1500))
        .connect()
        .await
        .expect("connect: the first name is not known yet");
    proxy.set(Fault::Delay {
        base: Duration::from_millis(100),
        jitter: Duration::ZERO,
    });
    let err = c.lock("rl").try_acquire().await.unwrap_err();
    let Error::NoQuorum { granted, nodes, .. } = &err else {
        panic!("a fake majority: {err:?}")
    };
    assert_eq!(*granted, 1, "{err}");
    assert_eq!(nodes[0].outcome, NodeOutcome::Granted, "{err}");
    assert!(
        matches!(&nodes[1].outcome, NodeOutcome::Refused(why) if why.contains("same Redis server")),
        "{err}"
    );
    proxy.set(Fault::Pass);
    eventually(
        "the attempt taken back",
        Duration::from_secs(5),
        async || !server.exists(KEY),
    )
    .await;
}

#[tokio::test]
async fn a_release_with_a_stopped_minority_takes_no_longer_than_the_node_timeout() {
    let mut servers = RedisServer::start_many(3);
    // The default node timeout: a twentieth of the lease, 100 ms for 2 s.
    let c = Client::redlock(servers.iter().map(RedisServer::url))
        .restart_protection(None)
        .connect()
        .await
        .unwrap();
    let guard = c
        .lock("rl")
        .lease(Duration::from_secs(2))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    servers[2].pause();
    let started = Instant::now();
    guard.release().await.unwrap();
    let took = started.elapsed();
    servers[2].resume();
    // 100 ms on the stopped node, with a margin for a loaded machine; waiting for its
    // reply until the 1 s response timeout would still exceed the bound.
    assert!(
        took < Duration::from_millis(800),
        "the release took {took:?}"
    );
    assert!(servers[..2].iter().all(|s| !s.exists(KEY)));
}

/// A Redlock acquire dropped while its requests wait unread on stopped nodes may still be
/// run by each node once it resumes, so each may grant it: every such grant is taken
/// back in the background, on every node, well before its 60 s lease would end.
#[tokio::test]
async fn a_redlock_acquire_dropped_in_flight_takes_back_every_grant() {
    common::traces();
    let mut servers = RedisServer::start_many(3);
    // Long enough for the test to see the requests arrive before the acquire gives up.
    let c = Client::redlock(servers.iter().map(RedisServer::url))
        .restart_protection(None)
        .response_timeout(Duration::from_secs(5))
        .node_timeout(Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    c.lock("rl")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap(); // scripts loaded on every node
    for s in &servers {
        common::memory_policy_read(&s.addr()).await;
        s.cmd(&["CONFIG", "RESETSTAT"]);
    }
    for s in &mut servers {
        s.pause();
    }
    let lock = c.lock("rl").lease(Duration::from_secs(60)).renew(false);
    let mut attempt = Box::pin(lock.try_acquire());
    // Dropped once its request has reached every stopped server, where it waits unread.
    tokio::select! {
        result = &mut attempt => panic!("no reply while every node is paused: {result:?}"),
        () = eventually(
            "the acquire reached every stopped node",
            Duration::from_secs(5),
            async || servers.iter().all(|s| s.unread_request_bytes() > 0),
        ) => {}
    }
    drop(attempt);
    for s in &mut servers {
        s.resume();
    }
    // Each node runs the acquire, then the release sent after it.
    eventually(
        "every node's grant is taken back",
        Duration::from_secs(5),
        async || {
            servers
                .iter()
                .all(|s| s.script_calls() >= 2 && !s.exists(KEY))
        },
    )
    .await;
    // The lock is free for others well before the lease would end.
    c.lock("rl")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A minority that does not answer costs the acquire and the release nothing: they
/// answer once a majority has, not after the node timeout, and the stopped node's late
/// grant is released there once it runs again (its requests run in the order sent).
#[tokio::test]
async fn a_stopped_minority_does_not_slow_acquire_or_release() {
    let mut servers = RedisServer::start_many(5);
    // A node timeout far above a round trip: waiting for it would show.
    let node_timeout = Duration::from_secs(3);
    let c = Client::redlock(servers.iter().map(RedisServer::url))
        .restart_protection(None)
        .node_timeout(node_timeout)
        .connect()
        .await
        .unwrap();
    let lock = c.lock("rl").lease(Duration::from_secs(60)).renew(false);
    lock.try_acquire().await.unwrap().release().await.unwrap(); // scripts loaded
    servers[0].pause();
    servers[3].pause();
    let started = Instant::now();
    let guard = lock.try_acquire().await.expect("3 of 5 grant");
    let token = guard.holder_token().as_str().to_owned();
    guard.release().await.unwrap();
    let took = started.elapsed();
    assert!(
        took < node_timeout / 2,
        "acquire + release took {took:?} with a {node_timeout:?} node timeout"
    );
    assert!(
        [1, 2, 4].iter().all(|&i| !servers[i].exists(KEY)),
        "released on the answering nodes"
    );
    servers[0].resume();
    servers[3].resume();
    eventually(
        "the stopped nodes ran the late grant, then its release",
        Duration::from_secs(5),
        async || {
            [0, 3].iter().all(|&i| {
                let s = &servers[i];
                let calls = s.info_field("commandstats", "cmdstat_evalsha");
                !holds(s, &token) && calls.is_some_and(|c| c.starts_with("calls=4,"))
            })
        },
    )
    .await;
}

/// With restart protection on, a node says who it is (its run id and uptime, by `INFO`)
/// once per connection, not on every acquire; and without it, never after connect. A
/// server that restarts under a connected client is asked again, and its vote waits out
/// the quarantine.
#[tokio::test]
async fn a_node_is_asked_who_it_is_once_per_connection_and_again_after_a_restart() {
    let mut servers = RedisServer::start_many(3);
    let infos = |s: &RedisServer| {
        s.info_field("commandstats", "cmdstat_info")
            .and_then(|c| {
                c.strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    // Up longer than the quarantine (1 s, the lease, plus the second uptime may be off
    // by), so that the nodes vote.
    eventually(
        "every node up for 3 s",
        Duration::from_secs(10),
        async || {
            servers.iter().all(|s| {
                s.info_field("server", "uptime_in_seconds")
                    .and_then(|u| u.parse::<u64>().ok())
                    .is_some_and(|u| u >= 3)
            })
        },
    )
    .await;
    // The client also reads each node's memory policy once per connection, in the
    // background after its first call there (one `INFO memory` each): let that happen
    // before counting.
    let policy_reads = |s: &RedisServer| {
        common::traces()
            .text()
            .lines()
            .filter(|l| l.contains("memory policy read") && l.contains(&s.addr()))
            .count()
    };
    for protection in [None, Some(Duration::from_secs(1))] {
        let reads: Vec<usize> = servers.iter().map(policy_reads).collect();
        let c = redlock(&servers, protection).await;
        let lock = c.lock("rl").lease(Duration::from_secs(1)).renew(false);
        lock.try_acquire().await.unwrap().release().await.unwrap();
        eventually(
            "the memory policy read on every node",
            Duration::from_secs(5),
            async || {
                servers
                    .iter()
                    .zip(&reads)
                    .all(|(s, r)| policy_reads(s) > *r)
            },
        )
        .await;
        let before: Vec<u64> = servers.iter().map(infos).collect();
        for _ in 0..20 {
            let lock = c.lock("rl").lease(Duration::from_secs(1)).renew(false);
            let g = lock.try_acquire().await.unwrap();
            g.release().await.unwrap();
        }
        let after: Vec<u64> = servers.iter().map(infos).collect();
        // The INFO this test sends for the count adds one per node.
        assert_eq!(
            after
                .iter()
                .zip(&before)
                .map(|(a, b)| a - b - 1)
                .collect::<Vec<_>>(),
            vec![0; 3],
            "INFO calls during 20 acquires with protection {protection:?}"
        );
    }

    // A client connected (and told who each node is) before node 2 restarts.
    let c = redlock(&servers, Some(Duration::from_secs(5))).await;
    let a = redlock(&servers, None).await;
    let held = a.lock("rl").lease(Duration::from_secs(10)).renew(false);
    let held = held.try_acquire().await.unwrap();
    eventually(
        "A's grant on every node",
        Duration::from_secs(5),
        async || {
            servers
                .iter()
                .all(|s| holds(s, held.holder_token().as_str()))
        },
    )
    .await;
    servers[1].cmd(&["DEL", KEY]);
    servers[2].kill();
    servers[2].restart(); // no persistence: A's key there is gone
    // Nodes 1 and 2 are free now: two votes of three, were node 2 trusted. Its first
    // call finds the old connection broken; the next asks who it is.
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        match c
            .lock("rl")
            .lease(Duration::from_secs(5))
            .renew(false)
            .try_acquire()
            .await
        {
            Ok(g) => panic!("a restarted node's vote counted: {:?}", g.holder_token()),
            Err(Error::Held { nodes, .. } | Error::NoQuorum { nodes, .. }) => {
                outcomes.push(nodes[2].outcome.clone());
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(
        outcomes
            .iter()
            .any(|o| matches!(o, NodeOutcome::Quarantined { .. })),
        "{outcomes:?}"
    );
    drop(held);
}
