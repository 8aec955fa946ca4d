//! At most 3 calls at once to a slow API, across every process that uses it: each call
//! holds one of the 3 permits of the semaphore `api:geocoder`, waiting up to 10 s for
//! one. Run it in several terminals at once: together they still make at most 3 calls
//! at a time.
//!
//! ```text
//! FENCELOCK_REDIS=redis://127.0.0.1:6379 cargo run -p fencelock --example api_limit
//! ```
//!
//! `CALLS` (default 10) is how many calls this process makes, all at once; `CALL_MS`
//! (default 200) how long the stand-in API takes. The program counts the calls in
//! flight across processes in Redis (`example:api:geocoder:in-flight`) only to show the
//! limit holding; the permits are what enforce it.

use std::time::Duration;

use fencelock::Client;

/// The API's limit.
const PERMITS: u32 = 3;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("FENCELOCK_REDIS").unwrap_or("redis://127.0.0.1:6379".into());
    let calls: usize = env_number("CALLS", 10);
    let call_time = Duration::from_millis(env_number("CALL_MS", 200));
    let client = Client::connect(&url).await?;
    let counter = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut tasks = Vec::new();
    for call in 0..calls {
        let (client, mut counter) = (client.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            client
                .semaphore("api:geocoder", PERMITS)
                .wait(Duration::from_secs(10))
                .run(|_token| async move {
                    let in_flight: u32 = redis::cmd("INCR")
                        .arg("example:api:geocoder:in-flight")
                        .query_async(&mut counter)
                        .await
                        .unwrap_or(0);
                    tokio::time::sleep(call_time).await; // the slow API
                    let _: Result<i64, _> = redis::cmd("DECR")
                        .arg("example:api:geocoder:in-flight")
                        .query_async(&mut counter)
                        .await;
                    println!("call {call}: done ({in_flight} in flight at its start)");
                    in_flight
                })
                .await
        }));
    }
    let mut most = 0;
    for task in tasks {
        most = most.max(task.await??);
    }
    println!("{calls} calls made, at most {most} in flight at once (limit {PERMITS})");
    Ok(())
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
