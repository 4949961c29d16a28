//! # gantry-sdk
//!
//! The async client framework authors write schedulers with, and the public protocol it
//! speaks. Crate graph: `gantry-proto` (messages, codec; no I/O) <- `gantry-transport` (QUIC,
//! mutual TLS, the masters list) <- `gantry-sdk`. The certificate authority (`gantry-pki`) and
//! the master's server endpoint are not in this crate's dependency tree: a framework's
//! certificate is issued by `gantryctl certs framework NAME` (or, in development, by the
//! binary with `gantry_pki::load_or_issue`, as the `batch` example does).
//!
//! - [`protocol`]: message types, ids, [`protocol::Resources`] and the codec (re-exported from
//!   `gantry-proto`; [`protocol::codec`] adds the async frame I/O of
//!   `gantry_transport::framing`).
//! - [`transport`]: `gantry-transport` re-exported: QUIC endpoints with mutual TLS, the TLS
//!   directory convention, the masters list.
//! - [`book`]: [`book::TaskBook`], the framework's table of its tasks kept from launches and
//!   status updates (pure, idempotent).
//! - [`group`]: atomic task groups on one agent ([`group::TaskGroup`],
//!   [`DriverHandle::launch_group`]) and [`group::place_group`], which finds one agent whose
//!   offers hold the whole group.
//! - [`attempts`]: [`attempts::AttemptsBook`], the attempts of logical units of work
//!   (retries with backoff, a failure limit, which losses count; pure).
//! - [`backoff`]: exponential backoff helpers ([`backoff::RestartBackoff`] per key).
//! - [`reconcile`]: built-in reconciliation on re-subscription and periodically
//!   ([`DriverConfig::reconcile`]).
//! - [`config_file`]: `--config FILE` (TOML mirroring the flags) for every Gantry binary
//!   (re-exported from `gantry-cli`).
//! - [`placement`]: the `gantry-placement` crate re-exported: fragmentation-aware GPU placement
//!   (pure): `fgd-pack`, `fgd`, `best-fit`,
//!   `random`, shared by schedulers and the master's `simulate --openb` replay; and the
//!   offer-level building blocks [`placement::offers`] (fit tasks into held offers: selectors,
//!   attributes, NUMA locality), [`placement::gang`] (all-or-nothing gangs, elastic
//!   `min..max`, which gang may hold offers) and [`placement::request`] (several shapes placed
//!   together, all or nothing: `strict_pack` on one agent, `spread` per agent or per attribute
//!   value such as `rack`).
//! - [`process`]: shutdown on SIGINT or SIGTERM (re-exported from `gantry-cli`).
//! - [`timers`]: one-shot and periodic timers ([`DriverHandle::after`], [`DriverHandle::every`])
//!   and the framework's own events ([`DriverHandle::notify`]), delivered as
//!   [`Scheduler::wake`] in order with the master's messages.
//! - Unit tests of a scheduler: the `gantry-sdk-testkit` crate (framework-sdk/testkit, a
//!   dev-dependency) runs it in the real [`Driver`] against a scripted in-process master that
//!   sends offers, updates, rescinds, errors and failovers and reads back what it sent.
//! - `driver_core` (private): the driver's decision logic, pure (deduplication, implicit and
//!   explicit acknowledgements, kill retries, requests held while disconnected,
//!   reconciliation, timers: inputs and the time in, effects out), unit-tested without
//!   sockets; [`Driver`] is its async shell.
//! - [`scheduler`]: the [`Scheduler`] trait (with the [`Scheduler::drain_notice`] callback for
//!   agents drained for maintenance) and the [`Driver`] that runs it against a master.

#![warn(missing_docs)]

pub mod attempts;
pub mod backoff;
pub mod book;
mod driver_core;
pub mod group;
/// `--config FILE` for every Gantry binary: `gantry-cli`'s module re-exported.
pub mod config_file {
    pub use gantry_cli::config_file::*;
}
/// Shutdown on SIGINT or SIGTERM: `gantry-cli`'s module re-exported.
pub mod process {
    pub use gantry_cli::process::*;
}
pub mod reconcile;
pub mod scheduler;
pub mod timers;

/// The wire protocol: `gantry-proto` re-exported, so `gantry_sdk::protocol::...` paths work.
pub mod protocol {
    pub use gantry_proto::*;

    /// The codec (`gantry_proto::codec`) and the async frame I/O on top of it
    /// (`gantry_transport::framing`) under one path.
    pub mod codec {
        pub use gantry_proto::codec::*;
        pub use gantry_transport::framing::*;
    }
}

/// Placement (pure): `gantry-placement` re-exported, so `gantry_sdk::placement::...` paths work.
pub mod placement {
    pub use gantry_placement::*;
}

/// QUIC and mutual TLS: `gantry-transport` re-exported, so `gantry_sdk::transport::...` paths
/// work.
pub mod transport {
    pub use gantry_transport::*;
}

/// The framework guide (docs/framework-guide.md): included only when doctests are built, so
/// every Rust example in it is compiled by `cargo test` and stays in step with the API.
#[cfg(doctest)]
#[doc = include_str!("../../docs/framework-guide.md")]
pub struct FrameworkGuide;

pub use protocol::Resources;
pub use scheduler::{Driver, DriverConfig, DriverHandle, Scheduler};
pub use timers::TimerId;
