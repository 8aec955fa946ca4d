//! The resource the workers protect, in Redis or in PostgreSQL, written with fencelock's
//! own checks (`Client::fenced_write`, `fencelock_check`) or without any.
//!
//! The resource is a counter that every writer reads and writes back plus one (a lost
//! update shows as a counter below the number of acknowledged writes) and the set of
//! values written (C3 finds an acknowledged write missing from it). In Redis, under the
//! prefix `res:TAG`: `:counter` (a string) and `:values` (a hash: value -> token). In
//! PostgreSQL, the rows of `lab_counter` and `lab_values` for the tag. The fenced
//! resource is named after the lock (`lab:TAG`): its highest accepted token lives in
//! `fencelock:{lab:TAG}:accepted` on the resource server, or in `fencelock_fence`.

use std::time::Duration;

use fencelock::{Error, FencingToken};

/// The tables of the PostgreSQL resource, created once per lab run.
pub const POSTGRES_TABLES: &str = "\
    CREATE TABLE lab_counter (tag text PRIMARY KEY, n bigint NOT NULL); \
    CREATE TABLE lab_values (tag text NOT NULL, value bigint NOT NULL, token numeric NOT NULL);";

/// Where the resource lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// The resource `redis-server`.
    Redis,
    /// The lab's PostgreSQL.
    Postgres,
}

/// A worker's connection to the resource.
pub enum Store {
    Redis {
        /// Plain reads and the unfenced writes.
        conn: redis::aio::MultiplexedConnection,
        /// The fenced writes.
        store: fencelock::Client,
        prefix: String,
    },
    Postgres {
        client: tokio_postgres::Client,
        tag: String,
    },
}

impl Store {
    /// Connects to the resource of `prefix` (`res:TAG`) at `url`.
    pub async fn connect(kind: StoreKind, url: &str, prefix: &str) -> Result<Self, String> {
        Self::connect_with(kind, url, prefix, None).await
    }

    /// Connects as [`Store::connect`], waiting up to `patience` (instead of the clients'
    /// default half a second to a second) for each Redis reply: for a process that may be
    /// stopped with a request in flight (the CLI scenarios' COMMAND, suspended with its
    /// job), whose timer would otherwise fire on resume before the reply waiting in its
    /// socket is read.
    pub async fn connect_with(
        kind: StoreKind,
        url: &str,
        prefix: &str,
        patience: Option<Duration>,
    ) -> Result<Self, String> {
        match kind {
            StoreKind::Redis => {
                let mut config = redis::AsyncConnectionConfig::new();
                let mut builder = fencelock::Client::builder(url);
                if let Some(patience) = patience {
                    config = config.set_response_timeout(Some(patience));
                    builder = builder.response_timeout(patience);
                }
                let conn = redis::Client::open(url)
                    .map_err(|e| e.to_string())?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(|e| format!("resource connect: {e}"))?;
                let store = builder
                    .connect()
                    .await
                    .map_err(|e| format!("resource connect: {e}"))?;
                Ok(Self::Redis {
                    conn,
                    store,
                    prefix: prefix.to_owned(),
                })
            }
            StoreKind::Postgres => {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| format!("resource connect: {e}"))?;
                tokio::spawn(connection);
                Ok(Self::Postgres {
                    client,
                    tag: prefix.to_owned(),
                })
            }
        }
    }

    /// The counter (0 before the first write).
    pub async fn read(&mut self) -> Result<i64, String> {
        match self {
            Self::Redis { conn, prefix, .. } => {
                let v: Option<i64> = redis::cmd("GET")
                    .arg(format!("{prefix}:counter"))
                    .query_async(conn)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(v.unwrap_or(0))
            }
            Self::Postgres { client, tag } => {
                let row = client
                    .query_opt("SELECT n FROM lab_counter WHERE tag = $1", &[tag])
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(row.map_or(0, |r| r.get(0)))
            }
        }
    }

    /// Writes `next` into the counter and `value` into the values, with `token` checked
    /// by the resource of `lock` (the lock's name) when `fenced`. `Ok(false)`: the
    /// resource refused the token (nothing written).
    pub async fn write(
        &mut self,
        fenced: Option<&str>,
        token: u64,
        next: i64,
        value: i64,
    ) -> Result<bool, String> {
        let token = FencingToken::new(token);
        match self {
            Self::Redis {
                conn,
                store,
                prefix,
            } => {
                let (counter, values) = (format!("{prefix}:counter"), format!("{prefix}:values"));
                let Some(lock) = fenced else {
                    return redis::pipe()
                        .atomic()
                        .cmd("SET")
                        .arg(&counter)
                        .arg(next)
                        .ignore()
                        .cmd("HSET")
                        .arg(&values)
                        .arg(value)
                        .arg(token.get())
                        .ignore()
                        .query_async::<()>(conn)
                        .await
                        .map(|()| true)
                        .map_err(|e| e.to_string());
                };
                let written = store
                    .fenced_write(lock, token)
                    .set(counter, next.to_string())
                    .hset(values, value.to_string(), token.to_string())
                    .apply()
                    .await;
                accepted(written.map(drop))
            }
            Self::Postgres { client, tag } => {
                let tx = client.transaction().await.map_err(|e| e.to_string())?;
                if let Some(lock) = fenced {
                    match fencelock::fence::tokio_postgres::check(&tx, lock, token).await {
                        Ok(()) => {}
                        // Dropped: rolled back.
                        Err(Error::Fenced { .. }) => return Ok(false),
                        Err(e) => return Err(e.to_string()),
                    }
                }
                let token_text = token.get().to_string();
                tx.execute(
                    "INSERT INTO lab_counter VALUES ($1, $2) \
                     ON CONFLICT (tag) DO UPDATE SET n = excluded.n",
                    &[tag, &next],
                )
                .await
                .map_err(|e| e.to_string())?;
                tx.execute(
                    "INSERT INTO lab_values VALUES ($1, $2, $3::text::numeric)",
                    &[tag, &value, &token_text],
                )
                .await
                .map_err(|e| e.to_string())?;
                tx.commit().await.map_err(|e| e.to_string())?;
                Ok(true)
            }
        }
    }
}

/// A fenced write's result as the lab records it: accepted, refused as stale, or failed.
fn accepted(result: Result<(), Error>) -> Result<bool, String> {
    match result {
        Ok(()) => Ok(true),
        Err(Error::Fenced { .. }) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}
