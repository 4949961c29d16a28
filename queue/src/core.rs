//! The queue's pure core: jobs, the offers held, and one scheduling pass that returns
//! [`Action`]s (launch, decline, kill, revive, suppress). No I/O and no clock: every entry point
//! takes `now`. The shell ([`crate::runtime`]) feeds it driver events and a periodic tick and
//! performs what it returns.
//!
//! One file over 800 lines: the scheduling pass reads as one ordered policy (order, place,
//! backfill, preempt); launch, preempt and views are already split into `core/`.
//!
//! One pass:
//! 1. Pending jobs are taken one at a time in [`Core::order`]: effective priority (aging raises
//!    a waiting job one class per `aging` interval, up to `high`), then teams below their GPU
//!    quota, then the team's weighted dominant share (DRF over GPUs and CPUs, with what this
//!    pass launched and the job itself counted: see `Core::order_key`), then the team's
//!    GPU-seconds per weight so far, then the earliest deadline, then submission order.
//! 2. A job whose gang fits the free offered resources (minus the reservation below) launches:
//!    every member in the same pass, one accept per agent ([`gang::place_gang`]).
//! 3. The first job that does not fit gets the **reservation** (one at a time, through
//!    [`gang::Holds`], so two gangs never hold halves of the cluster): the agents and amounts its
//!    gang would take at the earliest time it fits by the running workers' time limits (launch
//!    plus limit; `Core::reserve`), preferring agents with the fewest GPUs idle now, then by
//!    hostname, are subtracted from what later jobs may use, and the offers of those agents are
//!    held (not declined, while fresh) while the hold lasts. Smaller jobs still run on what is
//!    left, which cannot delay it, and on the reserved GPUs too when their time limit ends by the
//!    reservation's estimated start (EASY backfill). Time limits: the job's own, else its
//!    team's default, else the cluster default ([`CoreConfig::default_time_limit`]).
//! 4. A blocked `critical` or `high` job preempts: victims are running jobs of a lower class,
//!    chosen agent by agent so that what they free forms the job's placement with what is free
//!    (fewest GPUs killed, then fewest jobs); elastic gangs above their minimum shrink first.
//!    Nothing is killed unless the whole job then fits, and a job launched in the same pass is
//!    never a victim. Victims get SIGTERM (their wrapper writes the preemption file), a grace
//!    period, then SIGKILL, and are requeued. Until the preemptor launches (at most a minute),
//!    where it will go is reserved for it and no other preemption starts.
//!    **Quota reclaim**: otherwise, the first blocked job whose team stays within its GPU
//!    quota with it preempts the same way among jobs of other teams above their quota (a team
//!    without one counts as 0), each of which they can lose without going below it: lowest
//!    class, then newest first; never `critical` jobs. **Fair-share wait**: otherwise, the
//!    first blocked job that waited `fair_share_wait` and whose team stays within its weighted
//!    share of the GPUs preempts `preemptible` jobs of teams above theirs.
//! 5. Elastic gangs below `max` grow on what is still free when nothing waits.
//! 6. Offers nobody can use are declined (offers held past the hold timeout too).
//!
//! Retries follow the framework SDK's attempt rules, shared with `batch` and every framework
//! using `gantry_sdk::attempts`: [`attempts::ending`] says how a worker's end counts (a failure,
//! a loss that never counts, the queue's own kill) and [`RetryPolicy::retry_after`] whether the
//! job runs again and after what backoff. The queue does not keep its jobs in an
//! [`attempts::AttemptsBook`]: a book's unit has one task per attempt, while a job's attempt is
//! a gang of workers that ends as a whole (one worker's failure kills the others, an elastic
//! gang shrinks and grows within one attempt), its time is an `Instant` rather than the book's
//! milliseconds, and its retries and backoff are what the store keeps in each job record
//! (schema 1: `retries`, `retrying`, `not_before_unix_ms`), which a book does not hold.
//!
//! Submodules: `estimate` (estimated start times), `launch` (building a job's tasks, elastic growth), `preempt` (victim choice,
//! step 4), `views` (what the API shows), `tests`, `backfill_tests` (reservation placement,
//! EASY backfill).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use gantry_sdk::attempts::{self, Ending, RetryPolicy};
use gantry_sdk::placement::gang::{self, GangRequest, HoldPolicy, Holds};
use gantry_sdk::placement::offers::{AgentView, FreeGpu, TaskRequest};
use gantry_sdk::protocol::resources::MILLI;
use gantry_sdk::protocol::*;

use crate::model::{JobSpec, JobState, Priority, TeamConfig};

/// What the shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Accept these offers (all of one agent) launching these tasks.
    Launch {
        /// The agent's offers.
        offers: Vec<OfferId>,
        /// The tasks.
        tasks: Vec<TaskInfo>,
    },
    /// Decline offers for this many seconds.
    Decline(Vec<OfferId>, f64),
    /// Kill a task (SIGTERM, grace, SIGKILL).
    Kill(TaskId),
    /// Kill a task and say why (`Preempted`, `TimeLimit`): its `KILLED` update, `/state` and
    /// the operator API carry the reason (the SDK's `DriverHandle::kill_for`).
    KillFor(TaskId, TaskReason),
    /// Ask for offers again.
    Revive,
    /// Stop offers (nothing waits).
    Suppress,
}

/// Tunables.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Team weights and GPU quotas.
    pub teams: BTreeMap<String, TeamConfig>,
    /// A waiting job rises one priority class per this much waiting (up to `high`).
    pub aging: Duration,
    /// How long the reservation holder may hold offers, and its backoff.
    pub hold: HoldPolicy,
    /// Offers unused for this long are declined.
    pub offer_hold: Duration,
    /// The file (in the task's sandbox) a preempted worker finds written at its warning.
    pub preempt_file: String,
    /// Where each job's checkpoint directory goes (`ROOT/job-ID`, in the workers'
    /// `GANTRY_QUEUE_CHECKPOINT_DIR`, made by the first worker with mode 0700): a path every
    /// agent mounts alike (a shared filesystem), kept across attempts. `None`: no directory.
    pub checkpoint_root: Option<String>,
    /// The first retry's backoff; each further retry doubles it, up to [`MAX_RETRY_BACKOFF`].
    pub retry_backoff: Duration,
    /// The most GPUs a team with a quota may use beyond it (`--team-borrow-limit`); absent:
    /// no limit.
    pub team_borrow_limits: BTreeMap<String, u64>,
    /// A team's time limit for its jobs submitted without one (`--team-time-limit`).
    pub team_time_limits: BTreeMap<String, Duration>,
    /// A job waiting this long whose team is below its weighted share of the GPUs (with the
    /// job) preempts `preemptible` jobs of teams above theirs (`--fair-share-wait`). `None`:
    /// never.
    pub fair_share_wait: Option<Duration>,
    /// Fair-share usage decays with this half-life (Slurm's `PriorityDecayHalfLife`): a
    /// team's GPU-seconds in the ordering count half after one half-life. `None`: GPU-seconds
    /// since the start count forever.
    pub usage_half_life: Option<Duration>,
    /// The time limit of jobs with neither their own nor a team default
    /// (`--default-time-limit`); `None`: unlimited (they never backfill on reserved GPUs and a
    /// reservation behind them has no estimated start).
    pub default_time_limit: Option<Duration>,
}

/// The longest backoff before a retry.
pub const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(600);

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            teams: BTreeMap::new(),
            aging: Duration::from_secs(300),
            hold: HoldPolicy {
                timeout: Duration::from_secs(60),
                backoff_min: Duration::from_secs(2),
                backoff_max: Duration::from_secs(30),
            },
            offer_hold: Duration::from_secs(20),
            preempt_file: "gpu-queue-preempted".into(),
            checkpoint_root: None,
            retry_backoff: Duration::from_secs(10),
            team_time_limits: BTreeMap::new(),
            team_borrow_limits: BTreeMap::new(),
            default_time_limit: None,
            usage_half_life: None,
            fair_share_wait: None,
        }
    }
}

#[derive(Debug, Clone)]
struct Member {
    task_id: TaskId,
    agent_id: AgentId,
    hostname: String,
    gpus: Vec<String>,
    state: TaskState,
    /// Killed on purpose (shrink or preemption).
    killing: bool,
    started: Instant,
}

#[derive(Debug, Clone)]
struct Job {
    id: u64,
    spec: JobSpec,
    state: JobState,
    submitted: Instant,
    /// Start of the current wait (submission, or the last requeue).
    waiting_since: Instant,
    /// Waiting time before the current wait.
    waited: Duration,
    preemptions: u32,
    /// Being preempted (or requeued after losing a worker): every member killed, requeued
    /// when all have ended.
    preempting: bool,
    /// The requeue is for a lost worker, not a preemption (not counted as one).
    lost: bool,
    members: BTreeMap<u32, Member>,
    /// Members that finished successfully (the job finishes when none is left running).
    finished_members: u32,
    next_index: u32,
    message: String,
    /// Still waiting for a dependency (`after`) to finish: not yet eligible to run.
    on_deps: bool,
    /// Who submitted it.
    user: String,
    /// Times its workers were launched from `PENDING` (each requeue starts a new attempt).
    attempts: u32,
    /// Retries after failures so far.
    retries: u32,
    /// The requeue under way is a retry after a failure.
    retrying: bool,
    /// A retry's backoff: not eligible before then.
    not_before: Option<Instant>,
    /// When the current attempt was launched.
    attempt_started: Option<Instant>,
}

impl Job {
    fn running_members(&self) -> u32 {
        self.members.len() as u32
    }
}

/// Counters the metrics endpoint shows.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Preemptions (victim jobs requeued or shrunk members) so far.
    pub preemptions: u64,
    /// Jobs requeued because the cluster lost one of their workers (`LOST`, `GONE`, killed by
    /// someone else, or `DROPPED`): relaunched once per loss.
    pub requeued_lost: u64,
    /// Waiting times of jobs that started, seconds.
    pub waits: Vec<f64>,
    /// GPU-seconds used per team.
    pub gpu_secs: BTreeMap<String, f64>,
    /// GPU-seconds during which GPUs were idle while a waiting job could have started on them
    /// under the policy: free GPUs outside the reservation while a job fits there, every free
    /// GPU while a job that may backfill on the reservation (EASY) fits in them, or while the
    /// reservation's holder fits in everything free. What responsiveness costs.
    pub idle_while_eligible_gpu_secs: f64,
    /// Seconds during which that happened at all.
    pub idle_while_eligible_secs: f64,
    /// GPU-seconds during which free GPUs were held for the reservation of a blocked job while
    /// its remaining GPUs drain (no job may start there without delaying it): the price of
    /// never starving a large gang, reported apart from the idle time above.
    pub reserved_idle_gpu_secs: f64,
}

/// The queue.
pub struct Core {
    config: CoreConfig,
    jobs: BTreeMap<u64, Job>,
    next_id: u64,
    offers: BTreeMap<OfferId, (Offer, Instant)>,
    tasks: HashMap<TaskId, (u64, u32)>,
    /// What each agent has, as seen in offers plus our tasks there (for DRF and the
    /// reservation): its id → (hostname, attributes, every GPU seen, capacity).
    agents: BTreeMap<AgentId, KnownAgent>,
    holds: Holds<u64>,
    /// A preemption under way: the job it is for, where it will go (agent, amount, GPUs), and
    /// when it started. Those amounts are reserved for it until it launches (or a minute
    /// passes), and no other preemption starts meanwhile.
    preempt_for: Option<(u64, Parts, Instant)>,
    suppressed: bool,
    last_tick: Option<Instant>,
    /// The reservation the last pass made, for the idle-time statistics and the views.
    last_reservation: Option<Reservation>,
    /// Statistics.
    pub stats: Stats,
    /// What the store has of each job (a digest of its record; see `persist`).
    persisted: HashMap<u64, u64>,
    /// Workers ended since the last [`Core::take_changes`] (the usage history).
    ended_members: Vec<EndedMember>,
    /// The wall clock last given (an instant and the Unix milliseconds then): deadlines are
    /// Unix times.
    wall: Option<(Instant, u64)>,
    /// With [`CoreConfig::usage_half_life`]: each team's decayed GPU-seconds, as of the last
    /// tick.
    decayed: BTreeMap<String, f64>,
}

/// A worker that ended, for the usage history.
#[derive(Debug, Clone)]
struct EndedMember {
    job: u64,
    attempt: u32,
    task_id: TaskId,
    gpus: u32,
    secs: f64,
    at: Instant,
}

#[derive(Debug, Clone)]
struct KnownAgent {
    hostname: String,
    attributes: Attributes,
    gpus: BTreeMap<String, FreeGpu>,
    capacity: Resources,
}

fn member_resources(spec: &JobSpec) -> Resources {
    Resources::new()
        .with("cpus", spec.cpus)
        .with("mem", spec.mem)
        .with("gpus", f64::from(spec.gpus))
}

fn request(spec: &JobSpec) -> TaskRequest {
    let mut t = TaskRequest::new(member_resources(spec));
    t.gpu_selector = spec.selector();
    t
}

impl Core {
    /// An empty queue.
    pub fn new(config: CoreConfig) -> Self {
        let holds = Holds::new(config.hold);
        Core {
            config,
            jobs: BTreeMap::new(),
            next_id: 1,
            offers: BTreeMap::new(),
            tasks: HashMap::new(),
            agents: BTreeMap::new(),
            holds,
            preempt_for: None,
            suppressed: false,
            last_tick: None,
            last_reservation: None,
            stats: Stats::default(),
            persisted: HashMap::new(),
            ended_members: Vec::new(),
            wall: None,
            decayed: BTreeMap::new(),
        }
    }

    /// Adds a job; returns its id.
    pub fn submit(&mut self, spec: JobSpec, now: Instant) -> (u64, Vec<Action>) {
        self.submit_as(spec, String::new(), now)
    }

    /// Adds a job submitted by `user`; returns its id.
    pub fn submit_as(&mut self, spec: JobSpec, user: String, now: Instant) -> (u64, Vec<Action>) {
        let id = self.insert(spec, user, now);
        let mut out = Vec::new();
        if self.suppressed {
            self.suppressed = false;
            out.push(Action::Revive);
        }
        out.extend(self.pass(now));
        (id, out)
    }

    /// Adds an array (`spec.array`): one job per index, named `NAME[INDEX]`, with the index in
    /// `GANTRY_QUEUE_ARRAY_INDEX`; returns their ids (the first is the array's id). A spec
    /// without `array` adds one job.
    pub fn submit_array(
        &mut self,
        spec: JobSpec,
        user: String,
        now: Instant,
    ) -> Result<(Vec<u64>, Vec<Action>), String> {
        let Some(indexes) = spec.array_indexes()? else {
            let (id, out) = self.submit_as(spec, user, now);
            return Ok((vec![id], out));
        };
        let first = self.next_id;
        let mut ids = Vec::with_capacity(indexes.len());
        for i in indexes {
            let mut s = spec.clone();
            s.array = None;
            s.array_job = Some(first);
            s.array_index = Some(i);
            s.name = format!("{}[{i}]", spec.name);
            s.env
                .insert("GANTRY_QUEUE_ARRAY_INDEX".into(), i.to_string());
            ids.push(self.insert(s, user.clone(), now));
        }
        let mut out = Vec::new();
        if self.suppressed {
            self.suppressed = false;
            out.push(Action::Revive);
        }
        out.extend(self.pass(now));
        Ok((ids, out))
    }

    fn insert(&mut self, spec: JobSpec, user: String, now: Instant) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let spec_after_empty = spec.after.is_empty();
        self.jobs.insert(
            id,
            Job {
                id,
                spec,
                state: JobState::Pending,
                submitted: now,
                waiting_since: now,
                waited: Duration::ZERO,
                preemptions: 0,
                preempting: false,
                lost: false,
                members: BTreeMap::new(),
                finished_members: 0,
                next_index: 0,
                message: String::new(),
                on_deps: !spec_after_empty,
                user,
                attempts: 0,
                retries: 0,
                retrying: false,
                not_before: None,
                attempt_started: None,
            },
        );
        id
    }

    /// Why `spec`'s dependencies cannot be waited for, if they cannot: an unknown job id (or one
    /// already forgotten), or a repeated one. A dependency that already ended `FAILED` or
    /// `CANCELLED` is accepted: the job is then cancelled at once, with the reason.
    pub fn dependency_problem(&self, spec: &JobSpec) -> Option<String> {
        let mut seen = BTreeSet::new();
        for d in &spec.after {
            if !seen.insert(*d) {
                return Some(format!("dependency {d} is listed twice"));
            }
            if !self.jobs.contains_key(d) {
                return Some(format!("dependency {d} is not a known job"));
            }
        }
        None
    }

    /// Dependencies (`afterok`): a pending job whose dependency ended `FAILED` or `CANCELLED`
    /// (or is unknown) is cancelled with the reason, transitively; one whose dependencies all
    /// `FINISHED` becomes eligible, and its wait (aging, `waited_secs`) starts then.
    fn resolve_dependencies(&mut self, now: Instant) {
        loop {
            let mut changed = false;
            let waiting: Vec<u64> = self
                .jobs
                .values()
                .filter(|j| j.state == JobState::Pending && j.on_deps)
                .map(|j| j.id)
                .collect();
            for id in waiting {
                let broken =
                    self.jobs[&id]
                        .spec
                        .after
                        .iter()
                        .find_map(|d| match self.jobs.get(d) {
                            None => Some(format!("dependency {d} is unknown")),
                            Some(j)
                                if matches!(j.state, JobState::Failed | JobState::Cancelled) =>
                            {
                                Some(format!(
                                    "dependency {d} ({}) ended {}",
                                    j.spec.name,
                                    j.state.as_str()
                                ))
                            }
                            Some(_) => None,
                        });
                let met = self.jobs[&id].spec.after.iter().all(|d| {
                    self.jobs
                        .get(d)
                        .is_some_and(|j| j.state == JobState::Finished)
                });
                let Some(job) = self.jobs.get_mut(&id) else {
                    continue;
                };
                if let Some(why) = broken {
                    job.state = JobState::Cancelled;
                    job.on_deps = false;
                    job.message = format!("{why}: cancelled (afterok: runs only after its dependencies finish successfully)");
                    self.holds.done(&id);
                    changed = true;
                } else if met {
                    job.on_deps = false;
                    job.waiting_since = now;
                }
            }
            if !changed {
                break;
            }
        }
    }

    /// Pending, not waiting on a dependency, and not backing off before a retry.
    fn eligible(job: &Job) -> bool {
        job.state == JobState::Pending && !job.on_deps && job.not_before.is_none()
    }

    /// The wall clock: `wall_ms` (Unix milliseconds) is the time at `now`. Given by the shell
    /// with every event ([`Core::take_changes`] and [`Core::restore`] take it too); deadlines
    /// need it.
    pub fn set_wall_clock(&mut self, now: Instant, wall_ms: u64) {
        self.wall = Some((now, wall_ms));
    }

    /// The latest time `spec`'s job may start and still end by its deadline (the deadline
    /// minus its time limit), as an instant; `None` without a deadline or a wall clock.
    fn latest_start(&self, spec: &JobSpec) -> Option<Instant> {
        let (at, wall) = self.wall?;
        let deadline_ms = spec.deadline_unix?.saturating_mul(1000);
        let limit = time_limit(&self.config, spec).unwrap_or(Duration::ZERO);
        let deadline = if deadline_ms >= wall {
            at + Duration::from_millis(deadline_ms - wall)
        } else {
            at.checked_sub(Duration::from_millis(wall - deadline_ms))
                .unwrap_or(at)
        };
        Some(deadline.checked_sub(limit).unwrap_or(deadline.min(at)))
    }

    /// Retries whose backoff is over become eligible; attempts past their time limit are
    /// killed and their jobs end `FAILED` (reason `time-limit`); pending jobs past their latest
    /// start are cancelled (reason `deadline`) unless their deadline is best-effort.
    fn timers(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        let missed: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Pending && !j.spec.deadline_best_effort)
            .filter(|j| j.members.is_empty())
            .filter(|j| self.latest_start(&j.spec).is_some_and(|t| now > t))
            .map(|j| j.id)
            .collect();
        for id in missed {
            if let Some(job) = self.jobs.get_mut(&id) {
                job.state = JobState::Cancelled;
                job.message = "deadline: it could not start in time to end by its deadline \
                               (deadline minus time limit); cancelled"
                    .into();
                self.holds.done(&id);
            }
        }
        for job in self.jobs.values_mut() {
            if job.not_before.is_some_and(|t| now >= t) {
                job.not_before = None;
                job.waiting_since = now;
            }
            let (Some(limit), Some(started)) =
                (time_limit(&self.config, &job.spec), job.attempt_started)
            else {
                continue;
            };
            if job.state != JobState::Running
                || job.preempting
                || now.saturating_duration_since(started) < limit
            {
                continue;
            }
            job.state = JobState::Failed;
            job.message = format!(
                "time-limit: killed after its time limit of {} s",
                limit.as_secs()
            );
            for m in job.members.values_mut() {
                m.killing = true;
                out.push(Action::KillFor(m.task_id, TaskReason::TimeLimit));
            }
            self.holds.done(&job.id);
        }
        out
    }

    /// Cancels a job (its tasks are killed). False when unknown or already ended.
    pub fn cancel(&mut self, id: u64, now: Instant) -> Option<Vec<Action>> {
        let job = self.jobs.get_mut(&id)?;
        if job.state.is_terminal() {
            return None;
        }
        job.state = JobState::Cancelled;
        job.message = "cancelled".into();
        let mut out: Vec<Action> = Vec::new();
        for m in job.members.values_mut() {
            m.killing = true;
            out.push(Action::Kill(m.task_id));
        }
        self.holds.done(&id);
        out.extend(self.pass(now));
        Some(out)
    }

    /// New offers.
    pub fn offers(&mut self, offers: Vec<Offer>, now: Instant) -> Vec<Action> {
        for o in offers {
            let known = self.agents.entry(o.agent_id).or_insert_with(|| KnownAgent {
                hostname: o.hostname.clone(),
                attributes: (*o.attributes).clone(),
                gpus: BTreeMap::new(),
                capacity: Resources::new(),
            });
            for g in o.gpus.iter().filter(|g| g.healthy) {
                known.gpus.insert(g.uuid.clone(), FreeGpu::from(g));
            }
            self.offers.insert(o.id, (o, now));
        }
        self.pass(now)
    }

    /// An offer was rescinded.
    pub fn rescinded(&mut self, id: OfferId) {
        self.offers.remove(&id);
    }

    /// The connection dropped: the master rescinds our offers.
    pub fn disconnected(&mut self) {
        self.offers.clear();
        self.suppressed = false;
    }

    /// Task ids of every member we believe is running (for reconciliation).
    pub fn task_ids(&self) -> Vec<TaskId> {
        self.tasks.keys().copied().collect()
    }

    /// A task's status changed.
    pub fn update(&mut self, u: &StatusUpdate, now: Instant) -> Vec<Action> {
        let Some(&(job_id, index)) = self.tasks.get(&u.task_id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return out;
        };
        let Some(m) = job.members.get_mut(&index) else {
            return out;
        };
        if !u.gpus.is_empty() {
            m.gpus = u.gpus.clone();
        }
        if u.state == TaskState::Running && m.state != TaskState::Running {
            m.started = now;
        }
        m.state = u.state;
        if !u.state.is_terminal() {
            return out;
        }
        let killing = m.killing;
        let gpus = m.gpus.len() as f64;
        let ran = now.saturating_duration_since(m.started).as_secs_f64();
        *self
            .stats
            .gpu_secs
            .entry(job.spec.team.clone())
            .or_default() += gpus * ran;
        self.ended_members.push(EndedMember {
            job: job_id,
            attempt: job.attempts,
            task_id: u.task_id,
            gpus: gpus as u32,
            secs: ran,
            at: now,
        });
        job.members.remove(&index);
        self.tasks.remove(&u.task_id);
        // How the attempt's worker ended, by the SDK's rules (`gantry_sdk::attempts::ending`):
        // the queue's own kills (shrink, preemption, the siblings of a failed or lost worker,
        // cancel, time limit) never count; nor do losses. The queue has no drain notices.
        let Some(end) = attempts::ending(u.state, u.reason, killing, false) else {
            return out;
        };
        match end {
            _ if matches!(job.state, JobState::Cancelled | JobState::Failed) => {}
            Ending::Succeeded => job.finished_members += 1,
            Ending::OwnKill if !job.preempting => {
                // A shrunk elastic member: the job goes on with the rest.
                self.stats.preemptions += 1;
            }
            Ending::OwnKill => {}
            Ending::Lost => {
                // Lost with its agent, killed by someone else for reasons not its own
                // (preempted, a drain's deadline), or dropped by the master before it started
                // (an offer expired or was rescinded as we accepted it): requeue the whole job.
                job.preempting = true;
                job.lost = true;
                for m in job.members.values_mut() {
                    m.killing = true;
                    out.push(Action::Kill(m.task_id));
                }
                job.message = format!("worker {index} {}: {}; requeued", u.state, u.message);
            }
            Ending::Failed
                if !job.preempting
                    && Self::policy(&self.config, job.spec.max_retries)
                        .retry_after(job.retries + 1)
                        .is_some() =>
            {
                // A failed worker, with retries left: the attempt ends (the other workers are
                // killed) and the job is requeued after a backoff.
                job.retries += 1;
                job.preempting = true;
                job.retrying = true;
                for m in job.members.values_mut() {
                    m.killing = true;
                    out.push(Action::Kill(m.task_id));
                }
                job.message = format!(
                    "worker {index} {}: {}; retry {} of {}",
                    u.state, u.message, job.retries, job.spec.max_retries
                );
            }
            Ending::Failed => {
                job.state = JobState::Failed;
                job.message = format!("worker {index} {}: {}", u.state, u.message);
                if job.spec.max_retries > 0 {
                    job.message += &format!(" (after {} retries)", job.retries);
                }
                for m in job.members.values_mut() {
                    m.killing = true;
                    out.push(Action::Kill(m.task_id));
                }
            }
        }
        if job.members.is_empty() {
            if job.preempting {
                job.preempting = false;
                job.state = JobState::Pending;
                job.attempt_started = None;
                if std::mem::take(&mut job.retrying) {
                    let backoff =
                        Self::policy(&self.config, job.spec.max_retries).delay(job.retries);
                    job.not_before = Some(now + backoff);
                    job.lost = false;
                } else if std::mem::take(&mut job.lost) {
                    self.stats.requeued_lost += 1;
                } else {
                    job.preemptions += 1;
                    self.stats.preemptions += 1;
                }
                job.waiting_since = now;
                job.next_index = 0;
                job.finished_members = 0;
            } else if job.state == JobState::Running {
                job.state = JobState::Finished;
            }
        }
        out.extend(self.pass(now));
        out
    }

    /// A job's retry rules as the SDK's [`RetryPolicy`]: `max_retries` counted failures
    /// retried, backoff from [`CoreConfig::retry_backoff`] doubling up to
    /// [`MAX_RETRY_BACKOFF`].
    fn policy(config: &CoreConfig, max_retries: u32) -> RetryPolicy {
        RetryPolicy::new(max_retries, config.retry_backoff, MAX_RETRY_BACKOFF)
    }

    /// A job's state (`None`: unknown or forgotten). For the simulator (`crate::sim`).
    pub fn job_state(&self, id: u64) -> Option<JobState> {
        self.jobs.get(&id).map(|j| j.state)
    }

    /// Jobs not yet ended.
    pub fn active_jobs(&self) -> usize {
        self.jobs
            .values()
            .filter(|j| !j.state.is_terminal())
            .count()
    }

    /// Forgets the oldest ended jobs beyond [`MAX_ENDED_JOBS`].
    fn trim(&mut self) {
        // Jobs a waiting job depends on are kept.
        let needed: BTreeSet<u64> = self
            .jobs
            .values()
            .filter(|j| j.on_deps)
            .flat_map(|j| j.spec.after.iter().copied())
            .collect();
        let ended: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| j.state.is_terminal() && j.members.is_empty())
            .filter(|j| !needed.contains(&j.id))
            .map(|j| j.id)
            .collect();
        for id in ended
            .iter()
            .take(ended.len().saturating_sub(MAX_ENDED_JOBS))
        {
            self.jobs.remove(id);
        }
    }

    /// Periodic: statistics, hold timeouts, stale offers.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        self.trim();
        let dt = self
            .last_tick
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        self.last_tick = Some(now);
        let (idle, held) = self.idle_gpus(now);
        let secs = dt.as_secs_f64();
        if idle > 0 {
            self.stats.idle_while_eligible_gpu_secs += idle as f64 * secs;
            self.stats.idle_while_eligible_secs += secs;
        }
        self.stats.reserved_idle_gpu_secs += held as f64 * secs;
        if let Some(hl) = self.config.usage_half_life.filter(|h| !h.is_zero()) {
            // Decay what was, then add what ran since the last tick.
            let keep = 0.5f64.powf(secs / hl.as_secs_f64());
            for v in self.decayed.values_mut() {
                *v *= keep;
            }
            for j in self.jobs.values() {
                let gpus: usize = j
                    .members
                    .values()
                    .filter(|m| m.state == TaskState::Running)
                    .map(|m| m.gpus.len())
                    .sum();
                if gpus > 0 {
                    *self.decayed.entry(j.spec.team.clone()).or_default() += gpus as f64 * secs;
                }
            }
        }
        self.pass(now)
    }

    /// Free GPUs (capacity minus ours, assuming the cluster is ours), split in two: those a
    /// waiting job could start on now under the policy (outside the last pass's reservation,
    /// while an eligible job's gang fits there; everything free when the reservation's holder
    /// fits), 0 when no job could; and those free but held for the reservation.
    fn idle_gpus(&self, now: Instant) -> (u64, u64) {
        let views = self.eventual_views(false);
        let free: u64 = views.iter().map(AgentView::gpu_count).sum();
        if free == 0 {
            return (0, 0);
        }
        let mut outside = views.clone();
        let holder = self.last_reservation.as_ref().map(|r| {
            subtract(&mut outside, &r.parts);
            r.holder
        });
        let unreserved: u64 = outside.iter().map(AgentView::gpu_count).sum();
        let held = free - unreserved;
        // Once per gang shape, whatever the number of jobs.
        let (mut in_all, mut in_outside) = (ShapeCache::default(), ShapeCache::default());
        let eligible = || self.jobs.values().filter(|j| Self::eligible(j));
        let backfills = |j: &&Job| {
            self.last_reservation
                .as_ref()
                .is_some_and(|r| self.backfills(r, &j.spec, now))
        };
        if eligible().any(|j| holder == Some(j.id) && in_all.fits(&views, &gang_of(&j.spec))) {
            (free, 0)
        } else if eligible().any(|j| {
            holder != Some(j.id) && backfills(&j) && in_all.fits(&views, &gang_of(&j.spec))
        }) {
            // EASY backfill: a job that ends before the reservation starts may use its GPUs.
            (free, 0)
        } else if eligible()
            .any(|j| holder != Some(j.id) && in_outside.fits(&outside, &gang_of(&j.spec)))
        {
            (unreserved, held)
        } else {
            (0, held)
        }
    }

    /// Whether a job of `spec` launched `now` may run on `reservation`'s GPUs (EASY backfill):
    /// its time limit ends by the reservation's estimated start.
    fn backfills(&self, reservation: &Reservation, spec: &JobSpec, now: Instant) -> bool {
        match (reservation.start, time_limit(&self.config, spec)) {
            (Some(start), Some(limit)) => now + limit <= start,
            _ => false,
        }
    }

    /// Whether `spec`'s job would take its team past its GPU quota plus its borrowing limit
    /// ([`CoreConfig::team_borrow_limits`]).
    fn over_borrow_limit(&self, spec: &JobSpec, usage: &HashMap<String, TeamUsage>) -> bool {
        let (Some(quota), Some(limit)) = (
            self.team(&spec.team).gpu_quota,
            self.config.team_borrow_limits.get(&spec.team),
        ) else {
            return false;
        };
        let used = usage.get(&spec.team).map_or(0, |u| u.gpus);
        let need = u64::from(spec.gpus) * u64::from(spec.min_workers.max(1));
        need > 0 && used + need > quota + limit
    }

    /// A job's specification, as submitted.
    pub fn spec(&self, id: u64) -> Option<&JobSpec> {
        self.jobs.get(&id).map(|j| &j.spec)
    }

    /// A job's time limit: its own, else its team's default, else the cluster default.
    pub fn time_limit(&self, spec: &JobSpec) -> Option<Duration> {
        time_limit(&self.config, spec)
    }

    /// Every running member of ours: its agent, amount and GPUs, and when it is expected to
    /// end: its attempt's launch plus the job's time limit (`now` when overdue or being killed
    /// on purpose), `None` when the job has no time limit.
    fn member_ends(&self, now: Instant) -> Vec<(AgentId, Resources, Vec<String>, Option<Instant>)> {
        let mut out = Vec::new();
        for job in self.jobs.values() {
            let res = member_resources(&job.spec);
            let end = match (time_limit(&self.config, &job.spec), job.attempt_started) {
                (Some(limit), Some(started)) => Some((started + limit).max(now)),
                _ => None,
            };
            for m in job.members.values() {
                let end = if m.killing { Some(now) } else { end };
                out.push((m.agent_id, res.clone(), m.gpus.clone(), end));
            }
        }
        out
    }

    /// Per known agent: its capacity minus what our members use, members being killed on
    /// purpose counted as ended (they are about to end); with `all_end`, every member counted
    /// as ended (what the agent will have once running work ends).
    fn eventual_views(&self, all_end: bool) -> Vec<AgentView> {
        let mut views: Vec<AgentView> = self
            .agents
            .iter()
            .map(|(id, a)| AgentView {
                agent_id: *id,
                hostname: a.hostname.clone(),
                offer_ids: Vec::new(),
                resources: a.capacity.clone(),
                attributes: a.attributes.clone(),
                gpus: a.gpus.values().cloned().collect(),
            })
            .collect();
        for job in self.jobs.values().filter(|_| !all_end) {
            let res = member_resources(&job.spec);
            for m in job.members.values().filter(|m| !m.killing) {
                if let Some(v) = views.iter_mut().find(|v| v.agent_id == m.agent_id) {
                    v.resources = v.resources.saturating_sub(&res);
                    v.gpus.retain(|g| !m.gpus.contains(&g.uuid));
                }
            }
        }
        for v in &mut views {
            v.gpus
                .sort_by(|a, b| (a.numa_node, &a.pci_bus_id).cmp(&(b.numa_node, &b.pci_bus_id)));
        }
        views
    }

    /// Whether members we killed on purpose (preemption, shrinking) have not ended yet.
    fn kills_in_flight(&self) -> bool {
        self.jobs
            .values()
            .any(|j| j.state == JobState::Running && j.members.values().any(|m| m.killing))
    }

    fn busy_gpus(&self) -> BTreeSet<(AgentId, String)> {
        self.jobs
            .values()
            .flat_map(|j| j.members.values())
            .flat_map(|m| m.gpus.iter().map(|g| (m.agent_id, g.clone())))
            .collect()
    }

    fn team(&self, team: &str) -> TeamConfig {
        self.config.teams.get(team).cloned().unwrap_or_default()
    }

    /// Effective priority class: aging (one class per `aging` waited), and a deadline's
    /// urgency (one class within two aging intervals of its latest start, two within one; 5
    /// minutes when aging is off); up to `high`.
    fn effective(&self, job: &Job, now: Instant) -> Priority {
        if job.spec.priority >= Priority::High {
            return job.spec.priority;
        }
        let window = if self.config.aging.is_zero() {
            Duration::from_secs(300)
        } else {
            self.config.aging
        };
        let urgency = match self.latest_start(&job.spec) {
            Some(t) if job.state == JobState::Pending => {
                let slack = t.saturating_duration_since(now);
                if slack <= window {
                    2
                } else if slack <= 2 * window {
                    1
                } else {
                    0
                }
            }
            _ => 0,
        };
        let steps = if self.config.aging.is_zero() {
            0
        } else {
            let waited = now.saturating_duration_since(job.waiting_since);
            (waited.as_secs_f64() / self.config.aging.as_secs_f64()) as u8
        };
        let steps = steps.max(urgency);
        Priority::from_rank(
            job.spec
                .priority
                .rank()
                .saturating_add(steps)
                .min(Priority::High.rank()),
        )
    }

    /// Each team's usage now: GPUs and CPUs (milli) of its members, and its GPU-seconds so far
    /// (decayed, as of the last tick, with [`CoreConfig::usage_half_life`]).
    fn usage(&self, now: Instant) -> HashMap<String, TeamUsage> {
        let mut u: HashMap<String, TeamUsage> = HashMap::new();
        let decays = self.config.usage_half_life.is_some_and(|h| !h.is_zero());
        let history = if decays {
            &self.decayed
        } else {
            &self.stats.gpu_secs
        };
        for (team, secs) in history {
            u.entry(team.clone()).or_default().gpu_secs += secs;
        }
        for j in self.jobs.values() {
            let e = u.entry(j.spec.team.clone()).or_default();
            e.gpus += u64::from(j.spec.gpus) * j.members.len() as u64;
            e.cpus += (j.spec.cpus * MILLI as f64) as u64 * j.members.len() as u64;
            for m in j
                .members
                .values()
                .filter(|m| m.state == TaskState::Running && !decays)
            {
                e.gpu_secs +=
                    m.gpus.len() as f64 * now.saturating_duration_since(m.started).as_secs_f64();
            }
        }
        u
    }

    /// The order key of a pending job (smaller first); see the module documentation.
    ///
    /// The team's share is its weighted dominant share **with one more unit counted** (one
    /// GPU's share of the cluster: the share a launch would leave it at, like a finish tag in
    /// weighted fair queueing), not the share before it: ordering by the share before a launch
    /// rounds every allocation up in favour of the lightest team (with weights 3:2:1 on 32 GPUs
    /// of 1-GPU jobs it gives 16/10/6, the weight-1 team 12% over its sixth; counting the unit
    /// gives 16/11/5). The unit is the same for all of a team's jobs, so a team's own large
    /// jobs are not put behind its small ones.
    ///
    /// GPU time over the run decides the rounding: a team whose GPU-seconds per weight so far
    /// are below `level` (the competing teams' GPU-seconds per weight, see [`Core::level`]) is
    /// ordered by its share *before* the launch instead, so it gets the odd GPU until it has
    /// caught up (with 3:2:1 on 32 GPUs the weight-1 team alternates between 5 and 6 GPUs and
    /// averages its 5.3). This moves a team by at most one unit.
    /// Equal shares go to the team with the fewest GPU-seconds per weight so far (GPU time
    /// over the run), then by deadline and age.
    fn order_key(
        &self,
        job: &Job,
        usage: &HashMap<String, TeamUsage>,
        totals: (u64, u64),
        level: f64,
        now: Instant,
    ) -> (u8, bool, u64, u64, u64, Instant, u64) {
        let team = self.team(&job.spec.team);
        let used = usage.get(&job.spec.team).cloned().unwrap_or_default();
        let workers = u64::from(job.spec.min_workers.max(1));
        let over_quota = team
            .gpu_quota
            .is_some_and(|q| used.gpus + u64::from(job.spec.gpus) * workers > q);
        let weight = team.weight.max(1e-6);
        let share = |used: u64, total: u64| used as f64 / total.max(1) as f64;
        // One unit: a GPU's share of the cluster (a CPU's when it has no GPUs), the same for
        // every job of a team so that a team's own jobs keep their order.
        let behind = used.gpu_secs / weight < level;
        let unit = if behind {
            0.0
        } else if totals.0 > 0 {
            share(1, totals.0)
        } else {
            share(MILLI, totals.1)
        };
        let dominant = (share(used.gpus, totals.0).max(share(used.cpus, totals.1)) + unit) / weight;
        (
            u8::MAX - self.effective(job, now).rank(),
            over_quota,
            (dominant * 1e9) as u64,
            (used.gpu_secs / weight * 1e3) as u64,
            job.spec.deadline_unix.unwrap_or(u64::MAX),
            job.submitted,
            job.id,
        )
    }

    /// The competing teams' (those with a job eligible to run) GPU-seconds per weight: their
    /// GPU-seconds over their weights' sum. A team below it has had less than its weight's
    /// share of their GPU time so far.
    fn level(&self, usage: &HashMap<String, TeamUsage>) -> f64 {
        let teams: BTreeSet<&str> = self
            .jobs
            .values()
            .filter(|j| Self::eligible(j))
            .map(|j| j.spec.team.as_str())
            .collect();
        let (secs, weights) = teams.iter().fold((0.0, 0.0), |(s, w), t| {
            (
                s + usage.get(*t).map_or(0.0, |u| u.gpu_secs),
                w + self.team(t).weight.max(1e-6),
            )
        });
        if weights > 0.0 {
            secs / weights
        } else {
            0.0
        }
    }

    /// Pending jobs in scheduling order, as of now (usage counted as is).
    pub fn order(&self, now: Instant) -> Vec<u64> {
        let usage = self.usage(now);
        let level = self.level(&usage);
        let totals = self.totals();
        let mut ids: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| Self::eligible(j))
            .map(|j| j.id)
            .collect();
        ids.sort_by_key(|id| self.order_key(&self.jobs[id], &usage, totals, level, now));
        ids
    }

    fn totals(&self) -> (u64, u64) {
        self.agents.values().fold((0, 0), |(g, c), a| {
            (
                g + a.capacity.milli("gpus") / MILLI,
                c + a.capacity.milli("cpus"),
            )
        })
    }

    /// Learns agent capacities: offered now plus our members there (kept at the maximum seen).
    fn learn_capacity(&mut self) {
        let mut seen: BTreeMap<AgentId, Resources> = BTreeMap::new();
        for (o, _) in self.offers.values() {
            seen.entry(o.agent_id).or_default().add_assign(&o.total());
        }
        for j in self.jobs.values() {
            let res = member_resources(&j.spec);
            for m in j.members.values() {
                seen.entry(m.agent_id).or_default().add_assign(&res);
            }
        }
        for (id, r) in seen {
            if let Some(a) = self.agents.get_mut(&id) {
                let mut cap = a.capacity.clone();
                for (name, milli) in r.iter() {
                    if milli > cap.milli(name) {
                        cap.set_milli(name, milli);
                    }
                }
                a.capacity = cap;
            }
        }
    }

    /// One scheduling pass (see the module documentation).
    pub fn pass(&mut self, now: Instant) -> Vec<Action> {
        let kills = self.timers(now);
        self.resolve_dependencies(now);
        self.learn_capacity();
        let busy = self.busy_gpus();
        let offers: Vec<Offer> = self.offers.values().map(|(o, _)| o.clone()).collect();
        let mut views =
            AgentView::from_offers(&offers, &|a, u: &str| busy.contains(&(a, u.to_string())));
        // Placement ties go to the first agent: by hostname, so that where jobs go does not
        // depend on random agent (or offer) ids.
        views.sort_by(|a, b| (&a.hostname, a.agent_id).cmp(&(&b.hostname, b.agent_id)));
        let totals = self.totals();
        let mut launches: BTreeMap<usize, Vec<TaskInfo>> = BTreeMap::new();
        let mut pending: BTreeSet<u64> = self
            .jobs
            .values()
            .filter(|j| Self::eligible(j))
            .map(|j| j.id)
            .collect();
        // Reservation: per-agent amounts and GPUs subtracted for everyone else (but jobs that
        // end before it starts: EASY backfill).
        let mut reservation: Option<Reservation> = None;
        let mut blocked: Vec<u64> = Vec::new();
        // Jobs launched in this pass: never preempted in the same pass.
        let mut started: BTreeSet<u64> = BTreeSet::new();
        // Who may hold (the reservation): the first job, in order, that does not fit what is
        // free now and is not backing off ([`Holds`]).
        let usage_now = self.usage(now);
        // Placement depends only on the gang's shape: tried once per shape (a queue holds
        // thousands of jobs of a few shapes).
        let mut fits_now = ShapeCache::default();
        let not_fitting: Vec<u64> = self
            .order(now)
            .into_iter()
            .filter(|id| !self.over_borrow_limit(&self.jobs[id].spec, &usage_now))
            .filter(|id| !fits_now.fits(&views, &gang_of(&self.jobs[id].spec)))
            .collect();
        let holder = self.holds.update(&not_fitting, now).holder;
        if let Some((id, _, since)) = &self.preempt_for {
            let pending = self
                .jobs
                .get(id)
                .is_some_and(|j| j.state == JobState::Pending);
            if !pending || now.saturating_duration_since(*since) > PREEMPT_RESERVATION {
                self.preempt_for = None;
            }
        }
        if let Some((id, parts, _)) = &self.preempt_for {
            // Its victims end within their grace: nothing backfills there.
            reservation = Some(Reservation {
                holder: *id,
                parts: parts.clone(),
                start: None,
            });
        }
        // The order of what is pending, computed again only after a launch (a launch changes
        // the teams' usage, which the order depends on; a blocked job changes nothing).
        let mut order: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
        let mut usage = usage_now;
        let mut stale = true;
        // Shapes (and whether they may backfill) that found no room outside the holder's
        // reservation since the last launch or change of the reservation: what is free only
        // shrinks meanwhile, so they would not fit again.
        let mut no_room: Vec<(GangRequest, bool)> = Vec::new();
        while !pending.is_empty() {
            // Members launched earlier in this pass are already recorded in their jobs.
            if stale {
                usage = self.usage(now);
                let level = self.level(&usage);
                let mut ids: Vec<u64> = pending.iter().copied().collect();
                ids.sort_by_cached_key(|id| {
                    self.order_key(&self.jobs[id], &usage, totals, level, now)
                });
                order = ids.into();
                stale = false;
            }
            let Some(id) = order.pop_front() else {
                break;
            };
            pending.remove(&id);
            let spec = self.jobs[&id].spec.clone();
            if self.over_borrow_limit(&spec, &usage) {
                // Waits until its team uses less (it neither reserves nor preempts).
                continue;
            }
            let gang = gang_of(&spec);
            let holds_it = reservation.as_ref().is_some_and(|r| r.holder == id);
            let may_backfill = reservation
                .as_ref()
                .is_some_and(|r| r.holder != id && self.backfills(r, &spec, now));
            if !holds_it
                && holder != Some(id)
                && no_room
                    .iter()
                    .any(|(g, b)| *g == gang && *b == may_backfill)
            {
                blocked.push(id);
                continue;
            }
            let mut avail = views.clone();
            if let Some(r) = &reservation {
                if r.holder != id {
                    subtract(&mut avail, &r.parts);
                }
            }
            let mut plan = gang::place_gang(&mut avail, &gang);
            if plan.is_none()
                && reservation
                    .as_ref()
                    .is_some_and(|r| r.holder != id && self.backfills(r, &spec, now))
            {
                // EASY backfill: it ends before the reservation starts, so it may use the
                // reserved GPUs without delaying the holder.
                avail = views.clone();
                plan = gang::place_gang(&mut avail, &gang);
            }
            match plan {
                Some(plan) => {
                    for a in &plan.assignments {
                        let agent = views[a.agent].agent_id;
                        remove(&mut views, agent, &gang.member.resources, &a.gpus);
                    }
                    started.insert(id);
                    let tasks = self.start(id, &plan, &avail_ids(&avail), now);
                    for (agent, task) in tasks {
                        launches.entry(agent).or_default().push(task);
                    }
                    if reservation.as_ref().is_some_and(|r| r.holder == id) {
                        reservation = None;
                    }
                    self.holds.done(&id);
                    stale = true;
                    no_room.clear();
                }
                None => {
                    blocked.push(id);
                    if reservation.is_none() && holder == Some(id) && not_fitting.contains(&id) {
                        reservation = self.reserve(id, &gang, now);
                        no_room.clear();
                    } else if !holds_it {
                        no_room.push((gang, may_backfill));
                    }
                }
            }
        }
        let mut out = kills;
        // Launch: one accept per agent, every task of the pass on it.
        let mut used_offers: BTreeSet<OfferId> = BTreeSet::new();
        for (agent, tasks) in launches {
            let Some(v) = views.get(agent) else { continue };
            used_offers.extend(v.offer_ids.iter().copied());
            out.push(Action::Launch {
                offers: v.offer_ids.clone(),
                tasks,
            });
        }
        for id in &used_offers {
            self.offers.remove(id);
        }
        // What was left on agents just accepted goes back to the master with the accept.
        for v in &mut views {
            if v.offer_ids.iter().any(|o| used_offers.contains(o)) {
                v.resources = Resources::new();
                v.gpus.clear();
                v.offer_ids.clear();
            }
        }
        // Preemption for the first blocked critical/high job, unless one is under way.
        if !self.kills_in_flight() && self.preempt_for.is_none() {
            if let Some(&id) = blocked
                .iter()
                .find(|id| self.jobs[id].spec.priority >= Priority::High)
            {
                out.extend(self.preempt(id, &views, &started, now, Victims::LowerClass));
            }
        }
        // Quota reclaim: the first blocked job whose team stays within its GPU quota takes
        // back borrowed GPUs, preempting jobs of teams above theirs.
        if !self.kills_in_flight() && self.preempt_for.is_none() {
            let usage = self.usage(now);
            let within = |id: &u64| {
                let j = &self.jobs[id];
                let need = u64::from(j.spec.gpus) * u64::from(j.spec.min_workers.max(1));
                let used = usage.get(&j.spec.team).map_or(0, |u| u.gpus);
                need > 0
                    && self
                        .team(&j.spec.team)
                        .gpu_quota
                        .is_some_and(|q| used + need <= q)
            };
            if let Some(&id) = blocked.iter().find(|id| within(id)) {
                out.extend(self.preempt(id, &views, &started, now, Victims::Borrowed));
            }
        }
        // Fair-share wait: the first blocked job that has waited longer than
        // `fair_share_wait` and whose team stays within its weighted share with it takes GPUs
        // back from `preemptible` jobs of teams above theirs.
        if let Some(wait) = self.config.fair_share_wait {
            if !self.kills_in_flight() && self.preempt_for.is_none() {
                let fair = self.fair_gpus();
                let usage = self.usage(now);
                let under = |id: &u64| {
                    let j = &self.jobs[id];
                    let need = u64::from(j.spec.gpus) * u64::from(j.spec.min_workers.max(1));
                    let used = usage.get(&j.spec.team).map_or(0, |u| u.gpus);
                    need > 0
                        && now.saturating_duration_since(j.waiting_since) >= wait
                        && (used + need) as f64 <= fair.get(&j.spec.team).copied().unwrap_or(0.0)
                };
                if let Some(&id) = blocked.iter().find(|id| under(id)) {
                    out.extend(self.preempt(id, &views, &started, now, Victims::OverShare));
                }
            }
        }
        // Elastic growth when nothing waits.
        if blocked.is_empty() {
            out.extend(self.grow(&mut views, now));
        }
        // Offers: hold fresh ones (younger than `offer_hold`) of reserved agents while the
        // hold lasts and of any agent while work waits; decline the rest. Never older: the
        // master expires offers (30 s by default) and filters the agent for a while, and an
        // accept naming an expired offer drops its tasks (a gang's launch would be partial).
        let reserved: BTreeSet<AgentId> = reservation
            .iter()
            .flat_map(|r| r.parts.iter().map(|p| p.0))
            .collect();
        let waiting = !blocked.is_empty();
        // Per agent: the master's accept and decline act on all of a framework's offers on an
        // agent, so an agent's offers are kept or declined together (kept while its newest
        // offer is fresh).
        let mut fresh: BTreeMap<AgentId, bool> = BTreeMap::new();
        for (o, at) in self.offers.values() {
            let f = now.saturating_duration_since(*at) < self.config.offer_hold;
            *fresh.entry(o.agent_id).or_default() |= f;
        }
        let mut decline = Vec::new();
        for (id, (o, _)) in &self.offers {
            if used_offers.contains(id) {
                continue;
            }
            let keep = (reserved.contains(&o.agent_id) || waiting)
                && fresh.get(&o.agent_id).copied().unwrap_or(false);
            if !keep {
                decline.push(*id);
            }
        }
        for id in &decline {
            self.offers.remove(id);
        }
        if !decline.is_empty() {
            out.push(Action::Decline(decline, if waiting { 1.0 } else { 5.0 }));
        }
        let active = self.jobs.values().any(Self::eligible);
        let growing = self.jobs.values().any(|j| {
            j.state == JobState::Running
                && !j.preempting
                && j.finished_members == 0
                && j.running_members() < j.spec.max_workers
        });
        if !active && !growing && !self.suppressed {
            self.suppressed = true;
            out.push(Action::Suppress);
        } else if (active || growing) && self.suppressed {
            self.suppressed = false;
            out.push(Action::Revive);
        }
        self.last_reservation = reservation;
        out
    }

    /// The reservation for blocked job `id`: where its gang's fewest members go once running
    /// work ends, at the earliest time they fit by the running members' expected ends (their
    /// attempt's launch plus time limit; members being killed end now). At that time it prefers
    /// agents with the fewest GPUs idle now (then by hostname: not by agent id), so it reserves
    /// GPUs that are busy now rather than idle ones others could use. When it fits only once
    /// members without a time limit end, it has no estimated start.
    fn reserve(&self, id: u64, gang: &GangRequest, now: Instant) -> Option<Reservation> {
        let rigid = GangRequest {
            max: gang.min,
            ..gang.clone()
        };
        let idle: HashMap<AgentId, usize> = self
            .eventual_views(false)
            .iter()
            .map(|v| (v.agent_id, v.gpus.len()))
            .collect();
        let mut base = self.eventual_views(true);
        base.sort_by(|a, b| {
            (idle.get(&a.agent_id), &a.hostname, a.agent_id).cmp(&(
                idle.get(&b.agent_id),
                &b.hostname,
                b.agent_id,
            ))
        });
        let members = self.member_ends(now);
        // What every agent has at `t` (`None`: once every member ended).
        let at = |t: Option<Instant>| {
            let mut v = base.clone();
            for (agent, res, gpus, end) in &members {
                let ended = match (t, end) {
                    (None, _) => true,
                    (Some(t), Some(end)) => *end <= t,
                    (Some(_), None) => false,
                };
                if !ended {
                    remove(&mut v, *agent, res, gpus);
                }
            }
            v
        };
        let fits = |t: Option<Instant>| {
            let v = at(t);
            gang::place_gang(&mut v.clone(), &rigid).map(|plan| (plan, v))
        };
        let mut times: Vec<Instant> = members.iter().filter_map(|m| m.3).collect();
        times.push(now);
        times.sort();
        times.dedup();
        // What is free only grows with time: the earliest time it fits, by bisection.
        let start = if fits(times.last().copied()).is_some() {
            let i = times.partition_point(|t| fits(Some(*t)).is_none());
            times.get(i).copied()
        } else {
            None
        };
        let (plan, eventual) = fits(start)?;
        let mut parts: Vec<(AgentId, Resources, Vec<String>)> = Vec::new();
        for a in &plan.assignments {
            let agent = eventual[a.agent].agent_id;
            match parts.iter_mut().find(|p| p.0 == agent) {
                Some(p) => {
                    p.1.add_assign(&gang.member.resources);
                    p.2.extend(a.gpus.iter().cloned());
                }
                None => parts.push((agent, gang.member.resources.clone(), a.gpus.clone())),
            }
        }
        Some(Reservation {
            holder: id,
            parts,
            start,
        })
    }
}

/// A blocked job's reservation: per agent the amount and GPUs set aside for it, and when it is
/// expected to start (by the running jobs' time limits; `None` when unknown).
#[derive(Debug, Clone)]
struct Reservation {
    holder: u64,
    parts: Parts,
    start: Option<Instant>,
}

/// A job's time limit under `config`: its own, else its team's default, else the cluster's.
fn time_limit(config: &CoreConfig, spec: &JobSpec) -> Option<Duration> {
    spec.time_limit_secs
        .map(Duration::from_secs)
        .or_else(|| config.team_time_limits.get(&spec.team).copied())
        .or(config.default_time_limit)
}

/// A team's usage, for ordering.
#[derive(Debug, Clone, Default)]
struct TeamUsage {
    /// GPUs its members hold.
    gpus: u64,
    /// CPUs (milli) its members hold.
    cpus: u64,
    /// GPU-seconds used so far, running members included.
    gpu_secs: f64,
}

/// Per agent: the amount and GPUs reserved there.
type Parts = Vec<(AgentId, Resources, Vec<String>)>;

/// Ended jobs kept for the API (the oldest are forgotten first).
pub const MAX_ENDED_JOBS: usize = 10_000;

/// How long a preemption's reservation lasts at most.
const PREEMPT_RESERVATION: Duration = Duration::from_secs(60);

fn gang_of(spec: &JobSpec) -> GangRequest {
    GangRequest {
        member: request(spec),
        min: spec.min_workers.max(1),
        max: spec.max_workers.max(spec.min_workers.max(1)),
    }
}

fn avail_ids(views: &[AgentView]) -> Vec<(AgentId, String)> {
    views
        .iter()
        .map(|v| (v.agent_id, v.hostname.clone()))
        .collect()
}

/// Removes `res` and the GPUs `uuids` from the view of `agent`.
fn remove(views: &mut [AgentView], agent: AgentId, res: &Resources, uuids: &[String]) {
    if let Some(v) = views.iter_mut().find(|v| v.agent_id == agent) {
        v.resources = v.resources.saturating_sub(res);
        v.gpus.retain(|g| !uuids.contains(&g.uuid));
    }
}

/// Whether each gang shape fits some views, placed once per shape.
#[derive(Default)]
struct ShapeCache {
    known: Vec<(GangRequest, bool)>,
}

impl ShapeCache {
    fn fits(&mut self, views: &[AgentView], gang: &GangRequest) -> bool {
        if let Some((_, fits)) = self.known.iter().find(|(g, _)| g == gang) {
            return *fits;
        }
        let fits = gang::place_gang(&mut views.to_vec(), gang).is_some();
        self.known.push((gang.clone(), fits));
        fits
    }
}

fn subtract(views: &mut [AgentView], parts: &[(AgentId, Resources, Vec<String>)]) {
    for (agent, res, gpus) in parts {
        remove(views, *agent, res, gpus);
    }
}

mod demand;
mod estimate;
mod launch;
mod persist;
mod preempt;

use preempt::Victims;
mod views;

pub use estimate::{MAX_ESTIMATED, MAX_START_TIMES};
pub use persist::Changes;

#[cfg(test)]
mod backfill_tests;
#[cfg(test)]
mod retry_tests;
#[cfg(test)]
mod tests;
