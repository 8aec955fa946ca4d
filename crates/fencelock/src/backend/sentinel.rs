//! Sentinel-managed masters: the `redis+sentinel://` URL, finding the master through the
//! sentinels and checking it with `ROLE`, and following failovers.
//!
//! The driver's own Sentinel support resolves the master once; a lock client must follow
//! it. A Sentinel node ([`super::node::Node`]) asks the sentinels again when the master
//! it talks to answers `READONLY` (it was demoted) or `MASTERDOWN`, or cannot be reached,
//! and when a sentinel announces `+switch-master` for its service (a task subscribed on
//! one sentinel at a time).

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

use super::access::{self, Access, TlsSettings};
use super::errors::{
    Scheme, certificate_problem, is_port_hint, new_connection_hint, port_hint_reason, redact,
};
use crate::error::{Error, UnavailableReason};

/// A parsed `redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[/DB]`
/// URL, with the sentinels' own credentials in the query
/// (`?sentinel_username=...&sentinel_password=...`, when they differ from the master's).
#[derive(Clone)]
pub(crate) struct SentinelUrl {
    pub sentinels: Vec<(String, u16)>,
    pub service: String,
    db: i64,
    username: Option<String>,
    password: Option<String>,
    sentinel_username: Option<String>,
    sentinel_password: Option<String>,
    /// `rediss+sentinel://`: the sentinels and the master over TLS, with these settings.
    tls: Option<TlsSettings>,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

impl SentinelUrl {
    /// `Ok(None)` when `url` is not a Sentinel URL (`redis+sentinel://`, or
    /// `rediss+sentinel://` for TLS with `tls`).
    pub fn parse(url: &str, access: &Access) -> Result<Option<Self>, Error> {
        let (rest, tls) = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            // Without TLS, TLS settings would go unused: a mistake, said as for redis://.
            if access.tls.given() {
                return Err(TlsSettings::without_tls());
            }
            (rest, None)
        } else if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
            (rest, Some(access.tls.clone()))
        } else {
            return Ok(None);
        };
        let bad = |why: &str| {
            Error::invalid(
                "Redis URL",
                format!(
                    "{} does not parse ({why}); expected \
                     redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[/DB]",
                    redact(url)
                ),
            )
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (username, password, rest) = access::split_credentials(rest);
        let (hosts, path) = rest.split_once('/').ok_or_else(|| bad("no service name"))?;
        let mut parts = path.split('/');
        let service = parts
            .next()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("no service name"))?;
        let db = match parts.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse()
                .map_err(|_| bad("the database is not a number"))?,
        };
        if parts.next().is_some() {
            return Err(bad("too many path parts"));
        }
        let sentinels = access::host_list(hosts, "sentinel", bad)?;
        let mut sentinel_username = None;
        let mut sentinel_password = None;
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some(("sentinel_username", v)) => sentinel_username = Some(decode(v)),
                Some(("sentinel_password", v)) => sentinel_password = Some(decode(v)),
                _ => return Err(bad("an unknown query parameter")),
            }
        }
        Ok(Some(Self {
            sentinels,
            service: service.to_owned(),
            db,
            username: access.username.clone().or(username),
            password: access.password.clone().or(password),
            sentinel_username,
            sentinel_password,
            tls,
        }))
    }

    /// For messages: `service "mymaster" (sentinels h:p,h:p)`, never a password.
    pub fn label(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect();
        format!(
            "service {:?} (sentinels {})",
            self.service,
            sentinels.join(",")
        )
    }

    /// How to reach the master at `host:port`, with the master's credentials.
    pub fn master(&self, host: &str, port: u16) -> Result<redis::Client, Error> {
        self.client(
            host,
            port,
            redis_info(self.db, &self.username, &self.password),
        )
    }

    fn sentinel(&self, i: usize) -> Result<redis::Client, Error> {
        let (host, port) = &self.sentinels[i];
        self.client(
            host,
            *port,
            redis_info(0, &self.sentinel_username, &self.sentinel_password),
        )
    }

    fn client(
        &self,
        host: &str,
        port: u16,
        redis: RedisConnectionInfo,
    ) -> Result<redis::Client, Error> {
        let addr = match &self.tls {
            None => ConnectionAddr::Tcp(host.to_owned(), port),
            Some(_) => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            },
        };
        let info = addr
            .into_connection_info()
            .map_err(|e| Error::invalid("Redis URL", e.to_string()))?
            .set_redis_settings(redis);
        let none = TlsSettings::default();
        access::client(info, self.tls.as_ref().unwrap_or(&none))
    }

    fn sentinel_addr(&self, i: usize) -> String {
        let (h, p) = &self.sentinels[i];
        format!("{h}:{p}")
    }
}

fn redis_info(
    db: i64,
    username: &Option<String>,
    password: &Option<String>,
) -> RedisConnectionInfo {
    let mut info = RedisConnectionInfo::default().set_db(db);
    if let Some(u) = username {
        info = info.set_username(u.clone());
    }
    if let Some(p) = password {
        info = info.set_password(p.clone());
    }
    access::quiet(info)
}

/// Percent-decoding for the user name and password parts of a URL.
fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Asks every sentinel for the master of the service, at once, each within `within`,
/// and checks the answer with `ROLE`. Returns the master's `host:port` and a client for
/// it.
///
/// Errors, each one line: every sentinel down ([`Error::Unavailable`]), or refused by
/// TLS (reason [`Tls`](UnavailableReason::Tls), naming the certificate problem); no sentinel
/// knows the service, or the sentinels disagree with no majority ([`Error::Rejected`]);
/// the master they name is not a master (yet): a failover in progress
/// ([`Error::Unavailable`], retry).
pub(crate) async fn resolve(
    url: &SentinelUrl,
    within: Duration,
) -> Result<(String, redis::Client), Error> {
    let asks = (0..url.sentinels.len()).map(|i| ask_sentinel(url, i, within));
    let (host, port) = elect(url, join_all(asks).await)?;
    let addr = format!("{host}:{port}");
    let master = url.master(&host, port)?;
    let role = role(&addr, &master, within).await?;
    if role != "master" {
        return Err(Error::Unavailable {
            node: addr,
            reason: UnavailableReason::Io,
            detail: format!(
                "the sentinels name it master of {:?}, but it says {role:?}: a failover in progress?",
                url.service
            ),
            source: None,
        });
    }
    Ok((addr, master))
}

/// What sentinel `i` names as the service's master (`None`: it knows no such service),
/// or why it named none.
async fn ask_sentinel(
    url: &SentinelUrl,
    i: usize,
    within: Duration,
) -> Result<Option<(String, u16)>, Error> {
    let client = url.sentinel(i)?;
    let ask = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&url.service)
            .query_async::<Option<(String, u16)>>(&mut conn)
            .await
    };
    match tokio::time::timeout(within, ask).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) if auth_refused(&e) => Err(Error::Rejected {
            node: url.sentinel_addr(i),
            code: e.code().unwrap_or("WRONGPASS").to_owned(),
            message: "the sentinel refuses the credentials: the sentinels' own go in the \
                      URL's sentinel_username and sentinel_password"
                .to_owned(),
        }),
        Ok(Err(e)) if not_a_sentinel(&e) => Err(Error::Rejected {
            node: url.sentinel_addr(i),
            code: "NOTSENTINEL".to_owned(),
            message: "this server answers but is not a sentinel (it has no SENTINEL \
                      command): a redis+sentinel:// URL lists the sentinels (port 26379 \
                      by default); for a server itself, use redis://"
                .to_owned(),
        }),
        Ok(Err(e)) => Err(unanswered(url, i, &e)),
        Err(_) => Err(Error::Unavailable {
            node: url.sentinel_addr(i),
            reason: UnavailableReason::TimedOut,
            detail: "the sentinel did not answer".to_owned(),
            source: None,
        }),
    }
}

/// Why sentinel `i` gave no answer, from the driver's error: a certificate problem, a
/// port of the wrong kind (TLS or not, or not Redis at all: see
/// [`new_connection_hint`]; each ask has a connection of its own), nothing listening, no
/// answer in time, or a broken connection.
fn unanswered(url: &SentinelUrl, i: usize, e: &redis::RedisError) -> Error {
    let unavailable = |reason, detail: String| Error::Unavailable {
        node: url.sentinel_addr(i),
        reason,
        detail: format!("sentinel: {detail}"),
        source: None,
    };
    if let Some(problem) = certificate_problem(e) {
        return unavailable(UnavailableReason::Tls, problem);
    }
    if let Some(hint) = new_connection_hint(e, url.tls.is_some(), Scheme::Sentinel) {
        return unavailable(port_hint_reason(&hint), hint);
    }
    if e.is_connection_refusal() {
        return unavailable(UnavailableReason::Refused, e.to_string());
    }
    if e.is_timeout() || e.to_string().contains("timed out") {
        return unavailable(
            UnavailableReason::TimedOut,
            "it did not answer in time: is it a sentinel, and its port?".to_owned(),
        );
    }
    unavailable(UnavailableReason::Io, e.to_string())
}

/// The master that most of the sentinels that answered name, from every sentinel's
/// `answer`; an error when none answered, none knows the service, or no master has a
/// majority (a failover under way, or sentinels of different setups).
fn elect(
    url: &SentinelUrl,
    answers: Vec<Result<Option<(String, u16)>, Error>>,
) -> Result<(String, u16), Error> {
    let answered = answers.iter().filter(|a| a.is_ok()).count();
    if answered == 0 {
        return Err(none_answered(url, answers));
    }
    let mut votes: HashMap<(String, u16), usize> = HashMap::new();
    for (host, port) in answers.into_iter().flatten().flatten() {
        *votes.entry((host, port)).or_default() += 1;
    }
    if votes.is_empty() {
        return Err(Error::Rejected {
            node: url.label(),
            code: "NOSERVICE".to_owned(),
            message: format!(
                "no sentinel knows the service {:?}: check the name in the URL",
                url.service
            ),
        });
    }
    let mut candidates: Vec<((String, u16), usize)> = votes.into_iter().collect();
    candidates.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if candidates.len() > 1 && candidates[0].1 * 2 <= answered {
        let named: Vec<String> = candidates
            .iter()
            .map(|((h, p), n)| format!("{h}:{p} ({n})"))
            .collect();
        return Err(Error::Rejected {
            node: url.label(),
            code: "SENTINELS".to_owned(),
            message: format!(
                "the sentinels disagree on the master, with no majority: {}",
                named.join(", ")
            ),
        });
    }
    Ok(candidates.swap_remove(0).0)
}

/// Why no sentinel answered, from their `answers` (every one an error): a problem to
/// fix, if one said so (refused credentials, a certificate, a port of the wrong kind),
/// before "every sentinel is down"; the one sentinel's own error if it is the only one.
fn none_answered(
    url: &SentinelUrl,
    mut answers: Vec<Result<Option<(String, u16)>, Error>>,
) -> Error {
    let fixable = answers.iter().position(|a| {
        matches!(
            a,
            Err(Error::Rejected { .. }
                | Error::Unavailable {
                    reason: UnavailableReason::Tls,
                    ..
                })
        ) || matches!(a, Err(Error::Unavailable { detail, .. }) if is_port_hint(detail))
    });
    let refused = |a: &Result<_, Error>| {
        matches!(
            a,
            Err(Error::Unavailable {
                reason: UnavailableReason::Refused,
                ..
            })
        )
    };
    let only_refusals = answers.iter().all(refused);
    if let Some(Err(problem)) = fixable.map(|i| answers.swap_remove(i)) {
        return problem;
    }
    if answers.len() == 1
        && !only_refusals
        && let Some(Err(own)) = answers.pop()
    {
        return own;
    }
    Error::Unavailable {
        node: url.label(),
        reason: if only_refusals {
            UnavailableReason::Refused
        } else {
            UnavailableReason::Io
        },
        detail: "every sentinel is down or unreachable".to_owned(),
        source: None,
    }
}

/// The role that the server at `addr` (the master the sentinels name) gives for itself
/// (`ROLE`): the sentinels may name a master that is not one yet, or not any more.
async fn role(addr: &str, master: &redis::Client, within: Duration) -> Result<String, Error> {
    let role = async {
        let mut conn = master.get_multiplexed_async_connection().await?;
        redis::cmd("ROLE")
            .query_async::<redis::Value>(&mut conn)
            .await
    };
    match tokio::time::timeout(within, role).await {
        Ok(Ok(redis::Value::Array(items))) => Ok(match items.first() {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(redis::Value::SimpleString(s)) => s.clone(),
            _ => String::new(),
        }),
        Ok(Ok(_)) => Ok(String::new()),
        Ok(Err(e)) if auth_refused(&e) => Err(Error::Rejected {
            node: addr.to_owned(),
            code: e.code().unwrap_or("WRONGPASS").to_owned(),
            message: "the master refuses the credentials: the master's go in the URL \
                      (user:password@), the sentinels' in sentinel_password"
                .to_owned(),
        }),
        Ok(Err(e)) => {
            let (reason, why) = match certificate_problem(&e) {
                Some(problem) => (UnavailableReason::Tls, problem),
                None => (UnavailableReason::Io, e.to_string()),
            };
            Err(Error::Unavailable {
                node: addr.to_owned(),
                reason,
                detail: format!("the master the sentinels name: {why}"),
                source: None,
            })
        }
        Err(_) => Err(Error::Unavailable {
            node: addr.to_owned(),
            reason: UnavailableReason::TimedOut,
            detail: "the master the sentinels name did not answer ROLE".to_owned(),
            source: None,
        }),
    }
}

/// Whether a server refused `SENTINEL` as a command it does not know: a Redis server
/// (not a sentinel) at a sentinel's address.
fn not_a_sentinel(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("unknown command"))
}

/// Whether the server refused the credentials (or wanted some).
fn auth_refused(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

/// Waits for the next `+switch-master` of `url`'s service on one sentinel after another,
/// returning when one announces a switch (or a sentinel connection ends, when the switch
/// may have been missed). Never returns an error: an unreachable sentinel is skipped
/// after a pause.
pub(crate) async fn switch_announced(url: &SentinelUrl, start: usize, pause: Duration) -> usize {
    use futures_util::StreamExt;
    let mut i = start % url.sentinels.len();
    loop {
        if let Ok(client) = url.sentinel(i)
            && let Ok(Ok(mut pubsub)) =
                tokio::time::timeout(pause * 10, client.get_async_pubsub()).await
            && pubsub.subscribe("+switch-master").await.is_ok()
        {
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                let payload: String = msg.get_payload().unwrap_or_default();
                if payload.split(' ').next() == Some(url.service.as_str()) {
                    return i;
                }
            }
            // The sentinel went away: a switch may have happened meanwhile.
            return i + 1;
        }
        i = (i + 1) % url.sentinels.len();
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_parse_with_their_credentials_apart() {
        let u = SentinelUrl::parse(
            "redis+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2:26379/orders/2?sentinel_password=sp",
            &Access::default(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            u.sentinels,
            [
                ("10.0.0.1".to_owned(), 26379),
                ("10.0.0.2".to_owned(), 26379)
            ]
        );
        assert_eq!(u.service, "orders");
        assert_eq!(u.db, 2);
        assert_eq!(u.username.as_deref(), Some("app"));
        assert_eq!(u.password.as_deref(), Some("s@cret"));
        assert_eq!(u.sentinel_password.as_deref(), Some("sp"));
        assert!(!u.label().contains("cret") && !format!("{u:?}").contains("sp\""));
        let plain = Access::default();
        assert!(SentinelUrl::parse("redis://h:1", &plain).unwrap().is_none());
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h/svc",
            "redis+sentinel://h:x/svc",
            "redis+sentinel://h:1/svc/x",
            "redis+sentinel://h:1/svc?what=1",
        ] {
            let e = SentinelUrl::parse(bad, &plain).err();
            assert!(
                matches!(e, Some(Error::InvalidArgument { .. })),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn tls_settings_need_a_tls_sentinel_url() {
        let tls = Access {
            tls: TlsSettings {
                insecure: true,
                ..TlsSettings::default()
            },
            ..Access::default()
        };
        let e = SentinelUrl::parse("redis+sentinel://h:1/svc", &tls).err();
        assert!(
            matches!(
                e,
                Some(Error::InvalidArgument {
                    what: "TLS settings",
                    ..
                })
            ),
            "{e:?}"
        );
        let u = SentinelUrl::parse("rediss+sentinel://h:1/svc", &tls).unwrap();
        assert!(u.unwrap().tls.is_some_and(|t| t.insecure));
    }
}
