//! Taking a lock ([`LockBuilder`]) and holding it ([`LockGuard`]).

use std::time::{Duration, Instant};

use crate::algorithms::retry::Retry;
use crate::algorithms::single_node::{self, Attempt};
use crate::client::Client;
use crate::error::Error;
use crate::keys::LockKeys;
use crate::token::{FencingToken, OwnerToken};

/// The shortest TTL accepted: 1 ms.
pub const MIN_TTL: Duration = Duration::from_millis(1);
/// The longest TTL accepted: 24 hours. A lease longer than that is a deadlock in waiting
/// if its holder dies; hold long work under a shorter lease that you extend.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// The TTL used when none is given: 30 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How to take one named lock: its TTL, how long to wait, and how to pace retries.
///
/// Made by [`Client::lock`]. Defaults: TTL 30 s ([`DEFAULT_TTL`]), no waiting (one
/// attempt), [`Retry::default`]. The builder can be kept and used again; each acquire
/// draws a fresh owner token.
#[derive(Clone, Debug)]
pub struct LockBuilder {
    client: Client,
    name: String,
    ttl: Duration,
    /// `None`: wait for ever.
    wait: Option<Duration>,
    retry: Retry,
}

impl LockBuilder {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Self {
            client,
            name,
            ttl: DEFAULT_TTL,
            wait: Some(Duration::ZERO),
            retry: Retry::default(),
        }
    }

    /// How long the lease lasts unless extended or released (default 30 s). Checked on
    /// acquire: between [`MIN_TTL`] and [`MAX_TTL`]; whole milliseconds count, the rest
    /// is dropped.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`acquire`](Self::acquire) waits for a held lock before giving up with
    /// [`Error::WaitTimedOut`] (default zero: one attempt, then [`Error::Held`]).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Makes [`acquire`](Self::acquire) wait until the lock is free, however long that
    /// takes. Cancel the future (drop it, or race it in `tokio::select!`) to stop.
    pub fn wait_forever(mut self) -> Self {
        self.wait = None;
        self
    }

    /// How to pace attempts while waiting (default [`Retry::default`]).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes one attempt: the lock is taken or not, in one round trip.
    ///
    /// # Errors
    /// [`Error::Held`] (with the holder's remaining lease) when another owner holds it;
    /// [`Error::InvalidArgument`], [`Error::WrongType`], [`Error::Unavailable`],
    /// [`Error::Rejected`] as their docs say.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped after the attempt was sent, a release of
    /// this attempt's token is sent in the background, so nothing is left behind (at
    /// worst a key that expires after the TTL, if Redis is unreachable).
    ///
    /// The returned future owns a copy of the settings, so it is `'static` and can be
    /// spawned.
    pub fn try_acquire(&self) -> impl Future<Output = Result<LockGuard, Error>> + Send + 'static {
        let this = self.clone();
        async move { this.run(Some(Duration::ZERO)).await }
    }

    /// Takes the lock, waiting for it as configured with [`wait`](Self::wait) or
    /// [`wait_forever`](Self::wait_forever).
    ///
    /// Every attempt of one call uses the same owner token, so an attempt whose reply
    /// was lost (a timeout) and a later attempt that finds the token in Redis resolve to
    /// one grant with one fencing token. While waiting, an unreachable node is retried
    /// until the deadline; its error is returned if the deadline passes.
    ///
    /// # Errors
    /// [`Error::Held`] with a zero wait, [`Error::WaitTimedOut`] when the wait runs out,
    /// and the errors of [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`try_acquire`](Self::try_acquire): a dropped wait leaves no key
    /// behind that it may have written.
    ///
    /// The returned future owns a copy of the settings, so it is `'static` and can be
    /// spawned.
    pub fn acquire(&self) -> impl Future<Output = Result<LockGuard, Error>> + Send + 'static {
        let this = self.clone();
        async move { this.run(this.wait).await }
    }

    async fn run(&self, wait: Option<Duration>) -> Result<LockGuard, Error> {
        if self.ttl < MIN_TTL || self.ttl > MAX_TTL {
            return Err(Error::invalid(
                "TTL",
                format!("{:?} is out of range; give between 1ms and 24h", self.ttl),
            ));
        }
        let ttl = Duration::from_millis(self.ttl.as_millis() as u64);
        self.retry.validate()?;
        let keys = LockKeys::new(&self.client.inner.prefix, &self.name)?;
        let started = Instant::now();
        let deadline = wait.map(|w| started + w);
        let mut pending = PendingAcquire {
            client: self.client.clone(),
            keys,
            token: OwnerToken::generate(),
            maybe_written: false,
        };
        let node = &self.client.inner.node;
        let mut attempt: u32 = 0;
        loop {
            pending.maybe_written = true;
            let outcome = single_node::try_acquire(node, &pending.keys, &pending.token, ttl).await;
            let pause = match outcome {
                Ok(Attempt::Acquired { fence, valid_until }) => {
                    return Ok(pending.into_guard(self.name.clone(), fence, valid_until));
                }
                Ok(Attempt::Held { remaining }) => {
                    // The reply is definite, and a same-connection earlier attempt would
                    // have shown up as our token; an earlier one on a dropped connection
                    // may still land, so an earlier "maybe" stays a maybe.
                    if attempt == 0 {
                        pending.maybe_written = false;
                    }
                    let now = Instant::now();
                    match deadline {
                        Some(d) if now >= d => {
                            return Err(if wait == Some(Duration::ZERO) {
                                Error::Held {
                                    name: self.name.clone(),
                                    remaining,
                                }
                            } else {
                                Error::WaitTimedOut {
                                    name: self.name.clone(),
                                    waited: now - started,
                                    remaining,
                                }
                            });
                        }
                        _ => {}
                    }
                    // No point sleeping past the holder's lease: the key is gone then.
                    let until_free =
                        remaining.map_or(Duration::MAX, |r| r + Duration::from_millis(1));
                    self.retry.delay(attempt).min(until_free)
                }
                Err(e @ Error::Unavailable { .. }) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "acquire attempt failed; retrying");
                    self.retry.delay(attempt)
                }
                Err(e) => {
                    pending.maybe_written = false;
                    return Err(e);
                }
            };
            let pause = match deadline {
                Some(d) => pause.min(d.saturating_duration_since(Instant::now())),
                None => pause,
            };
            tokio::time::sleep(pause).await;
            attempt = attempt.saturating_add(1);
        }
    }
}

/// An acquire in progress. If it ends without a guard after an attempt whose outcome is
/// unknown (timeout, cancellation), its token may sit in Redis: release it.
struct PendingAcquire {
    client: Client,
    keys: LockKeys,
    token: OwnerToken,
    maybe_written: bool,
}

impl PendingAcquire {
    fn into_guard(mut self, name: String, fence: FencingToken, valid_until: Instant) -> LockGuard {
        self.maybe_written = false;
        LockGuard {
            client: self.client.clone(),
            name,
            keys: self.keys.clone(),
            token: self.token.clone(),
            fence,
            valid_until,
            held: true,
        }
    }
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if self.maybe_written {
            release_in_background(&self.client, String::new(), &self.keys, &self.token);
        }
    }
}

/// Sends a release without waiting for it. Never blocks or panics; without a Tokio
/// runtime it does nothing and the key expires after its TTL.
fn release_in_background(client: &Client, name: String, keys: &LockKeys, token: &OwnerToken) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(key = %keys.lock, "no Tokio runtime to release the lock in; it expires after its TTL");
        return;
    };
    let node = client.inner.node.clone();
    let keys = keys.clone();
    let token = token.clone();
    client.inner.background.spawn_on(async move {
        match single_node::release(&node, &name, &keys, &token).await {
            Ok(()) | Err(Error::LeaseLost { .. }) => {}
            Err(e) => tracing::warn!(key = %keys.lock, error = %e, "background release failed; the key expires after its TTL"),
        }
    }, &runtime);
}

/// A held lock. Release it with [`release`](Self::release); a guard dropped unreleased
/// releases in the background.
///
/// What holding means: until [`valid_until`](Self::valid_until), no other client of any
/// library that follows the protocol holds this lock on this Redis node, as long as that
/// node keeps its data (no failover to a replica that missed the key, no restart without
/// persistence) and the clocks' rates agree within the allowed drift. It does not mean
/// your code finishes before then: a pause (GC, swap, a stopped process) can outlast the
/// lease. Protect writes that must never interleave with the [fencing
/// token](Self::fencing_token).
#[derive(Debug)]
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    client: Client,
    name: String,
    keys: LockKeys,
    token: OwnerToken,
    fence: FencingToken,
    valid_until: Instant,
    /// Whether a release is still owed (false after release, or once the lease is known
    /// to be lost).
    held: bool,
}

impl LockGuard {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of this grant: higher than every token handed out for this lock
    /// name before. Send it with every write to the protected resource.
    pub fn fencing_token(&self) -> FencingToken {
        self.fence
    }

    /// The random token stored in the lock key while this guard holds it.
    pub fn owner_token(&self) -> &OwnerToken {
        &self.token
    }

    /// When the lease ends, at the latest, by this process's monotonic clock: measured
    /// from just before the acquire (or the last extend) was sent, minus an allowance for
    /// clock drift of 1% of the TTL plus 2 ms. Never taken from the wall clock.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// How much of the lease is left by the local monotonic clock (zero once past
    /// [`valid_until`](Self::valid_until)).
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Resets the lease to `ttl` from now, if this guard still holds the lock. Never
    /// re-creates an expired lock.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the key expired or belongs to another owner now (the
    /// guard then owes no release); [`Error::InvalidArgument`] for a TTL out of range;
    /// [`Error::Unavailable`], [`Error::Rejected`], [`Error::WrongType`].
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the extend may or may not have happened on the server,
    /// and [`valid_until`](Self::valid_until) keeps its earlier, smaller value.
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        if ttl < MIN_TTL || ttl > MAX_TTL {
            return Err(Error::invalid(
                "TTL",
                format!("{ttl:?} is out of range; give between 1ms and 24h"),
            ));
        }
        let ttl = Duration::from_millis(ttl.as_millis() as u64);
        let node = &self.client.inner.node;
        match single_node::extend(node, &self.name, &self.keys, &self.token, ttl).await {
            Ok(until) => {
                self.valid_until = until;
                Ok(())
            }
            Err(e @ Error::LeaseLost { .. }) => {
                self.held = false;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases the lock: deletes the key if it still holds this guard's token.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease had already ended (the key expired, or another
    /// owner holds it now): the lock is not yours and nothing was deleted, but work done
    /// under it may have overlapped. [`Error::Unavailable`] when Redis could not be
    /// reached: the key expires after its TTL. [`Error::Rejected`], [`Error::WrongType`].
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped before the reply, the guard's drop sends the release again
    /// in the background (releasing twice is harmless: the second finds the key gone).
    pub async fn release(mut self) -> Result<(), Error> {
        let node = &self.client.inner.node;
        let result = single_node::release(node, &self.name, &self.keys, &self.token).await;
        if !matches!(result, Err(Error::Unavailable { .. })) {
            self.held = false;
        }
        result
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.held {
            release_in_background(&self.client, self.name.clone(), &self.keys, &self.token);
        }
    }
}
