//! # gantry-master
//!
//! The master tracks agents and frameworks, decides offers by Dominant Resource Fairness,
//! validates accepts and tracks tasks.
//!
//! - [`allocator`]: PURE hierarchical DRF allocator and the offer book (no I/O; time is an input).
//! - [`state`]: PURE-ish state machine of agents, frameworks, tasks; accept validation; the
//!   `/state` view. Takes inputs and time, returns messages to send.
//! - [`server`]: the I/O shell: QUIC accept loop, per-peer connection tasks, the core event
//!   loop, HTTP (axum).
pub mod allocator;
pub mod server;
pub mod state;
