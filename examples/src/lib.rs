//! Example Gantry frameworks, built on `gantry-sdk` (the `batch` binary also uses `gantry-pki`
//! in dev mode, to issue its certificate from the TLS directory's CA key).
//!
//! - [`batch`]: run N copies of a command and report how they ended (binary `batch`).
//! - [`gpu_queue`]: an ML job queue with priorities, gangs, team fair share, backfill and
//!   preemption (binary `gpu-queue`).
//! - [`service`]: keep N instances of a command up, with health checks, restarts with
//!   backoff and rolling replacement (binary `service`).
//! - [`sweep`]: a hyper-parameter sweep, trials retried with backoff (an attempts book), then
//!   an evaluation task group on one agent (binary `sweep`).

pub mod batch;
pub mod gpu_queue;
pub mod service;
pub mod sweep;
