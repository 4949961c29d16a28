//! The versioned operator API `/api/v1/…` (JSON; docs/api/openapi.yaml documents every
//! endpoint) and its event stream.
//!
//! ```text
//! reads:  GET  /api/v1/{summary,agents,agents/{id},frameworks,frameworks/{id},tasks,
//!                      tasks/{id},roles,offers,quotas,weights,maintenance}
//! writes: POST /api/v1/weights, /api/v1/quotas,
//!              /api/v1/agents/{id}/{reserve,unreserve,deactivate,reactivate,gone},
//!              /api/v1/agents/{id}/gpus/{uuid}/clear, /api/v1/frameworks/{id}/teardown
//!         (drain / undrain: /api/v1/agents/{id}/drain, in server/maintenance.rs)
//! stream: GET  /api/v1/events[?since=]   (server-sent events: the history since then, a
//!                                        snapshot, then changes)
//! sandboxes: GET /api/v1/tasks/{id}/{files,files/read,logs}, POST /api/v1/tasks/{id}/exec
//!         (`super::http`'s `sandbox.rs`: relayed to the task's agent)
//! ```
//!
//! Authentication and errors are the operator API's ([`super::http`]): reads need an
//! authenticated operator (or `--http-public-reads`), every write the ACL grant of its action
//! (403 otherwise). Writes go to the core as [`OperatorCommand`]s; what the registry holds
//! survives a restart and a failover. Reads are shaped from the core's `/state` view by the
//! pure functions in [`views`]: the pages of one agent, framework or task join names, tasks,
//! offers and GPUs; task filters that name nothing are refused (400). Agents are named by id
//! or name, frameworks and tasks by id or a name only one has (409 when several do). Routes
//! are added through `super::routes::Routes`, whose table a test compares with
//! docs/api/openapi.yaml.
//!
//! The event stream: with `?since=` a subscriber first gets the persistent history since then
//! (`super::history`: each event with `at_ms`), then `{"type":"snapshot","state":{/state}}`, then
//! one message per change ([`crate::state::ClusterEvent`]). The core never waits for a
//! subscriber: events go through a bounded broadcast buffer, and a subscriber that falls
//! behind it gets `{"type":"dropped"}` and the stream ends (reconnect for a new snapshot).
//! Changes made between subscribing and the snapshot may also be sent after it.
//!
//! Subscribers are bounded: at most `--http-max-event-subscribers-per-principal` at once per
//! operator (anonymous ones, with `--http-public-reads`, per address; 429 past it), and what one
//! subscriber may have queued is the broadcast buffer's share plus the connection's write
//! buffers (`--http-send-buffer-kib`): a subscriber whose socket accepts nothing for
//! `--http-write-timeout` is closed (the operator port's write deadline).

pub mod demand;
pub mod views;

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::Json;
use gantry_proto::Resources;
use gantry_proto::{AgentId, FrameworkId};
use serde_json::Value;

use super::http::{
    caller_of, operator, parse_json, quota_handler, weights_handler, ApiError, ApiResult, App,
    Caller, ConnInfo, SubscriberSlot,
};
use super::routes::Routes;
use crate::security::acl::OperatorAction;
use crate::state::OperatorCommand;

type CallerExt = Option<axum::Extension<Caller>>;

/// The `/api/v1` routes (merged into the operator API's router).
pub(super) fn routes() -> Routes<App> {
    Routes::new()
        .get("/api/v1", index)
        .get("/api/v1/summary", summary)
        .get("/api/v1/agents", agents)
        .get("/api/v1/agents/{id}", agent)
        .post("/api/v1/agents/{id}/reserve", reserve)
        .post("/api/v1/agents/{id}/unreserve", unreserve)
        .post("/api/v1/agents/{id}/deactivate", deactivate)
        .post("/api/v1/agents/{id}/reactivate", reactivate)
        .post("/api/v1/agents/{id}/gone", mark_gone)
        .post("/api/v1/agents/{id}/gpus/{uuid}/clear", clear_gpu)
        // Drain / undrain: /api/v1/agents/{id}/drain, …/undrain (server/maintenance.rs).
        .get("/api/v1/frameworks", frameworks)
        .get("/api/v1/frameworks/{id}", framework)
        .post("/api/v1/frameworks/{id}/teardown", teardown)
        .get("/api/v1/tasks", tasks)
        .get("/api/v1/tasks/{id}", task)
        .get("/api/v1/roles", roles)
        .get("/api/v1/offers", offers)
        .get("/api/v1/quotas", quotas)
        .post("/api/v1/quotas", quota_handler)
        .get("/api/v1/weights", weights)
        .post("/api/v1/weights", weights_handler)
        .get("/api/v1/maintenance", maintenance)
        .get("/api/v1/demand", demand::demand)
        .get("/api/v1/events", events)
        .get("/api/v1/usage", usage)
}

/// `?since=&until=&by=`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    since: Option<String>,
    until: Option<String>,
    by: Option<String>,
}

/// `GET /api/v1/usage`: CPU-, memory- and GPU-hours used by tasks over a window, per role,
/// framework or user, and their cost where agents carry a price, from the persistent history
/// (`super::usage`).
async fn usage(
    State(app): State<App>,
    caller: CallerExt,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    app.may_read(&caller_of(caller))?;
    let Query(q) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let bad = |e: String| ApiError::new(StatusCode::BAD_REQUEST, e);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let since = parse_since(q.since.as_deref().unwrap_or("30d"), now_ms).map_err(bad)?;
    let until = match q.until.as_deref() {
        Some(u) => parse_since(u, now_ms).map_err(bad)?,
        None => now_ms,
    };
    let by = super::usage::UsageBy::parse(q.by.as_deref().unwrap_or("role")).map_err(bad)?;
    let (events, held) = app
        .shell
        .history
        .lock()
        .map(|h| {
            let held = h
                .held_offers
                .report(since, until, |id| h.usage().framework_name(id));
            (h.since(0, usize::MAX), held)
        })
        .unwrap_or_default();
    // Agents the history no longer describes are priced from the live state.
    let live: std::collections::HashMap<String, super::usage::AgentPrice> = app
        .state()
        .await
        .ok()
        .and_then(|s| s["agents"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|a| {
            let id = a["id"].as_str()?.to_string();
            Some((id, super::usage::AgentPrice::from_json(a)))
        })
        .collect();
    let mut report = super::usage::report(&events, since, until, by, &live);
    report["held_offers"] = held;
    Ok(Json(report))
}

/// The state view for a read by an authenticated caller.
async fn read(app: &App, caller: CallerExt) -> Result<Value, ApiError> {
    app.may_read(&caller_of(caller))?;
    app.state().await
}

async fn index(State(app): State<App>, caller: CallerExt) -> ApiResult {
    app.may_read(&caller_of(caller))?;
    Ok(Json(serde_json::json!({
        "version": "v1",
        "reads": ["summary", "agents", "agents/{id}", "frameworks", "frameworks/{id}", "tasks",
                  "tasks/{id}", "roles", "offers", "quotas", "weights", "maintenance",
                  "maintenance/drains"],
        "writes": ["weights", "quotas", "agents/{id}/reserve", "agents/{id}/unreserve",
                   "agents/{id}/deactivate", "agents/{id}/reactivate", "agents/{id}/gone",
                   "agents/{id}/gpus/{uuid}/clear", "agents/{id}/drain", "agents/{id}/undrain",
                   "frameworks/{id}/teardown"],
        "sandboxes": ["tasks/{id}/files", "tasks/{id}/files/read", "tasks/{id}/logs",
                      "tasks/{id}/exec"],
        "events": "events?since=",
        "docs": "docs/api/openapi.yaml",
    })))
}

async fn summary(State(app): State<App>, caller: CallerExt) -> ApiResult {
    Ok(Json(views::summary(&read(&app, caller).await?)))
}

async fn agents(State(app): State<App>, caller: CallerExt) -> ApiResult {
    Ok(Json(views::agents(&read(&app, caller).await?)))
}

fn not_found(what: &str, key: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no {what} {key:?}"))
}

async fn agent(State(app): State<App>, caller: CallerExt, Path(id): Path<String>) -> ApiResult {
    let state = read(&app, caller).await?;
    let a = views::find_agent(&state, &id).ok_or_else(|| not_found("agent", &id))?;
    Ok(Json(views::agent_page(&state, a)))
}

/// 404 for a name or id naming nothing, 409 for a name more than one thing has.
fn lookup_error(what: &str, key: &str, e: &views::Lookup) -> ApiError {
    let status = match e {
        views::Lookup::NotFound => StatusCode::NOT_FOUND,
        views::Lookup::Ambiguous(_) => StatusCode::CONFLICT,
    };
    ApiError::new(status, e.message(what, key))
}

async fn task(State(app): State<App>, caller: CallerExt, Path(id): Path<String>) -> ApiResult {
    let state = read(&app, caller).await?;
    let t = views::lookup_task(&state, &id).map_err(|e| lookup_error("task", &id, &e))?;
    let mut page = views::task_page(&state, t);
    // Its state transitions from the persistent history (super::history).
    page["history"] = Value::Array(task_history(&app, t["id"].as_str().unwrap_or_default()));
    Ok(Json(page))
}

/// A task's state transitions from the persistent history (`super::history`), oldest first:
/// `{at_ms, state, reason, message, agent_id}` (the task page of the API and the dashboard).
pub(super) fn task_history(app: &App, task_id: &str) -> Vec<Value> {
    app.shell
        .history
        .lock()
        .map(|h| h.task(task_id))
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            serde_json::json!({
                "at_ms": e.at_unix_ms,
                "state": e.event["state"],
                "reason": e.event["reason"],
                "message": e.event["message"],
                "agent_id": e.event["agent_id"],
            })
        })
        .collect()
}

/// The `/api/v1/usage` report for the query in `uri` (the dashboard's usage view renders the
/// API's own answer, whatever fields it carries).
pub(super) async fn usage_report(
    app: &App,
    caller: CallerExt,
    uri: &axum::http::Uri,
) -> Result<Value, ApiError> {
    usage(State(app.clone()), caller, Query::try_from_uri(uri))
        .await
        .map(|Json(v)| v)
}

async fn frameworks(State(app): State<App>, caller: CallerExt) -> ApiResult {
    let state = read(&app, caller).await?;
    Ok(Json(serde_json::json!({
        "frameworks": state["frameworks"],
        "completed_frameworks": state["completed_frameworks"],
    })))
}

async fn framework(State(app): State<App>, caller: CallerExt, Path(id): Path<String>) -> ApiResult {
    let state = read(&app, caller).await?;
    let f = views::lookup_framework(&state, &id).map_err(|e| lookup_error("framework", &id, &e))?;
    Ok(Json(views::framework_page(&state, f)))
}

async fn tasks(
    State(app): State<App>,
    caller: CallerExt,
    query: Result<Query<views::TaskQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(q) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    views::tasks(&read(&app, caller).await?, &q)
        .map(Json)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))
}

async fn roles(State(app): State<App>, caller: CallerExt) -> ApiResult {
    Ok(Json(views::roles(&read(&app, caller).await?)))
}

async fn offers(State(app): State<App>, caller: CallerExt) -> ApiResult {
    Ok(Json(views::offers(&read(&app, caller).await?)))
}

async fn quotas(State(app): State<App>, caller: CallerExt) -> ApiResult {
    Ok(Json(views::quotas(&read(&app, caller).await?)))
}

async fn weights(State(app): State<App>, caller: CallerExt) -> ApiResult {
    Ok(Json(views::weights(&read(&app, caller).await?)))
}

async fn maintenance(State(app): State<App>, caller: CallerExt) -> ApiResult {
    Ok(Json(views::maintenance(&read(&app, caller).await?)))
}

/// The id of the agent named by `key` (an id, or a name the master knows).
async fn agent_id(app: &App, key: &str) -> Result<AgentId, ApiError> {
    if let Ok(id) = key.parse() {
        return Ok(id);
    }
    let state = app.state().await?;
    views::find_agent(&state, key)
        .and_then(|a| a["id"].as_str())
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| not_found("agent", key))
}

/// The id of the framework named by `key` (an id, or a name only one framework has).
async fn framework_id(app: &App, key: &str) -> Result<FrameworkId, ApiError> {
    if let Ok(id) = key.parse() {
        return Ok(id);
    }
    let state = app.state().await?;
    views::find_framework(&state, key)
        .and_then(|f| f["id"].as_str())
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| not_found("framework (or more than one has that name)", key))
}

/// `POST /api/v1/agents/{id}/reserve` (and `unreserve`) with
/// `{"role": "eng", "resources": "cpus:2;gpus:1"}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveRequest {
    role: String,
    resources: String,
}

async fn reservation(
    app: App,
    caller: CallerExt,
    key: String,
    body: Bytes,
    reserve: bool,
) -> ApiResult {
    let action = if reserve {
        OperatorAction::Reserve
    } else {
        OperatorAction::Unreserve
    };
    let who = app.may_write(&caller_of(caller), action)?;
    let req: ReserveRequest = parse_json(&body)?;
    let resources: Resources = req
        .resources
        .parse()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("resources: {e}")))?;
    let agent_id = agent_id(&app, &key).await?;
    let cmd = if reserve {
        OperatorCommand::Reserve {
            agent_id,
            role: req.role,
            resources,
        }
    } else {
        OperatorCommand::Unreserve {
            agent_id,
            role: req.role,
            resources,
        }
    };
    operator(&app, who, cmd).await
}

async fn reserve(
    State(app): State<App>,
    caller: CallerExt,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    reservation(app, caller, id, body, true).await
}

async fn unreserve(
    State(app): State<App>,
    caller: CallerExt,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    reservation(app, caller, id, body, false).await
}

/// A write on one agent with no body: checks the grant, resolves the agent, runs `cmd`.
async fn agent_command(
    app: App,
    caller: CallerExt,
    key: String,
    action: OperatorAction,
    cmd: fn(AgentId) -> OperatorCommand,
) -> ApiResult {
    let who = app.may_write(&caller_of(caller), action)?;
    let id = agent_id(&app, &key).await?;
    operator(&app, who, cmd(id)).await
}

async fn deactivate(
    State(app): State<App>,
    caller: CallerExt,
    Path(id): Path<String>,
) -> ApiResult {
    agent_command(app, caller, id, OperatorAction::Deactivate, |agent_id| {
        OperatorCommand::DeactivateAgent { agent_id }
    })
    .await
}

async fn reactivate(
    State(app): State<App>,
    caller: CallerExt,
    Path(id): Path<String>,
) -> ApiResult {
    agent_command(app, caller, id, OperatorAction::Reactivate, |agent_id| {
        OperatorCommand::ReactivateAgent { agent_id }
    })
    .await
}

async fn mark_gone(State(app): State<App>, caller: CallerExt, Path(id): Path<String>) -> ApiResult {
    agent_command(app, caller, id, OperatorAction::MarkGone, |agent_id| {
        OperatorCommand::MarkAgentGone { agent_id }
    })
    .await
}

async fn clear_gpu(
    State(app): State<App>,
    caller: CallerExt,
    Path((id, uuid)): Path<(String, String)>,
) -> ApiResult {
    let who = app.may_write(&caller_of(caller), OperatorAction::ClearGpu)?;
    let agent_id = agent_id(&app, &id).await?;
    operator(&app, who, OperatorCommand::ClearGpu { agent_id, uuid }).await
}

async fn teardown(State(app): State<App>, caller: CallerExt, Path(id): Path<String>) -> ApiResult {
    let who = app.may_write(&caller_of(caller), OperatorAction::Teardown)?;
    let framework_id = framework_id(&app, &id).await?;
    operator(&app, who, OperatorCommand::Teardown { framework_id }).await
}

/// `GET /api/v1/events`: server-sent events, a snapshot first (see the module docs).
/// `?since=`: Unix milliseconds, an RFC 3339 time, or a duration back from now (`1h`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    since: Option<String>,
}

/// The most history events one subscription is sent before its snapshot.
const MAX_HISTORY_SENT: usize = 100_000;

/// The Unix milliseconds `since` names.
fn parse_since(since: &str, now_ms: u64) -> Result<u64, String> {
    let since = since.trim();
    if let Ok(ms) = since.parse::<u64>() {
        return Ok(ms);
    }
    if let Ok(d) = humantime::parse_duration(since) {
        return Ok(now_ms.saturating_sub(d.as_millis() as u64));
    }
    if let Ok(t) = humantime::parse_rfc3339_weak(since) {
        return Ok(t
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64));
    }
    Err(format!(
        "since={since:?}: Unix milliseconds, an RFC 3339 time (2026-01-02T03:04:05Z) or a duration back from now (1h)"
    ))
}

async fn events(
    State(app): State<App>,
    caller: CallerExt,
    info: Option<axum::Extension<ConnInfo>>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let caller = caller_of(caller);
    app.may_read(&caller)?;
    let Query(q) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let since = q
        .since
        .as_deref()
        .map(|s| parse_since(s, now_ms))
        .transpose()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))?;
    let principal = match &caller {
        Caller::Operator { name, .. } => format!("operator:{name}"),
        Caller::Anonymous { .. } => match &info {
            Some(i) => format!(
                "anonymous@{}",
                super::http_guard::address_key(i.0.remote.ip())
            ),
            None => "anonymous".into(),
        },
    };
    let slot = app.subscribe_slot(principal)?;
    // Subscribe before the snapshot: nothing between the two is missed.
    let rx = app.shell.events.subscribe();
    // The history asked for first: each event as the stream sends it, with `at_ms` (when the
    // master recorded it) and `"history": true`.
    let mut first: Vec<String> = match since {
        Some(since) => app
            .shell
            .history
            .lock()
            .map(|h| h.since(since, MAX_HISTORY_SENT))
            .unwrap_or_default()
            .into_iter()
            .map(|e| {
                let mut v = e.event;
                v["at_ms"] = Value::from(e.at_unix_ms);
                v["history"] = Value::Bool(true);
                v.to_string()
            })
            .collect(),
        None => Vec::new(),
    };
    let state = app.state().await?;
    first.push(serde_json::json!({"type": "snapshot", "state": state}).to_string());
    let stream = event_stream(first, rx, slot);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

type Events = tokio::sync::broadcast::Receiver<std::sync::Arc<str>>;

/// The data of each event a subscriber is sent: the snapshot, then the broadcast events until
/// the subscriber falls behind the buffer (then one `dropped` and the end) or the master stops.
fn event_data(
    first: Vec<String>,
    rx: Events,
) -> impl futures_util::Stream<Item = String> + Send + 'static {
    use futures_util::StreamExt;
    enum Step {
        Live(Events),
        Done,
    }
    let live = futures_util::stream::unfold(Step::Live(rx), |step| async move {
        use tokio::sync::broadcast::error::RecvError;
        match step {
            Step::Live(mut rx) => match rx.recv().await {
                Ok(e) => Some((e.to_string(), Step::Live(rx))),
                Err(RecvError::Lagged(n)) => {
                    tracing::info!(missed = n, "event stream subscriber fell behind; dropped");
                    let msg = serde_json::json!({
                        "type": "dropped",
                        "message": format!("this subscriber fell {n} events behind; reconnect for a new snapshot"),
                    });
                    Some((msg.to_string(), Step::Done))
                }
                Err(RecvError::Closed) => None,
            },
            Step::Done => None,
        }
    });
    futures_util::stream::iter(first).chain(live)
}

/// The SSE events; the subscriber's slot is held until the stream is dropped (the connection
/// closed or the stream ended).
fn event_stream(
    first: Vec<String>,
    rx: Events,
    slot: SubscriberSlot,
) -> impl futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static {
    use futures_util::StreamExt;
    event_data(first, rx).map(move |d| {
        let _held = &slot;
        Ok(Event::default().data(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[tokio::test]
    async fn a_subscriber_gets_the_snapshot_then_events_in_order() {
        let (tx, rx) = tokio::sync::broadcast::channel(8);
        tx.send("{\"n\":1}".into()).unwrap();
        tx.send("{\"n\":2}".into()).unwrap();
        drop(tx);
        let got: Vec<String> = event_data(vec!["snap".into()], rx).collect().await;
        assert_eq!(got, ["snap", "{\"n\":1}", "{\"n\":2}"]);
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_dropped_without_holding_the_sender() {
        let (tx, rx) = tokio::sync::broadcast::channel(4);
        // The sender never waits: it overwrites what the slow subscriber did not read.
        for i in 0..100 {
            tx.send(format!("{{\"n\":{i}}}").into()).unwrap();
        }
        let got: Vec<String> = event_data(vec!["snap".into()], rx).collect().await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], "snap");
        let last: Value = serde_json::from_str(&got[1]).unwrap();
        assert_eq!(last["type"], "dropped");
        assert!(last["message"]
            .as_str()
            .unwrap()
            .contains("96 events behind"));
    }
}
