//! What workers cost and what teams spent against their budgets: a worker pays its agent's
//! price × its dominant share of the agent × its run time (`crate::usage`, "Cost"), recorded
//! when it ends; [`crate::budget::Budgets`] adds it up per team, with the running workers'
//! cost so far, for the API's budget check at every submission.

use std::time::Instant;

use gantry_sdk::placement::cost;
use gantry_sdk::protocol::Resources;

use super::{member_resources, Core, KnownAgent};
use crate::budget::BudgetView;
use crate::model::UsageRecord;

impl KnownAgent {
    /// The agent's price per hour (its `price_per_hour` attribute), when it has a valid one.
    fn price_per_hour(&self) -> Option<f64> {
        let p = self.attributes.get(cost::PRICE_ATTRIBUTE)?;
        cost::parse_price(p).ok()
    }

    /// What a worker holding `res` here costs per second: the price × its share of the
    /// agent. Offers carry every healthy GPU of an agent, so a GPU worker's share is exact:
    /// its GPUs over the agent's (GPU-dominant, as `gantry_placement::cost` attributes on a
    /// GPU node). A CPU-only worker pays its dominant share of the CPUs and memory the queue
    /// has seen of the agent (the most it was offered at once plus its own workers there,
    /// [`Core::learn_capacity`]): offers shaped to a declared demand show only part of an
    /// agent, so that share can come out larger than the master's, never smaller. The
    /// master's usage report divides by the agent's whole shape and also charges a GPU task
    /// that holds more than its GPU share of CPUs or memory by that larger share.
    pub(super) fn cost_per_sec(&self, res: &Resources) -> Option<f64> {
        let price = self.price_per_hour()?;
        let amounts = |r: &Resources| cost::Amounts {
            cpus: r.get("cpus"),
            mem: r.get("mem"),
            gpus: r.get("gpus"),
        };
        let gpus = self.gpus.len() as f64;
        let share = if res.get("gpus") > 0.0 && gpus > 0.0 {
            (res.get("gpus") / gpus).min(1.0)
        } else {
            cost::dominant_share(&amounts(res), &amounts(&self.capacity))
        };
        Some(price / 3600.0 * share)
    }
}

impl Core {
    /// The wall clock at `now` (Unix ms), from the last one given.
    fn wall_at(&self, now: Instant) -> u64 {
        match self.wall {
            Some((at, ms)) => super::persist::to_unix(now, at, ms),
            None => 0,
        }
    }

    /// What `team`'s workers (staging or running) have cost so far at `now`.
    pub(super) fn running_cost(&self, team: &str, now: Instant) -> f64 {
        self.with_members()
            .filter(|j| j.spec.team == team)
            .flat_map(|j| j.members.values().map(move |m| (j, m)))
            .filter_map(|(j, m)| {
                let per_sec = self
                    .agents
                    .get(&m.agent_id)?
                    .cost_per_sec(&member_resources(&j.spec))?;
                Some(per_sec * m.held_secs(now))
            })
            .sum()
    }

    /// Where `team` stands against its budget at `now`; `None` without one.
    pub fn budget(&self, team: &str, now: Instant) -> Option<BudgetView> {
        if self.budgets.is_empty() {
            return None;
        }
        let running = self.running_cost(team, now);
        self.budgets.view(team, self.wall_at(now), running)
    }

    /// Every team with a budget, where it stands at `now`.
    pub fn budgets(&self, now: Instant) -> Vec<BudgetView> {
        self.budgets
            .teams()
            .filter_map(|t| self.budget(t, now))
            .collect()
    }

    /// Counts workers' costs toward their teams' budgets: the store's whole usage history
    /// when the queue starts, then each commit's newly ended workers (`now_ms`: the wall
    /// clock). Records outside the period are skipped.
    pub fn count_spending(&mut self, records: &[UsageRecord], now_ms: u64) {
        if self.budgets.is_empty() {
            return;
        }
        for r in records {
            if let Some(c) = r.cost {
                self.budgets.record(&r.team, r.ended_unix_ms, c, now_ms);
            }
        }
    }
}
