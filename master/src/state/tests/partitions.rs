//! Partitions and agent loss (docs/ha.md, "Partitions"): unreachable agents, their tasks'
//! real states, terminal states never rewritten, and tasks an agent reports that the master
//! never launched.

use super::*;

const G: ConnId = 3;

/// A framework on `conn` that declares `PartitionAware` (or not).
fn aware_framework(h: &mut Harness, conn: ConnId, aware: bool) -> (FrameworkId, Vec<Offer>) {
    let mut i = info("f", "r", None);
    i.failover_timeout_secs = 3600.0;
    if aware {
        i.capabilities = vec![Capability::PartitionAware];
    }
    let out = h.subscribe(conn, "f", i);
    let id = subscribed(&out).expect("subscribed");
    (id, offers(&out, conn))
}

fn running(fw: FrameworkId, t: &TaskInfo, state: TaskState) -> RunningTask {
    RunningTask {
        framework_id: fw,
        task: t.clone(),
        state,
        gpus: vec![],
        ports: vec![],
    }
}

/// Agent `a1` re-registers on `conn` under `id`, reporting `tasks` and `pending` updates.
fn come_back(
    h: &mut Harness,
    conn: ConnId,
    id: AgentId,
    tasks: Vec<RunningTask>,
    pending: Vec<StatusUpdate>,
) -> Vec<Output> {
    h.register(
        conn,
        "a1",
        AgentToMaster::Register {
            agent_id: Some(id),
            hostname: "h".into(),
            resources: res("cpus:4;mem:4096"),
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: vec![],
            running_tasks: tasks,
            pending_updates: pending,
            task_user: "nobody".into(),
        },
    )
}

fn updates(out: &[Output], conn: ConnId) -> Vec<StatusUpdate> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(c, MasterToFramework::Update(u)) if *c == conn => Some(u.clone()),
            _ => None,
        })
        .collect()
}

fn kills(out: &[Output]) -> Vec<TaskId> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToAgent(_, MasterToAgent::KillTask { task_id, .. }) => Some(*task_id),
            _ => None,
        })
        .collect()
}

/// Disconnects the agent on `A` at `h.now` and ticks past its re-register timeout.
fn partition(h: &mut Harness) -> Vec<Output> {
    h.input(Input::AgentDisconnected { conn: A });
    h.now += h.m.config.agent_reregister_timeout_ms + 1;
    h.input(Input::Tick)
}

#[test]
fn a_live_agent_cannot_make_the_master_adopt_a_task_it_never_launched() {
    let mut h = Harness::new();
    let agent = h.agent(A, "a1", "cpus:4;mem:4096");
    let (victim, _) = aware_framework(&mut h, F, false);
    // The agent reconnects under its own id and reports a task the master never launched,
    // in the victim framework's name, holding far more than the host has.
    // One far over the host, and one that would fit in it.
    let (phantom, small) = (task("cpus:500;mem:1"), task("cpus:1;mem:1"));
    let out = come_back(
        &mut h,
        9,
        agent,
        vec![
            running(victim, &phantom, TaskState::Running),
            running(victim, &small, TaskState::Running),
        ],
        vec![],
    );
    let mut killed = kills(&out);
    killed.sort();
    let mut want = vec![phantom.task_id, small.task_id];
    want.sort();
    assert_eq!(killed, want, "the phantom tasks are killed");
    assert!(!h.m.tasks.contains_key(&phantom.task_id), "and not kept");
    assert!(!h.m.tasks.contains_key(&small.task_id), "and not kept");
    // Nor charged: the victim's share is what its offer of this agent makes it at most (it
    // would be 125 with the phantom's 500 cpus).
    assert!(h.m.allocator.framework_share(victim) <= 1.0, "nor charged");
}

#[test]
fn adoption_after_a_failover_is_bounded_by_the_agents_resources() {
    // A master that recovered the registry adopts what a returning agent reports, but only
    // within what the agent registers: the rest is killed, unaccounted.
    let mut h = Harness::new();
    let agent = AgentId::from_u128(77);
    let fw = FrameworkId::from_u128(5);
    let mut registry = Registry::default();
    registry.agents.insert(
        agent,
        AgentRecord {
            id: agent,
            name: "a1".into(),
            hostname: "h".into(),
            deactivated: false,
        },
    );
    registry.frameworks.insert(
        fw,
        FrameworkRecord {
            id: fw,
            name: "f".into(),
            roles: vec!["r".into()],
            principal: "f".into(),
            failover_timeout_secs: 60.0,
            partition_aware: true,
        },
    );
    h.m.recover(registry, 0);
    let (fits, too_big) = (task("cpus:3;mem:1024"), task("cpus:3;mem:1024"));
    let out = come_back(
        &mut h,
        A,
        agent,
        vec![
            running(fw, &fits, TaskState::Running),
            running(fw, &too_big, TaskState::Running),
        ],
        vec![],
    );
    assert!(h.m.tasks.contains_key(&fits.task_id), "adopted");
    assert_eq!(kills(&out), vec![too_big.task_id], "over the agent: killed");
    assert!(!h.m.tasks.contains_key(&too_big.task_id));
    assert_eq!(
        h.m.frameworks[&fw].capabilities,
        vec![Capability::PartitionAware],
        "the capability survives the failover"
    );
}

#[test]
fn a_finished_task_stays_finished_when_its_agent_is_lost() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:4096");
    let (fw, offers) = aware_framework(&mut h, F, false);
    let t = task("cpus:1;mem:64");
    run_tasks(&mut h, offers[0].id, vec![t.clone()]);
    // It finishes, and the framework goes away before acknowledging.
    let finished = agent_update(&t, fw, TaskState::Finished);
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(finished.clone()),
    });
    h.input(Input::FrameworkDisconnected { conn: F });
    // Then the agent is lost.
    let out = partition(&mut h);
    assert!(updates(&out, F).is_empty());
    assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Finished);
    // The framework fails over: it gets the real FINISHED, not LOST.
    let out = h.subscribe(G, "f", info("f", "r", Some(fw)));
    let got = updates(&out, G);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].state, TaskState::Finished);
    assert_eq!(got[0].update_id, finished.update_id);
    h.ack_all(&out, G);
    assert!(
        !h.m.tasks.contains_key(&t.task_id),
        "acknowledged: completed"
    );
    let done = h.m.completed_task(fw, t.task_id).expect("in the history");
    assert_eq!(done.state, TaskState::Finished);
}

#[test]
fn an_unreachable_agents_tasks_resume_their_real_states_when_it_comes_back() {
    let mut h = Harness::new();
    let agent = h.agent(A, "a1", "cpus:4;mem:4096");
    let (fw, offers) = aware_framework(&mut h, F, true);
    let (a, b) = (task("cpus:1;mem:64"), task("cpus:1;mem:64"));
    run_tasks(&mut h, offers[0].id, vec![a.clone(), b.clone()]);
    for t in [&a, &b] {
        let out = h.input(Input::Agent {
            conn: A,
            msg: AgentToMaster::StatusUpdate(agent_update(t, fw, TaskState::Running)),
        });
        h.ack_all(&out, F);
    }
    let share = h.m.allocator.framework_share(fw);
    assert!(share > 0.0);
    // Partitioned past the re-register timeout: UNREACHABLE, not LOST; resources leave.
    let out = partition(&mut h);
    let got = updates(&out, F);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.iter().all(
        |u| u.state == TaskState::Unreachable && u.reason == Some(TaskReason::AgentUnreachable)
    ));
    assert_eq!(h.m.allocator.framework_share(fw), 0.0);
    assert!(h.m.agents.is_empty());
    // A kill asked for while it is away is carried to the agent when it is back.
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Kill { task_id: b.task_id },
    });
    // It comes back within the unreachable timeout, with its id: `a` still runs, `b` finished
    // while away (its update was waiting on the agent).
    h.now += 60_000;
    let finished = agent_update(&b, fw, TaskState::Finished);
    let out = come_back(
        &mut h,
        9,
        agent,
        vec![
            running(fw, &a, TaskState::Running),
            running(fw, &b, TaskState::Running),
        ],
        vec![finished.clone()],
    );
    assert!(out.iter().any(|o| matches!(o,
        Output::ToAgent(9, MasterToAgent::Registered { agent_id, .. }) if *agent_id == agent)));
    let got = updates(&out, F);
    let state_of = |t: &TaskInfo| {
        got.iter()
            .filter(|u| u.task_id == t.task_id)
            .map(|u| u.state)
            .collect::<Vec<_>>()
    };
    assert_eq!(state_of(&a), vec![TaskState::Running]);
    assert_eq!(*state_of(&b).last().unwrap(), TaskState::Finished);
    assert_eq!(
        kills(&out),
        vec![b.task_id],
        "the kill asked for while away"
    );
    assert!(kills(&out).iter().all(|k| *k != a.task_id));
    assert_eq!(h.m.tasks[&a.task_id].state, TaskState::Running);
    assert!(
        h.m.allocator.framework_share(fw) > 0.0,
        "`a` is charged again"
    );
    h.ack_all(&out, F);
    assert!(!h.m.tasks.contains_key(&b.task_id));
}

#[test]
fn tasks_of_frameworks_that_are_not_partition_aware_are_lost_and_killed_on_return() {
    let mut h = Harness::new();
    let agent = h.agent(A, "a1", "cpus:4;mem:4096");
    let (fw, offers) = aware_framework(&mut h, F, false);
    let t = task("cpus:1;mem:64");
    run_tasks(&mut h, offers[0].id, vec![t.clone()]);
    let out = partition(&mut h);
    let got = updates(&out, F);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].state, TaskState::Lost);
    assert_eq!(got[0].reason, Some(TaskReason::AgentLost));
    h.now += 1_000;
    let out = come_back(
        &mut h,
        9,
        agent,
        vec![running(fw, &t, TaskState::Running)],
        vec![],
    );
    assert_eq!(kills(&out), vec![t.task_id], "its framework was told LOST");
    assert!(!h.m.tasks.contains_key(&t.task_id));
}

#[test]
fn an_agent_unreachable_past_its_timeout_is_gone_with_its_tasks() {
    let mut h = Harness::new();
    let agent = h.agent(A, "a1", "cpus:4;mem:4096");
    let (fw, offers) = aware_framework(&mut h, F, true);
    let t = task("cpus:1;mem:64");
    run_tasks(&mut h, offers[0].id, vec![t.clone()]);
    partition(&mut h);
    assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Unreachable);
    h.now += h.m.config.agent_unreachable_timeout_ms + 1;
    let out = h.input(Input::Tick);
    let got = updates(&out, F);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].state, TaskState::Gone);
    assert!(got[0].state.is_terminal());
    h.ack_all(&out, F);
    assert!(!h.m.tasks.contains_key(&t.task_id));
    assert!(out.iter().any(|o| matches!(o,
        Output::Persist(Mutation::RemoveAgent(id)) if *id == agent)));
    // Frameworks are told it is gone for good (protocol 13).
    assert!(out.iter().any(|o| matches!(o,
        Output::ToFramework(F, MasterToFramework::AgentRemoved(r)) if r.agent_id == agent)));
    // Back after that: a new agent, its old task killed.
    let out = come_back(
        &mut h,
        10,
        agent,
        vec![running(fw, &t, TaskState::Running)],
        vec![],
    );
    assert_eq!(kills(&out), vec![t.task_id]);
}

#[test]
fn a_new_incarnation_under_an_unreachable_agents_name_makes_its_tasks_gone() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:4096");
    let (_, offers) = aware_framework(&mut h, F, true);
    let t = task("cpus:1;mem:64");
    run_tasks(&mut h, offers[0].id, vec![t.clone()]);
    partition(&mut h);
    // The host comes back with a wiped work directory: no id.
    let out = h.register(9, "a1", register(None, "cpus:4;mem:4096"));
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(9, MasterToAgent::Registered { .. }))));
    let got = updates(&out, F);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].state, TaskState::Gone);
}
