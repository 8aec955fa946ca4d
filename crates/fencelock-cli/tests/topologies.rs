//! When the server is not what the URL says: every way of naming servers (`redis://`,
//! `rediss://`, `redis+sentinel://`, `redis+cluster://`, Redlock's several `--redis`)
//! against every kind of server the address can be (a master, a replica, a sentinel, a
//! cluster node, a TLS port, a port that does not speak Redis, one that says nothing,
//! nothing at all, a password wanted), as one table. Each row runs
//! `fencelock run --wait 0s NAME -- true` and asserts the exit code, that stderr is one
//! `fencelock: ...` line holding the row's key phrase (the guide's topologies chapter lists them),
//! and the error the library gives for the same URL (connect, then `try_acquire`).
//!
//! The rigs start once, and the rows run at once (each with its own lock name): the
//! rows that wait for a silent port take a connect timeout each, not one after another.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Run, arg, fencelock, fencelock_with};
use fencelock::{Client, Error, UnavailableReason};
use testkit::{ClientAuth, Cluster, Postgres, RedisServer, SentinelGroup, TlsFiles};

/// What a row expects of the library.
#[derive(Clone, Copy, Debug)]
enum Lib {
    /// The lock is taken.
    Ok,
    /// [`Error::Rejected`] with this code.
    Rejected(&'static str),
    /// [`Error::Unavailable`] for this reason.
    Unavailable(UnavailableReason),
    /// [`Error::NoQuorum`].
    NoQuorum,
}

/// One row: how the servers are named, what they are, what a user sees.
struct Row {
    /// The server's state, for failure messages.
    what: &'static str,
    /// The `--redis` URLs (several: Redlock).
    urls: Vec<String>,
    /// Whether the CA is given (`--cacert`, `tls_ca_file`).
    ca: bool,
    /// The exit code.
    exit: i32,
    /// What the one line says (every phrase), unless the row succeeds.
    says: &'static [&'static str],
    lib: Lib,
}

/// A port that answers whatever it is sent as an HTTP server would: not Redis.
fn http_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0
                        || stream
                            .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                            .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// A port that accepts connections and never says a word (a stopped service, a
/// firewall's tarpit).
fn silent_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming().flatten() {
            open.push(stream);
        }
    });
    port
}

/// What the library says for `urls` (the CA given if `ca`), with short timeouts (a
/// silent port costs one): connect, then take the lock `name` once and release it.
async fn library(urls: Vec<String>, ca: Option<PathBuf>, name: String) -> Result<(), Error> {
    let mut builder = if urls.len() == 1 {
        Client::builder(urls[0].clone())
    } else {
        Client::redlock(urls).restart_protection(None)
    };
    builder = builder
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500));
    if let Some(ca) = ca {
        builder = builder.tls_ca_file(ca);
    }
    let client = builder.connect().await?;
    client.lock(name).try_acquire().await?.release().await
}

#[test]
fn every_way_of_naming_servers_against_every_kind_of_server_says_what_it_found_in_one_line() {
    let files = TlsFiles::shared();
    // The rigs, from this thread (see testkit's PDEATHSIG): a master with a TLS port as
    // well, two more masters (Redlock), a sentinel group (its master, a replica, one
    // sentinel), a cluster node in no cluster, a created cluster, a server that wants a
    // password, PostgreSQL, and ports that are no Redis.
    let plain = RedisServer::builder().tls(files, ClientAuth::No).start();
    let others = RedisServer::start_many(2);
    let group = SentinelGroup::builder().sentinels(1).quorum(1).start();
    let lone_node = RedisServer::builder()
        .port_source(testkit::free_cluster_port)
        .args([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ])
        .start();
    let cluster = Cluster::builder().replicas_per_master(0).start();
    let guarded = RedisServer::builder()
        .args(["--requirepass", "right-pw"])
        .start();
    let postgres = Postgres::start();
    let (http, silent, nothing) = (http_port(), silent_port(), testkit::free_port());
    let pg = postgres.port();

    let tls = plain.tls_port().expect("a TLS port");
    let replica = group.replicas()[0].addr();
    let sentinel = group.sentinels()[0].addr();
    let service = group.service().to_owned();
    let node = cluster.masters()[0].addr();
    let lone = lone_node.addr();
    let at = |port: u16| format!("127.0.0.1:{port}");
    let s = |url: String| vec![url];

    use UnavailableReason::{ClusterDown, Io, Refused, TimedOut};
    let rows = vec![
        // redis://
        Row {
            what: "redis:// at a master",
            urls: s(plain.url()),
            ca: false,
            exit: 0,
            says: &[],
            lib: Lib::Ok,
        },
        Row {
            what: "redis:// at a replica",
            urls: s(format!("redis://{replica}")),
            ca: false,
            exit: 69,
            says: &[
                "this is a read-only replica",
                "point fencelock at the master, or use redis+sentinel://",
            ],
            lib: Lib::Rejected("READONLY"),
        },
        Row {
            what: "redis:// at a sentinel",
            urls: s(format!("redis://{sentinel}")),
            ca: false,
            exit: 69,
            says: &["this is a Redis Sentinel", "use redis+sentinel://"],
            lib: Lib::Rejected("SENTINEL"),
        },
        Row {
            what: "redis:// at a cluster node (another node's slot)",
            urls: s(format!("redis://{node}")),
            ca: false,
            exit: 69,
            says: &["this is a Redis Cluster node: use redis+cluster://"],
            lib: Lib::Rejected("MOVED"),
        },
        Row {
            what: "redis:// at a cluster node in no cluster",
            urls: s(format!("redis://{lone}")),
            ca: false,
            exit: 69,
            says: &["this is a Redis Cluster node: use redis+cluster://"],
            lib: Lib::Rejected("CLUSTERDOWN"),
        },
        Row {
            what: "redis:// at a TLS port",
            urls: s(format!("redis://{}", at(tls))),
            ca: false,
            exit: 69,
            says: &["if the port is a TLS port", "use rediss://"],
            lib: Lib::Unavailable(Io),
        },
        Row {
            what: "redis:// at a port that is not Redis",
            urls: s(format!("redis://{}", at(http))),
            ca: false,
            exit: 69,
            says: &["this is not a Redis server"],
            lib: Lib::Unavailable(Io),
        },
        Row {
            what: "redis:// at PostgreSQL",
            urls: s(format!("redis://{}", at(pg))),
            ca: false,
            exit: 69,
            says: &[
                "it closed the connection without answering",
                "not a Redis server",
            ],
            lib: Lib::Unavailable(Io),
        },
        Row {
            what: "redis:// at a silent port",
            urls: s(format!("redis://{}", at(silent))),
            ca: false,
            exit: 69,
            says: &["timed out"],
            lib: Lib::Unavailable(TimedOut),
        },
        Row {
            what: "redis:// at nothing",
            urls: s(format!("redis://{}", at(nothing))),
            ca: false,
            exit: 69,
            says: &["connection refused"],
            lib: Lib::Unavailable(Refused),
        },
        Row {
            what: "redis:// without the password wanted",
            urls: s(guarded.url()),
            ca: false,
            exit: 69,
            says: &["NOAUTH", "check the user name and password"],
            lib: Lib::Rejected("NOAUTH"),
        },
        Row {
            what: "redis:// with a wrong password",
            urls: s(format!("redis://:wrong-pw@{}", guarded.addr())),
            ca: false,
            exit: 69,
            says: &["wrong user name or password"],
            lib: Lib::Rejected("WRONGPASS"),
        },
        // rediss://
        Row {
            what: "rediss:// at a TLS port",
            urls: s(format!("rediss://localhost:{tls}")),
            ca: true,
            exit: 0,
            says: &[],
            lib: Lib::Ok,
        },
        Row {
            what: "rediss:// at a plain port",
            urls: s(format!("rediss://localhost:{}", plain.port())),
            ca: true,
            exit: 69,
            says: &["no TLS handshake", "use redis://"],
            lib: Lib::Unavailable(TimedOut),
        },
        Row {
            what: "rediss:// without the CA",
            urls: s(format!("rediss://localhost:{tls}")),
            ca: false,
            exit: 69,
            says: &["signed by a CA this client does not trust"],
            lib: Lib::Unavailable(UnavailableReason::Tls),
        },
        // redis+sentinel://
        Row {
            what: "redis+sentinel:// at a sentinel",
            urls: s(group.url()),
            ca: false,
            exit: 0,
            says: &[],
            lib: Lib::Ok,
        },
        Row {
            what: "redis+sentinel:// with a service it does not know",
            urls: s(format!("redis+sentinel://{sentinel}/nosuch")),
            ca: false,
            exit: 69,
            says: &["no sentinel knows the service \"nosuch\""],
            lib: Lib::Rejected("NOSERVICE"),
        },
        Row {
            what: "redis+sentinel:// at a master",
            urls: s(format!("redis+sentinel://{}/{service}", plain.addr())),
            ca: false,
            exit: 69,
            says: &["is not a sentinel", "use redis://"],
            lib: Lib::Rejected("NOTSENTINEL"),
        },
        Row {
            what: "redis+sentinel:// at a TLS port",
            urls: s(format!("redis+sentinel://{}/{service}", at(tls))),
            ca: false,
            exit: 69,
            says: &["if the port is a TLS port", "use rediss+sentinel://"],
            lib: Lib::Unavailable(Io),
        },
        Row {
            what: "rediss+sentinel:// at a plain sentinel",
            urls: s(format!("rediss+sentinel://{sentinel}/{service}")),
            ca: true,
            exit: 69,
            says: &["no TLS handshake", "use redis+sentinel://"],
            lib: Lib::Unavailable(TimedOut),
        },
        Row {
            what: "redis+sentinel:// at a port that is not Redis",
            urls: s(format!("redis+sentinel://{}/{service}", at(http))),
            ca: false,
            exit: 69,
            says: &["this is not a Redis server"],
            lib: Lib::Unavailable(Io),
        },
        Row {
            what: "redis+sentinel:// at PostgreSQL",
            urls: s(format!("redis+sentinel://{}/{service}", at(pg))),
            ca: false,
            exit: 69,
            says: &[
                "it closed the connection without answering",
                "not a Redis server",
            ],
            lib: Lib::Unavailable(Io),
        },
        Row {
            what: "redis+sentinel:// at a silent port",
            urls: s(format!("redis+sentinel://{}/{service}", at(silent))),
            ca: false,
            exit: 69,
            says: &["did not answer in time: is it a sentinel"],
            lib: Lib::Unavailable(TimedOut),
        },
        Row {
            what: "redis+sentinel:// at nothing",
            urls: s(format!("redis+sentinel://{}/{service}", at(nothing))),
            ca: false,
            exit: 69,
            says: &["every sentinel is down or unreachable"],
            lib: Lib::Unavailable(Refused),
        },
        // redis+cluster://
        Row {
            what: "redis+cluster:// at a cluster",
            urls: s(cluster.url()),
            ca: false,
            exit: 0,
            says: &[],
            lib: Lib::Ok,
        },
        Row {
            what: "redis+cluster:// at a master",
            urls: s(format!("redis+cluster://{}", plain.addr())),
            ca: false,
            exit: 69,
            says: &["not a Redis Cluster node", "use redis://"],
            lib: Lib::Rejected("ERR"),
        },
        Row {
            what: "redis+cluster:// at a sentinel",
            urls: s(format!("redis+cluster://{sentinel}")),
            ca: false,
            exit: 69,
            says: &["this is a Redis Sentinel", "use redis+sentinel://"],
            lib: Lib::Rejected("SENTINEL"),
        },
        Row {
            what: "redis+cluster:// at a node in no cluster",
            urls: s(format!("redis+cluster://{lone}")),
            ca: false,
            exit: 69,
            says: &["serve no slot", "redis-cli --cluster create"],
            lib: Lib::Unavailable(ClusterDown),
        },
        Row {
            what: "redis+cluster:// at a TLS port",
            urls: s(format!("redis+cluster://{}", at(tls))),
            ca: false,
            exit: 69,
            says: &["if the port is a TLS port", "use rediss+cluster://"],
            lib: Lib::Unavailable(Io),
        },
        Row {
            what: "rediss+cluster:// at a plain cluster",
            urls: s(format!("rediss+cluster://{node}")),
            ca: true,
            exit: 69,
            says: &["no TLS handshake", "use redis+cluster://"],
            lib: Lib::Unavailable(TimedOut),
        },
        Row {
            what: "redis+cluster:// at a port that is not Redis",
            urls: s(format!("redis+cluster://{}", at(http))),
            ca: false,
            exit: 69,
            says: &["this is not a Redis server"],
            lib: Lib::Unavailable(Io),
        },
        Row {
            what: "redis+cluster:// at PostgreSQL",
            urls: s(format!("redis+cluster://{}", at(pg))),
            ca: false,
            exit: 69,
            says: &[
                "it closed the connection without answering",
                "not a Redis server",
            ],
            lib: Lib::Unavailable(Io),
        },
        Row {
            what: "redis+cluster:// at a silent port",
            urls: s(format!("redis+cluster://{}", at(silent))),
            ca: false,
            exit: 69,
            says: &["no seed answered in time"],
            lib: Lib::Unavailable(TimedOut),
        },
        Row {
            what: "redis+cluster:// at nothing",
            urls: s(format!("redis+cluster://{}", at(nothing))),
            ca: false,
            exit: 69,
            says: &["every seed is down or unreachable"],
            lib: Lib::Unavailable(Refused),
        },
        // Redlock: a minority of wrong servers is outvoted; a majority is said node by node.
        Row {
            what: "Redlock, one node a TLS port",
            urls: vec![plain.url(), others[0].url(), format!("redis://{}", at(tls))],
            ca: false,
            exit: 0,
            says: &[],
            lib: Lib::Ok,
        },
        Row {
            what: "Redlock, a replica and a sentinel",
            urls: vec![
                plain.url(),
                format!("redis://{replica}"),
                format!("redis://{sentinel}"),
            ],
            ca: false,
            exit: 69,
            says: &[
                "needs 2 of 3",
                "this is a read-only replica",
                "this is a Redis Sentinel",
            ],
            lib: Lib::NoQuorum,
        },
        Row {
            what: "Redlock, a TLS port and a port that is not Redis",
            urls: vec![
                others[1].url(),
                format!("redis://{}", at(tls)),
                format!("redis://{}", at(http)),
            ],
            ca: false,
            exit: 69,
            says: &[
                "needs 2 of 3",
                "refused: if the port is a TLS port",
                "use rediss://",
                "this is not a Redis server",
            ],
            lib: Lib::NoQuorum,
        },
    ];

    // The redis:// row at a cluster node names a lock whose slot another node serves.
    let elsewhere = (0..)
        .map(|i| format!("elsewhere-{i}"))
        .find(|n| cluster.node_for_key(&format!("fencelock:{{{n}}}")).addr() != node)
        .expect("a name");
    let name = |i: usize, row: &Row| {
        if row.what.contains("another node's slot") {
            elsewhere.clone()
        } else {
            format!("row-{i}")
        }
    };

    // Every row's CLI run at once.
    let runs: Vec<Run> = std::thread::scope(|scope| {
        let handles: Vec<_> = rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let name = name(i, row);
                let ca = files.ca_cert();
                scope.spawn(move || {
                    // A password goes in FENCELOCK_PASSWORD, as the CLI asks (on the
                    // command line it warns, on a line of its own).
                    let mut password = None;
                    let urls: Vec<String> = row
                        .urls
                        .iter()
                        .map(|url| match url.split_once("://:") {
                            Some((scheme, rest)) => {
                                let (pw, host) = rest.split_once('@').expect("user@host");
                                password = Some(pw.to_owned());
                                format!("{scheme}://{host}")
                            }
                            None => url.clone(),
                        })
                        .collect();
                    let mut args = vec!["run", "--wait", "0s", "--restart-protection", "0"];
                    for url in &urls {
                        args.extend(["--redis", url]);
                    }
                    if row.ca {
                        args.extend(["--cacert", arg(&ca)]);
                    }
                    args.extend([name.as_str(), "--", "true"]);
                    match &password {
                        Some(pw) => fencelock_with(&args, &[("FENCELOCK_PASSWORD", Path::new(pw))]),
                        None => fencelock(&args),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a row's run"))
            .collect()
    });
    // Every row's library call at once.
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let answers: Vec<Result<(), Error>> = runtime.block_on(async {
        let calls: Vec<_> = rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let ca = row.ca.then(|| files.ca_cert());
                tokio::spawn(library(
                    row.urls.clone(),
                    ca,
                    // The same name where another node's slot is what counts.
                    match name(i, row) {
                        n if n == elsewhere => n,
                        n => format!("lib-{n}"),
                    },
                ))
            })
            .collect();
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.expect("a row's library call"));
        }
        answers
    });

    let mut wrong = Vec::new();
    for ((row, run), answer) in rows.iter().zip(&runs).zip(&answers) {
        if let Err(problem) = check(row, run, answer) {
            wrong.push(format!("{}: {problem}", row.what));
        }
    }
    assert!(
        wrong.is_empty(),
        "rows that say the wrong thing:\n{}",
        wrong.join("\n")
    );
}

/// Whether `run` and `answer` are what `row` expects; what is wrong if not.
fn check(row: &Row, run: &Run, answer: &Result<(), Error>) -> Result<(), String> {
    if run.status.code() != Some(row.exit) {
        return Err(format!(
            "exit {:?}, not {}: {run:?}",
            run.status.code(),
            row.exit
        ));
    }
    if row.exit != 0 {
        let lines: Vec<&str> = run.stderr.lines().collect();
        if lines.len() != 1 || !lines[0].starts_with("fencelock: ") {
            return Err(format!("stderr is not one line: {:?}", run.stderr));
        }
        if let Some(missing) = row.says.iter().find(|p| !lines[0].contains(*p)) {
            return Err(format!("the line does not say {missing:?}: {}", lines[0]));
        }
        // The driver's parser speaks no user's language.
        if lines[0].contains("Parse error") || lines[0].contains("Incompatible type") {
            return Err(format!(
                "the line carries the driver's raw text: {}",
                lines[0]
            ));
        }
    }
    let fits = match (row.lib, answer) {
        (Lib::Ok, Ok(())) => true,
        (Lib::Rejected(want), Err(Error::Rejected { code, .. })) => code == want,
        (Lib::Unavailable(want), Err(Error::Unavailable { reason, .. })) => *reason == want,
        (Lib::NoQuorum, Err(Error::NoQuorum { .. })) => true,
        _ => false,
    };
    if !fits {
        return Err(format!(
            "the library answered {answer:?}, not {:?}",
            row.lib
        ));
    }
    if let Err(e) = answer
        && !matches!(row.lib, Lib::NoQuorum)
        && let Some(missing) = row.says.iter().find(|p| !e.to_string().contains(*p))
    {
        return Err(format!(
            "the library's message does not say {missing:?}: {e}"
        ));
    }
    Ok(())
}
