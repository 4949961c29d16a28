//! The agent's session with the leading master: links to every master
//! ([`gantry_transport::masters`]), hand the runtime loop an outbox for the leader's stream
//! (sent on `outboxes` before each [`Input::Connected`]), forward the leader's messages to it as
//! core [`Input`]s, and switch at once when a standby announces that it was elected. It knows
//! the runtime only by these two channels.

use gantry_proto::codec::encode_frame_into;
use gantry_proto::*;
use gantry_transport::framing::{WRITE_BATCH, WRITE_BATCH_BYTES};
use gantry_transport::masters::{LeaderSession, Masters, MastersConfig};
use gantry_transport::{quic, FrameReader, TlsMaterial};
use tokio::sync::mpsc;

use crate::core::Input;

/// The outbox of one connection to the leading master.
pub(crate) type Outbox = mpsc::UnboundedSender<AgentToMaster>;

/// Runs until the runtime loop goes away.
pub(crate) async fn run(
    masters: Vec<String>,
    material: TlsMaterial,
    inputs: mpsc::UnboundedSender<Input>,
    outboxes: mpsc::UnboundedSender<Outbox>,
    sandbox: std::sync::Arc<crate::sandbox_api::SandboxApi>,
) {
    let masters = quic::client_config(&material)
        .and_then(|client| Masters::start(MastersConfig::new(masters, PeerKind::Agent, client)));
    let mut masters = match masters {
        Ok(m) => m,
        Err(e) => {
            tracing::error!("cannot reach the masters: {e}");
            return;
        }
    };
    loop {
        let LeaderSession {
            addr,
            epoch,
            conn,
            mut tx,
            rx,
        } = masters.next_session().await;
        tracing::info!(master = %addr, epoch, "connected to the leading master");
        // Buffered: one stream read takes in a burst of the master's messages.
        let mut rx = FrameReader::from(rx);
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<AgentToMaster>();
        if outboxes.send(out_tx).is_err() || inputs.send(Input::Connected).is_err() {
            return;
        }
        // The master's sandbox streams (logs, files, exec) on this connection.
        let sandbox_streams =
            tokio::spawn(crate::sandbox_api::serve(conn.clone(), sandbox.clone()));
        let writer_conn = conn.clone();
        let writer = tokio::spawn(async move {
            // What is queued goes out as one write (QUIC then packs a burst of updates into as
            // few packets as fit, instead of a packet per update).
            let mut buf = Vec::new();
            while let Some(first) = out_rx.recv().await {
                buf.clear();
                let mut next = Some(first);
                let mut taken = 0;
                while let Some(m) = next.take() {
                    // Messages are split under the frame limit; one that still does not fit
                    // is lost alone, loudly, and the session goes on.
                    if let Err(e) = encode_frame_into(&mut buf, &m) {
                        tracing::warn!(master = %addr, "message not sent: {e}");
                    }
                    taken += 1;
                    if taken < WRITE_BATCH && buf.len() < WRITE_BATCH_BYTES {
                        next = out_rx.try_recv().ok();
                    }
                }
                if let Err(e) = tx.0.write_all(&buf).await {
                    tracing::warn!(master = %addr, "write to the master failed: {e}; reconnecting");
                    writer_conn.close(0u32.into(), b"write failed");
                    break;
                }
            }
        });
        loop {
            tokio::select! {
                msg = rx.recv::<MasterToAgent>() => match msg {
                    Ok(msg) => {
                        if inputs.send(Input::Master(msg)).is_err() {
                            writer.abort();
                            sandbox_streams.abort();
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(master = %addr, "master connection lost: {e}");
                        break;
                    }
                },
                _ = masters.newer_leader() => {
                    tracing::info!(old = %addr, "a new master leads; switching to it");
                    break;
                }
            }
        }
        writer.abort();
        sandbox_streams.abort();
        conn.close(0u32.into(), b"reconnecting");
        if inputs.send(Input::Disconnected).is_err() {
            return;
        }
    }
}
