//! A program without async (a CLI, a build step, a sync web handler): the blocking API
//! takes the lock, the work runs on the caller's thread while the client's own runtime
//! renews the lease, and the guard, dropped at the end of its scope, releases the lock
//! before the program goes on.
//!
//! ```text
//! FENCELOCK_REDIS=redis://127.0.0.1:6379 cargo run -p fencelock --features blocking --example blocking
//! ```
//!
//! Two started at once take turns: the second waits (up to 10 s) for the first's
//! release. `WORK_MS` (default 300) is how long the stand-in work takes.

use std::time::Duration;

use fencelock::blocking::Client;

fn main() -> Result<(), fencelock::Error> {
    let url = std::env::var("FENCELOCK_REDIS").unwrap_or("redis://127.0.0.1:6379".into());
    let work_ms = std::env::var("WORK_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let client = Client::connect(&url)?;
    {
        let guard = client
            .lock("reports:daily")
            .wait(Duration::from_secs(10))
            .acquire()?;
        println!(
            "writing the daily report under fencing token {}",
            guard.fencing_token()
        );
        std::thread::sleep(Duration::from_millis(work_ms)); // the work, renewed meanwhile
        if let Some(cause) = guard.loss_cause() {
            eprintln!("lease lost ({cause}): the report may overlap another's");
        }
    } // released here, and the release waited for
    println!("done");
    Ok(())
}
