//! Task records an operator can use (issue 11): `/state` keeps, for running and completed
//! tasks, name, framework, agent, role, user, resources, GPUs, state, reason and message, exit
//! code or signal, and the staged / started / ended times; the history is bounded per framework
//! (`--max-completed-tasks-per-framework`) and by completed frameworks
//! (`--max-completed-frameworks`), oldest dropped first.

use std::time::Duration;

use gantry_tests::{assert_finished_once, run_batch, Cluster};

const T: Duration = Duration::from_secs(120);

fn of_framework<'a>(state: &'a serde_json::Value, fw: &str) -> Vec<&'a serde_json::Value> {
    state["completed_tasks"]
        .as_array()
        .map(|c| c.iter().filter(|t| t["framework_id"] == fw).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_tasks_are_recorded_and_bounded() {
    let cluster = Cluster::start_with(
        &[("rec1", "cpus:4;mem:1024")],
        &[
            "--max-completed-tasks-per-framework",
            "3",
            "--max-completed-frameworks",
            "1",
        ],
        &[],
    )
    .unwrap();
    let m = cluster.master.quic;
    let tls = cluster.tls_dir.clone();
    let first = tokio::time::timeout(
        T,
        run_batch(m, &tls, "first", "records", 5, "cpus:1;mem:32", "sleep 0.1"),
    )
    .await
    .unwrap()
    .unwrap();
    assert_finished_once("first", &first, 5);
    let state = cluster
        .master
        .wait_state(T, "first torn down", |s| {
            s["completed_frameworks"]
                .as_array()
                .is_some_and(|f| f.len() == 1)
        })
        .unwrap();
    let fw = state["completed_frameworks"][0]["id"].as_str().unwrap();
    assert_eq!(state["completed_frameworks"][0]["name"], "first");
    assert_eq!(
        state["completed_frameworks"][0]["reason"],
        "framework tore down"
    );
    let agent = state["agents"][0]["id"].clone();
    // Five ran; the three newest are kept.
    let kept = of_framework(&state, fw);
    assert_eq!(kept.len(), 3, "{state:#}");
    let mut names: Vec<&str> = kept.iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3, "{names:?}");
    for t in &kept {
        assert_eq!(t["state"], "FINISHED", "{t:#}");
        assert_eq!(t["exit_code"], 0, "{t:#}");
        assert_eq!(t["agent_id"], agent, "{t:#}");
        assert_eq!(t["role"], "records", "{t:#}");
        // The agent's default task user: nobody for a root agent.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!(t["user"], "nobody", "{t:#}");
        }
        assert_eq!(t["resources"]["cpus"], 1.0, "{t:#}");
        assert!(t["reason"].is_null(), "{t:#}");
        let staged = t["staged_at_ms"].as_u64().unwrap();
        let started = t["started_at_ms"].as_u64().unwrap();
        let ended = t["ended_at_ms"].as_u64().unwrap();
        assert!(staged <= started && started <= ended, "{t:#}");
    }

    // A second framework completes: the first one and its history are dropped.
    let second = tokio::time::timeout(
        T,
        run_batch(
            m,
            &tls,
            "second",
            "records",
            2,
            "cpus:1;mem:32",
            "echo no >&2; exit 3",
        ),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!((second.finished, second.failed), (0, 2));
    let state = cluster
        .master
        .wait_state(T, "second torn down", |s| {
            s["completed_frameworks"]
                .as_array()
                .is_some_and(|f| f.len() == 1 && f[0]["name"] == "second")
        })
        .unwrap();
    assert!(of_framework(&state, fw).is_empty(), "{state:#}");
    let failed = state["completed_tasks"].as_array().unwrap();
    assert_eq!(failed.len(), 2, "{state:#}");
    for t in failed {
        assert_eq!(t["state"], "FAILED", "{t:#}");
        assert_eq!(t["reason"], "command-failed", "{t:#}");
        assert_eq!(t["message"], "exited with code 3", "{t:#}");
        assert_eq!(t["exit_code"], 3, "{t:#}");
        assert!(t["signal"].is_null(), "{t:#}");
    }
}
