//! Task isolation with cgroups, v1 and v2 (detected at start), or none.
//!
//! Every task gets its own cgroup `<hierarchy>/<root>/<task id>` (`root` is `--cgroup-root`,
//! default `gantry`), with
//!
//! * cpu: shares (v1 `cpu.shares` = 1024 × cpus) or weight (v2 `cpu.weight`, the same value
//!   mapped to 1..10000), plus an optional hard CFS quota (`cpu.cfs_quota_us` / `cpu.max`);
//! * memory: a hard limit without swap (`memory.limit_in_bytes` + `memory.memsw.limit_in_bytes`
//!   / `memory.max` + `memory.swap.max`); OOM kills are read back from `memory.oom_control` /
//!   `memory.events`;
//! * pids: `pids.max`;
//! * devices: an allow list ([`devices::DeviceRule`]), v1 `devices.deny a` + `devices.allow`,
//!   v2 an eBPF device program ([`bpf`]).
//!
//! The executor creates the cgroup before spawning, moves the child in from `pre_exec`
//! ([`TaskCgroup::pre_exec_attach`]), reads [`TaskCgroup::usage`] / [`TaskCgroup::oom_killed`]
//! when the task ends and then [`TaskCgroup::destroy`]s it. After an agent restart
//! [`Isolator::reopen`] finds a task's cgroup again and [`Isolator::cleanup_except`] removes
//! orphans.
//!
//! Modules, in reading order: this file holds the [`Isolator`] (detecting the hierarchy,
//! creating, reopening, pooling and cleaning task cgroups, v1 and v2 side by side in each
//! method) and the file helpers; `v1` and `v2` write a task's limits under each version;
//! `task` is one task's [`TaskCgroup`] (attaching, usage and OOM read-back, signals, recycling,
//! removal); [`devices`] the device rules; [`bpf`] the v2 eBPF device program; [`layout`] the
//! paths; `tests` the unit tests.

pub mod bpf;
pub mod devices;
pub mod layout;
mod task;
mod v1;
mod v2;

use std::ffi::CString;
use std::io::{self, ErrorKind};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use gantry_proto::messages::TaskUsage;

pub use crate::core::types::Limits;
pub use devices::{DeviceRule, DeviceType, NvidiaMajors};
pub use layout::CgroupLayout;

/// Default `--cgroup-root`.
pub const DEFAULT_CGROUP_ROOT: &str = "gantry";

/// CFS period used for hard CPU limits (100 ms).
pub const CFS_PERIOD_US: u64 = 100_000;

/// How long [`TaskCgroup::destroy`] waits for killed processes to leave.
const DESTROY_TIMEOUT: Duration = Duration::from_secs(10);

/// `--isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsolationMode {
    /// cgroups (v1 or v2, whichever the host has).
    Cgroups,
    /// No isolation and no cgroup accounting.
    None,
}

/// Isolation errors.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    #[error("no cgroup hierarchy is mounted (checked /proc/self/mountinfo); use --isolation none to run without isolation")]
    NoCgroups,
    #[error("cgroup v1 controller {0:?} is not mounted")]
    ControllerMissing(String),
    #[error("cgroup v2 controller {controller:?} is not available in {path}")]
    V2ControllerMissing { controller: String, path: String },
    #[error("invalid cgroup root {0:?}: give a relative name (e.g. gantry) or a path inside the cgroup mount")]
    BadRoot(String),
    #[error("invalid task id for a cgroup name: {0:?}")]
    BadTaskId(String),
    #[error("invalid limits: {0}")]
    BadLimits(String),
    #[error("cgroup {path} already holds processes")]
    Busy { path: String },
    #[error("no cgroup for task {0}")]
    NotFound(String),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        source: io::Error,
    },
    #[error("device filter: {0}")]
    Bpf(#[from] bpf::BpfError),
    #[error("processes still in {path} after {secs}s")]
    NotEmpty { path: String, secs: u64 },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> IsolationError + 'a {
    move |source| IsolationError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

/// `cpu.shares` for a number of CPUs (at least 2, as the kernel requires).
pub fn cpu_shares(cpus: f64) -> u64 {
    ((cpus * 1024.0).round() as u64).max(2)
}

/// `cpu.weight` (1..=10000) for the same request, with the kernel's shares mapping.
pub fn cpu_weight(cpus: f64) -> u64 {
    let shares = cpu_shares(cpus).min(262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

/// CFS quota (µs per [`CFS_PERIOD_US`]) for a number of CPUs (at least 1 ms).
pub fn cfs_quota_us(cpus: f64) -> u64 {
    ((cpus * CFS_PERIOD_US as f64).round() as u64).max(1000)
}

/// Creates and finds task cgroups.
#[derive(Debug, Clone)]
pub struct Isolator {
    layout: Option<CgroupLayout>,
    /// Relative path of the task cgroups' parent inside each hierarchy.
    root: PathBuf,
    /// What this process last wrote to each pool cgroup ([`POOL_PREFIX`]).
    slots: SlotLimits,
    /// v2 controllers already enabled down to the root.
    v2_enabled: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

/// The limits this process last wrote to each pool cgroup (`None`: made empty by
/// [`Isolator::create_slot`], nothing written). A task taking a pooled cgroup whose limits are
/// the ones it needs skips rewriting them (in a batch of alike tasks: every time). A name
/// missing here is unknown: every limit is written.
type SlotLimits =
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Option<Limits>>>>;

fn lock_slots(
    slots: &SlotLimits,
) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Option<Limits>>> {
    slots.lock().unwrap_or_else(|e| e.into_inner())
}

/// A task's cgroup (one directory per hierarchy).
#[derive(Debug, Clone)]
pub struct TaskCgroup {
    /// The cgroup's name under the root: the task id, or a pool slot's name ([`POOL_PREFIX`]).
    task_id: String,
    kind: Kind,
    /// The counters the cgroup already held when its task took it (a reused pool slot):
    /// usage and OOM kills are reported as differences from these.
    base: Baseline,
    /// Made (or taken from the pool) by this process, with the device rules installed as an
    /// eBPF program on v2: only such a cgroup can go back to the pool.
    made: bool,
    bpf_rules: Option<Vec<DeviceRule>>,
    /// v2 on kernels ≥ 6.12: a `memory.peak` descriptor reset when the task took a reused
    /// cgroup (the peak since then is read through it).
    peak: Option<std::sync::Arc<std::fs::File>>,
    /// The isolator's record of pool cgroups (a pool cgroup's entry goes when it is removed).
    slots: Option<SlotLimits>,
}

/// Counters of a reused cgroup when its task took it. v1 resets what it can (`cpuacct.usage`,
/// `memory.max_usage_in_bytes`, `memory.failcnt`); the OOM-kill counters (and v2's
/// `cpu.stat`) cannot be reset and are subtracted. Recorded in the task's meta directory so a
/// restarted agent subtracts them too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Baseline {
    /// `oom_kill` (+ v2 `oom_group_kill`) already counted.
    pub oom_kills: u64,
    /// CPU time already counted, µs (v2 `cpu.stat` `usage_usec`).
    pub cpu_usec: u64,
}

/// How much of the previous task's charges (its page cache and kernel objects, all
/// reclaimable) a task taking a pooled cgroup may inherit before the agent reclaims them: an
/// eighth of its memory limit, at most 4 MiB. Reclaiming (`memory.force_empty` on v1,
/// `memory.reclaim` on v2) walks the kernel's shrinkers: it was a quarter of the agent's CPU
/// per task when done on every reuse, for the ~0.2 MiB a short task leaves. Under its limit
/// the kernel reclaims what is left first.
pub fn leftover_allowance(limits: &Limits) -> u64 {
    const MAX: u64 = 4 << 20;
    limits
        .mem_mib
        .map_or(MAX, |mib| (mib.saturating_mul(1 << 20) / 8).min(MAX))
}

/// Names of pooled cgroups start with this (see [`Isolator::create_slot`]); task ids never
/// do (they are UUIDs).
pub const POOL_PREFIX: &str = "pool-";

#[derive(Debug, Clone)]
enum Kind {
    None,
    V1 {
        cpu: PathBuf,
        cpuacct: PathBuf,
        memory: PathBuf,
        pids: Option<PathBuf>,
        devices: Option<PathBuf>,
        freezer: Option<PathBuf>,
    },
    V2 {
        dir: PathBuf,
    },
}

/// What [`TaskCgroup::pre_exec_attach`] returns: moves the calling process into the task's
/// cgroups using only `open`/`write`/`close`, so it is safe between `fork` and `exec`.
#[derive(Debug, Clone)]
pub struct PreExecAttach {
    procs_files: Vec<CString>,
}

impl PreExecAttach {
    /// Attaches to the given cgroup directories through their `cgroup.procs`.
    pub fn for_dirs(dirs: &[&Path]) -> PreExecAttach {
        let files: Vec<PathBuf> = dirs.iter().map(|d| d.join("cgroup.procs")).collect();
        Self::for_files(&files)
    }

    /// Attaches through the given files (`cgroup.procs` or v1 `tasks`: see
    /// [`TaskCgroup::join_files`]).
    pub fn for_files(files: &[PathBuf]) -> PreExecAttach {
        let procs_files = files
            .iter()
            .filter_map(|f| CString::new(f.as_os_str().as_bytes()).ok())
            .collect();
        PreExecAttach { procs_files }
    }

    /// Writes `0` (the caller) to each file. Async-signal-safe: no allocation, no locks.
    pub fn attach_current(&self) -> io::Result<()> {
        for f in &self.procs_files {
            // SAFETY: plain syscalls on a NUL-terminated path and a static buffer.
            unsafe {
                let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
            }
        }
        Ok(())
    }
}

fn validate_task_id(id: &str) -> Result<(), IsolationError> {
    let ok = !id.is_empty()
        && id.len() <= 200
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(IsolationError::BadTaskId(id.to_string()))
    }
}

fn relative_root(root: &Path, mounts: &[&Path]) -> Result<PathBuf, IsolationError> {
    let bad = || IsolationError::BadRoot(root.display().to_string());
    let rel = if root.is_absolute() {
        mounts
            .iter()
            .find_map(|m| root.strip_prefix(m).ok())
            .ok_or_else(bad)?
            .to_path_buf()
    } else {
        root.to_path_buf()
    };
    if rel.as_os_str().is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(bad());
    }
    Ok(rel)
}

fn write_file(path: &Path, value: &str) -> Result<(), IsolationError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(io_err("open", path))?;
    f.write_all(value.as_bytes()).map_err(io_err("write", path))
}

fn read_file(path: &Path) -> Result<String, IsolationError> {
    std::fs::read_to_string(path).map_err(io_err("read", path))
}

fn read_u64(path: &Path) -> Result<u64, IsolationError> {
    let t = read_file(path)?;
    let t = t.trim();
    if t == "max" {
        return Ok(u64::MAX);
    }
    t.parse().map_err(|_| IsolationError::Io {
        op: "parse",
        path: path.display().to_string(),
        source: io::Error::new(ErrorKind::InvalidData, format!("not a number: {t:?}")),
    })
}

/// The value of `key` in a flat-keyed file (`memory.events`, `cpu.stat`, `memory.oom_control`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key))
            .then(|| it.next()?.parse().ok())
            .flatten()
    })
}

/// A number read from the start of an open file (`memory.peak` through its reset descriptor).
fn read_fd_u64(f: &std::fs::File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 32];
    let n = f.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

fn read_pids(procs: &Path) -> Result<Vec<u32>, IsolationError> {
    match std::fs::read_to_string(procs) {
        Ok(t) => Ok(t.lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_err("read", procs)(e)),
    }
}

/// Creates `dir`; an existing directory is reused only when it holds no process. Returns
/// whether it existed (a pool slot, or a leftover): its settings and counters are not fresh.
fn make_task_dir(dir: &Path) -> Result<bool, IsolationError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(false),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(io_err("mkdir", parent))?;
            }
            std::fs::create_dir(dir).map_err(io_err("mkdir", dir))?;
            Ok(false)
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            if read_pids(&dir.join("cgroup.procs"))?.is_empty() {
                Ok(true)
            } else {
                Err(IsolationError::Busy {
                    path: dir.display().to_string(),
                })
            }
        }
        Err(e) => Err(io_err("mkdir", dir)(e)),
    }
}

/// A `memory.peak` descriptor reset to the current usage (kernels ≥ 6.12: a write resets the
/// peak seen through that descriptor); `None` where the kernel cannot.
fn reset_peak(path: &Path) -> Option<std::sync::Arc<std::fs::File>> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .ok()?;
    f.write_all(b"reset").ok()?;
    Some(std::sync::Arc::new(f))
}

fn rmdir(dir: &Path) -> Result<(), IsolationError> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            // The kernel may still be tearing down exited tasks.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(io_err("rmdir", dir)(e)),
        }
    }
}

impl Isolator {
    /// An isolator. With [`IsolationMode::Cgroups`] the hierarchies are detected from
    /// `/proc/self/mountinfo` (cgroup v1 needs cpu, cpuacct and memory; pids and devices are
    /// needed only by limits that use them). `root` is `--cgroup-root` (default `gantry`):
    /// a relative path inside each hierarchy, or an absolute path inside the cgroup mount.
    /// [`IsolationMode::None`] logs a warning and isolates nothing.
    pub fn new(mode: IsolationMode, root: Option<PathBuf>) -> Result<Isolator, IsolationError> {
        match mode {
            IsolationMode::None => {
                tracing::warn!(
                    "--isolation none: tasks run without cgroups (no limits, no cgroup accounting)"
                );
                Ok(Isolator {
                    layout: None,
                    root: PathBuf::from(DEFAULT_CGROUP_ROOT),
                    slots: SlotLimits::default(),
                    v2_enabled: Default::default(),
                })
            }
            IsolationMode::Cgroups => {
                let layout = CgroupLayout::detect().ok_or(IsolationError::NoCgroups)?;
                Self::with_layout(layout, root)
            }
        }
    }

    /// An isolator on explicit hierarchies (tests use a fake v2 directory).
    pub fn with_layout(
        layout: CgroupLayout,
        root: Option<PathBuf>,
    ) -> Result<Isolator, IsolationError> {
        let root = root.unwrap_or_else(|| PathBuf::from(DEFAULT_CGROUP_ROOT));
        let root = match &layout {
            CgroupLayout::V1 { mounts } => {
                for c in ["cpu", "cpuacct", "memory"] {
                    if !mounts.contains_key(c) {
                        return Err(IsolationError::ControllerMissing(c.to_string()));
                    }
                }
                let ms: Vec<&Path> = mounts.values().map(PathBuf::as_path).collect();
                relative_root(&root, &ms)?
            }
            CgroupLayout::V2 { mount } => relative_root(&root, &[mount.as_path()])?,
        };
        Ok(Isolator {
            layout: Some(layout),
            root,
            slots: SlotLimits::default(),
            v2_enabled: Default::default(),
        })
    }

    /// The path of the cgroup `name` inside each hierarchy (`/ROOT/NAME`), `None` without
    /// isolation (a container's runtime makes its cgroup below it).
    pub fn hierarchy_path(&self, name: &str) -> Option<String> {
        self.layout.as_ref()?;
        Some(format!("/{}/{name}", self.root.display()))
    }

    /// The detected layout (`None` without isolation).
    pub fn layout(&self) -> Option<&CgroupLayout> {
        self.layout.as_ref()
    }

    /// Creates the task's cgroup with `limits`. On failure nothing is left behind.
    pub fn create(&self, task_id: &str, limits: &Limits) -> Result<TaskCgroup, IsolationError> {
        validate_task_id(task_id)?;
        if !limits.cpus.is_finite() || limits.cpus <= 0.0 {
            return Err(IsolationError::BadLimits(format!(
                "cpus must be positive, got {}",
                limits.cpus
            )));
        }
        if limits.mem_mib == Some(0) {
            return Err(IsolationError::BadLimits(
                "mem must be positive".to_string(),
            ));
        }
        let mut cg =
            self.task_cgroup(task_id, limits.pids_max.is_some(), limits.devices.is_some())?;
        let prev = cg
            .slots
            .as_ref()
            .and_then(|s| lock_slots(s).get(task_id).cloned());
        let result = match &self.layout {
            None => Ok(()),
            Some(CgroupLayout::V1 { .. }) => self.setup_v1(&mut cg, limits, prev),
            Some(CgroupLayout::V2 { mount }) => self.setup_v2(mount, &mut cg, limits, prev),
        };
        match result {
            Ok(()) => {
                cg.made = true;
                if let Some(s) = &cg.slots {
                    lock_slots(s).insert(task_id.to_string(), Some(limits.clone()));
                }
                Ok(cg)
            }
            // Someone else's processes: leave them alone (setup removed what it created).
            Err(e @ IsolationError::Busy { .. }) => Err(e),
            Err(e) => {
                if let Err(e2) = cg.destroy() {
                    tracing::warn!(task = task_id, "cleanup after failed cgroup setup: {e2}");
                }
                Err(e)
            }
        }
    }

    fn task_cgroup(
        &self,
        task_id: &str,
        pids: bool,
        devices: bool,
    ) -> Result<TaskCgroup, IsolationError> {
        let kind = match &self.layout {
            None => Kind::None,
            Some(CgroupLayout::V1 { mounts }) => {
                let dir = |c: &str| mounts.get(c).map(|m| m.join(&self.root).join(task_id));
                let need = |c: &str| {
                    dir(c).ok_or_else(|| IsolationError::ControllerMissing(c.to_string()))
                };
                Kind::V1 {
                    cpu: need("cpu")?,
                    cpuacct: need("cpuacct")?,
                    memory: need("memory")?,
                    pids: if pids {
                        Some(need("pids")?)
                    } else {
                        dir("pids")
                    },
                    devices: if devices {
                        Some(need("devices")?)
                    } else {
                        dir("devices")
                    },
                    freezer: dir("freezer"),
                }
            }
            Some(CgroupLayout::V2 { mount }) => Kind::V2 {
                dir: mount.join(&self.root).join(task_id),
            },
        };
        Ok(TaskCgroup {
            task_id: task_id.to_string(),
            kind,
            base: Baseline::default(),
            made: false,
            bpf_rules: None,
            peak: None,
            slots: task_id.starts_with(POOL_PREFIX).then(|| self.slots.clone()),
        })
    }

    /// Creates an empty cgroup for the pool (`name` starts with [`POOL_PREFIX`]): the
    /// directories in every hierarchy a task may use, no limits (a task taking it with
    /// [`Isolator::create`] writes its own). The expensive part of a task cgroup (`mkdir` in
    /// up to six hierarchies) is thus done ahead, off the task's path, and once per slot
    /// rather than once per task.
    pub fn create_slot(&self, name: &str) -> Result<(), IsolationError> {
        validate_task_id(name)?;
        let cg = self.task_cgroup(name, false, false)?;
        if let Some(CgroupLayout::V2 { mount }) = &self.layout {
            self.enable_v2(mount, &["cpu"])?;
        }
        let mut made = Vec::new();
        for d in cg.dirs() {
            match make_task_dir(d) {
                Ok(false) => made.push(d),
                Ok(true) => {}
                Err(e) => {
                    for m in made {
                        let _ = rmdir(m);
                    }
                    return Err(e);
                }
            }
        }
        if made.len() == cg.dirs().len() {
            lock_slots(&self.slots).insert(name.to_string(), None);
        } else {
            // Partly there already: what it holds is unknown.
            lock_slots(&self.slots).remove(name);
        }
        Ok(())
    }

    /// Finds an existing task cgroup (after an agent restart).
    pub fn reopen(&self, task_id: &str) -> Result<TaskCgroup, IsolationError> {
        validate_task_id(task_id)?;
        let mut cg = self.task_cgroup(task_id, false, false)?;
        if let Kind::V1 {
            pids,
            devices,
            freezer,
            ..
        } = &mut cg.kind
        {
            for d in [pids, devices, freezer] {
                if d.as_ref().is_some_and(|p| !p.is_dir()) {
                    *d = None;
                }
            }
        }
        if matches!(cg.kind, Kind::None) || cg.dirs().iter().any(|d| d.is_dir()) {
            Ok(cg)
        } else {
            Err(IsolationError::NotFound(task_id.to_string()))
        }
    }

    /// Task ids that have a cgroup under the root.
    pub fn list(&self) -> Result<Vec<String>, IsolationError> {
        let parents: Vec<PathBuf> = match &self.layout {
            None => return Ok(Vec::new()),
            Some(CgroupLayout::V1 { mounts }) => {
                let mut v: Vec<PathBuf> = mounts.values().map(|m| m.join(&self.root)).collect();
                v.sort();
                v.dedup();
                v
            }
            Some(CgroupLayout::V2 { mount }) => vec![mount.join(&self.root)],
        };
        let mut ids = std::collections::BTreeSet::new();
        for p in parents {
            let rd = match std::fs::read_dir(&p) {
                Ok(rd) => rd,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("readdir", &p)(e)),
            };
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    if let Some(name) = e.file_name().to_str() {
                        if validate_task_id(name).is_ok() {
                            ids.insert(name.to_string());
                        }
                    }
                }
            }
        }
        Ok(ids.into_iter().collect())
    }

    /// Destroys every task cgroup under the root whose id is not in `keep` (orphans of tasks
    /// that ended while the agent was down); returns the ids removed.
    pub fn cleanup_except(&self, keep: &[&str]) -> Result<Vec<String>, IsolationError> {
        self.cleanup_unless(|id| keep.contains(&id))
    }

    /// Destroys every task cgroup under the root for which `keep` is false; returns the ids
    /// removed.
    pub fn cleanup_unless(
        &self,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, IsolationError> {
        let mut removed = Vec::new();
        for id in self.list()? {
            if !keep(&id) {
                self.reopen(&id)?.destroy()?;
                removed.push(id);
            }
        }
        Ok(removed)
    }

    /// Gives the agent's root cgroup the CPU weight of the CPUs the agent offers (`cpus`): v1
    /// `cpu.shares` = 1024 × cpus (at most 262,144), v2 `cpu.weight` the same mapped to
    /// 1..10000; each level above it below the mount (the `gantry` of the default
    /// `gantry/<agent>`) is raised to at least that, never lowered (agents sharing it keep the
    /// larger weight). Without it the agent's tasks together weigh as one process against every
    /// other process of the host's root cgroup (the kernel's default 1024): on a busy host a
    /// task joining its cgroup then waits for a CPU at a fraction of its entitlement, which
    /// dominated task starts with cgroups (docs/benchmarks.md, "One real agent"). Kubernetes
    /// weighs its `kubepods` cgroup by the node's allocatable CPUs the same way.
    pub fn weigh_root(&self, cpus: f64) -> Result<(), IsolationError> {
        let (mount, file, weight) = match &self.layout {
            None => return Ok(()),
            Some(CgroupLayout::V1 { mounts }) => {
                let Some(m) = mounts.get("cpu") else {
                    return Ok(());
                };
                (m.clone(), "cpu.shares", cpu_shares(cpus).min(262_144))
            }
            Some(CgroupLayout::V2 { mount }) => {
                self.enable_v2(mount, &["cpu"])?;
                (mount.clone(), "cpu.weight", cpu_weight(cpus))
            }
        };
        let mut level = mount;
        let depth = self.root.components().count();
        for (i, c) in self.root.components().enumerate() {
            level = level.join(c);
            std::fs::create_dir_all(&level).map_err(io_err("mkdir", &level))?;
            let path = level.join(file);
            let leaf = i + 1 == depth;
            // An ancestor is only raised (an unreadable value is treated as lower).
            if leaf || read_u64(&path).map_or(true, |w| w < weight) {
                write_file(&path, &weight.to_string())?;
            }
        }
        Ok(())
    }

    /// Removes the (empty) root directories themselves, e.g. when tests finish.
    pub fn remove_root(&self) -> Result<(), IsolationError> {
        let dirs: Vec<PathBuf> = match &self.layout {
            None => return Ok(()),
            Some(CgroupLayout::V1 { mounts }) => {
                mounts.values().map(|m| m.join(&self.root)).collect()
            }
            Some(CgroupLayout::V2 { mount }) => vec![mount.join(&self.root)],
        };
        for d in dirs {
            rmdir(&d)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
