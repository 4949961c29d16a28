//! # gantry-master
//!
//! - [`allocator`]: PURE hierarchical DRF allocator and the offer book (no I/O, time is an input).
//! - [`simulate`]: the scenario simulator and benchmark driving the allocator in simulated time.

pub mod allocator;
pub mod server;
pub mod simulate;
pub mod state;
