//! The engine, above the backend and the protocols: the acquire state machine
//! (`acquire.rs`: attempts, waiting for a release, clean-up), the retry schedule of a
//! waiting acquire, and the watchdog that renews held leases. The acquire engine sees
//! the nodes only through [`nodes::Nodes`], which the backend implements and the tests'
//! scripted fake (`fake.rs`) does too.

pub(crate) mod acquire;
#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod fake;
pub(crate) mod nodes;
pub(crate) mod retry;
pub(crate) mod watchdog;
