//! What users on a real network see: the uncontended cycle and the 1-waiter handoff
//! again, with every client connected through testkit's [`FaultProxy`] in front of the
//! main Redis, adding [`ONE_WAY`] each way (a 0.5 ms round trip, as between two hosts in
//! one zone). The Rust clients and a PING through the same proxy take turns as in the
//! loopback latency rows; the Python and Node peers run in their drivers with their own
//! PINGs; the handoff rows are the loopback ones with the workers connected through the
//! proxy.
//!
//! [`FaultProxy`]: testkit::FaultProxy

use std::fmt::Write as _;
use std::time::Duration;

use crate::latency::{self, Cycler, RAW_RELEASE, Series, TTL};
use crate::launcher::{self, Launcher};
use crate::peers::{self, Peer};
use crate::plan::Plan;
use crate::report::{errors_cell, fmt_ns, x};
use crate::results::HandoffRow;
use crate::worker::{redlock_manager, rslock_manager};

/// Added to every chunk in each direction.
pub(crate) const ONE_WAY: Duration = Duration::from_micros(250);

/// The uncontended cycle of one client through the proxy (`Ok`), or why it failed.
pub(crate) struct Uncontended {
    pub(crate) label: String,
    pub(crate) cycles: Result<Series, String>,
    /// The PINGs it is measured against: the Rust rotation's, or its driver's own.
    pub(crate) ping: Option<Series>,
}

/// Everything the section measured.
#[derive(Default)]
pub(crate) struct Network {
    pub(crate) uncontended: Vec<Uncontended>,
    pub(crate) handoff: Vec<HandoffRow>,
    pub(crate) error: Option<String>,
}

impl Network {
    pub(crate) fn failed(&self) -> bool {
        self.error.is_some()
            || self.uncontended.iter().any(|u| u.cycles.is_err())
            || self
                .handoff
                .iter()
                .any(|r| r.error.is_some() || !r.report.errors.is_empty())
    }
}

/// Cycles per client: a tenth of the loopback rows' (each takes at least 1 ms here).
fn cycles(plan: &Plan) -> usize {
    (plan.latency_cycles / 10).max(200)
}

/// Runs the section on `server` through a proxy with [`ONE_WAY`] added each way.
pub(crate) async fn run(
    plan: &Plan,
    launch: &Launcher,
    server: &testkit::RedisServer,
    with_python: bool,
    with_node: bool,
) -> Network {
    let proxy = testkit::FaultProxy::start(&server.addr());
    proxy.set(testkit::Fault::Delay {
        base: ONE_WAY,
        jitter: Duration::ZERO,
    });
    let url = proxy.url();
    let mut net = Network::default();
    eprintln!(
        "network: uncontended, Rust clients, {} cycles each, {ONE_WAY:?} added each way",
        cycles(plan)
    );
    match rust_uncontended(&url, cycles(plan)).await {
        Ok(rows) => net.uncontended.extend(rows),
        Err(e) => net.error = Some(e),
    }
    // The Python peers in the Python driver, node-redlock in the Node driver.
    let python = (with_python, &launch.python, &launch.driver);
    let node = (with_node, &launch.node, &launch.node_driver);
    for (peer, (with, program, driver)) in [
        (Peer::RedisPy, python),
        (Peer::PythonRedisLock, python),
        (Peer::NodeRedlock, node),
    ] {
        let (true, Ok(program)) = (with, program) else {
            continue;
        };
        eprintln!("network: uncontended, {}", peer.label());
        let urls = std::slice::from_ref(&url);
        let r = latency::in_driver(program, driver, urls, peer, cycles(plan), |_| {
            (crate::affinity::Pins::default(), String::new())
        })
        .await;
        net.uncontended.push(match r {
            Ok((run, _)) => Uncontended {
                label: peer.label().to_owned(),
                cycles: Ok(run.cycles),
                ping: Some(run.pings),
            },
            Err(e) => Uncontended {
                label: peer.label().to_owned(),
                cycles: Err(e),
                ping: None,
            },
        });
    }
    for peer in peers::peers(with_python, with_node) {
        let duration = if peer.slow() {
            plan.slow_run
        } else {
            plan.handoff_run
        };
        eprintln!(
            "network: handoff, {} with 1 waiter, {duration:?}",
            peer.label()
        );
        let name = format!("network-handoff-{}", peer.slug());
        let row = launcher::handoff_row_at(launch, server, &url, peer, name, 1, duration).await;
        net.handoff.push(row);
    }
    drop(proxy);
    net
}

/// fencelock, rslock, the redlock crate, redis-rs alone and a PING, in turns, through
/// `url`.
async fn rust_uncontended(url: &str, cycles: usize) -> Result<Vec<Uncontended>, String> {
    let urls = [url.to_owned()];
    let fence = fencelock::Client::connect(url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = "bench-network";
    let mut clients: Vec<(&str, Cycler)> = vec![
        ("PING", Cycler::Ping(latency::connect(url).await?)),
        (
            "fencelock",
            Cycler::Fence(fence.lock(name).lease(TTL).renew(false)),
        ),
        (
            "rslock",
            Cycler::Rslock(rslock_manager(&urls, false), format!("{name}:rslock")),
        ),
        (
            "redlock",
            Cycler::Redlock(redlock_manager(&urls, false)?, format!("{name}:redlock")),
        ),
        (
            "redis-rs alone",
            Cycler::Raw(
                latency::connect(url).await?,
                redis::Script::new(RAW_RELEASE),
                format!("{name}:raw"),
            ),
        ),
    ];
    let (_, samples) = latency::in_turns(&mut clients, cycles).await?;
    fence.flush().await;
    let mut series = Vec::new();
    for ((label, _), s) in clients.iter().zip(samples) {
        series.push((label.to_string(), Series::new(s)?));
    }
    let ping = series.remove(0).1;
    Ok(series
        .into_iter()
        .map(|(label, s)| Uncontended {
            label,
            cycles: Ok(s),
            ping: Some(Series {
                samples: ping.samples.clone(),
                summary: ping.summary,
            }),
        })
        .collect())
}

/// The section "On a network".
pub(crate) fn render(s: &mut String, net: &Network, plan: &Plan) {
    let _ = writeln!(s, "## On a network: a 0.5 ms round trip\n");
    let _ = writeln!(
        s,
        "Every client connected through testkit's `FaultProxy` in front of the main Redis, \
         which forwards each chunk {ONE_WAY:?} after reading it, in both directions (a \
         0.5 ms round trip, as between two hosts in one zone). Uncontended: {} acquire + \
         release cycles per client; the Rust clients take turns with a PING through the \
         same proxy, the Python and Node peers with their drivers' own PINGs. Handoff: the \
         1-waiter handoff rows again, the workers connected through the proxy. × PING: \
         p50 over the PING p50 through the proxy; × fencelock: over fencelock's p50 in \
         this section.\n",
        cycles(plan)
    );
    if let Some(e) = &net.error {
        let _ = writeln!(s, "Rust clients not measured: {e}\n");
    }
    let fence = net
        .uncontended
        .iter()
        .find(|u| u.label == "fencelock")
        .and_then(|u| u.cycles.as_ref().ok())
        .map(|c| c.summary.p50);
    let _ = writeln!(
        s,
        "| uncontended | p50 | p99 | PING p50 | × PING | × fencelock |\n|---|---|---|---|---|---|"
    );
    for u in &net.uncontended {
        match &u.cycles {
            Ok(c) => {
                let ping = u.ping.as_ref().map(|p| p.summary.p50);
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} |",
                    u.label,
                    fmt_ns(c.summary.p50),
                    fmt_ns(c.summary.p99),
                    ping.map_or("–".into(), fmt_ns),
                    ping.map_or("–".into(), |p| x(c.summary.p50 as f64 / p as f64)),
                    fence.map_or("–".into(), |f| x(c.summary.p50 as f64 / f as f64)),
                );
            }
            Err(e) => {
                let _ = writeln!(s, "| {} | – ({e}) | – | – | – | – |", u.label);
            }
        }
    }
    let _ = writeln!(s);
    let ping = net
        .uncontended
        .iter()
        .find(|u| u.label == "fencelock")
        .and_then(|u| u.ping.as_ref())
        .map(|p| p.summary.p50);
    let fence_hand = net
        .handoff
        .iter()
        .find(|r| r.peer == Peer::Fencelock)
        .and_then(|r| r.summary)
        .map(|s| s.p50);
    let _ = writeln!(
        s,
        "| handoff, 1 waiter | samples | p50 | p99 | × PING | × fencelock | errors |\n|---|---|---|---|---|---|---|"
    );
    for r in &net.handoff {
        let errors = errors_cell(&r.report.errors, r.error.as_deref());
        match r.summary {
            Some(sum) => {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {errors} |",
                    r.peer.label(),
                    sum.n,
                    fmt_ns(sum.p50),
                    fmt_ns(sum.p99),
                    ping.map_or("–".into(), |p| x(sum.p50 as f64 / p as f64)),
                    fence_hand.map_or("–".into(), |f| x(sum.p50 as f64 / f as f64)),
                );
            }
            None => {
                let _ = writeln!(s, "| {} | 0 | – | – | – | – | {errors} |", r.peer.label());
            }
        }
    }
    let _ = writeln!(s);
}
