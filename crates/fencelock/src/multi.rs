//! Several locks at once: [`MultiLockBuilder`] (from [`Client::lock_all`]) and the
//! guard of all of them, [`MultiGuard`].
//!
//! How it takes them (the protocol is `protocols/multi.rs`):
//! - The names are sorted (byte order): that is the global order every caller uses,
//!   whatever order it gave them in.
//! - On one node (a standalone server, a Sentinel-managed master) every name is taken
//!   in one script call, all or none; with Redlock, that call goes to every node and a
//!   majority decides, as for one lock. On a Redis Cluster the names are grouped by the
//!   slot of their keys (the name is the key's hash tag, and the backend groups them:
//!   `Backend::call_groups`), and the groups are taken one call each; a refusal gives
//!   back the groups granted before it.
//! - A refusal names the held name. The engine waits for that name's release as for a
//!   plain waiter of it (its release channel and wake list, bounded by its holder's
//!   lease), holding nothing, and then tries every name again in one call; a refusal
//!   by another name moves the wait there. On a Cluster, the group that refused waits
//!   that way, first in the next round, and the others follow with single attempts.
//!   It never waits for a name while it holds another, so callers cannot deadlock
//!   whatever sets they take.
//!
//! A held multi-lock is one plain lock per name, all granted to one holder token: the
//! client's watchdog renews each lease, [`MultiGuard::release`] releases each
//! (owner-checked), and each name has its own fencing token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{join_all, select_all};

use crate::builder::sealed::{Sealed, StoresInfo};
use crate::builder::{AcquireBuilder, Leases, Target};
use crate::engine::Protocol;
use crate::engine::acquire::{Acquired, Request};
use crate::engine::driver;
use crate::error::{Error, LossCause};
use crate::guard::LockGuard;
use crate::keys::LockKeys;
use crate::limits::MAX_MULTI_NAMES;
use crate::protocols::{Multi, Plain};
use crate::shared::Shared;
use crate::token::FencingToken;

/// How to take several locks at once: from [`Client::lock_all`](crate::Client::lock_all).
/// The lease settings are every kind's ([`AcquireBuilder`]'s, with
/// [`holder_info`](AcquireBuilder::holder_info)) and hold for every name; nothing is
/// sent until [`acquire`](AcquireBuilder::acquire) or
/// [`try_acquire`](AcquireBuilder::try_acquire).
///
/// What it guarantees:
/// - **All or none**: the guard holds every name; an acquire that fails holds none of
///   them when it returns (what it took on the way is released, owner-checked, before it
///   waits or fails; a release that cannot reach Redis is sent again in the background,
///   and the key expires with its lease otherwise).
/// - **No deadlock**: it never waits for a name while it holds another, and every caller
///   takes the names in one global order (sorted), so overlapping sets taken by many
///   callers in any order are all served.
/// - **One token per name**: each name's [fencing token](MultiGuard::fencing_token)
///   is higher than every token handed out for that name before (by a multi-lock or a
///   single lock), so a resource checks the token of the name that guards it. The names
///   taken in one call share one token value.
///
/// Limits:
/// - On one node and with Redlock the names are taken in one atomic call per attempt. On
///   a Redis Cluster, names in different slots are taken one slot group after the
///   other: not one atomic call. Another caller may see some of them taken for the time
///   of the calls, and a client killed between its calls leaves the groups it took until
///   their lease runs out (they are never renewed).
/// - A waiting acquire is not fair: it waits for one name at a time and may find
///   another taken once that one is free; it is served as soon as all are free at once,
///   and a steady stream of single-lock holders of one of its names can keep it
///   waiting.
/// - Fair and reentrant multi-locks are not supported: a multi-lock has no `fair` or
///   `reentrant` (they do not compile; see [`AcquireBuilder`]). Each name must be held
///   as a plain lock (or free); a semaphore or data fencelock did not write under one of
///   the names gives [`Error::WrongType`].
/// - At most [`MAX_MULTI_NAMES`] names, none twice, each a valid lock name; the list
///   may not be empty. Each is [`Error::InvalidArgument`] with nothing sent.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fencelock::Error> {
/// # let redis = testkit::RedisServer::start();
/// # let client = fencelock::Client::connect(&redis.url()).await?;
/// use std::time::Duration;
///
/// let guard = client
///     .lock_all(["account:7", "account:3"])
///     .wait(Duration::from_secs(5))
///     .acquire()
///     .await?;
/// let from = guard.fencing_token("account:7").expect("held");
/// let to = guard.fencing_token("account:3").expect("held");
/// # let _ = (from, to);
/// // ... write to each account with its own token ...
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
pub type MultiLockBuilder = AcquireBuilder<MultiLockKind>;

/// What a [`MultiLockBuilder`] takes: several plain locks, by name, all or none.
#[derive(Clone, Debug, Default)]
pub struct MultiLockKind {
    names: Vec<String>,
    /// What the holder says about itself, beside every name.
    info: String,
}

impl Target for MultiLockKind {}

impl Sealed for MultiLockKind {
    const BUILDER: &'static str = "MultiLockBuilder";

    fn info(&self) -> &str {
        &self.info
    }
}

impl StoresInfo for MultiLockKind {
    fn info_mut(&mut self) -> &mut String {
        &mut self.info
    }
}

impl MultiLockBuilder {
    pub(crate) fn for_names(shared: Arc<Shared>, names: Vec<String>) -> Self {
        let kind = MultiLockKind {
            names,
            info: String::new(),
        };
        AcquireBuilder::new(shared, String::new(), kind)
    }

    /// The names, as given.
    pub fn names(&self) -> &[String] {
        &self.parts().2.names
    }

    /// Makes one attempt at every name: all taken, or none.
    ///
    /// # Errors
    /// [`Error::Held`] naming a held name; [`Error::InvalidArgument`] for the names or
    /// the settings (nothing sent); [`Error::WrongType`], [`Error::Unavailable`],
    /// [`Error::Rejected`], [`Error::NoQuorum`] as for one lock.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, it releases in the background whatever it took.
    pub fn try_acquire(
        &self,
    ) -> impl Future<Output = Result<MultiGuard, Error>> + Send + 'static + use<> {
        let this = self.clone();
        async move { this.take_all(Some(Duration::ZERO)).await }
    }

    /// Takes every name, waiting as configured with [`wait`](Self::wait) or
    /// [`wait_forever`](Self::wait_forever); see the type's docs for how it waits.
    ///
    /// # Errors
    /// [`Error::Held`] naming the name it last waited for, when the wait runs out, and
    /// the errors of [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`try_acquire`](Self::try_acquire).
    pub fn acquire(
        &self,
    ) -> impl Future<Output = Result<MultiGuard, Error>> + Send + 'static + use<> {
        let this = self.clone();
        async move { this.take_all(this.parts().1.wait).await }
    }

    /// The names sorted into the global order, each with its keys; typed errors for the
    /// list.
    fn sorted(&self) -> Result<Vec<(String, LockKeys)>, Error> {
        let (shared, _, kind) = self.parts();
        global_order(&shared.prefix, &kind.names)
    }

    /// One request of this acquire: `keys` under `protocol`, waiting `wait`.
    fn request<'a>(
        &'a self,
        name: &'a str,
        keys: LockKeys,
        protocol: Arc<dyn Protocol>,
        leases: Leases,
        wait: Option<Duration>,
    ) -> Request<'a> {
        let (_, settings, kind) = self.parts();
        Request {
            name,
            keys,
            protocol,
            ttl: leases.acquire_ttl,
            wait,
            retry: settings.retry,
            info: &kind.info,
            replicas: settings.replicas,
            renew: settings.renew,
        }
    }

    async fn take_all(&self, wait: Option<Duration>) -> Result<MultiGuard, Error> {
        let names = self.sorted()?;
        let (shared, settings, kind) = self.parts();
        let leases = settings.check(shared, &kind.info)?;
        let backend = &shared.backend;
        let groups = backend.call_groups(names.iter().map(|(_, keys)| keys.lock.as_str()));
        let started = Instant::now();
        let deadline = wait.map(|w| started + w);
        // What is held, by index into `names`. Dropped (a cancelled acquire, an error),
        // each guard releases in the background.
        let mut held: Vec<Option<LockGuard>> = names.iter().map(|_| None).collect();
        // The group that waits (holding nothing) for its held name: the first, then the
        // one that refused last.
        let mut waiting = 0;
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let order = std::iter::once(waiting).chain((0..groups.len()).filter(|g| *g != waiting));
            let mut refused = None;
            for g in order {
                let wait = if g == waiting {
                    left
                } else {
                    Some(Duration::ZERO)
                };
                match self.take(&names, &groups[g], leases, wait).await {
                    Ok(guards) => {
                        for (i, guard) in guards {
                            held[i] = Some(guard);
                        }
                    }
                    Err(e @ Error::Held { .. }) => {
                        refused = Some((g, e));
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            let Some((g, mut refusal)) = refused else {
                let guards = held.into_iter().flatten().collect();
                return Ok(MultiGuard { guards });
            };
            // Give back what is held before waiting or failing: never hold one name
            // while waiting for another.
            release_all(held.iter_mut().filter_map(Option::take).collect()).await?;
            let over = deadline.is_some_and(|d| Instant::now() >= d);
            if g == waiting || over {
                if let Error::Held { waited, .. } = &mut refusal
                    && wait != Some(Duration::ZERO)
                {
                    *waited = started.elapsed();
                }
                return Err(refusal);
            }
            waiting = g;
        }
    }

    /// Takes the names of one call group (`group`, indexes into `names`) through the
    /// engine, waiting `wait` for a held name as a plain waiter of it does (holding
    /// nothing), and gives each name its plain guard. No await after the grant: each
    /// name has its guard in the poll the grant arrives in.
    async fn take(
        &self,
        names: &[(String, LockKeys)],
        group: &[usize],
        leases: Leases,
        wait: Option<Duration>,
    ) -> Result<Vec<(usize, LockGuard)>, Error> {
        let keys: Vec<LockKeys> = group.iter().map(|&i| names[i].1.clone()).collect();
        let first = group[0];
        let request = self.request(
            &names[first].0,
            names[first].1.clone(),
            Arc::new(Multi::new(keys)),
            leases,
            wait,
        );
        let acquired = driver::acquire(&self.parts().0.backend, request).await?;
        Ok(group
            .iter()
            .map(|&i| (i, self.guard(&names[i], &acquired, leases)))
            .collect())
    }

    /// The plain guard of one name of `acquired`.
    fn guard(
        &self,
        (name, keys): &(String, LockKeys),
        acquired: &Acquired,
        leases: Leases,
    ) -> LockGuard {
        let held = Acquired {
            keys: keys.clone(),
            token: acquired.token.clone(),
            protocol: Arc::new(Plain),
            grant: acquired.grant,
        };
        let (shared, settings, _) = self.parts();
        settings.guard(shared, name.clone(), held, leases)
    }
}

/// Releases every guard at once; the first error other than a lease already lost.
async fn release_all(guards: Vec<LockGuard>) -> Result<(), Error> {
    for result in join_all(guards.into_iter().map(LockGuard::release)).await {
        match result {
            Ok(()) | Err(Error::LeaseLost { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Several held locks, from [`MultiLockBuilder`]: one plain lock per name, each with its
/// own lease (renewed by the client's watchdog while the guard lives) and its own
/// fencing token. Release it with [`release`](Self::release); dropped unreleased, it
/// releases every name in the background.
///
/// Its `Debug` shows each name's guard (no holder token).
#[derive(Debug)]
#[must_use = "the locks are released when the guard is dropped"]
pub struct MultiGuard {
    /// One per name, in the global order (sorted by name).
    guards: Vec<LockGuard>,
}

/// Which lock of a [`MultiGuard`] lost its lease, and why: what
/// [`MultiGuard::lost`] completes with.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LostLock {
    /// The name whose lease was lost.
    pub name: String,
    /// Why.
    pub cause: LossCause,
}

impl MultiGuard {
    /// The names held, in the global order (sorted).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::name)
    }

    /// The fencing token of `name` (`None` if this guard does not hold it): higher than
    /// every token handed out for that name before. Send it with every write to the
    /// resource `name` guards.
    pub fn fencing_token(&self, name: &str) -> Option<FencingToken> {
        self.guard(name).map(LockGuard::fencing_token)
    }

    /// Every name with its fencing token, in the global order.
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, FencingToken)> {
        self.guards.iter().map(|g| (g.name(), g.fencing_token()))
    }

    /// The guard of `name`, if held: its own lease, [`lost`](LockGuard::lost) signal and
    /// [`extend`](LockGuard::extend) live there.
    pub fn guard(&self, name: &str) -> Option<&LockGuard> {
        self.guards.iter().find(|g| g.name() == name)
    }

    /// The end of the first lease to end ([`LockGuard::valid_until`]): until then every
    /// name is held.
    pub fn valid_until(&self) -> Instant {
        self.guards
            .iter()
            .map(LockGuard::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// How much of the shortest lease is left by the local clock.
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Completes when any name's lease is lost ([`LockGuard::lost`]), saying which and
    /// why. The other names are still held until [`release`](Self::release) or the drop.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub fn lost(&self) -> impl Future<Output = LostLock> + Send + 'static + use<> {
        let each: Vec<_> = self
            .guards
            .iter()
            .map(|g| {
                let (name, lost) = (g.name().to_owned(), g.lost());
                Box::pin(async move {
                    let cause = lost.await;
                    LostLock { name, cause }
                })
            })
            .collect();
        async move { select_all(each).await.0 }
    }

    /// A lease lost already, if any: the first name (in the global order) whose loss
    /// signal fired.
    pub fn loss(&self) -> Option<LostLock> {
        self.guards.iter().find_map(|g| {
            g.loss_cause().map(|cause| LostLock {
                name: g.name().to_owned(),
                cause,
            })
        })
    }

    /// Releases every name at once ([`LockGuard::release`] each: renewal stops, each key
    /// deleted if it still holds this grant's token).
    ///
    /// # Errors
    /// The first error in the global order: [`Error::LeaseLost`] naming a name whose
    /// lease had ended (the others are released all the same), and the errors of
    /// [`LockGuard::release`].
    ///
    /// # Cancel safety
    /// Cancel safe: the names not released yet are released in the background.
    pub async fn release(self) -> Result<(), Error> {
        let results = join_all(self.guards.into_iter().map(LockGuard::release)).await;
        results.into_iter().collect()
    }

    /// The guard of each name, in the global order, to hold, release or
    /// [`detach`](LockGuard::detach) one by one.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }
}

/// `names` sorted into the global order every caller takes them in, each with its keys
/// under `prefix`; typed errors for an empty list, too many names, a name given twice
/// or an invalid one.
pub(crate) fn global_order(
    prefix: &str,
    names: &[String],
) -> Result<Vec<(String, LockKeys)>, Error> {
    if names.is_empty() {
        return Err(Error::invalid("lock names", "the list is empty".to_owned()));
    }
    if names.len() > MAX_MULTI_NAMES {
        return Err(Error::invalid(
            "lock names",
            format!(
                "{} names; a multi-lock takes at most {MAX_MULTI_NAMES}",
                names.len()
            ),
        ));
    }
    let mut names = names.to_vec();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::invalid(
            "lock names",
            format!("{:?} is named twice", twice[0]),
        ));
    }
    names
        .into_iter()
        .map(|name| {
            let keys = LockKeys::new(prefix, &name)?;
            Ok((name, keys))
        })
        .collect()
}
