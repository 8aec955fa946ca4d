//! fencelock's metrics for Prometheus: installs the `metrics-exporter-prometheus`
//! recorder with its HTTP listener, holds one lock under a short renewed lease and
//! takes and releases a few others every two seconds against the Redis at
//! `FENCELOCK_REDIS` (default `redis://127.0.0.1:6379`), and serves the metrics until
//! Ctrl-C.
//!
//! ```text
//! cargo run -p fencelock --example prometheus -- 127.0.0.1:9898
//! curl -s http://127.0.0.1:9898/metrics | grep fencelock_
//! ```
//!
//! Where to listen: the first argument, else `FENCELOCK_METRICS_ADDR`, else
//! `127.0.0.1:9898`; a loopback address only, since the listener has no authentication.
//! The names, units and labels are in `fencelock::observe`.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use fencelock::{Client, observe};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

const DEFAULT_LISTEN: &str = "127.0.0.1:9898";
const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379";

/// Histogram buckets of the durations, in seconds: 100 µs to 1 min.
const SECONDS: [f64; 17] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 60.0,
];

/// Histogram buckets of the renewal batch size (at most 1000 leases a batch).
const BATCH_SIZES: [f64; 5] = [1.0, 10.0, 100.0, 500.0, 1000.0];

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let listen = listen_addr()?;
    // Without buckets the exporter renders histograms as summaries; buckets aggregate
    // across instances.
    PrometheusBuilder::new()
        .with_http_listener(listen)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &SECONDS)?
        .set_buckets_for_metric(
            Matcher::Full(observe::RENEWAL_BATCH_SIZE.to_owned()),
            &BATCH_SIZES,
        )?
        .install()?;
    observe::describe();

    let url = std::env::var("FENCELOCK_REDIS").unwrap_or_else(|_| DEFAULT_REDIS.to_owned());
    // fencelock's errors name the node as host:port, never with the password.
    let client = Client::connect(&url).await?;
    // Held for the whole run under a short lease: the watchdog renews it every second,
    // so the renewal metrics move too.
    let job = client
        .lock("example:job")
        .lease(Duration::from_secs(3))
        .try_acquire()
        .await?;
    println!("serving fencelock's metrics at http://{listen}/metrics (Ctrl-C to stop)");
    println!("  curl -s http://{listen}/metrics | grep fencelock_");
    let mut rounds = 0u64;
    loop {
        round(&client).await?;
        rounds += 1;
        if rounds == 1 {
            println!("first round of locks done; one more every 2 s");
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
    job.release().await?;
    println!("{rounds} rounds");
    Ok(())
}

/// One round: an uncontended acquire and release; a try refused while the lock is
/// held; a waiter handed the lock when its holder releases; a guard dropped unreleased.
async fn round(client: &Client) -> Result<(), fencelock::Error> {
    let report = client.lock("example:report").try_acquire().await?;
    report.release().await?;

    let stock = client.lock("example:stock");
    let holder = stock.try_acquire().await?;
    match stock.try_acquire().await {
        Err(e) if e.is_contention() => {}
        Err(e) => return Err(e),
        Ok(_) => unreachable!("a second holder while the first holds it"),
    }
    let waiter = tokio::spawn(stock.clone().wait(Duration::from_secs(5)).acquire());
    tokio::time::sleep(Duration::from_millis(20)).await;
    holder.release().await?;
    let handed = waiter.await.expect("the waiting task panicked")?;
    handed.release().await?;

    // Released in the background: counted with kind="drop".
    drop(client.lock("example:dropped").try_acquire().await?);
    client.flush().await;
    Ok(())
}

/// The listen address: the first argument, else `FENCELOCK_METRICS_ADDR`, else
/// 127.0.0.1:9898; loopback only.
fn listen_addr() -> Result<SocketAddr, Box<dyn Error>> {
    let text = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("FENCELOCK_METRICS_ADDR").ok())
        .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    let addr: SocketAddr = text.parse().map_err(|e| {
        format!("listen address {text:?}: {e}; give IP:PORT, such as {DEFAULT_LISTEN}")
    })?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "listen address {addr}: the metrics listener has no authentication; give a loopback address such as {DEFAULT_LISTEN}"
        )
        .into());
    }
    Ok(addr)
}
