//! A client for the master's operator API (`/health`, `/state`, `/api/v1/…` and its event
//! stream) over HTTPS, used by `gantryctl` and the cluster tests: reqwest with rustls on the `ring`
//! provider, trusting only the cluster CA, authenticating with an operator certificate
//! (`operator-NAME.pem/.key` in a TLS directory) or a bearer token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gantry_transport::tls::{self, PeerIdentity, TlsError};

/// Errors talking to the operator API.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid master address {0:?}: use https://HOST:PORT (or http://127.0.0.1:PORT for a master started with --http-insecure)")]
    BadUrl(String),
    #[error("HTTPS to the master needs the cluster CA: give --tls-dir DIR (holding ca.pem)")]
    NoTlsDir,
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("request to the master failed")]
    Http(#[from] reqwest::Error),
    #[error("client runtime: {0}")]
    Runtime(String),
    /// The event stream broke its bounds.
    #[error("event stream: {0}")]
    Stream(String),
    /// The master answered with an error status.
    #[error("{path}: {status} {code}: {message}")]
    Status {
        path: String,
        status: u16,
        code: String,
        message: String,
    },
}

impl ClientError {
    /// The HTTP status the master answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// How the client proves who it is.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// The operator certificate `operator-NAME.pem/.key` from the TLS directory.
    Certificate(String),
    /// `Authorization: Bearer TOKEN`.
    Token(String),
    /// Nothing (only `/health`, or reads on a master with `--http-public-reads`).
    None,
}

/// Where and how to reach the operator API.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `https://HOST:PORT` (or `http://` for a loopback master with `--http-insecure`).
    pub master: String,
    /// The TLS directory holding `ca.pem` (and the operator's certificate).
    pub tls_dir: Option<PathBuf>,
    pub credentials: Credentials,
    /// Per-request deadline.
    pub timeout: Duration,
}

impl ClientConfig {
    /// `https://ADDR` with the operator certificate `NAME` from `tls_dir`.
    pub fn with_certificate(master: impl Into<String>, tls_dir: &Path, operator: &str) -> Self {
        Self {
            master: master.into(),
            tls_dir: Some(tls_dir.to_path_buf()),
            credentials: Credentials::Certificate(operator.to_string()),
            timeout: Duration::from_secs(10),
        }
    }
}

/// An operator API client.
#[derive(Debug, Clone)]
pub struct OperatorClient {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl OperatorClient {
    pub fn new(config: &ClientConfig) -> Result<Self, ClientError> {
        let base = config.master.trim_end_matches('/').to_string();
        let https = if base.starts_with("https://") {
            true
        } else if base.starts_with("http://") {
            false
        } else {
            return Err(ClientError::BadUrl(config.master.clone()));
        };
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(Duration::from_secs(5))
            .http1_only()
            // Under the master's 5 s header deadline (--http-header-timeout), which also
            // closes idle connections: never send on a connection the master is closing.
            .pool_idle_timeout(Duration::from_secs(3))
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none());
        if https {
            let dir = config.tls_dir.as_deref().ok_or(ClientError::NoTlsDir)?;
            let roots = tls::load_roots(dir)?;
            let identity = match &config.credentials {
                Credentials::Certificate(name) => Some(tls::load_identity(
                    dir,
                    &PeerIdentity::Operator(name.clone()),
                )?),
                _ => None,
            };
            builder =
                builder.use_preconfigured_tls(tls::https_client_config(roots, identity.as_ref())?);
        } else {
            // Plain HTTP: no TLS is used, but reqwest still builds a TLS configuration and,
            // without one given, would look for a process-wide rustls provider.
            builder = builder.use_preconfigured_tls(tls::https_client_config(
                rustls::RootCertStore::empty(),
                None,
            )?);
        }
        let token = match &config.credentials {
            Credentials::Token(t) => Some(t.clone()),
            _ => None,
        };
        Ok(Self {
            base,
            http: builder.build()?,
            token,
        })
    }

    /// `GET path` and return the body of a 2xx response.
    pub async fn get(&self, path: &str) -> Result<String, ClientError> {
        self.send(path, self.http.get(self.url(path))).await
    }

    /// `DELETE path` and return the body of a 2xx response.
    pub async fn delete(&self, path: &str) -> Result<String, ClientError> {
        self.send(path, self.http.delete(self.url(path))).await
    }

    /// `POST path` with a JSON body and return the body of a 2xx response.
    pub async fn post_json(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<String, ClientError> {
        let req = self
            .http
            .post(self.url(path))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        self.send(path, req).await
    }

    /// Follows the server-sent events at `path` (`/api/v1/events`): calls `on_event` with each
    /// event's data until it returns false or the master ends the stream.
    pub async fn events(
        &self,
        path: &str,
        mut on_event: impl FnMut(&str) -> bool,
    ) -> Result<(), ClientError> {
        // One event (the snapshot of a large cluster) may be large, but not without bound.
        const MAX_EVENT: usize = 256 << 20;
        // The stream lasts as long as the caller wants: no overall deadline (keep-alives
        // arrive every 15 s).
        let mut req = self
            .http
            .get(self.url(path))
            .timeout(Duration::from_secs(100 * 365 * 86_400))
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let mut resp = req.send().await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await?;
            return Err(status_error(path, status, &text));
        }
        let mut buf: Vec<u8> = Vec::new();
        let mut data = String::new();
        while let Some(chunk) = resp.chunk().await? {
            buf.extend_from_slice(&chunk);
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\n', '\r']);
                if line.is_empty() {
                    if !data.is_empty() && !on_event(&data) {
                        return Ok(());
                    }
                    data.clear();
                } else if let Some(d) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(d.strip_prefix(' ').unwrap_or(d));
                }
                // Comments (keep-alives), `event:` and `id:` lines carry nothing we use.
            }
            if buf.len() + data.len() > MAX_EVENT {
                return Err(ClientError::Stream(format!(
                    "an event over {MAX_EVENT} bytes"
                )));
            }
        }
        Ok(())
    }

    /// `GET path` (or `POST` with `body`) and hands each chunk of a 2xx answer to `on_chunk`
    /// as it arrives, until it returns false or the answer ends: the task logs followed, an
    /// exec's output. No overall deadline (the stream lasts as long as the task writes).
    pub async fn stream(
        &self,
        path: &str,
        body: Option<&serde_json::Value>,
        mut on_chunk: impl FnMut(&[u8]) -> bool,
    ) -> Result<(), ClientError> {
        let mut req = match body {
            Some(b) => self
                .http
                .post(self.url(path))
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.to_string()),
            None => self.http.get(self.url(path)),
        }
        .timeout(Duration::from_secs(100 * 365 * 86_400));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let mut resp = req.send().await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await?;
            return Err(status_error(path, status, &text));
        }
        while let Some(chunk) = resp.chunk().await? {
            if !on_chunk(&chunk) {
                break;
            }
        }
        Ok(())
    }

    /// `GET path` upgraded to the protocol `proto` (`Connection: Upgrade`): the connection
    /// once the master has answered `101 Switching Protocols` (a live exec, `gantry-exec`).
    pub async fn upgrade(&self, path: &str, proto: &str) -> Result<reqwest::Upgraded, ClientError> {
        let mut req = self
            .http
            .get(self.url(path))
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, proto)
            .timeout(Duration::from_secs(100 * 365 * 86_400));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await?;
        let status = resp.status();
        if status != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            let text = resp.text().await?;
            return Err(status_error(path, status, &text));
        }
        Ok(resp.upgrade().await?)
    }

    /// `GET path` and the raw bytes of a 2xx answer with its headers.
    pub async fn get_bytes(
        &self,
        path: &str,
    ) -> Result<(reqwest::header::HeaderMap, Vec<u8>), ClientError> {
        let mut req = self.http.get(self.url(path));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await?;
        if status.is_success() {
            return Ok((headers, bytes.to_vec()));
        }
        Err(status_error(path, status, &String::from_utf8_lossy(&bytes)))
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send(
        &self,
        path: &str,
        mut req: reqwest::RequestBuilder,
    ) -> Result<String, ClientError> {
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let text = resp.text().await?;
        if status.is_success() {
            return Ok(text);
        }
        Err(status_error(path, status, &text))
    }
}

/// The error for a non-2xx answer (its JSON `{"error", "message"}` when it has one).
fn status_error(path: &str, status: reqwest::StatusCode, text: &str) -> ClientError {
    let (code, message) = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) if v["error"].is_string() => (
            v["error"].as_str().unwrap_or_default().to_string(),
            v["message"].as_str().unwrap_or_default().to_string(),
        ),
        _ => (String::new(), text.trim().to_string()),
    };
    ClientError::Status {
        path: path.to_string(),
        status: status.as_u16(),
        code,
        message,
    }
}

/// A blocking wrapper for callers outside async code or inside another runtime (the cluster
/// tests): requests run on one process-wide background runtime and the caller waits on a
/// channel, so keep-alive connections are reused across calls and no runtime is ever dropped
/// inside an async context.
#[derive(Debug, Clone)]
pub struct BlockingClient {
    client: OperatorClient,
}

fn background() -> Result<&'static tokio::runtime::Runtime, ClientError> {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("gantry-operator-client")
        .enable_all()
        .build()
        .map_err(|e| ClientError::Runtime(e.to_string()))?;
    // A runtime that lost the race is leaked rather than dropped (dropping one inside an async
    // context panics).
    if let Err(rt) = RT.set(rt) {
        std::mem::forget(rt);
    }
    RT.get()
        .ok_or_else(|| ClientError::Runtime("no background runtime".into()))
}

impl BlockingClient {
    pub fn new(config: &ClientConfig) -> Result<Self, ClientError> {
        let _guard = background()?.enter();
        Ok(Self {
            client: OperatorClient::new(config)?,
        })
    }

    fn run<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = Result<T, ClientError>> + Send + 'static,
    ) -> Result<T, ClientError> {
        let (tx, rx) = std::sync::mpsc::channel();
        background()?.spawn(async move {
            let _ = tx.send(f.await);
        });
        rx.recv()
            .unwrap_or_else(|_| Err(ClientError::Runtime("the request task ended".into())))
    }

    /// Blocking `GET path`.
    pub fn get(&self, path: &str) -> Result<String, ClientError> {
        let (c, path) = (self.client.clone(), path.to_string());
        self.run(async move { c.get(&path).await })
    }

    /// Blocking `POST path` with a JSON body.
    pub fn post_json(&self, path: &str, body: serde_json::Value) -> Result<String, ClientError> {
        let (c, path) = (self.client.clone(), path.to_string());
        self.run(async move { c.post_json(&path, &body).await })
    }
}
