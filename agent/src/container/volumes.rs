//! Container volumes: host directories under the agent's allow-list (`--volume-allow`), and
//! per-framework persistent volumes `VOLUMES_DIR/FRAMEWORK/NAME`: created empty on first use
//! (mode 0750, owned by the task's user), kept across attempts and agent restarts, removed
//! only by [`destroy`] (an operator, or the framework through it).

use std::path::{Path, PathBuf};

use gantry_proto::{Volume, VolumeSource};

use super::{BindMount, ContainerConfig, ContainerError};

/// The directory of a framework's persistent volume.
pub fn persistent_dir(cfg: &ContainerConfig, framework: &str, name: &str) -> PathBuf {
    cfg.volumes_dir.join(framework).join(name)
}

/// What to mount for `v` (creating a persistent volume on first use).
pub fn resolve(
    cfg: &ContainerConfig,
    framework: &str,
    v: &Volume,
    uid: u32,
    gid: u32,
) -> Result<BindMount, ContainerError> {
    let err = |reason: String| ContainerError::Volume {
        at: v.container_path.clone(),
        reason,
    };
    let source = match &v.source {
        VolumeSource::Host(host) => {
            let real =
                std::fs::canonicalize(host).map_err(|e| err(format!("host path {host}: {e}")))?;
            if !allowed(&cfg.volume_allow, &real) {
                return Err(err(format!(
                    "host path {host} is not under this agent's --volume-allow directories ({})",
                    if cfg.volume_allow.is_empty() {
                        "none given".to_string()
                    } else {
                        cfg.volume_allow
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                )));
            }
            real
        }
        VolumeSource::Persistent(name) => {
            let dir = persistent_dir(cfg, framework, name);
            if !dir.is_dir() {
                create(&dir, uid, gid).map_err(|e| {
                    err(format!(
                        "creating persistent volume {name} at {}: {e}",
                        dir.display()
                    ))
                })?;
            }
            dir
        }
    };
    Ok(BindMount {
        source,
        destination: v.container_path.clone(),
        read_only: v.read_only,
    })
}

/// True when `real` (canonical) is one of `allow` or below it.
pub fn allowed(allow: &[PathBuf], real: &Path) -> bool {
    allow.iter().any(|a| {
        std::fs::canonicalize(a)
            .map(|a| real.starts_with(a))
            .unwrap_or(false)
    })
}

fn create(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o750).create(dir) {
        // Two tasks of the framework creating it at once: the first one did.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        r => r?,
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
}

/// Removes a framework's persistent volume (its data is gone). `Ok(false)` when there was none.
pub fn destroy(cfg: &ContainerConfig, framework: &str, name: &str) -> std::io::Result<bool> {
    let dir = persistent_dir(cfg, framework, name);
    if !dir.exists() {
        return Ok(false);
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(true)
}
