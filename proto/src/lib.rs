//! # gantry-proto
//!
//! Gantry's wire protocol with no I/O: identifiers, resources, messages and the codec. It
//! depends on serde, bincode, uuid and thiserror only (no tokio, no quinn), so anything that
//! needs the message types (the master's pure core, the simulator, a tool reading recorded
//! frames) compiles without a runtime. `gantry_transport` moves the frames over QUIC;
//! `gantry_sdk::protocol` re-exports this crate for framework authors.
//!
//! - [`ids`]: uuid newtypes (`FrameworkId`, `AgentId`, `OfferId`, `TaskId`, `UpdateId`).
//! - [`resources`]: [`Resources`], named scalars in exact milli-units; [`ResourceLimits`], upper
//!   bounds per kind that keep explicit zeros (quota limits).
//! - [`messages`]: every message agents, frameworks and masters exchange, and the bounds on
//!   them (`MAX_RECONCILE_IDS`, [`register_limits`]).
//! - [`codec`]: bounded, length-prefixed bincode frames; the only module that encodes. It also
//!   sizes messages in advance and splits list-carrying ones under the bound
//!   ([`codec::split_batches`]) and checks a frame's length prefix before its body is read
//!   ([`codec::frame_len`]).

#![warn(missing_docs)]

pub mod codec;
pub mod ids;
pub mod messages;
pub mod resources;

pub use ids::*;
pub use messages::*;
pub use resources::{BadGpuAmount, GpuAmount, ResourceLimits, ResourceParseError, Resources};
