//! The lock as `fencelock run` holds it, from the acquire (`main.rs`) through the
//! supervision of COMMAND (`supervise.rs`) to the release.

use fencelock::{Client, LockGuard, LossCause};

/// The lock as fencelock holds it.
pub(crate) struct Holding {
    /// `None` only while fencelock is suspended and its keeper holds the lock (see
    /// [`crate::keeper`]); the supervision takes it back before anything else uses it.
    pub(crate) guard: Option<LockGuard>,
    /// The client that took it, which takes it back from the keeper.
    pub(crate) client: Client,
}

impl Holding {
    /// The guard, which is there whenever fencelock runs (it is away only while
    /// fencelock is stopped).
    pub(crate) fn guard(&self) -> &LockGuard {
        self.guard
            .as_ref()
            .expect("the guard is back from the keeper before fencelock goes on")
    }

    /// Why the lease was lost, for messages.
    pub(crate) fn loss_reason(&self, cause: LossCause) -> String {
        match cause {
            LossCause::MaxHold => "--max-hold was reached".to_owned(),
            other => other.to_string(),
        }
    }
}
