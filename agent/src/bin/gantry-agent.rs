//! `gantry-agent`: run an agent on this host (or ask a running agent to bring an unhealthy GPU
//! back; or, internally, be its supervisor process when `gantry-supervise` is not installed).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use gantry_agent::agent::{self, AgentConfig, CLEAR_DIR};
use gantry_agent::config::{apply_price, parse_attributes, parse_reservation};
use gantry_agent::core::PortRange;
use gantry_agent::discovery::host::apply_overrides;
use gantry_agent::discovery::{HostResources, NvmlGpus, DEFAULT_NVML_LIB};
use gantry_agent::executor::server;
use gantry_agent::executor::user;
use gantry_agent::gc;
use gantry_agent::isolation::{IsolationMode, Isolator, NvidiaMajors, DEFAULT_CGROUP_ROOT};
use gantry_proto::resources::MILLI;
use gantry_proto::Resources;

/// The Gantry agent: measures this host, registers with the master, runs tasks.
#[derive(Parser, Debug)]
#[command(
    version,
    about,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

/// `--isolation`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Isolation {
    /// cgroups v1 or v2 (detected): cpu, memory, pids and device limits per task.
    Cgroups,
    /// No isolation (a warning is logged): no limits, no cgroup accounting.
    None,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Master address(es), host:port, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    master: Vec<String>,
    /// Directory for the checkpoint and task sandboxes.
    #[arg(long, default_value = "./gantry-agent")]
    work_dir: PathBuf,
    /// TLS directory (ca.pem and agent-NAME.pem/.key, or ca.key to issue them).
    #[arg(long, required = true)]
    tls_dir: Option<PathBuf>,
    /// The agent's name (its certificate identity). Defaults to the host name.
    #[arg(long)]
    name: Option<String>,
    /// Override measured resources, e.g. "cpus:4;mem:8192" (others stay measured; name:0
    /// removes one; gpus may only be 0 or the number of GPUs NVML found).
    #[arg(long)]
    resources: Option<String>,
    /// Static reservation ROLE=RESOURCES (repeatable), on top of the resources; reserved gpus
    /// are taken from the discovered GPUs.
    #[arg(long = "reserve")]
    reserve: Vec<String>,
    /// Attributes, e.g. "rack:r1;zone:a".
    #[arg(long, default_value = "")]
    attributes: String,
    /// What the agent costs, in currency units per hour (finite, ≥ 0): set as the attribute
    /// `price_per_hour`, which usage reports attribute to the tasks that use the agent.
    #[arg(long)]
    price_per_hour: Option<String>,
    /// Seconds between SIGTERM and SIGKILL when a task is killed.
    #[arg(long, default_value_t = 3.0)]
    kill_grace: f64,
    /// The NVML library to load (a host without it runs as a CPU agent).
    #[arg(long, default_value = DEFAULT_NVML_LIB)]
    nvml_lib: PathBuf,
    /// How tasks are isolated.
    #[arg(long, value_enum, default_value_t = Isolation::Cgroups)]
    isolation: Isolation,
    /// Where task cgroups live: a path relative to each cgroup hierarchy, or an absolute path
    /// inside the cgroup mount. Default: gantry/<agent name>. The agent owns everything below
    /// it: give every agent on a host its own root.
    #[arg(long)]
    cgroup_root: Option<PathBuf>,
    /// Enforce each task's cpus as a hard CFS quota (otherwise cpus only sets its share).
    #[arg(long)]
    cgroups_enable_cfs: bool,
    /// Maximum number of processes (and threads) per task; 0 for no limit.
    #[arg(long, default_value_t = 4096)]
    task_pids_max: u64,
    /// Seconds between usage samples of GPUs and tasks.
    #[arg(long, default_value_t = 5.0)]
    usage_interval: f64,
    /// Re-check an unhealthy GPU this many seconds after its last fault and bring it back if
    /// it answers NVML normally. Without it only `gantry-agent clear-gpu` brings GPUs back.
    #[arg(long)]
    gpu_recovery_after: Option<f64>,
    /// The Unix user tasks run as when their command names none. Default: `nobody` when the
    /// agent runs as root, the agent's own user otherwise (an agent that is not root can only
    /// run tasks as itself).
    #[arg(long)]
    task_user: Option<String>,
    /// How tasks holding fractions of one GPU (`gpus:0.25`) share it: `time-slice` (CUDA time
    /// slicing; GPU memory is NOT isolated) or `mps` (NVIDIA MPS: per-task thread percentage and
    /// pinned device-memory limit; one MPS control daemon per shared GPU when
    /// nvidia-cuda-mps-control is in PATH). See docs/gpu-agent.md.
    #[arg(long, default_value = "time-slice")]
    gpu_sharing: gantry_agent::gpu::share::Sharing,
    /// What happens to a task whose processes use more GPU memory than its share (its fraction
    /// of the GPU's memory): `report` (a status update and /state) or `kill`.
    #[arg(long, default_value = "report")]
    gpu_memory_enforce: gantry_agent::gpu::share::MemoryEnforce,
    /// Seconds after a task ended (and its last update was acknowledged) before its sandbox
    /// and control files are removed; shorter when the disk fills (see --gc-disk-headroom).
    #[arg(long, default_value_t = gc::DEFAULT_DELAY.as_secs_f64())]
    gc_delay: f64,
    /// Fraction of the work directory's disk to keep free: the delay is scaled by
    /// max(0, 1 - headroom - used), reaching 0 when the disk is (1 - headroom) full.
    #[arg(long, default_value_t = gc::DEFAULT_HEADROOM)]
    gc_disk_headroom: f64,
    /// The sandboxes of the newest ended tasks kept for inspection, whatever their age.
    #[arg(long, default_value_t = gc::DEFAULT_KEEP)]
    gc_keep: usize,
    /// Compact the agent's write-ahead log into a snapshot of its state once the log has grown
    /// past this many bytes (in the background).
    #[arg(long, default_value_t = gantry_agent::wal::COMPACT_BYTES)]
    wal_compact_bytes: u64,
    /// The least time in milliseconds between the starts of two syncs (`fdatasync`) of the
    /// write-ahead log: the batches handled in between share the later sync, so a busy agent
    /// syncs at most 1000 / this many times a second, and a status update or launch waits at
    /// most this long besides the sync itself. `0`: each sync starts as soon as the previous
    /// one ends.
    #[arg(long, default_value_t = gantry_agent::agent::COMMIT_GAP.as_millis() as u64)]
    commit_gap_ms: u64,
    /// When the write-ahead log has a corrupt frame in its middle (valid frames after it: not
    /// a torn write), drop everything from that frame on and start from the state before it,
    /// instead of refusing to start. The agent logs the offset and what it dropped.
    #[arg(long)]
    recover_truncate: bool,
    /// The pool of prepared task cgroups, LOW:HIGH: LOW empty cgroups are made ahead, and an
    /// ended task's empty cgroup is kept for the next task (up to HIGH kept) instead of being
    /// removed and made again. `0:0` turns the pool off (one cgroup per task, named after it).
    /// See docs/gpu-agent.md, "Task cgroup pool".
    #[arg(long, value_name = "LOW:HIGH", default_value = "32:1024", value_parser = parse_pool)]
    cgroup_pool: (usize, usize),
    /// Serve Prometheus metrics (`GET /metrics`: dcgm-exporter GPU series with the task holding
    /// each GPU, GPU health, per-task CPU and memory) on HOST:PORT, plain HTTP without
    /// authentication: keep it on loopback or reachable by Prometheus only. Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Host ports tasks may ask for, FIRST-LAST inclusive, or `none`. Advertised as the
    /// resource `ports:N` (N ports); a task asking `ports:K` gets K free ports of the range in
    /// PORT, PORT0.. and GANTRY_PORTS. Agents sharing a host need ranges that do not overlap.
    #[arg(long, default_value = "31000-32000", value_name = "FIRST-LAST|none")]
    ports: String,
    /// How a task's `disk` is enforced: `du` (its sandbox measured like du every
    /// --disk-watch-interval; past its disk it is killed, FAILED with reason disk-limit) or
    /// `none` (disk is only accounted). Tasks without disk are never limited. See
    /// docs/operations.md, "Disk limits".
    #[arg(long, default_value = "du", value_name = "none|du")]
    disk_enforcement: gantry_agent::disk::DiskEnforcement,
    /// Seconds between two measurements of the sandboxes of tasks with a disk
    /// (--disk-enforcement du); a task can write past its limit for about this long.
    #[arg(long, default_value_t = gantry_agent::disk::DEFAULT_WATCH_INTERVAL.as_secs_f64())]
    disk_watch_interval: f64,
    /// The OCI runtime container tasks run under: a name on PATH or a path (runc, crun).
    /// Default: runc, else crun, from PATH. See docs/containers.md.
    #[arg(long, value_name = "PROGRAM")]
    container_runtime: Option<String>,
    /// An unpacked root filesystem container tasks may name as image `rootfs:NAME`
    /// (repeatable).
    #[arg(long, value_name = "NAME=DIR")]
    local_rootfs: Vec<String>,
    /// A host directory container tasks may mount as a volume, with what is below it
    /// (repeatable; none by default: host volumes are refused).
    #[arg(long, value_name = "DIR")]
    volume_allow: Vec<PathBuf>,
    /// A directory of CDI specs for the GPUs of container tasks (repeatable). Default:
    /// /etc/cdi and /var/run/cdi.
    #[arg(long, value_name = "DIR")]
    cdi_dir: Vec<PathBuf>,
    /// The image store of container tasks' registry images (layers and index). Default:
    /// WORK_DIR/images. See docs/containers.md.
    #[arg(long, value_name = "DIR")]
    image_dir: Option<PathBuf>,
    /// The bound on the unpacked layers in the image store, in MiB (images in use are kept).
    #[arg(long, default_value_t = 20_480, value_name = "MIB")]
    image_cache_mib: u64,
    /// A registry (host:port) reached over plain HTTP (repeatable).
    #[arg(long, value_name = "HOST:PORT")]
    registry_insecure: Vec<String>,
    /// A docker config.json with registry credentials.
    #[arg(long, value_name = "FILE")]
    registry_credentials: Option<PathBuf>,
    /// A PEM CA file trusted for registries, besides the host's (repeatable).
    #[arg(long, value_name = "FILE")]
    registry_ca: Vec<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Spot-instance termination notice: the agent running on WORK_DIR tells the master within
    /// a second, and the master drains this agent with the deadline (frameworks are told;
    /// what is left at the deadline is killed). Run it from the cloud's termination hook.
    NoticeTermination {
        /// The agent's work directory.
        #[arg(long, default_value = "./gantry-agent")]
        work_dir: PathBuf,
        /// Time until the host goes away (`120s`, `2m`).
        #[arg(long = "in", value_parser = humantime::parse_duration)]
        after: Duration,
        /// Why (shown to operators and frameworks).
        #[arg(long, default_value = "spot instance termination")]
        reason: String,
    },
    /// Bring unhealthy GPUs back (operator clear): the agent running on WORK_DIR picks the
    /// request up within a second, marks the GPUs healthy and offers them again.
    ClearGpu {
        /// The agent's work directory.
        #[arg(long, default_value = "./gantry-agent")]
        work_dir: PathBuf,
        /// GPU UUIDs (as in /state), or `all`.
        #[arg(required = true)]
        gpus: Vec<String>,
    },
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

fn seconds(name: &str, v: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(
        v.is_finite() && v >= 0.0,
        "--{name} must be a non-negative number of seconds"
    );
    Ok(Duration::from_secs_f64(v))
}

/// `--task-user`, or its default: `nobody` for a root agent, the agent's own user otherwise.
/// The user must exist; an agent that is not root can only run tasks as itself.
fn resolve_task_user(flag: Option<String>) -> anyhow::Result<String> {
    let own = user::current_name().context("looking up the agent's own user")?;
    let root = user::is_root();
    let name = match flag {
        Some(n) => n,
        None if root => "nobody".to_string(),
        None => own.clone(),
    };
    user::lookup_task_user(&name).with_context(|| format!("--task-user {name}"))?;
    anyhow::ensure!(
        root || name == own,
        "--task-user {name}: the agent runs as {own}, not root, so it can only run tasks as {own}"
    );
    if name == "root" {
        tracing::warn!(
            "--task-user root: tasks run as root unless their command names another user"
        );
    }
    Ok(name)
}

fn clear_gpus(work_dir: &std::path::Path, gpus: &[String]) -> anyhow::Result<()> {
    let dir = work_dir.join(CLEAR_DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for g in gpus {
        anyhow::ensure!(
            !g.is_empty()
                && g.len() <= 128
                && g.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "{g:?} is not a GPU UUID"
        );
        let tmp = dir.join(format!("{g}.tmp"));
        std::fs::write(&tmp, b"").with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, dir.join(g))?;
        println!("requested clear of {g}; the agent applies it within a second");
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // Internal: the agent's supervisor process (when `gantry-supervise` is not installed beside
    // the agent), before anything else is set up.
    if std::env::args_os().nth(1).is_some_and(|a| a == "supervise") {
        if std::env::args_os().nth(2).is_some_and(|a| a == "--server") {
            std::process::exit(server::serve());
        }
        anyhow::bail!("supervise: started by gantry-agent as `supervise --server` only");
    }
    let cli = Cli::parse_from(gantry_cli::config_file::expand_args()?);
    match cli.cmd {
        Some(Cmd::ClearGpu { work_dir, gpus }) => return clear_gpus(&work_dir, &gpus),
        Some(Cmd::NoticeTermination {
            work_dir,
            after,
            reason,
        }) => {
            let n = gantry_agent::termination::write(&work_dir, after, &reason)
                .with_context(|| format!("writing the notice into {}", work_dir.display()))?;
            println!(
                "termination notice in {}: the agent tells the master within a second (deadline in {} s, Unix ms {})",
                work_dir.display(),
                after.as_secs(),
                n.deadline_unix_ms
            );
            return Ok(());
        }
        None => {}
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = cli.run;
    let name = args.name.unwrap_or_else(hostname);
    anyhow::ensure!(
        gantry_transport::tls::valid_name(&name),
        "agent name {name:?} must be 1-64 characters of [A-Za-z0-9_.-]"
    );
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("creating {}", args.work_dir.display()))?;

    // Resources: measured host + NVML GPUs, then the operator's overrides.
    let nvml = NvmlGpus::open(&args.nvml_lib);
    let found = nvml
        .as_ref()
        .map(|g| g.inventory().gpus.len() as u32)
        .unwrap_or(0);
    let host = HostResources::detect(&args.work_dir).context("measuring the host")?;
    let detected = host.to_resources(found);
    let mut resources = match &args.resources {
        Some(text) => apply_overrides(&detected, text, found)?,
        None => detected,
    };
    let gpus = if resources.milli("gpus") == 0 {
        if nvml.is_some() {
            tracing::info!("--resources gpus:0: running this GPU host as a CPU agent");
        }
        None
    } else {
        nvml.map(Arc::new)
    };
    // Ports: the range's size, the only source of the `ports` resource.
    anyhow::ensure!(
        resources.milli("ports") == 0,
        "--resources cannot set ports: give the agent a port range with --ports FIRST-LAST"
    );
    let ports = PortRange::parse(&args.ports).map_err(|e| anyhow::anyhow!("--ports: {e}"))?;
    if let Some(range) = ports {
        resources.set_milli("ports", range.len() * MILLI);
    }
    let mut reserved: BTreeMap<String, Resources> = BTreeMap::new();
    for r in &args.reserve {
        let (role, res) = parse_reservation(r)?;
        reserved.entry(role).or_default().add_assign(&res);
    }
    // Reserved GPUs are carved out of the discovered ones (they carry identities).
    let reserved_gpus: u64 = reserved.values().map(|r| r.milli("gpus")).sum();
    if reserved_gpus > 0 {
        anyhow::ensure!(
            reserved_gpus.is_multiple_of(MILLI) && reserved_gpus <= resources.milli("gpus"),
            "--reserve asks for {} GPUs but this agent has {}",
            reserved_gpus as f64 / MILLI as f64,
            resources.get("gpus")
        );
        let left = resources.milli("gpus") - reserved_gpus;
        resources.set_milli("gpus", left);
    }

    // Reserved ports are counted out of the range (the agent picks them like the others).
    let reserved_ports: u64 = reserved.values().map(|r| r.milli("ports")).sum();
    if reserved_ports > 0 {
        anyhow::ensure!(
            reserved_ports.is_multiple_of(MILLI) && reserved_ports <= resources.milli("ports"),
            "--reserve asks for {} ports but this agent's range (--ports) has {}",
            reserved_ports as f64 / MILLI as f64,
            resources.get("ports")
        );
        let left = resources.milli("ports") - reserved_ports;
        resources.set_milli("ports", left);
    }

    let mode = match args.isolation {
        Isolation::Cgroups => IsolationMode::Cgroups,
        Isolation::None => IsolationMode::None,
    };
    let root = args
        .cgroup_root
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CGROUP_ROOT).join(&name));
    let isolator = Isolator::new(mode, Some(root)).context("--isolation cgroups")?;
    let usage_interval =
        seconds("usage-interval", args.usage_interval)?.max(Duration::from_millis(200));
    let task_user = resolve_task_user(args.task_user)?;
    let mut containers = gantry_agent::container::ContainerConfig::new(&args.work_dir);
    if let Some(rt) = &args.container_runtime {
        containers.runtime = Some(
            gantry_agent::container::find_on_path(rt)
                .with_context(|| format!("--container-runtime {rt}: not found"))?,
        );
    }
    for entry in &args.local_rootfs {
        let (name, dir) = entry
            .split_once('=')
            .with_context(|| format!("--local-rootfs {entry:?}: give NAME=DIR"))?;
        let dir = PathBuf::from(dir);
        anyhow::ensure!(
            dir.is_dir() && dir.is_absolute(),
            "--local-rootfs {entry:?}: {} is not an absolute directory",
            dir.display()
        );
        containers.local_rootfs.insert(name.to_string(), dir);
    }
    for dir in &args.volume_allow {
        anyhow::ensure!(
            dir.is_absolute(),
            "--volume-allow {}: give an absolute path",
            dir.display()
        );
    }
    containers.volume_allow = args.volume_allow.clone();
    if !args.cdi_dir.is_empty() {
        containers.cdi_dirs = args.cdi_dir.clone();
    }
    let images = gantry_image::ImageStore::open(gantry_image::StoreConfig {
        dir: args
            .image_dir
            .clone()
            .unwrap_or_else(|| args.work_dir.join("images")),
        max_bytes: args.image_cache_mib.saturating_mul(1 << 20),
        insecure: args.registry_insecure.clone(),
        credentials: args.registry_credentials.clone(),
        extra_roots: args.registry_ca.clone(),
    })
    .context("--image-dir: opening the image store")?;
    let images = std::sync::Arc::new(images);
    containers.images = Some(images.clone());
    // Before anything is pulled (a pull may collect): the leases of the containers still here.
    let retaken = gantry_agent::container::retake_leases(&containers, &args.work_dir.join("meta"));
    if retaken > 0 {
        tracing::info!(
            retaken,
            "re-took the image leases of the containers from before"
        );
    }
    let config = AgentConfig {
        masters: args.master,
        work_dir: args.work_dir,
        tls_dir: args.tls_dir.context("--tls-dir is required")?,
        name,
        hostname: hostname(),
        resources,
        reserved,
        attributes: {
            let mut a = parse_attributes(&args.attributes)?;
            apply_price(&mut a, args.price_per_hour.as_deref())?;
            a
        },
        kill_grace: seconds("kill-grace", args.kill_grace)?,
        agent_exe: std::env::current_exe().context("locating the agent binary")?,
        isolator,
        gpus,
        cpu_hard_limit: args.cgroups_enable_cfs,
        task_pids_max: (args.task_pids_max > 0).then_some(args.task_pids_max),
        usage_interval,
        gpu_recovery_after: args
            .gpu_recovery_after
            .map(|s| seconds("gpu-recovery-after", s))
            .transpose()?,
        nvidia_majors: NvidiaMajors::detect(),
        task_user,
        gpu_sharing: args.gpu_sharing,
        gpu_memory_enforce: args.gpu_memory_enforce,
        gc: gc::GcPolicy {
            delay: seconds("gc-delay", args.gc_delay)?,
            disk_headroom: {
                anyhow::ensure!(
                    (0.0..=1.0).contains(&args.gc_disk_headroom),
                    "--gc-disk-headroom must be between 0 and 1"
                );
                args.gc_disk_headroom
            },
            keep: args.gc_keep,
        },
        wal_compact_bytes: args.wal_compact_bytes,
        commit_gap: std::time::Duration::from_millis(args.commit_gap_ms),
        recover_truncate: args.recover_truncate,
        cgroup_pool: args.cgroup_pool,
        metrics_listen: args.metrics_listen,
        ports,
        disk_enforcement: args.disk_enforcement,
        disk_watch_interval: seconds("disk-watch-interval", args.disk_watch_interval)?
            .max(Duration::from_millis(200)),
        containers: std::sync::Arc::new(containers),
        images: Some(images),
    };
    // The master refuses registrations past these bounds: say so now, not in a reconnect loop.
    gantry_proto::register_limits::check(
        &config.hostname,
        &config.attributes,
        &[],
        &config.reserved,
    )
    .map_err(|e| anyhow::anyhow!("--attributes / --reserved / host name: {e}"))?;
    tracing::info!(
        resources = %config.resources,
        gpus = config.gpus.as_ref().map(|g| g.inventory().gpus.len()).unwrap_or(0),
        isolation = if config.isolator.layout().is_some() { "cgroups" } else { "none" },
        task_user = %config.task_user,
        disk_enforcement = %config.disk_enforcement,
        "agent configured"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(agent::run(config, gantry_cli::process::shutdown_signal()))
}

/// `--cgroup-pool LOW:HIGH`.
fn parse_pool(s: &str) -> Result<(usize, usize), String> {
    let (low, high) = s
        .split_once(':')
        .ok_or_else(|| format!("expected LOW:HIGH, got {s:?}"))?;
    let low: usize = low.trim().parse().map_err(|e| format!("LOW: {e}"))?;
    let high: usize = high.trim().parse().map_err(|e| format!("HIGH: {e}"))?;
    if low > high || high > 65_536 {
        return Err(format!(
            "need LOW <= HIGH <= 65536 (cgroup v1 allows 65535 memory cgroups), got {s}"
        ));
    }
    Ok((low, high))
}
