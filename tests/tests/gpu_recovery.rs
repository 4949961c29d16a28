//! GPU health across an agent restart and the automatic recovery check: an unhealthy GPU stays
//! withdrawn after `kill -9` and restart (it is checkpointed; the stand-in does not replay the
//! XID, like real NVML), and with `--gpu-recovery-after` it comes back once the delay has passed
//! without a new fault and the device answers NVML again.
//!
//! One test in this binary: the stand-in's configuration path is a process-wide variable.

use std::time::{Duration, Instant};

use gantry_tests::{cgroups_available, standin_lib, CgroupRoot, Cluster, Standin, TempDir};

const T: Duration = Duration::from_secs(20);

fn healthy(s: &serde_json::Value, uuid: &str) -> Option<bool> {
    s["agents"][0]["gpus"]
        .as_array()?
        .iter()
        .find(|g| g["uuid"] == uuid)?["healthy"]
        .as_bool()
}

fn registrations(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("registered with the master")
        .count()
}

#[test]
fn unhealthy_gpu_survives_restart_then_recovers() {
    if !cgroups_available("gpu_recovery") {
        return;
    }
    let scratch = TempDir::new("gantry-gpu-recovery").unwrap();
    let mut standin = Standin::four_gpus(scratch.path()).unwrap();
    standin.config.replay_events = false;
    standin.write().unwrap();
    let root = CgroupRoot::new("gpurec");
    let lib = standin_lib();
    let mut cluster = Cluster::start_with(
        &[("gpurec", "cpus:2;mem:1024")],
        &[],
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--cgroup-root",
            &root.name,
            "--gpu-recovery-after",
            "4",
        ],
    )
    .unwrap();
    let uuid = standin.config.gpus[1].uuid.clone();
    cluster
        .master
        .wait_state(T, "4 GPUs", |s| s["agents"][0]["total"]["gpus"] == 4.0)
        .unwrap();

    // A double-bit-ECC XID (48) on GPU 1.
    standin.inject_xid(1, 48).unwrap();
    let faulted = Instant::now();
    cluster
        .master
        .wait_state(T, "GPU 1 unhealthy", |s| {
            healthy(s, &uuid) == Some(false) && s["agents"][0]["total"]["gpus"] == 3.0
        })
        .unwrap();

    // kill -9 and restart: the agent re-registers with the GPU still unhealthy.
    let log = cluster.agents[0].log.clone();
    let before = registrations(&log);
    cluster.agents[0].restart().unwrap();
    let deadline = Instant::now() + T;
    while registrations(&log) == before {
        assert!(Instant::now() < deadline, "the agent did not re-register");
        std::thread::sleep(Duration::from_millis(20));
    }
    let restarted = Instant::now();
    let state = cluster.master.state().unwrap();
    assert!(
        restarted.duration_since(faulted) < Duration::from_secs(4),
        "the restart took too long for this check"
    );
    assert_eq!(healthy(&state, &uuid), Some(false), "{state:#}");
    assert_eq!(state["agents"][0]["total"]["gpus"], 3.0);
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("GPU still unhealthy from before the restart"),
        "{log_text}"
    );

    // The recovery delay (4 s, restarted with the agent) passes, the check succeeds.
    cluster
        .master
        .wait_state(T, "GPU 1 healthy again", |s| {
            healthy(s, &uuid) == Some(true) && s["agents"][0]["total"]["gpus"] == 4.0
        })
        .unwrap();
    assert!(
        restarted.elapsed() >= Duration::from_secs(3),
        "recovered before the delay: {:?}",
        restarted.elapsed()
    );
}
