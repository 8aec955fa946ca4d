//! A semaphore's permit: up to `permits` holders at once, each with a lease of its own,
//! in a zset at the lock key (`semaphore/acquire.lua`, `semaphore/release.lua`);
//! optionally fair, with a queue as a fair lock's. A release wakes one waiting client by
//! name through the wake list, as a plain lock's does; a fair release names the waiters
//! whose turn it is.

use std::sync::Arc;
use std::time::Duration;

use super::text::{bad, ms};
use crate::engine::protocol::{Acquire, Listed, Protocol, Release, Waiting, Wake};
use crate::error::Error;
use crate::observe::ModeLabel;
use crate::scripts::{self, Call, Lua, flag};
use crate::token::HolderToken;

/// A permit of a semaphore of `permits`; `fair`: its waiters' timeout, when they are
/// served in arrival order.
#[derive(Debug)]
pub struct Semaphore {
    permits: u32,
    fair: Option<Duration>,
}

impl Semaphore {
    /// A permit of a semaphore of `permits`; `fair`: its waiter timeout.
    pub fn new(permits: u32, fair: Option<Duration>) -> Self {
        Self { permits, fair }
    }

    /// Reads back what [`to_text`](Protocol::to_text) wrote after `semaphore `.
    pub fn from_text(rest: &str) -> Result<Arc<dyn Protocol>, Error> {
        let (permits, fair) = match rest.split_once(' ') {
            Some((permits, timeout)) => (permits, Some(ms(timeout)?)),
            None => (rest, None),
        };
        let permits = permits
            .parse()
            .map_err(|_| bad("the permit count is not a number"))?;
        Ok(Arc::new(Self::new(permits, fair)))
    }
}

impl Protocol for Semaphore {
    fn label(&self) -> ModeLabel {
        ModeLabel::Semaphore
    }

    /// `semaphore/acquire.lua`: a permit if one is free (and, fair, the caller is first
    /// in line); a waiting attempt of a fair semaphore joins its queue, one of another
    /// semaphore lists its client on the wake list when refused.
    fn acquire(&self, a: &Acquire<'_>) -> Call {
        let mut call = Call::new(Lua::SemaphoreAcquire);
        call.key(&a.keys.lock)
            .key(a.keys.fence())
            .key(a.keys.permits());
        let listing = a.listing.filter(|_| self.fair.is_none());
        if self.fair.is_some() || listing.is_some() {
            call.key(a.keys.queue()).key(a.keys.waiters());
        }
        if listing.is_some() {
            call.key(a.keys.wake_list());
        }
        call.arg(a.token.as_str())
            .arg(scripts::ms(a.ttl))
            .arg(self.permits)
            .arg(scripts::ms(a.counter_idle));
        if let Some(waiter_timeout) = self.fair {
            call.arg(scripts::ms(waiter_timeout))
                .arg(flag(a.join))
                .arg(a.keys.channel());
        } else if let Some(l) = listing {
            call.arg(0)
                .arg(0)
                .arg("")
                .arg(l.tag)
                .arg(scripts::ms(l.margin))
                .arg(flag(l.stays))
                .arg(flag(l.front));
        }
        call
    }

    /// `semaphore/release.lua`: the permit, or the place in a fair queue, given back.
    fn release(&self, r: &Release<'_>) -> Call {
        let mut call = Call::new(Lua::SemaphoreRelease);
        call.key(&r.keys.lock)
            .key(r.keys.permits())
            .key(r.keys.queue())
            .key(r.keys.waiters())
            .key(r.keys.wake_list())
            .arg(r.token.as_str())
            .arg(r.keys.channel())
            .arg(flag(self.fair.is_some()));
        r.undoing(call)
    }

    /// A fair semaphore's release names the waiters whose turn it is; otherwise it wakes
    /// one waiter of one client (of each client, when none is listed).
    fn wake<'a>(&'a self, token: &'a HolderToken) -> Wake<'a> {
        match self.fair {
            Some(_) => Wake::Turn(token.as_str()),
            None => Wake::Plain,
        }
    }

    /// A fair semaphore's waiters line up in its queue; the others list their client on
    /// the wake list and hear a release by name on its own channel.
    fn waiting(&self) -> Waiting {
        Waiting {
            queue: self.fair,
            own_channel: self.fair.is_none(),
            listing: if self.fair.is_none() {
                Listed::ByName
            } else {
                Listed::No
            },
        }
    }

    fn to_text(&self) -> String {
        match self.fair {
            Some(timeout) => format!("semaphore {} {}", self.permits, timeout.as_millis()),
            None => format!("semaphore {}", self.permits),
        }
    }
}
