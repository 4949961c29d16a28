//! What the agent has to offer: host CPUs, memory and disk ([`host`]) and NVIDIA GPUs through
//! NVML ([`nvml`]), plus the NVML health watcher.

pub mod host;
pub mod nvml;

pub use host::{HostResources, ResourceOverrideError};
pub use nvml::{
    DiscoveredGpu, GpuInventory, GpuProcess, HealthWatcher, NvmlGpus, DEFAULT_NVML_LIB,
};
