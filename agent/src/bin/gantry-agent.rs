//! `gantry-agent`: run an agent on this host (or, internally, supervise one task).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gantry_agent::agent::{self, AgentConfig};
use gantry_agent::config::{parse_attributes, parse_reservation};
use gantry_agent::executor::supervise;
use gantry_sdk::Resources;

/// The Gantry agent: measures this host, registers with the master, runs tasks.
#[derive(Parser, Debug)]
#[command(
    version,
    about,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
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
    /// Resources to advertise instead of measuring, e.g. "cpus:4;mem:8192;disk:10000".
    #[arg(long)]
    resources: Option<String>,
    /// Static reservation ROLE=RESOURCES (repeatable), on top of --resources.
    #[arg(long = "reserve")]
    reserve: Vec<String>,
    /// Attributes, e.g. "rack:r1;zone:a".
    #[arg(long, default_value = "")]
    attributes: String,
    /// Seconds between SIGTERM and SIGKILL when a task is killed.
    #[arg(long, default_value_t = 3.0)]
    kill_grace: f64,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Internal: supervise one task (started by the agent).
    #[command(hide = true)]
    Supervise {
        #[arg(long)]
        sandbox: PathBuf,
        #[arg(long = "cgroup-procs")]
        cgroup_procs: Vec<PathBuf>,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Cmd::Supervise {
        sandbox,
        cgroup_procs,
        command,
    }) = cli.cmd
    {
        std::process::exit(supervise::run(&sandbox, &cgroup_procs, &command.join(" ")));
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = cli.run;
    let name = args.name.unwrap_or_else(hostname);
    anyhow::ensure!(
        gantry_sdk::transport::tls::valid_name(&name),
        "agent name {name:?} must be 1-64 characters of [A-Za-z0-9_.-]"
    );
    let resources = match &args.resources {
        Some(r) => Resources::parse(r).context("--resources")?,
        None => anyhow::bail!("--resources is required (host discovery is not wired in yet)"),
    };
    let mut reserved = BTreeMap::new();
    for r in &args.reserve {
        let (role, res) = parse_reservation(r)?;
        reserved
            .entry(role)
            .or_insert_with(Resources::new)
            .add_assign(&res);
    }
    anyhow::ensure!(
        args.kill_grace.is_finite() && args.kill_grace >= 0.0,
        "--kill-grace must be a non-negative number"
    );
    let config = AgentConfig {
        masters: args.master,
        work_dir: args.work_dir,
        tls_dir: args.tls_dir.context("--tls-dir is required")?,
        name,
        hostname: hostname(),
        resources,
        reserved,
        attributes: parse_attributes(&args.attributes)?,
        kill_grace: Duration::from_secs_f64(args.kill_grace),
        agent_exe: std::env::current_exe().context("locating the agent binary")?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(agent::run(config, async {
        let _ = tokio::signal::ctrl_c().await;
    }))
}
