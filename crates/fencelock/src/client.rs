//! The entry point: a [`Client`] holds the connection to Redis and hands out locks.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Node, Timeouts};
use crate::error::Error;
use crate::keys::{self, DEFAULT_PREFIX};
use crate::lock::LockBuilder;
use tokio_util::task::TaskTracker;

/// A connection to one Redis node, shared by every lock taken through it.
///
/// Cheap to clone; clones share the connection. The connection is multiplexed (many
/// locks, one socket) and reconnects by itself after a failure.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub node: Node,
    pub prefix: String,
    /// Releases sent in the background by dropped guards and abandoned acquires.
    pub background: TaskTracker,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("node", &self.inner.node.addr())
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

impl Client {
    /// Connects with default settings. See [`ClientBuilder`] for what they are.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the URL does not parse, [`Error::Unavailable`]
    /// when nothing answers there within the connect timeout, [`Error::Rejected`] when
    /// the server refuses the credentials.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-made connection.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::builder(url).connect().await
    }

    /// Starts configuring a client for the Redis node at `url`
    /// (`redis://[user:password@]host[:port][/db]`).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: ClientBuilder::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: ClientBuilder::DEFAULT_RESPONSE_TIMEOUT,
        }
    }

    /// Starts configuring the lock called `name`. Nothing is sent until
    /// [`LockBuilder::acquire`] or [`LockBuilder::try_acquire`].
    pub fn lock(&self, name: impl Into<String>) -> LockBuilder {
        LockBuilder::new(self.clone(), name.into())
    }

    /// The node this client talks to, as `host:port`.
    pub fn node(&self) -> &str {
        self.inner.node.addr()
    }

    /// Waits until every release this client sent in the background has finished: those
    /// of guards dropped unreleased and of acquires abandoned with an unknown outcome.
    ///
    /// Call it before a short-lived program exits, since a runtime that shuts down
    /// cancels its tasks, and a cancelled release leaves the key to its TTL. Each
    /// background release is bounded by the client's timeouts, so this returns within
    /// twice the connect timeout plus the response timeout of the last one started.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits; the releases go on in the background.
    pub async fn flush(&self) {
        let tracker = &self.inner.background;
        tracker.close();
        tracker.wait().await;
        tracker.reopen();
    }
}

/// Settings of a [`Client`]. Every setting has a default, listed with its method.
#[derive(Clone)]
pub struct ClientBuilder {
    url: String,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &crate::backend::redact(&self.url))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

impl ClientBuilder {
    /// Default for [`ClientBuilder::connect_timeout`]: 1 s.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
    /// Default for [`ClientBuilder::response_timeout`]: 1 s.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

    /// The prefix of every key (default `"fencelock"`; may be empty). It may not contain
    /// `{` or `}`. See the [key layout](crate::keys).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one connection attempt may take (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for a reply to one command (default 1 s). A command that gets no
    /// reply in time fails with [`Error::Unavailable`]; no call ever takes longer than
    /// twice the connect timeout plus the response timeout, reconnecting included.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Validates the settings and connects.
    ///
    /// # Errors
    /// As [`Client::connect`], and [`Error::InvalidArgument`] for a bad prefix or a zero
    /// timeout.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect(self) -> Result<Client, Error> {
        keys::validate_prefix(&self.prefix)?;
        for (what, t) in [
            ("connect timeout", self.connect_timeout),
            ("response timeout", self.response_timeout),
        ] {
            if t.is_zero() || t > Duration::from_secs(3600) {
                return Err(Error::invalid(
                    what,
                    format!("{t:?} is out of range; give a value between 1ms and 1h"),
                ));
            }
        }
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            response: self.response_timeout,
        };
        let node = Node::connect(&self.url, timeouts).await?;
        Ok(Client {
            inner: Arc::new(Inner {
                node,
                prefix: self.prefix,
                background: TaskTracker::new(),
            }),
        })
    }
}
