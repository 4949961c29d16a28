//! Pipelined status updates: an agent sends a task's STARTING, RUNNING and FINISHED without
//! waiting for acknowledgements; the master keeps them as a bounded ordered queue per task.

use super::*;

/// A framework on `F` with one task launched on the agent on `A`.
fn one_task(h: &mut Harness) -> (AgentId, FrameworkId, TaskInfo) {
    let agent = h.agent(A, "a1", "cpus:2;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    (agent, fw, t)
}

fn lifecycle(t: &TaskInfo, fw: FrameworkId) -> Vec<StatusUpdate> {
    [TaskState::Starting, TaskState::Running, TaskState::Finished]
        .into_iter()
        .enumerate()
        .map(|(i, s)| StatusUpdate {
            timestamp_ms: 100 + i as u64,
            ..agent_update(t, fw, s)
        })
        .collect()
}

fn forwarded(out: &[Output], conn: ConnId) -> Vec<UpdateId> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(c, MasterToFramework::Update(u)) if *c == conn => Some(u.update_id),
            _ => None,
        })
        .collect()
}

fn acks_to_agent(out: &[Output]) -> Vec<UpdateId> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToAgent(_, MasterToAgent::Acknowledge { update_id, .. }) => Some(*update_id),
            _ => None,
        })
        .collect()
}

fn ids(v: &[StatusUpdate]) -> Vec<UpdateId> {
    v.iter().map(|u| u.update_id).collect()
}

fn ack(h: &mut Harness, t: &TaskInfo, u: &StatusUpdate) -> Vec<Output> {
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Acknowledge {
            task_id: t.task_id,
            update_id: u.update_id,
        },
    })
}

#[test]
fn pipelined_updates_are_forwarded_in_order_and_acknowledged_in_any_order() {
    let mut h = Harness::new();
    let (_, fw, t) = one_task(&mut h);
    let ups = lifecycle(&t, fw);
    let mut out = Vec::new();
    for u in &ups {
        out.extend(h.input(Input::Agent {
            conn: A,
            msg: AgentToMaster::StatusUpdate(u.clone()),
        }));
    }
    assert_eq!(forwarded(&out, F), ids(&ups), "every update, in order");
    assert!(acks_to_agent(&out).is_empty());
    assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Finished);
    assert_eq!(h.m.tasks[&t.task_id].pending.len(), 3);
    assert!(
        h.m.tasks[&t.task_id].recovered,
        "the terminal update released the task's resources"
    );
    assert!(!offers_of(&out).is_empty(), "and they are offered again");
    // A retransmission of a pipelined update (RUNNING): forwarded again, state unchanged.
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(ups[1].clone()),
    });
    assert_eq!(forwarded(&out, F), vec![ups[1].update_id]);
    assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Finished);
    assert_eq!(h.m.tasks[&t.task_id].pending.len(), 3);
    assert_eq!(h.m.metrics(0).status_update_retries, 1);
    // Acknowledged out of order: each goes to the agent; the task completes with the last.
    assert_eq!(
        acks_to_agent(&ack(&mut h, &t, &ups[2])),
        vec![ups[2].update_id]
    );
    assert!(
        acks_to_agent(&ack(&mut h, &t, &ups[2])).is_empty(),
        "duplicate ack"
    );
    assert_eq!(
        acks_to_agent(&ack(&mut h, &t, &ups[0])),
        vec![ups[0].update_id]
    );
    assert!(h.m.tasks.contains_key(&t.task_id), "RUNNING still pending");
    // A retransmission of an acknowledged update is acknowledged by the master itself.
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(ups[0].clone()),
    });
    assert_eq!(acks_to_agent(&out), vec![ups[0].update_id]);
    assert!(forwarded(&out, F).is_empty());
    assert_eq!(
        acks_to_agent(&ack(&mut h, &t, &ups[1])),
        vec![ups[1].update_id]
    );
    assert!(!h.m.tasks.contains_key(&t.task_id));
    assert_eq!(
        h.m.completed_task(fw, t.task_id).map(|c| c.state),
        Some(TaskState::Finished)
    );
}

#[test]
fn a_resubscribing_framework_gets_every_pending_update_in_order() {
    let mut h = Harness::new();
    let (_, fw, t) = one_task(&mut h);
    h.input(Input::FrameworkDisconnected { conn: F });
    let ups = lifecycle(&t, fw);
    for u in &ups {
        h.input(Input::Agent {
            conn: A,
            msg: AgentToMaster::StatusUpdate(u.clone()),
        });
    }
    h.input(Input::FrameworkConnected {
        conn: 31,
        principal: "f".into(),
    });
    let out = h.input(Input::Framework {
        conn: 31,
        msg: FrameworkToMaster::Subscribe(info("f", "r", Some(fw))),
    });
    assert_eq!(forwarded(&out, 31), ids(&ups));
    // Acknowledged by the new connection, in order: all reach the agent.
    let mut acked = Vec::new();
    for u in &ups {
        acked.extend(acks_to_agent(&h.input(Input::Framework {
            conn: 31,
            msg: FrameworkToMaster::Acknowledge {
                task_id: t.task_id,
                update_id: u.update_id,
            },
        })));
    }
    assert_eq!(acked, ids(&ups));
    assert!(!h.m.tasks.contains_key(&t.task_id));
}

#[test]
fn a_reregistering_agent_delivers_its_pending_updates_in_order() {
    let mut h = Harness::new();
    let (agent, fw, t) = one_task(&mut h);
    let ups = lifecycle(&t, fw);
    // STARTING got through before the agent went away; the agent still has all three.
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(ups[0].clone()),
    });
    h.input(Input::AgentDisconnected { conn: A });
    h.now += 1_000;
    let AgentToMaster::Register { resources, .. } = register(None, "cpus:2;mem:1024") else {
        unreachable!()
    };
    let out = h.register(
        9,
        "a1",
        AgentToMaster::Register {
            agent_id: Some(agent),
            hostname: "h".into(),
            resources,
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: vec![],
            running_tasks: vec![RunningTask {
                framework_id: fw,
                task: t.clone(),
                state: TaskState::Finished,
                gpus: vec![],
                ports: vec![],
            }],
            pending_updates: ups.clone(),
            task_user: "nobody".into(),
        },
    );
    // STARTING again (a retransmission of a pending one), then RUNNING and FINISHED.
    assert_eq!(forwarded(&out, F), ids(&ups));
    assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Finished);
    assert_eq!(h.m.tasks[&t.task_id].pending.len(), 3);
    assert!(!out.iter().any(|o| matches!(o, Output::Close { .. })));
    for u in &ups {
        assert_eq!(
            acks_to_agent(&ack(&mut h, &t, u)),
            vec![u.update_id],
            "to the new connection"
        );
    }
    assert!(!h.m.tasks.contains_key(&t.task_id));
}

#[test]
fn an_agent_exceeding_the_pending_bound_is_closed_and_nothing_is_lost() {
    let mut h = Harness::new();
    let (_, fw, t) = one_task(&mut h);
    let ups: Vec<StatusUpdate> = (0..MAX_PENDING_UPDATES)
        .map(|_| agent_update(&t, fw, TaskState::Running))
        .collect();
    for u in &ups {
        let out = h.input(Input::Agent {
            conn: A,
            msg: AgentToMaster::StatusUpdate(u.clone()),
        });
        assert_eq!(forwarded(&out, F), vec![u.update_id]);
    }
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(agent_update(&t, fw, TaskState::Finished)),
    });
    assert!(
        out.iter().any(
            |o| matches!(o, Output::Close { conn: A, reason } if reason.contains("unacknowledged status updates"))
        ),
        "{out:?}"
    );
    assert!(forwarded(&out, F).is_empty());
    assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Running);
    assert_eq!(h.m.tasks[&t.task_id].pending.len(), MAX_PENDING_UPDATES);
    // A retransmission within the bound is still fine, and acks make room.
    assert_eq!(
        acks_to_agent(&ack(&mut h, &t, &ups[0])),
        vec![ups[0].update_id]
    );
    let fin = agent_update(&t, fw, TaskState::Finished);
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(fin.clone()),
    });
    assert_eq!(forwarded(&out, F), vec![fin.update_id]);
}

#[test]
fn a_removed_framework_has_its_pending_updates_acknowledged_by_the_master() {
    let mut h = Harness::new();
    let (_, fw, t) = one_task(&mut h);
    let ups = lifecycle(&t, fw);
    for u in &ups[..2] {
        h.input(Input::Agent {
            conn: A,
            msg: AgentToMaster::StatusUpdate(u.clone()),
        });
    }
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Teardown,
    });
    // The agent's retransmissions and its last update are acknowledged by the master.
    let mut acked = Vec::new();
    for u in &ups {
        acked.extend(acks_to_agent(&h.input(Input::Agent {
            conn: A,
            msg: AgentToMaster::StatusUpdate(u.clone()),
        })));
    }
    assert_eq!(acked, ids(&ups));
    assert!(!h.m.tasks.contains_key(&t.task_id));
}
