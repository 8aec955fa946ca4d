//! The seam between the acquire driver and the nodes: [`Nodes`], what the driver asks of
//! them, in the engine's own types, and [`Listener`], one waiter's registration for
//! release messages. The backend implements both (`backend/mod.rs`); the engine's tests
//! give the driver a scripted fake under paused time (`engine/fake.rs`), beside the
//! tests against real servers.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::Outcome;
use super::acquire::{Handover, Request};
use super::protocol::{Protocol, Undo, Wake};
use crate::error::Error;
use crate::keys::LockKeys;
use crate::scripts::Call;
use crate::token::HolderToken;

/// What the acquire driver asks of the nodes of a lock. Every method acts on every node
/// (one, or Redlock's).
pub(crate) trait Nodes: Send + Sync + 'static {
    /// One waiter's registration on one channel of one node.
    type Listener: Listener;
    /// What one acquire keeps on the nodes' side between its attempts.
    type Session: Default + Send;

    /// Sends one attempt of `req` by `token`: `call` to every node, or to a node that
    /// must say who it is first, `identified` (Redlock), and tallies the answers.
    ///
    /// Errors: for one node, its own ([`Error::Unavailable`] leaves the outcome unknown);
    /// for Redlock, [`Error::NoQuorum`] once the take-back of everything written was
    /// sent. Cancel safety: dropped, the attempt's outcome is unknown.
    fn attempt(
        &self,
        req: &Request<'_>,
        token: &HolderToken,
        call: &Arc<Call>,
        identified: Option<&Arc<Call>>,
        session: &mut Self::Session,
    ) -> impl Future<Output = Result<Outcome, Error>> + Send;

    /// Withdraws what `token` may hold (`undo` says whether it goes on being used).
    fn withdraw(
        &self,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &dyn Protocol,
        ttl: Duration,
        undo: Undo,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The same, without waiting: in the background, on the client's turns.
    fn withdraw_in_background(
        &self,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &Arc<dyn Protocol>,
        ttl: Duration,
    );

    /// Takes this client off the lock's wake list in the background, once none of its
    /// plain waiters waits for the lock any more.
    fn unlist_in_background(&self, keys: &LockKeys);

    /// How many replicas acknowledged the writes so far of the lock `key`'s node, and
    /// how long that took.
    fn wait_replicas(
        &self,
        key: &str,
        replicas: u32,
        within: Duration,
    ) -> impl Future<Output = Result<(u32, Duration), Error>> + Send;

    /// Registers waiter `id` for releases on `channel`, on every node that confirms.
    fn subscribe(
        &self,
        channel: &str,
        id: u64,
        wake: Wake<'_>,
    ) -> impl Future<Output = Vec<Self::Listener>> + Send;

    /// Whether `channel` is subscribed on every node already.
    fn subscribed_everywhere(&self, channel: &str) -> bool;

    /// This client's own release channel of the lock of `keys`.
    fn own_channel(&self, keys: &LockKeys) -> String;

    /// This client's tag on a lock's wake list.
    fn client_tag(&self) -> &str;

    /// How long a lock's fencing counter lives without a grant (zero: for ever).
    fn counter_idle(&self) -> Duration;

    /// How many plain waiters of this client wait on `channel`.
    fn plain_waiters(&self, channel: &str) -> usize;

    /// How many nodes there are.
    fn node_count(&self) -> usize;
}

/// One waiter's registration for release messages on one channel of one node; dropping
/// it unregisters the waiter (passing on a wake it did not answer).
pub(crate) trait Listener: Send + Sync + 'static {
    /// Waits for a message meant for this waiter (or returns at once if one came since
    /// the last call).
    fn notified(&self) -> impl Future<Output = ()> + Send;

    /// The wakes delivered to this waiter so far: read it before sending an attempt.
    fn wake_mark(&self) -> u64;

    /// Redis answered an attempt sent after [`wake_mark`](Self::wake_mark) returned
    /// `mark`: the wakes up to `mark` are used, and dropping this waiter no longer passes
    /// them on.
    fn settle(&self, mark: u64);

    /// The handover delivered to this (fair) waiter, if one came: taken, so it is
    /// returned once.
    fn handover(&self) -> Option<Handover>;
}
