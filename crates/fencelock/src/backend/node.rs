//! One Redis node: a multiplexed connection with explicit timeouts, script calls on it,
//! its release notifications, and the mapping of driver errors to fencelock's [`Error`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, FromRedisValue, RedisError, ScriptInvocation, ServerErrorKind};

use super::subscriber::Subscriber;
use crate::error::{DriverError, Error, HumanDuration, UnavailableReason};
use crate::scripts::replies;

/// Timeouts for one node's connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

/// One Redis node: a multiplexed connection that reconnects by itself, shared by every
/// lock of a client. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Node {
    /// `host:port`, never with credentials: it goes into error messages.
    addr: String,
    conn: ConnectionManager,
    /// The longest one call may take, reconnecting included.
    call_timeout: Duration,
    /// Release notifications for waiters; connects on first use.
    subscriber: Subscriber,
    /// Redlock: what this node said about itself last.
    health: Arc<Mutex<Health>>,
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

impl Node {
    /// Sets up the node at `url`. `eager`: connect now, failing fast when nothing
    /// answers; otherwise the first call connects (a Redlock node, a minority of which
    /// may be down when the client starts, or a lazy client).
    pub async fn open(url: &str, timeouts: Timeouts, eager: bool) -> Result<Self, Error> {
        let client = redis::Client::open(url).map_err(|e| {
            Error::invalid(
                "Redis URL",
                format!(
                    "{} does not parse ({}); expected redis://[user:password@]host[:port][/db]",
                    redact(url),
                    e.detail().unwrap_or(e.category())
                ),
            )
        })?;
        let addr = client.get_connection_info().addr().to_string();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response))
            // One quick retry: a lock caller would rather hear "unavailable" than wait
            // through a long reconnect schedule. Later calls reconnect again.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        let call_timeout = timeouts.connect * 2 + timeouts.response + Duration::from_millis(250);
        let subscriber = Subscriber::new(client.clone(), timeouts);
        let conn = if eager {
            let connecting = ConnectionManager::new_with_config(client, config);
            match tokio::time::timeout(call_timeout, connecting).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => return Err(map_error(&addr, &e)),
                Err(_) => return Err(timed_out(&addr, call_timeout)),
            }
        } else {
            ConnectionManager::new_lazy_with_config(client, config)
                .map_err(|e| map_error(&addr, &e))?
        };
        Ok(Self {
            addr,
            conn,
            call_timeout,
            subscriber,
            health: Arc::new(Mutex::new(Health::default())),
        })
    }

    /// The node's `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Redlock: who the node is, and its restart protection.
    pub fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The node's release notifications.
    pub fn subscriber(&self) -> &Subscriber {
        &self.subscriber
    }

    /// Runs a script within `within` (a Redlock node's share of an operation), or else
    /// within the call timeout.
    ///
    /// Cancel safety: dropping the future (or a timeout) may leave the script running on
    /// the server, or already run; callers that write must treat that as an unknown
    /// outcome.
    pub async fn run<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        within: Option<Duration>,
    ) -> Result<T, Error> {
        let within = within.unwrap_or(self.call_timeout);
        let mut conn = self.conn.clone();
        match tokio::time::timeout(within, invocation.invoke_async(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(map_error(&self.addr, &e)),
            Err(_) => Err(timed_out(&self.addr, within)),
        }
    }

    /// Every key matching the glob `pattern`, by `SCAN` (never `KEYS`, which blocks the
    /// server), each call within the call timeout.
    pub async fn scan(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let mut conn = self.conn.clone();
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
            let (next, found): (u64, Vec<String>) =
                match tokio::time::timeout(self.call_timeout, page.query_async(&mut conn)).await {
                    Ok(Ok(reply)) => reply,
                    Ok(Err(e)) => return Err(map_error(&self.addr, &e)),
                    Err(_) => return Err(timed_out(&self.addr, self.call_timeout)),
                };
            keys.extend(found);
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    }

    /// Asks the server who it is: its run id, random for every start of a server
    /// process. Two nodes with one run id are one server.
    pub async fn run_id(&self, within: Duration) -> Result<String, Error> {
        let mut conn = self.conn.clone();
        let info = redis::cmd("INFO").arg("server").to_owned();
        let text: String = match tokio::time::timeout(within, info.query_async(&mut conn)).await {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => return Err(map_error(&self.addr, &e)),
            Err(_) => return Err(timed_out(&self.addr, within)),
        };
        text.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|id| id.trim().to_owned())
            .filter(|id| !id.is_empty())
            .ok_or_else(|| Error::Rejected {
                node: self.addr.clone(),
                code: "ERR".to_owned(),
                message: "INFO server has no run_id: is this a Redis server?".to_owned(),
            })
    }
}

fn timed_out(addr: &str, after: Duration) -> Error {
    Error::Unavailable {
        node: addr.to_owned(),
        reason: UnavailableReason::TimedOut,
        detail: format!("no answer within {}", HumanDuration(after)),
        source: None,
    }
}

/// Sorts a driver error into the variant the caller acts on.
fn map_error(addr: &str, e: &RedisError) -> Error {
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

/// Hides the password of a Redis URL, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_owned(),
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
    }
}
