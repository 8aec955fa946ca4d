//! Driver errors said as fencelock's [`Error`], and the error helpers every kind of node
//! shares (a server, a Sentinel-managed master, a Redis Cluster): credentials hidden from
//! messages, certificate problems said in one line, refusals said for the call that got
//! them, and what a failed call says about its link.
//!
//! It uses no other backend module, so that each of them can use it.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::error::{DriverError, Error, HumanDuration, UnavailableReason};
use crate::keys;
use crate::scripts::{Call, Flavor, replies};

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

/// The error code of `e`; for an error a command inside a script got, that command's:
/// Redis 6.2 wraps it in one of its own (`ERR Error running script (call to f_...):
/// @user_script:9: @user_script: 9: -READONLY You can't write against a read only
/// replica.`), where Redis 7 and Valkey answer with the command's code.
pub(super) fn code(e: &RedisError) -> Option<&str> {
    let inner = e
        .detail()
        .filter(|_| e.code() == Some("ERR"))
        .filter(|d| d.starts_with("Error running script"))
        .and_then(|d| d.split_once(": -"))
        .and_then(|(_, inner)| inner.split(' ').next())
        .filter(|code| !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()));
    inner.or(e.code())
}

/// No answer from `addr` within `after`.
pub(super) fn timed_out(addr: &str, after: Duration) -> Error {
    Error::Unavailable {
        node: addr.to_owned(),
        reason: UnavailableReason::TimedOut,
        detail: format!("no answer within {}", HumanDuration(after)),
        source: None,
    }
}

/// Whether `e` says that a call got no answer in time.
pub(super) fn is_timeout(e: &Error) -> bool {
    matches!(
        e,
        Error::Unavailable {
            reason: UnavailableReason::TimedOut,
            ..
        }
    )
}

/// Whether `e` says that a call may not have reached the server, or run there, because
/// of the link: no answer in time, a connection that broke (before or after the call
/// went out), or none to be had. A release that failed so is kept to send again.
pub(super) fn link_failed(e: &Error) -> bool {
    matches!(
        e,
        Error::Unavailable {
            reason: UnavailableReason::TimedOut
                | UnavailableReason::Io
                | UnavailableReason::Refused,
            ..
        }
    )
}

/// Whether `e` says that the link failed without the server's having stopped answering
/// on it (see [`link_failed`]): no answer from the server came with it.
pub(super) fn link_broke(e: &Error) -> bool {
    link_failed(e) && !is_timeout(e)
}

/// An ACL refusal of `call` (sent in `flavor`), said so that the user knows what to
/// allow; other errors as they are.
pub(super) fn refused(call: &Call, error: Error, flavor: Flavor) -> Error {
    match error {
        Error::Rejected {
            node,
            code,
            message,
        } => match call.refusal(&message, flavor) {
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

/// Sorts a driver error of `client`'s connection into the variant the caller acts on;
/// a connection that breaks or times out as a TLS/plain mix-up does gets a hint.
pub(super) fn map_error(addr: &str, client: &redis::Client, e: &RedisError) -> Error {
    let tls = matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    );
    if matches!(code(e), Some("MOVED" | "ASK" | "CLUSTERDOWN")) {
        // Only a cluster node redirects (or says the cluster is down): the URL should
        // have named the cluster.
        return Error::Rejected {
            node: addr.to_owned(),
            code: code(e).unwrap_or_default().to_owned(),
            message: format!(
                "this is a Redis Cluster node: use {}://{addr} (it answered {} {})",
                if tls {
                    "rediss+cluster"
                } else {
                    "redis+cluster"
                },
                e.code().unwrap_or_default(),
                e.detail().unwrap_or_default()
            ),
        };
    }
    if let Some(error) = not_a_server(addr, e) {
        return error;
    }
    match sort_error(addr, e) {
        Error::Unavailable {
            node,
            reason: reason @ (UnavailableReason::TimedOut | UnavailableReason::Io),
            detail,
            source,
        } if detail.is_empty() => Error::Unavailable {
            node,
            reason,
            detail: port_hint(e, tls, Scheme::Server).unwrap_or_default(),
            source,
        },
        other => other,
    }
}

/// The URL forms a hint names: a server's, the sentinels', a cluster's (each with its
/// TLS form).
#[derive(Clone, Copy, Debug)]
pub(super) enum Scheme {
    /// `redis://`, `rediss://`.
    Server,
    /// `redis+sentinel://`, `rediss+sentinel://`.
    Sentinel,
    /// `redis+cluster://`, `rediss+cluster://`.
    Cluster,
}

impl Scheme {
    fn plain(self) -> &'static str {
        match self {
            Self::Server => "redis://",
            Self::Sentinel => "redis+sentinel://",
            Self::Cluster => "redis+cluster://",
        }
    }

    fn tls(self) -> &'static str {
        match self {
            Self::Server => "rediss://",
            Self::Sentinel => "rediss+sentinel://",
            Self::Cluster => "rediss+cluster://",
        }
    }
}

/// The hint for a port that does not speak Redis's protocol.
const NOT_REDIS: &str =
    "it does not answer in Redis's protocol: this is not a Redis server, or not its port";
/// How every TLS/plain mix-up hint begins.
const NO_HANDSHAKE: &str = "no TLS handshake: ";
const DROPS_PLAIN: &str = "(which drops plain connections)";

/// What a connection that failed says about the port, as one line saying what to use:
/// a port that does not speak Redis's protocol (an HTTP server, say), a TLS
/// connection to a plain port (no handshake comes: the call times out), a plain one to
/// a TLS port (which drops it). `tls`: whether the connection was TLS. `None` for any
/// other failure. (The driver's cluster connection wraps the seeds' errors in one of its
/// own: the text is what tells them apart.)
pub(super) fn port_hint(e: &RedisError, tls: bool, scheme: Scheme) -> Option<String> {
    let text = e.to_string();
    if text.contains("Parse error at") {
        return Some(NOT_REDIS.to_owned());
    }
    if tls && (e.is_timeout() || text.contains("timed out")) {
        return Some(format!(
            "{NO_HANDSHAKE}if the port is not a TLS port, use {}",
            scheme.plain()
        ));
    }
    if !tls && text.contains("reset by peer") {
        return Some(format!(
            "if the port is a TLS port {DROPS_PLAIN}, use {}",
            scheme.tls()
        ));
    }
    None
}

/// The hint for a port that closed a new connection without a word (PostgreSQL does so
/// with what a Redis client sends first).
const CLOSED: &str =
    "it closed the connection without answering: this is not a Redis server, or not its port";

/// As [`port_hint`], for a connection made for the call that failed (to a sentinel, to a
/// cluster's seeds): one closed at once, without an answer, is also said so. (On a
/// connection that served calls before, that is a server restarting.)
pub(super) fn new_connection_hint(e: &RedisError, tls: bool, scheme: Scheme) -> Option<String> {
    if let Some(hint) = port_hint(e, tls, scheme) {
        return Some(hint);
    }
    let text = e.to_string().to_ascii_lowercase();
    [
        "broken pipe",
        "end of file",
        "handshake eof",
        "connection closed",
        "aborted",
    ]
    .iter()
    .any(|closed| text.contains(closed))
    .then(|| CLOSED.to_owned())
}

/// Whether an error's `detail` is (or holds) a [`port_hint`] or the hint of
/// [`new_connection_hint`]: the URL names the wrong kind of port, which no retry mends.
pub(super) fn is_port_hint(detail: &str) -> bool {
    [NOT_REDIS, NO_HANDSHAKE, DROPS_PLAIN, CLOSED]
        .iter()
        .any(|hint| detail.contains(hint))
}

/// The reason of an [`Error::Unavailable`] with a [`port_hint`]: a TLS connection to a
/// plain port times out, the rest break.
pub(super) fn port_hint_reason(hint: &str) -> UnavailableReason {
    if hint.starts_with(NO_HANDSHAKE) {
        UnavailableReason::TimedOut
    } else {
        UnavailableReason::Io
    }
}

/// A server that is not the Redis server a URL should name, or cannot serve fencelock,
/// said as such: a Redis Sentinel has no `CLUSTER` (a server answers `unknown command`
/// before it asks for a password), and a server without `EVALSHA` or `EVAL` (a
/// Sentinel, which the node usually knows by its `INFO` already, or a server that has
/// them renamed away) runs no scripts; `addr` is the address it was reached at. `None`
/// for any other error.
pub(super) fn not_a_server(addr: &str, e: &RedisError) -> Option<Error> {
    let unknown = |command: &str| {
        e.code() == Some("ERR")
            && e.detail().is_some_and(|d| {
                // Redis 7 quotes the name with '', Redis 6.2 with ``.
                d.starts_with(&format!("unknown command '{command}'"))
                    || d.starts_with(&format!("unknown command `{command}`"))
            })
    };
    if unknown("CLUSTER") {
        return Some(sentinel_said(addr, "it has no CLUSTER command"));
    }
    let script = ["EVALSHA", "EVAL"].into_iter().find(|c| unknown(c))?;
    Some(Error::Rejected {
        node: addr.to_owned(),
        code: "ERR".to_owned(),
        message: format!(
            "it runs no Lua scripts ({script} is an unknown command there), which fencelock \
             needs: allow EVALSHA and EVAL; if it is a Redis Sentinel, use \
             redis+sentinel://{addr}/SERVICE"
        ),
    })
}

/// A Redis Sentinel reached where a Redis server was expected (it said so in its `INFO`),
/// at `addr`.
pub(super) fn sentinel_not_server(addr: &str) -> Error {
    sentinel_said(addr, "its INFO says so")
}

fn sentinel_said(addr: &str, because: &str) -> Error {
    Error::Rejected {
        node: addr.to_owned(),
        code: "SENTINEL".to_owned(),
        message: format!(
            "this is a Redis Sentinel, not a Redis server ({because}): use \
             redis+sentinel://{addr}/SERVICE, SERVICE being the name its sentinel monitor \
             line gives the master"
        ),
    }
}

/// Sorts a driver error into the variant the caller acts on: what fencelock can name
/// first, then a link that failed, else the server's refusal.
pub(super) fn sort_error(addr: &str, e: &RedisError) -> Error {
    if let Some(error) = named_problem(addr, e) {
        return error;
    }
    if let Some(error) = link_error(addr, e) {
        return error;
    }
    rejected(addr, e)
}

/// A problem fencelock names itself, so that the user knows what to fix: a certificate,
/// a key of another type or a semaphore of another size (said by the scripts), a
/// connection that is not logged in.
fn named_problem(addr: &str, e: &RedisError) -> Option<Error> {
    if let Some(problem) = certificate_problem(e) {
        return Some(Error::Unavailable {
            node: addr.to_owned(),
            reason: UnavailableReason::Tls,
            detail: problem,
            source: None,
        });
    }
    if let Some((key, found)) = replies::wrong_type(e) {
        return Some(Error::WrongType {
            node: addr.to_owned(),
            key,
            found,
        });
    }
    if let Some((key, count, asked)) = replies::permits_mismatch(e) {
        return Some(Error::PermitsMismatch {
            node: addr.to_owned(),
            name: keys::name_in(&key).to_owned(),
            count,
            asked,
        });
    }
    if e.detail().is_some_and(|d| d.contains("unauthenticated")) {
        // Redis caps what an unauthenticated connection may send, and answers a longer
        // request with a protocol error instead of NOAUTH.
        return Some(Error::Rejected {
            node: addr.to_owned(),
            code: "NOAUTH".to_owned(),
            message: "NOAUTH authentication required".to_owned(),
        });
    }
    None
}

/// A link that timed out, was refused or broke, or a server that cannot answer yet:
/// [`Error::Unavailable`], which a caller may retry.
fn link_error(addr: &str, e: &RedisError) -> Option<Error> {
    let unavailable = |reason| Error::Unavailable {
        node: addr.to_owned(),
        reason,
        detail: String::new(),
        source: Some(DriverError::new(e.clone())),
    };
    if e.is_timeout() {
        return Some(unavailable(UnavailableReason::TimedOut));
    }
    if e.is_connection_refusal() {
        return Some(unavailable(UnavailableReason::Refused));
    }
    match e.kind() {
        // Bytes that are not RESP (a reply fencelock's own decoders refuse says which
        // script replied what instead).
        ErrorKind::Parse if e.to_string().contains("Parse error at") => Some(Error::Unavailable {
            node: addr.to_owned(),
            reason: UnavailableReason::Io,
            detail: NOT_REDIS.to_owned(),
            source: Some(DriverError::new(e.clone())),
        }),
        ErrorKind::Io => Some(unavailable(UnavailableReason::Io)),
        ErrorKind::Server(ServerErrorKind::BusyLoading) => Some(unavailable(UnavailableReason::Io)),
        _ => None,
    }
}

/// A refusal: [`Error::Rejected`] with the server's code and message (`WRONGPASS` for a
/// failed login, `ERR` and the driver's text when the server gave no code).
fn rejected(addr: &str, e: &RedisError) -> Error {
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
    match e.kind() {
        ErrorKind::AuthenticationFailed => Error::Rejected {
            node: addr.to_owned(),
            code: "WRONGPASS".to_owned(),
            message: "authentication failed: wrong user name or password".to_owned(),
        },
        // The server's text names the script and its line: none of the user's concern.
        _ if code(e) == Some("READONLY") => Error::Rejected {
            node: addr.to_owned(),
            code: "READONLY".to_owned(),
            message: "this is a read-only replica".to_owned(),
        },
        _ if e.code().is_some() => Error::Rejected {
            node: addr.to_owned(),
            code: code(e).unwrap_or_default().to_owned(),
            message: message(),
        },
        _ => Error::Rejected {
            node: addr.to_owned(),
            code: "ERR".to_owned(),
            message: e.to_string(),
        },
    }
}

/// The TLS alerts (as rustls names them) with which a server refuses the certificate a
/// client presented: for a CA it does not trust, a certificate not for client use, one
/// out of date, or one it cannot check. (A server that got no certificate but requires
/// one says `CertificateRequired`, or over TLS 1.2 `HandshakeFailure`.)
const CLIENT_CERTIFICATE_ALERTS: &[&str] = &[
    "UnknownCA",
    "BadCertificate",
    "UnsupportedCertificate",
    "CertificateExpired",
    "CertificateRevoked",
    "CertificateUnknown",
];

/// A certificate problem in a driver error, as one line naming it and what to do.
pub(super) fn certificate_problem(e: &redis::RedisError) -> Option<String> {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    let says = |needle: &str| text.contains(needle);
    let problem = if says("InvalidClientConfig") || says("Unable to build client with TLS") {
        let why = text.rsplit(": ").next().unwrap_or_default();
        return Some(format!(
            "the TLS settings cannot be used ({why}): check the certificate files (PEM, X.509 \
             version 3)"
        ));
    } else if says("failed to read PEM from file") {
        // The driver loads the system's roots on every TLS connection (a CA file given
        // or not), from where SSL_CERT_FILE / SSL_CERT_DIR point.
        let why = text
            .split_once("failed to read PEM from file: ")
            .and_then(|(_, why)| why.split(": ").next())
            .unwrap_or_default();
        return Some(format!(
            "the system's CA certificates could not be read ({why}): check SSL_CERT_FILE and \
             SSL_CERT_DIR, which the TLS connection reads even with a CA file given"
        ));
    } else if says("CertificateRequired") || says("certificate required") {
        "the server requires a client certificate: give one (--cert FILE --key FILE, or \
         ClientBuilder::tls_client_cert)"
    } else if let Some(alert) = CLIENT_CERTIFICATE_ALERTS
        .iter()
        .find(|alert| says(&format!("received fatal alert: {alert}")))
    {
        // The server's verdict on this client's certificate (the client checks the
        // server's itself, and says "invalid peer certificate").
        return Some(format!(
            "the server refused the client certificate ({alert}): give one signed by a CA \
             the server trusts, for client use and in date (--cert FILE --key FILE, or \
             ClientBuilder::tls_client_cert)"
        ));
    } else if says("received fatal alert: HandshakeFailure") {
        "the server refused the TLS handshake: if it requires a client certificate (over TLS \
         1.2 it says so this way), give one (--cert FILE --key FILE, or \
         ClientBuilder::tls_client_cert); else check the TLS versions and ciphers it allows"
    } else if says("UnknownIssuer") || says("unknown issuer") {
        "the server's certificate is signed by a CA this client does not trust: give the CA \
         (--cacert FILE, or ClientBuilder::tls_ca_file)"
    } else if says("NotValidForName") || says("not valid for name") {
        "the server's certificate is not valid for the host name in the URL: connect by a \
         name the certificate lists"
    } else if says("Expired") || says("expired") {
        "the server's certificate has expired (or is not valid yet): renew it, or check the \
         clocks"
    } else if says("InvalidCertificate") || says("invalid peer certificate") {
        let why = text.rsplit(": ").next().unwrap_or_default();
        return Some(format!("the server's certificate was refused ({why})"));
    } else if says("CorruptMessage") || says("InvalidContentType") || says("received corrupt") {
        "the server did not answer with TLS: is it a TLS port? (rediss:// needs one)"
    } else {
        return None;
    };
    Some(problem.to_owned())
}

#[cfg(test)]
mod tests {
    use super::{certificate_problem, redact};

    /// A driver error as a broken TLS connection reports one.
    fn io_error(text: &str) -> redis::RedisError {
        std::io::Error::other(text.to_owned()).into()
    }

    #[test]
    fn a_server_refusing_the_client_certificate_is_told_from_the_servers_own_problems() {
        for alert in ["UnknownCA", "UnsupportedCertificate", "CertificateExpired"] {
            let problem = certificate_problem(&io_error(&format!("received fatal alert: {alert}")))
                .unwrap_or_else(|| panic!("{alert}: not named"));
            assert!(
                problem.starts_with(&format!(
                    "the server refused the client certificate ({alert})"
                )),
                "{problem}"
            );
        }
        let missing = certificate_problem(&io_error("received fatal alert: CertificateRequired"));
        assert!(missing.unwrap().contains("requires a client certificate"));
        // TLS 1.2 has no alert of its own for a missing client certificate.
        let missing = certificate_problem(&io_error("received fatal alert: HandshakeFailure"));
        assert!(missing.unwrap().contains("requires a client certificate"));
        let expired = certificate_problem(&io_error("invalid peer certificate: Expired"));
        assert!(
            expired
                .unwrap()
                .starts_with("the server's certificate has expired")
        );
        let store = certificate_problem(&io_error(
            "failed to read PEM from file: No such file or directory (os error 2) at '/x'",
        ));
        assert!(
            store
                .unwrap()
                .starts_with("the system's CA certificates could not be read (No such file"),
        );
        assert_eq!(
            certificate_problem(&io_error("Connection reset by peer")),
            None
        );
    }

    #[test]
    fn a_commands_error_inside_a_script_keeps_its_code_on_every_server() {
        let server = |code: &str, detail: &str| {
            redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
        };
        let wrapped = server(
            "ERR",
            "Error running script (call to f_a6a5): @user_script:199: @user_script: 199: \
             -READONLY You can't write against a read only replica.",
        );
        assert_eq!(super::code(&wrapped), Some("READONLY"));
        let seven = server("READONLY", "You can't write against a read only replica.");
        assert_eq!(super::code(&seven), Some("READONLY"));
        let plain = server("ERR", "Error running script: @user_script:1: bad - thing");
        assert_eq!(super::code(&plain), Some("ERR"));
    }

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
