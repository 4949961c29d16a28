//! Agent <-> master: registration (bounded by [`register_limits`]), heartbeats, usage and
//! status updates ([`AgentToMaster`]); launches, kills and acknowledgements ([`MasterToAgent`]).

use super::*;

/// Bounds on what an agent registers with ([`AgentToMaster::Register`]); the master refuses a
/// registration past any of them with a [`MasterToAgent::Error`] naming it. They keep every
/// offer (which repeats the agent's hostname, attributes and GPUs) far below the frame limit.
pub mod register_limits {
    /// Bytes of the hostname (a DNS name has at most 253).
    pub const MAX_HOSTNAME: usize = 255;
    /// Number of attributes.
    pub const MAX_ATTRIBUTES: usize = 128;
    /// Bytes of one attribute name.
    pub const MAX_ATTRIBUTE_NAME: usize = 128;
    /// Bytes of all attribute names and values together.
    pub const MAX_ATTRIBUTES_BYTES: usize = 64 * 1024;
    /// GPUs of one agent.
    pub const MAX_GPUS: usize = 256;
    /// Bytes of each GPU string (uuid, model name, PCI bus id, MIG profile, parent uuid).
    pub const MAX_GPU_FIELD: usize = 256;
    /// Roles with static reservations on one agent.
    pub const MAX_RESERVED_ROLES: usize = 64;

    /// Checks an agent's registration against [`register_limits`](super::register_limits); the error names the bound.
    pub fn check(
        hostname: &str,
        attributes: &super::Attributes,
        gpus: &[super::GpuInfo],
        reserved: &std::collections::BTreeMap<String, super::Resources>,
    ) -> Result<(), String> {
        if hostname.len() > MAX_HOSTNAME {
            return Err(format!(
                "hostname has {} bytes; at most {MAX_HOSTNAME}",
                hostname.len()
            ));
        }
        if attributes.len() > MAX_ATTRIBUTES {
            return Err(format!(
                "{} attributes; at most {MAX_ATTRIBUTES}",
                attributes.len()
            ));
        }
        if let Some(k) = attributes.keys().find(|k| k.len() > MAX_ATTRIBUTE_NAME) {
            return Err(format!(
                "attribute name {:?}... has {} bytes; at most {MAX_ATTRIBUTE_NAME}",
                k.chars().take(32).collect::<String>(),
                k.len()
            ));
        }
        let total: usize = attributes.iter().map(|(k, v)| k.len() + v.len()).sum();
        if total > MAX_ATTRIBUTES_BYTES {
            return Err(format!(
                "attributes have {total} bytes of names and values; at most {MAX_ATTRIBUTES_BYTES}"
            ));
        }
        if gpus.len() > MAX_GPUS {
            return Err(format!("{} GPUs; at most {MAX_GPUS}", gpus.len()));
        }
        if let Some(g) = gpus.iter().find(|g| {
            g.uuid.len() > MAX_GPU_FIELD
                || g.name.len() > MAX_GPU_FIELD
                || g.pci_bus_id.len() > MAX_GPU_FIELD
                || g.pci_root.as_ref().is_some_and(|p| p.len() > MAX_GPU_FIELD)
                || g.mig_profile
                    .as_ref()
                    .is_some_and(|p| p.len() > MAX_GPU_FIELD)
                || g.parent_uuid
                    .as_ref()
                    .is_some_and(|p| p.len() > MAX_GPU_FIELD)
        }) {
            return Err(format!(
                "a GPU's uuid, name, PCI bus id or root, MIG profile or parent uuid ({:?}...) is longer than {MAX_GPU_FIELD} bytes",
                g.uuid.chars().take(32).collect::<String>()
            ));
        }
        if reserved.len() > MAX_RESERVED_ROLES {
            return Err(format!(
                "reservations for {} roles; at most {MAX_RESERVED_ROLES}",
                reserved.len()
            ));
        }
        Ok(())
    }
}

/// Free-form `key: value` attributes of an agent (`rack:r1`, `zone:a`, `gpu_model:A100`).
pub type Attributes = BTreeMap<String, String>;

/// Resource usage of one task (or one GPU) as sampled by the agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskUsage {
    /// CPU time used so far (user + system), seconds.
    pub cpu_time_secs: f64,
    /// Memory in use now, bytes.
    pub mem_bytes: u64,
    /// The most memory the task has used, bytes.
    pub mem_peak_bytes: u64,
    /// GPU memory used by the task's processes, bytes.
    pub gpu_mem_bytes: u64,
    /// Utilization of the task's GPUs, percent.
    pub gpu_util_percent: f64,
    /// The task's share of GPU memory, bytes (its fraction of each GPU it uses times the GPU's
    /// memory); 0 when the task has no GPU. `gpu_mem_bytes` above it is reported (and killed
    /// with the agent's `--gpu-memory-enforce kill`).
    #[serde(default)]
    pub gpu_mem_share_bytes: u64,
}

/// One GPU's latest sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    /// The GPU's uuid.
    pub uuid: String,
    /// Utilization, percent.
    pub util_percent: u32,
    /// Device memory in use, bytes.
    pub mem_used_bytes: u64,
    /// Temperature, degrees Celsius.
    pub temperature_c: u32,
    /// Power draw, milliwatts.
    pub power_mw: u32,
}

/// A task the agent holds, reported when (re-)registering: running, or ended with status
/// updates not yet acknowledged (so a new leading master learns of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningTask {
    /// The framework that owns the task.
    pub framework_id: FrameworkId,
    /// The task as launched.
    pub task: TaskInfo,
    /// Its state on the agent now.
    pub state: TaskState,
    /// The GPUs (UUIDs) the agent gave the task.
    pub gpus: Vec<String>,
    /// The host ports the agent gave the task.
    #[serde(default)]
    pub ports: Vec<u16>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// What an agent sends the master.
pub enum AgentToMaster {
    /// First message after the hello. The agent's name comes from its certificate, not from here.
    Register {
        /// Set when re-registering with an id a master gave earlier.
        agent_id: Option<AgentId>,
        /// The host's name, as frameworks see it in offers.
        hostname: String,
        /// Unreserved resources the agent offers.
        resources: Resources,
        /// Statically reserved resources, per role (on top of `resources`).
        reserved: BTreeMap<String, Resources>,
        /// Free-form attributes (bounded by [`register_limits`]).
        attributes: Attributes,
        /// The GPUs found by NVML.
        gpus: Vec<GpuInfo>,
        /// Tasks still running from before (after an agent or master restart).
        running_tasks: Vec<RunningTask>,
        /// Status updates not yet acknowledged, oldest first.
        pending_updates: Vec<StatusUpdate>,
        /// The Unix user tasks run as when their command names none (`--task-user`).
        task_user: String,
    },
    /// Liveness, every `heartbeat_interval_ms`.
    Heartbeat,
    /// A task changed state; retried until the master acknowledges it.
    StatusUpdate(StatusUpdate),
    /// Resource usage samples.
    Usage {
        /// Per running task.
        tasks: Vec<(TaskId, TaskUsage)>,
        /// Per GPU.
        gpus: Vec<GpuSample>,
    },
    /// A GPU became unhealthy (or healthy again).
    GpuHealth {
        /// The GPU's uuid.
        uuid: String,
        /// Whether it may be offered.
        healthy: bool,
        /// Why (e.g. the XID error).
        reason: String,
    },
    /// The host will be taken away (a spot-instance termination notice, told to the agent by
    /// `gantry-agent notice-termination --in 120s`): the master drains the agent with this
    /// deadline. A duration, not a time, so clock skew between hosts does not matter.
    TerminationNotice {
        /// Milliseconds from now until the host goes away.
        in_ms: u64,
        /// Where the notice came from (for the operator's view).
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// What the master sends an agent.
// `RunTask` (a task and its GPUs) is the large variant and the common one: boxing it would
// allocate on every launch to save a few bytes on rare control messages.
#[allow(clippy::large_enum_variant)]
pub enum MasterToAgent {
    /// The registration was accepted.
    Registered {
        /// The id to re-register with.
        agent_id: AgentId,
        /// The master's leadership epoch; messages from an older epoch are ignored.
        epoch: u64,
        /// How often to send [`AgentToMaster::Heartbeat`].
        heartbeat_interval_ms: u64,
    },
    /// Launch a task.
    RunTask {
        /// The framework that owns it.
        framework_id: FrameworkId,
        /// What to run.
        task: TaskInfo,
        /// The GPUs (UUIDs) the master chose: for a fraction of one GPU, fragmentation-aware;
        /// for whole GPUs, topology-aware (`gantry_sdk::placement::topology`). The agent
        /// takes them when they still fit, else chooses itself; empty: the agent chooses.
        #[serde(default)]
        gpus: Vec<String>,
    },
    /// Kill a task (SIGTERM, then SIGKILL after its grace period).
    KillTask {
        /// The framework that owns it.
        framework_id: FrameworkId,
        /// The task to kill.
        task_id: TaskId,
    },
    /// The master recorded a status update: stop retrying it.
    Acknowledge {
        /// The task the update was about.
        task_id: TaskId,
        /// The acknowledged update.
        update_id: UpdateId,
    },
    /// The master refused the registration or a message.
    Error {
        /// What was refused, and why.
        message: String,
    },
    /// An operator cleared an unhealthy GPU through the master's API: bring it back as
    /// `gantry-agent clear-gpu` does (the agent answers with `GpuHealth`).
    ClearGpu {
        /// The GPU's UUID.
        uuid: String,
    },
    /// Launch a task group ([`TaskGroup`]) atomically: all members start or none does.
    /// (Protocol v8.)
    RunTaskGroup {
        /// The framework that owns it.
        framework_id: FrameworkId,
        /// The group's id (`GANTRY_GROUP_ID`).
        group_id: String,
        /// What the agent does with the others when one member ends.
        policy: GroupPolicy,
        /// The members, in order.
        members: Vec<GroupMember>,
    },
}
