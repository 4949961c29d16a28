//! Timers: agents lost after the re-register timeout, frameworks removed after their failover
//! timeout, [`Master::next_deadline`] (when the shell must wake the core) and the lease.

use super::*;

#[test]
fn lost_agent_loses_its_tasks_after_the_reregister_timeout() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:2;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(agent_update(&t, fw, TaskState::Running)),
    });
    h.input(Input::AgentDisconnected { conn: A });
    h.now += 5_000;
    let out = h.input(Input::Tick);
    assert!(!out.iter().any(|o| matches!(o, Output::ToFramework(_, MasterToFramework::Update(u)) if u.state == TaskState::Lost)));
    h.now += 6_000;
    let out = h.input(Input::Tick);
    assert!(out.iter().any(|o| matches!(o, Output::ToFramework(F, MasterToFramework::Update(u)) if u.state == TaskState::Lost && u.task_id == t.task_id)));
    assert!(h.m.agents.is_empty());
    assert!(h.m.allocator.framework_allocated(fw).is_empty());
}

#[test]
fn framework_not_back_in_time_has_its_tasks_killed() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:2;mem:1024");
    let (_fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    h.input(Input::FrameworkDisconnected { conn: F });
    h.now += 10_001;
    let out = h.input(Input::Tick);
    assert!(out.iter().any(|o| matches!(o, Output::ToAgent(A, MasterToAgent::KillTask { task_id, .. }) if *task_id == t.task_id)));
    assert!(h.m.frameworks.is_empty());
}

/// A harness whose batch allocation interval (an hour) does not hide the other deadlines.
fn quiet() -> Harness {
    Harness::with_config(MasterConfig {
        allocation_interval_ms: 3_600_000,
        ..MasterConfig::default()
    })
}

#[test]
fn the_next_deadline_is_the_earliest_timer_and_a_tick_then_clears_it() {
    let mut h = quiet();
    assert_eq!(
        h.m.next_deadline(0),
        Some(3_600_000),
        "only the batch cycle"
    );
    h.agent(A, "a1", "cpus:2;mem:1024");
    // A connected agent is due a heartbeat check one millisecond past its ping timeout.
    assert_eq!(h.m.next_deadline(0), Some(15_001));
    h.now = 100;
    h.input(Input::AgentDisconnected { conn: A });
    // Disconnected: lost one millisecond past its re-register timeout, not before.
    assert_eq!(h.m.next_deadline(100), Some(10_101));
    h.now = 10_100;
    h.input(Input::Tick);
    assert_eq!(h.m.agents.len(), 1, "not due yet");
    h.now = 10_101;
    h.input(Input::Tick);
    assert!(h.m.agents.is_empty(), "unreachable at its deadline");
    // Unreachable: gone one millisecond past its unreachable timeout.
    let gone_at = 10_101 + h.m.config.agent_unreachable_timeout_ms + 1;
    assert_eq!(h.m.next_deadline(10_101), Some(gone_at));
    h.now = gone_at;
    h.input(Input::Tick);
    assert!(h.m.recovered_agents.is_empty(), "gone at its deadline");
    let batch_only = |d: Option<Millis>| d.is_some_and(|d| d >= 3_600_000);
    assert!(batch_only(h.m.next_deadline(gone_at)));
    // A disconnected framework: its failover timeout (10 s in `info`).
    h.framework(F, "f", "r");
    let t = gone_at + 10_000;
    h.now = t;
    h.input(Input::FrameworkDisconnected { conn: F });
    assert_eq!(h.m.next_deadline(t), Some(t + 10_001));
    h.now = t + 10_001;
    h.input(Input::Tick);
    assert!(h.m.frameworks.is_empty());
    assert!(batch_only(h.m.next_deadline(t + 10_001)));
}

#[test]
fn an_event_triggered_cycle_and_offer_timeouts_are_deadlines() {
    let mut config = MasterConfig {
        allocation_interval_ms: 3_600_000,
        ..MasterConfig::default()
    };
    config.allocator.offer_timeout_ms = Some(5_000);
    // The default gap between event-triggered cycles (the harness sets it to zero).
    let mut m = Master::new(config, 7);
    m.handle(
        Input::AgentConnected {
            conn: A,
            name: "a1".into(),
            address: "127.0.0.1:1".into(),
        },
        0,
    );
    m.handle(
        Input::Agent {
            conn: A,
            msg: register(None, "cpus:2;mem:1024"),
        },
        0,
    );
    m.handle(
        Input::FrameworkConnected {
            conn: F,
            principal: "f".into(),
        },
        0,
    );
    m.handle(
        Input::Framework {
            conn: F,
            msg: FrameworkToMaster::Subscribe(info("f", "r", None)),
        },
        0,
    );
    // Events asked for a cycle: due after the minimum gap.
    let gap = MasterConfig::default().allocation_min_gap_ms;
    assert_eq!(m.next_deadline(0), Some(gap));
    let mut out = Vec::new();
    m.allocate(gap, &mut out);
    assert_eq!(offers(&out, F).len(), 1);
    // The offer times out 5 s after it was made; the agent's heartbeat check comes later.
    assert_eq!(m.next_deadline(gap), Some(gap + 5_000));
    let out = m.handle(Input::Tick, gap + 5_000);
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ToFramework(F, MasterToFramework::Rescind { .. }))));
    assert_eq!(m.next_deadline(gap + 5_000), Some(15_001));
}

#[test]
fn past_the_lease_deadline_the_core_neither_offers_nor_launches() {
    let mut h = Harness::new();
    h.input(Input::LeaseUntil { until: Some(500) });
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    assert_eq!(offers.len(), 1, "offers while the lease holds");
    assert!(h.m.leads_at(499));
    assert!(!h.m.leads_at(500));
    // The lease lapses before the accept arrives (the election has not said `Lost` yet).
    h.now = 500;
    let t = task("cpus:1");
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    assert!(
        !out.iter()
            .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::RunTask { .. }))),
        "launched past the lease: {out:?}"
    );
    assert!(out.iter().any(|o| matches!(o, Output::ToFramework(F, MasterToFramework::Error { message, .. }) if message.contains("lease has lapsed"))), "{out:?}");
    assert!(out.iter().any(|o| matches!(o, Output::ToFramework(F, MasterToFramework::Update(u))
        if u.task_id == t.task_id && u.state == TaskState::Error && u.reason == Some(TaskReason::LaunchFailed))), "{out:?}");
    assert!(h.m.tasks.is_empty());
    assert!(h.m.allocator.framework_allocated(fw).is_empty());
    // No cycle, however long past the batch interval, and no allocation deadline to wake for:
    // the next one is the agent's heartbeat check.
    h.now = 5_000;
    assert!(!h.m.allocation_due(h.now));
    let out = h.input(Input::Tick);
    assert!(offers_of(&out).is_empty(), "{out:?}");
    assert_eq!(h.m.next_deadline(h.now), Some(15_001));
    // Renewed: offers again, and launches.
    let out = h.input(Input::LeaseUntil {
        until: Some(120_000),
    });
    let offers = offers_of(&out);
    assert_eq!(offers.len(), 1, "{out:?}");
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![task("cpus:1")]),
    });
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(A, MasterToAgent::RunTask { .. }))));
}

#[test]
fn agent_timers_come_from_a_floor_that_an_early_tick_makes_exact_again() {
    let mut h = quiet();
    h.agent(A, "a1", "cpus:2;mem:1024");
    assert_eq!(h.m.next_deadline(0), Some(15_001));
    // Heard from at 5 s: its silence deadline moved to 20,001, the cached floor did not.
    h.now = 5_000;
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::Heartbeat,
    });
    assert_eq!(h.m.next_deadline(5_000), Some(15_001), "a lower bound");
    // The early tick finds nothing due; from then on the deadline is exact.
    h.now = 15_001;
    h.input(Input::Tick);
    assert_eq!(h.m.agents.len(), 1);
    assert!(h.m.agents.values().all(|a| a.conn.is_some()), "not silent");
    assert_eq!(h.m.next_deadline(15_001), Some(20_001));
    // A disconnect recomputes the floor: the re-register timeout replaces the silence check.
    h.input(Input::AgentDisconnected { conn: A });
    assert_eq!(h.m.next_deadline(15_001), Some(25_002));
    h.now = 25_002;
    h.input(Input::Tick);
    assert!(h.m.agents.is_empty(), "lost at its deadline");
}

/// Event-triggered cycles wait the minimum gap after a cheap cycle, and four times the last
/// cycle's duration after a long one (cycles take at most about a fifth of the core loop).
#[test]
fn the_gap_between_cycles_grows_with_the_last_cycle() {
    let mut h = Harness::new();
    h.m.config.allocation_min_gap_ms = 5;
    h.agent(A, "a1", "cpus:4;mem:1024");
    h.m.allocate(0, &mut Vec::new());
    h.m.allocation_pending = true;
    assert_eq!(h.m.allocation_gap_ms(), 5);
    assert_eq!(h.m.next_allocation_at(), Some(5));
    assert!(!h.m.allocation_due(4) && h.m.allocation_due(5));
    // A 12 ms cycle (as the shell measured it): the next waits 48 ms.
    h.input(Input::CycleTook { micros: 12_000 });
    assert_eq!(h.m.allocation_gap_ms(), 48);
    assert_eq!(h.m.next_allocation_at(), Some(48));
    assert!(!h.m.allocation_due(47) && h.m.allocation_due(48));
}
