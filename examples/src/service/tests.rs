//! The service framework's pure logic: instances, health, rolling updates.

use super::*;

fn def(n: usize, cmd: &str) -> ServiceDef {
    ServiceDef {
        instances: n,
        command: cmd.into(),
        cpus: 0.1,
        mem: 32.0,
        spread: true,
        ports: 1,
        health: None,
        env: Default::default(),
    }
}

fn offer(agent: AgentId) -> Offer {
    Offer {
        id: OfferId::random(),
        framework_id: FrameworkId::random(),
        agent_id: agent,
        hostname: "h".into(),
        role: "r".into(),
        resources: "cpus:4;mem:1024;ports:10".parse().unwrap(),
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: Default::default(),
        gpu_free: Default::default(),
        agent_name: "a".into(),
    }
}

fn upd(t: TaskId, state: TaskState) -> StatusUpdate {
    StatusUpdate::new(t, FrameworkId::random(), state)
}

fn launched(a: &[Action]) -> Vec<TaskInfo> {
    a.iter()
        .filter_map(|x| match x {
            Action::Launch(_, t) => Some(t.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn spreads_restarts_with_backoff_and_rolls_one_at_a_time() {
    let t0 = Instant::now();
    let mut c = ServiceCore::new("web", def(2, "v1"));
    let (a, b) = (AgentId::random(), AgentId::random());
    // Spread: one instance per agent even though an offer fits both.
    let l = launched(&c.offers(vec![offer(a)], t0));
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].name, "web/0");
    // Ports are asked of the master as a resource; the agent picks them.
    assert_eq!(l[0].resources.get("ports"), 1.0);
    assert!(!l[0].env.contains_key("PORT"));
    let l2 = launched(&c.offers(vec![offer(a), offer(b)], t0));
    assert_eq!(l2.len(), 1);
    for (t, port) in [(&l[0], 31000), (&l2[0], 31007)] {
        let mut u = upd(t.task_id, TaskState::Running);
        u.ports = vec![port];
        c.update(&u, t0);
    }
    assert_eq!(c.status().up, 2);
    // The port for the health check is the one the agent gave.
    let checks = c.to_check(t0);
    assert!(checks.is_empty(), "no health check in this definition");
    assert_eq!(c.slots()[1].port, Some(31007));
    // A crash: restarted only after the backoff.
    c.update(&upd(l[0].task_id, TaskState::Failed), t0);
    assert_eq!(c.status().up, 1);
    assert!(launched(&c.offers(vec![offer(a)], t0)).is_empty());
    let t1 = t0 + Duration::from_millis(500);
    let l3 = launched(&c.offers(vec![offer(a)], t1));
    assert_eq!(l3.len(), 1);
    assert_eq!(
        c.slots()[0].port,
        None,
        "a new task: its port is not known yet"
    );
    c.update(&upd(l3[0].task_id, TaskState::Running), t1);
    // A new definition: one instance killed at a time, only while all are up.
    c.set_definition(def(2, "v2"));
    let k = c.tick(t1);
    assert_eq!(k.len(), 1);
    assert!(c.tick(t1).is_empty(), "a second kill waits");
    assert_eq!(c.status().up, 1);
    let Action::Kill(killed) = k[0] else { panic!() };
    c.update(&upd(killed, TaskState::Killed), t1);
    let l4 = launched(&c.offers(vec![offer(a), offer(b)], t1));
    assert_eq!(l4.len(), 1, "replaced at once (no backoff for a roll)");
    assert_eq!(l4[0].command, CommandInfo::shell("v2"));
    assert!(c.tick(t1).is_empty(), "the new instance is not up yet");
    c.update(&upd(l4[0].task_id, TaskState::Running), t1);
    assert_eq!(c.tick(t1).len(), 1, "then the next one");
    assert!(c.status().rolling);
}

#[test]
fn ports_are_a_resource_of_the_offer() {
    let t0 = Instant::now();
    let mut c = ServiceCore::new("web", def(3, "v1"));
    let mut o = offer(AgentId::random());
    o.resources = "cpus:4;mem:1024;ports:1".parse().unwrap();
    let mut d = def(3, "v1");
    d.spread = false;
    c.set_definition(d);
    // One port left on the agent: one instance, not three.
    assert_eq!(launched(&c.offers(vec![o.clone()], t0)).len(), 1);
    o.resources = "cpus:4;mem:1024".parse().unwrap();
    assert!(
        launched(&c.offers(vec![o], t0)).is_empty(),
        "no ports offered"
    );
    // The old framework-side range form is refused with serde's message.
    let old = r#"{"instances": 1, "command": "x", "ports": [31000, 31099]}"#;
    assert!(serde_json::from_str::<ServiceDef>(old).is_err());
    let new = r#"{"instances": 1, "command": "x", "ports": 2}"#;
    assert_eq!(serde_json::from_str::<ServiceDef>(new).unwrap().ports, 2);
    let mut tcp = def(1, "x");
    tcp.ports = 0;
    tcp.health = Some(HealthCheck {
        tcp: true,
        command: None,
        interval_secs: 1.0,
        grace_secs: 1.0,
        failures: 1,
    });
    assert!(tcp.problem().unwrap().contains("ports"));
}

#[test]
fn a_drained_agents_instances_move_one_at_a_time() {
    let t0 = Instant::now();
    let mut c = ServiceCore::new("web", def(2, "v1"));
    let (a, b) = (AgentId::random(), AgentId::random());
    let tasks = launched(&c.offers(vec![offer(a), offer(b)], t0));
    for t in &tasks {
        c.update(&upd(t.task_id, TaskState::Running), t0);
    }
    assert!(c.tick(t0).is_empty());
    c.evacuate(a);
    let k = c.tick(t0);
    let on_a = c.slots().iter().find(|s| s.agent == Some(a)).unwrap().task;
    assert_eq!(k, vec![Action::Kill(on_a.unwrap())]);
    assert!(c.tick(t0).is_empty());
}

#[tokio::test]
async fn health_checks_run_commands_and_connect() {
    let h = |tcp: bool, command: Option<&str>| HealthCheck {
        tcp,
        command: command.map(str::to_string),
        interval_secs: 2.0,
        grace_secs: 0.0,
        failures: 1,
    };
    assert!(check(&h(false, Some("test \"$PORT\" = 7")), "127.0.0.1", Some(7)).await);
    assert!(!check(&h(false, Some("exit 3")), "127.0.0.1", None).await);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    assert!(check(&h(true, None), "127.0.0.1", Some(port)).await);
    drop(l);
    assert!(!check(&h(true, None), "127.0.0.1", Some(port)).await);
}

#[test]
fn failing_health_checks_kill_after_the_grace() {
    let t0 = Instant::now();
    let mut d = def(1, "x");
    d.health = Some(HealthCheck {
        tcp: true,
        command: None,
        interval_secs: 1.0,
        grace_secs: 5.0,
        failures: 2,
    });
    let mut c = ServiceCore::new("s", d);
    let l = launched(&c.offers(vec![offer(AgentId::random())], t0));
    let t = l[0].task_id;
    let mut running = upd(t, TaskState::Running);
    running.ports = vec![31005];
    c.update(&running, t0);
    assert_eq!(c.status().up, 0, "not up before its first passing check");
    // The TCP check connects to the port the agent gave.
    let checks = c.to_check(t0);
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].3, Some(31005));
    assert!(c
        .health(0, t, false, t0 + Duration::from_secs(1))
        .is_empty());
    assert!(c.health(0, t, true, t0 + Duration::from_secs(2)).is_empty());
    assert_eq!(c.status().up, 1);
    assert!(c
        .health(0, t, false, t0 + Duration::from_secs(3))
        .is_empty());
    assert_eq!(
        c.health(0, t, false, t0 + Duration::from_secs(4)),
        vec![Action::Kill(t)]
    );
}
