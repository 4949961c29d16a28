//! `gpu-queue`: an ML job queue framework (binary `gpu-queue`).
//!
//! Jobs are gangs of identical workers (`min..max`, elastic when `min < max`) with a team, a
//! priority class, an optional deadline and GPU selector, and optional dependencies on other
//! jobs (`after`: Slurm's `afterok`). The queue orders eligible jobs by priority (with aging),
//! teams' weighted dominant share (with per-team GPU quotas that may borrow; GPU time over the
//! run decides the rounding), deadline and age; places them with `gantry_sdk::placement` (offers, gangs); keeps a
//! reservation for the first blocked job so backfill cannot delay it; and lets blocked
//! `critical`/`high` jobs preempt lower classes where that actually makes room.
//!
//! - [`model`]: job specifications, priorities, states, the API's JSON views.
//! - [`core`]: the pure queue (events and time in, actions out).
//! - [`framework`]: the scheduler and ticker around the core.
//! - [`http`]: the submission API (`/jobs`) and `/metrics`.

pub mod core;
pub mod framework;
pub mod http;
pub mod model;
