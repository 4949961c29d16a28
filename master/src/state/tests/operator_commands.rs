//! Operator commands of the `/api/v1` writes (reserve, deactivate, mark gone, teardown, GPU
//! clears) and the events they and the peers cause (the harness is `tests/mod.rs`).

use super::*;

fn op(h: &mut Harness, cmd: OperatorCommand) -> Result<Vec<Output>, OperatorRejection> {
    let mut out = h.m.operator_at(cmd, h.now)?;
    if h.m.allocation_due(h.now) {
        h.m.allocate(h.now, &mut out);
    }
    Ok(out)
}

fn tick(h: &mut Harness) -> Vec<Output> {
    h.now += 2000;
    h.input(Input::Tick)
}

#[test]
fn deactivated_agents_are_not_offered_until_reactivated() {
    let mut h = Harness::new();
    let a = h.agent(A, "a1", "cpus:4;mem:1024");
    let (_fw, offers1) = h.framework(F, "fw", "eng");
    assert_eq!(offers1.len(), 1);
    let out = op(&mut h, OperatorCommand::DeactivateAgent { agent_id: a }).unwrap();
    assert!(
        out.iter().any(|o| matches!(
            o,
            Output::ToFramework(F, MasterToFramework::Rescind { offer_id }) if *offer_id == offers1[0].id
        )),
        "the outstanding offer is rescinded: {out:?}"
    );
    assert!(offers(&tick(&mut h), F).is_empty());
    assert!(!h.m.view(h.now, 0).agents[0].active);
    let out = op(&mut h, OperatorCommand::ReactivateAgent { agent_id: a }).unwrap();
    let mut again = offers(&out, F);
    again.extend(offers(&tick(&mut h), F));
    assert_eq!(again.len(), 1, "offered again after reactivation");
    let unknown = AgentId::random();
    assert!(matches!(
        op(
            &mut h,
            OperatorCommand::DeactivateAgent { agent_id: unknown }
        ),
        Err(OperatorRejection::NotFound(_))
    ));
}

#[test]
fn operator_reservations_persist_and_refuse_what_is_in_use() {
    let mut h = Harness::new();
    let a = h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers1) = h.framework(F, "fw", "eng");
    // A task holds 3 cpus: only 1 is left to reserve.
    let t = task("cpus:3;mem:100");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers1[0].id, vec![t.clone()]),
    });
    let too_much = op(
        &mut h,
        OperatorCommand::Reserve {
            agent_id: a,
            role: "eng".into(),
            resources: res("cpus:2"),
        },
    );
    assert!(
        matches!(too_much, Err(OperatorRejection::Conflict(_))),
        "{too_much:?}"
    );
    let out = op(
        &mut h,
        OperatorCommand::Reserve {
            agent_id: a,
            role: "eng".into(),
            resources: res("cpus:1"),
        },
    )
    .unwrap();
    assert!(out.iter().any(|o| matches!(
        o,
        Output::Persist(Mutation::SetReservation(r)) if r.role == "eng" && r.resources == res("cpus:1")
    )));
    let v = h.m.view(h.now, 0);
    assert_eq!(v.agents[0].reserved["eng"], res("cpus:1"));
    // Unreserving more than was reserved is refused; the exact amount goes back.
    assert!(op(
        &mut h,
        OperatorCommand::Unreserve {
            agent_id: a,
            role: "eng".into(),
            resources: res("cpus:2"),
        },
    )
    .is_err());
    let out = op(
        &mut h,
        OperatorCommand::Unreserve {
            agent_id: a,
            role: "eng".into(),
            resources: res("cpus:1"),
        },
    )
    .unwrap();
    assert!(out.iter().any(|o| matches!(
        o,
        Output::Persist(Mutation::SetReservation(r)) if r.resources.is_empty()
    )));
    assert!(h.m.view(h.now, 0).agents[0].reserved.is_empty());
    let _ = fw;
}

#[test]
fn teardown_kills_the_tasks_and_mark_gone_loses_them() {
    let mut h = Harness::new();
    let a = h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers1) = h.framework(F, "fw", "eng");
    let t = task("cpus:1;mem:100");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers1[0].id, vec![t.clone()]),
    });
    h.m.take_events();
    let out = op(&mut h, OperatorCommand::Teardown { framework_id: fw }).unwrap();
    assert!(out.iter().any(|o| matches!(
        o,
        Output::ToAgent(A, MasterToAgent::KillTask { task_id, .. }) if *task_id == t.task_id
    )));
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Persist(Mutation::RemoveFramework(id)) if *id == fw)));
    let events = h.m.take_events();
    assert!(events
        .iter()
        .any(|e| matches!(e, ClusterEvent::FrameworkRemoved { reason, .. } if reason.contains("operator"))));
    assert!(matches!(
        op(&mut h, OperatorCommand::Teardown { framework_id: fw }),
        Err(OperatorRejection::NotFound(_))
    ));
    let out = op(&mut h, OperatorCommand::MarkAgentGone { agent_id: a }).unwrap();
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Persist(Mutation::RemoveAgent(id)) if *id == a)));
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Close { conn: A, .. })));
    assert!(h.m.view(h.now, 0).agents.is_empty());
    assert!(h
        .m
        .take_events()
        .iter()
        .any(|e| matches!(e, ClusterEvent::AgentRemoved { .. })));
}

#[test]
fn clear_gpu_asks_the_agent_only_for_an_unhealthy_gpu() {
    let mut h = Harness::new();
    let reg = register_with_gpus("cpus:4;mem:1024;gpus:1", vec![gpu_info(0)]);
    let out = h.register(A, "g1", reg);
    let a = out
        .iter()
        .find_map(|o| match o {
            Output::ToAgent(_, MasterToAgent::Registered { agent_id, .. }) => Some(*agent_id),
            _ => None,
        })
        .unwrap();
    let clear = |uuid: &str| OperatorCommand::ClearGpu {
        agent_id: a,
        uuid: uuid.into(),
    };
    assert!(matches!(
        op(&mut h, clear("GPU-0")),
        Err(OperatorRejection::Conflict(_))
    ));
    assert!(matches!(
        op(&mut h, clear("GPU-9")),
        Err(OperatorRejection::NotFound(_))
    ));
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::GpuHealth {
            uuid: "GPU-0".into(),
            healthy: false,
            reason: "xid 79".into(),
        },
    });
    let out = op(&mut h, clear("GPU-0")).unwrap();
    assert_eq!(
        out,
        vec![Output::ToAgent(
            A,
            MasterToAgent::ClearGpu {
                uuid: "GPU-0".into()
            }
        )]
    );
    assert!(h.m.take_events().iter().any(|e| matches!(
        e,
        ClusterEvent::AgentUpdated { what, .. } if what.contains("unhealthy")
    )));
}

#[test]
fn task_agent_and_framework_changes_are_events() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers1) = h.framework(F, "fw", "eng");
    let t = task("cpus:1;mem:100");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers1[0].id, vec![t.clone()]),
    });
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(agent_update(&t, fw, TaskState::Running)),
    });
    let events = h.m.take_events();
    let kinds: Vec<String> = events
        .iter()
        .map(|e| {
            serde_json::to_value(e).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(kinds.contains(&"agent_added".to_string()), "{kinds:?}");
    assert!(kinds.contains(&"framework_added".to_string()), "{kinds:?}");
    let states: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            ClusterEvent::TaskUpdated { state, .. } => Some(state.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(states, ["STAGING", "RUNNING"]);
    h.input(Input::FrameworkDisconnected { conn: F });
    assert!(h.m.take_events().iter().any(|e| matches!(
        e,
        ClusterEvent::FrameworkUpdated {
            connected: false,
            ..
        }
    )));
}

#[test]
fn quotas_and_reservations_name_only_resource_kinds_the_cluster_knows() {
    let mut h = Harness::new();
    let a = h.agent(A, "a1", "cpus:4;mem:1024;fpgas:2");
    let typo = op(
        &mut h,
        OperatorCommand::ChangeQuota {
            role: "etl".into(),
            guarantee: QuotaPart::Keep,
            limit: QuotaPart::Set("cpu:8".parse().unwrap()),
        },
    )
    .unwrap_err();
    let msg = typo.to_string();
    assert!(
        matches!(typo, OperatorRejection::UnknownResourceKind { .. }),
        "{typo:?}"
    );
    assert!(msg.contains("\"cpu\"") && msg.contains("cpus"), "{msg}");
    // Kinds an agent has are known; the refused quota left nothing behind.
    assert!(h.m.known_resource_kinds().contains("fpgas"));
    assert_eq!(h.m.allocator.quota("etl"), (None, None));
    let bad = op(
        &mut h,
        OperatorCommand::Reserve {
            agent_id: a,
            role: "ml".into(),
            resources: "gpu:1".parse().unwrap(),
        },
    );
    assert!(
        matches!(
            bad,
            Err(OperatorRejection::UnknownResourceKind {
                part: "reservation",
                ..
            })
        ),
        "{bad:?}"
    );
    op(
        &mut h,
        OperatorCommand::SetQuota {
            role: "etl".into(),
            guarantee: None,
            limit: Some("fpgas:1".parse().unwrap()),
        },
    )
    .unwrap();
}

#[test]
fn a_quota_change_keeps_the_part_it_does_not_name() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:1024");
    let set =
        |g: QuotaPart<Resources>, l: QuotaPart<ResourceLimits>| OperatorCommand::ChangeQuota {
            role: "etl".into(),
            guarantee: g,
            limit: l,
        };
    op(
        &mut h,
        set(QuotaPart::Set("cpus:1".parse().unwrap()), QuotaPart::Keep),
    )
    .unwrap();
    op(
        &mut h,
        set(QuotaPart::Keep, QuotaPart::Set("cpus:8".parse().unwrap())),
    )
    .unwrap();
    let (g, l) = h.m.allocator.quota("etl");
    assert_eq!(
        g.unwrap().milli("cpus"),
        1000,
        "setting the limit kept the guarantee"
    );
    assert_eq!(l.unwrap().limit("cpus"), Some(8000));
    op(&mut h, set(QuotaPart::Remove, QuotaPart::Keep)).unwrap();
    let (g, l) = h.m.allocator.quota("etl");
    assert!(g.is_none());
    assert_eq!(
        l.unwrap().limit("cpus"),
        Some(8000),
        "removing the guarantee kept the limit"
    );
}

#[test]
fn declared_resource_kinds_are_known_before_any_agent_has_them() {
    let h = Harness::with_config(MasterConfig {
        resource_kinds: vec!["licenses".into()],
        ..MasterConfig::default()
    });
    let known = h.m.known_resource_kinds();
    for k in ["cpus", "mem", "disk", "gpus", "ports", "licenses"] {
        assert!(known.contains(k), "{known:?}");
    }
}

/// The forwarded update of task `t` in `out`, if any.
fn forwarded(out: &[Output], t: TaskId) -> Option<StatusUpdate> {
    out.iter().find_map(|o| match o {
        Output::ToFramework(F, MasterToFramework::Update(u)) if u.task_id == t => Some(u.clone()),
        _ => None,
    })
}

#[test]
fn kills_say_why_a_framework_or_an_operator_asked() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers1) = h.framework(F, "fw", "eng");
    let (t1, t2, t3) = (
        task("cpus:1;mem:100"),
        task("cpus:1;mem:100"),
        task("cpus:1;mem:100"),
    );
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers1[0].id, vec![t1.clone(), t2.clone(), t3.clone()]),
    });
    for t in [&t1, &t2, &t3] {
        h.input(Input::Agent {
            conn: A,
            msg: AgentToMaster::StatusUpdate(agent_update(t, fw, TaskState::Running)),
        });
    }
    // A reason a framework may not give is refused; nothing is killed.
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::KillFor {
            task_id: t1.task_id,
            reason: TaskReason::DrainDeadline,
        },
    });
    assert_eq!(errors(&out), vec![ErrorKind::InvalidRequest]);
    assert!(!out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::KillTask { .. }))));
    // Preempted: the agent reports a plain KILLED (it only knows it was asked).
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::KillFor {
            task_id: t1.task_id,
            reason: TaskReason::Preempted,
        },
    });
    assert!(out.iter().any(|o| matches!(
        o,
        Output::ToAgent(A, MasterToAgent::KillTask { task_id, .. }) if *task_id == t1.task_id
    )));
    let mut killed = agent_update(&t1, fw, TaskState::Killed);
    killed.reason = Some(TaskReason::KilledByRequest);
    killed.message = "terminated by SIGTERM".into();
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(killed),
    });
    let u = forwarded(&out, t1.task_id).expect("forwarded");
    assert_eq!(u.reason, Some(TaskReason::Preempted));
    assert!(
        u.message.starts_with("preempted") && u.message.contains("SIGTERM"),
        "{}",
        u.message
    );
    // A plain kill says nothing more than the agent did.
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Kill {
            task_id: t2.task_id,
        },
    });
    let mut killed = agent_update(&t2, fw, TaskState::Killed);
    killed.reason = Some(TaskReason::KilledByRequest);
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(killed),
    });
    assert_eq!(
        forwarded(&out, t2.task_id).unwrap().reason,
        Some(TaskReason::KilledByRequest)
    );
    // An operator's teardown: its tasks end operator-kill (in the framework's history).
    op(&mut h, OperatorCommand::Teardown { framework_id: fw }).unwrap();
    let mut killed = agent_update(&t3, fw, TaskState::Killed);
    killed.reason = Some(TaskReason::KilledByRequest);
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(killed),
    });
    let view = h.m.view(h.now, 0);
    let t3v = view
        .completed_tasks
        .iter()
        .chain(&view.tasks)
        .find(|v| v.id == t3.task_id.to_string())
        .expect("t3 kept");
    assert_eq!(t3v.reason.as_deref(), Some("operator-kill"));
    assert!(t3v.message.contains("operator"), "{}", t3v.message);
}

#[test]
fn refused_and_dropped_tasks_are_kept_with_a_message_in_words() {
    let mut h = Harness::new();
    let reg = register_with_gpus("cpus:4;mem:1024;gpus:1", vec![gpu_info(0)]);
    h.register(A, "g1", reg);
    let mut fw_info = info("fw", "eng", None);
    fw_info.capabilities = vec![Capability::GpuResources];
    let offers1 = offers(&h.subscribe(F, "fw", fw_info), F);
    let mut t = task("cpus:1;mem:100;gpus:1");
    t.name = "wants-a100".into();
    t.gpu_selector = Some(GpuSelector {
        min_memory_mib: Some(1 << 30),
        ..GpuSelector::model("A100")
    });
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offers1[0].id, vec![t.clone()]),
    });
    assert!(forwarded(&out, t.task_id).is_some_and(|u| u.state == TaskState::Error));
    // A second accept of the same (now used) offer: its task is DROPPED.
    let mut d = task("cpus:1;mem:100");
    d.name = "late".into();
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers1[0].id, vec![d.clone()]),
    });
    let view = h.m.view(h.now, 0);
    let err = view
        .completed_tasks
        .iter()
        .find(|v| v.name == "wants-a100")
        .expect("the ERROR task is kept");
    assert_eq!(err.state, "ERROR");
    assert_eq!(err.reason.as_deref(), Some("invalid-task"));
    assert!(
        err.message
            .contains("model \"A100\", at least 1073741824 MiB"),
        "{}",
        err.message
    );
    assert!(!err.message.contains("GpuSelector"), "{}", err.message);
    assert_eq!(err.role, "eng");
    let dropped = view
        .completed_tasks
        .iter()
        .find(|v| v.name == "late")
        .expect("the DROPPED task is kept");
    assert_eq!(dropped.state, "DROPPED");
    assert_eq!(dropped.reason.as_deref(), Some("invalid-offers"));
}
