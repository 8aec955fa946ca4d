//! A world for the model checker: a lock server that runs the shipped scripts, clients
//! that are the library's acquire engine ([`crate::client`]), the messages between them,
//! a clock with bounded drift, and faults as actions; the properties as checks over its
//! state.
//!
//! Everything a world does happens by an action the checker chooses, so every
//! interleaving of the clients' calls, the server's executions, the deliveries and the
//! faults is explored: a call waits in the network until the node executes it (in any
//! order), its reply and the messages its script published wait until delivered (in
//! any order) or lost, and the clock moves only by a tick, or to a sleeping client's
//! timer when that comes sooner.
//!
//! Faults: lease expiry (the clock's ticks; the node's clock runs fast by up to the
//! drift bound), a lost reply (the client's connection reports a timeout: the engine
//! tries again with the same holder token), a lost or late release message, a client
//! crash, a client pause past its lease (a client that takes no step while the clock
//! ticks: every interleaving has it), a node restart that wipes its keyspace, a
//! failover that loses the last writes (the node's data becomes its replica's, which
//! copied it at the last `Replicate`).
//!
//! In a world that renews ([`World::watchdog`]), each holder's watchdog
//! ([`crate::watchdog`]) is a timer too: it renews the lease, or finds it lost, when
//! it acts, and the clock may run past it (the holder paused past its lease).

use std::fmt::Write as _;
use std::time::Duration;

use fencelock::model::{
    Acquiring, Channels, Command, Event, Handover, HolderToken, Outcome, Site, Undo, Woken,
    WokenBy, hand_on, own_channel,
};
use stateright::{Model, Property};

use crate::client::{self, Call, Kind};
use crate::keyspace::{Bytes, Entry, Published, Reply, Server, Value};
use crate::redlock::Vote;
use crate::scripts::Scripts;
use crate::watchdog::{Acted, Watch};

/// The world's start: the servers' clocks read this (µs since the epoch).
const EPOCH_US: i64 = 1_800_000_000_000_000;

/// Redlock: the attempts an acquire makes at most in the worlds (see
/// [`World::max_attempts`]).
pub const REDLOCK_ATTEMPTS: u32 = 3;

/// How long Redlock's nodes have been up at the world's start (µs): longer than any
/// quarantine, so that only a restart in the world quarantines a node.
const REDLOCK_UPTIME_US: i64 = 60_000_000;

/// Which faults a world may inject, and how many in all.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// A reply lost on its way back.
    pub lost_reply: bool,
    /// A renewal's reply lost on its way back (the other replies arrive).
    pub lost_renewal: bool,
    /// A release message lost.
    pub lost_message: bool,
    /// A client crash.
    pub crash: bool,
    /// A node restart without persistence.
    pub restart: bool,
    /// A failover to a replica that lags.
    pub failover: bool,
    /// How many faults at most, of all kinds together.
    pub budget: u8,
    /// Redlock: a node's answer to an attempt waits in the network (while other things
    /// happen) and may come after the client's verdict, its node timeout run out.
    pub late_answer: bool,
}

impl Faults {
    /// Whether a fault may leave a waiter asleep with nothing in flight for a while
    /// (it then waits for its timer, by design). A renewal's lost reply does not: at
    /// worst its holder's lease runs out, which excuses its waiters' sleep.
    fn delay_wakes(&self) -> bool {
        self.lost_reply || self.lost_message || self.crash || self.restart || self.failover
    }
}

/// One world: its settings (the checker's model).
#[derive(Clone, Debug)]
pub struct World {
    /// A name for reports.
    pub name: &'static str,
    /// The scripts the server runs (shipped, or a control's mutation).
    pub scripts: Scripts,
    /// What each client takes (one client each).
    pub kinds: Vec<Kind>,
    /// How many times each client takes the lock.
    pub rounds: u8,
    /// The lease, ms.
    pub lease_ms: i64,
    /// One clock tick, ms.
    pub tick_ms: i64,
    /// How many ticks at most: the clock stops at `ticks * tick_ms`.
    pub ticks: u8,
    /// How far the node's clock may run ahead of the true time, ms (0: none): it jumps
    /// that far at once, at any point ([`Action::Drift`]).
    pub max_drift_ms: i64,
    /// Each client writes to the fenced resource while it holds the lock.
    pub fenced_writes: bool,
    /// The faults.
    pub faults: Faults,
    /// At most this many holders with an unexpired lease (1; N for a semaphore;
    /// readers aside).
    pub max_holders: usize,
    /// How many lock nodes: 1, or 3 for Redlock (plain clients only, each node its own
    /// keyspace running the scripts, the clients' attempts tallied by the library's
    /// `Quorum`).
    pub nodes: usize,
    /// Redlock's restart protection: the clients' quarantine (`None`: off).
    pub quarantine: Option<Duration>,
    /// The lock is held at the start, for one lease, by a holder that is gone (it never
    /// releases): the clients queue behind it from their first attempt.
    pub held_at_start: bool,
    /// The checker explores no further a state where an acquire made more attempts
    /// than this (`None`: no bound). Redlock's split votes and quarantined nodes
    /// answer "no quorum", retried within 100 ms: without a bound, each retry at its
    /// own time multiplies the states.
    pub max_attempts: Option<u32>,
    /// Redlock: one node's clock may jump ahead by this much, once (ms; 0: none): a
    /// clock that runs fast, its whole gain over a lease at one moment.
    pub skew_ms: i64,
    /// The holders' leases are renewed by the library's watchdog ([`crate::watchdog`]):
    /// a holder holds while its watchdog's lease runs and has not been lost.
    pub watchdog: bool,
}

/// What a client is doing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// About to acquire.
    Idle,
    /// The engine's attempt (or its withdrawal) is in flight: its call, then its reply.
    Calling {
        /// The engine.
        engine: Acquiring<'static>,
        /// When it was sent (true ms).
        sent_ms: i64,
        /// The wakes delivered before it was sent: an answer uses them up.
        mark: u8,
        /// What it is (an attempt, a withdrawal).
        purpose: Purpose,
        /// Redlock: the nodes' answers so far.
        votes: Vec<crate::redlock::Vote>,
    },
    /// The engine sleeps until a release message wakes it, or its timer.
    Asleep {
        /// The engine.
        engine: Acquiring<'static>,
        /// When its timer ends (true ms).
        until_ms: i64,
    },
    /// Holds the lock (in its own view).
    Holding {
        /// The holder token.
        token: HolderToken,
        /// The fencing token.
        fence: u64,
        /// The end of its lease, by its own count (true ms): a renewing holder's moves
        /// with its watchdog ([`crate::watchdog::Watch::until_ms`]).
        until_ms: i64,
        /// Its fenced write is done (or not wanted).
        wrote: bool,
    },
    /// Its fenced write is in flight.
    Writing {
        /// The holder token.
        token: HolderToken,
        /// The fencing token.
        fence: u64,
        /// The end of its lease (true ms).
        until_ms: i64,
    },
    /// Its release is in flight: this many nodes have yet to answer.
    Releasing(u8),
    /// Took the lock as often as it would.
    Done,
    /// Crashed: takes no step again (its connections are closed).
    Crashed,
}

/// One client: what it does, and what its subscriber holds for its waiter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// What it does.
    pub phase: Phase,
    /// How many times it took and released the lock.
    pub round: u8,
    /// The waiter's channels: the lock's, and its client's own channel of the lock.
    pub listens: Option<(Bytes, Option<Bytes>)>,
    /// Wakes delivered and not yet taken.
    pub pending: u8,
    /// Wakes by name (on its own channel) delivered since it subscribed.
    pub named: u64,
    /// A fair handover delivered and not yet taken: (fencing token, lease ms).
    pub handover: Option<(u64, u64)>,
    /// Redlock: what it knows of each node (empty with one node).
    pub seen: Vec<crate::redlock::Seen>,
    /// Its held lease's watchdog, in a world that renews ([`World::watchdog`]), from
    /// its grant to its release.
    pub watch: Option<crate::watchdog::Watch>,
}

/// What a call is for, which says what its reply does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// The engine's attempt.
    Attempt,
    /// The engine's withdrawal.
    Withdraw,
    /// A holder's release.
    Release,
    /// A holder's fenced write.
    Write,
    /// In the background: nobody waits for its reply.
    Background,
    /// A holder's watchdog renews its lease.
    Renew,
}

/// What travels between clients and nodes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Packet {
    /// A script call on its way to a node.
    Call {
        /// The sender.
        from: usize,
        /// The node it goes to.
        node: usize,
        /// What it is for.
        purpose: Purpose,
        /// The call.
        call: Call,
        /// Redlock: the sender's connection (its [`Seen`](crate::redlock::Seen)'s
        /// `conn` and generation) and the attempt's number (0 with one node).
        via: (u8, u64, u32),
    },
    /// A reply on its way back.
    Reply {
        /// The client.
        to: usize,
        /// The node that answers.
        node: usize,
        /// The call's connection generation and attempt (see [`Packet::Call`]).
        via: (u64, u32),
        /// What its call was for.
        purpose: Purpose,
        /// The script it answers.
        script: &'static str,
        /// The reply; `None`: the connection closed first (the node restarted).
        reply: Option<Reply>,
        /// A refusal's, in a world that checks [`FALLBACK_BOUND`]: the longest its
        /// waiter may sleep on it, ms, by the library's rule applied to the node's
        /// keyspace as the script left it ([`max_wait`]). (Any other answer allows the
        /// retry schedule's longest pause.)
        max_wait_ms: Option<i64>,
        /// Redlock: a refusal's lease left on its node ([`Vote::lease_left_ms`]).
        lease_left_ms: Option<i64>,
    },
    /// A published message on its way to a subscribed client.
    Message {
        /// The client.
        to: usize,
        /// The node that published it.
        node: usize,
        /// The channel.
        channel: Bytes,
        /// The message.
        message: Bytes,
    },
}

/// The lock server: its data and clock, and its replica's copy.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// The server.
    pub server: Server,
    /// What its replica copied at the last replication (failover promotes it).
    pub replica: Server,
    /// How far its clock runs ahead of the true time, ms.
    pub drift_ms: i64,
    /// How many times it restarted (its run id says so).
    pub restarts: u8,
    /// The clients whose subscription here its restart dropped, not yet made again:
    /// what it publishes meanwhile does not reach them.
    pub unsubscribed: Vec<usize>,
}

/// What the properties read besides the clients and nodes: every grant a server made
/// (holder token and fencing token), in order, and the resource's accepted writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Log {
    /// (holder token, fencing token) of each grant (a retried acquire's second grant of
    /// the same token once), a fair handover's included.
    pub grants: Vec<(String, u64)>,
    /// A grant's fencing token was not above every earlier grant's.
    pub token_fell: bool,
    /// A fair grant went to another than the first live waiter of the queue.
    pub out_of_turn: bool,
    /// The fencing tokens the resource accepted, in order.
    pub accepted: Vec<u64>,
    /// A lease ran out before its release (in its holder's view, on the server, or
    /// before its grant's reply came): its waiters may then sleep until the lease's
    /// bound, by design, as nobody releases.
    pub lapsed: bool,
    /// The clients (a bit each) that a fair script found in line past their deadline
    /// to call again: purged as dead, nobody wakes them, and each calls again on its
    /// timer, by design. Only their own sleep is excused.
    pub purged: u8,
    /// A fair attempt was turned away for the head of the queue (free, another's turn),
    /// or a fair release released, while that head's deadline to call again had passed
    /// (after the script): a dead head not purged.
    pub dead_head: bool,
    /// A waiter fell asleep on an answer for longer than the lease in its way allows
    /// ([`max_wait`]): (the client, the ms it sleeps, the ms allowed).
    pub overslept: Option<(usize, i64, i64)>,
}

/// The world's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The true time since the start, ms.
    pub now_ms: i64,
    /// The lock nodes (one, or Redlock's).
    pub nodes: Vec<Node>,
    /// The fenced resource's server (no faults: it is the thing protected).
    pub resource: Server,
    /// The clients.
    pub clients: Vec<Client>,
    /// What is in flight.
    pub net: Vec<Packet>,
    /// Faults left.
    pub faults_left: u8,
    /// What the properties read.
    pub log: Log,
}

/// A step the checker may take.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client starts an acquire.
    Acquire(usize),
    /// A sleeping client wakes (a message came, or its timer ran out).
    Wake(usize),
    /// The node runs the call at this place in the network.
    Execute(usize),
    /// The reply or message at this place arrives.
    Deliver(usize),
    /// Fault: the reply or message at this place is lost.
    Lose(usize),
    /// A holder writes to the fenced resource.
    Write(usize),
    /// A holder releases.
    Release(usize),
    /// The clock moves by a tick.
    Tick,
    /// The clock moves to the soonest sleeper's timer, sooner than a tick.
    Elapse,
    /// The node's clock runs ahead, at once, by what is left of the drift bound.
    Drift,
    /// Fault: a client crashes.
    Crash(usize),
    /// Fault: the node restarts without persistence.
    Restart(usize),
    /// The node's replica catches up.
    Replicate,
    /// Fault: the node's replica takes over, with what it copied last.
    Failover,
    /// Fault (Redlock): the node runs the attempt's call at this place, and its answer
    /// waits in the network.
    ExecuteLate(usize),
    /// Redlock: the client's node timeout runs out with one answer still on its way:
    /// the verdict without it.
    GiveUp(usize),
    /// Redlock: this node's clock jumps ahead by [`World::skew_ms`].
    Skew(usize),
    /// The client's subscriber connects again to the node (after its restart) and
    /// subscribes again.
    Resubscribe(usize, usize),
    /// A holder's watchdog wakes: it renews the lease, or finds it lost.
    Renew(usize),
}

/// The node number of the fenced resource's server in calls and replies: a store of its
/// own, not a lock node (the library's fenced write goes to a client of the one Redis
/// that keeps the resource, and a Redlock client refuses to make one), so it has no
/// connection generation, no restart and no vote.
pub const RESOURCE_SERVER: usize = usize::MAX;

fn run_id(node: usize, restarts: u8) -> String {
    format!("{node:x}{restarts:x}").repeat(20)
}

/// A fenced write of `value` to the resource's key with `fence` (`fence/write.lua`:
/// the resource, not the lock, so built here).
fn fenced_write(fence: u64, value: &str) -> Call {
    let bytes = |items: &[&str]| items.iter().map(|s| s.as_bytes().to_vec()).collect();
    Call {
        script: "fence/write.lua",
        keys: bytes(&["{resource}:accepted", "{resource}"]),
        argv: bytes(&[&fence.to_string(), "SET", "2", "1", value]),
    }
}

impl Log {
    /// Logs a grant: a grant of a token already logged (a retried acquire's) once.
    fn grant(&mut self, holder: String, fence: u64) {
        if !self.grants.contains(&(holder.clone(), fence)) {
            let top = self.grants.iter().map(|(_, f)| *f).max();
            self.token_fell |= top.is_some_and(|top| fence <= top);
            self.grants.push((holder, fence));
        }
    }
}

impl World {
    /// `kinds.len()` clients, each taking what its kind says `rounds` times on one
    /// server, with no faults.
    pub fn new(name: &'static str, scripts: Scripts, kinds: Vec<Kind>, rounds: u8) -> World {
        World {
            name,
            scripts,
            kinds,
            rounds,
            lease_ms: 1_000,
            tick_ms: 600,
            ticks: 3,
            max_drift_ms: 0,
            fenced_writes: false,
            faults: Faults::default(),
            max_holders: 1,
            nodes: 1,
            quarantine: None,
            held_at_start: false,
            max_attempts: None,
            skew_ms: 0,
            watchdog: false,
        }
    }

    /// Redlock: 2 plain clients, each taking the lock once by a majority of 3 nodes,
    /// with restart protection of one lease (`protected`) or none.
    ///
    /// Three reductions keep it small, each named where it acts: a node's answer
    /// reaches its client as the node runs the call, but for one late answer at most,
    /// a fault ([`Faults::late_answer`], client 0's: the clients are alike), which
    /// waits in the network and comes before the verdict (slow) or after it (the
    /// client's node timeout gave the verdict without it, [`Action::GiveUp`]); a
    /// client's calls run in the order sent, so its attempt asks the nodes in turn, 0,
    /// 1, 2 (every order of the two clients at each node remains, and a restart of each
    /// node), and its next call to a node whose answer is late runs after that answer
    /// came; an acquire makes at most [`REDLOCK_ATTEMPTS`] attempts
    /// ([`World::max_attempts`]).
    ///
    /// Where it departs from the library besides: a restart is instant (no time in
    /// which the node is unreachable); it closes the clients' call connections and their
    /// subscriptions, which each client's dispatcher makes again when it will
    /// ([`Action::Resubscribe`]), then waking its waiter; clock drift on a node is a
    /// jump, once ([`World::skew_ms`]); messages from different nodes reach a client in
    /// the order they were published. A fenced write ([`World::fenced_writes`])
    /// goes, as the library's must, to the resource's own server
    /// ([`RESOURCE_SERVER`]), not to the lock nodes: its reply waits in the network as
    /// with one node.
    pub fn redlock(name: &'static str, scripts: Scripts, protected: bool) -> World {
        let mut world = World::new(name, scripts, vec![Kind::Plain; 2], 1);
        world.nodes = 3;
        world.quarantine = protected.then(|| world.lease());
        world.max_attempts = Some(REDLOCK_ATTEMPTS);
        world
    }

    /// The plain lock: `clients` clients take it `rounds` times each, each writing to a
    /// fenced resource while it holds it.
    pub fn plain(scripts: Scripts, clients: usize, rounds: u8) -> World {
        World {
            fenced_writes: true,
            ..World::new(
                "plain lock, 1 server",
                scripts,
                vec![Kind::Plain; clients],
                rounds,
            )
        }
    }

    /// Whether the world checks [`FALLBACK_BOUND`]: every world (Redlock's pause comes
    /// from several nodes' answers: the soonest refusing lease's, see
    /// `World::redlock_verdict`).
    pub fn checks_fallback(&self) -> bool {
        true
    }

    fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.unsigned_abs())
    }

    /// The library's Redlock rules for this world's clients (`None`: one node).
    fn quorum(&self) -> Option<fencelock::model::Quorum> {
        (self.nodes > 1).then(|| crate::redlock::quorum(self.nodes, self.quarantine))
    }

    /// Sends `call` from client `from` to `node` on its connection there (`attempt`:
    /// the attempt's number, for its answers).
    fn send_to(
        state: &mut State,
        from: usize,
        node: usize,
        purpose: Purpose,
        call: Call,
        attempt: u32,
    ) {
        let via = state.clients[from]
            .seen
            .get(node)
            .map_or((0, 0, 0), |s| (s.conn, s.generation, attempt));
        state.net.push(Packet::Call {
            from,
            node,
            purpose,
            call,
            via,
        });
    }

    /// Sends `call` to every node (every call with one node goes to node 0), or a
    /// fenced write to the resource's server.
    fn send(&self, state: &mut State, from: usize, purpose: Purpose, call: Call) {
        if call.script == "fence/write.lua" {
            return state.net.push(Packet::Call {
                from,
                node: RESOURCE_SERVER,
                purpose,
                call,
                via: (0, 0, 0),
            });
        }
        for node in 0..self.nodes {
            Self::send_to(state, from, node, purpose, call.clone(), 0);
        }
    }

    /// Carries out the engine's commands for client `c` until one waits on the world
    /// (a call in flight, a sleep) or the acquire ends.
    fn drive(&self, state: &mut State, c: usize, mut engine: Acquiring<'static>, first: Command) {
        let now = state.now_ms;
        let mut command = first;
        loop {
            let client = &mut state.clients[c];
            match command {
                Command::Attempt(attempt) => {
                    let tag = client::tag(c);
                    let site = Site {
                        client_tag: &tag,
                        counter_idle: client::COUNTER_IDLE,
                        stays: false,
                    };
                    let Some(q) = self.quorum() else {
                        let call = Call::of(&engine.call(&attempt, &site, false));
                        return self.call_out(state, c, engine, Purpose::Attempt, call);
                    };
                    // Redlock: each node is asked who it is when the library would.
                    let n = engine.attempts();
                    let voters = crate::redlock::voters(&client.seen);
                    let calls: Vec<Call> = voters
                        .iter()
                        .map(|v| Call::of(&engine.call(&attempt, &site, q.identify(v))))
                        .collect();
                    Self::calling(state, c, engine, Purpose::Attempt);
                    for (node, call) in calls.into_iter().enumerate() {
                        Self::send_to(state, c, node, Purpose::Attempt, call, n);
                    }
                    return;
                }
                Command::Subscribe(subscribe) => {
                    // One waiter per client: no other keeps its channels open.
                    if subscribe.only_if_open {
                        command = engine.on(Event::Subscribed(None), client::instant(now));
                        continue;
                    }
                    let req = engine.request();
                    let keys = subscribe
                        .at
                        .and_then(|at| req.protocol.keys_at(at))
                        .unwrap_or(&req.keys);
                    let own = (req.protocol.waiting().own_channel)
                        .then(|| own_channel(keys, &client::tag(c)).into_bytes());
                    let channels = Channels {
                        everywhere: true,
                        own_everywhere: own.is_some(),
                        named_wakes: 0,
                    };
                    client.listens = Some((keys.channel().into_bytes(), own));
                    client.named = 0;
                    command = engine.on(Event::Subscribed(Some(channels)), client::instant(now));
                }
                Command::WaitReplicas { .. } => {
                    unreachable!("the worlds ask for no replicas")
                }
                Command::Sleep { until } => {
                    client.phase = Phase::Asleep {
                        engine,
                        until_ms: client::ms(until),
                    };
                    return;
                }
                Command::Withdraw(undo) => {
                    let req = engine.request();
                    let call = client::release(&*req.protocol, engine.token(), undo, 0);
                    return self.call_out(state, c, engine, Purpose::Withdraw, call);
                }
                Command::Done(done) => {
                    // Its subscriptions go with the acquire (a dispatcher that connects
                    // again subscribes only the channels that still have waiters).
                    client.listens = None;
                    for node in &mut state.nodes {
                        node.unsubscribed.retain(|x| *x != c);
                    }
                    let client = &mut state.clients[c];
                    client.pending = 0;
                    client.handover = None;
                    match done.result {
                        Ok(acquired) => {
                            let fence = acquired.grant.fence.get();
                            client.watch = self
                                .watchdog
                                .then(|| Watch::new(self.lease(), fence, &acquired.grant, now));
                            client.phase = Phase::Holding {
                                token: acquired.token,
                                fence: acquired.grant.fence.get(),
                                until_ms: client::ms(acquired.grant.valid_until) - 1,
                                wrote: !self.fenced_writes,
                            };
                        }
                        Err(_) => {
                            if done.cleanup.withdraw {
                                let req = engine.request();
                                let call = client::release(
                                    &*req.protocol,
                                    engine.token(),
                                    Undo::Withdraw,
                                    0,
                                );
                                self.send(state, c, Purpose::Background, call);
                            }
                            self.next_round(&mut state.clients[c]);
                        }
                    }
                    return;
                }
            }
        }
    }

    /// The engine's call goes out; the wakes delivered so far are marked, for its
    /// answer to use up.
    fn call_out(
        &self,
        state: &mut State,
        c: usize,
        engine: Acquiring<'static>,
        purpose: Purpose,
        call: Call,
    ) {
        Self::calling(state, c, engine, purpose);
        self.send(state, c, purpose, call);
    }

    /// Client `c` waits for its engine's call to be answered.
    fn calling(state: &mut State, c: usize, engine: Acquiring<'static>, purpose: Purpose) {
        let client = &mut state.clients[c];
        client.phase = Phase::Calling {
            engine,
            sent_ms: state.now_ms,
            mark: client.pending,
            purpose,
            votes: Vec::new(),
        };
    }

    fn next_round(&self, client: &mut Client) {
        client.round += 1;
        client.phase = if client.round < self.rounds {
            Phase::Idle
        } else {
            Phase::Done
        };
    }

    /// Runs `call` on lock node `node` (or the resource's server), records what the
    /// properties need, and sends the messages its script published to the clients
    /// subscribed.
    fn run(&self, state: &mut State, node: usize, call: &Call) -> Reply {
        // Subscribed here: not crashed, nor cut off by a restart.
        let cut = |c: &usize| {
            state
                .nodes
                .get(node)
                .is_some_and(|n| n.unsubscribed.contains(c))
        };
        let live: Vec<usize> = (0..state.clients.len())
            .filter(|c| state.clients[*c].phase != Phase::Crashed && !cut(c))
            .collect();
        let to_resource = call.script == "fence/write.lua";
        assert_eq!(
            to_resource,
            node == RESOURCE_SERVER,
            "{} sent to node {node}: fenced writes go to the resource, the rest to lock nodes",
            call.script
        );
        let server = if to_resource {
            &mut state.resource
        } else {
            &mut state.nodes[node].server
        };
        server.subscribers.clear();
        for c in &live {
            if let Some((channel, own)) = &state.clients[*c].listens {
                for ch in std::iter::once(channel).chain(own) {
                    *server.subscribers.entry(ch.clone()).or_default() += 1;
                }
            }
        }
        let first_in_line = first_in_line(server, call.script);
        // A fair waiter past its deadline (paused that long) is purged as dead, and
        // nobody wakes it: it calls again on its timer, by design.
        let purges = if fair(call.script)
            && let Some(q) = FairQueue::read(server)
        {
            (q.line.iter().filter(|w| !q.live(w)))
                .map(|w| client_bit(w))
                .fold(0, |bits, bit| bits | bit)
        } else {
            0
        };
        let script = self.scripts.get(call.script);
        let reply = crate::lua::eval(server, script, &call.keys, &call.argv);
        server.subscribers.clear();
        // A fair attempt turned away for another's turn, or a release that released
        // (handing the lock over, or leaving it free), with a dead head first in line.
        let dead_head = match call.script {
            "lock/fair_acquire.lua" => reply
                .as_array()
                .is_some_and(|r| r.get(1) == Some(&Reply::Int(-2))),
            "lock/fair_release.lua" => reply == Reply::Int(1),
            _ => false,
        } && head_overdue(server);
        let published = server.take_published();
        let mut granted = Vec::new();
        // The scripts that grant: every acquire, the plain first attempt (take.lua,
        // whose bare-integer reply is a grant) and a campaign.
        // (Redlock: a node's grant is a vote; the client's tally logs the grant.)
        let grants = call.script.contains("acquire")
            || matches!(call.script, "lock/take.lua" | "election/campaign.lua");
        if grants
            && self.nodes == 1
            && let Ok(reply) = client::decode(&reply)
            && let fencelock::model::Answer::Granted { fence, .. } = reply.answer
        {
            granted.push((
                String::from_utf8_lossy(&call.argv[0]).into_owned(),
                fence.get(),
            ));
        }
        for Published {
            channel, message, ..
        } in &published
        {
            if let Some((token, h)) = Handover::parse(message) {
                granted.push((String::from_utf8_lossy(token).into_owned(), h.fence));
            }
            for c in &live {
                let listens = state.clients[*c]
                    .listens
                    .as_ref()
                    .is_some_and(|(ch, own)| ch == channel || own.as_ref() == Some(channel));
                if listens {
                    state.net.push(Packet::Message {
                        to: *c,
                        node,
                        channel: channel.clone(),
                        message: message.clone(),
                    });
                }
            }
        }
        let log = &mut state.log;
        log.dead_head |= dead_head;
        log.purged |= purges;
        // A holder's acquire again ({2, fence}: the key held its token already, as a
        // handover left it) is no new grant, whoever is in line.
        let again = call.script == "lock/fair_acquire.lua"
            && reply.as_array().and_then(|r| r.first()) == Some(&Reply::Int(2));
        for (holder, fence) in granted {
            if let Some(first) = &first_in_line
                && *first != holder
                && !again
            {
                log.out_of_turn = true;
            }
            log.grant(holder, fence);
        }
        if call.script == "fence/write.lua"
            && reply.as_array().and_then(|r| r.first()) == Some(&Reply::Int(1))
        {
            let fence = String::from_utf8_lossy(&call.argv[0]).parse().unwrap_or(0);
            log.accepted.push(fence);
        }
        reply
    }

    /// The node runs the call at `at`; `late` (Redlock, an attempt's): its answer waits
    /// in the network rather than reaching its client at once.
    fn execute(&self, state: &mut State, at: usize, late: bool) {
        let Packet::Call {
            from,
            node,
            purpose,
            call,
            via: (conn, generation, attempt),
        } = state.net.remove(at)
        else {
            unreachable!("only calls execute")
        };
        // Redlock: a call sent on a connection the node closed since (it restarted)
        // fails unrun, and its client reconnects.
        let redlock = self.nodes > 1 && node != RESOURCE_SERVER;
        let reply = if redlock && conn != state.nodes[node].restarts {
            None
        } else {
            Some(self.run(state, node, &call))
        };
        let lease_left_ms = (redlock && purpose == Purpose::Attempt && refused(reply.as_ref()))
            .then(|| lease_left(&state.nodes[node].server, &call))
            .flatten();
        if redlock && purpose != Purpose::Background && !late {
            // Redlock: the answer reaches its client at once (see `World::redlock`),
            // unless it is the one late answer.
            let vote = Vote {
                node,
                reply,
                generation,
                at_ms: state.now_ms,
                lease_left_ms,
            };
            self.redlock_reply(state, from, vote, purpose, attempt);
        } else if purpose != Purpose::Background {
            let refusal = purpose == Purpose::Attempt && refused(reply.as_ref());
            let max_wait_ms = (refusal && self.checks_fallback()).then(|| {
                let server = &state.nodes[node].server;
                max_wait(self.kinds[from], server, &call, reply.as_ref())
            });
            state.net.push(Packet::Reply {
                to: from,
                node,
                via: (generation, attempt),
                purpose,
                script: call.script,
                reply,
                max_wait_ms,
                lease_left_ms,
            });
        } else if reply.is_none() {
            Self::reconnect(state, from, node);
        }
    }

    /// Client `c`'s call to `node` failed: its connection there changes (the library
    /// reconnects), to the node as it is now.
    fn reconnect(state: &mut State, c: usize, node: usize) {
        let seen = &mut state.clients[c].seen[node];
        seen.generation += 1;
        seen.conn = state.nodes[node].restarts;
    }

    /// A Redlock node's answer to client `c` arrives: an attempt's is tallied (or, come
    /// after its verdict, recorded as `judge_late` does), a withdrawal or a release
    /// goes on when every node answered.
    fn redlock_reply(&self, state: &mut State, c: usize, vote: Vote, purpose: Purpose, n: u32) {
        let now = state.now_ms;
        let q = self.quorum().expect("Redlock");
        if vote.reply.is_none() {
            Self::reconnect(state, c, vote.node);
        }
        let client = &mut state.clients[c];
        let phase = std::mem::replace(&mut client.phase, Phase::Idle);
        match (purpose, phase) {
            (
                Purpose::Attempt,
                Phase::Calling {
                    engine,
                    sent_ms,
                    mark,
                    purpose: Purpose::Attempt,
                    mut votes,
                },
            ) if n == engine.attempts() => {
                votes.push(vote);
                let lease = self.lease();
                let verdict =
                    crate::redlock::tally(&q, &mut client.seen, &votes, sent_ms, lease, now, false);
                let Some(verdict) = verdict else {
                    client.phase = Phase::Calling {
                        engine,
                        sent_ms,
                        mark,
                        purpose: Purpose::Attempt,
                        votes,
                    };
                    return;
                };
                self.redlock_verdict(state, c, engine, mark, &votes, verdict);
            }
            (Purpose::Attempt, phase) => {
                crate::redlock::late(&q, &mut client.seen, &vote, self.lease());
                client.phase = phase;
            }
            (
                Purpose::Withdraw,
                Phase::Calling {
                    mut engine,
                    sent_ms,
                    mark,
                    purpose: Purpose::Withdraw,
                    mut votes,
                },
            ) => {
                votes.push(vote);
                if votes.len() < self.nodes {
                    client.phase = Phase::Calling {
                        engine,
                        sent_ms,
                        mark,
                        purpose: Purpose::Withdraw,
                        votes,
                    };
                    return;
                }
                // As the library's: done when any node answered.
                let result = if votes.iter().any(|v| v.reply.is_some()) {
                    Ok(())
                } else {
                    Err(fencelock::model::broken(&crate::redlock::addr(0)))
                };
                let command = engine.on(Event::Withdrawn(result), client::instant(now));
                self.drive(state, c, engine, command);
            }
            (Purpose::Release, Phase::Releasing(left)) if left > 1 => {
                client.phase = Phase::Releasing(left - 1);
            }
            (Purpose::Release, Phase::Releasing(_)) => self.next_round(client),
            (_, phase) => client.phase = phase,
        }
    }

    /// Client `c`'s node timeout runs out with an answer still on its way (the late
    /// one): the tally's verdict on the answers it has, the others counted as timed
    /// out; the late answer, when it comes, is judged late.
    fn give_up(&self, state: &mut State, c: usize) {
        let now = state.now_ms;
        let q = self.quorum().expect("Redlock");
        let client = &mut state.clients[c];
        let Phase::Calling {
            engine,
            sent_ms,
            mark,
            purpose: Purpose::Attempt,
            votes,
        } = std::mem::replace(&mut client.phase, Phase::Idle)
        else {
            unreachable!("only an attempt gives up on a node")
        };
        let verdict = crate::redlock::tally(
            &q,
            &mut client.seen,
            &votes,
            sent_ms,
            self.lease(),
            now,
            true,
        )
        .expect("a verdict, timed out");
        self.redlock_verdict(state, c, engine, mark, &votes, verdict);
    }

    /// Client `c`'s Redlock attempt has its verdict (from `votes`): a failed one's
    /// take-back goes to every node, a grant is logged, and the engine goes on. A
    /// waiter that falls asleep on a refusal by a majority is held to the fallback
    /// bound: 1 ms past the soonest end of the refusing leases, as their nodes held
    /// them (the library's `Blocker::sooner` of the refusals), or the retry schedule's
    /// longest pause when that lease ends within a ms, or for any other failure.
    fn redlock_verdict(
        &self,
        state: &mut State,
        c: usize,
        mut engine: Acquiring<'static>,
        mark: u8,
        votes: &[Vote],
        (outcome, take_back): (Result<Outcome, fencelock::Error>, bool),
    ) {
        let now = state.now_ms;
        if outcome.is_ok() {
            let client = &mut state.clients[c];
            client.pending = client.pending.saturating_sub(mark);
        }
        if take_back {
            // Sent before the next attempt, which each node runs after it: to every
            // node, a late one's grant included.
            let req = engine.request();
            let call = client::release(&*req.protocol, engine.token(), Undo::TakeBack, 0);
            self.send(state, c, Purpose::Background, call);
        }
        if let Ok(Outcome::Granted { grant, .. }) = &outcome {
            let holder = engine.token().as_str().to_owned();
            state.log.grant(holder, grant.fence.get());
        }
        let held = matches!(outcome, Ok(Outcome::Held { .. }));
        let command = engine.on(Event::Answered(outcome), client::instant(now));
        if let Command::Sleep { until } = &command
            && self.checks_fallback()
        {
            let soonest = votes.iter().filter_map(|v| v.lease_left_ms).min();
            let allowed = match soonest {
                Some(left) if held && left >= 1 => left + 1,
                _ => RETRY_MAX_MS,
            };
            let sleeps = client::ms(*until) - now;
            if sleeps > allowed && state.log.overslept.is_none() {
                state.log.overslept = Some((c, sleeps, allowed));
            }
        }
        self.drive(state, c, engine, command);
    }

    /// The reply at `at` arrives (`lost`: its connection times out instead).
    fn reply(&self, state: &mut State, at: usize, lost: bool) {
        let Packet::Reply {
            to: c,
            node,
            via: (generation, attempt),
            purpose,
            reply,
            max_wait_ms,
            lease_left_ms,
            ..
        } = state.net.remove(at)
        else {
            unreachable!("a reply")
        };
        let now = state.now_ms;
        if self.nodes > 1 && node != RESOURCE_SERVER {
            let vote = Vote {
                node,
                reply: if lost { None } else { reply },
                generation,
                at_ms: now,
                lease_left_ms,
            };
            return self.redlock_reply(state, c, vote, purpose, attempt);
        }
        let reply = reply.expect("one node, and the resource, answer every call they run");
        if purpose == Purpose::Renew {
            let client = &mut state.clients[c];
            if let Some(watch) = &mut client.watch {
                watch.answered((!lost).then_some(&reply), now);
                Self::holds_until(client, now);
            }
            return;
        }
        let phase = std::mem::replace(&mut state.clients[c].phase, Phase::Idle);
        match (purpose, phase) {
            (
                Purpose::Attempt,
                Phase::Calling {
                    mut engine,
                    sent_ms,
                    mark,
                    ..
                },
            ) => {
                let event = if lost {
                    client::lost()
                } else {
                    let (event, take_back) = client::answered(&reply, sent_ms, self.lease(), now);
                    if take_back {
                        state.log.lapsed = true;
                        // The library takes a late grant back before its next attempt.
                        let req = engine.request();
                        let call =
                            client::release(&*req.protocol, engine.token(), Undo::TakeBack, 0);
                        self.run(state, 0, &call);
                    }
                    event
                };
                if matches!(event, Event::Answered(Ok(_))) {
                    let client = &mut state.clients[c];
                    client.pending = client.pending.saturating_sub(mark);
                }
                let command = engine.on(event, client::instant(now));
                if let Command::Sleep { until } = &command
                    && self.checks_fallback()
                {
                    // Anything but a refusal (a lost reply's timeout, a late grant): the
                    // retry schedule's pause.
                    let allowed = max_wait_ms.filter(|_| !lost).unwrap_or(RETRY_MAX_MS);
                    let sleeps = client::ms(*until) - now;
                    if sleeps > allowed && state.log.overslept.is_none() {
                        state.log.overslept = Some((c, sleeps, allowed));
                    }
                }
                self.drive(state, c, engine, command);
            }
            (Purpose::Withdraw, Phase::Calling { mut engine, .. }) => {
                let result = match (&reply, lost) {
                    (_, true) => Err(fencelock::model::timed_out("model:0")),
                    (Reply::Error(e), _) => Err(fencelock::model::rejected("model:0", e)),
                    _ => Ok(()),
                };
                let command = engine.on(Event::Withdrawn(result), client::instant(now));
                self.drive(state, c, engine, command);
            }
            (
                Purpose::Write,
                Phase::Writing {
                    token,
                    fence,
                    until_ms,
                },
            ) => {
                state.clients[c].phase = Phase::Holding {
                    token,
                    fence,
                    until_ms,
                    wrote: true,
                };
            }
            (Purpose::Release, Phase::Releasing(_)) => self.next_round(&mut state.clients[c]),
            // A crashed client's reply finds nobody.
            (_, phase) => state.clients[c].phase = phase,
        }
    }

    /// The message at `at` reaches its client's subscriber: it wakes the waiter it is
    /// meant for, or, a wake by name whose client has no waiter left, is handed on.
    fn message(&self, state: &mut State, at: usize) {
        let Packet::Message {
            to: c,
            node,
            channel,
            message,
        } = state.net.remove(at)
        else {
            unreachable!("a message")
        };
        let client = &mut state.clients[c];
        let engine = match &client.phase {
            Phase::Calling { engine, .. } | Phase::Asleep { engine, .. } => Some(engine),
            _ => None,
        };
        let listening = client
            .listens
            .as_ref()
            .filter(|(ch, own)| *ch == channel || own.as_ref() == Some(&channel));
        match (engine, listening) {
            (Some(engine), Some((_, own))) => {
                let req = engine.request();
                let (wakes, handover) = client::wakes(&*req.protocol, engine.token(), &message);
                if wakes {
                    client.pending = client.pending.saturating_add(1).min(3);
                    if own.as_ref() == Some(&channel) {
                        client.named += 1;
                    }
                    if let Some(h) = handover {
                        client.handover = Some((h.fence, h.px));
                    }
                }
            }
            _ if message.is_empty() => {
                // Its own channel of a lock (`{x}:released:c0`): handed on.
                let own = String::from_utf8_lossy(&channel);
                for name in [client::NAME, client::SECOND] {
                    let keys = client::keys(name);
                    if own == own_channel(&keys, &client::tag(c)) {
                        let call = Call::of(&hand_on(&keys));
                        Self::send_to(state, c, node, Purpose::Background, call, 0);
                    }
                }
            }
            _ => {}
        }
    }

    /// A sleeping client wakes: the engine's next command.
    fn wake(&self, state: &mut State, c: usize) {
        let now = state.now_ms;
        let client = &mut state.clients[c];
        let Phase::Asleep { mut engine, .. } = std::mem::replace(&mut client.phase, Phase::Idle)
        else {
            unreachable!("only a sleeper wakes")
        };
        let by = if client.pending > 0 || client.handover.is_some() {
            WokenBy::Notification
        } else {
            WokenBy::Timer
        };
        client.pending = 0;
        let woken = Woken {
            by,
            named_wakes: client.named,
            handover: client
                .handover
                .take()
                .map(|(fence, px)| Handover { fence, px }),
        };
        let command = engine.on(Event::Woken(woken), client::instant(now));
        self.drive(state, c, engine, command);
    }

    fn advance(state: &mut State, ms: i64) {
        let lock = client::keys(client::NAME).lock.into_bytes();
        // Per node: a lease that ran out on any node.
        let held = |state: &State| -> Vec<bool> {
            (state.nodes.iter())
                .map(|n| n.server.entries().any(|(k, _)| *k == lock))
                .collect()
        };
        let was_held = held(state);
        state.now_ms += ms;
        let now = state.now_ms;
        state.log.lapsed |= state.clients.iter().any(|c| {
            matches!(c.phase, Phase::Holding { until_ms, .. } | Phase::Writing { until_ms, .. } if until_ms <= now)
        });
        for node in &mut state.nodes {
            node.server.advance_us(ms * 1000);
            node.replica.advance_us(ms * 1000);
        }
        state.resource.advance_us(ms * 1000);
        let is_held = held(state);
        state.log.lapsed |= was_held.iter().zip(is_held).any(|(was, is)| *was && !is);
    }

    /// Client `c`'s watchdog wakes: it sends the renewal of the lease, or finds it lost.
    fn renew(&self, state: &mut State, c: usize) {
        let now = state.now_ms;
        let protocol = self.kinds[c].protocol(c);
        let client = &mut state.clients[c];
        let (Some(watch), Phase::Holding { token, .. } | Phase::Writing { token, .. }) =
            (&mut client.watch, &client.phase)
        else {
            unreachable!("a holder's watchdog")
        };
        let key = client::keys(client::NAME).lock;
        match watch.act(&key, &protocol.holder_id(token), now) {
            Some(Acted::Renew(call)) => self.send(state, c, Purpose::Renew, call),
            Some(Acted::Lost) => Self::holds_until(client, now),
            None => {}
        }
    }

    /// A renewing holder's lease ends where its watchdog says (by its own count; now,
    /// once the loss signal fired).
    fn holds_until(client: &mut Client, now: i64) {
        let Some(watch) = &client.watch else { return };
        let end = watch.until_ms(now);
        if let Phase::Holding { until_ms, .. } | Phase::Writing { until_ms, .. } = &mut client.phase
        {
            *until_ms = end;
        }
    }

    /// The horizon: the clock stops here.
    fn horizon(&self) -> i64 {
        i64::from(self.ticks) * self.tick_ms
    }

    /// The soonest sleeper's timer, if it ends after now and before the next tick.
    fn next_timer(&self, state: &State) -> Option<i64> {
        state
            .clients
            .iter()
            .filter_map(|c| match c.phase {
                Phase::Asleep { until_ms, .. } => Some(until_ms),
                _ => watchdog_due(c),
            })
            .filter(|t| *t > state.now_ms && *t < state.now_ms + self.tick_ms)
            .filter(|t| *t <= self.horizon())
            .min()
    }
}

/// Redlock: whether the call or message at `at` is its client's first in the network.
/// A client's calls run in the order sent, the nodes in turn (the library's go out at
/// once, one connection per node, each in order: so a take-back runs before the next
/// attempt and a release after the acquire; that the nodes answer in one order is
/// the reduction that keeps the world small, see `World::redlock`), and the messages
/// to it arrive in the order published.
fn first_on_its_connection(state: &State, at: usize) -> bool {
    // The resource's server is reached on a connection of its own.
    let key = |p: &Packet| match p {
        Packet::Call { from, node, .. } => (usize::from(*node == RESOURCE_SERVER), *from),
        Packet::Reply { to, .. } => (2, *to),
        Packet::Message { to, .. } => (3, *to),
    };
    let mine = key(&state.net[at]);
    !state.net[..at].iter().any(|p| key(p) == mine)
}

/// Redlock: a node that keeps a client's key while that client neither attempts, holds
/// nor has a call on its way there ([`NO_STRAY_GRANT`]): (node, client).
pub fn stray_grant(state: &State) -> Option<(usize, usize)> {
    let lock = client::keys(client::NAME).lock.into_bytes();
    (state.nodes.iter().enumerate()).find_map(|(i, node)| {
        let Some(Entry {
            value: Value::Str(holder),
            ..
        }) = node.server.entry(&lock)
        else {
            return None;
        };
        let c = (0..state.clients.len()).find(|c| {
            (0..=state.clients[*c].round)
                .any(|r| client::token(*c, r).as_str().as_bytes() == holder)
        })?;
        let mine = |token: &HolderToken| token.as_str().as_bytes() == holder;
        let accounted = match &state.clients[c].phase {
            Phase::Crashed | Phase::Releasing(_) => true,
            Phase::Calling { engine, .. } => mine(engine.token()),
            Phase::Holding { token, .. } | Phase::Writing { token, .. } => mine(token),
            _ => false,
        } || state
            .net
            .iter()
            .any(|p| matches!(p, Packet::Call { from, node, .. } if *from == c && *node == i));
        (!accounted).then_some((i, c))
    })
}

/// Redlock: whether an answer of `node` to client `c` is still on its way (the late
/// one): the client's next call there runs after it comes, as a connection answers in
/// order (a call's answer reaches its client as the node runs it, see `World::redlock`).
fn answer_due(state: &State, c: usize, node: usize) -> bool {
    (state.net.iter())
        .any(|p| matches!(p, Packet::Reply { to, node: n, .. } if *to == c && *n == node))
}

/// Redlock: whether client `c`'s attempt has every answer in but one, which waits in
/// the network (the late one): its node timeout may run out first.
fn late_only(state: &State, c: usize) -> bool {
    let Phase::Calling {
        engine,
        purpose: Purpose::Attempt,
        votes,
        ..
    } = &state.clients[c].phase
    else {
        return false;
    };
    let waiting = |p: &Packet| {
        matches!(p, Packet::Reply { to, purpose: Purpose::Attempt, via: (_, n), .. }
            if *to == c && *n == engine.attempts())
    };
    votes.len() + 1 == state.nodes.len() && state.net.iter().any(waiting)
}

/// A fair lock's queue as its keys hold it.
struct FairQueue {
    /// The waiters, in line.
    line: Vec<Bytes>,
    /// Each waiter's deadline to call again (server ms).
    deadlines: Vec<(Bytes, f64)>,
    /// The server's time (ms).
    now: f64,
}

impl FairQueue {
    /// The queue of the lock on `server` (`None` while nobody waits).
    fn read(server: &Server) -> Option<FairQueue> {
        let keys = client::keys(client::NAME);
        let get = |key: String| {
            let key = key.into_bytes();
            server
                .entries()
                .find(|(k, _)| **k == key)
                .map(|(_, e)| e.value.clone())
        };
        let (Some(Value::List(line)), Some(Value::ZSet(deadlines))) =
            (get(keys.queue()), get(keys.waiters()))
        else {
            return None;
        };
        Some(FairQueue {
            line: line.into_iter().collect(),
            deadlines: deadlines.into_iter().map(|(w, d)| (w, d.0)).collect(),
            now: server.now_ms() as f64,
        })
    }

    /// Whether `waiter`'s deadline has not passed.
    fn live(&self, waiter: &Bytes) -> bool {
        self.deadlines
            .iter()
            .any(|(w, d)| w == waiter && *d > self.now)
    }
}

/// The first waiter of a fair lock's queue whose deadline has not passed, when `script`
/// is one of the fair lock's that may grant (`None`: nobody is in line).
fn first_in_line(server: &Server, script: &str) -> Option<String> {
    if !fair(script) {
        return None;
    }
    let queue = FairQueue::read(server)?;
    queue
        .line
        .iter()
        .find(|w| queue.live(w))
        .map(|w| String::from_utf8_lossy(w).into_owned())
}

/// Whether `script` is one of the fair lock's that may grant (and purge).
fn fair(script: &str) -> bool {
    matches!(script, "lock/fair_acquire.lua" | "lock/fair_release.lua")
}

/// Whether the head of a fair lock's queue is past its deadline to call again (or has
/// none): a waiter the scripts must purge as dead before they make anyone wait for it.
fn head_overdue(server: &Server) -> bool {
    FairQueue::read(server).is_some_and(|q| q.line.first().is_some_and(|head| !q.live(head)))
}

impl Model for World {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let mut nodes: Vec<Node> = (0..self.nodes)
            .map(|i| {
                let mut server = Server::new(EPOCH_US, run_id(i, 0));
                if self.nodes > 1 {
                    // Up for a while: no quarantine at the start.
                    server.started_us -= REDLOCK_UPTIME_US;
                }
                Node {
                    replica: server.clone(),
                    server,
                    drift_ms: 0,
                    restarts: 0,
                    unsubscribed: Vec::new(),
                }
            })
            .collect();
        if self.held_at_start {
            let lock = client::keys(client::NAME).lock.into_bytes();
            let px = self.lease_ms.to_string().into_bytes();
            let args = [b"SET".to_vec(), lock, b"gone".to_vec(), b"PX".to_vec(), px];
            let reply = nodes[0].server.call(&args);
            assert_eq!(reply, Reply::Status("OK".into()), "the held lock's SET");
            nodes[0].replica = nodes[0].server.clone();
        }
        // Redlock: each client asked each node who it is when it connected.
        let who: Vec<(String, Duration)> = if self.nodes > 1 {
            let uptime = Duration::from_micros(REDLOCK_UPTIME_US.unsigned_abs());
            (nodes.iter().map(|n| (n.server.run_id.clone(), uptime))).collect()
        } else {
            Vec::new()
        };
        vec![State {
            now_ms: 0,
            nodes,
            resource: Server::new(EPOCH_US, run_id(0xf, 0)),
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    round: 0,
                    listens: None,
                    pending: 0,
                    named: 0,
                    handover: None,
                    seen: crate::redlock::connect(&who, 0),
                    watch: None,
                };
                self.kinds.len()
            ],
            net: Vec::new(),
            faults_left: self.faults.budget,
            log: Log {
                // The lease held at the start runs out unreleased.
                lapsed: self.held_at_start,
                ..Log::default()
            },
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (c, client) in state.clients.iter().enumerate() {
            match &client.phase {
                Phase::Idle => actions.push(Action::Acquire(c)),
                Phase::Asleep { until_ms, .. }
                    if client.pending > 0
                        || client.handover.is_some()
                        || state.now_ms >= *until_ms =>
                {
                    actions.push(Action::Wake(c));
                }
                Phase::Holding {
                    wrote: false,
                    until_ms,
                    ..
                } if state.now_ms < *until_ms => actions.push(Action::Write(c)),
                Phase::Holding { wrote: true, .. } => actions.push(Action::Release(c)),
                _ => {}
            }
            if watchdog_due(client).is_some_and(|due| due <= state.now_ms) {
                actions.push(Action::Renew(c));
            }
            let alive = !matches!(client.phase, Phase::Crashed | Phase::Done);
            if self.faults.crash && state.faults_left > 0 && alive {
                actions.push(Action::Crash(c));
            }
        }
        for (at, packet) in state.net.iter().enumerate() {
            if self.nodes > 1 && !first_on_its_connection(state, at) {
                continue;
            }
            match packet {
                Packet::Call { from, node, .. }
                    if self.nodes > 1 && answer_due(state, *from, *node) => {}
                Packet::Call {
                    from,
                    node,
                    purpose,
                    ..
                } => {
                    actions.push(Action::Execute(at));
                    // Client 0's: the clients are alike, so client 1's late answer is
                    // its mirror image.
                    if self.faults.late_answer
                        && *from == 0
                        && state.faults_left > 0
                        && *purpose == Purpose::Attempt
                        && *node != RESOURCE_SERVER
                    {
                        actions.push(Action::ExecuteLate(at));
                    }
                }
                Packet::Reply { purpose, .. } => {
                    actions.push(Action::Deliver(at));
                    let renewal = *purpose == Purpose::Renew;
                    let lost = self.faults.lost_reply || (renewal && self.faults.lost_renewal);
                    if lost && state.faults_left > 0 {
                        actions.push(Action::Lose(at));
                    }
                }
                Packet::Message { .. } => {
                    actions.push(Action::Deliver(at));
                    if self.faults.lost_message && state.faults_left > 0 {
                        actions.push(Action::Lose(at));
                    }
                }
            }
        }
        for (i, node) in state.nodes.iter().enumerate() {
            actions.extend(node.unsubscribed.iter().map(|c| Action::Resubscribe(*c, i)));
        }
        if self.skew_ms > 0 && state.nodes.iter().all(|n| n.drift_ms == 0) {
            actions.extend((0..self.nodes).map(Action::Skew));
        }
        if self.faults.late_answer {
            actions.extend(
                (0..state.clients.len())
                    .filter(|c| late_only(state, *c))
                    .map(Action::GiveUp),
            );
        }
        if state.now_ms + self.tick_ms <= self.horizon() {
            actions.push(Action::Tick);
        }
        if self.next_timer(state).is_some() {
            actions.push(Action::Elapse);
        }
        let node = &state.nodes[0];
        if node.drift_ms < self.max_drift_ms {
            actions.push(Action::Drift);
        }
        if state.faults_left > 0 && self.faults.restart {
            actions.extend((0..self.nodes).map(Action::Restart));
        }
        if self.faults.failover {
            if node.replica.entries().ne(node.server.entries()) {
                actions.push(Action::Replicate);
            }
            if state.faults_left > 0 {
                actions.push(Action::Failover);
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let now = state.now_ms;
        match action {
            Action::Acquire(c) => {
                let client = &state.clients[c];
                let (kind, lease, renew) = (self.kinds[c], self.lease(), self.watchdog);
                let mut engine = client::acquire_with(kind, c, client.round, lease, now, renew);
                let command = engine.start(client::instant(now));
                self.drive(&mut state, c, engine, command);
            }
            Action::Wake(c) => self.wake(&mut state, c),
            Action::Execute(at) => self.execute(&mut state, at, false),
            Action::ExecuteLate(at) => {
                state.faults_left -= 1;
                self.execute(&mut state, at, true);
            }
            Action::GiveUp(c) => self.give_up(&mut state, c),
            Action::Skew(i) => {
                let node = &mut state.nodes[i];
                node.drift_ms += self.skew_ms;
                node.server.advance_us(self.skew_ms * 1000);
            }
            Action::Deliver(at) => match state.net[at] {
                Packet::Reply { .. } => self.reply(&mut state, at, false),
                _ => self.message(&mut state, at),
            },
            Action::Lose(at) => {
                state.faults_left -= 1;
                match state.net[at] {
                    Packet::Reply { .. } => self.reply(&mut state, at, true),
                    _ => {
                        state.net.remove(at);
                    }
                }
            }
            Action::Write(c) => {
                let Phase::Holding {
                    token,
                    fence,
                    until_ms,
                    ..
                } = state.clients[c].phase.clone()
                else {
                    return None;
                };
                let call = fenced_write(fence, &client::tag(c));
                self.send(&mut state, c, Purpose::Write, call);
                state.clients[c].phase = Phase::Writing {
                    token,
                    fence,
                    until_ms,
                };
            }
            Action::Release(c) => {
                let Phase::Holding { token, .. } = state.clients[c].phase.clone() else {
                    return None;
                };
                // The guard's release stops its renewal first.
                state.clients[c].watch = None;
                let protocol = self.kinds[c].protocol(c);
                // Redlock raises every node's counter to the grant's token.
                let Phase::Holding { fence, .. } = state.clients[c].phase else {
                    unreachable!("a holder")
                };
                let raise = if self.nodes > 1 { fence } else { 0 };
                let call = client::release(&*protocol, &token, Undo::Release, raise);
                self.send(&mut state, c, Purpose::Release, call);
                state.clients[c].phase = Phase::Releasing(self.nodes as u8);
            }
            Action::Tick => Self::advance(&mut state, self.tick_ms),
            Action::Elapse => {
                let until = self.next_timer(&state)?;
                Self::advance(&mut state, until - now);
            }
            Action::Drift => {
                let node = &mut state.nodes[0];
                let step = self.max_drift_ms - node.drift_ms;
                node.drift_ms += step;
                node.server.advance_us(step * 1000);
            }
            Action::Crash(c) => {
                state.faults_left -= 1;
                let client = &mut state.clients[c];
                client.phase = Phase::Crashed;
                client.listens = None;
                client.watch = None;
            }
            Action::Renew(c) => self.renew(&mut state, c),
            Action::Restart(i) => {
                // Its clock goes on; its keys, run id and uptime start afresh.
                state.faults_left -= 1;
                let node = &mut state.nodes[i];
                node.restarts += 1;
                node.server.wipe(run_id(i, node.restarts));
                node.replica = node.server.clone();
                // It closes the subscribers' connections too: each client's dispatcher
                // subscribes again ([`Action::Resubscribe`]).
                let listening = state.clients.iter().enumerate();
                let cut = listening
                    .filter(|(_, c)| c.listens.is_some())
                    .map(|(c, _)| c);
                node.unsubscribed = cut.collect();
            }
            Action::Resubscribe(c, i) => {
                // As the library's dispatcher: subscribed again, it wakes its waiters, as
                // messages may have been missed meanwhile.
                state.nodes[i].unsubscribed.retain(|x| *x != c);
                let client = &mut state.clients[c];
                let waiting = matches!(client.phase, Phase::Calling { .. } | Phase::Asleep { .. });
                if waiting && client.listens.is_some() {
                    client.pending = client.pending.saturating_add(1).min(3);
                }
            }
            Action::Replicate => {
                let node = &mut state.nodes[0];
                let copy = node.server.clone();
                node.replica.replace_keys_from(&copy);
            }
            Action::Failover => {
                state.faults_left -= 1;
                let node = &mut state.nodes[0];
                let replica = node.replica.clone();
                node.server.replace_keys_from(&replica);
                node.restarts += 1;
                node.server.run_id = run_id(0, node.restarts);
            }
        }
        Some(state)
    }

    fn within_boundary(&self, state: &State) -> bool {
        let Some(max) = self.max_attempts else {
            return true;
        };
        state.clients.iter().all(|c| match &c.phase {
            Phase::Calling { engine, .. } | Phase::Asleep { engine, .. } => {
                engine.attempts() <= max
            }
            _ => true,
        })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut out = vec![
            Property::always(ONE_HOLDER, |world: &World, state: &State| {
                let (owners, sharers) = holders(world, state);
                owners.len() <= world.max_holders && (owners.is_empty() || sharers.is_empty())
            }),
            Property::always(TOKENS_RISE, |_, state: &State| !state.log.token_fell),
            Property::always(RESOURCE, |_, state: &State| {
                state.log.accepted.windows(2).all(|w| w[0] <= w[1])
            }),
            Property::always(FAIR_ORDER, |_, state: &State| !state.log.out_of_turn),
            Property::always(DEAD_HEAD, |_, state: &State| !state.log.dead_head),
            Property::sometimes(HELD, |world: &World, state: &State| {
                let (owners, sharers) = holders(world, state);
                !owners.is_empty() || !sharers.is_empty()
            }),
        ];
        if self.checks_fallback() {
            out.push(Property::always(FALLBACK_BOUND, |_, state: &State| {
                state.log.overslept.is_none()
            }));
        }
        if self.nodes > 1 {
            out.push(Property::always(NO_STRAY_GRANT, |_, state: &State| {
                stray_grant(state).is_none()
            }));
        }
        if !self.faults.delay_wakes() {
            out.push(Property::always(NO_LOST_WAKEUP, |_, state: &State| {
                !stranded(state) || state.log.lapsed || excused(state)
            }));
        }
        out
    }
}

/// At most one holder with an unexpired lease (N for a semaphore, readers aside).
pub const ONE_HOLDER: &str = "at most one holder with an unexpired lease";
/// Each grant's fencing token is above every earlier one's.
pub const TOKENS_RISE: &str = "fencing tokens strictly increase";
/// The fenced resource never takes a token lower than one it took.
pub const RESOURCE: &str = "the resource accepts no lower token";
/// A fair lock grants to the first live waiter of its queue.
pub const FAIR_ORDER: &str = "a fair lock grants in queue order";
/// A fair attempt is never turned away for a head of the queue whose deadline to call
/// again passed (crashed, or paused that long), and a fair release never leaves one
/// first in line: the script purges it first.
pub const DEAD_HEAD: &str = "no fair waiter waits on a head past its deadline";
/// No waiter is left asleep on its timer alone while nothing is in flight (a lost
/// wake-up, or a deadlock), as long as every lease ended by its release: checked in the
/// worlds without faults.
pub const NO_LOST_WAKEUP: &str = "no waiter left asleep with nothing in flight";
/// A refused waiter's timer, the fallback when its wake-up message is lost (or its
/// holder crashed), ends no later than the lease in its way allows ([`max_wait`]):
/// checked in every world of one node, faults included.
pub const FALLBACK_BOUND: &str = "no refused waiter sleeps past the lease in its way";
/// Redlock: no node keeps a client's key unless that client's acquire is under way
/// with it (its attempt's answers not all in), it holds with it (or releases), or a
/// call of its is on its way to that node (a take-back, a withdrawal, a release): a
/// failed attempt's grants, a late one's included, are taken back on every node.
pub const NO_STRAY_GRANT: &str = "no Redlock node keeps a failed attempt's grant";

/// The reachability check beside the safety properties: some state has a holder (a
/// world where nobody ever gets the lock passes every safety property vacuously).
pub const HELD: &str = "a client holds the lock";

/// The clients that hold with a lease unexpired by their own count: those that own the
/// lock (or a permit), and readers.
pub fn holders(world: &World, state: &State) -> (Vec<usize>, Vec<usize>) {
    let (mut owners, mut sharers) = (Vec::new(), Vec::new());
    for (i, c) in state.clients.iter().enumerate() {
        let holds = match &c.phase {
            Phase::Holding { until_ms, .. } | Phase::Writing { until_ms, .. } => {
                state.now_ms < *until_ms
            }
            _ => false,
        };
        if holds {
            if world.kinds[i].shares() {
                sharers.push(i);
            } else {
                owners.push(i);
            }
        }
    }
    (owners, sharers)
}

/// The retry schedule's longest pause (the library's default, 100 ms): a waiter whose
/// timer ends sooner is trying again anyway (after a node error, a late grant).
const RETRY_MAX_MS: i64 = 100;

/// Whether an attempt's reply is a refusal (the lock held, or another's turn).
fn refused(reply: Option<&Reply>) -> bool {
    reply
        .and_then(|r| client::decode(r).ok())
        .is_some_and(|r| matches!(r.answer, fencelock::model::Answer::Held(_)))
}

/// The longest a waiter of `kind` may sleep on the answer to its attempt `call`, ms,
/// by the library's rule applied to what the node's keyspace holds after the script
/// ran (not to what the reply says): 1 ms past the end of the lease in its way (the
/// lock key's expiry; a semaphore's first permit to end, or a read-write lock's first
/// reader's, by the scores of the lock key's set; a reader's: the writer's key, else
/// the first waiting writer's deadline), or the retry schedule's longest pause where
/// the lease in the way ends within a ms or never; for a fair waiter in line, at most
/// a third of what is left to its own deadline to call again (the place it keeps),
/// and only that when nothing holds the lock (another waiter's turn).
pub fn max_wait(kind: Kind, server: &Server, call: &Call, reply: Option<&Reply>) -> i64 {
    let now = server.now_ms();
    // ms until the first finite score of a set (a permit's or a reader's lease end, a
    // waiting writer's deadline; a readers' mark scores +inf).
    let first_end = |key: &[u8]| {
        let set = server.entry(key)?.value.as_zset()?;
        let first = set.values().map(|s| s.0).filter(|s| s.is_finite());
        first.reduce(f64::min).map(|end| Some(end as i64 - now))
    };
    let key = |i: usize| call.keys.get(i).map_or(&[][..], Vec::as_slice);
    // The lock key in the way: a multi-lock's refusal `{7, ms, place}` names the place
    // of its name (from 1), whose keys come 3 to a name (4 when its client is listed).
    let lock = match kind {
        Kind::Multi => {
            let place = reply
                .and_then(Reply::as_array)
                .and_then(|r| match r.get(2) {
                    Some(Reply::Int(place)) => usize::try_from(*place).ok(),
                    _ => None,
                })
                .unwrap_or(1);
            let listed = call.argv.get(5).is_some_and(|tag| !tag.is_empty());
            (place.saturating_sub(1)) * if listed { 4 } else { 3 }
        }
        _ => 0,
    };
    // The lease in the way: Some(None) for a key without expiry.
    let in_the_way: Option<Option<i64>> = match server.entry(key(lock)) {
        Some(
            entry @ Entry {
                value: Value::Str(_) | Value::Hash(_),
                ..
            },
        ) => Some(entry.expires_ms.map(|end| end - now)),
        _ if kind == Kind::Read => first_end(key(2)),
        Some(_) => first_end(key(lock)),
        None => None,
    };
    let lease = in_the_way.map(|left| match left {
        Some(left) if left >= 1 => left + 1,
        _ => RETRY_MAX_MS,
    });
    // A fair waiter's deadline to call again (its waiters set, KEYS[4]).
    let keep = match kind {
        Kind::Fair(_) => server
            .entry(key(3))
            .and_then(|e| e.value.as_zset())
            .and_then(|set| set.get(call.argv.first()?))
            .map(|deadline| (deadline.0 as i64 - now) / 3),
        _ => None,
    };
    match (lease, keep) {
        (Some(lease), Some(keep)) => lease.min(keep),
        (lease, keep) => lease.or(keep).unwrap_or(RETRY_MAX_MS),
    }
}

/// A plain lock's lease left on `server` after `call` ran (ms; `None`: no key, or no
/// expiry): what a Redlock node's refusal says to wait for, by the keyspace.
fn lease_left(server: &Server, call: &Call) -> Option<i64> {
    let key = call.keys.first()?;
    let end = server.entry(key)?.expires_ms?;
    Some(end - server.now_ms())
}

/// When a holder's watchdog acts next (true ms), while it holds.
fn watchdog_due(client: &Client) -> Option<i64> {
    match client.phase {
        Phase::Holding { .. } | Phase::Writing { .. } => client.watch.as_ref()?.due_ms(),
        _ => None,
    }
}

/// Whether every client still at work sleeps on a timer longer than a retry's, with no
/// message or reply on its way and no wake waiting: nobody holds, so a release (or a
/// deadlock) left them asleep until a lease bound.
pub fn stranded(state: &State) -> bool {
    let mut working = state
        .clients
        .iter()
        .filter(|c| !matches!(c.phase, Phase::Done | Phase::Crashed))
        .peekable();
    state.net.is_empty() && working.peek().is_some() && working.all(|c| {
        matches!(c.phase, Phase::Asleep { until_ms, .. } if until_ms > state.now_ms + RETRY_MAX_MS)
            && c.pending == 0
            && c.handover.is_none()
    })
}

/// Whether every client asleep in a [`stranded`] state is one a fair script purged
/// (`Log::purged`): it calls again on its timer, by design.
fn excused(state: &State) -> bool {
    (state.clients.iter().enumerate())
        .filter(|(_, c)| matches!(c.phase, Phase::Asleep { .. }))
        .all(|(i, _)| state.log.purged & (1 << i) != 0)
}

/// The bit of the client whose holder token is `token` (`c{client}r{round}`).
fn client_bit(token: &[u8]) -> u8 {
    let digits = token.get(1..).unwrap_or_default();
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    std::str::from_utf8(&digits[..end])
        .ok()
        .and_then(|d| d.parse::<u32>().ok())
        .map_or(0, |c| 1u8.checked_shl(c).unwrap_or(0))
}

/// A state, readably: the clock, each client, each node's keys (with their TTLs), the
/// resource's, and what is in flight.
pub fn describe(state: &State) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "    clock: +{} ms", state.now_ms);
    for (i, c) in state.clients.iter().enumerate() {
        let _ = writeln!(
            out,
            "    client {i}: {:?} (round {}, wakes pending {}, handover {:?})",
            c.phase, c.round, c.pending, c.handover
        );
        if let Some(watch) = &c.watch {
            let _ = writeln!(out, "      its watchdog: {}", watch.describe());
        }
    }
    for (i, node) in state.nodes.iter().enumerate() {
        let _ = writeln!(
            out,
            "    node {i} (run {}, clock +{} ms): {}",
            &node.server.run_id[..4],
            node.drift_ms,
            keys(&node.server)
        );
    }
    let _ = writeln!(out, "    resource: {}", keys(&state.resource));
    if let Some((c, sleeps, allowed)) = state.log.overslept {
        let _ = writeln!(
            out,
            "    OVERSLEPT: client {c} sleeps {sleeps} ms on its answer; the lease in its way allows {allowed} ms"
        );
    }
    for p in &state.net {
        let _ = writeln!(out, "    in flight: {}", packet(p));
    }
    out
}

fn keys(server: &Server) -> String {
    let now = server.now_ms();
    let items: Vec<String> = server
        .entries()
        .map(|(k, e)| {
            let ttl = e
                .expires_ms
                .map_or(String::new(), |end| format!(" (ttl {} ms)", end - now));
            format!("{} = {}{ttl}", String::from_utf8_lossy(k), value(&e.value))
        })
        .collect();
    if items.is_empty() {
        "(empty)".into()
    } else {
        items.join("; ")
    }
}

fn value(v: &Value) -> String {
    let t = |b: &Bytes| format!("{:?}", String::from_utf8_lossy(b));
    match v {
        Value::Str(s) => t(s),
        Value::Hash(h) => {
            let items: Vec<String> = h
                .iter()
                .map(|(f, x)| format!("{}: {}", t(f), t(x)))
                .collect();
            format!("hash {{{}}}", items.join(", "))
        }
        Value::ZSet(z) => {
            let items: Vec<String> = z.iter().map(|(m, s)| format!("{} {}", t(m), s.0)).collect();
            format!("zset {{{}}}", items.join(", "))
        }
        Value::List(l) => format!("list [{}]", l.iter().map(t).collect::<Vec<_>>().join(", ")),
        Value::Stream(entries, _) => format!("stream of {} entries", entries.len()),
    }
}

/// A node in reports: `node N`, or the resource's server.
fn server(node: usize) -> String {
    if node == RESOURCE_SERVER {
        "resource".into()
    } else {
        format!("node {node}")
    }
}

fn packet(p: &Packet) -> String {
    let text = |b: &[Bytes]| {
        b.iter()
            .map(|x| format!("{:?}", String::from_utf8_lossy(x)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    match p {
        Packet::Call {
            from, node, call, ..
        } => format!(
            "client {from} -> {}: {} KEYS {} ARGV {}",
            server(*node),
            call.script,
            text(&call.keys),
            text(&call.argv)
        ),
        Packet::Reply {
            to,
            node,
            script,
            reply,
            max_wait_ms,
            ..
        } => match (reply, max_wait_ms) {
            (Some(reply), Some(max)) => format!(
                "{} -> client {to}: {script} answered {reply} (by the keyspace, a wait of at most {max} ms)",
                server(*node)
            ),
            (Some(reply), None) => format!(
                "{} -> client {to}: {script} answered {reply}",
                server(*node)
            ),
            (None, _) => format!(
                "{} -> client {to}: {script}: the connection closed",
                server(*node)
            ),
        },
        Packet::Message {
            to,
            node,
            channel,
            message,
        } => format!(
            "message from node {node} -> client {to} on {}: {:?}",
            String::from_utf8_lossy(channel),
            String::from_utf8_lossy(message)
        ),
    }
}

/// A counterexample, step by step: each action (what it carried) and the state after.
pub fn trace(path: stateright::Path<State, Action>) -> String {
    let mut out = String::new();
    let steps = path.into_vec();
    for (i, (state, action)) in steps.iter().enumerate() {
        if i == 0 {
            let _ = writeln!(out, "  start:\n{}", describe(state));
        }
        if let Some(action) = action {
            let next = &steps[i + 1].0;
            let _ = writeln!(out, "  step {}: {}", i + 1, explain(state, action));
            let _ = write!(out, "{}", describe(next));
        }
    }
    out
}

fn explain(state: &State, action: &Action) -> String {
    match action {
        Action::Execute(at) | Action::Deliver(at) | Action::Lose(at) => {
            let verb = match action {
                Action::Execute(_) => "executes",
                Action::Deliver(_) => "delivers",
                _ => "LOSES",
            };
            format!("{verb} {}", packet(&state.net[*at]))
        }
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A multi-lock refused by its second name is bound by that name's lease, not the
    /// first's (the world's clients always find the first held, so it is shown here).
    #[test]
    fn a_multi_lock_refusal_is_bound_by_the_name_it_names() {
        let mut server = Server::new(EPOCH_US, "run");
        let set = |server: &mut Server, key: &str, ms: &str| {
            let args = ["SET", key, "holder", "PX", ms].map(|a| a.as_bytes().to_vec());
            server.call(&args);
        };
        set(&mut server, "{x}", "900");
        set(&mut server, "{y}", "300");
        let bytes = |items: &[&str]| items.iter().map(|i| i.as_bytes().to_vec()).collect();
        let call = |listed: bool| Call {
            script: "lock/multi_acquire.lua",
            keys: if listed {
                bytes(&[
                    "{x}",
                    "{x}:fence",
                    "{x}:holder",
                    "{x}:wakes",
                    "{y}",
                    "{y}:fence",
                ])
            } else {
                bytes(&[
                    "{x}",
                    "{x}:fence",
                    "{x}:holder",
                    "{y}",
                    "{y}:fence",
                    "{y}:holder",
                ])
            },
            argv: bytes(&["t", "1000", "0", "", "0", if listed { "c1" } else { "" }]),
        };
        let refused_at =
            |place: i64| Reply::Array(Some(vec![Reply::Int(7), Reply::Int(0), Reply::Int(place)]));
        for listed in [false, true] {
            let wait = |place| {
                max_wait(
                    Kind::Multi,
                    &server,
                    &call(listed),
                    Some(&refused_at(place)),
                )
            };
            assert_eq!(wait(1), 901, "listed: {listed}");
            assert_eq!(wait(2), 301, "listed: {listed}");
        }
    }

    #[test]
    fn a_purged_waiter_is_known_by_its_token() {
        assert_eq!(client_bit(b"c0r0"), 1);
        assert_eq!(client_bit(b"c2r1"), 4);
        assert_eq!(client_bit(b"c7r0"), 128);
        // Not a client's token: excuses nobody.
        assert_eq!(client_bit(b"c9r0"), 0);
        assert_eq!(client_bit(b"x"), 0);
        assert_eq!(client_bit(b""), 0);
    }
}
