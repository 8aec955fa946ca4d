//! TLS servers from `testkit::ServerBuilder::tls` against real clients:
//! `redis-cli --tls` and, where redis-cli cannot tell (it does not check the
//! server's name), `openssl s_client`. The error texts asserted here are the
//! ones listed in `testkit::tls`'s docs.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::{ClientAuth, RedisServer, TlsFiles, eventually};

/// How long one client run may take before it counts as hung.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client printed and whether it exited with success.
#[derive(Debug)]
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Stdout and stderr together, for assertions on a text wherever it went.
    fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `program args`, stdin from /dev/null, killed after
/// [`CLIENT_TIMEOUT`].
fn run(program: &str, args: &[&str]) -> Run {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{program} {}` hung", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    Run {
        success: status.success(),
        stdout,
        stderr,
    }
}

fn redis_cli() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

/// `redis-cli OPTIONS -h localhost -p TLS_PORT ping`.
fn cli_ping(server: &RedisServer, options: &[&str]) -> Run {
    let port = server.tls_port().expect("a TLS server").to_string();
    let mut args = options.to_vec();
    args.extend(["-h", "localhost", "-p", &port, "ping"]);
    run(&redis_cli(), &args)
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

/// Asserts that a client run answered `PONG`.
#[track_caller]
fn assert_pong(run: &Run) {
    assert!(run.success && run.stdout.trim() == "PONG", "{run:?}");
}

/// Asserts that a client run failed and printed exactly one of `texts`
/// (trimmed) as its output.
#[track_caller]
fn assert_fails_with(run: &Run, texts: &[&str]) {
    assert!(!run.success, "{run:?}");
    let text = run.text();
    assert!(texts.contains(&text.trim()), "{run:?}");
}

/// `openssl s_client` to the TLS port, trusting the CA and checking the
/// name `localhost` as a client library would, with `extra` options. It
/// sends nothing and, once the handshake is done, quits unless `extra` has
/// `-ign_eof`.
fn s_client(server: &RedisServer, files: &TlsFiles, extra: &[&str]) -> Run {
    let connect = format!("127.0.0.1:{}", server.tls_port().unwrap());
    let ca = files.ca_cert();
    let mut args = vec![
        "s_client",
        "-connect",
        &connect,
        "-servername",
        "localhost",
        "-CAfile",
        path(&ca),
        "-verify_hostname",
        "localhost",
        "-verify_return_error",
    ];
    args.extend(extra);
    run("openssl", &args)
}

/// Waits until the server's log has a line containing `text`.
#[track_caller]
fn assert_logged(server: &RedisServer, text: &str) {
    eventually(
        &format!("`{text}` in {}", server.log_path().display()),
        Duration::from_secs(5),
        || {
            std::fs::read_to_string(server.log_path())
                .unwrap_or_default()
                .contains(text)
        },
    );
}

/// The one line redis-cli prints for every certificate it refuses.
fn verify_failed(server: &RedisServer) -> String {
    format!(
        "Could not connect to Redis at localhost:{}: SSL_connect failed: certificate verify failed",
        server.tls_port().unwrap()
    )
}

#[test]
fn the_good_certificate_answers_pong_to_clients_trusting_the_ca() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder().tls(files, ClientAuth::No).start();
    let tls_port = server.tls_port().unwrap();
    assert_ne!(tls_port, server.port());
    assert_eq!(
        server.tls_url().unwrap(),
        format!("rediss://localhost:{tls_port}")
    );
    // testkit's own client keeps the plain port.
    assert_eq!(server.cmd(&["PING"]).as_str(), Some("PONG"));

    let ca = path(&files.ca_cert()).to_owned();
    assert_pong(&cli_ping(&server, &["--tls", "--cacert", &ca]));
    // The address is in the certificate too.
    let port = tls_port.to_string();
    assert_pong(&run(
        &redis_cli(),
        &[
            "--tls",
            "--cacert",
            &ca,
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "ping",
        ],
    ));
    assert!(s_client(&server, files, &[]).success);

    // Without the CA: the system's trust store does not know it.
    let untrusted = cli_ping(&server, &["--tls"]);
    assert_fails_with(&untrusted, &[&verify_failed(&server)]);
    // Trusting only the other CA: the same.
    let other = path(&files.other_ca_cert()).to_owned();
    let wrong_ca = cli_ping(&server, &["--tls", "--cacert", &other]);
    assert_fails_with(&wrong_ca, &[&verify_failed(&server)]);
    assert_logged(&server, "tlsv1 alert unknown ca");
    // Plain RESP to the TLS port.
    let plain = cli_ping(&server, &[]);
    assert_fails_with(
        &plain,
        &[
            "Error: Connection reset by peer",
            "Error: Server closed the connection",
        ],
    );
    assert_logged(&server, "wrong version number");
}

#[test]
fn a_server_without_tls_has_no_tls_port() {
    let server = RedisServer::start();
    assert_eq!(server.tls_port(), None);
    assert_eq!(server.tls_url(), None);
}

/// The texts redis-cli prints when a server that requires a client
/// certificate refuses it: the TLS 1.3 handshake completes on the client's
/// side, and the refusal arrives as the reply is read, as a close or a reset.
const REFUSED: &[&str] = &[
    "Error: Server closed the connection",
    "Error: Connection reset by peer",
];

#[test]
fn auth_clients_yes_refuses_a_client_without_a_certificate() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder().tls(files, ClientAuth::Yes).start();
    let ca = path(&files.ca_cert()).to_owned();

    let anonymous = cli_ping(&server, &["--tls", "--cacert", &ca]);
    assert_fails_with(&anonymous, REFUSED);
    assert_logged(&server, "peer did not return a certificate");

    let (cert, key) = (files.client_cert(), files.client_key());
    assert_pong(&cli_ping(
        &server,
        &[
            "--tls",
            "--cacert",
            &ca,
            "--cert",
            path(&cert),
            "--key",
            path(&key),
        ],
    ));

    // A certificate from the other CA is refused like none.
    let (cert, key) = (files.other_ca_server_cert(), files.other_ca_server_key());
    let stranger = cli_ping(
        &server,
        &[
            "--tls",
            "--cacert",
            &ca,
            "--cert",
            path(&cert),
            "--key",
            path(&key),
        ],
    );
    assert_fails_with(&stranger, REFUSED);
    assert_logged(&server, "certificate verify failed");

    // TLS 1.3: the refusal comes after the client's side of the handshake,
    // so s_client must keep reading to hear it.
    let s_client = s_client(&server, files, &["-ign_eof"]);
    assert!(!s_client.success, "{s_client:?}");
    assert!(
        s_client
            .text()
            .contains("tlsv13 alert certificate required"),
        "{s_client:?}"
    );
}

#[test]
fn auth_clients_optional_lets_both_in() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder()
        .tls(files, ClientAuth::Optional)
        .start();
    let ca = path(&files.ca_cert()).to_owned();
    assert_pong(&cli_ping(&server, &["--tls", "--cacert", &ca]));
    let (cert, key) = (files.client_cert(), files.client_key());
    assert_pong(&cli_ping(
        &server,
        &[
            "--tls",
            "--cacert",
            &ca,
            "--cert",
            path(&cert),
            "--key",
            path(&key),
        ],
    ));
}

#[test]
fn a_certificate_from_an_unknown_ca_is_refused() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder()
        .tls_with(
            files,
            files.other_ca_server_cert(),
            files.other_ca_server_key(),
            ClientAuth::No,
        )
        .start();
    let ca = path(&files.ca_cert()).to_owned();
    let cli = cli_ping(&server, &["--tls", "--cacert", &ca]);
    assert_fails_with(&cli, &[&verify_failed(&server)]);
    assert_logged(&server, "tlsv1 alert unknown ca");

    let s_client = s_client(&server, files, &[]);
    assert!(!s_client.success, "{s_client:?}");
    assert!(
        s_client
            .text()
            .contains("Verification error: unable to get local issuer certificate"),
        "{s_client:?}"
    );
}

#[test]
fn an_expired_certificate_is_refused() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder()
        .tls_with(
            files,
            files.expired_server_cert(),
            files.expired_server_key(),
            ClientAuth::No,
        )
        .start();
    let ca = path(&files.ca_cert()).to_owned();
    let cli = cli_ping(&server, &["--tls", "--cacert", &ca]);
    assert_fails_with(&cli, &[&verify_failed(&server)]);
    assert_logged(&server, "sslv3 alert certificate expired");

    let s_client = s_client(&server, files, &[]);
    assert!(!s_client.success, "{s_client:?}");
    assert!(
        s_client
            .text()
            .contains("Verification error: certificate has expired"),
        "{s_client:?}"
    );
}

#[test]
fn a_certificate_for_another_name_passes_redis_cli_but_not_a_name_check() {
    let files = TlsFiles::shared();
    let server = RedisServer::builder()
        .tls_with(
            files,
            files.wrong_name_server_cert(),
            files.wrong_name_server_key(),
            ClientAuth::No,
        )
        .start();
    let ca = path(&files.ca_cert()).to_owned();
    // redis-cli (hiredis) checks the chain and the dates, not the name.
    assert_pong(&cli_ping(&server, &["--tls", "--cacert", &ca]));

    let s_client = s_client(&server, files, &[]);
    assert!(!s_client.success, "{s_client:?}");
    assert!(
        s_client
            .text()
            .contains("Verification error: hostname mismatch"),
        "{s_client:?}"
    );
    assert_logged(&server, "sslv3 alert bad certificate");
}

#[test]
fn a_restarted_server_serves_its_own_copies_on_the_same_tls_port() {
    let files = TlsFiles::generate();
    let mut server = RedisServer::builder().tls(&files, ClientAuth::No).start();
    let tls_port = server.tls_port();
    let keep = tempfile::NamedTempFile::new().unwrap();
    std::fs::copy(files.ca_cert(), keep.path()).unwrap();
    let ca = path(keep.path()).to_owned();
    drop(files);

    server.restart();
    assert_eq!(server.tls_port(), tls_port);
    assert_pong(&cli_ping(&server, &["--tls", "--cacert", &ca]));
}

#[test]
fn a_missing_certificate_file_is_named_at_start() {
    let files = TlsFiles::shared();
    let err = std::panic::catch_unwind(|| {
        RedisServer::builder()
            .tls_with(
                files,
                "/nonexistent/server.crt",
                files.server_key(),
                ClientAuth::No,
            )
            .start()
    })
    .unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(
        msg.starts_with("testkit: cannot copy TLS file /nonexistent/server.crt to "),
        "{msg}"
    );
}

const SHARED_CHILD_ENV: &str = "TESTKIT_TLS_SHARED_CHILD";
const SHARED_TEST_NAME: &str = "the_shared_files_are_made_once_and_removed_at_exit";

#[test]
fn the_shared_files_are_made_once_and_removed_at_exit() {
    if std::env::var_os(SHARED_CHILD_ENV).is_some() {
        let files = TlsFiles::shared();
        assert!(std::ptr::eq(files, TlsFiles::shared()));
        println!("TLS_DIR={}", files.dir().display());
        return;
    }
    // Re-run this test alone in a child process, which exits normally.
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            SHARED_TEST_NAME,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SHARED_CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    // libtest prints "test NAME ... " first, on the same line.
    let dir = stdout
        .lines()
        .find_map(|line| line.split_once("TLS_DIR=").map(|(_, d)| d.to_owned()))
        .unwrap_or_else(|| panic!("no TLS_DIR in {stdout}"));
    let dir = Path::new(&dir);
    let name = dir.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with(&format!("testkit-tls-shared-{pid}-")),
        "{name}"
    );
    assert_eq!(dir.parent(), Some(std::env::temp_dir().as_path()));
    assert!(!dir.exists(), "{} outlived its process", dir.display());
}
