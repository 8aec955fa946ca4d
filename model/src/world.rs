//! A world for the model checker: lock servers (one node, or three Redlock nodes) that
//! run the shipped scripts, clients, the messages between them, a clock with bounded
//! drift, and faults as actions; the properties as checks over its state.
//!
//! Everything a world does happens by an action the checker chooses, so every
//! interleaving of the clients' calls, the servers' executions, the deliveries and the
//! faults is explored: a call waits in the network until a node executes it (in any
//! order), its reply and the messages its script published wait until delivered (in
//! any order) or lost, and the clock moves only by a tick.
//!
//! Faults: lease expiry (the clock's ticks; a node's clock runs fast by up to the
//! drift bound), a lost reply (the client sends the same call again: the retry with the
//! same holder token), a lost or late release message, a client crash, a client pause
//! past its lease (a client that takes no step while the clock ticks: every
//! interleaving has it), a node restart that wipes its keyspace (a new run id, uptime
//! from zero), a failover that loses the last writes (the node's data becomes its
//! replica's, which copied it at the last `Replicate`).
//!
//! The clients are [`crate::standin`]'s scripted plain-lock client for now: see there.

use std::fmt::Write as _;

use stateright::{Model, Property};

use crate::keyspace::{Bytes, Published, Reply, Server, Value};
use crate::scripts::Scripts;
use crate::standin::{self, Answer, Call};

/// The world's start: the servers' clocks read this (µs since the epoch).
const EPOCH_US: i64 = 1_800_000_000_000_000;

/// Which faults a world may inject, and how many in all.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// A reply lost on its way back.
    pub lost_reply: bool,
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
}

/// One world: its settings (the checker's model).
#[derive(Clone, Debug)]
pub struct World {
    /// A name for reports.
    pub name: &'static str,
    /// The scripts the servers run (shipped, or a control's mutation).
    pub scripts: Scripts,
    /// How many clients.
    pub clients: usize,
    /// How many times each client takes the lock.
    pub rounds: u8,
    /// How many lock servers (1, or 3 for Redlock).
    pub nodes: usize,
    /// The lease, ms.
    pub lease_ms: i64,
    /// One clock tick, ms.
    pub tick_ms: i64,
    /// How many ticks at most.
    pub ticks: u8,
    /// How far a node's clock may run ahead of the true time, ms (0: none).
    pub max_drift_ms: i64,
    /// Each client writes to the fenced resource while it holds the lock.
    pub fenced_writes: bool,
    /// The faults.
    pub faults: Faults,
    /// At most this many holders with an unexpired lease (1; N for a semaphore).
    pub max_holders: usize,
}

/// What a client is doing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// About to acquire.
    Idle,
    /// An attempt's call or reply is in flight.
    Acquiring {
        /// The acquisition's holder token (the same for every attempt of it).
        token: String,
        /// When the attempt was sent (true ms): its lease is counted from here.
        sent_ms: i64,
        /// A waiting acquire's attempt (listed on the wake list).
        waiting: bool,
        /// A release woke it by name.
        woken: bool,
    },
    /// Refused: waits for a release message, or for the holder's lease to end.
    Waiting {
        /// The acquisition's holder token.
        token: String,
        /// When it tries again without a message (true ms).
        retry_ms: i64,
        /// A release message arrived.
        woken: bool,
    },
    /// Holds the lock (in its own view).
    Holding {
        /// The holder token.
        token: String,
        /// The fencing token.
        fence: i64,
        /// The end of its lease, by its own count (true ms).
        until_ms: i64,
        /// Its fenced write is done (or not wanted).
        wrote: bool,
    },
    /// Its fenced write is in flight.
    Writing {
        /// The holder token.
        token: String,
        /// The fencing token.
        fence: i64,
        /// The end of its lease (true ms).
        until_ms: i64,
    },
    /// Its release is in flight.
    Releasing {
        /// The holder token.
        token: String,
    },
    /// Took the lock as often as it would.
    Done,
    /// Crashed: takes no step again.
    Crashed,
}

/// One client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// What it does.
    pub phase: Phase,
    /// How many times it took and released the lock.
    pub round: u8,
}

/// What travels between clients and nodes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Packet {
    /// A script call on its way to a node.
    Call {
        /// The sender.
        from: usize,
        /// The node.
        node: usize,
        /// The call.
        call: Call,
    },
    /// A reply on its way back.
    Reply {
        /// The client.
        to: usize,
        /// The node that answered.
        node: usize,
        /// The script it answers.
        script: &'static str,
        /// The reply.
        reply: Reply,
    },
    /// A published message on its way to a subscribed client.
    Message {
        /// The client.
        to: usize,
        /// The channel.
        channel: Bytes,
        /// The message.
        message: Bytes,
    },
}

impl Packet {
    fn client(&self) -> usize {
        match self {
            Packet::Call { from, .. } => *from,
            Packet::Reply { to, .. } | Packet::Message { to, .. } => *to,
        }
    }
}

/// One lock server: its data and clock, and its replica's copy.
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
}

/// What the properties read besides the clients and nodes: every grant delivered
/// (holder token and fencing token), in order, and the resource's accepted writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Log {
    /// (holder token, fencing token) of each grant a server made (a retried acquire's
    /// second grant of the same token once).
    pub grants: Vec<(String, i64)>,
    /// A grant's fencing token was not above every earlier grant's.
    pub token_fell: bool,
    /// The fencing tokens the resource accepted, in order.
    pub accepted: Vec<i64>,
}

/// The world's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The true time since the start, ms.
    pub now_ms: i64,
    /// The lock servers.
    pub nodes: Vec<Node>,
    /// The fenced resource's server (no faults: it is the thing protected).
    pub resource: Server,
    /// The clients.
    pub clients: Vec<Client>,
    /// What is in flight.
    pub net: Vec<Packet>,
    /// Faults left.
    pub faults_left: u8,
    /// Ticks left.
    pub ticks_left: u8,
    /// What the properties read.
    pub log: Log,
}

/// A step the checker may take.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client sends an attempt (its first, or a waiting one's next).
    Acquire(usize),
    /// A node runs the call at this place in the network.
    Execute(usize),
    /// The reply or message at this place arrives.
    Deliver(usize),
    /// Fault: the reply or message at this place is lost.
    Lose(usize),
    /// A client whose call or reply was lost sends the same call again.
    Resend(usize),
    /// A holder writes to the fenced resource.
    Write(usize),
    /// A holder releases.
    Release(usize),
    /// The clock moves by a tick.
    Tick,
    /// A node's clock runs ahead by a tick, within the drift bound.
    Drift(usize),
    /// Fault: a client crashes.
    Crash(usize),
    /// Fault: a node restarts without persistence.
    Restart(usize),
    /// A node's replica catches up.
    Replicate(usize),
    /// Fault: a node's replica takes over, with what it copied last.
    Failover(usize),
}

fn run_id(node: usize, restarts: u8) -> String {
    format!("{node:x}{restarts:x}").repeat(20)
}

impl World {
    /// The plain lock: `clients` clients take it `rounds` times each on one server,
    /// each writing to a fenced resource while it holds it.
    pub fn plain(scripts: Scripts, clients: usize, rounds: u8) -> World {
        World {
            name: "plain lock, 1 server",
            scripts,
            clients,
            rounds,
            nodes: 1,
            lease_ms: 1_000,
            tick_ms: 600,
            ticks: 3,
            max_drift_ms: 0,
            fenced_writes: true,
            faults: Faults::default(),
            max_holders: 1,
        }
    }

    /// Whether nothing of the client's call is in flight any more (lost).
    fn lost(state: &State, client: usize) -> bool {
        !state.net.iter().any(|p| {
            p.client() == client && matches!(p, Packet::Call { .. } | Packet::Reply { .. })
        })
    }

    /// Which channels a client listens on: a waiting acquire's (the lock's and its own).
    fn subscribed(phase: &Phase) -> bool {
        matches!(
            phase,
            Phase::Waiting { .. } | Phase::Acquiring { waiting: true, .. }
        )
    }

    fn send(state: &mut State, from: usize, call: Call) {
        state.net.push(Packet::Call {
            from,
            node: 0,
            call,
        });
    }

    fn execute(&self, state: &mut State, at: usize) {
        let Packet::Call { from, node, call } = state.net.remove(at) else {
            unreachable!("only calls execute")
        };
        let listeners: Vec<usize> = (0..state.clients.len())
            .filter(|c| Self::subscribed(&state.clients[*c].phase))
            .collect();
        let server = if call.script == "fence/write.lua" {
            &mut state.resource
        } else {
            &mut state.nodes[node].server
        };
        for c in &listeners {
            for channel in [standin::channel(), standin::own_channel(*c)] {
                *server.subscribers.entry(channel.into_bytes()).or_default() += 1;
            }
        }
        let script = self.scripts.get(call.script);
        let reply = crate::lua::eval(server, script, &call.keys, &call.argv);
        Self::record(&mut state.log, &call, &reply);
        server.subscribers.clear();
        let published = server.take_published();
        state.net.push(Packet::Reply {
            to: from,
            node,
            script: call.script,
            reply,
        });
        for Published {
            channel, message, ..
        } in published
        {
            for c in &listeners {
                let mine = channel == standin::channel().into_bytes()
                    || channel == standin::own_channel(*c).into_bytes();
                if mine {
                    state.net.push(Packet::Message {
                        to: *c,
                        channel: channel.clone(),
                        message: message.clone(),
                    });
                }
            }
        }
    }

    /// What the properties need of an execution, taken when the server runs it (the
    /// order of grants and accepted writes is the servers', not the deliveries').
    fn record(log: &mut Log, call: &Call, reply: &Reply) {
        let arg = |i: usize| String::from_utf8_lossy(&call.argv[i]).into_owned();
        match (call.script, standin::answer(reply)) {
            ("lock/acquire.lua", Answer::Granted(fence)) => {
                let holder = arg(0);
                if !log.grants.contains(&(holder.clone(), fence)) {
                    let top = log.grants.iter().map(|(_, f)| *f).max();
                    log.token_fell |= top.is_some_and(|top| fence <= top);
                    log.grants.push((holder, fence));
                }
            }
            ("fence/write.lua", _) => {
                let accepted = reply.as_array().and_then(|r| r.first()) == Some(&Reply::Int(1));
                if accepted {
                    log.accepted.push(arg(0).parse().unwrap_or(i64::MAX));
                }
            }
            _ => {}
        }
    }

    fn deliver(&self, state: &mut State, at: usize) {
        let packet = state.net.remove(at);
        let now = state.now_ms;
        let client = &mut state.clients[packet.client()];
        match (packet, &client.phase) {
            (
                Packet::Message { .. },
                Phase::Waiting {
                    token, retry_ms, ..
                },
            ) => {
                client.phase = Phase::Waiting {
                    token: token.clone(),
                    retry_ms: *retry_ms,
                    woken: true,
                };
            }
            (Packet::Reply { reply, .. }, Phase::Acquiring { token, sent_ms, .. }) => {
                let token = token.clone();
                client.phase = match standin::answer(&reply) {
                    Answer::Granted(fence) => Phase::Holding {
                        token,
                        fence,
                        until_ms: sent_ms + self.lease_ms,
                        wrote: !self.fenced_writes,
                    },
                    Answer::Held(ms) => Phase::Waiting {
                        token,
                        retry_ms: now + if ms < 0 { self.lease_ms } else { ms },
                        woken: false,
                    },
                    Answer::Failed(_) => Phase::Waiting {
                        token,
                        retry_ms: now,
                        woken: false,
                    },
                };
            }
            (
                Packet::Reply { reply, .. },
                Phase::Writing {
                    token,
                    fence,
                    until_ms,
                },
            ) => {
                let _ = reply;
                client.phase = Phase::Holding {
                    token: token.clone(),
                    fence: *fence,
                    until_ms: *until_ms,
                    wrote: true,
                };
            }
            (Packet::Reply { .. }, Phase::Releasing { .. }) => {
                client.round += 1;
                client.phase = if client.round < self.rounds {
                    Phase::Idle
                } else {
                    Phase::Done
                };
            }
            // Anything else finds nobody waiting for it (a crashed client, a stale
            // message).
            _ => {}
        }
    }

    /// The call a client whose call or reply was lost sends again: the same call (an
    /// acquire's retry keeps its holder token).
    fn resend(&self, state: &mut State, client: usize) {
        let call = match &state.clients[client].phase {
            Phase::Acquiring {
                token,
                waiting,
                woken,
                ..
            } => standin::acquire(token, self.lease_ms, client, *waiting, *woken),
            Phase::Writing { fence, .. } => standin::fenced_write(*fence, &standin::tag(client)),
            Phase::Releasing { token } => standin::release(token),
            _ => return,
        };
        Self::send(state, client, call);
    }

    fn advance(state: &mut State, ms: i64) {
        state.now_ms += ms;
        for node in &mut state.nodes {
            node.server.advance_us(ms * 1000);
            node.replica.advance_us(ms * 1000);
        }
        state.resource.advance_us(ms * 1000);
    }
}

impl Model for World {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let nodes = (0..self.nodes)
            .map(|n| {
                let server = Server::new(EPOCH_US, run_id(n, 0));
                Node {
                    replica: server.clone(),
                    server,
                    drift_ms: 0,
                    restarts: 0,
                }
            })
            .collect();
        vec![State {
            now_ms: 0,
            nodes,
            resource: Server::new(EPOCH_US, run_id(0xf, 0)),
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    round: 0,
                };
                self.clients
            ],
            net: Vec::new(),
            faults_left: self.faults.budget,
            ticks_left: self.ticks,
            log: Log::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (c, client) in state.clients.iter().enumerate() {
            match &client.phase {
                Phase::Idle => actions.push(Action::Acquire(c)),
                Phase::Waiting {
                    retry_ms, woken, ..
                } if *woken || state.now_ms >= *retry_ms => actions.push(Action::Acquire(c)),
                Phase::Holding {
                    wrote: false,
                    until_ms,
                    ..
                } if state.now_ms < *until_ms => actions.push(Action::Write(c)),
                Phase::Holding { wrote: true, .. } => actions.push(Action::Release(c)),
                Phase::Acquiring { .. } | Phase::Writing { .. } | Phase::Releasing { .. }
                    if Self::lost(state, c) =>
                {
                    actions.push(Action::Resend(c));
                }
                _ => {}
            }
            let alive = !matches!(client.phase, Phase::Crashed | Phase::Done);
            if self.faults.crash && state.faults_left > 0 && alive {
                actions.push(Action::Crash(c));
            }
        }
        for (at, packet) in state.net.iter().enumerate() {
            match packet {
                Packet::Call { .. } => actions.push(Action::Execute(at)),
                Packet::Reply { .. } => {
                    actions.push(Action::Deliver(at));
                    if self.faults.lost_reply && state.faults_left > 0 {
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
        if state.ticks_left > 0 {
            actions.push(Action::Tick);
        }
        for (n, node) in state.nodes.iter().enumerate() {
            if node.drift_ms + self.tick_ms <= self.max_drift_ms {
                actions.push(Action::Drift(n));
            }
            if state.faults_left > 0 && self.faults.restart {
                actions.push(Action::Restart(n));
            }
            if self.faults.failover {
                if node.replica.entries().ne(node.server.entries()) {
                    actions.push(Action::Replicate(n));
                }
                if state.faults_left > 0 {
                    actions.push(Action::Failover(n));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let now = state.now_ms;
        match action {
            Action::Acquire(c) => {
                let (token, waiting, woken) = match &state.clients[c].phase {
                    Phase::Idle => (format!("c{c}r{}", state.clients[c].round), false, false),
                    Phase::Waiting { token, woken, .. } => (token.clone(), true, *woken),
                    _ => return None,
                };
                Self::send(
                    &mut state,
                    c,
                    standin::acquire(&token, self.lease_ms, c, waiting, woken),
                );
                state.clients[c].phase = Phase::Acquiring {
                    token,
                    sent_ms: now,
                    waiting,
                    woken,
                };
            }
            Action::Execute(at) => self.execute(&mut state, at),
            Action::Deliver(at) => self.deliver(&mut state, at),
            Action::Lose(at) => {
                state.net.remove(at);
                state.faults_left -= 1;
            }
            Action::Resend(c) => self.resend(&mut state, c),
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
                Self::send(
                    &mut state,
                    c,
                    standin::fenced_write(fence, &standin::tag(c)),
                );
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
                Self::send(&mut state, c, standin::release(&token));
                state.clients[c].phase = Phase::Releasing { token };
            }
            Action::Tick => {
                state.ticks_left -= 1;
                Self::advance(&mut state, self.tick_ms);
            }
            Action::Drift(n) => {
                state.nodes[n].drift_ms += self.tick_ms;
                state.nodes[n].server.advance_us(self.tick_ms * 1000);
            }
            Action::Crash(c) => {
                state.faults_left -= 1;
                state.clients[c].phase = Phase::Crashed;
            }
            Action::Restart(n) => {
                state.faults_left -= 1;
                let node = &mut state.nodes[n];
                node.restarts += 1;
                node.server.wipe(run_id(n, node.restarts));
                node.replica = node.server.clone();
            }
            Action::Replicate(n) => {
                let node = &mut state.nodes[n];
                let copy = node.server.clone();
                node.replica.replace_keys_from(&copy);
            }
            Action::Failover(n) => {
                state.faults_left -= 1;
                let node = &mut state.nodes[n];
                let replica = node.replica.clone();
                node.server.replace_keys_from(&replica);
                node.restarts += 1;
                node.server.run_id = run_id(n, node.restarts);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one holder with an unexpired lease",
                |world: &World, state: &State| holders(state).len() <= world.max_holders,
            ),
            Property::always("fencing tokens strictly increase", |_, state: &State| {
                !state.log.token_fell
            }),
            Property::always("the resource accepts no lower token", |_, state: &State| {
                state.log.accepted.windows(2).all(|w| w[0] <= w[1])
            }),
            Property::sometimes(HELD, |_, state: &State| !holders(state).is_empty()),
        ]
    }
}

/// The reachability check beside the safety properties: some state has a holder (a
/// world where nobody ever gets the lock passes every safety property vacuously).
pub const HELD: &str = "a client holds the lock";

/// The clients that hold the lock with a lease unexpired by their own count.
pub fn holders(state: &State) -> Vec<usize> {
    state
        .clients
        .iter()
        .enumerate()
        .filter(|(_, c)| match &c.phase {
            Phase::Holding { until_ms, .. } | Phase::Writing { until_ms, .. } => {
                state.now_ms < *until_ms
            }
            _ => false,
        })
        .map(|(i, _)| i)
        .collect()
}

/// A state, readably: the clock, each client, each node's keys (with their TTLs), the
/// resource's, and what is in flight.
pub fn describe(state: &State) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "    clock: +{} ms", state.now_ms);
    for (i, c) in state.clients.iter().enumerate() {
        let _ = writeln!(out, "    client {i}: {:?} (round {})", c.phase, c.round);
    }
    for (n, node) in state.nodes.iter().enumerate() {
        let _ = writeln!(
            out,
            "    node {n} (run {}, clock +{} ms): {}",
            &node.server.run_id[..4],
            node.drift_ms,
            keys(&node.server)
        );
    }
    let _ = writeln!(out, "    resource: {}", keys(&state.resource));
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

fn packet(p: &Packet) -> String {
    let text = |b: &[Bytes]| {
        b.iter()
            .map(|x| format!("{:?}", String::from_utf8_lossy(x)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    match p {
        Packet::Call { from, node, call } => format!(
            "client {from} -> node {node}: {} KEYS {} ARGV {}",
            call.script,
            text(&call.keys),
            text(&call.argv)
        ),
        Packet::Reply {
            to,
            node,
            script,
            reply,
        } => format!("node {node} -> client {to}: {script} answered {reply}"),
        Packet::Message {
            to,
            channel,
            message,
        } => format!(
            "message -> client {to} on {}: {:?}",
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
