//! `gantry-load`: drives one real `gantry-master` with N emulated agents and M emulated
//! frameworks over real QUIC and mutual TLS, and prints offer latency, accept → RUNNING,
//! RUNNING → acknowledged, launches per second, the master's allocation cycle, CPU and memory,
//! next to the floor (a bare QUIC ping over the same loopback and TLS). See
//! docs/benchmarks.md, "Launch throughput", and [`gantry_tests::load`].

/// The harness shares the two cores with the master it measures: glibc's malloc took a fifth of
/// its CPU (docs/benchmarks.md), mimalloc takes a fraction of that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gantry_tests::load::{self, ExternalMaster, LoadConfig};

/// Load harness: one master, many emulated agents and frameworks over real QUIC.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Emulated agents.
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Emulated frameworks (SDK drivers), spread over 10 roles.
    #[arg(long, default_value_t = 200)]
    frameworks: usize,
    /// GPUs per agent (0: none; frameworks then do not ask for GPU offers).
    #[arg(long, default_value_t = 8)]
    gpus_per_agent: usize,
    /// Resources of each agent besides its GPUs.
    #[arg(long, default_value = "cpus:64;mem:524288")]
    agent_resources: String,
    /// Resources of each task (use no gpus with --gpus-per-agent 0).
    #[arg(long, default_value = "cpus:1;mem:1024;gpus:1")]
    task: String,
    /// How long each emulated task runs, milliseconds.
    #[arg(long, default_value_t = 1000)]
    task_ms: u64,
    /// How long frameworks keep launching, seconds.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
    /// Tasks a framework launches on one offer at most.
    #[arg(long, default_value_t = 8)]
    max_tasks_per_offer: usize,
    /// Tasks per framework at most (default: launch until --duration ends).
    #[arg(long)]
    tasks_per_framework: Option<u64>,
    /// Filter on the unused part of an accepted offer (and on declines once launching
    /// stopped), seconds.
    #[arg(long, default_value_t = 1.0)]
    refuse_seconds: f64,
    /// Filter on an offer where not one task fits (what is left of an agent whose GPUs are
    /// taken), seconds; Mesos's default filter is 5 s.
    #[arg(long, default_value_t = 5.0)]
    decline_seconds: f64,
    /// Each framework starts launching as soon as it subscribes (the first is then offered
    /// the whole cluster); by default they wait, suppressed, and start together once every
    /// one has subscribed.
    #[arg(long)]
    staggered_start: bool,
    /// Frameworks list no minimum allocatable quantity (by default each lists its task shape),
    /// so they are also offered what no task fits in and decline it (`--decline-seconds`).
    #[arg(long)]
    offer_remnants: bool,
    /// Tasks arrive at this many per second, spread evenly over the frameworks, which queue
    /// them and declare the queue as their demand (demand-aware offers) and launch from it
    /// (default: frameworks launch on every offer, which saturates the cluster; latencies are
    /// then queueing under saturation).
    #[arg(long)]
    rate: Option<f64>,
    /// Client UDP sockets the emulated agents share.
    #[arg(long, default_value_t = 64)]
    client_endpoints: usize,
    /// Extra flag for the started master (repeat; e.g. --master-arg=--allocation-interval-ms=500).
    #[arg(long, allow_hyphen_values = true)]
    master_arg: Vec<String>,
    /// Use a running master at this QUIC address instead of starting one (needs --master-http
    /// and --tls-dir).
    #[arg(long, requires_all = ["master_http", "tls_dir"])]
    master: Option<SocketAddr>,
    /// The running master's HTTP address (for /state).
    #[arg(long)]
    master_http: Option<SocketAddr>,
    /// The running master's pid (for CPU and memory).
    #[arg(long)]
    master_pid: Option<u32>,
    /// The running master's dev TLS directory (with ca.key).
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seconds to wait for launched tasks to end after the window.
    #[arg(long, default_value_t = 60)]
    drain_timeout: u64,
    /// Tokio worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Only serve the floor's echo (with the master certificate of --tls-dir) until standard
    /// input closes; the harness runs itself so to ping across processes.
    #[arg(long, hide = true, requires = "tls_dir")]
    serve_echo: bool,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse_from(gantry_sdk::config_file::expand_args()?);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,quinn=warn,quinn_proto=warn")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    if a.serve_echo {
        let dir = a.tls_dir.context("--tls-dir")?;
        return tokio::runtime::Runtime::new()?.block_on(load::floor::serve_echo(&dir));
    }
    anyhow::ensure!(a.duration > 0.0, "--duration must be positive");
    let external = match a.master {
        Some(quic) => Some(ExternalMaster {
            quic,
            http: a.master_http.context("--master-http")?,
            pid: a.master_pid,
            tls_dir: a.tls_dir.clone().context("--tls-dir")?,
        }),
        None => None,
    };
    let cfg = LoadConfig {
        agents: a.agents,
        frameworks: a.frameworks,
        gpus_per_agent: a.gpus_per_agent,
        agent_resources: a.agent_resources,
        task: a.task,
        task_time: Duration::from_millis(a.task_ms),
        launch_window: Duration::from_secs_f64(a.duration),
        max_tasks_per_offer: a.max_tasks_per_offer,
        tasks_per_framework: a.tasks_per_framework,
        refuse_seconds: a.refuse_seconds,
        decline_seconds: a.decline_seconds,
        open_together: !a.staggered_start,
        offer_remnants: a.offer_remnants,
        client_endpoints: a.client_endpoints,
        master_args: a.master_arg,
        external,
        drain_timeout: Duration::from_secs(a.drain_timeout),
        rate: a.rate,
        echo_exe: std::env::current_exe().ok(),
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = a.threads {
        rt.worker_threads(n.max(1));
    }
    let report = rt.enable_all().build()?.block_on(load::run(cfg))?;
    print!("{}", report.table());
    if let Some(path) = a.json {
        std::fs::write(&path, serde_json::to_string_pretty(&report.json())?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Err(e) = report.accounted() {
        eprintln!("warning: not every task is accounted for: {e:#}");
    }
    Ok(())
}
