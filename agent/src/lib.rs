//! # gantry-agent
//!
//! Runs on each (GPU) host: measures its resources, registers with the leading master,
//! launches tasks in sandboxes, reports their status reliably and survives its own restart.
//!
//! - [`core`]: PURE agent state machine ([`core::AgentCore`]): takes inputs (master messages,
//!   launches, exits, samples, GPU faults, ticks) and the time, returns effects (launch, signal,
//!   send, persist, sample, settle, collect). Task lifecycle, kill escalation, GPU health,
//!   recovery, the sandbox collection queue.
//! - [`agent`]: the thin tokio runtime around the core: performs its effects (the log's group
//!   commit as the core's `end_batch` decides, launches off the loop, cgroups, sampling,
//!   sandbox GC, MPS, `/metrics`). A task, forward: `RunTask` → core → commit → launch →
//!   `Launched` → `Exited` (with its cgroup's outcome) → terminal → acknowledged, forgotten.
//! - [`session`]: the QUIC connection to the master (mutual TLS, redirects, reconnects).
//! - [`container`]: tasks in OCI containers (`TaskInfo.container`): the runtime spec (oci-spec),
//!   overlay root filesystems, volumes, GPUs through CDI, run under `runc`/`crun`.
//! - [`executor`]: task launch through the agent's supervisor process (shell string or argv, as
//!   the task's Unix user: [`executor::user`], looked up once per user per burst), the launch
//!   record ([`executor::record`]: what was observed of a launch — the claim, a reused
//!   cgroup's baseline, the exit, the cgroup's outcome; the log holds what the agent decided),
//!   exit status, kill.
//! - [`updates`]: PURE status update manager (in-order, retried with backoff until acked).
//! - [`checkpoint`]: the snapshot of the on-disk state for recovery after an agent restart.
//! - [`wal`]: the write-ahead log of changes (group commit, background compaction, replay).
//! - [`gc`]: PURE sandbox garbage collection policy (delay, disk headroom, newest kept).
//! - [`disk`]: disk limits (`--disk-enforcement du`): the du-style walk of a sandbox (hard
//!   links once, allocated blocks, links not followed, bounded per pass) and the PURE verdict.
//! - [`discovery`]: host resources and NVML GPUs (nvml-wrapper).
//! - [`gpu`]: PURE GPU policy: topology-aware assignment, health, usage attribution.
//! - [`isolation`]: cgroups v1/v2 (cpu, memory, pids, devices; v2 devices via eBPF); the
//!   agent's root weighed by the CPUs it offers.
//! - [`metrics`]: `GET /metrics` (`--metrics-listen`): dcgm-exporter GPU series with the task
//!   holding each GPU, GPU health, per-task CPU and memory.
//! - [`sandbox_api`]: a task's sandbox for operators over the master's connection (protocol v9
//!   sandbox streams): list and read files beneath the sandbox, follow logs, exec in a task.
//! - [`config`]: command-line parsing helpers (`--resources`, `--attributes`, `--reserve`).
//! - [`termination`]: spot-termination notices (`gantry-agent notice-termination`) handed to
//!   the running agent through its work dir.

pub mod agent;
pub mod checkpoint;
pub mod config;
pub mod container;
pub mod core;
pub mod discovery;
pub mod disk;
pub mod executor;
pub mod gc;
pub mod gpu;
pub mod isolation;
pub mod metrics;
pub mod sandbox_api;
pub mod session;
pub mod termination;
pub mod updates;
pub mod wal;
