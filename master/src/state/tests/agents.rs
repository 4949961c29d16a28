//! Agents: re-registration, GPU health, identity (name plus id).

use super::*;

#[test]
fn agent_reregistering_in_time_keeps_its_tasks() {
    let mut h = Harness::new();
    let agent = h.agent(A, "a1", "cpus:2;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    h.input(Input::AgentDisconnected { conn: A });
    h.now += 5_000;
    h.input(Input::AgentConnected {
        conn: 9,
        name: "a1".into(),
        address: "x".into(),
    });
    let running = RunningTask {
        framework_id: fw,
        task: t.clone(),
        state: TaskState::Running,
        gpus: vec![],
        ports: vec![],
    };
    let AgentToMaster::Register { resources, .. } = register(None, "cpus:2;mem:1024") else {
        unreachable!()
    };
    let out = h.input(Input::Agent {
        conn: 9,
        msg: AgentToMaster::Register {
            agent_id: Some(agent),
            hostname: "h".into(),
            resources,
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: vec![],
            running_tasks: vec![running],
            pending_updates: vec![],
            task_user: "nobody".into(),
        },
    });
    assert!(out.iter().any(|o| matches!(o, Output::ToAgent(9, MasterToAgent::Registered { agent_id, .. }) if *agent_id == agent)));
    h.now += 20_000;
    let out = h.input(Input::Tick);
    assert!(!out.iter().any(|o| matches!(o, Output::ToFramework(_, MasterToFramework::Update(u)) if u.state == TaskState::Lost)));
    assert!(h.m.tasks.contains_key(&t.task_id));
}

#[test]
fn unhealthy_gpu_is_withdrawn_from_offers_and_reservations_stay() {
    let mut h = Harness::new();
    h.input(Input::AgentConnected {
        conn: A,
        name: "g1".into(),
        address: "127.0.0.1:1".into(),
    });
    let mut reserved = BTreeMap::new();
    reserved.insert("ml".to_string(), res("gpus:1"));
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::Register {
            agent_id: None,
            hostname: "h".into(),
            resources: res("cpus:4;mem:1024;gpus:3"),
            reserved,
            attributes: Default::default(),
            gpus: (0..4).map(gpu_info).collect(),
            running_tasks: vec![],
            pending_updates: vec![],
            task_user: "nobody".into(),
        },
    });
    h.input(Input::FrameworkConnected {
        conn: F,
        principal: "f".into(),
    });
    let mut fw = info("f", "ml", None);
    fw.capabilities = vec![Capability::GpuResources];
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Subscribe(fw),
    });
    let offered = offers(&out, F);
    assert_eq!(offered.len(), 1);
    assert_eq!(offered[0].total().get("gpus"), 4.0);
    assert_eq!(offered[0].gpus.len(), 4);

    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::GpuHealth {
            uuid: "GPU-2".into(),
            healthy: false,
            reason: "critical XID 79".into(),
        },
    });
    assert!(
        out.iter().any(|o| matches!(
            o,
            Output::ToFramework(F, MasterToFramework::Rescind { offer_id }) if *offer_id == offered[0].id
        )),
        "{out:?}"
    );
    let view = h.m.view(h.now, 0);
    let agent = &view.agents[0];
    assert_eq!(agent.total.get("gpus"), 3.0, "2 unreserved + 1 reserved");
    assert_eq!(agent.reserved["ml"].get("gpus"), 1.0);
    assert_eq!(
        agent.gpus.iter().filter(|g| !g.healthy).count(),
        1,
        "{:?}",
        agent.gpus
    );
    // Reported again (e.g. after an agent restart): nothing changes.
    let again = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::GpuHealth {
            uuid: "GPU-2".into(),
            healthy: false,
            reason: "critical XID 79".into(),
        },
    });
    assert!(!again
        .iter()
        .any(|o| matches!(o, Output::ToFramework(_, MasterToFramework::Rescind { .. }))));
    // Cleared: back in the pool.
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::GpuHealth {
            uuid: "GPU-2".into(),
            healthy: true,
            reason: "cleared by operator".into(),
        },
    });
    assert_eq!(h.m.view(h.now, 0).agents[0].total.get("gpus"), 4.0);
}

#[test]
fn agent_identity_is_its_name_plus_its_id() {
    let mut h = Harness::new();
    let a1 = h.agent(A, "a1", "cpus:2;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    // A second live agent under the same name, without an id or with another one: refused
    // with the conflict named; the first keeps its connection and its task.
    for (conn, claim) in [(10, None), (11, Some(AgentId::random()))] {
        let out = h.register(conn, "a1", register(claim, "cpus:8"));
        let m = agent_refusal(&out, conn).expect("name conflict refused");
        assert!(m.contains("\"a1\"") && m.contains(&a1.to_string()), "{m}");
        assert!(!out
            .iter()
            .any(|o| matches!(o, Output::Close { conn: A, .. })));
        assert!(!out.iter().any(|o| matches!(
            o,
            Output::ToFramework(_, MasterToFramework::Update(u)) if u.state == TaskState::Lost
        )));
    }
    assert_eq!(h.m.agents[&a1].conn, Some(A));
    assert!(h.m.tasks.contains_key(&t.task_id));
    // Another certificate claiming a1's id (a squatter): refused; it cannot forge a1's updates.
    let out = h.register(12, "squatter", register(Some(a1), "cpus:1"));
    let m = agent_refusal(&out, 12).expect("foreign id refused");
    assert!(m.contains("belongs to agent \"a1\""), "{m}");
    let out = h.input(Input::Agent {
        conn: 12,
        msg: AgentToMaster::StatusUpdate(agent_update(&t, fw, TaskState::Finished)),
    });
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Close { conn: 12, .. })));
    assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Staging);
    // The same agent restarting (same name, same id) replaces its old connection.
    let out = h.register(13, "a1", register(Some(a1), "cpus:2;mem:1024"));
    assert!(agent_refusal(&out, 13).is_none(), "{out:?}");
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Close { conn: A, .. })));
    assert_eq!(h.m.agents[&a1].conn, Some(13));
    // Disconnected but within the re-register timeout: still refused for a new incarnation.
    h.input(Input::AgentDisconnected { conn: 13 });
    h.now += 5_000;
    h.input(Input::Tick);
    let out = h.register(14, "a1", register(None, "cpus:8"));
    let m = agent_refusal(&out, 14).expect("refused while the old one may come back");
    assert!(m.contains("disconnected 5 s ago"), "{m}");
    // Gone for the re-register timeout: removed, and a new incarnation is admitted.
    h.now += 6_000;
    h.input(Input::Tick);
    let out = h.register(15, "a1", register(None, "cpus:8"));
    assert!(agent_refusal(&out, 15).is_none(), "{out:?}");
    assert_eq!(h.m.agents.len(), 1);
    assert!(!h.m.agents.contains_key(&a1));
}

#[test]
fn an_unknown_agent_id_joins_as_a_new_agent_and_its_tasks_are_killed() {
    let mut h = Harness::new();
    let (fw, _) = h.framework(F, "f", "r");
    let claimed = AgentId::random();
    let stray = task("cpus:1");
    let AgentToMaster::Register { resources, .. } = register(None, "cpus:2") else {
        unreachable!()
    };
    let out = h.register(
        A,
        "a1",
        AgentToMaster::Register {
            agent_id: Some(claimed),
            hostname: "h".into(),
            resources,
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: vec![],
            running_tasks: vec![RunningTask {
                framework_id: fw,
                task: stray.clone(),
                state: TaskState::Running,
                gpus: vec![],
                ports: vec![],
            }],
            pending_updates: vec![],
            task_user: "nobody".into(),
        },
    );
    let id = out
        .iter()
        .find_map(|o| match o {
            Output::ToAgent(A, MasterToAgent::Registered { agent_id, .. }) => Some(*agent_id),
            _ => None,
        })
        .expect("registered");
    assert_ne!(id, claimed, "an unknown id is not granted");
    assert!(out.iter().any(|o| matches!(
        o,
        Output::ToAgent(A, MasterToAgent::KillTask { task_id, .. }) if *task_id == stray.task_id
    )));
    assert!(!h.m.tasks.contains_key(&stray.task_id), "not adopted");
    assert!(h.m.allocator.in_use(fw, id).is_empty(), "nothing charged");
}
