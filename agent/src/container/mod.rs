//! Tasks in OCI containers (`TaskInfo.container`; docs/containers.md).
//!
//! A container task is started by the agent's supervisor like any task, but the program it
//! runs is the OCI runtime (`runc run`, or `crun`; `--container-runtime`) on a bundle the agent
//! writes in the task's root-owned meta directory (`META/container`):
//!
//! - `rootfs/`: the image's layers (lowest first) as the lower directories of an overlay
//!   mount, with `upper/` and `work/` beside it as the task's writable layer (a copy of the
//!   layers where overlayfs is unavailable);
//! - `config.json`: the runtime spec, written with the `oci-spec` crate ([`build_spec`], pure):
//!   pid, mount, ipc, uts and cgroup namespaces (network only with `ContainerNetwork::None`),
//!   the task's user, rlimits, `noNewPrivileges`, the default capabilities of runc, a default
//!   seccomp profile ([`seccomp`]), the sandbox at [`SANDBOX_PATH`], volumes, and the devices,
//!   mounts, env and hooks of the task's GPUs from their CDI specs ([`cdi`]).
//!
//! The container's cgroup is a child (`ctr`) of the task cgroup the agent made, so limits,
//! usage, OOM read-back and the cgroup-wide kill work as for other tasks. The runtime runs in
//! the foreground under the supervisor: its exit status is the task's, and it forwards the
//! SIGTERM of a kill to the container; the SIGKILL past the grace period is cgroup-wide. A
//! restarted agent re-adopts the supervisor (and so the runtime) like any task. [`cleanup`]
//! (when the task's cgroup is settled, right after its terminal status is handed on, so the
//! status does not wait for it) deletes the runtime's state, unmounts the root filesystem and
//! removes the bundle; [`sweep_ended`] (at startup, from [`retake_leases`]) cleans up what a
//! crash between the two left.
//!
//! A container on a registry image holds a lease on it in the image store ([`Leases`]) from
//! its bundle's preparation to its [`cleanup`], so collection never removes layers under a
//! mounted root filesystem. The bundle records the image's digest (`image`): a restarted agent
//! takes the leases of the containers it re-adopts again ([`retake_leases`]) before it pulls
//! anything.
//!
//! - `spec` (re-exported): [`ImageParts`], [`resolve_image`], [`process_args`], [`build_spec`]
//!   (pure) and [`container_id`].
//! - `bundle` (re-exported): [`Request`], [`prepare`] (overlay root filesystem, volumes,
//!   `config.json`), [`cleanup`] and [`is_mount_point`].
//! - `leases` (re-exported): [`Leases`], [`retake_leases`] and [`sweep_ended`].
//! - [`cdi`]: CDI spec parsing and device look-up.
//! - [`seccomp`]: the default seccomp profile.
//! - [`volumes`]: host volumes (allow-list) and persistent volumes.

pub mod cdi;
pub mod seccomp;
pub mod volumes;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gantry_proto::{ContainerInfo, ContainerNetwork, Program, TaskId};
use oci_spec::runtime::{
    Hook, HookBuilder, LinuxDeviceBuilder, LinuxDeviceCgroupBuilder, LinuxDeviceType,
    LinuxNamespaceType, Mount, MountBuilder, PosixRlimitBuilder, PosixRlimitType, Spec,
    UserBuilder,
};

/// Where the task's sandbox appears in its container (`GANTRY_SANDBOX`).
pub const SANDBOX_PATH: &str = "/mnt/sandbox";

/// The prefix of image references naming an agent-side root filesystem (`--local-rootfs`).
pub const LOCAL_ROOTFS: &str = "rootfs:";

/// The agent's container settings.
#[derive(Debug, Clone, Default)]
pub struct ContainerConfig {
    /// The OCI runtime (`runc` or `crun`); `None`: none found, container tasks fail to launch.
    pub runtime: Option<PathBuf>,
    /// The runtime's state directory (`--root`), `WORK_DIR/runtime`.
    pub state_root: PathBuf,
    /// `--local-rootfs NAME=DIR`: unpacked root filesystems tasks name as `rootfs:NAME`.
    pub local_rootfs: BTreeMap<String, PathBuf>,
    /// `--volume-allow DIR`: host directories tasks may mount (and what is below them).
    pub volume_allow: Vec<PathBuf>,
    /// Persistent volumes live in `DIR/FRAMEWORK/NAME` (`WORK_DIR/volumes`).
    pub volumes_dir: PathBuf,
    /// Where CDI specs are read (`--cdi-dir`; `/etc/cdi` and `/var/run/cdi` by default).
    pub cdi_dirs: Vec<PathBuf>,
    /// The image store registry images come from (leases are taken in it).
    pub images: Option<Arc<gantry_image::ImageStore>>,
    /// The image leases of prepared containers, until their cleanup.
    pub leases: Leases,
    /// Held from resolving a launch's volumes to writing its spec, and by
    /// [`volumes::destroy_unused`] from its check to the removal.
    pub volume_lock: Arc<Mutex<()>>,
}

/// The default CDI spec directories.
pub const CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

impl ContainerConfig {
    /// Defaults under `work_dir`, with the first of `runc` and `crun` found on `PATH`.
    pub fn new(work_dir: &Path) -> Self {
        Self {
            runtime: find_on_path("runc").or_else(|| find_on_path("crun")),
            state_root: work_dir.join("runtime"),
            local_rootfs: BTreeMap::new(),
            volume_allow: Vec::new(),
            volumes_dir: work_dir.join("volumes"),
            cdi_dirs: CDI_DIRS.iter().map(PathBuf::from).collect(),
            images: None,
            leases: Leases::default(),
            volume_lock: Arc::default(),
        }
    }
}

/// `name` in a directory of `PATH`, if it is there (or `name` itself when it is a path).
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Why a container could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error(
        "no OCI runtime (runc or crun) on this agent: install one or give --container-runtime"
    )]
    NoRuntime,
    /// The image could not be had (the task ends `image-pull-failed`).
    #[error("image {image}: {reason}")]
    Image { image: String, reason: String },
    #[error("volume at {at}: {reason}")]
    Volume { at: String, reason: String },
    #[error("GPU devices: {0}")]
    Cdi(#[from] cdi::CdiError),
    #[error("root filesystem: {0}")]
    Rootfs(String),
    #[error("runtime spec: {0}")]
    Spec(String),
    #[error("{0}")]
    Command(String),
}

impl ContainerError {
    /// True for errors getting the image (reason `image-pull-failed`).
    pub fn is_image(&self) -> bool {
        matches!(self, ContainerError::Image { .. })
    }
}

/// The prefix of a launch error that is an image error (the core maps it to
/// `TaskReason::ImagePullFailed`).
pub const IMAGE_ERROR_PREFIX: &str = "image-pull-failed: ";

fn spec_err(e: impl std::fmt::Display) -> ContainerError {
    ContainerError::Spec(e.to_string())
}
mod bundle;
mod leases;
mod spec;

pub use bundle::*;
pub use leases::*;
pub use spec::*;

#[cfg(test)]
mod tests;
