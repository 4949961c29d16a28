//! What the master keeps of each agent ([`AgentRec`], with the parts its offers share), each
//! framework ([`FrameworkRec`]) and each live task ([`TaskRec`]).

use super::*;

/// An agent's attributes and healthy GPUs as offers carry them (shared, not copied per offer).
#[derive(Debug, Clone)]
pub(crate) struct OfferParts {
    pub attributes: std::sync::Arc<Attributes>,
    pub gpus: std::sync::Arc<[GpuInfo]>,
}

impl AgentRec {
    /// Moves `resources` from unreserved into `role`'s dynamic reservation (`reserve`), or
    /// back; the one bookkeeping of both the RESERVE operation and the operator's reserve.
    pub(crate) fn apply_reservation(&mut self, role: &str, resources: &Resources, reserve: bool) {
        if reserve {
            self.resources = self.resources.saturating_sub(resources);
            for map in [&mut self.reserved, &mut self.dynamic] {
                map.entry(role.to_string())
                    .or_default()
                    .add_assign(resources);
            }
        } else {
            for map in [&mut self.reserved, &mut self.dynamic] {
                if let Some(r) = map.get_mut(role) {
                    *r = r.saturating_sub(resources);
                    if r.is_empty() {
                        map.remove(role);
                    }
                }
            }
            self.resources.add_assign(resources);
        }
    }

    /// The shared [`OfferParts`], built on first use after a change.
    pub(crate) fn offer_parts(&self) -> &OfferParts {
        self.offer_parts.get_or_init(|| OfferParts {
            attributes: std::sync::Arc::new(self.attributes.clone()),
            gpus: self.gpus.iter().filter(|g| g.healthy).cloned().collect(),
        })
    }
}

#[derive(Debug)]
pub(crate) struct AgentRec {
    pub id: AgentId,
    pub name: String,
    pub hostname: String,
    pub address: String,
    pub conn: Option<ConnId>,
    pub resources: Resources,
    pub reserved: BTreeMap<String, Resources>,
    /// Dynamic reservations (RESERVE operations), included in `reserved` and taken out of
    /// `resources`; persisted in the registry.
    pub dynamic: BTreeMap<String, Resources>,
    pub attributes: Attributes,
    pub gpus: Vec<GpuInfo>,
    /// What every offer of this agent carries besides resources (attributes, healthy GPUs),
    /// built once and shared by its offers; reset whenever `attributes` or `gpus` change.
    pub offer_parts: std::sync::OnceLock<OfferParts>,
    pub gpu_samples: Vec<GpuSample>,
    pub last_seen: Millis,
    pub disconnected_at: Option<Millis>,
    pub tasks: HashSet<TaskId>,
    /// The user its tasks run as when their command names none (reported at registration).
    pub task_user: String,
    /// False while an operator has deactivated it: nothing of it is offered (its tasks run on).
    pub active: bool,
}

#[derive(Debug)]
pub(crate) struct FrameworkRec {
    pub id: FrameworkId,
    pub name: String,
    pub principal: String,
    pub roles: Vec<String>,
    pub capabilities: Vec<Capability>,
    pub failover_timeout_ms: u64,
    pub conn: Option<ConnId>,
    pub disconnected_at: Option<Millis>,
    pub tasks: HashSet<TaskId>,
}

#[derive(Debug)]
pub(crate) struct TaskRec {
    pub info: TaskInfo,
    pub framework: FrameworkId,
    pub agent: AgentId,
    pub state: TaskState,
    /// What the task holds in the allocator (returned when it ends).
    pub allocation: OfferResources,
    /// True once `allocation` went back to the allocator.
    pub recovered: bool,
    /// The agent updates forwarded to the framework and not yet acknowledged by it, oldest
    /// first (agents pipeline a task's updates; at most [`MAX_PENDING_UPDATES`]).
    pub pending: VecDeque<StatusUpdate>,
    /// Updates the framework acknowledged (so agent retransmissions are not redelivered).
    pub acked: HashSet<UpdateId>,
    pub last_message: String,
    pub usage: Option<TaskUsage>,
    /// The role whose resources the task holds.
    pub role: String,
    /// GPUs the agent gave the task (UUIDs).
    pub gpus: Vec<String>,
    /// Host ports the agent gave the task (for its `ports:K`).
    pub ports: Vec<u16>,
    pub reason: Option<TaskReason>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// When the master sent the task to its agent (or adopted it).
    pub staged_at: Millis,
    /// When the task was first reported `RUNNING`.
    pub started_at: Option<Millis>,
    /// When the task first became terminal.
    pub ended_at: Option<Millis>,
    /// Why the master asked its agent to kill it (a framework's [`FrameworkToMaster::KillFor`],
    /// a drain deadline, an operator's teardown): its `KILLED` update is given this reason and
    /// a message saying it (the agent only knows it was asked). Not kept across a failover.
    pub kill_reason: Option<TaskReason>,
}

impl TaskRec {
    /// The operator's record of this task (what `/state` shows and history keeps).
    pub(crate) fn record(&self) -> TaskRecord {
        TaskRecord {
            id: self.info.task_id,
            name: self.info.name.clone(),
            framework: self.framework,
            agent: self.agent,
            role: self.role.clone(),
            user: self.info.command.user.clone(),
            resources: self.info.resources.clone(),
            gpus: self.gpus.clone(),
            ports: self.ports.clone(),
            state: self.state,
            reason: self.reason,
            message: self.last_message.clone(),
            exit_code: self.exit_code,
            signal: self.signal,
            staged_at: self.staged_at,
            started_at: self.started_at,
            ended_at: self.ended_at,
        }
    }

    /// Records what an update says about the task (state changes are the caller's). Messages
    /// are kept up to [`MAX_KEPT_MESSAGE`] bytes (history is long; an agent's text is not
    /// trusted to be short).
    pub(super) fn note(&mut self, state: TaskState, update: &StatusUpdate, now: Millis) {
        self.last_message = kept_message(&update.message);
        if update.reason.is_some() || state.is_terminal() {
            self.reason = update.reason;
        }
        if update.exit_code.is_some() || update.signal.is_some() {
            self.exit_code = update.exit_code;
            self.signal = update.signal;
        }
        if !update.gpus.is_empty() && update.gpus.len() <= 1024 {
            self.gpus = update.gpus.clone();
        }
        if !update.ports.is_empty() {
            self.ports = kept_ports(&self.info, &update.ports);
        }
        if state == TaskState::Running && self.started_at.is_none() {
            self.started_at = Some(now);
        }
        if state.is_terminal() && self.ended_at.is_none() {
            self.ended_at = Some(now);
        }
    }
}

/// The ports an agent reports for a task as kept in records: at most as many as the task asked
/// for (an agent's list is not trusted to be short), else none.
pub(crate) fn kept_ports(info: &TaskInfo, ports: &[u16]) -> Vec<u16> {
    let asked = info.resources.milli("ports") / gantry_proto::resources::MILLI;
    if ports.len() as u64 <= asked {
        ports.to_vec()
    } else {
        Vec::new()
    }
}
