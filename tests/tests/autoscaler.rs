//! The autoscaler in a real cluster (issue 31): a master with no agents, `gantry-autoscaler`
//! with the local provider and an empty GPU pool (2 stand-in GPUs per node), and the example
//! batch framework declaring 4 one-GPU tasks. The master's `GET /api/v1/demand` shows them
//! unplaceable; the autoscaler starts exactly the 2 nodes they need; the tasks finish; the idle
//! nodes are drained and deleted after the pool's cooldown; the reported cost is the reported
//! node-seconds × price, and those node-seconds cover what the master saw of the nodes.
//! Then a spot notice (`gantry-agent notice-termination`) on a busy node of the spot pool:
//! the node is drained and deleted, the interruption counted, and its capacity replaced in the
//! on-demand fallback pool (`spot_failures_before_fallback = 1`), which scales down again.
//!
//! One test in this binary: the local provider's agents share the host's cgroups and ports.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use gantry_examples::batch::{Batch, BatchSpec};
use gantry_sdk::protocol::{Capability, CommandInfo};
use gantry_tests::{bin, cgroups_available, http_get, running_tasks, standin_lib, Cluster, Proc};

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

fn seconds(seen: &Seen) -> f64 {
    seen.values()
        .map(|(a, b, _)| b.duration_since(*a).as_secs_f64())
        .sum()
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

    // The autoscaler, as the dev operator `admin`.
    let mut cmd = Command::new(bin("gantry-autoscaler").unwrap());
    cmd.arg("run")
        .arg("--config")
        .arg(&pools)
        .arg("--master")
        .arg(format!("https://{}", cluster.master.http))
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .arg("--operator")
        .arg("admin")
        .arg("--status-file")
        .arg(&status)
        .arg("--local-master")
        .arg(cluster.master.quic.to_string())
        .arg("--local-work-dir")
        .arg(dir.join("nodes"))
        .arg("--local-agent-bin")
        .arg(bin("gantry-agent").unwrap())
        .arg("--local-nvml-lib")
        .arg(standin_lib());
    // Agents on one host: no host ports each (ranges would overlap); keep every sandbox.
    for a in ["--ports", "none", "--gc-disk-headroom", "0"] {
        cmd.arg(format!("--local-agent-arg={a}"));
    }
    let log = dir.join("autoscaler.log");
    let mut autoscaler = Proc::spawn("gantry-autoscaler", cmd, &log).unwrap();

    // Watch the master and the report until the pool is empty again after the work.
    let status_path = status.clone();
    let watcher = tokio::task::spawn_blocking(move || {
        watch(http, status_path, |r| {
            r["pools"][0]["nodes_created"].as_u64() > Some(0) && r["pools"][0]["nodes"] == 0
        })
    });

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

    // A spot notice on a busy node: 2 long tasks on one new spot node, then the notice.
    let (driver, _progress) = gpu_batch(&cluster, "spot-batch", 2, "sleep 60");
    let busy = cluster
        .master
        .wait_state(Duration::from_secs(60), "2 tasks running", |s| {
            running_tasks(s) == 2
        });
    let Ok(busy) = busy else {
        logs();
        panic!("{busy:?}");
    };
    let node = busy["tasks"][0]["agent_id"].as_str().unwrap().to_string();
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

    // No agent left behind.
    assert!(
        std::fs::read_dir(dir.join("nodes"))
            .unwrap()
            .flatten()
            .all(|e| e.path().extension().is_some_and(|x| x == "log")),
        "node directories left"
    );
}
