//! The web dashboard at `/ui`: server-rendered HTML (no JavaScript build toolchain) with a
//! small vendored script (`app.js`, `include_str!`) that follows the event stream and
//! re-renders, and a chart of the roles' dominant shares over time. Module map: `pages` (the
//! pages of one task, agent or framework, and the usage view), `table` (tables filtered by
//! `?q=` and sorted by `?sort=&dir=` on the server; app.js does the same in the page),
//! `login` (the token login form, sessions' cookies, logout).
//!
//! ```text
//! GET  /ui            the page (overview, roles + share chart, frameworks, agents with
//!                     per-GPU utilization/health/drain state, tasks); 303 to /ui/login when
//!                     the browser is not authenticated
//! GET  /ui/fragment   the tables alone (what app.js swaps in on each event)
//! GET  /ui/tasks/{id}, /ui/agents/{id}, /ui/frameworks/{id}, /ui/usage
//!                     a page per task (with its logs followed live), agent and framework,
//!                     and the usage view (`pages`)
//! GET  /ui/login      the login form (sets the `gantry_csrf` cookie its hidden `csrf` field
//!                     repeats); `?token=` is refused 400 (a token in a URL ends up in
//!                     history and logs)
//! POST /ui/login      form fields `token` and `csrf`: starts a session (`security::sessions`)
//!                     and sets the `gantry_session` cookie; failures count against the address's
//!                     failed-authentication limit (429 with Retry-After past it)
//! POST /ui/logout     form field `csrf` (the session's): ends the session on the master
//! GET  /ui/app.js, /ui/style.css
//! ```
//!
//! Authentication is the operator API's: an operator certificate in the browser, or a session
//! started with a token from `--operator-tokens`. The session cookie (HttpOnly, Secure,
//! SameSite=Strict) is a random id, never the token, and authenticates reads only. The
//! dashboard only reads. Every `/ui` response carries `X-Frame-Options: DENY`, a
//! Content-Security-Policy (scripts and connections to this origin only, no framing),
//! `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer` and
//! `Cache-Control: no-store`.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde_json::Value;
use subtle::ConstantTimeEq;

use std::collections::HashMap;

use super::api::views;
use super::http::{caller_of, cookie_in, ApiError, App, Caller, ConnInfo, SESSION_COOKIE};
use table::{Cell, Col, Row, View};

mod login;
mod pages;
mod table;

use login::*;

const APP_JS: &str = include_str!("app.js");
const STYLE_CSS: &str = include_str!("style.css");
/// The login form's CSRF cookie (double submit: the form repeats it in its `csrf` field).
const CSRF_COOKIE: &str = "gantry_csrf";
/// How long a login form may be used.
const CSRF_SECONDS: u64 = 3600;
/// The dashboard's Content-Security-Policy: its own script and stylesheet only (inline style
/// attributes draw the bars), the event stream and fetches to this origin, forms posting here,
/// never framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   img-src 'self' data:; connect-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";
/// Completed tasks shown (newest first).
const COMPLETED_SHOWN: usize = 20;

type CallerExt = Option<axum::Extension<Caller>>;

/// The `/ui` routes (merged into the operator API's router).
pub(super) fn routes() -> super::routes::Routes<App> {
    super::routes::Routes::new()
        .get("/ui", page)
        .get("/ui/", page)
        .get("/ui/fragment", fragment)
        .get("/ui/agents/{id}", pages::agent)
        .get("/ui/tasks/{id}", pages::task)
        .get("/ui/frameworks/{id}", pages::framework)
        .get("/ui/usage", pages::usage)
        .get("/ui/login", login_page)
        .post("/ui/login", login_form)
        .post("/ui/logout", logout)
        .get("/ui/app.js", || async {
            asset("text/javascript; charset=utf-8", APP_JS)
        })
        .get("/ui/style.css", || async {
            asset("text/css; charset=utf-8", STYLE_CSS)
        })
        .map(|r| r.layer(axum::middleware::map_response(security_headers)))
}

/// The headers every `/ui` response carries (see the module docs).
async fn security_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn see_other(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}

async fn page(
    State(app): State<App>,
    caller: CallerExt,
    headers: HeaderMap,
    query: Result<Query<View>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    if app.may_read(&caller_of(caller)).is_err() {
        return Ok(see_other("/ui/login"));
    }
    let view = match view_of(query, OVERVIEW_COLUMNS) {
        Ok(v) => v,
        Err(e) => return Ok(error_page(StatusCode::BAD_REQUEST, &e)),
    };
    let csrf = logout_csrf(&app, &headers);
    let state = app.state().await?;
    Ok(html_page(
        &view,
        || render_page(&state, csrf.as_deref(), &view),
        || render_main(&state, &view),
    ))
}

async fn fragment(
    State(app): State<App>,
    caller: CallerExt,
    query: Result<Query<View>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    app.may_read(&caller_of(caller))?;
    let view = match view_of(query, OVERVIEW_COLUMNS) {
        Ok(v) => v,
        Err(e) => return Ok(error_page(StatusCode::BAD_REQUEST, &e)),
    };
    let state = app.state().await?;
    Ok(Html(render_main(&state, &view)).into_response())
}

/// HTML-escapes text for element content and quoted attributes.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => esc(s),
        Value::Null => "-".into(),
        other => esc(&other.to_string()),
    }
}

/// `cpus:2;mem:1024` from a resources object.
fn res(v: &Value) -> String {
    match v.as_object() {
        Some(m) if !m.is_empty() => esc(&m
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(";")),
        _ => "-".into(),
    }
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn share_bar(share: f64) -> String {
    let w = (share.clamp(0.0, 1.0) * 120.0).round();
    format!("<span class=\"bar\" style=\"width:{w}px\"></span> {share:.3}")
}

/// The header: the name, links to the overview and the usage view, the master's epoch and
/// leadership, the logout form of a session, whether the event stream is live.
fn header(state: &Value, logout_csrf: Option<&str>) -> String {
    let logout = logout_csrf
        .map(|c| {
            format!(
                "<form class=\"logout\" method=\"post\" action=\"/ui/logout\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <button type=\"submit\">log out</button></form>",
                esc(c)
            )
        })
        .unwrap_or_default();
    format!(
        "<header><h1><a href=\"/ui\">Gantry</a></h1><nav><a href=\"/ui\">overview</a> \
         <a href=\"/ui/usage\">usage</a></nav><span>epoch {epoch}</span><span>{leader}</span>\
         {logout}<span id=\"live\" class=\"live\">connecting</span></header>",
        epoch = text(&state["epoch"]),
        leader = if state["leader"] == true {
            "leader"
        } else {
            "not leading"
        },
    )
}

/// A whole page: the header, `before`, `<main>` (which the page's script re-renders from
/// `fragment` plus the page's query on each event), `after`, the event panel and the script.
pub(crate) fn shell(
    title: &str,
    header: &str,
    before: &str,
    main: &str,
    fragment: &str,
    after: &str,
) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title} · Gantry</title>\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <link rel=\"stylesheet\" href=\"/ui/style.css\"></head><body data-live=\"connecting\">\
         {header}{before}<main id=\"main\" data-fragment=\"{fragment}\">{main}</main>{after}\
         <div class=\"side\"><section><h2>Events</h2><ul id=\"events\"></ul></section></div>\
         <script src=\"/ui/app.js\"></script></body></html>",
        title = esc(title),
        fragment = esc(fragment),
    )
}

/// The filter box of a page's tables (a GET form: it works without script; the script
/// filters as you type).
pub(crate) fn filter_box(view: &View) -> String {
    format!(
        "<form class=\"filter\" method=\"get\"><input type=\"search\" id=\"filter\" name=\"q\" \
         value=\"{}\" placeholder=\"filter rows\" autocomplete=\"off\">{}</form>",
        esc(view.q.as_deref().unwrap_or_default()),
        view.sort
            .as_deref()
            .map(|s| format!(
                "<input type=\"hidden\" name=\"sort\" value=\"{}\">\
                 <input type=\"hidden\" name=\"dir\" value=\"{}\">",
                esc(s),
                esc(view.dir.as_deref().unwrap_or("asc"))
            ))
            .unwrap_or_default()
    )
}

/// The whole overview page: header, the share chart and event log (kept across refreshes),
/// the filter box, and the tables in `<main id="main">`.
pub fn render_page(state: &Value, logout_csrf: Option<&str>, view: &View) -> String {
    let before = format!(
        "<div class=\"side\"><section><h2>Dominant shares over time</h2>\
         <svg id=\"shares\" role=\"img\" aria-label=\"role dominant shares over time\"></svg></section>\
         {}</div>",
        filter_box(view)
    );
    shell(
        "overview",
        &header(state, logout_csrf),
        &before,
        &render_main(state, view),
        "/ui/fragment",
        "",
    )
}

/// The roles table (the overview's, and a framework page's roles): share, weight, allocation
/// and quota of each.
pub(crate) fn roles_table(roles: &[Value], view: &View) -> String {
    let rows: Vec<Row> = roles
        .iter()
        .map(|r| Row {
            attrs: format!("class=\"role\" data-name=\"{}\"", text(&r["name"])),
            cells: vec![
                val(&r["name"]),
                share_cell(r["dominant_share"].as_f64().unwrap_or(0.0)),
                val(&r["weight"]),
                res_cell(&r["allocated"]),
                res_cell(&r["quota"]["guarantee"]),
                res_cell(&r["quota"]["limit"]),
            ],
            after: String::new(),
        })
        .collect();
    table::render(
        "roles",
        &[
            Col("name", "role"),
            Col("share", "dominant share (÷ weight)"),
            Col("weight", "weight"),
            Col("allocated", "allocated"),
            Col("guarantee", "quota guarantee"),
            Col("limit", "quota limit"),
        ],
        rows,
        view,
    )
}

/// A page's answer: the whole page, or its `<main>` alone with `?part=main`.
pub(crate) fn html_page(
    view: &View,
    whole: impl FnOnce() -> String,
    main: impl FnOnce() -> String,
) -> Response {
    if view.part.as_deref() == Some("main") {
        Html(main()).into_response()
    } else {
        Html(whole()).into_response()
    }
}

/// A plain HTML error page (`message` escaped).
pub(crate) fn error_page(status: StatusCode, message: &str) -> Response {
    (
        status,
        Html(format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>Gantry</title>\
             <link rel=\"stylesheet\" href=\"/ui/style.css\"></head><body>\
             <header><h1><a href=\"/ui\">Gantry</a></h1></header><main><section>\
             <p class=\"bad\">{}</p><p><a href=\"/ui\">back to the overview</a></p></section></main></body></html>",
            esc(message)
        )),
    )
        .into_response()
}

/// The page's query, or what is wrong with it (a 400 page, [`error_page`]).
pub(crate) fn view_of(
    query: Result<Query<View>, axum::extract::rejection::QueryRejection>,
    columns: &[&str],
) -> Result<View, String> {
    let Query(view) = query.map_err(|e| e.body_text())?;
    view.check(columns)?;
    match view.part.as_deref() {
        None | Some("main") => Ok(view),
        Some(p) => Err(format!("part={p:?}: main, or none for the whole page")),
    }
}

/// The logout form's CSRF token of the browser's session (a certificate has none).
pub(crate) fn logout_csrf(app: &App, headers: &HeaderMap) -> Option<String> {
    cookie_in(headers, SESSION_COOKIE).and_then(|id| app.sessions.csrf(&id, Instant::now()))
}

/// Column keys of the overview's tables (what `?sort=` may name).
const OVERVIEW_COLUMNS: &[&str] = &[
    "name",
    "share",
    "weight",
    "allocated",
    "guarantee",
    "limit",
    "id",
    "principal",
    "roles",
    "tasks",
    "connected",
    "host",
    "status",
    "drain",
    "total",
    "used",
    "offered",
    "state",
    "reason",
    "framework",
    "agent",
    "role",
    "resources",
    "gpus",
    "ports",
    "message",
];

/// The names of agents and frameworks by id (tables show names, link by id).
pub(crate) struct Names<'a> {
    agents: HashMap<&'a str, &'a str>,
    frameworks: HashMap<&'a str, &'a str>,
}

impl<'a> Names<'a> {
    pub(crate) fn new(state: &'a Value) -> Self {
        let names = |lists: &[&'a Value]| {
            lists
                .iter()
                .flat_map(|l| arr(l))
                .filter_map(|x| Some((x["id"].as_str()?, x["name"].as_str()?)))
                .collect::<HashMap<_, _>>()
        };
        Names {
            agents: names(&[&state["unreachable_agents"], &state["agents"]]),
            frameworks: names(&[&state["completed_frameworks"], &state["frameworks"]]),
        }
    }

    /// A link to the agent's page reading its name (its id's start when unknown).
    pub(crate) fn agent(&self, id: &Value) -> Cell {
        match id.as_str() {
            Some(id) => {
                let name = self.agents.get(id).copied().unwrap_or(id);
                Cell::link(&format!("/ui/agents/{}", path_part(id)), name)
            }
            None => Cell::text("-"),
        }
    }

    /// A link to the framework's page reading its name.
    pub(crate) fn framework(&self, id: &Value) -> Cell {
        match id.as_str() {
            Some(id) => {
                let name = self.frameworks.get(id).copied().unwrap_or(id);
                Cell::link(&format!("/ui/frameworks/{}", path_part(id)), name)
            }
            None => Cell::text("-"),
        }
    }
}

/// `s` percent-encoded for one path segment.
pub(crate) fn path_part(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// A link to a task's page reading its name.
pub(crate) fn task_link(t: &Value) -> Cell {
    let name = t["name"].as_str().unwrap_or("-");
    match t["id"].as_str() {
        Some(id) => Cell::link(&format!("/ui/tasks/{}", path_part(id)), name),
        None => Cell::text(name),
    }
}

/// A task's state, coloured.
pub(crate) fn state_cell(st: &str) -> Cell {
    Cell::html(format!("<span class=\"state-{0}\">{0}</span>", esc(st)), st)
}

/// A value's text (`-` for null) as a cell.
pub(crate) fn val(v: &Value) -> Cell {
    Cell::text(match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    })
}

/// Resources (`cpus:2;mem:1024`) as a cell.
pub(crate) fn res_cell(v: &Value) -> Cell {
    match v.as_object() {
        Some(m) if !m.is_empty() => Cell::text(
            m.iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect::<Vec<_>>()
                .join(";"),
        ),
        _ => Cell::text("-"),
    }
}

pub(crate) fn share_cell(share: f64) -> Cell {
    Cell::html(share_bar(share), format!("{share:.3}"))
}

/// The GPU table of an agent (`views::agent`'s `gpus`), with links to the tasks holding them.
pub(crate) fn gpu_table(gpus: &[Value]) -> String {
    let mut h = String::from("<table><tr><th>GPU</th><th>model</th><th>memory</th><th>util</th><th>memory used</th><th>temp</th><th>power</th><th>health</th><th>task</th></tr>");
    for g in gpus {
        let smp = &g["sample"];
        let util = smp["util_percent"]
            .as_u64()
            .map(|u| format!("<span class=\"bar\" style=\"width:{u}px\"></span> {u}%"))
            .unwrap_or_else(|| "-".into());
        let mem_used = smp["mem_used_bytes"]
            .as_u64()
            .map(|b| format!("{} MiB", b >> 20))
            .unwrap_or_else(|| "-".into());
        let tasks: Vec<String> = arr(&g["tasks"]).iter().map(|t| task_link(t).html).collect();
        h.push_str(&format!(
            "<tr class=\"gpu\" data-uuid=\"{}\" data-healthy=\"{}\"><td class=\"uuid\">{}</td><td>{}</td><td>{} MiB</td><td class=\"util\">{util}</td><td>{mem_used}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"gpu-task\">{}</td></tr>",
            text(&g["uuid"]),
            g["healthy"] == true,
            text(&g["uuid"]),
            text(&g["name"]),
            text(&g["memory_mib"]),
            smp["temperature_c"].as_u64().map(|t| format!("{t} °C")).unwrap_or_else(|| "-".into()),
            smp["power_mw"].as_u64().map(|p| format!("{:.0} W", p as f64 / 1000.0)).unwrap_or_else(|| "-".into()),
            if g["healthy"] == true { "<span class=\"ok\">healthy</span>" } else { "<span class=\"bad\">unhealthy</span>" },
            if tasks.is_empty() { "-".into() } else { tasks.join(", ") },
        ));
    }
    h.push_str("</table>");
    h
}

/// An agent's status: connected, deactivated or disconnected.
pub(crate) fn agent_status(a: &Value) -> &'static str {
    match (a["connected"] == true, a["active"] != false) {
        (true, true) => "connected",
        (true, false) => "deactivated",
        (false, _) => "disconnected",
    }
}

/// An agent's drain state (`-` when not draining).
pub(crate) fn drain_state(a: &Value) -> String {
    match &a["drain"] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        Value::Object(d) => d
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string(),
        other => other.to_string(),
    }
}

const TASK_COLUMNS: [Col; 10] = [
    Col("name", "task"),
    Col("state", "state"),
    Col("reason", "reason"),
    Col("framework", "framework"),
    Col("agent", "agent"),
    Col("role", "role"),
    Col("resources", "resources"),
    Col("gpus", "GPUs"),
    Col("ports", "ports"),
    Col("message", "message"),
];

/// The rows of a task table (the overview's, an agent's, a framework's).
pub(crate) fn task_rows<'a>(tasks: impl Iterator<Item = &'a Value>, names: &Names) -> Vec<Row> {
    tasks
        .map(|t| {
            let st = t["state"].as_str().unwrap_or("-");
            // GPU UUIDs share their prefix: show their ends.
            let gpus: Vec<String> = arr(&t["gpus"])
                .iter()
                .filter_map(Value::as_str)
                .map(|u| u[u.len().saturating_sub(8)..].to_string())
                .collect();
            let ports: Vec<String> = arr(&t["ports"]).iter().map(|p| p.to_string()).collect();
            Row {
                attrs: format!(
                    "class=\"task\" data-id=\"{}\" data-state=\"{}\"",
                    text(&t["id"]),
                    esc(st)
                ),
                cells: vec![
                    task_link(t),
                    state_cell(st),
                    val(&t["reason"]),
                    names.framework(&t["framework_id"]),
                    names.agent(&t["agent_id"]),
                    val(&t["role"]),
                    res_cell(&t["resources"]),
                    Cell::text(if gpus.is_empty() {
                        "-".into()
                    } else {
                        gpus.join(" ")
                    }),
                    Cell::text(if ports.is_empty() {
                        "-".into()
                    } else {
                        ports.join(" ")
                    }),
                    Cell::text(t["message"].as_str().unwrap_or_default()),
                ],
                after: String::new(),
            }
        })
        .collect()
}

/// A task table of `tasks` as `view` asks.
pub(crate) fn task_table(id: &str, tasks: Vec<Row>, view: &View) -> String {
    table::render(id, &TASK_COLUMNS, tasks, view)
}

/// The tables: overview, roles, frameworks, agents with their GPUs, tasks; filtered and sorted
/// as `view` asks.
pub fn render_main(state: &Value, view: &View) -> String {
    let mut h = String::new();
    let s = views::summary(state);
    let names = Names::new(state);
    let by_state = s["tasks"]["by_state"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{}&nbsp;{}", esc(k), text(v)))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    h.push_str(&format!(
        "<section id=\"overview\"><h2>Overview</h2><div class=\"cards\">\
         <div class=\"card\">agents<b id=\"agents-connected\">{}/{}</b>connected</div>\
         <div class=\"card\">GPUs<b id=\"gpus-total\">{}</b><span class=\"{}\">{} unhealthy</span></div>\
         <div class=\"card\">frameworks<b>{}</b>{} connected</div>\
         <div class=\"card\">tasks<b id=\"tasks-active\">{}</b>{}</div>\
         <div class=\"card\">offers<b>{}</b>outstanding</div></div>\
         <p class=\"muted\">resources used {} of {}</p></section>",
        text(&s["agents"]["connected"]),
        text(&s["agents"]["total"]),
        text(&s["gpus"]["total"]),
        if s["gpus"]["unhealthy"] == 0 { "muted" } else { "bad" },
        text(&s["gpus"]["unhealthy"]),
        text(&s["frameworks"]["active"]),
        text(&s["frameworks"]["connected"]),
        text(&s["tasks"]["active"]),
        if by_state.is_empty() { "none".into() } else { by_state },
        text(&s["offers"]["outstanding"]),
        res(&s["resources"]["used"]),
        res(&s["resources"]["total"]),
    ));

    h.push_str("<section id=\"roles\"><h2>Roles</h2>");
    h.push_str(&roles_table(arr(&s["roles"]), view));
    h.push_str("</section>");

    let frameworks: Vec<Row> = arr(&state["frameworks"])
        .iter()
        .map(|f| {
            let roles: Vec<&str> = arr(&f["roles"]).iter().filter_map(Value::as_str).collect();
            let connected = f["connected"] == true;
            Row {
                attrs: format!("class=\"framework\" data-id=\"{}\"", text(&f["id"])),
                cells: vec![
                    names.framework(&f["id"]),
                    Cell::text(
                        f["id"]
                            .as_str()
                            .unwrap_or("-")
                            .chars()
                            .take(8)
                            .collect::<String>(),
                    ),
                    val(&f["principal"]),
                    Cell::text(roles.join(", ")),
                    share_cell(f["dominant_share"].as_f64().unwrap_or(0.0)),
                    val(&f["active_tasks"]),
                    res_cell(&f["allocated"]),
                    if connected {
                        Cell::html("<span class=\"ok\">yes</span>", "yes")
                    } else {
                        Cell::html("<span class=\"bad\">no</span>", "no")
                    },
                ],
                after: String::new(),
            }
        })
        .collect();
    h.push_str("<section id=\"frameworks\"><h2>Frameworks</h2>");
    h.push_str(&table::render(
        "frameworks",
        &[
            Col("name", "name"),
            Col("id", "id"),
            Col("principal", "principal"),
            Col("roles", "roles"),
            Col("share", "dominant share"),
            Col("tasks", "active tasks"),
            Col("allocated", "allocated"),
            Col("connected", "connected"),
        ],
        frameworks,
        view,
    ));
    h.push_str("</section>");

    let agents: Vec<Row> = arr(&views::agents(state))
        .iter()
        .map(|a| {
            let status = agent_status(a);
            let gpus = arr(&a["gpus"]);
            Row {
                attrs: format!("class=\"agent\" data-name=\"{}\"", text(&a["name"])),
                cells: vec![
                    Cell::html(
                        format!("<b>{}</b>", names.agent(&a["id"]).html),
                        a["name"].as_str().unwrap_or("-"),
                    ),
                    val(&a["hostname"]),
                    Cell::html(
                        format!(
                            "<span class=\"{}\">{status}</span>",
                            if status == "connected" { "ok" } else { "bad" }
                        ),
                        status,
                    ),
                    Cell::text(drain_state(a)),
                    res_cell(&a["total"]),
                    res_cell(&a["used"]),
                    res_cell(&a["offered"]),
                ],
                after: if gpus.is_empty() {
                    String::new()
                } else {
                    format!(
                        "<tr class=\"gpu-head\"><td></td><td colspan=\"6\">{}</td></tr>",
                        gpu_table(gpus)
                    )
                },
            }
        })
        .collect();
    h.push_str("<section id=\"agents\"><h2>Agents</h2>");
    h.push_str(&table::render(
        "agents",
        &[
            Col("name", "agent"),
            Col("host", "host"),
            Col("status", "status"),
            Col("drain", "drain"),
            Col("total", "total"),
            Col("used", "used"),
            Col("offered", "offered"),
        ],
        agents,
        view,
    ));
    h.push_str("</section>");

    // Active tasks by framework, then name in natural order (a gang's members together), then
    // the latest completed, newest first.
    let mut active: Vec<&Value> = arr(&state["tasks"]).iter().collect();
    let fw_name = |t: &Value| {
        t["framework_id"]
            .as_str()
            .and_then(|id| names.frameworks.get(id).copied())
            .unwrap_or_default()
            .to_string()
    };
    active.sort_by(|a, b| {
        table::natural(&fw_name(a), &fw_name(b)).then_with(|| {
            table::natural(
                a["name"].as_str().unwrap_or_default(),
                b["name"].as_str().unwrap_or_default(),
            )
        })
    });
    let completed = arr(&state["completed_tasks"]);
    let rows = task_rows(
        active
            .into_iter()
            .chain(completed.iter().rev().take(COMPLETED_SHOWN)),
        &names,
    );
    h.push_str("<section id=\"tasks\"><h2>Tasks</h2>");
    h.push_str(&task_table("tasks", rows, view));
    h.push_str("</section>");
    h
}

#[cfg(test)]
mod tests;
