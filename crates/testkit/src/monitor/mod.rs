//! The server's own account of what happened to the lock keys: a `MONITOR`
//! recorder and a replay that turns it into checker C5's input.
//!
//! [`checkers::foreign_touch`](crate::checkers::foreign_touch) (C5) needs,
//! for every release or extend that acted on a lock key, the owner token the
//! key held at that moment (`touched_owner`). The scripts under test could
//! report it themselves, but then a buggy script would also report wrongly.
//! Here the ground truth comes from the server instead: a [`Monitor`] records
//! every command the server executes, and [`touches`] replays the commands
//! on the lock keys to know which token each key held when a script deleted
//! it or changed its expiry.
//!
//! ```no_run
//! use std::time::Duration;
//! use testkit::{RedisServer, checkers, monitor::{self, Monitor}};
//!
//! let server = RedisServer::start();
//! let monitor = Monitor::start(&server.addr()).unwrap();
//! // ... run the workload against `server` ...
//! monitor.sync().unwrap(); // everything run so far is recorded
//! let entries = monitor.stop();
//! let t = monitor::touches(&entries, &["fencelock:{lab:x}"], Duration::from_millis(5));
//! println!("C5 judged {} touches, skipped {}", t.judged, t.skipped);
//! assert!(checkers::foreign_touch(&t.events).is_empty());
//! ```
//!
//! # What `MONITOR` shows (checked on redis-server 7.0)
//!
//! * One line per executed command, in execution order, as a RESP simple
//!   string: `1795325555.103104 [0 127.0.0.1:58326] "set" "k" "v"`: the
//!   server's wall clock (seconds and microseconds), the client's database,
//!   the source (`lua` for commands a script runs, `unix:PATH` for a unix
//!   socket client, else the client's address) and the arguments, quoted
//!   with C-like escapes. Clients' command names appear as the client sent
//!   them (usually lower case), scripts' as the script wrote them.
//! * A script call (`EVAL`, `EVALSHA`, `FCALL`, ...) is shown **before** the
//!   commands it runs; every other command **after** it ran (so `SELECT 3`
//!   already shows database 3).
//! * Commands that fail while executing are shown (`SET k v PX 0`,
//!   `WRONGTYPE` errors, a failing `redis.call`): a line does not mean the
//!   command took effect, so the replay treats arguments it cannot parse as
//!   "state unknown". Commands rejected before executing (unknown command,
//!   wrong number of arguments) are not shown.
//! * Administrative commands (`CONFIG`, `DEBUG`, `REPLICAOF`, ...) are never
//!   shown, nor are expirations and evictions: the replay computes expiry
//!   itself, and a test must not use the others on lock keys.
//!
//! # Cost
//!
//! The server formats every command for every monitor: expect throughput to
//! drop noticeably (Redis' documentation mentions up to half) while a
//! [`Monitor`] is attached, which widens race windows rather than hiding
//! them. Entries are kept in memory until [`Monitor::stop`].

mod parser;
mod recorder;
mod replay;

pub use parser::{Entry, Source, parse_line};
pub use recorder::Monitor;
pub use replay::{Touches, touches};
