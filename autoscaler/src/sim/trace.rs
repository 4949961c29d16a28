//! Workload traces: the Alibaba `openb` pod lists ([`parse_openb`]).

use gantry_placement::{GpuDemand, GPU_MILLI};

use super::SimTask;

/// A trace that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TraceError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Reads an openb pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
/// pod_phase,creation_time,deletion_time,scheduled_time`).
pub fn parse_openb(text: &str) -> Result<Vec<SimTask>, TraceError> {
    let header = text.lines().next().unwrap_or("");
    if !header.contains("creation_time") || !header.contains("deletion_time") {
        return Err(TraceError {
            line: 1,
            message: "no creation_time/deletion_time columns: a replay needs them (the openb \
                      multigpuNN lists hold task shapes only)"
                .into(),
        });
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| TraceError {
            line: i + 1,
            message,
        };
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 10 {
            return Err(bad(format!("{} fields, expected 11", f.len())));
        }
        let num = |k: usize, what: &str| -> Result<u64, TraceError> {
            f[k].trim()
                .parse()
                .map_err(|_| bad(format!("{what} {:?} is not a number", f[k])))
        };
        let (gpus, milli) = (num(3, "num_gpu")?, num(4, "gpu_milli")?);
        let gpu = match (gpus, milli) {
            (0, _) => GpuDemand::None,
            (1, m) if m < u64::from(GPU_MILLI) => {
                GpuDemand::fraction(m as u32).map_err(|e| bad(e.to_string()))?
            }
            (n, _) => GpuDemand::whole(u32::try_from(n).map_err(|_| bad("num_gpu".into()))?),
        };
        let (created, deleted) = (num(8, "creation_time")?, num(9, "deletion_time")?);
        out.push(SimTask {
            arrival: created,
            duration: deleted.saturating_sub(created).max(1),
            cpu_milli: num(1, "cpu_milli")?,
            mem_mib: num(2, "memory_mib")?,
            gpu,
            models: f[5]
                .split('|')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            qos: f[6].to_string(),
        });
    }
    out.sort_by_key(|t| t.arrival);
    Ok(out)
}
