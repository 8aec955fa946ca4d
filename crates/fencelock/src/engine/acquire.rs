//! The acquire engine: a state machine of attempts, waits for a release, and the
//! clean-up an acquire owes when it ends without the lock. Sans I/O: each transition
//! takes one [`Event`] (and the time) and gives the one [`Command`] to carry out next;
//! it never awaits, reads a clock or draws a random number. `driver.rs` runs it on the
//! nodes; the model checker of the scripts (`model/`) drives the same transitions.
//!
//! ```text
//!            ┌──────────── Woken: a release message, or the pause ran out ────────────┐
//!            v                                                                         │
//!  start ─> Attempt ── Answered(granted) ─> [WaitReplicas ── Replicas] ──> Done(grant)  │
//!    │        │ ^                               └── too few ─> Withdraw(take back) ─>    │
//!    │        │ │                                  Done(error), or Sleep if unreachable  │
//!    │        │ └─ Subscribed <─ Subscribe <── Answered(held): the first refusal of a    │
//!    │        │                                  waiting acquire                        │
//!    │        ├── Answered(held), or unreachable (a node timed out, a quorum failed) ─> Sleep
//!    │        └── Answered(held, wait over), or any other error ─> [Withdraw] ─> Done(error)
//!    └── a fair waiter: Subscribe (only if its channels are open), then Attempt
//! ```
//!
//! The first attempt goes out at once, so an uncontended acquire costs one round trip. A
//! waiting acquire that finds the lock held becomes a waiter: it subscribes to the
//! lock's release channel on every node and then tries again, so the refusal it waits on
//! came after the subscription and no release after it can go unnoticed. (A fair waiter
//! whose channels another waiter of its client keeps open joins them before its first
//! attempt instead, at no cost, and needs no second one.) Between attempts it sleeps
//! until a release notification or the pause [`next_pause`] chose, which is never longer
//! than the holder's remaining lease as Redis reported it: pub/sub is never trusted
//! alone.
//!
//! A fair waiter may get the lock without an attempt of its own: the release that ends
//! its predecessor's hold hands the lock to the head of the queue inside its script and
//! says so in its message ([`Handover`]). The waiter then counts its lease from the
//! send time of its last attempt that Redis refused (the handover came after that
//! refusal), so the lease it reports never outlasts the one Redis keeps.
//!
//! Every attempt of one acquire uses the same holder token, so an attempt whose reply was
//! lost and a later attempt that finds the token in Redis resolve to one grant with one
//! fencing token. Whatever an acquire may have left in Redis when it ends without the
//! lock ([`Owed`]: a grant whose reply was lost, a place in a queue, its client on the
//! wake list) is withdrawn before it returns ([`Command::Withdraw`]), or in the
//! background ([`Cleanup`]): when its caller drops it ([`Acquiring::cancel`]), for the
//! backup of a Redlock take-back already sent to nodes that did not answer (waiting for
//! them again would only delay the error), and for what a failed take-back after too
//! few replicas left; the wake list's listing always goes to the background.
//!
//! The machine knows the primitive only through its [`Protocol`], and the nodes not at
//! all: what it needs of them comes in with the events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::protocol::{self, Listed, Protocol, Undo};
use super::retry::Retry;
use super::{Grant, Outcome, Refusal};
use crate::error::{Blocker, Error, NodeOutcome, NodeReport, UnavailableReason};
use crate::keys::LockKeys;
use crate::observe::WokenBy;
use crate::scripts::{self, Call};
use crate::token::{FencingToken, HolderToken};

/// What to acquire, and how long to wait for it.
#[derive(Clone)]
pub struct Request<'a> {
    /// The lock's name, for errors and events.
    pub name: &'a str,
    /// Its keys (a multi-lock's: its first name's).
    pub keys: LockKeys,
    /// The primitive.
    pub protocol: Arc<dyn Protocol>,
    /// The TTL each attempt asks for.
    pub ttl: Duration,
    /// `None`: wait for ever; zero: one attempt.
    pub wait: Option<Duration>,
    /// The pause between attempts when nothing else decides it.
    pub retry: Retry,
    /// What the holder says about itself ("" for nothing).
    pub info: &'a str,
    /// Replicas that must acknowledge a grant (0: none asked for).
    pub replicas: u32,
    /// Whether the watchdog renews the lease: a handover that gives a shorter lease
    /// than `ttl` (bounded by the waiter's deadline) is taken as it is only then.
    pub renew: bool,
}

/// A lock that was granted: its keys, the holder token that holds it, the protocol it
/// is held under (a reader's grant may be its owner's write lock's), and the grant.
#[derive(Debug)]
pub struct Acquired {
    /// The lock's keys.
    pub keys: LockKeys,
    /// The holder token its key holds.
    pub token: HolderToken,
    /// The protocol it is held under.
    pub protocol: Arc<dyn Protocol>,
    /// The grant.
    pub grant: Grant,
}

/// What happened, for the machine to take its next step on.
#[derive(Debug)]
pub enum Event {
    /// The attempt's outcome; an error when the nodes could not decide it.
    Answered(Result<Outcome, Error>),
    /// The waiter's channels are subscribed; `None`: nothing was (a fair waiter's
    /// channels were not open, [`Subscribe::only_if_open`]).
    Subscribed(Option<Channels>),
    /// How many replicas acknowledged the grant, and how long that took.
    Replicas(Result<(u32, Duration), Error>),
    /// The wait ended: a release message came, or the pause ran out.
    Woken(Woken),
    /// The withdrawal's result.
    Withdrawn(Result<(), Error>),
}

/// A waiter's subscriptions, as made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Channels {
    /// Whether the lock's channel is subscribed on every node.
    pub everywhere: bool,
    /// Whether its client's own channel of the lock is subscribed on every node (a
    /// plain waiter is then woken by name).
    pub own_everywhere: bool,
    /// The wakes by name delivered so far (see [`Woken::named_wakes`]).
    pub named_wakes: u64,
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Woken {
    /// A release message, or the pause's end.
    pub by: WokenBy,
    /// The wakes by name (on its client's own channel) delivered to this waiter since it
    /// subscribed: one since its last attempt sends the next to the head of the wake
    /// list if refused.
    pub named_wakes: u64,
    /// The lock, if a fair release handed it to this waiter.
    pub handover: Option<Handover>,
}

/// A fair release handed the lock to a waiter: its fencing token, and the lease it set,
/// in ms from the release. Its message: `G TOKEN FENCE PX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handover {
    /// The fencing token the release minted for the waiter.
    pub fence: u64,
    /// The lease it set, in ms from the release.
    pub px: u64,
}

impl Handover {
    /// Reads `G TOKEN FENCE PX`: the token it is for, and the handover.
    pub fn parse(payload: &[u8]) -> Option<(&[u8], Handover)> {
        let mut parts = payload.strip_prefix(b"G ")?.split(|b| *b == b' ');
        let token = parts.next()?;
        let mut number =
            || -> Option<u64> { std::str::from_utf8(parts.next()?).ok()?.parse().ok() };
        let handover = Handover {
            fence: number()?,
            px: number()?,
        };
        Some((token, handover))
    }
}

/// What to do next.
#[derive(Debug)]
pub enum Command {
    /// Send one attempt, answer with [`Event::Answered`].
    Attempt(Attempt),
    /// Subscribe the waiter's channels, answer with [`Event::Subscribed`].
    Subscribe(Subscribe),
    /// Wait for `replicas` replicas, at most `within`; answer with [`Event::Replicas`].
    WaitReplicas {
        /// How many must acknowledge.
        replicas: u32,
        /// How long to wait for them at most.
        within: Duration,
    },
    /// Sleep until a release message reaches the waiter, or until `until`; answer with
    /// [`Event::Woken`].
    Sleep {
        /// When the pause ends.
        until: Instant,
    },
    /// Withdraw what the acquire may have written, now; answer with
    /// [`Event::Withdrawn`].
    Withdraw(Undo),
    /// The outcome: the machine is done.
    Done(Done),
}

/// One attempt: what it sends beside the acquire's keys, token, lease and holder info.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// A waiting acquire: it takes a place in line where one is kept.
    pub join: bool,
    /// Whether an earlier attempt may have put the token among a read-write lock's
    /// waiting writers, which a grant then leaves.
    pub queued: bool,
    /// How its client goes on the lock's wake list if refused: by name
    /// ([`Listed::ByName`]), as `*` ([`Listed::Everyone`]), or not at all.
    pub listed: Listed,
    /// Listed by name: a release woke its client by name since its last attempt, so
    /// refused it goes back to the head of the list.
    pub front: bool,
    /// A multi-lock's waiter: the place of the name whose release it waits for
    /// ([`Protocol::keys_at`]), whose wake list a grant takes it off.
    pub waits_on: Option<usize>,
}

/// Which channels to subscribe: the lock's, and for a protocol that listens there its
/// client's own channel of the lock. The waiter's earlier subscriptions, if any, go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subscribe {
    /// Only if every one is subscribed on every node already (then at no cost).
    pub only_if_open: bool,
    /// A multi-lock: the place of the name whose channels to subscribe
    /// ([`Protocol::keys_at`]); `None`: the lock's own.
    pub at: Option<usize>,
}

/// The end of an acquire.
#[derive(Debug)]
pub struct Done {
    /// The lock, or why not.
    pub result: Result<Acquired, Error>,
    /// What to withdraw in the background.
    pub cleanup: Cleanup,
}

/// What an acquire that ended without the lock leaves to the background.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// Withdraw what the token may hold.
    pub withdraw: bool,
    /// Take its client off the lock's wake list, once none of its waiters waits for the
    /// lock.
    pub unlist: bool,
}

/// What the nodes add to an attempt's call ([`Acquiring::call`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Site<'a> {
    /// The client's tag, which names its own release channels and its place on wake
    /// lists.
    pub client_tag: &'a str,
    /// How long a fencing counter lives without a grant (zero: for ever).
    pub counter_idle: Duration,
    /// Other plain waiters of the client wait for the same lock: a grant leaves the
    /// client listed.
    pub stays: bool,
}

/// Where the machine stands.
#[derive(Debug)]
enum Phase {
    Start,
    /// An attempt sent at `sent` is on its way.
    Attempting {
        sent: Instant,
    },
    Subscribing,
    /// Granted; the replicas asked for must acknowledge it.
    Replicas(Grant),
    /// Too few replicas acknowledged: the grant is being taken back.
    TakingBack(Result<(u32, Duration), Error>),
    /// Asleep between attempts.
    Waiting,
    /// Withdrawing before the error.
    Withdrawing(Error),
    Done,
}

impl Clone for Phase {
    fn clone(&self) -> Self {
        match self {
            Phase::Start => Phase::Start,
            Phase::Attempting { sent } => Phase::Attempting { sent: *sent },
            Phase::Subscribing => Phase::Subscribing,
            Phase::Replicas(grant) => Phase::Replicas(*grant),
            Phase::TakingBack(acked) => {
                Phase::TakingBack(acked.as_ref().map(|a| *a).map_err(Error::duplicate))
            }
            Phase::Waiting => Phase::Waiting,
            Phase::Withdrawing(e) => Phase::Withdrawing(e.duplicate()),
            Phase::Done => Phase::Done,
        }
    }
}

/// What the last attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Another holder, or a fair queue, stands in the way.
    Held(Blocker),
    /// A node could not be reached, or the quorum failed.
    Unreachable,
}

/// A waiter's subscriptions, as the machine needs to know them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Waiter {
    /// Whether release notifications come from every node.
    everywhere: bool,
    /// A plain waiter whose client's own channel is subscribed on every node: its
    /// attempts list the client on the lock's wake list by name.
    named: bool,
}

/// One acquire, from its request to its outcome. A value: a model checker keeps it in
/// its states (with the `model` feature, equal and hashed by every field, the protocol
/// by its text and an error by its message).
#[derive(Clone)]
pub struct Acquiring<'a> {
    req: Request<'a>,
    token: HolderToken,
    waits: bool,
    started: Instant,
    /// `None`: waits for ever.
    deadline: Option<Instant>,
    /// Draws the retry schedule's jitter, with the attempt's number.
    seed: u64,
    phase: Phase,
    owed: Owed,
    waiter: Option<Waiter>,
    /// The wakes by name delivered so far, and those the last listed attempt saw.
    named_wakes: u64,
    named_seen: u64,
    /// Attempts sent so far.
    attempts: u32,
    /// The last attempt Redis answered "not yours": when it was sent, and the fencing
    /// counter it reported (fair mode). A handover minted a higher token than that
    /// counter only if it came after that answer, so its lease started after that send;
    /// one with a lower token is older (its message read late) and is not trusted.
    refused: Option<(Instant, Option<FencingToken>)>,
    /// A multi-lock: which of its names the last refusal named ([`Protocol::keys_at`]),
    /// and which one's channels the waiter listens on.
    held_at: Option<usize>,
    listens_at: Option<usize>,
    /// When an attempt first found the lock held or a node unreachable, and the acquire
    /// waited on.
    waiting_since: Option<Instant>,
}

impl<'a> Acquiring<'a> {
    /// An acquire of `req` by `token`, asked for at `now`; `seed` draws the retry
    /// schedule's jitter (the driver gives a random one, a model checker a fixed one).
    pub fn new(req: Request<'a>, token: HolderToken, seed: u64, now: Instant) -> Self {
        Self {
            waits: req.wait != Some(Duration::ZERO),
            started: now,
            deadline: req.wait.map(|w| now + w),
            req,
            token,
            seed,
            phase: Phase::Start,
            owed: Owed::default(),
            waiter: None,
            named_wakes: 0,
            named_seen: 0,
            attempts: 0,
            refused: None,
            held_at: None,
            listens_at: None,
            waiting_since: None,
        }
    }

    /// The first command. A fair waiter joins before its first attempt when that costs
    /// no round trip (other waiters of this client keep its channels open): a refusal
    /// then needs no second attempt to cover a release between it and the join.
    pub fn start(&mut self, now: Instant) -> Command {
        if self.waits && self.req.protocol.waiting().queue.is_some() {
            self.phase = Phase::Subscribing;
            return Command::Subscribe(Subscribe {
                only_if_open: true,
                at: None,
            });
        }
        self.attempt(now)
    }

    /// The next command, on `event` at `now`.
    pub fn on(&mut self, event: Event, now: Instant) -> Command {
        match (std::mem::replace(&mut self.phase, Phase::Done), event) {
            (Phase::Attempting { sent }, Event::Answered(outcome)) => match outcome {
                Ok(Outcome::Granted {
                    grant,
                    held_as_other,
                }) => self.granted(grant, held_as_other),
                Ok(Outcome::Held { refusal, nodes }) => self.held(sent, refusal, nodes, now),
                Err(e) => self.failed(e, now),
            },
            (Phase::Subscribing, Event::Subscribed(channels)) => self.subscribed(channels, now),
            (Phase::Replicas(grant), Event::Replicas(acked)) => self.replicas(grant, acked),
            (Phase::TakingBack(acked), Event::Withdrawn(result)) => {
                self.taken_back(acked, result, now)
            }
            (Phase::Waiting, Event::Woken(woken)) => self.woken(woken, now),
            (Phase::Withdrawing(e), Event::Withdrawn(result)) => self.withdrawn(e, result),
            (phase, event) => {
                debug_assert!(false, "{event:?} in {phase:?}");
                self.done(Err(Error::invalid(
                    "acquire",
                    format!("the engine got {event:?} while it stood at {phase:?}"),
                )))
            }
        }
    }

    /// Transition *cancelled*: the caller dropped the acquire before its end. What it
    /// owes goes to the background.
    pub fn cancel(&mut self) -> Cleanup {
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Done => Cleanup::default(),
            _ => self.owed.cleanup(),
        }
    }

    /// What is acquired.
    pub fn request(&self) -> &Request<'a> {
        &self.req
    }

    /// The holder token every attempt uses.
    pub fn token(&self) -> &HolderToken {
        &self.token
    }

    /// Whether the acquire waits (its wait is not zero).
    pub fn waits(&self) -> bool {
        self.waits
    }

    /// Attempts sent so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// When an attempt first found the lock held or a node unreachable, and the acquire
    /// waited on.
    pub fn waiting_since(&self) -> Option<Instant> {
        self.waiting_since
    }

    /// The script call of `attempt`, as its protocol builds it with what the nodes add
    /// (`identify`: the node is asked who it is, Redlock's restart protection). Pure:
    /// the driver sends it, a model checker runs its script.
    pub fn call(&self, attempt: &Attempt, site: &Site<'_>, identify: bool) -> Call {
        let listing = (attempt.listed != Listed::No).then_some(scripts::Listing {
            tag: match attempt.listed {
                Listed::ByName => site.client_tag,
                _ => scripts::Listing::EVERYONE,
            },
            margin: LISTING_MARGIN,
            stays: site.stays,
            front: attempt.front,
        });
        self.req.protocol.acquire(&protocol::Acquire {
            keys: &self.req.keys,
            token: &self.token,
            ttl: self.req.ttl,
            identify,
            info: self.req.info,
            counter_idle: site.counter_idle,
            join: attempt.join,
            queued: attempt.queued,
            listing,
            client_tag: site.client_tag,
            waits_on: attempt.waits_on,
        })
    }

    /// Sends an attempt.
    fn attempt(&mut self, now: Instant) -> Command {
        let listed = self.listed();
        let front = listed == Listed::ByName && self.named_wakes > self.named_seen;
        if listed == Listed::ByName {
            self.named_seen = self.named_wakes;
        }
        let queued = self.owed.queued || (self.waits && self.owed.earlier == Earlier::Unanswered);
        self.owed.sending(listed == Listed::ByName);
        self.attempts = self.attempts.saturating_add(1);
        self.phase = Phase::Attempting { sent: now };
        Command::Attempt(Attempt {
            join: self.waits,
            queued,
            listed,
            front,
            waits_on: self.listens_at,
        })
    }

    /// How the next attempt lists its client on the lock's wake list: a named plain
    /// waiter by name (listed if refused, and after a grant if other plain waiters of
    /// its client wait for the lock too); a waiting reader, reentrant owner or fair
    /// waiter as `*` (listed when a plain holder refuses it, whose release then wakes
    /// every client, these waiters among them), and so is a plain waiter that is not
    /// named (its client's own channel is not subscribed on every node): a release that
    /// finds nobody listed publishes nothing. Not listed before it waits.
    fn listed(&self) -> Listed {
        match (self.waiter, self.req.protocol.waiting().listing) {
            (None, _) | (_, Listed::No) => Listed::No,
            (Some(w), Listed::ByName) if w.named => Listed::ByName,
            (Some(_), Listed::ByName | Listed::Everyone) => Listed::Everyone,
        }
    }

    /// Transition *granted*: the lock is ours, once the replicas asked for have it.
    fn granted(&mut self, grant: Grant, held_as_other: bool) -> Command {
        if held_as_other && let Some(other) = self.req.protocol.held_as() {
            self.req.protocol = other;
        }
        if self.req.replicas > 0 {
            self.phase = Phase::Replicas(grant);
            return Command::WaitReplicas {
                replicas: self.req.replicas,
                within: replica_wait(self.req.ttl),
            };
        }
        self.done(Ok(grant))
    }

    /// The grant counts only once enough replicas have it: a failover before that could
    /// lose it. Too few: taken back (another attempt may follow, with the same token).
    fn replicas(&mut self, grant: Grant, acked: Result<(u32, Duration), Error>) -> Command {
        if matches!(acked, Ok((n, _)) if n >= self.req.replicas) {
            return self.done(Ok(grant));
        }
        self.phase = Phase::TakingBack(acked);
        Command::Withdraw(Undo::TakeBack)
    }

    /// The grant the replicas did not confirm was taken back (or not: what the take-back
    /// did not undo is left to the background): the error, or for a waiting acquire whose
    /// master went away before it said (a failover under way) another attempt, as after
    /// any attempt that found a node unreachable.
    fn taken_back(
        &mut self,
        acked: Result<(u32, Duration), Error>,
        result: Result<(), Error>,
        now: Instant,
    ) -> Command {
        self.owed.withdrawn(Undo::TakeBack, result);
        match acked {
            Ok((acknowledged, within)) => self.gave_up(Error::Unreplicated {
                name: self.req.name.to_owned(),
                wanted: self.req.replicas,
                acknowledged,
                within,
            }),
            Err(e @ Error::Unavailable { reason, .. })
                if reason != UnavailableReason::Tls
                    && self.waits
                    && self.deadline.is_none_or(|d| now < d) =>
            {
                self.waiting_since.get_or_insert(now);
                tracing::debug!(attempt = self.attempts, error = %e, "no answer from the replicas' master; retrying");
                self.wait(Found::Unreachable, now)
            }
            Err(e) => self.gave_up(e),
        }
    }

    /// Transition *held*: another holder (or a queue ahead) stands in the way. A waiting
    /// acquire subscribes and tries once more, then waits; one whose wait ran out ends.
    fn held(
        &mut self,
        sent: Instant,
        refusal: Refusal,
        nodes: Vec<NodeReport>,
        now: Instant,
    ) -> Command {
        // A definite answer (a failed Redlock quorum was already taken back everywhere);
        // only an earlier unanswered attempt is still a maybe.
        self.owed.answered(any_timed_out(&nodes));
        self.refused = Some((sent, refusal.fence_seen));
        self.held_at = refusal.at;
        let blocked_by = refusal.blocked_by;
        // A place in line to take back if this acquire ends without the lock.
        let place = self.req.protocol.place_in_line(&blocked_by, self.req.ttl);
        self.owed.queued |= self.waits && place.is_some();
        if self.waits {
            self.waiting_since.get_or_insert(now);
        }
        // A multi-lock refused by another name than the one it waited for listens for
        // that one's release instead (and tries once more after subscribing).
        if self.waits && (self.waiter.is_none() || refusal.at != self.listens_at) {
            self.listens_at = refusal.at;
            self.phase = Phase::Subscribing;
            return Command::Subscribe(Subscribe {
                only_if_open: false,
                at: refusal.at,
            });
        }
        if self.deadline.is_some_and(|d| now >= d) {
            let timed_out = self.timed_out(blocked_by, nodes, now);
            return self.finish(timed_out);
        }
        self.wait(Found::Held(blocked_by), now)
    }

    /// The waiter's channels are subscribed (or, for a fair waiter before its first
    /// attempt, were not open): the next attempt.
    fn subscribed(&mut self, channels: Option<Channels>, now: Instant) -> Command {
        if let Some(c) = channels {
            self.waiter = Some(Waiter {
                everywhere: c.everywhere,
                named: self.req.protocol.waiting().listing == Listed::ByName && c.own_everywhere,
            });
            self.named_wakes = c.named_wakes;
            self.named_seen = 0;
        }
        self.attempt(now)
    }

    /// Transition *timed out*: the wait ran out with the lock held.
    fn timed_out(&self, blocked_by: Blocker, nodes: Vec<NodeReport>, now: Instant) -> Error {
        Error::Held {
            name: self
                .held_at
                .and_then(|at| self.req.protocol.keys_at(at))
                .map(LockKeys::name)
                .unwrap_or(self.req.name)
                .to_owned(),
            blocked_by,
            waited: if self.waits {
                now.saturating_duration_since(self.started)
            } else {
                Duration::ZERO
            },
            nodes,
        }
    }

    /// An attempt that failed: a node that could not be reached is waited out (its
    /// outcome unknown); anything else ends the acquire, its outcome as unknown as the
    /// error left it (withdrawn before the error).
    fn failed(&mut self, e: Error, now: Instant) -> Command {
        match e {
            // A certificate problem is configuration: waiting will not fix it.
            Error::Unavailable {
                reason: UnavailableReason::Tls,
                ..
            } => self.finish(e),
            Error::Unavailable { .. } | Error::NoQuorum { .. } => self.unreachable(e, now),
            e => self.finish(e),
        }
    }

    /// Transition *unreachable*: a node did not answer (the attempt's outcome unknown,
    /// unless it was not sent), or the quorum failed (taken back everywhere already). A
    /// waiting acquire waits on until its deadline.
    fn unreachable(&mut self, e: Error, now: Instant) -> Command {
        self.owed.unreachable(&e);
        if !self.waits || self.deadline.is_some_and(|d| now >= d) {
            return self.finish(e);
        }
        self.waiting_since.get_or_insert(now);
        tracing::debug!(attempt = self.attempts, error = %e, "acquire attempt failed; retrying");
        self.wait(Found::Unreachable, now)
    }

    /// Sleeps until a release notification or the pause [`next_pause`] gives.
    fn wait(&mut self, found: Found, now: Instant) -> Command {
        let keep_place = match found {
            Found::Held(blocked_by) => self.req.protocol.place_in_line(&blocked_by, self.req.ttl),
            Found::Unreachable => None,
        };
        // Drawn afresh from the seed and the attempt's number: the same acquire in the
        // same state always pauses alike, whatever happened before.
        let n = self.attempts.saturating_sub(1);
        let rng = &mut SmallRng::seed_from_u64(self.seed ^ u64::from(n).rotate_left(32));
        let backoff = self.req.retry.delay(n, rng);
        let pause = next_pause(Pause {
            found,
            backoff,
            keep_place,
            notified_everywhere: self.waiter.is_some_and(|w| w.everywhere),
            left: self.deadline.map(|d| d.saturating_duration_since(now)),
        });
        self.phase = Phase::Waiting;
        Command::Sleep { until: now + pause }
    }

    /// The wait is over: the lock if a release handed it over, else another attempt.
    fn woken(&mut self, woken: Woken, now: Instant) -> Command {
        self.named_wakes = woken.named_wakes;
        match woken.handover.and_then(|h| self.handed_over(h, now)) {
            Some(grant) => self.done(Ok(grant)),
            None => self.attempt(now),
        }
    }

    /// Transition *handed over*: a fair release gave this waiter the lock after the last
    /// refusal (its token is higher than the counter that refusal saw). Taken as it is if
    /// its lease is the one asked for, or the watchdog will renew it to that; with
    /// replicas asked for, the next attempt confirms it and waits for them, as it does
    /// when the reply says the key is ours.
    fn handed_over(&self, h: Handover, now: Instant) -> Option<Grant> {
        let (refused_at, Some(seen)) = self.refused? else {
            return None;
        };
        if h.fence <= seen.get() {
            return None;
        }
        let ttl = Duration::from_millis(h.px);
        let grant = Grant::new(FencingToken::new(h.fence), refused_at, ttl);
        let usable = self.req.replicas == 0
            && (ttl >= self.req.ttl || self.req.renew)
            && grant.valid_until > now;
        if !usable {
            return None;
        }
        tracing::trace!(
            fence = h.fence,
            lease_ms = h.px,
            "handed the lock by the release"
        );
        Some(grant)
    }

    /// The acquire ends on `e`, once what only a withdrawal undoes was withdrawn: a
    /// take-back already sent is backed up in the background, so that nodes that are
    /// down do not hold up the caller once more.
    fn finish(&mut self, e: Error) -> Command {
        if self.owed.waits_for_withdrawal() {
            self.phase = Phase::Withdrawing(e);
            return Command::Withdraw(Undo::Withdraw);
        }
        self.done(Err(e))
    }

    /// The withdrawal before the error is done (or failed: the rest goes to the
    /// background).
    fn withdrawn(&mut self, e: Error, result: Result<(), Error>) -> Command {
        self.owed.withdrawn(Undo::Withdraw, result);
        self.done(Err(e))
    }

    /// The acquire ends on `e` at once, whatever is still owed withdrawn in the
    /// background: the grant was taken back already, and a take-back that failed is not
    /// tried twice in front of the caller.
    fn gave_up(&mut self, e: Error) -> Command {
        self.done(Err(e))
    }

    /// The outcome.
    fn done(&mut self, result: Result<Grant, Error>) -> Command {
        self.phase = Phase::Done;
        let result = result.map(|grant| {
            // The grant: nothing is owed any more.
            self.owed = Owed::default();
            Acquired {
                keys: LockKeys {
                    lock: std::mem::take(&mut self.req.keys.lock),
                },
                token: std::mem::replace(&mut self.token, HolderToken::from_stored(String::new())),
                protocol: self.req.protocol.clone(),
                grant,
            }
        });
        Command::Done(Done {
            result,
            cleanup: self.owed.cleanup(),
        })
    }
}

/// A model checker's view of the machine: every field, the protocol by its text and an
/// error by its message.
#[cfg(feature = "model")]
mod compare {
    use std::hash::{Hash, Hasher};

    use super::{Acquiring, Phase, Request};

    /// What a phase says, comparably.
    fn phase_key(phase: &Phase) -> impl Hash + Eq + '_ {
        let error = |e: &crate::Error| e.to_string();
        match phase {
            Phase::Start => (0, None, None, None),
            Phase::Attempting { sent } => (1, Some(*sent), None, None),
            Phase::Subscribing => (2, None, None, None),
            Phase::Replicas(grant) => (3, Some(grant.sent_at), Some(*grant), None),
            Phase::TakingBack(Ok(acked)) => (4, None, None, Some(format!("{acked:?}"))),
            Phase::TakingBack(Err(e)) => (5, None, None, Some(error(e))),
            Phase::Waiting => (6, None, None, None),
            Phase::Withdrawing(e) => (7, None, None, Some(error(e))),
            Phase::Done => (8, None, None, None),
        }
    }

    fn request_key<'r>(r: &'r Request<'_>) -> impl Hash + Eq + 'r {
        let what = (r.name, &r.keys, r.protocol.to_text(), r.info);
        (what, r.ttl, r.wait, r.retry, r.replicas, r.renew)
    }

    impl PartialEq for Acquiring<'_> {
        fn eq(&self, other: &Self) -> bool {
            request_key(&self.req) == request_key(&other.req)
                && phase_key(&self.phase) == phase_key(&other.phase)
                && self.token == other.token
                && self.fields() == other.fields()
        }
    }

    impl Eq for Acquiring<'_> {}

    impl Hash for Acquiring<'_> {
        fn hash<H: Hasher>(&self, state: &mut H) {
            request_key(&self.req).hash(state);
            phase_key(&self.phase).hash(state);
            self.token.hash(state);
            self.fields().hash(state);
        }
    }

    impl Acquiring<'_> {
        /// The plain fields.
        #[allow(clippy::type_complexity)]
        fn fields(
            &self,
        ) -> (
            (bool, std::time::Instant, Option<std::time::Instant>, u64),
            (super::Owed, Option<super::Waiter>, u64, u64, u32),
            (
                Option<(std::time::Instant, Option<crate::FencingToken>)>,
                Option<usize>,
                Option<usize>,
                Option<std::time::Instant>,
            ),
        ) {
            (
                (self.waits, self.started, self.deadline, self.seed),
                (
                    self.owed,
                    self.waiter,
                    self.named_wakes,
                    self.named_seen,
                    self.attempts,
                ),
                (
                    self.refused,
                    self.held_at,
                    self.listens_at,
                    self.waiting_since,
                ),
            )
        }
    }
}

/// How much longer than the lease that refused a listed attempt the lock's wake list is
/// kept (`fragments/waiting.lua`): its waiters try again by themselves when that lease
/// ends, and list their clients again if refused; the margin covers their wake-up.
pub const LISTING_MARGIN: Duration = Duration::from_secs(1);

/// Whether a Redlock node got no answer in time (or none before the verdict).
fn any_timed_out(nodes: &[NodeReport]) -> bool {
    nodes.iter().any(|n| {
        matches!(
            n.outcome,
            NodeOutcome::Unavailable(UnavailableReason::TimedOut)
        )
    })
}

/// How long a grant may wait for its replicas: a tenth of the lease, at most 1 s, at
/// least 10 ms.
fn replica_wait(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// What an acquire that ends without the lock owes Redis: a grant of its token that may
/// be there (its latest attempt's, or an earlier one's), and what its attempts did write
/// that only a grant would have made good (a place in line, its client on the wake
/// list).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Owed {
    /// The latest attempt may have granted: it is on its way, or it granted and the
    /// grant was not delivered (replicas awaited, or a take-back failed). A definite
    /// answer to a later attempt settles it.
    latest: bool,
    /// What earlier attempts may have left.
    earlier: Earlier,
    /// A place in line: in a fair queue, or among a read-write lock's waiting writers.
    queued: bool,
    /// The client is (or, not yet answered, may be) on the lock's wake list by name.
    listed: bool,
}

/// What earlier attempts may have left, from the least to the most.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Earlier {
    /// Nothing: each was answered.
    #[default]
    Nothing,
    /// A Redlock take-back may have been lost on a node that did not answer in time (the
    /// driver drops a request that times out before it is written): withdrawn in the
    /// background.
    TakeBackLost,
    /// One got no definite answer (a timeout, a dropped connection): its grant may still
    /// land, so it is withdrawn before the acquire returns without the lock.
    Unanswered,
}

impl Owed {
    /// An attempt goes out; `listed`: it lists the client by name if refused.
    fn sending(&mut self, listed: bool) {
        self.latest = true;
        self.listed |= listed;
    }

    /// A definite answer came; `take_back_lost`: a node of a failed quorum did not hear
    /// its take-back.
    fn answered(&mut self, take_back_lost: bool) {
        self.latest = false;
        if take_back_lost {
            self.earlier = self.earlier.max(Earlier::TakeBackLost);
        }
    }

    /// The attempt failed on `e`: one node's unavailability leaves its outcome unknown,
    /// unless it was not sent (a stalled node); a failed quorum was taken back already.
    fn unreachable(&mut self, e: &Error) {
        self.latest = false;
        let left = match e {
            Error::Unavailable { reason, .. } if *reason != UnavailableReason::Stalled => {
                Earlier::Unanswered
            }
            Error::NoQuorum { nodes, .. } if any_timed_out(nodes) => Earlier::TakeBackLost,
            _ => Earlier::Nothing,
        };
        self.earlier = self.earlier.max(left);
    }

    /// A withdrawal (`undo`) answered `result`. A take-back undoes the latest attempt's
    /// grant and place; what earlier attempts may have left is still owed. A withdrawal
    /// undoes all of it (the wake list's listing is not a withdrawal's). A failed one
    /// leaves it all to the background.
    fn withdrawn(&mut self, undo: Undo, result: Result<(), Error>) {
        match result {
            Ok(()) if undo == Undo::TakeBack => {
                self.latest = false;
                self.queued = false;
            }
            Ok(()) => {
                *self = Owed {
                    listed: self.listed,
                    ..Owed::default()
                };
            }
            Err(e) => {
                tracing::debug!(error = %e, "withdrawing an acquire failed; retrying in the background");
            }
        }
    }

    /// Whether an acquire that ends without the lock withdraws before it returns: for
    /// what only its withdrawal undoes, not for a take-back already sent.
    fn waits_for_withdrawal(&self) -> bool {
        self.latest || self.earlier == Earlier::Unanswered || self.queued
    }

    /// What is left to the background.
    fn cleanup(&self) -> Cleanup {
        Cleanup {
            withdraw: self.waits_for_withdrawal() || self.earlier != Earlier::Nothing,
            unlist: self.listed,
        }
    }
}

/// What decides the pause before the next attempt.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pause {
    pub found: Found,
    /// The retry schedule's pause for this attempt (drawn by the caller).
    pub backoff: Duration,
    /// A waiter with a place in line (fair mode: a third of the waiter timeout; a writer
    /// waiting for readers: a third of its lease): it calls again within this, or
    /// loses the place.
    pub keep_place: Option<Duration>,
    /// Whether release notifications come from every node.
    pub notified_everywhere: bool,
    /// What is left of the caller's wait (`None`: for ever).
    pub left: Option<Duration>,
}

/// The longest a waiter sleeps before its next attempt, if no release notification
/// comes first: what Redis said is left of the lease in the way (the holder's, the first
/// permit's or reader's, a waiting writer's registration: it is gone once that runs
/// out, message or not), else the backoff; at most [`Pause::keep_place`] for a waiter
/// that must call again to keep its place in line; the backoff at most where
/// notifications are missing from a node; never past the caller's wait.
pub(crate) fn next_pause(p: Pause) -> Duration {
    let mut pause = match p.found {
        Found::Held(blocker) => match (blocker.remaining(), p.keep_place) {
            (Some(left), _) if !left.is_zero() => left + Duration::from_millis(1),
            // Free, but others are first in line: its turn comes by message, and it
            // calls again when its place needs keeping (which purges a crashed head).
            (None, Some(keep)) if blocker == Blocker::Queue => keep,
            _ => p.backoff,
        },
        Found::Unreachable => p.backoff,
    };
    if let Found::Held(_) = p.found {
        if let Some(keep) = p.keep_place {
            pause = pause.min(keep);
        }
        if !p.notified_everywhere {
            pause = pause.min(p.backoff);
        }
    }
    match p.left {
        Some(left) => pause.min(left),
        None => pause,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn pause(found: Found) -> Pause {
        Pause {
            found,
            backoff: 40 * MS,
            keep_place: None,
            notified_everywhere: true,
            left: None,
        }
    }

    #[test]
    fn a_handover_message_names_its_waiter_its_token_and_its_lease() {
        let token = [b'a'; 32];
        let message = [b"G ".as_slice(), &token, b" 1795462274400006 2999"].concat();
        assert_eq!(
            Handover::parse(&message),
            Some((
                token.as_slice(),
                Handover {
                    fence: 1_795_462_274_400_006,
                    px: 2999
                }
            ))
        );
        // A bare token (its turn, to take by its own call), and anything malformed.
        for other in [
            &token[..],
            b"G",
            b"G aaaa 12",
            b"G aaaa x 5",
            b"G aaaa 1 -5",
        ] {
            assert_eq!(Handover::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_waiter_sleeps_until_the_holders_lease_runs_out_at_most() {
        let held = |ms| Found::Held(Blocker::Lease(ms * MS));
        assert_eq!(next_pause(pause(held(900))), 901 * MS);
        // A lease ending now, a key without expiry, a queue: the backoff.
        assert_eq!(next_pause(pause(held(0))), 40 * MS);
        assert_eq!(next_pause(pause(Found::Held(Blocker::NoExpiry))), 40 * MS);
        assert_eq!(next_pause(pause(Found::Held(Blocker::Queue))), 40 * MS);
        assert_eq!(next_pause(pause(Found::Unreachable)), 40 * MS);
    }

    #[test]
    fn fair_waiters_call_again_within_a_third_of_their_timeout() {
        let p = Pause {
            keep_place: Some(100 * MS),
            ..pause(Found::Held(Blocker::Lease(900 * MS)))
        };
        assert_eq!(next_pause(p), 100 * MS);
    }

    #[test]
    fn a_waiter_in_line_behind_others_waits_for_its_turn_not_the_backoff() {
        // Free, but others are first: its turn comes by message; it calls again only
        // to keep its place. Polling at the backoff made every waiter of a fair
        // semaphore try again after each release.
        let p = Pause {
            keep_place: Some(1000 * MS),
            ..pause(Found::Held(Blocker::Queue))
        };
        assert_eq!(next_pause(p), 1000 * MS);
        // Without notifications from every node, the backoff still bounds it.
        let p = Pause {
            notified_everywhere: false,
            ..p
        };
        assert_eq!(next_pause(p), 40 * MS);
    }

    #[test]
    fn without_notifications_from_every_node_the_backoff_bounds_the_pause() {
        let p = Pause {
            notified_everywhere: false,
            ..pause(Found::Held(Blocker::Lease(900 * MS)))
        };
        assert_eq!(next_pause(p), 40 * MS);
    }

    #[test]
    fn the_pause_never_runs_past_the_callers_wait() {
        let p = Pause {
            left: Some(7 * MS),
            ..pause(Found::Held(Blocker::Lease(900 * MS)))
        };
        assert_eq!(next_pause(p), 7 * MS);
        let p = Pause {
            left: Some(Duration::ZERO),
            ..pause(Found::Unreachable)
        };
        assert_eq!(next_pause(p), Duration::ZERO);
    }

    /// The machine driven by hand, as a model checker drives it: no driver, no nodes,
    /// no clock but the times given.
    mod by_hand {
        use super::*;
        use crate::protocols::Plain;

        const S: Duration = Duration::from_secs(1);

        fn request(wait: Option<Duration>) -> Request<'static> {
            crate::engine::engine_tests::request(Arc::new(Plain), wait)
        }

        fn token() -> HolderToken {
            HolderToken::from_stored("ab".repeat(16))
        }

        fn held(left: Duration) -> Event {
            Event::Answered(Ok(Outcome::Held {
                refusal: Refusal::by(Blocker::Lease(left)),
                nodes: Vec::new(),
            }))
        }

        #[test]
        fn an_uncontended_acquire_is_one_attempt_then_its_grant() {
            let t0 = Instant::now();
            let mut m = Acquiring::new(request(Some(Duration::ZERO)), token(), 1, t0);
            let Command::Attempt(attempt) = m.start(t0) else {
                panic!("the first command is an attempt");
            };
            let alone = Attempt {
                join: false,
                queued: false,
                listed: Listed::No,
                front: false,
                waits_on: None,
            };
            assert_eq!(attempt, alone);
            let grant = Grant::new(FencingToken::new(7), t0, 30 * S);
            let answered = Event::Answered(Ok(Outcome::Granted {
                grant,
                held_as_other: false,
            }));
            match m.on(answered, t0 + MS) {
                Command::Done(Done {
                    result: Ok(acquired),
                    cleanup,
                }) => {
                    assert_eq!(acquired.grant, grant);
                    assert_eq!(acquired.token, token());
                    assert_eq!(cleanup, Cleanup::default());
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(m.cancel(), Cleanup::default(), "done: nothing owed");
        }

        #[test]
        fn a_waiter_subscribes_tries_again_sleeps_to_the_lease_end_then_lists_by_name() {
            let t0 = Instant::now();
            let mut m = Acquiring::new(request(Some(60 * S)), token(), 1, t0);
            assert!(matches!(m.start(t0), Command::Attempt(_)));
            let subscribe = m.on(held(20 * S), t0);
            assert!(
                matches!(
                    subscribe,
                    Command::Subscribe(Subscribe {
                        only_if_open: false,
                        at: None,
                    })
                ),
                "{subscribe:?}"
            );
            let channels = Channels {
                everywhere: true,
                own_everywhere: true,
                named_wakes: 0,
            };
            match m.on(Event::Subscribed(Some(channels)), t0) {
                Command::Attempt(a) => {
                    assert_eq!((a.join, a.listed, a.front), (true, Listed::ByName, false))
                }
                other => panic!("{other:?}"),
            }
            match m.on(held(20 * S), t0) {
                Command::Sleep { until } => assert_eq!(until, t0 + 20 * S + MS),
                other => panic!("{other:?}"),
            }
            // Woken by name: its next attempt goes to the head of the list if refused.
            let woken = Event::Woken(Woken {
                by: WokenBy::Notification,
                named_wakes: 1,
                handover: None,
            });
            match m.on(woken, t0 + S) {
                Command::Attempt(a) => assert!(a.front, "{a:?}"),
                other => panic!("{other:?}"),
            }
            // Dropped now: its attempt's grant may land, and its client is listed.
            let owed = Cleanup {
                withdraw: true,
                unlist: true,
            };
            assert_eq!(m.cancel(), owed);
        }

        /// A model checker keeps the machine in its states: a clone is equal (and hashes
        /// alike) until one of them takes a step the other does not.
        #[cfg(feature = "model")]
        #[test]
        fn a_clone_is_equal_until_it_steps_apart() {
            use std::hash::BuildHasher;
            let t0 = Instant::now();
            let mut m = Acquiring::new(request(Some(60 * S)), token(), 1, t0);
            let _ = m.start(t0);
            let _ = m.on(held(20 * S), t0);
            let mut other = m.clone();
            assert!(m == other);
            let state = std::hash::RandomState::new();
            assert_eq!(state.hash_one(&m), state.hash_one(&other));
            let _ = m.on(Event::Subscribed(None), t0);
            assert!(m != other);
            let _ = other.on(Event::Subscribed(None), t0);
            assert!(m == other, "the same step from the same state");
        }

        #[test]
        fn the_same_seed_draws_the_same_pauses() {
            let pauses = |seed| {
                let t0 = Instant::now();
                let mut m = Acquiring::new(request(None), token(), seed, t0);
                let _ = m.start(t0);
                (0..8)
                    .map(|i| {
                        let lost = Event::Answered(Err(Error::Unavailable {
                            node: "n".to_owned(),
                            reason: UnavailableReason::TimedOut,
                            detail: String::new(),
                            source: None,
                        }));
                        let now = t0 + i * S;
                        let Command::Sleep { until } = m.on(lost, now) else {
                            panic!("an unreachable node is waited out");
                        };
                        let timer = Event::Woken(Woken {
                            by: WokenBy::Timer,
                            named_wakes: 0,
                            handover: None,
                        });
                        assert!(matches!(m.on(timer, until), Command::Attempt(_)));
                        until - now
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(pauses(7), pauses(7));
            assert_ne!(pauses(7), pauses(8), "the jitter comes from the seed");
        }
    }
}
