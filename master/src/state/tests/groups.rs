//! Task groups in the state machine: validated as a whole (one invalid member refuses every
//! member, nothing charged), sent to the agent as one message.

use super::*;

fn group_accept(offer: OfferId, group: TaskGroup, also: Vec<TaskInfo>) -> FrameworkToMaster {
    FrameworkToMaster::Accept {
        offer_ids: vec![offer],
        operations: vec![
            Operation::LaunchGroup { group },
            Operation::Launch { tasks: also },
        ],
        refuse_seconds: Some(0.0),
    }
}

fn member(name: &str, r: &str) -> TaskInfo {
    TaskInfo {
        name: name.into(),
        ..task(r)
    }
}

/// The group launches sent to agents: (group id, policy, member ids and GPUs).
type SentGroup = (String, GroupPolicy, Vec<(TaskId, Vec<String>)>);

fn groups_sent(out: &[Output]) -> Vec<SentGroup> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToAgent(
                A,
                MasterToAgent::RunTaskGroup {
                    group_id,
                    policy,
                    members,
                    ..
                },
            ) => Some((
                group_id.clone(),
                *policy,
                members
                    .iter()
                    .map(|m| (m.task.task_id, m.gpus.clone()))
                    .collect(),
            )),
            _ => None,
        })
        .collect()
}

/// The framework's ERROR updates: (task, message).
fn error_updates(out: &[Output]) -> Vec<(TaskId, String)> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(F, MasterToFramework::Update(u)) if u.state == TaskState::Error => {
                Some((u.task_id, u.message.clone()))
            }
            _ => None,
        })
        .collect()
}

fn gpu_harness() -> (Harness, Vec<Offer>) {
    let mut h = Harness::new();
    let gpus: Vec<GpuInfo> = (0..4).map(gpu_info).collect();
    h.register(
        A,
        "gpu-agent",
        register_with_gpus("cpus:16;mem:16384;gpus:4", gpus),
    );
    let mut info = info("f", "r", None);
    info.capabilities = vec![Capability::GpuResources];
    let out = h.subscribe(F, "f", info);
    let offers = offers(&out, F);
    (h, offers)
}

#[test]
fn a_valid_group_goes_to_the_agent_as_one_message() {
    let (mut h, offers) = gpu_harness();
    let a = member("a", "cpus:1;mem:100;gpus:2");
    let b = member("b", "cpus:1;mem:100;gpus:2");
    let group =
        TaskGroup::new("eval", vec![a.clone(), b.clone()]).with_policy(GroupPolicy::KillOnAnyEnd);
    let out = h.input(Input::Framework {
        conn: F,
        msg: group_accept(offers[0].id, group, vec![task("cpus:1;mem:100")]),
    });
    let sent = groups_sent(&out);
    assert_eq!(sent.len(), 1, "{out:?}");
    let (id, policy, members) = &sent[0];
    assert_eq!((id.as_str(), *policy), ("eval", GroupPolicy::KillOnAnyEnd));
    assert_eq!(
        members.iter().map(|m| m.0).collect::<Vec<_>>(),
        vec![a.task_id, b.task_id]
    );
    // Whole GPUs, two each, none shared.
    let mut all: Vec<&String> = members.iter().flat_map(|m| &m.1).collect();
    assert_eq!(all.len(), 4);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 4);
    for t in [&a, &b] {
        assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Staging);
    }
    // The single task of the same accept went as its own RunTask.
    assert_eq!(
        out.iter()
            .filter(|o| matches!(o, Output::ToAgent(A, MasterToAgent::RunTask { .. })))
            .count(),
        1
    );
}

#[test]
fn one_invalid_member_refuses_the_whole_group_and_charges_nothing() {
    let (mut h, offers) = gpu_harness();
    let good = member("good", "cpus:1;mem:100;gpus:2");
    let mut bad = member("bad", "cpus:1;mem:100;gpus:2");
    bad.command = " ".into();
    let group = TaskGroup::new("g", vec![good.clone(), bad.clone()]);
    let out = h.input(Input::Framework {
        conn: F,
        msg: group_accept(offers[0].id, group, vec![]),
    });
    assert!(groups_sent(&out).is_empty());
    let errs = error_updates(&out);
    assert_eq!(
        errs.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![good.task_id, bad.task_id]
    );
    assert_eq!(errs[0].1, errs[1].1, "one reason for every member");
    assert!(
        errs[0].1.contains("refused as a whole") && errs[0].1.contains("\"bad\""),
        "{}",
        errs[0].1
    );
    assert!(!h.m.tasks.contains_key(&good.task_id));
    // Nothing was charged: the next offer holds all four GPUs again.
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Revive { roles: vec![] },
    });
    let again = offers_of(&out);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].resources.milli("gpus"), 4000);

    // A group larger than the offers (six GPUs of four) is refused whole too; a malformed
    // group (an id twice) as well.
    let members: Vec<TaskInfo> = (0..3)
        .map(|i| member(&format!("m{i}"), "cpus:1;mem:100;gpus:2"))
        .collect();
    let out = h.input(Input::Framework {
        conn: F,
        msg: group_accept(again[0].id, TaskGroup::new("big", members), vec![]),
    });
    assert!(groups_sent(&out).is_empty());
    let errs = error_updates(&out);
    assert_eq!(errs.len(), 3);
    assert!(errs[0].1.contains("\"m2\""), "{}", errs[0].1);
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Revive { roles: vec![] },
    });
    let again = offers_of(&out);
    let t = task("cpus:1");
    let out = h.input(Input::Framework {
        conn: F,
        msg: group_accept(
            again[0].id,
            TaskGroup::new("dup", vec![t.clone(), t]),
            vec![],
        ),
    });
    assert!(groups_sent(&out).is_empty());
    assert!(error_updates(&out)[0].1.contains("appears twice"));
}
