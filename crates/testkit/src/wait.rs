//! Bounded polling for conditions that no event announces.

use std::thread;
use std::time::{Duration, Instant};

/// How long [`eventually`] sleeps between two checks.
const POLL: Duration = Duration::from_millis(2);

/// Polls `cond` every 2 ms until it holds, for at most `within`; for state
/// that no event announces (a server-side count, a client's statistics).
///
/// `cond` is checked at once and then after each pause; the panic comes only
/// after a failed check that ended once `within` had passed. It blocks the
/// calling thread (testkit has no async runtime): inside an async test,
/// poll with an async sleep of its own.
///
/// ```
/// use std::time::Duration;
///
/// let server = testkit::RedisServer::start();
/// server.cmd(&["SET", "k", "v", "PX", "20"]);
/// testkit::eventually("k expired", Duration::from_secs(5), || !server.exists("k"));
/// ```
///
/// # Panics
/// With `"{what}: not within {within:?}"` if `cond` still does not hold
/// once `within` has passed (and with whatever `cond` panics with).
#[track_caller]
pub fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    #[test]
    fn returns_once_the_condition_holds() {
        let mut calls = 0;
        let start = Instant::now();
        eventually("third call", Duration::from_secs(5), || {
            calls += 1;
            calls == 3
        });
        assert_eq!(calls, 3);
        // Two pauses of 2 ms each.
        assert!(start.elapsed() >= 2 * POLL, "{:?}", start.elapsed());
    }

    #[test]
    fn a_condition_that_holds_at_once_is_checked_once_even_without_time() {
        let mut calls = 0;
        eventually("at once", Duration::ZERO, || {
            calls += 1;
            true
        });
        assert_eq!(calls, 1);
    }

    #[test]
    fn panics_with_what_and_the_bound_after_the_bound() {
        let within = Duration::from_millis(20);
        let mut calls = 0;
        let start = Instant::now();
        let err = catch_unwind(AssertUnwindSafe(|| {
            eventually("the moon turns blue", within, || {
                calls += 1;
                false
            })
        }))
        .unwrap_err();
        assert!(start.elapsed() >= within, "{:?}", start.elapsed());
        assert!(calls >= 1);
        let msg = err
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| err.downcast_ref::<&str>().copied())
            .unwrap();
        assert_eq!(msg, "the moon turns blue: not within 20ms");
    }
}
