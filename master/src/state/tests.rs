//! Unit tests of the pure state machine: inputs and time in, messages out.
//!
//! Over 800 lines: the state machine's tests predate the split into handler modules; they are to
//! move beside each handler (one file per operation, issue 12).

use super::*;

const A: ConnId = 1;
const F: ConnId = 2;

fn res(s: &str) -> Resources {
    s.parse().unwrap()
}

struct Harness {
    m: Master,
    now: Millis,
}

impl Harness {
    fn new() -> Self {
        Self {
            m: Master::new(
                MasterConfig {
                    allocation_min_gap_ms: 0,
                    ..MasterConfig::default()
                },
                7,
            ),
            now: 0,
        }
    }

    fn input(&mut self, i: Input) -> Vec<Output> {
        let mut out = self.m.handle(i, self.now);
        if self.m.allocation_due(self.now) {
            self.m.allocate(self.now, &mut out);
        }
        out
    }

    fn agent(&mut self, conn: ConnId, name: &str, resources: &str) -> AgentId {
        self.input(Input::AgentConnected {
            conn,
            name: name.into(),
            address: "127.0.0.1:1".into(),
        });
        let out = self.input(Input::Agent {
            conn,
            msg: register(None, resources),
        });
        out.iter()
            .find_map(|o| match o {
                Output::ToAgent(c, MasterToAgent::Registered { agent_id, .. }) if *c == conn => {
                    Some(*agent_id)
                }
                _ => None,
            })
            .expect("registered")
    }

    fn framework(
        &mut self,
        conn: ConnId,
        principal: &str,
        role: &str,
    ) -> (FrameworkId, Vec<Offer>) {
        self.input(Input::FrameworkConnected {
            conn,
            principal: principal.into(),
        });
        let out = self.input(Input::Framework {
            conn,
            msg: FrameworkToMaster::Subscribe(info(principal, role, None)),
        });
        let id = out
            .iter()
            .find_map(|o| match o {
                Output::ToFramework(c, MasterToFramework::Subscribed { framework_id, .. })
                    if *c == conn =>
                {
                    Some(*framework_id)
                }
                _ => None,
            })
            .expect("subscribed");
        (id, offers(&out, conn))
    }
}

fn register(agent_id: Option<AgentId>, resources: &str) -> AgentToMaster {
    AgentToMaster::Register {
        agent_id,
        hostname: "h".into(),
        resources: res(resources),
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: vec![],
        running_tasks: vec![],
        pending_updates: vec![],
        task_user: "nobody".into(),
    }
}

fn info(name: &str, role: &str, id: Option<FrameworkId>) -> FrameworkInfo {
    FrameworkInfo {
        framework_id: id,
        name: name.into(),
        roles: vec![role.into()],
        capabilities: vec![],
        failover_timeout_secs: 10.0,
    }
}

fn offers(out: &[Output], conn: ConnId) -> Vec<Offer> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(c, MasterToFramework::Offers(v)) if *c == conn => Some(v.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn errors(out: &[Output]) -> Vec<ErrorKind> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(_, MasterToFramework::Error { kind, .. }) => Some(*kind),
            _ => None,
        })
        .collect()
}

fn task(r: &str) -> TaskInfo {
    TaskInfo {
        task_id: TaskId::random(),
        name: "t".into(),
        command: "true".into(),
        resources: res(r),
        env: Default::default(),
        kill_grace_secs: None,
        gpu_selector: None,
    }
}

fn launch(offer: OfferId, tasks: Vec<TaskInfo>) -> FrameworkToMaster {
    FrameworkToMaster::Accept {
        offer_ids: vec![offer],
        operations: vec![Operation::Launch { tasks }],
        refuse_seconds: Some(0.0),
    }
}

fn agent_update(task: &TaskInfo, fw: FrameworkId, state: TaskState) -> StatusUpdate {
    StatusUpdate {
        update_id: UpdateId::random(),
        task_id: task.task_id,
        framework_id: fw,
        agent_id: None,
        state,
        source: UpdateSource::Agent,
        reason: None,
        message: String::new(),
        exit_code: None,
        signal: None,
        gpus: vec![],
        timestamp_ms: 0,
        reconciliation: false,
    }
}

#[test]
fn offers_are_single_use_and_must_fit() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (_fw, offers) = h.framework(F, "f", "r");
    assert_eq!(offers.len(), 1);
    let offer = offers[0].id;
    // Too big: ERROR update, offer consumed, nothing launched.
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offer, vec![task("cpus:5")]),
    });
    assert_eq!(errors(&out), vec![ErrorKind::InsufficientResources]);
    assert!(!out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::RunTask { .. }))));
    // The same offer again: unknown.
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offer, vec![task("cpus:1")]),
    });
    assert!(errors(&out).contains(&ErrorKind::UnknownOffer), "{out:?}");
    // A fresh offer (resources came back) launches.
    let mut offers = offers_of(&out);
    if offers.is_empty() {
        offers = offers_after_revive(&mut h);
    }
    let t = task("cpus:1;mem:100");
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    assert!(out.iter().any(|o| matches!(o, Output::ToAgent(A, MasterToAgent::RunTask { task, .. }) if task.task_id == t.task_id)));
    assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Staging);
}

fn offers_after_revive(h: &mut Harness) -> Vec<Offer> {
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Revive { roles: vec![] },
    });
    offers(&out, F)
}

#[test]
fn invalid_tasks_are_errors_and_valid_ones_launch() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (_fw, offers) = h.framework(F, "f", "r");
    let good = task("cpus:1");
    let mut empty_cmd = task("cpus:1");
    empty_cmd.command = " ".into();
    let no_res = task("disk:1");
    let mut frac_gpu = task("cpus:1;gpus:0.5");
    frac_gpu.name = "g".into();
    let dup = good.clone();
    let mut empty_argv = task("cpus:1");
    empty_argv.command = CommandInfo::argv(Vec::<String>::new());
    let mut empty_program = task("cpus:1");
    empty_program.command = CommandInfo::argv(["", "x"]);
    let mut bad_user = task("cpus:1");
    bad_user.command = CommandInfo::shell("true").with_user("../root");
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(
            offers[0].id,
            vec![
                good.clone(),
                empty_cmd,
                no_res,
                frac_gpu,
                dup,
                empty_argv,
                empty_program,
                bad_user,
            ],
        ),
    });
    let runs = out
        .iter()
        .filter(|o| matches!(o, Output::ToAgent(_, MasterToAgent::RunTask { .. })))
        .count();
    assert_eq!(runs, 1);
    assert_eq!(errors(&out).len(), 7, "{out:?}");
    let messages: Vec<String> = out
        .iter()
        .filter_map(|o| match o {
            Output::ToFramework(_, MasterToFramework::Update(u)) if u.state == TaskState::Error => {
                assert_eq!(u.reason, Some(TaskReason::InvalidTask));
                Some(u.message.clone())
            }
            _ => None,
        })
        .collect();
    for want in [
        "empty shell command",
        "empty argv",
        "empty program",
        "invalid user name",
    ] {
        assert!(
            messages.iter().any(|m| m.contains(want)),
            "{want}: {messages:?}"
        );
    }
}

/// Launches `tasks` with the framework on `F` and returns what the agent was asked to run.
fn run_tasks(
    h: &mut Harness,
    offer: OfferId,
    tasks: Vec<TaskInfo>,
) -> (Vec<TaskInfo>, Vec<Output>) {
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offer, tasks),
    });
    let sent = out
        .iter()
        .filter_map(|o| match o {
            Output::ToAgent(_, MasterToAgent::RunTask { task, .. }) => Some(task.clone()),
            _ => None,
        })
        .collect();
    (sent, out)
}

#[test]
fn task_users_default_to_the_agents_and_are_checked_against_run_tasks_acls() {
    let acls = crate::acl::Acls::from_toml(
        r#"
[[register_frameworks]]
principals = ["*"]
roles = ["*"]

[[run_tasks]]
principals = ["f"]
users = ["nobody", "alice"]
"#,
    )
    .unwrap();
    let mut h = Harness::new();
    h.m.config.acls = acls;
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (_fw, offers) = h.framework(F, "f", "r");
    let default_user = task("cpus:1");
    let mut alice = task("cpus:1");
    alice.command = CommandInfo::argv(["id", "-u"]).with_user("alice");
    let mut root = task("cpus:1");
    root.command = CommandInfo::shell("cat /etc/shadow").with_user("root");
    let mut bob = task("cpus:1");
    bob.command = CommandInfo::shell("true").with_user("bob");
    let (sent, out) = run_tasks(
        &mut h,
        offers[0].id,
        vec![default_user.clone(), alice.clone(), root.clone(), bob],
    );
    // The default is filled in before launching (the agent reported `nobody`).
    let users: Vec<(TaskId, Option<String>)> = sent
        .iter()
        .map(|t| (t.task_id, t.command.user.clone()))
        .collect();
    assert_eq!(
        users,
        vec![
            (default_user.task_id, Some("nobody".to_string())),
            (alice.task_id, Some("alice".to_string())),
        ]
    );
    assert_eq!(
        h.m.tasks[&default_user.task_id].record().user.as_deref(),
        Some("nobody")
    );
    let refused: Vec<String> = out
        .iter()
        .filter_map(|o| match o {
            Output::ToFramework(_, MasterToFramework::Update(u)) if u.state == TaskState::Error => {
                Some(u.message.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused[0].contains("may not run tasks as user \"root\""),
        "{refused:?}"
    );
    assert!(refused[1].contains("\"bob\""), "{refused:?}");
}

#[test]
fn task_records_keep_reason_exit_times_and_gpus() {
    let mut h = Harness::new();
    let agent = h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1;mem:64");
    h.now = 1_000;
    run_tasks(&mut h, offers[0].id, vec![t.clone()]);
    h.now = 2_000;
    let mut running = agent_update(&t, fw, TaskState::Running);
    running.gpus = vec!["GPU-1".into()];
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(running.clone()),
    });
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Acknowledge {
            task_id: t.task_id,
            update_id: running.update_id,
        },
    });
    h.now = 5_000;
    let mut oom = agent_update(&t, fw, TaskState::Failed);
    oom.reason = Some(TaskReason::MemoryLimit);
    oom.message = "memory-limit: the task exceeded its memory limit of 64 MiB".into();
    oom.signal = Some(9);
    oom.gpus = vec!["GPU-1".into()];
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(oom.clone()),
    });
    // Ended but not yet acknowledged: still among the tasks, with its end recorded.
    let view = h.m.view(h.now, 1_000_000);
    let v = &view.tasks[0];
    assert_eq!(
        (v.state.as_str(), v.reason.as_deref()),
        ("FAILED", Some("memory-limit"))
    );
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Acknowledge {
            task_id: t.task_id,
            update_id: oom.update_id,
        },
    });
    let view = h.m.view(h.now, 1_000_000);
    assert!(view.tasks.is_empty());
    let c = &view.completed_tasks[0];
    assert_eq!(c.id, t.task_id.to_string());
    assert_eq!(c.name, t.name);
    assert_eq!(c.agent_id, agent.to_string());
    assert_eq!(c.role, "r");
    assert_eq!(c.user.as_deref(), Some("nobody"));
    assert_eq!(c.gpus, vec!["GPU-1".to_string()]);
    assert_eq!(c.reason.as_deref(), Some("memory-limit"));
    assert!(c.message.contains("64 MiB"));
    assert_eq!((c.exit_code, c.signal), (None, Some(9)));
    // Master clock 1 s, 2 s, 5 s; the wall clock reads 1,000,000 at 5 s.
    assert_eq!(
        (c.staged_at_ms, c.started_at_ms, c.ended_at_ms),
        (996_000, Some(997_000), Some(1_000_000))
    );
    // Reconciliation answers from the record (from the backlog, as the framework reads).
    let mut out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Reconcile {
            task_ids: vec![t.task_id],
        },
    });
    h.m.work_backlog(h.now, &mut out, |_| usize::MAX);
    assert!(out.iter().any(|o| matches!(o, Output::ToFramework(F, MasterToFramework::Update(u))
        if u.reconciliation && u.state == TaskState::Failed && u.reason == Some(TaskReason::MemoryLimit) && u.signal == Some(9))));
}

/// Runs `n` one-cpu tasks of the framework on `F` to FINISHED (acknowledged), each on an
/// offer outstanding at the time (starting with `offers`); returns their ids.
fn finish_tasks(h: &mut Harness, fw: FrameworkId, mut offers: Vec<Offer>, n: usize) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let offer = offers.pop().expect("an outstanding offer");
        let t = task("cpus:1");
        let (sent, out) = run_tasks(h, offer.id, vec![t.clone()]);
        assert_eq!(sent.len(), 1);
        offers.extend(offers_of(&out));
        let done = agent_update(&t, fw, TaskState::Finished);
        let out = h.input(Input::Agent {
            conn: A,
            msg: AgentToMaster::StatusUpdate(done.clone()),
        });
        offers.extend(offers_of(&out));
        let out = h.input(Input::Framework {
            conn: F,
            msg: FrameworkToMaster::Acknowledge {
                task_id: t.task_id,
                update_id: done.update_id,
            },
        });
        offers.extend(offers_of(&out));
        h.now += 1;
        ids.push(t.task_id);
    }
    ids
}

#[test]
fn kept_messages_are_bounded() {
    assert_eq!(kept_message("short"), "short");
    let long = "é".repeat(1000);
    let cut = kept_message(&long);
    assert!(
        cut.len() <= MAX_KEPT_MESSAGE && cut.ends_with('…'),
        "{}",
        cut.len()
    );
}

#[test]
fn completed_history_is_bounded_per_framework_and_by_completed_frameworks() {
    let mut h = Harness::new();
    h.m.config.max_completed_tasks_per_framework = 3;
    h.m.config.max_completed_frameworks = 1;
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let ids = finish_tasks(&mut h, fw, offers, 5);
    let kept: Vec<String> =
        h.m.view(h.now, 0)
            .completed_tasks
            .iter()
            .map(|c| c.id.clone())
            .collect();
    let newest: Vec<String> = ids[2..].iter().map(|i| i.to_string()).collect();
    assert_eq!(kept, newest, "the oldest are dropped first");
    // Torn down: the framework and its history stay, as a completed framework.
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Teardown,
    });
    let view = h.m.view(h.now, 0);
    assert_eq!(view.completed_frameworks.len(), 1);
    assert_eq!(view.completed_frameworks[0].id, fw.to_string());
    assert_eq!(view.completed_tasks.len(), 3);
    // A second framework completes: the first (oldest) goes, with its tasks.
    h.input(Input::FrameworkDisconnected { conn: F });
    let (fw2, _) = h.framework(F + 10, "g", "r");
    h.input(Input::Framework {
        conn: F + 10,
        msg: FrameworkToMaster::Teardown,
    });
    let view = h.m.view(h.now, 0);
    let gone: Vec<String> = view
        .completed_frameworks
        .iter()
        .map(|f| f.id.clone())
        .collect();
    assert_eq!(gone, vec![fw2.to_string()]);
    assert!(view.completed_tasks.is_empty());
    assert!(h.m.completed.is_empty());
}

#[test]
fn accepted_resources_return_when_tasks_end_and_acks_flow_back() {
    let mut h = Harness::new();
    let agent = h.agent(A, "a1", "cpus:2;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:2;mem:1024");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    assert!(h.m.allocator.framework_allocated(fw).total() == res("cpus:2;mem:1024"));
    // FINISHED from the agent goes to the framework, not yet acked to the agent.
    let done = agent_update(&t, fw, TaskState::Finished);
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(done.clone()),
    });
    assert!(out.iter().any(|o| matches!(o, Output::ToFramework(F, MasterToFramework::Update(u)) if u.update_id == done.update_id && u.agent_id == Some(agent))));
    assert!(!out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::Acknowledge { .. }))));
    // Resources are back and offered again at once.
    assert!(!offers_of(&out).is_empty());
    // The framework's ack reaches the agent; the task completes.
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Acknowledge {
            task_id: t.task_id,
            update_id: done.update_id,
        },
    });
    assert!(out.iter().any(|o| matches!(o, Output::ToAgent(A, MasterToAgent::Acknowledge { update_id, .. }) if *update_id == done.update_id)));
    assert!(!h.m.tasks.contains_key(&t.task_id));
    assert_eq!(
        h.m.completed_task(fw, t.task_id).map(|c| c.state),
        Some(TaskState::Finished)
    );
    // A retransmission of an acknowledged update is acknowledged, not redelivered.
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(done),
    });
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(A, MasterToAgent::Acknowledge { .. }))));
    assert!(!out
        .iter()
        .any(|o| matches!(o, Output::ToFramework(_, MasterToFramework::Update(_)))));
}

fn offers_of(out: &[Output]) -> Vec<Offer> {
    offers(out, F)
}

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
fn agent_reregistering_in_time_keeps_its_tasks() {
    let mut h = Harness::new();
    let agent = h.agent(A, "a1", "cpus:2;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    h.input(Input::AgentDisconnected { conn: A });
    h.now += 5_000;
    h.input(Input::AgentConnected {
        conn: 9,
        name: "a1".into(),
        address: "x".into(),
    });
    let running = RunningTask {
        framework_id: fw,
        task: t.clone(),
        state: TaskState::Running,
        gpus: vec![],
    };
    let AgentToMaster::Register { resources, .. } = register(None, "cpus:2;mem:1024") else {
        unreachable!()
    };
    let out = h.input(Input::Agent {
        conn: 9,
        msg: AgentToMaster::Register {
            agent_id: Some(agent),
            hostname: "h".into(),
            resources,
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: vec![],
            running_tasks: vec![running],
            pending_updates: vec![],
            task_user: "nobody".into(),
        },
    });
    assert!(out.iter().any(|o| matches!(o, Output::ToAgent(9, MasterToAgent::Registered { agent_id, .. }) if *agent_id == agent)));
    h.now += 20_000;
    let out = h.input(Input::Tick);
    assert!(!out.iter().any(|o| matches!(o, Output::ToFramework(_, MasterToFramework::Update(u)) if u.state == TaskState::Lost)));
    assert!(h.m.tasks.contains_key(&t.task_id));
}

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
fn role_names() {
    assert!(valid_role("eng"));
    assert!(valid_role("eng/ml"));
    for bad in ["", "/eng", "eng/", "eng//ml", "..", "a b", "eng/.."] {
        assert!(!valid_role(bad), "{bad}");
    }
}

#[test]
fn operator_commands_are_validated() {
    let mut h = Harness::new();
    assert!(h
        .m
        .operator(OperatorCommand::SetWeight {
            role: "a".into(),
            weight: 2.0
        })
        .is_ok());
    assert!(h
        .m
        .operator(OperatorCommand::SetWeight {
            role: "a".into(),
            weight: 0.0
        })
        .is_err());
    assert!(h
        .m
        .operator(OperatorCommand::SetWeight {
            role: "a b".into(),
            weight: 1.0
        })
        .is_err());
    let q = |role: &str, g: &str, l: &str| OperatorCommand::SetQuota {
        role: role.into(),
        guarantee: Some(res(g)),
        limit: Some(ResourceLimits::parse(l).unwrap()),
    };
    assert!(h.m.operator(q("a", "cpus:2", "cpus:4")).is_ok());
    assert!(h.m.operator(q("a", "cpus:8", "cpus:4")).is_err());
    assert!(
        h.m.operator(q("a", "mem:1", "mem:0")).is_err(),
        "a zero limit is a limit"
    );
    assert_eq!(h.m.allocator.metrics().roles["a"].weight, 2.0);
    // Nested guarantees: the subroles' sum may not exceed the parent's, and the parent may not
    // go below it; a refused quota changes nothing.
    assert!(h.m.operator(q("a/x", "cpus:1.5", "")).is_ok());
    let err = h.m.operator(q("a/y", "cpus:1", "")).unwrap_err();
    assert!(err.contains("\"a\"") && err.contains("cpus:2.5"), "{err}");
    let err = h.m.operator(q("a", "cpus:1", "")).unwrap_err();
    assert!(err.contains("below"), "{err}");
    let roles = h.m.allocator.metrics().roles;
    assert_eq!(roles["a"].quota_guarantee, Some(res("cpus:2")));
    assert_eq!(
        roles["a"].quota_limit,
        Some(ResourceLimits::parse("cpus:4").unwrap())
    );
    assert_eq!(
        roles.get("a/y").and_then(|r| r.quota_guarantee.clone()),
        None
    );
}

#[test]
fn weights_and_quotas_outside_sane_bounds_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    for weight in [
        f64::NAN,
        f64::INFINITY,
        -1.0,
        0.0,
        MIN_WEIGHT / 2.0,
        MAX_WEIGHT * 2.0,
        1e300,
    ] {
        let err =
            h.m.operator(OperatorCommand::SetWeight {
                role: "a".into(),
                weight,
            })
            .unwrap_err();
        assert!(err.contains("positive"), "{weight}: {err}");
    }
    for weight in [MIN_WEIGHT, MAX_WEIGHT] {
        assert!(h
            .m
            .operator(OperatorCommand::SetWeight {
                role: "b".into(),
                weight,
            })
            .is_ok());
    }
    assert!(!h.m.allocator.metrics().roles.contains_key("a"));
    let huge = Resources::new().with("cpus", 2e12);
    for (guarantee, limit) in [
        (Some(huge.clone()), None),
        (None, Some(ResourceLimits::from(&huge))),
    ] {
        assert!(h
            .m
            .operator(OperatorCommand::SetQuota {
                role: "a".into(),
                guarantee,
                limit,
            })
            .is_err());
    }
    let many = (0..=MAX_QUOTA_KINDS).fold(Resources::new(), |r, i| r.with(&format!("r{i}"), 1.0));
    assert!(h
        .m
        .operator(OperatorCommand::SetQuota {
            role: "a".into(),
            guarantee: None,
            limit: Some(ResourceLimits::from(&many)),
        })
        .is_err());
}

fn gpu_info(i: u32) -> GpuInfo {
    GpuInfo {
        uuid: format!("GPU-{i}"),
        name: "NVIDIA A100".into(),
        memory_mib: 40960,
        compute_capability: (8, 0),
        minor: i,
        pci_bus_id: format!("00000000:0{i}:00.0"),
        numa_node: Some(0),
        healthy: true,
        mig_profile: None,
        parent_uuid: None,
    }
}

#[test]
fn unhealthy_gpu_is_withdrawn_from_offers_and_reservations_stay() {
    let mut h = Harness::new();
    h.input(Input::AgentConnected {
        conn: A,
        name: "g1".into(),
        address: "127.0.0.1:1".into(),
    });
    let mut reserved = BTreeMap::new();
    reserved.insert("ml".to_string(), res("gpus:1"));
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::Register {
            agent_id: None,
            hostname: "h".into(),
            resources: res("cpus:4;mem:1024;gpus:3"),
            reserved,
            attributes: Default::default(),
            gpus: (0..4).map(gpu_info).collect(),
            running_tasks: vec![],
            pending_updates: vec![],
            task_user: "nobody".into(),
        },
    });
    h.input(Input::FrameworkConnected {
        conn: F,
        principal: "f".into(),
    });
    let mut fw = info("f", "ml", None);
    fw.capabilities = vec![Capability::GpuResources];
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Subscribe(fw),
    });
    let offered = offers(&out, F);
    assert_eq!(offered.len(), 1);
    assert_eq!(offered[0].total().get("gpus"), 4.0);
    assert_eq!(offered[0].gpus.len(), 4);

    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::GpuHealth {
            uuid: "GPU-2".into(),
            healthy: false,
            reason: "critical XID 79".into(),
        },
    });
    assert!(
        out.iter().any(|o| matches!(
            o,
            Output::ToFramework(F, MasterToFramework::Rescind { offer_id }) if *offer_id == offered[0].id
        )),
        "{out:?}"
    );
    let view = h.m.view(h.now, 0);
    let agent = &view.agents[0];
    assert_eq!(agent.total.get("gpus"), 3.0, "2 unreserved + 1 reserved");
    assert_eq!(agent.reserved["ml"].get("gpus"), 1.0);
    assert_eq!(
        agent.gpus.iter().filter(|g| !g.healthy).count(),
        1,
        "{:?}",
        agent.gpus
    );
    // Reported again (e.g. after an agent restart): nothing changes.
    let again = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::GpuHealth {
            uuid: "GPU-2".into(),
            healthy: false,
            reason: "critical XID 79".into(),
        },
    });
    assert!(!again
        .iter()
        .any(|o| matches!(o, Output::ToFramework(_, MasterToFramework::Rescind { .. }))));
    // Cleared: back in the pool.
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::GpuHealth {
            uuid: "GPU-2".into(),
            healthy: true,
            reason: "cleared by operator".into(),
        },
    });
    assert_eq!(h.m.view(h.now, 0).agents[0].total.get("gpus"), 4.0);
}

/// A new leader that recovered a registry holding agent `a1` (`id`, recorded `hostname`),
/// after `a1` re-registered with its id (hostname "h") on `conn`: the outputs.
fn reregister_after_recovery(id: AgentId, hostname: &str, conn: ConnId) -> Vec<Output> {
    let mut registry = crate::registry::Registry::default();
    registry.agents.insert(
        id,
        crate::registry::AgentRecord {
            id,
            name: "a1".into(),
            hostname: hostname.into(),
        },
    );
    let mut h = Harness::new();
    h.m.recover(registry, 0);
    h.input(Input::AgentConnected {
        conn,
        name: "a1".into(),
        address: "127.0.0.1:1".into(),
    });
    h.input(Input::Agent {
        conn,
        msg: register(Some(id), "cpus:4"),
    })
}

#[test]
fn recovered_agents_reregister_without_rewriting_the_registry() {
    let mut h = Harness::new();
    let a = h.agent(1, "a1", "cpus:4");
    let persists = |out: &[Output]| {
        out.iter()
            .filter(|o| matches!(o, Output::Persist(_)))
            .count()
    };
    // A new leader recovers the registry that holds a1, then a1 re-registers with its id.
    let out = reregister_after_recovery(a, "h", 5);
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(5, MasterToAgent::Registered { agent_id, .. }) if *agent_id == a)));
    assert_eq!(
        persists(&out),
        0,
        "unchanged record is not rewritten: {out:?}"
    );
    // A changed hostname is written.
    let out = reregister_after_recovery(a, "old-host", 6);
    assert_eq!(persists(&out), 1, "{out:?}");
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

// ---------------------------------------------------------------------------------------------
// Security between tenants (docs/security.md): identities, ACLs, limits.

/// The subscription refusal on `conn`, if any: the error text, and whether it closes.
fn refusal(out: &[Output], conn: ConnId) -> Option<String> {
    let message = out.iter().find_map(|o| match o {
        Output::ToFramework(c, MasterToFramework::Error { message, .. }) if *c == conn => {
            Some(message.clone())
        }
        _ => None,
    })?;
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Close { conn: c, .. } if *c == conn)),
        "refused but not closed: {out:?}"
    );
    assert!(
        !out.iter().any(|o| matches!(
            o,
            Output::ToFramework(c, MasterToFramework::Subscribed { .. }) if *c == conn
        )),
        "refused and subscribed: {out:?}"
    );
    Some(message)
}

/// The agent refusal on `conn`, if any.
fn agent_refusal(out: &[Output], conn: ConnId) -> Option<String> {
    let message = out.iter().find_map(|o| match o {
        Output::ToAgent(c, MasterToAgent::Error { message }) if *c == conn => Some(message.clone()),
        _ => None,
    })?;
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Close { conn: c, .. } if *c == conn)),
        "refused but not closed: {out:?}"
    );
    assert!(
        !out.iter().any(|o| matches!(
            o,
            Output::ToAgent(c, MasterToAgent::Registered { .. }) if *c == conn
        )),
        "refused and registered: {out:?}"
    );
    Some(message)
}

impl Harness {
    fn with_config(config: MasterConfig) -> Self {
        Self {
            m: Master::new(
                MasterConfig {
                    allocation_min_gap_ms: 0,
                    ..config
                },
                7,
            ),
            now: 0,
        }
    }

    /// A raw subscribe by `principal` on a new connection `conn`.
    fn subscribe(&mut self, conn: ConnId, principal: &str, info: FrameworkInfo) -> Vec<Output> {
        self.input(Input::FrameworkConnected {
            conn,
            principal: principal.into(),
        });
        self.input(Input::Framework {
            conn,
            msg: FrameworkToMaster::Subscribe(info),
        })
    }

    /// A raw registration by agent `name` on a new connection `conn`.
    fn register(&mut self, conn: ConnId, name: &str, msg: AgentToMaster) -> Vec<Output> {
        self.input(Input::AgentConnected {
            conn,
            name: name.into(),
            address: format!("10.0.0.{conn}:5051"),
        });
        self.input(Input::Agent { conn, msg })
    }
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
fn agent_identity_is_its_name_plus_its_id() {
    let mut h = Harness::new();
    let a1 = h.agent(A, "a1", "cpus:2;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1");
    h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    // A second live agent under the same name, without an id or with another one: refused
    // with the conflict named; the first keeps its connection and its task.
    for (conn, claim) in [(10, None), (11, Some(AgentId::random()))] {
        let out = h.register(conn, "a1", register(claim, "cpus:8"));
        let m = agent_refusal(&out, conn).expect("name conflict refused");
        assert!(m.contains("\"a1\"") && m.contains(&a1.to_string()), "{m}");
        assert!(!out
            .iter()
            .any(|o| matches!(o, Output::Close { conn: A, .. })));
        assert!(!out.iter().any(|o| matches!(
            o,
            Output::ToFramework(_, MasterToFramework::Update(u)) if u.state == TaskState::Lost
        )));
    }
    assert_eq!(h.m.agents[&a1].conn, Some(A));
    assert!(h.m.tasks.contains_key(&t.task_id));
    // Another certificate claiming a1's id (a squatter): refused; it cannot forge a1's updates.
    let out = h.register(12, "squatter", register(Some(a1), "cpus:1"));
    let m = agent_refusal(&out, 12).expect("foreign id refused");
    assert!(m.contains("belongs to agent \"a1\""), "{m}");
    let out = h.input(Input::Agent {
        conn: 12,
        msg: AgentToMaster::StatusUpdate(agent_update(&t, fw, TaskState::Finished)),
    });
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Close { conn: 12, .. })));
    assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Staging);
    // The same agent restarting (same name, same id) replaces its old connection.
    let out = h.register(13, "a1", register(Some(a1), "cpus:2;mem:1024"));
    assert!(agent_refusal(&out, 13).is_none(), "{out:?}");
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Close { conn: A, .. })));
    assert_eq!(h.m.agents[&a1].conn, Some(13));
    // Disconnected but within the re-register timeout: still refused for a new incarnation.
    h.input(Input::AgentDisconnected { conn: 13 });
    h.now += 5_000;
    h.input(Input::Tick);
    let out = h.register(14, "a1", register(None, "cpus:8"));
    let m = agent_refusal(&out, 14).expect("refused while the old one may come back");
    assert!(m.contains("disconnected 5 s ago"), "{m}");
    // Gone for the re-register timeout: removed, and a new incarnation is admitted.
    h.now += 6_000;
    h.input(Input::Tick);
    let out = h.register(15, "a1", register(None, "cpus:8"));
    assert!(agent_refusal(&out, 15).is_none(), "{out:?}");
    assert_eq!(h.m.agents.len(), 1);
    assert!(!h.m.agents.contains_key(&a1));
}

#[test]
fn an_unknown_agent_id_joins_as_a_new_agent_and_its_tasks_are_killed() {
    let mut h = Harness::new();
    let (fw, _) = h.framework(F, "f", "r");
    let claimed = AgentId::random();
    let stray = task("cpus:1");
    let AgentToMaster::Register { resources, .. } = register(None, "cpus:2") else {
        unreachable!()
    };
    let out = h.register(
        A,
        "a1",
        AgentToMaster::Register {
            agent_id: Some(claimed),
            hostname: "h".into(),
            resources,
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: vec![],
            running_tasks: vec![RunningTask {
                framework_id: fw,
                task: stray.clone(),
                state: TaskState::Running,
                gpus: vec![],
            }],
            pending_updates: vec![],
            task_user: "nobody".into(),
        },
    );
    let id = out
        .iter()
        .find_map(|o| match o {
            Output::ToAgent(A, MasterToAgent::Registered { agent_id, .. }) => Some(*agent_id),
            _ => None,
        })
        .expect("registered");
    assert_ne!(id, claimed, "an unknown id is not granted");
    assert!(out.iter().any(|o| matches!(
        o,
        Output::ToAgent(A, MasterToAgent::KillTask { task_id, .. }) if *task_id == stray.task_id
    )));
    assert!(!h.m.tasks.contains_key(&stray.task_id), "not adopted");
    assert!(h.m.allocator.in_use(fw, id).is_empty(), "nothing charged");
}

#[test]
fn a_recovered_agents_name_is_kept_for_it_until_its_deadline() {
    let id = AgentId::random();
    let mut registry = crate::registry::Registry::default();
    registry.agents.insert(
        id,
        crate::registry::AgentRecord {
            id,
            name: "a1".into(),
            hostname: "h".into(),
        },
    );
    let mut h = Harness::new();
    h.m.recover(registry, 0);
    let out = h.register(10, "a1", register(None, "cpus:4"));
    let m = agent_refusal(&out, 10).expect("name kept for the recovering agent");
    assert!(m.contains("failover"), "{m}");
    let out = h.register(11, "other", register(Some(id), "cpus:4"));
    assert!(agent_refusal(&out, 11).is_some());
    let out = h.register(12, "a1", register(Some(id), "cpus:4"));
    assert!(out.iter().any(
        |o| matches!(o, Output::ToAgent(12, MasterToAgent::Registered { agent_id, .. }) if *agent_id == id)
    ));
}

#[test]
fn roles_need_an_acl_grant_once_acls_exist() {
    let acls = crate::acl::Acls::from_toml(
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
