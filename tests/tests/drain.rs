//! Maintenance and drain (issue 14 item 3) on real clusters:
//! - two masters on a real etcd, an agent with running tasks drained with `gantryctl drain
//!   --deadline`: the framework gets the drain notice before any kill, no offer of the agent
//!   reaches it in between, the leader is killed -9 mid-drain and the new leader kills the
//!   tasks at the same deadline; the agent ends DRAINED and empty, `undrain` offers it again
//!   and `mark-gone` removes it for good;
//! - `gantry-agent notice-termination --in 4s` on the host drains its agent with that deadline.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_sdk::protocol::{
    AgentId, DrainNotice, Offer, StatusUpdate, TaskId, TaskInfo, TaskState,
};
use gantry_sdk::{DriverHandle, Scheduler};
use gantry_tests::etcd::EtcdServer;
use gantry_tests::{bin, driver_config, http_get, task, AgentProc, MasterProc, TempDir};

/// What the framework saw, in order.
#[derive(Debug, Clone)]
enum Seen {
    Offer(AgentId),
    Notice(DrainNotice),
    Update(TaskId, TaskState),
    /// A reconciliation answer (from the driver's built-in reconciliation).
    Reconciled(TaskId, TaskState),
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Launches `tasks` on the first offer of `target` (declining everything else briefly) and
/// logs offers, drain notices and updates.
struct Tenant {
    target: AgentId,
    tasks: Vec<TaskInfo>,
    log: Log,
}

impl Tenant {
    fn push(&self, s: Seen) {
        self.log.lock().unwrap().push(s);
    }
}

impl Scheduler for Tenant {
    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        for o in offers {
            self.push(Seen::Offer(o.agent_id));
            if o.agent_id == self.target && !self.tasks.is_empty() {
                driver.launch(o.id, std::mem::take(&mut self.tasks));
            } else {
                driver.decline(vec![o.id], Some(0.5));
            }
        }
    }

    async fn status_update(&mut self, _driver: &DriverHandle, update: &StatusUpdate) {
        if update.reconciliation {
            self.push(Seen::Reconciled(update.task_id, update.state));
        } else {
            self.push(Seen::Update(update.task_id, update.state));
        }
    }

    async fn drain_notice(&mut self, _driver: &DriverHandle, notice: &DrainNotice) {
        self.push(Seen::Notice(notice.clone()));
    }
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn agent_id(m: &MasterProc, name: &str) -> AgentId {
    let s = m
        .wait_state(Duration::from_secs(30), "the agent registered", |s| {
            s["agents"]
                .as_array()
                .is_some_and(|a| a.iter().any(|a| a["name"] == name))
        })
        .unwrap();
    let id = s["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    id.parse().unwrap()
}

/// The maintenance entry of `agent` on master `m`, if any.
fn maintenance(m: &MasterProc, agent: AgentId) -> Option<serde_json::Value> {
    let body = http_get(m.http, "/api/v1/maintenance/drains").ok()?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["agents"]
        .as_array()?
        .iter()
        .find(|a| a["agent_id"] == agent.to_string())
        .cloned()
}

fn ctl(m: &MasterProc, args: &[&str]) -> String {
    let out = m.gantryctl(args).unwrap();
    assert!(
        out.status.success(),
        "gantryctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn updates_of(log: &Log, t: TaskId) -> Vec<TaskState> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|s| match s {
            Seen::Update(id, st) if *id == t => Some(*st),
            _ => None,
        })
        .collect()
}

fn sleeper(name: &str) -> TaskInfo {
    let mut t = task(name, "sleep 600", "cpus:1;mem:64");
    t.kill_grace_secs = Some(1);
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_agent_ends_empty_with_notice_before_kill_and_survives_failover() {
    let etcd = EtcdServer::start().unwrap();
    let dir = TempDir::new("gantry-drain").unwrap();
    let tls = dir.path().join("tls");
    let url = etcd.client_url();
    let mut masters: Vec<MasterProc> = (0..2)
        .map(|_| {
            MasterProc::start(dir.path(), &tls, &["--etcd", &url, "--lease-ttl", "2"]).unwrap()
        })
        .collect();
    wait_for("a leader", Duration::from_secs(30), || {
        masters.iter().filter(|m| m.is_leader()).count() == 1
    });
    let leader = masters.iter().position(|m| m.is_leader()).unwrap();
    let list: Vec<String> = masters.iter().map(|m| m.quic.to_string()).collect();
    let _agents: Vec<AgentProc> = ["drain-a", "drain-b"]
        .iter()
        .map(|n| {
            AgentProc::start_multi(dir.path(), &tls, &list.join(","), n, "cpus:4;mem:1024").unwrap()
        })
        .collect();
    let a = agent_id(&masters[leader], "drain-a");
    let b = agent_id(&masters[leader], "drain-b");

    let log: Log = Arc::default();
    let tasks = vec![sleeper("drain-t1"), sleeper("drain-t2")];
    let ids: Vec<TaskId> = tasks.iter().map(|t| t.task_id).collect();
    let config = driver_config(list.clone(), tls.clone(), "drain-fw", vec!["maint".into()]);
    let driver = gantry_sdk::Driver::new(config);
    let handle = driver.handle();
    let run = tokio::spawn(driver.run(Tenant {
        target: a,
        tasks,
        log: log.clone(),
    }));
    wait_for("both tasks RUNNING", Duration::from_secs(60), || {
        ids.iter()
            .all(|t| updates_of(&log, *t).contains(&TaskState::Running))
    });

    // Drain with a deadline long enough to live through a failover.
    let drained_at = Instant::now();
    let out = ctl(&masters[leader], &["drain", "drain-a", "--deadline", "12s"]);
    assert!(out.contains("DRAINING"), "{out}");
    let m = maintenance(&masters[leader], a).expect("drain-a under maintenance");
    assert_eq!(m["state"], "DRAINING", "{m:#}");
    wait_for("the drain notice", Duration::from_secs(10), || {
        log.lock()
            .unwrap()
            .iter()
            .any(|s| matches!(s, Seen::Notice(n) if n.agent_id == a))
    });
    let notice_at = log
        .lock()
        .unwrap()
        .iter()
        .position(|s| matches!(s, Seen::Notice(n) if n.agent_id == a))
        .unwrap();
    if let Seen::Notice(n) = &log.lock().unwrap()[notice_at] {
        let mut told = n.task_ids.clone();
        told.sort();
        let mut want = ids.clone();
        want.sort();
        assert_eq!(told, want, "the notice names the framework's tasks there");
        let left = n.deadline_in_ms.expect("a deadline");
        assert!((5_000..=12_000).contains(&left), "deadline in {left} ms");
        assert_eq!(n.reason, "operator");
    }
    // Nothing killed before the deadline.
    std::thread::sleep(Duration::from_secs(1));
    for t in &ids {
        assert!(
            !updates_of(&log, *t).iter().any(|s| s.is_terminal()),
            "killed before the deadline"
        );
    }

    // kill -9 the leader mid-drain.
    masters[leader].proc.kill9();
    let mut next = None;
    wait_for("a new leader", Duration::from_secs(30), || {
        next = masters
            .iter()
            .enumerate()
            .find(|(i, m)| *i != leader && m.is_leader())
            .map(|(i, _)| i);
        next.is_some()
    });
    let m2 = &masters[next.unwrap()];
    let m = loop {
        if let Some(m) = maintenance(m2, a) {
            break m;
        }
        assert!(
            drained_at.elapsed() < Duration::from_secs(60),
            "the new leader does not know the drain"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(m["state"] == "DRAINING" || m["state"] == "DRAINED", "{m:#}");
    assert_eq!(m["reason"], "operator");

    // The new leader kills the tasks at the deadline (not before) and the agent ends DRAINED.
    wait_for("drain-a DRAINED", Duration::from_secs(120), || {
        maintenance(m2, a).is_some_and(|m| m["state"] == "DRAINED")
    });
    let took = drained_at.elapsed();
    assert!(took >= Duration::from_secs(11), "drained after {took:?}");
    for t in &ids {
        let seen = updates_of(&log, *t);
        assert_eq!(seen.last(), Some(&TaskState::Killed), "{t}: {seen:?}");
    }
    let log_now = log.lock().unwrap().clone();
    let first_kill = log_now
        .iter()
        .position(|s| matches!(s, Seen::Update(_, TaskState::Killed)))
        .unwrap();
    assert!(notice_at < first_kill, "notice after a kill: {log_now:?}");
    // No offer of drain-a after the notice (drain-b kept being offered).
    assert!(
        !log_now[notice_at..]
            .iter()
            .any(|s| matches!(s, Seen::Offer(x) if *x == a)),
        "drain-a offered while draining: {log_now:?}"
    );
    assert!(log_now[notice_at..]
        .iter()
        .any(|s| matches!(s, Seen::Offer(x) if *x == b)));
    let s = m2.state().unwrap();
    let agent = s["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "drain-a")
        .unwrap()
        .clone();
    assert!(
        agent["used"].as_object().is_none_or(|u| u.is_empty()),
        "{agent:#}"
    );
    assert_eq!(agent["drain"], "DRAINED", "{agent:#}");
    assert!(!s["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["agent"] == a.to_string()));
    // Still not offered a while later (allocation runs every second).
    let quiet_from = log.lock().unwrap().len();
    std::thread::sleep(Duration::from_secs(3));
    assert!(!log.lock().unwrap()[quiet_from..]
        .iter()
        .any(|s| matches!(s, Seen::Offer(x) if *x == a)));
    let table = ctl(m2, &["maintenance"]);
    assert!(
        table.contains("drain-a") && table.contains("DRAINED"),
        "{table}"
    );

    // Undrain: offered again.
    ctl(m2, &["undrain", "drain-a"]);
    let from = log.lock().unwrap().len();
    wait_for("drain-a offered again", Duration::from_secs(30), || {
        log.lock().unwrap()[from..]
            .iter()
            .any(|s| matches!(s, Seen::Offer(x) if *x == a))
    });
    assert!(maintenance(m2, a).is_none());

    // Mark gone: removed, and its agent may not come back with its id.
    gantry_master::client::BlockingClient::new(&gantry_tests::operator_client(m2.http).unwrap())
        .unwrap()
        .post_json("/api/v1/agents/drain-a/gone", serde_json::json!({}))
        .unwrap();
    m2.wait_state(Duration::from_secs(30), "drain-a removed", |s| {
        !s["agents"]
            .as_array()
            .is_some_and(|x| x.iter().any(|a| a["name"] == "drain-a"))
    })
    .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let s = m2.state().unwrap();
    assert!(
        !s["agents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "drain-a"),
        "a gone agent came back"
    );
    let body = http_get(m2.http, "/api/v1/maintenance/drains").unwrap();
    assert!(body.contains(&a.to_string()), "{body}");
    // Unknown agents are 404 with a JSON error (gantryctl exit code 3).
    let out = m2.gantryctl(&["drain", "no-such-agent"]).unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");

    handle.stop();
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_termination_notice_on_the_host_drains_its_agent() {
    let dir = TempDir::new("gantry-spot").unwrap();
    let tls = dir.path().join("tls");
    let master = MasterProc::start(dir.path(), &tls, &[]).unwrap();
    let agent = AgentProc::start(
        dir.path(),
        &tls,
        master.quic,
        "spot-a",
        "cpus:2;mem:512",
        &[],
    )
    .unwrap();
    let a = agent_id(&master, "spot-a");
    let log: Log = Arc::default();
    let t = sleeper("spot-t");
    let id = t.task_id;
    let mut config = driver_config(
        vec![master.quic.to_string()],
        tls.clone(),
        "spot-fw",
        vec!["spot".into()],
    );
    // The SDK's built-in reconciliation, every second here.
    config.reconcile = gantry_sdk::reconcile::ReconcileConfig::periodic(Duration::from_secs(1));
    let driver = gantry_sdk::Driver::new(config);
    let handle = driver.handle();
    let run = tokio::spawn(driver.run(Tenant {
        target: a,
        tasks: vec![t],
        log: log.clone(),
    }));
    wait_for("the task RUNNING", Duration::from_secs(60), || {
        updates_of(&log, id).contains(&TaskState::Running)
    });
    wait_for(
        "a periodic reconciliation answer",
        Duration::from_secs(20),
        || {
            log.lock()
                .unwrap()
                .iter()
                .any(|s| matches!(s, Seen::Reconciled(t, TaskState::Running) if *t == id))
        },
    );
    let out = std::process::Command::new(bin("gantry-agent").unwrap())
        .args(["notice-termination", "--in", "4s", "--work-dir"])
        .arg(&agent.work_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let noticed = Instant::now();
    wait_for("the drain notice", Duration::from_secs(20), || {
        log.lock()
            .unwrap()
            .iter()
            .any(|s| matches!(s, Seen::Notice(n) if n.agent_id == a && n.task_ids == vec![id]))
    });
    let n = log
        .lock()
        .unwrap()
        .iter()
        .find_map(|s| match s {
            Seen::Notice(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap();
    assert!(n.deadline_in_ms.is_some_and(|ms| ms <= 4_000), "{n:?}");
    assert!(n.reason.contains("termination"), "{n:?}");
    wait_for("spot-a DRAINED", Duration::from_secs(60), || {
        maintenance(&master, a).is_some_and(|m| m["state"] == "DRAINED")
    });
    assert!(noticed.elapsed() >= Duration::from_secs(2));
    assert_eq!(updates_of(&log, id).last(), Some(&TaskState::Killed));
    // `gantryctl drain --wait` follows a drain to its end (here at once: nothing is left).
    let out = ctl(&master, &["drain", "spot-a", "--deadline", "1m", "--wait"]);
    assert!(
        out.contains("DRAINED") && out.contains("is drained"),
        "{out}"
    );
    handle.stop();
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_writes_need_the_acl_grant() {
    use gantry_master::client::{ClientError, Credentials};
    let acls = r#"
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
principals = ["drainer"]
actions = ["drain", "undrain"]
"#;
    let mut cluster =
        gantry_tests::Cluster::start_with_acls(&[("acl-a", "cpus:1;mem:256")], acls, &[]).unwrap();
    let addr = cluster.master.http;
    let tls_dir = cluster.tls_dir.clone();
    let client = |who: Option<&str>| {
        if let Some(name) = who {
            gantry_pki::load_or_issue(
                &tls_dir,
                &gantry_sdk::transport::PeerIdentity::Operator(name.into()),
                &[],
            )
            .unwrap();
        }
        gantry_tests::https_client(
            addr,
            &tls_dir,
            who.map_or(Credentials::None, |n| Credentials::Certificate(n.into())),
        )
    };
    let status = |r: Result<String, ClientError>| match r {
        Ok(body) => panic!("the write succeeded: {body}"),
        Err(e) => e.status().unwrap_or(0),
    };
    let empty = serde_json::json!({});
    let (anonymous, viewer, drainer) = (
        client(None),
        client(Some("viewer")),
        client(Some("drainer")),
    );
    for action in ["drain", "undrain", "gone"] {
        let path = format!("/api/v1/agents/acl-a/{action}");
        assert_eq!(
            status(anonymous.post_json(&path, &empty).await),
            401,
            "{path}"
        );
        assert_eq!(status(viewer.post_json(&path, &empty).await), 403, "{path}");
    }
    assert_eq!(
        status(anonymous.get("/api/v1/maintenance/drains").await),
        401,
        "reads need a caller"
    );
    let view: serde_json::Value =
        serde_json::from_str(&viewer.get("/api/v1/maintenance/drains").await.unwrap()).unwrap();
    assert_eq!(view["agents"].as_array().map(Vec::len), Some(0), "{view}");
    // The drainer may drain and undrain, not mark gone.
    drainer
        .post_json(
            "/api/v1/agents/acl-a/drain",
            &serde_json::json!({"deadline_secs": 60}),
        )
        .await
        .unwrap();
    assert_eq!(
        status(drainer.post_json("/api/v1/agents/acl-a/gone", &empty).await),
        403
    );
    assert_eq!(
        status(
            drainer
                .post_json(
                    "/api/v1/agents/acl-a/drain",
                    &serde_json::json!({"deadline_secs": "soon"})
                )
                .await
        ),
        400
    );
    let s = cluster.master.state().unwrap();
    assert_eq!(
        s["agents"][0]["drain"], "DRAINED",
        "an empty agent drains at once"
    );
    // The drain survives a restart of the (standalone) master: it is in the registry.
    cluster.master.restart().unwrap();
    cluster
        .master
        .wait_state(
            Duration::from_secs(30),
            "acl-a back and still drained",
            |s| s["agents"][0]["connected"] == true && s["agents"][0]["drain"] == "DRAINED",
        )
        .unwrap();
    drainer
        .post_json("/api/v1/agents/acl-a/undrain", &empty)
        .await
        .unwrap();
    assert_eq!(
        status(
            drainer
                .post_json("/api/v1/agents/acl-a/undrain", &empty)
                .await
        ),
        409
    );
    let s = cluster.master.state().unwrap();
    assert!(s["agents"][0]["drain"].is_null(), "{:#}", s["agents"][0]);
}
