//! `gantry-queue serve`: its flags, and the queue put together from them (the store, the
//! core's configuration, the framework driver, the API in HTTP or HTTPS).

use super::*;

#[derive(Parser, Debug)]
pub(super) struct Serve {
    /// Master address(es), host:port, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub(super) master: Vec<String>,
    /// TLS directory (ca.pem plus framework-NAME.pem/.key, or ca.key to issue them).
    #[arg(long)]
    pub(super) tls_dir: PathBuf,
    /// The store (a redb database file, created if missing): jobs, attempts, states, usage
    /// history and the framework id survive restarts and `kill -9`.
    #[arg(long)]
    pub(super) store: PathBuf,
    /// How long the master keeps the queue's workers running while the queue is away (a
    /// restart within it takes them over), seconds.
    #[arg(long, default_value_t = 7 * 86400)]
    pub(super) failover_timeout_secs: u64,
    /// The API's listen address.
    #[arg(long, default_value = "127.0.0.1:8700")]
    pub(super) listen: String,
    /// A team: NAME=WEIGHT[:GPU_QUOTA][,MODEL:GPUS]... (repeatable; per-model quotas as
    /// `nlp=1:8,A100:4`). Unknown teams weigh 1.
    #[arg(long = "team")]
    pub(super) teams: Vec<String>,
    /// The role to run in.
    #[arg(long, default_value = "default")]
    pub(super) role: String,
    /// Framework name and certificate principal.
    #[arg(long, default_value = "gantry-queue")]
    pub(super) name: String,
    /// A waiting job rises one priority class per this many seconds (0: no aging).
    #[arg(long, default_value_t = 300)]
    pub(super) aging_secs: u64,
    /// How long the first blocked job may hold offers before backing off, counted from its
    /// reservation's estimated start when it has one (docs/queue.md, "Reservations and EASY
    /// backfill").
    #[arg(long, default_value_t = 60)]
    pub(super) hold_secs: u64,
    /// The backoff before a failed job's first retry, seconds; it doubles with each retry (up
    /// to 10 minutes).
    #[arg(long, default_value_t = 10)]
    pub(super) retry_backoff_secs: u64,
    /// Each job's checkpoint directory goes under this path (`ROOT/job-ID`, given to its
    /// workers as `GANTRY_QUEUE_CHECKPOINT_DIR` and kept across attempts): a filesystem every
    /// agent mounts at the same path (and this host, to remove old ones), writable by the
    /// tasks' users (e.g. mode 1777; each job's directory is made 0700 by its user).
    #[arg(long)]
    pub(super) checkpoint_root: Option<PathBuf>,
    /// How long an ended job's checkpoint directory is kept after its last write.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub(super) checkpoint_keep: Duration,
    /// The time limit of jobs submitted without one whose team has no default (N, Ns, Nm, Nh
    /// or Nd); without it such jobs are unlimited (they never backfill on reserved GPUs).
    #[arg(long)]
    pub(super) default_time_limit: Option<String>,
    /// A job waiting this long (N, Ns, Nm, Nh or Nd) whose team is below its weighted share of
    /// the GPUs preempts preemptible jobs of teams above theirs. Without it, never.
    #[arg(long)]
    pub(super) fair_share_wait: Option<String>,
    /// Fair-share usage decays with this half-life (N, Ns, Nm, Nh or Nd; Slurm's
    /// PriorityDecayHalfLife): a team's past GPU-seconds count half after it. Without it,
    /// usage since the start counts forever.
    #[arg(long)]
    pub(super) usage_half_life: Option<String>,
    /// The most GPUs a team may use beyond its quota: NAME=GPUS[,MODEL:GPUS]... (overall
    /// and per GPU model some team's quota names; NAME=MODEL:GPUS for a model only;
    /// repeatable).
    #[arg(long = "team-borrow-limit")]
    pub(super) team_borrow_limits: Vec<String>,
    /// The most of a team's idle nominal quota others may borrow: NAME=GPUS[,MODEL:GPUS]...
    /// (in each quota: a model's own limit, else the overall one; repeatable; Kueue's
    /// lendingLimit). Without it, all of it.
    #[arg(long = "team-lend-limit")]
    pub(super) team_lend_limits: Vec<String>,
    /// A team's default time limit: NAME=DURATION (repeatable).
    #[arg(long = "team-time-limit")]
    pub(super) team_time_limits: Vec<String>,
    /// A team's budget for one --budget-period, in the agents' price units: NAME=AMOUNT
    /// (repeatable). Past --budget-warn of it submissions get a warning; at it they are
    /// refused (403, `over-budget`) until the spending leaves the period.
    #[arg(long = "team-budget")]
    pub(super) team_budgets: Vec<String>,
    /// The rolling period budgets cover (N, Ns, Nm, Nh or Nd).
    #[arg(long, default_value = "30d")]
    pub(super) budget_period: String,
    /// The fraction of a budget from which submissions are warned.
    #[arg(long, default_value_t = 0.8)]
    pub(super) budget_warn: f64,
    /// The ACL file (TOML: declared teams, who may submit to which team up to which priority,
    /// team and queue administrators; see docs/queue.md). Without it the API is in dev mode:
    /// plain HTTP, and anyone who reaches the port may do anything.
    #[arg(long, requires_all = ["https_cert", "https_key"])]
    pub(super) acl: Option<PathBuf>,
    /// Users' tokens, in the master's operator-token file format (`gantryctl token hash NAME`).
    #[arg(long)]
    pub(super) tokens: Option<PathBuf>,
    /// The API's HTTPS certificate (PEM): a server certificate for the names clients use.
    #[arg(long, requires = "https_key")]
    pub(super) https_cert: Option<PathBuf>,
    /// Its key (PEM).
    #[arg(long, requires = "https_cert")]
    pub(super) https_key: Option<PathBuf>,
    /// Declare the eligible pending jobs' worker shapes to the master (`set_demand`, at most
    /// 16 shapes) as they change: the master then offers tasks' worth of those shapes, and an
    /// autoscaler reading `GET /api/v1/demand` adds nodes for what the fleet cannot place.
    /// On by default; kept for scripts that name it.
    #[arg(long, hide = true, overrides_with = "no_declare_demand")]
    pub(super) declare_demand: bool,
    /// Declare no demand to the master (it then offers whole agents, and an autoscaler sees
    /// none of the queue's pending work).
    #[arg(long, overrides_with = "declare_demand")]
    pub(super) no_declare_demand: bool,
    /// The cluster grows with demand (an autoscaler reads the demand this queue declares):
    /// a job that no agent seen so far can run is accepted and waits for a node that can
    /// (its pending reason says so), instead of being refused at submission.
    #[arg(long, conflicts_with = "no_declare_demand")]
    pub(super) elastic: bool,
    /// The master's operator API, https://HOST:PORT (its --http-listen): `gantry-queue logs`
    /// relays workers' output from there, asked with the framework's certificate
    /// (framework-NAME.pem in --tls-dir). Without it the queue serves no logs.
    #[arg(long)]
    pub(super) master_api: Option<String>,
}

pub(super) async fn serve(a: Serve) -> anyhow::Result<()> {
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
    let mut config = DriverConfig::new(a.master, a.tls_dir.clone(), &a.name, vec![a.role.clone()]);
    config.info.capabilities.push(Capability::GpuResources);
    // Every agent, offered or not: the never-fit check and reservations judge the whole cluster.
    config.info.capabilities.push(Capability::AgentInventory);
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
    let team_borrow_limits = team_limits("--team-borrow-limit", &a.team_borrow_limits, &teams)?;
    let team_lend_limits = team_limits("--team-lend-limit", &a.team_lend_limits, &teams)?;
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
        elastic: a.elastic,
        role: a.role.clone(),
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
        core.count_spending(&store.usage()?, unix_ms());
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

/// Parses a team limit flag's values (`NAME=GPUS[,MODEL:GPUS]...`); a model must be one some
/// team's quota names (only those have a bucket of their own).
fn team_limits(
    flag: &str,
    values: &[String],
    teams: &BTreeMap<String, TeamConfig>,
) -> anyhow::Result<BTreeMap<String, TeamLimit>> {
    let mut out = BTreeMap::new();
    for v in values {
        let (name, limit) = TeamLimit::parse(flag, v).map_err(anyhow::Error::msg)?;
        for model in limit.models.keys() {
            let named = teams
                .values()
                .flat_map(|t| t.model_quotas.keys())
                .any(|m| m.eq_ignore_ascii_case(model));
            if !named {
                bail!("{flag} {v:?}: no team's --team quota names the model {model}");
            }
        }
        if out.insert(name.clone(), limit).is_some() {
            bail!("{flag}: team {name} given twice");
        }
    }
    Ok(out)
}
