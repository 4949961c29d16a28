//! Links to every master, and the session with the one that leads (shared by agents and the
//! SDK driver).
//!
//! One *link* per master address keeps a connection open, reconnecting with jittered backoff.
//! After the hello the master says what it is ([`MasterRole`]): the leader's link hands its
//! stream over as a [`LeaderSession`]; a standby's link waits on its open stream, and the
//! standby sends `Leading` on it the moment it is elected. After a failover every peer thus
//! re-registers over a connection that already exists: no handshake herd at the new leader, and
//! no waiting for the dead leader's connection to time out. A standby that names a leader no
//! link knows adds a link to it, so one reachable address is enough to find the cluster.
//!
//! Epochs only grow: [`Masters::next_session`] never returns a session older than asked for, so a
//! deposed master that still claims to lead is ignored.
//!
//! ```no_run
//! # async fn run(material: gantry_transport::TlsMaterial) -> Result<(), Box<dyn std::error::Error>> {
//! use gantry_proto::PeerKind;
//! use gantry_transport::masters::{Masters, MastersConfig};
//! use gantry_transport::quic;
//!
//! let config = MastersConfig::new(
//!     vec!["10.0.0.1:5050".into(), "10.0.0.2:5050".into()],
//!     PeerKind::Agent,
//!     quic::client_config(&material)?,
//! );
//! let mut masters = Masters::start(config)?;
//! loop {
//!     let mut session = masters.next_session().await;
//!     // ... register on `session.tx`, then read `session.rx` until the connection is lost
//!     // or a newer leader announces itself:
//!     tokio::select! {
//!         _ = session.rx.recv::<gantry_proto::MasterToAgent>() => {}
//!         _ = masters.newer_leader() => {}
//!     }
//!     session.conn.close(0u32.into(), b"bye");
//! }
//! # }
//! ```

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::backoff::Backoff;
use super::quic::{self, FrameReceiver, FrameSender, TransportError};
use gantry_proto::{MasterRole, PeerKind};

/// A ready stream to the leading master: the hello is done and the master said it leads in
/// `epoch`; register / subscribe next.
pub struct LeaderSession {
    /// The leading master's address.
    pub addr: SocketAddr,
    /// Its term (only grows).
    pub epoch: u64,
    /// The QUIC connection.
    pub conn: quinn::Connection,
    /// Frames to the leader.
    pub tx: FrameSender,
    /// Frames from the leader.
    pub rx: FrameReceiver,
}

impl std::fmt::Debug for LeaderSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderSession")
            .field("addr", &self.addr)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// How to reach the masters.
pub struct MastersConfig {
    /// Master addresses (`host:port`), as configured.
    pub masters: Vec<String>,
    /// Agent or framework (sent in the hello).
    pub kind: PeerKind,
    /// From [`quic::client_config`].
    pub client: quinn::ClientConfig,
    /// Share this endpoint (UDP socket) among the links; by default each `Masters` binds its
    /// own, one per address family.
    pub endpoint: Option<quinn::Endpoint>,
    /// Reconnect backoff of each link: initial and maximum delay.
    pub backoff: (Duration, Duration),
}

impl MastersConfig {
    /// Links to `masters` (`host:port`) as `kind`, with the QUIC client configuration `client`.
    pub fn new(masters: Vec<String>, kind: PeerKind, client: quinn::ClientConfig) -> Self {
        Self {
            masters,
            kind,
            client,
            endpoint: None,
            backoff: (Duration::from_millis(100), Duration::from_secs(5)),
        }
    }
}

enum LinkEvent {
    Leading(LeaderSession),
    Standby { leader: Option<String> },
}

struct Shared {
    kind: PeerKind,
    client: quinn::ClientConfig,
    backoff: (Duration, Duration),
    endpoints: Mutex<Endpoints>,
    /// Resolved addresses with a link: a second link to the same master (configured twice, or
    /// discovered under another name) ends itself.
    claimed: Mutex<HashSet<SocketAddr>>,
    /// The highest epoch any master announced.
    newest_epoch: AtomicU64,
    events: mpsc::UnboundedSender<LinkEvent>,
}

#[derive(Default)]
struct Endpoints {
    fixed: Option<quinn::Endpoint>,
    v4: Option<quinn::Endpoint>,
    v6: Option<quinn::Endpoint>,
}

impl Shared {
    fn endpoint(&self, addr: SocketAddr) -> Result<quinn::Endpoint, TransportError> {
        let mut eps = self.endpoints.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ep) = &eps.fixed {
            return Ok(ep.clone());
        }
        let slot = if addr.is_ipv6() {
            &mut eps.v6
        } else {
            &mut eps.v4
        };
        if let Some(ep) = slot {
            return Ok(ep.clone());
        }
        let ep = quic::bind_client(addr)?;
        *slot = Some(ep.clone());
        Ok(ep)
    }
}

/// Links to every known master; see the module docs. Dropping it closes them.
pub struct Masters {
    shared: Arc<Shared>,
    events: mpsc::UnboundedReceiver<LinkEvent>,
    known: HashSet<String>,
    links: Vec<tokio::task::JoinHandle<()>>,
    /// Epoch of the session last handed out: never go back to an older one.
    epoch: u64,
    /// A newer leader's session, found by [`Masters::newer_leader`].
    newer: Option<LeaderSession>,
}

impl Masters {
    /// Starts one link per configured address (needs a tokio runtime).
    pub fn start(config: MastersConfig) -> Result<Self, TransportError> {
        if config.masters.is_empty() {
            return Err(TransportError::Config("no master addresses".into()));
        }
        let (tx, events) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            kind: config.kind,
            client: config.client,
            backoff: config.backoff,
            endpoints: Mutex::new(Endpoints {
                fixed: config.endpoint,
                ..Default::default()
            }),
            claimed: Mutex::new(HashSet::new()),
            newest_epoch: AtomicU64::new(0),
            events: tx,
        });
        let mut masters = Self {
            shared,
            events,
            known: HashSet::new(),
            links: Vec::new(),
            epoch: 0,
            newer: None,
        };
        for addr in config.masters {
            masters.add(addr);
        }
        Ok(masters)
    }

    fn add(&mut self, addr: String) {
        if self.known.insert(addr.clone()) {
            self.links
                .push(tokio::spawn(link(self.shared.clone(), addr)));
        }
    }

    /// The session to use next: the newer leader [`newer_leader`](Self::newer_leader) found,
    /// or else the first master that says it leads with at least the epoch of the previous
    /// session (the same leader after a lost connection, or a newer one). Cancel-safe.
    pub async fn next_session(&mut self) -> LeaderSession {
        let s = match self.newer.take() {
            Some(s) => s,
            None => self.leader(self.epoch).await,
        };
        self.epoch = s.epoch;
        s
    }

    /// Resolves when a master with a higher epoch than the current session's says it leads;
    /// [`next_session`](Self::next_session) then returns its session. Cancel-safe: use it in
    /// `select!` next to the session's reads, and end the session when it resolves.
    pub async fn newer_leader(&mut self) {
        if self.newer.is_none() {
            self.newer = Some(self.leader(self.epoch + 1).await);
        }
    }

    /// The first session from a master that says it leads with an epoch of at least
    /// `min_epoch`.
    async fn leader(&mut self, min_epoch: u64) -> LeaderSession {
        loop {
            // `self.shared` keeps a sender alive: `recv` never returns `None`.
            let Some(event) = self.events.recv().await else {
                return std::future::pending().await;
            };
            match event {
                LinkEvent::Leading(s) if s.conn.close_reason().is_some() => {}
                LinkEvent::Leading(s) if s.epoch < min_epoch => {
                    tracing::info!(master = %s.addr, epoch = s.epoch, min_epoch, "ignoring a deposed master");
                    s.conn.close(0u32.into(), b"deposed");
                }
                LinkEvent::Leading(s) => return s,
                LinkEvent::Standby {
                    leader: Some(leader),
                } => self.add(leader),
                LinkEvent::Standby { leader: None } => {}
            }
        }
    }
}

impl Masters {
    /// Closes every link and waits (up to a second) until the masters have been told, so they
    /// see a clean close rather than an idle timeout. A shared endpoint is left open.
    pub async fn shutdown(&mut self) {
        for l in &self.links {
            l.abort();
        }
        let eps: Vec<quinn::Endpoint> = {
            let mut eps = self
                .shared
                .endpoints
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            eps.v4.take().into_iter().chain(eps.v6.take()).collect()
        };
        for ep in eps {
            ep.close(0u32.into(), b"bye");
            let _ = tokio::time::timeout(Duration::from_secs(1), ep.wait_idle()).await;
        }
    }
}

impl Drop for Masters {
    fn drop(&mut self) {
        for l in &self.links {
            l.abort();
        }
    }
}

/// One master's link: connect, learn its role, hand over the stream when it leads (then wait
/// for that session to end), reconnect with backoff.
async fn link(shared: Arc<Shared>, target: String) {
    let mut backoff = Backoff::new(shared.backoff.0, shared.backoff.1);
    let mut claimed: Option<SocketAddr> = None;
    while !shared.events.is_closed() {
        match tokio::net::lookup_host(&target).await.map(|mut a| a.next()) {
            Ok(Some(addr)) => {
                if claimed != Some(addr) {
                    let mut set = shared.claimed.lock().unwrap_or_else(|e| e.into_inner());
                    if !set.insert(addr) {
                        tracing::debug!(%target, %addr, "another link serves this master");
                        return;
                    }
                    if let Some(old) = claimed.replace(addr) {
                        set.remove(&old);
                    }
                }
                if let Err(e) = session(&shared, addr, &mut backoff).await {
                    tracing::debug!(master = %target, "link: {e}");
                }
            }
            Ok(None) | Err(_) => tracing::warn!("cannot resolve master address {target:?}"),
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

async fn session(
    shared: &Shared,
    addr: SocketAddr,
    backoff: &mut Backoff,
) -> Result<(), TransportError> {
    let endpoint = shared.endpoint(addr)?;
    let (conn, tx, mut rx, mut role) =
        quic::connect_with(&endpoint, shared.client.clone(), addr, shared.kind).await?;
    backoff.reset();
    loop {
        match role {
            MasterRole::Leading { epoch } => {
                tracing::debug!(master = %addr, epoch, "master leads");
                shared.newest_epoch.fetch_max(epoch, Ordering::Relaxed);
                let closed = conn.clone();
                let session = LeaderSession {
                    addr,
                    epoch,
                    conn,
                    tx,
                    rx,
                };
                if shared.events.send(LinkEvent::Leading(session)).is_err() {
                    return Ok(());
                }
                closed.closed().await;
                if shared.newest_epoch.load(Ordering::Relaxed) > epoch {
                    // Deposed (a newer leader announced itself): it is dead or stepping down
                    // and restarting. Give it time instead of a herd of handshakes to a dead
                    // address.
                    backoff.hold_off();
                }
                return Ok(());
            }
            MasterRole::Standby { leader } => {
                tracing::debug!(master = %addr, ?leader, "master is a standby");
                if shared.events.send(LinkEvent::Standby { leader }).is_err() {
                    return Ok(());
                }
                role = rx.recv().await?;
            }
        }
    }
}
