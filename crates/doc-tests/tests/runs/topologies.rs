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
        for node in &nodes {
            assert_eq!(node.pttl("fencelock:{nightly-report}"), -2);
        }
    });
}
