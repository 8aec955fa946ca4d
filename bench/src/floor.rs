//! The handoff floor: a bare `PUBLISH` from this process to a subscriber in another
//! process (this binary re-executed as the hidden `floor` subcommand), from just before
//! the `PUBLISH` until the subscriber has read the message, by `CLOCK_MONOTONIC` (the
//! message carries the time). Every lock handoff includes one such message, so no
//! handoff by pub/sub can be faster on this machine; a lock's handoff is reported as a
//! multiple of it. The messages go [`GAP`] apart, as the handoffs go about a hold apart.

use std::process::Stdio;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::clock::mono_ns;
use crate::latency::{Summary, summarize};

/// The pause between two messages.
const GAP: Duration = Duration::from_millis(1);
/// The channel (the subscriber's only one).
const CHANNEL: &str = "bench-floor";

/// Arguments of the hidden `floor` subcommand: the subscriber.
#[derive(clap::Args, Clone, Debug)]
pub struct FloorArgs {
    /// Redis URL.
    #[arg(long)]
    url: String,
    /// Messages to read before it prints its samples and exits.
    #[arg(long)]
    count: usize,
}

/// The subscriber: prints `ready` once subscribed, then one line `sample NS` per
/// message, and exits after `count` messages; returns the exit code.
pub fn subscriber(args: FloorArgs) -> i32 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(subscribe(args)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("floor subscriber: {e}");
            1
        }
    }
}

async fn subscribe(args: FloorArgs) -> Result<(), String> {
    let client = redis::Client::open(args.url.as_str()).map_err(|e| e.to_string())?;
    let mut pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
    pubsub.subscribe(CHANNEL).await.map_err(|e| e.to_string())?;
    println!("ready");
    let mut stream = pubsub.on_message();
    let mut samples = Vec::with_capacity(args.count);
    while samples.len() < args.count {
        let msg = stream.next().await.ok_or("the subscription ended")?;
        let now = mono_ns();
        let sent: u64 = msg
            .get_payload::<String>()
            .ok()
            .and_then(|p| p.parse().ok())
            .ok_or("a message without a time")?;
        samples.push(now.saturating_sub(sent));
    }
    for s in samples {
        println!("sample {s}");
    }
    Ok(())
}

/// The floor measured twice, `count` messages each time, around what `between` does
/// (the handoff rows), so that drift hits both alike; the percentiles of all samples.
pub(crate) async fn around<T>(
    url: &str,
    count: usize,
    between: impl std::future::Future<Output = T>,
) -> (Result<Summary, String>, T) {
    let before = measure(url, count).await;
    let out = between.await;
    let after = measure(url, count).await;
    let floor = before.and_then(|mut b| {
        b.extend(after?);
        summarize(&b).ok_or_else(|| "no samples".to_owned())
    });
    (floor, out)
}

/// Publishes `count` messages to a subscriber process on `url`; the samples (ns).
async fn measure(url: &str, count: usize) -> Result<Vec<u64>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new(exe)
        .args(["floor", "--url", url, "--count", &count.to_string()])
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("floor subscriber: {e}"))?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    match lines.next_line().await {
        Ok(Some(l)) if l == "ready" => {}
        other => return Err(format!("floor subscriber did not start: {other:?}")),
    }
    let mut conn = crate::latency::connect(url).await?;
    for _ in 0..count {
        let receivers: i64 = redis::cmd("PUBLISH")
            .arg(CHANNEL)
            .arg(mono_ns().to_string())
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("PUBLISH: {e}"))?;
        if receivers != 1 {
            return Err(format!("PUBLISH reached {receivers} subscribers, not 1"));
        }
        tokio::time::sleep(GAP).await;
    }
    let mut samples = Vec::with_capacity(count);
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        if let Some(ns) = line.strip_prefix("sample ").and_then(|n| n.parse().ok()) {
            samples.push(ns);
        }
    }
    let _ = child.wait().await;
    if samples.len() != count {
        return Err(format!("{} of {count} messages timed", samples.len()));
    }
    Ok(samples)
}
