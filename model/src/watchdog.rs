//! The worlds' watchdog: a holder that asked for renewals keeps its lease as the
//! library's watchdog sees it ([`Watched`], a value in the world's state) and runs the
//! library's own decisions on it: when it is lost or due ([`Watched::look`], on the
//! library's [`tick`]), the renewal's call (`renew.lua` for the one lease, as the
//! backend builds it: [`fencelock::model::renew`]), what the node's answer came to
//! ([`decode_renewed`], [`Quorum::renewal`]) and what that does to the lease
//! ([`Watched::answered`]).
//!
//! What the model does in the library's place: the watchdog's task, which sleeps until
//! its next wake (the next tick, or the lease's own renewal or loss deadline: the task's
//! `plan`). Its wake is a timer, as a sleeper's: the clock may stop there ([`Watch::due_ms`]),
//! or run past it (the client paused, its renewal stalled). A wake at which the lease
//! needs nothing (a tick with the renewal not due) changes nothing but the next wake, so
//! the model skips it: [`Watch::due_ms`] is the first wake at which the library's task
//! would act, found by running [`Watched::look`] along its wakes. The renewal is sent as
//! the task decides it (the library spawns its batch at once), and a lease found gone
//! early is reported deleted (the library asks the node for its fencing counter first,
//! to tell a break from a deletion: a cause the worlds' properties do not read).

use std::time::{Duration, Instant};

use fencelock::LossCause;
use fencelock::model::{
    Answered, Grant, Look, Quorum, Renewal, Terms, Watched, decode_renewed, renew, tick,
};

use crate::client::{self, Call};
use crate::keyspace::Reply;

/// A holder's watchdog.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Watch {
    /// The lease, as the library's watchdog sees it.
    pub watched: Watched,
    /// When the library's task wakes next (its `plan`'s wake).
    pub wake: Instant,
    /// The renewal in flight: when it was sent (true ms), the TTL it asks for and
    /// whether that was shortened to end at the maximum hold.
    pub renewing: Option<(i64, Duration, bool)>,
    /// The loss signal fired, and why: the holder stops.
    pub lost: Option<LossCause>,
}

/// What the task did at a wake ([`Watch::act`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acted {
    /// The lease is lost.
    Lost,
    /// This renewal goes to the node.
    Renew(Call),
}

impl Watch {
    /// The watchdog of a lease of `ttl` (fencing token `fence`, one holder at a time)
    /// from its `grant`, renewed to `ttl`, without a maximum hold, watched from `now_ms`
    /// (the task's first look is at once).
    pub fn new(ttl: Duration, fence: u64, grant: &Grant, now_ms: i64) -> Watch {
        let terms = Terms {
            ttl,
            renew: true,
            hold_until: None,
            fence: Some(fence),
        };
        Watch {
            watched: Watched::new(terms, grant, false),
            wake: client::instant(now_ms),
            renewing: None,
            lost: None,
        }
    }

    fn tick(&self) -> Duration {
        tick([self.watched.terms()])
    }

    /// The first of the task's wakes at which it acts on the lease (true ms; `None`
    /// once lost): its wakes, each at the next tick or the lease's own time, whichever
    /// comes first, until one finds the lease lost or due.
    pub fn due_ms(&self) -> Option<i64> {
        if self.lost.is_some() {
            return None;
        }
        let tick = self.tick();
        let mut at = self.wake;
        loop {
            // A look that finds nothing due changes nothing: a copy will do.
            let mut copy = self.watched;
            match copy.look(at, tick) {
                Look::Wait(next) => at = next.min(at + tick),
                Look::Lost(_) | Look::Renew { .. } => return Some(client::ms(at)),
            }
        }
    }

    /// The task's look at `now_ms` (at or after [`Watch::due_ms`]: a paused client's
    /// task looks late): the lease lost, or its renewal to send, holder `holder` on the
    /// lock `key`; and when the task wakes next.
    pub fn act(&mut self, key: &str, holder: &str, now_ms: i64) -> Option<Acted> {
        let now = client::instant(now_ms);
        let tick = self.tick();
        let look = self.watched.look(now, tick);
        self.wake = now + tick;
        match look {
            Look::Lost(cause) => {
                self.lost = Some(cause);
                Some(Acted::Lost)
            }
            Look::Renew { ttl, capped, wake } => {
                self.wake = self.wake.min(wake);
                self.renewing = Some((now_ms, ttl, capped));
                let call = renew(std::iter::once((key, holder, ttl)));
                Some(Acted::Renew(Call::of(&call)))
            }
            Look::Wait(wake) => {
                self.wake = self.wake.min(wake);
                None
            }
        }
    }

    /// The node's `reply` to the renewal in flight comes at `now_ms` (`None`: it was
    /// lost, and the connection's timeout says nothing of the lease), decided as the
    /// backend decides a renewal of one node, and applied to the lease.
    pub fn answered(&mut self, reply: Option<&Reply>, now_ms: i64) {
        let Some((sent_ms, ttl, capped)) = self.renewing.take() else {
            return;
        };
        // The node's connection reads the batch's reply: one answer per lease, or none.
        let owned = reply
            .and_then(|r| decode_renewed(client::value(r)).ok())
            .and_then(|renewed| match renewed.0.as_slice() {
                [owned] => Some(*owned),
                _ => None,
            });
        let one = Quorum::single(Duration::from_secs(1));
        let nodes: [crate::redlock::Node; 0] = [];
        let (sent, now) = (client::instant(sent_ms), client::instant(now_ms));
        let renewal: Renewal = one.renewal(&nodes, [owned], sent, ttl, now);
        match self.watched.answered(ttl, capped, renewal, sent, now) {
            Answered::Kept => {}
            Answered::Lost(cause) => self.lost = self.lost.or(Some(cause)),
            Answered::GoneEarly => {
                let cause = self.watched.terms().why_gone(None);
                self.lost = self.lost.or(Some(cause));
            }
        }
    }

    /// The end of the lease by the holder's own count (true ms, as a grant's: the
    /// last ms before its `valid_until`), or `now_ms` once the loss signal fired.
    pub fn until_ms(&self, now_ms: i64) -> i64 {
        match self.lost {
            Some(_) => now_ms.min(client::ms(self.watched.valid_until()) - 1),
            None => client::ms(self.watched.valid_until()) - 1,
        }
    }

    /// Its state, readably: the lease's end by the holder's clock, the renewal in
    /// flight, the loss.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "lease valid until +{} ms",
            client::ms(self.watched.valid_until())
        );
        if let Some((sent, ttl, _)) = self.renewing {
            out += &format!(", renewal to {} ms sent at +{sent} ms", ttl.as_millis());
        }
        match (self.lost, self.due_ms()) {
            (Some(cause), _) => out += &format!(", LOST ({cause:?})"),
            (None, Some(due)) => out += &format!(", acts next at +{due} ms"),
            (None, None) => {}
        }
        out
    }
}
