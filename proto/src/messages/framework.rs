//! Framework <-> master: subscription ([`FrameworkInfo`]), accepts, declines, kills,
//! reconciliation and demand ([`FrameworkToMaster`]); offers, status updates, rescinds,
//! errors and drain notices ([`MasterToFramework`]).

use super::*;

/// The most task ids one [`FrameworkToMaster::Reconcile`] may name; the master refuses more
/// with an [`ErrorKind::InvalidRequest`] error (the SDK's driver splits longer lists).
pub const MAX_RECONCILE_IDS: usize = 10_000;

/// The most task shapes one [`FrameworkToMaster::SetDemand`] may declare; the master refuses
/// more with an [`ErrorKind::InvalidRequest`] error.
pub const MAX_DEMAND_SHAPES: usize = 16;

/// The longest [`Demand::gpu_model`] (bytes) the master accepts.
pub const MAX_DEMAND_MODEL_LEN: usize = 128;

/// The shape of a framework's pending tasks (demand-aware offers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    /// The resources of one pending task.
    pub task: Resources,
    /// How many such tasks are pending.
    pub count: u32,
    /// The GPU model the tasks ask for, as their [`crate::GpuSelector::model`] (part of the
    /// GPU's name, case-insensitive: `"A100"`), or `None`: any. The master's
    /// `GET /api/v1/demand` places such tasks only on GPUs of that model, and autoscalers
    /// scale a pool of it. At most [`MAX_DEMAND_MODEL_LEN`] bytes (protocol 11).
    pub gpu_model: Option<String>,
}

impl Demand {
    /// `count` pending tasks of `task`'s resources, any GPU model. Build demands this way (and
    /// [`Demand::with_gpu_model`]) so a field added to the protocol later breaks no framework:
    ///
    /// ```
    /// use gantry_proto::Demand;
    /// let d = Demand::new("cpus:4;mem:16384;gpus:2".parse().unwrap(), 3).with_gpu_model("H100");
    /// assert_eq!((d.count, d.gpu_model.as_deref()), (3, Some("H100")));
    /// ```
    pub fn new(task: Resources, count: u32) -> Demand {
        Demand {
            task,
            count,
            gpu_model: None,
        }
    }

    /// The same demand, for GPUs of `model` only.
    pub fn with_gpu_model(mut self, model: impl Into<String>) -> Demand {
        self.gpu_model = Some(model.into());
        self
    }
}

/// Optional abilities a framework declares when subscribing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Capability {
    /// Wants offers from agents with GPUs.
    GpuResources,
    /// Understands [`TaskState::Unreachable`] and [`TaskState::Gone`] (Mesos
    /// `PARTITION_AWARE`): the tasks of an agent that is out of touch become `UNREACHABLE` and
    /// resume their real state if it comes back in time. Without it they are `LOST` (and
    /// killed if the agent comes back).
    PartitionAware,
    /// Wants to know every agent of the cluster, offered to it or not (protocol v14): after
    /// each subscription the master lists the registered agents in
    /// [`MasterToFramework::Agents`] messages, then sends one for each agent that registers,
    /// re-registers or changes its GPUs' health; [`MasterToFramework::AgentRemoved`] says when
    /// one leaves (reservations changing also resend the agent). Schedulers that judge whether work can ever fit (a job queue refusing a
    /// 16-GPU gang on a cluster of 8-GPU agents) need the whole cluster, not the part the
    /// allocator has offered them.
    AgentInventory,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// Who a framework is, sent in [`FrameworkToMaster::Subscribe`].
pub struct FrameworkInfo {
    /// Set when re-subscribing with the id a master gave earlier.
    pub framework_id: Option<FrameworkId>,
    /// A human-readable name.
    pub name: String,
    /// The roles it receives offers for (allowed by the master's ACLs for its principal).
    pub roles: Vec<String>,
    /// Optional abilities.
    pub capabilities: Vec<Capability>,
    /// How long the master keeps the framework's tasks after it disconnects.
    pub failover_timeout_secs: f64,
    /// Quantities of which an offer must hold at least one (Mesos's
    /// `min_allocatable_resources` offer filter, here for all the framework's roles): a
    /// framework running `gpus:1` tasks lists `cpus:1;mem:1024;gpus:1` and is not offered
    /// what is left of an agent whose GPUs are taken. Empty: any offer.
    #[serde(default)]
    pub min_allocatable: Vec<Resources>,
    /// Roles (of `roles`) in which the framework subscribes suppressed (Mesos's
    /// `Subscribe.suppressed_roles`): a framework with nothing to launch yet is offered nothing
    /// there until it revives. On re-subscription the framework is suppressed in exactly these
    /// and revived in its other roles; the SDK's driver re-subscribes with the roles it last
    /// suppressed.
    #[serde(default)]
    pub suppressed_roles: Vec<String>,
}

/// An operation inside an accept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Operation {
    /// Launch tasks on the offers' agent.
    Launch {
        /// The tasks; their resources come out of the accepted offers.
        tasks: Vec<TaskInfo>,
    },
    /// Dynamically reserve unreserved offered resources for a role.
    Reserve {
        /// The role to reserve for.
        role: String,
        /// What to reserve.
        resources: Resources,
    },
    /// Return reserved resources of a role to the unreserved pool.
    Unreserve {
        /// The role whose reservation shrinks.
        role: String,
        /// What to return.
        resources: Resources,
    },
    /// Launch a [`TaskGroup`] atomically on the offers' agent: every member or none.
    /// (Protocol v8.)
    LaunchGroup {
        /// The group.
        group: TaskGroup,
    },
}

impl Operation {
    /// The tasks the operation launches (none for reservations).
    pub fn tasks(&self) -> &[TaskInfo] {
        match self {
            Operation::Launch { tasks } => tasks,
            Operation::LaunchGroup { group } => &group.tasks,
            Operation::Reserve { .. } | Operation::Unreserve { .. } => &[],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// What a framework sends the master.
pub enum FrameworkToMaster {
    /// First message after the hello.
    Subscribe(FrameworkInfo),
    /// Use offers (all on one agent) for operations; what is left is declined.
    Accept {
        /// The offers, all on one agent.
        offer_ids: Vec<OfferId>,
        /// Applied in order.
        operations: Vec<Operation>,
        /// Filter the unused part of the offers for this long (master default when `None`).
        refuse_seconds: Option<f64>,
    },
    /// Return offers unused.
    Decline {
        /// The offers.
        offer_ids: Vec<OfferId>,
        /// Do not offer these resources again for this long (master default when `None`).
        refuse_seconds: Option<f64>,
    },
    /// Kill a task.
    Kill {
        /// The task.
        task_id: TaskId,
    },
    /// Empty list: all of the framework's tasks (implicit reconciliation).
    Reconcile {
        /// The tasks to report on (at most [`MAX_RECONCILE_IDS`]).
        task_ids: Vec<TaskId>,
    },
    /// Empty list: all of the framework's roles.
    Suppress {
        /// The roles to stop receiving offers for.
        roles: Vec<String>,
    },
    /// Clear filters and resume offers (empty list: all of the framework's roles).
    Revive {
        /// The roles.
        roles: Vec<String>,
    },
    /// A status update was handled: the master stops resending it.
    Acknowledge {
        /// The task the update was about.
        task_id: TaskId,
        /// The update.
        update_id: UpdateId,
    },
    /// Declare the shapes of pending work, each with its count, for demand-aware offers
    /// (empty: clear). At most [`MAX_DEMAND_SHAPES`]. (A list since protocol v8.)
    SetDemand {
        /// The demand, one entry per task shape.
        demands: Vec<Demand>,
    },
    /// The framework is done: kill its tasks and forget it.
    Teardown,
    /// Kill a task and say why: [`TaskReason::Preempted`], [`TaskReason::TimeLimit`] or
    /// [`TaskReason::Deadline`] ([`TaskReason::KilledByRequest`] is a plain
    /// [`FrameworkToMaster::Kill`]). The task's `KILLED` update then carries this reason and a
    /// message saying it, so operators see why (protocol version 8). Other reasons are refused
    /// with [`ErrorKind::InvalidRequest`].
    KillFor {
        /// The task.
        task_id: TaskId,
        /// Why it is killed.
        reason: TaskReason,
    },
    /// Destroy this framework's persistent volume `name` on an agent (protocol v12,
    /// [`super::volume`]): answered by [`MasterToFramework::VolumeDestroyed`]; refused there
    /// while a container on the agent mounts it.
    DestroyVolume {
        /// The agent holding the volume.
        agent_id: AgentId,
        /// The volume's name (as in `Volume::persistent`).
        name: String,
    },
}

/// Resources offered on one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offer {
    /// Identifies the offer in an accept or decline.
    pub id: OfferId,
    /// The framework it is made to.
    pub framework_id: FrameworkId,
    /// The agent the resources are on.
    pub agent_id: AgentId,
    /// The agent's hostname.
    pub hostname: String,
    /// The role the offer is made to.
    pub role: String,
    /// Unreserved resources.
    pub resources: Resources,
    /// Reserved resources, per role.
    pub reserved: BTreeMap<String, Resources>,
    /// The agent's attributes (shared by every offer of the agent: the master builds them
    /// once per agent, not per offer; on the wire this is the plain map).
    #[serde(with = "shared_map")]
    pub attributes: Arc<Attributes>,
    /// The healthy GPUs the offer's `gpus` amount can be drawn from (shared like
    /// `attributes`; on the wire a plain list). Empty when the offer holds no GPUs.
    #[serde(with = "shared_list")]
    pub gpus: Arc<[GpuInfo]>,
    /// What is free of each of those GPUs (fraction and memory), in the order of `gpus`: a
    /// task asking for `gpus:0.25` fits when one of them has at least 250 milli-GPUs free.
    #[serde(default)]
    pub gpu_free: Vec<GpuFree>,
    /// The agent's name (its certificate name, `--name`), as operators see it in `/state` and
    /// `gantryctl agents`; `hostname` is what the host calls itself. (Protocol v7.)
    #[serde(default)]
    pub agent_name: String,
}

/// `Arc<Attributes>` on the wire as the plain map (serde's `rc` feature would do the same, for
/// every crate of the workspace).
pub(crate) mod shared_map {
    use super::{Arc, Attributes};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Arc<Attributes>, s: S) -> Result<S::Ok, S::Error> {
        (**v).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Attributes>, D::Error> {
        Attributes::deserialize(d).map(Arc::new)
    }
}

/// `Arc<[GpuInfo]>` on the wire as the plain list.
pub(crate) mod shared_list {
    use super::{Arc, GpuInfo};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Arc<[GpuInfo]>, s: S) -> Result<S::Ok, S::Error> {
        (**v).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<[GpuInfo]>, D::Error> {
        Vec::<GpuInfo>::deserialize(d).map(Arc::from)
    }
}

impl Offer {
    /// Everything offered: unreserved plus every reservation.
    pub fn total(&self) -> Resources {
        let mut t = self.resources.clone();
        for r in self.reserved.values() {
            t.add_assign(r);
        }
        t
    }
}

/// What kind of mistake a framework made (so schedulers can react by kind, not by text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The offer does not exist (any more): rescinded, declined or already used.
    UnknownOffer,
    /// The agent is not registered.
    UnknownAgent,
    /// The task is not known.
    UnknownTask,
    /// The operations need more than the offers hold.
    InsufficientResources,
    /// A task is malformed (duplicate id, bad resources, ...).
    InvalidTask,
    /// The request is malformed or not allowed (ACLs, bounds).
    InvalidRequest,
    /// The framework must subscribe first.
    NotSubscribed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// What the master sends a framework.
pub enum MasterToFramework {
    /// The subscription was accepted.
    Subscribed {
        /// The id to re-subscribe with after a disconnect.
        framework_id: FrameworkId,
        /// The leading master's term.
        epoch: u64,
        /// How often the master sends [`MasterToFramework::Heartbeat`].
        heartbeat_interval_ms: u64,
    },
    /// New offers.
    Offers(Vec<Offer>),
    /// An offer is withdrawn (its agent left, or it timed out).
    Rescind {
        /// The offer.
        offer_id: OfferId,
    },
    /// A task status update; acknowledge it.
    Update(StatusUpdate),
    /// A request was refused.
    Error {
        /// What kind of refusal.
        kind: ErrorKind,
        /// Details for humans.
        message: String,
    },
    /// Liveness, every `heartbeat_interval_ms`.
    Heartbeat,
    /// An agent this framework has tasks on is being drained for maintenance (Mesos inverse
    /// offers): move the tasks elsewhere before the deadline, when the master kills what is
    /// left (each task with its grace period). Sent again after a re-subscription while the
    /// drain lasts.
    DrainNotice(DrainNotice),
    /// The outcome of a [`FrameworkToMaster::DestroyVolume`] (protocol v12).
    VolumeDestroyed(VolumeDestroyed),
    /// An agent left the cluster for good (protocol v13; Mesos's `FAILURE` event): removed,
    /// or gone after being unreachable. Sent to every subscribed framework, whether or not it
    /// had tasks there, so schedulers forget the agent (its GPUs, its place in their plans);
    /// the framework's tasks there get their own `LOST`/`GONE` updates. Not redelivered to a
    /// framework that was disconnected at the time.
    AgentRemoved(AgentRemoved),
    /// Agents of the cluster, to a framework subscribed with [`Capability::AgentInventory`]
    /// (protocol v14): after each subscription every registered agent (connected or not, in
    /// as many messages as the frame bound needs), then each agent again when it registers,
    /// re-registers, a GPU's health changes or its reservations change. A summary replaces any earlier one of the same
    /// agent. It says what the agent holds in total, not what is free: offers say that.
    Agents(Vec<AgentSummary>),
}

/// One agent of the cluster ([`MasterToFramework::Agents`]): what it registered with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentSummary {
    /// The agent.
    pub agent_id: AgentId,
    /// Its hostname, as in its offers.
    pub hostname: String,
    /// Its name (certificate name), as in [`Offer::agent_name`].
    pub agent_name: String,
    /// Its unreserved resources, in use or not.
    pub resources: Resources,
    /// Its reservations (static and dynamic), per role.
    pub reserved: BTreeMap<String, Resources>,
    /// Its attributes.
    pub attributes: Attributes,
    /// Every GPU it reported, healthy or not (`healthy` says which).
    pub gpus: Vec<GpuInfo>,
}

impl AgentSummary {
    /// What a framework in `role` could ever be offered of this agent: the unreserved
    /// resources plus the role's reservation.
    pub fn for_role(&self, role: &str) -> Resources {
        let mut t = self.resources.clone();
        if let Some(r) = self.reserved.get(role) {
            t.add_assign(r);
        }
        t
    }
}

/// An agent left the cluster ([`MasterToFramework::AgentRemoved`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRemoved {
    /// The agent.
    pub agent_id: AgentId,
    /// Its name (hostname), as in its offers.
    pub hostname: String,
    /// Why (`marked gone by an operator`, `unreachable timeout`, ...).
    pub reason: String,
}

/// Notice that an agent is being drained ([`MasterToFramework::DrainNotice`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainNotice {
    /// The agent being drained.
    pub agent_id: AgentId,
    /// Its hostname.
    pub hostname: String,
    /// Milliseconds from when the notice was sent until the master kills the tasks still
    /// there; `None`: no deadline (the framework moves them at its own pace).
    pub deadline_in_ms: Option<u64>,
    /// The same deadline as Unix milliseconds (the master's clock), for display.
    pub deadline_unix_ms: Option<u64>,
    /// The framework's tasks on the agent (not yet terminal) when the notice was sent.
    pub task_ids: Vec<TaskId>,
    /// Why the agent is drained (`operator`, `spot termination notice`).
    pub reason: String,
}
