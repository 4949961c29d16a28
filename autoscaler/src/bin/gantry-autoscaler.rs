//! `gantry-autoscaler`: scales node pools from the master's unplaceable demand
//! (docs/autoscaling.md).
//!
//! ```text
//! gantry-autoscaler check --config pools.toml
//! gantry-autoscaler simulate --config pools.toml --openb openb_pod_list_default.csv
//!     [--spot-rate PER_NODE_HOUR --seed N --checkpoint CLASS=SECS... --on-demand-classes LS,..]
//!     [--interruptions FILE --checkpoint-on-notice CLASS=SECS...]
//! gantry-autoscaler run --config pools.toml --master https://HOST:PORT --tls-dir DIR
//!     [--operator NAME | --token-file FILE] [--status-file FILE] [--totals-file FILE]
//!     [--metrics-listen ADDR]
//!     [--etcd URLS [--ha-id NAME] [--ha-prefix PREFIX] [--ha-lease-ttl 3s]]
//!     [--local-agent-bin PATH --local-master QUIC_ADDR --local-work-dir DIR
//!      --local-nvml-lib PATH --local-agent-arg ARG...]
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use gantry_autoscaler::config::{Config, ProviderSpec};
use gantry_autoscaler::core::Core;
use gantry_autoscaler::provider::{ExecProvider, LocalConfig, LocalProvider, Provider};
use gantry_autoscaler::runtime::Runtime;
use gantry_autoscaler::totals::{decode, FileStore, Totals, TotalsError, TotalsStore};
use gantry_master::client::{BlockingClient, ClientConfig, Credentials};
use gantry_master::election::{Election, EtcdElectionConfig};

#[derive(Parser)]
#[command(
    name = "gantry-autoscaler",
    about = "Scales Gantry node pools from demand"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reads and checks a pools file.
    Check {
        /// The pools file (TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Runs the loop until SIGTERM or SIGINT.
    Run(Box<RunArgs>),
    /// Replays a workload (an openb pod list) against the pools on the same core, then against
    /// a static fleet sized for the elastic run's peak; prints both as JSON.
    Simulate {
        /// The pools file (TOML).
        #[arg(long)]
        config: PathBuf,
        /// An Alibaba openb pod list (`openb_pod_list_*.csv`).
        #[arg(long)]
        openb: PathBuf,
        /// Simulated seconds per tick (one core round per tick).
        #[arg(long, default_value_t = 60)]
        tick_secs: u64,
        /// Simulated seconds from a create to the node registering.
        #[arg(long, default_value_t = 180)]
        provision_secs: u64,
        /// Spot notices per spot node-hour (a seeded Poisson process; 0: none).
        #[arg(long, default_value_t = 0.0)]
        spot_rate: f64,
        /// The seed of the spot notices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// A QoS class's checkpoint interval, `CLASS=SECS` (repeatable; 0: none). Defaults:
        /// `BE=600`, `Burstable=600`; other classes do not checkpoint.
        #[arg(long, value_parser = parse_class_secs)]
        checkpoint: Vec<(String, u64)>,
        /// A QoS class that checkpoints at its node's notice (or a consolidation's drain),
        /// with the seconds its checkpoint takes, `CLASS=SECS` (repeatable; none by default).
        #[arg(long, value_parser = parse_class_secs)]
        checkpoint_on_notice: Vec<(String, u64)>,
        /// Interruption times, CSV `time_s,pool[,node]` (seconds after the first arrival;
        /// docs/autoscaling.md), beside the `--spot-rate` notices.
        #[arg(long)]
        interruptions: Option<PathBuf>,
        /// QoS classes that prefer on-demand capacity (comma-separated; default
        /// `LS,Guaranteed`; `none` for none).
        #[arg(long)]
        on_demand_classes: Option<String>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// The pools file (TOML).
    #[arg(long)]
    config: PathBuf,
    /// The master's operator API, `https://HOST:PORT`.
    #[arg(long)]
    master: String,
    /// The cluster's TLS directory (`ca.pem`, and the operator certificate).
    #[arg(long)]
    tls_dir: PathBuf,
    /// The operator certificate `operator-NAME.pem/.key` in the TLS directory to present.
    #[arg(long, default_value = "autoscaler")]
    operator: String,
    /// A file holding an operator bearer token to present instead of a certificate.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Where each round's report (cost and nodes per pool) is written, as JSON.
    #[arg(long)]
    status_file: Option<PathBuf>,
    /// Where the report's totals survive restarts (without `--etcd`; with it they are kept
    /// in etcd at `PREFIX/totals`). Default: the status file's path with the extension
    /// `totals.json`; without either, the totals start from zero at each start.
    #[arg(long)]
    totals_file: Option<PathBuf>,
    /// Serve the report for Prometheus at `http://ADDR/metrics` (plain HTTP: bind it to
    /// loopback or a scrape network).
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// HA: etcd endpoints (`URL[,URL...]`): copies of the autoscaler with the same
    /// `--ha-prefix` elect one that acts; the others stand by and take over when its lease
    /// lapses (the masters' election code).
    #[arg(long)]
    etcd: Option<String>,
    /// HA: this copy's name in the election (default: `HOST-PID`).
    #[arg(long)]
    ha_id: Option<String>,
    /// HA: the etcd key prefix of the election (`PREFIX/leader`).
    #[arg(long, default_value = "/gantry/autoscaler")]
    ha_prefix: String,
    /// HA: the election's lease TTL (whole seconds; a standby takes over within about this
    /// long of the leader dying).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    ha_lease_ttl: Duration,
    /// Local provider: the `gantry-agent` binary (default: next to this one).
    #[arg(long)]
    local_agent_bin: Option<PathBuf>,
    /// Local provider: the masters' QUIC addresses for the agents' `--master`.
    #[arg(long)]
    local_master: Option<String>,
    /// Local provider: where the agents' work directories and logs go.
    #[arg(long)]
    local_work_dir: Option<PathBuf>,
    /// Local provider: the stand-in NVML library for GPU pools.
    #[arg(long)]
    local_nvml_lib: Option<PathBuf>,
    /// Local provider: one more `gantry-agent` flag for every node (repeatable; `{node}` is
    /// the node id).
    #[arg(long, allow_hyphen_values = true)]
    local_agent_arg: Vec<String>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Check { config } => {
            let c = Config::load(&config)?;
            for p in &c.pools {
                println!(
                    "{}: {} x (cpus:{} mem:{} gpus:{} {}), {}/h{}, {}..{} nodes",
                    p.name,
                    p.max,
                    p.cpus,
                    p.mem,
                    p.gpus,
                    p.gpu_model.as_deref().unwrap_or("-"),
                    p.price_per_hour,
                    if p.spot { " spot" } else { "" },
                    p.min,
                    p.max
                );
            }
            Ok(())
        }
        Command::Run(args) => run(*args),
        Command::Simulate {
            config,
            openb,
            tick_secs,
            provision_secs,
            spot_rate,
            seed,
            checkpoint,
            checkpoint_on_notice,
            interruptions,
            on_demand_classes,
        } => {
            let mut s = gantry_autoscaler::sim::SimSettings::new(tick_secs, provision_secs);
            if !(spot_rate.is_finite() && spot_rate >= 0.0) {
                bail!("--spot-rate must be 0 or more");
            }
            s.spot.rate_per_node_hour = spot_rate;
            s.spot.seed = seed;
            s.checkpoint_s.extend(checkpoint);
            s.checkpoint_on_notice.extend(checkpoint_on_notice);
            if let Some(f) = interruptions {
                let text = std::fs::read_to_string(&f)
                    .with_context(|| format!("reading {}", f.display()))?;
                s.interruptions = gantry_autoscaler::sim::parse_interruptions(&text)
                    .with_context(|| format!("{}", f.display()))?;
            }
            if let Some(c) = on_demand_classes {
                s.on_demand_classes = c
                    .split(',')
                    .map(str::trim)
                    .filter(|c| !c.is_empty() && *c != "none")
                    .map(str::to_string)
                    .collect();
            }
            simulate(&config, &openb, s)
        }
    }
}

fn parse_class_secs(text: &str) -> Result<(String, u64), String> {
    let (class, secs) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not CLASS=SECS"))?;
    let secs = secs
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: {secs:?} is not a number of seconds"))?;
    Ok((class.trim().to_string(), secs))
}

fn simulate(
    config: &std::path::Path,
    openb: &std::path::Path,
    settings: gantry_autoscaler::sim::SimSettings,
) -> anyhow::Result<()> {
    use gantry_autoscaler::sim;
    let config = Config::load(config)?;
    let text =
        std::fs::read_to_string(openb).with_context(|| format!("reading {}", openb.display()))?;
    let tasks = sim::parse_openb(&text).with_context(|| format!("{}", openb.display()))?;
    let t0 = std::time::Instant::now();
    let elastic = sim::simulate_consolidation(&config, &tasks, &settings);
    let fixed = sim::simulate(
        &sim::static_fleet(&config, &elastic.peak_nodes),
        &tasks,
        &settings,
    );
    let out = serde_json::json!({
        "trace": openb.display().to_string(),
        "tasks": tasks.len(),
        "tick_secs": settings.tick_s,
        "provision_secs": settings.provision_s,
        "spot_rate_per_node_hour": settings.spot.rate_per_node_hour,
        "seed": settings.spot.seed,
        "checkpoint_secs": settings.checkpoint_s,
        "checkpoint_on_notice_secs": settings.checkpoint_on_notice,
        "file_interruptions": settings.interruptions.len(),
        "consolidation": config.autoscaler.consolidation,
        "on_demand_classes": settings.on_demand_classes,
        "elastic": elastic,
        "static_peak": fixed,
        "cost_ratio": if fixed.cost > 0.0 { elastic.cost / fixed.cost } else { 0.0 },
        "wall_ms": t0.elapsed().as_millis() as u64,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    let credentials = match &args.token_file {
        Some(f) => Credentials::Token(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading {}", f.display()))?
                .trim()
                .to_string(),
        ),
        None => Credentials::Certificate(args.operator.clone()),
    };
    let api = BlockingClient::new(&ClientConfig {
        master: args.master.clone(),
        tls_dir: Some(args.tls_dir.clone()),
        credentials,
        timeout: Duration::from_secs(20),
    })?;
    let mut providers: BTreeMap<String, Box<dyn Provider>> = BTreeMap::new();
    let mut local: Option<LocalConfig> = None;
    for pool in &config.pools {
        let p: Box<dyn Provider> = match &pool.provider {
            ProviderSpec::Exec { program, timeout } => Box::new(ExecProvider {
                program: program.clone(),
                timeout: *timeout,
            }),
            ProviderSpec::Local => {
                let cfg = match &local {
                    Some(c) => c.clone(),
                    None => {
                        let Some(master) = args.local_master.clone() else {
                            bail!("pool {:?} uses the local provider: give --local-master (the masters' QUIC addresses)", pool.name);
                        };
                        let Some(work_dir) = args.local_work_dir.clone() else {
                            bail!(
                                "pool {:?} uses the local provider: give --local-work-dir",
                                pool.name
                            );
                        };
                        std::fs::create_dir_all(&work_dir)
                            .with_context(|| format!("creating {}", work_dir.display()))?;
                        let agent_bin = match &args.local_agent_bin {
                            Some(b) => b.clone(),
                            None => std::env::current_exe()?.with_file_name("gantry-agent"),
                        };
                        let c = LocalConfig {
                            agent_bin,
                            master,
                            tls_dir: args.tls_dir.clone(),
                            work_dir,
                            nvml_lib: args.local_nvml_lib.clone(),
                            agent_args: args.local_agent_arg.clone(),
                        };
                        local = Some(c.clone());
                        c
                    }
                };
                if pool.gpus > 0 && cfg.nvml_lib.is_none() {
                    bail!("pool {:?} has GPUs: the local provider needs --local-nvml-lib (the stand-in NVML library)", pool.name);
                }
                Box::new(LocalProvider::new(cfg))
            }
        };
        providers.insert(pool.name.clone(), p);
    }
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let interval = config.autoscaler.interval;
    tracing::info!(pools = config.pools.len(), master = %args.master, "autoscaler running");
    let mut rt = Runtime::new(Core::new(config), api, providers, args.status_file.clone());
    let ha = match &args.etcd {
        Some(list) => {
            let (fence, ha) = elect(list, &args)?;
            rt.fence = fence;
            rt.totals = Some(Box::new(EtcdTotals::connect(
                list,
                &args.ha_prefix,
                ha.0.handle().clone(),
            )?));
            Some(ha)
        }
        None => None,
    };
    if args.etcd.is_none() {
        let file = args.totals_file.clone().or_else(|| {
            args.status_file
                .as_ref()
                .map(|s| s.with_extension("totals.json"))
        });
        if let Some(path) = file {
            let mut store = FileStore { path };
            // Refuse to start on totals that cannot be read (rather than overwrite them).
            store
                .load()
                .with_context(|| format!("reading the totals {}", store.path.display()))?;
            rt.totals = Some(Box::new(store));
        }
    }
    if let Some(addr) = args.metrics_listen {
        serve_metrics(addr, rt.metrics.clone())?;
        tracing::info!(%addr, "serving /metrics");
    }
    rt.run(interval, &STOP);
    tracing::info!("stopping: local nodes are stopped, other providers' nodes stay");
    if let Some((tokio_rt, mut election)) = ha {
        // Resign at once, so a standby takes over without waiting for the lease.
        if let Err(e) = tokio_rt.block_on(election.resign(Duration::from_secs(2))) {
            tracing::warn!(error = %e, "resigning the election");
        }
    }
    drop(rt);
    Ok(())
}

/// The totals in etcd (`PREFIX/totals`), beside the election ([`TotalsStore`]).
struct EtcdTotals {
    rt: tokio::runtime::Handle,
    client: etcd_client::Client,
    key: String,
}

const ETCD_TIMEOUT: Duration = Duration::from_secs(5);

impl EtcdTotals {
    fn connect(list: &str, prefix: &str, rt: tokio::runtime::Handle) -> anyhow::Result<Self> {
        let endpoints = EtcdElectionConfig::parse_endpoints(list)?;
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(ETCD_TIMEOUT)
            .with_timeout(ETCD_TIMEOUT);
        let client = rt
            .block_on(async {
                tokio::time::timeout(
                    ETCD_TIMEOUT,
                    etcd_client::Client::connect(endpoints, Some(opts)),
                )
                .await
            })
            .context("connecting to etcd for the totals: timed out")?
            .context("connecting to etcd for the totals")?;
        Ok(EtcdTotals {
            rt,
            client,
            key: format!("{}/totals", prefix.trim_end_matches('/')),
        })
    }
}

impl TotalsStore for EtcdTotals {
    fn load(&mut self) -> Result<Option<Totals>, TotalsError> {
        let mut kv = self.client.kv_client();
        let resp = self
            .rt
            .block_on(async {
                tokio::time::timeout(ETCD_TIMEOUT, kv.get(self.key.clone(), None)).await
            })
            .map_err(|_| TotalsError::Io(format!("etcd get {}: timed out", self.key)))?
            .map_err(|e| TotalsError::Io(format!("etcd get {}: {e}", self.key)))?;
        match resp.kvs().first() {
            Some(item) => decode(&self.key, item.value()).map(Some),
            None => Ok(None),
        }
    }

    fn save(&mut self, totals: &Totals) -> Result<(), TotalsError> {
        let bytes = serde_json::to_vec(totals).map_err(|e| TotalsError::Io(e.to_string()))?;
        let mut kv = self.client.kv_client();
        self.rt
            .block_on(async {
                tokio::time::timeout(ETCD_TIMEOUT, kv.put(self.key.clone(), bytes, None)).await
            })
            .map_err(|_| TotalsError::Io(format!("etcd put {}: timed out", self.key)))?
            .map_err(|e| TotalsError::Io(format!("etcd put {}: {e}", self.key)))?;
        Ok(())
    }
}

/// Joins the etcd election of the autoscaler's copies (the masters' election code, under
/// `--ha-prefix`): the fence that says whether this copy leads, and what keeps the election
/// running (its runtime and handle).
fn elect(
    list: &str,
    args: &RunArgs,
) -> anyhow::Result<(
    gantry_autoscaler::runtime::Fence,
    (tokio::runtime::Runtime, Election),
)> {
    let endpoints = EtcdElectionConfig::parse_endpoints(list)?;
    let id = match &args.ha_id {
        Some(id) => id.clone(),
        None => {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "autoscaler".into());
            format!("{host}-{}", std::process::id())
        }
    };
    let mut cfg = EtcdElectionConfig::new(endpoints, id.clone());
    cfg.prefix = args.ha_prefix.clone();
    cfg.lease_ttl = args.ha_lease_ttl;
    let tokio_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("election")
        .enable_all()
        .build()?;
    let election = {
        let _in_runtime = tokio_rt.enter();
        Election::etcd(cfg).context("starting the etcd election")?
    };
    let status = election.watch_status();
    tracing::info!(%id, prefix = %args.ha_prefix, "HA: campaigning in etcd");
    let fence: gantry_autoscaler::runtime::Fence =
        std::sync::Arc::new(move || status.borrow().leads_at(std::time::Instant::now()));
    Ok((fence, (tokio_rt, election)))
}

/// `GET /metrics` on `addr`: the latest round's report in Prometheus' text format.
fn serve_metrics(
    addr: std::net::SocketAddr,
    text: std::sync::Arc<std::sync::Mutex<String>>,
) -> anyhow::Result<()> {
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("binding {addr} for /metrics"))?;
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return tracing::warn!(error = %e, "metrics listener"),
                };
                let app = axum::Router::new().route(
                    "/metrics",
                    axum::routing::get(move || {
                        let body = text.lock().map(|t| t.clone()).unwrap_or_default();
                        async move {
                            (
                                [(
                                    axum::http::header::CONTENT_TYPE,
                                    "text/plain; version=0.0.4",
                                )],
                                body,
                            )
                        }
                    }),
                );
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::warn!(error = %e, "metrics server stopped");
                }
            });
        })?;
    Ok(())
}
