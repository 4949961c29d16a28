//! Security between tenants (issue 10, findings 1-4; docs/security.md): each test performs an
//! attack with a raw QUIC client (or a second real agent) against a real master, shows that it
//! fails with a clear error, and that an honest framework's tasks all still finish.
//!
//! 1. Framework takeover: resuming another principal's framework id, or pre-claiming an id.
//! 2. Agent identity: a second agent under a live agent's name, a squatter claiming its id.
//! 3. Role authorization: a principal subscribing with a role the ACLs do not grant it.
//! 4. Per-principal limits: 500 frameworks, 50,000 roles in one subscription, huge or deep
//!    role names, connection floods; roles nothing uses any more are forgotten.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gantry_sdk::protocol::*;
use gantry_sdk::transport::quic;
use gantry_sdk::transport::tls::PeerIdentity;
use gantry_tests::{bin, run_batch, Cluster, Proc};

const T: Duration = Duration::from_secs(30);

/// The master's answer to a raw subscribe: `Ok(id)` or `Err(error message)` (then the
/// connection must close).
async fn subscribe_raw(
    tx: &mut quic::FrameSender,
    rx: &mut quic::FrameReceiver,
    conn: &quinn::Connection,
    info: FrameworkInfo,
) -> Result<FrameworkId, String> {
    tx.send(&FrameworkToMaster::Subscribe(info)).await.unwrap();
    loop {
        let m = tokio::time::timeout(T, rx.recv::<MasterToFramework>())
            .await
            .expect("no answer to a subscribe")
            .expect("connection failed before an answer");
        match m {
            MasterToFramework::Subscribed { framework_id, .. } => return Ok(framework_id),
            MasterToFramework::Error { message, .. } => {
                tokio::time::timeout(T, conn.closed())
                    .await
                    .expect("refused subscriber stays connected");
                return Err(message);
            }
            _ => {}
        }
    }
}

/// A raw framework of `principal` subscribing with `info`: the peer (keep it alive) and the
/// master's answer ([`subscribe_raw`]).
async fn raw_subscribe(
    cluster: &Cluster,
    principal: &str,
    info: FrameworkInfo,
) -> (gantry_tests::RawPeer, Result<FrameworkId, String>) {
    let (ep, conn, mut tx, mut rx) = cluster
        .raw_peer(PeerIdentity::Framework(principal.into()))
        .await
        .unwrap();
    let answer = subscribe_raw(&mut tx, &mut rx, &conn, info).await;
    ((ep, conn, tx, rx), answer)
}

fn framework_info(name: &str, roles: &[&str], id: Option<FrameworkId>) -> FrameworkInfo {
    FrameworkInfo {
        framework_id: id,
        name: name.into(),
        roles: roles.iter().map(|r| r.to_string()).collect(),
        capabilities: vec![],
        failover_timeout_secs: 3600.0,
        min_allocatable: Vec::new(),
        suppressed_roles: Vec::new(),
    }
}

/// Runs `count` honest tasks (`sleep`) as framework `principal` in `role`.
fn honest(
    cluster: &Cluster,
    principal: &'static str,
    role: &'static str,
    count: u32,
    sleep: &'static str,
) -> tokio::task::JoinHandle<anyhow::Result<gantry_examples::batch::BatchProgress>> {
    let m = cluster.master.quic;
    let tls_dir = cluster.tls_dir.clone();
    tokio::spawn(async move {
        run_batch(
            m,
            &tls_dir,
            principal,
            role,
            count,
            "cpus:0.5;mem:32",
            &format!("sleep {sleep}"),
        )
        .await
    })
}

async fn all_finished(
    cluster: &Cluster,
    run: tokio::task::JoinHandle<anyhow::Result<gantry_examples::batch::BatchProgress>>,
    count: u32,
) {
    let progress = match tokio::time::timeout(Duration::from_secs(180), run).await {
        Ok(Ok(Ok(p))) => p,
        other => {
            cluster.dump_logs();
            panic!("honest framework did not finish: {other:?}");
        }
    };
    assert_eq!(
        (progress.finished, progress.failed),
        (count, 0),
        "{:?}",
        progress.errors
    );
}

/// The id of the framework named `name` in `/state`, once it is subscribed.
fn framework_id(cluster: &Cluster, name: &str) -> FrameworkId {
    let s = cluster
        .master
        .wait_state(T, "the honest framework to subscribe", |s| {
            s["frameworks"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["name"] == name))
        })
        .unwrap();
    let id = s["frameworks"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == name))
        .and_then(|f| f["id"].as_str())
        .unwrap()
        .to_string();
    serde_json::from_value(serde_json::Value::String(id)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framework_takeover_is_refused() {
    let cluster = Cluster::start(&[("ts-takeover", "cpus:4;mem:4096")]).unwrap();
    let run = honest(&cluster, "victim", "good", 20, "0.5");
    let victim = framework_id(&cluster, "victim");

    // Resuming the victim's framework under another principal: refused, victim untouched.
    let (_peer, answer) = raw_subscribe(
        &cluster,
        "attacker",
        framework_info("victim", &["good"], Some(victim)),
    )
    .await;
    let e = answer.unwrap_err();
    assert!(e.contains("belongs to another principal"), "{e}");

    // Pre-claiming an id (the old ids were seed ^ counter: the victim's id + 1 was next).
    let guess = FrameworkId::from_u128(victim.0.as_u128() ^ 1);
    let (_peer, answer) = raw_subscribe(
        &cluster,
        "attacker",
        framework_info("squat", &["good"], Some(guess)),
    )
    .await;
    let e = answer.unwrap_err();
    assert!(e.contains("not registered"), "{e}");

    // A legitimate new framework gets a fresh id, and cannot touch the victim's tasks.
    let ((_ep, _conn, mut tx, mut rx), answer) =
        raw_subscribe(&cluster, "attacker", framework_info("own", &["own"], None)).await;
    let mine = answer.unwrap();
    assert_ne!(mine, victim);
    assert_ne!(mine, guess);
    assert_ne!(
        mine.0.as_u128() ^ victim.0.as_u128(),
        1,
        "ids are sequential"
    );
    let s = cluster.master.state().unwrap();
    if let Some(t) = s["tasks"].as_array().and_then(|t| {
        t.iter()
            .find(|t| t["framework_id"] == victim.to_string().as_str())
    }) {
        let task_id: TaskId = serde_json::from_value(t["id"].clone()).expect("task id in /state");
        tx.send(&FrameworkToMaster::Kill { task_id }).await.unwrap();
        loop {
            let m = tokio::time::timeout(T, rx.recv::<MasterToFramework>())
                .await
                .unwrap()
                .unwrap();
            if let MasterToFramework::Error { kind, .. } = m {
                assert_eq!(kind, ErrorKind::UnknownTask);
                break;
            }
        }
    }
    all_finished(&cluster, run, 20).await;
    // Every subscription under the victim's id came from the victim.
    let s = cluster.master.state().unwrap();
    let victims: Vec<&serde_json::Value> = s["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["id"] == victim.to_string().as_str())
        .collect();
    assert!(victims.iter().all(|f| f["principal"] == "victim"), "{s:#}");
}

/// Sends a raw agent registration; returns the master's first answer.
async fn register_raw(
    cluster: &Cluster,
    name: &str,
    agent_id: Option<AgentId>,
) -> (MasterToAgent, quinn::Connection) {
    let (_ep, conn, mut tx, mut rx) = cluster
        .raw_peer(PeerIdentity::Agent(name.into()))
        .await
        .unwrap();
    tx.send(&AgentToMaster::Register {
        agent_id,
        hostname: "forged".into(),
        resources: "cpus:64;mem:65536".parse().unwrap(),
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: vec![],
        running_tasks: vec![],
        pending_updates: vec![],
        task_user: "nobody".into(),
    })
    .await
    .unwrap();
    let m = tokio::time::timeout(T, rx.recv::<MasterToAgent>())
        .await
        .expect("no answer to a registration")
        .expect("connection failed before an answer");
    if matches!(m, MasterToAgent::Error { .. }) {
        tokio::time::timeout(T, conn.closed())
            .await
            .expect("refused agent stays connected");
    }
    (m, conn)
}

/// Starts a second real `gantry-agent` named `name` with its own work dir.
fn second_agent(cluster: &Cluster, master: SocketAddr, name: &str, dir: &Path) -> Proc {
    let mut cmd = Command::new(bin("gantry-agent").unwrap());
    cmd.args(["--master", &master.to_string()])
        .arg("--work-dir")
        .arg(dir.join("work"))
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .args(["--name", name, "--resources", "cpus:2;mem:1024"]);
    Proc::spawn("second agent", cmd, &dir.join("agent.log")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_under_a_live_name_and_a_squatter_are_refused() {
    let cluster = Cluster::start(&[("ts-ident", "cpus:4;mem:4096")]).unwrap();
    let h1: AgentId = {
        let s = cluster.master.state().unwrap();
        serde_json::from_value(s["agents"][0]["id"].clone()).unwrap()
    };
    let run = honest(&cluster, "honest", "good", 20, "1");
    cluster
        .master
        .wait_state(T, "honest tasks running", |s| {
            s["tasks"].as_array().is_some_and(|t| !t.is_empty())
        })
        .unwrap();

    // A raw agent with h1's name, without an id and with another id: refused, naming h1.
    for claim in [None, Some(AgentId::random())] {
        let (m, _conn) = register_raw(&cluster, "ts-ident", claim).await;
        let MasterToAgent::Error { message } = m else {
            panic!("registered a second h1: {m:?}");
        };
        assert!(
            message.contains("\"ts-ident\" is in use") && message.contains(&h1.to_string()),
            "{message}"
        );
    }
    // A squatter claiming h1's id under its own certificate.
    let (m, _conn) = register_raw(&cluster, "squatter", Some(h1)).await;
    let MasterToAgent::Error { message } = m else {
        panic!("squatter registered with h1's id: {m:?}");
    };
    assert!(
        message.contains("belongs to agent \"ts-ident\""),
        "{message}"
    );

    // A second real agent started without a distinct --name: it says why and exits non-zero
    // instead of evicting h1 forever.
    let dir = cluster.dir.path().join("second-h1");
    std::fs::create_dir_all(&dir).unwrap();
    let mut second = second_agent(&cluster, cluster.master.quic, "ts-ident", &dir);
    let deadline = Instant::now() + T;
    let status = loop {
        if let Ok(Some(status)) = second.child.try_wait() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the second h1 kept running; log:\n{}",
            std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    assert!(!status.success(), "{status:?}\n{log}");
    assert!(
        log.contains("refused this agent") && log.contains("is in use"),
        "{log}"
    );
    let master_log = std::fs::read_to_string(&cluster.master.log).unwrap_or_default();
    assert!(master_log.contains("agent refused"), "{master_log}");

    // Nothing was lost: h1 kept its id, its connection and every task.
    all_finished(&cluster, run, 20).await;
    let s = cluster.master.state().unwrap();
    let agents = s["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 1, "{s:#}");
    assert_eq!(agents[0]["id"], h1.to_string().as_str());
    assert_eq!(agents[0]["connected"], true);
    assert!(!s["completed_tasks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["state"] == "LOST"));
}

const ACLS: &str = r#"
[[register_frameworks]]
principals = ["honest"]
roles = ["good"]

[[register_frameworks]]
principals = ["*"]
roles = ["public"]

[[run_tasks]]
principals = ["*"]
users = ["*", "root"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_the_acls_do_not_grant_are_refused() {
    let cluster = Cluster::start_with_acls(&[("ts-acl", "cpus:4;mem:4096")], ACLS, &[]).unwrap();
    let run = honest(&cluster, "honest", "good", 20, "0.2");

    // A raw subscribe with the honest principal's role.
    let (_peer, answer) = raw_subscribe(
        &cluster,
        "mallory",
        framework_info("mallory", &["public", "good"], None),
    )
    .await;
    let e = answer.unwrap_err();
    assert!(
        e.contains("\"mallory\"") && e.contains("\"good\"") && e.contains("not allowed"),
        "{e}"
    );
    // The SDK driver reports the refusal and stops (no retry loop).
    let config = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "mallory",
        vec!["good".into()],
    );
    let (_updates, _handle, driver) = gantry_tests::start_recorder(config, vec![]);
    match tokio::time::timeout(T, driver).await {
        Ok(Ok(Err(gantry_sdk::scheduler::DriverError::Refused(m)))) => {
            assert!(m.contains("not allowed"), "{m}")
        }
        other => panic!("driver was not refused: {other:?}"),
    }
    // What the ACLs grant works.
    let (_peer, answer) = raw_subscribe(
        &cluster,
        "mallory",
        framework_info("mallory", &["public"], None),
    )
    .await;
    answer.unwrap();
    all_finished(&cluster, run, 20).await;
    let s = cluster.master.state().unwrap();
    assert!(s["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["principal"] != "mallory" || f["roles"] == serde_json::json!(["public"])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_register_without_bounds() {
    let cluster = Cluster::start(&[("ts-bounds", "cpus:4;mem:4096")]).unwrap();
    let run = honest(&cluster, "honest", "good", 30, "0.2");

    // 50,000 roles in one subscription.
    let roles: Vec<String> = (0..50_000).map(|i| format!("flood/r{i}")).collect();
    let (_ep, conn, mut tx, mut rx) = cluster
        .raw_peer(PeerIdentity::Framework("greedy".into()))
        .await
        .unwrap();
    let mut info = framework_info("greedy", &[], None);
    info.roles = roles;
    let e = subscribe_raw(&mut tx, &mut rx, &conn, info)
        .await
        .unwrap_err();
    assert!(
        e.contains("50000 roles") && e.contains("limit is 64"),
        "{e}"
    );
    // Role names too long or too deep.
    for (role, why) in [
        ("x".repeat(129), "invalid role name"),
        ("a/b/c/d/e/f/g/h/i".to_string(), "9 levels deep"),
    ] {
        let (_peer, answer) =
            raw_subscribe(&cluster, "greedy", framework_info("g", &[&role], None)).await;
        let e = answer.unwrap_err();
        assert!(e.contains(why), "{e}");
    }

    // 500 frameworks from one principal (each kept by a long failover timeout): 100 register.
    let (mut registered, mut refused) = (0, 0);
    let mut last_error = String::new();
    for i in 0..500 {
        let started = Instant::now();
        let (_ep, conn, mut tx, mut rx) = loop {
            match cluster
                .raw_peer(PeerIdentity::Framework("greedy".into()))
                .await
            {
                Ok(p) => break p,
                // Closed connections are released asynchronously; never expected to last.
                Err(e) if started.elapsed() < T => {
                    note_retry(&e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot connect: {e}"),
            }
        };
        match subscribe_raw(
            &mut tx,
            &mut rx,
            &conn,
            framework_info(&format!("greedy-{i}"), &[&format!("greedy/r{i}")], None),
        )
        .await
        {
            Ok(_) => registered += 1,
            Err(e) => {
                refused += 1;
                last_error = e;
            }
        }
        conn.close(0u32.into(), b"next");
    }
    assert_eq!((registered, refused), (100, 400), "{last_error}");
    assert!(
        last_error.contains("already has 100 frameworks"),
        "{last_error}"
    );
    let s = cluster.master.state().unwrap();
    let roles = s["allocator"]["roles"].as_object().unwrap();
    assert!(!roles.keys().any(|r| r.starts_with("flood")), "{roles:?}");
    assert!(roles.len() < 250, "{} roles", roles.len());
    all_finished(&cluster, run, 30).await;
}

/// Logs a retried connection error to stderr (shown for failing tests only).
fn note_retry(e: &str) {
    eprintln!("retrying a connection: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_floods_are_bounded_and_unused_roles_are_forgotten() {
    let cluster = Cluster::start_with(
        &[("ts-flood", "cpus:4;mem:4096")],
        &["--max-connections-per-principal", "3"],
        &[],
    )
    .unwrap();
    let run = honest(&cluster, "honest", "good", 20, "0.2");

    // A fourth connection of one principal is closed right after the handshake.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            cluster
                .raw_peer(PeerIdentity::Framework("flood".into()))
                .await
                .unwrap(),
        );
    }
    match cluster
        .raw_peer(PeerIdentity::Framework("flood".into()))
        .await
    {
        // The client is told why.
        Err(e) => assert!(
            e.contains("too many connections for framework:flood"),
            "{e}"
        ),
        Ok((_ep, conn, _tx, mut rx)) => {
            // The close may race the hello's answer: then the next read shows it.
            let r = tokio::time::timeout(T, rx.recv::<MasterToFramework>()).await;
            assert!(
                matches!(r, Ok(Err(_))),
                "a fourth connection was served: {r:?}"
            );
            let e = tokio::time::timeout(T, conn.closed()).await.unwrap();
            assert!(e.to_string().contains("too many connections"), "{e}");
        }
    }
    let log = std::fs::read_to_string(&cluster.master.log).unwrap_or_default();
    assert!(
        log.contains("too many connections for framework:flood (limit 3"),
        "{log}"
    );
    // Roles held by a framework are forgotten once it is gone.
    let (_ep, conn, tx, rx) = held.pop().unwrap();
    let (mut tx, mut rx) = (tx, rx);
    let junk: Vec<String> = (0..60).map(|i| format!("junk/r{i}")).collect();
    let junk_refs: Vec<&str> = junk.iter().map(String::as_str).collect();
    subscribe_raw(
        &mut tx,
        &mut rx,
        &conn,
        framework_info("junk", &junk_refs, None),
    )
    .await
    .unwrap();
    let has_junk = |s: &serde_json::Value| {
        s["allocator"]["roles"]
            .as_object()
            .is_some_and(|r| r.keys().any(|k| k.starts_with("junk")))
    };
    cluster
        .master
        .wait_state(T, "the junk roles", has_junk)
        .unwrap();
    tx.send(&FrameworkToMaster::Teardown).await.unwrap();
    cluster
        .master
        .wait_state(T, "the junk roles to be forgotten", |s| !has_junk(s))
        .unwrap();
    // Once connections close, the principal may connect again.
    drop(held);
    drop((conn, tx, rx));
    let started = Instant::now();
    while let Err(e) = cluster
        .raw_peer(PeerIdentity::Framework("flood".into()))
        .await
    {
        assert!(started.elapsed() < T, "still refused: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    all_finished(&cluster, run, 20).await;
}
