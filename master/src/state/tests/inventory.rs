//! The agent inventory (protocol v14): frameworks that ask hear of every agent, offered or not.

use super::*;

/// The agent summaries `out` sends on `conn`, in order.
fn summaries(out: &[Output], conn: ConnId) -> Vec<AgentSummary> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(c, MasterToFramework::Agents(a)) if *c == conn => Some(a.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn inventory_info(name: &str, role: &str) -> FrameworkInfo {
    let mut i = info(name, role, None);
    i.capabilities = vec![Capability::AgentInventory, Capability::GpuResources];
    i
}

#[test]
fn a_framework_that_asks_hears_of_every_agent_offered_or_not() {
    let mut h = Harness::new();
    // One agent, all of it statically reserved for another role: never offered to "ml".
    // (A registration's `resources` are the unreserved part.)
    let mut reg = register_with_gpus("cpus:1;mem:64", vec![gpu_info(0), gpu_info(1)]);
    if let AgentToMaster::Register { reserved, .. } = &mut reg {
        reserved.insert("other".into(), res("cpus:4;mem:1024;gpus:2"));
    }
    h.register(A, "a1", reg);
    let a1 = h.m.view(h.now, 0).agents[0].id.clone();

    // Without the capability: offers only (here none), no summaries.
    let plain = h.subscribe(F, "plain", info("plain", "ml", None));
    assert!(summaries(&plain, F).is_empty(), "{plain:?}");
    assert!(offers(&plain, F).is_empty());

    // With it: the listing follows the subscription.
    let out = h.subscribe(3, "queue", inventory_info("queue", "ml"));
    let at = out
        .iter()
        .position(|o| {
            matches!(
                o,
                Output::ToFramework(3, MasterToFramework::Subscribed { .. })
            )
        })
        .expect("subscribed");
    let first = out
        .iter()
        .position(|o| matches!(o, Output::ToFramework(3, MasterToFramework::Agents(_))))
        .expect("listed");
    assert!(at < first, "the listing comes after Subscribed");
    let listed = summaries(&out, 3);
    assert_eq!(listed.len(), 1);
    let s = &listed[0];
    assert_eq!((s.agent_id.to_string(), s.agent_name.as_str()), (a1, "a1"));
    assert_eq!(s.gpus.len(), 2);
    assert_eq!(s.reserved["other"].get("gpus"), 2.0);
    assert_eq!(
        s.for_role("ml").get("gpus"),
        0.0,
        "reserved for another role"
    );
    assert_eq!(s.for_role("other").get("gpus"), 2.0);

    // A new agent: both frameworks may get offers; only the one that asked gets its summary.
    let out = h.register(
        4,
        "a2",
        register_with_gpus("cpus:8;mem:4096;gpus:1", vec![gpu_info(7)]),
    );
    let added = summaries(&out, 3);
    assert_eq!(added.len(), 1, "{out:?}");
    assert_eq!(added[0].agent_name, "a2");
    assert_eq!(added[0].resources.get("gpus"), 1.0);
    assert!(summaries(&out, F).is_empty());

    // A GPU's health changes: the summary again, with the GPU marked.
    let out = h.input(Input::Agent {
        conn: 4,
        msg: AgentToMaster::GpuHealth {
            uuid: "GPU-7".into(),
            healthy: false,
            reason: "critical XID 79".into(),
        },
    });
    let changed = summaries(&out, 3);
    assert_eq!(changed.len(), 1, "{out:?}");
    assert!(!changed[0].gpus[0].healthy);
    assert_eq!(changed[0].resources.get("gpus"), 0.0);
    assert!(summaries(&out, F).is_empty());

    // An operator reserves part of it for the framework's role: the summary again.
    let a2 = added[0].agent_id;
    let out =
        h.m.operator_at(
            OperatorCommand::Reserve {
                agent_id: a2,
                role: "ml".into(),
                resources: res("cpus:2"),
            },
            h.now,
        )
        .unwrap();
    let reserved = summaries(&out, 3);
    assert_eq!(reserved.len(), 1, "{out:?}");
    assert_eq!(reserved[0].reserved["ml"], res("cpus:2"));
    assert_eq!(reserved[0].for_role("ml").get("cpus"), 8.0);

    // Re-subscribing (a failover of the framework) lists every agent again.
    let id =
        subscribed(&h.subscribe(3, "queue", inventory_info("queue", "ml"))).expect("subscribed");
    let mut again = inventory_info("queue", "ml");
    again.framework_id = Some(id);
    let out = h.subscribe(5, "queue", again);
    let mut names: Vec<String> = summaries(&out, 5)
        .into_iter()
        .map(|s| s.agent_name)
        .collect();
    names.sort();
    assert_eq!(names, ["a1", "a2"]);
}

#[test]
fn a_large_cluster_is_listed_within_the_frame_bound() {
    let mut h = Harness::new();
    // Agents with the largest attributes registration allows: a few per frame.
    let big: Attributes = (0..64)
        .map(|i| (format!("k{i:03}"), "v".repeat(1000)))
        .collect();
    for i in 0..80u64 {
        let mut reg = register(None, "cpus:1;mem:128");
        if let AgentToMaster::Register { attributes, .. } = &mut reg {
            *attributes = big.clone();
        }
        h.register(100 + i, &format!("big{i}"), reg);
    }
    let out = h.subscribe(F, "queue", inventory_info("queue", "ml"));
    let messages: Vec<&MasterToFramework> = out
        .iter()
        .filter_map(|o| match o {
            Output::ToFramework(F, m @ MasterToFramework::Agents(_)) => Some(m),
            _ => None,
        })
        .collect();
    assert!(messages.len() > 1, "split: {}", messages.len());
    for m in &messages {
        assert!(codec::encoded_len(m).unwrap() <= codec::MAX_FRAME);
    }
    assert_eq!(summaries(&out, F).len(), 80);
}
