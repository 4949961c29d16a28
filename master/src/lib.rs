//! # gantry-master
//!
//! - [`allocator`]: PURE hierarchical DRF allocator and the offer book (no I/O, time is an input).
//! - [`election`]: standalone or etcd leader election (epoch, write fence, leader address).
//! - [`registry`]: the persistent registry (work-dir file or etcd), fenced by leadership.

pub mod election;
pub mod registry;
