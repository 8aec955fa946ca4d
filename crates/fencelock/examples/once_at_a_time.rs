//! A job that must not run twice at once: the nightly report that cron starts on every
//! host. The first host to take the lock runs it; the others see it held and skip it,
//! with success, since the job is being done.
//!
//! ```text
//! FENCELOCK_REDIS=redis://127.0.0.1:6379 cargo run -p fencelock --example once_at_a_time
//! ```
//!
//! `lock(..).run(work)` waits for the release before it returns, so the lock never
//! outlives the process, whichever way `work` ends. The lease (60 s) is renewed while
//! the job runs; if it is lost anyway (Redis unreachable for the whole lease), the job
//! is cancelled and the program fails, since another host may have started it.
//! The exit status: 0 done or skipped, 1 failed, 69 Redis unreachable.
//!
//! `JOB_MS` (default 2000) is how long the stand-in job takes.

use std::process::ExitCode;
use std::time::Duration;

use fencelock::{Client, Error};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let url = std::env::var("FENCELOCK_REDIS").unwrap_or("redis://127.0.0.1:6379".into());
    let client = match Client::connect(&url).await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("nightly report: {e}");
            return ExitCode::from(69);
        }
    };
    // No `.wait(..)`: one attempt, then Error::Held.
    let outcome = client
        .lock("jobs:nightly-report")
        .lease(Duration::from_secs(60))
        .run(|token| async move { make_report(token.get()).await })
        .await;
    match outcome {
        Ok(rows) => {
            println!("nightly report: done, {rows} rows");
            ExitCode::SUCCESS
        }
        Err(Error::Held { .. }) => {
            println!("nightly report: another host is making it; skipped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nightly report: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The job: stands in for the real work, and says which fencing token it ran under
/// (a store it writes can refuse a stale one: see the fenced_postgres example).
async fn make_report(token: u64) -> u64 {
    println!("nightly report: making it under fencing token {token}");
    let ms = std::env::var("JOB_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    42
}
