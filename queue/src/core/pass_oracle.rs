//! The test oracle: the scheduling pass as it was before it became incremental (every
//! eligible job ordered and tried each pass), kept unchanged so that the property test in
//! `pass_tests` can check that [`Core::pass`] decides exactly what it decides.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use gantry_sdk::placement::gang::{self, GangRequest};
use gantry_sdk::placement::offers::AgentView;
use gantry_sdk::protocol::*;

use super::order::{OrderKey, TeamUsage};
use super::preempt::Victims;
use super::reserve::{settle_parts, subtract, PREEMPT_RESERVATION};
use super::shape::{Shape, ShapeCache};
use super::{avail_ids, gang_of, remove, Action, Core, JobState, Priority, Reservation};

impl Core {
    /// The pass as it was before it became incremental: the oracle the property test
    /// compares [`Core::pass`] with.
    pub(super) fn pass_reference(&mut self, now: Instant) -> Vec<Action> {
        self.pass_due = false;
        let kills = self.timers(now);
        self.lend_blocked.clear();
        self.resolve_dependencies(now);
        self.learn_capacity();
        let busy = self.busy_gpus();
        let offers: Vec<Offer> = self.offers.values().map(|(o, _)| o.clone()).collect();
        let mut views =
            AgentView::from_offers(&offers, &|a, u: &str| busy.contains(&(a, u.to_string())));
        // Placement ties go to the first agent: by hostname, so that where jobs go does not
        // depend on random agent (or offer) ids.
        views.sort_by(|a, b| (&a.hostname, a.agent_id).cmp(&(&b.hostname, b.agent_id)));
        let totals = self.totals();
        let mut launches: BTreeMap<usize, Vec<TaskInfo>> = BTreeMap::new();
        // Reservation: per-agent amounts and GPUs subtracted for everyone else (but jobs that
        // end before it starts: EASY backfill).
        let mut reservation: Option<Reservation> = None;
        let mut blocked: Vec<u64> = Vec::new();
        // Jobs launched in this pass: never preempted in the same pass.
        let mut started: BTreeSet<u64> = BTreeSet::new();
        // The order of the eligible jobs, with their keys: computed once, then again after a
        // launch only for the launching team's jobs (a launch changes only that team's usage;
        // the order of the others stays, unless the level changes: then all of it).
        let mut usage = self.usage(now);
        let mut teams = self.eligible_teams();
        let names: Vec<String> = teams.keys().cloned().collect();
        let mut level = self.level_among(&usage, &teams);
        let keyed = {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            self.keyed_order(&usage, &names, totals, level, now)
        };
        // Who may hold (the reservation): the first job, in order, that does not fit what is
        // free now and is not backing off ([`Holds`]). Placement depends only on the gang's
        // shape: tried once per shape (a queue holds thousands of jobs of a few shapes).
        let mut fits_now = ShapeCache::default();
        let not_fitting: Vec<u64> = keyed
            .iter()
            .map(|(_, id, _)| *id)
            .filter(|id| !self.over_borrow_limit(&self.jobs[id].spec, &usage))
            .filter(|id| !fits_now.fits(&views, &self.jobs[id].spec))
            .collect();
        let holder = self.holds.update(&not_fitting, now).holder;
        if let Some((id, _, since)) = &self.preempt_for {
            let pending = self
                .jobs
                .get(id)
                .is_some_and(|j| j.state == JobState::Pending);
            if !pending || now.saturating_duration_since(*since) > PREEMPT_RESERVATION {
                self.preempt_for = None;
            }
        }
        if let Some((id, parts, _)) = &self.preempt_for {
            // Its victims end within their grace: nothing backfills there.
            reservation = Some(Reservation {
                holder: *id,
                parts: parts.clone(),
                start: None,
            });
        }
        // Per team, its eligible jobs in order: the pass takes the least head of all.
        let mut lists: Vec<VecDeque<(OrderKey, u64)>> = vec![VecDeque::new(); names.len()];
        for (key, id, t) in keyed {
            lists[t].push_back((key, id));
        }
        // The team of the last launch, whose jobs' keys are stale.
        let mut stale: Option<usize> = None;
        // Shapes (and whether they may backfill) that found no room outside the holder's
        // reservation since the last launch or change of the reservation: what is free only
        // shrinks meanwhile, so they would not fit again.
        let mut no_room: Vec<(Shape, bool)> = Vec::new();
        let mut settling: Vec<(u64, super::Parts)> = Vec::new();
        loop {
            // Members launched earlier in this pass are already recorded in their jobs.
            if let Some(t) = stale.take() {
                usage = self.usage(now);
                let was = level;
                level = self.level_among(&usage, &teams);
                let none = TeamUsage::default();
                let rekey = |list: &mut VecDeque<(OrderKey, u64)>, team: &str| {
                    let used = usage.get(team).unwrap_or(&none);
                    let tk = self.team_key(team, used, totals, level);
                    for e in list.iter_mut() {
                        e.0 = self.order_key(&self.jobs[&e.1], used, tk, now);
                    }
                    list.make_contiguous().sort_unstable();
                };
                if was.to_bits() == level.to_bits() {
                    rekey(&mut lists[t], &names[t]);
                } else {
                    for (list, team) in lists.iter_mut().zip(&names) {
                        rekey(list, team);
                    }
                }
            }
            let Some(t) = lists
                .iter()
                .enumerate()
                .filter_map(|(t, l)| l.front().map(|e| (e, t)))
                .min()
                .map(|(_, t)| t)
            else {
                break;
            };
            let Some((_, id)) = lists[t].pop_front() else {
                break;
            };
            let spec = &self.jobs[&id].spec;
            if self.over_borrow_limit(spec, &usage) {
                // Waits until its team uses less (it neither reserves nor preempts).
                continue;
            }
            let mut shape = Shape::of(spec);
            if let Some(room) = self.borrow_room(spec, &usage) {
                // An elastic gang starts with no more workers than its borrowing limit allows.
                let most = room / spec.gpus.milli().max(1);
                shape.max = shape
                    .max
                    .min(most.min(u64::from(u32::MAX)) as u32)
                    .max(shape.min);
            }
            let holds_it = reservation.as_ref().is_some_and(|r| r.holder == id);
            let may_backfill = reservation
                .as_ref()
                .is_some_and(|r| r.holder != id && self.backfills(r, spec, now));
            if !holds_it
                && holder != Some(id)
                && no_room
                    .iter()
                    .any(|(g, b)| *g == shape && *b == may_backfill)
            {
                blocked.push(id);
                continue;
            }
            let mut gang = gang_of(spec);
            gang.max = shape.max;
            let mut avail = views.clone();
            if let Some(r) = &reservation {
                if r.holder != id {
                    subtract(&mut avail, &r.parts);
                }
            }
            let mut plan = gang::place_gang(&mut avail, &gang);
            let mut backfilled = false;
            if plan.is_none()
                && reservation
                    .as_ref()
                    .is_some_and(|r| r.holder != id && self.backfills(r, spec, now))
            {
                // EASY backfill: it ends before the reservation starts, so it may use the
                // reserved GPUs without delaying the holder.
                avail = views.clone();
                plan = gang::place_gang(&mut avail, &gang);
                backfilled = true;
            }
            if let Some(why) = plan
                .as_ref()
                .and_then(|p| self.plan_block(spec, p, &views, &usage))
            {
                // A borrowing or lending limit refuses the GPUs it chose: placed again away
                // from the buckets it may not take from, else it waits.
                let mut base = views.clone();
                if let Some(r) = reservation
                    .as_ref()
                    .filter(|r| r.holder != id && !backfilled)
                {
                    subtract(&mut base, &r.parts);
                }
                match self.replan_within_limits(spec, &gang, base, &views, &usage) {
                    Some((p, a)) => {
                        plan = Some(p);
                        avail = a;
                    }
                    None => {
                        self.lend_blocked.insert(id, why);
                        continue;
                    }
                }
            }
            match plan {
                Some(plan) if self.unsettled(&plan, &avail, now) => {
                    // Its offers may be rescinded on their way: kept for it until they settle.
                    let parts = settle_parts(&plan, &avail, &gang);
                    subtract(&mut views, &parts);
                    settling.push((id, parts));
                }
                Some(plan) => {
                    for a in &plan.assignments {
                        let agent = views[a.agent].agent_id;
                        remove(&mut views, agent, &gang.member.resources, &a.gpus);
                    }
                    started.insert(id);
                    self.touched.insert(id);
                    let tasks = self.start(id, &plan, &avail_ids(&avail), now);
                    for (agent, task) in tasks {
                        launches.entry(agent).or_default().push(task);
                    }
                    if reservation.as_ref().is_some_and(|r| r.holder == id) {
                        reservation = None;
                    }
                    self.holds.done(&id);
                    if let Some(n) = teams.get_mut(&names[t]) {
                        *n = n.saturating_sub(1);
                    }
                    stale = Some(t);
                    no_room.clear();
                }
                None => {
                    blocked.push(id);
                    if reservation.is_none() && holder == Some(id) && not_fitting.contains(&id) {
                        reservation = self.reserve(id, &gang, now);
                        no_room.clear();
                    } else if !holds_it {
                        no_room.push((shape, may_backfill));
                    }
                }
            }
        }
        let mut out = kills;
        // Launch: one accept per agent, every task of the pass on it.
        let mut used_offers: BTreeSet<OfferId> = BTreeSet::new();
        for (agent, tasks) in launches {
            let Some(v) = views.get(agent) else { continue };
            used_offers.extend(v.offer_ids.iter().copied());
            out.push(Action::Launch {
                offers: v.offer_ids.clone(),
                tasks,
            });
        }
        self.note_settled(used_offers.iter(), now);
        for id in &used_offers {
            self.offers.remove(id);
        }
        // What was left on agents just accepted goes back to the master with the accept.
        for v in &mut views {
            if v.offer_ids.iter().any(|o| used_offers.contains(o)) {
                v.resources = Resources::new();
                v.gpus.clear();
                v.offer_ids.clear();
            }
        }
        // Preemption for the first blocked critical/high job, unless one is under way.
        if !self.kills_in_flight() && self.preempt_for.is_none() {
            if let Some(&id) = blocked
                .iter()
                .find(|id| self.jobs[id].spec.priority >= Priority::High)
            {
                out.extend(self.preempt(id, &views, &started, now, Victims::LowerClass));
            }
        }
        // Quota reclaim: the first blocked job whose team stays within its GPU quota takes
        // back borrowed GPUs, preempting jobs of teams above theirs.
        let quotas = self.config.teams.values().any(|t| t.has_quota());
        if quotas && !self.kills_in_flight() && self.preempt_for.is_none() {
            let usage = self.usage(now);
            let within =
                |id: &u64| self.within_quota(&self.jobs[id].spec, self.named_models(), &usage);
            if let Some(&id) = blocked.iter().find(|id| within(id)) {
                out.extend(self.preempt(id, &views, &started, now, Victims::Borrowed));
            }
        }
        // Fair-share wait: the first blocked job that has waited longer than
        // `fair_share_wait` and whose team stays within its weighted share with it takes GPUs
        // back from `preemptible` jobs of teams above theirs.
        if let Some(wait) = self.config.fair_share_wait {
            if !self.kills_in_flight() && self.preempt_for.is_none() {
                let fair = self.fair_gpus();
                let usage = self.usage(now);
                let under = |id: &u64| {
                    let j = &self.jobs[id];
                    let need = super::quota::need(&j.spec);
                    let used = usage.get(&j.spec.team).map_or(0, |u| u.gpus);
                    need > 0
                        && now.saturating_duration_since(j.waiting_since) >= wait
                        && (used + need) as f64 <= fair.get(&j.spec.team).copied().unwrap_or(0.0)
                };
                if let Some(&id) = blocked.iter().find(|id| under(id)) {
                    out.extend(self.preempt(id, &views, &started, now, Victims::OverShare));
                }
            }
        }
        // Elastic growth when nothing waits.
        if blocked.is_empty() {
            // Growth changes the jobs it grows (`launch`): every running job may.
            let running = self.jobs.values().filter(|j| !j.members.is_empty());
            self.touched
                .extend(running.map(|j| j.id).collect::<Vec<_>>());
            out.extend(self.grow(&mut views, now));
        }
        // Offers: hold fresh ones (younger than `offer_hold`) of reserved agents while the
        // hold lasts and of any agent while work waits; decline the rest. Never older: the
        // master expires offers (30 s by default) and filters the agent for a while, and an
        // accept naming an expired offer drops its tasks (a gang's launch would be partial).
        let reserved: BTreeSet<AgentId> = reservation
            .iter()
            .flat_map(|r| r.parts.iter().map(|p| p.0))
            .collect();
        let waiting = !blocked.is_empty() || !settling.is_empty();
        // Per agent: the master's accept and decline act on all of a framework's offers on an
        // agent, so an agent's offers are kept or declined together (kept while its newest
        // offer is fresh).
        let mut fresh: BTreeMap<AgentId, bool> = BTreeMap::new();
        for (o, at) in self.offers.values() {
            let f = now.saturating_duration_since(*at) < self.config.offer_hold;
            *fresh.entry(o.agent_id).or_default() |= f;
        }
        let mut decline = Vec::new();
        for (id, (o, _)) in &self.offers {
            if used_offers.contains(id) {
                continue;
            }
            let keep = (reserved.contains(&o.agent_id) || waiting)
                && fresh.get(&o.agent_id).copied().unwrap_or(false);
            if !keep {
                decline.push(*id);
            }
        }
        self.note_settled(decline.iter(), now);
        for id in &decline {
            self.offers.remove(id);
        }
        if !decline.is_empty() {
            out.push(Action::Decline(decline, if waiting { 1.0 } else { 5.0 }));
        }
        out.extend(self.refresh_stale(now));
        let active = self.jobs.values().any(Self::eligible);
        let growing = self.jobs.values().any(|j| {
            j.state == JobState::Running
                && !j.preempting
                && j.finished_members == 0
                && j.running_members() < j.spec.max_workers
        });
        if !active && !growing && !self.suppressed {
            self.suppressed = true;
            out.push(Action::Suppress);
        } else if (active || growing) && self.suppressed {
            self.suppressed = false;
            out.push(Action::Revive);
        }
        // The hold lasts until the reservation's expected start plus the hold timeout: a gang
        // waiting hours for time-limited work to end keeps its reservation (`Holds::renew`).
        if let Some((holder, start)) = reservation
            .as_ref()
            .and_then(|r| Some((r.holder, r.start?)))
        {
            self.holds.renew(&holder, start);
        }
        self.last_reservation = reservation;
        self.last_settling = settling;
        out
    }
}

impl Core {
    /// [`Core::reserve`] as it was computed before (the views of the whole cluster copied
    /// per probe): it checks the faster computation in tests.
    ///
    /// The reservation for blocked job `id`: where its gang's fewest members go once running
    /// work ends, at the earliest time they fit by the running members' expected ends (their
    /// attempt's launch plus time limit; members being killed end now). At that time it prefers
    /// agents with the fewest GPUs idle now (then by hostname: not by agent id), so it reserves
    /// GPUs that are busy now rather than idle ones others could use. When it fits only once
    /// members without a time limit end, it has no estimated start.
    pub(super) fn reserve_reference(
        &self,
        id: u64,
        gang: &GangRequest,
        now: Instant,
    ) -> Option<Reservation> {
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
