//! `gantry-master`: serve a cluster (default), or run the allocator simulator / benchmark.

/// mimalloc instead of glibc's malloc: under a burst of launches the master allocates and frees
/// millions of small messages across the core thread and the QUIC workers (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gantry_master::allocator::AllocatorConfig;
use gantry_master::election::{EtcdElectionConfig, HaConfig};
use gantry_master::security::Limits;
use gantry_master::server::{AuthLimits, HttpLimits};
use gantry_master::state::MasterConfig;
use gantry_master::{server, simulate};
use gantry_transport::{quic, tls, PeerIdentity};

/// The Gantry master: tracks agents and frameworks, offers resources by Dominant Resource
/// Fairness, validates accepts and tracks tasks.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Replay a scenario (or a job trace) against the allocator in simulated time.
    Simulate(simulate::SimulateArgs),
    /// Time allocation cycles (Mesos DeclineOffers setup and quota roles).
    Bench(simulate::bench::BenchArgs),
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// QUIC address agents and frameworks connect to.
    #[arg(long, default_value = "127.0.0.1:5050")]
    listen: SocketAddr,
    /// Address of the operator API (HTTPS with the cluster CA): /health, /state, /weights,
    /// /quota.
    #[arg(long, default_value = "127.0.0.1:5051")]
    http: SocketAddr,
    /// Serve the operator API as plain HTTP (only on a loopback --http address; for demos).
    /// Authentication still applies: use a bearer token.
    #[arg(long)]
    http_insecure: bool,
    /// Let unauthenticated callers read /state (writes always need an operator).
    #[arg(long)]
    http_public_reads: bool,
    /// Operator bearer tokens (TOML: [[tokens]] name, sha256; mode 0600). Create entries with
    /// `gantryctl token create NAME --file FILE`; SIGHUP re-reads the file.
    #[arg(long)]
    operator_tokens: Option<PathBuf>,
    /// Operator port (docs/security.md, "Operator port limits"): connections served at once.
    #[arg(long, default_value_t = HttpLimits::default().max_connections)]
    http_max_connections: usize,
    /// Of --http-max-connections, how many only authenticated connections (an operator
    /// certificate, or a request with a valid credential) may hold.
    #[arg(long, default_value_t = HttpLimits::default().reserved_connections)]
    http_reserved_connections: usize,
    /// Unauthenticated connections one address (an IPv6 /64) may hold at once (0: no bound).
    #[arg(long, default_value_t = HttpLimits::default().max_connections_per_address)]
    http_max_connections_per_address: usize,
    /// Seconds from accept to the end of the TLS handshake.
    #[arg(long, default_value_t = HttpLimits::default().handshake_timeout.as_secs_f64())]
    http_handshake_timeout: f64,
    /// Seconds to send a request's headers; also how long an idle keep-alive connection stays.
    #[arg(long, default_value_t = HttpLimits::default().header_timeout.as_secs_f64())]
    http_header_timeout: f64,
    /// Seconds a client may accept no data of a response before it is closed (an event
    /// stream subscriber that stopped reading).
    #[arg(long, default_value_t = HttpLimits::default().write_timeout.as_secs_f64())]
    http_write_timeout: f64,
    /// Kernel send buffer of each operator connection in KiB (0: the system's autotuning).
    #[arg(long, default_value_t = HttpLimits::default().send_buffer_bytes / 1024)]
    http_send_buffer_kib: usize,
    /// /api/v1/events subscribers one operator (or one anonymous address) may hold (0: no
    /// bound).
    #[arg(long, default_value_t = HttpLimits::default().max_event_subscribers_per_principal)]
    http_max_event_subscribers_per_principal: usize,
    /// Exec sessions into tasks one operator or framework may run at once (0: no bound).
    #[arg(long, default_value_t = HttpLimits::default().max_exec_sessions_per_principal)]
    http_max_exec_sessions_per_principal: usize,
    /// Failed authentications (wrong token, dashboard login) an address may make at once
    /// before it is answered 429 (0: no limit).
    #[arg(long, default_value_t = HttpLimits::default().auth.burst)]
    http_auth_failures_burst: u32,
    /// Failed authentications per minute an address regains.
    #[arg(long, default_value_t = HttpLimits::default().auth.per_minute)]
    http_auth_failures_per_minute: u32,
    /// Failed authentications per minute (and at once) of all addresses together; past it
    /// addresses that failed recently are answered 429, others are not held back.
    #[arg(long, default_value_t = HttpLimits::default().auth.global_per_minute)]
    http_auth_failures_global_per_minute: u32,
    /// Dashboard sessions kept at most (the oldest ends past it).
    #[arg(long, default_value_t = HttpLimits::default().max_sessions)]
    http_max_sessions: usize,
    /// Seconds a dashboard session lasts.
    #[arg(long, default_value_t = HttpLimits::default().session_lifetime.as_secs_f64())]
    http_session_lifetime: f64,
    /// Directory for the master's persistent state.
    #[arg(long, default_value = "./gantry-master")]
    work_dir: PathBuf,
    /// TLS directory (ca.pem, master.pem/.key). A CA is created here if none exists.
    #[arg(long, required = true)]
    tls_dir: Option<PathBuf>,
    /// Extra host names or IPs for the master certificate when the master issues it.
    #[arg(long, value_delimiter = ',')]
    tls_san: Vec<String>,
    /// Seconds a disconnected agent may take to re-register before it is unreachable: its
    /// tasks become UNREACHABLE for partition-aware frameworks, LOST for the others.
    #[arg(long, default_value_t = 10.0)]
    agent_reregister_timeout: f64,
    /// Seconds an unreachable agent may take to come back with its id and its tasks (Mesos
    /// `--registry_max_agent_age`); past it its tasks are GONE and it is forgotten.
    #[arg(long, default_value_t = 900.0)]
    agent_unreachable_timeout: f64,
    /// Batch allocation interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    allocation_interval_ms: u64,
    /// Allocation cycles triggered by events (a task ended, a demand declared, an offer
    /// declined) are at least this many milliseconds apart, and at least four times the last
    /// cycle's duration: the most an offer waits for its cycle, against how often cycles run.
    #[arg(long, default_value_t = 5)]
    allocation_min_gap_ms: u64,
    /// Rescind offers not answered within this many seconds; what expired is then filtered
    /// for that framework on that agent like a decline (5 s), so a framework that hoards offers
    /// cannot keep an agent from the others. `0` or `off`: offers never expire.
    #[arg(long, default_value = DEFAULT_OFFER_TIMEOUT, value_parser = parse_secs_or_off)]
    offer_timeout: SecsOrOff,
    /// Offer GPU agents to every framework, not only to GPU-capable ones.
    #[arg(long)]
    no_gpu_filter: bool,
    /// Resource names left out of dominant-share computation (e.g. gpus).
    #[arg(long, value_delimiter = ',')]
    fairness_excluded: Vec<String>,
    /// etcd endpoints (URL[,URL...]) for leader election and the registry; without it the
    /// master runs standalone with its registry in --work-dir.
    #[arg(long)]
    etcd: Option<String>,
    /// The QUIC address other masters redirect agents and frameworks to (default: --listen).
    #[arg(long)]
    advertise: Option<String>,
    /// Leader lease TTL in seconds (etcd mode).
    #[arg(long, default_value_t = 3)]
    lease_ttl: u64,
    /// Key prefix in etcd.
    #[arg(long, default_value = "/gantry")]
    etcd_prefix: String,
    /// Access-control lists (TOML, docs/security.md). Without it the master runs in dev mode
    /// and allows every principal every role, user and operator action.
    #[arg(long)]
    acls: Option<PathBuf>,
    /// Seconds a peer has to deliver the body of a frame once its length arrived; a peer that
    /// stalls mid-frame is closed (docs/security.md, "Message and peer limits").
    #[arg(long, default_value_t = 10.0)]
    frame_body_timeout: f64,
    /// MiB of large frame bodies (over 64 KiB) all peers together may be sending at once;
    /// readers past it wait their turn (at least 4).
    #[arg(long, default_value_t = 128)]
    frame_budget_mib: usize,
    /// Messages queued for one peer at most (at least 64). A framework that reads slowly is
    /// paced against it (docs/protocol.md, "Not reading"); an agent that lets it fill is closed.
    #[arg(long, default_value_t = MasterConfig::default().peer_outbox)]
    peer_outbox: usize,
    /// Events the persistent history keeps (task state transitions, agent, framework and role
    /// changes, with their times; in the registry, so they survive restarts and failovers);
    /// 0 keeps none.
    #[arg(long, default_value_t = MasterConfig::default().history_events)]
    history_events: usize,
    /// Seconds a peer's stream may take none of the messages waiting for it (the peer does not
    /// read) before it is closed: a framework is then failed over (offers rescinded, its
    /// failover timeout running), an agent must re-register. `0` or `off`: never.
    #[arg(long, default_value = DEFAULT_PEER_WRITE_TIMEOUT, value_parser = parse_secs_or_off)]
    peer_write_timeout: SecsOrOff,
    /// Frameworks one principal may have registered at once (a disconnected framework counts
    /// until its failover timeout ends).
    #[arg(long, default_value_t = Limits::default().frameworks_per_principal)]
    max_frameworks_per_principal: usize,
    /// Distinct roles one framework may subscribe to.
    #[arg(long, default_value_t = Limits::default().roles_per_framework)]
    max_roles_per_framework: usize,
    /// Longest role name in bytes (at most 128).
    #[arg(long, default_value_t = Limits::default().role_name_length)]
    max_role_name_length: usize,
    /// Most `/`-separated levels in a role name.
    #[arg(long, default_value_t = Limits::default().role_depth)]
    max_role_depth: usize,
    /// Open QUIC connections per certificate identity (agent name or framework principal);
    /// 0 = unlimited.
    #[arg(long, default_value_t = Limits::default().connections_per_principal)]
    max_connections_per_principal: usize,
    /// Open QUIC connections per source IP address; 0 = unlimited.
    #[arg(long, default_value_t = Limits::default().connections_per_address)]
    max_connections_per_address: usize,
    /// Completed tasks kept per framework in /state and for reconciliation (oldest dropped).
    #[arg(long, default_value_t = 1000)]
    max_completed_tasks_per_framework: usize,
    /// Removed frameworks kept in /state with their completed tasks (oldest dropped).
    #[arg(long, default_value_t = 50)]
    max_completed_frameworks: usize,
    /// How the GPU for a task asking for a fraction of one GPU (`gpus:0.25`) is chosen within
    /// its agent: fgd-pack, fgd-fill, fgd, best-fit or random (docs/gpu-agent.md).
    #[arg(long, default_value = "fgd-pack", value_parser = gantry_master::state::gpus::parse_policy)]
    gpu_placement: gantry_placement::Policy,
    /// Resource kinds quotas and reservations may name besides cpus, mem, disk, gpus, ports
    /// and the kinds agents have (comma-separated): for quotas set before such agents join.
    #[arg(long, value_delimiter = ',')]
    resource_kinds: Vec<String>,
}

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse_from(gantry_cli::config_file::expand_args()?);
    match cli.cmd {
        Some(Cmd::Simulate(args)) => Ok(simulate::run(args)?),
        Some(Cmd::Bench(args)) => Ok(simulate::bench::run(args)?),
        None => {
            init_tracing();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(serve(cli.serve))
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("creating work dir {}", args.work_dir.display()))?;
    let http_limits = http_limits(&args)?;
    let tls_dir = args.tls_dir.clone().context("--tls-dir is required")?;
    if args.http_insecure {
        anyhow::ensure!(
            args.http.ip().is_loopback(),
            "--http-insecure serves the operator API without TLS: refused on {}, allowed only on \
             a loopback address (127.0.0.1 or ::1)",
            args.http
        );
    }
    if gantry_pki::ensure_ca(&tls_dir)? {
        tracing::info!(dir = %tls_dir.display(), "created a new cluster CA (dev mode)");
    }
    for warning in tls::check_dir_permissions(&tls_dir)
        .with_context(|| format!("checking the TLS directory {}", tls_dir.display()))?
    {
        tracing::warn!("{warning}");
    }
    let material = gantry_pki::load_or_issue(&tls_dir, &PeerIdentity::Master, &args.tls_san)?;
    if tls_dir.join("ca.key").exists() {
        // Dev mode (this directory can issue): an operator certificate for gantryctl, so the
        // operator API works with no set-up (`gantryctl --tls-dir DIR state`).
        let admin = PeerIdentity::Operator("admin".into());
        if !tls_dir.join(format!("{}.pem", admin.file_stem())).exists() {
            gantry_pki::load_or_issue(&tls_dir, &admin, &[])?;
            tracing::info!(dir = %tls_dir.display(), "issued operator-admin.pem for gantryctl (dev mode)");
        }
    }
    let mut http_config = if args.http_insecure {
        tracing::warn!(
            http = %args.http,
            "--http-insecure: the operator API is plain HTTP (no TLS, no client certificates); \
             use it only for demos"
        );
        server::HttpConfig {
            tls: None,
            tokens: server::SharedTokens::default(),
            public_reads: false,
            limits: Default::default(),
        }
    } else {
        server::HttpConfig::https(&material)?
    };
    http_config.public_reads = args.http_public_reads;
    http_config.limits = http_limits;
    if let Some(path) = &args.operator_tokens {
        http_config.tokens =
            server::SharedTokens::new(gantry_master::security::tokens::OperatorTokens::load(path)?);
        tracing::info!(tokens = http_config.tokens.len(), "operator tokens loaded");
    }
    reload_tokens_on_sighup(args.operator_tokens.clone(), http_config.tokens.clone())?;
    let reset_key = quic::load_or_create_reset_key(&args.work_dir.join("quic-reset.key"))?;
    let endpoint = quic::server_endpoint(args.listen, &material, &reset_key)
        .with_context(|| format!("binding QUIC on {}", args.listen))?;
    let http = tokio::net::TcpListener::bind(args.http)
        .await
        .with_context(|| format!("binding HTTP on {}", args.http))?;
    let allocator = allocator_config(&args, rand_seed());
    let acls = match &args.acls {
        Some(path) => gantry_master::security::acl::Acls::load(path)?,
        None => {
            tracing::warn!(
                "no --acls file: dev mode, every principal may use every role, run as any user \
                 and perform every operator action"
            );
            gantry_master::security::acl::Acls::allow_all()
        }
    };
    anyhow::ensure!(
        args.max_frameworks_per_principal >= 1
            && args.max_roles_per_framework >= 1
            && (1..=128).contains(&args.max_role_name_length)
            && args.max_role_depth >= 1,
        "--max-frameworks-per-principal, --max-roles-per-framework and --max-role-depth must \
         be at least 1, --max-role-name-length 1 to 128"
    );
    let limits = Limits {
        frameworks_per_principal: args.max_frameworks_per_principal,
        roles_per_framework: args.max_roles_per_framework,
        role_name_length: args.max_role_name_length,
        role_depth: args.max_role_depth,
        connections_per_principal: args.max_connections_per_principal,
        connections_per_address: args.max_connections_per_address,
    };
    let config = MasterConfig {
        allocator,
        acls,
        limits,
        agent_reregister_timeout_ms: secs_to_ms(
            args.agent_reregister_timeout,
            "--agent-reregister-timeout",
        )?,
        agent_unreachable_timeout_ms: secs_to_ms(
            args.agent_unreachable_timeout,
            "--agent-unreachable-timeout",
        )?,
        allocation_interval_ms: args.allocation_interval_ms.max(1),
        allocation_min_gap_ms: args.allocation_min_gap_ms,
        frame_body_timeout_ms: secs_to_ms(args.frame_body_timeout, "--frame-body-timeout")?.max(1),
        frame_budget_bytes: args.frame_budget_mib.clamp(4, 1 << 20) << 20,
        peer_outbox: args.peer_outbox.max(64),
        history_events: args.history_events,
        peer_write_timeout_ms: args.peer_write_timeout.ms(),
        max_completed_tasks_per_framework: args.max_completed_tasks_per_framework,
        max_completed_frameworks: args.max_completed_frameworks,
        gpu_placement: args.gpu_placement,
        resource_kinds: args.resource_kinds,
        ..MasterConfig::default()
    };
    tracing::info!(quic = %endpoint.local_addr()?, http = %http.local_addr()?, "gantry-master serving");
    let advertise = args.advertise.unwrap_or_else(|| args.listen.to_string());
    let ha = match args.etcd {
        None => HaConfig::Standalone {
            work_dir: args.work_dir.clone(),
            advertise,
        },
        Some(list) => {
            anyhow::ensure!(args.lease_ttl >= 1, "--lease-ttl must be at least 1 second");
            let mut c =
                EtcdElectionConfig::new(EtcdElectionConfig::parse_endpoints(&list)?, advertise);
            c.lease_ttl = std::time::Duration::from_secs(args.lease_ttl);
            c.prefix = args.etcd_prefix;
            HaConfig::Etcd(c)
        }
    };
    server::run(
        endpoint,
        server::HttpEndpoint {
            listener: http,
            config: http_config,
        },
        config,
        ha,
        gantry_cli::process::shutdown_signal(),
    )
    .await
}

/// SIGHUP re-reads `--operator-tokens` (added and revoked tokens take effect at once); a file
/// that no longer loads keeps the tokens in force, with an error logged.
/// The operator port's limits from the flags.
fn http_limits(args: &ServeArgs) -> anyhow::Result<HttpLimits> {
    let secs = |v: f64, flag: &str| -> anyhow::Result<Duration> {
        anyhow::ensure!(
            v.is_finite() && v > 0.0 && v <= 86_400.0 * 30.0,
            "{flag} must be a positive number of seconds"
        );
        Ok(Duration::from_secs_f64(v))
    };
    anyhow::ensure!(
        args.http_max_connections > 0 && args.http_reserved_connections < args.http_max_connections,
        "--http-reserved-connections ({}) must be below --http-max-connections ({})",
        args.http_reserved_connections,
        args.http_max_connections
    );
    let global = args.http_auth_failures_global_per_minute;
    Ok(HttpLimits {
        handshake_timeout: secs(args.http_handshake_timeout, "--http-handshake-timeout")?,
        header_timeout: secs(args.http_header_timeout, "--http-header-timeout")?,
        write_timeout: secs(args.http_write_timeout, "--http-write-timeout")?,
        max_connections: args.http_max_connections,
        reserved_connections: args.http_reserved_connections,
        max_connections_per_address: args.http_max_connections_per_address,
        send_buffer_bytes: args.http_send_buffer_kib.saturating_mul(1024),
        max_event_subscribers_per_principal: args.http_max_event_subscribers_per_principal,
        max_exec_sessions_per_principal: args.http_max_exec_sessions_per_principal,
        auth: AuthLimits {
            burst: args.http_auth_failures_burst,
            per_minute: args.http_auth_failures_per_minute,
            global_burst: global,
            global_per_minute: global,
        },
        max_sessions: args.http_max_sessions.max(1),
        session_lifetime: secs(args.http_session_lifetime, "--http-session-lifetime")?,
        ..HttpLimits::default()
    })
}

fn reload_tokens_on_sighup(
    path: Option<PathBuf>,
    tokens: server::SharedTokens,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let Some(path) = &path else {
                tracing::info!("SIGHUP: no --operator-tokens file to reload");
                continue;
            };
            match gantry_master::security::tokens::OperatorTokens::load(path) {
                Ok(t) => {
                    let n = t.len();
                    tokens.replace(t);
                    tracing::info!(tokens = n, "SIGHUP: operator tokens reloaded");
                }
                Err(e) => {
                    tracing::error!("SIGHUP: keeping the operator tokens in force: {e}");
                }
            }
        }
    });
    Ok(())
}

/// `--offer-timeout`'s default: Mesos's recommended order of magnitude for an offer timeout.
/// An honest framework answers within a second; one that holds offers longer keeps resources
/// from everyone else.
const DEFAULT_OFFER_TIMEOUT: &str = "30";
/// `--peer-write-timeout`'s default: twice QUIC's idle timeout, so a peer that is gone is
/// noticed by that first and only a live peer that does not read is closed by this.
const DEFAULT_PEER_WRITE_TIMEOUT: &str = "30";

/// A number of seconds, or off (`0` or `off`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct SecsOrOff(Option<f64>);

impl SecsOrOff {
    /// Milliseconds (`None` when off).
    fn ms(self) -> Option<u64> {
        self.0.map(|s| (s * 1000.0) as u64).filter(|ms| *ms > 0)
    }
}

fn parse_secs_or_off(s: &str) -> Result<SecsOrOff, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(SecsOrOff(None));
    }
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is neither a number of seconds nor `off`"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{s:?}: must be a non-negative number of seconds"));
    }
    Ok(SecsOrOff((v > 0.0).then_some(v)))
}

/// The allocator's settings from the flags. The master's are safer than
/// [`AllocatorConfig::default`] (which the simulator's scenarios pin): offers expire after
/// `--offer-timeout` and an expired offer is filtered like a decline.
fn allocator_config(args: &ServeArgs, offer_id_seed: u64) -> AllocatorConfig {
    AllocatorConfig {
        offer_timeout_ms: args.offer_timeout.ms(),
        filter_expired_offers: true,
        filter_gpu_resources: !args.no_gpu_filter,
        fairness_excluded_resources: args.fairness_excluded.clone(),
        offer_id_seed,
        gpu_placement: args.gpu_placement,
        ..AllocatorConfig::default()
    }
}

fn secs_to_ms(s: f64, flag: &str) -> anyhow::Result<u64> {
    anyhow::ensure!(
        s.is_finite() && s >= 0.0,
        "{flag} must be a non-negative number of seconds"
    );
    Ok((s * 1000.0) as u64)
}

fn rand_seed() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_args(extra: &[&str]) -> ServeArgs {
        let mut argv = vec!["gantry-master", "--tls-dir", "/nonexistent"];
        argv.extend_from_slice(extra);
        let cli = Cli::try_parse_from(argv).unwrap();
        assert!(cli.cmd.is_none());
        cli.serve
    }

    #[test]
    fn by_default_offers_expire_and_stalled_peers_are_closed() {
        let args = serve_args(&[]);
        let a = allocator_config(&args, 7);
        assert_eq!(a.offer_timeout_ms, Some(30_000));
        assert!(a.filter_expired_offers);
        assert_eq!(a.offer_id_seed, 7);
        // The simulator's defaults stay as they were (its scenario outputs are pinned).
        assert_eq!(AllocatorConfig::default().offer_timeout_ms, None);
        assert!(!AllocatorConfig::default().filter_expired_offers);
        assert_eq!(args.peer_write_timeout.ms(), Some(30_000));
        assert_eq!(
            MasterConfig::default().peer_write_timeout_ms,
            args.peer_write_timeout.ms()
        );
    }

    #[test]
    fn zero_or_off_turns_the_timeouts_off() {
        for off in ["0", "off", "OFF", "0.0"] {
            let args = serve_args(&["--offer-timeout", off, "--peer-write-timeout", off]);
            assert_eq!(allocator_config(&args, 0).offer_timeout_ms, None, "{off}");
            assert_eq!(args.peer_write_timeout.ms(), None, "{off}");
        }
        let args = serve_args(&["--offer-timeout", "1.5", "--peer-write-timeout", "2"]);
        assert_eq!(allocator_config(&args, 0).offer_timeout_ms, Some(1500));
        assert_eq!(args.peer_write_timeout.ms(), Some(2000));
        for bad in ["-1", "soon", "inf", "NaN"] {
            assert!(
                Cli::try_parse_from(["gantry-master", "--tls-dir", "x", "--offer-timeout", bad])
                    .is_err(),
                "{bad}"
            );
        }
    }
}
