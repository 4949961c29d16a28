//! `gantry-queue`: the ML GPU job queue on Gantry (see the `gantry_queue` crate and
//! docs/queue.md).
//!
//! ```text
//! gantry-queue serve --master 127.0.0.1:5050 --tls-dir DIR --store /var/lib/gantry/queue.redb \
//!     --listen 127.0.0.1:8700 --team vision=2 --team nlp=1:16   # NAME=WEIGHT[:GPU_QUOTA]
//! gantry-queue submit --server http://127.0.0.1:8700 --name resnet --team vision \
//!     --priority high --gpus 8 --workers 2 -- python3 train.py
//! gantry-queue submit ... --workers 2..8 -- ./ddp.sh        # elastic gang
//! gantry-queue submit ... --after 12,13 -- ./eval.sh        # after jobs 12 and 13 FINISHED
//! gantry-queue list --server URL [--json]
//! gantry-queue show --server URL ID [--json]
//! gantry-queue cancel --server URL ID
//! gantry-queue logs --server URL ID [--worker I] [-f] [--stderr]
//! gantry-queue shutdown --server URL         # tears the framework down (SIGTERM does not)
//! gantry-queue usage --server URL --since 7d [--by team|user] [--json|--csv]   # GPU-hours, cost, budgets
//! gantry-queue bench-submit --server URL --jobs 10000 --concurrency 32
//! gantry-queue simulate trace.csv --cluster 4x8:A100,2x8:H100 --policy queue,fifo,easy
//! ```
//!
//! Exit codes as gantryctl's: 0 ok, 1 error (unreachable, 400), 2 usage, 3 not found (404),
//! 4 forbidden (401, 403).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use gantry_master::security::tokens::OperatorTokens;
use gantry_queue::auth::Acl;
use gantry_queue::core::{Core, CoreConfig, MAX_ENDED_JOBS};
use gantry_queue::http::{self, Api};
use gantry_queue::model::{Gpus, JobSpec, JobView, Priority, TeamConfig, TeamLimit};
use gantry_queue::runtime::{unix_ms, QueueScheduler, Shared};
use gantry_queue::store::Store;
use gantry_sdk::protocol::Capability;
use gantry_sdk::transport::PeerIdentity;
use gantry_sdk::{Driver, DriverConfig};

const EXIT_ERROR: u8 = 1;
const EXIT_NOT_FOUND: u8 = 3;
const EXIT_FORBIDDEN: u8 = 4;

/// An error answer of the API (its HTTP status decides the exit code).
#[derive(Debug)]
struct ApiError {
    status: u16,
    message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

/// The ML GPU job queue on Gantry: gangs, priorities, team fair share, backfill, preemption;
/// durable across restarts.
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
        #[command(flatten)]
        conn: Conn,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job.
    Show {
        #[command(flatten)]
        conn: Conn,
        /// Job id.
        id: u64,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job (its workers are killed).
    Cancel {
        #[command(flatten)]
        conn: Conn,
        /// Job id.
        id: u64,
    },
    /// Tear the queue's framework down: the master kills every running worker (those jobs end
    /// CANCELLED), pending jobs stay in the store, and `serve` exits. SIGTERM, by contrast,
    /// only disconnects: the workers keep running and the next `serve` takes them over.
    Shutdown {
        #[command(flatten)]
        conn: Conn,
    },
    /// A worker's output (standard output, or error), relayed from the master: the job's
    /// user, its team's and the queue's administrators may read it.
    Logs {
        #[command(flatten)]
        conn: Conn,
        /// Job id.
        id: u64,
        /// The worker's index.
        #[arg(long, default_value_t = 0)]
        worker: u32,
        /// Follow the output until the worker ends.
        #[arg(short, long)]
        follow: bool,
        /// Standard error instead of standard output.
        #[arg(long)]
        stderr: bool,
    },
    /// GPU-hours per team (or per team and user) from the queue's usage history.
    Usage {
        #[command(flatten)]
        conn: Conn,
        /// The window: the last N, Ns, Nm, Nh or Nd.
        #[arg(long, default_value = "7d")]
        since: String,
        /// team or user.
        #[arg(long, default_value = "team")]
        by: gantry_queue::usage::By,
        /// JSON instead of a table.
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// CSV instead of a table.
        #[arg(long)]
        csv: bool,
    },
    /// Benchmark: submit N small jobs through the API with C concurrent clients, and print
    /// submissions/s and the latency percentiles (docs/benchmarks.md).
    BenchSubmit {
        #[command(flatten)]
        conn: Conn,
        /// Jobs to submit.
        #[arg(long, default_value_t = 10_000)]
        jobs: u32,
        /// Concurrent clients (each submits one job at a time, on its own connection).
        #[arg(long, default_value_t = 32)]
        concurrency: u32,
        /// The team to submit to.
        #[arg(long, default_value = "default")]
        team: String,
    },
    /// Replay a job trace on emulated agents (see docs/queue.md, "Simulator").
    Simulate(gantry_queue::sim::cli::SimulateArgs),
}

mod client;
mod serve;

use client::*;
use serve::*;

#[derive(Parser, Debug)]
struct Submit {
    #[command(flatten)]
    conn: Conn,
    /// Job name; workers' tasks are named NAME/INDEX.
    #[arg(long)]
    name: String,
    /// Team.
    #[arg(long)]
    team: String,
    /// critical, high, normal, low or preemptible.
    #[arg(long, default_value = "normal")]
    priority: Priority,
    /// GPUs per worker: whole GPUs (`8`) or a fraction of one GPU (`0.5`, milli-GPU
    /// precision; several workers share a GPU).
    #[arg(long, default_value = "0")]
    gpus: Gpus,
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
    /// Deadline: Unix seconds, or +DURATION (e.g. +90s, +30m, +2h). The job should end by then
    /// (see --deadline-policy).
    #[arg(long)]
    deadline: Option<String>,
    /// What a deadline means: `cancel` (a job not started by its deadline minus its time
    /// limit is cancelled with the reason `deadline`) or `best-effort` (it still runs).
    #[arg(long, default_value = "cancel", value_parser = ["cancel", "best-effort"])]
    deadline_policy: String,
    /// Seconds between the preemption warning (SIGTERM) and SIGKILL.
    #[arg(long, default_value_t = 10)]
    grace_secs: u32,
    /// Run only after these jobs FINISHED (comma separated ids; Slurm's afterok): the job
    /// waits PENDING until then, and is CANCELLED if one of them FAILED or was CANCELLED.
    #[arg(long, value_delimiter = ',')]
    after: Vec<u64>,
    /// Run the job again this many times when a worker fails (exits non-zero), with backoff;
    /// workers lost with their agent and preemptions are requeued and do not count.
    #[arg(long, default_value_t = 0)]
    max_retries: u32,
    /// Kill an attempt this long after its launch (N, Ns, Nm, Nh or Nd); the job ends FAILED
    /// with the reason `time-limit`.
    #[arg(long)]
    time_limit: Option<String>,
    /// Submit an array: one job per index (`0-99`, `0-9,20`), each named NAME[INDEX] with the
    /// index in GANTRY_QUEUE_ARRAY_INDEX; prints the array's id (its first job's).
    #[arg(long)]
    array: Option<String>,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
    /// The command: one word is a shell command, several an argv.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn parse_team(s: &str) -> anyhow::Result<(String, TeamConfig)> {
    TeamConfig::parse(s).map_err(anyhow::Error::msg)
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

/// A duration in seconds: N, Ns, Nm, Nh or Nd.
fn parse_secs(d: &str) -> anyhow::Result<u64> {
    let (num, unit) = d.split_at(d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len()));
    let n: u64 = num.parse().context("a duration is N, Ns, Nm, Nh or Nd")?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => bail!("a duration's unit is s, m, h or d"),
    };
    n.checked_mul(mult).context("the duration is too long")
}

fn parse_deadline(s: &str) -> anyhow::Result<u64> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    if let Some(d) = s.strip_prefix('+') {
        return Ok(now + parse_secs(d).context("deadline")?);
    }
    s.parse().context("deadline: Unix seconds or +DURATION")
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = match gantry_sdk::config_file::expand_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // Usage errors exit with 2 (clap's convention).
    let args = Args::parse_from(args);
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
        .and_then(|rt| rt.block_on(run(args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            let status = e.downcast_ref::<ApiError>().map(|a| a.status);
            ExitCode::from(match status {
                Some(401 | 403) => EXIT_FORBIDDEN,
                Some(404) => EXIT_NOT_FOUND,
                _ => EXIT_ERROR,
            })
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
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
                deadline_best_effort: s.deadline_policy == "best-effort",
                array: s.array,
                array_job: None,
                array_index: None,
                grace_secs: s.grace_secs,
                env: BTreeMap::new(),
                after: s.after,
                max_retries: s.max_retries,
                time_limit_secs: s
                    .time_limit
                    .as_deref()
                    .map(parse_secs)
                    .transpose()
                    .context("--time-limit")?,
            };
            if let Some(p) = spec.problem() {
                bail!("{p}");
            }
            let v = call(
                &s.conn,
                reqwest::Method::POST,
                "/jobs",
                Some(serde_json::to_string(&spec)?),
            )
            .await?;
            if s.json {
                println!("{v}");
            } else {
                if let Some(w) = v["warning"].as_str() {
                    eprintln!("warning: {w}");
                }
                println!("{}", v["id"]);
            }
            Ok(())
        }
        Cmd::List { conn, json } => {
            let v = call(&conn, reqwest::Method::GET, "/jobs", None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let jobs = serde_json::from_value::<Vec<JobView>>(v)?;
                table(&jobs);
                for j in &jobs {
                    if let Some(sum) = &j.array_summary {
                        println!("array {} ({}): {}", j.id, j.name, summary(sum));
                    }
                }
            }
            Ok(())
        }
        Cmd::Show { conn, id, json } => {
            let v = call(&conn, reqwest::Method::GET, &format!("/jobs/{id}"), None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let j: JobView = serde_json::from_value(v)?;
                table(std::slice::from_ref(&j));
                if let Some(sum) = &j.array_summary {
                    println!("  array {}: {}", j.id, summary(sum));
                }
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
        Cmd::BenchSubmit {
            conn,
            jobs,
            concurrency,
            team,
        } => bench_submit(&conn, jobs, concurrency, &team).await,
        Cmd::Logs {
            conn,
            id,
            worker,
            follow,
            stderr,
        } => logs(&conn, id, worker, follow, stderr).await,
        Cmd::Cancel { conn, id } => {
            call(&conn, reqwest::Method::DELETE, &format!("/jobs/{id}"), None).await?;
            println!("cancelled {id}");
            Ok(())
        }
        Cmd::Shutdown { conn } => {
            call(&conn, reqwest::Method::POST, "/shutdown", None).await?;
            println!("shutting down: the framework is torn down");
            Ok(())
        }
        Cmd::Usage {
            conn,
            since,
            by,
            json,
            csv,
        } => {
            let window = parse_secs(&since).context("--since")?;
            let since_ms = unix_ms().saturating_sub(window.saturating_mul(1000));
            let by_name = if by == gantry_queue::usage::By::User {
                "user"
            } else {
                "team"
            };
            let path = format!("/usage?since_unix_ms={since_ms}&by={by_name}");
            let v = call(&conn, reqwest::Method::GET, &path, None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let rows: Vec<gantry_queue::usage::UsageRow> = serde_json::from_value(v)?;
                if csv {
                    print!("{}", gantry_queue::usage::csv(&rows));
                } else {
                    print!("{}", gantry_queue::usage::table(&rows));
                    let b = call(&conn, reqwest::Method::GET, "/budgets", None).await?;
                    let budgets: Vec<gantry_queue::budget::BudgetView> = serde_json::from_value(b)?;
                    if !budgets.is_empty() {
                        print!("\n{}", gantry_queue::budget::table(&budgets));
                    }
                }
            }
            Ok(())
        }
        Cmd::Simulate(s) => {
            let teams = s
                .teams
                .iter()
                .map(|t| parse_team(t))
                .collect::<anyhow::Result<_>>()?;
            print!("{}", gantry_queue::sim::cli::run(&s, teams)?);
            Ok(())
        }
    }
}
