//! Every message that crosses the wire, by family. Agents and frameworks each speak over one
//! bidirectional QUIC stream to the master: the first frame is a [`Hello`], the master answers
//! with its [`MasterRole`] (a standby keeps the stream open and sends `Leading` when it is
//! elected), then [`AgentToMaster`] / [`MasterToAgent`] or [`FrameworkToMaster`] /
//! [`MasterToFramework`] frames follow. Read in the order a session uses them:
//!
//! - [`hello`]: [`Hello`], [`MasterRole`], [`PeerKind`], and [`PROTOCOL_VERSION`] (here);
//! - [`task`]: what a task is and how its state is reported, shared by both families below;
//!   [`container`]: a task's container (image, network, volumes); [`group`]: tasks launched
//!   together, all or none;
//! - [`gpu`]: GPUs as measured and as offered;
//! - [`agent`]: agent <-> master;
//! - [`framework`]: framework <-> master;
//! - [`sandbox`]: a task's sandbox (logs, files, exec), master -> agent on streams of their own;
//! - [`volume`]: persistent volumes listed and destroyed (v12), on the sandbox streams and the
//!   framework's stream.
//!
//! Operators do not use this wire: the operator API is HTTPS with JSON (`gantry-master`'s
//! `server::api`). Every type is re-exported here, so `gantry_proto::TaskInfo` and
//! `gantry_proto::messages::TaskInfo` name the same thing; where a type lives changes nothing
//! on the wire (bincode encodes fields by position: `tests/wire.rs` pins the bytes).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ids::{AgentId, FrameworkId, OfferId, TaskId, UpdateId};
use super::resources::Resources;

pub mod agent;
pub mod container;
pub mod framework;
pub mod gpu;
pub mod group;
pub mod hello;
pub mod sandbox;
pub mod task;
pub mod volume;

pub use agent::*;
pub use container::*;
pub use framework::*;
pub use gpu::*;
pub use group::*;
pub use hello::*;
pub use sandbox::*;
pub use task::*;
pub use volume::*;

/// Bumped on any incompatible change; checked in the [`Hello`] and by ALPN.
pub const PROTOCOL_VERSION: u32 = 14;
