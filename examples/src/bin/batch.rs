//! `batch`: run N copies of a command on a Gantry cluster.
//!
//! ```text
//! batch --master 127.0.0.1:5050 --tls-dir DIR --role ROLE --count 10 --cpus 0.5 --mem 64 -- sleep 1
//! batch ... -- 'echo $HOSTNAME; sleep 1'        # one word: a shell command (/bin/sh -c)
//! batch ... -- python3 -c 'a=[1]; print(a)'    # several words: argv, executed exactly as typed
//! ```
//! Exits 0 when every copy finished successfully, 1 if any failed or was killed. Copies the
//! cluster lost (their agent went away: `LOST`, `GONE`) are launched again, once per loss.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use gantry_examples::batch::{Batch, BatchSpec};
use gantry_sdk::protocol::{Capability, CommandInfo, GpuSelector};
use gantry_sdk::transport::PeerIdentity;
use gantry_sdk::{Driver, DriverConfig, Resources};

/// Run N copies of COMMAND on a Gantry cluster and wait for all of them.
#[derive(Parser, Debug)]
#[command(version, about, args_override_self = true)]
struct Args {
    /// Master address(es), host:port, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    master: Vec<String>,
    /// TLS directory (ca.pem plus framework-NAME.pem/.key, or ca.key to issue them).
    #[arg(long)]
    tls_dir: PathBuf,
    /// The role to run in.
    #[arg(long, default_value = "default")]
    role: String,
    /// Framework name and certificate principal (default: batch-ROLE).
    #[arg(long)]
    name: Option<String>,
    /// Number of copies.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// CPUs per copy.
    #[arg(long, default_value_t = 1.0)]
    cpus: f64,
    /// Memory per copy, MiB.
    #[arg(long, default_value_t = 128.0)]
    mem: f64,
    /// GPUs per copy: below 1 a fraction of one GPU shared with other tasks (`0.25`, milli-GPU
    /// precision), from 1 up whole GPUs.
    #[arg(long, default_value_t = 0.0)]
    gpus: f64,
    /// Only GPUs whose model name contains this (case-insensitive), e.g. A100.
    #[arg(long)]
    gpu_model: Option<String>,
    /// Only GPUs with at least this much memory, MiB.
    #[arg(long)]
    gpu_min_memory: Option<u64>,
    /// MIG devices of this profile (e.g. 1g.10gb) instead of whole GPUs.
    #[arg(long)]
    gpu_mig_profile: Option<String>,
    /// Only these GPUs (UUIDs, repeatable or comma separated; as many as --gpus pins the devices).
    #[arg(long, value_delimiter = ',')]
    gpu_uuid: Vec<String>,
    /// The Unix user the tasks run as (default: the agent's --task-user).
    #[arg(long)]
    user: Option<String>,
    /// The command. One word is a shell command (`/bin/sh -c WORD`); several words are an
    /// argv executed directly, each word passed exactly as given (no shell).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `-- ONE_STRING` runs the string with the shell; `-- PROG ARG...` executes the argv exactly.
fn command(words: Vec<String>, user: Option<String>) -> CommandInfo {
    let mut c = if words.len() == 1 {
        CommandInfo::shell(words.into_iter().next().unwrap_or_default())
    } else {
        CommandInfo::argv(words)
    };
    c.user = user;
    c
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse_from(gantry_sdk::config_file::expand_args()?);
    anyhow::ensure!(
        [args.cpus, args.mem, args.gpus]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0),
        "--cpus, --mem and --gpus must be non-negative"
    );
    let name = args
        .name
        .unwrap_or_else(|| format!("batch-{}", args.role.replace('/', "-")));
    let task = Resources::new()
        .with("cpus", args.cpus)
        .with("mem", args.mem)
        .with("gpus", args.gpus);
    task.gpu_amount()
        .map_err(|e| anyhow::anyhow!("--gpus: {e}"))?;
    let gpu_selector = (args.gpu_model.is_some()
        || args.gpu_min_memory.is_some()
        || args.gpu_mig_profile.is_some()
        || !args.gpu_uuid.is_empty())
    .then(|| GpuSelector {
        model: args.gpu_model.clone(),
        min_memory_mib: args.gpu_min_memory,
        mig_profile: args.gpu_mig_profile.clone(),
        uuids: args.gpu_uuid.clone(),
    });
    let spec = BatchSpec {
        name: name.clone(),
        command: command(args.command, args.user),
        count: args.count,
        task,
        env: Default::default(),
        verbose: true,
        gpu_selector,
    };
    // Development: with the CA key in the TLS directory, issue this framework's certificate
    // when it is missing (in production, `gantryctl certs framework NAME` does). The SDK only
    // reads the directory.
    if args.tls_dir.join("ca.key").exists() {
        gantry_pki::load_or_issue(&args.tls_dir, &PeerIdentity::Framework(name.clone()), &[])
            .context("issuing the framework certificate from the CA key")?;
    }
    let mut config = DriverConfig::new(args.master, args.tls_dir, &name, vec![args.role]);
    // It waits for UNREACHABLE tasks and relaunches what the cluster lost (docs/ha.md).
    config.info.capabilities.push(Capability::PartitionAware);
    if args.gpus > 0.0 {
        config.info.capabilities.push(Capability::GpuResources);
    }
    let (batch, progress) = Batch::new(spec);
    if args.count == 0 {
        println!("[{name}] nothing to run");
        return Ok(());
    }
    Driver::new(config)
        .run(batch)
        .await
        .context("running the batch framework")?;
    let p = progress.borrow().clone();
    println!(
        "[{name}] done: {} finished, {} failed, {} relaunched after the cluster lost them",
        p.finished, p.failed, p.relaunched
    );
    for e in p.errors.iter().take(10) {
        println!("[{name}]   {e}");
    }
    std::process::exit(if p.failed == 0 && p.finished == args.count {
        0
    } else {
        1
    });
}
