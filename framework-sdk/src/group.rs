//! Task groups (Mesos `LAUNCH_GROUP`): several tasks launched atomically on one agent with
//! [`DriverHandle::launch_group`](crate::scheduler::DriverHandle::launch_group). The
//! [`TaskGroup`] type is the protocol's (re-exported here); this module adds the placement
//! helper that finds one agent whose offers hold the whole group ([`place_group`]).
//!
//! What the master and agent guarantee: the group is validated as a whole (one invalid member
//! refuses every member, each ends `ERROR` with the same reason naming the member at fault,
//! nothing is charged); the agent starts all members or none (a member that cannot start
//! fails every member, `FAILED` with a reason naming it); each member reads the others' ids
//! and ports from `GANTRY_GROUP_MEMBERS` / `GANTRY_GROUP_ADDRS`; and the group's
//! [`GroupPolicy`] says what happens to the others when one ends (default: a failure kills
//! them). Gangs spanning agents stay the framework's ([`crate::placement::gang`]).
//!
//! ```
//! use gantry_sdk::group::{place_group, GroupPolicy, TaskGroup};
//! use gantry_sdk::placement::offers::{AgentView, FreeGpu};
//! use gantry_sdk::protocol::{AgentId, OfferId, TaskInfo};
//!
//! let agent = |id: u128, gpus: u32| AgentView {
//!     agent_id: AgentId::from_u128(id),
//!     hostname: format!("node{id}"),
//!     offer_ids: vec![OfferId::from_u128(id)],
//!     resources: format!("cpus:8;mem:8192;gpus:{gpus}").parse().unwrap(),
//!     attributes: Default::default(),
//!     gpus: (0..gpus)
//!         .map(|i| FreeGpu {
//!             uuid: format!("GPU-{id}-{i}"),
//!             model: "A100".into(),
//!             memory_mib: 40_960,
//!             numa_node: Some(0),
//!             pci_bus_id: format!("0000:0{i}:00.0"),
//!             free_milli: 1000,
//!         })
//!         .collect(),
//! };
//! let mut agents = vec![agent(1, 2), agent(2, 4)];
//! let member = |name: &str| TaskInfo::new(name, "./eval", "cpus:1;mem:1024;gpus:2".parse().unwrap());
//! let group = TaskGroup::new("eval", vec![member("eval-0"), member("eval-1")])
//!     .with_policy(GroupPolicy::KillOnAnyEnd);
//! // Four GPUs together: only the second agent holds the whole group.
//! let placed = place_group(&mut agents, &group).expect("fits agent 2");
//! assert_eq!(placed.agent_id, AgentId::from_u128(2));
//! assert_eq!(placed.gpus, vec![vec!["GPU-2-0".to_string(), "GPU-2-1".into()], vec!["GPU-2-2".into(), "GPU-2-3".into()]]);
//! assert_eq!(agents[1].resources.milli("gpus"), 0);
//! ```

use gantry_placement::offers::{place_all, AgentView, TaskRequest};
use gantry_proto::{AgentId, OfferId};
pub use gantry_proto::{GroupMember, GroupPolicy, TaskGroup, MAX_GROUP_TASKS};

/// Where a whole group goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlacement {
    /// Index of the agent in the view list.
    pub agent: usize,
    /// The agent.
    pub agent_id: AgentId,
    /// Its offers: accept them together.
    pub offer_ids: Vec<OfferId>,
    /// The GPUs (UUIDs) each member is expected to get, in member order (empty when the view
    /// lists no GPUs or the member asks for none).
    pub gpus: Vec<Vec<String>>,
}

/// The first agent (in view order) whose offers hold every member of `group` (resources, GPU
/// selectors, whole GPUs); what the group takes is removed from that agent's view. `None`:
/// no single agent holds the whole group (members asking for fractions of a GPU are checked
/// by their resources only).
pub fn place_group(agents: &mut [AgentView], group: &TaskGroup) -> Option<GroupPlacement> {
    let requests: Vec<TaskRequest> = group
        .tasks
        .iter()
        .map(|t| TaskRequest {
            resources: t.resources.clone(),
            gpu_selector: t.gpu_selector.clone(),
            ..TaskRequest::default()
        })
        .collect();
    let need = group.resources();
    for (i, view) in agents.iter_mut().enumerate() {
        if !view.resources.contains(&need) {
            continue;
        }
        let mut one = vec![view.clone()];
        let gpus = match place_all(&mut one, &requests) {
            Ok(plan) => plan.assignments.into_iter().map(|a| a.gpus).collect(),
            Err(gantry_placement::offers::PlaceError::BadGpuAmount(_)) => {
                one[0].resources.checked_sub_assign(&need);
                vec![Vec::new(); group.tasks.len()]
            }
            Err(_) => continue,
        };
        let placed = GroupPlacement {
            agent: i,
            agent_id: view.agent_id,
            offer_ids: view.offer_ids.clone(),
            gpus,
        };
        if let Some(taken) = one.pop() {
            *view = taken;
        }
        return Some(placed);
    }
    None
}
