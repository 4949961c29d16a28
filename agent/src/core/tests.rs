//! The agent core without processes: task lifecycle, kill escalation, recovery, GPU health.
//! Time is an input; effects are inspected instead of performed. Shared helpers and the lifecycle
//! tests here; disk limits, GPUs, ports, recovery and the `Register` frame in the submodules.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gantry_proto::*;

use super::*;
use crate::checkpoint::Checkpoint;
use crate::discovery::DiscoveredGpu;
use crate::executor::{ExitStatus, Launched};
use crate::gpu::{FaultKind, GpuFault};
use crate::isolation::NvidiaMajors;

const T0: u64 = 1_700_000_000_000;

fn gpu(i: u32) -> DiscoveredGpu {
    DiscoveredGpu {
        index: i,
        info: GpuInfo {
            uuid: format!("GPU-{i}"),
            name: "Test GPU".into(),
            memory_mib: 16_384,
            compute_capability: (8, 0),
            minor: i,
            pci_bus_id: format!("0000:0{i}:00.0"),
            numa_node: Some(0),
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        },
    }
}

fn config(gpus: u32) -> CoreConfig {
    CoreConfig {
        work_dir: "/work".into(),
        hostname: "h".into(),
        resources: format!("cpus:4;mem:1024;gpus:{gpus}").parse().unwrap(),
        reserved: BTreeMap::new(),
        attributes: Default::default(),
        task_user: "nobody".into(),
        root: false,
        kill_grace: Duration::from_secs(3),
        isolated: true,
        gpu_agent: gpus > 0,
        inventory: (0..gpus).map(gpu).collect(),
        gpu_sharing: Default::default(),
        gpu_memory_enforce: Default::default(),
        gpu_recovery_after: None,
        cpu_hard_limit: false,
        task_pids_max: None,
        nvidia_majors: NvidiaMajors::default(),
        usage_interval: Duration::from_secs(3600),
        gc: crate::gc::GcPolicy {
            delay: Duration::from_secs(60),
            disk_headroom: 0.1,
            keep: 0,
        },
        ports: None,
        cgroup_pool: super::pool::PoolConfig::off(),
        disk_enforcement: Default::default(),
        disk_watch_interval: Duration::from_secs(5),
        mps: false,
        update_id_seed: 1,
    }
}

fn core(gpus: u32) -> AgentCore {
    AgentCore::new(config(gpus), Checkpoint::default(), T0, Instant::now())
}

/// Connects `c` and registers it with the master (effects left unflushed).
fn register(c: &mut AgentCore) {
    c.handle(Input::Connected, T0);
    c.handle(
        Input::Master(MasterToAgent::Registered {
            agent_id: AgentId::random(),
            epoch: 1,
            heartbeat_interval_ms: 1000,
        }),
        T0,
    );
}

/// A connected, registered core (effects of registering dropped).
fn registered(gpus: u32) -> AgentCore {
    let mut c = core(gpus);
    register(&mut c);
    c.flush(T0);
    c
}

fn task(gpus: &str) -> TaskInfo {
    TaskInfo {
        task_id: TaskId::random(),
        name: "t".into(),
        command: "true".into(),
        resources: format!("cpus:0.1{gpus}").parse().unwrap(),
        env: Default::default(),
        kill_grace_secs: None,
        gpu_selector: None,
        container: None,
    }
}

fn run_task(fw: FrameworkId, task: TaskInfo) -> Input {
    Input::Master(MasterToAgent::RunTask {
        framework_id: fw,
        task,
        gpus: vec![],
    })
}

fn launched(pgid: i32) -> Launched {
    Launched {
        supervisor_pid: pgid - 1,
        task_pgid: pgid,
        supervisor_start: 1,
    }
}

fn exit(code: i32) -> ExitStatus {
    ExitStatus {
        code: Some(code),
        signal: None,
    }
}

/// The status updates queued (persisted for reliable delivery) among effects, in order.
fn updates(fx: &[Effect]) -> Vec<StatusUpdate> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Persist(crate::wal::Record::Update(u)) => Some((**u).clone()),
            _ => None,
        })
        .collect()
}

/// The status updates sent among effects (pipelined: each as soon as it is committed).
fn sent(fx: &[Effect]) -> Vec<StatusUpdate> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Send(AgentToMaster::StatusUpdate(u)) => Some(u.clone()),
            _ => None,
        })
        .collect()
}

fn signals(fx: &[Effect]) -> Vec<(i32, i32)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Signal { pgid, signal } => Some((*pgid, *signal)),
            _ => None,
        })
        .collect()
}

/// Handles an input and ends the batch (as the runtime does), returning all effects.
fn step(c: &mut AgentCore, input: Input, now: u64) -> Vec<Effect> {
    let mut fx = c.handle(input, now);
    fx.extend(c.flush(now));
    fx
}

/// Launches a task and reports its supervisor started; returns the RUNNING update's effects.
fn start(c: &mut AgentCore, fw: FrameworkId, t: TaskInfo, pgid: i32) -> Vec<Effect> {
    let id = t.task_id;
    step(c, run_task(fw, t), T0);
    step(
        c,
        Input::Launched {
            task: id,
            result: Ok(launched(pgid)),
        },
        T0,
    )
}

/// The unacknowledged updates the agent's `Register` in `fx` carries.
fn registered_updates(fx: &[Effect]) -> Vec<StatusUpdate> {
    fx.iter()
        .find_map(|e| match e {
            Effect::Send(AgentToMaster::Register {
                pending_updates, ..
            }) => Some(pending_updates.clone()),
            _ => None,
        })
        .expect("registers")
}

#[test]
fn lifecycle_launch_running_finished_acknowledged() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let t = task("");
    let id = t.task_id;
    let fx = step(&mut c, run_task(fw, t), T0);
    // The record and the STARTING update are persisted in the same batch as the launch.
    let plan = fx
        .iter()
        .find_map(|e| match e {
            Effect::Launch(p) => Some(p.clone()),
            _ => None,
        })
        .expect("a launch");
    assert_eq!(plan.cgroup_name, id.to_string());
    assert_eq!(plan.env.get("GANTRY_TASK_ID"), Some(&id.to_string()));
    assert_eq!(plan.user, None, "not root: the task runs as the agent");
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Persist(crate::wal::Record::Task(r)) if r.state == TaskState::Starting)));
    assert_eq!(
        updates(&fx).iter().map(|u| u.state).collect::<Vec<_>>(),
        vec![TaskState::Starting]
    );
    assert_eq!(
        sent(&fx).len(),
        1,
        "the STARTING update goes out after the commit"
    );

    let fx = step(
        &mut c,
        Input::Launched {
            task: id,
            result: Ok(launched(100)),
        },
        T0 + 10,
    );
    assert_eq!(updates(&fx)[0].state, TaskState::Running);
    // Pipelined: RUNNING goes out without waiting for STARTING's acknowledgement.
    assert_eq!(
        sent(&fx).iter().map(|u| u.state).collect::<Vec<_>>(),
        vec![TaskState::Running]
    );

    // The task exits: its cgroup is settled first, then it is terminal.
    let fx = step(
        &mut c,
        Input::Exited {
            task: id,
            status: exit(0),
            outcome: None,
        },
        T0 + 20,
    );
    assert!(matches!(fx.as_slice(), [Effect::Settle { task, .. }] if *task == id));
    // A second exit report while settling changes nothing.
    assert!(step(
        &mut c,
        Input::Exited {
            task: id,
            status: exit(0),
            outcome: None
        },
        T0 + 21
    )
    .is_empty());
    let fx = step(
        &mut c,
        Input::Settled {
            task: id,
            status: exit(0),
            outcome: CgroupOutcome::default(),
        },
        T0 + 30,
    );
    let done = updates(&fx);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].state, TaskState::Finished);
    assert_eq!(done[0].exit_code, Some(0));
    assert_eq!(sent(&fx), done, "the terminal update goes out at once too");
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::ForgetCgroup(t) if *t == id)));

    // Acknowledging every update (in any order) forgets the task and queues its sandbox for
    // collection.
    let mut pending = c.checkpoint().updates.all();
    assert_eq!(pending.len(), 3);
    pending.reverse();
    let mut last = Vec::new();
    for u in pending {
        assert!(c.knows(&id));
        last = step(
            &mut c,
            Input::Master(MasterToAgent::Acknowledge {
                task_id: id,
                update_id: u.update_id,
            }),
            T0 + 40,
        );
    }
    assert!(!c.knows(&id));
    assert!(last
        .iter()
        .any(|e| matches!(e, Effect::Persist(crate::wal::Record::TaskRemoved(t)) if *t == id)));
    // Its sandbox is collected after the delay (60 s here), once the start-up scan reported.
    let collected = |fx: &[Effect]| {
        fx.iter().find_map(|e| match e {
            Effect::CollectGarbage(due) => Some(due.clone()),
            _ => None,
        })
    };
    assert_eq!(
        collected(&step(&mut c, Input::Tick, T0 + 60_100)),
        None,
        "scan pending"
    );
    let stale = TaskId::random();
    step(
        &mut c,
        Input::GcScanned(vec![crate::gc::Ended {
            task: stale,
            at_ms: T0 - 120_000,
        }]),
        T0 + 1_000,
    );
    assert_eq!(
        collected(&step(&mut c, Input::Tick, T0 + 30_000)),
        Some(vec![stale])
    );
    // One pass at a time.
    assert_eq!(collected(&step(&mut c, Input::Tick, T0 + 60_100)), None);
    step(
        &mut c,
        Input::GcDone {
            disk_used: Some(0.5),
        },
        T0 + 60_100,
    );
    assert_eq!(
        collected(&step(&mut c, Input::Tick, T0 + 60_100)),
        Some(vec![id])
    );
}

#[test]
fn pipelined_updates_ride_the_reregistration_and_are_retried_together() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let t = task("");
    let id = t.task_id;
    let states = |v: &[StatusUpdate]| v.iter().map(|u| u.state).collect::<Vec<_>>();
    let all3 = vec![TaskState::Starting, TaskState::Running, TaskState::Finished];
    let fx = start(&mut c, fw, t, 100);
    assert_eq!(states(&sent(&fx)), vec![TaskState::Running]);
    // The connection goes; the task ends meanwhile.
    step(&mut c, Input::Disconnected, T0 + 5);
    step(
        &mut c,
        Input::Exited {
            task: id,
            status: exit(0),
            outcome: None,
        },
        T0 + 10,
    );
    let fx = step(
        &mut c,
        Input::Settled {
            task: id,
            status: exit(0),
            outcome: CgroupOutcome::default(),
        },
        T0 + 20,
    );
    assert!(sent(&fx).is_empty(), "not connected");
    // All three unacknowledged updates ride in the registration, in order.
    let fx = step(&mut c, Input::Connected, T0 + 30);
    let pending = registered_updates(&fx);
    assert_eq!(states(&pending), all3);
    let fx = step(
        &mut c,
        Input::Master(MasterToAgent::Registered {
            agent_id: AgentId::random(),
            epoch: 1,
            heartbeat_interval_ms: 60_000,
        }),
        T0 + 30,
    );
    assert!(sent(&fx).is_empty(), "sent in the registration");
    // Not acknowledged in time: all three again, in order.
    assert!(sent(&step(&mut c, Input::Tick, T0 + 1_029)).is_empty());
    assert_eq!(states(&sent(&step(&mut c, Input::Tick, T0 + 1_030))), all3);
    // Acknowledged out of order; what is left is retried alone.
    let ack = |c: &mut AgentCore, u: &StatusUpdate, now| {
        step(
            c,
            Input::Master(MasterToAgent::Acknowledge {
                task_id: id,
                update_id: u.update_id,
            }),
            now,
        )
    };
    ack(&mut c, &pending[1], T0 + 1_100);
    ack(&mut c, &pending[0], T0 + 1_200);
    assert!(c.knows(&id));
    assert!(sent(&step(&mut c, Input::Tick, T0 + 2_199)).is_empty());
    assert_eq!(
        sent(&step(&mut c, Input::Tick, T0 + 2_200)),
        vec![pending[2].clone()]
    );
    let fx = ack(&mut c, &pending[2], T0 + 2_300);
    assert!(!c.knows(&id));
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Persist(crate::wal::Record::TaskRemoved(t)) if *t == id)));
}

#[test]
fn failures_oom_and_launch_errors_get_their_reasons() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let t = task("");
    let id = t.task_id;
    start(&mut c, fw, t, 100);
    step(
        &mut c,
        Input::Exited {
            task: id,
            status: exit(137),
            outcome: None,
        },
        T0,
    );
    let fx = step(
        &mut c,
        Input::Settled {
            task: id,
            status: exit(137),
            outcome: CgroupOutcome {
                oom_killed: true,
                usage: None,
            },
        },
        T0,
    );
    let u = &updates(&fx)[0];
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Failed, Some(TaskReason::MemoryLimit))
    );

    let t = task("");
    let id = t.task_id;
    step(&mut c, run_task(fw, t), T0);
    let fx = step(
        &mut c,
        Input::Launched {
            task: id,
            result: Err("no such file".into()),
        },
        T0,
    );
    let u = &updates(&fx)[0];
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Failed, Some(TaskReason::LaunchFailed))
    );

    // A task asking for another user on an agent that is not root never launches.
    let mut t = task("");
    t.command.user = Some("root".into());
    let fx = step(&mut c, run_task(fw, t), T0);
    assert!(!fx.iter().any(|e| matches!(e, Effect::Launch(_))));
    let u = &updates(&fx)[0];
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Failed, Some(TaskReason::LaunchFailed))
    );

    // A launch reported for a task the core does not know: its cgroup is destroyed.
    let stray = TaskId::random();
    let fx = step(
        &mut c,
        Input::Launched {
            task: stray,
            result: Ok(launched(5)),
        },
        T0,
    );
    assert!(matches!(fx.as_slice(), [Effect::DestroyCgroup(t)] if *t == stray));
}

#[test]
fn kill_escalates_to_sigkill_after_the_grace_period() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let t = task("");
    let id = t.task_id;
    start(&mut c, fw, t, 100);
    let kill = Input::Master(MasterToAgent::KillTask {
        framework_id: fw,
        task_id: id,
    });
    let fx = step(&mut c, kill, T0 + 1000);
    assert_eq!(signals(&fx), vec![(100, libc::SIGTERM)]);
    // Within the grace period (3 s): nothing more.
    assert!(signals(&step(&mut c, Input::Tick, T0 + 3900)).is_empty());
    // Past it: SIGKILL the group and the whole cgroup.
    let fx = step(&mut c, Input::Tick, T0 + 4001);
    assert_eq!(signals(&fx), vec![(100, libc::SIGKILL)]);
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::KillCgroup(t) if *t == id)));
    // The group is SIGKILLed every tick, the cgroup at most once a second.
    let fx = step(&mut c, Input::Tick, T0 + 4201);
    assert_eq!(signals(&fx), vec![(100, libc::SIGKILL)]);
    assert!(!fx.iter().any(|e| matches!(e, Effect::KillCgroup(_))));
    assert!(step(&mut c, Input::Tick, T0 + 5002)
        .iter()
        .any(|e| matches!(e, Effect::KillCgroup(_))));
    // It dies: KILLED by request, and no more signals.
    step(
        &mut c,
        Input::Exited {
            task: id,
            status: exit(0),
            outcome: None,
        },
        T0 + 5100,
    );
    let fx = step(
        &mut c,
        Input::Settled {
            task: id,
            status: ExitStatus {
                code: None,
                signal: Some(libc::SIGKILL),
            },
            outcome: CgroupOutcome::default(),
        },
        T0 + 5200,
    );
    let u = &updates(&fx)[0];
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Killed, Some(TaskReason::KilledByRequest))
    );
    assert!(signals(&step(&mut c, Input::Tick, T0 + 9000)).is_empty());
}

#[test]
fn a_task_killed_before_its_launch_is_signalled_when_it_starts() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let mut t = task("");
    t.kill_grace_secs = Some(1);
    let id = t.task_id;
    step(&mut c, run_task(fw, t), T0);
    let fx = step(
        &mut c,
        Input::Master(MasterToAgent::KillTask {
            framework_id: fw,
            task_id: id,
        }),
        T0,
    );
    assert!(signals(&fx).is_empty(), "nothing to signal yet");
    let fx = step(
        &mut c,
        Input::Launched {
            task: id,
            result: Ok(launched(7)),
        },
        T0 + 100,
    );
    assert_eq!(signals(&fx), vec![(7, libc::SIGTERM)]);
    // The task's own grace period (1 s) applies.
    assert_eq!(
        signals(&step(&mut c, Input::Tick, T0 + 1001)),
        vec![(7, libc::SIGKILL)]
    );
}

#[test]
fn killing_an_unknown_task_reports_it_killed() {
    let mut c = registered(0);
    let id = TaskId::random();
    let fx = step(
        &mut c,
        Input::Master(MasterToAgent::KillTask {
            framework_id: FrameworkId::random(),
            task_id: id,
        }),
        T0,
    );
    let u = &updates(&fx)[0];
    assert_eq!((u.task_id, u.state), (id, TaskState::Killed));
}

#[test]
fn updates_wait_for_registration_and_heartbeats_follow_the_interval() {
    let mut c = core(0);
    let fw = FrameworkId::random();
    // Not connected: nothing is sent, the update stays queued.
    let fx = step(&mut c, run_task(fw, task("")), T0);
    assert_eq!(updates(&fx).len(), 1);
    assert!(sent(&fx).is_empty());
    let fx = step(&mut c, Input::Connected, T0);
    let register = registered_updates(&fx).len();
    assert_eq!(register, 1, "the pending update rides along");
    let fx = step(
        &mut c,
        Input::Master(MasterToAgent::Registered {
            agent_id: AgentId::random(),
            epoch: 1,
            heartbeat_interval_ms: 500,
        }),
        T0,
    );
    assert!(fx.iter().any(|e| matches!(e, Effect::CleanupCgroups)));
    assert!(sent(&fx).is_empty(), "sent in the registration");
    let hb = |fx: &[Effect]| {
        fx.iter()
            .filter(|e| matches!(e, Effect::Send(AgentToMaster::Heartbeat)))
            .count()
    };
    assert_eq!(hb(&step(&mut c, Input::Tick, T0 + 499)), 0);
    assert_eq!(hb(&step(&mut c, Input::Tick, T0 + 500)), 1);
    assert_eq!(hb(&step(&mut c, Input::Tick, T0 + 600)), 0);
    // A refusal stops the agent.
    let fx = step(
        &mut c,
        Input::Master(MasterToAgent::Error {
            message: "name in use".into(),
        }),
        T0,
    );
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Stop(m) if m.contains("name in use"))));
}

#[test]
fn termination_notice_is_told_once_per_registration() {
    let mut c = registered(0);
    let notice = |c: &mut AgentCore| {
        step(
            c,
            Input::TerminationNotice {
                deadline_unix_ms: T0 + 120_000,
                reason: "spot".into(),
            },
            T0,
        )
        .iter()
        .filter(|e| {
            matches!(
                e,
                Effect::Send(AgentToMaster::TerminationNotice { in_ms: 120_000, .. })
            )
        })
        .count()
    };
    assert_eq!(notice(&mut c), 1);
    assert_eq!(notice(&mut c), 0);
}
fn checkpointed(
    state: TaskState,
    launched: Option<Launched>,
    gpus: Vec<String>,
) -> (TaskId, TaskRecord) {
    let t = task("");
    let id = t.task_id;
    (
        id,
        TaskRecord {
            framework_id: FrameworkId::random(),
            info: t,
            state,
            sandbox: format!("/work/sandboxes/{id}").into(),
            meta: format!("/work/meta/{id}").into(),
            launched,
            gpus,
            kill_requested_ms: None,
            cgroup: Some(id.to_string()),
            gpu_memory_kill: None,
            disk_kill: None,
            ports: Vec::new(),
            group: None,
        },
    )
}

mod batch;
mod disk;
mod gpus;
mod groups;
mod pool;
mod ports;
mod recovery;
mod register;
mod time;

/// The final usages of tasks settled in one batch go out as one message, before their
/// terminal updates (the master records usage only for tasks it still knows).
#[test]
fn final_usages_of_a_batch_are_one_message_before_the_updates() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let (a, b) = (task(""), task(""));
    let ids = [a.task_id, b.task_id];
    start(&mut c, fw, a, 100);
    start(&mut c, fw, b, 101);
    for id in ids {
        c.handle(
            Input::Exited {
                task: id,
                status: exit(0),
                outcome: None,
            },
            T0 + 10,
        );
    }
    let mut fx = Vec::new();
    for id in ids {
        fx.extend(c.handle(
            Input::Settled {
                task: id,
                status: exit(0),
                outcome: CgroupOutcome {
                    oom_killed: false,
                    usage: Some(TaskUsage {
                        cpu_time_secs: 1.0,
                        ..TaskUsage::default()
                    }),
                },
            },
            T0 + 20,
        ));
    }
    fx.extend(c.flush(T0 + 20));
    let kinds: Vec<&str> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Send(AgentToMaster::Usage { tasks, .. }) => {
                assert_eq!(tasks.iter().map(|t| t.0).collect::<Vec<_>>(), ids);
                Some("usage")
            }
            Effect::Send(AgentToMaster::StatusUpdate { .. }) => Some("update"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, vec!["usage", "update", "update"]);
}
