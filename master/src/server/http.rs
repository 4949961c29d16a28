//! The operator HTTP API: `/health` (public), `/state` and `/metrics` (reads), `POST /weights`
//! and `POST /quota` (writes), the versioned API `/api/v1/…` with its event stream
//! ([`super::api`]), the maintenance endpoints under `/api/v1` (`maintenance.rs`: drain,
//! undrain, `GET /api/v1/maintenance/drains`) and the web dashboard `/ui` (`ui`), served
//! over HTTPS with the cluster CA.
//!
//! ```text
//! TCP accept (connection slots: all, unauthenticated, per address; `http_guard::Admission`)
//!   -> TLS handshake (one deadline from accept; optional client certificate: an operator
//!      certificate authenticates the connection at once)
//!   -> hyper HTTP/1.1 (header read deadline; every write under the write deadline)
//!   -> authenticate (operator certificate, bearer token or dashboard session; failed
//!      credentials limited per address: 429) -> bounded body (size + read deadline)
//!   -> authorize (ACL) -> core loop
//! ```
//!
//! Who is calling: a client certificate of kind `operator:NAME` signed by the cluster CA, or
//! `Authorization: Bearer TOKEN` with a token from `--operator-tokens` (a presented token wins
//! over a certificate; a wrong one is refused even with a good certificate). A browser may
//! carry a dashboard session (the `gantry_session` cookie the dashboard's login sets: a random
//! id the master maps to the operator, never the token); the session authenticates reads
//! (`GET`) only, so a forged cross-site request can change nothing. A connection that
//! authenticated leaves the unauthenticated share of the connection slots (the rest is
//! reserved for operators). Every write needs
//! the ACL grant ([`Acls::may_operate`]); reads need an authenticated caller unless
//! `public_reads`; `/health` is open to load balancers. Errors are JSON
//! `{"error": CODE, "message": TEXT}`.
//!
//! Plain HTTP ([`HttpConfig::tls`] `None`) is for a loopback address only (the binary refuses
//! anything else); the same authentication applies (a token, since there are no certificates).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use gantry_transport::tls;
use gantry_transport::PeerIdentity;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{oneshot, watch};

use super::http_guard::{AuthLimiter, ConnGuard, WriteDeadline};
use super::{CoreEvent, Shell};

/// Maintenance endpoints (`/api/v1/agents/{agent}/drain`, ...); a child module so it shares
/// this file's authentication and error types.
#[path = "maintenance.rs"]
mod maintenance;
/// Roles' weights and quotas (`/weights`, `/quota`).
#[path = "http_roles.rs"]
mod roles;
/// Task sandboxes (`/api/v1/tasks/{id}/files`, `…/logs`, `…/exec`), proxied to the agent.
#[path = "sandbox.rs"]
mod sandbox;
/// Persistent volumes (`/api/v1/agents/{id}/volumes`) and frameworks' destroys, asked of the agent.
#[path = "volumes.rs"]
pub(super) mod volumes;
use crate::election::health;
use crate::security::identity::{self, Denied};
pub(super) use crate::security::Caller;
use crate::security::{Acls, OperatorAction, Sessions};
pub use crate::security::{HttpLimits, SharedTokens};
use crate::state::{OperatorCommand, OperatorRejection, QuotaPart};
pub(super) use roles::{quota_handler, weights_handler};

/// How the operator API is served.
#[derive(Clone)]
pub struct HttpConfig {
    /// HTTPS with this configuration; `None` is plain HTTP (loopback only, `--http-insecure`).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Bearer tokens accepted (hashed); the shell may replace them while serving (the
    /// binary reloads `--operator-tokens` on SIGHUP).
    pub tokens: SharedTokens,
    /// Serve `/state` to unauthenticated callers too.
    pub public_reads: bool,
    pub limits: HttpLimits,
}

impl HttpConfig {
    /// HTTPS with the master's TLS material (client certificates optional).
    pub fn https(material: &tls::TlsMaterial) -> Result<Self, tls::TlsError> {
        Ok(Self {
            tls: Some(Arc::new(tls::https_server_config(material)?)),
            tokens: SharedTokens::default(),
            public_reads: false,
            limits: HttpLimits::default(),
        })
    }
}

/// The HTTP listener and how to serve it: what [`super::run`] takes.
pub struct HttpEndpoint {
    pub listener: tokio::net::TcpListener,
    pub config: HttpConfig,
}

/// Shared by the handlers.
#[derive(Clone)]
pub(super) struct App {
    pub(super) shell: Shell,
    acls: Arc<Acls>,
    pub(super) tokens: SharedTokens,
    public_reads: bool,
    limits: HttpLimits,
    admission: super::http_guard::Admission,
    auth_limiter: Arc<AuthLimiter>,
    pub(super) sessions: Arc<Sessions>,
    /// Open `/api/v1/events` subscribers per principal.
    subscribers: Arc<Mutex<HashMap<String, usize>>>,
    /// Running exec sessions per principal.
    execs: Arc<Mutex<HashMap<String, usize>>>,
}

/// What the connection knows before any request: the operator named by its client certificate
/// (or what else the certificate was, to explain a refusal), and its slots.
#[derive(Clone, Debug)]
pub(super) struct ConnInfo {
    pub(super) remote: SocketAddr,
    certificate: Option<PeerIdentity>,
    guard: Option<Arc<ConnGuard>>,
}

/// A JSON error response `{"error": CODE, "message": TEXT}`.
#[derive(Debug)]
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    message: String,
    /// `Retry-After` seconds (429).
    retry_after: Option<u64>,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 429 with `Retry-After` (whole seconds, at least 1).
    pub(super) fn too_many(message: impl Into<String>, retry_after: Duration) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            retry_after: Some(retry_after.as_secs_f64().ceil().max(1.0) as u64),
        }
    }

    fn code(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "bad_request",
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::CONFLICT => "conflict",
            StatusCode::REQUEST_TIMEOUT => "request_timeout",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::TOO_MANY_REQUESTS => "too_many_requests",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            _ => "error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.code(), "message": self.message});
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        match self.status {
            StatusCode::UNAUTHORIZED => {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"gantry\""),
                );
            }
            // The rest of the request was not read: do not reuse the connection.
            StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE => {
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        resp
    }
}

pub(super) type ApiResult = Result<Json<serde_json::Value>, ApiError>;

/// Every route the operator port serves, with its table (`super::routes`).
pub(super) fn all_routes() -> super::routes::Routes<App> {
    super::routes::Routes::new()
        .get("/health", health_handler)
        .get("/state", state_handler)
        .post("/weights", weights_handler)
        .post("/quota", quota_handler)
        // Maintenance and drain (issue 14 item 3): handlers in server/maintenance.rs.
        .post("/api/v1/agents/{id}/drain", maintenance::drain_handler)
        .post("/api/v1/agents/{id}/undrain", maintenance::undrain_handler)
        .get("/api/v1/maintenance/drains", maintenance::view_handler)
        // Task sandboxes (issue 30 item 1): server/sandbox.rs.
        .merge(sandbox::routes())
        .merge(volumes::routes())
        // Metrics (issue 14 item 1): Prometheus text exposition, a read.
        .get("/metrics", metrics_handler)
        // Operator API v1 and its event stream.
        .merge(super::api::routes())
        // Web dashboard.
        .merge(super::ui::routes())
}

fn router(app: App) -> Router {
    all_routes()
        .router
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint") })
        // Outermost first: who is calling (before reading a body), then the bounded body.
        // (The /ui routes also get the dashboard's security headers, in ui::routes.)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            bounded_body,
        ))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            authenticate,
        ))
        .with_state(app)
}

/// Serves the operator API until `stop` turns true.
pub(super) async fn serve(
    endpoint: HttpEndpoint,
    shell: Shell,
    acls: Acls,
    mut stop: watch::Receiver<bool>,
) {
    let HttpEndpoint { listener, config } = endpoint;
    let limits = &config.limits;
    let admission = super::http_guard::Admission::new(
        limits.max_connections,
        limits.reserved_connections,
        limits.max_connections_per_address,
    );
    let app = App {
        shell,
        acls: Arc::new(acls),
        tokens: config.tokens,
        public_reads: config.public_reads,
        limits: limits.clone(),
        admission: admission.clone(),
        auth_limiter: Arc::new(AuthLimiter::new(limits.auth)),
        sessions: Arc::new(Sessions::new(limits.max_sessions, limits.session_lifetime)),
        subscribers: Arc::default(),
        execs: Arc::default(),
    };
    let router = router(app);
    let acceptor = config.tls.map(tokio_rustls::TlsAcceptor::from);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let (tcp, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!("http accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let guard = match admission.admit(remote.ip()) {
            Ok(g) => Arc::new(g),
            Err(why) => {
                tracing::debug!(%remote, "operator API connection refused: {why}");
                continue;
            }
        };
        let router = router.clone();
        let acceptor = acceptor.clone();
        let limits = config.limits.clone();
        conns.spawn(async move {
            let held = guard.clone();
            tokio::select! {
                // Unauthenticated and the oldest when room was needed: closed.
                _ = held.evicted() => {
                    tracing::debug!(%remote, "operator API: unauthenticated connection closed for room");
                }
                _ = serve_connection(tcp, remote, guard, acceptor, router, limits) => {}
            }
        });
    }
    conns.abort_all();
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    remote: SocketAddr,
    guard: Arc<ConnGuard>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
    limits: HttpLimits,
) {
    let _ = tcp.set_nodelay(true);
    if limits.send_buffer_bytes > 0 {
        // Bounds what the kernel queues for a client that does not read.
        let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(limits.send_buffer_bytes);
    }
    let Some(acceptor) = acceptor else {
        let info = ConnInfo {
            remote,
            certificate: None,
            guard: Some(guard),
        };
        serve_http(tcp, info, router, &limits).await;
        return;
    };
    // One deadline from accept to the end of the handshake (a silent client and a stalled
    // handshake alike).
    let deadline = tokio::time::Instant::now() + limits.handshake_timeout;
    // A TLS client starts with a handshake record (0x16). Tell a plain-HTTP client what is
    // wrong instead of failing its handshake without a word.
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(deadline, tcp.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] != 0x16 => {
            refuse_plain_http(tcp, remote).await;
            return;
        }
        Ok(Ok(1)) => {}
        _ => return,
    }
    let stream = match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(%remote, "operator API: TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::info!(%remote, "operator API: TLS handshake timed out");
            return;
        }
    };
    let certificate = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| tls::identity_from_cert(c));
    if matches!(certificate, Some(PeerIdentity::Operator(_))) {
        guard.promote();
    }
    let info = ConnInfo {
        remote,
        certificate,
        guard: Some(guard),
    };
    serve_http(stream, info, router, &limits).await;
}

async fn refuse_plain_http(mut tcp: tokio::net::TcpStream, remote: SocketAddr) {
    use tokio::io::AsyncWriteExt;
    tracing::info!(%remote, "operator API: plain HTTP on the HTTPS port; refused");
    let body = "{\"error\":\"https_required\",\"message\":\"this port speaks HTTPS only\"}";
    let resp = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = tcp.write_all(resp.as_bytes()).await;
        let _ = tcp.shutdown().await;
    })
    .await;
}

async fn serve_http<S>(stream: S, info: ConnInfo, router: Router, limits: &HttpLimits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let remote = info.remote;
    let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(info.clone());
        let mut router = router.clone();
        async move {
            use tower::Service;
            router.call(req.map(Body::new)).await
        }
    });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(64 * 1024)
        .serve_connection(
            hyper_util::rt::TokioIo::new(WriteDeadline::new(stream, limits.write_timeout)),
            service,
        )
        // A live exec (`GET /api/v1/tasks/{id}/exec/attach`) upgrades its connection.
        .with_upgrades()
        .await;
    if let Err(e) = result {
        tracing::debug!(%remote, "operator API connection ended: {e}");
    }
}

/// Reads the whole body under the size limit and the body deadline before any handler runs.
async fn bounded_body(State(app): State<App>, req: Request, next: Next) -> Response {
    let max = app.limits.max_body_bytes;
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request bodies are limited to {max} bytes"),
        )
        .into_response();
    }
    let bytes = match tokio::time::timeout(app.limits.body_timeout, axum::body::to_bytes(body, max))
        .await
    {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request bodies are limited to {max} bytes"),
            )
            .into_response()
        }
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {:?}",
                    app.limits.body_timeout
                ),
            )
            .into_response()
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Works out who is calling and attaches a [`Caller`] to the request.
async fn authenticate(State(app): State<App>, mut req: Request, next: Next) -> Response {
    let info = req.extensions().get::<ConnInfo>().cloned();
    // The dashboard's session stands for its operator on reads only (a certificate wins).
    let session = (req.method() == axum::http::Method::GET)
        .then(|| cookie(&req, SESSION_COOKIE))
        .flatten();
    let caller = match bearer(&req) {
        Some(Err(why)) => return ApiError::new(StatusCode::UNAUTHORIZED, why).into_response(),
        Some(Ok(token)) => {
            let remote = info.as_ref().map(|i| i.remote);
            match app.check_token(remote, token) {
                Ok(name) => Caller::Operator { name, how: "token" },
                Err(e) => return e.into_response(),
            }
        }
        // Who else it is: security's decision (a certificate wins over a session).
        None => identity::operator_caller(
            info.as_ref().and_then(|i| i.certificate.clone()),
            session.map(|id| {
                let app = &app;
                move || app.sessions.operator(&id, &app.tokens, Instant::now())
            }),
        ),
    };
    if matches!(caller, Caller::Operator { .. }) {
        // The connection authenticated: it leaves the unauthenticated share.
        if let Some(g) = info.as_ref().and_then(|i| i.guard.as_ref()) {
            g.promote();
        }
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

impl App {
    /// The operator a presented token stands for, under the failed-authentication limit of the
    /// caller's address: 429 while the address is limited (before the token is checked, so a
    /// guess tells nothing), 401 for a wrong token (counted).
    pub(super) fn check_token(
        &self,
        remote: Option<SocketAddr>,
        token: &str,
    ) -> Result<String, ApiError> {
        let now = Instant::now();
        if let Some(r) = remote {
            if let Err(wait) = self.auth_limiter.check(r.ip(), now) {
                tracing::info!(remote = %r, "operator API: too many failed authentications; 429");
                return Err(ApiError::too_many(
                    format!(
                        "too many failed authentications from {}; retry in {}s",
                        r.ip(),
                        wait.as_secs_f64().ceil()
                    ),
                    wait,
                ));
            }
        }
        match self.tokens.verify(token) {
            Some(name) => Ok(name),
            None => {
                if let Some(r) = remote {
                    self.auth_limiter.failed(r.ip(), now);
                    tracing::info!(remote = %r, "operator API: unknown bearer token");
                }
                Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unknown bearer token",
                ))
            }
        }
    }

    /// Takes a place for an `/api/v1/events` subscriber of `principal`, or 429 past
    /// `--http-max-event-subscribers-per-principal`.
    pub(super) fn subscribe_slot(&self, principal: String) -> Result<SubscriberSlot, ApiError> {
        let limit = self.limits.max_event_subscribers_per_principal;
        let mut map = self.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(principal.clone()).or_insert(0);
        if limit > 0 && *n >= limit {
            return Err(ApiError::too_many(
                format!(
                    "{principal} already holds {limit} event subscriptions \
                     (--http-max-event-subscribers-per-principal)"
                ),
                Duration::from_secs(5),
            ));
        }
        *n += 1;
        Ok(SubscriberSlot {
            map: self.subscribers.clone(),
            principal,
        })
    }

    /// The operator port's own figures (`/metrics`).
    fn port_figures(&self) -> super::metrics::OperatorPortFigures {
        let (connections, unauthenticated, closed_for_room) = self.admission.counts();
        let event_subscribers: usize = self
            .subscribers
            .lock()
            .map(|m| m.values().sum())
            .unwrap_or(0);
        let (auth_limited_addresses, auth_failures, auth_refused) = self.auth_limiter.figures();
        super::metrics::OperatorPortFigures {
            connections,
            unauthenticated,
            closed_for_room,
            event_subscribers,
            sessions: self.sessions.len(),
            auth_limited_addresses,
            auth_failures,
            auth_refused,
        }
    }

    /// The same, shown under `operator_api` in `/state`.
    fn port_stats(&self) -> serde_json::Value {
        let f = self.port_figures();
        serde_json::json!({
            "connections": f.connections,
            "unauthenticated_connections": f.unauthenticated,
            "unauthenticated_closed_for_room": f.closed_for_room,
            "event_subscribers": f.event_subscribers,
            "sessions": f.sessions,
            "auth_limited_addresses": f.auth_limited_addresses,
            "auth_failures": f.auth_failures,
            "auth_rate_limited": f.auth_refused,
        })
    }
}

/// One `/api/v1/events` subscriber's place in its principal's count, given back on drop.
pub(super) struct SubscriberSlot {
    map: Arc<Mutex<HashMap<String, usize>>>,
    principal: String,
}

impl Drop for SubscriberSlot {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.principal);
            }
        }
    }
}

/// The name of the dashboard's session cookie (a random session id, never a token).
pub(super) const SESSION_COOKIE: &str = "gantry_session";

/// The value of cookie `name`, if any.
pub(super) fn cookie(req: &Request, name: &str) -> Option<String> {
    cookie_in(req.headers(), name)
}

/// The value of cookie `name` among `headers`' `Cookie` headers, if any.
pub(super) fn cookie_in(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The bearer token in `Authorization`, if any (an error when the header is malformed).
fn bearer(req: &Request) -> Option<Result<&str, &'static str>> {
    let value = req.headers().get(header::AUTHORIZATION)?;
    let Ok(text) = value.to_str() else {
        return Some(Err(identity::MALFORMED_AUTHORIZATION));
    };
    Some(identity::bearer_token(text))
}

impl App {
    /// The operator allowed to read, or 401.
    pub(super) fn may_read(&self, caller: &Caller) -> Result<(), ApiError> {
        identity::may_read(caller, self.public_reads).map_err(denied)
    }

    /// 401 without an operator, 403 when the ACLs do not grant `action`.
    pub(super) fn may_write(
        &self,
        caller: &Caller,
        action: OperatorAction,
    ) -> Result<String, ApiError> {
        identity::may_write(&self.acls, caller, action).map_err(|e| {
            if let (Denied::Forbidden { .. }, Caller::Operator { name, how }) = (&e, caller) {
                tracing::warn!(operator = %name, via = how, action = action.name(), "operator action denied by ACL");
            }
            denied(e)
        })
    }
}

/// A refusal of [`identity::may_read`] or [`identity::may_write`] as the response: 401 without
/// an operator, 403 for an operator the ACLs do not grant the action.
fn denied(e: Denied) -> ApiError {
    let status = match e {
        Denied::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        Denied::Forbidden { .. } => StatusCode::FORBIDDEN,
    };
    ApiError::new(status, e.to_string())
}

pub(super) fn caller_of(req_caller: Option<axum::Extension<Caller>>) -> Caller {
    req_caller.map(|c| c.0).unwrap_or_else(Caller::nobody)
}

async fn health_handler(State(app): State<App>) -> Json<health::Health> {
    let st = app.shell.status.borrow().clone();
    Json(health::health(&st, std::time::Instant::now()))
}

pub(super) fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "master core is not running",
    )
}

async fn state_handler(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
) -> ApiResult {
    app.may_read(&caller_of(caller))?;
    app.state().await.map(Json)
}

impl App {
    /// The `/state` view from the core, with the operator port's figures (`operator_api`).
    pub(super) async fn state(&self) -> Result<serde_json::Value, ApiError> {
        let (tx, rx) = oneshot::channel();
        self.shell
            .core
            .send(CoreEvent::State(tx))
            .await
            .map_err(|_| unavailable())?;
        let mut state = rx.await.map_err(|_| unavailable())?;
        if let Some(m) = state.as_object_mut() {
            m.insert("operator_api".into(), self.port_stats());
        }
        Ok(state)
    }
}

/// `GET /metrics`: the Prometheus exposition (a read: same authentication as `/state`).
async fn metrics_handler(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
) -> Result<Response, ApiError> {
    app.may_read(&caller_of(caller))?;
    let (tx, rx) = oneshot::channel();
    app.shell
        .core
        .send(CoreEvent::Metrics(tx))
        .await
        .map_err(|_| unavailable())?;
    let snapshot = rx.await.map_err(|_| unavailable())?;
    let usage = match snapshot {
        Some(_) => app.shell.history.lock().ok().and_then(|h| {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            h.enabled().then(|| h.usage().counters(now_ms))
        }),
        None => None,
    };
    let text = super::metrics::render(
        &app.shell.metrics,
        snapshot.as_ref(),
        &app.port_figures(),
        usage.as_ref(),
    );
    Ok(([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], text).into_response())
}

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid request: {e}")))
}

pub(super) async fn operator(app: &App, who: String, cmd: OperatorCommand) -> ApiResult {
    let (tx, rx) = oneshot::channel();
    let what = format!("{cmd:?}");
    app.shell
        .core
        .send(CoreEvent::Operator(cmd, tx))
        .await
        .map_err(|_| unavailable())?;
    match rx.await.map_err(|_| unavailable())? {
        Ok(()) => {
            tracing::info!(operator = %who, "operator change: {what}");
            Ok(Json(serde_json::json!({"ok": true})))
        }
        Err(e) => {
            let status = match e {
                OperatorRejection::NotFound(_) => StatusCode::NOT_FOUND,
                OperatorRejection::Conflict(_) => StatusCode::CONFLICT,
                OperatorRejection::NotLeader | OperatorRejection::NotPersisted(_) => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                _ => StatusCode::BAD_REQUEST,
            };
            Err(ApiError::new(status, e.to_string()))
        }
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
