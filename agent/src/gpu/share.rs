//! GPU sharing on the agent (pure): fractions of one GPU, the sharing mode's environment, and
//! each task's GPU-memory share.
//!
//! A task asking for `gpus` below one gets a fraction of one GPU (milli-GPU precision);
//! fractions on a GPU sum to at most one GPU and whole-GPU tasks only get GPUs nobody holds a
//! share of ([`occupancy`]). The master names the GPU for a fraction (fragmentation-aware);
//! [`pick_fraction`] keeps its choice when it still fits and otherwise takes the fitting GPU
//! with the least room (best fit).
//!
//! `--gpu-sharing` ([`Sharing`]) decides how tasks on one GPU share it:
//! - `time-slice` (default): CUDA's time slicing; compute is shared in turns, GPU memory is
//!   NOT isolated (a task may use more than its share; it is reported, and killed with
//!   `--gpu-memory-enforce kill`);
//! - `mps`: NVIDIA MPS; a fractional task gets `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (its share
//!   of the SMs) and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (its share of device memory), and the
//!   pipe directory of its GPU's MPS control daemon ([`crate::gpu::mps`]).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use gantry_proto::{GpuAmount, GpuInfo};

use super::health::GpuFault;

/// Milli-GPUs in a whole GPU.
pub const GPU_MILLI: u32 = 1000;

/// How tasks sharing a GPU share it (`--gpu-sharing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sharing {
    /// CUDA time slicing: no memory isolation.
    #[default]
    TimeSlice,
    /// NVIDIA MPS with per-task thread and pinned-memory limits.
    Mps,
}

impl FromStr for Sharing {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "time-slice" => Ok(Sharing::TimeSlice),
            "mps" => Ok(Sharing::Mps),
            _ => Err(format!(
                "unknown GPU sharing mode {s:?} (expected time-slice or mps)"
            )),
        }
    }
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sharing::TimeSlice => "time-slice",
            Sharing::Mps => "mps",
        })
    }
}

/// What happens to a task using more GPU memory than its share (`--gpu-memory-enforce`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryEnforce {
    /// A non-terminal status update (reason `gpu-memory`) and the figures in `/state`.
    #[default]
    Report,
    /// The report, then the task is killed (`FAILED`, reason `gpu-memory`).
    Kill,
}

impl FromStr for MemoryEnforce {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "report" => Ok(MemoryEnforce::Report),
            "kill" => Ok(MemoryEnforce::Kill),
            _ => Err(format!(
                "unknown GPU memory enforcement {s:?} (expected report or kill)"
            )),
        }
    }
}

/// Milli-GPUs held per GPU uuid by the given live tasks: `(gpus amount in milli-units, the
/// GPUs the task holds)`; a whole-GPU task holds all of each of its GPUs.
pub fn occupancy<'a>(
    tasks: impl IntoIterator<Item = (u64, &'a [String])>,
) -> BTreeMap<&'a str, u32> {
    let mut out: BTreeMap<&str, u32> = BTreeMap::new();
    for (milli, gpus) in tasks {
        let per_gpu = GpuAmount::from_milli(milli)
            .map(GpuAmount::per_gpu_milli)
            .unwrap_or(GPU_MILLI);
        for uuid in gpus {
            let v = out.entry(uuid.as_str()).or_insert(0);
            *v = v.saturating_add(per_gpu).min(GPU_MILLI);
        }
    }
    out
}

/// The GPU (index into `free`) for a fraction of `milli` milli-GPUs: `preferred` (the
/// master's choice) when it has room, else the GPU with the least room that fits (lowest index
/// on ties). `free[i]` is `None` for GPUs the task may not use (unhealthy, not matching its
/// selector).
pub fn pick_fraction(free: &[Option<u32>], milli: u32, preferred: Option<usize>) -> Option<usize> {
    if let Some(p) = preferred {
        if free.get(p).copied().flatten().is_some_and(|f| f >= milli) {
            return Some(p);
        }
    }
    free.iter()
        .enumerate()
        .filter_map(|(i, f)| f.filter(|&f| f >= milli).map(|f| (f, i)))
        .min()
        .map(|(_, i)| i)
}

/// The task's GPU-memory share in bytes: its fraction of each of its GPUs' memory.
pub fn memory_share_bytes(milli: u64, gpus: &[&GpuInfo]) -> u64 {
    let per_gpu = u64::from(
        GpuAmount::from_milli(milli)
            .map(GpuAmount::per_gpu_milli)
            .unwrap_or(GPU_MILLI),
    );
    gpus.iter()
        .map(|g| g.memory_mib * 1024 * 1024 * per_gpu / u64::from(GPU_MILLI))
        .sum()
}

/// The MPS environment of a fractional task (`milli` of one GPU with `memory_mib`), under
/// [`Sharing::Mps`]; empty for whole GPUs or time slicing. `pipe_dir` is the GPU's MPS
/// control daemon's pipe directory, when one runs.
pub fn mps_env(
    sharing: Sharing,
    milli: u64,
    memory_mib: u64,
    pipe_dir: Option<&str>,
) -> Vec<(&'static str, String)> {
    let Ok(GpuAmount::Fraction(m)) = GpuAmount::from_milli(milli) else {
        return Vec::new();
    };
    if sharing != Sharing::Mps {
        return Vec::new();
    }
    let percent = (m as u64).div_ceil(10).clamp(1, 100);
    let mem_mib = (memory_mib * u64::from(m) / u64::from(GPU_MILLI)).max(1);
    let mut env = vec![
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", percent.to_string()),
        // Device ordinal 0: the task sees exactly one GPU (CUDA_VISIBLE_DEVICES).
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", format!("0={mem_mib}M")),
    ];
    if let Some(dir) = pipe_dir {
        env.push(("CUDA_MPS_PIPE_DIRECTORY", dir.to_string()));
    }
    env
}

/// A fault NVML reports on a GPU in MIG mode concerns every MIG device carved from it (those
/// are what tasks hold and what is offered): one fault per MIG device of `fault.uuid`, or the
/// fault itself for a GPU that is not in MIG mode.
pub fn mig_fan_out<'a>(
    fault: GpuFault,
    gpus: impl IntoIterator<Item = &'a GpuInfo>,
) -> Vec<GpuFault> {
    let children: Vec<GpuFault> = gpus
        .into_iter()
        .filter(|g| g.parent_uuid.as_deref() == Some(fault.uuid.as_str()))
        .map(|g| GpuFault {
            uuid: g.uuid.clone(),
            kind: fault.kind,
        })
        .collect();
    if children.is_empty() {
        vec![fault]
    } else {
        children
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!("mps".parse::<Sharing>(), Ok(Sharing::Mps));
        assert_eq!("time-slice".parse::<Sharing>(), Ok(Sharing::TimeSlice));
        assert!("mig".parse::<Sharing>().is_err());
        assert_eq!("kill".parse::<MemoryEnforce>(), Ok(MemoryEnforce::Kill));
        assert!("x".parse::<MemoryEnforce>().is_err());
        assert_eq!(Sharing::Mps.to_string(), "mps");
    }

    #[test]
    fn occupancy_sums_fractions_and_whole_gpus() {
        let a = vec!["GPU-a".to_string()];
        let b = vec!["GPU-b".to_string(), "GPU-c".to_string()];
        let occ = occupancy([
            (250, a.as_slice()),
            (500, a.as_slice()),
            (2000, b.as_slice()),
        ]);
        assert_eq!(occ["GPU-a"], 750);
        assert_eq!(occ["GPU-b"], 1000);
        assert_eq!(occ["GPU-c"], 1000);
    }

    #[test]
    fn fractions_go_where_the_master_said_or_to_the_tightest_gpu() {
        let free = [Some(1000), Some(300), None, Some(600)];
        assert_eq!(pick_fraction(&free, 250, Some(0)), Some(0));
        assert_eq!(pick_fraction(&free, 250, None), Some(1));
        assert_eq!(pick_fraction(&free, 500, Some(1)), Some(3), "no room on 1");
        assert_eq!(pick_fraction(&free, 250, Some(2)), Some(1), "2 not allowed");
        assert_eq!(pick_fraction(&free, 1000, None), Some(0));
        assert_eq!(pick_fraction(&[None, Some(100)], 250, None), None);
    }

    #[test]
    fn memory_share_and_mps_limits() {
        let g = GpuInfo {
            uuid: "GPU-a".into(),
            name: "A100".into(),
            memory_mib: 40_000,
            compute_capability: (8, 0),
            minor: 0,
            pci_bus_id: String::new(),
            numa_node: None,
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        };
        assert_eq!(memory_share_bytes(250, &[&g]), 10_000 * 1024 * 1024);
        assert_eq!(memory_share_bytes(2000, &[&g, &g]), 80_000 * 1024 * 1024);
        let env = mps_env(Sharing::Mps, 250, 40_000, Some("/w/mps/GPU-a"));
        assert_eq!(
            env,
            vec![
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25".to_string()),
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=10000M".to_string()),
                ("CUDA_MPS_PIPE_DIRECTORY", "/w/mps/GPU-a".to_string()),
            ]
        );
        assert!(mps_env(Sharing::TimeSlice, 250, 40_000, None).is_empty());
        assert!(mps_env(Sharing::Mps, 1000, 40_000, None).is_empty());

        // A fault on a GPU in MIG mode is a fault of each of its MIG devices.
        let child = |u: &str| GpuInfo {
            uuid: u.into(),
            mig_profile: Some("1g.10gb".into()),
            parent_uuid: Some("GPU-p".into()),
            ..g.clone()
        };
        let gpus = [g.clone(), child("MIG-1"), child("MIG-2")];
        let fault = |u: &str| GpuFault {
            uuid: u.into(),
            kind: crate::gpu::FaultKind::Xid(79),
        };
        let out = mig_fan_out(fault("GPU-p"), &gpus);
        let uuids: Vec<&str> = out.iter().map(|f| f.uuid.as_str()).collect();
        assert_eq!(uuids, ["MIG-1", "MIG-2"]);
        assert_eq!(mig_fan_out(fault("GPU-a"), &gpus), vec![fault("GPU-a")]);
    }
}
