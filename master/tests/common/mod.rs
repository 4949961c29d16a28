//! Shared pieces of the HA integration tests: the real-etcd and TCP-proxy harnesses and the
//! election driver (a node that runs one election and logs its events with their emission
//! instants), all from the dev-only `gantry-test-support` crate.

#![allow(dead_code)]

// Each test binary uses some of them.
#[allow(unused_imports)]
pub use gantry_test_support::election::*;
#[allow(unused_imports)]
pub use gantry_test_support::{etcd, proxy};
