//! Disk limits in the core (`--disk-enforcement du`): every `--disk-watch-interval` the
//! sandboxes of the running tasks that have a `disk` are measured off the loop
//! ([`Effect::MeasureDisk`], one pass at a time); a task whose reading is past its limit
//! ([`crate::disk::verdict`]) is killed like a kill request (SIGTERM, SIGKILL after the grace
//! period, the cgroup) and ends `FAILED` with reason `disk-limit` and the reading's message.
//! Tasks without `disk` are not limited.

use std::path::PathBuf;

use gantry_proto::*;

use super::TaskRecord;
use super::{AgentCore, Effect};
use crate::disk::{self, DiskEnforcement, DiskReading};

/// The task's disk limit in bytes (0: none).
fn limit_of(rec: &TaskRecord) -> u64 {
    disk::limit_bytes(rec.info.resources.milli("disk"))
}

/// Whether the task has a disk limit (fixed when it is accepted: the index [`super::Watched`]).
pub(super) fn limited(rec: &TaskRecord) -> bool {
    limit_of(rec) > 0
}

impl AgentCore {
    /// Whether the task's sandbox is watched: launched, not ended or being killed, with a
    /// `disk`.
    fn disk_watched(&self, id: &TaskId, rec: &TaskRecord) -> bool {
        !rec.state.is_terminal()
            && rec.launched.is_some()
            && rec.kill_requested_ms.is_none()
            && !self.settling.contains(id)
            && limit_of(rec) > 0
    }

    /// Every `--disk-watch-interval` (one pass at a time): measure the watched sandboxes.
    pub(super) fn measure_disk_if_due(&mut self, now: u64) {
        if self.config.disk_enforcement == DiskEnforcement::None
            || self.disk_measuring
            || now.saturating_sub(self.last_disk_pass)
                < self.config.disk_watch_interval.as_millis() as u64
        {
            return;
        }
        self.last_disk_pass = now;
        let tasks: Vec<(TaskId, PathBuf)> = self
            .disk_indexed()
            .filter(|(id, rec)| self.disk_watched(id, rec))
            .map(|(id, rec)| (*id, rec.sandbox.clone()))
            .collect();
        if tasks.is_empty() {
            return;
        }
        self.disk_measuring = true;
        self.emit(Effect::MeasureDisk(tasks));
    }

    /// When the next pass is due: only while a sandbox is watched and no pass runs.
    pub(super) fn disk_deadline(&self) -> Option<u64> {
        self.disk_deadline_of(self.disk_indexed())
    }

    /// [`AgentCore::disk_deadline`] by a scan of every task: what the index must agree with
    /// (property test `core/tests/disk.rs`).
    #[cfg(test)]
    pub(super) fn disk_deadline_scan(&self) -> Option<u64> {
        self.disk_deadline_of(self.ckpt.tasks.iter())
    }

    fn disk_deadline_of<'a>(
        &'a self,
        mut tasks: impl Iterator<Item = (&'a TaskId, &'a TaskRecord)>,
    ) -> Option<u64> {
        (self.config.disk_enforcement != DiskEnforcement::None
            && !self.disk_measuring
            && tasks.any(|(id, rec)| self.disk_watched(id, rec)))
        .then(|| self.last_disk_pass + self.config.disk_watch_interval.as_millis() as u64)
    }

    /// The tasks with a disk limit, from the index ([`super::Watched`]).
    fn disk_indexed(&self) -> impl Iterator<Item = (&TaskId, &TaskRecord)> {
        let tasks = &self.ckpt.tasks;
        self.watched
            .disk
            .iter()
            .filter_map(move |id| Some((id, tasks.get(id)?)))
    }

    /// A pass ended: kill the tasks past their limit.
    pub(super) fn disk_measured(&mut self, readings: Vec<(TaskId, DiskReading)>, now: u64) {
        self.disk_measuring = false;
        // The pass's duration does not shorten the pause before the next one.
        self.last_disk_pass = now;
        for (id, reading) in readings {
            let Some(rec) = self.ckpt.tasks.get(&id) else {
                continue;
            };
            // Ended or being killed while it was measured.
            if !self.disk_watched(&id, rec) {
                continue;
            }
            let Some(message) =
                disk::verdict(reading, limit_of(rec), rec.info.resources.get("disk"))
            else {
                continue;
            };
            let framework_id = rec.framework_id;
            tracing::warn!(task = %id, "{message}");
            if let Some(rec) = self.ckpt.tasks.get_mut(&id) {
                rec.disk_kill = Some(message);
            }
            self.kill(framework_id, id, now);
        }
    }
}
