//! Framework failover on a standalone master: a framework that disconnects and comes back with
//! its framework id within its failover timeout keeps its running tasks (they reconcile as
//! RUNNING and then finish); a framework that does not come back within its failover timeout
//! has its tasks killed.

use std::time::{Duration, Instant};

use gantry_sdk::protocol::{TaskId, TaskState};
use gantry_sdk::Driver;
use gantry_tests::{task, Cluster, Recorder, Updates};
use tokio::sync::mpsc;

/// A driver for `principal` with failover timeout `failover_secs` that launches `tasks`.
fn driver(
    c: &Cluster,
    principal: &str,
    failover_secs: f64,
    id: Option<gantry_sdk::protocol::FrameworkId>,
) -> Driver {
    let mut config = gantry_tests::driver_config(
        vec![c.master.quic.to_string()],
        c.tls_dir.clone(),
        principal,
        vec!["failover".to_string()],
    );
    config.info.failover_timeout_secs = failover_secs;
    config.info.framework_id = id;
    Driver::new(config)
}

fn recorder(
    tasks: Vec<gantry_sdk::protocol::TaskInfo>,
) -> (Recorder, Updates, mpsc::UnboundedReceiver<String>) {
    let (utx, urx) = mpsc::unbounded_channel();
    let (etx, erx) = mpsc::unbounded_channel();
    (
        Recorder {
            to_launch: tasks,
            updates: utx,
            errors: etx,
            in_flight: Default::default(),
        },
        Updates::new(urx),
        erx,
    )
}

/// Runs a first driver until every task in `tasks` is RUNNING, then disconnects it (no
/// teardown). Returns the framework id and the instant just before the disconnect: the master
/// cannot see the framework go before then, so a failover timer measured from it is a sound lower
/// bound (the driver's own shutdown can take a while longer under load).
async fn launch_then_disconnect(
    c: &Cluster,
    principal: &str,
    failover_secs: f64,
    tasks: &[gantry_sdk::protocol::TaskInfo],
) -> (gantry_sdk::protocol::FrameworkId, Instant) {
    let d = driver(c, principal, failover_secs, None);
    let handle = d.handle();
    let (rec, mut updates, _errors) = recorder(tasks.to_vec());
    let run = tokio::spawn(d.run(rec));
    for t in tasks {
        updates
            .wait(t.task_id, TaskState::Running, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| {
                c.dump_logs();
                panic!("{e:#}")
            });
    }
    let id = handle.framework_id().expect("registered");
    let disconnecting_at = Instant::now();
    handle.disconnect();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("driver ends after disconnect")
        .unwrap()
        .unwrap();
    (id, disconnecting_at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framework_returning_within_failover_timeout_keeps_its_tasks() {
    let c = Cluster::start(&[("ff1", "cpus:4;mem:1024")]).unwrap();
    let tasks: Vec<_> = (0..3)
        .map(|i| task(&format!("keep{i}"), "sleep 6", "cpus:1;mem:32"))
        .collect();
    let ids: Vec<TaskId> = tasks.iter().map(|t| t.task_id).collect();
    let (id, _) = launch_then_disconnect(&c, "keeper", 30.0, &tasks).await;

    // The master keeps the framework (disconnected) and its tasks.
    let s = c
        .master
        .wait_state(Duration::from_secs(10), "framework disconnected", |s| {
            s["frameworks"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["connected"] == false))
        })
        .unwrap();
    let running = s["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "RUNNING")
        .count();
    assert_eq!(running, 3, "{s:#}");
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A new driver with the same framework id re-subscribes and reconciles.
    let d = driver(&c, "keeper", 30.0, Some(id));
    let handle = d.handle();
    handle.reconcile(Vec::new()); // implicit: sent right after the subscription
    let (rec, mut updates, mut errors) = recorder(Vec::new());
    let run = tokio::spawn(d.run(rec));
    for &t in &ids {
        updates
            .wait(t, TaskState::Running, Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| {
                c.dump_logs();
                panic!("{e:#}")
            });
    }
    assert_eq!(handle.framework_id(), Some(id), "same framework id");
    for &t in &ids {
        updates
            .wait(t, TaskState::Finished, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| {
                c.dump_logs();
                panic!("{e:#}")
            });
    }
    // Each task ended exactly once, as FINISHED.
    for &t in &ids {
        let terminal: Vec<_> = updates
            .seen
            .iter()
            .filter(|u| u.task_id == t && u.state.is_terminal())
            .map(|u| u.state)
            .collect();
        assert_eq!(terminal, vec![TaskState::Finished], "task {t}");
    }
    assert!(errors.try_recv().is_err(), "no errors expected");
    handle.stop();
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framework_not_returning_has_its_tasks_killed() {
    let c = Cluster::start(&[("ff2", "cpus:4;mem:1024")]).unwrap();
    let tasks: Vec<_> = (0..2)
        .map(|i| task(&format!("orphan{i}"), "sleep 60", "cpus:1;mem:32"))
        .collect();
    let ids: Vec<String> = tasks.iter().map(|t| t.task_id.to_string()).collect();
    let (_, disconnected_at) = launch_then_disconnect(&c, "leaver", 1.0, &tasks).await;

    // After the 1 s failover timeout the framework is removed and its tasks are killed.
    let s = c
        .master
        .wait_state(Duration::from_secs(20), "tasks killed", |s| {
            s["completed_tasks"].as_array().is_some_and(|done| {
                ids.iter()
                    .all(|id| done.iter().any(|t| t["id"] == id.as_str()))
            })
        })
        .unwrap_or_else(|e| {
            c.dump_logs();
            panic!("{e:#}")
        });
    let elapsed = disconnected_at.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900),
        "killed before the failover timeout: {elapsed:?}"
    );
    for t in s["completed_tasks"].as_array().unwrap() {
        if ids.iter().any(|id| t["id"] == id.as_str()) {
            assert_eq!(t["state"], "KILLED", "{t:#}");
        }
    }
    assert!(
        s["frameworks"]
            .as_array()
            .is_some_and(|f| f.iter().all(|f| f["name"] != "leaver")),
        "framework removed: {s:#}"
    );
    // The processes are really gone: each task's meta directory has its exit record.
    let metas = c.agents[0].work_dir.join("meta");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let exited = std::fs::read_dir(&metas)
            .map(|d| {
                d.flatten()
                    .filter(|e| gantry_agent::executor::read_exit(&e.path()).is_some())
                    .count()
            })
            .unwrap_or(0);
        if exited == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tasks without exit.json after the kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
