//! Real cgroups for the isolation tests: whether this machine has them ([`cgroups_available`])
//! and [`CgroupRoot`], a per-test cgroup parent removed (after killing what is left) on drop.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Set to `1` to skip (explicitly) the tests that need real cgroups; CI never sets it.
pub const SKIP_CGROUP_TESTS: &str = "GANTRY_SKIP_CGROUP_TESTS";

/// Where cgroup hierarchies are mounted.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// Whether this test can use real cgroups. Returns `false` (after saying so) only when
/// [`SKIP_CGROUP_TESTS`]`=1`; otherwise panics with a clear message when cgroups are unusable
/// (not root, nothing mounted, read-only hierarchy).
pub fn cgroups_available(test: &str) -> bool {
    let why = cgroup_probe(test).err();
    match why {
        None => true,
        Some(why) if std::env::var(SKIP_CGROUP_TESTS).as_deref() == Ok("1") => {
            eprintln!("SKIPPED ({SKIP_CGROUP_TESTS}=1): {test}: cgroups are unavailable: {why}");
            false
        }
        Some(why) => panic!(
            "{test}: cgroups are unavailable: {why}. This test needs root and mounted cgroups \
             (v1 or v2); set {SKIP_CGROUP_TESTS}=1 to skip it explicitly."
        ),
    }
}

fn cgroup_probe(test: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("not running as root");
    }
    let mount = Path::new(CGROUP_MOUNT);
    let hierarchy = if mount.join("memory/cgroup.procs").exists() {
        mount.join("memory")
    } else if mount.join("cgroup.controllers").exists() {
        mount.to_path_buf()
    } else {
        bail!("no cgroup v1 memory hierarchy or cgroup v2 mount under {CGROUP_MOUNT}");
    };
    let probe = hierarchy.join(format!("gantry-probe-{}-{test}", std::process::id()));
    std::fs::create_dir(&probe)
        .with_context(|| format!("cannot create a cgroup ({})", probe.display()))?;
    std::fs::remove_dir(&probe).with_context(|| format!("removing {}", probe.display()))?;
    Ok(())
}

/// A per-test `--cgroup-root` (relative, e.g. `gantry-test-123-restart`). Dropping it kills
/// whatever is left in its task cgroups and removes them and the root from every hierarchy.
pub struct CgroupRoot {
    pub name: String,
}

impl CgroupRoot {
    pub fn new(test: &str) -> Self {
        Self {
            name: format!("gantry-test-{}-{test}", std::process::id()),
        }
    }

    /// The root's directory in every mounted hierarchy that has it.
    pub fn dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let v2 = Path::new(CGROUP_MOUNT).join(&self.name);
        if v2.is_dir() {
            out.push(v2);
        }
        if let Ok(entries) = std::fs::read_dir(CGROUP_MOUNT) {
            for e in entries.flatten() {
                let d = e.path().join(&self.name);
                if d.is_dir() {
                    out.push(d);
                }
            }
        }
        out
    }

    /// Every cgroup under the root (in any hierarchy): tasks' and the agent's pool's.
    pub fn all_cgroups(&self) -> Vec<PathBuf> {
        self.dirs()
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flat_map(|rd| rd.flatten())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect()
    }

    /// Task cgroups still present under the root (in any hierarchy): all but the empty ones of
    /// the agent's pool of prepared cgroups (`pool-…`, made ahead and reused; a running agent
    /// keeps some).
    pub fn task_cgroups(&self) -> Vec<PathBuf> {
        self.all_cgroups()
            .into_iter()
            .filter(|d| !(is_pool(d) && procs(d).is_empty()))
            .collect()
    }

    /// The agent's pool cgroups under the root (in any hierarchy).
    pub fn pool_cgroups(&self) -> Vec<PathBuf> {
        self.all_cgroups()
            .into_iter()
            .filter(|d| is_pool(d))
            .collect()
    }

    /// A running task's cgroup directory in a v1 controller's hierarchy (or the v2 directory
    /// when `controller` is `""`): the cgroup named after the task, or the pool cgroup holding
    /// a process whose environment says `GANTRY_TASK_ID=<task>`. Panics when there is none
    /// within 10 s: one snapshot once found none right after `RUNNING` on a host loaded ~30
    /// (cause not pinned down; the pool lookup reads `cgroup.procs` and `/proc/PID/environ`
    /// while the task starts), so the lookup is repeated until the task is seen.
    pub fn task_dir(&self, controller: &str, task: gantry_sdk::protocol::TaskId) -> PathBuf {
        let parent = Path::new(CGROUP_MOUNT).join(controller).join(&self.name);
        let named = parent.join(task.to_string());
        let wanted = format!("GANTRY_TASK_ID={task}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if named.is_dir() {
                return named;
            }
            let pooled = std::fs::read_dir(&parent)
                .into_iter()
                .flat_map(|rd| rd.flatten())
                .map(|e| e.path())
                .find(|d| {
                    procs(d).iter().any(|pid| {
                        std::fs::read(format!("/proc/{pid}/environ"))
                            .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == wanted.as_bytes()))
                    })
                });
            match pooled {
                Some(d) => return d,
                None if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                None => panic!("no cgroup of task {task} under {}", parent.display()),
            }
        }
    }

    fn kill_and_remove(&self) {
        // A container task's runtime makes its cgroup (`ctr`) below the task's: those first.
        let tasks: Vec<PathBuf> = self
            .all_cgroups()
            .into_iter()
            .flat_map(|t| {
                let mut v: Vec<PathBuf> = std::fs::read_dir(&t)
                    .map(|rd| {
                        rd.flatten()
                            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                            .map(|e| e.path())
                            .collect()
                    })
                    .unwrap_or_default();
                v.push(t);
                v
            })
            .collect();
        for dir in &tasks {
            for pid in std::fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
            {
                // SAFETY: kill(2) on a process inside this test's own cgroup.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for dir in tasks.iter().chain(self.dirs().iter()) {
            while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn is_pool(dir: &Path) -> bool {
    dir.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("pool-"))
}

fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        self.kill_and_remove();
    }
}
