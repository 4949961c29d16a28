//! Leadership: who may act as the master, with which epoch and which write fence.
//!
//! One interface, two modes, so the server has a single code path:
//!
//! - **Standalone** (no etcd): always the leader, epoch 1, [`Fence::Standalone`], registry in the
//!   work dir ([`crate::registry::FileStore`]).
//! - **etcd**: campaigns with etcd's election API on a lease ([`etcd`]); steps down on its own
//!   before the lease can expire on the server when keep-alives stop succeeding; the epoch is the
//!   create revision of the leader key; registry writes are fenced by that key
//!   ([`crate::registry::EtcdStore`]).
//!
//! Both report [`LeadershipEvent`]s on a channel ([`Election::next_event`]) and keep a
//! [`LeadershipStatus`] snapshot ([`Election::status`], [`Election::watch_status`]) that the HTTP
//! `/health` handler and the peer admission logic read ([`health`]).
//!
//! How the server uses it: on `Elected { epoch, fence }` install the fence in the registry store,
//! load the registry, then serve (offers, launches) with `epoch` in `Registered`/`Subscribed`; on
//! `Lost` stop offering and accepting at once, clear the fence, drop sessions (or turn standby);
//! on `LeaderChanged` tell parked peers (when: [`health::Parked`]). `LeaderChanged` never names
//! this master (its own key seen before `Elected`, or a previous incarnation's, reads as no
//! leader): only `Elected` makes a master the leader, in its status and its log. The lease
//! deadline ([`LeadershipStatus::lease_valid_until`]) goes to the master core as an input
//! ([`health::lease_until_ms`] → `state::Input::LeaseUntil`): the core makes no offer and
//! launches no task from then on, even if the `Lost` event has not been processed yet
//! ([`LeadershipStatus::leads_at`] answers the same question for the shell).
//!
//! Wiring sketch (one code path for both modes):
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use gantry_master::election::{self, health, EtcdElectionConfig, HaConfig, LeadershipEvent};
//!
//! async fn serve(
//!     etcd: Option<String>,     // --etcd URL[,URL...]
//!     advertise: String,        // --advertise ADDR
//!     lease_ttl_secs: u64,      // --lease-ttl (default 3)
//!     work_dir: std::path::PathBuf,
//! ) -> anyhow::Result<()> {
//!     let ha = match etcd {
//!         None => HaConfig::Standalone { work_dir, advertise },
//!         Some(list) => {
//!             let endpoints = EtcdElectionConfig::parse_endpoints(&list)?;
//!             let mut cfg = EtcdElectionConfig::new(endpoints, advertise);
//!             cfg.lease_ttl = Duration::from_secs(lease_ttl_secs);
//!             HaConfig::Etcd(cfg)
//!         }
//!     };
//!     let (mut election, store) = election::start(ha).await?;
//!     let status = election.watch_status();
//!     // HTTP: GET /health -> Json(health::health(&status.borrow(), Instant::now()))
//!     // Peer connects -> match health::admission(&status.borrow(), Instant::now()) {
//!     //     Admission::Serve { epoch } => register, answer with `epoch`,
//!     //     Admission::Standby { leader } => send MasterRole::Standby { leader }, park }
//!     while let Some(event) = election.next_event().await {
//!         match event {
//!             LeadershipEvent::Elected { epoch, fence, .. } => {
//!                 store.set_fence(fence);
//!                 let registry = store.load().await?; // recover before serving
//!                 let _ = (epoch, registry); // hand both to the core loop, then serve
//!             }
//!             LeadershipEvent::Lost { reason, .. } => {
//!                 store.clear_fence();
//!                 let _ = reason; // core: stop offers/launches, close sessions
//!             }
//!             LeadershipEvent::LeaderChanged { .. } => {} // `status` already has it
//!         }
//!     }
//!     Ok(())
//! }
//! ```

pub mod etcd;
pub mod health;
pub mod lease;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

pub use crate::registry::Fence;
use crate::registry::{EtcdStore, FileStore, RegistryError, RegistryStore};

pub use self::etcd::{EtcdElectionConfig, LeaderWatch};

/// What the election reports to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeadershipEvent {
    /// This master is now the leader: recover the registry, then serve with this epoch.
    Elected {
        /// Strictly greater than every earlier leader's epoch (etcd: leader key create revision).
        epoch: u64,
        fence: Fence,
        /// When leadership was confirmed.
        at: Instant,
    },
    /// This master must stop acting as leader now (emitted before etcd can elect another one).
    Lost {
        reason: String,
        /// When this master stopped being leader.
        at: Instant,
    },
    /// The leader as seen in etcd changed (its advertised address; `None`: no leader right now).
    LeaderChanged { leader: Option<String> },
}

/// A snapshot of this master's view of leadership.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct LeadershipStatus {
    /// Whether this master is the leader right now.
    pub is_leader: bool,
    /// This master's epoch while it leads.
    pub epoch: Option<u64>,
    /// The current leader's advertised address, if known (this master's own while it leads).
    pub leader: Option<String>,
    /// This master's own advertised address.
    pub advertise: String,
    /// etcd mode: the local lease deadline (see [`lease`]). Past it this master must not act as
    /// leader even if the election task has not run yet to emit `Lost` (a starved runtime).
    #[serde(skip)]
    pub lease_valid_until: Option<Instant>,
}

impl LeadershipStatus {
    /// Whether this master may act as leader at `now`: elected, and (etcd) its lease deadline not
    /// passed. Check this before every offer and every launch.
    pub fn leads_at(&self, now: Instant) -> bool {
        if !self.is_leader {
            return false;
        }
        match self.lease_valid_until {
            Some(deadline) => now < deadline,
            None => true,
        }
    }
}

/// Why an election could not be started or ended cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error("invalid HA configuration: {0}")]
    Config(String),
    #[error("etcd: {0}")]
    Etcd(String),
    #[error("registry: {0}")]
    Registry(#[from] RegistryError),
    #[error("resigning did not finish within {0:?}")]
    ResignTimeout(Duration),
}

impl From<etcd_client::Error> for ElectionError {
    fn from(e: etcd_client::Error) -> Self {
        ElectionError::Etcd(e.to_string())
    }
}

/// Where events and status go; shared by the campaign and observer tasks.
#[derive(Clone)]
pub(crate) struct Sink {
    events: mpsc::UnboundedSender<LeadershipEvent>,
    status: watch::Sender<LeadershipStatus>,
    /// The leader last seen by the observer (reported once this master stops leading).
    observed: Arc<Mutex<Option<String>>>,
}

impl Sink {
    fn observed(&self) -> Option<String> {
        self.observed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn elected(&self, epoch: u64, fence: Fence) {
        let advertise = self.status.borrow().advertise.clone();
        self.status.send_modify(|s| {
            s.is_leader = true;
            s.epoch = Some(epoch);
            s.leader = Some(advertise.clone());
        });
        let _ = self.events.send(LeadershipEvent::Elected {
            epoch,
            fence,
            at: Instant::now(),
        });
    }

    /// A keep-alive succeeded: the lease is valid locally until `deadline`.
    pub(crate) fn renewed(&self, deadline: Instant) {
        self.status.send_if_modified(|s| {
            if s.lease_valid_until.is_some_and(|d| d >= deadline) {
                return false;
            }
            s.lease_valid_until = Some(deadline);
            true
        });
    }

    /// A new term starts: forget the previous lease's deadline.
    pub(crate) fn new_lease(&self, deadline: Instant) {
        self.status
            .send_modify(|s| s.lease_valid_until = Some(deadline));
    }

    pub(crate) fn lost(&self, reason: String) {
        let at = Instant::now();
        let observed = self.observed();
        let mut leader_now = None;
        self.status.send_modify(|s| {
            s.is_leader = false;
            s.epoch = None;
            // Our own key may still be visible until etcd deletes it: we are not the leader.
            s.leader = observed.clone().filter(|l| *l != s.advertise);
            leader_now = s.leader.clone();
        });
        let _ = self.events.send(LeadershipEvent::Lost { reason, at });
        let _ = self
            .events
            .send(LeadershipEvent::LeaderChanged { leader: leader_now });
    }

    pub(crate) fn leader_changed(&self, leader: Option<String>) {
        *self.observed.lock().unwrap_or_else(|p| p.into_inner()) = leader.clone();
        let mut told = None;
        self.status.send_if_modified(|s| {
            // While leading, this master is the leader whatever a lagging observation says.
            if s.is_leader {
                return false;
            }
            // Never named while not leading: a key with our address is a previous
            // incarnation's (about to be revoked) or this term's before its win is verified;
            // only `elected` makes this master the leader.
            let leader = leader.clone().filter(|l| *l != s.advertise);
            if s.leader == leader {
                return false;
            }
            s.leader = leader.clone();
            told = Some(leader);
            true
        });
        if let Some(leader) = told {
            let _ = self.events.send(LeadershipEvent::LeaderChanged { leader });
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.events.is_closed()
    }
}

/// A running election (standalone or etcd). Dropping it without [`Election::resign`] aborts its
/// tasks; an etcd lease then simply expires after its TTL.
pub struct Election {
    events: mpsc::UnboundedReceiver<LeadershipEvent>,
    status: watch::Receiver<LeadershipStatus>,
    resign: Option<oneshot::Sender<()>>,
    /// Kept so a standalone election can report `Lost` on resign (None in etcd mode, so the
    /// event channel closes once the etcd tasks end).
    sink: Option<Sink>,
    tasks: Vec<JoinHandle<()>>,
    mode: Mode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Standalone,
    Etcd,
}

fn channels(
    advertise: String,
) -> (
    Sink,
    mpsc::UnboundedReceiver<LeadershipEvent>,
    watch::Receiver<LeadershipStatus>,
) {
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let (status_tx, status_rx) = watch::channel(LeadershipStatus {
        advertise,
        ..LeadershipStatus::default()
    });
    (
        Sink {
            events: events_tx,
            status: status_tx,
            observed: Arc::new(Mutex::new(None)),
        },
        events_rx,
        status_rx,
    )
}

impl Election {
    /// The trivial election of a standalone master: leader at once with epoch 1.
    pub fn standalone(advertise: impl Into<String>) -> Election {
        let advertise = advertise.into();
        let (sink, events, status) = channels(advertise.clone());
        sink.elected(1, Fence::Standalone);
        let _ = sink.events.send(LeadershipEvent::LeaderChanged {
            leader: Some(advertise),
        });
        Election {
            events,
            status,
            resign: None,
            sink: Some(sink),
            tasks: Vec::new(),
            mode: Mode::Standalone,
        }
    }

    /// Starts campaigning in etcd (and observing the election) in background tasks. Returns at
    /// once; connection problems are retried in the background, never fatal.
    pub fn etcd(config: EtcdElectionConfig) -> Result<Election, ElectionError> {
        config.validate()?;
        let (sink, events, status) = channels(config.advertise.clone());
        let (resign_tx, resign_rx) = oneshot::channel();
        let campaign = tokio::spawn(etcd::run_campaign(config.clone(), sink.clone(), resign_rx));
        let observer = tokio::spawn(etcd::run_observer(config, sink.clone()));
        Ok(Election {
            events,
            status,
            resign: Some(resign_tx),
            sink: None,
            tasks: vec![campaign, observer],
            mode: Mode::Etcd,
        })
    }

    /// The next leadership event; `None` once the election has ended.
    pub async fn next_event(&mut self) -> Option<LeadershipEvent> {
        self.events.recv().await
    }

    /// The current leadership view.
    pub fn status(&self) -> LeadershipStatus {
        self.status.borrow().clone()
    }

    /// A receiver for the leadership view (for HTTP handlers and sessions).
    pub fn watch_status(&self) -> watch::Receiver<LeadershipStatus> {
        self.status.clone()
    }

    /// Whether this master may act as leader right now (cheap; check it before every offer or
    /// launch). Also false once the lease deadline passed, even before `Lost` was processed.
    pub fn is_leader(&self) -> bool {
        self.status.borrow().leads_at(Instant::now())
    }

    /// Gives up leadership cleanly (etcd: emit `Lost`, resign and revoke the lease so a standby
    /// takes over at once instead of after the TTL) and stops the election. Between terms (after
    /// a `Lost`, etcd unreachable) the last term's lease is revoked as soon as etcd answers
    /// again, retried until then: etcd restores a lease with a full TTL when it comes back, and
    /// this master's old key would hold the election up that long. Waits at most `timeout`. Events emitted meanwhile (the final `Lost`) can still be read with
    /// [`Election::next_event`], which then returns `None`.
    pub async fn resign(&mut self, timeout: Duration) -> Result<(), ElectionError> {
        match self.mode {
            Mode::Standalone => {
                if let Some(sink) = self.sink.take() {
                    if self.status.borrow().is_leader {
                        sink.lost("resigned".into());
                    }
                }
                Ok(())
            }
            Mode::Etcd => {
                if let Some(tx) = self.resign.take() {
                    let _ = tx.send(());
                }
                let mut tasks = std::mem::take(&mut self.tasks);
                if tasks.is_empty() {
                    return Ok(());
                }
                let campaign = tasks.remove(0);
                for t in &tasks {
                    t.abort();
                }
                match tokio::time::timeout(timeout, campaign).await {
                    Ok(_) => Ok(()),
                    Err(_) => Err(ElectionError::ResignTimeout(timeout)),
                }
            }
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// How the master runs: standalone (the embedded default) or HA with etcd.
#[derive(Debug, Clone)]
pub enum HaConfig {
    /// No etcd: always leader, registry in `work_dir`.
    Standalone {
        work_dir: PathBuf,
        advertise: String,
    },
    /// etcd election and etcd registry.
    Etcd(EtcdElectionConfig),
}

/// Starts the election and opens the matching registry store: the single entry point the server
/// needs for both modes.
pub async fn start(config: HaConfig) -> Result<(Election, RegistryStore), ElectionError> {
    match config {
        HaConfig::Standalone {
            work_dir,
            advertise,
        } => {
            let store = tokio::task::spawn_blocking(move || FileStore::open(work_dir))
                .await
                .map_err(|e| ElectionError::Config(format!("opening the registry: {e}")))??;
            Ok((Election::standalone(advertise), RegistryStore::File(store)))
        }
        HaConfig::Etcd(cfg) => {
            cfg.validate()?;
            let store =
                EtcdStore::connect(&cfg.endpoints, &cfg.prefix, cfg.request_timeout).await?;
            Ok((Election::etcd(cfg)?, RegistryStore::Etcd(store)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn standalone_is_leader_at_once_with_epoch_one() {
        let mut e = Election::standalone("127.0.0.1:5050");
        match e.next_event().await {
            Some(LeadershipEvent::Elected { epoch, fence, .. }) => {
                assert_eq!(epoch, 1);
                assert_eq!(fence, Fence::Standalone);
            }
            other => panic!("expected Elected, got {other:?}"),
        }
        assert_eq!(
            e.next_event().await,
            Some(LeadershipEvent::LeaderChanged {
                leader: Some("127.0.0.1:5050".into())
            })
        );
        let st = e.status();
        assert!(st.is_leader);
        assert_eq!(st.epoch, Some(1));
        assert_eq!(st.leader.as_deref(), Some("127.0.0.1:5050"));
        let mut w = e.watch_status();
        e.resign(Duration::from_secs(1)).await.unwrap();
        assert!(!w.borrow_and_update().is_leader);
        assert!(matches!(
            e.next_event().await,
            Some(LeadershipEvent::Lost { .. })
        ));
        assert_eq!(
            e.next_event().await,
            Some(LeadershipEvent::LeaderChanged { leader: None })
        );
        assert_eq!(e.next_event().await, None);
    }

    #[tokio::test]
    async fn start_standalone_opens_the_work_dir_registry() {
        let dir = tempfile::tempdir().unwrap();
        let (mut election, store) = start(HaConfig::Standalone {
            work_dir: dir.path().to_path_buf(),
            advertise: "m1:5050".into(),
        })
        .await
        .unwrap();
        let Some(LeadershipEvent::Elected { fence, .. }) = election.next_event().await else {
            panic!("not elected");
        };
        store.set_fence(fence);
        store.set_weight("prod", 3.0).await.unwrap();
        assert_eq!(store.load().await.unwrap().weights["prod"], 3.0);
        assert!(matches!(store, RegistryStore::File(_)));
    }
}
