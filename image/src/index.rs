//! The store's on-disk index (`index.json`): which images and layers are complete, their sizes and
//! when each was last used. Written whole to a temporary file, synced, then renamed over the old
//! one, so a crash leaves either the old or the new index, never a torn one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ImageConfig;

/// One complete image: its layers (blob digests, lowest first) and its run configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ImageRecord {
    pub layers: Vec<String>,
    pub config: ImageConfig,
    /// Logical clock of the last pull or lease (larger is more recent).
    pub last_used: u64,
}

/// One complete, unpacked layer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LayerRecord {
    pub bytes: u64,
    pub last_used: u64,
}

/// The whole index.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Index {
    /// Image manifest digest → record.
    pub images: BTreeMap<String, ImageRecord>,
    /// Layer blob digest → record.
    pub layers: BTreeMap<String, LayerRecord>,
    /// Reference as pulled (`host/repo:tag`) → image manifest digest, the last one seen.
    pub refs: BTreeMap<String, String>,
    /// The logical clock: bumped on every use.
    pub clock: u64,
}

impl Index {
    pub(crate) fn load(path: &Path) -> std::io::Result<Index> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Index::default()),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    pub(crate) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Bytes of all complete layers.
    pub(crate) fn total_bytes(&self) -> u64 {
        self.layers.values().map(|l| l.bytes).sum()
    }
}

/// Which images and layers to remove to bring `index` under `max_bytes`: least recently used
/// unleased images first; a layer goes when no remaining image uses it and it is not leased.
/// Pure: the caller removes them from the index and the disk.
pub(crate) fn plan_collection(
    index: &Index,
    max_bytes: u64,
    leased_images: &dyn Fn(&str) -> bool,
    leased_layers: &dyn Fn(&str) -> bool,
) -> (Vec<String>, Vec<String>) {
    let mut total = index.total_bytes();
    let mut removed_images: Vec<String> = Vec::new();
    let mut removed_layers: Vec<String> = Vec::new();
    if total <= max_bytes {
        return (removed_images, removed_layers);
    }
    let layer_users = |removed: &[String], layer: &str| {
        index
            .images
            .iter()
            .filter(|(d, r)| !removed.contains(d) && r.layers.iter().any(|l| l == layer))
            .count()
    };
    // Orphan layers (no image, e.g. left by a failed pull) go first, oldest first.
    let mut layers: Vec<(&String, &LayerRecord)> = index.layers.iter().collect();
    layers.sort_by_key(|(_, l)| l.last_used);
    for (digest, rec) in &layers {
        if total <= max_bytes {
            break;
        }
        if !leased_layers(digest) && layer_users(&removed_images, digest) == 0 {
            removed_layers.push((*digest).clone());
            total = total.saturating_sub(rec.bytes);
        }
    }
    let mut images: Vec<(&String, &ImageRecord)> = index.images.iter().collect();
    images.sort_by_key(|(_, r)| r.last_used);
    for (digest, rec) in images {
        if total <= max_bytes {
            break;
        }
        if leased_images(digest) {
            continue;
        }
        removed_images.push(digest.clone());
        for layer in &rec.layers {
            if removed_layers.contains(layer) || leased_layers(layer) {
                continue;
            }
            if layer_users(&removed_images, layer) == 0 {
                if let Some(l) = index.layers.get(layer) {
                    total = total.saturating_sub(l.bytes);
                }
                removed_layers.push(layer.clone());
            }
        }
    }
    (removed_images, removed_layers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(images: &[(&str, &[&str], u64)], layers: &[(&str, u64)]) -> Index {
        let mut ix = Index::default();
        for (d, ls, used) in images {
            ix.images.insert(
                (*d).to_string(),
                ImageRecord {
                    layers: ls.iter().map(|s| (*s).to_string()).collect(),
                    config: ImageConfig::default(),
                    last_used: *used,
                },
            );
        }
        for (d, bytes) in layers {
            ix.layers.insert(
                (*d).to_string(),
                LayerRecord {
                    bytes: *bytes,
                    last_used: 0,
                },
            );
        }
        ix
    }

    #[test]
    fn under_the_bound_nothing_goes() {
        let ix = index(&[("a", &["l1"], 1)], &[("l1", 10)]);
        let (i, l) = plan_collection(&ix, 10, &|_| false, &|_| false);
        assert!(i.is_empty() && l.is_empty());
    }

    #[test]
    fn least_recently_used_unleased_image_goes_and_shared_layers_stay() {
        let ix = index(
            &[("old", &["base", "x"], 1), ("new", &["base", "y"], 2)],
            &[("base", 100), ("x", 50), ("y", 50)],
        );
        let (i, l) = plan_collection(&ix, 160, &|_| false, &|_| false);
        assert_eq!(i, vec!["old".to_string()]);
        assert_eq!(l, vec!["x".to_string()]);
    }

    #[test]
    fn leased_images_and_layers_are_never_collected() {
        let ix = index(
            &[("old", &["x"], 1), ("new", &["y"], 2)],
            &[("x", 50), ("y", 50)],
        );
        let (i, l) = plan_collection(&ix, 0, &|d| d == "old", &|d| d == "y");
        assert_eq!(i, vec!["new".to_string()]);
        assert!(l.is_empty(), "{l:?}");
    }

    #[test]
    fn orphan_layers_go_first() {
        let ix = index(&[("a", &["x"], 5)], &[("x", 50), ("orphan", 50)]);
        let (i, l) = plan_collection(&ix, 60, &|_| false, &|_| false);
        assert!(i.is_empty());
        assert_eq!(l, vec!["orphan".to_string()]);
    }
}
