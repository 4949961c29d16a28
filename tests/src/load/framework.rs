//! An emulated framework on the SDK's [`Driver`](gantry_sdk::Driver) (the code path users
//! run), in one of two modes:
//!
//! - **saturating** (no `--rate`): it accepts every offer with as many tasks of its shape as fit
//!   (up to a per-offer cap) and declines what it does not use with a filter (a longer one where
//!   not one task fits);
//! - **arrivals** (`--rate`): tasks arrive in its [`Queue`] (the harness's arrival ticker puts
//!   them there) and it declares them as its demand (demand-aware offers); it launches queued
//!   tasks on the offers that come, oldest first, and lowers its demand when its queue is
//!   shorter than what it declared.
//!
//! Before the run opens (every framework subscribed) and once it stops launching (or its task
//! budget is spent) it declines everything and suppresses its offers.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
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
    /// Tasks arrive in a queue and are declared as demand (the `--rate` mode); otherwise the
    /// framework launches on every offer.
    pub arrivals: bool,
}

/// Tasks that arrived for a framework and wait for an offer (the `--rate` mode), shared by the
/// harness's arrival ticker and the framework's scheduler.
#[derive(Default)]
pub struct Queue {
    /// When each waiting task was declared to the master, oldest first.
    waiting: VecDeque<Instant>,
    /// The count the master holds for this framework's demand: the last one declared, less
    /// the tasks accepted since (the master lowers it by what an accept launches).
    declared: u64,
}

impl Queue {
    /// Locks a queue (a poisoned lock still holds a usable queue).
    pub fn lock(q: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
        q.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tasks waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// `n` tasks arrived at `at`.
    pub fn arrive(&mut self, n: usize, at: Instant) {
        self.waiting.extend(std::iter::repeat_n(at, n));
    }

    /// Declares the queue as demand of `task`s where the master's count differs from it.
    pub fn declare(&mut self, driver: &DriverHandle, task: &Resources) {
        let n = self.waiting.len() as u64;
        if n != self.declared {
            self.declared = n;
            driver.set_demand(Some(Demand {
                task: task.clone(),
                count: u32::try_from(n).unwrap_or(u32::MAX),
                gpu_model: None,
            }));
        }
    }
}

/// Where the run is, as a framework sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Not every framework has subscribed yet.
    Waiting,
    Launching,
    Stopped,
}

pub struct LoadFramework {
    pub idx: usize,
    pub shape: FrameworkShape,
    pub shared: Arc<Shared>,
    pub counters: Arc<FrameworkCounters>,
    /// When each launched task's accept was handed to the driver.
    accepted: HashMap<TaskId, Instant>,
    /// The tasks waiting for offers (the `--rate` mode).
    pub queue: Arc<Mutex<Queue>>,
    /// The phase in which offers were last suppressed.
    suppressed_in: Option<Phase>,
    /// The driver lost its connection since the last subscription.
    lost: bool,
    /// Counted in `Shared::frameworks_registered`.
    registered_once: bool,
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
            queue: Arc::default(),
            suppressed_in: None,
            lost: false,
            registered_once: false,
        }
    }

    fn phase(&self) -> Phase {
        if self.shared.stop.load(Relaxed) || self.spent() {
            Phase::Stopped
        } else if self.shared.open.load(Relaxed) {
            Phase::Launching
        } else {
            Phase::Waiting
        }
    }

    /// The task budget is spent.
    fn spent(&self) -> bool {
        self.shape
            .budget
            .is_some_and(|b| self.counters.launched.load(Relaxed) >= b)
    }

    /// Suppresses offers once per phase in which nothing is launched.
    fn suppress_unless_launching(&mut self, driver: &DriverHandle) {
        let phase = self.phase();
        if phase != Phase::Launching && self.suppressed_in != Some(phase) {
            self.suppressed_in = Some(phase);
            driver.suppress(Vec::new());
        }
    }

    /// Declares the queue as demand where the master's count differs from it.
    fn task(&self) -> TaskInfo {
        TaskInfo {
            task_id: TaskId::random(),
            name: format!("load-{}", self.idx),
            command: "true".into(),
            resources: self.shape.task.clone(),
            env: Default::default(),
            kill_grace_secs: None,
            gpu_selector: None,
            container: None,
        }
    }
}

impl gantry_sdk::Scheduler for LoadFramework {
    async fn registered(&mut self, driver: &DriverHandle, _framework_id: FrameworkId) {
        if !std::mem::replace(&mut self.registered_once, true) {
            self.shared.frameworks_registered.fetch_add(1, Relaxed);
        }
        // After a lost connection: accepts made while disconnected were dropped by the driver
        // and updates may have been missed. Ask for every task we wait on; unknown ones come
        // back LOST.
        if std::mem::take(&mut self.lost) && !self.accepted.is_empty() {
            driver.reconcile(self.accepted.keys().copied().collect());
        }
        if self.shape.arrivals {
            // Declared even when the queue is empty: a framework with no demand declared is
            // offered everything.
            let mut q = Queue::lock(&self.queue);
            q.declared = q.waiting.len() as u64;
            driver.set_demand(Some(Demand {
                task: self.shape.task.clone(),
                count: u32::try_from(q.declared).unwrap_or(u32::MAX),
                gpu_model: None,
            }));
        }
        self.suppressed_in = None;
        self.suppress_unless_launching(driver);
    }

    async fn disconnected(&mut self, _driver: &DriverHandle) {
        self.lost = true;
        self.counters.reconnects.fetch_add(1, Relaxed);
    }

    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        let now = Instant::now();
        self.counters.offers.fetch_add(offers.len() as u64, Relaxed);
        if !self.shape.arrivals {
            for offer in &offers {
                if let Some(idx) = super::agent::index_of(&offer.hostname) {
                    self.shared.offered(idx, now);
                }
            }
        }
        let launching = self.phase() == Phase::Launching;
        let queue = self.queue.clone();
        let mut q = Queue::lock(&queue);
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
            let waiting = if self.shape.arrivals {
                q.waiting.len()
            } else {
                usize::MAX
            };
            let mut fit = 0usize;
            while launching
                && fit < self.shape.max_tasks_per_offer * ids.len()
                && (fit as u64) < budget
                && fit < waiting
                && avail.checked_sub_assign(&self.shape.task).is_some()
            {
                fit += 1;
            }
            if launching && fit == 0 && waiting > 0 {
                useless.extend(ids);
                continue;
            }
            if fit == 0 {
                declined.extend(ids);
                continue;
            }
            if self.shape.arrivals {
                // The oldest waiting tasks go; the master lowers its count by what launches.
                for declared_at in q.waiting.drain(..fit) {
                    self.shared
                        .offer_latency
                        .record(now.saturating_duration_since(declared_at));
                }
                q.declared = q.declared.saturating_sub(fit as u64);
            }
            let tasks: Vec<TaskInfo> = (0..fit).map(|_| self.task()).collect();
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
        if self.shape.arrivals && launching {
            // Offered more than waits (a task arrived and left between declarations): the
            // master's count comes down to the queue.
            q.declare(driver, &self.shape.task);
        }
        drop(q);
        self.suppress_unless_launching(driver);
    }

    async fn status_update(&mut self, driver: &DriverHandle, update: &StatusUpdate) {
        let id = update.task_id;
        let state = update.state;
        if state == TaskState::Staging && !update.reconciliation {
            if let Some(t) = self.accepted.get(&id) {
                self.shared.accept_to_staging.record(t.elapsed());
            }
        } else if state == TaskState::Running && !update.reconciliation {
            if let Some(t) = self.accepted.get(&id) {
                self.shared.accept_to_running.record(t.elapsed());
                self.counters.running.fetch_add(1, Relaxed);
                self.shared.running_total.fetch_add(1, Relaxed);
            }
        } else if state.is_terminal() && self.accepted.remove(&id).is_some() {
            if state == TaskState::Dropped {
                // Never launched: out of `launched` again (and back in the queue).
                self.counters.dropped.fetch_add(1, Relaxed);
                self.counters.launched.fetch_sub(1, Relaxed);
                if self.shape.arrivals {
                    let mut q = Queue::lock(&self.queue);
                    q.waiting.push_front(Instant::now());
                    if self.phase() == Phase::Launching {
                        q.declare(driver, &self.shape.task);
                    }
                }
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
