//! The operator API `/api/v1` on a live cluster (issue 14 items 2 and 4): every read, every
//! write (weights, quotas, reserve/unreserve, deactivate/reactivate, mark gone, teardown, GPU
//! clear), 401 without credentials and 403 for an operator the ACLs grant nothing, the event
//! stream followed by `gantryctl events` (a snapshot, then task, agent, framework and role
//! changes), `gantryctl` tables and exit codes, and the writes the registry holds still there
//! after a master restart and after an HA failover (masters on a real etcd; a standby refuses
//! writes with 503).

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use gantry_master::client::{ClientError, Credentials, OperatorClient};
use gantry_sdk::transport::tls::PeerIdentity;
use gantry_tests::etcd::EtcdServer;
use gantry_tests::{
    bin, driver_config, start_recorder, task, AgentProc, Cluster, MasterProc, TempDir,
};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

const ACLS: &str = r#"
[[register_frameworks]]
principals = ["*"]
roles = ["*"]

[[run_tasks]]
principals = ["*"]
users = ["*"]

[[operator]]
principals = ["admin"]
actions = ["*"]
"#;

use gantry_tests::https_client as client;

async fn get(c: &OperatorClient, path: &str) -> Value {
    let body = c
        .get(path)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e:#}"));
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

async fn post(c: &OperatorClient, path: &str, body: Value) -> Value {
    let answer = c
        .post_json(path, &body)
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e:#}"));
    serde_json::from_str(&answer).unwrap()
}

/// The status and JSON error code of a refused request (panics when it was not refused).
fn refused(what: &str, r: Result<String, ClientError>) -> (u16, String) {
    match r {
        Ok(body) => panic!("{what}: not refused: {body}"),
        Err(ClientError::Status { status, code, .. }) => {
            assert!(!code.is_empty(), "{what}: error without a JSON code");
            (status, code)
        }
        Err(e) => panic!("{what}: no HTTP answer: {e:#}"),
    }
}

/// Polls `GET path` until `pred` holds.
async fn wait_for(
    c: &OperatorClient,
    path: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + T;
    loop {
        if let Ok(body) = c.get(path).await {
            if let Ok(v) = serde_json::from_str::<Value>(&body) {
                if pred(&v) {
                    return v;
                }
                if Instant::now() > deadline {
                    panic!("timed out waiting for {what}; last {path}: {v:#}");
                }
            }
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}: {path} unreachable");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `gantryctl ARGS` against the cluster as operator `operator`: (exit code, stdout, stderr).
fn gantryctl(cluster: &Cluster, operator: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin("gantryctl").unwrap())
        .arg("--master")
        .arg(format!("https://{}", cluster.master.http))
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .arg("--operator")
        .arg(operator)
        .args(args)
        .env_remove("GANTRY_CONFIG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `gantryctl --json events` in the background: its lines (one JSON event each) arrive on the
/// channel. The child is killed when the guard drops.
struct EventFollower {
    child: std::process::Child,
    lines: std_mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

impl EventFollower {
    fn start(cluster: &Cluster) -> Self {
        let mut child = Command::new(bin("gantryctl").unwrap())
            .arg("--master")
            .arg(format!("https://{}", cluster.master.http))
            .arg("--tls-dir")
            .arg(&cluster.tls_dir)
            .args(["--json", "events"])
            .env_remove("GANTRY_CONFIG")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std_mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) => {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        panic!("gantryctl events printed a line that is not JSON ({e}): {line}")
                    }
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits until an event matching `pred` has arrived (since the start).
    async fn wait(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + T;
        loop {
            if let Some(e) = self.seen.iter().find(|e| pred(e)) {
                return e.clone();
            }
            while let Ok(v) = self.lines.try_recv() {
                self.seen.push(v);
            }
            if self.seen.iter().any(&pred) {
                continue;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} event within {T:?}; seen: {:#?}",
                self.seen
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for EventFollower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_api_reads_writes_events_and_survives_a_restart() {
    let mut cluster = Cluster::start_with_acls(
        &[
            ("api-a1", "cpus:4;mem:2048"),
            ("api-a2", "cpus:4;mem:2048"),
            ("api-a3", "cpus:1;mem:512"),
        ],
        ACLS,
        &[],
    )
    .unwrap();
    let addr = cluster.master.http;
    let tls_dir = cluster.tls_dir.clone();
    gantry_pki::load_or_issue(&tls_dir, &PeerIdentity::Operator("viewer".into()), &[]).unwrap();
    let admin = client(addr, &tls_dir, Credentials::Certificate("admin".into()));
    let viewer = client(addr, &tls_dir, Credentials::Certificate("viewer".into()));
    let nobody = client(addr, &tls_dir, Credentials::None);

    let mut events = EventFollower::start(&cluster);
    let snapshot = events.wait("snapshot", |e| e["type"] == "snapshot").await;
    assert_eq!(snapshot["state"]["agents"].as_array().unwrap().len(), 3);

    // A framework with two long tasks on the two big agents (one each: 3 cpus each).
    let cfg = driver_config(
        vec![cluster.master.quic.to_string()],
        tls_dir.clone(),
        "api-fw",
        vec!["eng".into()],
    );
    let tasks = vec![
        task("long-1", "sleep 120", "cpus:3;mem:64"),
        task("long-2", "sleep 120", "cpus:3;mem:64"),
    ];
    let (_updates, _handle, _driver) = start_recorder(cfg, tasks);
    let running = wait_for(
        &admin,
        "/api/v1/tasks?state=RUNNING",
        "2 running tasks",
        |v| v["total"] == 2,
    )
    .await;
    let fw_id = running["tasks"][0]["framework_id"]
        .as_str()
        .unwrap()
        .to_string();
    events
        .wait("a RUNNING task", |e| {
            e["type"] == "task_updated" && e["state"] == "RUNNING"
        })
        .await;
    events
        .wait("framework_added", |e| {
            e["type"] == "framework_added" && e["name"] == "api-fw"
        })
        .await;

    // Reads.
    let s = get(&admin, "/api/v1/summary").await;
    assert_eq!(s["agents"]["total"], 3, "{s:#}");
    assert_eq!(s["agents"]["connected"], 3, "{s:#}");
    assert_eq!(s["tasks"]["by_state"]["RUNNING"], 2, "{s:#}");
    assert_eq!(s["frameworks"]["active"], 1, "{s:#}");
    assert_eq!(s["resources"]["total"]["cpus"], 9.0, "{s:#}");
    let index = get(&admin, "/api/v1").await;
    assert_eq!(index["version"], "v1");
    let agents = get(&admin, "/api/v1/agents").await;
    let names: Vec<&str> = agents
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api-a1", "api-a2", "api-a3"]);
    assert!(agents[0]["drain"].is_null());
    let a2 = get(&admin, "/api/v1/agents/api-a2").await;
    let a2_id = a2["id"].as_str().unwrap().to_string();
    assert_eq!(
        get(&admin, &format!("/api/v1/agents/{a2_id}")).await["name"],
        "api-a2"
    );
    let (st, code) = refused("unknown agent", admin.get("/api/v1/agents/nope").await);
    assert_eq!((st, code.as_str()), (404, "not_found"));
    let fws = get(&admin, "/api/v1/frameworks").await;
    assert_eq!(fws["frameworks"][0]["name"], "api-fw");
    assert!(fws["frameworks"][0]["dominant_share"].as_f64().unwrap() > 0.0);
    assert_eq!(
        get(&admin, &format!("/api/v1/frameworks/{fw_id}")).await["name"],
        "api-fw"
    );
    let on_a1 = get(&admin, "/api/v1/tasks?agent=api-a1").await;
    assert_eq!(on_a1["total"], 1, "{on_a1:#}");
    let of_fw = get(
        &admin,
        &format!("/api/v1/tasks?framework={fw_id}&limit=1&offset=1"),
    )
    .await;
    assert_eq!(of_fw["total"], 2);
    assert_eq!(of_fw["tasks"].as_array().unwrap().len(), 1);
    let (st, _) = refused("bad query", admin.get("/api/v1/tasks?limit=many").await);
    assert_eq!(st, 400);
    let (st, _) = refused(
        "unknown filter",
        admin.get("/api/v1/tasks?colour=red").await,
    );
    assert_eq!(st, 400);
    let roles = get(&admin, "/api/v1/roles").await;
    assert!(
        roles.as_array().unwrap().iter().any(|r| r["name"] == "eng"),
        "{roles:#}"
    );
    assert!(get(&admin, "/api/v1/offers").await.is_array());
    assert!(get(&admin, "/api/v1/quotas").await.is_array());
    assert!(get(&admin, "/api/v1/weights").await.is_array());
    assert_eq!(
        get(&admin, "/api/v1/maintenance").await["agents"],
        serde_json::json!([])
    );
    // Reads need an operator.
    let (st, _) = refused("anonymous read", nobody.get("/api/v1/summary").await);
    assert_eq!(st, 401);
    assert_eq!(get(&viewer, "/api/v1/summary").await["agents"]["total"], 3);

    // Every write: 401 anonymous, 403 for an operator the ACLs grant nothing; nothing changes.
    let writes: Vec<(String, Value)> = vec![
        (
            "/api/v1/weights".into(),
            serde_json::json!({"role": "eng", "weight": 2.0}),
        ),
        (
            "/api/v1/quotas".into(),
            serde_json::json!({"role": "eng", "guarantee": "cpus:1"}),
        ),
        (
            format!("/api/v1/agents/{a2_id}/reserve"),
            serde_json::json!({"role": "ops", "resources": "cpus:1"}),
        ),
        (
            format!("/api/v1/agents/{a2_id}/unreserve"),
            serde_json::json!({"role": "ops", "resources": "cpus:1"}),
        ),
        (
            format!("/api/v1/agents/{a2_id}/deactivate"),
            serde_json::json!({}),
        ),
        (
            format!("/api/v1/agents/{a2_id}/reactivate"),
            serde_json::json!({}),
        ),
        (
            format!("/api/v1/agents/{a2_id}/gone"),
            serde_json::json!({}),
        ),
        (
            format!("/api/v1/agents/{a2_id}/gpus/GPU-x/clear"),
            serde_json::json!({}),
        ),
        (
            format!("/api/v1/frameworks/{fw_id}/teardown"),
            serde_json::json!({}),
        ),
    ];
    for (path, body) in &writes {
        let (st, code) = refused(path, viewer.post_json(path, body).await);
        assert_eq!(
            (st, code.as_str()),
            (403, "forbidden"),
            "viewer POST {path}"
        );
        let (st, _) = refused(path, nobody.post_json(path, body).await);
        assert_eq!(st, 401, "anonymous POST {path}");
    }
    let s = get(&admin, "/api/v1/summary").await;
    assert_eq!(s["agents"]["total"], 3);
    assert_eq!(s["agents"]["deactivated"], 0);
    assert_eq!(s["frameworks"]["active"], 1);
    assert!(get(&admin, "/api/v1/weights")
        .await
        .as_array()
        .unwrap()
        .is_empty());

    // Writes by the admin.
    post(
        &admin,
        "/api/v1/weights",
        serde_json::json!({"role": "eng/x", "weight": 2.5}),
    )
    .await;
    post(
        &admin,
        "/api/v1/quotas",
        serde_json::json!({"role": "eng", "guarantee": "cpus:1", "limit": "cpus:8"}),
    )
    .await;
    events
        .wait("role_updated weight", |e| {
            e["type"] == "role_updated" && e["role"] == "eng/x"
        })
        .await;
    let (st, _) = refused(
        "a weight out of bounds",
        admin
            .post_json(
                "/api/v1/weights",
                &serde_json::json!({"role": "eng", "weight": -1}),
            )
            .await,
    );
    assert_eq!(st, 400);
    // api-a2 runs a 3-cpu task: 1 cpu is free to reserve, 2 are not.
    let (st, code) = refused(
        "reserving what a task holds",
        admin
            .post_json(
                "/api/v1/agents/api-a2/reserve",
                &serde_json::json!({"role": "ops", "resources": "cpus:2"}),
            )
            .await,
    );
    assert_eq!((st, code.as_str()), (409, "conflict"));
    let (st, _) = refused(
        "bad resources",
        admin
            .post_json(
                "/api/v1/agents/api-a2/reserve",
                &serde_json::json!({"role": "ops", "resources": "cpus:lots"}),
            )
            .await,
    );
    assert_eq!(st, 400);
    post(
        &admin,
        "/api/v1/agents/api-a2/reserve",
        serde_json::json!({"role": "ops", "resources": "cpus:1"}),
    )
    .await;
    let a2 = get(&admin, "/api/v1/agents/api-a2").await;
    assert_eq!(a2["reserved"]["ops"]["cpus"], 1.0, "{a2:#}");
    // Deactivate: no offers of it, listed under maintenance; reactivate.
    post(
        &admin,
        "/api/v1/agents/api-a3/deactivate",
        serde_json::json!({}),
    )
    .await;
    events
        .wait("agent deactivated", |e| {
            e["type"] == "agent_updated" && e["name"] == "api-a3" && e["active"] == false
        })
        .await;
    let m = get(&admin, "/api/v1/maintenance").await;
    assert_eq!(m["agents"][0]["name"], "api-a3", "{m:#}");
    let a3_id = m["agents"][0]["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let offers = get(&admin, "/api/v1/offers").await;
    assert!(
        !offers
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["agent_id"] == a3_id.as_str()),
        "a deactivated agent is offered: {offers:#}"
    );
    post(
        &admin,
        "/api/v1/agents/api-a3/reactivate",
        serde_json::json!({}),
    )
    .await;
    assert_eq!(
        get(&admin, "/api/v1/summary").await["agents"]["deactivated"],
        0
    );
    // A GPU an agent does not have.
    let (st, _) = refused(
        "clearing a GPU that does not exist",
        admin
            .post_json(
                "/api/v1/agents/api-a3/gpus/GPU-nope/clear",
                &serde_json::json!({}),
            )
            .await,
    );
    assert_eq!(st, 404);

    // gantryctl: tables, --json, exit codes.
    let (code, out, err) = gantryctl(&cluster, "admin", &["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("3 connected of 3"), "{out}");
    let (code, out, _) = gantryctl(&cluster, "admin", &["agents"]);
    assert_eq!(code, 0);
    assert!(out.contains("api-a1") && out.contains("STATUS"), "{out}");
    let (code, out, _) = gantryctl(&cluster, "admin", &["frameworks"]);
    assert_eq!(code, 0);
    assert!(out.contains("api-fw"), "{out}");
    let (code, out, _) = gantryctl(
        &cluster,
        "admin",
        &["--json", "tasks", "--state", "running"],
    );
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["total"], 2);
    let (code, out, _) = gantryctl(&cluster, "admin", &["roles"]);
    assert_eq!(code, 0);
    assert!(out.contains("eng/x") && out.contains("2.5"), "{out}");
    let (code, _, err) = gantryctl(&cluster, "admin", &["agents", "no-such-agent"]);
    assert_eq!(code, 3, "not found: {err}");
    let (code, _, err) = gantryctl(&cluster, "viewer", &["weight", "eng", "2"]);
    assert_eq!(code, 4, "forbidden: {err}");
    let (code, _, _) = gantryctl(&cluster, "admin", &["tasks", "--limit", "lots"]);
    assert_eq!(code, 2, "usage");
    let (code, _, err) = gantryctl(&cluster, "admin", &["deactivate", "api-a3"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = gantryctl(&cluster, "admin", &["reactivate", "api-a3"]);
    assert_eq!(code, 0, "{err}");

    // Mark api-a3 gone: its id leaves the cluster.
    let (code, _, err) = gantryctl(&cluster, "admin", &["mark-gone", &a3_id]);
    assert_eq!(code, 0, "{err}");
    events
        .wait("agent_removed", |e| {
            e["type"] == "agent_removed" && e["agent_id"] == a3_id.as_str()
        })
        .await;
    let (st, _) = refused(
        "a removed agent",
        admin.get(&format!("/api/v1/agents/{a3_id}")).await,
    );
    assert_eq!(st, 404);

    // Tear the framework down: its tasks are killed. It is connected: without a terminal to
    // confirm on, gantryctl does it only with --yes.
    let (code, _, err) = gantryctl(&cluster, "admin", &["teardown", &fw_id]);
    assert_eq!(code, 5, "not confirmed: {err}");
    assert!(err.contains("--yes"), "{err}");
    let (code, _, err) = gantryctl(&cluster, "admin", &["teardown", &fw_id, "--yes"]);
    assert_eq!(code, 0, "{err}");
    events
        .wait("framework_removed", |e| {
            e["type"] == "framework_removed" && e["framework_id"] == fw_id.as_str()
        })
        .await;
    wait_for(
        &admin,
        "/api/v1/tasks?state=KILLED",
        "2 killed tasks",
        |v| v["total"] == 2,
    )
    .await;
    let (st, _) = refused(
        "a second teardown",
        admin
            .post_json(
                &format!("/api/v1/frameworks/{fw_id}/teardown"),
                &serde_json::json!({}),
            )
            .await,
    );
    assert_eq!(st, 404);
    events
        .wait("a KILLED task", |e| {
            e["type"] == "task_updated" && e["state"] == "KILLED"
        })
        .await;
    drop(events);

    // Restart the master: weights, quotas and the reservation are still there.
    cluster.master.restart().unwrap();
    wait_for(&admin, "/api/v1/summary", "agents back", |s| {
        s["agents"]["connected"].as_u64() >= Some(2)
    })
    .await;
    let w = get(&admin, "/api/v1/weights").await;
    assert!(
        w.as_array()
            .unwrap()
            .iter()
            .any(|r| r["role"] == "eng/x" && r["weight"] == 2.5),
        "{w:#}"
    );
    let q = get(&admin, "/api/v1/quotas").await;
    assert!(
        q.as_array()
            .unwrap()
            .iter()
            .any(|r| r["role"] == "eng" && r["limit"]["cpus"] == 8.0),
        "{q:#}"
    );
    let a2 = wait_for(&admin, "/api/v1/agents/api-a2", "api-a2 back", |a| {
        a["connected"] == true
    })
    .await;
    assert_eq!(a2["reserved"]["ops"]["cpus"], 1.0, "{a2:#}");
    // Unreserve it again (persisted as well).
    post(
        &admin,
        "/api/v1/agents/api-a2/unreserve",
        serde_json::json!({"role": "ops", "resources": "cpus:1"}),
    )
    .await;
    let a2 = get(&admin, "/api/v1/agents/api-a2").await;
    assert!(a2["reserved"].get("ops").is_none(), "{a2:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_writes_survive_an_ha_failover() {
    let etcd = EtcdServer::start().unwrap();
    let dir = TempDir::new("gantry-api-ha").unwrap();
    let tls = dir.path().join("tls");
    let url = etcd.client_url();
    let mut masters: Vec<MasterProc> = (0..2)
        .map(|_| {
            MasterProc::start(dir.path(), &tls, &["--etcd", &url, "--lease-ttl", "2"]).unwrap()
        })
        .collect();
    let deadline = Instant::now() + T;
    let leader = loop {
        if let Some(i) = masters.iter().position(|m| m.is_leader()) {
            break i;
        }
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let standby = 1 - leader;
    let list: Vec<String> = masters.iter().map(|m| m.quic.to_string()).collect();
    let _agent = AgentProc::start_multi(
        dir.path(),
        &tls,
        &list.join(","),
        "api-ha0",
        "cpus:4;mem:2048",
    )
    .unwrap();
    let https: Vec<SocketAddr> = masters.iter().map(|m| m.http).collect();
    let api = |i: usize| client(https[i], &tls, Credentials::Certificate("admin".into()));
    let lead = api(leader);
    wait_for(&lead, "/api/v1/agents", "the agent", |a| {
        a.as_array()
            .is_some_and(|a| a.len() == 1 && a[0]["connected"] == true)
    })
    .await;

    // A standby does not take writes.
    let (st, code) = refused(
        "a write to the standby",
        api(standby)
            .post_json(
                "/api/v1/weights",
                &serde_json::json!({"role": "ha", "weight": 2}),
            )
            .await,
    );
    assert_eq!((st, code.as_str()), (503, "unavailable"));

    post(
        &lead,
        "/api/v1/weights",
        serde_json::json!({"role": "ha", "weight": 4}),
    )
    .await;
    post(
        &lead,
        "/api/v1/quotas",
        serde_json::json!({"role": "ha", "limit": "cpus:3"}),
    )
    .await;
    post(
        &lead,
        "/api/v1/agents/api-ha0/reserve",
        serde_json::json!({"role": "ha-ops", "resources": "cpus:2;mem:512"}),
    )
    .await;
    post(
        &lead,
        "/api/v1/agents/api-ha0/deactivate",
        serde_json::json!({}),
    )
    .await;

    // Kill the leader: the standby takes over with the registry's view.
    masters[leader].proc.kill9();
    let next = api(standby);
    let a = wait_for(
        &next,
        "/api/v1/agents/api-ha0",
        "the agent at the new leader",
        |a| a["connected"] == true,
    )
    .await;
    assert_eq!(a["reserved"]["ha-ops"]["cpus"], 2.0, "{a:#}");
    assert_eq!(a["reserved"]["ha-ops"]["mem"], 512.0, "{a:#}");
    assert_eq!(a["active"], false, "still deactivated: {a:#}");
    let m = get(&next, "/api/v1/maintenance").await;
    assert_eq!(m["agents"][0]["name"], "api-ha0", "{m:#}");
    post(
        &next,
        "/api/v1/agents/api-ha0/reactivate",
        serde_json::json!({}),
    )
    .await;
    assert_eq!(get(&next, "/api/v1/agents/api-ha0").await["active"], true);
    let w = get(&next, "/api/v1/weights").await;
    assert!(
        w.as_array()
            .unwrap()
            .iter()
            .any(|r| r["role"] == "ha" && r["weight"] == 4.0),
        "{w:#}"
    );
    let q = get(&next, "/api/v1/quotas").await;
    assert!(
        q.as_array()
            .unwrap()
            .iter()
            .any(|r| r["role"] == "ha" && r["limit"]["cpus"] == 3.0),
        "{q:#}"
    );
    // /metrics at the new leader shows the same weight and quota.
    let text = next.get("/metrics").await.unwrap();
    let value = |name: &str, labels: &[&str]| -> Option<f64> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .find(|l| labels.iter().all(|x| l.contains(x)))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    assert!(text.lines().any(|l| l == "gantry_leader 1"), "{text}");
    assert_eq!(
        value("gantry_role_weight", &["role=\"ha\""]),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        value(
            "gantry_quota",
            &["role=\"ha\"", "kind=\"cpus\"", "kind_of=\"limit\""]
        ),
        Some(3.0),
        "{text}"
    );
    // And the new leader takes writes.
    post(
        &next,
        "/api/v1/agents/api-ha0/unreserve",
        serde_json::json!({"role": "ha-ops", "resources": "cpus:2;mem:512"}),
    )
    .await;
    drop(masters);
}
