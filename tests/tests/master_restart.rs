//! A standalone master killed with `kill -9` and restarted on the same address and work dir.
//! Its QUIC stateless-reset key is kept in the work dir, so the agent's and framework's next
//! packets on their old connections are answered with a reset they accept: both notice the
//! restart within a keep-alive interval (not after the 15 s idle timeout), the agent
//! re-registers with its task well inside the default 10 s re-register timeout, the framework
//! re-subscribes with its id, and the task is never reported LOST and finishes exactly once.

use std::time::{Duration, Instant};

use gantry_sdk::protocol::{StatusUpdate, TaskState};
use gantry_tests::{start_recorder, state_task, task, Cluster};

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_master_restart_keeps_agents_frameworks_and_tasks() {
    let mut cluster = Cluster::start(&[("mr1", "cpus:4;mem:1024")]).unwrap();
    let go = cluster.dir.path().join("go");
    let mut t = task(
        "outlives-the-master",
        "while [ ! -e \"$GO\" ]; do sleep 0.1; done",
        "cpus:1;mem:64",
    );
    t.env.insert("GO".into(), go.display().to_string());

    let config = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "restart-fw",
        vec!["batch".into()],
    );
    let (mut updates, handle, run) = start_recorder(config, vec![t.clone()]);
    updates
        .wait(t.task_id, TaskState::Running, T)
        .await
        .unwrap();
    let before = cluster.master.state().unwrap();
    let agent_id = before["agents"][0]["id"].clone();
    let framework_id = before["frameworks"][0]["id"].clone();

    let restarted = Instant::now();
    cluster.master.restart().unwrap();
    let state = match cluster
        .master
        .wait_state(T, "agent and framework back", |s| {
            s["agents"][0]["connected"] == true
                && s["frameworks"][0]["connected"] == true
                && state_task(s, t.task_id)["state"] == "RUNNING"
        }) {
        Ok(s) => s,
        Err(e) => {
            cluster.dump_logs();
            panic!("{e}");
        }
    };
    let back = restarted.elapsed();
    assert_eq!(state["agents"][0]["id"], agent_id, "{state:#}");
    assert_eq!(state["frameworks"][0]["id"], framework_id, "{state:#}");
    // Functional bound, not a speed target: later than the re-register timeout the master
    // would have declared the agent lost (and its task LOST, checked below).
    if back >= Duration::from_secs(10) {
        cluster.dump_logs();
    }
    assert!(
        back < Duration::from_secs(10),
        "agent back only after {back:?}"
    );
    let agent_log = std::fs::read_to_string(&cluster.agents[0].log).unwrap_or_default();
    assert!(
        agent_log.contains("master connection lost"),
        "the agent noticed the restart through its connection: {agent_log}"
    );

    std::fs::write(&go, b"").unwrap();
    updates
        .wait(t.task_id, TaskState::Finished, T)
        .await
        .unwrap();
    let _ = updates
        .wait_for("no more updates", Duration::from_secs(2), |_| false)
        .await;
    let terminal: Vec<&StatusUpdate> = updates
        .seen
        .iter()
        .filter(|u| u.task_id == t.task_id && u.state.is_terminal() && !u.reconciliation)
        .collect();
    assert_eq!(terminal.len(), 1, "{:?}", updates.seen);
    assert!(
        !updates.seen.iter().any(|u| u.state == TaskState::Lost),
        "{:?}",
        updates.seen
    );
    handle.stop();
    let _ = tokio::time::timeout(T, run).await;
}

/// A kill asked while the master is down (the driver has not noticed yet, so it goes into the
/// dead connection) still ends the task: the SDK driver sends unanswered kills again after it
/// re-subscribes and every `KILL_RETRY` until the task's terminal update arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_asked_while_the_master_is_down_still_kills_the_task() {
    let mut cluster = Cluster::start(&[("mr-kill1", "cpus:4;mem:1024")]).unwrap();
    let t = task("killed-across-a-restart", "sleep 600", "cpus:1;mem:64");
    let config = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "restart-kill-fw",
        vec!["batch".into()],
    );
    let (mut updates, handle, run) = start_recorder(config, vec![t.clone()]);
    updates
        .wait(t.task_id, TaskState::Running, T)
        .await
        .unwrap();
    cluster.master.proc.kill9();
    handle.kill(t.task_id);
    cluster.master.restart().unwrap();
    if let Err(e) = updates.wait(t.task_id, TaskState::Killed, T).await {
        cluster.dump_logs();
        panic!("{e}");
    }
    handle.stop();
    let _ = tokio::time::timeout(T, run).await;
}
