//! The order of the eligible jobs kept across passes ([`OrderCache`]): per team, an ordered
//! set of its eligible jobs by the job's own part of the order key ([`JobKey`]: effective
//! priority, quota, deadline, age), which the team's part (its share and GPU-seconds, the same
//! for all its jobs) does not reorder. A pass walks the queue to find the eligible jobs (and
//! the least worker) but keys again only the jobs that are new, requeued, or due: a job's
//! effective priority changes at its next aging step (a timed re-key, [`Core::key_due`]), and
//! a job with a deadline is keyed every pass (its urgency follows the wall clock). No sort of
//! the whole queue: each team's list comes out of its set in order.
//!
//! Used only while no team has a GPU quota: a job's "over its quota" changes with its team's
//! usage (and per model with its bucket), so with quotas every pass keys every job
//! ([`Core::keyed_least`]). The property test (`pass_tests`) checks the pass against the full
//! pass of `pass_oracle`, with and without quotas, across aging steps and deadlines.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::order::{Keyed, OrderKey, TeamUsage};
use super::shape::Least;
use super::{Core, Job, Priority};

/// A job's own part of its order key: `u8::MAX` less its effective priority's rank, whether
/// it is over its team's quota (always false here), its deadline, its submission, its id.
pub(super) type JobKey = (u8, bool, u64, Instant, u64);

/// The full order key of a job with own part `k` in a team with part `t`.
pub(super) fn full(k: &JobKey, t: (u64, u64)) -> OrderKey {
    (k.0, k.1, t.0, t.1, k.2, k.3, k.4)
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct OrderCache {
    /// Per team, its cached jobs in order.
    teams: HashMap<String, BTreeSet<JobKey>>,
    /// Per cached job: its team, key, the start of the wait it was keyed for, when it must be
    /// keyed again (`None`: never, while that wait lasts), and the last walk that saw it.
    jobs: HashMap<u64, Cached>,
    walk: u64,
}

#[derive(Debug)]
struct Cached {
    team: String,
    key: JobKey,
    waiting_since: Instant,
    due: Option<Instant>,
    seen: u64,
}

/// Aging steps are computed in floating point ([`Core::effective`]): a job is keyed again a
/// little before its next step is due, and every pass until the step has come.
const STEP_MARGIN: Duration = Duration::from_millis(1);

impl Core {
    /// When `job`'s own key may change next, keyed at `now` (`None`: not while it waits):
    /// its next aging step (a little before), unless it is at `high` by then; `now` for a job
    /// with a deadline.
    pub(super) fn key_due(&self, job: &Job, now: Instant) -> Option<Instant> {
        if job.spec.priority >= Priority::High {
            return None;
        }
        if job.spec.deadline_unix.is_some() {
            return Some(now);
        }
        let aging = self.config.aging;
        if aging.is_zero() {
            return None;
        }
        let waited = now.saturating_duration_since(job.waiting_since);
        let steps = (waited.as_secs_f64() / aging.as_secs_f64()) as u8;
        if job.spec.priority.rank().saturating_add(steps) >= Priority::High.rank() {
            return None;
        }
        let next = aging.checked_mul(u32::from(steps) + 1)?;
        job.waiting_since
            .checked_add(next)
            .map(|t| t.checked_sub(STEP_MARGIN).unwrap_or(t))
    }

    /// As [`Core::keyed_least`], from the order kept across passes (see the module
    /// documentation); `None` while a team has a GPU quota.
    pub(super) fn keyed_cached(
        &mut self,
        usage: &HashMap<String, TeamUsage>,
        totals: (u64, u64),
        now: Instant,
    ) -> Option<Keyed> {
        if self.config.teams.values().any(|t| t.has_quota()) {
            self.order_cache = OrderCache::default();
            return None;
        }
        let mut cache = std::mem::take(&mut self.order_cache);
        cache.walk += 1;
        let walk = cache.walk;
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut least = Least::NONE;
        let mut seen = 0usize;
        for j in self.jobs.values().filter(|j| Self::eligible(j)) {
            match counts.get_mut(j.spec.team.as_str()) {
                Some(n) => *n += 1,
                None => {
                    counts.insert(j.spec.team.clone(), 1);
                }
            }
            least.add(&j.spec);
            seen += 1;
            if let Some(c) = cache.jobs.get_mut(&j.id) {
                if c.waiting_since == j.waiting_since && c.due.is_none_or(|d| now < d) {
                    c.seen = walk;
                    continue;
                }
                if let Some(set) = cache.teams.get_mut(&c.team) {
                    set.remove(&c.key);
                }
            }
            let key = self.own_key(j, now);
            cache
                .teams
                .entry(j.spec.team.clone())
                .or_default()
                .insert(key);
            cache.jobs.insert(
                j.id,
                Cached {
                    team: j.spec.team.clone(),
                    key,
                    waiting_since: j.waiting_since,
                    due: self.key_due(j, now),
                    seen: walk,
                },
            );
        }
        if cache.jobs.len() > seen {
            // Jobs no longer eligible (launched, cancelled, ended, forgotten).
            let teams = &mut cache.teams;
            cache.jobs.retain(|_, c| {
                if c.seen != walk {
                    if let Some(set) = teams.get_mut(&c.team) {
                        set.remove(&c.key);
                    }
                }
                c.seen == walk
            });
            cache.teams.retain(|_, s| !s.is_empty());
        }
        let level = self.level_among(usage, &counts);
        let none = TeamUsage::default();
        let lists: Vec<VecDeque<(OrderKey, u64)>> = counts
            .keys()
            .map(|team| {
                let used = usage.get(team).unwrap_or(&none);
                let tk = self.team_key(team, used, totals, level);
                cache.teams.get(team).map_or_else(VecDeque::new, |set| {
                    set.iter().map(|k| (full(k, tk), k.4)).collect()
                })
            })
            .collect();
        self.order_cache = cache;
        #[cfg(test)]
        {
            // The kept order is the full keying's (`keyed_least`), job for job.
            let full = self.keyed_least(usage, totals, now);
            assert_eq!(full.teams, counts, "teams");
            assert_eq!(
                full.lists, lists,
                "the kept order differs from a full keying"
            );
        }
        Some(Keyed {
            teams: counts,
            level,
            lists,
            fixed: true,
            least,
        })
    }

    /// A job's own part of its order key, with no quota (see [`Core::order_key`]).
    fn own_key(&self, job: &Job, now: Instant) -> JobKey {
        (
            u8::MAX - self.effective(job, now).rank(),
            false,
            job.spec.deadline_unix.unwrap_or(u64::MAX),
            job.submitted,
            job.id,
        )
    }
}
