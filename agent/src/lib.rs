//! # gantry-agent
