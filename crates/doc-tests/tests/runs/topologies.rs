//! docs/guide/src/topologies.md

use crate::blocks::topologies as b;
use crate::rt;

/// The Redlock block on three independent servers (restart protection off: the servers
/// were started a moment ago).
pub fn redlock() {
    rt().block_on(async {
        let nodes = testkit::RedisServer::start_many(3);
        let client = fencelock::Client::redlock(nodes.iter().map(|n| n.url()))
            .restart_protection(None)
            .connect()
            .await
            .unwrap();
        b::redlock::nightly_report(&client).await.unwrap();
        // The release answered once a majority had; the last node's call may still be
        // on its way (seen once in CI): `flush` waits for it, as the guide says.
        client.flush().await;
        for node in &nodes {
            assert_eq!(node.pttl("fencelock:{nightly-report}"), -2);
        }
    });
}
