//! An emulated agent: speaks the agent protocol over its own QUIC connection and mutual TLS
//! (its own certificate), exactly as `gantry-agent` does on the wire, and "runs" every task it
//! is given for a fixed time without a process: STARTING and RUNNING at once, FINISHED after
//! the duration, KILLED when killed. Like the real agent's status update stream, a task's
//! updates are pipelined: each is sent as soon as it is made, in order, without waiting for the
//! acknowledgement of the previous one (at most 4 per task, under the master's bound of 8), and
//! stays queued until the master forwards the framework's acknowledgement of it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use gantry_sdk::protocol::*;
use gantry_sdk::transport::masters::{LeaderSession, Masters, MastersConfig};
use gantry_sdk::transport::FrameReader;
use tokio::time::Instant;

use super::Shared;

/// What one emulated agent advertises.
#[derive(Clone)]
pub struct AgentShape {
    pub resources: Resources,
    pub gpus: usize,
    pub task_time: Duration,
}

/// The hostname of agent `idx` (frameworks map offers back to agents by it).
pub fn hostname(idx: usize) -> String {
    format!("load-{idx}.example")
}

/// The agent index in a [`hostname`].
pub fn index_of(hostname: &str) -> Option<usize> {
    hostname
        .strip_prefix("load-")?
        .strip_suffix(".example")?
        .parse()
        .ok()
}

fn gpus(idx: usize, n: usize) -> Vec<GpuInfo> {
    (0..n)
        .map(|g| GpuInfo {
            uuid: format!("GPU-load-{idx}-{g}"),
            name: "Emulated H100 80GB".into(),
            memory_mib: 81_920,
            compute_capability: (9, 0),
            minor: g as u32,
            pci_bus_id: format!("00000000:{:02X}:00.0", g + 1),
            numa_node: Some((g * 2 / n.max(1)) as u32),
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        })
        .collect()
}

/// Runs agent `idx` until aborted: one session per leading master (re-registering with its
/// id after a lost connection, which the report counts).
pub async fn run(
    idx: usize,
    endpoint: quinn::Endpoint,
    cfg: quinn::ClientConfig,
    masters: Vec<String>,
    shape: AgentShape,
    shared: Arc<Shared>,
) {
    let mut config = MastersConfig::new(masters, PeerKind::Agent, cfg);
    config.endpoint = Some(endpoint);
    let Ok(mut masters) = Masters::start(config) else {
        return;
    };
    let mut agent = Agent {
        idx,
        id: None,
        shape,
        shared,
        finishing: VecDeque::new(),
        running: HashMap::new(),
        held: HashMap::new(),
        streams: HashMap::new(),
    };
    loop {
        let session = masters.next_session().await;
        let conn = session.conn.clone();
        agent.session(session, &mut masters).await;
        conn.close(0u32.into(), b"reconnecting");
        agent.shared.agent_reconnects.fetch_add(1, Relaxed);
    }
}

struct Agent {
    idx: usize,
    id: Option<AgentId>,
    shape: AgentShape,
    shared: Arc<Shared>,
    /// Tasks in the order they finish (every task runs for the same time).
    finishing: VecDeque<(Instant, TaskId)>,
    /// Running tasks and their framework.
    running: HashMap<TaskId, FrameworkId>,
    /// Every task held (running, or ended with updates not yet acknowledged), reported when
    /// re-registering.
    held: HashMap<TaskId, (FrameworkId, TaskInfo, TaskState)>,
    /// Per task, its unacknowledged updates (all in flight), oldest first, with when each was
    /// sent.
    streams: HashMap<TaskId, VecDeque<(StatusUpdate, Instant)>>,
}

impl Agent {
    async fn session(&mut self, session: LeaderSession, masters: &mut Masters) {
        let LeaderSession { mut tx, rx, .. } = session;
        let register = AgentToMaster::Register {
            agent_id: self.id,
            hostname: hostname(self.idx),
            resources: self.shape.resources.clone(),
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: gpus(self.idx, self.shape.gpus),
            running_tasks: self
                .held
                .values()
                .map(|(framework_id, task, state)| RunningTask {
                    framework_id: *framework_id,
                    task: task.clone(),
                    state: *state,
                    gpus: Vec::new(),
                    ports: Vec::new(),
                })
                .collect(),
            pending_updates: Vec::new(),
            task_user: "nobody".into(),
        };
        if tx.send(&register).await.is_err() {
            return;
        }
        // Read in this task (a buffered, cancel-safe reader), as the SDK's driver does.
        let mut rx = FrameReader::from(rx);
        let mut beat = tokio::time::interval(Duration::from_secs(5));
        let mut registered = false;
        loop {
            let next_finish = self.finishing.front().map(|(t, _)| *t);
            let mut out: Vec<AgentToMaster> = Vec::new();
            tokio::select! {
                msg = rx.recv::<MasterToAgent>() => match msg {
                    Err(_) => return,
                    Ok(msg) => {
                        self.handle(msg, &mut registered, &mut beat, &mut out);
                        // What else has arrived, then one write for all the replies (as the
                        // real agent batches its sends).
                        for _ in 0..256 {
                            let Ok(Some(msg)) = rx.try_recv::<MasterToAgent>() else { break };
                            self.handle(msg, &mut registered, &mut beat, &mut out);
                        }
                    }
                },
                _ = beat.tick(), if registered => out.push(AgentToMaster::Heartbeat),
                _ = sleep_until_opt(next_finish) => self.finish_due(&mut out),
                _ = masters.newer_leader() => return,
            }
            if tx.send_all(&out).await.is_err() {
                return;
            }
        }
    }

    fn handle(
        &mut self,
        msg: MasterToAgent,
        registered: &mut bool,
        beat: &mut tokio::time::Interval,
        out: &mut Vec<AgentToMaster>,
    ) {
        match msg {
            MasterToAgent::Registered {
                agent_id,
                heartbeat_interval_ms,
                ..
            } => {
                if self.id.is_none() {
                    self.shared.agents_registered.fetch_add(1, Relaxed);
                }
                self.id = Some(agent_id);
                *registered = true;
                // Updates sent on an earlier connection go again on this one, in order (as the
                // agent's update stream does); the master deduplicates by update id.
                let now = Instant::now();
                for queue in self.streams.values_mut() {
                    for (u, sent) in queue.iter_mut() {
                        *sent = now;
                        let mut u = u.clone();
                        u.agent_id = Some(agent_id);
                        out.push(AgentToMaster::StatusUpdate(u));
                    }
                }
                *beat =
                    tokio::time::interval(Duration::from_millis(heartbeat_interval_ms.max(100)));
                beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                beat.reset();
            }
            MasterToAgent::RunTask {
                framework_id, task, ..
            } => {
                self.shared.run_tasks.fetch_add(1, Relaxed);
                if self.running.contains_key(&task.task_id) {
                    return;
                }
                self.running.insert(task.task_id, framework_id);
                self.held.insert(
                    task.task_id,
                    (framework_id, task.clone(), TaskState::Running),
                );
                self.update(task.task_id, framework_id, TaskState::Starting, None, out);
                self.update(task.task_id, framework_id, TaskState::Running, None, out);
                self.finishing
                    .push_back((Instant::now() + self.shape.task_time, task.task_id));
            }
            MasterToAgent::KillTask { task_id, .. } => {
                if let Some(fw) = self.running.remove(&task_id) {
                    self.shared.kills.fetch_add(1, Relaxed);
                    self.finishing.retain(|(_, t)| *t != task_id);
                    self.update(task_id, fw, TaskState::Killed, None, out);
                }
            }
            MasterToAgent::Acknowledge { task_id, update_id } => {
                let Some(queue) = self.streams.get_mut(&task_id) else {
                    return;
                };
                let Some(pos) = queue.iter().position(|(u, _)| u.update_id == update_id) else {
                    return;
                };
                self.shared.acks.fetch_add(1, Relaxed);
                if let Some((u, sent)) = queue.remove(pos) {
                    if u.state == TaskState::Running {
                        self.shared.running_to_ack.record(sent.elapsed());
                    }
                }
                if queue.is_empty() {
                    self.streams.remove(&task_id);
                    if !self.running.contains_key(&task_id) {
                        self.held.remove(&task_id);
                    }
                }
            }
            MasterToAgent::Error { message } => {
                self.shared.agent_errors.fetch_add(1, Relaxed);
                tracing::warn!(agent = self.idx, "master: {message}");
            }
            // Emulated agents have no GPU health to clear.
            MasterToAgent::ClearGpu { .. } => {}
            // The load frameworks launch no task groups; an emulated agent reports them lost.
            MasterToAgent::RunTaskGroup {
                framework_id,
                members,
                ..
            } => {
                for m in members {
                    self.update(m.task.task_id, framework_id, TaskState::Lost, None, out);
                }
            }
        }
    }

    fn finish_due(&mut self, out: &mut Vec<AgentToMaster>) {
        let now = Instant::now();
        while let Some((t, task_id)) = self.finishing.front().copied() {
            if t > now {
                break;
            }
            self.finishing.pop_front();
            if let Some(fw) = self.running.remove(&task_id) {
                self.update(task_id, fw, TaskState::Finished, Some(0), out);
            }
        }
    }

    /// Queues a status update on the task's stream and sends it now (pipelined).
    fn update(
        &mut self,
        task_id: TaskId,
        framework_id: FrameworkId,
        state: TaskState,
        exit_code: Option<i32>,
        out: &mut Vec<AgentToMaster>,
    ) {
        let timestamp_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let update = StatusUpdate {
            update_id: UpdateId::random(),
            task_id,
            framework_id,
            agent_id: self.id,
            state,
            source: UpdateSource::Agent,
            message: String::new(),
            exit_code,
            signal: None,
            timestamp_ms,
            reconciliation: false,
            ports: Vec::new(),
            reason: None,
            gpus: Vec::new(),
        };
        if let Some(h) = self.held.get_mut(&task_id) {
            h.2 = state;
        }
        self.streams
            .entry(task_id)
            .or_default()
            .push_back((update.clone(), Instant::now()));
        self.sending(&update);
        out.push(AgentToMaster::StatusUpdate(update));
    }

    /// An update is leaving: a terminal one frees the task's resources at the master.
    fn sending(&self, update: &StatusUpdate) {
        if update.state.is_terminal() {
            self.shared.freed(self.idx);
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_map_back_to_agents() {
        assert_eq!(index_of(&hostname(9_999)), Some(9_999));
        assert_eq!(index_of("node-1"), None);
        assert_eq!(index_of("load-x.example"), None);
        let g = gpus(3, 8);
        assert_eq!(g.len(), 8);
        assert_eq!(g.iter().filter(|g| g.numa_node == Some(1)).count(), 4);
    }
}
