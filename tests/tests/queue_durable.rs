//! `gantry-queue` survives its own death: a real master, two agents with four stand-in GPUs
//! each, and `gantry-queue serve` on a real store (redb). The queue is `kill -9`ed twice (right
//! after a burst of submissions, while launches are under way, and with jobs running) and
//! restarted on the same store each time: it fails over as the same framework, reconciles, and
//! every job finishes exactly once (each execution appends a line to a ledger, as in
//! `partitions.rs`). SIGTERM only disconnects (the worker keeps running and the next `serve`
//! takes it over); `gantry-queue shutdown` tears the framework down (its running job is killed
//! and recorded CANCELLED; finished jobs stay FINISHED in the store). Pending jobs say why
//! they wait and where they stand; a job no agent can ever fit is refused at submission. A
//! failing job is retried (`--max-retries`) and reports its worker's real exit status; one
//! past its `--time-limit` is killed with the reason. A queue started while an agent is
//! deactivated (never offered to it) still counts that agent, from the master's agent
//! inventory: a gang that needs it is accepted and runs once the agent is back.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gantry_tests::{
    bin, cgroups_available, free_tcp, standin_lib, AgentProc, CgroupRoot, Cluster, Proc, Standin,
};
use serde_json::Value;

const AGENTS: u32 = 2;
const GPUS: u32 = 4;
const T: Duration = Duration::from_secs(120);

/// A `gantry-queue serve` process on a store that outlives it.
struct Queue {
    proc: Option<Proc>,
    url: String,
    addr: SocketAddr,
    store: PathBuf,
    dir: PathBuf,
    master: String,
    tls_dir: PathBuf,
    starts: u32,
}

impl Queue {
    fn new(cluster: &Cluster) -> Queue {
        let addr = free_tcp();
        gantry_tests::register_http(addr, &cluster.tls_dir, true);
        let mut q = Queue {
            proc: None,
            url: format!("http://{addr}"),
            addr,
            store: cluster.dir.path().join("queue.redb"),
            dir: cluster.dir.path().to_path_buf(),
            master: cluster.master.quic.to_string(),
            tls_dir: cluster.tls_dir.clone(),
            starts: 0,
        };
        q.start();
        q
    }

    /// Starts `serve` (again) on the same store and address; waits for its API.
    fn start(&mut self) {
        self.starts += 1;
        let mut cmd = Command::new(bin("gantry-queue").unwrap());
        cmd.args(["serve", "--master", &self.master, "--tls-dir"])
            .arg(&self.tls_dir)
            .arg("--store")
            .arg(&self.store)
            .args(["--listen", &self.addr.to_string(), "--team", "nlp=1"])
            .args(["--retry-backoff-secs", "1"]);
        let log = self.dir.join(format!("gantry-queue-{}.log", self.starts));
        self.proc = Some(Proc::spawn("gantry-queue", cmd, &log).unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.try_jobs().is_err() {
            assert!(
                Instant::now() < deadline,
                "gantry-queue API did not come up:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn proc(&mut self) -> &mut Proc {
        self.proc.as_mut().expect("the queue runs")
    }

    fn logs(&self) -> String {
        (1..=self.starts)
            .map(|i| {
                let p = self.dir.join(format!("gantry-queue-{i}.log"));
                format!(
                    "---- gantry-queue run {i} ----\n{}",
                    std::fs::read_to_string(p).unwrap_or_default()
                )
            })
            .collect()
    }

    fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
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

    fn submit(&self, name: &str, cmd: &str) -> u64 {
        let out = self
            .cli(&[
                "submit", "--name", name, "--team", "nlp", "--gpus", "1", "--cpus", "0.5", "--mem",
                "32", "--", cmd,
            ])
            .unwrap();
        out.trim().parse().unwrap()
    }

    fn try_jobs(&self) -> anyhow::Result<Vec<Value>> {
        let v: Value = serde_json::from_str(&self.cli(&["list", "--json"])?)?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// Polls the job list until `what` holds.
    fn wait(&self, cluster: &Cluster, what: &str, f: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + T;
        loop {
            if let Ok(jobs) = self.try_jobs() {
                if f(&jobs) {
                    return jobs;
                }
                if Instant::now() > deadline {
                    cluster.dump_logs();
                    eprintln!("{}", self.logs());
                    panic!("{what}: not within {T:?}: {jobs:#?}");
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn state_of<'a>(jobs: &'a [Value], name: &str) -> &'a str {
    jobs.iter()
        .find(|j| j["name"] == name)
        .and_then(|j| j["state"].as_str())
        .unwrap_or("")
}

fn count(jobs: &[Value], state: &str) -> usize {
    jobs.iter().filter(|j| j["state"] == state).count()
}

/// Lines of the ledger (one per execution).
fn ledger(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The master's frameworks named `gantry-queue`.
fn queue_frameworks(cluster: &Cluster) -> Vec<Value> {
    let s = cluster.master.state().unwrap();
    s["frameworks"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter(|f| f["name"] == "gantry-queue")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn kill9_sigterm_and_shutdown_lose_nothing_and_run_nothing_twice() {
    let tag = "qdur";
    if !cgroups_available(tag) {
        return;
    }
    let lib = standin_lib();
    let mut cluster = Cluster::start_with(&[], &[], &[]).unwrap();
    let mut roots = Vec::new();
    for i in 0..AGENTS {
        Standin::gpus_for(cluster.dir.path(), i + 1, GPUS).unwrap();
        let name = format!("{tag}{i}");
        let root = CgroupRoot::new(&name);
        let agent = AgentProc::start(
            cluster.dir.path(),
            &cluster.tls_dir,
            cluster.master.quic,
            &name,
            "cpus:8;mem:4096",
            &[
                "--nvml-lib",
                lib.to_str().unwrap(),
                "--cgroup-root",
                &root.name,
            ],
        )
        .unwrap();
        cluster.agents.push(agent);
        roots.push(root);
    }
    cluster
        .master
        .wait_state(Duration::from_secs(30), "agents with GPUs", |s| {
            s["agents"].as_array().is_some_and(|a| {
                a.iter()
                    .filter(|a| {
                        a["connected"] == true
                            && a["gpus"].as_array().map(Vec::len) == Some(GPUS as usize)
                    })
                    .count()
                    == AGENTS as usize
            })
        })
        .unwrap();
    let ledger_dir = cluster.dir.path().join("ledger");
    std::fs::create_dir_all(&ledger_dir).unwrap();
    // Workers may run as `nobody`: the ledger directory is world-writable.
    Command::new("chmod")
        .arg("1777")
        .arg(&ledger_dir)
        .status()
        .unwrap();
    let book = ledger_dir.join("runs");
    let job = |secs: u32| format!("echo $GPU_QUEUE_JOB_ID >> {}; sleep {secs}", book.display());
    let mut q = Queue::new(&cluster);

    // ---- 1. kill -9 right after a burst, and again with jobs running. ----
    let n = 12;
    for i in 0..n {
        q.submit(&format!("burst{i}"), &job(4));
    }
    // Launches of the first eight are under way.
    q.proc().kill9();
    q.start();
    let jobs = q.wait(&cluster, "jobs running after the first restart", |j| {
        count(j, "RUNNING") >= 4
    });
    // Those still waiting explain themselves and have a place in the queue.
    for j in jobs.iter().filter(|j| j["state"] == "PENDING") {
        assert!(
            j["pending_reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{j:#}"
        );
        assert!(j["position"].as_u64().is_some_and(|p| p >= 1), "{j:#}");
        assert!(j["team_position"].as_u64().is_some(), "{j:#}");
        for key in [
            "id",
            "name",
            "team",
            "user",
            "priority",
            "attempts",
            "preemptions",
        ] {
            assert!(!j[key].is_null(), "{key} in {j:#}");
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    q.proc().kill9();
    // Some end while the queue is away; the master keeps their updates for it.
    std::thread::sleep(Duration::from_secs(3));
    q.start();
    let jobs = q.wait(&cluster, "every burst job ended", |j| {
        j.iter().all(|j| {
            j["state"] == "FINISHED" || j["state"] == "FAILED" || j["state"] == "CANCELLED"
        })
    });
    assert_eq!(jobs.len(), n, "{jobs:#?}");
    assert_eq!(count(&jobs, "FINISHED"), n, "{jobs:#?}");
    let mut lines = ledger(&book);
    lines.sort();
    let mut expected: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    expected.sort();
    assert_eq!(lines, expected, "each job ran exactly once");
    // One framework all along (failed over as the same id), and from the master's records no
    // job had a second worker that ran.
    let fws = queue_frameworks(&cluster);
    assert_eq!(fws.len(), 1, "{fws:#?}");
    let framework_id = fws[0]["id"].clone();
    let s = cluster.master.state().unwrap();
    let mut all = s["tasks"].as_array().cloned().unwrap_or_default();
    all.extend(s["completed_tasks"].as_array().cloned().unwrap_or_default());
    for i in 0..n {
        let name = format!("burst{i}/0");
        let ran: Vec<&Value> = all
            .iter()
            // DROPPED and ERROR records never ran (an accept the master refused: the master
            // keeps them for operators).
            .filter(|t| t["name"] == name.as_str())
            .filter(|t| !["LOST", "DROPPED", "ERROR"].contains(&t["state"].as_str().unwrap_or("")))
            .collect();
        assert_eq!(ran.len(), 1, "{name}: {ran:#?}");
        assert_eq!(ran[0]["state"], "FINISHED", "{name}: {ran:#?}");
    }

    // A job no agent can ever fit is refused at submission, with the reason (exit code 1).
    let out = Command::new(bin("gantry-queue").unwrap())
        .args([
            "submit", "--server", &q.url, "--name", "toobig", "--team", "nlp",
        ])
        .args(["--gpus", "8", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("400") && err.contains("needs 8 GPUs on one agent; largest is 4"),
        "{err}"
    );
    assert!(q.try_jobs().unwrap().iter().all(|j| j["name"] != "toobig"));

    // ---- 2. SIGTERM disconnects: the worker keeps running; the next serve takes it over. ----
    q.submit("term", &job(6));
    q.wait(&cluster, "term running", |j| {
        state_of(j, "term") == "RUNNING"
    });
    assert!(
        q.proc().terminate(Duration::from_secs(10)),
        "SIGTERM stops the queue"
    );
    let s = cluster
        .master
        .wait_state(Duration::from_secs(10), "the queue disconnected", |s| {
            s["frameworks"].as_array().is_some_and(|f| {
                f.iter()
                    .any(|f| f["name"] == "gantry-queue" && f["connected"] == false)
            })
        })
        .unwrap();
    let running = s["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == "term/0" && t["state"] == "RUNNING")
        .count();
    assert_eq!(running, 1, "the worker runs on without the queue: {s:#}");
    q.start();
    let jobs = q.wait(&cluster, "term finished", |j| {
        state_of(j, "term") == "FINISHED"
    });
    let term = jobs.iter().find(|j| j["name"] == "term").unwrap();
    let term_id = term["id"].to_string();
    assert_eq!(term["attempts"], 1, "{term:#}");
    assert_eq!(ledger(&book).iter().filter(|l| **l == term_id).count(), 1);
    assert_eq!(queue_frameworks(&cluster)[0]["id"], framework_id);

    // ---- 3. Retries and time limits. ----
    let flag = ledger_dir.join("flaky-ran");
    let flaky = format!(
        "if [ -e {f} ]; then exit 0; fi; touch {f}; exit 3",
        f = flag.display()
    );
    q.cli(&[
        "submit",
        "--name",
        "flaky",
        "--team",
        "nlp",
        "--gpus",
        "1",
        "--max-retries",
        "2",
        "--",
        &flaky,
    ])
    .unwrap();
    q.cli(&[
        "submit",
        "--name",
        "failing",
        "--team",
        "nlp",
        "--gpus",
        "1",
        "--max-retries",
        "1",
        "--",
        "exit 7",
    ])
    .unwrap();
    q.cli(&[
        "submit",
        "--name",
        "slow",
        "--team",
        "nlp",
        "--gpus",
        "1",
        "--time-limit",
        "3s",
        "--grace-secs",
        "1",
        "--",
        "sleep 300",
    ])
    .unwrap();
    let jobs = q.wait(&cluster, "flaky, failing and slow ended", |j| {
        ["flaky", "failing", "slow"]
            .iter()
            .all(|n| ["FINISHED", "FAILED"].contains(&state_of(j, n)))
    });
    let get = |name: &str| jobs.iter().find(|j| j["name"] == name).unwrap().clone();
    let flaky = get("flaky");
    assert_eq!(flaky["state"], "FINISHED", "{flaky:#}");
    assert_eq!(
        (flaky["retries"].as_u64(), flaky["attempts"].as_u64()),
        (Some(1), Some(2))
    );
    let failing = get("failing");
    assert_eq!(failing["state"], "FAILED", "{failing:#}");
    assert_eq!(failing["retries"], 1, "{failing:#}");
    let message = failing["message"].as_str().unwrap();
    assert!(
        message.contains("exited with code 7") && message.contains("after 1 retries"),
        "{failing:#}"
    );
    let slow = get("slow");
    assert_eq!(slow["state"], "FAILED", "{slow:#}");
    assert!(
        slow["message"].as_str().unwrap().starts_with("time-limit"),
        "{slow:#}"
    );
    assert_eq!(slow["retries"], 0, "{slow:#}");
    // Its worker was killed saying why (KillFor): the master's record reads `time-limit`.
    let deadline = Instant::now() + Duration::from_secs(20);
    let worker = loop {
        let s = cluster.master.state().unwrap();
        let found = ["tasks", "completed_tasks"]
            .iter()
            .filter_map(|k| s[*k].as_array())
            .flatten()
            .find(|t| t["name"] == "slow/0" && t["state"] == "KILLED")
            .cloned();
        if let Some(t) = found {
            break t;
        }
        assert!(Instant::now() < deadline, "slow/0 never KILLED: {s:#}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(worker["reason"], "time-limit", "{worker:#}");

    // ---- 4. shutdown tears the framework down. ----
    q.submit("long", "sleep 300");
    q.wait(&cluster, "long running", |j| {
        state_of(j, "long") == "RUNNING"
    });
    q.cli(&["shutdown"]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while q.proc().is_running() {
        assert!(Instant::now() < deadline, "serve exits after shutdown");
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster
        .master
        .wait_state(Duration::from_secs(15), "the framework torn down", |s| {
            s["frameworks"]
                .as_array()
                .is_some_and(|f| f.iter().all(|f| f["name"] != "gantry-queue"))
        })
        .unwrap();
    // Its worker is killed (after its grace period).
    cluster
        .master
        .wait_state(Duration::from_secs(30), "long/0 killed", |s| {
            s["completed_tasks"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|t| t["name"] == "long/0" && t["state"] == "KILLED")
            })
        })
        .unwrap();
    // A new serve on the store: a new framework; history as it was.
    q.start();
    let jobs = q.try_jobs().unwrap();
    assert_eq!(state_of(&jobs, "long"), "CANCELLED", "{jobs:#?}");
    assert_eq!(count(&jobs, "FINISHED"), n + 2, "{jobs:#?}");
    let fws = cluster
        .master
        .wait_state(Duration::from_secs(15), "a new framework", |s| {
            s["frameworks"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["name"] == "gantry-queue"))
        })
        .unwrap();
    let new_id = fws["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "gantry-queue")
        .map(|f| f["id"].clone())
        .unwrap();
    assert_ne!(new_id, framework_id);

    // ---- 5. The whole cluster counts, offered or not (the agent inventory, protocol 14). ----
    // With agent 1 deactivated, a queue started now is never offered it; the master's
    // inventory still tells it the agent is there, so a gang that needs both agents is
    // accepted (it would be refused as never fitting by a queue that knew only its offers)
    // and runs once the agent is back.
    let ctl = |args: &[&str]| {
        let out = cluster.master.gantryctl(args).unwrap();
        assert!(out.status.success(), "gantryctl {args:?}: {out:?}");
    };
    ctl(&["deactivate", &format!("{tag}1")]);
    q.proc().kill9();
    q.start();
    let deadline = Instant::now() + T;
    let stats = loop {
        let body = gantry_tests::http_get(q.addr, "/stats").unwrap();
        let stats: Value = serde_json::from_str(&body).unwrap();
        if stats["agents"] == AGENTS && stats["gpus"] == AGENTS * GPUS {
            break stats;
        }
        assert!(
            Instant::now() < deadline,
            "the queue counts every agent: {stats:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(stats["gpus"], AGENTS * GPUS, "{stats:#}");
    q.cli(&[
        "submit",
        "--name",
        "wide",
        "--team",
        "nlp",
        "--gpus",
        "4",
        "--workers",
        "2",
        "--",
        &job(1),
    ])
    .unwrap();
    let jobs = q.try_jobs().unwrap();
    assert_eq!(state_of(&jobs, "wide"), "PENDING", "{jobs:#?}");
    ctl(&["reactivate", &format!("{tag}1")]);
    q.wait(&cluster, "wide finished on both agents", |j| {
        state_of(j, "wide") == "FINISHED"
    });
    q.proc().terminate(Duration::from_secs(10));
    drop(roots);
}
