//! The CLI on servers other than Debian's Redis 7.0, as an operator would meet them: a
//! managed Redis with its admin commands renamed away, used as the guide's ACL user;
//! Redis 6.2 (`fencelock write`, whose script has a `#!lua` line Redis 6.2 cannot read);
//! a server older than fencelock supports (a real one whose `INFO` a proxy rewrites).

use std::fs;
use std::path::Path;

use testkit::{Fault, FaultProxy, RedisServer, ServerBuild, ServerBuilder};

mod common;
use common::{fencelock, fencelock_with};

const PASSWORD: &str = "managed-cli-pw";

/// A server with `CONFIG`, `CLIENT`, `DEBUG`, `MODULE`, `SCRIPT` and `extra` renamed away,
/// and the guide's `ACL SETUSER fencelock ...` user.
fn managed(extra: &[&str]) -> RedisServer {
    let server = RedisServer::builder()
        .rename_away(ServerBuilder::MANAGED_AWAY)
        .rename_away(extra.iter().copied())
        .start();
    common::add_guide_user(&server, PASSWORD);
    server
}

/// `fencelock ARGS...` on `server`, as the guide's ACL user (`FENCELOCK_USER`, the password
/// in `FENCELOCK_PASSWORD_FILE`).
fn as_user(server: &RedisServer, args: &[&str]) -> common::Run {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    fs::write(&file, PASSWORD).unwrap();
    let url = server.url();
    fencelock_with(
        args,
        &[
            ("FENCELOCK_REDIS", Path::new(&url)),
            ("FENCELOCK_USER", Path::new("fencelock")),
            ("FENCELOCK_PASSWORD_FILE", file.as_path()),
        ],
    )
}

/// With the admin commands renamed away (and `INFO` too), `run`, `write`, `elect`,
/// `status`, `list` and `break` work as the guide's ACL user; `status` says that the
/// eviction policy is unknown, and why; nothing is called a Sentinel.
#[test]
fn the_cli_works_on_a_managed_redis_with_admin_commands_renamed_away() {
    for extra in [&[][..], &["INFO"][..]] {
        let server = managed(extra);
        as_user(&server, &["run", "job", "--", "echo", "ran"]).ran();
        let written = as_user(
            &server,
            &[
                "write",
                "--resource",
                "r",
                "--token",
                "5",
                "SET",
                "fencelock:r:a",
                "x",
            ],
        );
        assert_eq!(written.succeeded(), "OK\n");
        assert_eq!(server.get("fencelock:r:a").as_deref(), Some("x"));
        as_user(&server, &["elect", "leader", "--", "echo", "ran"]).ran();
        let status = as_user(&server, &["status", "job"]);
        let status = status.succeeded();
        let unknown = status
            .lines()
            .find(|l| l.starts_with("warning: the eviction policy of"));
        if extra.is_empty() {
            assert_eq!(unknown, None, "INFO answers: {status}");
        } else {
            let unknown = unknown.unwrap_or_else(|| panic!("said unknown: {status}"));
            assert!(
                unknown.contains(&format!(
                    "{} is unknown (the server refuses INFO",
                    server.addr()
                )),
                "{unknown}"
            );
        }
        let json = as_user(&server, &["--json", "status", "job"]);
        let json: serde_json::Value = serde_json::from_str(json.succeeded()).unwrap();
        assert_eq!(
            json["eviction_unknown"].as_array().map(Vec::len),
            Some(extra.len()),
            "{json}"
        );
        as_user(&server, &["list"]).succeeded();
        as_user(&server, &["break", "--yes", "job"]).succeeded();
        let everything = format!("{status}{json}");
        assert!(!everything.contains("Sentinel"), "{everything}");
    }
}

/// `fencelock write` on Redis 6.2, whose script's `#!lua` line (Redis 7 syntax) is left
/// out there.
#[test]
fn fencelock_write_works_on_redis_6_2() {
    let redis = RedisServer::builder().server(ServerBuild::Redis62).start();
    let url = redis.url();
    let out = fencelock(&[
        "write",
        "--redis",
        &url,
        "--resource",
        "r",
        "--token",
        "5",
        "SET",
        "{r}:a",
        "x",
    ]);
    assert_eq!(out.succeeded(), "OK\n");
    assert_eq!(redis.get("{r}:a").as_deref(), Some("x"));
}

/// A server that says it is older than fencelock supports: exit 69 and one line naming
/// the version it found and the one it needs.
#[test]
fn a_server_older_than_6_2_is_refused_in_one_line() {
    let redis = RedisServer::start();
    let info = redis.cmd(&["INFO", "server"]);
    let version = info
        .as_str()
        .and_then(|i| i.lines().find_map(|l| l.strip_prefix("redis_version:")))
        .expect("a redis_version")
        .trim()
        .to_owned();
    let (_, rest) = version.split_once('.').expect("major.minor.patch");
    let older = format!("5.{rest}");
    let proxy = FaultProxy::start(&redis.addr());
    proxy.set(Fault::Rewrite {
        from: format!("redis_version:{version}").into_bytes(),
        to: format!("redis_version:{older}").into_bytes(),
    });
    let url = proxy.url();
    for args in [
        &["status", "--redis", &url, "x"][..],
        &["run", "--redis", &url, "x", "--", "true"][..],
    ] {
        let run = fencelock(args);
        let line = run.fails_with(69);
        assert!(
            line.contains(&format!(" {older}, and fencelock needs Redis 6.2 or later")),
            "{line}"
        );
    }
    assert!(!redis.exists("fencelock:{x}"));
}
