//! The core's configuration, its inputs and its effects (what the runtime feeds it and what it
//! asks the runtime to do), the group-commit decision, and the timing constants of its rules.

use super::*;

/// What the core is configured with (the part of the agent's configuration decisions need).
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub work_dir: PathBuf,
    pub hostname: String,
    pub resources: Resources,
    pub reserved: BTreeMap<String, Resources>,
    pub attributes: Attributes,
    pub task_user: String,
    /// The agent runs as root (it can run tasks as other users).
    pub root: bool,
    pub kill_grace: Duration,
    /// Tasks get cgroups (the isolator has a layout).
    pub isolated: bool,
    /// A GPU agent (NVML is open); `inventory` lists its GPUs.
    pub gpu_agent: bool,
    pub inventory: Vec<DiscoveredGpu>,
    pub gpu_sharing: gpu::share::Sharing,
    pub gpu_memory_enforce: gpu::share::MemoryEnforce,
    pub gpu_recovery_after: Option<Duration>,
    pub cpu_hard_limit: bool,
    pub task_pids_max: Option<u64>,
    pub nvidia_majors: NvidiaMajors,
    pub usage_interval: Duration,
    /// When ended tasks' sandboxes are removed.
    pub gc: gc::GcPolicy,
    /// The host ports tasks asking `ports:K` get theirs from (`--ports`; `resources` holds
    /// its size as `ports`).
    pub ports: Option<PortRange>,
    /// The pool of prepared task cgroups (`--cgroup-pool`; used only when `isolated`).
    pub cgroup_pool: pool::PoolConfig,
    /// How tasks' `disk` is enforced (`--disk-enforcement`).
    pub disk_enforcement: crate::disk::DiskEnforcement,
    /// How often sandboxes of tasks with a `disk` are measured (`--disk-watch-interval`).
    pub disk_watch_interval: Duration,
    /// MPS control daemons run ([`mps`]): `--gpu-sharing mps` on a GPU agent with
    /// `nvidia-cuda-mps-control` installed.
    pub mps: bool,
    /// The first status update id (then counting up): the runtime draws it at random at start,
    /// so ids stay unique across restarts; tests fix it, so runs repeat.
    pub update_id_seed: u128,
}

/// What a task's cgroup said when the task ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CgroupOutcome {
    pub oom_killed: bool,
    pub usage: Option<TaskUsage>,
}

/// What the core reacts to.
#[derive(Debug)]
pub enum Input {
    Connected,
    Disconnected,
    Master(MasterToAgent),
    /// A `RunTask` from the master, with the ports of the range the runtime found it could
    /// not bind just before (only probed for tasks asking for ports).
    RunTask {
        framework_id: FrameworkId,
        task: TaskInfo,
        gpus: Vec<String>,
        unbindable_ports: BTreeSet<u16>,
    },
    /// A `RunTaskGroup` from the master, with the ports of the range the runtime found it
    /// could not bind just before.
    RunTaskGroup {
        framework_id: FrameworkId,
        group_id: String,
        policy: GroupPolicy,
        members: Vec<GroupMember>,
        unbindable_ports: BTreeSet<u16>,
    },
    /// A launch's supervisor started (or the launch failed).
    Launched {
        task: TaskId,
        result: Result<Launched, String>,
    },
    /// A line of a launch's progress (an image pull): a `STARTING` update with it as the
    /// message, while the task is still starting.
    LaunchProgress {
        task: TaskId,
        message: String,
    },
    /// A launched task exited. `outcome`: its cgroup's OOM flag and final usage, read where
    /// the exit was learned (a task this run launched, outside a container); the core then
    /// settles it in this input's batch and releases the cgroup after the batch's commit
    /// ([`Effect::ReleaseCgroup`]). Without it, a task with a cgroup is settled through
    /// [`Effect::Settle`] and [`Input::Settled`].
    Exited {
        task: TaskId,
        status: ExitStatus,
        outcome: Option<CgroupOutcome>,
    },
    /// The task's cgroup has been read and destroyed: the task can be reported terminal.
    Settled {
        task: TaskId,
        status: ExitStatus,
        outcome: CgroupOutcome,
    },
    Sampled {
        tasks: Vec<(TaskId, TaskUsage)>,
        gpus: Vec<GpuSample>,
    },
    GpuFault(GpuFault),
    RecoveryChecked {
        uuid: String,
        passed: bool,
    },
    /// Operator clear requests (GPU uuids, or `all`) found in the work dir.
    ClearGpus(Vec<String>),
    /// What [`Effect::ProbeAdopted`] found of the re-adopted tasks.
    AdoptedProbed(Vec<AdoptedProbe>),
    /// The supervisor of a task this agent launched died (its connection closed without an
    /// exit), with the exit status it recorded, if any.
    SupervisorLost {
        task: TaskId,
        recorded: Option<ExitStatus>,
    },
    /// A spot-termination notice is on disk ([`Effect::ReadTerminationNotice`]).
    TerminationNotice {
        deadline_unix_ms: u64,
        reason: String,
    },
    /// Sandboxes found on disk at start.
    GcScanned(Vec<gc::Ended>),
    /// A garbage collection pass ended (with the disk usage it measured, 0.0 to 1.0).
    GcDone {
        disk_used: Option<f64>,
    },
    /// Time passes: the deadline of [`AgentCore::next_deadline`] came (kill escalation,
    /// heartbeats, retries, samples, recovery checks, polls, MPS restarts, collection).
    Tick,
    /// A GPU's MPS control daemon exited, or could not be started ([`Effect::StartMps`]).
    MpsExited(String),
    /// Of `asked` pool cgroups ([`Effect::PrepareCgroups`]), these are ready.
    CgroupsPrepared {
        asked: usize,
        ready: Vec<String>,
    },
    /// An ended task's cgroup announced with `recycle` in [`Effect::Settle`] or
    /// [`Effect::ReleaseCgroup`] is back in the pool (`Some`), or was removed instead (`None`).
    CgroupRecycled(Option<String>),
    /// A pass of [`Effect::MeasureDisk`] ended: what it read of each sandbox it could open.
    DiskMeasured(Vec<(TaskId, crate::disk::DiskReading)>),
}

/// What the runtime found of one re-adopted task ([`Effect::ProbeAdopted`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AdoptedProbe {
    pub task: TaskId,
    /// Its task group, read when the launch was recorded before the task started.
    pub pgid: Option<i32>,
    /// Its supervisor is gone (or recorded an exit).
    pub gone: bool,
    /// The exit status its supervisor recorded, if any.
    pub recorded: Option<ExitStatus>,
}

/// A launch to perform (the blocking part runs off the loop).
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    pub framework_id: FrameworkId,
    pub task: TaskInfo,
    pub sandbox: PathBuf,
    pub meta: PathBuf,
    pub cgroup_name: String,
    pub limits: Limits,
    pub env: BTreeMap<String, String>,
    /// The user to switch to (looked up at launch), `None` to run as the agent.
    pub user: Option<String>,
    /// A fraction of one GPU: the runtime adds the sharing environment (and its MPS daemon).
    pub share: Option<GpuShare>,
}

/// A fractional GPU share of a launch.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuShare {
    pub uuid: String,
    pub gpus_milli: u64,
    pub memory_mib: u64,
}

/// How a batch's log records are committed ([`AgentCore::end_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Nothing was recorded and nothing leaves.
    None,
    /// Records only: written to the log, made durable by the next synced commit.
    Write,
    /// Written and synced (`fdatasync`) before the batch's messages and launches leave.
    Sync,
}

/// What the effects emitted since the last [`AgentCore::end_batch`] ask of its commit.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// A message or a launch leaves the agent.
    pub(super) leaves: bool,
    /// A log record was written.
    pub(super) records: bool,
}

/// What the runtime does for the core.
#[derive(Debug)]
pub enum Effect {
    /// A message to the master, sent after the batch's log commit.
    Send(AgentToMaster),
    /// A log record, committed (one fsync per batch) before the batch's messages leave.
    Persist(Record),
    /// Starts a task after the commit of its record.
    Launch(Box<LaunchPlan>),
    /// Signals a task's process group.
    Signal { pgid: i32, signal: i32 },
    /// SIGKILLs every process in the task's cgroup.
    KillCgroup(TaskId),
    /// Reopens the cgroup of a re-adopted task.
    AdoptCgroup { task: TaskId, name: String },
    /// The task is terminal: drop its cgroup handle (already destroyed).
    ForgetCgroup(TaskId),
    /// A cgroup made for a task the core no longer knows: destroy it.
    DestroyCgroup(TaskId),
    /// Read the task's cgroup outcome, then report [`Input::Settled`]; then remove the
    /// cgroup, or with `recycle` ready it for the pool and report [`Input::CgroupRecycled`]
    /// (always, also when it had to be removed).
    Settle {
        task: TaskId,
        status: ExitStatus,
        meta: PathBuf,
        cgroup: Option<String>,
        recycle: bool,
    },
    /// A settled task's cgroup (its outcome came with [`Input::Exited`]): after the batch's
    /// synced commit (the task's terminal record is durable before the cgroup's counters are
    /// gone), remove it, or with `recycle` ready it for the pool and report
    /// [`Input::CgroupRecycled`] (always, also when it had to be removed).
    ReleaseCgroup {
        task: TaskId,
        cgroup: String,
        recycle: bool,
    },
    /// Make these empty pool cgroups, then report [`Input::CgroupsPrepared`].
    PrepareCgroups(Vec<String>),
    /// Remove these ready pool cgroups (the pool was idle; they left it already).
    RemoveCgroups(Vec<String>),
    /// Sample these tasks (id, process group, GPUs) and the GPUs, then report
    /// [`Input::Sampled`].
    Sample(Vec<(TaskId, i32, Vec<String>)>),
    /// Publish `/metrics` with these task usages.
    PublishMetrics(Vec<(TaskId, TaskUsage)>),
    /// Run a GPU recovery check, then report [`Input::RecoveryChecked`].
    CheckRecovery(String),
    /// A master accepted this agent: remove task cgroups nobody owns.
    CleanupCgroups,
    /// Remove these tasks' sandboxes, measure the disk, then report [`Input::GcDone`].
    CollectGarbage(Vec<TaskId>),
    /// Measure these tasks' sandboxes (a bounded pass of [`crate::disk::DuWalk`]s, going on
    /// with the walks an earlier pass left unfinished), then report [`Input::DiskMeasured`].
    MeasureDisk(Vec<(TaskId, PathBuf)>),
    /// Probe these re-adopted tasks (not the agent's children: their supervisors are polled),
    /// then report [`Input::AdoptedProbed`].
    ProbeAdopted(Vec<(TaskId, Launched, PathBuf)>),
    /// Read the termination notice file and report [`Input::TerminationNotice`] if there is one.
    ReadTerminationNotice,
    /// Remove the termination notice file (long past its deadline).
    RemoveTerminationNotice,
    /// Take the operator's GPU clear requests from the work dir and report
    /// [`Input::ClearGpus`] if there are any.
    ReadClearRequests,
    /// Start the MPS control daemon of this GPU (report [`Input::MpsExited`] when it ends or
    /// cannot start).
    StartMps(String),
    /// The master refused this agent: stop.
    Stop(String),
}

/// How often re-adopted tasks' supervisors are probed.
pub const ADOPTED_PROBE_MS: u64 = 200;
/// A re-adopted task whose supervisor is gone without recording an exit ends with an unknown
/// status, once the agent has run this long (a record may still be on its way at start).
pub const NO_EXIT_RECORD_MS: u64 = 1000;
/// How often the files operators and hooks drop (termination notice, GPU clear requests) are
/// read.
pub const FILE_POLL_MS: u64 = 1000;
/// A termination notice this long past its deadline is stale (the host was not taken after all)
/// and removed.
pub const NOTICE_STALE_MS: u64 = 60_000;
/// How often a process group past its kill grace is SIGKILLed again.
pub const KILL_REPEAT_MS: u64 = 200;
