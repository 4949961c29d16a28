//! The bundle on disk: [`prepare`] (root filesystem, volumes, spec) and [`cleanup`].

use super::leases::IMAGE_FILE;
use super::*;

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
