//! Key layout: which Redis keys one lock uses, and which names are valid.
//!
//! For a lock named `orders:42` under the default prefix `fencelock`:
//!
//! | key | type | holds | expires |
//! |---|---|---|---|
//! | `fencelock:{orders:42}` | string | the holder's [`HolderToken`](crate::HolderToken) | after the TTL |
//! | `fencelock:{orders:42}:fence` | string | the last [`FencingToken`](crate::FencingToken) handed out | 7 days after the last grant ([`ClientBuilder::fence_counter_idle`](crate::ClientBuilder::fence_counter_idle); the next grant reseeds it from the server clock) |
//! | `fencelock:{orders:42}:queue` | list | fair mode: owner tokens of the waiters, in arrival order | when empty, or 1.5 to 2 × a waiter timeout after the last waiter's last call |
//! | `fencelock:{orders:42}:waiters` | zset | fair mode: each waiter's deadline (server ms) to call again | likewise |
//! | `fencelock:{orders:42}:grants` | hash | fair mode: what each waiter asked for (its TTL and holder info), so a release can hand the lock over | likewise |
//! | `fencelock:{orders:42}:holder` | string | what the holder says about itself (host, pid, command), if it said anything | with the lock key |
//! | `fencelock:{orders:42}:wakes` | zset | plain mode's wake list: the [tags](#release-channels) of the clients with a waiting acquire, each scored with when it was listed (server ms); `*` when readers or reentrant owners wait behind a plain holder | when empty, or once the lease that refused the last listing has ended and a second more |
//!
//! A resource kept in Redis and written with
//! [`Client::fenced_write`](crate::Client::fenced_write) has one key of fencelock's,
//! `fencelock:{orders:42}:accepted` for the resource `orders:42`: a string, the highest
//! fencing token the resource accepted, which never expires (delete it with the
//! resource). It lives on the resource's Redis, which may be another than the lock's.
//!
//! A semaphore ([`SemaphoreBuilder`](crate::SemaphoreBuilder)) named `pool` uses
//! `fencelock:{pool}` as a zset instead (each holder's token, scored with the end of its
//! lease in server ms; it expires with the longest lease), `fencelock:{pool}:fence` as
//! a lock does but marked as a semaphore's (the digits after an `s`, `s1795325555103104`:
//! so a lock refuses the name even while no permit is held), and
//! `fencelock:{pool}:permits`, a string: its permit count, which expires like the
//! fencing counter.
//!
//! A read-write lock ([`ReadLockBuilder`](crate::ReadLockBuilder)) named `doc`
//! has one writer at a time, a plain or reentrant lock at `fencelock:{doc}` as above, or
//! readers, which make `fencelock:{doc}` a zset: each reader's token (`<token>:<owner>`
//! for a reader with an owner id) scored with the end of its lease in server ms, and the
//! member `rwlock` scored `+inf`, which tells it from a semaphore; it expires with the
//! longest lease. `fencelock:{doc}:writers` is a zset of the writers waiting for the
//! readers, each with a deadline (server ms) that its every attempt pushes on by its
//! lease; it expires with the last deadline. Grants of both sides come from one fencing
//! counter.
//!
//! ## Release channels
//!
//! Releases are announced on the pub/sub channel `fencelock:{orders:42}:released`: on
//! an empty message (a plain or reentrant release) each client wakes its longest-waiting
//! plain waiter and all its reentrant and fair waiters; a message carrying an owner token
//! wakes that waiter (the head of a fair queue). Each [`Client`](crate::Client) has a
//! random tag, and its own channel for each lock, `fencelock:{orders:42}:released:<tag>`.
//! A fair release that hands the lock to the head of the queue says so with `G TOKEN
//! FENCE PX` on the own channel of that waiter's client only. A plain release whose wake
//! list names a client wakes that client only, with an empty message on its own channel
//! (the client listed first, taken off the list; refused, it goes back to the head of
//! it); with nobody live listed, or readers or
//! reentrant owners waiting, it announces on the lock's channel, which every client
//! hears.
//!
//! A leader election ([`Election`](crate::Election)) named `scheduler` is a plain lock
//! at `fencelock:{scheduler}` whose holder is the leader; its holder info key,
//! `fencelock:{scheduler}:holder`, is the leader record (`term=<term> since_ms=<server
//! ms of the grant> <what the leader said about itself>`), renewed and deleted with the
//! lease. A campaign that wins and a leader that resigns each send an empty message on
//! `fencelock:{scheduler}:leader`, which the followers
//! ([`Election::observe`](crate::Election::observe)) listen to.
//!
//! The name sits in a hash tag (`{...}`), so every key of one lock maps to the same Redis
//! Cluster slot and one script can touch them all. That is why a name may not contain
//! `{` or `}`.

use crate::error::Error;

use crate::limits::MAX_NAME_LEN;

/// The Redis keys of one lock name. Only the lock key is stored (a guard keeps this for
/// as long as it lives); the others are derived when a script needs them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockKeys {
    /// The lock key: the holder's owner token (or a reentrant lock's hash), with an
    /// expiry.
    pub lock: String,
}

impl LockKeys {
    /// Validates `name` and lays out its keys under `prefix` (already validated).
    pub fn new(prefix: &str, name: &str) -> Result<Self, Error> {
        validate_name(name)?;
        // Pushed, not `format!`ted: made for every acquire (docs/benchmarks.md, "The
        // client's work per lock, counted").
        let mut lock = String::with_capacity(prefix.len() + name.len() + 3);
        if !prefix.is_empty() {
            lock.push_str(prefix);
            lock.push(':');
        }
        lock.push('{');
        lock.push_str(name);
        lock.push('}');
        Ok(Self { lock })
    }

    /// The lock key followed by `suffix`, in one allocation (these names are built for
    /// every script call).
    fn with_suffix(&self, suffix: &str) -> String {
        let mut key = String::with_capacity(self.lock.len() + suffix.len());
        key.push_str(&self.lock);
        key.push_str(suffix);
        key
    }

    /// The lock name, as it sits in the key's hash tag: what logs call the lock.
    pub fn name(&self) -> &str {
        name_in(&self.lock)
    }

    /// The fencing counter: expires after the client's
    /// [`fence_counter_idle`](crate::ClientBuilder::fence_counter_idle) without a grant.
    pub fn fence(&self) -> String {
        self.with_suffix(":fence")
    }

    /// Fair mode: the waiters' owner tokens, in arrival order.
    pub fn queue(&self) -> String {
        self.with_suffix(":queue")
    }

    /// Fair mode: each waiter's deadline to call again.
    pub fn waiters(&self) -> String {
        self.with_suffix(":waiters")
    }

    /// Fair mode: a HASH of each waiter's TTL and holder info, for a release that hands
    /// the lock over.
    pub fn grants(&self) -> String {
        self.with_suffix(":grants")
    }

    /// What the holder says about itself (set with
    /// [`LockBuilder::holder_info`](crate::LockBuilder::holder_info)): with the lock key's
    /// expiry, deleted with it.
    pub fn holder_info(&self) -> String {
        self.with_suffix(":holder")
    }

    /// A semaphore's permit count.
    pub fn permits(&self) -> String {
        self.with_suffix(":permits")
    }

    /// A read-write lock's writers waiting for its readers, each with a deadline.
    pub fn writers(&self) -> String {
        self.with_suffix(":writers")
    }

    /// Plain mode: the clients with a waiting acquire, each with a deadline, of which a
    /// release wakes one.
    pub fn wake_list(&self) -> String {
        self.with_suffix(":wakes")
    }

    /// The pub/sub channel releases are announced on.
    pub fn channel(&self) -> String {
        self.with_suffix(":released")
    }

    /// A leader election's channel: an empty message there says that the leader changed
    /// (a campaign won, a leader resigned).
    pub fn leader_channel(&self) -> String {
        self.with_suffix(":leader")
    }

    /// The release channel of one client (`client_tag`): where a fair handover or a
    /// wake by name reaches it.
    pub(crate) fn own_channel(&self, client_tag: &str) -> String {
        format!("{}:{client_tag}", self.channel())
    }
}

/// The key of a resource's fence in a fenced write to Redis
/// ([`Client::fenced_write`](crate::Client::fenced_write)): the highest token the
/// resource accepted, `<prefix>:{<resource>}:accepted`. Named as a lock is, so that the
/// keys of the resource that carry its name as hash tag share its Cluster slot.
pub(crate) fn fence_key(prefix: &str, resource: &str) -> Result<String, Error> {
    validate_name(resource).map_err(|e| match e {
        Error::InvalidArgument { reason, .. } => Error::invalid("resource name", reason),
        other => other,
    })?;
    Ok(if prefix.is_empty() {
        format!("{{{resource}}}:accepted")
    } else {
        format!("{prefix}:{{{resource}}}:accepted")
    })
}

/// The lock name inside a lock key: between the braces of its hash tag (neither the
/// prefix nor the name may contain a brace). The key itself if it has no hash tag.
pub(crate) fn name_in(key: &str) -> &str {
    match (key.find('{'), key.rfind('}')) {
        (Some(open), Some(close)) if open < close => &key[open + 1..close],
        _ => key,
    }
}

/// The Redis keys of one delay queue; see the layout on
/// [`DelayQueue`](crate::DelayQueue).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QueueKeys {
    pub due: String,
    pub in_flight: String,
    pub items: String,
    pub attempts: String,
    pub receipts: String,
    pub seq: String,
}

impl QueueKeys {
    /// Validates `name` and lays out its keys under `prefix` (already validated).
    pub fn new(prefix: &str, name: &str) -> Result<Self, Error> {
        validate_name(name).map_err(|e| match e {
            Error::InvalidArgument { reason, .. } => Error::invalid("queue name", reason),
            other => other,
        })?;
        let base = if prefix.is_empty() {
            format!("{{{name}}}:dq")
        } else {
            format!("{prefix}:{{{name}}}:dq")
        };
        Ok(Self {
            due: format!("{base}:due"),
            in_flight: format!("{base}:inflight"),
            items: format!("{base}:items"),
            attempts: format!("{base}:attempts"),
            receipts: format!("{base}:receipts"),
            seq: format!("{base}:seq"),
        })
    }
}

/// Checks a lock name without talking to Redis: non-empty, at most [`MAX_NAME_LEN`]
/// bytes, no `{`, `}` or control characters. Acquire runs the same check.
///
/// # Errors
/// [`Error::InvalidArgument`] saying what is wrong.
pub fn validate_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::invalid("lock name", "it is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::invalid(
            "lock name",
            format!(
                "it is {} bytes long; the limit is {MAX_NAME_LEN}",
                name.len()
            ),
        ));
    }
    if name.contains(['{', '}']) {
        return Err(Error::invalid(
            "lock name",
            format!("{name:?} contains '{{' or '}}', which would break the key's hash tag"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::invalid(
            "lock name",
            format!("{name:?} contains a control character"),
        ));
    }
    Ok(())
}

/// Checks a pattern of lock names for [`Client::list`](crate::Client::list): a Redis
/// glob (`*`, `?`, `[...]`, `\` escapes) with the rules of names, `*` allowed.
pub(crate) fn validate_pattern(pattern: &str) -> Result<(), Error> {
    if pattern.is_empty() {
        return Ok(());
    }
    validate_name(pattern).map_err(|e| match e {
        Error::InvalidArgument { reason, .. } => Error::invalid("lock name pattern", reason),
        other => other,
    })
}

/// The `SCAN MATCH` glob of the lock keys whose names match `pattern` (empty: all),
/// under `prefix` (glob characters in the prefix are escaped).
pub(crate) fn lock_key_glob(prefix: &str, pattern: &str) -> String {
    let mut glob = String::new();
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            glob.push('\\');
        }
        glob.push(c);
    }
    if !prefix.is_empty() {
        glob.push(':');
    }
    let pattern = if pattern.is_empty() { "*" } else { pattern };
    format!("{glob}{{{pattern}}}")
}

/// The lock name of lock key `key` under `prefix`, if it is a lock key (not a counter,
/// queue or info key).
pub(crate) fn name_of<'k>(prefix: &str, key: &'k str) -> Option<&'k str> {
    let rest = if prefix.is_empty() {
        key
    } else {
        key.strip_prefix(prefix)?.strip_prefix(':')?
    };
    rest.strip_prefix('{')?.strip_suffix('}')
}

/// Checks a key prefix: it may be empty, but may not contain a hash tag of its own.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), Error> {
    if prefix.contains(['{', '}']) {
        return Err(Error::invalid(
            "key prefix",
            format!("{prefix:?} contains '{{' or '}}'; the hash tag belongs to the lock name"),
        ));
    }
    if prefix.len() > MAX_NAME_LEN || prefix.chars().any(char::is_control) {
        return Err(Error::invalid(
            "key prefix",
            "it is too long or contains a control character",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = LockKeys::new("fencelock", "orders:42").unwrap();
        assert_eq!(k.lock, "fencelock:{orders:42}");
        assert_eq!(k.name(), "orders:42");
        assert_eq!(LockKeys::new("", "a:b").unwrap().name(), "a:b");
        assert_eq!(k.fence(), "fencelock:{orders:42}:fence");
        assert_eq!(k.queue(), "fencelock:{orders:42}:queue");
        assert_eq!(k.waiters(), "fencelock:{orders:42}:waiters");
        assert_eq!(k.grants(), "fencelock:{orders:42}:grants");
        assert_eq!(k.channel(), "fencelock:{orders:42}:released");
        assert_eq!(k.holder_info(), "fencelock:{orders:42}:holder");
        let k = LockKeys::new("", "x").unwrap();
        assert_eq!(k.lock, "{x}");
    }

    #[test]
    fn lock_keys_are_found_by_a_glob_and_read_back_as_names() {
        assert_eq!(
            lock_key_glob("fencelock", "orders:*"),
            "fencelock:{orders:*}"
        );
        assert_eq!(lock_key_glob("a*b", ""), "a\\*b:{*}");
        assert_eq!(lock_key_glob("", "x"), "{x}");
        assert_eq!(
            name_of("fencelock", "fencelock:{orders:42}"),
            Some("orders:42")
        );
        assert_eq!(name_of("fencelock", "fencelock:{orders:42}:fence"), None);
        assert_eq!(name_of("", "{x}"), Some("x"));
        assert_eq!(name_of("p", "q:{x}"), None);
    }

    #[test]
    fn bad_names_are_invalid_arguments() {
        for bad in ["", "a{b", "b}", "line\nbreak"] {
            let err = LockKeys::new("p", bad).unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument { .. }),
                "{bad:?}: {err}"
            );
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(
            LockKeys::new("p", &long),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(LockKeys::new("p", &"x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(matches!(
            validate_prefix("a{"),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn keys_share_the_hash_tag_and_stay_apart_from_lock_keys() {
        let k = QueueKeys::new("fencelock", "orders").unwrap();
        assert_eq!(k.due, "fencelock:{orders}:dq:due");
        assert_eq!(k.in_flight, "fencelock:{orders}:dq:inflight");
        assert_eq!(k.items, "fencelock:{orders}:dq:items");
        assert_eq!(k.attempts, "fencelock:{orders}:dq:attempts");
        assert_eq!(k.receipts, "fencelock:{orders}:dq:receipts");
        assert_eq!(k.seq, "fencelock:{orders}:dq:seq");
        assert_eq!(QueueKeys::new("", "q").unwrap().due, "{q}:dq:due");
        let lock = LockKeys::new("fencelock", "orders").unwrap();
        for key in [
            &k.due,
            &k.in_flight,
            &k.items,
            &k.attempts,
            &k.receipts,
            &k.seq,
        ] {
            assert_ne!(key, &lock.lock);
            assert_ne!(key, &lock.fence());
        }
    }

    #[test]
    fn bad_names_are_invalid_queue_names() {
        for bad in ["", "a{b", "b}", "line\nbreak"] {
            match QueueKeys::new("p", bad) {
                Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "queue name"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
