//! The single-node protocol: `SET NX PX` plus a fencing counter in one script to acquire,
//! owner-checked scripts to extend and release.

use std::time::{Duration, Instant};

use crate::backend::Node;
use crate::error::{Error, LossCause};
use crate::keys::LockKeys;
use crate::scripts::{self, AcquireReply, OwnedReply};
use crate::token::{FencingToken, OwnerToken};

/// The outcome of one acquire attempt that Redis answered.
#[derive(Debug)]
pub(crate) enum Attempt {
    Acquired {
        fence: FencingToken,
        valid_until: Instant,
    },
    Held {
        remaining: Option<Duration>,
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

/// One acquire attempt: one round trip.
pub(crate) async fn try_acquire(
    node: &Node,
    keys: &LockKeys,
    token: &OwnerToken,
    ttl: Duration,
) -> Result<Attempt, Error> {
    let sent_at = Instant::now();
    match node.run(&scripts::acquire(keys, token, ttl)).await? {
        AcquireReply::Acquired { fence, fresh } => {
            if !fresh {
                tracing::debug!(key = %keys.lock, "acquire retry found our own token");
            }
            Ok(Attempt::Acquired {
                fence,
                valid_until: lease_end(sent_at, ttl),
            })
        }
        AcquireReply::Held { remaining } => Ok(Attempt::Held { remaining }),
        AcquireReply::WrongType { key, found } => Err(Error::WrongType {
            node: node.addr().to_owned(),
            key,
            found,
        }),
    }
}

/// Extends the lease to `ttl` from now; returns the new end of the lease.
pub(crate) async fn extend(
    node: &Node,
    name: &str,
    keys: &LockKeys,
    token: &OwnerToken,
    ttl: Duration,
) -> Result<Instant, Error> {
    let sent_at = Instant::now();
    let reply = node.run(&scripts::extend(keys, token, ttl)).await?;
    owned(node, name, keys, reply).map(|()| lease_end(sent_at, ttl))
}

/// Releases the lock if it still holds `token`.
pub(crate) async fn release(
    node: &Node,
    name: &str,
    keys: &LockKeys,
    token: &OwnerToken,
) -> Result<(), Error> {
    let reply = node.run(&scripts::release(keys, token)).await?;
    owned(node, name, keys, reply)
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
