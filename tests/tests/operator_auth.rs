//! The operator API under attack (issue 10, finding 7): a real master serving HTTPS with the
//! cluster CA, ACLs and operator tokens, attacked with plain HTTP, missing and wrong
//! credentials, an operator the ACLs do not grant, slowloris headers and bodies, oversized
//! bodies and absurd weights — while a legitimate framework's tasks all finish. Also: the
//! master refuses `--http-insecure` off loopback and a TLS directory others may write.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_master::client::{ClientConfig, ClientError, Credentials, OperatorClient};
use gantry_sdk::transport::tls::{self, PeerIdentity};
use gantry_tests::{assert_finished_once, bin, free_tcp, free_udp, run_batch, Cluster, TempDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ACLS: &str = r#"
[[register_frameworks]]
principals = ["*"]
roles = ["*"]

[[run_tasks]]
principals = ["*"]
users = ["*", "root"]

[[operator]]
principals = ["admin"]
actions = ["*"]

[[operator]]
principals = ["ci"]
actions = ["set_weight"]
"#;

use gantry_tests::https_client as client;

/// A fresh token for principal `ci` and the `tokens.toml` (mode 0600) holding it, in `dir`.
fn ci_token_file(dir: &Path) -> (String, std::path::PathBuf) {
    use std::os::unix::fs::OpenOptionsExt;
    let token = gantry_master::tokens::generate().unwrap();
    let tokens = dir.join("tokens.toml");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tokens)
        .unwrap();
    std::io::Write::write_all(
        &mut f,
        gantry_master::tokens::file_entry("ci", &token).as_bytes(),
    )
    .unwrap();
    (token, tokens)
}

/// The status of a refused request (panics on success: the attack worked).
fn refused(what: &str, r: Result<String, ClientError>) -> (u16, String) {
    match r {
        Ok(body) => panic!("{what}: the attack succeeded: {body}"),
        Err(ClientError::Status {
            status,
            code,
            message,
            ..
        }) => {
            assert!(
                !code.is_empty(),
                "{what}: error without a JSON code: {message}"
            );
            (status, message)
        }
        Err(e) => panic!("{what}: no HTTP answer: {e:#}"),
    }
}

fn weight_of(state: &serde_json::Value, role: &str) -> Option<f64> {
    state["allocator"]["roles"][role]["weight"].as_f64()
}

/// A raw TLS connection to the operator API (for requests a well-behaved client never sends).
async fn raw_tls(
    addr: SocketAddr,
    tls_dir: &Path,
    operator: Option<&str>,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let roots = tls::load_roots(tls_dir).unwrap();
    let identity =
        operator.map(|n| tls::load_identity(tls_dir, &PeerIdentity::Operator(n.into())).unwrap());
    let cfg = tls::https_client_config(roots, identity.as_ref()).unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    connector.connect(name, tcp).await.unwrap()
}

/// Reads until the server closes the connection (or `limit` passes); returns what arrived and
/// how long it took.
async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    limit: Duration,
) -> (String, Duration) {
    let start = Instant::now();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((start + limit).into(), s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => panic!(
                "the master kept the connection open for {limit:?}; got {:?}",
                String::from_utf8_lossy(&buf)
            ),
        }
    }
    (String::from_utf8_lossy(&buf).into_owned(), start.elapsed())
}

/// Sends a request head one byte at a time, slower than the header deadline allows.
async fn slowloris_headers(addr: SocketAddr, tls_dir: &Path) -> Duration {
    let mut s = raw_tls(addr, tls_dir, Some("admin")).await;
    let head = b"GET /state HTTP/1.1\r\nHost: master\r\nX-Slow: ";
    s.write_all(head).await.unwrap();
    let start = Instant::now();
    let mut closed = false;
    while start.elapsed() < Duration::from_secs(40) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if s.write_all(b"a").await.is_err() || s.flush().await.is_err() {
            closed = true;
            break;
        }
        let mut b = [0u8; 512];
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(10), s.read(&mut b)).await {
            // An answer (408) or EOF: either way the master gave up on us.
            let _ = r;
            closed = true;
            break;
        }
    }
    assert!(closed, "a slowloris request head was served for 40 s");
    start.elapsed()
}

/// Sends a complete head announcing a body, then stalls: the body deadline answers 408.
async fn slow_body(addr: SocketAddr, tls_dir: &Path) -> (String, Duration) {
    let mut s = raw_tls(addr, tls_dir, Some("admin")).await;
    s.write_all(
        b"POST /weights HTTP/1.1\r\nHost: master\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"role\":",
    )
    .await
    .unwrap();
    read_until_closed(&mut s, Duration::from_secs(40)).await
}

/// A TCP connection that never starts the TLS handshake.
async fn silent_connection(addr: SocketAddr) -> Duration {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    read_until_closed(&mut s, Duration::from_secs(40)).await.1
}

/// An authenticated POST whose body is far over the limit (declared, then chunked).
async fn oversized_bodies(addr: SocketAddr, tls_dir: &Path) {
    let mut s = raw_tls(addr, tls_dir, Some("admin")).await;
    s.write_all(b"POST /weights HTTP/1.1\r\nHost: master\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n\r\n")
        .await
        .unwrap();
    let filler = vec![b' '; 64 * 1024];
    // The master answers without reading the body; our writes may start failing.
    for _ in 0..4 {
        if s.write_all(&filler).await.is_err() {
            break;
        }
    }
    let (resp, _) = read_until_closed(&mut s, Duration::from_secs(20)).await;
    assert!(resp.starts_with("HTTP/1.1 413"), "declared 100 MiB: {resp}");

    let mut s = raw_tls(addr, tls_dir, Some("admin")).await;
    s.write_all(b"POST /weights HTTP/1.1\r\nHost: master\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", filler.len(), " ".repeat(filler.len()));
    for _ in 0..64 {
        if s.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let (resp, _) = read_until_closed(&mut s, Duration::from_secs(20)).await;
    assert!(resp.starts_with("HTTP/1.1 413"), "chunked 4 MiB: {resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_api_refuses_attackers_and_serves_operators() {
    let conf = TempDir::new("gantry-opauth").unwrap();
    let acls = conf.path().join("acls.toml");
    std::fs::write(&acls, ACLS).unwrap();
    let (token, tokens) = ci_token_file(conf.path());
    let cluster = Cluster::start_with(
        &[("oa1", "cpus:4;mem:2048"), ("oa2", "cpus:4;mem:2048")],
        &[
            "--acls",
            acls.to_str().unwrap(),
            "--operator-tokens",
            tokens.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap();
    let addr = cluster.master.http;
    let tls_dir = cluster.tls_dir.clone();
    // An operator certificate signed by the cluster CA but granted nothing by the ACLs.
    gantry_pki::load_or_issue(&tls_dir, &PeerIdentity::Operator("viewer".into()), &[]).unwrap();
    assert!(
        tls_dir.join("operator-admin.pem").exists(),
        "the dev master issues operator-admin"
    );

    // A legitimate framework runs throughout.
    let master_quic = cluster.master.quic;
    let fw_tls = tls_dir.clone();
    let batch = tokio::spawn(async move {
        run_batch(
            master_quic,
            &fw_tls,
            "legit",
            "analytics",
            24,
            "cpus:0.5;mem:64",
            "sleep 0.3",
        )
        .await
    });

    // 1. Plain HTTP to the HTTPS port: refused, nothing changes.
    {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let body = r#"{"role":"analytics","weight":1000}"#;
        s.write_all(
            format!(
                "POST /weights HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let (resp, _) = read_until_closed(&mut s, Duration::from_secs(10)).await;
        assert!(
            resp.starts_with("HTTP/1.1 400") && resp.contains("https_required"),
            "plain HTTP: {resp}"
        );
    }

    // 2. HTTPS without any credential: 401 for writes and reads; /health stays public.
    let anonymous = client(addr, &tls_dir, Credentials::None);
    let (status, _) = refused(
        "anonymous write",
        anonymous
            .post_json(
                "/weights",
                &serde_json::json!({"role": "analytics", "weight": 1000}),
            )
            .await,
    );
    assert_eq!(status, 401);
    let (status, _) = refused("anonymous read", anonymous.get("/state").await);
    assert_eq!(status, 401);
    let health: serde_json::Value =
        serde_json::from_str(&anonymous.get("/health").await.unwrap()).unwrap();
    assert_eq!(health["role"], "leader", "{health}");

    // 3. An operator certificate without the ACL grant: 403, nothing changes; it may read.
    let viewer = client(addr, &tls_dir, Credentials::Certificate("viewer".into()));
    for (path, body) in [
        (
            "/weights",
            serde_json::json!({"role": "analytics", "weight": 1000}),
        ),
        (
            "/quota",
            serde_json::json!({"role": "analytics", "limit": "cpus:0.1"}),
        ),
    ] {
        let (status, message) = refused("viewer write", viewer.post_json(path, &body).await);
        assert_eq!(status, 403, "{path}: {message}");
        assert!(message.contains("viewer"), "{message}");
    }
    let state: serde_json::Value =
        serde_json::from_str(&viewer.get("/state").await.unwrap()).unwrap();
    assert_ne!(weight_of(&state, "analytics"), Some(1000.0), "{state:#}");
    assert!(
        state["allocator"]["roles"]["analytics"]["quota_limit"].is_null(),
        "{state:#}"
    );

    // 4. A token works for what the ACLs grant it; a wrong token is 401.
    let ci = client(addr, &tls_dir, Credentials::Token(token.clone()));
    ci.post_json(
        "/weights",
        &serde_json::json!({"role": "batch-ci", "weight": 4}),
    )
    .await
    .unwrap();
    let (status, _) = refused(
        "ci quota",
        ci.post_json(
            "/quota",
            &serde_json::json!({"role": "batch-ci", "limit": "cpus:1"}),
        )
        .await,
    );
    assert_eq!(status, 403);
    let mut wrong = token.clone();
    wrong.replace_range(0..1, if wrong.starts_with('0') { "1" } else { "0" });
    let forged = client(addr, &tls_dir, Credentials::Token(wrong));
    let (status, _) = refused(
        "wrong token",
        forged
            .post_json(
                "/weights",
                &serde_json::json!({"role": "analytics", "weight": 1000}),
            )
            .await,
    );
    assert_eq!(status, 401);
    // A wrong token is refused even over a good certificate.
    let mixed = client(addr, &tls_dir, Credentials::Token("not-a-token".into()));
    assert_eq!(refused("bad token", mixed.get("/state").await).0, 401);

    // 5. Absurd weights are 400, whoever asks.
    let admin = client(addr, &tls_dir, Credentials::Certificate("admin".into()));
    for weight in ["NaN", "-1", "0", "1e300", "1e400", "\"heavy\""] {
        let body = format!(r#"{{"role":"analytics","weight":{weight}}}"#);
        let mut s = raw_tls(addr, &tls_dir, Some("admin")).await;
        s.write_all(
            format!(
                "POST /weights HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let (resp, _) = read_until_closed(&mut s, Duration::from_secs(10)).await;
        assert!(resp.starts_with("HTTP/1.1 400"), "weight {weight}: {resp}");
        assert!(resp.contains("\"error\":\"bad_request\""), "{resp}");
    }

    // 6. Slow and oversized requests are cut off, concurrently.
    let (loris, (body_resp, body_time), silent, ()) = tokio::join!(
        slowloris_headers(addr, &tls_dir),
        slow_body(addr, &tls_dir),
        silent_connection(addr),
        oversized_bodies(addr, &tls_dir),
    );
    assert!(loris < Duration::from_secs(30), "slowloris held {loris:?}");
    assert!(
        body_resp.starts_with("HTTP/1.1 408"),
        "stalled body after {body_time:?}: {body_resp}"
    );
    assert!(
        silent < Duration::from_secs(30),
        "silent connection held {silent:?}"
    );

    // 7. A permitted operator's change is visible in /state.
    admin
        .post_json(
            "/weights",
            &serde_json::json!({"role": "analytics", "weight": 2.5}),
        )
        .await
        .unwrap();
    admin
        .post_json(
            "/quota",
            &serde_json::json!({"role": "analytics", "limit": "cpus:100"}),
        )
        .await
        .unwrap();
    let state = cluster.master.state().unwrap();
    assert_eq!(weight_of(&state, "analytics"), Some(2.5), "{state:#}");
    assert_eq!(weight_of(&state, "batch-ci"), Some(4.0), "{state:#}");
    assert_eq!(
        state["allocator"]["roles"]["analytics"]["quota_limit"]["cpus"], 100.0,
        "{state:#}"
    );

    // The legitimate framework finished every task meanwhile.
    let progress = tokio::time::timeout(Duration::from_secs(120), batch)
        .await
        .expect("the legitimate framework finished")
        .unwrap()
        .unwrap();
    assert_finished_once("legit", &progress, 24);
}

/// `--http-public-reads` opens `/state` to anyone, but never a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_reads_open_state_but_not_writes() {
    let cluster =
        Cluster::start_with(&[("pr1", "cpus:1;mem:256")], &["--http-public-reads"], &[]).unwrap();
    let anonymous = client(cluster.master.http, &cluster.tls_dir, Credentials::None);
    let state: serde_json::Value =
        serde_json::from_str(&anonymous.get("/state").await.unwrap()).unwrap();
    assert_eq!(state["agents"].as_array().map(Vec::len), Some(1));
    let (status, _) = refused(
        "anonymous write",
        anonymous
            .post_json("/weights", &serde_json::json!({"role": "x", "weight": 2}))
            .await,
    );
    assert_eq!(status, 401);
}

fn master_cmd(dir: &Path, tls_dir: &Path, http: &str, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(bin("gantry-master").unwrap())
        .arg("--listen")
        .arg(free_udp().to_string())
        .arg("--http")
        .arg(http)
        .arg("--work-dir")
        .arg(dir.join("work"))
        .arg("--tls-dir")
        .arg(tls_dir)
        .args(extra)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// Plain HTTP only on loopback; a TLS directory or key others may write stops the master.
#[test]
fn the_master_refuses_unsafe_http_and_tls_settings() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("gantry-opauth-refuse").unwrap();
    let tls_dir = dir.path().join("tls");
    let port = free_tcp().port();
    let out = master_cmd(
        dir.path(),
        &tls_dir,
        &format!("0.0.0.0:{port}"),
        &["--http-insecure"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("loopback"), "{err}");

    gantry_pki::ensure_ca(&tls_dir).unwrap();
    std::fs::set_permissions(&tls_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = master_cmd(dir.path(), &tls_dir, &free_tcp().to_string(), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("writable by others"), "{err}");

    std::fs::set_permissions(&tls_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(
        tls_dir.join("ca.key"),
        std::fs::Permissions::from_mode(0o660),
    )
    .unwrap();
    let out = master_cmd(dir.path(), &tls_dir, &free_tcp().to_string(), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("ca.key") && err.contains("its group"), "{err}");

    // The agent refuses the same.
    std::fs::set_permissions(
        tls_dir.join("ca.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(&tls_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = std::process::Command::new(bin("gantry-agent").unwrap())
        .arg("--master")
        .arg(free_udp().to_string())
        .arg("--work-dir")
        .arg(dir.path().join("agent"))
        .arg("--tls-dir")
        .arg(&tls_dir)
        .args(["--name", "perm", "--resources", "cpus:1;mem:64"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("writable by others"), "{err}");
}

/// `gantryctl` exit codes: 4 when the ACLs refuse, 2 for usage errors; tokens from
/// `gantryctl token create` work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gantryctl_speaks_https_with_certificates_and_tokens() {
    let conf = TempDir::new("gantry-opauth-ctl").unwrap();
    let acls = conf.path().join("acls.toml");
    std::fs::write(&acls, ACLS).unwrap();
    let tokens = conf.path().join("tokens.toml");
    let created = std::process::Command::new(bin("gantryctl").unwrap())
        .args(["token", "create", "ci", "--file"])
        .arg(&tokens)
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let token = String::from_utf8_lossy(&created.stdout).trim().to_string();
    assert_eq!(token.len(), 64, "{token}");
    assert!(!std::fs::read_to_string(&tokens).unwrap().contains(&token));
    let cluster = Cluster::start_with(
        &[("ctl1", "cpus:1;mem:256")],
        &[
            "--acls",
            acls.to_str().unwrap(),
            "--operator-tokens",
            tokens.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap();
    gantry_pki::load_or_issue(
        &cluster.tls_dir,
        &PeerIdentity::Operator("viewer".into()),
        &[],
    )
    .unwrap();
    let ok = cluster.master.gantryctl(&["weight", "ml", "2"]).unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let denied = cluster
        .master
        .gantryctl(&["--operator", "viewer", "weight", "ml", "3"])
        .unwrap();
    assert_eq!(denied.status.code(), Some(4), "{denied:?}");
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("may not set_weight"),
        "{}",
        String::from_utf8_lossy(&denied.stderr)
    );
    let by_token = std::process::Command::new(bin("gantryctl").unwrap())
        .args(["weight", "ml", "5", "--master"])
        .arg(format!("https://{}", cluster.master.http))
        .arg("--tls-dir")
        .arg(cluster.master.tls_dir())
        .env("GANTRY_TOKEN", &token)
        .output()
        .unwrap();
    assert!(
        by_token.status.success(),
        "{}",
        String::from_utf8_lossy(&by_token.stderr)
    );
    let usage = cluster.master.gantryctl(&["weight"]).unwrap();
    assert_eq!(usage.status.code(), Some(2));
    let s = cluster.master.state().unwrap();
    assert_eq!(weight_of(&s, "ml"), Some(5.0), "{s:#}");

    // Revoking: replace the token file and send SIGHUP; the old token stops working at once,
    // the new one works, and the master keeps running.
    let new_token = gantry_master::tokens::generate().unwrap();
    std::fs::write(&tokens, gantry_master::tokens::file_entry("ci", &new_token)).unwrap();
    // SAFETY: kill(2) on the master process this test started.
    unsafe {
        libc::kill(cluster.master.proc.pid(), libc::SIGHUP);
    }
    let with = |t: &str| {
        client(
            cluster.master.http,
            cluster.master.tls_dir(),
            Credentials::Token(t.into()),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while with(&token).get("/state").await.is_ok() {
        assert!(Instant::now() < deadline, "the revoked token still works");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refused("revoked", with(&token).get("/state").await).0, 401);
    with(&new_token).get("/state").await.unwrap();
}

/// `--http-insecure` on loopback: plain HTTP (with a warning), authentication unchanged — a
/// token is needed for writes; `/health` and public reads still answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_http_on_loopback_still_needs_credentials() {
    let conf = TempDir::new("gantry-opauth-insecure").unwrap();
    let (token, tokens) = ci_token_file(conf.path());
    let cluster = Cluster::start_with(
        &[("in1", "cpus:1;mem:256")],
        &[
            "--http-insecure",
            "--http-public-reads",
            "--operator-tokens",
            tokens.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap();
    let log = std::fs::read_to_string(&cluster.master.log).unwrap();
    assert!(log.contains("--http-insecure"), "{log}");
    let plain = |credentials| {
        OperatorClient::new(&ClientConfig {
            master: format!("http://{}", cluster.master.http),
            tls_dir: None,
            credentials,
            timeout: Duration::from_secs(20),
        })
        .unwrap()
    };
    let body = serde_json::json!({"role": "x", "weight": 2});
    let (status, _) = refused(
        "anonymous plain write",
        plain(Credentials::None).post_json("/weights", &body).await,
    );
    assert_eq!(status, 401);
    plain(Credentials::Token(token))
        .post_json("/weights", &body)
        .await
        .unwrap();
    assert_eq!(weight_of(&cluster.master.state().unwrap(), "x"), Some(2.0));
}
