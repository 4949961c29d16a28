//! The `sweep` example (issue 29) on a real cluster: one agent with four stand-in GPUs and
//! cgroups. Twelve one-GPU trials, three of which (TRIAL 0, 4, 8) fail on their first attempt
//! and are retried after a timer's backoff; then an evaluation group of 2 tasks x 2 GPUs on
//! the agent, launched atomically, that stops together (member 0 finishes, member 1 is killed
//! for it).
//!
//! One test in this binary: the stand-in's configuration path is a process-wide variable.

use std::time::Duration;

use gantry_examples::sweep::{Sweep, SweepSpec};
use gantry_sdk::attempts::RetryPolicy;
use gantry_sdk::protocol::{CommandInfo, TaskState};
use gantry_tests::{cgroups_available, standin_lib, CgroupRoot, Cluster, Standin, TempDir};

const T: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_retries_failed_trials_then_runs_its_evaluation_group() {
    if !cgroups_available("sweep") {
        return;
    }
    let scratch = TempDir::new("gantry-sweep").unwrap();
    let _standin = Standin::four_gpus(scratch.path()).unwrap();
    let root = CgroupRoot::new("sweep");
    let lib = standin_lib();
    let cluster = Cluster::start_with(
        &[("sweep-0", "cpus:4;mem:4096")],
        &[],
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--cgroup-root",
            &root.name,
        ],
    )
    .unwrap();
    let spec = SweepSpec {
        name: "sweep".into(),
        trials: 12,
        trial_command: CommandInfo::shell(
            "if [ \"$ATTEMPT\" = 1 ] && [ $((TRIAL % 4)) = 0 ]; then exit 3; fi; sleep 0.3",
        ),
        trial_resources: "cpus:0.1;mem:32;gpus:1".parse().unwrap(),
        retry: RetryPolicy::new(2, Duration::from_millis(200), Duration::from_secs(2)),
        eval_members: 2,
        eval_command: CommandInfo::shell(
            "if [ \"$GANTRY_GROUP_INDEX\" = 0 ]; then sleep 1; else sleep 600; fi",
        ),
        eval_resources: "cpus:0.1;mem:32;gpus:2".parse().unwrap(),
    };
    let (sweep, progress) = Sweep::new(spec);
    let driver = gantry_sdk::Driver::new(cluster.gpu_framework_config("sweep", &["ml"]));
    let run = tokio::time::timeout(T, driver.run(sweep)).await;
    let p = progress.borrow().clone();
    if !matches!(run, Ok(Ok(()))) || !p.done {
        cluster.dump_logs();
        panic!("the sweep did not end: {run:?}; {p:#?}");
    }
    // 12 first attempts and 3 counted retries; an attempt that ended in a way that never
    // counts (a dropped launch, say) is relaunched on top, and said so.
    assert_eq!(
        (p.trials_succeeded, p.trials_given_up, p.retries),
        (12, 0, 3),
        "{p:#?}"
    );
    assert_eq!(p.attempts, 15 + p.relaunches.len() as u32, "{p:#?}");
    eprintln!("relaunches: {:?}", p.relaunches);
    // The evaluation: both members ended, member 0 finished and member 1 was stopped with it.
    assert_eq!(p.eval_tasks.len(), 2);
    let state_of = |i: usize| {
        p.eval_ended
            .iter()
            .find(|e| e.0 == p.eval_tasks[i])
            .map(|e| (e.1, e.2.clone()))
    };
    assert_eq!(
        state_of(0).map(|s| s.0),
        Some(TaskState::Finished),
        "{p:#?}"
    );
    let (state, message) = state_of(1).expect("member 1 ended");
    assert_eq!(state, TaskState::Killed, "{message}");
    assert!(message.contains("FINISHED"), "{message}");
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    // An accept that raced its offer's end (rescinded, or pooled into another accept on the
    // agent) is refused, and its tasks come back DROPPED and were relaunched above.
    if p.stale_offers > 0 {
        assert!(
            p.relaunches.iter().any(|r| r.starts_with("DROPPED")),
            "{p:#?}"
        );
    }
}
