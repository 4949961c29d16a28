//! The master's state machine: agents, frameworks, tasks and offers.
//!
//! PURE-ish: [`Master::handle`] takes an [`Input`] (a peer connected, sent a message,
//! disconnected, or a timer tick) and the current time, and returns the [`Output`]s to send. It
//! never touches a socket, a file or the clock, so it is tested without any I/O and the same
//! code runs in the live master. Offers and fairness are delegated to the pure
//! [`Allocator`](crate::allocator::Allocator).
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
//!   and depth, frameworks per principal). Roles nothing uses any more are forgotten.
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
//!   by the `run_tasks` ACL, or the task ends `ERROR`.
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

pub mod view;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use gantry_sdk::protocol::codec;
use gantry_sdk::protocol::*;

use crate::acl::Acls;
use crate::allocator::{
    AllocError, Allocator, AllocatorConfig, Millis, OfferRecord, OfferResources,
};
use crate::registry::{AgentRecord, FrameworkRecord, Mutation, Quota, Registry, Reservation};

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
    /// A disconnected agent not back within this long is lost.
    pub agent_reregister_timeout_ms: u64,
    /// Batch allocation interval.
    pub allocation_interval_ms: u64,
    /// Allocation cycles triggered by events are at least this far apart: a herd of
    /// re-registering agents then costs a few cycles over all agents, not one per message batch.
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
    /// What one principal may hold (docs/security.md).
    pub limits: Limits,
}

/// Bounds on what one tenant may make the master hold (docs/security.md lists the defaults and
/// the `gantry-master` flags). The connection limits are enforced by the I/O shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Frameworks one principal may have registered at once (connected or failing over).
    pub frameworks_per_principal: usize,
    /// Distinct roles one framework may subscribe to (over its subscription and failovers).
    pub roles_per_framework: usize,
    /// Longest role name, in bytes (at most 128, the syntax limit).
    pub role_name_length: usize,
    /// Most `/`-separated levels in a role name.
    pub role_depth: usize,
    /// Open connections per certificate identity (`agent:NAME`, `framework:PRINCIPAL`).
    pub connections_per_principal: usize,
    /// Open connections per source IP address; 0 = unlimited.
    pub connections_per_address: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            frameworks_per_principal: 100,
            roles_per_framework: 64,
            role_name_length: 128,
            role_depth: 8,
            connections_per_principal: 128,
            connections_per_address: 1024,
        }
    }
}

impl Limits {
    /// Why `role` may not be used (syntax, length or depth), if it may not.
    pub fn check_role(&self, role: &str) -> Result<(), String> {
        if !valid_role(role) {
            return Err(format!(
                "invalid role name {:?}: use segments of [A-Za-z0-9_.-] separated by '/', \
                 at most 128 bytes",
                truncated(role, 64)
            ));
        }
        if role.len() > self.role_name_length {
            return Err(format!(
                "role name {:?} is {} bytes long; the limit is {}",
                truncated(role, 64),
                role.len(),
                self.role_name_length
            ));
        }
        let depth = role.split('/').count();
        if depth > self.role_depth {
            return Err(format!(
                "role {:?} is {depth} levels deep; the limit is {}",
                truncated(role, 64),
                self.role_depth
            ));
        }
        Ok(())
    }
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
            allocation_interval_ms: 1000,
            allocation_min_gap_ms: 20,
            max_completed_tasks_per_framework: 1000,
            max_completed_frameworks: 50,
            acls: Acls::allow_all(),
            frame_body_timeout_ms: 10_000,
            frame_budget_bytes: 128 << 20,
            limits: Limits::default(),
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
    /// outbox overflowed): handled as a disconnect, now (offers rescinded, the framework's
    /// failover timeout or the agent's re-register timeout starts).
    PeerStalled {
        conn: ConnId,
    },
    /// Timers: heartbeat checks, offer expiry, failover timeouts, batch allocation.
    Tick,
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
    pub gpu_samples: Vec<GpuSample>,
    pub last_seen: Millis,
    pub disconnected_at: Option<Millis>,
    pub tasks: HashSet<TaskId>,
    /// The user its tasks run as when their command names none (reported at registration).
    pub task_user: String,
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
    /// The agent update forwarded to the framework and not yet acknowledged by it.
    pub pending: Option<StatusUpdate>,
    /// Updates the framework acknowledged (so agent retransmissions are not redelivered).
    pub acked: HashSet<UpdateId>,
    pub last_message: String,
    pub usage: Option<TaskUsage>,
    /// The role whose resources the task holds.
    pub role: String,
    /// GPUs the agent gave the task (UUIDs).
    pub gpus: Vec<String>,
    pub reason: Option<TaskReason>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// When the master sent the task to its agent (or adopted it).
    pub staged_at: Millis,
    /// When the task was first reported `RUNNING`.
    pub started_at: Option<Millis>,
    /// When the task first became terminal.
    pub ended_at: Option<Millis>,
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
    fn note(&mut self, state: TaskState, update: &StatusUpdate, now: Millis) {
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
        if state == TaskState::Running && self.started_at.is_none() {
            self.started_at = Some(now);
        }
        if state.is_terminal() && self.ended_at.is_none() {
            self.ended_at = Some(now);
        }
    }
}

/// Longest task message kept in records, bytes.
pub const MAX_KEPT_MESSAGE: usize = 1024;

/// A task message as kept in records: at most [`MAX_KEPT_MESSAGE`] bytes, `…` when cut.
fn kept_message(text: &str) -> String {
    if text.len() <= MAX_KEPT_MESSAGE {
        return text.to_string();
    }
    format!("{}…", truncated(text, MAX_KEPT_MESSAGE - '…'.len_utf8()))
}

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
    recovered_agents: HashMap<AgentId, (AgentRecord, BTreeMap<String, Resources>, Millis)>,
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
    /// Microseconds the last allocation cycle took (measured by the shell).
    pub last_cycle_us: u64,
    /// How many records of `completed` each task id has (reconcile looks ids up there).
    completed_count: HashMap<TaskId, u32>,
    /// Reconciliations being answered slice by slice, round robin.
    reconciles: VecDeque<Reconciling>,
}

/// Task ids answered per slice of a reconciliation (a few hundred microseconds of core time).
pub const RECONCILE_SLICE: usize = 1024;
/// Task ids one framework may have waiting for reconciliation answers; a reconcile past it is
/// refused (the framework asks again once answered).
pub const MAX_PENDING_RECONCILE_IDS: usize = 8 * MAX_RECONCILE_IDS;

/// A reconciliation with answers still to send.
#[derive(Debug)]
struct Reconciling {
    conn: ConnId,
    framework: FrameworkId,
    ids: Vec<TaskId>,
    next: usize,
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
            completed_count: HashMap::new(),
            reconciles: VecDeque::new(),
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

    /// The allocator (read-only), for views and metrics.
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// True when an allocation should run now: after events that free or add resources (at
    /// most once per `allocation_min_gap_ms`), or when the batch interval has passed.
    pub fn allocation_due(&self, now: Millis) -> bool {
        let since = now.saturating_sub(self.last_batch);
        (self.allocation_pending && since >= self.config.allocation_min_gap_ms)
            || since >= self.config.allocation_interval_ms
    }

    /// When an event-triggered allocation that is not due yet will be (for the shell's timer).
    pub fn next_allocation_at(&self) -> Option<Millis> {
        self.allocation_pending
            .then(|| self.last_batch + self.config.allocation_min_gap_ms)
    }

    /// Runs one allocation cycle and returns the offers to send.
    pub fn allocate(&mut self, now: Millis, out: &mut Vec<Output>) {
        self.allocation_pending = false;
        self.last_batch = now;
        let offers = self.allocator.allocate(now);
        let mut by_framework: HashMap<FrameworkId, Vec<Offer>> = HashMap::new();
        for rec in offers {
            match self.offer_message(&rec) {
                Some(offer) => by_framework.entry(rec.framework).or_default().push(offer),
                None => {
                    self.allocator.rescind(rec.id);
                }
            }
        }
        for (fw, offers) in by_framework {
            if let Some(conn) = self.frameworks.get(&fw).and_then(|f| f.conn) {
                // As many messages as the frame limit needs (many agents, large attributes).
                let split = codec::split_batches(offers, MasterToFramework::Offers);
                for o in split.oversized {
                    // Registration bounds make this unreachable; never send what can not go.
                    tracing::warn!(framework = %fw, agent = %o.agent_id, "an offer does not fit in a frame; rescinded");
                    self.allocator.rescind(o.id);
                }
                for batch in split.batches {
                    out.push(Output::ToFramework(conn, batch));
                }
            } else {
                for o in offers {
                    self.allocator.rescind(o.id);
                }
            }
        }
    }

    fn offer_message(&self, rec: &OfferRecord) -> Option<Offer> {
        let agent = self.agents.get(&rec.agent)?;
        Some(Offer {
            id: rec.id,
            framework_id: rec.framework,
            agent_id: rec.agent,
            hostname: agent.hostname.clone(),
            role: rec.role.clone(),
            resources: rec.resources.unreserved.clone(),
            reserved: rec.resources.reserved.clone(),
            attributes: agent.attributes.clone(),
            gpus: agent.gpus.iter().filter(|g| g.healthy).cloned().collect(),
        })
    }

    /// Applies one input. Offers are not made here: call [`Master::allocate`] when
    /// [`Master::allocation_due`] says so (the shell measures the cycle time around it).
    pub fn handle(&mut self, input: Input, now: Millis) -> Vec<Output> {
        let mut out = Vec::new();
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
            Input::Agent { conn, msg } => self.agent_message(conn, msg, now, &mut out),
            Input::Framework { conn, msg } => self.framework_message(conn, msg, now, &mut out),
            Input::AgentDisconnected { conn } => {
                if let Some(Peer::Agent {
                    agent: Some(id), ..
                }) = self.conns.remove(&conn)
                {
                    self.agent_disconnected(id, conn, now, &mut out);
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
                }) => self.agent_disconnected(id, conn, now, &mut out),
                Some(Peer::Framework {
                    framework: Some(id),
                    ..
                }) => {
                    self.framework_disconnected(id, conn, now);
                    self.allocation_pending = true;
                }
                _ => {}
            },
            Input::Tick => self.tick(now, &mut out),
        }
        out
    }

    /// True when reconciliation answers are waiting to be sent ([`Master::work_backlog`]).
    pub fn has_backlog(&self) -> bool {
        !self.reconciles.is_empty()
    }

    /// Answers one slice (at most [`RECONCILE_SLICE`] ids) of the next reconciliation whose
    /// connection can take messages: `room(conn)` says how many more messages it can queue.
    /// Returns false when no waiting reconciliation could make progress (the shell retries at
    /// its next tick).
    pub fn work_backlog(
        &mut self,
        now: Millis,
        out: &mut Vec<Output>,
        room: impl Fn(ConnId) -> usize,
    ) -> bool {
        for _ in 0..self.reconciles.len() {
            let Some(mut job) = self.reconciles.pop_front() else {
                return false;
            };
            // A framework that went away (or reconnected elsewhere) gets no more answers.
            let live = self
                .frameworks
                .get(&job.framework)
                .is_some_and(|f| f.conn == Some(job.conn));
            if !live {
                continue;
            }
            let n = room(job.conn).min(RECONCILE_SLICE);
            if n == 0 {
                self.reconciles.push_back(job);
                continue;
            }
            self.reconcile_slice(&mut job, n, now, out);
            if job.next < job.ids.len() {
                self.reconciles.push_back(job);
            }
            return true;
        }
        false
    }

    // -----------------------------------------------------------------------------------------
    // Agents

    fn agent_message(
        &mut self,
        conn: ConnId,
        msg: AgentToMaster,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(Peer::Agent {
            name,
            address,
            agent,
        }) = self.conns.get(&conn).cloned()
        else {
            out.push(Output::Close {
                conn,
                reason: "agent message on a connection that is not an agent's".into(),
            });
            return;
        };
        match (msg, agent) {
            (
                AgentToMaster::Register {
                    agent_id,
                    hostname,
                    resources,
                    reserved,
                    attributes,
                    gpus,
                    running_tasks,
                    pending_updates,
                    task_user,
                },
                None,
            ) => {
                if !crate::acl::valid_user(&task_user) {
                    let message = format!("invalid task user {task_user:?}");
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
                    return;
                }
                self.register_agent(
                    conn,
                    name,
                    address,
                    agent_id,
                    hostname,
                    resources,
                    reserved,
                    attributes,
                    gpus,
                    running_tasks,
                    pending_updates,
                    now,
                    out,
                );
                if let Some(Peer::Agent {
                    agent: Some(id), ..
                }) = self.conns.get(&conn)
                {
                    if let Some(a) = self.agents.get_mut(id) {
                        a.task_user = task_user;
                    }
                }
            }
            (AgentToMaster::Register { .. }, Some(_)) => {
                out.push(Output::Close {
                    conn,
                    reason: "agent registered twice on one connection".into(),
                });
            }
            (_, None) => out.push(Output::Close {
                conn,
                reason: "agent sent a message before registering".into(),
            }),
            (AgentToMaster::Heartbeat, Some(id)) => {
                if let Some(a) = self.agents.get_mut(&id) {
                    a.last_seen = now;
                }
            }
            (AgentToMaster::StatusUpdate(update), Some(id)) => {
                self.agent_update(conn, id, update, now, out)
            }
            (AgentToMaster::Usage { tasks, gpus }, Some(id)) => {
                if let Some(a) = self.agents.get_mut(&id) {
                    a.last_seen = now;
                    a.gpu_samples = gpus;
                }
                for (task_id, usage) in tasks {
                    if let Some(t) = self.tasks.get_mut(&task_id) {
                        if t.agent == id {
                            t.usage = Some(usage);
                        }
                    }
                }
            }
            (
                AgentToMaster::GpuHealth {
                    uuid,
                    healthy,
                    reason,
                },
                Some(id),
            ) => self.gpu_health(id, &uuid, healthy, &reason, out),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn register_agent(
        &mut self,
        conn: ConnId,
        name: String,
        address: String,
        claimed_id: Option<AgentId>,
        hostname: String,
        resources: Resources,
        reserved: BTreeMap<String, Resources>,
        attributes: Attributes,
        gpus: Vec<GpuInfo>,
        running: Vec<RunningTask>,
        pending_updates: Vec<StatusUpdate>,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if let Some(e) = reserved
            .keys()
            .find_map(|r| self.config.limits.check_role(r).err())
        {
            return self.refuse_agent(conn, format!("reservations: {e}"), out);
        }
        if let Err(e) = register_limits::check(&hostname, &attributes, &gpus, &reserved) {
            return self.refuse_agent(conn, format!("registration refused: {e}"), out);
        }
        // Who this is: its certificate name plus the id it checkpointed. An id belongs to one
        // name; a name to one live agent (see docs/security.md).
        let claim = match claimed_id {
            Some(c) => match (self.agents.get(&c), self.recovered_agents.get(&c)) {
                (Some(a), _) if a.name == name => Claim::Live(c),
                (Some(a), _) => {
                    let owner = a.name.clone();
                    return self.refuse_agent(
                        conn,
                        format!(
                            "agent id {c} belongs to agent {owner:?}; agent {name:?} (at \
                             {address}) may not claim it"
                        ),
                        out,
                    );
                }
                (None, Some((rec, _, _))) if rec.name == name => Claim::Recovered(c),
                (None, Some((rec, _, _))) => {
                    let owner = rec.name.clone();
                    return self.refuse_agent(
                        conn,
                        format!(
                            "agent id {c} belongs to agent {owner:?} (expected back after a \
                             failover); agent {name:?} (at {address}) may not claim it"
                        ),
                        out,
                    );
                }
                (None, None) => {
                    // Not an id this master (or its registry) vouches for: removed after the
                    // re-register timeout, or never issued. The agent joins as a new agent and
                    // the tasks it reports are killed (their frameworks were told they are LOST).
                    tracing::warn!(agent = %name, %address, claimed = %c,
                        "agent claims an unknown id; registering it as a new agent");
                    Claim::New
                }
            },
            None => Claim::New,
        };
        // A second agent under a name in use (by a live agent, or one expected back after a
        // failover) is refused: only one that has been gone for the re-register timeout (and so
        // was removed) may be replaced by a new incarnation.
        let holder = self.agents_by_name.get(&name).copied().or_else(|| {
            matches!(claim, Claim::New)
                .then(|| self.recovered_by_name.get(&name).copied())
                .flatten()
        });
        if let Some(other) = holder.filter(|o| Some(*o) != claimed_id) {
            let state = match self.agents.get(&other) {
                Some(a) => match (a.conn, a.disconnected_at) {
                    (Some(_), _) => format!("connected from {}", a.address),
                    (None, Some(t)) => format!(
                        "last at {}, disconnected {} s ago",
                        a.address,
                        now.saturating_sub(t) / 1000
                    ),
                    (None, None) => format!("last at {}", a.address),
                },
                None => "expected back after a master failover".to_string(),
            };
            let message = format!(
                "agent name {name:?} is in use by another agent (id {other}, {state}); this agent \
                 at {address} claims {}. Give each agent its own --name; a new incarnation is \
                 admitted only once the old one has been gone for the re-register timeout ({} s)",
                claimed_id.map_or("no id".to_string(), |c| format!("id {c}")),
                self.config.agent_reregister_timeout_ms / 1000
            );
            return self.refuse_agent(conn, message, out);
        }
        // Dynamic reservations this agent had (before an agent restart or a master failover),
        // and its registry record if this master recovered it from the registry.
        let mut recovered: Option<AgentRecord> = None;
        let dynamic = match claim {
            Claim::Live(c) => self
                .agents
                .get(&c)
                .map(|a| a.dynamic.clone())
                .unwrap_or_default(),
            Claim::Recovered(c) => match self.recovered_agents.remove(&c) {
                Some((rec, d, _)) => {
                    self.recovered_by_name.remove(&rec.name);
                    recovered = Some(rec);
                    d
                }
                None => BTreeMap::new(),
            },
            Claim::New => BTreeMap::new(),
        };
        let (resources, reserved) = with_dynamic(resources, reserved, &dynamic);
        let id = match claim {
            Claim::Live(c) => Some(c),
            Claim::Recovered(_) | Claim::New => None,
        };
        let id = match id {
            Some(id) => {
                // Re-registration: replace the connection, reconcile tasks.
                let (old_conn, old_resources, old_reserved) = {
                    let Some(a) = self.agents.get_mut(&id) else {
                        return;
                    };
                    let old = a.conn.replace(conn);
                    a.address = address;
                    a.hostname = hostname;
                    a.attributes = attributes;
                    a.gpus = gpus;
                    a.last_seen = now;
                    a.disconnected_at = None;
                    let old_res = std::mem::replace(&mut a.resources, resources.clone());
                    let old_reserved = std::mem::replace(&mut a.reserved, reserved.clone());
                    (old, old_res, old_reserved)
                };
                if let Some(c) = old_conn.filter(|c| *c != conn) {
                    self.conns.remove(&c);
                    out.push(Output::Close {
                        conn: c,
                        reason: "agent reconnected on a new connection".into(),
                    });
                }
                if old_resources != resources || old_reserved != reserved {
                    for rec in self
                        .allocator
                        .update_agent(id, resources.clone(), reserved.clone())
                    {
                        self.send_rescind(&rec, out);
                    }
                }
                self.reconcile_agent_tasks(id, conn, &running, &pending_updates, now, out);
                id
            }
            None => {
                let id = match claim {
                    Claim::Recovered(c) => c,
                    _ => self.fresh_agent_id(),
                };
                self.allocator
                    .add_agent(id, &name, resources.clone(), reserved.clone());
                self.agents.insert(
                    id,
                    AgentRec {
                        id,
                        name: name.clone(),
                        hostname,
                        address,
                        conn: Some(conn),
                        resources,
                        reserved,
                        dynamic: dynamic.clone(),
                        attributes,
                        gpus,
                        gpu_samples: Vec::new(),
                        last_seen: now,
                        disconnected_at: None,
                        tasks: HashSet::new(),
                        task_user: String::new(),
                    },
                );
                self.agents_by_name.insert(name.clone(), id);
                let hostname = self
                    .agents
                    .get(&id)
                    .map(|a| a.hostname.clone())
                    .unwrap_or_default();
                let record = AgentRecord {
                    id,
                    name: name.clone(),
                    hostname,
                };
                // After a failover the registry already holds most re-registering agents:
                // write only what changed (10,000 agents must not mean 10,000 etcd writes).
                if recovered.as_ref() != Some(&record) {
                    out.push(Output::Persist(Mutation::PutAgent(record)));
                }
                if matches!(claim, Claim::Recovered(_)) {
                    // An agent that comes back with tasks after a master restart: adopt them.
                    self.reconcile_agent_tasks(id, conn, &running, &pending_updates, now, out);
                } else {
                    // Nobody vouches for tasks a new agent reports: they are killed.
                    for rt in running.iter().filter(|rt| !rt.state.is_terminal()) {
                        out.push(Output::ToAgent(
                            conn,
                            MasterToAgent::KillTask {
                                framework_id: rt.framework_id,
                                task_id: rt.task.task_id,
                            },
                        ));
                    }
                }
                id
            }
        };
        if let Some(Peer::Agent { agent, .. }) = self.conns.get_mut(&conn) {
            *agent = Some(id);
        }
        out.push(Output::ToAgent(
            conn,
            MasterToAgent::Registered {
                agent_id: id,
                epoch: self.config.epoch,
                heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            },
        ));
        // Updates the agent made while it was away.
        for update in pending_updates {
            self.agent_update(conn, id, update, now, out);
        }
        self.allocation_pending = true;
    }

    /// Brings the master's view of an agent's tasks in line with what the agent reports.
    fn reconcile_agent_tasks(
        &mut self,
        id: AgentId,
        conn: ConnId,
        running: &[RunningTask],
        pending: &[StatusUpdate],
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let reported: HashSet<TaskId> = running
            .iter()
            .map(|r| r.task.task_id)
            .chain(pending.iter().map(|u| u.task_id))
            .collect();
        for rt in running {
            let tid = rt.task.task_id;
            match self.tasks.get(&tid) {
                Some(t) if t.agent == id => {}
                Some(_) => {
                    // Known on another agent: should not happen; kill the stray copy.
                    out.push(Output::ToAgent(
                        conn,
                        MasterToAgent::KillTask {
                            framework_id: rt.framework_id,
                            task_id: tid,
                        },
                    ));
                }
                None => {
                    if !self.frameworks.contains_key(&rt.framework_id) {
                        // Its framework is gone (or not yet re-subscribed after a master
                        // failover, which issue 5 handles by recovering frameworks first).
                        out.push(Output::ToAgent(
                            conn,
                            MasterToAgent::KillTask {
                                framework_id: rt.framework_id,
                                task_id: tid,
                            },
                        ));
                        continue;
                    }
                    let allocation = OfferResources {
                        unreserved: rt.task.resources.clone(),
                        reserved: BTreeMap::new(),
                    };
                    let role = self
                        .frameworks
                        .get(&rt.framework_id)
                        .and_then(|f| f.roles.first().cloned())
                        .unwrap_or_default();
                    // A task that already ended (its terminal update is still unacknowledged)
                    // holds nothing.
                    let ended = rt.state.is_terminal();
                    if !ended {
                        if let Err(e) =
                            self.allocator
                                .add_allocation(rt.framework_id, id, &role, &allocation)
                        {
                            tracing::warn!(task = %tid, "adopted task's resources not charged: {e}");
                        }
                    }
                    self.tasks.insert(
                        tid,
                        TaskRec {
                            info: rt.task.clone(),
                            framework: rt.framework_id,
                            agent: id,
                            state: rt.state,
                            allocation,
                            recovered: ended,
                            pending: None,
                            acked: HashSet::new(),
                            last_message: "adopted from re-registering agent".into(),
                            usage: None,
                            role: role.clone(),
                            gpus: rt.gpus.clone(),
                            reason: None,
                            exit_code: None,
                            signal: None,
                            staged_at: now,
                            started_at: (rt.state == TaskState::Running).then_some(now),
                            ended_at: ended.then_some(now),
                        },
                    );
                    if let Some(f) = self.frameworks.get_mut(&rt.framework_id) {
                        f.tasks.insert(tid);
                    }
                    if let Some(a) = self.agents.get_mut(&id) {
                        a.tasks.insert(tid);
                    }
                }
            }
        }
        // Tasks the master placed on this agent that the agent does not know: lost in flight.
        let missing: Vec<TaskId> = self
            .agents
            .get(&id)
            .map(|a| {
                a.tasks
                    .iter()
                    .filter(|t| !reported.contains(t))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        for tid in missing {
            let non_terminal = self
                .tasks
                .get(&tid)
                .is_some_and(|t| !t.state.is_terminal() && t.pending.is_none());
            if non_terminal {
                self.master_update(
                    tid,
                    TaskState::Lost,
                    TaskReason::AgentLost,
                    "task unknown to the agent after it re-registered",
                    now,
                    out,
                );
            }
        }
        // Re-send kills and queued updates for this agent's tasks.
        let kills: Vec<(FrameworkId, TaskId)> = self
            .tasks
            .iter()
            .filter(|(_, t)| {
                t.agent == id
                    && !t.state.is_terminal()
                    && !self.frameworks.contains_key(&t.framework)
            })
            .map(|(tid, t)| (t.framework, *tid))
            .collect();
        for (fw, tid) in kills {
            out.push(Output::ToAgent(
                conn,
                MasterToAgent::KillTask {
                    framework_id: fw,
                    task_id: tid,
                },
            ));
        }
    }

    fn agent_update(
        &mut self,
        conn: ConnId,
        agent: AgentId,
        update: StatusUpdate,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if let Some(a) = self.agents.get_mut(&agent) {
            a.last_seen = now;
        }
        let ack = Output::ToAgent(
            conn,
            MasterToAgent::Acknowledge {
                task_id: update.task_id,
                update_id: update.update_id,
            },
        );
        let Some(task) = self.tasks.get_mut(&update.task_id) else {
            // Unknown task (its framework was removed): nobody will acknowledge; we do.
            out.push(ack);
            return;
        };
        if task.agent != agent {
            out.push(Output::Close {
                conn,
                reason: format!(
                    "status update for task {} which runs on another agent",
                    update.task_id
                ),
            });
            return;
        }
        if task.acked.contains(&update.update_id) {
            out.push(ack);
            return;
        }
        let was_terminal = task.state.is_terminal();
        if !was_terminal || update.state.is_terminal() {
            task.state = update.state;
        }
        let state = task.state;
        task.note(state, &update, now);
        let framework = task.framework;
        let mut update = update;
        update.agent_id = Some(agent);
        update.framework_id = framework;
        task.pending = Some(update.clone());
        if update.state.is_terminal() {
            self.release_task_resources(update.task_id);
        }
        match self.frameworks.get(&framework) {
            Some(f) => {
                if let Some(fconn) = f.conn {
                    out.push(Output::ToFramework(
                        fconn,
                        MasterToFramework::Update(update),
                    ));
                }
            }
            None => {
                // Framework removed: acknowledge on its behalf.
                out.push(ack);
                self.finish_task_if_done(update.task_id);
            }
        }
    }

    /// Returns a terminal task's resources to the allocator once.
    fn release_task_resources(&mut self, tid: TaskId) {
        let Some(task) = self.tasks.get_mut(&tid) else {
            return;
        };
        if task.recovered {
            return;
        }
        task.recovered = true;
        let (fw, agent, alloc) = (task.framework, task.agent, task.allocation.clone());
        if self.frameworks.contains_key(&fw) && self.agents.contains_key(&agent) {
            self.allocator.recover(fw, agent, &alloc);
            self.allocation_pending = true;
        }
    }

    /// Moves a terminal, acknowledged task to the completed list.
    fn finish_task_if_done(&mut self, tid: TaskId) {
        let done = self
            .tasks
            .get(&tid)
            .is_some_and(|t| t.state.is_terminal() && t.pending.is_none());
        let fw_gone = self
            .tasks
            .get(&tid)
            .is_some_and(|t| !self.frameworks.contains_key(&t.framework));
        if !(done || fw_gone && self.tasks.get(&tid).is_some_and(|t| t.state.is_terminal())) {
            return;
        }
        let Some(task) = self.tasks.remove(&tid) else {
            return;
        };
        if let Some(a) = self.agents.get_mut(&task.agent) {
            a.tasks.remove(&tid);
        }
        if let Some(f) = self.frameworks.get_mut(&task.framework) {
            f.tasks.remove(&tid);
        }
        self.remember_completed(task.record());
    }

    /// Adds a completed task to its framework's history, dropping the oldest past the bound.
    /// A framework that is neither active nor among the completed ones keeps no history.
    fn remember_completed(&mut self, record: TaskRecord) {
        let fw = record.framework;
        let known = self.frameworks.contains_key(&fw)
            || self.completed_frameworks.iter().any(|f| f.id == fw);
        let max = self.config.max_completed_tasks_per_framework;
        if !known || max == 0 {
            return;
        }
        *self.completed_count.entry(record.id).or_default() += 1;
        let list = self.completed.entry(fw).or_default();
        list.push_back(record);
        let mut dropped = Vec::new();
        while list.len() > max {
            if let Some(old) = list.pop_front() {
                dropped.push(old.id);
            }
        }
        self.forget_completed(dropped);
    }

    /// Uncounts completed records that were dropped.
    fn forget_completed(&mut self, ids: impl IntoIterator<Item = TaskId>) {
        for id in ids {
            if let Some(n) = self.completed_count.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    self.completed_count.remove(&id);
                }
            }
        }
    }

    /// The completed record of `tid` in `fw`'s history, if kept (a map look-up for ids that
    /// were never completed, so a reconcile of many unknown ids stays cheap).
    pub(crate) fn completed_task(&self, fw: FrameworkId, tid: TaskId) -> Option<&TaskRecord> {
        if !self.completed_count.contains_key(&tid) {
            return None;
        }
        self.completed.get(&fw)?.iter().rev().find(|c| c.id == tid)
    }

    /// A status update made by the master itself (LOST, ERROR, KILLED of a task no agent runs).
    fn master_update(
        &mut self,
        tid: TaskId,
        state: TaskState,
        reason: TaskReason,
        message: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(task) = self.tasks.get(&tid) else {
            return;
        };
        let (fw, agent) = (task.framework, task.agent);
        let mut update = self.new_update(tid, fw, Some(agent), state, message.to_string(), now);
        update.reason = Some(reason);
        let Some(task) = self.tasks.get_mut(&tid) else {
            return;
        };
        task.state = state;
        task.note(state, &update, now);
        let Some(task) = self.tasks.get_mut(&tid) else {
            return;
        };
        if state.is_terminal() {
            task.pending = None;
            self.release_task_resources(tid);
        }
        if let Some(conn) = self.frameworks.get(&fw).and_then(|f| f.conn) {
            out.push(Output::ToFramework(conn, MasterToFramework::Update(update)));
        }
        if state.is_terminal() {
            self.finish_task_if_done(tid);
        }
    }

    /// A status update made by the master (not relayed from an agent).
    fn new_update(
        &mut self,
        task_id: TaskId,
        framework_id: FrameworkId,
        agent_id: Option<AgentId>,
        state: TaskState,
        message: String,
        now: Millis,
    ) -> StatusUpdate {
        StatusUpdate {
            update_id: UpdateId::from_u128(self.next_id()),
            task_id,
            framework_id,
            agent_id,
            state,
            source: UpdateSource::Master,
            reason: None,
            message,
            exit_code: None,
            signal: None,
            gpus: Vec::new(),
            timestamp_ms: now,
            reconciliation: false,
        }
    }

    fn gpu_health(
        &mut self,
        agent: AgentId,
        uuid: &str,
        healthy: bool,
        reason: &str,
        out: &mut Vec<Output>,
    ) {
        let Some(a) = self.agents.get_mut(&agent) else {
            return;
        };
        let Some(gpu) = a.gpus.iter_mut().find(|g| g.uuid == uuid) else {
            return;
        };
        if gpu.healthy == healthy {
            return;
        }
        gpu.healthy = healthy;
        let healthy_count = a.gpus.iter().filter(|g| g.healthy).count() as u64;
        // Statically reserved GPUs stay reserved; the unreserved pool absorbs the change.
        let reserved_gpus: u64 = a.reserved.values().map(|r| r.milli("gpus")).sum();
        let mut resources = a.resources.clone();
        resources.set_milli(
            "gpus",
            (healthy_count * gantry_sdk::protocol::resources::MILLI).saturating_sub(reserved_gpus),
        );
        a.resources = resources.clone();
        let reserved = a.reserved.clone();
        tracing::warn!(%agent, gpu = uuid, healthy, reason, "GPU health changed");
        for rec in self.allocator.update_agent(agent, resources, reserved) {
            self.send_rescind(&rec, out);
        }
        self.allocation_pending = true;
    }

    fn agent_disconnected(
        &mut self,
        id: AgentId,
        conn: ConnId,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(a) = self.agents.get_mut(&id) else {
            return;
        };
        if a.conn != Some(conn) {
            return;
        }
        a.conn = None;
        a.disconnected_at = Some(now);
        tracing::info!(agent = %a.name, "agent disconnected; waiting for it to re-register");
        // Its outstanding offers can no longer be used.
        let offers: Vec<OfferId> = self
            .allocator
            .outstanding_offers()
            .filter(|o| o.agent == id)
            .map(|o| o.id)
            .collect();
        for oid in offers {
            if let Some(rec) = self.allocator.rescind(oid) {
                self.send_rescind(&rec, out);
            }
        }
    }

    fn remove_agent(&mut self, id: AgentId, reason: &str, now: Millis, out: &mut Vec<Output>) {
        let tasks: Vec<TaskId> = self
            .agents
            .get(&id)
            .map(|a| a.tasks.iter().copied().collect())
            .unwrap_or_default();
        for tid in tasks {
            if let Some(t) = self.tasks.get_mut(&tid) {
                t.recovered = true; // the agent's resources leave with it
                if !t.state.is_terminal() || t.pending.is_some() {
                    t.pending = None;
                    self.master_update(
                        tid,
                        TaskState::Lost,
                        TaskReason::AgentLost,
                        reason,
                        now,
                        out,
                    );
                }
                self.finish_task_if_done(tid);
                self.tasks.remove(&tid);
            }
        }
        for rec in self.allocator.remove_agent(id) {
            self.send_rescind(&rec, out);
        }
        if let Some(a) = self.agents.remove(&id) {
            self.agents_by_name.remove(&a.name);
            for role in a.reserved.keys() {
                self.forget_role(role);
            }
            if let Some(c) = a.conn {
                self.conns.remove(&c);
                out.push(Output::Close {
                    conn: c,
                    reason: reason.to_string(),
                });
            }
            tracing::warn!(agent = %a.name, reason, "agent removed");
            for role in a.dynamic.keys() {
                out.push(Output::Persist(Mutation::RemoveReservation {
                    agent_id: id,
                    role: role.clone(),
                }));
            }
            out.push(Output::Persist(Mutation::RemoveAgent(id)));
        }
    }

    /// Forgets `role` in the allocator if no framework, quota, weight or reservation uses it.
    fn forget_role(&mut self, role: &str) {
        for r in self.allocator.forget_role(role) {
            tracing::debug!(role = %r, "role forgotten: nothing uses it any more");
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

    // -----------------------------------------------------------------------------------------
    // Frameworks

    fn framework_message(
        &mut self,
        conn: ConnId,
        msg: FrameworkToMaster,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(Peer::Framework {
            principal,
            framework,
        }) = self.conns.get(&conn).cloned()
        else {
            out.push(Output::Close {
                conn,
                reason: "framework message on a connection that is not a framework's".into(),
            });
            return;
        };
        let fw = match (msg, framework) {
            (FrameworkToMaster::Subscribe(info), None) => {
                return self.subscribe(conn, principal, info, out)
            }
            (FrameworkToMaster::Subscribe(_), Some(_)) => {
                out.push(err(
                    conn,
                    ErrorKind::InvalidRequest,
                    "already subscribed on this connection",
                ));
                return;
            }
            (_, None) => {
                out.push(err(conn, ErrorKind::NotSubscribed, "subscribe first"));
                out.push(Output::Close {
                    conn,
                    reason: "framework message before subscribing".into(),
                });
                return;
            }
            (msg, Some(fw)) => (msg, fw),
        };
        let (msg, fw) = fw;
        match msg {
            FrameworkToMaster::Subscribe(_) => unreachable!("handled above"),
            FrameworkToMaster::Accept {
                offer_ids,
                operations,
                refuse_seconds,
            } => self.accept(conn, fw, offer_ids, operations, refuse_seconds, now, out),
            FrameworkToMaster::Decline {
                offer_ids,
                refuse_seconds,
            } => {
                let refuse = match refuse_ms(refuse_seconds) {
                    Ok(r) => r,
                    Err(m) => return out.push(err(conn, ErrorKind::InvalidRequest, m)),
                };
                // One error for all unknown ids: a long list of them is not a long answer.
                let mut unknown: Option<(OfferId, usize)> = None;
                let mut mine = Vec::with_capacity(offer_ids.len());
                for oid in offer_ids {
                    match self.allocator.offer(oid) {
                        Some(o) if o.framework == fw => mine.push(oid),
                        _ => unknown.get_or_insert((oid, 0)).1 += 1,
                    }
                }
                // One decline: on each agent, one filter over the union of its offers there.
                let _ = self.allocator.decline_offers(&mine, refuse, now);
                match unknown {
                    Some((oid, 1)) => out.push(err(
                        conn,
                        ErrorKind::UnknownOffer,
                        format!("decline: offer {oid} is not outstanding for this framework"),
                    )),
                    Some((oid, n)) => out.push(err(
                        conn,
                        ErrorKind::UnknownOffer,
                        format!(
                            "decline: {n} offers (the first {oid}) are not outstanding for this framework"
                        ),
                    )),
                    None => {}
                }
            }
            FrameworkToMaster::Kill { task_id } => match self.tasks.get(&task_id) {
                Some(t) if t.framework == fw => {
                    if t.state.is_terminal() {
                        return;
                    }
                    match self.agents.get(&t.agent).and_then(|a| a.conn) {
                        Some(aconn) => out.push(Output::ToAgent(
                            aconn,
                            MasterToAgent::KillTask {
                                framework_id: fw,
                                task_id,
                            },
                        )),
                        None => {
                            if !self.agents.contains_key(&t.agent) {
                                self.master_update(
                                    task_id,
                                    TaskState::Lost,
                                    TaskReason::AgentLost,
                                    "agent is gone",
                                    now,
                                    out,
                                );
                            }
                            // Otherwise the agent is disconnected: the kill is sent again
                            // when the framework retries after reconciling.
                        }
                    }
                }
                _ => out.push(err(
                    conn,
                    ErrorKind::UnknownTask,
                    format!("kill: task {task_id} is unknown"),
                )),
            },
            FrameworkToMaster::Reconcile { task_ids } => self.reconcile(conn, fw, task_ids, out),
            FrameworkToMaster::Suppress { roles } => {
                if roles.is_empty() {
                    self.allocator.suppress(fw, None);
                } else {
                    for r in &roles {
                        self.allocator.suppress(fw, Some(r));
                    }
                }
            }
            FrameworkToMaster::Revive { roles } => {
                if roles.is_empty() {
                    self.allocator.revive(fw, None);
                } else {
                    for r in &roles {
                        self.allocator.revive(fw, Some(r));
                    }
                }
                self.allocation_pending = true;
            }
            FrameworkToMaster::Acknowledge { task_id, update_id } => {
                let Some(task) = self.tasks.get_mut(&task_id) else {
                    return;
                };
                if task.framework != fw
                    || task.pending.as_ref().map(|u| u.update_id) != Some(update_id)
                {
                    return;
                }
                task.pending = None;
                task.acked.insert(update_id);
                if let Some(aconn) = self.agents.get(&task.agent).and_then(|a| a.conn) {
                    out.push(Output::ToAgent(
                        aconn,
                        MasterToAgent::Acknowledge { task_id, update_id },
                    ));
                }
                self.finish_task_if_done(task_id);
            }
            FrameworkToMaster::SetDemand { demand } => {
                if let Some(d) = &demand {
                    if d.task.is_empty() {
                        return out.push(err(
                            conn,
                            ErrorKind::InvalidRequest,
                            "demand task shape is empty",
                        ));
                    }
                }
                self.allocator.set_demand(fw, demand);
                self.allocation_pending = true;
            }
            FrameworkToMaster::Teardown => {
                self.remove_framework(fw, "framework tore down", now, out);
                self.conns.remove(&conn);
                out.push(Output::Close {
                    conn,
                    reason: "framework tore down".into(),
                });
            }
        }
    }

    fn subscribe(
        &mut self,
        conn: ConnId,
        principal: String,
        info: FrameworkInfo,
        out: &mut Vec<Output>,
    ) {
        if let Err(message) = self.check_subscribe(&principal, &info) {
            return refuse_framework(conn, message, out);
        }
        let failover_timeout_ms = (info.failover_timeout_secs.min(365.0 * 86400.0) * 1000.0) as u64;
        let id = match info
            .framework_id
            .and_then(|id| self.frameworks.get(&id).map(|f| (id, f.principal.clone())))
        {
            Some((id, owner)) if owner == principal => {
                // Failover: the same principal takes its framework back.
                let old_conn = {
                    let f = self.frameworks.get_mut(&id).expect("checked above");
                    f.name = info.name.clone();
                    f.failover_timeout_ms = failover_timeout_ms;
                    f.capabilities = info.capabilities.clone();
                    for r in &info.roles {
                        if !f.roles.contains(r) {
                            f.roles.push(r.clone());
                        }
                    }
                    f.disconnected_at = None;
                    f.conn.replace(conn)
                };
                if let Some(c) = old_conn.filter(|c| *c != conn) {
                    // The old connection's offers die with it.
                    self.conns.remove(&c);
                    out.push(Output::Close {
                        conn: c,
                        reason: "framework re-subscribed elsewhere".into(),
                    });
                    let offers: Vec<OfferId> = self
                        .allocator
                        .outstanding_offers()
                        .filter(|o| o.framework == id)
                        .map(|o| o.id)
                        .collect();
                    for o in offers {
                        self.allocator.rescind(o);
                    }
                }
                // Capabilities and new roles may change on failover (as in Mesos).
                let (name, roles) = self
                    .frameworks
                    .get(&id)
                    .map(|f| (f.name.clone(), f.roles.clone()))
                    .unwrap_or_default();
                let gpu = info.capabilities.contains(&Capability::GpuResources);
                self.allocator.add_framework(id, &name, &roles, gpu, None);
                self.allocator.revive(id, None);
                id
            }
            Some(_) => {
                // Checked by `check_subscribe`.
                return refuse_framework(
                    conn,
                    "framework id belongs to another principal".into(),
                    out,
                );
            }
            None => {
                let id = self.fresh_framework_id();
                let gpu = info.capabilities.contains(&Capability::GpuResources);
                self.allocator
                    .add_framework(id, &info.name, &info.roles, gpu, None);
                self.frameworks.insert(
                    id,
                    FrameworkRec {
                        id,
                        name: info.name.clone(),
                        principal: principal.clone(),
                        roles: info.roles.clone(),
                        capabilities: info.capabilities.clone(),
                        failover_timeout_ms,
                        conn: Some(conn),
                        disconnected_at: None,
                        tasks: HashSet::new(),
                    },
                );
                id
            }
        };
        if let Some(Peer::Framework { framework, .. }) = self.conns.get_mut(&conn) {
            *framework = Some(id);
        }
        tracing::info!(framework = %id, name = %info.name, %principal, "framework subscribed");
        if let Some(f) = self.frameworks.get(&id) {
            out.push(Output::Persist(Mutation::PutFramework(FrameworkRecord {
                id,
                name: f.name.clone(),
                roles: f.roles.clone(),
                principal: f.principal.clone(),
                failover_timeout_secs: f.failover_timeout_ms as f64 / 1000.0,
            })));
        }
        out.push(Output::ToFramework(
            conn,
            MasterToFramework::Subscribed {
                framework_id: id,
                epoch: self.config.epoch,
                heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            },
        ));
        // Redeliver updates the framework has not acknowledged yet.
        let mut pending: Vec<StatusUpdate> = self
            .frameworks
            .get(&id)
            .map(|f| {
                f.tasks
                    .iter()
                    .filter_map(|t| self.tasks.get(t)?.pending.clone())
                    .collect()
            })
            .unwrap_or_default();
        pending.sort_by_key(|u| u.timestamp_ms);
        for u in pending {
            out.push(Output::ToFramework(conn, MasterToFramework::Update(u)));
        }
        self.allocation_pending = true;
    }

    /// Why `principal` may not subscribe `info` (validity, identity, ACLs, limits), if so.
    fn check_subscribe(&self, principal: &str, info: &FrameworkInfo) -> Result<(), String> {
        let limits = &self.config.limits;
        if info.name.is_empty() || info.name.len() > 256 {
            return Err("framework name must be 1-256 characters".into());
        }
        if !info.failover_timeout_secs.is_finite() || info.failover_timeout_secs < 0.0 {
            return Err("failover timeout must be a non-negative number of seconds".into());
        }
        if info.roles.is_empty() {
            return Err("a framework needs at least one role".into());
        }
        // Counted before anything else is looked at, so 50,000 roles cost one comparison.
        if info.roles.len() > limits.roles_per_framework {
            return Err(format!(
                "{} roles in one subscription; the limit is {} per framework",
                info.roles.len(),
                limits.roles_per_framework
            ));
        }
        for role in &info.roles {
            limits.check_role(role)?;
            if !self.config.acls.may_register(principal, role) {
                return Err(format!(
                    "principal {principal:?} is not allowed to subscribe with role {role:?} \
                     (ACL register_frameworks)"
                ));
            }
        }
        match info.framework_id {
            Some(id) => {
                let Some(f) = self.frameworks.get(&id) else {
                    return Err(format!(
                        "framework id {id} is not registered with this master (removed after \
                         its failover timeout, or never issued); subscribe without an id to \
                         register a new framework"
                    ));
                };
                if f.principal != principal {
                    tracing::warn!(framework = %id, owner = %f.principal, %principal,
                        "subscribe with another principal's framework id refused");
                    return Err(format!(
                        "framework id {id} belongs to another principal; principal \
                         {principal:?} may not resume it"
                    ));
                }
                let mut roles: HashSet<&str> = f.roles.iter().map(String::as_str).collect();
                roles.extend(info.roles.iter().map(String::as_str));
                if roles.len() > limits.roles_per_framework {
                    return Err(format!(
                        "framework {id} would hold {} roles; the limit is {} per framework",
                        roles.len(),
                        limits.roles_per_framework
                    ));
                }
            }
            None => {
                let mine = self
                    .frameworks
                    .values()
                    .filter(|f| f.principal == principal)
                    .count();
                if mine >= limits.frameworks_per_principal {
                    return Err(format!(
                        "principal {principal:?} already has {mine} frameworks registered; the \
                         limit is {} (frameworks that disconnected count until their failover \
                         timeout ends)",
                        limits.frameworks_per_principal
                    ));
                }
            }
        }
        Ok(())
    }

    fn framework_disconnected(&mut self, id: FrameworkId, conn: ConnId, now: Millis) {
        let Some(f) = self.frameworks.get_mut(&id) else {
            return;
        };
        if f.conn != Some(conn) {
            return;
        }
        f.conn = None;
        f.disconnected_at = Some(now);
        tracing::info!(framework = %id, "framework disconnected; keeping its tasks for its failover timeout");
        let offers: Vec<OfferId> = self
            .allocator
            .outstanding_offers()
            .filter(|o| o.framework == id)
            .map(|o| o.id)
            .collect();
        for o in offers {
            self.allocator.rescind(o);
        }
        // No offers while it is away.
        self.allocator.suppress(id, None);
    }

    fn remove_framework(
        &mut self,
        id: FrameworkId,
        reason: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(f) = self.frameworks.remove(&id) else {
            return;
        };
        self.completed_frameworks.push_back(CompletedFramework {
            id,
            name: f.name.clone(),
            principal: f.principal.clone(),
            roles: f.roles.clone(),
            removed_at: now,
            reason: reason.to_string(),
        });
        while self.completed_frameworks.len() > self.config.max_completed_frameworks {
            if let Some(old) = self.completed_frameworks.pop_front() {
                if let Some(list) = self.completed.remove(&old.id) {
                    self.forget_completed(list.into_iter().map(|r| r.id));
                }
            }
        }
        out.push(Output::Persist(Mutation::RemoveFramework(id)));
        tracing::info!(framework = %id, reason, "framework removed");
        // Its outstanding offers go with it; nobody is left to tell.
        self.allocator.remove_framework(id);
        for role in &f.roles {
            self.forget_role(role);
        }
        for tid in f.tasks {
            let Some(t) = self.tasks.get_mut(&tid) else {
                continue;
            };
            t.recovered = true; // freed by remove_framework
            t.pending = None;
            if t.state.is_terminal() {
                self.finish_task_if_done(tid);
            } else if let Some(aconn) = self.agents.get(&t.agent).and_then(|a| a.conn) {
                out.push(Output::ToAgent(
                    aconn,
                    MasterToAgent::KillTask {
                        framework_id: id,
                        task_id: tid,
                    },
                ));
            }
        }
        self.allocation_pending = true;
    }

    fn reconcile(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        task_ids: Vec<TaskId>,
        out: &mut Vec<Output>,
    ) {
        if task_ids.len() > MAX_RECONCILE_IDS {
            return out.push(err(
                conn,
                ErrorKind::InvalidRequest,
                format!(
                    "reconcile names {} task ids; at most {MAX_RECONCILE_IDS} per message",
                    task_ids.len()
                ),
            ));
        }
        let waiting: usize = self
            .reconciles
            .iter()
            .filter(|j| j.framework == fw)
            .map(|j| j.ids.len() - j.next)
            .sum();
        let ids: Vec<TaskId> = if task_ids.is_empty() {
            self.frameworks
                .get(&fw)
                .map(|f| f.tasks.iter().copied().collect())
                .unwrap_or_default()
        } else {
            task_ids
        };
        if waiting > 0 && waiting + ids.len() > MAX_PENDING_RECONCILE_IDS {
            return out.push(err(
                conn,
                ErrorKind::InvalidRequest,
                format!(
                    "{waiting} task ids of earlier reconciles are still being answered; \
                     at most {MAX_PENDING_RECONCILE_IDS} may wait: ask again later"
                ),
            ));
        }
        // Answered from the backlog, a slice at a time, as fast as the framework reads.
        if !ids.is_empty() {
            self.reconciles.push_back(Reconciling {
                conn,
                framework: fw,
                ids,
                next: 0,
            });
        }
    }

    /// Answers up to `n` more ids of `job`.
    fn reconcile_slice(
        &mut self,
        job: &mut Reconciling,
        n: usize,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let (conn, fw) = (job.conn, job.framework);
        let end = (job.next + n).min(job.ids.len());
        for i in job.next..end {
            let tid = job.ids[i];
            let known = match self.tasks.get(&tid).filter(|t| t.framework == fw) {
                Some(t) => Some(t.record()),
                None => self.completed_task(fw, tid).cloned(),
            };
            let (state, agent, message, reason) = match &known {
                Some(r) => (r.state, Some(r.agent), r.message.clone(), r.reason),
                // After a failover, agents still re-registering may hold it: say nothing
                // yet (as Mesos does) rather than a LOST that may be wrong.
                None if !self.recovered_agents.is_empty() => continue,
                None => (
                    TaskState::Lost,
                    None,
                    "unknown task".to_string(),
                    Some(TaskReason::Unknown),
                ),
            };
            let mut update = self.new_update(tid, fw, agent, state, message, now);
            update.reason = reason;
            if let Some(r) = &known {
                update.exit_code = r.exit_code;
                update.signal = r.signal;
                update.gpus = r.gpus.clone();
            }
            update.reconciliation = true;
            out.push(Output::ToFramework(conn, MasterToFramework::Update(update)));
        }
        job.next = end;
    }

    #[allow(clippy::too_many_arguments)]
    fn accept(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        offer_ids: Vec<OfferId>,
        operations: Vec<Operation>,
        refuse_seconds: Option<f64>,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        // 1. The offers: known, ours, distinct, one agent.
        let mut problem: Option<(ErrorKind, String)> = None;
        let mut offers: Vec<OfferRecord> = Vec::new();
        // Distinct ids in O(1) each: an accept may name many.
        let mut named: HashSet<OfferId> = HashSet::new();
        if offer_ids.is_empty() {
            problem = Some((ErrorKind::InvalidRequest, "accept names no offer".into()));
        }
        for oid in &offer_ids {
            match self.allocator.offer(*oid) {
                Some(o) if o.framework == fw && named.insert(*oid) => offers.push(o.clone()),
                Some(o) if o.framework == fw => {
                    problem = Some((
                        ErrorKind::InvalidRequest,
                        format!("offer {oid} named twice"),
                    ))
                }
                _ => {
                    problem = Some((
                        ErrorKind::UnknownOffer,
                        format!("offer {oid} is unknown, already used, rescinded or expired"),
                    ))
                }
            }
        }
        let refuse = match refuse_ms(refuse_seconds) {
            Ok(r) => r,
            Err(m) => {
                problem.get_or_insert((ErrorKind::InvalidRequest, m));
                None
            }
        };
        let agent_id = offers.first().map(|o| o.agent);
        if offers.iter().any(|o| Some(o.agent) != agent_id) {
            problem.get_or_insert((
                ErrorKind::InvalidRequest,
                "offers of one accept must be on one agent".into(),
            ));
        }
        let agent_conn = agent_id
            .and_then(|a| self.agents.get(&a))
            .and_then(|a| a.conn);
        if problem.is_none() && agent_conn.is_none() {
            problem = Some((
                ErrorKind::UnknownAgent,
                "the offers' agent is unknown or disconnected".into(),
            ));
        }
        if let Some((kind, message)) = problem {
            let ids: Vec<OfferId> = offers.iter().map(|o| o.id).collect();
            let _ = self.allocator.decline_offers(&ids, Some(0), now);
            self.allocation_pending = true;
            out.push(err(conn, kind, format!("accept rejected: {message}")));
            return;
        }
        let (Some(agent_id), Some(agent_conn)) = (agent_id, agent_conn) else {
            return;
        };
        // Who may run as whom: the task's user, or the agent's default filled in here (the
        // agent reported it at registration), checked against the principal's ACL.
        let principal = self
            .frameworks
            .get(&fw)
            .map(|f| f.principal.clone())
            .unwrap_or_default();
        let agent_user = self
            .agents
            .get(&agent_id)
            .map(|a| a.task_user.clone())
            .unwrap_or_default();
        let role = offers.first().map(|o| o.role.clone()).unwrap_or_default();

        // 2. Draw each task from the pool of offered resources.
        let mut pool: Vec<OfferResources> = offers.iter().map(|o| o.resources.clone()).collect();
        let offer_list: Vec<OfferId> = offers.iter().map(|o| o.id).collect();
        let mut used: Vec<OfferResources> = vec![OfferResources::default(); offers.len()];
        let mut launches: Vec<(TaskInfo, OfferResources)> = Vec::new();
        let mut seen_ids: HashSet<TaskId> = HashSet::new();
        for op in operations {
            match op {
                Operation::Launch { tasks } => {
                    for task in tasks {
                        let tid = task.task_id;
                        let mut task = task;
                        let invalid = if self.tasks.contains_key(&tid) || !seen_ids.insert(tid) {
                            Some(format!("task id {tid} is already in use"))
                        } else {
                            validate_task(&task)
                        };
                        let invalid = invalid.or_else(|| {
                            let user = task.command.user.get_or_insert_with(|| agent_user.clone());
                            if !crate::acl::valid_user(user) {
                                return Some(format!("task {tid}: invalid user name {user:?}"));
                            }
                            (!self.config.acls.may_run_as(&principal, user)).then(|| {
                                format!(
                                    "task {tid}: principal {principal:?} may not run tasks as user {user:?} (run_tasks ACL)"
                                )
                            })
                        });
                        let invalid = invalid.or_else(|| {
                            let sel = task.gpu_selector.as_ref()?;
                            let want = task.resources.milli("gpus") / gantry_sdk::protocol::resources::MILLI;
                            if want == 0 {
                                return Some(format!("task {tid}: a GPU selector needs gpus"));
                            }
                            let gpus = self.agents.get(&agent_id).map(|a| a.gpus.as_slice()).unwrap_or_default();
                            let matching = gpus.iter().filter(|g| g.healthy && sel.matches(g)).count() as u64;
                            (matching < want).then(|| {
                                format!("task {tid}: the agent has {matching} healthy GPUs matching {sel:?}, the task asks for {want}")
                            })
                        });
                        if let Some(reason) = invalid {
                            self.error_update(
                                conn,
                                fw,
                                &task,
                                ErrorKind::InvalidTask,
                                &reason,
                                now,
                                out,
                            );
                            continue;
                        }
                        match draw(&mut pool, &mut used, &task.resources) {
                            Some(alloc) => launches.push((task, alloc)),
                            None => {
                                let total: Resources = pool
                                    .iter()
                                    .fold(Resources::new(), |acc, p| acc.plus(&p.total()));
                                let reason = format!(
                                    "task {tid} needs {} but the offers have only {total} left",
                                    task.resources
                                );
                                self.error_update(
                                    conn,
                                    fw,
                                    &task,
                                    ErrorKind::InsufficientResources,
                                    &reason,
                                    now,
                                    out,
                                );
                            }
                        }
                    }
                }
                Operation::Reserve { role, resources } => {
                    if let Err(m) = self.reserve_op(
                        fw,
                        agent_id,
                        &role,
                        &resources,
                        &offer_list,
                        &mut pool,
                        true,
                        out,
                    ) {
                        out.push(err(
                            conn,
                            ErrorKind::InvalidRequest,
                            format!("reserve: {m}"),
                        ));
                    }
                }
                Operation::Unreserve { role, resources } => {
                    if let Err(m) = self.reserve_op(
                        fw,
                        agent_id,
                        &role,
                        &resources,
                        &offer_list,
                        &mut pool,
                        false,
                        out,
                    ) {
                        out.push(err(
                            conn,
                            ErrorKind::InvalidRequest,
                            format!("unreserve: {m}"),
                        ));
                    }
                }
            }
        }

        // 3. Settle the offers with the allocator as one accept: used parts stay, the unused
        //    parts return under one filter over their union.
        let parts: Vec<(OfferId, OfferResources)> = offers
            .iter()
            .map(|o| o.id)
            .zip(used.iter().cloned())
            .collect();
        if let Err(e) = self.allocator.accept_offers(&parts, refuse, now) {
            tracing::error!("allocator refused a validated accept: {e}");
        }

        // 4. Launch.
        for (task, allocation) in launches {
            let tid = task.task_id;
            self.tasks.insert(
                tid,
                TaskRec {
                    info: task.clone(),
                    framework: fw,
                    agent: agent_id,
                    state: TaskState::Staging,
                    allocation,
                    recovered: false,
                    pending: None,
                    acked: HashSet::new(),
                    last_message: "launched".into(),
                    usage: None,
                    role: role.clone(),
                    gpus: Vec::new(),
                    reason: None,
                    exit_code: None,
                    signal: None,
                    staged_at: now,
                    started_at: None,
                    ended_at: None,
                },
            );
            if let Some(f) = self.frameworks.get_mut(&fw) {
                f.tasks.insert(tid);
            }
            if let Some(a) = self.agents.get_mut(&agent_id) {
                a.tasks.insert(tid);
            }
            out.push(Output::ToAgent(
                agent_conn,
                MasterToAgent::RunTask {
                    framework_id: fw,
                    task,
                },
            ));
            let staging = self.new_update(
                tid,
                fw,
                Some(agent_id),
                TaskState::Staging,
                "sent to agent".into(),
                now,
            );
            out.push(Output::ToFramework(
                conn,
                MasterToFramework::Update(staging),
            ));
        }
    }

    /// Applies a RESERVE (or UNRESERVE) operation to the accept's pool and the allocator.
    #[allow(clippy::too_many_arguments)]
    fn reserve_op(
        &mut self,
        fw: FrameworkId,
        agent: AgentId,
        role: &str,
        resources: &Resources,
        offer_ids: &[OfferId],
        pool: &mut [OfferResources],
        reserve: bool,
        out: &mut Vec<Output>,
    ) -> Result<(), String> {
        let roles = self
            .frameworks
            .get(&fw)
            .map(|f| f.roles.clone())
            .unwrap_or_default();
        if !roles
            .iter()
            .any(|r| r == role || role.starts_with(&format!("{r}/")))
        {
            return Err(format!(
                "role {role:?} is not one of this framework's roles"
            ));
        }
        if resources.is_empty() {
            return Err("no resources named".into());
        }
        if !reserve {
            let dynamic = self.agents.get(&agent).and_then(|a| a.dynamic.get(role));
            if !dynamic.is_some_and(|d| d.contains(resources)) {
                return Err(format!("{resources} is not dynamically reserved for {role:?} on this agent (static reservations belong to the agent's configuration)"));
            }
        }
        // Find one offer in the pool that holds the source resources.
        for (i, p) in pool.iter_mut().enumerate() {
            let fits = if reserve {
                p.unreserved.contains(resources)
            } else {
                p.reserved.get(role).is_some_and(|r| r.contains(resources))
            };
            if !fits {
                continue;
            }
            let result = if reserve {
                self.allocator.reserve(offer_ids[i], role, resources)
            } else {
                self.allocator.unreserve(offer_ids[i], role, resources)
            };
            result.map_err(|e: AllocError| e.to_string())?;
            if reserve {
                p.unreserved.checked_sub_assign(resources);
                p.reserved
                    .entry(role.to_string())
                    .or_default()
                    .add_assign(resources);
            } else {
                if let Some(r) = p.reserved.get_mut(role) {
                    r.checked_sub_assign(resources);
                    if r.is_empty() {
                        p.reserved.remove(role);
                    }
                }
                p.unreserved.add_assign(resources);
            }
            if let Some(a) = self.agents.get_mut(&agent) {
                if reserve {
                    a.resources = a.resources.saturating_sub(resources);
                    a.reserved
                        .entry(role.to_string())
                        .or_default()
                        .add_assign(resources);
                    a.dynamic
                        .entry(role.to_string())
                        .or_default()
                        .add_assign(resources);
                } else {
                    for map in [&mut a.reserved, &mut a.dynamic] {
                        if let Some(r) = map.get_mut(role) {
                            *r = r.saturating_sub(resources);
                            if r.is_empty() {
                                map.remove(role);
                            }
                        }
                    }
                    a.resources.add_assign(resources);
                }
                let now_reserved = a.dynamic.get(role).cloned().unwrap_or_default();
                out.push(Output::Persist(Mutation::SetReservation(Reservation {
                    agent_id: agent,
                    role: role.to_string(),
                    resources: now_reserved,
                })));
            }
            if !reserve {
                self.forget_role(role);
            }
            return Ok(());
        }
        Err(format!(
            "{resources} is not available {} in the offers",
            if reserve { "unreserved" } else { "reserved" }
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn error_update(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        task: &TaskInfo,
        kind: ErrorKind,
        reason: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        out.push(err(conn, kind, reason.to_string()));
        let mut update = self.new_update(
            task.task_id,
            fw,
            None,
            TaskState::Error,
            reason.to_string(),
            now,
        );
        update.reason = Some(TaskReason::InvalidTask);
        out.push(Output::ToFramework(conn, MasterToFramework::Update(update)));
    }

    // -----------------------------------------------------------------------------------------
    // Timers

    fn tick(&mut self, now: Millis, out: &mut Vec<Output>) {
        // Agents from the registry that never came back after a failover are forgotten.
        let gone: Vec<AgentId> = self
            .recovered_agents
            .iter()
            .filter(|(_, (_, _, deadline))| now > *deadline)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some((rec, dynamic, _)) = self.recovered_agents.remove(&id) {
                if self.recovered_by_name.get(&rec.name) == Some(&id) {
                    self.recovered_by_name.remove(&rec.name);
                }
                tracing::warn!(agent = %rec.name, "agent did not re-register after failover; removed");
                for role in dynamic.keys() {
                    out.push(Output::Persist(Mutation::RemoveReservation {
                        agent_id: id,
                        role: role.clone(),
                    }));
                }
                out.push(Output::Persist(Mutation::RemoveAgent(id)));
            }
        }
        // Silent agents are disconnected.
        let silent: Vec<(AgentId, ConnId)> = self
            .agents
            .values()
            .filter_map(|a| {
                a.conn
                    .filter(|_| now.saturating_sub(a.last_seen) > self.config.agent_ping_timeout_ms)
                    .map(|c| (a.id, c))
            })
            .collect();
        for (id, c) in silent {
            self.conns.remove(&c);
            out.push(Output::Close {
                conn: c,
                reason: "agent missed its heartbeats".into(),
            });
            self.agent_disconnected(id, c, now, out);
        }
        // Disconnected agents that did not come back are lost.
        let lost: Vec<AgentId> = self
            .agents
            .values()
            .filter(|a| {
                a.disconnected_at.is_some_and(|t| {
                    now.saturating_sub(t) > self.config.agent_reregister_timeout_ms
                })
            })
            .map(|a| a.id)
            .collect();
        for id in lost {
            self.remove_agent(id, "agent lost: did not re-register in time", now, out);
        }
        // Frameworks past their failover timeout are removed and their tasks killed.
        let expired: Vec<FrameworkId> = self
            .frameworks
            .values()
            .filter(|f| {
                f.disconnected_at
                    .is_some_and(|t| now.saturating_sub(t) > f.failover_timeout_ms)
            })
            .map(|f| f.id)
            .collect();
        for id in expired {
            self.remove_framework(id, "failover timeout expired", now, out);
        }
        for rec in self.allocator.expire_offers(now) {
            self.send_rescind(&rec, out);
        }
    }
}

/// Role names: `eng` or hierarchical `eng/ml`; segments of `[A-Za-z0-9_.-]`, not `.`/`..`.
pub fn valid_role(role: &str) -> bool {
    !role.is_empty()
        && role.len() <= 128
        && role.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        })
}

fn refuse_ms(refuse_seconds: Option<f64>) -> Result<Option<Millis>, String> {
    match refuse_seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => {
            Ok(Some((s.min(365.0 * 86400.0) * 1000.0) as Millis))
        }
        Some(s) => Err(format!("refuse_seconds {s} is not a non-negative number")),
    }
}

/// Why a task is invalid on its own (before looking at offers), if it is.
fn validate_task(task: &TaskInfo) -> Option<String> {
    let tid = task.task_id;
    if task.name.is_empty() || task.name.len() > 256 {
        return Some(format!("task {tid}: name must be 1-256 characters"));
    }
    if let Some(problem) = task.command.problem() {
        return Some(format!("task {tid}: {problem}"));
    }
    if task.resources.milli("cpus") == 0 && task.resources.milli("mem") == 0 {
        return Some(format!("task {tid}: must request some cpus or mem"));
    }
    if !task
        .resources
        .milli("gpus")
        .is_multiple_of(gantry_sdk::protocol::resources::MILLI)
    {
        return Some(format!("task {tid}: gpus must be a whole number"));
    }
    if task
        .env
        .keys()
        .any(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        || task.env.values().any(|v| v.contains('\0'))
    {
        return Some(format!("task {tid}: invalid environment variable"));
    }
    None
}

/// Takes `need` out of the pool of offers (reserved parts first, then unreserved), recording
/// per-offer use. Returns what the task holds, or `None` (pool untouched) if it does not fit.
fn draw(
    pool: &mut [OfferResources],
    used: &mut [OfferResources],
    need: &Resources,
) -> Option<OfferResources> {
    let total = pool
        .iter()
        .fold(Resources::new(), |acc, p| acc.plus(&p.total()));
    if !total.contains(need) {
        return None;
    }
    let mut remaining = need.clone();
    let mut holding = OfferResources::default();
    for (p, u) in pool.iter_mut().zip(used.iter_mut()) {
        let roles: Vec<String> = p.reserved.keys().cloned().collect();
        for role in roles {
            let Some(avail) = p.reserved.get_mut(&role) else {
                continue;
            };
            let take = avail.elementwise_min(&remaining);
            if take.is_empty() {
                continue;
            }
            avail.checked_sub_assign(&take);
            if avail.is_empty() {
                p.reserved.remove(&role);
            }
            remaining = remaining.saturating_sub(&take);
            u.reserved
                .entry(role.clone())
                .or_default()
                .add_assign(&take);
            holding.reserved.entry(role).or_default().add_assign(&take);
        }
        let take = p.unreserved.elementwise_min(&remaining);
        if !take.is_empty() {
            p.unreserved.checked_sub_assign(&take);
            remaining = remaining.saturating_sub(&take);
            u.unreserved.add_assign(&take);
            holding.unreserved.add_assign(&take);
        }
        if remaining.is_empty() {
            break;
        }
    }
    Some(holding)
}

#[cfg(test)]
mod bounded_tests;
#[cfg(test)]
mod tests;

/// Smallest and largest role weight an operator may set (shares are divided by the weight; the
/// bounds keep them finite and comparable).
pub const MIN_WEIGHT: f64 = 0.001;
pub const MAX_WEIGHT: f64 = 1_000_000.0;
/// Resource kinds one quota guarantee or limit may name.
pub const MAX_QUOTA_KINDS: usize = 32;
/// Largest amount of one resource in a quota, in milli-units (10^12 units).
pub const MAX_QUOTA_MILLI: u64 = 1_000_000_000_000_000;

/// An operator request (HTTP API / `gantryctl`).
#[derive(Debug, Clone, PartialEq)]
pub enum OperatorCommand {
    SetWeight {
        role: String,
        weight: f64,
    },
    /// Replaces the role's quota; `None` parts are removed.
    SetQuota {
        role: String,
        guarantee: Option<Resources>,
        /// Kinds named with zero are limited to zero.
        limit: Option<ResourceLimits>,
    },
}

impl Master {
    /// Applies an operator command. Weights and quotas take effect at the next batch
    /// allocation (as in Mesos).
    pub fn operator(&mut self, cmd: OperatorCommand) -> Result<Vec<Output>, String> {
        match cmd {
            OperatorCommand::SetWeight { role, weight } => {
                self.config.limits.check_role(&role)?;
                if !(weight.is_finite() && (MIN_WEIGHT..=MAX_WEIGHT).contains(&weight)) {
                    return Err(format!(
                        "weight must be a positive number from {MIN_WEIGHT} to {MAX_WEIGHT}, not {weight}"
                    ));
                }
                tracing::info!(%role, weight, "role weight set");
                self.allocator.set_weight(&role, weight);
                if weight == 1.0 {
                    // Back to the default: a role kept only by its weight is unused now.
                    self.forget_role(&role);
                }
                Ok(vec![Output::Persist(Mutation::SetWeight { role, weight })])
            }
            OperatorCommand::SetQuota {
                role,
                guarantee,
                limit,
            } => {
                self.config.limits.check_role(&role)?;
                let parts: [(&str, Vec<(&str, u64)>); 2] = [
                    (
                        "guarantee",
                        guarantee.iter().flat_map(|g| g.iter()).collect(),
                    ),
                    ("limit", limit.iter().flat_map(|l| l.iter()).collect()),
                ];
                for (part, r) in parts {
                    if r.len() > MAX_QUOTA_KINDS {
                        return Err(format!(
                            "a quota {part} names at most {MAX_QUOTA_KINDS} resource kinds"
                        ));
                    }
                    if let Some((name, _)) = r.iter().find(|(_, milli)| *milli > MAX_QUOTA_MILLI) {
                        return Err(format!(
                            "quota {part} of {name} exceeds {} units",
                            MAX_QUOTA_MILLI / 1000
                        ));
                    }
                }
                if let (Some(g), Some(l)) = (&guarantee, &limit) {
                    if let Some(name) = g
                        .names()
                        .find(|n| l.limit(n).is_some_and(|max| g.milli(n) > max))
                    {
                        return Err(format!("quota guarantee of {name} exceeds its limit"));
                    }
                }
                // Refused (nothing changes) when guarantees would not nest.
                self.allocator
                    .set_quota(&role, guarantee.clone(), limit.clone())
                    .map_err(|e| e.to_string())?;
                tracing::info!(%role, ?guarantee, ?limit, "role quota set");
                if guarantee.is_none() && limit.is_none() {
                    self.forget_role(&role);
                }
                let m = if guarantee.is_none() && limit.is_none() {
                    Mutation::RemoveQuota { role }
                } else {
                    Mutation::SetQuota {
                        role,
                        quota: Quota {
                            guarantee: guarantee.unwrap_or_default(),
                            limit: limit.unwrap_or_default(),
                        },
                    }
                };
                Ok(vec![Output::Persist(m)])
            }
        }
    }
}

/// Moves an agent's dynamic reservations out of its unreserved resources into `reserved`.
fn with_dynamic(
    mut resources: Resources,
    mut reserved: BTreeMap<String, Resources>,
    dynamic: &BTreeMap<String, Resources>,
) -> (Resources, BTreeMap<String, Resources>) {
    for (role, r) in dynamic {
        let take = resources.elementwise_min(r);
        resources = resources.saturating_sub(&take);
        reserved.entry(role.clone()).or_default().add_assign(&take);
    }
    (resources, reserved)
}

impl Master {
    /// Restores the persistent registry when this master becomes the leader: frameworks (as
    /// disconnected, so their failover timeouts run from now), weights, quotas, and the agents
    /// expected to re-register (with their dynamic reservations) within the re-register
    /// timeout. Tasks are rebuilt from the agents' re-registrations.
    pub fn recover(&mut self, registry: Registry, now: Millis) {
        for (role, weight) in &registry.weights {
            self.allocator.set_weight(role, *weight);
        }
        for (role, q) in &registry.quotas {
            let g = Some(q.guarantee.clone()).filter(|g| !g.is_empty());
            let l = Some(q.limit.clone()).filter(|l| !l.is_empty());
            if let Err(e) = self.allocator.set_quota(role, g, l) {
                tracing::error!(%role, "persisted quota not applied: {e}");
            }
        }
        for f in registry.frameworks.values() {
            let gpu = false;
            self.allocator
                .add_framework(f.id, &f.name, &f.roles, gpu, None);
            self.allocator.suppress(f.id, None);
            self.frameworks.insert(
                f.id,
                FrameworkRec {
                    id: f.id,
                    name: f.name.clone(),
                    principal: f.principal.clone(),
                    roles: f.roles.clone(),
                    capabilities: Vec::new(),
                    failover_timeout_ms: (f.failover_timeout_secs.clamp(0.0, 365.0 * 86400.0)
                        * 1000.0) as u64,
                    conn: None,
                    disconnected_at: Some(now),
                    tasks: HashSet::new(),
                },
            );
        }
        let deadline = now + self.config.agent_reregister_timeout_ms;
        for a in registry.agents.values() {
            let dynamic = registry
                .reservations
                .get(&a.id)
                .cloned()
                .unwrap_or_default();
            self.recovered_by_name.insert(a.name.clone(), a.id);
            self.recovered_agents
                .insert(a.id, (a.clone(), dynamic, deadline));
        }
        tracing::info!(
            frameworks = registry.frameworks.len(),
            agents = registry.agents.len(),
            weights = registry.weights.len(),
            quotas = registry.quotas.len(),
            "recovered the registry; waiting for agents to re-register"
        );
    }
}
