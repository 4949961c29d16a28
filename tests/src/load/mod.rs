//! The load harness behind `gantry-load` (docs/benchmarks.md, "Launch throughput"): one real
//! `gantry-master` process (started here, or one given by address), N emulated agents and M
//! emulated frameworks over real QUIC with real mutual TLS, each with its own certificate from
//! the dev TLS directory, in this process — the master cannot tell them from real ones.
//!
//! - [`agent`]: the emulated agent (tasks "run" for a fixed time without processes);
//! - [`framework`]: the emulated framework, a [`gantry_sdk::Scheduler`] run by the SDK's
//!   driver, with a task shape and a decline/suppress policy;
//! - [`floor`]: a bare QUIC echo over the same loopback and TLS, the floor for latencies;
//! - [`stats`]: latency samples and p50/p99/max.
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
use stats::{Samples, Summary};

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

/// Everything a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub agents: usize,
    pub frameworks: usize,
    pub gpus_per_agent: usize,
    pub task: String,
    pub task_time_ms: u64,
    /// The arrival rate (tasks per second) in the arrivals mode.
    pub rate: Option<f64>,
    /// Seconds from starting the frameworks to every one subscribed.
    pub subscribe_s: f64,
    /// Tasks that arrived in the frameworks' queues (the arrivals mode) ...
    pub arrived: u64,
    /// ... and of those, still waiting for an offer when the run stopped launching.
    pub waiting_at_end: u64,
    pub window_s: f64,
    pub registration_s: f64,
    pub launched: u64,
    pub running: u64,
    pub finished: u64,
    pub not_finished: u64,
    /// Tasks the master DROPPED (an accept racing a combining accept/decline on the same
    /// agent); not counted in `launched`.
    pub dropped: u64,
    /// `UnknownOffer` answers to such racing accepts/declines (not in `framework_errors`).
    pub stale_offers: u64,
    pub in_flight_at_end: u64,
    pub framework_errors: u64,
    pub framework_reconnects: u64,
    pub frameworks_without_offers: usize,
    pub offers: u64,
    pub declined_offers: u64,
    /// Of those, offers where not one task fitted (declined for `--decline-seconds`).
    pub declined_unfit: u64,
    pub agent_run_tasks: u64,
    pub agent_reconnects: usize,
    pub agent_errors: u64,
    pub launches_per_s: f64,
    pub offer_latency: Summary,
    pub accept_to_running: Summary,
    pub accept_to_staging: Summary,
    pub running_to_ack: Summary,
    pub floor_idle: Summary,
    pub floor_loaded: Summary,
    /// The same ping to an echo server in a process of its own (empty without
    /// [`LoadConfig::echo_exe`]).
    pub floor_xproc_idle: Summary,
    pub floor_xproc_loaded: Summary,
    /// The master's allocation cycles in the launch window (its `/metrics` histogram).
    pub cycles: stats::Cycles,
    pub master_cpu_idle_pct: f64,
    pub master_cpu_load_pct: f64,
    pub harness_cpu_load_pct: f64,
    pub master_rss_idle_mib: f64,
    pub master_rss_peak_mib: f64,
    /// `/proc/loadavg` (1 minute) at the end of the launch window: other work on the machine.
    pub load_average: f64,
    /// UDP datagrams the kernel dropped on full receive buffers from the start of the window to
    /// the end of the drain (machine-wide `RcvbufErrors`).
    pub udp_rcvbuf_errors: u64,
}

/// accept → RUNNING p99 over each floor's p99 (`None`: no samples of one of them). The
/// issue's target is 3× the bare round trip plus the emulated launch, which is nothing here:
/// an emulated agent answers a launch with STARTING and RUNNING at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct TargetRatios {
    pub idle: Option<f64>,
    pub loaded: Option<f64>,
    pub xproc_idle: Option<f64>,
    pub xproc_loaded: Option<f64>,
}

impl TargetRatios {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "in_process_idle": self.idle,
            "in_process_loaded": self.loaded,
            "other_process_idle": self.xproc_idle,
            "other_process_loaded": self.xproc_loaded,
        })
    }
}

/// `2.7x`, or `-` without samples.
fn ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.1}x"))
}

impl Report {
    /// accept → RUNNING p99 over the p99 of each floor.
    pub fn target_ratios(&self) -> TargetRatios {
        let a = &self.accept_to_running;
        let over = |floor: &Summary| {
            (a.count > 0 && floor.count > 0 && floor.p99_ms > 0.0).then(|| a.p99_ms / floor.p99_ms)
        };
        TargetRatios {
            idle: over(&self.floor_idle),
            loaded: over(&self.floor_loaded),
            xproc_idle: over(&self.floor_xproc_idle),
            xproc_loaded: over(&self.floor_xproc_loaded),
        }
    }

    /// Every launched task finished, none ended otherwise, every framework got offers.
    pub fn accounted(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.launched > 0, "no task was launched");
        anyhow::ensure!(
            self.launched == self.finished && self.not_finished == 0 && self.in_flight_at_end == 0,
            "launched {} but finished {} ({} ended otherwise, {} still in flight)",
            self.launched,
            self.finished,
            self.not_finished,
            self.in_flight_at_end
        );
        anyhow::ensure!(
            self.frameworks_without_offers == 0,
            "{} frameworks got no offer",
            self.frameworks_without_offers
        );
        Ok(())
    }

    pub fn json(&self) -> serde_json::Value {
        let per_k = self.agents as f64 / 1000.0;
        serde_json::json!({
            "agents": self.agents,
            "frameworks": self.frameworks,
            "gpus_per_agent": self.gpus_per_agent,
            "task": self.task,
            "task_time_ms": self.task_time_ms,
            "arrival_rate_per_s": self.rate,
            "subscribe_s": self.subscribe_s,
            "arrived": self.arrived,
            "waiting_at_end": self.waiting_at_end,
            "window_s": self.window_s,
            "registration_s": self.registration_s,
            "tasks": {
                "launched": self.launched,
                "running": self.running,
                "finished": self.finished,
                "not_finished": self.not_finished,
                "dropped": self.dropped,
                "in_flight_at_end": self.in_flight_at_end,
                "agent_run_tasks": self.agent_run_tasks,
            },
            "offers": self.offers,
            "declined_offers": self.declined_offers,
            "declined_unfit": self.declined_unfit,
            "framework_errors": self.framework_errors,
            "stale_offers": self.stale_offers,
            "framework_reconnects": self.framework_reconnects,
            "frameworks_without_offers": self.frameworks_without_offers,
            "agent_reconnects": self.agent_reconnects,
            "agent_errors": self.agent_errors,
            "launches_per_s": self.launches_per_s,
            "offer_latency": self.offer_latency.json(),
            "accept_to_running": self.accept_to_running.json(),
            "accept_to_staging": self.accept_to_staging.json(),
            "running_to_ack": self.running_to_ack.json(),
            "quic_ping_idle": self.floor_idle.json(),
            "quic_ping_loaded": self.floor_loaded.json(),
            "quic_ping_other_process_idle": self.floor_xproc_idle.json(),
            "quic_ping_other_process_loaded": self.floor_xproc_loaded.json(),
            "accept_to_running_p99_over_ping_p99": self.target_ratios().json(),
            "allocation_cycles": {
                "count": self.cycles.count,
                "mean_ms": self.cycles.mean_ms,
                "p50_le_ms": self.cycles.p50_le_ms,
                "p99_le_ms": self.cycles.p99_le_ms,
                "max_le_ms": self.cycles.max_le_ms,
            },
            "master_cpu_idle_pct": self.master_cpu_idle_pct,
            "master_cpu_load_pct": self.master_cpu_load_pct,
            "master_cpu_load_pct_per_1000_agents": self.master_cpu_load_pct / per_k,
            "harness_cpu_load_pct": self.harness_cpu_load_pct,
            "master_rss_idle_mib": self.master_rss_idle_mib,
            "master_rss_peak_mib": self.master_rss_peak_mib,
            "master_rss_peak_mib_per_1000_agents": self.master_rss_peak_mib / per_k,
            "load_average_1m": self.load_average,
            "udp_rcvbuf_errors": self.udp_rcvbuf_errors,
        })
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let per_k = self.agents as f64 / 1000.0;
        let row = |name: &str, s: &Summary| {
            format!(
                "{name:<34} {:>9} {:>9.2} {:>9.2} {:>9.2}\n",
                s.count, s.p50_ms, s.p99_ms, s.max_ms
            )
        };
        let mut t = format!(
            "gantry-load: {} agents ({} GPUs each), {} frameworks, task {} for {} ms, launch window {:.1} s, {}\n",
            self.agents, self.gpus_per_agent, self.frameworks, self.task, self.task_time_ms, self.window_s,
            self.rate.map_or("saturating (launch on every offer)".to_string(), |r| format!("tasks arrive at {r:.0}/s into demand-declaring queues"))
        );
        t += &format!(
            "{:<34} {:>9} {:>9} {:>9} {:>9}\n",
            "latency (ms)", "samples", "p50", "p99", "max"
        );
        let offer_row = if self.rate.is_some() {
            "offer (demanded -> offered)"
        } else {
            "offer (freed -> offered)"
        };
        t += &row(offer_row, &self.offer_latency);
        t += &row("accept -> RUNNING", &self.accept_to_running);
        t += &row("  of which accept -> STAGING", &self.accept_to_staging);
        t += &row("RUNNING -> acknowledged", &self.running_to_ack);
        t += &row("floor: QUIC ping, idle", &self.floor_idle);
        t += &row("floor: QUIC ping, under load", &self.floor_loaded);
        if self.floor_xproc_idle.count > 0 {
            t += &row("floor: ping another process, idle", &self.floor_xproc_idle);
            t += &row("  ... under load", &self.floor_xproc_loaded);
        }
        let r = self.target_ratios();
        t += &format!(
            "accept -> RUNNING p99 over ping p99 (target <= 3x; emulated launch 0): {} under load, {} idle; to another process {} under load, {} idle\n",
            ratio(r.loaded), ratio(r.idle), ratio(r.xproc_loaded), ratio(r.xproc_idle)
        );
        t += &format!(
            "launches/s sustained {:.0}; tasks launched {}, RUNNING {}, FINISHED {}, other end {}, in flight {}, dropped (relaunchable) {}\n",
            self.launches_per_s, self.launched, self.running, self.finished, self.not_finished, self.in_flight_at_end, self.dropped
        );
        if self.rate.is_some() {
            t += &format!(
                "tasks arrived {}, launched {}, still waiting when launching stopped {}\n",
                self.arrived, self.launched, self.waiting_at_end
            );
        }
        t += &format!(
            "offers {} (declined {}, {} of them where no task fitted; stale {}), framework errors {}, framework reconnects {}, frameworks without offers {}, agent reconnects {}\n",
            self.offers, self.declined_offers, self.declined_unfit, self.stale_offers, self.framework_errors, self.framework_reconnects, self.frameworks_without_offers, self.agent_reconnects
        );
        let c = &self.cycles;
        t += &format!(
            "allocation cycles in the window {} (master's /metrics histogram): mean {:.2} ms, p50 <= {} ms, p99 <= {} ms, max <= {} ms\n",
            c.count, c.mean_ms, c.p50_le_ms, c.p99_le_ms, c.max_le_ms
        );
        t += &format!(
            "master CPU {:.0}% idle / {:.0}% under load ({:.1}% per 1,000 agents); RSS {:.0} MiB idle / {:.0} MiB peak ({:.1} MiB per 1,000 agents); harness CPU {:.0}%; registration {:.1} s; load average {:.1}; UDP receive-buffer drops {}\n",
            self.master_cpu_idle_pct, self.master_cpu_load_pct, self.master_cpu_load_pct / per_k,
            self.master_rss_idle_mib, self.master_rss_peak_mib, self.master_rss_peak_mib / per_k,
            self.harness_cpu_load_pct, self.registration_s, self.load_average, self.udp_rcvbuf_errors
        );
        t
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
