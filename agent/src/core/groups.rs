//! Task groups in the core (Mesos `LAUNCH_GROUP`): a group from the master
//! ([`MasterToAgent::RunTaskGroup`]) starts as a whole or not at all, each member learns the
//! others' ids and ports from its environment, and the group's [`GroupPolicy`] decides what
//! happens to the others when one member ends. The policy is recorded with each member
//! ([`GroupTag`] in its [`super::TaskRecord`]), so it survives an agent restart.
//!
//! The environment every member gets (documented in docs/protocol.md):
//! `GANTRY_GROUP_ID` (the group's id), `GANTRY_GROUP_INDEX` (this member's position, from 0),
//! `GANTRY_GROUP_SIZE`, `GANTRY_GROUP_ADDRS` (`host:port` of each member's first port, in
//! member order, comma-separated; `host` alone for a member without ports) and
//! `GANTRY_GROUP_MEMBERS` (JSON: `[{"index", "task_id", "name", "host", "ports"}]`).

use std::collections::{BTreeMap, BTreeSet};

use gantry_proto::*;
use serde::{Deserialize, Serialize};

use super::AgentCore;

/// A member's group, recorded with the member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupTag {
    /// The group's id.
    pub id: String,
    /// What happens to the others when a member ends.
    pub policy: GroupPolicy,
    /// Every member, in order (this one included).
    pub members: Vec<TaskId>,
    /// Set when the group's policy killed this member: why (the member that ended first).
    #[serde(default)]
    pub killed_because: Option<String>,
}

/// One member as its siblings see it in `GANTRY_GROUP_MEMBERS`.
#[derive(Debug, Serialize)]
struct MemberView<'a> {
    index: usize,
    task_id: String,
    name: &'a str,
    host: &'a str,
    ports: &'a [u16],
}

/// The group environment of every member, in member order: `(task name, id, ports)` each.
pub(crate) fn group_env(
    group_id: &str,
    host: &str,
    members: &[(&str, TaskId, &[u16])],
) -> Vec<BTreeMap<String, String>> {
    let views: Vec<MemberView<'_>> = members
        .iter()
        .enumerate()
        .map(|(index, (name, id, ports))| MemberView {
            index,
            task_id: id.to_string(),
            name,
            host,
            ports,
        })
        .collect();
    let json = serde_json::to_string(&views).unwrap_or_else(|_| "[]".into());
    let addrs: Vec<String> = members
        .iter()
        .map(|(_, _, ports)| match ports.first() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        })
        .collect();
    let addrs = addrs.join(",");
    (0..members.len())
        .map(|i| {
            BTreeMap::from([
                ("GANTRY_GROUP_ID".to_string(), group_id.to_string()),
                ("GANTRY_GROUP_INDEX".to_string(), i.to_string()),
                ("GANTRY_GROUP_SIZE".to_string(), members.len().to_string()),
                ("GANTRY_GROUP_ADDRS".to_string(), addrs.clone()),
                ("GANTRY_GROUP_MEMBERS".to_string(), json.clone()),
            ])
        })
        .collect()
}

/// Whether a member ending in `state` gets the others killed under `policy`.
pub(crate) fn kills_siblings(policy: GroupPolicy, state: TaskState) -> bool {
    match policy {
        GroupPolicy::KillOnFailure => state.is_terminal() && state != TaskState::Finished,
        GroupPolicy::KillOnAnyEnd => state.is_terminal(),
        GroupPolicy::Independent => false,
    }
}

impl AgentCore {
    /// Launches a group: every member is admitted (GPUs, ports, user; checkpointed with its
    /// [`GroupTag`]); if one cannot start, none is started and every member ends `FAILED`
    /// with one message naming that member; else all start, each with the group environment.
    pub(super) fn run_group(
        &mut self,
        framework_id: FrameworkId,
        group_id: String,
        policy: GroupPolicy,
        members: Vec<GroupMember>,
        unbindable_ports: &BTreeSet<u16>,
        now: u64,
    ) {
        let ids: Vec<TaskId> = members.iter().map(|m| m.task.task_id).collect();
        let distinct: BTreeSet<TaskId> = ids.iter().copied().collect();
        if distinct.len() != ids.len() {
            tracing::warn!(group = %group_id, "task group naming a task twice ignored");
            return;
        }
        if ids.iter().any(|id| self.ckpt.tasks.contains_key(id)) {
            // Sent again (a reconnect): the members are ours already.
            tracing::warn!(group = %group_id, "duplicate task group launch ignored");
            return;
        }
        let tag = GroupTag {
            id: group_id.clone(),
            policy,
            members: ids.clone(),
            killed_because: None,
        };
        let mut admitted = Vec::with_capacity(members.len());
        let mut failed: Option<(TaskId, String, TaskReason, String)> = None;
        for m in members {
            let (id, name) = (m.task.task_id, m.task.name.clone());
            match self.admit(
                framework_id,
                m.task,
                &m.gpus,
                unbindable_ports,
                Some(tag.clone()),
                now,
            ) {
                Ok(a) => admitted.push(a),
                Err((reason, why)) => {
                    failed.get_or_insert((id, name, reason, why));
                }
            }
        }
        if let Some((bad, name, reason, why)) = failed {
            let message = format!(
                "task group {group_id}: member {name:?} ({bad}) could not start: {why}; no member was started"
            );
            tracing::warn!("{message}");
            for id in ids {
                let reason = if id == bad {
                    reason
                } else {
                    TaskReason::LaunchFailed
                };
                self.terminal(
                    id,
                    TaskState::Failed,
                    Some(reason),
                    message.clone(),
                    None,
                    None,
                    now,
                );
            }
            return;
        }
        let views: Vec<(&str, TaskId, &[u16])> = admitted
            .iter()
            .map(|a| (a.task.name.as_str(), a.task.task_id, a.ports.as_slice()))
            .collect();
        let envs = group_env(&group_id, &self.config.hostname, &views);
        tracing::info!(group = %group_id, members = admitted.len(), "starting task group");
        for (a, env) in admitted.into_iter().zip(envs) {
            self.start(a, env, now);
        }
    }

    /// A member ended in `state`: under its group's policy, the others still running are
    /// killed (each ends `KILLED` with a message naming this member). Members not started yet
    /// (`STAGING`, a group being refused) and members the policy killed themselves are left
    /// out.
    pub(super) fn group_member_ended(&mut self, task: TaskId, state: TaskState, now: u64) {
        let Some(rec) = self.ckpt.tasks.get(&task) else {
            return;
        };
        let Some(tag) = rec.group.as_ref() else {
            return;
        };
        if tag.killed_because.is_some() || !kills_siblings(tag.policy, state) {
            return;
        }
        let why = format!(
            "task group {}: member {:?} ({task}) ended {state}",
            tag.id, rec.info.name
        );
        let framework_id = rec.framework_id;
        let siblings: Vec<TaskId> = tag.members.iter().copied().filter(|s| *s != task).collect();
        for sib in siblings {
            let Some(srec) = self.ckpt.tasks.get_mut(&sib) else {
                continue;
            };
            if srec.state.is_terminal()
                || srec.state == TaskState::Staging
                || srec.kill_requested_ms.is_some()
            {
                continue;
            }
            if let Some(g) = srec.group.as_mut() {
                g.killed_because = Some(why.clone());
            }
            tracing::info!(task = %sib, "{why}: killing the member");
            self.kill(framework_id, sib, now);
        }
    }
}
