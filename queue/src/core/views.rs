//! What the API shows: job views (with, for each pending job, why it waits and its position
//! in its team and in the whole queue), queue depth, GPU time per team; and the jobs no agent
//! of the cluster can ever fit ([`Core::never_fits`]), refused at submission.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::{Core, Job};
use crate::model::{fmt_milli, JobSpec, JobState, JobView, MemberView, Priority};

/// Where the pending jobs stand, computed once per listing.
struct Standings {
    /// Eligible jobs in scheduling order.
    order: Vec<u64>,
    /// Per eligible job: its index in `order` and its position among its team's jobs (0-based).
    at: HashMap<u64, (usize, usize)>,
    /// GPUs per team its running workers hold.
    team_gpus: HashMap<String, super::order::TeamUsage>,
    /// Milli-GPUs free now for the queue (capacity minus its workers).
    free_gpus: u64,
    /// The job the reservation (or a preemption under way) is for.
    reserved_for: Option<u64>,
    /// Estimated starts of the first eligible jobs, Unix milliseconds (with a wall clock).
    starts: HashMap<u64, u64>,
    /// Per array (its first job's id): jobs per state.
    arrays: HashMap<u64, BTreeMap<String, u32>>,
}

impl Core {
    /// Every job, for the API (without estimated starts: see [`Core::views_at`]).
    pub fn views(&self, now: Instant) -> Vec<JobView> {
        let st = self.standings(now, None);
        self.jobs
            .values()
            .map(|j| self.view_of(j, now, &st))
            .collect()
    }

    /// Every job, for the API, with pending jobs' estimated starts (`wall_ms`: the wall clock
    /// at `now`, Unix milliseconds).
    pub fn views_at(&self, now: Instant, wall_ms: u64) -> Vec<JobView> {
        let st = self.standings(now, Some(wall_ms));
        self.jobs
            .values()
            .map(|j| self.view_of(j, now, &st))
            .collect()
    }

    /// Whether job `id` ended (`None`: the queue does not know it, or no longer: ended jobs
    /// past [`super::MAX_ENDED_JOBS`] are forgotten).
    pub fn job_ended(&self, id: u64) -> Option<bool> {
        self.jobs.get(&id).map(|j| j.state.is_terminal())
    }

    /// One job, for the API.
    pub fn view(&self, id: u64, now: Instant) -> Option<JobView> {
        let job = self.jobs.get(&id)?;
        Some(self.view_of(job, now, &self.standings(now, None)))
    }

    /// One job, for the API, with its estimated start (see [`Core::views_at`]).
    pub fn view_at(&self, id: u64, now: Instant, wall_ms: u64) -> Option<JobView> {
        let job = self.jobs.get(&id)?;
        Some(self.view_of(job, now, &self.standings(now, Some(wall_ms))))
    }

    fn standings(&self, now: Instant, wall_ms: Option<u64>) -> Standings {
        let order = self.order(now);
        let mut per_team: HashMap<&str, usize> = HashMap::new();
        let mut at = HashMap::new();
        for (i, id) in order.iter().enumerate() {
            let team = self.jobs[id].spec.team.as_str();
            let n = per_team.entry(team).or_default();
            at.insert(*id, (i, *n));
            *n += 1;
        }
        let team_gpus = self.usage(now);
        let free_gpus = self
            .eventual_views(false)
            .iter()
            .flat_map(|v| v.gpus.iter().map(|g| u64::from(g.free_milli)))
            .sum();
        let reserved_for = self
            .preempt_for
            .as_ref()
            .map(|p| p.0)
            .or_else(|| self.holds.holder().map(|(id, _)| *id));
        let starts = match wall_ms {
            Some(wall) => self
                .estimated_starts(now, &order)
                .into_iter()
                .map(|(id, t)| {
                    let ahead = t.saturating_duration_since(now).as_millis() as u64;
                    (id, wall.saturating_add(ahead))
                })
                .collect(),
            None => HashMap::new(),
        };
        let mut arrays: HashMap<u64, BTreeMap<String, u32>> = HashMap::new();
        for j in self.jobs.values() {
            if let Some(a) = j.spec.array_job {
                *arrays
                    .entry(a)
                    .or_default()
                    .entry(j.state.as_str().to_string())
                    .or_default() += 1;
            }
        }
        Standings {
            order,
            at,
            team_gpus,
            free_gpus,
            reserved_for,
            starts,
            arrays,
        }
    }

    /// Why no agent of the cluster can ever run `spec`, if none can: a worker needs more GPUs
    /// (of the model and memory asked for) than the largest agent has, or the gang's fewest
    /// workers do not fit all agents together. Judged on every agent the master's inventory
    /// lists (each healthy GPU, in use or not, up to what the queue's role could ever get
    /// there) and any other seen in offers; `None` while no agent is known yet.
    pub fn never_fits(&self, spec: &JobSpec) -> Option<String> {
        if self.agents.is_empty() || spec.gpus.is_zero() {
            return None;
        }
        let selector = spec.selector();
        let per_agent: Vec<u64> = self
            .agents
            .values()
            .map(|a| {
                let matching = a
                    .gpus
                    .values()
                    .filter(|g| g.matches(selector.as_ref()))
                    .count() as u64;
                // From the inventory: other roles' reservations are not the queue's.
                let ours = a.capacity.milli("gpus") / gantry_sdk::protocol::resources::MILLI;
                if a.listed {
                    matching.min(ours)
                } else {
                    matching
                }
            })
            .collect();
        let largest = per_agent.iter().copied().max().unwrap_or(0);
        let kind = match (&spec.gpu_model, spec.gpu_min_memory) {
            (Some(m), Some(mem)) => format!("{m} GPUs with {mem} MiB"),
            (Some(m), None) => format!("{m} GPUs"),
            (None, Some(mem)) => format!("GPUs with {mem} MiB"),
            (None, None) => "GPUs".to_string(),
        };
        let gpus = spec.gpus.devices();
        if spec.gpus.is_fraction() {
            // A fraction needs one GPU of the kind asked for; a gang of them, room for its
            // fewest workers on all such GPUs together.
            if largest == 0 {
                return Some(format!(
                    "needs {} of one of the {kind}; the cluster has none",
                    spec.gpus
                ));
            }
            let workers = u64::from(spec.min_workers.max(1));
            let per_gpu = crate::model::GPU_MILLI / spec.gpus.milli();
            let room: u64 = per_agent.iter().map(|n| n * per_gpu).sum();
            return (room < workers).then(|| {
                format!(
                    "needs {workers} workers of {} of one of the {kind}; the cluster has room \
                     for {room} such workers",
                    spec.gpus
                )
            });
        }
        if gpus > largest {
            return Some(format!(
                "needs {gpus} {kind} on one agent; largest is {largest}"
            ));
        }
        let workers = u64::from(spec.min_workers.max(1));
        let room: u64 = per_agent.iter().map(|n| n / gpus).sum();
        if room < workers {
            return Some(format!(
                "needs {workers} workers of {gpus} {kind} ({} in all); the cluster has room \
                 for {room} such workers",
                workers * gpus
            ));
        }
        None
    }

    /// Why a submission of `spec` is refused as never fitting: [`Core::never_fits`], unless
    /// the cluster is elastic (`CoreConfig::elastic`), where a node that fits may still come.
    pub fn refusal(&self, spec: &JobSpec) -> Option<String> {
        if self.config.elastic {
            return None;
        }
        self.never_fits(spec)
    }

    /// Why pending job `j` waits, in words.
    fn pending_reason(&self, j: &Job, now: Instant, st: &Standings) -> String {
        if let Some(why) = self.never_fits(&j.spec) {
            if self.config.elastic {
                return format!("no agent fits it yet ({why}): waiting for the cluster to grow");
            }
            return why;
        }
        if let Some(t) = j.not_before {
            return format!(
                "retry {} of {} after a failure, in {} s",
                j.retries,
                j.spec.max_retries,
                t.saturating_duration_since(now).as_secs_f64().ceil()
            );
        }
        let Some(&(i, _)) = st.at.get(&j.id) else {
            return "waiting".into();
        };
        if st.reserved_for == Some(j.id) {
            return "next to run: GPUs are reserved for it as running jobs end".into();
        }
        let mine = self.effective(j, now);
        let higher = st.order[..i]
            .iter()
            .filter(|id| self.effective(&self.jobs[*id], now) > mine)
            .count();
        if higher > 0 {
            let s = if higher == 1 { "" } else { "s" };
            return format!("behind {higher} higher-priority job{s}");
        }
        let team = &j.spec.team;
        let need = super::quota::need(&j.spec);
        let none = super::order::TeamUsage::default();
        let usage = st.team_gpus.get(team).unwrap_or(&none);
        if let Some(b) = self.borrow_block(&j.spec, &st.team_gpus) {
            return b.reason(team);
        }
        let bucket = Self::job_bucket(self.named_models(), &j.spec);
        if let Some(quota) = self.quota_in(team, bucket.as_deref()) {
            let used = usage.in_bucket(bucket.as_deref());
            if used + need > quota {
                let model = bucket.as_ref().map_or(String::new(), |m| format!("{m} "));
                return format!(
                    "team {team} at its {model}quota {}/{}",
                    fmt_milli(used),
                    fmt_milli(quota)
                );
            }
        }
        if let Some(why) = self.lend_blocked.get(&j.id) {
            return why.clone();
        }
        let need = super::quota::need(&j.spec);
        if let Some(h) = st
            .reserved_for
            .filter(|h| st.at.get(h).is_some_and(|a| a.0 < i))
        {
            if need <= st.free_gpus {
                return format!("reserved for job {h}");
            }
        }
        if i > 0 {
            let s = if i == 1 { "" } else { "s" };
            return format!("behind {i} job{s} of the same priority (fair share, then age)");
        }
        if need > 0 {
            format!(
                "waiting for {} free GPUs ({} free now)",
                fmt_milli(need),
                fmt_milli(st.free_gpus)
            )
        } else {
            "waiting for CPUs and memory".into()
        }
    }

    fn view_of(&self, j: &Job, now: Instant, st: &Standings) -> JobView {
        let waiting = if j.state == JobState::Pending && !j.on_deps {
            now.saturating_duration_since(j.waiting_since)
        } else {
            Duration::ZERO
        };
        let waiting_on: Vec<u64> = if j.state == JobState::Pending {
            j.spec
                .after
                .iter()
                .copied()
                .filter(|d| {
                    self.jobs
                        .get(d)
                        .is_none_or(|dj| dj.state != JobState::Finished)
                })
                .collect()
        } else {
            Vec::new()
        };
        let message = if j.on_deps && !waiting_on.is_empty() {
            let ids: Vec<String> = waiting_on.iter().map(u64::to_string).collect();
            format!("waiting on dependencies: {}", ids.join(", "))
        } else {
            j.message.clone()
        };
        let pending_reason = (j.state == JobState::Pending).then(|| {
            if j.on_deps {
                message.clone()
            } else {
                self.pending_reason(j, now, st)
            }
        });
        let mut agents: Vec<String> = j.members.values().map(|m| m.hostname.clone()).collect();
        agents.sort();
        agents.dedup();
        JobView {
            id: j.id,
            name: j.spec.name.clone(),
            team: j.spec.team.clone(),
            priority: j.spec.priority,
            effective_priority: self.effective(j, now),
            state: j.state,
            workers: j.running_members(),
            min_workers: j.spec.min_workers,
            max_workers: j.spec.max_workers,
            gpus_per_worker: j.spec.gpus,
            preemptions: j.preemptions,
            waited_secs: (j.waited + waiting).as_secs_f64(),
            deadline_unix: j.spec.deadline_unix,
            agents,
            members: j
                .members
                .iter()
                .map(|(i, m)| MemberView {
                    index: *i,
                    task: format!("{}/{i}", j.spec.name),
                    task_id: m.task_id.to_string(),
                    agent: m.hostname.clone(),
                    gpus: m.gpus.clone(),
                    state: m.state.as_str().to_string(),
                })
                .collect(),
            message,
            age_secs: now.saturating_duration_since(j.submitted).as_secs_f64(),
            after: j.spec.after.clone(),
            waiting_on,
            user: j.user.clone(),
            attempts: j.attempts,
            retries: j.retries,
            pending_reason,
            position: st.at.get(&j.id).map(|a| a.0 as u32 + 1),
            team_position: st.at.get(&j.id).map(|a| a.1 as u32 + 1),
            array_job: j.spec.array_job,
            array_index: j.spec.array_index,
            array_summary: (j.spec.array_job == Some(j.id))
                .then(|| st.arrays.get(&j.id).cloned())
                .flatten(),
            estimated_start_unix_ms: (j.state == JobState::Pending)
                .then(|| st.starts.get(&j.id).copied())
                .flatten(),
        }
    }

    /// Pending jobs per (team, priority).
    pub fn depth(&self) -> BTreeMap<(String, Priority), u64> {
        let mut d = BTreeMap::new();
        for j in self.jobs.values().filter(|j| j.state == JobState::Pending) {
            *d.entry((j.spec.team.clone(), j.spec.priority)).or_default() += 1;
        }
        d
    }

    /// GPU-seconds per team so far, the workers it holds now included (from their launch).
    pub fn gpu_secs(&self, now: Instant) -> BTreeMap<String, f64> {
        let mut out = self.stats.gpu_secs.clone();
        for j in self.jobs.values() {
            for m in j.members.values() {
                *out.entry(j.spec.team.clone()).or_default() +=
                    j.spec.gpus.as_f64() * m.held_secs(now);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
