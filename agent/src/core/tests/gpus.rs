//! GPUs in the core: a fault withdraws the GPU and tells its tasks, an unhealthy GPU survives a
//! restart, GPU memory over a task's share is reported then killed, pinned UUIDs are the
//! devices a task gets, the master's choice of whole GPUs is taken while it fits.

use super::*;

#[test]
fn gpu_fault_withdraws_the_gpu_and_tells_its_tasks_which_keep_running() {
    let mut c = registered(2);
    let fw = FrameworkId::random();
    let t = task(";gpus:1");
    let id = t.task_id;
    start(&mut c, fw, t, 100);
    let held = c.checkpoint().tasks[&id].gpus.clone();
    assert_eq!(held.len(), 1);
    let uuid = held[0].clone();
    // An application XID (13) does not make a GPU unhealthy.
    let fx = step(
        &mut c,
        Input::GpuFault(GpuFault {
            uuid: uuid.clone(),
            kind: FaultKind::Xid(13),
        }),
        T0,
    );
    assert!(fx.is_empty());
    let fx = step(
        &mut c,
        Input::GpuFault(GpuFault {
            uuid: uuid.clone(),
            kind: FaultKind::Xid(79),
        }),
        T0,
    );
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Send(AgentToMaster::GpuHealth { uuid: u, healthy: false, .. }) if *u == uuid
    )));
    assert!(fx.iter().any(
        |e| matches!(e, Effect::Persist(crate::wal::Record::GpuUnhealthy { uuid: u, .. }) if *u == uuid)
    ));
    let u = &updates(&fx)[0];
    assert_eq!(
        (u.task_id, u.state, u.reason),
        (id, TaskState::Running, Some(TaskReason::GpuHealth))
    );
    assert!(signals(&fx).is_empty(), "the task keeps running");
    assert!(c.checkpoint().unhealthy_gpus.contains_key(&uuid));
    // The other GPU is still assignable; a third whole-GPU task finds none healthy and free.
    let second = task(";gpus:1");
    let second_id = second.task_id;
    let fx = step(&mut c, run_task(fw, second), T0);
    assert!(fx.iter().any(|e| matches!(e, Effect::Launch(_))));
    assert_ne!(c.checkpoint().tasks[&second_id].gpus, held);
    let fx = step(&mut c, run_task(fw, task(";gpus:1")), T0);
    assert!(fx.iter().all(|e| !matches!(e, Effect::Launch(_))));
    assert_eq!(updates(&fx)[0].reason, Some(TaskReason::LaunchFailed));
    // An operator clears it: healthy again, the master and the task hear it.
    let fx = step(&mut c, Input::ClearGpus(vec!["all".into()]), T0);
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Send(AgentToMaster::GpuHealth { healthy: true, .. })
    )));
    assert!(c.checkpoint().unhealthy_gpus.is_empty());
    // A re-registration advertises the healthy count.
    let fx = step(&mut c, Input::Connected, T0);
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Send(AgentToMaster::Register { gpus, .. }) if gpus.iter().all(|g| g.healthy)
    )));
}

#[test]
fn an_unhealthy_gpu_survives_a_restart_and_is_rechecked_when_due() {
    let mut cfg = config(2);
    cfg.gpu_recovery_after = Some(Duration::from_secs(60));
    let mut ckpt = Checkpoint::default();
    ckpt.unhealthy_gpus
        .insert("GPU-0".into(), "critical XID 79".into());
    let mut c = AgentCore::new(cfg, ckpt, T0, Instant::now());
    c.recover(RecoveryProbe::default(), T0);
    let fx = step(&mut c, Input::Connected, T0);
    let advertised = fx.iter().find_map(|e| match e {
        Effect::Send(AgentToMaster::Register {
            resources, gpus, ..
        }) => Some((
            resources.milli("gpus"),
            gpus.iter().filter(|g| !g.healthy).count(),
        )),
        _ => None,
    });
    assert_eq!(advertised, Some((1000, 1)));
    // Not due before the recovery delay; then exactly one check runs at a time.
    let checks = |fx: &[Effect]| {
        fx.iter()
            .filter(|e| matches!(e, Effect::CheckRecovery(u) if u == "GPU-0"))
            .count()
    };
    assert_eq!(checks(&step(&mut c, Input::Tick, T0 + 59_000)), 0);
    assert_eq!(checks(&step(&mut c, Input::Tick, T0 + 61_000)), 1);
    assert_eq!(checks(&step(&mut c, Input::Tick, T0 + 61_200)), 0);
    step(
        &mut c,
        Input::RecoveryChecked {
            uuid: "GPU-0".into(),
            passed: true,
        },
        T0 + 62_000,
    );
    assert!(c.checkpoint().unhealthy_gpus.is_empty());
}

#[test]
fn samples_are_taken_when_due_and_gpu_memory_over_the_share_is_reported_then_killed() {
    let mut cfg = config(1);
    cfg.usage_interval = Duration::from_secs(5);
    cfg.gpu_memory_enforce = crate::gpu::share::MemoryEnforce::Kill;
    let mut c = AgentCore::new(cfg, Checkpoint::default(), T0, Instant::now());
    step(&mut c, Input::Connected, T0);
    step(
        &mut c,
        Input::Master(MasterToAgent::Registered {
            agent_id: AgentId::random(),
            epoch: 1,
            heartbeat_interval_ms: 60_000,
        }),
        T0,
    );
    let fw = FrameworkId::random();
    let t = task(";gpus:0.5");
    let id = t.task_id;
    start(&mut c, fw, t, 100);
    let sample = |fx: &[Effect]| {
        fx.iter().find_map(|e| match e {
            Effect::Sample(tasks) => Some(tasks.clone()),
            _ => None,
        })
    };
    assert!(sample(&step(&mut c, Input::Tick, T0 + 4_999)).is_none());
    let tasks = sample(&step(&mut c, Input::Tick, T0 + 5_000)).expect("due");
    assert_eq!(tasks, vec![(id, 100, vec!["GPU-0".to_string()])]);
    // One sample at a time.
    assert!(sample(&step(&mut c, Input::Tick, T0 + 20_000)).is_none());
    // Half of a 16 GiB GPU is an 8 GiB share; 9 GiB is over it.
    let over = TaskUsage {
        gpu_mem_bytes: 9 << 30,
        ..TaskUsage::default()
    };
    let fx = step(
        &mut c,
        Input::Sampled {
            tasks: vec![(id, over.clone()), (TaskId::random(), TaskUsage::default())],
            gpus: vec![],
        },
        T0 + 21_000,
    );
    let reported = fx.iter().find_map(|e| match e {
        Effect::PublishMetrics(u) => Some(u.clone()),
        _ => None,
    });
    let reported = reported.expect("metrics published");
    assert_eq!(reported.len(), 1, "unknown tasks are not reported");
    assert_eq!(reported[0].1.gpu_mem_share_bytes, 8 << 30);
    let u = &updates(&fx)[0];
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Running, Some(TaskReason::GpuMemory))
    );
    assert_eq!(signals(&fx), vec![(100, libc::SIGTERM)]);
    // Still over at the next sample: not reported again.
    let fx = step(
        &mut c,
        Input::Sampled {
            tasks: vec![(id, over)],
            gpus: vec![],
        },
        T0 + 26_000,
    );
    assert!(updates(&fx).is_empty());
    // It dies of the kill: FAILED with reason gpu-memory, not KILLED.
    step(
        &mut c,
        Input::Exited {
            task: id,
            status: exit(0),
            outcome: None,
        },
        T0 + 27_000,
    );
    let fx = step(
        &mut c,
        Input::Settled {
            task: id,
            status: exit(0),
            outcome: CgroupOutcome::default(),
        },
        T0 + 27_000,
    );
    let u = &updates(&fx)[0];
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Failed, Some(TaskReason::GpuMemory))
    );
}

#[test]
fn pinned_gpu_uuids_are_the_devices_the_task_gets() {
    let mut c = registered(4);
    let fw = FrameworkId::random();
    let mut t = task(";gpus:2");
    t.gpu_selector = Some(GpuSelector::pinned(["GPU-3", "GPU-1"]));
    let fx = step(&mut c, run_task(fw, t), T0);
    let plan = fx
        .iter()
        .find_map(|e| match e {
            Effect::Launch(p) => Some(p.clone()),
            _ => None,
        })
        .expect("a launch");
    let mut visible: Vec<&str> = plan.env["CUDA_VISIBLE_DEVICES"].split(',').collect();
    visible.sort();
    assert_eq!(visible, ["GPU-1", "GPU-3"]);
    // A second task pinned to a device now in use fails with the reason, launching nothing.
    let mut t = task(";gpus:1");
    t.gpu_selector = Some(GpuSelector::pinned(["GPU-1"]));
    let fx = step(&mut c, run_task(fw, t), T0 + 1);
    assert!(!fx.iter().any(|e| matches!(e, Effect::Launch(_))));
    let failed = updates(&fx);
    assert_eq!(failed[0].state, TaskState::Failed, "{failed:?}");
    assert!(
        failed[0].message.contains("matching its selector"),
        "{failed:?}"
    );
}

/// The GPUs `RunTask` named for task `t` (the master's choice), as the launch's
/// `CUDA_VISIBLE_DEVICES`, sorted; `None` when nothing was launched.
fn visible_for(c: &mut AgentCore, t: TaskInfo, master: &[&str], now: u64) -> Option<Vec<String>> {
    let input = Input::Master(MasterToAgent::RunTask {
        framework_id: FrameworkId::random(),
        task: t,
        gpus: master.iter().map(|g| g.to_string()).collect(),
    });
    let fx = step(c, input, now);
    let plan = fx.iter().find_map(|e| match e {
        Effect::Launch(p) => Some(p.clone()),
        _ => None,
    })?;
    let mut v: Vec<String> = plan.env["CUDA_VISIBLE_DEVICES"]
        .split(',')
        .map(String::from)
        .collect();
    v.sort();
    Some(v)
}

#[test]
fn whole_gpus_the_master_chose_are_taken_while_they_fit() {
    let mut c = registered(4);
    // The master's choice, though the agent alone would have taken GPU-0 and GPU-1.
    let got = visible_for(&mut c, task(";gpus:2"), &["GPU-3", "GPU-2"], T0);
    assert_eq!(got.unwrap(), ["GPU-2", "GPU-3"]);
    // A stale choice (GPU-2 is taken now): the agent picks idle GPUs itself.
    let got = visible_for(&mut c, task(";gpus:2"), &["GPU-2", "GPU-0"], T0 + 1);
    assert_eq!(got.unwrap(), ["GPU-0", "GPU-1"]);
    // A choice of the wrong size, or of unknown GPUs, is ignored the same way; nothing is
    // left now, so the task fails.
    let got = visible_for(&mut c, task(";gpus:1"), &["GPU-9"], T0 + 2);
    assert_eq!(got, None);
}
