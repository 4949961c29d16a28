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
//! (Over 800 lines since the tag cache: the pull, lease and collection paths share the store's
//! one lock and index; splitting them by concern is left for the next change here.)

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::StreamExt;
use oci_client::manifest::OciDescriptor;
use oci_client::Reference;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;

use crate::index::{plan_collection, ImageRecord, Index, LayerRecord};
use crate::registry;
use crate::unpack;
use crate::ImageError;

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

    fn flight(&self, key: String) -> Flight {
        let mut f = self.inner.flights.lock().unwrap_or_else(|p| p.into_inner());
        f.entry(key).or_default().clone()
    }

    fn land(&self, key: &str, flight: Flight) {
        let mut f = self.inner.flights.lock().unwrap_or_else(|p| p.into_inner());
        // The map's copy and ours: nobody else waits on it.
        if Arc::strong_count(&flight) == 2 {
            f.remove(key);
        }
    }

    /// Pulls `reference` (`host[:port]/repo[:tag][@sha256:…]`) unless the store has it: at most one
    /// pull per reference and one download per blob run at a time, however many callers ask; the
    /// others wait and share the result. Every blob's sha256 is checked while it streams (a
    /// mismatch deletes it and fails with [`ImageError::Digest`]); each layer is unpacked once.
    /// `progress` gets human lines for the task's `STARTING` updates. Afterwards, unleased images
    /// are collected to keep the store under its bound.
    pub async fn pull(
        &self,
        reference: &str,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<Image, ImageError> {
        let r: Reference =
            reference
                .parse()
                .map_err(|e: oci_client::ParseError| ImageError::Reference {
                    reference: reference.to_string(),
                    message: e.to_string(),
                })?;
        if let Some(d) = r.digest() {
            check_digest(d)?;
        } else if let Some(digest) = self.fresh_tag(&r.whole()) {
            // A tag resolved moments ago (the tag cache): no registry round trip.
            if let Some(image) = self.lease_stored(&digest)? {
                progress(format!("image {reference} is cached ({digest})"));
                return Ok(image);
            }
        }
        let key = format!("ref:{}", r.whole());
        let flight = self.flight(key.clone());
        let result = {
            let mut guard = flight.lock().await;
            // A pull of this reference finished while we queued behind it: share its result
            // (a few milliseconds old) instead of asking the registry again.
            let shared = match guard.as_deref() {
                Some(digest) => self.lease_stored(digest)?,
                None => None,
            };
            match shared {
                Some(image) => {
                    progress(format!("image {reference} is cached ({})", image.digest));
                    Ok(image)
                }
                None => {
                    let result = self.pull_locked(&r, reference, progress).await;
                    if let Ok(image) = &result {
                        *guard = Some(image.digest.clone());
                    }
                    result
                }
            }
        };
        self.land(&key, flight);
        let image = result?;
        self.collect().await?;
        Ok(image)
    }

    async fn pull_locked(
        &self,
        r: &Reference,
        reference: &str,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<Image, ImageError> {
        let registry = r.resolve_registry().to_string();
        let mapped = |e| registry::map_error(e, reference, &registry);
        if let Some(d) = r.digest() {
            if let Some(img) = self.lease_stored(d)? {
                progress(format!("image {reference} is cached"));
                return Ok(img);
            }
        }
        let auth = registry::auth_for(&self.inner.creds, &registry);
        progress(format!("pulling image {reference}"));
        let (manifest, digest) = self
            .inner
            .client
            .pull_image_manifest(r, &auth)
            .await
            .map_err(mapped)?;
        check_digest(&digest)?;
        if r.digest().is_none() {
            self.remember_tag(r.whole(), &digest);
        }
        if let Some(img) = self.lease_stored(&digest)? {
            let mut st = self.inner.lock();
            st.index.refs.insert(r.whole(), digest.clone());
            let _ = self.inner.save(&st);
            drop(st);
            progress(format!("image {reference} is cached ({digest})"));
            return Ok(img);
        }
        // The config: small, verified, kept in the index.
        check_digest(&manifest.config.digest)?;
        let config_bytes = self.fetch_small(r, &manifest.config, reference).await?;
        let config = parse_config(&config_bytes).map_err(|m| ImageError::Unsupported {
            reference: reference.to_string(),
            message: format!("config blob {}: {m}", manifest.config.digest),
        })?;
        let n = manifest.layers.len();
        let mut layer_lease = Lease {
            inner: self.inner.clone(),
            image: None,
            layers: Vec::with_capacity(n),
        };
        for (i, layer) in manifest.layers.iter().enumerate() {
            check_digest(&layer.digest)?;
            if layer.media_type.contains("zstd") {
                return Err(ImageError::Unsupported {
                    reference: reference.to_string(),
                    message: format!("layer {} is {}", layer.digest, layer.media_type),
                });
            }
            let size = u64::try_from(layer.size).unwrap_or(0);
            let fetched = self
                .ensure_layer(r, layer, reference, &mut layer_lease)
                .await?;
            if fetched {
                progress(format!(
                    "pulled layer {}/{n} ({})",
                    i + 1,
                    human_bytes(size)
                ));
            } else {
                progress(format!("layer {}/{n} is cached", i + 1));
            }
        }
        let layers: Vec<String> = manifest.layers.iter().map(|l| l.digest.clone()).collect();
        let image = {
            let mut st = self.inner.lock();
            let now = st.index.tick();
            st.index.images.insert(
                digest.clone(),
                ImageRecord {
                    layers,
                    config,
                    last_used: now,
                },
            );
            st.index.refs.insert(r.whole(), digest.clone());
            self.inner.save(&st)?;
            self.lease_in(&mut st, &digest)
                .ok_or_else(|| ImageError::NotStored(digest.clone()))?
        };
        drop(layer_lease);
        progress(format!("image {reference} ready ({digest})"));
        Ok(image)
    }

    /// Makes sure one layer is unpacked in the store and leased by `lease`; returns whether it
    /// had to be downloaded.
    async fn ensure_layer(
        &self,
        r: &Reference,
        layer: &OciDescriptor,
        reference: &str,
        lease: &mut Lease,
    ) -> Result<bool, ImageError> {
        let key = format!("blob:{}", layer.digest);
        let flight = self.flight(key.clone());
        let result = {
            let _guard = flight.lock().await;
            self.ensure_layer_locked(r, layer, reference, lease).await
        };
        self.land(&key, flight);
        result
    }

    async fn ensure_layer_locked(
        &self,
        r: &Reference,
        layer: &OciDescriptor,
        reference: &str,
        lease: &mut Lease,
    ) -> Result<bool, ImageError> {
        let digest = layer.digest.clone();
        {
            let mut st = self.inner.lock();
            if st.index.layers.contains_key(&digest) {
                acquire(&mut st.layer_leases, &digest);
                lease.layers.push(digest);
                return Ok(false);
            }
        }
        let hex = hex_of(&digest).to_string();
        let blob = self.inner.blobs_dir().join(format!("tmp-{hex}"));
        let result = self
            .download_and_unpack(r, layer, reference, &blob, &hex)
            .await;
        let _ = std::fs::remove_file(&blob);
        let bytes = result?;
        let mut st = self.inner.lock();
        let now = st.index.tick();
        st.index.layers.insert(
            digest.clone(),
            LayerRecord {
                bytes,
                last_used: now,
            },
        );
        acquire(&mut st.layer_leases, &digest);
        lease.layers.push(digest);
        self.inner.save(&st)?;
        Ok(true)
    }

    async fn download_and_unpack(
        &self,
        r: &Reference,
        layer: &OciDescriptor,
        reference: &str,
        blob: &Path,
        hex: &str,
    ) -> Result<u64, ImageError> {
        self.download(r, layer, reference, blob).await?;
        let work = self.inner.layers_dir().join(format!("tmp-{hex}"));
        let done = self.inner.layer_dir(&layer.digest);
        let (blob, digest) = (blob.to_path_buf(), layer.digest.clone());
        tokio::task::spawn_blocking(move || -> Result<u64, ImageError> {
            remove_tree(&work)?;
            remove_tree(&done)?;
            std::fs::create_dir(&work)
                .map_err(|e| ImageError::io(format!("creating {}", work.display()), e))?;
            match unpack::unpack_layer(&blob, &work) {
                Ok(bytes) => {
                    std::fs::rename(&work, &done).map_err(|e| {
                        ImageError::io(format!("renaming {} into place", work.display()), e)
                    })?;
                    Ok(bytes)
                }
                Err(e) => {
                    let _ = remove_tree(&work);
                    Err(ImageError::Unpack {
                        digest,
                        message: e.0,
                    })
                }
            }
        })
        .await
        .map_err(|e| ImageError::io("unpacking a layer", std::io::Error::other(e)))?
    }

    fn count_download(&self, digest: &str) {
        let mut d = self
            .inner
            .downloads
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *d.entry(digest.to_string()).or_insert(0) += 1;
    }

    /// Streams a blob to `dest`, hashing as it goes; on a mismatch the file is deleted.
    async fn download(
        &self,
        r: &Reference,
        desc: &OciDescriptor,
        reference: &str,
        dest: &Path,
    ) -> Result<(), ImageError> {
        let registry = r.resolve_registry().to_string();
        self.count_download(&desc.digest);
        let mut stream = self
            .inner
            .client
            .pull_blob_stream(r, desc)
            .await
            .map_err(|e| registry::map_error(e, reference, &registry))?;
        let mut file = tokio::fs::File::create(dest)
            .await
            .map_err(|e| ImageError::io(format!("creating {}", dest.display()), e))?;
        let mut hasher = Sha256::new();
        let mut received = 0u64;
        let expected_size = u64::try_from(desc.size).unwrap_or(0);
        let mut failure = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    hasher.update(&bytes);
                    received += bytes.len() as u64;
                    if let Err(e) = file.write_all(&bytes).await {
                        failure = Some(ImageError::io(format!("writing {}", dest.display()), e));
                        break;
                    }
                }
                Err(e) => {
                    // The client's own digest check fails at the end of the stream; ours below
                    // gives the clearer error, so a failure after all the bytes defers to it.
                    if received < expected_size || expected_size == 0 {
                        failure = Some(ImageError::Transport {
                            registry: registry.clone(),
                            message: format!(
                                "downloading {}: {}",
                                desc.digest,
                                registry::chain(&e)
                            ),
                        });
                    }
                    break;
                }
            }
        }
        let got = sha256_digest(hasher);
        let failure = match failure {
            Some(f) => Some(f),
            None if got != desc.digest => Some(ImageError::Digest {
                expected: desc.digest.clone(),
                got,
            }),
            None => None,
        };
        if let Some(f) = failure {
            drop(file);
            let _ = tokio::fs::remove_file(dest).await;
            return Err(f);
        }
        file.sync_all()
            .await
            .map_err(|e| ImageError::io(format!("syncing {}", dest.display()), e))?;
        Ok(())
    }

    /// Downloads a small blob (the config) into memory, verified.
    async fn fetch_small(
        &self,
        r: &Reference,
        desc: &OciDescriptor,
        reference: &str,
    ) -> Result<Vec<u8>, ImageError> {
        if usize::try_from(desc.size).map_or(true, |s| s > MAX_CONFIG_BYTES) {
            return Err(ImageError::Unsupported {
                reference: reference.to_string(),
                message: format!("config blob of {} bytes", desc.size),
            });
        }
        let tmp = self
            .inner
            .blobs_dir()
            .join(format!("tmp-{}-config", hex_of(&desc.digest)));
        let result = self.download(r, desc, reference, &tmp).await;
        let bytes = match result {
            Ok(()) => std::fs::read(&tmp)
                .map_err(|e| ImageError::io(format!("reading {}", tmp.display()), e)),
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&tmp);
        bytes
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
