//! Task lifecycle in the core: launch plans, settlement into a terminal state, status updates,
//! GPU-memory shares. Kills and their escalation are in `kill`.

use gantry_proto::resources::MILLI;
use gantry_proto::*;

use super::Limits;
use super::{AgentCore, CgroupOutcome, Effect, GpuShare, LaunchPlan};
use super::{ExitStatus, Launched, Record, TaskRecord};
use crate::executor;
use crate::gpu::{self, GpuSlot};
use crate::isolation::DeviceRule;

/// A task admitted by [`AgentCore::admit`], to be started by [`AgentCore::start`].
pub(super) struct Admitted {
    framework_id: FrameworkId,
    pub(super) task: TaskInfo,
    sandbox: std::path::PathBuf,
    meta: std::path::PathBuf,
    cgroup_name: String,
    user: Option<String>,
    chosen: Vec<GpuInfo>,
    pub(super) ports: Vec<u16>,
}

impl AgentCore {
    /// Milli-GPUs held per GPU by the tasks that are not terminal (fractions add up).
    fn gpu_occupancy(&self) -> std::collections::BTreeMap<&str, u32> {
        gpu::share::occupancy(
            self.ckpt
                .tasks
                .values()
                .filter(|t| !t.state.is_terminal())
                .map(|t| (t.info.resources.milli("gpus"), t.gpus.as_slice())),
        )
    }

    /// Assignment view of the GPUs: a GPU is free when no live task holds any share of it.
    fn gpu_slots(&self) -> Vec<GpuSlot> {
        let held = self.gpu_occupancy();
        self.inventory()
            .iter()
            .map(|g| GpuSlot {
                numa_node: g.info.numa_node,
                pci_root: g.info.pci_root.clone(),
                healthy: self.health.is_healthy(&g.info.uuid),
                free: !held.contains_key(g.info.uuid.as_str()),
            })
            .collect()
    }

    /// Picks GPUs for a task asking for `gpus` (milli-units): below one, a GPU with room for
    /// the fraction; else whole idle GPUs, topology-aware. `preferred`, the master's choice,
    /// wins when it still fits. `Err` says why it cannot run.
    fn pick_gpus(
        &self,
        gpus_milli: u64,
        selector: Option<&GpuSelector>,
        preferred: &[String],
    ) -> Result<Vec<usize>, String> {
        let amount = GpuAmount::from_milli(gpus_milli).map_err(|e| e.to_string())?;
        let k = match amount {
            GpuAmount::None => return Ok(Vec::new()),
            GpuAmount::Whole(k) => k as usize,
            GpuAmount::Fraction(m) => {
                let held = self.gpu_occupancy();
                let free: Vec<Option<u32>> = self
                    .inventory()
                    .iter()
                    .map(|g| {
                        let ok = self.health.is_healthy(&g.info.uuid)
                            && GpuSelector::admits(selector, &g.info);
                        ok.then(|| {
                            gpu::share::GPU_MILLI.saturating_sub(
                                held.get(g.info.uuid.as_str()).copied().unwrap_or(0),
                            )
                        })
                    })
                    .collect();
                let want = preferred
                    .first()
                    .and_then(|u| self.inventory().iter().position(|g| &g.info.uuid == u));
                return gpu::share::pick_fraction(&free, m, want)
                    .map(|i| vec![i])
                    .ok_or_else(|| {
                        format!("the task asks for {m} milli-GPUs of one GPU but no healthy GPU{} on this agent has that much free", if selector.is_some() { " matching its selector" } else { "" })
                    });
            }
        };
        let mut slots = self.gpu_slots();
        // GPUs that do not match the task's selector (MIG devices unless it names their
        // profile) are not candidates.
        for (slot, g) in slots.iter_mut().zip(self.inventory()) {
            slot.free &= GpuSelector::admits(selector, &g.info);
        }
        // The master's choice (the same topology rule, over its view of the agent) when every
        // GPU of it is still a candidate; else our own.
        let wanted: Option<Vec<usize>> = preferred
            .iter()
            .map(|u| self.inventory().iter().position(|g| &g.info.uuid == u))
            .collect();
        if let Some(mut wanted) = wanted.filter(|w| w.len() == k) {
            wanted.sort_unstable();
            wanted.dedup();
            if wanted.len() == k
                && wanted
                    .iter()
                    .all(|&i| slots.get(i).is_some_and(|s| s.free && s.healthy))
            {
                return Ok(wanted);
            }
        }
        gpu::assign(&slots, k).ok_or_else(|| {
            let free = slots.iter().filter(|s| s.free && s.healthy).count();
            let matching = if selector.is_some() { " matching its selector" } else { "" };
            format!("the task asks for {k} GPUs but only {free} healthy GPUs{matching} are free on this agent")
        })
    }

    /// The user a task runs as (its command's, else `--task-user`): `Some(name)` to switch to
    /// (looked up at launch, off the event loop), `None` when the agent is not root and runs
    /// the task as itself. `Err` says why it cannot run.
    fn task_user(&self, command: &CommandInfo) -> Result<Option<String>, String> {
        let name = command.user.as_deref().unwrap_or(&self.config.task_user);
        if self.config.root {
            return Ok(Some(name.to_string()));
        }
        if name != self.config.task_user {
            return Err(format!(
                "the agent runs as {}, not root, and cannot run tasks as user {name:?}",
                self.config.task_user
            ));
        }
        Ok(None)
    }

    pub(super) fn launch(
        &mut self,
        framework_id: FrameworkId,
        task: TaskInfo,
        master_gpus: &[String],
        unbindable_ports: &std::collections::BTreeSet<u16>,
        now: u64,
    ) {
        let id = task.task_id;
        match self.admit(framework_id, task, master_gpus, unbindable_ports, None, now) {
            Ok(admitted) => self.start(admitted, Default::default(), now),
            Err((reason, why)) => {
                self.terminal(id, TaskState::Failed, Some(reason), why, None, None, now)
            }
        }
    }

    /// The first half of a launch: the task's GPUs, ports and user are chosen and its record
    /// (with its group, if any) is checkpointed in `STAGING`. `Err` says why it cannot start
    /// (its record stays, for the terminal update).
    pub(super) fn admit(
        &mut self,
        framework_id: FrameworkId,
        task: TaskInfo,
        master_gpus: &[String],
        unbindable_ports: &std::collections::BTreeSet<u16>,
        group: Option<super::groups::GroupTag>,
        now: u64,
    ) -> Result<Admitted, (TaskReason, String)> {
        let id = task.task_id;
        let sandbox = self.config.work_dir.join("sandboxes").join(id.to_string());
        let meta = self.config.work_dir.join("meta").join(id.to_string());
        let picked = self.pick_gpus(
            task.resources.milli("gpus"),
            task.gpu_selector.as_ref(),
            master_gpus,
        );
        let chosen: Vec<GpuInfo> = picked
            .as_deref()
            .unwrap_or(&[])
            .iter()
            .filter_map(|&i| self.inventory().get(i).map(|g| g.info.clone()))
            .collect();
        let uuids: Vec<String> = chosen.iter().map(|g| g.uuid.clone()).collect();
        let ports = super::ports::wanted(task.resources.milli("ports")).and_then(|k| {
            super::ports::assign(self.config.ports, &self.held_ports(), unbindable_ports, k)
        });
        // A prepared cgroup from the pool (or a new pool name), else one named after the task.
        let cgroup_name = self
            .config
            .isolated
            .then(|| self.pool.take(now))
            .flatten()
            .unwrap_or_else(|| id.to_string());
        // Checkpointed before the cgroup exists: a restarted agent knows all it may have made.
        self.ckpt.tasks.insert(
            id,
            TaskRecord {
                framework_id,
                info: task.clone(),
                state: TaskState::Staging,
                sandbox: sandbox.clone(),
                meta: meta.clone(),
                launched: None,
                gpus: uuids.clone(),
                kill_requested_ms: None,
                cgroup: self.config.isolated.then(|| cgroup_name.clone()),
                gpu_memory_kill: None,
                disk_kill: None,
                ports: ports.clone().unwrap_or_default(),
                group,
            },
        );
        if let Some(rec) = self.ckpt.tasks.get(&id) {
            self.watched.add(id, rec);
        }
        self.dirty.insert(id);
        let user = picked
            .map_err(|why| (TaskReason::LaunchFailed, why))
            .and_then(|_| {
                ports
                    .clone()
                    .map_err(|why| (TaskReason::PortUnavailable, why))
            })
            .and_then(|_| {
                self.task_user(&task.command)
                    .map_err(|why| (TaskReason::LaunchFailed, why))
            })?;
        Ok(Admitted {
            framework_id,
            task,
            sandbox,
            meta,
            cgroup_name,
            user,
            chosen,
            ports: ports.unwrap_or_default(),
        })
    }

    /// The second half of a launch: `STARTING`, the environment (with `extra_env`, a group's)
    /// and limits, and the launch itself.
    pub(super) fn start(
        &mut self,
        admitted: Admitted,
        extra_env: std::collections::BTreeMap<String, String>,
        now: u64,
    ) {
        let Admitted {
            framework_id,
            task,
            sandbox,
            meta,
            cgroup_name,
            user,
            chosen,
            ports,
        } = admitted;
        let id = task.task_id;
        let uuids: Vec<String> = chosen.iter().map(|g| g.uuid.clone()).collect();
        let minors: Vec<u32> = chosen.iter().map(|g| g.minor).collect();
        if !uuids.is_empty() {
            tracing::info!(task = %id, gpus = ?uuids, "assigned GPUs");
        }
        if !ports.is_empty() {
            tracing::info!(task = %id, ?ports, "assigned ports");
        }
        self.update(
            id,
            TaskState::Starting,
            None,
            "starting".into(),
            None,
            None,
            now,
        );
        let mut env = task.env.clone();
        env.extend(extra_env);
        env.insert("GANTRY_TASK_ID".into(), id.to_string());
        env.insert("GANTRY_FRAMEWORK_ID".into(), framework_id.to_string());
        env.extend(super::ports::env(&ports));
        let mut share = None;
        if self.config.gpu_agent {
            for (k, v) in gpu::visible_devices_env(&uuids) {
                env.insert(k.to_string(), v);
            }
            if let (Some(g), Ok(GpuAmount::Fraction(_))) =
                (chosen.first(), task.resources.gpu_amount())
            {
                share = Some(GpuShare {
                    uuid: g.uuid.clone(),
                    gpus_milli: task.resources.milli("gpus"),
                    memory_mib: g.memory_mib,
                });
            }
        }
        if share.is_some() {
            // Its GPU's MPS daemon starts before the task does.
            self.mps_ensure(now);
        }
        let mem_milli = task.resources.milli("mem");
        let limits = Limits {
            cpus: task.resources.get("cpus").max(0.01),
            mem_mib: (mem_milli > 0).then(|| mem_milli.div_ceil(MILLI)),
            pids_max: self.config.task_pids_max,
            cpu_hard_limit: self.config.cpu_hard_limit,
            devices: Some(DeviceRule::for_task(&minors, &self.config.nvidia_majors)),
        };
        self.emit(Effect::Launch(Box::new(LaunchPlan {
            framework_id,
            task,
            sandbox,
            meta,
            cgroup_name,
            limits,
            env,
            user,
            share,
        })));
    }

    pub(super) fn launched(&mut self, task: TaskId, result: Result<Launched, String>, now: u64) {
        let Some(rec) = self.ckpt.tasks.get_mut(&task) else {
            self.emit(Effect::DestroyCgroup(task));
            return;
        };
        match result {
            Ok(l) => {
                // (In memory: the launch record holds it, and the log only the state.)
                rec.launched = Some(l);
                let kill = rec.kill_requested_ms.is_some();
                self.update(
                    task,
                    TaskState::Running,
                    None,
                    "running".into(),
                    None,
                    None,
                    now,
                );
                if kill {
                    self.emit(Effect::Signal {
                        pgid: l.task_pgid,
                        signal: libc::SIGTERM,
                    });
                }
            }
            Err(e) => {
                // The container module marks errors getting the task's image.
                let (reason, message) = match e.strip_prefix(crate::container::IMAGE_ERROR_PREFIX) {
                    Some(rest) => (TaskReason::ImagePullFailed, rest.to_string()),
                    None => (TaskReason::LaunchFailed, format!("could not launch: {e}")),
                };
                self.terminal(
                    task,
                    TaskState::Failed,
                    Some(reason),
                    message,
                    None,
                    None,
                    now,
                )
            }
        }
    }

    /// A progress line of a starting task (its image pull), as a `STARTING` update.
    pub(super) fn launch_progress(&mut self, task: TaskId, mut message: String, now: u64) {
        let starting = self
            .ckpt
            .tasks
            .get(&task)
            .is_some_and(|r| r.state == TaskState::Starting);
        if !starting {
            return;
        }
        if message.len() > 1024 {
            let mut cut = 1024;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        self.update(task, TaskState::Starting, None, message, None, None, now);
    }

    pub(super) fn exited(
        &mut self,
        task: TaskId,
        status: ExitStatus,
        outcome: Option<CgroupOutcome>,
        now: u64,
    ) {
        let Some(rec) = self.ckpt.tasks.get(&task) else {
            return;
        };
        if rec.state.is_terminal() || self.settling.contains(&task) {
            return;
        }
        // A task without a cgroup (`--isolation none`) has no outcome to read: it is settled
        // at once, in the same batch as its exit (no round trip through a blocking thread).
        let Some(name) = rec.cgroup.clone() else {
            self.settled(task, status, CgroupOutcome::default(), now);
            return;
        };
        let recycle = self.pool.recycle(&name);
        // Its cgroup's outcome read with the exit: settled in this batch too, the cgroup
        // released once the terminal record is synced (before that, a restarted agent still
        // finds the counters in the cgroup).
        if let Some(outcome) = outcome {
            self.emit(Effect::ReleaseCgroup {
                task,
                cgroup: name,
                recycle,
            });
            self.settled(task, status, outcome, now);
            return;
        }
        self.settling.insert(task);
        let effect = Effect::Settle {
            task,
            status,
            meta: rec.meta_dir().to_path_buf(),
            cgroup: rec.cgroup.clone(),
            recycle,
        };
        self.emit(effect);
    }

    pub(super) fn settled(
        &mut self,
        task: TaskId,
        status: ExitStatus,
        outcome: CgroupOutcome,
        now: u64,
    ) {
        self.settling.remove(&task);
        self.escalated.remove(&task);
        self.group_killed.remove(&task);
        let Some(rec) = self.ckpt.tasks.get(&task) else {
            return;
        };
        if rec.state.is_terminal() {
            return;
        }
        let killed = rec.kill_requested_ms.is_some();
        let msg = executor::describe(&status);
        let (state, reason, msg) = if let Some(why) = rec.gpu_memory_kill.clone() {
            (
                TaskState::Failed,
                Some(TaskReason::GpuMemory),
                format!("{why} ({msg})"),
            )
        } else if let Some(why) = rec.disk_kill.clone() {
            (
                TaskState::Failed,
                Some(TaskReason::DiskLimit),
                format!("{why} ({msg})"),
            )
        } else if let Some(why) = rec.group.as_ref().and_then(|g| g.killed_because.clone()) {
            (
                TaskState::Killed,
                Some(TaskReason::KilledByRequest),
                format!("killed: {why} ({msg})"),
            )
        } else if killed {
            (
                TaskState::Killed,
                Some(TaskReason::KilledByRequest),
                format!("killed: {msg}"),
            )
        } else if outcome.oom_killed {
            (
                TaskState::Failed,
                Some(TaskReason::MemoryLimit),
                format!(
                    "memory-limit: the task exceeded its memory limit of {} MiB and was killed by the kernel's OOM killer ({msg})",
                    rec.info.resources.get("mem")
                ),
            )
        } else if status.code == Some(0) {
            (TaskState::Finished, None, msg)
        } else {
            (TaskState::Failed, Some(TaskReason::CommandFailed), msg)
        };
        // Final usages of the tasks settled in one batch go out as one message, before any
        // status update (flush_updates).
        if let Some(u) = outcome.usage {
            if self.registered {
                self.final_usage.push((task, u));
            }
        }
        self.terminal(task, state, reason, msg, status.code, status.signal, now);
    }

    /// Sets each sampled task's GPU-memory share and acts on tasks above it: a non-terminal
    /// update (reason `gpu-memory`) once per excursion and, with `--gpu-memory-enforce kill`,
    /// the kill (the task ends `FAILED`, reason `gpu-memory`).
    pub(super) fn gpu_memory_check(
        &mut self,
        mut tasks: Vec<(TaskId, TaskUsage)>,
        now: u64,
    ) -> Vec<(TaskId, TaskUsage)> {
        let mut over = Vec::new();
        for (id, usage) in &mut tasks {
            let Some(rec) = self.ckpt.tasks.get(id) else {
                continue;
            };
            let held: Vec<&GpuInfo> = rec
                .gpus
                .iter()
                .filter_map(|u| self.inventory().iter().find(|g| &g.info.uuid == u))
                .map(|g| &g.info)
                .collect();
            usage.gpu_mem_share_bytes =
                gpu::share::memory_share_bytes(rec.info.resources.milli("gpus"), &held);
            let is_over =
                usage.gpu_mem_share_bytes > 0 && usage.gpu_mem_bytes > usage.gpu_mem_share_bytes;
            if !is_over {
                self.gpu_mem_over.remove(id);
            } else if self.gpu_mem_over.insert(*id) {
                over.push((
                    *id,
                    rec.framework_id,
                    rec.state,
                    usage.gpu_mem_bytes,
                    usage.gpu_mem_share_bytes,
                ));
            }
        }
        for (id, framework_id, state, used, share) in over {
            let mib = |b: u64| b / (1024 * 1024);
            let kill = self.config.gpu_memory_enforce == gpu::share::MemoryEnforce::Kill;
            let message = format!(
                "gpu-memory: the task uses {} MiB of GPU memory, above its share of {} MiB{}",
                mib(used),
                mib(share),
                if kill {
                    "; killed (--gpu-memory-enforce kill)"
                } else {
                    ""
                }
            );
            tracing::warn!(task = %id, "{message}");
            self.update(
                id,
                state,
                Some(TaskReason::GpuMemory),
                message.clone(),
                None,
                None,
                now,
            );
            if kill {
                if let Some(rec) = self.ckpt.tasks.get_mut(&id) {
                    rec.gpu_memory_kill = Some(message);
                }
                self.kill(framework_id, id, now);
            }
        }
        tasks
    }

    /// Queues an update for reliable delivery (recorded in the log).
    pub(super) fn push_update(&mut self, update: StatusUpdate) {
        self.persist(Record::Update(Box::new(update.clone())));
        self.ckpt.updates.push(update);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn make_update(
        &mut self,
        task: TaskId,
        framework: FrameworkId,
        state: TaskState,
        message: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
        now: u64,
    ) -> StatusUpdate {
        let update_id = UpdateId::from_u128(self.next_update_id);
        self.next_update_id = self.next_update_id.wrapping_add(1);
        StatusUpdate {
            update_id,
            task_id: task,
            framework_id: framework,
            agent_id: self.ckpt.agent_id,
            state,
            source: UpdateSource::Agent,
            reason: None,
            message,
            exit_code,
            signal,
            gpus: self
                .ckpt
                .tasks
                .get(&task)
                .map(|t| t.gpus.clone())
                .unwrap_or_default(),
            timestamp_ms: now,
            reconciliation: false,
            ports: self
                .ckpt
                .tasks
                .get(&task)
                .map(|t| t.ports.clone())
                .unwrap_or_default(),
        }
    }

    /// Records a state change and queues its update for reliable delivery (sent after the
    /// next commit: an update never reaches the master before the state it reports is on
    /// disk).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn update(
        &mut self,
        task: TaskId,
        state: TaskState,
        reason: Option<TaskReason>,
        message: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
        now: u64,
    ) {
        let Some(rec) = self.ckpt.tasks.get(&task) else {
            return;
        };
        let framework_id = rec.framework_id;
        let mut update =
            self.make_update(task, framework_id, state, message, exit_code, signal, now);
        update.reason = reason;
        if let Some(rec) = self.ckpt.tasks.get_mut(&task) {
            rec.state = state;
        }
        self.dirty.insert(task);
        self.push_update(update);
    }

    /// A terminal state: the task's GPUs and ports are free from now on (occupancy counts
    /// only tasks that are not terminal).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn terminal(
        &mut self,
        task: TaskId,
        state: TaskState,
        reason: Option<TaskReason>,
        message: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
        now: u64,
    ) {
        tracing::info!(%task, %state, %message, "task ended");
        self.emit(Effect::ForgetCgroup(task));
        self.update(task, state, reason, message, exit_code, signal, now);
        self.group_member_ended(task, state, now);
    }
}
