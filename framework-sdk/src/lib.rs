//! # gantry-sdk
//!
//! The public protocol of Gantry and the async client framework authors write schedulers with.
//!
//! - [`protocol`]: message types, ids, [`protocol::Resources`] and the codec (one module owns
//!   encoding).
//! - [`transport`]: QUIC endpoints with mutual TLS (rustls, `ring` provider), certificate
//!   issuing for the dev `--tls-dir` convention and for `gantryctl certs`, and framing.
//! - [`config_file`]: `--config FILE` (TOML mirroring the flags) for every Gantry binary.
//! - [`placement`]: fragmentation-aware GPU placement (pure): `fgd-pack`, `fgd`, `best-fit`,
//!   `random`, shared by schedulers and the master's `simulate --openb` replay.
//! - [`process`]: shutdown on SIGINT or SIGTERM.
//! - [`scheduler`]: the [`Scheduler`] trait and the [`Driver`] that runs it against a master.

pub mod config_file;
pub mod placement;
pub mod process;
pub mod protocol;
pub mod scheduler;
pub mod transport;

pub use protocol::Resources;
pub use scheduler::{Driver, DriverConfig, DriverHandle, Scheduler};
