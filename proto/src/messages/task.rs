//! Tasks: what runs ([`TaskInfo`], [`CommandInfo`], [`GpuSelector`]), its states and the
//! reasons for them ([`TaskState`], [`TaskReason`]), and the [`StatusUpdate`]s that report them
//! (sent by agents, forwarded by the master to frameworks).

use super::*;

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
    /// Run the command in an OCI container (an image, namespaces, volumes; docs/containers.md);
    /// `None`: on the host's filesystem as before (protocol 9). Boxed: most tasks have none.
    pub container: Option<Box<ContainerInfo>>,
}

impl TaskInfo {
    /// A task named `name` running `command` with `resources`: a fresh random id, no extra
    /// environment, the agent's kill grace period, any GPUs. Set the rest with the `with_*`
    /// methods, so a field added to the protocol later breaks no framework:
    ///
    /// ```
    /// use gantry_proto::{CommandInfo, GpuSelector, TaskInfo};
    /// let t = TaskInfo::new("train-0", "python3 train.py", "cpus:4;mem:16384;gpus:1".parse().unwrap())
    ///     .with_env("EPOCHS", "3")
    ///     .with_user("alice")
    ///     .with_kill_grace_secs(30)
    ///     .with_gpu_selector(GpuSelector::model("A100").with_min_memory_mib(40_000));
    /// assert_eq!(t.command, CommandInfo::shell("python3 train.py").with_user("alice"));
    /// assert_eq!(t.env["EPOCHS"], "3");
    /// ```
    pub fn new(
        name: impl Into<String>,
        command: impl Into<CommandInfo>,
        resources: Resources,
    ) -> Self {
        TaskInfo {
            task_id: TaskId::random(),
            name: name.into(),
            command: command.into(),
            resources,
            env: BTreeMap::new(),
            kill_grace_secs: None,
            gpu_selector: None,
            container: None,
        }
    }

    /// With this id instead of a random one (a framework that records ids before launching).
    pub fn with_id(mut self, task_id: TaskId) -> Self {
        self.task_id = task_id;
        self
    }

    /// With one more environment variable.
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Run as this Unix user (the master's `run_tasks` ACL must allow it).
    pub fn with_user(mut self, user: impl Into<String>) -> Self {
        self.command.user = Some(user.into());
        self
    }

    /// Seconds between SIGTERM and SIGKILL when it is killed.
    pub fn with_kill_grace_secs(mut self, secs: u32) -> Self {
        self.kill_grace_secs = Some(secs);
        self
    }

    /// Which GPUs its `gpus` may be drawn from.
    pub fn with_gpu_selector(mut self, selector: GpuSelector) -> Self {
        self.gpu_selector = Some(selector);
        self
    }

    /// Run in this container.
    pub fn with_container(mut self, container: ContainerInfo) -> Self {
        self.container = Some(Box::new(container));
        self
    }
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

/// In words, for messages operators read: `model "A100", at least 40960 MiB` (`any GPU` when
/// it asks nothing).
impl std::fmt::Display for GpuSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if let Some(m) = &self.model {
            parts.push(format!("model {m:?}"));
        }
        if let Some(mib) = self.min_memory_mib {
            parts.push(format!("at least {mib} MiB"));
        }
        if let Some(p) = &self.mig_profile {
            parts.push(format!("MIG profile {p}"));
        }
        if !self.uuids.is_empty() {
            const SHOWN: usize = 4;
            let mut s = format!(
                "one of {}",
                self.uuids
                    .iter()
                    .take(SHOWN)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if self.uuids.len() > SHOWN {
                s.push_str(&format!(" and {} more", self.uuids.len() - SHOWN));
            }
            parts.push(s);
        }
        if parts.is_empty() {
            f.write_str("any GPU")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

impl GpuSelector {
    /// The most UUIDs a selector may pin (the master refuses longer lists).
    pub const MAX_UUIDS: usize = 64;

    /// GPUs whose model name contains `model` (case-insensitive; `"A100"`).
    pub fn model(model: impl Into<String>) -> Self {
        GpuSelector {
            model: Some(model.into()),
            ..GpuSelector::default()
        }
    }

    /// And at least this much device memory, MiB.
    pub fn with_min_memory_mib(mut self, mib: u64) -> Self {
        self.min_memory_mib = Some(mib);
        self
    }

    /// And only MIG devices of this profile (`1g.10gb`).
    pub fn with_mig_profile(mut self, profile: impl Into<String>) -> Self {
        self.mig_profile = Some(profile.into());
        self
    }

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
    /// Killed on request with no more said: the framework asked ([`FrameworkToMaster::Kill`]),
    /// tore itself down, or stayed away past its failover timeout.
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
    /// Its framework killed it to make room for other work (a queue preempting lower-priority
    /// jobs; [`FrameworkToMaster::KillFor`]).
    Preempted,
    /// Its framework killed it for running past its time limit ([`FrameworkToMaster::KillFor`]).
    TimeLimit,
    /// Its framework killed it because its deadline passed ([`FrameworkToMaster::KillFor`]).
    Deadline,
    /// Its agent was drained with a deadline and the task was still running when it passed.
    DrainDeadline,
    /// An operator killed it (a teardown of its framework through the operator API).
    OperatorKill,
    /// The agent could not get the task's container image (the registry's error is in the
    /// update's message).
    ImagePullFailed,
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
            TaskReason::Preempted => "preempted",
            TaskReason::TimeLimit => "time-limit",
            TaskReason::Deadline => "deadline",
            TaskReason::DrainDeadline => "drain-deadline",
            TaskReason::OperatorKill => "operator-kill",
            TaskReason::ImagePullFailed => "image-pull-failed",
        }
    }

    /// What a kill for this reason did, in words (the message of the task's `KILLED` update
    /// when the master knows why it asked for the kill); `None` for reasons that are not kills.
    pub fn kill_message(self) -> Option<&'static str> {
        Some(match self {
            TaskReason::KilledByRequest => "killed at its framework's request",
            TaskReason::Preempted => {
                "preempted: its framework killed it to make room for other work"
            }
            TaskReason::TimeLimit => "killed by its framework: it ran past its time limit",
            TaskReason::Deadline => "killed by its framework: its deadline passed",
            TaskReason::DrainDeadline => {
                "killed: its agent was drained and the drain deadline passed"
            }
            TaskReason::OperatorKill => "killed by an operator (its framework was torn down)",
            _ => return None,
        })
    }

    /// The reasons a framework may give when it kills a task ([`FrameworkToMaster::KillFor`]).
    pub fn is_framework_kill(self) -> bool {
        matches!(
            self,
            TaskReason::KilledByRequest
                | TaskReason::Preempted
                | TaskReason::TimeLimit
                | TaskReason::Deadline
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_selectors_and_kill_reasons_read_as_words() {
        assert_eq!(GpuSelector::default().to_string(), "any GPU");
        let sel = GpuSelector {
            min_memory_mib: Some(40960),
            ..GpuSelector::model("A100")
        };
        assert_eq!(sel.to_string(), "model \"A100\", at least 40960 MiB");
        let pinned = GpuSelector {
            uuids: (0..6).map(|i| format!("GPU-{i}")).collect(),
            mig_profile: Some("1g.10gb".into()),
            ..GpuSelector::default()
        };
        assert_eq!(
            pinned.to_string(),
            "MIG profile 1g.10gb, one of GPU-0, GPU-1, GPU-2, GPU-3 and 2 more"
        );
        for r in [
            TaskReason::Preempted,
            TaskReason::TimeLimit,
            TaskReason::Deadline,
            TaskReason::DrainDeadline,
            TaskReason::OperatorKill,
        ] {
            assert!(r.kill_message().is_some(), "{r}");
        }
        assert_eq!(TaskReason::DrainDeadline.as_str(), "drain-deadline");
        assert!(TaskReason::Preempted.is_framework_kill());
        assert!(!TaskReason::DrainDeadline.is_framework_kill());
        assert!(!TaskReason::OperatorKill.is_framework_kill());
        assert!(TaskReason::CommandFailed.kill_message().is_none());
    }

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
