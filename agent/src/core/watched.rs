//! The index of tasks with a limit that a deadline watches (a `disk` limit, a GPU fraction),
//! kept in step with the checkpoint's tasks so that `next_deadline` does not scan every task;
//! a property test (`core/tests/disk.rs`) holds it equal to a scan.

use std::collections::BTreeSet;

use gantry_proto::*;

use super::{disk, AgentCore, Checkpoint, TaskRecord};

/// Tasks with a limit that a deadline watches, by a property fixed when the task is accepted:
/// a `disk` limit (the disk pass, `core::disk`) and a fractional GPU (its MPS daemon, [`super::mps`]).
/// Kept in step with the checkpoint's tasks (added where a task is recorded, removed where it
/// is forgotten, rebuilt with the core), so `next_deadline` costs nothing per task while no
/// task has either; whether a task is still running is checked on the indexed ones only.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Watched {
    /// Tasks with a `disk` limit.
    pub(super) disk: BTreeSet<TaskId>,
    /// Tasks with a fraction of a GPU.
    pub(super) fractional: BTreeSet<TaskId>,
}

impl Watched {
    /// The index by a scan of the checkpoint.
    pub(super) fn of(ckpt: &Checkpoint) -> Watched {
        let mut w = Watched::default();
        for (id, rec) in &ckpt.tasks {
            w.add(*id, rec);
        }
        w
    }

    pub(super) fn fractional(rec: &TaskRecord) -> bool {
        matches!(rec.info.resources.gpu_amount(), Ok(GpuAmount::Fraction(_)))
    }

    /// A task recorded (again, under an id it may have had before).
    pub(super) fn add(&mut self, id: TaskId, rec: &TaskRecord) {
        self.remove(&id);
        if disk::limited(rec) {
            self.disk.insert(id);
        }
        if Self::fractional(rec) {
            self.fractional.insert(id);
        }
    }

    /// A task forgotten.
    pub(super) fn remove(&mut self, id: &TaskId) {
        self.disk.remove(id);
        self.fractional.remove(id);
    }
}

impl AgentCore {
    /// GPUs holding a live fractional task (each needs its MPS daemon).
    pub fn shared_gpus(&self) -> Vec<String> {
        let tasks = &self.ckpt.tasks;
        self.watched
            .fractional
            .iter()
            .filter_map(|id| tasks.get(id))
            .filter(|t| !t.state.is_terminal())
            .flat_map(|t| t.gpus.iter().cloned())
            .collect()
    }

    /// [`AgentCore::shared_gpus`] by a scan of every task: what the index must agree with
    /// (property test `core/tests/disk.rs`).
    #[cfg(test)]
    pub(super) fn shared_gpus_scan(&self) -> Vec<String> {
        self.ckpt
            .tasks
            .values()
            .filter(|t| !t.state.is_terminal())
            .filter(|t| Watched::fractional(t))
            .flat_map(|t| t.gpus.iter().cloned())
            .collect()
    }

    /// The watched-limits index as it stands, and as a scan of every task makes it (tests).
    #[cfg(test)]
    pub(super) fn watched_index(&self) -> (&Watched, Watched) {
        (&self.watched, Watched::of(&self.ckpt))
    }
}
