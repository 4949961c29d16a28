//! Timers: agents that did not re-register in time (unreachable, then gone), frameworks past their failover timeout,
//! and expired offers; the leadership lease; and [`Master::next_deadline`], the earliest time
//! any of them (or the next allocation cycle) is due, which the shell sleeps until.

use super::*;

impl Master {
    /// Whether this master may act as leader at `now`: no lease was given
    /// ([`Input::LeaseUntil`] with `None`, standalone), or `now` is before its deadline.
    pub fn leads_at(&self, now: Millis) -> bool {
        self.lease_until.is_none_or(|until| now < until)
    }

    /// The earliest time the core has something to do without a new input (quinn-proto's
    /// `poll_timeout`): the next allocation cycle (only while the lease holds), an agent that
    /// must be back after a failover, a silent agent, a disconnected agent or framework past its
    /// timeout, an offer past its timeout. The shell sends [`Input::Tick`] (and allocates when
    /// [`Master::allocation_due`]) once it has come; `None`: nothing until the next input.
    ///
    /// Call it after allocating: a cycle that is due and was not run is reported at its due
    /// time (at or before `now`). Decline filters need no wake-up of their own: they only
    /// matter to the next cycle, which is due anyway. Reconciliation slices
    /// ([`Master::has_backlog`]) are the shell's to schedule. Cost: a pass over frameworks
    /// (and over outstanding offers when offers time out); the agents' part is
    /// `Master::agent_timer_floor`, a pass over every agent only when its floor has come or
    /// an agent connected or disconnected. The answer may then be earlier than needed (an
    /// agent heard from since the floor was computed): the early `Tick` finds nothing due and
    /// the next answer is exact.
    pub fn next_deadline(&self, now: Millis) -> Option<Millis> {
        // The timer conditions in `tick` are strict (`now > at`): due one millisecond later.
        let after = |at: Millis, timeout: u64| at.saturating_add(timeout).saturating_add(1);
        let allocation = self.leads_at(now).then(|| {
            let interval = self.last_batch + self.config.allocation_interval_ms;
            match self.next_allocation_at() {
                Some(gap) => gap.min(interval),
                None => interval,
            }
        });
        // Agents' timers from their floor: exact once it has come (then recomputed), earlier than
        // needed only after agents were heard from since (a spare tick, which recomputes it).
        let agents = Some(self.agent_timer_floor(now)).filter(|t| *t != Millis::MAX);
        let frameworks = self
            .frameworks
            .values()
            .filter_map(|f| f.disconnected_at.map(|t| after(t, f.failover_timeout_ms)));
        allocation
            .into_iter()
            .chain(agents)
            .chain(frameworks)
            .chain(self.allocator.next_offer_expiry())
            .chain(self.next_maintenance_deadline(now))
            .min()
    }

    /// A lower bound on the earliest agent timer (`Millis::MAX`: none): a silent agent, a
    /// disconnected agent past its re-register timeout, a recovered agent not back in time.
    /// Cached: every agent message moves its agent's silence deadline later, never earlier, so
    /// a floor stays a lower bound until an agent connects or disconnects
    /// ([`Master::agent_timers_changed`]); once it has come it is recomputed (one pass over
    /// the agents) and is exact again.
    pub(super) fn agent_timer_floor(&self, now: Millis) -> Millis {
        if let Some(floor) = self.agent_timer_floor.get().filter(|f| *f > now) {
            return floor;
        }
        // The timer conditions in `tick` are strict (`now > at`): due one millisecond later.
        let after = |at: Millis, timeout: u64| at.saturating_add(timeout).saturating_add(1);
        let recovered = self.recovered_agents.values().map(|r| after(r.deadline, 0));
        let agents = self.agents.values().flat_map(|a| {
            let silent = a
                .conn
                .map(|_| after(a.last_seen, self.config.agent_ping_timeout_ms));
            let lost = a
                .disconnected_at
                .map(|t| after(t, self.config.agent_reregister_timeout_ms));
            silent.into_iter().chain(lost)
        });
        let floor = recovered.chain(agents).min().unwrap_or(Millis::MAX);
        self.agent_timer_floor.set(Some(floor));
        floor
    }

    /// An agent connected or disconnected (or agents were recovered): its timers may be
    /// earlier than the cached floor.
    pub(super) fn agent_timers_changed(&self) {
        self.agent_timer_floor.set(None);
    }

    pub(super) fn tick(&mut self, now: Millis, out: &mut Vec<Output>) {
        // No agent timer has come: no pass over every agent.
        if self.agent_timer_floor(now) <= now {
            self.agent_timers(now, out);
            self.agent_timers_changed();
        }
        self.framework_timers(now, out);
    }

    /// Recovered agents that never came back, silent agents and lost agents.
    fn agent_timers(&mut self, now: Millis, out: &mut Vec<Output>) {
        // Agents from the registry not back in time after a failover are unreachable (their
        // tasks are unknown to this master: adopted if they come back in time); unreachable
        // agents not back within the unreachable timeout are gone.
        let due: Vec<AgentId> = self
            .recovered_agents
            .iter()
            .filter(|(_, r)| now > r.deadline)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(r) = self.recovered_agents.get_mut(&id) else {
                continue;
            };
            if r.unreachable.is_some() {
                let secs = self.config.agent_unreachable_timeout_ms / 1000;
                self.agent_gone(
                    id,
                    &format!("unreachable for longer than the unreachable timeout ({secs} s)"),
                    now,
                    out,
                );
            } else {
                tracing::warn!(agent = %r.record.name,
                    "agent did not re-register after failover; unreachable");
                r.unreachable = Some(Unreachable {
                    since: now,
                    ..Default::default()
                });
                r.deadline = now.saturating_add(self.config.agent_unreachable_timeout_ms);
            }
        }
        // Silent agents are disconnected.
        let silent: Vec<(AgentId, ConnId)> = self
            .agents
            .values()
            .filter_map(|a| {
                a.conn
                    .filter(|_| now.saturating_sub(a.last_seen) > self.config.agent_ping_timeout_ms)
                    .map(|c| (a.id, c))
            })
            .collect();
        for (id, c) in silent {
            self.conns.remove(&c);
            out.push(Output::Close {
                conn: c,
                reason: "agent missed its heartbeats".into(),
            });
            self.agent_disconnected(id, c, now, out);
        }
        // Disconnected agents that did not come back are lost.
        let lost: Vec<AgentId> = self
            .agents
            .values()
            .filter(|a| {
                a.disconnected_at.is_some_and(|t| {
                    now.saturating_sub(t) > self.config.agent_reregister_timeout_ms
                })
            })
            .map(|a| a.id)
            .collect();
        for id in lost {
            self.agent_unreachable(id, now, out);
        }
    }

    /// Frameworks past their failover timeout, expired offers and maintenance.
    fn framework_timers(&mut self, now: Millis, out: &mut Vec<Output>) {
        // Frameworks past their failover timeout are removed and their tasks killed.
        let expired: Vec<FrameworkId> = self
            .frameworks
            .values()
            .filter(|f| {
                f.disconnected_at
                    .is_some_and(|t| now.saturating_sub(t) > f.failover_timeout_ms)
            })
            .map(|f| f.id)
            .collect();
        for id in expired {
            self.remove_framework(id, "failover timeout expired", now, out);
        }
        for rec in self.allocator.expire_offers(now) {
            self.send_rescind(&rec, out);
        }
        self.maintenance_step(now, out);
    }
}
