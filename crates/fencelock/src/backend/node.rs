//! One Redis node: a multiplexed connection with explicit timeouts, script calls on it,
//! its release notifications, and the mapping of driver errors to fencelock's [`Error`].

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind};
use tokio_util::sync::CancellationToken;

use super::access::{self, Access};
use super::sentinel::{self, SentinelUrl};
use super::subscriber::Subscriber;
use crate::error::{DriverError, Error, HumanDuration, UnavailableReason};
use crate::scripts::{Call, replies};

/// Timeouts for one node's connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

/// One Redis node: a multiplexed connection that reconnects by itself, shared by every
/// lock of a client. Cheap to clone. The node is either fixed (one address) or a
/// Sentinel-managed master, whose address follows failovers.
#[derive(Clone)]
pub(crate) struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    /// Sentinel: how to find the master; `None` for a fixed address.
    sentinel: Option<SentinelUrl>,
    /// The connection in use, and the address it goes to.
    current: RwLock<Current>,
    /// Held while the sentinels are asked, so that one caller asks and the others wait.
    resolving: tokio::sync::Mutex<()>,
    timeouts: Timeouts,
    /// The longest one call may take, reconnecting included.
    call_timeout: Duration,
    /// Release notifications for waiters; connects on first use.
    subscriber: Subscriber,
    /// Redlock: what this node said about itself last.
    health: Mutex<Health>,
    /// Cancelled when the node is dropped: its Sentinel watcher stops.
    closed: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// Where calls go now.
#[derive(Clone)]
struct Current {
    /// `host:port`, never with credentials: it goes into error messages.
    addr: String,
    client: redis::Client,
    conn: ConnectionManager,
    /// Bumped at every switch, so that a caller knows whether someone switched already.
    epoch: u64,
}

/// What a Redlock client remembers of a node: who it is (two nodes that are one server
/// must not vote twice), and whether it restarted recently (and may have lost the locks
/// it held, so it must not vote too soon).
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// The server's run id when last seen; a change means it restarted.
    pub run_id: Option<String>,
    /// Its vote does not count before this.
    pub quarantined_until: Option<Instant>,
}

impl Health {
    /// Records the run id the node just reported; true if it replaced another one (the
    /// server restarted since it was last seen).
    pub fn observe(&mut self, run_id: &str) -> bool {
        let restarted = self.run_id.as_deref().is_some_and(|known| known != run_id);
        if self.run_id.as_deref() != Some(run_id) {
            self.run_id = Some(run_id.to_owned());
        }
        restarted
    }
}

fn manager_config(timeouts: Timeouts) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(Some(timeouts.response))
        // One quick retry: a lock caller would rather hear "unavailable" than wait
        // through a long reconnect schedule. Later calls reconnect again.
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(200))
}

impl Node {
    /// Sets up the node at `url` (`redis://`, `redis+unix://`, or
    /// `redis+sentinel://`). `eager`: connect now (for Sentinel: find the master now),
    /// failing fast when nothing answers; otherwise the first call connects (a Redlock
    /// node, a minority of which may be down when the client starts, or a lazy client).
    pub async fn open(
        url: &str,
        timeouts: Timeouts,
        access: &Access,
        eager: bool,
    ) -> Result<Self, Error> {
        let call_timeout = timeouts.connect * 2 + timeouts.response + Duration::from_millis(250);
        let sentinel = SentinelUrl::parse(url, access)?;
        let (addr, client) = match &sentinel {
            None => {
                let client = access::client_for_url(url, access)?;
                (client.get_connection_info().addr().to_string(), client)
            }
            Some(s) if eager => sentinel::resolve(s, call_timeout).await?,
            // Not asked yet: the first call asks the sentinels.
            Some(s) => (s.label(), s.master("0.0.0.0", 1)?),
        };
        let conn = if eager {
            let connecting =
                ConnectionManager::new_with_config(client.clone(), manager_config(timeouts));
            match tokio::time::timeout(call_timeout, connecting).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => return Err(map_error(&addr, &client, &e)),
                Err(_) => return Err(timed_out(&addr, call_timeout)),
            }
        } else {
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(timeouts))
                .map_err(|e| map_error(&addr, &client, &e))?
        };
        // A lazy Sentinel node has asked nobody yet: epoch 0 makes the first call ask.
        let epoch = u64::from(eager || sentinel.is_none());
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| {
            let source = weak.clone();
            let subscriber = Subscriber::new(
                Arc::new(move || source.upgrade().map(|n| read(&n.current).client.clone())),
                timeouts,
            );
            Inner {
                sentinel,
                current: RwLock::new(Current {
                    addr,
                    client,
                    conn,
                    epoch,
                }),
                resolving: tokio::sync::Mutex::new(()),
                timeouts,
                call_timeout,
                subscriber,
                health: Mutex::new(Health::default()),
                closed: CancellationToken::new(),
            }
        });
        if inner.sentinel.is_some() {
            watch_switches(&inner);
        }
        Ok(Self { inner })
    }

    /// The node's `host:port` (a Sentinel node's current master).
    pub fn addr(&self) -> String {
        read(&self.inner.current).addr.clone()
    }

    /// Redlock: who the node is, and its restart protection.
    pub fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.inner
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The node's release notifications.
    pub fn subscriber(&self) -> &Subscriber {
        &self.inner.subscriber
    }

    /// The connection to use now: for a Sentinel node that has not asked the sentinels
    /// yet, after asking them.
    async fn current(&self) -> Result<Current, Error> {
        let current = read(&self.inner.current).clone();
        if current.epoch == 0 {
            self.inner.switch(0).await?;
            return Ok(read(&self.inner.current).clone());
        }
        Ok(current)
    }

    /// Runs a script within `within` (a Redlock node's share of an operation), or else
    /// within the call timeout. A Sentinel node whose master answers that it is a replica
    /// or cannot be reached asks the sentinels again and, if they name another master,
    /// sends the script there once more (within what is left of the time).
    ///
    /// Cancel safety: dropping the future (or a timeout) may leave the script running on
    /// the server, or already run; callers that write must treat that as an unknown
    /// outcome.
    pub async fn run<T: FromRedisValue>(
        &self,
        call: &Call,
        within: Option<Duration>,
    ) -> Result<T, Error> {
        let within = within.unwrap_or(self.inner.call_timeout);
        let deadline = tokio::time::Instant::now() + within;
        let attempt = async {
            let current = self.current().await?;
            let mut conn = current.conn.clone();
            match call.invocation().invoke_async(&mut conn).await {
                Ok(v) => Ok(v),
                Err(e) if self.inner.sentinel.is_some() && master_may_have_moved(&e) => {
                    // Ask again; go on only if the sentinels name another master.
                    let moved = self.inner.switch(current.epoch).await.unwrap_or(false);
                    if !moved {
                        return Err(refused(call, current.error(&e)));
                    }
                    let current = read(&self.inner.current).clone();
                    let mut conn = current.conn.clone();
                    call.invocation()
                        .invoke_async(&mut conn)
                        .await
                        .map_err(|e| refused(call, current.error(&e)))
                }
                Err(e) => Err(refused(call, current.error(&e))),
            }
        };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(result) => result,
            Err(_) => Err(timed_out(&self.addr(), within)),
        }
    }

    /// Every key matching the glob `pattern`, by `SCAN` (never `KEYS`, which blocks the
    /// server), each call within the call timeout.
    pub async fn scan(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let current = self.current().await?;
        let mut conn = current.conn.clone();
        let mut keys = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let page = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .to_owned();
            let within = self.inner.call_timeout;
            let (next, found): (u64, Vec<String>) =
                match tokio::time::timeout(within, page.query_async(&mut conn)).await {
                    Ok(Ok(reply)) => reply,
                    Ok(Err(e)) => return Err(current.error(&e)),
                    Err(_) => return Err(timed_out(&current.addr, within)),
                };
            keys.extend(found);
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    }

    /// `WAIT replicas timeout`: how many replicas acknowledged this connection's writes so
    /// far, waiting up to `within` (at most three quarters of the response timeout) for
    /// `replicas` of them; and how long that was. A server that refuses `WAIT` (some
    /// managed services do) gives [`Error::Rejected`] saying so.
    pub async fn wait_replicas(
        &self,
        replicas: u32,
        within: Duration,
    ) -> Result<(u32, Duration), Error> {
        let within = within.min(self.inner.timeouts.response * 3 / 4);
        let current = self.current().await?;
        let mut conn = current.conn.clone();
        let wait = redis::cmd("WAIT")
            .arg(replicas)
            .arg(within.as_millis() as u64)
            .to_owned();
        let bound = within + self.inner.timeouts.response;
        match tokio::time::timeout(bound, wait.query_async::<i64>(&mut conn)).await {
            Ok(Ok(n)) => Ok((u32::try_from(n).unwrap_or(0), within)),
            Ok(Err(e))
                if e.code().is_some() && !matches!(e.code(), Some("NOAUTH" | "WRONGPASS")) =>
            {
                Err(Error::Rejected {
                    node: current.addr.clone(),
                    code: e.code().unwrap_or("ERR").to_owned(),
                    message: format!(
                        "the server refuses WAIT ({}), so replica acknowledgement cannot be \
                         checked there: ask for no replicas",
                        e.detail().unwrap_or_default()
                    ),
                })
            }
            Ok(Err(e)) => Err(current.error(&e)),
            Err(_) => Err(timed_out(&current.addr, bound)),
        }
    }

    /// Asks the server who it is: its run id, random for every start of a server
    /// process. Two nodes with one run id are one server.
    pub async fn run_id(&self, within: Duration) -> Result<String, Error> {
        let current = self.current().await?;
        let mut conn = current.conn.clone();
        let info = redis::cmd("INFO").arg("server").to_owned();
        let text: String = match tokio::time::timeout(within, info.query_async(&mut conn)).await {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => return Err(current.error(&e)),
            Err(_) => return Err(timed_out(&current.addr, within)),
        };
        text.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|id| id.trim().to_owned())
            .filter(|id| !id.is_empty())
            .ok_or_else(|| Error::Rejected {
                node: current.addr.clone(),
                code: "ERR".to_owned(),
                message: "INFO server has no run_id: is this a Redis server?".to_owned(),
            })
    }
}

impl Inner {
    /// Asks the sentinels for the master and switches to it if it is another one; true
    /// if the connection now goes elsewhere than it did at `seen` (its epoch). One caller
    /// asks at a time; one that waited finds the switch done.
    async fn switch(&self, seen: u64) -> Result<bool, Error> {
        let Some(url) = &self.sentinel else {
            return Ok(false);
        };
        let _asking = self.resolving.lock().await;
        let current = read(&self.current).clone();
        if current.epoch != seen {
            return Ok(true); // someone switched meanwhile
        }
        let (addr, client) = sentinel::resolve(url, self.call_timeout).await?;
        if addr == current.addr && current.epoch != 0 {
            return Ok(false);
        }
        let conn =
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(self.timeouts))
                .map_err(|e| map_error(&addr, &client, &e))?;
        if current.epoch != 0 {
            tracing::warn!(
                service = %url.service,
                from = %current.addr,
                to = %addr,
                "the Sentinel-managed master moved; following it"
            );
        }
        *write(&self.current) = Current {
            addr,
            client,
            conn,
            epoch: current.epoch + 1,
        };
        Ok(true)
    }
}

/// Follows `+switch-master` announcements of the node's service, one sentinel at a time,
/// until the node is dropped.
fn watch_switches(inner: &Arc<Inner>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return; // no runtime: errors on the old master make the node ask again
    };
    let weak = Arc::downgrade(inner);
    let closed = inner.closed.clone();
    let Some(url) = inner.sentinel.clone() else {
        return;
    };
    runtime.spawn(async move {
        let mut next = 0;
        loop {
            tokio::select! {
                () = closed.cancelled() => return,
                i = sentinel::switch_announced(&url, next, Duration::from_millis(500)) => next = i,
            }
            let Some(inner) = weak.upgrade() else { return };
            let seen = read(&inner.current).epoch;
            if let Err(e) = inner.switch(seen).await {
                tracing::debug!(service = %url.service, error = %e, "asking the sentinels after a switch failed");
            }
        }
    });
}

/// Whether an error says that a Sentinel node's master may be another one now: it was
/// demoted (`READONLY`), lost its master role (`MASTERDOWN`), or is gone.
fn master_may_have_moved(e: &RedisError) -> bool {
    matches!(e.code(), Some("READONLY" | "MASTERDOWN"))
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(e.kind(), ErrorKind::Io)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn timed_out(addr: &str, after: Duration) -> Error {
    Error::Unavailable {
        node: addr.to_owned(),
        reason: UnavailableReason::TimedOut,
        detail: format!("no answer within {}", HumanDuration(after)),
        source: None,
    }
}

/// An ACL refusal of `call`, said so that the user knows what to allow; other errors as
/// they are.
fn refused(call: &Call, error: Error) -> Error {
    match error {
        Error::Rejected {
            node,
            code,
            message,
        } => match call.refusal(&message) {
            Some(message) => Error::Rejected {
                node,
                code: "NOPERM".to_owned(),
                message,
            },
            None => Error::Rejected {
                node,
                code,
                message,
            },
        },
        other => other,
    }
}

impl Current {
    /// A driver error of this connection, sorted (see [`map_error`]).
    fn error(&self, e: &RedisError) -> Error {
        map_error(&self.addr, &self.client, e)
    }
}

/// Sorts a driver error of `client`'s connection into the variant the caller acts on;
/// a connection that breaks or times out as a TLS/plain mix-up does gets a hint.
fn map_error(addr: &str, client: &redis::Client, e: &RedisError) -> Error {
    let tls = matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    );
    match sort_error(addr, e) {
        Error::Unavailable {
            node,
            reason: reason @ (UnavailableReason::TimedOut | UnavailableReason::Io),
            detail,
            source,
        } if detail.is_empty() => {
            let detail = match (tls, reason) {
                (true, UnavailableReason::TimedOut) => {
                    "no TLS handshake: if the port is not a TLS port, use redis://"
                }
                (false, UnavailableReason::Io) if e.to_string().contains("reset by peer") => {
                    "if the port is a TLS port (which drops plain connections), use rediss://"
                }
                _ => "",
            };
            Error::Unavailable {
                node,
                reason,
                detail: detail.to_owned(),
                source,
            }
        }
        other => other,
    }
}

/// Sorts a driver error into the variant the caller acts on.
fn sort_error(addr: &str, e: &RedisError) -> Error {
    if let Some(problem) = access::certificate_problem(e) {
        return Error::Unavailable {
            node: addr.to_owned(),
            reason: UnavailableReason::Tls,
            detail: problem,
            source: None,
        };
    }
    if let Some((key, found)) = replies::wrong_type(e) {
        return Error::WrongType {
            node: addr.to_owned(),
            key,
            found,
        };
    }
    if e.detail().is_some_and(|d| d.contains("unauthenticated")) {
        // Redis caps what an unauthenticated connection may send, and answers a longer
        // request with a protocol error instead of NOAUTH.
        return Error::Rejected {
            node: addr.to_owned(),
            code: "NOAUTH".to_owned(),
            message: "NOAUTH authentication required".to_owned(),
        };
    }
    let message = || {
        let mut m = e.code().unwrap_or_default().to_owned();
        if let Some(d) = e.detail() {
            if !m.is_empty() {
                m.push(' ');
            }
            m.push_str(d);
        }
        if m.is_empty() { e.to_string() } else { m }
    };
    let unavailable = |reason| Error::Unavailable {
        node: addr.to_owned(),
        reason,
        detail: String::new(),
        source: Some(DriverError::new(e.clone())),
    };
    if e.is_timeout() {
        return unavailable(UnavailableReason::TimedOut);
    }
    if e.is_connection_refusal() {
        return unavailable(UnavailableReason::Refused);
    }
    match e.kind() {
        ErrorKind::Io => unavailable(UnavailableReason::Io),
        ErrorKind::AuthenticationFailed => Error::Rejected {
            node: addr.to_owned(),
            code: "WRONGPASS".to_owned(),
            message: "authentication failed: wrong user name or password".to_owned(),
        },
        ErrorKind::Server(ServerErrorKind::BusyLoading) => unavailable(UnavailableReason::Io),
        _ if e.code().is_some() => Error::Rejected {
            node: addr.to_owned(),
            code: e.code().unwrap_or_default().to_owned(),
            message: message(),
        },
        _ => Error::Rejected {
            node: addr.to_owned(),
            code: "ERR".to_owned(),
            message: e.to_string(),
        },
    }
}

/// Hides the credentials of a Redis URL, for messages: the user and password before the
/// host (`redis://***@host:port`), and the value of every query parameter whose name
/// holds `pass` (`sentinel_password`, a `redis+unix://` URL's `pass`). Errs on the side
/// of hiding: a password with an unencoded `@`, `/`, `?` or `#` is hidden whole, and a
/// string without `://` is hidden up to its last `@`.
pub(crate) fn redact(url: &str) -> String {
    // The query's secrets first, so that an `@` in one of them is gone before the
    // user part is looked for.
    let url = match url.split_once('?') {
        Some((base, query)) => {
            let mut out = format!("{base}?");
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((key, _)) if key.to_ascii_lowercase().contains("pass") => {
                        out.push_str(key);
                        out.push_str("=***");
                    }
                    _ => out.push_str(pair),
                }
            }
            out
        }
        None => url.to_owned(),
    };
    let start = url.find("://").map_or(0, |i| i + 3);
    match url.rfind('@') {
        Some(at) if at >= start => format!("{}***{}", &url[..start], &url[at..]),
        _ => url,
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_credentials() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("nonsense"), "nonsense");
        // An unencoded `@` or `?` in the password.
        assert_eq!(redact("redis://:p@w?x@h:1"), "redis://***@h:1");
        // The sentinels' password in the query, with or without an `@` in it.
        assert_eq!(
            redact("redis+sentinel://u:pw@h:1,h:2/svc?sentinel_password=s@p&x=1"),
            "redis+sentinel://***@h:1,h:2/svc?sentinel_password=***&x=1"
        );
        assert_eq!(
            redact("redis+sentinel://h:1/svc?sentinel_password=sp"),
            "redis+sentinel://h:1/svc?sentinel_password=***"
        );
        // A Unix socket URL's password.
        assert_eq!(
            redact("redis+unix:///tmp/r.sock?db=1&pass=pw"),
            "redis+unix:///tmp/r.sock?db=1&pass=***"
        );
        // No scheme.
        assert_eq!(redact("u:pw@h:1"), "***@h:1");
    }
}
