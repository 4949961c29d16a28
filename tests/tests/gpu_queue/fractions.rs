//! Fractions of a GPU through the queue (a section of `two_large_gangs_submitted_together_both_finish`).

use std::time::{Duration, Instant};

use serde_json::Value;

use super::cluster::*;

/// Half-GPU jobs on the idle cluster: three of team `frac` (quota 1, borrowing limit 0) as an
/// array, with a whole-GPU job of team `a`. Two halves run, sharing one GPU (the same UUID in
/// the master's records and in `CUDA_VISIBLE_DEVICES`, each with the MPS limits of half of it);
/// the third waits at the team's limit (two halves are its one GPU) until one of them ends;
/// the whole-GPU job gets a GPU of its own; a GPU amount of 1.5 is refused.
pub(super) fn fractions_share_a_gpu_and_count_as_fractions(env: &Env) {
    let q = &env.queue;
    let bad = q.cli(&[
        "submit", "--name", "x", "--team", "frac", "--gpus", "1.5", "--", "true",
    ]);
    assert!(
        bad.as_ref().is_err_and(|e| e
            .to_string()
            .contains("gpus must be below 1 (a fraction of one GPU) or a whole number, got 1.5")),
        "{bad:?}"
    );
    let cmd = "echo \"$CUDA_VISIBLE_DEVICES $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT \
               $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\" > gpu-env; sleep 5";
    let out = q
        .cli(&[
            "submit", "--name", "half", "--team", "frac", "--gpus", "0.5", "--cpus", "0.5",
            "--mem", "64", "--array", "0-2", "--", cmd,
        ])
        .unwrap();
    let array: u64 = out.trim().parse().unwrap();
    let whole = q.submit("whole", "a", "normal", 1, "1", "sleep 5");
    // Two halves run; the third waits at the team's limit, saying so.
    let deadline = Instant::now() + Duration::from_secs(60);
    let halves = loop {
        let jobs = q.jobs();
        let halves: Vec<Value> = jobs
            .iter()
            .filter(|j| j["array_job"] == array)
            .cloned()
            .collect();
        let running = halves.iter().filter(|j| j["state"] == "RUNNING").count();
        if running == 2 && halves.iter().any(|j| j["state"] == "PENDING") {
            break halves;
        }
        assert!(
            Instant::now() < deadline,
            "two halves did not start: {}",
            q.cli(&["list"]).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for j in &halves {
        assert_eq!(j["gpus_per_worker"], 0.5, "{j:#}");
    }
    let waiting = halves.iter().find(|j| j["state"] == "PENDING").unwrap();
    assert_eq!(
        waiting["pending_reason"], "team frac at its borrowing limit: 1 GPUs used of 1 + 0",
        "{waiting:#}"
    );
    let table = q.cli(&["show", &array.to_string()]).unwrap();
    assert!(table.contains("0.5"), "{table}");
    // From the master's records: the two running halves hold one GPU between them.
    let state = env.cluster.master.state().unwrap();
    let running: Vec<&Value> = state["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("half[")))
        .collect();
    assert_eq!(running.len(), 2, "{running:#?}");
    let uuid = |t: &Value| -> Vec<String> {
        t["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_str().unwrap().to_string())
            .collect()
    };
    let shared = uuid(running[0]);
    assert_eq!(shared.len(), 1, "{:#}", running[0]);
    assert_eq!(uuid(running[1]), shared, "the halves share one GPU");
    let memory = state["agents"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a["gpus"].as_array().cloned().unwrap_or_default())
        .find(|g| g["uuid"] == shared[0].as_str())
        .and_then(|g| g["memory_mib"].as_u64())
        .unwrap();
    // What each sees: that GPU, half of its memory and of its threads (MPS client limits).
    for t in &running {
        let id = t["id"].as_str().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let seen = loop {
            if let Some(s) = sandbox_file(&env.cluster, id, "gpu-env") {
                break s;
            }
            assert!(Instant::now() < deadline, "{id} wrote no gpu-env");
            std::thread::sleep(Duration::from_millis(100));
        };
        eprintln!("{} sees: {}", t["name"], seen.trim());
        let want = format!("{} 0={}M 50", shared[0], memory / 2);
        assert_eq!(seen.split_whitespace().collect::<Vec<_>>().join(" "), want);
    }
    let jobs = q.wait_all_ended(&env.cluster, Duration::from_secs(60));
    for j in jobs
        .iter()
        .filter(|j| j["array_job"] == array || j["id"] == whole)
    {
        assert_eq!(j["state"], "FINISHED", "{j:#}");
    }
    // The whole-GPU job had a GPU to itself.
    let tasks = master_tasks(&env.cluster);
    let w = tasks.iter().find(|t| t["name"] == "whole/0").unwrap();
    let wg = uuid(w);
    assert_eq!(wg.len(), 1);
    assert_ne!(wg, shared, "a whole GPU is never a shared one");
    // GPU-hours: three halves of about 5 s each are about 7.5 GPU-s.
    let used = q.stats()["gpu_secs"]["frac"].as_f64().unwrap();
    assert!((6.0..15.0).contains(&used), "frac used {used} GPU-s");
}
