//! Harness for cluster tests over real sockets: starts real `gantry-master` and `gantry-agent`
//! processes on free loopback ports in a temporary directory, reads the master's `/state`, and
//! cleans up every process (including task supervisors and task process groups) on drop.
//!
//! The binaries are taken from the cargo target directory next to the test executable; build
//! them first with `cargo build --workspace --bins` (the README's test command does).
//!
//! Modules, by what they start (everything is re-exported at the crate root):
//! - [`processes`]: temporary directories, the binaries, free ports, child processes.
//! - [`cluster`]: master and agent processes, a [`Cluster`] of them, the operator HTTPS API.
//! - [`frameworks`]: frameworks run in-process (batch, a recording scheduler), their configs.
//! - [`cgroups`]: real cgroups for the isolation tests.
//! - [`standin`]: the stand-in NVML library for GPU tests.
//! - [`emu`], [`load`]: emulated agents and frameworks over real QUIC (the `gantry-load`
//!   harness and the HA benchmarks).
//! - [`soak`]: the fault-injection soak's framework, fault schedule, ledger and report.
//! - [`etcd`], [`proxy`]: a real etcd server and a cuttable TCP proxy, from the dev-only
//!   `gantry-test-support` crate (shared with `gantry-master`'s own tests).

pub mod cgroups;
pub mod cluster;
pub mod emu;
pub mod frameworks;
pub mod load;
pub mod processes;
pub mod soak;
pub mod standin;

pub use gantry_test_support::{etcd, proxy};

pub use cgroups::*;
pub use cluster::*;
pub use frameworks::*;
pub use processes::*;
pub use standin::*;
