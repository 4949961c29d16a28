//! Frameworks choose GPUs by model, memory or exact device: a task with a GPU selector gets only
//! matching GPUs on a mixed host (a task pinned to a UUID gets that device), and a selector the
//! agent cannot satisfy is an ERROR, not a launch.
//!
//! One test in this binary: the stand-in's configuration path is a process-wide variable.

use std::time::Duration;

use gantry_sdk::protocol::{GpuSelector, TaskState};
use gantry_tests::{
    cgroups_available, standin_lib, start_recording, task, CgroupRoot, Cluster, Standin, TempDir,
};

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_selectors_pick_models_and_memory() {
    if !cgroups_available("gpu_selector") {
        return;
    }
    let scratch = TempDir::new("gantry-gpu-sel").unwrap();
    let standin = Standin::four_gpus(scratch.path()).unwrap();
    let root = CgroupRoot::new("gpusel");
    let lib = standin_lib();
    let cluster = Cluster::start_with(
        &[("sel1", "cpus:4;mem:4096")],
        &[],
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--cgroup-root",
            &root.name,
        ],
    )
    .unwrap();
    let gpus = standin.config.gpus.clone();
    let h100: Vec<String> = gpus
        .iter()
        .filter(|g| g.name.contains("H100"))
        .map(|g| g.uuid.clone())
        .collect();
    assert_eq!(h100.len(), 2);
    let other = gpus
        .iter()
        .find(|g| !g.name.contains("H100"))
        .map(|g| g.uuid.clone())
        .unwrap();

    // One H100 by model, one GPU with at least 80 GiB (only H100s have it), and one task asking
    // for a model the host does not have.
    let mut by_model = task(
        "h100",
        "echo $CUDA_VISIBLE_DEVICES > gpus.txt; sleep 30",
        "cpus:0.5;mem:64;gpus:1",
    );
    by_model.gpu_selector = Some(GpuSelector {
        model: Some("h100".into()),
        min_memory_mib: None,
        mig_profile: None,
        uuids: Vec::new(),
    });
    let mut by_memory = task(
        "big",
        "echo $CUDA_VISIBLE_DEVICES > gpus.txt; sleep 30",
        "cpus:0.5;mem:64;gpus:1",
    );
    by_memory.gpu_selector = Some(GpuSelector {
        model: None,
        min_memory_mib: Some(80_000),
        mig_profile: None,
        uuids: Vec::new(),
    });
    let mut absent = task("b200", "true", "cpus:0.5;mem:64;gpus:1");
    absent.gpu_selector = Some(GpuSelector {
        model: Some("B200".into()),
        min_memory_mib: None,
        mig_profile: None,
        uuids: Vec::new(),
    });
    // One task pinned to an exact device (not an H100), one pinned to a device the host lacks.
    let mut pinned = task(
        "pinned",
        "echo $CUDA_VISIBLE_DEVICES > gpus.txt; sleep 30",
        "cpus:0.5;mem:64;gpus:1",
    );
    pinned.gpu_selector = Some(GpuSelector::pinned([other.clone()]));
    let mut elsewhere = task("elsewhere", "true", "cpus:0.5;mem:64;gpus:1");
    elsewhere.gpu_selector = Some(GpuSelector::pinned(["GPU-not-on-this-host"]));

    let mut fw = start_recording(
        cluster.gpu_framework_config("selector", &["ml"]),
        vec![
            by_model.clone(),
            by_memory.clone(),
            absent.clone(),
            pinned.clone(),
            elsewhere.clone(),
        ],
    );

    let err = fw
        .updates
        .wait(absent.task_id, TaskState::Error, T)
        .await
        .unwrap();
    assert!(err.message.contains("matching"), "{}", err.message);
    let err = fw
        .updates
        .wait(elsewhere.task_id, TaskState::Error, T)
        .await
        .unwrap();
    assert!(
        err.message.contains("GPU-not-on-this-host"),
        "{}",
        err.message
    );
    for t in [&by_model, &by_memory, &pinned] {
        fw.expect(&cluster, t, TaskState::Running, T).await;
    }
    let agent = &cluster.agents[0];
    let a = agent
        .wait_sandbox_file(by_model.task_id, "gpus.txt", T)
        .unwrap();
    let b = agent
        .wait_sandbox_file(by_memory.task_id, "gpus.txt", T)
        .unwrap();
    let (a, b) = (a.trim().to_string(), b.trim().to_string());
    assert!(h100.contains(&a), "{a} is not an H100 ({h100:?})");
    assert!(h100.contains(&b), "{b} is not an H100 ({h100:?})");
    assert_ne!(a, b);
    let p = agent
        .wait_sandbox_file(pinned.task_id, "gpus.txt", T)
        .unwrap();
    assert_eq!(p.trim(), other, "the pinned task got exactly its device");
    fw.stop(T).await;
}
