//! Unit tests of the state machine's bounds on peers (issue 10, findings 5 and 6): offers split
//! under the frame limit, registration bounds, reconcile limits and slices, stalled peers.

use super::*;

const F: ConnId = 1_000_000;

fn master() -> Master {
    Master::new(
        MasterConfig {
            allocation_min_gap_ms: 0,
            ..MasterConfig::default()
        },
        11,
    )
}

fn step(m: &mut Master, input: Input, now: Millis) -> Vec<Output> {
    let mut out = m.handle(input, now);
    if m.allocation_due(now) {
        m.allocate(now, &mut out);
    }
    out
}

fn register(hostname: &str, attributes: Attributes) -> AgentToMaster {
    AgentToMaster::Register {
        agent_id: None,
        hostname: hostname.into(),
        resources: "cpus:4;mem:4096".parse().unwrap(),
        reserved: Default::default(),
        attributes,
        gpus: vec![],
        running_tasks: vec![],
        pending_updates: vec![],
        task_user: "nobody".into(),
    }
}

fn add_agent(m: &mut Master, conn: ConnId, attributes: Attributes) -> Vec<Output> {
    step(
        m,
        Input::AgentConnected {
            conn,
            name: format!("agent-{conn}"),
            address: "127.0.0.1:1".into(),
        },
        0,
    );
    step(
        m,
        Input::Agent {
            conn,
            msg: register(&format!("host-{conn}"), attributes),
        },
        0,
    )
}

fn subscribe(m: &mut Master, conn: ConnId, principal: &str) -> (FrameworkId, Vec<Output>) {
    step(
        m,
        Input::FrameworkConnected {
            conn,
            principal: principal.into(),
        },
        0,
    );
    let out = step(
        m,
        Input::Framework {
            conn,
            msg: FrameworkToMaster::Subscribe(FrameworkInfo {
                framework_id: None,
                name: principal.into(),
                roles: vec!["r".into()],
                capabilities: vec![],
                failover_timeout_secs: 60.0,
                min_allocatable: Vec::new(),
                suppressed_roles: Vec::new(),
            }),
        },
        0,
    );
    let id = out
        .iter()
        .find_map(|o| match o {
            Output::ToFramework(_, MasterToFramework::Subscribed { framework_id, .. }) => {
                Some(*framework_id)
            }
            _ => None,
        })
        .expect("subscribed");
    (id, out)
}

fn offer_messages(out: &[Output], conn: ConnId) -> Vec<&Vec<Offer>> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(c, MasterToFramework::Offers(v)) if *c == conn => Some(v),
            _ => None,
        })
        .collect()
}

fn big_attributes(bytes: usize) -> Attributes {
    (0..10)
        .map(|i| (format!("k{i}"), "v".repeat(bytes / 10)))
        .collect()
}

#[test]
fn offers_of_many_agents_with_large_attributes_are_split_under_the_frame_limit() {
    let mut m = master();
    for conn in 1..=200 {
        let out = add_agent(&mut m, conn, big_attributes(22_000));
        assert!(
            out.iter()
                .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::Registered { .. }))),
            "{out:?}"
        );
    }
    let (_, out) = subscribe(&mut m, F, "fw");
    let msgs = offer_messages(&out, F);
    assert!(msgs.len() >= 2, "one message of {} offers", msgs[0].len());
    let total: usize = msgs.iter().map(|v| v.len()).sum();
    assert_eq!(total, 200);
    for v in msgs {
        let msg = MasterToFramework::Offers(v.clone());
        assert!(
            codec::encode(&msg).is_ok(),
            "a batch exceeds the frame limit"
        );
    }
}

#[test]
fn registrations_past_the_bounds_are_refused_with_a_clear_error() {
    let cases: Vec<(AgentToMaster, &str)> = vec![
        (register(&"h".repeat(300), Attributes::new()), "hostname"),
        (
            register(
                "h",
                big_attributes(register_limits::MAX_ATTRIBUTES_BYTES + 100),
            ),
            "attributes have",
        ),
        (
            register(
                "h",
                (0..=register_limits::MAX_ATTRIBUTES)
                    .map(|i| (format!("k{i}"), "v".into()))
                    .collect(),
            ),
            "attributes; at most",
        ),
        (
            register("h", [("k".repeat(500), "v".to_string())].into()),
            "attribute name",
        ),
    ];
    let mut m = master();
    for (i, (msg, what)) in cases.into_iter().enumerate() {
        let conn = 10 + i as ConnId;
        step(
            &mut m,
            Input::AgentConnected {
                conn,
                name: format!("a{i}"),
                address: "x".into(),
            },
            0,
        );
        let out = step(&mut m, Input::Agent { conn, msg }, 0);
        let error = out.iter().find_map(|o| match o {
            Output::ToAgent(c, MasterToAgent::Error { message }) if *c == conn => Some(message),
            _ => None,
        });
        assert!(
            error.is_some_and(|e| e.contains("registration refused") && e.contains(what)),
            "{what}: {out:?}"
        );
        assert!(out
            .iter()
            .any(|o| matches!(o, Output::Close { conn: c, .. } if *c == conn)));
        assert!(!out
            .iter()
            .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::Registered { .. }))));
    }
    assert!(m.agents.is_empty());
}

fn updates(out: &[Output], conn: ConnId) -> usize {
    out.iter()
        .filter(|o| matches!(o, Output::ToFramework(c, MasterToFramework::Update(u)) if *c == conn && u.reconciliation))
        .count()
}

#[test]
fn a_reconcile_past_the_id_limit_is_refused() {
    let mut m = master();
    subscribe(&mut m, F, "fw");
    let ids: Vec<TaskId> = (0..=MAX_RECONCILE_IDS as u128)
        .map(TaskId::from_u128)
        .collect();
    let out = step(
        &mut m,
        Input::Framework {
            conn: F,
            msg: FrameworkToMaster::Reconcile { task_ids: ids },
        },
        1,
    );
    assert_eq!(updates(&out, F), 0);
    assert!(out.iter().any(|o| matches!(o,
        Output::ToFramework(_, MasterToFramework::Error { kind: ErrorKind::InvalidRequest, message })
            if message.contains(&MAX_RECONCILE_IDS.to_string()))));
    assert!(!m.has_backlog());
}

#[test]
fn a_long_reconcile_is_answered_in_slices_between_other_work() {
    let mut m = master();
    subscribe(&mut m, F, "fw");
    let other = F + 1;
    subscribe(&mut m, other, "other");
    let ids: Vec<TaskId> = (1..=MAX_RECONCILE_IDS as u128)
        .map(TaskId::from_u128)
        .collect();
    let out = step(
        &mut m,
        Input::Framework {
            conn: F,
            msg: FrameworkToMaster::Reconcile { task_ids: ids },
        },
        1,
    );
    // Nothing at once: answers come from the backlog.
    assert_eq!(updates(&out, F), 0);
    assert!(m.has_backlog());
    // Another framework's request is answered in between.
    let out = step(
        &mut m,
        Input::Framework {
            conn: other,
            msg: FrameworkToMaster::Reconcile {
                task_ids: vec![TaskId::from_u128(1)],
            },
        },
        2,
    );
    assert_eq!(updates(&out, other), 0);
    // A peer with no room in its outbox gets nothing; with room, a slice at a time, round
    // robin between the frameworks.
    let mut out = Vec::new();
    assert!(!m.work_backlog(3, &mut out, |_| 0));
    assert!(out.is_empty());
    let mut out = Vec::new();
    assert!(m.work_backlog(3, &mut out, |_| usize::MAX));
    assert_eq!(updates(&out, F), RECONCILE_SLICE);
    let mut out = Vec::new();
    assert!(m.work_backlog(3, &mut out, |_| usize::MAX));
    assert_eq!(updates(&out, other), 1);
    // Room for fewer messages than a slice: that many.
    let mut out = Vec::new();
    assert!(m.work_backlog(3, &mut out, |_| 10));
    assert_eq!(updates(&out, F), 10);
    let mut answered = RECONCILE_SLICE + 10;
    let mut slices = 2;
    while m.has_backlog() {
        let mut out = Vec::new();
        assert!(m.work_backlog(3, &mut out, |_| usize::MAX));
        let n = updates(&out, F);
        assert!(n > 0 && n <= RECONCILE_SLICE);
        answered += n;
        slices += 1;
    }
    assert_eq!(answered, MAX_RECONCILE_IDS);
    assert_eq!(
        slices,
        (MAX_RECONCILE_IDS - 10).div_ceil(RECONCILE_SLICE) + 1
    );
}

#[test]
fn reconciles_waiting_past_the_pending_bound_are_refused_and_a_gone_framework_is_dropped() {
    let mut m = master();
    subscribe(&mut m, F, "fw");
    let ids: Vec<TaskId> = (1..=MAX_RECONCILE_IDS as u128)
        .map(TaskId::from_u128)
        .collect();
    let mut refused = 0;
    for _ in 0..(MAX_PENDING_RECONCILE_IDS / MAX_RECONCILE_IDS + 3) {
        let out = step(
            &mut m,
            Input::Framework {
                conn: F,
                msg: FrameworkToMaster::Reconcile {
                    task_ids: ids.clone(),
                },
            },
            1,
        );
        refused += errors_containing(&out, "still being answered");
    }
    assert!(refused >= 1, "no reconcile was refused");
    // The framework disconnects: its backlog is dropped without answers.
    step(&mut m, Input::FrameworkDisconnected { conn: F }, 2);
    let mut out = Vec::new();
    while m.has_backlog() {
        m.work_backlog(3, &mut out, |_| usize::MAX);
    }
    assert!(out.is_empty(), "{} answers to a gone framework", out.len());
}

fn errors_containing(out: &[Output], text: &str) -> usize {
    out.iter()
        .filter(|o| matches!(o, Output::ToFramework(_, MasterToFramework::Error { message, .. }) if message.contains(text)))
        .count()
}

#[test]
fn a_stalled_framework_is_disconnected_and_its_offers_go_to_another() {
    let mut m = master();
    add_agent(&mut m, 1, Attributes::new());
    let (greedy, out) = subscribe(&mut m, F, "greedy");
    assert_eq!(offer_messages(&out, F).len(), 1);
    let other = F + 1;
    let (_, out) = subscribe(&mut m, other, "other");
    assert!(
        offer_messages(&out, other).is_empty(),
        "the agent is offered to greedy"
    );
    // The shell gave up on greedy: it is disconnected now, its offer returns to the pool and
    // goes to the other framework.
    let out = step(&mut m, Input::PeerStalled { conn: F }, 5);
    assert_eq!(offer_messages(&out, other).len(), 1, "{out:?}");
    let f = &m.frameworks[&greedy];
    assert_eq!((f.conn, f.disconnected_at), (None, Some(5)));
    // Its failover timeout (60 s) applies: removed after it.
    step(&mut m, Input::Tick, 60_006);
    assert!(!m.frameworks.contains_key(&greedy));
}

#[test]
fn a_stalled_agent_is_disconnected_and_its_offers_rescinded() {
    let mut m = master();
    add_agent(&mut m, 1, Attributes::new());
    let (_, out) = subscribe(&mut m, F, "fw");
    let offer = offer_messages(&out, F)[0][0].id;
    let out = step(&mut m, Input::PeerStalled { conn: 1 }, 5);
    assert!(out.iter().any(|o| matches!(o,
        Output::ToFramework(c, MasterToFramework::Rescind { offer_id }) if *c == F && *offer_id == offer)));
    // The re-register timeout applies.
    let at = 5 + m.config.agent_reregister_timeout_ms + 1;
    step(&mut m, Input::Tick, at);
    assert!(m.agents.is_empty());
}

#[test]
fn a_decline_of_many_unknown_offers_is_one_error() {
    let mut m = master();
    subscribe(&mut m, F, "fw");
    let out = step(
        &mut m,
        Input::Framework {
            conn: F,
            msg: FrameworkToMaster::Decline {
                offer_ids: (0..100_000).map(OfferId::from_u128).collect(),
                refuse_seconds: None,
            },
        },
        1,
    );
    assert_eq!(out.len(), 1, "{} messages", out.len());
    assert_eq!(errors_containing(&out, "100000 offers"), 1, "{out:?}");
}
