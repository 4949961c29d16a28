//! Recovery in the core: after a restart, the runtime probes the checkpointed tasks'
//! supervisors (alive, exited with a recorded status, or a launch found that the previous agent
//! did not record) and the core decides each task's fate.

use gantry_proto::*;

use super::{AdoptedProbe, AgentCore, Effect, ADOPTED_PROBE_MS, NO_EXIT_RECORD_MS};
use super::{ExitStatus, Launched};

/// What the runtime found on the host for the checkpointed tasks that are not terminal.
#[derive(Debug, Default)]
pub struct RecoveryProbe {
    /// The launches of the checkpointed tasks, read from their launch records (the log does
    /// not hold them): a task the previous agent saw start, or one it asked for and died
    /// before hearing from (its supervisor said where it is).
    pub found: Vec<(TaskId, Launched)>,
    /// Launched tasks whose supervisor is still alive.
    pub alive: Vec<TaskId>,
    /// Launched tasks whose supervisor is gone, with the exit status it recorded (if any).
    pub exited: Vec<(TaskId, Option<ExitStatus>)>,
}

impl AgentCore {
    /// Re-adopts checkpointed tasks: live supervisors are watched again (and their cgroups
    /// reopened); tasks whose supervisor is gone are settled from the exit status they
    /// recorded; tasks never launched failed with the previous agent. GPUs still unhealthy
    /// before the restart stay so.
    pub fn recover(&mut self, probe: RecoveryProbe, now: u64) -> Vec<Effect> {
        let at = self.instant(now);
        let known: Vec<String> = self
            .inventory()
            .iter()
            .map(|g| g.info.uuid.clone())
            .collect();
        let unhealthy: Vec<(String, String)> = self
            .ckpt
            .unhealthy_gpus
            .iter()
            .map(|(u, r)| (u.clone(), r.clone()))
            .collect();
        for (uuid, reason) in unhealthy {
            if known.contains(&uuid) {
                self.health.mark_unhealthy(&uuid, &reason, at);
                tracing::warn!(gpu = %uuid, %reason, "GPU still unhealthy from before the restart");
            }
        }
        for (id, l) in probe.found {
            let Some(rec) = self.ckpt.tasks.get_mut(&id) else {
                continue;
            };
            if rec.state.is_terminal() || rec.launched.is_some() {
                continue;
            }
            rec.launched = Some(l);
            if !matches!(rec.state, TaskState::Staging | TaskState::Starting) {
                // The previous agent saw it start (and said so): nothing new to report.
                continue;
            }
            tracing::info!(task = %id, pid = l.supervisor_pid, "found the supervisor of a launch the previous agent did not record");
            self.update(
                id,
                TaskState::Running,
                None,
                "running".into(),
                None,
                None,
                now,
            );
        }
        let alive: std::collections::HashSet<TaskId> = probe.alive.into_iter().collect();
        let exited: std::collections::HashMap<TaskId, Option<ExitStatus>> =
            probe.exited.into_iter().collect();
        let ids: Vec<TaskId> = self.ckpt.tasks.keys().copied().collect();
        let mut adopted = 0;
        for id in ids {
            let Some(rec) = self.ckpt.tasks.get(&id) else {
                continue;
            };
            if rec.state.is_terminal() {
                continue;
            }
            match rec.launched {
                Some(l) if alive.contains(&id) => {
                    adopted += 1;
                    self.adopted.insert(id);
                    tracing::info!(task = %id, pid = l.task_pgid, "re-adopted running task");
                    if let Some(name) = rec.cgroup.clone() {
                        self.emit(Effect::AdoptCgroup { task: id, name });
                    }
                }
                Some(_) => {
                    let status = exited.get(&id).copied().flatten().unwrap_or(ExitStatus {
                        code: None,
                        signal: None,
                    });
                    self.exited(id, status, None, now);
                }
                None => {
                    // Never started: the launch died with the previous agent (its cgroup, and
                    // anything that made it into it, is removed once a master accepts us).
                    self.terminal(
                        id,
                        TaskState::Failed,
                        Some(TaskReason::AgentRestarted),
                        "agent restarted before the task was launched".into(),
                        None,
                        None,
                        now,
                    );
                }
            }
        }
        if !self.ckpt.tasks.is_empty() {
            tracing::info!(
                tasks = self.ckpt.tasks.len(),
                adopted,
                "recovered checkpoint"
            );
        }
        std::mem::take(&mut self.fx)
    }
}

impl AgentCore {
    /// Every [`ADOPTED_PROBE_MS`] while re-adopted tasks live: probe their supervisors (they
    /// are not the agent's children, so nothing tells it when they end).
    pub(super) fn probe_adopted_if_due(&mut self, now: u64) {
        if self.probing_adopted || now.saturating_sub(self.last_adopted_probe) < ADOPTED_PROBE_MS {
            return;
        }
        let list: Vec<(TaskId, Launched, std::path::PathBuf)> = self
            .adopted_live()
            .into_iter()
            .filter_map(|(id, t)| Some((id, t.launched?, t.meta_dir().to_path_buf())))
            .collect();
        if list.is_empty() {
            return;
        }
        self.probing_adopted = true;
        self.emit(Effect::ProbeAdopted(list));
    }

    /// What the probe found: a task group read late, and supervisors gone. A supervisor gone
    /// without recording an exit ends its task with an unknown status once the agent has run
    /// [`NO_EXIT_RECORD_MS`].
    pub(super) fn adopted_probed(&mut self, probes: Vec<AdoptedProbe>, now: u64) {
        self.probing_adopted = false;
        self.last_adopted_probe = now;
        for p in probes {
            if !self.adopted.contains(&p.task) || self.settling.contains(&p.task) {
                continue;
            }
            let Some(rec) = self.ckpt.tasks.get_mut(&p.task) else {
                continue;
            };
            if rec.state.is_terminal() {
                continue;
            }
            if let (Some(pgid), Some(l)) = (p.pgid, rec.launched.as_mut()) {
                if l.task_pgid == 0 {
                    // (In memory only, as the rest of the launch: the record holds it.)
                    l.task_pgid = pgid;
                }
            }
            if !p.gone {
                continue;
            }
            let status = match p.recorded {
                Some(status) => status,
                None if now >= self.started_ms + NO_EXIT_RECORD_MS => {
                    tracing::warn!(task = %p.task, "the supervisor of a re-adopted task is gone without recording an exit");
                    ExitStatus {
                        code: None,
                        signal: None,
                    }
                }
                None => continue,
            };
            self.exited(p.task, status, None, now);
        }
    }
}
