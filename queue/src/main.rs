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
use gantry_queue::model::{JobSpec, JobView, Priority, TeamConfig};
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

/// How to reach the queue's API and who the caller is.
#[derive(clap::Args, Debug, Clone)]
struct Conn {
    /// The queue's API: https://HOST:PORT (http:// for a queue in dev mode).
    #[arg(long)]
    server: String,
    /// The CA certificate (PEM) the queue's HTTPS certificate is checked against: the cluster's
    /// ca.pem.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// A user token (`Authorization: Bearer`); also $GANTRY_QUEUE_TOKEN.
    #[arg(long, env = "GANTRY_QUEUE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A client certificate (PEM) of the cluster CA, `operator:NAME` (read as user NAME).
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
}

#[derive(Parser, Debug)]
struct Serve {
    /// Master address(es), host:port, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    master: Vec<String>,
    /// TLS directory (ca.pem plus framework-NAME.pem/.key, or ca.key to issue them).
    #[arg(long)]
    tls_dir: PathBuf,
    /// The store (a redb database file, created if missing): jobs, attempts, states, usage
    /// history and the framework id survive restarts and `kill -9`.
    #[arg(long)]
    store: PathBuf,
    /// How long the master keeps the queue's workers running while the queue is away (a
    /// restart within it takes them over), seconds.
    #[arg(long, default_value_t = 7 * 86400)]
    failover_timeout_secs: u64,
    /// The API's listen address.
    #[arg(long, default_value = "127.0.0.1:8700")]
    listen: String,
    /// A team: NAME=WEIGHT[:GPU_QUOTA][,MODEL:GPUS]... (repeatable; per-model quotas as
    /// `nlp=1:8,A100:4`). Unknown teams weigh 1.
    #[arg(long = "team")]
    teams: Vec<String>,
    /// The role to run in.
    #[arg(long, default_value = "default")]
    role: String,
    /// Framework name and certificate principal.
    #[arg(long, default_value = "gantry-queue")]
    name: String,
    /// A waiting job rises one priority class per this many seconds (0: no aging).
    #[arg(long, default_value_t = 300)]
    aging_secs: u64,
    /// How long the first blocked job may hold offers before backing off.
    #[arg(long, default_value_t = 60)]
    hold_secs: u64,
    /// The backoff before a failed job's first retry, seconds; it doubles with each retry (up
    /// to 10 minutes).
    #[arg(long, default_value_t = 10)]
    retry_backoff_secs: u64,
    /// Each job's checkpoint directory goes under this path (`ROOT/job-ID`, given to its
    /// workers as `GANTRY_QUEUE_CHECKPOINT_DIR` and kept across attempts): a filesystem every
    /// agent mounts at the same path (and this host, to remove old ones), writable by the
    /// tasks' users (e.g. mode 1777; each job's directory is made 0700 by its user).
    #[arg(long)]
    checkpoint_root: Option<PathBuf>,
    /// How long an ended job's checkpoint directory is kept after its last write.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    checkpoint_keep: Duration,
    /// The time limit of jobs submitted without one whose team has no default (N, Ns, Nm, Nh
    /// or Nd); without it such jobs are unlimited (they never backfill on reserved GPUs).
    #[arg(long)]
    default_time_limit: Option<String>,
    /// A job waiting this long (N, Ns, Nm, Nh or Nd) whose team is below its weighted share of
    /// the GPUs preempts preemptible jobs of teams above theirs. Without it, never.
    #[arg(long)]
    fair_share_wait: Option<String>,
    /// Fair-share usage decays with this half-life (N, Ns, Nm, Nh or Nd; Slurm's
    /// PriorityDecayHalfLife): a team's past GPU-seconds count half after it. Without it,
    /// usage since the start counts forever.
    #[arg(long)]
    usage_half_life: Option<String>,
    /// The most GPUs a team may use beyond its quota: NAME=GPUS (repeatable).
    #[arg(long = "team-borrow-limit")]
    team_borrow_limits: Vec<String>,
    /// The most of a team's idle nominal quota others may borrow: NAME=GPUS (repeatable;
    /// Kueue's lendingLimit). Without it, all of it.
    #[arg(long = "team-lend-limit")]
    team_lend_limits: Vec<String>,
    /// A team's default time limit: NAME=DURATION (repeatable).
    #[arg(long = "team-time-limit")]
    team_time_limits: Vec<String>,
    /// A team's budget for one --budget-period, in the agents' price units: NAME=AMOUNT
    /// (repeatable). Past --budget-warn of it submissions get a warning; at it they are
    /// refused (403, `over-budget`) until the spending leaves the period.
    #[arg(long = "team-budget")]
    team_budgets: Vec<String>,
    /// The rolling period budgets cover (N, Ns, Nm, Nh or Nd).
    #[arg(long, default_value = "30d")]
    budget_period: String,
    /// The fraction of a budget from which submissions are warned.
    #[arg(long, default_value_t = 0.8)]
    budget_warn: f64,
    /// The ACL file (TOML: declared teams, who may submit to which team up to which priority,
    /// team and queue administrators; see docs/queue.md). Without it the API is in dev mode:
    /// plain HTTP, and anyone who reaches the port may do anything.
    #[arg(long, requires_all = ["https_cert", "https_key"])]
    acl: Option<PathBuf>,
    /// Users' tokens, in the master's operator-token file format (`gantryctl token hash NAME`).
    #[arg(long)]
    tokens: Option<PathBuf>,
    /// The API's HTTPS certificate (PEM): a server certificate for the names clients use.
    #[arg(long, requires = "https_key")]
    https_cert: Option<PathBuf>,
    /// Its key (PEM).
    #[arg(long, requires = "https_cert")]
    https_key: Option<PathBuf>,
    /// Declare the eligible pending jobs' worker shapes to the master (`set_demand`, at most
    /// 16 shapes) as they change: the master then offers tasks' worth of those shapes, and an
    /// autoscaler reading `GET /api/v1/demand` adds nodes for what the fleet cannot place.
    /// On by default; kept for scripts that name it.
    #[arg(long, hide = true, overrides_with = "no_declare_demand")]
    declare_demand: bool,
    /// Declare no demand to the master (it then offers whole agents, and an autoscaler sees
    /// none of the queue's pending work).
    #[arg(long, overrides_with = "declare_demand")]
    no_declare_demand: bool,
    /// The master's operator API, https://HOST:PORT (its --http-listen): `gantry-queue logs`
    /// relays workers' output from there, asked with the framework's certificate
    /// (framework-NAME.pem in --tls-dir). Without it the queue serves no logs.
    #[arg(long)]
    master_api: Option<String>,
}

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

fn client(conn: &Conn) -> anyhow::Result<reqwest::Client> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = &conn.ca {
        for cert in CertificateDer::pem_file_iter(ca)
            .with_context(|| format!("reading {}", ca.display()))?
        {
            roots.add(cert.with_context(|| format!("reading {}", ca.display()))?)?;
        }
    }
    let identity = match (&conn.cert, &conn.key) {
        (Some(cert), Some(key)) => Some(gantry_sdk::transport::tls::Identity {
            chain: CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("reading {}", cert.display()))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("reading {}", cert.display()))?,
            key: PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("reading {}", key.display()))?,
        }),
        _ => None,
    };
    let tls = gantry_sdk::transport::tls::https_client_config(roots, identity.as_ref())?;
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(Duration::from_secs(30))
        .build()?)
}

async fn call(
    conn: &Conn,
    method: reqwest::Method,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<serde_json::Value> {
    let url = format!("{}{path}", conn.server.trim_end_matches('/'));
    let mut req = client(conn)?.request(method, &url);
    if let Some(token) = &conn.token {
        req = req.bearer_auth(token);
    }
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
        let message = value["error"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| value.to_string());
        return Err(ApiError {
            status: status.as_u16(),
            message,
        }
        .into());
    }
    Ok(value)
}

/// `gantry-queue bench-submit`: `jobs` submissions of a one-CPU job (`sleep 1`, no GPU) by
/// `concurrency` clients; prints the rate and the latency percentiles.
async fn bench_submit(conn: &Conn, jobs: u32, concurrency: u32, team: &str) -> anyhow::Result<()> {
    let url = format!("{}/jobs", conn.server.trim_end_matches('/'));
    let body = serde_json::json!({
        "name": "bench", "team": team, "command": ["sleep 1"], "cpus": 0.1, "mem": 16,
    })
    .to_string();
    let next = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (client, url, body, next) = (client(conn)?, url.clone(), body.clone(), next.clone());
        let token = conn.token.clone();
        clients.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < jobs {
                let t = Instant::now();
                let mut req = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone());
                if let Some(token) = &token {
                    req = req.bearer_auth(token);
                }
                let resp = req.send().await?;
                let status = resp.status();
                let text = resp.text().await?;
                if !status.is_success() {
                    bail!("{status}: {text}");
                }
                lat.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut lat = Vec::new();
    for c in clients {
        lat.extend(c.await??);
    }
    let secs = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "{} submissions in {secs:.2} s: {:.0}/s with {concurrency} clients; latency p50 {:.2} ms, \
         p99 {:.2} ms, max {:.2} ms",
        lat.len(),
        lat.len() as f64 / secs,
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    Ok(())
}

/// `gantry-queue logs`: the worker's output streamed to standard output as it comes.
async fn logs(conn: &Conn, id: u64, worker: u32, follow: bool, stderr: bool) -> anyhow::Result<()> {
    use std::io::Write as _;
    let url = format!(
        "{}/jobs/{id}/logs?worker={worker}&follow={follow}&stderr={stderr}",
        conn.server.trim_end_matches('/')
    );
    // No overall deadline: a followed worker writes as long as it runs.
    let mut req = client(conn)?
        .get(&url)
        .timeout(Duration::from_secs(100 * 365 * 86_400));
    if let Some(token) = &conn.token {
        req = req.bearer_auth(token);
    }
    let mut resp = req
        .send()
        .await
        .with_context(|| format!("reaching {url}"))?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await?;
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(text);
        return Err(ApiError {
            status: status.as_u16(),
            message,
        }
        .into());
    }
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = resp.chunk().await? {
        out.write_all(&chunk)?;
        out.flush()?;
    }
    Ok(())
}

fn table(jobs: &[JobView]) {
    println!(
        "{:>5}  {:<20} {:<10} {:<10} {:<11} {:<9} {:>4} {:>7} {:>4} {:>7} {:>8} {:>9}  WHERE / WHY",
        "ID",
        "NAME",
        "TEAM",
        "USER",
        "PRIORITY",
        "STATE",
        "POS",
        "WORKERS",
        "GPUS",
        "PREEMPT",
        "WAITED",
        "START"
    );
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    for j in jobs {
        let workers = if j.min_workers == j.max_workers {
            format!("{}/{}", j.workers, j.max_workers)
        } else {
            format!("{}/{}..{}", j.workers, j.min_workers, j.max_workers)
        };
        let pos = j
            .position
            .map_or_else(|| "-".to_string(), |p| p.to_string());
        println!(
            "{:>5}  {:<20} {:<10} {:<10} {:<11} {:<9} {:>4} {:>7} {:>4} {:>7} {:>7.0}s {:>9}  {}",
            j.id,
            j.name,
            j.team,
            if j.user.is_empty() { "-" } else { &j.user },
            j.priority.as_str(),
            j.state.as_str(),
            pos,
            workers,
            j.gpus_per_worker,
            j.preemptions,
            j.waited_secs,
            start_in(j, now_ms),
            where_(j)
        );
    }
}

/// An array's jobs per state: `3 PENDING, 2 RUNNING, 95 FINISHED`.
fn summary(sum: &BTreeMap<String, u32>) -> String {
    let parts: Vec<String> = sum.iter().map(|(s, n)| format!("{n} {s}")).collect();
    parts.join(", ")
}

/// A pending job's estimated start from now (`now`, `in 90s`, `in 12m`, `in 3h`, `in 2d`), or
/// `-` when unknown or not pending.
fn start_in(j: &JobView, now_ms: u64) -> String {
    let Some(at) = j.estimated_start_unix_ms else {
        return "-".into();
    };
    let secs = at.saturating_sub(now_ms) / 1000;
    match secs {
        0 => "now".into(),
        1..120 => format!("in {secs}s"),
        120..7200 => format!("in {}m", secs / 60),
        7200..172_800 => format!("in {}h", secs / 3600),
        _ => format!("in {}d", secs / 86400),
    }
}

/// The agents a job runs on, the dependencies a pending job waits on, or why it waits.
fn where_(j: &JobView) -> String {
    if !j.waiting_on.is_empty() {
        let ids: Vec<String> = j.waiting_on.iter().map(u64::to_string).collect();
        return format!("waits on {}", ids.join(","));
    }
    if let Some(why) = &j.pending_reason {
        return why.clone();
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
    let store = Store::open(&a.store)?;
    let loaded = store.load(MAX_ENDED_JOBS)?;
    let mut config = DriverConfig::new(a.master, a.tls_dir.clone(), &a.name, vec![a.role]);
    config.info.capabilities.push(Capability::GpuResources);
    config.info.failover_timeout_secs = a.failover_timeout_secs as f64;
    config.info.framework_id = loaded.framework_id;
    if let Some(id) = loaded.framework_id {
        tracing::info!(framework_id = %id, jobs = loaded.jobs.len(), "resuming from the store");
    }
    let driver = Driver::new(config);
    let mut team_time_limits = BTreeMap::new();
    for t in &a.team_time_limits {
        let (name, d) = t
            .split_once('=')
            .with_context(|| format!("--team-time-limit {t:?}: expected NAME=DURATION"))?;
        let secs = parse_secs(d).with_context(|| format!("--team-time-limit {t:?}"))?;
        if secs == 0 {
            bail!("--team-time-limit {t:?}: the limit must be positive");
        }
        team_time_limits.insert(name.to_string(), Duration::from_secs(secs));
    }
    let default_time_limit = match &a.default_time_limit {
        Some(d) => {
            let secs = parse_secs(d).context("--default-time-limit")?;
            if secs == 0 {
                bail!("--default-time-limit: the limit must be positive");
            }
            Some(Duration::from_secs(secs))
        }
        None => None,
    };
    let usage_half_life = match &a.usage_half_life {
        Some(d) => Some(Duration::from_secs(
            parse_secs(d).context("--usage-half-life")?,
        ))
        .filter(|d| !d.is_zero()),
        None => None,
    };
    let fair_share_wait = match &a.fair_share_wait {
        Some(d) => Some(Duration::from_secs(
            parse_secs(d).context("--fair-share-wait")?,
        )),
        None => None,
    };
    let mut team_borrow_limits = BTreeMap::new();
    for t in &a.team_borrow_limits {
        let (name, n) = t
            .split_once('=')
            .with_context(|| format!("--team-borrow-limit {t:?}: expected NAME=GPUS"))?;
        let n: u64 = n
            .parse()
            .with_context(|| format!("--team-borrow-limit {t:?}: GPUS"))?;
        team_borrow_limits.insert(name.to_string(), n);
    }
    let mut team_lend_limits = BTreeMap::new();
    for t in &a.team_lend_limits {
        let (name, n) = t
            .split_once('=')
            .with_context(|| format!("--team-lend-limit {t:?}: expected NAME=GPUS"))?;
        let n: u64 = n
            .parse()
            .with_context(|| format!("--team-lend-limit {t:?}: GPUS"))?;
        team_lend_limits.insert(name.to_string(), n);
    }
    let mut budgets = gantry_queue::budget::BudgetConfig {
        period: Duration::from_secs(parse_secs(&a.budget_period).context("--budget-period")?),
        warn_at: a.budget_warn,
        ..Default::default()
    };
    if budgets.period.is_zero() {
        bail!("--budget-period: the period must be positive");
    }
    if !(0.0..=1.0).contains(&a.budget_warn) {
        bail!("--budget-warn {}: a fraction from 0 to 1", a.budget_warn);
    }
    for b in &a.team_budgets {
        budgets.add(b).context("--team-budget")?;
    }
    let mut core_config = CoreConfig {
        budgets,
        team_borrow_limits,
        team_lend_limits,
        fair_share_wait,
        usage_half_life,
        teams,
        team_time_limits,
        default_time_limit,
        aging: Duration::from_secs(a.aging_secs),
        retry_backoff: Duration::from_secs(a.retry_backoff_secs),
        checkpoint_root: a.checkpoint_root.as_ref().map(|p| p.display().to_string()),
        ..Default::default()
    };
    core_config.hold.timeout = Duration::from_secs(a.hold_secs.max(1));
    let mut core = Core::new(core_config);
    let owed = core.restore(
        loaded.jobs,
        loaded.gpu_secs,
        loaded.next_id,
        Instant::now(),
        unix_ms(),
    );
    if !a.team_budgets.is_empty() {
        core.restore_spending(&store.usage()?, unix_ms());
    }
    let shared = Shared::with_demand(core, store, driver.handle(), !a.no_declare_demand);
    // Kills owed from before a restart: queued by the driver until it has subscribed.
    shared.resume(owed);
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .with_context(|| format!("binding {}", a.listen))?;
    let acl = a.acl.as_deref().map(Acl::load).transpose()?;
    let tokens = match &a.tokens {
        Some(p) => OperatorTokens::load(p)?,
        None => OperatorTokens::none(),
    };
    let tls = match (&a.https_cert, &a.https_key) {
        (Some(cert), Some(key)) => Some(http::https_config(&a.tls_dir, cert, key)?),
        _ => None,
    };
    if acl.is_none() {
        tracing::warn!("no --acl: dev mode, anyone who reaches the API may do anything");
    }
    let master = match &a.master_api {
        Some(url) => Some(
            http::MasterApi::new(url, &a.tls_dir, &a.name)
                .with_context(|| format!("--master-api {url}"))?,
        ),
        None => None,
    };
    let app = http::router(Arc::new(Api {
        shared: Arc::clone(&shared),
        acl,
        tokens,
        master,
    }));
    let local = listener.local_addr()?;
    let api = match tls {
        Some(cfg) => {
            println!("gantry-queue API on https://{local}");
            tokio::spawn(http::serve_https(listener, Arc::new(cfg), app))
        }
        None => {
            println!("gantry-queue API on http://{local}");
            tokio::spawn(async move { axum::serve(listener, app).await })
        }
    };
    let _ticker = shared.spawn_ticker(Duration::from_millis(250));
    let _sweeper = a.checkpoint_root.clone().map(|root| {
        gantry_queue::runtime::spawn_checkpoint_sweeper(
            Arc::clone(&shared),
            root,
            a.checkpoint_keep,
        )
    });
    let handle = driver.handle();
    tokio::spawn(async move {
        gantry_sdk::process::shutdown_signal().await;
        // Disconnect, never tear down: the workers keep running for the failover timeout and
        // the next `serve` on this store takes them over.
        handle.disconnect();
    });
    let result = driver.run(QueueScheduler::new(Arc::clone(&shared))).await;
    api.abort();
    if shared.is_broken() {
        bail!("the store failed (see the log); the next run resumes from what it holds");
    }
    result.context("running the gantry-queue framework")
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
