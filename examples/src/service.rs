//! `service`: keeps N instances of a command up (a Marathon-style long-running service).
//!
//! An example meant to be read top to bottom (definition, pure policy, framework glue,
//! status); its unit tests are in `service/tests.rs`.
//!
//! - **Instances and spread**: `instances` copies, each task named `NAME/INDEX`; with `spread`
//!   at most one per agent.
//! - **Health checks**: a TCP connect to the instance's host and port, or a command run by the
//!   framework with `HOST` and `PORT` set, every `interval_secs`; `failures` failures in a
//!   row (after `grace_secs`) kill the instance, which is then restarted.
//! - **Restarts** of instances that end (crash, kill -9, lost agent, failed health check) with
//!   an exponential backoff per instance ([`RestartBackoff`], reset after a minute up).
//! - **Rolling replacement** when the definition file changes: one instance at a time is
//!   killed and relaunched with the new definition, and only while every instance is up, so at
//!   most one is unavailable.
//! - **Ports** from the agents' port ranges: `"ports": K` asks for the resource `ports:K` per
//!   instance; the master accounts ports like any resource (two frameworks never get the same
//!   port of an agent) and the agent picks free ports of its `--ports` range, handed to the
//!   task as `PORT` (the first), `PORT0`.. and `GANTRY_PORTS`. The framework learns an
//!   instance's port from its `RUNNING` update, for the TCP health check and the status view.
//! - **Status**: written as JSON to a status file every half second; `service status` prints it.
//!
//! [`ServiceCore`] is the pure policy (offers, updates, health results and the time in;
//! launches, declines and kills out); [`run`] is the async shell around it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_sdk::backoff::RestartBackoff;
use gantry_sdk::protocol::*;
use gantry_sdk::{DriverHandle, Resources, Scheduler};
use serde::{Deserialize, Serialize};

/// A service definition (the JSON definition file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceDef {
    /// How many instances to keep up.
    pub instances: usize,
    /// The shell command of each instance (`SERVICE_INSTANCE`, `SERVICE_VERSION` are set, and
    /// with `ports` the agent's `PORT`, `PORT0`.. and `GANTRY_PORTS`).
    pub command: String,
    /// CPUs per instance.
    #[serde(default = "default_cpus")]
    pub cpus: f64,
    /// Memory per instance, MiB.
    #[serde(default = "default_mem")]
    pub mem: f64,
    /// At most one instance per agent.
    #[serde(default)]
    pub spread: bool,
    /// Host ports per instance (the resource `ports:K`; 0 for none). The agent assigns them
    /// from its `--ports` range.
    #[serde(default)]
    pub ports: u16,
    /// How instances are checked.
    #[serde(default)]
    pub health: Option<HealthCheck>,
    /// Extra environment of each instance.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

fn default_cpus() -> f64 {
    0.1
}
fn default_mem() -> f64 {
    32.0
}

/// A health check of one instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// Connect to the instance's host and first port (needs `ports` of at least 1).
    #[serde(default)]
    pub tcp: bool,
    /// Or run this shell command (on the framework's host) with `HOST` and `PORT` set; exit 0
    /// is healthy.
    #[serde(default)]
    pub command: Option<String>,
    /// Seconds between checks.
    #[serde(default = "default_interval")]
    pub interval_secs: f64,
    /// Seconds after the instance started before failures count.
    #[serde(default = "default_grace")]
    pub grace_secs: f64,
    /// Failures in a row that kill the instance.
    #[serde(default = "default_failures")]
    pub failures: u32,
}

fn default_interval() -> f64 {
    1.0
}
fn default_grace() -> f64 {
    10.0
}
fn default_failures() -> u32 {
    3
}

impl ServiceDef {
    /// Why the definition cannot run, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if self.command.trim().is_empty() {
            return Some("empty command".into());
        }
        if self.instances > 10_000 {
            return Some("at most 10000 instances".into());
        }
        if let Some(h) = &self.health {
            if h.tcp == h.command.is_some() {
                return Some("a health check is either tcp or a command".into());
            }
            if h.tcp && self.ports == 0 {
                return Some("a tcp health check needs \"ports\": 1 or more".into());
            }
            if !(h.interval_secs.is_finite() && h.interval_secs > 0.0) {
                return Some("health interval must be positive".into());
            }
        }
        if Resources::new().with("cpus", self.cpus).is_empty()
            && Resources::new().with("mem", self.mem).is_empty()
        {
            return Some("an instance needs cpus or mem".into());
        }
        None
    }

    /// The version of what instances run (a change rolls them).
    pub fn version(&self) -> u64 {
        let text = serde_json::json!([self.command, self.cpus, self.mem, self.ports, self.env])
            .to_string();
        // FNV-1a: stable across runs and platforms.
        text.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        })
    }

    fn resources(&self) -> Resources {
        Resources::new()
            .with("cpus", self.cpus)
            .with("mem", self.mem)
            .with("ports", f64::from(self.ports))
    }
}

/// One instance slot.
#[derive(Debug, Clone, Serialize)]
pub struct Slot {
    /// Its index (the task name is `NAME/INDEX`).
    pub index: usize,
    /// The current task, if one is launched.
    pub task: Option<TaskId>,
    /// Where it runs.
    pub agent: Option<AgentId>,
    /// The agent's hostname.
    pub host: String,
    /// Its `PORT` (the first port its agent gave it, from its `RUNNING` update).
    pub port: Option<u16>,
    /// The definition version it runs.
    pub version: u64,
    /// Its latest state.
    pub state: Option<TaskState>,
    /// Passed its latest health check (always true without a check, once running).
    pub healthy: bool,
    /// Health check failures in a row.
    #[serde(skip)]
    health_failures: u32,
    /// Passed a check since it started (the grace period is over then).
    #[serde(skip)]
    passed_once: bool,
    #[serde(skip)]
    running_since: Option<Instant>,
    /// Times it was restarted after ending.
    pub restarts: u32,
    /// We asked the master to kill it (roll or failed health check).
    #[serde(skip)]
    killing: Option<KillWhy>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum KillWhy {
    Roll,
    Health,
    Scale,
}

impl Slot {
    fn new(index: usize) -> Self {
        Self {
            index,
            task: None,
            agent: None,
            host: String::new(),
            port: None,
            version: 0,
            state: None,
            healthy: false,
            health_failures: 0,
            passed_once: false,
            running_since: None,
            restarts: 0,
            killing: None,
        }
    }

    /// Running, healthy and not being replaced.
    pub fn up(&self) -> bool {
        self.task.is_some()
            && self.state == Some(TaskState::Running)
            && self.healthy
            && self.killing.is_none()
    }
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Launch tasks on one offer.
    Launch(OfferId, Vec<TaskInfo>),
    /// Decline offers for a second.
    Decline(Vec<OfferId>),
    /// Kill a task.
    Kill(TaskId),
}

/// The status view (`service status`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// The service (framework) name.
    pub name: String,
    /// The definition version instances should run.
    pub version: u64,
    /// Instances wanted.
    pub instances: usize,
    /// Instances up (running, healthy, not being replaced).
    pub up: usize,
    /// True while instances run an older version.
    pub rolling: bool,
    /// Every slot.
    pub slots: Vec<serde_json::Value>,
}

/// The pure service policy. See the module docs.
pub struct ServiceCore {
    name: String,
    def: ServiceDef,
    version: u64,
    slots: Vec<Slot>,
    backoff: RestartBackoff<usize>,
}

impl ServiceCore {
    /// A service `name` running `def`.
    pub fn new(name: &str, def: ServiceDef) -> Self {
        let version = def.version();
        let slots = (0..def.instances).map(Slot::new).collect();
        Self {
            name: name.to_string(),
            def,
            version,
            slots,
            backoff: RestartBackoff::new(Duration::from_millis(500), Duration::from_secs(30)),
        }
    }

    /// The definition.
    pub fn def(&self) -> &ServiceDef {
        &self.def
    }

    /// Replaces the definition: a new version rolls the instances (see [`ServiceCore::tick`]);
    /// a new instance count scales.
    pub fn set_definition(&mut self, def: ServiceDef) {
        self.version = def.version();
        while self.slots.len() < def.instances {
            self.slots.push(Slot::new(self.slots.len()));
        }
        self.def = def;
    }

    /// The slots.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Handles offers at `now`: launches the instances that need a task and may start.
    pub fn offers(&mut self, offers: Vec<Offer>, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        let mut decline = Vec::new();
        let want = self.def.resources();
        for offer in offers {
            let mut avail = offer.total();
            let mut launch = Vec::new();
            for i in 0..self.slots.len().min(self.def.instances) {
                if self.slots[i].task.is_some() || !self.backoff.ready(&i, now) {
                    continue;
                }
                if self.def.spread
                    && self
                        .slots
                        .iter()
                        .any(|s| s.task.is_some() && s.agent == Some(offer.agent_id))
                {
                    break;
                }
                if !avail.contains(&want) {
                    break;
                }
                let _ = avail.checked_sub_assign(&want);
                let task = self.task(i);
                let s = &mut self.slots[i];
                s.task = Some(task.task_id);
                s.agent = Some(offer.agent_id);
                s.host = offer.hostname.clone();
                s.port = None;
                s.version = self.version;
                s.state = Some(TaskState::Staging);
                s.healthy = false;
                s.health_failures = 0;
                s.passed_once = false;
                s.running_since = None;
                launch.push(task);
            }
            if launch.is_empty() {
                decline.push(offer.id);
            } else {
                out.push(Action::Launch(offer.id, launch));
            }
        }
        if !decline.is_empty() {
            out.push(Action::Decline(decline));
        }
        out
    }

    fn task(&self, index: usize) -> TaskInfo {
        let mut env = self.def.env.clone();
        env.insert("SERVICE_INSTANCE".into(), index.to_string());
        env.insert("SERVICE_VERSION".into(), format!("{:016x}", self.version));
        TaskInfo {
            task_id: TaskId::random(),
            name: format!("{}/{index}", self.name),
            command: CommandInfo::shell(self.def.command.clone()),
            resources: self.def.resources(),
            env,
            kill_grace_secs: Some(2),
            gpu_selector: None,
            container: None,
        }
    }

    /// A status update at `now`.
    pub fn update(&mut self, u: &StatusUpdate, now: Instant) {
        let Some(i) = self.slots.iter().position(|s| s.task == Some(u.task_id)) else {
            return;
        };
        let has_check = self.def.health.is_some();
        let s = &mut self.slots[i];
        s.state = Some(u.state);
        if let Some(p) = u.ports.first() {
            s.port = Some(*p);
        }
        if u.state == TaskState::Running && s.running_since.is_none() {
            s.running_since = Some(now);
            s.healthy = !has_check;
        }
        if !u.state.is_terminal() {
            return;
        }
        let why = s.killing.take();
        let lasted = s.running_since.map(|t| now.saturating_duration_since(t));
        s.task = None;
        s.healthy = false;
        s.running_since = None;
        if why == Some(KillWhy::Roll) {
            return; // replaced at once with the new version
        }
        s.restarts += 1;
        if lasted.is_some_and(|d| d >= Duration::from_secs(60)) {
            self.backoff.succeeded(&i);
        }
        let delay = self.backoff.failed(i, now);
        tracing::warn!(instance = i, state = %u.state, message = %u.message, ?delay, "instance ended; restarting after backoff");
    }

    /// An agent is drained: its instances are replaced like a roll (one at a time, while all
    /// are up), elsewhere since the master no longer offers it.
    pub fn evacuate(&mut self, agent: AgentId) {
        for s in self
            .slots
            .iter_mut()
            .filter(|s| s.agent == Some(agent) && s.task.is_some())
        {
            s.version = 0;
        }
    }

    /// Slots to health-check now: (index, task, host, port).
    pub fn to_check(&self, now: Instant) -> Vec<(usize, TaskId, String, Option<u16>)> {
        if self.def.health.is_none() {
            return Vec::new();
        }
        self.slots
            .iter()
            .filter(|s| s.state == Some(TaskState::Running) && s.killing.is_none())
            .filter(|s| s.running_since.is_some_and(|t| t <= now))
            .filter_map(|s| s.task.map(|t| (s.index, t, s.host.clone(), s.port)))
            .collect()
    }

    /// A health check result of `task` in slot `index` at `now`.
    pub fn health(&mut self, index: usize, task: TaskId, ok: bool, now: Instant) -> Vec<Action> {
        let Some(h) = self.def.health.clone() else {
            return Vec::new();
        };
        let Some(s) = self.slots.get_mut(index).filter(|s| s.task == Some(task)) else {
            return Vec::new();
        };
        if ok {
            s.healthy = true;
            s.passed_once = true;
            s.health_failures = 0;
            return Vec::new();
        }
        let in_grace = s.running_since.is_some_and(|t| {
            now.saturating_duration_since(t) < Duration::from_secs_f64(h.grace_secs)
        });
        if in_grace && !s.passed_once {
            return Vec::new();
        }
        s.healthy = false;
        s.health_failures += 1;
        if s.health_failures >= h.failures && s.killing.is_none() {
            tracing::warn!(
                instance = index,
                "instance failed its health check; killing it"
            );
            s.killing = Some(KillWhy::Health);
            return vec![Action::Kill(task)];
        }
        Vec::new()
    }

    /// Periodic decisions: scale down, and roll one instance to the current version when
    /// every instance is up (so at most one is ever unavailable for the roll).
    pub fn tick(&mut self, _now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        // Scale down: instances past the count are killed, then forgotten.
        let n = self.def.instances;
        for s in self.slots.iter_mut().skip(n) {
            if let (Some(t), None) = (s.task, s.killing) {
                s.killing = Some(KillWhy::Scale);
                out.push(Action::Kill(t));
            }
        }
        while self.slots.len() > n && self.slots.last().is_some_and(|s| s.task.is_none()) {
            self.slots.pop();
        }
        let active = &self.slots[..n.min(self.slots.len())];
        let all_up = active.len() == n && active.iter().all(Slot::up);
        if all_up {
            if let Some(s) = self.slots[..n]
                .iter_mut()
                .find(|s| s.version != self.version)
            {
                if let Some(t) = s.task {
                    tracing::info!(instance = s.index, "rolling instance to the new definition");
                    s.killing = Some(KillWhy::Roll);
                    out.push(Action::Kill(t));
                }
            }
        }
        out
    }

    /// True when some instance waits for an offer.
    pub fn wants_offers(&self) -> bool {
        self.slots
            .iter()
            .take(self.def.instances)
            .any(|s| s.task.is_none())
    }

    /// The status view.
    pub fn status(&self) -> Status {
        let n = self.def.instances;
        Status {
            name: self.name.clone(),
            version: self.version,
            instances: n,
            up: self.slots.iter().take(n).filter(|s| s.up()).count(),
            rolling: self
                .slots
                .iter()
                .take(n)
                .any(|s| s.task.is_some() && s.version != self.version),
            slots: self
                .slots
                .iter()
                .map(|s| {
                    let mut v = serde_json::to_value(s).unwrap_or_default();
                    v["up"] = serde_json::Value::Bool(s.up());
                    v
                })
                .collect(),
        }
    }
}

/// Reads a definition file (JSON).
pub fn load_definition(path: &Path) -> anyhow::Result<ServiceDef> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let def: ServiceDef =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if let Some(p) = def.problem() {
        anyhow::bail!("{}: {p}", path.display());
    }
    Ok(def)
}

struct Shared {
    core: Mutex<ServiceCore>,
}

struct ServiceScheduler {
    shared: Arc<Shared>,
}

fn perform(driver: &DriverHandle, actions: Vec<Action>) {
    for a in actions {
        match a {
            Action::Launch(o, tasks) => driver.launch(o, tasks),
            Action::Decline(ids) => driver.decline(ids, Some(1.0)),
            Action::Kill(t) => driver.kill(t),
        }
    }
}

impl Scheduler for ServiceScheduler {
    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        let actions = match self.shared.core.lock() {
            Ok(mut c) => c.offers(offers, Instant::now()),
            Err(_) => return,
        };
        perform(driver, actions);
    }

    async fn status_update(&mut self, _driver: &DriverHandle, update: &StatusUpdate) {
        if let Ok(mut c) = self.shared.core.lock() {
            c.update(update, Instant::now());
        }
    }

    async fn drain_notice(&mut self, _driver: &DriverHandle, notice: &DrainNotice) {
        tracing::warn!(agent = %notice.agent_id, deadline_in_ms = ?notice.deadline_in_ms,
            "agent draining; moving its instances elsewhere one at a time");
        if let Ok(mut c) = self.shared.core.lock() {
            c.evacuate(notice.agent_id);
        }
    }
}

async fn check(h: &HealthCheck, host: &str, port: Option<u16>) -> bool {
    let timeout = Duration::from_secs_f64(h.interval_secs.clamp(0.2, 10.0));
    if h.tcp {
        let Some(port) = port else { return false };
        return matches!(
            tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await,
            Ok(Ok(_))
        );
    }
    let Some(cmd) = &h.command else { return false };
    let mut c = tokio::process::Command::new("/bin/sh");
    c.arg("-c").arg(cmd).env("HOST", host).kill_on_drop(true);
    if let Some(p) = port {
        c.env("PORT", p.to_string());
    }
    c.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    matches!(
        tokio::time::timeout(timeout, c.status()).await,
        Ok(Ok(s)) if s.success()
    )
}

fn write_status(path: &Path, status: &Status) {
    let tmp = path.with_extension("tmp");
    if let Ok(body) = serde_json::to_vec_pretty(status) {
        if std::fs::write(&tmp, body).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}

/// Runs service `name` from the definition file until `driver` stops: reloads the file every
/// half second (a change rolls the instances), health-checks, restarts, and writes the status
/// to `status_file`.
pub async fn run(
    config: gantry_sdk::DriverConfig,
    definition: PathBuf,
    status_file: PathBuf,
) -> anyhow::Result<()> {
    let def = load_definition(&definition)?;
    let name = config.info.name.clone();
    let shared = Arc::new(Shared {
        core: Mutex::new(ServiceCore::new(&name, def)),
    });
    let driver = gantry_sdk::Driver::new(config);
    let handle = driver.handle();
    let sup = {
        let shared = shared.clone();
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut last_text = std::fs::read_to_string(&definition).unwrap_or_default();
            let mut last_check = Instant::now() - Duration::from_secs(3600);
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let now = Instant::now();
                if let Ok(text) = std::fs::read_to_string(&definition) {
                    if text != last_text {
                        last_text = text;
                        match load_definition(&definition) {
                            Ok(def) => {
                                tracing::info!("definition changed; rolling");
                                if let Ok(mut c) = shared.core.lock() {
                                    c.set_definition(def);
                                }
                                handle.revive(Vec::new());
                            }
                            Err(e) => tracing::warn!("definition not applied: {e:#}"),
                        }
                    }
                }
                let (health, checks) = match shared.core.lock() {
                    Ok(c) => (c.def().health.clone(), c.to_check(now)),
                    Err(_) => return,
                };
                if let Some(h) = health.filter(|h| {
                    now.saturating_duration_since(last_check)
                        >= Duration::from_secs_f64(h.interval_secs)
                }) {
                    last_check = now;
                    let results = futures_join(checks.iter().map(|(_, _, host, port)| {
                        let h = h.clone();
                        let host = host.clone();
                        let port = *port;
                        async move { check(&h, &host, port).await }
                    }))
                    .await;
                    let actions: Vec<Action> = match shared.core.lock() {
                        Ok(mut c) => checks
                            .iter()
                            .zip(results)
                            .flat_map(|((i, t, _, _), ok)| c.health(*i, *t, ok, Instant::now()))
                            .collect(),
                        Err(_) => return,
                    };
                    perform(&handle, actions);
                }
                let (actions, status) = match shared.core.lock() {
                    Ok(mut c) => (c.tick(now), c.status()),
                    Err(_) => return,
                };
                perform(&handle, actions);
                write_status(&status_file, &status);
            }
        })
    };
    let result = driver.run(ServiceScheduler { shared }).await;
    sup.abort();
    result?;
    Ok(())
}

/// Runs futures concurrently and collects their outputs in order.
async fn futures_join<F: std::future::Future<Output = bool> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<bool> {
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap_or(false));
    }
    out
}

#[cfg(test)]
mod tests;
