//! Port assignment in the core: `ports:K` tasks get distinct ports of the range, in their
//! environment, records and updates; ports held outside Gantry are skipped; a task that cannot
//! get its ports fails `port-unavailable`; ports come free when tasks end and survive a restart.

use std::collections::BTreeSet;

use super::*;
use crate::core::ports::{self, PortRange};

const RANGE: PortRange = PortRange {
    first: 41000,
    last: 41002,
};

fn with_ports(c: &mut AgentCore) {
    c.config.ports = Some(RANGE);
}

fn port_task(k: u32) -> TaskInfo {
    task(&format!(";ports:{k}"))
}

/// The plan of the launch among effects.
fn plan(fx: &[Effect]) -> &LaunchPlan {
    fx.iter()
        .find_map(|e| match e {
            Effect::Launch(p) => Some(&**p),
            _ => None,
        })
        .expect("a launch")
}

fn run_probed(fw: FrameworkId, task: TaskInfo, unbindable: &[u16]) -> Input {
    Input::RunTask {
        framework_id: fw,
        task,
        gpus: vec![],
        unbindable_ports: unbindable.iter().copied().collect(),
    }
}

#[test]
fn range_parsing() {
    assert_eq!(
        PortRange::parse("31000-32000").unwrap(),
        Some(PortRange::DEFAULT)
    );
    assert_eq!(PortRange::DEFAULT.len(), 1001);
    assert_eq!(PortRange::parse("none").unwrap(), None);
    assert_eq!(
        PortRange::parse("8080").unwrap(),
        Some(PortRange {
            first: 8080,
            last: 8080
        })
    );
    for bad in ["", "a-b", "2-1", "0-5", "1-70000", "1-2-3"] {
        assert!(PortRange::parse(bad).is_err(), "{bad:?}");
    }
    assert!(ports::wanted(1500).is_err(), "fractions of a port");
    assert_eq!(ports::wanted(2000), Ok(2));
}

#[test]
fn tasks_get_distinct_ports_in_env_records_and_updates() {
    let mut c = registered(0);
    with_ports(&mut c);
    let fw = FrameworkId::random();
    let a = port_task(1);
    let fx = step(&mut c, run_task(fw, a.clone()), T0);
    let p = plan(&fx);
    assert_eq!(p.env["PORT"], "41000");
    assert_eq!(p.env["PORT0"], "41000");
    assert_eq!(p.env["GANTRY_PORTS"], "41000");
    assert_eq!(c.checkpoint().tasks[&a.task_id].ports, vec![41000]);
    // The persisted record (log) carries the ports too.
    assert!(fx.iter().any(|e| matches!(e,
        Effect::Persist(crate::wal::Record::Task(r)) if r.ports == vec![41000])));
    assert!(updates(&fx).iter().all(|u| u.ports == vec![41000]));

    let b = port_task(2);
    let fx = step(&mut c, run_task(fw, b.clone()), T0);
    let p = plan(&fx);
    assert_eq!(p.env["PORT"], "41001");
    assert_eq!(p.env["PORT1"], "41002");
    assert_eq!(p.env["GANTRY_PORTS"], "41001,41002");
    // A task asking none gets no port variables.
    let n = task("");
    let fx = step(&mut c, run_task(fw, n), T0);
    assert!(!plan(&fx).env.contains_key("PORT"));
    assert!(!plan(&fx).env.contains_key("GANTRY_PORTS"));

    // The registration reports them (a new master learns which ports run where).
    let fx = c.handle(Input::Connected, T0);
    let reg = fx.iter().find_map(|e| match e {
        Effect::Send(AgentToMaster::Register { running_tasks, .. }) => Some(running_tasks),
        _ => None,
    });
    let held: BTreeSet<u16> = reg
        .expect("register")
        .iter()
        .flat_map(|t| t.ports.clone())
        .collect();
    assert_eq!(held, BTreeSet::from([41000, 41001, 41002]));
}

#[test]
fn no_free_port_fails_port_unavailable_and_ended_tasks_free_theirs() {
    let mut c = registered(0);
    with_ports(&mut c);
    let fw = FrameworkId::random();
    let a = port_task(3);
    start(&mut c, fw, a.clone(), 10);
    // The range is used up: the next task fails at once, with the reason.
    let b = port_task(1);
    let fx = step(&mut c, run_task(fw, b.clone()), T0);
    assert!(!fx.iter().any(|e| matches!(e, Effect::Launch(_))));
    let u = updates(&fx);
    let last = u.last().unwrap();
    assert_eq!(last.state, TaskState::Failed);
    assert_eq!(last.reason, Some(TaskReason::PortUnavailable));
    assert!(
        last.message.starts_with("port-unavailable"),
        "{}",
        last.message
    );
    assert!(
        last.message.contains("3 held by its tasks"),
        "{}",
        last.message
    );
    assert!(c.checkpoint().tasks[&b.task_id].ports.is_empty());
    // Fractions of a port are refused the same way.
    let f = task(";ports:0.5");
    let fx = step(&mut c, run_task(fw, f), T0);
    assert_eq!(
        updates(&fx).last().unwrap().reason,
        Some(TaskReason::PortUnavailable)
    );
    // The first task ends: its ports are free again.
    step(
        &mut c,
        Input::Settled {
            task: a.task_id,
            status: exit(0),
            outcome: CgroupOutcome::default(),
        },
        T0,
    );
    assert_eq!(c.free_ports(), vec![41000, 41001, 41002]);
    let d = port_task(1);
    let fx = step(&mut c, run_task(fw, d), T0);
    assert_eq!(plan(&fx).env["PORT"], "41000");
}

#[test]
fn ports_in_use_outside_gantry_are_skipped() {
    let mut c = registered(0);
    with_ports(&mut c);
    let fw = FrameworkId::random();
    let a = port_task(1);
    let fx = step(&mut c, run_probed(fw, a, &[41000]), T0);
    assert_eq!(plan(&fx).env["PORT"], "41001");
    // Two left per the books, but one is busy outside: a 2-port task cannot run.
    let b = port_task(2);
    let fx = step(&mut c, run_probed(fw, b, &[41000, 41002]), T0);
    let last = updates(&fx).pop().unwrap();
    assert_eq!(last.reason, Some(TaskReason::PortUnavailable));
    assert!(
        last.message.contains("in use outside Gantry"),
        "{}",
        last.message
    );
}

#[test]
fn an_agent_without_a_range_fails_port_tasks() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let fx = step(&mut c, run_task(fw, port_task(1)), T0);
    let last = updates(&fx).pop().unwrap();
    assert_eq!(last.reason, Some(TaskReason::PortUnavailable));
    assert!(last.message.contains("no port range"), "{}", last.message);
    assert!(c.free_ports().is_empty());
}

#[test]
fn readopted_tasks_keep_their_ports_after_a_restart() {
    let (alive, mut a) = checkpointed(TaskState::Running, Some(launched(10)), vec![]);
    a.ports = vec![41001];
    let (ended, mut e) = checkpointed(TaskState::Finished, Some(launched(20)), vec![]);
    e.ports = vec![41000];
    let mut ckpt = Checkpoint::default();
    ckpt.tasks.insert(alive, a);
    ckpt.tasks.insert(ended, e);
    let mut cfg = config(0);
    cfg.ports = Some(RANGE);
    let mut c = AgentCore::new(cfg, ckpt, T0, Instant::now());
    c.recover(
        RecoveryProbe {
            alive: vec![alive],
            ..Default::default()
        },
        T0,
    );
    assert_eq!(c.checkpoint().tasks[&alive].ports, vec![41001]);
    // The finished task's port is free; the re-adopted one's is not.
    assert_eq!(c.free_ports(), vec![41000, 41002]);
    register(&mut c);
    let fw = FrameworkId::random();
    let fx = step(&mut c, run_task(fw, port_task(2)), T0);
    assert_eq!(plan(&fx).env["GANTRY_PORTS"], "41000,41002");
}

#[test]
fn the_probe_stops_once_enough_ports_are_bindable() {
    let free = [41000, 41001, 41002, 41003];
    let mut probed = Vec::new();
    let busy = ports::probe(&free, 2, |p| {
        probed.push(p);
        p != 41001
    });
    assert_eq!(busy, BTreeSet::from([41001]));
    assert_eq!(probed, vec![41000, 41001, 41002], "41003 is not needed");
    // Not enough: every candidate is probed.
    let busy = ports::probe(&free, 4, |p| p % 2 == 0);
    assert_eq!(busy, BTreeSet::from([41001, 41003]));
}
