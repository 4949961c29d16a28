//! Cut the leading master off from etcd while agents and frameworks can still reach it: the
//! leader reaches etcd only through a [`TcpProxy`], the standbys directly. After the cut the old
//! leader must stop acting as leader (log `lost leadership`, exit) before the new leader makes
//! its first offer (log `first offers made as leader`), and every task still finishes exactly
//! once.

use std::path::Path;
use std::time::{Duration, Instant};

use gantry_tests::etcd::EtcdServer;
use gantry_tests::proxy::TcpProxy;
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

/// The RFC 3339 timestamp (tracing's fmt layer, UTC) of the first log line containing `needle`.
/// Timestamps of one format compare correctly as strings.
fn log_time(log: &Path, needle: &str) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .map(strip_ansi)
        .find(|l| l.contains(needle))
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cut_from_etcd_steps_down_before_new_leader_offers() {
    let etcd = tokio::task::block_in_place(EtcdServer::start).unwrap();
    let mut proxy = TcpProxy::start(etcd.client_addr()).unwrap();
    let dir = TempDir::new("gantry-ha-part").unwrap();
    let tls = dir.path().join("tls");
    let direct = etcd.client_url();
    let ttl = ["--lease-ttl", "2"];

    // The master behind the proxy starts first and wins the election.
    let mut masters: Vec<MasterProc> = Vec::new();
    masters.push(
        MasterProc::start(
            dir.path(),
            &tls,
            &[&["--etcd", &proxy.url()][..], &ttl].concat(),
        )
        .unwrap(),
    );
    wait_for(
        "the proxied master to lead",
        Duration::from_secs(20),
        || masters[0].is_leader(),
    );
    for _ in 0..2 {
        masters.push(
            MasterProc::start(dir.path(), &tls, &[&["--etcd", &direct][..], &ttl].concat())
                .unwrap(),
        );
    }
    wait_for("standbys", Duration::from_secs(20), || {
        masters[1..].iter().all(|m| {
            m.health()
                .is_ok_and(|h| h["role"] == "standby" && !h["leader"].is_null())
        })
    });
    let addrs: Vec<String> = masters.iter().map(|m| m.quic.to_string()).collect();
    let agents: Vec<AgentProc> = (0..3)
        .map(|i| {
            AgentProc::start_multi(
                dir.path(),
                &tls,
                &addrs.join(","),
                &format!("pt{i}"),
                "cpus:15;mem:20480",
            )
            .unwrap()
        })
        .collect();
    masters[0]
        .wait_state(Duration::from_secs(30), "3 agents", |s| {
            s["agents"].as_array().is_some_and(|a| a.len() == 3)
        })
        .unwrap();
    let t = tls.clone();
    let a = addrs.clone();
    let batch = tokio::spawn(async move {
        run_batch_ha(a, &t, "part-fw", "part", 70, "cpus:1;mem:16", "sleep 5").await
    });
    // 70 tasks on 45 cpus: some are still pending at the cut, so the new leader must offer.
    masters[0]
        .wait_state(Duration::from_secs(60), "40 running tasks", |s| {
            gantry_tests::running_tasks(s) >= 40
        })
        .unwrap();

    // Partition the leader from etcd; agents and the framework still reach it.
    let cut_at = Instant::now();
    proxy.cut();
    tokio::task::block_in_place(|| {
        wait_for("the old leader to exit", Duration::from_secs(20), || {
            !masters[0].proc.is_running()
        })
    });
    eprintln!("old leader exited {:?} after the cut", cut_at.elapsed());
    let mut new_leader = 0;
    tokio::task::block_in_place(|| {
        wait_for("a new leader", Duration::from_secs(30), || {
            match masters[1..].iter().position(|m| m.is_leader()) {
                Some(i) => {
                    new_leader = i + 1;
                    true
                }
                None => false,
            }
        })
    });
    eprintln!("new leader {:?} after the cut", cut_at.elapsed());
    let m = &masters[new_leader];
    m.wait_state(Duration::from_secs(30), "agents re-registered", |s| {
        s["agents"]
            .as_array()
            .is_some_and(|a| a.iter().filter(|a| a["connected"] == true).count() == 3)
    })
    .unwrap();
    let p = tokio::time::timeout(Duration::from_secs(60), batch)
        .await
        .expect("framework finishes")
        .unwrap()
        .unwrap();

    // The ordering, from the logs: old leader stepped down before the new leader offered.
    let lost = log_time(&masters[0].log, "lost leadership").unwrap_or_else(|| {
        panic!(
            "no `lost leadership` in the old leader's log:\n{}",
            std::fs::read_to_string(&masters[0].log).unwrap_or_default()
        )
    });
    let first_offer = log_time(&m.log, "first offers made as leader").unwrap_or_else(|| {
        panic!(
            "no `first offers made as leader` in the new leader's log:\n{}",
            std::fs::read_to_string(&m.log).unwrap_or_default()
        )
    });
    let elected = log_time(&m.log, "elected leader").expect("new leader's election logged");
    eprintln!(
        "old leader lost: {lost}; new leader elected: {elected}, first offers: {first_offer}"
    );
    assert!(
        lost < elected && elected <= first_offer,
        "old leader stepped down at {lost}, new leader elected at {elected} and offered at {first_offer}"
    );
    // The old leader made no offers after it stepped down: its log ends with the exit.
    let old_log = std::fs::read_to_string(&masters[0].log).unwrap_or_default();
    let after_loss: Vec<String> = old_log
        .lines()
        .map(strip_ansi)
        .skip_while(|l| !l.contains("lost leadership"))
        .filter(|l| l.contains("first offers") || l.contains("elected leader"))
        .collect();
    assert!(after_loss.is_empty(), "{after_loss:?}");

    assert_finished_once("batch", &p, 70);
    let sandboxes = sandbox_count(&agents);
    assert_eq!(sandboxes, 70);
}
