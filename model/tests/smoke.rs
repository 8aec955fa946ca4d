//! The shipped scripts run on the model's keyspace: a plain lock's acquire, refusal
//! and release, and the conversions Redis applies.

use model::keyspace::{Reply, Server};
use model::lua::eval;
use model::scripts::Scripts;

fn b(items: &[&str]) -> Vec<Vec<u8>> {
    items.iter().map(|s| s.as_bytes().to_vec()).collect()
}

#[test]
fn a_plain_lock_is_taken_refused_and_released() {
    let scripts = Scripts::shipped();
    let mut server = Server::new(1_800_000_000_000_000, "a".repeat(40));
    let keys = b(&["l", "l:fence", "l:info", "l:writers", "l:wakes"]);
    let acquire = scripts.get("lock/acquire.lua");
    let first = eval(
        &mut server,
        acquire,
        &keys,
        &b(&["t1", "1000", "0", "", "0", "0", "0"]),
    );
    assert_eq!(
        first,
        Reply::Array(Some(vec![Reply::Int(1), Reply::Int(1_800_000_000_000_000)])),
    );
    server.advance_us(250_000);
    let second = eval(
        &mut server,
        acquire,
        &keys,
        &b(&["t2", "1000", "1", "", "0", "0", "0"]),
    );
    let Reply::Array(Some(items)) = &second else {
        panic!("{second:?}")
    };
    assert_eq!(items[..2], [Reply::Int(0), Reply::Int(750)]);
    assert_eq!(items[2], Reply::Bulk(Some(b"a".repeat(40))), "run id");
    assert_eq!(items[3], Reply::Int(0), "uptime");
    let release = scripts.get("lock/release.lua");
    let keys = b(&["l", "l:fence", "l:info", "l:wakes"]);
    assert_eq!(
        eval(&mut server, release, &keys, &b(&["t2", "ch", "0", "0"])),
        Reply::Int(-1)
    );
    assert_eq!(
        eval(&mut server, release, &keys, &b(&["t1", "ch", "0", "0"])),
        Reply::Int(1)
    );
    assert_eq!(server.call(&b(&["EXISTS", "l"])), Reply::Int(0));
}

#[test]
fn values_convert_as_redis_converts_them() {
    let mut server = Server::new(1_000_000, "r");
    let run = |s: &mut Server, text: &str| eval(s, text, &[], &[]);
    assert_eq!(
        run(&mut server, "return {1, 2, nil, 3}"),
        Reply::Array(Some(vec![Reply::Int(1), Reply::Int(2)]))
    );
    assert_eq!(run(&mut server, "return 3.99"), Reply::Int(3));
    assert_eq!(run(&mut server, "return -3.99"), Reply::Int(-3));
    assert_eq!(run(&mut server, "return true"), Reply::Int(1));
    assert_eq!(run(&mut server, "return false"), Reply::Bulk(None));
    assert_eq!(
        run(&mut server, "return {ok='FINE'}"),
        Reply::Status("FINE".into())
    );
    assert_eq!(
        run(&mut server, "return redis.error_reply('FOO bar')"),
        Reply::Error("FOO bar".into())
    );
    run(&mut server, "redis.call('SET', 'k', 0.1)");
    assert_eq!(
        server.call(&b(&["GET", "k"])),
        Reply::Bulk(Some(b"0.10000000000000001".to_vec()))
    );
    let e = run(&mut server, "return redis.call('HGET', 'k', 'f')");
    assert!(
        matches!(&e, Reply::Error(m) if m.starts_with("WRONGTYPE")),
        "{e:?}"
    );
    let e = run(&mut server, "return redis.pcall('HGET', 'k', 'f').err");
    assert!(
        matches!(&e, Reply::Bulk(Some(m)) if m.starts_with(b"WRONGTYPE")),
        "{e:?}"
    );
    let e = run(&mut server, "x = 1");
    assert!(
        matches!(&e, Reply::Error(m) if m.contains("readonly")),
        "{e:?}"
    );
    let e = run(&mut server, "return y");
    assert!(
        matches!(&e, Reply::Error(m) if m.contains("nonexistent global")),
        "{e:?}"
    );
    let e = run(&mut server, "return nil + 1");
    assert!(
        matches!(&e, Reply::Error(m) if m.starts_with("ERR user_script:1: attempt to perform arithmetic")),
        "{e:?}"
    );
    assert_eq!(
        run(
            &mut server,
            "#!lua flags=no-writes\nreturn redis.call('GET', 'k')"
        ),
        Reply::Bulk(Some(b"0.10000000000000001".to_vec()))
    );
    let e = run(
        &mut server,
        "#!lua flags=no-writes\nreturn redis.call('SET', 'k', 'v')",
    );
    assert!(e.is_error(), "{e:?}");
    let e = run(&mut server, "#!lua flags=bogus\nreturn 1");
    assert!(
        matches!(&e, Reply::Error(m) if m.contains("Unexpected flag")),
        "{e:?}"
    );
}

/// A loop that a script's arguments leave unbounded fails the case, naming the script
/// and its arguments, instead of hanging (found by the differential test's seeds 1 and
/// 8: `fence/write.lua` told that a write has 1.8e15 arguments, a real server loops
/// there too, BUSY until `SCRIPT KILL`; the library always sends the true count).
#[test]
#[should_panic(expected = "write.lua ran past 10000000 Lua instructions")]
fn a_script_that_loops_fails_the_case_by_name() {
    let scripts = Scripts::shipped();
    let mut server = Server::new(1_000_000, "r");
    eval(
        &mut server,
        scripts.get("fence/write.lua"),
        &b(&["k2", "k1"]),
        &b(&["x", "x", "t2", "1800000000000000"]),
    );
}

/// The budget leaves the host usable for the next run.
#[test]
fn the_host_runs_scripts_again_after_a_loop_fails() {
    let mut server = Server::new(1_000_000, "r");
    let looped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        eval(
            &mut server,
            "-- spin.lua: forever\nwhile true do end",
            &[],
            &[],
        )
    }));
    let message = looped.expect_err("the loop fails the run");
    let message = message.downcast_ref::<String>().expect("a message");
    assert!(message.starts_with("spin.lua ran past"), "{message}");
    assert_eq!(eval(&mut server, "return 7", &[], &[]), Reply::Int(7));
}

#[test]
fn a_redlock_client_keeps_what_the_tally_learnt_and_a_fresh_restart_does_not_vote() {
    // The glue between the worlds and the library's tally (`model::redlock`): what a
    // node says about itself reaches the client's memory through the tally's `Voter`,
    // and with restart protection a node that just came back grants but does not vote.
    use std::time::Duration;

    use fencelock::model::Outcome;
    use model::keyspace::Reply;
    use model::redlock::{Vote, connect, quorum, tally};

    let lease = Duration::from_secs(1);
    let up = Duration::from_secs(60);
    let ids: Vec<(String, Duration)> = ["a", "b", "c"]
        .iter()
        .map(|id| (id.repeat(40), up))
        .collect();
    // Node 0 restarted (a new run id, up 0 s); nodes 1 and 2 as they were.
    let grant = |fence: i64, id: &str, uptime: i64| {
        Some(Reply::Array(Some(vec![
            Reply::Int(1),
            Reply::Int(fence),
            Reply::Bulk(Some(id.as_bytes().to_vec())),
            Reply::Int(uptime),
        ])))
    };
    let held = Some(Reply::Array(Some(vec![Reply::Int(0), Reply::Int(900)])));
    let votes = [
        Vote {
            node: 0,
            reply: grant(7, &"d".repeat(40), 0),
            generation: 0,
            at_ms: 0,
            lease_left_ms: None,
        },
        Vote {
            node: 1,
            reply: held,
            generation: 0,
            at_ms: 0,
            lease_left_ms: None,
        },
        Vote {
            node: 2,
            reply: grant(5, &ids[2].0, 60),
            generation: 0,
            at_ms: 0,
            lease_left_ms: None,
        },
    ];
    for (protected, granted) in [(true, false), (false, true)] {
        let q = quorum(3, protected.then_some(lease));
        let mut seen = connect(&ids, 0);
        let (verdict, take_back) =
            tally(&q, &mut seen, &votes, 0, lease, 0, false).expect("all answered");
        assert_eq!(
            matches!(verdict, Ok(Outcome::Granted { .. })),
            granted,
            "protected {protected}: {verdict:?}"
        );
        assert_eq!(take_back, !granted);
        assert_eq!(seen[0].health.run_id.as_deref(), Some(&*"d".repeat(40)));
    }
}
