# Shared set-up for scripts/test, scripts/demo and .ci/run. Source it; do not run it.

# Installs redis-server from Debian's packages when it is not on PATH.
need_redis_server() {
  if command -v redis-server >/dev/null 2>&1; then
    return
  fi
  echo "redis-server not found: installing it with apt-get" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
  # Debian starts a system service on 6379; fencelock never uses it, and it is left alone.
  command -v redis-server >/dev/null 2>&1 || { echo "could not install redis-server" >&2; exit 1; }
}

# Installs tmux from Debian's packages when it is not on PATH: the CLI's terminal tests
# (Ctrl-C, Ctrl-Z, a COMMAND that reads the terminal) run fencelock inside it.
need_tmux() {
  if command -v tmux >/dev/null 2>&1; then
    return
  fi
  echo "tmux not found: installing it with apt-get" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq tmux >/dev/null
  command -v tmux >/dev/null 2>&1 || { echo "could not install tmux" >&2; exit 1; }
}

# Checks for a Rust toolchain (1.88 or newer).
need_cargo() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust 1.88 or newer (https://rustup.rs) and try again" >&2
    exit 1
  fi
}
