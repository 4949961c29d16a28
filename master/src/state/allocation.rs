//! The allocation cycle from the master's side: when one is due (event-triggered cycles at
//! least [`CYCLE_GAP_FACTOR`] × the last cycle's duration apart), running the allocator and
//! turning its offers into messages for frameworks.

use super::*;

impl Master {
    /// The allocator (read-only), for views and metrics.
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// True when an allocation should run now: after events that free or add resources (at
    /// most once per [`Master::allocation_gap_ms`]), or when the batch interval has passed.
    /// Never once the leadership lease has lapsed ([`Master::leads_at`]).
    pub fn allocation_due(&self, now: Millis) -> bool {
        if !self.leads_at(now) {
            return false;
        }
        let since = now.saturating_sub(self.last_batch);
        (self.allocation_pending && since >= self.allocation_gap_ms())
            || since >= self.config.allocation_interval_ms
    }

    /// When an event-triggered allocation that is not due yet will be (for the shell's timer).
    pub fn next_allocation_at(&self) -> Option<Millis> {
        self.allocation_pending
            .then(|| self.last_batch + self.allocation_gap_ms())
    }

    /// The least time between event-triggered cycles: `allocation_min_gap_ms`, or
    /// [`CYCLE_GAP_FACTOR`] times the last cycle's duration when that is longer, so cycles
    /// take at most about a fifth of the core loop whatever they cost (cheap cycles run often
    /// and offers wait little; a cycle over every agent of a large cluster waits longer).
    pub fn allocation_gap_ms(&self) -> Millis {
        self.config
            .allocation_min_gap_ms
            .max(self.last_cycle_us.saturating_mul(CYCLE_GAP_FACTOR) / 1000)
    }

    /// Runs one allocation cycle and returns the offers to send.
    pub fn allocate(&mut self, now: Millis, out: &mut Vec<Output>) {
        self.allocator.accrue(now);
        self.allocation_pending = false;
        self.last_batch = now;
        self.sync_gpu_views();
        // Idle offers on the agents of a GPU model that a framework's demand names and cannot
        // otherwise be offered (allocator::models), then the cycle offers them to it first.
        for rec in self.allocator.reclaim_for_models(now) {
            self.send_rescind(&rec, out);
        }
        let offers = self.allocator.allocate(now);
        let mut by_framework: HashMap<FrameworkId, Vec<Offer>> = HashMap::new();
        // Free shares per GPU, once per agent per cycle (an agent may be offered to several
        // frameworks or roles in one cycle).
        // The last offer of an agent takes its shares (most agents get one offer a cycle:
        // no copy at all).
        // An offer without GPUs (what is left of an agent whose GPUs are taken) lists none.
        let mut offers_left: HashMap<AgentId, usize> = HashMap::new();
        for rec in offers.iter().filter(|r| r.resources.has_gpus()) {
            *offers_left.entry(rec.agent).or_default() += 1;
        }
        let mut gpu_free: HashMap<AgentId, Vec<GpuFree>> = HashMap::new();
        for rec in offers {
            let free = if !rec.resources.has_gpus() {
                Vec::new()
            } else {
                let left = offers_left.get_mut(&rec.agent).map_or(0, |n| {
                    *n -= 1;
                    *n
                });
                if left == 0 {
                    gpu_free
                        .remove(&rec.agent)
                        .unwrap_or_else(|| self.gpu_free(rec.agent))
                } else {
                    gpu_free
                        .entry(rec.agent)
                        .or_insert_with(|| self.gpu_free(rec.agent))
                        .clone()
                }
            };
            let free = self.offer_gpu_free(rec.agent, rec.id, free);
            match self.offer_message(&rec, free) {
                Some(offer) => by_framework.entry(rec.framework).or_default().push(offer),
                None => {
                    self.allocator.rescind(rec.id);
                }
            }
        }
        for (fw, offers) in by_framework {
            if let Some(conn) = self.frameworks.get(&fw).and_then(|f| f.conn) {
                // As many messages as the frame limit needs (many agents, large attributes).
                let split = codec::split_batches(offers, MasterToFramework::Offers);
                for o in split.oversized {
                    // Registration bounds make this unreachable; never send what can not go.
                    tracing::warn!(framework = %fw, agent = %o.agent_id, "an offer does not fit in a frame; rescinded");
                    self.allocator.rescind(o.id);
                }
                for batch in split.batches {
                    out.push(Output::ToFramework(conn, batch));
                }
            } else {
                for o in offers {
                    self.allocator.rescind(o.id);
                }
            }
        }
    }

    /// The offer `rec` as sent; its GPU list (and `gpu_free`) only when it offers GPUs.
    fn offer_message(&self, rec: &OfferRecord, gpu_free: Vec<GpuFree>) -> Option<Offer> {
        let agent = self.agents.get(&rec.agent)?;
        let gpus = if rec.resources.has_gpus() {
            agent.offer_parts().gpus.clone()
        } else {
            std::sync::Arc::from([])
        };
        Some(Offer {
            id: rec.id,
            framework_id: rec.framework,
            agent_id: rec.agent,
            hostname: agent.hostname.clone(),
            role: rec.role.clone(),
            resources: rec.resources.unreserved.clone(),
            reserved: rec.resources.reserved.clone(),
            attributes: agent.offer_parts().attributes.clone(),
            gpus,
            gpu_free,
            agent_name: agent.name.clone(),
        })
    }
}
