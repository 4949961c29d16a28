//! Killing tasks through the SDK, failing tasks, and the kill escalation to SIGKILL of the
//! whole process group.

use std::time::Duration;

use gantry_sdk::protocol::TaskState;
use gantry_sdk::Driver;
use gantry_tests::{task, Cluster, Recorder, Updates};
use tokio::sync::mpsc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_fail_and_escalation() {
    let cluster = Cluster::start(&[("solo", "cpus:4;mem:1024")]).unwrap();
    let sleeper = task(
        "sleeper",
        "sleep 600 & echo $! > child.pid; wait",
        "cpus:1;mem:64",
    );
    let failer = task("failer", "echo bad >&2; exit 3", "cpus:1;mem:64");
    let mut stubborn = task("stubborn", "trap '' TERM; sleep 600", "cpus:1;mem:64");
    stubborn.kill_grace_secs = Some(1);
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let mut updates = Updates::new(up_rx);
    let (err_tx, _err_rx) = mpsc::unbounded_channel();
    let rec = Recorder {
        to_launch: vec![sleeper.clone(), failer.clone(), stubborn.clone()],
        updates: up_tx,
        errors: err_tx,
        in_flight: Default::default(),
    };
    let config = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "lifecycle",
        vec!["ops".into()],
    );
    let driver = Driver::new(config);
    let handle = driver.handle();
    let run = tokio::spawn(driver.run(rec));

    let t = Duration::from_secs(30);
    let failed = updates
        .wait(failer.task_id, TaskState::Failed, t)
        .await
        .unwrap();
    assert_eq!(failed.exit_code, Some(3), "{failed:?}");
    assert!(failed.message.contains("code 3"), "{}", failed.message);

    updates
        .wait(sleeper.task_id, TaskState::Running, t)
        .await
        .unwrap();
    let sandbox = cluster.agents[0]
        .work_dir
        .join("sandboxes")
        .join(sleeper.task_id.to_string());
    // The task's background child exists...
    let child_pid = loop {
        // (The shell may not have finished writing it yet: read until it parses.)
        if let Some(p) = std::fs::read_to_string(sandbox.join("child.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            break p;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(std::path::Path::new(&format!("/proc/{child_pid}")).exists());
    handle.kill(sleeper.task_id);
    let killed = updates
        .wait(sleeper.task_id, TaskState::Killed, t)
        .await
        .unwrap();
    assert_eq!(killed.signal, Some(15), "{killed:?}");
    // ...and dies with the process group.
    let gone = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        std::fs::read_to_string(format!("/proc/{child_pid}/stat"))
            .map(|s| s.contains(") Z"))
            .unwrap_or(true)
    });
    assert!(gone, "the task's child process survived the kill");

    // A task that ignores SIGTERM is SIGKILLed after its grace period.
    updates
        .wait(stubborn.task_id, TaskState::Running, t)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    handle.kill(stubborn.task_id);
    let killed = updates
        .wait(stubborn.task_id, TaskState::Killed, t)
        .await
        .unwrap();
    assert_eq!(killed.signal, Some(9), "{killed:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "SIGKILL came before the grace period"
    );

    // Reconciliation reports terminal states.
    handle.reconcile(vec![failer.task_id]);
    let u = updates
        .wait_for("a reconciliation answer", t, |u| u.reconciliation)
        .await
        .unwrap();
    assert_eq!((u.task_id, u.state), (failer.task_id, TaskState::Failed));
    // Killing an unknown task is an error, not a crash.
    handle.kill(gantry_sdk::protocol::TaskId::random());
    handle.stop();
    tokio::time::timeout(t, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let state = cluster
        .master
        .wait_state(t, "no tasks left", |s| {
            s["tasks"].as_array().is_some_and(|t| t.is_empty())
        })
        .unwrap();
    assert!(state["agents"][0]["used"].as_object().unwrap().is_empty());
}
