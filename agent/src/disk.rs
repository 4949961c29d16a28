//! Disk limits of tasks (`--disk-enforcement du`, Mesos's `disk/du` isolator with
//! `--enforce_container_disk_quota`): how much a task's sandbox holds, measured the way `du`
//! does, and the decision to kill a task past its `disk`.
//!
//! - [`DuWalk`] (I/O, run off the agent's loop on a blocking thread): a resumable walk of one
//!   sandbox that counts allocated blocks (`st_blocks`: a sparse file counts what it holds, not
//!   its length), counts a hard-linked inode once, and never follows a symbolic link. Each
//!   directory is opened relative to its parent with `O_NOFOLLOW`, so a task swapping a
//!   directory for a link while it is walked cannot send the walk outside its sandbox. A pass
//!   looks at a bounded number of entries ([`task_budget`]); a larger sandbox is measured over
//!   several passes, each reading a lower bound of its usage.
//! - [`verdict`] (PURE, used by the agent core): over the limit, or nesting directories deeper
//!   than [`MAX_DEPTH`] (a subtree the walk does not enter, so usage it cannot see), means the
//!   task is killed with the message of its `disk-limit` status update.
//!
//! A task without a `disk` resource is not limited (as in Mesos). Between two measurements a
//! task can write past its limit (by how much its write rate allows in one
//! `--disk-watch-interval`): this is accounting with a kill, not a hard quota.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use rustix::fs::{openat, statat, AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Default `--disk-watch-interval` (Mesos's `--container_disk_watch_interval` is 15 s; 5 s
/// bounds the overshoot of a fast writer closer, and a pass over small sandboxes is cheap).
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// Entries (files, directories, links) looked at in one pass over all tasks' sandboxes.
pub const PASS_BUDGET: u64 = 200_000;

/// Entries one task's walk may look at in a pass however many tasks share it.
pub const MIN_TASK_BUDGET: u64 = 2_000;

/// Directories nested deeper than this below a sandbox are not entered (each level holds one
/// open descriptor while it is walked); a task that has them is killed ([`verdict`]).
pub const MAX_DEPTH: usize = 128;

const MIB: f64 = 1024.0 * 1024.0;

/// How disk limits are enforced (`--disk-enforcement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiskEnforcement {
    /// Not at all: `disk` is only accounted by the master.
    None,
    /// Sandboxes measured du-style every `--disk-watch-interval`; a task past its `disk` is
    /// killed (`FAILED`, reason `disk-limit`).
    #[default]
    Du,
}

impl FromStr for DiskEnforcement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(DiskEnforcement::None),
            "du" => Ok(DiskEnforcement::Du),
            _ => Err(format!(
                "unknown disk enforcement {s:?} (expected none or du)"
            )),
        }
    }
}

impl std::fmt::Display for DiskEnforcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DiskEnforcement::None => "none",
            DiskEnforcement::Du => "du",
        })
    }
}

/// What one pass read of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskReading {
    /// Bytes allocated to what the walk has counted so far.
    pub bytes: u64,
    /// The walk is done: `bytes` is the sandbox's usage (else a lower bound, the walk goes on
    /// in the next pass).
    pub complete: bool,
    /// The sandbox nests directories deeper than [`MAX_DEPTH`] (not entered).
    pub too_deep: bool,
}

/// Why a sandbox could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum DuError {
    #[error("opening the sandbox {path}: {source}")]
    Open { path: PathBuf, source: Errno },
}

/// A walk of one sandbox in progress (see the module documentation).
#[derive(Debug)]
pub struct DuWalk {
    /// Directories being read, the innermost last.
    stack: Vec<Dir>,
    bytes: u64,
    /// Inodes with more than one link already counted (device, inode).
    linked: HashSet<(u64, u64)>,
    too_deep: bool,
    /// Entries that vanished or could not be read (not counted).
    skipped: u64,
}

/// An on-disk size: allocated 512-byte blocks, as `du` counts them.
fn allocated(st: &rustix::fs::Stat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512)
}

impl DuWalk {
    /// Starts a walk at `sandbox` (which must be a directory, not a link to one), counting the
    /// directory itself.
    pub fn start(sandbox: &Path) -> Result<Self, DuError> {
        let err = |source| DuError::Open {
            path: sandbox.to_path_buf(),
            source,
        };
        let fd = openat(
            rustix::fs::CWD,
            sandbox,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        let bytes = allocated(&rustix::fs::fstat(&fd).map_err(err)?);
        Ok(DuWalk {
            stack: vec![Dir::new(fd).map_err(err)?],
            bytes,
            linked: HashSet::new(),
            too_deep: false,
            skipped: 0,
        })
    }

    /// Looks at up to `budget` more entries; the reading so far.
    pub fn step(&mut self, budget: u64) -> DiskReading {
        let mut looked = 0;
        while looked < budget {
            let depth = self.stack.len();
            let Some(dir) = self.stack.last_mut() else {
                break;
            };
            let entry = match dir.read() {
                None => {
                    self.stack.pop();
                    continue;
                }
                Some(Err(_)) => {
                    self.skipped += 1;
                    self.stack.pop();
                    continue;
                }
                Some(Ok(entry)) => entry,
            };
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            looked += 1;
            let Ok(parent) = dir.fd() else {
                self.skipped += 1;
                continue;
            };
            // The entry itself, never what a link points to.
            let Ok(st) = statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) else {
                // Removed since it was listed (or unreadable): not counted.
                self.skipped += 1;
                continue;
            };
            let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
            if !is_dir && st.st_nlink > 1 && !self.linked.insert((st.st_dev, st.st_ino)) {
                // Another name of an inode already counted.
                continue;
            }
            self.bytes = self.bytes.saturating_add(allocated(&st));
            if !is_dir {
                continue;
            }
            if depth > MAX_DEPTH {
                self.too_deep = true;
                continue;
            }
            // Opened relative to its parent and not through a link: a directory replaced by a
            // link since the stat is refused (ELOOP/ENOTDIR), not followed.
            match openat(
                parent,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .and_then(Dir::new)
            {
                Ok(sub) => self.stack.push(sub),
                Err(_) => self.skipped += 1,
            }
        }
        DiskReading {
            bytes: self.bytes,
            complete: self.stack.is_empty(),
            too_deep: self.too_deep,
        }
    }

    /// Entries that vanished while walked or could not be read (not counted).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
}

/// Entries each of `tasks` walks may look at in one pass: [`PASS_BUDGET`] shared evenly, at
/// least [`MIN_TASK_BUDGET`].
pub fn task_budget(tasks: usize) -> u64 {
    (PASS_BUDGET / (tasks.max(1) as u64)).max(MIN_TASK_BUDGET)
}

/// A task's disk limit in bytes (its `disk`, in MiB, held in milli-units); 0: no limit.
pub fn limit_bytes(disk_milli: u64) -> u64 {
    let bytes = u128::from(disk_milli) * 1024 * 1024 / 1000;
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// PURE: whether a task with a limit of `limit` bytes (`disk` of `limit_mib` MiB, as asked)
/// is to be killed after `reading`: `Some(message)` of its `disk-limit` update. A reading of
/// an unfinished walk is a lower bound: enough to kill, never to clear. No limit (0): never.
pub fn verdict(reading: DiskReading, limit: u64, limit_mib: f64) -> Option<String> {
    if limit == 0 {
        return None;
    }
    if reading.bytes > limit {
        let used = reading.bytes as f64 / MIB;
        let partial = if reading.complete {
            ""
        } else {
            " (at least: the walk of its sandbox is not finished)"
        };
        return Some(format!(
            "disk-limit: the task used {used:.1} MiB of its disk limit of {limit_mib} MiB{partial}; killed (--disk-enforcement du)"
        ));
    }
    if reading.too_deep {
        return Some(format!(
            "disk-limit: the task's sandbox nests directories deeper than {MAX_DEPTH} levels, which the agent does not measure (its disk limit is {limit_mib} MiB); killed (--disk-enforcement du)"
        ));
    }
    None
}

#[cfg(test)]
mod tests;
