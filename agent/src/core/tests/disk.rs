//! Disk limits: sandboxes of tasks with a `disk` measured every `--disk-watch-interval`, one
//! pass at a time; a task past its limit is killed and ends FAILED `disk-limit` (even if it
//! then exits 0); within it, or without a `disk`, or with `--disk-enforcement none`, nothing.

use super::*;
use crate::disk::{DiskEnforcement, DiskReading};

const MIB: u64 = 1024 * 1024;

fn measured(fx: &[Effect]) -> Option<Vec<(TaskId, PathBuf)>> {
    fx.iter().find_map(|e| match e {
        Effect::MeasureDisk(tasks) => Some(tasks.clone()),
        _ => None,
    })
}

fn reading(bytes: u64, complete: bool) -> DiskReading {
    DiskReading {
        bytes,
        complete,
        too_deep: false,
    }
}

#[test]
fn a_task_past_its_disk_is_killed_and_fails_with_disk_limit() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let limited = task(";disk:10");
    let unlimited = task("");
    let (id, free) = (limited.task_id, unlimited.task_id);
    start(&mut c, fw, limited, 100);
    start(&mut c, fw, unlimited, 200);
    assert!(measured(&step(&mut c, Input::Tick, T0 + 4_999)).is_none());
    let tasks = measured(&step(&mut c, Input::Tick, T0 + 5_000)).expect("due");
    // Only the task with a disk; its sandbox.
    assert_eq!(
        tasks,
        vec![(id, PathBuf::from(format!("/work/sandboxes/{id}")))]
    );
    // One pass at a time.
    assert!(measured(&step(&mut c, Input::Tick, T0 + 20_000)).is_none());
    // Within the limit (exactly at it, or an unfinished walk below it): nothing happens.
    let fx = step(
        &mut c,
        Input::DiskMeasured(vec![(id, reading(10 * MIB, true))]),
        T0 + 20_100,
    );
    assert!(signals(&fx).is_empty() && updates(&fx).is_empty());
    // The next pass is an interval after the last one ended.
    assert!(measured(&step(&mut c, Input::Tick, T0 + 25_000)).is_none());
    assert!(measured(&step(&mut c, Input::Tick, T0 + 25_100)).is_some());
    let fx = step(
        &mut c,
        Input::DiskMeasured(vec![(id, reading(3 * MIB, false))]),
        T0 + 25_200,
    );
    assert!(signals(&fx).is_empty() && updates(&fx).is_empty());
    // Past it (a reading of the unlimited task, were there one, changes nothing).
    assert!(measured(&step(&mut c, Input::Tick, T0 + 30_200)).is_some());
    let fx = step(
        &mut c,
        Input::DiskMeasured(vec![
            (id, reading(64 * MIB, true)),
            (free, reading(1 << 40, true)),
        ]),
        T0 + 30_300,
    );
    assert_eq!(signals(&fx), vec![(100, libc::SIGTERM)]);
    assert!(updates(&fx).is_empty(), "the update comes when it ended");
    // Being killed, it is not measured again (and nothing else has a disk).
    assert!(measured(&step(&mut c, Input::Tick, T0 + 40_000)).is_none());
    // Escalation as for any kill.
    let fx = step(&mut c, Input::Tick, T0 + 34_000);
    assert!(signals(&fx).contains(&(100, libc::SIGKILL)), "{fx:?}");
    // It exits 0 after the SIGTERM: FAILED disk-limit all the same.
    step(
        &mut c,
        Input::Exited {
            task: id,
            status: exit(0),
            outcome: None,
        },
        T0 + 41_000,
    );
    let fx = step(
        &mut c,
        Input::Settled {
            task: id,
            status: exit(0),
            outcome: CgroupOutcome::default(),
        },
        T0 + 41_000,
    );
    let u = &updates(&fx)[0];
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Failed, Some(TaskReason::DiskLimit))
    );
    assert!(
        u.message
            .starts_with("disk-limit: the task used 64.0 MiB of its disk limit of 10 MiB"),
        "{}",
        u.message
    );
    // The unlimited task ran on.
    assert_eq!(c.checkpoint().tasks[&free].state, TaskState::Running);
    assert_eq!(c.checkpoint().tasks[&free].kill_requested_ms, None);
}

#[test]
fn readings_of_tasks_that_ended_meanwhile_are_ignored() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let t = task(";disk:1");
    let id = t.task_id;
    start(&mut c, fw, t, 100);
    assert!(measured(&step(&mut c, Input::Tick, T0 + 5_000)).is_some());
    step(
        &mut c,
        Input::Exited {
            task: id,
            status: exit(0),
            outcome: None,
        },
        T0 + 5_100,
    );
    let fx = step(
        &mut c,
        Input::DiskMeasured(vec![(id, reading(64 * MIB, true))]),
        T0 + 5_200,
    );
    assert!(signals(&fx).is_empty(), "settling: not killed");
    let fx = step(
        &mut c,
        Input::Settled {
            task: id,
            status: exit(0),
            outcome: CgroupOutcome::default(),
        },
        T0 + 5_300,
    );
    assert_eq!(updates(&fx)[0].state, TaskState::Finished);
    let fx = step(
        &mut c,
        Input::DiskMeasured(vec![(id, reading(64 * MIB, true))]),
        T0 + 5_400,
    );
    assert!(signals(&fx).is_empty() && updates(&fx).is_empty());
}

#[test]
fn with_enforcement_none_sandboxes_are_not_measured() {
    let mut cfg = config(0);
    cfg.disk_enforcement = DiskEnforcement::None;
    let mut c = AgentCore::new(cfg, Checkpoint::default(), T0, Instant::now());
    register(&mut c);
    c.flush(T0);
    start(&mut c, FrameworkId::random(), task(";disk:1"), 100);
    for s in 1..10 {
        assert!(measured(&step(&mut c, Input::Tick, T0 + s * 5_000)).is_none());
    }
}

#[derive(Debug, Clone)]
enum WatchStep {
    /// A task: 0 no limit, 1 a disk limit, 2 half a GPU, 3 both.
    Start(u8),
    Kill(usize),
    Tick(u64),
    Exit(usize),
    Measured,
    AckAll,
}

fn watch_step() -> impl proptest::strategy::Strategy<Value = WatchStep> {
    use proptest::prelude::*;
    prop_oneof![
        (0u8..4).prop_map(WatchStep::Start),
        (0usize..8).prop_map(WatchStep::Kill),
        (1u64..7000).prop_map(WatchStep::Tick),
        (0usize..8).prop_map(WatchStep::Exit),
        Just(WatchStep::Measured),
        Just(WatchStep::AckAll),
    ]
}

proptest::proptest! {
    /// The index of watched limits (disk, fractional GPU) equals a scan of every task after
    /// every step of any run (tasks with and without limits started, killed, ended, measured,
    /// acknowledged and forgotten), and so do the disk deadline and the shared GPUs the MPS
    /// deadline reads; a core rebuilt from the checkpoint agrees too.
    #[test]
    fn the_watched_index_gives_what_a_scan_of_every_task_gives(
        steps in proptest::collection::vec(watch_step(), 1..60)
    ) {
        let mut c = registered(2);
        let fw = FrameworkId::random();
        let mut ids: Vec<TaskId> = Vec::new();
        let mut now = T0;
        for s in steps {
            match s {
                WatchStep::Start(kind) => {
                    let t = task(match kind {
                        0 => "",
                        1 => ";disk:10",
                        2 => ";gpus:0.5",
                        _ => ";gpus:0.5;disk:10",
                    });
                    ids.push(t.task_id);
                    let id = t.task_id;
                    step(&mut c, run_task(fw, t), now);
                    step(&mut c, Input::Launched { task: id, result: Ok(launched(100 + ids.len() as i32)) }, now);
                }
                WatchStep::Kill(i) => {
                    let task_id = ids.get(i).copied().unwrap_or_else(TaskId::random);
                    step(&mut c, Input::Master(MasterToAgent::KillTask { framework_id: fw, task_id }), now);
                }
                WatchStep::Tick(ms) => {
                    now += ms;
                    step(&mut c, Input::Tick, now);
                }
                WatchStep::Exit(i) => {
                    if let Some(&task) = ids.get(i) {
                        step(&mut c, Input::Exited { task, status: exit(0), outcome: Some(CgroupOutcome::default()) }, now);
                    }
                }
                WatchStep::Measured => {
                    let readings = ids.iter().map(|id| (*id, reading(MIB, true))).collect();
                    step(&mut c, Input::DiskMeasured(readings), now);
                }
                WatchStep::AckAll => {
                    let acks: Vec<Input> = c
                        .checkpoint()
                        .updates
                        .in_window()
                        .into_iter()
                        .map(|u| Input::Master(MasterToAgent::Acknowledge { task_id: u.task_id, update_id: u.update_id }))
                        .collect();
                    for a in acks {
                        step(&mut c, a, now);
                    }
                }
            }
            c.flush(now);
            let (index, scan) = c.watched_index();
            proptest::prop_assert_eq!(index, &scan);
            proptest::prop_assert_eq!(c.disk_deadline(), c.disk_deadline_scan());
            let (mut a, mut b) = (c.shared_gpus(), c.shared_gpus_scan());
            a.sort();
            b.sort();
            proptest::prop_assert_eq!(a, b);
        }
        let rebuilt = AgentCore::new(config(2), c.checkpoint().clone(), now, Instant::now());
        proptest::prop_assert_eq!(rebuilt.disk_deadline(), rebuilt.disk_deadline_scan());
        let (index, scan) = rebuilt.watched_index();
        proptest::prop_assert_eq!(index, &scan);
    }
}
