//! The core's time with simulated clocks: `next_deadline` (a tick before it does nothing, a
//! tick at it moves it on), and the rules that moved out of the runtime — a re-adopted task's
//! supervisor gone without an exit record, a stale termination notice, a dead supervisor's
//! task killed, MPS restart back-off — plus update ids drawn from the seed.

use super::*;

/// Effects a tick produces that act (file polls excluded: they only read).
fn acting(fx: &[Effect]) -> usize {
    fx.len()
}

/// Drives `c` by its deadlines from `now` to `until`, checking at each that a tick just
/// before the deadline does nothing and that the deadline moves past the tick that met it.
/// Returns every effect of the ticks at the deadlines.
fn drive(c: &mut AgentCore, mut now: u64, until: u64) -> Vec<(u64, Effect)> {
    let mut all = Vec::new();
    for _ in 0..10_000 {
        let Some(at) = c.next_deadline(now) else {
            return all;
        };
        if at > until {
            return all;
        }
        if at > now + 1 {
            assert_eq!(
                acting(&step(c, Input::Tick, at - 1)),
                0,
                "a tick before the deadline {at} acted"
            );
        }
        now = at.max(now);
        let fx = step(c, Input::Tick, now);
        let next = c.next_deadline(now);
        assert!(
            next.is_none_or(|n| n > now),
            "the deadline did not move past {now}: {next:?} (effects {fx:?})"
        );
        all.extend(fx.into_iter().map(|e| (now, e)));
    }
    panic!("the deadlines never passed {until}");
}

#[test]
fn an_idle_agent_wakes_only_for_its_deadlines() {
    let mut c = registered(2);
    let fx = drive(&mut c, T0, T0 + 10_000);
    let heartbeats = fx
        .iter()
        .filter(|(_, e)| matches!(e, Effect::Send(AgentToMaster::Heartbeat)))
        .count();
    assert_eq!(heartbeats, 10);
    let polls = fx
        .iter()
        .filter(|(_, e)| matches!(e, Effect::ReadTerminationNotice))
        .count();
    assert_eq!(polls, 10);
    let clears = fx
        .iter()
        .filter(|(_, e)| matches!(e, Effect::ReadClearRequests))
        .count();
    assert_eq!(clears, 10, "a GPU agent reads clear requests every second");
    // A disconnected CPU agent has nothing to do but collect garbage (every 5 s; a pass runs
    // until it reports).
    let mut c = core(0);
    c.handle(Input::GcScanned(Vec::new()), T0);
    let fx = drive(&mut c, T0, T0 + 10_000);
    assert!(fx
        .iter()
        .all(|(_, e)| matches!(e, Effect::CollectGarbage(_))));
    assert_eq!(fx.len(), 1);
    assert_eq!(c.next_deadline(T0 + 5_000), None);
    c.handle(Input::GcDone { disk_used: None }, T0 + 5_100);
    assert_eq!(c.next_deadline(T0 + 5_100), Some(T0 + 10_000));
}

#[test]
fn deadlines_cover_kills_retries_samples_and_garbage() {
    let mut c = registered(0);
    c.config.usage_interval = Duration::from_secs(1);
    let fw = FrameworkId::random();
    let t = task("");
    let id = t.task_id;
    start(&mut c, fw, t, 100);
    // Unacknowledged updates are retried at their deadline.
    let fx = drive(&mut c, T0, T0 + 1_500);
    assert!(fx
        .iter()
        .any(|(at, e)| *at == T0 + 1_000
            && matches!(e, Effect::Send(AgentToMaster::StatusUpdate(_)))));
    // Samples every usage interval.
    assert!(fx.iter().any(|(_, e)| matches!(e, Effect::Sample(_))));
    step(
        &mut c,
        Input::Sampled {
            tasks: vec![],
            gpus: vec![],
        },
        T0 + 1_500,
    );
    // A kill: SIGKILL right after the grace period (3 s), again every KILL_REPEAT_MS.
    step(
        &mut c,
        Input::Master(MasterToAgent::KillTask {
            framework_id: fw,
            task_id: id,
        }),
        T0 + 2_000,
    );
    let fx = drive(&mut c, T0 + 2_000, T0 + 5_500);
    let kills: Vec<u64> = fx
        .iter()
        .filter(|(_, e)| matches!(e, Effect::Signal { signal, .. } if *signal == libc::SIGKILL))
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(kills.first(), Some(&(T0 + 5_001)));
    assert_eq!(kills.get(1), Some(&(T0 + 5_001 + KILL_REPEAT_MS)));
    // Ended and acknowledged: its sandbox is collected after --gc-delay (60 s) at its deadline.
    step(
        &mut c,
        Input::Exited {
            task: id,
            status: exit(0),
            outcome: None,
        },
        T0 + 5_500,
    );
    let fx = step(
        &mut c,
        Input::Settled {
            task: id,
            status: exit(0),
            outcome: CgroupOutcome::default(),
        },
        T0 + 5_500,
    );
    c.handle(Input::GcScanned(Vec::new()), T0 + 5_500);
    for u in c.checkpoint().updates.all() {
        step(
            &mut c,
            Input::Master(MasterToAgent::Acknowledge {
                task_id: u.task_id,
                update_id: u.update_id,
            }),
            T0 + 5_600,
        );
    }
    assert!(!updates(&fx).is_empty());
    assert!(!c.knows(&id));
    // (--gc-delay 60 s shortened by the disk headroom, 10 %: 54 s.)
    let mut now = T0 + 5_600;
    let mut collected_at = None;
    while collected_at.is_none() && now < T0 + 70_000 {
        now = c.next_deadline(now).expect("a deadline");
        for e in step(&mut c, Input::Tick, now) {
            if let Effect::CollectGarbage(due) = e {
                if due.contains(&id) {
                    collected_at = Some(now);
                }
                c.handle(Input::GcDone { disk_used: None }, now);
            }
        }
    }
    assert_eq!(collected_at, Some(T0 + 5_600 + 54_000));
}

#[test]
fn a_readopted_task_gone_without_an_exit_record_ends_after_one_second() {
    let (id, rec) = checkpointed(TaskState::Running, Some(launched(10)), vec![]);
    let mut ckpt = Checkpoint::default();
    ckpt.tasks.insert(id, rec);
    let mut c = AgentCore::new(config(0), ckpt, T0, Instant::now());
    c.recover(
        RecoveryProbe {
            alive: vec![id],
            ..Default::default()
        },
        T0,
    );
    // Probed every ADOPTED_PROBE_MS, one probe at a time.
    assert_eq!(c.next_deadline(T0), Some(T0 + ADOPTED_PROBE_MS));
    let fx = step(&mut c, Input::Tick, T0 + ADOPTED_PROBE_MS);
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::ProbeAdopted(t) if t.len() == 1 && t[0].0 == id)));
    assert!(!step(&mut c, Input::Tick, T0 + 2 * ADOPTED_PROBE_MS)
        .iter()
        .any(|e| matches!(e, Effect::ProbeAdopted(_))));
    let gone = AdoptedProbe {
        task: id,
        pgid: None,
        gone: true,
        recorded: None,
    };
    // Gone without a record before the agent has run NO_EXIT_RECORD_MS: wait for it.
    let fx = step(&mut c, Input::AdoptedProbed(vec![gone.clone()]), T0 + 400);
    assert!(!fx.iter().any(|e| matches!(e, Effect::Settle { .. })));
    assert_eq!(c.next_deadline(T0 + 400), Some(T0 + 400 + ADOPTED_PROBE_MS));
    // Still no record after it: the task ends with an unknown status.
    let fx = step(
        &mut c,
        Input::AdoptedProbed(vec![gone]),
        T0 + NO_EXIT_RECORD_MS,
    );
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Settle { task, status: ExitStatus { code: None, signal: None }, .. } if *task == id
    )));
    // Settling: no more probes.
    assert!(!step(&mut c, Input::Tick, T0 + 5_000)
        .iter()
        .any(|e| matches!(e, Effect::ProbeAdopted(_))));
}

#[test]
fn a_readopted_task_learns_its_group_and_its_recorded_exit() {
    let (id, rec) = checkpointed(TaskState::Running, Some(launched(10)), vec![]);
    let mut rec = rec;
    rec.launched.as_mut().unwrap().task_pgid = 0;
    let mut ckpt = Checkpoint::default();
    ckpt.tasks.insert(id, rec);
    let mut c = AgentCore::new(config(0), ckpt, T0, Instant::now());
    c.recover(
        RecoveryProbe {
            alive: vec![id],
            ..Default::default()
        },
        T0,
    );
    let probe = AdoptedProbe {
        task: id,
        pgid: Some(77),
        gone: false,
        recorded: None,
    };
    let fx = step(&mut c, Input::AdoptedProbed(vec![probe]), T0 + 200);
    assert_eq!(c.checkpoint().tasks[&id].launched.unwrap().task_pgid, 77);
    // Nothing to log: the launch record holds the process group.
    assert!(!fx.iter().any(|e| matches!(e, Effect::Persist(_))));
    let probe = AdoptedProbe {
        task: id,
        pgid: None,
        gone: true,
        recorded: Some(exit(4)),
    };
    // A recorded exit settles at once, even early.
    let fx = step(&mut c, Input::AdoptedProbed(vec![probe]), T0 + 300);
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Settle { task, status, .. } if *task == id && status.code == Some(4)
    )));
}

#[test]
fn a_dead_supervisors_task_is_killed_unless_it_recorded_an_exit() {
    let mut c = registered(0);
    let fw = FrameworkId::random();
    let (a, b) = (task(""), task(""));
    let (ida, idb) = (a.task_id, b.task_id);
    start(&mut c, fw, a, 100);
    start(&mut c, fw, b, 200);
    let fx = step(
        &mut c,
        Input::SupervisorLost {
            task: ida,
            recorded: None,
        },
        T0 + 10,
    );
    assert_eq!(signals(&fx), vec![(100, libc::SIGKILL)]);
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Settle { task, status: ExitStatus { code: None, signal: None }, .. } if *task == ida
    )));
    let fx = step(
        &mut c,
        Input::SupervisorLost {
            task: idb,
            recorded: Some(exit(0)),
        },
        T0 + 10,
    );
    assert!(signals(&fx).is_empty());
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Settle { task, status, .. } if *task == idb && status.code == Some(0)
    )));
}

#[test]
fn a_termination_notice_long_past_its_deadline_is_removed_not_told() {
    let mut c = registered(0);
    let notice = |deadline| Input::TerminationNotice {
        deadline_unix_ms: deadline,
        reason: "spot".into(),
    };
    let told = |fx: &[Effect]| {
        fx.iter()
            .any(|e| matches!(e, Effect::Send(AgentToMaster::TerminationNotice { .. })))
    };
    let removed = |fx: &[Effect]| {
        fx.iter()
            .any(|e| matches!(e, Effect::RemoveTerminationNotice))
    };
    let now = T0 + 100_000;
    // Past its deadline by less than NOTICE_STALE_MS: still told (the host may go any moment).
    let fx = step(&mut c, notice(now - NOTICE_STALE_MS), now);
    assert!(told(&fx) && !removed(&fx));
    let fx = step(&mut c, notice(now - NOTICE_STALE_MS - 1), now);
    assert!(!told(&fx) && removed(&fx));
}

#[test]
fn mps_daemons_start_before_their_tasks_and_restart_after_a_back_off() {
    let mut cfg = config(1);
    cfg.gpu_sharing = crate::gpu::share::Sharing::Mps;
    cfg.mps = true;
    let mut c = AgentCore::new(cfg, Checkpoint::default(), T0, Instant::now());
    register(&mut c);
    c.flush(T0);
    let starts = |fx: &[Effect]| {
        fx.iter()
            .filter(|e| matches!(e, Effect::StartMps(u) if u == "GPU-0"))
            .count()
    };
    let fx = step(
        &mut c,
        run_task(FrameworkId::random(), task(";gpus:0.5")),
        T0,
    );
    let start_at = fx.iter().position(|e| matches!(e, Effect::StartMps(_)));
    let launch_at = fx.iter().position(|e| matches!(e, Effect::Launch(_)));
    assert!(start_at.is_some() && start_at < launch_at, "{fx:?}");
    // A second fractional task on the GPU: its daemon runs already.
    assert_eq!(
        starts(&step(
            &mut c,
            run_task(FrameworkId::random(), task(";gpus:0.25")),
            T0 + 100
        )),
        0
    );
    // It exits soon after: started again only RESTART_BACKOFF_MS after its last start.
    assert_eq!(
        starts(&step(&mut c, Input::MpsExited("GPU-0".into()), T0 + 500)),
        0
    );
    assert_eq!(c.mps_deadline(T0 + 500), Some(T0 + mps::RESTART_BACKOFF_MS));
    assert_eq!(
        starts(&step(&mut c, Input::Tick, T0 + mps::RESTART_BACKOFF_MS - 1)),
        0
    );
    assert_eq!(
        starts(&step(&mut c, Input::Tick, T0 + mps::RESTART_BACKOFF_MS)),
        1
    );
    assert_eq!(c.mps_restarts("GPU-0"), Some(1));
    // Exiting long after its start: restarted at once.
    assert_eq!(
        starts(&step(&mut c, Input::MpsExited("GPU-0".into()), T0 + 60_000)),
        1
    );
    // Without the control binary nothing is started.
    let mut cfg = config(1);
    cfg.gpu_sharing = crate::gpu::share::Sharing::Mps;
    let mut c = AgentCore::new(cfg, Checkpoint::default(), T0, Instant::now());
    register(&mut c);
    assert_eq!(
        starts(&step(
            &mut c,
            run_task(FrameworkId::random(), task(";gpus:0.5")),
            T0
        )),
        0
    );
}

#[test]
fn update_ids_count_up_from_the_seed() {
    let ids = |seed: u128| {
        let mut cfg = config(0);
        cfg.update_id_seed = seed;
        let mut c = AgentCore::new(cfg, Checkpoint::default(), T0, Instant::now());
        register(&mut c);
        let t = TaskInfo {
            task_id: TaskId::from_u128(9),
            ..task("")
        };
        let mut fx = step(&mut c, run_task(FrameworkId::from_u128(8), t), T0);
        fx.extend(step(
            &mut c,
            Input::Launched {
                task: TaskId::from_u128(9),
                result: Ok(launched(100)),
            },
            T0,
        ));
        updates(&fx)
            .into_iter()
            .map(|u| u.update_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(7), vec![UpdateId::from_u128(7), UpdateId::from_u128(8)]);
    assert_eq!(ids(7), ids(7));
    assert_ne!(ids(7), ids(1_000));
}

/// One step of a random run of tasks for the kill index: start a task, kill one, tick, one
/// exits (with or without its cgroup's outcome), its cgroup settles, the master acknowledges.
#[derive(Debug, Clone)]
enum KillStep {
    Start,
    Kill(usize),
    Tick(u64),
    Exit(usize, bool),
    Settle(usize),
    AckAll,
}

fn kill_step() -> impl proptest::strategy::Strategy<Value = KillStep> {
    use proptest::prelude::*;
    prop_oneof![
        Just(KillStep::Start),
        (0usize..8).prop_map(KillStep::Kill),
        (1u64..2500).prop_map(KillStep::Tick),
        (0usize..8, any::<bool>()).prop_map(|(i, o)| KillStep::Exit(i, o)),
        (0usize..8).prop_map(KillStep::Settle),
        Just(KillStep::AckAll),
    ]
}

proptest::proptest! {
    /// The kill deadline from the index of killed tasks equals a scan of every task, after
    /// every step of any run (kills before and after launch, grace periods passing, exits,
    /// settlements, tasks forgotten), and a core rebuilt from the checkpoint agrees too.
    #[test]
    fn the_kill_index_gives_the_deadline_a_scan_of_every_task_gives(
        steps in proptest::collection::vec(kill_step(), 1..60)
    ) {
        let mut c = registered(0);
        let fw = FrameworkId::random();
        let mut ids: Vec<TaskId> = Vec::new();
        let mut now = T0;
        for s in steps {
            match s {
                KillStep::Start => {
                    let t = task("");
                    ids.push(t.task_id);
                    let id = t.task_id;
                    step(&mut c, run_task(fw, t), now);
                    step(&mut c, Input::Launched { task: id, result: Ok(launched(100 + ids.len() as i32)) }, now);
                }
                KillStep::Kill(i) => {
                    let task_id = ids.get(i).copied().unwrap_or_else(TaskId::random);
                    step(&mut c, Input::Master(MasterToAgent::KillTask { framework_id: fw, task_id }), now);
                }
                KillStep::Tick(ms) => {
                    now += ms;
                    step(&mut c, Input::Tick, now);
                }
                KillStep::Exit(i, with_outcome) => {
                    if let Some(&task) = ids.get(i) {
                        let outcome = with_outcome.then(CgroupOutcome::default);
                        step(&mut c, Input::Exited { task, status: exit(0), outcome }, now);
                    }
                }
                KillStep::Settle(i) => {
                    if let Some(&task) = ids.get(i) {
                        step(&mut c, Input::Settled { task, status: exit(0), outcome: CgroupOutcome::default() }, now);
                    }
                }
                KillStep::AckAll => {
                    let acks: Vec<Input> = c
                        .checkpoint()
                        .updates
                        .in_window()
                        .into_iter()
                        .map(|u| Input::Master(MasterToAgent::Acknowledge { task_id: u.task_id, update_id: u.update_id }))
                        .collect();
                    for a in acks {
                        step(&mut c, a, now);
                    }
                }
            }
            c.flush(now);
            proptest::prop_assert_eq!(c.kill_deadline(), c.kill_deadline_scan());
        }
        let rebuilt = AgentCore::new(config(0), c.checkpoint().clone(), now, Instant::now());
        proptest::prop_assert_eq!(rebuilt.kill_deadline(), rebuilt.kill_deadline_scan());
    }
}
