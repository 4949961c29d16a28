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
//!   no bundle;
//! - persistent volume lifecycle (protocol v12): a framework's destroy is refused while its
//!   task uses the volume, goes through after, and the next attempt finds the volume empty; a
//!   framework reaches only its own volumes; `gantryctl volume list|destroy` (the operator
//!   API) lists them with their users and destroys them, refused while in use.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gantry_sdk::protocol::{
    ContainerInfo, Offer, Operation, StatusUpdate, TaskInfo, TaskReason, TaskState, Volume,
    VolumeDestroyed, VolumeOutcome,
};
use gantry_test_support::registry::{Registry, RegistryOptions, TestImages};
use gantry_tests::{
    standin_lib, start_recording, task, CgroupRoot, Cluster, Standin, TempDir, Updates,
};

const T: Duration = Duration::from_secs(60);

/// A busybox root filesystem: the static binary and its applets as links.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("busybox-rootfs");
    for d in ["bin", "etc", "tmp", "proc", "sys", "dev", "mnt"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    // The host's binary, not the fresh copy: executing a file just written races with a fork
    // in another test's thread holding it open for writing (ETXTBSY).
    let out = std::process::Command::new("/bin/busybox")
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
    let tenant_fw = rec.handle.framework_id().expect("subscribed").to_string();
    volume_lifecycle(&cluster, image, &tenant_fw).await;
    rec.stop(T).await;
}

/// A framework that launches what is queued ([`VolumeFw::queue`]) as offers allow and forwards
/// its status updates and its volume answers.
struct VolumeFw {
    queue: std::sync::Arc<std::sync::Mutex<Vec<TaskInfo>>>,
    updates: tokio::sync::mpsc::UnboundedSender<StatusUpdate>,
    volumes: tokio::sync::mpsc::UnboundedSender<VolumeDestroyed>,
}

impl gantry_sdk::Scheduler for VolumeFw {
    async fn offers(&mut self, driver: &gantry_sdk::DriverHandle, offers: Vec<Offer>) {
        let tasks: Vec<TaskInfo> = std::mem::take(&mut *self.queue.lock().unwrap());
        let ids: Vec<_> = offers.iter().map(|o| o.id).collect();
        let one_agent = offers.windows(2).all(|w| w[0].agent_id == w[1].agent_id);
        if tasks.is_empty() || !one_agent {
            self.queue.lock().unwrap().extend(tasks);
            driver.decline(ids, Some(0.2));
        } else {
            driver.accept(ids, vec![Operation::Launch { tasks }], None);
        }
    }

    async fn status_update(&mut self, _driver: &gantry_sdk::DriverHandle, update: &StatusUpdate) {
        let _ = self.updates.send(update.clone());
    }

    async fn volume_destroyed(
        &mut self,
        _driver: &gantry_sdk::DriverHandle,
        result: &VolumeDestroyed,
    ) {
        let _ = self.volumes.send(result.clone());
    }
}

/// The framework's next volume answer.
async fn answer(rx: &mut tokio::sync::mpsc::UnboundedReceiver<VolumeDestroyed>) -> VolumeDestroyed {
    tokio::time::timeout(T, rx.recv())
        .await
        .expect("a volume answer")
        .expect("the framework runs")
}

/// Persistent volume lifecycle (protocol v12) on the shared cluster: a framework's task
/// writes its volume; the framework's destroy is refused while the task runs (and the
/// operator's too), succeeds once it has ended, and the next attempt finds the volume empty;
/// a framework cannot reach another framework's volume (`tenant_fw`'s `ckpt`); the operator
/// lists and destroys volumes with `gantryctl volume`.
async fn volume_lifecycle(cluster: &Cluster, image: &str, tenant_fw: &str) {
    let work_dir = cluster.agents[0].work_dir.clone();
    let queue = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (up_tx, up_rx) = tokio::sync::mpsc::unbounded_channel();
    let (vol_tx, mut vol_rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = gantry_sdk::Driver::new(cluster.framework_config("volumes", &["containers"]));
    let handle = driver.handle();
    let run = tokio::spawn(driver.run(VolumeFw {
        queue: queue.clone(),
        updates: up_tx,
        volumes: vol_tx,
    }));
    let mut updates = Updates::new(up_rx);
    let launch = |t: &TaskInfo| {
        queue.lock().unwrap().push(t.clone());
        handle.revive(vec![]);
    };
    let with_volume = |name: &str, command: &str| {
        let mut t = in_container(name, command, image);
        t.container = Some(Box::new(
            ContainerInfo::new(image).with_volume(Volume::persistent("work", "/vol")),
        ));
        t.kill_grace_secs = Some(1);
        t
    };

    // The first attempt writes its volume and keeps running.
    let first = with_volume("attempt-1", "echo state-1 > /vol/data; sleep 600");
    launch(&first);
    let running = updates
        .wait(first.task_id, TaskState::Running, T)
        .await
        .unwrap();
    assert_eq!(running.state, TaskState::Running, "{running:?}");
    let agent_id = running.agent_id.expect("the agent");
    let fw = handle.framework_id().expect("subscribed").to_string();
    let vol_dir = work_dir.join("volumes").join(&fw).join("work");
    let deadline = std::time::Instant::now() + T;
    while std::fs::read_to_string(vol_dir.join("data")).unwrap_or_default() != "state-1\n" {
        assert!(
            std::time::Instant::now() < deadline,
            "attempt-1 wrote its volume"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Destroy while the task uses it: refused, naming the task; nothing removed.
    handle.destroy_volume(agent_id, "work");
    let a = answer(&mut vol_rx).await;
    assert_eq!((a.agent_id, a.name.as_str()), (agent_id, "work"));
    assert_eq!(
        a.outcome,
        VolumeOutcome::InUse {
            tasks: vec![first.task_id.to_string()]
        }
    );
    assert!(vol_dir.join("data").exists());
    // The operator's destroy is refused the same way (409); the list shows who uses what.
    let out = cluster
        .master
        .gantryctl(&["volume", "destroy", "ctr1", &format!("{fw}/work")])
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("in use by task(s)"),
        "{stderr}"
    );
    let out = cluster
        .master
        .gantryctl(&["volume", "list", "ctr1", "--json"])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let vols: Vec<(String, String, Vec<String>)> = list["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["framework"].as_str().unwrap().to_string(),
                v["name"].as_str().unwrap().to_string(),
                serde_json::from_value(v["used_by"].clone()).unwrap(),
            )
        })
        .collect();
    let mut want = vec![
        (tenant_fw.to_string(), "ckpt".to_string(), vec![]),
        (
            fw.clone(),
            "work".to_string(),
            vec![first.task_id.to_string()],
        ),
    ];
    want.sort();
    assert_eq!(vols, want);

    // A framework names only its own volumes: "ckpt" of this framework does not exist, and
    // the other framework's ckpt stays.
    handle.destroy_volume(agent_id, "ckpt");
    assert_eq!(answer(&mut vol_rx).await.outcome, VolumeOutcome::NotFound);
    let tenant_ckpt = work_dir.join("volumes").join(tenant_fw).join("ckpt");
    assert!(tenant_ckpt.join("data").exists());
    // A name the protocol refuses.
    handle.destroy_volume(agent_id, "../x");
    let a = answer(&mut vol_rx).await;
    assert!(
        matches!(&a.outcome, VolumeOutcome::Failed(m) if m.contains("1 to 64 bytes")),
        "{a:?}"
    );

    // Once the task has ended (and its container is cleaned up), the destroy goes through.
    handle.kill(first.task_id);
    updates
        .wait(first.task_id, TaskState::Killed, T)
        .await
        .unwrap();
    let bundle = work_dir
        .join("meta")
        .join(first.task_id.to_string())
        .join("container");
    let deadline = std::time::Instant::now() + T;
    while bundle.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "attempt-1's bundle is removed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle.destroy_volume(agent_id, "work");
    assert_eq!(answer(&mut vol_rx).await.outcome, VolumeOutcome::Destroyed);
    assert!(!vol_dir.exists());
    handle.destroy_volume(agent_id, "work");
    assert_eq!(answer(&mut vol_rx).await.outcome, VolumeOutcome::NotFound);

    // The next attempt finds its volume empty.
    let second = with_volume(
        "attempt-2",
        "ls -A /vol | wc -l > $GANTRY_SANDBOX/count.txt",
    );
    launch(&second);
    let done = updates
        .wait(second.task_id, TaskState::Finished, T)
        .await
        .unwrap();
    assert_eq!(done.state, TaskState::Finished, "{done:?}");
    let count =
        std::fs::read_to_string(cluster.agents[0].sandbox_file(second.task_id, "count.txt"))
            .unwrap();
    assert_eq!(count.trim(), "0", "the next attempt sees an empty volume");

    // The operator destroys both frameworks' volumes; a second destroy is not found (exit 3).
    for v in [format!("{tenant_fw}/ckpt"), format!("{fw}/work")] {
        let deadline = std::time::Instant::now() + T;
        loop {
            let out = cluster
                .master
                .gantryctl(&["volume", "destroy", "ctr1", &v])
                .unwrap();
            if out.status.success() {
                break;
            }
            // attempt-2's container may not be cleaned up yet.
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(stderr.contains("in use"), "{v}: {stderr}");
            assert!(std::time::Instant::now() < deadline, "{v}: {stderr}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(!tenant_ckpt.exists() && !vol_dir.exists());
    let out = cluster
        .master
        .gantryctl(&["volume", "destroy", "ctr1", &format!("{fw}/work")])
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cluster
        .master
        .gantryctl(&["volume", "list", "ctr1"])
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no persistent volume on ctr1\n"
    );

    handle.stop();
    tokio::time::timeout(T, run)
        .await
        .expect("the driver ends")
        .unwrap()
        .unwrap();
    // Nothing of these tasks is left mounted.
    let deadline = std::time::Instant::now() + T;
    while !mounts_below(&work_dir).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            mounts_below(&work_dir)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
