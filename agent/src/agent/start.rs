//! The agent's start: the core's configuration from the agent's, the probe of the host for
//! the checkpointed tasks (recovery), and [`run`]: the log replayed, the core made, the loop
//! run until shutdown (its turns and effects are `Agent`'s, in the parent module).

use super::*;

fn core_config(config: &AgentConfig, mps_binary: Option<&std::path::Path>) -> CoreConfig {
    CoreConfig {
        work_dir: config.work_dir.clone(),
        hostname: config.hostname.clone(),
        resources: config.resources.clone(),
        reserved: config.reserved.clone(),
        attributes: config.attributes.clone(),
        task_user: config.task_user.clone(),
        root: user::is_root(),
        kill_grace: config.kill_grace,
        isolated: config.isolator.layout().is_some(),
        gpu_agent: config.gpus.is_some(),
        inventory: config
            .gpus
            .as_ref()
            .map(|g| g.inventory().gpus.clone())
            .unwrap_or_default(),
        gpu_sharing: config.gpu_sharing,
        gpu_memory_enforce: config.gpu_memory_enforce,
        gpu_recovery_after: config.gpu_recovery_after,
        cpu_hard_limit: config.cpu_hard_limit,
        task_pids_max: config.task_pids_max,
        nvidia_majors: config.nvidia_majors,
        usage_interval: config.usage_interval,
        gc: config.gc,
        ports: config.ports,
        disk_enforcement: config.disk_enforcement,
        disk_watch_interval: config.disk_watch_interval,
        mps: config.gpu_sharing == gpu::share::Sharing::Mps
            && config.gpus.is_some()
            && mps_binary.is_some(),
        // Random at each start: update ids stay unique across restarts.
        update_id_seed: UpdateId::random().0.as_u128(),
        cgroup_pool: crate::core::pool::PoolConfig {
            low: config.cgroup_pool.0,
            high: config.cgroup_pool.1,
            prefix: crate::core::pool::pool_prefix(
                &crate::core::pool::agent_prefix(&config.work_dir),
                unix_ms(),
            ),
        },
    }
}

/// Probes the host for the checkpointed tasks that are not terminal (blocking /proc reads).
fn probe(core: &AgentCore) -> RecoveryProbe {
    let mut probe = RecoveryProbe::default();
    for (id, rec) in &core.checkpoint().tasks {
        if rec.state.is_terminal() {
            continue;
        }
        // The launch comes from its record: the log does not hold it (logs of agents before
        // that did, and were read). (Checkpoints from before the meta directory kept no claim:
        // nothing to find.)
        let mut launched = rec.launched;
        if launched.is_none() && !rec.meta.as_os_str().is_empty() {
            if let Some(l) = executor::find_launched(&rec.meta) {
                probe.found.push((*id, l));
                launched = Some(l);
            }
        }
        // The exit comes from the launch record alone (the log never holds it), read once,
        // after the supervisor was seen alive or dead: a dead one's record is final.
        if let Some(l) = launched {
            let alive = executor::supervisor_alive(&l);
            match executor::read_exit(rec.meta_dir()) {
                None if alive => probe.alive.push(*id),
                exit => probe.exited.push((*id, exit)),
            }
        }
    }
    probe
}

/// Runs the agent until `shutdown` resolves. Running tasks are left running: a restarted
/// agent re-adopts them from its checkpoint.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    std::fs::create_dir_all(config.work_dir.join("sandboxes"))
        .with_context(|| format!("creating {}", config.work_dir.display()))?;
    // Refuse a TLS directory or key others may write (they could replace our identity or the
    // CA); warn about keys others may read.
    if config.tls_dir.exists() {
        for warning in tls::check_dir_permissions(&config.tls_dir)
            .context("checking the TLS directory's permissions")?
        {
            tracing::warn!("{warning}");
        }
    }
    let material = gantry_pki::load_or_issue(
        &config.tls_dir,
        &PeerIdentity::Agent(config.name.clone()),
        &[],
    )
    .context("loading the agent's TLS identity")?;
    let recovery = if config.recover_truncate {
        wal::Recovery::Truncate
    } else {
        wal::Recovery::Refuse
    };
    let (ckpt, wal) =
        Wal::open(&config.work_dir, recovery).context("recovering the agent's state")?;
    let (inputs, mut rx) = mpsc::unbounded_channel();
    let (resources, mut resources_rx) = mpsc::unbounded_channel();
    let (outboxes, outboxes_rx) = mpsc::unbounded_channel();
    let tx = Senders { inputs, resources };
    let mps =
        (config.gpu_sharing == gpu::share::Sharing::Mps && config.gpus.is_some()).then(|| {
            gpu::mps::MpsDaemons::new(
                gpu::mps::find_in_path(gpu::mps::MPS_CONTROL),
                &config.work_dir.join("mps"),
            )
        });
    let mps_binary = mps
        .as_ref()
        .filter(|m| m.enabled())
        .map(|_| std::path::Path::new(gpu::mps::MPS_CONTROL));
    let mut agent = Agent {
        core: AgentCore::new(
            core_config(&config, mps_binary),
            ckpt,
            unix_ms(),
            Instant::now(),
        ),
        config: config.clone(),
        wal,
        outbox: Vec::new(),
        launches: Vec::new(),
        launches_started: 0,
        releases: Vec::new(),
        syncing: None,
        waiting: Default::default(),
        sync_started: None,
        sync_at: None,
        compacting: false,
        master: None,
        outboxes: outboxes_rx,
        tx: tx.clone(),
        cgroups: HashMap::new(),
        fresh_cgroups: HashSet::new(),
        mps,
        supervisor: Arc::new(executor::client::SupervisorClient::new(
            executor::SupervisorCommand::beside(&config.agent_exe),
        )),
        users: Arc::default(),
        metrics: crate::metrics::AgentMetrics::default(),
        pool_gate: Arc::new(PoolGate::default()),
        disk_walks: HashMap::new(),
    };
    // The agent's tasks together weigh as the CPUs it offers against the host's other
    // processes (`Isolator::weigh_root`).
    let cpus =
        config.resources.get("cpus") + config.reserved.values().map(|r| r.get("cpus")).sum::<f64>();
    if let Err(e) = config.isolator.weigh_root(cpus) {
        tracing::warn!("cannot weigh the agent's cgroup root by its {cpus} CPUs: {e}");
    }
    let probed = probe(&agent.core);
    let effects = agent.core.recover(probed, unix_ms());
    agent.perform(effects)?;
    agent.commit()?;
    // Sandboxes left from earlier runs join the collection queue.
    {
        let dir = config.work_dir.clone();
        let tx = tx.clone();
        tokio::task::spawn_blocking(move || tx.input(Input::GcScanned(gc::scan(&dir))));
    }
    // GPU faults: the NVML watcher thread -> this loop.
    let watcher = config.gpus.as_ref().map(|g| {
        let (ftx, mut frx) = mpsc::unbounded_channel();
        let inputs = tx.inputs.clone();
        tokio::spawn(async move {
            while let Some(f) = frx.recv().await {
                if inputs.send(Input::GpuFault(f)).is_err() {
                    break;
                }
            }
        });
        g.watch_health(ftx)
    });
    let metrics_server = match config.metrics_listen {
        Some(addr) => {
            let listener = crate::metrics::bind(addr)
                .await
                .with_context(|| format!("--metrics-listen {addr}"))?;
            tracing::info!(%addr, "serving /metrics");
            Some(tokio::spawn(crate::metrics::serve(
                listener,
                agent.metrics.clone(),
            )))
        }
        None => None,
    };
    let session = tokio::spawn(session::run(
        config.masters.clone(),
        material,
        tx.inputs.clone(),
        outboxes,
        std::sync::Arc::new(
            crate::sandbox_api::SandboxApi::new(config.work_dir.clone())
                .with_containers(config.containers.clone()),
        ),
    ));
    tokio::pin!(shutdown);
    let result = loop {
        // Sleep until the core's next deadline or an input, whichever comes first (capped, so
        // a wall clock set back does not stall the agent).
        let core_sleep = agent.core.next_deadline(unix_ms()).map_or(MAX_SLEEP, |at| {
            Duration::from_millis(at.saturating_sub(unix_ms())).min(MAX_SLEEP)
        });
        // A sync of the log waiting for the commit gap wakes the loop too (the core is not
        // told: nothing of its is due).
        let sync_sleep = agent
            .sync_at
            .map(|at| at.saturating_duration_since(Instant::now()))
            .filter(|d| *d < core_sleep);
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            res = resources_rx.recv() => {
                if let Some(res) = res {
                    let mut handled = agent.resource(res);
                    // A burst of launches hands over as many cgroups: one turn of the loop.
                    while handled.is_ok() {
                        let Ok(res) = resources_rx.try_recv() else { break };
                        handled = agent.resource(res);
                    }
                    if let Err(e) = handled {
                        break Err(e);
                    }
                }
            }
            input = rx.recv() => match input {
                Some(input) => {
                    // Group commit: handle every input already waiting, then write their
                    // records with one fsync before anything they produced leaves.
                    let mut handled = agent.handle(input, &mut resources_rx);
                    let mut n = 1;
                    while handled.is_ok() && n < MAX_BATCH {
                        let Ok(input) = rx.try_recv() else { break };
                        handled = agent.handle(input, &mut resources_rx);
                        n += 1;
                    }
                    if let Err(e) = handled {
                        break Err(e);
                    }
                    if let Err(e) = agent.commit() {
                        break Err(e);
                    }
                }
                None => break Ok(()),
            },
            _ = tokio::time::sleep(sync_sleep.unwrap_or(core_sleep)) => {
                let done = if sync_sleep.is_some() {
                    agent.sync_due()
                } else {
                    agent.input(Input::Tick).and_then(|_| agent.commit())
                };
                if let Err(e) = done {
                    break Err(e);
                }
            }
        }
    };
    let result = result.and_then(|()| agent.finish_commits());
    let stats = agent.wal.stats();
    tracing::info!(
        log_frames = stats.frames,
        log_syncs = stats.syncs,
        launches = agent.launches_started,
        "write-ahead log of this run"
    );
    session.abort();
    if let Some(m) = metrics_server {
        m.abort();
    }
    if let Some(w) = watcher {
        tokio::task::spawn_blocking(move || w.stop()).await.ok();
    }
    // The pool is drained: its ready cgroups and any of this run's left empty (a recycling
    // finished after the loop) are removed; the gate keeps new ones from appearing.
    agent.pool_gate.close();
    let mut drained = agent.core.drain_pool();
    if !agent.core.pool().prefix().is_empty() {
        let prefix = agent.core.pool().prefix().to_string();
        let held: HashSet<String> = agent
            .core
            .checkpoint()
            .tasks
            .values()
            .filter(|t| !t.state.is_terminal())
            .filter_map(|t| t.cgroup.clone())
            .collect();
        if let Ok(names) = agent.config.isolator.list() {
            for n in names {
                if n.starts_with(&prefix) && !held.contains(&n) && !drained.contains(&n) {
                    drained.push(n);
                }
            }
        }
    }
    if !drained.is_empty() {
        let iso = agent.config.isolator.clone();
        let n = drained.len();
        let _ = tokio::task::spawn_blocking(move || {
            for name in drained {
                if let Ok(cg) = iso.reopen(&name) {
                    // Busy (a task's, recorded as ended meanwhile): left for the next start.
                    if cg.pids().is_ok_and(|p| p.is_empty()) {
                        destroy_cgroup(&cg);
                    }
                }
            }
        })
        .await;
        tracing::debug!(n, "drained the cgroup pool");
    }
    // A clean stop with no live task leaves no empty cgroup root behind; with live tasks the
    // root stays for the next start to re-adopt them. An agent no master accepted leaves it
    // alone: it may share the root of the agent whose name it collided with.
    if agent.core.accepted()
        && agent
            .core
            .checkpoint()
            .tasks
            .values()
            .all(|t| t.state.is_terminal())
    {
        if let Err(e) = agent.config.isolator.remove_root() {
            tracing::debug!("cgroup root not removed: {e}");
        }
    }
    result
}
