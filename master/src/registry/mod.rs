//! The master's persistent registry: what must survive a master restart or failover.
//!
//! Persisted: admitted agents (id, name, hostname), role weights, quotas, dynamic reservations,
//! frameworks (id, name, roles, principal, failover timeout), agents under maintenance (drain
//! state and deadline), agents marked gone, and the bounded event history (task state
//! transitions and cluster events with their times, in pages). Tasks, offers and usage are *not*
//! persisted: as in Mesos, a new leader rebuilds them from the agents' re-registration.
//!
//! - [`Registry`] is the plain in-memory value, [`Mutation`] one fine-grained change to it
//!   (`Registry::apply` is pure and idempotent: every mutation sets or removes one record).
//! - [`RegistryStore`] persists mutations, with two backends behind one interface so the server
//!   has a single code path:
//!   - [`FileStore`] (standalone mode): a JSON snapshot plus an fsync'd append-only journal in the
//!     work dir, compacted by atomic rewrite (temp file + fsync + rename + directory fsync).
//!   - [`EtcdStore`] (HA mode): one JSON value per record under a key prefix; every write is an
//!     etcd transaction fenced by the writer's leadership ([`Fence`]), so a deposed leader's write
//!     fails with [`RegistryError::Fenced`] instead of landing.
//! - [`RegistryWriter`] queues writes from the server's event loop and applies them in order,
//!   group-committing consecutive submissions (one etcd transaction / one fsync per group).

mod etcd;
mod file;
mod writer;

use std::collections::BTreeMap;

use gantry_proto::ids::{AgentId, FrameworkId};
use gantry_proto::resources::{ResourceLimits, Resources};
use serde::{Deserialize, Serialize};

pub use self::etcd::{EtcdStore, MAX_TXN_OPS};
pub use self::file::FileStore;
pub use self::writer::{PendingWrite, RegistryWriter, WriterStats, MAX_GROUP_OPS};

/// Proof of leadership that registry writes are checked against. It lives with the registry
/// (which checks it); the election (`crate::election`) produces it, so the arrow points one
/// way: election -> registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// Standalone mode: the only master, nothing to fence against (the work dir is `flock`ed).
    Standalone,
    /// etcd mode: writes succeed only while `leader_key` still has `create_revision`.
    Etcd {
        leader_key: Vec<u8>,
        create_revision: i64,
        lease: i64,
    },
}

/// An admitted agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: AgentId,
    /// The agent's name, taken from its certificate.
    pub name: String,
    pub hostname: String,
    /// Deactivated by an operator (`/api/v1/agents/{id}/deactivate`): not offered until
    /// reactivated, also after a failover.
    #[serde(default)]
    pub deactivated: bool,
}

/// A role's quota: resources guaranteed to it and the most it may hold.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Quota {
    pub guarantee: Resources,
    pub limit: ResourceLimits,
}

/// A dynamic reservation: the total of `resources` reserved for `role` on one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub agent_id: AgentId,
    pub role: String,
    pub resources: Resources,
}

/// A framework the master has given an id to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrameworkRecord {
    pub id: FrameworkId,
    pub name: String,
    pub roles: Vec<String>,
    /// The framework's principal, taken from its certificate.
    pub principal: String,
    /// How long its tasks survive a disconnection.
    pub failover_timeout_secs: f64,
    /// Whether it declared [`Capability::PartitionAware`](gantry_proto::Capability):
    /// after a failover, its tasks on agents that do not come back in time are `UNREACHABLE`
    /// before it subscribes again. Absent in records written before it existed (false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partition_aware: bool,
}

/// An agent under maintenance (drained or draining); see `crate::state::maintenance`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaintenanceRecord {
    pub agent_id: AgentId,
    /// The agent's name (for the operator's view while it is away).
    pub name: String,
    /// When the drain started, Unix milliseconds.
    pub started_unix_ms: u64,
    /// When what is left on the agent is killed, Unix milliseconds (`None`: never).
    pub deadline_unix_ms: Option<u64>,
    /// True once every task ended and its update was acknowledged.
    pub drained: bool,
    /// Why (`operator`, `spot termination notice`).
    pub reason: String,
}

/// An agent an operator marked gone: it may never re-register with its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoneRecord {
    pub agent_id: AgentId,
    pub name: String,
    /// When it was marked gone, Unix milliseconds.
    pub at_unix_ms: u64,
}

/// One event of the cluster's history: when the master recorded it, and the event as the
/// event stream sends it (`{"type": "task_updated", ...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEvent {
    pub at_unix_ms: u64,
    pub event: serde_json::Value,
}

/// A page of the event history (`crate::server::history`): pages are numbered in order and
/// rewritten while they fill; the oldest are removed past the history's bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryPage {
    pub page: u64,
    pub events: Vec<HistoryEvent>,
}

/// One framework and role's offer-seconds in a [`HeldOffersBucket`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldOffersRow {
    pub framework: String,
    pub role: String,
    pub cpu_seconds: f64,
    pub mem_mib_seconds: f64,
    pub gpu_seconds: f64,
}

/// An hour of resources held in outstanding offers (`crate::server::held_offers`), rewritten
/// while the hour lasts; the oldest are removed past 31 days.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldOffersBucket {
    /// The hour's start (Unix ms).
    pub start_ms: u64,
    /// The first sample counted in it.
    pub first_ms: u64,
    pub rows: Vec<HeldOffersRow>,
}

/// Everything the master persists. Maps are ordered so snapshots are deterministic.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Registry {
    pub agents: BTreeMap<AgentId, AgentRecord>,
    /// Role weight (1.0 when absent).
    pub weights: BTreeMap<String, f64>,
    pub quotas: BTreeMap<String, Quota>,
    /// Dynamic reservations: agent -> role -> resources.
    pub reservations: BTreeMap<AgentId, BTreeMap<String, Resources>>,
    pub frameworks: BTreeMap<FrameworkId, FrameworkRecord>,
    /// Agents under maintenance.
    #[serde(default)]
    pub maintenance: BTreeMap<AgentId, MaintenanceRecord>,
    /// Agents marked gone.
    #[serde(default)]
    pub gone: BTreeMap<AgentId, GoneRecord>,
    /// The event history, by page number (bounded: `crate::server::history`).
    #[serde(default)]
    pub history: BTreeMap<u64, HistoryPage>,
    /// Resources held in offers, by hour (`crate::server::held_offers`).
    #[serde(default)]
    pub held_offers: BTreeMap<u64, HeldOffersBucket>,
}

impl Registry {
    /// Applies one mutation. Idempotent: applying the same mutation twice equals applying it once.
    pub fn apply(&mut self, mutation: &Mutation) {
        match mutation {
            Mutation::PutAgent(a) => {
                self.agents.insert(a.id, a.clone());
            }
            Mutation::RemoveAgent(id) => {
                self.agents.remove(id);
            }
            Mutation::PutFramework(f) => {
                self.frameworks.insert(f.id, f.clone());
            }
            Mutation::RemoveFramework(id) => {
                self.frameworks.remove(id);
            }
            Mutation::SetWeight { role, weight } => {
                self.weights.insert(role.clone(), *weight);
            }
            Mutation::RemoveWeight { role } => {
                self.weights.remove(role);
            }
            Mutation::SetQuota { role, quota } => {
                self.quotas.insert(role.clone(), quota.clone());
            }
            Mutation::RemoveQuota { role } => {
                self.quotas.remove(role);
            }
            Mutation::SetReservation(r) => {
                if r.resources.is_empty() {
                    remove_reservation(&mut self.reservations, &r.agent_id, &r.role);
                } else {
                    self.reservations
                        .entry(r.agent_id)
                        .or_default()
                        .insert(r.role.clone(), r.resources.clone());
                }
            }
            Mutation::RemoveReservation { agent_id, role } => {
                remove_reservation(&mut self.reservations, agent_id, role);
            }
            Mutation::SetMaintenance(m) => {
                self.maintenance.insert(m.agent_id, m.clone());
            }
            Mutation::RemoveMaintenance(id) => {
                self.maintenance.remove(id);
            }
            Mutation::PutGone(g) => {
                self.gone.insert(g.agent_id, g.clone());
            }
            Mutation::PutHistoryPage(p) => {
                self.history.insert(p.page, p.clone());
            }
            Mutation::RemoveHistoryPage(page) => {
                self.history.remove(page);
            }
            Mutation::PutHeldOffers(b) => {
                self.held_offers.insert(b.start_ms, b.clone());
            }
            Mutation::RemoveHeldOffers(start) => {
                self.held_offers.remove(start);
            }
        }
    }

    /// All dynamic reservations as a flat list.
    pub fn reservation_list(&self) -> Vec<Reservation> {
        self.reservations
            .iter()
            .flat_map(|(agent_id, roles)| {
                roles.iter().map(|(role, resources)| Reservation {
                    agent_id: *agent_id,
                    role: role.clone(),
                    resources: resources.clone(),
                })
            })
            .collect()
    }

    /// The mutations that rebuild this registry from an empty one.
    pub fn to_mutations(&self) -> Vec<Mutation> {
        let mut out = Vec::new();
        out.extend(self.agents.values().cloned().map(Mutation::PutAgent));
        out.extend(
            self.weights
                .iter()
                .map(|(role, weight)| Mutation::SetWeight {
                    role: role.clone(),
                    weight: *weight,
                }),
        );
        out.extend(self.quotas.iter().map(|(role, quota)| Mutation::SetQuota {
            role: role.clone(),
            quota: quota.clone(),
        }));
        out.extend(
            self.reservation_list()
                .into_iter()
                .map(Mutation::SetReservation),
        );
        out.extend(
            self.frameworks
                .values()
                .cloned()
                .map(Mutation::PutFramework),
        );
        out.extend(
            self.maintenance
                .values()
                .cloned()
                .map(Mutation::SetMaintenance),
        );
        out.extend(self.gone.values().cloned().map(Mutation::PutGone));
        out.extend(self.history.values().cloned().map(Mutation::PutHistoryPage));
        out.extend(
            self.held_offers
                .values()
                .cloned()
                .map(Mutation::PutHeldOffers),
        );
        out
    }
}

fn remove_reservation(
    reservations: &mut BTreeMap<AgentId, BTreeMap<String, Resources>>,
    agent_id: &AgentId,
    role: &str,
) {
    if let Some(roles) = reservations.get_mut(agent_id) {
        roles.remove(role);
        if roles.is_empty() {
            reservations.remove(agent_id);
        }
    }
}

/// One fine-grained change to the registry. Every variant sets or removes exactly one record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Mutation {
    PutAgent(AgentRecord),
    RemoveAgent(AgentId),
    PutFramework(FrameworkRecord),
    RemoveFramework(FrameworkId),
    SetWeight {
        role: String,
        weight: f64,
    },
    RemoveWeight {
        role: String,
    },
    SetQuota {
        role: String,
        quota: Quota,
    },
    RemoveQuota {
        role: String,
    },
    /// Sets the total reserved for (agent, role); empty resources remove the reservation.
    SetReservation(Reservation),
    RemoveReservation {
        agent_id: AgentId,
        role: String,
    },
    /// Records (or updates) an agent's maintenance (drain) state.
    SetMaintenance(MaintenanceRecord),
    /// The agent is out of maintenance (undrained, or removed).
    RemoveMaintenance(AgentId),
    /// The agent was marked gone for good.
    PutGone(GoneRecord),
    /// A page of the event history (written again while it fills).
    PutHistoryPage(HistoryPage),
    /// An old page of the event history, past the bound.
    RemoveHistoryPage(u64),
    /// An hour of held offers (written again while it changes).
    PutHeldOffers(HeldOffersBucket),
    /// An hour of held offers past the bound (by its start).
    RemoveHeldOffers(u64),
}

impl Mutation {
    /// Rejects values that must never be persisted (bad weights, empty role names).
    pub fn validate(&self) -> Result<(), RegistryError> {
        let role = match self {
            Mutation::SetWeight { role, weight } => {
                if !weight.is_finite() || *weight <= 0.0 {
                    return Err(RegistryError::Invalid(format!(
                        "weight {weight} of role {role:?} is not a finite positive number"
                    )));
                }
                Some(role)
            }
            Mutation::RemoveWeight { role }
            | Mutation::SetQuota { role, .. }
            | Mutation::RemoveQuota { role }
            | Mutation::RemoveReservation { role, .. } => Some(role),
            Mutation::SetReservation(r) => Some(&r.role),
            Mutation::PutFramework(f) => {
                if !f.failover_timeout_secs.is_finite() || f.failover_timeout_secs < 0.0 {
                    return Err(RegistryError::Invalid(format!(
                        "failover timeout {} of framework {} is not a finite non-negative number",
                        f.failover_timeout_secs, f.id
                    )));
                }
                None
            }
            Mutation::PutAgent(_)
            | Mutation::RemoveAgent(_)
            | Mutation::RemoveFramework(_)
            | Mutation::SetMaintenance(_)
            | Mutation::RemoveMaintenance(_)
            | Mutation::PutGone(_)
            | Mutation::PutHistoryPage(_)
            | Mutation::RemoveHistoryPage(_)
            | Mutation::PutHeldOffers(_)
            | Mutation::RemoveHeldOffers(_) => None,
        };
        match role {
            Some(r) if r.is_empty() => Err(RegistryError::Invalid("empty role name".into())),
            _ => Ok(()),
        }
    }
}

/// Why the registry could not be loaded or written.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The write was refused because this master is not (or no longer) the leader: its fence no
    /// longer matches the election's leader key in etcd, or it holds no fence at all.
    #[error("registry write refused: this master is not the leader ({0})")]
    Fenced(String),
    /// A persisted file or value could not be decoded; nothing was overwritten.
    #[error("registry data at {location} is corrupt: {reason}")]
    Corrupt { location: String, reason: String },
    /// A mutation with values that must not be stored.
    #[error("invalid registry mutation: {0}")]
    Invalid(String),
    /// Reading or writing the work dir failed.
    #[error("registry file I/O on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// etcd could not be reached or answered with an error.
    #[error("etcd: {0}")]
    Etcd(String),
    /// An etcd request did not complete in time.
    #[error("etcd request timed out after {0:?}")]
    Timeout(std::time::Duration),
}

impl From<etcd_client::Error> for RegistryError {
    fn from(e: etcd_client::Error) -> Self {
        RegistryError::Etcd(e.to_string())
    }
}

/// The registry persistence used by the master: one interface over both backends.
#[derive(Clone)]
pub enum RegistryStore {
    File(FileStore),
    Etcd(EtcdStore),
}

impl RegistryStore {
    /// Reads the whole registry (a new leader calls this before serving).
    pub async fn load(&self) -> Result<Registry, RegistryError> {
        match self {
            RegistryStore::File(s) => s.load().await,
            RegistryStore::Etcd(s) => s.load().await,
        }
    }

    /// Installs the fence of a new leadership term; writes are refused until one is set.
    pub fn set_fence(&self, fence: Fence) {
        match self {
            RegistryStore::File(s) => s.set_fence(fence),
            RegistryStore::Etcd(s) => s.set_fence(fence),
        }
    }

    /// Drops the fence when leadership is lost: every later write fails with `Fenced`.
    pub fn clear_fence(&self) {
        match self {
            RegistryStore::File(s) => s.clear_fence(),
            RegistryStore::Etcd(s) => s.clear_fence(),
        }
    }

    /// Persists mutations atomically (all or none), fenced by the current leadership.
    pub async fn apply_all(&self, mutations: &[Mutation]) -> Result<(), RegistryError> {
        for m in mutations {
            m.validate()?;
        }
        if mutations.is_empty() {
            return Ok(());
        }
        match self {
            RegistryStore::File(s) => s.apply_all(mutations).await,
            RegistryStore::Etcd(s) => s.apply_all(mutations).await,
        }
    }

    /// Persists one mutation, fenced by the current leadership.
    pub async fn apply(&self, mutation: Mutation) -> Result<(), RegistryError> {
        self.apply_all(std::slice::from_ref(&mutation)).await
    }

    /// Records an admitted agent.
    pub async fn put_agent(&self, agent: AgentRecord) -> Result<(), RegistryError> {
        self.apply(Mutation::PutAgent(agent)).await
    }

    /// Forgets an agent and its dynamic reservations.
    pub async fn remove_agent(
        &self,
        id: AgentId,
        registry: &Registry,
    ) -> Result<(), RegistryError> {
        let mut ms = vec![Mutation::RemoveAgent(id)];
        if let Some(roles) = registry.reservations.get(&id) {
            ms.extend(roles.keys().map(|role| Mutation::RemoveReservation {
                agent_id: id,
                role: role.clone(),
            }));
        }
        self.apply_all(&ms).await
    }

    /// Records a framework (first subscription or changed roles / failover timeout).
    pub async fn put_framework(&self, framework: FrameworkRecord) -> Result<(), RegistryError> {
        self.apply(Mutation::PutFramework(framework)).await
    }

    /// Forgets a framework (torn down, or its failover timeout passed).
    pub async fn remove_framework(&self, id: FrameworkId) -> Result<(), RegistryError> {
        self.apply(Mutation::RemoveFramework(id)).await
    }

    /// Sets a role's weight.
    pub async fn set_weight(&self, role: &str, weight: f64) -> Result<(), RegistryError> {
        self.apply(Mutation::SetWeight {
            role: role.to_string(),
            weight,
        })
        .await
    }

    /// Removes a role's weight (back to the default).
    pub async fn remove_weight(&self, role: &str) -> Result<(), RegistryError> {
        self.apply(Mutation::RemoveWeight {
            role: role.to_string(),
        })
        .await
    }

    /// Sets a role's quota.
    pub async fn set_quota(&self, role: &str, quota: Quota) -> Result<(), RegistryError> {
        self.apply(Mutation::SetQuota {
            role: role.to_string(),
            quota,
        })
        .await
    }

    /// Removes a role's quota.
    pub async fn remove_quota(&self, role: &str) -> Result<(), RegistryError> {
        self.apply(Mutation::RemoveQuota {
            role: role.to_string(),
        })
        .await
    }

    /// Sets the total dynamically reserved for (agent, role); empty resources remove it.
    pub async fn set_reservation(&self, reservation: Reservation) -> Result<(), RegistryError> {
        self.apply(Mutation::SetReservation(reservation)).await
    }

    /// Removes the dynamic reservation of (agent, role).
    pub async fn remove_reservation(
        &self,
        agent_id: AgentId,
        role: &str,
    ) -> Result<(), RegistryError> {
        self.apply(Mutation::RemoveReservation {
            agent_id,
            role: role.to_string(),
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(s: &str) -> Resources {
        Resources::parse(s).unwrap()
    }

    pub(crate) fn sample() -> Registry {
        let mut r = Registry::default();
        let a = AgentId::from_u128(1);
        for m in [
            Mutation::PutAgent(AgentRecord {
                id: a,
                name: "agent-1".into(),
                hostname: "host1".into(),
                deactivated: false,
            }),
            Mutation::SetWeight {
                role: "prod/web".into(),
                weight: 2.5,
            },
            Mutation::SetQuota {
                role: "prod".into(),
                quota: Quota {
                    guarantee: res("cpus:4;mem:4096"),
                    limit: ResourceLimits::parse("cpus:8;mem:8192;gpus:2;disk:0").unwrap(),
                },
            },
            Mutation::SetReservation(Reservation {
                agent_id: a,
                role: "prod".into(),
                resources: res("cpus:1.5;mem:512"),
            }),
            Mutation::PutFramework(FrameworkRecord {
                id: FrameworkId::from_u128(7),
                name: "batch".into(),
                roles: vec!["prod".into(), "dev".into()],
                principal: "batch-principal".into(),
                failover_timeout_secs: 60.0,
                partition_aware: false,
            }),
            Mutation::SetMaintenance(MaintenanceRecord {
                agent_id: a,
                name: "agent-1".into(),
                started_unix_ms: 1_000,
                deadline_unix_ms: Some(61_000),
                drained: false,
                reason: "operator".into(),
            }),
            Mutation::PutGone(GoneRecord {
                agent_id: AgentId::from_u128(9),
                name: "agent-9".into(),
                at_unix_ms: 5_000,
            }),
        ] {
            r.apply(&m);
        }
        r
    }

    #[test]
    fn apply_is_idempotent_and_rebuilds_from_mutations() {
        let r = sample();
        let mut again = r.clone();
        for m in r.to_mutations() {
            again.apply(&m);
        }
        assert_eq!(again, r);
        let mut rebuilt = Registry::default();
        for m in r.to_mutations() {
            rebuilt.apply(&m);
        }
        assert_eq!(rebuilt, r);
    }

    #[test]
    fn empty_reservation_removes_it() {
        let mut r = sample();
        let a = AgentId::from_u128(1);
        r.apply(&Mutation::SetReservation(Reservation {
            agent_id: a,
            role: "prod".into(),
            resources: Resources::new(),
        }));
        assert!(r.reservations.is_empty());
    }

    #[test]
    fn json_round_trip_keeps_exact_resources() {
        let r = sample();
        let text = serde_json::to_string_pretty(&r).unwrap();
        let back: Registry = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        assert!(text.contains("\"cpus\": 1.5"), "{text}");
    }

    #[test]
    fn validation_rejects_bad_values() {
        assert!(Mutation::SetWeight {
            role: "a".into(),
            weight: 0.0
        }
        .validate()
        .is_err());
        assert!(Mutation::SetWeight {
            role: "a".into(),
            weight: f64::NAN
        }
        .validate()
        .is_err());
        assert!(Mutation::RemoveQuota { role: "".into() }
            .validate()
            .is_err());
        assert!(Mutation::SetWeight {
            role: "a".into(),
            weight: 1.0
        }
        .validate()
        .is_ok());
    }
}
