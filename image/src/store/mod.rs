//! [`ImageStore`]: the agent's content-addressed layer cache, single-flight pulls, leases and the
//! size bound.
//!
//! On disk, under [`StoreConfig::dir`]:
//!
//! - `index.json`: the complete images and layers (see `index`), replaced atomically;
//! - `layers/<hex>/`: one unpacked layer per blob digest (`sha256:<hex>`), overlay-ready;
//! - `layers/tmp-<hex>/`, `blobs/tmp-<hex>`: work in progress, removed on open, never used;
//! - `layers/gc-<hex>/`: a layer being removed, removed on open.
//!
//! A layer is in the index only once its directory is complete and renamed into place, and an
//! image only once all its layers are; a crash at any point leaves the store usable.
//!
//! Modules: this one holds the store's state, opening, leases, the tag cache and collection;
//! `pull` holds pulls (single flight, downloads checked while they stream, unpacking).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::index::{plan_collection, Index};
use crate::registry;
use crate::ImageError;

mod pull;

/// The largest config blob accepted (they are a few KiB; this bounds memory).
const MAX_CONFIG_BYTES: usize = 4 << 20;

/// How an agent's image store is set up.
#[derive(Debug, Clone, Default)]
pub struct StoreConfig {
    /// The store's directory (created if missing). Must be on a file system that overlayfs accepts
    /// as a lower layer and that keeps `trusted.*` extended attributes (ext4, xfs, tmpfs).
    pub dir: PathBuf,
    /// The bound on the bytes of unpacked layers; least recently used images and layers that no
    /// lease holds are removed to stay under it (leased ones never are, so the bound can be
    /// exceeded while every image in the store is in use).
    pub max_bytes: u64,
    /// Registries (`host:port`) reached over plain HTTP instead of HTTPS.
    pub insecure: Vec<String>,
    /// A docker `config.json` (`auths.{host}.auth` = base64 `user:password`) with the credentials
    /// for registries that require them (basic, or basic exchanged for a bearer token).
    pub credentials: Option<PathBuf>,
    /// PEM CA files trusted for registries, besides the host's trust store (`/etc/ssl/certs`).
    pub extra_roots: Vec<PathBuf>,
}

/// How a container runs by default, from the image's config blob.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `KEY=value` pairs.
    pub env: Vec<String>,
    /// The entrypoint (may be empty).
    pub entrypoint: Vec<String>,
    /// The default arguments (the command when there is no entrypoint).
    pub cmd: Vec<String>,
    /// The working directory, when the image sets one.
    pub working_dir: Option<String>,
    /// The user (`name`, `uid`, `uid:gid`), when the image sets one.
    pub user: Option<String>,
}

#[derive(Deserialize)]
struct ConfigBlob {
    #[serde(default)]
    config: Option<ConfigSection>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ConfigSection {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
}

fn parse_config(bytes: &[u8]) -> Result<ImageConfig, String> {
    let blob: ConfigBlob = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let Some(c) = blob.config else {
        return Ok(ImageConfig::default());
    };
    Ok(ImageConfig {
        env: c.env.unwrap_or_default(),
        entrypoint: c.entrypoint.unwrap_or_default(),
        cmd: c.cmd.unwrap_or_default(),
        working_dir: c.working_dir.filter(|w| !w.is_empty()),
        user: c.user.filter(|u| !u.is_empty()),
    })
}

/// An image ready to run: its unpacked layers and its config, held in the store by `lease`.
#[derive(Debug)]
pub struct Image {
    /// The image manifest's digest (`sha256:…`); for a manifest list, the linux/amd64 manifest's.
    pub digest: String,
    /// The unpacked layer directories, lowest first (overlayfs `lowerdir` wants them reversed).
    pub layers: Vec<PathBuf>,
    /// The image's run configuration.
    pub config: ImageConfig,
    /// Keeps the image and its layers in the store until dropped.
    pub lease: Lease,
}

/// Keeps an image's layers (or, during a pull, single layers) from being collected. Dropping it
/// releases them. After an agent restart, take it again with [`ImageStore::lease`] and the digest.
pub struct Lease {
    inner: Arc<Inner>,
    image: Option<String>,
    layers: Vec<String>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("image", &self.image)
            .field("layers", &self.layers.len())
            .finish()
    }
}

impl Lease {
    /// The leased image's digest.
    pub fn digest(&self) -> Option<&str> {
        self.image.as_deref()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        if let Some(image) = &self.image {
            release(&mut st.image_leases, image);
        }
        for layer in &self.layers {
            release(&mut st.layer_leases, layer);
        }
    }
}

fn release(map: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

fn acquire(map: &mut HashMap<String, usize>, key: &str) {
    *map.entry(key.to_string()).or_insert(0) += 1;
}

/// What the store holds, for metrics and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUsage {
    /// Bytes of unpacked layers.
    pub bytes: u64,
    /// The bound.
    pub max_bytes: u64,
    /// Complete images.
    pub images: usize,
    /// Complete layers.
    pub layers: usize,
}

/// One single-flight slot: callers queue on the lock; a pull that succeeds leaves the image
/// digest in it for the callers that queued behind it.
type Flight = Arc<tokio::sync::Mutex<Option<String>>>;

struct State {
    index: Index,
    image_leases: HashMap<String, usize>,
    layer_leases: HashMap<String, usize>,
}

struct Inner {
    cfg: StoreConfig,
    client: oci_client::Client,
    creds: BTreeMap<String, (String, String)>,
    state: Mutex<State>,
    flights: Mutex<HashMap<String, Flight>>,
    downloads: Mutex<BTreeMap<String, u64>>,
    /// Tag references the registry resolved, with the digest and when (see
    /// [`ImageStore::set_tag_cache`]).
    tags: Mutex<HashMap<String, (String, std::time::Instant)>>,
    /// How long a resolved tag is trusted without asking the registry again.
    tag_ttl: Mutex<std::time::Duration>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counts that are still consistent enough to go on.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn index_path(&self) -> PathBuf {
        self.cfg.dir.join("index.json")
    }

    fn layers_dir(&self) -> PathBuf {
        self.cfg.dir.join("layers")
    }

    fn blobs_dir(&self) -> PathBuf {
        self.cfg.dir.join("blobs")
    }

    fn layer_dir(&self, digest: &str) -> PathBuf {
        self.layers_dir().join(hex_of(digest))
    }

    fn save(&self, st: &State) -> Result<(), ImageError> {
        st.index
            .save(&self.index_path())
            .map_err(|e| ImageError::io("writing the image index", e))
    }
}

/// The hex part of `sha256:<hex>` (the digest is validated before it gets here).
fn hex_of(digest: &str) -> &str {
    digest.split_once(':').map_or(digest, |(_, h)| h)
}

fn check_digest(digest: &str) -> Result<(), ImageError> {
    match digest.split_once(':') {
        Some(("sha256", hex))
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) =>
        {
            Ok(())
        }
        _ => Err(ImageError::Unsupported {
            reference: digest.to_string(),
            message: "only sha256 digests (sha256:<64 lowercase hex>) are supported".into(),
        }),
    }
}

fn sha256_digest(h: Sha256) -> String {
    let bytes = h.finalize();
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// `3.1 MB`, `512 B`: sizes for progress lines.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// How long a tag the registry resolved is trusted by default ([`ImageStore::set_tag_cache`]).
pub const DEFAULT_TAG_CACHE: std::time::Duration = std::time::Duration::from_secs(10);

/// One agent's image store: pulls, verifies, unpacks and caches images. Cheap to clone.
#[derive(Clone)]
pub struct ImageStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageStore")
            .field("dir", &self.inner.cfg.dir)
            .finish()
    }
}

fn remove_tree(path: &Path) -> Result<(), ImageError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
    .map_err(|e| ImageError::io(format!("removing {}", path.display()), e))
}

impl ImageStore {
    /// Opens (creating if needed) the store at `cfg.dir`: loads the index, removes work left by a
    /// crash (half-unpacked layers, partial downloads, half-removed layers) and layers the index
    /// does not list, and forgets index entries whose directories are gone.
    pub fn open(cfg: StoreConfig) -> Result<ImageStore, ImageError> {
        let client = registry::client(&cfg)?;
        let creds = match &cfg.credentials {
            Some(path) => registry::load_credentials(path)?,
            None => BTreeMap::new(),
        };
        for d in [
            cfg.dir.clone(),
            cfg.dir.join("layers"),
            cfg.dir.join("blobs"),
        ] {
            std::fs::create_dir_all(&d)
                .map_err(|e| ImageError::io(format!("creating {}", d.display()), e))?;
        }
        let index_path = cfg.dir.join("index.json");
        let mut index = Index::load(&index_path)
            .map_err(|e| ImageError::io(format!("reading {}", index_path.display()), e))?;
        // Partial downloads are never resumed.
        let blobs = cfg.dir.join("blobs");
        for entry in read_dir(&blobs)? {
            remove_tree(&blobs.join(entry))?;
        }
        let layers = cfg.dir.join("layers");
        let known: std::collections::HashSet<String> =
            index.layers.keys().map(|d| hex_of(d).to_string()).collect();
        for name in read_dir(&layers)? {
            if !known.contains(&name) {
                remove_tree(&layers.join(name))?;
            }
        }
        let missing: Vec<String> = index
            .layers
            .keys()
            .filter(|d| !layers.join(hex_of(d)).is_dir())
            .cloned()
            .collect();
        for d in &missing {
            index.layers.remove(d);
        }
        index
            .images
            .retain(|_, r| r.layers.iter().all(|l| !missing.contains(l)));
        let images = &index.images;
        index.refs.retain(|_, d| images.contains_key(d));
        let inner = Arc::new(Inner {
            cfg,
            client,
            creds,
            state: Mutex::new(State {
                index,
                image_leases: HashMap::new(),
                layer_leases: HashMap::new(),
            }),
            flights: Mutex::new(HashMap::new()),
            downloads: Mutex::new(BTreeMap::new()),
            tags: Mutex::new(HashMap::new()),
            tag_ttl: Mutex::new(DEFAULT_TAG_CACHE),
        });
        {
            let st = inner.lock();
            inner.save(&st)?;
        }
        Ok(ImageStore { inner })
    }

    /// Trusts a tag the registry resolved for `ttl` (default [`DEFAULT_TAG_CACHE`]): a pull of
    /// the same tag within it leases the stored image without the manifest request (a burst of
    /// launches of `repo:tag` costs one registry round trip), at the price of seeing a tag
    /// moved on the registry up to `ttl` late. Zero: every tag pull asks the registry.
    pub fn set_tag_cache(&self, ttl: std::time::Duration) {
        *self.inner.tag_ttl.lock().unwrap_or_else(|p| p.into_inner()) = ttl;
        if ttl.is_zero() {
            self.inner
                .tags
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
    }

    /// The digest a tag reference resolved to less than the tag cache's time ago.
    fn fresh_tag(&self, whole: &str) -> Option<String> {
        let ttl = *self.inner.tag_ttl.lock().unwrap_or_else(|p| p.into_inner());
        let tags = self.inner.tags.lock().unwrap_or_else(|p| p.into_inner());
        let (digest, at) = tags.get(whole)?;
        (at.elapsed() < ttl).then(|| digest.clone())
    }

    fn remember_tag(&self, whole: String, digest: &str) {
        if self
            .inner
            .tag_ttl
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_zero()
        {
            return;
        }
        let mut tags = self.inner.tags.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: entries past their time go when the map grows.
        if tags.len() >= 1024 {
            let ttl = *self.inner.tag_ttl.lock().unwrap_or_else(|p| p.into_inner());
            tags.retain(|_, (_, at)| at.elapsed() < ttl);
        }
        if tags.len() < 4096 {
            tags.insert(whole, (digest.to_string(), std::time::Instant::now()));
        }
    }

    /// Takes a lease on an image already in the store (after an agent restart, for a container
    /// that runs on it), without any registry traffic.
    pub fn lease(&self, digest: &str) -> Result<Image, ImageError> {
        self.lease_stored(digest)?
            .ok_or_else(|| ImageError::NotStored(digest.to_string()))
    }

    fn lease_stored(&self, digest: &str) -> Result<Option<Image>, ImageError> {
        let mut st = self.inner.lock();
        Ok(self.lease_in(&mut st, digest))
    }

    /// Takes a lease on a stored image under the state lock (so no collection runs in between).
    fn lease_in(&self, st: &mut State, digest: &str) -> Option<Image> {
        let rec = st.index.images.get(digest).cloned()?;
        let now = st.index.tick();
        if let Some(r) = st.index.images.get_mut(digest) {
            r.last_used = now;
        }
        for l in &rec.layers {
            if let Some(lr) = st.index.layers.get_mut(l) {
                lr.last_used = now;
            }
        }
        acquire(&mut st.image_leases, digest);
        for l in &rec.layers {
            acquire(&mut st.layer_leases, l);
        }
        let lease = Lease {
            inner: self.inner.clone(),
            image: Some(digest.to_string()),
            layers: rec.layers.clone(),
        };
        // The clock moved in memory only: it reaches the disk with the next change of the index
        // (a pull, a collection), so a task launch from a cached image costs no fsync. After a
        // crash the LRU order may be slightly older; nothing else depends on it.
        Some(Image {
            digest: digest.to_string(),
            layers: rec.layers.iter().map(|l| self.inner.layer_dir(l)).collect(),
            config: rec.config,
            lease,
        })
    }

    /// What the store holds.
    pub fn usage(&self) -> StoreUsage {
        let st = self.inner.lock();
        StoreUsage {
            bytes: st.index.total_bytes(),
            max_bytes: self.inner.cfg.max_bytes,
            images: st.index.images.len(),
            layers: st.index.layers.len(),
        }
    }

    /// How many times each blob (config or layer, by digest) was downloaded since the store was
    /// opened: single-flight means once per blob however many pulls ran at the same time.
    pub fn blob_downloads(&self) -> BTreeMap<String, u64> {
        self.inner
            .downloads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The digests of the images in the store.
    pub fn images(&self) -> Vec<String> {
        self.inner.lock().index.images.keys().cloned().collect()
    }

    /// Removes least recently used, unleased images and layers until the store is under its
    /// bound (a no-op when it is). Runs after every pull; callable any time.
    pub async fn collect(&self) -> Result<(), ImageError> {
        let doomed: Vec<PathBuf> = {
            let mut st = self.inner.lock();
            let (images, layers) = {
                let st_ref = &*st;
                plan_collection(
                    &st_ref.index,
                    self.inner.cfg.max_bytes,
                    &|d| st_ref.image_leases.contains_key(d),
                    &|d| st_ref.layer_leases.contains_key(d),
                )
            };
            if images.is_empty() && layers.is_empty() {
                return Ok(());
            }
            for d in &images {
                st.index.images.remove(d);
            }
            for d in &layers {
                st.index.layers.remove(d);
            }
            let images_left = st.index.images.clone();
            st.index.refs.retain(|_, d| images_left.contains_key(d));
            self.inner.save(&st)?;
            tracing::info!(
                images = images.len(),
                layers = layers.len(),
                "collected images"
            );
            layers.iter().map(|d| self.inner.layer_dir(d)).collect()
        };
        let gc_root = self.inner.layers_dir();
        tokio::task::spawn_blocking(move || -> Result<(), ImageError> {
            for dir in doomed {
                let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
                let gc = gc_root.join(format!("gc-{}", name.unwrap_or_default()));
                if std::fs::rename(&dir, &gc).is_ok() {
                    remove_tree(&gc)?;
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| ImageError::io("removing layers", std::io::Error::other(e)))?
    }
}

fn read_dir(dir: &Path) -> Result<Vec<String>, ImageError> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| ImageError::io(format!("reading {}", dir.display()), e))?;
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| ImageError::io(format!("reading {}", dir.display()), e))?;
        out.push(entry.file_name().to_string_lossy().into_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_blob_fields() {
        let c = parse_config(
            br#"{"architecture":"amd64","config":{"Env":["PATH=/bin"],"Entrypoint":null,
                 "Cmd":["sh"],"WorkingDir":"/w","User":""}}"#,
        )
        .unwrap();
        assert_eq!(c.env, vec!["PATH=/bin".to_string()]);
        assert!(c.entrypoint.is_empty());
        assert_eq!(c.cmd, vec!["sh".to_string()]);
        assert_eq!(c.working_dir.as_deref(), Some("/w"));
        assert_eq!(c.user, None);
        assert_eq!(parse_config(b"{}").unwrap(), ImageConfig::default());
        assert!(parse_config(b"[").is_err());
    }

    #[test]
    fn digests_are_checked() {
        assert!(check_digest(&format!("sha256:{}", "a".repeat(64))).is_ok());
        assert!(check_digest("sha256:../../etc").is_err());
        assert!(check_digest(&format!("sha512:{}", "a".repeat(128))).is_err());
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3_100_000), "3.1 MB");
    }
}
