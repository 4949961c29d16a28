//! What a scheduling pass ([`Core::pass`]) places with: the reservation where GPUs free
//! soonest ([`Core::reserve`]) and EASY backfill on it, the agents' views (offered now, or
//! eventually once running work ends), learned capacities, and the idle-GPU statistic
//! ([`Core::idle_gpus`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use gantry_sdk::placement::gang::{self, GangRequest};
use gantry_sdk::placement::offers::{self, AgentView, Plan, Score};
use gantry_sdk::protocol::*;

use super::shape::ShapeCache;
use super::{member_resources, request, time_limit, Core, Job, JobSpec, JobState, KnownAgent};

impl Core {
    /// Free GPUs (capacity minus ours, assuming the cluster is ours), split in three
    /// ([`IdleGpus`]): those the last pass kept for gangs whose offers are settling; of the
    /// rest, those a waiting job could start on now under the policy (outside the last pass's
    /// reservation while an eligible job's gang fits there; all of them when the reservation's
    /// holder, or a job that may backfill on it, fits), 0 when no job could; and those held for
    /// the reservation.
    pub(super) fn idle_gpus(&self, now: Instant) -> IdleGpus {
        let mut views = self.eventual_views(false);
        // Milli-GPUs: the free part of a GPU that fractions share counts.
        let count = |v: &[AgentView]| v.iter().map(|a| a.resources.milli("gpus")).sum::<u64>();
        let all = count(&views);
        if all == 0 {
            return IdleGpus::default();
        }
        // Kept for a gang until its offers settle: neither idle for others, nor is the gang a
        // job that waits for GPUs (it launches there once they settle).
        for (_, parts) in &self.last_settling {
            subtract(&mut views, parts);
        }
        let free = count(&views);
        let settling = all - free;
        if free == 0 {
            return IdleGpus {
                settling,
                ..IdleGpus::default()
            };
        }
        let mut outside = views.clone();
        let holder = self.last_reservation.as_ref().map(|r| {
            subtract(&mut outside, &r.parts);
            r.holder
        });
        let unreserved = count(&outside);
        let held = free - unreserved;
        // Once per gang shape, whatever the number of jobs.
        let (mut in_all, mut in_outside) = (ShapeCache::default(), ShapeCache::default());
        let eligible = || {
            self.jobs.values().filter(|j| {
                Self::eligible(j) && !self.last_settling.iter().any(|(id, _)| *id == j.id)
            })
        };
        let backfills = |j: &&Job| {
            self.last_reservation
                .as_ref()
                .is_some_and(|r| self.backfills(r, &j.spec, now))
        };
        let (eligible, reserved) = if eligible()
            .any(|j| holder == Some(j.id) && in_all.fits(&views, &j.spec))
        {
            (free, 0)
        } else if eligible()
            .any(|j| holder != Some(j.id) && backfills(&j) && in_all.fits(&views, &j.spec))
        {
            // EASY backfill: a job that ends before the reservation starts may use its GPUs.
            (free, 0)
        } else if eligible().any(|j| holder != Some(j.id) && in_outside.fits(&outside, &j.spec)) {
            (unreserved, held)
        } else {
            (0, held)
        };
        IdleGpus {
            eligible,
            reserved,
            settling,
        }
    }

    /// Whether a job of `spec` launched `now` may run on `reservation`'s GPUs (EASY backfill):
    /// its time limit ends by the reservation's estimated start.
    pub(super) fn backfills(
        &self,
        reservation: &Reservation,
        spec: &JobSpec,
        now: Instant,
    ) -> bool {
        match (reservation.start, time_limit(&self.config, spec)) {
            (Some(start), Some(limit)) => now + limit <= start,
            _ => false,
        }
    }

    /// Every running member of ours: its agent, amount and GPUs, and when it is expected to
    /// end: its attempt's launch plus the job's time limit (`now` when overdue or being killed
    /// on purpose), `None` when the job has no time limit.
    pub(super) fn member_ends(
        &self,
        now: Instant,
    ) -> Vec<(AgentId, Resources, Vec<String>, Option<Instant>)> {
        let mut out = Vec::new();
        for job in self.with_members() {
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
    pub(super) fn eventual_views(&self, all_end: bool) -> Vec<AgentView> {
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
        let index: HashMap<AgentId, usize> = views
            .iter()
            .enumerate()
            .map(|(i, v)| (v.agent_id, i))
            .collect();
        for job in self.with_members().filter(|_| !all_end) {
            let res = member_resources(&job.spec);
            for m in job.members.values().filter(|m| !m.killing) {
                if let Some(&i) = index.get(&m.agent_id) {
                    remove(&mut views[i..=i], m.agent_id, &res, &m.gpus);
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
    pub(super) fn kills_in_flight(&self) -> bool {
        self.with_members()
            .any(|j| j.state == JobState::Running && j.members.values().any(|m| m.killing))
    }

    pub(super) fn busy_gpus(&self) -> BTreeSet<(AgentId, String)> {
        self.with_members()
            .flat_map(|j| j.members.values())
            .flat_map(|m| m.gpus.iter().map(|g| (m.agent_id, g.clone())))
            .collect()
    }

    /// Learns agent capacities: offered now plus our members there (kept at the maximum seen).
    pub(super) fn learn_capacity(&mut self) {
        let mut seen: BTreeMap<AgentId, Resources> = BTreeMap::new();
        for (o, _) in self.offers.values() {
            seen.entry(o.agent_id).or_default().add_assign(&o.total());
        }
        for j in self.with_members() {
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

    /// The reservation for blocked job `id`: where its gang's fewest members go once running
    /// work ends, at the earliest time they fit by the running members' expected ends (their
    /// attempt's launch plus time limit; members being killed end now). At that time it prefers
    /// agents with the fewest GPUs idle now (then by hostname: not by agent id), so it reserves
    /// GPUs that are busy now rather than idle ones others could use. When it fits only once
    /// members without a time limit end, it has no estimated start.
    ///
    /// Computed without copying the cluster per probe: the agents' views with every member
    /// ended are kept across passes ([`ViewCache`]), an agent's view at a time is built only
    /// where members still run then and a member could fit, and the gang is placed on the
    /// agents the first members would go to (see [`place_on_best`]). In tests every call is
    /// checked against the plain computation (`reserve_reference`, in `pass_oracle`).
    pub(super) fn reserve(&self, id: u64, gang: &GangRequest, now: Instant) -> Option<Reservation> {
        let r = self.reserve_fast(id, gang, now);
        #[cfg(test)]
        assert_eq!(
            r,
            self.reserve_reference(id, gang, now),
            "the reservation differs from the plain computation"
        );
        r
    }

    fn reserve_fast(&self, id: u64, gang: &GangRequest, now: Instant) -> Option<Reservation> {
        let rigid = GangRequest {
            max: gang.min,
            ..gang.clone()
        };
        let built;
        let base: &[AgentView] = if self.view_cache.checked || self.view_cache.fresh(&self.agents) {
            &self.view_cache.views
        } else {
            built = self.eventual_views(true);
            &built
        };
        // GPUs idle now per agent (those of `eventual_views(false)`), counted without
        // building the views: its GPUs less those of workers not being killed.
        let mut busy: HashMap<AgentId, BTreeSet<&str>> = HashMap::new();
        for job in self.with_members() {
            for m in job.members.values().filter(|m| !m.killing) {
                busy.entry(m.agent_id)
                    .or_default()
                    .extend(m.gpus.iter().map(String::as_str));
            }
        }
        let idle = |v: &AgentView| {
            let a = &self.agents[&v.agent_id];
            let taken = busy.get(&v.agent_id).map_or(0, |b| {
                a.gpus.keys().filter(|u| b.contains(u.as_str())).count()
            });
            a.gpus.len() - taken
        };
        // The agents in order of preference (`base` is in agent id order, as `agents`).
        let mut order: Vec<(usize, &str, AgentId, usize)> = base
            .iter()
            .enumerate()
            .map(|(i, v)| (idle(v), v.hostname.as_str(), v.agent_id, i))
            .collect();
        order.sort_unstable();
        let index: HashMap<AgentId, usize> =
            order.iter().enumerate().map(|(k, o)| (o.2, k)).collect();
        // Every running member (in the order `member_ends` gives them), and per agent (by
        // its place in `order`) its members.
        let mut amounts: Vec<Resources> = Vec::new();
        let mut members: Vec<(usize, &[String], Option<Instant>)> = Vec::new();
        let mut on: Vec<Vec<usize>> = vec![Vec::new(); order.len()];
        for job in self.with_members() {
            amounts.push(member_resources(&job.spec));
            let end = match (time_limit(&self.config, &job.spec), job.attempt_started) {
                (Some(limit), Some(started)) => Some((started + limit).max(now)),
                _ => None,
            };
            for m in job.members.values() {
                let end = if m.killing { Some(now) } else { end };
                if let Some(&k) = index.get(&m.agent_id) {
                    on[k].push(members.len());
                }
                members.push((amounts.len() - 1, &m.gpus, end));
            }
        }
        let ended = |t: Option<Instant>, end: Option<Instant>| match (t, end) {
            (None, _) => true,
            (Some(t), Some(end)) => end <= t,
            (Some(_), None) => false,
        };
        let task = &rigid.member;
        // Where the gang goes at `t` (`None`: once every member ended), and the views its
        // plan's indices refer to.
        let fits = |t: Option<Instant>| {
            // Per agent in order: its view at `t`, where a member could fit there.
            let mut views: Vec<Cow<AgentView>> = Vec::new();
            for (k, o) in order.iter().enumerate() {
                let v = &base[o.3];
                let left: Vec<usize> = on[k]
                    .iter()
                    .copied()
                    .filter(|&i| !ended(t, members[i].2))
                    .collect();
                if left.is_empty() {
                    views.push(Cow::Borrowed(v));
                    continue;
                }
                let mut resources = v.resources.clone();
                for &i in &left {
                    resources = resources.saturating_sub(&amounts[members[i].0]);
                }
                // (What `offers::evaluate` asks first of an agent; a fraction of a GPU is placed
                // by a policy over every agent that can host it: no agent is left out then.)
                if task.fraction().is_none() && !resources.contains(&task.resources) {
                    continue;
                }
                // (As `eventual_views` and the plain computation take them off.)
                let mut v = v.clone();
                let agent = v.agent_id;
                for &i in &left {
                    remove(
                        std::slice::from_mut(&mut v),
                        agent,
                        &amounts[members[i].0],
                        members[i].1,
                    );
                }
                views.push(Cow::Owned(v));
            }
            place_on_best(&views, &rigid)
        };
        let mut times: Vec<Instant> = members.iter().filter_map(|m| m.2).collect();
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

    /// Brings the kept views ([`ViewCache`]) up to date with the known agents, for a pass
    /// (`done`: the pass is over). The known agents change only between passes (offers,
    /// removals) and where a pass starts ([`Core::learn_capacity`]): once checked at the
    /// start of a pass, they are not compared again in it.
    pub(super) fn refresh_view_cache(&mut self, done: bool) {
        if done {
            self.view_cache.checked = false;
            return;
        }
        if !self.view_cache.fresh(&self.agents) {
            self.view_cache = ViewCache {
                from: self.agents.iter().map(|(id, a)| (*id, a.clone())).collect(),
                views: self.eventual_views(true),
                checked: false,
            };
        }
        self.view_cache.checked = true;
    }
}

/// The agents' views with every member ended ([`Core::eventual_views`]`(true)`), kept across
/// passes with the known agents they were built from: valid while those are unchanged (the
/// reservation places on them every pass; building them copies every GPU of the cluster).
#[derive(Debug, Default)]
pub(super) struct ViewCache {
    from: Vec<(AgentId, KnownAgent)>,
    views: Vec<AgentView>,
    /// Whether it was found fresh at the start of the pass under way.
    checked: bool,
}

impl ViewCache {
    /// Whether it was built from `agents` as they are.
    fn fresh(&self, agents: &BTreeMap<AgentId, KnownAgent>) -> bool {
        agents.len() == self.from.len()
            && agents.iter().zip(&self.from).all(|((id, a), (cid, c))| {
                id == cid
                    && a.hostname == c.hostname
                    && a.capacity == c.capacity
                    && a.attributes == c.attributes
                    && a.gpus == c.gpus
            })
    }
}

/// [`gang::place_gang`] on `views`, copying only the views its members can go to: those
/// with the best scores ([`offers::evaluate`]) for one member, as many as the gang's most
/// members. Exact: [`offers::place_one`] takes the least score (the index last) and taking
/// from an agent changes only that agent's score, so the `n`-th member goes to an agent
/// already taken from or to the best of the others, among the `n` best scores at the start.
/// The plan's indices refer to the views returned.
///
/// A gang of fractions of a GPU is placed by a policy that scores agents against each other
/// (`offers::place_one`): on every view then.
fn place_on_best(views: &[Cow<AgentView>], gang: &GangRequest) -> Option<(Plan, Vec<AgentView>)> {
    if gang.member.fraction().is_some() {
        let mut all: Vec<AgentView> = views.iter().map(|v| v.as_ref().clone()).collect();
        return gang::place_gang(&mut all, gang).map(|plan| (plan, all));
    }
    let mut scored: Vec<(Score, usize)> = views
        .iter()
        .enumerate()
        .filter_map(|(i, v)| offers::evaluate(i, v, &gang.member).map(|c| (c.score, i)))
        .collect();
    let most = (gang.max.max(gang.min.max(1)) as usize).min(scored.len());
    if most == 0 {
        return None;
    }
    scored.select_nth_unstable(most - 1);
    let mut best: Vec<usize> = scored[..most].iter().map(|s| s.1).collect();
    best.sort_unstable();
    let mut chosen: Vec<AgentView> = best.iter().map(|&i| views[i].as_ref().clone()).collect();
    gang::place_gang(&mut chosen, gang).map(|plan| (plan, chosen))
}

/// Free milli-GPUs by why they are free ([`Core::idle_gpus`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct IdleGpus {
    /// Idle while a waiting job could start on them.
    pub(super) eligible: u64,
    /// Held for the reservation of a blocked job while the rest of its GPUs drain.
    pub(super) reserved: u64,
    /// Kept for gangs whose offers are settling.
    pub(super) settling: u64,
}

/// A blocked job's reservation: per agent the amount and GPUs set aside for it, and when it is
/// expected to start (by the running jobs' time limits; `None` when unknown).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Reservation {
    pub(super) holder: u64,
    pub(super) parts: Parts,
    pub(super) start: Option<Instant>,
}

/// Per agent: the amount and GPUs reserved there.
pub(super) type Parts = Vec<(AgentId, Resources, Vec<String>)>;

/// How long a preemption's reservation lasts at most.
pub(super) const PREEMPT_RESERVATION: Duration = Duration::from_secs(60);

pub(super) fn gang_of(spec: &JobSpec) -> GangRequest {
    GangRequest {
        member: request(spec),
        min: spec.min_workers.max(1),
        max: spec.max_workers.max(spec.min_workers.max(1)),
    }
}

pub(super) fn avail_ids(views: &[AgentView]) -> Vec<(AgentId, String)> {
    views
        .iter()
        .map(|v| (v.agent_id, v.hostname.clone()))
        .collect()
}

/// What a gang whose offers are settling keeps ([`Core::unsettled`]): per agent of `plan`
/// (indices into `views`), its members' amounts and GPUs.
pub(super) fn settle_parts(plan: &Plan, views: &[AgentView], gang: &GangRequest) -> Parts {
    let mut parts: Parts = Vec::new();
    for a in &plan.assignments {
        let agent = views[a.agent].agent_id;
        match parts.iter_mut().find(|p| p.0 == agent) {
            Some(p) => {
                p.1.add_assign(&gang.member.resources);
                p.2.extend(a.gpus.iter().cloned());
            }
            None => parts.push((agent, gang.member.resources.clone(), a.gpus.clone())),
        }
    }
    parts
}

/// Removes `res` and its share of the GPUs `uuids` from the view of `agent`: each listed GPU
/// gives `res`'s GPUs over the list's length (a whole GPU each for whole-GPU workers, the
/// fraction for a fractional one; a GPU listed twice gives twice), and leaves the view when
/// nothing of it is left.
pub(super) fn remove(views: &mut [AgentView], agent: AgentId, res: &Resources, uuids: &[String]) {
    if let Some(v) = views.iter_mut().find(|v| v.agent_id == agent) {
        v.resources = v.resources.saturating_sub(res);
        if uuids.is_empty() {
            return;
        }
        let each = res.milli("gpus") / uuids.len() as u64;
        let each = u32::try_from(each).unwrap_or(u32::MAX);
        for u in uuids {
            if let Some(g) = v.gpus.iter_mut().find(|g| &g.uuid == u) {
                g.free_milli = g.free_milli.saturating_sub(each);
            }
        }
        v.gpus.retain(|g| g.free_milli > 0);
    }
}

pub(super) fn subtract(views: &mut [AgentView], parts: &[(AgentId, Resources, Vec<String>)]) {
    for (agent, res, gpus) in parts {
        remove(views, *agent, res, gpus);
    }
}
