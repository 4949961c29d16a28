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

/// Why a name or id named nothing (or more than one thing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Nothing has that id or name.
    NotFound,
    /// More than one has that name: their ids.
    Ambiguous(Vec<String>),
}

impl Lookup {
    /// The operator's message for `what` (`task`, `framework`) named `key`.
    pub fn message(&self, what: &str, key: &str) -> String {
        match self {
            Lookup::NotFound => format!("no {what} {key:?}"),
            Lookup::Ambiguous(ids) => format!(
                "more than one {what} is named {key:?} (ids {}); name one by its id",
                ids.join(", ")
            ),
        }
    }
}

/// The task states a filter may name (upper case, as `/state` shows them).
pub const TASK_STATES: [&str; 11] = [
    "STAGING",
    "STARTING",
    "RUNNING",
    "FINISHED",
    "FAILED",
    "KILLED",
    "LOST",
    "ERROR",
    "DROPPED",
    "UNREACHABLE",
    "GONE",
];

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

/// The framework named by `key` among active and completed frameworks: its id, or a name only
/// one of them has (an active framework wins over completed ones of the same name).
pub fn lookup_framework<'a>(state: &'a Value, key: &str) -> Result<&'a Value, Lookup> {
    let active = arr(&state["frameworks"]);
    let completed = arr(&state["completed_frameworks"]);
    if let Some(f) = active.iter().chain(completed).find(|f| f["id"] == key) {
        return Ok(f);
    }
    for list in [active, completed] {
        let named: Vec<&Value> = list.iter().filter(|f| f["name"] == key).collect();
        match named.as_slice() {
            [] => continue,
            [f] => return Ok(f),
            many => {
                return Err(Lookup::Ambiguous(
                    many.iter().map(|f| cell(&f["id"])).collect(),
                ))
            }
        }
    }
    Err(Lookup::NotFound)
}

/// The task named by `key`: its id, or a name only one task has (active tasks first, then
/// completed ones). A task id relaunched after it ended is found as its newest run.
pub fn lookup_task<'a>(state: &'a Value, key: &str) -> Result<&'a Value, Lookup> {
    let active = arr(&state["tasks"]);
    let completed = arr(&state["completed_tasks"]);
    if let Some(t) = active.iter().find(|t| t["id"] == key) {
        return Ok(t);
    }
    // Completed tasks are oldest end first: the newest run is the last.
    if let Some(t) = completed.iter().rev().find(|t| t["id"] == key) {
        return Ok(t);
    }
    for list in [active, completed] {
        let mut ids: Vec<String> = Vec::new();
        let mut found = None;
        for t in list.iter().rev().filter(|t| t["name"] == key) {
            let id = cell(&t["id"]);
            if !ids.contains(&id) {
                ids.push(id);
            }
            found.get_or_insert(t);
        }
        match (found, ids.len()) {
            (None, _) => continue,
            (Some(t), 1) => return Ok(t),
            _ => {
                ids.sort();
                return Err(Lookup::Ambiguous(ids));
            }
        }
    }
    Err(Lookup::NotFound)
}

/// A JSON string as is, anything else as its JSON text (`-` for null).
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The names of agents and frameworks by id, to show names where records hold ids.
struct Names<'a> {
    agents: std::collections::HashMap<&'a str, &'a Value>,
    frameworks: std::collections::HashMap<&'a str, &'a Value>,
}

impl<'a> Names<'a> {
    fn new(state: &'a Value) -> Self {
        let by_id = |list: &'a Value| {
            arr(list)
                .iter()
                .filter_map(|x| Some((x["id"].as_str()?, x)))
                .collect::<Vec<_>>()
        };
        let mut agents: std::collections::HashMap<_, _> =
            by_id(&state["agents"]).into_iter().collect();
        for u in arr(&state["unreachable_agents"]) {
            if let Some(id) = u["id"].as_str() {
                agents.entry(id).or_insert(u);
            }
        }
        let mut frameworks: std::collections::HashMap<_, _> =
            by_id(&state["completed_frameworks"]).into_iter().collect();
        // Active frameworks win over a completed record of the same id.
        frameworks.extend(by_id(&state["frameworks"]));
        Names { agents, frameworks }
    }

    fn agent(&self, id: &Value) -> Value {
        id.as_str()
            .and_then(|id| self.agents.get(id))
            .map(|a| a["name"].clone())
            .unwrap_or(Value::Null)
    }

    fn framework(&self, id: &Value) -> Value {
        id.as_str()
            .and_then(|id| self.frameworks.get(id))
            .map(|f| f["name"].clone())
            .unwrap_or(Value::Null)
    }
}

/// A task's line in an agent's or framework's page.
fn task_brief(t: &Value, names: &Names) -> Value {
    json!({
        "id": t["id"], "name": t["name"], "state": t["state"], "reason": t["reason"],
        "message": t["message"], "exit_code": t["exit_code"],
        "agent_id": t["agent_id"], "agent_name": names.agent(&t["agent_id"]),
        "framework_id": t["framework_id"], "framework_name": names.framework(&t["framework_id"]),
        "resources": t["resources"], "gpus": t["gpus"],
        "staged_at_ms": t["staged_at_ms"], "ended_at_ms": t["ended_at_ms"],
    })
}

/// Completed tasks shown on an agent's or framework's page (newest first).
pub const PAGE_COMPLETED: usize = 50;

/// `GET /api/v1/tasks/{id}`: the task's record (`/state`'s fields) with its agent's and
/// framework's names, whether it is still active, and its GPUs in full (UUID, model, memory,
/// health, latest sample) from its agent.
pub fn task_page(state: &Value, t: &Value) -> Value {
    let names = Names::new(state);
    let active = arr(&state["tasks"]).iter().any(|x| std::ptr::eq(x, t));
    let agent = names
        .agents
        .get(t["agent_id"].as_str().unwrap_or_default())
        .copied();
    let gpus: Vec<Value> = arr(&t["gpus"])
        .iter()
        .map(|uuid| {
            let info = agent
                .map(|a| arr(&a["gpus"]))
                .unwrap_or_default()
                .iter()
                .find(|g| &g["uuid"] == uuid);
            let sample = agent
                .map(|a| arr(&a["gpu_samples"]))
                .unwrap_or_default()
                .iter()
                .find(|s| &s["uuid"] == uuid);
            let mut g = json!({"uuid": uuid});
            if let (Some(o), Some(Value::Object(i))) = (g.as_object_mut(), info) {
                for (k, v) in i {
                    o.insert(k.clone(), v.clone());
                }
            }
            if let Some(o) = g.as_object_mut() {
                o.insert("sample".into(), sample.cloned().unwrap_or(Value::Null));
            }
            g
        })
        .collect();
    let mut page = t.clone();
    if let Some(o) = page.as_object_mut() {
        o.insert("active".into(), json!(active));
        o.insert("agent_name".into(), names.agent(&t["agent_id"]));
        o.insert(
            "agent_hostname".into(),
            agent.map(|a| a["hostname"].clone()).unwrap_or(Value::Null),
        );
        o.insert("framework_name".into(), names.framework(&t["framework_id"]));
        o.insert("gpu_devices".into(), Value::Array(gpus));
    }
    page
}

/// `GET /api/v1/agents/{id}`: [`agent`] with its tasks (active, then the latest completed,
/// newest first) and the offers outstanding on it, with framework names.
pub fn agent_page(state: &Value, a: &Value) -> Value {
    let names = Names::new(state);
    let id = &a["id"];
    let active: Vec<Value> = arr(&state["tasks"])
        .iter()
        .filter(|t| &t["agent_id"] == id)
        .map(|t| task_brief(t, &names))
        .collect();
    let completed: Vec<Value> = arr(&state["completed_tasks"])
        .iter()
        .rev()
        .filter(|t| &t["agent_id"] == id)
        .take(PAGE_COMPLETED)
        .map(|t| task_brief(t, &names))
        .collect();
    let offers: Vec<Value> = arr(&state["offers"])
        .iter()
        .filter(|o| &o["agent_id"] == id)
        .map(|o| {
            let mut o = o.clone();
            let name = names.framework(&o["framework_id"]);
            if let Some(m) = o.as_object_mut() {
                m.insert("framework_name".into(), name);
            }
            o
        })
        .collect();
    let mut page = agent(a, arr(&state["tasks"]));
    if let Some(o) = page.as_object_mut() {
        o.insert("tasks".into(), Value::Array(active));
        o.insert("completed_tasks".into(), Value::Array(completed));
        o.insert("offers".into(), Value::Array(offers));
    }
    page
}

/// `GET /api/v1/frameworks/{id}`: the framework (active, or `completed` with why it was
/// removed) with its roles' shares and quotas, its tasks (active, then the latest completed,
/// newest first, with agent names) and the offers it holds.
pub fn framework_page(state: &Value, f: &Value) -> Value {
    let names = Names::new(state);
    let id = &f["id"];
    let completed_fw = arr(&state["completed_frameworks"])
        .iter()
        .any(|c| std::ptr::eq(c, f));
    let active: Vec<Value> = arr(&state["tasks"])
        .iter()
        .filter(|t| &t["framework_id"] == id)
        .map(|t| task_brief(t, &names))
        .collect();
    let completed: Vec<Value> = arr(&state["completed_tasks"])
        .iter()
        .rev()
        .filter(|t| &t["framework_id"] == id)
        .take(PAGE_COMPLETED)
        .map(|t| task_brief(t, &names))
        .collect();
    let offers: Vec<Value> = arr(&state["offers"])
        .iter()
        .filter(|o| &o["framework_id"] == id)
        .map(|o| {
            let mut o = o.clone();
            let name = names.agent(&o["agent_id"]);
            if let Some(m) = o.as_object_mut() {
                m.insert("agent_name".into(), name);
            }
            o
        })
        .collect();
    let fw_roles: Vec<&Value> = arr(&f["roles"]).iter().collect();
    let roles: Vec<Value> = arr(&roles(state))
        .iter()
        .filter(|r| fw_roles.contains(&&r["name"]))
        .cloned()
        .collect();
    let mut page = f.clone();
    if let Some(o) = page.as_object_mut() {
        o.insert("completed".into(), json!(completed_fw));
        o.insert("role_details".into(), Value::Array(roles));
        o.insert("tasks".into(), Value::Array(active));
        o.insert("completed_tasks".into(), Value::Array(completed));
        o.insert("offers".into(), Value::Array(offers));
    }
    page
}

/// `GET /api/v1/offers`: the outstanding offers with their agent's and framework's names.
pub fn offers(state: &Value) -> Value {
    let names = Names::new(state);
    Value::Array(
        arr(&state["offers"])
            .iter()
            .map(|o| {
                let mut o = o.clone();
                let (a, f) = (
                    names.agent(&o["agent_id"]),
                    names.framework(&o["framework_id"]),
                );
                if let Some(m) = o.as_object_mut() {
                    m.insert("agent_name".into(), a);
                    m.insert("framework_name".into(), f);
                }
                o
            })
            .collect(),
    )
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

/// Warnings for a quota limit below what `role`'s tasks (and its subroles') hold now: they
/// keep running, and the role gets nothing more until it is back under the limit.
pub fn limit_warnings(
    state: &Value,
    role: &str,
    limit: &gantry_proto::ResourceLimits,
) -> Vec<String> {
    let sub = format!("{role}/");
    let mut held = Map::new();
    for t in arr(&state["tasks"]) {
        let r = t["role"].as_str().unwrap_or_default();
        if r == role || r.starts_with(&sub) {
            add_into(&mut held, &t["resources"]);
        }
    }
    limit
        .iter()
        .filter_map(|(kind, max_milli)| {
            let used = held.get(kind).and_then(Value::as_f64)?;
            let max = max_milli as f64 / 1000.0;
            (used * 1000.0 > max_milli as f64).then(|| {
                format!(
                    "the limit {kind}:{max} is below what role {role}'s tasks hold now ({kind}:{used}): \
                     they keep running, and the role is offered no more {kind} until it is under the limit"
                )
            })
        })
        .collect()
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
    /// A framework id or name.
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
/// filtered, then one page: `{"total": N, "offset": O, "limit": L, "tasks": [...]}`; each task
/// carries its agent's and framework's names (`agent_name`, `framework_name`).
///
/// A filter naming nothing is an error (the caller answers 400), never an empty page: a state
/// that is not one of [`TASK_STATES`], a framework that is neither the id nor the name of an
/// active or completed framework, an agent the master does not know.
pub fn tasks(state: &Value, q: &TaskQuery) -> Result<Value, String> {
    if let Some(s) = q.state.as_deref() {
        if !TASK_STATES.iter().any(|x| x.eq_ignore_ascii_case(s)) {
            return Err(format!(
                "unknown task state {s:?}; the states are {}",
                TASK_STATES.join(", ")
            ));
        }
    }
    let framework_id = match q.framework.as_deref() {
        None => None,
        Some(k) => match lookup_framework(state, k) {
            Ok(f) => Some(f["id"].clone()),
            Err(e) => {
                let known: Vec<String> = arr(&state["frameworks"])
                    .iter()
                    .chain(arr(&state["completed_frameworks"]))
                    .map(|f| cell(&f["name"]))
                    .collect();
                return Err(format!(
                    "{}; the frameworks are: {}",
                    e.message("framework", k),
                    if known.is_empty() {
                        "none".into()
                    } else {
                        known.join(", ")
                    }
                ));
            }
        },
    };
    let agent_id = match q.agent.as_deref() {
        None => None,
        Some(k) => {
            let names = Names::new(state);
            let found = find_agent(state, k)
                .map(|a| a["id"].clone())
                .or_else(|| names.agents.contains_key(k).then(|| json!(k)))
                .or_else(|| {
                    arr(&state["unreachable_agents"])
                        .iter()
                        .find(|u| u["name"] == k)
                        .map(|u| u["id"].clone())
                });
            // An agent removed since may still be named by its tasks' records.
            let in_records = arr(&state["completed_tasks"])
                .iter()
                .any(|t| t["agent_id"] == k);
            match found {
                Some(id) => Some(id),
                None if in_records => Some(json!(k)),
                None => {
                    let known: Vec<String> = arr(&state["agents"])
                        .iter()
                        .map(|a| cell(&a["name"]))
                        .collect();
                    return Err(format!(
                        "no agent {k:?}; the agents are: {}",
                        if known.is_empty() {
                            "none".into()
                        } else {
                            known.join(", ")
                        }
                    ));
                }
            }
        }
    };
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
            }) && framework_id
                .as_ref()
                .is_none_or(|f| &t["framework_id"] == f)
                && agent_id.as_ref().is_none_or(|a| &t["agent_id"] == a)
        })
        .collect();
    let limit = q.limit.unwrap_or(DEFAULT_PAGE).min(MAX_PAGE);
    let offset = q.offset.unwrap_or(0);
    let names = Names::new(state);
    let page: Vec<Value> = matching
        .iter()
        .skip(offset)
        .take(limit)
        .map(|t| {
            let mut t = (*t).clone();
            let (a, f) = (
                names.agent(&t["agent_id"]),
                names.framework(&t["framework_id"]),
            );
            if let Some(o) = t.as_object_mut() {
                o.insert("agent_name".into(), a);
                o.insert("framework_name".into(), f);
            }
            t
        })
        .collect();
    Ok(json!({"total": matching.len(), "offset": offset, "limit": limit, "tasks": page}))
}

#[cfg(test)]
mod tests;
