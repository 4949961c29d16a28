//! A batch framework: runs `count` copies of one command, each with the same resources, and
//! finishes when every copy has ended. It declares its demand (task shape and count) so the
//! master can offer it whole tasks, and suppresses offers once everything is launched.
//!
//! It is partition-aware ([`Capability::PartitionAware`]): a task whose agent is out of touch
//! is `UNREACHABLE` and waited for (it may still run and finish); a task the cluster lost
//! (`LOST`, or `GONE` once its agent stayed away past the master's unreachable timeout) is
//! launched again, once per loss, and counted in [`BatchProgress::relaunched`]; so is a task the
//! cluster ended on purpose (`KILLED` at a drain's deadline, preempted, or by an operator:
//! [`gantry_sdk::attempts::ending`]). A task that failed by itself is not, unless [`Batch::with_retries`] gives a retry policy: then a failed
//! copy is launched again after a backoff (a driver timer), at most that many times.
//!
//! Where copies go: a task with GPUs (a fraction of one GPU or whole GPUs) is placed across all
//! the offers of a round with the fragmentation-aware policy
//! (`gantry_sdk::placement::across::OfferPlacer`, `Batch::plan_gpu_copies`): a fraction goes
//! to the agent and GPU it fragments least and pins that GPU; other tasks fill the offers in
//! the order received.
//!
//! Which copy (a unit of work, `0..count`) each task is an attempt of, what an ending means for
//! it and when it may run again is kept by an [`AttemptsBook`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gantry_sdk::attempts::{AttemptsBook, RetryPolicy, Verdict};

use gantry_sdk::placement::across::OfferPlacer;
use gantry_sdk::placement::offers::OfferGroup;
use gantry_sdk::placement::shares::task_shape;
use gantry_sdk::placement::{GpuDemand, ModelSet, Models, Policy, TaskShape, Workload};
use gantry_sdk::protocol::*;
use gantry_sdk::{DriverHandle, Scheduler};
use tokio::sync::watch;

/// What to run.
#[derive(Debug, Clone)]
pub struct BatchSpec {
    pub name: String,
    /// What every copy runs (shell string or argv) and as which user.
    pub command: CommandInfo,
    pub count: u32,
    pub task: Resources,
    pub env: std::collections::BTreeMap<String, String>,
    /// Print a progress line to stdout on every terminal update.
    pub verbose: bool,
    /// Which GPUs the tasks may get (model, memory).
    pub gpu_selector: Option<GpuSelector>,
}

/// Progress, observable while the framework runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchProgress {
    pub launched: u32,
    pub running: u32,
    pub finished: u32,
    pub failed: u32,
    /// Tasks the master dropped (TASK_DROPPED: their accept was invalid) and that were
    /// launched again in later offers; they count neither as finished nor as failed.
    pub dropped: u32,
    /// Tasks the cluster lost (`LOST`, or `GONE` after `UNREACHABLE`: their agent went away)
    /// or ended on purpose (`KILLED` at a drain's deadline, preempted, by an operator) and
    /// that were launched again, once per loss; they count neither as finished nor as failed.
    /// A task that failed by itself (`FAILED`, `ERROR`, `KILLED` with no such reason) is not
    /// relaunched.
    pub relaunched: u32,
    /// Tasks now `UNREACHABLE` (their agent is out of touch; they may still run).
    pub unreachable: u32,
    /// Failed tasks launched again after a backoff ([`Batch::with_retries`]); they count
    /// neither as finished nor as failed.
    pub retried: u32,
    /// Terminal updates seen per task (a correct cluster delivers exactly one per task).
    pub terminal_updates: HashMap<TaskId, Vec<TaskState>>,
    pub errors: Vec<String>,
    pub done: bool,
}

impl BatchProgress {
    /// Tasks that reached a terminal state.
    pub fn ended(&self) -> u32 {
        self.finished + self.failed
    }
}

/// The scheduler. Create with [`Batch::new`], which also returns the receiver to watch its
/// [`BatchProgress`] with.
pub struct Batch {
    spec: BatchSpec,
    tasks: HashMap<TaskId, TaskState>,
    /// The counters ([`Batch::publish`]); its lists stay empty.
    progress: BatchProgress,
    tx: watch::Sender<BatchProgress>,
    suppressed: bool,
    /// A revive for dropped tasks was sent since the last offers (one per burst of drops).
    revived_for_drops: bool,
    /// The copies (units `0..count`) and their attempts.
    attempts: AttemptsBook<u32>,
    /// The clock of the attempts book (milliseconds since the batch was made).
    start: Instant,
}

impl Batch {
    pub fn new(spec: BatchSpec) -> (Self, watch::Receiver<BatchProgress>) {
        let (tx, rx) = watch::channel(BatchProgress::default());
        // No retries of failures by default (losses by the cluster are always relaunched).
        let mut attempts = AttemptsBook::new(RetryPolicy::new(
            0,
            Duration::from_secs(1),
            Duration::from_secs(60),
        ));
        for unit in 0..spec.count {
            attempts.add(unit);
        }
        (
            Self {
                spec,
                tasks: HashMap::new(),
                progress: BatchProgress::default(),
                tx,
                suppressed: false,
                revived_for_drops: false,
                attempts,
                start: Instant::now(),
            },
            rx,
        )
    }

    /// Launches a failed copy again after a backoff, at most `policy.max_failures` times.
    pub fn with_retries(mut self, policy: RetryPolicy) -> Self {
        let mut attempts = AttemptsBook::new(policy);
        for unit in 0..self.spec.count {
            attempts.add(unit);
        }
        self.attempts = attempts;
        self
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Publishes the counters. The lists (terminal updates, errors) grow with the tasks run:
    /// they are kept only in the published copy and added to in place ([`Batch::record`]);
    /// cloning them on every update made the framework's CPU per task grow with the tasks.
    fn publish(&self) {
        let p = &self.progress;
        self.tx.send_modify(|shared| {
            shared.launched = p.launched;
            shared.running = p.running;
            shared.finished = p.finished;
            shared.failed = p.failed;
            shared.dropped = p.dropped;
            shared.relaunched = p.relaunched;
            shared.unreachable = p.unreachable;
            shared.retried = p.retried;
            shared.done = p.done;
        });
    }

    /// Adds to the published lists.
    fn record(&self, f: impl FnOnce(&mut BatchProgress)) {
        self.tx.send_modify(f);
    }

    /// Copies owed: waiting for a launch (also those backing off after a failure).
    fn remaining(&self) -> u32 {
        self.attempts.pending() as u32
    }

    /// The `k`-th task of the next launch (a fresh id; named by its launch number).
    fn next_task(&mut self, k: u32) -> TaskInfo {
        let n = self.progress.launched + k;
        TaskInfo {
            task_id: TaskId::random(),
            name: format!("{}-{n}", self.spec.name),
            command: self.spec.command.clone(),
            resources: self.spec.task.clone(),
            env: self.spec.env.clone(),
            kill_grace_secs: None,
            gpu_selector: self.spec.gpu_selector.clone(),
            container: None,
        }
    }
}

impl Batch {
    /// For a GPU task (a fraction of one GPU or whole GPUs, no MIG profile): which agent each
    /// of `copies` copies goes to, scored across all the offers held with the default
    /// fragmentation-aware policy ([`OfferPlacer`], against this batch's own shape plus one
    /// whole GPU, so that whole GPUs are not broken up while a partly used one has room),
    /// instead of filling the offers in the order received. Per group of `groups`, the copies
    /// placed there, each with the GPU a fraction pins (`None` for whole GPUs: the master
    /// picks idle ones, topology-aware). `None` for other tasks (the offers are filled in
    /// order).
    fn plan_gpu_copies(
        &self,
        offers: &[Offer],
        groups: &[OfferGroup],
        copies: usize,
    ) -> Option<Vec<Vec<Option<String>>>> {
        let selector = self.spec.gpu_selector.as_ref();
        if selector.is_some_and(|s| s.mig_profile.is_some()) {
            return None;
        }
        let shape = task_shape(&self.spec.task, ModelSet::ANY)?;
        if shape.gpu == GpuDemand::None {
            return None;
        }
        let whole = TaskShape {
            gpu: GpuDemand::Whole(1),
            ..shape
        };
        let workload = Workload::new([(shape, copies.max(1) as u64), (whole, 1)]);
        let mut placer = OfferPlacer::new(Models::new(), Policy::DEFAULT, workload, 0)
            .with_selector(selector.cloned());
        placer.add_offers(offers).ok()?;
        // Offers only score CPU, memory and GPUs: an agent short of another kind the task asks
        // for (disk, ports) is no candidate.
        let mut available: Vec<Resources> = groups.iter().map(|g| g.resources.clone()).collect();
        for g in groups {
            if !g.resources.contains(&self.spec.task) {
                placer.withdraw(g.agent_id).ok()?;
            }
        }
        let mut plan = vec![Vec::new(); groups.len()];
        for _ in 0..copies {
            let Some(choice) = placer.place(&shape) else {
                break;
            };
            let Some(gi) = groups.iter().position(|g| g.agent_id == choice.agent_id) else {
                break;
            };
            plan[gi].push(choice.gpu);
            let _ = available[gi].checked_sub_assign(&self.spec.task);
            if !available[gi].contains(&self.spec.task) {
                placer.withdraw(choice.agent_id).ok()?;
            }
        }
        Some(plan)
    }
}

impl Scheduler for Batch {
    async fn registered(&mut self, driver: &DriverHandle, framework_id: FrameworkId) {
        if self.spec.verbose {
            println!("[{}] registered as {framework_id}", self.spec.name);
        }
        driver.set_demand(Some(Demand {
            task: self.spec.task.clone(),
            count: self.remaining(),
            gpu_model: None,
        }));
        if self.remaining() > 0 {
            driver.revive(vec![]);
            self.suppressed = false;
        }
        // After a reconnect, learn what happened to our tasks meanwhile.
        if !self.tasks.is_empty() {
            driver.reconcile(vec![]);
        }
    }

    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        tracing::debug!(
            offers = offers.len(),
            remaining = self.remaining(),
            "offers received"
        );
        self.revived_for_drops = false;
        // One accept per agent and role naming all its offers there: the master acts on all of
        // a framework's offers on an agent at once anyway (docs/allocator.md, rule 2).
        let groups = gantry_sdk::placement::offers::group_offers(&offers);
        let now = self.now();
        // GPU tasks: the agents are scored across every offer held (fragmentation-aware);
        // other tasks fill the offers in the order received.
        let plan = self.plan_gpu_copies(&offers, &groups, self.attempts.ready(now).len());
        for (gi, g) in groups.into_iter().enumerate() {
            let (ids, mut available) = (g.offer_ids, g.resources);
            let mut tasks = Vec::new();
            for unit in self.attempts.ready(now) {
                let pinned = match &plan {
                    Some(plan) => match plan.get(gi).and_then(|p| p.get(tasks.len())) {
                        Some(pinned) => pinned.clone(),
                        None => break,
                    },
                    None => None,
                };
                if !available.contains(&self.spec.task) {
                    break;
                }
                let _ = available.checked_sub_assign(&self.spec.task);
                let mut task = self.next_task(tasks.len() as u32);
                if let Some(uuid) = pinned {
                    let mut selector = task.gpu_selector.take().unwrap_or_default();
                    selector.uuids = vec![uuid];
                    task.gpu_selector = Some(selector);
                }
                self.attempts.launched(&unit, task.task_id, now);
                tasks.push(task);
            }
            if tasks.is_empty() {
                let refuse = if self.remaining() == 0 { 60.0 } else { 1.0 };
                tracing::debug!(offers = ids.len(), %available, refuse, "declined");
                driver.decline(ids, Some(refuse));
                continue;
            }
            for t in &tasks {
                self.tasks.insert(t.task_id, TaskState::Staging);
            }
            self.progress.launched += tasks.len() as u32;
            tracing::debug!(offers = ids.len(), tasks = tasks.len(), left = %available, remaining = self.remaining(), "accepted");
            // While copies are still owed, the unused part is not refused: with the master's
            // default filter (5 s) an offer combined into this accept (rule 2) and then
            // rescinded would keep the agent away from us for 5 s, however much comes free.
            let refuse = (self.remaining() > 0).then_some(0.0);
            driver.accept(ids, vec![Operation::Launch { tasks }], refuse);
        }
        if self.remaining() == 0 && !self.suppressed {
            driver.suppress(vec![]);
            self.suppressed = true;
        }
        driver.set_demand(Some(Demand {
            task: self.spec.task.clone(),
            count: self.remaining(),
            gpu_model: None,
        }));
        self.publish();
    }

    async fn status_update(&mut self, driver: &DriverHandle, update: &StatusUpdate) {
        let Some(prev) = self.tasks.get(&update.task_id).copied() else {
            return;
        };
        if update.reconciliation && update.state == prev {
            return;
        }
        if prev.is_terminal() {
            if !update.reconciliation {
                // A second terminal update: record it so tests can see duplicates.
                self.record(|p| {
                    p.terminal_updates
                        .entry(update.task_id)
                        .or_default()
                        .push(update.state)
                });
            }
            return;
        }
        if update.state == TaskState::Dropped {
            tracing::debug!(task = %update.task_id, "dropped");
            // Its copy is owed again at once (a drop does not count).
            let _ = self.attempts.update(update, self.now());
            // Never ran (its accept named an offer that was gone, e.g. already combined into
            // another accept on the same agent): launch one more copy on a later offer.
            self.tasks.remove(&update.task_id);
            self.progress.launched = self.progress.launched.saturating_sub(1);
            self.progress.dropped += 1;
            // Revive also when not suppressed: it clears the filter the accept that combined
            // the dropped task's offer left on the agent, so the copy is offered at once.
            if self.suppressed || !self.revived_for_drops {
                driver.revive(vec![]);
                self.suppressed = false;
                self.revived_for_drops = true;
            }
            driver.set_demand(Some(Demand {
                task: self.spec.task.clone(),
                count: self.remaining(),
                gpu_model: None,
            }));
            self.publish();
            return;
        }
        if matches!(update.state, TaskState::Lost | TaskState::Gone) {
            // The cluster lost it (its agent went away): one more copy is owed, once per loss
            // (a second terminal update of this task is ignored above).
            tracing::info!(task = %update.task_id, state = %update.state, reason = ?update.reason,
                "lost by the cluster: launching it again");
            // Its copy is owed again at once (a loss does not count).
            let _ = self.attempts.update(update, self.now());
            self.tasks.insert(update.task_id, update.state);
            match prev {
                TaskState::Running => {
                    self.progress.running = self.progress.running.saturating_sub(1)
                }
                TaskState::Unreachable => {
                    self.progress.unreachable = self.progress.unreachable.saturating_sub(1)
                }
                _ => {}
            }
            self.progress.launched = self.progress.launched.saturating_sub(1);
            self.progress.relaunched += 1;
            self.record(|p| {
                p.terminal_updates
                    .entry(update.task_id)
                    .or_default()
                    .push(update.state)
            });
            if self.spec.verbose {
                println!(
                    "[{}] task {} {} ({}): launching it again",
                    self.spec.name, update.task_id, update.state, update.message
                );
            }
            if self.suppressed {
                driver.revive(vec![]);
                self.suppressed = false;
            }
            driver.set_demand(Some(Demand {
                task: self.spec.task.clone(),
                count: self.remaining(),
                gpu_model: None,
            }));
            self.publish();
            return;
        }
        self.tasks.insert(update.task_id, update.state);
        match prev {
            TaskState::Running if update.state != TaskState::Running => {
                self.progress.running = self.progress.running.saturating_sub(1)
            }
            TaskState::Unreachable if update.state != TaskState::Unreachable => {
                self.progress.unreachable = self.progress.unreachable.saturating_sub(1)
            }
            _ => {}
        }
        match update.state {
            TaskState::Running if prev != TaskState::Running => self.progress.running += 1,
            TaskState::Unreachable if prev != TaskState::Unreachable => {
                self.progress.unreachable += 1
            }
            s if s.is_terminal() => {
                let verdict = self.attempts.update(update, self.now());
                if let Some(Verdict::Relaunch { .. }) = verdict {
                    // Ended by the cluster, not by itself (its agent drained past the
                    // deadline, a preemption, an operator's kill): owed again at once, as a
                    // loss.
                    tracing::info!(task = %update.task_id, state = %s, reason = ?update.reason,
                        "ended by the cluster: launching it again");
                    self.progress.launched = self.progress.launched.saturating_sub(1);
                    self.progress.relaunched += 1;
                    self.record(|p| {
                        p.terminal_updates
                            .entry(update.task_id)
                            .or_default()
                            .push(s)
                    });
                    if self.suppressed {
                        driver.revive(vec![]);
                        self.suppressed = false;
                    }
                    driver.set_demand(Some(Demand {
                        task: self.spec.task.clone(),
                        count: self.remaining(),
                        gpu_model: None,
                    }));
                    self.publish();
                    return;
                }
                if let Some(Verdict::Retry { at, .. }) = verdict {
                    // Launched again after the backoff: owed, not failed.
                    let delay = at.saturating_sub(self.now());
                    self.progress.launched = self.progress.launched.saturating_sub(1);
                    self.progress.retried += 1;
                    driver.after(Duration::from_millis(delay), 0);
                    if self.spec.verbose {
                        println!(
                            "[{}] task {} {} ({}): launching it again in {delay} ms",
                            self.spec.name, update.task_id, s, update.message
                        );
                    }
                    self.publish();
                    return;
                }
                self.record(|p| {
                    p.terminal_updates
                        .entry(update.task_id)
                        .or_default()
                        .push(s);
                    if s != TaskState::Finished {
                        p.errors
                            .push(format!("task {} {}: {}", update.task_id, s, update.message));
                    }
                });
                if s == TaskState::Finished {
                    self.progress.finished += 1;
                } else {
                    self.progress.failed += 1;
                }
                if self.spec.verbose {
                    println!(
                        "[{}] {}/{} finished, {} failed, {} running, {} relaunched",
                        self.spec.name,
                        self.progress.finished,
                        self.spec.count,
                        self.progress.failed,
                        self.progress.running,
                        self.progress.relaunched
                    );
                }
            }
            _ => {}
        }
        if self.progress.ended() >= self.spec.count {
            self.progress.done = true;
            driver.stop();
        }
        self.publish();
    }

    async fn wake(&mut self, driver: &DriverHandle, _token: u64) {
        // A failed copy's backoff is over: offers again.
        driver.set_demand(Some(Demand {
            task: self.spec.task.clone(),
            count: self.remaining(),
            gpu_model: None,
        }));
        driver.revive(vec![]);
        self.suppressed = false;
    }

    async fn error(&mut self, _driver: &DriverHandle, kind: ErrorKind, message: &str) {
        self.record(|p| p.errors.push(format!("{kind:?}: {message}")));
        eprintln!("[{}] master error {kind:?}: {message}", self.spec.name);
        self.publish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(agent: AgentId, resources: &str) -> Offer {
        Offer {
            id: OfferId::random(),
            framework_id: FrameworkId::random(),
            agent_id: agent,
            hostname: "h".into(),
            role: "default".into(),
            resources: resources.parse().unwrap_or_default(),
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: Vec::new().into(),
            gpu_free: Vec::new(),
            agent_name: "a".into(),
        }
    }

    fn update(task_id: TaskId, state: TaskState) -> StatusUpdate {
        StatusUpdate {
            source: UpdateSource::Master,
            reason: (state == TaskState::Dropped).then_some(TaskReason::InvalidOffers),
            ..StatusUpdate::new(task_id, FrameworkId::random(), state)
        }
    }

    /// A batch of `count` `cpus:1` tasks and a handle of a driver that never runs (what the
    /// batch asks of it goes nowhere).
    fn batch(count: u32) -> (DriverHandle, Batch, watch::Receiver<BatchProgress>) {
        let driver = gantry_sdk::Driver::new(gantry_sdk::DriverConfig::new(
            vec![],
            "/nonexistent".into(),
            "t",
            vec!["default".into()],
        ));
        let (b, rx) = Batch::new(BatchSpec {
            name: "b".into(),
            command: CommandInfo::shell("true"),
            count,
            task: "cpus:1;mem:10".parse().unwrap_or_default(),
            env: Default::default(),
            verbose: false,
            gpu_selector: None,
        });
        (driver.handle(), b, rx)
    }

    fn gpu_offer(agent: AgentId, uuid: &str, free_milli: u32) -> Offer {
        let gpu = GpuInfo {
            uuid: uuid.into(),
            name: "NVIDIA A100".into(),
            memory_mib: 40_960,
            compute_capability: (8, 0),
            minor: 0,
            pci_bus_id: String::new(),
            numa_node: None,
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        };
        let gpus = f64::from(free_milli) / 1000.0;
        Offer {
            gpus: vec![gpu].into(),
            gpu_free: vec![GpuFree {
                uuid: uuid.into(),
                free_milli,
                free_memory_mib: 0,
            }],
            ..offer(agent, &format!("cpus:8;mem:1000;gpus:{gpus}"))
        }
    }

    /// Offers in arrival order: an idle GPU first, then a half-used one. Filling in order
    /// would break the idle GPU; the plan puts the half GPU on the half-used one (pinned),
    /// and the second copy, with that GPU full, on the idle one.
    #[test]
    fn gpu_copies_go_where_they_fragment_least_across_the_offers() {
        let (_, mut b, _) = batch(2);
        b.spec.task = "cpus:1;mem:10;gpus:0.5".parse().unwrap_or_default();
        let (idle, half) = (AgentId::random(), AgentId::random());
        let offers = vec![
            gpu_offer(idle, "GPU-idle", 1000),
            gpu_offer(half, "GPU-half", 500),
        ];
        let groups = gantry_sdk::placement::offers::group_offers(&offers);
        let plan = b.plan_gpu_copies(&offers, &groups, 1).expect("a GPU task");
        assert_eq!(plan, vec![vec![], vec![Some("GPU-half".to_string())]]);
        let plan = b.plan_gpu_copies(&offers, &groups, 3).expect("a GPU task");
        assert_eq!(
            plan,
            vec![
                vec![Some("GPU-idle".to_string()), Some("GPU-idle".to_string())],
                vec![Some("GPU-half".to_string())]
            ]
        );
        // CPU tasks fill offers in order.
        b.spec.task = "cpus:1;mem:10".parse().unwrap_or_default();
        assert_eq!(b.plan_gpu_copies(&offers, &groups, 1), None);
    }

    #[tokio::test]
    async fn dropped_tasks_are_launched_again_and_the_batch_still_finishes() {
        let (handle, mut b, rx) = batch(3);
        // Two offers on one agent are used together: 3 tasks from 2 + 1 cpus.
        let agent = AgentId::random();
        b.offers(
            &handle,
            vec![
                offer(agent, "cpus:2;mem:100"),
                offer(agent, "cpus:1;mem:100"),
            ],
        )
        .await;
        assert_eq!(rx.borrow().launched, 3);
        let first: Vec<TaskId> = b.tasks.keys().copied().collect();
        // One is dropped (its accept named a gone offer): it is owed again, not failed.
        b.status_update(&handle, &update(first[0], TaskState::Dropped))
            .await;
        assert_eq!((rx.borrow().launched, rx.borrow().dropped), (2, 1));
        assert_eq!(rx.borrow().failed, 0);
        // A later offer launches one more copy.
        b.offers(&handle, vec![offer(agent, "cpus:4;mem:100")])
            .await;
        assert_eq!(rx.borrow().launched, 3);
        let now: Vec<TaskId> = b.tasks.keys().copied().collect();
        assert_eq!(now.len(), 3);
        assert!(!now.contains(&first[0]));
        for t in now {
            b.status_update(&handle, &update(t, TaskState::Finished))
                .await;
        }
        let p = rx.borrow().clone();
        assert!(p.done, "{p:?}");
        assert_eq!((p.finished, p.failed, p.dropped), (3, 0, 1));
    }

    #[tokio::test]
    async fn tasks_the_cluster_lost_are_launched_again_once_and_failures_are_not() {
        let (handle, mut b, rx) = batch(4);
        let agent = AgentId::random();
        b.offers(&handle, vec![offer(agent, "cpus:4;mem:100")])
            .await;
        let ids: Vec<TaskId> = b.tasks.keys().copied().collect();
        for t in &ids {
            b.status_update(&handle, &update(*t, TaskState::Running))
                .await;
        }
        assert_eq!(rx.borrow().running, 4);
        // Unreachable: waited for, not relaunched; it comes back and finishes.
        b.status_update(&handle, &update(ids[0], TaskState::Unreachable))
            .await;
        assert_eq!((rx.borrow().running, rx.borrow().unreachable), (3, 1));
        b.status_update(&handle, &update(ids[0], TaskState::Running))
            .await;
        b.status_update(&handle, &update(ids[0], TaskState::Finished))
            .await;
        // Unreachable then gone, and another lost: each relaunched once, even if its loss is
        // reported twice.
        b.status_update(&handle, &update(ids[1], TaskState::Unreachable))
            .await;
        b.status_update(&handle, &update(ids[1], TaskState::Gone))
            .await;
        b.status_update(&handle, &update(ids[2], TaskState::Lost))
            .await;
        b.status_update(&handle, &update(ids[2], TaskState::Lost))
            .await;
        // A task that failed by itself is not relaunched.
        b.status_update(&handle, &update(ids[3], TaskState::Failed))
            .await;
        let p = rx.borrow().clone();
        assert_eq!(
            (p.relaunched, p.launched, p.failed, p.finished),
            (2, 2, 1, 1),
            "{p:?}"
        );
        assert_eq!((p.running, p.unreachable), (0, 0));
        // The two copies owed run on the next offer and the batch ends.
        b.offers(&handle, vec![offer(agent, "cpus:4;mem:100")])
            .await;
        let new: Vec<TaskId> = b
            .tasks
            .iter()
            .filter(|(_, s)| **s == TaskState::Staging)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(new.len(), 2);
        for t in new {
            b.status_update(&handle, &update(t, TaskState::Finished))
                .await;
        }
        let p = rx.borrow().clone();
        assert!(p.done, "{p:?}");
        assert_eq!((p.finished, p.failed, p.relaunched), (3, 1, 2));
    }

    #[tokio::test]
    async fn with_retries_a_failed_copy_runs_again_until_the_limit() {
        let (handle, b, rx) = batch(1);
        let mut b = b.with_retries(RetryPolicy::new(1, Duration::ZERO, Duration::ZERO));
        let agent = AgentId::random();
        b.offers(&handle, vec![offer(agent, "cpus:4;mem:100")])
            .await;
        let first: Vec<TaskId> = b.tasks.keys().copied().collect();
        b.status_update(&handle, &update(first[0], TaskState::Failed))
            .await;
        let p = rx.borrow().clone();
        assert_eq!(
            (p.retried, p.failed, p.launched, p.done),
            (1, 0, 0, false),
            "{p:?}"
        );
        // The backoff (none here) is over: the copy runs again, fails again, and is given up.
        b.offers(&handle, vec![offer(agent, "cpus:4;mem:100")])
            .await;
        let second: Vec<TaskId> = b
            .tasks
            .iter()
            .filter(|(_, s)| **s == TaskState::Staging)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(second.len(), 1);
        b.status_update(&handle, &update(second[0], TaskState::Failed))
            .await;
        let p = rx.borrow().clone();
        assert_eq!((p.retried, p.failed, p.done), (1, 1, true), "{p:?}");
    }
}
