//! The numbers behind `/metrics`.

use super::*;

#[test]
fn metrics_count_tasks_agents_frameworks_and_resources_by_state() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1;mem:256");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(agent_update(&t, fw, TaskState::Running)),
    });
    // A retransmission of the update the framework has not acknowledged yet.
    let again = agent_update(&t, fw, TaskState::Running);
    let pending = h.m.tasks[&t.task_id].pending[0].clone();
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(StatusUpdate {
            update_id: pending.update_id,
            ..again
        }),
    });
    let m = h.m.metrics(5_000);
    assert_eq!(m.tasks["RUNNING"], 1);
    assert_eq!(m.tasks["FINISHED"], 0, "every state has a value");
    assert_eq!(m.agents["connected"], 1);
    assert_eq!(m.agents["disconnected"], 0);
    assert_eq!(m.frameworks["connected"], 1);
    assert_eq!(m.resources["total"], res("cpus:4;mem:1024"));
    assert_eq!(m.resources["used"], res("cpus:1;mem:256"));
    assert_eq!(m.status_update_retries, 1);
    let share = h.m.allocator.framework_share(fw);
    assert_eq!(m.framework_shares.len(), 1);
    assert_eq!(m.framework_shares[0].role, "r");
    assert_eq!(m.framework_shares[0].share, share);
    // The framework held its allocation from time 0: resource-seconds accrued to 5 s.
    let role = m
        .resource_seconds
        .iter()
        .find(|r| r.role == "r" && r.framework.is_none())
        .unwrap();
    assert!(role.seconds["cpus"] > 0.0, "{role:?}");
    h.input(Input::AgentDisconnected { conn: A });
    let m = h.m.metrics(6_000);
    assert_eq!(m.agents["connected"], 0);
    assert_eq!(m.agents["disconnected"], 1);
}
