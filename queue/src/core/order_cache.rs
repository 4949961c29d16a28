//! The order of the eligible jobs kept across passes ([`OrderCache`]): per team, an ordered
//! set of its eligible jobs by the job's own part of the order key ([`JobKey`]: effective
//! priority, quota, deadline, age), which the team's part (its share and GPU-seconds, the same
//! for all its jobs) does not reorder. With it are kept what the pass needs of the eligible
//! jobs as a whole: per team their number, their least worker ([`Least`], from a count per
//! worker shape) and one job per gang shape. A pass does not walk the queue: it looks again
//! only at the jobs touched since the last pass (`touched`, and those a store commit took
//! meanwhile: [`OrderCache::note`]) and those due to be keyed again (a job's effective
//! priority changes at its next aging step, [`Core::key_due`]; a job with a deadline is keyed
//! every pass, its urgency following the wall clock). Eligibility (state, dependencies,
//! retry backoff) and the start of a job's wait change only where the core touches the job
//! (the store relies on the same). The first pass, and the first after a restore, keys every
//! job.
//!
//! A pass reads the kept order in place ([`TeamList`]: each team's set through an iterator,
//! the team's part of the key applied as it reads). The jobs submitted at `high` or above are
//! also kept apart per team, so that preemption finds the first blocked one without walking
//! the others ([`first_high`]). The timers' [`Watch`] is kept here too, for the same feed of
//! changed jobs.
//!
//! Used only while no team has a GPU quota: a job's "over its quota" changes with its team's
//! usage (and per model with its bucket), so with quotas every pass keys every job
//! ([`Core::keyed_least`]). In tests every pass checks the kept order, counts, least worker
//! and gang shapes against a walk of the queue, and the property test (`pass_tests`) checks
//! the pass against the full pass of `pass_oracle`, with and without quotas, across aging
//! steps, deadlines, retries and store commits.

use std::collections::{btree_set, vec_deque, BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::order::{Keyed, OrderKey, TeamUsage};
use super::shape::{Least, Shape};
use super::timers::Watch;
use super::{Core, Job, JobSpec, Priority};

/// A job's own part of its order key: `u8::MAX` less its effective priority's rank, whether
/// it is over its team's quota (for its team's usage at the pass's start), its deadline, its
/// submission, its id.
pub(super) type JobKey = (u8, bool, u64, Instant, u64);

/// The full order key of a job with own part `k` in a team with part `t`.
pub(super) fn full(k: &JobKey, t: (u64, u64)) -> OrderKey {
    (k.0, k.1, t.0, t.1, k.2, k.3, k.4)
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct OrderCache {
    /// Whether it holds every eligible job (false until the first pass keys them all, and
    /// after a reset).
    primed: bool,
    /// Per team, its cached jobs in order.
    teams: HashMap<String, BTreeSet<JobKey>>,
    /// Per team, those of its cached jobs submitted at `high` or above (the only ones that
    /// preempt), in order: the pass finds the first without walking the rest.
    high: HashMap<String, BTreeSet<JobKey>>,
    /// Per cached job: its team, key, the start of the wait it was keyed for, when it must be
    /// keyed again (`None`: never, while that wait lasts) and its least worker's amounts.
    jobs: HashMap<u64, Cached>,
    /// The cached jobs that must be keyed again by a time, by that time.
    due: BTreeSet<(Instant, u64)>,
    /// Per worker shape (CPUs and memory as bits, GPUs) of the cached jobs: how many jobs have
    /// it (the least worker is taken over these).
    shapes: HashMap<(u64, u64, crate::model::Gpus), usize>,
    /// Per gang shape of the cached jobs: one job's specification (placement depends only on
    /// the shape) and how many jobs have it.
    gangs: Vec<(Shape, JobSpec, usize)>,
    /// Jobs changed since the last pass whose change the store commit took
    /// ([`Core::take_changes`] drains `touched`): looked at again in the next pass.
    dirty: BTreeSet<u64>,
    /// The jobs the timers watch (kept here for the same feed of changed jobs).
    pub(super) watch: Watch,
    /// With quotas: per team, the usage its jobs' "over its quota" was keyed for (milli-GPUs
    /// in all and per named model); a team whose usage moved is keyed again.
    quota_used: HashMap<String, (u64, BTreeMap<String, u64>)>,
}

#[derive(Debug)]
struct Cached {
    team: String,
    key: JobKey,
    waiting_since: Instant,
    due: Option<Instant>,
    shape: (u64, u64, crate::model::Gpus),
    gang: Shape,
}

impl OrderCache {
    /// Notes jobs changed since the last pass (see `dirty`).
    pub(super) fn note(&mut self, ids: &BTreeSet<u64>) {
        self.watch.note(ids);
        if self.primed {
            self.dirty.extend(ids.iter().copied());
        }
    }

    /// Per team of `teams` (with the team part of its jobs' keys in `keys`), its kept jobs in
    /// order, read in place.
    pub(super) fn lists(&self, teams: &[String], keys: &[(u64, u64)]) -> Vec<TeamList<'_>> {
        teams
            .iter()
            .zip(keys)
            .map(|(team, tk)| TeamList::Kept {
                team: *tk,
                rest: self.teams.get(team).map(|s| s.iter()),
                high: self.high.get(team),
            })
            .collect()
    }

    /// Flips the quota bit of the cached job whose key is `old` (its team's usage moved it
    /// across its quota): only its place in its team's sets changes.
    fn flip(&mut self, old: JobKey) {
        let Some(c) = self.jobs.get_mut(&old.4) else {
            return;
        };
        let new = (old.0, !old.1, old.2, old.3, old.4);
        for sets in [&mut self.teams, &mut self.high] {
            if let Some(set) = sets.get_mut(&c.team) {
                if set.remove(&old) {
                    set.insert(new);
                }
            }
        }
        c.key = new;
    }

    /// Forgets job `id`.
    fn remove(&mut self, id: u64) {
        let Some(c) = self.jobs.remove(&id) else {
            return;
        };
        for sets in [&mut self.teams, &mut self.high] {
            if let Some(set) = sets.get_mut(&c.team) {
                set.remove(&c.key);
                if set.is_empty() {
                    sets.remove(&c.team);
                }
            }
        }
        if let Some(d) = c.due {
            self.due.remove(&(d, id));
        }
        if let Some(n) = self.shapes.get_mut(&c.shape) {
            *n -= 1;
            if *n == 0 {
                self.shapes.remove(&c.shape);
            }
        }
        if let Some(i) = self.gangs.iter().position(|g| g.0 == c.gang) {
            self.gangs[i].2 -= 1;
            if self.gangs[i].2 == 0 {
                self.gangs.swap_remove(i);
            }
        }
    }

    /// Caches eligible job `job` with own key `key`, to be keyed again at `due`.
    fn insert(&mut self, job: &Job, key: JobKey, due: Option<Instant>) {
        let shape = Least::parts(&job.spec);
        self.teams
            .entry(job.spec.team.clone())
            .or_default()
            .insert(key);
        if job.spec.priority >= Priority::High {
            self.high
                .entry(job.spec.team.clone())
                .or_default()
                .insert(key);
        }
        if let Some(d) = due {
            self.due.insert((d, job.id));
        }
        *self.shapes.entry(shape).or_default() += 1;
        let gang = Shape::of(&job.spec);
        match self.gangs.iter_mut().find(|g| g.0 == gang) {
            Some(g) => g.2 += 1,
            None => self.gangs.push((gang.clone(), job.spec.clone(), 1)),
        }
        self.jobs.insert(
            job.id,
            Cached {
                team: job.spec.team.clone(),
                key,
                waiting_since: job.waiting_since,
                due,
                shape,
                gang,
            },
        );
    }
}

/// A team's eligible jobs in order, with their order keys, as a pass takes them (the least
/// head of all teams first): read in place from the kept order, or keyed for this pass.
#[derive(Debug, Clone)]
pub(super) enum TeamList<'a> {
    /// From the kept order ([`OrderCache::lists`]): the jobs' own keys not yet taken, and the
    /// team's part of their keys.
    Kept {
        team: (u64, u64),
        rest: Option<btree_set::Iter<'a, JobKey>>,
        /// Those of its jobs submitted at `high` or above.
        high: Option<&'a BTreeSet<JobKey>>,
    },
    /// Keyed for this pass ([`Core::keyed_least`]).
    Keyed(VecDeque<(OrderKey, u64)>),
    /// The rest of a kept list whose quota bits a launch in this pass changed: its jobs' own
    /// keys (bits updated), in order, and the team's part of their keys.
    Owned {
        team: (u64, u64),
        list: VecDeque<JobKey>,
    },
}

impl TeamList<'_> {
    /// Its jobs not yet taken, in order.
    pub(super) fn cursor(&self) -> Cursor<'_> {
        match self {
            TeamList::Kept { team, rest, .. } => Cursor::Kept(*team, rest.clone()),
            TeamList::Keyed(list) => Cursor::Keyed(list.iter()),
            TeamList::Owned { team, list } => Cursor::Owned(*team, list.iter()),
        }
    }

    /// Its next job.
    pub(super) fn front(&self) -> Option<(OrderKey, u64)> {
        self.cursor().next()
    }

    /// Takes its next job.
    pub(super) fn pop_front(&mut self) -> Option<(OrderKey, u64)> {
        match self {
            TeamList::Kept { team, rest, .. } => {
                rest.as_mut()?.next().map(|k| (full(k, *team), k.4))
            }
            TeamList::Keyed(list) => list.pop_front(),
            TeamList::Owned { team, list } => list.pop_front().map(|k| (full(&k, *team), k.4)),
        }
    }

    /// Its first job not yet taken that was submitted at `high` or above and passes `ok`
    /// (`high`: whether job `id` was), with its key. From the kept order only those jobs are
    /// looked at; a keyed list is walked while its keys rank at `high` or above (those of such
    /// jobs do, and they rank first).
    fn first_high(
        &self,
        high: &dyn Fn(u64) -> bool,
        ok: &dyn Fn(u64) -> bool,
    ) -> Option<(OrderKey, u64)> {
        match self {
            TeamList::Kept {
                team,
                rest,
                high: h,
            } => {
                let from = rest.clone()?.next()?;
                h.and_then(|h| {
                    h.range(from..)
                        .map(|k| (full(k, *team), k.4))
                        .find(|(_, id)| ok(*id))
                })
            }
            TeamList::Keyed(list) => {
                let ranked_high = u8::MAX - Priority::High.rank();
                list.iter()
                    .take_while(|(k, _)| k.0 <= ranked_high)
                    .find(|(_, id)| high(*id) && ok(*id))
                    .copied()
            }
            TeamList::Owned { team, list } => {
                let ranked_high = u8::MAX - Priority::High.rank();
                list.iter()
                    .take_while(|k| k.0 <= ranked_high)
                    .find(|k| high(k.4) && ok(k.4))
                    .map(|k| (full(k, *team), k.4))
            }
        }
    }
}

/// The first job in order among the jobs not yet taken of `lists` that was submitted at
/// `high` or above and passes `ok` (see [`TeamList::first_high`]).
pub(super) fn first_high(
    lists: &[TeamList<'_>],
    high: &dyn Fn(u64) -> bool,
    ok: &dyn Fn(u64) -> bool,
) -> Option<u64> {
    lists
        .iter()
        .filter_map(|l| l.first_high(high, ok))
        .min()
        .map(|(_, id)| id)
}

/// A [`TeamList`]'s jobs from where it is, in order.
#[derive(Clone)]
pub(super) enum Cursor<'a> {
    Kept((u64, u64), Option<btree_set::Iter<'a, JobKey>>),
    Keyed(vec_deque::Iter<'a, (OrderKey, u64)>),
    Owned((u64, u64), vec_deque::Iter<'a, JobKey>),
}

impl Iterator for Cursor<'_> {
    type Item = (OrderKey, u64);

    fn next(&mut self) -> Option<(OrderKey, u64)> {
        match self {
            Cursor::Kept(team, rest) => rest.as_mut()?.next().map(|k| (full(k, *team), k.4)),
            Cursor::Keyed(list) => list.next().copied(),
            Cursor::Owned(team, list) => list.next().map(|k| (full(k, *team), k.4)),
        }
    }
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
    /// documentation).
    pub(super) fn keyed_cached(
        &mut self,
        usage: &HashMap<String, TeamUsage>,
        now: Instant,
    ) -> Option<Keyed> {
        let quotas = self.config.teams.values().any(|t| t.has_quota());
        let none = TeamUsage::default();
        let used = |team: &str| usage.get(team).unwrap_or(&none);
        let mut cache = std::mem::take(&mut self.order_cache);
        if !cache.primed {
            // Every eligible job keyed (the first pass, or after a reset).
            cache = OrderCache {
                primed: true,
                watch: std::mem::take(&mut cache.watch),
                ..OrderCache::default()
            };
            for j in self.jobs.values().filter(|j| Self::eligible(j)) {
                let key = self.own_key(j, quotas.then(|| used(&j.spec.team)), now);
                cache.insert(j, key, self.key_due(j, now));
            }
        } else {
            // Only the jobs changed since the last pass (`touched`, and those a store commit
            // took meanwhile) and those due to be keyed again can differ: eligibility
            // (state, dependencies, backoff) and the wait's start change only with a touch.
            let mut ids = std::mem::take(&mut cache.dirty);
            ids.extend(self.touched.iter().copied());
            // With quotas, a job's "over its quota" moves with its team's usage: every job of
            // a team whose usage changed since the last pass is keyed again (only those).
            // Of the teams whose usage moved, only the jobs whose side of the quota moved
            // change: their bit is flipped in place (those changed otherwise are then keyed
            // again below, with the same usage).
            if quotas {
                let mut flips: Vec<JobKey> = Vec::new();
                for (team, set) in &cache.teams {
                    let u = used(team);
                    if cache.quota_used.get(team) != Some(&(u.gpus, u.models.clone())) {
                        let over = self.over_quota_in(team, u);
                        flips.extend(set.iter().filter(|k| k.1 != over(&self.jobs[&k.4].spec)));
                    }
                }
                for k in flips {
                    cache.flip(k);
                }
            }
            while let Some(&(d, id)) = cache.due.first() {
                if now < d {
                    break;
                }
                // (Its entry keeps `due`: the check below keys it again.)
                cache.due.pop_first();
                ids.insert(id);
            }
            for id in ids {
                let job = self.jobs.get(&id).filter(|j| Self::eligible(j));
                if let (Some(j), Some(c)) = (job, cache.jobs.get(&id)) {
                    if c.waiting_since == j.waiting_since && c.due.is_none_or(|d| now < d) {
                        continue;
                    }
                }
                cache.remove(id);
                if let Some(j) = job {
                    let key = self.own_key(j, quotas.then(|| used(&j.spec.team)), now);
                    cache.insert(j, key, self.key_due(j, now));
                }
            }
        }
        cache.quota_used = if quotas {
            cache
                .teams
                .keys()
                .map(|t| {
                    let u = used(t);
                    (t.clone(), (u.gpus, u.models.clone()))
                })
                .collect()
        } else {
            HashMap::new()
        };
        let counts: BTreeMap<String, usize> = cache
            .teams
            .iter()
            .map(|(t, s)| (t.clone(), s.len()))
            .collect();
        let mut least = Least::NONE;
        for &(cpus, mem, gpus) in cache.shapes.keys() {
            least.add_parts(f64::from_bits(cpus), f64::from_bits(mem), gpus);
        }
        let level = self.level_among(usage, &counts);
        let shapes: Vec<JobSpec> = cache.gangs.iter().map(|g| g.1.clone()).collect();
        #[cfg(test)]
        {
            // The gang shapes kept are those of the eligible jobs, with their counts.
            let mut walked: Vec<(Shape, usize)> = Vec::new();
            for j in self.jobs.values().filter(|j| Self::eligible(j)) {
                let g = Shape::of(&j.spec);
                match walked.iter_mut().find(|w| w.0 == g) {
                    Some(w) => w.1 += 1,
                    None => walked.push((g, 1)),
                }
            }
            assert_eq!(walked.len(), cache.gangs.len(), "gang shapes");
            // The jobs kept apart as submitted at `high` or above are exactly those.
            for (team, set) in &cache.teams {
                let high: BTreeSet<JobKey> = set
                    .iter()
                    .filter(|k| self.jobs[&k.4].spec.priority >= Priority::High)
                    .copied()
                    .collect();
                let kept = cache.high.get(team).cloned().unwrap_or_default();
                assert_eq!(high, kept, "high jobs of {team}");
            }
            assert!(cache.high.keys().all(|t| cache.teams.contains_key(t)));
            for (g, n) in &walked {
                assert!(
                    cache
                        .gangs
                        .iter()
                        .any(|c| c.0 == *g && c.2 == *n && Shape::of(&c.1) == *g),
                    "gang shape {g:?} x {n}"
                );
            }
        }
        self.order_cache = cache;
        #[cfg(test)]
        {
            // The kept order is the full keying's (`keyed_least`), job for job.
            let totals = self.totals();
            let full = self.keyed_least(usage, totals, now);
            assert_eq!(full.teams, counts, "teams");
            assert_eq!(full.least, least, "the least worker");
            let names: Vec<String> = counts.keys().cloned().collect();
            let kept: Vec<VecDeque<(OrderKey, u64)>> = self
                .order_cache
                .lists(&names, &self.team_keys(&names, usage, totals, level))
                .iter()
                .map(|l| l.cursor().collect())
                .collect();
            assert_eq!(
                full.lists, kept,
                "the kept order differs from a full keying"
            );
        }
        Some(Keyed {
            teams: counts,
            level,
            // Read in place from the kept order ([`OrderCache::lists`]).
            lists: Vec::new(),
            fixed: true,
            least,
            shapes: Some(shapes),
        })
    }

    /// The team part of the order key ([`Core::team_key`]) of each of `teams`.
    pub(super) fn team_keys(
        &self,
        teams: &[String],
        usage: &HashMap<String, TeamUsage>,
        totals: (u64, u64),
        level: f64,
    ) -> Vec<(u64, u64)> {
        let none = TeamUsage::default();
        teams
            .iter()
            .map(|team| self.team_key(team, usage.get(team).unwrap_or(&none), totals, level))
            .collect()
    }

    /// A job's own part of its order key (see [`Core::order_key`]); with quotas, `used` is its
    /// team's usage (whether the job is over its quota).
    fn own_key(&self, job: &Job, used: Option<&TeamUsage>, now: Instant) -> JobKey {
        (
            u8::MAX - self.effective(job, now).rank(),
            used.is_some_and(|u| self.over_quota(&job.spec, self.named_models(), u)),
            job.spec.deadline_unix.unwrap_or(u64::MAX),
            job.submitted,
            job.id,
        )
    }
}
