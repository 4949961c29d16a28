//! Task groups ([`TaskGroup`]): tasks a framework launches together on one agent, all or
//! none, with what happens to the rest when one ends ([`GroupPolicy`]).

use super::*;

/// The most tasks one [`TaskGroup`] may hold; the master refuses larger groups.
pub const MAX_GROUP_TASKS: usize = 64;

/// What an agent does with the other members of a [`TaskGroup`] when one ends (applied by the
/// agent, which records it with each member, so it survives an agent restart).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GroupPolicy {
    /// A member that ends other than `FINISHED` (failed, killed, lost, could not start) gets
    /// the others killed (Mesos's default executor). A member that finishes leaves the others
    /// running.
    #[default]
    KillOnFailure,
    /// Any member that ends, also `FINISHED`, gets the others killed: the group stops together
    /// (a server and its load generator, an evaluation gang).
    KillOnAnyEnd,
    /// Each member runs to its own end.
    Independent,
}

/// Several tasks launched atomically on one agent (Mesos `LAUNCH_GROUP`), in an
/// [`Operation::LaunchGroup`]: the master validates the group as a whole (one invalid member
/// refuses every member, nothing is launched or charged) and sends it to the agent as one
/// message; the agent starts all of them or none, gives each member the others' ids and
/// ports (`GANTRY_GROUP_ID`, `GANTRY_GROUP_INDEX`, `GANTRY_GROUP_MEMBERS`,
/// `GANTRY_GROUP_ADDRS`: docs/protocol.md) and applies the group's [`GroupPolicy`].
///
/// ```
/// use gantry_proto::{GroupPolicy, TaskGroup, TaskInfo};
/// let r: gantry_proto::Resources = "cpus:1;mem:512;gpus:2;ports:1".parse().unwrap();
/// let group = TaskGroup::new("eval-1", vec![
///     TaskInfo::new("eval-0", "./serve", r.clone()),
///     TaskInfo::new("eval-1", "./serve", r),
/// ])
/// .with_policy(GroupPolicy::KillOnAnyEnd);
/// assert_eq!(group.resources().to_string(), "cpus:2;gpus:4;mem:1024;ports:2");
/// assert_eq!(group.problem(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskGroup {
    /// Chosen by the framework (1 to 64 bytes of `A-Z a-z 0-9 . _ -`), shown to the members as
    /// `GANTRY_GROUP_ID`.
    pub group_id: String,
    /// The members (1 to [`MAX_GROUP_TASKS`]), in the order of `GANTRY_GROUP_INDEX`.
    pub tasks: Vec<TaskInfo>,
    /// What happens to the others when one member ends.
    pub policy: GroupPolicy,
}

impl TaskGroup {
    /// A group of `tasks` under [`GroupPolicy::KillOnFailure`].
    pub fn new(group_id: impl Into<String>, tasks: Vec<TaskInfo>) -> Self {
        TaskGroup {
            group_id: group_id.into(),
            tasks,
            policy: GroupPolicy::default(),
        }
    }

    /// With another failure policy.
    pub fn with_policy(mut self, policy: GroupPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// What all members ask for together.
    pub fn resources(&self) -> Resources {
        self.tasks
            .iter()
            .fold(Resources::new(), |acc, t| acc.plus(&t.resources))
    }

    /// Why the group is malformed as a group (its id, its size, a task id twice), if it is.
    /// Each member is also checked on its own, as any task.
    pub fn problem(&self) -> Option<String> {
        let id_ok = !self.group_id.is_empty()
            && self.group_id.len() <= 64
            && self
                .group_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !id_ok {
            return Some(format!(
                "group id {:?} is not 1 to 64 bytes of A-Z a-z 0-9 . _ -",
                self.group_id.chars().take(80).collect::<String>()
            ));
        }
        if self.tasks.is_empty() {
            return Some("the group has no task".into());
        }
        if self.tasks.len() > MAX_GROUP_TASKS {
            return Some(format!(
                "the group has {} tasks; at most {MAX_GROUP_TASKS}",
                self.tasks.len()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        self.tasks
            .iter()
            .find(|t| !seen.insert(t.task_id))
            .map(|t| format!("task id {} appears twice in the group", t.task_id))
    }
}

/// One member of a group as the master sends it to the agent
/// ([`MasterToAgent::RunTaskGroup`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupMember {
    /// What to run.
    pub task: TaskInfo,
    /// The GPUs the master chose for it (as in [`MasterToAgent::RunTask`]).
    pub gpus: Vec<String>,
}
