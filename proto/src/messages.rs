//! Every message that crosses the wire. Agents and frameworks each speak over one bidirectional
//! QUIC stream to the master: the first frame is a [`Hello`], the master answers with its
//! [`MasterRole`] (a standby keeps the stream open and sends `Leading` when it is elected), then
//! [`AgentToMaster`] / [`MasterToAgent`] or [`FrameworkToMaster`] / [`MasterToFramework`]
//! frames follow.
//!
//! Over 800 lines on purpose: every wire message in one file, so the protocol reads as one
//! document in the order a session uses it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ids::{AgentId, FrameworkId, OfferId, TaskId, UpdateId};
use super::resources::Resources;

/// Bumped on any incompatible change; checked in the [`Hello`] and by ALPN.
pub const PROTOCOL_VERSION: u32 = 7;

/// The most task ids one [`FrameworkToMaster::Reconcile`] may name; the master refuses more
/// with an [`ErrorKind::InvalidRequest`] error (the SDK's driver splits longer lists).
pub const MAX_RECONCILE_IDS: usize = 10_000;

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

/// The first frame on every stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The sender's [`PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// Whether an agent or a framework is connecting.
    pub peer: PeerKind,
}

/// The master's answer to a [`Hello`] and, on a standby's open stream, news of an election.
///
/// A peer keeps a stream open to every master: the leader's carries its session, the
/// standbys' wait. When a standby is elected it sends `Leading` on every waiting stream, so
/// peers re-register over connections that already exist (no handshake herd after a failover,
/// and no waiting for the dead leader's connection to time out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MasterRole {
    /// This master leads, in term `epoch`: register / subscribe on this stream now.
    Leading {
        /// The leader's term.
        epoch: u64,
    },
    /// A standby. `leader` is the leading master's advertised address, if known. The stream
    /// stays open; `Leading` follows if this master is elected, `Standby` again when the leader
    /// it knows changes.
    Standby {
        /// The leader's advertised address, if this standby knows it.
        leader: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
/// Who opens a stream to the master.
pub enum PeerKind {
    /// An agent (a host offering resources and running tasks).
    Agent,
    /// A framework (a scheduler accepting offers and launching tasks).
    Framework,
}

/// One physical GPU as measured by the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML uuid (`GPU-...`): the stable identity of the device.
    pub uuid: String,
    /// Model name (`NVIDIA A100-SXM4-80GB`).
    pub name: String,
    /// Total device memory, MiB.
    pub memory_mib: u64,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// The device minor number (`/dev/nvidiaN`).
    pub minor: u32,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// The NUMA node the device is attached to, when known.
    pub numa_node: Option<u32>,
    /// False after an XID error or a failed health check: not offered.
    pub healthy: bool,
    /// Set on a MIG device (a slice of a GPU in MIG mode): its profile, e.g. `1g.10gb`. The
    /// slice is offered as one GPU whose `uuid` is the MIG UUID (`MIG-...`); only tasks whose
    /// [`GpuSelector::mig_profile`] names the profile get it.
    #[serde(default)]
    pub mig_profile: Option<String>,
    /// For a MIG device, the UUID of the physical GPU it is carved from.
    #[serde(default)]
    pub parent_uuid: Option<String>,
    /// The PCI root (host bridge and root port) the device hangs off, when sysfs shows it:
    /// GPUs under one root talk fastest. The master groups GPUs by NUMA node and PCI root
    /// when it chooses whole GPUs for a task. (Protocol v6.)
    #[serde(default)]
    pub pci_root: Option<String>,
}

/// What is left of one GPU for new tasks (in offers): the fraction not given to tasks and the
/// device memory that goes with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFree {
    /// The GPU's (or MIG device's) uuid.
    pub uuid: String,
    /// Free milli-GPUs (1000 = idle).
    pub free_milli: u32,
    /// Free device memory, MiB: the GPU's memory times its free fraction.
    pub free_memory_mib: u64,
}

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

/// Longest command the master accepts (shell string, or all argv elements together), bytes.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// What a task runs and as whom (Mesos `CommandInfo`).
///
/// ```
/// use gantry_proto::{CommandInfo, Program};
/// // A shell string, run with `/bin/sh -c` (pipes, `&&`, `$VAR` work):
/// let sh = CommandInfo::shell("echo $HOSTNAME > host.txt && sleep 1");
/// // An argv vector, executed directly: every element reaches the program exactly as given.
/// let argv = CommandInfo::argv(["python3", "-c", "a=[1]; print(a)"]).with_user("alice");
/// assert_eq!(argv.program, Program::Argv(vec!["python3".into(), "-c".into(), "a=[1]; print(a)".into()]));
/// assert_eq!(sh.user, None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandInfo {
    /// The program: a shell string or an argv.
    pub program: Program,
    /// The Unix user the task runs as. `None`: the agent's `--task-user` (the master fills in
    /// the agent's default before launching, so the ACL check and `/state` see the real user).
    pub user: Option<String>,
}

/// The two kinds of command (Mesos `CommandInfo.shell`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Program {
    /// Run with `/bin/sh -c STRING` (Mesos `shell: true`).
    Shell(String),
    /// Executed directly, without a shell (Mesos `shell: false`): `argv[0]` is the program (a
    /// path, or a name looked up in the task's `PATH`) and its `argv[0]`; every element is
    /// passed exactly as given (spaces, quotes and `$` are not interpreted).
    Argv(Vec<String>),
}

impl CommandInfo {
    /// A shell command (`/bin/sh -c command`), run as the agent's default task user.
    pub fn shell(command: impl Into<String>) -> Self {
        Self {
            program: Program::Shell(command.into()),
            user: None,
        }
    }

    /// An argv vector executed directly, run as the agent's default task user.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            program: Program::Argv(argv.into_iter().map(Into::into).collect()),
            user: None,
        }
    }

    /// The same command run as `user`.
    pub fn with_user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Why the command cannot run (empty, too long, a NUL byte), if it cannot.
    pub fn problem(&self) -> Option<String> {
        let nul = |s: &str| s.contains('\0');
        match &self.program {
            Program::Shell(s) if s.trim().is_empty() => Some("empty shell command".into()),
            Program::Shell(s) if s.len() > MAX_COMMAND_BYTES => Some(format!(
                "command longer than {} KiB",
                MAX_COMMAND_BYTES / 1024
            )),
            Program::Shell(s) if nul(s) => Some("command contains a NUL byte".into()),
            Program::Shell(_) => None,
            Program::Argv(v) if v.is_empty() => Some("empty argv: no program to run".into()),
            Program::Argv(v) if v[0].is_empty() => Some("empty program (argv[0] is \"\")".into()),
            Program::Argv(v)
                if v.iter().map(|a| a.len() + 1).sum::<usize>() > MAX_COMMAND_BYTES =>
            {
                Some(format!("argv longer than {} KiB", MAX_COMMAND_BYTES / 1024))
            }
            Program::Argv(v) if v.iter().any(|a| nul(a)) => {
                Some("an argv element contains a NUL byte".into())
            }
            Program::Argv(_) => None,
        }
    }
}

/// A shell command (what `"sleep 1".into()` means, as Mesos's default `shell: true`).
impl From<&str> for CommandInfo {
    fn from(s: &str) -> Self {
        Self::shell(s)
    }
}

impl From<String> for CommandInfo {
    fn from(s: String) -> Self {
        Self::shell(s)
    }
}

/// For logs: a shell command as written, an argv vector shell-quoted.
impl std::fmt::Display for CommandInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.program {
            Program::Shell(s) => write!(f, "sh -c {}", quote(s))?,
            Program::Argv(v) => {
                let words: Vec<String> = v.iter().map(|a| quote(a)).collect();
                f.write_str(&words.join(" "))?;
            }
        }
        if let Some(u) = &self.user {
            write!(f, " (as {u})")?;
        }
        Ok(())
    }
}

/// Single-quotes a word for display when it is not plain.
fn quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// What a framework asks the agent to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// Chosen by the framework; unique among its tasks.
    pub task_id: TaskId,
    /// A human-readable name (logs, `/state`).
    pub name: String,
    /// What to run (shell string or argv) and as which user.
    pub command: CommandInfo,
    /// What the task may use (taken from the accepted offers; enforced by cgroups).
    pub resources: Resources,
    /// Environment variables added to the agent's task environment.
    pub env: BTreeMap<String, String>,
    /// Seconds between SIGTERM and SIGKILL when the task is killed (agent default when `None`).
    pub kill_grace_secs: Option<u32>,
    /// Which GPUs the task's `gpus` may be drawn from (any when `None`).
    pub gpu_selector: Option<GpuSelector>,
}

/// Constraints on the GPUs a task gets; every GPU given to the task matches all of them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSelector {
    /// Case-insensitive substring of the model name (`"A100"` matches
    /// `"NVIDIA A100-SXM4-80GB"`).
    pub model: Option<String>,
    /// Least memory per GPU, MiB.
    pub min_memory_mib: Option<u64>,
    /// A MIG profile (`1g.10gb`, case-insensitive): the task gets MIG devices of this profile.
    /// Without it the task gets whole physical GPUs (or fractions of them), never MIG devices.
    #[serde(default)]
    pub mig_profile: Option<String>,
    /// Exact devices (UUIDs, as in [`GpuInfo::uuid`] and `nvidia-smi -L`): when not empty, the
    /// task's GPUs are drawn only from these (a MIG device also needs `mig_profile`). Pinning as many UUIDs as the task asks for GPUs
    /// gives it exactly those devices (a plan made with NUMA/NVLink locality is then kept by the
    /// agent). At most [`GpuSelector::MAX_UUIDS`] entries.
    #[serde(default)]
    pub uuids: Vec<String>,
}

impl GpuSelector {
    /// The most UUIDs a selector may pin (the master refuses longer lists).
    pub const MAX_UUIDS: usize = 64;

    /// A selector pinning exactly `uuids` (no other constraint).
    pub fn pinned<I, S>(uuids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        GpuSelector {
            uuids: uuids.into_iter().map(Into::into).collect(),
            ..GpuSelector::default()
        }
    }

    /// Why the selector is malformed (too many or empty/overlong UUIDs), if it is.
    pub fn invalid(&self) -> Option<String> {
        if self.uuids.len() > Self::MAX_UUIDS {
            return Some(format!(
                "a GPU selector pins {} UUIDs, at most {} are allowed",
                self.uuids.len(),
                Self::MAX_UUIDS
            ));
        }
        self.uuids
            .iter()
            .find(|u| u.is_empty() || u.len() > 128)
            .map(|u| format!("GPU UUID {u:?} in the selector is empty or longer than 128 bytes"))
    }

    /// True when `gpu` satisfies every constraint.
    pub fn matches(&self, gpu: &GpuInfo) -> bool {
        let model_ok = self
            .model
            .as_ref()
            .is_none_or(|m| gpu.name.to_lowercase().contains(&m.to_lowercase()));
        let mem_ok = self.min_memory_mib.is_none_or(|min| gpu.memory_mib >= min);
        let pinned = self.uuids.contains(&gpu.uuid);
        let uuid_ok = self.uuids.is_empty() || pinned;
        // A MIG device is given only to a task that names its profile (also when pinned).
        let mig_ok = match (&self.mig_profile, &gpu.mig_profile) {
            (None, None) => true,
            (Some(want), Some(have)) => want.eq_ignore_ascii_case(have),
            _ => false,
        };
        model_ok && mem_ok && mig_ok && uuid_ok
    }

    /// Whether a task with `selector` (none: any physical GPU) may get `gpu`.
    pub fn admits(selector: Option<&GpuSelector>, gpu: &GpuInfo) -> bool {
        match selector {
            Some(s) => s.matches(gpu),
            None => gpu.mig_profile.is_none(),
        }
    }
}

/// A task's lifecycle state, as in Mesos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskState {
    /// Accepted by the master, not yet started by the agent.
    Staging,
    /// The agent is setting up the sandbox and cgroups.
    Starting,
    /// The process runs.
    Running,
    /// Exited with status 0 (terminal).
    Finished,
    /// Exited non-zero or was killed by a signal it did not ask for (terminal).
    Failed,
    /// Killed on request (terminal).
    Killed,
    /// Its agent was lost or the task is unknown to it (terminal).
    Lost,
    /// Could not be launched (terminal).
    Error,
    /// Never launched because the accept that carried it was invalid, e.g. it named an offer
    /// that was already used, declined or rescinded (terminal; Mesos `TASK_DROPPED`). Nothing
    /// of the task ran: launch it again on a later offer.
    Dropped,
    /// Its agent has been out of touch past the re-register timeout (a partition, a paused
    /// host): the task may still run (non-terminal; Mesos `TASK_UNREACHABLE`). Only frameworks
    /// that declare [`Capability::PartitionAware`] see it; the others get [`TaskState::Lost`].
    /// If the agent comes back within the master's unreachable timeout the task resumes its
    /// real state (`RUNNING`, or the `FINISHED` it reached while away); past it, [`TaskState::Gone`].
    Unreachable,
    /// Its agent stayed unreachable past the master's unreachable timeout (or was marked gone):
    /// the task is considered not running and never comes back (terminal; Mesos `TASK_GONE`).
    /// Whether it ran to completion is unknown: launch it again.
    Gone,
}

impl TaskState {
    /// True for states a task never leaves.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Finished
                | TaskState::Failed
                | TaskState::Killed
                | TaskState::Lost
                | TaskState::Error
                | TaskState::Dropped
                | TaskState::Gone
        )
    }

    /// Upper-case name, as shown in `/state` (`RUNNING`).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Staging => "STAGING",
            TaskState::Starting => "STARTING",
            TaskState::Running => "RUNNING",
            TaskState::Finished => "FINISHED",
            TaskState::Failed => "FAILED",
            TaskState::Killed => "KILLED",
            TaskState::Lost => "LOST",
            TaskState::Error => "ERROR",
            TaskState::Dropped => "DROPPED",
            TaskState::Unreachable => "UNREACHABLE",
            TaskState::Gone => "GONE",
        }
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a task reached a state, by kind (Mesos `TaskStatus.Reason`), so schedulers and
/// operators react by kind, not by parsing messages. Shown in `/state` as [`TaskReason::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskReason {
    /// The command exited non-zero or was ended by a signal.
    CommandFailed,
    /// The kernel's OOM killer ended the task: it exceeded its `mem`.
    MemoryLimit,
    /// Killed on request (the framework, its teardown or failover timeout, an operator).
    KilledByRequest,
    /// The agent could not start the task (no matching GPUs, unknown user, cgroup error).
    LaunchFailed,
    /// The master refused the task (invalid, too big for the offers, a user not allowed).
    InvalidTask,
    /// The agent was lost (did not re-register in time) or no longer knows the task.
    AgentLost,
    /// The agent restarted before the task was launched.
    AgentRestarted,
    /// One of the task's GPUs changed health (a non-terminal update).
    GpuHealth,
    /// Reconciliation of a task the master does not know.
    Unknown,
    /// The accept named an offer that is not outstanding (used, declined, rescinded, expired,
    /// another framework's) or was otherwise invalid: its tasks are [`TaskState::Dropped`]
    /// (Mesos `REASON_INVALID_OFFERS`).
    InvalidOffers,
    /// The task's processes use more GPU memory than its share (a non-terminal report, or the
    /// reason it was killed under `--gpu-memory-enforce kill`).
    GpuMemory,
    /// The agent could not find the `ports:K` free ports the task asks for in its port range
    /// (held by processes outside Gantry, or the agent has no range).
    PortUnavailable,
    /// Its agent is out of touch past the re-register timeout ([`TaskState::Unreachable`]), or
    /// stayed so past the unreachable timeout ([`TaskState::Gone`]).
    AgentUnreachable,
    /// The task's sandbox grew past its `disk` (measured by the agent, du-style, every
    /// `--disk-watch-interval`): it was killed (`FAILED`; Mesos `REASON_CONTAINER_LIMITATION_DISK`).
    DiskLimit,
}

impl TaskReason {
    /// Kebab-case name, as shown in `/state` (`memory-limit`).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskReason::CommandFailed => "command-failed",
            TaskReason::MemoryLimit => "memory-limit",
            TaskReason::KilledByRequest => "killed-by-request",
            TaskReason::LaunchFailed => "launch-failed",
            TaskReason::InvalidTask => "invalid-task",
            TaskReason::AgentLost => "agent-lost",
            TaskReason::AgentRestarted => "agent-restarted",
            TaskReason::GpuHealth => "gpu-health",
            TaskReason::Unknown => "unknown",
            TaskReason::InvalidOffers => "invalid-offers",
            TaskReason::GpuMemory => "gpu-memory",
            TaskReason::PortUnavailable => "port-unavailable",
            TaskReason::AgentUnreachable => "agent-unreachable",
            TaskReason::DiskLimit => "disk-limit",
        }
    }
}

impl std::fmt::Display for TaskReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a status update came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateSource {
    /// Sent by the agent running the task.
    Agent,
    /// Generated by the master (lost agents, invalid launches, reconciliation).
    Master,
}

/// A change of a task's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusUpdate {
    /// Identifies this update for acknowledgement.
    pub update_id: UpdateId,
    /// The task the update is about.
    pub task_id: TaskId,
    /// The framework that owns the task.
    pub framework_id: FrameworkId,
    /// The agent the task was on, when known.
    pub agent_id: Option<AgentId>,
    /// The task's new state.
    pub state: TaskState,
    /// Who generated the update.
    pub source: UpdateSource,
    /// Why the task is in this state, by kind (`None` for ordinary progress and success).
    pub reason: Option<TaskReason>,
    /// Human-readable detail (`"exited with code 3"`, `"memory-limit: ..."`, `"agent lost"`).
    pub message: String,
    /// The exit code, when the process exited.
    pub exit_code: Option<i32>,
    /// The signal that ended the process, when it was killed by one.
    pub signal: Option<i32>,
    /// The GPUs (UUIDs) the agent gave the task (set on agent updates).
    pub gpus: Vec<String>,
    /// Milliseconds since the Unix epoch when the update was made.
    pub timestamp_ms: u64,
    /// Set for reconciliation answers; those need no acknowledgement.
    pub reconciliation: bool,
    /// The host ports the agent gave the task (its `ports:K` resource; the task sees them as
    /// `PORT`, `PORT0`.. and `GANTRY_PORTS`). Set on agent updates, empty for tasks asking
    /// for no ports.
    #[serde(default)]
    pub ports: Vec<u16>,
}

impl StatusUpdate {
    /// A bare agent update of `task` to `state`: a fresh update id, no agent, reason, message,
    /// exit status, GPUs or ports, timestamp 0. Fill in what applies with struct update syntax.
    pub fn new(task_id: TaskId, framework_id: FrameworkId, state: TaskState) -> Self {
        StatusUpdate {
            update_id: UpdateId::random(),
            task_id,
            framework_id,
            agent_id: None,
            state,
            source: UpdateSource::Agent,
            reason: None,
            message: String::new(),
            exit_code: None,
            signal: None,
            gpus: Vec::new(),
            timestamp_ms: 0,
            reconciliation: false,
            ports: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Agent <-> master

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
}

// ---------------------------------------------------------------------------------------------
// Framework <-> master

/// The shape of a framework's pending tasks (demand-aware offers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    /// The resources of one pending task.
    pub task: Resources,
    /// How many such tasks are pending.
    pub count: u32,
}

/// Optional abilities a framework declares when subscribing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Capability {
    /// Wants offers from agents with GPUs.
    GpuResources,
    /// Understands [`TaskState::Unreachable`] and [`TaskState::Gone`] (Mesos
    /// `PARTITION_AWARE`): the tasks of an agent that is out of touch become `UNREACHABLE` and
    /// resume their real state if it comes back in time. Without it they are `LOST` (and
    /// killed if the agent comes back).
    PartitionAware,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// Who a framework is, sent in [`FrameworkToMaster::Subscribe`].
pub struct FrameworkInfo {
    /// Set when re-subscribing with the id a master gave earlier.
    pub framework_id: Option<FrameworkId>,
    /// A human-readable name.
    pub name: String,
    /// The roles it receives offers for (allowed by the master's ACLs for its principal).
    pub roles: Vec<String>,
    /// Optional abilities.
    pub capabilities: Vec<Capability>,
    /// How long the master keeps the framework's tasks after it disconnects.
    pub failover_timeout_secs: f64,
    /// Quantities of which an offer must hold at least one (Mesos's
    /// `min_allocatable_resources` offer filter, here for all the framework's roles): a
    /// framework running `gpus:1` tasks lists `cpus:1;mem:1024;gpus:1` and is not offered
    /// what is left of an agent whose GPUs are taken. Empty: any offer.
    #[serde(default)]
    pub min_allocatable: Vec<Resources>,
    /// Roles (of `roles`) in which the framework subscribes suppressed (Mesos's
    /// `Subscribe.suppressed_roles`): a framework with nothing to launch yet is offered nothing
    /// there until it revives. On re-subscription the framework is suppressed in exactly these
    /// and revived in its other roles; the SDK's driver re-subscribes with the roles it last
    /// suppressed.
    #[serde(default)]
    pub suppressed_roles: Vec<String>,
}

/// An operation inside an accept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Operation {
    /// Launch tasks on the offers' agent.
    Launch {
        /// The tasks; their resources come out of the accepted offers.
        tasks: Vec<TaskInfo>,
    },
    /// Dynamically reserve unreserved offered resources for a role.
    Reserve {
        /// The role to reserve for.
        role: String,
        /// What to reserve.
        resources: Resources,
    },
    /// Return reserved resources of a role to the unreserved pool.
    Unreserve {
        /// The role whose reservation shrinks.
        role: String,
        /// What to return.
        resources: Resources,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// What a framework sends the master.
pub enum FrameworkToMaster {
    /// First message after the hello.
    Subscribe(FrameworkInfo),
    /// Use offers (all on one agent) for operations; what is left is declined.
    Accept {
        /// The offers, all on one agent.
        offer_ids: Vec<OfferId>,
        /// Applied in order.
        operations: Vec<Operation>,
        /// Filter the unused part of the offers for this long (master default when `None`).
        refuse_seconds: Option<f64>,
    },
    /// Return offers unused.
    Decline {
        /// The offers.
        offer_ids: Vec<OfferId>,
        /// Do not offer these resources again for this long (master default when `None`).
        refuse_seconds: Option<f64>,
    },
    /// Kill a task.
    Kill {
        /// The task.
        task_id: TaskId,
    },
    /// Empty list: all of the framework's tasks (implicit reconciliation).
    Reconcile {
        /// The tasks to report on (at most [`MAX_RECONCILE_IDS`]).
        task_ids: Vec<TaskId>,
    },
    /// Empty list: all of the framework's roles.
    Suppress {
        /// The roles to stop receiving offers for.
        roles: Vec<String>,
    },
    /// Clear filters and resume offers (empty list: all of the framework's roles).
    Revive {
        /// The roles.
        roles: Vec<String>,
    },
    /// A status update was handled: the master stops resending it.
    Acknowledge {
        /// The task the update was about.
        task_id: TaskId,
        /// The update.
        update_id: UpdateId,
    },
    /// Declare (or clear, `None`) the shape of pending work, for demand-aware offers.
    SetDemand {
        /// The demand.
        demand: Option<Demand>,
    },
    /// The framework is done: kill its tasks and forget it.
    Teardown,
}

/// Resources offered on one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offer {
    /// Identifies the offer in an accept or decline.
    pub id: OfferId,
    /// The framework it is made to.
    pub framework_id: FrameworkId,
    /// The agent the resources are on.
    pub agent_id: AgentId,
    /// The agent's hostname.
    pub hostname: String,
    /// The role the offer is made to.
    pub role: String,
    /// Unreserved resources.
    pub resources: Resources,
    /// Reserved resources, per role.
    pub reserved: BTreeMap<String, Resources>,
    /// The agent's attributes (shared by every offer of the agent: the master builds them
    /// once per agent, not per offer; on the wire this is the plain map).
    #[serde(with = "shared_map")]
    pub attributes: Arc<Attributes>,
    /// The healthy GPUs the offer's `gpus` amount can be drawn from (shared like
    /// `attributes`; on the wire a plain list). Empty when the offer holds no GPUs.
    #[serde(with = "shared_list")]
    pub gpus: Arc<[GpuInfo]>,
    /// What is free of each of those GPUs (fraction and memory), in the order of `gpus`: a
    /// task asking for `gpus:0.25` fits when one of them has at least 250 milli-GPUs free.
    #[serde(default)]
    pub gpu_free: Vec<GpuFree>,
}

/// `Arc<Attributes>` on the wire as the plain map (serde's `rc` feature would do the same, for
/// every crate of the workspace).
pub(crate) mod shared_map {
    use super::{Arc, Attributes};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Arc<Attributes>, s: S) -> Result<S::Ok, S::Error> {
        (**v).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Attributes>, D::Error> {
        Attributes::deserialize(d).map(Arc::new)
    }
}

/// `Arc<[GpuInfo]>` on the wire as the plain list.
pub(crate) mod shared_list {
    use super::{Arc, GpuInfo};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Arc<[GpuInfo]>, s: S) -> Result<S::Ok, S::Error> {
        (**v).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<[GpuInfo]>, D::Error> {
        Vec::<GpuInfo>::deserialize(d).map(Arc::from)
    }
}

impl Offer {
    /// Everything offered: unreserved plus every reservation.
    pub fn total(&self) -> Resources {
        let mut t = self.resources.clone();
        for r in self.reserved.values() {
            t.add_assign(r);
        }
        t
    }
}

/// What kind of mistake a framework made (so schedulers can react by kind, not by text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The offer does not exist (any more): rescinded, declined or already used.
    UnknownOffer,
    /// The agent is not registered.
    UnknownAgent,
    /// The task is not known.
    UnknownTask,
    /// The operations need more than the offers hold.
    InsufficientResources,
    /// A task is malformed (duplicate id, bad resources, ...).
    InvalidTask,
    /// The request is malformed or not allowed (ACLs, bounds).
    InvalidRequest,
    /// The framework must subscribe first.
    NotSubscribed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// What the master sends a framework.
pub enum MasterToFramework {
    /// The subscription was accepted.
    Subscribed {
        /// The id to re-subscribe with after a disconnect.
        framework_id: FrameworkId,
        /// The leading master's term.
        epoch: u64,
        /// How often the master sends [`MasterToFramework::Heartbeat`].
        heartbeat_interval_ms: u64,
    },
    /// New offers.
    Offers(Vec<Offer>),
    /// An offer is withdrawn (its agent left, or it timed out).
    Rescind {
        /// The offer.
        offer_id: OfferId,
    },
    /// A task status update; acknowledge it.
    Update(StatusUpdate),
    /// A request was refused.
    Error {
        /// What kind of refusal.
        kind: ErrorKind,
        /// Details for humans.
        message: String,
    },
    /// Liveness, every `heartbeat_interval_ms`.
    Heartbeat,
    /// An agent this framework has tasks on is being drained for maintenance (Mesos inverse
    /// offers): move the tasks elsewhere before the deadline, when the master kills what is
    /// left (each task with its grace period). Sent again after a re-subscription while the
    /// drain lasts.
    DrainNotice(DrainNotice),
}

/// Notice that an agent is being drained ([`MasterToFramework::DrainNotice`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainNotice {
    /// The agent being drained.
    pub agent_id: AgentId,
    /// Its hostname.
    pub hostname: String,
    /// Milliseconds from when the notice was sent until the master kills the tasks still
    /// there; `None`: no deadline (the framework moves them at its own pace).
    pub deadline_in_ms: Option<u64>,
    /// The same deadline as Unix milliseconds (the master's clock), for display.
    pub deadline_unix_ms: Option<u64>,
    /// The framework's tasks on the agent (not yet terminal) when the notice was sent.
    pub task_ids: Vec<TaskId>,
    /// Why the agent is drained (`operator`, `spot termination notice`).
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_say_what_is_wrong_and_display_quoted() {
        assert_eq!(CommandInfo::shell("sleep 1").problem(), None);
        assert_eq!(CommandInfo::argv(["sh", "-c", "sleep 0.2"]).problem(), None);
        let problem = |c: CommandInfo| c.problem().unwrap_or_default();
        assert_eq!(problem(CommandInfo::shell("  ")), "empty shell command");
        assert!(problem(CommandInfo::argv(Vec::<String>::new())).starts_with("empty argv"));
        assert!(problem(CommandInfo::argv(["", "x"])).starts_with("empty program"));
        assert!(problem(CommandInfo::argv(["a\0b"])).contains("NUL"));
        assert!(problem(CommandInfo::shell("x".repeat(MAX_COMMAND_BYTES + 1))).contains("64 KiB"));
        assert_eq!(CommandInfo::from("true"), CommandInfo::shell("true"));
        assert_eq!(
            CommandInfo::argv(["python3", "-c", "a=[1]; print(a)", "it's"])
                .with_user("alice")
                .to_string(),
            "python3 -c 'a=[1]; print(a)' 'it'\\''s' (as alice)"
        );
        assert_eq!(CommandInfo::shell("echo $X").to_string(), "sh -c 'echo $X'");
    }

    #[test]
    fn gpu_selector_matches_model_and_memory() {
        let gpu = GpuInfo {
            uuid: "GPU-1".into(),
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 81920,
            compute_capability: (8, 0),
            minor: 0,
            pci_bus_id: "0".into(),
            numa_node: Some(0),
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        };
        assert!(GpuSelector::default().matches(&gpu));
        assert!(GpuSelector {
            model: Some("a100".into()),
            min_memory_mib: Some(80000),
            mig_profile: None,
            uuids: Vec::new(),
        }
        .matches(&gpu));
        assert!(!GpuSelector {
            model: Some("H100".into()),
            min_memory_mib: None,
            mig_profile: None,
            uuids: Vec::new(),
        }
        .matches(&gpu));
        assert!(!GpuSelector {
            model: None,
            min_memory_mib: Some(100_000),
            mig_profile: None,
            uuids: Vec::new(),
        }
        .matches(&gpu));
        // MIG devices only for tasks naming their profile, and never the other way round.
        let mig = GpuInfo {
            uuid: "MIG-1".into(),
            mig_profile: Some("1g.10gb".into()),
            parent_uuid: Some("GPU-1".into()),
            memory_mib: 9856,
            ..gpu.clone()
        };
        let pinned = GpuSelector::pinned(["GPU-2", "GPU-1"]);
        assert!(pinned.matches(&gpu) && pinned.invalid().is_none());
        assert!(!GpuSelector::pinned(["GPU-3"]).matches(&gpu));
        assert!(GpuSelector::pinned(vec!["GPU-1"; 65])
            .invalid()
            .is_some_and(|e| e.contains("at most 64")));
        assert!(GpuSelector::pinned([""]).invalid().is_some());
        assert!(!GpuSelector::pinned(["MIG-1"]).matches(&mig));
        let pinned_mig = GpuSelector {
            mig_profile: Some("1g.10gb".into()),
            ..GpuSelector::pinned(["MIG-1"])
        };
        assert!(pinned_mig.matches(&mig) && !pinned_mig.matches(&gpu));
        let want = GpuSelector {
            mig_profile: Some("1G.10GB".into()),
            ..GpuSelector::default()
        };
        assert!(want.matches(&mig) && !want.matches(&gpu));
        assert!(!GpuSelector::admits(None, &mig) && GpuSelector::admits(None, &gpu));
        assert!(!GpuSelector::default().matches(&mig));
    }
}
