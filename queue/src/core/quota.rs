//! Teams' quotas: nominal GPU quotas, overall and per GPU model, borrowing limits and lending
//! limits (Kueue's `nominalQuota`, `borrowingLimit` and `lendingLimit`).
//!
//! GPUs fall into **buckets**: one per GPU model some team names in a per-model quota (a GPU
//! is in the first named model, in name order, its name contains, case-insensitively, as a
//! job's `gpu_model` matches), and one for every other GPU. A team's overall quota
//! (`gpu_quota`) is its nominal quota in that last bucket, and its per-model quotas in theirs;
//! in a named model's bucket a team that has some quota but not that model's has 0 there (all
//! it uses of that model is borrowed), and a team without any quota has none anywhere (as
//! before per-model quotas: never ordered as over quota, all it uses counts as borrowed for
//! reclaim). With no per-model quota anywhere there is one bucket, and the overall quota covers
//! every GPU, as it always did.
//!
//! A team's use of a bucket counts the GPUs its workers hold there, by each GPU's model (a
//! worker whose GPUs are not known yet counts in its job's bucket). A pending job counts
//! against the bucket of the model it asks for (`gpu_model` equal to a named model), else
//! the other bucket: a job that names no model and lands on another team's named model
//! borrows those GPUs, and may be reclaimed.
//!
//! Every amount here is in **milli-GPUs** (a worker of `gpus: 0.5` holds 500; quotas and
//! limits, given in GPUs, count 1000 each): a team with a quota of 1 runs two half-GPU jobs
//! within it.
//!
//! - **Borrowing limit** (`team_borrow_limits`): a team uses at most its nominal GPUs in all
//!   plus its overall limit; jobs and elastic growth that would go past it wait. A limit for a
//!   named model caps its use of that bucket at its quota there plus the limit: a job asking
//!   for the model waits past it, and a plan that would put the team's GPUs there past it is
//!   refused (a job naming no model may not borrow that model's GPUs beyond it either).
//! - **Lending limit** (`team_lend_limits`): of a team's idle nominal quota in a bucket, other
//!   teams may borrow at most this much (the bucket's own limit, else the team's overall
//!   one); the rest (`quota - used - limit`) stays free for it.
//!   A job that borrows (its team is above its quota in the job's bucket with it, or has no
//!   quota) launches only where the GPUs it takes leave every bucket they come from with at
//!   least what other teams keep there.
//! - **Reclaim** (the pass and `preempt`): a blocked job whose team stays within its quota in
//!   the job's bucket preempts borrowed GPUs of that bucket: jobs of other teams above their
//!   quota there, each no larger than what its team borrows there.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gantry_sdk::placement::gang;
use gantry_sdk::placement::offers::AgentView;
use gantry_sdk::placement::offers::Plan as GangPlan;

use super::order::TeamUsage;
use super::{Core, Job, JobSpec};
use crate::model::{fmt_milli, GPU_MILLI};

/// A quota bucket: a GPU model some team names, or `None` for every other GPU.
pub(super) type Bucket = Option<String>;

/// The milli-GPUs a job needs to start: its gang's fewest workers.
pub(super) fn need(spec: &JobSpec) -> u64 {
    spec.gpus.milli() * u64::from(spec.min_workers.max(1))
}

/// GPUs (a quota, a limit) in milli-GPUs.
pub(super) fn milli(gpus: u64) -> u64 {
    gpus.saturating_mul(GPU_MILLI)
}

impl Core {
    /// The models some team names in a per-model quota.
    pub(super) fn named_models(&self) -> &BTreeSet<String> {
        &self.named
    }

    /// The bucket of a GPU of model `model` (the GPU's name).
    pub(super) fn gpu_bucket(named: &BTreeSet<String>, model: &str) -> Bucket {
        let model = model.to_lowercase();
        named
            .iter()
            .find(|n| model.contains(&n.to_lowercase()))
            .cloned()
    }

    /// The bucket a job counts against before it runs: the named model it asks for, else the
    /// other GPUs'.
    pub(super) fn job_bucket(named: &BTreeSet<String>, spec: &JobSpec) -> Bucket {
        let want = spec.gpu_model.as_deref()?;
        named.iter().find(|n| n.eq_ignore_ascii_case(want)).cloned()
    }

    /// A team's nominal quota in `bucket`, milli-GPUs (`None`: the team has no quota at all,
    /// or no overall quota for the other bucket).
    pub(super) fn quota_in(&self, team: &str, bucket: Option<&str>) -> Option<u64> {
        let t = self.team(team);
        match bucket {
            None => t.gpu_quota.map(milli),
            Some(m) if t.has_quota() => Some(milli(t.model_quotas.get(m).copied().unwrap_or(0))),
            Some(_) => None,
        }
    }

    /// Milli-GPUs a job's workers hold, per bucket: by each GPU's model; a worker's GPUs not
    /// known yet count in the job's bucket.
    pub(super) fn job_buckets(&self, job: &Job, named: &BTreeSet<String>) -> BTreeMap<Bucket, u64> {
        let mut out: BTreeMap<Bucket, u64> = BTreeMap::new();
        let per = job.spec.gpus.milli();
        if per == 0 {
            return out;
        }
        if named.is_empty() {
            out.insert(None, per * job.members.len() as u64);
            return out;
        }
        // Each device a worker holds: a whole GPU, or the fraction's share of one.
        let devices = job.spec.gpus.devices();
        let each = per / devices.max(1);
        let own = Self::job_bucket(named, &job.spec);
        for m in job.members.values() {
            let agent = self.agents.get(&m.agent_id);
            let mut counted = 0;
            for uuid in m.gpus.iter().take(devices as usize) {
                let Some(g) = agent.and_then(|a| a.gpus.get(uuid)) else {
                    continue;
                };
                *out.entry(Self::gpu_bucket(named, &g.model)).or_default() += each;
                counted += each;
            }
            if counted < per {
                *out.entry(own.clone()).or_default() += per - counted;
            }
        }
        out
    }

    /// Whether `spec`'s job keeps its team within its quota in the job's bucket (reclaim).
    pub(super) fn within_quota(
        &self,
        spec: &JobSpec,
        named: &BTreeSet<String>,
        usage: &HashMap<String, TeamUsage>,
    ) -> bool {
        let bucket = Self::job_bucket(named, spec);
        let used = usage
            .get(&spec.team)
            .map_or(0, |u| u.in_bucket(bucket.as_deref()));
        let need = need(spec);
        need > 0
            && self
                .quota_in(&spec.team, bucket.as_deref())
                .is_some_and(|q| used + need <= q)
    }

    /// [`Core::over_quota`] for the jobs of `team` at usage `used`, with the team's quotas and
    /// usage per bucket looked up once (a team's thousands of jobs are checked in a row).
    pub(super) fn over_quota_in<'a>(
        &'a self,
        team: &str,
        used: &TeamUsage,
    ) -> impl Fn(&JobSpec) -> bool + 'a {
        let named = self.named_models();
        let slot = |b: Option<&str>| self.quota_in(team, b).map(|q| (q, used.in_bucket(b)));
        let other = slot(None);
        let models: Vec<(&'a str, Option<(u64, u64)>)> = named
            .iter()
            .map(|m| (m.as_str(), slot(Some(m.as_str()))))
            .collect();
        move |spec: &JobSpec| {
            let slot = match spec.gpu_model.as_deref() {
                None => other,
                Some(want) => match models.iter().find(|(m, _)| m.eq_ignore_ascii_case(want)) {
                    Some((_, s)) => *s,
                    None => other,
                },
            };
            slot.is_some_and(|(q, u)| u + need(spec) > q)
        }
    }

    /// Whether `spec`'s job takes its team above its quota in the job's bucket (ordered after
    /// jobs within their quotas). A team without any quota is never above it.
    pub(super) fn over_quota(
        &self,
        spec: &JobSpec,
        named: &BTreeSet<String>,
        used: &TeamUsage,
    ) -> bool {
        let bucket = Self::job_bucket(named, spec);
        self.quota_in(&spec.team, bucket.as_deref())
            .is_some_and(|q| used.in_bucket(bucket.as_deref()) + need(spec) > q)
    }

    /// Whether `spec`'s job would take its team past a borrowing limit
    /// ([`super::CoreConfig::team_borrow_limits`]).
    pub(super) fn over_borrow_limit(
        &self,
        spec: &JobSpec,
        usage: &HashMap<String, TeamUsage>,
    ) -> bool {
        self.borrow_block(spec, usage).is_some()
    }

    /// The borrowing limit `spec`'s job would take its team past, if any: the overall one,
    /// else that of the named model the job asks for.
    pub(super) fn borrow_block(
        &self,
        spec: &JobSpec,
        usage: &HashMap<String, TeamUsage>,
    ) -> Option<BorrowBlock<'_>> {
        let need = need(spec);
        if need == 0 {
            return None;
        }
        let limit = self.config.team_borrow_limits.get(&spec.team)?;
        let t = self.team(&spec.team);
        if !t.has_quota() {
            return None;
        }
        let used = usage.get(&spec.team);
        if let Some(all) = limit.all {
            let total = used.map_or(0, |u| u.gpus);
            let nominal = t.nominal_gpus();
            if total + need > milli(nominal + all) {
                return Some(BorrowBlock {
                    model: None,
                    used: total,
                    nominal: milli(nominal),
                    limit: all,
                });
            }
        }
        if limit.models.is_empty() {
            return None;
        }
        let bucket = Self::job_bucket(self.named_models(), spec)?;
        self.model_borrow_block(&spec.team, &bucket, need, used)
    }

    /// How many more milli-GPUs `spec`'s team may take for it before a borrowing limit: the
    /// overall one, and that of the named model the job asks for (`None`: no limit).
    pub(super) fn borrow_room(
        &self,
        spec: &JobSpec,
        usage: &HashMap<String, TeamUsage>,
    ) -> Option<u64> {
        let limit = self.config.team_borrow_limits.get(&spec.team)?;
        let t = self.team(&spec.team);
        if !t.has_quota() {
            return None;
        }
        let used = usage.get(&spec.team);
        let all = limit
            .all
            .map(|all| milli(t.nominal_gpus() + all).saturating_sub(used.map_or(0, |u| u.gpus)));
        let model = Self::job_bucket(self.named_models(), spec).and_then(|m| {
            let lim = limit.model(&m)?;
            let quota = self.quota_in(&spec.team, Some(&m))?;
            Some((quota + milli(lim)).saturating_sub(used.map_or(0, |u| u.in_bucket(Some(&m)))))
        });
        match (all, model) {
            (Some(a), Some(m)) => Some(a.min(m)),
            (a, m) => a.or(m),
        }
    }

    /// The limit of `model`'s bucket that `more` milli-GPUs there would take `team` past.
    fn model_borrow_block(
        &self,
        team: &str,
        model: &str,
        more: u64,
        used: Option<&TeamUsage>,
    ) -> Option<BorrowBlock<'_>> {
        let (name, &limit) = self
            .config
            .team_borrow_limits
            .get(team)?
            .models
            .iter()
            .find(|(m, _)| m.eq_ignore_ascii_case(model))?;
        let quota = self.quota_in(team, Some(model))?;
        let there = used.map_or(0, |u| u.in_bucket(Some(model)));
        (there + more > quota + milli(limit)).then_some(BorrowBlock {
            model: Some(name),
            used: there,
            nominal: quota,
            limit,
        })
    }

    /// Why `spec`'s job may not launch with `plan` on `views` (the free views before it), if
    /// it may not: the GPUs it takes would put its team past a named model's borrowing limit
    /// (a job naming no model that lands on that model), or leave a bucket with fewer free
    /// GPUs than other teams keep there by their lending limits.
    pub(super) fn plan_block(
        &self,
        spec: &JobSpec,
        plan: &GangPlan,
        views: &[AgentView],
        usage: &HashMap<String, TeamUsage>,
    ) -> Option<String> {
        if spec.gpus.is_zero() {
            return None;
        }
        let models_limited = self
            .config
            .team_borrow_limits
            .get(&spec.team)
            .is_some_and(|l| !l.models.is_empty());
        if models_limited {
            let named = self.named_models();
            let per_device = spec.gpus.milli() / spec.gpus.devices().max(1);
            let mut taken: BTreeMap<String, u64> = BTreeMap::new();
            for a in &plan.assignments {
                let Some(v) = views.get(a.agent) else {
                    continue;
                };
                for uuid in &a.gpus {
                    let model = v.gpus.iter().find(|g| &g.uuid == uuid).map(|g| &g.model);
                    if let Some(b) = model.and_then(|m| Self::gpu_bucket(named, m)) {
                        *taken.entry(b).or_default() += per_device;
                    }
                }
            }
            let used = usage.get(&spec.team);
            for (model, more) in taken {
                if let Some(b) = self.model_borrow_block(&spec.team, &model, more, used) {
                    return Some(b.reason(&spec.team));
                }
            }
        }
        self.lending_block(spec, plan, views, usage)
    }

    /// Per bucket: the milli-GPUs other teams than `team` keep free by their lending limits (their
    /// idle nominal quota there beyond what they lend).
    fn kept_free(
        &self,
        team: &str,
        named: &BTreeSet<String>,
        usage: &HashMap<String, TeamUsage>,
    ) -> BTreeMap<Bucket, (u64, Vec<String>)> {
        let mut out: BTreeMap<Bucket, (u64, Vec<String>)> = BTreeMap::new();
        let buckets: Vec<Bucket> = std::iter::once(None)
            .chain(named.iter().cloned().map(Some))
            .collect();
        for (other, lend) in &self.config.team_lend_limits {
            if other == team {
                continue;
            }
            for b in &buckets {
                let own = b.as_deref().and_then(|m| lend.model(m));
                let Some(lend) = own.or(lend.all) else {
                    continue;
                };
                let Some(q) = self.quota_in(other, b.as_deref()) else {
                    continue;
                };
                let used = usage.get(other).map_or(0, |u| u.in_bucket(b.as_deref()));
                let keep = q.saturating_sub(used).saturating_sub(milli(lend));
                if keep > 0 {
                    let e = out.entry(b.clone()).or_default();
                    e.0 += keep;
                    e.1.push(other.clone());
                }
            }
        }
        out
    }

    /// After [`Core::plan_block`] refused a plan for `spec`'s job: a plan on `base` (what it
    /// was placed on) without the GPUs of the buckets where the job may not take even one
    /// more device (a named model's borrowing limit reached, or other teams' lending limits
    /// keeping all that is free there), if one exists and passes; with `base` after it. A
    /// borrower then takes the GPUs its limits leave it (Kueue's flavor fungibility) instead
    /// of waiting on the first bucket its placement chose.
    pub(super) fn replan_within_limits(
        &self,
        spec: &JobSpec,
        gang: &gang::GangRequest,
        mut base: Vec<AgentView>,
        views: &[AgentView],
        usage: &HashMap<String, TeamUsage>,
    ) -> Option<(GangPlan, Vec<AgentView>)> {
        let closed = self.closed_buckets(spec, views, usage);
        if closed.is_empty() {
            return None;
        }
        let named = self.named_models();
        for v in &mut base {
            v.gpus
                .retain(|g| !closed.contains(&Self::gpu_bucket(named, &g.model)));
        }
        let plan = gang::place_gang(&mut base, gang)?;
        self.plan_block(spec, &plan, views, usage)
            .is_none()
            .then_some((plan, base))
    }

    /// The buckets where `spec`'s job may not take one more device (see
    /// [`Core::replan_within_limits`]).
    fn closed_buckets(
        &self,
        spec: &JobSpec,
        views: &[AgentView],
        usage: &HashMap<String, TeamUsage>,
    ) -> BTreeSet<Bucket> {
        let named = self.named_models();
        let per_device = spec.gpus.milli() / spec.gpus.devices().max(1);
        let used = usage.get(&spec.team);
        let mut closed = BTreeSet::new();
        if let Some(limit) = self.config.team_borrow_limits.get(&spec.team) {
            for model in limit.models.keys() {
                let Some(b) = named.iter().find(|n| n.eq_ignore_ascii_case(model)) else {
                    continue;
                };
                if self
                    .model_borrow_block(&spec.team, b, per_device, used)
                    .is_some()
                {
                    closed.insert(Some(b.clone()));
                }
            }
        }
        if self.borrows(spec, named, usage) {
            let kept = self.kept_free(&spec.team, named, usage);
            let mut free: BTreeMap<Bucket, u64> = BTreeMap::new();
            for g in views.iter().flat_map(|v| &v.gpus) {
                *free.entry(Self::gpu_bucket(named, &g.model)).or_default() +=
                    u64::from(g.free_milli);
            }
            for (b, (keep, _)) in kept {
                if free.get(&b).copied().unwrap_or(0) < keep + per_device {
                    closed.insert(b);
                }
            }
        }
        closed
    }

    /// Whether `spec`'s job, which needs GPUs, borrows: its team goes above its quota in the
    /// job's bucket with it, or has no quota there.
    fn borrows(
        &self,
        spec: &JobSpec,
        named: &BTreeSet<String>,
        usage: &HashMap<String, TeamUsage>,
    ) -> bool {
        !self.within_quota(spec, named, usage)
    }

    /// Why `spec`'s job may not launch with `plan` on `views` (the free views before it) by
    /// other teams' lending limits, if it may not: it borrows, and the GPUs it takes leave a
    /// bucket they come from with fewer free GPUs than other teams keep there.
    fn lending_block(
        &self,
        spec: &JobSpec,
        plan: &GangPlan,
        views: &[AgentView],
        usage: &HashMap<String, TeamUsage>,
    ) -> Option<String> {
        if self.config.team_lend_limits.is_empty() || spec.gpus.is_zero() {
            return None;
        }
        let named = self.named_models();
        if !self.borrows(spec, named, usage) {
            return None;
        }
        let kept = self.kept_free(&spec.team, named, usage);
        if kept.is_empty() {
            return None;
        }
        let taken: BTreeSet<(usize, &str)> = plan
            .assignments
            .iter()
            .flat_map(|a| a.gpus.iter().map(move |g| (a.agent, g.as_str())))
            .collect();
        // Free milli-GPUs per bucket once the plan has taken its share (a whole GPU, or the
        // fraction of a shared one).
        let per_device = spec.gpus.milli() / spec.gpus.devices().max(1);
        let mut free: BTreeMap<Bucket, u64> = BTreeMap::new();
        let mut takes: BTreeSet<Bucket> = BTreeSet::new();
        for (i, v) in views.iter().enumerate() {
            for g in &v.gpus {
                let b = Self::gpu_bucket(named, &g.model);
                let mut left = u64::from(g.free_milli);
                if taken.contains(&(i, g.uuid.as_str())) {
                    takes.insert(b.clone());
                    left = left.saturating_sub(per_device);
                }
                *free.entry(b).or_default() += left;
            }
        }
        for b in takes {
            let Some((keep, teams)) = kept.get(&b) else {
                continue;
            };
            let left = free.get(&b).copied().unwrap_or(0);
            if left < *keep {
                let what = b.map_or_else(|| "GPUs".to_string(), |m| format!("{m} GPUs"));
                return Some(format!(
                    "lending limits keep {} idle {what} for team {} ({} would be left free)",
                    fmt_milli(*keep),
                    teams.join(", "),
                    fmt_milli(left)
                ));
            }
        }
        None
    }
}

/// A borrowing limit a job would take its team past ([`Core::borrow_block`]), in milli-GPUs
/// but for the limit (GPUs, as configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BorrowBlock<'a> {
    /// The named model whose limit it is; `None`: the overall limit.
    pub(super) model: Option<&'a str>,
    /// What the team uses (overall, or of the model).
    pub(super) used: u64,
    /// Its nominal GPUs (in all, or its quota of the model).
    pub(super) nominal: u64,
    /// The limit, GPUs.
    pub(super) limit: u64,
}

impl BorrowBlock<'_> {
    /// The pending reason: `team nlp at its borrowing limit: 12 GPUs used of 8 + 4` (`at its
    /// A100 borrowing limit` for a model's).
    pub(super) fn reason(&self, team: &str) -> String {
        let model = self.model.map_or(String::new(), |m| format!("{m} "));
        format!(
            "team {team} at its {model}borrowing limit: {} GPUs used of {} + {}",
            fmt_milli(self.used),
            fmt_milli(self.nominal),
            self.limit
        )
    }
}
