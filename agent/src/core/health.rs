//! GPU health in the core: faults (fanned out to MIG devices), recovery checks, operator
//! clears; each change is persisted, told to the master and to the tasks holding the GPU.

use gantry_proto::*;

use super::Record;
use super::{AgentCore, Effect};
use crate::gpu::{self, GpuFault, HealthChange};

impl AgentCore {
    pub(super) fn gpu_fault(&mut self, fault: GpuFault, now: u64) {
        // A GPU in MIG mode: the fault is its MIG devices' (what is offered).
        let faults = gpu::share::mig_fan_out(fault, self.inventory().iter().map(|g| &g.info));
        let at = self.instant(now);
        for fault in faults {
            if let Some(change) = self.health.on_fault(&fault, at) {
                self.health_changed(change, now);
            }
        }
    }

    pub(super) fn recovery_checked(&mut self, uuid: String, passed: bool, now: u64) {
        self.checking.remove(&uuid);
        if !passed {
            tracing::warn!(gpu = %uuid, "GPU recovery check failed; it stays unhealthy");
        }
        let at = self.instant(now);
        if let Some(change) = self.health.recovery_checked(&uuid, passed, at) {
            self.health_changed(change, now);
        }
    }

    /// Recovery checks that are due (one at a time per GPU).
    pub(super) fn recovery_checks_due(&mut self, now: u64) {
        if !self.config.gpu_agent {
            return;
        }
        for uuid in self.health.recovery_due(self.instant(now)) {
            if self.checking.insert(uuid.clone()) {
                self.emit(Effect::CheckRecovery(uuid));
            }
        }
    }

    /// Operator clear requests: GPU uuids, or `all` for every unhealthy GPU.
    pub(super) fn clear_gpus(&mut self, names: Vec<String>, now: u64) {
        for name in names {
            let targets: Vec<String> = if name == "all" {
                self.health
                    .unhealthy()
                    .map(|(u, _)| u.to_string())
                    .collect()
            } else {
                vec![name]
            };
            for uuid in targets {
                match self.health.clear(&uuid) {
                    Some(change) => self.health_changed(change, now),
                    None => {
                        tracing::warn!(gpu = %uuid, "clear request for a GPU that is not unhealthy (or unknown)")
                    }
                }
            }
        }
    }

    /// A GPU became unhealthy or healthy again: persist it, tell the master (which withdraws
    /// or restores it in offers) and tell the tasks holding it (they keep running).
    pub(super) fn health_changed(&mut self, change: HealthChange, now: u64) {
        let minor = self
            .inventory()
            .iter()
            .find(|g| g.info.uuid == change.uuid)
            .map(|g| g.info.minor);
        if change.healthy {
            tracing::info!(gpu = %change.uuid, reason = %change.reason, "GPU healthy again");
            self.ckpt.unhealthy_gpus.remove(&change.uuid);
            self.persist(Record::GpuHealthy {
                uuid: change.uuid.clone(),
            });
        } else {
            tracing::warn!(gpu = %change.uuid, reason = %change.reason, "GPU unhealthy: withdrawn from offers");
            self.ckpt
                .unhealthy_gpus
                .insert(change.uuid.clone(), change.reason.clone());
            self.persist(Record::GpuUnhealthy {
                uuid: change.uuid.clone(),
                reason: change.reason.clone(),
            });
        }
        self.send_registered(AgentToMaster::GpuHealth {
            uuid: change.uuid.clone(),
            healthy: change.healthy,
            reason: change.reason.clone(),
        });
        let holders: Vec<(TaskId, TaskState)> = self
            .ckpt
            .tasks
            .iter()
            .filter(|(_, t)| !t.state.is_terminal() && t.gpus.contains(&change.uuid))
            .map(|(id, t)| (*id, t.state))
            .collect();
        let node = minor
            .map(|m| format!(" (/dev/nvidia{m})"))
            .unwrap_or_default();
        for (id, state) in holders {
            let message = if change.healthy {
                format!(
                    "GPU {}{node} is healthy again: {}",
                    change.uuid, change.reason
                )
            } else {
                format!(
                    "GPU {}{node} failed: {}; it is withdrawn from offers (the task keeps running)",
                    change.uuid, change.reason
                )
            };
            self.update(
                id,
                state,
                Some(TaskReason::GpuHealth),
                message,
                None,
                None,
                now,
            );
        }
    }
}
