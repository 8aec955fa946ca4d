//! Redlock: one lock over N independent Redis masters (N odd, at least 3).
//!
//! Every operation goes to all nodes at once, each with its own short timeout, and
//! counts the answers. An acquire succeeds only with a majority *and* time left:
//! validity = TTL − elapsed − drift, elapsed measured on the monotonic clock from before
//! the first send, drift = 1% of the TTL + 2 ms. A failed acquire is released on every
//! node, including those that seemed to fail (their reply may have been lost, not their
//! write).
//!
//! Restart protection: each node says, inside the acquire script, its `run_id` and
//! uptime. A node that came back less than the quarantine ago (the largest lease in use,
//! at least the configured one) may have lost keys it held, so its grant does not count
//! until the quarantine has passed — the "delayed restart" rule, enforced by the client.
//!
//! Fencing: each node's counter is kept at or above its clock in microseconds and
//! increases with each grant there; the grant carries the highest token among the
//! granting nodes, and release raises every node's counter to it. So tokens increase
//! across holders while any majority keeps its counters, and across a wipe of a
//! majority as long as the nodes' clocks agree better than the time between two grants.

use std::time::{Duration, Instant};

use futures_util::future::join_all;

use crate::algorithms::single_node::{Attempt, lease_end};
use crate::backend::Node;
use crate::error::{Blocker, Error, LossCause, NodeOutcome, NodeReport};
use crate::keys::LockKeys;
use crate::scripts::{self, AcquireReply, OwnedReply, QuorumReply};
use crate::token::{FencingToken, HolderToken};

/// Redlock settings of a client.
#[derive(Clone, Debug)]
pub(crate) struct Quorum {
    /// Per-node timeout; `None`: a twentieth of the TTL, between 5 ms and the response
    /// timeout.
    pub node_timeout: Option<Duration>,
    /// Restart protection: the shortest quarantine; `None`: off.
    pub quarantine: Option<Duration>,
    pub response_timeout: Duration,
}

impl Quorum {
    pub fn majority(n: usize) -> usize {
        n / 2 + 1
    }

    pub fn node_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / 20).clamp(Duration::from_millis(5), self.response_timeout))
    }
}

/// The outcome of one quorum attempt.
pub(crate) enum QuorumAttempt {
    Granted(Attempt),
    /// No quorum; everything written was released again. `held`: what frees up soonest
    /// of what the nodes that said held reported, if any did.
    Failed {
        held: Option<Blocker>,
        report: Vec<NodeReport>,
    },
}

/// One acquire attempt on every node.
pub(crate) async fn try_acquire(
    nodes: &[Node],
    config: &Quorum,
    keys: &LockKeys,
    token: &HolderToken,
    ttl: Duration,
) -> Result<QuorumAttempt, Error> {
    let within = config.node_timeout(ttl);
    let sent_at = Instant::now();
    // A node reports who it is when restart protection needs it, and always until its
    // identity is known (it was down when the client connected): two nodes that are one
    // server must not vote twice.
    let identified = scripts::quorum_acquire(keys, token, ttl, true);
    let anonymous = scripts::quorum_acquire(keys, token, ttl, false);
    let answers: Vec<Result<QuorumReply, Error>> = join_all(nodes.iter().map(|n| {
        let identify = config.quarantine.is_some() || n.health().run_id.is_none();
        n.run_within(within, if identify { &identified } else { &anonymous })
    }))
    .await;
    let now = Instant::now();
    let mut granted = 0;
    let mut fence = 0u64;
    let mut held: Option<Blocker> = None;
    let mut report = Vec::with_capacity(nodes.len());
    for (i, (node, answer)) in nodes.iter().zip(answers).enumerate() {
        let outcome = match answer {
            Ok(QuorumReply { reply, identity }) => {
                let mut quarantined = None;
                if let Some((run_id, up)) = &identity {
                    let restarted = node.health().observe(run_id);
                    let up = Duration::from_secs(*up);
                    quarantined = quarantine_left(node, config, ttl, restarted, up, now);
                }
                // Nodes answer in index order here, so an earlier name of the same
                // server has already recorded what it just said.
                let known = node.health().run_id.clone();
                let same_as = known.and_then(|id| same_server(nodes, i, &id));
                match (reply, quarantined) {
                    (AcquireReply::Acquired { .. }, _) if same_as.is_some() => {
                        let other = same_as.map_or("", |j| nodes[j].addr());
                        tracing::error!(
                            node = node.addr(),
                            other,
                            "two Redlock nodes are one Redis server; its second vote is refused"
                        );
                        NodeOutcome::Refused(format!(
                            "the same Redis server as {other} (one run id): it votes once"
                        ))
                    }
                    (AcquireReply::Acquired { .. }, Some(left)) => {
                        NodeOutcome::Quarantined { remaining: left }
                    }
                    (AcquireReply::Acquired { fence: f, .. }, None) => {
                        granted += 1;
                        fence = fence.max(f.get());
                        NodeOutcome::Granted
                    }
                    (AcquireReply::Held { blocked_by }, _) => {
                        held = Some(held.map_or(blocked_by, |h| h.sooner(blocked_by)));
                        NodeOutcome::Held { blocked_by }
                    }
                    (AcquireReply::WrongType { key, found }, _) => {
                        return Err(Error::WrongType {
                            node: node.addr().to_owned(),
                            key,
                            found,
                        });
                    }
                }
            }
            Err(Error::Unavailable { reason, .. }) => NodeOutcome::Unavailable(reason),
            Err(e) => NodeOutcome::Refused(e.to_string()),
        };
        report.push(NodeReport {
            node: node.addr().to_owned(),
            outcome,
        });
    }
    let valid_until = lease_end(sent_at, ttl);
    if granted >= Quorum::majority(nodes.len()) && valid_until > now {
        return Ok(QuorumAttempt::Granted(Attempt::Acquired {
            fence: FencingToken::new(fence),
            sent_at,
            valid_until,
        }));
    }
    // No quorum, or no time left: take back what was written, everywhere. A node that
    // does not answer in time still gets the release: it is queued on its connection
    // behind the acquire, so it runs after a late acquire there.
    let invocation = scripts::quorum_release(keys, token, 0);
    let _: Vec<Result<OwnedReply, Error>> =
        join_all(nodes.iter().map(|n| n.run_within(within, &invocation))).await;
    Ok(QuorumAttempt::Failed { held, report })
}

/// The first node other than `nodes[i]` known to be the server with `run_id`, if any
/// comes before it (so the first of several names of one server keeps its vote).
pub(crate) fn same_server(nodes: &[Node], i: usize, run_id: &str) -> Option<usize> {
    nodes[..i]
        .iter()
        .position(|n| n.health().run_id.as_deref() == Some(run_id))
}

/// Whether `nodes[i]` votes: false for a second name of a server that an earlier node
/// already is (found out after the client connected).
pub(crate) fn votes(nodes: &[Node], i: usize) -> bool {
    let known = nodes[i].health().run_id.clone();
    known.is_none_or(|id| same_server(nodes, i, &id).is_none())
}

/// How long `node` stays quarantined, given what it just said about itself (`restarted`:
/// its run id changed since it was last seen).
fn quarantine_left(
    node: &Node,
    config: &Quorum,
    ttl: Duration,
    restarted: bool,
    uptime: Duration,
    now: Instant,
) -> Option<Duration> {
    let floor = config.quarantine?;
    let quarantine = floor.max(ttl);
    let mut health = node.health();
    // Uptime counts whole seconds: round the restart moment down, to be safe.
    let up_since = now.checked_sub(uptime).unwrap_or(now);
    if uptime < quarantine || restarted {
        let until = up_since + quarantine + Duration::from_secs(1);
        health.quarantined_until = Some(health.quarantined_until.map_or(until, |u| u.max(until)));
    }
    health
        .quarantined_until
        .and_then(|until| until.checked_duration_since(now))
        .filter(|left| !left.is_zero())
}

/// Releases `token` on every node, raising each counter to `fence`; returns what each
/// node said. Each node gets the node timeout of a `ttl` lease, as an acquire does: a
/// node that does not answer in time keeps the key at most until it expires, so
/// nothing needs to wait for it (the request stays queued on its connection).
pub(crate) async fn release_everywhere(
    nodes: &[Node],
    config: &Quorum,
    ttl: Duration,
    keys: &LockKeys,
    token: &HolderToken,
    fence: u64,
) -> Vec<Result<OwnedReply, Error>> {
    let within = config.node_timeout(ttl);
    let invocation = scripts::quorum_release(keys, token, fence);
    join_all(nodes.iter().map(|n| n.run_within(within, &invocation))).await
}

/// Releases a held grant: Ok if any node still held it; `LeaseLost` if none did.
pub(crate) async fn release(
    nodes: &[Node],
    config: &Quorum,
    ttl: Duration,
    name: &str,
    keys: &LockKeys,
    token: &HolderToken,
    fence: FencingToken,
) -> Result<(), Error> {
    let answers = release_everywhere(nodes, config, ttl, keys, token, fence.get()).await;
    summarize(nodes, name, answers, |released| released > 0)
}

/// Extends the lease on every node; Ok with the new end only if a majority confirmed
/// within the validity.
pub(crate) async fn extend(
    nodes: &[Node],
    config: &Quorum,
    name: &str,
    keys: &LockKeys,
    token: &HolderToken,
    ttl: Duration,
) -> Result<(Instant, Instant), Error> {
    let within = config.node_timeout(ttl);
    let sent_at = Instant::now();
    let invocation = scripts::renew(std::iter::once((keys.lock.as_str(), token.as_str(), ttl)));
    let answers: Vec<Result<Vec<i64>, Error>> =
        join_all(nodes.iter().map(|n| n.run_within(within, &invocation))).await;
    let answers = answers
        .into_iter()
        .map(|a| {
            a.map(|codes| {
                codes
                    .first()
                    .copied()
                    .and_then(OwnedReply::from_code)
                    .unwrap_or(OwnedReply::WrongType)
            })
        })
        .collect();
    let majority = Quorum::majority(nodes.len());
    summarize(nodes, name, answers, |done| done >= majority)?;
    let valid_until = lease_end(sent_at, ttl);
    if valid_until <= Instant::now() {
        return Err(Error::LeaseLost {
            name: name.to_owned(),
            cause: LossCause::Unconfirmed,
        });
    }
    Ok((sent_at, valid_until))
}

/// Turns per-node answers into one result: `ok(count of Done)` decides success. If not,
/// the lease is lost only when so many nodes said it is not held that no majority can
/// hold it; otherwise (too few answers) the first node error is returned, and the lease
/// may well still be valid: an extend that misses its quorum once releases nothing.
fn summarize(
    nodes: &[Node],
    name: &str,
    answers: Vec<Result<OwnedReply, Error>>,
    ok: impl Fn(usize) -> bool,
) -> Result<(), Error> {
    // A second name of one server has no say.
    let answers: Vec<_> = answers
        .into_iter()
        .enumerate()
        .filter(|(i, _)| votes(nodes, *i))
        .map(|(_, a)| a)
        .collect();
    let done = answers
        .iter()
        .filter(|a| matches!(a, Ok(OwnedReply::Done)))
        .count();
    if ok(done) {
        return Ok(());
    }
    let taken = answers
        .iter()
        .filter(|a| matches!(a, Ok(OwnedReply::Other | OwnedReply::WrongType)))
        .count();
    let gone = answers
        .iter()
        .filter(|a| matches!(a, Ok(OwnedReply::Absent)))
        .count();
    let lost = Error::LeaseLost {
        name: name.to_owned(),
        cause: if taken > 0 {
            LossCause::TakenByOther
        } else {
            LossCause::Expired
        },
    };
    if taken + gone > nodes.len() - Quorum::majority(nodes.len()) {
        return Err(lost);
    }
    Err(answers.into_iter().find_map(Result::err).unwrap_or(lost))
}
