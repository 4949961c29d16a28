//! Processes and scratch space: temporary directories, the workspace's binaries, free ports,
//! and [`Proc`], a child process killed (with its process group) on drop.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context};

/// A temporary directory (a [`tempfile::TempDir`]) removed on drop. Mode 0755 like a plain
/// `mkdir`, so task users other than the test's can reach sandboxes below it.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// A new directory named `PREFIX-RANDOM` in the system temporary directory.
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{prefix}-"))
            .tempdir()?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        Ok(Self(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// The directory holding the workspace's binaries (target/debug).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/test-xxxx -> target/debug
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .expect("target dir")
}

/// Path of a workspace binary, with a clear error when it has not been built. A binary next to
/// the running executable (e.g. `target/release/gantry-load`) is preferred.
pub fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(name)));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Ok(p);
    }
    let p = bin_dir().join(name);
    if !p.exists() {
        bail!(
            "{} is missing: run `cargo build --workspace --bins` before the cluster tests",
            p.display()
        );
    }
    Ok(p)
}

/// A free loopback UDP port (for QUIC).
pub fn free_udp() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("bind udp")
}

/// A free loopback TCP port.
pub fn free_tcp() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("bind tcp")
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        let child = cmd.spawn().with_context(|| format!("spawning {name}"))?;
        Ok(Self {
            child,
            name: name.to_string(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM (a clean stop) and wait up to `timeout` for the process to exit; SIGKILL after
    /// that. Returns whether it stopped on its own.
    pub fn terminate(&mut self, timeout: std::time::Duration) -> bool {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if !self.is_running() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        self.kill9();
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// True while a process exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
