//! The public wire protocol: identifiers, resources, messages and the codec.
//!
//! - [`ids`]: uuid newtypes (`FrameworkId`, `AgentId`, `OfferId`, `TaskId`, `UpdateId`).
//! - [`resources`]: [`Resources`], named scalars in exact milli-units; [`ResourceLimits`], upper
//!   bounds per kind that keep explicit zeros (quota limits).
//! - [`messages`]: every message agents, frameworks and masters exchange.
//! - [`codec`]: bounded, length-prefixed bincode frames; the only module that encodes.

pub mod codec;
pub mod ids;
pub mod messages;
pub mod resources;

pub use ids::*;
pub use messages::*;
pub use resources::{ResourceLimits, ResourceParseError, Resources};
