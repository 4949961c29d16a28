//! # gantry-agent
pub mod discovery;
pub mod gpu;
pub mod isolation;
