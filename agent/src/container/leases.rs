//! Image leases held by containers ([`Leases`], [`retake_leases`]).

use super::*;

/// The image-store leases of container tasks, by the task's meta directory: taken when a
/// bundle is prepared (or again by [`retake_leases`] after a restart), dropped by [`cleanup`].
#[derive(Clone, Default)]
pub struct Leases(Arc<Mutex<HashMap<PathBuf, gantry_image::Lease>>>);

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases").field("held", &self.len()).finish()
    }
}

impl Leases {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, gantry_image::Lease>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `lease` for the container whose meta directory is `meta` (replacing any).
    pub fn hold(&self, meta: &Path, lease: gantry_image::Lease) {
        self.map().insert(meta.to_path_buf(), lease);
    }

    /// Drops the lease of `meta`'s container, if any.
    pub fn release(&self, meta: &Path) {
        self.map().remove(meta);
    }

    /// The digest leased for `meta`'s container.
    pub fn digest(&self, meta: &Path) -> Option<String> {
        self.map()
            .get(meta)
            .and_then(|l| l.digest().map(str::to_string))
    }

    /// How many leases are held.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The bundle's record of the registry image's digest (for [`retake_leases`]).
pub(super) const IMAGE_FILE: &str = "image";

/// Cleans up ([`cleanup`]: runtime state, root filesystem mount, bundle) every bundle under
/// `meta_root` whose container has ended: its supervisor recorded the runtime's exit, or no
/// supervisor claimed the launch (the agent died between preparing the bundle and starting
/// the supervisor; the launch is claimed for the agent then, so none will). The agent cleans a container up after its task's terminal status; this
/// catches what a crash in between left. Containers still running (or whose supervisor died
/// without recording an exit: the agent's recovery settles those) are left alone. Call it
/// at startup, before any launch. Returns how many were cleaned up. Blocking.
pub fn sweep_ended(cfg: &ContainerConfig, meta_root: &Path) -> usize {
    let Ok(dir) = std::fs::read_dir(meta_root) else {
        return 0;
    };
    let mut swept = 0;
    for entry in dir.flatten() {
        let meta = entry.path();
        if !meta.join("container").is_dir() {
            continue;
        }
        // No record yet: claimed for the agent, so no supervisor a crashed agent had started
        // runs it now (as the agent's recovery does, `executor::find_launched`).
        let claimed = crate::executor::record::claim_for_agent(&meta);
        let ended = claimed
            || crate::executor::record::read(&meta)
                .is_none_or(|r| r.exit.is_some() || r.supervisor.is_none());
        let task = entry.file_name().to_str().and_then(|s| s.parse().ok());
        if let (true, Some(task)) = (ended, task) {
            cleanup(cfg, &meta, task);
            swept += usize::from(!meta.join("container").exists());
        }
    }
    swept
}

/// Takes again, after an agent restart, the image leases of the containers whose bundles are
/// still under `meta_root` (`WORK_DIR/meta/TASK/container`), after [`sweep_ended`] has cleaned
/// up those of containers that had ended: call it before the agent pulls
/// anything, so no collection removes a running container's layers. Returns how many were
/// taken; an image the store no longer has is logged (its container keeps its mounted layers
/// until cleanup, which needs nothing of the store). Blocking.
pub fn retake_leases(cfg: &ContainerConfig, meta_root: &Path) -> usize {
    let swept = sweep_ended(cfg, meta_root);
    if swept > 0 {
        tracing::info!(swept, "cleaned up the bundles of containers that had ended");
    }
    let Some(store) = &cfg.images else {
        return 0;
    };
    let Ok(dir) = std::fs::read_dir(meta_root) else {
        return 0;
    };
    let mut taken = 0;
    for entry in dir.flatten() {
        let meta = entry.path();
        let Ok(digest) = std::fs::read_to_string(meta.join("container").join(IMAGE_FILE)) else {
            continue;
        };
        match store.lease(digest.trim()) {
            Ok(image) => {
                cfg.leases.hold(&meta, image.lease);
                taken += 1;
            }
            Err(e) => tracing::warn!(
                meta = %meta.display(),
                "re-taking the image lease of a container: {e}"
            ),
        }
    }
    taken
}
