//! Example Gantry frameworks, built on `gantry-sdk` (the `batch` binary also uses `gantry-pki`
//! in dev mode, to issue its certificate from the TLS directory's CA key).
//!
//! - [`batch`]: run N copies of a command and report how they ended (binary `batch`).
//! - [`service`]: keep N instances of a command up, with health checks, restarts with
//!   backoff and rolling replacement (binary `service`).
//!
//! The ML job queue that was `gpu-queue` here is now its own crate and binary, `gantry-queue`
//! (`queue/`, docs/queue.md).

pub mod batch;
pub mod service;
