//! Recovery after a failover: recovered agents re-registering, names kept until their deadline.

use super::*;

/// A new leader that recovered a registry holding agent `a1` (`id`, recorded `hostname`),
/// after `a1` re-registered with its id (hostname "h") on `conn`: the outputs.
fn reregister_after_recovery(id: AgentId, hostname: &str, conn: ConnId) -> Vec<Output> {
    let mut registry = crate::registry::Registry::default();
    registry.agents.insert(
        id,
        crate::registry::AgentRecord {
            id,
            name: "a1".into(),
            hostname: hostname.into(),
            deactivated: false,
        },
    );
    let mut h = Harness::new();
    h.m.recover(registry, 0);
    h.input(Input::AgentConnected {
        conn,
        name: "a1".into(),
        address: "127.0.0.1:1".into(),
    });
    h.input(Input::Agent {
        conn,
        msg: register(Some(id), "cpus:4"),
    })
}

#[test]
fn recovered_agents_reregister_without_rewriting_the_registry() {
    let mut h = Harness::new();
    let a = h.agent(1, "a1", "cpus:4");
    let persists = |out: &[Output]| {
        out.iter()
            .filter(|o| matches!(o, Output::Persist(_)))
            .count()
    };
    // A new leader recovers the registry that holds a1, then a1 re-registers with its id.
    let out = reregister_after_recovery(a, "h", 5);
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(5, MasterToAgent::Registered { agent_id, .. }) if *agent_id == a)));
    assert_eq!(
        persists(&out),
        0,
        "unchanged record is not rewritten: {out:?}"
    );
    // A changed hostname is written.
    let out = reregister_after_recovery(a, "old-host", 6);
    assert_eq!(persists(&out), 1, "{out:?}");
}

#[test]
fn a_recovered_agents_name_is_kept_for_it_until_its_deadline() {
    let id = AgentId::random();
    let mut registry = crate::registry::Registry::default();
    registry.agents.insert(
        id,
        crate::registry::AgentRecord {
            id,
            name: "a1".into(),
            hostname: "h".into(),
            deactivated: false,
        },
    );
    let mut h = Harness::new();
    h.m.recover(registry, 0);
    let out = h.register(10, "a1", register(None, "cpus:4"));
    let m = agent_refusal(&out, 10).expect("name kept for the recovering agent");
    assert!(m.contains("failover"), "{m}");
    let out = h.register(11, "other", register(Some(id), "cpus:4"));
    assert!(agent_refusal(&out, 11).is_some());
    let out = h.register(12, "a1", register(Some(id), "cpus:4"));
    assert!(out.iter().any(
        |o| matches!(o, Output::ToAgent(12, MasterToAgent::Registered { agent_id, .. }) if *agent_id == id)
    ));
}
