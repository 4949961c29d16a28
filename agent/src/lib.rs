//! # gantry-agent
//!
//! Runs on each (GPU) host: measures its resources, registers with the leading master,
//! launches tasks in sandboxes, reports their status reliably and survives its own restart.
//!
//! - [`agent`]: the core event loop owning tasks, the update queue and the checkpoint.
//! - [`session`]: the QUIC connection to the master (mutual TLS, redirects, reconnects).
//! - [`executor`]: task launch under a per-task supervisor, exit status, kill.
//! - [`updates`]: PURE status update manager (in-order, retried with backoff until acked).
//! - [`checkpoint`]: on-disk state for recovery after an agent restart.
//! - [`config`]: command-line parsing helpers (`--resources`, `--attributes`, `--reserve`).

pub mod agent;
pub mod checkpoint;
pub mod config;
pub mod executor;
pub mod session;
pub mod updates;
