//! A Redlock client's side of the worlds with several nodes: what it remembers of each
//! node ([`Seen`]: the library's [`Health`] and its connection's generation), the
//! library's own tally of an attempt's answers ([`Quorum::tally`], fed through a
//! [`Voter`] over that memory), and the answers an attempt collected ([`Vote`]).
//!
//! The tally borrows its voters and keeps what it counted in private fields, so it
//! cannot live in the checker's hashed state: each answer that comes replays the
//! attempt's answers so far into a fresh tally over the client's memory of the nodes,
//! and the memory the tally updated ([`Voter::observe`], through a `RefCell`) is copied
//! back. The replay is faithful: what a node says about itself is recorded by
//! `Health::observe`, which given the same answer again (the same run id, uptime,
//! generation and time) leaves the memory as it was.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use fencelock::model::{AcquireTally, Health, Outcome, Quorum, Voter};

use crate::client;
use crate::keyspace::Reply;

/// What a client knows of one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Seen {
    /// Who the node said it is, and since when it is up (the library's record).
    pub health: Health,
    /// Its connection's generation: one more at each call that failed on it (the
    /// library's `Node::generation`).
    pub generation: u64,
    /// The node's restart its connection was opened after: a call sent on it after
    /// the node restarted again fails (a restart closes every connection).
    pub conn: u8,
}

/// One node's answer to an attempt.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Vote {
    /// The node.
    pub node: usize,
    /// Its reply; `None`: the connection closed before it came.
    pub reply: Option<Reply>,
    /// The connection's generation when the call went out.
    pub generation: u64,
    /// When it came (true ms).
    pub at_ms: i64,
    /// A refusal's: the ms left of the lease that refused it, as the node's keyspace
    /// held it after the script ran (`None`: no refusal, or a key without expiry), for
    /// the fallback bound.
    pub lease_left_ms: Option<i64>,
}

/// A node as the tally reads it: the client's memory of it, updated in place.
pub struct Node {
    addr: String,
    health: RefCell<Health>,
    generation: u64,
}

impl Voter for Node {
    fn addr(&self) -> String {
        self.addr.clone()
    }
    fn run_id(&self) -> Option<String> {
        self.health.borrow().run_id.clone()
    }
    fn up_since(&self) -> Option<Instant> {
        self.health.borrow().up_since
    }
    fn identified_at(&self) -> Option<u64> {
        self.health.borrow().identified_at
    }
    fn generation(&self) -> u64 {
        self.generation
    }
    fn observe(&self, run_id: &str, uptime: Duration, generation: u64, now: Instant) {
        let _: bool = self
            .health
            .borrow_mut()
            .observe(run_id, uptime, generation, now);
    }
}

/// The tally's view of a client's nodes.
pub fn voters(seen: &[Seen]) -> Vec<Node> {
    seen.iter()
        .enumerate()
        .map(|(i, s)| Node {
            addr: addr(i),
            health: RefCell::new(s.health.clone()),
            generation: s.generation,
        })
        .collect()
}

/// What the tally learnt, copied back into the client's memory.
pub fn remember(seen: &mut [Seen], voters: Vec<Node>) {
    for (s, v) in seen.iter_mut().zip(voters) {
        s.health = v.health.into_inner();
    }
}

/// Node `i`'s address in reports.
pub fn addr(i: usize) -> String {
    format!("model:{i}")
}

/// The library's Redlock rules over `nodes` nodes, with restart protection of
/// `quarantine` (`None`: off).
pub fn quorum(nodes: usize, quarantine: Option<Duration>) -> Quorum {
    Quorum::redlock(nodes, None, quarantine, Duration::from_secs(1))
}

/// A vote as the tally takes it: the decoded reply, or the error of a closed
/// connection.
fn answer(vote: &Vote) -> Result<fencelock::model::AcquireReply, fencelock::Error> {
    match &vote.reply {
        Some(reply) => client::decode(reply),
        None => Err(fencelock::model::broken(&addr(vote.node))),
    }
}

/// Replays an attempt's votes into the tally (sent at `sent_ms`, for `lease`): the
/// verdict once the votes decide it, every node answered, or (`timed_out`) the node
/// timeout ran out, the nodes yet to answer counted as timed out (`None` before), with
/// whether what it wrote must be taken back. `seen` is updated with what the nodes said
/// about themselves.
pub fn tally(
    q: &Quorum,
    seen: &mut [Seen],
    votes: &[Vote],
    sent_ms: i64,
    lease: Duration,
    now_ms: i64,
    timed_out: bool,
) -> Option<(Result<Outcome, fencelock::Error>, bool)> {
    let nodes = voters(seen);
    let verdict = {
        let mut tally: AcquireTally<'_, Node> = q.tally(&nodes, client::instant(sent_ms), lease);
        let mut decided = false;
        for vote in votes {
            decided = tally.add(
                vote.node,
                answer(vote),
                vote.generation,
                client::instant(vote.at_ms),
            );
        }
        (decided || timed_out || votes.len() == seen.len())
            .then(|| tally.verdict(client::NAME, client::instant(now_ms)))
    };
    remember(seen, nodes);
    verdict
}

/// An answer that came after its attempt's verdict: what the node said about itself
/// is still recorded (`Quorum::judge_late`). Nothing else: a grant in it is taken back
/// by the take-back the failed verdict sent to every node, which the node runs after
/// the attempt on the same connection, or, after a granted verdict, kept, and released
/// with the rest.
pub fn late(q: &Quorum, seen: &mut [Seen], vote: &Vote, lease: Duration) {
    let nodes = voters(seen);
    q.judge_late(
        &nodes[vote.node],
        &answer(vote),
        vote.generation,
        lease,
        client::instant(vote.at_ms),
    );
    remember(seen, nodes);
}

/// What a client learns of each node when it connects (the library asks every Redlock
/// node who it is then): their run ids and uptimes at `now_ms`.
pub fn connect(nodes: &[(String, Duration)], now_ms: i64) -> Vec<Seen> {
    nodes
        .iter()
        .map(|(run_id, uptime)| {
            let mut health = Health::default();
            let _: bool = health.observe(run_id, *uptime, 0, client::instant(now_ms));
            Seen {
                health,
                generation: 0,
                conn: 0,
            }
        })
        .collect()
}
