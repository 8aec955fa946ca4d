//! Lock algorithms, built on the backend: the acquire engine (attempts, waiting for a
//! release, clean-up), the retry schedule of a waiting acquire, and the watchdog that
//! renews held leases.

pub(crate) mod acquire;
pub(crate) mod retry;
pub(crate) mod watchdog;
