//! The agent's runtime: the thin tokio shell around the pure [`crate::core::AgentCore`], like
//! the master's `server` around its `state`. One loop owns the core and the I/O handles (the
//! write-ahead log, the master session's sender, live task cgroups, MPS daemons, `/metrics`);
//! it feeds the core [`Input`]s with the time and performs the [`Effect`]s it returns. The
//! master session ([`crate::session`]), the task watchers, the NVML health watcher and blocking
//! helpers (launches, cgroup settlement, sampling, measuring sandboxes for disk limits,
//! recovery checks, sandbox garbage collection) only send it events. (About 950 lines: the one loop and its effect dispatch; launching
//! and the blocking helpers live in `launch` and `blocking`.)
//!
//! Persistence is a write-ahead log with group commit ([`crate::wal`]): the loop handles every
//! event already waiting, appends the records the core asked to persist, commits the batch with
//! one `fdatasync`, and only then sends the messages and starts the launches the batch produced
//! (`Agent::commit`).
//!
//! Task life: the core assigns GPUs and records the task with its cgroup name *before* the
//! launch creates the cgroup, so a restarted agent knows everything it may have created. The
//! task joins its cgroup between `fork` and `exec` (the supervisor writes `0` to each
//! `cgroup.procs`). When it ends, the OOM flag and final usage are read, recorded in the
//! sandbox, and the core makes the task terminal; an empty cgroup is destroyed after that (off
//! the task's path), one with processes left in it before.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gantry_sdk::protocol::*;
use gantry_sdk::transport::{tls, PeerIdentity};
use tokio::sync::mpsc;

use crate::core::{AgentCore, CgroupOutcome, CoreConfig, Effect, Input, PortRange, RecoveryProbe};
use crate::discovery::NvmlGpus;
use crate::executor::user;
use crate::executor::{self, ExitStatus, Launched};
use crate::gc::{self, GcPolicy};
use crate::gpu;
use crate::isolation::{Isolator, NvidiaMajors, TaskCgroup};
use crate::session;
use crate::wal::{self, Wal};

/// Directory (under the work dir) where `gantry-agent clear-gpu` drops clear requests.
pub const CLEAR_DIR: &str = "gpu-clear";

/// File in a task's meta directory recording the counters its (reused, pooled) cgroup held when
/// the task took it ([`crate::isolation::Baseline`]); written only when not all zero.
const BASE_FILE: &str = "cgroup-base.json";

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
}

/// Events the runtime loop reacts to.
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
    Settled {
        task: TaskId,
        status: ExitStatus,
        outcome: CgroupOutcome,
    },
    Sampled {
        tasks: Vec<(TaskId, TaskUsage)>,
        gpus: Vec<GpuSample>,
    },
    GpuFault(gpu::GpuFault),
    RecoveryChecked {
        uuid: String,
        passed: bool,
    },
    /// A background snapshot of the state (log compaction) is written, or failed.
    Compacted(Result<(), String>),
    /// Sandboxes found on disk at start.
    GcScanned(Vec<gc::Ended>),
    /// Pool cgroups made ([`Effect::PrepareCgroups`]).
    CgroupsPrepared {
        asked: usize,
        ready: Vec<String>,
    },
    /// An ended task's cgroup is back in the pool (or was removed: `None`).
    CgroupRecycled(Option<String>),
    /// A garbage collection pass ended (with the disk usage it measured).
    GcDone {
        disk_used: Option<f64>,
    },
    /// A pass measuring sandboxes ended: its readings, and the walks it left unfinished.
    DiskMeasured {
        readings: Vec<(TaskId, crate::disk::DiskReading)>,
        walks: Vec<(TaskId, crate::disk::DuWalk)>,
    },
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
    /// A background snapshot is being written.
    compacting: bool,
    master: Option<mpsc::UnboundedSender<AgentToMaster>>,
    events: mpsc::UnboundedSender<Event>,
    start: Instant,
    /// Cgroups of live tasks.
    cgroups: HashMap<TaskId, TaskCgroup>,
    last_clear_poll: Instant,
    last_notice_poll: Instant,
    /// MPS control daemons (`--gpu-sharing mps` on a GPU agent).
    mps: Option<gpu::mps::MpsDaemons>,
    /// The supervisor process that starts and reaps the tasks.
    supervisor: Arc<executor::client::SupervisorClient>,
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

fn core_config(config: &AgentConfig) -> CoreConfig {
    CoreConfig {
        work_dir: config.work_dir.clone(),
        hostname: config.hostname.clone(),
        resources: config.resources.clone(),
        reserved: config.reserved.clone(),
        attributes: config.attributes.clone(),
        task_user: config.task_user.clone(),
        root: user::is_root(),
        kill_grace: config.kill_grace,
        isolated: config.isolator.layout().is_some(),
        gpu_agent: config.gpus.is_some(),
        inventory: config
            .gpus
            .as_ref()
            .map(|g| g.inventory().gpus.clone())
            .unwrap_or_default(),
        gpu_sharing: config.gpu_sharing,
        gpu_memory_enforce: config.gpu_memory_enforce,
        gpu_recovery_after: config.gpu_recovery_after,
        cpu_hard_limit: config.cpu_hard_limit,
        task_pids_max: config.task_pids_max,
        nvidia_majors: config.nvidia_majors,
        usage_interval: config.usage_interval,
        gc: config.gc,
        ports: config.ports,
        disk_enforcement: config.disk_enforcement,
        disk_watch_interval: config.disk_watch_interval,
        cgroup_pool: crate::core::pool::PoolConfig {
            low: config.cgroup_pool.0,
            high: config.cgroup_pool.1,
            prefix: crate::core::pool::pool_prefix(
                &crate::core::pool::agent_prefix(&config.work_dir),
                unix_ms(),
            ),
        },
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

/// Probes the host for the checkpointed tasks that are not terminal (blocking /proc reads).
fn probe(core: &AgentCore) -> RecoveryProbe {
    let mut probe = RecoveryProbe::default();
    for (id, rec) in &core.checkpoint().tasks {
        if rec.state.is_terminal() {
            continue;
        }
        let mut launched = rec.launched;
        // (Checkpoints from before the meta directory kept no claim: nothing to find.)
        if launched.is_none() && !rec.meta.as_os_str().is_empty() {
            if let Some(l) = executor::find_launched(&rec.meta) {
                probe.found.push((*id, l));
                launched = Some(l);
            }
        }
        match launched {
            Some(l) if executor::still_running(&l, rec.meta_dir()) => probe.alive.push(*id),
            Some(_) => probe
                .exited
                .push((*id, executor::read_exit(rec.meta_dir()))),
            None => {}
        }
    }
    probe
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
    let now = Instant::now();
    let mut agent = Agent {
        config: config.clone(),
        core: AgentCore::new(core_config(&config), ckpt, unix_ms(), now),
        wal,
        outbox: Vec::new(),
        launches: Vec::new(),
        compacting: false,
        master: None,
        events: tx.clone(),
        start: now,
        cgroups: HashMap::new(),
        last_clear_poll: now,
        mps: (config.gpu_sharing == gpu::share::Sharing::Mps && config.gpus.is_some()).then(|| {
            gpu::mps::MpsDaemons::new(
                gpu::mps::find_in_path(gpu::mps::MPS_CONTROL),
                &config.work_dir.join("mps"),
            )
        }),
        last_notice_poll: now,
        supervisor: Arc::new(executor::client::SupervisorClient::new(
            executor::SupervisorCommand::beside(&config.agent_exe),
        )),
        metrics: crate::metrics::AgentMetrics::default(),
        pool_gate: Arc::new(PoolGate::default()),
        disk_walks: HashMap::new(),
    };
    let probed = probe(&agent.core);
    let effects = agent.core.recover(probed, unix_ms());
    agent.perform(effects)?;
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
    // The pool is drained: its ready cgroups and any of this run's left empty (a recycling
    // finished after the loop) are removed; the gate keeps new ones from appearing.
    agent.pool_gate.close();
    let mut drained = agent.core.drain_pool();
    if !agent.core.pool().prefix().is_empty() {
        let prefix = agent.core.pool().prefix().to_string();
        let held: HashSet<String> = agent
            .core
            .checkpoint()
            .tasks
            .values()
            .filter(|t| !t.state.is_terminal())
            .filter_map(|t| t.cgroup.clone())
            .collect();
        if let Ok(names) = agent.config.isolator.list() {
            for n in names {
                if n.starts_with(&prefix) && !held.contains(&n) && !drained.contains(&n) {
                    drained.push(n);
                }
            }
        }
    }
    if !drained.is_empty() {
        let iso = agent.config.isolator.clone();
        let n = drained.len();
        let _ = tokio::task::spawn_blocking(move || {
            for name in drained {
                if let Ok(cg) = iso.reopen(&name) {
                    // Busy (a task's, recorded as ended meanwhile): left for the next start.
                    if cg.pids().is_ok_and(|p| p.is_empty()) {
                        destroy_cgroup(&cg);
                    }
                }
            }
        })
        .await;
        tracing::debug!(n, "drained the cgroup pool");
    }
    // A clean stop with no live task leaves no empty cgroup root behind; with live tasks the
    // root stays for the next start to re-adopt them. An agent no master accepted leaves it
    // alone: it may share the root of the agent whose name it collided with.
    if agent.core.accepted()
        && agent
            .core
            .checkpoint()
            .tasks
            .values()
            .all(|t| t.state.is_terminal())
    {
        if let Err(e) = agent.config.isolator.remove_root() {
            tracing::debug!("cgroup root not removed: {e}");
        }
    }
    result
}

/// Events handled (at most) per commit.
const MAX_BATCH: usize = 4096;

mod blocking;
mod launch;

use blocking::{
    destroy_cgroup, measure_disk, prepare_cgroups, recycle_cgroup, sample, settle_cgroup,
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

    fn handle(&mut self, ev: Event) -> anyhow::Result<()> {
        match &ev {
            Event::Launched { task, .. } => tracing::debug!(%task, "launched"),
            Event::Exited { task, .. } => tracing::debug!(%task, "exited"),
            Event::Settled { task, .. } => tracing::debug!(%task, "settled"),
            Event::Master(MasterToAgent::RunTask { task, .. }) => {
                tracing::debug!(task = %task.task_id, "run task")
            }
            _ => {}
        }
        let input = match ev {
            Event::Connected(tx) => {
                self.master = Some(tx);
                // Whatever was queued for the previous connection: Register goes first.
                self.outbox.clear();
                Input::Connected
            }
            Event::Disconnected => {
                self.master = None;
                self.outbox.clear();
                Input::Disconnected
            }
            Event::Master(MasterToAgent::RunTask {
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
            Event::Master(msg) => Input::Master(msg),
            Event::Launched {
                task,
                cgroup,
                result,
            } => {
                if let Some(cg) = cgroup {
                    self.cgroups.insert(task, cg);
                }
                Input::Launched { task, result }
            }
            Event::Exited { task, status } => Input::Exited { task, status },
            Event::Settled {
                task,
                status,
                outcome,
            } => Input::Settled {
                task,
                status,
                outcome,
            },
            Event::Sampled { tasks, gpus } => Input::Sampled { tasks, gpus },
            Event::GpuFault(fault) => {
                if let gpu::FaultKind::Xid(x) = fault.kind {
                    self.metrics.record_xid(&fault.uuid, x);
                }
                Input::GpuFault(fault)
            }
            Event::RecoveryChecked { uuid, passed } => Input::RecoveryChecked { uuid, passed },
            Event::GcScanned(found) => Input::GcScanned(found),
            Event::CgroupsPrepared { asked, ready } => Input::CgroupsPrepared { asked, ready },
            Event::CgroupRecycled(name) => Input::CgroupRecycled(name),
            Event::GcDone { disk_used } => Input::GcDone { disk_used },
            Event::DiskMeasured { readings, walks } => {
                self.disk_walks.extend(walks);
                Input::DiskMeasured(readings)
            }
            Event::Compacted(result) => {
                self.compacting = false;
                match result {
                    Ok(()) => tracing::info!(
                        generation = self.core.checkpoint().log_gen,
                        "compacted the agent's log"
                    ),
                    // The logs stay: nothing is lost, the next compaction tries again.
                    Err(e) => tracing::warn!("compacting the agent's log: {e}"),
                }
                return Ok(());
            }
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
                    self.cgroups.remove(&task);
                }
                Effect::DestroyCgroup(task) => {
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
                    let cg = self.cgroups.remove(&task).or_else(|| {
                        cgroup
                            .as_deref()
                            .and_then(|n| self.config.isolator.reopen(n).ok())
                    });
                    let events = self.events.clone();
                    let gate = self.pool_gate.clone();
                    tokio::task::spawn_blocking(move || {
                        let outcome = settle_cgroup(cg.as_ref(), &meta);
                        let _ = events.send(Event::Settled {
                            task,
                            status,
                            outcome,
                        });
                        // After its task's terminal update is on its way, an empty cgroup goes
                        // back to the pool or is removed (one with processes left was removed
                        // before).
                        let cg = cg.filter(TaskCgroup::is_isolated);
                        let back = match &cg {
                            Some(cg) if recycle => recycle_cgroup(cg, &gate),
                            _ => None,
                        };
                        if back.is_none() {
                            if let Some(cg) = &cg {
                                destroy_cgroup(cg);
                            }
                        }
                        if recycle {
                            let _ = events.send(Event::CgroupRecycled(back));
                        }
                    });
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
                    let events = self.events.clone();
                    let gate = self.pool_gate.clone();
                    tokio::task::spawn_blocking(move || {
                        let asked = names.len();
                        let ready = prepare_cgroups(&iso, names, &gate);
                        let _ = events.send(Event::CgroupsPrepared { asked, ready });
                    });
                }
                Effect::Sample(tasks) => {
                    let snapshot: Vec<(TaskId, Option<TaskCgroup>, i32, Vec<String>)> = tasks
                        .into_iter()
                        .map(|(id, pgid, gpus)| (id, self.cgroups.get(&id).cloned(), pgid, gpus))
                        .collect();
                    let gpus = self.config.gpus.clone();
                    let events = self.events.clone();
                    tokio::task::spawn_blocking(move || {
                        let (tasks, gpus) = sample(gpus.as_deref(), &snapshot);
                        let _ = events.send(Event::Sampled { tasks, gpus });
                    });
                }
                Effect::PublishMetrics(usage) => self.publish_metrics(&usage),
                Effect::CheckRecovery(uuid) => {
                    if let Some(gpus) = self.config.gpus.clone() {
                        let events = self.events.clone();
                        tokio::task::spawn_blocking(move || {
                            let passed = gpus.recovery_check(&uuid);
                            let _ = events.send(Event::RecoveryChecked { uuid, passed });
                        });
                    }
                }
                Effect::CleanupCgroups => self.cleanup_cgroups(),
                Effect::CollectGarbage(due) => {
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
                    let events = self.events.clone();
                    tokio::task::spawn_blocking(move || {
                        let (readings, walks) = measure_disk(tasks);
                        let _ = events.send(Event::DiskMeasured { readings, walks });
                    });
                }
                Effect::Stop(message) => anyhow::bail!(message),
            }
        }
        Ok(())
    }

    /// Commits the batch: the changed task records and queued changes go to the log with one
    /// fsync; then the messages and launches they protect go out. A batch that sends and starts
    /// nothing (acknowledgements) is only written: the next synced commit makes it durable
    /// ([`wal::Wal::write`]). Starts a background compaction when the log has grown past
    /// [`wal::COMPACT_BYTES`].
    fn commit(&mut self) -> anyhow::Result<()> {
        let effects = self.core.flush(unix_ms());
        self.perform(effects)?;
        let started = Instant::now();
        let protects = !self.outbox.is_empty() || !self.launches.is_empty();
        let records = if protects {
            self.wal.commit()
        } else {
            self.wal.write()
        }
        .context("writing the agent's write-ahead log")?;
        tracing::debug!(
            records,
            synced = protects,
            sent = self.outbox.len(),
            launches = self.launches.len(),
            commit_us = started.elapsed().as_micros() as u64,
            "committed"
        );
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
            let mut snapshot = self.core.checkpoint().clone();
            snapshot.log_gen = gen;
            self.core.checkpoint_mut().log_gen = gen;
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

    fn tick(&mut self) -> anyhow::Result<()> {
        // Adopted tasks (not our children: ours are awaited by their launch): their task
        // group when the launch was recorded before the task started, and their supervisors
        // polled. Only they cost a /proc read per tick.
        let mut found = Vec::new();
        let mut gone = Vec::new();
        for (id, t) in self.core.adopted_live() {
            let Some(l) = t.launched else { continue };
            if l.task_pgid == 0 {
                if let Some(pgid) = executor::read_task_pgid(t.meta_dir()) {
                    found.push(Input::PgidFound { task: id, pgid });
                }
            }
            if !executor::still_running(&l, t.meta_dir()) {
                gone.push((id, t.meta_dir().to_path_buf()));
            }
        }
        for input in found {
            self.input(input)?;
        }
        for (id, meta) in gone {
            let status = match executor::read_exit(&meta) {
                Some(status) => status,
                // The supervisor died without recording an outcome.
                None if self.start.elapsed() > Duration::from_secs(1) => ExitStatus {
                    code: None,
                    signal: None,
                },
                None => continue,
            };
            let _ = self.events.send(Event::Exited { task: id, status });
        }
        self.input(Input::Tick)?;
        if self.mps.is_some() {
            // Every GPU holding a live fractional task has its MPS control daemon (also after
            // an agent restart), restarted when it exited.
            let shared = self.core.shared_gpus();
            if let Some(m) = self.mps.as_mut() {
                for uuid in &shared {
                    m.ensure(uuid);
                }
                m.supervise();
            }
        }
        self.poll_clear_requests()?;
        self.poll_termination_notice()?;
        Ok(())
    }

    /// A spot-termination notice in the work dir ([`crate::termination`]) goes to the core
    /// (which tells the master once per registration), checked every second.
    fn poll_termination_notice(&mut self) -> anyhow::Result<()> {
        if !self.core.registered() || self.last_notice_poll.elapsed() < Duration::from_secs(1) {
            return Ok(());
        }
        self.last_notice_poll = Instant::now();
        let Some(notice) = crate::termination::read(&self.config.work_dir) else {
            return Ok(());
        };
        if notice.deadline_unix_ms + 60_000 < crate::termination::unix_ms() {
            // Long past: the host was not taken after all (or this is a stale file).
            crate::termination::remove(&self.config.work_dir);
            return Ok(());
        }
        self.input(Input::TerminationNotice {
            deadline_unix_ms: notice.deadline_unix_ms,
            reason: notice.reason,
        })
    }

    /// Operator clear requests dropped by `gantry-agent clear-gpu`, checked every second.
    fn poll_clear_requests(&mut self) -> anyhow::Result<()> {
        if self.config.gpus.is_none() || self.last_clear_poll.elapsed() < Duration::from_secs(1) {
            return Ok(());
        }
        self.last_clear_poll = Instant::now();
        let dir = self.config.work_dir.join(CLEAR_DIR);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
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
        if names.is_empty() {
            return Ok(());
        }
        self.input(Input::ClearGpus(names))
    }
}
