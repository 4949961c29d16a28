//! Sandbox garbage collection (the policy is PURE: time and disk usage are inputs).
//!
//! When a task is forgotten (terminal and every update acknowledged) its sandbox and meta
//! directory join a queue, oldest first. They are removed `--gc-delay` after the task ended —
//! sooner when the disk fills: as Mesos's agent does (`--gc_delay`, `--gc_disk_headroom`), the
//! delay shrinks to `delay × max(0, 1 − headroom − used)`, where `used` is the fraction of the
//! work directory's file system in use, so with the default headroom of 0.1 the delay reaches
//! zero at 90% full. The newest `--gc-keep` sandboxes are always kept for inspection.
//!
//! Sandboxes found on disk at start that belong to no known task (tasks of an earlier run) join
//! the queue with the time their supervisor recorded the exit (or the sandbox's own time).

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gantry_proto::TaskId;

/// Defaults: one hour (Mesos keeps a week; task output of interest is usually read within
/// minutes, and at a thousand tasks a second a week of sandboxes does not fit), 10% headroom,
/// the newest 20 kept.
pub const DEFAULT_DELAY: Duration = Duration::from_secs(3600);
pub const DEFAULT_HEADROOM: f64 = 0.1;
pub const DEFAULT_KEEP: usize = 20;

/// How ended tasks' sandboxes are collected.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GcPolicy {
    pub delay: Duration,
    /// Fraction of the disk kept free: the delay shrinks as usage approaches `1 - headroom`.
    pub disk_headroom: f64,
    /// The newest sandboxes kept whatever their age.
    pub keep: usize,
}

impl Default for GcPolicy {
    fn default() -> Self {
        Self {
            delay: DEFAULT_DELAY,
            disk_headroom: DEFAULT_HEADROOM,
            keep: DEFAULT_KEEP,
        }
    }
}

/// A sandbox waiting to be collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub task: TaskId,
    /// When the task ended (Unix ms).
    pub at_ms: u64,
}

impl GcPolicy {
    /// The delay at disk usage `used` (0.0 to 1.0).
    pub fn effective_delay(&self, used: f64) -> Duration {
        let factor = (1.0 - self.disk_headroom - used).clamp(0.0, 1.0);
        if factor.is_finite() {
            self.delay.mul_f64(factor)
        } else {
            self.delay
        }
    }

    /// When the front of `queue` becomes due for removal ([`GcPolicy::due`]), if anything in
    /// it ever can (`None`: at most `keep` are queued).
    pub fn next_due(&self, queue: &VecDeque<Ended>, used: f64) -> Option<u64> {
        if queue.len() <= self.keep {
            return None;
        }
        let delay = self.effective_delay(used).as_millis() as u64;
        queue.front().map(|e| e.at_ms.saturating_add(delay))
    }

    /// Takes the sandboxes due for removal off the front of `queue` (oldest first), leaving
    /// at least the newest `keep`.
    pub fn due(&self, queue: &mut VecDeque<Ended>, now_ms: u64, used: f64) -> Vec<TaskId> {
        let delay = self.effective_delay(used).as_millis() as u64;
        let mut out = Vec::new();
        while queue.len() > self.keep {
            match queue.front() {
                Some(e) if e.at_ms.saturating_add(delay) <= now_ms => {
                    out.push(e.task);
                    queue.pop_front();
                }
                _ => break,
            }
        }
        out
    }
}

/// Adds `found` to `queue`, keeping it ordered by end time.
pub fn merge(queue: &mut VecDeque<Ended>, found: Vec<Ended>) {
    if found.is_empty() {
        return;
    }
    let mut seen = std::collections::HashSet::new();
    // What is queued already wins (its time is when the task was forgotten).
    let mut all: Vec<Ended> = queue
        .drain(..)
        .chain(found)
        .filter(|e| seen.insert(e.task))
        .collect();
    all.sort_by_key(|e| e.at_ms);
    queue.extend(all);
}

fn mtime_ms(path: &Path) -> Option<u64> {
    let t = std::fs::metadata(path).ok()?.modified().ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64)
}

/// The sandboxes under `work_dir` (blocking), with when their task ended: when its launch
/// record last changed (its exit, or the agent's reading of its cgroup after it), else when
/// the sandbox directory did.
pub fn scan(work_dir: &Path) -> Vec<Ended> {
    let Ok(entries) = std::fs::read_dir(work_dir.join("sandboxes")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let task: TaskId = e.file_name().to_str()?.parse().ok()?;
            let meta = work_dir.join("meta").join(task.to_string());
            let at_ms =
                crate::executor::record::changed_ms(&meta).or_else(|| mtime_ms(&e.path()))?;
            Some(Ended { task, at_ms })
        })
        .collect()
}

/// Removes the sandboxes and meta directories of `tasks` (blocking). Returns how many were
/// removed; failures are logged.
pub fn remove(work_dir: &Path, tasks: &[TaskId]) -> usize {
    let mut removed = 0;
    for t in tasks {
        let name = t.to_string();
        let mut ok = true;
        for dir in [
            work_dir.join("sandboxes").join(&name),
            work_dir.join("meta").join(&name),
        ] {
            // std's remove_dir_all does not follow symlinks a task may have planted.
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    ok = false;
                    tracing::warn!(dir = %dir.display(), "removing an ended task's directory: {e}");
                }
            }
        }
        removed += usize::from(ok);
    }
    removed
}

/// Fraction (0.0 to 1.0) of the file system holding `path` in use, as `df` counts it.
pub fn disk_used(path: &Path) -> Option<f64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let used = st.f_blocks.saturating_sub(st.f_bfree) as f64;
    let total = used + st.f_bavail as f64;
    (total > 0.0).then(|| used / total)
}

/// Unix ms now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(at_ms: u64) -> Ended {
        Ended {
            task: TaskId::random(),
            at_ms,
        }
    }

    #[test]
    fn removed_after_the_delay_oldest_first_keeping_the_newest() {
        let p = GcPolicy {
            delay: Duration::from_secs(10),
            disk_headroom: 0.0,
            keep: 2,
        };
        let all: Vec<Ended> = (0..5).map(|i| ended(i * 1000)).collect();
        let mut q: VecDeque<Ended> = all.iter().copied().collect();
        assert!(p.due(&mut q, 9_999, 0.0).is_empty(), "none is 10 s old yet");
        assert_eq!(p.due(&mut q, 11_000, 0.0), vec![all[0].task, all[1].task]);
        // The newest two stay however old they get.
        assert_eq!(p.due(&mut q, 1_000_000, 0.0), vec![all[2].task]);
        assert_eq!(q.len(), 2);
        assert!(p.due(&mut q, u64::MAX, 0.0).is_empty());
    }

    #[test]
    fn disk_pressure_shortens_the_delay() {
        let p = GcPolicy {
            delay: Duration::from_secs(100),
            disk_headroom: 0.1,
            keep: 0,
        };
        assert_eq!(p.effective_delay(0.0), Duration::from_secs(90));
        assert_eq!(p.effective_delay(0.5), Duration::from_secs(40));
        assert_eq!(p.effective_delay(0.9), Duration::ZERO);
        assert_eq!(p.effective_delay(0.99), Duration::ZERO);
        let mut q: VecDeque<Ended> = [ended(0)].into_iter().collect();
        assert!(p.due(&mut q, 1_000, 0.5).is_empty());
        assert_eq!(p.due(&mut q, 1_000, 0.95).len(), 1);
        // A headroom of 1 collects at once.
        let eager = GcPolicy {
            disk_headroom: 1.0,
            ..p
        };
        assert_eq!(eager.effective_delay(0.0), Duration::ZERO);
    }

    #[test]
    fn merged_sandboxes_stay_in_end_order_without_duplicates() {
        let (a, b, c) = (ended(5), ended(1), ended(3));
        let mut q: VecDeque<Ended> = [a].into_iter().collect();
        // The same task found again with another time (the start-up scan racing its ack).
        let a_again = Ended { at_ms: 0, ..a };
        merge(&mut q, vec![b, a_again, c, a]);
        assert_eq!(q.iter().map(|e| e.at_ms).collect::<Vec<_>>(), vec![1, 3, 5]);
    }

    #[test]
    fn scan_and_remove() {
        let dir = tempfile::tempdir().unwrap();
        let t = TaskId::random();
        let sandbox = dir.path().join("sandboxes").join(t.to_string());
        let meta = dir.path().join("meta").join(t.to_string());
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::create_dir_all(&meta).unwrap();
        std::fs::write(sandbox.join("stdout"), "out").unwrap();
        std::fs::create_dir_all(dir.path().join("sandboxes").join("not-a-task")).unwrap();
        let found = scan(dir.path());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].task, t);
        assert_eq!(remove(dir.path(), &[t]), 1);
        assert!(!sandbox.exists() && !meta.exists());
        assert!(disk_used(dir.path()).is_some_and(|u| (0.0..=1.0).contains(&u)));
    }
}
