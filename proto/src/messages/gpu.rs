//! GPUs as agents measure them ([`GpuInfo`]) and as offers show what is left of them
//! ([`GpuFree`]).

use super::*;

/// One physical GPU as measured by the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML uuid (`GPU-...`): the stable identity of the device.
    pub uuid: String,
    /// Model name (`NVIDIA A100-SXM4-80GB`).
    pub name: String,
    /// Total device memory, MiB.
    pub memory_mib: u64,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// The device minor number (`/dev/nvidiaN`).
    pub minor: u32,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// The NUMA node the device is attached to, when known.
    pub numa_node: Option<u32>,
    /// False after an XID error or a failed health check: not offered.
    pub healthy: bool,
    /// Set on a MIG device (a slice of a GPU in MIG mode): its profile, e.g. `1g.10gb`. The
    /// slice is offered as one GPU whose `uuid` is the MIG UUID (`MIG-...`); only tasks whose
    /// [`GpuSelector::mig_profile`] names the profile get it.
    #[serde(default)]
    pub mig_profile: Option<String>,
    /// For a MIG device, the UUID of the physical GPU it is carved from.
    #[serde(default)]
    pub parent_uuid: Option<String>,
    /// The PCI root (host bridge and root port) the device hangs off, when sysfs shows it:
    /// GPUs under one root talk fastest. The master groups GPUs by NUMA node and PCI root
    /// when it chooses whole GPUs for a task. (Protocol v6.)
    #[serde(default)]
    pub pci_root: Option<String>,
}

/// What is left of one GPU for new tasks (in offers): the fraction not given to tasks and the
/// device memory that goes with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFree {
    /// The GPU's (or MIG device's) uuid.
    pub uuid: String,
    /// Free milli-GPUs (1000 = idle).
    pub free_milli: u32,
    /// Free device memory, MiB: the GPU's memory times its free fraction.
    pub free_memory_mib: u64,
}
