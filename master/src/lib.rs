//! # gantry-master
//!
//! The master tracks agents and frameworks, decides offers by Dominant Resource Fairness,
//! validates accepts and tracks tasks; several masters elect a leader through etcd.
//!
//! - [`security`]: PURE security decisions the rest calls: identities (certificates, tokens,
//!   sessions to principals), ACLs, operator tokens, per-principal limits, the run-as policy,
//!   role and user name validation (docs/security.md; it depends on nothing in `state`).
//!   [`acl`] and [`tokens`] are its modules under their old paths.
//! - [`allocator`]: PURE hierarchical DRF allocator and the offer book (no I/O; time is an input).
//! - [`state`]: PURE-ish state machine of agents, frameworks and tasks; accept validation; the
//!   `/state` view. Takes inputs and time (and the leadership lease), returns messages to send
//!   and when it wants to be woken next (`Master::next_deadline`). One `Master`, its handlers
//!   split by concern (`agents`, `frameworks`, `accept`, `tasks`, `reconcile`, `timers`,
//!   `operator`, `recovery`, typed refusals in `rejection`; see its module map).
//! - [`server`]: the I/O shell: QUIC accept loop, per-peer connection tasks, the core event
//!   loop, and the operator API over HTTPS (`server::http`: operator certificates and tokens,
//!   ACL-checked writes, bounded requests; axum on hyper with tokio-rustls).
//! - [`client`]: the HTTPS client for the operator API (reqwest, rustls on ring), used by
//!   `gantryctl` and the cluster tests.
//! - [`simulate`]: the scenario simulator, trace mode and benchmark driving the allocator in
//!   simulated time, and the GPU placement replay of Alibaba's openb trace (`--openb`).
//! - [`election`]: standalone or etcd leader election (epoch, write fence, leader address); its
//!   PURE `health` module decides what `/health` says and what parked peers are told when.
//! - [`registry`]: the persistent registry (work-dir file or etcd), fenced by leadership.

pub mod allocator;
pub mod client;
pub mod election;
pub mod registry;
pub mod security;
pub mod server;
pub mod simulate;
pub mod state;

// The old paths of two security modules (gantryctl, the cluster tests).
pub use security::{acl, tokens};
