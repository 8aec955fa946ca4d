//! `fencelock` over TLS end to end: the real binary against real redis-servers with a
//! TLS port (testkit's certificates; testkit itself talks to the plain ports). What a
//! user checks: the command runs with the CA given (option or variable), mutual TLS,
//! each mistake one line on stderr with exit 69 (a certificate or a TLS/plain mix-up) or
//! 64 (bad input), the command never run without the lock, `status` and `list` over
//! TLS, sentinels over TLS, and never a panic.
//!
//! `FENCELOCK_BIN` runs these tests against another build of the binary, such as the
//! one `cargo build` makes at the workspace root (`target/debug/fencelock`), whose
//! dependencies' features are those of the whole workspace.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use testkit::{ClientAuth, RedisServer, SentinelGroup, TlsFiles};

mod common;
use common::{arg, command, fencelock, fencelock_with};

/// A server with a TLS port serving testkit's good certificate.
fn tls_server(clients: ClientAuth) -> RedisServer {
    RedisServer::builder()
        .tls(TlsFiles::shared(), clients)
        .start()
}

/// The server's TLS URL, `rediss://localhost:PORT`.
fn tls_url(server: &RedisServer) -> String {
    server.tls_url().expect("a TLS port")
}

/// `run ... NAME -- sh -c 'echo ran'`, after the connection options `options`.
fn run_args<'a>(options: &[&'a str], name: &'a str) -> Vec<&'a str> {
    let mut args = vec!["run"];
    args.extend_from_slice(options);
    args.extend([name, "--", "sh", "-c", "echo ran"]);
    args
}

/// With `--cacert`, `fencelock run` over rediss:// runs the command under the lock and
/// exits 0; the lock is released after.
#[test]
fn run_over_tls_with_the_ca_runs_the_command() {
    let server = tls_server(ClientAuth::No);
    let (url, ca) = (tls_url(&server), TlsFiles::shared().ca_cert());
    let run = fencelock(&run_args(&["--redis", &url, "--cacert", arg(&ca)], "job"));
    run.ran();
    assert!(!server.exists("fencelock:{job}"), "released after");
    // The fencing counter shows the lock was taken on this server.
    assert!(server.get("fencelock:{job}:fence").is_some());
}

/// Without the CA, `run` exits 69 with one line naming the untrusted CA, and the
/// command never runs; the same CA given through FENCELOCK_CACERT works.
#[test]
fn without_the_ca_run_exits_69_in_one_line_and_the_command_never_runs() {
    let server = tls_server(ClientAuth::No);
    let url = tls_url(&server);
    let run = fencelock(&run_args(&["--redis", &url], "job"));
    let line = run.fails_with(69);
    assert!(line.contains("not trust"), "{line}");
    assert!(
        line.contains(&format!("localhost:{}", server.tls_port().unwrap())),
        "{line}"
    );
    assert_eq!(run.stdout, "", "the command never ran");

    let ca = TlsFiles::shared().ca_cert();
    fencelock_with(
        &run_args(&["--redis", &url], "job"),
        &[("FENCELOCK_CACERT", &ca)],
    )
    .ran();
    // The variable names the wrong CA: refused as without one.
    let other = TlsFiles::shared().other_ca_cert();
    let run = fencelock_with(
        &run_args(&["--redis", &url], "job"),
        &[("FENCELOCK_CACERT", &other)],
    );
    assert!(run.fails_with(69).contains("not trust"), "{run:#?}");
    assert_eq!(run.stdout, "");
}

/// Mutual TLS: a server that requires a client certificate refuses `run` without
/// one (69, one line saying so) and runs the command with `--cert`/`--key`, or with
/// FENCELOCK_CERT/FENCELOCK_KEY.
#[test]
fn mutual_tls_needs_cert_and_key_from_options_or_variables() {
    let files = TlsFiles::shared();
    let server = tls_server(ClientAuth::Yes);
    let url = tls_url(&server);
    let (ca, cert, key) = (files.ca_cert(), files.client_cert(), files.client_key());

    let run = fencelock(&run_args(&["--redis", &url, "--cacert", arg(&ca)], "m"));
    assert!(
        run.fails_with(69).contains("client certificate"),
        "{run:#?}"
    );
    assert_eq!(run.stdout, "");

    let options = [
        "--redis",
        &url,
        "--cacert",
        arg(&ca),
        "--cert",
        arg(&cert),
        "--key",
        arg(&key),
    ];
    fencelock(&run_args(&options, "m")).ran();
    fencelock_with(
        &run_args(&["--redis", &url], "m"),
        &[
            ("FENCELOCK_CACERT", &ca),
            ("FENCELOCK_CERT", &cert),
            ("FENCELOCK_KEY", &key),
        ],
    )
    .ran();
    assert!(!server.exists("fencelock:{m}"), "released after");
}

/// `--cert` without `--key` (or the other way round) is a usage error (64), said in
/// one line before anything runs.
#[test]
fn cert_without_key_is_a_usage_error() {
    let server = tls_server(ClientAuth::Yes);
    let url = tls_url(&server);
    let files = TlsFiles::shared();
    let (ca, cert, key) = (files.ca_cert(), files.client_cert(), files.client_key());
    // The line names the missing half.
    for (half, missing) in [
        (["--cert", arg(&cert)], "--key"),
        (["--key", arg(&key)], "--cert"),
    ] {
        let mut options = vec!["--redis", &url, "--cacert", arg(&ca)];
        options.extend(half);
        let run = fencelock(&run_args(&options, "half"));
        let line = run.fails_with(64);
        assert!(line.contains(missing), "{line}");
        assert_eq!(run.stdout, "");
    }
}

/// A missing `--cacert` file, a CA file that holds no certificate, and TLS options
/// with a redis:// URL are bad input: 64, one line, the command never runs.
#[test]
fn bad_tls_files_and_tls_options_without_tls_exit_64() {
    let server = tls_server(ClientAuth::No);
    let url = tls_url(&server);
    let files = TlsFiles::shared();

    let run = fencelock(&run_args(
        &["--redis", &url, "--cacert", "/nonexistent/ca.crt"],
        "b",
    ));
    let line = run.fails_with(64);
    assert!(line.contains("/nonexistent/ca.crt"), "{line}");
    assert_eq!(run.stdout, "");

    let key = files.ca_key();
    let run = fencelock(&run_args(&["--redis", &url, "--cacert", arg(&key)], "b"));
    assert!(
        run.fails_with(64).contains("holds no PEM certificate"),
        "{run:#?}"
    );

    let ca = files.ca_cert();
    let run = fencelock(&run_args(
        &["--redis", &server.url(), "--cacert", arg(&ca)],
        "b",
    ));
    assert!(run.fails_with(64).contains("use rediss://"), "{run:#?}");
    assert_eq!(run.stdout, "");
}

/// `--insecure` (and FENCELOCK_INSECURE=1 or true) lets `run` in despite a certificate
/// for another name, which is refused without it (and with FENCELOCK_INSECURE=0).
#[test]
fn insecure_runs_against_a_certificate_for_another_name() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder()
        .tls_with(
            files,
            files.wrong_name_server_cert(),
            files.wrong_name_server_key(),
            ClientAuth::No,
        )
        .start();
    let (url, ca) = (tls_url(&server), files.ca_cert());
    let run = fencelock(&run_args(&["--redis", &url, "--cacert", arg(&ca)], "i"));
    assert!(run.fails_with(69).contains("host name"), "{run:#?}");
    fencelock(&run_args(&["--redis", &url, "--insecure"], "i")).ran();
    for yes in ["1", "true"] {
        fencelock_with(
            &run_args(&["--redis", &url], "i"),
            &[("FENCELOCK_INSECURE", Path::new(yes))],
        )
        .ran();
    }
    let run = fencelock_with(
        &run_args(&["--redis", &url, "--cacert", arg(&ca)], "i"),
        &[("FENCELOCK_INSECURE", Path::new("0"))],
    );
    assert!(run.fails_with(69).contains("host name"), "{run:#?}");
    // The driver's own `#insecure` URL fragment skips nothing: only the option does.
    let fragment = format!("{url}#insecure");
    let run = fencelock(&run_args(
        &["--redis", &fragment, "--cacert", arg(&ca)],
        "i",
    ));
    assert!(run.fails_with(69).contains("host name"), "{run:#?}");
    assert_eq!(run.stdout, "");
}

/// An expired server certificate, and a system certificate store that cannot be read
/// (SSL_CERT_FILE naming no file; read even with `--cacert`), each exit 69 with one
/// line naming the problem, and the command never runs.
#[test]
fn an_expired_certificate_and_an_unreadable_system_store_exit_69_naming_them() {
    let files = TlsFiles::shared();
    let expired = RedisServer::builder()
        .tls_with(
            files,
            files.expired_server_cert(),
            files.expired_server_key(),
            ClientAuth::No,
        )
        .start();
    let ca = files.ca_cert();
    let run = fencelock(&run_args(
        &["--redis", &tls_url(&expired), "--cacert", arg(&ca)],
        "e",
    ));
    assert!(run.fails_with(69).contains("has expired"), "{run:#?}");
    assert_eq!(run.stdout, "");

    let server = tls_server(ClientAuth::No);
    let run = fencelock_with(
        &run_args(&["--redis", &tls_url(&server), "--cacert", arg(&ca)], "e"),
        &[("SSL_CERT_FILE", Path::new("/nonexistent/ca.pem"))],
    );
    let line = run.fails_with(69);
    assert!(
        line.contains("system's CA certificates could not be read")
            && line.contains("SSL_CERT_FILE"),
        "{line}"
    );
    assert_eq!(run.stdout, "");
}

/// A TLS/plain mix-up exits 69 with one line telling which scheme to use.
#[test]
fn a_tls_plain_mix_up_exits_69_with_a_hint() {
    let server = tls_server(ClientAuth::No);
    let ca = TlsFiles::shared().ca_cert();
    let tls_to_plain = format!("rediss://localhost:{}", server.port());
    let run = fencelock(&run_args(
        &["--redis", &tls_to_plain, "--cacert", arg(&ca)],
        "x",
    ));
    let line = run.fails_with(69);
    assert!(
        line.contains("no TLS handshake") && line.contains("use redis://"),
        "{line}"
    );

    let plain_to_tls = format!("redis://localhost:{}", server.tls_port().unwrap());
    let run = fencelock(&run_args(&["--redis", &plain_to_tls], "x"));
    assert!(run.fails_with(69).contains("use rediss://"), "{run:#?}");
    assert_eq!(run.stdout, "");
}

/// `status` and `list` read a lock held over TLS (by a `run` over TLS), and `status`
/// without the CA exits 69 in one line.
#[test]
fn status_and_list_work_over_tls() {
    let server = tls_server(ClientAuth::No);
    let (url, ca) = (tls_url(&server), TlsFiles::shared().ca_cert());
    let mut holder = command(
        &[
            "run",
            "--redis",
            &url,
            "--cacert",
            arg(&ca),
            "nightly",
            "--",
            "sleep",
            "60",
        ],
        &[],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn fencelock run");
    let holder_pid = holder.id();
    let _reap = Reap(&mut holder);
    testkit::eventually("the lock is taken", Duration::from_secs(10), || {
        server.exists("fencelock:{nightly}")
    });

    let connection = ["--redis", &url, "--cacert", arg(&ca)];
    let status = fencelock(&[&["status"], &connection[..], &["nightly"]].concat());
    assert_eq!(status.status.code(), Some(0), "{status:#?}");
    assert!(
        status.stdout.contains("lock \"nightly\": held"),
        "{status:#?}"
    );
    assert!(
        status.stdout.contains(&format!("pid {holder_pid}")),
        "{status:#?}"
    );

    let list = fencelock(&[&["list"], &connection[..]].concat());
    assert_eq!(list.status.code(), Some(0), "{list:#?}");
    assert!(list.stdout.contains("nightly"), "{list:#?}");

    let run = fencelock(&["status", "--redis", &url, "nightly"]);
    assert!(run.fails_with(69).contains("not trust"), "{run:#?}");
    let run = fencelock(&["list", "--redis", &url]);
    assert!(run.fails_with(69).contains("not trust"), "{run:#?}");
}

/// `run` through sentinels over TLS (rediss+sentinel://) with `--cacert` runs the
/// command on the master; without the CA it exits 69 naming the CA problem.
#[test]
fn run_through_sentinels_over_tls() {
    let group = SentinelGroup::builder().tls(TlsFiles::shared()).start();
    let (url, ca) = (group.url(), TlsFiles::shared().ca_cert());
    fencelock(&run_args(&["--redis", &url, "--cacert", arg(&ca)], "s")).ran();
    assert!(group.master().get("fencelock:{s}:fence").is_some());

    let run = fencelock(&run_args(&["--redis", &url], "s"));
    assert!(run.fails_with(69).contains("not trust"), "{run:#?}");
    assert_eq!(run.stdout, "");
}

/// Kills and reaps a background `fencelock` when the test ends, passed or not.
struct Reap<'a>(&'a mut Child);

impl Drop for Reap<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
