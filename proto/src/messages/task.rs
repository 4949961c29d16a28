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

/// Bounds of a [`ContainerInfo`] (the master refuses a task past them).
pub mod container_limits {
    /// Bytes of an image reference.
    pub const IMAGE: usize = 512;
    /// Volumes of one task.
    pub const VOLUMES: usize = 32;
    /// Bytes of a path (host or container).
    pub const PATH: usize = 1024;
    /// Bytes of a persistent volume's name (`A-Z a-z 0-9 . _ -`, not starting with `.`).
    pub const VOLUME_NAME: usize = 64;
    /// Words of `entrypoint` plus `args`.
    pub const WORDS: usize = 1024;
    /// Bytes of `entrypoint`, `args` and `working_dir` together.
    pub const WORD_BYTES: usize = 64 * 1024;
}

/// A task's container: its root filesystem from an OCI image, run under an OCI runtime with
/// its own pid, mount, ipc and uts namespaces (docs/containers.md). The task's `command` runs
/// in it (a shell string with the image's `/bin/sh`); an empty command runs the image's
/// entrypoint and cmd, or `entrypoint` / `args` when set. The task's `env` is added to the
/// image's.
///
/// ```
/// use gantry_proto::{ContainerInfo, ContainerNetwork, TaskInfo, Volume};
/// let c = ContainerInfo::new("registry.example:5000/pytorch:24.05")
///     .with_volume(Volume::persistent("ckpt", "/ckpt"))
///     .with_volume(Volume::host("/datasets", "/data").read_only())
///     .with_network(ContainerNetwork::None);
/// assert_eq!(c.problem(), None);
/// let t = TaskInfo::new("train", "python3 train.py", "cpus:1;mem:512".parse().unwrap())
///     .with_container(c);
/// assert!(t.container.is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerInfo {
    /// An OCI image reference (`host[:port]/repo[:tag][@sha256:...]`), or `rootfs:NAME`, an
    /// unpacked root filesystem the agent names with `--local-rootfs NAME=DIR`.
    pub image: String,
    /// Mounted into the container, in order.
    pub volumes: Vec<Volume>,
    /// The network namespace (the host's by default, so `ports` keep working).
    pub network: ContainerNetwork,
    /// Replaces the image's entrypoint (with an empty command).
    pub entrypoint: Option<Vec<String>>,
    /// Replaces the image's cmd (with an empty command).
    pub args: Option<Vec<String>>,
    /// Replaces the image's working directory (absolute).
    pub working_dir: Option<String>,
}

/// A container's network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerNetwork {
    /// The host's network namespace (ports work as for tasks without a container).
    #[default]
    Host,
    /// A network namespace of its own with only a loopback device.
    None,
}

/// A volume mounted into a container at `container_path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// Where it appears in the container (absolute, normalized).
    pub container_path: String,
    /// What is mounted there.
    pub source: VolumeSource,
    /// Mounted read-only.
    pub read_only: bool,
}

/// Where a volume comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeSource {
    /// A directory of the agent's host (absolute, normalized; under one of the agent's
    /// `--volume-allow` directories, or the launch fails).
    Host(String),
    /// The framework's persistent volume of this name: created empty (owned by the task's
    /// user) on first use and kept across attempts and agent restarts until destroyed.
    Persistent(String),
}

impl Volume {
    /// The host directory `host_path` at `container_path`, writable.
    pub fn host(host_path: impl Into<String>, container_path: impl Into<String>) -> Self {
        Self {
            container_path: container_path.into(),
            source: VolumeSource::Host(host_path.into()),
            read_only: false,
        }
    }

    /// The framework's persistent volume `name` at `container_path`, writable.
    pub fn persistent(name: impl Into<String>, container_path: impl Into<String>) -> Self {
        Self {
            container_path: container_path.into(),
            source: VolumeSource::Persistent(name.into()),
            read_only: false,
        }
    }

    /// Mounted read-only.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }
}

impl ContainerInfo {
    /// A container from `image`: host network, no volumes, the image's entrypoint.
    pub fn new(image: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            volumes: Vec::new(),
            network: ContainerNetwork::Host,
            entrypoint: None,
            args: None,
            working_dir: None,
        }
    }

    /// With one more volume.
    pub fn with_volume(mut self, volume: Volume) -> Self {
        self.volumes.push(volume);
        self
    }

    /// With this network.
    pub fn with_network(mut self, network: ContainerNetwork) -> Self {
        self.network = network;
        self
    }

    /// What is wrong with it, if anything (checked by the master; [`container_limits`]).
    pub fn problem(&self) -> Option<String> {
        use container_limits as l;
        let image = self.image.as_str();
        if image.is_empty() || image.len() > l::IMAGE {
            return Some(format!(
                "the image reference must be 1 to {} bytes",
                l::IMAGE
            ));
        }
        if image
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Some(format!(
                "the image reference {image:?} has spaces or control characters"
            ));
        }
        if let Some(name) = image.strip_prefix("rootfs:") {
            if !safe_name(name, l::VOLUME_NAME) {
                return Some(format!(
                    "the local root filesystem name {name:?} is not a safe name"
                ));
            }
        }
        if self.volumes.len() > l::VOLUMES {
            return Some(format!(
                "{} volumes: at most {}",
                self.volumes.len(),
                l::VOLUMES
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for v in &self.volumes {
            if let Some(p) = path_problem(&v.container_path) {
                return Some(format!("volume at {:?}: {p}", v.container_path));
            }
            if v.container_path == "/" {
                return Some("a volume cannot be mounted at /".into());
            }
            if !seen.insert(v.container_path.as_str()) {
                return Some(format!("two volumes at {:?}", v.container_path));
            }
            match &v.source {
                VolumeSource::Host(h) => {
                    if let Some(p) = path_problem(h) {
                        return Some(format!("host volume {h:?}: {p}"));
                    }
                }
                VolumeSource::Persistent(n) => {
                    if !safe_name(n, l::VOLUME_NAME) {
                        return Some(format!(
                            "persistent volume name {n:?}: 1 to {} bytes of A-Z a-z 0-9 . _ -, not starting with '.'",
                            l::VOLUME_NAME
                        ));
                    }
                }
            }
        }
        if let Some(w) = &self.working_dir {
            if let Some(p) = path_problem(w) {
                return Some(format!("working directory {w:?}: {p}"));
            }
        }
        let words = self.entrypoint.iter().chain(self.args.iter()).flatten();
        let (count, bytes) = words.fold((0usize, 0usize), |(c, b), w| (c + 1, b + w.len()));
        let bytes = bytes + self.working_dir.as_ref().map_or(0, String::len);
        if count > l::WORDS || bytes > l::WORD_BYTES {
            return Some(format!(
                "entrypoint and args: at most {} words and {} bytes",
                l::WORDS,
                l::WORD_BYTES
            ));
        }
        if self
            .entrypoint
            .iter()
            .chain(self.args.iter())
            .flatten()
            .any(|w| w.contains('\0'))
        {
            return Some("entrypoint and args cannot contain NUL bytes".into());
        }
        None
    }
}

/// `1..=max` bytes of `A-Z a-z 0-9 . _ -`, not starting with `.`.
fn safe_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Why `p` is not an absolute, normalized path (no `.`, `..`, empty components or trailing
/// `/`), if it is not.
fn path_problem(p: &str) -> Option<&'static str> {
    if p.len() > container_limits::PATH {
        return Some("too long");
    }
    if !p.starts_with('/') {
        return Some("not absolute");
    }
    if p.bytes().any(|b| b == 0 || b.is_ascii_control()) {
        return Some("has control characters");
    }
    if p == "/" {
        return None;
    }
    if p[1..]
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Some("not normalized (empty, '.' or '..' components, or a trailing '/')");
    }
    None
}

/// The most tasks one [`TaskGroup`] may hold; the master refuses larger groups.
pub const MAX_GROUP_TASKS: usize = 64;

/// What an agent does with the other members of a [`TaskGroup`] when one ends (applied by the
/// agent, which records it with each member, so it survives an agent restart).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GroupPolicy {
    /// A member that ends other than `FINISHED` (failed, killed, lost, could not start) gets
    /// the others killed (Mesos's default executor). A member that finishes leaves the others
    /// running.
    #[default]
    KillOnFailure,
    /// Any member that ends, also `FINISHED`, gets the others killed: the group stops together
    /// (a server and its load generator, an evaluation gang).
    KillOnAnyEnd,
    /// Each member runs to its own end.
    Independent,
}

/// Several tasks launched atomically on one agent (Mesos `LAUNCH_GROUP`), in an
/// [`Operation::LaunchGroup`]: the master validates the group as a whole (one invalid member
/// refuses every member, nothing is launched or charged) and sends it to the agent as one
/// message; the agent starts all of them or none, gives each member the others' ids and
/// ports (`GANTRY_GROUP_ID`, `GANTRY_GROUP_INDEX`, `GANTRY_GROUP_MEMBERS`,
/// `GANTRY_GROUP_ADDRS`: docs/protocol.md) and applies the group's [`GroupPolicy`].
///
/// ```
/// use gantry_proto::{GroupPolicy, TaskGroup, TaskInfo};
/// let r: gantry_proto::Resources = "cpus:1;mem:512;gpus:2;ports:1".parse().unwrap();
/// let group = TaskGroup::new("eval-1", vec![
///     TaskInfo::new("eval-0", "./serve", r.clone()),
///     TaskInfo::new("eval-1", "./serve", r),
/// ])
/// .with_policy(GroupPolicy::KillOnAnyEnd);
/// assert_eq!(group.resources().to_string(), "cpus:2;gpus:4;mem:1024;ports:2");
/// assert_eq!(group.problem(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskGroup {
    /// Chosen by the framework (1 to 64 bytes of `A-Z a-z 0-9 . _ -`), shown to the members as
    /// `GANTRY_GROUP_ID`.
    pub group_id: String,
    /// The members (1 to [`MAX_GROUP_TASKS`]), in the order of `GANTRY_GROUP_INDEX`.
    pub tasks: Vec<TaskInfo>,
    /// What happens to the others when one member ends.
    pub policy: GroupPolicy,
}

impl TaskGroup {
    /// A group of `tasks` under [`GroupPolicy::KillOnFailure`].
    pub fn new(group_id: impl Into<String>, tasks: Vec<TaskInfo>) -> Self {
        TaskGroup {
            group_id: group_id.into(),
            tasks,
            policy: GroupPolicy::default(),
        }
    }

    /// With another failure policy.
    pub fn with_policy(mut self, policy: GroupPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// What all members ask for together.
    pub fn resources(&self) -> Resources {
        self.tasks
            .iter()
            .fold(Resources::new(), |acc, t| acc.plus(&t.resources))
    }

    /// Why the group is malformed as a group (its id, its size, a task id twice), if it is.
    /// Each member is also checked on its own, as any task.
    pub fn problem(&self) -> Option<String> {
        let id_ok = !self.group_id.is_empty()
            && self.group_id.len() <= 64
            && self
                .group_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !id_ok {
            return Some(format!(
                "group id {:?} is not 1 to 64 bytes of A-Z a-z 0-9 . _ -",
                self.group_id.chars().take(80).collect::<String>()
            ));
        }
        if self.tasks.is_empty() {
            return Some("the group has no task".into());
        }
        if self.tasks.len() > MAX_GROUP_TASKS {
            return Some(format!(
                "the group has {} tasks; at most {MAX_GROUP_TASKS}",
                self.tasks.len()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        self.tasks
            .iter()
            .find(|t| !seen.insert(t.task_id))
            .map(|t| format!("task id {} appears twice in the group", t.task_id))
    }
}

/// One member of a group as the master sends it to the agent
/// ([`MasterToAgent::RunTaskGroup`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupMember {
    /// What to run.
    pub task: TaskInfo,
    /// The GPUs the master chose for it (as in [`MasterToAgent::RunTask`]).
    pub gpus: Vec<String>,
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
