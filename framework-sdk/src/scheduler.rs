//! The framework author's API: implement [`Scheduler`] (policy), run it with a [`Driver`]
//! (mechanism), and act through the cloneable [`DriverHandle`].
//!
//! The driver connects to the master over QUIC with mutual TLS, subscribes, calls the scheduler
//! for every event, acknowledges each status update after its callback returns, and reconnects
//! with backoff (keeping its framework id) when the connection drops or the master it reached is
//! not the leader.
//!
//! ```no_run
//! use gantry_sdk::protocol::*;
//! use gantry_sdk::{Driver, DriverConfig, DriverHandle, Scheduler};
//!
//! struct Sleepy;
//! impl Scheduler for Sleepy {
//!     async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
//!         for offer in offers {
//!             let task = TaskInfo {
//!                 task_id: TaskId::random(),
//!                 name: "sleep".into(),
//!                 command: "sleep 1".into(),
//!                 resources: "cpus:1;mem:128".parse().unwrap(),
//!                 env: Default::default(),
//!                 kill_grace_secs: None,
//!                 gpu_selector: None,
//!                 container: None,
//!             };
//!             driver.launch(offer.id, vec![task]);
//!         }
//!     }
//! }
//!
//! # async fn run() -> anyhow::Result<()> {
//! let config = DriverConfig::new(vec!["127.0.0.1:5050".into()], "/tmp/gantry-tls".into(), "sleepy", vec!["default".into()]);
//! Driver::new(config).run(Sleepy).await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::driver_core::{Command, DriverCore, Effect, Event};
use crate::protocol::codec::{encode_frame_into, WRITE_BATCH_BYTES};
use crate::protocol::*;
use crate::timers::TimerId;
use crate::transport::masters::{LeaderSession, Masters, MastersConfig};
use crate::transport::quic;
use crate::transport::tls::{self, PeerIdentity};
use crate::transport::FrameReader;

pub use crate::driver_core::{KILL_ATTEMPTS, KILL_RETRY};

mod config;
pub use config::{DriverConfig, DriverConfigBuilder};

/// Callbacks of a framework scheduler. Every method has a default that does nothing (offers
/// are declined by default). Callbacks run one at a time, in the order events arrive.
pub trait Scheduler: Send {
    /// Subscribed (or re-subscribed after a reconnect) with this framework id.
    fn registered(
        &mut self,
        driver: &DriverHandle,
        framework_id: FrameworkId,
    ) -> impl Future<Output = ()> + Send {
        let _ = (driver, framework_id);
        async {}
    }
    /// New offers. Accept (launch), decline, or keep them for later.
    fn offers(
        &mut self,
        driver: &DriverHandle,
        offers: Vec<Offer>,
    ) -> impl Future<Output = ()> + Send {
        driver.decline(offers.iter().map(|o| o.id).collect(), None);
        async {}
    }
    /// An offer is no longer valid.
    fn offer_rescinded(
        &mut self,
        driver: &DriverHandle,
        offer_id: OfferId,
    ) -> impl Future<Output = ()> + Send {
        let _ = (driver, offer_id);
        async {}
    }
    /// A task changed state. The driver acknowledges the update after this returns (or,
    /// under [`DriverConfig::explicit_acks`], when you call [`DriverHandle::acknowledge`]).
    /// `DROPPED` (reason `InvalidOffers`) means the accept that carried the task was invalid,
    /// typically because it named an offer an earlier accept or decline on the same agent had
    /// already combined (the master acts on all of a framework's offers on an agent at once):
    /// nothing ran, launch the task again on a later offer.
    fn status_update(
        &mut self,
        driver: &DriverHandle,
        update: &StatusUpdate,
    ) -> impl Future<Output = ()> + Send {
        let _ = (driver, update);
        async {}
    }
    /// The master rejected something this framework sent.
    fn error(
        &mut self,
        driver: &DriverHandle,
        kind: ErrorKind,
        message: &str,
    ) -> impl Future<Output = ()> + Send {
        let _ = (driver, kind, message);
        async {}
    }
    /// An agent this framework has tasks on is being drained for maintenance (Mesos inverse
    /// offers; see [`DrainNotice`]): move the tasks elsewhere before
    /// `notice.deadline_in_ms`, when the master kills what is left. The default does nothing
    /// (the tasks are killed at the deadline and reported `KILLED`). Sent again after a
    /// re-subscription while the drain lasts, so it may arrive more than once.
    fn drain_notice(
        &mut self,
        driver: &DriverHandle,
        notice: &DrainNotice,
    ) -> impl Future<Output = ()> + Send {
        let _ = (driver, notice);
        async {}
    }

    /// The answer to [`DriverHandle::destroy_volume`] (protocol v12): the volume is gone
    /// ([`VolumeOutcome::Destroyed`]), was not there, is in use by containers on the agent (nothing
    /// removed; try again once those tasks have ended), or the request failed. The default
    /// does nothing.
    fn volume_destroyed(
        &mut self,
        driver: &DriverHandle,
        result: &VolumeDestroyed,
    ) -> impl Future<Output = ()> + Send {
        let _ = (driver, result);
        async {}
    }

    /// An agent left the cluster for good (protocol v13; Mesos's `FAILURE` event): forget
    /// what the scheduler knows of it (its GPUs, plans that count on it). Sent to every
    /// subscribed framework; its tasks there get their own `LOST`/`GONE` updates. The default
    /// does nothing.
    fn agent_removed(
        &mut self,
        driver: &DriverHandle,
        removed: &AgentRemoved,
    ) -> impl Future<Output = ()> + Send {
        let _ = (driver, removed);
        async {}
    }

    /// Agents of the cluster, offered to this framework or not (protocol v14; only with
    /// [`Capability::AgentInventory`] in the subscription): every agent after each
    /// subscription, then each one again when it registers, re-registers or a GPU's health
    /// changes. A summary replaces any earlier one of
    /// the same agent; [`Scheduler::agent_removed`] says when one leaves. The default does
    /// nothing.
    fn agents(
        &mut self,
        driver: &DriverHandle,
        agents: &[AgentSummary],
    ) -> impl Future<Output = ()> + Send {
        let _ = (driver, agents);
        async {}
    }

    /// The connection to the master dropped; the driver is reconnecting.
    fn disconnected(&mut self, driver: &DriverHandle) -> impl Future<Output = ()> + Send {
        let _ = driver;
        async {}
    }

    /// A timer set with [`DriverHandle::after`] or [`DriverHandle::every`] came due, or the
    /// framework's own code called [`DriverHandle::notify`] (from any task: the handle is
    /// cheap to clone): `token` is the one given there. Delivered one at a time, in order with
    /// the master's messages and whether or not the driver is connected, so a retry back-off,
    /// a deadline or an event of the framework's own (a job submitted to its API) needs no
    /// lock and no ticker of its own.
    fn wake(&mut self, driver: &DriverHandle, token: u64) -> impl Future<Output = ()> + Send {
        let _ = (driver, token);
        async {}
    }
}

/// Errors that end a driver run.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(transparent)]
    /// The TLS directory has no usable material for this framework.
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    /// QUIC setup failed.
    Transport(#[from] quic::TransportError),
    #[error("no master address given")]
    /// The configuration names no master.
    NoMasters,
    #[error("could not reach a leading master for {0:?}")]
    /// No master could be reached for this long (`give_up_after`).
    Unreachable(Duration),
    #[error("the master refused the subscription: {0}")]
    /// The master refused the subscription.
    Refused(String),
}

/// A cheap, cloneable handle for acting on the master. Calls never block: they are queued and
/// sent in order by the driver.
#[derive(Clone)]
pub struct DriverHandle {
    tx: mpsc::UnboundedSender<Command>,
    framework_id: Arc<Mutex<Option<FrameworkId>>>,
    next_timer: Arc<AtomicU64>,
}

impl DriverHandle {
    fn send(&self, msg: FrameworkToMaster) {
        let _ = self.tx.send(Command::Send(msg));
    }
    /// The id the master gave this framework (after [`Scheduler::registered`]).
    pub fn framework_id(&self) -> Option<FrameworkId> {
        *self.framework_id.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Accept offers (all on one agent) with the given operations.
    pub fn accept(
        &self,
        offer_ids: Vec<OfferId>,
        operations: Vec<Operation>,
        refuse_seconds: Option<f64>,
    ) {
        self.send(FrameworkToMaster::Accept {
            offer_ids,
            operations,
            refuse_seconds,
        });
    }
    /// Launch tasks on one offer; its unused part goes back with the default filter. The master
    /// acts on all of this framework's offers on that agent at once (it may draw from the others
    /// too, and rescinds them): to launch on several offers of an agent, name them all in one
    /// [`DriverHandle::accept`].
    pub fn launch(&self, offer_id: OfferId, tasks: Vec<TaskInfo>) {
        self.accept(vec![offer_id], vec![Operation::Launch { tasks }], None);
    }
    /// Launch a task group atomically on the offers' agent (all on one agent): every member
    /// starts or none does ([`crate::group`]); the offers' unused part goes back with the
    /// default filter.
    pub fn launch_group(&self, offer_ids: Vec<OfferId>, group: TaskGroup) {
        self.accept(offer_ids, vec![Operation::LaunchGroup { group }], None);
    }
    /// Decline offers; `refuse_seconds` keeps the agent's resources away from us that long
    /// (master default when `None`).
    pub fn decline(&self, offer_ids: Vec<OfferId>, refuse_seconds: Option<f64>) {
        if !offer_ids.is_empty() {
            self.send(FrameworkToMaster::Decline {
                offer_ids,
                refuse_seconds,
            });
        }
    }
    /// Kill a task (SIGTERM, then SIGKILL after its grace period).
    pub fn kill(&self, task_id: TaskId) {
        self.send(FrameworkToMaster::Kill { task_id });
    }
    /// Kill a task and say why (`FrameworkToMaster::KillFor`, protocol v8): the task's
    /// `KILLED` update, `/state`, the operator API and the dashboard then carry this reason
    /// (`Preempted`, `TimeLimit` or `Deadline`) instead of `killed-by-request`. Retried like
    /// [`DriverHandle::kill`], with the same reason.
    pub fn kill_for(&self, task_id: TaskId, reason: TaskReason) {
        self.send(FrameworkToMaster::KillFor { task_id, reason });
    }
    /// Ask for the current state of these tasks (all of ours when empty). Sent as several
    /// messages of at most [`MAX_RECONCILE_IDS`] ids each (the master's bound).
    pub fn reconcile(&self, task_ids: Vec<TaskId>) {
        if task_ids.len() <= MAX_RECONCILE_IDS {
            return self.send(FrameworkToMaster::Reconcile { task_ids });
        }
        for chunk in task_ids.chunks(MAX_RECONCILE_IDS) {
            self.send(FrameworkToMaster::Reconcile {
                task_ids: chunk.to_vec(),
            });
        }
    }
    /// Stop offers for these roles (all when empty) until revived.
    pub fn suppress(&self, roles: Vec<String>) {
        self.send(FrameworkToMaster::Suppress { roles });
    }
    /// Resume offers for these roles (all when empty) and clear our filters.
    pub fn revive(&self, roles: Vec<String>) {
        self.send(FrameworkToMaster::Revive { roles });
    }
    /// Declare the shapes and numbers of pending tasks (demand-aware offers): one
    /// `Some(Demand)`, several (`vec![trials, gang]`, at most
    /// [`MAX_DEMAND_SHAPES`]), or none (`None`, an empty list) to clear it. The master offers
    /// tasks' worth of every shape still wanted.
    pub fn set_demand(&self, demands: impl IntoIterator<Item = Demand>) {
        self.send(FrameworkToMaster::SetDemand {
            demands: demands.into_iter().collect(),
        });
    }
    /// Calls [`Scheduler::wake`] with `token` once `delay` has passed (a retry back-off, a
    /// deadline). Returns an id for [`DriverHandle::cancel_timer`].
    pub fn after(&self, delay: Duration, token: u64) -> TimerId {
        self.timer(delay, token, None)
    }
    /// Calls [`Scheduler::wake`] with `token` every `period` (at least
    /// [`MIN_PERIOD`](crate::timers::MIN_PERIOD)), the first time one period from now. A
    /// driver that fell behind wakes once, not once per missed period.
    pub fn every(&self, period: Duration, token: u64) -> TimerId {
        self.timer(period, token, Some(period))
    }
    fn timer(&self, delay: Duration, token: u64, every: Option<Duration>) -> TimerId {
        let id = TimerId(self.next_timer.fetch_add(1, Ordering::Relaxed));
        let at = tokio::time::Instant::now() + delay;
        let _ = self.tx.send(Command::Timer {
            id,
            at,
            token,
            every,
        });
        id
    }
    /// Cancels a timer (nothing if it already fired).
    pub fn cancel_timer(&self, id: TimerId) {
        let _ = self.tx.send(Command::CancelTimer(id));
    }
    /// Delivers `token` to [`Scheduler::wake`], in order with everything else the scheduler
    /// hears: how the framework's own events (from its API, a file watcher, another task)
    /// reach the scheduler without sharing its state behind a lock.
    pub fn notify(&self, token: u64) {
        let _ = self.tx.send(Command::Notify(token));
    }
    /// Destroys this framework's persistent volume `name` (`Volume::persistent(name, ..)`)
    /// on `agent_id` and its data (protocol v12; docs/containers.md "Volumes"). The agent
    /// refuses while a container there mounts it. The answer comes to
    /// [`Scheduler::volume_destroyed`]; a request sent while disconnected is not retried.
    pub fn destroy_volume(&self, agent_id: AgentId, name: impl Into<String>) {
        self.send(FrameworkToMaster::DestroyVolume {
            agent_id,
            name: name.into(),
        });
    }
    /// Acknowledges a status update, under [`DriverConfig::explicit_acks`] (call it once what
    /// the update says is persisted; the master redelivers it until then, after a reconnect
    /// too). Without explicit acks the driver does this itself and this call is not needed.
    pub fn acknowledge(&self, update: &StatusUpdate) {
        if !update.reconciliation {
            self.send(FrameworkToMaster::Acknowledge {
                task_id: update.task_id,
                update_id: update.update_id,
            });
        }
    }
    /// Tear the framework down — the master kills every task of it and forgets it — and end
    /// [`Driver::run`]. To leave and come back (or let another driver take over), use
    /// [`DriverHandle::disconnect`].
    pub fn teardown(&self) {
        let _ = self.tx.send(Command::Stop { teardown: true });
    }
    /// [`DriverHandle::teardown`]: tears the framework down, killing its tasks.
    pub fn stop(&self) {
        self.teardown();
    }
    /// End [`Driver::run`] without tearing down: the master keeps our tasks for the failover
    /// timeout, so a new driver with the same framework id can take over.
    pub fn disconnect(&self) {
        let _ = self.tx.send(Command::Stop { teardown: false });
    }
}

/// Runs a [`Scheduler`] against the master. An async shell around the driver's decision logic
/// (`driver_core`, pure: dedup, acknowledgements, kill retries, reconciliation, timers), which
/// it gives every message, request and due time, and whose effects it carries out.
pub struct Driver {
    config: DriverConfig,
    handle: DriverHandle,
    rx: mpsc::UnboundedReceiver<Command>,
    /// Dedup, acknowledgements, kill retries, requests held while disconnected,
    /// reconciliation and timers.
    core: DriverCore,
}

/// How one connection ended.
enum SessionEnd {
    Stopped,
    Lost(String),
    /// A master with a higher epoch announced that it leads ([`Masters::next_session`]
    /// returns its session).
    NewLeader,
}

/// Messages from the master handled at most before the acknowledgements they call for are
/// written (as one write).
const READ_BATCH: usize = 256;

impl Driver {
    /// A driver for `config`; [`Driver::run`] starts it.
    pub fn new(config: DriverConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let framework_id = Arc::new(Mutex::new(config.info.framework_id));
        let core = DriverCore::new(config.info.clone(), config.explicit_acks, config.reconcile);
        Self {
            config,
            handle: DriverHandle {
                tx,
                framework_id,
                next_timer: Arc::new(AtomicU64::new(0)),
            },
            rx,
            core,
        }
    }

    /// A handle usable before and during [`Driver::run`].
    pub fn handle(&self) -> DriverHandle {
        self.handle.clone()
    }

    /// Connects, subscribes and serves the scheduler until [`DriverHandle::stop`] or
    /// [`DriverHandle::disconnect`] is called (or no master is reachable within `give_up_after`).
    pub async fn run<S: Scheduler>(mut self, mut scheduler: S) -> Result<(), DriverError> {
        if self.config.masters.is_empty() {
            return Err(DriverError::NoMasters);
        }
        let material = tls::load(
            &self.config.tls_dir,
            &PeerIdentity::Framework(self.config.principal.clone()),
        )?;
        let mut links = MastersConfig::new(
            self.config.masters.clone(),
            PeerKind::Framework,
            quic::client_config(&material)?,
        );
        links.backoff = self.config.backoff;
        let mut masters = Masters::start(links)?;
        let mut unreachable_since = tokio::time::Instant::now();
        loop {
            let Some(session) = self
                .wait_for_leader(&mut scheduler, &mut masters, unreachable_since)
                .await?
            else {
                return Ok(());
            };
            let (addr, conn) = (session.addr, session.conn.clone());
            tracing::info!(master = %addr, epoch = session.epoch, "connected to the leading master");
            let end = self
                .session(
                    &mut scheduler,
                    session,
                    &mut masters,
                    &mut unreachable_since,
                )
                .await;
            conn.close(0u32.into(), b"bye");
            match end? {
                SessionEnd::Stopped => {
                    masters.shutdown().await;
                    return Ok(());
                }
                SessionEnd::NewLeader => {
                    tracing::info!(old = %addr, "a new master leads; switching to it");
                }
                SessionEnd::Lost(reason) => tracing::warn!("master connection: {reason}"),
            }
            // Requests made while disconnected: stop is honoured now; offer replies are void
            // (the master rescinds a disconnected framework's offers); the rest is sent after
            // re-subscribing.
            while let Ok(cmd) = self.rx.try_recv() {
                if !self.while_disconnected(&mut scheduler, cmd).await {
                    masters.shutdown().await;
                    return Ok(());
                }
            }
        }
    }

    /// A request made while no session is up (`DriverCore::command` queues or drops what is
    /// for the master; timers and the framework's own events are served at once); false for
    /// a stop.
    async fn while_disconnected<S: Scheduler>(&mut self, scheduler: &mut S, cmd: Command) -> bool {
        let effects = self.core.command(cmd, tokio::time::Instant::now());
        let mut out = Vec::new();
        // Nothing is sent while disconnected: `out` stays empty.
        matches!(self.apply(scheduler, effects, &mut out).await, Ok(None))
    }

    /// The next session with a leading master ([`Masters::next_session`]), while honouring stop
    /// requests and `give_up_after`. `None`: stopped.
    async fn wait_for_leader<S: Scheduler>(
        &mut self,
        scheduler: &mut S,
        masters: &mut Masters,
        unreachable_since: tokio::time::Instant,
    ) -> Result<Option<LeaderSession>, DriverError> {
        let limit = self.config.give_up_after;
        let deadline = limit.map(|l| unreachable_since + l);
        loop {
            tokio::select! {
                s = masters.next_session() => return Ok(Some(s)),
                cmd = self.rx.recv() => match cmd {
                    Some(cmd) => if !self.while_disconnected(scheduler, cmd).await {
                        masters.shutdown().await;
                        return Ok(None);
                    },
                    // Every handle is gone, including ours: impossible while we hold one.
                    None => return Ok(None),
                },
                _ = sleep_until_opt(self.core.next_due()) => {
                    let effects = self.core.due(tokio::time::Instant::now());
                    let _ = self.apply(scheduler, effects, &mut Vec::new()).await;
                }
                _ = sleep_until_opt(deadline) => {
                    return Err(DriverError::Unreachable(limit.unwrap_or_default()));
                }
            }
        }
    }

    async fn session<S: Scheduler>(
        &mut self,
        scheduler: &mut S,
        session: LeaderSession,
        masters: &mut Masters,
        unreachable_since: &mut tokio::time::Instant,
    ) -> Result<SessionEnd, DriverError> {
        let LeaderSession { mut tx, rx, .. } = session;
        // Not subscribed until this connection's master says so.
        let _ = self.core.disconnected();
        let info = self.core.subscription(self.handle.framework_id());
        if let Err(e) = tx.send(&FrameworkToMaster::Subscribe(info)).await {
            return Ok(SessionEnd::Lost(e.to_string()));
        }
        // Frames are read in this task (a buffered, cancel-safe reader): no task and channel
        // between the stream and the callbacks. While a callback runs, what arrives waits in
        // the QUIC stream's receive window.
        let mut rx = FrameReader::from(rx);
        // The frames of one turn of the loop: the acknowledgements of a burst of messages and
        // the requests the scheduler made meanwhile go out in one write (QUIC packs them into
        // as few packets as fit; a write each may leave as a packet each).
        let mut out: Vec<u8> = Vec::new();
        loop {
            // `Some(teardown)`: the scheduler asked to stop (after what is queued before it).
            let mut stop: Option<bool> = None;
            tokio::select! {
                msg = rx.recv::<MasterToFramework>() => {
                    let mut next = Some(msg);
                    let mut handled = 0;
                    while let Some(msg) = next.take() {
                        let msg = match msg {
                            Ok(m) => m,
                            Err(e) => {
                                self.lost(scheduler).await;
                                return Ok(SessionEnd::Lost(e.to_string()));
                            }
                        };
                        if let MasterToFramework::Subscribed { framework_id, .. } = &msg {
                            *self.handle.framework_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(*framework_id);
                            *unreachable_since = tokio::time::Instant::now();
                        }
                        let effects = self.core.message(msg, tokio::time::Instant::now());
                        self.apply(scheduler, effects, &mut out).await?;
                        // What else has arrived is handled too before the acknowledgements go
                        // out (one packet for a burst of updates, not one per update).
                        handled += 1;
                        if handled < READ_BATCH {
                            next = rx.try_recv().transpose();
                        }
                    }
                }
                _ = sleep_until_opt(self.core.next_due()) => {
                    let effects = self.core.due(tokio::time::Instant::now());
                    stop = self.apply(scheduler, effects, &mut out).await?;
                }
                _ = masters.newer_leader() => {
                    self.lost(scheduler).await;
                    return Ok(SessionEnd::NewLeader);
                }
                cmd = self.rx.recv(), if self.core.is_subscribed() => match cmd {
                    Some(cmd) => {
                        let effects = self.core.command(cmd, tokio::time::Instant::now());
                        stop = self.apply(scheduler, effects, &mut out).await?;
                    }
                    // Every handle is gone, including ours: impossible while we hold one.
                    None => return Ok(SessionEnd::Stopped),
                },
            }
            // The requests made in the callbacks just run, or queued meanwhile, join this
            // write: an accept leaves with the acknowledgements of the updates before it,
            // not after another turn of the loop.
            while self.core.is_subscribed() && stop.is_none() && out.len() < WRITE_BATCH_BYTES {
                let Ok(cmd) = self.rx.try_recv() else { break };
                let effects = self.core.command(cmd, tokio::time::Instant::now());
                stop = self.apply(scheduler, effects, &mut out).await?;
            }
            if !out.is_empty() {
                if let Err(e) = tx.0.write_all(&out).await {
                    self.lost(scheduler).await;
                    return Ok(SessionEnd::Lost(e.to_string()));
                }
                out.clear();
            }
            if let Some(teardown) = stop {
                let _ = self.core.disconnected();
                if teardown {
                    let _ = tx.send(&FrameworkToMaster::Teardown).await;
                }
                let _ = tx.0.finish();
                let _ = tokio::time::timeout(Duration::from_secs(2), tx.0.stopped()).await;
                return Ok(SessionEnd::Stopped);
            }
        }
    }

    /// The connection is gone: the scheduler hears of it if it was subscribed.
    async fn lost<S: Scheduler>(&mut self, scheduler: &mut S) {
        let effects = self.core.disconnected();
        let _ = self.apply(scheduler, effects, &mut Vec::new()).await;
    }

    /// Carries out `effects` in order: frames into `out`, calls of the scheduler.
    /// `Some(teardown)` for a stop (nothing after it is carried out: it comes alone).
    async fn apply<S: Scheduler>(
        &mut self,
        scheduler: &mut S,
        effects: Vec<Effect>,
        out: &mut Vec<u8>,
    ) -> Result<Option<bool>, DriverError> {
        for effect in effects {
            match effect {
                Effect::Send(msg) => self.encode(scheduler, &msg, out).await,
                Effect::Deliver(event) => self.deliver(scheduler, event).await,
                Effect::Stop { teardown } => return Ok(Some(teardown)),
                Effect::Refused(message) => return Err(DriverError::Refused(message)),
            }
        }
        Ok(None)
    }

    /// Calls the scheduler.
    async fn deliver<S: Scheduler>(&self, scheduler: &mut S, event: Event) {
        let d = &self.handle;
        match event {
            Event::Registered(framework_id) => scheduler.registered(d, framework_id).await,
            Event::Offers(offers) => scheduler.offers(d, offers).await,
            Event::Rescinded(offer_id) => scheduler.offer_rescinded(d, offer_id).await,
            Event::Update(update) => scheduler.status_update(d, &update).await,
            Event::Error(kind, message) => scheduler.error(d, kind, &message).await,
            Event::Drain(notice) => scheduler.drain_notice(d, &notice).await,
            Event::Volume(v) => scheduler.volume_destroyed(d, &v).await,
            Event::AgentRemoved(a) => scheduler.agent_removed(d, &a).await,
            Event::Agents(a) => scheduler.agents(d, &a).await,
            Event::Disconnected => scheduler.disconnected(d).await,
            Event::Wake(token) => scheduler.wake(d, token).await,
        }
    }

    /// Appends `msg`'s frame to `out`. One too large to send (e.g. an accept launching
    /// thousands of tasks) leaves `out` as it was, and the scheduler hears why: the session
    /// is fine.
    async fn encode<S: Scheduler>(
        &self,
        scheduler: &mut S,
        msg: &FrameworkToMaster,
        out: &mut Vec<u8>,
    ) {
        if let Err(e) = encode_frame_into(out, msg) {
            tracing::warn!("message not sent to the master: {e}");
            let message = format!("not sent: {e}; split it into smaller messages");
            scheduler
                .error(&self.handle, ErrorKind::InvalidRequest, &message)
                .await;
        }
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
