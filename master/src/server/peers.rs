//! One QUIC connection to the master: the peer's identity and hello, then its reader (bounded
//! frames into the core) and its writer (the outbox, written in batches; a peer whose stream
//! takes no byte of a pending write in time is closed as stalled). The limits are described
//! under "Bounded peers" in the `server` module's docs.

use super::*;

pub(super) async fn serve_connection(shell: Shell, conn: quinn::Connection) {
    let remote = conn.remote_address();
    let Some(identity) = quic::peer_identity(&conn) else {
        tracing::warn!(%remote, "peer certificate carries no Gantry identity; closing");
        conn.close(CLOSE_PROTOCOL.into(), b"certificate has no gantry identity");
        return;
    };
    let _slot = match shell
        .limits
        .admit(&identity::connection_key(&identity), remote.ip())
    {
        Ok(slot) => slot,
        Err(reason) => {
            tracing::warn!(%remote, %identity, "{reason}; closing");
            conn.close(CLOSE_PROTOCOL.into(), reason.to_string().as_bytes());
            return;
        }
    };
    let (kind, tx, rx) =
        match tokio::time::timeout(Duration::from_secs(10), quic::accept_stream(&conn)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::warn!(%remote, %identity, "bad hello: {e}");
                conn.close(CLOSE_PROTOCOL.into(), e.to_string().as_bytes());
                return;
            }
            Err(_) => {
                tracing::warn!(%remote, %identity, "no hello within 10 s");
                conn.close(CLOSE_PROTOCOL.into(), b"no hello");
                return;
            }
        };
    // Who the peer is served as: security's decision (its hello must match its certificate).
    let principal = match identity::peer_principal(kind, &identity) {
        Ok(p) => p,
        Err(mismatch) => {
            tracing::warn!(%remote, %identity, ?kind, "hello kind does not match the certificate; closing");
            conn.close(CLOSE_PROTOCOL.into(), mismatch.to_string().as_bytes());
            return;
        }
    };
    // Only the leader serves peers. A standby says so, names the leader, and keeps the
    // connection open: the moment it is elected it says `Leading` here and the peer registers
    // without a new handshake.
    // What to say and when is [`health::Parked`]'s decision; this loop sends and waits.
    let mut tx = tx;
    let mut role = shell.role.clone();
    let mut parked = health::Parked::new();
    let epoch = loop {
        let ready = *shell.ready.borrow();
        let now_role = health::role_for(&peer_admission(&shell.status.borrow(), ready));
        role.borrow_and_update();
        match parked.step(&now_role, Instant::now(), random_u64()) {
            health::ParkedStep::Tell(told) => {
                if let Err(e) = tx.send(&told).await {
                    tracing::debug!(%remote, "peer gone before it was served: {e}");
                    return;
                }
                if let MasterRole::Leading { epoch } = told {
                    break epoch;
                }
            }
            health::ParkedStep::Serve { epoch } => break epoch,
            health::ParkedStep::WaitUntil(due) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(due.into()) => {}
                    changed = role.changed() => if changed.is_err() { return },
                    _ = conn.closed() => return,
                }
            }
            health::ParkedStep::Wait => {
                tokio::select! {
                    changed = role.changed() => if changed.is_err() { return },
                    _ = conn.closed() => return,
                }
            }
        }
    };
    tracing::debug!(%remote, %identity, epoch, "serving a peer");
    let id = shell.next_conn.fetch_add(1, Ordering::Relaxed);
    let (out_tx, out_rx) = mpsc::channel(shell.outbox);
    let label: Arc<str> = match &principal {
        PeerPrincipal::Agent(n) => format!("agent {n} at {remote}"),
        PeerPrincipal::Framework(p) => format!("framework {p} at {remote}"),
    }
    .into();
    shell.conns.insert(
        id,
        PeerHandle {
            outbox: out_tx,
            conn: conn.clone(),
            label: label.clone(),
        },
    );
    match principal {
        PeerPrincipal::Agent(name) => {
            shell.agent_conns.insert(name.clone(), (id, conn.clone()));
            let agent_name = name.clone();
            let connected = Input::AgentConnected {
                conn: id,
                name,
                address: remote.to_string(),
            };
            serve_peer::<AgentToMaster>(
                &shell,
                id,
                &conn,
                connected,
                tx,
                rx,
                out_rx,
                label,
                |conn, msg| Input::Agent { conn, msg },
                |conn| Input::AgentDisconnected { conn },
            )
            .await;
            // Only this connection's entry (a newer one of the same agent may have replaced it).
            shell
                .agent_conns
                .remove_if(&agent_name, |_, (conn_id, _)| *conn_id == id);
        }
        PeerPrincipal::Framework(principal) => {
            let connected = Input::FrameworkConnected {
                conn: id,
                principal,
            };
            serve_peer::<FrameworkToMaster>(
                &shell,
                id,
                &conn,
                connected,
                tx,
                rx,
                out_rx,
                label,
                |conn, msg| Input::Framework { conn, msg },
                |conn| Input::FrameworkDisconnected { conn },
            )
            .await;
        }
    }
    shell.conns.remove(&id);
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn serve_peer<M: serde::de::DeserializeOwned + Send + 'static>(
    shell: &Shell,
    id: ConnId,
    conn: &quinn::Connection,
    connected: Input,
    mut tx: FrameSender,
    mut rx: FrameReceiver,
    mut out_rx: mpsc::Receiver<Outbound>,
    peer: Arc<str>,
    wrap: fn(ConnId, M) -> Input,
    disconnected: fn(ConnId) -> Input,
) {
    if shell.core.send(CoreEvent::Input(connected)).await.is_err() {
        return;
    }
    let writer_conn = conn.clone();
    let writer_peer = peer.clone();
    let counters = shell.counters.clone();
    let write_timeout = shell.write_timeout;
    let stalled_shell = shell.clone();
    let writer = tokio::spawn(async move {
        let peer = writer_peer;
        // What is queued goes out as one write: the frames of up to WRITE_BATCH messages (or
        // WRITE_BATCH_BYTES) are encoded into one buffer, so a burst of status updates or
        // offers to one peer costs one stream write, not one per message.
        let mut buf: Vec<u8> = Vec::new();
        while let Some(first) = out_rx.recv().await {
            buf.clear();
            let mut close = None;
            let mut next = Some(first);
            let mut taken = 0usize;
            while let Some(o) = next.take() {
                // Encoded straight into the batch's buffer (no buffer per message).
                let frame = match o {
                    Outbound::Agent(m) => encode_frame_into(&mut buf, &m),
                    Outbound::Framework(m) => encode_frame_into(&mut buf, &m),
                    Outbound::Close(reason) => {
                        close = Some(reason);
                        break;
                    }
                };
                match frame {
                    Ok(()) => {}
                    // The core splits every list under the frame limit; should one message
                    // still not fit, it alone is lost, loudly, and the session goes on.
                    Err(e) => {
                        counters.dropped_messages.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%peer, "message not sent: {e}");
                    }
                }
                taken += 1;
                if taken < WRITE_BATCH && buf.len() < WRITE_BATCH_BYTES {
                    next = out_rx.try_recv().ok();
                }
            }
            if !buf.is_empty() {
                match write_progressing(&mut tx, &buf, write_timeout).await {
                    Ok(()) => {}
                    Err(WriteStall::Failed(e)) => {
                        // The stream is broken: end the connection so the reader sees it too.
                        let left = out_rx.len();
                        counters
                            .dropped_messages
                            .fetch_add(taken as u64 + left as u64, Ordering::Relaxed);
                        tracing::warn!(%peer, "write failed ({taken} messages in the write, {left} more not sent): {e}; closing");
                        writer_conn.close(CLOSE_PROTOCOL.into(), b"write failed");
                        break;
                    }
                    Err(WriteStall::NoProgress(waited)) => {
                        let left = out_rx.len();
                        counters.stalled_closed.fetch_add(1, Ordering::Relaxed);
                        counters
                            .dropped_messages
                            .fetch_add(taken as u64 + left as u64, Ordering::Relaxed);
                        tracing::warn!(%peer, "peer is not reading its messages (its stream took nothing for {waited:?}; {taken} messages in the write, {left} more queued); closing it");
                        // The core hears it before the reader's disconnect (one queue, in
                        // order): offers rescinded, failover / re-register timeout running.
                        stalled_shell.conns.remove(&id);
                        let _ = stalled_shell
                            .core
                            .send(CoreEvent::Input(Input::PeerStalled { conn: id }))
                            .await;
                        writer_conn.close(CLOSE_PROTOCOL.into(), b"not reading its messages");
                        break;
                    }
                }
            }
            if let Some(reason) = close {
                tracing::info!(%peer, "closing connection: {reason}");
                // Let what we already sent (e.g. the error explaining the close) arrive.
                let _ = tx.0.finish();
                let _ = tokio::time::timeout(Duration::from_secs(1), tx.0.stopped()).await;
                writer_conn.close(CLOSE_NORMAL.into(), reason.as_bytes());
                break;
            }
        }
    });
    let remote = &peer;
    loop {
        match rx.recv_limited::<M>(&shell.frame_limits).await {
            Ok(msg) => {
                if shell
                    .core
                    .send(CoreEvent::Input(wrap(id, msg)))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            Err(CodecError::Closed) => {
                tracing::info!(%remote, "peer closed its stream");
                break;
            }
            Err(
                e @ (CodecError::Malformed(_)
                | CodecError::TooLarge(_)
                | CodecError::BodyTimeout(..)),
            ) => {
                tracing::warn!(%remote, "closing peer: {e}");
                conn.close(CLOSE_PROTOCOL.into(), e.to_string().as_bytes());
                break;
            }
            Err(CodecError::Io(e)) => {
                tracing::info!(%remote, "connection ended: {e}");
                break;
            }
        }
    }
    let _ = shell.core.send(CoreEvent::Input(disconnected(id))).await;
    shell.conns.remove(&id);
    writer.abort();
}

/// Why [`write_progressing`] gave up.
pub(super) enum WriteStall {
    /// The stream failed.
    Failed(quinn::WriteError),
    /// The stream took no byte for this long (the peer does not read: flow control blocks).
    NoProgress(Duration),
}

/// Writes all of `buf`, giving up when the stream takes no byte for `limit` (`None`: waits as
/// long as it takes). Progress, not the whole write, is timed: a slow reader that keeps
/// reading is never taken for a stalled one.
pub(super) async fn write_progressing(
    tx: &mut FrameSender,
    buf: &[u8],
    limit: Option<Duration>,
) -> Result<(), WriteStall> {
    let Some(limit) = limit else {
        return tx.0.write_all(buf).await.map_err(WriteStall::Failed);
    };
    let mut at = 0;
    while at < buf.len() {
        match tokio::time::timeout(limit, tx.0.write(&buf[at..])).await {
            Ok(Ok(n)) => at += n,
            Ok(Err(e)) => return Err(WriteStall::Failed(e)),
            Err(_) => return Err(WriteStall::NoProgress(limit)),
        }
    }
    Ok(())
}
