//! Maintenance: drains with deadlines, notices to frameworks, what a new leader keeps.

use super::*;

const G: ConnId = 3;

/// The shared [`Harness`] with the maintenance schedule restored (empty) at a wall clock of
/// 1,000 s.
struct H(Harness);

impl std::ops::Deref for H {
    type Target = Harness;
    fn deref(&self) -> &Harness {
        &self.0
    }
}

impl std::ops::DerefMut for H {
    fn deref_mut(&mut self) -> &mut Harness {
        &mut self.0
    }
}

impl H {
    fn new() -> Self {
        let mut h = Harness::new();
        h.m.restore_maintenance(&Registry::default(), 0, 1_000_000);
        Self(h)
    }

    /// A timer tick, with a heartbeat from the agent first (if it is connected).
    fn tick(&mut self) -> Vec<Output> {
        if self.m.agents.values().any(|a| a.conn == Some(A)) {
            self.input(Input::Agent {
                conn: A,
                msg: AgentToMaster::Heartbeat,
            });
        }
        self.input(Input::Tick)
    }

    fn cmd(&mut self, c: MaintenanceCommand) -> Vec<Output> {
        let now = self.now;
        let mut out = self.m.maintenance(c, now).expect("accepted");
        if self.m.allocation_due(now) {
            self.m.allocate(now, &mut out);
        }
        out
    }

    /// Agent `name` (hostname `h1`, 4 cpus) registers on `conn`, with `id` if it had one.
    fn agent(&mut self, conn: ConnId, name: &str, id: Option<AgentId>) -> Vec<Output> {
        let mut msg = register(id, "cpus:4;mem:1024");
        if let AgentToMaster::Register { hostname, .. } = &mut msg {
            *hostname = "h1".into();
        }
        self.register(conn, name, msg)
    }

    fn framework(&mut self, conn: ConnId, name: &str) -> (FrameworkId, Vec<Output>) {
        let mut info = info(name, "r", None);
        info.failover_timeout_secs = 60.0;
        let out = self.subscribe(conn, name, info);
        let id = subscribed(&out).expect("subscribed");
        (id, out)
    }

    fn update(&mut self, t: TaskId, fw: FrameworkId, state: TaskState) -> Vec<Output> {
        self.input(Input::Agent {
            conn: A,
            msg: AgentToMaster::StatusUpdate(StatusUpdate::new(t, fw, state)),
        })
    }
}

fn agent_id(out: &[Output]) -> AgentId {
    out.iter()
        .find_map(|o| match o {
            Output::ToAgent(_, MasterToAgent::Registered { agent_id, .. }) => Some(*agent_id),
            _ => None,
        })
        .expect("registered")
}

fn offers(out: &[Output]) -> Vec<Offer> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(_, MasterToFramework::Offers(v)) => Some(v.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn notices(out: &[Output], conn: ConnId) -> Vec<DrainNotice> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(c, MasterToFramework::DrainNotice(n)) if *c == conn => {
                Some(n.clone())
            }
            _ => None,
        })
        .collect()
}

fn kills(out: &[Output]) -> Vec<TaskId> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToAgent(A, MasterToAgent::KillTask { task_id, .. }) => Some(*task_id),
            _ => None,
        })
        .collect()
}

fn persisted(out: &[Output]) -> Vec<Mutation> {
    out.iter()
        .filter_map(|o| match o {
            Output::Persist(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

/// One agent, one framework with one running task on it.
fn running() -> (H, AgentId, FrameworkId, TaskId) {
    let mut h = H::new();
    let agent = agent_id(&h.agent(A, "a1", None));
    let (fw, out) = h.framework(F, "f");
    let offer = offers(&out).remove(0);
    let t = TaskId::random();
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Accept {
            offer_ids: vec![offer.id],
            operations: vec![Operation::Launch {
                tasks: vec![TaskInfo {
                    task_id: t,
                    name: "t".into(),
                    command: "sleep 100".into(),
                    resources: res("cpus:1;mem:128"),
                    env: Default::default(),
                    kill_grace_secs: Some(2),
                    gpu_selector: None,
                    container: None,
                }],
            }],
            refuse_seconds: Some(0.0),
        },
    });
    let out = h.update(t, fw, TaskState::Running);
    h.ack_all(&out, F);
    h.now += 1_000;
    h.tick();
    (h, agent, fw, t)
}

#[test]
fn a_drain_notifies_stops_offers_kills_at_the_deadline_and_ends_drained() {
    let (mut h, agent, fw, t) = running();
    // An offer of the rest of the agent is outstanding; the drain rescinds it.
    assert!(h.m.allocator.outstanding_offers().any(|o| o.agent == agent));
    let out = h.cmd(MaintenanceCommand::Drain {
        agent: "a1".into(),
        deadline_secs: Some(60),
    });
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ToFramework(F, MasterToFramework::Rescind { .. }))));
    let n = notices(&out, F);
    assert_eq!(n.len(), 1);
    assert_eq!(n[0].agent_id, agent);
    assert_eq!(n[0].task_ids, vec![t]);
    assert_eq!(n[0].deadline_in_ms, Some(60_000));
    assert_eq!(n[0].deadline_unix_ms, Some(1_000_000 + h.now + 60_000));
    assert!(kills(&out).is_empty(), "no kill before the deadline");
    assert!(persisted(&out)
        .iter()
        .any(|m| matches!(m, Mutation::SetMaintenance(r) if r.agent_id == agent && !r.drained)));
    assert_eq!(h.m.drain_state(agent), Some("DRAINING"));
    // No offers of it in between, and no second notice on the same connection.
    for _ in 0..5 {
        h.now += 10_000;
        let out = h.tick();
        assert!(offers(&out).is_empty());
        assert!(notices(&out, F).is_empty());
        assert!(kills(&out).is_empty());
    }
    // The core asks to be woken at the deadline.
    assert_eq!(h.m.next_maintenance_deadline(h.now), Some(h.now + 10_000));
    // The deadline: the task is killed (the agent applies its grace period).
    h.now += 10_000;
    let out = h.tick();
    assert_eq!(kills(&out), vec![t]);
    assert_eq!(h.m.drain_state(agent), Some("DRAINING"));
    // Kills are resent while the task lingers.
    assert_eq!(
        h.m.next_maintenance_deadline(h.now),
        Some(h.now + DRAIN_KILL_RETRY_MS)
    );
    h.now += DRAIN_KILL_RETRY_MS;
    assert_eq!(kills(&h.tick()), vec![t]);
    // KILLED, not yet acknowledged: still draining. The update says why it was killed.
    let out = h.update(t, fw, TaskState::Killed);
    let view = h.m.view(h.now, 0);
    let killed = view.tasks.iter().find(|v| v.id == t.to_string()).unwrap();
    assert_eq!(killed.reason.as_deref(), Some("drain-deadline"));
    assert!(
        killed.message.contains("drain deadline"),
        "{}",
        killed.message
    );
    h.tick();
    assert_eq!(h.m.drain_state(agent), Some("DRAINING"));
    assert!(offers(&out).is_empty(), "freed resources are not offered");
    h.ack_all(&out, F);
    let out = h.tick();
    assert_eq!(h.m.drain_state(agent), Some("DRAINED"));
    assert!(persisted(&out)
        .iter()
        .any(|m| matches!(m, Mutation::SetMaintenance(r) if r.drained)));
    let view = h.m.maintenance_view(h.now);
    assert_eq!(view.agents[0].state, "DRAINED");
    assert_eq!(view.agents[0].tasks_remaining, 0);
    assert_eq!(view.agents[0].frameworks_notified, vec![fw]);
    // Undrain: offered again.
    h.now += 1_000;
    let out = h.cmd(MaintenanceCommand::Undrain {
        agent: agent.to_string(),
    });
    assert!(persisted(&out).contains(&Mutation::RemoveMaintenance(agent)));
    assert!(offers(&out).iter().any(|o| o.agent_id == agent));
    assert_eq!(h.m.drain_state(agent), None);
}

#[test]
fn a_framework_that_reconnects_hears_the_notice_again_and_only_its_tasks() {
    let (mut h, agent, fw, t) = running();
    let (_other, _) = h.framework(G, "g");
    let out = h.cmd(MaintenanceCommand::Drain {
        agent: "a1".into(),
        deadline_secs: None,
    });
    assert_eq!(notices(&out, F).len(), 1);
    assert!(notices(&out, G).is_empty(), "g has no task there");
    assert_eq!(notices(&out, F)[0].deadline_in_ms, None);
    h.input(Input::FrameworkDisconnected { conn: F });
    let f2 = 9;
    h.input(Input::FrameworkConnected {
        conn: f2,
        principal: "f".into(),
    });
    h.input(Input::Framework {
        conn: f2,
        msg: FrameworkToMaster::Subscribe(FrameworkInfo {
            framework_id: Some(fw),
            name: "f".into(),
            roles: vec!["r".into()],
            capabilities: vec![],
            failover_timeout_secs: 60.0,
            min_allocatable: Vec::new(),
            suppressed_roles: Vec::new(),
        }),
    });
    let out = h.tick();
    assert_eq!(notices(&out, f2).len(), 1);
    assert_eq!(notices(&out, f2)[0].task_ids, vec![t]);
    // No deadline: nothing is ever killed.
    h.now += 100 * 86_400_000;
    assert!(kills(&h.tick()).is_empty());
    assert_eq!(h.m.drain_state(agent), Some("DRAINING"));
}

#[test]
fn a_drain_survives_a_new_leader_with_its_deadline() {
    let (mut h, agent, fw, _t) = running();
    let out = h.cmd(MaintenanceCommand::Drain {
        agent: "a1".into(),
        deadline_secs: Some(30),
    });
    let mut registry = Registry::default();
    registry.agents.insert(
        agent,
        crate::registry::AgentRecord {
            id: agent,
            name: "a1".into(),
            hostname: "h1".into(),
            deactivated: false,
        },
    );
    for m in persisted(&out) {
        registry.apply(&m);
    }
    // A new leader 10 s of wall clock later, its own clock starting at 0.
    let mut h2 = H::new();
    h2.m.restore_maintenance(&registry, 0, 1_010_000);
    h2.m.recover(registry, 0);
    assert_eq!(h2.m.drain_state(agent), Some("DRAINING"));
    let out = h2.agent(A, "a1", Some(agent));
    assert_eq!(agent_id(&out), agent);
    assert!(offers(&out).is_empty());
    // The framework re-subscribes and hears about the drain again.
    h2.input(Input::FrameworkConnected {
        conn: F,
        principal: "f".into(),
    });
    h2.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Subscribe(FrameworkInfo {
            framework_id: Some(fw),
            name: "f".into(),
            roles: vec!["r".into()],
            capabilities: vec![],
            failover_timeout_secs: 60.0,
            min_allocatable: Vec::new(),
            suppressed_roles: Vec::new(),
        }),
    });
    let out = h2.tick();
    assert!(offers(&out).is_empty());
    // 21 s left of the 30 (the drain started at 1 s, the new leader came at 10 s).
    h2.now = 20_000;
    let view = h2.m.maintenance_view(h2.now);
    assert_eq!(view.agents[0].deadline_in_ms, Some(1_000));
    h2.now = 21_000;
    let _ = h2.tick();
    let view = h2.m.maintenance_view(h2.now);
    assert_eq!(view.agents[0].deadline_in_ms, Some(0));
}

#[test]
fn mark_gone_removes_the_agent_for_good() {
    let (mut h, agent, _fw, t) = running();
    let out = h.cmd(MaintenanceCommand::MarkGone { agent: "a1".into() });
    assert!(out.iter().any(|o| matches!(o, Output::ToFramework(F, MasterToFramework::Update(u)) if u.task_id == t && u.state == TaskState::Lost)));
    let p = persisted(&out);
    assert!(p.contains(&Mutation::RemoveAgent(agent)));
    assert!(p
        .iter()
        .any(|m| matches!(m, Mutation::PutGone(g) if g.agent_id == agent)));
    assert!(h.m.agents.is_empty());
    // Its framework is told the agent is gone for good (protocol 13), after the task's LOST.
    let removed: Vec<&AgentRemoved> = out
        .iter()
        .filter_map(|o| match o {
            Output::ToFramework(F, MasterToFramework::AgentRemoved(r)) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(removed.len(), 1, "{out:?}");
    assert_eq!(
        (removed[0].agent_id, removed[0].hostname.as_str()),
        (agent, "a1")
    );
    // It may not come back with its id.
    let out = h.agent(7, "a1", Some(agent));
    assert!(out.iter().any(|o| matches!(o, Output::ToAgent(7, MasterToAgent::Error { message }) if message.contains("marked gone"))));
    assert_eq!(h.m.maintenance_view(h.now).gone.len(), 1);
}

#[test]
fn bad_requests_change_nothing() {
    let (mut h, _agent, _fw, _t) = running();
    let e = |h: &mut H, c| {
        let now = h.now;
        h.m.maintenance(c, now).unwrap_err()
    };
    assert!(matches!(
        e(
            &mut h,
            MaintenanceCommand::Drain {
                agent: "nope".into(),
                deadline_secs: None
            }
        ),
        MaintenanceError::UnknownAgent(_)
    ));
    assert!(matches!(
        e(
            &mut h,
            MaintenanceCommand::Drain {
                agent: "a1".into(),
                deadline_secs: Some(MAX_DRAIN_DEADLINE_SECS + 1)
            }
        ),
        MaintenanceError::DeadlineTooLong(_)
    ));
    assert!(matches!(
        e(&mut h, MaintenanceCommand::Undrain { agent: "a1".into() }),
        MaintenanceError::NotDraining(_)
    ));
    assert!(h.m.maintenance_view(h.now).agents.is_empty());
}

#[test]
fn a_termination_notice_from_the_agent_is_a_drain_with_its_deadline() {
    let (mut h, agent, _fw, t) = running();
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::TerminationNotice {
            in_ms: 120_000,
            reason: "spot".into(),
        },
    });
    let n = notices(&out, F);
    assert_eq!(n.len(), 1);
    assert_eq!(n[0].deadline_in_ms, Some(120_000));
    assert!(n[0].reason.contains("spot"));
    // The same notice again (after a re-registration) changes nothing.
    h.now += 1_000;
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::TerminationNotice {
            in_ms: 119_000,
            reason: "spot".into(),
        },
    });
    assert!(notices(&out, F).is_empty());
    h.now += 118_999;
    assert!(kills(&h.tick()).is_empty());
    h.now += 1;
    assert_eq!(kills(&h.tick()), vec![t]);
    assert_eq!(h.m.drain_state(agent), Some("DRAINING"));
}
