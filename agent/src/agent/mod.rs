//! The agent's runtime: the thin tokio shell around the pure [`crate::core::AgentCore`], like
//! the master's `server` around its `state`. One loop owns the core and the I/O handles (the
//! write-ahead log, the master session's sender, live task cgroups, MPS daemons, `/metrics`);
//! it feeds the core [`Input`]s with the time, performs the [`Effect`]s it returns, and sleeps
//! until the core's [`AgentCore::next_deadline`] or the next input (there is no fixed tick: a
//! `Tick` input means the deadline came). The master session ([`crate::session`]), the
//! launches, the NVML health watcher, the MPS daemons' exit watchers and the blocking helpers
//! (cgroup settlement, sampling, measuring sandboxes for disk limits, recovery checks, sandbox
//! garbage collection) send it core [`Input`]s; what only the runtime uses (a task's cgroup,
//! unfinished sandbox walks, a finished compaction) comes as a `Resource` before its input,
//! and each master connection's outbox before its `Connected`. The runtime decides nothing
//! about tasks: it only probes (the ports a task asks for, the re-adopted tasks' supervisors,
//! the files operators drop) and reports. The one loop's turns and effect dispatch are
//! here; the start (the core's configuration, the recovery probe, [`run`]) is in `start`,
//! the commit pipeline in `commit`, launching and the blocking helpers in `launch` and
//! `blocking`.)
//!
//! Persistence is a write-ahead log with group commit ([`crate::wal`]): the loop handles every
//! input already waiting, appends the records the core asked to persist, and commits the batch
//! as the core decides ([`AgentCore::end_batch`]: one `fdatasync` when anything leaves, a plain
//! write for acknowledgements), and only then sends the messages and starts the launches the
//! batch produced (`Agent::commit`). The sync runs off the loop (the commit pipeline: one at a
//! time, each covering the frames written before it began; `Resource::Synced` releases what
//! its batches held back), so the loop handles the next inputs while the disk works. Syncs
//! start at least [`AgentConfig::commit_gap`] apart, and while one is due the batches'
//! records wait in memory and are written as one frame just before it starts.
//!
//! Task life, forward (docs/gpu-agent.md, "One task, walked through"): `RunTask` (ports probed
//! here) → the core records it with its GPUs, ports and cgroup name *before* the launch creates
//! the cgroup, so a restarted agent knows everything it may have created → commit → `launch`
//! (user, cgroup, directories on a blocking thread; the supervisor process starts it, the task
//! joining its cgroups between `clone` and `exec`) → `Launched` → `Exited`, carrying the OOM
//! flag and final usage the launch read from the task's cgroup where it learned the exit →
//! terminal in that batch → after its synced commit the cgroup is released
//! (`Effect::ReleaseCgroup`): an empty one goes back to the pool or is removed (one with
//! processes left in it was removed before the exit was reported, its outcome in the launch
//! record). A container task, or one re-adopted after a restart, settles through `Settle` (a
//! blocking thread) and `Settled`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gantry_proto::*;
use gantry_transport::{tls, PeerIdentity};
use tokio::sync::mpsc;

use crate::core::{
    AdoptedProbe, AgentCore, Commit, CoreConfig, Effect, Input, PortRange, RecoveryProbe,
};
use crate::discovery::NvmlGpus;
use crate::executor;
use crate::executor::user;
use crate::gc::{self, GcPolicy};
use crate::gpu;
use crate::isolation::{Isolator, NvidiaMajors, TaskCgroup};
use crate::session;
use crate::wal::{self, Wal};

/// Directory (under the work dir) where `gantry-agent clear-gpu` drops clear requests.
pub const CLEAR_DIR: &str = "gpu-clear";

/// Everything the agent is configured with.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Master addresses (`host:port`); the agent follows redirects to the leader.
    pub masters: Vec<String>,
    pub work_dir: PathBuf,
    pub tls_dir: PathBuf,
    /// The agent's name: the identity in its certificate.
    pub name: String,
    pub hostname: String,
    /// Unreserved resources advertised (with `gpus` = the GPUs found, before health).
    pub resources: Resources,
    /// Statically reserved resources per role (on top of `resources`).
    pub reserved: BTreeMap<String, Resources>,
    pub attributes: Attributes,
    /// Default SIGTERM-to-SIGKILL grace period.
    pub kill_grace: Duration,
    /// The agent binary: each task's supervisor is `gantry-supervise` beside it, or it
    /// re-executed as `gantry-agent supervise` when that is not installed.
    pub agent_exe: PathBuf,
    /// Task isolation (cgroups v1/v2, or none).
    pub isolator: Isolator,
    /// NVML and its GPUs; `None` on a CPU agent.
    pub gpus: Option<Arc<NvmlGpus>>,
    /// Enforce each task's `cpus` as a hard CFS quota.
    pub cpu_hard_limit: bool,
    /// `pids.max` of every task cgroup.
    pub task_pids_max: Option<u64>,
    /// How often GPUs and task cgroups are sampled.
    pub usage_interval: Duration,
    /// With a value, an unhealthy GPU is re-checked this long after its last fault.
    pub gpu_recovery_after: Option<Duration>,
    /// Device majors of the NVIDIA driver (for the device allow lists).
    pub nvidia_majors: NvidiaMajors,
    /// The user tasks run as when their command names none (`--task-user`). An agent that is
    /// not root runs every task as itself, so this must then be its own user.
    pub task_user: String,
    /// How tasks holding fractions of one GPU share it (`--gpu-sharing`).
    pub gpu_sharing: gpu::share::Sharing,
    /// What happens to a task over its GPU-memory share (`--gpu-memory-enforce`).
    pub gpu_memory_enforce: gpu::share::MemoryEnforce,
    /// When ended tasks' sandboxes are removed (`--gc-delay`, `--gc-disk-headroom`,
    /// `--gc-keep`).
    pub gc: GcPolicy,
    /// Log size past which the write-ahead log is compacted into a snapshot
    /// (`--wal-compact-bytes`, default [`wal::COMPACT_BYTES`]).
    pub wal_compact_bytes: u64,
    /// The least time between the starts of two syncs of the write-ahead log
    /// (`--commit-gap-ms`, default [`COMMIT_GAP`]): the batches handled in between share the
    /// later sync (group commit across batches), at the cost of holding what they send and
    /// launch that much longer at most.
    pub commit_gap: Duration,
    /// A corrupt frame in the middle of the write-ahead log drops everything from it on
    /// (`--recover-truncate`) instead of stopping the agent ([`wal::Recovery`]).
    pub recover_truncate: bool,
    /// The pool of prepared task cgroups: (low, high) water marks (`--cgroup-pool`; high 0: off).
    pub cgroup_pool: (usize, usize),
    /// Serve `GET /metrics` (Prometheus) on this address ([`crate::metrics`]).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The host ports tasks asking `ports:K` get theirs from (`--ports`); `resources` holds
    /// its size as `ports`.
    pub ports: Option<PortRange>,
    /// How tasks' `disk` is enforced (`--disk-enforcement`, [`crate::disk`]).
    pub disk_enforcement: crate::disk::DiskEnforcement,
    /// How often the sandboxes of tasks with a `disk` are measured (`--disk-watch-interval`).
    pub disk_watch_interval: Duration,
    /// Container tasks: the OCI runtime, local root filesystems, volumes, CDI directories
    /// ([`crate::container`]).
    pub containers: Arc<crate::container::ContainerConfig>,
    /// The image store container tasks' registry images come from (`--image-dir`, ...).
    pub images: Option<Arc<gantry_image::ImageStore>>,
}

/// What the session and the blocking helpers hand the runtime itself beside the core's
/// [`Input`]s: I/O handles and completions the core never sees. Each is sent before the input
/// it goes with, and the loop takes every waiting one before it handles an input.
#[derive(Debug)]
pub(crate) enum Resource {
    /// The cgroup of a started task (before its [`Input::Launched`]).
    Cgroup(TaskId, Box<TaskCgroup>),
    /// Sandbox walks a disk pass left unfinished (before its [`Input::DiskMeasured`]).
    DiskWalks(Vec<(TaskId, crate::disk::DuWalk)>),
    /// A background snapshot of the state (log compaction) is written, or failed.
    Compacted(Result<(), String>),
    /// The log's sync started by a commit is done ([`wal::SyncJob`]), or failed: what it
    /// held back may leave.
    Synced(Result<wal::Synced, String>),
}

/// The two ways into the runtime loop: the core's inputs and the runtime's own resources.
#[derive(Debug, Clone)]
pub(crate) struct Senders {
    pub(crate) inputs: mpsc::UnboundedSender<Input>,
    pub(crate) resources: mpsc::UnboundedSender<Resource>,
}

impl Senders {
    /// Sends an input (the loop may be gone at shutdown: nothing to do then).
    pub(crate) fn input(&self, input: Input) {
        let _ = self.inputs.send(input);
    }

    pub(crate) fn resource(&self, resource: Resource) {
        let _ = self.resources.send(resource);
    }
}

/// A launch waiting for the commit of the records that announce it.
type PendingLaunch = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The core's clock: Unix milliseconds.
fn unix_ms() -> u64 {
    gc::now_ms()
}

struct Agent {
    config: AgentConfig,
    core: AgentCore,
    wal: Wal,
    /// Messages to the master, sent after the next commit.
    outbox: Vec<AgentToMaster>,
    /// Launches started after the next commit.
    launches: Vec<PendingLaunch>,
    /// Launches started by this run (for the log's syncs per task at shutdown).
    launches_started: u64,
    /// Cgroups of settled tasks, released after the next commit ([`Effect::ReleaseCgroup`]):
    /// the handle (if the task's cgroup could be found) and whether the pool takes it back.
    releases: Vec<(Option<TaskCgroup>, bool)>,
    /// The commit pipeline: what the batches covered by the running sync of the log hold back
    /// (`None`: no sync runs)...
    syncing: Option<Held>,
    /// ...and what later batches hold back, for the sync after it.
    waiting: Held,
    /// When the running (or last) sync of the log started: the next starts
    /// [`AgentConfig::commit_gap`] after it at the earliest...
    sync_started: Option<Instant>,
    /// ...and when a sync is due but waits for that gap, the time it starts (the loop wakes
    /// for it).
    sync_at: Option<Instant>,
    /// A background snapshot is being written.
    compacting: bool,
    master: Option<mpsc::UnboundedSender<AgentToMaster>>,
    /// Outboxes of master connections, each sent before its [`Input::Connected`].
    outboxes: mpsc::UnboundedReceiver<session::Outbox>,
    tx: Senders,
    /// Cgroups of live tasks.
    cgroups: HashMap<TaskId, TaskCgroup>,
    /// Those of them this run's launches made (not reopened after a restart): no earlier
    /// incarnation can have recorded an outcome or a baseline for them, so settling reads
    /// neither file.
    fresh_cgroups: HashSet<TaskId>,
    /// MPS control daemons (`--gpu-sharing mps` on a GPU agent).
    mps: Option<gpu::mps::MpsDaemons>,
    /// The supervisor process that starts and reaps the tasks.
    supervisor: Arc<executor::client::SupervisorClient>,
    /// Task users resolved for recent launches (one NSS look-up per user per burst).
    users: Arc<user::UserCache>,
    /// What `/metrics` shows (published after each usage sample).
    metrics: crate::metrics::AgentMetrics,
    /// Closed at shutdown: no pool cgroup is made or returned to the pool after that.
    pool_gate: Arc<PoolGate>,
    /// Sandbox walks an earlier pass left unfinished ([`Effect::MeasureDisk`]).
    disk_walks: HashMap<TaskId, crate::disk::DuWalk>,
}

/// Serializes making and returning pool cgroups with the drain at shutdown: after
/// [`PoolGate::close`] every such job removes what it would have pooled, so nothing is left.
#[derive(Debug, Default)]
pub(crate) struct PoolGate {
    closed: std::sync::Mutex<bool>,
}

impl PoolGate {
    /// Runs `f` with the gate held, if it is still open.
    pub(crate) fn while_open<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        let closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        (!*closed).then(f)
    }

    fn close(&self) {
        *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }
}

/// Whether a TCP port can be bound right now on all IPv4 addresses (any failure: a task
/// could not either) and on all IPv6 addresses (only "in use" counts: a host without IPv6
/// still has the port). The sockets close at once.
fn port_bindable(port: u16) -> bool {
    use std::net::{Ipv4Addr, Ipv6Addr, TcpListener};
    if TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_err() {
        return false;
    }
    !matches!(
        TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse
    )
}

/// Inputs handled (at most) per commit.
const MAX_BATCH: usize = 4096;

/// The default least time between the starts of two syncs of the log ([`AgentConfig::commit_gap`]).
pub const COMMIT_GAP: Duration = Duration::from_millis(5);

/// The longest the loop sleeps without an input, whatever the core's deadline.
const MAX_SLEEP: Duration = Duration::from_secs(5);

mod blocking;
mod commit;
mod launch;
mod start;

use commit::Held;

pub use start::run;

use blocking::{
    destroy_cgroup, measure_disk, prepare_cgroups, release_cgroup, sample, settle_cgroup,
};

impl Agent {
    /// For a task asking for `ports:K`: the ports of the range no task holds that cannot be
    /// bound right now (a process outside Gantry has them), probed lowest first until K
    /// bindable ones are found. Each probe binds and closes TCP sockets on all addresses:
    /// syscalls, not waits, so it runs on the loop.
    fn unbindable_ports(&self, task: &TaskInfo) -> BTreeSet<u16> {
        let k = match crate::core::ports::wanted(task.resources.milli("ports")) {
            Ok(k) if k > 0 => k,
            _ => return BTreeSet::new(),
        };
        let busy = crate::core::ports::probe(&self.core.free_ports(), k, port_bindable);
        if !busy.is_empty() {
            tracing::info!(?busy, "ports of the range in use outside Gantry; skipped");
        }
        busy
    }

    /// Feeds one input to the core and performs its effects.
    fn input(&mut self, input: Input) -> anyhow::Result<()> {
        let effects = self.core.handle(input, unix_ms());
        self.perform(effects)
    }

    /// Takes a resource the session or a helper handed over.
    fn resource(&mut self, res: Resource) -> anyhow::Result<()> {
        match res {
            Resource::Synced(result) => {
                let done = result
                    .map_err(|e| anyhow::anyhow!(e))
                    .context("syncing the agent's write-ahead log")?;
                self.wal.synced(done);
                if let Some(held) = self.syncing.take() {
                    self.release(held);
                }
                self.start_sync()?;
            }
            Resource::Cgroup(task, cg) => {
                self.fresh_cgroups.insert(task);
                self.cgroups.insert(task, *cg);
            }
            Resource::DiskWalks(walks) => self.disk_walks.extend(walks),
            Resource::Compacted(result) => {
                self.compacting = false;
                match result {
                    Ok(()) => tracing::info!(
                        generation = self.core.checkpoint().log_gen,
                        "compacted the agent's log"
                    ),
                    // The logs stay: nothing is lost, the next compaction tries again.
                    Err(e) => tracing::warn!("compacting the agent's log: {e}"),
                }
            }
        }
        Ok(())
    }

    /// Handles one input: first the resources handed over before it, then what the runtime
    /// itself does on it (the connection's outbox, `/metrics` XID counts, probing the ports a
    /// task asks for), then the core.
    fn handle(
        &mut self,
        input: Input,
        resources: &mut mpsc::UnboundedReceiver<Resource>,
    ) -> anyhow::Result<()> {
        while let Ok(res) = resources.try_recv() {
            self.resource(res)?;
        }
        match &input {
            Input::Launched { task, .. } => tracing::debug!(%task, "launched"),
            Input::Exited { task, outcome, .. } => {
                tracing::debug!(%task, settled = outcome.is_some(), "exited")
            }
            Input::Settled { task, .. } => tracing::debug!(%task, "settled"),
            Input::Master(MasterToAgent::RunTask { task, .. }) => {
                tracing::debug!(task = %task.task_id, "run task")
            }
            Input::Connected => {
                self.master = self.outboxes.try_recv().ok();
                // Whatever was queued for the previous connection: Register goes first.
                self.drop_queued_messages();
            }
            Input::Disconnected => {
                self.master = None;
                self.drop_queued_messages();
            }
            Input::GpuFault(fault) => {
                if let gpu::FaultKind::Xid(x) = fault.kind {
                    self.metrics.record_xid(&fault.uuid, x);
                }
            }
            _ => {}
        }
        let input = match input {
            Input::Master(MasterToAgent::RunTask {
                framework_id,
                task,
                gpus,
            }) => {
                let unbindable_ports = self.unbindable_ports(&task);
                Input::RunTask {
                    framework_id,
                    task,
                    gpus,
                    unbindable_ports,
                }
            }
            Input::Master(MasterToAgent::RunTaskGroup {
                framework_id,
                group_id,
                policy,
                members,
            }) => {
                // The ports of all members together, probed at once.
                let k: usize = members
                    .iter()
                    .filter_map(|m| {
                        crate::core::ports::wanted(m.task.resources.milli("ports")).ok()
                    })
                    .sum();
                let unbindable_ports = if k == 0 {
                    BTreeSet::new()
                } else {
                    crate::core::ports::probe(&self.core.free_ports(), k, port_bindable)
                };
                Input::RunTaskGroup {
                    framework_id,
                    group_id,
                    policy,
                    members,
                    unbindable_ports,
                }
            }
            input => input,
        };
        self.input(input)
    }

    /// Performs the core's effects (messages and launches wait for the next commit).
    fn perform(&mut self, effects: Vec<Effect>) -> anyhow::Result<()> {
        for effect in effects {
            match effect {
                Effect::Send(msg) => {
                    if self.master.is_some() {
                        self.outbox.push(msg);
                    }
                }
                Effect::Persist(record) => self.wal.append(record),
                Effect::Launch(plan) => self.launch(*plan),
                Effect::Signal { pgid, signal } => executor::signal_group(pgid, signal),
                Effect::KillCgroup(task) => {
                    if let Some(cg) = self.cgroups.get(&task).cloned() {
                        tokio::task::spawn_blocking(move || {
                            if let Err(e) = cg.kill_all() {
                                tracing::warn!(task = cg.task_id(), "killing the task cgroup: {e}");
                            }
                        });
                    }
                }
                Effect::AdoptCgroup { task, name } => match self.config.isolator.reopen(&name) {
                    Ok(cg) => {
                        self.cgroups.insert(task, cg);
                    }
                    Err(e) => tracing::warn!(task = %task, "task cgroup not found: {e}"),
                },
                Effect::ForgetCgroup(task) => {
                    self.fresh_cgroups.remove(&task);
                    self.cgroups.remove(&task);
                }
                Effect::DestroyCgroup(task) => {
                    self.fresh_cgroups.remove(&task);
                    if let Some(cg) = self.cgroups.remove(&task) {
                        tokio::task::spawn_blocking(move || cg.destroy());
                    }
                }
                Effect::Settle {
                    task,
                    status,
                    meta,
                    cgroup,
                    recycle,
                } => {
                    let fresh = self.fresh_cgroups.remove(&task);
                    let cg = self.cgroups.remove(&task).or_else(|| {
                        cgroup
                            .as_deref()
                            .and_then(|n| self.config.isolator.reopen(n).ok())
                    });
                    let tx = self.tx.clone();
                    let gate = self.pool_gate.clone();
                    let containers = self.config.containers.clone();
                    tokio::task::spawn_blocking(move || {
                        let outcome = settle_cgroup(cg.as_ref(), &meta, fresh);
                        tx.input(Input::Settled {
                            task,
                            status,
                            outcome,
                        });
                        // A container's runtime state, root filesystem mount and bundle, after
                        // its terminal update is on its way (what a crash in between leaves is
                        // swept at startup: `container::sweep_ended`); before its cgroup goes
                        // back to the pool (the runtime's `ctr` child is removed here).
                        crate::container::cleanup(&containers, &meta, task);
                        release_cgroup(cg, recycle, &gate, &tx);
                    });
                }
                Effect::ReleaseCgroup {
                    task,
                    cgroup,
                    recycle,
                } => {
                    self.fresh_cgroups.remove(&task);
                    let cg = self
                        .cgroups
                        .remove(&task)
                        .or_else(|| self.config.isolator.reopen(&cgroup).ok());
                    self.releases.push((cg, recycle));
                }
                Effect::RemoveCgroups(names) => {
                    let iso = self.config.isolator.clone();
                    tokio::task::spawn_blocking(move || {
                        for name in names {
                            if let Ok(cg) = iso.reopen(&name) {
                                destroy_cgroup(&cg);
                            }
                        }
                    });
                }
                Effect::PrepareCgroups(names) => {
                    let iso = self.config.isolator.clone();
                    let tx = self.tx.clone();
                    let gate = self.pool_gate.clone();
                    tokio::task::spawn_blocking(move || {
                        let asked = names.len();
                        let ready = prepare_cgroups(&iso, names, &gate);
                        tx.input(Input::CgroupsPrepared { asked, ready });
                    });
                }
                Effect::Sample(tasks) => {
                    let snapshot: Vec<(TaskId, Option<TaskCgroup>, i32, Vec<String>)> = tasks
                        .into_iter()
                        .map(|(id, pgid, gpus)| (id, self.cgroups.get(&id).cloned(), pgid, gpus))
                        .collect();
                    let gpus = self.config.gpus.clone();
                    let tx = self.tx.clone();
                    tokio::task::spawn_blocking(move || {
                        let (tasks, gpus) = sample(gpus.as_deref(), &snapshot);
                        tx.input(Input::Sampled { tasks, gpus });
                    });
                }
                Effect::PublishMetrics(usage) => self.publish_metrics(&usage),
                Effect::CheckRecovery(uuid) => {
                    if let Some(gpus) = self.config.gpus.clone() {
                        let tx = self.tx.clone();
                        tokio::task::spawn_blocking(move || {
                            let passed = gpus.recovery_check(&uuid);
                            tx.input(Input::RecoveryChecked { uuid, passed });
                        });
                    }
                }
                Effect::CleanupCgroups => self.cleanup_cgroups(),
                Effect::CollectGarbage(due) => {
                    let dir = self.config.work_dir.clone();
                    let tx = self.tx.clone();
                    tokio::task::spawn_blocking(move || {
                        if !due.is_empty() {
                            let removed = gc::remove(&dir, &due);
                            tracing::debug!(removed, "removed the sandboxes of ended tasks");
                        }
                        tx.input(Input::GcDone {
                            disk_used: gc::disk_used(&dir),
                        });
                    });
                }
                Effect::MeasureDisk(tasks) => {
                    // Walks of tasks no longer measured (ended, being killed) are dropped.
                    let mut earlier = std::mem::take(&mut self.disk_walks);
                    let tasks: Vec<_> = tasks
                        .into_iter()
                        .map(|(id, sandbox)| {
                            let walk = earlier.remove(&id);
                            (id, sandbox, walk)
                        })
                        .collect();
                    let tx = self.tx.clone();
                    tokio::task::spawn_blocking(move || {
                        let (readings, walks) = measure_disk(tasks);
                        tx.resource(Resource::DiskWalks(walks));
                        tx.input(Input::DiskMeasured(readings));
                    });
                }
                Effect::ProbeAdopted(tasks) => {
                    // /proc reads and small files: syscalls, not waits, so on the loop.
                    let probes = tasks
                        .into_iter()
                        .map(|(task, l, meta)| {
                            let gone = !executor::still_running(&l, &meta);
                            AdoptedProbe {
                                task,
                                pgid: (l.task_pgid == 0)
                                    .then(|| executor::read_task_pgid(&meta))
                                    .flatten(),
                                gone,
                                recorded: gone.then(|| executor::read_exit(&meta)).flatten(),
                            }
                        })
                        .collect();
                    self.tx.input(Input::AdoptedProbed(probes));
                }
                Effect::ReadTerminationNotice => {
                    if let Some(n) = crate::termination::read(&self.config.work_dir) {
                        self.tx.input(Input::TerminationNotice {
                            deadline_unix_ms: n.deadline_unix_ms,
                            reason: n.reason,
                        });
                    }
                }
                Effect::RemoveTerminationNotice => {
                    crate::termination::remove(&self.config.work_dir)
                }
                Effect::ReadClearRequests => {
                    let names = read_clear_requests(&self.config.work_dir);
                    if !names.is_empty() {
                        self.tx.input(Input::ClearGpus(names));
                    }
                }
                Effect::StartMps(uuid) => {
                    let tx = self.tx.clone();
                    let gpu = uuid.clone();
                    let started = self
                        .mps
                        .as_mut()
                        .map(|m| m.start(&uuid, move || tx.input(Input::MpsExited(gpu))));
                    if let Some(Err(e)) = started {
                        tracing::warn!(gpu = %uuid, "MPS control daemon: {e}");
                        self.tx.input(Input::MpsExited(uuid));
                    }
                }
                Effect::Stop(message) => anyhow::bail!(message),
            }
        }
        Ok(())
    }

    /// Destroys the task cgroups under our root that no live task of ours needs. A busy cgroup
    /// this checkpoint has never heard of is someone else's (another agent sharing the root)
    /// and is left alone.
    fn cleanup_cgroups(&self) {
        let iso = &self.config.isolator;
        if iso.layout().is_none() {
            return;
        }
        let tasks = &self.core.checkpoint().tasks;
        let mut keep: Vec<String> = tasks
            .values()
            .filter(|t| !t.state.is_terminal() && t.launched.is_some())
            .filter_map(|t| t.cgroup.clone())
            .collect();
        let ours: HashSet<&str> = tasks.values().filter_map(|t| t.cgroup.as_deref()).collect();
        let agent_prefix = crate::core::pool::agent_prefix(&self.config.work_dir);
        let run_prefix = self.core.pool().prefix();
        let pooled = |id: &str| {
            use crate::core::pool::{classify, SlotKind};
            matches!(
                classify(id, &agent_prefix, run_prefix),
                SlotKind::Current | SlotKind::Foreign
            )
        };
        match iso.list() {
            Ok(ids) => {
                for id in ids {
                    // This run's pool manages its own; another agent's pool is not ours; an
                    // earlier run's is removed unless a live task holds it.
                    if pooled(&id) {
                        continue;
                    }
                    if ours.contains(id.as_str()) || keep.contains(&id) {
                        continue;
                    }
                    let busy = iso
                        .reopen(&id)
                        .and_then(|cg| cg.pids())
                        .is_ok_and(|p| !p.is_empty());
                    if busy {
                        tracing::warn!(cgroup = %id, "leaving a busy task cgroup this agent does not know (another agent on the same --cgroup-root?)");
                        keep.push(id);
                    }
                }
            }
            Err(e) => tracing::warn!("listing task cgroups: {e}"),
        }
        // (Pool cgroups made since the listing above are this run's: kept by their name.)
        match iso.cleanup_unless(|id| pooled(id) || keep.iter().any(|k| k == id)) {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(
                    ?removed,
                    "removed task cgroups left from before the restart"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::error!("removing orphan task cgroups: {e}"),
        }
    }

    /// Publishes what `/metrics` shows after a usage sample ([`crate::metrics`]).
    fn publish_metrics(&self, usage: &[(TaskId, TaskUsage)]) {
        let ckpt = self.core.checkpoint();
        let inventory = self
            .config
            .gpus
            .as_ref()
            .map(|g| g.inventory().gpus.as_slice())
            .unwrap_or(&[]);
        let mut snapshot = crate::metrics::snapshot(
            &self.config.hostname,
            inventory,
            self.core.last_gpu_samples(),
            |uuid| self.core.health().is_healthy(uuid),
            &ckpt.tasks,
            usage,
        );
        snapshot.status_update_retries = ckpt.updates.retries();
        snapshot.status_updates_pending = ckpt.updates.len();
        snapshot.cgroup_pool_ready = self.core.pool().ready();
        self.metrics.publish(snapshot);
    }
}

/// Takes the operator's clear requests dropped by `gantry-agent clear-gpu` (removing them).
fn read_clear_requests(work_dir: &std::path::Path) -> Vec<String> {
    let dir = work_dir.join(CLEAR_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            continue;
        }
        if let Err(err) = std::fs::remove_file(e.path()) {
            tracing::warn!("removing clear request {}: {err}", e.path().display());
        }
        names.push(name);
    }
    names
}
