//! Issue 26, items 2 and 7–9, over a real master and real agents (QUIC + TLS, cgroups as the
//! harness starts them): partitions and lost agents.
//!
//! 1. A paused agent (SIGSTOP past its re-register timeout) is *unreachable*: the tasks of the
//!    partition-aware `batch` framework are `UNREACHABLE` (not `LOST`), nothing is relaunched,
//!    and when the agent resumes it is re-admitted under its id and its tasks report the
//!    `FINISHED` they reached while away: every unit ran exactly once (a ledger line each).
//! 2. An agent paused past the unreachable timeout too: its tasks are `GONE` and `batch`
//!    relaunches each once elsewhere; a task that had FINISHED before the agent went, whose
//!    update its framework (down at the time) never acknowledged, stays `FINISHED`: the
//!    framework failing over gets the real update, not `LOST`.
//! 3. A live agent reconnecting under its own id reports a task the master never launched,
//!    under the batch framework's id and with `cpus:500`: the task is killed and never
//!    accounted; the batch framework's tasks all finish.

use std::path::Path;
use std::time::{Duration, Instant};

use gantry_examples::batch::{Batch, BatchProgress, BatchSpec};
use gantry_sdk::protocol::*;
use gantry_sdk::transport::PeerIdentity;
use gantry_tests::*;
use tokio::sync::watch;

const T: Duration = Duration::from_secs(60);

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child process this test started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Starts the partition-aware batch framework; its progress and its run.
fn start_batch(
    cluster: &Cluster,
    name: &str,
    count: u32,
    command: &str,
) -> (
    watch::Receiver<BatchProgress>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let (batch, progress) = Batch::new(BatchSpec {
        name: name.into(),
        command: CommandInfo::shell(command),
        count,
        task: "cpus:1;mem:32".parse().unwrap(),
        env: Default::default(),
        verbose: true,
        gpu_selector: None,
    });
    let mut config = cluster.driver_config(name, &["part"]);
    config.info.capabilities.push(Capability::PartitionAware);
    config.info.failover_timeout_secs = 600.0;
    let run = tokio::spawn(async move {
        gantry_sdk::Driver::new(config).run(batch).await?;
        Ok(())
    });
    (progress, run)
}

async fn wait_progress(
    rx: &mut watch::Receiver<BatchProgress>,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&BatchProgress) -> bool,
) -> BatchProgress {
    let deadline = Instant::now() + timeout;
    loop {
        let p = rx.borrow().clone();
        if pred(&p) {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {p:?}"
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
    }
}

/// Lines of the ledger each task appends its id to (one line per execution).
fn ledger(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn tasks_in(state: &serde_json::Value, which: &str) -> usize {
    state["tasks"]
        .as_array()
        .map(|t| t.iter().filter(|t| t["state"] == which).count())
        .unwrap_or(0)
}

fn agent_id(state: &serde_json::Value, name: &str) -> Option<String> {
    state["agents"].as_array().and_then(|a| {
        a.iter()
            .find(|a| a["name"] == name && a["connected"] == true)
            .and_then(|a| a["id"].as_str().map(str::to_string))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_unreachable_gone_and_phantom_tasks() {
    let cluster = Cluster::start_with(
        &[("part-1", "cpus:3;mem:1024"), ("part-2", "cpus:3;mem:1024")],
        &[
            "--agent-reregister-timeout",
            "2",
            "--agent-unreachable-timeout",
            "12",
        ],
        &[],
    )
    .unwrap();
    let guard = DumpOnPanic(&cluster);
    run(guard.0).await;
}

/// Prints the cluster's logs when the test fails.
struct DumpOnPanic<'a>(&'a Cluster);

impl Drop for DumpOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.dump_logs();
        }
    }
}

async fn run(cluster: &Cluster) {
    let ledger_dir = cluster.dir.path().join("ledger");
    std::fs::create_dir_all(&ledger_dir).unwrap();
    // Tasks run as `nobody`: the ledger directory is world-writable.
    std::process::Command::new("chmod")
        .arg("1777")
        .arg(&ledger_dir)
        .status()
        .unwrap();
    let pid_of = |name: &str| {
        cluster
            .agents
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.proc.pid())
            .unwrap()
    };

    // ---- 1. Unreachable, then back: tasks resume, nothing runs twice. ----
    let book = ledger_dir.join("one");
    let command = format!("sleep 8; echo $GANTRY_TASK_ID >> {}", book.display());
    let (mut p1, run1) = start_batch(cluster, "part-one", 6, &command);
    wait_progress(&mut p1, "6 tasks running", T, |p| p.running == 6).await;
    let s = cluster.master.state().unwrap();
    let id_before = agent_id(&s, "part-1").expect("part-1 registered");
    signal(pid_of("part-1"), libc::SIGSTOP);
    // Silent 15 s (QUIC idle timeout), then 2 s: unreachable. Its 3 tasks are UNREACHABLE.
    let p = wait_progress(&mut p1, "3 tasks unreachable", T, |p| p.unreachable == 3).await;
    assert_eq!(
        p.relaunched, 0,
        "nothing relaunched for an unreachable agent: {p:?}"
    );
    let s = cluster.master.state().unwrap();
    assert_eq!(tasks_in(&s, "UNREACHABLE"), 3, "{s:#}");
    assert_eq!(tasks_in(&s, "LOST"), 0);
    let away = &s["unreachable_agents"][0];
    assert_eq!(
        (away["name"].as_str(), away["tasks"].as_u64()),
        (Some("part-1"), Some(3)),
        "{s:#}"
    );
    signal(pid_of("part-1"), libc::SIGCONT);
    // Back within the unreachable timeout: same id, its tasks' real states.
    let p = wait_progress(&mut p1, "all 6 finished", T, |p| p.done).await;
    run1.await.unwrap().unwrap();
    assert_eq!((p.finished, p.failed, p.relaunched), (6, 0, 0), "{p:?}");
    for (task, states) in &p.terminal_updates {
        assert_eq!(states, &vec![TaskState::Finished], "task {task}");
    }
    let s = cluster.master.state().unwrap();
    assert_eq!(
        agent_id(&s, "part-1").as_deref(),
        Some(id_before.as_str()),
        "re-admitted under its id"
    );
    let lines = ledger(&book);
    let mut distinct = lines.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        (lines.len(), distinct.len()),
        (6, 6),
        "each task ran once: {lines:?}"
    );

    // ---- 2. Gone: relaunched once elsewhere; a FINISHED never becomes LOST. ----
    // A raw framework (it never acknowledges) runs a short task on part-2, then goes away.
    let (_ep, conn, mut tx, mut rx) = cluster.raw_framework("part-raw").await;
    let info = FrameworkInfo {
        framework_id: None,
        name: "part-raw".into(),
        roles: vec!["raw".into()],
        capabilities: vec![Capability::PartitionAware],
        failover_timeout_secs: 600.0,
        min_allocatable: Vec::new(),
        suppressed_roles: Vec::new(),
    };
    tx.send(&FrameworkToMaster::Subscribe(info.clone()))
        .await
        .unwrap();
    let mut raw_id = None;
    let mut launched = false;
    let part2 = agent_id(&cluster.master.state().unwrap(), "part-2").expect("part-2 registered");
    let quick = task("quick", "true", "cpus:0.5;mem:16");
    let deadline = Instant::now() + T;
    let finished_update = loop {
        assert!(Instant::now() < deadline, "raw framework got no FINISHED");
        let m = tokio::time::timeout(T, rx.recv::<MasterToFramework>())
            .await
            .unwrap()
            .unwrap();
        match m {
            MasterToFramework::Subscribed { framework_id, .. } => raw_id = Some(framework_id),
            MasterToFramework::Offers(offers) => {
                let (mine, others): (Vec<&Offer>, Vec<&Offer>) =
                    offers.iter().partition(|o| o.agent_id.to_string() == part2);
                // Offers name their agent as operators see it (protocol v7).
                assert!(mine.iter().all(|o| o.agent_name == "part-2"), "{mine:?}");
                assert!(
                    others.iter().all(|o| o.agent_name == "part-1"),
                    "{others:?}"
                );
                if !others.is_empty() {
                    tx.send(&FrameworkToMaster::Decline {
                        offer_ids: others.iter().map(|o| o.id).collect(),
                        refuse_seconds: Some(600.0),
                    })
                    .await
                    .unwrap();
                }
                if let Some(o) = mine.first().filter(|_| !launched) {
                    launched = true;
                    tx.send(&FrameworkToMaster::Accept {
                        offer_ids: vec![o.id],
                        operations: vec![Operation::Launch {
                            tasks: vec![quick.clone()],
                        }],
                        refuse_seconds: Some(600.0),
                    })
                    .await
                    .unwrap();
                }
            }
            MasterToFramework::Update(u) if u.task_id == quick.task_id => {
                if u.state == TaskState::Finished {
                    break u;
                }
                if u.state.is_terminal() {
                    panic!("quick task ended {u:?}");
                }
            }
            _ => {}
        }
    };
    let raw_id = raw_id.unwrap();
    // Not acknowledged; the framework goes away.
    conn.close(0u32.into(), b"bye");
    drop((tx, rx));

    let book = ledger_dir.join("two");
    let command = format!("echo $GANTRY_TASK_ID >> {}; sleep 20", book.display());
    // Six tasks on two agents of 3 cpus: three on each.
    let (mut p2, run2) = start_batch(cluster, "part-two", 6, &command);
    wait_progress(&mut p2, "6 tasks running", T, |p| p.running == 6).await;
    signal(pid_of("part-2"), libc::SIGSTOP);
    // 15 s idle + 2 s re-register + 12 s unreachable: its 3 tasks are GONE, and relaunched.
    let p = wait_progress(
        &mut p2,
        "part-2's tasks gone",
        Duration::from_secs(90),
        |p| p.relaunched == 3 && p.unreachable == 0,
    )
    .await;
    let gone: Vec<_> = p
        .terminal_updates
        .iter()
        .filter(|(_, s)| s.contains(&TaskState::Gone))
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(gone.len() as u32, p.relaunched, "{p:?}");
    let s = cluster.master.state().unwrap();
    assert!(agent_id(&s, "part-2").is_none(), "part-2 forgotten: {s:#}");
    // The raw framework fails over: it gets the real FINISHED, never LOST.
    let (_ep, raw_conn, mut tx, mut rx) = cluster.raw_framework("part-raw").await;
    tx.send(&FrameworkToMaster::Subscribe(FrameworkInfo {
        framework_id: Some(raw_id),
        ..info
    }))
    .await
    .unwrap();
    let deadline = Instant::now() + T;
    loop {
        assert!(Instant::now() < deadline, "no redelivered update");
        let m = tokio::time::timeout(T, rx.recv::<MasterToFramework>())
            .await
            .unwrap()
            .unwrap();
        if let MasterToFramework::Update(u) = m {
            if u.task_id == quick.task_id {
                // Every unacknowledged update, in order, ending with the real FINISHED.
                assert!(
                    matches!(
                        u.state,
                        TaskState::Starting | TaskState::Running | TaskState::Finished
                    ),
                    "{u:?}"
                );
                tx.send(&FrameworkToMaster::Acknowledge {
                    task_id: u.task_id,
                    update_id: u.update_id,
                })
                .await
                .unwrap();
                if u.state == TaskState::Finished {
                    assert_eq!(u.update_id, finished_update.update_id);
                    break;
                }
            }
        }
    }
    // Done with it: it tears down (it would otherwise sit on the offers it is sent).
    tx.send(&FrameworkToMaster::Teardown).await.unwrap();
    let _ = tokio::time::timeout(T, raw_conn.closed()).await;
    drop((tx, rx));
    // part-2 resumes: it is no longer known, joins as a new agent, its old tasks are killed.
    signal(pid_of("part-2"), libc::SIGCONT);
    let p = wait_progress(&mut p2, "part-two done", Duration::from_secs(90), |p| {
        p.done
    })
    .await;
    run2.await.unwrap().unwrap();
    assert_eq!((p.finished, p.failed, p.relaunched), (6, 0, 3), "{p:?}");
    cluster
        .master
        .wait_state(T, "part-2 back as a new agent", |s| {
            agent_id(s, "part-2").is_some()
        })
        .unwrap();
    let lines = ledger(&book);
    let mut distinct = lines.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        lines.len(),
        distinct.len(),
        "no task id ran twice: {lines:?}"
    );
    assert_eq!(
        lines.len() as u32,
        6 + p.relaunched,
        "each lost unit ran again once"
    );

    // ---- 3. A phantom task from a live agent. ----
    let (mut p3, run3) = start_batch(cluster, "part-three", 4, "sleep 1");
    let victim: FrameworkId = loop {
        let s = cluster.master.state().unwrap();
        if let Some(f) = s["frameworks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "part-three")
        {
            break serde_json::from_value(f["id"].clone()).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let register = |id: Option<AgentId>, running: Vec<RunningTask>| AgentToMaster::Register {
        agent_id: id,
        hostname: "phantom".into(),
        resources: "cpus:0.1;mem:16".parse().unwrap(),
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: vec![],
        running_tasks: running,
        pending_updates: vec![],
        task_user: "nobody".into(),
    };
    let identity = PeerIdentity::Agent("part-phantom".into());
    let (_ep, conn, mut tx, mut rx) = cluster.raw_peer(identity.clone()).await.unwrap();
    tx.send(&register(None, vec![])).await.unwrap();
    let phantom_id = match tokio::time::timeout(T, rx.recv::<MasterToAgent>()).await {
        Ok(Ok(MasterToAgent::Registered { agent_id, .. })) => agent_id,
        other => panic!("raw agent not registered: {other:?}"),
    };
    conn.close(0u32.into(), b"reconnecting");
    drop((tx, rx));
    // Back at once under its own id (a live re-registration), reporting a task never launched.
    // One far over the host, one that fits in it.
    let phantom = task("phantom", "sleep 1000", "cpus:500;mem:1");
    let small = task("phantom-small", "sleep 1000", "cpus:0.05;mem:1");
    let (_ep, _conn, mut tx, mut rx) = cluster.raw_peer(identity).await.unwrap();
    tx.send(&register(
        Some(phantom_id),
        [&phantom, &small]
            .into_iter()
            .map(|t| RunningTask {
                framework_id: victim,
                task: t.clone(),
                state: TaskState::Running,
                gpus: vec![],
                ports: vec![],
            })
            .collect(),
    ))
    .await
    .unwrap();
    let deadline = Instant::now() + T;
    let mut registered = false;
    let mut killed = std::collections::HashSet::new();
    while !(registered && killed.len() == 2) {
        assert!(
            Instant::now() < deadline,
            "registered {registered}, killed {killed:?}"
        );
        match tokio::time::timeout(T, rx.recv::<MasterToAgent>()).await {
            Ok(Ok(MasterToAgent::Registered { agent_id, .. })) => {
                assert_eq!(agent_id, phantom_id, "a live re-registration keeps its id");
                registered = true;
            }
            Ok(Ok(MasterToAgent::KillTask { task_id, .. }))
                if task_id == phantom.task_id || task_id == small.task_id =>
            {
                killed.insert(task_id);
            }
            Ok(Ok(_)) => {}
            other => panic!("raw agent: {other:?}"),
        }
    }
    let s = cluster.master.state().unwrap();
    let tasks = s["tasks"].as_array().unwrap();
    for t in [&phantom, &small] {
        assert!(
            !tasks
                .iter()
                .any(|x| x["id"] == t.task_id.to_string().as_str()),
            "phantom task adopted: {s:#}"
        );
    }
    let text = s.to_string();
    assert!(!text.contains("adopted from re-registering agent"), "{s:#}");
    // Nor charged: the victim's allocation is what its real tasks and offers hold (the two
    // agents have 6.1 cpus), and its dominant share at most 1, not 500 cpus' worth.
    let f = s["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "part-three")
        .cloned()
        .unwrap();
    assert!(f["dominant_share"].as_f64().unwrap() <= 1.0, "{f:#}");
    assert!(f["active_tasks"].as_u64().unwrap() <= 6, "{f:#}");
    let p = wait_progress(&mut p3, "part-three done", T, |p| p.done).await;
    run3.await.unwrap().unwrap();
    assert_eq!((p.finished, p.failed), (4, 0), "{p:?}");
}
