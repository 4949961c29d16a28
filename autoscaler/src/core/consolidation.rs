//! Rule 3b of a round, consolidation (`consolidation = true`): drain a busy node whose tasks
//! fit the other ready nodes' room, or replace it by cheaper capacity (one node of a cheaper
//! pool, or several nodes of one pool that together cost less per hour), reserving the room
//! the replacement is for until its nodes register.

use super::*;

impl Core {
    /// Rule 3b: while no node of ours is leaving, the best busy node whose tasks have fit in
    /// the other ready nodes' room for `consolidation_delay` (and whose pool keeps its `min`
    /// without it) is drained with `consolidation_deadline` ([`crate::consolidate`]).
    pub(super) fn consolidate(&mut self, now: Millis, obs: &Observation) -> Option<Action> {
        if self.replacement.is_some() {
            return self.replacing(now);
        }
        let leaving = self
            .nodes
            .values()
            .any(|n| matches!(n.phase, Phase::Draining | Phase::Deleting));
        let ready: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.phase == Phase::Ready && !n.noticed)
            .map(|(id, _)| id.clone())
            .collect();
        let loads: Vec<crate::consolidate::NodeLoad> = ready
            .iter()
            .map(|id| {
                let spec = &self.config.pools[self.nodes[id].pool];
                crate::consolidate::NodeLoad {
                    id: id.clone(),
                    price_per_hour: spec.price_per_hour,
                    cpu_milli: (spec.cpus * 1000.0).round() as u64,
                    mem_mib: spec.mem,
                    gpus: spec.gpus,
                    gpu_model: spec.gpu_model.clone().unwrap_or_default(),
                    tasks: obs
                        .tasks
                        .iter()
                        .filter(|t| &t.node == id)
                        .map(|t| {
                            (
                                (t.cpus * 1000.0).round() as u64,
                                t.mem.round() as u64,
                                crate::consolidate::gpu_demand(t.gpus),
                            )
                        })
                        .collect(),
                }
            })
            .collect();
        let removable: Vec<String> = crate::consolidate::candidates(&loads)
            .into_iter()
            .map(|i| loads[i].id.clone())
            .collect();
        for id in &ready {
            if let Some(rec) = self.nodes.get_mut(id) {
                rec.removable_since = if removable.contains(id) {
                    Some(rec.removable_since.unwrap_or(now))
                } else {
                    None
                };
            }
        }
        if leaving {
            return None;
        }
        let delay = ms(self.config.autoscaler.consolidation_delay);
        let Some(id) = removable.into_iter().find(|id| {
            let rec = &self.nodes[id];
            rec.removable_since
                .is_some_and(|t| now.saturating_sub(t) >= delay)
                && self.staying(rec.pool) > self.config.pools[rec.pool].min
        }) else {
            return self.replace_cheaper(now, &loads);
        };
        let rec = self.nodes.get_mut(&id)?;
        rec.phase = Phase::Draining;
        rec.removable_since = None;
        self.pools[rec.pool].consolidations += 1;
        Some(Action::Drain {
            node: id,
            deadline_secs: Some(self.config.autoscaler.consolidation_deadline.as_secs()),
        })
    }

    /// Rule 3b, "replace" (Karpenter's): a busy node whose tasks all fit on `n` empty nodes of
    /// another pool (`n` up to [`MAX_REPLACEMENT_NODES`]) that together cost less per hour —
    /// same GPU model, and not spot for an on-demand node — with room and not cooling down,
    /// for `consolidation_delay`, and whose pool keeps its `min` without it: the `n` nodes of
    /// the pool that saves most are asked for (biggest saving first over the nodes); the old
    /// node is drained once they all register ([`Core::replacing`]).
    pub(super) fn replace_cheaper(
        &mut self,
        now: Millis,
        loads: &[crate::consolidate::NodeLoad],
    ) -> Option<Action> {
        let delay = ms(self.config.autoscaler.consolidation_delay);
        let mut best: Option<(f64, String, usize, u32)> = None;
        for load in loads.iter().filter(|l| !l.tasks.is_empty()) {
            let p = self.nodes.get(&load.id)?.pool;
            let own = &self.config.pools[p];
            // Per pool: the fewest of its nodes that hold the tasks, when they cost less.
            let option = (0..self.config.pools.len())
                .filter_map(|q| {
                    let c = &self.config.pools[q];
                    let cooling = self.pools[q]
                        .last_up
                        .is_some_and(|t| now.saturating_sub(t) < ms(c.scale_up_cooldown));
                    if q == p
                        || c.price_per_hour >= own.price_per_hour
                        || (c.spot && !own.spot)
                        || c.gpu_model != own.gpu_model
                        || cooling
                    {
                        return None;
                    }
                    // Only as many as cost less than the node.
                    let cheaper = (own.price_per_hour / c.price_per_hour).ceil() as u32 - 1;
                    let most = self.room(q).min(MAX_REPLACEMENT_NODES).min(cheaper);
                    let n = crate::consolidate::nodes_to_hold(
                        &load.tasks,
                        (c.cpus * 1000.0).round() as u64,
                        c.mem,
                        c.gpus,
                        most,
                    )?;
                    let saving = own.price_per_hour - f64::from(n) * c.price_per_hour;
                    (saving > 0.0).then_some((saving, q, n))
                })
                .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
            let rec = self.nodes.get_mut(&load.id)?;
            rec.replaceable_since = option.map(|_| rec.replaceable_since.unwrap_or(now));
            let Some((saving, q, n)) = option else {
                continue;
            };
            let ready = rec
                .replaceable_since
                .is_some_and(|t| now.saturating_sub(t) >= delay)
                && self.staying(p) > own.min;
            if ready && best.as_ref().is_none_or(|(s, _, _, _)| saving > *s) {
                best = Some((saving, load.id.clone(), q, n));
            }
        }
        let (_, old, q, count) = best?;
        self.reserve(q, count, now);
        self.replacement = Some(Replacement {
            old,
            pool: q,
            count,
            new: Vec::new(),
            at: now,
        });
        Some(Action::Create {
            pool: self.config.pools[q].name.clone(),
            count,
            reason: "replace-cheaper",
        })
    }

    /// A replacement under way: once all its nodes register, the old node is drained with
    /// `consolidation_deadline`; it ends when the old node is gone, or when one of the new
    /// nodes is (a failed start), or when they were not all named within the pool's
    /// `provision_timeout`.
    pub(super) fn replacing(&mut self, now: Millis) -> Option<Action> {
        let r = self.replacement.clone()?;
        let old_phase = self.nodes.get(&r.old).map(|n| n.phase);
        let new_phases: Vec<Option<Phase>> = r
            .new
            .iter()
            .map(|n| self.nodes.get(n).map(|n| n.phase))
            .collect();
        let all_named = r.new.len() as u32 >= r.count;
        let timeout = ms(self.config.pools[r.pool].provision_timeout);
        if old_phase.is_none()
            || new_phases.iter().any(Option::is_none)
            || (!all_named && now.saturating_sub(r.at) >= timeout)
        {
            self.replacement = None;
            return None;
        }
        let all_ready = new_phases.iter().all(|p| *p == Some(Phase::Ready));
        if old_phase == Some(Phase::Ready) && all_named && all_ready {
            let rec = self.nodes.get_mut(&r.old)?;
            rec.phase = Phase::Draining;
            let st = &mut self.pools[rec.pool];
            st.consolidations += 1;
            st.replaced_by_cheaper += 1;
            return Some(Action::Drain {
                node: r.old,
                deadline_secs: Some(self.config.autoscaler.consolidation_deadline.as_secs()),
            });
        }
        None
    }

    /// Counts `count` nodes asked of pool `p` this round (until [`Core::created`] names them)
    /// so later steps of the round see them, and starts the pool's scale-up cooldown.
    pub(super) fn reserve(&mut self, p: usize, count: u32, now: Millis) {
        for i in 0..count {
            self.nodes.insert(
                format!("\u{0}reserved-{p}-{i}-{}", self.nodes.len()),
                NodeRec {
                    pool: p,
                    created: now,
                    phase: Phase::Provisioning,
                    idle_since: None,
                    noticed: false,
                    removable_since: None,
                    replaceable_since: None,
                },
            );
        }
        self.pools[p].last_up = Some(now);
    }

    pub(super) fn release_reservations(&mut self) {
        self.nodes.retain(|id, _| !id.starts_with('\u{0}'));
    }
}
