//! Scenario replay: a TOML scenario (cluster settings, roles, timed events) applied to the real
//! allocator in simulated time, printing one JSON line per offer and rescind and a final summary.
//! The format is documented in `docs/simulator.md`.
//!
//! - this module: the format ([`Scenario`], [`ClusterSettings`], [`RoleDecl`], [`Event`] and
//!   its [`EventKind`]s) and its parsing and checks;
//! - [`replay`]: the replay ([`Replay`], [`run_scenario`]) and its output lines and
//!   [`Summary`]. Accepted and recovered resources are carved with
//!   [`OfferResources::carve`](crate::allocator::OfferResources::carve), the same function the
//!   state machine's accepts use.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::SimError;
use crate::allocator::Millis;

pub mod replay;
pub use replay::{run_scenario, Replay, ResourceSecondsSummary, ShareSummary, Summary};

/// `[cluster]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    #[serde(default = "default_interval")]
    pub allocation_interval_ms: Millis,
    #[serde(default)]
    pub offer_timeout_ms: Option<Millis>,
    #[serde(default = "default_true")]
    pub filter_gpu_resources: bool,
    #[serde(default)]
    pub fairness_excluded_resources: Vec<String>,
    /// Run until this time instead of last event + one interval.
    #[serde(default)]
    pub end_ms: Option<Millis>,
    /// Report resource-seconds (allocations integrated over simulated time, the master's
    /// `gantry_role_allocated_seconds_total`) in the summary.
    #[serde(default)]
    pub resource_seconds: bool,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            allocation_interval_ms: default_interval(),
            offer_timeout_ms: None,
            filter_gpu_resources: true,
            fairness_excluded_resources: Vec::new(),
            end_ms: None,
            resource_seconds: false,
        }
    }
}

fn default_interval() -> Millis {
    1000
}

fn default_true() -> bool {
    true
}

/// A `[[roles]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleDecl {
    pub name: String,
    #[serde(default)]
    pub weight: Option<f64>,
    #[serde(default)]
    pub quota_guarantee: Option<String>,
    #[serde(default)]
    pub quota_limit: Option<String>,
}

/// `demand = { task = "...", count = N }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemandDecl {
    pub task: String,
    pub count: u32,
}

/// One `[[events]]` entry (without `at_ms`).
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EventKind {
    AddAgent {
        agent: String,
        resources: String,
        #[serde(default)]
        reserved: BTreeMap<String, String>,
        #[serde(default)]
        attributes: Option<toml::Value>,
    },
    RemoveAgent {
        agent: String,
    },
    /// Replaces an agent's resources (e.g. a GPU withdrawn); offers that no longer fit are
    /// rescinded.
    UpdateAgent {
        agent: String,
        resources: String,
        #[serde(default)]
        reserved: BTreeMap<String, String>,
    },
    AddFramework {
        framework: String,
        roles: Vec<String>,
        #[serde(default)]
        capabilities: Vec<String>,
        #[serde(default)]
        demand: Option<DemandDecl>,
    },
    RemoveFramework {
        framework: String,
    },
    Accept {
        framework: String,
        agent: String,
        #[serde(default)]
        resources: Option<String>,
        #[serde(default)]
        refuse_seconds: Option<f64>,
        /// Dynamic reservations (RESERVE operations): role -> unreserved resources to reserve.
        #[serde(default)]
        reserve: BTreeMap<String, String>,
        /// UNRESERVE operations: role -> reserved resources to release.
        #[serde(default)]
        unreserve: BTreeMap<String, String>,
    },
    Decline {
        framework: String,
        agent: String,
        #[serde(default)]
        refuse_seconds: Option<f64>,
    },
    Recover {
        framework: String,
        agent: String,
        resources: String,
    },
    Suppress {
        framework: String,
        #[serde(default)]
        role: Option<String>,
    },
    Revive {
        framework: String,
        #[serde(default)]
        role: Option<String>,
    },
    SetWeight {
        role: String,
        weight: f64,
    },
    SetQuota {
        role: String,
        #[serde(default)]
        guarantee: Option<String>,
        #[serde(default)]
        limit: Option<String>,
    },
    SetDemand {
        framework: String,
        task: String,
        count: u32,
    },
}

impl EventKind {
    fn name(&self) -> &'static str {
        match self {
            EventKind::AddAgent { .. } => "add_agent",
            EventKind::RemoveAgent { .. } => "remove_agent",
            EventKind::UpdateAgent { .. } => "update_agent",
            EventKind::AddFramework { .. } => "add_framework",
            EventKind::RemoveFramework { .. } => "remove_framework",
            EventKind::Accept { .. } => "accept",
            EventKind::Decline { .. } => "decline",
            EventKind::Recover { .. } => "recover",
            EventKind::Suppress { .. } => "suppress",
            EventKind::Revive { .. } => "revive",
            EventKind::SetWeight { .. } => "set_weight",
            EventKind::SetQuota { .. } => "set_quota",
            EventKind::SetDemand { .. } => "set_demand",
        }
    }

    /// Allocation runs right after these (Mesos: new resources or new interest).
    fn triggers_allocation(&self) -> bool {
        matches!(
            self,
            EventKind::AddAgent { .. }
                | EventKind::UpdateAgent { .. }
                | EventKind::AddFramework { .. }
                | EventKind::Revive { .. }
                | EventKind::Recover { .. }
                | EventKind::SetDemand { .. }
        )
    }
}

/// A timed event, with its 0-based index in the file.
#[derive(Debug, Clone)]
pub struct Event {
    pub index: usize,
    pub at_ms: Millis,
    pub kind: EventKind,
}

/// A parsed scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub cluster: ClusterSettings,
    pub roles: Vec<RoleDecl>,
    pub events: Vec<Event>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default)]
    cluster: ClusterSettings,
    #[serde(default)]
    roles: Vec<RoleDecl>,
    #[serde(default)]
    events: Vec<toml::Table>,
}

impl Scenario {
    /// Parses the TOML text of a scenario.
    pub fn parse(text: &str) -> Result<Self, SimError> {
        let raw: RawScenario = toml::from_str(text).map_err(|e| SimError::Parse(e.to_string()))?;
        let mut events = Vec::with_capacity(raw.events.len());
        for (index, mut table) in raw.events.into_iter().enumerate() {
            let at = table
                .remove("at_ms")
                .ok_or_else(|| SimError::Parse(format!("event {index}: missing at_ms")))?;
            let at_ms = at.as_integer().filter(|v| *v >= 0).ok_or_else(|| {
                SimError::Parse(format!(
                    "event {index}: at_ms must be a non-negative integer"
                ))
            })? as Millis;
            let kind = EventKind::deserialize(toml::Value::Table(table))
                .map_err(|e| SimError::Parse(format!("event {index}: {e}")))?;
            events.push(Event { index, at_ms, kind });
        }
        // Events apply in file order within a millisecond; a stable sort keeps that order.
        events.sort_by_key(|e| e.at_ms);
        if raw.cluster.allocation_interval_ms == 0 {
            return Err(SimError::Parse(
                "cluster.allocation_interval_ms must be positive".into(),
            ));
        }
        Ok(Scenario {
            cluster: raw.cluster,
            roles: raw.roles,
            events,
        })
    }
}
