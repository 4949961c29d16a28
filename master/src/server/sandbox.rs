//! Task sandboxes through the master (issue 30): the operator (or the task's own framework)
//! asks the master, the master opens a sandbox stream on the agent's QUIC connection (protocol
//! v9, [`gantry_proto::SandboxRequest`]) and relays what the agent answers.
//!
//! - `GET /api/v1/tasks/{id}/files?path=&offset=&limit=`: a directory page (JSON).
//! - `GET /api/v1/tasks/{id}/files/read?path=&offset=&length=`: file bytes
//!   (`application/octet-stream`; `X-Gantry-Offset` and `X-Gantry-File-Size` headers), at most
//!   1 MiB; without `offset`, the last `length` bytes.
//! - `GET /api/v1/tasks/{id}/logs?stream=stdout|stderr&follow=&offset=&length=`: the task's
//!   output, streamed; with `follow=true` until the task has ended and all is sent (`tail -f`).
//! - `POST /api/v1/tasks/{id}/exec` `{"command": [..], "stdin": "..", "timeout_secs": N,
//!   "tty": {"rows": R, "cols": C}}` (`tty` optional: a pseudo-terminal, all output `stdout`):
//!   newline-delimited JSON, `{"stream":"stdout"|"stderr","data":".."}` lines then
//!   `{"exit_code":N,"signal":S}`.
//! - `GET /api/v1/tasks/{id}/exec/attach?command=["sh"]&rows=R&cols=C&timeout_secs=N` with
//!   `Connection: Upgrade` and `Upgrade: gantry-exec` (protocol v11): a live session. Once
//!   the agent has started the command the master answers `101 Switching Protocols` and both
//!   directions carry [`gantry_proto::exec_frame`] frames (stdin, end of input, window size,
//!   signal; stdout, stderr, exit, error), relayed to and from the agent's stream as
//!   [`SandboxInput`] and [`SandboxReply`] frames. Why our own frames on an HTTP/1.1 upgrade
//!   rather than a WebSocket: the same bounded length-prefixed framing as everything else,
//!   no new dependency (hyper already upgrades), and nothing a browser needs here. A session
//!   with no frame either way for [`EXEC_IDLE`] ends.
//!
//! Who may: an operator the ACLs grant `read_sandbox` (files, logs) or `exec`, or a client
//! certificate `framework:PRINCIPAL` of the framework that owns the task (its own tasks only).
//! Exec sessions count against `--http-max-exec-sessions-per-principal` (429 past it) and are
//! logged with the principal and the command. Why through the master rather than straight to
//! the agent: the master already authenticates operators (certificates, tokens, ACLs) and knows
//! where each task is; agents open no port and need no server certificate; the relay adds one
//! hop on a connection that already exists. Bounds: the agent's (streams per agent, exec
//! sessions per agent, write deadlines) and the operator port's (its write deadline closes a
//! reader that stops reading; the agent's stream is then reset).

use std::time::Duration;

use axum::extract::{Path, Query};
use axum::http::HeaderMap;
use gantry_proto::{
    exec_frame, SandboxErrorKind, SandboxInput, SandboxReply, SandboxRequest, TaskId, TtySize,
    SANDBOX_MAX_ENTRIES, SANDBOX_MAX_READ, SANDBOX_MAX_STDIN,
};
use gantry_transport::{FrameReceiver, FrameSender};

use super::*;
use crate::server::api::views;

/// How long opening a stream and the agent's first answer may take.
const AGENT_DEADLINE: Duration = Duration::from_secs(15);
/// A live exec with no frame in either direction for this long ends.
pub const EXEC_IDLE: Duration = Duration::from_secs(15 * 60);

pub(super) fn routes() -> super::super::routes::Routes<App> {
    super::super::routes::Routes::new()
        .get("/api/v1/tasks/{id}/files", files)
        .get("/api/v1/tasks/{id}/files/read", read_file)
        .get("/api/v1/tasks/{id}/logs", logs)
        .post("/api/v1/tasks/{id}/exec", exec)
        .get("/api/v1/tasks/{id}/exec/attach", attach)
}

/// The task a request is about: where it runs and whose it is.
struct Target {
    task_id: TaskId,
    agent: String,
}

/// Who is asking, once allowed: `operator:NAME` or `framework:PRINCIPAL`.
async fn authorize(
    app: &App,
    caller: &Caller,
    info: Option<&ConnInfo>,
    action: OperatorAction,
    key: &str,
) -> Result<(Target, String), ApiError> {
    let framework = match (caller, info.and_then(|i| i.certificate.as_ref())) {
        (Caller::Anonymous { .. }, Some(PeerIdentity::Framework(p))) => Some(p.clone()),
        _ => None,
    };
    let who = match &framework {
        Some(p) => format!("framework:{p}"),
        None => format!("operator:{}", app.may_write(caller, action)?),
    };
    let state = app.state().await?;
    let t = views::lookup_task(&state, key).map_err(|e| {
        let status = match e {
            views::Lookup::NotFound => StatusCode::NOT_FOUND,
            views::Lookup::Ambiguous(_) => StatusCode::CONFLICT,
        };
        ApiError::new(status, e.message("task", key))
    })?;
    if let Some(p) = &framework {
        let fid = &t["framework_id"];
        let owner = ["frameworks", "completed_frameworks"]
            .iter()
            .filter_map(|k| state[*k].as_array())
            .flatten()
            .find(|f| f["id"] == *fid)
            .and_then(|f| f["principal"].as_str());
        if owner != Some(p.as_str()) {
            tracing::warn!(principal = %p, task = key, "sandbox of another framework's task refused");
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("framework {p} may only see the sandboxes of its own tasks"),
            ));
        }
    }
    let task_id: TaskId = t["id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no task {key:?}")))?;
    let agent_id = t["agent_id"].as_str().unwrap_or_default();
    let agent = state["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["id"] == agent_id)
        .and_then(|a| a["name"].as_str())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("task {key:?} has no agent this master knows (never launched, or its agent is gone)"),
            )
        })?
        .to_string();
    Ok((Target { task_id, agent }, who))
}

/// Opens a sandbox stream on the task's agent, sends `req` and returns the agent's first reply
/// (refusals mapped to HTTP statuses) and the rest of the stream.
async fn ask(
    app: &App,
    target: &Target,
    req: &SandboxRequest,
) -> Result<(SandboxReply, FrameReceiver, FrameSender), ApiError> {
    let conn = app
        .shell
        .agent_conns
        .get(&target.agent)
        .map(|e| e.value().1.clone())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("agent {} is not connected to this master", target.agent),
            )
        })?;
    let agent_err = |e: String| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("agent {}: {e}", target.agent),
        )
    };
    let open = async {
        let (send, recv) = conn.open_bi().await.map_err(|e| agent_err(e.to_string()))?;
        let (mut tx, mut rx) = (FrameSender(send), FrameReceiver(recv));
        tx.send(req).await.map_err(|e| agent_err(e.to_string()))?;
        let first: SandboxReply = rx.recv().await.map_err(|e| agent_err(e.to_string()))?;
        Ok::<_, ApiError>((first, rx, tx))
    };
    let (first, rx, tx) = tokio::time::timeout(AGENT_DEADLINE, open)
        .await
        .map_err(|_| agent_err(format!("no answer within {AGENT_DEADLINE:?}")))??;
    if let SandboxReply::Error { kind, message } = &first {
        let status = match kind {
            SandboxErrorKind::NotFound => StatusCode::NOT_FOUND,
            SandboxErrorKind::Forbidden => StatusCode::FORBIDDEN,
            SandboxErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            SandboxErrorKind::NotRunning => StatusCode::CONFLICT,
            SandboxErrorKind::Busy => StatusCode::TOO_MANY_REQUESTS,
            SandboxErrorKind::Failed => StatusCode::BAD_GATEWAY,
        };
        return Err(ApiError::new(status, message.clone()));
    }
    Ok((first, rx, tx))
}

fn bad_query(e: axum::extract::rejection::QueryRejection) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, e.body_text())
}

type Q<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;
type Info = Option<axum::Extension<ConnInfo>>;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FilesQuery {
    #[serde(default)]
    path: String,
    #[serde(default)]
    offset: u32,
    limit: Option<u32>,
}

async fn files(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    info: Info,
    Path(id): Path<String>,
    query: Q<FilesQuery>,
) -> ApiResult {
    let Query(q) = query.map_err(bad_query)?;
    let caller = caller_of(caller);
    let info = info.map(|i| i.0);
    let (target, _) = authorize(
        &app,
        &caller,
        info.as_ref(),
        OperatorAction::ReadSandbox,
        &id,
    )
    .await?;
    let req = SandboxRequest::List {
        task_id: target.task_id,
        path: q.path.clone(),
        offset: q.offset,
        limit: q
            .limit
            .unwrap_or(SANDBOX_MAX_ENTRIES)
            .min(SANDBOX_MAX_ENTRIES),
    };
    match ask(&app, &target, &req).await?.0 {
        SandboxReply::Entries { entries, total } => Ok(Json(serde_json::json!({
            "task_id": target.task_id.to_string(),
            "agent": target.agent,
            "path": q.path,
            "offset": q.offset,
            "total": total,
            "entries": entries.iter().map(|e| serde_json::json!({
                "name": e.name, "kind": e.kind, "size": e.size,
                "mode": format!("{:o}", e.mode), "mtime_ms": e.mtime_ms,
            })).collect::<Vec<_>>(),
        }))),
        other => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("unexpected answer from the agent: {other:?}"),
        )),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    path: String,
    offset: Option<u64>,
    length: Option<u64>,
}

async fn read_file(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    info: Info,
    Path(id): Path<String>,
    query: Q<ReadQuery>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    let caller = caller_of(caller);
    let info = info.map(|i| i.0);
    let (target, _) = authorize(
        &app,
        &caller,
        info.as_ref(),
        OperatorAction::ReadSandbox,
        &id,
    )
    .await?;
    let req = SandboxRequest::Read {
        task_id: target.task_id,
        path: q.path,
        offset: q.offset,
        length: q.length.unwrap_or(SANDBOX_MAX_READ).min(SANDBOX_MAX_READ),
        follow: false,
    };
    let (mut reply, mut rx, _tx) = ask(&app, &target, &req).await?;
    let mut body = Vec::new();
    let (mut start, mut size) = (None, 0);
    loop {
        match reply {
            SandboxReply::Data {
                offset,
                data,
                size: s,
                eof,
            } => {
                start.get_or_insert(offset);
                size = s;
                body.extend_from_slice(&data);
                if eof || body.len() as u64 >= SANDBOX_MAX_READ {
                    break;
                }
            }
            SandboxReply::Error { message, .. } => {
                return Err(ApiError::new(StatusCode::BAD_GATEWAY, message))
            }
            _ => break,
        }
        reply = tokio::time::timeout(AGENT_DEADLINE, rx.recv())
            .await
            .map_err(|_| ApiError::new(StatusCode::BAD_GATEWAY, "the agent stopped answering"))?
            .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, e.to_string()))?;
    }
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert("x-gantry-offset", HeaderValue::from(start.unwrap_or(0)));
    headers.insert("x-gantry-file-size", HeaderValue::from(size));
    Ok((headers, body).into_response())
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    follow: bool,
    offset: Option<u64>,
    length: Option<u64>,
}

/// The data frames of a read stream as an HTTP body (ends at `eof`, an error, or when the
/// agent's stream does).
fn data_body(first: SandboxReply, rx: FrameReceiver, tx: FrameSender) -> Body {
    let stream = futures_util::stream::unfold(
        (Some(first), rx, tx, false),
        |(pending, mut rx, tx, done)| async move {
            if done {
                return None;
            }
            let reply = match pending {
                Some(r) => r,
                None => rx.recv::<SandboxReply>().await.ok()?,
            };
            match reply {
                SandboxReply::Data { data, eof, .. } => Some((
                    Ok::<_, std::io::Error>(Bytes::from(data)),
                    (None, rx, tx, eof),
                )),
                _ => None,
            }
        },
    );
    Body::from_stream(stream)
}

async fn logs(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    info: Info,
    Path(id): Path<String>,
    query: Q<LogsQuery>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    let path = match q.stream.as_deref() {
        None | Some("stdout") => "stdout",
        Some("stderr") => "stderr",
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("stream {other:?}: stdout or stderr"),
            ))
        }
    };
    let caller = caller_of(caller);
    let info = info.map(|i| i.0);
    let (target, _) = authorize(
        &app,
        &caller,
        info.as_ref(),
        OperatorAction::ReadSandbox,
        &id,
    )
    .await?;
    let req = SandboxRequest::Read {
        task_id: target.task_id,
        path: path.to_string(),
        // The whole log by default when following, else its last MiB.
        offset: q.offset.or(if q.follow && q.length.is_none() {
            Some(0)
        } else {
            None
        }),
        length: q.length.unwrap_or(SANDBOX_MAX_READ).min(SANDBOX_MAX_READ),
        follow: q.follow,
    };
    let (first, rx, tx) = ask(&app, &target, &req).await?;
    let mut resp = data_body(first, rx, tx).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecBody {
    command: Vec<String>,
    #[serde(default)]
    stdin: String,
    #[serde(default)]
    timeout_secs: u32,
    /// Run on a terminal of this size (`{"rows": R, "cols": C}`).
    #[serde(default)]
    tty: Option<TtySize>,
}

impl App {
    /// Takes a place for an exec session of `principal`, or 429 past
    /// `--http-max-exec-sessions-per-principal`.
    fn exec_slot(&self, principal: String) -> Result<SubscriberSlot, ApiError> {
        let limit = self.limits.max_exec_sessions_per_principal;
        let mut map = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(principal.clone()).or_insert(0);
        if limit > 0 && *n >= limit {
            return Err(ApiError::too_many(
                format!(
                    "{principal} already runs {limit} exec sessions \
                     (--http-max-exec-sessions-per-principal)"
                ),
                Duration::from_secs(5),
            ));
        }
        *n += 1;
        Ok(SubscriberSlot {
            map: self.execs.clone(),
            principal,
        })
    }
}

async fn exec(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    info: Info,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let caller = caller_of(caller);
    let info = info.map(|i| i.0);
    let (target, who) = authorize(&app, &caller, info.as_ref(), OperatorAction::Exec, &id).await?;
    let req: ExecBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("exec body: {e}")))?;
    if req.command.is_empty() || req.command[0].is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "exec: an empty command",
        ));
    }
    if req.stdin.len() > SANDBOX_MAX_STDIN {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("exec: standard input is limited to {SANDBOX_MAX_STDIN} bytes"),
        ));
    }
    if let Some(t) = req.tty {
        if t.rows == 0 || t.cols == 0 {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "exec: a terminal needs rows and columns above 0",
            ));
        }
    }
    let slot = app.exec_slot(who.clone())?;
    tracing::info!(principal = %who, task = %target.task_id, agent = %target.agent, command = ?req.command, "exec in a task");
    let sreq = SandboxRequest::Exec {
        task_id: target.task_id,
        command: req.command,
        stdin: req.stdin.into_bytes(),
        principal: who,
        timeout_secs: req.timeout_secs,
        tty: req.tty,
    };
    let (first, rx, tx) = ask(&app, &target, &sreq).await?;
    let stream = futures_util::stream::unfold(
        (Some(first), rx, tx, slot, false),
        |(pending, mut rx, tx, slot, done)| async move {
            if done {
                return None;
            }
            let reply = match pending {
                Some(r) => r,
                None => match rx.recv::<SandboxReply>().await {
                    Ok(r) => r,
                    Err(e) => SandboxReply::Error {
                        kind: SandboxErrorKind::Failed,
                        message: format!("the agent's stream ended: {e}"),
                    },
                },
            };
            let (line, end) = match reply {
                SandboxReply::Output { stream, data } => (
                    serde_json::json!({
                        "stream": if stream == 2 { "stderr" } else { "stdout" },
                        "data": String::from_utf8_lossy(&data),
                    }),
                    false,
                ),
                SandboxReply::Exited { code, signal } => (
                    serde_json::json!({"exit_code": code, "signal": signal}),
                    true,
                ),
                SandboxReply::Error { message, .. } => {
                    (serde_json::json!({"error": message}), true)
                }
                other => (
                    serde_json::json!({"error": format!("unexpected answer: {other:?}")}),
                    true,
                ),
            };
            let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
            bytes.push(b'\n');
            Some((
                Ok::<_, std::io::Error>(Bytes::from(bytes)),
                (None, rx, tx, slot, end),
            ))
        },
    );
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AttachQuery {
    /// The command as a JSON array of strings.
    command: String,
    rows: Option<u16>,
    cols: Option<u16>,
    #[serde(default)]
    timeout_secs: u32,
}

/// The command of a live exec: a JSON array of strings, not empty.
fn attach_command(text: &str) -> Result<Vec<String>, ApiError> {
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, format!("exec: {m}"));
    let command: Vec<String> = serde_json::from_str(text)
        .map_err(|e| bad(format!("command must be a JSON array of strings: {e}")))?;
    if command.first().is_none_or(|c| c.is_empty()) {
        return Err(bad("an empty command".into()));
    }
    Ok(command)
}

/// What one relay direction reports to the session loop.
enum Relay {
    /// From the client: input for the agent.
    Input(SandboxInput),
    /// From the client: a refused frame (too large, unknown kind) or the connection's end.
    ClientGone(Option<String>),
    /// From the agent.
    Reply(SandboxReply),
}

/// Reads the client's frames into `out` until its connection ends or a frame is refused.
async fn read_client<R: tokio::io::AsyncRead + Unpin>(
    mut r: R,
    out: tokio::sync::mpsc::Sender<Relay>,
) {
    use tokio::io::AsyncReadExt;
    loop {
        let mut h = [0u8; 5];
        if r.read_exact(&mut h).await.is_err() {
            let _ = out.send(Relay::ClientGone(None)).await;
            return;
        }
        let (kind, len) = match exec_frame::header(h) {
            Ok(x) => x,
            Err(e) => {
                let _ = out.send(Relay::ClientGone(Some(e))).await;
                return;
            }
        };
        let mut payload = vec![0u8; len];
        if r.read_exact(&mut payload).await.is_err() {
            let _ = out.send(Relay::ClientGone(None)).await;
            return;
        }
        let input = match (kind, len) {
            (exec_frame::STDIN, _) => SandboxInput::Stdin(payload),
            (exec_frame::STDIN_CLOSE, 0) => SandboxInput::StdinClose,
            (exec_frame::RESIZE, 4) => SandboxInput::Resize(TtySize {
                rows: u16::from_be_bytes([payload[0], payload[1]]),
                cols: u16::from_be_bytes([payload[2], payload[3]]),
            }),
            (exec_frame::SIGNAL, 4) => SandboxInput::Signal(i32::from_be_bytes([
                payload[0], payload[1], payload[2], payload[3],
            ])),
            (k, n) => {
                let e =
                    format!("a frame of kind {k} with {n} bytes: not a frame this session takes");
                let _ = out.send(Relay::ClientGone(Some(e))).await;
                return;
            }
        };
        if out.send(Relay::Input(input)).await.is_err() {
            return;
        }
    }
}

async fn attach(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    info: Info,
    Path(id): Path<String>,
    query: Q<AttachQuery>,
    mut req: axum::extract::Request,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    let command = attach_command(&q.command)?;
    let tty = match (q.rows, q.cols) {
        (None, None) => None,
        (Some(rows), Some(cols)) if rows > 0 && cols > 0 => Some(TtySize { rows, cols }),
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "exec: a terminal needs both rows and cols, above 0",
            ))
        }
    };
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gantry-exec"));
    if !upgrade {
        return Err(ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "exec/attach: send `Connection: Upgrade` and `Upgrade: gantry-exec`",
        ));
    }
    let caller = caller_of(caller);
    let info = info.map(|i| i.0);
    let (target, who) = authorize(&app, &caller, info.as_ref(), OperatorAction::Exec, &id).await?;
    let slot = app.exec_slot(who.clone())?;
    tracing::info!(principal = %who, task = %target.task_id, agent = %target.agent, ?command, ?tty, "live exec in a task");
    let sreq = SandboxRequest::ExecLive {
        task_id: target.task_id,
        command,
        principal: who.clone(),
        timeout_secs: q.timeout_secs,
        tty,
    };
    let (first, mut rx, mut tx) = ask(&app, &target, &sreq).await?;
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _slot = slot;
        let io = match on_upgrade.await {
            Ok(io) => hyper_util::rt::TokioIo::new(io),
            Err(e) => {
                tracing::info!(principal = %who, "live exec: the upgrade failed: {e}");
                return;
            }
        };
        let (r, mut w) = tokio::io::split(io);
        let (out, mut events) = tokio::sync::mpsc::channel::<Relay>(16);
        let client = tokio::spawn(read_client(r, out.clone()));
        let agent = tokio::spawn(async move {
            let mut reply = Some(first);
            loop {
                let r = match reply.take() {
                    Some(r) => r,
                    None => match rx.recv::<SandboxReply>().await {
                        Ok(r) => r,
                        Err(e) => SandboxReply::Error {
                            kind: SandboxErrorKind::Failed,
                            message: format!("the agent's stream ended: {e}"),
                        },
                    },
                };
                let end = !matches!(r, SandboxReply::Output { .. });
                if out.send(Relay::Reply(r)).await.is_err() || end {
                    return;
                }
            }
        });
        let frame =
            |kind: u8, v: serde_json::Value| exec_frame::encode(kind, v.to_string().as_bytes());
        let end: Option<Vec<u8>> = loop {
            let ev = match tokio::time::timeout(EXEC_IDLE, events.recv()).await {
                Ok(Some(ev)) => ev,
                Ok(None) => break None,
                Err(_) => {
                    break Some(frame(
                        exec_frame::ERROR,
                        serde_json::json!({"error": format!("no input or output for {EXEC_IDLE:?}: the session ends")}),
                    ))
                }
            };
            match ev {
                Relay::Input(input) => {
                    if tx.send(&input).await.is_err() {
                        break Some(frame(
                            exec_frame::ERROR,
                            serde_json::json!({"error": "the agent's stream ended"}),
                        ));
                    }
                }
                Relay::ClientGone(None) => break None,
                Relay::ClientGone(Some(e)) => {
                    tracing::warn!(principal = %who, "live exec: {e}");
                    break Some(frame(exec_frame::ERROR, serde_json::json!({"error": e})));
                }
                Relay::Reply(SandboxReply::Output { stream, data }) => {
                    if data.is_empty() {
                        continue;
                    }
                    let kind = if stream == 2 {
                        exec_frame::STDERR
                    } else {
                        exec_frame::STDOUT
                    };
                    if w.write_all(&exec_frame::encode(kind, &data)).await.is_err() {
                        break None;
                    }
                }
                Relay::Reply(SandboxReply::Exited { code, signal }) => {
                    break Some(frame(
                        exec_frame::EXIT,
                        serde_json::json!({"exit_code": code, "signal": signal}),
                    ))
                }
                Relay::Reply(SandboxReply::Error { message, .. }) => {
                    break Some(frame(
                        exec_frame::ERROR,
                        serde_json::json!({"error": message}),
                    ))
                }
                Relay::Reply(other) => {
                    break Some(frame(
                        exec_frame::ERROR,
                        serde_json::json!({"error": format!("unexpected answer: {other:?}")}),
                    ))
                }
            }
        };
        if let Some(bytes) = end {
            let _ = w.write_all(&bytes).await;
        }
        let _ = w.shutdown().await;
        client.abort();
        agent.abort();
        tracing::info!(principal = %who, "live exec ended");
    });
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    resp.headers_mut()
        .insert(header::UPGRADE, HeaderValue::from_static("gantry-exec"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_exec_command_is_a_json_array_of_strings_not_empty() {
        assert_eq!(
            attach_command(r#"["sh","-c","echo hi"]"#).ok(),
            Some(vec!["sh".to_string(), "-c".into(), "echo hi".into()])
        );
        for bad in ["sh", "[]", r#"[""]"#, "[1]", r#"{"a":1}"#] {
            let e = attach_command(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
