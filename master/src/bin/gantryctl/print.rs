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

fn short(v: &Value) -> String {
    v.as_str()
        .map(|s| s.chars().take(8).collect())
        .unwrap_or_else(|| "-".into())
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
                short(&t["framework_id"]),
                short(&t["agent_id"]),
                res(&t["resources"]),
                arr(&t["gpus"])
                    .iter()
                    .map(short)
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

/// One line per event of `gantryctl events`.
pub fn event(e: &Value) -> String {
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
        "task_updated" => format!(
            "task {} ({}) {} on agent {}{}",
            cell(&e["name"]),
            short(&e["task_id"]),
            cell(&e["state"]),
            short(&e["agent_id"]),
            e["reason"]
                .as_str()
                .map(|r| format!(" [{r}]"))
                .unwrap_or_default()
        ),
        "agent_added" | "agent_removed" | "agent_updated" => {
            let mut s = format!("{kind} {} ({})", cell(&e["name"]), short(&e["agent_id"]));
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
                cell(&e["name"]),
                short(&e["framework_id"])
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
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["A", "LONGER"],
            &[
                vec!["xyz".into(), "1".into()],
                vec!["q".into(), "22".into()],
            ],
        );
        assert_eq!(t, "A    LONGER\nxyz  1\nq    22\n");
    }

    #[test]
    fn agents_show_a_gpu_table() {
        let a = json!([{"name": "n1", "id": "abc", "connected": true, "active": true, "drain": null,
            "total": {"gpus": 1.0}, "used": {},
            "gpus": [{"uuid": "GPU-1", "name": "A100", "memory_mib": 40960, "healthy": false,
                      "sample": {"util_percent": 42, "mem_used_bytes": 2097152},
                      "tasks": [{"name": "train"}]}]}]);
        let out = agents(&a);
        assert!(
            out.contains("GPU-1  A100   40960 MiB  42%   2 MiB     UNHEALTHY  train"),
            "{out}"
        );
    }

    #[test]
    fn tasks_show_their_ports() {
        let v = json!({"total": 1, "offset": 0, "tasks": [{"name": "web", "id": "t1",
            "state": "RUNNING", "reason": null, "framework_id": "f1", "agent_id": "a1",
            "resources": {"cpus": 0.1, "ports": 2.0}, "gpus": [], "ports": [31000, 31001]}]});
        let out = tasks(&v);
        let header = out.lines().next().unwrap();
        assert!(header.ends_with("GPUS  PORTS"), "{out}");
        assert!(out.contains("31000,31001"), "{out}");
    }

    #[test]
    fn events_are_one_line_each() {
        let e = json!({"type": "task_updated", "name": "t", "task_id": "0123456789", "state": "RUNNING",
                       "agent_id": "aaaaaaaaaa", "reason": null});
        assert_eq!(event(&e), "task t (01234567) RUNNING on agent aaaaaaaa");
    }
}
