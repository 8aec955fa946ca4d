//! fencelock's shipped Lua scripts, model-checked.
//!
//! - [`keyspace`]: one Redis server in memory (the commands the scripts send, Redis's
//!   replies and errors, expiry by a logical clock);
//! - [`lua`]: the scripts' exact text run by a real Lua 5.1, as Redis runs them, with
//!   `redis.call` served by a [`keyspace::Server`];
//! - [`scripts`]: the library's script registry, and textual mutations of it for the
//!   checker's controls;
//! - [`client`]: the worlds' clients, the library's own acquire engine
//!   (`fencelock::model`), and what the model does in place of its I/O;
//! - [`world`]: the checker's worlds (a server, clients, messages, clock, faults) and
//!   their properties;
//! - [`watchdog`]: a holder's watchdog, the library's own decisions on its lease,
//!   driven by the world as the renewing holder's timer and `renew.lua` calls;
//! - [`redlock`]: a Redlock client's memory of its nodes and the library's tally of
//!   their answers, for the worlds of 3 nodes;
//! - [`controls`]: the mutations each property must be caught violated by;
//! - [`first`]: each property's first counterexample (a shortest), not the last met.
//! - [`catalogue`]: the worlds `scripts/model` checks and what each must show.
//!
//! The keyspace is proven against real servers by `tests/differential.rs`.

pub mod catalogue;
pub mod client;
pub mod controls;
pub mod first;
pub mod keyspace;
pub mod lua;
pub mod redlock;
pub mod scripts;
pub mod watchdog;
pub mod world;
