//! Human-readable tables for `gantryctl` (the `--json` output is the API's JSON as is).

use serde_json::Value;

/// Columns padded to their widest cell, two spaces apart; the last column is not padded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let n = cells.len();
        let mut s = String::new();
        for (i, c) in cells.into_iter().enumerate() {
            s.push_str(c);
            if i + 1 < n {
                let pad = widths[i].saturating_sub(c.chars().count()) + 2;
                s.push_str(&" ".repeat(pad));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// A JSON value as a cell: strings bare, null as `-`.
pub fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// `cpus:2;gpus:1` from a resources object (`-` when empty).
pub fn res(v: &Value) -> String {
    match v.as_object() {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(";"),
        _ => "-".into(),
    }
}

/// A name when the API gave one, else the id (never cut: an id is what the API takes back).
fn name_or_id(name: &Value, id: &Value) -> String {
    match name {
        Value::String(n) if !n.is_empty() => n.clone(),
        _ => cell(id),
    }
}

/// Unix milliseconds as an RFC 3339 UTC time (`-` for none).
pub fn time(ms: &Value) -> String {
    match ms.as_u64() {
        Some(ms) => humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        )
        .to_string(),
        None => "-".into(),
    }
}

/// `key  value` lines, keys padded to the widest.
fn fields(rows: &[(&str, String)]) -> String {
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:<w$}  {v}\n"))
        .collect()
}

/// A task list of an agent's or framework's page.
fn task_briefs(title: &str, tasks: &Value) -> String {
    let rows: Vec<Vec<String>> = arr(tasks)
        .iter()
        .map(|t| {
            vec![
                cell(&t["name"]),
                cell(&t["id"]),
                cell(&t["state"]),
                cell(&t["reason"]),
                name_or_id(&t["framework_name"], &t["framework_id"]),
                name_or_id(&t["agent_name"], &t["agent_id"]),
                res(&t["resources"]),
                arr(&t["gpus"])
                    .iter()
                    .map(cell)
                    .collect::<Vec<_>>()
                    .join(","),
            ]
        })
        .collect();
    if rows.is_empty() {
        return format!("{title}: none\n");
    }
    format!(
        "{title}:\n{}",
        table(
            &[
                "TASK",
                "ID",
                "STATE",
                "REASON",
                "FRAMEWORK",
                "AGENT",
                "RESOURCES",
                "GPUS"
            ],
            &rows
        )
    )
}

/// `gantryctl task ID`: one task's page.
pub fn task(t: &Value) -> String {
    let exit = match (t["exit_code"].as_i64(), t["signal"].as_i64()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "-".into(),
    };
    let mut out = fields(&[
        ("task", format!("{} ({})", cell(&t["name"]), cell(&t["id"]))),
        (
            "state",
            format!(
                "{}{}",
                cell(&t["state"]),
                if t["active"] == true {
                    ""
                } else {
                    " (completed)"
                }
            ),
        ),
        ("reason", cell(&t["reason"])),
        ("message", cell(&t["message"])),
        ("exit", exit),
        (
            "framework",
            format!(
                "{} ({})",
                name_or_id(&t["framework_name"], &t["framework_id"]),
                cell(&t["framework_id"])
            ),
        ),
        (
            "agent",
            format!(
                "{} ({}, host {})",
                name_or_id(&t["agent_name"], &t["agent_id"]),
                cell(&t["agent_id"]),
                cell(&t["agent_hostname"])
            ),
        ),
        ("role", cell(&t["role"])),
        ("user", cell(&t["user"])),
        ("resources", res(&t["resources"])),
        (
            "ports",
            arr(&t["ports"])
                .iter()
                .map(cell)
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("staged", time(&t["staged_at_ms"])),
        ("started", time(&t["started_at_ms"])),
        ("ended", time(&t["ended_at_ms"])),
    ]);
    let history: Vec<Vec<String>> = arr(&t["history"])
        .iter()
        .map(|h| {
            vec![
                time(&h["at_ms"]),
                cell(&h["state"]),
                h["reason"].as_str().unwrap_or("-").to_string(),
                h["message"].as_str().unwrap_or_default().to_string(),
            ]
        })
        .collect();
    if !history.is_empty() {
        out.push_str("\nhistory:\n");
        out.push_str(&table(&["TIME", "STATE", "REASON", "MESSAGE"], &history));
    }
    let gpus: Vec<Vec<String>> = arr(&t["gpu_devices"])
        .iter()
        .map(|g| {
            vec![
                cell(&g["uuid"]),
                cell(&g["name"]),
                g["memory_mib"]
                    .as_u64()
                    .map(|m| format!("{m} MiB"))
                    .unwrap_or_else(|| "-".into()),
                g["sample"]["util_percent"]
                    .as_u64()
                    .map(|u| format!("{u}%"))
                    .unwrap_or_else(|| "-".into()),
                match g["healthy"].as_bool() {
                    Some(true) => "healthy",
                    Some(false) => "UNHEALTHY",
                    None => "-",
                }
                .into(),
            ]
        })
        .collect();
    if !gpus.is_empty() {
        out.push('\n');
        out.push_str(&table(&["GPU", "MODEL", "MEMORY", "UTIL", "HEALTH"], &gpus));
    }
    out
}

/// `gantryctl framework ID`: one framework's page.
pub fn framework(f: &Value) -> String {
    let status = if f["completed"] == true {
        format!(
            "removed at {}: {}",
            time(&f["removed_at_ms"]),
            cell(&f["reason"])
        )
    } else if f["connected"] == true {
        "connected".into()
    } else {
        "disconnected".into()
    };
    let mut out = fields(&[
        (
            "framework",
            format!("{} ({})", cell(&f["name"]), cell(&f["id"])),
        ),
        ("principal", cell(&f["principal"])),
        ("status", status),
        (
            "roles",
            arr(&f["roles"])
                .iter()
                .map(cell)
                .collect::<Vec<_>>()
                .join(","),
        ),
        (
            "share",
            f["dominant_share"]
                .as_f64()
                .map(|s| format!("{s:.3}"))
                .unwrap_or_else(|| "-".into()),
        ),
        ("used", res(&f["used"])),
        ("allocated", res(&f["allocated"])),
        ("offers held", arr(&f["offers"]).len().to_string()),
    ]);
    out.push('\n');
    out.push_str(&task_briefs("tasks", &f["tasks"]));
    out.push_str(&task_briefs(
        "latest completed tasks",
        &f["completed_tasks"],
    ));
    out
}

/// `gantryctl agent ID`: one agent's page (its row and GPUs as `agents` shows them, then its
/// tasks and offers).
pub fn agent(a: &Value) -> String {
    let mut out = fields(&[
        (
            "agent",
            format!("{} ({})", cell(&a["name"]), cell(&a["id"])),
        ),
        (
            "host",
            format!("{} ({})", cell(&a["hostname"]), cell(&a["address"])),
        ),
        ("task user", cell(&a["task_user"])),
    ]);
    out.push('\n');
    out.push_str(&agents(&Value::Array(vec![a.clone()])));
    out.push('\n');
    out.push_str(&task_briefs("tasks", &a["tasks"]));
    out.push_str(&task_briefs(
        "latest completed tasks",
        &a["completed_tasks"],
    ));
    if !arr(&a["offers"]).is_empty() {
        out.push_str("offers:\n");
        out.push_str(&offers(&a["offers"]));
    }
    out
}

/// `gantryctl offers`: the outstanding offers.
pub fn offers(v: &Value) -> String {
    let rows: Vec<Vec<String>> = arr(v)
        .iter()
        .map(|o| {
            let mut reserved: Vec<String> = o["reserved"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(role, r)| format!("{role}={}", res(r)))
                        .collect()
                })
                .unwrap_or_default();
            reserved.sort();
            vec![
                cell(&o["id"]),
                name_or_id(&o["framework_name"], &o["framework_id"]),
                name_or_id(&o["agent_name"], &o["agent_id"]),
                cell(&o["role"]),
                res(&o["resources"]),
                if reserved.is_empty() {
                    "-".into()
                } else {
                    reserved.join(" ")
                },
                o["age_ms"]
                    .as_u64()
                    .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(
        &[
            "OFFER",
            "FRAMEWORK",
            "AGENT",
            "ROLE",
            "RESOURCES",
            "RESERVED",
            "AGE",
        ],
        &rows,
    )
}

/// `gantryctl status`: the cluster summary.
pub fn summary(s: &Value) -> String {
    let by_state = s["tasks"]["by_state"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "none".into());
    let mut out = format!(
        "leader      {} (epoch {})\n\
         agents      {} connected of {} ({} deactivated)\n\
         GPUs        {} ({} unhealthy)\n\
         frameworks  {} ({} connected, {} completed)\n\
         tasks       {} active: {by_state}; {} completed\n\
         offers      {} outstanding ({} made, {} accepted, {} declined, {} rescinded)\n\
         resources   used {} of {}\n",
        cell(&s["leader"]),
        cell(&s["epoch"]),
        cell(&s["agents"]["connected"]),
        cell(&s["agents"]["total"]),
        cell(&s["agents"]["deactivated"]),
        cell(&s["gpus"]["total"]),
        cell(&s["gpus"]["unhealthy"]),
        cell(&s["frameworks"]["active"]),
        cell(&s["frameworks"]["connected"]),
        cell(&s["frameworks"]["completed"]),
        cell(&s["tasks"]["active"]),
        cell(&s["tasks"]["completed"]),
        cell(&s["offers"]["outstanding"]),
        cell(&s["offers"]["made"]),
        cell(&s["offers"]["accepted"]),
        cell(&s["offers"]["declined"]),
        cell(&s["offers"]["rescinded"]),
        res(&s["resources"]["used"]),
        res(&s["resources"]["total"]),
    );
    if !arr(&s["roles"]).is_empty() {
        out.push('\n');
        out.push_str(&roles(&s["roles"]));
    }
    out
}

/// `gantryctl agents`: one row per agent, then a GPU table (model, memory, utilization,
/// health, task) for agents with GPUs.
pub fn agents(agents: &Value) -> String {
    let rows: Vec<Vec<String>> = arr(agents)
        .iter()
        .map(|a| {
            let status = match (a["connected"] == true, a["active"] != false) {
                (true, true) => "connected",
                (true, false) => "deactivated",
                (false, _) => "disconnected",
            };
            let drain = match &a["drain"] {
                Value::Object(d) => cell(d.get("state").unwrap_or(&Value::Null)),
                other => cell(other),
            };
            vec![
                cell(&a["name"]),
                cell(&a["id"]),
                status.into(),
                drain,
                arr(&a["gpus"]).len().to_string(),
                res(&a["total"]),
                res(&a["used"]),
            ]
        })
        .collect();
    let mut out = table(
        &["AGENT", "ID", "STATUS", "DRAIN", "GPUS", "TOTAL", "USED"],
        &rows,
    );
    let gpu_rows: Vec<Vec<String>> = arr(agents)
        .iter()
        .flat_map(|a| {
            arr(&a["gpus"]).iter().map(move |g| {
                let smp = &g["sample"];
                let tasks: Vec<String> =
                    arr(&g["tasks"]).iter().map(|t| cell(&t["name"])).collect();
                vec![
                    cell(&a["name"]),
                    cell(&g["uuid"]),
                    cell(&g["name"]),
                    format!("{} MiB", cell(&g["memory_mib"])),
                    smp["util_percent"]
                        .as_u64()
                        .map(|u| format!("{u}%"))
                        .unwrap_or_else(|| "-".into()),
                    smp["mem_used_bytes"]
                        .as_u64()
                        .map(|b| format!("{} MiB", b >> 20))
                        .unwrap_or_else(|| "-".into()),
                    if g["healthy"] == true {
                        "healthy"
                    } else {
                        "UNHEALTHY"
                    }
                    .into(),
                    if tasks.is_empty() {
                        "-".into()
                    } else {
                        tasks.join(",")
                    },
                ]
            })
        })
        .collect();
    if !gpu_rows.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &[
                "AGENT", "GPU", "MODEL", "MEMORY", "UTIL", "MEM USED", "HEALTH", "TASK",
            ],
            &gpu_rows,
        ));
    }
    out
}

/// `gantryctl frameworks`: with their dominant shares.
pub fn frameworks(v: &Value) -> String {
    let rows: Vec<Vec<String>> = arr(&v["frameworks"])
        .iter()
        .map(|f| {
            vec![
                cell(&f["name"]),
                cell(&f["id"]),
                cell(&f["principal"]),
                arr(&f["roles"])
                    .iter()
                    .map(cell)
                    .collect::<Vec<_>>()
                    .join(","),
                format!("{:.3}", f["dominant_share"].as_f64().unwrap_or(0.0)),
                cell(&f["active_tasks"]),
                res(&f["allocated"]),
                if f["connected"] == true { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    table(
        &[
            "FRAMEWORK",
            "ID",
            "PRINCIPAL",
            "ROLES",
            "SHARE",
            "TASKS",
            "ALLOCATED",
            "CONNECTED",
        ],
        &rows,
    )
}

/// `gantryctl tasks`: one page, with the total.
pub fn tasks(v: &Value) -> String {
    let rows: Vec<Vec<String>> = arr(&v["tasks"])
        .iter()
        .map(|t| {
            vec![
                cell(&t["name"]),
                cell(&t["id"]),
                cell(&t["state"]),
                cell(&t["reason"]),
                name_or_id(&t["framework_name"], &t["framework_id"]),
                name_or_id(&t["agent_name"], &t["agent_id"]),
                res(&t["resources"]),
                // GPU UUIDs whole: they are what nvidia-smi and the agent's logs show.
                arr(&t["gpus"])
                    .iter()
                    .map(cell)
                    .collect::<Vec<_>>()
                    .join(","),
                arr(&t["ports"])
                    .iter()
                    .map(cell)
                    .collect::<Vec<_>>()
                    .join(","),
            ]
        })
        .collect();
    let shown = rows.len();
    let mut out = table(
        &[
            "TASK",
            "ID",
            "STATE",
            "REASON",
            "FRAMEWORK",
            "AGENT",
            "RESOURCES",
            "GPUS",
            "PORTS",
        ],
        &rows,
    );
    let offset = v["offset"].as_u64().unwrap_or(0);
    out.push_str(&format!(
        "({shown} shown of {}, from {offset})\n",
        cell(&v["total"])
    ));
    out
}

/// `gantryctl roles`: shares, weights, allocations and quotas.
pub fn roles(v: &Value) -> String {
    let rows: Vec<Vec<String>> = arr(v)
        .iter()
        .map(|r| {
            vec![
                cell(&r["name"]),
                format!("{:.3}", r["dominant_share"].as_f64().unwrap_or(0.0)),
                cell(&r["weight"]),
                res(&r["allocated"]),
                res(&r["quota"]["guarantee"]),
                res(&r["quota"]["limit"]),
            ]
        })
        .collect();
    table(
        &["ROLE", "SHARE", "WEIGHT", "ALLOCATED", "GUARANTEE", "LIMIT"],
        &rows,
    )
}

/// The names of agents and frameworks `gantryctl events` has seen (from snapshots and
/// added / updated events), to show names where events carry only ids.
#[derive(Default)]
pub struct EventNames {
    agents: std::collections::HashMap<String, String>,
    frameworks: std::collections::HashMap<String, String>,
}

impl EventNames {
    fn learn(&mut self, e: &Value) {
        let put =
            |map: &mut std::collections::HashMap<String, String>, id: &Value, name: &Value| {
                if let (Some(id), Some(name)) = (id.as_str(), name.as_str()) {
                    if !name.is_empty() {
                        map.insert(id.to_string(), name.to_string());
                    }
                }
            };
        if e["type"] == "snapshot" {
            let s = &e["state"];
            for a in arr(&s["agents"])
                .iter()
                .chain(arr(&s["unreachable_agents"]))
            {
                put(&mut self.agents, &a["id"], &a["name"]);
            }
            for f in arr(&s["frameworks"])
                .iter()
                .chain(arr(&s["completed_frameworks"]))
            {
                put(&mut self.frameworks, &f["id"], &f["name"]);
            }
        }
        put(&mut self.agents, &e["agent_id"], &e["agent_name"]);
        if e["type"].as_str().is_some_and(|t| t.starts_with("agent_")) {
            put(&mut self.agents, &e["agent_id"], &e["name"]);
        }
        if e["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("framework_"))
        {
            put(&mut self.frameworks, &e["framework_id"], &e["name"]);
        }
    }

    fn agent(&self, id: &Value) -> String {
        id.as_str()
            .and_then(|i| self.agents.get(i))
            .cloned()
            .unwrap_or_else(|| cell(id))
    }

    fn framework(&self, id: &Value) -> String {
        id.as_str()
            .and_then(|i| self.frameworks.get(i))
            .cloned()
            .unwrap_or_else(|| cell(id))
    }

    /// One line for an event of `gantryctl events` (names where the event has ids).
    pub fn event(&mut self, e: &Value) -> String {
        self.learn(e);
        let kind = cell(&e["type"]);
        match kind.as_str() {
            "snapshot" => {
                let s = &e["state"];
                format!(
                    "snapshot: {} agents, {} frameworks, {} active tasks",
                    arr(&s["agents"]).len(),
                    arr(&s["frameworks"]).len(),
                    arr(&s["tasks"]).len()
                )
            }
            "task_updated" => {
                let mut line = format!(
                    "task {} ({}) {} on agent {}",
                    cell(&e["name"]),
                    cell(&e["task_id"]),
                    cell(&e["state"]),
                    self.agent(&e["agent_id"]),
                );
                if !e["framework_id"].is_null() {
                    line.push_str(&format!(" of {}", self.framework(&e["framework_id"])));
                }
                if let Some(r) = e["reason"].as_str() {
                    line.push_str(&format!(" [{r}]"));
                }
                if let Some(m) = e["message"].as_str().filter(|m| !m.is_empty()) {
                    line.push_str(&format!(": {m}"));
                }
                line
            }
            "agent_added" | "agent_removed" | "agent_updated" => {
                let mut s = format!(
                    "{kind} {} ({})",
                    self.agent(&e["agent_id"]),
                    cell(&e["agent_id"])
                );
                for k in ["what", "reason"] {
                    if let Some(x) = e[k].as_str() {
                        s.push_str(&format!(": {x}"));
                    }
                }
                s
            }
            "framework_added" | "framework_removed" | "framework_updated" => {
                let mut s = format!(
                    "{kind} {} ({})",
                    self.framework(&e["framework_id"]),
                    cell(&e["framework_id"])
                );
                if let Some(c) = e["connected"].as_bool() {
                    s.push_str(if c { ": connected" } else { ": disconnected" });
                }
                if let Some(r) = e["reason"].as_str() {
                    s.push_str(&format!(": {r}"));
                }
                s
            }
            "role_updated" => format!("role {} {}", cell(&e["role"]), cell(&e["what"])),
            "dropped" => format!("dropped: {}", cell(&e["message"])),
            _ => e.to_string(),
        }
    }
}

/// `gantryctl fs TASK [PATH]`: a sandbox directory page.
pub fn sandbox_listing(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().unwrap_or_default();
            let kind = e["kind"].as_str().unwrap_or_default();
            vec![
                e["mode"].as_str().unwrap_or_default().to_string(),
                e["size"].as_u64().unwrap_or(0).to_string(),
                humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH
                        + std::time::Duration::from_millis(e["mtime_ms"].as_u64().unwrap_or(0)),
                )
                .to_string(),
                if kind == "dir" {
                    format!("{name}/")
                } else {
                    name.to_string()
                },
            ]
        })
        .collect();
    let mut out = table(&["MODE", "SIZE", "MODIFIED", "NAME"], &rows);
    let shown = rows.len() as u64 + v["offset"].as_u64().unwrap_or(0);
    let total = v["total"].as_u64().unwrap_or(0);
    if shown < total {
        out.push_str(&format!("({total} entries; {} shown)\n", rows.len()));
    }
    out
}

#[path = "print_usage.rs"]
mod usage_tables;
pub use usage_tables::{usage, usage_csv};

#[cfg(test)]
#[path = "print_tests.rs"]
mod tests;
