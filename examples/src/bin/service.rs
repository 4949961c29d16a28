//! `service`: keep N instances of a command up on a Gantry cluster.
//!
//! ```text
//! service run --master 127.0.0.1:5050 --tls-dir DIR --name web --definition web.json --status-file web.status.json
//! service status --status-file web.status.json [--json]
//! ```
//!
//! The definition file (JSON; edit it to roll the instances to a new definition):
//!
//! ```json
//! {"instances": 3, "command": "exec python3 -m http.server $PORT", "cpus": 0.1, "mem": 64,
//!  "spread": true, "ports": 1,
//!  "health": {"tcp": true, "interval_secs": 1, "grace_secs": 10, "failures": 3}}
//! ```

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gantry_examples::service::{self, Status};
use gantry_sdk::transport::PeerIdentity;
use gantry_sdk::DriverConfig;

/// Keep N instances of a command up on a Gantry cluster.
#[derive(Parser, Debug)]
#[command(version, about, args_override_self = true)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the service framework.
    Run {
        /// Master address(es), host:port, comma separated.
        #[arg(long, value_delimiter = ',', required = true)]
        master: Vec<String>,
        /// TLS directory (ca.pem plus framework-NAME.pem/.key, or ca.key to issue them).
        #[arg(long)]
        tls_dir: PathBuf,
        /// The role to run in.
        #[arg(long, default_value = "default")]
        role: String,
        /// Service (framework) name and certificate principal; tasks are named NAME/INDEX.
        #[arg(long)]
        name: String,
        /// The definition file (JSON), re-read every half second.
        #[arg(long)]
        definition: PathBuf,
        /// Where the status is written (JSON, every half second).
        #[arg(long)]
        status_file: PathBuf,
    },
    /// Print the status a running service wrote.
    Status {
        #[arg(long)]
        status_file: PathBuf,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Args::parse_from(gantry_sdk::config_file::expand_args()?).cmd {
        Cmd::Run {
            master,
            tls_dir,
            role,
            name,
            definition,
            status_file,
        } => {
            if tls_dir.join("ca.key").exists() {
                gantry_pki::load_or_issue(&tls_dir, &PeerIdentity::Framework(name.clone()), &[])
                    .context("issuing the framework certificate from the CA key")?;
            }
            let mut config = DriverConfig::new(master, tls_dir, &name, vec![role]);
            config.reconcile = gantry_sdk::reconcile::ReconcileConfig::periodic(
                std::time::Duration::from_secs(600),
            );
            service::run(config, definition, status_file).await
        }
        Cmd::Status { status_file, json } => {
            let text = std::fs::read_to_string(&status_file)
                .with_context(|| format!("reading {}", status_file.display()))?;
            if json {
                println!("{text}");
                return Ok(());
            }
            let s: Status = serde_json::from_str(&text).context("parsing the status")?;
            println!(
                "{}: {}/{} up, version {:016x}{}",
                s.name,
                s.up,
                s.instances,
                s.version,
                if s.rolling { " (rolling)" } else { "" }
            );
            for v in &s.slots {
                println!(
                    "  {}/{:<3} {:<9} {:<5} {:<20} port {:<6} restarts {:<3} version {:016x}",
                    s.name,
                    v["index"],
                    v["state"].as_str().unwrap_or("-"),
                    if v["up"] == true { "up" } else { "down" },
                    v["host"].as_str().unwrap_or(""),
                    v["port"],
                    v["restarts"],
                    v["version"].as_u64().unwrap_or(0),
                );
            }
            Ok(())
        }
    }
}
