//! # gantry-image
//!
//! OCI images for Gantry agents: pull from an OCI distribution registry, verify every blob's
//! digest, keep a content-addressed cache of unpacked, overlay-ready layers under a size bound,
//! and hand out leases that keep an image's layers on disk while containers use them. The agent
//! owns one [`ImageStore`]; the container runtime stacks [`Image::layers`] with overlayfs.
//!
//! ## Module map
//!
//! - `store`: [`ImageStore`] (open, [`ImageStore::pull`], [`ImageStore::lease`], collection),
//!   [`StoreConfig`], [`Image`], [`ImageConfig`], [`Lease`]. Single-flight: one pull per
//!   reference and one download per blob at a time, the others wait and share the result.
//!   A tag the registry resolved is trusted for [`DEFAULT_TAG_CACHE`] (10 s;
//!   [`ImageStore::set_tag_cache`]): tag launches within it send no manifest request.
//!   `store::pull` holds the pull path (downloads, digest checks, unpacking).
//! - `index`: the crash-safe on-disk index (`index.json`, write-then-rename) and the pure
//!   collection planner (least recently used unleased images first, shared layers kept).
//! - `unpack`: a layer archive (tar, gzip or uncompressed) into a directory, with overlayfs
//!   whiteouts and opaque directories, modes, owners and times, refusing any entry that would
//!   land outside the layer.
//! - `registry`: the OCI client's configuration (HTTPS with the host's and extra roots, plain HTTP for
//!   named insecure registries, linux/amd64 from manifest lists), docker `config.json`
//!   credentials, and the mapping of registry errors to [`ImageError`].
//! - `error`: [`ImageError`] and the task-status reasons.
//!
//! ## Crates chosen
//!
//! - [`oci-client`](https://crates.io/crates/oci-client) (the CNCF/Krustlet OCI distribution
//!   client, formerly `oci-distribution`): references, manifests and manifest lists, the token
//!   and basic auth flows, blob streams. Its `rustls-tls-native-roots` feature is reqwest 0.12 on
//!   rustls with the `ring` provider, so the tree stays free of aws-lc-rs and openssl
//!   (`deny.toml`); registries are trusted through the host's trust store
//!   (`rustls-native-certs`, Debian's `ca-certificates`) plus [`StoreConfig::extra_roots`]
//!   (the bundled webpki-roots list is CDLA-licensed, which `deny.toml` does not allow).
//! - [`tar`](https://crates.io/crates/tar) to read archives (entries are written by `unpack`,
//!   not by `tar`'s unpacker, to keep the whiteout and escape rules in one place),
//!   [`flate2`](https://crates.io/crates/flate2) for gzip, [`sha2`](https://crates.io/crates/sha2)
//!   for digests while streaming.
//!
//! zstd-compressed layers are refused with a clear error (no pure-Rust zstd decoder in the tree).

mod error;
mod index;
mod registry;
mod store;
mod unpack;

pub use error::{ImageError, REASON_PULL_FAILED, REASON_STORE_FAILED};
pub use store::{
    human_bytes, Image, ImageConfig, ImageStore, Lease, StoreConfig, StoreUsage, DEFAULT_TAG_CACHE,
};
