//! MPS control daemons under `--gpu-sharing mps`: one `nvidia-cuda-mps-control` per GPU that
//! holds fractional tasks, started on the first such task, restarted when it exits (checked on
//! every agent tick), stopped with the agent.
//!
//! After an agent restart the daemons of GPUs that still hold fractional tasks are started again
//! on the first tick. A daemon left over from a killed agent (real MPS daemons outlive their
//! parent) keeps serving its pipe directory; the new one then fails to start and is retried
//! every 2 s with a warning until the old one is gone.
//!
//! Each daemon runs in the foreground (`-f`, so the agent is its parent and sees it exit) with
//! `CUDA_VISIBLE_DEVICES` set to its GPU and its own pipe and log directories under
//! `<work_dir>/mps/<uuid>/`; tasks on that GPU get `CUDA_MPS_PIPE_DIRECTORY` pointing at the
//! pipe directory. Without the binary (no NVIDIA driver, or a CI machine) nothing is started:
//! tasks still get their MPS limits, and one warning is logged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The MPS control binary's name.
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// Least time between two starts of one GPU's daemon (a daemon that keeps dying is not
/// restarted in a tight loop).
const RESTART_BACKOFF: Duration = Duration::from_secs(2);

struct Daemon {
    child: Option<Child>,
    started: Instant,
    restarts: u32,
}

/// The MPS control daemons of this agent.
pub struct MpsDaemons {
    binary: Option<PathBuf>,
    dir: PathBuf,
    daemons: HashMap<String, Daemon>,
}

impl std::fmt::Debug for MpsDaemons {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpsDaemons")
            .field("binary", &self.binary)
            .field("gpus", &self.daemons.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Finds `name` in `PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl MpsDaemons {
    /// Daemons run from `binary` (none: only the environment is set) with state under `dir`.
    pub fn new(binary: Option<PathBuf>, dir: &Path) -> MpsDaemons {
        if binary.is_none() {
            tracing::warn!("--gpu-sharing mps: {MPS_CONTROL} not found in PATH; fractional tasks get MPS limits but no MPS control daemon is started");
        }
        MpsDaemons {
            binary,
            dir: dir.to_path_buf(),
            daemons: HashMap::new(),
        }
    }

    /// The pipe directory for `uuid`'s daemon.
    pub fn pipe_dir(&self, uuid: &str) -> PathBuf {
        self.dir.join(uuid).join("pipe")
    }

    /// Makes sure `uuid`'s daemon runs (starting it if needed); returns its pipe directory, or
    /// `None` when no daemon can run (no binary, or it cannot be started).
    pub fn ensure(&mut self, uuid: &str) -> Option<PathBuf> {
        let binary = self.binary.clone()?;
        let pipe = self.pipe_dir(uuid);
        let entry = self.daemons.entry(uuid.to_string()).or_insert(Daemon {
            child: None,
            started: Instant::now() - RESTART_BACKOFF,
            restarts: 0,
        });
        let running = entry
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        if running {
            return Some(pipe);
        }
        if entry.child.is_some() {
            if entry.started.elapsed() < RESTART_BACKOFF {
                return Some(pipe);
            }
            entry.restarts += 1;
            tracing::warn!(gpu = %uuid, restarts = entry.restarts, "MPS control daemon exited; restarting it");
        }
        let log = self.dir.join(uuid).join("log");
        for d in [&pipe, &log] {
            if let Err(e) = std::fs::create_dir_all(d) {
                tracing::warn!(gpu = %uuid, "cannot create {}: {e}", d.display());
                return None;
            }
        }
        entry.started = Instant::now();
        match Command::new(&binary)
            .arg("-f")
            .env("CUDA_VISIBLE_DEVICES", uuid)
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => {
                tracing::info!(gpu = %uuid, pid = child.id(), "MPS control daemon started");
                entry.child = Some(child);
                Some(pipe)
            }
            Err(e) => {
                tracing::warn!(gpu = %uuid, "cannot start {}: {e}", binary.display());
                entry.child = None;
                None
            }
        }
    }

    /// Restarts the daemons that exited (called on every agent tick).
    pub fn supervise(&mut self) {
        let gpus: Vec<String> = self.daemons.keys().cloned().collect();
        for uuid in gpus {
            self.ensure(&uuid);
        }
    }

    /// Pids of the running daemons, per GPU.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.daemons
            .iter()
            .filter_map(|(u, d)| d.child.as_ref().map(|c| (u.clone(), c.id())))
            .collect()
    }
}

impl Drop for MpsDaemons {
    fn drop(&mut self) {
        for (uuid, d) in &mut self.daemons {
            if let Some(c) = d.child.as_mut() {
                if let Err(e) = c.kill() {
                    tracing::debug!(gpu = %uuid, "stopping the MPS control daemon: {e}");
                }
                let _ = c.wait();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_that_exits_is_restarted() {
        let dir = tempfile::tempdir().unwrap();
        // A stand-in control binary that exits at once.
        let bin = dir.path().join(MPS_CONTROL);
        std::fs::write(&bin, "#!/bin/sh\nexit 0\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut m = MpsDaemons::new(Some(bin), &dir.path().join("mps"));
        let pipe = m.ensure("GPU-a").unwrap();
        assert!(pipe.ends_with("GPU-a/pipe") && pipe.is_dir());
        let first = m.pids();
        assert_eq!(first.len(), 1);
        // Wait for it to exit, then past the back-off: supervise starts a new one.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            std::thread::sleep(RESTART_BACKOFF + Duration::from_millis(100));
            m.supervise();
            if m.pids() != first {
                break;
            }
            assert!(Instant::now() < deadline, "never restarted");
        }
        assert_eq!(m.daemons["GPU-a"].restarts.min(1), 1);
        let none = MpsDaemons::new(None, dir.path());
        assert!(none.pids().is_empty());
    }
}
