use super::*;
use gantry_proto::Volume;

fn input<'a>(
    c: &'a ContainerInfo,
    program: &'a Program,
    image: &'a ImageParts,
    env: &'a BTreeMap<String, String>,
) -> SpecInput<'a> {
    SpecInput {
        task_id: TaskId::from_u128(7),
        container: c,
        program,
        image,
        rootfs: "/w/meta/t/container/rootfs".into(),
        cgroup_path: "/gantry/a1/t/ctr".into(),
        uid: 1000,
        gid: 1000,
        groups: vec![44],
        env,
        mounts: vec![BindMount {
            source: "/w/sandboxes/t".into(),
            destination: SANDBOX_PATH.into(),
            read_only: false,
        }],
        cdi: Vec::new(),
        nofile: 1024,
    }
}

#[test]
fn the_spec_has_the_task_user_namespaces_sandbox_cgroup_and_seccomp() {
    let c = ContainerInfo::new("rootfs:busybox");
    let program = Program::Shell("echo hi".into());
    let image = ImageParts {
        env: vec!["PATH=/bin".into(), "FROM_IMAGE=1".into()],
        working_dir: Some("/work".into()),
        ..ImageParts::default()
    };
    let mut env = BTreeMap::new();
    env.insert("FROM_IMAGE".to_string(), "2".to_string());
    let spec = build_spec(&input(&c, &program, &image, &env)).unwrap();
    let p = spec.process().as_ref().unwrap();
    assert_eq!(
        p.args().as_ref().unwrap(),
        &vec!["/bin/sh".to_string(), "-c".into(), "echo hi".into()]
    );
    let env = p.env().as_ref().unwrap();
    assert!(
        env.contains(&"FROM_IMAGE=2".to_string()),
        "the task's env wins"
    );
    assert!(env.contains(&"PATH=/bin".to_string()));
    assert!(env.contains(&format!("GANTRY_SANDBOX={SANDBOX_PATH}")));
    assert_eq!(p.cwd(), Path::new("/work"));
    assert_eq!((p.user().uid(), p.user().gid()), (1000, 1000));
    assert_eq!(p.no_new_privileges(), Some(true));
    let linux = spec.linux().as_ref().unwrap();
    let ns: Vec<LinuxNamespaceType> = linux
        .namespaces()
        .as_ref()
        .unwrap()
        .iter()
        .map(|n| n.typ())
        .collect();
    assert!(ns.contains(&LinuxNamespaceType::Pid) && ns.contains(&LinuxNamespaceType::Mount));
    assert!(
        !ns.contains(&LinuxNamespaceType::Network),
        "host network by default"
    );
    assert_eq!(
        linux.cgroups_path().as_deref(),
        Some(Path::new("/gantry/a1/t/ctr"))
    );
    assert!(linux.seccomp().is_some());
    let mounts = spec.mounts().as_ref().unwrap();
    assert!(mounts
        .iter()
        .any(|m| m.destination() == Path::new(SANDBOX_PATH)
            && m.source().as_deref() == Some(Path::new("/w/sandboxes/t"))));
    assert!(mounts.iter().any(|m| m.destination() == Path::new("/proc")));
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(false));

    // Its own network namespace when asked.
    let none = ContainerInfo::new("rootfs:busybox").with_network(ContainerNetwork::None);
    let spec = build_spec(&input(&none, &program, &image, &BTreeMap::new())).unwrap();
    let ns = spec.linux().as_ref().unwrap().namespaces().clone().unwrap();
    assert!(ns.iter().any(|n| n.typ() == LinuxNamespaceType::Network));
}

#[test]
fn an_empty_command_runs_the_entrypoint_with_overrides() {
    let image = ImageParts {
        entrypoint: vec!["/entry".into()],
        cmd: vec!["--serve".into()],
        ..ImageParts::default()
    };
    let empty = Program::Shell(String::new());
    let mut c = ContainerInfo::new("r/i:1");
    assert_eq!(
        process_args(&empty, &c, &image).unwrap(),
        vec!["/entry".to_string(), "--serve".into()]
    );
    c.args = Some(vec!["--check".into()]);
    assert_eq!(
        process_args(&empty, &c, &image).unwrap(),
        vec!["/entry".to_string(), "--check".into()]
    );
    let argv = Program::Argv(vec!["/bin/true".into()]);
    assert_eq!(
        process_args(&argv, &c, &image).unwrap(),
        vec!["/bin/true".to_string()]
    );
    assert!(process_args(&empty, &ContainerInfo::new("x"), &ImageParts::default()).is_err());
}

#[test]
fn cdi_edits_become_devices_allow_rules_env_mounts_and_hooks() {
    let c = ContainerInfo::new("rootfs:busybox");
    let program = Program::Shell("true".into());
    let image = ImageParts::default();
    let env = BTreeMap::new();
    let mut i = input(&c, &program, &image, &env);
    i.cdi = vec![cdi::ContainerEdits {
        env: vec!["NVIDIA_VISIBLE_DEVICES=GPU-a".into()],
        device_nodes: vec![cdi::DeviceNode {
            path: "/dev/nvidia0".into(),
            host_path: None,
            typ: Some("c".into()),
            major: Some(195),
            minor: Some(0),
            file_mode: None,
            permissions: None,
        }],
        mounts: vec![cdi::CdiMount {
            host_path: "/usr/lib/libcuda.so.1".into(),
            container_path: "/usr/lib/libcuda.so.1".into(),
            typ: None,
            options: vec!["ro".into(), "bind".into()],
        }],
        hooks: vec![cdi::CdiHook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/nvidia-ctk".into(),
            args: vec!["nvidia-ctk".into()],
            env: vec![],
            timeout: None,
        }],
    }];
    let spec = build_spec(&i).unwrap();
    let linux = spec.linux().as_ref().unwrap();
    let dev = &linux.devices().as_ref().unwrap()[0];
    assert_eq!((dev.major(), dev.minor()), (195, 0));
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .clone()
        .unwrap();
    assert!(rules
        .iter()
        .any(|r| r.allow() && r.major() == Some(195) && r.minor() == Some(0)));
    let env = spec.process().as_ref().unwrap().env().clone().unwrap();
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-a".to_string()));
    let hooks = spec.hooks().as_ref().unwrap();
    assert_eq!(hooks.create_container().as_ref().unwrap().len(), 1);
    assert!(spec
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .any(|m| m.destination() == Path::new("/usr/lib/libcuda.so.1")));
}

#[test]
fn host_volumes_outside_the_allow_list_are_refused_and_persistent_ones_are_made() {
    let dir = tempfile::tempdir().unwrap();
    let allowed = dir.path().join("data");
    std::fs::create_dir_all(allowed.join("sub")).unwrap();
    let cfg = ContainerConfig {
        volume_allow: vec![allowed.clone()],
        volumes_dir: dir.path().join("volumes"),
        ..ContainerConfig::default()
    };
    let inside = Volume::host(allowed.join("sub").to_str().unwrap(), "/d");
    assert!(volumes::resolve(&cfg, "fw", &inside, 0, 0).is_ok());
    let outside = Volume::host("/etc", "/etc2");
    let e = volumes::resolve(&cfg, "fw", &outside, 0, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not under this agent's --volume-allow"), "{e}");
    // A link inside the allowed directory that points out of it is refused too.
    std::os::unix::fs::symlink("/etc", allowed.join("link")).unwrap();
    let link = Volume::host(allowed.join("link").to_str().unwrap(), "/l");
    assert!(volumes::resolve(&cfg, "fw", &link, 0, 0).is_err());
    let p = volumes::resolve(&cfg, "fw", &Volume::persistent("ckpt", "/ckpt"), 0, 0).unwrap();
    assert_eq!(p.source, dir.path().join("volumes/fw/ckpt"));
    assert!(p.source.is_dir());
    assert!(volumes::destroy(&cfg, "fw", "ckpt").unwrap());
    assert!(!volumes::destroy(&cfg, "fw", "ckpt").unwrap());
}

/// A persistent volume a container's spec mounts is listed with its task and not destroyed;
/// once the bundle is gone it is; names that are not names are refused.
#[test]
fn a_persistent_volume_in_use_is_not_destroyed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ContainerConfig {
        volumes_dir: dir.path().join("volumes"),
        ..ContainerConfig::default()
    };
    let meta_root = dir.path().join("meta");
    let ckpt = volumes::resolve(&cfg, "fw", &Volume::persistent("ckpt", "/ckpt"), 0, 0).unwrap();
    volumes::resolve(&cfg, "fw", &Volume::persistent("other", "/o"), 0, 0).unwrap();
    std::fs::write(ckpt.source.join("data"), "x").unwrap();
    // A running task's bundle whose spec mounts the volume.
    let bundle = meta_root.join("task-1").join("container");
    std::fs::create_dir_all(&bundle).unwrap();
    let spec = serde_json::json!({
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/ckpt", "type": "bind", "source": ckpt.source},
        ]
    });
    std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();

    let listed = volumes::list(&cfg, &meta_root);
    let summary: Vec<(&str, &str, Vec<String>)> = listed
        .iter()
        .map(|v| (v.framework.as_str(), v.name.as_str(), v.used_by.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("fw", "ckpt", vec!["task-1".to_string()]),
            ("fw", "other", vec![]),
        ]
    );
    let e = volumes::destroy_unused(&cfg, &meta_root, "fw", "ckpt").unwrap_err();
    assert!(
        matches!(&e, volumes::DestroyError::InUse { tasks, .. } if tasks == &["task-1"]),
        "{e}"
    );
    assert!(e.to_string().contains("in use by task(s) task-1"), "{e}");
    assert!(ckpt.source.join("data").exists(), "nothing is lost");
    assert!(volumes::destroy_unused(&cfg, &meta_root, "fw", "other").unwrap());

    std::fs::remove_dir_all(meta_root.join("task-1")).unwrap();
    assert!(volumes::destroy_unused(&cfg, &meta_root, "fw", "ckpt").unwrap());
    assert!(!ckpt.source.exists());
    assert!(!volumes::destroy_unused(&cfg, &meta_root, "fw", "ckpt").unwrap());
    for (fw, name) in [("fw", "../x"), ("..", "ckpt"), ("fw", ""), ("a/b", "c")] {
        let e = volumes::destroy_unused(&cfg, &meta_root, fw, name).unwrap_err();
        assert!(
            matches!(e, volumes::DestroyError::Name { .. }),
            "{fw}/{name}: {e}"
        );
    }
    assert!(dir.path().join("volumes").exists());
}

/// The master's volume requests get the protocol's answers: the list with users, and each
/// destroy outcome (in use, destroyed, not found, a refused name).
#[test]
fn volume_requests_are_answered_with_the_protocol_outcomes() {
    use gantry_proto::{VolumeInfo, VolumeOutcome, VolumeReply, VolumeRequest};
    let dir = tempfile::tempdir().unwrap();
    let cfg = ContainerConfig {
        volumes_dir: dir.path().join("volumes"),
        ..ContainerConfig::default()
    };
    let meta_root = dir.path().join("meta");
    let ckpt = volumes::resolve(&cfg, "fw", &Volume::persistent("ckpt", "/ckpt"), 0, 0).unwrap();
    let bundle = meta_root.join("task-1").join("container");
    std::fs::create_dir_all(&bundle).unwrap();
    let spec = serde_json::json!({"mounts": [{"destination": "/ckpt", "source": ckpt.source}]});
    std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
    let destroy = |name: &str| VolumeRequest::Destroy {
        framework: "fw".into(),
        name: name.into(),
        principal: "operator:admin".into(),
    };

    assert_eq!(
        volumes::answer(&cfg, &meta_root, VolumeRequest::List),
        VolumeReply::List {
            volumes: vec![VolumeInfo {
                framework: "fw".into(),
                name: "ckpt".into(),
                path: ckpt.source.display().to_string(),
                used_by: vec!["task-1".into()],
            }],
            total: 1,
        }
    );
    assert_eq!(
        volumes::answer(&cfg, &meta_root, destroy("ckpt")),
        VolumeReply::Destroy(VolumeOutcome::InUse {
            tasks: vec!["task-1".into()]
        })
    );
    assert!(ckpt.source.exists());
    std::fs::remove_dir_all(meta_root.join("task-1")).unwrap();
    assert_eq!(
        volumes::answer(&cfg, &meta_root, destroy("ckpt")),
        VolumeReply::Destroy(VolumeOutcome::Destroyed)
    );
    assert_eq!(
        volumes::answer(&cfg, &meta_root, destroy("ckpt")),
        VolumeReply::Destroy(VolumeOutcome::NotFound)
    );
    match volumes::answer(&cfg, &meta_root, destroy("../x")) {
        VolumeReply::Destroy(VolumeOutcome::Failed(m)) => {
            assert!(m.contains("1 to 64 bytes"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        volumes::answer(&cfg, &meta_root, VolumeRequest::List),
        VolumeReply::List {
            volumes: vec![],
            total: 0
        }
    );
}

/// At startup, the bundles of containers that ended (an exit recorded, or a launch no
/// supervisor claimed) are cleaned up; a running container's bundle is left alone.
#[test]
fn the_startup_sweep_cleans_up_only_ended_containers() {
    use crate::executor::record;
    let dir = tempfile::tempdir().unwrap();
    let cfg = ContainerConfig {
        state_root: dir.path().join("runtime"),
        ..ContainerConfig::default()
    };
    let meta_root = dir.path().join("meta");
    let bundle = |task: TaskId| {
        let meta = meta_root.join(task.to_string());
        std::fs::create_dir_all(meta.join("container").join("rootfs")).unwrap();
        meta
    };
    let (ended, unclaimed, running) = (TaskId::random(), TaskId::random(), TaskId::random());
    let ended_meta = bundle(ended);
    assert!(record::claim_for_supervisor(&ended_meta, "4242 1", None).unwrap());
    record::append(&ended_meta, "exit", r#"{"code":0,"signal":null}"#, false).unwrap();
    let unclaimed_meta = bundle(unclaimed);
    let running_meta = bundle(running);
    assert!(record::claim_for_supervisor(&running_meta, "4243 1", None).unwrap());

    assert_eq!(sweep_ended(&cfg, &meta_root), 2);
    assert!(!ended_meta.join("container").exists());
    assert!(!unclaimed_meta.join("container").exists());
    // The unclaimed launch is now the agent's: no supervisor will run it.
    assert!(!record::claim_for_supervisor(&unclaimed_meta, "4244 1", None).unwrap());
    assert!(running_meta.join("container").join("rootfs").is_dir());
    assert_eq!(sweep_ended(&cfg, &meta_root), 0);
}
