//! Typed rejections: why the core refuses a role name, a subscription, a task, a reservation or
//! an operator command. Each one's `Display` is the text the peer or operator receives (and
//! tests look for), so callers format them and nothing else builds those messages. The role
//! name's and the run-as policy's are security's (`RoleRejection`, re-exported here, and
//! `security::RunAsRejection`).

use gantry_proto::{FrameworkId, Resources, TaskId};

use super::operator::{MAX_QUOTA_KINDS, MAX_QUOTA_MILLI, MAX_WEIGHT, MIN_WEIGHT};
use crate::allocator::AllocError;

pub use crate::security::RoleRejection;

/// Minimum allocatable quantities a framework may list, and kinds in each.
pub const MAX_MIN_ALLOCATABLE: usize = 16;

/// Why a framework may not subscribe (`Master::check_subscribe`); the framework hears
/// the text, then its connection closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeRejection {
    #[error("framework name must be 1-256 characters")]
    Name,
    #[error("failover timeout must be a non-negative number of seconds")]
    FailoverTimeout,
    #[error("a framework needs at least one role")]
    NoRole,
    #[error(
        "{count} minimum allocatable quantities; at most {max}, each of at most {max} kinds",
        max = MAX_MIN_ALLOCATABLE
    )]
    MinAllocatable { count: usize },
    #[error("{count} roles in one subscription; the limit is {limit} per framework")]
    TooManyRoles { count: usize, limit: usize },
    #[error("suppressed role {0:?} is not one of the roles the framework subscribes with")]
    SuppressedRole(String),
    #[error("{count} suppressed roles for a framework of {roles} roles")]
    TooManySuppressedRoles { count: usize, roles: usize },
    #[error(transparent)]
    Role(#[from] RoleRejection),
    #[error(
        "principal {principal:?} is not allowed to subscribe with role {role:?} (ACL register_frameworks)"
    )]
    RoleNotAllowed { principal: String, role: String },
    #[error(
        "framework id {0} is not registered with this master (removed after its failover timeout, or never issued); subscribe without an id to register a new framework"
    )]
    UnknownId(FrameworkId),
    #[error(
        "framework id {id} belongs to another principal; principal {principal:?} may not resume it"
    )]
    OtherPrincipal { id: FrameworkId, principal: String },
    #[error("framework {id} would hold {count} roles; the limit is {limit} per framework")]
    WouldHoldTooManyRoles {
        id: FrameworkId,
        count: usize,
        limit: usize,
    },
    #[error(
        "principal {principal:?} already has {count} frameworks registered; the limit is {limit} (frameworks that disconnected count until their failover timeout ends)"
    )]
    TooManyFrameworks {
        principal: String,
        count: usize,
        limit: usize,
    },
}

/// Why a task is invalid on its own, before any offer is looked at
/// (`accept::validate_task`); the task ends `ERROR` with the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskRejection {
    #[error("task {0}: name must be 1-256 characters")]
    Name(TaskId),
    #[error("task {task}: {problem}")]
    Command { task: TaskId, problem: String },
    #[error("task {0}: must request some cpus or mem")]
    NoCpusOrMem(TaskId),
    #[error("task {0}: {1}")]
    FractionalGpus(TaskId, gantry_proto::BadGpuAmount),
    #[error("task {0}: invalid environment variable")]
    Environment(TaskId),
    #[error("task {0}: ports are counted in whole ports (ports:K asks for K host ports)")]
    FractionalPorts(TaskId),
    #[error("task {task}: container: {problem}")]
    Container { task: TaskId, problem: String },
}

/// Why a RESERVE or UNRESERVE operation was not applied (`Master::reserve_op`); the
/// framework hears `reserve: TEXT` / `unreserve: TEXT`.
#[derive(Debug, thiserror::Error)]
pub enum ReservationRejection {
    #[error("role {0:?} is not one of this framework's roles")]
    NotFrameworkRole(String),
    #[error("no resources named")]
    NoResources,
    #[error(
        "{resources} is not dynamically reserved for {role:?} on this agent (static reservations belong to the agent's configuration)"
    )]
    NotDynamicallyReserved { resources: Resources, role: String },
    #[error(transparent)]
    Allocator(#[from] AllocError),
    #[error("{resources} is not available {} in the offers", side(.reserve))]
    NotInOffers { resources: Resources, reserve: bool },
}

/// Why an operator command was refused ([`super::Master::operator_at`]); the HTTP API answers
/// with the text and a status by kind (400 bad value, 404 not found, 409 conflict, 503 not the
/// leader or not recorded).
#[derive(Debug, thiserror::Error)]
pub enum OperatorRejection {
    #[error(transparent)]
    Role(#[from] RoleRejection),
    #[error("weight must be a positive number from {min} to {max}, not {0}", min = MIN_WEIGHT, max = MAX_WEIGHT)]
    Weight(f64),
    #[error("a quota {0} names at most {max} resource kinds", max = MAX_QUOTA_KINDS)]
    QuotaKinds(&'static str),
    #[error("quota {part} of {name} exceeds {units} units", units = MAX_QUOTA_MILLI / 1000)]
    QuotaAmount { part: &'static str, name: String },
    #[error("quota guarantee of {0} exceeds its limit")]
    GuaranteeOverLimit(String),
    /// A quota or reservation naming a resource kind the cluster does not know.
    #[error("unknown resource kind {name:?} in the {part}; the cluster knows: {known} (declare others with --resource-kinds)")]
    UnknownResourceKind {
        part: &'static str,
        name: String,
        known: String,
    },
    /// Guarantees that would not nest (the allocator refuses them; nothing changes).
    #[error(transparent)]
    Allocator(#[from] AllocError),
    /// The command reached a master that does not lead (the shell answers it).
    #[error("this master is not the leader")]
    NotLeader,
    /// Not valid for another reason (HTTP 400).
    #[error("{0}")]
    Invalid(String),
    /// It names an agent, framework or GPU the master does not know (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// It does not apply in the current state (HTTP 409): reserving what tasks hold, clearing
    /// a healthy GPU.
    #[error("{0}")]
    Conflict(String),
    /// Applied, but the registry did not record it: it may not survive a restart (HTTP 503).
    #[error("the change could not be recorded in the registry: {0}")]
    NotPersisted(String),
}

/// Where a RESERVE takes from (unreserved) and an UNRESERVE from (reserved).
fn side(reserve: &bool) -> &'static str {
    if *reserve {
        "unreserved"
    } else {
        "reserved"
    }
}
