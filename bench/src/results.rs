//! What a run measured: the rows of the contended scenarios (handoff, hot key, and the
//! semaphores' throughput and handoff) and everything together, for the report and the
//! charts.

use std::time::Duration;

use crate::fencing::Fencing;
use crate::growth::Growth;
use crate::held::HeldRun;
use crate::latency::{DriverRun, LatencyRun, NodeLatency, Summary};
use crate::peers::Peer;
use crate::plan::{HOT_KEY_CONTENDERS, Plan};
use crate::semaphores::Semaphores;
use crate::spawn::Report;
use crate::topologies::Topologies;

/// One handoff row (of a lock, or of a semaphore: the semaphores' section).
pub(crate) struct HandoffRow {
    pub(crate) peer: Peer,
    pub(crate) waiters: usize,
    pub(crate) tasks: Vec<usize>,
    pub(crate) summary: Option<Summary>,
    pub(crate) report: Report,
    /// Commands Redis processed per second over the row (`INFO stats`).
    pub(crate) commands_per_s: Option<f64>,
    pub(crate) error: Option<String>,
}

/// One hot-key row (of a lock, or a semaphore's throughput row).
pub(crate) struct HotKeyRow {
    pub(crate) peer: Peer,
    pub(crate) tasks: Vec<usize>,
    pub(crate) report: Report,
    pub(crate) duration: Duration,
    /// Commands Redis processed per second over the run (`INFO stats`).
    pub(crate) commands_per_s: Option<f64>,
    pub(crate) error: Option<String>,
}

impl HotKeyRow {
    /// Whether every contender reported.
    pub(crate) fn complete(&self) -> bool {
        self.report.counts.len() == HOT_KEY_CONTENDERS
    }

    /// min/max acquisitions per contender (0 when incomplete or none).
    pub(crate) fn fairness(&self) -> f64 {
        let counts = &self.report.counts;
        let min = counts.iter().min().copied().unwrap_or(0);
        let max = counts.iter().max().copied().unwrap_or(0);
        if max > 0 && self.complete() {
            min as f64 / max as f64
        } else {
            0.0
        }
    }

    /// Acquisitions per second, all contenders.
    pub(crate) fn per_second(&self) -> f64 {
        self.report.counts.iter().sum::<u64>() as f64 / self.duration.as_secs_f64()
    }
}

/// Everything one run measured, for the report and the charts.
pub(crate) struct Results {
    pub(crate) plan: &'static Plan,
    pub(crate) nproc: usize,
    pub(crate) cpu: String,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
    pub(crate) redis_version: String,
    /// The Python interpreter's version, or why the Python peers were left out.
    pub(crate) python: Result<String, String>,
    /// The versions of Node, redlock and ioredis, or why node-redlock was left out.
    pub(crate) node: Result<String, String>,
    pub(crate) ping: Summary,
    pub(crate) ping_after: Option<Summary>,
    pub(crate) latency: Result<LatencyRun, String>,
    /// Per Python peer: its cycles and the driver's redis-py PINGs.
    pub(crate) python_latency: Vec<(Peer, Result<DriverRun, String>)>,
    pub(crate) python_placement: Option<String>,
    /// node-redlock's single-node and Redlock cycles (`None` without Node).
    pub(crate) node_latency: Option<NodeLatency>,
    pub(crate) handoff: Vec<HandoffRow>,
    pub(crate) hot_key: Vec<HotKeyRow>,
    /// fencelock's semaphore and redis-semaphore's: throughput and handoff.
    pub(crate) semaphores: Semaphores,
    /// Many independent locks through one client.
    pub(crate) many: crate::many::Many,
    /// Several locks at once against the same locks taken in turn.
    pub(crate) multi: crate::multi::Multi,
    /// Election takeover after a kill, against a plain lock's waiter.
    pub(crate) election: crate::election::Takeover,
    /// The uncontended and handoff rows through a 0.5 ms round trip.
    pub(crate) network: crate::network::Network,
    /// Around fencelock's handoff rows, to a subscriber in another process: a bare
    /// PUBLISH (the floor of any handoff by pub/sub), and a release-shaped round trip
    /// (an EVALSHA that deletes a key and publishes: what the handoff targets are
    /// against).
    pub(crate) floor: crate::floor::Floors,
    /// What fencing costs at the resource: PostgreSQL and Redis, fenced and not.
    pub(crate) fencing: Fencing,
    pub(crate) held: Result<HeldRun, String>,
    /// How cost grows: held leases by size, handoff by waiters.
    pub(crate) growth: Growth,
    /// Sentinel and Cluster.
    pub(crate) topologies: Topologies,
    pub(crate) elapsed: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::spread;

    fn hot_key(counts: Vec<u64>) -> HotKeyRow {
        HotKeyRow {
            peer: Peer::Fencelock,
            tasks: spread(HOT_KEY_CONTENDERS),
            report: Report {
                counts,
                ..Report::default()
            },
            duration: Duration::from_secs(2),
            commands_per_s: None,
            error: None,
        }
    }

    #[test]
    fn fairness_is_min_over_max_of_every_contender() {
        let mut counts = vec![10; HOT_KEY_CONTENDERS];
        counts[3] = 5;
        let row = hot_key(counts);
        assert!((row.fairness() - 0.5).abs() < 1e-9);
        assert!((row.per_second() - (10.0 * 63.0 + 5.0) / 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_missing_contender_makes_fairness_zero() {
        // A worker that did not report must not hide a starved contender.
        assert_eq!(hot_key(vec![10; HOT_KEY_CONTENDERS - 1]).fairness(), 0.0);
        assert_eq!(hot_key(Vec::new()).fairness(), 0.0);
    }
}
