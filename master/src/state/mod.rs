//! The master's state machine: agents, frameworks, tasks and offers. (About 980 lines:
//! the `Master` record types and the one `handle` dispatch; every concern already has its own
//! submodule: accept, agents, frameworks, gpus, maintenance, operator, timers, view, ...)
//!
//! PURE-ish: [`Master::handle`] takes an [`Input`] (a peer connected, sent a message,
//! disconnected, or a timer tick) and the current time, and returns the [`Output`]s to send. It
//! never touches a socket, a file or the clock, so it is tested without any I/O and the same
//! code runs in the live master. Offers and fairness are delegated to the pure
//! [`Allocator`].
//!
//! Driving contract (quinn-proto's `poll_timeout` style): the shell feeds every event to
//! [`Master::handle`], runs [`Master::allocate`] whenever [`Master::allocation_due`], sends
//! [`Input::Tick`] once [`Master::next_deadline`] has come, and otherwise sleeps until the
//! next deadline or input. The leadership lease is an input too ([`Input::LeaseUntil`]): past
//! it the core neither offers nor launches. So is how long a cycle took ([`Input::CycleTook`],
//! measured by the shell): the core reads no clock.
//!
//! Rules it enforces (Mesos semantics unless noted):
//! - An agent's name and a framework's principal come from the peer's certificate (given in
//!   the `*Connected` inputs), never from messages.
//! - Identity (docs/security.md): framework and agent ids are unguessable (uuid v4) and never
//!   handed out twice. A framework id is resumed only by its own principal and only while this
//!   master (or its registry) knows it. An agent is its name plus its checkpointed id: the same
//!   pair re-registering replaces the old connection; an id claimed under another name is
//!   refused; a second agent under a name in use is refused (`MasterToAgent::Error`, the agent
//!   stops) until the old one has been gone for the re-register timeout; an unknown id joins as
//!   a new agent whose reported tasks are killed.
//! - Authorization and limits: every role of a subscription must be granted to the principal
//!   by the ACLs ([`Acls::may_register`]) and pass [`Limits`] (roles per framework, name length
//!   and depth, frameworks per principal). Roles nothing uses any more are forgotten. These
//!   decisions are [`crate::security`]'s (ACLs, limits, name validation, the run-as policy):
//!   the core asks it and turns its answers into rejections; security knows nothing of the
//!   core.
//! - Offers are single-use; an accept must name known, outstanding offers of the caller on one
//!   agent, and every task must fit the offers. A bad offer rejects the whole accept (the valid
//!   offers return to the pool); a bad task ends `ERROR` while the others launch.
//! - Status updates from agents are forwarded to the framework and acknowledged back to the
//!   agent only after the framework acknowledges them; an update the framework already
//!   acknowledged is acknowledged again without redelivery.
//! - A disconnected agent keeps its tasks for `agent_reregister_timeout_ms`; then it is lost and
//!   its tasks are `LOST`. A disconnected framework keeps its tasks for its failover timeout;
//!   then its tasks are killed and it is removed.
//! - A task runs as its command's user or, when it names none, as its agent's default (reported
//!   at registration and filled in here); the framework's principal must be allowed that user
//!   by the `run_tasks` ACL, or the task ends `ERROR` (`security::run_as`).
//! - Completed tasks are kept as `TaskRecord`s per framework (bounded by
//!   `max_completed_tasks_per_framework`), and removed frameworks with their records (bounded
//!   by `max_completed_frameworks`); the oldest go first.
//! - Bounded peers: a registration past [`register_limits`] is refused; offers to a framework
//!   are split into as many messages as the frame limit needs; a reconcile names at most
//!   [`MAX_RECONCILE_IDS`] ids and is answered in slices of [`RECONCILE_SLICE`] by
//!   [`Master::work_backlog`] (only as fast as the framework reads: the shell says how much room
//!   its outbox has), so one framework never holds the core for long; a peer the
//!   shell gave up on ([`Input::PeerStalled`]) is disconnected at once (offers rescinded,
//!   failover / re-register timeout running).
//!
//! Module map (one `Master`, its handlers split by concern; each `impl Master` block lives
//! with its operation):
//! - this file: the types (`Master`, `Input`, `Output`, config, task records), ids and
//!   dispatch ([`Master::handle`]);
//! - `records`: what is kept of each agent, framework and live task;
//! - `allocation`: the allocation cycle ([`Master::allocate`]: when it is due, offers out);
//! - `agents`: registration, re-registration, agent updates, GPU health, disconnection and
//!   removal;
//! - `agent_tasks`: the tasks a re-registering agent reports, adopted or killed;
//! - `partitions`: agents out of touch (unreachable, back in time, gone) and their tasks;
//! - `frameworks`: subscription, failover, disconnection and removal;
//! - `inventory`: every agent told to the frameworks that ask for it (protocol v14);
//! - `accept`: accepting offers (validation, carving resources out of offers, reservations);
//! - `gpus`: GPU sharing: per-GPU shares held by tasks, free fractions in offers, the
//!   fragmentation-aware choice of the GPU for a fractional task;
//! - `tasks`: task lifecycle (releasing resources, completed history, master-made updates);
//! - `reconcile`: framework reconciliation answered in bounded slices;
//! - `timers`: re-register, failover and offer timeouts, the leadership lease, and
//!   [`Master::next_deadline`] (when the shell must wake the core next);
//! - `operator`: operator commands (weights, quotas, reservations, agent activation and
//!   removal, framework teardown, GPU clears);
//! - `maintenance`: draining agents (notices, kills at the deadline, `DRAINED`), undrain,
//!   mark-gone, spot-termination notices;
//! - `events`: the changes recorded for the operator event stream;
//! - `rejection`: the typed reasons the core refuses roles, subscriptions, tasks, reservations
//!   and operator commands (their text is what peers and operators read; those about role
//!   names and task users are `security`'s, re-used here);
//! - `recovery`: restoring the registry after a failover;
//! - `view`: the read-only `/state` view;
//! - `metrics`: the numbers behind `/metrics` (counts, resources, shares, resource-seconds).

mod accept;
mod agent_tasks;
mod agents;
mod allocation;
mod events;
mod frameworks;
pub mod gpus;
mod inventory;
mod maintenance;
pub mod metrics;
mod operator;
mod pacing;
mod partitions;
mod reconcile;
mod records;
mod recovery;
mod rejection;
mod tasks;
mod timers;
pub mod view;

use accept::refuse_ms;
pub use accept::{BadRefuseSeconds, FOREVER_MS};
pub use events::{ClusterEvent, MAX_PENDING_EVENTS};
pub use maintenance::{
    GoneStatus, MaintenanceCommand, MaintenanceError, MaintenanceStatus, MaintenanceView,
    DRAIN_KILL_RETRY_MS, MAX_DRAIN_DEADLINE_SECS,
};
pub use operator::{
    OperatorCommand, QuotaPart, MAX_QUOTA_KINDS, MAX_QUOTA_MILLI, MAX_WEIGHT, MIN_WEIGHT,
    STANDARD_RESOURCE_KINDS,
};
pub use pacing::{paced, HELD_MESSAGES, UPDATE_SLICE};
use reconcile::Reconciling;
pub use reconcile::{MAX_PENDING_RECONCILE_IDS, RECONCILE_SLICE};
pub(crate) use records::{kept_ports, AgentRec, FrameworkRec, TaskRec};
use recovery::{with_dynamic, RecoveredAgent, Unreachable};
pub use rejection::{
    OperatorRejection, ReservationRejection, RoleRejection, SubscribeRejection, TaskRejection,
    MAX_MIN_ALLOCATABLE,
};

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use gantry_proto::codec;
use gantry_proto::*;

// Who may do what and how much: the security module decides, the core asks (and re-exports
// the types its config and rejections carry under their old paths).
use crate::allocator::{Allocator, AllocatorConfig, Millis, OfferRecord, OfferResources};
use crate::registry::{
    AgentRecord, FrameworkRecord, GoneRecord, Mutation, Quota, Registry, Reservation,
};
use crate::security::{run_as, Acls};
pub use crate::security::{valid_role, Limits};

/// Identifies one live peer connection in the I/O shell.
pub type ConnId = u64;

/// Tunables of the state machine.
#[derive(Debug, Clone)]
pub struct MasterConfig {
    pub allocator: AllocatorConfig,
    /// Leadership epoch sent to peers.
    pub epoch: u64,
    pub heartbeat_interval_ms: u64,
    /// An agent silent this long (no heartbeat) is disconnected.
    pub agent_ping_timeout_ms: u64,
    /// A disconnected agent not back within this long is unreachable: its tasks are
    /// `UNREACHABLE` for partition-aware frameworks and `LOST` for the others, and its resources
    /// leave the pool.
    pub agent_reregister_timeout_ms: u64,
    /// An unreachable agent may come back with its id and its tasks for this long (Mesos
    /// `--registry_max_agent_age`); past it its tasks are `GONE` and it is forgotten.
    pub agent_unreachable_timeout_ms: u64,
    /// Batch allocation interval.
    pub allocation_interval_ms: u64,
    /// Allocation cycles triggered by events are at least this far apart (more after a long
    /// cycle: [`Master::allocation_gap_ms`]): a herd of re-registering agents then costs a few
    /// cycles over all agents, not one per message batch.
    pub allocation_min_gap_ms: u64,
    /// Completed tasks kept per framework for `/state` and reconciliation (oldest dropped
    /// first; Mesos `--max_completed_tasks_per_framework`).
    pub max_completed_tasks_per_framework: usize,
    /// Removed frameworks kept, with their completed tasks, for `/state` (oldest dropped first;
    /// Mesos `--max_completed_frameworks`).
    pub max_completed_frameworks: usize,
    /// Who may subscribe with which roles, run tasks as which users, and operate
    /// ([`Acls::allow_all`] in dev mode).
    pub acls: Acls,
    /// Once a frame's length has arrived, its body must arrive within this long, or the shell
    /// closes the peer (`--frame-body-timeout`).
    pub frame_body_timeout_ms: u64,
    /// Bytes of large frame bodies (over 64 KiB) all peers together may be sending at once;
    /// past it readers wait (`--frame-budget-mib`).
    pub frame_budget_bytes: usize,
    /// Messages the shell queues for one peer (its outbox). Past three quarters a framework's
    /// status updates are held in the core, past half it gets no offers (`pacing`); an agent
    /// that lets it fill is closed.
    pub peer_outbox: usize,
    /// A peer with messages waiting whose stream takes none of them for this long (it does
    /// not read, so QUIC flow control blocks every write) is closed by the shell and handled
    /// as [`Input::PeerStalled`] (`--peer-write-timeout`; `None`: never).
    pub peer_write_timeout_ms: Option<u64>,
    /// What one principal may hold (docs/security.md).
    pub limits: Limits,
    /// How the GPU for a fractional task is chosen within its agent (`--gpu-placement`).
    pub gpu_placement: gantry_placement::Policy,
    /// Resource kinds quotas and reservations may name besides the standard ones and those
    /// agents have (`--resource-kinds`; see [`Master::known_resource_kinds`]).
    pub resource_kinds: Vec<String>,
    /// Events the persistent history keeps at most (`--history-events`; 0: none), see
    /// `crate::server::history`.
    pub history_events: usize,
}

/// At most `max` bytes of `s` (on a char boundary), for error messages about peer input.
fn truncated(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Default for MasterConfig {
    fn default() -> Self {
        Self {
            allocator: AllocatorConfig::default(),
            epoch: 1,
            heartbeat_interval_ms: 5000,
            agent_ping_timeout_ms: 15_000,
            agent_reregister_timeout_ms: 10_000,
            agent_unreachable_timeout_ms: 15 * 60_000,
            allocation_interval_ms: 1000,
            allocation_min_gap_ms: 5,
            max_completed_tasks_per_framework: 1000,
            max_completed_frameworks: 50,
            acls: Acls::allow_all(),
            frame_body_timeout_ms: 10_000,
            frame_budget_bytes: 128 << 20,
            peer_outbox: 16_384,
            peer_write_timeout_ms: Some(30_000),
            limits: Limits::default(),
            gpu_placement: gantry_placement::Policy::FgdPack,
            resource_kinds: Vec::new(),
            history_events: 16_384,
        }
    }
}

/// Something that happened, fed to [`Master::handle`].
#[derive(Debug)]
pub enum Input {
    AgentConnected {
        conn: ConnId,
        name: String,
        address: String,
    },
    Agent {
        conn: ConnId,
        msg: AgentToMaster,
    },
    AgentDisconnected {
        conn: ConnId,
    },
    FrameworkConnected {
        conn: ConnId,
        principal: String,
    },
    Framework {
        conn: ConnId,
        msg: FrameworkToMaster,
    },
    FrameworkDisconnected {
        conn: ConnId,
    },
    /// The shell closed this peer's connection because it did not read its messages (its
    /// outbox overflowed, or its stream took nothing for `peer_write_timeout_ms` while messages
    /// waited): handled as a disconnect, now (offers rescinded, the framework's
    /// failover timeout or the agent's re-register timeout starts).
    PeerStalled {
        conn: ConnId,
    },
    /// The shell could not queue these agents' status updates (task, update) to this
    /// framework connection, its outbox (nearly) full: the core holds them and sends them as
    /// the outbox drains ([`Master::work_backlog`]) instead of closing a framework that is
    /// only slow.
    UpdatesHeld {
        conn: ConnId,
        updates: Vec<(TaskId, UpdateId)>,
    },
    /// The shell could not queue these messages to this framework connection, its outbox
    /// full: the offers go back to the pool (the framework never saw them); the rest
    /// (rescinds, the master's own updates, errors, notices) are held in order and sent as
    /// the outbox drains, up to [`pacing::HELD_MESSAGES`] (a framework past that is not
    /// reading at all and is closed).
    Undelivered {
        conn: ConnId,
        offers: Vec<OfferId>,
        messages: Vec<MasterToFramework>,
    },
    /// Timers: heartbeat checks, offer expiry, failover timeouts, batch allocation. The shell
    /// sends it at [`Master::next_deadline`] (sending it earlier or more often is harmless).
    Tick,
    /// The leadership lease: this master may act as leader until `until` (the core's clock;
    /// `None`: no lease, e.g. standalone). From the deadline on the core makes no offers and
    /// launches no tasks, even before the election reports the loss.
    LeaseUntil {
        until: Option<Millis>,
    },
    /// How long the last allocation cycle took, in microseconds, as the shell measured it
    /// (the core never reads a clock): event-triggered cycles are spaced by
    /// [`Master::allocation_gap_ms`] accordingly.
    CycleTook {
        micros: u64,
    },
}

/// Something to do, returned by [`Master::handle`].
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    ToAgent(ConnId, MasterToAgent),
    ToFramework(ConnId, MasterToFramework),
    /// Close a connection, logging why.
    Close {
        conn: ConnId,
        reason: String,
    },
    /// Record a change in the persistent registry (in order).
    Persist(Mutation),
    /// Ask the agent `agent` (connection name) about persistent volumes on a stream of its
    /// own (protocol v12) and answer the framework on `reply` with
    /// [`MasterToFramework::VolumeDestroyed`] (the shell's `server::volumes`).
    Volume {
        /// The framework's connection.
        reply: ConnId,
        /// The agent's name (its connection's key).
        agent: String,
        /// The agent's id, echoed in the answer.
        agent_id: AgentId,
        /// What to ask.
        request: VolumeRequest,
    },
}

#[derive(Debug, Clone)]
enum Peer {
    Agent {
        name: String,
        address: String,
        agent: Option<AgentId>,
    },
    Framework {
        principal: String,
        framework: Option<FrameworkId>,
    },
}

/// What a registering agent's claimed id turned out to be.
#[derive(Debug, Clone, Copy)]
enum Claim {
    /// The id of a known agent with the same name: a restart or reconnection.
    Live(AgentId),
    /// The id of an agent with the same name recovered from the registry after a failover.
    Recovered(AgentId),
    /// No id, or one nobody vouches for: a new agent with a fresh id.
    New,
}

/// Event-triggered allocation cycles are at least this many times the last cycle's duration
/// apart ([`Master::allocation_gap_ms`]).
pub const CYCLE_GAP_FACTOR: u64 = 4;

/// Unacknowledged status updates kept per task: agents pipeline a task's updates (the agent's
/// window is the same number); an agent sending more is closed.
pub const MAX_PENDING_UPDATES: usize = 8;

/// Longest task message kept in records, bytes.
pub const MAX_KEPT_MESSAGE: usize = 1024;

/// A task message as kept in records: at most [`MAX_KEPT_MESSAGE`] bytes, `…` when cut.
fn kept_message(text: &str) -> String {
    if text.len() <= MAX_KEPT_MESSAGE {
        return text.to_string();
    }
    format!("{}…", truncated(text, MAX_KEPT_MESSAGE - '…'.len_utf8()))
}

/// The agent of a task record that never reached an agent (dropped with offers naming none
/// the master knows): shown as an empty `agent_id`.
pub(crate) const NO_AGENT: AgentId = AgentId(uuid::Uuid::nil());

/// A task as an operator sees it: kept while it runs and, once completed, in its framework's
/// bounded history (times are the master's clock; `/state` shows them as Unix milliseconds).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TaskRecord {
    pub id: TaskId,
    pub name: String,
    pub framework: FrameworkId,
    pub agent: AgentId,
    pub role: String,
    pub user: Option<String>,
    pub resources: Resources,
    pub gpus: Vec<String>,
    pub ports: Vec<u16>,
    pub state: TaskState,
    pub reason: Option<TaskReason>,
    pub message: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub staged_at: Millis,
    pub started_at: Option<Millis>,
    pub ended_at: Option<Millis>,
}

/// A framework that was removed (teardown or failover timeout), kept for `/state` with its
/// completed tasks until `max_completed_frameworks` newer ones push it out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CompletedFramework {
    pub id: FrameworkId,
    pub name: String,
    pub principal: String,
    pub roles: Vec<String>,
    pub removed_at: Millis,
    pub reason: String,
}

/// The master's state machine. See the module docs.
pub struct Master {
    pub(crate) config: MasterConfig,
    pub(crate) allocator: Allocator,
    conns: HashMap<ConnId, Peer>,
    pub(crate) agents: HashMap<AgentId, AgentRec>,
    agents_by_name: HashMap<String, AgentId>,
    pub(crate) frameworks: HashMap<FrameworkId, FrameworkRec>,
    pub(crate) tasks: HashMap<TaskId, TaskRec>,
    /// Completed tasks per framework (active or completed), oldest first, each list bounded
    /// by `max_completed_tasks_per_framework`.
    pub(crate) completed: HashMap<FrameworkId, VecDeque<TaskRecord>>,
    /// Removed frameworks, oldest first, bounded by `max_completed_frameworks`.
    pub(crate) completed_frameworks: VecDeque<CompletedFramework>,
    /// Agents known from the registry (after a failover) that have not re-registered yet,
    /// with their dynamic reservations and the time they must be back by.
    recovered_agents: HashMap<AgentId, RecoveredAgent>,
    /// Names of `recovered_agents` (a name stays taken until its agent is back or given up).
    recovered_by_name: HashMap<String, AgentId>,
    allocation_pending: bool,
    last_batch: Millis,
    /// Status update ids: unique per master incarnation (the shell seeds this with randomness;
    /// tests with a constant). They need not be secret.
    id_seed: u128,
    id_counter: u128,
    /// Framework and agent ids: unguessable (a uuid v4 from the OS CSPRNG); tests may replace
    /// it ([`Master::set_id_source`]). Every id drawn is checked to be free.
    id_source: fn() -> u128,
    /// Microseconds the last allocation cycle took ([`Input::CycleTook`]).
    last_cycle_us: u64,
    /// How many records of `completed` each task id has (reconcile looks ids up there).
    completed_count: HashMap<TaskId, u32>,
    /// Reconciliations being answered slice by slice, round robin.
    reconciles: VecDeque<Reconciling>,
    /// Changes for the operator event stream, until the shell takes them.
    events: events::EventQueue,
    /// Until when this master may act as leader ([`Input::LeaseUntil`]; `None`: always).
    lease_until: Option<Millis>,
    /// Agents under maintenance (draining or drained).
    drains: BTreeMap<AgentId, maintenance::Drain>,
    /// Agents marked gone: they may not re-register with their ids.
    gone: BTreeMap<AgentId, GoneRecord>,
    /// Unix milliseconds minus master milliseconds (set by [`Master::restore_maintenance`]).
    unix_offset_ms: i64,
    /// Status updates an agent sent again that the master already had (`/metrics`).
    pub(crate) status_update_retries: u64,
    /// Tasks completed (ended and acknowledged) since this master leads, by final state.
    pub(crate) tasks_completed: BTreeMap<&'static str, u64>,
    /// A lower bound on the earliest agent timer (a silent agent, a disconnected agent past its
    /// re-register timeout, a recovered agent that did not come back), `Millis::MAX` for none;
    /// `None`: not known, computed on the next ask. See [`Master::agent_timer_floor`]: it saves
    /// a pass over every agent per core step.
    pub(super) agent_timer_floor: std::cell::Cell<Option<Millis>>,
    /// Status updates waiting for room in their framework's outbox (`pacing`); a framework
    /// with an entry here is behind: its new updates queue too.
    held: HashMap<FrameworkId, pacing::Held>,
}

/// Refuses a subscription: the reason goes to the framework, then the connection closes.
fn refuse_framework(conn: ConnId, message: String, out: &mut Vec<Output>) {
    tracing::info!(conn, "subscription refused: {message}");
    out.push(err(conn, ErrorKind::InvalidRequest, message.clone()));
    out.push(Output::Close {
        conn,
        reason: message,
    });
}

fn err(conn: ConnId, kind: ErrorKind, message: impl Into<String>) -> Output {
    Output::ToFramework(
        conn,
        MasterToFramework::Error {
            kind,
            message: message.into(),
        },
    )
}

impl Master {
    /// A master with no agents or frameworks. `id_seed` makes generated ids unique per master
    /// incarnation (pass random bits in production).
    pub fn new(config: MasterConfig, id_seed: u128) -> Self {
        let allocator = Allocator::new(config.allocator.clone());
        Self {
            config,
            allocator,
            conns: HashMap::new(),
            agents: HashMap::new(),
            agents_by_name: HashMap::new(),
            frameworks: HashMap::new(),
            tasks: HashMap::new(),
            completed: HashMap::new(),
            completed_frameworks: VecDeque::new(),
            recovered_agents: HashMap::new(),
            recovered_by_name: HashMap::new(),
            allocation_pending: false,
            last_batch: 0,
            id_seed,
            id_counter: 0,
            id_source: || uuid::Uuid::new_v4().as_u128(),
            last_cycle_us: 0,
            agent_timer_floor: std::cell::Cell::new(None),
            held: HashMap::new(),
            completed_count: HashMap::new(),
            reconciles: VecDeque::new(),
            events: events::EventQueue::default(),
            lease_until: None,
            drains: BTreeMap::new(),
            gone: BTreeMap::new(),
            unix_offset_ms: 0,
            status_update_retries: 0,
            tasks_completed: BTreeMap::new(),
        }
    }

    fn next_id(&mut self) -> u128 {
        self.id_counter += 1;
        self.id_seed ^ self.id_counter
    }

    /// Replaces where framework and agent ids come from (tests: to force collisions).
    pub fn set_id_source(&mut self, source: fn() -> u128) {
        self.id_source = source;
    }

    /// An unguessable framework id no framework has (a peer cannot pre-claim it).
    fn fresh_framework_id(&mut self) -> FrameworkId {
        loop {
            let id = FrameworkId::from_u128((self.id_source)());
            if !self.frameworks.contains_key(&id) {
                return id;
            }
            tracing::warn!(framework = %id, "fresh framework id already in use; drawing another");
        }
    }

    /// An unguessable agent id no live or recovering agent has.
    fn fresh_agent_id(&mut self) -> AgentId {
        loop {
            let id = AgentId::from_u128((self.id_source)());
            if !self.agents.contains_key(&id) && !self.recovered_agents.contains_key(&id) {
                return id;
            }
            tracing::warn!(agent = %id, "fresh agent id already in use; drawing another");
        }
    }

    /// Refuses a registering agent: the reason goes to the agent (which stops) and the log.
    fn refuse_agent(&mut self, conn: ConnId, message: String, out: &mut Vec<Output>) {
        tracing::warn!("agent refused: {message}");
        self.conns.remove(&conn);
        out.push(Output::ToAgent(
            conn,
            MasterToAgent::Error {
                message: message.clone(),
            },
        ));
        out.push(Output::Close {
            conn,
            reason: message,
        });
    }

    /// Applies one input. Offers are not made here: call [`Master::allocate`] when
    /// [`Master::allocation_due`] says so (the shell measures the cycle time around it).
    pub fn handle(&mut self, input: Input, now: Millis) -> Vec<Output> {
        let mut out = Vec::new();
        self.handle_into(input, now, &mut out);
        out
    }

    /// [`Master::handle`] appending to `out` (the shell's one buffer for a batch of inputs).
    pub fn handle_into(&mut self, input: Input, now: Millis, out: &mut Vec<Output>) {
        // Allocations change only at `now` from here on: integrate them up to it first.
        self.allocator.accrue(now);
        match input {
            Input::AgentConnected {
                conn,
                name,
                address,
            } => {
                self.conns.insert(
                    conn,
                    Peer::Agent {
                        name,
                        address,
                        agent: None,
                    },
                );
            }
            Input::FrameworkConnected { conn, principal } => {
                self.conns.insert(
                    conn,
                    Peer::Framework {
                        principal,
                        framework: None,
                    },
                );
            }
            Input::Agent { conn, msg } => self.agent_message(conn, msg, now, out),
            Input::Framework { conn, msg } => self.framework_message(conn, msg, now, out),
            Input::AgentDisconnected { conn } => {
                if let Some(Peer::Agent {
                    agent: Some(id), ..
                }) = self.conns.remove(&conn)
                {
                    self.agent_disconnected(id, conn, now, out);
                }
            }
            Input::FrameworkDisconnected { conn } => {
                if let Some(Peer::Framework {
                    framework: Some(id),
                    ..
                }) = self.conns.remove(&conn)
                {
                    self.framework_disconnected(id, conn, now);
                }
            }
            Input::PeerStalled { conn } => match self.conns.remove(&conn) {
                Some(Peer::Agent {
                    agent: Some(id), ..
                }) => self.agent_disconnected(id, conn, now, out),
                Some(Peer::Framework {
                    framework: Some(id),
                    ..
                }) => {
                    self.framework_disconnected(id, conn, now);
                    self.allocation_pending = true;
                }
                _ => {}
            },
            Input::UpdatesHeld { conn, updates } => self.updates_held(conn, updates),
            Input::Undelivered {
                conn,
                offers,
                messages,
            } => self.undelivered(conn, offers, messages, out),
            Input::Tick => self.tick(now, out),
            Input::LeaseUntil { until } => self.lease_until = until,
            Input::CycleTook { micros } => self.last_cycle_us = micros,
        }
    }

    /// Forgets `role` in the allocator if no framework, quota, weight or reservation uses it.
    fn forget_role(&mut self, role: &str) {
        for r in self.allocator.forget_role(role) {
            tracing::debug!(role = %r, "role forgotten: nothing uses it any more");
        }
    }

    /// Tells every connected framework that agent `id` left for good
    /// ([`MasterToFramework::AgentRemoved`], protocol 13), in framework-id order.
    fn send_agent_removed(&self, id: AgentId, name: &str, reason: &str, out: &mut Vec<Output>) {
        let mut conns: Vec<(FrameworkId, ConnId)> = self
            .frameworks
            .iter()
            .filter_map(|(fid, f)| f.conn.map(|c| (*fid, c)))
            .collect();
        conns.sort_unstable();
        for (_, conn) in conns {
            out.push(Output::ToFramework(
                conn,
                MasterToFramework::AgentRemoved(AgentRemoved {
                    agent_id: id,
                    hostname: name.to_string(),
                    reason: reason.to_string(),
                }),
            ));
        }
    }

    fn send_rescind(&self, rec: &OfferRecord, out: &mut Vec<Output>) {
        if let Some(conn) = self.frameworks.get(&rec.framework).and_then(|f| f.conn) {
            out.push(Output::ToFramework(
                conn,
                MasterToFramework::Rescind { offer_id: rec.id },
            ));
        }
    }
}

#[cfg(test)]
mod bounded_tests;
#[cfg(test)]
mod tests;
