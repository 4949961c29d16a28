//! A hyper-parameter sweep: `trials` one-GPU trials, each retried with backoff when it fails
//! (an [`AttemptsBook`]: at most `max_failures` retries; losses by the cluster do not count),
//! then an evaluation group of `eval_members` tasks on one agent, launched atomically
//! ([`TaskGroup`], [`place_group`]) under [`GroupPolicy::KillOnAnyEnd`]: the members stop
//! together. Trials and the evaluation are declared together as two demand shapes.
//!
//! Each trial sees `TRIAL` (its index) and `ATTEMPT` (from 1); each evaluation member the
//! group environment (`GANTRY_GROUP_ADDRS`, ...). Backoff waits are driver timers
//! ([`DriverHandle::after`]): no offer churn while a trial waits.

use std::time::{Duration, Instant};

use gantry_sdk::attempts::{AttemptsBook, RetryPolicy, Verdict};
use gantry_sdk::group::{place_group, GroupPolicy, TaskGroup};
use gantry_sdk::placement::offers::AgentView;
use gantry_sdk::protocol::*;
use gantry_sdk::{DriverHandle, Scheduler};
use tokio::sync::watch;

/// What to sweep.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    pub name: String,
    pub trials: u32,
    /// What a trial runs (`TRIAL`, `ATTEMPT` in its environment).
    pub trial_command: CommandInfo,
    pub trial_resources: Resources,
    pub retry: RetryPolicy,
    pub eval_members: u32,
    /// What each evaluation member runs (the group environment in its environment).
    pub eval_command: CommandInfo,
    pub eval_resources: Resources,
}

/// Progress, observable while the sweep runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepProgress {
    pub trials_succeeded: u32,
    pub trials_given_up: u32,
    /// Trial tasks launched (first attempts and retries).
    pub attempts: u32,
    /// Retries after failures that counted.
    pub retries: u32,
    /// Relaunches after endings that never count (lost, dropped, preempted...): how each
    /// such attempt ended, with its reason and message.
    pub relaunches: Vec<String>,
    /// The evaluation members' ids (once launched) and how each ended.
    pub eval_tasks: Vec<TaskId>,
    pub eval_ended: Vec<(TaskId, TaskState, String)>,
    /// Accepts the master refused because an offer had just gone (rescinded or pooled into
    /// another accept on its agent before our accept arrived): a race every offer-based
    /// framework sees; their tasks come back `DROPPED` and are relaunched (`relaunches`).
    pub stale_offers: u32,
    /// Any other error the master reported.
    pub errors: Vec<String>,
    pub done: bool,
}

/// The scheduler. [`Sweep::new`] also returns the receiver to watch its progress with.
pub struct Sweep {
    spec: SweepSpec,
    book: AttemptsBook<u32>,
    /// The evaluation group, once every trial has ended (until launched).
    eval: Option<TaskGroup>,
    eval_launched: bool,
    start: Instant,
    progress: SweepProgress,
    tx: watch::Sender<SweepProgress>,
}

impl Sweep {
    pub fn new(spec: SweepSpec) -> (Self, watch::Receiver<SweepProgress>) {
        let mut book = AttemptsBook::new(spec.retry);
        for i in 0..spec.trials {
            book.add(i);
        }
        let (tx, rx) = watch::channel(SweepProgress::default());
        let sweep = Sweep {
            spec,
            book,
            eval: None,
            eval_launched: false,
            start: Instant::now(),
            progress: SweepProgress::default(),
            tx,
        };
        (sweep, rx)
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Both shapes at once: the trials still owed and the evaluation members.
    fn declare_demand(&self, driver: &DriverHandle) {
        let eval = if self.eval_launched {
            0
        } else {
            self.spec.eval_members
        };
        driver.set_demand([
            Demand {
                task: self.spec.trial_resources.clone(),
                count: self.book.pending() as u32,
                gpu_model: None,
            },
            Demand {
                task: self.spec.eval_resources.clone(),
                count: eval,
                gpu_model: None,
            },
        ]);
    }

    fn trial(&self, i: u32) -> TaskInfo {
        let attempt = self.book.attempts(&i).len() + 1;
        TaskInfo::new(
            format!("{}-trial-{i}-{attempt}", self.spec.name),
            self.spec.trial_command.clone(),
            self.spec.trial_resources.clone(),
        )
        .with_env("TRIAL", i.to_string())
        .with_env("ATTEMPT", attempt.to_string())
    }

    fn eval_group(&self) -> TaskGroup {
        let members = (0..self.spec.eval_members)
            .map(|i| {
                TaskInfo::new(
                    format!("{}-eval-{i}", self.spec.name),
                    self.spec.eval_command.clone(),
                    self.spec.eval_resources.clone(),
                )
            })
            .collect();
        TaskGroup::new(format!("{}-eval", self.spec.name), members)
            .with_policy(GroupPolicy::KillOnAnyEnd)
    }

    fn publish(&self) {
        self.tx.send_replace(self.progress.clone());
    }

    /// Every trial ended: the evaluation comes next (offers again, as we may be suppressed).
    fn trials_over(&mut self, driver: &DriverHandle) {
        if self.book.all_ended() && self.eval.is_none() && !self.eval_launched {
            self.eval = Some(self.eval_group());
            driver.revive(vec![]);
        }
    }
}

impl Scheduler for Sweep {
    async fn registered(&mut self, driver: &DriverHandle, _framework_id: FrameworkId) {
        self.declare_demand(driver);
        driver.revive(vec![]);
    }

    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        let now = self.now();
        let mut views = AgentView::from_offers(&offers, &|_, _| false);
        let mut used = vec![false; views.len()];
        // The evaluation group: all members on one agent, or wait.
        if let Some(group) = self.eval.take() {
            match place_group(&mut views, &group) {
                Some(p) => {
                    used[p.agent] = true;
                    self.progress.eval_tasks = group.tasks.iter().map(|t| t.task_id).collect();
                    self.eval_launched = true;
                    driver.launch_group(p.offer_ids, group);
                }
                None => self.eval = Some(group),
            }
        }
        // Ready trials, packed per agent (one accept per agent).
        let mut ready = self.book.ready(now).into_iter();
        let mut next = ready.next();
        for (i, view) in views.iter_mut().enumerate() {
            if used[i] {
                continue;
            }
            let mut tasks = Vec::new();
            while let Some(k) = next {
                if !view.resources.contains(&self.spec.trial_resources) {
                    break;
                }
                let _ = view
                    .resources
                    .checked_sub_assign(&self.spec.trial_resources);
                let t = self.trial(k);
                self.book.launched(&k, t.task_id, now);
                self.progress.attempts += 1;
                tasks.push(t);
                next = ready.next();
            }
            if !tasks.is_empty() {
                used[i] = true;
                driver.accept(
                    view.offer_ids.clone(),
                    vec![Operation::Launch { tasks }],
                    None,
                );
            }
        }
        let unused: Vec<OfferId> = views
            .iter()
            .zip(&used)
            .filter(|(_, u)| !**u)
            .flat_map(|(v, _)| v.offer_ids.iter().copied())
            .collect();
        driver.decline(unused, Some(1.0));
        self.declare_demand(driver);
        if self.book.ready(now).is_empty() && self.eval.is_none() {
            // Nothing to launch until a retry is due (a timer revives) or the evaluation comes.
            driver.suppress(vec![]);
        }
        self.publish();
    }

    async fn status_update(&mut self, driver: &DriverHandle, update: &StatusUpdate) {
        let now = self.now();
        if self.progress.eval_tasks.contains(&update.task_id) {
            if update.state.is_terminal()
                && !self
                    .progress
                    .eval_ended
                    .iter()
                    .any(|e| e.0 == update.task_id)
            {
                self.progress.eval_ended.push((
                    update.task_id,
                    update.state,
                    update.message.clone(),
                ));
                if self.progress.eval_ended.len() == self.progress.eval_tasks.len() {
                    self.progress.done = true;
                    driver.stop();
                }
            }
            self.publish();
            return;
        }
        match self.book.update(update, now) {
            Some(Verdict::Succeeded { .. }) => self.progress.trials_succeeded += 1,
            Some(Verdict::GaveUp { unit }) => {
                self.progress.trials_given_up += 1;
                self.progress
                    .errors
                    .push(format!("trial {unit} given up: {}", update.message));
            }
            Some(Verdict::Retry { at, .. }) => {
                self.progress.retries += 1;
                driver.after(Duration::from_millis(at.saturating_sub(now)), 0);
            }
            Some(Verdict::Relaunch { .. }) => {
                self.progress.relaunches.push(format!(
                    "{} ({:?}): {}",
                    update.state, update.reason, update.message
                ));
                driver.revive(vec![]);
            }
            Some(Verdict::Cancelled { .. }) | None => {}
        }
        self.trials_over(driver);
        self.publish();
    }

    async fn wake(&mut self, driver: &DriverHandle, _token: u64) {
        // A retry's backoff is over: offers again.
        self.declare_demand(driver);
        driver.revive(vec![]);
    }

    async fn error(&mut self, _driver: &DriverHandle, kind: ErrorKind, message: &str) {
        if kind == ErrorKind::UnknownOffer {
            tracing::info!("an accept raced an offer's end: {message}");
            self.progress.stale_offers += 1;
        } else {
            self.progress.errors.push(format!("{kind:?}: {message}"));
        }
        self.publish();
    }
}
