//! One scheduling pass ([`Core::pass`]: order, place, reserve, backfill, preempt, grow,
//! decline). What it places with (the reservation where GPUs free soonest, the agents' views,
//! the idle-GPU statistic) is in [`super::reserve`]. The policy is described in the module
//! documentation of [`crate::core`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::iter::Peekable;
use std::time::{Duration, Instant};

use gantry_sdk::placement::gang;
use gantry_sdk::placement::offers::AgentView;
use gantry_sdk::protocol::*;

use super::order::{Keyed, OrderKey, TeamUsage};
use super::order_cache::{first_high, Cursor, JobKey, TeamList};
use super::preempt::Victims;
use super::reserve::{
    avail_ids, gang_of, remove, settle_parts, subtract, Parts, Reservation, PREEMPT_RESERVATION,
};
use super::shape::{Least, Shape, ShapeCache};
use super::{time_limit, Action, Core, JobState, Priority};

impl Core {
    /// One scheduling pass (see the module documentation).
    pub fn pass(&mut self, now: Instant) -> Vec<Action> {
        #[cfg(test)]
        if self.oracle {
            return self.pass_reference(now);
        }
        self.pass_due = false;
        let kills = self.timers(now);
        self.lend_blocked.clear();
        self.resolve_dependencies(now);
        self.learn_capacity();
        self.refresh_view_cache(false);
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
        let quotas = self.config.teams.values().any(|t| t.has_quota());
        let keyed = match self.keyed_cached(&usage, now) {
            Some(k) => k,
            None => self.keyed_least(&usage, totals, now),
        };
        let Keyed {
            mut teams,
            mut level,
            lists: keyed_lists,
            fixed,
            least,
            shapes,
        } = keyed;
        let names: Vec<String> = teams.keys().cloned().collect();
        // The kept order is read in place (taken out of `self` for the pass: nothing in a pass
        // changes it; it is brought up to date from the touched jobs at the next).
        let cache = std::mem::take(&mut self.order_cache);
        let mut lists: Vec<TeamList> = if fixed {
            cache.lists(&names, &self.team_keys(&names, &usage, totals, level))
        } else {
            keyed_lists.into_iter().map(TeamList::Keyed).collect()
        };
        // Who may hold (the reservation): the first job, in order, that does not fit what is
        // free now and is not backing off ([`Holds`]). Placement depends only on the gang's
        // shape: tried once per shape (a queue holds thousands of jobs of a few shapes).
        // [`Holds::update`] needs only the jobs up to the first that does not fit and is not
        // backing off (nor the current holder), and the current holder if it does not fit:
        // the rest of the queue is not looked at.
        let mut fits_now = ShapeCache::default();
        // When every eligible job's shape fits now, no job is `not_fitting` (the kept order
        // knows the shapes: no walk of the queue to find that out).
        let all_fit = shapes
            .as_ref()
            .is_some_and(|specs| specs.iter().all(|spec| fits_now.fits(&views, spec)));
        let mut not_fits = |id: u64| {
            let spec = &self.jobs[&id].spec;
            !self.over_borrow_limit(spec, &usage) && !fits_now.fits(&views, spec)
        };
        let current = self.holds.holder().map(|(k, _)| *k);
        let mut not_fitting: Vec<u64> = Vec::new();
        for (_, id) in merged(&lists).filter(|_| !all_fit) {
            if not_fits(id) {
                not_fitting.push(id);
                if current != Some(id) && !self.holds.backing_off(&id, now) {
                    break;
                }
            }
        }
        if let Some(c) = current {
            if !not_fitting.contains(&c)
                && self.jobs.get(&c).is_some_and(Self::eligible)
                && not_fits(c)
            {
                not_fitting.push(c);
            }
        }
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
        // Per team, its eligible jobs in order (`lists`): the pass takes the least head of all.
        // The team of the last launch, whose jobs' keys are stale.
        let mut stale: Option<usize> = None;
        // Shapes (and whether they may backfill) that found no room outside the holder's
        // reservation since the last launch or change of the reservation: what is free only
        // shrinks meanwhile, so they would not fit again.
        let mut no_room: Vec<(Shape, bool)> = Vec::new();
        // Whether some offered agent could still host the least worker of any eligible job:
        // once none can, no later job places, and the pass stops trying (the rest of the
        // queue is blocked, taken lazily in order below).
        // (A job other than the reservation's holder places outside the reservation, or in
        // it only when it may backfill: once the holder has been tried, the bound is taken
        // outside the reservation unless some eligible job's time limit ends before it starts.)
        let mut res_holder_seen = false;
        // The shortest time limit of the eligible jobs, computed when first needed (only ever
        // too short after launches in this pass: the bound stays necessary).
        let mut shortest: Option<Option<Duration>> = None;
        let mut room = self.room(
            &least,
            &views,
            reservation.as_ref(),
            res_holder_seen,
            &mut shortest,
            now,
        );
        let mut holder_tried = false;
        // Gangs waiting for their offers to settle ([`CoreConfig::offer_settle`]), with what
        // is kept for them meanwhile.
        let mut settling: Vec<(u64, Parts)> = Vec::new();
        loop {
            // Members launched earlier in this pass are already recorded in their jobs.
            if let Some(t) = stale.take() {
                usage = self.usage(now);
                let was = level;
                level = self.level_among(&usage, &teams);
                let none = TeamUsage::default();
                // `own`: the launch was this team's, so with quotas its jobs' "over its quota"
                // may have moved (other teams' usage did not change).
                let rekey = |list: &mut TeamList, team: &str, own: bool| {
                    let names_t = team;
                    let used = usage.get(team).unwrap_or(&none);
                    let tk = self.team_key(team, used, totals, level);
                    let own = own && quotas;
                    let list = match list {
                        TeamList::Kept { team, .. } if !own => {
                            // Only the team's part changed: the same for all, the order stays.
                            *team = tk;
                            return;
                        }
                        TeamList::Kept { team, rest, .. } => {
                            // With quotas, the launch may have moved some of the rest of the
                            // team's jobs across its quota: only their bit changes (the rest
                            // of their keys stands for this pass).
                            let over = self.over_quota_in(names_t, used);
                            let mut moved = false;
                            let mut owned: VecDeque<JobKey> = rest
                                .clone()
                                .into_iter()
                                .flatten()
                                .map(|k| {
                                    let o = over(&self.jobs[&k.4].spec);
                                    moved |= o != k.1;
                                    (k.0, o, k.2, k.3, k.4)
                                })
                                .collect();
                            if !moved {
                                *team = tk;
                                return;
                            }
                            owned.make_contiguous().sort_unstable();
                            *list = TeamList::Owned {
                                team: tk,
                                list: owned,
                            };
                            return;
                        }
                        TeamList::Owned { team, list } => {
                            *team = tk;
                            if own {
                                let over = self.over_quota_in(names_t, used);
                                let mut moved = false;
                                for k in list.iter_mut() {
                                    let o = over(&self.jobs[&k.4].spec);
                                    moved |= o != k.1;
                                    k.1 = o;
                                }
                                if moved {
                                    list.make_contiguous().sort_unstable();
                                }
                            }
                            return;
                        }
                        TeamList::Keyed(list) => list,
                    };
                    if fixed && own {
                        // Only the quota bits and the team's part can have changed.
                        let over = self.over_quota_in(names_t, used);
                        for e in list.iter_mut() {
                            e.0 .1 = over(&self.jobs[&e.1].spec);
                            (e.0 .2, e.0 .3) = tk;
                        }
                        list.make_contiguous().sort_unstable();
                        return;
                    }
                    if fixed {
                        // Only the team's part changed: the same for all, the order stays.
                        for e in list.iter_mut() {
                            (e.0 .2, e.0 .3) = tk;
                        }
                        return;
                    }
                    for e in list.iter_mut() {
                        e.0 = self.order_key(&self.jobs[&e.1], used, tk, now);
                    }
                    list.make_contiguous().sort_unstable();
                };
                if was.to_bits() == level.to_bits() {
                    rekey(&mut lists[t], &names[t], true);
                } else {
                    for (i, (list, team)) in lists.iter_mut().zip(&names).enumerate() {
                        rekey(list, team, i == t);
                    }
                }
            }
            if !room {
                break;
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
            holder_tried |= holder == Some(id);
            if !res_holder_seen && reservation.as_ref().is_some_and(|r| r.holder == id) {
                // Once the holder has been tried, others place outside its reservation (or
                // backfill): the bound may close here (a reservation made for a preemption
                // keeps its agent's free GPUs while the victims end; without this the pass
                // walked the whole queue meanwhile).
                res_holder_seen = true;
                room = self.room(
                    &least,
                    &views,
                    reservation.as_ref(),
                    res_holder_seen,
                    &mut shortest,
                    now,
                );
            }
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
                    room = self.room(
                        &least,
                        &views,
                        reservation.as_ref(),
                        res_holder_seen,
                        &mut shortest,
                        now,
                    );
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
                    room = self.room(
                        &least,
                        &views,
                        reservation.as_ref(),
                        res_holder_seen,
                        &mut shortest,
                        now,
                    );
                }
                None => {
                    blocked.push(id);
                    // The holder is always one of `not_fitting`.
                    if reservation.is_none() && holder == Some(id) {
                        reservation = self.reserve(id, &gang, now);
                        no_room.clear();
                        // Tried: others now place outside its reservation (or backfill).
                        res_holder_seen = true;
                        room = self.room(
                            &least,
                            &views,
                            reservation.as_ref(),
                            res_holder_seen,
                            &mut shortest,
                            now,
                        );
                    } else if !holds_it {
                        no_room.push((shape, may_backfill));
                    }
                }
            }
        }
        // The jobs the loop did not reach (nothing could place): blocked, in order, but those
        // over their team's borrowing limit (skipped, as the loop would); the holder among
        // them gets the reservation it would have got.
        if let Some(h) = holder.filter(|_| !holder_tried && reservation.is_none()) {
            // Not reached: still in `lists` (every holder is an eligible job).
            let spec = &self.jobs[&h].spec;
            if !self.over_borrow_limit(spec, &usage) {
                reservation = self.reserve(h, &gang_of(spec), now);
            }
        }
        // The first blocked job in order that passes `pred`, among the teams that pass `team`
        // (a team none of whose jobs can pass is not walked: with every team at its quota,
        // quota reclaim would otherwise walk the whole queue every pass).
        let blocked_in_order =
            |this: &Core, team: &dyn Fn(&str) -> bool, pred: &dyn Fn(&Core, u64) -> bool| {
                blocked
                    .iter()
                    .copied()
                    .chain(
                        merged_where(&lists, &|t| team(&names[t]))
                            .map(|(_, id)| id)
                            .filter(|id| !this.over_borrow_limit(&this.jobs[id].spec, &usage)),
                    )
                    .find(|id| pred(this, *id))
            };
        let first_blocked = blocked_in_order(self, &|_| true, &|_, _| true);
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
            // Only jobs ordered at `high` or above (the first keys of every list) can be.
            let high = |c: &Core, id: u64| c.jobs[&id].spec.priority >= Priority::High;
            // (Only those of the jobs not reached: the kept order knows them apart.)
            let first_high = blocked
                .iter()
                .copied()
                .find(|id| high(self, *id))
                .or_else(|| {
                    first_high(&lists, &|id| high(self, id), &|id| {
                        !self.over_borrow_limit(&self.jobs[&id].spec, &usage)
                    })
                });
            if let Some(id) = first_high {
                out.extend(self.preempt(id, &views, &started, now, Victims::LowerClass));
            }
        }
        // Quota reclaim: the first blocked job whose team stays within its GPU quota takes
        // back borrowed GPUs, preempting jobs of teams above theirs.
        if quotas && !self.kills_in_flight() && self.preempt_for.is_none() {
            let usage = self.usage(now);
            let within =
                |c: &Core, id: u64| c.within_quota(&c.jobs[&id].spec, c.named_models(), &usage);
            // A team below its quota in some bucket (only its jobs can be within).
            let room = |team: &str| {
                let used = |b: Option<&str>| usage.get(team).map_or(0, |u| u.in_bucket(b));
                std::iter::once(None)
                    .chain(self.named_models().iter().map(|m| Some(m.as_str())))
                    .any(|b| self.quota_in(team, b).is_some_and(|q| used(b) < q))
            };
            if let Some(id) = blocked_in_order(self, &room, &within) {
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
                let under = |c: &Core, id: u64| {
                    let j = &c.jobs[&id];
                    let need = super::quota::need(&j.spec);
                    let used = usage.get(&j.spec.team).map_or(0, |u| u.gpus);
                    need > 0
                        && now.saturating_duration_since(j.waiting_since) >= wait
                        && (used + need) as f64 <= fair.get(&j.spec.team).copied().unwrap_or(0.0)
                };
                let below = |team: &str| {
                    let used = usage.get(team).map_or(0, |u| u.gpus);
                    (used as f64) < fair.get(team).copied().unwrap_or(0.0)
                };
                if let Some(id) = blocked_in_order(self, &below, &under) {
                    out.extend(self.preempt(id, &views, &started, now, Victims::OverShare));
                }
            }
        }
        drop(lists);
        self.order_cache = cache;
        // Elastic growth when nothing waits.
        if first_blocked.is_none() {
            // Growth changes the jobs it grows (`launch`): every running job may.
            let running = self.with_members();
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
        let waiting = first_blocked.is_some() || !settling.is_empty();
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
        // A running job has workers (`with_members` checks it in tests).
        let growing = self.with_members().any(|j| {
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
        self.refresh_view_cache(true);
        out
    }

    /// Whether an eligible job not yet tried in this pass could still place on `views` (a
    /// necessary condition, [`Least`]): with no `reservation`, anywhere; with one, outside
    /// it, or in it for its holder while it has not been tried (`holder_seen`) and fits
    /// there, or for a job that may backfill (some eligible job's time limit, `shortest`,
    /// ends before the reservation's start).
    fn room(
        &self,
        least: &Least,
        views: &[AgentView],
        reservation: Option<&Reservation>,
        holder_seen: bool,
        shortest: &mut Option<Option<Duration>>,
        now: Instant,
    ) -> bool {
        let Some(r) = reservation else {
            return least.fits_some(views);
        };
        if least.fits_some_outside(views, &r.parts) {
            return true;
        }
        // Until the holder has been tried, it may still place in its reservation (others
        // never do, but to backfill). One made for a preemption holds its agent's free GPUs
        // while the victims end, and its holder need not come early in the order: without
        // this the pass walked every job ahead of it (all of a higher class) meanwhile.
        if !holder_seen
            && self
                .jobs
                .get(&r.holder)
                .is_some_and(|j| ShapeCache::default().fits(views, &j.spec))
        {
            return true;
        }
        let Some(start) = r.start else {
            // No estimated start: nothing backfills.
            return false;
        };
        let shortest = *shortest.get_or_insert_with(|| {
            self.jobs
                .values()
                .filter(|j| Self::eligible(j))
                .filter_map(|j| time_limit(&self.config, &j.spec))
                .min()
        });
        shortest.is_some_and(|l| now + l <= start) && least.fits_some(views)
    }

    /// Declines, with no filter, the offers kept on agents where a worker of ours ended after
    /// the newest of them arrived, so that the master offers the agent again with what the
    /// worker freed. The master does not add to an offer we hold: what a worker frees is
    /// offered apart, and with a declared demand only as whole tasks of its shapes. An agent
    /// offered 4 of its GPUs while our 4-GPU job ran there, then freed, stays offered as 4
    /// (an 8-GPU worker never fits there, nor in the 4 freed beside it) until the offer is
    /// declined: in tests/tests/gpu_queue.rs the whole cluster sat idle for the offer hold
    /// (20 s) while a 4×8 gang waited.
    pub(super) fn refresh_stale(&mut self, now: Instant) -> Option<Action> {
        let mut newest: BTreeMap<AgentId, Instant> = BTreeMap::new();
        for (o, at) in self.offers.values() {
            let e = newest.entry(o.agent_id).or_insert(*at);
            *e = (*e).max(*at);
        }
        let stale: BTreeSet<AgentId> = newest
            .into_iter()
            .filter(|(agent, at)| self.worker_ended.get(agent).is_some_and(|end| end > at))
            .map(|(agent, _)| agent)
            .collect();
        if stale.is_empty() {
            return None;
        }
        let ids: Vec<OfferId> = self
            .offers
            .iter()
            .filter(|(_, (o, _))| stale.contains(&o.agent_id))
            .map(|(id, _)| *id)
            .collect();
        self.note_settled(ids.iter(), now);
        for id in &ids {
            self.offers.remove(id);
        }
        Some(Action::Decline(ids, 0.0))
    }
}

/// The entries of per-team lists, each from where it is, merged in order (the least head
/// first).
fn merged<'a>(lists: &'a [TeamList<'_>]) -> impl Iterator<Item = (OrderKey, u64)> + 'a {
    merged_where(lists, &|_| true)
}

/// [`merged`] over the lists whose index passes `keep` only.
fn merged_where<'a>(
    lists: &'a [TeamList<'_>],
    keep: &dyn Fn(usize) -> bool,
) -> impl Iterator<Item = (OrderKey, u64)> + 'a {
    let mut heads: Vec<Peekable<Cursor<'a>>> = lists
        .iter()
        .enumerate()
        .filter(|(t, _)| keep(*t))
        .map(|(_, l)| l.cursor().peekable())
        .collect();
    std::iter::from_fn(move || {
        let t = heads
            .iter_mut()
            .enumerate()
            .filter_map(|(t, h)| h.peek().map(|e| (*e, t)))
            .min()
            .map(|(_, t)| t)?;
        heads[t].next()
    })
}
