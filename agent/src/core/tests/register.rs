//! The `Register` frame fits the frame bound whatever the agent has to report (`fit_register`).

use super::super::master::fit_register;
use gantry_proto::codec;
use gantry_proto::*;

fn register(tasks: usize, command_bytes: usize, updates: usize) -> AgentToMaster {
    let fw = FrameworkId::random();
    let running_tasks: Vec<RunningTask> = (0..tasks)
        .map(|i| RunningTask {
            framework_id: fw,
            task: TaskInfo {
                task_id: TaskId::random(),
                name: format!("t{i}"),
                command: "x".repeat(command_bytes).into(),
                resources: "cpus:0.1".parse().unwrap(),
                env: Default::default(),
                kill_grace_secs: None,
                gpu_selector: None,
                container: None,
            },
            state: TaskState::Running,
            gpus: vec![],
            ports: vec![],
        })
        .collect();
    let pending_updates = running_tasks
        .iter()
        .take(updates)
        .map(|t| StatusUpdate {
            update_id: UpdateId::random(),
            task_id: t.task.task_id,
            framework_id: fw,
            agent_id: None,
            state: TaskState::Running,
            source: UpdateSource::Agent,
            reason: None,
            message: "m".repeat(command_bytes),
            exit_code: None,
            signal: None,
            gpus: vec![],
            timestamp_ms: 0,
            reconciliation: false,
            ports: Vec::new(),
        })
        .collect();
    AgentToMaster::Register {
        agent_id: None,
        hostname: "h".into(),
        resources: "cpus:1".parse().unwrap(),
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: vec![],
        running_tasks,
        pending_updates,
        task_user: "nobody".into(),
    }
}

fn parts(msg: &AgentToMaster) -> (usize, usize, usize) {
    match msg {
        AgentToMaster::Register {
            running_tasks,
            pending_updates,
            ..
        } => (
            running_tasks.len(),
            pending_updates.len(),
            running_tasks
                .iter()
                .map(|t| match &t.task.command.program {
                    Program::Shell(s) => s.len(),
                    Program::Argv(v) => v.iter().map(String::len).sum(),
                })
                .sum(),
        ),
        _ => panic!("not a registration"),
    }
}

#[test]
fn a_registration_that_fits_is_unchanged() {
    let msg = register(10, 100, 10);
    let (fitted, left_out) = fit_register(msg.clone());
    assert_eq!((fitted, left_out), (msg, false));
}

#[test]
fn pending_updates_are_left_out_first_then_commands() {
    // 1,000 tasks with 3 KB commands and 3 KB update messages: ~6 MB.
    let (fitted, left_out) = fit_register(register(1000, 3000, 1000));
    assert!(left_out);
    assert_eq!(parts(&fitted), (1000, 0, 3_000_000));
    assert!(codec::encode(&fitted).is_ok());
    // 2,000 tasks with 3 KB commands: the commands go too, every task is still reported.
    let (fitted, left_out) = fit_register(register(2000, 3000, 0));
    assert!(!left_out);
    assert_eq!(parts(&fitted), (2000, 0, 0));
    assert!(codec::encode(&fitted).is_ok());
}
