//! The runners, one module per markdown file: each starts the servers its block needs,
//! calls the block's functions, and checks what a reader would.

pub mod blocking;
pub mod delay_queue;
pub mod election;
pub mod fencing;
pub mod getting_started;
pub mod locks;
pub mod read_write;
pub mod readme;
pub mod security;
pub mod semaphores;
pub mod several_locks;
pub mod topologies;
pub mod waiting_and_leases;

/// A client of a fresh server, and the server (kept alive by the caller).
pub async fn client() -> (fencelock::Client, testkit::RedisServer) {
    let redis = testkit::RedisServer::start();
    let client = fencelock::Client::connect(&redis.url())
        .await
        .expect("connect");
    (client, redis)
}
