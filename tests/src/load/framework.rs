//! An emulated framework on the SDK's [`Driver`](gantry_sdk::Driver) (the code path users
//! run): it accepts every offer with as many tasks of its shape as fit (up to a per-offer cap),
//! declines what it does not use with a filter (a longer one where not one task fits), and when the run stops launching (or its task
//! budget is spent) it declines everything and suppresses its offers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use gantry_sdk::protocol::*;
use gantry_sdk::DriverHandle;

use super::Shared;

/// Counters of one framework.
#[derive(Default)]
pub struct FrameworkCounters {
    pub offers: AtomicU64,
    pub declined: AtomicU64,
    /// Declined because not one task fitted.
    pub declined_unfit: AtomicU64,
    /// Tasks sent in accepts.
    pub launched: AtomicU64,
    pub running: AtomicU64,
    pub finished: AtomicU64,
    /// Terminal states other than FINISHED (LOST, FAILED, KILLED, ERROR).
    pub not_finished: AtomicU64,
    pub errors: AtomicU64,
    /// Tasks the master dropped (TASK_DROPPED: their accept named an offer an earlier accept or
    /// decline on the same agent had combined); they are taken back out of `launched`.
    pub dropped: AtomicU64,
    /// `UnknownOffer` answers to accepts/declines of such combined offers (not errors: the race
    /// the master resolves by dropping the accept's tasks).
    pub stale_offers: AtomicU64,
    /// Connections to the master lost (the driver re-subscribes).
    pub reconnects: AtomicU64,
}

impl FrameworkCounters {
    /// Tasks launched and not yet in a terminal state.
    pub fn in_flight(&self) -> u64 {
        self.launched
            .load(Relaxed)
            .saturating_sub(self.finished.load(Relaxed) + self.not_finished.load(Relaxed))
    }
}

/// Policy and shape of an emulated framework.
#[derive(Clone)]
pub struct FrameworkShape {
    pub task: Resources,
    pub max_tasks_per_offer: usize,
    /// Tasks this framework launches at most (`None`: until the run stops launching).
    pub budget: Option<u64>,
    /// Filter on the unused part of an accepted offer (and on declines once launching
    /// stopped), seconds.
    pub refuse_seconds: f64,
    /// Filter on an offer where not one task fits, seconds. A filter refuses only offers
    /// within what it refused, so freed GPUs on the agent are offered again at once.
    pub decline_seconds: f64,
    /// Tasks declared as demand (0: none).
    pub demand: u32,
}

pub struct LoadFramework {
    pub idx: usize,
    pub shape: FrameworkShape,
    pub shared: Arc<Shared>,
    pub counters: Arc<FrameworkCounters>,
    /// When each launched task's accept was handed to the driver.
    accepted: HashMap<TaskId, Instant>,
    suppressed: bool,
    /// The driver lost its connection since the last subscription.
    lost: bool,
}

impl LoadFramework {
    pub fn new(
        idx: usize,
        shape: FrameworkShape,
        shared: Arc<Shared>,
        counters: Arc<FrameworkCounters>,
    ) -> Self {
        Self {
            idx,
            shape,
            shared,
            counters,
            accepted: HashMap::new(),
            suppressed: false,
            lost: false,
        }
    }

    fn task(&self) -> TaskInfo {
        TaskInfo {
            task_id: TaskId::random(),
            name: format!("load-{}", self.idx),
            command: "true".into(),
            resources: self.shape.task.clone(),
            env: Default::default(),
            kill_grace_secs: None,
            gpu_selector: None,
        }
    }
}

impl gantry_sdk::Scheduler for LoadFramework {
    async fn registered(&mut self, driver: &DriverHandle, _framework_id: FrameworkId) {
        // After a lost connection: accepts made while disconnected were dropped by the driver
        // and updates may have been missed. Ask for every task we wait on; unknown ones come
        // back LOST.
        if std::mem::take(&mut self.lost) && !self.accepted.is_empty() {
            driver.reconcile(self.accepted.keys().copied().collect());
        }
        if self.suppressed {
            driver.suppress(Vec::new());
        } else if self.shape.demand > 0 {
            driver.set_demand(Some(Demand {
                task: self.shape.task.clone(),
                count: self.shape.demand,
            }));
        }
    }

    async fn disconnected(&mut self, _driver: &DriverHandle) {
        self.lost = true;
        self.counters.reconnects.fetch_add(1, Relaxed);
    }

    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        let now = Instant::now();
        self.counters.offers.fetch_add(offers.len() as u64, Relaxed);
        for offer in &offers {
            if let Some(idx) = super::agent::index_of(&offer.hostname) {
                self.shared.offered(idx, now);
            }
        }
        let launching = !self.shared.stop.load(Relaxed);
        let mut declined = Vec::new();
        let mut useless = Vec::new();
        // One accept per agent and role naming all our offers there: the master acts on all of
        // a framework's offers on an agent at once (docs/allocator.md, rule 2).
        let groups = gantry_sdk::placement::offers::group_offers(&offers);
        for g in groups {
            let (ids, mut avail) = (g.offer_ids, g.resources);
            let budget = self.shape.budget.map_or(u64::MAX, |b| {
                b.saturating_sub(self.counters.launched.load(Relaxed))
            });
            let mut fit = 0usize;
            while launching
                && fit < self.shape.max_tasks_per_offer * ids.len()
                && (fit as u64) < budget
                && avail.checked_sub_assign(&self.shape.task).is_some()
            {
                fit += 1;
            }
            if launching && fit == 0 {
                useless.extend(ids);
                continue;
            }
            if let Some(bucket) = &self.shared.bucket {
                fit = bucket.take(fit);
            }
            let tasks: Vec<TaskInfo> = (0..fit).map(|_| self.task()).collect();
            if tasks.is_empty() {
                declined.extend(ids);
                continue;
            }
            self.counters
                .launched
                .fetch_add(tasks.len() as u64, Relaxed);
            for t in &tasks {
                self.accepted.insert(t.task_id, now);
            }
            driver.accept(
                ids,
                vec![Operation::Launch { tasks }],
                Some(self.shape.refuse_seconds),
            );
        }
        for (ids, filter, unfit) in [
            (declined, self.shape.refuse_seconds, false),
            (useless, self.shape.decline_seconds, true),
        ] {
            if !ids.is_empty() {
                self.counters.declined.fetch_add(ids.len() as u64, Relaxed);
                if unfit {
                    self.counters
                        .declined_unfit
                        .fetch_add(ids.len() as u64, Relaxed);
                }
                driver.decline(ids, Some(filter));
            }
        }
        let spent = self
            .shape
            .budget
            .is_some_and(|b| self.counters.launched.load(Relaxed) >= b);
        if (!launching || spent) && !self.suppressed {
            self.suppressed = true;
            driver.suppress(Vec::new());
        }
    }

    async fn status_update(&mut self, _driver: &DriverHandle, update: &StatusUpdate) {
        let id = update.task_id;
        let state = update.state;
        if state == TaskState::Running && !update.reconciliation {
            if let Some(t) = self.accepted.get(&id) {
                self.shared.accept_to_running.record(t.elapsed());
                self.counters.running.fetch_add(1, Relaxed);
                self.shared.running_total.fetch_add(1, Relaxed);
            }
        } else if state.is_terminal() && self.accepted.remove(&id).is_some() {
            if state == TaskState::Dropped {
                // Never launched: out of `launched` again.
                self.counters.dropped.fetch_add(1, Relaxed);
                self.counters.launched.fetch_sub(1, Relaxed);
            } else if state == TaskState::Finished {
                self.counters.finished.fetch_add(1, Relaxed);
            } else {
                self.counters.not_finished.fetch_add(1, Relaxed);
                tracing::warn!(framework = self.idx, task = %id, %state, "{}", update.message);
            }
        }
    }

    async fn error(&mut self, _driver: &DriverHandle, kind: ErrorKind, message: &str) {
        if kind == ErrorKind::UnknownOffer {
            self.counters.stale_offers.fetch_add(1, Relaxed);
            return;
        }
        self.counters.errors.fetch_add(1, Relaxed);
        tracing::warn!(framework = self.idx, ?kind, "master: {message}");
    }
}
