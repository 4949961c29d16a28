//! Persistent volumes through the master (issue 32, protocol v12): the master asks the agent
//! holding them on a sandbox stream of the agent's connection ([`SandboxRequest::Volume`]) and
//! relays the one answer.
//!
//! - `GET /api/v1/agents/{id}/volumes` (id or name; a read): every persistent volume on the
//!   agent, `{"agent_id", "agent", "volumes": [{"framework", "name", "path", "used_by": [task
//!   ids]}], "total"}`.
//! - `DELETE /api/v1/agents/{id}/volumes/{framework}/{name}` (ACL action `destroy_volume`):
//!   removes the volume and its data. 200 `{"destroyed": true, ...}`; 404 when there is no such
//!   volume; 409 while a container on the agent mounts it (the message names the tasks); 400
//!   for a name the protocol refuses.
//! - A framework's [`FrameworkToMaster::DestroyVolume`](gantry_proto::FrameworkToMaster):
//!   the core checks the agent and names the framework from the connection
//!   ([`crate::state::Output::Volume`]); [`for_framework`] asks the agent and sends the
//!   framework [`MasterToFramework::VolumeDestroyed`].
//!
//! Errors as elsewhere on the operator port: 404 for an unknown agent, 503 when it is not
//! connected, 502 when it does not answer within [`AGENT_DEADLINE`].

use std::time::Duration;

use axum::extract::Path;
use gantry_proto::{
    AgentId, MasterToFramework, SandboxReply, SandboxRequest, VolumeDestroyed, VolumeOutcome,
    VolumeReply, VolumeRequest,
};
use gantry_transport::{FrameReceiver, FrameSender};

use super::*;

/// How long opening the stream and the agent's answer may take.
pub const AGENT_DEADLINE: Duration = Duration::from_secs(15);

pub(super) fn routes() -> super::super::routes::Routes<App> {
    super::super::routes::Routes::new()
        .get("/api/v1/agents/{id}/volumes", list)
        .delete("/api/v1/agents/{id}/volumes/{framework}/{name}", destroy)
}

/// Why the agent could not be asked.
#[derive(Debug)]
pub(crate) enum AskError {
    /// Not connected to this master.
    NotConnected(String),
    /// The stream failed, the agent refused, or no answer in time.
    Agent(String),
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::NotConnected(a) => write!(f, "agent {a} is not connected to this master"),
            AskError::Agent(e) => f.write_str(e),
        }
    }
}

/// Asks the agent `agent` (its connection's name) one volume request.
pub(crate) async fn ask(
    shell: &Shell,
    agent: &str,
    req: VolumeRequest,
) -> Result<VolumeReply, AskError> {
    let conn = shell
        .agent_conns
        .get(agent)
        .map(|e| e.value().1.clone())
        .ok_or_else(|| AskError::NotConnected(agent.to_string()))?;
    let err = |e: String| AskError::Agent(format!("agent {agent}: {e}"));
    let exchange = async {
        let (send, recv) = conn.open_bi().await.map_err(|e| err(e.to_string()))?;
        let (mut tx, mut rx) = (FrameSender(send), FrameReceiver(recv));
        tx.send(&SandboxRequest::Volume(req))
            .await
            .map_err(|e| err(e.to_string()))?;
        let _ = tx.0.finish();
        match rx.recv::<SandboxReply>().await {
            Ok(SandboxReply::Volume(r)) => Ok(r),
            Ok(SandboxReply::Error { message, .. }) => Err(err(message)),
            Ok(other) => Err(err(format!("unexpected answer {other:?}"))),
            Err(e) => Err(err(e.to_string())),
        }
    };
    tokio::time::timeout(AGENT_DEADLINE, exchange)
        .await
        .map_err(|_| err(format!("no answer within {AGENT_DEADLINE:?}")))?
}

/// Runs a framework's destroy (from [`crate::state::Output::Volume`]) and sends the framework
/// on `reply` its [`MasterToFramework::VolumeDestroyed`].
pub(crate) async fn for_framework(
    shell: Shell,
    reply: crate::state::ConnId,
    agent: String,
    agent_id: AgentId,
    request: VolumeRequest,
) {
    let name = match &request {
        VolumeRequest::Destroy { name, .. } => name.clone(),
        VolumeRequest::List => String::new(),
    };
    let outcome = match ask(&shell, &agent, request).await {
        Ok(VolumeReply::Destroy(o)) => o,
        Ok(VolumeReply::List { .. }) => VolumeOutcome::Failed("unexpected answer".into()),
        Err(e) => VolumeOutcome::Failed(e.to_string()),
    };
    let msg = MasterToFramework::VolumeDestroyed(VolumeDestroyed {
        agent_id,
        name,
        outcome,
    });
    let Some(peer) = shell.conns.get(&reply) else {
        tracing::debug!(conn = reply, "framework gone before its volume answer");
        return;
    };
    if peer
        .outbox
        .try_send(super::super::Outbound::Framework(msg))
        .is_err()
    {
        tracing::warn!(peer = %peer.label, "volume answer not sent: the framework's outbox is full or closed");
    }
}

/// The agent `key` (id or name) as `(id, name)`, from the core's view.
async fn find_agent(app: &App, key: &str) -> Result<(String, String), ApiError> {
    let state = app.state().await?;
    state["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["id"] == key || a["name"] == key)
        .and_then(|a| {
            Some((
                a["id"].as_str()?.to_string(),
                a["name"].as_str()?.to_string(),
            ))
        })
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no agent {key:?}")))
}

fn ask_error(e: AskError) -> ApiError {
    let status = match e {
        AskError::NotConnected(_) => StatusCode::SERVICE_UNAVAILABLE,
        AskError::Agent(_) => StatusCode::BAD_GATEWAY,
    };
    ApiError::new(status, e.to_string())
}

async fn list(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    Path(key): Path<String>,
) -> ApiResult {
    app.may_read(&caller_of(caller))?;
    let (id, name) = find_agent(&app, &key).await?;
    match ask(&app.shell, &name, VolumeRequest::List)
        .await
        .map_err(ask_error)?
    {
        VolumeReply::List { volumes, total } => Ok(Json(serde_json::json!({
            "agent_id": id,
            "agent": name,
            "volumes": volumes.iter().map(|v| serde_json::json!({
                "framework": v.framework,
                "name": v.name,
                "path": v.path,
                "used_by": v.used_by,
            })).collect::<Vec<_>>(),
            "total": total,
        }))),
        other => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("agent {name}: unexpected answer {other:?}"),
        )),
    }
}

async fn destroy(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    Path((key, framework, volume)): Path<(String, String, String)>,
) -> ApiResult {
    let who = app.may_write(&caller_of(caller), OperatorAction::DestroyVolume)?;
    let (id, name) = find_agent(&app, &key).await?;
    let req = VolumeRequest::Destroy {
        framework: framework.clone(),
        name: volume.clone(),
        principal: format!("operator:{who}"),
    };
    let outcome = match ask(&app.shell, &name, req).await.map_err(ask_error)? {
        VolumeReply::Destroy(o) => o,
        other => {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("agent {name}: unexpected answer {other:?}"),
            ))
        }
    };
    tracing::info!(operator = %who, agent = %name, %framework, volume = %volume, ?outcome, "destroy persistent volume");
    let message = outcome.describe(&framework, &volume);
    match outcome {
        VolumeOutcome::Destroyed => Ok(Json(serde_json::json!({
            "agent_id": id,
            "agent": name,
            "framework": framework,
            "name": volume,
            "destroyed": true,
        }))),
        VolumeOutcome::NotFound => Err(ApiError::new(StatusCode::NOT_FOUND, message)),
        VolumeOutcome::InUse { .. } => Err(ApiError::new(StatusCode::CONFLICT, message)),
        // A name the agent refuses is the caller's mistake; anything else the agent's.
        VolumeOutcome::Failed(why) if why.contains("1 to 64 bytes") => {
            Err(ApiError::new(StatusCode::BAD_REQUEST, why))
        }
        VolumeOutcome::Failed(why) => Err(ApiError::new(StatusCode::BAD_GATEWAY, why)),
    }
}
