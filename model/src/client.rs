//! The worlds' clients: the library's own acquire engine ([`fencelock::model`]), not a
//! rewrite of it. A client keeps the engine's machine ([`Acquiring`]) in the world's
//! state; the world carries out each [`Command`] it gives (an attempt's or a
//! withdrawal's script call sent to a node, subscriptions, a sleep until a release
//! message or a time) and feeds back what came of it as an [`Event`]. Time is only an
//! input: the model's clock, which the checker advances, read as an [`Instant`].
//!
//! What the model does in the library's place, because it is I/O there: the nodes'
//! connections (a reply becomes the engine's outcome by the library's own decoder and
//! [`judge_one`]; a lost reply is the timeout error a connection reports), and the
//! subscriber (`backend/subscriber.rs`), for one waiter per client: a message wakes the
//! waiter it is meant for ([`Wake`]), a wake by name that finds its client's waiter
//! gone is handed on (`lock/wake.lua`, [`fencelock::model::hand_on`]), and a wake that came before an
//! attempt Redis answered is used up by it.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use fencelock::model::{
    AcquireReply, Acquiring, Command, Event, HolderToken, LockKeys, Outcome, Protocol, Release,
    Request, Retry, SharedProtocol, Undo, Wake, call_parts, decode_acquire, holder_token,
    judge_one,
};

use crate::keyspace::{Bytes, Reply};

/// The lock's name in every world (a multi-lock's first; [`SECOND`] its second).
pub const NAME: &str = "x";
/// A multi-lock's second name.
pub const SECOND: &str = "y";
/// The fencing counter's idle time the library uses by default (7 days).
pub const COUNTER_IDLE: Duration = Duration::from_secs(7 * 24 * 3600);
/// A fair lock's waiter timeout in the worlds ([`Kind::FAIR`]): its waiters call again
/// within a third.
pub const FAIR_TIMEOUT: Duration = Duration::from_millis(3_000);

/// The keys of the lock `name` (no prefix: `{x}`, `{x}:fence`, ...).
pub fn keys(name: &str) -> LockKeys {
    LockKeys::new("", name).expect("a valid name")
}

/// The model's time zero, as the engine reads it: one [`Instant`] for the whole run,
/// so that states that hold machines compare and hash alike.
// An hour on: a Redlock client's estimate of when a node started lies before it.
static EPOCH: LazyLock<Instant> = LazyLock::new(|| Instant::now() + Duration::from_secs(3600));

/// The model's time `ms` (since its start) as an [`Instant`].
pub fn instant(ms: i64) -> Instant {
    *EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// An [`Instant`] the engine gave, as the model's time in ms (rounded up: a sleep ends
/// no earlier than it asked).
pub fn ms(t: Instant) -> i64 {
    let us = t.saturating_duration_since(*EPOCH).as_micros();
    i64::try_from(us.div_ceil(1000)).unwrap_or(i64::MAX)
}

/// What a client takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A plain lock (also a read-write lock's writer).
    Plain,
    /// A fair lock, with this waiter timeout.
    Fair(Duration),
    /// A reentrant lock, owned by the client.
    Reentrant,
    /// A permit of a semaphore of this many permits.
    Semaphore(u32),
    /// A read-write lock's reader.
    Read,
    /// Both names [`NAME`] and [`SECOND`] at once (a multi-lock; client 1 names them
    /// in the opposite order).
    Multi,
    /// A candidate of a leader election (its term: the fencing token).
    Election,
}

impl Kind {
    /// A fair lock with the worlds' waiter timeout, [`FAIR_TIMEOUT`].
    pub const FAIR: Kind = Kind::Fair(FAIR_TIMEOUT);

    /// The library's protocol for client `client`.
    pub fn protocol(self, client: usize) -> SharedProtocol {
        use fencelock::model::{
            Election, Fair, Plain, Read, Reentrant, Semaphore, multi, multi_order,
        };
        match self {
            Kind::Plain => Arc::new(Plain),
            Kind::Fair(timeout) => Arc::new(Fair::new(timeout)),
            Kind::Reentrant => Arc::new(Reentrant::new(format!("owner{client}"))),
            Kind::Semaphore(permits) => Arc::new(Semaphore::new(permits, None)),
            Kind::Read => Arc::new(Read::new(String::new())),
            Kind::Multi => {
                // Client 0 asks for x and y, client 1 for y and x: the library sorts
                // them into one global order before it acquires.
                let mut names = vec![NAME.to_owned(), SECOND.to_owned()];
                if client % 2 == 1 {
                    names.reverse();
                }
                let sorted = multi_order(&names).expect("valid names");
                Arc::new(multi(sorted.into_iter().map(|(_, keys)| keys).collect()))
            }
            Kind::Election => Arc::new(Election),
        }
    }

    /// Whether its holders share the lock (readers).
    pub fn shares(self) -> bool {
        self == Kind::Read
    }
}

/// A client's tag: its own release channel is the lock's channel, `:`, the tag.
pub fn tag(client: usize) -> String {
    format!("c{client}")
}

/// The holder token of client `client`'s acquire number `round` (the library draws 32
/// hex digits; any text does for the scripts, and this one reads in a trace).
pub fn token(client: usize, round: u8) -> HolderToken {
    holder_token(format!("c{client}r{round}"))
}

/// A new acquire by `client` of its `round`, asked for at `now_ms`: it waits for ever,
/// with the library's default retry schedule and a fixed seed for its jitter. Its lease
/// is not renewed.
pub fn acquire(
    kind: Kind,
    client: usize,
    round: u8,
    lease: Duration,
    now_ms: i64,
) -> Acquiring<'static> {
    acquire_with(kind, client, round, lease, now_ms, false)
}

/// As [`acquire`]; `renew`: the holder's lease will be renewed by the watchdog
/// ([`crate::watchdog`]), so a fair handover's shorter lease is taken too (the
/// watchdog renews it to the lease asked for).
pub fn acquire_with(
    kind: Kind,
    client: usize,
    round: u8,
    lease: Duration,
    now_ms: i64,
    renew: bool,
) -> Acquiring<'static> {
    let request = Request {
        name: NAME,
        keys: keys(NAME),
        protocol: kind.protocol(client),
        ttl: lease,
        wait: None,
        retry: Retry::default(),
        info: "",
        replicas: 0,
        // Without a watchdog, a handover's lease is taken only if it is whole.
        renew,
    };
    Acquiring::new(
        request,
        token(client, round),
        client as u64,
        instant(now_ms),
    )
}

/// A script call as the world sends it: the script's name in the library's registry
/// (whose text the node runs: the shipped one, or a control's mutation), its keys and
/// arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Call {
    /// The script (`lock/acquire.lua`, ...).
    pub script: &'static str,
    /// KEYS.
    pub keys: Vec<Bytes>,
    /// ARGV.
    pub argv: Vec<Bytes>,
}

impl Call {
    /// The parts of a call the library built.
    pub fn of(call: &fencelock::model::Call) -> Call {
        let parts = call_parts(call);
        Call {
            script: parts.file,
            keys: parts.keys.iter().map(|k| k.to_vec()).collect(),
            argv: parts.args.iter().map(|a| a.to_vec()).collect(),
        }
    }
}

/// The call that gives back what `token` holds or may hold (`undo`), as the library
/// builds it (a held lock's release, an acquire's withdrawal, a late grant's take-back).
/// `fence`: a Redlock release's grant token, raised into each node's counter (0: one
/// node, or a withdrawal).
pub fn release(protocol: &dyn Protocol, token: &HolderToken, undo: Undo, fence: u64) -> Call {
    let keys = keys(NAME);
    let release = Release {
        keys: &keys,
        token,
        fence,
        counter_idle: COUNTER_IDLE,
        undo,
    };
    Call::of(&match undo {
        Undo::Release => protocol.release(&release),
        _ => protocol.withdraw(&release),
    })
}

/// A reply of the keyspace as the driver's connection reads it.
pub fn value(reply: &Reply) -> redis::Value {
    match reply {
        Reply::Status(s) => redis::Value::SimpleString(s.clone()),
        Reply::Error(e) => redis::Value::SimpleString(format!("-{e}")),
        Reply::Int(i) => redis::Value::Int(*i),
        Reply::Bulk(Some(b)) => redis::Value::BulkString(b.clone()),
        Reply::Bulk(None) | Reply::Array(None) => redis::Value::Nil,
        Reply::Array(Some(items)) => redis::Value::Array(items.iter().map(value).collect()),
    }
}

/// An acquire script's reply decoded, or the error the driver reports.
pub fn decode(reply: &Reply) -> Result<AcquireReply, fencelock::Error> {
    if let Reply::Error(e) = reply {
        return Err(fencelock::model::rejected("model:0", e));
    }
    decode_acquire(value(reply))
        .map_err(|e| fencelock::model::rejected("model:0", &format!("ERR unreadable reply: {e}")))
}

/// The event an attempt's reply makes (the library's decoder and [`judge_one`]), and
/// whether the grant came too late and is taken back.
pub fn answered(reply: &Reply, sent_ms: i64, lease: Duration, now_ms: i64) -> (Event, bool) {
    let (outcome, take_back) = judge_one(
        || "model:0".into(),
        decode(reply),
        instant(sent_ms),
        lease,
        instant(now_ms),
    );
    (Event::Answered(outcome), take_back)
}

/// The event of an attempt whose reply was lost: the connection's timeout.
pub fn lost() -> Event {
    Event::Answered(Err(fencelock::model::timed_out("model:0")))
}

/// Whether an outcome is a grant (for the world's record of grants).
pub fn granted(event: &Event) -> bool {
    matches!(event, Event::Answered(Ok(Outcome::Granted { .. })))
}

/// Which messages wake a waiter of `protocol` holding `token`: how a payload on one of
/// its channels is read (see `backend/subscriber.rs`'s `deliver`). Returns whether it
/// wakes it, and the handover it carries.
pub fn wakes(
    protocol: &dyn Protocol,
    token: &HolderToken,
    payload: &[u8],
) -> (bool, Option<fencelock::model::Handover>) {
    if payload.is_empty() {
        return (true, None);
    }
    let (named, handover) = match fencelock::model::Handover::parse(payload) {
        Some((named, handover)) => (named, Some(handover)),
        None => (payload, None),
    };
    match protocol.wake(token) {
        Wake::Turn(mine) if mine.as_bytes() == named => (true, handover),
        _ => (false, None),
    }
}

/// Whether a command is the acquire's end.
pub fn is_done(command: &Command) -> bool {
    matches!(command, Command::Done(_))
}
