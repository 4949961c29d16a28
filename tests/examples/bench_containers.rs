//! Launch of container tasks from a cached image against the same command without an image
//! (issue 32, docs/benchmarks.md "Container launches"), in ONE run on one real agent.
//!
//! Starts a real master and one real agent (cgroups, the agent's OCI runtime), Debian's
//! `docker-registry` on loopback with the busybox test image `busybox:v2` pushed with `skopeo`
//! (gantry-test-support's harness), pulls the image once, then for `ROUNDS` rounds and each
//! mode — `plain` (`true` on the host), `image-tag` (`true` in `REGISTRY/busybox:v2`: one
//! manifest request per launch), `image-digest` (`REGISTRY/busybox@sha256:…`: no registry
//! traffic) — runs
//!
//! - `SEQ` tasks one at a time: per-task latency from the framework's accept to `RUNNING`
//!   (the launch) and to `FINISHED` (p50, p99);
//! - `N` tasks at once: launches/s (accept of the first to `FINISHED` of the last).
//!
//! and prints the medians over the rounds and the ratios of the image modes to `plain`.
//!
//! Usage (as root, binaries built: `cargo build -p gantry-master -p gantry-agent`):
//! `cargo run -p gantry-tests --example bench_containers -- [N] [SEQ] [ROUNDS]`
//! (defaults 100, 20, 3). `GANTRY_BENCH_RUNTIME=crun` runs the agent with
//! `--container-runtime crun`; `GANTRY_BENCH_MODES=plain,image-digest` picks modes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_sdk::protocol::{ContainerInfo, Offer, Operation, StatusUpdate, TaskId, TaskInfo};
use gantry_sdk::protocol::{ErrorKind, TaskState};
use gantry_sdk::{DriverHandle, Scheduler};
use gantry_test_support::registry::{Registry, RegistryOptions, TestImages};
use gantry_tests::{task, Cluster};

/// Launches what is queued as offers allow; reports (task, state, when) for every update.
struct Bench {
    queue: Arc<Mutex<Vec<TaskInfo>>>,
    accepted: Arc<Mutex<HashMap<TaskId, Instant>>>,
    tx: tokio::sync::mpsc::UnboundedSender<(TaskId, TaskState, Instant, String)>,
}

impl Scheduler for Bench {
    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        for g in gantry_sdk::placement::offers::group_offers(&offers) {
            let (ids, mut avail) = (g.offer_ids, g.resources);
            let mut launch = Vec::new();
            {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                q.retain(|t| {
                    if avail.contains(&t.resources) {
                        let _ = avail.checked_sub_assign(&t.resources);
                        launch.push(t.clone());
                        false
                    } else {
                        true
                    }
                });
            }
            if launch.is_empty() {
                driver.decline(ids, Some(0.05));
                continue;
            }
            let now = Instant::now();
            {
                let mut a = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
                for t in &launch {
                    a.insert(t.task_id, now);
                }
            }
            driver.accept(ids, vec![Operation::Launch { tasks: launch }], None);
        }
    }

    async fn status_update(&mut self, _driver: &DriverHandle, u: &StatusUpdate) {
        let _ = self
            .tx
            .send((u.task_id, u.state, Instant::now(), u.message.clone()));
    }

    async fn error(&mut self, _driver: &DriverHandle, kind: ErrorKind, message: &str) {
        eprintln!("framework error {kind:?}: {message}");
    }
}

struct Runner {
    queue: Arc<Mutex<Vec<TaskInfo>>>,
    accepted: Arc<Mutex<HashMap<TaskId, Instant>>>,
    rx: tokio::sync::mpsc::UnboundedReceiver<(TaskId, TaskState, Instant, String)>,
    handle: DriverHandle,
}

/// One batch's figures: per task (accept → RUNNING, accept → end), and the batch's wall time.
struct Batch {
    launch: Vec<Duration>,
    total: Vec<Duration>,
    wall: Duration,
}

impl Runner {
    /// Runs `tasks` (all queued at once) to their ends.
    async fn run(&mut self, tasks: Vec<TaskInfo>) -> anyhow::Result<Batch> {
        let ids: Vec<TaskId> = tasks.iter().map(|t| t.task_id).collect();
        let t0 = Instant::now();
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(tasks);
        self.handle.revive(vec![]);
        let mut running: HashMap<TaskId, Instant> = HashMap::new();
        let mut ended: HashMap<TaskId, Instant> = HashMap::new();
        while ended.len() < ids.len() {
            let (id, state, at, msg) =
                tokio::time::timeout(Duration::from_secs(120), self.rx.recv())
                    .await
                    .map_err(|_| anyhow::anyhow!("no update for 120 s"))?
                    .ok_or_else(|| anyhow::anyhow!("the driver stopped"))?;
            if !ids.contains(&id) {
                continue;
            }
            match state {
                TaskState::Running => {
                    running.insert(id, at);
                }
                TaskState::Finished => {
                    ended.insert(id, at);
                }
                s if s.is_terminal() => anyhow::bail!("task {id} ended {s:?}: {msg}"),
                _ => {}
            }
        }
        let wall = t0.elapsed();
        let accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        let mut launch = Vec::new();
        let mut total = Vec::new();
        for id in &ids {
            let a = accepted[id];
            if let Some(r) = running.get(id) {
                launch.push(r.saturating_duration_since(a));
            }
            total.push(ended[id].saturating_duration_since(a));
        }
        Ok(Batch {
            launch,
            total,
            wall,
        })
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let (n, seq, rounds) = (arg(1, 100), arg(2, 20), arg(3, 3));
    let registry = Registry::start(RegistryOptions::default())?;
    let images = TestImages::build()?;
    registry.push(&images.layout(), "v2", "busybox:v2")?;
    let host = registry.host();
    let by_tag = format!("{host}/busybox:v2");
    let by_digest = format!("{host}/busybox@{}", images.manifest_digest("v2")?);
    let mut agent_args = vec!["--registry-insecure".to_string(), host.clone()];
    let runtime = std::env::var("GANTRY_BENCH_RUNTIME").unwrap_or_else(|_| "runc".into());
    agent_args.extend(["--container-runtime".into(), runtime.clone()]);
    let args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
    let cluster = Cluster::start_with(&[("bench", "cpus:64;mem:65536")], &[], &args)?;

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let queue = Arc::new(Mutex::new(Vec::new()));
    let accepted = Arc::new(Mutex::new(HashMap::new()));
    let driver = gantry_sdk::Driver::new(cluster.framework_config("bench", &["bench"]));
    let handle = driver.handle();
    let run = tokio::spawn(driver.run(Bench {
        queue: queue.clone(),
        accepted: accepted.clone(),
        tx,
    }));
    let mut r = Runner {
        queue,
        accepted,
        rx,
        handle: handle.clone(),
    };
    let make = |mode: &str| {
        let mut t = task("bench", "true", "cpus:0.1;mem:32");
        match mode {
            "image-tag" => t.container = Some(Box::new(ContainerInfo::new(&by_tag))),
            "image-digest" => t.container = Some(Box::new(ContainerInfo::new(&by_digest))),
            _ => {}
        }
        t
    };
    // The image is pulled once (and the agent warmed up) before anything is measured.
    r.run((0..2).map(|_| make("image-tag")).collect()).await?;
    r.run((0..2).map(|_| make("plain")).collect()).await?;

    let modes: Vec<String> = std::env::var("GANTRY_BENCH_MODES")
        .unwrap_or_else(|_| "plain,image-tag,image-digest".into())
        .split(',')
        .map(str::to_string)
        .collect();
    println!(
        "== {n} tasks at once and {seq} one at a time, {rounds} rounds, runtime {runtime}, \
         {} cpus, load {}",
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    // mode → (launch p50, launch p99, end p50, end p99, jobs/s) per round.
    let mut figures: HashMap<String, Vec<[f64; 5]>> = HashMap::new();
    for round in 1..=rounds {
        for mode in &modes {
            let mut lat = Batch {
                launch: Vec::new(),
                total: Vec::new(),
                wall: Duration::ZERO,
            };
            for _ in 0..seq {
                let b = r.run(vec![make(mode)]).await?;
                lat.launch.extend(b.launch);
                lat.total.extend(b.total);
            }
            let thr = r.run((0..n).map(|_| make(mode)).collect()).await?;
            let f = [
                ms(pct(&mut lat.launch, 0.5)),
                ms(pct(&mut lat.launch, 0.99)),
                ms(pct(&mut lat.total, 0.5)),
                ms(pct(&mut lat.total, 0.99)),
                n as f64 / thr.wall.as_secs_f64(),
            ];
            println!(
                "round {round} {mode:<13} launch p50 {:7.1} ms p99 {:7.1} ms | to FINISHED \
                 p50 {:7.1} ms p99 {:7.1} ms | {n} at once {:6.1} tasks/s",
                f[0], f[1], f[2], f[3], f[4]
            );
            figures.entry(mode.clone()).or_default().push(f);
        }
    }
    println!("== medians of {rounds} rounds");
    let med = |mode: &str, i: usize| {
        let mut v: Vec<f64> = figures
            .get(mode)
            .map(|f| f.iter().map(|x| x[i]).collect())
            .unwrap_or_default();
        median(&mut v)
    };
    for mode in &modes {
        println!(
            "{mode:<13} launch p50 {:7.1} ms p99 {:7.1} ms | to FINISHED p50 {:7.1} ms p99 \
             {:7.1} ms | {:6.1} tasks/s",
            med(mode, 0),
            med(mode, 1),
            med(mode, 2),
            med(mode, 3),
            med(mode, 4)
        );
    }
    if figures.contains_key("plain") {
        for mode in modes.iter().filter(|m| *m != "plain") {
            println!(
                "{mode} / plain: launch p50 {:.2}x, to FINISHED p50 {:.2}x, tasks/s {:.2}x",
                med(mode, 0) / med("plain", 0),
                med(mode, 2) / med("plain", 2),
                med(mode, 4) / med("plain", 4)
            );
        }
    }
    handle.stop();
    let _ = tokio::time::timeout(Duration::from_secs(30), run).await;
    drop(cluster);
    Ok(())
}
