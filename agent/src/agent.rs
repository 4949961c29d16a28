//! The agent's event loop: one task owns the agent's state (tasks, the update queue, the
//! checkpoint) and reacts to master messages, task exits and timer ticks. The master session
//! ([`crate::session`]) and the task watchers only send it events.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use gantry_sdk::protocol::*;
use gantry_sdk::transport::{tls, PeerIdentity};
use tokio::sync::mpsc;

use crate::checkpoint::{Checkpoint, TaskRecord};
use crate::executor::{self, ExitStatus, LaunchSpec, Launched};
use crate::session;

/// Everything the agent is configured with.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Master addresses (`host:port`); the agent follows redirects to the leader.
    pub masters: Vec<String>,
    pub work_dir: PathBuf,
    pub tls_dir: PathBuf,
    /// The agent's name: the identity in its certificate.
    pub name: String,
    pub hostname: String,
    /// Unreserved resources advertised.
    pub resources: Resources,
    /// Statically reserved resources per role (on top of `resources`).
    pub reserved: BTreeMap<String, Resources>,
    pub attributes: Attributes,
    /// Default SIGTERM-to-SIGKILL grace period.
    pub kill_grace: Duration,
    /// The binary re-executed as the per-task supervisor (normally the agent itself).
    pub agent_exe: PathBuf,
}

/// Events the core loop reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    Connected(mpsc::UnboundedSender<AgentToMaster>),
    Disconnected,
    Master(MasterToAgent),
    Launched {
        task: TaskId,
        result: Result<Launched, String>,
    },
    Exited {
        task: TaskId,
        status: ExitStatus,
    },
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

struct Agent {
    config: AgentConfig,
    ckpt: Checkpoint,
    master: Option<mpsc::UnboundedSender<AgentToMaster>>,
    registered: bool,
    heartbeat_every: Duration,
    last_heartbeat: tokio::time::Instant,
    events: mpsc::UnboundedSender<Event>,
    start: tokio::time::Instant,
}

/// Runs the agent until `shutdown` resolves. Running tasks are left running: a restarted
/// agent re-adopts them from its checkpoint.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    std::fs::create_dir_all(config.work_dir.join("sandboxes"))
        .with_context(|| format!("creating {}", config.work_dir.display()))?;
    let material = tls::load_or_issue(
        &config.tls_dir,
        &PeerIdentity::Agent(config.name.clone()),
        &[],
    )
    .context("loading the agent's TLS identity")?;
    let ckpt = Checkpoint::load(&config.work_dir)?.unwrap_or_default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut agent = Agent {
        config: config.clone(),
        ckpt,
        master: None,
        registered: false,
        heartbeat_every: Duration::from_secs(1),
        last_heartbeat: tokio::time::Instant::now(),
        events: tx.clone(),
        start: tokio::time::Instant::now(),
    };
    agent.recover();
    let session = tokio::spawn(session::run(config, material, tx.clone()));
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            ev = rx.recv() => match ev {
                Some(ev) => {
                    if let Err(e) = agent.handle(ev) {
                        break Err(e);
                    }
                }
                None => break Ok(()),
            },
            _ = tick.tick() => {
                if let Err(e) = agent.tick() {
                    break Err(e);
                }
            }
        }
    };
    session.abort();
    result
}

impl Agent {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn save(&self) -> anyhow::Result<()> {
        self.ckpt
            .save(&self.config.work_dir)
            .context("writing the checkpoint")
    }

    /// Re-adopts checkpointed tasks after a restart: live supervisors are watched again; tasks
    /// whose supervisor is gone are settled from the exit status they recorded.
    fn recover(&mut self) {
        let ids: Vec<TaskId> = self.ckpt.tasks.keys().copied().collect();
        let mut adopted = 0;
        for id in ids {
            let Some(rec) = self.ckpt.tasks.get(&id) else {
                continue;
            };
            if rec.state.is_terminal() {
                continue;
            }
            match rec.launched {
                Some(l) if executor::supervisor_alive(&l) => {
                    adopted += 1;
                    tracing::info!(task = %id, pid = l.task_pgid, "re-adopted running task");
                }
                Some(_) => {
                    let status = executor::read_exit(&rec.sandbox);
                    let _ = self.events.send(Event::Exited {
                        task: id,
                        status: status.unwrap_or(ExitStatus {
                            code: None,
                            signal: None,
                        }),
                    });
                }
                None => {
                    // Never started: the launch died with the previous agent.
                    self.terminal(
                        id,
                        TaskState::Failed,
                        "agent restarted before the task was launched".into(),
                        None,
                        None,
                    );
                }
            }
        }
        if !self.ckpt.tasks.is_empty() {
            tracing::info!(
                tasks = self.ckpt.tasks.len(),
                adopted,
                "recovered checkpoint"
            );
        }
    }

    fn send(&self, msg: AgentToMaster) {
        if let Some(m) = &self.master {
            let _ = m.send(msg);
        }
    }

    fn handle(&mut self, ev: Event) -> anyhow::Result<()> {
        match ev {
            Event::Connected(tx) => {
                self.master = Some(tx);
                self.registered = false;
                let running_tasks = self
                    .ckpt
                    .tasks
                    .values()
                    .map(|t| RunningTask {
                        framework_id: t.framework_id,
                        task: t.info.clone(),
                        state: t.state,
                    })
                    .collect();
                self.send(AgentToMaster::Register {
                    agent_id: self.ckpt.agent_id,
                    hostname: self.config.hostname.clone(),
                    resources: self.config.resources.clone(),
                    reserved: self.config.reserved.clone(),
                    attributes: self.config.attributes.clone(),
                    gpus: Vec::new(),
                    running_tasks,
                    pending_updates: self.ckpt.updates.all(),
                });
            }
            Event::Disconnected => {
                self.master = None;
                self.registered = false;
            }
            Event::Master(msg) => self.master_message(msg)?,
            Event::Launched { task, result } => {
                let Some(rec) = self.ckpt.tasks.get_mut(&task) else {
                    return Ok(());
                };
                match result {
                    Ok(l) => {
                        rec.launched = Some(l);
                        let kill = rec.kill_requested_ms.is_some();
                        self.update(task, TaskState::Running, "running".into(), None, None);
                        if kill {
                            executor::signal_group(l.task_pgid, libc::SIGTERM);
                        }
                    }
                    Err(e) => self.terminal(
                        task,
                        TaskState::Failed,
                        format!("could not launch: {e}"),
                        None,
                        None,
                    ),
                }
                self.save()?;
            }
            Event::Exited { task, status } => {
                let Some(rec) = self.ckpt.tasks.get(&task) else {
                    return Ok(());
                };
                if rec.state.is_terminal() {
                    return Ok(());
                }
                let killed = rec.kill_requested_ms.is_some();
                let msg = executor::describe(&status);
                let (state, msg) = if killed {
                    (TaskState::Killed, format!("killed: {msg}"))
                } else if status.code == Some(0) {
                    (TaskState::Finished, msg)
                } else {
                    (TaskState::Failed, msg)
                };
                self.terminal(task, state, msg, status.code, status.signal);
                self.save()?;
            }
        }
        Ok(())
    }

    fn master_message(&mut self, msg: MasterToAgent) -> anyhow::Result<()> {
        match msg {
            MasterToAgent::Registered {
                agent_id,
                heartbeat_interval_ms,
                ..
            } => {
                if self.ckpt.agent_id != Some(agent_id) {
                    self.ckpt.agent_id = Some(agent_id);
                    self.save()?;
                }
                self.registered = true;
                self.heartbeat_every =
                    Duration::from_millis(heartbeat_interval_ms.clamp(100, 60_000));
                let now = self.now();
                self.ckpt.updates.mark_all_sent(now);
                tracing::info!(%agent_id, "registered with the master");
            }
            MasterToAgent::RunTask { framework_id, task } => {
                if self.ckpt.tasks.contains_key(&task.task_id) {
                    tracing::warn!(task = %task.task_id, "duplicate launch ignored");
                    return Ok(());
                }
                self.launch(framework_id, task)?;
            }
            MasterToAgent::KillTask {
                framework_id,
                task_id,
            } => self.kill(framework_id, task_id)?,
            MasterToAgent::Acknowledge { task_id, update_id } => {
                if self.ckpt.updates.ack(task_id, update_id) {
                    let done = self
                        .ckpt
                        .tasks
                        .get(&task_id)
                        .is_some_and(|t| t.state.is_terminal())
                        && !self.ckpt.updates.has_pending(task_id);
                    if done {
                        self.ckpt.tasks.remove(&task_id);
                    }
                    self.save()?;
                }
            }
            MasterToAgent::NotLeader { .. } => {} // the session follows the redirect
            MasterToAgent::Error { message } => tracing::error!("master refused us: {message}"),
        }
        Ok(())
    }

    fn launch(&mut self, framework_id: FrameworkId, task: TaskInfo) -> anyhow::Result<()> {
        let id = task.task_id;
        let sandbox = self.config.work_dir.join("sandboxes").join(id.to_string());
        self.ckpt.tasks.insert(
            id,
            TaskRecord {
                framework_id,
                info: task.clone(),
                state: TaskState::Staging,
                sandbox: sandbox.clone(),
                launched: None,
                gpus: Vec::new(),
                kill_requested_ms: None,
                cgroup: None,
            },
        );
        self.update(id, TaskState::Starting, "starting".into(), None, None);
        self.save()?;
        let events = self.events.clone();
        let exe = self.config.agent_exe.clone();
        let mut env = task.env.clone();
        env.insert("GANTRY_TASK_ID".into(), id.to_string());
        env.insert("GANTRY_FRAMEWORK_ID".into(), framework_id.to_string());
        tokio::spawn(async move {
            let spec = LaunchSpec {
                sandbox: &sandbox,
                command: &task.command,
                env: &env,
                cgroup_procs: &[],
                agent_exe: &exe,
            };
            match executor::launch(&spec).await {
                Ok((launched, mut child)) => {
                    let _ = events.send(Event::Launched {
                        task: id,
                        result: Ok(launched),
                    });
                    let _ = child.wait().await;
                    let status = executor::read_exit(&sandbox).unwrap_or(ExitStatus {
                        code: None,
                        signal: None,
                    });
                    let _ = events.send(Event::Exited { task: id, status });
                }
                Err(e) => {
                    let _ = events.send(Event::Launched {
                        task: id,
                        result: Err(e.to_string()),
                    });
                }
            }
        });
        Ok(())
    }

    fn kill(&mut self, framework_id: FrameworkId, task_id: TaskId) -> anyhow::Result<()> {
        let Some(rec) = self.ckpt.tasks.get_mut(&task_id) else {
            // The master believes we run it, but we do not: say it is gone.
            tracing::warn!(task = %task_id, "kill for an unknown task");
            let update = self.make_update(
                task_id,
                framework_id,
                TaskState::Killed,
                "task unknown to the agent".into(),
                None,
                None,
            );
            self.ckpt.updates.push(update);
            self.flush_updates();
            return Ok(());
        };
        if rec.state.is_terminal() || rec.kill_requested_ms.is_some() {
            return Ok(());
        }
        rec.kill_requested_ms = Some(unix_ms());
        if let Some(l) = rec.launched {
            tracing::info!(task = %task_id, pgid = l.task_pgid, "killing task (SIGTERM)");
            executor::signal_group(l.task_pgid, libc::SIGTERM);
        }
        self.save()
    }

    fn tick(&mut self) -> anyhow::Result<()> {
        // Escalate kills past their grace period.
        let now_unix = unix_ms();
        for rec in self.ckpt.tasks.values() {
            let (Some(asked), Some(l)) = (rec.kill_requested_ms, rec.launched) else {
                continue;
            };
            let grace = rec
                .info
                .kill_grace_secs
                .map(|s| Duration::from_secs(s.into()))
                .unwrap_or(self.config.kill_grace);
            if !rec.state.is_terminal() && now_unix.saturating_sub(asked) > grace.as_millis() as u64
            {
                executor::signal_group(l.task_pgid, libc::SIGKILL);
            }
        }
        // Adopted tasks (not our children): poll their supervisors.
        let gone: Vec<(TaskId, PathBuf)> = self
            .ckpt
            .tasks
            .iter()
            .filter(|(_, t)| !t.state.is_terminal())
            .filter_map(|(id, t)| {
                t.launched
                    .filter(|l| !executor::supervisor_alive(l))
                    .map(|_| (*id, t.sandbox.clone()))
            })
            .collect();
        for (id, sandbox) in gone {
            if let Some(status) = executor::read_exit(&sandbox) {
                let _ = self.events.send(Event::Exited { task: id, status });
            } else if self.start.elapsed() > Duration::from_secs(1) {
                // The supervisor died without recording an outcome.
                let _ = self.events.send(Event::Exited {
                    task: id,
                    status: ExitStatus {
                        code: None,
                        signal: None,
                    },
                });
            }
        }
        if self.registered && self.last_heartbeat.elapsed() >= self.heartbeat_every {
            self.last_heartbeat = tokio::time::Instant::now();
            self.send(AgentToMaster::Heartbeat);
        }
        self.flush_updates();
        Ok(())
    }

    fn flush_updates(&mut self) {
        if !self.registered || self.master.is_none() {
            return;
        }
        let now = self.now();
        for u in self.ckpt.updates.due(now) {
            self.send(AgentToMaster::StatusUpdate(u));
        }
    }

    fn make_update(
        &self,
        task: TaskId,
        framework: FrameworkId,
        state: TaskState,
        message: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
    ) -> StatusUpdate {
        StatusUpdate {
            update_id: UpdateId::random(),
            task_id: task,
            framework_id: framework,
            agent_id: self.ckpt.agent_id,
            state,
            source: UpdateSource::Agent,
            message,
            exit_code,
            signal,
            timestamp_ms: unix_ms(),
            reconciliation: false,
        }
    }

    /// Records a state change and queues its update for reliable delivery.
    fn update(
        &mut self,
        task: TaskId,
        state: TaskState,
        message: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
    ) {
        let Some(rec) = self.ckpt.tasks.get(&task) else {
            return;
        };
        let update = self.make_update(task, rec.framework_id, state, message, exit_code, signal);
        if let Some(rec) = self.ckpt.tasks.get_mut(&task) {
            rec.state = state;
        }
        self.ckpt.updates.push(update);
        self.flush_updates();
    }

    fn terminal(
        &mut self,
        task: TaskId,
        state: TaskState,
        message: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
    ) {
        tracing::info!(%task, %state, %message, "task ended");
        self.update(task, state, message, exit_code, signal);
    }
}
