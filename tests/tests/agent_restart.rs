//! `kill -9` of a GPU agent while 10 tasks run, then a restart from its checkpoint: the tasks
//! kept running and are re-adopted, tasks that ended while the agent was down are reported with
//! their real outcome, the framework sees each terminal update exactly once, GPU occupancy is
//! rebuilt from the checkpoint (a new 2-GPU task gets the two GPUs nobody holds), and no task
//! cgroup is left behind.
//!
//! A second test kills the agent (`--isolation none`, room for 40 tasks, its log compacted every
//! 64 KiB) three times during a stream of 300 launches: every task is accounted for (exactly one terminal update each), and every task
//! whose process ran to completion is reported FINISHED (its outcome survived in the agent's
//! write-ahead log or in the supervisor's exit file), none of it is lost.
//!
//! A third kills the agent's supervisor process under a running task: the task is killed and
//! reported FAILED ("its supervisor died"), and the next task runs under a new supervisor.
//!
//! The stand-in's configuration path is a process-wide variable: only the first test uses it
//! (the burst agent runs without GPUs).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gantry_sdk::protocol::{
    Capability, Program, StatusUpdate, TaskId, TaskInfo, TaskState, UpdateSource,
};
use gantry_tests::{
    cgroups_available, process_alive, standin_lib, start_recorder, state_task, task, CgroupRoot,
    Cluster, Standin, TempDir, Updates,
};

const T: Duration = Duration::from_secs(30);

fn framework(
    cluster: &Cluster,
    name: &str,
    tasks: Vec<TaskInfo>,
) -> (
    Updates,
    gantry_sdk::DriverHandle,
    tokio::task::JoinHandle<Result<(), gantry_sdk::scheduler::DriverError>>,
) {
    let mut config = cluster.driver_config(name, &["batch"]);
    config.info.capabilities = vec![Capability::GpuResources];
    start_recorder(config, tasks)
}

fn terminal_counts(seen: &[StatusUpdate]) -> BTreeMap<TaskId, Vec<TaskState>> {
    let mut out: BTreeMap<TaskId, Vec<TaskState>> = BTreeMap::new();
    for u in seen
        .iter()
        .filter(|u| u.state.is_terminal() && !u.reconciliation)
    {
        out.entry(u.task_id).or_default().push(u.state);
    }
    out
}

fn visible(env: &str) -> Vec<String> {
    env.lines()
        .find_map(|l| l.strip_prefix("CUDA_VISIBLE_DEVICES="))
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_and_restarted_keeps_its_tasks() {
    if !cgroups_available("agent_restart") {
        return;
    }
    let scratch = TempDir::new("gantry-restart").unwrap();
    let _standin = Standin::four_gpus(scratch.path()).unwrap();
    let root = CgroupRoot::new("restart");
    let lib = standin_lib();
    let mut cluster = Cluster::start_with(
        &[("restart1", "cpus:8;mem:4096")],
        &["--agent-reregister-timeout", "30"],
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--cgroup-root",
            &root.name,
        ],
    )
    .unwrap();

    // 5 tasks end while the agent is down (one of them fails), 5 outlive the outage; two of
    // the long ones hold a GPU each. Each group waits for a trigger file the test creates, so
    // the timeline does not depend on the machine's speed.
    let short_go = scratch.path().join("short-go");
    let long_go = scratch.path().join("long-go");
    let waiting = |name: &str, trigger: &std::path::Path, then: &str, res: &str| {
        let mut t = task(
            name,
            &format!("{then}while [ ! -e \"$GO\" ]; do sleep 0.1; done"),
            res,
        );
        t.env.insert("GO".into(), trigger.display().to_string());
        t
    };
    let mut short: Vec<TaskInfo> = (0..4)
        .map(|i| waiting(&format!("short{i}"), &short_go, "", "cpus:0.5;mem:32"))
        .collect();
    let mut fail = waiting("short-fail", &short_go, "", "cpus:0.5;mem:32");
    if let Program::Shell(cmd) = &mut fail.command.program {
        cmd.push_str("; exit 3");
    }
    short.push(fail);
    let mut long: Vec<TaskInfo> = (0..3)
        .map(|i| waiting(&format!("long{i}"), &long_go, "", "cpus:0.5;mem:32"))
        .collect();
    for i in 0..2 {
        long.push(waiting(
            &format!("long-gpu{i}"),
            &long_go,
            "env > env.txt; ",
            "cpus:0.5;mem:32;gpus:1",
        ));
    }
    let all: Vec<TaskInfo> = short.iter().chain(&long).cloned().collect();
    let (mut updates, handle, run) = framework(&cluster, "restart-fw", all.clone());
    for t in &all {
        if let Err(e) = updates.wait(t.task_id, TaskState::Running, T).await {
            cluster.dump_logs();
            panic!("{e}");
        }
    }
    let pids: BTreeMap<TaskId, i32> = all
        .iter()
        .map(|t| {
            let pid = cluster.agents[0].wait_task_pid(t.task_id, T).unwrap();
            (t.task_id, pid)
        })
        .collect();
    let held: BTreeSet<String> = long[3..]
        .iter()
        .flat_map(|t| {
            visible(
                &cluster.agents[0]
                    .wait_sandbox_file(t.task_id, "env.txt", T)
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(held.len(), 2, "{held:?}");

    // kill -9 the agent; its tasks keep running without it.
    cluster.agents[0].kill9();
    for (t, pid) in &pids {
        assert!(process_alive(*pid), "task {t} died with the agent");
    }
    // The short tasks end meanwhile.
    std::fs::write(&short_go, b"").unwrap();
    let deadline = std::time::Instant::now() + T;
    while short.iter().any(|t| process_alive(pids[&t.task_id])) {
        assert!(
            std::time::Instant::now() < deadline,
            "short tasks still running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.agents[0].restart().unwrap();

    // The short tasks are reported with their real outcome...
    for t in &short[..4] {
        updates
            .wait(t.task_id, TaskState::Finished, T)
            .await
            .unwrap_or_else(|e| {
                cluster.dump_logs();
                panic!("{e}")
            });
    }
    let failed = updates
        .wait(short[4].task_id, TaskState::Failed, T)
        .await
        .unwrap();
    assert_eq!(failed.exit_code, Some(3), "{failed:?}");
    // ...while the long ones are still running, re-adopted.
    let state = cluster
        .master
        .wait_state(T, "the agent back", |s| s["agents"][0]["connected"] == true)
        .unwrap();
    for t in &long {
        if !process_alive(pids[&t.task_id]) {
            cluster.dump_logs();
            panic!("task {} died", t.name);
        }
        assert_eq!(
            state_task(&state, t.task_id)["state"],
            "RUNNING",
            "{state:#}"
        );
    }

    // GPU occupancy survived the restart: a new 2-GPU task gets the two free GPUs.
    let extra = task("extra-gpus", "env > env.txt", "cpus:0.5;mem:32;gpus:2");
    let (mut extra_updates, extra_handle, extra_run) =
        framework(&cluster, "restart-extra", vec![extra.clone()]);
    extra_updates
        .wait(extra.task_id, TaskState::Finished, T)
        .await
        .unwrap();
    let got: BTreeSet<String> = visible(
        &std::fs::read_to_string(cluster.agents[0].sandbox_file(extra.task_id, "env.txt")).unwrap(),
    )
    .into_iter()
    .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.is_disjoint(&held), "GPUs {got:?} are held by {held:?}");

    // The long tasks finish; every task's terminal update arrives exactly once.
    std::fs::write(&long_go, b"").unwrap();
    for t in &long {
        updates
            .wait(t.task_id, TaskState::Finished, T)
            .await
            .unwrap();
    }
    // Give duplicates a chance to show up (agent retries back off from 1 s).
    let _ = updates
        .wait_for("no more updates", Duration::from_secs(3), |_| false)
        .await;
    let counts = terminal_counts(&updates.seen);
    assert_eq!(counts.len(), 10, "{counts:?}");
    for t in &all {
        assert_eq!(
            counts[&t.task_id].len(),
            1,
            "task {} terminal updates: {:?}",
            t.name,
            counts[&t.task_id]
        );
    }
    cluster
        .master
        .wait_state(T, "no tasks left", |s| {
            s["tasks"].as_array().is_some_and(|t| t.is_empty())
        })
        .unwrap();
    assert!(
        root.task_cgroups().is_empty(),
        "task cgroups left behind: {:?}",
        root.task_cgroups()
    );
    for (h, r) in [(handle, run), (extra_handle, extra_run)] {
        h.stop();
        tokio::time::timeout(T, r).await.unwrap().unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_a_burst_of_launches_loses_no_task() {
    const N: usize = 300;
    let long = Duration::from_secs(120);
    let mut cluster = Cluster::start_with(
        &[("burst1", "cpus:4;mem:65536;gpus:0")],
        &["--agent-reregister-timeout", "60"],
        // Compaction every 64 KiB of log: many snapshots, some cut short by the kills.
        &["--isolation", "none", "--wal-compact-bytes", "65536"],
    )
    .unwrap();
    // Short tasks, so that launches, exits and acknowledgements all overlap the kills.
    let tasks: Vec<TaskInfo> = (0..N)
        .map(|i| task(&format!("burst{i}"), "sleep 0.3", "cpus:0.1;mem:1"))
        .collect();
    let ids: BTreeSet<TaskId> = tasks.iter().map(|t| t.task_id).collect();
    let (mut updates, handle, run) = framework(&cluster, "burst-fw", tasks);
    // 40 tasks fit on the agent at a time: launches keep coming as tasks end. Kill -9 after 30,
    // 100 and 170 tasks reported RUNNING, restarting the agent at once each time.
    for after in [30, 100, 170] {
        let seen = Cell::new(0);
        if let Err(e) = updates
            .wait_for(&format!("{after} tasks running"), long, |u| {
                let running = u.source == UpdateSource::Agent && u.state == TaskState::Running;
                seen.set(seen.get() + usize::from(running));
                seen.get() >= after
            })
            .await
        {
            cluster.dump_logs();
            panic!("{e}");
        }
        cluster.agents[0].restart().unwrap();
    }
    let ended = RefCell::new(BTreeSet::new());
    if let Err(e) = updates
        .wait_for("every task terminal", long, |u| {
            if u.state.is_terminal() {
                ended.borrow_mut().insert(u.task_id);
            }
            ended.borrow().len() == N
        })
        .await
    {
        cluster.dump_logs();
        panic!("{e}");
    }
    // Give duplicates a chance to show up (agent retries back off from 1 s).
    let _ = updates
        .wait_for("no more updates", Duration::from_secs(3), |_| false)
        .await;
    let counts = terminal_counts(&updates.seen);
    assert_eq!(counts.keys().copied().collect::<BTreeSet<_>>(), ids);
    let last: BTreeMap<TaskId, &StatusUpdate> = updates
        .seen
        .iter()
        .filter(|u| u.state.is_terminal())
        .map(|u| (u.task_id, u))
        .collect();
    let mut finished = 0;
    for (id, states) in &counts {
        assert_eq!(states.len(), 1, "task {id} terminal updates: {states:?}");
        // A task whose supervisor recorded exit code 0 ran to completion: it must be FINISHED.
        let exit = cluster.agents[0].launch_record(*id).and_then(|r| r.exit);
        if let Some(exit) = exit.filter(|e| e.code == Some(0)) {
            assert_eq!(
                states[0],
                TaskState::Finished,
                "task {id} ran ({exit:?}): {:?}",
                last[id]
            );
        }
        finished += usize::from(states[0] == TaskState::Finished);
    }
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for u in last.values() {
        *tally
            .entry(format!("{} {}", u.state, u.message))
            .or_default() += 1;
    }
    eprintln!("terminal outcomes: {tally:#?}");
    if finished == 0 {
        cluster.dump_logs();
        panic!("no task finished: {last:#?}");
    }
    cluster
        .master
        .wait_state(long, "no tasks left", |s| {
            s["tasks"].as_array().is_some_and(|t| t.is_empty())
        })
        .unwrap();
    let log = std::fs::read_to_string(&cluster.agents[0].log).unwrap();
    assert!(
        log.contains("compacted the agent's log"),
        "the log was never compacted"
    );
    handle.stop();
    tokio::time::timeout(T, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// The agent's supervisor process killed while a task runs: the task, unsupervised, is killed
/// and reported FAILED with a clear message, and the next task runs under a new supervisor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_supervisor_fails_its_task_and_a_new_one_takes_over() {
    let cluster = Cluster::start_with(
        &[("sup1", "cpus:2;mem:1024;gpus:0")],
        &[],
        &["--isolation", "none"],
    )
    .unwrap();
    let long = task("long", "sleep 60", "cpus:1;mem:1");
    let (mut updates, handle, run) = framework(&cluster, "sup-fw", vec![long.clone()]);
    updates
        .wait(long.task_id, TaskState::Running, T)
        .await
        .unwrap();
    let task_pid = cluster.agents[0].wait_task_pid(long.task_id, T).unwrap();
    let (supervisor, _) = cluster.agents[0]
        .launch_record(long.task_id)
        .and_then(|r| r.supervisor)
        .unwrap();
    assert!(process_alive(task_pid));
    // SAFETY: kill(2) on a pid read from the supervisor's own record.
    unsafe { libc::kill(supervisor, libc::SIGKILL) };
    let failed = updates
        .wait(long.task_id, TaskState::Failed, T)
        .await
        .unwrap();
    assert!(
        failed.message.contains("supervisor died"),
        "{:?}",
        failed.message
    );
    let start = std::time::Instant::now();
    while process_alive(task_pid) {
        assert!(start.elapsed() < T, "the unsupervised task still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let next = task("next", "echo ok", "cpus:1;mem:1");
    let (mut next_updates, next_handle, next_run) =
        framework(&cluster, "sup-fw2", vec![next.clone()]);
    next_updates
        .wait(next.task_id, TaskState::Finished, T)
        .await
        .unwrap();
    let next_supervisor = cluster.agents[0]
        .launch_record(next.task_id)
        .and_then(|r| r.supervisor)
        .map(|(pid, _)| pid);
    assert!(next_supervisor.is_some_and(|pid| pid != supervisor));
    for (h, r) in [(handle, run), (next_handle, next_run)] {
        h.stop();
        tokio::time::timeout(T, r).await.unwrap().unwrap().unwrap();
    }
}
