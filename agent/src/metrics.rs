//! `GET /metrics` on the agent (`--metrics-listen HOST:PORT`, off by default): per-GPU series
//! under the names and labels of NVIDIA's dcgm-exporter, so existing dashboards and alerts
//! work, plus the `task` and `framework` holding each GPU (which dcgm-exporter cannot know),
//! GPU health, and per-task CPU and memory usage. Rendered with `prometheus-client`.
//!
//! ```text
//! agent loop --(usage sample, GPU fault)--> AgentMetrics (shared snapshot) <-- GET /metrics
//! ```
//! The loop publishes a [`Snapshot`] after every usage sample (`--usage-interval`); a scrape
//! renders the latest one and never waits for the loop. Plain HTTP without authentication (as
//! dcgm-exporter and node_exporter serve): bind it to loopback, or to an address only the
//! Prometheus servers can reach (the series name tasks and frameworks, no secrets).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use gantry_proto::{FrameworkId, GpuSample, TaskId, TaskUsage};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::checkpoint::TaskRecord;
use crate::discovery::DiscoveredGpu;

/// The content type Prometheus asks for and `prometheus-client` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// One GPU as a scrape shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSeries {
    pub index: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    pub model: String,
    pub memory_total_bytes: u64,
    /// The last sample (`None` before the first).
    pub sample: Option<GpuSample>,
    pub healthy: bool,
    /// The last XID NVML reported for it (0: none since the agent started).
    pub last_xid: u64,
    /// The live task holding it.
    pub task: Option<TaskLabel>,
}

/// Who holds a GPU, or whose usage a series is.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskLabel {
    pub id: TaskId,
    pub name: String,
    pub framework: FrameworkId,
}

/// What a scrape renders: built by [`snapshot`] from the agent's state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub hostname: String,
    pub gpus: Vec<GpuSeries>,
    /// Live tasks with their last sampled usage.
    pub tasks: Vec<(TaskLabel, TaskUsage)>,
    /// Status updates sent again for want of an acknowledgement, and those still unacknowledged.
    pub status_update_retries: u64,
    pub status_updates_pending: usize,
    /// Prepared task cgroups ready for the next launches (`--cgroup-pool`).
    pub cgroup_pool_ready: usize,
}

/// The shared latest snapshot and the XIDs seen (cheap to clone).
#[derive(Clone, Default)]
pub struct AgentMetrics {
    snapshot: Arc<RwLock<Snapshot>>,
    xids: Arc<RwLock<HashMap<String, u64>>>,
}

impl AgentMetrics {
    /// Replaces the snapshot scrapes see.
    pub fn publish(&self, mut snapshot: Snapshot) {
        if let Ok(xids) = self.xids.read() {
            for g in &mut snapshot.gpus {
                g.last_xid = xids.get(&g.uuid).copied().unwrap_or(0);
            }
        }
        match self.snapshot.write() {
            Ok(mut s) => *s = snapshot,
            Err(p) => *p.into_inner() = snapshot,
        }
    }

    /// Records an XID NVML reported for a GPU (shown from the next snapshot on).
    pub fn record_xid(&self, uuid: &str, xid: u64) {
        if let Ok(mut x) = self.xids.write() {
            x.insert(uuid.to_string(), xid);
        }
    }

    /// The exposition text of the latest snapshot.
    pub fn render(&self) -> String {
        let s = match self.snapshot.read() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        };
        render(&s)
    }
}

/// Builds a snapshot: every discovered GPU with its last sample, health and holder, and every
/// live task with its usage.
pub fn snapshot<'a>(
    hostname: &str,
    inventory: &[DiscoveredGpu],
    samples: &[GpuSample],
    healthy: impl Fn(&str) -> bool,
    tasks: impl IntoIterator<Item = (&'a TaskId, &'a TaskRecord)>,
    usage: &[(TaskId, TaskUsage)],
) -> Snapshot {
    let usage: HashMap<TaskId, &TaskUsage> = usage.iter().map(|(id, u)| (*id, u)).collect();
    let mut holder: HashMap<&str, TaskLabel> = HashMap::new();
    let mut live = BTreeMap::new();
    for (id, t) in tasks {
        if t.state.is_terminal() {
            continue;
        }
        let label = TaskLabel {
            id: *id,
            name: t.info.name.clone(),
            framework: t.framework_id,
        };
        for g in &t.gpus {
            holder.insert(g.as_str(), label.clone());
        }
        if let Some(u) = usage.get(id) {
            live.insert(*id, (label, (*u).clone()));
        }
    }
    let gpus = inventory
        .iter()
        .map(|g| GpuSeries {
            index: g.index,
            uuid: g.info.uuid.clone(),
            pci_bus_id: g.info.pci_bus_id.clone(),
            model: g.info.name.clone(),
            memory_total_bytes: g.info.memory_mib << 20,
            sample: samples.iter().find(|s| s.uuid == g.info.uuid).cloned(),
            healthy: healthy(&g.info.uuid),
            last_xid: 0,
            task: holder.get(g.info.uuid.as_str()).cloned(),
        })
        .collect();
    Snapshot {
        hostname: hostname.to_string(),
        gpus,
        tasks: live.into_values().collect(),
        status_update_retries: 0,
        status_updates_pending: 0,
        cgroup_pool_ready: 0,
    }
}

fn gpu_labels(host: &str, g: &GpuSeries) -> Labels {
    let mut l: Labels = vec![
        ("gpu".into(), g.index.to_string()),
        ("UUID".into(), g.uuid.clone()),
        ("pci_bus_id".into(), g.pci_bus_id.clone()),
        ("device".into(), format!("nvidia{}", g.index)),
        ("modelName".into(), g.model.clone()),
        ("Hostname".into(), host.to_string()),
    ];
    if let Some(t) = &g.task {
        l.push(("task".into(), t.id.to_string()));
        l.push(("task_name".into(), t.name.clone()));
        l.push(("framework".into(), t.framework.to_string()));
    }
    l
}

/// Renders a snapshot in the text exposition format.
pub fn render(s: &Snapshot) -> String {
    let mut reg = Registry::default();
    let util = Family::<Labels, Gauge>::default();
    let fb_used = Family::<Labels, Gauge>::default();
    let fb_free = Family::<Labels, Gauge>::default();
    let temp = Family::<Labels, Gauge>::default();
    let power = Family::<Labels, FloatGauge>::default();
    let xid = Family::<Labels, Gauge>::default();
    let healthy = Family::<Labels, Gauge>::default();
    for g in &s.gpus {
        let l = gpu_labels(&s.hostname, g);
        healthy.get_or_create(&l).set(i64::from(g.healthy));
        xid.get_or_create(&l).set(g.last_xid as i64);
        let Some(sample) = &g.sample else { continue };
        let used_mib = sample.mem_used_bytes >> 20;
        util.get_or_create(&l).set(i64::from(sample.util_percent));
        fb_used.get_or_create(&l).set(used_mib as i64);
        fb_free
            .get_or_create(&l)
            .set(((g.memory_total_bytes >> 20).saturating_sub(used_mib)) as i64);
        temp.get_or_create(&l).set(i64::from(sample.temperature_c));
        power
            .get_or_create(&l)
            .set(f64::from(sample.power_mw) / 1000.0);
    }
    reg.register("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)", util);
    reg.register(
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB)",
        fb_used,
    );
    reg.register(
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB)",
        fb_free,
    );
    reg.register("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)", temp);
    reg.register("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)", power);
    reg.register(
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered",
        xid,
    );
    reg.register(
        "gantry_gpu_healthy",
        "1 when the agent offers the GPU, 0 when a fault withdrew it",
        healthy,
    );

    let cpu =
        Family::<Labels, prometheus_client::metrics::counter::Counter<f64, AtomicU64>>::default();
    let mem = Family::<Labels, Gauge>::default();
    let mem_peak = Family::<Labels, Gauge>::default();
    let gpu_mem = Family::<Labels, Gauge>::default();
    let gpu_util = Family::<Labels, FloatGauge>::default();
    for (t, u) in &s.tasks {
        let l: Labels = vec![
            ("task".into(), t.id.to_string()),
            ("task_name".into(), t.name.clone()),
            ("framework".into(), t.framework.to_string()),
            ("Hostname".into(), s.hostname.clone()),
        ];
        cpu.get_or_create(&l).inc_by(u.cpu_time_secs.max(0.0));
        mem.get_or_create(&l).set(u.mem_bytes as i64);
        mem_peak.get_or_create(&l).set(u.mem_peak_bytes as i64);
        gpu_mem.get_or_create(&l).set(u.gpu_mem_bytes as i64);
        gpu_util.get_or_create(&l).set(u.gpu_util_percent);
    }
    // Sampled from the task's cgroup at each `--usage-interval`. CPU time only grows: a
    // counter (exposed as `gantry_task_cpu_seconds_total`; `rate()` gives the task's CPU use).
    // The other series are gauges.
    reg.register(
        "gantry_task_cpu_seconds",
        "CPU time the task used so far (user + system), from its cgroup",
        cpu,
    );
    reg.register("gantry_task_memory_bytes", "Memory the task uses now", mem);
    reg.register(
        "gantry_task_memory_peak_bytes",
        "The most memory the task has used",
        mem_peak,
    );
    reg.register(
        "gantry_task_gpu_memory_bytes",
        "GPU memory used by the task's processes",
        gpu_mem,
    );
    reg.register(
        "gantry_task_gpu_utilization_percent",
        "Utilization of the task's GPUs attributed to it (sum over its GPUs)",
        gpu_util,
    );
    let retries = prometheus_client::metrics::counter::Counter::<u64>::default();
    retries.inc_by(s.status_update_retries);
    reg.register(
        "gantry_agent_status_update_retries",
        "Status updates the agent sent again because no acknowledgement came in time",
        retries,
    );
    let pending = Gauge::<i64>::default();
    pending.set(s.status_updates_pending as i64);
    reg.register(
        "gantry_agent_status_updates_pending",
        "Status updates waiting for the master's acknowledgement",
        pending,
    );
    let pool = Gauge::<i64>::default();
    pool.set(s.cgroup_pool_ready as i64);
    reg.register(
        "gantry_agent_cgroup_pool_ready",
        "Prepared task cgroups ready for the next launches (--cgroup-pool)",
        pool,
    );
    let mut text = String::new();
    if let Err(e) = encode(&mut text, &reg) {
        tracing::warn!("metrics encoding failed: {e}");
    }
    text
}

/// Connections the metrics listener serves at once; past it new ones are closed at once.
const MAX_CONNECTIONS: usize = 32;
/// Time a client has to send a request's headers (slowloris), and to be served.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves `GET /metrics` on `listener` until the task is dropped or aborted: HTTP/1.1 with a
/// header-read deadline, at most 32 connections at once, no request bodies read.
pub async fn serve(listener: tokio::net::TcpListener, metrics: AgentMetrics) {
    use axum::http::header;
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], metrics.render()) }
            }),
        )
        .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "only GET /metrics\n") });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (tcp, remote) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!("metrics accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%remote, "too many metrics connections; closed");
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let mut app = app.clone();
                async move {
                    use tower::Service;
                    app.call(req).await
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(REQUEST_TIMEOUT)
                .max_buf_size(16 * 1024)
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
            // A client that keeps the connection open is cut off after a while.
            if let Ok(Err(e)) = tokio::time::timeout(REQUEST_TIMEOUT * 6, conn).await {
                tracing::debug!(%remote, "metrics connection ended: {e}");
            }
        });
    }
}

/// Binds `--metrics-listen` (warning when it is not a loopback address: the listener has no
/// authentication).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "metrics listener on a non-loopback address: plain HTTP without authentication; let only Prometheus reach it");
    }
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_series_carry_dcgm_names_labels_and_the_task() {
        let task = TaskLabel {
            id: TaskId::from_u128(7),
            name: "train".into(),
            framework: FrameworkId::from_u128(9),
        };
        let gpu = |index: u32, holder: Option<TaskLabel>| GpuSeries {
            index,
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("00000000:0{index}:00.0"),
            model: "NVIDIA A100-SXM4-40GB".into(),
            memory_total_bytes: 40960 << 20,
            sample: Some(GpuSample {
                uuid: format!("GPU-{index}"),
                util_percent: 87,
                mem_used_bytes: 1024 << 20,
                temperature_c: 61,
                power_mw: 250_500,
            }),
            healthy: index == 0,
            last_xid: if index == 0 { 0 } else { 79 },
            task: holder,
        };
        let s = Snapshot {
            hostname: "gpu-host".into(),
            gpus: vec![gpu(0, Some(task.clone())), gpu(1, None)],
            tasks: vec![(
                task,
                TaskUsage {
                    cpu_time_secs: 1.5,
                    mem_bytes: 4096,
                    ..Default::default()
                },
            )],
            ..Default::default()
        };
        let text = render(&s);
        let held = format!(
            "DCGM_FI_DEV_GPU_UTIL{{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:00:00.0\",device=\"nvidia0\",modelName=\"NVIDIA A100-SXM4-40GB\",Hostname=\"gpu-host\",task=\"{}\",task_name=\"train\",framework=\"{}\"}} 87",
            TaskId::from_u128(7),
            FrameworkId::from_u128(9)
        );
        assert!(text.contains(&held), "{text}");
        assert!(text.contains("DCGM_FI_DEV_FB_FREE{gpu=\"1\""), "{text}");
        assert!(text.contains("Hostname=\"gpu-host\"} 39936"), "{text}");
        assert!(text.contains("DCGM_FI_DEV_POWER_USAGE{gpu=\"0\""), "{text}");
        assert!(text.contains("} 250.5"), "{text}");
        assert!(
            text.contains("Hostname=\"gpu-host\"} 79"),
            "xid of gpu 1: {text}"
        );
        assert!(text.contains("gantry_gpu_healthy{gpu=\"1\""), "{text}");
        assert!(
            text.contains("gantry_task_cpu_seconds_total{task="),
            "{text}"
        );
        assert!(
            text.contains("# TYPE gantry_task_cpu_seconds counter"),
            "{text}"
        );
        assert!(text.contains("gantry_task_memory_bytes{task="), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn the_listener_serves_the_latest_snapshot_and_nothing_else() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = AgentMetrics::default();
        let server = tokio::spawn(serve(listener, metrics.clone()));
        metrics.record_xid("GPU-0", 48);
        metrics.publish(Snapshot {
            hostname: "h".into(),
            gpus: vec![GpuSeries {
                index: 0,
                uuid: "GPU-0".into(),
                pci_bus_id: "00000000:07:00.0".into(),
                model: "m".into(),
                memory_total_bytes: 1 << 30,
                sample: None,
                healthy: false,
                last_xid: 0,
                task: None,
            }],
            tasks: vec![],
            status_update_retries: 3,
            status_updates_pending: 1,
            cgroup_pool_ready: 4,
        });
        let ok = get(addr, "/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("application/openmetrics-text"), "{ok}");
        assert!(ok.contains("Hostname=\"h\"} 48"), "the recorded XID: {ok}");
        assert!(ok.contains("gantry_gpu_healthy{gpu=\"0\""), "{ok}");
        assert!(
            ok.contains("gantry_agent_status_update_retries_total 3"),
            "{ok}"
        );
        assert!(ok.contains("gantry_agent_status_updates_pending 1"), "{ok}");
        assert!(ok.contains("gantry_agent_cgroup_pool_ready 4"), "{ok}");
        let other = get(addr, "/state").await;
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
        server.abort();
    }
}
