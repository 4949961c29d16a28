//! Shared harness for cluster tests.

pub mod etcd;
pub mod proxy;
