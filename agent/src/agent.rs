//! The agent's event loop: one task owns the agent's state (tasks, GPU assignments and health,
//! task cgroups, the update queue, the checkpoint) and reacts to master messages, task exits,
//! GPU faults and timer ticks. The master session ([`crate::session`]), the task watchers, the
//! NVML health watcher and blocking helpers (launches, cgroup teardown, sampling, sandbox
//! garbage collection) only send it events.
//!
//! Persistence is a write-ahead log with group commit ([`crate::wal`]): the loop handles every
//! event already waiting, records what changed (changed tasks through `dirty`, queued and
//! acknowledged updates, GPU health, the agent id), commits the batch with one `fdatasync`, and
//! only then sends the messages and starts the launches the batch produced (`Agent::commit`).
//!
//! Task life: the launch assigns GPUs (topology-aware, [`crate::gpu::assign`](fn@crate::gpu::assign)) and checkpoints
//! them with the task's cgroup name *before* creating the cgroup, so a restarted agent knows
//! everything it may have created. The task joins its cgroup between `fork` and `exec` (the
//! supervisor writes `0` to each `cgroup.procs`). When it ends, the OOM flag and final usage are
//! read, recorded in the sandbox, and the cgroup is destroyed before the terminal update is
//! queued; the GPUs are free once the task is terminal.
//!
//! Over 800 lines: the agent's loop still holds task lifecycle, GPU health and recovery together;
//! issue 13 splits it into a pure `AgentCore` plus a thin runtime.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use gantry_sdk::protocol::codec;
use gantry_sdk::protocol::resources::MILLI;
use gantry_sdk::protocol::*;
use gantry_sdk::transport::{tls, PeerIdentity};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::checkpoint::{Checkpoint, TaskRecord};
use crate::discovery::NvmlGpus;
use crate::executor::user::{self, TaskUser};
use crate::executor::{self, ExitStatus, LaunchSpec, Launched};
use crate::gc::{self, GcPolicy};
use crate::gpu::{self, GpuFault, GpuSlot, HealthChange, HealthTracker};
use crate::isolation::{DeviceRule, Isolator, Limits, NvidiaMajors, TaskCgroup};
use crate::session;
use crate::wal::{self, Record, Wal};

/// Directory (under the work dir) where `gantry-agent clear-gpu` drops clear requests.
pub const CLEAR_DIR: &str = "gpu-clear";

/// File in a task's meta directory recording its cgroup's final OOM flag and usage, written
/// before the cgroup is destroyed (so a restarted agent still reports the real outcome).
const FINAL_FILE: &str = "cgroup-final.json";

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
    /// Serve `GET /metrics` (Prometheus) on this address ([`crate::metrics`]).
    pub metrics_listen: Option<std::net::SocketAddr>,
}

/// What a task's cgroup said when the task ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct CgroupOutcome {
    oom_killed: bool,
    usage: Option<TaskUsage>,
}

/// Events the core loop reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    Connected(mpsc::UnboundedSender<AgentToMaster>),
    Disconnected,
    Master(MasterToAgent),
    Launched {
        task: TaskId,
        /// The task's cgroup (`None` when the launch failed: it destroyed the cgroup first).
        cgroup: Option<TaskCgroup>,
        result: Result<Launched, String>,
    },
    Exited {
        task: TaskId,
        status: ExitStatus,
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
    /// A background snapshot of the state (log compaction) is written, or failed.
    Compacted(Result<(), String>),
    /// Sandboxes found on disk at start.
    GcScanned(Vec<gc::Ended>),
    /// A garbage collection pass ended (with the disk usage it measured).
    GcDone {
        disk_used: Option<f64>,
    },
}

/// A launch waiting for the commit of the records that announce it.
type PendingLaunch = Pin<Box<dyn Future<Output = ()> + Send>>;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

struct Agent {
    config: AgentConfig,
    /// The checkpointed state; every change to it is also recorded in `wal` (tasks through
    /// `dirty`) and committed before the messages and launches it protects leave the agent.
    ckpt: Checkpoint,
    wal: Wal,
    /// Tasks whose record changed since the last commit.
    dirty: HashSet<TaskId>,
    /// Messages to the master, sent after the next commit.
    outbox: Vec<AgentToMaster>,
    /// Launches started after the next commit.
    launches: Vec<PendingLaunch>,
    /// A background snapshot is being written.
    compacting: bool,
    master: Option<mpsc::UnboundedSender<AgentToMaster>>,
    registered: bool,
    /// The last `Register` left its pending updates out (too large for one frame): they go
    /// out one by one once registered.
    updates_left_out: bool,
    /// Set once a master accepted this agent: only then are cgroups it does not know removed
    /// (a second agent refused for using a live agent's name must not touch that agent's).
    accepted: bool,
    heartbeat_every: Duration,
    last_heartbeat: tokio::time::Instant,
    events: mpsc::UnboundedSender<Event>,
    start: tokio::time::Instant,
    /// GPU health (pure policy; faults come from the NVML watcher).
    health: HealthTracker,
    /// Cgroups of live tasks.
    cgroups: HashMap<TaskId, TaskCgroup>,
    /// Tasks whose cgroup is being read and destroyed.
    settling: HashSet<TaskId>,
    /// When a killed task's cgroup was last SIGKILLed.
    escalated: HashMap<TaskId, tokio::time::Instant>,
    sampling: bool,
    last_sample: tokio::time::Instant,
    last_gpu_samples: Vec<GpuSample>,
    /// GPUs whose recovery check is running.
    checking: HashSet<String>,
    last_clear_poll: tokio::time::Instant,
    /// MPS control daemons (`--gpu-sharing mps` on a GPU agent).
    mps: Option<gpu::mps::MpsDaemons>,
    /// Tasks already reported over their GPU-memory share (reported once per excursion).
    gpu_mem_over: HashSet<TaskId>,
    last_notice_poll: tokio::time::Instant,
    /// The termination notice deadline (Unix ms) told to the current master.
    notice_sent: Option<u64>,
    /// What runs as each task's supervisor.
    supervisor: Arc<executor::SupervisorCommand>,
    /// Tasks re-adopted after a restart (their supervisors are polled; ours are awaited).
    adopted: HashSet<TaskId>,
    /// Sandboxes of forgotten tasks, oldest first, waiting for garbage collection.
    gc_queue: VecDeque<gc::Ended>,
    /// A collection pass (or the start-up scan) is running.
    gc_busy: bool,
    /// Disk usage of the work directory as last measured (0.0 to 1.0).
    disk_used: f64,
    last_gc: tokio::time::Instant,
    /// What `/metrics` shows (published after each usage sample).
    metrics: crate::metrics::AgentMetrics,
}

/// Runs the agent until `shutdown` resolves. Running tasks are left running: a restarted
/// agent re-adopts them from its checkpoint.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    std::fs::create_dir_all(config.work_dir.join("sandboxes"))
        .with_context(|| format!("creating {}", config.work_dir.display()))?;
    // Refuse a TLS directory or key others may write (they could replace our identity or the
    // CA); warn about keys others may read.
    if config.tls_dir.exists() {
        for warning in tls::check_dir_permissions(&config.tls_dir)
            .context("checking the TLS directory's permissions")?
        {
            tracing::warn!("{warning}");
        }
    }
    let material = gantry_pki::load_or_issue(
        &config.tls_dir,
        &PeerIdentity::Agent(config.name.clone()),
        &[],
    )
    .context("loading the agent's TLS identity")?;
    let (ckpt, wal) = Wal::open(&config.work_dir).context("recovering the agent's state")?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let now = tokio::time::Instant::now();
    let mut agent = Agent {
        config: config.clone(),
        ckpt,
        wal,
        dirty: HashSet::new(),
        outbox: Vec::new(),
        launches: Vec::new(),
        compacting: false,
        master: None,
        registered: false,
        updates_left_out: false,
        accepted: false,
        heartbeat_every: Duration::from_secs(1),
        last_heartbeat: now,
        events: tx.clone(),
        start: now,
        health: HealthTracker::new(config.gpu_recovery_after),
        cgroups: HashMap::new(),
        settling: HashSet::new(),
        escalated: HashMap::new(),
        sampling: false,
        last_sample: now,
        last_gpu_samples: Vec::new(),
        checking: HashSet::new(),
        last_clear_poll: now,
        mps: (config.gpu_sharing == gpu::share::Sharing::Mps && config.gpus.is_some()).then(|| {
            gpu::mps::MpsDaemons::new(
                gpu::mps::find_in_path(gpu::mps::MPS_CONTROL),
                &config.work_dir.join("mps"),
            )
        }),
        gpu_mem_over: HashSet::new(),
        last_notice_poll: now,
        notice_sent: None,
        supervisor: Arc::new(executor::SupervisorCommand::beside(&config.agent_exe)),
        adopted: HashSet::new(),
        gc_queue: VecDeque::new(),
        gc_busy: true,
        disk_used: 0.0,
        last_gc: now,
        metrics: crate::metrics::AgentMetrics::default(),
    };
    agent.recover()?;
    agent.commit()?;
    // Sandboxes left from earlier runs join the collection queue.
    {
        let dir = config.work_dir.clone();
        let events = tx.clone();
        tokio::task::spawn_blocking(move || {
            let _ = events.send(Event::GcScanned(gc::scan(&dir)));
        });
    }
    // GPU faults: the NVML watcher thread -> this loop.
    let watcher = config.gpus.as_ref().map(|g| {
        let (ftx, mut frx) = mpsc::unbounded_channel();
        let events = tx.clone();
        tokio::spawn(async move {
            while let Some(f) = frx.recv().await {
                if events.send(Event::GpuFault(f)).is_err() {
                    break;
                }
            }
        });
        g.watch_health(ftx)
    });
    let metrics_server = match config.metrics_listen {
        Some(addr) => {
            let listener = crate::metrics::bind(addr)
                .await
                .with_context(|| format!("--metrics-listen {addr}"))?;
            tracing::info!(%addr, "serving /metrics");
            Some(tokio::spawn(crate::metrics::serve(
                listener,
                agent.metrics.clone(),
            )))
        }
        None => None,
    };
    let session = tokio::spawn(session::run(config, material, tx.clone()));
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            ev = rx.recv() => match ev {
                Some(ev) => {
                    // Group commit: handle every event already waiting, then write their
                    // records with one fsync before anything they produced leaves.
                    let mut handled = agent.handle(ev);
                    let mut n = 1;
                    while handled.is_ok() && n < MAX_BATCH {
                        let Ok(ev) = rx.try_recv() else { break };
                        handled = agent.handle(ev);
                        n += 1;
                    }
                    if let Err(e) = handled {
                        break Err(e);
                    }
                    agent.flush_updates();
                    if let Err(e) = agent.commit() {
                        break Err(e);
                    }
                }
                None => break Ok(()),
            },
            _ = tick.tick() => {
                if let Err(e) = agent.tick().and_then(|_| agent.commit()) {
                    break Err(e);
                }
            }
        }
    };
    session.abort();
    if let Some(m) = metrics_server {
        m.abort();
    }
    if let Some(w) = watcher {
        tokio::task::spawn_blocking(move || w.stop()).await.ok();
    }
    // A clean stop with no live task leaves no empty cgroup root behind; with live tasks the
    // root stays for the next start to re-adopt them. An agent no master accepted leaves it
    // alone: it may share the root of the agent whose name it collided with.
    if agent.accepted && agent.ckpt.tasks.values().all(|t| t.state.is_terminal()) {
        if let Err(e) = agent.config.isolator.remove_root() {
            tracing::debug!("cgroup root not removed: {e}");
        }
    }
    result
}

/// Events handled (at most) per commit.
const MAX_BATCH: usize = 4096;

/// Reads a task cgroup's OOM flag and usage, records them in the task's meta directory and
/// destroys the cgroup (blocking). Without a cgroup (gone already), the recorded outcome is
/// returned.
fn settle_cgroup(cg: Option<&TaskCgroup>, meta: &Path) -> CgroupOutcome {
    let final_file = meta.join(FINAL_FILE);
    let recorded: Option<CgroupOutcome> = std::fs::read(&final_file)
        .ok()
        .and_then(|d| serde_json::from_slice(&d).ok());
    let Some(cg) = cg.filter(|c| c.is_isolated()) else {
        return recorded.unwrap_or_default();
    };
    // Recorded by an earlier incarnation that died while destroying the cgroup: that reading
    // was taken from the whole cgroup and stays authoritative.
    if let Some(outcome) = recorded {
        destroy_cgroup(cg);
        return outcome;
    }
    let outcome = CgroupOutcome {
        oom_killed: cg.oom_killed().unwrap_or_else(|e| {
            tracing::warn!(task = cg.task_id(), "reading the OOM flag: {e}");
            false
        }),
        usage: cg.usage().ok(),
    };
    if let Ok(json) = serde_json::to_vec(&outcome) {
        let tmp = meta.join(format!("{FINAL_FILE}.tmp"));
        if std::fs::write(&tmp, json)
            .and_then(|_| std::fs::rename(&tmp, &final_file))
            .is_err()
        {
            tracing::warn!(task = cg.task_id(), "cannot record the cgroup outcome");
        }
    }
    destroy_cgroup(cg);
    outcome
}

/// Destroys a task cgroup, retrying; a cgroup that cannot be removed is logged (the next
/// agent start removes it).
fn destroy_cgroup(cg: &TaskCgroup) {
    for attempt in 1..=3 {
        match cg.destroy() {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(
                    task = cg.task_id(),
                    attempt,
                    "destroying the task cgroup: {e}"
                )
            }
        }
    }
}

impl Agent {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Commits the batch: the changed task records and queued changes go to the log with one
    /// fsync; then the messages and launches they protect go out. Starts a background
    /// compaction when the log has grown past [`wal::COMPACT_BYTES`].
    fn commit(&mut self) -> anyhow::Result<()> {
        for id in std::mem::take(&mut self.dirty) {
            self.wal.append(match self.ckpt.tasks.get(&id) {
                Some(rec) => Record::Task(Box::new(rec.clone())),
                None => Record::TaskRemoved(id),
            });
        }
        self.wal
            .commit()
            .context("writing the agent's write-ahead log")?;
        if let Some(m) = &self.master {
            for msg in self.outbox.drain(..) {
                let _ = m.send(msg);
            }
        } else {
            self.outbox.clear();
        }
        for launch in self.launches.drain(..) {
            tokio::spawn(launch);
        }
        if !self.compacting && self.wal.size() > self.config.wal_compact_bytes {
            let gen = self.wal.rotate().context("starting a new log")?;
            let mut snapshot = self.ckpt.clone();
            snapshot.log_gen = gen;
            self.ckpt.log_gen = gen;
            self.compacting = true;
            let dir = self.config.work_dir.clone();
            let events = self.events.clone();
            tokio::task::spawn_blocking(move || {
                let result = wal::write_snapshot(&dir, &snapshot).map_err(|e| e.to_string());
                let _ = events.send(Event::Compacted(result));
            });
        }
        Ok(())
    }

    /// Queues an update for reliable delivery (recorded in the log).
    fn push_update(&mut self, update: StatusUpdate) {
        self.wal.append(Record::Update(Box::new(update.clone())));
        self.ckpt.updates.push(update);
    }

    fn inventory(&self) -> &[crate::discovery::DiscoveredGpu] {
        self.config
            .gpus
            .as_ref()
            .map(|g| g.inventory().gpus.as_slice())
            .unwrap_or(&[])
    }

    /// Re-adopts checkpointed tasks after a restart: live supervisors are watched again (and
    /// their cgroups reopened); tasks whose supervisor is gone are settled from the exit status
    /// they recorded. GPU occupancy follows from the checkpointed assignments of the tasks that
    /// are not terminal. Cgroups nobody owns any more are destroyed once a master accepts this
    /// agent ([`Agent::cleanup_cgroups`]).
    fn recover(&mut self) -> anyhow::Result<()> {
        let now = Instant::now();
        let known: Vec<String> = self
            .inventory()
            .iter()
            .map(|g| g.info.uuid.clone())
            .collect();
        for (uuid, reason) in &self.ckpt.unhealthy_gpus {
            if known.contains(uuid) {
                self.health.mark_unhealthy(uuid, reason, now);
                tracing::warn!(gpu = %uuid, %reason, "GPU still unhealthy from before the restart");
            }
        }
        let ids: Vec<TaskId> = self.ckpt.tasks.keys().copied().collect();
        // Launches the previous agent started but died before recording: their supervisors
        // say where they are.
        for id in &ids {
            let Some(rec) = self.ckpt.tasks.get_mut(id) else {
                continue;
            };
            // (Checkpoints from before the meta directory kept no claim: nothing to find.)
            if rec.state.is_terminal() || rec.launched.is_some() || rec.meta.as_os_str().is_empty()
            {
                continue;
            }
            if let Some(l) = executor::find_launched(&rec.meta) {
                tracing::info!(task = %id, pid = l.supervisor_pid, "found the supervisor of a launch the previous agent did not record");
                rec.launched = Some(l);
                self.update(*id, TaskState::Running, None, "running".into(), None, None);
            }
        }
        let mut adopted = 0;
        for id in ids {
            let Some(rec) = self.ckpt.tasks.get(&id) else {
                continue;
            };
            if rec.state.is_terminal() {
                continue;
            }
            match rec.launched {
                Some(l) if executor::supervisor_alive(&l) => {
                    adopted += 1;
                    self.adopted.insert(id);
                    tracing::info!(task = %id, pid = l.task_pgid, "re-adopted running task");
                    if let Some(name) = &rec.cgroup {
                        match self.config.isolator.reopen(name) {
                            Ok(cg) => {
                                self.cgroups.insert(id, cg);
                            }
                            Err(e) => tracing::warn!(task = %id, "task cgroup not found: {e}"),
                        }
                    }
                }
                Some(_) => {
                    let status = executor::read_exit(rec.meta_dir());
                    let _ = self.events.send(Event::Exited {
                        task: id,
                        status: status.unwrap_or(ExitStatus {
                            code: None,
                            signal: None,
                        }),
                    });
                }
                None => {
                    // Never started: the launch died with the previous agent (its cgroup, and
                    // anything that made it into it, is removed below).
                    self.terminal(
                        id,
                        TaskState::Failed,
                        Some(TaskReason::AgentRestarted),
                        "agent restarted before the task was launched".into(),
                        None,
                        None,
                    );
                }
            }
        }
        if !self.ckpt.tasks.is_empty() {
            tracing::info!(
                tasks = self.ckpt.tasks.len(),
                adopted,
                "recovered checkpoint"
            );
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
        let mut keep: Vec<String> = self
            .ckpt
            .tasks
            .values()
            .filter(|t| !t.state.is_terminal() && t.launched.is_some())
            .filter_map(|t| t.cgroup.clone())
            .collect();
        let ours: HashSet<&str> = self
            .ckpt
            .tasks
            .values()
            .filter_map(|t| t.cgroup.as_deref())
            .collect();
        match iso.list() {
            Ok(ids) => {
                for id in ids {
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
        let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
        match iso.cleanup_except(&keep) {
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

    /// Queues a message for the master; it leaves after the next commit.
    fn send(&mut self, msg: AgentToMaster) {
        if self.master.is_some() {
            self.outbox.push(msg);
        }
    }

    /// Sends a message that needs a registered session (the master closes connections that
    /// send anything but `Register` first).
    fn send_registered(&mut self, msg: AgentToMaster) {
        if self.registered {
            self.send(msg);
        }
    }

    /// What to advertise: `gpus` counts the healthy GPUs only.
    fn advertised_resources(&self) -> Resources {
        let mut r = self.config.resources.clone();
        let base = r.milli("gpus");
        if base > 0 {
            let unhealthy = self
                .inventory()
                .iter()
                .filter(|g| !self.health.is_healthy(&g.info.uuid))
                .count() as u64;
            r.set_milli("gpus", base.saturating_sub(unhealthy * MILLI));
        }
        r
    }

    fn gpu_infos(&self) -> Vec<GpuInfo> {
        self.inventory()
            .iter()
            .map(|g| GpuInfo {
                healthy: self.health.is_healthy(&g.info.uuid),
                ..g.info.clone()
            })
            .collect()
    }

    /// Milli-GPUs held per GPU by the tasks that are not terminal (fractions add up).
    fn gpu_occupancy(&self) -> BTreeMap<&str, u32> {
        gpu::share::occupancy(
            self.ckpt
                .tasks
                .values()
                .filter(|t| !t.state.is_terminal())
                .map(|t| (t.info.resources.milli("gpus"), t.gpus.as_slice())),
        )
    }

    /// Assignment view of the GPUs: a GPU is free when no live task holds any share of it.
    fn gpu_slots(&self) -> Vec<GpuSlot> {
        let held = self.gpu_occupancy();
        self.inventory()
            .iter()
            .map(|g| GpuSlot {
                numa_node: g.info.numa_node,
                pci_root: g.pci_root.clone(),
                healthy: self.health.is_healthy(&g.info.uuid),
                free: !held.contains_key(g.info.uuid.as_str()),
            })
            .collect()
    }

    fn handle(&mut self, ev: Event) -> anyhow::Result<()> {
        match ev {
            Event::Connected(tx) => {
                self.master = Some(tx);
                self.registered = false;
                // Whatever was queued for the previous connection: Register goes first.
                self.outbox.clear();
                let running_tasks = self
                    .ckpt
                    .tasks
                    .values()
                    .map(|t| RunningTask {
                        framework_id: t.framework_id,
                        task: t.info.clone(),
                        state: t.state,
                        gpus: t.gpus.clone(),
                    })
                    .collect();
                let (register, left_out) = fit_register(AgentToMaster::Register {
                    agent_id: self.ckpt.agent_id,
                    hostname: self.config.hostname.clone(),
                    resources: self.advertised_resources(),
                    reserved: self.config.reserved.clone(),
                    attributes: self.config.attributes.clone(),
                    gpus: self.gpu_infos(),
                    running_tasks,
                    pending_updates: self.ckpt.updates.all(),
                    task_user: self.config.task_user.clone(),
                });
                self.updates_left_out = left_out;
                self.send(register);
            }
            Event::Disconnected => {
                self.master = None;
                self.registered = false;
                self.outbox.clear();
            }
            Event::Master(msg) => self.master_message(msg)?,
            Event::Launched {
                task,
                cgroup,
                result,
            } => {
                let Some(rec) = self.ckpt.tasks.get_mut(&task) else {
                    if let Some(cg) = cgroup {
                        tokio::task::spawn_blocking(move || cg.destroy());
                    }
                    return Ok(());
                };
                if let Some(cg) = cgroup {
                    self.cgroups.insert(task, cg);
                }
                match result {
                    Ok(l) => {
                        rec.launched = Some(l);
                        self.dirty.insert(task);
                        let kill = rec.kill_requested_ms.is_some();
                        self.update(task, TaskState::Running, None, "running".into(), None, None);
                        if kill {
                            executor::signal_group(l.task_pgid, libc::SIGTERM);
                        }
                    }
                    Err(e) => self.terminal(
                        task,
                        TaskState::Failed,
                        Some(TaskReason::LaunchFailed),
                        format!("could not launch: {e}"),
                        None,
                        None,
                    ),
                }
            }
            Event::Exited { task, status } => {
                let Some(rec) = self.ckpt.tasks.get(&task) else {
                    return Ok(());
                };
                if rec.state.is_terminal() || !self.settling.insert(task) {
                    return Ok(());
                }
                let cg = self.cgroups.remove(&task).or_else(|| {
                    rec.cgroup
                        .as_deref()
                        .and_then(|n| self.config.isolator.reopen(n).ok())
                });
                let meta = rec.meta_dir().to_path_buf();
                let events = self.events.clone();
                tokio::task::spawn_blocking(move || {
                    let outcome = settle_cgroup(cg.as_ref(), &meta);
                    let _ = events.send(Event::Settled {
                        task,
                        status,
                        outcome,
                    });
                });
            }
            Event::Settled {
                task,
                status,
                outcome,
            } => {
                self.settling.remove(&task);
                self.escalated.remove(&task);
                let Some(rec) = self.ckpt.tasks.get(&task) else {
                    return Ok(());
                };
                if rec.state.is_terminal() {
                    return Ok(());
                }
                let killed = rec.kill_requested_ms.is_some();
                let msg = executor::describe(&status);
                let (state, reason, msg) = if let Some(why) = rec.gpu_memory_kill.clone() {
                    (
                        TaskState::Failed,
                        Some(TaskReason::GpuMemory),
                        format!("{why} ({msg})"),
                    )
                } else if killed {
                    (
                        TaskState::Killed,
                        Some(TaskReason::KilledByRequest),
                        format!("killed: {msg}"),
                    )
                } else if outcome.oom_killed {
                    (
                        TaskState::Failed,
                        Some(TaskReason::MemoryLimit),
                        format!(
                            "memory-limit: the task exceeded its memory limit of {} MiB and was killed by the kernel's OOM killer ({msg})",
                            rec.info.resources.get("mem")
                        ),
                    )
                } else if status.code == Some(0) {
                    (TaskState::Finished, None, msg)
                } else {
                    (TaskState::Failed, Some(TaskReason::CommandFailed), msg)
                };
                if let Some(u) = outcome.usage {
                    self.send_registered(AgentToMaster::Usage {
                        tasks: vec![(task, u)],
                        gpus: self.last_gpu_samples.clone(),
                    });
                }
                self.terminal(task, state, reason, msg, status.code, status.signal);
            }
            Event::Sampled { tasks, gpus } => {
                self.sampling = false;
                self.last_sample = tokio::time::Instant::now();
                // Tasks that ended while sampling ran are not reported.
                let tasks: Vec<(TaskId, TaskUsage)> = tasks
                    .into_iter()
                    .filter(|(id, _)| {
                        self.ckpt
                            .tasks
                            .get(id)
                            .is_some_and(|t| !t.state.is_terminal())
                    })
                    .collect();
                let tasks = self.gpu_memory_check(tasks);
                self.last_gpu_samples = gpus.clone();
                self.publish_metrics(&tasks);
                if !tasks.is_empty() || !gpus.is_empty() {
                    // Many tasks: as many messages as the frame limit needs.
                    let split = codec::split_batches(tasks, |tasks| AgentToMaster::Usage {
                        tasks,
                        gpus: gpus.clone(),
                    });
                    if !split.oversized.is_empty() {
                        tracing::warn!(
                            n = split.oversized.len(),
                            "usage samples too large to send; dropped"
                        );
                    }
                    for msg in split.batches {
                        self.send_registered(msg);
                    }
                }
            }
            Event::GpuFault(fault) => {
                if let gpu::FaultKind::Xid(x) = fault.kind {
                    self.metrics.record_xid(&fault.uuid, x);
                }
                // A GPU in MIG mode: the fault is its MIG devices' (what is offered).
                let faults =
                    gpu::share::mig_fan_out(fault, self.inventory().iter().map(|g| &g.info));
                for fault in faults {
                    if let Some(change) = self.health.on_fault(&fault, Instant::now()) {
                        self.health_changed(change)?;
                    }
                }
            }
            Event::RecoveryChecked { uuid, passed } => {
                self.checking.remove(&uuid);
                if !passed {
                    tracing::warn!(gpu = %uuid, "GPU recovery check failed; it stays unhealthy");
                }
                if let Some(change) = self.health.recovery_checked(&uuid, passed, Instant::now()) {
                    self.health_changed(change)?;
                }
            }
            Event::GcScanned(found) => {
                self.gc_busy = false;
                // Tasks known now (launched since the scan began) are not garbage.
                let found = found
                    .into_iter()
                    .filter(|e| !self.ckpt.tasks.contains_key(&e.task))
                    .collect();
                gc::merge(&mut self.gc_queue, found);
            }
            Event::GcDone { disk_used } => {
                self.gc_busy = false;
                if let Some(u) = disk_used {
                    self.disk_used = u;
                }
            }
            Event::Compacted(result) => {
                self.compacting = false;
                match result {
                    Ok(()) => {
                        tracing::info!(generation = self.ckpt.log_gen, "compacted the agent's log")
                    }
                    // The logs stay: nothing is lost, the next compaction tries again.
                    Err(e) => tracing::warn!("compacting the agent's log: {e}"),
                }
            }
        }
        Ok(())
    }

    /// Publishes what `/metrics` shows after a usage sample ([`crate::metrics`]).
    fn publish_metrics(&self, usage: &[(TaskId, TaskUsage)]) {
        let mut snapshot = crate::metrics::snapshot(
            &self.config.hostname,
            self.inventory(),
            &self.last_gpu_samples,
            |uuid| self.health.is_healthy(uuid),
            &self.ckpt.tasks,
            usage,
        );
        snapshot.status_update_retries = self.ckpt.updates.retries();
        snapshot.status_updates_pending = self.ckpt.updates.len();
        self.metrics.publish(snapshot);
    }

    /// A GPU became unhealthy or healthy again: checkpoint it, tell the master (which withdraws
    /// or restores it in offers) and tell the tasks holding it.
    fn health_changed(&mut self, change: HealthChange) -> anyhow::Result<()> {
        let minor = self
            .inventory()
            .iter()
            .find(|g| g.info.uuid == change.uuid)
            .map(|g| g.info.minor);
        if change.healthy {
            tracing::info!(gpu = %change.uuid, reason = %change.reason, "GPU healthy again");
            self.ckpt.unhealthy_gpus.remove(&change.uuid);
            self.wal.append(Record::GpuHealthy {
                uuid: change.uuid.clone(),
            });
        } else {
            tracing::warn!(gpu = %change.uuid, reason = %change.reason, "GPU unhealthy: withdrawn from offers");
            self.ckpt
                .unhealthy_gpus
                .insert(change.uuid.clone(), change.reason.clone());
            self.wal.append(Record::GpuUnhealthy {
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
            self.update(id, state, Some(TaskReason::GpuHealth), message, None, None);
        }
        Ok(())
    }

    fn master_message(&mut self, msg: MasterToAgent) -> anyhow::Result<()> {
        match msg {
            MasterToAgent::Registered {
                agent_id,
                heartbeat_interval_ms,
                ..
            } => {
                if self.ckpt.agent_id != Some(agent_id) {
                    self.ckpt.agent_id = Some(agent_id);
                    self.wal.append(Record::AgentId(agent_id));
                }
                self.registered = true;
                // A new master (or a new session) hears the termination notice again.
                self.notice_sent = None;
                if !self.accepted {
                    self.accepted = true;
                    self.cleanup_cgroups();
                }
                self.heartbeat_every =
                    Duration::from_millis(heartbeat_interval_ms.clamp(100, 60_000));
                let now = self.now();
                if std::mem::take(&mut self.updates_left_out) {
                    // Not in the registration: send them now, one by one.
                    self.ckpt.updates.reset_connection();
                    self.flush_updates();
                } else {
                    self.ckpt.updates.mark_all_sent(now);
                }
                tracing::info!(%agent_id, "registered with the master");
            }
            MasterToAgent::RunTask {
                framework_id,
                task,
                gpus,
            } => {
                if self.ckpt.tasks.contains_key(&task.task_id) {
                    tracing::warn!(task = %task.task_id, "duplicate launch ignored");
                    return Ok(());
                }
                self.launch(framework_id, task, &gpus)?;
            }
            MasterToAgent::KillTask {
                framework_id,
                task_id,
            } => self.kill(framework_id, task_id)?,
            MasterToAgent::Acknowledge { task_id, update_id } => {
                if self.ckpt.updates.ack(task_id, update_id) {
                    self.wal.append(Record::Acked {
                        task: task_id,
                        update: update_id,
                    });
                    let done = self
                        .ckpt
                        .tasks
                        .get(&task_id)
                        .is_some_and(|t| t.state.is_terminal())
                        && !self.ckpt.updates.has_pending(task_id);
                    if done {
                        self.ckpt.tasks.remove(&task_id);
                        self.dirty.insert(task_id);
                        self.gc_queue.push_back(gc::Ended {
                            task: task_id,
                            at_ms: gc::now_ms(),
                        });
                    }
                }
            }
            MasterToAgent::Error { message } => {
                // A refusal (a name in use by another agent, an id of another agent, invalid
                // reservations): retrying cannot help, so stop (non-zero) instead of flapping.
                // Running tasks are left alone.
                tracing::error!("the master refused this agent: {message}");
                anyhow::bail!("the master refused this agent: {message}");
            }
            MasterToAgent::ClearGpu { uuid } => match self.health.clear(&uuid) {
                Some(change) => {
                    tracing::info!(gpu = %uuid, "GPU cleared by an operator through the master");
                    self.health_changed(change)?;
                }
                None => {
                    tracing::warn!(gpu = %uuid, "clear request for a GPU that is not unhealthy (or unknown)")
                }
            },
        }
        Ok(())
    }

    /// Picks GPUs for a task asking for `gpus` (milli-units): below one, a GPU with room for
    /// the fraction (`preferred`, the master's choice, when it still fits); else whole idle
    /// GPUs, topology-aware. `Err` says why it cannot run.
    fn pick_gpus(
        &self,
        gpus_milli: u64,
        selector: Option<&GpuSelector>,
        preferred: &[String],
    ) -> Result<Vec<usize>, String> {
        let amount = GpuAmount::from_milli(gpus_milli).map_err(|e| e.to_string())?;
        let k = match amount {
            GpuAmount::None => return Ok(Vec::new()),
            GpuAmount::Whole(k) => k as usize,
            GpuAmount::Fraction(m) => {
                let held = self.gpu_occupancy();
                let free: Vec<Option<u32>> = self
                    .inventory()
                    .iter()
                    .map(|g| {
                        let ok = self.health.is_healthy(&g.info.uuid)
                            && GpuSelector::admits(selector, &g.info);
                        ok.then(|| {
                            gpu::share::GPU_MILLI.saturating_sub(
                                held.get(g.info.uuid.as_str()).copied().unwrap_or(0),
                            )
                        })
                    })
                    .collect();
                let want = preferred
                    .first()
                    .and_then(|u| self.inventory().iter().position(|g| &g.info.uuid == u));
                return gpu::share::pick_fraction(&free, m, want)
                    .map(|i| vec![i])
                    .ok_or_else(|| {
                        format!("the task asks for {m} milli-GPUs of one GPU but no healthy GPU{} on this agent has that much free", if selector.is_some() { " matching its selector" } else { "" })
                    });
            }
        };
        let mut slots = self.gpu_slots();
        // GPUs that do not match the task's selector (MIG devices unless it names their
        // profile) are not candidates.
        for (slot, g) in slots.iter_mut().zip(self.inventory()) {
            slot.free &= GpuSelector::admits(selector, &g.info);
        }
        gpu::assign(&slots, k).ok_or_else(|| {
            let free = slots.iter().filter(|s| s.free && s.healthy).count();
                        let matching = if selector.is_some() { " matching its selector" } else { "" };
            format!("the task asks for {k} GPUs but only {free} healthy GPUs{matching} are free on this agent")
        })
    }

    /// The user a task runs as (its command's, else `--task-user`): `Some(name)` to switch to
    /// (looked up at launch, off the event loop), `None` when the agent is not root and runs
    /// the task as itself (its `--task-user` is then its own user). `Err` says why it cannot run.
    fn task_user(&self, command: &CommandInfo) -> Result<Option<String>, String> {
        let name = command.user.as_deref().unwrap_or(&self.config.task_user);
        if user::is_root() {
            return Ok(Some(name.to_string()));
        }
        if name != self.config.task_user {
            return Err(format!(
                "the agent runs as {}, not root, and cannot run tasks as user {name:?}",
                self.config.task_user
            ));
        }
        Ok(None)
    }

    fn launch(
        &mut self,
        framework_id: FrameworkId,
        task: TaskInfo,
        master_gpus: &[String],
    ) -> anyhow::Result<()> {
        let id = task.task_id;
        let sandbox = self.config.work_dir.join("sandboxes").join(id.to_string());
        let meta = self.config.work_dir.join("meta").join(id.to_string());
        let picked = self.pick_gpus(
            task.resources.milli("gpus"),
            task.gpu_selector.as_ref(),
            master_gpus,
        );
        let chosen: Vec<GpuInfo> = picked
            .as_deref()
            .unwrap_or(&[])
            .iter()
            .filter_map(|&i| self.inventory().get(i).map(|g| g.info.clone()))
            .collect();
        let uuids: Vec<String> = chosen.iter().map(|g| g.uuid.clone()).collect();
        let minors: Vec<u32> = chosen.iter().map(|g| g.minor).collect();
        let isolated = self.config.isolator.layout().is_some();
        let cgroup_name = id.to_string();
        // Checkpointed before the cgroup exists: a restarted agent knows all it may have made.
        self.ckpt.tasks.insert(
            id,
            TaskRecord {
                framework_id,
                info: task.clone(),
                state: TaskState::Staging,
                sandbox: sandbox.clone(),
                meta: meta.clone(),
                launched: None,
                gpus: uuids.clone(),
                kill_requested_ms: None,
                cgroup: isolated.then(|| cgroup_name.clone()),
                gpu_memory_kill: None,
            },
        );
        self.dirty.insert(id);
        // The user the task runs as: its command's, or this agent's default.
        let ready = picked.and_then(|_| self.task_user(&task.command));
        let user = match ready {
            Ok(user) => user,
            Err(why) => {
                self.terminal(
                    id,
                    TaskState::Failed,
                    Some(TaskReason::LaunchFailed),
                    why,
                    None,
                    None,
                );
                return Ok(());
            }
        };
        if !uuids.is_empty() {
            tracing::info!(task = %id, gpus = ?uuids, "assigned GPUs");
        }
        self.update(id, TaskState::Starting, None, "starting".into(), None, None);
        let events = self.events.clone();
        let mut env = task.env.clone();
        env.insert("GANTRY_TASK_ID".into(), id.to_string());
        env.insert("GANTRY_FRAMEWORK_ID".into(), framework_id.to_string());
        if self.config.gpus.is_some() {
            for (k, v) in gpu::visible_devices_env(&uuids) {
                env.insert(k.to_string(), v);
            }
            // A fraction under MPS: its thread and memory limits and its GPU's daemon.
            if let (Some(g), Ok(GpuAmount::Fraction(_))) =
                (chosen.first(), task.resources.gpu_amount())
            {
                let pipe = self.mps.as_mut().and_then(|m| m.ensure(&g.uuid));
                for (k, v) in gpu::share::mps_env(
                    self.config.gpu_sharing,
                    task.resources.milli("gpus"),
                    g.memory_mib,
                    pipe.as_deref().and_then(|p| p.to_str()),
                ) {
                    env.insert(k.to_string(), v);
                }
            }
        }
        let mem_milli = task.resources.milli("mem");
        let limits = Limits {
            cpus: task.resources.get("cpus").max(0.01),
            mem_mib: (mem_milli > 0).then(|| mem_milli.div_ceil(MILLI)),
            pids_max: self.config.task_pids_max,
            cpu_hard_limit: self.config.cpu_hard_limit,
            devices: Some(DeviceRule::for_task(&minors, &self.config.nvidia_majors)),
        };
        let isolator = self.config.isolator.clone();
        let supervisor = self.supervisor.clone();
        // Started after the commit of the task's record (a restarted agent knows every task
        // it may have started, and every cgroup it may have made). The blocking part — the
        // user look-up (NSS, LDAP), the cgroup, the directories, fork and exec — runs on a
        // blocking thread, so no launch holds up the event loop or another task's messages.
        self.launches.push(Box::pin(async move {
            let blocking_meta = meta.clone();
            let spawned = tokio::task::spawn_blocking(move || {
                // The user first, so an unknown user costs no cgroup.
                let user: Option<TaskUser> = match user {
                    None => None,
                    Some(name) => Some(
                        user::lookup(&name)
                            .map_err(|e| format!("cannot run the task as user {name:?}: {e}"))?,
                    ),
                };
                let cg = isolator
                    .create(&cgroup_name, &limits)
                    .map_err(|e| format!("task cgroup: {e}"))?;
                let procs: Vec<PathBuf> =
                    cg.dirs().iter().map(|d| d.join("cgroup.procs")).collect();
                let spec = LaunchSpec {
                    sandbox: &sandbox,
                    meta: &blocking_meta,
                    program: &task.command.program,
                    user: user.as_ref(),
                    env: &env,
                    cgroup_procs: &procs,
                    supervisor: &supervisor,
                };
                match executor::spawn_supervisor(&spec) {
                    Ok(child) => Ok((cg, child)),
                    Err(e) => {
                        let _ = cg.destroy();
                        Err(e.to_string())
                    }
                }
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            let (cg, mut child) = match spawned {
                Ok(ok) => ok,
                Err(e) => {
                    let _ = events.send(Event::Launched {
                        task: id,
                        cgroup: None,
                        result: Err(e),
                    });
                    return;
                }
            };
            match executor::started(&mut child, &meta).await {
                Ok(launched) => {
                    let _ = events.send(Event::Launched {
                        task: id,
                        cgroup: Some(cg),
                        result: Ok(launched),
                    });
                    let _ = child.wait().await;
                    let status = executor::read_exit(&meta).unwrap_or(ExitStatus {
                        code: None,
                        signal: None,
                    });
                    let _ = events.send(Event::Exited { task: id, status });
                }
                Err(e) => {
                    let _ = tokio::task::spawn_blocking(move || cg.destroy()).await;
                    let _ = events.send(Event::Launched {
                        task: id,
                        cgroup: None,
                        result: Err(e.to_string()),
                    });
                }
            }
        }));
        Ok(())
    }

    /// Sets each sampled task's GPU-memory share and acts on tasks above it: a non-terminal
    /// update (reason `gpu-memory`) once per excursion and, with `--gpu-memory-enforce kill`,
    /// the kill (the task ends `FAILED`, reason `gpu-memory`).
    fn gpu_memory_check(
        &mut self,
        mut tasks: Vec<(TaskId, TaskUsage)>,
    ) -> Vec<(TaskId, TaskUsage)> {
        let mut over = Vec::new();
        for (id, usage) in &mut tasks {
            let Some(rec) = self.ckpt.tasks.get(id) else {
                continue;
            };
            let held: Vec<&GpuInfo> = rec
                .gpus
                .iter()
                .filter_map(|u| self.inventory().iter().find(|g| &g.info.uuid == u))
                .map(|g| &g.info)
                .collect();
            usage.gpu_mem_share_bytes =
                gpu::share::memory_share_bytes(rec.info.resources.milli("gpus"), &held);
            let is_over =
                usage.gpu_mem_share_bytes > 0 && usage.gpu_mem_bytes > usage.gpu_mem_share_bytes;
            if !is_over {
                self.gpu_mem_over.remove(id);
            } else if self.gpu_mem_over.insert(*id) {
                over.push((
                    *id,
                    rec.framework_id,
                    rec.state,
                    usage.gpu_mem_bytes,
                    usage.gpu_mem_share_bytes,
                ));
            }
        }
        for (id, framework_id, state, used, share) in over {
            let mib = |b: u64| b / (1024 * 1024);
            let kill = self.config.gpu_memory_enforce == gpu::share::MemoryEnforce::Kill;
            let message = format!(
                "gpu-memory: the task uses {} MiB of GPU memory, above its share of {} MiB{}",
                mib(used),
                mib(share),
                if kill {
                    "; killed (--gpu-memory-enforce kill)"
                } else {
                    ""
                }
            );
            tracing::warn!(task = %id, "{message}");
            self.update(
                id,
                state,
                Some(TaskReason::GpuMemory),
                message.clone(),
                None,
                None,
            );
            if kill {
                if let Some(rec) = self.ckpt.tasks.get_mut(&id) {
                    rec.gpu_memory_kill = Some(message);
                }
                if let Err(e) = self.kill(framework_id, id) {
                    tracing::warn!(task = %id, "killing a task over its GPU-memory share: {e}");
                }
            }
        }
        tasks
    }

    fn kill(&mut self, framework_id: FrameworkId, task_id: TaskId) -> anyhow::Result<()> {
        let Some(rec) = self.ckpt.tasks.get_mut(&task_id) else {
            // The master believes we run it, but we do not: say it is gone.
            tracing::warn!(task = %task_id, "kill for an unknown task");
            let mut update = self.make_update(
                task_id,
                framework_id,
                TaskState::Killed,
                "task unknown to the agent".into(),
                None,
                None,
            );
            update.reason = Some(TaskReason::KilledByRequest);
            self.push_update(update);
            self.flush_updates();
            return Ok(());
        };
        if rec.state.is_terminal() || rec.kill_requested_ms.is_some() {
            return Ok(());
        }
        rec.kill_requested_ms = Some(unix_ms());
        if let Some(l) = rec.launched {
            tracing::info!(task = %task_id, pgid = l.task_pgid, "killing task (SIGTERM)");
            executor::signal_group(l.task_pgid, libc::SIGTERM);
        }
        self.dirty.insert(task_id);
        Ok(())
    }

    fn tick(&mut self) -> anyhow::Result<()> {
        // Escalate kills past their grace period: SIGKILL the process group, and every process
        // in the task's cgroup (a process group can be left; a cgroup cannot).
        let now_unix = unix_ms();
        let now = tokio::time::Instant::now();
        let mut escalate = Vec::new();
        for (id, rec) in &self.ckpt.tasks {
            let (Some(asked), Some(l)) = (rec.kill_requested_ms, rec.launched) else {
                continue;
            };
            let grace = rec
                .info
                .kill_grace_secs
                .map(|s| Duration::from_secs(s.into()))
                .unwrap_or(self.config.kill_grace);
            if !rec.state.is_terminal() && now_unix.saturating_sub(asked) > grace.as_millis() as u64
            {
                executor::signal_group(l.task_pgid, libc::SIGKILL);
                let recent = self
                    .escalated
                    .get(id)
                    .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(1));
                if !recent {
                    escalate.push(*id);
                }
            }
        }
        for id in escalate {
            self.escalated.insert(id, now);
            if let Some(cg) = self.cgroups.get(&id).cloned() {
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = cg.kill_all() {
                        tracing::warn!(task = cg.task_id(), "killing the task cgroup: {e}");
                    }
                });
            }
        }
        // Adopted launches recorded before their task had started: its process group.
        let unknown_pgid: Vec<(TaskId, PathBuf)> = self
            .adopted
            .iter()
            .filter_map(|id| self.ckpt.tasks.get(id).map(|t| (*id, t)))
            .filter(|(_, t)| !t.state.is_terminal() && t.launched.is_some_and(|l| l.task_pgid == 0))
            .map(|(id, t)| (id, t.meta_dir().to_path_buf()))
            .collect();
        for (id, meta) in unknown_pgid {
            if let Some(pgid) = executor::read_task_pgid(&meta) {
                if let Some(l) = self
                    .ckpt
                    .tasks
                    .get_mut(&id)
                    .and_then(|t| t.launched.as_mut())
                {
                    l.task_pgid = pgid;
                    self.dirty.insert(id);
                }
            }
        }
        // Adopted tasks (not our children: ours are awaited by their launch): poll their
        // supervisors. Only they cost a /proc read per tick.
        self.adopted.retain(|id| {
            self.ckpt
                .tasks
                .get(id)
                .is_some_and(|t| !t.state.is_terminal())
        });
        let gone: Vec<(TaskId, PathBuf)> = self
            .adopted
            .iter()
            .filter(|id| !self.settling.contains(id))
            .filter_map(|id| self.ckpt.tasks.get(id).map(|t| (id, t)))
            .filter_map(|(id, t)| {
                t.launched
                    .filter(|l| !executor::supervisor_alive(l))
                    .map(|_| (*id, t.meta_dir().to_path_buf()))
            })
            .collect();
        for (id, meta) in gone {
            if let Some(status) = executor::read_exit(&meta) {
                let _ = self.events.send(Event::Exited { task: id, status });
            } else if self.start.elapsed() > Duration::from_secs(1) {
                // The supervisor died without recording an outcome.
                let _ = self.events.send(Event::Exited {
                    task: id,
                    status: ExitStatus {
                        code: None,
                        signal: None,
                    },
                });
            }
        }
        if self.registered && self.last_heartbeat.elapsed() >= self.heartbeat_every {
            self.last_heartbeat = tokio::time::Instant::now();
            self.send(AgentToMaster::Heartbeat);
        }
        self.sample_if_due();
        if self.mps.is_some() {
            // Every GPU holding a live fractional task has its MPS control daemon (also after
            // an agent restart), restarted when it exited.
            let shared: Vec<String> = self
                .ckpt
                .tasks
                .values()
                .filter(|t| !t.state.is_terminal())
                .filter(|t| matches!(t.info.resources.gpu_amount(), Ok(GpuAmount::Fraction(_))))
                .flat_map(|t| t.gpus.iter().cloned())
                .collect();
            if let Some(m) = self.mps.as_mut() {
                for uuid in &shared {
                    m.ensure(uuid);
                }
                m.supervise();
            }
        }
        self.collect_garbage();
        self.gpu_health_tick()?;
        self.termination_tick();
        self.flush_updates();
        Ok(())
    }

    /// Removes the sandboxes due for collection ([`gc`]) on a blocking thread, at most once a
    /// second, and measures the disk there every few seconds.
    fn collect_garbage(&mut self) {
        if self.gc_busy || self.last_gc.elapsed() < Duration::from_secs(1) {
            return;
        }
        let mut due = self
            .config
            .gc
            .due(&mut self.gc_queue, gc::now_ms(), self.disk_used);
        // A task id launched again meanwhile owns its directories.
        due.retain(|t| !self.ckpt.tasks.contains_key(t));
        if due.is_empty() && self.last_gc.elapsed() < Duration::from_secs(5) {
            return;
        }
        self.gc_busy = true;
        self.last_gc = tokio::time::Instant::now();
        let dir = self.config.work_dir.clone();
        let events = self.events.clone();
        tokio::task::spawn_blocking(move || {
            if !due.is_empty() {
                let removed = gc::remove(&dir, &due);
                tracing::debug!(removed, "removed the sandboxes of ended tasks");
            }
            let _ = events.send(Event::GcDone {
                disk_used: gc::disk_used(&dir),
            });
        });
    }

    /// Every `--usage-interval`: samples GPUs and task cgroups on a blocking thread.
    fn sample_if_due(&mut self) {
        if self.sampling
            || !self.registered
            || self.last_sample.elapsed() < self.config.usage_interval
        {
            return;
        }
        let snapshot: Vec<(TaskId, Option<TaskCgroup>, i32, Vec<String>)> = self
            .ckpt
            .tasks
            .iter()
            .filter(|(id, t)| !t.state.is_terminal() && !self.settling.contains(id))
            .filter_map(|(id, t)| {
                let l = t.launched?;
                Some((
                    *id,
                    self.cgroups.get(id).cloned(),
                    l.task_pgid,
                    t.gpus.clone(),
                ))
            })
            .collect();
        if snapshot.is_empty() && self.config.gpus.is_none() {
            self.last_sample = tokio::time::Instant::now();
            // Nothing to sample: /metrics drops the tasks that ended.
            self.publish_metrics(&[]);
            return;
        }
        self.sampling = true;
        let gpus = self.config.gpus.clone();
        let events = self.events.clone();
        tokio::task::spawn_blocking(move || {
            let (tasks, gpus) = sample(gpus.as_deref(), &snapshot);
            let _ = events.send(Event::Sampled { tasks, gpus });
        });
    }

    /// A spot-termination notice in the work dir ([`crate::termination`]) is told to the
    /// master once per registration, checked every second.
    fn termination_tick(&mut self) {
        if !self.registered || self.last_notice_poll.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.last_notice_poll = tokio::time::Instant::now();
        let Some(notice) = crate::termination::read(&self.config.work_dir) else {
            return;
        };
        let now = crate::termination::unix_ms();
        if notice.deadline_unix_ms + 60_000 < now {
            // Long past: the host was not taken after all (or this is a stale file).
            crate::termination::remove(&self.config.work_dir);
            return;
        }
        if self.notice_sent == Some(notice.deadline_unix_ms) {
            return;
        }
        self.notice_sent = Some(notice.deadline_unix_ms);
        let in_ms = notice.deadline_unix_ms.saturating_sub(now);
        tracing::warn!(in_ms, reason = %notice.reason, "termination notice: asking the master to drain this agent");
        self.send(AgentToMaster::TerminationNotice {
            in_ms,
            reason: notice.reason,
        });
    }

    /// Operator clear requests and due recovery checks.
    fn gpu_health_tick(&mut self) -> anyhow::Result<()> {
        let Some(gpus) = self.config.gpus.clone() else {
            return Ok(());
        };
        for uuid in self.health.recovery_due(Instant::now()) {
            if self.checking.insert(uuid.clone()) {
                let gpus = gpus.clone();
                let events = self.events.clone();
                tokio::task::spawn_blocking(move || {
                    let passed = gpus.recovery_check(&uuid);
                    let _ = events.send(Event::RecoveryChecked { uuid, passed });
                });
            }
        }
        if self.last_clear_poll.elapsed() < Duration::from_secs(1) {
            return Ok(());
        }
        self.last_clear_poll = tokio::time::Instant::now();
        let dir = self.config.work_dir.join(CLEAR_DIR);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                continue;
            }
            if let Err(err) = std::fs::remove_file(e.path()) {
                tracing::warn!("removing clear request {}: {err}", e.path().display());
            }
            let targets: Vec<String> = if name == "all" {
                self.health
                    .unhealthy()
                    .map(|(u, _)| u.to_string())
                    .collect()
            } else {
                vec![name.clone()]
            };
            for uuid in targets {
                match self.health.clear(&uuid) {
                    Some(change) => self.health_changed(change)?,
                    None => {
                        tracing::warn!(gpu = %uuid, "clear request for a GPU that is not unhealthy (or unknown)")
                    }
                }
            }
        }
        Ok(())
    }

    fn flush_updates(&mut self) {
        if !self.registered || self.master.is_none() {
            return;
        }
        let now = self.now();
        for u in self.ckpt.updates.due(now) {
            self.send(AgentToMaster::StatusUpdate(u));
        }
    }

    fn make_update(
        &self,
        task: TaskId,
        framework: FrameworkId,
        state: TaskState,
        message: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
    ) -> StatusUpdate {
        StatusUpdate {
            update_id: UpdateId::random(),
            task_id: task,
            framework_id: framework,
            agent_id: self.ckpt.agent_id,
            state,
            source: UpdateSource::Agent,
            reason: None,
            message,
            exit_code,
            signal,
            gpus: self
                .ckpt
                .tasks
                .get(&task)
                .map(|t| t.gpus.clone())
                .unwrap_or_default(),
            timestamp_ms: unix_ms(),
            reconciliation: false,
        }
    }

    /// Records a state change and queues its update for reliable delivery.
    fn update(
        &mut self,
        task: TaskId,
        state: TaskState,
        reason: Option<TaskReason>,
        message: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
    ) {
        let Some(rec) = self.ckpt.tasks.get(&task) else {
            return;
        };
        let mut update =
            self.make_update(task, rec.framework_id, state, message, exit_code, signal);
        update.reason = reason;
        if let Some(rec) = self.ckpt.tasks.get_mut(&task) {
            rec.state = state;
        }
        self.dirty.insert(task);
        // Sent after the next commit: an update never reaches the master before the state it
        // reports is on disk.
        self.push_update(update);
    }

    /// A terminal state: the task's GPUs are free from now on (occupancy counts only tasks
    /// that are not terminal).
    fn terminal(
        &mut self,
        task: TaskId,
        state: TaskState,
        reason: Option<TaskReason>,
        message: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
    ) {
        tracing::info!(%task, %state, %message, "task ended");
        self.cgroups.remove(&task);
        self.update(task, state, reason, message, exit_code, signal);
    }
}

/// One usage sample (blocking): GPU samples and processes from NVML, cpu/memory from each
/// task's cgroup, GPU figures attributed to tasks through the pids of their cgroups (or process
/// groups without isolation).
fn sample(
    gpus: Option<&NvmlGpus>,
    tasks: &[(TaskId, Option<TaskCgroup>, i32, Vec<String>)],
) -> (Vec<(TaskId, TaskUsage)>, Vec<GpuSample>) {
    let (samples, procs) = match gpus {
        Some(g) => (g.sample(), g.processes()),
        None => (Vec::new(), Vec::new()),
    };
    let mut pid_task = HashMap::new();
    let mut assigned = HashMap::new();
    let mut out = Vec::with_capacity(tasks.len());
    for (id, cg, pgid, uuids) in tasks {
        let cg = cg.as_ref().filter(|c| c.is_isolated());
        let usage = match cg.map(TaskCgroup::usage) {
            None => TaskUsage::default(),
            Some(Ok(u)) => u,
            // Gone meanwhile (the task is ending): its final usage is sent when it settles.
            Some(Err(_)) => continue,
        };
        if !procs.is_empty() {
            let pids = match cg {
                Some(c) => c.pids().unwrap_or_default(),
                None => executor::group_pids(*pgid),
            };
            for p in pids {
                pid_task.insert(p, *id);
            }
        }
        for u in uuids {
            assigned.insert(u.clone(), *id);
        }
        out.push((*id, usage));
    }
    let attributed = gpu::attribute(&samples, &procs, &pid_task, &assigned);
    for (id, u) in &mut out {
        if let Some(g) = attributed.get(id) {
            u.gpu_mem_bytes = g.mem_bytes;
            u.gpu_util_percent = g.util_percent;
        }
    }
    (out, samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation::IsolationMode;

    #[test]
    fn settled_outcome_survives_a_missing_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        // Nothing recorded, no cgroup: no OOM, no usage.
        let o = settle_cgroup(None, dir.path());
        assert!(!o.oom_killed && o.usage.is_none());
        // A recorded outcome (written before the cgroup was destroyed) is read back.
        let recorded = CgroupOutcome {
            oom_killed: true,
            usage: Some(TaskUsage {
                mem_peak_bytes: 64 << 20,
                ..TaskUsage::default()
            }),
        };
        std::fs::write(
            dir.path().join(FINAL_FILE),
            serde_json::to_vec(&recorded).unwrap(),
        )
        .unwrap();
        let o = settle_cgroup(None, dir.path());
        assert!(o.oom_killed);
        assert_eq!(o.usage.unwrap().mem_peak_bytes, 64 << 20);
        // Without isolation the task "cgroup" is not one: the record is used as well.
        let iso = Isolator::new(IsolationMode::None, None).unwrap();
        let limits = Limits {
            cpus: 1.0,
            mem_mib: None,
            pids_max: None,
            cpu_hard_limit: false,
            devices: None,
        };
        let cg = iso.create("t", &limits).unwrap();
        assert!(settle_cgroup(Some(&cg), dir.path()).oom_killed);
    }

    #[test]
    fn sampling_without_gpus_or_cgroups() {
        let iso = Isolator::new(IsolationMode::None, None).unwrap();
        let limits = Limits {
            cpus: 1.0,
            mem_mib: None,
            pids_max: None,
            cpu_hard_limit: false,
            devices: None,
        };
        let cg = iso.create("t", &limits).unwrap();
        let id = TaskId::random();
        // SAFETY: getpgrp has no preconditions.
        let pgid = unsafe { libc::getpgrp() };
        let (tasks, gpus) = sample(None, &[(id, Some(cg), pgid, Vec::new())]);
        assert!(gpus.is_empty());
        assert_eq!(tasks, vec![(id, TaskUsage::default())]);
    }
}

/// Makes a `Register` fit in one frame: first without its pending updates (they are sent one
/// by one after registering; returns true then), then, for thousands of tasks with long
/// commands, without the tasks' commands and environments (the master needs their ids and
/// resources to adopt them). Logs what it left out.
fn fit_register(mut msg: AgentToMaster) -> (AgentToMaster, bool) {
    let fits = |m: &AgentToMaster| codec::encoded_len(m).is_ok_and(|n| n <= codec::MAX_FRAME);
    if fits(&msg) {
        return (msg, false);
    }
    let AgentToMaster::Register {
        running_tasks,
        pending_updates,
        ..
    } = &mut msg
    else {
        return (msg, false);
    };
    tracing::warn!(
        updates = pending_updates.len(),
        "registration too large for one frame; pending status updates follow it one by one"
    );
    let left_out = !pending_updates.is_empty();
    pending_updates.clear();
    let tasks = running_tasks.len();
    if fits(&msg) {
        return (msg, left_out);
    }
    tracing::warn!(
        tasks,
        "registration still too large; reporting the tasks without their commands and environments"
    );
    if let AgentToMaster::Register { running_tasks, .. } = &mut msg {
        for t in running_tasks {
            // The program goes; the user stays (the master shows who the task runs as).
            t.task.command.program = Program::Shell(String::new());
            t.task.env.clear();
        }
    }
    (msg, left_out)
}

#[cfg(test)]
mod fit_register_tests {
    use super::*;

    fn register(tasks: usize, command_bytes: usize, updates: usize) -> AgentToMaster {
        let fw = FrameworkId::random();
        let running_tasks: Vec<RunningTask> = (0..tasks)
            .map(|i| RunningTask {
                framework_id: fw,
                task: TaskInfo {
                    task_id: TaskId::random(),
                    name: format!("t{i}"),
                    command: "x".repeat(command_bytes).into(),
                    resources: "cpus:0.1".parse().unwrap(),
                    env: Default::default(),
                    kill_grace_secs: None,
                    gpu_selector: None,
                },
                state: TaskState::Running,
                gpus: vec![],
            })
            .collect();
        let pending_updates = running_tasks
            .iter()
            .take(updates)
            .map(|t| StatusUpdate {
                update_id: UpdateId::random(),
                task_id: t.task.task_id,
                framework_id: fw,
                agent_id: None,
                state: TaskState::Running,
                source: UpdateSource::Agent,
                reason: None,
                message: "m".repeat(command_bytes),
                exit_code: None,
                signal: None,
                gpus: vec![],
                timestamp_ms: 0,
                reconciliation: false,
            })
            .collect();
        AgentToMaster::Register {
            agent_id: None,
            hostname: "h".into(),
            resources: "cpus:1".parse().unwrap(),
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: vec![],
            running_tasks,
            pending_updates,
            task_user: "nobody".into(),
        }
    }

    fn parts(msg: &AgentToMaster) -> (usize, usize, usize) {
        match msg {
            AgentToMaster::Register {
                running_tasks,
                pending_updates,
                ..
            } => (
                running_tasks.len(),
                pending_updates.len(),
                running_tasks
                    .iter()
                    .map(|t| match &t.task.command.program {
                        Program::Shell(s) => s.len(),
                        Program::Argv(v) => v.iter().map(String::len).sum(),
                    })
                    .sum(),
            ),
            _ => panic!("not a registration"),
        }
    }

    #[test]
    fn a_registration_that_fits_is_unchanged() {
        let msg = register(10, 100, 10);
        let (fitted, left_out) = fit_register(msg.clone());
        assert_eq!((fitted, left_out), (msg, false));
    }

    #[test]
    fn pending_updates_are_left_out_first_then_commands() {
        // 1,000 tasks with 3 KB commands and 3 KB update messages: ~6 MB.
        let (fitted, left_out) = fit_register(register(1000, 3000, 1000));
        assert!(left_out);
        assert_eq!(parts(&fitted), (1000, 0, 3_000_000));
        assert!(codec::encode(&fitted).is_ok());
        // 2,000 tasks with 3 KB commands: the commands go too, every task is still reported.
        let (fitted, left_out) = fit_register(register(2000, 3000, 0));
        assert!(!left_out);
        assert_eq!(parts(&fitted), (2000, 0, 0));
        assert!(codec::encode(&fitted).is_ok());
    }
}
