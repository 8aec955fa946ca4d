//! The pause story, end to end, with real processes and real stores: holder A takes the
//! lock and is stopped (SIGSTOP) past its lease; B takes the lock and writes; A resumes
//! and writes with its old token. PostgreSQL (`fencelock_check`) and Redis
//! (`Client::fenced_write`) each refuse A's write, keep B's, and A gets
//! `Error::Fenced`. Without the check (the control), A's late write lands over B's: the
//! lost update the check exists for.

use std::time::Duration;

use fencelock::{Client, Error, fence};
use testkit::{Postgres, RedisServer};

mod common;
use common::{eventually, helper_entry, spawn_helper};

const HELPER_ENV: &str = "FENCELOCK_STORY_HOLDER";
/// A's lease: renewed while A runs, so it ends only because A is stopped.
const LEASE: Duration = Duration::from_millis(1500);

/// Holder A, in a process of its own. Spec: `LOCK_URL MODE RESOURCE_URL PG_URL`, MODE
/// `fenced` or `unfenced`. Takes the lock, says so (its token in PostgreSQL's `reports`
/// table), and waits to be told to go, which the test does once it stopped A; resumed,
/// A writes to both stores with its token, then reports what each said (`written`,
/// `fenced`, or the error).
#[test]
#[ignore = "a helper process of the pause story, started by it"]
fn holder_a() {
    helper_entry(HELPER_ENV, async |locks, words| {
        let [mode, resource_url, pg_url] = &words[..] else {
            panic!("spec: {words:?}")
        };
        let fenced = mode == "fenced";
        let guard = locks.lock("stock:42").lease(LEASE).acquire().await.unwrap();
        let token = guard.fencing_token();
        let (mut pg, connection) = tokio_postgres::connect(pg_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        report(&pg, "token", &token.to_string()).await;
        // Stopped here until the test sends SIGCONT: `kill` returns once we run again.
        // The test stops this process here (SIGSTOP), then says go: A writes only once
        // it was stopped, and resumed.
        while pg
            .query_opt("SELECT 1 FROM reports WHERE what = 'go'", &[])
            .await
            .unwrap()
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Resumed, long past the lease, A believes it still holds the lock.
        let pg_outcome = write_pg(&mut pg, fenced, token, "A").await;
        let redis_outcome = write_redis(resource_url, fenced, token, "A").await;
        report(&pg, "pg", &pg_outcome).await;
        report(&pg, "redis", &redis_outcome).await;
        drop(guard);
        locks.flush().await;
    });
}

/// Sends SIG`name` to process `pid` with kill(1).
fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}: {status}");
}

/// What A tells the test: a row of `reports`.
async fn report(pg: &tokio_postgres::Client, what: &str, outcome: &str) {
    pg.execute("INSERT INTO reports VALUES ($1, $2)", &[&what, &outcome])
        .await
        .unwrap();
}

/// What A reported about `what`, if it did.
fn reported(pg: &Postgres, what: &str) -> Option<String> {
    let out = pg.psql(&format!(
        "SELECT outcome FROM reports WHERE what = '{what}'"
    ));
    (!out.is_empty()).then_some(out)
}

/// Sells one at PostgreSQL as `who`: with the check (`fencelock_check`) or without.
async fn write_pg(
    pg: &mut tokio_postgres::Client,
    fenced: bool,
    token: fencelock::FencingToken,
    who: &str,
) -> String {
    let tx = pg.transaction().await.unwrap();
    if fenced {
        match fence::tokio_postgres::check(&tx, "stock:42", token).await {
            Ok(()) => {}
            Err(Error::Fenced { .. }) => return "fenced".into(),
            Err(e) => return e.to_string(),
        }
    }
    tx.execute("UPDATE stock SET by = $1 WHERE id = 42", &[&who])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    "written".into()
}

/// Writes the resource's Redis as `who`: a fenced write, or a plain `SET` (the
/// unfenced control).
async fn write_redis(
    store_url: &str,
    fenced: bool,
    token: fencelock::FencingToken,
    who: &str,
) -> String {
    if !fenced {
        let client = redis::Client::open(store_url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let () = redis::cmd("SET")
            .arg("{stock:42}:by")
            .arg(who)
            .query_async(&mut conn)
            .await
            .unwrap();
        return "written".into();
    }
    let store = Client::connect(store_url).await.unwrap();
    match store
        .fenced_write("stock:42", token)
        .set("{stock:42}:by", who)
        .apply()
        .await
    {
        Ok(_) => "written".into(),
        Err(Error::Fenced { .. }) => "fenced".into(),
        Err(e) => e.to_string(),
    }
}

/// The story in `mode`; returns what A's writes came to and what each store holds.
async fn story(mode: &str) -> (String, String, String, String) {
    let locks = RedisServer::start();
    let resource = RedisServer::start();
    let pg = Postgres::start();
    pg.psql(fence::POSTGRES_SETUP);
    pg.psql(
        "CREATE TABLE stock (id int PRIMARY KEY, by text); \
         INSERT INTO stock VALUES (42, 'nobody'); \
         CREATE TABLE reports (what text PRIMARY KEY, outcome text NOT NULL)",
    );

    let mut a = spawn_helper(
        "holder_a",
        HELPER_ENV,
        format!("{} {mode} {} {}", locks.url(), resource.url(), pg.url()),
    );
    let pid = a.id();
    eventually("A holds the lock", Duration::from_secs(10), async || {
        reported(&pg, "token").is_some()
    })
    .await;
    signal(pid, "STOP");
    eventually("A is stopped", Duration::from_secs(5), async || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('T'))
        })
    })
    .await;
    pg.psql("INSERT INTO reports VALUES ('go', '')");
    // A's lease runs out while it is stopped; B takes the lock and writes.
    let b_client = Client::connect(&locks.url()).await.unwrap();
    let b = b_client
        .lock("stock:42")
        .wait(LEASE * 4)
        .acquire()
        .await
        .unwrap();
    let a_token: u64 = reported(&pg, "token").unwrap().parse().unwrap();
    assert!(b.fencing_token().get() > a_token);
    let (mut b_pg, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let fenced = mode == "fenced";
    assert_eq!(
        write_pg(&mut b_pg, fenced, b.fencing_token(), "B").await,
        "written"
    );
    assert_eq!(
        write_redis(&resource.url(), fenced, b.fencing_token(), "B").await,
        "written"
    );

    // A resumes, and writes with its old token.
    signal(pid, "CONT");
    let status = tokio::task::spawn_blocking(move || a.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "A: {status}");
    b.release().await.unwrap();
    (
        reported(&pg, "pg").unwrap(),
        reported(&pg, "redis").unwrap(),
        pg.psql("SELECT by FROM stock WHERE id = 42"),
        resource.get("{stock:42}:by").unwrap(),
    )
}

#[tokio::test]
async fn a_holder_paused_past_its_lease_is_refused_by_postgres_and_redis() {
    let (a_pg, a_redis, pg_by, redis_by) = story("fenced").await;
    assert_eq!(a_pg, "fenced", "PostgreSQL refused A's late write");
    assert_eq!(a_redis, "fenced", "Redis refused A's late write");
    assert_eq!(pg_by, "B", "PostgreSQL keeps B's write");
    assert_eq!(redis_by, "B", "Redis keeps B's write");
}

#[tokio::test]
async fn without_the_check_the_paused_holder_overwrites_the_newer_one() {
    let (a_pg, a_redis, pg_by, redis_by) = story("unfenced").await;
    assert_eq!(a_pg, "written");
    assert_eq!(a_redis, "written");
    assert_eq!(pg_by, "A", "the lost update: B's write is gone");
    assert_eq!(redis_by, "A", "the lost update: B's write is gone");
}
