//! Status updates paced to a framework whose outbox is full (`state::pacing`): held in order,
//! sent as it drains, a re-subscription's redelivery a slice at a time.

use super::*;

/// The (task, update) ids of the updates sent to `conn`, in order.
fn updates_to(out: &[Output], conn: ConnId) -> Vec<(TaskId, UpdateId)> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(c, MasterToFramework::Update(u)) if *c == conn => {
                Some((u.task_id, u.update_id))
            }
            _ => None,
        })
        .collect()
}

fn closes(out: &[Output], conn: ConnId) -> bool {
    out.iter()
        .any(|o| matches!(o, Output::Close { conn: c, .. } if *c == conn))
}

fn update(h: &mut Harness, u: &StatusUpdate) -> Vec<Output> {
    h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(u.clone()),
    })
}

fn ack(h: &mut Harness, u: &StatusUpdate) -> Vec<Output> {
    h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Acknowledge {
            task_id: u.task_id,
            update_id: u.update_id,
        },
    })
}

fn key(u: &StatusUpdate) -> (TaskId, UpdateId) {
    (u.task_id, u.update_id)
}

#[test]
fn updates_a_full_outbox_could_not_take_are_held_and_sent_in_order_as_it_drains() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:8;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let tasks: Vec<TaskInfo> = (0..4).map(|_| task("cpus:1;mem:64")).collect();
    let (sent, _) = run_tasks(&mut h, offers[0].id, tasks.clone());
    assert_eq!(sent.len(), 4);
    let starting: Vec<StatusUpdate> = tasks
        .iter()
        .map(|t| agent_update(t, fw, TaskState::Starting))
        .collect();
    let mut forwarded = Vec::new();
    for u in &starting {
        forwarded.extend(updates_to(&update(&mut h, u), F));
    }
    assert_eq!(forwarded, starting.iter().map(key).collect::<Vec<_>>());
    // The shell could queue only the first: the other three come back, and the framework is
    // not closed for it.
    let out = h.input(Input::UpdatesHeld {
        conn: F,
        updates: forwarded[1..].to_vec(),
    });
    assert!(!closes(&out, F), "{out:?}");
    assert_eq!(h.m.held_updates(), 3);
    assert!(h.m.has_backlog());
    // It acknowledges the first; the task's next update queues behind the held ones.
    let out = ack(&mut h, &starting[0]);
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(A, MasterToAgent::Acknowledge { .. }))));
    let running0 = agent_update(&tasks[0], fw, TaskState::Running);
    assert!(updates_to(&update(&mut h, &running0), F).is_empty());
    assert_eq!(h.m.held_updates(), 4);
    // An agent retransmitting a held update does not hold it twice.
    assert!(updates_to(&update(&mut h, &starting[1]), F).is_empty());
    assert_eq!(h.m.held_updates(), 4);
    // No room: nothing sent, no progress.
    let mut out = Vec::new();
    assert!(!h.m.work_backlog(h.now, &mut out, |_| 0));
    assert!(out.is_empty());
    // Room for two: the two oldest.
    assert!(h.m.work_backlog(h.now, &mut out, |_| 2));
    assert_eq!(
        updates_to(&out, F),
        vec![key(&starting[1]), key(&starting[2])]
    );
    // Then the rest, in order; then nothing is held and updates go straight out again.
    let mut out = Vec::new();
    assert!(h.m.work_backlog(h.now, &mut out, |_| usize::MAX));
    assert_eq!(updates_to(&out, F), vec![key(&starting[3]), key(&running0)]);
    assert!(!h.m.has_backlog());
    assert_eq!(h.m.held_updates(), 0);
    ack(&mut h, &starting[1]);
    let running1 = agent_update(&tasks[1], fw, TaskState::Running);
    assert_eq!(
        updates_to(&update(&mut h, &running1), F),
        vec![key(&running1)]
    );
}

#[test]
fn an_update_acknowledged_while_held_is_not_sent_and_a_disconnect_drops_the_queue() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:8;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let tasks: Vec<TaskInfo> = (0..2).map(|_| task("cpus:1;mem:64")).collect();
    run_tasks(&mut h, offers[0].id, tasks.clone());
    let starting: Vec<StatusUpdate> = tasks
        .iter()
        .map(|t| agent_update(t, fw, TaskState::Starting))
        .collect();
    for u in &starting {
        update(&mut h, u);
    }
    h.input(Input::UpdatesHeld {
        conn: F,
        updates: starting.iter().map(key).collect(),
    });
    assert_eq!(h.m.held_updates(), 2);
    // It had the first after all (an earlier connection's copy): acknowledged, not resent.
    ack(&mut h, &starting[0]);
    let mut out = Vec::new();
    assert!(h.m.work_backlog(h.now, &mut out, |_| usize::MAX));
    assert_eq!(updates_to(&out, F), vec![key(&starting[1])]);
    // Held again, then the framework goes away: nothing is kept for the dead connection.
    h.input(Input::UpdatesHeld {
        conn: F,
        updates: vec![key(&starting[1])],
    });
    assert_eq!(h.m.held_updates(), 1);
    h.input(Input::FrameworkDisconnected { conn: F });
    assert_eq!(h.m.held_updates(), 0);
    assert!(!h.m.has_backlog());
}

#[test]
fn a_framework_subscribing_again_gets_its_pending_updates_a_slice_at_a_time() {
    let mut h = Harness::new();
    let n = UPDATE_SLICE + 10;
    h.agent(A, "a1", &format!("cpus:{n};mem:{n}"));
    let (fw, offers) = h.framework(F, "f", "r");
    let tasks: Vec<TaskInfo> = (0..n).map(|_| task("cpus:1;mem:1")).collect();
    let (sent, out) = run_tasks(&mut h, offers[0].id, tasks.clone());
    assert_eq!(sent.len(), n, "{:?}", errors(&out));
    let mut starting = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        let mut u = agent_update(t, fw, TaskState::Starting);
        u.timestamp_ms = i as u64;
        h.now = i as u64;
        update(&mut h, &u);
        starting.push(u);
    }
    h.input(Input::FrameworkDisconnected { conn: F });
    h.input(Input::FrameworkConnected {
        conn: 12,
        principal: "f".into(),
    });
    let out = h.input(Input::Framework {
        conn: 12,
        msg: FrameworkToMaster::Subscribe(info("f", "r", Some(fw))),
    });
    // Oldest first: a slice now, the rest held for the outbox to drain.
    let all: Vec<_> = starting.iter().map(key).collect();
    assert_eq!(updates_to(&out, 12), all[..UPDATE_SLICE].to_vec());
    assert_eq!(h.m.held_updates(), 10);
    let mut out = Vec::new();
    assert!(h.m.work_backlog(h.now, &mut out, |_| usize::MAX));
    assert_eq!(updates_to(&out, 12), all[UPDATE_SLICE..].to_vec());
    assert!(!h.m.has_backlog());
}

#[test]
fn an_update_no_longer_pending_is_not_held() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:8;mem:1024");
    h.framework(F, "f", "r");
    // Acknowledged or superseded before the shell reported it: nothing to send later.
    let out = h.input(Input::UpdatesHeld {
        conn: F,
        updates: vec![(TaskId::random(), UpdateId::random())],
    });
    assert!(!closes(&out, F), "{out:?}");
    assert_eq!(h.m.held_updates(), 0);
    assert!(!h.m.has_backlog());
}

#[test]
fn undelivered_offers_return_to_the_pool_and_other_messages_wait_and_go_first() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:8;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    assert_eq!(offers.len(), 1);
    let tasks = vec![task("cpus:1;mem:64")];
    // A full outbox could not take the offer, a rescind, an error or a heartbeat.
    let rescind = MasterToFramework::Rescind {
        offer_id: OfferId::random(),
    };
    let error = err(F, ErrorKind::InvalidRequest, "x");
    let Output::ToFramework(_, error) = error else {
        unreachable!()
    };
    let out = h.input(Input::Undelivered {
        conn: F,
        offers: vec![offers[0].id],
        messages: vec![rescind.clone(), error.clone(), MasterToFramework::Heartbeat],
    });
    assert!(!closes(&out, F), "{out:?}");
    // The framework never saw the offer: it is back in the pool (using it is an error) and
    // offered again.
    let again = offers_of(&out);
    assert_eq!(again.len(), 1, "{out:?}");
    assert_ne!(again[0].id, offers[0].id);
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, tasks.clone()),
    });
    assert_eq!(errors(&out), vec![ErrorKind::UnknownOffer]);
    // The rescind and the error wait (the heartbeat is dropped), ahead of held updates.
    assert_eq!(h.m.held_updates(), 2);
    let (_, _) = run_tasks(&mut h, again[0].id, tasks.clone());
    let starting = agent_update(&tasks[0], fw, TaskState::Starting);
    assert!(updates_to(&update(&mut h, &starting), F).is_empty());
    let mut out = Vec::new();
    assert!(h.m.work_backlog(h.now, &mut out, |_| 2));
    let sent: Vec<&MasterToFramework> = out
        .iter()
        .filter_map(|o| match o {
            Output::ToFramework(F, m) => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(sent, vec![&rescind, &error]);
    let mut out = Vec::new();
    assert!(h.m.work_backlog(h.now, &mut out, |_| usize::MAX));
    assert_eq!(updates_to(&out, F), vec![key(&starting)]);
    assert!(!h.m.has_backlog());
}

#[test]
fn a_framework_letting_messages_pile_past_the_bound_is_closed() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:8;mem:1024");
    h.framework(F, "f", "r");
    let rescinds = |n: usize| -> Vec<MasterToFramework> {
        (0..n)
            .map(|_| MasterToFramework::Rescind {
                offer_id: OfferId::random(),
            })
            .collect()
    };
    let out = h.input(Input::Undelivered {
        conn: F,
        offers: Vec::new(),
        messages: rescinds(HELD_MESSAGES),
    });
    assert!(!closes(&out, F));
    let out = h.input(Input::Undelivered {
        conn: F,
        offers: Vec::new(),
        messages: rescinds(1),
    });
    assert!(closes(&out, F), "{out:?}");
}

#[test]
fn offers_pause_while_a_framework_is_backed_up_and_go_to_the_others() {
    const G: ConnId = 3;
    let mut h = Harness::new();
    let (f, _) = h.framework(F, "f", "r");
    let (g, _) = h.framework(G, "g", "r");
    // The offers made when an agent registers.
    let add_agent = |h: &mut Harness, conn: ConnId, name: &str| -> Vec<Offer> {
        h.input(Input::AgentConnected {
            conn,
            name: name.into(),
            address: "127.0.0.1:1".into(),
        });
        let out = h.input(Input::Agent {
            conn,
            msg: register(None, "cpus:8;mem:1024"),
        });
        [offers(&out, F), offers(&out, G)].concat()
    };
    // F is behind: the agents that arrive go to G, though F comes first in fair order.
    h.m.pace_offers(|c| c == F);
    let mut made = add_agent(&mut h, A, "a1");
    made.extend(add_agent(&mut h, 11, "a2"));
    assert_eq!(made.len(), 2);
    assert!(made.iter().all(|o| o.framework_id == g), "{made:?}");
    // Caught up: F is offered again.
    h.m.pace_offers(|_| false);
    let made = add_agent(&mut h, 12, "a3");
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].framework_id, f);
}

#[test]
fn a_held_staging_is_sent_while_the_task_still_stages_and_skipped_once_superseded() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:8;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let tasks: Vec<TaskInfo> = (0..2).map(|_| task("cpus:1;mem:64")).collect();
    let (_, out) = run_tasks(&mut h, offers[0].id, tasks.clone());
    let staging = updates_to(&out, F);
    assert_eq!(staging.len(), 2);
    // The outbox could not take either STAGING.
    h.input(Input::UpdatesHeld {
        conn: F,
        updates: staging,
    });
    assert_eq!(h.m.held_updates(), 2);
    // The first task's agent reports STARTING: it queues behind them.
    let starting = agent_update(&tasks[0], fw, TaskState::Starting);
    assert!(updates_to(&update(&mut h, &starting), F).is_empty());
    let mut out = Vec::new();
    assert!(h.m.work_backlog(h.now, &mut out, |_| usize::MAX));
    let sent: Vec<(TaskId, TaskState)> = out
        .iter()
        .filter_map(|o| match o {
            Output::ToFramework(F, MasterToFramework::Update(u)) => Some((u.task_id, u.state)),
            _ => None,
        })
        .collect();
    assert_eq!(
        sent,
        vec![
            (tasks[1].task_id, TaskState::Staging),
            (tasks[0].task_id, TaskState::Starting)
        ]
    );
    assert!(!h.m.has_backlog());
}
