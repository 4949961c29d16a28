//! The shell around [`Core`]: the [`Scheduler`] the driver calls, a ticker for time-driven
//! decisions (hold timeouts, aging, statistics), and [`Shared`], the state the HTTP API uses.
//! Every event locks the core, hands it the event and the time, and performs the returned
//! [`Action`]s with the driver handle.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gantry_sdk::protocol::*;
use gantry_sdk::{DriverHandle, Scheduler};

use super::core::{Action, Core};

/// The core and the driver handle, shared by the scheduler, the ticker and the HTTP API.
pub struct Shared {
    core: Mutex<Core>,
    driver: DriverHandle,
}

impl Shared {
    /// Wraps `core`; actions go to `driver`.
    pub fn new(core: Core, driver: DriverHandle) -> Arc<Self> {
        Arc::new(Shared {
            core: Mutex::new(core),
            driver,
        })
    }

    /// The core, locked (a poisoned lock is taken over: the core has no invariants a panic
    /// mid-update would break that the next pass does not repair).
    pub fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the core and performs the actions it returns.
    ///
    /// The actions are sent while the core is still locked: the driver's calls only queue
    /// messages, and sending outside the lock let two callers (an HTTP submission and an
    /// offer event) send in the other order than the core decided, e.g. a `Revive` overtaken
    /// by an older `Suppress`, leaving the framework suppressed with work waiting.
    pub fn with<R>(&self, f: impl FnOnce(&mut Core, Instant) -> (R, Vec<Action>)) -> R {
        let mut core = self.core();
        let (r, actions) = f(&mut core, Instant::now());
        self.perform(actions);
        drop(core);
        r
    }

    fn perform(&self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Launch { offers, tasks } => {
                    for t in &tasks {
                        tracing::info!(task = %t.name, id = %t.task_id, "launching");
                    }
                    self.driver
                        .accept(offers, vec![Operation::Launch { tasks }], Some(0.0));
                }
                Action::Decline(offers, secs) => self.driver.decline(offers, Some(secs)),
                Action::Kill(task) => self.driver.kill(task),
                Action::Revive => self.driver.revive(vec![]),
                Action::Suppress => self.driver.suppress(vec![]),
            }
        }
    }

    /// Ticks the core every `period` until the process ends.
    pub fn spawn_ticker(self: &Arc<Self>, period: Duration) -> tokio::task::JoinHandle<()> {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(period);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                me.with(|core, now| ((), core.tick(now)));
            }
        })
    }
}

/// The scheduler the driver runs.
pub struct QueueScheduler {
    shared: Arc<Shared>,
}

impl QueueScheduler {
    /// A scheduler over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        QueueScheduler { shared }
    }
}

impl Scheduler for QueueScheduler {
    async fn registered(&mut self, driver: &DriverHandle, framework_id: FrameworkId) {
        tracing::info!(%framework_id, "registered");
        driver.revive(vec![]);
        let ids = self.shared.core().task_ids();
        if !ids.is_empty() {
            driver.reconcile(ids);
        }
    }

    async fn offers(&mut self, _driver: &DriverHandle, offers: Vec<Offer>) {
        self.shared.with(|core, now| ((), core.offers(offers, now)));
    }

    async fn offer_rescinded(&mut self, _driver: &DriverHandle, offer_id: OfferId) {
        self.shared.core().rescinded(offer_id);
    }

    async fn status_update(&mut self, _driver: &DriverHandle, update: &StatusUpdate) {
        tracing::info!(task = %update.task_id, state = %update.state, "{}", update.message);
        self.shared.with(|core, now| ((), core.update(update, now)));
    }

    async fn error(&mut self, _driver: &DriverHandle, kind: ErrorKind, message: &str) {
        tracing::warn!(?kind, "master error: {message}");
    }

    async fn disconnected(&mut self, _driver: &DriverHandle) {
        self.shared.core().disconnected();
    }
}
