//! Certificates for TLS tests, made with the `openssl` command-line tool,
//! and servers that serve them.
//!
//! [`TlsFiles::generate`] makes, in a temporary directory of its own, a CA,
//! a server certificate for `localhost` signed by it, a client certificate
//! signed by it (for mutual TLS), and three server certificates that a
//! client trusting the CA must refuse: one from an unrelated CA, one for
//! another name, and one that has expired. [`TlsFiles::shared`] makes them
//! once per test process.
//!
//! [`ServerBuilder::tls`](crate::ServerBuilder::tls) starts a server with a
//! TLS port next to its plain one ([`RedisServer::tls_port`],
//! [`RedisServer::tls_url`]); testkit itself ([`RedisServer::cmd`], the
//! readiness checks) keeps talking plain RESP on the plain port. The nodes of
//! a [TLS cluster](crate::ClusterBuilder::tls) have no plain port: testkit
//! talks TLS to them (rustls, trusting the CA).
//!
//! ```
//! use testkit::{ClientAuth, RedisServer, TlsFiles};
//!
//! let files = TlsFiles::shared();
//! let server = RedisServer::builder().tls(files, ClientAuth::No).start();
//! let url = server.tls_url().unwrap(); // "rediss://localhost:PORT"
//! assert!(url.starts_with("rediss://localhost:"));
//! // A client trusting `files.ca_cert()` can connect to `url`.
//! assert_eq!(server.cmd(&["PING"]).as_str(), Some("PONG")); // plain port
//! ```
//!
//! # What the certificates are
//!
//! All keys are EC P-256 (`openssl req -newkey ec -pkeyopt
//! ec_paramgen_curve:P-256`: fast to make, unlike RSA keys), unencrypted
//! PKCS#8 PEM. Leaf certificates have `basicConstraints CA:FALSE` and an
//! `extendedKeyUsage` of `serverAuth` or `clientAuth`; CA certificates
//! `CA:TRUE` and `keyCertSign, cRLSign`.
//!
//! | Accessors | Signed by | Names (subjectAltName) | Valid |
//! |-----------|-----------|------------------------|-------|
//! | [`ca_cert`](TlsFiles::ca_cert) | itself (`CN=testkit CA`) | | 10 years |
//! | [`server_cert`](TlsFiles::server_cert), [`server_key`](TlsFiles::server_key) | the CA | `DNS:localhost`, `IP:127.0.0.1` | 10 years |
//! | [`client_cert`](TlsFiles::client_cert), [`client_key`](TlsFiles::client_key) | the CA | (`CN=testkit client`) | 10 years |
//! | [`other_ca_cert`](TlsFiles::other_ca_cert) | itself (`CN=testkit other CA`) | | 10 years |
//! | [`other_ca_server_cert`](TlsFiles::other_ca_server_cert), [`other_ca_server_key`](TlsFiles::other_ca_server_key) | the other CA | `DNS:localhost`, `IP:127.0.0.1` | 10 years |
//! | [`wrong_name_server_cert`](TlsFiles::wrong_name_server_cert), [`wrong_name_server_key`](TlsFiles::wrong_name_server_key) | the CA | `DNS:not-this-host.example` only | 10 years |
//! | [`expired_server_cert`](TlsFiles::expired_server_cert), [`expired_server_key`](TlsFiles::expired_server_key) | the CA | `DNS:localhost`, `IP:127.0.0.1` | 2020-01-01 to 2020-01-02 |
//!
//! The expired certificate is signed with `openssl ca -startdate
//! 200101000000Z -enddate 200102000000Z` (a throw-away CA database in the
//! directory): OpenSSL 3.0's `openssl x509` and `openssl req` only take
//! `-days` (their `-not_before`/`-not_after` came in a later 3.x release),
//! and `x509 -days -1` makes a certificate whose validity ends a day before
//! it begins.
//!
//! # How clients fail (observed with redis-server and redis-cli 7.0.15, OpenSSL 3.0)
//!
//! | Mistake | `redis-cli --tls --cacert ca.crt -h localhost -p P ping` prints | The server logs (`Error accepting a client connection: ...`) |
//! |---------|-------------------------------------------------|-----------------|
//! | server cert from an unknown CA | `Could not connect to Redis at localhost:P: SSL_connect failed: certificate verify failed` | `error:0A000418:SSL routines::tlsv1 alert unknown ca` |
//! | expired server cert | the same `certificate verify failed` line | `error:0A000415:SSL routines::sslv3 alert certificate expired` |
//! | server cert for another name | nothing: `PONG` (redis-cli checks the chain and the dates, not the name) | nothing |
//! | no `--cacert` (the CA is not in the system's store) | the same `certificate verify failed` line | `tlsv1 alert unknown ca` |
//! | no client cert, `tls-auth-clients yes` | `Error: Server closed the connection` or `Error: Connection reset by peer`, either (TLS 1.3: the client's side of the handshake succeeds; the refusal arrives as the reply is read) | `error:0A0000C7:SSL routines::peer did not return a certificate` |
//! | client cert from another CA, `tls-auth-clients yes` | the same two, either | `error:0A000086:SSL routines::certificate verify failed` |
//! | plain RESP (no `--tls`) to the TLS port | `Error: Connection reset by peer` | `error:0A00010B:SSL routines::wrong version number` |
//!
//! redis-cli cannot tell the certificate mistakes apart; a client that
//! checks names and reports the verification result can. `openssl s_client
//! -CAfile ca.crt -verify_hostname localhost -verify_return_error` says
//! `Verification error: unable to get local issuer certificate` (code 20),
//! `certificate has expired` (10) and `hostname mismatch` (62) for the three
//! mistakes, and `tlsv13 alert certificate required` (alert 116) for the
//! missing client certificate; against the wrong-name certificate the
//! server then logs `sslv3 alert bad certificate`.
//!
//! [`RedisServer::cmd`]: crate::RedisServer::cmd
//! [`RedisServer::tls_port`]: crate::RedisServer::tls_port
//! [`RedisServer::tls_url`]: crate::RedisServer::tls_url

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use tempfile::TempDir;

/// Whether a TLS server asks clients for a certificate: redis-server's
/// `--tls-auth-clients no|yes|optional`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ClientAuth {
    /// Clients need no certificate (none is asked for).
    #[default]
    No,
    /// Clients must present a certificate signed by the server's CA
    /// ([`TlsFiles::client_cert`]); others are refused.
    Yes,
    /// A certificate is asked for and checked if the client presents one,
    /// but a client without one is let in.
    Optional,
}

impl ClientAuth {
    /// The value of `--tls-auth-clients`: `"no"`, `"yes"` or `"optional"`.
    pub fn as_arg(self) -> &'static str {
        match self {
            ClientAuth::No => "no",
            ClientAuth::Yes => "yes",
            ClientAuth::Optional => "optional",
        }
    }
}

/// A CA, certificates and keys for TLS tests (PEM files), in a temporary
/// directory of their own that is removed on drop. See the [module
/// docs](self) for what each certificate is and how clients fail with the
/// bad ones.
///
/// ```
/// let files = testkit::TlsFiles::generate();
/// assert!(files.ca_cert().exists());
/// assert!(files.expired_server_key().exists());
/// let dir = files.dir().to_owned();
/// drop(files);
/// assert!(!dir.exists());
/// ```
#[derive(Debug)]
pub struct TlsFiles {
    dir: TempDir,
}

/// File names inside a [`TlsFiles`] directory.
const CA: &str = "ca";
const SERVER: &str = "server";
const CLIENT: &str = "client";
const OTHER_CA: &str = "other-ca";
const OTHER_CA_SERVER: &str = "other-ca-server";
const WRONG_NAME_SERVER: &str = "wrong-name-server";
const EXPIRED_SERVER: &str = "expired-server";

/// The names the good (and the other-CA, and the expired) server
/// certificates are valid for.
const LOCALHOST_SAN: &str = "DNS:localhost,IP:127.0.0.1";
/// The only name the wrong-name certificate is valid for.
const WRONG_NAME: &str = "not-this-host.example";
/// Validity of the expired certificate (`openssl ca` dates, UTCTime).
const EXPIRED_FROM: &str = "200101000000Z";
const EXPIRED_UNTIL: &str = "200102000000Z";
/// Validity of every other certificate.
const DAYS: &str = "3650";

/// The configuration for `openssl req` and `openssl ca`: written into the
/// directory so that the system's `openssl.cnf` plays no part. `openssl ca`
/// keeps its database (needed for `-startdate`/`-enddate`) in `ca-db/`.
const OPENSSL_CNF: &str = "\
[ req ]
distinguished_name = req_dn
prompt = no
[ req_dn ]
CN = unused
[ ca ]
default_ca = testkit_ca
[ testkit_ca ]
database = ca-db/index.txt
serial = ca-db/serial
new_certs_dir = ca-db
default_md = sha256
policy = policy_any
copy_extensions = copy
unique_subject = no
[ policy_any ]
commonName = supplied
";

const NOT_FOUND: &str = "openssl not found: install it (apt-get install -y openssl) or set OPENSSL";

/// The shared set, see [`TlsFiles::shared`].
static SHARED: OnceLock<TlsFiles> = OnceLock::new();

impl TlsFiles {
    /// Makes a fresh set in a new temporary directory (`testkit-tls-*` in
    /// the OS temp dir), removed when the `TlsFiles` is dropped. Takes a few
    /// hundred milliseconds (a dozen `openssl` runs, in two parallel
    /// rounds); tests that need no set of their own use
    /// [`shared`](Self::shared).
    ///
    /// `openssl` is taken from `$OPENSSL` if set, else from `$PATH`.
    ///
    /// # Panics
    /// If `openssl` cannot be found or fails (the message has its output),
    /// or the directory cannot be created.
    pub fn generate() -> TlsFiles {
        Self::generate_in("testkit-tls-")
    }

    /// One set for the whole test process, made on first use. Its directory,
    /// `testkit-tls-shared-PID-*` in the OS temp dir, lives until the process
    /// exits and is removed then (an `atexit` handler, which runs when the
    /// test harness exits normally, tests failed or not). A process killed by
    /// a signal leaves it behind; the PID in its name tells whose it was.
    ///
    /// Nothing writes to the files once they are made, and servers keep
    /// copies of what they serve (see
    /// [`ServerBuilder::tls_with`](crate::ServerBuilder::tls_with)), so one
    /// set serves any number of tests and threads.
    ///
    /// # Panics
    /// As [`generate`](Self::generate).
    pub fn shared() -> &'static TlsFiles {
        SHARED.get_or_init(|| {
            let files = Self::generate_in(&format!("testkit-tls-shared-{}-", std::process::id()));
            // SAFETY: registers a plain `extern "C" fn` that never unwinds.
            unsafe {
                libc::atexit(remove_shared_dir);
            }
            files
        })
    }

    /// The directory holding the files (and `openssl`'s leftovers: requests,
    /// its configuration, the CA database).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA's certificate: what clients (and, for client certificates, the
    /// server) trust.
    pub fn ca_cert(&self) -> PathBuf {
        self.cert(CA)
    }

    /// The CA's private key, to sign more certificates with.
    pub fn ca_key(&self) -> PathBuf {
        self.key(CA)
    }

    /// The good server certificate: signed by the CA, valid for
    /// `DNS:localhost` and `IP:127.0.0.1`, for 10 years.
    pub fn server_cert(&self) -> PathBuf {
        self.cert(SERVER)
    }

    /// The key of [`server_cert`](Self::server_cert).
    pub fn server_key(&self) -> PathBuf {
        self.key(SERVER)
    }

    /// A client certificate signed by the CA (`CN=testkit client`), for
    /// servers with [`ClientAuth::Yes`] or [`ClientAuth::Optional`].
    pub fn client_cert(&self) -> PathBuf {
        self.cert(CLIENT)
    }

    /// The key of [`client_cert`](Self::client_cert).
    pub fn client_key(&self) -> PathBuf {
        self.key(CLIENT)
    }

    /// A second CA, unrelated to [`ca_cert`](Self::ca_cert).
    pub fn other_ca_cert(&self) -> PathBuf {
        self.cert(OTHER_CA)
    }

    /// A server certificate for `localhost` and `127.0.0.1` signed by the
    /// other CA: an "unknown CA" to clients trusting only the CA.
    pub fn other_ca_server_cert(&self) -> PathBuf {
        self.cert(OTHER_CA_SERVER)
    }

    /// The key of [`other_ca_server_cert`](Self::other_ca_server_cert).
    pub fn other_ca_server_key(&self) -> PathBuf {
        self.key(OTHER_CA_SERVER)
    }

    /// A server certificate signed by the CA but valid only for
    /// `DNS:not-this-host.example` (also its CN): a name mismatch for
    /// clients connecting to `localhost` or `127.0.0.1`.
    pub fn wrong_name_server_cert(&self) -> PathBuf {
        self.cert(WRONG_NAME_SERVER)
    }

    /// The key of [`wrong_name_server_cert`](Self::wrong_name_server_cert).
    pub fn wrong_name_server_key(&self) -> PathBuf {
        self.key(WRONG_NAME_SERVER)
    }

    /// A server certificate for `localhost` and `127.0.0.1` signed by the
    /// CA, valid from 2020-01-01 to 2020-01-02 (UTC): expired.
    pub fn expired_server_cert(&self) -> PathBuf {
        self.cert(EXPIRED_SERVER)
    }

    /// The key of [`expired_server_cert`](Self::expired_server_cert).
    pub fn expired_server_key(&self) -> PathBuf {
        self.key(EXPIRED_SERVER)
    }

    fn cert(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.crt"))
    }

    fn key(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.key"))
    }

    fn generate_in(prefix: &str) -> TlsFiles {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .unwrap_or_else(|e| panic!("testkit: cannot create a temporary directory: {e}"));
        let files = TlsFiles { dir };
        let path = files.dir();
        write(&path.join("openssl.cnf"), OPENSSL_CNF);
        fs::create_dir(path.join("ca-db")).unwrap_or_else(|e| {
            panic!(
                "testkit: cannot create {}: {e}",
                path.join("ca-db").display()
            )
        });
        write(&path.join("ca-db/index.txt"), "");
        write(&path.join("ca-db/serial"), "1000\n");

        let openssl = openssl_binary();
        // Round 1: both CAs (key and self-signed certificate in one run) and
        // every leaf's key and request.
        let round = vec![
            ca_args(CA, "testkit CA"),
            ca_args(OTHER_CA, "testkit other CA"),
            request_args(SERVER, "localhost", Some(LOCALHOST_SAN), "serverAuth"),
            request_args(CLIENT, "testkit client", None, "clientAuth"),
            request_args(
                OTHER_CA_SERVER,
                "localhost",
                Some(LOCALHOST_SAN),
                "serverAuth",
            ),
            request_args(
                WRONG_NAME_SERVER,
                WRONG_NAME,
                Some(&format!("DNS:{WRONG_NAME}")),
                "serverAuth",
            ),
            request_args(
                EXPIRED_SERVER,
                "localhost",
                Some(LOCALHOST_SAN),
                "serverAuth",
            ),
        ];
        run_all(&openssl, path, round);
        // Round 2: the CAs sign.
        let round = vec![
            sign_args(SERVER, CA, 1),
            sign_args(CLIENT, CA, 2),
            sign_args(WRONG_NAME_SERVER, CA, 3),
            sign_args(OTHER_CA_SERVER, OTHER_CA, 1),
            expired_args(EXPIRED_SERVER, CA),
        ];
        run_all(&openssl, path, round);
        files
    }
}

/// Removes the shared directory at process exit (see [`TlsFiles::shared`]).
extern "C" fn remove_shared_dir() {
    if let Some(files) = SHARED.get() {
        let _ = fs::remove_dir_all(files.dir());
    }
}

fn write(path: &Path, contents: &str) {
    fs::write(path, contents)
        .unwrap_or_else(|e| panic!("testkit: cannot write {}: {e}", path.display()));
}

/// `openssl req -x509`: a CA's key and self-signed certificate.
fn ca_args(name: &str, cn: &str) -> Vec<String> {
    let mut args = strings(&["req", "-config", "openssl.cnf", "-x509"]);
    args.extend(new_key_args(name));
    args.extend(strings(&["-sha256", "-days", DAYS, "-subj"]));
    args.push(format!("/CN={cn}"));
    for ext in [
        "basicConstraints=critical,CA:TRUE",
        "keyUsage=critical,keyCertSign,cRLSign",
        "subjectKeyIdentifier=hash",
    ] {
        args.extend(strings(&["-addext", ext]));
    }
    args.extend(strings(&["-out", &format!("{name}.crt")]));
    args
}

/// `openssl req -new`: a leaf's key and certificate request, carrying the
/// extensions that signing copies into the certificate.
fn request_args(name: &str, cn: &str, san: Option<&str>, usage: &str) -> Vec<String> {
    let mut args = strings(&["req", "-config", "openssl.cnf", "-new"]);
    args.extend(new_key_args(name));
    args.push("-subj".into());
    args.push(format!("/CN={cn}"));
    args.extend(strings(&["-addext", "basicConstraints=critical,CA:FALSE"]));
    args.extend(strings(&["-addext", &format!("extendedKeyUsage={usage}")]));
    if let Some(san) = san {
        args.extend(strings(&["-addext", &format!("subjectAltName={san}")]));
    }
    args.extend(strings(&["-out", &format!("{name}.csr")]));
    args
}

/// A new unencrypted EC P-256 key written to `NAME.key`.
fn new_key_args(name: &str) -> Vec<String> {
    strings(&[
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        &format!("{name}.key"),
    ])
}

/// `openssl x509 -req`: `ca` signs `name`'s request for [`DAYS`] days.
fn sign_args(name: &str, ca: &str, serial: u32) -> Vec<String> {
    strings(&[
        "x509",
        "-req",
        "-in",
        &format!("{name}.csr"),
        "-CA",
        &format!("{ca}.crt"),
        "-CAkey",
        &format!("{ca}.key"),
        "-set_serial",
        &serial.to_string(),
        "-days",
        DAYS,
        "-sha256",
        "-copy_extensions",
        "copy",
        "-out",
        &format!("{name}.crt"),
    ])
}

/// `openssl ca`: `ca` signs `name`'s request with validity dates in the
/// past, which `x509 -req` cannot set.
fn expired_args(name: &str, ca: &str) -> Vec<String> {
    strings(&[
        "ca",
        "-batch",
        "-notext",
        "-config",
        "openssl.cnf",
        "-cert",
        &format!("{ca}.crt"),
        "-keyfile",
        &format!("{ca}.key"),
        "-in",
        &format!("{name}.csr"),
        "-startdate",
        EXPIRED_FROM,
        "-enddate",
        EXPIRED_UNTIL,
        "-out",
        &format!("{name}.crt"),
    ])
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|&a| a.to_owned()).collect()
}

/// Runs `openssl` once per argument list, all at once, in `dir`; panics
/// with the output of the first that fails.
fn run_all(openssl: &Path, dir: &Path, runs: Vec<Vec<String>>) {
    let children: Vec<(Vec<String>, Child)> = runs
        .into_iter()
        .map(|args| {
            let child = Command::new(openssl)
                .args(&args)
                .current_dir(dir)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        panic!("{NOT_FOUND} (tried {})", openssl.display());
                    }
                    panic!("testkit: cannot spawn {}: {e}", openssl.display())
                });
            (args, child)
        })
        .collect();
    // Wait for all before panicking, so no child is left running.
    let mut failures = Vec::new();
    for (args, child) in children {
        match child.wait_with_output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => failures.push(format!(
                "`openssl {}` failed ({}):\n{}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )),
            Err(e) => failures.push(format!("`openssl {}`: {e}", args.join(" "))),
        }
    }
    if let Some(first) = failures.first() {
        panic!(
            "testkit: cannot make TLS files in {}: {first}",
            dir.display()
        );
    }
}

/// `$OPENSSL` if set, else `openssl` (looked up in `$PATH` when run).
fn openssl_binary() -> PathBuf {
    std::env::var_os("OPENSSL")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("openssl"), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_auth_args() {
        assert_eq!(ClientAuth::No.as_arg(), "no");
        assert_eq!(ClientAuth::Yes.as_arg(), "yes");
        assert_eq!(ClientAuth::Optional.as_arg(), "optional");
        assert_eq!(ClientAuth::default(), ClientAuth::No);
    }

    #[test]
    fn generate_makes_every_file_and_drop_removes_them() {
        let files = TlsFiles::generate();
        let all = [
            files.ca_cert(),
            files.ca_key(),
            files.server_cert(),
            files.server_key(),
            files.client_cert(),
            files.client_key(),
            files.other_ca_cert(),
            files.other_ca_server_cert(),
            files.other_ca_server_key(),
            files.wrong_name_server_cert(),
            files.wrong_name_server_key(),
            files.expired_server_cert(),
            files.expired_server_key(),
        ];
        for path in &all {
            assert!(path.is_file(), "{} missing", path.display());
            let text = fs::read_to_string(path).unwrap();
            assert!(
                text.starts_with("-----BEGIN "),
                "{}: {text}",
                path.display()
            );
        }
        let dir = files.dir().to_owned();
        assert!(
            dir.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("testkit-tls-")
        );
        drop(files);
        assert!(!dir.exists());
    }

    #[test]
    fn a_missing_openssl_is_named() {
        let err = std::panic::catch_unwind(|| {
            run_all(
                Path::new("/nonexistent/openssl"),
                Path::new("/"),
                vec![vec!["version".to_owned()]],
            )
        })
        .unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(msg.starts_with(NOT_FOUND), "{msg}");
    }
}
