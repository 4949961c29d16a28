//! Making a task's cgroup (or taking a pool one) and writing its limits under v1, one
//! directory per hierarchy: `cpu.shares` and the CFS quota, memory and memsw limits,
//! `pids.max`, the device allow list, and the counters a reused pool cgroup resets or keeps as
//! a baseline. Every limit is written, "unlimited" included, unless it is exactly what this
//! process last wrote to that cgroup.

use super::*;

impl Isolator {
    /// `prev`: what this process last wrote to this cgroup when it is a pool cgroup
    /// (`Some(None)`: made empty).
    pub(super) fn setup_v1(
        &self,
        cg: &mut TaskCgroup,
        limits: &Limits,
        prev: Option<Option<Limits>>,
    ) -> Result<(), IsolationError> {
        let mut made = Vec::new();
        let mut reused = false;
        // A pool cgroup this process made or got back empty (checked when it came back:
        // processes enter a cgroup only by a root's write) is there and empty: no `mkdir` and
        // no look at its processes per hierarchy.
        let known = prev.is_some() && cg.controller_dir("memory").is_some_and(Path::is_dir);
        let dirs = if known { Vec::new() } else { cg.dirs() };
        reused |= known;
        for d in dirs {
            match make_task_dir(d) {
                Ok(existed) => {
                    reused |= existed;
                    if !existed {
                        made.push(d);
                    }
                }
                Err(e) => {
                    // Remove only what this call created; a busy directory is someone else's.
                    for m in made {
                        let _ = rmdir(m);
                    }
                    return Err(e);
                }
            }
        }
        // A reused cgroup (a pool slot) holds its last task's settings: every limit is
        // written, "unlimited" included (unless they are the very limits this task needs), and
        // the counters that can be reset are. One made empty for the pool is as good as new.
        let same = reused && prev.as_ref() == Some(&Some(limits.clone()));
        let reused_limits = reused && !matches!(prev, Some(None));
        // (A cgroup made empty for the pool has fresh counters too.)
        let reset_counters = reused_limits;
        let reused = reused_limits;
        if reused {
            if let Kind::V1 { memory, .. } = &cg.kind {
                let left = read_u64(&memory.join("memory.usage_in_bytes")).unwrap_or(u64::MAX);
                if left > leftover_allowance(limits) {
                    // Best effort: under the limit the kernel reclaims it anyway.
                    let _ = write_file(&memory.join("memory.force_empty"), "0");
                }
            }
        }
        if !same {
            self.write_v1_limits(cg, limits, reused)?;
        }
        let Kind::V1 {
            cpuacct, memory, ..
        } = &cg.kind
        else {
            return Ok(());
        };
        if reset_counters {
            write_file(&cpuacct.join("cpuacct.usage"), "0")?;
            write_file(&memory.join("memory.max_usage_in_bytes"), "0")?;
            write_file(&memory.join("memory.failcnt"), "0")?;
            let ctl = read_file(&memory.join("memory.oom_control"))?;
            cg.base = Baseline {
                oom_kills: keyed(&ctl, "oom_kill").unwrap_or(0),
                cpu_usec: 0,
            };
        }
        Ok(())
    }

    pub(super) fn write_v1_limits(
        &self,
        cg: &TaskCgroup,
        limits: &Limits,
        reused: bool,
    ) -> Result<(), IsolationError> {
        let Kind::V1 {
            cpu,
            memory,
            pids,
            devices,
            ..
        } = &cg.kind
        else {
            return Ok(());
        };
        write_file(
            &cpu.join("cpu.shares"),
            &cpu_shares(limits.cpus).to_string(),
        )?;
        if limits.cpu_hard_limit {
            write_file(&cpu.join("cpu.cfs_period_us"), &CFS_PERIOD_US.to_string())?;
            write_file(
                &cpu.join("cpu.cfs_quota_us"),
                &cfs_quota_us(limits.cpus).to_string(),
            )?;
        } else if reused {
            write_file(&cpu.join("cpu.cfs_quota_us"), "-1")?;
        }
        let memsw = memory.join("memory.memsw.limit_in_bytes");
        let has_memsw = || memsw.exists();
        if let Some(mib) = limits.mem_mib {
            let bytes = mib.saturating_mul(1 << 20).to_string();
            // memsw may never be below the limit: lift it first when raising the limit.
            if reused && has_memsw() {
                write_file(&memsw, "-1")?;
            }
            write_file(&memory.join("memory.limit_in_bytes"), &bytes)?;
            if has_memsw() {
                write_file(&memsw, &bytes)?;
            }
        } else if reused {
            if has_memsw() {
                write_file(&memsw, "-1")?;
            }
            write_file(&memory.join("memory.limit_in_bytes"), "-1")?;
        }
        if let Some(dir) = pids {
            match limits.pids_max {
                Some(max) => write_file(&dir.join("pids.max"), &max.to_string())?,
                None if reused => write_file(&dir.join("pids.max"), "max")?,
                None => {}
            }
        }
        if let Some(dir) = devices {
            match &limits.devices {
                Some(rules) => {
                    write_file(&dir.join("devices.deny"), "a")?;
                    for r in rules {
                        write_file(&dir.join("devices.allow"), &r.v1_line())?;
                    }
                }
                None if reused => write_file(&dir.join("devices.allow"), "a")?,
                None => {}
            }
        }
        Ok(())
    }
}
