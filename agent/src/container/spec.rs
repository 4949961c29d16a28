//! Images and the runtime spec: [`ImageParts`], [`resolve_image`], [`build_spec`] (pure).

use super::*;

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
