//! The order of pending jobs ([`Core::order`]): effective priority (aging, deadline urgency),
//! quota, the team's weighted dominant share with one unit counted, its GPU-seconds per weight,
//! deadline and age; and the teams' usage it is computed from.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use gantry_sdk::protocol::resources::MILLI;

use super::shape::Least;
use super::{Core, Job, JobSpec, JobState, Priority, TeamConfig};

impl Core {
    pub(super) fn team(&self, team: &str) -> &TeamConfig {
        static DEFAULT: std::sync::OnceLock<TeamConfig> = std::sync::OnceLock::new();
        self.config
            .teams
            .get(team)
            .unwrap_or_else(|| DEFAULT.get_or_init(TeamConfig::default))
    }

    /// Effective priority class: aging (one class per `aging` waited), and a deadline's
    /// urgency (one class within two aging intervals of its latest start, two within one; 5
    /// minutes when aging is off); up to `high`.
    pub(super) fn effective(&self, job: &Job, now: Instant) -> Priority {
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
    pub(super) fn usage(&self, now: Instant) -> HashMap<String, TeamUsage> {
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
        let named = self.named_models();
        // Only jobs with workers use anything (a queue holds many pending jobs).
        for j in self.with_members() {
            let e = match u.get_mut(j.spec.team.as_str()) {
                Some(e) => e,
                None => u.entry(j.spec.team.clone()).or_default(),
            };
            e.gpus += j.spec.gpus.milli() * j.members.len() as u64;
            if !j.members.is_empty() && !j.spec.gpus.is_zero() && !named.is_empty() {
                for (b, n) in self.job_buckets(j, named) {
                    if let Some(b) = b {
                        *e.models.entry(b).or_default() += n;
                    }
                }
            }
            e.cpus += (j.spec.cpus * MILLI as f64) as u64 * j.members.len() as u64;
            if !decays {
                for m in j.members.values() {
                    e.gpu_secs += j.spec.gpus.as_f64() * m.held_secs(now);
                }
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
    pub(super) fn order_key(
        &self,
        job: &Job,
        used: &TeamUsage,
        team: (u64, u64),
        now: Instant,
    ) -> OrderKey {
        (
            u8::MAX - self.effective(job, now).rank(),
            self.over_quota(&job.spec, self.named_models(), used),
            team.0,
            team.1,
            job.spec.deadline_unix.unwrap_or(u64::MAX),
            job.submitted,
            job.id,
        )
    }

    /// What every job of `team` has in its order key: its weighted dominant share with one
    /// unit counted and its GPU-seconds per weight (see [`Core::order_key`]).
    pub(super) fn team_key(
        &self,
        team: &str,
        used: &TeamUsage,
        totals: (u64, u64),
        level: f64,
    ) -> (u64, u64) {
        let weight = self.team(team).weight.max(1e-6);
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
        let dominant = (share(used.gpus, totals.0.saturating_mul(MILLI))
            .max(share(used.cpus, totals.1))
            + unit)
            / weight;
        (
            (dominant * 1e9) as u64,
            (used.gpu_secs / weight * 1e3) as u64,
        )
    }

    /// The competing teams' (those with a job eligible to run) GPU-seconds per weight: their
    /// GPU-seconds over their weights' sum. A team below it has had less than its weight's
    /// share of their GPU time so far.
    pub(super) fn level(&self, usage: &HashMap<String, TeamUsage>) -> f64 {
        self.level_among(usage, &self.eligible_teams())
    }

    /// Per team, its jobs eligible to run.
    pub(super) fn eligible_teams(&self) -> BTreeMap<String, usize> {
        let mut teams: BTreeMap<String, usize> = BTreeMap::new();
        for j in self.jobs.values().filter(|j| Self::eligible(j)) {
            match teams.get_mut(j.spec.team.as_str()) {
                Some(n) => *n += 1,
                None => {
                    teams.insert(j.spec.team.clone(), 1);
                }
            }
        }
        teams
    }

    /// [`Core::level`] among `teams` (those with a count above 0).
    pub(super) fn level_among(
        &self,
        usage: &HashMap<String, TeamUsage>,
        teams: &BTreeMap<String, usize>,
    ) -> f64 {
        let (secs, weights) =
            teams
                .iter()
                .filter(|(_, n)| **n > 0)
                .fold((0.0, 0.0), |(s, w), (t, _)| {
                    (
                        s + usage.get(t).map_or(0.0, |u| u.gpu_secs),
                        w + self.team(t).weight.max(1e-6),
                    )
                });
        if weights > 0.0 {
            secs / weights
        } else {
            0.0
        }
    }

    /// In one walk of the queue: the teams with eligible jobs (and how many), their level
    /// ([`Core::level_among`]), per team its eligible jobs with their order keys, in order
    /// ([`Core::keyed_order`]), and the least worker of those jobs ([`Least`]).
    pub(super) fn keyed_least(
        &self,
        usage: &HashMap<String, TeamUsage>,
        totals: (u64, u64),
        now: Instant,
    ) -> Keyed {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut counts: Vec<(&str, usize)> = Vec::new();
        let mut eligible: Vec<(&Job, usize)> = Vec::new();
        let mut least = Least::NONE;
        for j in self.jobs.values().filter(|j| Self::eligible(j)) {
            let t = *seen.entry(j.spec.team.as_str()).or_insert_with(|| {
                counts.push((j.spec.team.as_str(), 0));
                counts.len() - 1
            });
            counts[t].1 += 1;
            least.add(&j.spec);
            eligible.push((j, t));
        }
        let teams: BTreeMap<String, usize> =
            counts.iter().map(|(t, n)| (t.to_string(), *n)).collect();
        // Index in `teams` (by name) of each team in the order seen.
        let at: Vec<usize> = counts
            .iter()
            .map(|(t, _)| teams.keys().take_while(|k| k.as_str() < *t).count())
            .collect();
        let level = self.level_among(usage, &teams);
        let none = TeamUsage::default();
        let per_team: Vec<(&TeamUsage, (u64, u64))> = counts
            .iter()
            .map(|(t, _)| {
                let used = usage.get(*t).unwrap_or(&none);
                (used, self.team_key(t, used, totals, level))
            })
            .collect();
        let mut keyed: Vec<(OrderKey, u64, usize)> = eligible
            .into_iter()
            .map(|(j, t)| {
                let (used, team) = per_team[t];
                (self.order_key(j, used, team, now), j.id, at[t])
            })
            .collect();
        keyed.sort_unstable_by_key(|e| (e.0, e.1));
        let mut lists: Vec<VecDeque<(OrderKey, u64)>> = vec![VecDeque::new(); teams.len()];
        for (key, id, t) in keyed {
            lists[t].push_back((key, id));
        }
        Keyed {
            teams,
            level,
            lists,
            fixed: false,
            least,
            shapes: None,
        }
    }

    /// Eligible jobs with their order keys and their team's index in `teams` (the names of
    /// the teams with eligible jobs, as [`Core::eligible_teams`] orders them), in order.
    pub(super) fn keyed_order(
        &self,
        usage: &HashMap<String, TeamUsage>,
        teams: &[&str],
        totals: (u64, u64),
        level: f64,
        now: Instant,
    ) -> Vec<(OrderKey, u64, usize)> {
        let none = TeamUsage::default();
        let per_team: HashMap<&str, (usize, &TeamUsage, (u64, u64))> = teams
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let used = usage.get(*t).unwrap_or(&none);
                (*t, (i, used, self.team_key(t, used, totals, level)))
            })
            .collect();
        let mut keyed: Vec<(OrderKey, u64, usize)> = self
            .jobs
            .values()
            .filter(|j| Self::eligible(j))
            .filter_map(|j| {
                let (i, used, team) = per_team.get(j.spec.team.as_str())?;
                Some((self.order_key(j, used, *team, now), j.id, *i))
            })
            .collect();
        keyed.sort_unstable_by_key(|e| (e.0, e.1));
        keyed
    }

    /// Pending jobs in scheduling order, as of now (usage counted as is).
    pub fn order(&self, now: Instant) -> Vec<u64> {
        let usage = self.usage(now);
        let level = self.level(&usage);
        let totals = self.totals();
        let teams = self.eligible_teams();
        let names: Vec<&str> = teams.keys().map(String::as_str).collect();
        self.keyed_order(&usage, &names, totals, level, now)
            .into_iter()
            .map(|(_, id, _)| id)
            .collect()
    }

    pub(super) fn totals(&self) -> (u64, u64) {
        self.agents.values().fold((0, 0), |(g, c), a| {
            (
                g + a.capacity.milli("gpus") / MILLI,
                c + a.capacity.milli("cpus"),
            )
        })
    }
}

/// What [`Core::keyed_least`] returns.
pub(super) struct Keyed {
    /// The teams with eligible jobs, and how many each has.
    pub(super) teams: BTreeMap<String, usize>,
    /// Their level ([`Core::level_among`]).
    pub(super) level: f64,
    /// Per team (as `teams` orders them), its eligible jobs in order, with their keys.
    pub(super) lists: Vec<VecDeque<(OrderKey, u64)>>,
    /// Whether a job's own part of its key does not depend on its team's usage (no quotas):
    /// after a launch, only the team's part of its jobs' keys changes.
    pub(super) fixed: bool,
    /// Their least worker.
    pub(super) least: Least,
    /// One job's specification per gang shape among them ([`Shape`]), when known without a
    /// walk (from the kept order).
    pub(super) shapes: Option<Vec<JobSpec>>,
}

/// A team's usage, for ordering.
#[derive(Debug, Clone, Default)]
pub(super) struct TeamUsage {
    /// Milli-GPUs its members hold (a half-GPU worker holds 500).
    pub(super) gpus: u64,
    /// CPUs (milli) its members hold.
    pub(super) cpus: u64,
    /// GPU-seconds used so far, running members included.
    pub(super) gpu_secs: f64,
    /// Milli-GPUs its members hold of each model named in a per-model quota (see `quota`).
    pub(super) models: BTreeMap<String, u64>,
}

/// A pending job's place in the order (smaller first; see [`Core::order_key`]).
pub(super) type OrderKey = (u8, bool, u64, u64, u64, Instant, u64);

impl TeamUsage {
    /// The milli-GPUs it holds in a quota bucket (a named model's, or every other GPU's).
    pub(super) fn in_bucket(&self, bucket: Option<&str>) -> u64 {
        match bucket {
            Some(m) => self.models.get(m).copied().unwrap_or(0),
            None => self.gpus - self.models.values().sum::<u64>().min(self.gpus),
        }
    }
}
