//! The load harness behind `gantry-load` (docs/benchmarks.md, "Launch throughput"): one real
//! `gantry-master` process (started here, or one given by address), N emulated agents and M
//! emulated frameworks over real QUIC with real mutual TLS, each with its own certificate from
//! the dev TLS directory, in this process — the master cannot tell them from real ones.
//!
//! - [`agent`]: the emulated agent (tasks "run" for a fixed time without processes);
//! - [`framework`]: the emulated framework, a [`gantry_sdk::Scheduler`] run by the SDK's
//!   driver, with a task shape and a decline/suppress policy;
//! - [`floor`]: a bare QUIC echo over the same loopback and TLS, the floor for latencies;
//! - [`stats`]: latency samples and p50/p99/max;
//! - [`report`]: what a run measured, as a table and JSON.
//!
//! Two modes: **saturating** (frameworks launch on every offer, as many tasks as fit) and
//! **arrivals** (`--rate R`: tasks arrive at R per second, spread evenly over the frameworks'
//! queues, and each framework declares its queue as demand). Frameworks start launching
//! together once every one has subscribed (unless `open_together` is off: then the first to
//! subscribe is offered the whole cluster).
//!
//! Measured (all in one run):
//! - offer latency: saturating, an agent sends the terminal status update that frees a task's
//!   resources → the first offer of that agent arrives at any framework (samples only agents
//!   that had a task end, the first offer after each end); arrivals, a task's demand is handed
//!   to the driver → an offer it launches on arrives;
//! - accept → RUNNING: a framework hands an accept to its driver → the task's RUNNING update
//!   reaches its scheduler;
//! - RUNNING → acknowledged: the agent sends RUNNING → the master forwards the framework's
//!   acknowledgement to the agent;
//! - launches/s: RUNNING updates reaching frameworks during the launch window, per second;
//! - allocation cycles: every cycle of the window, from the master's `/metrics` histogram
//!   read at both ends (mean exact, percentiles to their bucket);
//! - master CPU (`/proc/PID/stat`) and VmRSS, per 1,000 agents, idle and under load;
//! - the floor: bare QUIC ping round trips, idle before the load and paced during it.

pub mod agent;
pub mod floor;
pub mod framework;
pub mod report;
pub mod stats;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gantry_sdk::protocol::{Capability, Resources};

use crate::emu;
use crate::{MasterProc, TempDir};
pub use report::{Report, TargetRatios};
use stats::Samples;

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub agents: usize,
    pub frameworks: usize,
    /// GPUs per emulated agent (0: none; frameworks then ask for no GPU capability).
    pub gpus_per_agent: usize,
    /// Resources of each agent besides its GPUs.
    pub agent_resources: String,
    /// Resources of each task.
    pub task: String,
    /// How long each task "runs".
    pub task_time: Duration,
    /// How long frameworks keep launching.
    pub launch_window: Duration,
    pub max_tasks_per_offer: usize,
    /// Tasks per framework at most (`None`: launch until the window ends).
    pub tasks_per_framework: Option<u64>,
    /// Filter on the unused part of an accepted offer, and on declines once launching
    /// stopped, seconds.
    pub refuse_seconds: f64,
    /// Filter on an offer where not one task fits (e.g. what is left of an agent whose GPUs
    /// are all taken), seconds.
    pub decline_seconds: f64,
    /// Frameworks start launching together once every one has subscribed (they wait
    /// suppressed); otherwise each starts as soon as it subscribes, and the first is offered
    /// the whole cluster.
    pub open_together: bool,
    /// Frameworks list no minimum allocatable quantity, so they are also offered what no task
    /// fits in (what is left of an agent whose GPUs are taken), as Mesos frameworks are by
    /// default; otherwise each lists its task shape.
    pub offer_remnants: bool,
    /// Client UDP sockets the agents share.
    pub client_endpoints: usize,
    /// Extra flags for the master this harness starts.
    pub master_args: Vec<String>,
    /// Use a running master instead of starting one.
    pub external: Option<ExternalMaster>,
    /// How long to wait for launched tasks to end after the window.
    pub drain_timeout: Duration,
    /// Tasks arrive at this many per second, spread evenly over the frameworks, which queue
    /// them and declare the queue as demand (`None`: frameworks launch on every offer, which
    /// saturates the cluster and measures latency under saturation).
    pub rate: Option<f64>,
    /// A `gantry-load` binary to run as the floor's echo server in a process of its own
    /// (`--serve-echo`); `None`: only the in-process floor is measured.
    pub echo_exe: Option<PathBuf>,
}

/// A master started elsewhere.
#[derive(Debug, Clone)]
pub struct ExternalMaster {
    pub quic: SocketAddr,
    pub http: SocketAddr,
    /// For CPU and memory readings.
    pub pid: Option<u32>,
    /// Its dev TLS directory (with `ca.key`, to issue the emulated peers' certificates).
    pub tls_dir: PathBuf,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            agents: 200,
            frameworks: 20,
            gpus_per_agent: 8,
            agent_resources: "cpus:64;mem:524288".into(),
            task: "cpus:1;mem:1024;gpus:1".into(),
            task_time: Duration::from_millis(500),
            launch_window: Duration::from_secs(3),
            max_tasks_per_offer: 8,
            tasks_per_framework: None,
            refuse_seconds: 1.0,
            decline_seconds: 5.0,
            open_together: true,
            offer_remnants: false,
            client_endpoints: 64,
            master_args: Vec::new(),
            external: None,
            drain_timeout: Duration::from_secs(60),
            echo_exe: None,
            rate: None,
        }
    }
}

/// State shared by every emulated peer of a run.
pub struct Shared {
    t0: Instant,
    /// Per agent: when its resources were last freed (ns since `t0`, plus one; 0 = not since
    /// its last offer).
    freed: Vec<AtomicU64>,
    pub offer_latency: Samples,
    pub accept_to_running: Samples,
    /// Accept → the master's STAGING update at the framework: one pass through the master
    /// (the first half of accept → RUNNING, which then goes on to the agent and back).
    pub accept_to_staging: Samples,
    pub running_to_ack: Samples,
    pub agents_registered: AtomicUsize,
    pub agent_reconnects: AtomicUsize,
    pub agent_errors: AtomicU64,
    pub run_tasks: AtomicU64,
    pub kills: AtomicU64,
    pub acks: AtomicU64,
    pub running_total: AtomicU64,
    /// Frameworks start launching.
    pub open: AtomicBool,
    /// Frameworks stop launching.
    pub stop: AtomicBool,
    /// Frameworks that have subscribed at least once.
    pub frameworks_registered: AtomicUsize,
    /// Tasks that arrived in the frameworks' queues (the arrivals mode).
    pub arrived: AtomicU64,
}

impl Shared {
    fn new(agents: usize) -> Self {
        Self {
            t0: Instant::now(),
            freed: (0..agents).map(|_| AtomicU64::new(0)).collect(),
            offer_latency: Samples::default(),
            accept_to_running: Samples::default(),
            accept_to_staging: Samples::default(),
            running_to_ack: Samples::default(),
            agents_registered: AtomicUsize::new(0),
            agent_reconnects: AtomicUsize::new(0),
            agent_errors: AtomicU64::new(0),
            run_tasks: AtomicU64::new(0),
            kills: AtomicU64::new(0),
            acks: AtomicU64::new(0),
            running_total: AtomicU64::new(0),
            open: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            frameworks_registered: AtomicUsize::new(0),
            arrived: AtomicU64::new(0),
        }
    }

    /// Agent `idx` freed resources now (keeps the earliest not yet offered).
    pub fn freed(&self, idx: usize) {
        let ns = self.t0.elapsed().as_nanos() as u64 + 1;
        if let Some(f) = self.freed.get(idx) {
            let _ = f.compare_exchange(0, ns, Relaxed, Relaxed);
        }
    }

    /// Agent `idx` was offered at `at`: one offer-latency sample if it freed resources since.
    pub fn offered(&self, idx: usize, at: Instant) {
        let Some(f) = self.freed.get(idx) else { return };
        let ns = f.swap(0, Relaxed);
        if ns > 0 {
            let freed = self.t0 + Duration::from_nanos(ns - 1);
            self.offer_latency
                .record(at.saturating_duration_since(freed));
        }
    }
}

pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Agents started at once while setting up (setup is not measured).
const WAVE: usize = 500;

/// Runs the load and returns what it measured. Needs a multi-threaded tokio runtime.
pub async fn run(cfg: LoadConfig) -> anyhow::Result<Report> {
    let dir = TempDir::new("gantry-load")?;
    let mut own_master = None;
    let (quic_addr, http_addr, pid, tls_dir) = match &cfg.external {
        Some(e) => {
            // The operator API speaks HTTPS with the dev operator certificate from its TLS dir.
            crate::register_http(e.http, &e.tls_dir, false);
            (e.quic, e.http, e.pid, e.tls_dir.clone())
        }
        None => {
            let tls_dir = dir.path().join("tls");
            let mut args: Vec<&str> = vec!["--max-connections-per-address", "0"];
            args.extend(cfg.master_args.iter().map(String::as_str));
            let m = tokio::task::block_in_place(|| MasterProc::start(dir.path(), &tls_dir, &args))?;
            let out = (m.quic, m.http, Some(m.proc.pid() as u32), tls_dir);
            own_master = Some(m);
            out
        }
    };
    let result = drive(&cfg, quic_addr, http_addr, pid, &tls_dir).await;
    // A failed run, or one that lost tasks: the master's last lines (its warnings and errors
    // only when the run completed: why a peer was closed, why tasks ended otherwise).
    let incomplete = match &result {
        Err(_) => Some(false),
        Ok(report) => report.accounted().is_err().then_some(true),
    };
    if let Some(warnings_only) = incomplete {
        if let Some(m) = &own_master {
            let log = std::fs::read_to_string(&m.log).unwrap_or_default();
            let tail: Vec<&str> = log
                .lines()
                .rev()
                .filter(|l| !warnings_only || l.contains("WARN") || l.contains("ERROR"))
                .take(30)
                .collect();
            eprintln!("---- master log (last lines) ----");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
    drop(own_master);
    result
}

/// How often tasks arrive in the frameworks' queues (the arrivals mode).
const ARRIVAL_TICK: Duration = Duration::from_millis(5);

/// Puts tasks in the frameworks' queues at `rate` per second, round robin, until the run
/// stops, and has each framework whose queue grew past its declared demand declare it.
async fn arrivals(
    rate: f64,
    fws: Vec<(
        gantry_sdk::DriverHandle,
        Arc<std::sync::Mutex<framework::Queue>>,
    )>,
    task: Resources,
    shared: Arc<Shared>,
) {
    if fws.is_empty() || rate <= 0.0 {
        return;
    }
    let mut tick = tokio::time::interval(ARRIVAL_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = Instant::now();
    let (mut made, mut next) = (0u64, 0usize);
    let mut due_per_fw = vec![0usize; fws.len()];
    while !shared.stop.load(Relaxed) {
        tick.tick().await;
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        if due <= made {
            continue;
        }
        let n = (due - made) as usize;
        made = due;
        shared.arrived.fetch_add(n as u64, Relaxed);
        let (whole, rest) = (n / fws.len(), n % fws.len());
        for (k, d) in due_per_fw.iter_mut().enumerate() {
            let offset = (k + fws.len() - next) % fws.len();
            *d = whole + usize::from(offset < rest);
        }
        next = (next + rest) % fws.len();
        let now = Instant::now();
        for ((driver, queue), n) in fws.iter().zip(&due_per_fw) {
            if *n == 0 {
                continue;
            }
            let mut q = framework::Queue::lock(queue);
            q.arrive(*n, now);
            q.declare(driver, &task);
        }
    }
}

/// The master's allocation-cycle histogram now (`None` if `/metrics` could not be read).
fn cycle_reading(http: SocketAddr) -> Option<stats::CycleReading> {
    let text = crate::http_get(http, "/metrics").ok()?;
    stats::CycleReading::parse(&text)
}

async fn drive(
    cfg: &LoadConfig,
    quic_addr: SocketAddr,
    http_addr: SocketAddr,
    pid: Option<u32>,
    tls_dir: &std::path::Path,
) -> anyhow::Result<Report> {
    let pid_s = pid.map(|p| p.to_string());
    let master_cpu = || pid_s.as_deref().map(emu::cpu_time).unwrap_or_default();
    let master_rss = || pid_s.as_deref().map(emu::rss_kib).unwrap_or(0) as f64 / 1024.0;
    let mut report = Report {
        agents: cfg.agents,
        frameworks: cfg.frameworks,
        gpus_per_agent: cfg.gpus_per_agent,
        task: cfg.task.clone(),
        task_time_ms: cfg.task_time.as_millis() as u64,
        rate: cfg.rate,
        ..Report::default()
    };
    let task: Resources = cfg.task.parse().context("--task")?;
    let mut agent_res: Resources = cfg.agent_resources.parse().context("--agent-resources")?;
    if cfg.gpus_per_agent > 0 {
        agent_res = agent_res.with("gpus", cfg.gpus_per_agent as f64);
    }

    // The floor, idle.
    let echo = floor::EchoServer::start(tls_dir)?;
    let mut pinger = floor::Pinger::connect(tls_dir, echo.addr).await?;
    let idle_floor = Samples::default();
    pinger.burst(20, &Samples::default()).await?; // warm-up
    pinger.burst(500, &idle_floor).await?;
    report.floor_idle = idle_floor.summary();
    // ... and to another process.
    let echo_proc = match &cfg.echo_exe {
        Some(exe) => Some(tokio::task::block_in_place(|| {
            floor::EchoProcess::spawn(exe, tls_dir)
        })?),
        None => None,
    };
    let mut xpinger = match &echo_proc {
        Some(e) => {
            let mut p = floor::Pinger::connect(tls_dir, e.addr).await?;
            let idle = Samples::default();
            p.burst(20, &Samples::default()).await?;
            p.burst(500, &idle).await?;
            report.floor_xproc_idle = idle.summary();
            Some(p)
        }
        None => None,
    };

    // Agents, in waves.
    let t = Instant::now();
    let configs = tokio::task::block_in_place(|| emu::agent_configs(tls_dir, "load", cfg.agents))?;
    eprintln!("{} agent certificates in {:.1?}", cfg.agents, t.elapsed());
    let shared = Arc::new(Shared::new(cfg.agents));
    let eps: Vec<quinn::Endpoint> = (0..cfg.client_endpoints.max(1))
        .map(|_| emu::client_endpoint())
        .collect::<anyhow::Result<_>>()?;
    let shape = agent::AgentShape {
        resources: agent_res,
        gpus: cfg.gpus_per_agent,
        task_time: cfg.task_time,
    };
    let masters = vec![quic_addr.to_string()];
    let t = Instant::now();
    let mut tasks: Vec<AbortOnDrop> = Vec::with_capacity(cfg.agents + cfg.frameworks + 2);
    let mut configs = configs.into_iter().enumerate();
    let reg_deadline = Instant::now() + Duration::from_secs(120 + cfg.agents as u64 / 50);
    loop {
        let registered = shared.agents_registered.load(Relaxed);
        if registered >= cfg.agents {
            break;
        }
        let started = tasks.len();
        if started < cfg.agents && started < registered + WAVE {
            for (i, c) in configs.by_ref().take(WAVE) {
                tasks.push(AbortOnDrop(tokio::spawn(agent::run(
                    i,
                    eps[i % eps.len()].clone(),
                    c,
                    masters.clone(),
                    shape.clone(),
                    shared.clone(),
                ))));
            }
        }
        if Instant::now() > reg_deadline {
            bail!("only {registered} of {} agents registered", cfg.agents);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    report.registration_s = t.elapsed().as_secs_f64();
    eprintln!(
        "{} agents registered in {:.1} s",
        cfg.agents, report.registration_s
    );

    // Idle cost of the connected agents.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (c0, w0) = (master_cpu(), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    report.master_cpu_idle_pct =
        (master_cpu() - c0).as_secs_f64() / w0.elapsed().as_secs_f64() * 100.0;
    report.master_rss_idle_mib = master_rss();

    // Frameworks.
    let fw_shape = framework::FrameworkShape {
        task,
        max_tasks_per_offer: cfg.max_tasks_per_offer.max(1),
        budget: cfg.tasks_per_framework,
        refuse_seconds: cfg.refuse_seconds,
        decline_seconds: cfg.decline_seconds,
        arrivals: cfg.rate.is_some(),
    };
    if !cfg.open_together {
        shared.open.store(true, Relaxed);
    }
    let t = Instant::now();
    let mut counters = Vec::new();
    let mut handles = Vec::new();
    let mut queues = Vec::new();
    for i in 0..cfg.frameworks {
        let c = Arc::new(framework::FrameworkCounters::default());
        counters.push(c.clone());
        let mut dc = crate::driver_config(
            masters.clone(),
            tls_dir.to_path_buf(),
            &format!("load-fw-{i}"),
            vec![format!("load{}", i % 10)],
        );
        if cfg.gpus_per_agent > 0 {
            dc.info.capabilities.push(Capability::GpuResources);
        }
        if !cfg.offer_remnants {
            dc.info.min_allocatable = vec![fw_shape.task.clone()];
        }
        if cfg.open_together {
            // Nothing to launch yet: offered nothing until the run opens (else the first to
            // subscribe is offered the whole cluster, declines it, and is filtered everywhere).
            dc.info.suppressed_roles = dc.info.roles.clone();
        }
        let driver = gantry_sdk::Driver::new(dc);
        handles.push(driver.handle());
        let sched = framework::LoadFramework::new(i, fw_shape.clone(), shared.clone(), c);
        queues.push(sched.queue.clone());
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = driver.run(sched).await {
                tracing::error!(framework = i, "driver: {e}");
            }
        })));
    }

    // Every framework subscribed (waiting suppressed), then they start together.
    if cfg.open_together {
        let deadline = Instant::now() + Duration::from_secs(60 + cfg.frameworks as u64 / 10);
        while shared.frameworks_registered.load(Relaxed) < cfg.frameworks {
            if Instant::now() > deadline {
                bail!(
                    "only {} of {} frameworks subscribed",
                    shared.frameworks_registered.load(Relaxed),
                    cfg.frameworks
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        report.subscribe_s = t.elapsed().as_secs_f64();
        shared.open.store(true, Relaxed);
        for h in &handles {
            h.revive(Vec::new());
        }
    }
    if let Some(rate) = cfg.rate {
        let fws = handles
            .iter()
            .cloned()
            .zip(queues.iter().cloned())
            .collect();
        tasks.push(AbortOnDrop(tokio::spawn(arrivals(
            rate,
            fws,
            fw_shape.task.clone(),
            shared.clone(),
        ))));
    }

    // The launch window: floor pings paced, the master's RSS once a second, its cycle
    // histogram (`/metrics`, a few kilobytes) at both ends. Not `/state`: the master builds
    // that whole view (every agent and task) on its core loop, a load of its own at this size.
    let loaded_floor = Arc::new(Samples::default());
    let ping_stop = Arc::new(AtomicBool::new(false));
    tasks.push(AbortOnDrop(tokio::spawn(pinger.paced(
        Duration::from_millis(10),
        loaded_floor.clone(),
        ping_stop.clone(),
    ))));
    let loaded_xfloor = Arc::new(Samples::default());
    if let Some(p) = xpinger.take() {
        let (out, stop) = (loaded_xfloor.clone(), ping_stop.clone());
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            // Between the other pinger's pings.
            tokio::time::sleep(Duration::from_millis(5)).await;
            p.paced(Duration::from_millis(10), out, stop).await
        })));
    }
    let (c0, h0, w0) = (master_cpu(), emu::cpu_time("self"), Instant::now());
    let drops0 = emu::udp_rcvbuf_errors();
    let r0 = shared.running_total.load(Relaxed);
    let cycles0 = tokio::task::block_in_place(|| cycle_reading(http_addr));
    let mut rss_peak = report.master_rss_idle_mib;
    let window_end = w0 + cfg.launch_window;
    while Instant::now() < window_end {
        tokio::time::sleep(Duration::from_secs(1).min(window_end - Instant::now())).await;
        rss_peak = rss_peak.max(master_rss());
    }
    let window = w0.elapsed();
    let launched_in_window = shared.running_total.load(Relaxed) - r0;
    let cpu_window = master_cpu() - c0;
    let harness_cpu = emu::cpu_time("self") - h0;
    shared.stop.store(true, Relaxed);
    ping_stop.store(true, Relaxed);
    report.window_s = window.as_secs_f64();
    report.launches_per_s = launched_in_window as f64 / window.as_secs_f64();
    report.master_cpu_load_pct = cpu_window.as_secs_f64() / window.as_secs_f64() * 100.0;
    report.harness_cpu_load_pct = harness_cpu.as_secs_f64() / window.as_secs_f64() * 100.0;
    if let (Some(a), Some(b)) = (
        cycles0,
        tokio::task::block_in_place(|| cycle_reading(http_addr)),
    ) {
        report.cycles = b.since(&a);
    }
    report.load_average = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0);

    // Drain: every launched task ends.
    let drain_deadline = Instant::now() + cfg.task_time + cfg.drain_timeout;
    let mut said = Instant::now();
    loop {
        let in_flight: u64 = counters.iter().map(|c| c.in_flight()).sum();
        if in_flight == 0 || Instant::now() >= drain_deadline {
            break;
        }
        if said.elapsed() >= Duration::from_secs(10) {
            said = Instant::now();
            eprintln!("draining: {in_flight} tasks in flight");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        rss_peak = rss_peak.max(master_rss());
    }
    // Acknowledgements of the last updates reach the agents just after.
    let ack_deadline = Instant::now() + Duration::from_secs(5);
    let expected_acks = || 3 * shared.run_tasks.load(Relaxed);
    while shared.acks.load(Relaxed) < expected_acks() && Instant::now() < ack_deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    report.master_rss_peak_mib = rss_peak;
    report.udp_rcvbuf_errors = emu::udp_rcvbuf_errors().saturating_sub(drops0);

    let sum = |f: fn(&framework::FrameworkCounters) -> u64| counters.iter().map(|c| f(c)).sum();
    report.launched = sum(|c| c.launched.load(Relaxed));
    report.running = sum(|c| c.running.load(Relaxed));
    report.finished = sum(|c| c.finished.load(Relaxed));
    report.not_finished = sum(|c| c.not_finished.load(Relaxed));
    report.dropped = sum(|c| c.dropped.load(Relaxed));
    report.stale_offers = sum(|c| c.stale_offers.load(Relaxed));
    report.in_flight_at_end = sum(|c| c.in_flight());
    report.framework_errors = sum(|c| c.errors.load(Relaxed));
    report.framework_reconnects = sum(|c| c.reconnects.load(Relaxed));
    report.offers = sum(|c| c.offers.load(Relaxed));
    report.declined_offers = sum(|c| c.declined.load(Relaxed));
    report.declined_unfit = sum(|c| c.declined_unfit.load(Relaxed));
    report.frameworks_without_offers = counters
        .iter()
        .filter(|c| c.offers.load(Relaxed) == 0)
        .count();
    report.agent_run_tasks = shared.run_tasks.load(Relaxed);
    report.arrived = shared.arrived.load(Relaxed);
    report.waiting_at_end = queues
        .iter()
        .map(|q| framework::Queue::lock(q).waiting() as u64)
        .sum();
    report.agent_reconnects = shared.agent_reconnects.load(Relaxed);
    report.agent_errors = shared.agent_errors.load(Relaxed);
    report.offer_latency = shared.offer_latency.summary();
    report.accept_to_running = shared.accept_to_running.summary();
    report.accept_to_staging = shared.accept_to_staging.summary();
    report.running_to_ack = shared.running_to_ack.summary();
    report.floor_loaded = loaded_floor.summary();
    report.floor_xproc_loaded = loaded_xfloor.summary();

    // Tear down: frameworks first (teardown), then agents and sockets.
    for h in &handles {
        h.stop();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(tasks);
    for ep in &eps {
        ep.close(0u32.into(), b"load done");
    }
    drop(echo);
    Ok(report)
}
