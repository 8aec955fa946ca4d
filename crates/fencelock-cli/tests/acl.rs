//! The CLI as the guide's least-privilege ACL user (the line read from the guide's security chapter, so the
//! two cannot drift): `run` (plain, waiting, fair), `status`, `list` and `break` all work,
//! logged in with `--user` and `FENCELOCK_PASSWORD`.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use testkit::RedisServer;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");
const PASSWORD: &str = "cli-acl-pw";

/// A server with the guide's `ACL SETUSER fencelock ...` user.
fn server_with_guide_user() -> RedisServer {
    let server = RedisServer::start();
    common::add_guide_user(&server, PASSWORD);
    server
}

/// `fencelock args` as the guide's user, to the end.
fn as_user(server: &RedisServer, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FENCELOCK_REDIS", server.url())
        .env("FENCELOCK_USER", "fencelock")
        .env("FENCELOCK_PASSWORD", PASSWORD)
        .stdin(Stdio::null())
        .output()
        .expect("run fencelock")
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What an operator of a locked-down Redis checks: every subcommand works as the guide's
/// user, logged in as that user, and the server refused nothing.
#[test]
fn every_cli_command_works_as_the_readme_user() {
    let server = server_with_guide_user();
    assert!(ok(&as_user(&server, &["run", "job", "--", "echo", "ran"])).contains("ran"));
    let fair = as_user(
        &server,
        &["run", "--fair", "--wait", "5s", "job", "--", "true"],
    );
    ok(&fair);
    let permits = as_user(&server, &["run", "--permits", "2", "slots", "--", "true"]);
    ok(&permits);
    let shared = as_user(&server, &["run", "--shared", "report", "--", "true"]);
    ok(&shared);

    // A holder in the background, seen by status and list, freed by break.
    let mut holder = Command::new(BIN)
        .args(["run", "--ttl", "2s", "held", "--", "sleep", "30"])
        .env("FENCELOCK_REDIS", server.url())
        .env("FENCELOCK_USER", "fencelock")
        .env("FENCELOCK_PASSWORD", PASSWORD)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    testkit::eventually("the lock is held", Duration::from_secs(10), || {
        server.exists("fencelock:{held}")
    });
    let clients = server.cmd(&["CLIENT", "LIST"]);
    let clients = clients.as_str().unwrap_or_default();
    assert!(
        clients.lines().any(|c| c.contains("user=fencelock")),
        "the holder logged in as the guide's user: {clients}"
    );
    let status = ok(&as_user(&server, &["--json", "status", "held"]));
    assert!(status.contains("\"holder\""), "{status}");
    let list = ok(&as_user(&server, &["list"]));
    assert!(list.contains("held"), "{list}");
    ok(&as_user(&server, &["break", "--yes", "held"]));
    let holder_status = holder.wait().unwrap();
    assert_eq!(
        holder_status.code(),
        Some(76),
        "the holder hears it lost the lock"
    );
    assert!(!server.exists("fencelock:{held}"));

    // The server refused nothing (ACL LOG records every refusal).
    let log = server.cmd(&["ACL", "LOG"]);
    assert!(
        log.as_array().is_some_and(<[_]>::is_empty),
        "nothing was refused: {log:?}"
    );
}
