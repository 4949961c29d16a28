//! Preemption: which running workers to stop so that a blocked `critical`/`high` job fits
//! (see the parent module's documentation, step 4).

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use gantry_sdk::placement::gang;
use gantry_sdk::placement::offers::AgentView;
use gantry_sdk::protocol::*;

use super::{member_resources, request, Action, Core, JobState, Parts};
use crate::model::Priority;

impl Core {
    /// Chooses victims so that job `id` fits, and kills them (see the module documentation).
    ///
    /// With [`Victims::Borrowed`] (quota reclaim: `id`'s team is below its GPU quota), the
    /// victims are instead jobs of other teams above their quota (a team without one counts as
    /// quota 0) that they can lose without going below it, of any class but `critical`; with
    /// [`Victims::OverShare`] (`--fair-share-wait`), `preemptible` jobs of other teams above
    /// their weighted share of the GPUs that they can lose without going below it. Both take
    /// the lowest class first, then the newest.
    pub(super) fn preempt(
        &mut self,
        id: u64,
        free: &[AgentView],
        started: &BTreeSet<u64>,
        now: Instant,
        victims: Victims,
    ) -> Vec<Action> {
        let reclaim = victims != Victims::LowerClass;
        // Only fair-share victims need the teams' fair shares (all jobs are looked at).
        let fair = if victims == Victims::OverShare {
            self.fair_gpus()
        } else {
            HashMap::new()
        };
        let spec = self.jobs[&id].spec.clone();
        let member = request(&spec);
        let usage = self.usage(now);
        let used: HashMap<String, u64> = usage.iter().map(|(t, u)| (t.clone(), u.gpus)).collect();
        // Reclaim is per quota bucket (see `quota`): what each team borrows in the bucket the
        // reclaiming job counts against, and what each victim holds there.
        let named = self.named_models();
        let bucket = Self::job_bucket(named, &spec);
        let borrowed = |team: &str| {
            let quota = self.quota_in(team, bucket.as_deref()).unwrap_or(0);
            usage
                .get(team)
                .map_or(0, |u| u.in_bucket(bucket.as_deref()))
                .saturating_sub(quota)
        };
        // Victim units: an elastic gang's members above its minimum one by one (highest index
        // first), else whole jobs. (job, members, priority).
        let mut units: Vec<(u64, Vec<u32>, Priority)> = Vec::new();
        // Only running jobs are victims (a queue holds many pending ones).
        for j in self.with_members() {
            let gpus = j.spec.gpus.milli() * u64::from(j.running_members());
            let allowed = match victims {
                Victims::LowerClass => j.spec.priority < spec.priority,
                Victims::Borrowed => {
                    let there = if named.is_empty() {
                        gpus
                    } else {
                        self.job_buckets(j, named)
                            .get(&bucket)
                            .copied()
                            .unwrap_or(0)
                    };
                    j.spec.team != spec.team
                        && j.spec.priority < Priority::Critical
                        && there > 0
                        && there <= borrowed(&j.spec.team)
                }
                Victims::OverShare => {
                    let team = &j.spec.team;
                    let over = (used.get(team).copied().unwrap_or(0) as f64
                        - fair.get(team).copied().unwrap_or(0.0))
                    .max(0.0);
                    *team != spec.team
                        && j.spec.priority == Priority::Preemptible
                        && gpus as f64 <= over
                }
            };
            if j.state != JobState::Running || j.preempting || !allowed || started.contains(&j.id) {
                continue;
            }
            let n = j.running_members();
            let extra = gang::shrink_order(n, j.spec.min_workers, n);
            for &i in &extra {
                if j.members.contains_key(&i) {
                    units.push((j.id, vec![i], j.spec.priority));
                }
            }
            units.push((j.id, j.members.keys().copied().collect(), j.spec.priority));
        }
        if units.is_empty() {
            // Nobody may be preempted for it: nothing to look at (the views below cost a copy
            // of every agent; with quotas, reclaim asks every pass).
            return Vec::new();
        }
        // Per agent, the units with members there (an agent without any is never a place to
        // make room: it is skipped without a look at every unit).
        let mut units_on: HashMap<AgentId, Vec<usize>> = HashMap::new();
        for (u, (job_id, members, _)) in units.iter().enumerate() {
            let Some(job) = self.jobs.get(job_id) else {
                continue;
            };
            let mut agents: Vec<AgentId> = members
                .iter()
                .filter_map(|i| job.members.get(i).map(|m| m.agent_id))
                .collect();
            agents.sort_unstable();
            agents.dedup();
            for a in agents {
                units_on.entry(a).or_default().push(u);
            }
        }
        // Free views for every known agent: what is offered, and for an agent without an
        // offer in hand its capacity minus our workers (the master offers it again shortly:
        // a declined remainder must not make killing a larger job there look cheaper).
        let eventual = self.eventual_views(false);
        let mut work: Vec<AgentView> = eventual
            .into_iter()
            .map(|e| {
                free.iter()
                    .find(|v| v.agent_id == e.agent_id)
                    .cloned()
                    .unwrap_or(AgentView {
                        offer_ids: Vec::new(),
                        ..e
                    })
            })
            .collect();
        // Ties go by hostname, not by agent id.
        work.sort_by(|a, b| (&a.hostname, a.agent_id).cmp(&(&b.hostname, b.agent_id)));
        let mut chosen: Vec<usize> = Vec::new();
        // Members already counted as freed (a whole-job unit after some of its members were
        // picked one by one adds only the rest).
        let mut covered: BTreeSet<(u64, u32)> = BTreeSet::new();
        let mut parts: Parts = Vec::new();
        let reserve = |parts: &mut Parts, agent: AgentId, gpus: Vec<String>| match parts
            .iter_mut()
            .find(|p| p.0 == agent)
        {
            Some(p) => {
                p.1.add_assign(&member.resources);
                p.2.extend(gpus);
            }
            None => parts.push((agent, member.resources.clone(), gpus)),
        };
        for _ in 0..spec.min_workers.max(1) {
            if let Some(c) = gantry_sdk::placement::offers::place_one(&work, &member) {
                let agent = work[c.agent].agent_id;
                let gpus = gantry_sdk::placement::offers::take(&mut work, &member, &c);
                reserve(&mut parts, agent, gpus);
                continue;
            }
            // Per agent: add units (lowest class, then fewest GPUs) until the member fits.
            let mut best: Option<((u64, usize), usize, Vec<usize>)> = None;
            for (ai, view) in work.iter().enumerate() {
                let mut order: Vec<usize> = units_on
                    .get(&view.agent_id)
                    .map(|us| us.iter().copied().filter(|u| !chosen.contains(u)).collect())
                    .unwrap_or_default();
                if order.is_empty() {
                    // Nothing to preempt there (and it does not fit as it is: `place_one`
                    // above found no agent).
                    continue;
                }
                let mut trial = view.clone();
                let mut picked = Vec::new();
                // Reclaim takes the newest first; a preemption the fewest GPUs.
                let newest = |u: usize| {
                    let started = self.jobs.get(&units[u].0).and_then(|j| j.attempt_started);
                    std::cmp::Reverse(started.filter(|_| reclaim))
                };
                order.sort_by_key(|&u| {
                    (
                        units[u].2,
                        newest(u),
                        self.unit_on(&units[u], view.agent_id).1.milli("gpus"),
                        units[u].1.len(),
                    )
                });
                let mut fits =
                    gantry_sdk::placement::offers::place_one(std::slice::from_ref(&trial), &member)
                        .is_some();
                let mut counted = covered.clone();
                for u in order {
                    if fits {
                        break;
                    }
                    let rest = rest_of(&units[u], &counted);
                    let (n, res, gpus) = self.unit_on(&rest, view.agent_id);
                    if n == 0 {
                        continue;
                    }
                    counted.extend(rest.1.iter().map(|&i| (rest.0, i)));
                    self.give_back(&mut trial, &res, &gpus);
                    picked.push(u);
                    fits = gantry_sdk::placement::offers::place_one(
                        std::slice::from_ref(&trial),
                        &member,
                    )
                    .is_some();
                }
                if !fits || picked.is_empty() {
                    continue;
                }
                let cost: u64 = picked.iter().map(|&u| self.unit_gpus(&units[u])).sum();
                let key = (cost, picked.len());
                if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
                    best = Some((key, ai, picked));
                }
            }
            let Some((_, ai, picked)) = best else {
                return Vec::new(); // cannot be made to fit: kill nobody
            };
            // Apply: the picked units' resources on that agent join its free view, then the
            // member takes its share.
            for &u in &picked {
                let rest = rest_of(&units[u], &covered);
                let (_, res, gpus) = self.unit_on(&rest, work[ai].agent_id);
                covered.extend(rest.1.iter().map(|&i| (rest.0, i)));
                self.give_back(&mut work[ai], &res, &gpus);
                chosen.push(u);
            }
            work[ai]
                .gpus
                .sort_by(|a, b| (a.numa_node, &a.pci_bus_id).cmp(&(b.numa_node, &b.pci_bus_id)));
            let Some(mut c) = gantry_sdk::placement::offers::place_one(&work[ai..=ai], &member)
            else {
                return Vec::new();
            };
            c.agent = ai;
            let agent = work[ai].agent_id;
            let gpus = gantry_sdk::placement::offers::take(&mut work, &member, &c);
            reserve(&mut parts, agent, gpus);
        }
        if chosen.is_empty() {
            return Vec::new();
        }
        self.preempt_for = Some((id, parts, now));
        // Kill the chosen units: whole jobs are requeued when their members end; single
        // members of elastic gangs just stop.
        let mut out = Vec::new();
        let mut whole: BTreeSet<u64> = BTreeSet::new();
        for &u in &chosen {
            let (job_id, members, _) = &units[u];
            self.touched.insert(*job_id);
            let Some(job) = self.jobs.get_mut(job_id) else {
                continue;
            };
            // The whole-job unit lists every member; shrink units one member of a larger gang.
            if members.len() as u32 == job.running_members() {
                whole.insert(*job_id);
            }
            for i in members {
                if let Some(m) = job.members.get_mut(i) {
                    if !m.killing {
                        m.killing = true;
                        out.push(Action::KillFor(m.task_id, TaskReason::Preempted));
                    }
                }
            }
        }
        for job_id in whole {
            if let Some(job) = self.jobs.get_mut(&job_id) {
                job.preempting = true;
                job.message = format!("preempted for job {id}");
                for m in job.members.values_mut() {
                    if !m.killing {
                        m.killing = true;
                        out.push(Action::KillFor(m.task_id, TaskReason::Preempted));
                    }
                }
            }
        }
        out
    }

    /// Each team's weighted share of the cluster's GPUs, among the teams with work (running
    /// or eligible): GPUs × weight / the weights' sum.
    pub(super) fn fair_gpus(&self) -> HashMap<String, f64> {
        let teams: BTreeSet<&str> = self
            .jobs
            .values()
            .filter(|j| !j.members.is_empty() || Self::eligible(j))
            .map(|j| j.spec.team.as_str())
            .collect();
        let weights: f64 = teams.iter().map(|t| self.team(t).weight.max(1e-6)).sum();
        let total = self.totals().0 as f64 * crate::model::GPU_MILLI as f64;
        teams
            .iter()
            .map(|t| {
                (
                    t.to_string(),
                    total * self.team(t).weight.max(1e-6) / weights.max(1e-6),
                )
            })
            .collect()
    }

    /// A unit's members on `agent`: (count, resources, GPUs).
    fn unit_on(
        &self,
        unit: &(u64, Vec<u32>, Priority),
        agent: AgentId,
    ) -> (usize, Resources, Vec<String>) {
        let Some(job) = self.jobs.get(&unit.0) else {
            return (0, Resources::new(), Vec::new());
        };
        let res = member_resources(&job.spec);
        let mut total = Resources::new();
        let mut gpus = Vec::new();
        let mut n = 0;
        for i in &unit.1 {
            if let Some(m) = job.members.get(i).filter(|m| m.agent_id == agent) {
                n += 1;
                total.add_assign(&res);
                gpus.extend(m.gpus.iter().cloned());
            }
        }
        (n, total, gpus)
    }

    /// What victims free on `view`'s agent joins it: `res`, and each GPU of `gpus` its share
    /// (`res`'s GPUs over their number: whole, or a fraction of a GPU it shared).
    fn give_back(&self, view: &mut AgentView, res: &Resources, gpus: &[String]) {
        view.resources.add_assign(res);
        if gpus.is_empty() {
            return;
        }
        let each = u32::try_from(res.milli("gpus") / gpus.len() as u64).unwrap_or(u32::MAX);
        for g in gpus {
            if let Some(x) = view.gpus.iter_mut().find(|x| &x.uuid == g) {
                x.free_milli = x.free_milli.saturating_add(each).min(1000);
                continue;
            }
            if let Some(info) = self.agents.get(&view.agent_id).and_then(|a| a.gpus.get(g)) {
                let mut info = info.clone();
                info.free_milli = each.min(1000);
                view.gpus.push(info);
            }
        }
    }

    fn unit_gpus(&self, unit: &(u64, Vec<u32>, Priority)) -> u64 {
        self.jobs
            .get(&unit.0)
            .map_or(0, |j| j.spec.gpus.milli() * unit.1.len() as u64)
    }
}

/// Who may be preempted for a blocked job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Victims {
    /// Jobs of a lower class (a `critical` or `high` job's preemption).
    LowerClass,
    /// Borrowed GPUs: jobs of teams above their quota (quota reclaim).
    Borrowed,
    /// `preemptible` jobs of teams above their weighted share (`--fair-share-wait`).
    OverShare,
}

/// A victim unit without the members already in `covered`.
fn rest_of(
    unit: &(u64, Vec<u32>, Priority),
    covered: &BTreeSet<(u64, u32)>,
) -> (u64, Vec<u32>, Priority) {
    let members = unit
        .1
        .iter()
        .copied()
        .filter(|&i| !covered.contains(&(unit.0, i)))
        .collect();
    (unit.0, members, unit.2)
}
