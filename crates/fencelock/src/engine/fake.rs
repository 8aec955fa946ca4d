//! A scripted fake of [`Nodes`] for the engine's tests under paused time: each attempt
//! gets the next answer of a script (after a delay of its own, or never), and everything
//! the engine sends is logged. Release notifications go through the real subscriber's
//! logic, without a connection ([`Subscriber::offline`]).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::nodes::Nodes;
use super::protocol::{Protocol, Wake};
use super::{Grant, Outcome, Refusal};
use crate::backend::subscriber::{Subscriber, Subscription};
use crate::backend::{AcquireRequest, Undo};
use crate::error::{Blocker, Error, UnavailableReason};
use crate::keys::LockKeys;
use crate::scripts::Listing;
use crate::token::{FencingToken, HolderToken};

/// The next answer of an attempt.
pub(crate) enum Scripted {
    /// Answered at once.
    Now(Result<Outcome, Error>),
    /// Answered after this long.
    After(Duration, Result<Outcome, Error>),
    /// Never answered (a reply lost: the attempt hangs until dropped).
    Never,
}

/// What the engine sent, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// An attempt, with what it said.
    Attempt {
        token: String,
        join: bool,
        queued: bool,
        listing: Option<ListingSent>,
    },
    /// A withdrawal (in the foreground).
    Abandon { token: String, undo: Undo },
    /// A withdrawal left to the background (the acquire was dropped, or its own failed).
    AbandonInBackground { token: String },
    /// The client taken off the wake list in the background.
    Unlist,
    /// A subscription.
    Subscribe { channel: String },
    /// A wait for replicas.
    WaitReplicas { replicas: u32 },
}

/// What an attempt's listing said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ListingSent {
    pub stays: bool,
    pub front: bool,
}

impl From<Listing<'_>> for ListingSent {
    fn from(l: Listing<'_>) -> Self {
        Self {
            stays: l.stays,
            front: l.front,
        }
    }
}

/// The fake: a script of answers, a log, one node (or `nodes` that answer alike).
pub(crate) struct FakeNodes {
    answers: Mutex<VecDeque<Scripted>>,
    replicas: Mutex<VecDeque<Result<(u32, Duration), Error>>>,
    sent: Mutex<Vec<(Instant, Sent)>>,
    subscriber: Subscriber,
    /// Whether subscriptions are confirmed (a node whose pub/sub is down: none).
    subscribes: bool,
    /// Whether foreground withdrawals fail (the node went away).
    withdrawals_fail: bool,
}

impl FakeNodes {
    /// A fake that answers attempts with `answers`, in order (and panics past them).
    pub fn new(answers: impl IntoIterator<Item = Scripted>) -> Self {
        Self {
            answers: Mutex::new(answers.into_iter().collect()),
            replicas: Mutex::new(VecDeque::new()),
            sent: Mutex::new(Vec::new()),
            subscriber: Subscriber::offline(),
            subscribes: true,
            withdrawals_fail: false,
        }
    }

    /// Foreground withdrawals fail as an unreachable node's do.
    pub fn failing_withdrawals(mut self) -> Self {
        self.withdrawals_fail = true;
        self
    }

    /// Subscriptions fail (pub/sub down): waiters rely on their timers.
    pub fn without_pub_sub(mut self) -> Self {
        self.subscribes = false;
        self
    }

    /// What `WAIT` answers, in order.
    pub fn replicas(
        self,
        answers: impl IntoIterator<Item = Result<(u32, Duration), Error>>,
    ) -> Self {
        *self.replicas.lock().unwrap() = answers.into_iter().collect();
        self
    }

    /// Everything sent so far.
    pub fn sent(&self) -> Vec<Sent> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// When each attempt went out.
    pub fn attempt_times(&self) -> Vec<Instant> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| matches!(s, Sent::Attempt { .. }))
            .map(|(t, _)| *t)
            .collect()
    }

    /// How many attempts went out.
    pub fn attempts(&self) -> usize {
        self.attempt_times().len()
    }

    /// A release message on `channel`, as the server would publish it.
    pub fn publish(&self, channel: &str, payload: &[u8]) {
        self.subscriber.deliver(channel, payload);
    }

    fn log(&self, sent: Sent) {
        self.sent.lock().unwrap().push((Instant::now(), sent));
    }
}

impl Nodes for FakeNodes {
    fn acquire(
        &self,
        req: &AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Outcome, Error>> + Send {
        self.log(Sent::Attempt {
            token: req.token.as_str().to_owned(),
            join: req.join,
            queued: req.queued,
            listing: req.listing.map(ListingSent::from),
        });
        let next = self
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .expect("the test scripted an answer for every attempt");
        async move {
            match next {
                Scripted::Now(answer) => answer,
                Scripted::After(delay, answer) => {
                    tokio::time::sleep(delay).await;
                    answer
                }
                Scripted::Never => std::future::pending().await,
            }
        }
    }

    fn abandon(
        &self,
        _keys: &LockKeys,
        token: &HolderToken,
        _protocol: &dyn Protocol,
        _ttl: Duration,
        undo: Undo,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        self.log(Sent::Abandon {
            token: token.as_str().to_owned(),
            undo,
        });
        std::future::ready(match self.withdrawals_fail {
            true => unavailable(UnavailableReason::TimedOut).map(|_| ()),
            false => Ok(()),
        })
    }

    fn abandon_in_background(
        &self,
        _keys: &LockKeys,
        token: &HolderToken,
        _protocol: &Arc<dyn Protocol>,
        _ttl: Duration,
    ) {
        self.log(Sent::AbandonInBackground {
            token: token.as_str().to_owned(),
        });
    }

    fn unlist_in_background(&self, _keys: &LockKeys) {
        self.log(Sent::Unlist);
    }

    fn wait_replicas(
        &self,
        _key: &str,
        replicas: u32,
        _within: Duration,
    ) -> impl Future<Output = Result<(u32, Duration), Error>> + Send {
        self.log(Sent::WaitReplicas { replicas });
        let answer = self
            .replicas
            .lock()
            .unwrap()
            .pop_front()
            .expect("the test scripted what WAIT answers");
        std::future::ready(answer)
    }

    fn subscribe(
        &self,
        channel: &str,
        id: u64,
        wake: Wake<'_>,
    ) -> impl Future<Output = Vec<Subscription>> + Send {
        self.log(Sent::Subscribe {
            channel: channel.to_owned(),
        });
        let subscribed: Vec<Subscription> = if self.subscribes {
            vec![self.subscriber.register(channel, id, wake)]
        } else {
            Vec::new()
        };
        std::future::ready(subscribed)
    }

    fn subscribed_everywhere(&self, channel: &str) -> bool {
        self.subscriber.is_subscribed(channel)
    }

    fn own_channel(&self, keys: &LockKeys) -> String {
        keys.own_channel(self.client_tag())
    }

    fn client_tag(&self) -> &str {
        "00000000000000aa"
    }

    fn plain_waiters(&self, channel: &str) -> usize {
        self.subscriber.plain_waiters(channel)
    }

    fn node_count(&self) -> usize {
        1
    }
}

/// A grant with `fence`, valid for `ttl` from now.
pub(crate) fn granted(fence: u64, ttl: Duration) -> Result<Outcome, Error> {
    let now = Instant::now().into_std();
    Ok(Outcome::Granted {
        grant: Grant {
            fence: FencingToken::new(fence),
            sent_at: now,
            ttl,
            valid_until: now + ttl,
        },
        owner_hold: false,
    })
}

/// Held by another owner for `left`.
pub(crate) fn held(left: Duration) -> Result<Outcome, Error> {
    held_by(Blocker::Lease(left), None)
}

/// Held by `blocked_by`; `fence_seen`: the counter a fair refusal reports.
pub(crate) fn held_by(blocked_by: Blocker, fence_seen: Option<u64>) -> Result<Outcome, Error> {
    Ok(Outcome::Held {
        refusal: Refusal {
            fence_seen: fence_seen.map(FencingToken::new),
            ..Refusal::by(blocked_by)
        },
        nodes: Vec::new(),
    })
}

/// The node did not answer in time (or, `reason`, otherwise could not be asked).
pub(crate) fn unavailable(reason: UnavailableReason) -> Result<Outcome, Error> {
    Err(Error::Unavailable {
        node: "fake:1".to_owned(),
        reason,
        detail: String::new(),
        source: None,
    })
}

/// A Redlock quorum missed: two of five nodes granted (and took it back), three timed
/// out, so their take-back may not have been heard.
pub(crate) fn no_quorum_with_nodes_timed_out() -> Result<Outcome, Error> {
    use crate::error::{NodeOutcome, NodeReport};
    let report = |i: usize, outcome| NodeReport {
        node: format!("fake:{i}"),
        outcome,
    };
    let timed_out = NodeOutcome::Unavailable(UnavailableReason::TimedOut);
    Err(Error::NoQuorum {
        name: "stock".to_owned(),
        needed: 3,
        granted: 2,
        nodes: vec![
            report(1, timed_out.clone()),
            report(2, timed_out.clone()),
            report(3, timed_out),
            report(4, NodeOutcome::Granted),
            report(5, NodeOutcome::Granted),
        ],
    })
}
