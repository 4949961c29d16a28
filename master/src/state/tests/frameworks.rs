//! Frameworks: failover, ids, role ACLs and per-principal limits, forgotten roles.

use super::*;

#[test]
fn framework_failover_within_timeout_keeps_tasks_and_gets_pending_updates() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:2;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    h.input(Input::FrameworkDisconnected { conn: F });
    // An update while it is away waits for it.
    let running = agent_update(&t, fw, TaskState::Running);
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(running.clone()),
    });
    h.now += 5_000;
    h.input(Input::Tick);
    // Another principal can not take the framework id.
    h.input(Input::FrameworkConnected {
        conn: 30,
        principal: "thief".into(),
    });
    let out = h.input(Input::Framework {
        conn: 30,
        msg: FrameworkToMaster::Subscribe(info("thief", "r", Some(fw))),
    });
    assert_eq!(errors(&out), vec![ErrorKind::InvalidRequest]);
    // The owner comes back in time.
    h.input(Input::FrameworkConnected {
        conn: 31,
        principal: "f".into(),
    });
    let out = h.input(Input::Framework {
        conn: 31,
        msg: FrameworkToMaster::Subscribe(info("f", "r", Some(fw))),
    });
    assert!(out.iter().any(|o| matches!(o, Output::ToFramework(31, MasterToFramework::Update(u)) if u.update_id == running.update_id)));
    h.now += 60_000;
    let out = h.input(Input::Tick);
    assert!(!out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::KillTask { .. }))));
}

#[test]
fn framework_ids_cannot_be_preclaimed_or_taken_over() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:2;mem:1024");
    let (victim, _) = h.framework(F, "victim", "r");
    // A made-up id (say, the "next" one): refused, nothing registered under it.
    let guess = FrameworkId::from_u128(victim.0.as_u128().wrapping_add(1));
    let out = h.subscribe(10, "attacker", info("x", "r", Some(guess)));
    let m = refusal(&out, 10).expect("unknown id refused");
    assert!(m.contains("not registered"), "{m}");
    assert!(!h.m.frameworks.contains_key(&guess));
    // The victim's id under another principal: refused, the victim keeps its connection.
    let out = h.subscribe(11, "attacker", info("x", "r", Some(victim)));
    let m = refusal(&out, 11).expect("foreign id refused");
    assert!(m.contains("another principal"), "{m}");
    assert_eq!(h.m.frameworks[&victim].conn, Some(F));
    assert!(!out
        .iter()
        .any(|o| matches!(o, Output::Close { conn: F, .. })));
    // Its own principal resumes it (failover).
    let out = h.subscribe(12, "victim", info("victim", "r", Some(victim)));
    assert!(refusal(&out, 12).is_none(), "{out:?}");
    assert_eq!(h.m.frameworks[&victim].conn, Some(12));
    // Fresh ids are random (not seed ^ counter) and distinct.
    let (a, _) = h.framework(13, "p", "r");
    let (b, _) = h.framework(14, "p", "r");
    assert_ne!(a, b);
    assert_ne!(a.0.as_u128() ^ b.0.as_u128(), 3, "ids look sequential");
}

#[test]
fn a_generated_id_already_in_use_is_never_handed_out_again() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    // The first three draws collide; then fresh values.
    fn source() -> u128 {
        let n = DRAWS.fetch_add(1, Ordering::Relaxed);
        if n < 3 {
            42
        } else {
            1000 + u128::from(n)
        }
    }
    let mut h = Harness::new();
    h.m.set_id_source(source);
    let (first, _) = h.framework(F, "one", "r");
    assert_eq!(first.0.as_u128(), 42);
    let (second, _) = h.framework(10, "two", "r");
    assert_ne!(second, first);
    assert_eq!(h.m.frameworks[&first].principal, "one");
    let agent = h.agent(A, "a1", "cpus:1");
    let other = h.agent(11, "a2", "cpus:1");
    assert_ne!(agent, other);
    assert_eq!(h.m.agents.len(), 2);
}

#[test]
fn roles_need_an_acl_grant_once_acls_exist() {
    let acls = crate::security::acl::Acls::from_toml(
        r#"
        [[register_frameworks]]
        principals = ["alice"]
        roles = ["analytics", "eng/*"]
        "#,
    )
    .unwrap();
    let mut h = Harness::with_config(MasterConfig {
        acls,
        ..MasterConfig::default()
    });
    let out = h.subscribe(10, "mallory", info("m", "analytics", None));
    let m = refusal(&out, 10).expect("denied");
    assert!(
        m.contains("\"mallory\"") && m.contains("\"analytics\""),
        "{m}"
    );
    // One denied role refuses the whole subscription.
    let mut two = info("a", "analytics", None);
    two.roles.push("eng".into());
    let out = h.subscribe(11, "alice", two);
    let m = refusal(&out, 11).expect("eng itself is not granted");
    assert!(m.contains("\"eng\""), "{m}");
    let mut ok = info("a", "analytics", None);
    ok.roles.push("eng/ml".into());
    let out = h.subscribe(12, "alice", ok.clone());
    assert!(refusal(&out, 12).is_none(), "{out:?}");
    let id = out
        .iter()
        .find_map(|o| match o {
            Output::ToFramework(12, MasterToFramework::Subscribed { framework_id, .. }) => {
                Some(*framework_id)
            }
            _ => None,
        })
        .expect("subscribed");
    // A failover may not add a role the principal lacks.
    ok.framework_id = Some(id);
    ok.roles.push("prod".into());
    let out = h.subscribe(13, "alice", ok);
    assert!(refusal(&out, 13).is_some());
    assert_eq!(h.m.frameworks[&id].roles, vec!["analytics", "eng/ml"]);
    assert_eq!(h.m.frameworks.len(), 1);
}

#[test]
fn subscriptions_are_bounded_per_principal() {
    let mut h = Harness::with_config(MasterConfig {
        limits: Limits {
            frameworks_per_principal: 2,
            roles_per_framework: 4,
            role_depth: 3,
            role_name_length: 20,
            ..Limits::default()
        },
        ..MasterConfig::default()
    });
    let mut many = info("m", "r0", None);
    many.roles = (0..50_000).map(|i| format!("r{i}")).collect();
    let out = h.subscribe(10, "p", many);
    let m = refusal(&out, 10).expect("too many roles");
    assert!(m.contains("50000 roles") && m.contains("limit is 4"), "{m}");
    assert_eq!(h.m.allocator.role_names().count(), 0, "no role was created");
    let out = h.subscribe(11, "p", info("m", "a/b/c/d", None));
    assert!(refusal(&out, 11).expect("too deep").contains("4 levels"));
    let out = h.subscribe(12, "p", info("m", &"x".repeat(21), None));
    assert!(refusal(&out, 12).expect("too long").contains("21 bytes"));
    let mut mins = info("m", "r", None);
    mins.min_allocatable = (0..17)
        .map(|i| Resources::parse(&format!("cpus:{}", i + 1)).expect("quantity"))
        .collect();
    let out = h.subscribe(20, "p", mins.clone());
    let m = refusal(&out, 20).expect("too many minimum quantities");
    assert!(m.contains("17 minimum allocatable quantities"), "{m}");
    mins.min_allocatable = vec![Resources::parse(
        &(0..17)
            .map(|i| format!("k{i}:1"))
            .collect::<Vec<_>>()
            .join(";"),
    )
    .expect("quantity")];
    assert!(
        refusal(&h.subscribe(21, "p", mins), 21).is_some(),
        "17 kinds"
    );
    let (a, _) = h.framework(13, "p", "r");
    h.framework(14, "p", "r");
    let out = h.subscribe(15, "p", info("third", "r", None));
    let m = refusal(&out, 15).expect("third framework");
    assert!(m.contains("already has 2 frameworks"), "{m}");
    // Another principal is not affected.
    h.framework(16, "q", "r");
    // Once one is gone, the principal may register another.
    h.input(Input::Framework {
        conn: 13,
        msg: FrameworkToMaster::Teardown,
    });
    assert!(!h.m.frameworks.contains_key(&a));
    h.framework(17, "p", "r");
    // A failover may not grow a framework past the role limit either.
    let (b, _) = h.framework(18, "q", "r");
    let mut more = info("q", "r", Some(b));
    more.roles = vec!["s1".into(), "s2".into(), "s3".into(), "s4".into()];
    let out = h.subscribe(19, "q", more);
    assert!(refusal(&out, 19).expect("5 roles").contains("5 roles"));
}

#[test]
fn roles_nothing_uses_are_forgotten() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:2;mem:1024");
    let mut many = info("m", "r0", None);
    many.roles = (0..50).map(|i| format!("tmp/r{i}")).collect();
    let out = h.subscribe(10, "p", many);
    assert!(refusal(&out, 10).is_none());
    h.framework(11, "keep", "kept");
    h.m.operator(OperatorCommand::SetWeight {
        role: "weighted".into(),
        weight: 2.0,
    })
    .unwrap();
    assert_eq!(h.m.allocator.role_names().count(), 53);
    h.input(Input::Framework {
        conn: 10,
        msg: FrameworkToMaster::Teardown,
    });
    let mut names: Vec<&str> = h.m.allocator.role_names().collect();
    names.sort();
    assert_eq!(names, vec!["kept", "weighted"]);
    // A framework whose failover timeout ends is forgotten with its roles too.
    h.input(Input::FrameworkDisconnected { conn: 11 });
    h.now += 11_000;
    h.input(Input::Tick);
    assert_eq!(
        h.m.allocator.role_names().collect::<Vec<_>>(),
        vec!["weighted"]
    );
    // A weight back at the default keeps nothing either.
    h.m.operator(OperatorCommand::SetWeight {
        role: "weighted".into(),
        weight: 1.0,
    })
    .unwrap();
    assert_eq!(h.m.allocator.role_names().count(), 0);
}

/// `suppressed_roles` at subscription (Mesos's `Subscribe.suppressed_roles`): nothing is offered
/// there until the framework revives; on failover the framework is suppressed in exactly the
/// roles it lists; a role it does not subscribe with is refused.
#[test]
fn a_framework_subscribing_suppressed_is_offered_nothing_until_it_revives() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:2;mem:1024");
    let mut quiet = info("fw", "r", None);
    quiet.suppressed_roles = vec!["r".into()];
    let out = h.subscribe(F, "p", quiet.clone());
    let id = subscribed(&out).expect("subscribed");
    assert!(offers(&out, F).is_empty(), "subscribed suppressed");
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Revive { roles: vec![] },
    });
    assert_eq!(offers(&out, F).len(), 1, "offered once revived");

    // Failover, suppressed again: its offers went with the old connection, none come back.
    h.input(Input::FrameworkDisconnected { conn: F });
    quiet.framework_id = Some(id);
    let out = h.subscribe(12, "p", quiet.clone());
    assert!(refusal(&out, 12).is_none());
    assert!(offers(&out, 12).is_empty(), "re-subscribed suppressed");
    // Failover listing no suppressed role: revived.
    h.input(Input::FrameworkDisconnected { conn: 12 });
    quiet.suppressed_roles.clear();
    let out = h.subscribe(13, "p", quiet);
    assert_eq!(offers(&out, 13).len(), 1, "re-subscribed revived");

    let mut bad = info("other", "r", None);
    bad.suppressed_roles = vec!["elsewhere".into()];
    let out = h.subscribe(14, "q", bad);
    let m = refusal(&out, 14).expect("a suppressed role it does not subscribe with");
    assert!(m.contains("elsewhere"), "{m}");
    let mut many = info("other", "r", None);
    many.suppressed_roles = vec!["r".into(); 2];
    let out = h.subscribe(15, "q", many);
    let m = refusal(&out, 15).expect("more suppressed roles than roles");
    assert!(m.contains("2 suppressed roles"), "{m}");
}
