//! `sweep`: a hyper-parameter sweep on a Gantry cluster: trials retried with backoff, then an
//! evaluation group launched atomically on one agent ([`gantry_examples::sweep`]).
//!
//! ```text
//! sweep --master 127.0.0.1:5050 --tls-dir DIR --trials 12 \
//!     --trial 'python3 train.py --lr-index $TRIAL' --eval 'python3 eval.py'
//! ```
//! Exits 0 when every trial succeeded and the evaluation finished, 1 otherwise.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gantry_examples::sweep::{Sweep, SweepSpec};
use gantry_sdk::attempts::RetryPolicy;
use gantry_sdk::protocol::{Capability, CommandInfo, TaskState};
use gantry_sdk::transport::PeerIdentity;
use gantry_sdk::{Driver, DriverConfig};

/// Run a sweep of one-GPU trials, then an evaluation group on one agent.
#[derive(Parser, Debug)]
#[command(version, about)]
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
    /// Framework name and certificate principal.
    #[arg(long, default_value = "sweep")]
    name: String,
    /// Number of trials.
    #[arg(long, default_value_t = 12)]
    trials: u32,
    /// What a trial runs (shell; `TRIAL` and `ATTEMPT` in its environment).
    #[arg(long)]
    trial: String,
    /// Resources of a trial.
    #[arg(long, default_value = "cpus:1;mem:1024;gpus:1")]
    trial_resources: String,
    /// Retries of a failed trial.
    #[arg(long, default_value_t = 2)]
    retries: u32,
    /// Backoff before the first retry (doubling, at most 30 s).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    backoff: Duration,
    /// What each evaluation member runs (shell; the group environment in its environment).
    #[arg(long)]
    eval: String,
    /// Evaluation members (on one agent).
    #[arg(long, default_value_t = 2)]
    eval_members: u32,
    /// Resources of an evaluation member.
    #[arg(long, default_value = "cpus:1;mem:1024;gpus:2")]
    eval_resources: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse_from(gantry_sdk::config_file::expand_args()?);
    let spec = SweepSpec {
        name: args.name.clone(),
        trials: args.trials,
        trial_command: CommandInfo::shell(args.trial),
        trial_resources: args.trial_resources.parse().context("--trial-resources")?,
        retry: RetryPolicy::new(args.retries, args.backoff, Duration::from_secs(30)),
        eval_members: args.eval_members,
        eval_command: CommandInfo::shell(args.eval),
        eval_resources: args.eval_resources.parse().context("--eval-resources")?,
    };
    if args.tls_dir.join("ca.key").exists() {
        gantry_pki::load_or_issue(
            &args.tls_dir,
            &PeerIdentity::Framework(args.name.clone()),
            &[],
        )
        .context("issuing the framework certificate from the CA key")?;
    }
    let mut builder = DriverConfig::builder(&args.name);
    for m in args.master {
        builder = builder.master(m);
    }
    let config = builder
        .tls_dir(args.tls_dir)
        .role(args.role)
        .capability(Capability::GpuResources)
        .build();
    let (sweep, progress) = Sweep::new(spec);
    Driver::new(config)
        .run(sweep)
        .await
        .context("running the sweep")?;
    let p = progress.borrow().clone();
    println!(
        "[{}] trials: {} succeeded, {} given up, {} attempts ({} retries); evaluation: {:?}",
        args.name,
        p.trials_succeeded,
        p.trials_given_up,
        p.attempts,
        p.retries,
        p.eval_ended.iter().map(|e| e.1).collect::<Vec<_>>()
    );
    let ok = p.trials_given_up == 0 && p.eval_ended.iter().any(|e| e.1 == TaskState::Finished);
    std::process::exit(if ok { 0 } else { 1 });
}
