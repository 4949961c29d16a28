//! Tasks in OCI containers (`TaskInfo.container`; docs/containers.md).
//!
//! A container task is started by the agent's supervisor like any task, but the program it
//! runs is the OCI runtime (`runc run`, or `crun`; `--container-runtime`) on a bundle the agent
//! writes in the task's root-owned meta directory (`META/container`):
//!
//! - `rootfs/`: the image's layers (lowest first) as the lower directories of an overlay
//!   mount, with `upper/` and `work/` beside it as the task's writable layer (a copy of the
//!   layers where overlayfs is unavailable);
//! - `config.json`: the runtime spec, written with the `oci-spec` crate ([`build_spec`], pure):
//!   pid, mount, ipc, uts and cgroup namespaces (network only with `ContainerNetwork::None`),
//!   the task's user, rlimits, `noNewPrivileges`, the default capabilities of runc, a default
//!   seccomp profile ([`seccomp`]), the sandbox at [`SANDBOX_PATH`], volumes, and the devices,
//!   mounts, env and hooks of the task's GPUs from their CDI specs ([`cdi`]).
//!
//! The container's cgroup is a child (`ctr`) of the task cgroup the agent made, so limits,
//! usage, OOM read-back and the cgroup-wide kill work as for other tasks. The runtime runs in
//! the foreground under the supervisor: its exit status is the task's, and it forwards the
//! SIGTERM of a kill to the container; the SIGKILL past the grace period is cgroup-wide. A
//! restarted agent re-adopts the supervisor (and so the runtime) like any task. [`cleanup`]
//! (when the task's cgroup is settled) deletes the runtime's state, unmounts the root
//! filesystem and removes the bundle.
//!
//! A container on a registry image holds a lease on it in the image store ([`Leases`]) from
//! its bundle's preparation to its [`cleanup`], so collection never removes layers under a
//! mounted root filesystem. The bundle records the image's digest (`image`): a restarted agent
//! takes the leases of the containers it re-adopts again ([`retake_leases`]) before it pulls
//! anything.
//!
//! - [`cdi`]: CDI spec parsing and device look-up.
//! - [`seccomp`]: the default seccomp profile.
//! - [`volumes`]: host volumes (allow-list) and persistent volumes.

pub mod cdi;
pub mod seccomp;
pub mod volumes;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gantry_proto::{ContainerInfo, ContainerNetwork, Program, TaskId};
use oci_spec::runtime::{
    Hook, HookBuilder, LinuxDeviceBuilder, LinuxDeviceCgroupBuilder, LinuxDeviceType,
    LinuxNamespaceType, Mount, MountBuilder, PosixRlimitBuilder, PosixRlimitType, Spec,
    UserBuilder,
};

/// Where the task's sandbox appears in its container (`GANTRY_SANDBOX`).
pub const SANDBOX_PATH: &str = "/mnt/sandbox";

/// The prefix of image references naming an agent-side root filesystem (`--local-rootfs`).
pub const LOCAL_ROOTFS: &str = "rootfs:";

/// The agent's container settings.
#[derive(Debug, Clone, Default)]
pub struct ContainerConfig {
    /// The OCI runtime (`runc` or `crun`); `None`: none found, container tasks fail to launch.
    pub runtime: Option<PathBuf>,
    /// The runtime's state directory (`--root`), `WORK_DIR/runtime`.
    pub state_root: PathBuf,
    /// `--local-rootfs NAME=DIR`: unpacked root filesystems tasks name as `rootfs:NAME`.
    pub local_rootfs: BTreeMap<String, PathBuf>,
    /// `--volume-allow DIR`: host directories tasks may mount (and what is below them).
    pub volume_allow: Vec<PathBuf>,
    /// Persistent volumes live in `DIR/FRAMEWORK/NAME` (`WORK_DIR/volumes`).
    pub volumes_dir: PathBuf,
    /// Where CDI specs are read (`--cdi-dir`; `/etc/cdi` and `/var/run/cdi` by default).
    pub cdi_dirs: Vec<PathBuf>,
    /// The image store registry images come from (leases are taken in it).
    pub images: Option<Arc<gantry_image::ImageStore>>,
    /// The image leases of prepared containers, until their cleanup.
    pub leases: Leases,
    /// Held from resolving a launch's volumes to writing its spec, and by
    /// [`volumes::destroy_unused`] from its check to the removal.
    pub volume_lock: Arc<Mutex<()>>,
}

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
const IMAGE_FILE: &str = "image";

/// Takes again, after an agent restart, the image leases of the containers whose bundles are
/// still under `meta_root` (`WORK_DIR/meta/TASK/container`): call it before the agent pulls
/// anything, so no collection removes a running container's layers. Returns how many were
/// taken; an image the store no longer has is logged (its container keeps its mounted layers
/// until cleanup, which needs nothing of the store). Blocking.
pub fn retake_leases(cfg: &ContainerConfig, meta_root: &Path) -> usize {
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

/// The default CDI spec directories.
pub const CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

impl ContainerConfig {
    /// Defaults under `work_dir`, with the first of `runc` and `crun` found on `PATH`.
    pub fn new(work_dir: &Path) -> Self {
        Self {
            runtime: find_on_path("runc").or_else(|| find_on_path("crun")),
            state_root: work_dir.join("runtime"),
            local_rootfs: BTreeMap::new(),
            volume_allow: Vec::new(),
            volumes_dir: work_dir.join("volumes"),
            cdi_dirs: CDI_DIRS.iter().map(PathBuf::from).collect(),
            images: None,
            leases: Leases::default(),
            volume_lock: Arc::default(),
        }
    }
}

/// `name` in a directory of `PATH`, if it is there (or `name` itself when it is a path).
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Why a container could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error(
        "no OCI runtime (runc or crun) on this agent: install one or give --container-runtime"
    )]
    NoRuntime,
    /// The image could not be had (the task ends `image-pull-failed`).
    #[error("image {image}: {reason}")]
    Image { image: String, reason: String },
    #[error("volume at {at}: {reason}")]
    Volume { at: String, reason: String },
    #[error("GPU devices: {0}")]
    Cdi(#[from] cdi::CdiError),
    #[error("root filesystem: {0}")]
    Rootfs(String),
    #[error("runtime spec: {0}")]
    Spec(String),
    #[error("{0}")]
    Command(String),
}

impl ContainerError {
    /// True for errors getting the image (reason `image-pull-failed`).
    pub fn is_image(&self) -> bool {
        matches!(self, ContainerError::Image { .. })
    }
}

/// The prefix of a launch error that is an image error (the core maps it to
/// `TaskReason::ImagePullFailed`).
pub const IMAGE_ERROR_PREFIX: &str = "image-pull-failed: ";

fn spec_err(e: impl std::fmt::Display) -> ContainerError {
    ContainerError::Spec(e.to_string())
}

/// What an image gives a container.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImageParts {
    /// The manifest digest of a registry image (`None`: an agent-side root filesystem).
    pub digest: Option<String>,
    /// Unpacked layers, lowest first.
    pub layers: Vec<PathBuf>,
    /// `KEY=VALUE`.
    pub env: Vec<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub working_dir: Option<String>,
}

impl From<&gantry_image::Image> for ImageParts {
    fn from(i: &gantry_image::Image) -> Self {
        Self {
            digest: Some(i.digest.clone()),
            layers: i.layers.clone(),
            env: i.config.env.clone(),
            entrypoint: i.config.entrypoint.clone(),
            cmd: i.config.cmd.clone(),
            working_dir: i.config.working_dir.clone(),
        }
    }
}

/// The image of a task when it is an agent-side root filesystem (`rootfs:NAME`); registry
/// images are pulled by the image store before ([`Request::pulled`]).
pub fn resolve_image(cfg: &ContainerConfig, image: &str) -> Result<ImageParts, ContainerError> {
    let err = |reason: String| ContainerError::Image {
        image: image.into(),
        reason,
    };
    if let Some(name) = image.strip_prefix(LOCAL_ROOTFS) {
        let dir = cfg
            .local_rootfs
            .get(name)
            .ok_or_else(|| err(format!("this agent has no --local-rootfs named {name:?}")))?;
        if !dir.is_dir() {
            return Err(err(format!("{} is not a directory", dir.display())));
        }
        return Ok(ImageParts {
            layers: vec![dir.clone()],
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
            ..ImageParts::default()
        });
    }
    Err(err(
        "this agent has no image store for registry images: use rootfs:NAME".into(),
    ))
}

/// A mount for the container: a bind of `source` at `destination`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    pub source: PathBuf,
    pub destination: String,
    pub read_only: bool,
}

/// The pure inputs of a runtime spec.
#[derive(Debug, Clone)]
pub struct SpecInput<'a> {
    pub task_id: TaskId,
    pub container: &'a ContainerInfo,
    pub program: &'a Program,
    pub image: &'a ImageParts,
    pub rootfs: PathBuf,
    /// The container's cgroup: absolute, inside each hierarchy.
    pub cgroup_path: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The task's environment (over the image's); `GANTRY_SANDBOX` is set to [`SANDBOX_PATH`].
    pub env: &'a BTreeMap<String, String>,
    /// The sandbox first, then the volumes, then CDI mounts.
    pub mounts: Vec<BindMount>,
    pub cdi: Vec<cdi::ContainerEdits>,
    /// `RLIMIT_NOFILE` (soft and hard).
    pub nofile: u64,
}

/// The argv of the container's process: the task's command (a shell string through the
/// image's `/bin/sh`), or with an empty shell string the (overridden) entrypoint and cmd.
pub fn process_args(
    program: &Program,
    c: &ContainerInfo,
    image: &ImageParts,
) -> Result<Vec<String>, ContainerError> {
    match program {
        Program::Shell(s) if !s.trim().is_empty() => {
            Ok(vec!["/bin/sh".into(), "-c".into(), s.clone()])
        }
        Program::Argv(v) if !v.is_empty() => Ok(v.clone()),
        _ => {
            let mut args = c
                .entrypoint
                .clone()
                .unwrap_or_else(|| image.entrypoint.clone());
            args.extend(c.args.clone().unwrap_or_else(|| image.cmd.clone()));
            if args.is_empty() {
                return Err(ContainerError::Command(
                    "an empty command, and the image has no entrypoint or cmd".into(),
                ));
            }
            Ok(args)
        }
    }
}

/// The runtime spec (`config.json`) of a container task.
pub fn build_spec(input: &SpecInput<'_>) -> Result<Spec, ContainerError> {
    let mut spec = Spec::default();
    spec.set_hostname(Some(format!("task-{}", short(&input.task_id.to_string()))));
    let root = oci_spec::runtime::RootBuilder::default()
        .path(input.rootfs.clone())
        .readonly(false)
        .build()
        .map_err(spec_err)?;
    spec.set_root(Some(root));

    // Environment: the image's, then the task's, then the CDI devices'.
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let mut put = |kv: &str| {
        if let Some((k, v)) = kv.split_once('=') {
            env.insert(k.to_string(), v.to_string());
        }
    };
    for kv in &input.image.env {
        put(kv);
    }
    for e in &input.cdi {
        for kv in &e.env {
            put(kv);
        }
    }
    env.extend(input.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.insert("GANTRY_SANDBOX".into(), SANDBOX_PATH.into());
    env.entry("PATH".into())
        .or_insert_with(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());

    let cwd = input
        .container
        .working_dir
        .clone()
        .or_else(|| input.image.working_dir.clone())
        .filter(|w| !w.is_empty())
        .unwrap_or_else(|| "/".into());
    let user = UserBuilder::default()
        .uid(input.uid)
        .gid(input.gid)
        .additional_gids(input.groups.clone())
        .build()
        .map_err(spec_err)?;
    let rlimits = vec![PosixRlimitBuilder::default()
        .typ(PosixRlimitType::RlimitNofile)
        .hard(input.nofile)
        .soft(input.nofile)
        .build()
        .map_err(spec_err)?];
    let process = spec
        .process_mut()
        .as_mut()
        .ok_or_else(|| spec_err("no process"))?;
    process.set_args(Some(process_args(
        input.program,
        input.container,
        input.image,
    )?));
    process.set_env(Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()));
    process.set_cwd(PathBuf::from(cwd));
    process.set_user(user);
    process.set_rlimits(Some(rlimits));
    process.set_no_new_privileges(Some(true));
    process.set_terminal(Some(false));

    // Mounts: runc's defaults (/proc, /dev, /dev/pts, /dev/shm, /dev/mqueue, /sys,
    // /sys/fs/cgroup), then the sandbox, volumes and CDI mounts.
    let mut mounts: Vec<Mount> = spec.mounts().clone().unwrap_or_default();
    let bind = |source: &Path, dest: &str, ro: bool, extra: &[String]| -> Result<Mount, _> {
        let mut options = vec!["rbind".to_string(), "nosuid".into(), "nodev".into()];
        options.push(if ro { "ro" } else { "rw" }.into());
        options.extend(
            extra
                .iter()
                .filter(|o| *o != "bind" && *o != "rbind")
                .cloned(),
        );
        MountBuilder::default()
            .destination(PathBuf::from(dest))
            .typ("bind")
            .source(source.to_path_buf())
            .options(options)
            .build()
            .map_err(spec_err)
    };
    for m in &input.mounts {
        mounts.push(bind(&m.source, &m.destination, m.read_only, &[])?);
    }
    let mut devices = Vec::new();
    let mut allow = Vec::new();
    let mut hooks: BTreeMap<String, Vec<Hook>> = BTreeMap::new();
    for e in &input.cdi {
        for m in &e.mounts {
            let ro = m.options.iter().any(|o| o == "ro");
            mounts.push(bind(
                Path::new(&m.host_path),
                &m.container_path,
                ro,
                &m.options,
            )?);
        }
        for n in &e.device_nodes {
            let n = cdi::resolve_node(n)?;
            let typ = if n.typ == 'b' {
                LinuxDeviceType::B
            } else {
                LinuxDeviceType::C
            };
            let mut d = LinuxDeviceBuilder::default()
                .path(PathBuf::from(&n.path))
                .typ(typ)
                .major(n.major)
                .minor(n.minor)
                .uid(input.uid)
                .gid(input.gid);
            if let Some(mode) = n.file_mode {
                d = d.file_mode(mode);
            }
            devices.push(d.build().map_err(spec_err)?);
            allow.push(
                LinuxDeviceCgroupBuilder::default()
                    .allow(true)
                    .typ(typ)
                    .major(n.major)
                    .minor(n.minor)
                    .access(n.permissions.clone())
                    .build()
                    .map_err(spec_err)?,
            );
        }
        for h in &e.hooks {
            let mut b = HookBuilder::default()
                .path(PathBuf::from(&h.path))
                .args(h.args.clone())
                .env(h.env.clone());
            if let Some(t) = h.timeout {
                b = b.timeout(t);
            }
            hooks
                .entry(h.hook_name.clone())
                .or_default()
                .push(b.build().map_err(spec_err)?);
        }
    }
    spec.set_mounts(Some(mounts));
    if !hooks.is_empty() {
        let mut hb = oci_spec::runtime::HooksBuilder::default();
        for (name, list) in hooks {
            hb = match name.as_str() {
                "prestart" => hb.prestart(list),
                "createRuntime" => hb.create_runtime(list),
                "createContainer" => hb.create_container(list),
                "startContainer" => hb.start_container(list),
                "poststart" => hb.poststart(list),
                "poststop" => hb.poststop(list),
                other => return Err(spec_err(format!("CDI hook {other:?} is not an OCI hook"))),
            };
        }
        spec.set_hooks(Some(hb.build().map_err(spec_err)?));
    }

    let linux = spec
        .linux_mut()
        .as_mut()
        .ok_or_else(|| spec_err("no linux section"))?;
    let mut namespaces = linux.namespaces().clone().unwrap_or_default();
    if input.container.network == ContainerNetwork::Host {
        namespaces.retain(|n| n.typ() != LinuxNamespaceType::Network);
    }
    linux.set_namespaces(Some(namespaces));
    linux.set_cgroups_path(Some(PathBuf::from(&input.cgroup_path)));
    linux.set_devices((!devices.is_empty()).then_some(devices));
    if let Some(res) = linux.resources_mut() {
        let mut rules = res.devices().clone().unwrap_or_default();
        rules.extend(allow);
        res.set_devices(Some(rules));
    }
    linux.set_seccomp(Some(seccomp::default_profile().map_err(spec_err)?));
    Ok(spec)
}

fn short(s: &str) -> &str {
    s.get(..12).unwrap_or(s)
}

/// The runtime's id for a task's container.
pub fn container_id(task: TaskId) -> String {
    format!("gantry-{task}")
}

/// What the agent knows about a container task at launch.
pub struct Request<'a> {
    pub task_id: TaskId,
    pub framework_id: &'a str,
    pub container: &'a ContainerInfo,
    pub program: &'a Program,
    pub sandbox: &'a Path,
    pub meta: &'a Path,
    /// The task cgroup's path inside each hierarchy (`/gantry/NAME/TASK`), or `None` without
    /// cgroups.
    pub task_cgroup: Option<String>,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub env: &'a BTreeMap<String, String>,
    /// The UUIDs of the task's GPUs (CDI device names under `nvidia.com/gpu`).
    pub gpus: Vec<String>,
    /// The registry image, already pulled by the image store (`None`: `rootfs:NAME`).
    pub pulled: Option<ImageParts>,
}

/// Prepares a container task's bundle (root filesystem, volumes, spec) and returns the program
/// the supervisor runs for it (as root: the spec switches to the task's user). Blocking.
/// Undone ([`cleanup`]) on error.
pub fn prepare(cfg: &ContainerConfig, req: &Request<'_>) -> Result<Program, ContainerError> {
    let runtime = cfg.runtime.clone().ok_or(ContainerError::NoRuntime)?;
    let r = prepare_bundle(cfg, req);
    if r.is_err() {
        cleanup(cfg, req.meta, req.task_id);
    }
    let bundle = r?;
    let s = |p: &Path| p.to_string_lossy().into_owned();
    Ok(Program::Argv(vec![
        s(&runtime),
        "--root".into(),
        s(&cfg.state_root),
        "run".into(),
        "--bundle".into(),
        s(&bundle),
        container_id(req.task_id),
    ]))
}

fn prepare_bundle(cfg: &ContainerConfig, req: &Request<'_>) -> Result<PathBuf, ContainerError> {
    let image = match &req.pulled {
        Some(p) => p.clone(),
        None => resolve_image(cfg, &req.container.image)?,
    };
    // The sandbox belongs to the task's user (the supervisor starts the runtime as root).
    {
        use std::os::unix::fs::DirBuilderExt;
        let sb = req.sandbox;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(sb)
            .and_then(|()| std::os::unix::fs::chown(sb, Some(req.uid), Some(req.gid)))
            .map_err(|e| ContainerError::Rootfs(format!("sandbox {}: {e}", sb.display())))?;
    }
    // No volume of this launch is destroyed before its spec (which names it) is written.
    let _volumes = cfg.volume_lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut mounts = vec![BindMount {
        source: req.sandbox.to_path_buf(),
        destination: SANDBOX_PATH.into(),
        read_only: false,
    }];
    for v in &req.container.volumes {
        mounts.push(volumes::resolve(
            cfg,
            req.framework_id,
            v,
            req.uid,
            req.gid,
        )?);
    }
    let cdi = if req.gpus.is_empty() {
        Vec::new()
    } else {
        let specs = cdi::load(&cfg.cdi_dirs);
        cdi::edits_for(&specs, cdi::GPU_KIND, &req.gpus, &cfg.cdi_dirs)?
    };
    let bundle = req.meta.join("container");
    std::fs::create_dir_all(&bundle).map_err(|e| ContainerError::Rootfs(e.to_string()))?;
    std::fs::create_dir_all(&cfg.state_root)
        .map_err(|e| ContainerError::Rootfs(format!("{}: {e}", cfg.state_root.display())))?;
    // The image's lease, from before its layers are mounted until the cleanup.
    if let (Some(digest), Some(store)) = (&image.digest, &cfg.images) {
        std::fs::write(bundle.join(IMAGE_FILE), digest)
            .map_err(|e| ContainerError::Rootfs(e.to_string()))?;
        let leased = store.lease(digest).map_err(|e| ContainerError::Image {
            image: req.container.image.clone(),
            reason: e.to_string(),
        })?;
        cfg.leases.hold(req.meta, leased.lease);
    }
    let rootfs = mount_rootfs(&image.layers, &bundle)?;
    let cgroup_path = match &req.task_cgroup {
        Some(p) => format!("{}/ctr", p.trim_end_matches('/')),
        None => format!("/gantry-containers/{}", container_id(req.task_id)),
    };
    let spec = build_spec(&SpecInput {
        task_id: req.task_id,
        container: req.container,
        program: req.program,
        image: &image,
        rootfs,
        cgroup_path: cgroup_path.clone(),
        uid: req.uid,
        gid: req.gid,
        groups: req.groups.clone(),
        env: req.env,
        mounts,
        cdi,
        nofile: nofile_limit(),
    })?;
    spec.save(bundle.join("config.json")).map_err(spec_err)?;
    // For cleanup: the cgroups the runtime makes in hierarchies the agent does not use.
    std::fs::write(bundle.join(CGROUP_FILE), &cgroup_path)
        .map_err(|e| ContainerError::Rootfs(e.to_string()))?;
    Ok(bundle)
}

/// `RLIMIT_NOFILE` of container tasks: the agent's own hard limit (which a task without a
/// container inherits), at most 65,536.
fn nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    r.rlim_max.min(65_536)
}

/// Mounts the layers (lowest first) as an overlay at `BUNDLE/rootfs`, with the writable
/// `upper` and `work` beside it; copies them there where overlayfs is not available.
fn mount_rootfs(layers: &[PathBuf], bundle: &Path) -> Result<PathBuf, ContainerError> {
    let err = |what: &str, e: std::io::Error| ContainerError::Rootfs(format!("{what}: {e}"));
    let rootfs = bundle.join("rootfs");
    let upper = bundle.join("upper");
    let work = bundle.join("work");
    for d in [&rootfs, &upper, &work] {
        std::fs::create_dir_all(d).map_err(|e| err(&d.display().to_string(), e))?;
    }
    if layers.is_empty() {
        return Err(ContainerError::Rootfs("the image has no layers".into()));
    }
    let lower: Vec<String> = layers
        .iter()
        .rev()
        .map(|l| l.to_string_lossy().into_owned())
        .collect();
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.join(":"),
        upper.display(),
        work.display()
    );
    // Overlay options are comma and colon separated: paths with either cannot be given.
    let plain = layers
        .iter()
        .chain([&upper, &work])
        .all(|p| !p.to_string_lossy().contains([',', ':']));
    if plain && data.len() < 4000 {
        match mount_overlay(&rootfs, &data) {
            Ok(()) => return Ok(rootfs),
            Err(e) => tracing::warn!("overlay mount failed ({e}): copying the image's layers"),
        }
    }
    for l in layers {
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", l.display()))
            .arg(&rootfs)
            .status()
            .map_err(|e| err("cp", e))?;
        if !status.success() {
            return Err(ContainerError::Rootfs(format!(
                "copying layer {} failed: {status}",
                l.display()
            )));
        }
    }
    Ok(rootfs)
}

fn mount_overlay(target: &Path, data: &str) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let target = CString::new(target.as_os_str().as_bytes())?;
    let data = CString::new(data)?;
    let fstype = c"overlay";
    // SAFETY: every pointer is a valid NUL-terminated string for the duration of the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Removes what a container task left: the runtime's state (`delete --force`), the root
/// filesystem's mount and the bundle (writable layer included). Idempotent; a no-op for tasks
/// without a container. Blocking.
pub fn cleanup(cfg: &ContainerConfig, meta: &Path, task: TaskId) {
    let bundle = meta.join("container");
    if !bundle.exists() {
        return;
    }
    if let Some(rt) = &cfg.runtime {
        if cfg.state_root.join(container_id(task)).exists() {
            let _ = std::process::Command::new(rt)
                .arg("--root")
                .arg(&cfg.state_root)
                .args(["delete", "--force"])
                .arg(container_id(task))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
    if let Ok(path) = std::fs::read_to_string(bundle.join(CGROUP_FILE)) {
        remove_runtime_cgroups(path.trim());
    }
    let rootfs = bundle.join("rootfs");
    if is_mount_point(&rootfs) {
        use std::os::unix::ffi::OsStrExt;
        if let Ok(c) = std::ffi::CString::new(rootfs.as_os_str().as_bytes()) {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    if is_mount_point(&rootfs) {
        tracing::warn!(path = %rootfs.display(), "container root filesystem still mounted");
        return;
    }
    if let Err(e) = std::fs::remove_dir_all(&bundle) {
        tracing::warn!(path = %bundle.display(), "removing the container bundle: {e}");
    }
    // The root filesystem is unmounted: its layers may go.
    cfg.leases.release(meta);
}

/// The bundle's record of the container's cgroup path.
const CGROUP_FILE: &str = "cgroup";

/// Removes the container's cgroup (`.../TASK/ctr`) from every hierarchy, and the empty
/// directories the runtime made above it in hierarchies the agent does not use (cpuset,
/// blkio, ...). Only empty directories are removed (`rmdir`).
fn remove_runtime_cgroups(path: &str) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let rel = Path::new(path.trim_start_matches('/'));
    if rel
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return;
    }
    for line in info.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let (Some(mount), Some(fstype)) = (pre.split(' ').nth(4), post.split(' ').next()) else {
            continue;
        };
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        let mount = Path::new(mount);
        let mut dir = mount.join(rel);
        if !dir.exists() {
            continue;
        }
        // The agent's own controllers keep the task cgroup (the agent removes it).
        let agents = fstype == "cgroup2"
            || post.split(' ').nth(2).is_some_and(|opts| {
                opts.split(',')
                    .any(|o| crate::isolation::layout::V1_CONTROLLERS.contains(&o))
            });
        let _ = std::fs::remove_dir(&dir);
        if agents {
            continue;
        }
        // Up to (not including) the hierarchy's root.
        while let Some(parent) = dir.parent().map(Path::to_path_buf) {
            if parent == mount || std::fs::remove_dir(&parent).is_err() {
                break;
            }
            dir = parent;
        }
    }
}

/// True when `path` is a mount point (in `/proc/self/mountinfo`).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    text.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|m| m.replace("\\040", " ") == want)
    })
}

#[cfg(test)]
mod tests;
