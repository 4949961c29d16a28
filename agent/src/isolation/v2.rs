//! Enabling controllers, making a task's cgroup (or taking a pool one) and writing its limits
//! under v2, one directory: `cpu.weight` and `cpu.max`, `memory.max` and `memory.swap.max`,
//! `pids.max`, the eBPF device program ([`super::bpf`], replaced only when the rules differ),
//! and a reused cgroup's baseline and `memory.peak` reset.

use super::*;

impl Isolator {
    /// Enables `wanted` controllers from the mount down to the tasks' parent (v2), once per
    /// controller and process.
    pub(super) fn enable_v2(&self, mount: &Path, wanted: &[&str]) -> Result<(), IsolationError> {
        let mut done = self.v2_enabled.lock().unwrap_or_else(|e| e.into_inner());
        if wanted.iter().all(|c| done.contains(*c)) {
            return Ok(());
        }
        self.enable_v2_chain(mount, wanted)?;
        done.extend(wanted.iter().map(|c| c.to_string()));
        Ok(())
    }

    fn enable_v2_chain(&self, mount: &Path, wanted: &[&str]) -> Result<(), IsolationError> {
        let parent = mount.join(&self.root);
        std::fs::create_dir_all(&parent).map_err(io_err("mkdir", &parent))?;
        let mut level = mount.to_path_buf();
        let mut chain = vec![level.clone()];
        for c in self.root.components() {
            level = level.join(c);
            chain.push(level.clone());
        }
        for d in &chain {
            let available = read_file(&d.join("cgroup.controllers"))?;
            for c in wanted {
                if !available.split_whitespace().any(|a| a == *c) {
                    return Err(IsolationError::V2ControllerMissing {
                        controller: c.to_string(),
                        path: d.display().to_string(),
                    });
                }
            }
            let enabled = read_file(&d.join("cgroup.subtree_control"))?;
            for c in wanted {
                if !enabled.split_whitespace().any(|a| a == *c) {
                    write_file(&d.join("cgroup.subtree_control"), &format!("+{c}"))?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn setup_v2(
        &self,
        mount: &Path,
        cg: &mut TaskCgroup,
        limits: &Limits,
        prev: Option<Option<Limits>>,
    ) -> Result<(), IsolationError> {
        let Kind::V2 { dir } = &cg.kind else {
            return Ok(());
        };
        let dir = dir.clone();
        let mut wanted = vec!["cpu"];
        if limits.mem_mib.is_some() {
            wanted.push("memory");
        }
        if limits.pids_max.is_some() {
            wanted.push("pids");
        }
        self.enable_v2(mount, &wanted)?;
        // A pool cgroup this process made or got back empty: there and empty.
        let reused = if prev.is_some() && dir.is_dir() {
            true
        } else {
            make_task_dir(&dir)?
        };
        let exists = |f: &str| dir.join(f).exists();
        if reused && !matches!(prev, Some(None)) {
            let stat = read_file(&dir.join("cpu.stat"))?;
            let events = std::fs::read_to_string(dir.join("memory.events")).unwrap_or_default();
            cg.base = Baseline {
                oom_kills: keyed(&events, "oom_kill").unwrap_or(0)
                    + keyed(&events, "oom_group_kill").unwrap_or(0),
                cpu_usec: keyed(&stat, "usage_usec").unwrap_or(0),
            };
            if let Ok(left) = read_u64(&dir.join("memory.current")) {
                if left > leftover_allowance(limits) {
                    // Best effort: under the limit the kernel reclaims it anyway.
                    let _ = write_file(&dir.join("memory.reclaim"), &left.to_string());
                }
            }
            cg.peak = reset_peak(&dir.join("memory.peak"));
        }
        // A pool cgroup's device program stays attached between tasks: replaced only when
        // this task's rules differ.
        let prev_rules = prev
            .as_ref()
            .and_then(|p| p.as_ref())
            .and_then(|p| p.devices.clone());
        let same = reused && prev.as_ref() == Some(&Some(limits.clone()));
        let reused = reused && !matches!(prev, Some(None));
        if same {
            cg.bpf_rules = limits.devices.clone();
            return Ok(());
        }
        write_file(
            &dir.join("cpu.weight"),
            &cpu_weight(limits.cpus).to_string(),
        )?;
        if limits.cpu_hard_limit {
            write_file(
                &dir.join("cpu.max"),
                &format!("{} {CFS_PERIOD_US}", cfs_quota_us(limits.cpus)),
            )?;
        } else if reused {
            write_file(&dir.join("cpu.max"), &format!("max {CFS_PERIOD_US}"))?;
        }
        if let Some(mib) = limits.mem_mib {
            write_file(
                &dir.join("memory.max"),
                &mib.saturating_mul(1 << 20).to_string(),
            )?;
            if exists("memory.swap.max") {
                write_file(&dir.join("memory.swap.max"), "0")?;
            }
        } else if reused && exists("memory.max") {
            write_file(&dir.join("memory.max"), "max")?;
            if exists("memory.swap.max") {
                write_file(&dir.join("memory.swap.max"), "max")?;
            }
        }
        match limits.pids_max {
            Some(max) => write_file(&dir.join("pids.max"), &max.to_string())?,
            None if reused && exists("pids.max") => write_file(&dir.join("pids.max"), "max")?,
            None => {}
        }
        if prev_rules != limits.devices {
            if let Some(old) = &prev_rules {
                bpf::detach(&dir, old)?;
            }
            if let Some(rules) = &limits.devices {
                bpf::install(&dir, rules)?;
            }
        }
        cg.bpf_rules = limits.devices.clone();
        Ok(())
    }
}
