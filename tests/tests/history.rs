//! The persistent event history (issue 30 item 3): task state transitions and cluster events,
//! with their times, survive a master restart (the local registry) and a leader kill in an etcd
//! HA cluster, and are served by `GET /api/v1/events?since=…`, the task page and
//! `gantryctl events --since`.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gantry_master::client::{Credentials, OperatorClient};
use gantry_tests::etcd::EtcdServer;
use gantry_tests::{
    bin, https_client, start_recorder, task, AgentProc, Cluster, MasterProc, TempDir,
};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the master's registry holds every event it recorded, and at least `n`.
fn wait_stored(m: &MasterProc, n: u64) {
    m.wait_state(T, "the history stored", |s| {
        let h = &s["history"];
        h["recorded"].as_u64().is_some_and(|r| r >= n) && h["stored"] == h["recorded"]
    })
    .unwrap();
}

/// The history events `GET /api/v1/events?since=1h` sends before its snapshot.
async fn history(c: &OperatorClient) -> Vec<Value> {
    let mut out = Vec::new();
    c.events("/api/v1/events?since=1h", |data| {
        let v: Value = serde_json::from_str(data).unwrap();
        if v["type"] == "snapshot" {
            return false;
        }
        assert_eq!(v["history"], true, "{v}");
        out.push(v);
        true
    })
    .await
    .unwrap();
    out
}

/// The states task `name` went through, by the history.
fn states_of(events: &[Value], name: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "task_updated" && e["name"] == name)
        .map(|e| e["state"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_survives_a_master_restart() {
    let mut cluster = Cluster::start(&[("hist-a1", "cpus:2;mem:1024")]).unwrap();
    let api = https_client(
        cluster.master.http,
        &cluster.tls_dir,
        Credentials::Certificate("admin".into()),
    );
    let (_updates, _handle, _driver) = start_recorder(
        cluster.driver_config("hist-fw", &["eng"]),
        vec![
            task("hist-1", "echo done", "cpus:1;mem:32"),
            task("usage-1", "sleep 3", "cpus:0.5;mem:512"),
        ],
    );
    cluster
        .master
        .wait_state(T, "both finished", |s| {
            s["completed_tasks"]
                .as_array()
                .is_some_and(|t| t.iter().filter(|t| t["state"] == "FINISHED").count() == 2)
        })
        .unwrap();
    // What each task held, by the master's own task records: cpu- and memory-hours.
    let mut want = (0.0, 0.0);
    for name in ["hist-1", "usage-1"] {
        let t: Value =
            serde_json::from_str(&api.get(&format!("/api/v1/tasks/{name}")).await.unwrap())
                .unwrap();
        let hours = (t["ended_at_ms"].as_u64().unwrap() - t["started_at_ms"].as_u64().unwrap())
            as f64
            / 3_600_000.0;
        want.0 += t["resources"]["cpus"].as_f64().unwrap() * hours;
        want.1 += t["resources"]["mem"].as_f64().unwrap() / 1024.0 * hours;
    }
    // The task page shows its transitions with their times.
    let page: Value =
        serde_json::from_str(&api.get("/api/v1/tasks/hist-1").await.unwrap()).unwrap();
    let states: Vec<&str> = page["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["state"].as_str().unwrap())
        .collect();
    assert!(states.ends_with(&["RUNNING", "FINISHED"]), "{page:#}");
    assert!(page["history"][0]["at_ms"].as_u64().unwrap() > 1_600_000_000_000);
    wait_stored(&cluster.master, 6);

    // kill -9 and start again: the history is read back from the registry.
    cluster.master.restart().unwrap();
    let api = https_client(
        cluster.master.http,
        &cluster.tls_dir,
        Credentials::Certificate("admin".into()),
    );
    let events = history(&api).await;
    let states = states_of(&events, "hist-1");
    assert!(
        states.ends_with(&["RUNNING".to_string(), "FINISHED".to_string()]),
        "{states:?} in {events:#?}"
    );
    assert!(events
        .iter()
        .any(|e| e["type"] == "agent_added" && e["name"] == "hist-a1"));
    assert!(events.iter().all(|e| e["at_ms"].as_u64().is_some()));
    // Usage from the history read back: the role's hours agree with the task records.
    let u: Value =
        serde_json::from_str(&api.get("/api/v1/usage?since=1h&by=role").await.unwrap()).unwrap();
    let eng = u["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "eng")
        .unwrap();
    assert_eq!(eng["tasks"], 2, "{u:#}");
    let (cpu, mem) = (
        eng["cpu_hours"].as_f64().unwrap(),
        eng["mem_gib_hours"].as_f64().unwrap(),
    );
    assert!(
        (cpu - want.0).abs() <= want.0 * 0.01,
        "cpu-hours {cpu} vs {want:?}"
    );
    assert!(
        (mem - want.1).abs() <= want.1 * 0.01,
        "mem-GiB-hours {mem} vs {want:?}"
    );
    let out = Command::new(bin("gantryctl").unwrap())
        .arg("--master")
        .arg(format!("https://{}", cluster.master.http))
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .args(["usage", "--since", "1h", "--by", "framework", "--csv"])
        .output()
        .unwrap();
    let csv = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        csv.starts_with("key,tasks,cpu_hours") && csv.contains("\"hist-fw\",2,"),
        "{csv}"
    );
    // A bad `since` is refused with what it may be.
    let e = api.get("/api/v1/events?since=yesterday").await.unwrap_err();
    assert_eq!(e.status(), Some(400), "{e}");

    // gantryctl events --since prints them with times and names.
    let mut ctl = Command::new(bin("gantryctl").unwrap())
        .arg("--master")
        .arg(format!("https://{}", cluster.master.http))
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .args(["events", "--since", "1h"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = ctl.stdout.take().unwrap();
    let line = tokio::task::block_in_place(|| {
        std::io::BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.contains("hist-1") && l.contains("FINISHED"))
    });
    let _ = ctl.kill();
    let _ = ctl.wait();
    let line = line.expect("gantryctl events --since printed hist-1's end");
    assert!(line.contains("hist-a1"), "agent by name: {line}");
    assert!(line.starts_with("20"), "a timestamp first: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_survives_a_leader_kill_in_an_etcd_ha_cluster() {
    let etcd = EtcdServer::start().unwrap();
    let dir = TempDir::new("gantry-ha-history").unwrap();
    let tls = dir.path().join("tls");
    let url = etcd.client_url();
    let mut masters: Vec<MasterProc> = (0..2)
        .map(|_| {
            MasterProc::start(dir.path(), &tls, &["--etcd", &url, "--lease-ttl", "2"]).unwrap()
        })
        .collect();
    wait_until("a leader", || {
        masters.iter().filter(|m| m.is_leader()).count() == 1
    });
    let leader = masters.iter().position(|m| m.is_leader()).unwrap();
    let addrs: Vec<String> = masters.iter().map(|m| m.quic.to_string()).collect();
    let _agent = AgentProc::start_multi(
        dir.path(),
        &tls,
        &addrs.join(","),
        "hist-ha1",
        "cpus:2;mem:1024",
    )
    .unwrap();
    let cfg =
        gantry_tests::driver_config(addrs.clone(), tls.clone(), "hist-ha-fw", vec!["eng".into()]);
    let (_updates, _handle, _driver) =
        start_recorder(cfg, vec![task("ha-hist", "echo done", "cpus:1;mem:32")]);
    masters[leader]
        .wait_state(T, "ha-hist finished", |s| {
            s["completed_tasks"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|t| t["name"] == "ha-hist" && t["state"] == "FINISHED")
            })
        })
        .unwrap();
    wait_stored(&masters[leader], 3);

    masters[leader].proc.kill9();
    let mut next = None;
    wait_until("a new leader", || {
        next = masters
            .iter()
            .enumerate()
            .find(|(i, m)| *i != leader && m.is_leader())
            .map(|(i, _)| i);
        next.is_some()
    });
    let m = &masters[next.unwrap()];
    let api = https_client(m.http, &tls, Credentials::Certificate("admin".into()));
    let events = history(&api).await;
    let states = states_of(&events, "ha-hist");
    assert!(
        states.ends_with(&["RUNNING".to_string(), "FINISHED".to_string()]),
        "{states:?} in {events:#?}"
    );
    // The new leader goes on recording after what it read.
    m.wait_state(T, "the new leader records", |s| {
        s["history"]["recorded"].as_u64() > Some(0)
    })
    .unwrap();
}
