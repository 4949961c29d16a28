//! Persistent volumes (protocol v12): listing and destroying a framework's persistent volumes
//! (`Volume::persistent`, docs/containers.md "Volumes") through the master.
//!
//! - A framework destroys one of its own volumes on an agent with
//!   [`FrameworkToMaster::DestroyVolume`](super::FrameworkToMaster::DestroyVolume) and hears
//!   the outcome in [`MasterToFramework::VolumeDestroyed`](super::MasterToFramework::VolumeDestroyed)
//!   ([`VolumeDestroyed`]). It names only the volume: the master fills in the framework from
//!   the connection, so a framework cannot name another framework's volume.
//! - The master asks the agent on a sandbox stream of its connection (protocol v9's stream,
//!   [`SandboxRequest::Volume`](super::SandboxRequest::Volume)) with a [`VolumeRequest`]; the
//!   agent answers one [`SandboxReply::Volume`](super::SandboxReply::Volume) with a
//!   [`VolumeReply`] and finishes the stream. Operators reach the same requests through the
//!   HTTPS API (`GET /api/v1/agents/{id}/volumes`, `DELETE
//!   /api/v1/agents/{id}/volumes/{framework}/{name}`).
//!
//! The agent refuses to destroy a volume a container on it mounts ([`VolumeOutcome::InUse`]
//! with the tasks); names follow the protocol's rule (1 to 64 bytes of `A-Z a-z 0-9 . _ -`,
//! not starting with `.`).

use serde::{Deserialize, Serialize};

use super::super::ids::AgentId;

/// The most volumes one [`VolumeReply::List`] carries (the rest are counted in `total`).
pub const MAX_VOLUMES_LISTED: usize = 1000;

/// What the master asks of an agent about its persistent volumes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum VolumeRequest {
    /// Every persistent volume on the agent, sorted by framework and name. Answered by
    /// [`VolumeReply::List`].
    List,
    /// Remove `framework`'s volume `name` and its data unless a container mounts it.
    /// Answered by [`VolumeReply::Destroy`].
    Destroy {
        /// The framework id that owns the volume (its directory's name).
        framework: String,
        /// The volume's name.
        name: String,
        /// Who asked (`operator:NAME` / `framework:PRINCIPAL`), for the agent's log.
        principal: String,
    },
}

/// One persistent volume on an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeInfo {
    /// The framework id that owns it.
    pub framework: String,
    /// Its name.
    pub name: String,
    /// Where it is on the agent.
    pub path: String,
    /// The tasks whose containers mount it now, sorted.
    pub used_by: Vec<String>,
}

/// What became of a destroy request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeOutcome {
    /// The volume and its data are gone.
    Destroyed,
    /// There was no such volume (never created, or destroyed before).
    NotFound,
    /// Containers on the agent mount it: nothing was removed.
    InUse {
        /// Their tasks, sorted.
        tasks: Vec<String>,
    },
    /// Refused or failed (a bad name, an I/O error, the agent not connected), in words.
    Failed(String),
}

impl VolumeOutcome {
    /// The outcome in words (for logs and errors).
    pub fn describe(&self, framework: &str, name: &str) -> String {
        match self {
            VolumeOutcome::Destroyed => format!("persistent volume {framework}/{name} destroyed"),
            VolumeOutcome::NotFound => format!("no persistent volume {framework}/{name}"),
            VolumeOutcome::InUse { tasks } => format!(
                "persistent volume {framework}/{name} is in use by task(s) {}",
                tasks.join(", ")
            ),
            VolumeOutcome::Failed(why) => why.clone(),
        }
    }
}

/// What an agent answers to a [`VolumeRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum VolumeReply {
    /// The volumes (at most [`MAX_VOLUMES_LISTED`]).
    List {
        /// The volumes, by framework and name.
        volumes: Vec<VolumeInfo>,
        /// Volumes on the agent in all.
        total: u32,
    },
    /// The outcome of a destroy.
    Destroy(VolumeOutcome),
}

/// The answer to a framework's [`FrameworkToMaster::DestroyVolume`](super::FrameworkToMaster::DestroyVolume).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDestroyed {
    /// The agent named in the request.
    pub agent_id: AgentId,
    /// The volume named in the request.
    pub name: String,
    /// What became of it.
    pub outcome: VolumeOutcome,
}
