//! Attribution of NVML-measured GPU usage to tasks (pure).
//!
//! NVML reports, per GPU, the compute processes (pid, memory) and the GPU's utilization. The
//! caller maps pids to tasks (from the tasks' cgroups or process groups). Then, per GPU:
//!
//! * memory: each process's memory counts for its task;
//! * utilization: NVML has no cheap per-process figure, so the GPU's utilization is split among
//!   the tasks with processes on it in proportion to their memory there (equally when they all
//!   report 0 bytes); when no known process is on the GPU (e.g. a PID namespace hides it), the
//!   task the GPU is assigned to gets all of it.
//!
//! A task's `util_percent` is the sum over its GPUs (two fully busy GPUs read 200).

use std::collections::{BTreeMap, HashMap};

use gantry_proto::messages::GpuSample;

use crate::discovery::nvml::GpuProcess;

/// GPU figures attributed to one task.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuTaskUsage {
    pub mem_bytes: u64,
    pub util_percent: f64,
}

/// Attributes GPU memory and utilization to tasks. `pid_task` maps process ids to tasks;
/// `assigned` maps GPU UUIDs to the task holding them. Tasks with nothing attributed are absent.
pub fn attribute<T: Ord + Clone>(
    samples: &[GpuSample],
    processes: &[GpuProcess],
    pid_task: &HashMap<u32, T>,
    assigned: &HashMap<String, T>,
) -> BTreeMap<T, GpuTaskUsage> {
    let mut out: BTreeMap<T, GpuTaskUsage> = BTreeMap::new();
    // uuid -> task -> memory on that GPU
    let mut per_gpu: BTreeMap<&str, BTreeMap<T, u64>> = BTreeMap::new();
    for p in processes {
        if let Some(task) = pid_task.get(&p.pid) {
            *per_gpu
                .entry(p.uuid.as_str())
                .or_default()
                .entry(task.clone())
                .or_default() += p.used_bytes;
            out.entry(task.clone()).or_default().mem_bytes += p.used_bytes;
        }
    }
    for s in samples {
        let util = f64::from(s.util_percent);
        match per_gpu.get(s.uuid.as_str()) {
            Some(tasks) if !tasks.is_empty() => {
                let total: u64 = tasks.values().sum();
                for (task, mem) in tasks {
                    let share = if total == 0 {
                        1.0 / tasks.len() as f64
                    } else {
                        *mem as f64 / total as f64
                    };
                    out.entry(task.clone()).or_default().util_percent += util * share;
                }
            }
            _ => {
                if let Some(task) = assigned.get(&s.uuid) {
                    out.entry(task.clone()).or_default().util_percent += util;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(uuid: &str, util: u32) -> GpuSample {
        GpuSample {
            uuid: uuid.into(),
            util_percent: util,
            mem_used_bytes: 0,
            temperature_c: 0,
            power_mw: 0,
        }
    }

    fn proc_(uuid: &str, pid: u32, used: u64) -> GpuProcess {
        GpuProcess {
            uuid: uuid.into(),
            pid,
            used_bytes: used,
        }
    }

    #[test]
    fn memory_and_utilization_follow_processes() {
        let samples = vec![sample("g0", 90), sample("g1", 50), sample("g2", 30)];
        let procs = vec![
            proc_("g0", 1, 300),
            proc_("g0", 2, 600),
            proc_("g1", 3, 100),
            proc_("g1", 99, 5),
        ];
        let pid_task: HashMap<u32, &str> = [(1, "a"), (2, "b"), (3, "a")].into_iter().collect();
        let assigned: HashMap<String, &str> = [("g2".to_string(), "c")].into_iter().collect();
        let u = attribute(&samples, &procs, &pid_task, &assigned);
        assert_eq!(u["a"].mem_bytes, 400);
        assert_eq!(u["b"].mem_bytes, 600);
        assert!((u["a"].util_percent - (30.0 + 50.0)).abs() < 1e-9);
        assert!((u["b"].util_percent - 60.0).abs() < 1e-9);
        // GPU with no known process goes to its assignee.
        assert_eq!(
            u["c"],
            GpuTaskUsage {
                mem_bytes: 0,
                util_percent: 30.0
            }
        );
        assert_eq!(u.len(), 3);
    }

    #[test]
    fn zero_memory_splits_equally() {
        let samples = vec![sample("g0", 80)];
        let procs = vec![proc_("g0", 1, 0), proc_("g0", 2, 0)];
        let pid_task: HashMap<u32, u8> = [(1, 1), (2, 2)].into_iter().collect();
        let u = attribute(&samples, &procs, &pid_task, &HashMap::new());
        assert_eq!(u[&1].util_percent, 40.0);
        assert_eq!(u[&2].util_percent, 40.0);
    }
}
