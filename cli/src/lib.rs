//! # gantry-cli
//!
//! What every Gantry binary (master, agent, `gantryctl`, the example frameworks, the load
//! generator) shares at its command line; no Gantry crate below it.
//!
//! - [`config_file`]: `--config FILE`, a TOML file whose keys mirror the command-line flags.
//! - [`process`]: shutdown on SIGINT or SIGTERM.
//!
//! `gantry-sdk` re-exports both under their old paths (`gantry_sdk::config_file`,
//! `gantry_sdk::process`).

#![warn(missing_docs)]

pub mod config_file;
pub mod process;
