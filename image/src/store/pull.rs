//! Pulls: single-flight per reference and per blob, streamed downloads checked against their
//! digests, and each layer unpacked once into the store (see the parent module for the layout).

use std::path::Path;
use std::sync::Arc;

use futures_util::StreamExt;
use oci_client::manifest::OciDescriptor;
use oci_client::Reference;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;

use super::{
    acquire, check_digest, hex_of, human_bytes, parse_config, registry, remove_tree, sha256_digest,
    Flight, Image, ImageError, ImageStore, Lease, MAX_CONFIG_BYTES,
};
use crate::index::{ImageRecord, LayerRecord};
use crate::unpack;

impl ImageStore {
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
}
