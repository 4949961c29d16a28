//! A borrowing limit per GPU model through the queue (a section of
//! `two_large_gangs_submitted_together_both_finish`).

use std::time::{Duration, Instant};

use super::cluster::*;

/// Team `m` (`m=1,A100:1`, `--team-borrow-limit m=A100:1`) submits three 1-GPU A100 jobs on
/// the idle cluster: two run (its A100 quota plus the limit), the third waits saying so and
/// runs once one of them has ended; all three finish, on A100s.
pub(super) fn a_models_borrowing_limit_holds_on_the_cluster(env: &Env) {
    let q = &env.queue;
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            q.submit_with(
                &format!("m{i}"),
                "m",
                "normal",
                1,
                "1",
                "sleep 4",
                &["--gpu-model", "A100"],
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let jobs = q.jobs();
        let mine: Vec<_> = jobs
            .iter()
            .filter(|j| ids.contains(&j["id"].as_u64().unwrap_or(0)))
            .collect();
        let running = mine.iter().filter(|j| j["state"] == "RUNNING").count();
        let waiting = mine.iter().find(|j| j["state"] == "PENDING");
        if running == 2 {
            if let Some(w) = waiting {
                assert_eq!(
                    w["pending_reason"], "team m at its A100 borrowing limit: 2 GPUs used of 1 + 1",
                    "{w:#}"
                );
                break;
            }
        }
        assert!(
            running <= 2,
            "three ran at once: {}",
            q.cli(&["list"]).unwrap_or_default()
        );
        assert!(
            Instant::now() < deadline,
            "two did not start: {}",
            q.cli(&["list"]).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let jobs = q.wait_all_ended(&env.cluster, Duration::from_secs(60));
    for j in jobs
        .iter()
        .filter(|j| ids.contains(&j["id"].as_u64().unwrap_or(0)))
    {
        assert_eq!(j["state"], "FINISHED", "{j:#}");
    }
    // From the master's records: the third was staged after one of the first two ended, and
    // every one ran on an A100 (the stand-in's first four GPUs of an agent).
    let tasks = master_tasks(&env.cluster);
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for i in 0..3 {
        let t = tasks
            .iter()
            .find(|t| t["name"] == format!("m{i}/0"))
            .unwrap_or_else(|| panic!("m{i}/0 not in the master's records"));
        for g in t["gpus"].as_array().unwrap() {
            let g = g.as_str().unwrap_or("");
            let index = u64::from_str_radix(g.rsplit('-').next().unwrap_or(""), 16);
            assert!(index.is_ok_and(|i| i < 4), "m{i} on {g}");
        }
        spans.push((
            t["staged_at_ms"].as_u64().unwrap(),
            t["ended_at_ms"].as_u64().unwrap(),
        ));
    }
    spans.sort();
    assert!(
        spans[2].0 >= spans[0].1.min(spans[1].1),
        "the third started before either of the first two ended: {spans:?}"
    );
}
