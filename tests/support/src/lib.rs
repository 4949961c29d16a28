//! # gantry-test-support
//!
//! Dev-only helpers shared by `gantry-master`'s integration tests and benchmarks and by the
//! cluster tests of `gantry-tests` (a dev-dependency of both; nothing ships it). Synchronous
//! (std processes, sockets and threads), so plain tests and tokio tests alike can use them.
//!
//! - [`etcd`]: a real single-member etcd server on free ports that can be killed and restarted.
//! - [`proxy`]: a TCP proxy on a free loopback port that can cut, stall and restore a link.
//! - `registry` (feature `registry`): a real OCI registry (`docker-registry`) on a free loopback
//!   port, plain, TLS or htpasswd-protected, and test images built with `umoci`, pushed with
//!   `skopeo`.
//! - `election` (feature `election`, for `gantry-master`'s HA tests and benchmarks): campaigning
//!   nodes over a real etcd that log their leadership events, and checks on that log.

#[cfg(feature = "election")]
pub mod election;
pub mod etcd;
pub mod proxy;
#[cfg(feature = "registry")]
pub mod registry;
