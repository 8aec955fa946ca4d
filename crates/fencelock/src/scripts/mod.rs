//! The Lua scripts, and the calls of those that are not a primitive's (the primitives'
//! calls are built by their protocols, `src/protocols/`).
//!
//! Each script is a file whose header states KEYS, ARGV and every reply: `lock/` holds
//! the lock's scripts (a plain lock is also a read-write lock's writer), `semaphore/` the
//! semaphore's, `rwlock/` a read-write lock's readers', `election/` a leader election's,
//! `queue/` the delay queue's. The
//! functions several scripts share are fragments in `fragments/`, put in front of a
//! script when it is loaded, as [`Lua::parts`] lists: that table says which fragments
//! a script gets. A script with a fast path lists some of them after a `LATER` mark:
//! those go in at its `-- (later fragments)` line instead, so that its common case runs
//! before the functions only its other paths use are defined. Every script refuses a
//! key that holds data fencelock did not write the same way (`types.lua`'s error reply, decoded in one place, [`replies::wrong_type`]).
//!
//! Scripts come in [`Flavor`]s, composed from the same files for what the server they
//! go to offers (learned once per connection, `backend/capabilities.rs`): a standalone
//! node (also a Sentinel-managed master and a Redlock node) announces releases with
//! classic `PUBLISH` (`fragments/publish.lua`); a Redis Cluster with sharded pub/sub
//! announces them with `SPUBLISH` (`fragments/spublish.lua` in its place), one without
//! it (Redis 6.2) with classic `PUBLISH`, and a cluster's scripts add
//! `renew_across_slots.lua`, the watchdog's batch over every slot of one cluster node. A
//! server that cannot read a script's `#!lua` line (Redis 6.2) gets the script without
//! it. The node a call goes to picks the flavor ([`Call::evalsha`]).
//!
//! A call is sent as `EVALSHA`; the node loads the script with its first call on each
//! connection, and again when the server answers `NOSCRIPT` (after a restart or
//! `SCRIPT FLUSH`): with `SCRIPT LOAD`, or with `EVAL` where the server refuses
//! `SCRIPT LOAD` (renamed away, as some managed services do, or refused by the user's
//! ACL).
//! [`lua_scripts`] gives the composed sources, as sent, for review and for the tests that
//! run them by hand.

pub(crate) mod replies;

use std::borrow::Cow;
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use redis::RedisWrite;

use crate::keys::{LockKeys, QueueKeys};
use crate::token::{FencingToken, HolderToken};

/// A Lua file shared by several scripts: functions only.
#[derive(Clone, Copy)]
struct Fragment(&'static str);

/// `server_us()`, `server_ms()`, `server_ms_us()`.
const CLOCK: Fragment = Fragment(include_str!("fragments/clock.lua"));
/// `wrong_type()`, `check_types()`.
const TYPES: Fragment = Fragment(include_str!("fragments/types.lua"));
/// `lock_holder()`, `holder_of()`.
const HOLDER: Fragment = Fragment(include_str!("fragments/holder.lua"));
/// `read_counter()`, `store_counter()`, `next_fence()`; needs [`CLOCK`].
const FENCE: Fragment = Fragment(include_str!("fragments/fence.lua"));
/// `purge_waiters()`, `overdue()`, `purge_overdue()`.
const FAIR_QUEUE: Fragment = Fragment(include_str!("fragments/fair_queue.lua"));
/// `readers_held()`, `writer_waits()`, `writer_meets_readers()`, `writer_gone()`; needs
/// [`TYPES`], [`HOLDER`] and [`CLOCK`].
const READERS: Fragment = Fragment(include_str!("fragments/readers.lua"));
/// `renew_lease()`; needs [`HOLDER`] and [`CLOCK`].
const LEASE: Fragment = Fragment(include_str!("fragments/lease.lua"));
/// `list_waiter()`; needs [`CLOCK`].
const WAITING: Fragment = Fragment(include_str!("fragments/waiting.lua"));
/// `wake_next()`; needs [`CLOCK`] and [`PUBLISH`].
const WAKES: Fragment = Fragment(include_str!("fragments/wakes.lua"));
/// `announce()` with classic `PUBLISH`; a cluster's scripts get [`SHARDED_PUBLISH`] in
/// its place.
const PUBLISH: Fragment = Fragment(include_str!("fragments/publish.lua"));
/// `announce()` with sharded `SPUBLISH`, for a Redis Cluster.
const SHARDED_PUBLISH: Fragment = Fragment(include_str!("fragments/spublish.lua"));
/// Not a file: in a script's list, the fragments after it (up to the next `LATER`) go
/// in at the script's next [`LATER_MARK`] line instead of in front. What comes before
/// that line is a fast path, which then runs without defining the functions only the
/// later paths use: every definition makes a closure on every call. A script whose list
/// starts with `LATER` defines none before its fast path: an uncontended plain, fair or
/// read lock defines none (docs/benchmarks.md has the count of Redis's instructions).
const LATER: Fragment = Fragment("");
/// The line of a script at which the next group of fragments after a [`LATER`] goes in
/// (a whole line, trailing `\r` or spaces allowed).
const LATER_MARK: &str = "-- (later fragments)";

/// Whether `line` is a [`LATER_MARK`] line.
fn is_later_mark(line: &str) -> bool {
    line.trim_end() == LATER_MARK
}

/// `body` split at its [`LATER_MARK`] lines, which are left out.
fn split_at_marks(body: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut at) = (0, 0);
    for line in body.split_inclusive('\n') {
        if is_later_mark(line) {
            parts.push(&body[start..at]);
            start = at + line.len();
        }
        at += line.len();
    }
    parts.push(&body[start..]);
    parts
}

impl Fragment {
    /// The fragment as composed for `flavor`: announced on sharded pub/sub where the
    /// flavor says so.
    fn for_flavor(self, flavor: Flavor) -> Fragment {
        if flavor.sharded && self.0 == PUBLISH.0 {
            SHARDED_PUBLISH
        } else {
            self
        }
    }
}

/// What a script is composed for: the kind of node and what its server offers. The
/// node picks it from what it learned of its server ([`Flavor::STANDALONE`] and
/// [`Flavor::CLUSTER`] are Redis 7's and Valkey's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flavor {
    /// A Redis Cluster: its scripts include `renew_across_slots.lua`.
    pub cluster: bool,
    /// Releases are announced with sharded `SPUBLISH`, which reaches only the nodes of
    /// the lock's shard (classic `PUBLISH` goes to every node of a cluster); only on a
    /// cluster whose servers have sharded pub/sub.
    pub sharded: bool,
    /// The server reads a script's `#!lua` line (Redis 7 and later, Valkey): a script
    /// keeps it. Without (Redis 6.2) the line is left out, and the script runs as every
    /// script did before Redis 7 (see the scripts that have one).
    pub shebang: bool,
}

impl Flavor {
    /// A standalone node of Redis 7 or Valkey.
    pub const STANDALONE: Flavor = Flavor {
        cluster: false,
        sharded: false,
        shebang: true,
    };
    /// A Redis Cluster of Redis 7 or Valkey.
    pub const CLUSTER: Flavor = Flavor {
        cluster: true,
        sharded: true,
        shebang: true,
    };
    /// How many distinct flavors [`Flavor::index`] numbers.
    const COUNT: usize = 8;

    /// Its place among every combination, below [`Flavor::COUNT`].
    fn index(self) -> usize {
        usize::from(self.cluster) * 4 + usize::from(self.sharded) * 2 + usize::from(self.shebang)
    }

    /// The flavors [`lua_scripts`] lists, each with the prefix its differing scripts get:
    /// Redis 7's and Valkey's, then those of servers without script flags or sharded
    /// pub/sub (Redis 6.2).
    const LISTED: [(Flavor, &'static str); 4] = [
        (Flavor::STANDALONE, ""),
        (Flavor::CLUSTER, "cluster/"),
        (
            Flavor {
                cluster: false,
                sharded: false,
                shebang: false,
            },
            "no-flags/",
        ),
        (
            Flavor {
                cluster: true,
                sharded: false,
                shebang: false,
            },
            "no-flags/cluster/",
        ),
    ];
}

/// Every script fencelock runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lua {
    Acquire,
    Take,
    Release,
    Renew,
    RenewAcrossSlots,
    ReentrantAcquire,
    ReentrantRelease,
    FairAcquire,
    FairRelease,
    FairLeave,
    SemaphoreAcquire,
    SemaphoreRelease,
    SemaphoreResize,
    ReadAcquire,
    ReadRelease,
    Campaign,
    Resign,
    MultiAcquire,
    MultiRelease,
    Inspect,
    Break,
    Wake,
    Unlist,
    QueuePush,
    QueueTake,
    QueueAck,
    QueueRetry,
    QueueExtend,
    QueueCounts,
    FencedWrite,
}

impl Lua {
    const ALL: [Lua; 30] = [
        Lua::Acquire,
        Lua::Take,
        Lua::Release,
        Lua::Renew,
        Lua::RenewAcrossSlots,
        Lua::ReentrantAcquire,
        Lua::ReentrantRelease,
        Lua::FairAcquire,
        Lua::FairRelease,
        Lua::FairLeave,
        Lua::SemaphoreAcquire,
        Lua::SemaphoreRelease,
        Lua::SemaphoreResize,
        Lua::ReadAcquire,
        Lua::ReadRelease,
        Lua::Campaign,
        Lua::Resign,
        Lua::MultiAcquire,
        Lua::MultiRelease,
        Lua::Inspect,
        Lua::Break,
        Lua::Wake,
        Lua::Unlist,
        Lua::QueuePush,
        Lua::QueueTake,
        Lua::QueueAck,
        Lua::QueueRetry,
        Lua::QueueExtend,
        Lua::QueueCounts,
        Lua::FencedWrite,
    ];

    /// The table: each script's file, the fragments put in front of it (in this order;
    /// those after a [`LATER`] at its marker lines instead), and its own source. A
    /// script whose first line is a shebang (`#!lua flags=...`) keeps it first.
    #[rustfmt::skip]
    fn parts(self) -> (&'static str, &'static [Fragment], &'static str) {
        /// A row: the file, its fragments, its source.
        macro_rules! lua {
            ($file:literal, [$($fragment:expr),*]) => {
                ($file, &[$($fragment),*], include_str!($file))
            };
        }
        use Lua::*;
        match self {
            Acquire => lua!("lock/acquire.lua", [CLOCK, FENCE, WAITING, LATER, TYPES, HOLDER, READERS]),
            Take => lua!("lock/take.lua", [LATER, TYPES, HOLDER, CLOCK, FENCE, READERS]),
            Release => lua!("lock/release.lua", [LATER, PUBLISH, CLOCK, WAKES, LATER, FENCE, LATER, TYPES, HOLDER, READERS]),
            Renew => lua!("lock/renew.lua", [HOLDER, CLOCK, LEASE]),
            RenewAcrossSlots => lua!("lock/renew_across_slots.lua", [HOLDER, CLOCK, LEASE]),
            ReentrantAcquire => lua!("lock/reentrant_acquire.lua", [TYPES, HOLDER, CLOCK, FENCE, READERS, WAITING]),
            ReentrantRelease => lua!("lock/reentrant_release.lua", [TYPES, HOLDER, CLOCK, READERS, PUBLISH]),
            FairAcquire => lua!("lock/fair_acquire.lua", [LATER, TYPES, HOLDER, CLOCK, FENCE, FAIR_QUEUE, PUBLISH, LATER, WAITING]),
            FairRelease => lua!("lock/fair_release.lua", [LATER, TYPES, HOLDER, CLOCK, FENCE, FAIR_QUEUE, PUBLISH]),
            FairLeave => lua!("lock/fair_leave.lua", [TYPES, HOLDER, PUBLISH]),
            SemaphoreAcquire => lua!("semaphore/acquire.lua", [LATER, TYPES, HOLDER, CLOCK, FENCE, WAITING, FAIR_QUEUE, PUBLISH]),
            SemaphoreRelease => lua!("semaphore/release.lua", [LATER, TYPES, CLOCK, FAIR_QUEUE, PUBLISH, WAKES]),
            SemaphoreResize => lua!("semaphore/resize.lua", [TYPES, HOLDER, CLOCK, FENCE, PUBLISH, WAKES]),
            ReadAcquire => lua!("rwlock/read_acquire.lua", [LATER, TYPES, HOLDER, CLOCK, FENCE, READERS, WAITING]),
            ReadRelease => lua!("rwlock/read_release.lua", [LATER, TYPES, HOLDER, CLOCK, READERS, PUBLISH]),
            Campaign => lua!("election/campaign.lua", [TYPES, HOLDER, CLOCK, FENCE, WAITING, PUBLISH]),
            Resign => lua!("election/resign.lua", [TYPES, HOLDER, CLOCK, PUBLISH, WAKES]),
            MultiAcquire => lua!("lock/multi_acquire.lua", [TYPES, HOLDER, CLOCK, FENCE, WAITING]),
            MultiRelease => lua!("lock/multi_release.lua", [CLOCK, FENCE, PUBLISH, WAKES]),
            Inspect => lua!("lock/inspect.lua", [TYPES, HOLDER, CLOCK, FENCE]),
            Break => lua!("lock/break.lua", [TYPES, HOLDER, CLOCK, FENCE, PUBLISH]),
            Wake => lua!("lock/wake.lua", [CLOCK, PUBLISH, WAKES]),
            Unlist => lua!("lock/unlist.lua", []),
            QueuePush => lua!("queue/push.lua", [TYPES, CLOCK]),
            QueueTake => lua!("queue/take.lua", [TYPES, CLOCK]),
            QueueAck => lua!("queue/ack.lua", [TYPES]),
            QueueRetry => lua!("queue/retry.lua", [TYPES, CLOCK]),
            QueueExtend => lua!("queue/extend.lua", [TYPES, CLOCK]),
            QueueCounts => lua!("queue/counts.lua", [TYPES, CLOCK]),
            FencedWrite => lua!("fence/write.lua", [TYPES]),
        }
    }

    /// Whether the script is sent to `flavor`'s nodes: the batch across slots only to a
    /// cluster's.
    fn sent_to(self, flavor: Flavor) -> bool {
        self != Lua::RenewAcrossSlots || flavor.cluster
    }

    /// The script as sent to `flavor`'s nodes: its shebang line if it has one and the
    /// flavor reads it, its fragments (each for `flavor`), then the rest of its own
    /// source; each group of fragments after a [`LATER`] goes in at the next
    /// [`LATER_MARK`] line instead.
    fn source(self, flavor: Flavor) -> String {
        let (_, fragments, body) = self.parts();
        let (shebang, body) = match body.split_once('\n') {
            Some((first, rest)) if first.starts_with("#!") => (&body[..=first.len()], rest),
            _ => ("", body),
        };
        // Without its shebang a script runs as before Redis 7: what the line asked for is
        // said, for such servers, where it is asked (write.lua, renew_across_slots.lua).
        let mut source = if flavor.shebang {
            shebang.to_owned()
        } else {
            String::new()
        };
        let mut groups = fragments.split(|f| f.0 == LATER.0);
        // Group i of fragments, then part i of the body (the unit tests check that
        // there are as many marks as LATERs: a group without its mark would be lost).
        for part in split_at_marks(body) {
            let group = groups.next().unwrap_or_default();
            source.extend(group.iter().map(|f| f.for_flavor(flavor).0));
            source.push_str(part);
        }
        source
    }

    /// The composed source for `flavor` and its SHA1, composed when first asked for
    /// (a process uses one or two flavors), for `EVALSHA`, `SCRIPT LOAD` and `EVAL`.
    fn script(self, flavor: Flavor) -> &'static redis::Script {
        static SCRIPTS: [OnceLock<redis::Script>; Lua::ALL.len() * Flavor::COUNT] =
            [const { OnceLock::new() }; Lua::ALL.len() * Flavor::COUNT];
        SCRIPTS[self.index() * Flavor::COUNT + flavor.index()]
            .get_or_init(|| redis::Script::new(&self.source(flavor)))
    }

    /// The composed source for `flavor`, composed once.
    fn composed(self, flavor: Flavor) -> &'static str {
        static SOURCES: [OnceLock<String>; Lua::ALL.len() * Flavor::COUNT] =
            [const { OnceLock::new() }; Lua::ALL.len() * Flavor::COUNT];
        SOURCES[self.index() * Flavor::COUNT + flavor.index()].get_or_init(|| self.source(flavor))
    }

    /// Whether the script takes a lock, a permit or a place in line (an acquire of any
    /// kind): what a node whose server stopped answering holds back unsent
    /// ([`UnavailableReason::Stalled`](crate::UnavailableReason::Stalled)).
    pub(crate) fn acquires(self) -> bool {
        matches!(
            self,
            Lua::Acquire
                | Lua::Take
                | Lua::ReentrantAcquire
                | Lua::FairAcquire
                | Lua::SemaphoreAcquire
                | Lua::ReadAcquire
                | Lua::Campaign
                | Lua::MultiAcquire
        )
    }

    /// Its place in [`Lua::ALL`], below 32.
    pub(crate) fn index(self) -> usize {
        Lua::ALL.iter().position(|l| *l == self).unwrap_or(0)
    }
}

/// One call of a script: its keys and arguments, sent in the flavor of the node that
/// runs it, and what error messages name (the script and the keys it was given).
#[derive(Clone)]
pub struct Call {
    lua: Lua,
    /// Declared keys (`KEYS`).
    keys: Parts,
    /// Arguments (`ARGV`).
    args: Parts,
    /// Which arguments are keys (`renew_across_slots.lua`): named in errors too.
    keys_in_args: Vec<usize>,
    /// The `EVALSHA` command, built when first sent: a call sent again (an acquire's
    /// next attempt, a Redlock call to each node) is not built again. Built for the
    /// script's hash in the flavor it was first sent in; one for another hash (a flavor
    /// that composes the script otherwise) is built for each send.
    evalsha: OnceLock<(&'static str, redis::Cmd)>,
    /// A release or withdrawal: when the token it undoes was drawn (see
    /// [`Call::undoing`]).
    undoes: Option<Instant>,
    /// A release or withdrawal of a token no later attempt uses (see [`Call::undoing`]).
    last: bool,
}

/// A list of byte strings in one buffer (a call's keys or arguments): two allocations
/// for the whole list, where a `Vec` of each would take one per item. Calls are built for
/// every acquire and release.
#[derive(Clone)]
struct Parts {
    data: Vec<u8>,
    /// Where each item ends in `data`.
    ends: Vec<usize>,
}

impl Parts {
    fn with_capacity(items: usize, bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(items),
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.data.extend_from_slice(bytes);
        self.ends.push(self.data.len());
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.data[start..self.ends[i]]
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.get(i))
    }

    /// Item `i` as text (keys are built from `&str`, so this does not fail in practice).
    fn text(&self, i: usize) -> &str {
        std::str::from_utf8(self.get(i)).unwrap_or("<not UTF-8>")
    }
}

impl RedisWrite for Parts {
    fn write_arg(&mut self, arg: &[u8]) {
        self.push(arg);
    }

    fn write_arg_fmt(&mut self, arg: impl std::fmt::Display) {
        use std::io::Write as _;
        // Writing to a Vec does not fail.
        let _ = write!(self.writer_for_next_arg(), "{arg}");
    }

    fn writer_for_next_arg(&mut self) -> impl std::io::Write + '_ {
        self.push(b"");
        LastPart(self)
    }
}

/// Writes into the last item of [`Parts`].
struct LastPart<'a>(&'a mut Parts);

impl std::io::Write for LastPart<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.data.extend_from_slice(buf);
        if let Some(end) = self.0.ends.last_mut() {
            *end = self.0.data.len();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Call {
    pub(crate) fn new(lua: Lua) -> Self {
        Self {
            lua,
            // Room for a lock's calls without growing (a lock key of about 30 bytes,
            // with its derived keys; a batch of renewals grows them).
            keys: Parts::with_capacity(4, 160),
            args: Parts::with_capacity(8, 96),
            keys_in_args: Vec::new(),
            evalsha: OnceLock::new(),
            undoes: None,
            last: false,
        }
    }

    /// Marks the call as undoing only what acquires of `token` wrote (a release, a
    /// withdrawal): a node that held back every acquire since before the token was drawn
    /// has nothing of it, and need not be sent this either. A token read back (not drawn
    /// here) is always sent. `last`: no attempt of the token follows (a lock released,
    /// an acquire that ended), so the call may be sent again later if it may have been
    /// lost (see [`Call::may_resend`]); a failed attempt's take-back, which the next
    /// attempt with the same token follows, may not: sent late, it could undo that grant.
    pub(crate) fn undoing(mut self, token: &HolderToken, last: bool) -> Self {
        self.undoes = token.drawn();
        self.last = last;
        self
    }

    /// Whether the call may be sent again after it timed out (it may have been dropped
    /// unsent) or was lost with its connection: the last release or withdrawal of its token, by a script that acts only
    /// on that token (a reentrant release gives up the hold of its token, a read
    /// release the reader of its token), so that running it twice, or after anything
    /// else, does no harm.
    pub(crate) fn may_resend(&self) -> bool {
        self.last
            && matches!(
                self.lua,
                Lua::Release
                    | Lua::FairRelease
                    | Lua::FairLeave
                    | Lua::ReentrantRelease
                    | Lua::SemaphoreRelease
                    | Lua::ReadRelease
                    | Lua::Resign
                    | Lua::MultiRelease
            )
    }

    /// When the token this call undoes was drawn, if it was drawn by this client (see
    /// [`Call::undoing`]).
    pub(crate) fn undoes(&self) -> Option<Instant> {
        self.undoes
    }

    pub(crate) fn key(&mut self, key: impl AsRef<str>) -> &mut Self {
        self.keys.push(key.as_ref().as_bytes());
        self
    }

    pub(crate) fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// A key passed in `ARGV`: an argument, named in errors as a key.
    fn key_arg(&mut self, key: &str) -> &mut Self {
        self.keys_in_args.push(self.args.len());
        self.args.push(key.as_bytes());
        self
    }

    /// Every key the call was given, declared or in `ARGV`.
    fn all_keys(&self) -> impl Iterator<Item = &str> {
        (0..self.keys.len())
            .map(|i| self.keys.text(i))
            .chain(self.keys_in_args.iter().map(|&i| self.args.text(i)))
    }

    /// `EVALSHA` of this call for `flavor`, as one command (a cluster's connection routes
    /// it by its first key; or by hand, to a cluster node by address); [`Self::load`]
    /// or [`Self::eval`] after a `NOSCRIPT`.
    pub(crate) fn evalsha(&self, flavor: Flavor) -> Cow<'_, redis::Cmd> {
        let hash = self.lua.script(flavor).get_hash();
        let (built_for, built) = self
            .evalsha
            .get_or_init(|| (hash, self.build("EVALSHA", hash, hash.len())));
        // Flavors that compose the script alike share its hash, and the command.
        if *built_for == hash {
            Cow::Borrowed(built)
        } else {
            Cow::Owned(self.build("EVALSHA", hash, hash.len()))
        }
    }

    /// `EVAL` of this call for `flavor`: the script's source with the call's keys and
    /// arguments, where the server refuses `SCRIPT LOAD` (the server keeps the script,
    /// so later calls go as `EVALSHA` again).
    pub(crate) fn eval(&self, flavor: Flavor) -> redis::Cmd {
        let source = self.lua.composed(flavor);
        self.build("EVAL", source, source.len())
    }

    /// `command script numkeys keys... args...`; `len`: the script's length, a capacity
    /// hint.
    fn build(&self, command: &str, script: &str, len: usize) -> redis::Cmd {
        // A capacity hint: the command name, the script, the key count's digits, the rest.
        let data = command.len() + len + 20 + self.keys.data.len() + self.args.data.len();
        let mut cmd = redis::Cmd::with_capacity(3 + self.keys.len() + self.args.len(), data);
        cmd.arg(command).arg(script).arg(self.keys.len());
        for part in self.keys.iter().chain(self.args.iter()) {
            cmd.arg(part);
        }
        cmd
    }

    /// The script this call runs.
    pub(crate) fn lua(&self) -> Lua {
        self.lua
    }

    /// `SCRIPT LOAD` of this call's script for `flavor`.
    pub(crate) fn load(&self, flavor: Flavor) -> redis::Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.lua.composed(flavor));
        cmd
    }

    /// The first key the script is given (declared or in `ARGV`): on a cluster, the
    /// master of its slot runs the call.
    pub(crate) fn first_key(&self) -> Option<&str> {
        self.all_keys().next()
    }

    /// An ACL refusal of this call, said so that the user knows what to allow: the command
    /// the server names, or else the command the script's refused line runs, and the keys
    /// the call was given. `None` for any other error message.
    /// `flavor`: the flavor it was sent in, whose lines the server's line number counts.
    pub(crate) fn refusal(&self, message: &str, flavor: Flavor) -> Option<String> {
        let (file, _, _) = self.lua.parts();
        let keys = self.all_keys().collect::<Vec<_>>().join(", ");
        // Each server says it its own way: Redis 7, Redis 6.2, Valkey.
        let says = |ways: &[&str]| {
            let lower = message.to_ascii_lowercase();
            ways.iter().any(|way| lower.contains(way))
        };
        let key_refused = says(&[
            "no permissions to access one of the keys",
            "can't access at least one of the keys",
            "no permissions to access a key",
        ]);
        if !message.contains("@user_script") {
            // Refused before the script ran.
            if says(&["no permissions to run the"]) {
                return Some(format!("{message} (running {file})"));
            }
            if key_refused {
                return Some(format!(
                    "the Redis user may not access these keys, which {file} was given: {keys}"
                ));
            }
            return None;
        }
        let command_refused = says(&["can't run this command", "no permissions to run the"]);
        let channel_refused = says(&[
            "can't publish to the channel",
            "no permissions to access a channel",
        ]);
        if !command_refused && !key_refused && !channel_refused {
            return None;
        }
        // Redis 7: "... script: <sha>, on @user_script:<line>."; Redis 6.2: "... (call to
        // f_<sha>): @user_script:<line>: @user_script: <line>: The user ...".
        let line: Option<usize> = message.split("@user_script:").skip(1).find_map(|rest| {
            let rest = rest.trim_start();
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            rest[..digits].parse().ok()
        });
        let source = self.lua.source(flavor);
        let text = line
            .and_then(|n| source.lines().nth(n.checked_sub(1)?))
            .map(str::trim)
            .unwrap_or_default();
        let command = text
            .split_once("call('")
            .and_then(|(_, rest)| rest.split_once('\''))
            .map(|(command, _)| command.to_owned());
        let at = match line {
            Some(n) => format!("{file}, line {n} as sent: {text}"),
            None => file.to_owned(),
        };
        if channel_refused {
            return Some(format!(
                "the Redis user may not publish to the channel that tells waiters of a \
                 release ({at})"
            ));
        }
        Some(match (command_refused, command) {
            (true, Some(command)) => format!(
                "the Redis user may not run {command}, which a fencelock script runs ({at})"
            ),
            (true, None) => format!("the Redis user may not run a command of {at}"),
            (false, _) => format!(
                "the Redis user may not access a key that {at} touches; the call's keys: {keys}"
            ),
        })
    }
}

/// A call's script and what it is given, as sent to a node of one [`Flavor`]
/// (`Call::parts`).
#[cfg(feature = "model")]
#[derive(Clone, Debug)]
pub struct CallParts<'a> {
    /// The script's file (`lock/acquire.lua`, ...).
    pub file: &'static str,
    /// Its source as composed for the flavor (its fragments in), as `SCRIPT LOAD` sends
    /// it.
    pub source: &'static str,
    /// `KEYS`, in order.
    pub keys: Vec<&'a [u8]>,
    /// `ARGV`, in order.
    pub args: Vec<&'a [u8]>,
}

#[cfg(feature = "model")]
impl Call {
    /// Its script and what it is given, for `flavor`: for running it somewhere else than
    /// on a node (a model checker's keyspace).
    pub(crate) fn parts(&self, flavor: Flavor) -> CallParts<'_> {
        CallParts {
            file: self.lua.parts().0,
            source: self.lua.composed(flavor),
            keys: self.keys.iter().collect(),
            args: self.args.iter().collect(),
        }
    }
}

/// Every Lua script fencelock sends, by file name (`lock/acquire.lua`, ...), composed as
/// sent: the shared fragments, then the script's own source, whose header states its
/// KEYS, ARGV and replies (a script with a fast path gets some fragments after it, at
/// its `-- (later fragments)` lines). For review (what runs on your Redis, with which
/// keys), and for running a script by hand with `EVAL`.
///
/// First every script as a standalone node of Redis 7 or Valkey gets it (a
/// Sentinel-managed master and a Redlock node too), then, under a prefix, the scripts
/// that other servers get in another form:
///
/// - `cluster/` (`cluster/lock/release.lua`, ...): a Redis Cluster of Redis 7 or Valkey,
///   whose scripts announce releases with `SPUBLISH` (sharded pub/sub) instead of
///   `PUBLISH`, and `cluster/lock/renew_across_slots.lua`, the watchdog's batch over
///   every slot of one cluster node. It gets the others as listed first.
/// - `no-flags/` (`no-flags/fence/write.lua`): a server that cannot read a script's
///   `#!lua` line (Redis 6.2) gets the scripts that have one without it, and the others
///   as listed first.
/// - `no-flags/cluster/lock/renew_across_slots.lua`: a Redis Cluster of such servers,
///   which have no sharded pub/sub either: its scripts announce with classic `PUBLISH`,
///   as the first list's and the `no-flags/` ones do.
pub fn lua_scripts() -> impl Iterator<Item = (&'static str, String)> {
    // (file, name, source)
    let mut listed: Vec<(&'static str, &'static str, String)> = Vec::new();
    for (flavor, prefix) in Flavor::LISTED {
        for lua in Lua::ALL.into_iter().filter(|lua| lua.sent_to(flavor)) {
            let file = lua.parts().0;
            let source = lua.source(flavor);
            // Listed once per form: a flavor that composes it as another did gets that.
            if !listed.iter().any(|(f, _, s)| *f == file && *s == source) {
                listed.push((file, prefixed(prefix, file), source));
            }
        }
    }
    listed.into_iter().map(|(_, name, source)| (name, source))
}

/// `prefix` and the file name, as a static string (the table's names are few and
/// fixed).
fn prefixed(prefix: &'static str, file: &'static str) -> &'static str {
    if prefix.is_empty() {
        return file;
    }
    static NAMES: LazyLock<Vec<(&'static str, &'static str, &'static str)>> = LazyLock::new(|| {
        Flavor::LISTED
            .iter()
            .flat_map(|(_, prefix)| {
                Lua::ALL.iter().map(move |lua| {
                    let file = lua.parts().0;
                    (*prefix, file, &*format!("{prefix}{file}").leak())
                })
            })
            .collect()
    });
    NAMES
        .iter()
        .find(|(p, f, _)| *p == prefix && *f == file)
        .map_or(file, |(_, _, name)| name)
}

/// Durations in whole milliseconds (validated before they get here; queue delays may be
/// 0).
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

/// A waiting acquire's client on the lock's wake list (`fragments/waiting.lua`), a plain
/// lock's or a semaphore's: a release wakes a listed client by its own channel, not every
/// client; or `*` ([`Listing::EVERYONE`]), which has the release wake every client on
/// the lock's channel. A release that finds nobody listed publishes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listing<'a> {
    /// The client's tag: its own channel is the lock's, `:`, then this; or
    /// [`Listing::EVERYONE`].
    pub tag: &'a str,
    /// How much longer a listing lasts than the lease that refused the attempt (when
    /// the waiter tries again by itself).
    pub margin: Duration,
    /// Other waiters of the client wait for the lock too: a grant leaves it listed.
    pub stays: bool,
    /// A release woke the client by name since its last attempt (and took it off the
    /// list): refused, it goes back to the head of the list.
    pub front: bool,
}

impl Listing<'_> {
    /// The tag of a waiter that hears a release only on the lock's channel (a reader, a
    /// reentrant owner or a fair waiter that a plain holder refused; a plain or
    /// semaphore waiter whose client's own channel is not subscribed on every node):
    /// its release then wakes every client. Never taken off by a grant (other clients'
    /// waiters may have listed it too), only by the release that announces it.
    pub const EVERYONE: &'static str = "*";
}

/// One batch: `(lock key, holder, ttl)` per lease; the holder is the token, or a
/// reentrant lock's owner id. Each lease's holder info is renewed with it. On a Redis
/// Cluster every key must be in one slot.
pub fn renew<'a>(leases: impl Iterator<Item = (&'a str, &'a str, Duration)>) -> Call {
    let mut inv = Call::new(Lua::Renew);
    for (key, holder, ttl) in leases {
        inv.key(key)
            .key(format!("{key}:holder"))
            .arg(holder)
            .arg(ms(ttl));
    }
    inv
}

/// A Redis Cluster's batch over every slot of one node: as [`renew`], with the keys in
/// `ARGV`.
pub(crate) fn renew_across_slots<'a>(
    leases: impl Iterator<Item = (&'a str, &'a str, Duration)>,
) -> Call {
    let mut inv = Call::new(Lua::RenewAcrossSlots);
    for (key, holder, ttl) in leases {
        inv.key_arg(key)
            .key_arg(&format!("{key}:holder"))
            .arg(holder)
            .arg(ms(ttl));
    }
    inv
}

/// Sets the semaphore's permit count (`semaphore/resize.lua`).
pub(crate) fn semaphore_resize(keys: &LockKeys, permits: u32, counter_idle: Duration) -> Call {
    let mut inv = Call::new(Lua::SemaphoreResize);
    inv.key(&keys.lock)
        .key(keys.permits())
        .key(keys.queue())
        .key(keys.wake_list())
        .arg(permits)
        .arg(keys.channel())
        .arg(ms(counter_idle));
    inv
}

/// Takes the client tagged `tag` off the lock's wake list (`lock/unlist.lua`).
pub(crate) fn unlist(keys: &LockKeys, tag: &str) -> Call {
    let mut inv = Call::new(Lua::Unlist);
    inv.key(keys.wake_list()).arg(tag);
    inv
}

/// Hands a release's wake on to the next client of the lock's wake list, or to every
/// client, unless the lock (every permit of a semaphore) is held (`lock/wake.lua`): a
/// client woken by name had no waiter left to take it.
pub(crate) fn wake(keys: &LockKeys) -> Call {
    let mut inv = Call::new(Lua::Wake);
    inv.key(&keys.lock)
        .key(keys.wake_list())
        .key(keys.permits())
        .arg(keys.channel());
    inv
}

/// Reads everything of one lock name; writes nothing.
pub(crate) fn inspect(keys: &LockKeys) -> Call {
    let mut inv = Call::new(Lua::Inspect);
    inv.key(&keys.lock)
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.holder_info())
        .key(keys.permits())
        .key(keys.writers())
        .key(keys.grants())
        .key(keys.wake_list());
    inv
}

/// Breaks the lock, whoever holds it.
pub(crate) fn break_lock(keys: &LockKeys, counter_idle: Duration) -> Call {
    let mut inv = Call::new(Lua::Break);
    inv.key(&keys.lock)
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.holder_info())
        .arg(keys.channel())
        .arg(ms(counter_idle));
    inv
}

/// One write of a fenced write: its command, its key (an index into the call's keys),
/// its arguments.
#[derive(Debug)]
pub(crate) struct FencedOp {
    pub command: &'static str,
    pub key: usize,
    pub args: Vec<Vec<u8>>,
}

/// `fence/write.lua`: `writes` to `keys` (each key once), only with `token` at least
/// the highest the resource's `fence` key recorded.
pub(crate) fn fenced_write(
    fence: &str,
    keys: &[String],
    token: FencingToken,
    writes: &[FencedOp],
) -> Call {
    let mut inv = Call::new(Lua::FencedWrite);
    inv.key(fence);
    for key in keys {
        inv.key(key);
    }
    inv.arg(token.get());
    for write in writes {
        // KEYS[1] is the fence, so the write's key is KEYS[2 + its index].
        inv.arg(write.command)
            .arg(write.key + 2)
            .arg(write.args.len());
        for arg in &write.args {
            inv.arg(arg.as_slice());
        }
    }
    inv
}

/// A queue item's id as stored: 20 zero-padded decimal digits, so that items due in the
/// same millisecond sort by id.
fn member(id: u64) -> String {
    format!("{id:020}")
}

pub(crate) fn queue_push(keys: &QueueKeys, payload: &[u8], delay: Duration) -> Call {
    let mut inv = Call::new(Lua::QueuePush);
    inv.key(&keys.due)
        .key(&keys.items)
        .key(&keys.seq)
        .arg(payload)
        .arg(ms(delay));
    inv
}

pub(crate) fn queue_take(keys: &QueueKeys, visibility: Duration, receipt: &str) -> Call {
    let mut inv = Call::new(Lua::QueueTake);
    inv.key(&keys.due)
        .key(&keys.in_flight)
        .key(&keys.items)
        .key(&keys.attempts)
        .key(&keys.receipts)
        .arg(ms(visibility))
        .arg(receipt);
    inv
}

pub(crate) fn queue_ack(keys: &QueueKeys, id: u64, receipt: &str) -> Call {
    let mut inv = Call::new(Lua::QueueAck);
    inv.key(&keys.in_flight)
        .key(&keys.items)
        .key(&keys.attempts)
        .key(&keys.receipts)
        .arg(member(id))
        .arg(receipt);
    inv
}

pub(crate) fn queue_retry(keys: &QueueKeys, id: u64, receipt: &str, delay: Duration) -> Call {
    let mut inv = Call::new(Lua::QueueRetry);
    inv.key(&keys.due)
        .key(&keys.in_flight)
        .key(&keys.receipts)
        .arg(member(id))
        .arg(receipt)
        .arg(ms(delay));
    inv
}

pub(crate) fn queue_extend(keys: &QueueKeys, id: u64, receipt: &str, visibility: Duration) -> Call {
    let mut inv = Call::new(Lua::QueueExtend);
    inv.key(&keys.in_flight)
        .key(&keys.receipts)
        .arg(member(id))
        .arg(receipt)
        .arg(ms(visibility));
    inv
}

pub(crate) fn queue_counts(keys: &QueueKeys) -> Call {
    let mut inv = Call::new(Lua::QueueCounts);
    inv.key(&keys.due).key(&keys.in_flight);
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_members_sort_like_ids() {
        assert_eq!(member(42), "00000000000000000042");
        assert!(member(9) < member(10));
        assert_eq!(member(u64::MAX).len(), 20);
    }

    #[test]
    fn every_script_starts_with_its_header() {
        for lua in Lua::ALL {
            let (file, _, body) = lua.parts();
            let name = file.rsplit('/').next().unwrap_or(file);
            let header = match body.split_once('\n') {
                Some((first, rest)) if first.starts_with("#!") => rest,
                _ => body,
            };
            assert!(
                header.starts_with(&format!("-- {name}:")),
                "{file} starts with its header (after a shebang)"
            );
            for word in ["KEYS", "ARGV", "Reply"] {
                assert!(body.contains(word), "{file}'s header states {word}");
            }
        }
    }

    /// A script's text without its comment lines (the header names functions too: only
    /// code counts).
    fn code(text: &str) -> String {
        text.lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The common cases that an uncontended lock, read or permit runs define no
    /// function (a closure on every call: docs/benchmarks.md, "Redis's work per lock"):
    /// every fragment of these scripts goes in after their fast path, which answers.
    #[test]
    fn the_common_cases_run_before_any_function_is_defined() {
        for lua in [
            Lua::Take,
            Lua::Release,
            Lua::FairAcquire,
            Lua::ReadAcquire,
            Lua::ReadRelease,
            Lua::FairRelease,
            Lua::SemaphoreAcquire,
            Lua::SemaphoreRelease,
        ] {
            let (file, fragments, body) = lua.parts();
            assert!(
                fragments.first().is_some_and(|f| f.0 == LATER.0),
                "{file}: a fragment goes in front of its fast path"
            );
            let code: Vec<&str> = split_at_marks(body)[0]
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect();
            assert!(
                code.iter().all(|l| !l.contains("function")),
                "{file}: its fast path defines a function"
            );
            assert!(
                code.iter().any(|l| l.trim_start().starts_with("return")),
                "{file}: its fast path answers"
            );
        }
    }

    #[test]
    fn every_script_has_the_fragments_its_functions_need() {
        let defined_in = [
            ("server_us(", CLOCK),
            ("server_ms(", CLOCK),
            ("server_ms_us(", CLOCK),
            ("wrong_type(", TYPES),
            ("check_types(", TYPES),
            ("lock_holder(", HOLDER),
            ("holder_of(", HOLDER),
            ("holder_by_type(", HOLDER),
            ("read_counter(", FENCE),
            ("store_counter(", FENCE),
            ("next_fence(", FENCE),
            ("purge_waiters(", FAIR_QUEUE),
            ("overdue(", FAIR_QUEUE),
            ("purge_overdue(", FAIR_QUEUE),
            ("renew_lease(", LEASE),
            ("renew_permit(", LEASE),
            ("READERS_MARK", HOLDER),
            ("readers_held(", READERS),
            ("writer_waits(", READERS),
            ("writer_gone(", READERS),
            ("writer_meets_readers(", READERS),
            ("announce(", PUBLISH),
        ];
        // Each pair: the fragment that uses functions of the other comes after it.
        let after = [
            (CLOCK, FENCE),
            (HOLDER, LEASE),
            (CLOCK, LEASE),
            (TYPES, READERS),
            (HOLDER, READERS),
            (CLOCK, READERS),
        ];
        for lua in Lua::ALL {
            let (file, fragments, body) = lua.parts();
            // Each function used comes with its fragment, and a fragment comes after
            // those it uses; a fast path (the source before the marker) uses only the
            // fragments in front of it.
            let groups: Vec<&[Fragment]> = fragments.split(|f| f.0 == LATER.0).collect();
            let parts = split_at_marks(body);
            assert_eq!(
                parts.len(),
                groups.len(),
                "{file} has a marker line for each LATER in its list"
            );
            for (call, fragment) in defined_in {
                if body.contains(call) {
                    assert!(
                        fragments.iter().any(|f| f.0 == fragment.0),
                        "{file} calls {call}) without its fragment"
                    );
                }
                // Defined by a group at or before the part that calls it.
                for (i, part) in parts.iter().enumerate() {
                    if code(part).contains(call) {
                        assert!(
                            groups[..=i]
                                .iter()
                                .flat_map(|g| g.iter())
                                .any(|f| f.0 == fragment.0),
                            "{file} calls {call}) before its fragment goes in"
                        );
                    }
                }
            }
            let position = |f: Fragment| fragments.iter().position(|g| g.0 == f.0);
            for (first, then) in after {
                if let Some(then) = position(then) {
                    assert!(
                        position(first).is_some_and(|first| first < then),
                        "{file}: a fragment comes after those it uses"
                    );
                }
            }
        }
    }

    #[test]
    fn a_marker_is_a_whole_line_with_either_line_ending() {
        assert!(is_later_mark("-- (later fragments)\n"));
        assert!(is_later_mark("-- (later fragments)\r\n"));
        assert!(is_later_mark("-- (later fragments)"));
        assert!(!is_later_mark("x = 1 -- (later fragments)\n"));
        assert!(!is_later_mark("-- (later fragments) go here\n"));
        // Composed, no marker is left, and every fragment is in.
        for lua in Lua::ALL {
            let source = lua.source(Flavor::STANDALONE);
            assert!(!source.contains(LATER_MARK), "{}", lua.parts().0);
            for f in lua.parts().1.iter().filter(|f| f.0 != LATER.0) {
                assert!(source.contains(f.0), "{}", lua.parts().0);
            }
        }
    }

    #[test]
    fn a_cluster_announces_on_sharded_pub_sub_and_only_two_scripts_have_a_shebang() {
        let (no_flags, _) = Flavor::LISTED[2];
        let (no_flags_cluster, _) = Flavor::LISTED[3];
        for lua in Lua::ALL {
            let file = lua.parts().0;
            // No flavor without flags has a shebang, nor one without sharded pub/sub
            // SPUBLISH; a Redis 6.2 Cluster announces with classic PUBLISH.
            for flavor in [no_flags, no_flags_cluster] {
                let source = lua.source(flavor);
                assert!(!source.contains("#!"), "{file}: {flavor:?}");
                assert!(!source.contains("'SPUBLISH'"), "{file}: {flavor:?}");
            }
            // The fenced write's flagless shebang (refused when the server is out of
            // memory, before it starts) is the same everywhere it is read.
            if lua == Lua::FencedWrite {
                for flavor in [Flavor::STANDALONE, Flavor::CLUSTER] {
                    let source = lua.source(flavor);
                    assert!(source.starts_with("#!lua\n"), "{file}");
                    assert_eq!(source.matches("#!").count(), 1, "{file}");
                }
                continue;
            }
            if lua.sent_to(Flavor::STANDALONE) {
                let source = lua.source(Flavor::STANDALONE);
                assert!(!source.contains("'SPUBLISH'"), "{file}");
                assert!(
                    !source.contains("#!"),
                    "{file}: no shebang on a standalone node"
                );
            }
            let source = lua.source(Flavor::CLUSTER);
            assert!(
                !source.contains("'PUBLISH'"),
                "{file}: never classic PUBLISH"
            );
            assert_eq!(
                source.starts_with("#!lua flags=allow-cross-slot-keys\n"),
                lua == Lua::RenewAcrossSlots,
                "{file}"
            );
            assert_eq!(
                source.matches("#!").count(),
                usize::from(lua == Lua::RenewAcrossSlots)
            );
        }
        let names: Vec<&str> = lua_scripts().map(|(name, _)| name).collect();
        for listed in [
            "lock/release.lua",
            "cluster/lock/release.lua",
            "cluster/lock/renew_across_slots.lua",
            "no-flags/fence/write.lua",
            "no-flags/cluster/lock/renew_across_slots.lua",
        ] {
            assert!(names.contains(&listed), "{listed}: {names:?}");
        }
        for same in [
            "lock/renew_across_slots.lua",
            "cluster/lock/acquire.lua",
            "no-flags/lock/release.lua",
            "no-flags/cluster/lock/release.lua",
        ] {
            assert!(!names.contains(&same), "{same}: the same as another's");
        }
        // A Redis 6.2 Cluster's release is a standalone node's, its renewal batch the
        // cluster's without the flags line.
        let source = |name: &str| lua_scripts().find(|(n, _)| *n == name).unwrap().1;
        assert_eq!(
            Lua::Release.source(no_flags_cluster),
            source("lock/release.lua")
        );
        assert_eq!(
            source("no-flags/cluster/lock/renew_across_slots.lua"),
            source("cluster/lock/renew_across_slots.lua")
                .strip_prefix("#!lua flags=allow-cross-slot-keys\n")
                .unwrap()
        );
    }

    #[test]
    fn a_call_of_a_script_composed_alike_shares_its_command_and_eval_sends_the_source() {
        let (no_flags, _) = Flavor::LISTED[2];
        let mut call = Call::new(Lua::Acquire);
        call.key("k").arg("a");
        // acquire.lua has no shebang: one hash for both, one command built.
        assert!(matches!(call.evalsha(Flavor::STANDALONE), Cow::Borrowed(_)));
        assert!(matches!(call.evalsha(no_flags), Cow::Borrowed(_)));
        let mut write = Call::new(Lua::FencedWrite);
        write.key("f").arg(1u64);
        let hash = |flavor| Lua::FencedWrite.script(flavor).get_hash().to_owned();
        assert_ne!(hash(Flavor::STANDALONE), hash(no_flags));
        assert_eq!(words(&write.evalsha(no_flags))[1], hash(no_flags));
        assert_eq!(
            words(&write.evalsha(Flavor::STANDALONE))[1],
            hash(Flavor::STANDALONE)
        );
        let eval = words(&write.eval(no_flags));
        assert_eq!(eval[0], "EVAL");
        assert_eq!(eval[1], Lua::FencedWrite.source(no_flags));
        assert_eq!(eval[2..], ["1", "f", "1"]);
    }

    #[test]
    fn a_refused_line_is_found_in_either_servers_message() {
        let call = Call::new(Lua::Release);
        let source = Lua::Release.source(Flavor::STANDALONE);
        let n = source
            .lines()
            .position(|l| l.contains("call('PUBLISH'"))
            .unwrap()
            + 1;
        for message in [
            format!(
                "ERR The user executing the script can't run this command or subcommand \
                 script: 0123, on @user_script:{n}."
            ),
            format!(
                "ERR Error running script (call to f_0123): @user_script:{n}: \
                 @user_script: {n}: The user executing the script can't run this command \
                 or subcommand"
            ),
            format!(
                "ERR ACL failure in script: User fencelock has no permissions to run the \
                 'publish' command script: on @user_script:{n}."
            ),
        ] {
            let refusal = call.refusal(&message, Flavor::STANDALONE).unwrap();
            assert!(
                refusal.starts_with("the Redis user may not run PUBLISH"),
                "{refusal}"
            );
            assert!(refusal.contains(&format!("line {n} as sent")), "{refusal}");
        }
        // Valkey's channel and key refusals.
        let channel = call
            .refusal(
                &format!(
                    "ERR ACL failure in script: No permissions to access a channel script: \
                     on @user_script:{n}."
                ),
                Flavor::STANDALONE,
            )
            .unwrap();
        assert!(
            channel.contains("may not publish to the channel"),
            "{channel}"
        );
        let mut call = Call::new(Lua::Release);
        call.key("billing:{x}");
        let keys = call
            .refusal("NOPERM No permissions to access a key", Flavor::STANDALONE)
            .unwrap();
        assert!(keys.contains("billing:{x}"), "{keys}");
        assert_eq!(call.refusal("ERR something else", Flavor::STANDALONE), None);
    }

    /// Every argument of `cmd`, as text.
    fn words(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a simple argument>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_call_sends_its_keys_then_its_arguments_each_as_given() {
        let mut call = Call::new(Lua::Release);
        call.key("fl:{orders:7}")
            .key("fl:{orders:7}:fence")
            .arg("tok")
            .arg(42u64);
        let hash = Lua::Release
            .script(Flavor::STANDALONE)
            .get_hash()
            .to_owned();
        let sent = words(&call.evalsha(Flavor::STANDALONE));
        let expected = [
            "EVALSHA",
            hash.as_str(),
            "2",
            "fl:{orders:7}",
            "fl:{orders:7}:fence",
            "tok",
            "42",
        ];
        assert_eq!(sent, expected);
        assert_eq!(call.first_key(), Some("fl:{orders:7}"));

        // Empty arguments stay arguments; formatted ones (numbers) are one each.
        let mut call = Call::new(Lua::Acquire);
        call.key("k").arg("").arg(7u64).arg(-1i64).arg("x");
        let sent = words(&call.evalsha(Flavor::STANDALONE));
        assert_eq!(sent[2..], ["1", "k", "", "7", "-1", "x"]);
        // A second send is the same command, not built again.
        assert!(std::ptr::eq(
            &*call.evalsha(Flavor::STANDALONE),
            &*call.evalsha(Flavor::STANDALONE)
        ));
    }

    #[test]
    fn keys_given_as_arguments_are_named_in_errors() {
        let call = renew_across_slots([("fl:{a}", "tok", Duration::from_secs(1))].into_iter());
        assert_eq!(call.first_key(), Some("fl:{a}"));
        let refusal = call
            .refusal(
                "NOPERM this user has no permissions to access one of the keys used as arguments",
                Flavor::CLUSTER,
            )
            .unwrap();
        assert!(refusal.contains("fl:{a}, fl:{a}:holder"), "{refusal}");
    }
}
