//! A task's container ([`ContainerInfo`]): its image, network and volumes (host paths and
//! persistent volumes), with the bounds the master checks ([`container_limits`]).
//! docs/containers.md is the users' guide.

use super::*;

/// Bounds of a [`ContainerInfo`] (the master refuses a task past them).
pub mod container_limits {
    /// Bytes of an image reference.
    pub const IMAGE: usize = 512;
    /// Volumes of one task.
    pub const VOLUMES: usize = 32;
    /// Bytes of a path (host or container).
    pub const PATH: usize = 1024;
    /// Bytes of a persistent volume's name (`A-Z a-z 0-9 . _ -`, not starting with `.`).
    pub const VOLUME_NAME: usize = 64;
    /// Words of `entrypoint` plus `args`.
    pub const WORDS: usize = 1024;
    /// Bytes of `entrypoint`, `args` and `working_dir` together.
    pub const WORD_BYTES: usize = 64 * 1024;
}

/// A task's container: its root filesystem from an OCI image, run under an OCI runtime with
/// its own pid, mount, ipc and uts namespaces (docs/containers.md). The task's `command` runs
/// in it (a shell string with the image's `/bin/sh`); an empty command runs the image's
/// entrypoint and cmd, or `entrypoint` / `args` when set. The task's `env` is added to the
/// image's.
///
/// ```
/// use gantry_proto::{ContainerInfo, ContainerNetwork, TaskInfo, Volume};
/// let c = ContainerInfo::new("registry.example:5000/pytorch:24.05")
///     .with_volume(Volume::persistent("ckpt", "/ckpt"))
///     .with_volume(Volume::host("/datasets", "/data").read_only())
///     .with_network(ContainerNetwork::None);
/// assert_eq!(c.problem(), None);
/// let t = TaskInfo::new("train", "python3 train.py", "cpus:1;mem:512".parse().unwrap())
///     .with_container(c);
/// assert!(t.container.is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerInfo {
    /// An OCI image reference (`host[:port]/repo[:tag][@sha256:...]`), or `rootfs:NAME`, an
    /// unpacked root filesystem the agent names with `--local-rootfs NAME=DIR`.
    pub image: String,
    /// Mounted into the container, in order.
    pub volumes: Vec<Volume>,
    /// The network namespace (the host's by default, so `ports` keep working).
    pub network: ContainerNetwork,
    /// Replaces the image's entrypoint (with an empty command).
    pub entrypoint: Option<Vec<String>>,
    /// Replaces the image's cmd (with an empty command).
    pub args: Option<Vec<String>>,
    /// Replaces the image's working directory (absolute).
    pub working_dir: Option<String>,
}

/// A container's network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerNetwork {
    /// The host's network namespace (ports work as for tasks without a container).
    #[default]
    Host,
    /// A network namespace of its own with only a loopback device.
    None,
}

/// A volume mounted into a container at `container_path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// Where it appears in the container (absolute, normalized).
    pub container_path: String,
    /// What is mounted there.
    pub source: VolumeSource,
    /// Mounted read-only.
    pub read_only: bool,
}

/// Where a volume comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeSource {
    /// A directory of the agent's host (absolute, normalized; under one of the agent's
    /// `--volume-allow` directories, or the launch fails).
    Host(String),
    /// The framework's persistent volume of this name: created empty (owned by the task's
    /// user) on first use and kept across attempts and agent restarts until destroyed.
    Persistent(String),
}

impl Volume {
    /// The host directory `host_path` at `container_path`, writable.
    pub fn host(host_path: impl Into<String>, container_path: impl Into<String>) -> Self {
        Self {
            container_path: container_path.into(),
            source: VolumeSource::Host(host_path.into()),
            read_only: false,
        }
    }

    /// The framework's persistent volume `name` at `container_path`, writable.
    pub fn persistent(name: impl Into<String>, container_path: impl Into<String>) -> Self {
        Self {
            container_path: container_path.into(),
            source: VolumeSource::Persistent(name.into()),
            read_only: false,
        }
    }

    /// Mounted read-only.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }
}

impl ContainerInfo {
    /// A container from `image`: host network, no volumes, the image's entrypoint.
    pub fn new(image: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            volumes: Vec::new(),
            network: ContainerNetwork::Host,
            entrypoint: None,
            args: None,
            working_dir: None,
        }
    }

    /// With one more volume.
    pub fn with_volume(mut self, volume: Volume) -> Self {
        self.volumes.push(volume);
        self
    }

    /// With this network.
    pub fn with_network(mut self, network: ContainerNetwork) -> Self {
        self.network = network;
        self
    }

    /// What is wrong with it, if anything (checked by the master; [`container_limits`]).
    pub fn problem(&self) -> Option<String> {
        use container_limits as l;
        let image = self.image.as_str();
        if image.is_empty() || image.len() > l::IMAGE {
            return Some(format!(
                "the image reference must be 1 to {} bytes",
                l::IMAGE
            ));
        }
        if image
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Some(format!(
                "the image reference {image:?} has spaces or control characters"
            ));
        }
        if let Some(name) = image.strip_prefix("rootfs:") {
            if !safe_name(name, l::VOLUME_NAME) {
                return Some(format!(
                    "the local root filesystem name {name:?} is not a safe name"
                ));
            }
        }
        if self.volumes.len() > l::VOLUMES {
            return Some(format!(
                "{} volumes: at most {}",
                self.volumes.len(),
                l::VOLUMES
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for v in &self.volumes {
            if let Some(p) = path_problem(&v.container_path) {
                return Some(format!("volume at {:?}: {p}", v.container_path));
            }
            if v.container_path == "/" {
                return Some("a volume cannot be mounted at /".into());
            }
            if !seen.insert(v.container_path.as_str()) {
                return Some(format!("two volumes at {:?}", v.container_path));
            }
            match &v.source {
                VolumeSource::Host(h) => {
                    if let Some(p) = path_problem(h) {
                        return Some(format!("host volume {h:?}: {p}"));
                    }
                }
                VolumeSource::Persistent(n) => {
                    if !safe_name(n, l::VOLUME_NAME) {
                        return Some(format!(
                            "persistent volume name {n:?}: 1 to {} bytes of A-Z a-z 0-9 . _ -, not starting with '.'",
                            l::VOLUME_NAME
                        ));
                    }
                }
            }
        }
        if let Some(w) = &self.working_dir {
            if let Some(p) = path_problem(w) {
                return Some(format!("working directory {w:?}: {p}"));
            }
        }
        let words = self.entrypoint.iter().chain(self.args.iter()).flatten();
        let (count, bytes) = words.fold((0usize, 0usize), |(c, b), w| (c + 1, b + w.len()));
        let bytes = bytes + self.working_dir.as_ref().map_or(0, String::len);
        if count > l::WORDS || bytes > l::WORD_BYTES {
            return Some(format!(
                "entrypoint and args: at most {} words and {} bytes",
                l::WORDS,
                l::WORD_BYTES
            ));
        }
        if self
            .entrypoint
            .iter()
            .chain(self.args.iter())
            .flatten()
            .any(|w| w.contains('\0'))
        {
            return Some("entrypoint and args cannot contain NUL bytes".into());
        }
        None
    }
}

/// `1..=max` bytes of `A-Z a-z 0-9 . _ -`, not starting with `.`.
fn safe_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Why `p` is not an absolute, normalized path (no `.`, `..`, empty components or trailing
/// `/`), if it is not.
fn path_problem(p: &str) -> Option<&'static str> {
    if p.len() > container_limits::PATH {
        return Some("too long");
    }
    if !p.starts_with('/') {
        return Some("not absolute");
    }
    if p.bytes().any(|b| b == 0 || b.is_ascii_control()) {
        return Some("has control characters");
    }
    if p == "/" {
        return None;
    }
    if p[1..]
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Some("not normalized (empty, '.' or '..' components, or a trailing '/')");
    }
    None
}
