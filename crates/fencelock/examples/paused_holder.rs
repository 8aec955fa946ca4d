//! A lock holder that is paused past its lease, and why the resource must check the
//! fencing token (the pause story that `scripts/demo` tells).
//!
//! The holder takes the lock `stock:42` with a short lease, reads the stock from
//! PostgreSQL in a transaction, prints its fencing token and what it read, and waits for
//! a line on stdin. Stop it there (`kill -STOP PID`, as a GC pause or swap would): its
//! lease runs out, and another holder takes the lock and sells one. Then send the line
//! and resume it (`kill -CONT PID`): it writes back what it read minus one, with its old
//! token. With `--check` (the default), `fencelock_check` in the same transaction
//! refuses that write ([`Error::Fenced`], exit status 76, as `fencelock write`'s);
//! with `--no-check` the stale write lands and the other holder's sale is lost.
//!
//! ```text
//! fencelock sql | psql "$DATABASE_URL"    # once per database: fencelock_check
//! psql "$DATABASE_URL" -c 'CREATE TABLE stock (id int PRIMARY KEY, count int)' \
//!                      -c 'INSERT INTO stock VALUES (42, 10)'
//! cargo run -p fencelock --features tokio-postgres --example paused_holder -- --check
//! ^Z                                      # the pause: a second later the lease is gone
//! fencelock run stock:42 -- sh sell-one.sh   # B sells one (the guide's fencing chapter, "From any language")
//! fg                                      # then Enter: A writes with its old token
//! ```
//!
//! The lock's Redis is `FENCELOCK_REDIS` (default `redis://127.0.0.1:6379`), the
//! database `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`).

use std::process::ExitCode;
use std::time::Duration;

use fencelock::{Client, Error, fence};
use tokio_postgres::NoTls;

/// The lock, and the resource it guards: named alike, so the resource's fence compares
/// the tokens of this one lock name.
const RESOURCE: &str = "stock:42";
/// The exit status when the resource refused the token.
const REFUSED: u8 = 76;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let check = match std::env::args().nth(1).as_deref() {
        None | Some("--check") => true,
        Some("--no-check") => false,
        Some(other) => return Err(format!("{other:?}: give --check or --no-check").into()),
    };
    let redis_url = env_or("FENCELOCK_REDIS", "redis://127.0.0.1:6379");
    let db_url = env_or(
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
    );

    let locks = Client::connect(&redis_url).await?;
    let (mut db, connection) = tokio_postgres::connect(&db_url, NoTls).await?;
    // tokio-postgres does the talking in this task; `db` is a handle to it.
    tokio::spawn(async move {
        match connection.await {
            Ok(()) => {}
            Err(e) => match e.as_db_error() {
                Some(said) => eprintln!("PostgreSQL ended the connection: {said}"),
                None => eprintln!("PostgreSQL connection: {e}"),
            },
        }
    });

    // A 1 s lease, renewed every third of it while this process runs: it ends only if
    // the process stops running for about a second.
    let guard = locks
        .lock(RESOURCE)
        .lease(Duration::from_secs(1))
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    let token = guard.fencing_token();

    // A read-modify-write, in one transaction. The check comes later, just before the
    // write: checking here would lock the resource's fence row until this transaction
    // ends, and the next holder's check would wait for this one.
    let tx = db.transaction().await?;
    let count: i32 = tx
        .query_one("SELECT count FROM stock WHERE id = 42", &[])
        .await?
        .get(0);
    println!("A holds {RESOURCE} with fencing token {token}, read stock {count}");

    // The pause comes here. The line is awaited on a blocking thread so that the runtime,
    // and with it the watchdog that renews the lease, keeps running: only stopping the
    // whole process lets the lease run out.
    tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new())).await??;

    // Resumed, A does not know its lease ended. Looking at `guard.lost()` first would
    // not make this safe: the pause could as well fall between that look and the write.
    // Only the resource, which sees the writes in order, can refuse a stale one.
    //
    // In READ COMMITTED (the default isolation) the check sees what was committed
    // during the pause: the newer holder's token.
    let checked = if check {
        fence::tokio_postgres::check(&tx, guard.name(), token).await
    } else {
        Ok(())
    };
    let status = match checked {
        Ok(()) => {
            tx.execute("UPDATE stock SET count = $1 WHERE id = 42", &[&(count - 1)])
                .await?;
            tx.commit().await?;
            println!("A wrote stock {} with fencing token {token}", count - 1);
            ExitCode::SUCCESS
        }
        // Nothing was written, and dropping `tx` rolls the transaction back.
        Err(e @ Error::Fenced { .. }) => {
            println!("A was refused: {e}");
            ExitCode::from(REFUSED)
        }
        Err(e) => return Err(e.into()),
    };

    // The lock tells A of the lost lease only now, too late to stop a write.
    match guard.release().await {
        Ok(()) => {}
        Err(Error::LeaseLost { cause, .. }) => {
            println!("A's release: its lease had ended ({cause})")
        }
        Err(e) => return Err(e.into()),
    }
    Ok(status)
}

/// The environment variable `name`, else `default`.
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}
