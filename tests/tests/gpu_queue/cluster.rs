//! The queue's test clusters: a master, agents on stand-in GPUs and `gantry-queue serve` as a
//! process, driven through the queue's CLI; and the checks read from the master's task records.

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gantry_tests::{
    bin, cgroups_available, free_tcp, standin_lib, AgentProc, CgroupRoot, Cluster, Proc, Standin,
};
use serde_json::Value;

pub(super) static SERIAL: Mutex<()> = Mutex::new(());

pub(super) const AGENTS: u32 = 4;

pub(super) struct Env {
    pub(super) queue: Queue,
    pub(super) cluster: Cluster,
    pub(super) _roots: Vec<CgroupRoot>,
}

/// A master, four 8-GPU agents (fractions of a GPU shared under MPS limits) and a
/// gantry-queue with `teams`.
pub(super) fn start(tag: &str, teams: &[&str]) -> Option<Env> {
    start_with(tag, teams, AGENTS, &[])
}

/// A master, `agents` 8-GPU agents and a gantry-queue with `teams` and `extra` flags.
pub(super) fn start_with(tag: &str, teams: &[&str], agents: u32, extra: &[&str]) -> Option<Env> {
    if !cgroups_available(tag) {
        return None;
    }
    let mut roots = Vec::new();
    let lib = standin_lib();
    let mut cluster = Cluster::start_with(&[], &[], &[]).unwrap();
    for i in 0..agents {
        Standin::gpus_for(cluster.dir.path(), i + 1, 8).unwrap();
        let name = format!("{tag}{i}");
        let root = CgroupRoot::new(&name);
        let agent = AgentProc::start(
            cluster.dir.path(),
            &cluster.tls_dir,
            cluster.master.quic,
            &name,
            "cpus:16;mem:16384",
            &[
                "--nvml-lib",
                lib.to_str().unwrap(),
                "--cgroup-root",
                &root.name,
                // Fractions of a GPU get MPS limits in their environment (no MPS control
                // daemon here: none is in PATH); whole-GPU tasks are unaffected.
                "--gpu-sharing",
                "mps",
            ],
        )
        .unwrap();
        cluster.agents.push(agent);
        roots.push(root);
    }
    cluster
        .master
        .wait_state(Duration::from_secs(30), "agents with 8 GPUs", |s| {
            s["agents"].as_array().is_some_and(|a| {
                a.iter()
                    .filter(|a| {
                        a["connected"] == true && a["gpus"].as_array().map(Vec::len) == Some(8)
                    })
                    .count()
                    == agents as usize
            })
        })
        .unwrap();
    let queue = Queue::start(&cluster, teams, extra);
    // Jobs are judged against the agents the queue has seen in offers (a job no agent seen so
    // far can fit is refused): submit once it has seen them all.
    let deadline = Instant::now() + Duration::from_secs(30);
    while queue.stats()["agents"] != agents {
        assert!(
            Instant::now() < deadline,
            "the queue saw only {} of {agents} agents",
            queue.stats()["agents"]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(Env {
        queue,
        cluster,
        _roots: roots,
    })
}

pub(super) struct Queue {
    pub(super) _proc: Proc,
    pub(super) url: String,
    pub(super) addr: std::net::SocketAddr,
}

impl Queue {
    pub(super) fn start(cluster: &Cluster, teams: &[&str], extra: &[&str]) -> Queue {
        let addr = free_tcp();
        let mut cmd = Command::new(bin("gantry-queue").unwrap());
        cmd.args([
            "serve",
            "--master",
            &cluster.master.quic.to_string(),
            "--tls-dir",
        ])
        .arg(&cluster.tls_dir)
        .arg("--store")
        .arg(cluster.dir.path().join("queue.redb"))
        .args(["--listen", &addr.to_string(), "--hold-secs", "20"]);
        for t in teams {
            cmd.args(["--team", t]);
        }
        cmd.args(extra);
        cmd.env("RUST_LOG", "info");
        let log = cluster.dir.path().join("gantry-queue.log");
        let proc = Proc::spawn("gantry-queue", cmd, &log).unwrap();
        let q = Queue {
            _proc: proc,
            url: format!("http://{addr}"),
            addr,
        };
        // The harness's HTTP client, in plain HTTP for this address.
        gantry_tests::register_http(addr, &cluster.tls_dir, true);
        let deadline = Instant::now() + Duration::from_secs(30);
        while q.try_jobs().is_err() {
            assert!(
                Instant::now() < deadline,
                "gantry-queue API did not come up"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        q
    }

    pub(super) fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(bin("gantry-queue")?)
            .arg(args[0])
            .args(["--server", &self.url])
            .args(&args[1..])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "gantry-queue {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Submits; returns the job id.
    pub(super) fn submit(
        &self,
        name: &str,
        team: &str,
        prio: &str,
        gpus: u32,
        workers: &str,
        cmd: &str,
    ) -> u64 {
        self.submit_with(name, team, prio, gpus, workers, cmd, &[])
    }

    /// Submits with `extra` flags; returns the job id.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit_with(
        &self,
        name: &str,
        team: &str,
        prio: &str,
        gpus: u32,
        workers: &str,
        cmd: &str,
        extra: &[&str],
    ) -> u64 {
        let gpus = gpus.to_string();
        let mut args = vec![
            "submit",
            "--name",
            name,
            "--team",
            team,
            "--priority",
            prio,
            "--gpus",
            &gpus,
            "--workers",
            workers,
            "--cpus",
            "0.5",
            "--mem",
            "64",
            "--grace-secs",
            "5",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", cmd]);
        let out = self.cli(&args).unwrap();
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("submit printed {out:?}"))
    }

    pub(super) fn try_jobs(&self) -> anyhow::Result<Vec<Value>> {
        let v: Value = serde_json::from_str(&self.cli(&["list", "--json"])?)?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    pub(super) fn jobs(&self) -> Vec<Value> {
        self.try_jobs().unwrap()
    }

    pub(super) fn stats(&self) -> Value {
        let body = gantry_tests::http_get(self.addr, "/stats").unwrap();
        serde_json::from_str(&body).unwrap()
    }

    /// Polls until every job ended; panics (with the job table) after `timeout`.
    pub(super) fn wait_all_ended(&self, env: &Cluster, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let jobs = self.jobs();
            if jobs.iter().all(|j| {
                ["FINISHED", "FAILED", "CANCELLED"].contains(&j["state"].as_str().unwrap_or(""))
            }) {
                return jobs;
            }
            if Instant::now() > deadline {
                eprintln!("{}", self.cli(&["list"]).unwrap_or_default());
                env.dump_logs();
                eprintln!(
                    "---- gantry-queue log ----\n{}",
                    std::fs::read_to_string(env.dir.path().join("gantry-queue.log"))
                        .unwrap_or_default()
                );
                panic!("jobs did not all end within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// Every task the master launched (running and completed; not the `ERROR` and `DROPPED`
/// records of tasks it refused, which never reached an agent).
pub(super) fn master_tasks(cluster: &Cluster) -> Vec<Value> {
    let s = cluster.master.state().unwrap();
    let mut all = s["tasks"].as_array().cloned().unwrap_or_default();
    all.extend(s["completed_tasks"].as_array().cloned().unwrap_or_default());
    all.retain(|t| t["state"] != "ERROR" && t["state"] != "DROPPED");
    all
}

/// From the master's records: the tasks of rigid gang `name` (named `name/INDEX`), in staging
/// order, form whole launches: each run of `workers` tasks has every index once, was staged
/// within one second (one pass of the queue: one accept per agent, sent together), and was
/// fully staged before any of its members ended.
pub(super) fn assert_no_partial_gang(tasks: &[Value], name: &str, workers: usize) {
    let mut mine: Vec<(u64, u64, String)> = tasks
        .iter()
        .filter_map(|t| {
            let tn = t["name"].as_str()?;
            let (job, index) = tn.rsplit_once('/')?;
            (job == name).then(|| {
                (
                    t["staged_at_ms"].as_u64().unwrap_or(0),
                    t["ended_at_ms"].as_u64().unwrap_or(u64::MAX),
                    index.to_string(),
                )
            })
        })
        .collect();
    assert!(
        !mine.is_empty(),
        "no task of gang {name} in the master's records"
    );
    mine.sort();
    assert!(
        mine.len().is_multiple_of(workers),
        "gang {name}: {} tasks launched, not a multiple of {workers}: {mine:?}",
        mine.len()
    );
    for launch in mine.chunks(workers) {
        let mut indices: Vec<usize> = launch.iter().filter_map(|t| t.2.parse().ok()).collect();
        indices.sort_unstable();
        assert_eq!(
            indices,
            (0..workers).collect::<Vec<_>>(),
            "gang {name}: {launch:?}"
        );
        let first = launch[0].0;
        let last = launch[workers - 1].0;
        let first_end = launch.iter().map(|t| t.1).min().unwrap_or(u64::MAX);
        assert!(
            last - first < 1000,
            "gang {name} staged over {} ms: {launch:?}",
            last - first
        );
        assert!(
            last <= first_end,
            "gang {name}: a member ended before the last was staged: {launch:?}"
        );
    }
}

pub(super) fn sandbox_file(cluster: &Cluster, task_id: &str, file: &str) -> Option<String> {
    cluster.agents.iter().find_map(|a| {
        std::fs::read_to_string(a.work_dir.join("sandboxes").join(task_id).join(file)).ok()
    })
}
