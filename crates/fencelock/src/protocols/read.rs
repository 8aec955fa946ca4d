//! A read-write lock's read side: many readers at once, each with a lease of its own,
//! while no writer holds it or waits (`rwlock/read_acquire.lua`,
//! `rwlock/read_release.lua`). The writer is the plain or reentrant lock of the same
//! name.

use std::borrow::Cow;
use std::sync::Arc;

use super::reentrant::Reentrant;
use super::text::checked_owner;
use crate::engine::protocol::{Acquire, Listed, Protocol, Release, Waiting, Wake};
use crate::error::Error;
use crate::observe::ModeLabel;
use crate::scripts::{Call, Lua, ms};
use crate::token::HolderToken;

/// A reader; `owner`: its owner id ("" for none), whose other reads let it in past
/// waiting writers, and whose reentrant write lock it may read under. Its `Debug` hides
/// the owner id.
pub struct Read {
    owner: String,
}

impl std::fmt::Debug for Read {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let owner = if self.owner.is_empty() {
            ""
        } else {
            "<redacted>"
        };
        f.debug_struct("Read").field("owner", &owner).finish()
    }
}

impl Read {
    /// `owner` already checked, or "".
    pub fn new(owner: String) -> Self {
        Self { owner }
    }

    /// Reads back what [`to_text`](Protocol::to_text) wrote after `read `.
    pub fn from_text(rest: &str) -> Result<Arc<dyn Protocol>, Error> {
        let owner = if rest.is_empty() {
            String::new()
        } else {
            checked_owner(rest)?
        };
        Ok(Arc::new(Self::new(owner)))
    }
}

impl Protocol for Read {
    fn label(&self) -> ModeLabel {
        ModeLabel::Read
    }

    /// `rwlock/read_acquire.lua`: a reader's lease unless a writer holds the lock or
    /// waits; a waiting attempt refused by a plain writer, or for writers waiting (who
    /// then hold it), lists `*` on the wake list.
    fn acquire(&self, a: &Acquire<'_>) -> Call {
        let mut call = Call::new(Lua::ReadAcquire);
        call.key(&a.keys.lock)
            .key(a.keys.fence())
            .key(a.keys.writers());
        if a.listing.is_some() {
            call.key(a.keys.wake_list());
        }
        call.arg(a.token.as_str())
            .arg(ms(a.ttl))
            .arg(&self.owner)
            .arg(ms(a.counter_idle));
        if let Some(l) = a.listing {
            call.arg(ms(l.margin));
        }
        call
    }

    /// `rwlock/read_release.lua`: this reader's lease ended; the last reader's release
    /// is announced when a writer waits or a client is listed.
    fn release(&self, r: &Release<'_>) -> Call {
        let mut call = Call::new(Lua::ReadRelease);
        call.key(&r.keys.lock)
            .key(r.keys.writers())
            .key(r.keys.wake_list())
            .arg(self.holder_id(r.token).as_ref())
            .arg(r.keys.channel());
        r.undoing(call)
    }

    /// The reader's member: its token, or `<token>:<owner>`.
    fn holder_id<'a>(&'a self, token: &'a HolderToken) -> Cow<'a, str> {
        if self.owner.is_empty() {
            Cow::Borrowed(token.as_str())
        } else {
            Cow::Owned(format!("{}:{}", token.as_str(), self.owner))
        }
    }

    /// Readers share: a release lets every one of them in.
    fn wake<'a>(&'a self, _token: &'a HolderToken) -> Wake<'a> {
        Wake::Owner
    }

    fn waiting(&self) -> Waiting {
        Waiting {
            queue: None,
            own_channel: false,
            listing: Listed::Everyone,
        }
    }

    /// Granted as one more hold of the owner's reentrant write lock: released and
    /// renewed as that.
    fn held_as(&self) -> Option<Arc<dyn Protocol>> {
        (!self.owner.is_empty()).then(|| Arc::new(Reentrant::new(self.owner.clone())) as _)
    }

    fn to_text(&self) -> String {
        format!("read {}", self.owner)
    }
}
