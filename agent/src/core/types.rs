//! The core's own types: what it records of a task ([`TaskRecord`]), the state it checkpoints
//! ([`Checkpoint`]), the changes it logs ([`Record`]), what it learns of a launch
//! ([`Launched`], [`ExitStatus`]) and the limits it plans for a task's cgroup ([`Limits`]). The
//! I/O modules use them (and re-export them where they always were): the checkpoint file and
//! the write-ahead log store them, the executor fills them in, the isolator applies the limits.
//! Pure data: nothing here reads or writes anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gantry_proto::{AgentId, FrameworkId, StatusUpdate, TaskId, TaskInfo, TaskState, UpdateId};
use serde::{Deserialize, Serialize};

use crate::isolation::DeviceRule;
use crate::updates::UpdateQueue;

/// How a task's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// A launched task: the supervisor's pid and the task's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launched {
    pub supervisor_pid: i32,
    pub task_pgid: i32,
    /// Start time of the supervisor (clock ticks since boot), to detect pid reuse.
    pub supervisor_start: u64,
}

/// One task as the agent remembers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub framework_id: FrameworkId,
    pub info: TaskInfo,
    pub state: TaskState,
    pub sandbox: PathBuf,
    /// The supervisor's root-owned pid/exit directory (empty in checkpoints written before it
    /// existed: those kept the files in the sandbox).
    #[serde(default)]
    pub meta: PathBuf,
    /// What the supervisor answered to the launch. Held in memory only: the launch record
    /// (`executor::record`, `supervisor` and `task` lines) is its one record, and a restarted
    /// agent reads it from there ([`super::recovery::RecoveryProbe::found`]). Logs of agents
    /// before that held it too: it is still read from them, never written.
    #[serde(default, skip_serializing)]
    pub launched: Option<Launched>,
    /// UUIDs of the GPUs assigned to the task.
    pub gpus: Vec<String>,
    /// Unix ms when a kill was requested (SIGKILL follows after the grace period).
    pub kill_requested_ms: Option<u64>,
    /// Task cgroup name, when isolated.
    pub cgroup: Option<String>,
    /// Set when the agent killed the task for using more GPU memory than its share
    /// (`--gpu-memory-enforce kill`): the message its terminal update carries.
    #[serde(default)]
    pub gpu_memory_kill: Option<String>,
    /// Set when the agent killed the task for using more disk than its `disk`
    /// (`--disk-enforcement du`): the message its terminal update carries.
    #[serde(default)]
    pub disk_kill: Option<String>,
    /// Host ports assigned to the task (its `ports:K`), held until it is terminal.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// The task group it was launched in, with the group's policy (so the policy survives a
    /// restart of the agent).
    #[serde(default)]
    pub group: Option<super::groups::GroupTag>,
}

impl TaskRecord {
    /// Where the task's launch record (`executor::record`) is.
    pub fn meta_dir(&self) -> &Path {
        if self.meta.as_os_str().is_empty() {
            &self.sandbox
        } else {
            &self.meta
        }
    }
}

/// Everything the agent checkpoints.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Checkpoint {
    pub agent_id: Option<AgentId>,
    pub tasks: BTreeMap<TaskId, TaskRecord>,
    pub updates: UpdateQueue,
    /// GPUs marked unhealthy (UUID -> reason), so a restarted agent keeps them withdrawn until
    /// an operator clears them or the recovery check passes.
    #[serde(default)]
    pub unhealthy_gpus: BTreeMap<String, String>,
    /// The first write-ahead log generation this snapshot does not include ([`crate::wal`]);
    /// 0 in checkpoints written before the log existed.
    #[serde(default)]
    pub log_gen: u64,
}

/// One change to the checkpointed state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Record {
    /// The master assigned (or confirmed) this agent's id.
    AgentId(AgentId),
    /// A task's whole record, as it is now (inserted or changed).
    Task(Box<TaskRecord>),
    /// A task was forgotten (terminal and every update acknowledged).
    TaskRemoved(TaskId),
    /// A status update was queued for reliable delivery.
    Update(Box<StatusUpdate>),
    /// The master acknowledged a task's oldest update.
    Acked {
        task: TaskId,
        update: UpdateId,
    },
    GpuUnhealthy {
        uuid: String,
        reason: String,
    },
    GpuHealthy {
        uuid: String,
    },
}

impl Record {
    /// Applies the change to `ckpt` (recovery replays the log through this).
    pub fn apply(self, ckpt: &mut Checkpoint) {
        match self {
            Record::AgentId(id) => ckpt.agent_id = Some(id),
            Record::Task(rec) => {
                ckpt.tasks.insert(rec.info.task_id, *rec);
            }
            Record::TaskRemoved(id) => {
                ckpt.tasks.remove(&id);
            }
            Record::Update(u) => ckpt.updates.push(*u),
            Record::Acked { task, update } => {
                ckpt.updates.ack(task, update, 0);
            }
            Record::GpuUnhealthy { uuid, reason } => {
                ckpt.unhealthy_gpus.insert(uuid, reason);
            }
            Record::GpuHealthy { uuid } => {
                ckpt.unhealthy_gpus.remove(&uuid);
            }
        }
    }
}

/// Per-task limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Requested CPUs (shares/weight; and the quota when `cpu_hard_limit`).
    pub cpus: f64,
    /// Hard memory limit in MiB.
    pub mem_mib: Option<u64>,
    /// Maximum number of processes/threads.
    pub pids_max: Option<u64>,
    /// Enforce `cpus` as a CFS quota.
    pub cpu_hard_limit: bool,
    /// Device allow list; `None` leaves devices unrestricted.
    pub devices: Option<Vec<DeviceRule>>,
}
