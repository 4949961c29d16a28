//! # gantry-master
//!
//! The master tracks agents and frameworks, decides offers by Dominant Resource Fairness,
//! validates accepts and tracks tasks; several masters elect a leader through etcd.
//!
//! - [`acl`]: PURE access-control lists: which principals may subscribe with which roles, run
//!   tasks as which users, and perform which operator actions (deny by default once given).
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
//! - [`tokens`]: PURE operator bearer tokens: stored as SHA-256, compared in constant time.
//! - [`simulate`]: the scenario simulator, trace mode and benchmark driving the allocator in
//!   simulated time, and the GPU placement replay of Alibaba's openb trace (`--openb`).
//! - [`election`]: standalone or etcd leader election (epoch, write fence, leader address); its
//!   PURE `health` module decides what `/health` says and what parked peers are told when.
//! - [`registry`]: the persistent registry (work-dir file or etcd), fenced by leadership.

pub mod acl;
pub mod allocator;
pub mod client;
pub mod election;
pub mod registry;
pub mod server;
pub mod simulate;
pub mod state;
pub mod tokens;
