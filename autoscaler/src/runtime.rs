//! The thin loop around [`Core`]: every `interval` it reads the master's operator API
//! (`GET /api/v1/demand`, `/api/v1/agents`, `/api/v1/maintenance/drains`) with an operator
//! identity, runs a core round, and carries out the actions: providers create and delete
//! nodes, drains go to `POST /api/v1/agents/{name}/drain`, and a deleted node's agent is
//! marked gone (`POST /api/v1/agents/{name}/gone`). After each round the [`Report`] is written
//! to the status file (atomically). Errors of a round are logged and the next round tries
//! again; nothing here decides.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gantry_master::client::{BlockingClient, ClientError};
use gantry_placement::GpuDemand;
use gantry_proto::{GpuAmount, Resources};
use serde_json::Value;

use crate::core::{Action, Core, Millis, NodeObs, Observation, Report};
use crate::plan::DemandItem;
use crate::provider::Provider;

/// A round that could not run.
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    /// The operator API did not answer.
    #[error("operator API: {0}")]
    Api(#[from] ClientError),
    /// It answered something unexpected.
    #[error("operator API {path}: {message}")]
    BadAnswer {
        /// The endpoint.
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// The demand items of a `GET /api/v1/demand` answer (the unplaceable copies of each
/// framework's task).
pub fn demand_items(v: &Value) -> Vec<DemandItem> {
    let Some(fws) = v["frameworks"].as_array() else {
        return Vec::new();
    };
    fws.iter()
        .filter_map(|f| {
            let count = u32::try_from(f["unplaceable"].as_u64()?).unwrap_or(u32::MAX);
            if count == 0 {
                return None;
            }
            let task: Resources = serde_json::from_value(f["task"].clone()).ok()?;
            let gpu = match task.gpu_amount().ok()? {
                GpuAmount::None => GpuDemand::None,
                GpuAmount::Fraction(m) => GpuDemand::Fraction(m),
                GpuAmount::Whole(k) => GpuDemand::Whole(u32::try_from(k).ok()?),
            };
            let source = f["name"]
                .as_str()
                .filter(|s| !s.is_empty())
                .or(f["framework_id"].as_str())
                .unwrap_or("")
                .to_string();
            Some(DemandItem {
                source,
                cpu_milli: task.milli("cpus"),
                mem_mib: task.milli("mem") / 1000,
                gpu,
                models: Vec::new(),
                count,
            })
        })
        .collect()
}

/// What the master says of each node, from `GET /api/v1/agents` and
/// `GET /api/v1/maintenance/drains` (a drain whose reason is a termination notice is a notice).
pub fn node_observations(agents: &Value, drains: &Value) -> Vec<NodeObs> {
    let drains: BTreeMap<&str, &Value> = drains["agents"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| Some((d["name"].as_str()?, d)))
                .collect()
        })
        .unwrap_or_default();
    let Some(agents) = agents.as_array() else {
        return Vec::new();
    };
    agents
        .iter()
        .filter_map(|a| {
            let name = a["name"].as_str()?;
            let used = a["used"]
                .as_object()
                .is_some_and(|u| u.values().any(|v| v.as_f64().is_some_and(|x| x > 0.0)));
            let drain = drains.get(name);
            let remaining = drain.is_some_and(|d| d["tasks_remaining"].as_u64() > Some(0));
            Some(NodeObs {
                id: name.to_string(),
                registered: a["connected"] == true,
                busy: used || remaining,
                draining: drain.is_some() || !a["drain"].is_null(),
                notice: drain.is_some_and(|d| {
                    d["reason"]
                        .as_str()
                        .is_some_and(|r| r.starts_with("termination notice"))
                }),
            })
        })
        .collect()
}

/// The loop's parts.
pub struct Runtime {
    /// The decisions.
    pub core: Core,
    /// The operator API.
    pub api: BlockingClient,
    /// A provider per pool name.
    pub providers: BTreeMap<String, Box<dyn Provider>>,
    /// Where the report goes after each round.
    pub status_file: Option<PathBuf>,
    started: Instant,
}

impl Runtime {
    /// A runtime; adopts the nodes the providers list.
    pub fn new(
        core: Core,
        api: BlockingClient,
        providers: BTreeMap<String, Box<dyn Provider>>,
        status_file: Option<PathBuf>,
    ) -> Runtime {
        let mut rt = Runtime {
            core,
            api,
            providers,
            status_file,
            started: Instant::now(),
        };
        let mut seen = std::collections::BTreeSet::new();
        let pools: Vec<String> = rt.providers.keys().cloned().collect();
        for pool in pools {
            let Some(p) = rt.providers.get_mut(&pool) else {
                continue;
            };
            match p.list() {
                Ok(nodes) => {
                    for n in nodes {
                        if seen.insert(n.id.clone()) && rt.core.adopt(&n.pool, &n.id, 0) {
                            tracing::info!(node = %n.id, pool = %n.pool, "adopted a listed node");
                        }
                    }
                }
                Err(e) => tracing::warn!(%pool, error = %e, "provider list failed"),
            }
        }
        rt
    }

    fn now(&self) -> Millis {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn get(&self, path: &str) -> Result<Value, RoundError> {
        let body = self.api.get(path)?;
        serde_json::from_str(&body).map_err(|e| RoundError::BadAnswer {
            path: path.to_string(),
            message: e.to_string(),
        })
    }

    /// One round: observe, decide, act, report.
    pub fn round(&mut self) -> Result<Report, RoundError> {
        let demand = self.get("/api/v1/demand")?;
        let agents = self.get("/api/v1/agents")?;
        let drains = self.get("/api/v1/maintenance/drains")?;
        let obs = Observation {
            demand: demand_items(&demand),
            nodes: node_observations(&agents, &drains),
        };
        let now = self.now();
        let actions = self.core.step(now, &obs);
        for a in actions {
            self.act(a);
        }
        let report = self.core.report(self.now());
        if let Some(path) = &self.status_file {
            if let Err(e) = write_atomic(path, &report) {
                tracing::warn!(path = %path.display(), error = %e, "writing the status file");
            }
        }
        Ok(report)
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Create {
                pool,
                count,
                reason,
            } => {
                let spec = self
                    .core
                    .config()
                    .pools
                    .iter()
                    .find(|p| p.name == pool)
                    .cloned();
                let (Some(spec), Some(p)) = (spec, self.providers.get_mut(&pool)) else {
                    return;
                };
                match p.create(&spec, count) {
                    Ok(ids) => {
                        tracing::info!(%pool, count, reason, nodes = ?ids, "created nodes");
                        let now = self.now();
                        self.core.created(&pool, &ids, now);
                    }
                    Err(e) => {
                        tracing::warn!(%pool, count, error = %e, "creating nodes failed");
                        let now = self.now();
                        self.core.create_failed(&pool, now);
                    }
                }
            }
            Action::Drain {
                node,
                deadline_secs,
            } => {
                let body = match deadline_secs {
                    Some(s) => serde_json::json!({ "deadline_secs": s }),
                    None => serde_json::json!({}),
                };
                let path = format!("/api/v1/agents/{node}/drain");
                match self.api.post_json(&path, body) {
                    Ok(_) => tracing::info!(%node, ?deadline_secs, "draining node"),
                    Err(e) => tracing::warn!(%node, error = %e, "drain failed"),
                }
            }
            Action::Delete { node } => {
                let pool = self
                    .core
                    .node_ids()
                    .into_iter()
                    .find(|(_, ids)| ids.contains(&node))
                    .map(|(p, _)| p);
                let Some(p) = pool.and_then(|p| self.providers.get_mut(&p)) else {
                    return;
                };
                match p.delete(&node) {
                    Ok(()) => {
                        let now = self.now();
                        self.core.deleted(&node, now);
                        tracing::info!(%node, "deleted node");
                        let path = format!("/api/v1/agents/{node}/gone");
                        if let Err(e) = self.api.post_json(&path, serde_json::json!({})) {
                            tracing::info!(%node, error = %e, "marking the deleted node's agent gone");
                        }
                    }
                    Err(e) => tracing::warn!(%node, error = %e, "deleting node failed"),
                }
            }
        }
    }

    /// Rounds every `interval` until `stop` is set.
    pub fn run(&mut self, interval: Duration, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            if let Err(e) = self.round() {
                tracing::warn!(error = %e, "round failed");
            }
            while started.elapsed() < interval && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Writes `value` as JSON to `path` through a temporary file and a rename.
pub fn write_atomic(path: &std::path::Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn demand_answers_become_items() {
        let v = json!({"frameworks": [
            {"framework_id": "f1", "name": "batch", "task": {"cpus": 1.0, "mem": 512.0, "gpus": 2.0},
             "declared": 5, "placeable": 1, "unplaceable": 4},
            {"framework_id": "f2", "name": "", "task": {"cpus": 0.5, "gpus": 0.25},
             "declared": 1, "placeable": 0, "unplaceable": 1},
            {"framework_id": "f3", "name": "x", "task": {"cpus": 1.0}, "unplaceable": 0},
        ]});
        let items = demand_items(&v);
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].source, "batch");
        assert_eq!(items[0].gpu, GpuDemand::Whole(2));
        assert_eq!(
            (items[0].cpu_milli, items[0].mem_mib, items[0].count),
            (1000, 512, 4)
        );
        assert_eq!(items[1].source, "f2");
        assert_eq!(items[1].gpu, GpuDemand::Fraction(250));
        assert!(demand_items(&json!({"error": "x"})).is_empty());
    }

    #[test]
    fn agents_and_drains_become_observations() {
        let agents = json!([
            {"name": "a", "connected": true, "used": {"cpus": 1.0}, "drain": null},
            {"name": "b", "connected": true, "used": {}, "drain": "DRAINING"},
            {"name": "c", "connected": false, "used": {"cpus": 0.0}, "drain": null},
        ]);
        let drains = json!({"agents": [
            {"name": "b", "reason": "termination notice: spot", "tasks_remaining": 1},
        ]});
        let o = node_observations(&agents, &drains);
        assert_eq!(
            o,
            [
                NodeObs {
                    id: "a".into(),
                    registered: true,
                    busy: true,
                    draining: false,
                    notice: false
                },
                NodeObs {
                    id: "b".into(),
                    registered: true,
                    busy: true,
                    draining: true,
                    notice: true
                },
                NodeObs {
                    id: "c".into(),
                    registered: false,
                    busy: false,
                    draining: false,
                    notice: false
                },
            ]
        );
    }
}
