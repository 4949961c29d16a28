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
