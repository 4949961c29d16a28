//! Maintenance endpoints of the operator API (see `crate::state::maintenance` for the rules):
//!
//! - `POST /api/v1/agents/{id}/drain` with an optional body `{"deadline_secs": N}`: drain
//!   the agent (id or name), killing what is left after N seconds (never when omitted);
//!   ACL action `drain`.
//! - `POST /api/v1/agents/{id}/undrain`: offer it again; ACL action `undrain`.
//! (`POST /api/v1/agents/{id}/gone`, in `api`, removes an agent for good: the core's
//! maintenance mark-gone.)
//! - `GET /api/v1/maintenance/drains`: every agent under maintenance (`DRAINING` / `DRAINED`, deadline,
//!   tasks left, frameworks notified) and the agents marked gone.
//!
//! Writes answer with the maintenance view after the change. Errors are JSON
//! `{"error": CODE, "message": TEXT}`: 404 `not_found` for an unknown agent, 400
//! `bad_request` for a bad body or deadline, 409 `conflict` to undrain an agent that is not
//! draining, 503 `unavailable` on a standby.

use axum::extract::Path;

use super::*;
use crate::state::{MaintenanceCommand, MaintenanceError};

/// Body of `POST /api/v1/agents/{id}/drain` (may be empty).
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DrainRequest {
    /// Seconds until the tasks left are killed; none: never.
    #[serde(default)]
    deadline_secs: Option<u64>,
}

fn maintenance_error(e: MaintenanceError) -> ApiError {
    let status = match e {
        MaintenanceError::UnknownAgent(_) => StatusCode::NOT_FOUND,
        MaintenanceError::NotDraining(_) => StatusCode::CONFLICT,
        MaintenanceError::DeadlineTooLong(_) => StatusCode::BAD_REQUEST,
        MaintenanceError::NotLeader => StatusCode::SERVICE_UNAVAILABLE,
    };
    ApiError::new(status, e.to_string())
}

async fn ask(app: &App, cmd: Option<MaintenanceCommand>) -> ApiResult {
    let (tx, rx) = oneshot::channel();
    app.shell
        .core
        .send(CoreEvent::Maintenance(cmd, tx))
        .await
        .map_err(|_| unavailable())?;
    rx.await
        .map_err(|_| unavailable())?
        .map(Json)
        .map_err(maintenance_error)
}

async fn write(app: &App, who: String, cmd: MaintenanceCommand) -> ApiResult {
    let what = format!("{cmd:?}");
    let view = ask(app, Some(cmd)).await?;
    tracing::info!(operator = %who, "maintenance: {what}");
    Ok(view)
}

pub(super) async fn drain_handler(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    Path(agent): Path<String>,
    body: Bytes,
) -> ApiResult {
    let who = app.may_write(&caller_of(caller), OperatorAction::Drain)?;
    let req: DrainRequest = if body.iter().all(u8::is_ascii_whitespace) {
        DrainRequest::default()
    } else {
        parse_json(&body)?
    };
    write(
        &app,
        who,
        MaintenanceCommand::Drain {
            agent,
            deadline_secs: req.deadline_secs,
        },
    )
    .await
}

pub(super) async fn undrain_handler(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    Path(agent): Path<String>,
) -> ApiResult {
    let who = app.may_write(&caller_of(caller), OperatorAction::Undrain)?;
    write(&app, who, MaintenanceCommand::Undrain { agent }).await
}

pub(super) async fn view_handler(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
) -> ApiResult {
    app.may_read(&caller_of(caller))?;
    ask(&app, None).await
}
