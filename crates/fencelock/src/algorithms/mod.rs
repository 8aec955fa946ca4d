//! Lock algorithms, built on the backend: the single-node protocol and the retry
//! schedule of a waiting acquire, and the watchdog that renews held leases.

pub(crate) mod quorum;
pub(crate) mod retry;
pub(crate) mod single_node;
pub(crate) mod watchdog;
