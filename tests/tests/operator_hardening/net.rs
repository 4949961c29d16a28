//! The attack's tools: HTTPS clients bound to a loopback address, raw TCP and TLS
//! connections, the attacks themselves and a keep-alive connection that reads the port's stats.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_sdk::transport::tls::{self, PeerIdentity};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub(super) fn lo(a: u8, b: u8, c: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, a, b, c))
}

/// An HTTPS client of the operator API bound to `local`, with operator certificate `cert`;
/// `keep_alive` false opens a new connection for every request.
pub(super) fn client(
    tls_dir: &Path,
    local: IpAddr,
    cert: Option<&str>,
    keep_alive: bool,
) -> reqwest::Client {
    let roots = tls::load_roots(tls_dir).unwrap();
    let identity =
        cert.map(|n| tls::load_identity(tls_dir, &PeerIdentity::Operator(n.into())).unwrap());
    let cfg = tls::https_client_config(roots, identity.as_ref()).unwrap();
    let mut b = reqwest::Client::builder()
        .use_preconfigured_tls(cfg)
        .local_address(local)
        .http1_only()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        // Under the master's 5 s idle deadline.
        .pool_idle_timeout(Duration::from_secs(3));
    if !keep_alive {
        b = b.pool_max_idle_per_host(0);
    }
    b.build().unwrap()
}

/// `GET path`: status, headers, body.
pub(super) async fn get(
    c: &reqwest::Client,
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, reqwest::header::HeaderMap, String), String> {
    let mut req = c.get(format!("{base}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.map_err(|e| chain(&e))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.text().await.map_err(|e| chain(&e))?;
    Ok((status, headers, body))
}

/// An error with its sources.
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!(": {c}"));
        cur = c.source();
    }
    s
}

/// `POST path` with a form body: status, headers, body.
pub(super) async fn post_form(
    c: &reqwest::Client,
    base: &str,
    path: &str,
    form: &[(&str, &str)],
    cookie: &str,
) -> (u16, reqwest::header::HeaderMap, String) {
    let body: String = form_urlencoded(form);
    let resp = c
        .post(format!("{base}{path}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", cookie)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.text().await.unwrap())
}

pub(super) fn form_urlencoded(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            let enc: String = v
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect();
            format!("{k}={enc}")
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// The value of cookie `name` set by `headers` (`Set-Cookie`), with its attributes.
pub(super) fn set_cookie(
    headers: &reqwest::header::HeaderMap,
    name: &str,
) -> Option<(String, String)> {
    headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| {
            let (kv, attrs) = v.split_once(';').unwrap_or((v, ""));
            let (k, val) = kv.split_once('=')?;
            (k.trim() == name).then(|| (val.trim().to_string(), attrs.to_string()))
        })
}

/// The `value` of the hidden `csrf` field in a form.
pub(super) fn csrf_field(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no csrf field in {html}"))
        + "name=\"csrf\" value=\"".len();
    html[at..].split('"').next().unwrap().to_string()
}

/// The token file: `ci` (a generated token) and `weak` (a short token hashed by hand).
pub(super) fn token_file(dir: &Path) -> (String, std::path::PathBuf) {
    use std::os::unix::fs::OpenOptionsExt;
    let token = gantry_master::tokens::generate().unwrap();
    let path = dir.join("tokens.toml");
    let text = format!(
        "{}{}",
        gantry_master::tokens::file_entry("ci", &token),
        gantry_master::tokens::file_entry("weak", "hunter2hunter2")
    );
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    (token, path)
}

pub(super) async fn tcp_from(
    local: IpAddr,
    addr: SocketAddr,
    recv_buffer: Option<u32>,
) -> std::io::Result<tokio::net::TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    if let Some(n) = recv_buffer {
        sock.set_recv_buffer_size(n)?;
    }
    sock.bind(SocketAddr::new(local, 0))?;
    sock.connect(addr).await
}

pub(super) async fn tls_from(
    local: IpAddr,
    addr: SocketAddr,
    tls_dir: &Path,
    cert: Option<&str>,
    recv_buffer: Option<u32>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let roots = tls::load_roots(tls_dir).unwrap();
    let identity =
        cert.map(|n| tls::load_identity(tls_dir, &PeerIdentity::Operator(n.into())).unwrap());
    let cfg = tls::https_client_config(roots, identity.as_ref()).unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tcp_from(local, addr, recv_buffer).await?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    connector.connect(name, tcp).await
}

/// Waits until the peer closes `s` (EOF or error), at most `limit`; true if it did.
pub(super) async fn closed_within<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    limit: Duration,
) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Attack {
    /// TCP connection that never starts the handshake.
    Silent,
    /// The first bytes of a TLS record, then nothing.
    HalfHello,
    /// A full handshake (no certificate), then a request head trickled a header at a time.
    SlowHead,
}

/// One attacker connection of `kind` from `local`, held until the master closes it.
pub(super) async fn attack_once(kind: Attack, local: IpAddr, addr: SocketAddr, tls_dir: &Path) {
    let hold = Duration::from_secs(60);
    match kind {
        Attack::Silent | Attack::HalfHello => {
            let Ok(mut s) = tcp_from(local, addr, None).await else {
                return;
            };
            if matches!(kind, Attack::HalfHello)
                && s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).await.is_err()
            {
                return;
            }
            closed_within(&mut s, hold).await;
        }
        Attack::SlowHead => {
            let Ok(mut s) = tls_from(local, addr, tls_dir, None, None).await else {
                return;
            };
            if s.write_all(b"GET /api/v1/summary HTTP/1.1\r\nHost: master\r\n")
                .await
                .is_err()
            {
                return;
            }
            let start = Instant::now();
            while start.elapsed() < hold {
                if s.write_all(b"X-Slow: a\r\n").await.is_err() || s.flush().await.is_err() {
                    return;
                }
                let mut b = [0u8; 256];
                if let Ok(r) =
                    tokio::time::timeout(Duration::from_millis(500), s.read(&mut b)).await
                {
                    // An answer (408) or EOF: the master gave up on us.
                    let _ = r;
                    return;
                }
            }
        }
    }
}

/// `n` attacker tasks of `kind` from `local`, each re-opening its connection as soon as the
/// master closes it (after a short pause when it was closed at once, so the test does not
/// spin), until `stop`.
pub(super) fn flood(
    kind: Attack,
    local: IpAddr,
    n: usize,
    addr: SocketAddr,
    tls_dir: &Path,
    stop: &Arc<AtomicBool>,
    opened: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (stop, opened, tls_dir) = (stop.clone(), opened.clone(), tls_dir.to_path_buf());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    opened.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        _ = attack_once(kind, local, addr, &tls_dir) => {}
                        _ = async { while !stop.load(Ordering::Relaxed) {
                                tokio::time::sleep(Duration::from_millis(100)).await } } => return,
                    }
                    if t.elapsed() < Duration::from_millis(250) {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
            })
        })
        .collect()
}

/// `/state`'s `operator_api` figures.
pub(super) async fn port_stats(c: &reqwest::Client, base: &str) -> serde_json::Value {
    let (status, _, body) = get(c, base, "/state", &[]).await.expect("/state");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["operator_api"].clone()
}

/// One keep-alive HTTPS connection with an operator certificate, used for every request (a
/// pooled client may open a second connection at any time; this one never does).
pub(super) struct KeepAlive(tokio_rustls::client::TlsStream<tokio::net::TcpStream>);

impl KeepAlive {
    pub(super) async fn open(local: IpAddr, addr: SocketAddr, tls_dir: &Path) -> Self {
        Self(
            tls_from(local, addr, tls_dir, Some("admin"), None)
                .await
                .unwrap(),
        )
    }

    /// `GET path` on this connection: status and body (`Err` when the connection failed).
    pub(super) async fn get(&mut self, path: &str) -> Result<(u16, String), String> {
        let req = format!("GET {path} HTTP/1.1\r\nHost: master\r\n\r\n");
        self.0
            .write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 16 * 1024];
        let (head_len, status, length) = loop {
            let n = tokio::time::timeout(Duration::from_secs(20), self.0.read(&mut chunk))
                .await
                .map_err(|_| "no answer in 20 s".to_string())?
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!(
                    "connection closed after {:?}",
                    String::from_utf8_lossy(&buf)
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .ok_or_else(|| format!("no content-length: {head}"))?;
                break (end + 4, status, length);
            }
        };
        while buf.len() < head_len + length {
            let n = self.0.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed mid-body".into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok((
            status,
            String::from_utf8_lossy(&buf[head_len..head_len + length]).into_owned(),
        ))
    }

    /// `/state`'s `operator_api` figures.
    pub(super) async fn stats(&mut self) -> serde_json::Value {
        let (status, body) = self
            .get("/state")
            .await
            .expect("/state on the keep-alive connection");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["operator_api"].clone()
    }
}
