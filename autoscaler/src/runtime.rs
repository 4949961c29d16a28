//! The thin loop around [`Core`]: every `interval` it reads the master's operator API
//! (`GET /api/v1/demand`, `/api/v1/agents`, `/api/v1/maintenance/drains`) with an operator
//! identity, runs a core round, and carries out the actions: providers create and delete
//! nodes, drains go to `POST /api/v1/agents/{name}/drain`, and a deleted node's agent is
//! marked gone (`POST /api/v1/agents/{name}/gone`). Each round also reads the tasks active on
//! the autoscaler's nodes (`GET /api/v1/tasks?completed=false`) for the [`CostBook`], and asks
//! the master when each task that left ended (`GET /api/v1/tasks/{id}`). After each round the
//! [`Report`] is written to the status file (atomically) and rendered for `/metrics`
//! ([`metrics_text`]), and its totals saved to the [`TotalsStore`] (they continue after a
//! restart or failover: [`crate::totals`]). Errors of a round are logged and the next round
//! tries again; nothing here decides.
//!
//! HA: the loop acts only while its [`Fence`] says this copy leads (an etcd election, see the
//! binary's `--etcd`). Each time it starts leading it starts from a fresh [`Core`] and adopts
//! the nodes the providers `list` (the previous leader's, with a shared provider); while it
//! does not lead it observes nothing and writes no report. The fence is checked again before
//! every provider call and every write to the master, so a copy whose lease ran out between
//! a round's start and an action never acts on it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_master::client::{BlockingClient, ClientError};
use gantry_placement::GpuDemand;
use gantry_proto::{GpuAmount, Resources};
use serde_json::Value;

use crate::core::{Action, Core, Millis, NodeObs, Observation, Report};
use crate::cost::{CostBook, NodeShape, TaskObs};
use crate::plan::DemandItem;
use crate::provider::Provider;
use crate::totals::{Totals, TotalsStore};

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
                // The GPU model the tasks ask for (protocol 11's `Demand::gpu_model`).
                models: f["gpu_model"]
                    .as_str()
                    .filter(|m| !m.is_empty())
                    .map(|m| vec![m.to_string()])
                    .unwrap_or_default(),
                on_demand: false,
                count,
            })
        })
        .collect()
}

/// The demand's GPU models (as a task's selector: part of the GPU's name, case-insensitive,
/// `"H100"`) spelled as the pools' `gpu_model`s that contain them, which the planner matches
/// exactly; a model no pool has stays as it is (no pool fits it).
pub fn with_pool_models(mut items: Vec<DemandItem>, pool_models: &[&str]) -> Vec<DemandItem> {
    for d in &mut items {
        if d.models.is_empty() {
            continue;
        }
        let wanted: Vec<String> = d.models.iter().map(|m| m.to_lowercase()).collect();
        let mut names: Vec<String> = pool_models
            .iter()
            .filter(|p| {
                let p = p.to_lowercase();
                wanted.iter().any(|m| p.contains(m.as_str()))
            })
            .map(|p| p.to_string())
            .collect();
        names.sort();
        names.dedup();
        if !names.is_empty() {
            d.models = names;
        }
    }
    items
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

/// The active tasks in a `GET /api/v1/tasks` page, for the cost book (tasks not yet on an
/// agent are skipped).
pub fn task_observations(page: &Value) -> Vec<TaskObs> {
    let Some(tasks) = page["tasks"].as_array() else {
        return Vec::new();
    };
    tasks
        .iter()
        .filter_map(|t| {
            let res: Resources = serde_json::from_value(t["resources"].clone()).ok()?;
            let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
            Some(TaskObs {
                id: text(&t["id"])?,
                node: text(&t["agent_name"])?,
                role: text(&t["role"]).unwrap_or_default(),
                framework: text(&t["framework_name"])
                    .or_else(|| text(&t["framework_id"]))
                    .unwrap_or_default(),
                user: text(&t["user"]).unwrap_or_default(),
                cpus: res.milli("cpus") as f64 / 1000.0,
                mem: res.milli("mem") as f64 / 1000.0,
                gpus: res.milli("gpus") as f64 / 1000.0,
                staged_ms: t["staged_at_ms"].as_u64()?,
            })
        })
        .collect()
}

/// The report in Prometheus' text format: per pool the node cost, what tasks were charged and
/// the idle cost, nodes, interruptions and scale events; the cost attributed per role,
/// framework and user.
pub fn metrics_text(r: &Report) -> String {
    fn esc(v: &str) -> String {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    }
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in rows {
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    };
    let pools = |f: &dyn Fn(&crate::core::PoolReport) -> f64| {
        r.pools
            .iter()
            .map(|p| (format!("pool=\"{}\"", esc(&p.name)), f(p)))
            .collect::<Vec<_>>()
    };
    family(
        "gantry_autoscaler_cost_total",
        "counter",
        "What the pool's nodes cost so far (price per hour × node-hours, creation to deletion).",
        pools(&|p| p.cost),
    );
    family(
        "gantry_autoscaler_task_cost_total",
        "counter",
        "Of the pool's cost, what tasks were charged (dominant share × price × time held).",
        pools(&|p| p.task_cost),
    );
    family(
        "gantry_autoscaler_idle_cost_total",
        "counter",
        "Of the pool's cost, what no task was charged.",
        pools(&|p| p.idle_cost),
    );
    family(
        "gantry_autoscaler_node_seconds_total",
        "counter",
        "Node-seconds billed.",
        pools(&|p| p.node_seconds),
    );
    family(
        "gantry_autoscaler_nodes",
        "gauge",
        "Nodes the pool has (any phase).",
        pools(&|p| f64::from(p.nodes)),
    );
    family(
        "gantry_autoscaler_interruptions_total",
        "counter",
        "Termination notices (spot) of the pool's nodes.",
        pools(&|p| p.interruptions as f64),
    );
    family(
        "gantry_autoscaler_scale_ups_total",
        "counter",
        "Scale-up decisions.",
        pools(&|p| p.scale_ups as f64),
    );
    family(
        "gantry_autoscaler_consolidations_total",
        "counter",
        "Busy nodes drained because their tasks fit in the other nodes' room.",
        pools(&|p| p.consolidations as f64),
    );
    family(
        "gantry_autoscaler_scale_downs_total",
        "counter",
        "Nodes drained for being idle.",
        pools(&|p| p.scale_downs as f64),
    );
    for (dim, map) in [
        ("role", &r.costs.by_role),
        ("framework", &r.costs.by_framework),
        ("user", &r.costs.by_user),
    ] {
        family(
            &format!("gantry_autoscaler_cost_by_{dim}_total"),
            "counter",
            &format!("Cost of the autoscaler's nodes charged to each {dim}'s tasks."),
            map.iter()
                .map(|(k, v)| (format!("{dim}=\"{}\"", esc(k)), *v))
                .collect(),
        );
    }
    out
}

/// Whether this copy may act now (checked before every provider call and every write to the
/// master). Without HA it always may.
pub type Fence = Arc<dyn Fn() -> bool + Send + Sync>;

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
    /// The latest report in Prometheus' text format, for a `/metrics` endpoint.
    pub metrics: Arc<Mutex<String>>,
    /// Whether this copy leads ([`Fence`]).
    pub fence: Fence,
    /// Where the report's totals survive restarts and failovers ([`crate::totals`]; none:
    /// in memory only).
    pub totals: Option<Box<dyn TotalsStore>>,
    /// The totals of earlier leaders, once loaded (`None`: not yet; nothing is saved until
    /// they are).
    base: Option<Totals>,
    started: Instant,
    costs: CostBook,
}

impl Runtime {
    /// A runtime that always leads (no HA); [`Runtime::run`] adopts the nodes the providers
    /// list before its first round.
    pub fn new(
        core: Core,
        api: BlockingClient,
        providers: BTreeMap<String, Box<dyn Provider>>,
        status_file: Option<PathBuf>,
    ) -> Runtime {
        Runtime {
            core,
            api,
            providers,
            status_file,
            metrics: Arc::default(),
            fence: Arc::new(|| true),
            totals: None,
            base: None,
            started: Instant::now(),
            costs: CostBook::new(),
        }
    }

    /// Starts from a fresh core (the configuration kept) and adopts the nodes the providers
    /// list, billed from now (a node listed by several providers is adopted once).
    pub fn reload(&mut self) {
        self.core = Core::new(self.core.config().clone());
        self.costs = CostBook::new();
        self.base = None;
        self.load_totals();
        let now = self.now();
        let mut seen = std::collections::BTreeSet::new();
        let pools: Vec<String> = self.providers.keys().cloned().collect();
        for pool in pools {
            if !(self.fence)() {
                return;
            }
            let Some(p) = self.providers.get_mut(&pool) else {
                continue;
            };
            match p.list() {
                Ok(nodes) => {
                    for n in nodes {
                        if seen.insert(n.id.clone()) && self.core.adopt(&n.pool, &n.id, now) {
                            tracing::info!(node = %n.id, pool = %n.pool, "adopted a listed node");
                        }
                    }
                }
                Err(e) => tracing::warn!(%pool, error = %e, "provider list failed"),
            }
        }
    }

    /// Loads the earlier leaders' totals if not loaded yet (a failed load is logged and tried
    /// again next round; the stored totals are left as they are).
    fn load_totals(&mut self) {
        if self.base.is_some() {
            return;
        }
        let Some(store) = self.totals.as_mut() else {
            self.base = Some(Totals::default());
            return;
        };
        match store.load() {
            Ok(t) => {
                let mut t = t.unwrap_or_default();
                tracing::info!(total_cost = t.total_cost, "continuing the saved totals");
                self.costs.resume(std::mem::take(&mut t.charged_until));
                self.base = Some(t);
            }
            Err(e) => tracing::error!(error = %e, "loading the saved totals (not overwritten)"),
        }
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
        let tasks = self.active_tasks()?;
        let pool_models: Vec<&str> = (self.core.config().pools.iter())
            .filter_map(|p| p.gpu_model.as_deref())
            .collect();
        let obs = Observation {
            demand: with_pool_models(demand_items(&demand), &pool_models),
            nodes: node_observations(&agents, &drains),
            tasks,
        };
        let now = self.now();
        let actions = self.core.step(now, &obs);
        for a in actions {
            self.act(a);
        }
        self.charge_tasks(&obs.tasks);
        self.load_totals();
        let mut report = self.core.report(self.now());
        let mut costs = self.costs.costs().clone();
        if let Some(base) = &self.base {
            base.carry(&mut report, &mut costs);
        }
        report.attribute(&costs);
        if let (Some(store), Some(_)) = (self.totals.as_mut(), &self.base) {
            // Fenced: a copy that stopped leading leaves the totals to the new leader.
            if (self.fence)() {
                let mut t = Totals::from_report(&report);
                t.charged_until = self.costs.charged();
                if let Err(e) = store.save(&t) {
                    tracing::warn!(error = %e, "saving the totals");
                }
            }
        }
        if let Ok(mut m) = self.metrics.lock() {
            *m = metrics_text(&report);
        }
        if let Some(path) = &self.status_file {
            if let Err(e) = write_atomic(path, &report) {
                tracing::warn!(path = %path.display(), error = %e, "writing the status file");
            }
        }
        Ok(report)
    }

    /// The tasks active in the cluster (every page of `GET /api/v1/tasks?completed=false`).
    fn active_tasks(&self) -> Result<Vec<TaskObs>, RoundError> {
        let mut active = Vec::new();
        let mut offset = 0;
        loop {
            let path = format!("/api/v1/tasks?completed=false&limit=1000&offset={offset}");
            let page = self.get(&path)?;
            let n = page["tasks"].as_array().map_or(0, Vec::len);
            active.extend(task_observations(&page));
            offset += n;
            if n == 0 || offset as u64 >= page["total"].as_u64().unwrap_or(0) {
                return Ok(active);
            }
        }
    }

    /// Charges the tasks on the autoscaler's nodes up to now, and settles those that ended.
    /// Errors are logged: the next round charges what this one missed.
    fn charge_tasks(&mut self, active: &[TaskObs]) {
        let mut shapes: BTreeMap<String, NodeShape> = BTreeMap::new();
        for (pool, ids) in self.core.node_ids() {
            let Some(spec) = self.core.config().pools.iter().find(|p| p.name == pool) else {
                continue;
            };
            for id in ids {
                shapes.insert(
                    id,
                    NodeShape {
                        pool: pool.clone(),
                        price_per_hour: spec.price_per_hour,
                        cpus: spec.cpus,
                        mem: spec.mem as f64,
                        gpus: f64::from(spec.gpus),
                    },
                );
            }
        }
        let now = unix_ms();
        let left = self
            .costs
            .observe(now, active, |node| shapes.get(node).cloned());
        for id in left {
            let end = match self.get(&format!("/api/v1/tasks/{id}")) {
                // Still active (on a later page this round, or moved): charged next round.
                Ok(t) => match t["ended_at_ms"].as_u64() {
                    Some(end) => Some(end),
                    None => continue,
                },
                Err(RoundError::Api(ClientError::Status { status: 404, .. })) => None,
                Err(e) => {
                    tracing::info!(task = %id, error = %e, "asking when a task ended");
                    continue;
                }
            };
            self.costs.ended(&id, end);
        }
    }

    fn act(&mut self, action: Action) {
        // The fencing check: a copy that stopped leading since the round began does nothing.
        if !(self.fence)() {
            tracing::warn!(?action, "not leading any more: action dropped");
            return;
        }
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

    /// Rounds every `interval` until `stop` is set, while this copy leads (see the module
    /// docs).
    pub fn run(&mut self, interval: Duration, stop: &AtomicBool) {
        let mut leading = false;
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            match ((self.fence)(), leading) {
                (true, false) => {
                    tracing::info!("leading: adopting the providers' nodes");
                    self.reload();
                    leading = true;
                }
                (false, true) => {
                    tracing::warn!("not leading any more: standing by");
                    leading = false;
                }
                _ => {}
            }
            if leading {
                if let Err(e) = self.round() {
                    tracing::warn!(error = %e, "round failed");
                }
            }
            while started.elapsed() < interval && !stop.load(Ordering::Relaxed) {
                if !leading && (self.fence)() {
                    break; // elected: start at once
                }
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

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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
        assert!(items[0].models.is_empty());
        let v = json!({"frameworks": [
            {"framework_id": "f1", "name": "queue", "task": {"cpus": 1.0, "gpus": 1.0},
             "gpu_model": "H100", "unplaceable": 2},
        ]});
        assert_eq!(demand_items(&v)[0].models, ["H100"]);
        let pools = [
            "NVIDIA H100 80GB",
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA H100 80GB",
        ];
        let items = with_pool_models(demand_items(&v), &pools);
        assert_eq!(items[0].models, ["NVIDIA H100 80GB"]);
        let items = with_pool_models(demand_items(&v), &["NVIDIA L4"]);
        assert_eq!(items[0].models, ["H100"], "no pool has it: nothing fits");
        assert!(demand_items(&json!({"error": "x"})).is_empty());
    }

    #[test]
    fn task_pages_become_observations_and_the_report_metrics() {
        let page = json!({"total": 3, "tasks": [
            {"id": "t1", "agent_name": "gpu-1", "role": "ml", "framework_name": "train",
             "framework_id": "f1", "user": "alice", "staged_at_ms": 1000,
             "resources": {"cpus": 0.5, "mem": 64.0, "gpus": 1.0}},
            {"id": "t2", "agent_name": "gpu-1", "role": "ml", "framework_name": null,
             "framework_id": "f2", "user": null, "staged_at_ms": 2000,
             "resources": {"cpus": 1.0, "gpus": 0.25}},
            {"id": "t3", "agent_name": null, "staged_at_ms": 5, "resources": {"cpus": 1.0}},
        ]});
        let obs = task_observations(&page);
        assert_eq!(obs.len(), 2, "a task on no agent is skipped: {obs:?}");
        assert_eq!(
            (
                obs[0].framework.as_str(),
                obs[0].user.as_str(),
                obs[0].gpus,
                obs[0].mem
            ),
            ("train", "alice", 1.0, 64.0)
        );
        assert_eq!((obs[1].framework.as_str(), obs[1].gpus), ("f2", 0.25));

        let mut report = Core::new(
            crate::config::Config::parse(
                "[[pool]]\nname = \"gpu\"\ncpus = 2\nmem = 1024\ngpus = 2\ngpu_model = \"A100\"\nprice_per_hour = 36\nmax = 2\nprovider = { kind = \"local\" }\n",
            )
            .unwrap(),
        )
        .report(0);
        let mut costs = crate::cost::Costs::default();
        costs.by_framework.insert("tr\"ain".into(), 1.5);
        costs.by_pool.insert("gpu".into(), 1.5);
        report.attribute(&costs);
        let text = metrics_text(&report);
        assert!(
            text.contains("# TYPE gantry_autoscaler_cost_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("gantry_autoscaler_task_cost_total{pool=\"gpu\"} 1.5\n"),
            "{text}"
        );
        assert!(
            text.contains("gantry_autoscaler_idle_cost_total{pool=\"gpu\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "gantry_autoscaler_cost_by_framework_total{framework=\"tr\\\"ain\"} 1.5\n"
            ),
            "{text}"
        );
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
