//! The queue's API on its own port (plain HTTP, axum as in the master):
//!
//! | method and path       | what                                                        |
//! |-----------------------|-------------------------------------------------------------|
//! | `POST /jobs`          | submit a [`JobSpec`] (JSON); answers `{"id": N}`             |
//! | `GET /jobs`           | every job ([`JobView`]s)                                     |
//! | `GET /jobs/{id}`      | one job                                                      |
//! | `DELETE /jobs/{id}`   | cancel it (its workers are killed)                           |
//! | `GET /stats`          | counters as JSON (GPU-seconds per team, preemptions, jobs requeued after a lost worker, idle) |
//! | `GET /metrics`        | Prometheus text: queue depth per team and priority, wait    |
//! |                       | histogram, preemptions, GPU-hours per team, idle-while-waiting |
//! | `POST /shutdown`      | tear the framework down (`gantry-queue shutdown`)            |
//!
//! Every change is committed to the store before the answer is sent.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::model::{JobSpec, JobView};
use crate::runtime::Shared;

/// Jobs not yet ended the queue accepts; more submissions get 429.
pub const MAX_ACTIVE_JOBS: usize = 50_000;

/// The API's routes. The API has no authentication: bind it to a loopback or otherwise
/// protected address (the default is 127.0.0.1:8700), or put an authenticating proxy in front.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/jobs", get(list).post(submit))
        .route("/jobs/{id}", get(show).delete(cancel))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/shutdown", axum::routing::post(shutdown))
        .with_state(shared)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

async fn submit(State(s): State<Arc<Shared>>, Json(spec): Json<JobSpec>) -> Response {
    if let Some(problem) = spec.problem() {
        return error(StatusCode::BAD_REQUEST, problem);
    }
    if let Some(problem) = s.core().dependency_problem(&spec) {
        return error(StatusCode::BAD_REQUEST, problem);
    }
    if let Some(why) = s.core().never_fits(&spec) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("no agent of the cluster can ever run it: {why}"),
        );
    }
    if s.core().active_jobs() >= MAX_ACTIVE_JOBS {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            format!("the queue holds {MAX_ACTIVE_JOBS} jobs not yet ended; try again later"),
        );
    }
    let id = s.with(|core, now| core.submit(spec, now));
    (StatusCode::CREATED, Json(json!({ "id": id }))).into_response()
}

async fn shutdown(State(s): State<Arc<Shared>>) -> Response {
    match s.shutdown() {
        Ok(()) => Json(json!({ "shutdown": true })).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn list(State(s): State<Arc<Shared>>) -> Json<Vec<JobView>> {
    Json(s.core().views(Instant::now()))
}

async fn show(State(s): State<Arc<Shared>>, Path(id): Path<u64>) -> Response {
    match s.core().view(id, Instant::now()) {
        Some(v) => Json(v).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no job {id}")),
    }
}

async fn cancel(State(s): State<Arc<Shared>>, Path(id): Path<u64>) -> Response {
    let known = s.core().view(id, Instant::now()).is_some();
    if !known {
        return error(StatusCode::NOT_FOUND, format!("no job {id}"));
    }
    match s.with(|core, now| match core.cancel(id, now) {
        Some(actions) => (true, actions),
        None => (false, Vec::new()),
    }) {
        true => Json(json!({ "id": id, "state": "CANCELLED" })).into_response(),
        false => error(StatusCode::CONFLICT, format!("job {id} has already ended")),
    }
}

async fn stats(State(s): State<Arc<Shared>>) -> Response {
    let core = s.core();
    let now = Instant::now();
    Json(json!({
        "gpu_secs": core.gpu_secs(now),
        "preemptions": core.stats.preemptions,
        "requeued_lost": core.stats.requeued_lost,
        "idle_while_eligible_gpu_secs": core.stats.idle_while_eligible_gpu_secs,
        "idle_while_eligible_secs": core.stats.idle_while_eligible_secs,
        "waits": core.stats.waits,
    }))
    .into_response()
}

/// Wait histogram buckets, seconds.
const BUCKETS: [f64; 10] = [
    1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0,
];

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let core = s.core();
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
    let _ = writeln!(out, "# HELP gpu_queue_idle_while_eligible_gpu_seconds_total GPU-seconds idle while a waiting job could have used them.");
    let _ = writeln!(
        out,
        "# TYPE gpu_queue_idle_while_eligible_gpu_seconds_total counter"
    );
    let _ = writeln!(
        out,
        "gpu_queue_idle_while_eligible_gpu_seconds_total {}",
        core.stats.idle_while_eligible_gpu_secs
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
