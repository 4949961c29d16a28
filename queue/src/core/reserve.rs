//! What a scheduling pass ([`Core::pass`]) places with: the reservation where GPUs free
//! soonest ([`Core::reserve`]) and EASY backfill on it, the agents' views (offered now, or
//! eventually once running work ends), learned capacities, and the idle-GPU statistic
//! ([`Core::idle_gpus`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use gantry_sdk::placement::gang::{self, GangRequest};
use gantry_sdk::placement::offers::{AgentView, Plan};
use gantry_sdk::protocol::*;

use super::shape::ShapeCache;
use super::{member_resources, request, time_limit, Core, Job, JobSpec, JobState};

impl Core {
    /// Free GPUs (capacity minus ours, assuming the cluster is ours), split in three
    /// ([`IdleGpus`]): those the last pass kept for gangs whose offers are settling; of the
    /// rest, those a waiting job could start on now under the policy (outside the last pass's
    /// reservation while an eligible job's gang fits there; all of them when the reservation's
    /// holder, or a job that may backfill on it, fits), 0 when no job could; and those held for
    /// the reservation.
    pub(super) fn idle_gpus(&self, now: Instant) -> IdleGpus {
        let mut views = self.eventual_views(false);
        let count = |v: &[AgentView]| v.iter().map(AgentView::gpu_count).sum::<u64>();
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
    pub(super) fn reserve(&self, id: u64, gang: &GangRequest, now: Instant) -> Option<Reservation> {
        let rigid = GangRequest {
            max: gang.min,
            ..gang.clone()
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
        let idle: HashMap<AgentId, usize> = self
            .agents
            .iter()
            .map(|(id, a)| {
                let taken = busy.get(id).map_or(0, |b| {
                    a.gpus.keys().filter(|u| b.contains(u.as_str())).count()
                });
                (*id, a.gpus.len() - taken)
            })
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
        let index: HashMap<AgentId, usize> = base
            .iter()
            .enumerate()
            .map(|(i, v)| (v.agent_id, i))
            .collect();
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
                    if let Some(&i) = index.get(agent) {
                        remove(&mut v[i..=i], *agent, res, gpus);
                    }
                }
            }
            v
        };
        // (Only the views' agent ids are read after a plan: placing on them in place is fine.)
        let fits = |t: Option<Instant>| {
            let mut v = at(t);
            gang::place_gang(&mut v, &rigid).map(|plan| (plan, v))
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

/// Free GPUs by why they are free ([`Core::idle_gpus`]).
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
#[derive(Debug, Clone)]
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
