//! The lock as `fencelock run` holds it, from the acquire (`main.rs`) through the
//! supervision of COMMAND (`supervise.rs`) to the release: one lock, or several taken at
//! once (`run NAME... -- COMMAND`), one guard per name.

use std::time::{Duration, Instant};

use fencelock::{Client, Error, LockGuard, LossCause};
use futures_util::future::{join_all, select_all};

/// The lock as fencelock holds it.
pub(crate) struct Holding {
    /// Every name's guard, in the global order (one guard for one name). Empty only
    /// while fencelock is suspended and its keeper holds them (see [`crate::keeper`]):
    /// the supervision takes them back before anything else uses them.
    pub(crate) guards: Vec<LockGuard>,
    /// The client that took them, which takes them back from the keeper.
    pub(crate) client: Client,
}

impl Holding {
    /// Every guard, in the global order.
    pub(crate) fn guards(&self) -> impl Iterator<Item = &LockGuard> {
        self.guards.iter()
    }

    /// The first name, for messages (empty if no guard is here).
    pub(crate) fn first_name(&self) -> String {
        self.guards
            .first()
            .map_or_else(String::new, |g| g.name().to_owned())
    }

    /// The end of the first lease to end: until then every name is held.
    pub(crate) fn valid_until(&self) -> Instant {
        self.guards()
            .map(LockGuard::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// How much of the first lease to end is left.
    pub(crate) fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Why a lease was lost, if one was (the first name's in the global order).
    pub(crate) fn loss_cause(&self) -> Option<LossCause> {
        self.guards().find_map(LockGuard::loss_cause)
    }

    /// Completes when any lease is lost.
    pub(crate) fn lost(&self) -> impl Future<Output = LossCause> + Send + 'static + use<> {
        let each: Vec<_> = self.guards().map(|g| Box::pin(g.lost())).collect();
        async move { select_all(each).await.0 }
    }

    /// Releases every guard at once: the first error (in the global order), if any.
    pub(crate) async fn release(&mut self) -> Result<(), Error> {
        let results = join_all(self.guards.drain(..).map(LockGuard::release)).await;
        results.into_iter().collect()
    }

    /// Why the lease was lost, for messages.
    pub(crate) fn loss_reason(&self, cause: LossCause) -> String {
        match cause {
            LossCause::MaxHold => "--max-hold was reached".to_owned(),
            other => other.to_string(),
        }
    }
}
