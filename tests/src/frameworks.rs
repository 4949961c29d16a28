//! Frameworks run in-process with `gantry-sdk`: the example batch framework ([`run_batch`]),
//! a [`Recorder`] that launches given tasks and records their updates ([`start_recording`]
//! gives a [`Recording`]: updates, errors, handle, driver), and [`driver_config`] /
//! [`crate::Cluster::framework_config`]
//! (which issues the framework's certificate with `gantry-pki` first, as the SDK only reads
//! the TLS directory).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

/// A [`gantry_sdk::DriverConfig`] for the framework `principal`, after issuing its certificate
/// into `tls_dir` from the CA key there (`gantry_pki`, as the dev mode of the `batch` example
/// does: the SDK itself only reads the directory).
pub fn driver_config(
    masters: Vec<String>,
    tls_dir: PathBuf,
    principal: &str,
    roles: Vec<String>,
) -> gantry_sdk::DriverConfig {
    gantry_pki::load_or_issue(
        &tls_dir,
        &gantry_sdk::transport::PeerIdentity::Framework(principal.to_string()),
        &[],
    )
    .expect("issue the framework certificate from the test cluster's CA key");
    gantry_sdk::DriverConfig::new(masters, tls_dir, principal, roles)
}

/// Runs the example batch framework in-process against `master` until it is done.
pub async fn run_batch(
    master: SocketAddr,
    tls_dir: &Path,
    name: &str,
    role: &str,
    count: u32,
    task: &str,
    command: &str,
) -> anyhow::Result<gantry_examples::batch::BatchProgress> {
    run_batch_ha(
        vec![master.to_string()],
        tls_dir,
        name,
        role,
        count,
        task,
        command,
    )
    .await
}

/// A framework run by a [`Recorder`] that launches `tasks` (errors are dropped): its status
/// updates, a handle, and the running driver. Call inside a tokio runtime.
pub fn start_recorder(
    config: gantry_sdk::DriverConfig,
    tasks: Vec<gantry_sdk::protocol::TaskInfo>,
) -> (
    Updates,
    gantry_sdk::DriverHandle,
    tokio::task::JoinHandle<Result<(), gantry_sdk::scheduler::DriverError>>,
) {
    let r = start_recording(config, tasks);
    (r.updates, r.handle, r.run)
}

/// A [`Recorder`] framework running in this process ([`start_recording`]).
pub struct Recording {
    /// Its status updates.
    pub updates: Updates,
    /// The framework errors it received (`"Kind: message"`).
    pub errors: tokio::sync::mpsc::UnboundedReceiver<String>,
    pub handle: gantry_sdk::DriverHandle,
    pub run: tokio::task::JoinHandle<Result<(), gantry_sdk::scheduler::DriverError>>,
}

impl Recording {
    /// The framework errors received so far.
    pub fn errors_so_far(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.errors.try_recv().ok()).collect()
    }

    /// Waits for `task` to reach `state`; on failure prints the cluster's logs and the
    /// framework's errors, then panics.
    pub async fn expect(
        &mut self,
        cluster: &crate::Cluster,
        task: &gantry_sdk::protocol::TaskInfo,
        state: gantry_sdk::protocol::TaskState,
        timeout: Duration,
    ) -> gantry_sdk::protocol::StatusUpdate {
        match self.updates.wait(task.task_id, state, timeout).await {
            Ok(u) => u,
            Err(e) => {
                cluster.dump_logs();
                panic!(
                    "{} ({}): {e:#}; framework errors: {:?}",
                    task.name,
                    task.task_id,
                    self.errors_so_far()
                );
            }
        }
    }

    /// Stops the driver and waits for it to end cleanly.
    pub async fn stop(self, timeout: Duration) {
        self.handle.stop();
        tokio::time::timeout(timeout, self.run)
            .await
            .expect("the driver ends after stop")
            .expect("the driver task does not panic")
            .expect("the driver ends without error");
    }
}

/// Starts a [`Recorder`] framework with `config` that launches `tasks` as offers allow. Call
/// inside a tokio runtime.
pub fn start_recording(
    config: gantry_sdk::DriverConfig,
    tasks: Vec<gantry_sdk::protocol::TaskInfo>,
) -> Recording {
    let (updates, up_rx) = tokio::sync::mpsc::unbounded_channel();
    let (errors, errors_rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = gantry_sdk::Driver::new(config);
    let handle = driver.handle();
    let rec = Recorder {
        to_launch: tasks,
        updates,
        errors,
        in_flight: Default::default(),
    };
    Recording {
        updates: Updates::new(up_rx),
        errors: errors_rx,
        handle,
        run: tokio::spawn(driver.run(rec)),
    }
}

impl crate::Cluster {
    /// A driver config for the framework `principal` in `roles` against this cluster's master
    /// (certificate issued from its CA).
    pub fn framework_config(&self, principal: &str, roles: &[&str]) -> gantry_sdk::DriverConfig {
        driver_config(
            vec![self.master.quic.to_string()],
            self.tls_dir.clone(),
            principal,
            roles.iter().map(|r| r.to_string()).collect(),
        )
    }

    /// [`crate::Cluster::framework_config`] with the `GpuResources` capability (GPU offers).
    pub fn gpu_framework_config(
        &self,
        principal: &str,
        roles: &[&str],
    ) -> gantry_sdk::DriverConfig {
        let mut config = self.framework_config(principal, roles);
        config.info.capabilities = vec![gantry_sdk::protocol::Capability::GpuResources];
        config
    }
}

/// A scheduler for tests: launches the given tasks as offers allow (declining the rest) and
/// forwards every status update and error into channels.
pub struct Recorder {
    pub to_launch: Vec<gantry_sdk::protocol::TaskInfo>,
    pub updates: tokio::sync::mpsc::UnboundedSender<gantry_sdk::protocol::StatusUpdate>,
    pub errors: tokio::sync::mpsc::UnboundedSender<String>,
    /// Tasks sent in accepts and not yet updated: a DROPPED one (its accept raced another on
    /// the same agent) goes back into `to_launch` under the same id.
    pub in_flight:
        std::collections::HashMap<gantry_sdk::protocol::TaskId, gantry_sdk::protocol::TaskInfo>,
}

impl gantry_sdk::Scheduler for Recorder {
    async fn offers(
        &mut self,
        driver: &gantry_sdk::DriverHandle,
        offers: Vec<gantry_sdk::protocol::Offer>,
    ) {
        // One accept per agent and role naming all the offers there (the master acts on all
        // of a framework's offers on an agent at once).
        let groups = gantry_sdk::placement::offers::group_offers(&offers);
        for g in groups {
            let (ids, mut avail) = (g.offer_ids, g.resources);
            let mut launch = Vec::new();
            self.to_launch.retain(|t| {
                if avail.contains(&t.resources) {
                    let _ = avail.checked_sub_assign(&t.resources);
                    launch.push(t.clone());
                    false
                } else {
                    true
                }
            });
            if launch.is_empty() {
                driver.decline(ids, Some(1.0));
            } else {
                for t in &launch {
                    self.in_flight.insert(t.task_id, t.clone());
                }
                driver.accept(
                    ids,
                    vec![gantry_sdk::protocol::Operation::Launch { tasks: launch }],
                    None,
                );
            }
        }
    }

    async fn status_update(
        &mut self,
        driver: &gantry_sdk::DriverHandle,
        update: &gantry_sdk::protocol::StatusUpdate,
    ) {
        if let Some(t) = self.in_flight.remove(&update.task_id) {
            if update.state == gantry_sdk::protocol::TaskState::Dropped {
                self.to_launch.push(t);
                driver.revive(vec![]);
                return;
            }
        }
        let _ = self.updates.send(update.clone());
    }

    async fn error(
        &mut self,
        _driver: &gantry_sdk::DriverHandle,
        kind: gantry_sdk::protocol::ErrorKind,
        message: &str,
    ) {
        let _ = self.errors.send(format!("{kind:?}: {message}"));
    }
}

/// A task running the shell command `command` with `resources` (as the agent's default user).
pub fn task(name: &str, command: &str, resources: &str) -> gantry_sdk::protocol::TaskInfo {
    gantry_sdk::protocol::TaskInfo {
        task_id: gantry_sdk::protocol::TaskId::random(),
        name: name.to_string(),
        command: gantry_sdk::protocol::CommandInfo::shell(command),
        resources: resources.parse().expect("valid resources"),
        env: Default::default(),
        kill_grace_secs: None,
        gpu_selector: None,
        container: None,
    }
}

/// Status updates received by a [`Recorder`], kept so they can be awaited in any order.
pub struct Updates {
    rx: tokio::sync::mpsc::UnboundedReceiver<gantry_sdk::protocol::StatusUpdate>,
    pub seen: Vec<gantry_sdk::protocol::StatusUpdate>,
}

impl Updates {
    pub fn new(
        rx: tokio::sync::mpsc::UnboundedReceiver<gantry_sdk::protocol::StatusUpdate>,
    ) -> Self {
        Self {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits until an update matching `pred` has arrived (or had arrived) and returns it.
    pub async fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&gantry_sdk::protocol::StatusUpdate) -> bool,
    ) -> anyhow::Result<gantry_sdk::protocol::StatusUpdate> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut checked = 0;
        loop {
            if let Some(u) = self.seen[checked..].iter().find(|u| pred(u)) {
                return Ok(u.clone());
            }
            checked = self.seen.len();
            let u = tokio::time::timeout_at(deadline, self.rx.recv())
                .await
                .with_context(|| format!("timed out waiting for {what}; seen: {:#?}", self.seen))?
                .context("scheduler stopped")?;
            self.seen.push(u);
        }
    }

    /// Waits for `task` to reach `state`; fails early if it ends in another terminal state.
    pub async fn wait(
        &mut self,
        task: gantry_sdk::protocol::TaskId,
        state: gantry_sdk::protocol::TaskState,
        timeout: Duration,
    ) -> anyhow::Result<gantry_sdk::protocol::StatusUpdate> {
        let u = self
            .wait_for(&format!("task {task} to be {state}"), timeout, |u| {
                u.task_id == task && (u.state == state || u.state.is_terminal())
            })
            .await?;
        if u.state != state {
            bail!(
                "task {task} ended {} ({}) instead of {state}",
                u.state,
                u.message
            );
        }
        Ok(u)
    }
}

/// Runs the batch framework against several masters (it follows the leader).
pub async fn run_batch_ha(
    masters: Vec<String>,
    tls_dir: &Path,
    name: &str,
    role: &str,
    count: u32,
    task: &str,
    command: &str,
) -> anyhow::Result<gantry_examples::batch::BatchProgress> {
    use gantry_examples::batch::{Batch, BatchSpec};
    let spec = BatchSpec {
        name: name.to_string(),
        command: gantry_sdk::protocol::CommandInfo::shell(command),
        count,
        task: task.parse()?,
        env: Default::default(),
        verbose: false,
        gpu_selector: None,
    };
    let (batch, progress) = Batch::new(spec);
    let config = crate::driver_config(masters, tls_dir.to_path_buf(), name, vec![role.to_string()]);
    gantry_sdk::Driver::new(config).run(batch).await?;
    let p = progress.borrow().clone();
    Ok(p)
}

/// Asserts that a batch framework ran `count` tasks and saw exactly one terminal update,
/// FINISHED, for each (`what` names it in failure messages).
pub fn assert_finished_once(what: &str, p: &gantry_examples::batch::BatchProgress, count: u32) {
    assert_eq!((p.finished, p.failed), (count, 0), "{what}: {:?}", p.errors);
    assert_eq!(p.terminal_updates.len(), count as usize, "{what}");
    for (task, states) in &p.terminal_updates {
        assert_eq!(
            states,
            &vec![gantry_sdk::protocol::TaskState::Finished],
            "{what}: task {task}"
        );
    }
}

/// A raw peer: the endpoint (keep it alive), the connection and its framed stream.
pub type RawPeer = (
    quinn::Endpoint,
    quinn::Connection,
    gantry_sdk::transport::quic::FrameSender,
    gantry_sdk::transport::quic::FrameReceiver,
);

/// A raw QUIC peer of the master at `quic` with `identity`'s certificate (issued from the CA key
/// in `tls_dir`), after the hello and the master's answer that it leads: for attack tests that
/// send what the SDK or the agent never would. Returns the endpoint (keep it alive), the
/// connection and the framed stream.
pub async fn raw_peer(
    quic: SocketAddr,
    tls_dir: &Path,
    identity: gantry_sdk::transport::PeerIdentity,
) -> Result<RawPeer, String> {
    use gantry_sdk::protocol::{MasterRole, PeerKind};
    use gantry_sdk::transport::{quic as q, PeerIdentity};
    let kind = match identity {
        PeerIdentity::Agent(_) => PeerKind::Agent,
        _ => PeerKind::Framework,
    };
    let material = gantry_pki::load_or_issue(tls_dir, &identity, &[]).map_err(|e| e.to_string())?;
    let ep = q::client_endpoint(&material, quic).map_err(|e| e.to_string())?;
    let (conn, tx, rx, role) = q::connect(&ep, quic, kind)
        .await
        .map_err(|e| e.to_string())?;
    if !matches!(role, MasterRole::Leading { .. }) {
        return Err(format!("master does not lead: {role:?}"));
    }
    Ok((ep, conn, tx, rx))
}

impl crate::Cluster {
    /// A [`raw_peer`] of this cluster's master with `identity`'s certificate.
    pub async fn raw_peer(
        &self,
        identity: gantry_sdk::transport::PeerIdentity,
    ) -> Result<RawPeer, String> {
        raw_peer(self.master.quic, &self.tls_dir, identity).await
    }

    /// A [`raw_peer`] framework with principal `principal` (panics if the master refuses it).
    pub async fn raw_framework(&self, principal: &str) -> RawPeer {
        self.raw_peer(gantry_sdk::transport::PeerIdentity::Framework(
            principal.into(),
        ))
        .await
        .expect("raw framework connection")
    }
}

/// `gantry-autoscaler run` on `cluster` as the dev operator `admin`, with the pools of
/// `pools`, its report in `status`, and the local provider starting agents on this host with
/// stand-in GPUs (no host ports each: ranges would overlap; every sandbox kept), their work
/// directories under the cluster's `nodes/`.
pub fn autoscaler_command(
    cluster: &crate::Cluster,
    pools: &Path,
    status: &Path,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(crate::bin("gantry-autoscaler").expect("built"));
    cmd.arg("run")
        .arg("--config")
        .arg(pools)
        .arg("--master")
        .arg(format!("https://{}", cluster.master.http))
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .args(["--operator", "admin", "--status-file"])
        .arg(status)
        .arg("--local-master")
        .arg(cluster.master.quic.to_string())
        .arg("--local-work-dir")
        .arg(cluster.dir.path().join("nodes"))
        .arg("--local-agent-bin")
        .arg(crate::bin("gantry-agent").expect("built"))
        .arg("--local-nvml-lib")
        .arg(crate::standin_lib());
    for a in ["--ports", "none", "--gc-disk-headroom", "0"] {
        cmd.arg(format!("--local-agent-arg={a}"));
    }
    cmd
}
