//! The fenced write to a resource kept in Redis (`Client::fenced_write`), against real
//! servers: applied whole with a token at least the highest accepted, refused whole with
//! a lower one, never half done; on a plain node, a Sentinel-managed master and a
//! Cluster; bad input refused before anything is sent.

use std::time::Duration;

use fencelock::fence::Reply;
use fencelock::{Client, Error, FencingToken};
use testkit::{Cluster, RedisServer, SentinelGroup};

/// The fence key of `resource` under the default prefix.
fn fence(resource: &str) -> String {
    format!("fencelock:{{{resource}}}:accepted")
}

fn token(t: u64) -> FencingToken {
    FencingToken::new(t)
}

#[tokio::test]
async fn a_write_with_the_highest_token_applies_every_write_and_records_the_token() {
    let redis = RedisServer::start();
    let store = Client::connect(&redis.url()).await.unwrap();
    let replies = store
        .fenced_write("stock:42", token(7))
        .set("{stock:42}:count", "17")
        .incr_by("{stock:42}:sold", 3)
        .hset("{stock:42}:meta", "by", "node-a")
        .rpush("{stock:42}:log", "a")
        .lpush("{stock:42}:log", "b")
        .xadd("{stock:42}:events", [("sold", "3")])
        .expire("{stock:42}:count", Duration::from_secs(60))
        .del("{stock:42}:old")
        .apply()
        .await
        .unwrap();
    assert_eq!(replies.len(), 8);
    assert_eq!(replies[0], Reply::Ok);
    assert_eq!(replies[1], Reply::Integer(3));
    assert_eq!(replies[2], Reply::Integer(1));
    assert_eq!(replies[3], Reply::Integer(1));
    assert_eq!(replies[4], Reply::Integer(2));
    assert!(
        matches!(&replies[5], Reply::Text(id) if id.contains('-')),
        "{replies:?}"
    );
    assert_eq!(replies[6], Reply::Integer(1));
    assert_eq!(replies[7], Reply::Integer(0));

    assert_eq!(redis.get(&fence("stock:42")).as_deref(), Some("7"));
    assert_eq!(redis.get("{stock:42}:count").as_deref(), Some("17"));
    assert_eq!(redis.get("{stock:42}:sold").as_deref(), Some("3"));
    let log = redis.cmd(&["LRANGE", "{stock:42}:log", "0", "-1"]);
    let log: Vec<_> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(log, ["b", "a"]);
    assert!(redis.pttl("{stock:42}:count") > 50_000);
    assert_eq!(
        redis.pttl(&fence("stock:42")),
        -1,
        "the fence never expires"
    );

    // The same token again passes (one holder's retries); a higher one too.
    store
        .fenced_write("stock:42", token(7))
        .incr_by("{stock:42}:sold", 1)
        .apply()
        .await
        .unwrap();
    store
        .fenced_write("stock:42", token(9))
        .incr_by("{stock:42}:sold", 1)
        .apply()
        .await
        .unwrap();
    assert_eq!(redis.get("{stock:42}:sold").as_deref(), Some("5"));
    assert_eq!(redis.get(&fence("stock:42")).as_deref(), Some("9"));
}

#[tokio::test]
async fn a_lower_token_is_refused_and_writes_nothing() {
    let redis = RedisServer::start();
    let store = Client::connect(&redis.url()).await.unwrap();
    store
        .fenced_write("r", token(10))
        .set("{r}:v", "new")
        .apply()
        .await
        .unwrap();
    let err = store
        .fenced_write("r", token(9))
        .set("{r}:v", "stale")
        .rpush("{r}:log", "stale")
        .apply()
        .await
        .unwrap_err();
    match &err {
        Error::Fenced {
            resource,
            token: ours,
            highest,
            ..
        } => {
            assert_eq!(resource, "r");
            assert_eq!(*ours, token(9));
            assert_eq!(*highest, token(10));
        }
        other => panic!("{other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("refused fencing token 9") && message.contains("10"),
        "{message}"
    );
    assert_eq!(redis.get("{r}:v").as_deref(), Some("new"));
    assert!(!redis.exists("{r}:log"));
    assert_eq!(redis.get(&fence("r")).as_deref(), Some("10"));
    // A write with no writes checks the token, and records a higher one.
    assert!(matches!(
        store.fenced_write("r", token(3)).apply().await,
        Err(Error::Fenced { .. })
    ));
    assert_eq!(
        store.fenced_write("r", token(11)).apply().await.unwrap(),
        []
    );
    assert_eq!(redis.get(&fence("r")).as_deref(), Some("11"));
}

#[tokio::test]
async fn tokens_past_two_to_the_53_compare_exactly() {
    let redis = RedisServer::start();
    let store = Client::connect(&redis.url()).await.unwrap();
    // Lua's numbers round these two to the same value; the script compares text.
    let big = (1u64 << 53) + 1;
    store.fenced_write("big", token(big)).apply().await.unwrap();
    assert!(matches!(
        store.fenced_write("big", token(big - 1)).apply().await,
        Err(Error::Fenced { highest, .. }) if highest == token(big)
    ));
    store
        .fenced_write("big", token(u64::MAX))
        .apply()
        .await
        .unwrap();
    assert!(matches!(
        store.fenced_write("big", token(u64::MAX - 1)).apply().await,
        Err(Error::Fenced { highest, .. }) if highest == token(u64::MAX)
    ));
    assert_eq!(redis.get(&fence("big")), Some(u64::MAX.to_string()));
}

#[tokio::test]
async fn a_write_that_would_fail_on_a_key_writes_nothing() {
    let redis = RedisServer::start();
    let store = Client::connect(&redis.url()).await.unwrap();
    redis.cmd(&["RPUSH", "{r}:list", "x"]);
    redis.cmd(&["SET", "{r}:text", "not a number"]);
    redis.cmd(&["SET", "{r}:huge", "4611686018427387904"]);
    let cases: Vec<(&str, fencelock::fence::FencedWrite<'_>, &str)> = vec![
        (
            "HSET on a list",
            store
                .fenced_write("r", token(5))
                .set("{r}:a", "1")
                .hset("{r}:list", "f", "v"),
            "WRONGTYPE",
        ),
        (
            "INCRBY on text",
            store
                .fenced_write("r", token(5))
                .set("{r}:a", "1")
                .incr_by("{r}:text", 1),
            "ERR",
        ),
        (
            "INCRBY past 2^62",
            store
                .fenced_write("r", token(5))
                .set("{r}:a", "1")
                .incr_by("{r}:huge", 1),
            "ERR",
        ),
        (
            "RPUSH on a key the write set to a string",
            store
                .fenced_write("r", token(5))
                .set("{r}:a", "1")
                .rpush("{r}:a", "x"),
            "WRONGTYPE",
        ),
        (
            "XADD on a list",
            store
                .fenced_write("r", token(5))
                .set("{r}:a", "1")
                .xadd("{r}:list", [("f", "v")]),
            "WRONGTYPE",
        ),
    ];
    for (what, write, code) in cases {
        match write.apply().await {
            Err(Error::Rejected {
                code: c, message, ..
            }) => {
                assert_eq!(c, code, "{what}: {message}");
                assert!(message.contains("nothing written"), "{what}: {message}");
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(
            !redis.exists("{r}:a"),
            "{what}: the SET before it was not applied"
        );
        assert!(
            !redis.exists(&fence("r")),
            "{what}: the token was not recorded"
        );
    }
    // What the writes before it leave counts: a DEL then an HSET on the list's key.
    store
        .fenced_write("r", token(5))
        .del("{r}:list")
        .hset("{r}:list", "f", "v")
        .incr_by("{r}:n", 2)
        .incr_by("{r}:n", 3)
        .apply()
        .await
        .unwrap();
    assert_eq!(redis.cmd(&["TYPE", "{r}:list"]).as_str(), Some("hash"));
    assert_eq!(redis.get("{r}:n").as_deref(), Some("5"));
}

#[tokio::test]
async fn a_fence_key_that_holds_something_else_is_left_alone() {
    let redis = RedisServer::start();
    let store = Client::connect(&redis.url()).await.unwrap();
    redis.cmd(&["SET", &fence("a"), "12abc"]);
    redis.cmd(&["HSET", &fence("b"), "f", "v"]);
    for (name, found) in [("a", "string"), ("b", "hash")] {
        match store
            .fenced_write(name, token(5))
            .set("{x}", "1")
            .apply()
            .await
        {
            Err(Error::WrongType { key, found: f, .. }) => {
                assert_eq!(key, fence(name));
                assert_eq!(f, found);
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(!redis.exists("{x}"));
    assert_eq!(redis.get(&fence("a")).as_deref(), Some("12abc"));
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let redis = RedisServer::start();
    let store = Client::connect(&redis.url()).await.unwrap();
    let before = redis.script_calls();
    let too_many = (0..=fencelock::limits::MAX_FENCED_WRITES)
        .fold(store.fenced_write("r", token(1)), |w, i| {
            w.set(format!("k{i}"), "v")
        });
    let cases = vec![
        (
            "empty resource",
            store.fenced_write("", token(1)).set("k", "v"),
            "resource name",
        ),
        (
            "braces",
            store.fenced_write("a{b}", token(1)).set("k", "v"),
            "resource name",
        ),
        (
            "zero expiry",
            store
                .fenced_write("r", token(1))
                .expire("k", Duration::ZERO),
            "expiry",
        ),
        (
            "XADD without fields",
            store
                .fenced_write("r", token(1))
                .xadd("k", Vec::<(&str, &str)>::new()),
            "XADD",
        ),
        (
            "the fence as a key",
            store.fenced_write("r", token(1)).set(fence("r"), "9"),
            "key",
        ),
        ("too many writes", too_many, "fenced write"),
    ];
    for (case, write, expected) in cases {
        match write.apply().await {
            Err(Error::InvalidArgument { what, reason, .. }) => {
                assert_eq!(what, expected, "{case}: {reason}");
            }
            other => panic!("{case}: {other:?}"),
        }
    }
    assert_eq!(redis.script_calls(), before, "nothing was sent");
    assert!(!redis.exists(&fence("r")));

    let nodes = RedisServer::start_many(3);
    let redlock = Client::redlock(nodes.iter().map(|n| n.url()))
        .connect()
        .await
        .unwrap();
    assert!(matches!(
        redlock
            .fenced_write("r", token(1))
            .set("k", "v")
            .apply()
            .await,
        Err(Error::InvalidArgument { what: "client", .. })
    ));
}

#[tokio::test]
async fn the_lock_and_the_resource_may_live_on_different_redis_servers() {
    let locks = RedisServer::start();
    let resource = RedisServer::start();
    let lock_client = Client::connect(&locks.url()).await.unwrap();
    let store = Client::connect(&resource.url()).await.unwrap();
    let first = lock_client.lock("job").try_acquire().await.unwrap();
    let old = first.fencing_token();
    first.release().await.unwrap();
    let second = lock_client.lock("job").try_acquire().await.unwrap();
    store
        .fenced_write(second.name(), second.fencing_token())
        .set("{job}:state", "second")
        .apply()
        .await
        .unwrap();
    // The first holder, late: refused by the resource's Redis.
    let err = store
        .fenced_write("job", old)
        .set("{job}:state", "first")
        .apply()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Fenced { highest, .. } if highest == second.fencing_token()),
        "{err:?}"
    );
    assert_eq!(resource.get("{job}:state").as_deref(), Some("second"));
    assert!(
        !locks.exists(&fence("job")),
        "the fence lives with the resource"
    );
    second.release().await.unwrap();
}

#[tokio::test]
async fn a_fenced_write_through_sentinel_goes_to_the_master() {
    let group = SentinelGroup::start();
    let store = Client::connect(&group.url()).await.unwrap();
    store
        .fenced_write("s", token(4))
        .set("{s}:v", "x")
        .apply()
        .await
        .unwrap();
    assert_eq!(group.master().get("{s}:v").as_deref(), Some("x"));
    assert!(matches!(
        store
            .fenced_write("s", token(3))
            .set("{s}:v", "y")
            .apply()
            .await,
        Err(Error::Fenced { .. })
    ));
    assert_eq!(group.master().get("{s}:v").as_deref(), Some("x"));
}

#[tokio::test]
async fn on_a_cluster_the_keys_share_the_resource_slot_or_are_refused() {
    let cluster = Cluster::shared();
    let store = Client::connect(&cluster.url()).await.unwrap();
    // Resources whose fence keys fall on different masters: each write goes to its own.
    for resource in ["fence-a", "fence-b", "fence-c", "fence-d"] {
        let key = format!("{{{resource}}}:v");
        store
            .fenced_write(resource, token(8))
            .set(&key, resource)
            .apply()
            .await
            .unwrap();
        let node = cluster.node_for_key(&key);
        assert_eq!(node.get(&key).as_deref(), Some(resource));
        assert_eq!(node.get(&fence(resource)).as_deref(), Some("8"));
        assert!(matches!(
            store
                .fenced_write(resource, token(7))
                .set(&key, "stale")
                .apply()
                .await,
            Err(Error::Fenced { .. })
        ));
    }
    match store
        .fenced_write("fence-a", token(9))
        .set("{fence-a}:v", "1")
        .set("another-slot", "1")
        .apply()
        .await
    {
        Err(Error::InvalidArgument {
            what: "key",
            reason,
            ..
        }) => {
            assert!(
                reason.contains("\"another-slot\"") && reason.contains("hash tag"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        cluster
            .node_for_key("{fence-a}:v")
            .get("{fence-a}:v")
            .as_deref(),
        Some("fence-a")
    );
}
