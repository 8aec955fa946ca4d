//! The handoff floors: a message from this process to a subscriber in another process
//! (this binary re-executed as the hidden `floor` subcommand), from just before it is
//! sent until the subscriber has read it, by `CLOCK_MONOTONIC` (the message carries the
//! time). Two shapes: a bare `PUBLISH`, the floor of any handoff by pub/sub on this
//! machine; and a release-shaped round trip, one `EVALSHA` of a script that deletes a
//! key and publishes (what a lock's release does at the least), which the handoff
//! targets are measured against. The messages go [`GAP`] apart, as the handoffs go
//! about a hold apart.

use std::process::Stdio;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::clock::mono_ns;
use crate::latency::{Summary, summarize};
use crate::report::{fmt_ns, x};
use crate::results::HandoffRow;

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

/// The release-shaped floor's script: a release's delete and announcement, nothing
/// else.
const RELEASE_SHAPED: &str =
    "redis.call('DEL', KEYS[1]) return redis.call('PUBLISH', ARGV[1], ARGV[2])";
/// The key it deletes (set again before each message, outside the time taken).
const KEY: &str = "bench-floor-key";

/// How the message is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// `PUBLISH`.
    Publish,
    /// `EVALSHA` of [`RELEASE_SHAPED`].
    Release,
}

/// Both floors, measured in the same run.
pub(crate) struct Floors {
    /// A bare `PUBLISH`: the reference.
    pub(crate) publish: Result<Summary, String>,
    /// One `EVALSHA` of a script that deletes a key and publishes: what the handoff
    /// targets are against.
    pub(crate) release: Result<Summary, String>,
}

/// Each floor measured twice, `count` messages each time, around what `between` does
/// (the handoff rows), so that drift hits both alike; the percentiles of all samples.
pub(crate) async fn around<T>(
    url: &str,
    count: usize,
    between: impl std::future::Future<Output = T>,
) -> (Floors, T) {
    let before = (
        measure(url, count, Shape::Publish).await,
        measure(url, count, Shape::Release).await,
    );
    let out = between.await;
    let after = (
        measure(url, count, Shape::Publish).await,
        measure(url, count, Shape::Release).await,
    );
    let both = |before: Result<Vec<u64>, String>, after: Result<Vec<u64>, String>| {
        before.and_then(|mut b| {
            b.extend(after?);
            summarize(&b).ok_or_else(|| "no samples".to_owned())
        })
    };
    let floors = Floors {
        publish: both(before.0, after.0),
        release: both(before.1, after.1),
    };
    (floors, out)
}

/// Sends `count` messages in `shape` to a subscriber process on `url`; the samples (ns).
async fn measure(url: &str, count: usize, shape: Shape) -> Result<Vec<u64>, String> {
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
    let script = redis::Script::new(RELEASE_SHAPED);
    if shape == Shape::Release {
        // Loaded before the first message, as a lock's scripts are.
        let _: i64 = script
            .key(KEY)
            .arg("bench-floor-warm-up")
            .arg("0")
            .invoke_async(&mut conn)
            .await
            .map_err(|e| format!("the release-shaped script: {e}"))?;
    }
    for _ in 0..count {
        let receivers: i64 = match shape {
            Shape::Publish => redis::cmd("PUBLISH")
                .arg(CHANNEL)
                .arg(mono_ns().to_string())
                .query_async(&mut conn)
                .await
                .map_err(|e| format!("PUBLISH: {e}"))?,
            Shape::Release => {
                let _: () = redis::cmd("SET")
                    .arg(KEY)
                    .arg("held")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| format!("SET: {e}"))?;
                script
                    .key(KEY)
                    .arg(CHANNEL)
                    .arg(mono_ns().to_string())
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| format!("the release-shaped script: {e}"))?
            }
        };
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

/// `--only handoff`'s section: each row's p50 against both floors.
pub(crate) fn render(s: &mut String, floors: &Floors, rows: &[HandoffRow]) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "## Handoff against its floors\n");
    for (what, floor) in [
        ("a bare `PUBLISH`", &floors.publish),
        (
            "release-shaped: an `EVALSHA` that deletes a key and publishes",
            &floors.release,
        ),
    ] {
        match floor {
            Ok(f) => {
                let _ = writeln!(
                    s,
                    "- floor, {what}: p50 {}, p99 {}, max {}",
                    fmt_ns(f.p50),
                    fmt_ns(f.p99),
                    fmt_ns(f.max)
                );
            }
            Err(e) => {
                let _ = writeln!(s, "- floor, {what}: not measured: {e}");
            }
        }
    }
    let _ = writeln!(
        s,
        "\n| | waiters | handoff p50 | over the release-shaped floor | over a bare PUBLISH |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|");
    for row in rows {
        let Some(p50) = row.summary.as_ref().map(|h| h.p50) else {
            let error = row.error.as_deref().unwrap_or("no samples");
            let _ = writeln!(
                s,
                "| {} | {} | {error} | | |",
                row.peer.label(),
                row.waiters
            );
            continue;
        };
        let over = |f: &Result<Summary, String>| {
            f.as_ref()
                .map_or("–".into(), |f| x(p50 as f64 / f.p50 as f64))
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            row.peer.label(),
            row.waiters,
            fmt_ns(p50),
            over(&floors.release),
            over(&floors.publish)
        );
    }
    let _ = writeln!(s);
}
