//! The queue's API on its own port (axum as in the master): plain HTTP in dev mode (no ACL
//! file), HTTPS ([`serve_https`]) with tokens and client certificates otherwise (see
//! [`crate::auth`]; 400 bad request, 401 unauthenticated, 403 not allowed):
//!
//! | method and path       | what                                                        |
//! |-----------------------|-------------------------------------------------------------|
//! | `POST /jobs`          | submit a [`JobSpec`] (JSON); answers `{"id": N}`             |
//! | `GET /jobs`           | every job ([`JobView`]s)                                     |
//! | `GET /jobs/{id}`      | one job                                                      |
//! | `DELETE /jobs/{id}`   | cancel it (its workers are killed)                           |
//! | `GET /jobs/{id}/logs` | a running worker's output (`?worker=I&follow=true&stderr=true`), relayed from the master ([`MasterApi`]); the job's user, its team's and the queue's administrators |
//! | `GET /stats`          | counters as JSON (GPU-seconds per team, preemptions, jobs requeued after a lost worker, idle) |
//! | `GET /metrics`        | Prometheus text: queue depth per team and priority, wait    |
//! |                       | histogram, preemptions, GPU-hours per team, idle-while-waiting |
//! | `GET /usage`          | GPU-hours and cost per team (`?by=user`: per team and user) in `?since_unix_ms=..&until_unix_ms=..` ([`crate::usage`]) |
//! | `GET /budgets`        | each team with a budget: budget, spent in the period, `ok`/`warn`/`over` ([`crate::budget`]) |
//! | `POST /shutdown`      | tear the framework down (`gantry-queue shutdown`)            |
//!
//! Every change is committed to the store before the answer is sent.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use gantry_master::security::tokens::OperatorTokens;
use gantry_transport::tls::PeerIdentity;
use serde_json::json;

use crate::auth::{Acl, Caller, Denied};
use crate::model::{JobSpec, JobView};
use crate::runtime::Shared;

/// Jobs not yet ended the queue accepts; more submissions get 429.
pub const MAX_ACTIVE_JOBS: usize = 50_000;

/// The largest request body (a job specification), bytes.
pub const MAX_BODY: usize = 256 * 1024;

/// What the API serves: the queue, and who may do what (`acl: None` is dev mode).
pub struct Api {
    /// The queue.
    pub shared: Arc<Shared>,
    /// The ACL file; `None`: dev mode, everyone may do everything.
    pub acl: Option<Acl>,
    /// Users' tokens (the master's operator-token file format).
    pub tokens: OperatorTokens,
    /// The master's operator API (`--master-api`), for workers' logs; `None`: no logs.
    pub master: Option<MasterApi>,
}

/// Why the master's API client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MasterApiError {
    /// The CA or the framework certificate.
    #[error(transparent)]
    Tls(#[from] gantry_transport::tls::TlsError),
    /// The HTTP client.
    #[error("the master's API client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The master's operator API as the queue's framework principal (its `framework:NAME` client
/// certificate): the master serves a task's logs to the framework that owns it
/// (`GET /api/v1/tasks/{id}/logs`), and the queue relays them to the job's user.
pub struct MasterApi {
    base: String,
    client: reqwest::Client,
}

impl MasterApi {
    /// `base` is `https://HOST:PORT` (the master's `--http-listen`; `http://` for a loopback
    /// master with `--http-insecure`); the CA and the framework certificate
    /// (`framework-PRINCIPAL.pem/.key`) come from `tls_dir`.
    pub fn new(
        base: &str,
        tls_dir: &std::path::Path,
        principal: &str,
    ) -> Result<Self, MasterApiError> {
        use gantry_transport::tls;
        let base = base.trim_end_matches('/').to_string();
        let (roots, identity) = if base.starts_with("https://") {
            let id = tls::load_identity(tls_dir, &PeerIdentity::Framework(principal.into()))?;
            (tls::load_roots(tls_dir)?, Some(id))
        } else {
            (rustls::RootCertStore::empty(), None)
        };
        let cfg = tls::https_client_config(roots, identity.as_ref())?;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(cfg)
            .connect_timeout(Duration::from_secs(5))
            .http1_only()
            .no_proxy()
            .build()?;
        Ok(MasterApi { base, client })
    }
}

/// The identity of the connection's client certificate, if it presented one (HTTPS).
#[derive(Debug, Clone, Default)]
pub struct PeerCert(pub Option<PeerIdentity>);

/// The API's routes. Without an ACL (dev mode) anyone who reaches the port may do anything:
/// bind it to a loopback or otherwise protected address.
pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/jobs", get(list).post(submit))
        .route("/jobs/{id}", get(show).delete(cancel))
        .route("/jobs/{id}/logs", get(logs))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/usage", get(usage))
        .route("/budgets", get(budgets))
        .route("/shutdown", axum::routing::post(shutdown))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(api)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

fn denied(d: Denied) -> Response {
    let status = match d {
        Denied::BadRequest(_) => StatusCode::BAD_REQUEST,
        Denied::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        Denied::Forbidden(_) => StatusCode::FORBIDDEN,
    };
    error(status, d.to_string())
}

/// Who calls: the user of a bearer token, else of an `operator:NAME` client certificate.
fn caller(api: &Api, headers: &HeaderMap, cert: Option<&PeerCert>) -> Caller {
    if let Some(h) = headers.get(axum::http::header::AUTHORIZATION) {
        let Ok(h) = h.to_str() else {
            return Caller::Anonymous("the Authorization header is not text".into());
        };
        return match gantry_master::security::identity::bearer_token(h) {
            Err(why) => Caller::Anonymous(why.into()),
            Ok(token) => match api.tokens.verify(token) {
                Some(name) => Caller::User(name.to_string()),
                None => Caller::Anonymous("unknown token".into()),
            },
        };
    }
    match cert.and_then(|c| c.0.as_ref()) {
        Some(PeerIdentity::User(name) | PeerIdentity::Operator(name)) => Caller::User(name.clone()),
        Some(other) => Caller::Anonymous(format!(
            "{other} is not a user certificate (user:NAME, or an operator's operator:NAME)"
        )),
        None => Caller::Anonymous(
            "no token (Authorization: Bearer TOKEN) and no client certificate".into(),
        ),
    }
}

/// The caller, when it may read (always in dev mode).
fn reader(
    api: &Api,
    headers: &HeaderMap,
    cert: Option<Extension<PeerCert>>,
) -> Result<Caller, Denied> {
    let who = caller(api, headers, cert.as_ref().map(|c| &c.0));
    match &api.acl {
        Some(acl) => acl.may_read(&who).map(|()| who),
        None => Ok(who),
    }
}

async fn submit(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    cert: Option<Extension<PeerCert>>,
    body: Bytes,
) -> Response {
    let who = caller(&api, &headers, cert.as_ref().map(|c| &c.0));
    // Authentication before anything else is looked at.
    if let (Some(_), Caller::Anonymous(why)) = (&api.acl, &who) {
        return denied(Denied::Unauthenticated(why.clone()));
    }
    let spec: JobSpec = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("bad job specification: {e}"),
            )
        }
    };
    let user = match &api.acl {
        Some(acl) => match acl.may_submit(&who, &spec.team, spec.priority) {
            Ok(user) => user,
            Err(d) => return denied(d),
        },
        None => who.name().to_string(),
    };
    let s = &api.shared;
    if let Some(problem) = spec.problem() {
        return error(StatusCode::BAD_REQUEST, problem);
    }
    if let Some(problem) = s.core().dependency_problem(&spec) {
        return error(StatusCode::BAD_REQUEST, problem);
    }
    if let Some(why) = s.core().refusal(&spec) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("no agent of the cluster can ever run it: {why}"),
        );
    }
    // A team at or past its budget submits nothing more until its spending falls back;
    // close to it, the submission is accepted with a warning.
    let mut budget_warning = None;
    if let Some(b) = s.core().budget(&spec.team, Instant::now()) {
        match b.state {
            crate::budget::BudgetState::Over => {
                let message = b.message().unwrap_or_default();
                return (
                    StatusCode::FORBIDDEN,
                    Json(json!({ "error": message, "reason": "over-budget", "budget": b })),
                )
                    .into_response();
            }
            crate::budget::BudgetState::Warn => budget_warning = b.message(),
            crate::budget::BudgetState::Ok => {}
        }
    }
    if s.core().holds_active(MAX_ACTIVE_JOBS) {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            format!("the queue holds {MAX_ACTIVE_JOBS} jobs not yet ended; try again later"),
        );
    }
    if spec.array.is_some() {
        // No pass per submission: the commit runs one for every submission it takes.
        let ids = s.with(|core, now| (core.enqueue_array(spec, user, now), Vec::new()));
        return match ids {
            Ok(ids) => {
                let mut body = json!({ "id": ids.first(), "ids": ids });
                if let Some(w) = budget_warning {
                    body["warning"] = json!(w);
                }
                (StatusCode::CREATED, Json(body)).into_response()
            }
            Err(e) => error(StatusCode::BAD_REQUEST, e),
        };
    }
    let deadline = spec.deadline_unix;
    let id = s
        .with_async(|core, now| (core.enqueue_as(spec, user, now), Vec::new()))
        .await;
    // Say so when the estimated start already misses the deadline.
    let wall = crate::runtime::unix_ms();
    let warning = deadline.and_then(|d| {
        let core = s.core();
        let view = core.view_at(id, Instant::now(), wall)?;
        let limit = core.time_limit(core.spec(id)?).unwrap_or_default();
        let start = view.estimated_start_unix_ms?;
        let end = start + limit.as_millis() as u64;
        (end > d.saturating_mul(1000)).then(|| {
            format!(
                "the estimated start (in {} s) plus its time limit ({} s) misses its deadline \
                 (in {} s)",
                start.saturating_sub(wall) / 1000,
                limit.as_secs(),
                (d * 1000).saturating_sub(wall) / 1000
            )
        })
    });
    let mut body = json!({ "id": id });
    let warnings: Vec<String> = budget_warning.into_iter().chain(warning).collect();
    if !warnings.is_empty() {
        body["warning"] = json!(warnings.join("; "));
    }
    (StatusCode::CREATED, Json(body)).into_response()
}

async fn shutdown(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    cert: Option<Extension<PeerCert>>,
) -> Response {
    if let Some(acl) = &api.acl {
        let who = caller(&api, &headers, cert.as_ref().map(|c| &c.0));
        if let Err(d) = acl.may_shutdown(&who) {
            return denied(d);
        }
    }
    match api.shared.shutdown() {
        Ok(()) => Json(json!({ "shutdown": true })).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn list(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    cert: Option<Extension<PeerCert>>,
) -> Response {
    if let Err(d) = reader(&api, &headers, cert) {
        return denied(d);
    }
    let views: Vec<JobView> = api
        .shared
        .core()
        .views_at(Instant::now(), crate::runtime::unix_ms());
    Json(views).into_response()
}

/// `GET /usage` parameters.
#[derive(Debug, serde::Deserialize)]
struct UsageQuery {
    since_unix_ms: Option<u64>,
    until_unix_ms: Option<u64>,
    #[serde(default)]
    by: crate::usage::By,
}

async fn usage(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    cert: Option<Extension<PeerCert>>,
    axum::extract::Query(q): axum::extract::Query<UsageQuery>,
) -> Response {
    if let Err(d) = reader(&api, &headers, cert) {
        return denied(d);
    }
    let until = q.until_unix_ms.unwrap_or_else(crate::runtime::unix_ms);
    match api.shared.store().usage() {
        Ok(history) => Json(crate::usage::summarize(
            &history,
            q.since_unix_ms.unwrap_or(0),
            until,
            q.by,
        ))
        .into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn budgets(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    cert: Option<Extension<PeerCert>>,
) -> Response {
    if let Err(d) = reader(&api, &headers, cert) {
        return denied(d);
    }
    Json(api.shared.core().budgets(Instant::now())).into_response()
}

async fn show(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    cert: Option<Extension<PeerCert>>,
    Path(id): Path<u64>,
) -> Response {
    if let Err(d) = reader(&api, &headers, cert) {
        return denied(d);
    }
    match api
        .shared
        .core()
        .view_at(id, Instant::now(), crate::runtime::unix_ms())
    {
        Some(v) => Json(v).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no job {id}")),
    }
}

/// `GET /jobs/{id}/logs`'s query.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    /// The worker (index; 0 by default).
    #[serde(default)]
    pub worker: u32,
    /// Follow the output until the worker ends.
    #[serde(default)]
    pub follow: bool,
    /// Standard error instead of standard output.
    #[serde(default)]
    pub stderr: bool,
}

async fn logs(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    cert: Option<Extension<PeerCert>>,
    Path(id): Path<u64>,
    query: Result<axum::extract::Query<LogsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let who = match reader(&api, &headers, cert) {
        Ok(w) => w,
        Err(d) => return denied(d),
    };
    let q = match query {
        Ok(q) => q.0,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let Some(job) = api.shared.core().view(id, Instant::now()) else {
        return error(StatusCode::NOT_FOUND, format!("no job {id}"));
    };
    if let Some(acl) = &api.acl {
        if let Err(d) = acl.may_read_logs(&who, &job.team, &job.user) {
            return denied(d);
        }
    }
    let Some(master) = &api.master else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this queue relays no logs: it was started without --master-api",
        );
    };
    let Some(member) = job.members.iter().find(|m| m.index == q.worker) else {
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "job {id} ({:?}) has no worker {} now: logs are relayed while a worker has a \
                 task (an ended one's: gantryctl logs TASK_ID)",
                job.state, q.worker
            ),
        );
    };
    let url = format!(
        "{}/api/v1/tasks/{}/logs?stream={}&follow={}",
        master.base,
        member.task_id,
        if q.stderr { "stderr" } else { "stdout" },
        q.follow
    );
    let resp = match master.client.get(&url).send().await {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                format!("reaching the master's API: {e}"),
            )
        }
    };
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        let why = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(text);
        // The master's 404 (the sandbox is gone) is the caller's; the rest is the queue's
        // trouble with the master.
        let to = if status == reqwest::StatusCode::NOT_FOUND {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::BAD_GATEWAY
        };
        return error(to, format!("the master answered {status}: {why}"));
    }
    let body = futures_util::stream::unfold(Some(resp), |resp| async move {
        let mut resp = resp?;
        match resp.chunk().await {
            Ok(Some(chunk)) => Some((Ok::<_, reqwest::Error>(chunk), Some(resp))),
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    });
    let mut out = axum::body::Body::from_stream(body).into_response();
    out.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    out
}

async fn cancel(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    cert: Option<Extension<PeerCert>>,
    Path(id): Path<u64>,
) -> Response {
    let who = match reader(&api, &headers, cert) {
        Ok(w) => w,
        Err(d) => return denied(d),
    };
    let s = &api.shared;
    let Some(job) = s.core().view(id, Instant::now()) else {
        return error(StatusCode::NOT_FOUND, format!("no job {id}"));
    };
    if let Some(acl) = &api.acl {
        if let Err(d) = acl.may_cancel(&who, &job.team, &job.user) {
            return denied(d);
        }
    }
    match s.with(|core, now| match core.cancel(id, now) {
        Some(actions) => (true, actions),
        None => (false, Vec::new()),
    }) {
        true => Json(json!({ "id": id, "state": "CANCELLED" })).into_response(),
        false => error(StatusCode::CONFLICT, format!("job {id} has already ended")),
    }
}

async fn stats(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    cert: Option<Extension<PeerCert>>,
) -> Response {
    if let Err(d) = reader(&api, &headers, cert) {
        return denied(d);
    }
    let core = api.shared.core();
    let now = Instant::now();
    let (agents, gpus) = core.known_agents();
    Json(json!({
        "agents": agents,
        "gpus": gpus,
        "gpu_secs": core.gpu_secs(now),
        "preemptions": core.stats.preemptions,
        "requeued_lost": core.stats.requeued_lost,
        "idle_while_eligible_gpu_secs": core.stats.idle_while_eligible_gpu_secs,
        "idle_while_eligible_secs": core.stats.idle_while_eligible_secs,
        "reserved_idle_gpu_secs": core.stats.reserved_idle_gpu_secs,
        "settling_idle_gpu_secs": core.stats.settling_idle_gpu_secs,
        "waits": core.stats.waits,
    }))
    .into_response()
}

/// Wait histogram buckets, seconds.
const BUCKETS: [f64; 10] = [
    1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0,
];

async fn metrics(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    cert: Option<Extension<PeerCert>>,
) -> Response {
    if let Err(d) = reader(&api, &headers, cert) {
        return denied(d);
    }
    let core = api.shared.core();
    let now = Instant::now();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP gpu_queue_depth Pending jobs per team and priority."
    );
    let _ = writeln!(out, "# TYPE gpu_queue_depth gauge");
    for ((team, prio), n) in core.depth() {
        let _ = writeln!(
            out,
            "gpu_queue_depth{{team=\"{}\",priority=\"{prio}\"}} {n}",
            escape(&team)
        );
    }
    let _ = writeln!(
        out,
        "# HELP gpu_queue_wait_seconds Time jobs waited before starting."
    );
    let _ = writeln!(out, "# TYPE gpu_queue_wait_seconds histogram");
    let waits = &core.stats.waits;
    for b in BUCKETS {
        let n = waits.iter().filter(|w| **w <= b).count();
        let _ = writeln!(out, "gpu_queue_wait_seconds_bucket{{le=\"{b}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "gpu_queue_wait_seconds_bucket{{le=\"+Inf\"}} {}",
        waits.len()
    );
    let _ = writeln!(
        out,
        "gpu_queue_wait_seconds_sum {}",
        waits.iter().sum::<f64>()
    );
    let _ = writeln!(out, "gpu_queue_wait_seconds_count {}", waits.len());
    let _ = writeln!(
        out,
        "# HELP gpu_queue_preemptions_total Jobs preempted (requeued) and elastic workers shrunk."
    );
    let _ = writeln!(out, "# TYPE gpu_queue_preemptions_total counter");
    let _ = writeln!(
        out,
        "gpu_queue_preemptions_total {}",
        core.stats.preemptions
    );
    let _ = writeln!(
        out,
        "# HELP gpu_queue_requeued_lost_total Jobs requeued because the cluster lost a worker."
    );
    let _ = writeln!(out, "# TYPE gpu_queue_requeued_lost_total counter");
    let _ = writeln!(
        out,
        "gpu_queue_requeued_lost_total {}",
        core.stats.requeued_lost
    );
    let _ = writeln!(
        out,
        "# HELP gpu_queue_gpu_hours_total GPU-hours used per team."
    );
    let _ = writeln!(out, "# TYPE gpu_queue_gpu_hours_total counter");
    for (team, secs) in core.gpu_secs(now) {
        let _ = writeln!(
            out,
            "gpu_queue_gpu_hours_total{{team=\"{}\"}} {}",
            escape(&team),
            secs / 3600.0
        );
    }
    let budgets = core.budgets(now);
    type Gauge = (
        &'static str,
        &'static str,
        fn(&crate::budget::BudgetView) -> f64,
    );
    let gauges: [Gauge; 2] = [
        (
            "gpu_queue_budget",
            "A team's budget for one period (the agents' price units).",
            |b| b.budget,
        ),
        (
            "gpu_queue_budget_spent",
            "What a team spent in its budget's period so far.",
            |b| b.spent,
        ),
    ];
    for (name, help, value) in gauges.iter().filter(|_| !budgets.is_empty()) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for b in &budgets {
            let _ = writeln!(out, "{name}{{team=\"{}\"}} {}", escape(&b.team), value(b));
        }
    }
    let _ = writeln!(out, "# HELP gpu_queue_idle_while_eligible_gpu_seconds_total GPU-seconds idle while a waiting job could have started on them (outside the reservation, or on it for a job that ends before it starts).");
    let _ = writeln!(
        out,
        "# TYPE gpu_queue_idle_while_eligible_gpu_seconds_total counter"
    );
    let _ = writeln!(
        out,
        "gpu_queue_idle_while_eligible_gpu_seconds_total {}",
        core.stats.idle_while_eligible_gpu_secs
    );
    let _ = writeln!(out, "# HELP gpu_queue_reserved_idle_gpu_seconds_total GPU-seconds free but held for a blocked job's reservation while the rest of its GPUs drain.");
    let _ = writeln!(
        out,
        "# TYPE gpu_queue_reserved_idle_gpu_seconds_total counter"
    );
    let _ = writeln!(
        out,
        "gpu_queue_reserved_idle_gpu_seconds_total {}",
        core.stats.reserved_idle_gpu_secs
    );
    let _ = writeln!(out, "# HELP gpu_queue_settling_idle_gpu_seconds_total GPU-seconds free but kept for a gang over several agents while its offers settle (a second or so per such launch).");
    let _ = writeln!(
        out,
        "# TYPE gpu_queue_settling_idle_gpu_seconds_total counter"
    );
    let _ = writeln!(
        out,
        "gpu_queue_settling_idle_gpu_seconds_total {}",
        core.stats.settling_idle_gpu_secs
    );
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        out,
    )
        .into_response()
}

/// Escapes a Prometheus label value.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serves `app` in HTTPS on `listener`: TLS with `tls` (a client certificate is optional;
/// its identity reaches the handlers as [`PeerCert`]), HTTP/1.1 with a header deadline.
pub async fn serve_https(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
) -> std::io::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (tcp, remote) = listener.accept().await?;
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let stream =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::info!(%remote, "API: TLS handshake failed: {e}");
                        return;
                    }
                    Err(_) => return,
                };
            let cert = PeerCert(
                stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| gantry_transport::tls::identity_from_cert(c)),
            );
            let service = hyper::service::service_fn(
                move |mut req: axum::http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(cert.clone());
                    let mut app = app.clone();
                    async move {
                        use tower::Service;
                        app.call(req.map(axum::body::Body::new)).await
                    }
                },
            );
            let result = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(e) = result {
                tracing::debug!(%remote, "API connection ended: {e}");
            }
        });
    }
}

/// The HTTPS server configuration: `cert_pem`/`key_pem` (a server certificate for the
/// queue's host names), client certificates of the cluster CA (`tls_dir/ca.pem`) accepted but
/// not required (users may present a token instead).
pub fn https_config(
    tls_dir: &std::path::Path,
    cert_pem: &std::path::Path,
    key_pem: &std::path::Path,
) -> anyhow::Result<rustls::ServerConfig> {
    use anyhow::Context;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let roots = gantry_transport::tls::load_roots(tls_dir)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()?;
    let chain = CertificateDer::pem_file_iter(cert_pem)
        .with_context(|| format!("reading {}", cert_pem.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading {}", cert_pem.display()))?;
    let key = PrivateKeyDer::from_pem_file(key_pem)
        .with_context(|| format!("reading {}", key_pem.display()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}
