//! The core loop: the one task that owns the [`Master`] state machine, feeds it the shell's
//! inputs and the time, and carries out its outputs (see the diagram in the parent module).

use super::*;

/// The single owner of the state machine. Before this master leads, inputs are held back
/// (peers are redirected anyway); registry mutations go to the writer in order, and a fenced
/// write (another master leads now) stops the master. No fixed tick: the loop sleeps until an
/// input or the core's own [`Master::next_deadline`], and passes every lease renewal on as
/// [`Input::LeaseUntil`] (the core then refuses to offer or launch past it by itself).
pub(super) async fn core_loop(
    mut config: MasterConfig,
    mut rx: mpsc::Receiver<CoreEvent>,
    shell: Shell,
    writer: RegistryWriter,
    status: watch::Receiver<LeadershipStatus>,
    lost: mpsc::UnboundedSender<String>,
    ready: watch::Sender<Option<u64>>,
) {
    let start = Instant::now();
    let now = || start.elapsed().as_millis() as u64;
    // When the core wants its next `Tick` ([`Master::next_deadline`]); `None`: not before an
    // input. The lease deadline reaches the core as an input whenever the election renews it.
    let mut deadline: Option<u64> = None;
    let mut lease = status.clone();
    let mut master: Option<Master> = None;
    let mut held: Vec<Input> = Vec::new();
    let mut offered = false;
    let mut out = Vec::new();
    // Operator commands answered once their registry writes are durable (a change an operator
    // was told about survives a crash right after).
    let mut replies: Vec<(OperatorReply, Result<(), OperatorRejection>)> = Vec::new();
    let conns = shell.conns.clone();
    let outbox = shell.outbox;
    // Reconciliation answers wait for room in their peers' outboxes; retried at the next event.
    let mut backlog_blocked = false;
    let mut batch: Vec<CoreEvent> = Vec::with_capacity(1024);
    let history_on = shell.history.lock().is_ok_and(|h| h.enabled());
    loop {
        let mut tick = false;
        let backlog = !backlog_blocked && master.as_ref().is_some_and(|m| m.has_backlog());
        tokio::select! {
            // One slice of a long request, then back to everyone else's events.
            _ = std::future::ready(()), if backlog => {
                if let Some(m) = master.as_mut() {
                    // Answers may fill half an outbox: the rest stays for offers and updates,
                    // so a framework reading its answers is never taken for a stalled one.
                    let room = |c: ConnId| {
                        conns
                            .get(&c)
                            .map_or(0, |p| p.outbox.capacity().saturating_sub(outbox / 2))
                    };
                    backlog_blocked = !m.work_backlog(now(), &mut out, room);
                }
            }
            ev = rx.recv() => {
                backlog_blocked = false;
                let Some(ev) = ev else { return };
                batch.push(ev);
            }
            changed = lease.changed() => {
                if changed.is_err() {
                    return;
                }
                // Marked seen even before leading (the core reads it when elected).
                let until = health::lease_until_ms(&lease.borrow_and_update(), start);
                if let Some(m) = master.as_mut() {
                    m.handle_into(Input::LeaseUntil { until }, now(), &mut out);
                }
            }
            _ = tokio::time::sleep_until((start + Duration::from_millis(deadline.unwrap_or_default())).into()), if deadline.is_some() => {
                backlog_blocked = false;
                tick = true;
            }
        }
        // Take what is queued so one allocation (and one timer check) serves a burst of events.
        if !batch.is_empty() || tick {
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok(ev) => batch.push(ev),
                    Err(_) => break,
                }
            }
        }
        if let Some(m) = master.as_mut() {
            m.record_events(shell.events.receiver_count() > 0 || history_on);
        }
        // Offers held since the last sample (they change only in the loop: sampled before
        // this batch changes them), at most once a second (`usage::HeldOffers`).
        if let Some(m) = master.as_ref() {
            let t = unix_ms();
            if let Ok(mut h) = shell.history.lock() {
                if h.enabled() && h.held_offers.due(t) {
                    h.held_offers.sample(
                        t,
                        m.allocator.outstanding_offers().map(|o| {
                            let r = o.resources.total();
                            let a = gantry_placement::cost::Amounts {
                                cpus: r.get("cpus"),
                                mem: r.get("mem"),
                                gpus: r.get("gpus"),
                            };
                            (o.framework.to_string(), o.role.clone(), a)
                        }),
                    );
                }
            }
        }
        for ev in batch.drain(..) {
            match (ev, master.as_mut()) {
                (CoreEvent::Lead { epoch, registry }, None) => {
                    config.epoch = epoch;
                    let mut m = Master::new(config.clone(), uuid::Uuid::new_v4().as_u128());
                    let until = health::lease_until_ms(&lease.borrow_and_update(), start);
                    m.handle(Input::LeaseUntil { until }, now());
                    m.restore_maintenance(&registry, now(), unix_ms());
                    if let Ok(mut h) = shell.history.lock() {
                        h.restore(&registry.history, &registry.held_offers);
                    }
                    m.recover(registry, now());
                    for input in held.drain(..) {
                        m.handle_into(input, now(), &mut out);
                    }
                    master = Some(m);
                    ready.send_replace(Some(epoch));
                }
                (CoreEvent::Lead { .. }, Some(_)) => {}
                (CoreEvent::Input(input), Some(m)) => m.handle_into(input, now(), &mut out),
                (CoreEvent::Input(input), None) => held.push(input),
                (CoreEvent::Operator(cmd, reply), Some(m)) => {
                    let result = m.operator_at(cmd, now()).map(|o| out.extend(o));
                    replies.push((reply, result));
                }
                (CoreEvent::Operator(_, reply), None) => {
                    let _ = reply.send(Err(OperatorRejection::NotLeader));
                }
                (CoreEvent::Maintenance(cmd, reply), Some(m)) => {
                    let done = match cmd {
                        Some(cmd) => m.maintenance(cmd, now()).map(|o| out.extend(o)),
                        None => Ok(()),
                    };
                    let view = serde_json::to_value(m.maintenance_view(now()))
                        .unwrap_or(serde_json::Value::Null);
                    let _ = reply.send(done.map(|()| view));
                }
                (CoreEvent::Maintenance(_, reply), None) => {
                    let _ = reply.send(Err(MaintenanceError::NotLeader));
                }
                (CoreEvent::Metrics(reply), m) => {
                    let _ = reply.send(m.map(|m| m.metrics(now())));
                }
                (CoreEvent::State(reply), m) => {
                    let mut view = match m {
                        Some(m) => serde_json::to_value(m.view(now(), unix_ms()))
                            .unwrap_or(serde_json::Value::Null),
                        None => {
                            serde_json::json!({"leader": false, "status": status.borrow().clone()})
                        }
                    };
                    if let Some(obj) = view.as_object_mut() {
                        obj.insert("peers".into(), peer_stats(&shell));
                        if let Ok(h) = shell.history.lock() {
                            obj.insert("history".into(), h.figures());
                        }
                    }
                    let _ = reply.send(view);
                }
            }
        }
        // Timers after the inputs queued before them, and also when inputs never stop: a busy
        // master handles the heartbeats and updates waiting in its queue before it checks
        // agents for silence, and its timers never starve behind a stream of messages.
        if tick || deadline.is_some_and(|d| now() >= d) {
            if let Some(m) = master.as_mut() {
                m.handle_into(Input::Tick, now(), &mut out);
            }
        }
        let mut mutations = Vec::new();
        // What the inputs caused (launches, their updates, answers) goes out before the
        // allocation cycle runs, then the cycle's offers: an accepted launch never waits
        // for a cycle over the cluster.
        dispatch(&shell, &mut master, &mut out, &mut mutations, &now);
        if let Some(m) = master.as_mut() {
            let t = now();
            // The core says no once its lease deadline has passed, even before `Lost` arrives.
            if m.allocation_due(t) {
                // No offers to a framework whose outbox is more than half full: it would read
                // them late (and accept them stale); the others get what it would have had.
                m.pace_offers(|c| {
                    conns
                        .get(&c)
                        .is_none_or(|p| p.outbox.capacity() < outbox / 2)
                });
                let started = Instant::now();
                let before = out.len();
                m.allocate(t, &mut out);
                let took = started.elapsed();
                m.handle_into(
                    Input::CycleTook {
                        micros: took.as_micros() as u64,
                    },
                    t,
                    &mut out,
                );
                if took.as_millis() >= 10 {
                    tracing::debug!(
                        target: "gantry_master::slow_cycle",
                        took_us = took.as_micros() as u64,
                        outputs = out.len() - before,
                        visits = m.allocator.agent_visits(),
                        "slow allocation cycle"
                    );
                }
                shell.metrics.allocation_cycle.observe(took.as_secs_f64());
                if !offered
                    && out[before..]
                        .iter()
                        .any(|o| matches!(o, Output::ToFramework(_, MasterToFramework::Offers(_))))
                {
                    offered = true;
                    tracing::info!(epoch = config.epoch, "first offers made as leader");
                }
            }
        }
        dispatch(&shell, &mut master, &mut out, &mut mutations, &now);

        // Cluster events for /api/v1/events: always drained (the queue is bounded anyway),
        // serialized only for subscribers.
        if let Some(m) = master.as_mut() {
            let events = m.take_events();
            let live = shell.events.receiver_count() > 0;
            if !events.is_empty() && (live || history_on) {
                let at = unix_ms();
                let mut history = shell.history.lock().ok();
                for e in events {
                    let Ok(json) = serde_json::to_value(&e) else {
                        continue;
                    };
                    if live {
                        let _ = shell.events.send(json.to_string().into());
                    }
                    if let Some(h) = history.as_mut() {
                        h.push(at, json);
                    }
                }
            }
        }
        // Asked last: stalled peers handled above may have started timers. Never a time already
        // handled (no spinning should a deadline not be cleared); reconciliation answers
        // blocked on full outboxes are retried within 100 ms.
        if let Some(m) = master.as_ref() {
            let t = now();
            let retry_backlog = (backlog_blocked && m.has_backlog()).then_some(t + 100);
            deadline = m
                .next_deadline(t)
                .map(|d| d.max(t + 1))
                .into_iter()
                .chain(retry_backlog)
                .min();
        }
        if !mutations.is_empty() {
            let pending = writer.submit(mutations);
            let lost = lost.clone();
            // Every operator reply of this batch waits for its writes (they are in order).
            let replies = std::mem::take(&mut replies);
            tokio::spawn(async move {
                // `Some(None)`: fenced (another master leads); `Some(Some(why))`: failed.
                let failed: Option<Option<String>> = match pending.await {
                    Ok(()) => None,
                    Err(RegistryError::Fenced(e)) => {
                        let _ = lost.send(format!("a registry write was fenced off: {e}"));
                        Some(None)
                    }
                    Err(e) => {
                        tracing::error!("registry write failed: {e}");
                        Some(Some(e.to_string()))
                    }
                };
                for (reply, result) in replies {
                    let _ = reply.send(match (&failed, result) {
                        (Some(None), Ok(())) => Err(OperatorRejection::NotLeader),
                        (Some(Some(why)), Ok(())) => {
                            Err(OperatorRejection::NotPersisted(why.clone()))
                        }
                        (_, result) => result,
                    });
                }
            });
        }
        for (reply, result) in replies.drain(..) {
            let _ = reply.send(result);
        }
    }
}

/// Hands `out` to the peers' outboxes (registry mutations into `mutations`), and what could
/// not be handed over back to the core, until nothing is left: stalled peers are disconnected in
/// the core at once, which may send more (rescinds).
fn dispatch(
    shell: &Shell,
    master: &mut Option<Master>,
    out: &mut Vec<Output>,
    mutations: &mut Vec<crate::registry::Mutation>,
    now: &impl Fn() -> u64,
) {
    let conns = &shell.conns;
    let outbox = shell.outbox;
    while !out.is_empty() {
        let mut stalled = Vec::new();
        // Status updates a framework's outbox could not take (full, or three quarters
        // full): the core holds them and sends them as it drains (`state::pacing`); later
        // ones of the same flush follow them there, in order.
        let mut held: std::collections::HashMap<ConnId, Vec<(TaskId, UpdateId)>> =
            std::collections::HashMap::new();
        // Other framework messages a full outbox could not take: offers go back to the
        // pool, the rest wait in the core (`state::pacing`); only a framework that lets
        // those pile up too is closed.
        let mut undelivered: std::collections::HashMap<
            ConnId,
            (Vec<OfferId>, Vec<MasterToFramework>),
        > = std::collections::HashMap::new();
        for o in out.drain(..) {
            let (conn, msg) = match o {
                Output::ToAgent(c, m) => (c, Outbound::Agent(m)),
                Output::ToFramework(c, m) => (c, Outbound::Framework(m)),
                Output::Close { conn, reason } => (conn, Outbound::Close(reason)),
                Output::Persist(m) => {
                    mutations.push(m);
                    continue;
                }
                Output::Volume {
                    reply,
                    agent,
                    agent_id,
                    request,
                } => {
                    tokio::spawn(super::http::volumes::for_framework(
                        shell.clone(),
                        reply,
                        agent,
                        agent_id,
                        request,
                    ));
                    continue;
                }
            };
            // A peer already gone: its disconnect is on its way to the core. (A read guard
            // of the map, not a clone of the handle: no reference counts per message.)
            let Some(peer) = conns.get(&conn) else {
                tracing::debug!(conn, "message for a connection that is gone; not sent");
                continue;
            };
            // Agents' updates (the ones waiting in the core for an acknowledgement) never
            // take the last quarter of an outbox: offers, rescinds, answers and the
            // master's own updates keep room there (a full outbox closes the peer for
            // those: they could not be sent again later).
            if let Outbound::Framework(MasterToFramework::Update(u)) = &msg {
                if crate::state::paced(u)
                    && (held.contains_key(&conn) || peer.outbox.capacity() <= outbox / 4)
                {
                    held.entry(conn).or_default().push((u.task_id, u.update_id));
                    continue;
                }
            }
            match peer.outbox.try_send(msg) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(Outbound::Framework(
                    MasterToFramework::Update(u),
                ))) if crate::state::paced(&u) => {
                    held.entry(conn).or_default().push((u.task_id, u.update_id));
                }
                Err(mpsc::error::TrySendError::Full(Outbound::Framework(
                    MasterToFramework::Offers(offers),
                ))) => {
                    let (ids, _) = undelivered.entry(conn).or_default();
                    ids.extend(offers.iter().map(|o| o.id));
                }
                Err(mpsc::error::TrySendError::Full(Outbound::Framework(m))) => {
                    undelivered.entry(conn).or_default().1.push(m);
                }
                Err(mpsc::error::TrySendError::Full(msg)) => {
                    tracing::warn!(conn, peer = %peer.label, message = msg.kind(), "peer is not reading its messages ({outbox} queued); closing it");
                    shell
                        .counters
                        .stalled_closed
                        .fetch_add(1, Ordering::Relaxed);
                    shell
                        .counters
                        .dropped_messages
                        .fetch_add(1, Ordering::Relaxed);
                    // Not through the full outbox: close the connection itself.
                    peer.conn
                        .close(CLOSE_PROTOCOL.into(), b"not reading its messages");
                    // The map's read guard goes before its entry is removed.
                    drop(peer);
                    conns.remove(&conn);
                    stalled.push(conn);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    // Its connection is ending (the disconnect follows): warn once.
                    tracing::warn!(conn, peer = %peer.label, "message not sent: the connection is closing");
                    shell
                        .counters
                        .dropped_messages
                        .fetch_add(1, Ordering::Relaxed);
                    drop(peer);
                    conns.remove(&conn);
                }
            }
        }
        if let Some(m) = master.as_mut() {
            for conn in stalled {
                m.handle_into(Input::PeerStalled { conn }, now(), out);
            }
            for (conn, updates) in held {
                m.handle_into(Input::UpdatesHeld { conn, updates }, now(), out);
            }
            for (conn, (offers, messages)) in undelivered {
                out.extend(m.handle(
                    Input::Undelivered {
                        conn,
                        offers,
                        messages,
                    },
                    now(),
                ));
            }
        }
    }
}

/// The `peers` part of `/state`: the frame budget and what the shell did to stalled peers.
fn peer_stats(shell: &Shell) -> serde_json::Value {
    let budget = shell.frame_limits.budget.stats();
    serde_json::json!({
        "connected": shell.conns.len(),
        "outbox_messages": shell.outbox,
        "frame_body_timeout_ms": shell.frame_limits.body_timeout.as_millis() as u64,
        "write_timeout_ms": shell.write_timeout.map(|t| t.as_millis() as u64),
        "frames": budget,
        "stalled_closed": shell.counters.stalled_closed.load(Ordering::Relaxed),
        "dropped_messages": shell.counters.dropped_messages.load(Ordering::Relaxed),
    })
}
