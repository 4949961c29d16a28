//! HA registry persistence in etcd, every write fenced by leadership.
//!
//! One JSON value per record (readable with `etcdctl get --prefix /gantry/registry/`):
//!
//! | key                                         | value                |
//! |---------------------------------------------|----------------------|
//! | `{prefix}/registry/agents/{agent_id}`       | [`AgentRecord`]      |
//! | `{prefix}/registry/frameworks/{id}`         | [`FrameworkRecord`]  |
//! | `{prefix}/registry/weights/{role}`          | `{"role","weight"}`  |
//! | `{prefix}/registry/quotas/{role}`           | `{"role","quota"}`   |
//! | `{prefix}/registry/reservations/{agent}/{role}` | [`Reservation`]  |
//! | `{prefix}/registry/history/{page:020}`      | [`HistoryPage`]      |
//! | `{prefix}/registry/held-offers/{start:020}` | [`HeldOffersBucket`] |
//!
//! Every write is one transaction `IF create_revision(leader key) == fence revision THEN ops`.
//! The leader key belongs to the writer's election lease, so once that lease expires or is revoked
//! (the master was deposed) the comparison fails and the write is refused with
//! [`RegistryError::Fenced`], however late the deposed master's request arrives.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::{
    AgentRecord, Fence, FrameworkRecord, GoneRecord, HeldOffersBucket, HistoryPage,
    MaintenanceRecord, Mutation, Quota, Registry, RegistryError, Reservation,
};

/// Most operations etcd accepts in one transaction (its `--max-txn-ops` default).
pub const MAX_TXN_OPS: usize = 128;
/// Keys read per page when loading.
const PAGE: i64 = 1000;

#[derive(Serialize, Deserialize)]
struct WeightValue {
    role: String,
    weight: f64,
}

#[derive(Serialize, Deserialize)]
struct QuotaValue {
    role: String,
    quota: Quota,
}

/// The etcd-backed registry of an HA master. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    client: Arc<Client>,
    /// `{prefix}/registry/`
    root: String,
    timeout: Duration,
    fence: Arc<Mutex<Option<Fence>>>,
}

impl EtcdStore {
    /// Connects to etcd; records live under `{prefix}/registry/`. `timeout` bounds each request.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
    ) -> Result<EtcdStore, RegistryError> {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
        let client = tokio::time::timeout(timeout, Client::connect(endpoints, Some(opts)))
            .await
            .map_err(|_| RegistryError::Timeout(timeout))??;
        Ok(Self::from_client(client, prefix, timeout))
    }

    /// Uses an existing client.
    pub fn from_client(client: Client, prefix: &str, timeout: Duration) -> EtcdStore {
        EtcdStore {
            client: Arc::new(client),
            root: format!("{}/registry/", prefix.trim_end_matches('/')),
            timeout,
            fence: Arc::new(Mutex::new(None)),
        }
    }

    /// The key prefix all records live under.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// Installs the fence of a new leadership term.
    pub fn set_fence(&self, fence: Fence) {
        *self.fence.lock().unwrap_or_else(|p| p.into_inner()) = Some(fence);
    }

    /// Refuses writes from now on (leadership lost).
    pub fn clear_fence(&self) {
        *self.fence.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn current_fence(&self) -> Option<Fence> {
        self.fence.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The key a mutation writes or deletes.
    pub fn key_of(&self, m: &Mutation) -> String {
        let r = &self.root;
        match m {
            Mutation::PutAgent(a) => format!("{r}agents/{}", a.id),
            Mutation::RemoveAgent(id) => format!("{r}agents/{id}"),
            Mutation::PutFramework(f) => format!("{r}frameworks/{}", f.id),
            Mutation::RemoveFramework(id) => format!("{r}frameworks/{id}"),
            Mutation::SetWeight { role, .. } | Mutation::RemoveWeight { role } => {
                format!("{r}weights/{role}")
            }
            Mutation::SetQuota { role, .. } | Mutation::RemoveQuota { role } => {
                format!("{r}quotas/{role}")
            }
            Mutation::SetReservation(res) => {
                format!("{r}reservations/{}/{}", res.agent_id, res.role)
            }
            Mutation::RemoveReservation { agent_id, role } => {
                format!("{r}reservations/{agent_id}/{role}")
            }
            Mutation::SetMaintenance(m) => format!("{r}maintenance/{}", m.agent_id),
            Mutation::RemoveMaintenance(id) => format!("{r}maintenance/{id}"),
            Mutation::PutGone(g) => format!("{r}gone/{}", g.agent_id),
            Mutation::PutHistoryPage(p) => format!("{r}history/{:020}", p.page),
            Mutation::RemoveHistoryPage(page) => format!("{r}history/{page:020}"),
            Mutation::PutHeldOffers(b) => format!("{r}held-offers/{:020}", b.start_ms),
            Mutation::RemoveHeldOffers(start) => format!("{r}held-offers/{start:020}"),
        }
    }

    fn op_of(&self, m: &Mutation) -> Result<TxnOp, RegistryError> {
        let key = self.key_of(m);
        let json = |v: Result<Vec<u8>, serde_json::Error>| {
            v.map_err(|e| RegistryError::Invalid(e.to_string()))
        };
        Ok(match m {
            Mutation::PutAgent(a) => TxnOp::put(key, json(serde_json::to_vec(a))?, None),
            Mutation::PutFramework(f) => TxnOp::put(key, json(serde_json::to_vec(f))?, None),
            Mutation::SetWeight { role, weight } => TxnOp::put(
                key,
                json(serde_json::to_vec(&WeightValue {
                    role: role.clone(),
                    weight: *weight,
                }))?,
                None,
            ),
            Mutation::SetQuota { role, quota } => TxnOp::put(
                key,
                json(serde_json::to_vec(&QuotaValue {
                    role: role.clone(),
                    quota: quota.clone(),
                }))?,
                None,
            ),
            Mutation::SetReservation(r) if !r.resources.is_empty() => {
                TxnOp::put(key, json(serde_json::to_vec(r))?, None)
            }
            Mutation::SetMaintenance(m) => TxnOp::put(key, json(serde_json::to_vec(m))?, None),
            Mutation::PutGone(g) => TxnOp::put(key, json(serde_json::to_vec(g))?, None),
            Mutation::PutHistoryPage(p) => TxnOp::put(key, json(serde_json::to_vec(p))?, None),
            Mutation::PutHeldOffers(b) => TxnOp::put(key, json(serde_json::to_vec(b))?, None),
            Mutation::SetReservation(_)
            | Mutation::RemoveHistoryPage(_)
            | Mutation::RemoveHeldOffers(_)
            | Mutation::RemoveMaintenance(_)
            | Mutation::RemoveAgent(_)
            | Mutation::RemoveFramework(_)
            | Mutation::RemoveWeight { .. }
            | Mutation::RemoveQuota { .. }
            | Mutation::RemoveReservation { .. } => TxnOp::delete(key, None),
        })
    }

    /// Writes the batch in one transaction fenced by the installed leadership fence.
    pub async fn apply_all(&self, mutations: &[Mutation]) -> Result<(), RegistryError> {
        let fence = self
            .current_fence()
            .ok_or_else(|| RegistryError::Fenced("no leadership fence installed".into()))?;
        let (leader_key, revision) = match &fence {
            Fence::Etcd {
                leader_key,
                create_revision,
                ..
            } => (leader_key.clone(), *create_revision),
            Fence::Standalone => {
                return Err(RegistryError::Fenced(
                    "a standalone fence cannot write to etcd".into(),
                ))
            }
        };
        if mutations.len() > MAX_TXN_OPS {
            return Err(RegistryError::Invalid(format!(
                "{} mutations in one batch; etcd accepts at most {MAX_TXN_OPS}",
                mutations.len()
            )));
        }
        // A batch may set and then remove the same key; etcd refuses duplicate keys in one
        // transaction, so keep only the last mutation per key (same end result).
        let mut ops: Vec<(String, TxnOp)> = Vec::with_capacity(mutations.len());
        for m in mutations {
            let key = self.key_of(m);
            let op = self.op_of(m)?;
            ops.retain(|(k, _)| *k != key);
            ops.push((key, op));
        }
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                leader_key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then(ops.into_iter().map(|(_, op)| op).collect::<Vec<_>>());
        let mut kv = self.client.kv_client();
        let resp = tokio::time::timeout(self.timeout, kv.txn(txn))
            .await
            .map_err(|_| RegistryError::Timeout(self.timeout))??;
        if resp.succeeded() {
            Ok(())
        } else {
            Err(RegistryError::Fenced(format!(
                "leader key {} (revision {revision}) is gone or replaced in etcd",
                String::from_utf8_lossy(&leader_key)
            )))
        }
    }

    /// Reads every record at one consistent revision (paged).
    pub async fn load(&self) -> Result<Registry, RegistryError> {
        let mut registry = Registry::default();
        let end = prefix_end(self.root.as_bytes());
        let mut start = self.root.as_bytes().to_vec();
        let mut revision = 0i64;
        let mut kv = self.client.kv_client();
        loop {
            let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if revision > 0 {
                opts = opts.with_revision(revision);
            }
            let resp = tokio::time::timeout(self.timeout, kv.get(start.clone(), Some(opts)))
                .await
                .map_err(|_| RegistryError::Timeout(self.timeout))??;
            if revision == 0 {
                revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            }
            for item in resp.kvs() {
                self.decode_into(&mut registry, item.key(), item.value())?;
            }
            match resp.kvs().last() {
                Some(last) if resp.more() => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => break,
            }
        }
        Ok(registry)
    }

    fn decode_into(
        &self,
        registry: &mut Registry,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), RegistryError> {
        let key_text = String::from_utf8_lossy(key).into_owned();
        let corrupt = |reason: String| RegistryError::Corrupt {
            location: format!("etcd key {key_text}"),
            reason,
        };
        let rest = key_text
            .strip_prefix(&self.root)
            .ok_or_else(|| corrupt("outside the registry prefix".into()))?;
        let (kind, _) = rest
            .split_once('/')
            .ok_or_else(|| corrupt("no record kind in key".into()))?;
        let de = |e: serde_json::Error| corrupt(e.to_string());
        let mutation = match kind {
            "agents" => {
                Mutation::PutAgent(serde_json::from_slice::<AgentRecord>(value).map_err(de)?)
            }
            "frameworks" => Mutation::PutFramework(
                serde_json::from_slice::<FrameworkRecord>(value).map_err(de)?,
            ),
            "weights" => {
                let w: WeightValue = serde_json::from_slice(value).map_err(de)?;
                Mutation::SetWeight {
                    role: w.role,
                    weight: w.weight,
                }
            }
            "quotas" => {
                let q: QuotaValue = serde_json::from_slice(value).map_err(de)?;
                Mutation::SetQuota {
                    role: q.role,
                    quota: q.quota,
                }
            }
            "reservations" => {
                Mutation::SetReservation(serde_json::from_slice::<Reservation>(value).map_err(de)?)
            }
            "maintenance" => Mutation::SetMaintenance(
                serde_json::from_slice::<MaintenanceRecord>(value).map_err(de)?,
            ),
            "gone" => Mutation::PutGone(serde_json::from_slice::<GoneRecord>(value).map_err(de)?),
            "history" => {
                Mutation::PutHistoryPage(serde_json::from_slice::<HistoryPage>(value).map_err(de)?)
            }
            "held-offers" => Mutation::PutHeldOffers(
                serde_json::from_slice::<HeldOffersBucket>(value).map_err(de)?,
            ),
            other => return Err(corrupt(format!("unknown record kind {other:?}"))),
        };
        // The value must be stored under its own key, or two records could shadow each other.
        if self.key_of(&mutation) != key_text {
            return Err(corrupt("value does not match its key".into()));
        }
        mutation.validate().map_err(|e| corrupt(e.to_string()))?;
        registry.apply(&mutation);
        Ok(())
    }
}

/// The smallest key greater than every key starting with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
