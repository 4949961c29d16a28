//! Sandbox garbage collection on a real agent (`--isolation none`): the sandboxes and control
//! files of ended tasks are removed `--gc-delay` after the task ended, oldest first, keeping the
//! newest `--gc-keep`; with `--gc-disk-headroom 1` (the disk counts as full) they go at once;
//! with the default hour they stay.

use std::collections::BTreeSet;
use std::time::Duration;

use gantry_sdk::protocol::{TaskId, TaskState};
use gantry_tests::{start_recorder, task, Cluster};

const T: Duration = Duration::from_secs(60);

/// Runs `n` tasks to FINISHED through a framework named `name`; returns their ids.
async fn run_wave(cluster: &Cluster, name: &str, n: usize) -> Vec<TaskId> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            task(
                &format!("{name}-{i}"),
                "echo out; echo err >&2",
                "cpus:0.1;mem:8",
            )
        })
        .collect();
    let config = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        name,
        vec!["batch".into()],
    );
    let (mut updates, handle, run) = start_recorder(config, tasks.clone());
    for t in &tasks {
        if let Err(e) = updates.wait(t.task_id, TaskState::Finished, T).await {
            cluster.dump_logs();
            panic!("{e}");
        }
    }
    // Every task forgotten by the agent (its terminal update acknowledged) before the next wave.
    cluster
        .master
        .wait_state(T, "no tasks left", |s| {
            s["tasks"].as_array().is_some_and(|t| t.is_empty())
        })
        .unwrap();
    handle.stop();
    tokio::time::timeout(T, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    tasks.iter().map(|t| t.task_id).collect()
}

fn dirs(cluster: &Cluster, sub: &str) -> BTreeSet<String> {
    std::fs::read_dir(cluster.agents[0].work_dir.join(sub))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the agent's sandboxes and meta directories are exactly `ids`.
async fn wait_dirs(cluster: &Cluster, ids: &[TaskId]) {
    let want: BTreeSet<String> = ids.iter().map(TaskId::to_string).collect();
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let (sandboxes, meta) = (dirs(cluster, "sandboxes"), dirs(cluster, "meta"));
        if sandboxes == want && meta == want {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            cluster.dump_logs();
            panic!("sandboxes {sandboxes:?} / meta {meta:?}, want {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn cluster(name: &str, gc: &[&str]) -> Cluster {
    let mut args = vec!["--isolation", "none"];
    args.extend_from_slice(gc);
    Cluster::start_with(&[(name, "cpus:2;mem:1024;gpus:0")], &[], &args).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_go_after_the_delay_keeping_the_newest() {
    let cluster = cluster("gc-delay", &["--gc-delay", "2", "--gc-keep", "2"]);
    let old = run_wave(&cluster, "gc-old", 4).await;
    // The first wave ends before the second starts: the newest two are the second wave's.
    let new = run_wave(&cluster, "gc-new", 2).await;
    assert!(old.iter().all(|t| !new.contains(t)));
    wait_dirs(&cluster, &new).await;
    for t in &new {
        let out = cluster.agents[0].sandbox_file(*t, "stdout");
        assert_eq!(std::fs::read_to_string(out).unwrap(), "out\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_collects_at_once() {
    // Headroom 1: the disk always counts as full, so the hour-long delay is zero.
    let cluster = cluster(
        "gc-full",
        &[
            "--gc-delay",
            "3600",
            "--gc-disk-headroom",
            "1",
            "--gc-keep",
            "1",
        ],
    );
    run_wave(&cluster, "gc-full-a", 3).await;
    let last = run_wave(&cluster, "gc-full-b", 1).await;
    wait_dirs(&cluster, &last).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn within_the_delay_sandboxes_stay() {
    let cluster = cluster("gc-keep", &["--gc-keep", "0"]);
    let ids = run_wave(&cluster, "gc-stay", 3).await;
    // Collection passes run every second; after several, nothing has gone (the default delay
    // is an hour).
    tokio::time::sleep(Duration::from_secs(3)).await;
    wait_dirs(&cluster, &ids).await;
}
