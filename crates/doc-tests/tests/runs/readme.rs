//! README.md's blocks.

use crate::blocks::readme as b;
use crate::rt;

/// The first program: the lock is taken, the work runs, the key is gone when `run`
/// returns; a held lock is waited for, then refused with a message that says so.
pub fn first_program() {
    let redis = testkit::RedisServer::start();
    let rt = rt();
    rt.block_on(b::first_program::sell_one(&redis.url()))
        .expect("sell_one");
    assert_eq!(
        redis.pttl("fencelock:{stock:42}"),
        -2,
        "released when run returned"
    );
    let held = rt.block_on(async {
        let c = fencelock::Client::connect(&redis.url()).await.unwrap();
        let g = c.lock("stock:42").try_acquire().await.unwrap();
        let e = b::first_program::sell_one(&redis.url()).await.unwrap_err();
        g.release().await.unwrap();
        e
    });
    assert!(matches!(held, fencelock::Error::Held { .. }), "{held:?}");
    // What is known of the holder: its lease's end if it stops renewing, not a wait.
    let text = held.to_string();
    assert!(
        text.starts_with(
            "gave up on lock \"stock:42\" after waiting 5s: another owner holds it; its lease ends in "
        ),
        "{text}"
    );
    assert!(text.contains(" unless the holder renews it"), "{text}");
    // `main` is compiled as shown; it needs a server at 6379, so it is not run.
    let _ = b::first_program::main;
}
