//! The one error type of fencelock, with a variant for each thing a caller handles
//! differently.

use std::fmt;
use std::time::Duration;

use crate::token::FencingToken;

/// Everything that can go wrong when taking, extending or releasing a lock, or using a
/// [`DelayQueue`](crate::DelayQueue).
///
/// Each variant is a different situation with a different remedy; the message of each
/// says what to do, on one line. Match on the variant, not on the message. An error that
/// came from the Redis driver keeps it as its [`source`](std::error::Error::source).
/// Variants and their fields may grow: match with `..` (the compiler insists).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another owner holds the lock (or, in fair mode, other waiters are first in line),
    /// and the caller did not wait, or waited as long as it was willing to. The same
    /// for one node and for Redlock.
    #[error("{}", held_message(name, *blocked_by, *waited, nodes))]
    #[non_exhaustive]
    Held {
        /// The lock name.
        name: String,
        /// What stood in the way at the last attempt: another owner's lease (and how
        /// long it still runs), or other waiters first in line.
        blocked_by: Blocker,
        /// How long the caller waited (zero for a single attempt).
        waited: Duration,
        /// Redlock: what each node answered at the last attempt, in the order the nodes
        /// were given; empty for a single node.
        nodes: Vec<NodeReport>,
    },

    /// A Redis node could not be reached, or did not answer in time. For a timed-out
    /// acquire the outcome is unknown; fencelock then releases its token in the background
    /// so nothing is left behind for longer than the lease. A single-node grant whose reply
    /// came back after the lease had already run out is reported this way too (reason
    /// [`LateGrant`](UnavailableReason::LateGrant)), after fencelock took it back: another
    /// client may have held the lock by then.
    #[error(
        "Redis node {node} is unavailable ({reason}{}{detail}){}",
        if detail.is_empty() { "" } else { ": " },
        reason.advice()
    )]
    #[non_exhaustive]
    Unavailable {
        /// The node, as `host:port` (never with credentials).
        node: String,
        /// Why it is considered unavailable.
        reason: UnavailableReason,
        /// What fencelock knows beyond the reason, such as how long it waited (may be
        /// empty).
        detail: String,
        /// What the driver reported, if the driver reported it.
        #[source]
        source: Option<DriverError>,
    },

    /// A Redis node answered with an error: authentication (`NOAUTH`, `WRONGPASS`),
    /// permissions (`NOPERM`), a read-only replica (`READONLY`), out of memory (`OOM`),
    /// and the like. Retrying will not help until the server or the configuration changes.
    #[error(
        "Redis node {node} refused the command ({message}){}",
        rejected_advice(code)
    )]
    #[non_exhaustive]
    Rejected {
        /// The node, as `host:port`.
        node: String,
        /// The server's error code, such as `NOAUTH`.
        code: String,
        /// The server's whole error message.
        message: String,
    },

    /// A lock key, its fencing counter, or a queue key holds data fencelock did not write
    /// (a hash, a list, a non-numeric counter, ...), or the name is used by another kind
    /// of primitive: on a lock key, a `zset` is a semaphore's permits (met by a lock or
    /// a reader), `readers` a read-write lock's readers (met by a semaphore or a fair
    /// lock), a `string` a lock and a `hash` a reentrant lock (met by a semaphore); the
    /// message names the kind. A name's kind is also kept while nothing holds it, for as
    /// long as its fencing counter lives: `found` is `semaphore` (on the counter key) when
    /// a lock or a reader meets a semaphore's name with no permit held, and `lock` (on
    /// the lock key) when a semaphore meets a free lock's name. fencelock never
    /// overwrites it.
    #[error("{}", wrong_type_message(node, key, found))]
    #[non_exhaustive]
    WrongType {
        /// The node, as `host:port`.
        node: String,
        /// The key in question.
        key: String,
        /// The Redis type found there (`"string"` for a counter that is not an integer),
        /// or the kind of primitive whose name it is (`"semaphore"`, `"lock"`).
        found: String,
    },

    /// A semaphore was asked for with a permit count other than the one it has (set by
    /// the first acquire, and kept while permits are held or its fencing counter lives).
    /// Nothing was written: a disagreeing client never changes the count silently.
    #[error(
        "semaphore {name:?} on {node} has {count} permits, not the {asked} asked for; every client of one semaphore must ask for the same count"
    )]
    #[non_exhaustive]
    PermitsMismatch {
        /// The node, as `host:port`.
        node: String,
        /// The semaphore's name.
        name: String,
        /// The permit count it has.
        count: u32,
        /// The permit count this client asked for.
        asked: u32,
    },

    /// A `fencelock::blocking` call (feature `blocking`) could not block: it was made from a thread
    /// inside a Tokio runtime (an async task, or `spawn_blocking`), where blocking would
    /// stall the runtime (Tokio panics when asked to), or the client's own runtime could
    /// not be started. Nothing was sent to Redis: use the async API there.
    #[error("fencelock::blocking: {reason}")]
    #[non_exhaustive]
    Blocking {
        /// Which of the two, in words.
        reason: String,
    },

    /// An argument was out of range or malformed. Nothing was sent to Redis.
    #[error("invalid {what}: {reason}")]
    #[non_exhaustive]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// What is wrong with it, and what is accepted.
        reason: String,
    },

    /// Redlock: too few nodes could grant the lock, other than because another owner
    /// holds it (that is [`Error::Held`]): nodes unreachable, too slow, refusing, or
    /// quarantined after a restart. Says, per node, what happened.
    #[error(
        "lock {name:?} needs {needed} of {} Redis nodes and got {granted}: {}; check that a majority of the nodes is up and reachable",
        nodes.len(),
        NodeList(nodes)
    )]
    #[non_exhaustive]
    NoQuorum {
        /// The lock name.
        name: String,
        /// The majority needed.
        needed: usize,
        /// How many nodes granted it (each sent a take-back before this error).
        granted: usize,
        /// What each node answered, in the order the nodes were given.
        nodes: Vec<NodeReport>,
    },

    /// The lock was granted, but fewer replicas than asked for
    /// ([`LockBuilder::replicas`](crate::LockBuilder::replicas)) acknowledged the grant in
    /// time: a failover now could lose it, so it was released again. Retrying may help
    /// once the replicas catch up.
    #[error(
        "lock {name:?} was granted, but only {acknowledged} of {wanted} replicas acknowledged it within {}; it was released again, since a failover now could lose it: check the replicas' link (INFO replication) or ask for fewer",
        HumanDuration(*within)
    )]
    #[non_exhaustive]
    Unreplicated {
        /// The lock name.
        name: String,
        /// How many replicas were asked for.
        wanted: u32,
        /// How many acknowledged.
        acknowledged: u32,
        /// How long the grant waited for them.
        within: Duration,
    },

    /// The caller's lease ended before the caller released or extended it: the work done
    /// under it may have overlapped with another holder's.
    #[error(
        "the lease on lock {name:?} was lost ({cause}); work done under it may have overlapped another holder's: check the fencing token at the resource, and {}",
        cause.advice()
    )]
    #[non_exhaustive]
    LeaseLost {
        /// The lock name.
        name: String,
        /// What Redis showed instead of the caller's token.
        cause: LossCause,
    },

    /// A resource refused a write whose fencing token is lower than one it accepted
    /// already ([`fence`](crate::fence)): a newer holder has written since this
    /// holder's token was minted, so this holder lost its lock (a pause past its lease,
    /// a lost lease it did not notice, a broken lock). Nothing was written (PostgreSQL:
    /// the transaction is to be rolled back). Stop working on the resource; take the
    /// lock again for a new token.
    #[error(
        "resource {resource:?} refused fencing token {token}: it accepted token {highest} already, so this holder lost its lock; nothing was written: stop, and take the lock again for a new token"
    )]
    #[non_exhaustive]
    Fenced {
        /// The resource's name (the name of the lock that guards it).
        resource: String,
        /// The token this holder wrote with.
        token: FencingToken,
        /// The higher token the resource accepted before.
        highest: FencingToken,
    },

    /// PostgreSQL failed a fencing check ([`fence`](crate::fence)) for a reason other
    /// than a stale token: the connection, permissions, a serialization failure, an
    /// aborted transaction, or the setup not installed in this database (SQLSTATE
    /// `42883` or `42P01`: run `fencelock sql`). The transaction is to be rolled back.
    #[error("{}", database_message(resource, code.as_deref(), message))]
    #[non_exhaustive]
    Database {
        /// The resource whose check failed (empty for an install).
        resource: String,
        /// The SQLSTATE, when the server answered with an error.
        code: Option<String>,
        /// What the database client said.
        message: String,
        /// The database client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl Error {
    /// A copy, for the engine's machine, which a model checker clones with its state
    /// (`Error` is not `Clone`: a database error's source is any error). A database
    /// error's source becomes its message.
    pub(crate) fn duplicate(&self) -> Error {
        /// Each variant rebuilt from clones of its fields.
        macro_rules! cloned {
            ($($variant:ident { $($field:ident),* }),* $(,)?) => {
                match self {
                    $(Error::$variant { $($field),* } => Error::$variant {
                        $($field: $field.clone()),*
                    },)*
                    Error::Database { resource, code, message, source } => Error::Database {
                        resource: resource.clone(),
                        code: code.clone(),
                        message: message.clone(),
                        source: source.to_string().into(),
                    },
                }
            };
        }
        cloned!(
            Held {
                name,
                blocked_by,
                waited,
                nodes
            },
            Unavailable {
                node,
                reason,
                detail,
                source
            },
            Rejected {
                node,
                code,
                message
            },
            WrongType { node, key, found },
            PermitsMismatch {
                node,
                name,
                count,
                asked
            },
            Blocking { reason },
            InvalidArgument { what, reason },
            NoQuorum {
                name,
                needed,
                granted,
                nodes
            },
            Unreplicated {
                name,
                wanted,
                acknowledged,
                within
            },
            LeaseLost { name, cause },
            Fenced {
                resource,
                token,
                highest
            },
        )
    }
}

/// Whether a database error says the setup is missing: the function or the table does
/// not exist (SQLSTATE `42883`, `42P01`), and the message names it.
pub(crate) fn setup_missing(code: Option<&str>, message: &str) -> bool {
    matches!(code, Some("42883" | "42P01"))
        && (message.contains("fencelock_check") || message.contains("fencelock_fence"))
}

/// [`Error::Database`]'s message: a missing setup says how to install it.
fn database_message(resource: &str, code: Option<&str>, message: &str) -> String {
    let missing = setup_missing(code, message);
    let code = code.map(|c| format!(" (SQLSTATE {c})")).unwrap_or_default();
    if missing {
        return format!(
            "the fencing check is not installed in this PostgreSQL database{code}: {message}; install it once with `fencelock sql | psql \"$DATABASE_URL\"` (or fencelock::fence's install)"
        );
    }
    if resource.is_empty() {
        return format!("PostgreSQL failed to install the fencing check{code}: {message}");
    }
    format!(
        "PostgreSQL failed the fencing check of resource {resource:?}{code}: {message}; the transaction is to be rolled back"
    )
}

/// An error of the Redis driver, kept as the [`source`](std::error::Error::source) of a
/// fencelock [`Error`]: its message, and its own source if it has one.
#[derive(Debug, Clone)]
pub struct DriverError(redis::RedisError);

impl DriverError {
    pub(crate) fn new(e: redis::RedisError) -> Self {
        Self(e)
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// What to do about a refusal, by the server's error code.
fn rejected_advice(code: &str) -> &'static str {
    match code {
        "NOAUTH" | "WRONGPASS" => ": check the user name and password (redis://user:password@host)",
        "NOPERM" => {
            ": give the Redis user what the ACL line of fencelock's guide (security chapter) allows (ACL SETUSER fencelock ...)"
        }
        "READONLY" => {
            ": point fencelock at the master, or use redis+sentinel:// (which follows the master)"
        }
        "OOM" => ": it is out of memory (maxmemory); free memory or raise the limit",
        "MASTERDOWN" => ": its master is down; wait for a failover",
        "LOADING" => ": it is loading its data; try again shortly",
        "VERSION" => ": upgrade the server",
        _ => "",
    }
}

fn held_message(name: &str, blocked_by: Blocker, waited: Duration, nodes: &[NodeReport]) -> String {
    let nodes = if nodes.is_empty() {
        String::new()
    } else {
        format!(" ({})", NodeList(nodes))
    };
    let (kind, free) = match blocked_by {
        Blocker::Permits { .. } => ("semaphore", "has no free permit"),
        Blocker::WritersWaiting { .. } => ("read-write lock", "has no room for a reader"),
        _ => ("lock", "is not free"),
    };
    if waited.is_zero() {
        format!(
            "{kind} {name:?} {free}: {blocked_by}{nodes}; try again later, wait for it, or defer the work"
        )
    } else {
        format!(
            "gave up on {kind} {name:?} after waiting {}: {blocked_by}{nodes}; wait longer or defer the work",
            HumanDuration(waited)
        )
    }
}

impl Error {
    /// [`Error::LeaseLost`] for the lock `name`: what work raced against
    /// [`LockGuard::lost`](crate::LockGuard::lost) returns when the lease goes first.
    pub fn lease_lost(name: impl Into<String>, cause: LossCause) -> Self {
        Error::LeaseLost {
            name: name.into(),
            cause,
        }
    }

    /// Whether this is contention ([`Error::Held`]: another owner holds the lock; retry
    /// later, wait, or defer) rather than an outage or a mistake.
    pub fn is_contention(&self) -> bool {
        matches!(self, Self::Held { .. })
    }

    /// `value` of `what` outside `min..=max`, if it is; durations written for people.
    pub(crate) fn check_range(
        what: &'static str,
        value: Duration,
        min: Duration,
        max: Duration,
    ) -> Result<(), Self> {
        if (min..=max).contains(&value) {
            return Ok(());
        }
        Err(Self::invalid(
            what,
            format!(
                "{} is out of range; give between {} and {}",
                HumanDuration(value),
                HumanDuration(min),
                HumanDuration(max)
            ),
        ))
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }
}

/// What keeps a lock from being taken, as Redis reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Blocker {
    /// Another owner holds the lock; its lease, as Redis reported it, ends in about this
    /// much (zero: it is ending now) *unless its holder renews it*. A live holder renews
    /// it every third of its lease and may release at any moment: this bounds how long a
    /// crashed holder blocks the lock, not how long a live one will hold it (so it is
    /// no `Retry-After`).
    Lease(Duration),
    /// Another owner's key has no expiry (written by something other than a lock
    /// library): it will not free itself.
    NoExpiry,
    /// Fair mode: the lock is free, but other waiters are first in line.
    Queue,
    /// A semaphore: all its permits are held; the first of their leases ends in about
    /// `frees_in` (zero: now).
    #[non_exhaustive]
    Permits {
        /// The semaphore's permit count.
        permits: u32,
        /// How long until the first held permit's lease ends.
        frees_in: Duration,
    },
    /// A read-write lock's readers hold it (met by a writer, which waits for them all);
    /// the first of their leases ends in about `frees_in` (zero: now).
    #[non_exhaustive]
    Readers {
        /// How many readers hold it.
        readers: u32,
        /// How long until the first reader's lease ends.
        frees_in: Duration,
    },
    /// A read-write lock's writers wait for its readers (met by a new reader, which
    /// queues behind them: writers are not starved). The first of them is given up on
    /// within about `within` unless it calls again.
    #[non_exhaustive]
    WritersWaiting {
        /// How many writers wait.
        writers: u32,
        /// How long the first waiting writer stays registered without calling again.
        within: Duration,
    },
}

impl Blocker {
    /// How long the holder's lease still runs, if it is a lease.
    pub fn remaining(self) -> Option<Duration> {
        match self {
            Self::Lease(d)
            | Self::Permits { frees_in: d, .. }
            | Self::Readers { frees_in: d, .. }
            | Self::WritersWaiting { within: d, .. } => Some(d),
            Self::NoExpiry | Self::Queue => None,
        }
    }

    /// The one that frees up sooner (a shorter lease before a longer one, a lease
    /// before a key without expiry).
    pub(crate) fn sooner(self, other: Self) -> Self {
        match (self, other) {
            (Self::Lease(a), Self::Lease(b)) => Self::Lease(a.min(b)),
            (Self::NoExpiry, _) => other,
            (_, Self::NoExpiry) => self,
            _ if std::mem::discriminant(&self) == std::mem::discriminant(&other) => {
                if self.remaining() <= other.remaining() {
                    self
                } else {
                    other
                }
            }
            _ => self,
        }
    }
}

/// [`Error::WrongType`]'s message: on a lock key, another kind of primitive is named.
fn wrong_type_message(node: &str, key: &str, found: &str) -> String {
    // A semaphore's marked fencing counter: the name is a semaphore's, idle or not.
    if found == "semaphore" {
        return format!(
            "key {key:?} on {node} is a semaphore's fencing counter: the name holds a semaphore (whether or not a permit is held now), not a lock; it was left untouched: one name is one kind of primitive while its counter lives, so use another name or take it as a semaphore"
        );
    }
    // A lock key ends with its name's hash tag; the other keys have a suffix after it.
    let kind = if key.ends_with('}') {
        match found {
            "zset" => Some("a semaphore (its permits: a Redis zset), not a lock"),
            "readers" => {
                Some("a read-write lock's readers (a Redis zset), not a semaphore or a fair lock")
            }
            "string" => Some("a lock (a Redis string), not a semaphore"),
            "hash" => Some("a reentrant lock (a Redis hash), not a semaphore"),
            "lock" => Some(
                "no holder, but the name is a lock's (its fencing counter is recorded), not a semaphore's",
            ),
            _ => None,
        }
    } else {
        None
    };
    match kind {
        Some(kind) => format!(
            "key {key:?} on {node} holds {kind}; it was left untouched: one name is one kind of primitive, so use another name or take it as what it is"
        ),
        None => format!(
            "key {key:?} on {node} holds a Redis {found} that fencelock did not write; it was left untouched: use another lock name or key prefix, or remove the key"
        ),
    }
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lease(d) if d.is_zero() => {
                f.write_str("another owner holds it; its lease is ending now")
            }
            // The remaining lease bounds a crashed holder only: a live one renews it and
            // may release any moment, so it is said as what it is, not as a wait.
            Self::Lease(d) => write!(
                f,
                "another owner holds it; its lease ends in {} unless the holder renews it (a live holder does, and releases when its work is done)",
                HumanDuration(*d)
            ),
            Self::NoExpiry => {
                f.write_str("another owner's key has no expiry, so it will not free itself")
            }
            Self::Queue => f.write_str("it is free, but other waiters are first in line"),
            Self::Permits { permits, frees_in } => {
                match permits {
                    1 => f.write_str("its one permit is held")?,
                    n => write!(f, "all {n} permits are held")?,
                }
                first_lease(f, *frees_in)
            }
            Self::Readers { readers, frees_in } => {
                match readers {
                    1 => f.write_str("a reader holds it")?,
                    n => write!(f, "{n} readers hold it")?,
                }
                first_lease(f, *frees_in)
            }
            Self::WritersWaiting { writers, .. } => match writers {
                1 => f.write_str("a writer waits for the readers, and new readers go after it"),
                n => write!(
                    f,
                    "{n} writers wait for the readers, and new readers go after them"
                ),
            },
        }
    }
}

/// `; the first lease ends in about 4s` (of held permits or readers).
fn first_lease(f: &mut fmt::Formatter<'_>, frees_in: Duration) -> fmt::Result {
    if frees_in.is_zero() {
        f.write_str("; the first lease is ending now")
    } else {
        write!(
            f,
            "; the first lease ends in about {}",
            HumanDuration(frees_in)
        )
    }
}

/// Why a node counts as unavailable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnavailableReason {
    /// Nothing accepted the connection.
    Refused,
    /// Connecting, or waiting for the reply, took longer than the configured timeout.
    TimedOut,
    /// The connection broke or another I/O error happened.
    Io,
    /// The TLS handshake failed: a certificate problem, named in the detail.
    Tls,
    /// A Redis Cluster answered `CLUSTERDOWN`: a slot has no master (a failover in
    /// progress, or slots never assigned), so the cluster serves nothing (or not this
    /// lock's slot) for now.
    ClusterDown,
    /// A Redis Cluster kept redirecting the call (`MOVED`, `ASK`, `TRYAGAIN`) after the
    /// driver followed it several times, or the node it reached is a replica
    /// (`READONLY`): the lock's slot is moving (a failover or a resharding in progress).
    SlotMoving,
    /// A grant came back after its lease had run out (a slow link, a paused server, or
    /// a lease too short for the round trip): fencelock took it back, since another
    /// client may have held the lock by then. The detail says how late.
    LateGrant,
    /// The server stopped answering on a connection that is still open (stopped,
    /// hung, or behind a link that swallows what is sent): several calls in a row got no
    /// answer, so this call was **not sent**: an acquire (nothing was written, and
    /// nothing needs taking back), or a Redlock release of a lease that node cannot hold
    /// (its acquire was not sent either). Calls go out again as soon as the server
    /// answers (fencelock asks it with a `PING` on a connection of its own) or the
    /// connection is replaced. Releases and renewals of leases it may hold are still
    /// sent. A standalone or Sentinel node only: a Redis Cluster node does not stall.
    Stalled,
}

impl UnavailableReason {
    /// What to check, after the message (the TLS detail says it already).
    fn advice(self) -> &'static str {
        match self {
            Self::Tls => "",
            Self::ClusterDown => {
                "; wait for a failover to end, or check CLUSTER INFO and that every slot has a master"
            }
            Self::SlotMoving => "; wait for the failover or resharding to end",
            Self::LateGrant => {
                "; the link or the server is slower than the lease allows: use a longer lease, or find what delays the replies"
            }
            Self::Stalled => {
                "; check that the server is not stopped or overloaded, and that replies get through to this host"
            }
            _ => "; check that it is running and reachable, and the URL",
        }
    }
}

impl fmt::Display for UnavailableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Refused => "connection refused",
            Self::TimedOut => "timed out",
            Self::Io => "connection error",
            Self::Tls => "TLS handshake failed",
            Self::ClusterDown => "the cluster is down",
            Self::SlotMoving => "the lock's slot is moving",
            Self::LateGrant => "the grant came back too late",
            Self::Stalled => "it stopped answering",
        })
    }
}

/// What happened to a lease that was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossCause {
    /// The key was gone and the lease had run out by the local clock: it expired (the
    /// holder was paused, or Redis's clock ran ahead).
    Expired,
    /// The key was gone while the lease still had time left, and the fencing counter
    /// shows no later grant: something deleted it (`DEL`, `FLUSHDB`, an eviction, a
    /// restart or failover that lost it), not fencelock.
    Deleted,
    /// The key was gone and the fencing counter had moved past this holder's token with
    /// nobody holding the lock: it was broken (`fencelock break`,
    /// [`Client::break_lock`](crate::Client::break_lock)), or deleted and then taken and
    /// released by another holder.
    Broken,
    /// The key held another owner's token: the lease expired and someone else took the
    /// lock (or the key was overwritten).
    TakenByOther,
    /// No renewal could be confirmed (Redis unreachable or too slow) before the lease
    /// would run out by the local clock. Redis may still hold the key for a moment, but
    /// the holder can no longer count on it.
    Unconfirmed,
    /// The maximum hold ([`LockBuilder::max_hold`](crate::LockBuilder::max_hold)) was
    /// reached: renewals stopped and the lease ran out, as asked.
    MaxHold,
}

impl fmt::Display for LossCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Expired => "the key was gone: the lease ran out before a renewal reached it",
            Self::Deleted => "the key was deleted while the lease was still running",
            Self::Broken => {
                "the lock was broken (fencelock break): the fencing counter had moved past this holder's token"
            }
            Self::TakenByOther => "another owner holds the lock now",
            Self::Unconfirmed => "no renewal was confirmed before the lease ran out",
            Self::MaxHold => "the maximum hold was reached",
        })
    }
}

impl LossCause {
    /// What to do about it, for messages: the end of [`Error::LeaseLost`]'s.
    pub fn advice(self) -> &'static str {
        match self {
            Self::Expired | Self::Unconfirmed => "use a longer lease or extend sooner",
            Self::TakenByOther => {
                "use a longer lease or extend sooner, and keep other writers off fencelock's keys"
            }
            Self::Deleted => {
                "find what deletes the key (a script, FLUSHDB, an eviction policy other than noeviction, a restart without persistence): only fencelock should write its keys"
            }
            Self::Broken => {
                "someone forced the lock free, judging it stuck: ask why before running the work again"
            }
            Self::MaxHold => "raise the maximum hold, or finish the work sooner",
        }
    }
}

/// One Redis node's part in a failed quorum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport {
    /// The node, as `host:port`.
    pub node: String,
    /// What it answered.
    pub outcome: NodeOutcome,
}

/// What one node answered to a quorum attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeOutcome {
    /// It granted the lock (released again, since the quorum failed).
    Granted,
    /// Another owner holds the lock there.
    #[non_exhaustive]
    Held {
        /// That owner's lease there.
        blocked_by: Blocker,
    },
    /// It could not be reached, or did not answer in time.
    Unavailable(UnavailableReason),
    /// It restarted recently, so it may have lost locks it held: its vote does not count
    /// until every lease it could have held has run out.
    #[non_exhaustive]
    Quarantined {
        /// How much longer.
        remaining: Duration,
    },
    /// It answered with an error, or a key there holds data fencelock did not write.
    Refused(String),
}

impl fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Granted => f.write_str("granted"),
            Self::Held { blocked_by } => match blocked_by {
                Blocker::Lease(d) if d.is_zero() => {
                    f.write_str("held by another owner, its lease ending now")
                }
                Blocker::Lease(d) => {
                    write!(
                        f,
                        "held by another owner, its lease ending in {} unless renewed",
                        HumanDuration(*d)
                    )
                }
                Blocker::NoExpiry => f.write_str("held by another owner, with no expiry"),
                Blocker::Queue => f.write_str("free, but other waiters are first in line"),
                // Redlock refuses semaphores and readers: a node says this only when a
                // single-node client used one of its names.
                Blocker::Permits { .. }
                | Blocker::Readers { .. }
                | Blocker::WritersWaiting { .. } => write!(f, "{blocked_by}"),
            },
            Self::Unavailable(reason) => write!(f, "unavailable ({reason})"),
            Self::Quarantined { remaining } => {
                write!(
                    f,
                    "restarted recently: restart protection keeps its vote out for {} more",
                    HumanDuration(*remaining)
                )
            }
            Self::Refused(message) => write!(f, "refused: {message}"),
        }
    }
}

/// Each node and what it answered, for messages: `host:port what, ...`.
pub(crate) struct NodeList<'a>(pub &'a [NodeReport]);

impl fmt::Display for NodeList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} {}", n.node, n.outcome)?;
        }
        Ok(())
    }
}

/// A duration written for people, as fencelock's messages write them: `502ms`, `29.7s`,
/// `4m10s`, `2h5m` (never Rust's debug form).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(fencelock::HumanDuration(Duration::from_millis(29_700)).to_string(), "29.7s");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        let s = self.0.as_secs();
        if ms < 1000 {
            write!(f, "{ms}ms")
        } else if s < 60 {
            let tenths = (ms + 50) / 100;
            if tenths.is_multiple_of(10) {
                write!(f, "{}s", tenths / 10)
            } else {
                write!(f, "{}.{}s", tenths / 10, tenths % 10)
            }
        } else if s < 3600 {
            match s % 60 {
                0 => write!(f, "{}m", s / 60),
                r => write!(f, "{}m{r}s", s / 60),
            }
        } else {
            match (s % 3600) / 60 {
                0 => write!(f, "{}h", s / 3600),
                m => write!(f, "{}h{m}m", s / 3600),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        let cases = [
            (0, "0ms"),
            (502, "502ms"),
            (999, "999ms"),
            (1000, "1s"),
            (29_700, "29.7s"),
            (29_990, "30s"),
            (60_000, "1m"),
            (250_000, "4m10s"),
            (3_600_000, "1h"),
            (7_500_000, "2h5m"),
        ];
        for (ms, text) in cases {
            assert_eq!(HumanDuration(Duration::from_millis(ms)).to_string(), text);
        }
    }

    #[test]
    fn a_lease_ending_now_is_not_reported_as_a_queue() {
        let plain = Error::Held {
            name: "stock".into(),
            blocked_by: Blocker::Lease(Duration::ZERO),
            waited: Duration::ZERO,
            nodes: Vec::new(),
        };
        let message = plain.to_string();
        assert!(message.contains("ending now"), "{message}");
        assert!(!message.contains("waiters"), "{message}");
        let fair = Error::Held {
            name: "stock".into(),
            blocked_by: Blocker::Queue,
            waited: Duration::ZERO,
            nodes: Vec::new(),
        };
        assert!(fair.to_string().contains("first in line"));
    }
}
