//! The one error type of fencelock, with a variant for each thing a caller handles
//! differently.

use std::fmt;
use std::time::Duration;

/// Everything that can go wrong when taking, extending or releasing a lock, or using a
/// [`DelayQueue`](crate::DelayQueue).
///
/// Each variant is a different situation with a different remedy; the message of each
/// says what to do. Match on the variant, not on the message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another owner holds the lock, and the caller asked not to wait (`try_acquire`, or
    /// a zero wait).
    #[error(
        "lock {name:?} is not free: {blocked_by}; try again later, wait for it, or defer the work"
    )]
    Held {
        /// The lock name.
        name: String,
        /// What stands in the way: another owner's lease (and how long it still runs),
        /// or, in fair mode, other waiters first in line.
        blocked_by: Blocker,
    },

    /// The lock stayed held by another owner for the whole wait.
    #[error(
        "gave up on lock {name:?} after waiting {}: {blocked_by}; wait longer or defer the work",
        Human(*.waited)
    )]
    WaitTimedOut {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
        /// What stood in the way at the last attempt.
        blocked_by: Blocker,
    },

    /// A Redis node could not be reached, or did not answer in time. For a timed-out
    /// acquire the outcome is unknown; fencelock then releases its token in the background
    /// so nothing is left behind for longer than the TTL. A single-node grant whose reply
    /// came back after the lease had already run out is reported this way too (reason
    /// [`TimedOut`](UnavailableReason::TimedOut)), after fencelock took it back: another
    /// client may have held the lock by then.
    #[error(
        "Redis node {node} is unavailable ({reason}): {detail}; check that it is running and reachable, and the URL"
    )]
    Unavailable {
        /// The node, as `host:port` (never with credentials).
        node: String,
        /// Why it is considered unavailable.
        reason: UnavailableReason,
        /// What the driver reported.
        detail: String,
    },

    /// A Redis node answered with an error: authentication (`NOAUTH`, `WRONGPASS`),
    /// permissions (`NOPERM`), a read-only replica (`READONLY`), out of memory (`OOM`),
    /// and the like. Retrying will not help until the server or the configuration changes.
    #[error(
        "Redis node {node} refused the command ({message}): check the credentials, the ACL permissions, and that the node is a writable master"
    )]
    Rejected {
        /// The node, as `host:port`.
        node: String,
        /// The server's error code, such as `NOAUTH`.
        code: String,
        /// The server's whole error message.
        message: String,
    },

    /// A lock key, its fencing counter, or a queue key holds data fencelock did not write (a hash, a
    /// list, a non-numeric counter, ...). fencelock never overwrites it.
    #[error(
        "key {key:?} on {node} holds a Redis {found} that fencelock did not write; it was left untouched: use another lock name or key prefix, or remove the key"
    )]
    WrongType {
        /// The node, as `host:port`.
        node: String,
        /// The key in question.
        key: String,
        /// The Redis type found there (`"string"` for a counter that is not an integer).
        found: String,
    },

    /// An argument was out of range or malformed. Nothing was sent to Redis.
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// What is wrong with it, and what is accepted.
        reason: String,
    },

    /// Redlock: too few nodes granted the lock. Says, per node, what happened. A Redlock
    /// client reports every failed quorum this way, contention included (where a single
    /// node would say [`Error::Held`] or [`Error::WaitTimedOut`]);
    /// [`is_contention`](Error::is_contention) tells the two apart.
    #[error("lock {name:?} needs {needed} of {} Redis nodes and got {granted}: {}; {}", nodes.len(), NodeList(nodes), if outage(nodes, *needed) { "check that a majority of the nodes is up and reachable" } else { "another owner holds it on some nodes: try again later or wait for it" })]
    NoQuorum {
        /// The lock name.
        name: String,
        /// The majority needed.
        needed: usize,
        /// How many nodes granted it (and were released again).
        granted: usize,
        /// What each node answered, in the order the nodes were given.
        nodes: Vec<NodeReport>,
    },

    /// The caller's lease ended before the caller released or extended it: the work done
    /// under it may have overlapped with another holder's.
    #[error(
        "the lease on lock {name:?} was lost ({cause}); work done under it may have overlapped another holder's: check the fencing token at the resource, and use a longer TTL or extend sooner"
    )]
    LeaseLost {
        /// The lock name.
        name: String,
        /// What Redis showed instead of the caller's token.
        cause: LossCause,
    },
}

impl Error {
    /// Whether this is contention (another owner holds the lock: retry later, wait, or
    /// defer) rather than an outage or a mistake. For [`Error::NoQuorum`]: true unless
    /// the nodes that failed for other reasons (unreachable, quarantined, refusing) are
    /// enough on their own to block a majority.
    pub fn is_contention(&self) -> bool {
        match self {
            Self::Held { .. } | Self::WaitTimedOut { .. } => true,
            Self::NoQuorum { nodes, needed, .. } => !outage(nodes, *needed),
            _ => false,
        }
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
    /// Another owner holds the lock; its lease runs about this much longer (zero: it is
    /// ending now).
    Lease(Duration),
    /// Another owner's key has no expiry (written by something other than a lock
    /// library): it will not free itself.
    NoExpiry,
    /// Fair mode: the lock is free, but other waiters are first in line.
    Queue,
}

impl Blocker {
    /// How long the holder's lease still runs, if it is a lease.
    pub fn remaining(self) -> Option<Duration> {
        match self {
            Self::Lease(d) => Some(d),
            _ => None,
        }
    }

    /// The one that frees up sooner (a shorter lease before a longer one, a lease
    /// before a key without expiry).
    pub(crate) fn sooner(self, other: Self) -> Self {
        match (self, other) {
            (Self::Lease(a), Self::Lease(b)) => Self::Lease(a.min(b)),
            (Self::Lease(_) | Self::Queue, _) => self,
            (Self::NoExpiry, _) => other,
        }
    }
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lease(d) if d.is_zero() => {
                f.write_str("another owner holds it; its lease is ending now")
            }
            Self::Lease(d) => write!(f, "another owner holds it for about {} more", Human(*d)),
            Self::NoExpiry => {
                f.write_str("another owner's key has no expiry, so it will not free itself")
            }
            Self::Queue => f.write_str("it is free, but other waiters are first in line"),
        }
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
}

impl fmt::Display for UnavailableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Refused => "connection refused",
            Self::TimedOut => "timed out",
            Self::Io => "connection error",
        })
    }
}

/// What happened to a lease that was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossCause {
    /// The key was gone: the lease expired (or someone deleted it).
    Expired,
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
            Self::Expired => "the key was gone: it expired or was deleted",
            Self::TakenByOther => "another owner holds the lock now",
            Self::Unconfirmed => "no renewal was confirmed before the lease ran out",
            Self::MaxHold => "the maximum hold was reached",
        })
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
    Held {
        /// That owner's lease there.
        blocked_by: Blocker,
    },
    /// It could not be reached, or did not answer in time.
    Unavailable(UnavailableReason),
    /// It restarted recently, so it may have lost locks it held: its vote does not count
    /// until every lease it could have held has run out.
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
                    write!(f, "held by another owner for about {} more", Human(*d))
                }
                Blocker::NoExpiry => f.write_str("held by another owner, with no expiry"),
                Blocker::Queue => f.write_str("free, but other waiters are first in line"),
            },
            Self::Unavailable(reason) => write!(f, "unavailable ({reason})"),
            Self::Quarantined { remaining } => {
                write!(
                    f,
                    "quarantined after a restart for {} more",
                    Human(*remaining)
                )
            }
            Self::Refused(message) => write!(f, "refused: {message}"),
        }
    }
}

/// Whether the nodes that failed for reasons other than another owner block a majority
/// by themselves.
fn outage(nodes: &[NodeReport], needed: usize) -> bool {
    let down = nodes
        .iter()
        .filter(|n| !matches!(n.outcome, NodeOutcome::Granted | NodeOutcome::Held { .. }))
        .count();
    down > nodes.len() - needed
}

struct NodeList<'a>(&'a [NodeReport]);

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

/// A duration for people: `502ms`, `29.7s`, `4m10s`, `2h5m`.
pub(crate) struct Human(pub Duration);

impl fmt::Display for Human {
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
            assert_eq!(Human(Duration::from_millis(ms)).to_string(), text);
        }
    }

    #[test]
    fn a_lease_ending_now_is_not_reported_as_a_queue() {
        let plain = Error::Held {
            name: "stock".into(),
            blocked_by: Blocker::Lease(Duration::ZERO),
        };
        let message = plain.to_string();
        assert!(message.contains("ending now"), "{message}");
        assert!(!message.contains("waiters"), "{message}");
        let fair = Error::Held {
            name: "stock".into(),
            blocked_by: Blocker::Queue,
        };
        assert!(fair.to_string().contains("first in line"));
    }
}
