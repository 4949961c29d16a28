//! Task isolation through a real agent and real cgroups: the memory limit (an OOM kill ends
//! the task FAILED with the memory-limit reason), the disk limit (the agent measures sandboxes
//! du-style and kills a task past its `disk`: FAILED `disk-limit`), the hard CPU quota (a busy
//! loop with cpus 0.5 gets about half a core, measured from cgroup cpu accounting), and the pids
//! limit (process creation fails past it; bounded, never a real fork bomb). Each test has its
//! own cluster and its own `--cgroup-root`, and checks that no task cgroup is left behind.

use std::time::{Duration, Instant};

use gantry_master::client::{BlockingClient, ClientConfig, Credentials};
use gantry_sdk::protocol::{TaskInfo, TaskReason, TaskState};
use gantry_sdk::DriverHandle;
use gantry_tests::{
    cgroups_available, free_tcp, start_recorder, state_task, task, CgroupRoot, Cluster, Updates,
};

const T: Duration = Duration::from_secs(30);

struct Setup {
    cluster: Cluster,
    root: CgroupRoot,
    updates: Updates,
    handle: DriverHandle,
    run: tokio::task::JoinHandle<Result<(), gantry_sdk::scheduler::DriverError>>,
}

/// A one-agent cluster with its own cgroup root, running `tasks` through a [`Recorder`].
fn setup(test: &str, agent_args: &[&str], tasks: Vec<TaskInfo>) -> Option<Setup> {
    if !cgroups_available(test) {
        return None;
    }
    let root = CgroupRoot::new(test);
    let mut args = vec!["--cgroup-root", &root.name, "--usage-interval", "0.5"];
    args.extend_from_slice(agent_args);
    let cluster = Cluster::start_with(&[(test, "cpus:2;mem:2048")], &[], &args).unwrap();
    let (updates, handle, run) = framework(&cluster, test, tasks);
    Some(Setup {
        cluster,
        root,
        updates,
        handle,
        run,
    })
}

/// A framework named `name` on `cluster` running `tasks` through a `Recorder`.
fn framework(
    cluster: &Cluster,
    name: &str,
    tasks: Vec<TaskInfo>,
) -> (
    Updates,
    DriverHandle,
    tokio::task::JoinHandle<Result<(), gantry_sdk::scheduler::DriverError>>,
) {
    start_recorder(cluster.driver_config(name, &["batch"]), tasks)
}

impl Setup {
    /// No task cgroup is left while the agent runs (only its pool's empty ones); stopped
    /// cleanly, the agent drains its pool and removes the root: nothing is left at all.
    async fn finish(mut self) {
        assert!(
            self.root.task_cgroups().is_empty(),
            "task cgroups left behind: {:?}",
            self.root.task_cgroups()
        );
        self.handle.stop();
        tokio::time::timeout(T, self.run)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            self.cluster.agents[0].terminate(T),
            "the agent did not stop"
        );
        assert!(
            self.root.all_cgroups().is_empty() && self.root.dirs().is_empty(),
            "cgroups left after the agent stopped: {:?} {:?}",
            self.root.all_cgroups(),
            self.root.dirs()
        );
    }
}

/// A pooled cgroup reused after an OOM kill: the next task in it is not blamed for the earlier
/// kill (the kernel's OOM counter cannot be reset: it is a baseline), and its limit is its own.
/// The agent is killed (`kill -9`) and restarted while that task runs: the restarted agent
/// finds the baseline in the task's launch record, so the task still ends FINISHED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_cgroup_reused_after_an_oom_kill() {
    // Each takes the agent's two CPUs: one after the other. Each prints its memory cgroup.
    let hog = task(
        "hog",
        "grep pool- /proc/self/cgroup | head -n 1; perl -e '$x = \"a\" x (256 * 1024 * 1024); print length($x), \"\\n\"'",
        "cpus:2;mem:64",
    );
    let next = task(
        "next",
        "grep pool- /proc/self/cgroup | head -n 1; perl -e '$x = \"a\" x (96 * 1024 * 1024); print length($x), \"\\n\"'; sleep 3",
        "cpus:2;mem:256",
    );
    // Two prepared cgroups once the hog's is back (the one made ahead, and the hog's in front:
    // the last returned is taken first). The next task is launched only then: its launch
    // races the recycling otherwise (the hog's terminal update goes out before its cgroup is
    // readied), and would take the other one.
    let metrics = free_tcp();
    let metrics_arg = metrics.to_string();
    let Some(mut s) = setup(
        "pool",
        &["--cgroup-pool", "1:2", "--metrics-listen", &metrics_arg],
        vec![hog.clone()],
    ) else {
        return;
    };
    let failed = s
        .updates
        .wait(hog.task_id, TaskState::Failed, T)
        .await
        .unwrap();
    assert_eq!(failed.reason, Some(TaskReason::MemoryLimit), "{failed:?}");
    let scraper = BlockingClient::new(&ClientConfig {
        master: format!("http://{metrics}"),
        tls_dir: None,
        credentials: Credentials::None,
        timeout: Duration::from_secs(10),
    })
    .unwrap();
    let start = Instant::now();
    loop {
        let text = scraper.get("/metrics").unwrap_or_default();
        if text.contains("gantry_agent_cgroup_pool_ready 2") {
            break;
        }
        assert!(
            start.elapsed() < T,
            "the hog's cgroup never came back: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut next_updates, next_handle, next_run) =
        framework(&s.cluster, "pool-next", vec![next.clone()]);
    next_updates
        .wait(next.task_id, TaskState::Running, T)
        .await
        .unwrap();
    // `restart` kills the agent with SIGKILL first.
    s.cluster.agents[0].restart().unwrap();
    if let Err(e) = next_updates
        .wait(next.task_id, TaskState::Finished, T)
        .await
    {
        s.cluster.dump_logs();
        panic!("{e}");
    }
    next_handle.stop();
    tokio::time::timeout(T, next_run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let cgroup_of = |t: &TaskInfo| {
        std::fs::read_to_string(s.cluster.agents[0].sandbox_file(t.task_id, "stdout"))
            .unwrap()
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let (a, b) = (cgroup_of(&hog), cgroup_of(&next));
    assert!(a.contains("/pool-"), "{a}");
    assert_eq!(a, b, "the second task reused the hog's cgroup");
    s.finish().await;
}

/// The memory limit (an OOM kill) and, on the same agent with its default flags, the disk
/// limit (`--disk-enforcement du`, measured every 5 s): a task writing 64 MiB into its sandbox
/// under `disk:10` is killed, FAILED `disk-limit`; one within its limit (a 4 MiB file with 3
/// more hard links to it, a 1 GiB sparse file, a symlink to `/usr`: 4 MiB as du counts it,
/// 16 MiB or more counted naively) runs past two measurements and FINISHES.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_disk_hogs_fail_with_their_limits() {
    // 256 MiB really allocated (and touched) under a 64 MiB limit.
    let hog = task(
        "hog",
        "perl -e '$x = \"a\" x (256 * 1024 * 1024); print length($x), \"\\n\"'",
        "cpus:0.5;mem:64",
    );
    let small = task(
        "small",
        "perl -e '$x = \"a\" x (8 * 1024 * 1024); print length($x), \"\\n\"'",
        "cpus:0.5;mem:64",
    );
    // Bounded: 64 MiB written, then it waits to be measured (and would finish after 60 s).
    let disk_hog = task(
        "disk-hog",
        "dd if=/dev/zero of=big bs=1M count=64 2>/dev/null && sync big && echo written; sleep 60",
        "cpus:0.5;mem:256;disk:10",
    );
    let disk_ok = task(
        "disk-ok",
        "dd if=/dev/zero of=data bs=1M count=4 2>/dev/null && sync data && ln data l1 && ln data l2 && \
         ln data l3 && truncate -s 1G sparse && ln -s /usr usr && mkdir -p d/e && ln -s .. d/e/up && \
         echo written; sleep 11",
        "cpus:0.5;mem:64;disk:10",
    );
    let Some(mut s) = setup(
        "mem",
        &[],
        vec![
            hog.clone(),
            small.clone(),
            disk_hog.clone(),
            disk_ok.clone(),
        ],
    ) else {
        return;
    };
    let failed = match s.updates.wait(hog.task_id, TaskState::Failed, T).await {
        Ok(u) => u,
        Err(e) => {
            s.cluster.dump_logs();
            panic!("{e}");
        }
    };
    assert!(
        failed.message.contains("memory-limit"),
        "{}",
        failed.message
    );
    assert_eq!(failed.reason, Some(TaskReason::MemoryLimit));
    // The OOM killer's SIGKILL: seen directly, or as 128+9 from the task's shell.
    assert!(
        failed.signal == Some(9) || failed.exit_code == Some(137),
        "{failed:?}"
    );
    // A task within its limit is unaffected.
    s.updates
        .wait(small.task_id, TaskState::Finished, T)
        .await
        .unwrap();
    // The operator sees why in /state: the completed task keeps reason, message and status.
    let state = s
        .cluster
        .master
        .wait_state(T, "the hog among the completed tasks", |st| {
            st["completed_tasks"]
                .as_array()
                .is_some_and(|c| c.iter().any(|t| t["id"] == hog.task_id.to_string()))
        })
        .unwrap();
    let rec = state["completed_tasks"]
        .as_array()
        .and_then(|c| c.iter().find(|t| t["id"] == hog.task_id.to_string()))
        .unwrap();
    assert_eq!(rec["name"], "hog", "{rec:#}");
    assert_eq!(rec["state"], "FAILED", "{rec:#}");
    assert_eq!(rec["reason"], "memory-limit", "{rec:#}");
    assert!(
        rec["message"]
            .as_str()
            .is_some_and(|m| m.contains("exceeded its memory limit of 64 MiB")),
        "{rec:#}"
    );
    assert!(rec["signal"] == 9 || rec["exit_code"] == 137, "{rec:#}");
    assert_eq!(rec["role"], "batch", "{rec:#}");
    assert!(
        rec["ended_at_ms"].as_u64() >= rec["staged_at_ms"].as_u64(),
        "{rec:#}"
    );
    // The disk hog: killed by the agent (FAILED, not KILLED), the status reaching the
    // framework with the reason and the figures.
    let failed = match s.updates.wait(disk_hog.task_id, TaskState::Failed, T).await {
        Ok(u) => u,
        Err(e) => {
            s.cluster.dump_logs();
            panic!("{e}");
        }
    };
    assert_eq!(failed.reason, Some(TaskReason::DiskLimit), "{failed:?}");
    eprintln!("the disk hog: {}", failed.message);
    assert!(
        failed.message.starts_with("disk-limit: the task used ")
            && failed.message.contains("MiB of its disk limit of 10 MiB"),
        "{}",
        failed.message
    );
    let used: f64 = failed.message["disk-limit: the task used ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figure in {:?}", failed.message));
    assert!((10.0..=80.0).contains(&used), "{}", failed.message);
    let out = std::fs::read_to_string(s.cluster.agents[0].sandbox_file(disk_hog.task_id, "stdout"))
        .unwrap();
    assert_eq!(out, "written\n", "it was killed after writing, not before");
    // The task within its limit (hard links once, sparse by blocks, symlinks not followed).
    if let Err(e) = s
        .updates
        .wait(disk_ok.task_id, TaskState::Finished, T)
        .await
    {
        s.cluster.dump_logs();
        panic!("{e}");
    }
    let state = s
        .cluster
        .master
        .wait_state(T, "the disk hog among the completed tasks", |st| {
            st["completed_tasks"]
                .as_array()
                .is_some_and(|c| c.iter().any(|t| t["id"] == disk_hog.task_id.to_string()))
        })
        .unwrap();
    let rec = state["completed_tasks"]
        .as_array()
        .and_then(|c| c.iter().find(|t| t["id"] == disk_hog.task_id.to_string()))
        .unwrap();
    assert_eq!(rec["state"], "FAILED", "{rec:#}");
    assert_eq!(rec["reason"], "disk-limit", "{rec:#}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_loop_with_half_a_cpu_gets_half_a_core() {
    let busy = task("busy", "while :; do :; done", "cpus:0.5;mem:32");
    let Some(mut s) = setup("cpu", &["--cgroups-enable-cfs"], vec![busy.clone()]) else {
        return;
    };
    s.updates
        .wait(busy.task_id, TaskState::Running, T)
        .await
        .unwrap();
    let cpu = s.root.task_dir("cpu", busy.task_id);
    let quota = std::fs::read_to_string(cpu.join("cpu.cfs_quota_us")).unwrap();
    assert_eq!(quota.trim(), "50000");
    let acct = s
        .root
        .task_dir("cpuacct", busy.task_id)
        .join("cpuacct.usage");
    let read = || -> f64 {
        std::fs::read_to_string(&acct)
            .unwrap()
            .trim()
            .parse::<f64>()
            .unwrap()
            / 1e9
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (u0, t0) = (read(), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (u1, t1) = (read(), Instant::now());
    let cores = (u1 - u0) / (t1 - t0).as_secs_f64();
    eprintln!("busy loop with cpus 0.5 and a hard limit: {cores:.3} cores over 3 s");
    assert!(cores <= 0.6, "CFS quota not enforced: {cores:.3} cores");
    assert!(cores >= 0.25, "the busy loop barely ran: {cores:.3} cores");
    // The agent reports the same accounting to the master.
    let state = s
        .cluster
        .master
        .wait_state(T, "cpu usage in /state", |st| {
            state_task(st, busy.task_id)["usage"]["cpu_time_secs"]
                .as_f64()
                .is_some_and(|c| c >= u0)
        })
        .unwrap();
    eprintln!(
        "usage in /state: {}",
        state_task(&state, busy.task_id)["usage"]
    );
    s.handle.kill(busy.task_id);
    s.updates
        .wait(busy.task_id, TaskState::Killed, T)
        .await
        .unwrap();
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pids_limit_stops_process_creation() {
    // Bounded: at most 200 sleeps, each ending by itself after 20 s.
    let forks = task(
        "forks",
        "i=0; while [ $i -lt 200 ]; do sleep 20 >/dev/null 2>&1 & echo started; i=$((i+1)); done",
        "cpus:0.5;mem:256",
    );
    let Some(mut s) = setup("pids", &["--task-pids-max", "50"], vec![forks.clone()]) else {
        return;
    };
    let done = s
        .updates
        .wait_for("the fork task to end", T, |u| {
            u.task_id == forks.task_id && u.state.is_terminal()
        })
        .await
        .unwrap();
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    let agent = &s.cluster.agents[0];
    let out = std::fs::read_to_string(agent.sandbox_file(forks.task_id, "stdout")).unwrap();
    let err = std::fs::read_to_string(agent.sandbox_file(forks.task_id, "stderr")).unwrap();
    let started = out.lines().filter(|l| *l == "started").count();
    eprintln!(
        "started {started} of 200 under pids.max 50; stderr: {}",
        err.lines().next().unwrap_or("")
    );
    assert!(
        started < 200,
        "the pids limit did not stop process creation"
    );
    assert!(
        started <= 50,
        "{started} processes started under pids.max 50"
    );
    assert!(err.to_lowercase().contains("fork"), "{err}");
    s.finish().await;
}

/// `--isolation none` and a host without NVML: tasks still run (no cgroup is made), and the
/// agent says once why it has no GPUs and that tasks are not isolated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_isolation_or_nvml_tasks_still_run() {
    let root = CgroupRoot::new("none");
    let cluster = Cluster::start_with(
        &[("plain", "cpus:2;mem:1024")],
        &[],
        &[
            "--isolation",
            "none",
            "--cgroup-root",
            &root.name,
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
        ],
    )
    .unwrap();
    let hello = task("hello", "echo hello", "cpus:0.5;mem:32");
    let (mut updates, handle, run) = framework(&cluster, "plain", vec![hello.clone()]);
    updates
        .wait(hello.task_id, TaskState::Finished, T)
        .await
        .unwrap();
    let out =
        std::fs::read_to_string(cluster.agents[0].sandbox_file(hello.task_id, "stdout")).unwrap();
    assert_eq!(out, "hello\n");
    assert!(root.dirs().is_empty(), "cgroups made without isolation");
    let state = cluster.master.state().unwrap();
    assert_eq!(state["agents"][0]["total"]["gpus"], serde_json::Value::Null);
    let log = std::fs::read_to_string(&cluster.agents[0].log).unwrap();
    assert_eq!(log.matches("running as a CPU agent").count(), 1, "{log}");
    assert!(log.contains("--isolation none"), "{log}");
    handle.stop();
    tokio::time::timeout(T, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Killing a task reaches processes that left its process group (`setsid`): after the grace
/// period every process in the task's cgroup is SIGKILLed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_reaches_processes_that_left_the_process_group() {
    let mut stubborn = task(
        "escapee",
        "setsid sleep 600 & echo $! > escaped.pid; trap '' TERM; while :; do sleep 0.1; done",
        "cpus:0.5;mem:64",
    );
    stubborn.kill_grace_secs = Some(1);
    let Some(mut s) = setup("kill", &[], vec![stubborn.clone()]) else {
        return;
    };
    s.updates
        .wait(stubborn.task_id, TaskState::Running, T)
        .await
        .unwrap();
    let agent = &s.cluster.agents[0];
    let escaped: i32 = agent
        .wait_sandbox_file(stubborn.task_id, "escaped.pid", T)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let task_pid = agent.wait_task_pid(stubborn.task_id, T).unwrap();
    assert!(gantry_tests::process_alive(escaped));
    // The child calls setsid(2) right after it is started.
    let deadline = Instant::now() + Duration::from_secs(5);
    // SAFETY: getpgid has no memory effects.
    while unsafe { libc::getpgid(escaped) == libc::getpgid(task_pid) } {
        assert!(
            Instant::now() < deadline,
            "the child did not leave the process group"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.handle.kill(stubborn.task_id);
    let killed = s
        .updates
        .wait(stubborn.task_id, TaskState::Killed, T)
        .await
        .unwrap();
    assert_eq!(killed.signal, Some(9), "{killed:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while gantry_tests::process_alive(escaped) {
        assert!(
            Instant::now() < deadline,
            "the escaped process survived the kill"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.finish().await;
}
