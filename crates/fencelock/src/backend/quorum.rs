//! How the nodes of a lock decide together: the tally. One node decides alone; Redlock
//! (N independent masters, N odd, at least 3) needs a majority. The same rules serve
//! acquire, extend, release and the watchdog's renewals:
//!
//! - **Majority**: `N / 2 + 1` nodes must agree; a second name of one server (two URLs,
//!   one run id) has no say.
//! - **Validity**: a grant or renewal counts only with time to spare: validity = TTL −
//!   elapsed − drift, elapsed measured on the monotonic clock from before the first
//!   send, drift = 1% of the TTL + 2 ms ([`lease_end`]).
//! - **Loss**: a lease is lost only when so many nodes said it is not held (absent, or
//!   another holder's) that no majority can hold it; too few answers leave it unknown,
//!   and an extend that misses its majority once releases nothing.
//! - **Take back**: a Redlock acquire that fails is released on every node, including
//!   those that seemed to fail (their reply may have been lost, not their write). One
//!   node's unanswered acquire is withdrawn later by the caller, so that a retry with
//!   the same token finds its grant.
//! - **Restart protection**: each node says, inside the acquire script, its run id and
//!   uptime. A node that came back less than the quarantine ago (the largest lease in
//!   use, at least the configured one) may have lost keys it held, so its grant does not
//!   count until the quarantine has passed: the "delayed restart" rule, enforced by the
//!   client.
//! - **Fencing**: each node's counter is kept at or above its clock in microseconds and
//!   increases with each grant there; the grant carries the highest
//!   token among the granting nodes, and release raises every node's counter to it. So
//!   tokens increase across holders while any majority keeps its counters, and across a
//!   wipe of a majority as long as the nodes' clocks agree better than the time between
//!   two grants.

use std::time::{Duration, Instant};

use super::node::Node;
use crate::error::{Blocker, Error, LossCause, NodeOutcome, NodeReport, UnavailableReason};
use crate::scripts::replies::{AcquireOutcome, AcquireReply, Owned};
use crate::token::FencingToken;

/// How much of a lease the client gives up to clock-rate drift between itself and
/// Redis: 1% of the TTL plus 2 ms, as in Redlock.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The end of a lease that Redis started no earlier than `sent_at`.
pub(crate) fn lease_end(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl.saturating_sub(drift(ttl))
}

/// The decision rules of a client's nodes.
#[derive(Clone, Debug)]
pub(crate) struct Quorum {
    /// How many nodes there are: 1, or an odd number of at least 3 (Redlock).
    nodes: usize,
    /// Redlock: each node's time to answer; `None`: a twentieth of the TTL, between 5 ms
    /// and the response timeout.
    node_timeout: Option<Duration>,
    /// Redlock restart protection: the shortest quarantine; `None`: off.
    quarantine: Option<Duration>,
    response_timeout: Duration,
}

/// What one acquire attempt came to.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Granted with time to spare.
    Granted {
        fence: FencingToken,
        valid_until: Instant,
    },
    /// Not granted: another holder stands in the way. `nodes`: the per-node report
    /// (Redlock only).
    Held {
        blocked_by: Blocker,
        nodes: Vec<NodeReport>,
    },
    /// Not granted, for another reason: an outage (for one node, whose outcome may be
    /// unknown), a refusal, a quorum that failed.
    Failed(Error),
}

/// What the nodes said about one lease (an extend, a renewal) or a release.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Confirmation {
    /// Enough nodes confirmed.
    Confirmed,
    /// So many nodes said the lease is not held that no majority can hold it.
    Lost(LossCause),
    /// Too few answers to tell.
    Unknown,
}

impl Quorum {
    /// One node: it decides alone, each call within its own call timeout.
    pub fn single(response_timeout: Duration) -> Self {
        Self {
            nodes: 1,
            node_timeout: None,
            quarantine: None,
            response_timeout,
        }
    }

    /// Redlock over `nodes` independent masters.
    pub fn redlock(
        nodes: usize,
        node_timeout: Option<Duration>,
        quarantine: Option<Duration>,
        response_timeout: Duration,
    ) -> Self {
        Self {
            nodes,
            node_timeout,
            quarantine,
            response_timeout,
        }
    }

    /// Whether this is Redlock (several nodes) rather than one node.
    pub fn is_redlock(&self) -> bool {
        self.nodes > 1
    }

    /// How many nodes must agree.
    pub fn needed(&self) -> usize {
        self.nodes / 2 + 1
    }

    /// How long each node may take over its share of an operation on a `ttl` lease:
    /// Redlock's node timeout, or `None` (one node: its own call timeout).
    pub fn within(&self, ttl: Duration) -> Option<Duration> {
        self.is_redlock().then(|| {
            self.node_timeout.unwrap_or_else(|| {
                (ttl / 20).clamp(Duration::from_millis(5), self.response_timeout)
            })
        })
    }

    /// Whether `node` must say who it is with its answer: with restart protection on,
    /// and until its identity is known (it was down when the client connected).
    pub fn identify(&self, node: &Node) -> bool {
        self.is_redlock() && (self.quarantine.is_some() || node.health().run_id.is_none())
    }

    /// Tallies one acquire attempt sent at `sent_at`. Records what each node said about
    /// itself (restart protection, identity). Returns the verdict, and whether what the
    /// attempt may have written must be taken back now.
    pub fn acquire(
        &self,
        nodes: &[Node],
        answers: Vec<Result<AcquireReply, Error>>,
        name: &str,
        sent_at: Instant,
        ttl: Duration,
    ) -> (Verdict, bool) {
        let now = Instant::now();
        let valid_until = lease_end(sent_at, ttl);
        if !self.is_redlock() {
            // One node: its answer is the verdict.
            let answer = answers.into_iter().next();
            return match answer {
                Some(Ok(AcquireReply {
                    outcome: AcquireOutcome::Acquired { fence, fresh },
                    ..
                })) => {
                    if !fresh {
                        tracing::debug!("acquire retry found our own token");
                    }
                    if valid_until > now {
                        (Verdict::Granted { fence, valid_until }, false)
                    } else {
                        // The grant came back after its lease ran out (a slow network, a
                        // paused client): the lock may belong to someone else already,
                        // so holding it is not on offer. Take it back (owner-checked: a
                        // successor's key stays) and report the attempt as timed out;
                        // the caller treats its outcome as unknown.
                        (
                            Verdict::Failed(late_grant(&nodes[0], sent_at, now, ttl)),
                            true,
                        )
                    }
                }
                Some(Ok(AcquireReply {
                    outcome: AcquireOutcome::Held { blocked_by },
                    ..
                })) => (
                    Verdict::Held {
                        blocked_by,
                        nodes: Vec::new(),
                    },
                    false,
                ),
                Some(Err(e)) => (Verdict::Failed(e), false),
                None => (
                    Verdict::Failed(Error::invalid("nodes", "none given")),
                    false,
                ),
            };
        }

        let mut granted = 0;
        let mut fence = 0u64;
        let mut held: Option<Blocker> = None;
        let mut held_nodes = 0;
        let mut report = Vec::with_capacity(nodes.len());
        for (i, (node, answer)) in nodes.iter().zip(answers).enumerate() {
            let outcome = match answer {
                Ok(AcquireReply { outcome, identity }) => {
                    let mut quarantined = None;
                    if let Some(id) = &identity {
                        let restarted = node.health().observe(&id.run_id);
                        quarantined = self.quarantine_left(node, ttl, restarted, id.uptime, now);
                    }
                    // Nodes are tallied in index order, so an earlier name of the same
                    // server has already recorded what it just said.
                    let known = node.health().run_id.clone();
                    let same_as = known.and_then(|id| same_server(nodes, i, &id));
                    match (outcome, quarantined) {
                        (AcquireOutcome::Acquired { .. }, _) if same_as.is_some() => {
                            let other = same_as.map_or_else(String::new, |j| nodes[j].addr());
                            tracing::error!(
                                node = node.addr(),
                                other,
                                "two Redlock nodes are one Redis server; its second vote is refused"
                            );
                            NodeOutcome::Refused(format!(
                                "the same Redis server as {other} (one run id): it votes once"
                            ))
                        }
                        (AcquireOutcome::Acquired { .. }, Some(left)) => {
                            NodeOutcome::Quarantined { remaining: left }
                        }
                        (AcquireOutcome::Acquired { fence: f, .. }, None) => {
                            granted += 1;
                            fence = fence.max(f.get());
                            NodeOutcome::Granted
                        }
                        (AcquireOutcome::Held { blocked_by }, _) => {
                            held = Some(held.map_or(blocked_by, |h| h.sooner(blocked_by)));
                            held_nodes += 1;
                            NodeOutcome::Held { blocked_by }
                        }
                    }
                }
                Err(e @ Error::WrongType { .. }) => {
                    // Data fencelock did not write: no retry will help.
                    return (Verdict::Failed(e), true);
                }
                Err(Error::Unavailable { reason, .. }) => NodeOutcome::Unavailable(reason),
                Err(e) => NodeOutcome::Refused(e.to_string()),
            };
            report.push(NodeReport {
                node: node.addr().to_owned(),
                outcome,
            });
        }
        let needed = self.needed();
        if granted >= needed && valid_until > now {
            let fence = FencingToken::new(fence);
            return (Verdict::Granted { fence, valid_until }, false);
        }
        // No quorum, or no time left: contention if other holders block a majority,
        // otherwise an outage that names every node.
        let verdict = match held {
            Some(blocked_by) if held_nodes >= needed => Verdict::Held {
                blocked_by,
                nodes: report,
            },
            _ => Verdict::Failed(Error::NoQuorum {
                name: name.to_owned(),
                needed,
                granted,
                nodes: report,
            }),
        };
        (verdict, true)
    }

    /// Tallies what the nodes said about one lease or release: confirmed by `enough`
    /// nodes (a majority for a renewal or extend, one for a release), lost when so many
    /// said it is not held that no majority can hold it, unknown otherwise. `answers`:
    /// one per node, `None` for a node that did not answer.
    pub fn confirm(
        &self,
        nodes: &[Node],
        answers: impl IntoIterator<Item = Option<Owned>>,
        enough: usize,
    ) -> Confirmation {
        let (mut done, mut gone, mut taken) = (0, 0, 0);
        for (i, answer) in answers.into_iter().enumerate() {
            if self.is_redlock() && !votes(nodes, i) {
                continue; // a second name of one server has no say
            }
            match answer {
                Some(Owned::Done) => done += 1,
                Some(Owned::Absent) => gone += 1,
                Some(Owned::Other) => taken += 1,
                None => {}
            }
        }
        if done >= enough {
            Confirmation::Confirmed
        } else if gone + taken > self.nodes - self.needed() {
            Confirmation::Lost(if taken > 0 {
                LossCause::TakenByOther
            } else {
                LossCause::Expired
            })
        } else {
            Confirmation::Unknown
        }
    }

    /// How long `node` stays quarantined, given what it just said about itself
    /// (`restarted`: its run id changed since it was last seen).
    fn quarantine_left(
        &self,
        node: &Node,
        ttl: Duration,
        restarted: bool,
        uptime: Duration,
        now: Instant,
    ) -> Option<Duration> {
        let quarantine = self.quarantine?.max(ttl);
        let mut health = node.health();
        // Uptime counts whole seconds: round the restart moment down, to be safe.
        let up_since = now.checked_sub(uptime).unwrap_or(now);
        if uptime < quarantine || restarted {
            let until = up_since + quarantine + Duration::from_secs(1);
            health.quarantined_until =
                Some(health.quarantined_until.map_or(until, |u| u.max(until)));
        }
        health
            .quarantined_until
            .and_then(|until| until.checked_duration_since(now))
            .filter(|left| !left.is_zero())
    }
}

/// The grant that came back after its lease had run out, as an error.
fn late_grant(node: &Node, sent_at: Instant, now: Instant, ttl: Duration) -> Error {
    Error::Unavailable {
        node: node.addr().to_owned(),
        reason: UnavailableReason::TimedOut,
        detail: format!(
            "the grant arrived {} ms after the acquire was sent, after its {} ms lease (less the drift allowance) had run out",
            (now - sent_at).as_millis(),
            ttl.as_millis()
        ),
        source: None,
    }
}

/// The first node before `nodes[i]` known to be the server with `run_id`, if any (so
/// the first of several names of one server keeps its vote).
pub(crate) fn same_server(nodes: &[Node], i: usize, run_id: &str) -> Option<usize> {
    nodes[..i]
        .iter()
        .position(|n| n.health().run_id.as_deref() == Some(run_id))
}

/// Whether `nodes[i]` votes: false for a second name of a server that an earlier node
/// already is (found out after the client connected).
fn votes(nodes: &[Node], i: usize) -> bool {
    let known = nodes[i].health().run_id.clone();
    known.is_none_or(|id| same_server(nodes, i, &id).is_none())
}
