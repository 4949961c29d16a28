//! Usage reports from the persistent history (`super::history`): CPU-, memory- and GPU-hours
//! of resources *held by tasks* (from `RUNNING` to the end, never offers held) over a window,
//! per role, framework or user. PURE: the history's events in, the report out.
//!
//! A task counts from the first `RUNNING` the history holds to its first terminal state (or
//! the window's end while it runs), clipped to the window; a task whose `RUNNING` fell out of
//! the history is not counted, so a report reaches back only as far as the history
//! (`history_from_ms` in the report; `--history-events` bounds it).

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use crate::registry::HistoryEvent;

/// How a report groups tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageBy {
    Role,
    Framework,
    User,
}

impl UsageBy {
    /// `role`, `framework` or `user`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "role" => Ok(UsageBy::Role),
            "framework" => Ok(UsageBy::Framework),
            "user" => Ok(UsageBy::User),
            other => Err(format!("by={other:?}: role, framework or user")),
        }
    }
}

const TERMINAL: [&str; 7] = [
    "FINISHED", "FAILED", "KILLED", "LOST", "ERROR", "DROPPED", "GONE",
];

#[derive(Default)]
struct Row {
    tasks: u64,
    cpu_hours: f64,
    mem_gib_hours: f64,
    gpu_hours: f64,
}

/// The usage in `[since_ms, until_ms)` by `by`, from `events` (oldest first).
pub fn report(events: &[HistoryEvent], since_ms: u64, until_ms: u64, by: UsageBy) -> Value {
    // Framework names, from the history's framework events.
    let mut frameworks: HashMap<String, String> = HashMap::new();
    // Open tasks: id -> (start, key, resources).
    let mut open: HashMap<String, (u64, String, Value)> = HashMap::new();
    let mut spans: Vec<(u64, u64, String, Value)> = Vec::new();
    let key_of = |e: &Value, frameworks: &HashMap<String, String>| -> String {
        match by {
            UsageBy::Role => e["role"].as_str().unwrap_or("-").to_string(),
            UsageBy::User => e["user"]
                .as_str()
                .unwrap_or("(agent's task user)")
                .to_string(),
            UsageBy::Framework => {
                let id = e["framework_id"].as_str().unwrap_or_default();
                frameworks
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| id.to_string())
            }
        }
    };
    for h in events {
        let e = &h.event;
        match e["type"].as_str() {
            Some("framework_added") => {
                if let (Some(id), Some(name)) = (e["framework_id"].as_str(), e["name"].as_str()) {
                    frameworks.insert(id.to_string(), name.to_string());
                }
            }
            Some("task_updated") => {
                let id = e["task_id"].as_str().unwrap_or_default().to_string();
                let state = e["state"].as_str().unwrap_or_default();
                if state == "RUNNING" && !open.contains_key(&id) {
                    let key = key_of(e, &frameworks);
                    open.insert(id, (h.at_unix_ms, key, e["resources"].clone()));
                } else if TERMINAL.contains(&state) {
                    if let Some((start, key, res)) = open.remove(&id) {
                        spans.push((start, h.at_unix_ms, key, res));
                    }
                }
            }
            _ => {}
        }
    }
    for (_, (start, key, res)) in open {
        spans.push((start, until_ms, key, res));
    }
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    let mut total = Row::default();
    for (start, end, key, res) in spans {
        let (s, e) = (start.max(since_ms), end.min(until_ms));
        // A task that ran within the window counts, even for no time at all (a task that
        // ends in the millisecond it started: the agent reports both in one batch).
        if e < s {
            continue;
        }
        let hours = (e - s) as f64 / 3_600_000.0;
        let amount = |k: &str| res[k].as_f64().unwrap_or(0.0);
        for row in [rows.entry(key).or_default(), &mut total] {
            row.tasks += 1;
            row.cpu_hours += amount("cpus") * hours;
            row.mem_gib_hours += amount("mem") / 1024.0 * hours;
            row.gpu_hours += amount("gpus") * hours;
        }
    }
    let row_json = |k: &str, r: &Row| {
        json!({"key": k, "tasks": r.tasks, "cpu_hours": r.cpu_hours,
               "mem_gib_hours": r.mem_gib_hours, "gpu_hours": r.gpu_hours})
    };
    json!({
        "since_ms": since_ms,
        "until_ms": until_ms,
        "by": match by { UsageBy::Role => "role", UsageBy::Framework => "framework", UsageBy::User => "user" },
        "history_from_ms": events.first().map(|e| e.at_unix_ms),
        "rows": rows.iter().map(|(k, r)| row_json(k, r)).collect::<Vec<_>>(),
        "total": row_json("total", &total),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(at: u64, id: &str, state: &str, role: &str, res: Value) -> HistoryEvent {
        HistoryEvent {
            at_unix_ms: at,
            event: json!({"type": "task_updated", "task_id": id, "state": state, "role": role,
                          "framework_id": "f1", "user": null, "resources": res}),
        }
    }

    #[test]
    fn tasks_count_from_running_to_their_end_clipped_to_the_window() {
        let h = 3_600_000;
        let res = json!({"cpus": 2.0, "mem": 1024.0, "gpus": 1.0});
        let events = vec![
            HistoryEvent {
                at_unix_ms: 0,
                event: json!({"type": "framework_added", "framework_id": "f1", "name": "etl"}),
            },
            task(0, "a", "STAGING", "eng", res.clone()),
            task(h, "a", "RUNNING", "eng", res.clone()),
            task(3 * h, "a", "FINISHED", "eng", res.clone()),
            task(2 * h, "b", "RUNNING", "ml", res.clone()),
            task(2 * h, "b", "RUNNING", "ml", res.clone()),
        ];
        // Window [2h, 4h): a counts 1 h, b (still running) 2 h.
        let r = report(&events, 2 * h, 4 * h, UsageBy::Role);
        assert_eq!(r["rows"][0]["key"], "eng");
        assert_eq!(r["rows"][0]["cpu_hours"], 2.0);
        assert_eq!(r["rows"][1]["gpu_hours"], 2.0);
        assert_eq!(r["total"]["mem_gib_hours"], 3.0);
        let r = report(&events, 0, 4 * h, UsageBy::Framework);
        assert_eq!(r["rows"][0]["key"], "etl");
        assert_eq!(r["rows"][0]["tasks"], 2);
        assert!(UsageBy::parse("team").is_err());
        // A task that ended in the millisecond it started counts, for no time; one that ended
        // before the window does not.
        let quick = vec![
            task(5 * h, "q", "RUNNING", "eng", res.clone()),
            task(5 * h, "q", "FINISHED", "eng", res.clone()),
            task(h, "old", "RUNNING", "eng", res.clone()),
            task(h + 1, "old", "FINISHED", "eng", res.clone()),
        ];
        let r = report(&quick, 2 * h, 6 * h, UsageBy::Role);
        assert_eq!(r["rows"][0]["tasks"], 1, "{r:#}");
        assert_eq!(r["rows"][0]["cpu_hours"], 0.0);
    }
}
