//! [`ImageError`]: every way a pull, a lease or the store can fail, with the task-status reason.

use std::path::PathBuf;

/// The task-status reason of every failure to get a task's image (the issue's `image-pull-failed`).
pub const REASON_PULL_FAILED: &str = "image-pull-failed";
/// The task-status reason when the agent's own image store fails (disk, index), not the image.
pub const REASON_STORE_FAILED: &str = "image-store-failed";

/// Why an image could not be pulled, leased or stored. The `Display` text is meant for the task's
/// status message: it names the image or registry and says what the registry answered.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The reference does not parse (`host:port/repo[:tag][@sha256:…]`).
    #[error("invalid image reference {reference:?}: {message}")]
    Reference {
        /// The reference as given.
        reference: String,
        /// What is wrong with it.
        message: String,
    },
    /// The registry answered with an error status that is neither "not found" nor "unauthorized".
    #[error("registry {registry} answered {status}: {message}")]
    Registry {
        /// `host[:port]` of the registry.
        registry: String,
        /// The HTTP status (0 when the registry's answer was not HTTP-level, e.g. a bad manifest).
        status: u16,
        /// The registry's error message.
        message: String,
    },
    /// The registry refused the credentials (or wants some and none are configured).
    #[error("registry {registry} refused access: {message}")]
    Auth {
        /// `host[:port]` of the registry.
        registry: String,
        /// The registry's error message.
        message: String,
    },
    /// A blob's content does not hash to its digest; the downloaded copy was deleted.
    #[error("blob {expected} failed verification: its content hashes to {got}")]
    Digest {
        /// The digest the manifest names.
        expected: String,
        /// The digest of what the registry sent.
        got: String,
    },
    /// The repository, tag or digest does not exist at the registry.
    #[error("image {reference} not found: {message}")]
    NotFound {
        /// The reference as given.
        reference: String,
        /// The registry's error message.
        message: String,
    },
    /// The registry could not be reached (connection refused, TLS failure, timeout).
    #[error("cannot reach registry {registry}: {message}")]
    Transport {
        /// `host[:port]` of the registry.
        registry: String,
        /// The transport error.
        message: String,
    },
    /// A layer's archive is corrupt, unsupported or hostile (a path escaping the layer).
    #[error("layer {digest} cannot be unpacked: {message}")]
    Unpack {
        /// The layer's blob digest.
        digest: String,
        /// What is wrong with it.
        message: String,
    },
    /// The image uses something this store does not support (a media type, a platform).
    #[error("unsupported image {reference}: {message}")]
    Unsupported {
        /// The reference as given.
        reference: String,
        /// What is unsupported.
        message: String,
    },
    /// [`crate::ImageStore::lease`] was asked for an image digest the store does not hold.
    #[error("image {0} is not in the store")]
    NotStored(String),
    /// The credentials file cannot be read or parsed.
    #[error("credentials file {path}: {message}")]
    Credentials {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A CA file in `extra_roots` cannot be read.
    #[error("registry CA file {path}: {message}")]
    Roots {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A file-system operation of the store failed.
    #[error("{context}: {source}")]
    Io {
        /// What the store was doing.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl ImageError {
    /// The task-status reason: [`REASON_PULL_FAILED`] for anything about the image or the
    /// registry, [`REASON_STORE_FAILED`] when the agent's own store failed.
    pub fn reason(&self) -> &'static str {
        match self {
            ImageError::Io { .. } | ImageError::NotStored(_) => REASON_STORE_FAILED,
            _ => REASON_PULL_FAILED,
        }
    }

    /// A short machine-readable kind (`auth`, `digest`, `not-found`, …) for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ImageError::Reference { .. } => "reference",
            ImageError::Registry { .. } => "registry",
            ImageError::Auth { .. } => "auth",
            ImageError::Digest { .. } => "digest",
            ImageError::NotFound { .. } => "not-found",
            ImageError::Transport { .. } => "transport",
            ImageError::Unpack { .. } => "unpack",
            ImageError::Unsupported { .. } => "unsupported",
            ImageError::NotStored(_) => "not-stored",
            ImageError::Credentials { .. } => "credentials",
            ImageError::Roots { .. } => "roots",
            ImageError::Io { .. } => "io",
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> ImageError {
        ImageError::Io {
            context: context.into(),
            source,
        }
    }
}
