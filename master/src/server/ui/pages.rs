//! The dashboard's pages of one task, agent or framework, and the usage view:
//!
//! ```text
//! GET /ui/tasks/{id}        state, reason, message, exit, GPUs, resources, state history (the
//!                           persistent history), stdout and stderr followed live (app.js reads
//!                           /api/v1/tasks/{id}/logs?follow=true into a <pre>)
//! GET /ui/agents/{id}       resources, drain state, GPUs with utilization/health, its tasks, offers
//! GET /ui/frameworks/{id}   roles with shares and quotas, its tasks, the offers it holds
//! GET /ui/usage             /api/v1/usage (by=role|framework|user, since=, until=) as a table
//! ```
//!
//! Ids or names (a task's or framework's name only one has). Every page takes `?q=&sort=&dir=`
//! for its tables and `?part=main` for its `<main>` alone (what the page's script swaps in).

use axum::extract::Path;

use super::*;

type ViewQuery = Result<Query<View>, axum::extract::rejection::QueryRejection>;

const DETAIL_COLUMNS: &[&str] = &[
    "name",
    "state",
    "reason",
    "framework",
    "agent",
    "role",
    "resources",
    "gpus",
    "ports",
    "message",
    "share",
    "weight",
    "allocated",
    "guarantee",
    "limit",
    "id",
];

/// A Unix-milliseconds time as RFC 3339 (`-` when absent).
fn time(v: &Value) -> String {
    v.as_u64()
        .map(|ms| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
            )
            .to_string()
        })
        .unwrap_or_else(|| "-".into())
}

/// A definition list of `(term, HTML)`.
fn facts(items: &[(&str, String)]) -> String {
    let mut h = String::from("<dl class=\"facts\">");
    for (k, v) in items {
        h.push_str(&format!("<dt>{}</dt><dd>{v}</dd>", esc(k)));
    }
    h.push_str("</dl>");
    h
}

fn lookup_page(what: &str, key: &str, e: &views::Lookup) -> Response {
    let status = match e {
        views::Lookup::NotFound => StatusCode::NOT_FOUND,
        views::Lookup::Ambiguous(_) => StatusCode::CONFLICT,
    };
    error_page(status, &e.message(what, key))
}

/// The offers table of an agent's (`framework_id` side) or framework's page.
fn offer_table(offers: &[Value], names: &Names, by_framework: bool, view: &View) -> String {
    let rows = offers
        .iter()
        .map(|o| Row {
            attrs: format!("class=\"offer\" data-id=\"{}\"", text(&o["id"])),
            cells: vec![
                Cell::text(
                    o["id"]
                        .as_str()
                        .unwrap_or("-")
                        .chars()
                        .take(8)
                        .collect::<String>(),
                ),
                if by_framework {
                    names.framework(&o["framework_id"])
                } else {
                    names.agent(&o["agent_id"])
                },
                val(&o["role"]),
                res_cell(&o["resources"]),
            ],
            after: String::new(),
        })
        .collect();
    table::render(
        "offers",
        &[
            Col("id", "offer"),
            if by_framework {
                Col("framework", "framework")
            } else {
                Col("agent", "agent")
            },
            Col("role", "role"),
            Col("resources", "resources"),
        ],
        rows,
        view,
    )
}

/// A detail page's view, or the answer instead of the page: to the login form for a browser
/// that may not read, 400 for a view that is not understood.
fn detail_view(app: &App, caller: CallerExt, query: ViewQuery) -> Result<View, Box<Response>> {
    if app.may_read(&caller_of(caller)).is_err() {
        return Err(Box::new(see_other("/ui/login")));
    }
    view_of(query, DETAIL_COLUMNS).map_err(|e| Box::new(error_page(StatusCode::BAD_REQUEST, &e)))
}

/// `GET /ui/tasks/{id}`.
pub(super) async fn task(
    State(app): State<App>,
    caller: CallerExt,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: ViewQuery,
) -> Result<Response, ApiError> {
    let view = match detail_view(&app, caller, query) {
        Ok(v) => v,
        Err(answer) => return Ok(*answer),
    };
    let state = app.state().await?;
    let t = match views::lookup_task(&state, &id) {
        Ok(t) => t,
        Err(e) => return Ok(lookup_page("task", &id, &e)),
    };
    let mut page = views::task_page(&state, t);
    let task_id = t["id"].as_str().unwrap_or_default().to_string();
    page["history"] = Value::Array(super::super::api::task_history(&app, &task_id));
    let names = Names::new(&state);
    let csrf = logout_csrf(&app, &headers);
    Ok(html_page(
        &view,
        || {
            shell(
                &format!("task {}", page["name"].as_str().unwrap_or_default()),
                &header(&state, csrf.as_deref()),
                "",
                &render_task(&page, &names),
                &format!("/ui/tasks/{}?part=main", path_part(&task_id)),
                &task_logs(&task_id),
            )
        },
        || render_task(&page, &names),
    ))
}

/// The task page's `<main>`: what it is, where, its GPUs and its state history.
pub fn render_task(page: &Value, names: &Names) -> String {
    let st = page["state"].as_str().unwrap_or("-");
    let ports: Vec<String> = arr(&page["ports"]).iter().map(|p| p.to_string()).collect();
    let mut h = format!(
        "<section id=\"task\" data-id=\"{}\" data-state=\"{}\"><h2>Task <span class=\"name\">{}</span></h2>",
        text(&page["id"]),
        esc(st),
        text(&page["name"]),
    );
    h.push_str(&facts(&[
        ("id", text(&page["id"])),
        ("state", state_cell(st).html),
        ("reason", text(&page["reason"])),
        (
            "message",
            format!("<span class=\"message\">{}</span>", text(&page["message"])),
        ),
        ("exit code", text(&page["exit_code"])),
        ("signal", text(&page["signal"])),
        ("framework", names.framework(&page["framework_id"]).html),
        ("agent", names.agent(&page["agent_id"]).html),
        ("host", text(&page["agent_hostname"])),
        ("role", text(&page["role"])),
        ("user", text(&page["user"])),
        ("resources", res(&page["resources"])),
        (
            "ports",
            if ports.is_empty() {
                "-".into()
            } else {
                esc(&ports.join(" "))
            },
        ),
        ("staged", esc(&time(&page["staged_at_ms"]))),
        ("started", esc(&time(&page["started_at_ms"]))),
        ("ended", esc(&time(&page["ended_at_ms"]))),
    ]));
    h.push_str("</section>");
    let gpus = arr(&page["gpu_devices"]);
    if !gpus.is_empty() {
        h.push_str("<section id=\"gpus\"><h2>GPUs</h2>");
        h.push_str(&gpu_table(gpus));
        h.push_str("</section>");
    }
    h.push_str("<section id=\"history\"><h2>State history</h2><table><tr><th>at</th><th>state</th><th>reason</th><th>message</th></tr>");
    for e in arr(&page["history"]) {
        let st = e["state"].as_str().unwrap_or("-");
        h.push_str(&format!(
            "<tr class=\"transition\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&time(&e["at_ms"])),
            state_cell(st).html,
            text(&e["reason"]),
            text(&e["message"]),
        ));
    }
    if arr(&page["history"]).is_empty() {
        h.push_str("<tr><td colspan=\"4\" class=\"muted\">none kept</td></tr>");
    }
    h.push_str("</table></section>");
    h
}

/// The task's output, followed live by the page's script (outside `<main>`: refreshes keep it).
fn task_logs(task_id: &str) -> String {
    let id = path_part(task_id);
    let pre = |stream: &str| {
        format!(
            "<h3>{stream}</h3><pre class=\"log\" id=\"log-{stream}\" \
             data-follow=\"/api/v1/tasks/{id}/logs?follow=true&amp;stream={stream}\"></pre>"
        )
    };
    format!(
        "<div class=\"side\"><section id=\"logs\"><h2>Logs</h2>{}{}</section></div>",
        pre("stdout"),
        pre("stderr")
    )
}

/// `GET /ui/agents/{id}`.
pub(super) async fn agent(
    State(app): State<App>,
    caller: CallerExt,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: ViewQuery,
) -> Result<Response, ApiError> {
    let view = match detail_view(&app, caller, query) {
        Ok(v) => v,
        Err(answer) => return Ok(*answer),
    };
    let state = app.state().await?;
    let Some(a) = views::find_agent(&state, &id) else {
        return Ok(lookup_page("agent", &id, &views::Lookup::NotFound));
    };
    let page = views::agent_page(&state, a);
    let names = Names::new(&state);
    let csrf = logout_csrf(&app, &headers);
    let agent_id = page["id"].as_str().unwrap_or_default();
    Ok(html_page(
        &view,
        || {
            shell(
                &format!("agent {}", page["name"].as_str().unwrap_or_default()),
                &header(&state, csrf.as_deref()),
                &filter_box(&view),
                &render_agent(&page, &names, &view),
                &format!("/ui/agents/{}?part=main", path_part(agent_id)),
                "",
            )
        },
        || render_agent(&page, &names, &view),
    ))
}

/// The agent page's `<main>`.
pub fn render_agent(page: &Value, names: &Names, view: &View) -> String {
    let status = agent_status(page);
    let reserved = page["reserved"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(role, r)| format!("{}: {}", esc(role), res(r)))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "-".into());
    let attributes = page["attributes"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{}={}", esc(k), text(v)))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "-".into());
    let mut h = format!(
        "<section id=\"agent\" data-name=\"{}\"><h2>Agent <span class=\"name\">{}</span></h2>",
        text(&page["name"]),
        text(&page["name"]),
    );
    h.push_str(&facts(&[
        ("id", text(&page["id"])),
        ("host", text(&page["hostname"])),
        (
            "status",
            format!(
                "<span class=\"{}\">{status}</span>",
                if status == "connected" { "ok" } else { "bad" }
            ),
        ),
        (
            "drain",
            format!("<span class=\"drain\">{}</span>", esc(&drain_state(page))),
        ),
        ("total", res(&page["total"])),
        ("used", res(&page["used"])),
        ("offered", res(&page["offered"])),
        ("reserved", reserved),
        ("attributes", attributes),
        ("task user", text(&page["task_user"])),
    ]));
    h.push_str("</section>");
    let gpus = arr(&page["gpus"]);
    if !gpus.is_empty() {
        h.push_str("<section id=\"gpus\"><h2>GPUs</h2>");
        h.push_str(&gpu_table(gpus));
        h.push_str("</section>");
    }
    let tasks = task_rows(
        arr(&page["tasks"])
            .iter()
            .chain(arr(&page["completed_tasks"]).iter()),
        names,
    );
    h.push_str("<section id=\"tasks\"><h2>Tasks</h2>");
    h.push_str(&task_table("tasks", tasks, view));
    h.push_str("</section><section id=\"offers\"><h2>Offers outstanding</h2>");
    h.push_str(&offer_table(arr(&page["offers"]), names, true, view));
    h.push_str("</section>");
    h
}

/// `GET /ui/frameworks/{id}`.
pub(super) async fn framework(
    State(app): State<App>,
    caller: CallerExt,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: ViewQuery,
) -> Result<Response, ApiError> {
    let view = match detail_view(&app, caller, query) {
        Ok(v) => v,
        Err(answer) => return Ok(*answer),
    };
    let state = app.state().await?;
    let f = match views::lookup_framework(&state, &id) {
        Ok(f) => f,
        Err(e) => return Ok(lookup_page("framework", &id, &e)),
    };
    let page = views::framework_page(&state, f);
    let names = Names::new(&state);
    let csrf = logout_csrf(&app, &headers);
    let fw_id = page["id"].as_str().unwrap_or_default();
    Ok(html_page(
        &view,
        || {
            shell(
                &format!("framework {}", page["name"].as_str().unwrap_or_default()),
                &header(&state, csrf.as_deref()),
                &filter_box(&view),
                &render_framework(&page, &names, &view),
                &format!("/ui/frameworks/{}?part=main", path_part(fw_id)),
                "",
            )
        },
        || render_framework(&page, &names, &view),
    ))
}

/// The framework page's `<main>`.
pub fn render_framework(page: &Value, names: &Names, view: &View) -> String {
    let roles: Vec<&str> = arr(&page["roles"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let status = if page["completed"] == true {
        "<span class=\"bad\">removed</span>".to_string()
    } else if page["connected"] == true {
        "<span class=\"ok\">connected</span>".to_string()
    } else {
        "<span class=\"bad\">disconnected</span>".to_string()
    };
    let mut h = format!(
        "<section id=\"framework\" data-id=\"{}\"><h2>Framework <span class=\"name\">{}</span></h2>",
        text(&page["id"]),
        text(&page["name"]),
    );
    h.push_str(&facts(&[
        ("id", text(&page["id"])),
        ("principal", text(&page["principal"])),
        ("status", status),
        ("roles", esc(&roles.join(", "))),
        (
            "dominant share",
            share_bar(page["dominant_share"].as_f64().unwrap_or(0.0)),
        ),
        ("active tasks", text(&page["active_tasks"])),
        ("used", res(&page["used"])),
        ("allocated", res(&page["allocated"])),
    ]));
    h.push_str("</section>");
    h.push_str("<section id=\"roles\"><h2>Roles</h2>");
    h.push_str(&roles_table(arr(&page["role_details"]), view));
    let tasks = task_rows(
        arr(&page["tasks"])
            .iter()
            .chain(arr(&page["completed_tasks"]).iter()),
        names,
    );
    h.push_str("</section><section id=\"tasks\"><h2>Tasks</h2>");
    h.push_str(&task_table("tasks", tasks, view));
    h.push_str("</section><section id=\"offers\"><h2>Offers held</h2>");
    h.push_str(&offer_table(arr(&page["offers"]), names, false, view));
    h.push_str("</section>");
    h
}

/// `?by=&since=&until=` of the usage view (passed to `/api/v1/usage` as they are).
#[derive(serde::Deserialize)]
pub(super) struct UsageForm {
    by: Option<String>,
    since: Option<String>,
    until: Option<String>,
}

/// `GET /ui/usage`: the usage API's report as a table.
pub(super) async fn usage(
    State(app): State<App>,
    caller: CallerExt,
    headers: HeaderMap,
    uri: axum::http::Uri,
    query: Result<Query<UsageForm>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    if app.may_read(&caller_of(caller.clone())).is_err() {
        return Ok(see_other("/ui/login"));
    }
    let form = match query {
        Ok(Query(f)) => f,
        Err(e) => return Ok(error_page(StatusCode::BAD_REQUEST, &e.body_text())),
    };
    // The API's own query: empty fields are left out (its defaults).
    let api_query = {
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("by", &form.by),
            ("since", &form.since),
            ("until", &form.until),
        ] {
            if let Some(v) = v.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
                q.append_pair(k, v);
            }
        }
        q.finish()
    };
    let api_uri: axum::http::Uri = format!("/api/v1/usage?{api_query}")
        .parse()
        .unwrap_or_else(|_| uri.clone());
    let report = match super::super::api::usage_report(&app, caller, &api_uri).await {
        Ok(r) => r,
        Err(e) if e.status == StatusCode::BAD_REQUEST => {
            return Ok(error_page(
                StatusCode::BAD_REQUEST,
                "the usage window or grouping is not understood: since/until take Unix \
                 milliseconds, an RFC 3339 time or a duration back from now (30d); by takes \
                 role, framework or user",
            ))
        }
        Err(e) => return Err(e),
    };
    let state = app.state().await?;
    let csrf = logout_csrf(&app, &headers);
    let main = render_usage(
        &report,
        form.since.as_deref().unwrap_or("30d"),
        form.until.as_deref().unwrap_or_default(),
    );
    Ok(Html(shell(
        "usage",
        &header(&state, csrf.as_deref()),
        "",
        &main,
        "",
        "",
    ))
    .into_response())
}

/// A number with `digits` decimals (`-` when absent).
fn num(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| text(v))
}

/// The usage view: the window form, the rows (with `cost` when the report carries it) and the
/// total, and the resources held in offers when the report carries them.
pub fn render_usage(report: &Value, since: &str, until: &str) -> String {
    let by = report["by"].as_str().unwrap_or("role");
    let option = |v: &str| {
        format!(
            "<option value=\"{v}\"{}>{v}</option>",
            if v == by { " selected" } else { "" }
        )
    };
    let mut h = format!(
        "<section id=\"usage\"><h2>Usage</h2><form class=\"usage\" method=\"get\" action=\"/ui/usage\">\
         <label>by <select name=\"by\">{}{}{}</select></label> \
         <label>since <input name=\"since\" value=\"{}\" size=\"10\"></label> \
         <label>until <input name=\"until\" value=\"{}\" size=\"10\" placeholder=\"now\"></label> \
         <button type=\"submit\">show</button></form>\
         <p class=\"muted\">{} to {}: resources held by tasks (offers held are apart).</p>",
        option("role"),
        option("framework"),
        option("user"),
        esc(since),
        esc(until),
        esc(&time(&report["since_ms"])),
        esc(&time(&report["until_ms"])),
    );
    let rows = arr(&report["rows"]);
    let has_cost = rows
        .iter()
        .chain(std::iter::once(&report["total"]))
        .any(|r| !r["cost"].is_null());
    h.push_str(&format!(
        "<table id=\"t-usage\"><tr><th>{}</th><th>tasks</th><th>CPU-hours</th><th>memory GiB-hours</th><th>GPU-hours</th>{}</tr>",
        esc(by),
        if has_cost { "<th>cost</th>" } else { "" }
    ));
    let line = |r: &Value, class: &str| {
        format!(
            "<tr class=\"{class}\" data-key=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}</tr>",
            text(&r["key"]),
            text(&r["key"]),
            text(&r["tasks"]),
            num(&r["cpu_hours"], 3),
            num(&r["mem_gib_hours"], 3),
            num(&r["gpu_hours"], 3),
            if has_cost {
                format!("<td class=\"cost\">{}</td>", num(&r["cost"], 2))
            } else {
                String::new()
            }
        )
    };
    for r in rows {
        h.push_str(&line(r, "usage-row"));
    }
    if rows.is_empty() {
        h.push_str("<tr><td colspan=\"6\" class=\"muted\">no task ran in this window</td></tr>");
    }
    h.push_str(&line(&report["total"], "usage-total"));
    h.push_str("</table>");
    // Held in offers (apart from use), in whatever shape the report gives.
    match &report["held_offers"] {
        Value::Null => {}
        held => {
            h.push_str("<h3>Held in offers</h3>");
            h.push_str(&generic(held));
        }
    }
    h.push_str("</section>");
    h
}

/// Any JSON as HTML: objects as definition lists, arrays of objects as tables, escaped.
fn generic(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let items: Vec<(&str, String)> =
                m.iter().map(|(k, v)| (k.as_str(), generic(v))).collect();
            facts(&items)
        }
        Value::Array(a) if a.iter().all(Value::is_object) && !a.is_empty() => {
            let mut keys: Vec<&str> = Vec::new();
            for o in a.iter().filter_map(Value::as_object) {
                for k in o.keys() {
                    if !keys.contains(&k.as_str()) {
                        keys.push(k);
                    }
                }
            }
            let mut h = String::from("<table class=\"held\"><tr>");
            for k in &keys {
                h.push_str(&format!("<th>{}</th>", esc(k)));
            }
            h.push_str("</tr>");
            for o in a {
                h.push_str("<tr>");
                for k in &keys {
                    h.push_str(&format!("<td>{}</td>", generic(&o[*k])));
                }
                h.push_str("</tr>");
            }
            h.push_str("</table>");
            h
        }
        Value::Number(n) => match n.as_f64() {
            Some(x) if n.is_f64() => format!("{x:.3}"),
            _ => esc(&n.to_string()),
        },
        other => text(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state() -> Value {
        json!({
            "leader": true, "epoch": 1,
            "agents": [{"id": "a1", "name": "gpu-<1>", "connected": true, "active": true,
                        "hostname": "h1", "total": {"gpus": 1.0}, "used": {}, "offered": {},
                        "reserved": {}, "attributes": {"zone": "<z>"}, "drain": "DRAINING",
                        "gpus": [{"uuid": "GPU-1", "name": "A100", "memory_mib": 40960, "healthy": true}],
                        "gpu_samples": [{"uuid": "GPU-1", "util_percent": 55}]}],
            "frameworks": [{"id": "f1", "name": "batch\"x", "principal": "p", "roles": ["ml"],
                            "connected": true, "dominant_share": 0.5, "active_tasks": 1}],
            "tasks": [{"id": "t1", "name": "<script>alert(1)</script>", "state": "RUNNING",
                       "framework_id": "f1", "agent_id": "a1", "role": "ml", "gpus": ["GPU-1"],
                       "resources": {"gpus": 1.0}, "message": "m&m", "ports": [],
                       "staged_at_ms": 0}],
            "completed_tasks": [], "completed_frameworks": [], "offers": [
                {"id": "o1", "framework_id": "f1", "agent_id": "a1", "role": "ml",
                 "resources": {"cpus": 1.0}}],
            "allocator": {"roles": {}}
        })
    }

    #[test]
    fn the_task_page_escapes_links_and_shows_its_history() {
        let s = state();
        let names = Names::new(&s);
        let mut page = views::task_page(&s, &s["tasks"][0]);
        page["history"] = json!([{"at_ms": 1000, "state": "RUNNING", "reason": null,
                                  "message": "<i>started</i>"}]);
        let html = render_task(&page, &names);
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(
            html.contains("<a href=\"/ui/frameworks/f1\">batch&quot;x</a>"),
            "{html}"
        );
        assert!(
            html.contains("<a href=\"/ui/agents/a1\">gpu-&lt;1&gt;</a>"),
            "{html}"
        );
        assert!(html.contains("1970-01-01T00:00:01Z"), "{html}");
        assert!(html.contains("&lt;i&gt;started&lt;/i&gt;"));
        assert!(html.contains("data-uuid=\"GPU-1\""), "its GPU: {html}");
        let logs = task_logs("t 1");
        assert!(
            logs.contains("data-follow=\"/api/v1/tasks/t%201/logs?follow=true&amp;stream=stdout\"")
        );
    }

    #[test]
    fn agent_and_framework_pages_list_tasks_gpus_and_offers() {
        let s = state();
        let names = Names::new(&s);
        let a = views::agent_page(&s, &s["agents"][0]);
        let html = render_agent(&a, &names, &View::default());
        assert!(
            html.contains("<span class=\"drain\">DRAINING</span>"),
            "{html}"
        );
        assert!(html.contains("55%"));
        assert!(html.contains("zone=&lt;z&gt;"));
        assert!(html.contains("href=\"/ui/tasks/t1\""));
        assert!(html.contains("class=\"offer\" data-id=\"o1\""));
        let f = views::framework_page(&s, &s["frameworks"][0]);
        let html = render_framework(&f, &names, &View::default());
        assert!(html.contains("href=\"/ui/tasks/t1\""));
        assert!(html.contains("<a href=\"/ui/agents/a1\">gpu-&lt;1&gt;</a>"));
        assert!(!html.contains("<script>"));
    }

    #[test]
    fn the_usage_view_shows_cost_and_held_offers_when_the_report_has_them() {
        let plain = json!({"by": "role", "since_ms": 0, "until_ms": 1,
            "rows": [{"key": "<ml>", "tasks": 2, "cpu_hours": 1.5, "mem_gib_hours": 0.25, "gpu_hours": 3.0}],
            "total": {"key": "total", "tasks": 2, "cpu_hours": 1.5, "mem_gib_hours": 0.25, "gpu_hours": 3.0}});
        let html = render_usage(&plain, "7d", "");
        assert!(html.contains("data-key=\"&lt;ml&gt;\""), "{html}");
        assert!(html.contains("<td>3.000</td>"));
        assert!(!html.contains("cost"));
        let mut priced = plain.clone();
        priced["rows"][0]["cost"] = json!(12.5);
        priced["total"]["cost"] = json!(12.5);
        priced["held_offers"] = json!([{"key": "ml", "gpu_hours": 0.5}]);
        let html = render_usage(&priced, "7d", "");
        assert!(html.contains("<th>cost</th>"));
        assert!(html.contains("<td class=\"cost\">12.50</td>"));
        assert!(html.contains("Held in offers"));
        assert!(html.contains("<td>0.500</td>"), "{html}");
    }
}
