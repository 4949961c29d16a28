//! The simulator's bookkeeping on tiny traces whose outcome is worked out by hand.

use super::baseline::{place, Baseline};
use super::report::{gang_fits, quantile, Outcome};
use super::trace::{from_openb, parse_cluster, parse_trace, write_trace};
use super::*;

fn opts(grace: u32) -> SimOptions {
    SimOptions {
        grace_secs: grace,
        tick: 5.0,
        buckets: 2,
        ..SimOptions::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn the_trace_format_reads_and_writes_back() {
    let text = "# a comment\n\
        submit_s,team,priority,workers,gpus_per_worker,duration_s,time_limit_s,deadline_s,user,name\n\
        30,nlp,preemptible,1,1,600\n\
        0,vision,high,2,8,3600,7200,4000,alice,resnet\n";
    let jobs = parse_trace(text).unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[0].name, "resnet", "sorted by submission");
    assert_eq!(jobs[0].total_gpus(), 16);
    assert_eq!(jobs[0].time_limit, Some(7200.0));
    assert_eq!(jobs[0].deadline, Some(4000.0));
    assert_eq!(jobs[1].user, "sim");
    assert_eq!(jobs[1].name, "job-3");
    assert_eq!(jobs[1].time_limit, None);
    assert_eq!(parse_trace(&write_trace(&jobs)).unwrap(), jobs);
    for bad in [
        "0,t,normal,0,1,10",
        "0,t,urgent,1,1,10",
        "x,t,normal,1,1,10",
        "0,t,normal,1,1",
        "0,t,normal,1,1,-5",
        "0,,normal,1,1,10",
        "0,t,normal,1,1,10,0",
    ] {
        let e = parse_trace(bad).unwrap_err().to_string();
        assert!(e.starts_with("trace line 1:"), "{bad}: {e}");
    }
}

#[test]
fn cluster_specs_read_from_the_short_form_and_toml() {
    let g = parse_cluster("4x8:A100, 2x8:H100").unwrap();
    assert_eq!(g.len(), 2);
    assert_eq!((g[0].count, g[0].gpus, g[0].model.as_str()), (4, 8, "A100"));
    assert_eq!(g[1].cpus(), 64.0);
    let t = parse_cluster("[[agents]]\ncount = 3\ngpus = 4\nmodel = \"L4\"\ncpus = 32\n").unwrap();
    assert_eq!((t[0].count, t[0].gpus, t[0].cpus()), (3, 4, 32.0));
    for bad in ["", "4:A100", "ax8", "0x8", "1x65"] {
        assert!(parse_cluster(bad).is_err(), "{bad}");
    }
}

#[test]
fn openb_pods_become_one_worker_jobs() {
    let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
        p0,1000,1024,0,0,,LS,Running,0,100,0\n\
        p1,1000,1024,2,1000,,BE,Running,50,3650,60\n\
        p2,1000,1024,1,460,,LS,Running,10,20,10\n\
        p3,1000,1024,1,1000,,LS,Pending,10,20,\n";
    let jobs = from_openb(text, 1.0, 2.0).unwrap();
    assert_eq!(
        jobs.len(),
        2,
        "CPU-only and never-scheduled pods are left out"
    );
    assert_eq!(
        (jobs[0].name.as_str(), jobs[0].gpus, jobs[0].duration),
        ("p2", 1, 10.0)
    );
    assert_eq!(
        jobs[0].time_limit,
        Some(3600.0),
        "2 × 10 s rounded up to an hour"
    );
    assert_eq!(
        (jobs[1].team.as_str(), jobs[1].priority),
        ("be", Priority::Preemptible)
    );
    assert_eq!((jobs[1].submit, jobs[1].duration), (50.0, 3590.0));
    assert_eq!(jobs[1].time_limit, Some(2.0 * 3600.0));
    assert!(from_openb("name,num_gpu\n", 1.0, 0.0).is_err());
}

use crate::model::Priority;

#[test]
fn helpers_place_best_fit_and_count_quantiles() {
    assert_eq!(place(&[8, 4, 2], 2, 2), Some(vec![2, 1]));
    assert_eq!(place(&[8, 4], 3, 4), Some(vec![1, 0, 0]));
    assert_eq!(place(&[8, 4], 2, 8), None);
    assert!(gang_fits(&[3, 4], 2, 2));
    assert!(!gang_fits(&[3, 1], 2, 2));
    assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
    assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.99), 4.0);
}

/// One 8-GPU agent; a whole-agent job, then a 4-GPU job that waits for it.
#[test]
fn the_queue_on_one_agent_matches_the_hand_computed_outcome() {
    let trace = parse_trace("0,x,normal,1,8,100\n10,y,normal,1,4,50\n").unwrap();
    let cluster = parse_cluster("1x8").unwrap();
    let r = simulate(Policy::Queue, &trace, &cluster, &opts(5));
    assert_eq!((r.finished, r.unfinished), (2, 0), "{}", r.text());
    // a: 0..100; b: waits 90, runs 100..150.
    assert!(close(r.wait.mean, 45.0), "{}", r.text());
    assert!(close(r.wait.p99, 90.0), "{}", r.text());
    assert!(close(r.jct.mean, 120.0), "{}", r.text());
    assert!(close(r.makespan, 150.0), "{}", r.text());
    // (8 × 100 + 4 × 50) / (8 × 150)
    assert!(close(r.gpu_utilization, 1000.0 / 1200.0), "{}", r.text());
    assert!(close(r.idle_while_eligible_gpu_secs, 0.0), "{}", r.text());
    assert_eq!(r.preemptions, 0);
    // Shares: 0..75 x holds all 8; 75..150: x 25 s of 8, y 50 s of 4.
    assert_eq!(r.team_share.len(), 2);
    assert!(close(r.team_share[0].share["x"], 1.0));
    assert!(close(r.team_share[1].share["x"], 8.0 * 25.0 / (8.0 * 75.0)));
    assert!(close(r.team_share[1].share["y"], 4.0 * 50.0 / (8.0 * 75.0)));
}

/// A time limit kills the job at the limit; it ends a grace period later.
#[test]
fn the_queue_kills_at_the_time_limit_after_grace() {
    let trace = parse_trace("0,x,normal,1,8,100,50\n1,x,normal,1,8,10\n").unwrap();
    let cluster = parse_cluster("1x8").unwrap();
    let r = simulate(Policy::Queue, &trace, &cluster, &opts(30));
    assert_eq!((r.finished, r.time_limited), (1, 1), "{}", r.text());
    // First: killed at 50, ends at 80; second: waits 79, runs 80..90.
    assert!(close(r.makespan, 90.0), "{}", r.text());
    assert!(close(r.wait.p99, 79.0), "{}", r.text());
    assert!(close(r.jct.mean, 89.0), "{}", r.text());
}

/// A critical job preempts a preemptible one, which resumes from where it was.
#[test]
fn the_queue_preempts_with_grace_and_the_victim_resumes() {
    let trace =
        parse_trace("0,x,preemptible,1,8,100,,,,victim\n10,y,critical,1,8,20,,30,,urgent\n")
            .unwrap();
    let cluster = parse_cluster("1x8").unwrap();
    let r = simulate(Policy::Queue, &trace, &cluster, &opts(5));
    assert_eq!((r.finished, r.preemptions), (2, 1), "{}", r.text());
    // The victim is warned at 10 and ends at 15; the critical job runs 15..35 (its deadline
    // 30 is missed); the victim resumes at 35 with 85 s of work left: ends at 120.
    assert_eq!((r.deadlines, r.deadline_misses), (1, 1), "{}", r.text());
    assert!(close(r.makespan, 120.0), "{}", r.text());
    assert!(close(r.jct.p50, 25.0), "{}", r.text());
    assert!(close(r.jct.p99, 120.0), "{}", r.text());
    assert!(close(r.wait.mean, 2.5), "{}", r.text());
}

/// FIFO blocks behind a gang; EASY backfills a job that ends before the gang's reservation.
#[test]
fn fifo_blocks_and_easy_backfills() {
    let trace = parse_trace("0,x,normal,1,4,100,100\n1,x,normal,1,8,10,10\n2,y,normal,1,4,50,50\n")
        .unwrap();
    let cluster = parse_cluster("1x8").unwrap();
    let fifo = simulate(Policy::Baseline(Baseline::Fifo), &trace, &cluster, &opts(5));
    let easy = simulate(Policy::Baseline(Baseline::Easy), &trace, &cluster, &opts(5));
    assert_eq!((fifo.finished, easy.finished), (3, 3));
    // FIFO: waits 0, 99, 108; 4 GPUs idle from 2 to 100 while the 4-GPU job fits.
    assert!(close(fifo.wait.mean, 207.0 / 3.0), "{}", fifo.text());
    assert!(
        close(fifo.idle_while_eligible_gpu_secs, 4.0 * 98.0),
        "{}",
        fifo.text()
    );
    assert!(close(fifo.makespan, 160.0), "{}", fifo.text());
    // EASY: the 4-GPU job ends by 52 ≤ 100 (the gang's reservation): waits 0, 99, 0.
    assert!(close(easy.wait.mean, 33.0), "{}", easy.text());
    assert!(
        close(easy.idle_while_eligible_gpu_secs, 0.0),
        "{}",
        easy.text()
    );
    assert!(close(easy.makespan, 110.0), "{}", easy.text());
    assert_eq!(easy.reserved_idle_gpu_secs, None);
    assert!(matches!(Outcome::Finished, Outcome::Finished));
}

/// A job killed at its limit counts as time-limited in the baselines too.
#[test]
fn baselines_enforce_time_limits() {
    let trace = parse_trace("0,x,normal,1,8,100,50\n").unwrap();
    let cluster = parse_cluster("1x8").unwrap();
    let r = simulate(
        Policy::Baseline(Baseline::Fifo),
        &trace,
        &cluster,
        &opts(30),
    );
    assert_eq!(r.time_limited, 1);
    assert!(close(r.makespan, 80.0), "{}", r.text());
}
