//! The agent inventory (protocol v14): frameworks subscribed with
//! [`Capability::AgentInventory`] hear of every agent of the cluster, offered to them or not
//! ([`MasterToFramework::Agents`]): the whole list after each subscription, then each agent
//! again when it registers, re-registers or a GPU's health changes. Removals are
//! [`MasterToFramework::AgentRemoved`] (sent to every framework, `Master::send_agent_removed`).

use super::*;

impl Master {
    /// What `id` registered with, as frameworks see it.
    fn agent_summary(&self, id: AgentId) -> Option<AgentSummary> {
        self.agents.get(&id).map(|a| AgentSummary {
            agent_id: a.id,
            hostname: a.hostname.clone(),
            agent_name: a.name.clone(),
            resources: a.resources.clone(),
            reserved: a.reserved.clone(),
            attributes: a.attributes.clone(),
            gpus: a.gpus.clone(),
        })
    }

    /// Whether framework `f` asked for the inventory.
    fn wants_inventory(f: &FrameworkRec) -> bool {
        f.capabilities.contains(&Capability::AgentInventory)
    }

    /// Sends `summaries` to `conn` in as many messages as the frame bound needs.
    fn send_summaries(conn: ConnId, summaries: Vec<AgentSummary>, out: &mut Vec<Output>) {
        let split = codec::split_batches(summaries, MasterToFramework::Agents);
        for a in split.oversized {
            // Registration bounds make this unreachable; never send what can not go.
            tracing::warn!(agent = %a.agent_id, "an agent summary does not fit in a frame");
        }
        for batch in split.batches {
            out.push(Output::ToFramework(conn, batch));
        }
    }

    /// After framework `fw` subscribed on `conn`: every agent, if it asked for them.
    pub(super) fn send_inventory(&self, fw: FrameworkId, conn: ConnId, out: &mut Vec<Output>) {
        if !self.frameworks.get(&fw).is_some_and(Self::wants_inventory) {
            return;
        }
        let mut ids: Vec<AgentId> = self.agents.keys().copied().collect();
        ids.sort_unstable();
        let summaries = ids
            .into_iter()
            .filter_map(|id| self.agent_summary(id))
            .collect();
        Self::send_summaries(conn, summaries, out);
    }

    /// Agent `id` registered, re-registered or changed: tell the frameworks that asked.
    pub(super) fn send_agent_summary(&self, id: AgentId, out: &mut Vec<Output>) {
        let mut conns: Vec<(FrameworkId, ConnId)> = self
            .frameworks
            .iter()
            .filter(|(_, f)| Self::wants_inventory(f))
            .filter_map(|(fid, f)| f.conn.map(|c| (*fid, c)))
            .collect();
        if conns.is_empty() {
            return;
        }
        let Some(summary) = self.agent_summary(id) else {
            return;
        };
        conns.sort_unstable();
        for (_, conn) in conns {
            Self::send_summaries(conn, vec![summary.clone()], out);
        }
    }
}
