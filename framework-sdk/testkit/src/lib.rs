//! # gantry-sdk-testkit
//!
//! Unit tests for a framework's [`Scheduler`]: a scripted master in the test's own process
//! (Kubernetes' envtest, for Gantry frameworks). The scheduler runs in the real
//! [`Driver`], over real QUIC and mutual TLS on loopback, so what the test
//! sees is what a master would: the test script plays the master — it sends offers, status
//! updates, rescinds, errors and drain notices, fails over — and reads back what the scheduler
//! sent (accepts, declines, kills, acknowledgements, reconciliations, demand).
//!
//! A separate crate (a dev-dependency) so that `gantry-sdk` keeps no certificate authority in
//! what frameworks ship: the kit issues a throwaway CA and certificates with `gantry-pki`.
//!
//! - [`TestMaster`]: the scripted master: a temporary TLS directory, a server endpoint on
//!   loopback, [`TestMaster::config`] (a [`DriverConfig`] that reaches it),
//!   [`TestMaster::start`] (runs a scheduler in a driver) and [`TestMaster::accept`] (the
//!   driver's next subscription: a [`Session`]).
//! - [`Session`]: one connection as the leading master: `offers`, `update`, `rescind`,
//!   `error`, `send` to drive the scheduler; `recv`, `expect` (the first message of a kind,
//!   whatever came before it), the `expect_*` helpers and `quiet` to assert what it sent; [`Session::failover`] to drop it as a dying master does
//!   (the driver reconnects; the next session leads with a higher epoch).
//! - [`Running`]: the driver task: its [`DriverHandle`], the scheduler itself between steps
//!   ([`Running::scheduler`]) and its end.
//! - [`offer`] and [`update`]: messages to script with.
//!
//! Every wait is bounded ([`TestMaster::set_timeout`], 30 s by default) and reported as a
//! [`TestKitError`], never a hang.
//!
//! ```
//! use gantry_sdk::protocol::*;
//! use gantry_sdk::{DriverHandle, Scheduler};
//! use gantry_sdk_testkit::TestMaster;
//!
//! /// Launches one `sleep` per offer with room for it, declines the rest.
//! struct Sleeper;
//!
//! impl Scheduler for Sleeper {
//!     async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
//!         let task = TaskInfo::new("nap", "sleep 1", "cpus:1;mem:64".parse().unwrap());
//!         for offer in offers {
//!             if offer.total().contains(&task.resources) {
//!                 driver.launch(offer.id, vec![task.clone()]);
//!             } else {
//!                 driver.decline(vec![offer.id], None);
//!             }
//!         }
//!     }
//! }
//!
//! # #[tokio::main] async fn main() -> Result<(), gantry_sdk_testkit::TestKitError> {
//! let mut master = TestMaster::new("sleeper")?;
//! let running = master.start(Sleeper);
//! let mut session = master.accept().await?;
//! let big = session.offer("agent-1", "cpus:4;mem:1024")?;
//! let small = session.offer("agent-2", "cpus:0.5;mem:64")?;
//! session.offers(vec![big.clone(), small.clone()]).await?;
//! let (offer_ids, tasks) = session.expect_launch().await?;
//! assert_eq!((offer_ids, tasks.len()), (vec![big.id], 1));
//! assert_eq!(session.expect_decline().await?, vec![small.id]);
//! running.disconnect().await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_sdk::protocol::codec::CodecError;
use gantry_sdk::protocol::*;
use gantry_sdk::scheduler::DriverError;
use gantry_sdk::transport::tls::{PeerIdentity, TlsError};
use gantry_sdk::transport::{quic, FrameReader};
use gantry_sdk::{Driver, DriverConfig, DriverHandle, Scheduler};

/// What went wrong in a scripted exchange.
#[derive(Debug, thiserror::Error)]
pub enum TestKitError {
    /// The temporary TLS directory could not be made.
    #[error("test TLS directory: {0}")]
    Tls(#[from] TlsError),
    /// The scripted master's endpoint could not be made.
    #[error("test master endpoint: {0}")]
    Transport(#[from] quic::TransportError),
    /// An I/O error making the temporary directory.
    #[error("test directory: {0}")]
    Io(#[from] std::io::Error),
    /// The connection to the driver failed or carried something unreadable.
    #[error("connection to the driver: {0}")]
    Codec(#[from] CodecError),
    /// Nothing (or not what was expected) arrived in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        after: Duration,
    },
    /// The driver's first message on a connection was not a subscription.
    #[error("expected a subscription, got {0}")]
    NotSubscribed(String),
    /// A resources string in [`Session::offer`] did not parse.
    #[error("bad resources {0:?}: {1}")]
    BadResources(String, String),
    /// The driver task panicked or was cancelled.
    #[error("the driver task failed: {0}")]
    Join(String),
    /// The driver ended with an error.
    #[error("the driver ended with an error: {0}")]
    Driver(#[from] DriverError),
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Agent names to ids, shared by the sessions of one master so an agent keeps its id.
type Agents = Arc<Mutex<HashMap<String, AgentId>>>;

/// The scripted master: a throwaway TLS directory (CA, the master's certificate and the
/// framework's) and a QUIC server endpoint on loopback. Dropping it closes the endpoint and
/// removes the directory.
pub struct TestMaster {
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    principal: String,
    framework_id: FrameworkId,
    epoch: u64,
    timeout: Duration,
    agents: Agents,
    // Last: removed after the endpoint is closed.
    dir: TempDir,
}

impl TestMaster {
    /// A master for the framework whose certificate names `principal`.
    pub fn new(principal: &str) -> Result<Self, TestKitError> {
        let dir = TempDir(std::env::temp_dir().join(format!(
            "gantry-testkit-{principal}-{}",
            uuid::Uuid::new_v4()
        )));
        std::fs::create_dir_all(&dir.0)?;
        gantry_pki::ensure_ca(&dir.0)?;
        let material = gantry_pki::load_or_issue(&dir.0, &PeerIdentity::Master, &[])?;
        gantry_pki::load_or_issue(&dir.0, &PeerIdentity::Framework(principal.into()), &[])?;
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        // Stateless resets matter to masters that restart on one address; this one does not.
        let reset_key = [7u8; 32];
        let endpoint = quic::server_endpoint(any_port, &material, &reset_key)?;
        let addr = endpoint.local_addr()?;
        Ok(Self {
            endpoint,
            addr,
            principal: principal.into(),
            framework_id: FrameworkId::random(),
            epoch: 0,
            timeout: Duration::from_secs(30),
            agents: Agents::default(),
            dir,
        })
    }

    /// How long every wait lasts before it fails with [`TestKitError::Timeout`] (30 s by
    /// default; waits end as soon as what they wait for arrives).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The id every subscription is answered with.
    pub fn framework_id(&self) -> FrameworkId {
        self.framework_id
    }

    /// The master's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The TLS directory (the CA and the framework's certificate).
    pub fn tls_dir(&self) -> &Path {
        &self.dir.0
    }

    /// A driver configuration that reaches this master: the principal, role `default`, and
    /// quick reconnects (20 ms to 200 ms). Change what the test needs before
    /// [`TestMaster::start_with`].
    pub fn config(&self) -> DriverConfig {
        let mut config = DriverConfig::builder(&self.principal)
            .master(self.addr.to_string())
            .tls_dir(&self.dir.0)
            .role("default")
            .build();
        config.backoff = (Duration::from_millis(20), Duration::from_millis(200));
        config
    }

    /// Runs `scheduler` in a driver configured by [`TestMaster::config`].
    pub fn start<S: Scheduler + 'static>(&self, scheduler: S) -> Running<S> {
        self.start_with(self.config(), scheduler)
    }

    /// Runs `scheduler` in a driver configured by `config`.
    pub fn start_with<S: Scheduler + 'static>(
        &self,
        config: DriverConfig,
        scheduler: S,
    ) -> Running<S> {
        let driver = Driver::new(config);
        let handle = driver.handle();
        let scheduler = Arc::new(tokio::sync::Mutex::new(scheduler));
        let task = tokio::spawn(driver.run(Shared(scheduler.clone())));
        Running {
            handle,
            scheduler,
            task: Some(task),
            timeout: self.timeout,
        }
    }

    /// Serves the driver's next connection as the leading master (with a higher epoch than
    /// the last session's: a failover): reads its subscription and answers `Subscribed`.
    pub async fn accept(&mut self) -> Result<Session, TestKitError> {
        let after = self.timeout;
        let timeout = |what: &str| TestKitError::Timeout {
            what: what.into(),
            after,
        };
        let deadline = tokio::time::Instant::now() + after;
        let conn = loop {
            let incoming = tokio::time::timeout_at(deadline, self.endpoint.accept())
                .await
                .map_err(|_| timeout("the driver to connect"))?
                .ok_or_else(|| timeout("the driver to connect (endpoint closed)"))?;
            // A connection attempt that fails (a retry of an older one) is not the driver's
            // next session.
            if let Ok(Ok(conn)) = tokio::time::timeout_at(deadline, incoming).await {
                break conn;
            }
        };
        let (_, mut tx, rx) = tokio::time::timeout_at(deadline, quic::accept_stream(&conn))
            .await
            .map_err(|_| timeout("the driver's hello"))??;
        self.epoch += 1;
        tx.send(&MasterRole::Leading { epoch: self.epoch }).await?;
        let mut rx = FrameReader::from(rx);
        let first = tokio::time::timeout_at(deadline, rx.recv::<FrameworkToMaster>())
            .await
            .map_err(|_| timeout("the driver's subscription"))??;
        let FrameworkToMaster::Subscribe(info) = first else {
            return Err(TestKitError::NotSubscribed(format!("{first:?}")));
        };
        tx.send(&MasterToFramework::Subscribed {
            framework_id: self.framework_id,
            epoch: self.epoch,
            heartbeat_interval_ms: 60_000,
        })
        .await?;
        Ok(Session {
            conn,
            tx,
            rx,
            info,
            framework_id: self.framework_id,
            epoch: self.epoch,
            timeout: self.timeout,
            agents: self.agents.clone(),
            received: Vec::new(),
            unread: VecDeque::new(),
        })
    }
}

/// An offer of `resources` on the agent `agent_id` (named `agent_name`) to `framework_id`,
/// role `default`, with a fresh id.
pub fn offer(
    framework_id: FrameworkId,
    agent_id: AgentId,
    agent_name: &str,
    resources: Resources,
) -> Offer {
    Offer {
        id: OfferId::random(),
        framework_id,
        agent_id,
        hostname: agent_name.into(),
        role: "default".into(),
        resources,
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: Vec::new().into(),
        gpu_free: Vec::new(),
        agent_name: agent_name.into(),
    }
}

/// A status update of `task_id` to `state`, from the agent (as a master forwards it).
pub fn update(framework_id: FrameworkId, task_id: TaskId, state: TaskState) -> StatusUpdate {
    StatusUpdate::new(task_id, framework_id, state)
}

/// One connection from the driver, served as the leading master.
pub struct Session {
    conn: quinn::Connection,
    tx: quic::FrameSender,
    rx: FrameReader,
    info: FrameworkInfo,
    framework_id: FrameworkId,
    epoch: u64,
    timeout: Duration,
    agents: Agents,
    received: Vec<FrameworkToMaster>,
    /// Read, and not taken by an `expect` or `recv` yet.
    unread: VecDeque<FrameworkToMaster>,
}

impl Session {
    /// What the driver subscribed with (its roles, suppressed roles, capabilities...).
    pub fn subscription(&self) -> &FrameworkInfo {
        &self.info
    }

    /// This session's epoch (1 for the first, one more after each failover).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The framework id the session gave the driver.
    pub fn framework_id(&self) -> FrameworkId {
        self.framework_id
    }

    /// An offer of `resources` (e.g. `"cpus:4;mem:1024;gpus:1"`) on the agent named `agent`
    /// (the same id every time for one name), not yet sent: see [`Session::offers`].
    pub fn offer(&self, agent: &str, resources: &str) -> Result<Offer, TestKitError> {
        let resources: Resources = resources
            .parse()
            .map_err(|e| TestKitError::BadResources(resources.into(), format!("{e}")))?;
        let agent_id = *self
            .agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(agent.into())
            .or_insert_with(AgentId::random);
        Ok(offer(self.framework_id, agent_id, agent, resources))
    }

    /// The id of the agent named `agent` in [`Session::offer`].
    pub fn agent_id(&self, agent: &str) -> AgentId {
        *self
            .agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(agent.into())
            .or_insert_with(AgentId::random)
    }

    /// A status update of `task_id` to `state` for this framework, not yet sent.
    pub fn status(&self, task_id: TaskId, state: TaskState) -> StatusUpdate {
        update(self.framework_id, task_id, state)
    }

    /// Sends any message (a drain notice, a heartbeat, a hand-made update).
    pub async fn send(&mut self, msg: MasterToFramework) -> Result<(), TestKitError> {
        Ok(self.tx.send(&msg).await?)
    }

    /// Sends offers ([`Scheduler::offers`]).
    pub async fn offers(&mut self, offers: Vec<Offer>) -> Result<(), TestKitError> {
        self.send(MasterToFramework::Offers(offers)).await
    }

    /// Sends a status update ([`Scheduler::status_update`]).
    pub async fn update(&mut self, update: StatusUpdate) -> Result<(), TestKitError> {
        self.send(MasterToFramework::Update(update)).await
    }

    /// Rescinds an offer ([`Scheduler::offer_rescinded`]).
    pub async fn rescind(&mut self, offer_id: OfferId) -> Result<(), TestKitError> {
        self.send(MasterToFramework::Rescind { offer_id }).await
    }

    /// Reports an error ([`Scheduler::error`]).
    pub async fn error(&mut self, kind: ErrorKind, message: &str) -> Result<(), TestKitError> {
        let message = message.into();
        self.send(MasterToFramework::Error { kind, message }).await
    }

    /// The next message the driver sent (acknowledgements included) that no `expect` has
    /// taken yet.
    pub async fn recv(&mut self) -> Result<FrameworkToMaster, TestKitError> {
        if let Some(msg) = self.unread.pop_front() {
            return Ok(msg);
        }
        let after = self.timeout;
        tokio::time::timeout(after, self.read())
            .await
            .map_err(|_| TestKitError::Timeout {
                what: "a message from the driver".into(),
                after,
            })?
    }

    /// Reads one message off the connection (logged in [`Session::received`]).
    async fn read(&mut self) -> Result<FrameworkToMaster, TestKitError> {
        let msg: FrameworkToMaster = self.rx.recv().await?;
        self.received.push(msg.clone());
        Ok(msg)
    }

    /// The first message, in the order the driver sent them, for which `pick` returns `Some`,
    /// and what `pick` made of it. Messages passed over are kept for later `recv`s and
    /// `expect`s, so expectations need not follow the order of the stream (an update's
    /// acknowledgement goes out after the requests its callback made, say).
    pub async fn expect<T>(
        &mut self,
        what: &str,
        mut pick: impl FnMut(&FrameworkToMaster) -> Option<T>,
    ) -> Result<T, TestKitError> {
        for i in 0..self.unread.len() {
            if let Some(t) = pick(&self.unread[i]) {
                self.unread.remove(i);
                return Ok(t);
            }
        }
        let after = self.timeout;
        let deadline = tokio::time::Instant::now() + after;
        loop {
            let msg = tokio::time::timeout_at(deadline, self.read())
                .await
                .map_err(|_| TestKitError::Timeout {
                    what: what.into(),
                    after,
                })??;
            if let Some(t) = pick(&msg) {
                return Ok(t);
            }
            self.unread.push_back(msg);
        }
    }

    /// The next accept: its offers and operations.
    pub async fn expect_accept(&mut self) -> Result<(Vec<OfferId>, Vec<Operation>), TestKitError> {
        self.expect("an accept", |m| match m {
            FrameworkToMaster::Accept {
                offer_ids,
                operations,
                ..
            } => Some((offer_ids.clone(), operations.clone())),
            _ => None,
        })
        .await
    }

    /// The next accept that launches tasks: its offers and every task it launches.
    pub async fn expect_launch(&mut self) -> Result<(Vec<OfferId>, Vec<TaskInfo>), TestKitError> {
        self.expect("an accept launching tasks", |m| match m {
            FrameworkToMaster::Accept {
                offer_ids,
                operations,
                ..
            } => {
                let tasks: Vec<TaskInfo> = operations
                    .iter()
                    .flat_map(|op| match op {
                        Operation::Launch { tasks } => tasks.clone(),
                        _ => Vec::new(),
                    })
                    .collect();
                (!tasks.is_empty()).then(|| (offer_ids.clone(), tasks))
            }
            _ => None,
        })
        .await
    }

    /// The next decline: the offers it declines.
    pub async fn expect_decline(&mut self) -> Result<Vec<OfferId>, TestKitError> {
        self.expect("a decline", |m| match m {
            FrameworkToMaster::Decline { offer_ids, .. } => Some(offer_ids.clone()),
            _ => None,
        })
        .await
    }

    /// The next kill: the task it kills.
    pub async fn expect_kill(&mut self) -> Result<TaskId, TestKitError> {
        self.expect("a kill", |m| match m {
            FrameworkToMaster::Kill { task_id } => Some(*task_id),
            _ => None,
        })
        .await
    }

    /// The next acknowledgement: the update it acknowledges.
    pub async fn expect_ack(&mut self) -> Result<UpdateId, TestKitError> {
        self.expect("an acknowledgement", |m| match m {
            FrameworkToMaster::Acknowledge { update_id, .. } => Some(*update_id),
            _ => None,
        })
        .await
    }

    /// What no `expect` has taken yet, and everything the driver sends within `window` (to
    /// assert that something was *not* sent, e.g. no kill, once what should come has been
    /// awaited).
    pub async fn quiet(
        &mut self,
        window: Duration,
    ) -> Result<Vec<FrameworkToMaster>, TestKitError> {
        let deadline = tokio::time::Instant::now() + window;
        let mut out: Vec<FrameworkToMaster> = self.unread.drain(..).collect();
        while let Ok(msg) = tokio::time::timeout_at(deadline, self.read()).await {
            out.push(msg?);
        }
        Ok(out)
    }

    /// Every message read on this session so far, in order (taken by an `expect` or not).
    pub fn received(&self) -> &[FrameworkToMaster] {
        &self.received
    }

    /// Drops the connection as a master that dies does: the driver calls
    /// [`Scheduler::disconnected`] and reconnects; [`TestMaster::accept`] serves it again as a
    /// new leader (a higher epoch), the framework id kept.
    pub fn failover(self) {
        self.conn.close(0u32.into(), b"failover");
    }
}

/// A scheduler running in a driver ([`TestMaster::start`]). Dropping it ends the driver.
pub struct Running<S> {
    handle: DriverHandle,
    scheduler: Arc<tokio::sync::Mutex<S>>,
    task: Option<tokio::task::JoinHandle<Result<(), DriverError>>>,
    timeout: Duration,
}

impl<S> Running<S> {
    /// The driver's handle (as the scheduler's callbacks get it).
    pub fn handle(&self) -> &DriverHandle {
        &self.handle
    }

    /// The scheduler, locked: inspect its state between steps of the script (callbacks wait
    /// while it is held).
    pub async fn scheduler(&self) -> tokio::sync::MutexGuard<'_, S> {
        self.scheduler.lock().await
    }

    /// Waits for the driver to end by itself (the scheduler called `teardown`, `disconnect`
    /// or `stop`, or no master was reachable), within the master's timeout.
    pub async fn finished(mut self) -> Result<(), TestKitError> {
        let after = self.timeout;
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        let joined =
            tokio::time::timeout(after, task)
                .await
                .map_err(|_| TestKitError::Timeout {
                    what: "the driver to end".into(),
                    after,
                })?;
        Ok(joined.map_err(|e| TestKitError::Join(e.to_string()))??)
    }

    /// Ends the driver without tearing the framework down, and waits for it.
    pub async fn disconnect(self) -> Result<(), TestKitError> {
        self.handle.disconnect();
        self.finished().await
    }
}

impl<S> Drop for Running<S> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The scheduler behind a lock, so the test can look at it while the driver runs it.
struct Shared<S>(Arc<tokio::sync::Mutex<S>>);

impl<S: Scheduler> Scheduler for Shared<S> {
    async fn registered(&mut self, driver: &DriverHandle, framework_id: FrameworkId) {
        self.0.lock().await.registered(driver, framework_id).await;
    }
    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        self.0.lock().await.offers(driver, offers).await;
    }
    async fn offer_rescinded(&mut self, driver: &DriverHandle, offer_id: OfferId) {
        self.0.lock().await.offer_rescinded(driver, offer_id).await;
    }
    async fn status_update(&mut self, driver: &DriverHandle, update: &StatusUpdate) {
        self.0.lock().await.status_update(driver, update).await;
    }
    async fn error(&mut self, driver: &DriverHandle, kind: ErrorKind, message: &str) {
        self.0.lock().await.error(driver, kind, message).await;
    }
    async fn drain_notice(&mut self, driver: &DriverHandle, notice: &DrainNotice) {
        self.0.lock().await.drain_notice(driver, notice).await;
    }
    async fn disconnected(&mut self, driver: &DriverHandle) {
        self.0.lock().await.disconnected(driver).await;
    }
    async fn wake(&mut self, driver: &DriverHandle, token: u64) {
        self.0.lock().await.wake(driver, token).await;
    }
}
