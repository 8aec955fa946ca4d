//! A scripted fake of [`Nodes`] for the driver's tests under paused time: each attempt
//! gets the next answer of a script (after a delay of its own, or never), and everything
//! the driver sends is logged, the attempts as the calls their protocol built. Release
//! messages are delivered by [`FakeNodes::publish`] to the fake's own listeners, woken as
//! the client's subscriber wakes its waiters (one plain waiter per message, every
//! reentrant one, the fair waiter a message names, with its handover).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::acquire::{Handover, Request};
use super::nodes::{Listener, Nodes};
use super::protocol::{Protocol, Undo, Wake};
use super::{Grant, Outcome, Refusal};
use crate::error::{Blocker, Error, UnavailableReason};
use crate::keys::LockKeys;
use crate::scripts::{Call, Flavor, Lua};
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

/// What the driver sent, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// An attempt: its holder token, and how its call lists the client (a plain lock's
    /// `acquire.lua` call; `None` for other scripts).
    Attempt {
        token: String,
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

/// What an attempt's listing said (`acquire.lua`'s ARGV[10] and ARGV[11]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ListingSent {
    pub stays: bool,
    pub front: bool,
}

/// The fake: a script of answers, a log, one node.
pub(crate) struct FakeNodes {
    answers: Mutex<VecDeque<Scripted>>,
    replicas: Mutex<VecDeque<Result<(u32, Duration), Error>>>,
    sent: Mutex<Vec<(Instant, Sent)>>,
    /// Every listener registered, in arrival order (gone once dropped).
    listeners: Mutex<Vec<Weak<Registered>>>,
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
            listeners: Mutex::new(Vec::new()),
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

    /// A release message on `channel`, as the server would publish it: an empty payload
    /// wakes one plain waiter (the longest-waiting one that answered its earlier wakes,
    /// else the longest-waiting), every reentrant waiter and every fair waiter; a token
    /// (or a handover to it, `G TOKEN FENCE PX`) wakes the fair waiter of that token.
    pub fn publish(&self, channel: &str, payload: &[u8]) {
        let on_channel: Vec<Arc<Registered>> = self
            .live()
            .into_iter()
            .filter(|r| r.channel == channel)
            .collect();
        if !payload.is_empty() {
            let (token, handover) = match Handover::parse(payload) {
                Some((token, handover)) => (token, Some(handover)),
                None => (payload, None),
            };
            for r in &on_channel {
                if matches!(&r.kind, Kind::Turn(t) if t.as_bytes() == token) {
                    r.state.lock().unwrap().handover = handover;
                    r.wake();
                }
            }
            return;
        }
        for r in on_channel.iter().filter(|r| r.kind != Kind::Plain) {
            r.wake();
        }
        let plain: Vec<&Arc<Registered>> = on_channel
            .iter()
            .filter(|r| r.kind == Kind::Plain)
            .collect();
        let idle = plain.iter().find(|r| {
            let st = r.state.lock().unwrap();
            st.wakes == st.settled
        });
        if let Some(r) = idle.or(plain.first()) {
            r.wake();
        }
    }

    fn live(&self) -> Vec<Arc<Registered>> {
        let mut listeners = self.listeners.lock().unwrap();
        listeners.retain(|l| l.strong_count() > 0);
        listeners.iter().filter_map(Weak::upgrade).collect()
    }

    fn log(&self, sent: Sent) {
        self.sent.lock().unwrap().push((Instant::now(), sent));
    }
}

/// What the call's arguments say, for the log: its token (`ARGV[1]` of a plain or fair
/// acquire), and a plain acquire's listing.
fn attempt_sent(call: &Call) -> Sent {
    let words: Vec<String> = call
        .evalsha(Flavor::STANDALONE)
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => String::new(),
        })
        .collect();
    // EVALSHA, the hash, the key count, the keys, then ARGV.
    let keys: usize = words[2].parse().unwrap();
    let argv = &words[3 + keys..];
    let listing = (call.lua() == Lua::Acquire && argv.len() >= 11).then(|| ListingSent {
        stays: argv[9] == "1",
        front: argv[10] == "1",
    });
    Sent::Attempt {
        token: argv[0].clone(),
        listing,
    }
}

impl Nodes for FakeNodes {
    type Listener = FakeListener;
    type Session = ();

    fn attempt(
        &self,
        _req: &Request<'_>,
        _token: &HolderToken,
        call: &Arc<Call>,
        _identified: Option<&Arc<Call>>,
        _session: &mut (),
    ) -> impl Future<Output = Result<Outcome, Error>> + Send {
        self.log(attempt_sent(call));
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

    fn withdraw(
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

    fn withdraw_in_background(
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
        _id: u64,
        wake: Wake<'_>,
    ) -> impl Future<Output = Vec<FakeListener>> + Send {
        self.log(Sent::Subscribe {
            channel: channel.to_owned(),
        });
        let mut subscribed = Vec::new();
        if self.subscribes {
            let registered = Arc::new(Registered {
                channel: channel.to_owned(),
                kind: match wake {
                    Wake::Plain => Kind::Plain,
                    Wake::Owner => Kind::Owner,
                    Wake::Turn(token) => Kind::Turn(token.to_owned()),
                },
                notify: Notify::new(),
                state: Mutex::new(State::default()),
            });
            self.listeners
                .lock()
                .unwrap()
                .push(Arc::downgrade(&registered));
            subscribed.push(FakeListener(registered));
        }
        std::future::ready(subscribed)
    }

    fn subscribed_everywhere(&self, channel: &str) -> bool {
        self.live().iter().any(|r| r.channel == channel)
    }

    fn own_channel(&self, keys: &LockKeys) -> String {
        keys.own_channel(self.client_tag())
    }

    fn client_tag(&self) -> &str {
        "00000000000000aa"
    }

    fn counter_idle(&self) -> Duration {
        Duration::ZERO
    }

    fn plain_waiters(&self, channel: &str) -> usize {
        self.live()
            .iter()
            .filter(|r| r.channel == channel && r.kind == Kind::Plain)
            .count()
    }

    fn node_count(&self) -> usize {
        1
    }
}

/// How a fake listener is woken.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Plain,
    Owner,
    Turn(String),
}

/// One registration of the fake.
struct Registered {
    channel: String,
    kind: Kind,
    notify: Notify,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    wakes: u64,
    settled: u64,
    handover: Option<Handover>,
}

impl Registered {
    fn wake(&self) {
        self.state.lock().unwrap().wakes += 1;
        self.notify.notify_one();
    }
}

/// The fake's [`Listener`].
pub(crate) struct FakeListener(Arc<Registered>);

impl Listener for FakeListener {
    async fn notified(&self) {
        self.0.notify.notified().await;
    }

    fn wake_mark(&self) -> u64 {
        self.0.state.lock().unwrap().wakes
    }

    fn settle(&self, mark: u64) {
        let mut st = self.0.state.lock().unwrap();
        st.settled = st.settled.max(mark);
    }

    fn handover(&self) -> Option<Handover> {
        self.0.state.lock().unwrap().handover.take()
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
        held_as_other: false,
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
