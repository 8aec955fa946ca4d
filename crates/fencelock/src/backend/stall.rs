//! A connection whose server stopped answering: what is held back until it answers.
//!
//! The driver keeps every request it sent on a connection in that connection's queue
//! until the reply comes, even once the caller stopped waiting (replies are matched to
//! requests by order). A server that stops answering while its connection stays open
//! (stopped with `SIGSTOP`, hung, or behind a link that swallows what is sent) would
//! make that queue grow with every call: a Redlock client with one such node, which it
//! needs no answer from, grew by about 1.7 KB per acquire and release, without bound.
//!
//! So after [`STALLED_AFTER`] calls in a row on a standalone (or Sentinel) node's
//! connection timed out, the node counts as stalled:
//!
//! - **acquires are not sent**: they fail at once with
//!   [`UnavailableReason::Stalled`](crate::UnavailableReason::Stalled), which says that
//!   nothing was written;
//! - **a release or withdrawal is not sent** when the token it undoes was drawn after the
//!   stall began: no acquire of it went to this node, so there is nothing to undo;
//! - **everything else is sent**: releases and withdrawals of tokens that may have been
//!   written before the stall (the server runs them after those acquires when it
//!   resumes), renewals, reads.
//!
//! The driver drops a request that times out while it still waits for room in the
//! connection's 50-request queue (the socket backed up toward a stopped server), though
//! the requests before it were written: a release lost so would leave its grant on the
//! resumed server until the lease ends. So a node keeps the releases that timed out (and
//! those lost with their connection: a restart, a network blip) and sends them again once
//! the server answers (`Node::owe`: at most 1,024 kept, each sent again at most three
//! times, one task at a time), but only a token's last call:
//! a failed attempt's take-back, sent again after the next attempt of the same acquire
//! (one token serves all its attempts), could undo that grant.
//!
//! One `PING`, on a connection of its own without a response timeout, waits for the
//! server to answer again; its answer (or a failure of that connection), any reply on the
//! node's connection, a broken connection (the driver connects anew, with an empty
//! queue) or a Sentinel switch to another master ends the stall. Ending it early is
//! always safe: it only stops holding calls back. The node's connection is never
//! replaced to end a stall: a new connection's requests could run before the old one's,
//! a withdrawal before the acquire it withdraws.
//!
//! What is left to grow while a node stays stalled: the watchdog's renewals (one call per
//! tick, whatever the number of leases) and the releases of leases granted before the
//! stall (one each); the calls that began it and the acquires sent before it stay queued
//! until the server answers or the connection breaks. A Redis Cluster node does not
//! stall (the driver routes its calls to each slot's master itself; a stopped master is
//! failed over by the cluster).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

/// How many calls in a row must time out, with no reply on the connection since, before
/// a node counts as stalled.
pub(crate) const STALLED_AFTER: u32 = 8;

/// The stall state of one connection (see the module).
#[derive(Debug, Default)]
pub(crate) struct Stall {
    /// Calls in a row that timed out, with no reply since.
    unanswered: AtomicU32,
    /// Whether the node is stalled now (read on every call); changed only with `since`
    /// locked, so that `since` is `None` whenever this is false.
    stalled: AtomicBool,
    /// Since when, while stalled: taken after `stalled` was set, so every acquire sent
    /// before the stall began was sent (admitted) before this instant.
    since: Mutex<Option<Instant>>,
}

impl Stall {
    /// Whether the node is stalled now.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }

    /// Whether a call undoing a token drawn at `drawn` may stay unsent: the node has been
    /// stalled since before then, without a break, so no acquire of that token reached it
    /// (strictly before: a token drawn at the same reading of the clock may have been
    /// admitted just before the stall began).
    pub fn holds_nothing_of(&self, drawn: Instant) -> bool {
        self.stalled() && lock(&self.since).is_some_and(|since| since < drawn)
    }

    /// Counts a call that got no answer in time. True when this call began the stall:
    /// the caller then starts asking the server whether it answers again.
    pub fn unanswered(&self) -> bool {
        let n = self.unanswered.fetch_add(1, Ordering::SeqCst) + 1;
        if n < STALLED_AFTER {
            return false;
        }
        let mut since = lock(&self.since);
        if self.stalled.swap(true, Ordering::SeqCst) {
            return false;
        }
        // After the flag: an acquire admitted before it was set was drawn before this.
        *since = Some(Instant::now());
        true
    }

    /// Counts a reply (an error reply too), or a connection that broke or changed:
    /// the stall, if any, is over.
    pub fn answered(&self) {
        if self.unanswered.load(Ordering::Relaxed) != 0 {
            self.unanswered.store(0, Ordering::SeqCst);
        }
        if self.stalled.load(Ordering::SeqCst) {
            let mut since = lock(&self.since);
            self.stalled.store(false, Ordering::SeqCst);
            *since = None;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_stalls_after_enough_timeouts_in_a_row_and_a_reply_ends_it() {
        let s = Stall::default();
        for _ in 1..STALLED_AFTER {
            assert!(!s.unanswered());
        }
        assert!(!s.stalled());
        s.answered(); // a reply: counting starts again
        for _ in 1..STALLED_AFTER {
            assert!(!s.unanswered());
        }
        assert!(!s.stalled());
        assert!(s.unanswered(), "the call that began the stall says so");
        assert!(s.stalled());
        assert!(!s.unanswered(), "only once");
        s.answered();
        assert!(!s.stalled());
    }

    #[test]
    fn only_tokens_drawn_during_the_stall_are_known_not_written() {
        let s = Stall::default();
        let before = Instant::now();
        for _ in 0..STALLED_AFTER {
            s.unanswered();
        }
        let during = next_reading(Instant::now());
        assert!(!s.holds_nothing_of(before), "drawn before: maybe sent");
        assert!(s.holds_nothing_of(during));
        s.answered();
        assert!(!s.holds_nothing_of(during), "not stalled: always sent");
        for _ in 0..STALLED_AFTER {
            s.unanswered();
        }
        assert!(
            !s.holds_nothing_of(during),
            "drawn between two stalls: maybe sent"
        );
    }

    /// The first reading of the monotonic clock after `t`.
    fn next_reading(t: Instant) -> Instant {
        loop {
            let now = Instant::now();
            if now > t {
                return now;
            }
        }
    }

    #[test]
    fn a_token_drawn_at_the_stalls_first_instant_is_maybe_sent() {
        let s = Stall::default();
        for _ in 0..STALLED_AFTER {
            s.unanswered();
        }
        let since = lock(&s.since).expect("stalled");
        assert!(!s.holds_nothing_of(since));
    }
}
