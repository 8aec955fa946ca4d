//! A leader election's campaign: the leader holds the election's lock key as a plain
//! lock's holder does, and its grant, unlike a plain lock's, announces the new leader
//! to the followers (`election/campaign.lua`, `election/resign.lua`). The term is the
//! grant's fencing token; the leader record (term, when, who) is the lock's holder info,
//! renewed and deleted with the lease.

use crate::engine::protocol::{Acquire, Listed, Protocol, Release, Waiting, Wake};
use crate::observe::ModeLabel;
use crate::scripts::{Call, Lua, flag, ms};
use crate::token::HolderToken;

/// A campaign of a leader election.
#[derive(Debug)]
pub struct Election;

impl Protocol for Election {
    fn label(&self) -> ModeLabel {
        ModeLabel::Election
    }

    /// `election/campaign.lua`: the key set to the token if free, the term minted, the
    /// leader record written and the followers told; a waiting campaign lists its
    /// client on the wake list when refused, as a plain lock's waiter does.
    fn acquire(&self, a: &Acquire<'_>) -> Call {
        let mut call = Call::new(Lua::Campaign);
        call.key(&a.keys.lock)
            .key(a.keys.fence())
            .key(a.keys.holder_info());
        if a.listing.is_some() {
            call.key(a.keys.wake_list());
        }
        call.arg(a.token.as_str())
            .arg(ms(a.ttl))
            .arg(a.info)
            .arg(ms(a.counter_idle))
            .arg(a.keys.leader_channel());
        if let Some(l) = a.listing {
            call.arg(l.tag)
                .arg(ms(l.margin))
                .arg(flag(l.stays))
                .arg(flag(l.front));
        }
        call
    }

    /// `election/resign.lua`: the key deleted if it holds the token, one campaigning
    /// client woken, the followers told.
    fn release(&self, r: &Release<'_>) -> Call {
        let mut call = Call::new(Lua::Resign);
        call.key(&r.keys.lock)
            .key(r.keys.holder_info())
            .key(r.keys.wake_list())
            .arg(r.token.as_str())
            .arg(r.keys.channel())
            .arg(r.keys.leader_channel());
        r.undoing(call)
    }

    /// Campaigners wait as a plain lock's waiters do: a resignation wakes one client by
    /// name.
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

    fn to_text(&self) -> String {
        "election".to_owned()
    }
}
