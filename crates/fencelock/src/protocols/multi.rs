//! Several plain locks at once (`lock/multi_acquire.lua`, `lock/multi_release.lua`):
//! one call takes every name it is given or none, and mints one fencing token for all of
//! them, higher than each name's counter. The names of one call share a node (one
//! server, each Redlock node, or one Cluster slot); the multi-lock builder
//! (`multi.rs`) splits a Cluster's names by slot and sends one call per slot group.
//!
//! A refusal names the held name ([`Protocol::keys_at`]): a waiting multi-lock waits for
//! that name's release as a plain waiter of it does (its channels, its client listed on
//! its wake list by name), holding nothing, and then tries every name again. A held
//! multi-lock is one plain lock per name (renewed, released and detached as such): only
//! an attempt's take-back and withdrawal go through [`Multi::release`].

use crate::engine::protocol::{Acquire, Listed, Protocol, Release, Waiting, Wake};
use crate::keys::LockKeys;
use crate::observe::ModeLabel;
use crate::scripts::{Call, Lua, flag, ms};
use crate::token::HolderToken;

/// The names of one multi-lock call, in the global order (sorted).
#[derive(Debug)]
pub struct Multi {
    names: Vec<LockKeys>,
}

impl Multi {
    /// A call over `names`, which must share a node (one Cluster slot).
    pub(crate) fn new(names: Vec<LockKeys>) -> Self {
        Self { names }
    }
}

impl Protocol for Multi {
    fn label(&self) -> ModeLabel {
        ModeLabel::Multi
    }

    /// `lock/multi_acquire.lua`: every key set to the token if none is held by another,
    /// one fencing token for all; a refusal names the held name, and a waiting attempt
    /// lists its client on that name's wake list.
    fn acquire(&self, a: &Acquire<'_>) -> Call {
        let mut call = Call::new(Lua::MultiAcquire);
        for keys in &self.names {
            call.key(&keys.lock)
                .key(keys.fence())
                .key(keys.holder_info());
            if a.listing.is_some() {
                call.key(keys.wake_list());
            }
        }
        call.arg(a.token.as_str())
            .arg(ms(a.ttl))
            .arg(flag(a.identify))
            .arg(a.info)
            .arg(ms(a.counter_idle));
        if let Some(l) = a.listing {
            call.arg(l.tag)
                .arg(ms(l.margin))
                .arg(flag(l.stays))
                .arg(flag(l.front))
                .arg(a.waits_on.map_or(0, |at| at + 1));
        }
        call
    }

    /// `lock/multi_release.lua`: every key that holds the token deleted, and one waiter
    /// of each woken.
    fn release(&self, r: &Release<'_>) -> Call {
        let mut call = Call::new(Lua::MultiRelease);
        for keys in &self.names {
            call.key(&keys.lock)
                .key(keys.fence())
                .key(keys.holder_info())
                .key(keys.wake_list());
        }
        call.arg(r.token.as_str())
            .arg(r.fence)
            .arg(ms(r.counter_idle));
        for keys in &self.names {
            call.arg(keys.channel());
        }
        r.undoing(call)
    }

    /// Its waiters wait as a plain lock's do, for the name that refused them.
    fn wake<'a>(&'a self, _token: &'a HolderToken) -> Wake<'a> {
        Wake::Plain
    }

    fn waiting(&self) -> Waiting {
        Waiting {
            queue: None,
            own_channel: true,
            listing: Listed::ByName,
        }
    }

    fn keys_at(&self, at: usize) -> Option<&LockKeys> {
        self.names.get(at)
    }

    /// Never written: a held multi-lock is detached name by name, as plain locks.
    fn to_text(&self) -> String {
        "multi".to_owned()
    }
}
