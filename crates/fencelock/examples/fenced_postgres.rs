//! A write to PostgreSQL that the database itself fences: under the lock `stock:42`,
//! the transaction first calls `fencelock_check('stock:42', token)`, which refuses a
//! token lower than one it has accepted, so a holder whose lease ran out during a pause
//! cannot overwrite the next holder's work. (The pause itself is played by the
//! paused_holder example and `scripts/demo`.)
//!
//! ```text
//! FENCELOCK_REDIS=redis://127.0.0.1:6379 DATABASE_URL=postgres://postgres@127.0.0.1/postgres \
//!     cargo run -p fencelock --features tokio-postgres --example fenced_postgres
//! ```
//!
//! It installs the check (`fencelock sql` prints the same SQL) and a `stock` table if
//! missing, sells one item, and prints the count left.

use fencelock::{Client, fence};
use tokio_postgres::NoTls;

/// The lock and the resource it guards share one name.
const RESOURCE: &str = "stock:42";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url = std::env::var("FENCELOCK_REDIS").unwrap_or("redis://127.0.0.1:6379".into());
    let db_url = std::env::var("DATABASE_URL")
        .unwrap_or("postgres://postgres@127.0.0.1:5432/postgres".into());
    let (mut db, connection) = tokio_postgres::connect(&db_url, NoTls).await?;
    tokio::spawn(connection);
    fence::tokio_postgres::install(&db).await?;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS stock (id int PRIMARY KEY, count int NOT NULL);
         INSERT INTO stock VALUES (42, 10) ON CONFLICT DO NOTHING;",
    )
    .await?;

    let client = Client::connect(&redis_url).await?;
    let guard = client.lock(RESOURCE).acquire().await?;
    let tx = db.transaction().await?;
    // Before any write: Error::Fenced if a later holder's token was accepted.
    fence::tokio_postgres::check(&tx, RESOURCE, guard.fencing_token()).await?;
    let row = tx
        .query_opt(
            "UPDATE stock SET count = count - 1 WHERE id = 42 AND count > 0 RETURNING count",
            &[],
        )
        .await?;
    tx.commit().await?;
    match row {
        Some(row) => println!(
            "sold one under fencing token {}; {} left",
            guard.fencing_token(),
            row.get::<_, i32>(0)
        ),
        None => println!("sold out"),
    }
    guard.release().await?;
    Ok(())
}
