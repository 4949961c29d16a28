//! # gantry-master
//!
//! - [`allocator`]: PURE hierarchical DRF allocator and the offer book (no I/O, time is an input).
