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
//! - `tasks`: task lifecycle: launch plans (GPU choice, user, env, limits), settlement into a
//!   terminal state (at once for a task without a cgroup), status updates, GPU-memory shares.
//! - `kill`: kills and their escalation (the index of killed tasks), a dead supervisor's task
//!   killed.
//! - `groups`: task groups: all members start or none, the group environment, and the
//!   group's policy when a member ends.
//! - `io`: the configuration, inputs, effects, the group-commit decision ([`Commit`]: sync
//!   only when something leaves the agent) and the rules' timing constants.
//! - this module: the state and its handlers, the end of a batch ([`AgentCore::end_batch`]),
//!   sampling, deadlines and garbage collection.
//! - `disk`: disk limits: which sandboxes to measure when (`--disk-watch-interval`), and the
//!   kill of a task past its `disk` (`FAILED`, reason `disk-limit`).
//! - `health`: GPU faults, recovery checks and operator clears, and the updates they send.
//! - `mps`: which GPU's MPS control daemon to start when (restart back-off).
//! - `pool`: the pool of prepared task cgroups (`--cgroup-pool`).
//! - `ports`: the port range (`--ports`) and the host ports assigned to tasks asking
//!   `ports:K` (`PORT`, `PORT0`.., `GANTRY_PORTS`).
//! - `recovery`: re-adopting checkpointed tasks after a restart from what the runtime probed,
//!   and watching them (probes of their supervisors; no exit record after 1 s).
//! - `watched`: the index of tasks with a limit a deadline watches (a disk limit, a GPU
//!   fraction), so `next_deadline` does not scan every task.
//! - `types`: the core's own types (task records, the checkpoint, log records, launches, exit
//!   statuses, limits), which the I/O modules store, fill in and apply.
//! - `tests`: lifecycle, kill escalation, recovery, GPU health, disk limits, the batching
//!   decision and the deadlines with simulated time, without processes.

mod disk;
pub mod groups;
mod health;
mod io;
mod kill;
pub mod mps;
pub mod pool;
pub mod ports;
mod recovery;
mod tasks;
#[cfg(test)]
mod tests;
pub mod types;
mod watched;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gantry_proto::codec;
use gantry_proto::resources::MILLI;
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

    fn connected(&mut self) {
        self.connected = true;
        self.registered = false;
        let running_tasks = self
            .ckpt
            .tasks
            .values()
            .map(|t| RunningTask {
                framework_id: t.framework_id,
                task: t.info.clone(),
                state: t.state,
                gpus: t.gpus.clone(),
                ports: t.ports.clone(),
            })
            .collect();
        let (register, left_out) = fit_register(AgentToMaster::Register {
            agent_id: self.ckpt.agent_id,
            hostname: self.config.hostname.clone(),
            resources: self.advertised_resources(),
            reserved: self.config.reserved.clone(),
            attributes: self.config.attributes.clone(),
            gpus: self.gpu_infos(),
            running_tasks,
            pending_updates: self.ckpt.updates.in_window(),
            task_user: self.config.task_user.clone(),
        });
        self.updates_left_out = left_out;
        self.send(register);
    }

    fn master_message(&mut self, msg: MasterToAgent, now: u64) {
        match msg {
            MasterToAgent::Registered {
                agent_id,
                heartbeat_interval_ms,
                ..
            } => {
                if self.ckpt.agent_id != Some(agent_id) {
                    self.ckpt.agent_id = Some(agent_id);
                    self.persist(Record::AgentId(agent_id));
                }
                self.registered = true;
                // A new master (or a new session) hears the termination notice again.
                self.notice_sent = None;
                if !self.accepted {
                    self.accepted = true;
                    self.emit(Effect::CleanupCgroups);
                }
                self.heartbeat_every = heartbeat_interval_ms.clamp(100, 60_000);
                if std::mem::take(&mut self.updates_left_out) {
                    // Not in the registration: send them now, one by one.
                    self.ckpt.updates.reset_connection();
                    self.flush_updates(now);
                } else {
                    self.ckpt.updates.mark_all_sent(now);
                }
                tracing::info!(%agent_id, "registered with the master");
            }
            MasterToAgent::RunTask {
                framework_id,
                task,
                gpus,
            } => self.run_task(framework_id, task, &gpus, &BTreeSet::new(), now),
            MasterToAgent::RunTaskGroup {
                framework_id,
                group_id,
                policy,
                members,
            } => self.run_group(
                framework_id,
                group_id,
                policy,
                members,
                &BTreeSet::new(),
                now,
            ),
            MasterToAgent::KillTask {
                framework_id,
                task_id,
            } => self.kill(framework_id, task_id, now),
            MasterToAgent::Acknowledge { task_id, update_id } => {
                tracing::debug!(task = %task_id, "status update acknowledged");
                if self.ckpt.updates.ack(task_id, update_id, now) {
                    self.persist(Record::Acked {
                        task: task_id,
                        update: update_id,
                    });
                    let done = self
                        .ckpt
                        .tasks
                        .get(&task_id)
                        .is_some_and(|t| t.state.is_terminal())
                        && !self.ckpt.updates.has_pending(task_id);
                    if done {
                        self.ckpt.tasks.remove(&task_id);
                        self.watched.remove(&task_id);
                        self.dirty.insert(task_id);
                        self.gc_queue.push_back(gc::Ended {
                            task: task_id,
                            at_ms: now,
                        });
                    }
                }
            }
            MasterToAgent::Error { message } => {
                // A refusal (a name in use by another agent, an id of another agent, invalid
                // reservations): retrying cannot help, so stop (non-zero) instead of flapping.
                tracing::error!("the master refused this agent: {message}");
                self.emit(Effect::Stop(format!(
                    "the master refused this agent: {message}"
                )));
            }
            MasterToAgent::ClearGpu { uuid } => match self.health.clear(&uuid) {
                Some(change) => {
                    tracing::info!(gpu = %uuid, "GPU cleared by an operator through the master");
                    self.health_changed(change, now);
                }
                None => {
                    tracing::warn!(gpu = %uuid, "clear request for a GPU that is not unhealthy (or unknown)")
                }
            },
        }
    }

    fn run_task(
        &mut self,
        framework_id: FrameworkId,
        task: TaskInfo,
        gpus: &[String],
        unbindable_ports: &BTreeSet<u16>,
        now: u64,
    ) {
        if self.ckpt.tasks.contains_key(&task.task_id) {
            tracing::warn!(task = %task.task_id, "duplicate launch ignored");
            return;
        }
        self.launch(framework_id, task, gpus, unbindable_ports, now);
    }

    fn tick(&mut self, now: u64) {
        self.escalate_kills(now);
        let idle = self.pool.trim(now);
        if !idle.is_empty() {
            self.emit(Effect::RemoveCgroups(idle));
        }
        self.adopted.retain(|id| {
            self.ckpt
                .tasks
                .get(id)
                .is_some_and(|t| !t.state.is_terminal())
        });
        if self.registered && now.saturating_sub(self.last_heartbeat) >= self.heartbeat_every {
            self.last_heartbeat = now;
            self.send(AgentToMaster::Heartbeat);
        }
        self.sample_if_due(now);
        self.measure_disk_if_due(now);
        self.recovery_checks_due(now);
        self.collect_garbage(now);
        self.probe_adopted_if_due(now);
        self.poll_files_if_due(now);
        self.mps_ensure(now);
        self.flush_updates(now);
    }

    /// Every [`FILE_POLL_MS`]: the termination notice (while registered: it is told to the
    /// master) and, on a GPU agent, the operator's clear requests.
    fn poll_files_if_due(&mut self, now: u64) {
        if self.registered && now.saturating_sub(self.last_notice_poll) >= FILE_POLL_MS {
            self.last_notice_poll = now;
            self.emit(Effect::ReadTerminationNotice);
        }
        if self.config.gpu_agent && now.saturating_sub(self.last_clear_poll) >= FILE_POLL_MS {
            self.last_clear_poll = now;
            self.emit(Effect::ReadClearRequests);
        }
    }

    /// The earliest time (Unix ms) at which [`Input::Tick`] has something to do, if any: the
    /// runtime sleeps until then or the next input, whichever comes first. A time at or before
    /// `now` means at once. Every timed rule of the core has its term here (the tests check
    /// that a tick before the deadline does nothing and one at it moves the deadline on).
    pub fn next_deadline(&self, now: u64) -> Option<u64> {
        let mut at: Option<u64> = None;
        let mut due = |t: Option<u64>| {
            if let Some(t) = t {
                at = Some(at.map_or(t, |a| a.min(t)));
            }
        };
        if self.registered {
            due(Some(self.last_heartbeat + self.heartbeat_every));
            due(Some(self.last_notice_poll + FILE_POLL_MS));
            if !self.sampling {
                due(Some(
                    self.last_sample + self.config.usage_interval.as_millis() as u64,
                ));
            }
            if self.connected {
                due(self.ckpt.updates.next_due(now));
            }
        }
        if self.config.gpu_agent {
            due(Some(self.last_clear_poll + FILE_POLL_MS));
            due(self
                .health
                .next_recovery(|u| self.checking.contains(u))
                .map(|i| {
                    self.epoch_ms + i.saturating_duration_since(self.epoch).as_millis() as u64
                }));
        }
        due(self.kill_deadline());
        due(self.pool.next_deadline());
        due(self.disk_deadline());
        if !self.gc_busy {
            let next = self
                .config
                .gc
                .next_due(&self.gc_queue, self.disk_used)
                .map(|t| t.max(self.last_gc + 1000));
            due(Some(next.map_or(self.last_gc + 5000, |t| {
                t.min(self.last_gc + 5000)
            })));
        }
        if !self.probing_adopted && !self.adopted_live().is_empty() {
            due(Some(self.last_adopted_probe + ADOPTED_PROBE_MS));
        }
        due(self.mps_deadline(now));
        at
    }

    /// Sandboxes due for collection ([`gc`]), at most one pass a second; a pass with nothing
    /// to remove still measures the disk every few seconds.
    fn collect_garbage(&mut self, now: u64) {
        let since = now.saturating_sub(self.last_gc);
        if self.gc_busy || since < 1000 {
            return;
        }
        let mut due = self.config.gc.due(&mut self.gc_queue, now, self.disk_used);
        // A task id launched again meanwhile owns its directories.
        due.retain(|t| !self.ckpt.tasks.contains_key(t));
        if due.is_empty() && since < 5000 {
            return;
        }
        self.gc_busy = true;
        self.last_gc = now;
        self.emit(Effect::CollectGarbage(due));
    }

    /// Every `--usage-interval`: sample GPUs and task cgroups.
    fn sample_if_due(&mut self, now: u64) {
        if self.sampling
            || !self.registered
            || now.saturating_sub(self.last_sample) < self.config.usage_interval.as_millis() as u64
        {
            return;
        }
        let snapshot: Vec<(TaskId, i32, Vec<String>)> = self
            .ckpt
            .tasks
            .iter()
            .filter(|(id, t)| !t.state.is_terminal() && !self.settling.contains(id))
            .filter_map(|(id, t)| Some((*id, t.launched?.task_pgid, t.gpus.clone())))
            .collect();
        if snapshot.is_empty() && !self.config.gpu_agent {
            self.last_sample = now;
            // Nothing to sample: /metrics drops the tasks that ended.
            self.emit(Effect::PublishMetrics(Vec::new()));
            return;
        }
        self.sampling = true;
        self.emit(Effect::Sample(snapshot));
    }

    fn sampled(&mut self, tasks: Vec<(TaskId, TaskUsage)>, gpus: Vec<GpuSample>, now: u64) {
        self.sampling = false;
        self.last_sample = now;
        // Tasks that ended while sampling ran are not reported.
        let tasks: Vec<(TaskId, TaskUsage)> = tasks
            .into_iter()
            .filter(|(id, _)| {
                self.ckpt
                    .tasks
                    .get(id)
                    .is_some_and(|t| !t.state.is_terminal())
            })
            .collect();
        let tasks = self.gpu_memory_check(tasks, now);
        self.last_gpu_samples = gpus.clone();
        self.emit(Effect::PublishMetrics(tasks.clone()));
        if !tasks.is_empty() || !gpus.is_empty() {
            // Many tasks: as many messages as the frame limit needs.
            let split = codec::split_batches(tasks, |tasks| AgentToMaster::Usage {
                tasks,
                gpus: gpus.clone(),
            });
            if !split.oversized.is_empty() {
                tracing::warn!(
                    n = split.oversized.len(),
                    "usage samples too large to send; dropped"
                );
            }
            for msg in split.batches {
                self.send_registered(msg);
            }
        }
    }

    fn flush_updates(&mut self, now: u64) {
        if !self.registered || !self.connected {
            self.final_usage.clear();
            return;
        }
        if !self.final_usage.is_empty() {
            let tasks = std::mem::take(&mut self.final_usage);
            let gpus = self.last_gpu_samples.clone();
            self.send(AgentToMaster::Usage { tasks, gpus });
        }
        for u in self.ckpt.updates.due(now) {
            tracing::debug!(task = %u.task_id, state = %u.state, "status update sent");
            self.send(AgentToMaster::StatusUpdate(u));
        }
    }

    fn inventory(&self) -> &[DiscoveredGpu] {
        &self.config.inventory
    }

    /// What to advertise: `gpus` counts the healthy GPUs only.
    fn advertised_resources(&self) -> Resources {
        let mut r = self.config.resources.clone();
        let base = r.milli("gpus");
        if base > 0 {
            let unhealthy = self
                .inventory()
                .iter()
                .filter(|g| !self.health.is_healthy(&g.info.uuid))
                .count() as u64;
            r.set_milli("gpus", base.saturating_sub(unhealthy * MILLI));
        }
        r
    }

    fn gpu_infos(&self) -> Vec<GpuInfo> {
        self.inventory()
            .iter()
            .map(|g| GpuInfo {
                healthy: self.health.is_healthy(&g.info.uuid),
                ..g.info.clone()
            })
            .collect()
    }
}

/// Makes a `Register` fit in one frame: first without its pending updates (they are sent one
/// by one after registering; returns true then), then, for thousands of tasks with long
/// commands, without the tasks' commands and environments (the master needs their ids and
/// resources to adopt them). Logs what it left out.
pub(crate) fn fit_register(mut msg: AgentToMaster) -> (AgentToMaster, bool) {
    let fits = |m: &AgentToMaster| codec::encoded_len(m).is_ok_and(|n| n <= codec::MAX_FRAME);
    if fits(&msg) {
        return (msg, false);
    }
    let AgentToMaster::Register {
        running_tasks,
        pending_updates,
        ..
    } = &mut msg
    else {
        return (msg, false);
    };
    tracing::warn!(
        updates = pending_updates.len(),
        "registration too large for one frame; pending status updates follow it one by one"
    );
    let left_out = !pending_updates.is_empty();
    pending_updates.clear();
    let tasks = running_tasks.len();
    if fits(&msg) {
        return (msg, left_out);
    }
    tracing::warn!(
        tasks,
        "registration still too large; reporting the tasks without their commands and environments"
    );
    if let AgentToMaster::Register { running_tasks, .. } = &mut msg {
        for t in running_tasks {
            // The program goes; the user stays (the master shows who the task runs as).
            t.task.command.program = Program::Shell(String::new());
            t.task.env.clear();
        }
    }
    (msg, left_out)
}
