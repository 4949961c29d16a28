//! Pure views of the `/state` JSON for `/api/v1` reads: the cluster summary, agents with their
//! GPUs, roles, quotas, weights, maintenance, and tasks filtered and paginated. No I/O: the
//! handlers fetch `/state` from the core once per request and shape it here.

use serde_json::{json, Map, Value};

/// Largest page of tasks one request returns.
pub const MAX_PAGE: usize = 1000;
/// Page size when none is asked for.
pub const DEFAULT_PAGE: usize = 100;

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// `GET /api/v1/summary`: counts, totals and shares at a glance.
pub fn summary(state: &Value) -> Value {
    let agents = arr(&state["agents"]);
    let mut total = Map::new();
    let mut used = Map::new();
    let mut gpus = 0u64;
    let mut unhealthy_gpus = 0u64;
    for a in agents {
        add_into(&mut total, &a["total"]);
        add_into(&mut used, &a["used"]);
        for g in arr(&a["gpus"]) {
            gpus += 1;
            if g["healthy"] == false {
                unhealthy_gpus += 1;
            }
        }
    }
    let mut tasks_by_state = Map::new();
    for t in arr(&state["tasks"]) {
        let s = t["state"].as_str().unwrap_or("UNKNOWN").to_string();
        let n = tasks_by_state.get(&s).and_then(Value::as_u64).unwrap_or(0);
        tasks_by_state.insert(s, json!(n + 1));
    }
    let alloc = &state["allocator"];
    json!({
        "leader": state["leader"],
        "epoch": state["epoch"],
        "uptime_ms": state["uptime_ms"],
        "agents": {
            "total": agents.len(),
            "connected": agents.iter().filter(|a| a["connected"] == true).count(),
            "deactivated": agents.iter().filter(|a| a["active"] == false).count(),
        },
        "frameworks": {
            "active": arr(&state["frameworks"]).len(),
            "connected": arr(&state["frameworks"]).iter().filter(|f| f["connected"] == true).count(),
            "completed": arr(&state["completed_frameworks"]).len(),
        },
        "tasks": {
            "active": arr(&state["tasks"]).len(),
            "by_state": tasks_by_state,
            "completed": arr(&state["completed_tasks"]).len(),
        },
        "gpus": {"total": gpus, "unhealthy": unhealthy_gpus},
        "resources": {"total": total, "used": used},
        "offers": {
            "outstanding": arr(&state["offers"]).len(),
            "made": alloc["offers_made"],
            "accepted": alloc["offers_accepted"],
            "declined": alloc["offers_declined"],
            "rescinded": alloc["offers_rescinded"],
        },
        "roles": roles(state),
    })
}

fn add_into(sum: &mut Map<String, Value>, res: &Value) {
    if let Some(m) = res.as_object() {
        for (k, v) in m {
            let x = v.as_f64().unwrap_or(0.0) + sum.get(k).and_then(Value::as_f64).unwrap_or(0.0);
            // Resource amounts have at most three decimals (milli-units).
            sum.insert(k.clone(), json!((x * 1000.0).round() / 1000.0));
        }
    }
}

/// One agent as `/api/v1/agents` shows it: `/state`'s fields plus each GPU joined with its
/// latest sample and the task holding it, and the drain state (`null` until drained).
pub fn agent(a: &Value, tasks: &[Value]) -> Value {
    let samples = arr(&a["gpu_samples"]);
    let gpus: Vec<Value> = arr(&a["gpus"])
        .iter()
        .map(|g| {
            let uuid = g["uuid"].as_str().unwrap_or_default();
            let sample = samples
                .iter()
                .find(|s| s["uuid"] == uuid)
                .cloned()
                .unwrap_or(Value::Null);
            let holders: Vec<Value> = tasks
                .iter()
                .filter(|t| arr(&t["gpus"]).iter().any(|u| u == uuid))
                .map(|t| json!({"id": t["id"], "name": t["name"], "framework_id": t["framework_id"]}))
                .collect();
            let mut g = g.clone();
            if let Some(o) = g.as_object_mut() {
                o.insert("sample".into(), sample);
                o.insert("tasks".into(), Value::Array(holders));
            }
            g
        })
        .collect();
    let mut a = a.clone();
    if let Some(o) = a.as_object_mut() {
        o.remove("gpu_samples");
        o.insert("gpus".into(), Value::Array(gpus));
        // Drain and maintenance (issue 14 item 3) fill this in.
        o.entry("drain").or_insert(Value::Null);
    }
    a
}

/// `GET /api/v1/agents`.
pub fn agents(state: &Value) -> Value {
    let tasks = arr(&state["tasks"]);
    Value::Array(
        arr(&state["agents"])
            .iter()
            .map(|a| agent(a, tasks))
            .collect(),
    )
}

/// The agent named by `key`: its id or its name.
pub fn find_agent<'a>(state: &'a Value, key: &str) -> Option<&'a Value> {
    let agents = arr(&state["agents"]);
    agents
        .iter()
        .find(|a| a["id"] == key)
        .or_else(|| agents.iter().find(|a| a["name"] == key))
}

/// The framework named by `key`: its id, or its name when exactly one has it.
pub fn find_framework<'a>(state: &'a Value, key: &str) -> Option<&'a Value> {
    let fws = arr(&state["frameworks"]);
    if let Some(f) = fws.iter().find(|f| f["id"] == key) {
        return Some(f);
    }
    let mut named = fws.iter().filter(|f| f["name"] == key);
    match (named.next(), named.next()) {
        (Some(f), None) => Some(f),
        _ => None,
    }
}

/// `GET /api/v1/roles`: every role the allocator knows with its share, weight, allocation and
/// quota, sorted by name.
pub fn roles(state: &Value) -> Value {
    let Some(roles) = state["allocator"]["roles"].as_object() else {
        return json!([]);
    };
    let frameworks = arr(&state["frameworks"]);
    Value::Array(
        roles
            .iter()
            .map(|(name, r)| {
                let fws: Vec<&Value> = frameworks
                    .iter()
                    .filter(|f| arr(&f["roles"]).iter().any(|x| x == name.as_str()))
                    .map(|f| &f["id"])
                    .collect();
                json!({
                    "name": name,
                    "weight": r["weight"],
                    "dominant_share": r["dominant_share"],
                    "allocated": r["allocated"],
                    "offers_made": r["offers_made"],
                    "quota": {"guarantee": r["quota_guarantee"], "limit": r["quota_limit"]},
                    "frameworks": fws,
                })
            })
            .collect(),
    )
}

/// `GET /api/v1/quotas`: roles with a guarantee or a limit.
pub fn quotas(state: &Value) -> Value {
    Value::Array(
        arr(&roles(state))
            .iter()
            .filter(|r| !r["quota"]["guarantee"].is_null() || !r["quota"]["limit"].is_null())
            .map(|r| json!({"role": r["name"], "guarantee": r["quota"]["guarantee"], "limit": r["quota"]["limit"]}))
            .collect(),
    )
}

/// `GET /api/v1/weights`: roles whose weight is not the default 1.
pub fn weights(state: &Value) -> Value {
    Value::Array(
        arr(&roles(state))
            .iter()
            .filter(|r| r["weight"].as_f64().is_some_and(|w| w != 1.0))
            .map(|r| json!({"role": r["name"], "weight": r["weight"]}))
            .collect(),
    )
}

/// `GET /api/v1/maintenance`: agents out of service (deactivated, or with a drain state).
pub fn maintenance(state: &Value) -> Value {
    let agents: Vec<Value> = arr(&state["agents"])
        .iter()
        .filter(|a| a["active"] == false || !a["drain"].is_null())
        .map(|a| {
            json!({
                "id": a["id"], "name": a["name"], "active": a["active"],
                "connected": a["connected"], "drain": a.get("drain").cloned().unwrap_or(Value::Null),
            })
        })
        .collect();
    json!({ "agents": agents })
}

/// Filters of `GET /api/v1/tasks`.
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskQuery {
    /// A task state (`RUNNING`, `FINISHED`…; case-insensitive).
    pub state: Option<String>,
    /// A framework id.
    pub framework: Option<String>,
    /// An agent id or name.
    pub agent: Option<String>,
    /// Page size (default [`DEFAULT_PAGE`], at most [`MAX_PAGE`]).
    pub limit: Option<usize>,
    /// Tasks to skip.
    pub offset: Option<usize>,
    /// Include completed tasks (default true).
    pub completed: Option<bool>,
}

/// `GET /api/v1/tasks`: active tasks first (by id), then completed ones (oldest end first),
/// filtered, then one page: `{"total": N, "offset": O, "limit": L, "tasks": [...]}`.
pub fn tasks(state: &Value, q: &TaskQuery) -> Value {
    let agent_id = q.agent.as_deref().map(|k| {
        find_agent(state, k)
            .and_then(|a| a["id"].as_str())
            .unwrap_or(k)
            .to_string()
    });
    let completed = if q.completed.unwrap_or(true) {
        arr(&state["completed_tasks"])
    } else {
        &[]
    };
    let matching: Vec<&Value> = arr(&state["tasks"])
        .iter()
        .chain(completed)
        .filter(|t| {
            q.state.as_deref().is_none_or(|s| {
                t["state"]
                    .as_str()
                    .is_some_and(|x| x.eq_ignore_ascii_case(s))
            }) && q
                .framework
                .as_deref()
                .is_none_or(|f| t["framework_id"] == f)
                && agent_id.as_deref().is_none_or(|a| t["agent_id"] == a)
        })
        .collect();
    let limit = q.limit.unwrap_or(DEFAULT_PAGE).min(MAX_PAGE);
    let offset = q.offset.unwrap_or(0);
    let page: Vec<Value> = matching
        .iter()
        .skip(offset)
        .take(limit)
        .map(|t| (*t).clone())
        .collect();
    json!({"total": matching.len(), "offset": offset, "limit": limit, "tasks": page})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Value {
        json!({
            "leader": true, "epoch": 3, "uptime_ms": 10,
            "agents": [
                {"id": "a1", "name": "gpu-1", "connected": true, "active": true,
                 "total": {"cpus": 4.0, "gpus": 2.0}, "used": {"cpus": 1.0, "gpus": 1.0},
                 "gpus": [{"uuid": "G0", "healthy": true}, {"uuid": "G1", "healthy": false}],
                 "gpu_samples": [{"uuid": "G0", "util_percent": 55}]},
                {"id": "a2", "name": "cpu-1", "connected": false, "active": false,
                 "total": {"cpus": 2.5}, "used": {}, "gpus": [], "gpu_samples": []}
            ],
            "frameworks": [{"id": "f1", "name": "batch", "roles": ["eng"], "connected": true}],
            "tasks": [
                {"id": "t1", "name": "train", "state": "RUNNING", "framework_id": "f1", "agent_id": "a1", "gpus": ["G0"]},
                {"id": "t2", "name": "eval", "state": "STAGING", "framework_id": "f1", "agent_id": "a2", "gpus": []}
            ],
            "completed_tasks": [
                {"id": "t0", "name": "prep", "state": "FINISHED", "framework_id": "f1", "agent_id": "a1", "gpus": []}
            ],
            "completed_frameworks": [],
            "offers": [],
            "allocator": {"offers_made": 5, "roles": {
                "eng": {"weight": 2.0, "dominant_share": 0.25, "allocated": {"cpus": 1.0},
                        "offers_made": 3, "quota_guarantee": {"cpus": 1.0}, "quota_limit": null},
                "ops": {"weight": 1.0, "dominant_share": 0.0, "allocated": {},
                        "offers_made": 0, "quota_guarantee": null, "quota_limit": null}
            }}
        })
    }

    #[test]
    fn summary_counts_agents_gpus_tasks_and_sums_resources() {
        let s = summary(&state());
        assert_eq!(s["agents"]["total"], 2);
        assert_eq!(s["agents"]["connected"], 1);
        assert_eq!(s["agents"]["deactivated"], 1);
        assert_eq!(s["gpus"]["total"], 2);
        assert_eq!(s["gpus"]["unhealthy"], 1);
        assert_eq!(s["tasks"]["by_state"]["RUNNING"], 1);
        assert_eq!(s["tasks"]["completed"], 1);
        assert_eq!(s["resources"]["total"]["cpus"], 6.5);
        assert_eq!(s["offers"]["made"], 5);
    }

    #[test]
    fn agents_join_gpus_with_samples_and_holders() {
        let a = agents(&state());
        let g0 = &a[0]["gpus"][0];
        assert_eq!(g0["sample"]["util_percent"], 55);
        assert_eq!(g0["tasks"][0]["name"], "train");
        assert!(a[0]["gpus"][1]["sample"].is_null());
        assert!(a[0].get("gpu_samples").is_none());
        assert!(a[0]["drain"].is_null());
    }

    #[test]
    fn agents_and_frameworks_are_found_by_id_or_name() {
        let s = state();
        assert_eq!(find_agent(&s, "cpu-1").unwrap()["id"], "a2");
        assert_eq!(find_agent(&s, "a1").unwrap()["name"], "gpu-1");
        assert!(find_agent(&s, "nope").is_none());
        assert_eq!(find_framework(&s, "batch").unwrap()["id"], "f1");
    }

    #[test]
    fn tasks_filter_and_paginate() {
        let s = state();
        let all = tasks(&s, &TaskQuery::default());
        assert_eq!(all["total"], 3);
        let running = tasks(
            &s,
            &TaskQuery {
                state: Some("running".into()),
                ..Default::default()
            },
        );
        assert_eq!(running["total"], 1);
        assert_eq!(running["tasks"][0]["id"], "t1");
        let on_gpu1 = tasks(
            &s,
            &TaskQuery {
                agent: Some("gpu-1".into()),
                ..Default::default()
            },
        );
        assert_eq!(on_gpu1["total"], 2);
        let page = tasks(
            &s,
            &TaskQuery {
                limit: Some(1),
                offset: Some(1),
                ..Default::default()
            },
        );
        assert_eq!(page["total"], 3);
        assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
        assert_eq!(page["tasks"][0]["id"], "t2");
        let active = tasks(
            &s,
            &TaskQuery {
                completed: Some(false),
                ..Default::default()
            },
        );
        assert_eq!(active["total"], 2);
        let huge = tasks(
            &s,
            &TaskQuery {
                limit: Some(1_000_000),
                ..Default::default()
            },
        );
        assert_eq!(huge["limit"], MAX_PAGE);
    }

    #[test]
    fn roles_quotas_weights_and_maintenance() {
        let s = state();
        let r = roles(&s);
        assert_eq!(r[0]["name"], "eng");
        assert_eq!(r[0]["frameworks"][0], "f1");
        assert_eq!(quotas(&s).as_array().unwrap().len(), 1);
        let w = weights(&s);
        assert_eq!(w.as_array().unwrap().len(), 1);
        assert_eq!(w[0]["weight"], 2.0);
        let m = maintenance(&s);
        assert_eq!(m["agents"][0]["name"], "cpu-1");
    }
}
