//! The autoscaler in a real cluster (issue 31): a master with no agents, `gantry-autoscaler`
//! with the local provider and an empty GPU pool (2 stand-in GPUs per node), and the example
//! batch framework declaring 4 one-GPU tasks. The master's `GET /api/v1/demand` shows them
//! unplaceable; the autoscaler starts exactly the 2 nodes they need; the tasks finish; the idle
//! nodes are drained and deleted after the pool's cooldown; the reported cost is the reported
//! node-seconds × price, and those node-seconds cover what the master saw of the nodes; the
//! framework is charged its tasks' share of the nodes from the master's records (`/metrics`
//! says the same).
//! Then a spot notice (`gantry-agent notice-termination`) on a busy node of the spot pool
//! running a `gantry-queue` job that checkpoints: the node is drained and deleted, the
//! interruption counted, and its capacity replaced in the on-demand fallback pool
//! (`spot_failures_before_fallback = 1`); the job, killed at the notice's deadline, is requeued
//! without counting as a failure and finishes on the replacement from its checkpoint
//! (`GANTRY_QUEUE_CHECKPOINT_DIR`); the fallback pool scales down again. The queue charged
//! team ml its workers' share of each node's price for the time they held them, from launch
//! (the master's records say the same within 1%), and its budget, now spent, holds the team's
//! next submission. Last, consolidation:
//! two half-busy nodes, one drained because its task fits the other, its task moved by the
//! framework, the node deleted. Then a model-constrained demand: a queue job asking for an H100
//! is declared with its model, unplaceable on the A100 pool, and grows the H100 pool alone.
//!
//! One test in this binary: the local provider's agents share the host's cgroups and ports.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use gantry_examples::batch::{Batch, BatchSpec};
use gantry_sdk::protocol::{Capability, CommandInfo};
use gantry_tests::{
    bin, cgroups_available, free_tcp, http_get, register_http, running_tasks, Cluster, Proc,
};

const PRICE: f64 = 36.0;
const OD_PRICE: f64 = 72.0;
const POOL: &str = "gpu";

fn pools_toml() -> String {
    format!(
        r#"
[autoscaler]
interval = "300ms"
spot_failures_before_fallback = 1

[[pool]]
name = "{POOL}"
cpus = 2
mem = 2048
gpus = 2
gpu_model = "NVIDIA A100-SXM4-40GB"
price_per_hour = {PRICE}
spot = true
fallback = "gpu-od"
min = 0
max = 3
scale_down_cooldown = "3s"
provider = {{ kind = "local" }}

[[pool]]
name = "gpu-od"
cpus = 2
mem = 2048
gpus = 2
gpu_model = "NVIDIA A100-SXM4-40GB"
price_per_hour = {OD_PRICE}
min = 0
max = 2
scale_down_cooldown = "3s"
provider = {{ kind = "local" }}
"#
    )
}

fn read_status(path: &std::path::Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// When the master saw each agent connected (first and last poll, and the first as Unix ms).
type Seen = BTreeMap<String, (Instant, Instant, u64)>;

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Polls the master's `/state` and the autoscaler's report every 100 ms until `done(report)`:
/// when each agent was seen connected, the most nodes of the first pool, and the last report.
fn watch(
    master: std::net::SocketAddr,
    status: std::path::PathBuf,
    done: impl Fn(&serde_json::Value) -> bool,
) -> Result<(Seen, u64, serde_json::Value), String> {
    let mut connected = Seen::new();
    let mut most_nodes = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = Instant::now();
        if let Ok(body) = http_get(master, "/state") {
            let s: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            for a in s["agents"].as_array().into_iter().flatten() {
                if a["connected"] == true {
                    let name = a["name"].as_str().unwrap_or("").to_string();
                    connected.entry(name).or_insert((now, now, unix_ms())).1 = now;
                }
            }
        }
        if let Some(r) = read_status(&status) {
            most_nodes = most_nodes.max(r["pools"][0]["nodes"].as_u64().unwrap_or(0));
            if done(&r) {
                return Ok((connected, most_nodes, r));
            }
        }
        if now > deadline {
            return Err(format!(
                "not done in 120 s; last report: {:?}",
                read_status(&status)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`watch`] in a blocking task until pool `pool` has made a node and has none again.
fn watch_pool_emptied(
    master: std::net::SocketAddr,
    status: &std::path::Path,
    pool: usize,
) -> tokio::task::JoinHandle<Result<(Seen, u64, serde_json::Value), String>> {
    let status = status.to_path_buf();
    tokio::task::spawn_blocking(move || {
        watch(master, status, |r| {
            r["pools"][pool]["nodes_created"].as_u64() > Some(0) && r["pools"][pool]["nodes"] == 0
        })
    })
}

fn seconds(seen: &Seen) -> f64 {
    seen.values()
        .map(|(a, b, _)| b.duration_since(*a).as_secs_f64())
        .sum()
}

/// `gantry-autoscaler run` with `pools` (the harness's command), its report in `status`.
fn autoscaler_cmd(cluster: &Cluster, pools: &std::path::Path, status: &std::path::Path) -> Command {
    gantry_tests::frameworks::autoscaler_command(cluster, pools, status)
}

/// The example batch framework `name` with `count` tasks of one GPU running `command`.
fn gpu_batch(
    cluster: &Cluster,
    name: &str,
    count: u32,
    command: &str,
) -> (
    tokio::task::JoinHandle<Result<(), gantry_sdk::scheduler::DriverError>>,
    tokio::sync::watch::Receiver<gantry_examples::batch::BatchProgress>,
) {
    let spec = BatchSpec {
        name: name.into(),
        command: CommandInfo::shell(command),
        count,
        task: "cpus:0.5;mem:64;gpus:1".parse().unwrap(),
        env: Default::default(),
        verbose: false,
        gpu_selector: None,
    };
    let (batch, progress) = Batch::new(spec);
    let mut config = cluster.driver_config(name, &["gpu"]);
    config.info.capabilities = vec![Capability::GpuResources];
    let driver = tokio::spawn(async move { gantry_sdk::Driver::new(config).run(batch).await });
    (driver, progress)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_gpu_pool_scales_up_for_demand_down_when_idle_and_replaces_spot_capacity() {
    if !cgroups_available("autoscaler") {
        return;
    }
    let cluster = Cluster::start_with(&[], &[], &[]).unwrap();
    let dir = cluster.dir.path().to_path_buf();
    let pools = dir.join("pools.toml");
    std::fs::write(&pools, pools_toml()).unwrap();
    let status = dir.join("autoscaler-status.json");

    // The framework first: with no agents its whole demand is unplaceable.
    let (driver, progress) = gpu_batch(&cluster, "gpu-batch", 4, "sleep 2");
    let http = cluster.master.http;
    let demand = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v: serde_json::Value =
                serde_json::from_str(&http_get(http, "/api/v1/demand").unwrap()).unwrap();
            if v["unplaceable_tasks"] == 4 || Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
    assert_eq!(demand["unplaceable_tasks"], 4, "{demand:#}");
    assert_eq!(demand["agents"], 0, "{demand:#}");
    assert_eq!(demand["frameworks"][0]["name"], "gpu-batch", "{demand:#}");

    // The autoscaler, as the dev operator `admin`, with its report for Prometheus.
    let metrics = free_tcp();
    register_http(metrics, &cluster.tls_dir, true);
    let mut cmd = autoscaler_cmd(&cluster, &pools, &status);
    cmd.arg("--metrics-listen").arg(metrics.to_string());
    let log = dir.join("autoscaler.log");
    let mut autoscaler = Proc::spawn("gantry-autoscaler", cmd, &log).unwrap();

    // Watch the master and the report until the pool is empty again after the work.
    let watcher = watch_pool_emptied(http, &status, 0);

    let outcome = tokio::time::timeout(Duration::from_secs(90), driver).await;
    let p = progress.borrow().clone();
    let watched = watcher.await.unwrap();
    let logs = || {
        cluster.dump_logs();
        eprintln!(
            "---- autoscaler log ----\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    let (connected, most_nodes, report) = match (outcome, watched) {
        (Ok(Ok(Ok(()))), Ok(w)) => w,
        (o, w) => {
            logs();
            panic!("batch: {o:?}; progress {p:?}; watch: {:?}", w.map(|w| w.2));
        }
    };
    assert_eq!(p.finished, 4, "{p:?}");

    // Exactly the nodes the demand needed: 4 one-GPU tasks on 2-GPU nodes.
    let pool = &report["pools"][0];
    assert_eq!(pool["nodes_created"], 2, "{report:#}");
    assert_eq!(most_nodes, 2, "{report:#}");
    assert_eq!(pool["scale_downs"], 2, "{report:#}");
    assert_eq!(connected.len(), 2, "{connected:?}");
    assert!(report["unfittable"].as_array().unwrap().is_empty());

    // The nodes are gone from the master (marked gone after their agents stopped).
    let s = cluster.master.state().unwrap();
    let still: Vec<&serde_json::Value> = s["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["connected"] == true)
        .collect();
    assert!(still.is_empty(), "{still:?}");

    // Cost: node-seconds × price, within 1%; and the node-seconds cover the time the master
    // saw the nodes connected (they are billed from creation, before registering, to
    // deletion, after disconnecting), with at most 10 s per node of start and stop around it.
    let node_seconds = pool["node_seconds"].as_f64().unwrap();
    let cost = pool["cost"].as_f64().unwrap();
    let expected = node_seconds * PRICE / 3600.0;
    assert!(
        (cost - expected).abs() <= 0.01 * expected,
        "cost {cost} vs {expected}"
    );
    assert!(
        (report["total_cost"].as_f64().unwrap() - cost).abs() < 1e-9,
        "{report:#}"
    );
    let seen = seconds(&connected);
    assert!(
        node_seconds >= seen && node_seconds <= seen + 20.0,
        "billed {node_seconds} s, connected {seen} s: {connected:?}"
    );
    // Cost per framework: each task pays its dominant share of its node (1 of 2 GPUs: half)
    // from when the master staged it to its end, from the master's own records, within 1%;
    // what the pool's tasks paid and its idle cost add up to its cost.
    let page: serde_json::Value = serde_json::from_str(
        &http_get(http, "/api/v1/tasks?framework=gpu-batch&limit=100").unwrap(),
    )
    .unwrap();
    let held_ms: u64 = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ended_at_ms"].as_u64().unwrap() - t["staged_at_ms"].as_u64().unwrap())
        .sum();
    let expected_fw = held_ms as f64 / 3_600_000.0 * PRICE * 0.5;
    let fw = report["costs"]["by_framework"]["gpu-batch"]
        .as_f64()
        .unwrap();
    assert!(
        (fw - expected_fw).abs() <= 0.01 * expected_fw,
        "gpu-batch charged {fw}, its tasks held {held_ms} ms of half a node: {expected_fw}: {report:#}"
    );
    let (task_cost, idle_cost) = (
        pool["task_cost"].as_f64().unwrap(),
        pool["idle_cost"].as_f64().unwrap(),
    );
    assert!((task_cost - fw).abs() < 1e-9, "{report:#}");
    assert!(
        idle_cost >= 0.0 && (task_cost + idle_cost - cost).abs() < 1e-9,
        "{report:#}"
    );
    let text = http_get(metrics, "/metrics").unwrap();
    let scraped = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("gantry_autoscaler_cost_by_framework_total{framework=\"gpu-batch\"} ")
        })
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        scraped.is_some_and(|v| (v - fw).abs() <= 0.01 * fw),
        "/metrics: {scraped:?} vs {fw}:\n{text}"
    );
    // A figure, not an assertion: the first task RUNNING after the first node registered.
    let first_node = connected.values().map(|c| c.2).min().unwrap_or(0);
    let first_task = s["completed_tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["started_at_ms"].as_u64())
        .min()
        .unwrap_or(0);
    eprintln!(
        "autoscaler: 2 nodes, {node_seconds:.1} node-seconds billed ({seen:.1} s connected), \
         cost {cost:.4} at {PRICE}/h; first task running {} ms after the first node was seen \
         registered (100 ms polls)",
        first_task as i64 - first_node as i64
    );

    // A spot notice on a busy node: a queue job that checkpoints and a batch task on one new
    // spot node, then the notice. Only the queue's demand (`--declare-demand`: its pending
    // job's worker shape) grows the empty pool: the job runs on the new node, and then the
    // batch task takes the node's other GPU.
    let ckpt = dir.join("checkpoints");
    std::fs::create_dir(&ckpt).unwrap();
    std::fs::set_permissions(&ckpt, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let queue_api = free_tcp();
    let mut qcmd = Command::new(bin("gantry-queue").unwrap());
    qcmd.args([
        "serve",
        "--master",
        &cluster.master.quic.to_string(),
        "--tls-dir",
    ])
    .arg(&cluster.tls_dir)
    .arg("--store")
    .arg(dir.join("queue.redb"))
    .arg("--checkpoint-root")
    .arg(&ckpt)
    .args([
        "--listen",
        &queue_api.to_string(),
        "--team",
        "ml=1",
        "--team",
        "vision=1",
    ])
    .arg("--declare-demand")
    // The cluster grows: a job no node fits yet waits for one.
    .arg("--elastic")
    // Team ml's budget: less than the job will cost (see the end of this phase).
    .args(["--team-budget", "ml=0.02"]);
    let _queue = Proc::spawn("gantry-queue", qcmd, &dir.join("gantry-queue.log")).unwrap();
    register_http(queue_api, &cluster.tls_dir, true);
    let queue_url = format!("http://{queue_api}");
    let queue = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new(bin("gantry-queue")?)
            .arg(args[0])
            .args(["--server", &queue_url])
            .args(&args[1..])
            .output()?;
        anyhow::ensure!(out.status.success(), "gantry-queue {args:?}: {out:?}");
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let up = Instant::now() + Duration::from_secs(30);
    while queue(&["list", "--json"]).is_err() {
        assert!(
            Instant::now() < up,
            "gantry-queue API did not come up: {:?}\n{}",
            queue(&["list", "--json"]),
            std::fs::read_to_string(dir.join("gantry-queue.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // 40 steps of 0.25 s; each attempt resumes from the step its checkpoint holds.
    let steps = r#"d=$GANTRY_QUEUE_CHECKPOINT_DIR; n=$(cat "$d/step" 2>/dev/null || echo 0)
echo "start $n" >> "$d/attempts"
while [ "$n" -lt 40 ]; do n=$((n+1)); echo "$n" > "$d/step.new"; mv "$d/step.new" "$d/step"; sleep 0.25; done
echo "done $n" > "$d/result""#;
    let job: u64 = queue(&[
        "submit",
        "--name",
        "resumable",
        "--team",
        "ml",
        "--gpus",
        "1",
        "--cpus",
        "0.5",
        "--mem",
        "64",
        "--grace-secs",
        "2",
        "--",
        steps,
    ])
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    // The queue's demand alone makes a spot node (the third), and the job runs there.
    let running =
        cluster
            .master
            .wait_state(Duration::from_secs(60), "the queue's job running", |s| {
                running_tasks(s) == 1
            });
    let Ok(running) = running else {
        logs();
        panic!("{running:?}");
    };
    let report = read_status(&status).unwrap();
    assert_eq!(report["pools"][0]["nodes_created"], 3, "{report:#}");
    assert_eq!(report["pools"][1]["nodes_created"], 0, "{report:#}");
    let on = running["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["state"] == "RUNNING")
        .unwrap();
    assert_eq!(on["name"], "resumable/0", "{running:#}");
    let (driver, _progress) = gpu_batch(&cluster, "spot-batch", 1, "sleep 8");
    let busy = cluster
        .master
        .wait_state(Duration::from_secs(60), "2 tasks running", |s| {
            running_tasks(s) == 2
        });
    let Ok(busy) = busy else {
        logs();
        panic!("{busy:?}");
    };
    let node = busy["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "resumable/0")
        .and_then(|t| t["agent_id"].as_str())
        .unwrap_or_else(|| panic!("the queue's job is not running: {busy:#}"))
        .to_string();
    let noticed_agent = node.clone();
    let node = busy["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == node.as_str())
        .and_then(|a| a["name"].as_str())
        .unwrap()
        .to_string();
    assert!(node.starts_with("gpu-"), "{node}");
    let out = Command::new(bin("gantry-agent").unwrap())
        .args(["notice-termination", "--in", "3s", "--work-dir"])
        .arg(dir.join("nodes").join(&node).join("agent"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let status_path = status.clone();
    let watched = tokio::task::spawn_blocking(move || {
        watch(http, status_path, |r| {
            r["pools"][0]["interruptions"] == 1
                && r["pools"][1]["nodes_created"] == 1
                && r["pools"][0]["nodes"] == 0
                && r["pools"][1]["nodes"] == 0
        })
    })
    .await
    .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), driver).await;
    // The queue's job was killed at the notice's deadline (the drain's, not a failure),
    // requeued, and finished on the replacement node from its checkpoint.
    let shown: serde_json::Value =
        serde_json::from_str(&queue(&["show", &job.to_string(), "--json"]).unwrap()).unwrap();
    let job_dir = ckpt.join(format!("job-{job}"));
    let attempts = std::fs::read_to_string(job_dir.join("attempts")).unwrap_or_default();
    let starts: Vec<u32> = attempts
        .lines()
        .filter_map(|l| l.strip_prefix("start ")?.parse().ok())
        .collect();
    assert_eq!(shown["state"], "FINISHED", "{shown:#}");
    assert_eq!(shown["attempts"], 2, "{shown:#}");
    assert!(
        starts.len() == 2 && starts[0] == 0 && starts[1] > 0,
        "attempts started at steps {starts:?}"
    );
    assert_eq!(
        std::fs::read_to_string(job_dir.join("result"))
            .unwrap_or_default()
            .trim(),
        "done 40"
    );
    let records: serde_json::Value = serde_json::from_str(
        &http_get(http, "/api/v1/tasks?framework=gantry-queue&limit=10").unwrap(),
    )
    .unwrap();
    // (The nodes' agents are gone from the master now: their ids, not names.)
    let ran_on: Vec<(&str, &str)> = records["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["agent_id"].as_str().unwrap_or(""),
                t["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(
        ran_on.len() == 2
            && ran_on.contains(&(noticed_agent.as_str(), "drain-deadline"))
            && ran_on.iter().any(|(a, _)| *a != noticed_agent),
        "{ran_on:?}"
    );
    // Cost per team: the queue charged team ml its workers' share of their nodes (1 of 2
    // GPUs: half) for the time they held them (from their launch, staging included, as the
    // master charges a task), at each node's price (the spot node, then the on-demand
    // replacement), within 1% of the master's own records.
    let expected_team: f64 = records["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let ran = t["ended_at_ms"].as_u64().unwrap() - t["staged_at_ms"].as_u64().unwrap();
            let price = if t["agent_id"] == noticed_agent.as_str() {
                PRICE
            } else {
                OD_PRICE
            };
            ran as f64 / 3_600_000.0 * price * 0.5
        })
        .sum();
    let usage: serde_json::Value =
        serde_json::from_str(&queue(&["usage", "--since", "1h", "--json"]).unwrap()).unwrap();
    let team_cost = usage[0]["cost"].as_f64().unwrap_or(-1.0);
    assert!(
        usage[0]["team"] == "ml" && (team_cost - expected_team).abs() <= 0.01 * expected_team,
        "team ml charged {team_cost}, its workers ran for {expected_team}: {usage:#} {records:#}"
    );
    // Its budget (0.02) is spent: the next submission is held with the reason, nothing
    // else changes.
    let table = queue(&["usage", "--since", "1h"]).unwrap();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("ml ") && l.trim_end().ends_with("over")),
        "{table}"
    );
    let held = Command::new(bin("gantry-queue").unwrap())
        .args([
            "submit", "--server", &queue_url, "--name", "more", "--team", "ml",
        ])
        .args(["--gpus", "1", "--", "true"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&held.stderr);
    assert!(
        held.status.code() == Some(4) && said.contains("over its budget"),
        "{held:?}"
    );
    let jobs: serde_json::Value =
        serde_json::from_str(&queue(&["list", "--json"]).unwrap()).unwrap();
    assert_eq!(jobs.as_array().map(Vec::len), Some(1), "{jobs:#}");
    let stopped = autoscaler.terminate(Duration::from_secs(20));
    let Ok((seen2, _, report)) = watched else {
        logs();
        panic!("spot phase: {watched:?}; batch: {ended:?}");
    };
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    assert!(stopped, "the autoscaler did not stop on SIGTERM");
    let (spot, od) = (&report["pools"][0], &report["pools"][1]);
    // The spot pool made one more node, was interrupted once; the fallback replaced it.
    assert_eq!(spot["nodes_created"], 3, "{report:#}");
    assert_eq!(spot["interruptions"], 1, "{report:#}");
    assert_eq!(od["interruptions"], 0, "{report:#}");
    assert_eq!(od["nodes_created"], 1, "{report:#}");
    assert!(seen2.keys().any(|n| n.starts_with("gpu-od-")), "{seen2:?}");
    for (pool, price) in [(spot, PRICE), (od, OD_PRICE)] {
        let ns = pool["node_seconds"].as_f64().unwrap();
        let cost = pool["cost"].as_f64().unwrap();
        assert!(
            (cost - ns * price / 3600.0).abs() <= 0.01 * ns * price / 3600.0,
            "{report:#}"
        );
    }
    let total = spot["cost"].as_f64().unwrap() + od["cost"].as_f64().unwrap();
    assert!((report["total_cost"].as_f64().unwrap() - total).abs() < 1e-9);

    // Consolidation, with a second autoscaler (consolidation on, a one-second delay and drain
    // deadline): 4 one-GPU tasks on two 2-GPU nodes, the first to start on each node long, the
    // other short. Once the short ones ended, each node's long task fits the other node: one
    // node is drained, its task killed at the deadline and run again on the other node by the
    // framework, and the drained node deleted, while the other stays until its work is done.
    let pools = dir.join("pools-consolidate.toml");
    std::fs::write(
        &pools,
        format!(
            r#"
[autoscaler]
interval = "300ms"
consolidation = true
consolidation_delay = "1s"
consolidation_deadline = "1s"

[[pool]]
name = "pack"
cpus = 2
mem = 2048
gpus = 2
gpu_model = "NVIDIA A100-SXM4-40GB"
price_per_hour = {PRICE}
max = 3
scale_down_cooldown = "3s"
provider = {{ kind = "local" }}

[[pool]]
name = "h100"
cpus = 2
mem = 2048
gpus = 1
gpu_model = "NVIDIA H100 80GB HBM3"
price_per_hour = {OD_PRICE}
max = 2
scale_down_cooldown = "2s"
provider = {{ kind = "local" }}
"#
        ),
    )
    .unwrap();
    let status = dir.join("autoscaler-status-2.json");
    let cmd = autoscaler_cmd(&cluster, &pools, &status);
    let mut packer = Proc::spawn("gantry-autoscaler", cmd, &dir.join("autoscaler-2.log")).unwrap();
    let locks = dir.join("locks");
    std::fs::create_dir(&locks).unwrap();
    std::fs::set_permissions(&locks, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    // The node is the sandbox's great-grandparent: NODES/NODE/agent/sandboxes/TASK.
    let command = format!(
        r#"node=$(basename "$(dirname "$(dirname "$(dirname "$GANTRY_SANDBOX")")")")
if mkdir "{}/$node" 2>/dev/null; then sleep 8; else sleep 2; fi"#,
        locks.display()
    );
    let (driver, progress) = gpu_batch(&cluster, "pack-batch", 4, &command);
    let watched = watch_pool_emptied(http, &status, 0).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), driver).await;
    let Ok((_, _, report)) = watched else {
        logs();
        panic!("consolidation: {watched:?}; batch: {ended:?}");
    };
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    assert_eq!(progress.borrow().finished, 4, "{:?}", progress.borrow());
    let pool = &report["pools"][0];
    assert_eq!(pool["nodes_created"], 2, "{report:#}");
    assert_eq!(pool["consolidations"], 1, "{report:#}");
    assert_eq!(pool["scale_downs"], 1, "{report:#}");
    let page: serde_json::Value = serde_json::from_str(
        &http_get(http, "/api/v1/tasks?framework=pack-batch&limit=100").unwrap(),
    )
    .unwrap();
    let moved = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["reason"] == "drain-deadline")
        .count();
    assert_eq!(moved, 1, "{page:#}");
    assert_eq!(report["pools"][1]["nodes_created"], 0, "{report:#}");

    // A model-constrained demand, end to end: a queue job that asks for an H100
    // (`--gpu-model H100`) is declared with its model (protocol 11), the master places that
    // demand only on H100s (none yet: unplaceable, and the demand says which model), and the
    // autoscaler grows the H100 pool, not the cheaper A100 pool that has room for a GPU task
    // of any model; the job runs on the new H100 node, which is deleted once idle.
    let ran_on = locks.join("on-h100");
    let command = format!(
        r#"basename "$(dirname "$(dirname "$(dirname "$GANTRY_SANDBOX")")")" > {}; sleep 1"#,
        ran_on.display()
    );
    let job: u64 = queue(&[
        "submit",
        "--name",
        "on-h100",
        "--team",
        "vision",
        "--gpus",
        "1",
        "--cpus",
        "0.5",
        "--mem",
        "64",
        "--gpu-model",
        "H100",
        "--",
        &command,
    ])
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    let demand = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v: serde_json::Value =
                serde_json::from_str(&http_get(http, "/api/v1/demand").unwrap()).unwrap();
            let found = v["frameworks"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|f| f["gpu_model"] == "H100");
            if found || Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
    let declared = demand["frameworks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["gpu_model"] == "H100")
        .unwrap_or_else(|| panic!("no H100 demand: {demand:#}"));
    assert_eq!(declared["name"], "gantry-queue", "{demand:#}");
    let watched = watch_pool_emptied(http, &status, 1).await.unwrap();
    assert!(packer.terminate(Duration::from_secs(20)));
    let Ok((_, _, report)) = watched else {
        logs();
        panic!("model-constrained demand: {watched:?}");
    };
    let shown: serde_json::Value =
        serde_json::from_str(&queue(&["show", &job.to_string(), "--json"]).unwrap()).unwrap();
    assert_eq!(shown["state"], "FINISHED", "{shown:#}");
    assert_eq!(report["pools"][1]["nodes_created"], 1, "{report:#}");
    assert_eq!(report["pools"][0]["nodes_created"], 2, "{report:#}");
    let node = std::fs::read_to_string(&ran_on).unwrap_or_default();
    assert!(node.starts_with("h100-"), "the job ran on {node:?}");
    // Every node was deleted and its agent marked gone: the master told the queue
    // (`AgentRemoved`, protocol 13), which no longer counts any of them as GPUs that fit.
    let stats: serde_json::Value =
        serde_json::from_str(&http_get(queue_api, "/stats").unwrap()).unwrap();
    assert_eq!(
        (&stats["agents"], &stats["gpus"]),
        (&0.into(), &0.into()),
        "{stats:#}"
    );

    // No agent left behind.
    assert!(
        std::fs::read_dir(dir.join("nodes"))
            .unwrap()
            .flatten()
            .all(|e| e.path().extension().is_some_and(|x| x == "log")),
        "node directories left"
    );
}
