//! A short program that takes a lock and returns from `main` (also through an early
//! `?`) leaves no key behind when it ends as the README's first program does: `run` or
//! `try_run`, which await the release, or a guard released, or `client.flush()` awaited
//! after an early return. The program is a separate OS process, whose runtime shuts
//! down as `main` returns (cancelling whatever was left to background tasks); the key is
//! checked the moment it has exited.

use std::time::Duration;

use testkit::RedisServer;

mod common;
use common::spawn_helper;

const HELPER_ENV: &str = "FENCELOCK_SHORT_PROGRAM";

/// The program's error type: `?` converts both fencelock's errors and its own.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Fails the way a program's own step fails (a parse, a file), for the early `?`.
fn step_that_fails() -> Result<(), BoxError> {
    Err("the work's own step failed".into())
}

#[test]
#[ignore = "helper process entry point, started by the tests below"]
fn short_program() {
    common::helper_entry(HELPER_ENV, async |client, words| {
        let [ending] = &words[..] else {
            panic!("bad spec {words:?}")
        };
        // What `main` would return; the helper's runtime shuts down right after.
        let result: Result<(), BoxError> = match ending.as_str() {
            // The README's first program: the work under `run`.
            "run" => client
                .lock("short")
                .run(|token| async move { assert!(token.get() > 0) })
                .await
                .map_err(Into::into),
            // Fallible work that returns early through `?`.
            "try_run_early" => {
                client
                    .lock("short")
                    .try_run(|_token| async move {
                        step_that_fails()?;
                        Ok(())
                    })
                    .await
            }
            // A guard and an early `?`, with `flush()` before returning from `main`.
            "guard_flush" => {
                let result = async {
                    let _guard = client.lock("short").acquire().await?;
                    step_that_fails()?;
                    Ok(())
                }
                .await;
                client.flush().await;
                result
            }
            // The same without `flush()`: the dropped guard's background release is
            // cancelled when the runtime shuts down (the positive control).
            "guard_dropped" => {
                async {
                    let _guard = client.lock("short").acquire().await?;
                    step_that_fails()?;
                    Ok(())
                }
                .await
            }
            other => panic!("unknown ending {other}"),
        };
        if ending != "run" {
            assert!(result.is_err(), "{ending}: the early return");
        }
    });
}

/// Runs the short program with `ending` to its exit, then returns the lock key's `PTTL`.
fn pttl_after_exit(r: &RedisServer, ending: &str) -> i64 {
    let mut program = spawn_helper("short_program", HELPER_ENV, format!("{} {ending}", r.url()));
    let status = program.wait().unwrap();
    assert!(status.success(), "{ending}: {status}");
    r.cmd(&["PTTL", "fencelock:{short}"]).as_int().unwrap()
}

#[test]
fn a_program_that_returns_from_main_leaves_no_lock_behind() {
    let r = RedisServer::start();
    for ending in ["run", "try_run_early", "guard_flush"] {
        assert_eq!(pttl_after_exit(&r, ending), -2, "{ending}: the key is gone");
        // It was taken: a fencing token was minted.
        assert_eq!(
            r.cmd(&["EXISTS", "fencelock:{short}:fence"]).as_int(),
            Some(1),
            "{ending}"
        );
        r.cmd(&["DEL", "fencelock:{short}:fence"]);
    }
    // The control: a guard dropped by the early `?`, without `flush()`, leaves the key
    // for its whole lease, as the README warns.
    let left = pttl_after_exit(&r, "guard_dropped");
    assert!(
        left > Duration::from_secs(25).as_millis() as i64,
        "the dropped guard's key: PTTL {left}"
    );
}
