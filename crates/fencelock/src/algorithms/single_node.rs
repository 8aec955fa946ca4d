//! The single-node protocol: `SET NX PX` plus a fencing counter in one script to acquire,
//! owner-checked scripts to extend and release.

use std::time::{Duration, Instant};

use crate::backend::Node;
use crate::error::{Blocker, Error, LossCause, UnavailableReason};
use crate::keys::LockKeys;
use crate::scripts::{self, AcquireReply, OwnedReply};
use crate::token::{FencingToken, HolderToken};

/// Plain locks let any caller take a free lock; fair locks serve waiters in arrival
/// order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Plain,
    /// `waiter_timeout`: how long a queued waiter may stay silent before it is purged.
    Fair {
        waiter_timeout: Duration,
    },
    /// Holds are counted per owner id; the key is a hash (see `reentrant_acquire.lua`).
    Reentrant {
        owner: String,
    },
}

impl Mode {
    /// What the key holds while this mode holds the lock: renewals compare against it.
    pub fn holder_id<'a>(&'a self, token: &'a HolderToken) -> &'a str {
        match self {
            Mode::Reentrant { owner } => owner,
            _ => token.as_str(),
        }
    }
}

/// The outcome of one acquire attempt that Redis answered.
#[derive(Debug)]
pub(crate) enum Attempt {
    Acquired {
        fence: FencingToken,
        /// When the request that got the grant was sent.
        sent_at: Instant,
        valid_until: Instant,
    },
    Held {
        blocked_by: Blocker,
    },
}

/// How much of a lease the client gives up to clock-rate drift between itself and
/// Redis: 1% of the TTL plus 2 ms, as in Redlock.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The end of a lease that Redis started no earlier than `sent_at`.
pub(crate) fn lease_end(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl.saturating_sub(drift(ttl))
}

/// One acquire attempt: one round trip. In fair mode, `join` puts the caller in line
/// (or keeps it there) when it is not its turn.
pub(crate) async fn try_acquire(
    node: &Node,
    keys: &LockKeys,
    token: &HolderToken,
    ttl: Duration,
    mode: &Mode,
    join: bool,
) -> Result<Attempt, Error> {
    let invocation = match mode {
        Mode::Plain => scripts::acquire(keys, token, ttl),
        Mode::Fair { waiter_timeout } => {
            scripts::fair_acquire(keys, token, ttl, *waiter_timeout, join)
        }
        Mode::Reentrant { owner } => scripts::reentrant_acquire(keys, owner, token, ttl),
    };
    let sent_at = Instant::now();
    match node.run(&invocation).await? {
        AcquireReply::Acquired { fence, fresh } => {
            if !fresh {
                tracing::debug!(key = %keys.lock, "acquire retry found our own token");
            }
            let valid_until = lease_end(sent_at, ttl);
            let now = Instant::now();
            if valid_until <= now {
                // The grant came back after its lease ran out (a slow network, a paused
                // client): the lock may belong to someone else already, so holding it
                // is not on offer. Take it back (owner-checked: a successor's key stays)
                // and report the attempt as timed out; the caller treats its outcome as
                // unknown and withdraws again if this release did not get through.
                let _ = abandon(node, keys, token, mode).await;
                return Err(Error::Unavailable {
                    node: node.addr().to_owned(),
                    reason: UnavailableReason::TimedOut,
                    detail: format!(
                        "the grant arrived {} ms after the acquire was sent, after its {} ms lease (less the drift allowance) had run out",
                        (now - sent_at).as_millis(),
                        ttl.as_millis()
                    ),
                    source: None,
                });
            }
            Ok(Attempt::Acquired {
                fence,
                sent_at,
                valid_until,
            })
        }
        AcquireReply::Held { blocked_by } => Ok(Attempt::Held { blocked_by }),
        AcquireReply::WrongType { key, found } => Err(Error::WrongType {
            node: node.addr().to_owned(),
            key,
            found,
        }),
    }
}

/// Extends the lease to `ttl` from now (a batch of one for `renew.lua`); returns when the
/// request was sent and the new end of the lease.
pub(crate) async fn extend(
    node: &Node,
    name: &str,
    keys: &LockKeys,
    holder: &str,
    ttl: Duration,
) -> Result<(Instant, Instant), Error> {
    let sent_at = Instant::now();
    let replies: Vec<i64> = node
        .run(&scripts::renew(std::iter::once((
            keys.lock.as_str(),
            holder,
            ttl,
        ))))
        .await?;
    let reply = replies
        .first()
        .copied()
        .and_then(OwnedReply::from_code)
        .ok_or_else(|| Error::Rejected {
            node: node.addr().to_owned(),
            code: "ERR".to_owned(),
            message: format!("renew.lua replied {replies:?}"),
        })?;
    owned(node, name, keys, reply).map(|()| (sent_at, lease_end(sent_at, ttl)))
}

/// Releases the lock if it still holds `token`, and wakes the waiters (fair mode: the
/// first in line).
pub(crate) async fn release(
    node: &Node,
    name: &str,
    keys: &LockKeys,
    token: &HolderToken,
    mode: &Mode,
) -> Result<(), Error> {
    let invocation = match mode {
        Mode::Plain => scripts::release(keys, token),
        Mode::Fair { .. } => scripts::fair_release(keys, token),
        Mode::Reentrant { owner } => scripts::reentrant_release(keys, owner, token),
    };
    let reply = node.run(&invocation).await?;
    owned(node, name, keys, reply)
}

/// Withdraws everything an abandoned acquire may have left: a grant whose reply was
/// lost and, in fair mode, its place in the queue.
pub(crate) async fn abandon(
    node: &Node,
    keys: &LockKeys,
    token: &HolderToken,
    mode: &Mode,
) -> Result<(), Error> {
    match mode {
        Mode::Plain | Mode::Reentrant { .. } => match release(node, "", keys, token, mode).await {
            Ok(()) | Err(Error::LeaseLost { .. }) => Ok(()),
            Err(e) => Err(e),
        },
        Mode::Fair { .. } => {
            let _removed: i64 = node.run(&scripts::fair_leave(keys, token)).await?;
            Ok(())
        }
    }
}

fn owned(node: &Node, name: &str, keys: &LockKeys, reply: OwnedReply) -> Result<(), Error> {
    let lost = |cause| Error::LeaseLost {
        name: name.to_owned(),
        cause,
    };
    match reply {
        OwnedReply::Done => Ok(()),
        OwnedReply::Absent => Err(lost(LossCause::Expired)),
        OwnedReply::Other => Err(lost(LossCause::TakenByOther)),
        OwnedReply::WrongType => Err(Error::WrongType {
            node: node.addr().to_owned(),
            key: keys.lock.clone(),
            found: "non-string value".to_owned(),
        }),
    }
}
