//! Host resources: CPUs (available parallelism), memory (`/proc/meminfo` MemTotal, MiB) and disk
//! (space available to the agent's work directory, `statvfs`, MiB), with the operator's
//! `--resources "cpus:4;mem:2048"` overrides on top.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use gantry_proto::resources::{ResourceParseError, Resources};

/// Why host resources could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot read /proc/meminfo: {0}")]
    Meminfo(std::io::Error),
    #[error("/proc/meminfo has no MemTotal line")]
    NoMemTotal,
    #[error("cannot statvfs work dir {path}: {source}")]
    Statvfs {
        path: String,
        source: std::io::Error,
    },
}

/// Why `--resources` could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ResourceOverrideError {
    #[error("invalid --resources: {0}")]
    Parse(#[from] ResourceParseError),
    #[error("--resources may not set gpus to {given} (NVML found {found}); GPUs are discovered")]
    Gpus { given: f64, found: u32 },
}

/// Measured host resources.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostResources {
    pub cpus: f64,
    pub mem_mib: u64,
    pub disk_mib: u64,
}

impl HostResources {
    /// Measures this host; `work_dir` decides which file system's space counts as disk.
    pub fn detect(work_dir: &Path) -> Result<Self, HostError> {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as f64;
        let meminfo = std::fs::read_to_string("/proc/meminfo").map_err(HostError::Meminfo)?;
        let mem_mib = parse_meminfo_total_mib(&meminfo).ok_or(HostError::NoMemTotal)?;
        let disk_mib = available_disk_mib(work_dir)?;
        Ok(Self {
            cpus,
            mem_mib,
            disk_mib,
        })
    }

    /// As a resource bag (`cpus`, `mem`, `disk`, and `gpus` when `gpus > 0`).
    pub fn to_resources(&self, gpus: u32) -> Resources {
        let mut r = Resources::new()
            .with("cpus", self.cpus)
            .with("mem", self.mem_mib as f64)
            .with("disk", self.disk_mib as f64);
        if gpus > 0 {
            r = r.with("gpus", gpus as f64);
        }
        r
    }
}

/// `MemTotal` of a `/proc/meminfo` text, in MiB.
pub fn parse_meminfo_total_mib(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    let bytes = match parts.next() {
        Some("kB") | Some("KB") => value.checked_mul(1024)?,
        None => value,
        Some(_) => return None,
    };
    Some(bytes / (1024 * 1024))
}

fn available_disk_mib(path: &Path) -> Result<u64, HostError> {
    let err = |source| HostError::Statvfs {
        path: path.display().to_string(),
        source,
    };
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| err(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64) / (1024 * 1024))
}

/// Applies `--resources` overrides: each resource named there replaces the detected amount;
/// others are kept. `gpus` may only be lowered to 0 (to run a GPU host as a CPU agent) or repeat
/// the discovered count, since GPUs carry identities.
pub fn apply_overrides(
    detected: &Resources,
    overrides: &str,
    gpus_found: u32,
) -> Result<Resources, ResourceOverrideError> {
    let over = Resources::parse(overrides)?;
    let mut out = detected.filter(|n| !overrides_name(overrides, n));
    let given = over.get("gpus");
    if overrides_name(overrides, "gpus") && given != 0.0 && given != gpus_found as f64 {
        return Err(ResourceOverrideError::Gpus {
            given,
            found: gpus_found,
        });
    }
    out.add_assign(&over);
    Ok(out)
}

fn overrides_name(text: &str, name: &str) -> bool {
    text.split(';')
        .filter_map(|e| e.split_once(':'))
        .any(|(n, _)| n.trim() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_parsed() {
        let text = "MemTotal:        8048260 kB\nMemFree:  100 kB\n";
        assert_eq!(parse_meminfo_total_mib(text), Some(7859));
        assert_eq!(parse_meminfo_total_mib("MemFree: 1 kB"), None);
        assert_eq!(parse_meminfo_total_mib("MemTotal: x kB"), None);
    }

    #[test]
    fn detects_this_host() {
        let dir = tempfile::tempdir().unwrap();
        let h = HostResources::detect(dir.path()).unwrap();
        assert!(h.cpus >= 1.0);
        assert!(h.mem_mib > 64);
        assert!(h.disk_mib > 0);
        let r = h.to_resources(2);
        assert_eq!(r.get("gpus"), 2.0);
        assert_eq!(h.to_resources(0).get("gpus"), 0.0);
        assert!(HostResources::detect(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn overrides_replace_named_entries() {
        let detected = Resources::parse("cpus:2;mem:4000;disk:100;gpus:4").unwrap();
        let r = apply_overrides(&detected, "cpus:8;mem:1024", 4).unwrap();
        assert_eq!(
            r,
            Resources::parse("cpus:8;mem:1024;disk:100;gpus:4").unwrap()
        );
        // `disk:0` removes disk.
        let r = apply_overrides(&detected, "disk:0;gpus:0", 4).unwrap();
        assert_eq!(r, Resources::parse("cpus:2;mem:4000").unwrap());
        assert!(matches!(
            apply_overrides(&detected, "gpus:8", 4),
            Err(ResourceOverrideError::Gpus { .. })
        ));
        assert!(matches!(
            apply_overrides(&detected, "cpus=3", 4),
            Err(ResourceOverrideError::Parse(_))
        ));
    }
}
