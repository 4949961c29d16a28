//! Task lifecycle: records, bounded history, resources returning when tasks end, acknowledgements.

use super::*;

#[test]
fn task_records_keep_reason_exit_times_and_gpus() {
    let mut h = Harness::new();
    let agent = h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1;mem:64");
    h.now = 1_000;
    run_tasks(&mut h, offers[0].id, vec![t.clone()]);
    h.now = 2_000;
    let mut running = agent_update(&t, fw, TaskState::Running);
    running.gpus = vec!["GPU-1".into()];
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(running.clone()),
    });
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Acknowledge {
            task_id: t.task_id,
            update_id: running.update_id,
        },
    });
    h.now = 5_000;
    let mut oom = agent_update(&t, fw, TaskState::Failed);
    oom.reason = Some(TaskReason::MemoryLimit);
    oom.message = "memory-limit: the task exceeded its memory limit of 64 MiB".into();
    oom.signal = Some(9);
    oom.gpus = vec!["GPU-1".into()];
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(oom.clone()),
    });
    // Ended but not yet acknowledged: still among the tasks, with its end recorded.
    let view = h.m.view(h.now, 1_000_000);
    let v = &view.tasks[0];
    assert_eq!(
        (v.state.as_str(), v.reason.as_deref()),
        ("FAILED", Some("memory-limit"))
    );
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Acknowledge {
            task_id: t.task_id,
            update_id: oom.update_id,
        },
    });
    let view = h.m.view(h.now, 1_000_000);
    assert!(view.tasks.is_empty());
    let c = &view.completed_tasks[0];
    assert_eq!(c.id, t.task_id.to_string());
    assert_eq!(c.name, t.name);
    assert_eq!(c.agent_id, agent.to_string());
    assert_eq!(c.role, "r");
    assert_eq!(c.user.as_deref(), Some("nobody"));
    assert_eq!(c.gpus, vec!["GPU-1".to_string()]);
    assert_eq!(c.reason.as_deref(), Some("memory-limit"));
    assert!(c.message.contains("64 MiB"));
    assert_eq!((c.exit_code, c.signal), (None, Some(9)));
    // Master clock 1 s, 2 s, 5 s; the wall clock reads 1,000,000 at 5 s.
    assert_eq!(
        (c.staged_at_ms, c.started_at_ms, c.ended_at_ms),
        (996_000, Some(997_000), Some(1_000_000))
    );
    // Reconciliation answers from the record (from the backlog, as the framework reads).
    let mut out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Reconcile {
            task_ids: vec![t.task_id],
        },
    });
    h.m.work_backlog(h.now, &mut out, |_| usize::MAX);
    assert!(out.iter().any(|o| matches!(o, Output::ToFramework(F, MasterToFramework::Update(u))
        if u.reconciliation && u.state == TaskState::Failed && u.reason == Some(TaskReason::MemoryLimit) && u.signal == Some(9))));
}

/// Runs `n` one-cpu tasks of the framework on `F` to FINISHED (acknowledged), each on an
/// offer outstanding at the time (starting with `offers`); returns their ids.
fn finish_tasks(h: &mut Harness, fw: FrameworkId, mut offers: Vec<Offer>, n: usize) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let offer = offers.pop().expect("an outstanding offer");
        let t = task("cpus:1");
        let (sent, out) = run_tasks(h, offer.id, vec![t.clone()]);
        assert_eq!(sent.len(), 1);
        offers.extend(offers_of(&out));
        let done = agent_update(&t, fw, TaskState::Finished);
        let out = h.input(Input::Agent {
            conn: A,
            msg: AgentToMaster::StatusUpdate(done.clone()),
        });
        offers.extend(offers_of(&out));
        let out = h.input(Input::Framework {
            conn: F,
            msg: FrameworkToMaster::Acknowledge {
                task_id: t.task_id,
                update_id: done.update_id,
            },
        });
        offers.extend(offers_of(&out));
        h.now += 1;
        ids.push(t.task_id);
    }
    ids
}

#[test]
fn kept_messages_are_bounded() {
    assert_eq!(kept_message("short"), "short");
    let long = "é".repeat(1000);
    let cut = kept_message(&long);
    assert!(
        cut.len() <= MAX_KEPT_MESSAGE && cut.ends_with('…'),
        "{}",
        cut.len()
    );
}

#[test]
fn completed_history_is_bounded_per_framework_and_by_completed_frameworks() {
    let mut h = Harness::new();
    h.m.config.max_completed_tasks_per_framework = 3;
    h.m.config.max_completed_frameworks = 1;
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let ids = finish_tasks(&mut h, fw, offers, 5);
    let kept: Vec<String> =
        h.m.view(h.now, 0)
            .completed_tasks
            .iter()
            .map(|c| c.id.clone())
            .collect();
    let newest: Vec<String> = ids[2..].iter().map(|i| i.to_string()).collect();
    assert_eq!(kept, newest, "the oldest are dropped first");
    // Torn down: the framework and its history stay, as a completed framework.
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Teardown,
    });
    let view = h.m.view(h.now, 0);
    assert_eq!(view.completed_frameworks.len(), 1);
    assert_eq!(view.completed_frameworks[0].id, fw.to_string());
    assert_eq!(view.completed_tasks.len(), 3);
    // A second framework completes: the first (oldest) goes, with its tasks.
    h.input(Input::FrameworkDisconnected { conn: F });
    let (fw2, _) = h.framework(F + 10, "g", "r");
    h.input(Input::Framework {
        conn: F + 10,
        msg: FrameworkToMaster::Teardown,
    });
    let view = h.m.view(h.now, 0);
    let gone: Vec<String> = view
        .completed_frameworks
        .iter()
        .map(|f| f.id.clone())
        .collect();
    assert_eq!(gone, vec![fw2.to_string()]);
    assert!(view.completed_tasks.is_empty());
    assert!(h.m.completed.is_empty());
}

#[test]
fn accepted_resources_return_when_tasks_end_and_acks_flow_back() {
    let mut h = Harness::new();
    let agent = h.agent(A, "a1", "cpus:2;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:2;mem:1024");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    assert!(h.m.allocator.framework_allocated(fw).total() == res("cpus:2;mem:1024"));
    // FINISHED from the agent goes to the framework, not yet acked to the agent.
    let done = agent_update(&t, fw, TaskState::Finished);
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(done.clone()),
    });
    assert!(out.iter().any(|o| matches!(o, Output::ToFramework(F, MasterToFramework::Update(u)) if u.update_id == done.update_id && u.agent_id == Some(agent))));
    assert!(!out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::Acknowledge { .. }))));
    // Resources are back and offered again at once.
    assert!(!offers_of(&out).is_empty());
    // The framework's ack reaches the agent; the task completes.
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Acknowledge {
            task_id: t.task_id,
            update_id: done.update_id,
        },
    });
    assert!(out.iter().any(|o| matches!(o, Output::ToAgent(A, MasterToAgent::Acknowledge { update_id, .. }) if *update_id == done.update_id)));
    assert!(!h.m.tasks.contains_key(&t.task_id));
    assert_eq!(
        h.m.completed_task(fw, t.task_id).map(|c| c.state),
        Some(TaskState::Finished)
    );
    assert_eq!(h.m.metrics(0).status_update_retries, 0);
    let completed = h.m.metrics(0).tasks_completed;
    assert_eq!(completed["FINISHED"], 1, "{completed:?}");
    assert_eq!(completed["FAILED"], 0, "{completed:?}");
    // A retransmission of an acknowledged update is acknowledged, not redelivered.
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(done),
    });
    assert_eq!(
        h.m.metrics(0).status_update_retries,
        1,
        "counted for /metrics"
    );
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(A, MasterToAgent::Acknowledge { .. }))));
    assert!(!out
        .iter()
        .any(|o| matches!(o, Output::ToFramework(_, MasterToFramework::Update(_)))));
}

#[test]
fn task_records_keep_the_agents_ports_and_refuse_fractions_of_a_port() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:1024;ports:10");
    let (fw, offers) = h.framework(F, "f", "r");
    assert_eq!(offers[0].resources.get("ports"), 10.0);
    let t = task("cpus:1;mem:64;ports:2");
    let half = task("cpus:1;mem:64;ports:0.5");
    let (sent, out) = run_tasks(&mut h, offers[0].id, vec![t.clone(), half.clone()]);
    assert_eq!(sent.len(), 1, "only the whole-port task goes to the agent");
    let refused = out.iter().any(|o| {
        matches!(o, Output::ToFramework(_, MasterToFramework::Update(u))
            if u.task_id == half.task_id && u.state == TaskState::Error
                && u.message.contains("whole ports"))
    });
    assert!(refused, "{out:?}");
    // An agent's list longer than the task asked for is not kept.
    let mut bogus = agent_update(&t, fw, TaskState::Starting);
    bogus.ports = vec![1, 2, 3];
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(bogus),
    });
    assert!(h.m.view(h.now, 1_000_000).tasks[0].ports.is_empty());
    let mut running = agent_update(&t, fw, TaskState::Running);
    running.ports = vec![31000, 31001];
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(running),
    });
    let view = h.m.view(h.now, 1_000_000);
    assert_eq!(view.tasks[0].ports, vec![31000, 31001]);
    // The framework hears them with the update.
    assert!(out.iter().any(|o| matches!(o,
        Output::ToFramework(_, MasterToFramework::Update(u)) if u.ports == vec![31000, 31001])));
}
