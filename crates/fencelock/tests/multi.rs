//! Several locks at once (`Client::lock_all`) against real servers: all or none, each
//! name's own fencing token, one guard that renews and releases all and names a lost
//! one, waiting without holding, overlapping sets taken in random orders without
//! deadlock or overlap, bad input refused before anything is sent; with Redlock, and on
//! a Cluster with names in different slots (a partial grant taken back).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fencelock::limits::MAX_MULTI_NAMES;
use fencelock::{Client, Error};
use testkit::{Cluster, RedisServer};

mod common;
use common::{eventually, numsub};

/// The lock key of `name` under the default prefix.
fn key(name: &str) -> String {
    format!("fencelock:{{{name}}}")
}

/// The fencing counter of `name` on `r`.
fn counter(r: &RedisServer, name: &str) -> Option<u64> {
    r.get(&format!("{}:fence", key(name)))
        .map(|v| v.parse().expect("a counter"))
}

#[tokio::test]
async fn takes_every_name_or_none() {
    let r = RedisServer::start();
    let (c, other) = (
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
    );
    let b = other.lock("b").try_acquire().await.unwrap();
    let before = (counter(&r, "a"), counter(&r, "b"), counter(&r, "c"));

    let err = c.lock_all(["c", "a", "b"]).try_acquire().await.unwrap_err();
    match &err {
        Error::Held { name, .. } => assert_eq!(name, "b", "{err}"),
        other => panic!("{other}"),
    }
    // Nothing of the others was taken, and no counter moved.
    assert_eq!(r.get(&key("a")), None);
    assert_eq!(r.get(&key("c")), None);
    assert_eq!(r.get(&key("b")).as_deref(), Some(b.holder_token().as_str()));
    assert_eq!(
        (counter(&r, "a"), counter(&r, "b"), counter(&r, "c")),
        before
    );

    b.release().await.unwrap();
    let all = c.lock_all(["c", "a", "b"]).try_acquire().await.unwrap();
    assert_eq!(all.names().collect::<Vec<_>>(), ["a", "b", "c"]);
    let token = all.guard("a").unwrap().holder_token().as_str().to_owned();
    for name in ["a", "b", "c"] {
        assert_eq!(r.get(&key(name)).as_deref(), Some(token.as_str()), "{name}");
    }
    // Taken: another multi-lock that shares one name is refused, naming it.
    match other.lock_all(["z", "c"]).try_acquire().await {
        Err(Error::Held { name, .. }) => assert_eq!(name, "c"),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.get(&key("z")), None);
    all.release().await.unwrap();
}

#[tokio::test]
async fn each_name_keeps_its_own_increasing_token_and_release_frees_all() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let single = c.lock("t1").try_acquire().await.unwrap();
    let first = single.fencing_token();
    single.release().await.unwrap();

    let all = c.lock_all(["t2", "t1"]).try_acquire().await.unwrap();
    let t1 = all.fencing_token("t1").unwrap();
    let t2 = all.fencing_token("t2").unwrap();
    assert!(t1 > first, "{t1} after {first}");
    assert_eq!(all.fencing_token("t3"), None);
    assert_eq!(
        all.fencing_tokens().collect::<Vec<_>>(),
        [("t1", t1), ("t2", t2)]
    );
    // Each name's counter holds its token, as for a single lock.
    assert_eq!(counter(&r, "t1"), Some(t1.get()));
    assert_eq!(counter(&r, "t2"), Some(t2.get()));
    all.release().await.unwrap();
    assert_eq!(r.get(&key("t1")), None);
    assert_eq!(r.get(&key("t2")), None);

    // Single locks after it, and another multi-lock: higher again, name by name.
    let again = c.lock("t2").try_acquire().await.unwrap();
    assert!(again.fencing_token() > t2);
    again.release().await.unwrap();
    let next = c.lock_all(["t1", "t2"]).try_acquire().await.unwrap();
    assert!(next.fencing_token("t1").unwrap() > t1);
    assert!(next.fencing_token("t2").unwrap() > t2);
    drop(next);
    // Dropped unreleased: released in the background.
    eventually(
        "the dropped guard's keys gone",
        Duration::from_secs(5),
        async || r.get(&key("t1")).is_none() && r.get(&key("t2")).is_none(),
    )
    .await;
}

#[tokio::test]
async fn one_guard_renews_every_lease_and_names_the_one_lost() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let lease = Duration::from_millis(600);
    let all = c
        .lock_all(["l1", "l2", "l3"])
        .lease(lease)
        .try_acquire()
        .await
        .unwrap();
    // Held past three leases: every one renewed.
    let held_since = Instant::now();
    let lost = all.lost();
    tokio::pin!(lost);
    while held_since.elapsed() < lease * 3 {
        tokio::select! {
            l = &mut lost => panic!("lost {l:?}"),
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    assert!(all.loss().is_none());
    for name in ["l1", "l2", "l3"] {
        assert!(r.get(&key(name)).is_some(), "{name}");
    }
    // One key deleted by hand: the next renewal finds it gone.
    r.cmd(&["DEL", &key("l2")]);
    let l = tokio::time::timeout(lease * 3, lost)
        .await
        .expect("lost fires");
    assert_eq!(l.name, "l2");
    assert_eq!(all.loss().map(|l| l.name).as_deref(), Some("l2"));
    // The release says so, and frees the others all the same.
    match all.release().await {
        Err(Error::LeaseLost { name, .. }) => assert_eq!(name, "l2"),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.get(&key("l1")), None);
    assert_eq!(r.get(&key("l3")), None);
}

#[tokio::test]
async fn a_waiter_holds_nothing_while_it_waits_and_is_served_on_release() {
    let r = RedisServer::start();
    let (c, other) = (
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
    );
    let b = other.lock("wb").try_acquire().await.unwrap();
    let waiter = tokio::spawn(
        c.lock_all(["wa", "wb", "wc"])
            .wait(Duration::from_secs(20))
            .acquire(),
    );
    // Waiting on the held name's channel, holding none of the others.
    eventually(
        "the waiter subscribed",
        Duration::from_secs(5),
        async || numsub(&r, "fencelock:{wb}:released") > 0,
    )
    .await;
    assert_eq!(r.get(&key("wa")), None);
    assert_eq!(r.get(&key("wc")), None);
    // Free for anyone else meanwhile.
    other
        .lock("wa")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let released = Instant::now();
    b.release().await.unwrap();
    let all = waiter.await.unwrap().unwrap();
    eprintln!("served {:?} after the release", released.elapsed());
    assert_eq!(all.names().count(), 3);
    all.release().await.unwrap();

    // A wait that runs out says so, naming the held name, and holds nothing.
    let b = other.lock("wb").try_acquire().await.unwrap();
    let err = c
        .lock_all(["wa", "wb"])
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    match err {
        Error::Held { name, waited, .. } => {
            assert_eq!(name, "wb");
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("{other}"),
    }
    assert_eq!(r.get(&key("wa")), None);
    b.release().await.unwrap();
}

/// A waiting multi-lock waits for the held name as a plain waiter of it does: its client
/// is on that name's wake list while it waits (so the release wakes it by name, long
/// before the holder's lease would end), and off it once it holds every name.
#[tokio::test]
async fn a_waiter_is_listed_on_the_held_names_wake_list_and_woken_by_its_release() {
    let r = RedisServer::start();
    let (c, other) = (
        Client::connect(&r.url()).await.unwrap(),
        Client::connect(&r.url()).await.unwrap(),
    );
    let wakes = format!("{}:wakes", key("lb"));
    let listed = || r.cmd(&["ZCARD", &wakes]).as_int().unwrap_or(0);
    let b = other
        .lock("lb")
        .lease(Duration::from_secs(60))
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(
        c.lock_all(["la", "lb"])
            .wait(Duration::from_secs(60))
            .acquire(),
    );
    eventually(
        "the waiter's client is on lb's wake list",
        Duration::from_secs(5),
        async || listed() == 1,
    )
    .await;
    assert_eq!(r.get(&key("la")), None, "holding nothing while it waits");
    b.release().await.unwrap();
    // Woken by the release: well before the holder's 60 s lease or the wait would end.
    let all = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert_eq!(all.names().collect::<Vec<_>>(), ["la", "lb"]);
    assert_eq!(listed(), 0, "the release took it off the list");
    all.release().await.unwrap();

    // A holder whose lease runs out publishes nothing: the waiter tries again when that
    // lease ends, and its grant takes its client off the list itself.
    let _expiring = other
        .lock("lb")
        .lease(Duration::from_secs(1))
        .renew(false)
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(
        c.lock_all(["la", "lb"])
            .wait(Duration::from_secs(30))
            .acquire(),
    );
    eventually("listed again", Duration::from_secs(5), async || {
        listed() == 1
    })
    .await;
    let all = waiter.await.unwrap().unwrap();
    assert_eq!(listed(), 0, "its grant took it off the list");
    all.release().await.unwrap();
}

/// How many times each task of [`overlapping_sets_never_deadlock_nor_overlap`] took its
/// set.
const ROUNDS_FOR: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_never_deadlock_nor_overlap() {
    let r = RedisServer::start();
    let names = ["oa", "ob", "oc"];
    let sets: [[&str; 2]; 3] = [["oa", "ob"], ["ob", "oc"], ["oc", "oa"]];
    // Who holds each name now (at most one), and each name's last fencing token.
    let holding: Arc<Vec<AtomicBool>> =
        Arc::new(names.iter().map(|_| AtomicBool::new(false)).collect());
    let last: Arc<Vec<AtomicU64>> = Arc::new(names.iter().map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for client in 0..3 {
        let c = Client::connect(&r.url()).await.unwrap();
        for task in 0..3 {
            let (c, holding, last) = (c.clone(), holding.clone(), last.clone());
            let set = sets[(client + task) % 3];
            tasks.push(tokio::spawn(async move {
                let started = Instant::now();
                let mut taken = 0u32;
                while started.elapsed() < ROUNDS_FOR {
                    // A random order each time.
                    let order = if rand::random::<bool>() {
                        [set[0], set[1]]
                    } else {
                        [set[1], set[0]]
                    };
                    let all = c
                        .lock_all(order)
                        .lease(Duration::from_secs(5))
                        .wait(Duration::from_secs(20))
                        .acquire()
                        .await
                        .unwrap_or_else(|e| panic!("{order:?}: {e}"));
                    for (name, token) in all.fencing_tokens() {
                        let i = names.iter().position(|n| *n == name).unwrap();
                        assert!(
                            !holding[i].swap(true, Ordering::SeqCst),
                            "{name} held twice"
                        );
                        // Tokens of one name only increase, holder after holder.
                        let before = last[i].swap(token.get(), Ordering::SeqCst);
                        assert!(token.get() > before, "{name}: {token} after {before}");
                    }
                    tokio::time::sleep(Duration::from_millis(rand::random_range(0..3))).await;
                    for (name, _) in all.fencing_tokens() {
                        let i = names.iter().position(|n| *n == name).unwrap();
                        holding[i].store(false, Ordering::SeqCst);
                    }
                    all.release().await.unwrap();
                    taken += 1;
                }
                taken
            }));
        }
    }
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(
            tokio::time::timeout(ROUNDS_FOR + Duration::from_secs(30), t)
                .await
                .expect("no deadlock")
                .unwrap(),
        );
    }
    eprintln!("sets taken per task: {counts:?}");
    // Every waiter was served, again and again.
    assert!(counts.iter().all(|&n| n > 0), "{counts:?}");
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let r = RedisServer::start();
    let c = Client::connect(&r.url()).await.unwrap();
    let many: Vec<String> = (0..=MAX_MULTI_NAMES).map(|i| format!("n{i}")).collect();
    let cases = [
        ("empty", c.lock_all(Vec::<String>::new())),
        ("twice", c.lock_all(["x", "y", "x"])),
        ("too many", c.lock_all(many.clone())),
        ("invalid", c.lock_all(["x", "a{b}"])),
        ("empty name", c.lock_all(["x", ""])),
        ("lease", c.lock_all(["x", "y"]).lease(Duration::ZERO)),
    ];
    for (what, builder) in cases {
        for result in [builder.try_acquire().await, builder.acquire().await] {
            match result {
                Err(e @ Error::InvalidArgument { .. }) => eprintln!("{what}: {e}"),
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    // The limit itself is fine.
    let fits = c
        .lock_all(many[..MAX_MULTI_NAMES].to_vec())
        .try_acquire()
        .await
        .unwrap();
    fits.release().await.unwrap();
    r.cmd(&["FLUSHALL"]);
    for (what, builder) in [
        ("twice", c.lock_all(["x", "x"])),
        ("empty name", c.lock_all([""])),
    ] {
        assert!(builder.acquire().await.is_err(), "{what}");
    }
    assert_eq!(r.cmd(&["DBSIZE"]).as_int(), Some(0));

    // A name holding data fencelock did not write: a typed error, nothing taken.
    r.cmd(&["HSET", &key("h"), "f", "v"]);
    match c.lock_all(["g", "h"]).try_acquire().await {
        Err(Error::WrongType { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(r.get(&key("g")), None);
}

#[tokio::test]
async fn redlock_takes_all_on_a_majority_or_none_anywhere() {
    let servers = RedisServer::start_many(3);
    let c = Client::redlock(servers.iter().map(RedisServer::url))
        .restart_protection(None)
        .connect()
        .await
        .unwrap();
    // One node's "rb" held by a stranger: two of three grant.
    servers[0].cmd(&["SET", &key("rb"), "stranger", "PX", "60000"]);
    let all = c.lock_all(["rb", "ra"]).try_acquire().await.unwrap();
    let token = all.guard("ra").unwrap().holder_token().as_str().to_owned();
    for s in &servers[1..] {
        assert_eq!(s.get(&key("ra")).as_deref(), Some(token.as_str()));
        assert_eq!(s.get(&key("rb")).as_deref(), Some(token.as_str()));
    }
    let (ra, rb) = (
        all.fencing_token("ra").unwrap(),
        all.fencing_token("rb").unwrap(),
    );
    all.release().await.unwrap();

    // Two nodes' "rb" held: refused, naming it, and "ra" taken back on every node.
    servers[1].cmd(&["SET", &key("rb"), "stranger", "PX", "60000"]);
    match c.lock_all(["ra", "rb"]).try_acquire().await {
        Err(Error::Held { name, .. }) => assert_eq!(name, "rb"),
        other => panic!("{other:?}"),
    }
    for s in &servers {
        assert_eq!(s.get(&key("ra")), None);
    }
    for s in &servers[..2] {
        s.cmd(&["DEL", &key("rb")]);
    }
    let next = c.lock_all(["ra", "rb"]).try_acquire().await.unwrap();
    assert!(next.fencing_token("ra").unwrap() > ra);
    assert!(next.fencing_token("rb").unwrap() > rb);
    next.release().await.unwrap();
}

/// Lock names `{prefix}-N` whose keys lie in `n` different slots of `cluster`.
fn names_in_different_slots(cluster: &Cluster, prefix: &str, n: usize) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut slots = Vec::new();
    for i in 0..10_000 {
        let name = format!("{prefix}-{i}");
        let slot = cluster.slot_of(&key(&name));
        if !slots.contains(&slot) {
            slots.push(slot);
            names.push(name);
            if names.len() == n {
                break;
            }
        }
    }
    names.sort();
    names
}

#[tokio::test]
async fn cluster_takes_names_slot_by_slot_and_takes_back_a_partial_grant() {
    let cluster = Cluster::shared();
    let names = names_in_different_slots(cluster, "mslot", 3);
    let (c, other) = (
        Client::connect(&cluster.url()).await.unwrap(),
        Client::connect(&cluster.url()).await.unwrap(),
    );
    let get = |name: &str| cluster.node_for_key(&key(name)).get(&key(name));

    let all = c
        .lock_all(names.iter().rev().cloned())
        .try_acquire()
        .await
        .unwrap();
    for name in &names {
        // One call per slot: each group's own holder token.
        let token = all.guard(name).unwrap().holder_token().as_str();
        assert_eq!(get(name).as_deref(), Some(token), "{name}");
    }
    all.release().await.unwrap();
    for name in &names {
        assert_eq!(get(name), None, "{name}");
    }

    // The last name (in the global order) held by another client: the first slots'
    // grants are taken back before the refusal returns.
    let last = other.lock(&names[2]).try_acquire().await.unwrap();
    let counters_before: Vec<_> = names
        .iter()
        .map(|n| {
            cluster
                .node_for_key(&key(n))
                .get(&format!("{}:fence", key(n)))
        })
        .collect();
    match c.lock_all(names.clone()).try_acquire().await {
        Err(Error::Held { name, .. }) => assert_eq!(name, names[2]),
        other => panic!("{other:?}"),
    }
    assert_eq!(get(&names[0]), None);
    assert_eq!(get(&names[1]), None);
    // Those slots did grant (their counters moved): a partial grant, taken back.
    for (i, n) in names[..2].iter().enumerate() {
        let now = cluster
            .node_for_key(&key(n))
            .get(&format!("{}:fence", key(n)));
        assert_ne!(now, counters_before[i], "{n}");
    }

    // A waiting one gets them all once that name is free.
    let waiter = tokio::spawn(
        c.lock_all(names.clone())
            .wait(Duration::from_secs(20))
            .acquire(),
    );
    eventually("the waiter waits", Duration::from_secs(5), async || {
        c.stats().waiters > 0
    })
    .await;
    assert_eq!(get(&names[0]), None);
    last.release().await.unwrap();
    let all = waiter.await.unwrap().unwrap();
    assert_eq!(all.names().count(), 3);
    all.release().await.unwrap();
}

/// The helper process of [`a_client_killed_between_its_slots_leaves_nothing_past_the_lease`]:
/// `URL NAME1 NAME2 DIR` connects (slow replies waited for), takes and releases both
/// names once (every connection up), says so with `DIR/ready`, and once `DIR/go` exists
/// takes both names with a 1.5 s lease.
#[test]
#[ignore = "a helper process, started by the test below"]
fn multi_slot_holder() {
    let Ok(spec) = std::env::var("FENCELOCK_MULTI_SLOT_HOLDER") else {
        return;
    };
    let words: Vec<&str> = spec.split(' ').collect();
    let [url, first, second, dir] = words[..] else {
        panic!("spec: {spec}");
    };
    let dir = std::path::Path::new(dir);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = Client::builder(url)
            .response_timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect");
        let warm = client.lock_all([first, second]).try_acquire().await;
        warm.expect("both free").release().await.expect("released");
        std::fs::write(dir.join("ready"), "").unwrap();
        while !dir.join("go").exists() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let all = client
            .lock_all([first, second])
            .lease(Duration::from_millis(1500))
            .try_acquire()
            .await;
        eprintln!("multi-slot holder: {all:?}");
    });
}

/// Issue 35's Cluster check: a client SIGKILLed between its slot calls (the first slot's
/// grant made, the second slot's master paused under its call) leaves the first name
/// taken only until its lease runs out: nothing renews it.
#[tokio::test]
async fn a_client_killed_between_its_slots_leaves_nothing_past_the_lease() {
    let mut cluster = Cluster::builder()
        .masters(3)
        .replicas_per_master(0)
        // No master is failed, nor the cluster marked down, while one is paused.
        .node_timeout(Duration::from_secs(120))
        .start();
    // Two names on two masters; the first in the global order on the one left running.
    let mut names = Vec::new();
    let mut masters = Vec::new();
    for i in 0..10_000 {
        let name = format!("kill-{i}");
        let master = cluster.node_for_key(&key(&name)).addr();
        if !masters.contains(&master) {
            masters.push(master);
            names.push(name);
            if names.len() == 2 {
                break;
            }
        }
    }
    let (first, second) = (names[0].clone(), names[1].clone());
    assert!(first < second);
    let dir = Dir(std::env::temp_dir().join(format!("fencelock-multi-{}", std::process::id())));
    std::fs::create_dir_all(dir.path()).unwrap();
    let mut helper = common::spawn_helper(
        "multi_slot_holder",
        "FENCELOCK_MULTI_SLOT_HOLDER",
        format!(
            "{} {first} {second} {}",
            cluster.url(),
            dir.path().display()
        ),
    );
    eventually(
        "the helper connected",
        Duration::from_secs(10),
        async || dir.path().join("ready").exists(),
    )
    .await;
    cluster.pause_node(&masters[1]);
    std::fs::write(dir.path().join("go"), "").unwrap();
    let first_master = cluster.node_for_key(&key(&first));
    eventually(
        "the first slot granted",
        Duration::from_secs(10),
        async || first_master.get(&key(&first)).is_some(),
    )
    .await;
    // Between its slots: its second call hangs on the paused master.
    helper.kill().unwrap();
    let killed = Instant::now();
    let _ = helper.wait();
    cluster.resume_node(&masters[1]);
    let first_master = cluster.node_for_key(&key(&first));
    let left = first_master
        .cmd(&["PTTL", &key(&first)])
        .as_int()
        .unwrap_or(-2);
    assert!(left <= 1500, "the partial grant's lease: {left} ms");
    eventually(
        "the partial grant expired",
        Duration::from_secs(5),
        async || first_master.get(&key(&first)).is_none(),
    )
    .await;
    eprintln!("gone {:?} after the kill", killed.elapsed());
    // The second call, in flight to the paused master, may run once it resumes (the
    // server reads it before it sees the connection closed): its grant too ends with
    // its lease.
    let second_master = cluster.node_for_key(&key(&second));
    let left = second_master
        .cmd(&["PTTL", &key(&second)])
        .as_int()
        .unwrap_or(-2);
    assert!(left <= 1500, "the in-flight grant's lease: {left} ms");
    eventually(
        "the in-flight grant expired",
        Duration::from_secs(5),
        async || second_master.get(&key(&second)).is_none(),
    )
    .await;
}

/// A directory of the test's, removed when dropped.
struct Dir(std::path::PathBuf);

impl Dir {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
