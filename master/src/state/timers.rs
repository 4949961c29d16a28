//! Timers: agents that did not re-register in time, frameworks past their failover timeout,
//! and expired offers.

use super::*;

impl Master {
    pub(super) fn tick(&mut self, now: Millis, out: &mut Vec<Output>) {
        // Agents from the registry that never came back after a failover are forgotten.
        let gone: Vec<AgentId> = self
            .recovered_agents
            .iter()
            .filter(|(_, r)| now > r.deadline)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(RecoveredAgent {
                record: rec,
                dynamic,
                ..
            }) = self.recovered_agents.remove(&id)
            {
                if self.recovered_by_name.get(&rec.name) == Some(&id) {
                    self.recovered_by_name.remove(&rec.name);
                }
                tracing::warn!(agent = %rec.name, "agent did not re-register after failover; removed");
                for role in dynamic.keys() {
                    out.push(Output::Persist(Mutation::RemoveReservation {
                        agent_id: id,
                        role: role.clone(),
                    }));
                }
                out.push(Output::Persist(Mutation::RemoveAgent(id)));
                self.forget_drain(id, out);
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
            self.remove_agent(id, "agent lost: did not re-register in time", now, out);
        }
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
