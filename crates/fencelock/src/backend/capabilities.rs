//! What a server offers, learned once per connection: its name and version (`INFO
//! server`, or `HELLO` where `INFO` is refused), what fencelock's scripts and release
//! notifications may use there ([`Capabilities`]), and the oldest server fencelock runs
//! on ([`OLDEST`]).
//!
//! The capabilities are judged by the Redis version the server is compatible with, which
//! every fork reports as `redis_version` (Valkey: `7.2.4`, beside its own
//! `valkey_version`); the name and its own version are for messages. Nothing else reads
//! a version: the node picks the scripts' [`Flavor`] and the release channel from the
//! capabilities alone.

use std::fmt;

use super::errors::sentinel_not_server;
use crate::error::Error;
use crate::scripts::Flavor;

/// A version as `major.minor.patch` (missing parts 0), ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// `6.2.14`, `7.2.4`, `255.255.255` (a build from source); `None` for anything
    /// without a leading number.
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split('.').map(|p| {
            let digits = p.find(|c: char| !c.is_ascii_digit()).unwrap_or(p.len());
            p[..digits].parse::<u32>().ok()
        });
        let major = parts.next()??;
        let mut next = || parts.next().flatten().unwrap_or(0);
        Some(Version(major, next(), next()))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The oldest Redis version fencelock runs on: the oldest it is tested on (its scripts
/// use `LPOS`, from Redis 6.0.6; Redis 6.0 is past its end of life). Every Valkey
/// release is newer (Valkey began as Redis 7.2.4).
pub(crate) const OLDEST: Version = Version(6, 2, 0);

/// The Redis version from which a server reads a script's `#!lua` line and has sharded
/// pub/sub (`SPUBLISH`, `SSUBSCRIBE`).
const REDIS_7: Version = Version(7, 0, 0);

/// What a server runs in: a server's mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Standalone,
    Cluster,
    Sentinel,
}

/// Who a server says it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Server {
    /// `redis`, `valkey`, or another fork's name.
    pub name: String,
    /// Its own version (Valkey's `valkey_version`).
    pub version: Version,
    /// The Redis version it is compatible with: what its capabilities are judged by.
    pub redis: Version,
    /// `None` where the answer does not say.
    pub mode: Option<Mode>,
}

impl Server {
    /// From an `INFO server` reply; `None` without a `redis_version`.
    pub fn from_info(text: &str) -> Option<Server> {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .filter(|v| !v.is_empty())
        };
        let redis = Version::parse(field("redis_version")?)?;
        let name = field("server_name").unwrap_or("redis").to_owned();
        // A fork names its own version after its name (valkey_version).
        let version = field(&format!("{name}_version"))
            .and_then(Version::parse)
            .unwrap_or(redis);
        let mode = field("redis_mode")
            .or_else(|| field("server_mode"))
            .and_then(parse_mode);
        Some(Server {
            name,
            version,
            redis,
            mode,
        })
    }

    /// From a `HELLO` reply (a map, or in RESP2 a flat list of names and values); `None`
    /// without a `version`. It says no Redis-compatible version: a Valkey's is taken as
    /// Redis 7.2, where Valkey began; any other server's is its own.
    pub fn from_hello(reply: &redis::Value) -> Option<Server> {
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let pairs: Vec<(String, &redis::Value)> = match reply {
            redis::Value::Map(pairs) => pairs
                .iter()
                .filter_map(|(k, v)| Some((text(k)?, v)))
                .collect(),
            redis::Value::Array(items) => items
                .chunks(2)
                .filter_map(|pair| match pair {
                    [k, v] => Some((text(k)?, v)),
                    _ => None,
                })
                .collect(),
            _ => return None,
        };
        let field = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| text(v))
        };
        let version = Version::parse(&field("version")?)?;
        let name = field("server").unwrap_or_else(|| "redis".to_owned());
        let redis = if name == "valkey" {
            Version(7, 2, 0).max(version)
        } else {
            version
        };
        Some(Server {
            name,
            version,
            redis,
            mode: field("mode").as_deref().and_then(parse_mode),
        })
    }

    /// What fencelock may use on this server.
    pub fn capabilities(&self) -> Capabilities {
        let redis_7 = self.redis >= REDIS_7;
        Capabilities {
            script_flags: redis_7,
            sharded_pubsub: redis_7,
        }
    }

    /// [`Error::Rejected`] (code `VERSION`) naming the version found and the one needed,
    /// if the server is older than fencelock supports.
    pub fn check_supported(&self, node: &str) -> Result<(), Error> {
        if self.redis >= OLDEST {
            return Ok(());
        }
        let found = if self.name == "redis" || self.version == self.redis {
            format!("{} {}", self.display_name(), self.version)
        } else {
            format!(
                "{} {} (compatible with Redis {})",
                self.display_name(),
                self.version,
                self.redis
            )
        };
        Err(Error::Rejected {
            node: node.to_owned(),
            code: "VERSION".to_owned(),
            message: format!(
                "it runs {found}, and fencelock needs Redis {}.{} or later, or Valkey",
                OLDEST.0, OLDEST.1
            ),
        })
    }

    /// `Redis`, `Valkey`, or the name as given.
    fn display_name(&self) -> String {
        match self.name.as_str() {
            "redis" => "Redis".to_owned(),
            "valkey" => "Valkey".to_owned(),
            other => other.to_owned(),
        }
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.display_name(), self.version)
    }
}

fn parse_mode(text: &str) -> Option<Mode> {
    match text {
        "standalone" => Some(Mode::Standalone),
        "cluster" => Some(Mode::Cluster),
        "sentinel" => Some(Mode::Sentinel),
        _ => None,
    }
}

/// What fencelock may use on a server (on a cluster: on every master).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// It reads a script's `#!lua` line and its flags (Redis 7 and later, Valkey).
    pub script_flags: bool,
    /// It has sharded pub/sub (Redis 7 and later, Valkey).
    pub sharded_pubsub: bool,
}

impl Capabilities {
    /// What every supported server offers: the choice where none could be learned
    /// (`INFO` and `HELLO` refused). Every script still runs; a cluster's releases go
    /// by classic pub/sub.
    pub const LEAST: Capabilities = Capabilities {
        script_flags: false,
        sharded_pubsub: false,
    };

    /// What Redis 7 and Valkey offer: the choice before anything was learned.
    pub const REDIS_7: Capabilities = Capabilities {
        script_flags: true,
        sharded_pubsub: true,
    };

    /// What both offer: a cluster whose masters differ (a rolling upgrade) gets what
    /// every master has.
    pub fn and(self, other: Capabilities) -> Capabilities {
        Capabilities {
            script_flags: self.script_flags && other.script_flags,
            sharded_pubsub: self.sharded_pubsub && other.sharded_pubsub,
        }
    }

    /// The scripts' flavor on such a server, on a cluster or not.
    pub fn flavor(self, cluster: bool) -> Flavor {
        Flavor {
            cluster,
            sharded: cluster && self.sharded_pubsub,
            shebang: self.script_flags,
        }
    }
}

/// Asks a server who it is, each command sent by `send`: `INFO server`, or `HELLO`
/// where the server refuses that (or its answer names no version: a proxy); `None` where
/// it refuses both. An error that is no refusal (the link, the login) is returned.
///
/// Cancel safe: it only reads.
pub(crate) async fn ask<F, Sent>(send: F) -> redis::RedisResult<Option<Server>>
where
    F: Fn(redis::Cmd) -> Sent,
    Sent: Future<Output = redis::RedisResult<redis::Value>>,
{
    match send(redis::cmd("INFO").arg("server").to_owned()).await {
        Ok(reply) => {
            let text: String = redis::FromRedisValue::from_redis_value(reply)?;
            if let Some(server) = Server::from_info(&text) {
                return Ok(Some(server));
            }
        }
        Err(e) if refuses(&e) => {}
        Err(e) => return Err(e),
    }
    match send(redis::cmd("HELLO")).await {
        Ok(reply) => Ok(Server::from_hello(&reply)),
        Err(e) if refuses(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What fencelock may use on the server at `node`, from what it said it is (`None`: it
/// would not say): a Redis Sentinel, or a server older than [`OLDEST`], is an error; one
/// that would not say is taken to offer what every supported server does
/// ([`Capabilities::LEAST`]), which is warned of.
pub(crate) fn judge(node: &str, server: Option<&Server>) -> Result<Capabilities, Error> {
    let Some(server) = server else {
        tracing::warn!(
            node,
            "the server refuses INFO and HELLO, so what it offers is unknown: scripts and \
             release notifications go as to Redis 6.2, which every supported server runs"
        );
        return Ok(Capabilities::LEAST);
    };
    if server.mode == Some(Mode::Sentinel) {
        return Err(sentinel_not_server(node));
    }
    server.check_supported(node)?;
    let offers = server.capabilities();
    tracing::debug!(node, server = %server, ?offers, "what the server offers");
    Ok(offers)
}

/// Whether a server's error to `INFO` or `HELLO` says that it refuses the command
/// (renamed away, or not allowed to the user), rather than that the link or the login
/// failed.
pub(crate) fn refuses(e: &redis::RedisError) -> bool {
    let detail = e.detail().unwrap_or_default();
    e.code() == Some("NOPERM")
        || detail.starts_with("unknown command")
        || detail.starts_with("unknown subcommand")
        || detail.contains("wrong number of arguments")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(lines: &[&str]) -> String {
        let mut text = "# Server\r\n".to_owned();
        for line in lines {
            text.push_str(line);
            text.push_str("\r\n");
        }
        text
    }

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(Version::parse("6.2.14"), Some(Version(6, 2, 14)));
        assert_eq!(Version::parse("7.0"), Some(Version(7, 0, 0)));
        assert_eq!(Version::parse("8.0.0-rc1"), Some(Version(8, 0, 0)));
        assert_eq!(Version::parse("x"), None);
        assert!(Version(6, 2, 14) < Version(7, 0, 0));
        assert!(Version(6, 0, 20) < OLDEST);
    }

    #[test]
    fn redis_6_2_has_neither_flags_nor_sharded_pub_sub_and_7_and_valkey_have_both() {
        let r62 =
            Server::from_info(&info(&["redis_version:6.2.14", "redis_mode:cluster"])).unwrap();
        assert_eq!(r62.to_string(), "Redis 6.2.14");
        assert_eq!(r62.mode, Some(Mode::Cluster));
        assert_eq!(r62.capabilities(), Capabilities::LEAST);
        assert!(r62.check_supported("h:1").is_ok());
        let r7 =
            Server::from_info(&info(&["redis_version:7.0.15", "redis_mode:standalone"])).unwrap();
        assert_eq!(r7.capabilities(), Capabilities::REDIS_7);
        let valkey = Server::from_info(&info(&[
            "redis_version:7.2.4",
            "server_name:valkey",
            "valkey_version:9.1.2",
            "server_mode:sentinel",
        ]))
        .unwrap();
        assert_eq!(valkey.to_string(), "Valkey 9.1.2");
        assert_eq!(valkey.redis, Version(7, 2, 4));
        assert_eq!(valkey.mode, Some(Mode::Sentinel));
        assert_eq!(valkey.capabilities(), Capabilities::REDIS_7);
        assert_eq!(Server::from_info("# Server\r\nos:Linux\r\n"), None);
        // A mixed cluster gets what every master has.
        assert_eq!(
            Capabilities::REDIS_7.and(r62.capabilities()),
            Capabilities::LEAST
        );
        let no_flags = Capabilities::LEAST.flavor(true);
        assert!(no_flags.cluster && !no_flags.sharded && !no_flags.shebang);
        assert_eq!(Capabilities::REDIS_7.flavor(false), Flavor::STANDALONE);
        assert_eq!(Capabilities::REDIS_7.flavor(true), Flavor::CLUSTER);
    }

    #[test]
    fn hello_says_who_the_server_is_in_either_protocol() {
        let bulk = |s: &str| redis::Value::BulkString(s.as_bytes().to_vec());
        let resp2 = redis::Value::Array(vec![
            bulk("server"),
            bulk("valkey"),
            bulk("version"),
            bulk("9.1.2"),
            bulk("proto"),
            redis::Value::Int(2),
            bulk("mode"),
            bulk("standalone"),
        ]);
        let valkey = Server::from_hello(&resp2).unwrap();
        assert_eq!(valkey.to_string(), "Valkey 9.1.2");
        assert_eq!(valkey.capabilities(), Capabilities::REDIS_7);
        let resp3 = redis::Value::Map(vec![
            (bulk("server"), bulk("redis")),
            (bulk("version"), bulk("6.2.14")),
            (bulk("mode"), bulk("cluster")),
        ]);
        let r62 = Server::from_hello(&resp3).unwrap();
        assert_eq!(r62.redis, Version(6, 2, 14));
        assert_eq!(r62.mode, Some(Mode::Cluster));
        assert_eq!(r62.capabilities(), Capabilities::LEAST);
        assert_eq!(Server::from_hello(&redis::Value::Nil), None);
    }

    #[test]
    fn a_server_older_than_6_2_is_refused_naming_both_versions() {
        let old = Server::from_info(&info(&["redis_version:6.0.20"])).unwrap();
        let e = old.check_supported("127.0.0.1:6379").unwrap_err();
        assert_eq!(
            e.to_string(),
            "Redis node 127.0.0.1:6379 refused the command (it runs Redis 6.0.20, and \
             fencelock needs Redis 6.2 or later, or Valkey): upgrade the server"
        );
        let fork = Server::from_info(&info(&[
            "redis_version:5.0.7",
            "server_name:keydb",
            "keydb_version:5.3.3",
        ]))
        .unwrap();
        let e = fork.check_supported("h:1").unwrap_err().to_string();
        assert!(
            e.contains("it runs keydb 5.3.3 (compatible with Redis 5.0.7)"),
            "{e}"
        );
    }
}
