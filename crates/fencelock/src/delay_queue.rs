//! A delay queue on Redis with at-least-once delivery: [`DelayQueue`], the items it hands
//! out ([`Delivery`]) and their ids ([`ItemId`]).
//!
//! The guarantees, the key layout and the receipt rules are documented on [`DelayQueue`],
//! since this module is private. Every operation is one Lua script (`scripts/queue/*.lua`, headers
//! there) that reads the time from Redis's own clock (`TIME`), never from a client's.

use std::fmt;
use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::engine::lease_end;
use crate::error::Error;
use crate::keys::QueueKeys;
use crate::limits::{MAX_DELAY, MAX_PAYLOAD, MAX_VISIBILITY, MIN_VISIBILITY};
use crate::scripts::{
    self,
    replies::{Counts, Pushed, Queue, QueueOutcome, Taken},
};
use crate::shared::Shared;

/// A named delay queue on the client's Redis node: push work to be done later, take it
/// when it is due, acknowledge it when done.
///
/// Made by [`Client::delay_queue`](crate::Client::delay_queue). Cheap to clone (clones share the client's
/// connection); holds no state of its own, so any number of producers and consumers, in
/// any number of processes, can use the same queue name.
///
/// A typical use is deferring work when a lock is busy: instead of failing or waiting,
/// put the work on a queue and try again after a delay.
///
/// ```
/// use std::time::Duration;
/// use fencelock::Error;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// # let redis = testkit::RedisServer::start();
/// # let url = redis.url();
/// let client = fencelock::Client::connect(&url).await?;
/// let retries = client.delay_queue("stock-updates")?;
/// # let _busy = client.lock("stock:42").try_acquire().await?; // so that the work is deferred
///
/// // Producer: the lock is busy, so try again in 5 s.
/// match client.lock("stock:42").try_acquire().await {
///     Ok(guard) => { /* update stock 42 */ guard.release().await?; }
///     Err(Error::Held { .. }) => {
///         retries.push(b"stock:42", Duration::from_secs(5)).await?;
///     }
///     Err(e) => return Err(e),
/// }
///
/// // Consumer: up to 30 s per item before it is handed to someone else.
/// while let Some(delivery) = retries.take(Duration::from_secs(30)).await? {
///     let key = String::from_utf8_lossy(delivery.payload()).into_owned();
///     match client.lock(key).try_acquire().await {
///         Ok(guard) => {
///             /* do the work */
///             guard.release().await?;
///             delivery.ack().await?;
///         }
///         Err(Error::Held { .. }) => {
///             delivery.retry_after(Duration::from_secs(5)).await?;
///         }
///         Err(e) => return Err(e),
///     }
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Delivery guarantees
///
/// | | |
/// |---|---|
/// | **At least once** | An item leaves the queue only when a delivery of it is [acknowledged](Delivery::ack). A consumer that dies, hangs or drops its [`Delivery`] loses nothing: once the delivery's visibility timeout has passed, the next [`take`](DelayQueue::take) puts the item back and it is delivered again, with [`attempt`](Delivery::attempt) one higher. |
/// | **Not exactly once** | An item can be handled more than once: when a consumer outlives its visibility timeout (a pause, slow work), when an ack's reply is lost, or when a push whose reply was lost is repeated. Make the work idempotent, or check [`attempt`](Delivery::attempt). |
/// | **Ordering** | Among the items that are due, [`take`](DelayQueue::take) returns the one with the earliest due time; items due in the same millisecond come out by [`ItemId`], which is push order. An item put back after its visibility timeout counts as due from the moment that timeout ran out. Nothing is ordered across items that are not yet due. |
/// | **Redelivery bound** | An item whose consumer died is delivered again at most its visibility timeout plus the time until the next `take` after it (each `take` puts back up to 100 expired items, oldest first). |
/// | **One delivery at a time** | While an item is in flight, no `take` returns it. |
/// | **Clock** | Due times and visibility deadlines are milliseconds of the Redis server's clock (`TIME`); clients' clocks play no part. A server clock that jumps makes items due early or late. |
/// | **Durability** | That of the Redis node: a restart without persistence, or a failover to a replica that missed writes, can lose items or deliver them again. |
///
/// # Receipts
///
/// Every [`take`](DelayQueue::take) gives the delivery a fresh random receipt (128 bits),
/// stored with the item while it is in flight. [`Delivery::ack`],
/// [`retry_after`](Delivery::retry_after) and [`extend`](Delivery::extend) act only while
/// the item is in flight under that receipt, and return `false` otherwise. So a late ack
/// of delivery 1, after the item was put back and handed out as delivery 2, changes
/// nothing: the item stays, in flight for delivery 2. A delivery whose visibility timeout
/// has passed but that no `take` has put back yet still holds its receipt, so its ack
/// still succeeds: nobody else has the item.
///
/// # Key layout
///
/// For a queue named `orders` under the default prefix `fencelock` (the prefix and name
/// rules are those of locks, see [`keys`](crate::keys)):
///
/// | key | type | holds |
/// |---|---|---|
/// | `fencelock:{orders}:dq:due` | sorted set | waiting items: id → due time (server ms since the epoch) |
/// | `fencelock:{orders}:dq:inflight` | sorted set | delivered, unacknowledged items: id → visibility deadline (server ms) |
/// | `fencelock:{orders}:dq:items` | hash | id → payload |
/// | `fencelock:{orders}:dq:attempts` | hash | id → how many times the item was delivered |
/// | `fencelock:{orders}:dq:receipts` | hash | id → receipt of the current delivery (in-flight items only) |
/// | `fencelock:{orders}:dq:seq` | string | the last id handed out |
///
/// Ids are stored as 20 zero-padded decimal digits (`00000000000000000042`), so that
/// items due in the same millisecond sort by id. The keys share the name's hash tag (one
/// Redis Cluster slot), and the `dq:` part keeps them apart from the keys of a lock with
/// the same name. None of them expires: an abandoned queue stays until its keys are
/// deleted. An acknowledged item leaves nothing behind; `dq:seq` stays for good.
///
/// A key of another type (written by something else) makes every operation that touches
/// it fail with [`Error::WrongType`], leaving it untouched.
#[derive(Clone, Debug)]
pub struct DelayQueue {
    shared: Arc<Shared>,
    name: String,
    keys: QueueKeys,
}

impl DelayQueue {
    /// Validates the name; nothing is sent to Redis.
    pub(crate) fn new(shared: Arc<Shared>, name: String) -> Result<Self, Error> {
        let keys = QueueKeys::new(&shared.prefix, &name)?;
        Ok(Self { shared, name, keys })
    }

    /// The queue name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds an item, due `delay` from now by the Redis server's clock (zero: due at once).
    /// Whole milliseconds of `delay` count; the rest is dropped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a payload over [`MAX_PAYLOAD`](crate::limits::MAX_PAYLOAD)
    /// bytes or a delay over [`MAX_DELAY`](crate::limits::MAX_DELAY) (nothing is sent);
    /// [`Error::WrongType`] when a queue key holds data fencelock did not write;
    /// [`Error::Unavailable`] (the item may or may not have been added),
    /// [`Error::Rejected`].
    ///
    /// # Cancel safety
    /// Not idempotent: if the future is dropped after the request was sent, the item may
    /// or may not have been added, and pushing again may add it twice (consumers must
    /// cope with duplicates anyway, see [at least once](DelayQueue#delivery-guarantees)).
    /// Nothing is left half-written.
    pub async fn push(&self, payload: impl AsRef<[u8]>, delay: Duration) -> Result<ItemId, Error> {
        let payload = payload.as_ref();
        if payload.len() > MAX_PAYLOAD {
            return Err(Error::invalid(
                "payload",
                format!(
                    "it is {} bytes long; the limit is {} (16 MiB): store large data elsewhere and queue a reference",
                    payload.len(),
                    MAX_PAYLOAD
                ),
            ));
        }
        Error::check_range("delay", delay, Duration::ZERO, MAX_DELAY)?;
        let Pushed(id) = self
            .run(&scripts::queue_push(&self.keys, payload, delay))
            .await?;
        Ok(ItemId(id))
    }

    /// Takes the first due item, if any, and keeps it invisible to other takes for
    /// `visibility` (by the server's clock): finish it and [`ack`](Delivery::ack) it in
    /// that time, or [`extend`](Delivery::extend) it. Whole milliseconds count.
    ///
    /// Before that, it puts back (up to 100 of) the in-flight items whose visibility timeout
    /// has passed, so that items of dead consumers are delivered again. Returns `None` at
    /// once when nothing is due; it never waits for an item.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a visibility outside
    /// [`MIN_VISIBILITY`](crate::limits::MIN_VISIBILITY)..=[`MAX_VISIBILITY`](crate::limits::MAX_VISIBILITY);
    /// [`Error::WrongType`], [`Error::Unavailable`], [`Error::Rejected`].
    ///
    /// # Cancel safety
    /// Cancel safe, and nothing is lost: if the future is dropped after the request was
    /// sent, an item may have been taken with a receipt nobody holds; it is delivered
    /// again after `visibility`, with its attempt count one higher.
    pub async fn take(&self, visibility: Duration) -> Result<Option<Delivery>, Error> {
        let visibility = check_visibility(visibility)?;
        let receipt = crate::token::random_hex32();
        let sent_at = Instant::now();
        let taken: Option<Taken> = self
            .run(&scripts::queue_take(&self.keys, visibility, &receipt))
            .await?;
        Ok(taken.map(|t| Delivery {
            queue: self.clone(),
            id: ItemId(t.id),
            payload: t.payload,
            attempt: t.attempt,
            receipt,
            visible_until: lease_end(sent_at, visibility),
        }))
    }

    /// Counts the items by state, by the server's clock, in one consistent snapshot.
    ///
    /// # Errors
    /// [`Error::WrongType`], [`Error::Unavailable`], [`Error::Rejected`].
    ///
    /// # Cancel safety
    /// Cancel safe: it writes nothing.
    pub async fn counts(&self) -> Result<QueueCounts, Error> {
        let c: Counts = self.run(&scripts::queue_counts(&self.keys)).await?;
        Ok(QueueCounts {
            ready: c.ready,
            delayed: c.delayed,
            in_flight: c.in_flight,
        })
    }

    /// Runs one queue script on the client's node.
    async fn run<T: QueueOutcome>(&self, invocation: &scripts::Call) -> Result<T, Error> {
        let node = self.shared.backend.only_node().ok_or_else(|| {
            Error::invalid("delay queue", "a delay queue lives on one Redis node")
        })?;
        let Queue(outcome) = node.run(invocation, None).await?;
        Ok(outcome)
    }
}

/// Checks a visibility timeout and drops its sub-millisecond part.
fn check_visibility(visibility: Duration) -> Result<Duration, Error> {
    Error::check_range(
        "visibility timeout",
        visibility,
        MIN_VISIBILITY,
        MAX_VISIBILITY,
    )?;
    Ok(Duration::from_millis(visibility.as_millis() as u64))
}

/// How many items of a [`DelayQueue`] are in each state, from
/// [`DelayQueue::counts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QueueCounts {
    /// Due now: the next [`take`](DelayQueue::take) returns one of them.
    pub ready: u64,
    /// Waiting for their due time.
    pub delayed: u64,
    /// Delivered and not acknowledged yet, including those whose visibility timeout has
    /// passed until a `take` puts them back.
    pub in_flight: u64,
}

impl QueueCounts {
    /// Every item in the queue: ready, delayed and in flight.
    pub fn total(&self) -> u64 {
        self.ready + self.delayed + self.in_flight
    }
}

/// The id of an item of a [`DelayQueue`]: unique within its queue, increasing in push
/// order.
///
/// Ids come from a counter key that never expires; if that key is lost (a `FLUSHALL`, a
/// restart without persistence) numbering starts again at 1, skipping ids still in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ItemId(u64);

impl ItemId {
    /// The id as a number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ItemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One delivery of a queue item, from [`DelayQueue::take`]: the item is in flight,
/// invisible to other takes until its visibility timeout runs out.
///
/// End it with [`ack`](Self::ack) when the work is done, or
/// [`retry_after`](Self::retry_after) to put the item back. A delivery dropped without
/// either does nothing at once (no background work): the item is delivered again after
/// the visibility timeout, as if the consumer had died. Each delivery has its own receipt
/// (see [receipts](DelayQueue#receipts)), so a stale delivery can never remove or extend
/// a newer one.
#[must_use = "an unacknowledged item is delivered again after its visibility timeout"]
pub struct Delivery {
    queue: DelayQueue,
    id: ItemId,
    payload: Vec<u8>,
    attempt: u32,
    receipt: String,
    visible_until: Instant,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("queue", &self.queue.name)
            .field("id", &self.id)
            .field("payload_len", &self.payload.len())
            .field("attempt", &self.attempt)
            .field("visible_until", &self.visible_until)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// The item's id.
    pub fn id(&self) -> ItemId {
        self.id
    }

    /// The item's payload, exactly as pushed.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Which delivery of the item this is: 1 the first time, then one more for every
    /// take that returned it (after a visibility timeout or a
    /// [`retry_after`](Self::retry_after)).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The queue the item came from.
    pub fn queue(&self) -> &DelayQueue {
        &self.queue
    }

    /// Until when, at the latest, the item stays invisible to other takes, by this
    /// process's monotonic clock: measured from just before the take (or the last extend)
    /// was sent, minus an allowance for clock drift of 1% of the visibility timeout plus
    /// 2 ms. Past it, another consumer may get the item.
    pub fn visible_until(&self) -> Instant {
        self.visible_until
    }

    /// Removes the item from the queue for good: the work is done.
    ///
    /// Returns `false`, and changes nothing, when the item is no longer in flight under
    /// this delivery: its visibility timeout passed and a take put it back (it may be in
    /// flight with another consumer now), or it was removed by hand. The work may then be
    /// done twice. Past the visibility timeout but before any take put it back, the ack
    /// still succeeds.
    ///
    /// # Errors
    /// [`Error::WrongType`], [`Error::Rejected`], and [`Error::Unavailable`]: the ack may
    /// or may not have happened; if not, the item is delivered again after its visibility
    /// timeout.
    ///
    /// # Cancel safety
    /// Cancel safe, in that nothing is lost: if the future is dropped the item was either
    /// removed or is delivered again after its visibility timeout.
    pub async fn ack(self) -> Result<bool, Error> {
        let q = &self.queue;
        q.run(&scripts::queue_ack(&q.keys, self.id.0, &self.receipt))
            .await
    }

    /// Puts the item back, due `delay` from now by the server's clock (zero: due at
    /// once), so that it is delivered again then, with its attempt count one higher.
    /// Whole milliseconds of `delay` count.
    ///
    /// Returns `false`, and changes nothing, when the item is no longer in flight under
    /// this delivery (as for [`ack`](Self::ack)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a delay over [`MAX_DELAY`](crate::limits::MAX_DELAY) (nothing is
    /// sent; the item is delivered again after its visibility timeout);
    /// [`Error::WrongType`], [`Error::Rejected`], and [`Error::Unavailable`]: the item
    /// is then either due after `delay` or delivered again after its visibility timeout.
    ///
    /// # Cancel safety
    /// Cancel safe, in that nothing is lost: if the future is dropped the item is due
    /// either after `delay` or after its visibility timeout.
    pub async fn retry_after(self, delay: Duration) -> Result<bool, Error> {
        if delay > MAX_DELAY {
            return Err(Error::invalid(
                "delay",
                format!("{delay:?} is too long; give at most 30 days"),
            ));
        }
        let q = &self.queue;
        q.run(&scripts::queue_retry(
            &q.keys,
            self.id.0,
            &self.receipt,
            delay,
        ))
        .await
    }

    /// Keeps the item in flight for `visibility` from now (by the server's clock), for
    /// work that takes longer than planned. Whole milliseconds count. On success,
    /// [`visible_until`](Self::visible_until) moves accordingly.
    ///
    /// Returns `false`, and changes nothing, when the item is no longer in flight under
    /// this delivery (as for [`ack`](Self::ack)): another consumer may have it, so stop
    /// working on it if you can.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a visibility outside
    /// [`MIN_VISIBILITY`](crate::limits::MIN_VISIBILITY)..=[`MAX_VISIBILITY`](crate::limits::MAX_VISIBILITY);
    /// [`Error::WrongType`], [`Error::Unavailable`], [`Error::Rejected`].
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the extend may or may not have happened on the server, and
    /// [`visible_until`](Self::visible_until) keeps its earlier value.
    pub async fn extend(&mut self, visibility: Duration) -> Result<bool, Error> {
        let visibility = check_visibility(visibility)?;
        let q = &self.queue;
        let sent_at = Instant::now();
        let extended = q
            .run(&scripts::queue_extend(
                &q.keys,
                self.id.0,
                &self.receipt,
                visibility,
            ))
            .await?;
        if extended {
            self.visible_until = lease_end(sent_at, visibility);
        }
        Ok(extended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_is_checked_and_truncated_to_milliseconds() {
        assert!(check_visibility(Duration::ZERO).is_err());
        assert!(check_visibility(Duration::from_micros(999)).is_err());
        assert!(check_visibility(MAX_VISIBILITY + Duration::from_millis(1)).is_err());
        assert_eq!(
            check_visibility(Duration::from_micros(1500)).unwrap(),
            Duration::from_millis(1)
        );
    }
}
