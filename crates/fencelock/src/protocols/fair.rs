//! A fair lock: waiters are served in arrival order from a queue in Redis
//! (`lock/fair_acquire.lua`, `lock/fair_release.lua`, `lock/fair_leave.lua`). A release
//! hands the lock to the head of the queue inside its script and tells that waiter on
//! its client's own channel.

use std::sync::Arc;
use std::time::Duration;

use super::text::{bad, ms};
use crate::engine::protocol::{Acquire, Listed, Protocol, Release, Waiting, Wake};
use crate::error::{Blocker, Error};
use crate::observe::ModeLabel;
use crate::scripts::{self, Call, Lua, flag};
use crate::token::HolderToken;

/// A fair lock; `waiter_timeout`: how long a queued waiter may stay silent before it is
/// purged.
#[derive(Debug)]
pub struct Fair {
    waiter_timeout: Duration,
}

impl Fair {
    /// A fair lock whose waiters are purged after `waiter_timeout` of silence.
    pub fn new(waiter_timeout: Duration) -> Self {
        Self { waiter_timeout }
    }

    /// Reads back what [`to_text`](Protocol::to_text) wrote after `fair `.
    pub fn from_text(rest: &str) -> Result<Arc<dyn Protocol>, Error> {
        if rest.is_empty() {
            return Err(bad("a fair lock's mode has no waiter timeout"));
        }
        Ok(Arc::new(Self::new(ms(rest)?)))
    }
}

impl Protocol for Fair {
    fn label(&self) -> ModeLabel {
        ModeLabel::Fair
    }

    /// `lock/fair_acquire.lua`: granted if free and first in line; a waiting attempt
    /// joins (or stays in) the queue, and lists `*` on the wake list when a holder
    /// refuses it (which may be a plain lock's of the same name: its release then wakes
    /// every client).
    fn acquire(&self, a: &Acquire<'_>) -> Call {
        let mut call = Call::new(Lua::FairAcquire);
        call.key(&a.keys.lock)
            .key(a.keys.fence())
            .key(a.keys.queue())
            .key(a.keys.waiters())
            .key(a.keys.holder_info())
            .key(a.keys.grants());
        if a.listing.is_some() {
            call.key(a.keys.wake_list());
        }
        call.arg(a.token.as_str())
            .arg(scripts::ms(a.ttl))
            .arg(scripts::ms(self.waiter_timeout))
            .arg(a.keys.channel())
            .arg(flag(a.join))
            .arg(a.info)
            .arg(a.keys.own_channel(a.client_tag))
            .arg(scripts::ms(a.counter_idle));
        if let Some(l) = a.listing {
            call.arg(scripts::ms(l.margin));
        }
        call
    }

    /// `lock/fair_release.lua`: the lock handed to the head of the queue, or deleted.
    fn release(&self, r: &Release<'_>) -> Call {
        let mut call = Call::new(Lua::FairRelease);
        call.key(&r.keys.lock)
            .key(r.keys.queue())
            .key(r.keys.waiters())
            .key(r.keys.holder_info())
            .key(r.keys.fence())
            .key(r.keys.grants())
            .arg(r.token.as_str())
            .arg(r.keys.channel())
            .arg(scripts::ms(r.counter_idle));
        r.undoing(call)
    }

    /// `lock/fair_leave.lua`: out of the queue, and a grant made without its knowing
    /// dropped.
    fn withdraw(&self, r: &Release<'_>) -> Call {
        let mut call = Call::new(Lua::FairLeave);
        call.key(&r.keys.lock)
            .key(r.keys.queue())
            .key(r.keys.waiters())
            .key(r.keys.holder_info())
            .key(r.keys.grants())
            .arg(r.token.as_str())
            .arg(r.keys.channel());
        r.undoing(call)
    }

    /// Its turn: a message that names its token (or a handover to it).
    fn wake<'a>(&'a self, token: &'a HolderToken) -> Wake<'a> {
        Wake::Turn(token.as_str())
    }

    /// A writer that readers refused waits among the writers, registered for one lease
    /// from each attempt: it calls again within a third of it.
    fn place_in_line(&self, blocked_by: &Blocker, ttl: Duration) -> Option<Duration> {
        match blocked_by {
            Blocker::Readers { .. } => Some(ttl / 3),
            _ => Some(self.waiter_timeout / 3),
        }
    }

    fn waiting(&self) -> Waiting {
        Waiting {
            queue: Some(self.waiter_timeout),
            own_channel: true,
            listing: Listed::Everyone,
        }
    }

    fn to_text(&self) -> String {
        format!("fair {}", self.waiter_timeout.as_millis())
    }
}
