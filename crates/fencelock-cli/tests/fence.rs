//! The CLI's fencing: the guide's recipe run as written (`fencelock sql` into `psql`,
//! a COMMAND under `fencelock run` that checks `FENCELOCK_TOKEN` in PostgreSQL and
//! writes Redis with `fencelock write`), then the same COMMAND with a stale token,
//! refused by both stores; and `fencelock write`'s bad input.

use std::path::PathBuf;
use std::process::{Command, Output};

use testkit::{Postgres, RedisServer};

mod common;
use common::bin;

const GUIDE: &str = include_str!("../../../docs/guide/src/fencing.md");

/// The shell block of the guide's fencing chapter ("From any language").
fn guide_recipe() -> String {
    let from = GUIDE
        .find("## From any language\n\nUnder `fencelock run`")
        .expect("the guide's fencing recipe");
    let rest = &GUIDE[from..];
    let start = rest.find("```sh\n").expect("its shell block") + "```sh\n".len();
    let len = rest[start..].find("\n```").expect("the block's end");
    rest[start..start + len].to_owned()
}

/// A shell in `dir` whose PATH finds the fencelock under test first, with the
/// recipe's variables.
fn shell(dir: &std::path::Path, redis: &RedisServer, pg: &Postgres) -> Command {
    let bin_dir = PathBuf::from(bin()).parent().unwrap().to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut sh = Command::new("sh");
    sh.current_dir(dir)
        .env("PATH", path)
        .env("DATABASE_URL", pg.url())
        .env("FENCELOCK_REDIS", redis.url())
        .env_remove("FENCELOCK_NAME")
        .env_remove("FENCELOCK_TOKEN");
    sh
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_guide_recipe_writes_under_the_lock_and_a_stale_token_is_refused_by_both_stores() {
    let redis = RedisServer::start();
    let pg = Postgres::start();
    pg.psql("CREATE TABLE stock (id int PRIMARY KEY, count int NOT NULL); INSERT INTO stock VALUES (42, 100)");
    let dir = tempfile::tempdir().unwrap();

    let out = shell(dir.path(), &redis, &pg)
        .args(["-e", "-c", &guide_recipe()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // Only the Redis write's reply: the check's empty result goes nowhere, so a person
    // sees no empty table.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1\n",
        "{}",
        text(&out)
    );
    assert_eq!(pg.psql("SELECT count FROM stock"), "99");
    assert_eq!(redis.get("{stock:42}:sold").as_deref(), Some("1"));
    let accepted = pg.psql("SELECT token FROM fencelock_fence WHERE resource = 'stock:42'");
    assert_eq!(
        redis.get("fencelock:{stock:42}:accepted"),
        Some(accepted.clone())
    );

    // The recipe again: the setup twice is fine, and the next holder's token is higher.
    let out = shell(dir.path(), &redis, &pg)
        .args(["-e", "-c", &guide_recipe()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(pg.psql("SELECT count FROM stock"), "98");
    assert_eq!(redis.get("{stock:42}:sold").as_deref(), Some("2"));

    // The first holder, late, with its old token: PostgreSQL refuses it (psql exits 3,
    // `set -e` stops the script before the Redis write), nothing is written.
    let out = shell(dir.path(), &redis, &pg)
        .env("FENCELOCK_NAME", "stock:42")
        .env("FENCELOCK_TOKEN", &accepted)
        .arg("sell-one.sh")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("stale fencing token {accepted}")),
        "{stderr}"
    );
    assert_eq!(pg.psql("SELECT count FROM stock"), "98");
    // The refusal rolled back, and is counted all the same.
    assert_eq!(pg.psql("SELECT fencelock_refusals()"), "1");
    // Its Redis write alone: exit 76, one line, nothing written.
    let out = shell(dir.path(), &redis, &pg)
        .env("FENCELOCK_NAME", "stock:42")
        .env("FENCELOCK_TOKEN", &accepted)
        .args(["-c", "fencelock write INCRBY '{stock:42}:sold' 1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(76), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("fencelock: resource \"stock:42\" refused fencing token"),
        "{stderr}"
    );
    assert_eq!(redis.get("{stock:42}:sold").as_deref(), Some("2"));
}

#[test]
fn fencelock_sql_prints_the_library_setup() {
    let out = Command::new(bin()).arg("sql").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        fencelock::fence::POSTGRES_SETUP
    );
}

#[test]
fn fencelock_write_prints_each_reply_and_refuses_bad_input_in_one_line() {
    let redis = RedisServer::start();
    let write = |args: &[&str]| {
        Command::new(bin())
            .arg("write")
            .args(["--redis", &redis.url()])
            .args(args)
            .env_remove("FENCELOCK_NAME")
            .env_remove("FENCELOCK_TOKEN")
            .output()
            .unwrap()
    };
    let out = write(&[
        "--resource",
        "r",
        "--token",
        "5",
        "SET",
        "{r}:a",
        "x",
        "incrby",
        "{r}:n",
        "4",
        "RPUSH",
        "{r}:l",
        "v",
        "PEXPIRE",
        "{r}:a",
        "60000",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "OK\n4\n1\n1\n");
    for (args, code, says) in [
        (
            &["--resource", "r", "--token", "-1", "SET", "k", "v"][..],
            64,
            "invalid fencing token",
        ),
        (
            &["--resource", "r", "--token", "x", "SET", "k", "v"],
            64,
            "invalid fencing token",
        ),
        (
            &[
                "--resource",
                "r",
                "--token",
                "18446744073709551616",
                "SET",
                "k",
                "v",
            ],
            64,
            "invalid fencing token",
        ),
        (
            &["--resource", "r", "--token", "5", "GET", "k"],
            64,
            "unknown write \"GET\"",
        ),
        (
            &["--resource", "r", "--token", "5", "SET", "k"],
            64,
            "SET needs 2 arguments",
        ),
        (
            &["--resource", "", "--token", "5", "SET", "k", "v"],
            64,
            "invalid resource name",
        ),
        (
            &["--resource", "r", "--token", "4", "SET", "{r}:a", "y"],
            76,
            "refused fencing token 4",
        ),
        (
            &["--resource", "r", "--token", "6", "HSET", "{r}:l", "f", "v"],
            69,
            "WRONGTYPE",
        ),
    ] {
        let out = write(args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    assert_eq!(
        redis.get("{r}:a").as_deref(),
        Some("x"),
        "nothing refused was written"
    );
    assert_eq!(redis.get("fencelock:{r}:accepted").as_deref(), Some("5"));
}
