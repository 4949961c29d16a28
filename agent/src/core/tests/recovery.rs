//! Recovery in the core: a restarted agent re-adopts live tasks, settles dead ones and fails
//! the ones it never launched.

use super::*;

#[test]
fn recovery_readopts_live_tasks_settles_dead_ones_and_fails_unlaunched_ones() {
    let (alive, a) = checkpointed(TaskState::Running, Some(launched(10)), vec![]);
    let (dead, d) = checkpointed(TaskState::Running, Some(launched(20)), vec![]);
    let (never, n) = checkpointed(TaskState::Staging, None, vec![]);
    let (found, f) = checkpointed(TaskState::Starting, None, vec![]);
    let (ended, e) = checkpointed(TaskState::Finished, Some(launched(40)), vec![]);
    let mut ckpt = Checkpoint::default();
    for (id, rec) in [(alive, a), (dead, d), (never, n), (found, f), (ended, e)] {
        ckpt.tasks.insert(id, rec);
    }
    let mut c = AgentCore::new(config(0), ckpt, T0, Instant::now());
    let probe = RecoveryProbe {
        found: vec![(found, launched(30))],
        alive: vec![alive, found],
        exited: vec![(dead, Some(exit(3)))],
    };
    let fx = c.recover(probe, T0);
    // Live supervisors: their cgroups are reopened and they are polled.
    for id in [alive, found] {
        assert!(fx
            .iter()
            .any(|e| matches!(e, Effect::AdoptCgroup { task, .. } if *task == id)));
    }
    let mut polled: Vec<TaskId> = c.adopted_live().into_iter().map(|(id, _)| id).collect();
    polled.sort();
    let mut want = vec![alive, found];
    want.sort();
    assert_eq!(polled, want);
    // The found launch is recorded and RUNNING.
    let rec = &c.checkpoint().tasks[&found];
    assert_eq!(
        (rec.state, rec.launched),
        (TaskState::Running, Some(launched(30)))
    );
    // The dead supervisor's task is settled with the status it recorded.
    assert!(fx.iter().any(
        |e| matches!(e, Effect::Settle { task, status, .. } if *task == dead && status.code == Some(3))
    ));
    // The task never launched failed with the previous agent.
    let rec = &c.checkpoint().tasks[&never];
    assert_eq!(rec.state, TaskState::Failed);
    let q = c.checkpoint().updates.all();
    assert!(q
        .iter()
        .any(|u| u.task_id == never && u.reason == Some(TaskReason::AgentRestarted)));
    // The finished task is left alone.
    assert!(!fx
        .iter()
        .any(|e| matches!(e, Effect::Settle { task, .. } if *task == ended)));
    // Settling the dead one reports its failure.
    let fx = step(
        &mut c,
        Input::Settled {
            task: dead,
            status: exit(3),
            outcome: CgroupOutcome::default(),
        },
        T0,
    );
    assert!(sent(&fx).is_empty(), "not connected yet");
    assert_eq!(c.checkpoint().tasks[&dead].state, TaskState::Failed);
}

#[test]
fn recovery_takes_a_running_tasks_launch_from_its_record_without_reporting_it_again() {
    // The log holds a RUNNING task without its launch (the record holds that): the probe reads
    // it back and the task is adopted as it was, with no second RUNNING update.
    let (running, r) = checkpointed(TaskState::Running, None, vec![]);
    let (gone, g) = checkpointed(TaskState::Running, None, vec![]);
    let mut ckpt = Checkpoint::default();
    ckpt.tasks.insert(running, r);
    ckpt.tasks.insert(gone, g);
    let mut c = AgentCore::new(config(0), ckpt, T0, Instant::now());
    let probe = RecoveryProbe {
        found: vec![(running, launched(50)), (gone, launched(60))],
        alive: vec![running],
        exited: vec![(gone, Some(exit(0)))],
    };
    let fx = c.recover(probe, T0);
    let rec = &c.checkpoint().tasks[&running];
    assert_eq!(
        (rec.state, rec.launched),
        (TaskState::Running, Some(launched(50)))
    );
    assert_eq!(
        c.adopted_live()
            .into_iter()
            .map(|(id, _)| id)
            .collect::<Vec<_>>(),
        vec![running]
    );
    assert!(
        c.checkpoint().updates.all().is_empty(),
        "nothing new to report"
    );
    // The one whose supervisor is gone is settled from its record's exit.
    assert!(fx.iter().any(
        |e| matches!(e, Effect::Settle { task, status, .. } if *task == gone && status.code == Some(0))
    ));
}
