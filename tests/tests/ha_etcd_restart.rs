//! Restart etcd itself (SIGKILL, then the same ports and data directory) under a running HA
//! cluster: three masters, three agents, a framework with running tasks. At no sampled moment
//! (every ~50 ms through the outage and recovery) do two masters say they lead, a leader is
//! back after the restart, and every task finishes exactly once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_tests::etcd::EtcdServer;
use gantry_tests::{
    assert_finished_once, http_get, run_batch_ha, sandbox_count, AgentProc, MasterProc, TempDir,
};

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Which masters say `role: leader` on `/health` right now.
fn leaders(http: &[std::net::SocketAddr]) -> Vec<usize> {
    http.iter()
        .enumerate()
        .filter(|(_, a)| {
            http_get(**a, "/health")
                .ok()
                .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
                .is_some_and(|h| h["role"] == "leader")
        })
        .map(|(i, _)| i)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restart_under_load_no_split_brain_no_lost_task() {
    let mut etcd = tokio::task::block_in_place(EtcdServer::start).unwrap();
    let dir = TempDir::new("gantry-ha-etcd").unwrap();
    let tls = dir.path().join("tls");
    let url = etcd.client_url();
    let mut masters: Vec<MasterProc> = Vec::new();
    for _ in 0..3 {
        masters.push(
            MasterProc::start(dir.path(), &tls, &["--etcd", &url, "--lease-ttl", "2"]).unwrap(),
        );
    }
    let http: Vec<_> = masters.iter().map(|m| m.http).collect();
    wait_for("a leader", Duration::from_secs(20), || {
        leaders(&http).len() == 1
    });
    let leader = leaders(&http)[0];
    let addrs: Vec<String> = masters.iter().map(|m| m.quic.to_string()).collect();
    let agents: Vec<AgentProc> = (0..3)
        .map(|i| {
            AgentProc::start_multi(
                dir.path(),
                &tls,
                &addrs.join(","),
                &format!("er{i}"),
                "cpus:20;mem:20480",
            )
            .unwrap()
        })
        .collect();
    masters[leader]
        .wait_state(Duration::from_secs(30), "3 agents", |s| {
            s["agents"].as_array().is_some_and(|a| a.len() == 3)
        })
        .unwrap();

    let t = tls.clone();
    let a = addrs.clone();
    let batch = tokio::spawn(async move {
        run_batch_ha(a, &t, "etcd-fw", "etcd", 40, "cpus:1;mem:16", "sleep 6").await
    });
    masters[leader]
        .wait_state(Duration::from_secs(60), "40 running tasks", |s| {
            gantry_tests::running_tasks(s) >= 40
        })
        .unwrap();

    // Sample every master's /health every ~50 ms from before the outage until the end.
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new((0usize, Vec::<(Duration, Vec<usize>)>::new())));
    let sampler = {
        let (stop, samples, http) = (stop.clone(), samples.clone(), http.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                let l = leaders(&http);
                let mut s = samples.lock().unwrap();
                s.0 += 1;
                if l.len() > 1 {
                    s.1.push((start.elapsed(), l));
                }
                drop(s);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };

    // The outage: longer than the lease TTL, so the leader cannot renew and must step down.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let outage = Instant::now();
    etcd.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::block_in_place(|| etcd.restart()).unwrap();
    eprintln!("etcd back after {:?}", outage.elapsed());

    let mut new_leader = None;
    tokio::task::block_in_place(|| {
        wait_for(
            "a leader after the etcd restart",
            Duration::from_secs(30),
            || {
                let l = leaders(&http);
                new_leader = l.first().copied();
                l.len() == 1
            },
        )
    });
    let new_leader = new_leader.unwrap();
    eprintln!(
        "leader {new_leader} (was {leader}) {:?} after the outage began",
        outage.elapsed()
    );
    masters[new_leader]
        .wait_state(Duration::from_secs(30), "agents re-registered", |s| {
            s["agents"]
                .as_array()
                .is_some_and(|a| a.iter().filter(|a| a["connected"] == true).count() == 3)
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", etcd.log_tail(20)));

    let p = tokio::time::timeout(Duration::from_secs(60), batch)
        .await
        .expect("framework finishes")
        .unwrap()
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    sampler.join().unwrap();
    let (n, split) = samples.lock().unwrap().clone();
    eprintln!("{n} /health samples");
    assert!(n > 40, "too few samples ({n})");
    assert!(split.is_empty(), "two leaders at once: {split:?}");

    assert_finished_once("batch", &p, 40);
    // Nothing launched twice.
    let sandboxes = sandbox_count(&agents);
    assert_eq!(sandboxes, 40);
}
