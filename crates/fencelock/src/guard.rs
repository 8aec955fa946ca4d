//! Holding a lock, a permit or a read side: [`LockGuard`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Withdrawn;
use crate::engine::Grant;
use crate::engine::Protocol;
use crate::engine::watchdog::Registration;
use crate::error::{Error, LossCause};
use crate::keys::LockKeys;
use crate::limits::checked_ttl;
use crate::observe::{self, ModeLabel, ReleaseKind, ReleaseOutcome};
use crate::shared::Shared;
use crate::token::{FencingToken, HolderToken};

/// What a guard holds, apart from its client and name: for a guard made from a grant or
/// from a [`DetachedLock`](crate::DetachedLock) taken over.
pub(crate) struct Holding {
    pub keys: LockKeys,
    pub token: HolderToken,
    pub protocol: Arc<dyn Protocol>,
    /// The TTL the grant asked for (a Redlock release gives each node a share of it).
    pub asked_ttl: Duration,
    /// The lease each renewal asks for.
    pub ttl: Duration,
    pub renew: bool,
    /// The maximum hold's end.
    pub hold_until: Option<Instant>,
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
///
/// ```
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fencelock::Error> {
/// # let redis = testkit::RedisServer::start();
/// # let client = fencelock::Client::connect(&redis.url()).await?;
/// # async fn write_with_token(_token: fencelock::FencingToken) {}
/// let guard = client.lock("stock:42").try_acquire().await?;
/// tokio::select! {
///     cause = guard.lost() => return Err(fencelock::Error::lease_lost(guard.name(), cause)),
///     () = write_with_token(guard.fencing_token()) => {}
/// }
/// assert!(guard.remaining() > Duration::from_secs(25)); // of the 30 s lease
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// Its `Debug` shows the lock name, the fencing token and the lease, but neither the
/// [holder token](Self::holder_token) nor a reentrant owner id: either lets whoever
/// knows it release the lock or, for the owner id, reenter it.
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    shared: Arc<Shared>,
    name: String,
    keys: LockKeys,
    token: HolderToken,
    protocol: Arc<dyn Protocol>,
    /// The TTL of the grant (Redlock nodes get a share of it to answer a release).
    ttl: Duration,
    fence: FencingToken,
    /// The watched lease; `None` once released (which stops its renewal).
    lease: Option<Registration>,
    /// Whether a release is still owed (false after release, or once the lease is known
    /// to be lost).
    owes_release: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("client", &self.shared)
            .field("name", &self.name)
            .field("fencing_token", &self.fence)
            .field("mode", &self.protocol)
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .field("owes_release", &self.owes_release)
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// A guard of `holding`, granted (or confirmed) by `grant` (whose TTL was shortened to
    /// end at the maximum hold if `capped`), its lease watched from now.
    pub(crate) fn watched(
        shared: Arc<Shared>,
        name: String,
        holding: Holding,
        grant: &Grant,
        capped: bool,
    ) -> Self {
        let exclusive = matches!(
            holding.protocol.label(),
            ModeLabel::Plain | ModeLabel::Fair | ModeLabel::Reentrant
        );
        let registration = shared.watchdog.watch(
            holding.keys.lock.clone(),
            holding.protocol.holder_id(&holding.token).into_owned(),
            exclusive,
            holding.ttl,
            holding.renew,
            holding.hold_until,
            grant,
            capped,
        );
        LockGuard {
            shared,
            name,
            keys: holding.keys,
            token: holding.token,
            protocol: holding.protocol,
            ttl: holding.asked_ttl,
            fence: grant.fence,
            lease: Some(registration),
            owes_release: true,
        }
    }

    /// Lets go of the lock without releasing it, for another guard to take over with
    /// [`Client::attach`](crate::Client::attach) — in this process, or in another that
    /// gets [`DetachedLock::to_text`](crate::DetachedLock::to_text). Nothing is sent:
    /// renewal stops, the key keeps its lease in Redis, and nobody renews it until it is
    /// attached again; if that does not happen within the lease, the lock expires (the
    /// attach then fails with [`Error::LeaseLost`]).
    ///
    /// What it is for: keeping a lock across something that stops this process, such as
    /// the CLI keeping the lease of a job suspended with Ctrl-Z from a helper process,
    /// or handing a lock to a process started to do the work.
    pub fn detach(mut self) -> crate::DetachedLock {
        let registration = self.lease.take();
        self.owes_release = false; // no release on drop
        crate::DetachedLock {
            name: std::mem::take(&mut self.name),
            token: self.token.clone(),
            protocol: self.protocol.clone(),
            fence: self.fence,
            ttl: registration.as_ref().map_or(self.ttl, Registration::ttl),
            renew: registration.as_ref().is_some_and(Registration::renews),
            max_hold_end: registration
                .as_ref()
                .and_then(Registration::hold_until)
                .map(|end| {
                    std::time::SystemTime::now() + end.saturating_duration_since(Instant::now())
                }),
        }
    }

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
    pub fn holder_token(&self) -> &HolderToken {
        &self.token
    }

    /// When the lease ends, at the latest, by this process's monotonic clock: measured
    /// from just before the request that Redis last confirmed (the acquire, a renewal,
    /// an extend) was sent, minus an allowance for clock drift of 1% of the TTL plus
    /// 2 ms. Only a confirmed renewal moves it forward; never taken from the wall clock.
    pub fn valid_until(&self) -> Instant {
        self.lease()
            .map_or_else(Instant::now, |l| l.lease().valid_until())
    }

    /// How much of the lease is left by the local monotonic clock (zero once past
    /// [`valid_until`](Self::valid_until)).
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Completes when the lease is lost, with the reason: a renewal found the key gone
    /// or someone else's, or no renewal was confirmed and the lease is about to run out
    /// by the local clock (at [`valid_until`](Self::valid_until) minus a tenth of the
    /// TTL last granted, at most 1 s), or a fixed lease or the
    /// [maximum hold](crate::AcquireBuilder::max_hold) reached that point. Never completes for a
    /// lease that is kept, or after the guard was released.
    ///
    /// Race your work against it (`tokio::select!`), or let
    /// [`AcquireBuilder::run`](crate::AcquireBuilder::run) do that for you.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub fn lost(&self) -> impl Future<Output = LossCause> + Send + 'static + use<> {
        let watched = self
            .lease
            .as_ref()
            .map(|r| (r.lease().lost_token(), r.lease_arc()));
        async move {
            match watched {
                Some((token, lease)) => {
                    token.cancelled().await;
                    lease.cause().unwrap_or(LossCause::Expired)
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Whether the loss signal has fired, and why.
    pub fn loss_cause(&self) -> Option<LossCause> {
        self.lease().and_then(|r| r.lease().cause())
    }

    fn lease(&self) -> Option<&Registration> {
        self.lease.as_ref()
    }

    /// Resets the lease to `ttl` from now, if this guard still holds the lock. Never
    /// re-creates an expired lock, and never goes past the
    /// [maximum hold](crate::AcquireBuilder::max_hold) (the TTL is shortened to end there). The
    /// watchdog, if it renews this lease, goes on renewing it to its own lease length
    /// afterwards, starting within a third of `ttl`.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the key expired or belongs to another owner now (the
    /// guard then owes no release), the maximum hold was reached, or the loss signal
    /// ([`lost`](Self::lost)) has fired already;
    /// [`Error::InvalidArgument`] for a TTL out of range;
    /// [`Error::Unavailable`], [`Error::Rejected`], [`Error::WrongType`].
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the extend may or may not have happened on the server,
    /// and [`valid_until`](Self::valid_until) keeps its earlier value.
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let ttl = checked_ttl(ttl)?;
        // Once the holder has been told of a loss, the lease stays lost: work raced
        // against `lost()` has stopped, and a later extend must not pretend otherwise.
        if let Some(cause) = self.loss_cause() {
            return Err(Error::LeaseLost {
                name: self.name.clone(),
                cause,
            });
        }
        // Not past the maximum hold either.
        let (ttl, capped) = match self.lease() {
            Some(r) => match r.lease().capped_ttl(ttl, Instant::now()) {
                Some(capped) => capped,
                None => {
                    r.lease().lose(LossCause::MaxHold);
                    return Err(Error::LeaseLost {
                        name: self.name.clone(),
                        cause: LossCause::MaxHold,
                    });
                }
            },
            None => (ttl, false),
        };
        let holder = self.protocol.holder_id(&self.token);
        let extended = self
            .shared
            .backend
            .extend(&self.name, &self.keys, &holder, ttl)
            .await;
        match extended {
            Ok((sent_at, valid_until)) => {
                if let Some(r) = self.lease() {
                    let grant = Grant {
                        fence: self.fence,
                        sent_at,
                        ttl,
                        valid_until,
                    };
                    r.extended(&grant, capped);
                }
                Ok(())
            }
            Err(e @ Error::LeaseLost { .. }) => {
                self.owes_release = false;
                if let (Some(r), Error::LeaseLost { cause, .. }) = (self.lease(), &e) {
                    r.lease().lose(*cause);
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases the lock: stops its renewal at once, then deletes the key if it still
    /// holds this guard's token.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease had already ended (the key expired, or another
    /// owner holds it now): the lock is not yours and nothing was deleted, but work done
    /// under it may have overlapped. [`Error::Unavailable`] when Redis could not be
    /// reached or did not answer in time: on a standalone, Sentinel or Redlock node a
    /// release that timed out or was lost with its connection is kept and sent again
    /// (up to three times) once that server answers a later call of this client;
    /// otherwise the key expires after its TTL. [`Error::Rejected`],
    /// [`Error::WrongType`].
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped before the reply, the guard's drop sends the release again
    /// in the background (releasing twice is harmless: the second finds the key gone).
    pub async fn release(mut self) -> Result<(), Error> {
        // No renewal is sent for this lease from here on.
        self.lease = None;
        let started = Instant::now();
        let result = self
            .shared
            .backend
            .release(
                &self.name,
                &self.keys,
                &self.token,
                &*self.protocol,
                self.ttl,
                self.fence.get(),
            )
            .await;
        if !matches!(result, Err(Error::Unavailable { .. })) {
            self.owes_release = false;
        }
        let elapsed = started.elapsed();
        let outcome = ReleaseOutcome::of(&result);
        observe::released(ReleaseKind::Release, outcome, Some(elapsed));
        let (lock, fencing_token) = (self.name.as_str(), self.fence.get());
        let (outcome, elapsed_ms) = (outcome.as_str(), observe::ms(elapsed));
        match &result {
            Ok(()) => {
                tracing::debug!(lock, outcome, fencing_token, elapsed_ms, "lock released");
            }
            Err(e) => {
                tracing::debug!(lock, outcome, fencing_token, elapsed_ms, error = %e, "release failed");
            }
        }
        result
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.lease = None; // stop renewing before anything else
        if self.owes_release {
            self.shared.backend.abandon_in_background(
                Withdrawn::Guard,
                &self.keys,
                &self.token,
                &self.protocol,
                self.ttl,
                self.fence.get(),
            );
        }
    }
}
