//! docs/guide/src/fencing.md

use crate::blocks::fencing as b;
use crate::rt;

/// The PostgreSQL check passes a current token and the write commits; a stale one is
/// refused and its transaction rolled back.
pub fn postgres() {
    rt().block_on(async {
        let redis = testkit::RedisServer::start();
        let pg = testkit::Postgres::start();
        pg.psql(fencelock::fence::POSTGRES_SETUP);
        pg.psql("CREATE TABLE stock (id int PRIMARY KEY, count int); INSERT INTO stock VALUES (42, 10)");
        let (mut db, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let locks = fencelock::Client::connect(&redis.url()).await.unwrap();
        b::postgres::sell_one(&locks, &mut db).await.unwrap();
        assert_eq!(pg.psql("SELECT count FROM stock"), "9");
        // A newer holder's token accepted since: the next sale's token is higher still,
        // but one checked with an old token is refused.
        pg.psql("UPDATE fencelock_fence SET token = token + 1000000000000000 WHERE resource = 'stock:42'");
        let e = b::postgres::sell_one(&locks, &mut db).await.unwrap_err();
        assert!(
            matches!(e.downcast_ref::<fencelock::Error>(), Some(fencelock::Error::Fenced { .. })),
            "{e:?}"
        );
        assert_eq!(pg.psql("SELECT count FROM stock"), "9", "rolled back");
    });
}

/// The fenced Redis write applies both writes under a current token.
pub fn redis() {
    rt().block_on(async {
        let (client, redis) = super::client().await;
        b::redis::sell_one(&client, &client).await.unwrap();
        assert_eq!(redis.get("{stock:42}:sold").as_deref(), Some("1"));
        assert_eq!(redis.cmd(&["LLEN", "{stock:42}:log"]).as_int(), Some(1));
    });
}
