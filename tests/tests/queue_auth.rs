//! `gantry-queue`'s API with an ACL file, attacked with a raw HTTPS client: a real master and
//! agent, the queue serving HTTPS (a server certificate of the cluster CA) with users' tokens
//! (the master's token file format) and `user:NAME` client certificates, its own certificate a
//! `service:queue` one. Unauthenticated
//! requests get 401; submitting to another team, above one's priority, or to an undeclared team
//! is refused (403, 403, 400); cancelling another user's job is refused unless one administers
//! the team; the legitimate team's job finishes and is recorded with its user. The CLI speaks
//! the same (exit code 4 when forbidden).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gantry_master::security::tokens;
use gantry_sdk::transport::tls::{self, PeerIdentity};
use gantry_tests::{bin, free_tcp, Cluster, Proc};
use serde_json::{json, Value};

const ACL: &str = r#"
admins = ["root"]
[teams.nlp]
submit = { alice = "normal", dave = "high" }
admins = ["carol"]
[teams.cv]
submit = { bob = "critical" }
"#;

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

struct Https {
    base: String,
    plain: reqwest::Client,
    dave: reqwest::Client,
}

impl Https {
    async fn call(
        &self,
        client: &reqwest::Client,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = client.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

fn job(name: &str, team: &str, priority: &str, command: &str) -> Value {
    json!({
        "name": name, "team": team, "priority": priority, "command": [command],
        "cpus": 0.1, "mem": 16
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_and_cross_team_requests_are_refused_and_the_team_job_runs() {
    let cluster = Cluster::start(&[("qauth", "cpus:4;mem:1024")]).unwrap();
    let dir = cluster.dir.path();
    let ca = gantry_pki::CertAuthority::load(&cluster.tls_dir).unwrap();
    // The API's server certificate: a service certificate for the names clients use
    // (`gantryctl certs service queue --san localhost,127.0.0.1`), which identifies no client.
    let (cert, key) = ca
        .issue(
            &PeerIdentity::Service("queue".into()),
            &["localhost".into(), "127.0.0.1".into()],
        )
        .unwrap();
    write(&dir.join("queue-https.pem"), &cert, 0o644);
    write(&dir.join("queue-https.key"), &key, 0o600);
    // Dave's user certificate (`gantryctl certs user dave`).
    let dave = PeerIdentity::User("dave".into());
    let (cert, key) = ca.issue(&dave, &[]).unwrap();
    write(&dir.join(format!("{}.pem", dave.file_stem())), &cert, 0o644);
    write(&dir.join(format!("{}.key", dave.file_stem())), &key, 0o600);
    let mut token = std::collections::BTreeMap::new();
    let mut file = String::new();
    for user in ["alice", "bob", "carol", "root"] {
        let t = tokens::generate().unwrap();
        file += &tokens::file_entry(user, &t);
        token.insert(user, t);
    }
    write(&dir.join("tokens.toml"), &file, 0o600);
    write(&dir.join("acl.toml"), ACL, 0o644);

    let addr = free_tcp();
    let mut cmd = Command::new(bin("gantry-queue").unwrap());
    cmd.args([
        "serve",
        "--master",
        &cluster.master.quic.to_string(),
        "--tls-dir",
    ])
    .arg(&cluster.tls_dir)
    .arg("--store")
    .arg(dir.join("queue.redb"))
    .args(["--listen", &addr.to_string()])
    .arg("--acl")
    .arg(dir.join("acl.toml"))
    .arg("--tokens")
    .arg(dir.join("tokens.toml"))
    .arg("--https-cert")
    .arg(dir.join("queue-https.pem"))
    .arg("--https-key")
    .arg(dir.join("queue-https.key"))
    .arg("--master-api")
    .arg(format!("https://{}", cluster.master.http));
    let log = dir.join("gantry-queue.log");
    let mut queue = Proc::spawn("gantry-queue", cmd, &log).unwrap();

    let roots = tls::load_roots(&cluster.tls_dir).unwrap();
    let client = |identity: Option<&tls::Identity>| {
        let cfg = tls::https_client_config(roots.clone(), identity).unwrap();
        reqwest::Client::builder()
            .use_preconfigured_tls(cfg)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let dave_id = tls::load_identity(dir, &dave).unwrap();
    let api = Https {
        base: format!("https://127.0.0.1:{}", addr.port()),
        plain: client(None),
        dave: client(Some(&dave_id)),
    };
    use reqwest::Method;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = api
            .plain
            .get(format!("{}/jobs", api.base))
            .send()
            .await
            .is_ok();
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the API did not come up: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let c = &api.plain;

    // Unauthenticated: 401, reading or writing; an unknown token too.
    let (st, _) = api.call(c, Method::GET, "/jobs", None, None).await;
    assert_eq!(st, 401);
    let (st, v) = api
        .call(
            c,
            Method::POST,
            "/jobs",
            None,
            Some(job("x", "nlp", "normal", "true")),
        )
        .await;
    assert_eq!(st, 401, "{v}");
    let bogus = "f".repeat(64);
    let (st, v) = api.call(c, Method::GET, "/jobs", Some(&bogus), None).await;
    assert_eq!(st, 401, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("unknown token"),
        "{v}"
    );
    let (st, _) = api.call(c, Method::POST, "/shutdown", None, None).await;
    assert_eq!(st, 401);

    // Cross-team, above one's priority, an undeclared team, a bad body.
    let (st, v) = api
        .call(
            c,
            Method::POST,
            "/jobs",
            Some(&token["bob"]),
            Some(job("x", "nlp", "low", "true")),
        )
        .await;
    assert_eq!(
        (st, v["error"].as_str()),
        (403, Some("bob may not submit to team nlp"))
    );
    let (st, v) = api
        .call(
            c,
            Method::POST,
            "/jobs",
            Some(&token["alice"]),
            Some(job("x", "nlp", "critical", "true")),
        )
        .await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = api
        .call(
            c,
            Method::POST,
            "/jobs",
            Some(&token["alice"]),
            Some(job("x", "speech", "normal", "true")),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("unknown team"), "{v}");
    let (st, v) = api
        .call(
            c,
            Method::POST,
            "/jobs",
            Some(&token["alice"]),
            Some(json!({"name": 3})),
        )
        .await;
    assert_eq!(st, 400, "{v}");

    // Alice's long job; bob may not cancel it, carol (nlp's administrator) may.
    let (st, v) = api
        .call(
            c,
            Method::POST,
            "/jobs",
            Some(&token["alice"]),
            Some(job("long", "nlp", "normal", "sleep 120")),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let long = v["id"].as_u64().unwrap();
    let (st, v) = api
        .call(
            c,
            Method::DELETE,
            &format!("/jobs/{long}"),
            Some(&token["bob"]),
            None,
        )
        .await;
    assert_eq!(st, 403, "{v}");
    // The CLI says the same, with gantryctl's exit code for forbidden.
    let out = Command::new(bin("gantry-queue").unwrap())
        .args(["cancel", "--server", &api.base, "--ca"])
        .arg(cluster.tls_dir.join("ca.pem"))
        .args(["--token", &token["bob"], &long.to_string()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (st, v) = api
        .call(c, Method::POST, "/shutdown", Some(&token["alice"]), None)
        .await;
    assert_eq!(st, 403, "{v}");

    // The legitimate jobs: alice's by token, dave's by client certificate (up to high).
    let (st, v) = api
        .call(
            c,
            Method::POST,
            "/jobs",
            Some(&token["alice"]),
            Some(job("ok", "nlp", "normal", "true")),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let ok = v["id"].as_u64().unwrap();
    let (st, v) = api
        .call(
            &api.dave,
            Method::POST,
            "/jobs",
            None,
            Some(job("cert", "nlp", "high", "true")),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let cert_job = v["id"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let jobs = loop {
        let out = Command::new(bin("gantry-queue").unwrap())
            .args(["list", "--json", "--server", &api.base, "--ca"])
            .arg(cluster.tls_dir.join("ca.pem"))
            .env("GANTRY_QUEUE_TOKEN", &token["bob"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let jobs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        let done = |id: u64| {
            jobs.iter()
                .any(|j| j["id"] == id && j["state"] == "FINISHED")
        };
        if done(ok) && done(cert_job) {
            break jobs;
        }
        assert!(Instant::now() < deadline, "jobs did not finish: {jobs:#?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let user_of = |id: u64| jobs.iter().find(|j| j["id"] == id).unwrap()["user"].clone();
    assert_eq!(user_of(ok), "alice");
    assert_eq!(user_of(cert_job), "dave");
    assert_eq!(user_of(long), "alice");

    // Logs, relayed from the master: alice follows her running job's output to its end (the
    // CLI); bob, of another team, is refused.
    let (st, v) = api
        .call(
            c,
            Method::POST,
            "/jobs",
            Some(&token["alice"]),
            Some(job(
                "chatty",
                "nlp",
                "normal",
                "for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.5; done; echo bye >&2",
            )),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let chatty = v["id"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = api
            .call(
                c,
                Method::GET,
                &format!("/jobs/{chatty}"),
                Some(&token["alice"]),
                None,
            )
            .await;
        if v["state"] == "RUNNING" && v["members"][0]["state"] == "RUNNING" {
            break;
        }
        assert!(Instant::now() < deadline, "not running: {v:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (st, v) = api
        .call(
            c,
            Method::GET,
            &format!("/jobs/{chatty}/logs?follow=true"),
            Some(&token["bob"]),
            None,
        )
        .await;
    assert_eq!(st, 403, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("may not read the logs"),
        "{v}"
    );
    let logs = |args: &[&str]| {
        Command::new(bin("gantry-queue").unwrap())
            .args(["logs", "--server", &api.base, "--ca"])
            .arg(cluster.tls_dir.join("ca.pem"))
            .args(args)
            .arg(chatty.to_string())
            .output()
            .unwrap()
    };
    let out = logs(&["--token", &token["alice"], "-f"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: String = (1..=6).map(|i| format!("tick {i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    let out = logs(&["--token", &token["bob"], "--stderr"]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (st, v) = api
        .call(
            c,
            Method::DELETE,
            &format!("/jobs/{long}"),
            Some(&token["carol"]),
            None,
        )
        .await;
    assert_eq!((st, &v["state"]), (200, &json!("CANCELLED")), "{v}");
    assert!(queue.terminate(Duration::from_secs(10)));
}
