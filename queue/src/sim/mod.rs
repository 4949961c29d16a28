//! The simulator on the queue's own core (`gantry-queue simulate TRACE.csv --cluster SPEC`):
//! replays a job trace on emulated agents with emulated time and reports wait and completion
//! times, GPU utilization, per-team share over time, preemptions, deadline misses, idle GPUs
//! while work was eligible, GPUs held for reservations and the error of the queue's start
//! estimates (when its job views carry `estimated_start_unix_ms`). Users' guide: docs/queue.md,
//! "Simulator".
//!
//! - [`trace`]: the job-trace format (CSV), the cluster specification (`4x8:A100,2x8:H100` or
//!   TOML), and the converter from the Alibaba `openb` pod lists.
//! - [`engine`]: the queue's policy: [`crate::core::Core`] driven through its public API, with
//!   this module emulating the master (offers, declines, rescinds) and the agents (tasks that
//!   run for the trace's duration, kills after the grace period). Instants are a base
//!   `Instant` plus the simulated offset: no clock is read while simulating.
//! - [`baseline`]: FIFO and a Slurm-like priority + EASY backfill on the same emulated
//!   cluster, for comparison only.
//! - [`cli`]: the `simulate` subcommand's arguments and output.
//! - [`report`]: the bookkeeping every run shares and the [`report::Report`] made of it.
//!
//! Everything here is pure (a trace and a cluster in, reports out) and deterministic but for
//! the core's random task and offer ids, which decide nothing.

pub mod baseline;
pub mod cli;
pub mod engine;
pub mod report;
pub mod trace;

#[cfg(test)]
mod tests;

use crate::core::CoreConfig;
use report::Report;
use trace::{AgentGroup, TraceJob};

/// How to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// The queue's tunables (teams, aging, holds).
    pub core: CoreConfig,
    /// Seconds between the preemption (or time-limit) warning and the worker's end.
    pub grace_secs: u32,
    /// The core is ticked at least this often (seconds) while jobs remain.
    pub tick: f64,
    /// Stop at this simulated time (seconds); `None`: when every job has ended.
    pub horizon: Option<f64>,
    /// Intervals of the per-team share over time.
    pub buckets: usize,
    /// The Unix time (ms) the trace's time 0 stands for (deadlines, estimates).
    pub base_unix_ms: u64,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            core: CoreConfig::default(),
            grace_secs: 30,
            tick: 30.0,
            horizon: None,
            buckets: 10,
            base_unix_ms: 1_800_000_000_000,
        }
    }
}

/// A policy to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The queue's own core.
    Queue,
    /// A baseline.
    Baseline(baseline::Baseline),
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "queue" => Ok(Policy::Queue),
            "fifo" => Ok(Policy::Baseline(baseline::Baseline::Fifo)),
            "easy" => Ok(Policy::Baseline(baseline::Baseline::Easy)),
            _ => Err(format!("unknown policy {s:?} (queue, fifo, easy)")),
        }
    }
}

/// Simulates `trace` on `cluster` under `policy`.
pub fn simulate(
    policy: Policy,
    trace: &[TraceJob],
    cluster: &[AgentGroup],
    opts: &SimOptions,
) -> Report {
    match policy {
        Policy::Queue => engine::run(trace, cluster, opts),
        Policy::Baseline(b) => baseline::run(b, trace, cluster, opts),
    }
}
