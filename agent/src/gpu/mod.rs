//! GPU policy, all pure: topology-aware assignment ([`assign`]), health ([`health`]) and
//! attribution of NVML-measured usage to tasks ([`usage`]).

pub mod assign;
pub mod health;
pub mod usage;

pub use assign::{assign, GpuSlot};
pub use health::{FaultKind, GpuFault, HealthChange, HealthTracker};
pub use usage::{attribute, GpuTaskUsage};
