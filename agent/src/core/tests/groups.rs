//! Task groups in the core: all members start or none, the group environment, the failure
//! policies, and the policy kept across an agent restart.

use super::*;

fn member(gpus: u32) -> TaskInfo {
    TaskInfo {
        name: format!("m-{}", TaskId::random()),
        ..task(&format!(";gpus:{gpus}"))
    }
}

fn run_group(fw: FrameworkId, policy: GroupPolicy, tasks: &[TaskInfo]) -> Input {
    Input::Master(MasterToAgent::RunTaskGroup {
        framework_id: fw,
        group_id: "g1".into(),
        policy,
        members: tasks
            .iter()
            .map(|t| GroupMember {
                task: t.clone(),
                gpus: vec![],
            })
            .collect(),
    })
}

fn launches(fx: &[Effect]) -> Vec<&LaunchPlan> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Launch(p) => Some(&**p),
            _ => None,
        })
        .collect()
}

/// A group of two 2-GPU members started on a 4-GPU agent, both RUNNING (pgids 100, 200).
fn started(policy: GroupPolicy) -> (AgentCore, FrameworkId, Vec<TaskId>) {
    let mut c = registered(4);
    let fw = FrameworkId::random();
    let tasks = [member(2), member(2)];
    let fx = step(&mut c, run_group(fw, policy, &tasks), T0);
    assert_eq!(launches(&fx).len(), 2);
    for (t, pgid) in tasks.iter().zip([100, 200]) {
        step(
            &mut c,
            Input::Launched {
                task: t.task_id,
                result: Ok(launched(pgid)),
            },
            T0,
        );
    }
    (c, fw, tasks.iter().map(|t| t.task_id).collect())
}

/// Ends task `id` with exit `code` (exit, then the cgroup settled); returns the effects.
fn end(c: &mut AgentCore, id: TaskId, code: i32) -> Vec<Effect> {
    let mut fx = step(
        c,
        Input::Exited {
            task: id,
            status: exit(code),
            outcome: None,
        },
        T0,
    );
    fx.extend(step(
        c,
        Input::Settled {
            task: id,
            status: exit(code),
            outcome: CgroupOutcome::default(),
        },
        T0,
    ));
    fx
}

#[test]
fn a_group_starts_whole_and_each_member_sees_the_others() {
    let mut c = registered(4);
    let fw = FrameworkId::random();
    let tasks = [member(2), member(2)];
    let fx = step(&mut c, run_group(fw, GroupPolicy::default(), &tasks), T0);
    let plans = launches(&fx);
    assert_eq!(plans.len(), 2);
    let gpus: Vec<&Vec<String>> = tasks
        .iter()
        .map(|t| &c.checkpoint().tasks[&t.task_id].gpus)
        .collect();
    assert!(gpus.iter().all(|g| g.len() == 2) && gpus[0] != gpus[1]);
    for (i, p) in plans.iter().enumerate() {
        assert_eq!(p.env["GANTRY_GROUP_ID"], "g1");
        assert_eq!(p.env["GANTRY_GROUP_INDEX"], i.to_string());
        assert_eq!(p.env["GANTRY_GROUP_SIZE"], "2");
        assert_eq!(p.env["GANTRY_GROUP_ADDRS"], "h,h");
        let members: serde_json::Value =
            serde_json::from_str(&p.env["GANTRY_GROUP_MEMBERS"]).expect("JSON");
        for (j, t) in tasks.iter().enumerate() {
            assert_eq!(members[j]["task_id"], t.task_id.to_string());
            assert_eq!(members[j]["name"], t.name.as_str());
        }
    }
    // Sent again (a reconnect): ignored.
    let fx = step(&mut c, run_group(fw, GroupPolicy::default(), &tasks), T0);
    assert!(launches(&fx).is_empty());
}

#[test]
fn a_member_that_cannot_start_fails_every_member_and_starts_none() {
    let mut c = registered(4);
    let fw = FrameworkId::random();
    // Six GPUs asked on a four-GPU agent: the third member cannot get its two.
    let tasks = [member(2), member(2), member(2)];
    let fx = step(&mut c, run_group(fw, GroupPolicy::default(), &tasks), T0);
    assert!(launches(&fx).is_empty(), "nothing starts");
    let ups = updates(&fx);
    assert_eq!(ups.len(), 3);
    for (t, u) in tasks.iter().zip(&ups) {
        assert_eq!((u.task_id, u.state), (t.task_id, TaskState::Failed));
        assert!(
            u.message.contains(&tasks[2].name) && u.message.contains("no member was started"),
            "{}",
            u.message
        );
    }
    // Its GPUs are free again: a 4-GPU task fits.
    let fx = step(&mut c, run_task(fw, member(4)), T0);
    assert_eq!(launches(&fx).len(), 1);
}

#[test]
fn a_failed_member_gets_its_siblings_killed() {
    let (mut c, _, ids) = started(GroupPolicy::KillOnFailure);
    let fx = end(&mut c, ids[0], 3);
    assert_eq!(signals(&fx), vec![(200, libc::SIGTERM)]);
    let fx = end(&mut c, ids[1], 143);
    let u = updates(&fx).pop().expect("terminal update");
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Killed, Some(TaskReason::KilledByRequest))
    );
    assert!(
        u.message.contains(&ids[0].to_string()) && u.message.contains("FAILED"),
        "{}",
        u.message
    );
    // The killed member does not kill again (the first one is terminal anyway).
    assert!(signals(&fx).is_empty());
}

#[test]
fn policies_finish_alone_stop_together_or_run_independently() {
    // Default: a member that finishes leaves the other running.
    let (mut c, _, ids) = started(GroupPolicy::KillOnFailure);
    assert!(signals(&end(&mut c, ids[0], 0)).is_empty());
    // Stop together: a finished member ends the others.
    let (mut c, _, ids) = started(GroupPolicy::KillOnAnyEnd);
    assert_eq!(signals(&end(&mut c, ids[1], 0)), vec![(100, libc::SIGTERM)]);
    // Independent: a failure touches nobody.
    let (mut c, _, ids) = started(GroupPolicy::Independent);
    assert!(signals(&end(&mut c, ids[0], 1)).is_empty());
}

#[test]
fn the_policy_survives_an_agent_restart() {
    let (c, _, ids) = started(GroupPolicy::KillOnFailure);
    // The checkpoint as the log stores it (JSON), read back by a new agent run; the launches
    // come from their records (the log does not hold them).
    let found: Vec<(TaskId, Launched)> = ids
        .iter()
        .map(|id| (*id, c.checkpoint().tasks[id].launched.expect("launched")))
        .collect();
    let json = serde_json::to_vec(c.checkpoint()).expect("encodes");
    let ckpt: Checkpoint = serde_json::from_slice(&json).expect("decodes");
    assert!(ckpt.tasks[&ids[0]].group.is_some());
    assert!(ckpt.tasks[&ids[0]].launched.is_none(), "not in the log");
    let mut c = AgentCore::new(config(4), ckpt, T0, Instant::now());
    c.recover(
        RecoveryProbe {
            found,
            alive: ids.clone(),
            exited: vec![],
        },
        T0,
    );
    let fx = end(&mut c, ids[1], 2);
    assert_eq!(signals(&fx), vec![(100, libc::SIGTERM)]);
}
