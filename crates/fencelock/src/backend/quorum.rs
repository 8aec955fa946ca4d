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

use super::node::{Health, Node};
use crate::engine::watchdog::Renewal;
use crate::engine::{Grant, Outcome, Refusal, lease_end};
use crate::error::{Blocker, Error, LossCause, NodeOutcome, NodeReport, UnavailableReason};
use crate::scripts::replies::{AcquireReply, Answer, Owned};
use crate::token::FencingToken;

/// What the tally reads and records of a node: one of the backend's `Node`s, or a
/// model checker's. The rules take the time as an argument too: the tally does no I/O
/// and reads no clock.
pub trait Voter {
    /// Its address, for reports and errors.
    fn addr(&self) -> String;
    /// The server's run id when last seen.
    fn run_id(&self) -> Option<String>;
    /// When its server process started, as last estimated.
    fn up_since(&self) -> Option<Instant>;
    /// The generation of its connection when it last said who it is.
    fn identified_at(&self) -> Option<u64>;
    /// Its connection's generation now (see `Node::generation`).
    fn generation(&self) -> u64;
    /// Records what it said about itself (`now`: when the answer came) in an answer on
    /// its connection of `generation` (`Health::observe`).
    fn observe(&self, run_id: &str, uptime: Duration, generation: u64, now: Instant);
}

impl Voter for Node {
    fn addr(&self) -> String {
        Node::addr(self)
    }

    fn run_id(&self) -> Option<String> {
        self.health().run_id.clone()
    }

    fn up_since(&self) -> Option<Instant> {
        self.health().up_since
    }

    fn identified_at(&self) -> Option<u64> {
        self.health().identified_at
    }

    fn generation(&self) -> u64 {
        Node::generation(self)
    }

    fn observe(&self, run_id: &str, uptime: Duration, generation: u64, now: Instant) {
        let _: bool = Health::observe(&mut self.health(), run_id, uptime, generation, now);
    }
}

/// The decision rules of a client's nodes.
#[derive(Clone, Debug)]
pub struct Quorum {
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
pub enum Confirmation {
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
    pub fn identify(&self, node: &impl Voter) -> bool {
        if !self.is_redlock() {
            return false;
        }
        node.run_id().is_none()
            || (self.quarantine.is_some() && node.identified_at() != Some(node.generation()))
    }

    /// Starts the tally of a Redlock acquire attempt sent at `sent_at`, whose answers
    /// come in one by one ([`AcquireTally::add`]).
    pub fn tally<'a, V: Voter>(
        &'a self,
        nodes: &'a [V],
        sent_at: Instant,
        ttl: Duration,
    ) -> AcquireTally<'a, V> {
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

    /// What `node` answered to an acquire (sent on its connection of `generation`, come
    /// at `now`), as a vote. Records what the node said about itself.
    fn judge(
        &self,
        node: &impl Voter,
        reply: &AcquireReply,
        generation: u64,
        ttl: Duration,
        now: Instant,
    ) -> NodeOutcome {
        if let Some(id) = &reply.identity {
            node.observe(&id.run_id, id.uptime, generation, now);
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

    /// Records what a node said about itself in an answer that came (at `now`) after
    /// the verdict.
    pub fn judge_late(
        &self,
        node: &impl Voter,
        answer: &Result<AcquireReply, Error>,
        generation: u64,
        ttl: Duration,
        now: Instant,
    ) {
        if let Ok(reply) = answer {
            let vote = self.judge(node, reply, generation, ttl, now);
            tracing::debug!(node = node.addr(), %vote, "a Redlock node answered after the verdict");
        }
    }

    /// Tallies what the nodes said about one lease or release: confirmed by `enough`
    /// nodes (a majority for a renewal or extend, one for a release), lost when so many
    /// said it is not held that no majority can hold it, unknown otherwise. `answers`:
    /// one per node, `None` for a node that did not answer.
    pub fn confirm(
        &self,
        nodes: &[impl Voter],
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

    /// What one lease's renewal to `ttl`, sent at `sent_at`, came to at `now`, from what
    /// the nodes answered for it (one per node, `None` where a node did not answer in
    /// time): renewed when a majority confirmed it and its new end ([`lease_end`]) is
    /// still ahead; lost when so many said it is not held that no majority can hold it;
    /// else no verdict.
    pub fn renewal(
        &self,
        nodes: &[impl Voter],
        answers: impl IntoIterator<Item = Option<Owned>>,
        sent_at: Instant,
        ttl: Duration,
        now: Instant,
    ) -> Renewal {
        match self.confirm(nodes, answers, self.needed()) {
            Confirmation::Confirmed => {
                let valid_until = lease_end(sent_at, ttl);
                if valid_until > now {
                    Renewal::Renewed { valid_until }
                } else {
                    Renewal::Unknown
                }
            }
            Confirmation::Lost(cause) => Renewal::Lost(cause),
            Confirmation::Unknown => Renewal::Unknown,
        }
    }

    /// How long `node` stays quarantined: a server that started less than the
    /// quarantine ago (the configured one, or the lease if longer, plus the second its
    /// uptime may be off by) may have lost locks it held.
    pub fn quarantine_left(
        &self,
        node: &impl Voter,
        ttl: Duration,
        now: Instant,
    ) -> Option<Duration> {
        let quarantine = self.quarantine?.max(ttl);
        let up_since = node.up_since()?;
        (up_since + quarantine + Duration::from_secs(1))
            .checked_duration_since(now)
            .filter(|left| !left.is_zero())
    }
}

/// The tally of one Redlock acquire attempt, answer by answer.
pub struct AcquireTally<'a, V: Voter> {
    quorum: &'a Quorum,
    nodes: &'a [V],
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

impl<V: Voter> AcquireTally<'_, V> {
    /// Adds what `nodes[i]` answered (sent on its connection of `generation`, come at
    /// `now`). True once the verdict is known whatever the others answer: a majority
    /// granted in time, or a key holds data fencelock did not write.
    pub fn add(
        &mut self,
        i: usize,
        answer: Result<AcquireReply, Error>,
        generation: u64,
        now: Instant,
    ) -> bool {
        let outcome = match answer {
            Ok(reply) => {
                let mut vote = self
                    .quorum
                    .judge(&self.nodes[i], &reply, generation, self.ttl, now);
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
        self.granted >= self.quorum.needed() && self.valid_until > now
    }

    /// Records the grant of `nodes[i]` as its server's vote. If that server voted
    /// already under another name, the name given later is refused: `i`'s refusal is
    /// returned, or the other name's recorded in its place (and its vote taken back).
    fn second_name(&mut self, i: usize) -> Option<NodeOutcome> {
        let id = self.nodes[i].run_id()?;
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

    /// The attempt's outcome from the answers added, at `now`, and whether what it may
    /// have written must be taken back now. A node that has not answered yet counts as
    /// not granting.
    pub fn verdict(self, name: &str, now: Instant) -> (Result<Outcome, Error>, bool) {
        if let Some(e) = self.fatal {
            return (Err(e), true);
        }
        let needed = self.quorum.needed();
        if self.granted >= needed && self.valid_until > now {
            let granted = Outcome::Granted {
                grant: Grant {
                    fence: FencingToken::new(self.fence),
                    sent_at: self.sent_at,
                    ttl: self.ttl,
                    valid_until: self.valid_until,
                },
                held_as_other: false,
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

/// The first node before `nodes[i]` known to be the server with `run_id`, if any (so
/// the first of several names of one server keeps its vote).
fn same_server(nodes: &[impl Voter], i: usize, run_id: &str) -> Option<usize> {
    nodes[..i]
        .iter()
        .position(|n| n.run_id().as_deref() == Some(run_id))
}

/// Whether `nodes[i]` votes: false for a second name of a server that an earlier node
/// already is (found out after the client connected).
fn votes(nodes: &[impl Voter], i: usize) -> bool {
    let known = nodes[i].run_id();
    known.is_none_or(|id| same_server(nodes, i, &id).is_none())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::scripts::replies::Identity;

    const S: Duration = Duration::from_secs(1);

    /// A node as a model checker keeps one: what it said about itself, in memory.
    #[derive(Default)]
    struct Known {
        addr: String,
        seen: Mutex<Option<(String, Instant)>>,
    }

    impl Voter for Known {
        fn addr(&self) -> String {
            self.addr.clone()
        }
        fn run_id(&self) -> Option<String> {
            self.seen.lock().unwrap().as_ref().map(|(id, _)| id.clone())
        }
        fn up_since(&self) -> Option<Instant> {
            self.seen.lock().unwrap().as_ref().map(|(_, up)| *up)
        }
        fn identified_at(&self) -> Option<u64> {
            self.seen.lock().unwrap().as_ref().map(|_| 0)
        }
        fn generation(&self) -> u64 {
            0
        }
        fn observe(&self, run_id: &str, uptime: Duration, _generation: u64, now: Instant) {
            *self.seen.lock().unwrap() = Some((run_id.to_owned(), now - uptime - S));
        }
    }

    fn granted(fence: u64, run_id: &str, uptime: Duration) -> Result<AcquireReply, Error> {
        Ok(AcquireReply {
            answer: Answer::Granted {
                fence: FencingToken::new(fence),
                fresh: true,
            },
            identity: Some(Identity {
                run_id: run_id.to_owned(),
                uptime,
            }),
            owner_hold: false,
        })
    }

    #[test]
    fn a_majority_in_time_decides_with_the_highest_token_and_a_fresh_restart_does_not_vote() {
        let nodes: Vec<Known> = (1..=3)
            .map(|i| Known {
                addr: format!("n{i}"),
                ..Known::default()
            })
            .collect();
        let q = Quorum::redlock(3, None, Some(30 * S), S);
        let t0 = Instant::now() + 3600 * S;
        let ttl = 10 * S;
        let mut tally = q.tally(&nodes, t0, ttl);
        // Up for an hour: counts. Up for 5 s: still in quarantine.
        assert!(!tally.add(0, granted(40, "a", 3600 * S), 0, t0));
        assert!(!tally.add(1, granted(42, "b", 5 * S), 0, t0));
        assert!(
            tally.add(2, granted(41, "c", 3600 * S), 0, t0),
            "two votes decide"
        );
        match tally.verdict("stock", t0) {
            (Ok(Outcome::Granted { grant, .. }), false) => {
                // The highest of the votes that count: 42 came from the quarantined node.
                assert_eq!(grant.fence, FencingToken::new(41));
                assert_eq!(grant.valid_until, lease_end(t0, ttl));
            }
            other => panic!("{other:?}"),
        }
        // The same answers after the lease's validity ran out: refused, taken back.
        let mut late = q.tally(&nodes, t0, ttl);
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            late.add(i, granted(43, id, 3600 * S), 0, t0 + ttl);
        }
        let (verdict, take_back) = late.verdict("stock", t0 + ttl);
        assert!(
            matches!(verdict, Err(Error::NoQuorum { .. })),
            "{verdict:?}"
        );
        assert!(take_back);
    }
}
