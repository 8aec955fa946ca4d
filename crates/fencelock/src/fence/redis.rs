//! A fenced write to a resource kept in Redis: [`FencedWrite`].

use std::time::Duration;

use crate::error::Error;
use crate::keys;
use crate::limits::MAX_FENCED_WRITES;
pub use crate::scripts::replies::Reply;
use crate::scripts::{self, FencedOp, replies::FencedWriteReply};
use crate::shared::Shared;
use crate::token::FencingToken;

/// Writes to a resource kept in Redis, applied only with a fencing token at least as
/// high as every token the resource accepted before; made by
/// [`Client::fenced_write`](crate::Client::fenced_write), sent by
/// [`apply`](Self::apply).
///
/// The writes run in one script, in the order given, all of them or none: the token is
/// compared with the highest one the resource accepted (kept at
/// `<prefix>:{<resource>}:accepted`, see [`keys`](crate::keys)), every write is checked
/// against the types of the keys before anything is written (an `HSET` on a list is
/// refused, not half done), then the token is recorded and the writes applied. With a
/// lower token nothing is written and [`apply`](Self::apply) returns
/// [`Error::Fenced`]. A write with no writes just checks and records the token.
///
/// On a Redis Cluster every key must share the slot of the resource's fence key: give
/// each key the resource's name as its hash tag (`{orders:42}:total` for the resource
/// `orders:42`); keys of another slot are refused before anything is sent. Elsewhere
/// any key goes.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fencelock::Error> {
/// # let redis = testkit::RedisServer::start();
/// # let url = redis.url();
/// let locks = fencelock::Client::connect(&url).await?;
/// let store = fencelock::Client::connect(&url).await?; // the resource's Redis: may be another
/// let guard = locks.lock("stock:42").try_acquire().await?;
/// store
///     .fenced_write(guard.name(), guard.fencing_token())
///     .set("{stock:42}:count", "17")
///     .incr_by("{stock:42}:sold", 1)
///     .apply()
///     .await?; // Err(Error::Fenced { .. }) once a newer holder has written
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a fenced write does nothing until it is applied"]
pub struct FencedWrite<'c> {
    client: &'c Shared,
    resource: String,
    token: FencingToken,
    /// Each key once, in the order first written.
    keys: Vec<String>,
    writes: Vec<FencedOp>,
    /// The first bad argument, reported by `apply`.
    invalid: Option<Error>,
}

impl<'c> FencedWrite<'c> {
    pub(crate) fn new(client: &'c Shared, resource: String, token: FencingToken) -> Self {
        Self {
            client,
            resource,
            token,
            keys: Vec::new(),
            writes: Vec::new(),
            invalid: None,
        }
    }

    fn push(mut self, command: &'static str, key: String, args: Vec<Vec<u8>>) -> Self {
        let index = match self.keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                self.keys.push(key);
                self.keys.len() - 1
            }
        };
        self.writes.push(FencedOp {
            command,
            key: index,
            args,
        });
        self
    }

    /// `SET key value`: whatever the key held is replaced.
    pub fn set(self, key: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.push("SET", key.into(), vec![value.as_ref().to_vec()])
    }

    /// `DEL key`.
    pub fn del(self, key: impl Into<String>) -> Self {
        self.push("DEL", key.into(), Vec::new())
    }

    /// `INCRBY key by`: the key must be absent or hold an integer. Refused, with nothing
    /// written, when the value or `by` is 2^62 or more in magnitude (where the sum could
    /// leave 64 bits).
    pub fn incr_by(self, key: impl Into<String>, by: i64) -> Self {
        self.push("INCRBY", key.into(), vec![by.to_string().into_bytes()])
    }

    /// `HSET key field value`: the key must be absent or a hash.
    pub fn hset(
        self,
        key: impl Into<String>,
        field: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Self {
        let args = vec![field.as_ref().to_vec(), value.as_ref().to_vec()];
        self.push("HSET", key.into(), args)
    }

    /// `RPUSH key value`: the key must be absent or a list.
    pub fn rpush(self, key: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.push("RPUSH", key.into(), vec![value.as_ref().to_vec()])
    }

    /// `LPUSH key value`: the key must be absent or a list.
    pub fn lpush(self, key: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.push("LPUSH", key.into(), vec![value.as_ref().to_vec()])
    }

    /// `XADD key * field value ...`: appends an entry to a stream (the key must be
    /// absent or a stream); at least one field.
    pub fn xadd<F, V>(
        mut self,
        key: impl Into<String>,
        fields: impl IntoIterator<Item = (F, V)>,
    ) -> Self
    where
        F: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let args: Vec<Vec<u8>> = fields
            .into_iter()
            .flat_map(|(f, v)| [f.as_ref().to_vec(), v.as_ref().to_vec()])
            .collect();
        if args.is_empty() {
            self.invalid
                .get_or_insert_with(|| Error::invalid("XADD", "give at least one field"));
        }
        self.push("XADD", key.into(), args)
    }

    /// `PEXPIRE key ms`: the key expires after `ttl` (at least 1 ms).
    pub fn expire(mut self, key: impl Into<String>, ttl: Duration) -> Self {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 {
            self.invalid.get_or_insert_with(|| {
                Error::invalid("expiry", "it is under 1 ms; use del() to delete a key")
            });
        }
        self.push("PEXPIRE", key.into(), vec![ms.to_string().into_bytes()])
    }

    /// Sends the writes: applies them all and records the token if it is at least the
    /// highest the resource accepted; writes nothing otherwise. Returns each write's
    /// reply, in order.
    ///
    /// # Errors
    /// [`Error::Fenced`] when the resource accepted a higher token (this holder lost its
    /// lock: stop writing); [`Error::InvalidArgument`] for a bad resource name, more
    /// than [`MAX_FENCED_WRITES`] writes, the fence key among the keys, keys of another
    /// Cluster slot, a Redlock client (a resource is one Redis), and the bad arguments
    /// above (nothing sent); [`Error::Rejected`] (`WRONGTYPE`, `ERR`) when a write would
    /// fail on what a key holds (nothing written); [`Error::WrongType`] when the fence
    /// key holds something else than a token; the node's errors
    /// ([`Error::Unavailable`], [`Error::Rejected`]).
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped, or timed out ([`Error::Unavailable`]), the writes may
    /// have been applied (all of them) or not. Read the resource to know.
    pub async fn apply(self) -> Result<Vec<Reply>, Error> {
        if let Some(invalid) = self.invalid {
            return Err(invalid);
        }
        let fence = keys::fence_key(&self.client.prefix, &self.resource)?;
        if self.writes.len() > MAX_FENCED_WRITES {
            return Err(Error::invalid(
                "fenced write",
                format!(
                    "it has {} writes; the limit is {MAX_FENCED_WRITES}",
                    self.writes.len()
                ),
            ));
        }
        let node = self.client.backend.only_node().ok_or_else(|| {
            Error::invalid(
                "client",
                "a fenced write goes to the one Redis that keeps the resource, not to \
                 Redlock nodes; connect a client to that Redis",
            )
        })?;
        for key in &self.keys {
            if *key == fence {
                return Err(Error::invalid(
                    "key",
                    format!("{key:?} is the resource's fence, which fencelock keeps"),
                ));
            }
            if node.is_cluster()
                && crate::backend::cluster::key_slot(key)
                    != crate::backend::cluster::key_slot(&fence)
            {
                return Err(Error::invalid(
                    "key",
                    format!(
                        "{key:?} is in another Redis Cluster slot than resource {:?}: give \
                         every key of the resource its name as hash tag, like \"{{{}}}:total\"",
                        self.resource, self.resource
                    ),
                ));
            }
        }
        let call = scripts::fenced_write(&fence, &self.keys, self.token, &self.writes);
        match node.run::<FencedWriteReply>(&call, None).await? {
            FencedWriteReply::Accepted(replies) => Ok(replies),
            FencedWriteReply::Refused(highest) => {
                crate::observe::fence_refused(
                    crate::observe::Store::Redis,
                    &self.resource,
                    self.token.get(),
                    highest.get(),
                );
                Err(Error::Fenced {
                    resource: self.resource,
                    token: self.token,
                    highest,
                })
            }
        }
    }
}
