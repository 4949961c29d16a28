//! MPS control daemons under `--gpu-sharing mps`: the processes. One `nvidia-cuda-mps-control`
//! per GPU that holds fractional tasks; *when* each starts (on the first such task, again after
//! it exits, at most once per back-off) is the core's decision ([`crate::core::mps`]): this
//! module starts a daemon when told, tells when one exits, and stops them with the agent.
//!
//! A daemon left over from a killed agent (real MPS daemons outlive their parent) keeps serving
//! its pipe directory; the new one then fails to start and the core retries it after its
//! back-off, with a warning, until the old one is gone.
//!
//! Each daemon runs in the foreground (`-f`, so the agent is its parent and sees it exit) with
//! `CUDA_VISIBLE_DEVICES` set to its GPU and its own pipe and log directories under
//! `<work_dir>/mps/<uuid>/`; tasks on that GPU get `CUDA_MPS_PIPE_DIRECTORY` pointing at the
//! pipe directory. A thread per daemon waits for its exit without reaping it (`waitid` with
//! `WNOWAIT`), so its pid is not reused before the agent reaps it. Without the binary (no
//! NVIDIA driver, or a CI machine) nothing is started: tasks still get their MPS limits, and
//! one warning is logged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The MPS control binary's name.
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// The MPS control daemons of this agent.
pub struct MpsDaemons {
    binary: Option<PathBuf>,
    dir: PathBuf,
    daemons: HashMap<String, Child>,
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

    /// Whether daemons can run at all (the binary was found).
    pub fn enabled(&self) -> bool {
        self.binary.is_some()
    }

    /// The pipe directory for `uuid`'s daemon.
    pub fn pipe_dir(&self, uuid: &str) -> PathBuf {
        self.dir.join(uuid).join("pipe")
    }

    /// The pipe directory tasks on `uuid` use: once its daemon was started (a daemon being
    /// restarted keeps its directory).
    pub fn pipe(&self, uuid: &str) -> Option<PathBuf> {
        self.daemons.contains_key(uuid).then(|| self.pipe_dir(uuid))
    }

    /// Starts `uuid`'s daemon (reaping the one before it, if it exited); `exited` runs (on a
    /// thread of its own) when the new one exits. `Err` says why it could not start.
    pub fn start(
        &mut self,
        uuid: &str,
        exited: impl FnOnce() + Send + 'static,
    ) -> Result<u32, String> {
        let binary = self.binary.clone().ok_or("no MPS control binary")?;
        if let Some(old) = self.daemons.get_mut(uuid) {
            if matches!(old.try_wait(), Ok(None)) {
                return Ok(old.id());
            }
        }
        let pipe = self.pipe_dir(uuid);
        let log = self.dir.join(uuid).join("log");
        for d in [&pipe, &log] {
            std::fs::create_dir_all(d)
                .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        let child = Command::new(&binary)
            .arg("-f")
            .env("CUDA_VISIBLE_DEVICES", uuid)
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let pid = child.id();
        tracing::info!(gpu = %uuid, pid, "MPS control daemon started");
        std::thread::spawn(move || {
            // SAFETY: waitid(2) on our own child with WNOWAIT: it only waits (the child stays a
            // zombie for `Child::try_wait` to reap); `info` is a plain struct it fills in.
            unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                libc::waitid(
                    libc::P_PID,
                    pid as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                );
            }
            exited();
        });
        self.daemons.insert(uuid.to_string(), child);
        Ok(pid)
    }

    /// Pids of the running daemons, per GPU.
    pub fn pids(&mut self) -> Vec<(String, u32)> {
        self.daemons
            .iter_mut()
            .filter_map(|(u, c)| matches!(c.try_wait(), Ok(None)).then(|| (u.clone(), c.id())))
            .collect()
    }
}

impl Drop for MpsDaemons {
    fn drop(&mut self) {
        for (uuid, c) in &mut self.daemons {
            if matches!(c.try_wait(), Ok(None)) {
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
    fn a_daemon_that_exits_is_reported_and_can_start_again() {
        let dir = tempfile::tempdir().unwrap();
        // A stand-in control binary that exits at once.
        let bin = dir.path().join(MPS_CONTROL);
        std::fs::write(&bin, "#!/bin/sh\nexit 0\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut m = MpsDaemons::new(Some(bin), &dir.path().join("mps"));
        assert_eq!(m.pipe("GPU-a"), None);
        let (tx, rx) = std::sync::mpsc::channel();
        let tx2 = tx.clone();
        let _first = m.start("GPU-a", move || tx.send(1).unwrap()).unwrap();
        let pipe = m.pipe("GPU-a").unwrap();
        assert!(pipe.ends_with("GPU-a/pipe") && pipe.is_dir());
        // Its exit is told (no polling), and the next start reaps it and runs a new one.
        assert_eq!(rx.recv().unwrap(), 1);
        m.start("GPU-a", move || tx2.send(2).unwrap()).unwrap();
        assert_eq!(rx.recv().unwrap(), 2);
        let mut none = MpsDaemons::new(None, dir.path());
        assert!(none.start("GPU-a", || {}).is_err());
        assert!(none.pids().is_empty());
    }
}
