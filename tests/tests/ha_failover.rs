//! Highly available masters over a real etcd: kill -9 the leader under 100+ running tasks;
//! a standby takes over, agents and frameworks follow, every task ends exactly once, and
//! weights and quotas survive.

use std::time::{Duration, Instant};

use gantry_tests::etcd::EtcdServer;
use gantry_tests::{
    assert_finished_once, run_batch_ha, sandbox_count, AgentProc, MasterProc, TempDir,
};

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_under_load_loses_nothing() {
    let etcd = EtcdServer::start().unwrap();
    let dir = TempDir::new("gantry-ha").unwrap();
    let tls = dir.path().join("tls");
    let url = etcd.client_url();
    let mut masters: Vec<MasterProc> = Vec::new();
    for _ in 0..3 {
        // The first master creates the CA; the others find it.
        masters.push(
            MasterProc::start(dir.path(), &tls, &["--etcd", &url, "--lease-ttl", "2"]).unwrap(),
        );
    }
    wait_for("a leader", Duration::from_secs(20), || {
        masters.iter().filter(|m| m.is_leader()).count() == 1
    });
    let leader = masters.iter().position(|m| m.is_leader()).unwrap();
    let addrs: Vec<String> = masters.iter().map(|m| m.quic.to_string()).collect();
    let master_list = addrs.join(",");
    let _agents: Vec<AgentProc> = (0..3)
        .map(|i| {
            AgentProc::start_multi(
                dir.path(),
                &tls,
                &master_list,
                &format!("ha{i}"),
                "cpus:40;mem:40960",
            )
            .unwrap()
        })
        .collect();
    masters[leader]
        .wait_state(Duration::from_secs(30), "3 agents", |s| {
            s["agents"].as_array().is_some_and(|a| a.len() == 3)
        })
        .unwrap();
    // Operator settings before the failover.
    let ctl = |m: &MasterProc, args: &[&str]| {
        let out = m.gantryctl(args).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ctl(&masters[leader], &["weight", "blue", "2"]);
    ctl(
        &masters[leader],
        &[
            "quota",
            "green",
            "--guarantee",
            "cpus:2",
            "--limit",
            "cpus:100",
        ],
    );

    let t = tls.clone();
    let (a1, a2) = (addrs.clone(), addrs.clone());
    let blue = tokio::spawn(async move {
        run_batch_ha(a1, &t, "blue-fw", "blue", 60, "cpus:1;mem:16", "sleep 4").await
    });
    let t = tls.clone();
    let green = tokio::spawn(async move {
        run_batch_ha(a2, &t, "green-fw", "green", 60, "cpus:1;mem:16", "sleep 4").await
    });
    masters[leader]
        .wait_state(Duration::from_secs(60), "100+ running tasks", |s| {
            gantry_tests::running_tasks(s) >= 100
        })
        .unwrap();

    // kill -9 the leader.
    let killed_at = Instant::now();
    masters[leader].proc.kill9();
    let mut new_leader = None;
    wait_for("a new leader", Duration::from_secs(30), || {
        new_leader = masters
            .iter()
            .enumerate()
            .find(|(i, m)| *i != leader && m.is_leader())
            .map(|(i, _)| i);
        new_leader.is_some()
    });
    let new_leader = new_leader.unwrap();
    eprintln!("new leader after {:?}", killed_at.elapsed());
    let m = &masters[new_leader];
    m.wait_state(Duration::from_secs(30), "agents re-registered", |s| {
        s["agents"]
            .as_array()
            .is_some_and(|a| a.iter().filter(|a| a["connected"] == true).count() == 3)
    })
    .unwrap();
    eprintln!("all agents back after {:?}", killed_at.elapsed());

    let blue = tokio::time::timeout(Duration::from_secs(120), blue)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let green = tokio::time::timeout(Duration::from_secs(120), green)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    for (name, p) in [("blue", &blue), ("green", &green)] {
        assert_finished_once(name, p, 60);
    }
    // Settings survived.
    let s = m.state().unwrap();
    assert_eq!(
        s["allocator"]["roles"]["blue"]["weight"], 2.0,
        "{:#}",
        s["allocator"]
    );
    assert_eq!(
        s["allocator"]["roles"]["green"]["quota_limit"]["cpus"], 100.0,
        "{:#}",
        s["allocator"]
    );
    // Nothing launched twice: every agent's sandboxes hold exactly the 120 tasks.
    let sandboxes = sandbox_count(&_agents);
    assert_eq!(sandboxes, 120);
}
