//! `gpu-queue`: an ML GPU job queue on Gantry (see `gantry_examples::gpu_queue` and
//! docs/framework-guide.md).
//!
//! ```text
//! gpu-queue serve --master 127.0.0.1:5050 --tls-dir DIR --listen 127.0.0.1:8700 \
//!     --team vision=2 --team nlp=1:16          # NAME=WEIGHT[:GPU_QUOTA]
//! gpu-queue submit --server http://127.0.0.1:8700 --name resnet --team vision \
//!     --priority high --gpus 8 --workers 2 -- python3 train.py
//! gpu-queue submit ... --workers 2..8 -- ./ddp.sh        # elastic gang
//! gpu-queue submit ... --after 12,13 -- ./eval.sh        # after jobs 12 and 13 FINISHED
//! gpu-queue list --server URL [--json]
//! gpu-queue show --server URL ID [--json]
//! gpu-queue cancel --server URL ID
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use gantry_examples::gpu_queue::core::{Core, CoreConfig};
use gantry_examples::gpu_queue::framework::{QueueScheduler, Shared};
use gantry_examples::gpu_queue::http;
use gantry_examples::gpu_queue::model::{JobSpec, JobView, Priority, TeamConfig};
use gantry_sdk::protocol::Capability;
use gantry_sdk::transport::PeerIdentity;
use gantry_sdk::{Driver, DriverConfig};

/// An ML GPU job queue on Gantry: gangs, priorities, team fair share, backfill, preemption.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the queue: the framework plus its HTTP API.
    Serve(Serve),
    /// Submit a job; prints its id.
    Submit(Submit),
    /// List every job.
    List {
        /// The queue's API, e.g. http://127.0.0.1:8700.
        #[arg(long)]
        server: String,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job.
    Show {
        /// The queue's API.
        #[arg(long)]
        server: String,
        /// Job id.
        id: u64,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job (its workers are killed).
    Cancel {
        /// The queue's API.
        #[arg(long)]
        server: String,
        /// Job id.
        id: u64,
    },
}

#[derive(Parser, Debug)]
struct Serve {
    /// Master address(es), host:port, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    master: Vec<String>,
    /// TLS directory (ca.pem plus framework-NAME.pem/.key, or ca.key to issue them).
    #[arg(long)]
    tls_dir: PathBuf,
    /// The API's listen address.
    #[arg(long, default_value = "127.0.0.1:8700")]
    listen: String,
    /// A team: NAME=WEIGHT or NAME=WEIGHT:GPU_QUOTA (repeatable). Unknown teams weigh 1.
    #[arg(long = "team")]
    teams: Vec<String>,
    /// The role to run in.
    #[arg(long, default_value = "default")]
    role: String,
    /// Framework name and certificate principal.
    #[arg(long, default_value = "gpu-queue")]
    name: String,
    /// A waiting job rises one priority class per this many seconds (0: no aging).
    #[arg(long, default_value_t = 300)]
    aging_secs: u64,
    /// How long the first blocked job may hold offers before backing off.
    #[arg(long, default_value_t = 60)]
    hold_secs: u64,
}

#[derive(Parser, Debug)]
struct Submit {
    /// The queue's API, e.g. http://127.0.0.1:8700.
    #[arg(long)]
    server: String,
    /// Job name; workers' tasks are named NAME/INDEX.
    #[arg(long)]
    name: String,
    /// Team.
    #[arg(long)]
    team: String,
    /// critical, high, normal, low or preemptible.
    #[arg(long, default_value = "normal")]
    priority: Priority,
    /// Whole GPUs per worker.
    #[arg(long, default_value_t = 0)]
    gpus: u32,
    /// Workers: N (a gang when above 1) or MIN..MAX (elastic).
    #[arg(long, default_value = "1")]
    workers: String,
    /// CPUs per worker.
    #[arg(long, default_value_t = 1.0)]
    cpus: f64,
    /// Memory per worker, MiB.
    #[arg(long, default_value_t = 256.0)]
    mem: f64,
    /// GPU model substring (e.g. A100).
    #[arg(long)]
    gpu_model: Option<String>,
    /// Least GPU memory, MiB.
    #[arg(long)]
    gpu_min_memory: Option<u64>,
    /// Deadline: Unix seconds, or +DURATION (e.g. +90s, +30m, +2h).
    #[arg(long)]
    deadline: Option<String>,
    /// Seconds between the preemption warning (SIGTERM) and SIGKILL.
    #[arg(long, default_value_t = 10)]
    grace_secs: u32,
    /// Run only after these jobs FINISHED (comma separated ids; Slurm's afterok): the job
    /// waits PENDING until then, and is CANCELLED if one of them FAILED or was CANCELLED.
    #[arg(long, value_delimiter = ',')]
    after: Vec<u64>,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
    /// The command: one word is a shell command, several an argv.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn parse_team(s: &str) -> anyhow::Result<(String, TeamConfig)> {
    let (name, rest) = s
        .split_once('=')
        .with_context(|| format!("--team {s:?}: expected NAME=WEIGHT[:GPU_QUOTA]"))?;
    let (w, q) = match rest.split_once(':') {
        Some((w, q)) => (w, Some(q.parse::<u64>().context("GPU quota")?)),
        None => (rest, None),
    };
    let weight: f64 = w.parse().with_context(|| format!("--team {s:?}: weight"))?;
    if !(weight.is_finite() && weight > 0.0) {
        bail!("--team {s:?}: the weight must be positive");
    }
    Ok((
        name.to_string(),
        TeamConfig {
            weight,
            gpu_quota: q,
        },
    ))
}

fn parse_workers(s: &str) -> anyhow::Result<(u32, u32)> {
    match s.split_once("..") {
        Some((a, b)) => Ok((a.parse()?, b.parse()?)),
        None => {
            let n = s.parse()?;
            Ok((n, n))
        }
    }
}

fn parse_deadline(s: &str) -> anyhow::Result<u64> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    if let Some(d) = s.strip_prefix('+') {
        let (num, unit) = d.split_at(d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len()));
        let n: u64 = num.parse().context("deadline")?;
        let mult = match unit {
            "" | "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86400,
            _ => bail!("deadline unit must be s, m, h or d"),
        };
        return Ok(now + n * mult);
    }
    s.parse().context("deadline: Unix seconds or +DURATION")
}

fn client() -> anyhow::Result<reqwest::Client> {
    // Plain HTTP; reqwest still wants a TLS configuration (ring provider, no roots).
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(Duration::from_secs(30))
        .build()?)
}

async fn call(
    method: reqwest::Method,
    url: String,
    body: Option<String>,
) -> anyhow::Result<serde_json::Value> {
    let mut req = client()?.request(method, &url);
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("reaching {url}"))?;
    let status = resp.status();
    let text = resp.text().await?;
    let value: serde_json::Value =
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    if !status.is_success() {
        let msg = value["error"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| value.to_string());
        bail!("{status}: {msg}");
    }
    Ok(value)
}

fn table(jobs: &[JobView]) {
    println!(
        "{:>5}  {:<20} {:<10} {:<11} {:<9} {:>7} {:>4} {:>7} {:>8}  WHERE",
        "ID", "NAME", "TEAM", "PRIORITY", "STATE", "WORKERS", "GPUS", "PREEMPT", "WAITED"
    );
    for j in jobs {
        let workers = if j.min_workers == j.max_workers {
            format!("{}/{}", j.workers, j.max_workers)
        } else {
            format!("{}/{}..{}", j.workers, j.min_workers, j.max_workers)
        };
        println!(
            "{:>5}  {:<20} {:<10} {:<11} {:<9} {:>7} {:>4} {:>7} {:>7.0}s  {}",
            j.id,
            j.name,
            j.team,
            j.priority.as_str(),
            j.state.as_str(),
            workers,
            j.gpus_per_worker,
            j.preemptions,
            j.waited_secs,
            where_(j)
        );
    }
}

/// The agents a job runs on, or the dependencies a pending job waits on.
fn where_(j: &JobView) -> String {
    if !j.waiting_on.is_empty() {
        let ids: Vec<String> = j.waiting_on.iter().map(u64::to_string).collect();
        return format!("waits on {}", ids.join(","));
    }
    j.agents.join(",")
}

async fn serve(a: Serve) -> anyhow::Result<()> {
    let mut teams = BTreeMap::new();
    for t in &a.teams {
        let (name, cfg) = parse_team(t)?;
        teams.insert(name, cfg);
    }
    if a.tls_dir.join("ca.key").exists() {
        gantry_pki::load_or_issue(&a.tls_dir, &PeerIdentity::Framework(a.name.clone()), &[])
            .context("issuing the framework certificate from the CA key")?;
    }
    let mut config = DriverConfig::new(a.master, a.tls_dir, &a.name, vec![a.role]);
    config.info.capabilities.push(Capability::GpuResources);
    let driver = Driver::new(config);
    let mut core_config = CoreConfig {
        teams,
        aging: Duration::from_secs(a.aging_secs),
        ..Default::default()
    };
    core_config.hold.timeout = Duration::from_secs(a.hold_secs.max(1));
    let shared = Shared::new(Core::new(core_config), driver.handle());
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .with_context(|| format!("binding {}", a.listen))?;
    println!("gpu-queue API on http://{}", listener.local_addr()?);
    let app = http::router(Arc::clone(&shared));
    let api = tokio::spawn(async move { axum::serve(listener, app).await });
    let _ticker = shared.spawn_ticker(Duration::from_millis(250));
    let handle = driver.handle();
    tokio::spawn(async move {
        gantry_sdk::process::shutdown_signal().await;
        handle.stop();
    });
    let result = driver.run(QueueScheduler::new(shared)).await;
    api.abort();
    result.context("running the gpu-queue framework")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse_from(gantry_sdk::config_file::expand_args()?);
    match args.command {
        Cmd::Serve(s) => serve(s).await,
        Cmd::Submit(s) => {
            let (min, max) = parse_workers(&s.workers).context("--workers: N or MIN..MAX")?;
            let spec = JobSpec {
                name: s.name,
                team: s.team,
                priority: s.priority,
                command: s.command,
                cpus: s.cpus,
                mem: s.mem,
                gpus: s.gpus,
                gpu_model: s.gpu_model,
                gpu_min_memory: s.gpu_min_memory,
                min_workers: min,
                max_workers: max,
                deadline_unix: s.deadline.as_deref().map(parse_deadline).transpose()?,
                grace_secs: s.grace_secs,
                env: BTreeMap::new(),
                after: s.after,
            };
            if let Some(p) = spec.problem() {
                bail!("{p}");
            }
            let v = call(
                reqwest::Method::POST,
                format!("{}/jobs", s.server.trim_end_matches('/')),
                Some(serde_json::to_string(&spec)?),
            )
            .await?;
            if s.json {
                println!("{v}");
            } else {
                println!("{}", v["id"]);
            }
            Ok(())
        }
        Cmd::List { server, json } => {
            let v = call(
                reqwest::Method::GET,
                format!("{}/jobs", server.trim_end_matches('/')),
                None,
            )
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                table(&serde_json::from_value::<Vec<JobView>>(v)?);
            }
            Ok(())
        }
        Cmd::Show { server, id, json } => {
            let v = call(
                reqwest::Method::GET,
                format!("{}/jobs/{id}", server.trim_end_matches('/')),
                None,
            )
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let j: JobView = serde_json::from_value(v)?;
                table(std::slice::from_ref(&j));
                for m in &j.members {
                    println!(
                        "  {:<28} {:<9} {:<16} {}",
                        m.task,
                        m.state,
                        m.agent,
                        m.gpus.join(",")
                    );
                }
                if !j.message.is_empty() {
                    println!("  {}", j.message);
                }
            }
            Ok(())
        }
        Cmd::Cancel { server, id } => {
            call(
                reqwest::Method::DELETE,
                format!("{}/jobs/{id}", server.trim_end_matches('/')),
                None,
            )
            .await?;
            println!("cancelled {id}");
            Ok(())
        }
    }
}
