//! Dispatch and the allocation cycle: peers out of place, event-triggered cycles spaced by the gap.

use super::*;

#[test]
fn peers_out_of_place_are_closed() {
    let mut h = Harness::new();
    h.input(Input::AgentConnected {
        conn: A,
        name: "a".into(),
        address: "x".into(),
    });
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::Heartbeat,
    });
    assert!(matches!(out.as_slice(), [Output::Close { conn: A, .. }]));
    h.input(Input::FrameworkConnected {
        conn: F,
        principal: "f".into(),
    });
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Teardown,
    });
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Close { conn: F, .. })));
    let out = h.input(Input::Framework {
        conn: 77,
        msg: FrameworkToMaster::Teardown,
    });
    assert!(matches!(out.as_slice(), [Output::Close { conn: 77, .. }]));
    // Invalid subscriptions are refused with a reason.
    h.input(Input::FrameworkConnected {
        conn: 5,
        principal: "g".into(),
    });
    let out = h.input(Input::Framework {
        conn: 5,
        msg: FrameworkToMaster::Subscribe(info("g", "../etc", None)),
    });
    assert_eq!(errors(&out), vec![ErrorKind::InvalidRequest]);
}

#[test]
fn event_triggered_allocations_are_spaced_by_the_minimum_gap() {
    let mut m = Master::new(
        MasterConfig {
            allocation_min_gap_ms: 20,
            allocation_interval_ms: 1000,
            ..MasterConfig::default()
        },
        7,
    );
    let mut out = Vec::new();
    m.allocate(100, &mut out);
    assert!(!m.allocation_due(105), "nothing happened");
    assert_eq!(m.next_allocation_at(), None);
    m.handle(
        Input::AgentConnected {
            conn: 1,
            name: "a1".into(),
            address: "127.0.0.1:1".into(),
        },
        105,
    );
    m.handle(
        Input::Agent {
            conn: 1,
            msg: register(None, "cpus:1"),
        },
        105,
    );
    assert!(!m.allocation_due(105), "within the gap of the last cycle");
    assert_eq!(m.next_allocation_at(), Some(120));
    assert!(m.allocation_due(120));
    m.allocate(120, &mut out);
    assert!(!m.allocation_due(121));
    assert!(m.allocation_due(1120), "the batch interval still applies");
}
