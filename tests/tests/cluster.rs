//! A whole cluster over real QUIC on loopback: master, two agents, two batch frameworks in
//! different roles.

use std::time::Duration;

use gantry_tests::{assert_finished_once, run_batch, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_frameworks_run_fifty_tasks_each_exactly_once() {
    let cluster = Cluster::start(&[
        ("a1", "cpus:4;mem:4096;disk:1000"),
        ("a2", "cpus:4;mem:4096;disk:1000"),
    ])
    .unwrap();
    let m = cluster.master.quic;
    let tls = cluster.tls_dir.clone();
    let (alpha, beta) = tokio::join!(
        tokio::time::timeout(
            Duration::from_secs(180),
            run_batch(
                m,
                &tls,
                "alpha",
                "analytics",
                50,
                "cpus:0.5;mem:64",
                "sleep 0.2"
            )
        ),
        tokio::time::timeout(
            Duration::from_secs(180),
            run_batch(
                m,
                &tls,
                "beta",
                "training",
                50,
                "cpus:1;mem:32",
                "echo hello; sleep 0.1"
            )
        ),
    );
    let (alpha, beta) = match (alpha, beta) {
        (Ok(Ok(a)), Ok(Ok(b))) => (a, b),
        other => {
            cluster.dump_logs();
            panic!("batch frameworks did not finish: {other:?}");
        }
    };
    for (name, p) in [("alpha", &alpha), ("beta", &beta)] {
        assert_finished_once(name, p, 50);
    }
    // Every resource is free again, and /state agrees.
    let state = cluster
        .master
        .wait_state(Duration::from_secs(20), "all resources free", |s| {
            s["tasks"].as_array().is_some_and(|t| t.is_empty())
                && s["offers"].as_array().is_some_and(|o| o.is_empty())
                && s["agents"].as_array().is_some_and(|a| {
                    a.iter()
                        .all(|a| a["used"].as_object().is_some_and(|u| u.is_empty()))
                })
        })
        .unwrap();
    // Every task finished once; the only other records are of accepts that raced and were
    // DROPPED (nothing of them ran; batch launched them again).
    let completed = state["completed_tasks"].as_array().unwrap();
    let finished = completed
        .iter()
        .filter(|t| t["state"] == "FINISHED")
        .count();
    assert_eq!(finished, 100, "{completed:?}");
    assert!(
        completed
            .iter()
            .all(|t| t["state"] == "FINISHED" || t["state"] == "DROPPED"),
        "{completed:?}"
    );
    assert_eq!(
        state["frameworks"].as_array().unwrap().len(),
        0,
        "both frameworks tore down"
    );
    // Sandboxes captured the tasks' output.
    let sandboxes = cluster
        .agents
        .iter()
        .flat_map(|a| {
            std::fs::read_dir(a.work_dir.join("sandboxes"))
                .unwrap()
                .flatten()
        })
        .collect::<Vec<_>>();
    assert_eq!(sandboxes.len(), 100);
    let hellos = sandboxes
        .iter()
        .filter(|d| {
            std::fs::read_to_string(d.path().join("stdout")).unwrap_or_default() == "hello\n"
        })
        .count();
    assert_eq!(hellos, 50);
}
