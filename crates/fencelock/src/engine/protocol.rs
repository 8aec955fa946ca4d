//! What the engine asks of a primitive ([`Protocol`]), and what it and the backend hand
//! a protocol: an attempt's [`Acquire`], a release's [`Release`]. The primitives
//! themselves are `src/protocols/`, one module each: the engine never names one.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Blocker;
use crate::keys::LockKeys;
use crate::observe::ModeLabel;
use crate::scripts::{Call, Listing};
use crate::token::HolderToken;

/// How the holders of one lock name take turns.
pub trait Protocol: fmt::Debug + Send + Sync {
    /// The `mode` label of metrics and spans.
    fn label(&self) -> ModeLabel;

    /// The script call of one acquire attempt.
    fn acquire(&self, a: &Acquire<'_>) -> Call;

    /// The script call that gives a grant of `r.token` back: a held lock's release
    /// ([`Undo::Release`]), or a withdrawal's when this protocol withdraws by releasing.
    fn release(&self, r: &Release<'_>) -> Call;

    /// What withdraws everything `r.token` may hold when its acquire ends without the
    /// lock, or its guard is dropped: by default its release.
    fn withdraw(&self, r: &Release<'_>) -> Call {
        self.release(r)
    }

    /// What the lock key holds for the holder of `token`: renewals and extends compare
    /// against it.
    fn holder_id<'a>(&'a self, token: &'a HolderToken) -> Cow<'a, str> {
        Cow::Borrowed(token.as_str())
    }

    /// Which release messages wake a waiter holding `token`.
    fn wake<'a>(&'a self, token: &'a HolderToken) -> Wake<'a>;

    /// How its waiters wait.
    fn waiting(&self) -> Waiting {
        Waiting::default()
    }

    /// Whether a waiting attempt that `blocked_by` refused holds a place in line (which
    /// an acquire that ends without the lock withdraws), and within how long the waiter
    /// calls again to keep it: by default a queue's waiter, within a third of its
    /// timeout ([`Waiting::queue`]). `ttl`: the lease the acquire asks for.
    fn place_in_line(&self, blocked_by: &Blocker, ttl: Duration) -> Option<Duration> {
        let _ = (blocked_by, ttl);
        self.waiting().queue.map(|timeout| timeout / 3)
    }

    /// The protocol a grant is held under from then on when the script says it belongs
    /// to another's hold (a reader's grant that is one more hold of its owner's
    /// reentrant write lock); `None`: it stays this one.
    fn held_as(&self) -> Option<Arc<dyn Protocol>> {
        None
    }

    /// A protocol that takes several names in one call (a multi-lock): the keys of the
    /// name at place `at` of its call, which a refusal names ([`Error::Held`]'s `name`)
    /// and whose release its waiter waits for.
    ///
    /// [`Error::Held`]: crate::Error::Held
    fn keys_at(&self, _at: usize) -> Option<&LockKeys> {
        None
    }

    /// Its `mode=` line in a detached lock (read back by `protocols::from_text`).
    fn to_text(&self) -> String;
}

/// What one acquire attempt sends, whatever the protocol.
pub struct Acquire<'a> {
    /// The lock's keys.
    pub keys: &'a LockKeys,
    /// The acquire's holder token (every attempt's).
    pub token: &'a HolderToken,
    /// The lease asked for.
    pub ttl: Duration,
    /// Ask the node who it is (Redlock's restart protection).
    pub identify: bool,
    /// What the holder says about itself ("" for nothing).
    pub info: &'a str,
    /// How long the fencing counter lives without a grant (zero: for ever).
    pub counter_idle: Duration,
    /// A waiting acquire: it takes a place in line when one is kept (a fair queue, the
    /// writers waiting for a read-write lock's readers).
    pub join: bool,
    /// An earlier attempt may have taken such a place, which a grant leaves.
    pub queued: bool,
    /// The client's place on the lock's wake list, which a refusal keeps.
    pub listing: Option<Listing<'a>>,
    /// A multi-lock's waiter: the place in the call of the name whose release it waits
    /// for ([`Protocol::keys_at`]).
    pub waits_on: Option<usize>,
    /// The client's tag, which names its own release channel of this lock (a fair
    /// handover comes there).
    pub client_tag: &'a str,
}

/// What a release or withdrawal sends.
pub struct Release<'a> {
    /// The lock's keys.
    pub keys: &'a LockKeys,
    /// The holder token whose grant it gives back.
    pub token: &'a HolderToken,
    /// Redlock: the grant's fencing token, raised into every node's counter; 0 on one
    /// node.
    pub fence: u64,
    /// How long a raised counter lives without a grant.
    pub counter_idle: Duration,
    /// What it undoes.
    pub undo: Undo,
}

/// What a release call undoes, and whether the token goes on being used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undo {
    /// A held lock's release: the token's last call.
    Release,
    /// An acquire that ended without the lock withdraws what it may have written: the
    /// token's last call.
    Withdraw,
    /// One failed attempt's writes taken back; the acquire may try again with the same
    /// token, so this call must never run after that attempt (see
    /// `Call::undoing`).
    TakeBack,
}

impl Release<'_> {
    /// Marks `call` as undoing this token's writes (see
    /// [`Call::undoing`](crate::scripts::Call::undoing)).
    pub(crate) fn undoing(&self, call: Call) -> Call {
        call.undoing(self.token, self.undo != Undo::TakeBack)
    }
}

/// How a protocol's waiters wait for a release.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Waiting {
    /// Waiters line up in a queue in Redis, and one that stays silent this long is
    /// purged from it: each calls again within a third of it (fair modes).
    pub queue: Option<Duration>,
    /// Listens on its client's own channel too: where a fair release hands it the lock,
    /// and a plain lock's or a semaphore's release wakes its client by name.
    pub own_channel: bool,
    /// How a waiting attempt lists its client on the lock's wake list.
    pub listing: Listed,
}

/// How a waiting attempt stands on the lock's wake list (`fragments/waiting.lua`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Listed {
    /// It is not listed.
    #[default]
    No,
    /// By its client's tag: a release wakes that client by name (the waiters of a plain
    /// lock, and of a semaphore that is not fair); as `*` while its client's own channel
    /// is not subscribed on every node.
    ByName,
    /// As `*` when a plain holder refuses it: that holder's release wakes every client
    /// (waiting readers, reentrant owners and fair waiters: a release that finds
    /// nobody listed publishes nothing).
    Everyone,
}

/// Which release messages wake a waiter.
#[derive(Clone, Copy, Debug)]
pub enum Wake<'a> {
    /// A plain waiter: each message wakes one plain waiter of the client. On the
    /// client's own channel, a wake that finds none is handed on (see the subscriber's `HandOn`).
    Plain,
    /// A reentrant waiter: every release wakes every one of them.
    Owner,
    /// A fair waiter with this owner token: woken when a message names it (its turn),
    /// or by an empty payload.
    Turn(&'a str),
}
