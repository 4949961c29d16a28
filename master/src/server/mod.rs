//! The master's I/O shell: QUIC accept loop, one task per peer connection (`peers`), the single event
//! loop that owns the [`Master`] state machine (`core_loop`, on its own thread), and the
//! operator HTTPS API ([`http`]: authentication, ACLs and request bounds; `http_guard`: its
//! connection slots, write deadline and failed-authentication limiter; [`api`]: `/api/v1` and
//! its event stream; `ui`: the `/ui` dashboard and its login; `routes`: the route table every
//! route goes through, checked against docs/api/openapi.yaml; `http`'s `sandbox.rs`: task logs,
//! files and exec relayed to the task's agent on a sandbox stream of its QUIC connection;
//! [`history`]: the persistent, bounded event history in the registry; [`held_offers`]: the
//! resources held in offers by hour, kept in the registry beside it). Who a peer or caller is and what
//! it may do are [`crate::security`]'s decisions (identities, ACLs, tokens, sessions, limits);
//! this shell asks and enforces.
//!
//! ```text
//! peer conn task --Input--> core loop (owns Master + Allocator) --Output--> peer conn task
//!                                 ^  State(/state), Metrics and Operator commands from axum
//!                                 ^  LeaseUntil from the election, Tick at Master::next_deadline
//!                                 |  cluster events --> broadcast --> /api/v1/events subscribers
//!                                 |                 \--> history --(1 s)--> registry writer
//! operator HTTPS --sandbox stream (master-opened QUIC stream)--> agent (logs, files, exec)
//! ```
//! Every peer task reads frames, turns them into [`Input`]s and writes what the core sends it;
//! a frame that fails to decode, is too large, or is out of place closes only that peer's
//! connection, with the reason logged. A peer is served as the principal
//! `security::identity::peer_principal` makes of its certificate and hello; `conn_limits`
//! bounds open connections per certificate identity and per source address (the bounds are
//! `security::Limits`).
//!
//! Bounded peers (docs/security.md, "Message and peer limits"):
//! - Reads use [`read_frame_limited`](gantry_transport::framing::read_frame_limited): a frame
//!   body must arrive within `frame_body_timeout_ms` of its length, and large bodies share one
//!   [`FrameBudget`].
//! - Each peer has an outbox of `MasterConfig::peer_outbox` messages (`--peer-outbox`). A peer that lets it overflow is closed at
//!   once (not through the full outbox) and the core hears [`Input::PeerStalled`]: its offers
//!   are rescinded and its failover / re-register timeout starts.
//! - A peer that does not read at all is caught even when its outbox never fills (a framework
//!   is paced: past half full it gets no offers): once its stream takes no byte of a pending
//!   write for `MasterConfig::peer_write_timeout_ms` (`--peer-write-timeout`), QUIC flow
//!   control blocking the write, the writer closes it the same way ([`Input::PeerStalled`]).
//! - A message that can not be sent is never dropped silently: the warning names the peer.
//! - Long requests (reconciliation) are answered in slices ([`Master::work_backlog`]) between
//!   other events, and only as fast as the peer's outbox has room.

mod conn_limits;
mod core_loop;
pub mod held_offers;
pub mod history;
mod peers;
pub mod usage;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use gantry_proto::codec::{encode_frame_into, CodecError};
use gantry_proto::*;
use gantry_transport::framing::{FrameBudget, ReadLimits, WRITE_BATCH, WRITE_BATCH_BYTES};
use gantry_transport::quic::{self, FrameReceiver, FrameSender};
use tokio::sync::{mpsc, oneshot, watch};

use crate::election::{self, health, Election, HaConfig, LeadershipEvent, LeadershipStatus};
use crate::registry::{Registry, RegistryError, RegistryStore, RegistryWriter};
use crate::security::identity::{self, PeerPrincipal};

use crate::state::{
    ConnId, Input, MaintenanceCommand, MaintenanceError, Master, MasterConfig, OperatorCommand,
    OperatorRejection, Output,
};

pub mod api;
pub mod http;
mod http_guard;
pub mod metrics;
mod routes;
mod ui;
pub use http::{HttpConfig, HttpEndpoint, HttpLimits, SharedTokens};
pub use http_guard::AuthLimits;

/// QUIC application close codes.
const CLOSE_NORMAL: u32 = 0;
const CLOSE_PROTOCOL: u32 = 1;
/// TLS handshakes in progress at once. A herd of reconnecting agents (after a failover) would
/// otherwise share the CPU among thousands of handshakes that then all time out and retry.
const MAX_HANDSHAKES: usize = 64;

enum CoreEvent {
    /// This master was elected: recover the registry and start serving with `epoch`.
    Lead {
        epoch: u64,
        registry: Registry,
    },
    Input(Input),
    State(oneshot::Sender<serde_json::Value>),
    /// `/metrics`: the core's snapshot (`None` when this master does not lead).
    Metrics(oneshot::Sender<Option<crate::state::metrics::MetricsSnapshot>>),
    Operator(OperatorCommand, OperatorReply),
    /// A maintenance request (`None`: only read); answered with the maintenance view.
    Maintenance(
        Option<MaintenanceCommand>,
        oneshot::Sender<Result<serde_json::Value, MaintenanceError>>,
    ),
}

/// Events buffered for the event stream's subscribers together; a subscriber that falls this
/// far behind is dropped (it reconnects and starts again from a snapshot).
const EVENT_BUFFER: usize = 4096;

/// Where an operator command's outcome goes.
type OperatorReply = oneshot::Sender<Result<(), OperatorRejection>>;

enum Outbound {
    Agent(MasterToAgent),
    Framework(MasterToFramework),
    Close(String),
}

impl Outbound {
    /// The message's kind, for warnings about a peer that is not reading.
    fn kind(&self) -> &'static str {
        match self {
            Outbound::Agent(_) => "to an agent",
            Outbound::Framework(m) => match m {
                MasterToFramework::Subscribed { .. } => "subscribed",
                MasterToFramework::Offers(_) => "offers",
                MasterToFramework::Rescind { .. } => "rescind",
                MasterToFramework::Update(u) if u.reconciliation => "reconciliation update",
                MasterToFramework::Update(u) if u.source == UpdateSource::Agent => "agent's update",
                MasterToFramework::Update(_) => "master's update",
                MasterToFramework::Error { .. } => "error",
                MasterToFramework::Heartbeat => "heartbeat",
                MasterToFramework::DrainNotice(_) => "drain notice",
                MasterToFramework::VolumeDestroyed(_) => "volume destroyed",
                MasterToFramework::AgentRemoved(_) => "agent removed",
                MasterToFramework::Agents(_) => "agents",
            },
            Outbound::Close(_) => "close",
        }
    }
}

/// One served peer, as the core loop sees it.
#[derive(Clone)]
struct PeerHandle {
    outbox: mpsc::Sender<Outbound>,
    conn: quinn::Connection,
    /// `agent NAME at ADDR` / `framework PRINCIPAL at ADDR`, for warnings.
    label: Arc<str>,
}

/// Counters of what the shell did to bounded peers, shown in `/state` under `peers`.
#[derive(Default)]
struct PeerCounters {
    /// Peers closed because their outbox overflowed.
    stalled_closed: AtomicU64,
    /// Messages not sent to a peer (each with a warning naming it).
    dropped_messages: AtomicU64,
}

type Conns = Arc<DashMap<ConnId, PeerHandle>>;

/// Shared between connection tasks: where to send inputs, and each connection's outbox.
#[derive(Clone)]
struct Shell {
    core: mpsc::Sender<CoreEvent>,
    conns: Conns,
    /// How frames are read from peers (body deadline, shared budget).
    frame_limits: ReadLimits,
    counters: Arc<PeerCounters>,
    next_conn: Arc<AtomicU64>,
    status: watch::Receiver<LeadershipStatus>,
    /// Changes only when this master's role or the leader it knows changes (not on every lease
    /// renewal): what parked standby connections wait on.
    role: watch::Receiver<health::Admission>,
    /// The epoch whose registry the core has recovered (it serves peers from then on).
    ready: watch::Receiver<Option<u64>>,
    limits: conn_limits::ConnLimits,
    /// Cluster events (JSON) for `GET /api/v1/events`: the core never waits for a subscriber.
    events: tokio::sync::broadcast::Sender<Arc<str>>,
    /// What the shell measures for `/metrics` (allocation cycle times).
    metrics: metrics::ShellMetrics,
    /// Messages queued for one peer at most (`MasterConfig::peer_outbox`).
    outbox: usize,
    /// The connected agents' connections by name: the operator API opens sandbox streams on
    /// them (protocol v9).
    agent_conns: Arc<DashMap<String, (ConnId, quinn::Connection)>>,
    /// The persistent event history (`history`): the core loop pushes, a task flushes it to the
    /// registry, the operator API reads it.
    history: Arc<std::sync::Mutex<history::History>>,
    /// How long a peer's stream may take no bytes of a pending write before the peer is closed
    /// as stalled (`MasterConfig::peer_write_timeout_ms`; `None`: never).
    write_timeout: Option<Duration>,
}

/// Runs the master on a bound QUIC endpoint and HTTP listener until `shutdown` resolves.
///
/// `ha` selects standalone (always leader, registry in the work dir) or etcd election. The
/// master serves agents and frameworks only while it leads; as a standby it redirects them to
/// the leader. When it loses leadership it stops serving at once and `run` returns an error (as
/// a Mesos master does): the process supervisor restarts it as a standby. Before returning it
/// lets go of its etcd lease (resign and revoke, retried while etcd is unreachable, bounded), so
/// the next election does not wait for the lease's TTL.
pub async fn run(
    endpoint: quinn::Endpoint,
    http: HttpEndpoint,
    config: MasterConfig,
    ha: HaConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let acls = config.acls.clone();
    let (election, store) = election::start(ha).await?;
    let status = election.watch_status();
    let (core_tx, core_rx) = mpsc::channel(65_536);
    let (ready_tx, ready_rx) = watch::channel(None);
    let shell = Shell {
        core: core_tx.clone(),
        conns: Arc::new(DashMap::new()),
        frame_limits: ReadLimits {
            body_timeout: Duration::from_millis(config.frame_body_timeout_ms),
            budget: Arc::new(FrameBudget::new(config.frame_budget_bytes)),
        },
        counters: Arc::new(PeerCounters::default()),
        next_conn: Arc::new(AtomicU64::new(1)),
        status: status.clone(),
        role: follow_role(status.clone(), ready_rx.clone()),
        ready: ready_rx,
        limits: conn_limits::ConnLimits::new(&config.limits),
        events: tokio::sync::broadcast::channel(EVENT_BUFFER).0,
        metrics: metrics::ShellMetrics::default(),
        outbox: config.peer_outbox.max(64),
        agent_conns: Arc::new(DashMap::new()),
        history: Arc::new(std::sync::Mutex::new(history::History::new(
            config.history_events,
        ))),
        write_timeout: config.peer_write_timeout_ms.map(Duration::from_millis),
    };
    let (lost_tx, mut lost_rx) = mpsc::unbounded_channel::<String>();
    let writer = RegistryWriter::spawn(store.clone());
    // The history's changed pages go to the registry once a second (and once more on stop).
    let last_writer = writer.clone();
    let history_flush = {
        let (history, writer) = (shell.history.clone(), writer.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(history::FLUSH_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let (mutations, upto) = history
                    .lock()
                    .map(|mut h| h.flush_counted())
                    .unwrap_or_default();
                if mutations.is_empty() {
                    continue;
                }
                match writer.submit(mutations.clone()).await {
                    Ok(()) => {
                        if let Ok(mut h) = history.lock() {
                            h.stored(upto);
                        }
                    }
                    Err(e) => {
                        tracing::warn!("the event history was not written (retried): {e}");
                        if let Ok(mut h) = history.lock() {
                            h.unflushed(&mutations);
                        }
                    }
                }
            }
        })
    };
    // The core loop runs on a thread of its own: a busy core (a burst of 10,000 agents' updates)
    // then never holds up the QUIC endpoint and connection tasks on the shared runtime. They
    // keep reading the UDP socket, so a burst becomes a queue in front of the core (and QUIC
    // flow control once that is full) instead of datagrams dropped by the kernel, whose
    // retransmissions back off until connections idle out.
    let core = core_loop::core_loop(
        config,
        core_rx,
        shell.clone(),
        writer,
        status.clone(),
        lost_tx.clone(),
        ready_tx,
    );
    let (core_stop, core_stopped) = oneshot::channel::<()>();
    let core_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("gantry-core".into())
        .spawn(move || {
            core_runtime.block_on(async {
                tokio::select! {
                    _ = core => {}
                    _ = core_stopped => {}
                }
            });
        })?;
    let (release_tx, release_rx) = oneshot::channel::<Duration>();
    let leadership = tokio::spawn(follow_election(
        election, store, core_tx, lost_tx, release_rx,
    ));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let http_task = tokio::spawn(http::serve(http, shell.clone(), acls, stop_rx));

    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            reason = lost_rx.recv() => {
                let reason = reason.unwrap_or_else(|| "election ended".into());
                tracing::error!("lost leadership: {reason}; stopping (restart this master to rejoin as a standby)");
                break Err(anyhow::anyhow!("lost leadership: {reason}"));
            }
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break Ok(()) };
                // Past the handshake limit, refuse at once (the peer backs off and retries)
                // rather than slow every handshake down until they all time out.
                let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                    tracing::debug!(remote = %incoming.remote_address(), "too many handshakes in progress; refused");
                    incoming.refuse();
                    continue;
                };
                let shell = shell.clone();
                tokio::spawn(async move {
                    let remote = incoming.remote_address();
                    let handshake = incoming.await;
                    drop(permit);
                    match handshake {
                        Ok(conn) => peers::serve_connection(shell, conn).await,
                        Err(e) => tracing::info!(%remote, "handshake failed: {e}"),
                    }
                });
            }
        }
    };
    let _ = core_stop.send(());
    history_flush.abort();
    if result.is_ok() {
        let last = shell
            .history
            .lock()
            .map(|mut h| h.flush())
            .unwrap_or_default();
        if !last.is_empty() {
            let _ = tokio::time::timeout(Duration::from_secs(2), last_writer.submit(last)).await;
        }
    }
    let _ = stop_tx.send(true);
    endpoint.close(CLOSE_NORMAL.into(), b"master stopping");
    // Let go of the lease in etcd before the process ends, so another master is elected at
    // once instead of after the TTL. After a lost leadership (etcd unreachable, most likely)
    // the revoke is retried until etcd answers, up to RELEASE_AFTER_LOSS: etcd restores the
    // lease with a full TTL when it returns, and this master's key would hold the election up.
    let release = if result.is_err() {
        RELEASE_AFTER_LOSS
    } else {
        RELEASE_ON_SHUTDOWN
    };
    if release_tx.send(release).is_ok() {
        if result.is_err() {
            tracing::info!(
                "releasing this master's lease in etcd before stopping (at most {release:?})"
            );
        }
        let _ = tokio::time::timeout(release + Duration::from_secs(1), leadership).await;
    }
    let _ = http_task.await;
    let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
    result
}

/// How long a master that lost leadership keeps trying to revoke its lease before it exits
/// (nothing can be elected while etcd is unreachable anyway; see [`run`]).
const RELEASE_AFTER_LOSS: Duration = Duration::from_secs(10);
/// How long a master stopping on a signal waits to resign and revoke its lease.
const RELEASE_ON_SHUTDOWN: Duration = Duration::from_secs(2);

/// A watch of [`health::redirect`] that changes only when its value does.
fn follow_role(
    mut status: watch::Receiver<LeadershipStatus>,
    mut ready: watch::Receiver<Option<u64>>,
) -> watch::Receiver<health::Admission> {
    let (tx, rx) = watch::channel(peer_admission(
        &status.borrow_and_update(),
        *ready.borrow_and_update(),
    ));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = status.changed() => if r.is_err() { return },
                r = ready.changed() => if r.is_err() { return },
            }
            let now = peer_admission(&status.borrow_and_update(), *ready.borrow_and_update());
            tx.send_if_modified(|cur| {
                let changed = *cur != now;
                *cur = now;
                changed
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

/// Random bits (where parked peers' news falls in its spread window).
fn random_u64() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

/// What a connecting peer is told: served only once this master leads *and* its core has
/// recovered the registry for that epoch (`ready`), so a herd of peers parked with a freshly
/// elected standby does not compete with the registry load; until then they stay parked.
fn peer_admission(status: &LeadershipStatus, ready: Option<u64>) -> health::Admission {
    match health::admission(status, std::time::Instant::now()) {
        health::Admission::Serve { epoch } if ready == Some(epoch) => {
            health::Admission::Serve { epoch }
        }
        health::Admission::Serve { .. } => health::Admission::Standby { leader: None },
        standby => standby,
    }
}

/// Turns leadership events into core events: on election, load the registry (after the fence
/// is installed) and hand it to the core; on loss, report it (the master stops). When the
/// server stops it sends how long to wait for [`Election::resign`] (which revokes the lease).
async fn follow_election(
    mut election: Election,
    store: RegistryStore,
    core: mpsc::Sender<CoreEvent>,
    lost: mpsc::UnboundedSender<String>,
    mut release: oneshot::Receiver<Duration>,
) {
    let mut led = false;
    let mut ended = false;
    loop {
        let event = tokio::select! {
            event = election.next_event() => event,
            limit = &mut release => {
                if let Ok(limit) = limit {
                    resign(&mut election, limit).await;
                }
                return;
            }
        };
        let Some(event) = event else { break };
        match event {
            LeadershipEvent::Elected { epoch, fence, .. } => {
                store.set_fence(fence);
                match store.load().await {
                    Ok(registry) => {
                        tracing::info!(epoch, "elected leader; registry recovered");
                        led = true;
                        if core
                            .send(CoreEvent::Lead { epoch, registry })
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = lost.send(format!("could not load the registry: {e}"));
                        return;
                    }
                }
            }
            LeadershipEvent::Lost { reason, .. } => {
                store.clear_fence();
                if led {
                    let _ = lost.send(reason);
                    ended = true;
                    break;
                }
            }
            LeadershipEvent::LeaderChanged { leader } => {
                tracing::info!(?leader, "leader changed");
            }
        }
    }
    if !ended {
        let _ = lost.send("the election ended".into());
    }
    if let Ok(limit) = release.await {
        resign(&mut election, limit).await;
    }
}

async fn resign(election: &mut Election, limit: Duration) {
    match election.resign(limit).await {
        Ok(()) => tracing::debug!("election resigned"),
        Err(e) => tracing::warn!("election: {e}; its lease expires in etcd after its TTL"),
    }
}

/// The wall clock in Unix milliseconds (for `/state`'s task times).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
