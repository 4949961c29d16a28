//! Example Gantry frameworks, built on `gantry-sdk` (the `batch` binary also uses `gantry-pki`
//! in dev mode, to issue its certificate from the TLS directory's CA key).
//!
//! - [`batch`]: run N copies of a command and report how they ended (binary `batch`).
//! - [`service`]: keep N instances of a command up, with health checks, restarts with
//!   backoff and rolling replacement (binary `service`).
//! - [`sweep`]: a hyper-parameter sweep, trials retried with backoff (an attempts book), then
//!   an evaluation task group on one agent (binary `sweep`).
//!
//! The ML job queue that was `gpu-queue` here is now its own crate and binary, `gantry-queue`
//! (`queue/`, docs/queue.md).

pub mod batch;
pub mod service;
pub mod sweep;
