//! The policy simulator on the same core (`gantry-autoscaler simulate`): replays a workload
//! (arrivals, durations) against the pools of a configuration, with [`Core`](crate::core::Core) deciding and
//! `gantry-placement`'s best-fit [`Placer`](gantry_placement::Placer) placing pending tasks on the registered nodes, and
//! reports cost, provisioned-GPU utilization, pending times and scale events. Pure: the trace
//! and the configuration in, a [`SimResult`] out.
//!
//! The clock advances in ticks (`tick_s`). Each tick: tasks that ended release their node;
//! arrivals join the pending queue (in arrival order); nodes whose provisioning delay passed
//! register; pending tasks are placed first-come first-served on registered nodes that are not
//! draining; what is left is the unplaceable demand of a core round, whose actions create nodes
//! (registering `provision_s` later), drain them (no more placements) and delete them. A task
//! runs for its trace duration from when it is placed. Tasks no pool's empty node can hold are
//! counted and skipped. Spot notices (seeded or from a file) drain a node and kill what still
//! runs at the deadline; with consolidation on, the core sees where tasks run and its drains
//! move them (docs/autoscaling.md "The policy simulator").
//!
//! The Alibaba `openb` pod lists (shared/traces/alibaba-openb) are read by [`parse_openb`]:
//! `creation_time` is the arrival, `deletion_time - creation_time` the duration (seconds).
//!
//! Module map:
//! - `trace`: workload traces ([`parse_openb`]).
//! - `spot`: spot interruptions: the seeded Poisson model ([`SpotModel`]), notices from a file
//!   ([`parse_interruptions`]) and what a kill keeps ([`checkpoint_split`], [`kill_split`]).
//! - `run`: the replay loop ([`simulate`], [`simulate_consolidation`]) and the static peak
//!   fleet ([`static_fleet`]).

use std::collections::BTreeMap;

use gantry_placement::GpuDemand;
use serde::Serialize;

mod run;
mod spot;
mod trace;

pub use run::{simulate, simulate_consolidation, static_fleet};
pub use spot::{checkpoint_split, kill_split, parse_interruptions, Interruption, SpotModel};
pub use trace::{parse_openb, TraceError};

/// One task of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct SimTask {
    /// Arrival, seconds.
    pub arrival: u64,
    /// Run time once placed, seconds.
    pub duration: u64,
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub mem_mib: u64,
    /// GPUs.
    pub gpu: GpuDemand,
    /// Accepted GPU models (empty: any).
    pub models: Vec<String>,
    /// The trace's QoS class (`LS`, `BE`, ...).
    pub qos: String,
}

/// Simulation settings.
#[derive(Debug, Clone)]
pub struct SimSettings {
    /// Seconds per tick (the core runs once per tick).
    pub tick_s: u64,
    /// Seconds from a create to the node registering.
    pub provision_s: u64,
    /// Spot notices.
    pub spot: SpotModel,
    /// Notices read from a file ([`parse_interruptions`]), beside the seeded model's.
    pub interruptions: Vec<Interruption>,
    /// Classes that checkpoint when their node gets a notice (or a consolidation's drain),
    /// with the seconds their checkpoint takes ([`kill_split`]).
    pub checkpoint_on_notice: BTreeMap<String, u64>,
    /// Checkpoint interval per QoS class, seconds of run time (a class not listed, or 0:
    /// no checkpoints).
    pub checkpoint_s: BTreeMap<String, u64>,
    /// QoS classes that prefer on-demand capacity: their tasks are placed on on-demand nodes
    /// and planned on on-demand pools only (when some on-demand pool can hold them).
    pub on_demand_classes: Vec<String>,
}

impl SimSettings {
    /// No spot notices; `BE` and `Burstable` tasks checkpoint every 10 minutes and may run on
    /// spot; `LS` and `Guaranteed` tasks (services) do not checkpoint and prefer on-demand.
    pub fn new(tick_s: u64, provision_s: u64) -> SimSettings {
        SimSettings {
            tick_s,
            provision_s,
            spot: SpotModel::default(),
            interruptions: Vec::new(),
            checkpoint_on_notice: BTreeMap::new(),
            checkpoint_s: BTreeMap::from([("BE".into(), 600), ("Burstable".into(), 600)]),
            on_demand_classes: vec!["LS".into(), "Guaranteed".into()],
        }
    }
}

/// What a run cost and how it served the workload.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SimResult {
    /// Sum over pools of node-seconds × price.
    pub cost: f64,
    /// Per pool: cost.
    pub cost_per_pool: BTreeMap<String, f64>,
    /// Allocated GPU time over provisioned GPU time (all nodes, any phase).
    pub gpu_utilization: f64,
    /// Provisioned GPU-hours.
    pub gpu_hours: f64,
    /// Pending time (arrival to first placement), seconds, median.
    pub pending_p50_s: u64,
    /// 99th percentile.
    pub pending_p99_s: u64,
    /// Tasks placed (at least once).
    pub placed: u64,
    /// Tasks that ran to their end.
    pub finished: u64,
    /// Tasks no pool can hold (skipped).
    pub unfittable: u64,
    /// Tasks still pending at the end.
    pub never_placed: u64,
    /// Scale-up decisions.
    pub scale_ups: u64,
    /// Nodes drained for idleness.
    pub scale_downs: u64,
    /// Nodes created.
    pub nodes_created: u64,
    /// Most nodes at once, per pool.
    pub peak_nodes: BTreeMap<String, u32>,
    /// Spot notices (nodes interrupted), all pools.
    pub interruptions: u64,
    /// Nodes the core created to replace interrupted ones.
    pub replacements: u64,
    /// Of those, in an on-demand fallback pool.
    pub fallback_replacements: u64,
    /// Tasks killed when an interrupted node was reclaimed (each kill counts).
    pub tasks_interrupted: u64,
    /// Tasks killed at least once that then ran to their end (interruptions survived).
    pub interrupted_tasks_finished: u64,
    /// Run time lost to kills: seconds run since the task's last checkpoint, summed.
    pub work_lost_task_s: u64,
    /// The same, weighted by the tasks' GPUs (GPU-seconds).
    pub work_lost_gpu_s: f64,
    /// Notices from the interruption file that found no node to interrupt.
    pub interruptions_missed: u64,
    /// Busy nodes drained by consolidation (removed, or replaced by cheaper nodes).
    pub consolidations: u64,
    /// Of those, replaced by cheaper nodes.
    pub replaced_by_cheaper: u64,
    /// Tasks moved off nodes consolidation drained (each move counts).
    pub moved_tasks: u64,
    /// Their run time still to go when moved, seconds (the work consolidation moved).
    pub moved_task_s: u64,
    /// Cost of the same run without consolidation minus this run's, when the caller ran
    /// both ([`simulate_consolidation`]); 0 otherwise.
    pub consolidation_saved: f64,
    /// Simulated seconds.
    pub span_s: u64,
}

#[cfg(test)]
mod tests;
