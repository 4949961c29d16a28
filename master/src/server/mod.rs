//! The master's I/O shell: QUIC accept loop, one task per peer connection, the single event
//! loop that owns the [`Master`] state machine, and the HTTP operator endpoints.
//!
//! ```text
//! peer conn task --Input--> core loop (owns Master + Allocator) --Output--> peer conn task
//!                                 ^  Query(/state) from axum
//! ```
//! Every peer task reads frames, turns them into [`Input`]s and writes what the core sends it;
//! a frame that fails to decode, is too large, or is out of place closes only that peer's
//! connection, with the reason logged.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use dashmap::DashMap;
use gantry_sdk::protocol::codec::CodecError;
use gantry_sdk::protocol::*;
use gantry_sdk::transport::quic::{self, FrameReceiver, FrameSender};
use gantry_sdk::transport::PeerIdentity;
use tokio::sync::{mpsc, oneshot};

use crate::state::{ConnId, Input, Master, MasterConfig, Output};

/// QUIC application close codes.
const CLOSE_NORMAL: u32 = 0;
const CLOSE_PROTOCOL: u32 = 1;

enum CoreEvent {
    Input(Input),
    State(oneshot::Sender<serde_json::Value>),
}

enum Outbound {
    Agent(MasterToAgent),
    Framework(MasterToFramework),
    Close(String),
}

/// Shared between connection tasks: where to send inputs, and each connection's outbox.
#[derive(Clone)]
struct Shell {
    core: mpsc::Sender<CoreEvent>,
    conns: Arc<DashMap<ConnId, mpsc::Sender<Outbound>>>,
    next_conn: Arc<AtomicU64>,
}

/// Runs the master on a bound QUIC endpoint and HTTP listener until `shutdown` resolves.
pub async fn run(
    endpoint: quinn::Endpoint,
    http: tokio::net::TcpListener,
    config: MasterConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (core_tx, core_rx) = mpsc::channel(65_536);
    let shell = Shell {
        core: core_tx,
        conns: Arc::new(DashMap::new()),
        next_conn: Arc::new(AtomicU64::new(1)),
    };
    let seed = uuid::Uuid::new_v4().as_u128();
    let master = Master::new(config, seed);
    let core = tokio::spawn(core_loop(master, core_rx, shell.conns.clone()));

    let app = Router::new()
        .route(
            "/health",
            get(|| async { Json(serde_json::json!({"status": "ok", "leader": true})) }),
        )
        .route("/state", get(state_handler))
        .with_state(shell.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut http_stop = stop_rx.clone();
    let http_task = tokio::spawn(async move {
        let serve = axum::serve(http, app).with_graceful_shutdown(async move {
            let _ = http_stop.wait_for(|s| *s).await;
        });
        if let Err(e) = serve.await {
            tracing::error!("http server: {e}");
        }
    });

    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let shell = shell.clone();
                tokio::spawn(async move {
                    let remote = incoming.remote_address();
                    match incoming.await {
                        Ok(conn) => serve_connection(shell, conn).await,
                        Err(e) => tracing::info!(%remote, "handshake failed: {e}"),
                    }
                });
            }
        }
    }
    let _ = stop_tx.send(true);
    endpoint.close(CLOSE_NORMAL.into(), b"master shutting down");
    core.abort();
    let _ = http_task.await;
    endpoint.wait_idle().await;
    Ok(())
}

async fn state_handler(
    State(shell): State<Shell>,
) -> Result<Json<serde_json::Value>, (axum::http::StatusCode, String)> {
    let (tx, rx) = oneshot::channel();
    let unavailable = || {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "master core is not running".to_string(),
        )
    };
    shell
        .core
        .send(CoreEvent::State(tx))
        .await
        .map_err(|_| unavailable())?;
    rx.await.map(Json).map_err(|_| unavailable())
}

/// The single owner of the state machine.
async fn core_loop(
    mut master: Master,
    mut rx: mpsc::Receiver<CoreEvent>,
    conns: Arc<DashMap<ConnId, mpsc::Sender<Outbound>>>,
) {
    let start = Instant::now();
    let now = || start.elapsed().as_millis() as u64;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else { return };
                // Take what is queued so one allocation serves a burst of events.
                let mut batch = vec![ev];
                while batch.len() < 1024 {
                    match rx.try_recv() {
                        Ok(ev) => batch.push(ev),
                        Err(_) => break,
                    }
                }
                for ev in batch {
                    match ev {
                        CoreEvent::Input(input) => out.extend(master.handle(input, now())),
                        CoreEvent::State(reply) => {
                            let view = serde_json::to_value(master.view(now())).unwrap_or(serde_json::Value::Null);
                            let _ = reply.send(view);
                        }
                    }
                }
            }
            _ = tick.tick() => out.extend(master.handle(Input::Tick, now())),
        }
        let t = now();
        if master.allocation_due(t) {
            let started = Instant::now();
            master.allocate(t, &mut out);
            master.last_cycle_us = started.elapsed().as_micros() as u64;
        }
        for o in out.drain(..) {
            let (conn, msg) = match o {
                Output::ToAgent(c, m) => (c, Outbound::Agent(m)),
                Output::ToFramework(c, m) => (c, Outbound::Framework(m)),
                Output::Close { conn, reason } => (conn, Outbound::Close(reason)),
            };
            let Some(tx) = conns.get(&conn).map(|e| e.value().clone()) else {
                continue;
            };
            if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(msg) {
                tracing::warn!(conn, "peer is not reading its messages; closing it");
                let _ = tx.try_send(Outbound::Close("too slow".into()));
                conns.remove(&conn);
            }
        }
    }
}

async fn serve_connection(shell: Shell, conn: quinn::Connection) {
    let remote = conn.remote_address();
    let Some(identity) = quic::peer_identity(&conn) else {
        tracing::warn!(%remote, "peer certificate carries no Gantry identity; closing");
        conn.close(CLOSE_PROTOCOL.into(), b"certificate has no gantry identity");
        return;
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
    let id = shell.next_conn.fetch_add(1, Ordering::Relaxed);
    let (out_tx, out_rx) = mpsc::channel(16_384);
    shell.conns.insert(id, out_tx);
    match (kind, identity) {
        (PeerKind::Agent, PeerIdentity::Agent(name)) => {
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
                remote,
                |conn, msg| Input::Agent { conn, msg },
                |conn| Input::AgentDisconnected { conn },
            )
            .await;
        }
        (PeerKind::Framework, PeerIdentity::Framework(principal)) => {
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
                remote,
                |conn, msg| Input::Framework { conn, msg },
                |conn| Input::FrameworkDisconnected { conn },
            )
            .await;
        }
        (kind, identity) => {
            tracing::warn!(%remote, %identity, ?kind, "hello kind does not match the certificate; closing");
            conn.close(
                CLOSE_PROTOCOL.into(),
                b"peer kind does not match certificate",
            );
        }
    }
    shell.conns.remove(&id);
}

#[allow(clippy::too_many_arguments)]
async fn serve_peer<M: serde::de::DeserializeOwned + Send + 'static>(
    shell: &Shell,
    id: ConnId,
    conn: &quinn::Connection,
    connected: Input,
    mut tx: FrameSender,
    mut rx: FrameReceiver,
    mut out_rx: mpsc::Receiver<Outbound>,
    remote: SocketAddr,
    wrap: fn(ConnId, M) -> Input,
    disconnected: fn(ConnId) -> Input,
) {
    if shell.core.send(CoreEvent::Input(connected)).await.is_err() {
        return;
    }
    let writer_conn = conn.clone();
    let writer = tokio::spawn(async move {
        while let Some(o) = out_rx.recv().await {
            let res = match o {
                Outbound::Agent(m) => tx.send(&m).await,
                Outbound::Framework(m) => tx.send(&m).await,
                Outbound::Close(reason) => {
                    tracing::info!(%remote, "closing connection: {reason}");
                    // Let what we already sent (e.g. the error explaining the close) arrive.
                    let _ = tx.0.finish();
                    let _ = tokio::time::timeout(Duration::from_secs(1), tx.0.stopped()).await;
                    writer_conn.close(CLOSE_NORMAL.into(), reason.as_bytes());
                    break;
                }
            };
            if let Err(e) = res {
                tracing::debug!(%remote, "write failed: {e}");
                break;
            }
        }
    });
    loop {
        match rx.recv::<M>().await {
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
            Err(e @ (CodecError::Malformed(_) | CodecError::TooLarge(_))) => {
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
