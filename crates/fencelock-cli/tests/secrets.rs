//! The CLI never shows a password, end to end: the real binary against real
//! redis-servers. On every failing path (nothing listening, a paused server, a wrong
//! password, an ACL user with too few rights, an untrusted TLS certificate, malformed
//! URLs, Redlock with nodes down, Sentinel with an unknown service or every sentinel
//! down), `run`, `status`, `list` and `break`, with and without `--json` and `-v` (with
//! `RUST_LOG=trace`), print no marker password on stdout or stderr, whether it came from
//! `FENCELOCK_PASSWORD`, `--password-file`, `--pass` or the `--redis` URL. A password on
//! the command line gets one warning naming `FENCELOCK_PASSWORD`; one from the
//! environment or a file gets none and works; and a running `fencelock` holding a lock
//! does not show it in its command line (`ps`, `/proc/PID/cmdline`).

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use testkit::{ClientAuth, RedisServer, SentinelGroup, TlsFiles};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");
/// No single `fencelock` run in these tests may take longer than this.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of every polling loop that waits for an event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(10);
/// How many `fencelock` processes one test runs at once.
const PARALLEL: usize = 8;

/// The password of the tests' servers and ACL users.
const PASSWORD: &str = "S3CRET-MARKER-7f3a";
/// The sentinels' own password (always in the URL: the CLI has no flag for it).
const SENTINEL_PASSWORD: &str = "S3NTINEL-MARKER-91c2";
/// A password with the characters a URL must percent-encode, and how a URL writes it.
const AWKWARD: &str = "P@SS:MARKER-5e1d";
const AWKWARD_ENCODED: &str = "P%40SS%3AMARKER-5e1d";
/// What no output may hold.
const SECRETS: &[&str] = &[
    PASSWORD,
    SENTINEL_PASSWORD,
    AWKWARD,
    AWKWARD_ENCODED,
    "MARKER-5e1d",
];

/// What a user sees of one finished `fencelock` run.
#[derive(Debug)]
struct Run {
    label: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Asserts that neither stdout nor stderr holds a secret.
    fn shows_no_secret(&self) {
        for secret in SECRETS {
            assert!(
                !self.output().contains(secret),
                "{}: the output shows {secret:?}:\n{self:#?}",
                self.label
            );
        }
    }

    /// The lines that warn about a password on the command line.
    fn password_warnings(&self) -> usize {
        self.stderr
            .lines()
            .filter(|l| l.contains("FENCELOCK_PASSWORD"))
            .count()
    }
}

/// One `fencelock` invocation: its arguments and environment (nothing else of the
/// caller's `FENCELOCK_*` or `RUST_LOG`).
#[derive(Clone, Debug)]
struct Invocation {
    label: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Invocation {
    fn new(label: impl Into<String>, args: &[&str]) -> Self {
        Self {
            label: label.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: Vec::new(),
        }
    }

    fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(&self.args);
        for var in [
            "FENCELOCK_REDIS",
            "FENCELOCK_USER",
            "FENCELOCK_PASSWORD",
            "FENCELOCK_PASSWORD_FILE",
            "FENCELOCK_CACERT",
            "RUST_LOG",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs it to the end (at most [`RUN_TIMEOUT`]).
    fn run(&self) -> Run {
        let mut child = self.command().spawn().expect("spawn fencelock");
        let read = |mut pipe: Box<dyn Read + Send>| {
            thread::spawn(move || {
                let mut text = String::new();
                pipe.read_to_string(&mut text).expect("read output");
                text
            })
        };
        let stdout = read(Box::new(child.stdout.take().unwrap()));
        let stderr = read(Box::new(child.stderr.take().unwrap()));
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if started.elapsed() > RUN_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{}: fencelock did not exit within {RUN_TIMEOUT:?}",
                    self.label
                );
            }
            thread::sleep(POLL);
        };
        Run {
            label: self.label.clone(),
            code: status.code(),
            stdout: stdout.join().unwrap(),
            stderr: stderr.join().unwrap(),
        }
    }
}

/// Runs all `invocations`, [`PARALLEL`] at a time.
fn run_all(invocations: &[Invocation]) -> Vec<Run> {
    invocations
        .chunks(PARALLEL)
        .flat_map(|chunk| {
            thread::scope(|s| {
                let running: Vec<_> = chunk.iter().map(|i| s.spawn(|| i.run())).collect();
                running
                    .into_iter()
                    .map(|r| r.join().unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect()
}

/// How the password reaches `fencelock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delivery {
    /// `FENCELOCK_PASSWORD` (and the URLs in `FENCELOCK_REDIS`).
    Env,
    /// `--password-file FILE` (and the URLs in `FENCELOCK_REDIS`).
    File,
    /// `--pass PASSWORD` (and the URLs in `FENCELOCK_REDIS`).
    Flag,
    /// Inside each `--redis URL`.
    Url,
}

impl Delivery {
    const ALL: [Delivery; 4] = [Self::Env, Self::File, Self::Flag, Self::Url];

    /// Whether the password is on the command line, which `fencelock` warns about.
    fn on_command_line(self) -> bool {
        matches!(self, Self::Flag | Self::Url)
    }
}

/// The global flags: without, `--json`, `-v` (tracing, all of it with
/// `RUST_LOG=trace`), both.
const FLAGS: [&[&str]; 4] = [&[], &["--json"], &["-v"], &["--json", "-v"]];

/// The URLs of a failing path, with the password written in (`Some`) or not.
type Urls<'a> = &'a dyn Fn(Option<&str>) -> Vec<String>;

/// One failing path, as each subcommand meets it.
struct FailingPath<'a> {
    name: &'a str,
    /// The URLs, with the password written in (`Some`) or not.
    urls: Urls<'a>,
    /// The ACL user, when not the default one.
    user: Option<&'a str>,
    /// What the output says, for every subcommand...
    says: &'a str,
    /// ...but these (which may not say it).
    silent: &'a [&'a str],
    /// The exit statuses a subcommand may end with (a Redlock `status` or `break`
    /// reports failing nodes and exits 0).
    codes: &'a [i32],
}

/// The four subcommands, as `(name, arguments before the connection options, after)`.
const SUBCOMMANDS: [(&str, &[&str]); 4] = [
    ("run", &["secret-job", "--", "true"]),
    ("status", &["secret-job"]),
    ("list", &[]),
    ("break", &["--yes", "secret-job"]),
];

/// Every (subcommand, delivery, flags) invocation of `path`, with its delivery; with
/// `all_flags` false, each (subcommand, delivery) gets one of the flag sets, in turn
/// (for paths that wait out timeouts).
fn invocations(
    path: &FailingPath,
    password_file: &Path,
    all_flags: bool,
) -> Vec<(Invocation, Delivery)> {
    let file = password_file.to_str().unwrap();
    let mut out = Vec::new();
    let mut turn = 0;
    for (sub, tail) in SUBCOMMANDS {
        for delivery in Delivery::ALL {
            let flag_sets: Vec<&[&str]> = if all_flags {
                FLAGS.to_vec()
            } else {
                turn += 1;
                vec![FLAGS[turn % FLAGS.len()]]
            };
            for flags in flag_sets {
                let label = format!("{}: {sub} {flags:?}, password by {delivery:?}", path.name);
                let mut args: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
                args.push(sub.to_owned());
                let mut env: Vec<(String, String)> = Vec::new();
                let mut set = |k: &str, v: &str| env.push((k.to_owned(), v.to_owned()));
                if delivery == Delivery::Url {
                    for url in (path.urls)(Some(PASSWORD)) {
                        args.extend(["--redis".to_owned(), url]);
                    }
                } else {
                    set("FENCELOCK_REDIS", &(path.urls)(None).join(","));
                    if let Some(user) = path.user {
                        set("FENCELOCK_USER", user);
                    }
                }
                match delivery {
                    Delivery::Env => set("FENCELOCK_PASSWORD", PASSWORD),
                    Delivery::File => args.extend(["--password-file".to_owned(), file.to_owned()]),
                    Delivery::Flag => args.extend(["--pass".to_owned(), PASSWORD.to_owned()]),
                    Delivery::Url => {}
                }
                if flags.contains(&"-v") {
                    set("RUST_LOG", "trace");
                }
                args.extend(tail.iter().map(|a| (*a).to_owned()));
                out.push((Invocation { label, args, env }, delivery));
            }
        }
    }
    out
}

/// Runs every invocation of `path` and checks what a user sees: the failure said
/// (`path.says`), an expected exit status, no secret anywhere, and the warning exactly
/// when the password is on the command line.
fn check_path(path: &FailingPath, all_flags: bool) {
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("password");
    fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let (invocations, deliveries): (Vec<Invocation>, Vec<Delivery>) =
        invocations(path, &password_file, all_flags)
            .into_iter()
            .unzip();
    let runs = run_all(&invocations);
    assert_eq!(runs.len(), invocations.len());
    for ((run, delivery), invocation) in runs.iter().zip(deliveries).zip(&invocations) {
        let silent = invocation
            .args
            .iter()
            .any(|a| path.silent.contains(&a.as_str()));
        run.shows_no_secret();
        assert!(
            run.code.is_some_and(|c| path.codes.contains(&c)),
            "{}: exit status not in {:?}:\n{run:#?}",
            run.label,
            path.codes
        );
        assert!(
            silent || run.output().contains(path.says),
            "{}: the output does not say {:?}:\n{run:#?}",
            run.label,
            path.says
        );
        assert_eq!(
            run.password_warnings(),
            usize::from(delivery.on_command_line()),
            "{}: one warning for a password on the command line, none otherwise:\n{run:#?}",
            run.label
        );
    }
}

/// `redis://[user][:password@]host_port`.
fn url(host_port: &str, user: &str, password: Option<&str>) -> String {
    match password {
        Some(password) => format!("redis://{user}:{password}@{host_port}"),
        None => format!("redis://{host_port}"),
    }
}

/// Nothing listening: every subcommand exits 69 saying "connection refused".
#[test]
fn nothing_listening_never_shows_the_password() {
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    check_path(
        &FailingPath {
            name: "refused",
            urls: &|pw| vec![url(&addr, "", pw)],
            user: None,
            silent: &[],
            says: "connection refused",
            codes: &[69],
        },
        true,
    );
}

/// A paused server: every subcommand exits 69 saying it timed out.
#[test]
fn a_paused_server_never_shows_the_password() {
    let mut server = RedisServer::builder()
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    server.pause();
    let addr = server.addr();
    check_path(
        &FailingPath {
            name: "paused",
            urls: &|pw| vec![url(&addr, "", pw)],
            user: None,
            silent: &[],
            says: "timed out",
            codes: &[69],
        },
        false,
    );
}

/// A server with another password: every subcommand exits 69 saying to check the
/// password, without showing the one it was given.
#[test]
fn a_wrong_password_is_never_shown() {
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg("the-right-one")
        .start();
    let addr = server.addr();
    check_path(
        &FailingPath {
            name: "wrong password",
            urls: &|pw| vec![url(&addr, "", pw)],
            user: None,
            silent: &[],
            says: "wrong user name or password",
            codes: &[69],
        },
        true,
    );
}

/// An ACL user with the right password and too few rights: every subcommand exits 69
/// with NOPERM.
#[test]
fn an_acl_user_without_the_rights_never_shows_the_password() {
    let server = RedisServer::start();
    let created = server.cmd(&[
        "ACL",
        "SETUSER",
        "limited",
        "on",
        &format!(">{PASSWORD}"),
        "~*",
        "&*",
        "+ping",
        "+hello",
        "+client",
    ]);
    assert_eq!(created.as_str(), Some("OK"), "{created:?}");
    let addr = server.addr();
    check_path(
        &FailingPath {
            name: "NOPERM",
            urls: &|pw| vec![url(&addr, "limited", pw)],
            user: Some("limited"),
            silent: &[],
            says: "NOPERM",
            codes: &[69],
        },
        true,
    );
}

/// A TLS server whose CA the client does not trust: every subcommand exits 69 naming
/// the certificate problem.
#[test]
fn an_untrusted_certificate_never_shows_the_password() {
    let server = RedisServer::builder()
        .tls(TlsFiles::shared(), ClientAuth::No)
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let port = server.tls_port().unwrap();
    check_path(
        &FailingPath {
            name: "unknown CA",
            urls: &|pw| {
                vec![match pw {
                    Some(pw) => format!("rediss://:{pw}@localhost:{port}"),
                    None => format!("rediss://localhost:{port}"),
                }]
            },
            user: None,
            silent: &[],
            says: "does not trust",
            codes: &[69],
        },
        true,
    );
}

/// URLs that do not parse, with the password where each kind of URL carries it (the
/// user part, a Unix socket URL's `pass`, a Sentinel URL's `sentinel_password`, with
/// the awkward password percent-encoded or raw): every subcommand exits 64 saying that
/// the URL does not parse.
#[test]
fn a_bad_url_never_shows_the_password() {
    let bad: [(&str, Urls); 4] = [
        ("unparsable port", &|pw| {
            vec![url("127.0.0.1:notaport", "", pw)]
        }),
        ("Unix socket, bad db", &|pw| {
            vec![match pw {
                Some(pw) => format!("redis+unix:///tmp/nosuch.sock?db=x&pass={pw}"),
                None => "redis+unix:///tmp/nosuch.sock?db=x".to_owned(),
            }]
        }),
        ("Sentinel, unknown query parameter", &|pw| {
            let auth = pw.map(|pw| format!(":{pw}@")).unwrap_or_default();
            vec![format!(
                "redis+sentinel://{auth}127.0.0.1:1/svc?sentinel_password={SENTINEL_PASSWORD}&x=1"
            )]
        }),
        ("Sentinel, awkward passwords", &|_| {
            vec![format!(
                "redis+sentinel://:{AWKWARD_ENCODED}@127.0.0.1:x/svc?sentinel_password={AWKWARD}"
            )]
        }),
    ];
    for (name, urls) in bad {
        check_path(
            &FailingPath {
                name,
                urls,
                user: None,
                silent: &[],
                says: "does not parse",
                codes: &[64],
            },
            true,
        );
    }
}

/// Redlock over three nodes, two of them down: `run` finds no quorum, `status`, `list`
/// and `break` report the nodes down; each names the refusing nodes, never a password.
#[test]
fn redlock_with_nodes_down_never_shows_the_password() {
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let up = server.addr();
    let down = [
        format!("127.0.0.1:{}", testkit::free_port()),
        format!("127.0.0.1:{}", testkit::free_port()),
    ];
    check_path(
        &FailingPath {
            name: "Redlock, two of three down",
            urls: &|pw| {
                vec![
                    url(&up, "", pw),
                    url(&down[0], "", pw),
                    url(&down[1], "", pw),
                ]
            },
            user: None,
            // `list` lists what the node that answers holds, and warns of the others.
            silent: &[],
            says: "connection refused",
            codes: &[0, 69],
        },
        true,
    );
}

/// Sentinel with the sentinels' password in the URL and the master's given each way:
/// a service no sentinel knows, and every sentinel down, exit 69 saying so.
#[test]
fn sentinel_failures_never_show_either_password() {
    let group = SentinelGroup::builder()
        .password(PASSWORD)
        .sentinel_password(SENTINEL_PASSWORD)
        .start();
    let sentinel_url = |sentinels: &str, service: &str, pw: Option<&str>| {
        let auth = pw.map(|pw| format!(":{pw}@")).unwrap_or_default();
        vec![format!(
            "redis+sentinel://{auth}{sentinels}/{service}?sentinel_password={SENTINEL_PASSWORD}"
        )]
    };
    let sentinels = group.sentinel_urls();
    check_path(
        &FailingPath {
            name: "Sentinel, unknown service",
            urls: &|pw| sentinel_url(&sentinels, "nosuch", pw),
            user: None,
            silent: &[],
            says: "no sentinel knows the service",
            codes: &[69],
        },
        true,
    );
    let nowhere = format!(
        "127.0.0.1:{},127.0.0.1:{}",
        testkit::free_port(),
        testkit::free_port()
    );
    check_path(
        &FailingPath {
            name: "Sentinel, every sentinel down",
            urls: &|pw| sentinel_url(&nowhere, group.service(), pw),
            user: None,
            silent: &[],
            says: "every sentinel is down",
            codes: &[69],
        },
        true,
    );
}

/// The fencing counter of lock `name`, read with the password: the proof that a grant
/// happened.
fn fencing_counter(server: &RedisServer, name: &str) -> Option<i64> {
    let reply = server.cmd_as(PASSWORD, &["GET", &format!("fencelock:{{{name}}}:fence")]);
    reply.as_str().and_then(|s| s.parse().ok())
}

/// The password from `--password-file`, `FENCELOCK_PASSWORD_FILE` or
/// `FENCELOCK_PASSWORD` works: the lock is taken (its fencing counter moves), COMMAND
/// runs, `fencelock` exits 0, and prints nothing (no warning).
#[test]
fn the_password_from_a_file_or_the_environment_works_without_a_warning() {
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let file = file.to_str().unwrap();
    let redis = server.url();
    let cases = [
        Invocation::new(
            "--password-file",
            &[
                "run",
                "--redis",
                &redis,
                "--password-file",
                file,
                "by-file",
                "--",
                "true",
            ],
        ),
        Invocation::new(
            "FENCELOCK_PASSWORD_FILE",
            &["run", "--redis", &redis, "by-file-env", "--", "true"],
        )
        .env("FENCELOCK_PASSWORD_FILE", file),
        Invocation::new("FENCELOCK_PASSWORD", &["run", "by-env", "--", "true"])
            .env("FENCELOCK_REDIS", &redis)
            .env("FENCELOCK_PASSWORD", PASSWORD),
    ];
    for (invocation, name) in cases.iter().zip(["by-file", "by-file-env", "by-env"]) {
        assert_eq!(fencing_counter(&server, name), None);
        let run = invocation.run();
        assert_eq!(run.code, Some(0), "{run:#?}");
        assert_eq!(run.stderr, "", "{run:#?}");
        assert_eq!(run.stdout, "", "{run:#?}");
        assert!(
            fencing_counter(&server, name).is_some(),
            "{name}: not taken"
        );
    }
    // And the operators' subcommands.
    let status = Invocation::new("status", &["status", "by-env"])
        .env("FENCELOCK_REDIS", &redis)
        .env("FENCELOCK_PASSWORD", PASSWORD)
        .run();
    assert_eq!(status.code, Some(0), "{status:#?}");
    assert!(status.stdout.contains("free"), "{status:#?}");
    assert_eq!(status.stderr, "", "{status:#?}");
}

/// A password on the command line (`--pass`, `-a`, in a `--redis` URL, in each of three
/// Redlock URLs) works, and gets exactly one warning line, which names
/// `FENCELOCK_PASSWORD` as the way to keep it out of `ps`; as JSON too.
#[test]
fn a_password_on_the_command_line_gets_one_warning() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::builder()
                .arg("--requirepass")
                .arg(PASSWORD)
                .start()
        })
        .collect();
    let plain = servers[0].url();
    let with = |s: &RedisServer| format!("redis://:{PASSWORD}@{}", s.addr());
    let (a, b, c) = (with(&servers[0]), with(&servers[1]), with(&servers[2]));
    let cases = [
        Invocation::new(
            "--pass",
            &[
                "run", "--redis", &plain, "--pass", PASSWORD, "j1", "--", "true",
            ],
        ),
        Invocation::new(
            "-a",
            &["run", "--redis", &plain, "-a", PASSWORD, "j2", "--", "true"],
        ),
        Invocation::new("URL", &["run", "--redis", &a, "j3", "--", "true"]),
        Invocation::new(
            "Redlock URLs",
            &[
                "run",
                "--restart-protection",
                "0",
                "--redis",
                &a,
                "--redis",
                &b,
                "--redis",
                &c,
                "j4",
                "--",
                "true",
            ],
        ),
        Invocation::new("status", &["status", "--redis", &a, "j3"]),
        Invocation::new("--json", &["--json", "list", "--pass", PASSWORD])
            .env("FENCELOCK_REDIS", &plain),
    ];
    for run in run_all(&cases) {
        assert_eq!(run.code, Some(0), "{run:#?}");
        run.shows_no_secret();
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {run:#?}");
        assert_eq!(run.password_warnings(), 1, "{run:#?}");
        if run.label == "--json" {
            let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
            assert_eq!(line["level"], "warning", "{run:#?}");
        } else {
            assert!(lines[0].starts_with("fencelock: warning: "), "{run:#?}");
            assert!(lines[0].contains("visible to every user"), "{run:#?}");
        }
    }
    for name in ["j1", "j2", "j3"] {
        assert!(fencing_counter(&servers[0], name).is_some(), "{name}");
    }
    assert!(servers.iter().all(|s| fencing_counter(s, "j4").is_some()));
}

/// Usage errors never echo a password: one starting with `-` is taken as the value of
/// `--pass` (and works), and a conflict, a missing argument or an unknown option say
/// what is wrong in one line without it.
#[test]
fn usage_errors_never_echo_the_password() {
    let dashed = format!("--{PASSWORD}");
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let set = server.cmd_as(PASSWORD, &["CONFIG", "SET", "requirepass", &dashed]);
    assert_eq!(set.as_str(), Some("OK"), "{set:?}");
    let redis = server.url();
    let nowhere = format!("redis://127.0.0.1:{}", testkit::free_port());
    for short in ["--pass", "-a"] {
        let run = Invocation::new(
            short,
            &["run", "--redis", &redis, short, &dashed, "j", "--", "true"],
        )
        .run();
        assert_eq!(run.code, Some(0), "{run:#?}");
        assert_eq!(run.password_warnings(), 1, "{run:#?}");
        run.shows_no_secret();
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    fs::write(&file, PASSWORD).unwrap();
    let file = file.to_str().unwrap();
    let cases = [
        Invocation::new(
            "conflict",
            &[
                "status",
                "--redis",
                &nowhere,
                "--pass",
                PASSWORD,
                "--password-file",
                file,
                "j",
            ],
        ),
        Invocation::new(
            "no COMMAND",
            &["run", "--redis", &nowhere, "--pass", PASSWORD, "j"],
        ),
        Invocation::new(
            "unknown --password=",
            &[
                "status",
                "--redis",
                &nowhere,
                &format!("--password={PASSWORD}"),
                "j",
            ],
        ),
        Invocation::new(
            "unknown option after the password",
            &["status", "--redis", &nowhere, "-a", PASSWORD, "--frob", "j"],
        ),
        Invocation::new(
            // Connection options go before the subcommand too, but `sql` takes none.
            "--pass before a subcommand that does not connect",
            &["--pass", PASSWORD, "sql"],
        ),
        Invocation::new(
            "a bad --ttl",
            &[
                "run", "--redis", &nowhere, "--pass", PASSWORD, "--ttl", "x", "j", "--", "true",
            ],
        ),
    ];
    for run in run_all(&cases) {
        assert_eq!(run.code, Some(64), "{run:#?}");
        run.shows_no_secret();
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {run:#?}");
        assert!(lines[0].starts_with("fencelock: "), "{run:#?}");
    }
}

/// A `--password-file` that cannot be read (missing, a directory) exits 64 with one
/// line that names the file, before anything is sent to Redis.
#[test]
fn an_unreadable_password_file_exits_64_in_one_line() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    for file in [missing.to_str().unwrap(), dir.path().to_str().unwrap()] {
        for sub in [
            &["run", "--password-file", file, "j", "--", "true"][..],
            &["status", "--password-file", file, "j"],
        ] {
            let run = Invocation::new(file, sub)
                .env("FENCELOCK_REDIS", &server.url())
                .run();
            assert_eq!(run.code, Some(64), "{run:#?}");
            let lines: Vec<&str> = run.stderr.lines().collect();
            assert_eq!(lines.len(), 1, "one line: {run:#?}");
            assert!(
                lines[0].starts_with("fencelock: --password-file ")
                    && lines[0].contains(file)
                    && lines[0].contains("cannot read it"),
                "{run:#?}"
            );
            assert_eq!(run.stdout, "", "{run:#?}");
        }
    }
    assert_eq!(server.cmd(&["DBSIZE"]).as_int(), Some(0));
}

/// `/proc/PID/cmdline` of `pid`, its arguments joined by spaces.
fn cmdline(pid: u32) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    // pid (comm) state ppid ...: comm may hold spaces, so from its end.
                    let rest = &stat[stat.rfind(')')? + 2..];
                    rest.split(' ').nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// A running `fencelock run` holding a lock with the password from
/// `FENCELOCK_PASSWORD` shows no password in its command line, nor in its COMMAND's or
/// any other child's: what `ps` shows every user of the machine.
#[test]
fn a_lock_holder_keeps_the_password_out_of_ps() {
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg(PASSWORD)
        .start();
    let holder = Invocation::new("holder", &["run", "held", "--", "sleep", "60"])
        .env("FENCELOCK_REDIS", &server.url())
        .env("FENCELOCK_PASSWORD", PASSWORD);
    let mut child: Child = holder.command().spawn().expect("spawn fencelock");
    let pid = child.id();
    /// Kills and reaps `fencelock` if the test fails half-way.
    struct Reap(Option<Child>);
    impl Drop for Reap {
        fn drop(&mut self) {
            if let Some(mut child) = self.0.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let held = |server: &RedisServer| {
        server
            .cmd_as(PASSWORD, &["EXISTS", "fencelock:{held}"])
            .as_int()
            == Some(1)
    };
    // Until the lock is held and COMMAND runs.
    let deadline = Instant::now() + EVENT_TIMEOUT;
    let sleeping = loop {
        let sleeping = children(pid)
            .into_iter()
            .find(|&c| cmdline(c).is_some_and(|line| line.starts_with("sleep 60")));
        if let (true, Some(sleeping)) = (held(&server), sleeping) {
            break sleeping;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("fencelock exited early: {status}");
        }
        assert!(Instant::now() < deadline, "the lock was not taken");
        thread::sleep(POLL);
    };
    let mut reap = Reap(Some(child));
    let own = cmdline(pid).expect("fencelock's command line");
    assert!(own.contains("run held -- sleep 60"), "{own}");
    let mut lines = vec![own];
    for c in children(pid).into_iter().chain(children(sleeping)) {
        lines.extend(cmdline(c));
    }
    assert!(lines.len() >= 2, "fencelock and its COMMAND: {lines:?}");
    for line in &lines {
        for secret in SECRETS {
            assert!(!line.contains(secret), "ps shows {secret:?}: {line}");
        }
    }

    // SIGTERM: forwarded to COMMAND, the lock released, and nothing said shows it.
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut child = reap.0.take().unwrap();
    let deadline = Instant::now() + EVENT_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "fencelock did not exit on SIGTERM"
        );
        thread::sleep(POLL);
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(143), "{stderr}");
    for secret in SECRETS {
        assert!(!stderr.contains(secret), "{stderr}");
    }
    assert!(!held(&server), "released");
}
