//! Ports as a master-accounted resource (issue 15) on a real cluster: one agent with the port
//! range 29400-29402 (`--ports`, below the kernel's ephemeral range so no other test's socket
//! lands in it), advertised as `ports:3`.
//!
//! - Two frameworks launch tasks asking `ports:2` and `ports:1`; each task binds every port of
//!   its `GANTRY_PORTS` and writes `$PORT $GANTRY_PORTS` to a file: the ports are distinct,
//!   match the RUNNING updates and `/state`.
//! - A third task asking `ports:1` waits (no offer holds a port) and runs once a task ended,
//!   on the port that task freed.
//! - `kill -9` and restart of the agent: the re-adopted tasks keep their ports (in `/state`),
//!   and a new task does not get a re-adopted task's port even when that task closed its
//!   sockets (the agent's own books, not the bind probe, keep it).
//! - `kill -9` and restart of the master: the tasks it learns from the agent's re-registration
//!   carry their ports.
//! - Attack (raw QUIC framework): an accept asking more ports than offered, and one asking half
//!   a port, are refused; the legitimate tasks still run and finish.
//! - Ports held by a process outside Gantry (the test binds two): a task asking two ports fails
//!   at once with reason `port-unavailable`, one asking one gets the port left.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gantry_sdk::protocol::*;
use gantry_sdk::transport::tls::PeerIdentity;
use gantry_tests::{driver_config, start_recorder, task, AgentProc, MasterProc, TempDir};

const T: Duration = Duration::from_secs(60);

/// Binds every port of `GANTRY_PORTS`, writes `$PORT $GANTRY_PORTS` to `OUT`, closes the
/// sockets once `OUT.release` exists (the task keeps running) and exits once `OUT.stop` does.
const BIND: &str = r#"
import os, socket, sys, time
out = sys.argv[1]
socks = []
for p in os.environ["GANTRY_PORTS"].split(","):
    s = socket.socket()
    s.bind(("0.0.0.0", int(p)))
    s.listen()
    socks.append(s)
with open(out + ".tmp", "w") as f:
    f.write(os.environ["PORT"] + " " + os.environ["GANTRY_PORTS"])
os.rename(out + ".tmp", out)
while not os.path.exists(out + ".stop"):
    if socks and os.path.exists(out + ".release"):
        for s in socks:
            s.close()
        socks = []
        open(out + ".released", "w").close()
    time.sleep(0.1)
"#;

/// A task running the bind script, writing to `files/NAME`.
fn port_task(files: &Path, name: &str, ports: u32) -> TaskInfo {
    task(
        name,
        &format!(
            "exec python3 {}/bind.py {}/{name}",
            files.display(),
            files.display()
        ),
        &format!("cpus:0.1;mem:32;ports:{ports}"),
    )
}

fn wait_file(path: &Path) -> String {
    let deadline = Instant::now() + T;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {path:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `(PORT, GANTRY_PORTS)` a task wrote.
fn written(files: &Path, name: &str) -> (u16, Vec<u16>) {
    let text = wait_file(&files.join(name));
    let (port, list) = text.trim().split_once(' ').unwrap();
    (
        port.parse().unwrap(),
        list.split(',').map(|p| p.parse().unwrap()).collect(),
    )
}

fn state_ports(master: &MasterProc, id: TaskId) -> Vec<u16> {
    let st = master.state().unwrap();
    let t = st["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id.to_string())
        .unwrap_or_else(|| panic!("task {id} not in /state: {st:#}"));
    serde_json::from_value(t["ports"].clone()).unwrap()
}

/// A 0777 directory the tasks (run as the agent's task user) can write, removed on drop.
struct Shared(PathBuf);

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_are_accounted_assigned_bound_and_survive_an_agent_restart() {
    let dir = TempDir::new("gantry-ports").unwrap();
    let tls = dir.path().join("tls");
    let mut master = MasterProc::start(dir.path(), &tls, &[]).unwrap();
    let mut agent = AgentProc::start(
        dir.path(),
        &tls,
        master.quic,
        "ports-0",
        "cpus:4;mem:2048",
        &["--isolation", "none", "--ports", "29400-29402"],
    )
    .unwrap();
    let st = master
        .wait_state(Duration::from_secs(30), "the agent", |s| {
            s["agents"].as_array().is_some_and(|a| a.len() == 1)
        })
        .unwrap();
    assert_eq!(st["agents"][0]["total"]["ports"], 3.0, "{st:#}");
    let shared = Shared(std::env::temp_dir().join(format!("gantry-ports-{}", std::process::id())));
    let files = shared.0.clone();
    std::fs::create_dir_all(&files).unwrap();
    std::fs::set_permissions(&files, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(files.join("bind.py"), BIND).unwrap();
    let masters = vec![master.quic.to_string()];

    // Framework B: one task with two ports.
    let b1 = port_task(&files, "b1", 2);
    let (mut ub, _hb, _rb) = start_recorder(
        driver_config(masters.clone(), tls.clone(), "ports-b", vec!["b".into()]),
        vec![b1.clone()],
    );
    let run_b1 = ub.wait(b1.task_id, TaskState::Running, T).await.unwrap();
    let (port, list) = written(&files, "b1");
    assert_eq!(list.len(), 2);
    assert_eq!(port, list[0]);
    assert_eq!(run_b1.ports, list, "the RUNNING update carries the ports");

    // Framework A: a1 takes the last port; a2 waits for one.
    let a1 = port_task(&files, "a1", 1);
    let a2 = port_task(&files, "a2", 1);
    let (mut ua, _ha, _ra) = start_recorder(
        driver_config(masters.clone(), tls.clone(), "ports-a", vec!["a".into()]),
        vec![a1.clone(), a2.clone()],
    );
    let run_a1 = ua.wait(a1.task_id, TaskState::Running, T).await.unwrap();
    let (port_a1, list_a1) = written(&files, "a1");
    assert_eq!(
        (list_a1.clone(), run_a1.ports.clone()),
        (vec![port_a1], vec![port_a1])
    );
    let all: BTreeSet<u16> = list.iter().chain(&list_a1).copied().collect();
    assert_eq!(
        all,
        BTreeSet::from([29400, 29401, 29402]),
        "distinct ports across frameworks"
    );
    assert_eq!(state_ports(&master, b1.task_id), list);
    assert_eq!(state_ports(&master, a1.task_id), vec![port_a1]);
    // No port is left: a2 is not launched (its framework has no offer with a port).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !ua.seen.iter().any(|u| u.task_id == a2.task_id),
        "a2 must wait for a port: {:?}",
        ua.seen
    );
    assert!(!files.join("a2").exists());
    // a1 ends: a2 runs, on the port a1 freed.
    std::fs::write(files.join("a1.stop"), "").unwrap();
    ua.wait(a1.task_id, TaskState::Finished, T).await.unwrap();
    ua.wait(a2.task_id, TaskState::Running, T).await.unwrap();
    let (port_a2, _) = written(&files, "a2");
    assert_eq!(port_a2, port_a1);

    // kill -9 and restart of the agent: the running tasks are re-adopted with their ports.
    agent.kill9();
    agent.restart().unwrap();
    master
        .wait_state(Duration::from_secs(60), "the agent back", |s| {
            s["agents"][0]["connected"] == true
        })
        .unwrap();
    assert_eq!(state_ports(&master, b1.task_id), list);
    assert_eq!(state_ports(&master, a2.task_id), vec![port_a2]);
    // b1 closes its sockets but runs on: its ports stay its own. a2 ends; a new task gets
    // a2's port, not one of b1's (lower, and bindable now).
    std::fs::write(files.join("b1.release"), "").unwrap();
    wait_file(&files.join("b1.released"));
    std::fs::write(files.join("a2.stop"), "").unwrap();
    ua.wait(a2.task_id, TaskState::Finished, T).await.unwrap();
    let c1 = port_task(&files, "c1", 1);
    let (mut uc, _hc, _rc) = start_recorder(
        driver_config(masters.clone(), tls.clone(), "ports-c", vec!["c".into()]),
        vec![c1.clone()],
    );
    let run_c1 = uc.wait(c1.task_id, TaskState::Running, T).await.unwrap();
    assert_eq!(run_c1.ports, vec![port_a2], "b1 holds {list:?}");
    assert_eq!(written(&files, "c1").0, port_a2);

    // kill -9 and restart of the master: it learns the tasks again from the agent's
    // re-registration, ports included.
    master.restart().unwrap();
    let (b1_id, c1_id) = (b1.task_id.to_string(), c1.task_id.to_string());
    master
        .wait_state(T, "the tasks re-adopted", |s| {
            s["tasks"].as_array().is_some_and(|ts| {
                [&b1_id, &c1_id].iter().all(|id| {
                    ts.iter()
                        .any(|t| t["id"] == **id && t["state"] == "RUNNING")
                })
            })
        })
        .unwrap();
    assert_eq!(state_ports(&master, b1.task_id), list);
    assert_eq!(state_ports(&master, c1.task_id), vec![port_a2]);

    // Attack: a raw framework asks for more ports than its offer holds, and for half a port.
    {
        let (_ep, _conn, mut tx, mut rx) = gantry_tests::raw_peer(
            master.quic,
            &tls,
            PeerIdentity::Framework("ports-greedy".into()),
        )
        .await
        .unwrap();
        tx.send(&FrameworkToMaster::Subscribe(FrameworkInfo {
            framework_id: None,
            name: "ports-greedy".into(),
            roles: vec!["greedy".into()],
            capabilities: vec![],
            failover_timeout_secs: 0.0,
            min_allocatable: Vec::new(),
            suppressed_roles: Vec::new(),
        }))
        .await
        .unwrap();
        let offer = loop {
            let m = tokio::time::timeout(T, rx.recv::<MasterToFramework>())
                .await
                .expect("an offer")
                .expect("connection");
            if let MasterToFramework::Offers(mut offers) = m {
                break offers.remove(0);
            }
        };
        let offered = offer.total().milli("ports") / 1000;
        assert_eq!(offered, 0, "every port is held: {offer:?}");
        let mut greedy = task("greedy", "sleep 60", "cpus:0.1;mem:8");
        greedy.resources.set_milli("ports", (offered + 1) * 1000);
        let half = task("half", "sleep 60", "cpus:0.1;mem:8;ports:0.5");
        tx.send(&FrameworkToMaster::Accept {
            offer_ids: vec![offer.id],
            operations: vec![Operation::Launch {
                tasks: vec![greedy.clone(), half.clone()],
            }],
            refuse_seconds: Some(0.0),
        })
        .await
        .unwrap();
        let mut errors = BTreeSet::new();
        let deadline = tokio::time::Instant::now() + T;
        while errors.len() < 2 {
            let m = tokio::time::timeout_at(deadline, rx.recv::<MasterToFramework>())
                .await
                .expect("the refusals")
                .expect("connection");
            if let MasterToFramework::Update(u) = m {
                if u.task_id == greedy.task_id || u.task_id == half.task_id {
                    assert_eq!(u.state, TaskState::Error, "{u:?}");
                    assert!(u.ports.is_empty());
                    errors.insert(u.task_id);
                }
            }
        }
        let st = master.state().unwrap();
        let names: Vec<&str> = st["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert!(
            !names.contains(&"greedy") && !names.contains(&"half"),
            "{names:?}"
        );
        tx.send(&FrameworkToMaster::Teardown).await.unwrap();
    }

    // The legitimate tasks still run, keep their ports, and finish.
    assert_eq!(state_ports(&master, b1.task_id), list);
    assert_eq!(state_ports(&master, c1.task_id), vec![port_a2]);
    std::fs::write(files.join("b1.stop"), "").unwrap();
    std::fs::write(files.join("c1.stop"), "").unwrap();
    ub.wait(b1.task_id, TaskState::Finished, T).await.unwrap();
    uc.wait(c1.task_id, TaskState::Finished, T).await.unwrap();
    // Completed tasks keep their ports in the records.
    let st = master
        .wait_state(T, "b1 completed", |s| {
            s["completed_tasks"]
                .as_array()
                .is_some_and(|c| c.iter().any(|t| t["id"] == b1_id))
        })
        .unwrap();
    let done = st["completed_tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == b1_id)
        .unwrap();
    assert_eq!(
        serde_json::from_value::<Vec<u16>>(done["ports"].clone()).unwrap(),
        list
    );

    // Outside Gantry: the test holds 29400 and 29401. The master offers all three ports (it
    // cannot know); the agent skips the two, so a 2-port task fails with the reason and a
    // 1-port task gets 29402.
    let _held: Vec<std::net::TcpListener> = [29400, 29401]
        .into_iter()
        .map(|p| std::net::TcpListener::bind(("0.0.0.0", p)).unwrap())
        .collect();
    let d1 = port_task(&files, "d1", 2);
    let d2 = port_task(&files, "d2", 1);
    let (mut ud, _hd, _rd) = start_recorder(
        driver_config(masters.clone(), tls.clone(), "ports-d", vec!["d".into()]),
        vec![d1.clone(), d2.clone()],
    );
    let failed = ud
        .wait_for("d1 to fail", T, |u| {
            u.task_id == d1.task_id && u.state.is_terminal()
        })
        .await
        .unwrap();
    assert_eq!(
        (failed.state, failed.reason),
        (TaskState::Failed, Some(TaskReason::PortUnavailable)),
        "{failed:?}"
    );
    assert!(
        failed.message.contains("in use outside Gantry"),
        "{}",
        failed.message
    );
    let run_d2 = ud.wait(d2.task_id, TaskState::Running, T).await.unwrap();
    assert_eq!(run_d2.ports, vec![29402]);
    assert_eq!(written(&files, "d2").0, 29402);
    std::fs::write(files.join("d2.stop"), "").unwrap();
    ud.wait(d2.task_id, TaskState::Finished, T).await.unwrap();
}
