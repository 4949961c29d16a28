//! A GPU agent in a real cluster, with the stand-in NVML describing 4 GPUs of two models on 2
//! NUMA nodes and real cgroups: discovery in `/state`, topology-aware assignment, the tasks'
//! `CUDA_VISIBLE_DEVICES`, the device cgroup (files and enforcement), per-task GPU usage,
//! critical vs application XIDs, and the operator clear.
//!
//! One test in this binary: the stand-in's configuration path is a process-wide variable.

use std::time::Duration;

use gantry_sdk::protocol::{TaskId, TaskState};
use gantry_tests::{
    bin, cgroups_available, standin_lib, start_recording, state_task, task, CgroupRoot, Cluster,
    Standin, TempDir,
};

const T: Duration = Duration::from_secs(20);

fn gpu_total(s: &serde_json::Value) -> f64 {
    s["agents"][0]["total"]["gpus"].as_f64().unwrap_or(0.0)
}

fn gpu_healthy(s: &serde_json::Value, uuid: &str) -> Option<bool> {
    s["agents"][0]["gpus"]
        .as_array()?
        .iter()
        .find(|g| g["uuid"] == uuid)?["healthy"]
        .as_bool()
}

/// Lines of a v1 `devices.list` for NVIDIA GPU nodes (major 195, minus the control nodes).
fn gpu_device_lines(list: &str) -> Vec<String> {
    list.lines()
        .filter(|l| l.starts_with("c 195:") && !l.starts_with("c 195:25"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_are_discovered_assigned_isolated_measured_and_health_checked() {
    if !cgroups_available("gpu_cluster") {
        return;
    }
    let scratch = TempDir::new("gantry-gpu").unwrap();
    let mut standin = Standin::four_gpus(scratch.path()).unwrap();
    let root = CgroupRoot::new("gpu");
    let lib = standin_lib();
    let cluster = Cluster::start_with(
        &[("gpu1", "cpus:4;mem:4096")],
        &[],
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--cgroup-root",
            &root.name,
            "--usage-interval",
            "0.5",
        ],
    )
    .unwrap();
    let gpus = standin.config.gpus.clone();
    let uuid = |i: usize| gpus[i].uuid.clone();

    // Discovery: gpus:4 with every GPU's identity and attributes.
    let state = cluster
        .master
        .wait_state(T, "4 GPUs", |s| gpu_total(s) == 4.0)
        .unwrap();
    let listed = state["agents"][0]["gpus"].as_array().unwrap();
    assert_eq!(listed.len(), 4, "{state:#}");
    for (g, spec) in listed.iter().zip(&gpus) {
        assert_eq!(g["uuid"], spec.uuid.as_str());
        assert_eq!(g["name"], spec.name.as_str());
        assert_eq!(g["memory_mib"], spec.memory_mib);
        assert_eq!(g["minor"], spec.minor);
        assert_eq!(g["pci_bus_id"], spec.pci_bus_id.as_str());
        assert_eq!(g["numa_node"], spec.numa_node.unwrap());
        assert_eq!(
            g["compute_capability"],
            serde_json::json!([spec.compute_capability.0, spec.compute_capability.1])
        );
        assert_eq!(g["healthy"], true);
    }
    let models: std::collections::BTreeSet<&str> =
        listed.iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(models.len(), 2);

    // A 1-GPU task, then a 2-GPU task: the pair must come from one NUMA node, and not break
    // up the node the 1-GPU task left whole.
    let one = task("one", "env > env.txt; sleep 60", "cpus:0.5;mem:64;gpus:1");
    let mut pair = task(
        "pair",
        "env > env.txt; \
         mknod mine c 195 2 && mknod other c 195 0; \
         cat mine > /dev/null 2> open-mine.txt; cat other > /dev/null 2> open-other.txt; \
         echo done > probed.txt; sleep 60",
        "cpus:0.5;mem:64;gpus:2",
    );
    // mknod needs root: this probe runs as root (the master is in dev mode, which allows it),
    // so it is the device cgroup, not file permissions, that refuses the other GPU.
    pair.command.user = Some("root".into());
    let mut fw = start_recording(
        cluster.gpu_framework_config("gpu-test", &["ml"]),
        vec![one.clone(), pair.clone()],
    );
    for t in [&one, &pair] {
        fw.expect(&cluster, t, TaskState::Running, T).await;
    }
    let agent = &cluster.agents[0];
    let env_of = |t: TaskId| -> std::collections::BTreeMap<String, String> {
        agent
            .wait_sandbox_file(t, "env.txt", T)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let one_env = env_of(one.task_id);
    assert_eq!(one_env["CUDA_VISIBLE_DEVICES"], uuid(0));
    let pair_env = env_of(pair.task_id);
    let expected = format!("{},{}", uuid(2), uuid(3));
    assert_eq!(
        pair_env["CUDA_VISIBLE_DEVICES"], expected,
        "the pair shares NUMA node 1"
    );
    assert_eq!(pair_env["NVIDIA_VISIBLE_DEVICES"], expected);
    assert_eq!(gpus[2].numa_node, gpus[3].numa_node);

    // The device cgroup, read while the tasks run: only their own GPU nodes.
    let devices = |t: TaskId| {
        std::fs::read_to_string(root.task_dir("devices", t).join("devices.list"))
            .unwrap_or_else(|e| panic!("devices.list of {t}: {e}"))
    };
    let pair_list = devices(pair.task_id);
    assert_eq!(
        gpu_device_lines(&pair_list),
        vec!["c 195:2 rwm", "c 195:3 rwm"],
        "{pair_list}"
    );
    assert!(!pair_list.contains("a *:* rwm"), "{pair_list}");
    assert_eq!(gpu_device_lines(&devices(one.task_id)), vec!["c 195:0 rwm"]);
    // ...and enforced: its own GPU's node reaches the (absent) driver, another GPU's is refused.
    agent
        .wait_sandbox_file(pair.task_id, "probed.txt", T)
        .unwrap();
    let mine = std::fs::read_to_string(agent.sandbox_file(pair.task_id, "open-mine.txt")).unwrap();
    let other =
        std::fs::read_to_string(agent.sandbox_file(pair.task_id, "open-other.txt")).unwrap();
    assert!(
        mine.contains("No such device or address"),
        "own GPU refused: {mine:?}"
    );
    assert!(
        other.contains("not permitted"),
        "other GPU not refused: {other:?}"
    );

    // Usage: NVML shows the pair's process on GPU 2; /state attributes it to the task.
    let pid = agent.wait_task_pid(pair.task_id, T).unwrap() as u32;
    standin.config.gpus[2].processes = vec![gantry_nvml_standin::config::ProcessSpec {
        pid,
        used_memory_mib: 1024,
    }];
    standin.config.gpus[2].utilization_gpu = 60;
    standin.write().unwrap();
    let state = cluster
        .master
        .wait_state(T, "the pair's GPU usage", |s| {
            state_task(s, pair.task_id)["usage"]["gpu_mem_bytes"] == 1024u64 << 20
        })
        .unwrap();
    // /state records which GPUs the agent gave each task.
    assert_eq!(
        state_task(&state, pair.task_id)["gpus"],
        serde_json::json!([uuid(2), uuid(3)])
    );
    assert_eq!(
        state_task(&state, one.task_id)["gpus"],
        serde_json::json!([uuid(0)])
    );
    let usage = &state_task(&state, pair.task_id)["usage"];
    assert_eq!(usage["gpu_util_percent"].as_f64(), Some(60.0), "{usage}");
    assert!(usage["mem_bytes"].as_u64().unwrap() > 0, "{usage}");
    let samples = state["agents"][0]["gpu_samples"].as_array().unwrap();
    assert_eq!(samples.len(), 4);
    assert!(samples
        .iter()
        .any(|s| s["uuid"] == uuid(2) && s["util_percent"] == 60));

    // A critical XID on GPU 2 (held by the pair): withdrawn, and the task is told.
    standin.inject_xid(2, 79).unwrap();
    let state = cluster
        .master
        .wait_state(T, "GPU 2 unhealthy", |s| {
            gpu_healthy(s, &uuid(2)) == Some(false) && gpu_total(s) == 3.0
        })
        .unwrap();
    assert_eq!(gpu_healthy(&state, &uuid(3)), Some(true));
    let note = fw
        .updates
        .wait_for("the GPU failure notice", T, |u| {
            u.task_id == pair.task_id && u.message.contains(&uuid(2))
        })
        .await
        .unwrap();
    assert_eq!(note.state, TaskState::Running);
    assert!(note.message.contains("XID 79"), "{}", note.message);

    // An application XID (13) on GPU 3 changes nothing. The critical XID injected after it on
    // GPU 1 proves the watcher has handled it by the time GPU 1 is withdrawn.
    standin.inject_xid(3, 13).unwrap();
    standin.inject_xid(1, 48).unwrap();
    let state = cluster
        .master
        .wait_state(T, "GPU 1 unhealthy", |s| {
            gpu_healthy(s, &uuid(1)) == Some(false)
        })
        .unwrap();
    assert_eq!(
        gpu_healthy(&state, &uuid(3)),
        Some(true),
        "application XID counted"
    );
    assert_eq!(gpu_total(&state), 2.0);
    assert!(
        !fw.updates.seen.iter().any(|u| u.message.contains(&uuid(3))
            || u.task_id == one.task_id && u.message.contains("GPU")),
        "an application XID or another GPU's fault was reported to a task: {:#?}",
        fw.updates.seen
    );

    // The operator clears GPU 2: offered again, and its task hears about it.
    let out = std::process::Command::new(bin("gantry-agent").unwrap())
        .args(["clear-gpu", "--work-dir"])
        .arg(&agent.work_dir)
        .arg(uuid(2))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    cluster
        .master
        .wait_state(T, "GPU 2 healthy again", |s| {
            gpu_healthy(s, &uuid(2)) == Some(true) && gpu_total(s) == 3.0
        })
        .unwrap();
    fw.updates
        .wait_for("the healthy-again notice", T, |u| {
            u.task_id == pair.task_id && u.message.contains("healthy again")
        })
        .await
        .unwrap();

    // Kill both; their cgroups go away.
    fw.handle.kill(one.task_id);
    fw.handle.kill(pair.task_id);
    for t in [one.task_id, pair.task_id] {
        fw.updates.wait(t, TaskState::Killed, T).await.unwrap();
    }
    assert!(root.task_cgroups().is_empty(), "{:?}", root.task_cgroups());
    fw.stop(T).await;
}
