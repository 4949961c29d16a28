//! The batching decision (group commit): however many tasks' inputs a batch holds, it ends in
//! one commit, synced only when something leaves the agent.

use super::*;

/// Handles `inputs` as one batch (the runtime's loop: every waiting input, then one commit).
fn batch(c: &mut AgentCore, inputs: Vec<Input>, now: u64) -> (Vec<Effect>, Commit) {
    let mut fx = Vec::new();
    for input in inputs {
        fx.extend(c.handle(input, now));
    }
    let (last, commit) = c.end_batch(now);
    fx.extend(last);
    (fx, commit)
}

fn launches(fx: &[Effect]) -> usize {
    fx.iter().filter(|e| matches!(e, Effect::Launch(_))).count()
}

#[test]
fn a_burst_of_tasks_costs_one_sync_per_step_and_acknowledgements_none() {
    let mut c = core(0);
    c.config.isolated = false; // `--isolation none`: an exit settles in its own batch
    register(&mut c);
    assert_eq!(c.end_batch(T0).1, Commit::Sync, "the registration is sent");
    let fw = FrameworkId::random();
    let tasks: Vec<TaskInfo> = (0..64).map(|_| task("")).collect();

    // 64 launches in one batch: 64 launches and STARTING updates, one synced commit.
    let (fx, commit) = batch(
        &mut c,
        tasks.iter().map(|t| run_task(fw, t.clone())).collect(),
        T0,
    );
    assert_eq!(commit, Commit::Sync);
    assert_eq!(launches(&fx), 64);
    assert_eq!(sent(&fx).len(), 64);

    // Their starts and exits arrive together: RUNNING and FINISHED of all 64, one sync, and
    // no round trip to settle a task without a cgroup.
    let mut inputs = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        inputs.push(Input::Launched {
            task: t.task_id,
            result: Ok(launched(1000 + 2 * i as i32)),
        });
        inputs.push(Input::Exited {
            task: t.task_id,
            status: exit(0),
            outcome: None,
        });
    }
    let (fx, commit) = batch(&mut c, inputs, T0 + 5);
    assert_eq!(commit, Commit::Sync);
    assert!(!fx.iter().any(|e| matches!(e, Effect::Settle { .. })));
    let states: Vec<TaskState> = sent(&fx).iter().map(|u| u.state).collect();
    assert_eq!(states.len(), 128);
    assert_eq!(
        states.iter().filter(|s| **s == TaskState::Finished).count(),
        64
    );
    // Each task's record is logged once per batch, whatever it went through in it.
    let records = fx
        .iter()
        .filter(|e| matches!(e, Effect::Persist(crate::wal::Record::Task(_))))
        .count();
    assert_eq!(records, 64);

    // The master acknowledges everything: records only (written, not synced), nothing sent.
    let mut acks = Vec::new();
    for u in c.checkpoint().updates.in_window() {
        acks.push(Input::Master(MasterToAgent::Acknowledge {
            task_id: u.task_id,
            update_id: u.update_id,
        }));
    }
    assert_eq!(acks.len(), 192);
    let (fx, commit) = batch(&mut c, acks, T0 + 10);
    assert_eq!(commit, Commit::Write);
    assert!(sent(&fx).is_empty());
    assert!(c.checkpoint().tasks.is_empty(), "every task forgotten");

    // A batch that changes nothing commits nothing.
    assert_eq!(batch(&mut c, Vec::new(), T0 + 11).1, Commit::None);
}

#[test]
fn an_isolated_task_settles_its_cgroup_before_it_is_terminal() {
    // (The default test agent is isolated: the exit asks for the cgroup's outcome first.)
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let t = task("");
    let id = t.task_id;
    start(&mut c, fw, t, 100);
    let (fx, commit) = batch(
        &mut c,
        vec![Input::Exited {
            task: id,
            status: exit(0),
            outcome: None,
        }],
        T0 + 1,
    );
    assert!(matches!(fx.as_slice(), [Effect::Settle { task, .. }] if *task == id));
    assert_eq!(
        commit,
        Commit::None,
        "nothing changed or sent until it is settled"
    );
}

/// With its cgroup's outcome read where the exit was learned, an isolated task's end is one
/// input: it is terminal in that batch (its final usage and terminal update in one synced
/// commit), and its cgroup is released only after that commit; an OOM kill in the outcome
/// still makes it FAILED.
#[test]
fn an_exit_with_its_cgroups_outcome_settles_in_one_batch_and_releases_after_the_commit() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let (t1, t2) = (task(""), task(""));
    let (id1, id2) = (t1.task_id, t2.task_id);
    start(&mut c, fw, t1, 100);
    start(&mut c, fw, t2, 102);
    let usage = TaskUsage {
        cpu_time_secs: 1.5,
        ..TaskUsage::default()
    };
    let (fx, commit) = batch(
        &mut c,
        vec![
            Input::Exited {
                task: id1,
                status: exit(0),
                outcome: Some(CgroupOutcome {
                    oom_killed: false,
                    usage: Some(usage.clone()),
                }),
            },
            Input::Exited {
                task: id2,
                status: exit(137),
                outcome: Some(CgroupOutcome {
                    oom_killed: true,
                    usage: None,
                }),
            },
        ],
        T0 + 1,
    );
    assert_eq!(commit, Commit::Sync, "the terminal updates leave");
    assert!(!fx.iter().any(|e| matches!(e, Effect::Settle { .. })));
    let released: Vec<TaskId> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::ReleaseCgroup { task, .. } => Some(*task),
            _ => None,
        })
        .collect();
    assert_eq!(released, vec![id1, id2]);
    let states: Vec<(TaskId, TaskState)> = sent(&fx).iter().map(|u| (u.task_id, u.state)).collect();
    assert!(states.contains(&(id1, TaskState::Finished)), "{states:?}");
    assert!(states.contains(&(id2, TaskState::Failed)), "{states:?}");
    let oom = sent(&fx).into_iter().find(|u| u.task_id == id2).unwrap();
    assert_eq!(oom.reason, Some(TaskReason::MemoryLimit));
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Send(AgentToMaster::Usage { tasks, .. }) if tasks.iter().any(|(t, u)| *t == id1 && u.cpu_time_secs == 1.5))),
        "the final usage goes out with the batch: {fx:?}"
    );
    // A late exit of a task already settled changes nothing and releases nothing twice.
    let (fx, commit) = batch(
        &mut c,
        vec![Input::Exited {
            task: id1,
            status: exit(0),
            outcome: Some(CgroupOutcome::default()),
        }],
        T0 + 2,
    );
    assert!(fx.is_empty(), "{fx:?}");
    assert_eq!(commit, Commit::None);
}

/// A release alone (nothing sent: the agent is disconnected) still waits for a synced
/// commit: the cgroup's counters are the only copy of the outcome until the terminal record
/// is durable.
#[test]
fn a_cgroup_release_waits_for_a_synced_commit_even_with_nothing_sent() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let t = task("");
    let id = t.task_id;
    start(&mut c, fw, t, 100);
    c.handle(Input::Disconnected, T0 + 1);
    c.end_batch(T0 + 1);
    let (fx, commit) = batch(
        &mut c,
        vec![Input::Exited {
            task: id,
            status: exit(0),
            outcome: Some(CgroupOutcome::default()),
        }],
        T0 + 2,
    );
    assert!(sent(&fx).is_empty(), "disconnected: {fx:?}");
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::ReleaseCgroup { task, .. } if *task == id)));
    assert_eq!(commit, Commit::Sync);
}
