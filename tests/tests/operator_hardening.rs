//! The operator port attacked (hardening issue, items 3, 4 and 6), on one real master with
//! default limits except a short write deadline, a small send buffer and a small subscriber cap
//! (so the event-stream attack fills its buffers in seconds):
//!
//! - guessing tokens over HTTPS and through the dashboard login is answered 429 with
//!   `Retry-After` after 10 failures from an address, while an operator from another address
//!   (token) and one with a certificate from the same address are served; a short token in the
//!   file never works and `gantryctl token hash` refuses weak tokens;
//! - the dashboard: no token in the URL, a CSRF-checked POST login, a random server-side
//!   session (not the token) in a Secure HttpOnly SameSite=Strict cookie that authenticates
//!   reads only, logout that revokes it, `X-Frame-Options: DENY` and a CSP;
//! - event-stream subscribers that never read are closed by the write deadline, a principal
//!   past its subscriber cap gets 429, and a reading subscriber gets every event;
//! - hundreds of half-open TLS handshakes and trickled request heads from 127.0.0.1 and
//!   127.0.0.2, re-opened as they close, then silent connections from 20 addresses: every
//!   operator read (new connections from other addresses, a keep-alive connection from the
//!   attacked address, a token) succeeds.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_sdk::transport::tls::PeerIdentity;
use gantry_tests::{bin, Cluster, TempDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "operator_hardening/net.rs"]
mod net;
use net::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_port_holds_under_guessing_sessions_stalled_streams_and_floods() {
    let conf = TempDir::new("gantry-ophard").unwrap();
    let (token, tokens) = token_file(conf.path());
    let cluster = Cluster::start_with(
        &[],
        &[
            "--operator-tokens",
            tokens.to_str().unwrap(),
            "--http-write-timeout",
            "2",
            "--http-send-buffer-kib",
            "16",
            "--http-max-event-subscribers-per-principal",
            "4",
        ],
        &[],
    )
    .unwrap();
    let addr = cluster.master.http;
    let base = format!("https://{addr}");
    let tls_dir = cluster.tls_dir.clone();
    gantry_pki::load_or_issue(&tls_dir, &PeerIdentity::Operator("viewer".into()), &[]).unwrap();
    let admin = client(&tls_dir, lo(0, 0, 1), Some("admin"), true);
    let bearer = format!("Bearer {token}");

    // ---- Item 6: guessing is rate-limited, per address --------------------------------------
    let guesser = client(&tls_dir, lo(0, 0, 6), None, true);
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..25 {
        let guess = format!("Bearer {}", gantry_master::tokens::generate().unwrap());
        let (status, headers, body) = get(
            &guesser,
            &base,
            "/api/v1/summary",
            &[("authorization", &guess)],
        )
        .await
        .unwrap();
        if status == 429 {
            assert!(body.contains("too_many_requests"), "{body}");
            retry_after = headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
        }
        statuses.push(status);
    }
    let unauthorized = statuses.iter().filter(|s| **s == 401).count();
    assert!(
        (10..=12).contains(&unauthorized) && statuses[15..].iter().all(|s| *s == 429),
        "10 guesses per address, then 429: {statuses:?}"
    );
    assert!(
        retry_after.is_some_and(|s| (1..=60).contains(&s)),
        "{retry_after:?}"
    );
    // While limited, even the right token from that address waits (a guess tells nothing)...
    let (status, _, _) = get(
        &guesser,
        &base,
        "/api/v1/summary",
        &[("authorization", &bearer)],
    )
    .await
    .unwrap();
    assert_eq!(status, 429);
    // ...but an operator with a certificate there, and the token from elsewhere, are served.
    let admin_at_guesser = client(&tls_dir, lo(0, 0, 6), Some("admin"), true);
    assert_eq!(
        get(&admin_at_guesser, &base, "/api/v1/summary", &[])
            .await
            .unwrap()
            .0,
        200
    );
    let ci = client(&tls_dir, lo(0, 0, 8), None, true);
    for _ in 0..3 {
        let (status, _, body) = get(&ci, &base, "/api/v1/summary", &[("authorization", &bearer)])
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
    }
    // Through the dashboard login: the same limit.
    let browser = client(&tls_dir, lo(0, 0, 7), None, true);
    let (status, headers, html) = get(&browser, &base, "/ui/login", &[]).await.unwrap();
    assert_eq!(status, 200);
    let (csrf_cookie, _) = set_cookie(&headers, "gantry_csrf").expect("csrf cookie");
    let csrf = csrf_field(&html);
    assert_eq!(csrf, csrf_cookie);
    let cookie = format!("gantry_csrf={csrf}");
    let mut login_statuses = Vec::new();
    for _ in 0..15 {
        let guess = gantry_master::tokens::generate().unwrap();
        let (status, _, _) = post_form(
            &browser,
            &base,
            "/ui/login",
            &[("token", &guess), ("csrf", &csrf)],
            &cookie,
        )
        .await;
        login_statuses.push(status);
    }
    assert!(
        login_statuses[..10].iter().all(|s| *s == 401)
            && login_statuses[12..].iter().all(|s| *s == 429),
        "dashboard login guesses: {login_statuses:?}"
    );
    // Operators see it in /metrics.
    let (_, _, metrics) = get(&admin_at_guesser, &base, "/metrics", &[])
        .await
        .unwrap();
    let series = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    assert!(
        series("gantry_operator_auth_failures_total") >= 20,
        "{metrics}"
    );
    assert!(
        series("gantry_operator_auth_rate_limited_total") >= 10,
        "{metrics}"
    );
    // A short token hashed into the file by hand never authenticates.
    let weak = client(&tls_dir, lo(0, 0, 9), None, true);
    let (status, _, _) = get(
        &weak,
        &base,
        "/api/v1/summary",
        &[("authorization", "Bearer hunter2hunter2")],
    )
    .await
    .unwrap();
    assert_eq!(status, 401);
    // ...and gantryctl refuses to hash one.
    for (input, ok) in [
        ("hunter2\n", false),
        (&*format!("{}\n", "ab".repeat(40)), false),
        (&*format!("{token}\n"), true),
    ] {
        let mut child = std::process::Command::new(bin("gantryctl").unwrap())
            .args(["token", "hash", "someone"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.success(),
            ok,
            "{input:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // ---- Item 6: dashboard sessions --------------------------------------------------------
    let web = client(&tls_dir, lo(0, 1, 1), None, true);
    // A token in the URL is refused (it would end up in history and logs).
    let (status, _, body) = get(&web, &base, &format!("/ui/login?token={token}"), &[])
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(!body.contains(&token));
    let (status, headers, html) = get(&web, &base, "/ui/login", &[]).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers["x-frame-options"], "DENY");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    let (csrf_cookie, attrs) = set_cookie(&headers, "gantry_csrf").unwrap();
    assert!(
        attrs.contains("HttpOnly") && attrs.contains("Secure") && attrs.contains("SameSite=Strict"),
        "{attrs}"
    );
    let csrf = csrf_field(&html);
    // A login without the form's CSRF token (a cross-site login) is refused.
    let (status, _, _) = post_form(
        &web,
        &base,
        "/ui/login",
        &[("token", &token), ("csrf", "forged")],
        &format!("gantry_csrf={csrf_cookie}"),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _, _) = post_form(
        &web,
        &base,
        "/ui/login",
        &[("token", &token), ("csrf", &csrf)],
        "",
    )
    .await;
    assert_eq!(status, 403, "no CSRF cookie");
    let (status, headers, _) = post_form(
        &web,
        &base,
        "/ui/login",
        &[("token", &token), ("csrf", &csrf)],
        &format!("gantry_csrf={csrf_cookie}"),
    )
    .await;
    assert_eq!(status, 303);
    assert_eq!(headers["location"], "/ui");
    let (session, attrs) = set_cookie(&headers, "gantry_session").expect("session cookie");
    assert!(
        attrs.contains("HttpOnly") && attrs.contains("Secure") && attrs.contains("SameSite=Strict"),
        "{attrs}"
    );
    assert!(attrs.contains("Max-Age="), "{attrs}");
    assert_ne!(session, token, "the cookie is not the token");
    assert!(
        !session.contains(&token) && session.len() >= 32,
        "{session}"
    );
    for v in headers.get_all("set-cookie") {
        assert!(
            !v.to_str().unwrap().contains(&token),
            "the token was sent back: {v:?}"
        );
    }
    let with_session = format!("gantry_session={session}");
    let (status, headers, page) = get(&web, &base, "/ui", &[("cookie", &with_session)])
        .await
        .unwrap();
    assert_eq!(status, 200, "{page}");
    assert_eq!(headers["x-frame-options"], "DENY");
    assert!(headers.contains_key("content-security-policy"));
    let logout_csrf = csrf_field(&page);
    assert_eq!(
        get(&web, &base, "/api/v1/summary", &[("cookie", &with_session)])
            .await
            .unwrap()
            .0,
        200
    );
    // The session authenticates reads only: a forged cross-site write is 401.
    let resp = web
        .post(format!("{base}/api/v1/weights"))
        .header("cookie", &with_session)
        .header("content-type", "application/json")
        .body(r#"{"role":"ml","weight":7}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    // The token itself as a cookie (the old scheme) does not authenticate.
    assert_eq!(
        get(
            &web,
            &base,
            "/api/v1/summary",
            &[("cookie", &format!("gantry_token={token}"))]
        )
        .await
        .unwrap()
        .0,
        401
    );
    // Logout needs the page's CSRF token, then revokes the session on the master.
    let (status, _, _) = post_form(
        &web,
        &base,
        "/ui/logout",
        &[("csrf", "forged")],
        &with_session,
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(
        get(&web, &base, "/api/v1/summary", &[("cookie", &with_session)])
            .await
            .unwrap()
            .0,
        200
    );
    let (status, headers, _) = post_form(
        &web,
        &base,
        "/ui/logout",
        &[("csrf", &logout_csrf)],
        &with_session,
    )
    .await;
    assert_eq!(status, 303);
    assert!(set_cookie(&headers, "gantry_session")
        .is_some_and(|(v, a)| v.is_empty() && a.contains("Max-Age=0")));
    assert_eq!(
        get(&web, &base, "/api/v1/summary", &[("cookie", &with_session)])
            .await
            .unwrap()
            .0,
        401
    );
    let (status, headers, _) = get(&web, &base, "/ui", &[("cookie", &with_session)])
        .await
        .unwrap();
    assert_eq!(
        (status, headers["location"].to_str().unwrap()),
        (303, "/ui/login")
    );

    // ---- Item 4: event-stream subscribers --------------------------------------------------
    // Four subscribers of principal `viewer` that never read (tiny receive buffers).
    let mut stalled = Vec::new();
    for i in 0..4 {
        let mut s = tls_from(lo(0, 2, 1 + i), addr, &tls_dir, Some("viewer"), Some(4096))
            .await
            .unwrap();
        s.write_all(
            b"GET /api/v1/events HTTP/1.1\r\nHost: master\r\nAccept: text/event-stream\r\n\r\n",
        )
        .await
        .unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200", "subscriber {i}");
        stalled.push(s);
    }
    // A fifth of the same principal: past the cap.
    let viewer = client(&tls_dir, lo(0, 2, 9), Some("viewer"), false);
    let (status, headers, body) = get(&viewer, &base, "/api/v1/events", &[]).await.unwrap();
    assert_eq!(status, 429, "{body}");
    assert!(headers.contains_key("retry-after"));
    assert!(
        body.contains("--http-max-event-subscribers-per-principal"),
        "{body}"
    );
    // A legitimate subscriber (another principal) reads everything.
    let seen = Arc::new(Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        let c = client(&tls_dir, lo(0, 2, 10), Some("admin"), false);
        let base = base.clone();
        tokio::spawn(async move {
            let mut resp = c
                .get(format!("{base}/api/v1/events"))
                .timeout(Duration::from_secs(600))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 200);
            while let Ok(Some(chunk)) = resp.chunk().await {
                seen.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&chunk));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while port_stats(&admin, &base).await["event_subscribers"] != 5 {
        assert!(
            Instant::now() < deadline,
            "{}",
            port_stats(&admin, &base).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Events flow (role changes with long names) until the stalled subscribers' buffers are
    // full; past the 2 s write deadline the master closes them.
    let pad = "x".repeat(90);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut n = 0u32;
    let last_role = loop {
        for _ in 0..25 {
            n += 1;
            let body = serde_json::json!({"role": format!("evt-{pad}-{}", n % 40), "weight": 1.0 + f64::from(n % 7)});
            let resp = admin
                .post(format!("{base}/api/v1/weights"))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 200);
        }
        let stats = port_stats(&admin, &base).await;
        if stats["event_subscribers"] == 1 {
            break format!("evt-{pad}-{}", n % 40);
        }
        assert!(
            Instant::now() < deadline,
            "subscribers that never read still held after {n} events: {stats}"
        );
    };
    // The stalled connections were closed by the master.
    for (i, s) in stalled.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(10)).await,
            "stalled subscriber {i} still open"
        );
    }
    // The reading subscriber got the events, up to the last.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen
        .lock()
        .unwrap()
        .contains(&format!("\"role\":\"{last_role}\""))
    {
        assert!(
            Instant::now() < deadline,
            "the reading subscriber missed events"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!seen.lock().unwrap().contains("\"dropped\""));
    // Their slots are free again.
    let resp = viewer
        .get(format!("{base}/api/v1/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    drop(resp);
    reader.abort();

    // ---- Item 3: connection floods -----------------------------------------------------------
    // A keep-alive operator connection from the address about to be attacked.
    let mut keep = KeepAlive::open(lo(0, 0, 1), addr, &tls_dir).await;
    assert_eq!(keep.get("/api/v1/summary").await.unwrap().0, 200);
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let mut attackers = Vec::new();
    for a in [lo(0, 0, 1), lo(0, 0, 2)] {
        for kind in [Attack::Silent, Attack::HalfHello, Attack::SlowHead] {
            attackers.extend(flood(kind, a, 50, addr, &tls_dir, &stop, &opened));
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let fresh_cert = client(&tls_dir, lo(0, 0, 3), Some("admin"), false);
    let fresh_token = client(&tls_dir, lo(0, 0, 4), None, false);
    let token_header = [("authorization", bearer.as_str())];
    let mut failures = Vec::new();
    let mut max_unauth = 0;
    for i in 0..14 {
        match keep.get("/api/v1/summary").await {
            Ok((200, _)) => {}
            other => failures.push(format!(
                "read {i} (keep-alive, certificate, 127.0.0.1): {other:?}"
            )),
        }
        match get(&fresh_cert, &base, "/api/v1/summary", &[]).await {
            Ok((200, _, _)) => {}
            other => failures.push(format!(
                "read {i} (new connection, certificate, 127.0.0.3): {other:?}"
            )),
        }
        match get(&fresh_token, &base, "/api/v1/summary", &token_header).await {
            Ok((200, _, _)) => {}
            other => failures.push(format!(
                "read {i} (new connection, token, 127.0.0.4): {other:?}"
            )),
        }
        let stats = keep.stats().await;
        max_unauth = max_unauth.max(stats["unauthenticated_connections"].as_u64().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for a in attackers.drain(..) {
        let _ = a.await;
    }
    let attempts = opened.swap(0, Ordering::Relaxed);
    assert!(failures.is_empty(), "{} of 42 operator reads failed under a 2-address flood ({attempts} attacker connections): {failures:#?}", failures.len());
    assert!(attempts > 300, "the attack ran: {attempts} connections");
    assert!(
        max_unauth <= 2 * 16 + 8,
        "the per-address cap held: {max_unauth}"
    );

    // Silent connections from 20 addresses, more than every slot: the unauthenticated share
    // fills, its oldest connections make room, operators still get in.
    let stop = Arc::new(AtomicBool::new(false));
    for i in 0..20u8 {
        attackers.extend(flood(
            Attack::Silent,
            lo(0, 3, 10 + i),
            16,
            addr,
            &tls_dir,
            &stop,
            &opened,
        ));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let fresh_cert = client(&tls_dir, lo(0, 0, 5), Some("admin"), false);
    let mut max_unauth = 0;
    for i in 0..14 {
        match get(&fresh_cert, &base, "/api/v1/summary", &[]).await {
            Ok((200, _, _)) => {}
            other => failures.push(format!("read {i} (new connection, 127.0.0.5): {other:?}")),
        }
        match keep.get("/api/v1/summary").await {
            Ok((200, _)) => {}
            other => failures.push(format!("read {i} (keep-alive): {other:?}")),
        }
        let stats = keep.stats().await;
        max_unauth = max_unauth.max(stats["unauthenticated_connections"].as_u64().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let stats = keep.stats().await;
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.await;
    }
    assert!(
        failures.is_empty(),
        "{} of 28 operator reads failed under a 20-address flood: {failures:#?}",
        failures.len()
    );
    assert!(
        (150..=192).contains(&max_unauth),
        "the unauthenticated share filled and held: {max_unauth}"
    );
    assert!(
        stats["unauthenticated_closed_for_room"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{stats}"
    );
}
