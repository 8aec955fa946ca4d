//! A plain lock: any caller may take a free lock (`lock/acquire.lua`,
//! `lock/release.lua`). Its waiters are woken one client at a time, by name, through the
//! lock's wake list. It is also a read-write lock's writer.

use std::time::Duration;

use crate::engine::protocol::{Acquire, Listed, Protocol, Release, Undo, Waiting, Wake};
use crate::error::Blocker;
use crate::observe::ModeLabel;
use crate::scripts::{Call, Lua, flag, ms};
use crate::token::HolderToken;

/// A plain lock.
#[derive(Debug)]
pub struct Plain;

impl Protocol for Plain {
    fn label(&self) -> ModeLabel {
        ModeLabel::Plain
    }

    /// `lock/acquire.lua`: the key set to the token if free; a waiting attempt lists the
    /// client on the wake list when refused, and waits among a read-write lock's writers
    /// when readers hold it. The common case, an attempt on one node with no holder info,
    /// not listed and never queued among writers, calls `lock/take.lua` instead, which
    /// costs Redis less.
    fn acquire(&self, a: &Acquire<'_>) -> Call {
        if !a.identify && a.info.is_empty() && a.listing.is_none() && !a.queued {
            let mut call = Call::new(Lua::Take);
            call.key(&a.keys.lock).key(a.keys.fence());
            if a.join {
                call.key(a.keys.writers());
            }
            call.arg(a.token.as_str())
                .arg(ms(a.ttl))
                .arg(ms(a.counter_idle));
            return call;
        }
        let mut call = Call::new(Lua::Acquire);
        call.key(&a.keys.lock)
            .key(a.keys.fence())
            .key(a.keys.holder_info())
            .key(a.keys.writers());
        if a.listing.is_some() {
            call.key(a.keys.wake_list());
        }
        call.arg(a.token.as_str())
            .arg(ms(a.ttl))
            .arg(flag(a.identify))
            .arg(a.info)
            .arg(ms(a.counter_idle))
            .arg(flag(a.join))
            .arg(flag(a.queued));
        if let Some(l) = a.listing {
            call.arg(l.tag)
                .arg(ms(l.margin))
                .arg(flag(l.stays))
                .arg(flag(l.front));
        }
        call
    }

    /// `lock/release.lua`: the key deleted if it holds the token, one listed client
    /// woken; a withdrawal also leaves the writers waiting for readers.
    fn release(&self, r: &Release<'_>) -> Call {
        let withdraw = r.undo != Undo::Release;
        let mut call = Call::new(Lua::Release);
        call.key(&r.keys.lock)
            .key(r.keys.fence())
            .key(r.keys.holder_info())
            .key(r.keys.wake_list());
        if withdraw {
            call.key(r.keys.writers());
        }
        call.arg(r.token.as_str()).arg(r.keys.channel());
        // On one node there is no token to raise the counter to.
        if r.fence > 0 {
            call.arg(r.fence).arg(ms(r.counter_idle));
        }
        r.undoing(call)
    }

    fn wake<'a>(&'a self, _token: &'a HolderToken) -> Wake<'a> {
        Wake::Plain
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
            own_channel: true,
            listing: Listed::ByName,
        }
    }

    fn to_text(&self) -> String {
        "plain".to_owned()
    }
}
