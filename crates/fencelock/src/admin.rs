//! Seeing and managing locks as an operator: what Redis holds for one lock
//! ([`Client::inspect`](crate::Client::inspect)), which locks are held
//! ([`Client::list`](crate::Client::list)), and breaking a stuck one
//! ([`Client::break_lock`](crate::Client::break_lock)), and whether a server can evict
//! lock keys ([`Client::eviction_risks`](crate::Client::eviction_risks)). The CLI's
//! `status`, `list` and `break` are built on these.

use std::time::Duration;

use futures_util::future::join_all;

use crate::backend::Backend;
use crate::backend::eviction::{EvictionRisk, PolicyUnknown};
use crate::error::Error;
use crate::keys::{self, LockKeys};
use crate::scripts::replies::{Broke, Inspected};

/// What [`Client::list`](crate::Client::list) found: the held locks, and the nodes that
/// could not be asked (locks held only there are missing from `locks`).
#[derive(Debug)]
#[non_exhaustive]
pub struct Listing {
    /// The held locks, sorted by name.
    pub locks: Vec<LockStatus>,
    /// The nodes whose scan failed, with why, in the order the nodes were given.
    pub unanswered: Vec<Unanswered>,
}

/// A node that [`Client::list`](crate::Client::list) could not ask.
#[derive(Debug)]
#[non_exhaustive]
pub struct Unanswered {
    /// The node, as `host:port`.
    pub node: String,
    /// Why it could not be asked.
    pub error: Error,
}

/// What Redis holds for one lock name, on each node (one for a single node or a Redis
/// Cluster; every Redlock node in the order given).
#[derive(Debug)]
#[non_exhaustive]
pub struct LockStatus {
    /// The lock name.
    pub name: String,
    /// Per node.
    pub nodes: Vec<NodeStatus>,
}

/// One node's part of a [`LockStatus`].
#[derive(Debug)]
#[non_exhaustive]
pub struct NodeStatus {
    /// The node, as `host:port` (on a Redis Cluster, the master of the lock's slot).
    pub node: String,
    /// What it holds, or why it could not say.
    pub state: Result<LockState, Error>,
    /// Redlock restart protection: how much longer this client leaves the node's
    /// grants out of a majority because the server restarted recently (the client's
    /// quarantine; a lease longer than that is kept out for its own length), as far as
    /// this client knows: it learns a server's uptime when it connects and from its
    /// acquires. `None`: the node counts, or the protection is off, or this is not a
    /// Redlock client.
    pub restart_protection: Option<Duration>,
}

/// What one node holds for a lock, read in one consistent snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// Who holds it; `None` when it is free.
    pub holder: Option<Holder>,
    /// The fencing counter: the last token handed out (`None` if there is none yet).
    pub fencing_counter: Option<u64>,
    /// What the holder said about itself
    /// ([`LockBuilder::holder_info`](crate::LockBuilder::holder_info)), if anything.
    pub holder_info: Option<String>,
    /// Fair mode: the waiters in line, first first.
    pub waiters: Vec<QueuedWaiter>,
    /// A read-write lock: how many writers wait for its readers (new readers queue
    /// behind them).
    pub writers_waiting: u32,
    /// A semaphore with no permit held (`holder` is `None`) whose permit count is still
    /// recorded: the name is a semaphore's, which a lock cannot take
    /// ([`Error::WrongType`]) until the count expires with the fencing counter. `None`
    /// otherwise (a held semaphore shows as [`Holder::Semaphore`]).
    pub idle_semaphore: Option<u32>,
    /// The clients with a waiting acquire of a plain lock (or a semaphore that is not
    /// fair), from its wake list, first listed first: the one a release wakes next.
    pub waiting_clients: Vec<WaitingClient>,
}

/// A client listed on a lock's wake list: one or more of its acquires wait for the lock
/// (see [`LockBuilder`](crate::LockBuilder)'s "How waiting works").
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitingClient {
    /// The client's random tag ([`Client::tag`](crate::Client::tag) in the process that
    /// waits), or `*` for readers or reentrant owners waiting behind a plain holder
    /// (all of which a release wakes).
    pub client: String,
    /// How long ago it was listed (a client woken and refused again keeps its place).
    pub listed_for: Duration,
}

/// A waiter in a fair lock's queue (or a fair semaphore's).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuedWaiter {
    /// How long it may stay silent before the queue drops it as crashed (`None`: no
    /// deadline recorded).
    pub timeout_left: Option<Duration>,
    /// What it says about itself, the [`holder_info`](crate::LockBuilder::holder_info)
    /// it will hold the lock with (`fencelock run` writes its host, pid, command and
    /// start), if anything.
    pub info: Option<String>,
}

/// Who holds a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Holder {
    /// A plain or fair holder (or another library writing the token as a plain string).
    Plain {
        /// What is left of its lease (`None`: the key has no expiry).
        remaining: Option<Duration>,
    },
    /// Holds of one owner of a [reentrant](crate::LockBuilder::reentrant) lock.
    Reentrant {
        /// The owner id.
        owner: String,
        /// How many holds it has.
        holds: u64,
        /// What is left of its lease (`None`: no expiry).
        remaining: Option<Duration>,
    },
    /// Permits of a [semaphore](crate::SemaphoreBuilder).
    Semaphore {
        /// Its permit count (`None`: not stored, e.g. expired with an idle counter; or
        /// not read, in a [`BreakOutcome`]).
        permits: Option<u32>,
        /// What is left of each held permit's lease, soonest first; as many as are held.
        held: Vec<Duration>,
    },
    /// Readers of a [read-write lock](crate::ReadLockBuilder) (its writer shows as
    /// [`Plain`](Self::Plain) or [`Reentrant`](Self::Reentrant)).
    Readers {
        /// What is left of each reader's lease, soonest first; as many as read.
        held: Vec<Duration>,
    },
    /// The key holds data fencelock did not write.
    Foreign {
        /// The Redis type found.
        found: String,
    },
}

/// What [`Client::break_lock`](crate::Client::break_lock) did, on each node.
#[derive(Debug)]
#[non_exhaustive]
pub struct Broken {
    /// The lock name.
    pub name: String,
    /// Per node.
    pub nodes: Vec<NodeBroken>,
}

/// One node's part of a [`Broken`].
#[derive(Debug)]
#[non_exhaustive]
pub struct NodeBroken {
    /// The node, as `host:port` (on a Redis Cluster, the master of the lock's slot).
    pub node: String,
    /// What was broken there, or why not.
    pub outcome: Result<BreakOutcome, Error>,
}

/// What was broken on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakOutcome {
    /// Who held the lock, with what was left of its lease; `None` if it was free
    /// (nothing was deleted).
    pub broke: Option<Holder>,
    /// The fencing counter after the break: every token handed out before is lower, so
    /// a resource that checks tokens refuses the evicted holder's late writes once the
    /// next holder has written.
    pub fencing_counter: Option<u64>,
}

fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

fn counter(text: &str) -> Option<u64> {
    text.parse().ok()
}

fn holder(kind: &str, pttl: i64, holds: u64, owner: String) -> Option<Holder> {
    match kind {
        "none" => None,
        "plain" => Some(Holder::Plain {
            remaining: remaining(pttl),
        }),
        "reentrant" => Some(Holder::Reentrant {
            owner,
            holds,
            remaining: remaining(pttl),
        }),
        other => Some(Holder::Foreign {
            found: other.to_owned(),
        }),
    }
}

impl From<Inspected> for LockState {
    fn from(i: Inspected) -> Self {
        let held = || {
            i.permit_leases
                .iter()
                .filter_map(|ms| remaining(*ms))
                .collect()
        };
        let holder = match i.kind.as_str() {
            "semaphore" => Some(Holder::Semaphore {
                permits: u32::try_from(i.permits).ok().filter(|n| *n > 0),
                held: held(),
            }),
            "readers" => Some(Holder::Readers { held: held() }),
            _ => holder(&i.kind, i.pttl, i.holds, i.owner.clone()),
        };
        Self {
            holder,
            fencing_counter: counter(&i.counter),
            holder_info: Some(i.info).filter(|s| !s.is_empty()),
            waiters: i
                .waiters
                .into_iter()
                .zip(
                    i.waiter_info
                        .into_iter()
                        .map(Some)
                        .chain(std::iter::repeat(None)),
                )
                .map(|(ms, info)| QueuedWaiter {
                    timeout_left: u64::try_from(ms).ok().map(Duration::from_millis),
                    info: info.filter(|s| !s.is_empty()),
                })
                .collect(),
            writers_waiting: u32::try_from(i.writers).unwrap_or(0),
            idle_semaphore: if i.kind == "none" {
                u32::try_from(i.permits).ok().filter(|n| *n > 0)
            } else {
                None
            },
            waiting_clients: i
                .listed
                .into_iter()
                .map(|(client, ms)| WaitingClient {
                    client,
                    listed_for: Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
                })
                .collect(),
        }
    }
}

impl From<Broke> for BreakOutcome {
    fn from(b: Broke) -> Self {
        let held = || {
            b.permit_leases
                .iter()
                .filter_map(|ms| remaining(*ms))
                .collect()
        };
        let broke = match b.kind.as_str() {
            "semaphore" => Some(Holder::Semaphore {
                permits: None,
                held: held(),
            }),
            "readers" => Some(Holder::Readers { held: held() }),
            _ => holder(&b.kind, b.pttl, 0, b.owner.clone()),
        };
        Self {
            broke,
            fencing_counter: counter(&b.counter),
        }
    }
}

/// Every node's answer, or the first node's error if none answered.
fn all_failed<T>(answers: &[Result<T, Error>]) -> bool {
    answers.iter().all(Result::is_err)
}

pub(crate) async fn inspect(
    backend: &Backend,
    prefix: &str,
    name: &str,
) -> Result<LockStatus, Error> {
    let keys = LockKeys::new(prefix, name)?;
    let answers = backend.inspect(&keys).await;
    if all_failed(&answers) {
        return Err(first_err(answers));
    }
    let protected = backend.restart_protection_left();
    let nodes = backend
        .nodes()
        .iter()
        .zip(answers)
        .zip(protected)
        .map(|((node, answer), restart_protection)| NodeStatus {
            node: node.addr_for(&keys.lock),
            state: answer.map(LockState::from),
            restart_protection,
        })
        .collect();
    Ok(LockStatus {
        name: name.to_owned(),
        nodes,
    })
}

pub(crate) async fn list(backend: &Backend, prefix: &str, pattern: &str) -> Result<Listing, Error> {
    keys::validate_pattern(pattern)?;
    let glob = keys::lock_key_glob(prefix, pattern);
    let answers = backend.scan(&glob).await;
    if all_failed(&answers) {
        return Err(first_err(answers));
    }
    let mut names = Vec::new();
    let mut unanswered = Vec::new();
    for (answer, node) in answers.into_iter().zip(backend.nodes()) {
        match answer {
            Ok(keys) => names.extend(
                keys.iter()
                    .filter_map(|key| keys::name_of(prefix, key).map(str::to_owned)),
            ),
            Err(error) => unanswered.push(Unanswered {
                node: node.addr(),
                error,
            }),
        }
    }
    names.sort();
    names.dedup();
    let mut locks = Vec::with_capacity(names.len());
    for name in names {
        let status = inspect(backend, prefix, &name).await?;
        let is_held = status
            .nodes
            .iter()
            .any(|n| n.state.as_ref().is_ok_and(|s| s.holder.is_some()));
        if is_held {
            locks.push(status);
        }
    }
    Ok(Listing { locks, unanswered })
}

/// What [`Client::set_permits`](crate::Client::set_permits) found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resize {
    /// The permit count before (`None`: the semaphore had none stored).
    pub previous: Option<u32>,
    /// The permits held at that moment (leases not yet over); more than the new count
    /// after a shrink, until releases and expiries bring them under it.
    pub held: u32,
}

pub(crate) async fn set_permits(
    backend: &Backend,
    prefix: &str,
    name: &str,
    permits: u32,
) -> Result<Resize, Error> {
    let keys = LockKeys::new(prefix, name)?;
    crate::semaphore::check_semaphore(backend.is_redlock(), permits)?;
    let answer = backend
        .resize(&keys, permits)
        .await
        .into_iter()
        .next()
        .unwrap_or_else(|| Err(Error::invalid("nodes", "none given")))?;
    Ok(Resize {
        previous: u32::try_from(answer.previous).ok().filter(|n| *n > 0),
        held: u32::try_from(answer.held).unwrap_or(u32::MAX),
    })
}

pub(crate) async fn break_lock(
    backend: &Backend,
    prefix: &str,
    name: &str,
) -> Result<Broken, Error> {
    let keys = LockKeys::new(prefix, name)?;
    let answers = backend.break_lock(&keys).await;
    if all_failed(&answers) {
        return Err(first_err(answers));
    }
    let nodes = backend
        .nodes()
        .iter()
        .zip(answers)
        .map(|(node, answer)| NodeBroken {
            node: node.addr_for(&keys.lock),
            outcome: answer.map(BreakOutcome::from),
        })
        .collect();
    Ok(Broken {
        name: name.to_owned(),
        nodes,
    })
}

fn first_err<T>(answers: Vec<Result<T, Error>>) -> Error {
    answers
        .into_iter()
        .find_map(Result::err)
        .unwrap_or_else(|| Error::invalid("nodes", "none given"))
}

/// What [`Client::eviction_risks`](crate::Client::eviction_risks) found: the servers
/// that can evict lock keys, and the nodes that could not be asked.
#[derive(Debug)]
#[non_exhaustive]
pub struct Eviction {
    /// The servers whose memory settings let them delete lock keys before their lease
    /// ends, in the order of the nodes (a cluster: of its masters).
    pub risks: Vec<EvictionRisk>,
    /// The nodes whose `INFO memory` failed, with why.
    pub unanswered: Vec<Unanswered>,
    /// The servers that answered, but whose policy could not be read (`INFO` renamed
    /// away or not allowed to the Redis user, or an answer without the policy): whether
    /// they can evict lock keys is unknown, and why is said.
    pub unknown: Vec<PolicyUnknown>,
}

pub(crate) async fn eviction_risks(backend: &Backend) -> Result<Eviction, Error> {
    let answers = join_all(backend.nodes().iter().map(|n| n.eviction_risks())).await;
    if all_failed(&answers) {
        return Err(first_err(answers));
    }
    let mut eviction = Eviction {
        risks: Vec::new(),
        unanswered: Vec::new(),
        unknown: Vec::new(),
    };
    for (answer, node) in answers.into_iter().zip(backend.nodes()) {
        match answer {
            Ok((risks, unknown)) => {
                eviction.risks.extend(risks);
                eviction.unknown.extend(unknown);
            }
            Err(error) => eviction.unanswered.push(Unanswered {
                node: node.addr(),
                error,
            }),
        }
    }
    Ok(eviction)
}
