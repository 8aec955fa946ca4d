//! A reentrant lock: holds are counted per owner id, in a hash at the lock key
//! (`lock/reentrant_acquire.lua`, `lock/reentrant_release.lua`). Every hold of one owner
//! shares the first hold's fencing token.

use std::time::Duration;

use std::borrow::Cow;
use std::sync::Arc;

use super::text::checked_owner;
use crate::engine::protocol::{Acquire, Listed, Protocol, Release, Waiting, Wake};
use crate::error::{Blocker, Error};
use crate::observe::ModeLabel;
use crate::scripts::{Call, Lua, flag, ms};
use crate::token::HolderToken;

/// A reentrant lock of `owner`. Its `Debug` hides the owner id, which lets whoever
/// knows it reenter and release.
pub struct Reentrant {
    owner: String,
}

impl std::fmt::Debug for Reentrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reentrant")
            .field("owner", &"<redacted>")
            .finish()
    }
}

impl Reentrant {
    /// `owner` already checked ([`checked_owner`]).
    pub fn new(owner: String) -> Self {
        Self { owner }
    }

    /// Reads back what [`to_text`](Protocol::to_text) wrote after `reentrant `.
    pub fn from_text(rest: &str) -> Result<Arc<dyn Protocol>, Error> {
        Ok(Arc::new(Self::new(checked_owner(rest)?)))
    }
}

impl Protocol for Reentrant {
    fn label(&self) -> ModeLabel {
        ModeLabel::Reentrant
    }

    /// `lock/reentrant_acquire.lua`: one more hold if the owner holds it or it is free;
    /// a waiting attempt refused by a plain holder lists `*` on the wake list.
    fn acquire(&self, a: &Acquire<'_>) -> Call {
        let mut call = Call::new(Lua::ReentrantAcquire);
        call.key(&a.keys.lock)
            .key(a.keys.fence())
            .key(a.keys.writers());
        if a.listing.is_some() {
            call.key(a.keys.wake_list());
        }
        call.arg(&self.owner)
            .arg(a.token.as_str())
            .arg(ms(a.ttl))
            .arg(ms(a.counter_idle))
            .arg(flag(a.join));
        if let Some(l) = a.listing {
            call.arg(ms(l.margin));
        }
        call
    }

    /// `lock/reentrant_release.lua`: one hold given back; the last frees the lock.
    fn release(&self, r: &Release<'_>) -> Call {
        let mut call = Call::new(Lua::ReentrantRelease);
        call.key(&r.keys.lock)
            .key(r.keys.writers())
            .arg(&self.owner)
            .arg(r.token.as_str())
            .arg(r.keys.channel());
        r.undoing(call)
    }

    /// The key is the owner's hash: renewals name the owner.
    fn holder_id<'a>(&'a self, _token: &'a HolderToken) -> Cow<'a, str> {
        Cow::Borrowed(&self.owner)
    }

    /// Every release wakes every one of them: any number of one owner's holds can be
    /// held together.
    fn wake<'a>(&'a self, _token: &'a HolderToken) -> Wake<'a> {
        Wake::Owner
    }

    /// A writer that readers refused waits among the writers, registered for one lease
    /// from each attempt: it calls again within a third of it.
    fn place_in_line(&self, blocked_by: &Blocker, ttl: Duration) -> Option<Duration> {
        match blocked_by {
            Blocker::Readers { .. } => Some(ttl / 3),
            _ => None,
        }
    }

    fn waiting(&self) -> Waiting {
        Waiting {
            queue: None,
            own_channel: false,
            listing: Listed::Everyone,
        }
    }

    fn to_text(&self) -> String {
        format!("reentrant {}", self.owner)
    }
}
