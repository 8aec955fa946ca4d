//! The seam between the acquire engine and the nodes: [`Nodes`], what the engine asks of
//! them. [`Backend`] is the real one; the engine's tests give it a scripted fake under
//! paused time (`engine/fake.rs`), beside the tests against real servers.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::Outcome;
use super::protocol::{Protocol, Wake};
use crate::backend::subscriber::Subscription;
use crate::backend::{AcquireRequest, Backend, Undo};
use crate::error::Error;
use crate::keys::LockKeys;
use crate::token::HolderToken;

/// What the acquire engine asks of the nodes of a lock. Every method acts on every node
/// (one, or Redlock's), as [`Backend`]'s of the same name.
pub(crate) trait Nodes: Send + Sync + 'static {
    /// One acquire attempt ([`Backend::acquire`]).
    fn acquire(
        &self,
        req: &AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Outcome, Error>> + Send;

    /// Withdraws what `token` may hold ([`Backend::abandon`]).
    fn abandon(
        &self,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &dyn Protocol,
        ttl: Duration,
        undo: Undo,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The same, without waiting: in the background, on the client's turns.
    fn abandon_in_background(
        &self,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &Arc<dyn Protocol>,
        ttl: Duration,
    );

    /// Takes this client off the lock's wake list in the background, once none of its
    /// plain waiters waits for the lock any more.
    fn unlist_in_background(&self, keys: &LockKeys);

    /// How many replicas acknowledged the writes so far of the lock `key`'s node
    /// ([`Backend::wait_replicas`]).
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
    ) -> impl Future<Output = Vec<Subscription>> + Send;

    /// Whether `channel` is subscribed on every node already.
    fn subscribed_everywhere(&self, channel: &str) -> bool;

    /// This client's own release channel of the lock of `keys`.
    fn own_channel(&self, keys: &LockKeys) -> String;

    /// This client's tag on a lock's wake list.
    fn client_tag(&self) -> &str;

    /// How many plain waiters of this client wait on `channel`.
    fn plain_waiters(&self, channel: &str) -> usize;

    /// How many nodes there are.
    fn node_count(&self) -> usize;
}

impl Nodes for Backend {
    fn acquire(
        &self,
        req: &AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Outcome, Error>> + Send {
        Backend::acquire(self, req)
    }

    fn abandon(
        &self,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &dyn Protocol,
        ttl: Duration,
        undo: Undo,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        Backend::abandon(self, keys, token, protocol, ttl, 0, undo)
    }

    fn abandon_in_background(
        &self,
        keys: &LockKeys,
        token: &HolderToken,
        protocol: &Arc<dyn Protocol>,
        ttl: Duration,
    ) {
        Backend::abandon_in_background(
            self,
            crate::backend::Withdrawn::Acquire,
            keys,
            token,
            protocol,
            ttl,
            0,
        );
    }

    fn unlist_in_background(&self, keys: &LockKeys) {
        Backend::unlist_in_background(self, keys);
    }

    fn wait_replicas(
        &self,
        key: &str,
        replicas: u32,
        within: Duration,
    ) -> impl Future<Output = Result<(u32, Duration), Error>> + Send {
        Backend::wait_replicas(self, key, replicas, within)
    }

    fn subscribe(
        &self,
        channel: &str,
        id: u64,
        wake: Wake<'_>,
    ) -> impl Future<Output = Vec<Subscription>> + Send {
        Backend::subscribe(self, channel, id, wake)
    }

    fn subscribed_everywhere(&self, channel: &str) -> bool {
        Backend::subscribed_everywhere(self, channel)
    }

    fn own_channel(&self, keys: &LockKeys) -> String {
        Backend::own_channel(self, keys)
    }

    fn client_tag(&self) -> &str {
        Backend::client_tag(self)
    }

    fn plain_waiters(&self, channel: &str) -> usize {
        Backend::plain_waiters(self, channel)
    }

    fn node_count(&self) -> usize {
        self.nodes().len()
    }
}
