//! One task's cgroup ([`TaskCgroup`]): attaching, usage and OOM read-back, limits, the
//! signals of its processes, recycling for the pool, removal.

use super::*;

impl TaskCgroup {
    /// The cgroup's name under the root (the task id, or the pool slot the task took).
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// The counters the cgroup held when its task took it.
    pub fn baseline(&self) -> Baseline {
        self.base
    }

    /// Sets the baseline (a restarted agent reads it from the task's meta directory).
    pub fn set_baseline(&mut self, base: Baseline) {
        self.base = base;
    }

    /// Checks that an empty cgroup can go back to the pool: only a cgroup this process made
    /// (it knows what it wrote: the next task rewrites what differs, v2's device program
    /// included) and that is still there and empty. An error means: destroy it instead.
    pub fn recycle(&self) -> Result<(), IsolationError> {
        if !self.made {
            return Err(IsolationError::NotFound(format!(
                "{} (not made by this agent)",
                self.task_id
            )));
        }
        // The task's processes are in every hierarchy (a process leaves one only by a root's
        // write): the memory hierarchy's list (v2: the cgroup's) stands for all.
        let Some(dir) = self.controller_dir("memory") else {
            return Ok(());
        };
        if !dir.is_dir() {
            return Err(IsolationError::NotFound(dir.display().to_string()));
        }
        if !read_pids(&dir.join("cgroup.procs"))?.is_empty() || !descendants(dir).is_empty() {
            return Err(IsolationError::Busy {
                path: dir.display().to_string(),
            });
        }
        // What the task left charged to the cgroup (page cache, kernel objects) is reclaimed
        // when the next task takes it, and only when it is more than that task may inherit
        // ([`super::leftover_allowance`]).
        Ok(())
    }

    /// Whether this is a real cgroup (not `--isolation none`).
    pub fn is_isolated(&self) -> bool {
        !matches!(self.kind, Kind::None)
    }

    /// Every directory of this cgroup (one per hierarchy, deduplicated).
    pub fn dirs(&self) -> Vec<&Path> {
        let mut v: Vec<&Path> = match &self.kind {
            Kind::None => Vec::new(),
            Kind::V1 {
                cpu,
                cpuacct,
                memory,
                pids,
                devices,
                freezer,
            } => {
                let mut v = vec![cpu.as_path(), cpuacct.as_path(), memory.as_path()];
                v.extend(
                    [pids, devices, freezer]
                        .into_iter()
                        .flatten()
                        .map(PathBuf::as_path),
                );
                v
            }
            Kind::V2 { dir } => vec![dir.as_path()],
        };
        v.sort();
        v.dedup();
        v
    }

    /// The directory of a v1 controller (or the v2 directory).
    pub fn controller_dir(&self, controller: &str) -> Option<&Path> {
        match &self.kind {
            Kind::None => None,
            Kind::V2 { dir } => Some(dir),
            Kind::V1 {
                cpu,
                cpuacct,
                memory,
                pids,
                devices,
                freezer,
            } => match controller {
                "cpu" => Some(cpu),
                "cpuacct" => Some(cpuacct),
                "memory" => Some(memory),
                "pids" => pids.as_deref(),
                "devices" => devices.as_deref(),
                "freezer" => freezer.as_deref(),
                _ => None,
            },
        }
    }

    /// For `CommandExt::pre_exec`: `let a = cg.pre_exec_attach(); unsafe { cmd.pre_exec(move ||
    /// a.attach_current()) };` — the child joins the cgroup before `exec`.
    pub fn pre_exec_attach(&self) -> PreExecAttach {
        PreExecAttach::for_files(&self.join_files())
    }

    /// The files a new process joins the cgroup through by writing `0` (itself) between its
    /// `clone` and `exec`: `tasks` in each v1 hierarchy, `cgroup.procs` in v2.
    ///
    /// v1's `tasks` moves the calling thread only, which for a freshly cloned process is the
    /// whole process; unlike `cgroup.procs` the kernel then skips the global write lock on
    /// every thread group (`cgroup_threadgroup_rwsem`, Linux ≥ 6.0 "cgroup: Optimize single
    /// thread migration"), whose write side waits out an RCU grace period and holds off every
    /// `fork` on the machine meanwhile. Six of those per task were what a task start into the
    /// v1 hierarchies cost (docs/benchmarks.md, "One real agent"). v2 keeps `cgroup.procs`:
    /// its `cgroup.threads` needs a threaded subtree.
    pub fn join_files(&self) -> Vec<PathBuf> {
        let file = match &self.kind {
            Kind::V1 { .. } => "tasks",
            Kind::None | Kind::V2 { .. } => "cgroup.procs",
        };
        self.dirs().iter().map(|d| d.join(file)).collect()
    }

    /// Moves a running process into the cgroup.
    pub fn attach(&self, pid: u32) -> Result<(), IsolationError> {
        for d in self.dirs() {
            write_file(&d.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Processes in the cgroup.
    pub fn pids(&self) -> Result<Vec<u32>, IsolationError> {
        match &self.kind {
            Kind::None => Ok(Vec::new()),
            Kind::V1 { memory, .. } => read_pids(&memory.join("cgroup.procs")),
            Kind::V2 { dir } => read_pids(&dir.join("cgroup.procs")),
        }
    }

    /// CPU time and memory (current and peak); GPU fields are 0 (see [`crate::gpu::usage`]).
    pub fn usage(&self) -> Result<TaskUsage, IsolationError> {
        match &self.kind {
            Kind::None => Ok(TaskUsage::default()),
            Kind::V1 {
                cpuacct, memory, ..
            } => Ok(TaskUsage {
                cpu_time_secs: read_u64(&cpuacct.join("cpuacct.usage"))?
                    .saturating_sub(self.base.cpu_usec.saturating_mul(1000))
                    as f64
                    / 1e9,
                mem_bytes: read_u64(&memory.join("memory.usage_in_bytes"))?,
                mem_peak_bytes: read_u64(&memory.join("memory.max_usage_in_bytes"))?,
                ..TaskUsage::default()
            }),
            Kind::V2 { dir } => {
                let stat = read_file(&dir.join("cpu.stat"))?;
                let current = read_u64(&dir.join("memory.current"))?;
                let peak = match &self.peak {
                    Some(f) => read_fd_u64(f),
                    None => read_u64(&dir.join("memory.peak")).ok(),
                }
                .unwrap_or(current);
                let usec = keyed(&stat, "usage_usec").unwrap_or(0);
                Ok(TaskUsage {
                    cpu_time_secs: usec.saturating_sub(self.base.cpu_usec) as f64 / 1e6,
                    mem_bytes: current,
                    mem_peak_bytes: peak.max(current),
                    ..TaskUsage::default()
                })
            }
        }
    }

    /// Whether the kernel's OOM killer killed a process of this cgroup (read before `destroy`).
    pub fn oom_killed(&self) -> Result<bool, IsolationError> {
        match &self.kind {
            Kind::None => Ok(false),
            Kind::V1 { memory, .. } => {
                let ctl = read_file(&memory.join("memory.oom_control"))?;
                match keyed(&ctl, "oom_kill") {
                    Some(n) => Ok(n > self.base.oom_kills),
                    // Kernels before 4.13 have no counter: the limit was hit.
                    None => Ok(read_u64(&memory.join("memory.failcnt"))? > 0
                        || keyed(&ctl, "under_oom") == Some(1)),
                }
            }
            Kind::V2 { dir } => {
                let ev = read_file(&dir.join("memory.events"))?;
                Ok(
                    keyed(&ev, "oom_kill").unwrap_or(0) + keyed(&ev, "oom_group_kill").unwrap_or(0)
                        > self.base.oom_kills,
                )
            }
        }
    }

    /// Sends SIGKILL to every process in the cgroup (freezing it first on v1 when the freezer
    /// is available, so nothing forks meanwhile; `cgroup.kill` on v2 when the kernel has it).
    pub fn kill_all(&self) -> Result<(), IsolationError> {
        match &self.kind {
            Kind::None => Ok(()),
            Kind::V2 { dir } => {
                let kill = dir.join("cgroup.kill");
                if kill.exists() && write_file(&kill, "1").is_ok() {
                    return Ok(());
                }
                self.kill_listed(&dir.join("cgroup.procs"))
            }
            Kind::V1 {
                memory, freezer, ..
            } => {
                let state = freezer
                    .as_ref()
                    .map(|f| f.join("freezer.state"))
                    .filter(|s| s.exists());
                if let Some(s) = &state {
                    if write_file(s, "FROZEN").is_ok() {
                        let deadline = Instant::now() + Duration::from_secs(1);
                        while Instant::now() < deadline
                            && read_file(s).map(|t| t.trim() != "FROZEN").unwrap_or(false)
                        {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
                let r = self.kill_listed(&memory.join("cgroup.procs"));
                if let Some(s) = &state {
                    write_file(s, "THAWED")?;
                }
                r
            }
        }
    }

    /// SIGKILLs the processes listed in `procs` and in the same file of every cgroup below it
    /// (a container's runtime makes its cgroup a child of the task's: docs/containers.md).
    fn kill_listed(&self, procs: &Path) -> Result<(), IsolationError> {
        if let Some(dir) = procs.parent() {
            for child in descendants(dir) {
                for pid in read_pids(&child.join("cgroup.procs")).unwrap_or_default() {
                    if let Ok(pid) = i32::try_from(pid) {
                        // SAFETY: kill(2) with a pid read from the cgroup; ESRCH is fine.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
        }
        for pid in read_pids(procs)? {
            let Ok(pid) = i32::try_from(pid) else {
                continue;
            };
            // SAFETY: kill(2) with a pid read from the cgroup; ESRCH (already gone) is fine.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        Ok(())
    }

    /// Kills what is left, waits until the cgroup is empty and removes it from every hierarchy.
    /// Idempotent.
    pub fn destroy(&self) -> Result<(), IsolationError> {
        let dirs = self.dirs();
        if dirs.iter().all(|d| !d.exists()) {
            if let Some(s) = &self.slots {
                lock_slots(s).remove(&self.task_id);
            }
            return Ok(());
        }
        let deadline = Instant::now() + DESTROY_TIMEOUT;
        loop {
            let mut busy = None;
            for d in &dirs {
                let below = descendants(d).iter().any(|c| {
                    !read_pids(&c.join("cgroup.procs"))
                        .unwrap_or_default()
                        .is_empty()
                });
                if below || !read_pids(&d.join("cgroup.procs"))?.is_empty() {
                    busy = Some(*d);
                }
            }
            let Some(d) = busy else { break };
            if Instant::now() >= deadline {
                return Err(IsolationError::NotEmpty {
                    path: d.display().to_string(),
                    secs: DESTROY_TIMEOUT.as_secs(),
                });
            }
            self.kill_all()?;
            if let Kind::V1 { .. } = self.kind {
                for d in &dirs {
                    self.kill_listed(&d.join("cgroup.procs"))?;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for d in dirs {
            for child in descendants(d) {
                rmdir(&child)?;
            }
            rmdir(d)?;
        }
        if let Some(s) = &self.slots {
            lock_slots(s).remove(&self.task_id);
        }
        Ok(())
    }
}

/// The cgroups below `dir`, deepest first (none for a plain task; a container's own cgroup
/// when its runtime left one behind).
fn descendants(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let p = e.path();
                out.extend(descendants(&p));
                out.push(p);
            }
        }
    }
    out
}
