//! The queue's pure core: jobs, the offers held, and one scheduling pass that returns
//! [`Action`]s (launch, decline, kill, revive, suppress). No I/O and no clock: every entry point
//! takes `now`. The shell ([`crate::runtime`]) feeds it driver events and a periodic tick and
//! performs what it returns.
//!
//! One pass:
//! 1. Pending jobs are taken one at a time in [`Core::order`]: effective priority (aging raises
//!    a waiting job one class per `aging` interval, up to `high`), then teams below their GPU
//!    quota, then the team's weighted dominant share (DRF over GPUs and CPUs, with what this
//!    pass launched and the job itself counted: see `Core::order_key`), then the team's
//!    GPU-seconds per weight so far, then the earliest deadline, then submission order.
//!    The order is kept across passes, one ordered set per team by each job's own part of
//!    its key (`order_cache`; re-keyed when a job is new or requeued, at its aging steps, and
//!    every pass for jobs with a deadline); with team quotas it is keyed again every pass.
//!    After a launch only the launching team's part of its jobs' keys changes (and with
//!    quotas its jobs are keyed again), unless the level of GPU-seconds changes (then every
//!    team's does).
//! 2. A job whose gang fits the free offered resources (minus the reservation below) launches:
//!    every member in the same pass, one accept per agent
//!    ([`gang::place_gang`](gantry_sdk::placement::gang::place_gang)).
//! 3. The first job that does not fit gets the **reservation** (one at a time, through
//!    [`gang::Holds`](gantry_sdk::placement::gang::Holds), so two gangs never hold halves of
//!    the cluster): the agents and amounts its
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
//!    quota with it (in the job's quota bucket: per GPU model where teams name models; see
//!    `quota`) preempts the same way among jobs of other teams above their quota there (a team
//!    without one counts as 0), each of which they can lose without going below it: lowest
//!    class, then newest first; never `critical` jobs. A job that borrows launches only where
//!    it leaves free what other teams keep by their lending limits. **Fair-share wait**: otherwise, the
//!    first blocked job that waited `fair_share_wait` and whose team stays within its weighted
//!    share of the GPUs preempts `preemptible` jobs of teams above theirs.
//! 5. Elastic gangs below `max` grow on what is still free when nothing waits.
//! 6. Offers nobody can use are declined (offers held past the hold timeout too), and so,
//!    with no filter, are the kept offers of an agent where one of our workers ended after
//!    they arrived: they lack what it freed, which the master does not add to them
//!    (`Core::refresh_stale`).
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
//! Module map (this file: the types, the configuration, events in — cancel, offers, status
//! updates, tick — and the retry rules):
//!
//! - `config`: the tunables ([`CoreConfig`]);
//! - `order`: the order of pending jobs and the teams' usage it is computed from;
//! - `order_cache`: that order kept across passes (per team, by the jobs' own keys);
//! - `pass`: one scheduling pass;
//! - `reserve`: what a pass places with: the reservation where GPUs free soonest, the agents'
//!   views and the idle-GPU statistic;
//! - `shape`: gang shapes (placement tried once per shape) and the least worker of the eligible
//!   jobs (where a pass may stop);
//! - `submit`: jobs and arrays added, with their pass or without (owed to the next commit);
//! - `quota`: teams' nominal quotas (overall and per GPU model), borrowing and lending limits;
//! - `timers`: dependencies, retry backoffs, time limits and deadlines;
//! - `launch`: building a job's tasks, elastic growth;
//! - `preempt`: victim choice (step 4: preemption, reclaim, fair-share wait);
//! - `demand`: what the queue asks the master for (its demand, for the autoscaler);
//! - `estimate`: estimated start times;
//! - `persist`: what the store keeps ([`Changes`]) and restoring from it;
//! - `views`: what the API shows;
//! - tests: `tests`, `backfill_tests` (reservation placement, EASY backfill, quotas),
//!   `quota_tests`, `retry_tests`, `pass_tests` (properties on random event sequences: gangs
//!   whole and within offers; the pass deciding what `pass_oracle`, the full pass it
//!   replaced, decides).
//!
//! Performance (100,000 queued jobs; docs/benchmarks.md): submissions through the API add jobs
//! without a pass ([`Core::enqueue_as`]; the runtime runs one per group commit,
//! [`Core::pass_if_due`]); a pass stops once no offered agent can host the least worker of any
//! eligible job, the rest blocked lazily in order; work about running jobs walks the jobs with
//! workers only; the store gets only the jobs touched since the last commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use gantry_sdk::attempts::{self, Ending, RetryPolicy};
use gantry_sdk::placement::gang::Holds;
use gantry_sdk::placement::offers::{FreeGpu, TaskRequest};
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

#[derive(Debug, Clone)]
struct Member {
    task_id: TaskId,
    agent_id: AgentId,
    hostname: String,
    gpus: Vec<String>,
    state: TaskState,
    /// Killed on purpose (shrink or preemption).
    killing: bool,
    /// When the queue launched it: its resources are its team's from then, so usage and cost
    /// count from it (staging, an image pull say, included), as the master and the
    /// autoscaler charge a task from when it was staged.
    started: Instant,
}

impl Member {
    /// Seconds it has held its resources at `now`.
    fn held_secs(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.started).as_secs_f64()
    }
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
    /// GPU-seconds during which free GPUs were kept for a gang over several agents whose
    /// offers were settling ([`CoreConfig::offer_settle`]: launched there at once, a gang could
    /// start partially): the price of whole gangs, a second or so per such launch, reported
    /// apart from the idle time above (the gang is not counted as a job that could start).
    pub settling_idle_gpu_secs: f64,
}

/// The queue.
pub struct Core {
    config: CoreConfig,
    jobs: BTreeMap<u64, Job>,
    next_id: u64,
    offers: BTreeMap<OfferId, (Offer, Instant)>,
    /// When we last accepted or declined offers on each agent ([`CoreConfig::offer_settle`]).
    settled: BTreeMap<AgentId, Instant>,
    /// When a worker of ours last ended on each agent: offers of that agent that arrived
    /// before lack what it freed (see `Core::refresh_stale`).
    worker_ended: HashMap<AgentId, Instant>,
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
    /// The gangs the last pass kept GPUs for while their offers settle
    /// ([`CoreConfig::offer_settle`]), and what it kept: for the idle-time statistics.
    last_settling: Vec<(u64, Parts)>,
    /// Statistics.
    pub stats: Stats,
    /// What the store has of each job (a digest of its record; see `persist`).
    persisted: HashMap<u64, u64>,
    /// Jobs changed (or possibly changed) since the last [`Core::take_changes`]: only these
    /// are digested and compared with `persisted` (change tracking; see `persist`).
    touched: BTreeSet<u64>,
    /// Jobs were added without a pass ([`Core::enqueue_as`]): [`Core::pass_if_due`] runs one.
    pass_due: bool,
    /// Tests: passes run [`Core::pass_reference`] (the oracle) instead.
    #[cfg(test)]
    oracle: bool,
    /// Workers ended since the last [`Core::take_changes`] (the usage history).
    ended_members: Vec<EndedMember>,
    /// The wall clock last given (an instant and the Unix milliseconds then): deadlines are
    /// Unix times.
    wall: Option<(Instant, u64)>,
    /// With [`CoreConfig::usage_half_life`]: each team's decayed GPU-seconds, as of the last
    /// tick.
    decayed: BTreeMap<String, f64>,
    /// The GPU models teams name in per-model quotas (see `quota`).
    named: BTreeSet<String>,
    /// The order of the eligible jobs kept across passes (see `order_cache`).
    order_cache: order_cache::OrderCache,
    /// The agents' views with every member ended, kept across passes (see `reserve`).
    view_cache: reserve::ViewCache,
    /// Jobs the last pass could place but not launch by other teams' lending limits, and why.
    lend_blocked: HashMap<u64, String>,
    /// The teams' spending against their budgets (see `spend`).
    budgets: crate::budget::Budgets,
}

/// A worker that ended, for the usage history.
#[derive(Debug, Clone)]
struct EndedMember {
    job: u64,
    attempt: u32,
    task_id: TaskId,
    gpus: crate::model::Gpus,
    secs: f64,
    at: Instant,
    /// Its cost ([`KnownAgent::cost_per_sec`] × `secs`), when its agent has a price.
    cost: Option<f64>,
}

#[derive(Debug, Clone)]
struct KnownAgent {
    hostname: String,
    attributes: Attributes,
    gpus: BTreeMap<String, FreeGpu>,
    capacity: Resources,
    /// Known from the master's inventory: `capacity` is exact, and at most its `gpus` of
    /// `gpus` can ever be the queue's (the rest are reserved for other roles).
    listed: bool,
}

fn member_resources(spec: &JobSpec) -> Resources {
    Resources::new()
        .with("cpus", spec.cpus)
        .with("mem", spec.mem)
        .with("gpus", spec.gpus.as_f64())
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
        let named = config
            .teams
            .values()
            .flat_map(|t| t.model_quotas.keys().cloned())
            .collect();
        Core {
            named,
            order_cache: Default::default(),
            view_cache: Default::default(),
            lend_blocked: HashMap::new(),
            budgets: crate::budget::Budgets::new(config.budgets.clone()),
            config,
            jobs: BTreeMap::new(),
            next_id: 1,
            offers: BTreeMap::new(),
            settled: BTreeMap::new(),
            worker_ended: HashMap::new(),
            tasks: HashMap::new(),
            agents: BTreeMap::new(),
            holds,
            preempt_for: None,
            suppressed: false,
            last_tick: None,
            last_reservation: None,
            last_settling: Vec::new(),
            stats: Stats::default(),
            persisted: HashMap::new(),
            touched: BTreeSet::new(),
            pass_due: false,
            #[cfg(test)]
            oracle: false,
            ended_members: Vec::new(),
            wall: None,
            decayed: BTreeMap::new(),
        }
    }

    /// The jobs with workers, in id order: found from `tasks`, which holds exactly our
    /// members, so that work about running jobs does not walk a queue of pending ones.
    fn with_members(&self) -> impl Iterator<Item = &Job> {
        let ids: BTreeSet<u64> = self.tasks.values().map(|t| t.0).collect();
        #[cfg(test)]
        {
            let scan: BTreeSet<u64> = self
                .jobs
                .values()
                .filter(|j| !j.members.is_empty())
                .map(|j| j.id)
                .collect();
            assert_eq!(ids, scan, "tasks and members disagree");
            assert!(
                !self
                    .jobs
                    .values()
                    .any(|j| j.state == JobState::Running && j.members.is_empty()),
                "a running job without workers"
            );
        }
        ids.into_iter().filter_map(|id| self.jobs.get(&id))
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

    /// Cancels a job (its tasks are killed). False when unknown or already ended.
    pub fn cancel(&mut self, id: u64, now: Instant) -> Option<Vec<Action>> {
        let job = self.jobs.get_mut(&id)?;
        if job.state.is_terminal() {
            return None;
        }
        job.state = JobState::Cancelled;
        job.message = "cancelled".into();
        self.touched.insert(id);
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
                listed: false,
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

    /// An agent left the cluster for good (the master's `AgentRemoved`, protocol 13): it no
    /// longer counts where the queue judges what fits (never-fit checks, reservations,
    /// estimated starts). Its offers were rescinded; its workers get their own updates. A pass
    /// follows, since a reservation may have counted on it.
    pub fn agent_removed(&mut self, id: AgentId, now: Instant) -> Vec<Action> {
        if self.agents.remove(&id).is_none() {
            return Vec::new();
        }
        self.offers.retain(|_, (o, _)| o.agent_id != id);
        self.pass(now)
    }

    /// Agents of the cluster, offered to the queue or not (the master's agent inventory,
    /// protocol 14): each summary replaces what the queue knew of the agent's attributes and
    /// GPUs (healthy ones, as offers carry them), and its capacity becomes what it could ever
    /// give the queue's role. So the never-fit check, reservations and estimates judge the
    /// whole cluster, not only the agents the declared demand has drawn offers from. No pass
    /// runs here (thousands of agents may register one by one): what the queue can launch
    /// comes with offers, and each offer's pass sees the new knowledge.
    pub fn agents(&mut self, summaries: &[AgentSummary]) {
        for s in summaries {
            let known = self.agents.entry(s.agent_id).or_insert_with(|| KnownAgent {
                hostname: String::new(),
                attributes: Attributes::new(),
                gpus: BTreeMap::new(),
                capacity: Resources::new(),
                listed: true,
            });
            known.listed = true;
            known.hostname.clone_from(&s.hostname);
            known.attributes.clone_from(&s.attributes);
            known.gpus = s
                .gpus
                .iter()
                .filter(|g| g.healthy)
                .map(|g| (g.uuid.clone(), FreeGpu::from(g)))
                .collect();
            known.capacity = s.for_role(&self.config.role);
        }
    }

    /// The agents the queue knows of (from the master's inventory or seen in offers, not
    /// removed since), and their GPUs.
    pub fn known_agents(&self) -> (usize, usize) {
        let gpus = self.agents.values().map(|a| a.gpus.len()).sum();
        (self.agents.len(), gpus)
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
        self.touched.insert(job_id);
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return out;
        };
        let Some(m) = job.members.get_mut(&index) else {
            return out;
        };
        if !u.gpus.is_empty() {
            m.gpus = u.gpus.clone();
        }
        m.state = u.state;
        if !u.state.is_terminal() {
            return out;
        }
        let killing = m.killing;
        self.worker_ended.insert(m.agent_id, now);
        let gpus = job.spec.gpus;
        let ran = m.held_secs(now);
        let cost = self
            .agents
            .get(&m.agent_id)
            .and_then(|a| a.cost_per_sec(&member_resources(&job.spec)))
            .map(|per_sec| per_sec * ran);
        *self
            .stats
            .gpu_secs
            .entry(job.spec.team.clone())
            .or_default() += gpus.as_f64() * ran;
        self.ended_members.push(EndedMember {
            job: job_id,
            attempt: job.attempts,
            task_id: u.task_id,
            gpus,
            secs: ran,
            at: now,
            cost,
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

    /// Whether at least `limit` jobs are not yet ended ([`Core::active_jobs`] `>= limit`),
    /// without walking the queue while it holds fewer jobs than that in all.
    pub fn holds_active(&self, limit: usize) -> bool {
        self.jobs.len() >= limit
            && self
                .jobs
                .values()
                .filter(|j| !j.state.is_terminal())
                .nth(limit.saturating_sub(1))
                .is_some()
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
        let idle = self.idle_gpus(now);
        let secs = dt.as_secs_f64();
        let gpus = |milli: u64| milli as f64 / crate::model::GPU_MILLI as f64;
        if idle.eligible > 0 {
            self.stats.idle_while_eligible_gpu_secs += gpus(idle.eligible) * secs;
            self.stats.idle_while_eligible_secs += secs;
        }
        self.stats.reserved_idle_gpu_secs += gpus(idle.reserved) * secs;
        self.stats.settling_idle_gpu_secs += gpus(idle.settling) * secs;
        if let Some(hl) = self.config.usage_half_life.filter(|h| !h.is_zero()) {
            // Decay what was, then add what ran since the last tick.
            let keep = 0.5f64.powf(secs / hl.as_secs_f64());
            for v in self.decayed.values_mut() {
                *v *= keep;
            }
            for j in self.jobs.values() {
                let running = j
                    .members
                    .values()
                    .filter(|m| m.state == TaskState::Running)
                    .count();
                let gpus = j.spec.gpus.as_f64() * running as f64;
                if gpus > 0.0 {
                    *self.decayed.entry(j.spec.team.clone()).or_default() += gpus * secs;
                }
            }
        }
        self.pass(now)
    }

    /// A job's specification, as submitted.
    pub fn spec(&self, id: u64) -> Option<&JobSpec> {
        self.jobs.get(&id).map(|j| &j.spec)
    }

    /// A job's time limit: its own, else its team's default, else the cluster default.
    pub fn time_limit(&self, spec: &JobSpec) -> Option<Duration> {
        time_limit(&self.config, spec)
    }
}

/// A job's time limit under `config`: its own, else its team's default, else the cluster's.
fn time_limit(config: &CoreConfig, spec: &JobSpec) -> Option<Duration> {
    spec.time_limit_secs
        .map(Duration::from_secs)
        .or_else(|| config.team_time_limits.get(&spec.team).copied())
        .or(config.default_time_limit)
}

/// Ended jobs kept for the API (the oldest are forgotten first).
pub const MAX_ENDED_JOBS: usize = 10_000;

mod config;
mod demand;
mod estimate;
mod launch;
mod order;
mod order_cache;
mod pass;
#[cfg(test)]
mod pass_oracle;
mod persist;
mod preempt;
mod quota;
mod reserve;
mod shape;
mod spend;
mod submit;
mod timers;
mod views;

use reserve::{avail_ids, gang_of, remove, Parts, Reservation};

pub use config::{CoreConfig, MAX_RETRY_BACKOFF};
pub use estimate::{MAX_ESTIMATED, MAX_START_TIMES};
pub use persist::Changes;

#[cfg(test)]
mod backfill_tests;
#[cfg(test)]
mod fraction_tests;
#[cfg(test)]
mod pass_tests;
#[cfg(test)]
mod quota_tests;
#[cfg(test)]
mod retry_tests;
#[cfg(test)]
mod tests;
