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
//! - **Restart protection**: each node says its run id and uptime (`INFO server`) when
//!   the client connects, and inside the acquire script after any change of its
//!   connection (a failed call, after which the driver reconnects; a server restarts only
//!   by closing its connections). A node that came back less than the quarantine ago
//!   (the largest lease in use, at least the configured one) may have lost keys it held,
//!   so its grant does not count until the quarantine has passed: the "delayed restart"
//!   rule, enforced by the client. A grant whose connection changed while it was
//!   answered, without saying who the node is, does not count either.
//! - **Early answer**: an acquire, extend or release answers as soon as the answers so
//!   far decide it (a majority granted in time; enough confirmed); the calls still under
//!   way finish in the background (a late grant is kept: renewals and the release go to
//!   every node, and a node's later calls run after it on its connection).
//! - **Fencing**: each node's counter is kept at or above its clock in microseconds and
//!   increases with each grant there; the grant carries the highest
//!   token among the granting nodes, and release raises every node's counter to it. So
//!   tokens increase across holders while any majority keeps its counters, and across a
//!   wipe of a majority as long as the nodes' clocks agree better than the time between
//!   two grants.

use std::time::{Duration, Instant};

use super::node::Node;
use crate::engine::{Grant, Outcome, Refusal, lease_end};
use crate::error::{Blocker, Error, LossCause, NodeOutcome, NodeReport, UnavailableReason};
use crate::scripts::replies::{AcquireReply, Answer, Owned};
use crate::token::FencingToken;

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

    /// Whether `node` must say who it is with its answer: until its identity is known
    /// (it was down when the client connected), and with restart protection on, again
    /// after every change of its connection (a server restarts only by closing them).
    pub fn identify(&self, node: &Node) -> bool {
        if !self.is_redlock() {
            return false;
        }
        let health = node.health();
        health.run_id.is_none()
            || (self.quarantine.is_some() && health.identified_at != Some(node.generation()))
    }

    /// Tallies one node's answer to an acquire attempt sent at `sent_at`: its answer is
    /// the attempt's outcome. Returns it, and whether what the attempt may have written
    /// must be taken back now.
    pub fn acquire_one(
        &self,
        node: &Node,
        answer: Result<AcquireReply, Error>,
        sent_at: Instant,
        ttl: Duration,
    ) -> (Result<Outcome, Error>, bool) {
        let now = Instant::now();
        let reply = match answer {
            Ok(reply) => reply,
            Err(e) => return (Err(e), false),
        };
        match reply.answer {
            Answer::Granted { fence, fresh } => {
                if !fresh {
                    tracing::debug!("acquire retry found our own token");
                }
                let grant = Grant::new(fence, sent_at, ttl);
                if grant.valid_until > now {
                    let granted = Outcome::Granted {
                        grant,
                        owner_hold: reply.owner_hold,
                    };
                    (Ok(granted), false)
                } else {
                    // The grant came back after its lease ran out (a slow network, a
                    // paused client): the lock may belong to someone else already, so
                    // holding it is not on offer. Take it back (owner-checked: a
                    // successor's key stays) and report the attempt as timed out; the
                    // caller treats its outcome as unknown.
                    (Err(late_grant(node, sent_at, now, ttl)), true)
                }
            }
            Answer::Held(refusal) => {
                let held = Outcome::Held {
                    refusal,
                    nodes: Vec::new(),
                };
                (Ok(held), false)
            }
        }
    }

    /// Starts the tally of a Redlock acquire attempt sent at `sent_at`, whose answers
    /// come in one by one ([`AcquireTally::add`]).
    pub fn tally<'a>(
        &'a self,
        nodes: &'a [Node],
        sent_at: Instant,
        ttl: Duration,
    ) -> AcquireTally<'a> {
        AcquireTally {
            quorum: self,
            nodes,
            ttl,
            sent_at,
            valid_until: lease_end(sent_at, ttl),
            granted: 0,
            fence: 0,
            held: None,
            held_nodes: 0,
            held_at: None,
            report: vec![None; nodes.len()],
            voters: Vec::new(),
            fatal: None,
        }
    }

    /// What `nodes[i]` answered to an acquire (sent on its connection of `generation`),
    /// as a vote. Records what the node said about itself.
    fn judge(
        &self,
        nodes: &[Node],
        i: usize,
        reply: &AcquireReply,
        generation: u64,
        ttl: Duration,
    ) -> NodeOutcome {
        let node = &nodes[i];
        let now = Instant::now();
        if let Some(id) = &reply.identity {
            node.health()
                .observe(&id.run_id, id.uptime, generation, now);
        }
        if let Answer::Held(refusal) = reply.answer {
            return NodeOutcome::Held {
                blocked_by: refusal.blocked_by,
            };
        }
        // Two names of one server: the tally counts its vote once (AcquireTally::add).
        if self.quarantine.is_some() {
            if reply.identity.is_none() && node.generation() != generation {
                // Its connection changed while it answered: the server may have
                // restarted without this client having asked it who it is now.
                return NodeOutcome::Refused(
                    "its connection was re-established while it answered; it is asked who it \
                     is on the next attempt"
                        .to_owned(),
                );
            }
            if let Some(remaining) = self.quarantine_left(node, ttl, now) {
                return NodeOutcome::Quarantined { remaining };
            }
        }
        NodeOutcome::Granted
    }

    /// Records what a node said about itself in an answer that came after the verdict.
    pub fn judge_late(
        &self,
        nodes: &[Node],
        i: usize,
        answer: &Result<AcquireReply, Error>,
        generation: u64,
        ttl: Duration,
    ) {
        if let Ok(reply) = answer {
            let vote = self.judge(nodes, i, reply, generation, ttl);
            tracing::debug!(node = nodes[i].addr(), %vote, "a Redlock node answered after the verdict");
        }
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

    /// How long `node` stays quarantined: a server that started less than the
    /// quarantine ago (the configured one, or the lease if longer, plus the second its
    /// uptime may be off by) may have lost locks it held.
    pub fn quarantine_left(&self, node: &Node, ttl: Duration, now: Instant) -> Option<Duration> {
        let quarantine = self.quarantine?.max(ttl);
        let up_since = node.health().up_since?;
        (up_since + quarantine + Duration::from_secs(1))
            .checked_duration_since(now)
            .filter(|left| !left.is_zero())
    }
}

/// The tally of one Redlock acquire attempt, answer by answer.
pub(crate) struct AcquireTally<'a> {
    quorum: &'a Quorum,
    nodes: &'a [Node],
    ttl: Duration,
    sent_at: Instant,
    valid_until: Instant,
    granted: usize,
    fence: u64,
    held: Option<Blocker>,
    held_nodes: usize,
    /// A multi-lock: the held name a node named first.
    held_at: Option<usize>,
    /// What each node answered, by node index; `None` while it has not.
    report: Vec<Option<NodeOutcome>>,
    /// The servers whose grant counted (run id, the node index that voted): answers
    /// come in any order, and a server named twice votes once, by its first name.
    voters: Vec<(String, usize)>,
    /// A key holds data fencelock did not write: no retry will help.
    fatal: Option<Error>,
}

impl AcquireTally<'_> {
    /// Adds what `nodes[i]` answered (sent on its connection of `generation`). True once
    /// the verdict is known whatever the others answer: a majority granted in time, or a
    /// key holds data fencelock did not write.
    pub fn add(&mut self, i: usize, answer: Result<AcquireReply, Error>, generation: u64) -> bool {
        let outcome = match answer {
            Ok(reply) => {
                let mut vote = self
                    .quorum
                    .judge(self.nodes, i, &reply, generation, self.ttl);
                if vote == NodeOutcome::Granted
                    && let Some(refused) = self.second_name(i)
                {
                    vote = refused;
                }
                match (&vote, reply.answer) {
                    (NodeOutcome::Granted, Answer::Granted { fence, .. }) => {
                        self.granted += 1;
                        self.fence = self.fence.max(fence.get());
                    }
                    (NodeOutcome::Held { blocked_by }, answer) => {
                        if let Answer::Held(Refusal { at: Some(at), .. }) = answer {
                            self.held_at.get_or_insert(at);
                        }
                        let b = *blocked_by;
                        self.held = Some(self.held.map_or(b, |h| h.sooner(b)));
                        self.held_nodes += 1;
                    }
                    _ => {}
                }
                vote
            }
            Err(e @ Error::WrongType { .. }) => {
                self.fatal = Some(e);
                return true;
            }
            // A port of the wrong kind (TLS or not, or not Redis): said in full, since
            // no wait mends it.
            Err(Error::Unavailable { detail, .. }) if super::errors::is_port_hint(&detail) => {
                NodeOutcome::Refused(detail)
            }
            Err(Error::Unavailable { reason, .. }) => NodeOutcome::Unavailable(reason),
            Err(e) => NodeOutcome::Refused(e.to_string()),
        };
        self.report[i] = Some(outcome);
        self.granted >= self.quorum.needed() && self.valid_until > Instant::now()
    }

    /// Records the grant of `nodes[i]` as its server's vote. If that server voted
    /// already under another name, the name given later is refused: `i`'s refusal is
    /// returned, or the other name's recorded in its place (and its vote taken back).
    fn second_name(&mut self, i: usize) -> Option<NodeOutcome> {
        let id = self.nodes[i].health().run_id.clone()?;
        let Some(k) = self.voters.iter().position(|(known, _)| *known == id) else {
            self.voters.push((id, i));
            return None;
        };
        let first = self.voters[k].1;
        let (kept, refused) = if i < first { (i, first) } else { (first, i) };
        let (kept_addr, refused_addr) = (self.nodes[kept].addr(), self.nodes[refused].addr());
        tracing::error!(
            node = refused_addr,
            other = kept_addr,
            "two Redlock nodes are one Redis server; its second vote is refused"
        );
        let refusal = NodeOutcome::Refused(format!(
            "the same Redis server as {kept_addr} (one run id): it votes once"
        ));
        if refused == i {
            return Some(refusal);
        }
        // The earlier name answered later: it keeps the vote the later name had.
        self.voters[k].1 = i;
        self.report[first] = Some(refusal);
        self.granted -= 1;
        None
    }

    /// The attempt's outcome from the answers added, and whether what it may have
    /// written must be taken back now. A node that has not answered yet counts as not
    /// granting.
    pub fn verdict(self, name: &str) -> (Result<Outcome, Error>, bool) {
        if let Some(e) = self.fatal {
            return (Err(e), true);
        }
        let needed = self.quorum.needed();
        if self.granted >= needed && self.valid_until > Instant::now() {
            let granted = Outcome::Granted {
                grant: Grant {
                    fence: FencingToken::new(self.fence),
                    sent_at: self.sent_at,
                    ttl: self.ttl,
                    valid_until: self.valid_until,
                },
                owner_hold: false,
            };
            return (Ok(granted), false);
        }
        // No quorum, or no time left: contention if other holders block a majority,
        // otherwise an outage that names every node.
        let report: Vec<NodeReport> = self
            .nodes
            .iter()
            .zip(self.report)
            .map(|(node, outcome)| NodeReport {
                node: node.addr(),
                outcome: outcome.unwrap_or(NodeOutcome::Unavailable(UnavailableReason::TimedOut)),
            })
            .collect();
        let outcome = match self.held {
            Some(blocked_by) if self.held_nodes >= needed => Ok(Outcome::Held {
                refusal: Refusal {
                    at: self.held_at,
                    ..Refusal::by(blocked_by)
                },
                nodes: report,
            }),
            _ => Err(Error::NoQuorum {
                name: name.to_owned(),
                needed,
                granted: self.granted,
                nodes: report,
            }),
        };
        (outcome, true)
    }
}

/// The grant that came back after its lease had run out, as an error.
fn late_grant(node: &Node, sent_at: Instant, now: Instant, ttl: Duration) -> Error {
    Error::Unavailable {
        node: node.addr().to_owned(),
        reason: UnavailableReason::LateGrant,
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
