//! The core's tunables ([`CoreConfig`]), with the defaults `gantry-queue serve` starts from.

use std::collections::BTreeMap;
use std::time::Duration;

use gantry_sdk::placement::gang::HoldPolicy;

use crate::model::{TeamConfig, TeamLimit};

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
    /// After an accept or decline on an agent, offers of that agent that arrive within this
    /// long may be ones the master folded into it (its rule 2), rescinded on their way: a gang
    /// spanning several agents is not launched on them until this passes (or the rescind
    /// comes), since a lost accept there would launch it partially (`ZERO`: no wait, for the
    /// simulator, whose emulated master has nothing in flight).
    pub offer_settle: Duration,
    /// The file (in the task's sandbox) a preempted worker finds written at its warning.
    pub preempt_file: String,
    /// Where each job's checkpoint directory goes (`ROOT/job-ID`, in the workers'
    /// `GANTRY_QUEUE_CHECKPOINT_DIR`, made by the first worker with mode 0700): a path every
    /// agent mounts alike (a shared filesystem), kept across attempts. `None`: no directory.
    pub checkpoint_root: Option<String>,
    /// The first retry's backoff; each further retry doubles it, up to [`MAX_RETRY_BACKOFF`].
    pub retry_backoff: Duration,
    /// The most GPUs a team with a quota may use beyond it (`--team-borrow-limit`): overall
    /// (beyond its nominal GPUs in all) and per named GPU model (beyond its quota of that
    /// model); absent: no limit.
    pub team_borrow_limits: BTreeMap<String, TeamLimit>,
    /// The most of a team's idle nominal quota other teams may borrow (`--team-lend-limit`,
    /// Kueue's `lendingLimit`), per quota: a named model's own limit, else the overall one;
    /// the rest stays free for the team. Absent: all of it.
    pub team_lend_limits: BTreeMap<String, TeamLimit>,
    /// A team's time limit for its jobs submitted without one (`--team-time-limit`).
    pub team_time_limits: BTreeMap<String, Duration>,
    /// A job waiting this long whose team is below its weighted share of the GPUs (with the
    /// job) preempts `preemptible` jobs of teams above theirs (`--fair-share-wait`). `None`:
    /// never.
    pub fair_share_wait: Option<Duration>,
    /// Team budgets (`--team-budget`; [`crate::budget`]): submissions warned, then held.
    pub budgets: crate::budget::BudgetConfig,
    /// Fair-share usage decays with this half-life (Slurm's `PriorityDecayHalfLife`): a
    /// team's GPU-seconds in the ordering count half after one half-life. `None`: GPU-seconds
    /// since the start count forever.
    pub usage_half_life: Option<Duration>,
    /// The time limit of jobs with neither their own nor a team default
    /// (`--default-time-limit`); `None`: unlimited (they never backfill on reserved GPUs and a
    /// reservation behind them has no estimated start).
    pub default_time_limit: Option<Duration>,
    /// The cluster grows with demand (`--elastic`: an autoscaler adds nodes for the declared
    /// demand): a job that no agent seen so far could run is accepted and waits for one
    /// ([`super::Core::refusal`] says nothing), instead of being refused as never fitting.
    pub elastic: bool,
    /// The role the queue's framework subscribes in: what the master reserves for it on an
    /// agent counts towards what the agent could ever give the queue (the agent inventory,
    /// [`super::Core::agents`]); other roles' reservations do not.
    pub role: String,
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
            offer_settle: Duration::from_secs(1),
            preempt_file: "gpu-queue-preempted".into(),
            checkpoint_root: None,
            retry_backoff: Duration::from_secs(10),
            team_time_limits: BTreeMap::new(),
            team_borrow_limits: BTreeMap::new(),
            team_lend_limits: BTreeMap::new(),
            default_time_limit: None,
            usage_half_life: None,
            fair_share_wait: None,
            budgets: Default::default(),
            elastic: false,
            role: "*".into(),
        }
    }
}
