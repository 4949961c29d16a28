//! PURE agent core: the agent's state machine, like the master's `state` module. It owns the
//! checkpointed state (tasks, the status update queue, GPU health, the agent id), the session
//! flags and every timed rule; it takes [`Input`]s with the time (`now`, Unix ms: the one clock;
//! the GPU health tracker's `Instant`s are derived from it) and returns [`Effect`]s: messages to
//! send, log records to persist, launches, signals, cgroup settlements, usage samples, probes,
//! MPS daemon starts. [`AgentCore::next_deadline`] says when it next has something to do
//! ([`Input::Tick`]); the runtime sleeps until then or the next input. It reads no clock, does
//! no I/O and draws no randomness (status update ids count up from
//! [`CoreConfig::update_id_seed`]); the runtime ([`crate::agent`]) performs the effects and
//! feeds back what they observed (a launch's supervisor, an exit status, a lost supervisor, a
//! settled cgroup, a sample, a probe of re-adopted tasks, an MPS daemon's exit).
//!
//! Read in this order (a task's path through the core, then what it draws on):
//!
//! - `io`: what goes in and out — the configuration, [`Input`]s, [`Effect`]s, the group-commit
//!   decision ([`Commit`]: sync only when something leaves the agent) and the rules' timing
//!   constants.
//! - this module: the state ([`AgentCore`]), the dispatch of each input to its handler
//!   ([`AgentCore::handle`]) and the end of a batch ([`AgentCore::end_batch`]).
//! - `master`: the master session: registration (fitted into one frame), the master's
//!   messages (run, kill, acknowledge, refuse, clear a GPU), due status updates, what the agent
//!   advertises.
//! - `tasks`: task lifecycle: launch plans (GPU choice, user, env, limits), settlement into a
//!   terminal state (at once for a task without a cgroup), status updates, GPU-memory shares.
//! - `groups`: task groups: all members start or none, the group environment, and the
//!   group's policy when a member ends.
//! - `kill`: kills and their escalation (the index of killed tasks), a dead supervisor's task
//!   killed.
//! - `timers`: [`AgentCore::next_deadline`] and the `Tick` that acts on it (heartbeats,
//!   samples, sandbox collection, the operator files' polls, each module's timed rule).
//! - `recovery`: re-adopting checkpointed tasks after a restart from what the runtime probed,
//!   and watching them (probes of their supervisors; no exit record after 1 s).
//! - What tasks hold and what watches them: `pool` (prepared task cgroups, `--cgroup-pool`),
//!   `ports` (the port range, `--ports`, and the host ports of tasks asking `ports:K`:
//!   `PORT`, `PORT0`.., `GANTRY_PORTS`), `disk` (which sandboxes to measure when and the kill
//!   of a task past its `disk`: `FAILED`, reason `disk-limit`), `health` (GPU faults, recovery
//!   checks, operator clears and the updates they send), `mps` (which GPU's MPS control daemon
//!   to start when, with its restart back-off), `watched` (the index of tasks with a limit a
//!   deadline watches, so `next_deadline` does not scan every task).
//! - `types`: the core's own types (task records, the checkpoint, log records, launches, exit
//!   statuses, limits), which the I/O modules store, fill in and apply.
//! - `tests`: lifecycle, kill escalation, recovery, GPU health, disk limits, the batching
//!   decision and the deadlines with simulated time, without processes.

mod disk;
pub mod groups;
mod health;
mod io;
mod kill;
mod master;
pub mod mps;
pub mod pool;
pub mod ports;
mod recovery;
mod tasks;
#[cfg(test)]
mod tests;
mod timers;
pub mod types;
mod watched;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gantry_proto::*;
use serde::{Deserialize, Serialize};

use crate::discovery::DiscoveredGpu;
use crate::gc;
use crate::gpu::{self, GpuFault, HealthTracker};
use crate::isolation::NvidiaMajors;
pub use types::{Checkpoint, ExitStatus, Launched, Limits, Record, TaskRecord};
use watched::Watched;

pub use io::*;
pub use ports::PortRange;
pub use recovery::RecoveryProbe;

/// The agent's state machine.
pub struct AgentCore {
    pub(crate) config: CoreConfig,
    pub(crate) ckpt: Checkpoint,
    /// Tasks whose record changed since the last [`AgentCore::flush`].
    dirty: HashSet<TaskId>,
    fx: Vec<Effect>,
    /// The clock's reading when the core was made and the matching `Instant` (the GPU health
    /// tracker counts in `Instant`s).
    epoch_ms: u64,
    epoch: Instant,
    connected: bool,
    registered: bool,
    /// The last `Register` left its pending updates out (too large for one frame): they go
    /// out one by one once registered.
    updates_left_out: bool,
    /// Set once a master accepted this agent (only then are unknown cgroups removed).
    accepted: bool,
    heartbeat_every: u64,
    last_heartbeat: u64,
    health: HealthTracker,
    /// Tasks whose cgroup is being read and destroyed.
    settling: HashSet<TaskId>,
    /// When a killed task's cgroup was last SIGKILLed.
    escalated: HashMap<TaskId, u64>,
    sampling: bool,
    last_sample: u64,
    last_gpu_samples: Vec<GpuSample>,
    /// GPUs whose recovery check is running.
    checking: HashSet<String>,
    /// Tasks already reported over their GPU-memory share (once per excursion).
    gpu_mem_over: HashSet<TaskId>,
    /// The termination notice deadline told to the current master.
    notice_sent: Option<u64>,
    /// Tasks re-adopted after a restart (the runtime probes their supervisors).
    adopted: HashSet<TaskId>,
    /// A probe of the adopted tasks is running; when the last one ended.
    probing_adopted: bool,
    last_adopted_probe: u64,
    /// When the termination notice and the GPU clear requests were last read.
    last_notice_poll: u64,
    last_clear_poll: u64,
    /// When a killed task's process group was last SIGKILLed.
    group_killed: HashMap<TaskId, u64>,
    /// The index of kills: every task with a kill requested that is not known to have ended
    /// (a superset: ended and forgotten ones leave it at the next escalation pass), so the
    /// kill deadline and escalation look at these tasks, not at every task.
    killing: BTreeSet<TaskId>,
    /// The index of limits watched by deadlines ([`Watched`]): the disk-limit pass and the MPS
    /// daemons look at these tasks, not at every task.
    watched: Watched,
    /// The MPS control daemons started.
    mps: mps::MpsDaemons,
    /// When the core was made (the start of this agent run).
    started_ms: u64,
    /// The next status update id ([`CoreConfig::update_id_seed`], counting up).
    next_update_id: u128,
    /// Sandboxes of forgotten tasks, oldest first, waiting for garbage collection.
    gc_queue: VecDeque<gc::Ended>,
    /// A collection pass (or the start-up scan) is running.
    gc_busy: bool,
    /// Disk usage of the work directory as last measured (0.0 to 1.0).
    disk_used: f64,
    last_gc: u64,
    /// Prepared task cgroups.
    pool: pool::CgroupPool,
    /// Final usages of settled tasks, sent as one message before the next status updates.
    final_usage: Vec<(TaskId, TaskUsage)>,
    /// What the batch being handled asks of its commit.
    batch: Batch,
    /// A pass measuring sandboxes is running.
    disk_measuring: bool,
    last_disk_pass: u64,
}

impl AgentCore {
    /// A core over the recovered checkpoint; `epoch` is the `Instant` matching `now`.
    pub fn new(config: CoreConfig, ckpt: Checkpoint, now: u64, epoch: Instant) -> Self {
        let config_isolated = config.isolated;
        let config_pool = config.cgroup_pool.clone();
        let update_id_seed = config.update_id_seed;
        let killing = ckpt
            .tasks
            .iter()
            .filter(|(_, t)| t.kill_requested_ms.is_some() && !t.state.is_terminal())
            .map(|(id, _)| *id)
            .collect();
        let watched = Watched::of(&ckpt);
        AgentCore {
            killing,
            watched,
            health: HealthTracker::new(config.gpu_recovery_after),
            config,
            ckpt,
            dirty: HashSet::new(),
            fx: Vec::new(),
            epoch_ms: now,
            epoch,
            connected: false,
            registered: false,
            updates_left_out: false,
            accepted: false,
            heartbeat_every: 1000,
            last_heartbeat: now,
            settling: HashSet::new(),
            escalated: HashMap::new(),
            sampling: false,
            last_sample: now,
            last_gpu_samples: Vec::new(),
            checking: HashSet::new(),
            gpu_mem_over: HashSet::new(),
            notice_sent: None,
            adopted: HashSet::new(),
            probing_adopted: false,
            last_adopted_probe: now,
            last_notice_poll: now,
            last_clear_poll: now,
            group_killed: HashMap::new(),
            mps: Default::default(),
            started_ms: now,
            next_update_id: update_id_seed,
            gc_queue: VecDeque::new(),
            // Until the start-up scan of the work dir reports.
            gc_busy: true,
            disk_used: 0.0,
            last_gc: now,
            final_usage: Vec::new(),
            batch: Batch::default(),
            disk_measuring: false,
            last_disk_pass: now,
            pool: pool::CgroupPool::new(if config_isolated {
                config_pool
            } else {
                pool::PoolConfig::off()
            }),
        }
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.ckpt
    }

    pub fn checkpoint_mut(&mut self) -> &mut Checkpoint {
        &mut self.ckpt
    }

    pub fn registered(&self) -> bool {
        self.registered
    }

    pub fn accepted(&self) -> bool {
        self.accepted
    }

    /// Empties the pool of prepared cgroups (at shutdown): the names to remove.
    pub fn drain_pool(&mut self) -> Vec<String> {
        self.pool.drain()
    }

    /// The pool of prepared cgroups (its prefix is empty without a pool).
    pub fn pool(&self) -> &pool::CgroupPool {
        &self.pool
    }

    pub fn health(&self) -> &HealthTracker {
        &self.health
    }

    pub fn last_gpu_samples(&self) -> &[GpuSample] {
        &self.last_gpu_samples
    }

    pub fn knows(&self, task: &TaskId) -> bool {
        self.ckpt.tasks.contains_key(task)
    }

    /// Re-adopted tasks still watched: not terminal and not settling.
    fn adopted_live(&self) -> Vec<(TaskId, &TaskRecord)> {
        self.adopted
            .iter()
            .filter(|id| !self.settling.contains(id))
            .filter_map(|id| self.ckpt.tasks.get(id).map(|t| (*id, t)))
            .filter(|(_, t)| !t.state.is_terminal())
            .collect()
    }

    fn instant(&self, now: u64) -> Instant {
        self.epoch + Duration::from_millis(now.saturating_sub(self.epoch_ms))
    }

    fn emit(&mut self, effect: Effect) {
        match effect {
            // A released cgroup loses its counters: like a message or a launch, it waits for
            // a synced commit.
            Effect::Send(_) | Effect::Launch(_) | Effect::ReleaseCgroup { .. } => {
                self.batch.leaves = true
            }
            Effect::Persist(_) => self.batch.records = true,
            _ => {}
        }
        self.fx.push(effect);
    }

    fn persist(&mut self, record: Record) {
        self.emit(Effect::Persist(record));
    }

    /// Queues a message for the master (dropped while disconnected).
    fn send(&mut self, msg: AgentToMaster) {
        if self.connected {
            self.emit(Effect::Send(msg));
        }
    }

    /// Sends a message that needs a registered session.
    fn send_registered(&mut self, msg: AgentToMaster) {
        if self.registered {
            self.send(msg);
        }
    }

    /// Handles one input at `now` (Unix ms).
    pub fn handle(&mut self, input: Input, now: u64) -> Vec<Effect> {
        match input {
            Input::Connected => self.connected(),
            Input::Disconnected => {
                self.connected = false;
                self.registered = false;
            }
            Input::Master(msg) => self.master_message(msg, now),
            Input::RunTask {
                framework_id,
                task,
                gpus,
                unbindable_ports,
            } => self.run_task(framework_id, task, &gpus, &unbindable_ports, now),
            Input::RunTaskGroup {
                framework_id,
                group_id,
                policy,
                members,
                unbindable_ports,
            } => self.run_group(
                framework_id,
                group_id,
                policy,
                members,
                &unbindable_ports,
                now,
            ),
            Input::Launched { task, result } => self.launched(task, result, now),
            Input::LaunchProgress { task, message } => self.launch_progress(task, message, now),
            Input::Exited {
                task,
                status,
                outcome,
            } => self.exited(task, status, outcome, now),
            Input::Settled {
                task,
                status,
                outcome,
            } => self.settled(task, status, outcome, now),
            Input::Sampled { tasks, gpus } => self.sampled(tasks, gpus, now),
            Input::GpuFault(fault) => self.gpu_fault(fault, now),
            Input::RecoveryChecked { uuid, passed } => self.recovery_checked(uuid, passed, now),
            Input::ClearGpus(names) => self.clear_gpus(names, now),
            Input::AdoptedProbed(probes) => self.adopted_probed(probes, now),
            Input::SupervisorLost { task, recorded } => self.supervisor_lost(task, recorded, now),
            Input::MpsExited(uuid) => self.mps_exited(&uuid, now),
            Input::TerminationNotice {
                deadline_unix_ms,
                reason,
            } => {
                if deadline_unix_ms.saturating_add(NOTICE_STALE_MS) < now {
                    // Long past: the host was not taken after all (or this is a stale file).
                    tracing::info!(deadline_unix_ms, "removing a stale termination notice");
                    self.emit(Effect::RemoveTerminationNotice);
                } else if self.registered && self.notice_sent != Some(deadline_unix_ms) {
                    self.notice_sent = Some(deadline_unix_ms);
                    let in_ms = deadline_unix_ms.saturating_sub(now);
                    tracing::warn!(in_ms, %reason, "termination notice: asking the master to drain this agent");
                    self.send(AgentToMaster::TerminationNotice { in_ms, reason });
                }
            }
            Input::GcScanned(found) => {
                self.gc_busy = false;
                // Tasks known now (launched since the scan began) are not garbage.
                let found = found
                    .into_iter()
                    .filter(|e| !self.ckpt.tasks.contains_key(&e.task))
                    .collect();
                gc::merge(&mut self.gc_queue, found);
            }
            Input::GcDone { disk_used } => {
                self.gc_busy = false;
                if let Some(u) = disk_used {
                    self.disk_used = u;
                }
            }
            Input::Tick => self.tick(now),
            Input::CgroupsPrepared { asked, ready } => self.pool.prepared(asked, ready, now),
            Input::CgroupRecycled(name) => self.pool.recycled(name),
            Input::DiskMeasured(readings) => self.disk_measured(readings, now),
        }
        std::mem::take(&mut self.fx)
    }

    /// Ends a batch: due status updates go out and the changed task records are persisted
    /// (the runtime commits the log before sending anything). [`AgentCore::end_batch`] without
    /// the commit decision.
    pub fn flush(&mut self, now: u64) -> Vec<Effect> {
        self.end_batch(now).0
    }

    /// Ends a batch (group commit): its last effects, and how the runtime commits the log
    /// records of every input handled since the previous batch ended before it performs the
    /// batch's messages and launches. One commit per batch whatever the number of tasks in it:
    /// a burst of launches, starts and exits costs one `fdatasync`. [`Commit::Sync`] when
    /// anything leaves the agent (a message, a launch: what it announces must be durable
    /// first); [`Commit::Write`] when only records changed that nothing sent depends on
    /// (acknowledgements, a forgotten task: the next synced commit makes them durable, and
    /// losing them to a power cut only repeats an update); [`Commit::None`] otherwise.
    pub fn end_batch(&mut self, now: u64) -> (Vec<Effect>, Commit) {
        self.flush_updates(now);
        let make = self.pool.refill(now);
        if !make.is_empty() {
            self.emit(Effect::PrepareCgroups(make));
        }
        let mut dirty: Vec<TaskId> = self.dirty.drain().collect();
        dirty.sort();
        for id in dirty {
            let record = match self.ckpt.tasks.get(&id) {
                Some(rec) => Record::Task(Box::new(rec.clone())),
                None => Record::TaskRemoved(id),
            };
            self.persist(record);
        }
        let batch = std::mem::take(&mut self.batch);
        let commit = if batch.leaves {
            Commit::Sync
        } else if batch.records {
            Commit::Write
        } else {
            Commit::None
        };
        (std::mem::take(&mut self.fx), commit)
    }
}
