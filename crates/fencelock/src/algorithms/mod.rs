//! Lock algorithms, built on the backend: the single-node protocol and the retry
//! schedule of a waiting acquire.

pub(crate) mod retry;
pub(crate) mod single_node;
