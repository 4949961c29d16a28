//! GPU sharing in a real cluster (issue 16): a GPU agent over the stand-in NVML with two whole
//! GPUs and one GPU in MIG mode (two `1g.10gb` slices and one `3g.40gb`), real cgroups, run with
//! `--gpu-sharing mps --gpu-memory-enforce kill` and a stand-in `nvidia-cuda-mps-control` in
//! `PATH`.
//!
//! - Fractional tasks (0.25 + 0.5 + 0.25) share one physical GPU: the same UUID in
//!   `CUDA_VISIBLE_DEVICES` and in `/state`, fractions summing to at most 1, each with its MPS
//!   limits and the pipe directory of that GPU's MPS control daemon, which the agent started.
//! - A task selecting the MIG profile `1g.10gb` gets a MIG device of that profile (its MIG UUID
//!   in `CUDA_VISIBLE_DEVICES`); a whole-GPU task gets the other, idle, physical GPU.
//! - A fractional task whose process uses more GPU memory than its share (NVML's process list)
//!   is reported (`gpu-memory` update while running) and killed (`FAILED`, reason `gpu-memory`
//!   in `/state`); the tasks sharing its GPU keep running.
//! - A critical XID on the GPU in MIG mode withdraws its MIG devices and tells the slice's task.
//!
//! One test in this binary: the stand-in's configuration path and `PATH` are process-wide.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use gantry_nvml_standin::config::{GpuSpec, MigSpec, ProcessSpec, StandinConfig};
use gantry_sdk::protocol::{GpuSelector, TaskId, TaskReason, TaskState};
use gantry_tests::{
    cgroups_available, standin_lib, start_recording, state_task, task, CgroupRoot, Cluster,
    Standin, TempDir,
};

const T: Duration = Duration::from_secs(30);
const GPU_MIB: u64 = 81_920;

fn gpu(i: u32) -> GpuSpec {
    GpuSpec {
        uuid: format!("GPU-5ba2e000-0000-4000-8000-00000000000{i}"),
        name: "NVIDIA A100-SXM4-80GB".into(),
        memory_mib: GPU_MIB,
        minor: i,
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x20 + i),
        numa_node: Some(0),
        compute_capability: (8, 0),
        utilization_gpu: 0,
        utilization_memory: 0,
        temperature_c: 40,
        power_mw: 60_000,
        memory_used_mib: None,
        processes: vec![],
        mig_devices: vec![],
    }
}

fn mig(i: u32, profile: &str, memory_mib: u64) -> MigSpec {
    MigSpec {
        uuid: format!("MIG-5ba2e000-0000-5000-8000-00000000000{i}"),
        profile: profile.into(),
        memory_mib,
    }
}

/// A stand-in MPS control binary: records the GPU it serves next to its pipe directory and
/// stays up while its parent (the agent) lives.
const FAKE_MPS: &str = r#"#!/bin/sh
echo "$CUDA_VISIBLE_DEVICES" > "$CUDA_MPS_PIPE_DIRECTORY/../daemon.txt"
while kill -0 "$PPID" 2>/dev/null; do sleep 0.2; done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fractions_share_a_gpu_mig_slices_by_profile_and_gpu_memory_is_enforced() {
    if !cgroups_available("gpu_sharing") {
        return;
    }
    let scratch = TempDir::new("gantry-gpu-sharing").unwrap();
    let mut mig_gpu = gpu(2);
    mig_gpu.mig_devices = vec![
        mig(0, "1g.10gb", 9_856),
        mig(1, "1g.10gb", 9_856),
        mig(2, "3g.40gb", 40_192),
    ];
    let mut standin = Standin::with_config(
        scratch.path(),
        StandinConfig {
            driver_version: "550.54.15".into(),
            cuda_version: 12040,
            gpus: vec![gpu(0), gpu(1), mig_gpu],
            events: vec![],
            replay_events: true,
        },
    )
    .unwrap();
    // The MPS control daemon the agent starts per shared GPU.
    let bin_dir = scratch.path().join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let mps = bin_dir.join("nvidia-cuda-mps-control");
    std::fs::write(&mps, FAKE_MPS).unwrap();
    std::fs::set_permissions(&mps, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::set_var("PATH", format!("{}:{path}", bin_dir.display()));

    let root = CgroupRoot::new("gpushare");
    let lib = standin_lib();
    let cluster = Cluster::start_with(
        &[("gpushare1", "cpus:8;mem:8192")],
        &[],
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--cgroup-root",
            &root.name,
            "--usage-interval",
            "0.5",
            "--gpu-sharing",
            "mps",
            "--gpu-memory-enforce",
            "kill",
        ],
    )
    .unwrap();

    // Discovery: 2 whole GPUs + 3 MIG devices; the GPU in MIG mode is not offered itself.
    let state = cluster
        .master
        .wait_state(T, "5 GPUs", |s| {
            s["agents"][0]["total"]["gpus"].as_f64() == Some(5.0)
        })
        .unwrap();
    let listed = state["agents"][0]["gpus"].as_array().unwrap().clone();
    let uuids: Vec<&str> = listed.iter().filter_map(|g| g["uuid"].as_str()).collect();
    let (g0, g1, g2) = (gpu(0).uuid, gpu(1).uuid, gpu(2).uuid);
    assert!(uuids.contains(&g0.as_str()) && uuids.contains(&g1.as_str()));
    assert!(!uuids.contains(&g2.as_str()), "{uuids:?}");
    let slices: Vec<(&str, &str)> = listed
        .iter()
        .filter_map(|g| Some((g["uuid"].as_str()?, g["mig_profile"].as_str()?)))
        .collect();
    assert_eq!(slices.len(), 3, "{listed:#?}");
    assert!(listed
        .iter()
        .filter(|g| g["mig_profile"].is_string())
        .all(|g| g["parent_uuid"] == g2.as_str()));

    // Three fractions, a MIG slice by profile and a whole GPU.
    let run = "env > env.txt; sleep 120";
    let q1 = task("q1", run, "cpus:0.5;mem:64;gpus:0.25");
    let q2 = task("q2", run, "cpus:0.5;mem:64;gpus:0.5");
    let q3 = task("q3", run, "cpus:0.5;mem:64;gpus:0.25");
    let mut slice = task("slice", run, "cpus:0.5;mem:64;gpus:1");
    slice.gpu_selector = Some(GpuSelector {
        mig_profile: Some("1g.10gb".into()),
        ..GpuSelector::default()
    });
    let whole = task("whole", run, "cpus:0.5;mem:64;gpus:1");
    let all = [&q1, &q2, &q3, &slice, &whole];

    let mut fw = start_recording(
        cluster.gpu_framework_config("gpu-sharing", &["ml"]),
        all.iter().map(|t| (*t).clone()).collect(),
    );
    for t in all {
        fw.expect(&cluster, t, TaskState::Running, T).await;
    }
    let agent = &cluster.agents[0];
    let env_of = |t: TaskId| -> BTreeMap<String, String> {
        agent
            .wait_sandbox_file(t, "env.txt", T)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };

    // The fractions share one physical GPU, fractions summing to 1.
    let shared = env_of(q1.task_id)["CUDA_VISIBLE_DEVICES"].clone();
    assert!(shared == g0 || shared == g1, "{shared}");
    for (t, percent, mem) in [
        (&q1, "25", 20_480),
        (&q2, "50", 40_960),
        (&q3, "25", 20_480),
    ] {
        let env = env_of(t.task_id);
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], shared, "{}", t.name);
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], shared, "{}", t.name);
        assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], percent);
        assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], format!("0={mem}M"));
        // The MPS control daemon of that GPU, started and supervised by the agent.
        let pipe = agent.work_dir.join("mps").join(&shared).join("pipe");
        assert_eq!(env["CUDA_MPS_PIPE_DIRECTORY"], pipe.display().to_string());
    }
    let daemon = agent.work_dir.join("mps").join(&shared).join("daemon.txt");
    let deadline = std::time::Instant::now() + T;
    while std::fs::read_to_string(&daemon)
        .ok()
        .map(|s| s.trim().to_string())
        != Some(shared.clone())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no MPS control daemon for {shared}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let state = cluster
        .master
        .wait_state(T, "the GPUs of every task", |s| {
            all.iter().all(|t| {
                state_task(s, t.task_id)["gpus"]
                    .as_array()
                    .is_some_and(|g| !g.is_empty())
            })
        })
        .unwrap();
    let mut on_shared = 0.0;
    for t in [&q1, &q2, &q3] {
        assert_eq!(
            state_task(&state, t.task_id)["gpus"],
            serde_json::json!([shared])
        );
        on_shared += t.resources.get("gpus");
    }
    assert!(on_shared <= 1.0, "{on_shared}");

    // The MIG slice: a MIG device of the profile asked for; the whole GPU: the idle one.
    let slice_env = env_of(slice.task_id);
    let slice_uuid = &slice_env["CUDA_VISIBLE_DEVICES"];
    assert!(
        slices
            .iter()
            .any(|(u, p)| u == slice_uuid && *p == "1g.10gb"),
        "{slice_uuid} is not a 1g.10gb MIG device: {slices:?}"
    );
    assert!(!slice_env.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    let whole_uuid = &env_of(whole.task_id)["CUDA_VISIBLE_DEVICES"];
    let other = if shared == g0 { &g1 } else { &g0 };
    assert_eq!(whole_uuid, other);

    // GPU memory: q1's process uses 30 GiB of the shared GPU, above its 20 GiB share.
    let pid = agent.wait_task_pid(q1.task_id, T).unwrap() as u32;
    let shared_index = if shared == g0 { 0 } else { 1 };
    standin.config.gpus[shared_index].processes = vec![ProcessSpec {
        pid,
        used_memory_mib: 30_720,
    }];
    standin.write().unwrap();
    let report = fw
        .updates
        .wait_for("the GPU-memory report", T, |u| {
            u.task_id == q1.task_id && u.reason == Some(TaskReason::GpuMemory)
        })
        .await
        .unwrap();
    assert_eq!(report.state, TaskState::Running, "{report:?}");
    assert!(
        report.message.contains("30720 MiB") && report.message.contains("20480 MiB"),
        "{}",
        report.message
    );
    let ended = fw
        .updates
        .wait(q1.task_id, TaskState::Failed, T)
        .await
        .unwrap();
    assert_eq!(ended.reason, Some(TaskReason::GpuMemory), "{ended:?}");
    cluster
        .master
        .wait_state(T, "q1 failed for GPU memory in /state", |s| {
            let mut all = s["tasks"].as_array().cloned().unwrap_or_default();
            all.extend(s["completed_tasks"].as_array().cloned().unwrap_or_default());
            all.iter().any(|t| {
                t["id"] == q1.task_id.to_string()
                    && t["state"] == "FAILED"
                    && t["reason"] == "gpu-memory"
            })
        })
        .unwrap();
    // /state shows what is left of each GPU: q1's quarter is free again on the shared GPU.
    cluster
        .master
        .wait_state(T, "the shared GPU's free share in /state", |s| {
            s["agents"][0]["gpu_free"].as_array().is_some_and(|gs| {
                gs.iter().any(|g| {
                    g["uuid"] == shared.as_str()
                        && g["free_milli"] == 250
                        && g["free_memory_mib"] == 20_480
                })
            })
        })
        .unwrap();
    // /state shows each task's GPU-memory share beside its use.
    cluster
        .master
        .wait_state(T, "q2's GPU-memory share in /state", |s| {
            state_task(s, q2.task_id)["usage"]["gpu_mem_share_bytes"] == 40_960u64 << 20
        })
        .unwrap();
    // Its GPU neighbours are untouched.
    let state = cluster.master.state().unwrap();
    for t in [&q2, &q3] {
        assert_eq!(
            state_task(&state, t.task_id)["state"],
            "RUNNING",
            "{}",
            t.name
        );
    }

    // A critical XID on the GPU in MIG mode withdraws its MIG devices, and the slice's task
    // hears about it.
    standin.inject_xid(2, 79).unwrap();
    cluster
        .master
        .wait_state(T, "the MIG devices withdrawn", |s| {
            s["agents"][0]["total"]["gpus"].as_f64() == Some(2.0)
        })
        .unwrap();
    let note = fw
        .updates
        .wait_for("the MIG device's failure notice", T, |u| {
            u.task_id == slice.task_id && u.reason == Some(TaskReason::GpuHealth)
        })
        .await
        .unwrap();
    assert!(
        note.message.contains(slice_uuid.as_str()),
        "{}",
        note.message
    );

    for t in [&q2, &q3, &slice, &whole] {
        fw.handle.kill(t.task_id);
    }
    for t in [&q2, &q3, &slice, &whole] {
        fw.updates
            .wait(t.task_id, TaskState::Killed, T)
            .await
            .unwrap();
    }
    fw.stop(T).await;
}
