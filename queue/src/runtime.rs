//! The thin runtime around [`Core`]: the [`Scheduler`] the driver calls, a ticker for
//! time-driven decisions (hold timeouts, aging, statistics), and [`Shared`], the state the API
//! uses. Every event locks the core, hands it the event, the time and the wall clock, commits
//! what changed to the [`Store`] (submissions through the API run no pass of their own: the
//! commit that takes them runs one for all, [`Core::pass_if_due`]), and only then performs the returned [`Action`]s with the
//! driver handle: a task is in the store before the master is asked to launch it, and a
//! status update is in the store before the driver acknowledges it (when the scheduler
//! callback returns), so `kill -9` at any moment loses nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gantry_sdk::protocol::*;
use gantry_sdk::{DriverHandle, Scheduler};

use crate::core::{Action, Core};
use crate::store::Store;

/// Wall-clock Unix milliseconds (the runtime's one clock read besides `Instant::now`).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The core, the store and the driver handle, shared by the scheduler, the ticker and the API.
pub struct Shared {
    core: Mutex<Core>,
    store: Store,
    driver: DriverHandle,
    /// A commit failed: nothing more is sent to the master (the queue disconnects and exits;
    /// its next run starts from what the store has).
    broken: AtomicBool,
    /// `gantry-queue shutdown` was asked for: the framework is being torn down.
    shutting_down: AtomicBool,
    /// Action batches the core returned whose changes are not committed yet, in the core's
    /// order, and the sequence number of the last one (locked while `core` is).
    outbox: Mutex<Outbox>,
    /// Held by whoever commits (group commit); the sequence number committed and performed.
    committed: Mutex<u64>,
    /// `--declare-demand`: the demand last declared to the master (`None`: to declare again),
    /// or no declaring at all.
    demand: Option<Mutex<Option<Vec<Demand>>>>,
}

impl Shared {
    /// Wraps `core` (already restored from `store`); actions go to `driver`.
    pub fn new(core: Core, store: Store, driver: DriverHandle) -> Arc<Self> {
        Self::with_demand(core, store, driver, false)
    }

    /// As [`Shared::new`]; with `declare_demand`, the ticker declares the eligible pending
    /// jobs' shapes to the master ([`Core::demand`], `set_demand`) whenever they change.
    pub fn with_demand(
        core: Core,
        store: Store,
        driver: DriverHandle,
        declare_demand: bool,
    ) -> Arc<Self> {
        Arc::new(Shared {
            core: Mutex::new(core),
            store,
            driver,
            broken: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            outbox: Mutex::new(Outbox::default()),
            committed: Mutex::new(0),
            demand: declare_demand.then(|| Mutex::new(None)),
        })
    }

    /// With `--declare-demand`: declares [`Core::demand`] to the master if it differs from
    /// what was declared last (or a launch or a new subscription made the master's count
    /// stale). Called by the ticker, so a burst of submissions declares once.
    pub fn declare_demand(&self) {
        let Some(last) = &self.demand else { return };
        if self.is_broken() || self.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        // The core first, then the record of what was declared (the order `perform` uses).
        let core = self.core();
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        let now = core.demand();
        if last.as_ref() != Some(&now) {
            tracing::debug!(shapes = now.len(), "declaring demand");
            self.driver.set_demand(now.clone());
            *last = Some(now);
        }
    }

    /// Forgets what was declared: the next [`Shared::declare_demand`] declares again.
    fn demand_stale(&self) {
        if let Some(last) = &self.demand {
            *last.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    /// The core, locked (a poisoned lock is taken over: the core has no invariants a panic
    /// mid-update would break that the next pass does not repair).
    pub fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Whether a store commit failed (the queue is stopping).
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    /// Runs `f` on the core, commits what changed, and performs the actions it returns, in
    /// that order, before returning.
    ///
    /// Group commit: `f` runs under the core's lock, which is released before the store's
    /// commit; whoever then commits takes every change made since the last commit (other
    /// callers' too) into one transaction and performs every action batch they returned, in
    /// the order the core returned them (sending in another order let a `Revive` be
    /// overtaken by an older `Suppress`, leaving the framework suppressed with work waiting).
    /// A caller whose changes someone else committed returns at once. So concurrent
    /// submissions share one `fsync`, and nothing is sent before it is in the store.
    pub fn with<R>(&self, f: impl FnOnce(&mut Core, Instant) -> (R, Vec<Action>)) -> R {
        let (r, seq) = self.apply(f);
        self.flush(seq);
        r
    }

    /// [`Shared::with`] for async callers (the API): the wait for the commit runs on a
    /// blocking thread, so a burst of requests reaches the core while one commit is under way
    /// and shares the next.
    pub async fn with_async<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Core, Instant) -> (R, Vec<Action>),
    ) -> R {
        let (r, seq) = self.apply(f);
        let me = Arc::clone(self);
        if tokio::task::spawn_blocking(move || me.flush(seq))
            .await
            .is_err()
        {
            // The blocking pool is shutting down: commit here.
            self.flush(seq);
        }
        r
    }

    /// Runs `f` on the locked core and queues its actions; returns their sequence number.
    fn apply<R>(&self, f: impl FnOnce(&mut Core, Instant) -> (R, Vec<Action>)) -> (R, u64) {
        let mut core = self.core();
        let (r, actions) = f(&mut core, Instant::now());
        let mut out = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
        out.seq += 1;
        out.batches.push(actions);
        (r, out.seq)
    }

    /// Returns once the changes and actions up to `seq` are committed and performed, by this
    /// caller (with everyone else's so far) or by another.
    fn flush(&self, seq: u64) {
        let mut committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        if *committed >= seq {
            return;
        }
        // Every batch queued so far was queued under the core's lock: its changes are in
        // what is taken now.
        let (changes, batches, upto) = {
            let mut core = self.core();
            // Submissions since the last commit ([`Core::enqueue_as`]) share one pass, whose
            // actions go after theirs.
            let owed = core.pass_if_due(Instant::now());
            let changes = core.take_changes(Instant::now(), unix_ms());
            let mut out = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
            if !owed.is_empty() {
                out.seq += 1;
                out.batches.push(owed);
            }
            (changes, std::mem::take(&mut out.batches), out.seq)
        };
        *committed = upto;
        if self.is_broken() {
            return;
        }
        if !changes.is_empty() {
            if let Err(e) = self.store.commit(&changes) {
                tracing::error!("{e}: stopping; the next run resumes from the store");
                self.broken.store(true, Ordering::SeqCst);
                self.driver.disconnect();
                return;
            }
        }
        for actions in batches {
            self.perform(actions);
        }
    }

    fn perform(&self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Launch { offers, tasks } => {
                    // The master lowers the declared counts by what this launches.
                    self.demand_stale();
                    for t in &tasks {
                        tracing::info!(task = %t.name, id = %t.task_id, "launching");
                    }
                    self.driver
                        .accept(offers, vec![Operation::Launch { tasks }], Some(0.0));
                }
                Action::Decline(offers, secs) => self.driver.decline(offers, Some(secs)),
                Action::Kill(task) => self.driver.kill(task),
                Action::KillFor(task, reason) => self.driver.kill_for(task, reason),
                Action::Revive => self.driver.revive(vec![]),
                Action::Suppress => self.driver.suppress(vec![]),
            }
        }
    }

    /// Kills still owed from before a restart (see [`Core::restore`]); sent after the
    /// subscription.
    pub fn resume(&self, kills: Vec<Action>) {
        self.with(|_, _| ((), kills));
    }

    /// Tears the framework down (`gantry-queue shutdown`): the master kills every worker;
    /// jobs with workers are recorded `CANCELLED`, pending ones stay for the next run, and the
    /// framework id is forgotten.
    pub fn shutdown(&self) -> Result<(), crate::store::StoreError> {
        self.shutting_down.store(true, Ordering::SeqCst);
        // The commit lock first (its order with the core's), so no older commit lands after.
        let mut committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        let mut core = self.core();
        core.shutdown();
        let changes = core.take_changes(Instant::now(), unix_ms());
        {
            // The teardown kills every worker: what was still to send is moot.
            let mut out = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
            out.batches.clear();
            *committed = out.seq;
        }
        drop(core);
        self.store.commit(&changes)?;
        self.store.set_framework_id(None)?;
        self.driver.teardown();
        Ok(())
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
                me.declare_demand();
            }
        })
    }
}

/// Removes the checkpoint directories (`ROOT/job-ID`) of jobs that ended (or that the queue
/// no longer knows) and were not written for `keep`, every minute until the process ends.
pub fn spawn_checkpoint_sweeper(
    shared: Arc<Shared>,
    root: std::path::PathBuf,
    keep: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(60));
        loop {
            every.tick().await;
            for (id, result) in sweep_checkpoints(&root, keep, |id| shared.core().job_ended(id)) {
                match result {
                    Ok(()) => tracing::info!(job = id, "removed its checkpoint directory"),
                    Err(e) => {
                        tracing::warn!(job = id, error = %e, "removing its checkpoint directory")
                    }
                }
            }
        }
    })
}

/// One sweep of `root`: removes `job-ID` directories whose job `ended` says is over (`Some(true)`)
/// or unknown (`None`) and whose last write is at least `keep` old; returns what it tried.
pub fn sweep_checkpoints(
    root: &std::path::Path,
    keep: Duration,
    ended: impl Fn(u64) -> Option<bool>,
) -> Vec<(u64, std::io::Result<()>)> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("job-"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if ended(id) == Some(false) {
            continue;
        }
        let idle = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        if idle.is_some_and(|d| d >= keep) {
            out.push((id, std::fs::remove_dir_all(e.path())));
        }
    }
    out
}

/// Action batches awaiting the commit of their changes.
#[derive(Default)]
struct Outbox {
    seq: u64,
    batches: Vec<Vec<Action>>,
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
        if self.shared.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = self.shared.store.set_framework_id(Some(framework_id)) {
            tracing::error!("{e}: stopping; the next run resumes from the store");
            self.shared.broken.store(true, Ordering::SeqCst);
            driver.disconnect();
            return;
        }
        driver.revive(vec![]);
        // A new subscription (or another master) holds no demand of ours.
        self.shared.demand_stale();
        self.shared.declare_demand();
        let ids = self.shared.core().task_ids();
        for chunk in ids.chunks(MAX_RECONCILE_IDS) {
            driver.reconcile(chunk.to_vec());
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

    async fn agent_removed(&mut self, _driver: &DriverHandle, removed: &AgentRemoved) {
        tracing::info!(agent = %removed.hostname, "agent removed: {}", removed.reason);
        let id = removed.agent_id;
        self.shared
            .with(|core, now| ((), core.agent_removed(id, now)));
    }

    async fn agents(&mut self, _driver: &DriverHandle, agents: &[AgentSummary]) {
        tracing::debug!(agents = agents.len(), "agent inventory");
        self.shared.core().agents(agents);
    }

    async fn disconnected(&mut self, _driver: &DriverHandle) {
        self.shared.core().disconnected();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_removes_ended_and_forgotten_jobs_checkpoints_only() {
        let root = tempfile::tempdir().unwrap();
        for d in ["job-1", "job-2", "job-3", "other", "job-x"] {
            std::fs::create_dir(root.path().join(d)).unwrap();
            std::fs::write(root.path().join(d).join("step"), "5").unwrap();
        }
        let ended = |id| match id {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        };
        // Written just now: kept for a day.
        assert!(sweep_checkpoints(root.path(), Duration::from_secs(86400), ended).is_empty());
        let mut removed: Vec<u64> = sweep_checkpoints(root.path(), Duration::ZERO, ended)
            .into_iter()
            .map(|(id, r)| {
                r.unwrap();
                id
            })
            .collect();
        removed.sort_unstable();
        assert_eq!(removed, [1, 3]);
        let mut left: Vec<String> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["job-2", "job-x", "other"]);
    }
}
