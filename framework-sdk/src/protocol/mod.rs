//! The public wire protocol: identifiers, resources, messages and the codec.
//!
//! - [`ids`]: uuid newtypes (`FrameworkId`, `AgentId`, `OfferId`, `TaskId`, `UpdateId`).
//! - [`resources`]: [`Resources`], named scalars in exact milli-units; [`ResourceLimits`], upper
//!   bounds per kind that keep explicit zeros (quota limits).
//! - [`messages`]: every message agents, frameworks and masters exchange, and the bounds on
//!   them (`MAX_RECONCILE_IDS`, [`register_limits`]).
//! - [`codec`]: bounded, length-prefixed bincode frames; the only module that encodes. It also
//!   sizes messages in advance and splits list-carrying ones under the bound
//!   ([`codec::split_batches`]), and reads untrusted peers under a body deadline and a shared
//!   budget ([`codec::read_frame_limited`]).

pub mod codec;
pub mod ids;
pub mod messages;
pub mod resources;

pub use ids::*;
pub use messages::*;
pub use resources::{ResourceLimits, ResourceParseError, Resources};
