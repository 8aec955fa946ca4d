//! The PostgreSQL check (`fencelock::fence`), against a real PostgreSQL server that the
//! test kit starts: installed twice without loss, a stale token refused with the whole
//! transaction rolled back, row locking that makes concurrent checks wait and then
//! decide on the committed token, both client crates, the per-row pattern, and bad
//! input.

use std::time::Duration;

use fencelock::fence::{self, POSTGRES_SETUP};
use fencelock::{Error, FencingToken};
use testkit::Postgres;
use tokio_postgres::NoTls;

fn token(t: u64) -> FencingToken {
    FencingToken::new(t)
}

/// A connected tokio-postgres client (its connection driven by a task).
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A server with the check installed and a table the tests write to.
async fn installed() -> (Postgres, String) {
    let pg = Postgres::start();
    let url = pg.url();
    let client = connect(&url).await;
    fence::tokio_postgres::install(&client).await.unwrap();
    client
        .batch_execute("CREATE TABLE stock (id int PRIMARY KEY, count int NOT NULL, by text)")
        .await
        .unwrap();
    client
        .execute("INSERT INTO stock VALUES (42, 100, 'nobody')", &[])
        .await
        .unwrap();
    (pg, url)
}

/// Sells one under `t`: check, write, commit. The transaction is rolled back on error.
async fn sell(client: &mut tokio_postgres::Client, t: u64, by: &str) -> Result<(), Error> {
    let tx = client.transaction().await.unwrap();
    fence::tokio_postgres::check(&tx, "stock:42", token(t)).await?;
    tx.execute(
        "UPDATE stock SET count = count - 1, by = $1 WHERE id = 42",
        &[&by],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    Ok(())
}

fn count_and_by(pg: &Postgres) -> String {
    pg.psql("SELECT count || ' ' || by FROM stock WHERE id = 42")
}

#[tokio::test]
async fn a_stale_token_is_refused_and_its_transaction_writes_nothing() {
    let (pg, url) = installed().await;
    let mut client = connect(&url).await;
    sell(&mut client, 7, "seven").await.unwrap();
    sell(&mut client, 7, "seven again").await.unwrap(); // one holder's retry
    match sell(&mut client, 6, "six").await {
        Err(Error::Fenced {
            resource,
            token: ours,
            highest,
            ..
        }) => {
            assert_eq!(resource, "stock:42");
            assert_eq!(ours, token(6));
            assert_eq!(highest, token(7));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(count_and_by(&pg), "98 seven again");
    sell(&mut client, 9, "nine").await.unwrap();
    assert_eq!(count_and_by(&pg), "97 nine");
    assert_eq!(
        pg.psql("SELECT token FROM fencelock_fence WHERE resource = 'stock:42'"),
        "9"
    );
    // From SQL: its own SQLSTATE, both tokens in the message.
    let err = pg
        .try_psql("BEGIN; SELECT fencelock_check('stock:42', 8); COMMIT;")
        .unwrap_err();
    assert!(
        err.contains("stale fencing token 8") && err.contains("token 9 was accepted"),
        "{err}"
    );
    let code = pg.psql(
        "DO $$ BEGIN PERFORM fencelock_check('stock:42', 8); \
         EXCEPTION WHEN SQLSTATE 'FL001' THEN RAISE NOTICE 'caught'; END $$; SELECT 'caught'",
    );
    assert_eq!(code, "caught");
}

#[tokio::test]
async fn the_setup_installs_twice_keeping_tokens_and_says_when_it_is_missing() {
    let pg = Postgres::start();
    let client = connect(&pg.url()).await;
    // Not installed: one clear error that says to run `fencelock sql`.
    let tx_client = &mut connect(&pg.url()).await;
    let tx = tx_client.transaction().await.unwrap();
    let err = fence::tokio_postgres::check(&tx, "r", token(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Database { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("not installed") && message.contains("fencelock sql"),
        "{message}"
    );
    drop(tx);

    fence::tokio_postgres::install(&client).await.unwrap();
    let mut c = connect(&pg.url()).await;
    let tx = c.transaction().await.unwrap();
    fence::tokio_postgres::check(&tx, "r", token(5))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Again, and by psql, and by two clients at once: no error, the token kept.
    fence::tokio_postgres::install(&client).await.unwrap();
    pg.psql(POSTGRES_SETUP);
    let other = connect(&pg.url()).await;
    let (a, b) = tokio::join!(
        fence::tokio_postgres::install(&client),
        fence::tokio_postgres::install(&other)
    );
    a.unwrap();
    b.unwrap();
    assert_eq!(
        pg.psql("SELECT token FROM fencelock_fence WHERE resource = 'r'"),
        "5"
    );
    let tx = c.transaction().await.unwrap();
    assert!(matches!(
        fence::tokio_postgres::check(&tx, "r", token(4)).await,
        Err(Error::Fenced { .. })
    ));
}

#[tokio::test]
async fn sqlx_checks_the_same_way() {
    let (pg, url) = installed().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    fence::sqlx::install(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    fence::sqlx::check(&mut tx, "stock:42", token(10))
        .await
        .unwrap();
    sqlx::query("UPDATE stock SET by = 'sqlx' WHERE id = 42")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    match fence::sqlx::check(&mut tx, "stock:42", token(3)).await {
        Err(Error::Fenced { highest, .. }) => assert_eq!(highest, token(10)),
        other => panic!("{other:?}"),
    }
    tx.rollback().await.unwrap();
    assert_eq!(count_and_by(&pg), "100 sqlx");

    // Tokens past 2^63 (beyond bigint) arrive whole.
    let mut tx = pool.begin().await.unwrap();
    fence::sqlx::check(&mut tx, "big", token(u64::MAX - 1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    fence::sqlx::check(&mut tx, "big", token(u64::MAX))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(matches!(
        fence::sqlx::check(&mut tx, "big", token(u64::MAX - 1)).await,
        Err(Error::Fenced { highest, .. }) if highest == token(u64::MAX)
    ));
    tx.rollback().await.unwrap();

    // Not installed in another database.
    let other = pg.create_database("bare");
    let bare = sqlx::PgPool::connect(&other).await.unwrap();
    let mut tx = bare.begin().await.unwrap();
    let err = fence::sqlx::check(&mut tx, "r", token(1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fencelock sql"), "{err}");
}

#[tokio::test]
async fn a_stale_writer_waits_for_the_newer_one_then_fails() {
    let (pg, url) = installed().await;
    let mut newer = connect(&url).await;
    let mut stale = connect(&url).await;
    // The resource's row exists (an earlier holder wrote): the wait is on its lock.
    sell(&mut newer, 1, "first").await.unwrap();
    let newer_tx = newer.transaction().await.unwrap();
    fence::tokio_postgres::check(&newer_tx, "stock:42", token(7))
        .await
        .unwrap();
    newer_tx
        .execute("UPDATE stock SET by = 'newer' WHERE id = 42", &[])
        .await
        .unwrap();
    // The stale check reaches the row while the newer transaction holds it: it waits.
    let stale_check = tokio::spawn(async move {
        let tx = stale.transaction().await.unwrap();
        let checked = fence::tokio_postgres::check(&tx, "stock:42", token(5)).await;
        if checked.is_ok() {
            tx.execute("UPDATE stock SET by = 'stale' WHERE id = 42", &[])
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        checked
    });
    wait_for_a_lock_wait(&pg).await;
    assert!(!stale_check.is_finished());
    newer_tx.commit().await.unwrap();
    let checked = stale_check.await.unwrap();
    assert!(
        matches!(checked, Err(Error::Fenced { highest, .. }) if highest == token(7)),
        "{checked:?}"
    );
    assert_eq!(count_and_by(&pg), "99 newer");
}

#[tokio::test]
async fn a_writer_waiting_behind_the_same_token_passes_and_one_behind_a_rollback_too() {
    let (pg, url) = installed().await;
    let mut first = connect(&url).await;
    let mut second = connect(&url).await;
    // The same token: the second waits, then passes.
    let tx = first.transaction().await.unwrap();
    fence::tokio_postgres::check(&tx, "stock:42", token(7))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let r = sell(&mut second, 7, "retry").await;
        (r, second)
    });
    wait_for_a_lock_wait(&pg).await;
    tx.commit().await.unwrap();
    let (r, mut second) = waiting.await.unwrap();
    r.unwrap();
    // A newer token that rolls back was never accepted: the older one behind it passes.
    let tx = first.transaction().await.unwrap();
    fence::tokio_postgres::check(&tx, "stock:42", token(20))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move { sell(&mut second, 8, "eight").await });
    wait_for_a_lock_wait(&pg).await;
    tx.rollback().await.unwrap();
    waiting.await.unwrap().unwrap();
    assert_eq!(count_and_by(&pg), "98 eight");
    assert_eq!(
        pg.psql("SELECT token FROM fencelock_fence WHERE resource = 'stock:42'"),
        "8"
    );
}

/// Waits until a session of `pg` waits for a row lock (seen in `pg_stat_activity`).
async fn wait_for_a_lock_wait(pg: &Postgres) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting =
            pg.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'");
        if waiting != "0" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no session waited for the row lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn eight_writers_with_interleaved_tokens_commit_only_in_token_order() {
    let (pg, url) = installed().await;
    let setup = connect(&url).await;
    setup
        .batch_execute(
            "CREATE TABLE writes (seq bigserial PRIMARY KEY, token numeric NOT NULL, \
             writer int NOT NULL); \
             CREATE TABLE counter (id int PRIMARY KEY, n int NOT NULL); \
             INSERT INTO counter VALUES (1, 0);",
        )
        .await
        .unwrap();
    // Writer w uses tokens w, w + 8, w + 16, ...: every writer's tokens interleave
    // with the others', and each writer goes at its own pace.
    const WRITERS: u64 = 8;
    const ROUNDS: u64 = 25;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&url).await;
            let mut accepted = Vec::new();
            for round in 0..ROUNDS {
                let t = 1 + w + round * WRITERS;
                let tx = client.transaction().await.unwrap();
                match fence::tokio_postgres::check(&tx, "counter", token(t)).await {
                    Ok(()) => {}
                    Err(Error::Fenced { .. }) => continue, // dropped: rolled back
                    Err(e) => panic!("writer {w}: {e}"),
                }
                // Read, pause, write: a lost update would show without the check.
                let n: i32 = tx
                    .query_one("SELECT n FROM counter WHERE id = 1", &[])
                    .await
                    .unwrap()
                    .get(0);
                tokio::time::sleep(Duration::from_micros(200 * (w + 1))).await;
                tx.execute("UPDATE counter SET n = $1 WHERE id = 1", &[&(n + 1)])
                    .await
                    .unwrap();
                tx.execute(
                    "INSERT INTO writes (token, writer) VALUES ($1::text::numeric, $2)",
                    &[&t.to_string(), &(w as i32)],
                )
                .await
                .unwrap();
                tx.commit().await.unwrap();
                accepted.push(t);
            }
            accepted
        }));
    }
    let all = tokio::time::timeout(Duration::from_secs(60), futures_join(tasks))
        .await
        .expect("no deadlock: every writer finished");
    let accepted: usize = all.iter().map(Vec::len).sum();
    let tokens: Vec<u64> = pg
        .psql("SELECT token FROM writes ORDER BY seq")
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), accepted, "every accepted write is there");
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "tokens committed in order: {tokens:?}"
    );
    assert_eq!(
        pg.psql("SELECT n FROM counter"),
        accepted.to_string(),
        "no lost update among accepted writes"
    );
    assert!(accepted >= ROUNDS as usize, "{accepted} writes accepted");
    assert!(
        accepted < (WRITERS * ROUNDS) as usize,
        "some writes were refused: the tokens did interleave"
    );
}

async fn futures_join<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn the_per_row_pattern_refuses_by_updating_nothing() {
    let pg = Postgres::start();
    let url = pg.url();
    let setup = connect(&url).await;
    setup
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL, \
             fence numeric NOT NULL DEFAULT 0); INSERT INTO orders VALUES (1, 'new', 0);",
        )
        .await
        .unwrap();
    const WRITE: &str = "UPDATE orders SET state = $2, fence = $3::text::numeric \
                         WHERE id = $1 AND fence <= $3::text::numeric";
    let newer = connect(&url).await;
    assert_eq!(
        newer
            .execute(WRITE, &[&1i32, &"shipped", &"7"])
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        newer
            .execute(WRITE, &[&1i32, &"stale", &"6"])
            .await
            .unwrap(),
        0,
        "zero rows: refused"
    );
    // Concurrently: the stale update waits for the newer transaction, then finds the
    // committed fence and updates nothing.
    let mut a = connect(&url).await;
    let b = connect(&url).await;
    let tx = a.transaction().await.unwrap();
    assert_eq!(
        tx.execute(WRITE, &[&1i32, &"delivered", &"9"])
            .await
            .unwrap(),
        1
    );
    let stale =
        tokio::spawn(async move { b.execute(WRITE, &[&1i32, &"late", &"8"]).await.unwrap() });
    wait_for_a_lock_wait(&pg).await;
    tx.commit().await.unwrap();
    assert_eq!(stale.await.unwrap(), 0);
    assert_eq!(
        pg.psql("SELECT state || ' ' || fence FROM orders"),
        "delivered 9"
    );
}

#[tokio::test]
async fn bad_input_gets_one_clear_error() {
    let (pg, url) = installed().await;
    let mut client = connect(&url).await;
    let tx = client.transaction().await.unwrap();
    assert!(matches!(
        fence::tokio_postgres::check(&tx, "", token(1)).await,
        Err(Error::InvalidArgument {
            what: "resource name",
            ..
        })
    ));
    drop(tx);
    for (sql, expected) in [
        (
            "SELECT fencelock_check('r', -1)",
            "-1 is not a fencing token",
        ),
        (
            "SELECT fencelock_check('r', 1.5)",
            "1.5 is not a fencing token",
        ),
        (
            "SELECT fencelock_check('r', 18446744073709551616)",
            "18446744073709551616 is not a fencing token",
        ),
        (
            "SELECT fencelock_check('r', NULL)",
            "NULL is not a fencing token",
        ),
        (
            "SELECT fencelock_check('', 1)",
            "the resource name is empty",
        ),
        (
            "SELECT fencelock_check('r', 'abc')",
            "invalid input syntax for type numeric",
        ),
    ] {
        let err = pg.try_psql(sql).unwrap_err();
        assert!(err.contains(expected), "{sql}: {err}");
    }
    assert_eq!(pg.psql("SELECT count(*) FROM fencelock_fence"), "0");
    // The largest token is accepted.
    pg.psql("SELECT fencelock_check('r', 18446744073709551615)");
}

/// A refusal rolls its transaction back, yet it is seen: the database counts it in
/// `fencelock_refusals()` (a sequence, which the rollback does not undo), from Rust and
/// from SQL alike, and the library counts it in its metric, labelled with the store.
#[test]
fn refusals_are_counted_by_the_database_and_the_library() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (pg, url) = installed().await;
        assert_eq!(pg.psql("SELECT fencelock_refusals()"), "0");
        let mut client = connect(&url).await;
        sell(&mut client, 7, "seven").await.unwrap();
        assert!(matches!(
            sell(&mut client, 6, "six").await,
            Err(Error::Fenced { .. })
        ));
        assert_eq!(pg.psql("SELECT fencelock_refusals()"), "1");
        // From SQL, in any language: counted too.
        assert!(
            pg.try_psql("BEGIN; SELECT fencelock_check('stock:42', 5); COMMIT;")
                .is_err()
        );
        assert_eq!(pg.psql("SELECT fencelock_refusals()"), "2");
        // The setup installed again keeps the count.
        pg.psql(POSTGRES_SETUP);
        assert_eq!(pg.psql("SELECT fencelock_refusals()"), "2");
    });
    let refusals: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == fencelock::observe::FENCE_REFUSALS)
        .map(|(key, _, _, value)| {
            let labels: Vec<_> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            assert_eq!(labels, [("store".to_owned(), "postgres".to_owned())]);
            match value {
                DebugValue::Counter(n) => n,
                other => panic!("{other:?}"),
            }
        })
        .sum();
    assert_eq!(refusals, 1, "the library's check counts the one it saw");
}
