//! Tasks in OCI containers (issue 32): a real agent runs them under the real `runc` on an
//! overlay of a busybox root filesystem (from Debian's `busybox-static`, named to the agent
//! with `--local-rootfs`), in the agent's real cgroups (v1 here). One cluster for every case:
//!
//! - a task cannot see the host's processes (its `/proc` holds only its own) nor a host file
//!   outside its mounts, runs as the task user, and finds its sandbox at `/mnt/sandbox`;
//! - a persistent volume written by one task is read by the next one of the framework;
//! - a host volume outside `--volume-allow` is refused (`FAILED`, `launch-failed`, a clear
//!   message); one inside is mounted read-only when asked;
//! - an unknown `rootfs:` image fails with `image-pull-failed`;
//! - an image pulled from a real registry (Debian's `docker-registry` on loopback, busybox
//!   images built with `umoci` and pushed with `skopeo`: gantry-image's harness) runs with its
//!   layers stacked (a whiteout in the upper layer hides a lower file), with pull progress in
//!   its `STARTING` updates; a missing tag and an unknown digest fail `image-pull-failed`;
//! - a running container survives an agent restart and is killed through the new agent; one
//!   on a registry image keeps its layers through the restart and a collection forced by a
//!   pull past the cache bound (`--image-cache-mib 1`: the restarted agent takes its image's
//!   lease again);
//! - nothing is left afterwards: no mount under the agent's work directory, no runtime state,
//!   no bundle.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gantry_sdk::protocol::{ContainerInfo, TaskInfo, TaskReason, TaskState, Volume};
use gantry_test_support::registry::{Registry, RegistryOptions, TestImages};
use gantry_tests::{standin_lib, start_recording, task, CgroupRoot, Cluster, Standin, TempDir};

const T: Duration = Duration::from_secs(60);

/// A busybox root filesystem: the static binary and its applets as links.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("busybox-rootfs");
    for d in ["bin", "etc", "tmp", "proc", "sys", "dev", "mnt"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    let out = std::process::Command::new(root.join("bin/busybox"))
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8_lossy(&out.stdout).lines() {
        let link = root.join("bin").join(applet);
        if applet != "busybox" && !link.exists() {
            std::os::unix::fs::symlink("busybox", link).unwrap();
        }
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0::/:/bin/sh\n").unwrap();
    root
}

fn in_container(name: &str, command: &str, image: &str) -> TaskInfo {
    let mut t = task(name, command, "cpus:0.2;mem:64");
    t.container = Some(Box::new(ContainerInfo::new(image)));
    t
}

/// Mount points at or below `dir`.
fn mounts_below(dir: &Path) -> Vec<String> {
    let want = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&want))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_run_isolated_in_containers_with_volumes_and_survive_an_agent_restart() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "containers need root");
    assert!(
        gantry_agent::container::find_on_path("runc").is_some(),
        "runc is installed (scripts/setup-deps.sh)"
    );
    let scratch = TempDir::new("gantry-containers").unwrap();
    let rootfs = busybox_rootfs(scratch.path());
    let allowed = scratch.path().join("allowed");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::write(allowed.join("dataset.txt"), "shared data\n").unwrap();
    let secret = scratch.path().join("host-secret.txt");
    std::fs::write(&secret, "host only\n").unwrap();
    // A real registry on loopback with the busybox test images (gantry-image's harness).
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let images = TestImages::build().unwrap();
    registry.push(&images.layout(), "v2", "busybox:v2").unwrap();
    let local = format!("busybox={}", rootfs.display());
    let reg_host = registry.host();
    let mut cluster = Cluster::start_with(
        &[("ctr1", "cpus:4;mem:2048")],
        &[],
        &[
            "--local-rootfs",
            &local,
            "--volume-allow",
            allowed.to_str().unwrap(),
            "--registry-insecure",
            &reg_host,
            // Every pull collects what is not leased.
            "--image-cache-mib",
            "1",
        ],
    )
    .unwrap();
    let work_dir = cluster.agents[0].work_dir.clone();
    let image = "rootfs:busybox";

    // Isolation: its own processes, no host file, the task user, the sandbox.
    let mut isolated = in_container(
        "isolated",
        "cd \"$GANTRY_SANDBOX\" && ls /proc | grep -E '^[0-9]+$' > pids.txt; \
         if [ -e \"$SECRET\" ]; then echo visible; else echo hidden; fi > host.txt; \
         id -u > uid.txt; echo \"$GANTRY_SANDBOX\" > sandbox.txt; hostname > hostname.txt",
        image,
    );
    isolated
        .env
        .insert("SECRET".into(), secret.display().to_string());
    // Persistent volume: written by one task, read by the next.
    let mut writer = in_container(
        "writer",
        "echo checkpoint-1 > /ckpt/data && touch /ckpt/done",
        image,
    );
    let mut reader = in_container(
        "reader",
        "while [ ! -e /ckpt/done ]; do sleep 0.1; done; cat /ckpt/data > $GANTRY_SANDBOX/read.txt",
        image,
    );
    for t in [&mut writer, &mut reader] {
        t.container = Some(Box::new(
            ContainerInfo::new(image).with_volume(Volume::persistent("ckpt", "/ckpt")),
        ));
    }
    // Host volumes: refused outside the allow-list, read-only inside it.
    let mut refused = in_container("refused", "cat /host/passwd", image);
    refused.container = Some(Box::new(
        ContainerInfo::new(image).with_volume(Volume::host("/etc", "/host")),
    ));
    let mut dataset = in_container(
        "dataset",
        "cat /data/dataset.txt > $GANTRY_SANDBOX/data.txt; \
         if touch /data/new 2>/dev/null; then echo writable; else echo read-only; fi > $GANTRY_SANDBOX/ro.txt",
        image,
    );
    dataset.container = Some(Box::new(
        ContainerInfo::new(image)
            .with_volume(Volume::host(allowed.to_str().unwrap(), "/data").read_only()),
    ));
    let unknown = in_container("unknown-image", "true", "rootfs:nosuch");
    // From the registry: an image with two layers (the upper one deletes /etc/hidden); a
    // missing tag; a digest the registry does not have.
    let pulled = in_container(
        "pulled",
        "while read l; do echo \"$l\"; done < /etc/top > $GANTRY_SANDBOX/top.txt; \
         if [ -e /etc/hidden ]; then echo present; else echo deleted; fi > $GANTRY_SANDBOX/hidden.txt",
        &format!("{reg_host}/busybox:v2"),
    );
    let missing_tag = in_container("missing-tag", "true", &format!("{reg_host}/busybox:nope"));
    let bad_digest = in_container(
        "bad-digest",
        "true",
        &format!("{reg_host}/busybox@sha256:{}", "0".repeat(64)),
    );
    // Survives an agent restart, then killed.
    let mut sleeper = in_container("sleeper", "sleep 600", image);
    sleeper.kill_grace_secs = Some(1);
    let mut reg_sleeper = in_container(
        "reg-sleeper",
        "sleep 600",
        &format!("{reg_host}/busybox:v2"),
    );
    reg_sleeper.kill_grace_secs = Some(1);

    let tasks = vec![
        isolated.clone(),
        writer.clone(),
        reader.clone(),
        refused.clone(),
        dataset.clone(),
        unknown.clone(),
        pulled.clone(),
        missing_tag.clone(),
        bad_digest.clone(),
        sleeper.clone(),
        reg_sleeper.clone(),
    ];
    let mut rec = start_recording(cluster.framework_config("tenant", &["containers"]), tasks);
    let agent = &cluster.agents[0];
    let read = |t: &TaskInfo, name: &str| {
        std::fs::read_to_string(agent.sandbox_file(t.task_id, name))
            .unwrap_or_else(|e| panic!("{} {name}: {e}", t.name))
    };

    let done = rec
        .updates
        .wait_for("isolated to end", T, |u| {
            u.task_id == isolated.task_id && u.state.is_terminal()
        })
        .await
        .unwrap();
    assert_eq!(
        done.state,
        TaskState::Finished,
        "{done:?}; stderr: {}",
        std::fs::read_to_string(agent.sandbox_file(isolated.task_id, "stderr")).unwrap_or_default()
    );
    assert_eq!(done.exit_code, Some(0));
    let pids: Vec<String> = read(&isolated, "pids.txt")
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        !pids.is_empty() && pids.len() <= 4,
        "the container sees only its own processes: {pids:?}"
    );
    assert!(pids.contains(&"1".to_string()), "{pids:?}");
    assert_eq!(read(&isolated, "host.txt"), "hidden\n");
    assert_eq!(read(&isolated, "sandbox.txt"), "/mnt/sandbox\n");
    let nobody = std::process::Command::new("id")
        .args(["-u", "nobody"])
        .output()
        .unwrap();
    assert_eq!(
        read(&isolated, "uid.txt"),
        String::from_utf8_lossy(&nobody.stdout),
        "the task user"
    );
    assert!(read(&isolated, "hostname.txt").starts_with("task-"));

    rec.expect(&cluster, &writer, TaskState::Finished, T).await;
    rec.expect(&cluster, &reader, TaskState::Finished, T).await;
    assert_eq!(read(&reader, "read.txt"), "checkpoint-1\n");

    let failed = rec.expect(&cluster, &refused, TaskState::Failed, T).await;
    assert_eq!(failed.reason, Some(TaskReason::LaunchFailed));
    assert!(
        failed
            .message
            .contains("not under this agent's --volume-allow"),
        "{}",
        failed.message
    );
    rec.expect(&cluster, &dataset, TaskState::Finished, T).await;
    assert_eq!(read(&dataset, "data.txt"), "shared data\n");
    assert_eq!(read(&dataset, "ro.txt"), "read-only\n");
    assert!(!allowed.join("new").exists());

    let failed = rec.expect(&cluster, &unknown, TaskState::Failed, T).await;
    assert_eq!(failed.reason, Some(TaskReason::ImagePullFailed));
    assert!(failed.message.contains("nosuch"), "{}", failed.message);

    rec.expect(&cluster, &pulled, TaskState::Finished, T).await;
    assert_eq!(read(&pulled, "top.txt"), "top\n");
    assert_eq!(read(&pulled, "hidden.txt"), "deleted\n");
    let progress: Vec<String> = rec
        .updates
        .seen
        .iter()
        // (The registry sleeper pulls the same image at the same time: one of the two pulls
        // it, the other shares the result.)
        .filter(|u| {
            (u.task_id == pulled.task_id || u.task_id == reg_sleeper.task_id)
                && u.state == TaskState::Starting
        })
        .map(|u| u.message.clone())
        .collect();
    assert!(
        progress.iter().any(|m| m.contains("ready")),
        "pull progress in STARTING updates: {progress:?}"
    );
    for (t, want) in [(&missing_tag, "not found"), (&bad_digest, "not found")] {
        let failed = rec.expect(&cluster, t, TaskState::Failed, T).await;
        assert_eq!(
            failed.reason,
            Some(TaskReason::ImagePullFailed),
            "{failed:?}"
        );
        assert!(
            failed.message.contains(want),
            "{}: {}",
            t.name,
            failed.message
        );
    }

    // The sleeper runs; the agent restarts; it still runs, and the new agent kills it.
    rec.expect(&cluster, &sleeper, TaskState::Running, T).await;
    rec.expect(&cluster, &reg_sleeper, TaskState::Running, T)
        .await;
    let state_dir = work_dir
        .join("runtime")
        .join(format!("gantry-{}", sleeper.task_id));
    assert!(state_dir.exists(), "the runtime's state of the sleeper");
    cluster.agents[0].restart().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let state = std::process::Command::new("runc")
        .arg("--root")
        .arg(work_dir.join("runtime"))
        .args(["state", &format!("gantry-{}", sleeper.task_id)])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&state.stdout).contains("\"running\""),
        "the container runs after the agent restart: {}",
        String::from_utf8_lossy(&state.stdout)
    );
    rec.handle.kill(sleeper.task_id);
    let killed = rec.expect(&cluster, &sleeper, TaskState::Killed, T).await;
    assert_eq!(killed.reason, Some(TaskReason::KilledByRequest));

    // A pull past the cache bound (1 MiB; busybox:v2 is 2 MB) collects every image not leased:
    // the registry sleeper's image stays, its layers on disk, its container running.
    registry.push(&images.layout(), "v1", "busybox:v1").unwrap();
    let collector = in_container("collector", "true", &format!("{reg_host}/busybox:v1"));
    let mut rec2 = start_recording(
        cluster.framework_config("tenant2", &["containers"]),
        vec![collector.clone()],
    );
    rec2.expect(&cluster, &collector, TaskState::Finished, T)
        .await;
    let layers_dir = work_dir.join("images").join("layers");
    for digest in images.layers("v2").unwrap() {
        let hex = digest.trim_start_matches("sha256:");
        assert!(
            layers_dir.join(hex).is_dir(),
            "layer {digest} of the running container's image was collected; left: {:?}; agent log:\n{}",
            std::fs::read_dir(&layers_dir)
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
                .unwrap_or_default(),
            std::fs::read_to_string(&cluster.agents[0].log).unwrap_or_default()
        );
    }
    let state = std::process::Command::new("runc")
        .arg("--root")
        .arg(work_dir.join("runtime"))
        .args(["state", &format!("gantry-{}", reg_sleeper.task_id)])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&state.stdout).contains("\"running\""),
        "the registry container runs after the restart and the collection: {}",
        String::from_utf8_lossy(&state.stdout)
    );
    rec.handle.kill(reg_sleeper.task_id);
    rec.expect(&cluster, &reg_sleeper, TaskState::Killed, T)
        .await;
    rec2.stop(T).await;

    // Nothing left: mounts, runtime state, bundles (cleaned when each task's cgroup settles).
    let deadline = std::time::Instant::now() + T;
    loop {
        let mounts = mounts_below(&work_dir);
        let states: Vec<_> = std::fs::read_dir(work_dir.join("runtime"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        let bundles: Vec<_> = [
            &isolated,
            &writer,
            &reader,
            &dataset,
            &pulled,
            &sleeper,
            &reg_sleeper,
            &collector,
        ]
        .iter()
        .map(|t| {
            work_dir
                .join("meta")
                .join(t.task_id.to_string())
                .join("container")
        })
        .filter(|b| b.exists())
        .collect();
        if mounts.is_empty() && states.is_empty() && bundles.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: mounts {mounts:?}, runtime state {states:?}, bundles {bundles:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The persistent volume outlives its tasks.
    let volumes = work_dir.join("volumes");
    let fw_dirs: Vec<_> = std::fs::read_dir(&volumes).unwrap().flatten().collect();
    assert_eq!(fw_dirs.len(), 1);
    assert_eq!(
        std::fs::read_to_string(fw_dirs[0].path().join("ckpt/data")).unwrap(),
        "checkpoint-1\n"
    );
    rec.stop(T).await;
}

/// A container task with one stand-in GPU sees it through the CDI spec the stand-in writes:
/// its device node and the spec's environment, and not the other GPUs' nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_sees_its_gpu_through_cdi() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "containers need root");
    let scratch = TempDir::new("gantry-containers-gpu").unwrap();
    let rootfs = busybox_rootfs(scratch.path());
    let standin = Standin::four_gpus(scratch.path()).unwrap();
    let cdi = standin.write_cdi(scratch.path()).unwrap();
    let root = CgroupRoot::new("ctr-gpu");
    let lib = standin_lib();
    let local = format!("busybox={}", rootfs.display());
    let cluster = Cluster::start_with(
        &[("ctrgpu", "cpus:4;mem:2048")],
        &[],
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--cgroup-root",
            &root.name,
            "--local-rootfs",
            &local,
            "--cdi-dir",
            cdi.to_str().unwrap(),
        ],
    )
    .unwrap();
    let mut t = task(
        "gpu",
        "cd $GANTRY_SANDBOX && ls /dev | grep nvidia > devs.txt; \
         env | grep -E '^(GANTRY_CDI|NVIDIA_VISIBLE_DEVICES)' | sort > env.txt",
        "cpus:0.5;mem:64;gpus:1",
    );
    t.container = Some(Box::new(ContainerInfo::new("rootfs:busybox")));
    let mut rec = start_recording(
        cluster.gpu_framework_config("gpu-test", &["ml"]),
        vec![t.clone()],
    );
    let done = rec.expect(&cluster, &t, TaskState::Finished, T).await;
    let uuid = done.gpus.first().cloned().expect("the task's GPU");
    let g = standin
        .config
        .gpus
        .iter()
        .find(|g| g.uuid == uuid)
        .expect("a stand-in GPU");
    let agent = &cluster.agents[0];
    let read = |name: &str| std::fs::read_to_string(agent.sandbox_file(t.task_id, name)).unwrap();
    let devs: Vec<String> = read("devs.txt").lines().map(str::to_string).collect();
    assert_eq!(
        devs,
        vec![format!("nvidia{}", g.minor), "nvidiactl".to_string()],
        "its GPU's node and the control node only"
    );
    let env = read("env.txt");
    assert!(env.contains("GANTRY_CDI=standin"), "{env}");
    assert!(
        env.contains(&format!("GANTRY_CDI_GPU_{}={uuid}", g.minor)),
        "{env}"
    );
    assert!(
        env.contains(&format!("NVIDIA_VISIBLE_DEVICES={uuid}")),
        "{env}"
    );
    rec.stop(T).await;
}
