//! The master session, from the core's side: the registration (with the running tasks and the
//! unacknowledged updates, fitted into one frame: [`fit_register`]), the master's messages
//! (registered, run a task or a group, kill, acknowledge, refuse, clear a GPU), the status
//! updates and final usages due to it, and what the agent advertises (healthy GPUs only).

use std::collections::BTreeSet;

use gantry_proto::codec;
use gantry_proto::resources::MILLI;
use gantry_proto::*;

use super::{AgentCore, Effect, Record};
use crate::discovery::DiscoveredGpu;
use crate::gc;

impl AgentCore {
    pub(super) fn connected(&mut self) {
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

    pub(super) fn master_message(&mut self, msg: MasterToAgent, now: u64) {
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

    pub(super) fn run_task(
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

    pub(super) fn flush_updates(&mut self, now: u64) {
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

    pub(super) fn inventory(&self) -> &[DiscoveredGpu] {
        &self.config.inventory
    }

    /// What to advertise: `gpus` counts the healthy GPUs only.
    pub(super) fn advertised_resources(&self) -> Resources {
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

    pub(super) fn gpu_infos(&self) -> Vec<GpuInfo> {
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
