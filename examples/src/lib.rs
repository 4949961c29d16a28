//! Example Gantry frameworks, built only on `gantry-sdk`.
//!
//! - [`batch`]: run N copies of a command and report how they ended (binary `batch`).

pub mod batch;
