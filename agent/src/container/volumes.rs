//! Container volumes: host directories under the agent's allow-list (`--volume-allow`), and
//! per-framework persistent volumes `VOLUMES_DIR/FRAMEWORK/NAME`: created empty on first use
//! (mode 0750, owned by the task's user), kept across attempts and agent restarts, removed
//! only by [`destroy_unused`] (an operator, or the framework through it), which refuses while
//! a container of the agent mounts the volume ([`users`]: the bundles' specs) and takes the
//! config's volume lock, as a launch does from resolving its volumes to writing its spec, so
//! no launch can start using a volume between the check and the removal. [`list`] gives the
//! volumes with their users. [`answer`] serves the master's [`VolumeRequest`]s (protocol v12:
//! a framework's `DestroyVolume`, the operator API's list and destroy) on a sandbox stream.

use std::path::{Path, PathBuf};

use gantry_proto::{
    Volume, VolumeInfo, VolumeOutcome, VolumeReply, VolumeRequest, VolumeSource, MAX_VOLUMES_LISTED,
};

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

/// Why a persistent volume was not destroyed.
#[derive(Debug, thiserror::Error)]
pub enum DestroyError {
    /// The framework id or volume name cannot name a volume (no `/`, no leading `.`).
    #[error("{what} {value:?}: 1 to 64 bytes of A-Z a-z 0-9 . _ -, not starting with '.'")]
    Name { what: &'static str, value: String },
    /// A container on this agent mounts it.
    #[error("persistent volume {framework}/{name} is in use by task(s) {}", tasks.join(", "))]
    InUse {
        framework: String,
        name: String,
        tasks: Vec<String>,
    },
    #[error("removing {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A framework's persistent volume on this agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeEntry {
    pub framework: String,
    pub name: String,
    pub path: PathBuf,
    /// The tasks whose containers mount it (their bundles' specs), sorted.
    pub used_by: Vec<String>,
}

/// `A-Z a-z 0-9 . _ -`, 1 to 64 bytes, not starting with `.` (the protocol's rule for names).
fn safe_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The tasks (meta directory names under `meta_root`) whose container bundles bind-mount
/// `dir`: the `mounts[].source` of each `META/TASK/container/config.json`. Blocking.
pub fn users(meta_root: &Path, dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(meta_root) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .flatten()
        .filter(|e| {
            let Ok(text) = std::fs::read(e.path().join("container").join("config.json")) else {
                return false;
            };
            let Ok(spec) = serde_json::from_slice::<serde_json::Value>(&text) else {
                return false;
            };
            spec["mounts"].as_array().is_some_and(|mounts| {
                mounts
                    .iter()
                    .filter_map(|m| m["source"].as_str())
                    .any(|src| Path::new(src) == dir)
            })
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// Every persistent volume on this agent (`VOLUMES_DIR/FRAMEWORK/NAME`) with its users, sorted
/// by framework and name. Blocking.
pub fn list(cfg: &ContainerConfig, meta_root: &Path) -> Vec<VolumeEntry> {
    let names = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let mut out = Vec::new();
    for framework in names(&cfg.volumes_dir) {
        for name in names(&cfg.volumes_dir.join(&framework)) {
            let path = persistent_dir(cfg, &framework, &name);
            out.push(VolumeEntry {
                used_by: users(meta_root, &path),
                framework: framework.clone(),
                name,
                path,
            });
        }
    }
    out
}

/// Removes the framework's persistent volume `name` unless a container on this agent mounts
/// it. `Ok(false)`: there was none. Holds the volume lock (see the module docs). Blocking.
pub fn destroy_unused(
    cfg: &ContainerConfig,
    meta_root: &Path,
    framework: &str,
    name: &str,
) -> Result<bool, DestroyError> {
    for (what, value) in [("framework", framework), ("volume name", name)] {
        if !safe_name(value) {
            return Err(DestroyError::Name {
                what,
                value: value.to_string(),
            });
        }
    }
    let _guard = cfg.volume_lock.lock().unwrap_or_else(|e| e.into_inner());
    let dir = persistent_dir(cfg, framework, name);
    let tasks = users(meta_root, &dir);
    if !tasks.is_empty() {
        return Err(DestroyError::InUse {
            framework: framework.to_string(),
            name: name.to_string(),
            tasks,
        });
    }
    destroy(cfg, framework, name).map_err(|source| DestroyError::Io {
        path: dir.display().to_string(),
        source,
    })
}

/// The answer to one of the master's volume requests (the agent's meta directories under
/// `meta_root` tell which containers mount what). Blocking.
pub fn answer(cfg: &ContainerConfig, meta_root: &Path, req: VolumeRequest) -> VolumeReply {
    match req {
        VolumeRequest::List => {
            let all = list(cfg, meta_root);
            VolumeReply::List {
                total: u32::try_from(all.len()).unwrap_or(u32::MAX),
                volumes: all
                    .into_iter()
                    .take(MAX_VOLUMES_LISTED)
                    .map(|v| VolumeInfo {
                        framework: v.framework,
                        name: v.name,
                        path: v.path.display().to_string(),
                        used_by: v.used_by,
                    })
                    .collect(),
            }
        }
        VolumeRequest::Destroy {
            framework,
            name,
            principal,
        } => {
            let outcome = match destroy_unused(cfg, meta_root, &framework, &name) {
                Ok(true) => VolumeOutcome::Destroyed,
                Ok(false) => VolumeOutcome::NotFound,
                Err(DestroyError::InUse { tasks, .. }) => VolumeOutcome::InUse { tasks },
                Err(e) => VolumeOutcome::Failed(e.to_string()),
            };
            tracing::info!(%principal, %framework, volume = %name, ?outcome, "destroy persistent volume");
            VolumeReply::Destroy(outcome)
        }
    }
}
