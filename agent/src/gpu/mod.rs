//! GPU policy, all pure: topology-aware assignment ([`assign`], from
//! [`gantry_placement::topology`], which the master uses too), health ([`health`]),
//! attribution of NVML-measured usage to tasks ([`usage`]) and sharing (fractions of one GPU,
//! sharing modes, GPU-memory shares: [`share`]); plus the MPS control daemons under
//! `--gpu-sharing mps` ([`mps`], the one part with processes).

pub mod health;
pub mod mps;
pub mod share;
pub mod usage;

pub use gantry_placement::topology::{assign, GpuSlot};
pub use health::{FaultKind, GpuFault, HealthChange, HealthTracker};
pub use usage::{attribute, GpuTaskUsage};

/// The environment a task with these GPUs gets: `CUDA_VISIBLE_DEVICES` and
/// `NVIDIA_VISIBLE_DEVICES`, both the comma-separated UUIDs.
pub fn visible_devices_env(uuids: &[String]) -> [(&'static str, String); 2] {
    let list = uuids.join(",");
    [
        ("CUDA_VISIBLE_DEVICES", list.clone()),
        ("NVIDIA_VISIBLE_DEVICES", list),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn visible_devices() {
        let env = super::visible_devices_env(&["GPU-a".to_string(), "GPU-b".to_string()]);
        assert_eq!(env[0], ("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b".to_string()));
        assert_eq!(
            env[1],
            ("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b".to_string())
        );
    }
}
