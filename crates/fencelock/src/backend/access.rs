//! How to reach and log into a node: its connection's timeouts, credentials given apart
//! from the URL, and TLS for `rediss://` URLs. One TLS stack, rustls with ring as its
//! crypto provider, which fencelock installs itself (so no build of the workspace can end
//! up without one and panic); server verification against the system roots or a CA
//! file, client certificates, host name checks on unless skipped by name. (A certificate
//! problem is said in one line by
//! [`certificate_problem`](super::errors::certificate_problem).)

use std::path::PathBuf;
use std::sync::Once;
use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::errors::redact;
use crate::error::Error;

/// Timeouts for one node's connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

/// A client's TLS settings (see the `tls_*` methods of
/// [`ClientBuilder`](crate::ClientBuilder)).
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsSettings {
    /// PEM file of the CA to trust instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM files of a client certificate and its key (mutual TLS).
    pub client: Option<(PathBuf, PathBuf)>,
    /// Skip the verification of the server's certificate and name.
    pub insecure: bool,
}

/// A client's TLS settings and the credentials that override a URL's.
#[derive(Clone, Default)]
pub(crate) struct Access {
    /// TLS for `rediss://` URLs.
    pub tls: TlsSettings,
    /// The ACL user to log in as, instead of the URL's.
    pub username: Option<String>,
    /// The password to log in with, instead of the URL's.
    pub password: Option<String>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Access {
    /// `redis` with this access's credentials in place of its own, where given (and
    /// then without the driver's `CLIENT SETINFO`, see [`quiet`]).
    pub fn login(&self, mut redis: RedisConnectionInfo) -> RedisConnectionInfo {
        if let Some(user) = &self.username {
            redis = redis.set_username(user);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(password);
        }
        quiet(redis)
    }
}

/// `redis` without the `CLIENT SETINFO` the driver sends as it connects, when it logs
/// in with a password: the guide's ACL line (security chapter) does not allow `CLIENT SETINFO` (Redis 7.0
/// has no such subcommand, so the line could not name it), and a server that has it
/// would log an ACL denial for every connection. Without a password it is kept: it is
/// then the connection's only exchange as it is made (its errors are ignored), which
/// tells a server that accepts and drops connections from one that serves them; with a
/// password, `AUTH` is.
pub(crate) fn quiet(redis: RedisConnectionInfo) -> RedisConnectionInfo {
    if redis.password().is_some() {
        redis.set_skip_set_lib_name()
    } else {
        redis
    }
}

/// The credentials of a multi-host URL's `user:password@` part, split off the rest:
/// percent-decoded, an empty user name as none. (`redis://` URLs are the driver's to
/// parse; the Sentinel and Cluster forms list several hosts, which it does not take.)
pub(crate) fn split_credentials(rest: &str) -> (Option<String>, Option<String>, &str) {
    let Some((userinfo, rest)) = rest.rsplit_once('@') else {
        return (None, None, rest);
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let (user, password) = match userinfo.split_once(':') {
        Some((user, pass)) => (decode(user), Some(decode(pass))),
        None => (decode(userinfo), None),
    };
    (Some(user).filter(|u| !u.is_empty()), password, rest)
}

/// A URL's `host:port[,host:port...]`, each host without IPv6 brackets; `what` names one
/// host in `bad`'s reasons ("sentinel", "node").
pub(crate) fn host_list(
    hosts: &str,
    what: &str,
    bad: impl Fn(&str) -> Error,
) -> Result<Vec<(String, u16)>, Error> {
    hosts
        .split(',')
        .map(|host| {
            let (h, p) = host
                .rsplit_once(':')
                .ok_or_else(|| bad(&format!("a {what} without a port")))?;
            let port = p
                .parse()
                .map_err(|_| bad(&format!("a {what} port is not a number")))?;
            if h.is_empty() {
                return Err(bad(&format!("a {what} without a host")));
            }
            Ok((h.trim_matches(['[', ']']).to_owned(), port))
        })
        .collect()
}

impl TlsSettings {
    /// Whether any TLS setting was given (they are a mistake with a URL without TLS).
    pub(crate) fn given(&self) -> bool {
        self.ca_file.is_some() || self.client.is_some() || self.insecure
    }

    fn read(path: &PathBuf, what: &'static str) -> Result<Vec<u8>, Error> {
        std::fs::read(path)
            .map_err(|e| Error::invalid(what, format!("cannot read {}: {e}", path.display())))
    }

    /// The error for TLS settings given with a URL without TLS.
    pub(crate) fn without_tls() -> Error {
        Error::invalid(
            "TLS settings",
            "TLS settings were given for a URL without TLS: use rediss:// (or \
             rediss+sentinel://)",
        )
    }

    /// A PEM file of certificates, checked to hold at least one.
    fn read_certificates(path: &PathBuf, what: &'static str) -> Result<Vec<u8>, Error> {
        let pem = Self::read(path, what)?;
        let mut certificates = CertificateDer::pem_slice_iter(&pem);
        match certificates.next() {
            Some(Ok(_)) if certificates.all(|c| c.is_ok()) => Ok(pem),
            _ => Err(Error::invalid(
                what,
                format!("{} holds no PEM certificate", path.display()),
            )),
        }
    }

    /// The certificates to build the client with, read from their files.
    pub(crate) fn certificates(&self) -> Result<redis::TlsCertificates, Error> {
        let root_cert = match &self.ca_file {
            Some(path) => Some(Self::read_certificates(path, "TLS CA file")?),
            None => None,
        };
        let client_tls = match &self.client {
            Some((cert, key)) => {
                let client_key = Self::read(key, "TLS client key")?;
                if PrivateKeyDer::from_pem_slice(&client_key).is_err() {
                    return Err(Error::invalid(
                        "TLS client key",
                        format!("{} holds no PEM private key", key.display()),
                    ));
                }
                Some(redis::ClientTlsConfig {
                    client_cert: Self::read_certificates(cert, "TLS client certificate")?,
                    client_key,
                })
            }
            None => None,
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert,
        })
    }
}

/// Installs rustls's ring provider as the process's default, once (a provider another
/// part of the program installed first is kept).
pub(crate) fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A driver client for `info`, with TLS as `tls` says when the address is a TLS one;
/// TLS settings for a plain address are a mistake worth saying.
pub(crate) fn client(info: ConnectionInfo, tls: &TlsSettings) -> Result<redis::Client, Error> {
    let bad = |e: redis::RedisError| Error::invalid("Redis URL", e.to_string());
    let addr = info.addr().clone();
    let ConnectionAddr::TcpTls {
        host,
        port,
        tls_params,
        ..
    } = addr
    else {
        if tls.given() {
            return Err(TlsSettings::without_tls());
        }
        return redis::Client::open(info).map_err(bad);
    };
    install_provider();
    let info = info.set_addr(ConnectionAddr::TcpTls {
        host,
        port,
        insecure: tls.insecure,
        tls_params,
    });
    redis::Client::build_with_tls(info, tls.certificates()?).map_err(bad)
}

/// `client` for a URL, logging in as `access` says.
pub(crate) fn client_for_url(url: &str, access: &Access) -> Result<redis::Client, Error> {
    let info = url.into_connection_info().map_err(|e| {
        Error::invalid(
            "Redis URL",
            format!(
                "{} does not parse ({}); expected redis[s]://[user:password@]host[:port][/db], \
                 redis+unix:///path, redis[s]+sentinel://host:port[,...]/SERVICE or \
                 redis[s]+cluster://host:port[,...]",
                redact(url),
                e.detail().unwrap_or(e.category())
            ),
        )
    })?;
    let redis = access.login(info.redis_settings().clone());
    client(info.set_redis_settings(redis), &access.tls)
}
