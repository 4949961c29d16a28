//! Issue 14 item 1: Prometheus metrics on a real cluster, scraped by a real Prometheus server.
//!
//! A master, a GPU agent (stand-in NVML, 4 GPUs, real cgroups) and a CPU agent, each agent with
//! `--metrics-listen`; two frameworks in two roles each run one long task (a 1-GPU task in `ml`,
//! a CPU task in `web`) and then suppress offers. Prometheus (the Debian `prometheus` binary,
//! on a free port) scrapes the master over HTTPS with the dev operator certificate and both
//! agents over HTTP, and loads `docs/prometheus-rules.yml` (also checked by `promtool`). Through
//! Prometheus's query API the test checks that task counts and dominant shares equal `/state`,
//! that the GPU series of the task's GPU carries its `task` and `framework` labels and the
//! stand-in's utilization, that per-task memory is measured, that GPU-seconds accrue for the
//! role, and that the quota set through the API shows; a critical XID shows in the XID and
//! health series and fires the example `GantryGpuUnhealthy` alert. `/metrics` without
//! credentials is 401. A killed task leaves the agent's series; the quota and the running task show again after a
//! master restart. Agents carry prices (`--price-per-hour`, and the attribute): the usage
//! counters (`gantry_usage_*_total`) agree with `/api/v1/usage` within 1%, before and after
//! the restart.
//!
//! One test in this binary: the stand-in's configuration path is a process-wide variable.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gantry_master::client::{BlockingClient, ClientConfig, Credentials};
use gantry_sdk::protocol::{Capability, TaskState};
use gantry_tests::{
    cgroups_available, free_tcp, operator_client, standin_lib, start_recorder, state_task, task,
    AgentProc, CgroupRoot, Cluster, Proc, Standin, TempDir,
};

const T: Duration = Duration::from_secs(60);

/// Percent-encodes a PromQL query for a URL query string.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server's HTTP API.
struct Prometheus {
    _proc: Proc,
    client: BlockingClient,
    log: std::path::PathBuf,
}

impl Prometheus {
    /// The result vector of an instant query (empty when Prometheus cannot answer yet).
    fn query(&self, q: &str) -> Vec<serde_json::Value> {
        let Ok(body) = self
            .client
            .get(&format!("/api/v1/query?query={}", encode(q)))
        else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The single value of an instant query, if it has exactly one series.
    fn value(&self, q: &str) -> Option<f64> {
        match self.query(q).as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// Polls until `check` returns `Some`; panics with `what` and the Prometheus log after `T`.
    fn wait<R>(&self, what: &str, mut check: impl FnMut(&Self) -> Option<R>) -> R {
        let deadline = Instant::now() + T;
        loop {
            if let Some(r) = check(self) {
                return r;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let targets = self.client.get("/api/v1/targets").unwrap_or_default();
                panic!("timed out waiting for {what}\ntargets: {targets}\nprometheus log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Writes the Prometheus configuration and starts the server on a free port.
fn start_prometheus(
    dir: &Path,
    tls_dir: &Path,
    master: std::net::SocketAddr,
    agents: &[std::net::SocketAddr],
    rules: &Path,
) -> Prometheus {
    let addr = free_tcp();
    let targets: Vec<String> = agents.iter().map(|a| format!("\"{a}\"")).collect();
    let config = format!(
        r#"global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - "{rules}"
scrape_configs:
  - job_name: gantry-master
    scheme: https
    tls_config:
      ca_file: "{tls}/ca.pem"
      cert_file: "{tls}/operator-admin.pem"
      key_file: "{tls}/operator-admin.key"
    static_configs:
      - targets: ["{master}"]
  - job_name: gantry-agent
    static_configs:
      - targets: [{agents}]
"#,
        rules = rules.display(),
        tls = tls_dir.display(),
        agents = targets.join(", "),
    );
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, config).unwrap();
    let check = Command::new("promtool")
        .arg("check")
        .arg("config")
        .arg(&path)
        .output()
        .expect("promtool (Debian package prometheus; scripts/setup-deps.sh installs it)");
    assert!(
        check.status.success(),
        "promtool check config: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!("--config.file={}", path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("prometheus-data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .arg("--log.level=info");
    let log = dir.join("prometheus.log");
    let proc = Proc::spawn("prometheus", cmd, &log)
        .expect("prometheus (Debian package prometheus; scripts/setup-deps.sh installs it)");
    let client = BlockingClient::new(&ClientConfig {
        master: format!("http://{addr}"),
        tls_dir: None,
        credentials: Credentials::None,
        timeout: Duration::from_secs(10),
    })
    .unwrap();
    let p = Prometheus {
        _proc: proc,
        client,
        log,
    };
    p.wait("Prometheus to be ready", |p| p.client.get("/-/ready").ok());
    p
}

/// Issue 30 item 5, issue 31 item 6: per role, each scraped `gantry_usage_*_total` counter
/// equals what `/api/v1/usage` reports up to the time of its scrape (within 1%); the `ml` task
/// pays `ml_cost_per_hour` where given (its dominant share of the GPU agent's price), and the GPU agent's
/// price shows with its idle cost.
fn usage_agrees_with_the_counters(
    prom: &Prometheus,
    operator: &BlockingClient,
    ml_cost_per_hour: Option<f64>,
) {
    let within = |a: f64, b: f64| (a - b).abs() <= 0.01 * a.abs().max(b.abs()).max(1e-6);
    // Series' values from one scrape, and its time (Unix ms).
    let scraped = |what: &str, qs: &[&str]| -> (Vec<f64>, u64) {
        prom.wait(what, |p| {
            let at = |q: &str| p.value(&format!("timestamp({q})"));
            let before = at(qs[0])?;
            let values: Option<Vec<f64>> = qs.iter().map(|q| p.value(q)).collect();
            let same = qs.iter().all(|q| at(q) == Some(before));
            same.then_some((values?, (before * 1000.0).round() as u64))
        })
    };
    let usage = |until_ms: u64| -> serde_json::Value {
        let body = operator
            .get(&format!("/api/v1/usage?since=0&until={until_ms}&by=role"))
            .unwrap();
        serde_json::from_str(&body).unwrap()
    };
    let row = |v: &serde_json::Value, role: &str| -> serde_json::Value {
        v["rows"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["key"] == role).cloned())
            .unwrap_or_else(|| panic!("no {role} in {v:#}"))
    };
    // Some seconds of one GPU in ml.
    prom.wait("GPU-seconds of ml", |p| {
        p.value("gantry_usage_gpu_seconds_total{role=\"ml\"}")
            .filter(|v| *v > 3.0)
    });
    let (ml, at) = scraped(
        "ml's GPU-seconds and cost",
        &[
            "gantry_usage_gpu_seconds_total{role=\"ml\"}",
            "gantry_usage_cost_total{role=\"ml\"}",
        ],
    );
    let (gpu_s, cost) = (ml[0], ml[1]);
    let v = usage(at);
    let api = row(&v, "ml")["gpu_hours"].as_f64().unwrap() * 3600.0;
    assert!(within(gpu_s, api), "GPU-seconds {gpu_s} vs {api}: {v:#}");
    let api = row(&v, "ml")["cost"].as_f64().unwrap();
    assert!(within(cost, api), "cost {cost} vs {api}: {v:#}");
    // One GPU of four: a quarter of the agent's price for as long as it ran.
    if let Some(per_hour) = ml_cost_per_hour {
        let expected = per_hour * gpu_s / 3600.0;
        assert!(
            within(cost, expected),
            "{cost} for {gpu_s} GPU-s, not {expected}"
        );
    }
    // CPU and memory of both roles.
    for role in ["ml", "web"] {
        let cpu = format!("gantry_usage_cpu_seconds_total{{role=\"{role}\"}}");
        let mem = format!("gantry_usage_mem_gib_seconds_total{{role=\"{role}\"}}");
        let (values, at) = scraped(&cpu, &[&cpu, &mem]);
        let v = usage(at);
        let r = row(&v, role);
        let api = r["cpu_hours"].as_f64().unwrap() * 3600.0;
        assert!(
            within(values[0], api),
            "{cpu}: {} vs {api}: {v:#}",
            values[0]
        );
        let api = r["mem_gib_hours"].as_f64().unwrap() * 3600.0;
        assert!(
            within(values[1], api),
            "{mem}: {} vs {api}: {v:#}",
            values[1]
        );
    }
    // The GPU agent's price, its cost and what is idle; offers held are apart.
    let v = usage(at);
    let gpu_agent = v["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["name"] == "met-gpu").cloned())
        .unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(gpu_agent["price_per_hour"], 36.0, "{v:#}");
    assert!(gpu_agent["idle_cost"].as_f64().unwrap() > 0.0, "{v:#}");
    assert!(v["held_offers"]["rows"].is_array(), "{v:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_master_and_agents_and_agrees_with_state() {
    if !cgroups_available("metrics_prometheus") {
        return;
    }
    // The shipped rules are valid.
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/prometheus-rules.yml");
    let check = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&rules)
        .output()
        .expect("promtool (Debian package prometheus; scripts/setup-deps.sh installs it)");
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    let scratch = TempDir::new("gantry-metrics").unwrap();
    let mut standin = Standin::four_gpus(scratch.path()).unwrap();
    let root = CgroupRoot::new("metrics");
    let lib = standin_lib();
    let gpu_metrics = free_tcp();
    let mut cluster = Cluster::start_with(
        &[("met-gpu", "cpus:4;mem:4096")],
        &[],
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--cgroup-root",
            &root.name,
            "--usage-interval",
            "0.5",
            "--metrics-listen",
            &gpu_metrics.to_string(),
            "--price-per-hour",
            "36",
        ],
    )
    .unwrap();
    let cpu_metrics = free_tcp();
    let cpu_root = CgroupRoot::new("metrics-cpu");
    let _cpu_agent = AgentProc::start(
        cluster.dir.path(),
        &cluster.tls_dir,
        cluster.master.quic,
        "met-cpu",
        "cpus:2;mem:2048",
        &[
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
            "--cgroup-root",
            &cpu_root.name,
            "--usage-interval",
            "0.5",
            "--metrics-listen",
            &cpu_metrics.to_string(),
            // A price given as the attribute works as the flag does.
            "--attributes",
            "price_per_hour:2",
        ],
    )
    .unwrap();
    cluster
        .master
        .wait_state(T, "two agents", |s| {
            s["agents"]
                .as_array()
                .is_some_and(|a| a.iter().filter(|a| a["connected"] == true).count() == 2)
        })
        .unwrap();

    // /metrics is a read: no credentials, no metrics.
    let anonymous = BlockingClient::new(&ClientConfig {
        master: format!("https://{}", cluster.master.http),
        tls_dir: Some(cluster.tls_dir.clone()),
        credentials: Credentials::None,
        timeout: Duration::from_secs(10),
    })
    .unwrap();
    let refused = anonymous.get("/metrics").unwrap_err();
    assert_eq!(refused.status(), Some(401), "{refused}");

    // A quota, set through the operator API, shows as a series.
    let operator = BlockingClient::new(&operator_client(cluster.master.http).unwrap()).unwrap();
    operator
        .post_json(
            "/quota",
            serde_json::json!({"role": "ml", "guarantee": "gpus:1", "limit": "gpus:2"}),
        )
        .unwrap();

    // Two frameworks, one long task each; then no more offers (shares stay put).
    let train = task("train", "sleep 600", "cpus:0.5;mem:64;gpus:1");
    let serve = task("serve", "sleep 600", "cpus:1;mem:128");
    let mut ml = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "metrics-ml",
        vec!["ml".into()],
    );
    ml.info.capabilities = vec![Capability::GpuResources];
    let web = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "metrics-web",
        vec!["web".into()],
    );
    let (mut ml_updates, ml_handle, ml_run) = start_recorder(ml, vec![train.clone()]);
    let (mut web_updates, web_handle, web_run) = start_recorder(web, vec![serve.clone()]);
    for (updates, t) in [(&mut ml_updates, &train), (&mut web_updates, &serve)] {
        if let Err(e) = updates.wait(t.task_id, TaskState::Running, T).await {
            cluster.dump_logs();
            panic!("{e}");
        }
    }
    ml_handle.suppress(vec!["ml".into()]);
    web_handle.suppress(vec!["web".into()]);
    let state = cluster
        .master
        .wait_state(T, "no outstanding offers", |s| {
            s["offers"].as_array().is_some_and(|o| o.is_empty())
                && state_task(s, train.task_id)["gpus"]
                    .as_array()
                    .is_some_and(|g| g.len() == 1)
        })
        .unwrap();
    let gpu_uuid = state_task(&state, train.task_id)["gpus"][0]
        .as_str()
        .unwrap()
        .to_string();
    // The stand-in reports the task's GPU busy.
    let index = standin
        .config
        .gpus
        .iter()
        .position(|g| g.uuid == gpu_uuid)
        .unwrap();
    standin.config.gpus[index].utilization_gpu = 73;
    standin.config.gpus[index].temperature_c = 66;
    standin.write().unwrap();

    let prom = start_prometheus(
        scratch.path(),
        &cluster.tls_dir,
        cluster.master.http,
        &[gpu_metrics, cpu_metrics],
        &rules,
    );
    prom.wait("all three targets up", |p| {
        (p.value("sum(up)") == Some(3.0)).then_some(())
    });
    prom.wait("the master to lead", |p| {
        (p.value("gantry_leader{job=\"gantry-master\"}") == Some(1.0)).then_some(())
    });

    // Task counts by state equal /state's.
    let state = cluster.master.state().unwrap();
    let mut by_state = std::collections::BTreeMap::<String, f64>::new();
    for t in state["tasks"].as_array().unwrap() {
        *by_state
            .entry(t["state"].as_str().unwrap().to_string())
            .or_default() += 1.0;
    }
    assert_eq!(by_state.get("RUNNING"), Some(&2.0), "{state:#}");
    prom.wait("task counts equal to /state", |p| {
        by_state
            .iter()
            .all(|(s, n)| p.value(&format!("gantry_tasks{{state=\"{s}\"}}")) == Some(*n))
            .then_some(())
    });
    assert_eq!(prom.value("sum(gantry_tasks)"), Some(2.0));
    assert_eq!(prom.value("gantry_agents{state=\"connected\"}"), Some(2.0));
    assert_eq!(
        prom.value("gantry_frameworks{state=\"connected\"}"),
        Some(2.0)
    );

    // Dominant shares equal /state's (frameworks and roles).
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    for f in state["frameworks"].as_array().unwrap() {
        let id = f["id"].as_str().unwrap();
        let share = f["dominant_share"].as_f64().unwrap();
        assert!(share > 0.0, "{f:#}");
        prom.wait(&format!("framework {id}'s share {share}"), |p| {
            p.value(&format!(
                "gantry_framework_dominant_share{{framework_id=\"{id}\"}}"
            ))
            .filter(|v| close(*v, share))
        });
    }
    for role in ["ml", "web"] {
        let share = state["allocator"]["roles"][role]["dominant_share"]
            .as_f64()
            .unwrap();
        prom.wait(&format!("role {role}'s share {share}"), |p| {
            p.value(&format!("gantry_role_dominant_share{{role=\"{role}\"}}"))
                .filter(|v| close(*v, share))
        });
    }

    // The quota, resources, offers and the allocation cycle histogram.
    assert_eq!(
        prom.value("gantry_quota{role=\"ml\",kind=\"gpus\",kind_of=\"limit\"}"),
        Some(2.0)
    );
    assert_eq!(
        prom.value("gantry_quota{role=\"ml\",kind=\"gpus\",kind_of=\"guarantee\"}"),
        Some(1.0)
    );
    assert_eq!(
        prom.value("gantry_resources{kind=\"gpus\",state=\"total\"}"),
        Some(4.0)
    );
    assert_eq!(
        prom.value("gantry_resources{kind=\"gpus\",state=\"used\"}"),
        Some(1.0)
    );
    assert!(prom.value("gantry_offers_total{result=\"accepted\"}") >= Some(2.0));
    assert!(prom.value("gantry_allocation_cycle_seconds_count") > Some(0.0));

    // Allocation accounting: the ml role's allocated GPU-seconds grow (one GPU held).
    let first = prom.wait("GPU-seconds of ml", |p| {
        p.value("gantry_role_allocated_seconds_total{role=\"ml\",kind=\"gpus\"}")
            .filter(|v| *v > 0.0)
    });
    prom.wait("GPU-seconds of ml to grow", |p| {
        p.value("gantry_role_allocated_seconds_total{role=\"ml\",kind=\"gpus\"}")
            .filter(|v| *v > first)
    });
    assert!(
        prom.value(
            "gantry_framework_allocated_seconds_total{framework=\"metrics-ml\",kind=\"gpus\"}"
        ) > Some(0.0)
    );

    // Usage and cost: the scraped counters agree with /api/v1/usage over the same time.
    usage_agrees_with_the_counters(&prom, &operator, Some(0.25 * 36.0));

    // The agent: the task's GPU carries its task and framework, with dcgm-exporter labels.
    let ml_id = state["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "metrics-ml")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let series = prom.wait("the GPU series of the task", |p| {
        let r = p.query(&format!(
            "DCGM_FI_DEV_GPU_UTIL{{task=\"{}\"}}",
            train.task_id
        ));
        (r.len() == 1 && r[0]["value"][1] == "73").then(|| r[0].clone())
    });
    let labels = &series["metric"];
    assert_eq!(labels["UUID"], gpu_uuid.as_str(), "{series:#}");
    assert_eq!(labels["framework"], ml_id.as_str(), "{series:#}");
    assert_eq!(labels["task_name"], "train", "{series:#}");
    assert_eq!(labels["gpu"], index.to_string(), "{series:#}");
    assert_eq!(
        labels["modelName"],
        standin.config.gpus[index].name.as_str(),
        "{series:#}"
    );
    assert_eq!(
        labels["pci_bus_id"],
        standin.config.gpus[index].pci_bus_id.as_str()
    );
    assert!(labels["Hostname"].as_str().is_some_and(|h| !h.is_empty()));
    assert_eq!(
        prom.value(&format!("DCGM_FI_DEV_GPU_TEMP{{UUID=\"{gpu_uuid}\"}}")),
        Some(66.0)
    );
    // Every GPU is reported, healthy, with free memory; only the task's GPU has a task.
    assert_eq!(prom.value("count(DCGM_FI_DEV_FB_FREE)"), Some(4.0));
    assert_eq!(prom.value("sum(gantry_gpu_healthy)"), Some(4.0));
    assert_eq!(
        prom.value("count(DCGM_FI_DEV_POWER_USAGE{task!=\"\"})"),
        Some(1.0)
    );
    // Per-task usage from the cgroups, on both agents.
    for t in [&train, &serve] {
        prom.wait(&format!("memory of task {}", t.name), |p| {
            p.value(&format!(
                "gantry_task_memory_bytes{{task=\"{}\"}}",
                t.task_id
            ))
            .filter(|v| *v > 0.0)
        });
        assert!(
            prom.value(&format!(
                "gantry_task_cpu_seconds_total{{task=\"{}\"}}",
                t.task_id
            ))
            .is_some(),
            "cpu series of {}",
            t.name
        );
    }
    // Both agents report their status update queues.
    prom.wait("both agents' update queues", |p| {
        (p.value("count(gantry_agent_status_updates_pending)") == Some(2.0)
            && p.value("count(gantry_agent_status_update_retries_total)") == Some(2.0))
        .then_some(())
    });
    // The example rules load and evaluate.
    let rules_api = prom.client.get("/api/v1/rules").unwrap();
    assert!(rules_api.contains("GantryQuotaExceeded"), "{rules_api}");
    assert!(!rules_api.contains("\"health\":\"err\""), "{rules_api}");

    // A critical XID on a GPU nobody holds: its XID series shows it, it turns unhealthy, and
    // the example GantryGpuUnhealthy alert fires (pending: `for: 1m`) for that GPU.
    let other = (index + 1) % standin.config.gpus.len();
    standin.inject_xid(other as u32, 79).unwrap();
    let other_uuid = standin.config.gpus[other].uuid.clone();
    prom.wait("the XID series", |p| {
        (p.value(&format!("DCGM_FI_DEV_XID_ERRORS{{UUID=\"{other_uuid}\"}}")) == Some(79.0))
            .then_some(())
    });
    prom.wait("the GPU unhealthy", |p| {
        (p.value(&format!("gantry_gpu_healthy{{UUID=\"{other_uuid}\"}}")) == Some(0.0))
            .then_some(())
    });
    prom.wait("the GantryGpuUnhealthy alert", |p| {
        let alerts: serde_json::Value =
            serde_json::from_str(&p.client.get("/api/v1/alerts").ok()?).ok()?;
        alerts["data"]["alerts"]
            .as_array()?
            .iter()
            .any(|a| {
                a["labels"]["alertname"] == "GantryGpuUnhealthy"
                    && a["labels"]["UUID"] == other_uuid.as_str()
            })
            .then_some(())
    });
    // The task's GPU is still healthy and still reports its task.
    assert_eq!(
        prom.value(&format!("gantry_gpu_healthy{{UUID=\"{gpu_uuid}\"}}")),
        Some(1.0)
    );

    // A task that ends leaves the agent's series (the CPU agent then has nothing to sample).
    web_handle.kill(serve.task_id);
    if let Err(e) = web_updates.wait(serve.task_id, TaskState::Killed, T).await {
        cluster.dump_logs();
        panic!("{e}");
    }
    prom.wait("the killed task's series to go", |p| {
        (p.query(&format!(
            "gantry_task_memory_bytes{{task=\"{}\"}}",
            serve.task_id
        ))
        .is_empty()
            && p.value("gantry_tasks{state=\"RUNNING\"}") == Some(1.0)
            && p.value("gantry_tasks_completed_total{state=\"KILLED\"}") == Some(1.0))
        .then_some(())
    });

    // A framework that reads its offers and never answers holds what is left; the master
    // samples held offers into hourly buckets and writes them to its registry (at most every
    // 10 s of sampled time) so that they survive the restart below.
    let (_hoard_ep, hoard_conn, mut hoard_tx, mut hoard_rx) = cluster.raw_framework("hoard").await;
    hoard_tx
        .send(&gantry_sdk::protocol::FrameworkToMaster::Subscribe(
            gantry_sdk::protocol::FrameworkInfo {
                framework_id: None,
                name: "hoard".into(),
                roles: vec!["hoard".into()],
                capabilities: vec![],
                failover_timeout_secs: 0.0,
                min_allocatable: Vec::new(),
                suppressed_roles: Vec::new(),
            },
        ))
        .await
        .unwrap();
    let hoard_reader = tokio::spawn(async move {
        while hoard_rx
            .recv::<gantry_sdk::protocol::MasterToFramework>()
            .await
            .is_ok()
        {}
    });
    let registry_has_held_offers = || {
        ["registry.json", "registry.journal"].iter().any(|f| {
            std::fs::read_to_string(cluster.master.work_dir.join(f))
                .is_ok_and(|t| t.contains("\"framework\":") && t.contains("PutHeldOffers"))
        }) || std::fs::read_to_string(cluster.master.work_dir.join("registry.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| {
                v["registry"]["held_offers"].as_object().is_some_and(|b| {
                    b.values()
                        .any(|b| b["rows"].as_array().is_some_and(|r| !r.is_empty()))
                })
            })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !registry_has_held_offers() {
        assert!(
            Instant::now() < deadline,
            "held offers never written to the registry in {}",
            cluster.master.work_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let held = |what: &str| -> serde_json::Value {
        let body = operator.get("/api/v1/usage?since=0&by=role").unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["held_offers"]["rows"]
                .as_array()
                .is_some_and(|r| !r.is_empty()),
            "{what}: {v:#}"
        );
        v["held_offers"].clone()
    };
    let held_before = held("offers held before the restart");

    // The quota survives a master restart (kill -9): the new master serves it from the
    // registry, and the agents' tasks are counted again once they re-register.
    cluster.master.restart().unwrap();
    prom.wait("a scrape of the restarted master", |p| {
        p.value("resets(gantry_allocation_cycles_total[5m])")
            .filter(|v| *v >= 1.0)
    });
    prom.wait("the quota after the restart", |p| {
        (p.value("gantry_quota{role=\"ml\",kind=\"gpus\",kind_of=\"limit\"}") == Some(2.0))
            .then_some(())
    });
    // The usage counters go on from the stored history after the restart; the task still pays
    // the share it started with (the GPU agent has 3 healthy GPUs by now, after the XID).
    usage_agrees_with_the_counters(&prom, &operator, Some(0.25 * 36.0));
    // The held offers go on from the registry's buckets: the same start, not the new
    // master's first sample.
    let held_after = held("offers held after the restart");
    assert_eq!(
        held_after["from_ms"], held_before["from_ms"],
        "held offers restored: {held_before:#} then {held_after:#}"
    );
    hoard_conn.close(0u32.into(), b"done");
    hoard_reader.abort();
    prom.wait("the running task counted after the restart", |p| {
        (p.value("gantry_tasks{state=\"RUNNING\"}") == Some(1.0)).then_some(())
    });

    ml_run.abort();
    web_run.abort();
}
