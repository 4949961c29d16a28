//! Queue benchmarks (figures printed, no assertions; results in docs/benchmarks.md):
//!
//! - `pass`: JOBS queued jobs (default 100,000, 1 to 8 GPUs each) over AGENTS 8-GPU agents
//!   (default 1,250: 10,000 GPUs). The cluster is filled by one pass over every agent's offer,
//!   then STEPS times a worker ends (each worker once) and its agent's freed GPUs are offered
//!   again (what that launches runs: its GPUs busy, reported `Running`): the passes
//!   those two calls run (`Core::update`, `Core::offers`) are timed, p50/p99/max, in wall-clock
//!   time and in the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`: what other processes on a
//!   busy machine take is not counted, so runs on a shared machine compare better).
//! - `store`: a store of N finished jobs (default 1,000,000) is written, then reopened and
//!   loaded as `serve` does (`Store::open`, `Store::load`): the reopen is timed.
//!
//! ```text
//! cargo run --release -p gantry-queue --example queue_bench -- pass [JOBS] [AGENTS] [STEPS]
//! cargo run --release -p gantry-queue --example queue_bench -- pass-quotas [JOBS] [AGENTS] [STEPS]
//! cargo run --release -p gantry-queue --example queue_bench -- store [N] [DIR]
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_queue::core::{Action, Core, CoreConfig, MAX_ENDED_JOBS};
use gantry_queue::model::{JobRecord, JobSpec, JobState};
use gantry_queue::store::Store;
use gantry_sdk::protocol::*;

const PRIORITIES: [&str; 4] = ["normal", "low", "preemptible", "high"];

fn spec(i: u64) -> JobSpec {
    let gpus = [1, 1, 2, 4, 8, 1, 2, 8][(i % 8) as usize];
    serde_json::from_value(serde_json::json!({
        "name": format!("job{i}"),
        "team": format!("team{}", i % 10),
        "priority": PRIORITIES[(i % 4) as usize],
        "command": ["true"],
        "gpus": gpus,
    }))
    .expect("a valid specification")
}

fn record(i: u64, state: JobState, wall: u64) -> JobRecord {
    JobRecord {
        id: i,
        spec: spec(i),
        user: "bench".into(),
        state,
        submitted_unix_ms: wall,
        waiting_since_unix_ms: wall,
        waited_ms: 0,
        preemptions: 0,
        attempts: u32::from(state != JobState::Pending),
        retries: 0,
        retrying: false,
        not_before_unix_ms: None,
        attempt_started_unix_ms: None,
        preempting: false,
        lost: false,
        finished_members: 0,
        next_index: 0,
        message: String::new(),
        on_deps: false,
        members: Vec::new(),
    }
}

struct Agent {
    id: AgentId,
    gpus: Vec<GpuInfo>,
    busy: Vec<bool>,
}

fn offer(a: &Agent, n: usize) -> Offer {
    let free: Vec<GpuInfo> = a
        .gpus
        .iter()
        .zip(&a.busy)
        .filter(|(_, b)| !**b)
        .map(|(g, _)| g.clone())
        .collect();
    Offer {
        id: OfferId::random(),
        framework_id: FrameworkId::random(),
        agent_id: a.id,
        hostname: format!("h{n}"),
        role: "default".into(),
        resources: Resources::new()
            .with("cpus", 64.0)
            .with("mem", 524288.0)
            .with("gpus", free.len() as f64),
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: Arc::from(free),
        gpu_free: Vec::new(),
        agent_name: format!("h{n}"),
    }
}

fn percentiles(mut v: Vec<Duration>) -> String {
    if v.is_empty() {
        return "no passes".into();
    }
    v.sort();
    let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} passes)",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        at(1.0).as_secs_f64() * 1e3,
        v.len()
    )
}

/// The calling thread's CPU time so far.
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes the `timespec` it is given, which lives across the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn launched(actions: &[Action]) -> Vec<TaskInfo> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Launch { tasks, .. } => tasks.clone(),
            _ => Vec::new(),
        })
        .collect()
}

/// Runs the workers `actions` launch (on the agents of their offers, `agent_of`): their GPUs
/// become busy and each is reported `Running` to the core.
fn started(
    core: &mut Core,
    cluster: &mut [Agent],
    actions: &[Action],
    agent_of: &BTreeMap<OfferId, usize>,
    now: Instant,
    running: &mut Vec<(TaskInfo, usize, Vec<usize>)>,
) {
    for a in actions {
        if let Action::Launch { tasks, offers } = a {
            let Some(&n) = offers.first().and_then(|o| agent_of.get(o)) else {
                continue;
            };
            for t in tasks {
                let want = t.resources.get("gpus") as usize;
                let uuids = t
                    .gpu_selector
                    .as_ref()
                    .map(|s| s.uuids.clone())
                    .unwrap_or_default();
                let agent = &mut cluster[n];
                let mut gpus: Vec<usize> = uuids
                    .iter()
                    .filter_map(|u| agent.gpus.iter().position(|g| &g.uuid == u))
                    .take(want)
                    .collect();
                if gpus.len() < want {
                    gpus = (0..8).filter(|g| !agent.busy[*g]).take(want).collect();
                }
                let uuids = gpus.iter().map(|g| agent.gpus[*g].uuid.clone()).collect();
                for g in &gpus {
                    agent.busy[*g] = true;
                }
                let u = StatusUpdate {
                    gpus: uuids,
                    ..StatusUpdate::new(t.task_id, FrameworkId::random(), TaskState::Running)
                };
                core.update(&u, now);
                running.push((t.clone(), n, gpus));
            }
        }
    }
}

fn pass(jobs: u64, agents: usize, steps: usize, quotas: bool) {
    let wall = 1_900_000_000_000;
    let now = Instant::now();
    let mut config = CoreConfig::default();
    if quotas {
        // The ten teams share the cluster's GPUs as nominal quotas (Kueue's nominal quota).
        let each = (agents as u64 * 8 / 10).max(1);
        for t in 0..10 {
            let team = gantry_queue::model::TeamConfig {
                gpu_quota: Some(each),
                ..Default::default()
            };
            config.teams.insert(format!("team{t}"), team);
        }
        println!("ten teams with a quota of {each} GPUs each");
    }
    let mut core = Core::new(config);
    let records = (1..=jobs)
        .map(|i| record(i, JobState::Pending, wall))
        .collect();
    let t = Instant::now();
    core.restore(records, BTreeMap::new(), jobs + 1, now, wall);
    println!("restored {jobs} queued jobs in {:.2?}", t.elapsed());
    let mut cluster: Vec<Agent> = (0..agents)
        .map(|n| Agent {
            id: AgentId::random(),
            gpus: (0..8)
                .map(|k| GpuInfo {
                    uuid: format!("GPU-{n}-{k}"),
                    name: "NVIDIA H100".into(),
                    memory_mib: 81920,
                    compute_capability: (9, 0),
                    minor: k,
                    pci_bus_id: format!("0000:{k:02x}:00.0"),
                    numa_node: Some(k / 4),
                    pci_root: None,
                    healthy: true,
                    mig_profile: None,
                    parent_uuid: None,
                })
                .collect(),
            busy: vec![false; 8],
        })
        .collect();
    let offers: Vec<Offer> = cluster
        .iter()
        .enumerate()
        .map(|(n, a)| offer(a, n))
        .collect();
    let t = Instant::now();
    let agent_of: BTreeMap<OfferId, usize> =
        offers.iter().enumerate().map(|(n, o)| (o.id, n)).collect();
    let actions = core.offers(offers, now);
    let tasks = launched(&actions);
    println!(
        "first pass over {} agents: {} workers launched in {:.2?}",
        agents,
        tasks.len(),
        t.elapsed()
    );
    let mut running: Vec<(TaskInfo, usize, Vec<usize>)> = Vec::new();
    started(
        &mut core,
        &mut cluster,
        &actions,
        &agent_of,
        now,
        &mut running,
    );
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    let mut at = now;
    for step in 0..steps {
        if running.is_empty() {
            break;
        }
        at += Duration::from_secs(1);
        let (task, n, gpus) = running.swap_remove(step * 7 % running.len());
        for g in &gpus {
            cluster[n].busy[*g] = false;
        }
        let (t, c) = (Instant::now(), cpu_time());
        core.update(
            &StatusUpdate::new(task.task_id, FrameworkId::random(), TaskState::Finished),
            at,
        );
        times.push(t.elapsed());
        cpu.push(cpu_time().saturating_sub(c));
        let o = offer(&cluster[n], n);
        let agent_of = BTreeMap::from([(o.id, n)]);
        let (t, c) = (Instant::now(), cpu_time());
        let actions = core.offers(vec![o], at);
        times.push(t.elapsed());
        cpu.push(cpu_time().saturating_sub(c));
        // What it launched runs (its `Running` updates' passes are not timed).
        started(
            &mut core,
            &mut cluster,
            &actions,
            &agent_of,
            at,
            &mut running,
        );
    }
    println!(
        "steady-state passes with {} queued: {}",
        core.active_jobs(),
        percentiles(times)
    );
    println!("the same passes in CPU time: {}", percentiles(cpu.clone()));
    let (ends, offers): (Vec<_>, Vec<_>) = cpu.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let strip = |v: Vec<(usize, &Duration)>| v.into_iter().map(|(_, d)| *d).collect();
    println!("  after a worker's end (CPU): {}", percentiles(strip(ends)));
    println!(
        "  after its agent's offer (CPU): {}",
        percentiles(strip(offers))
    );
}

fn store(n: u64, dir: &std::path::Path) -> anyhow::Result<()> {
    let path = dir.join("bench.redb");
    let _ = std::fs::remove_file(&path);
    let wall = 1_900_000_000_000;
    let t = Instant::now();
    {
        let store = Store::open(&path)?;
        let mut i = 1;
        while i <= n {
            let end = (i + 9_999).min(n);
            let changes = gantry_queue::core::Changes {
                jobs: (i..=end)
                    .map(|k| record(k, JobState::Finished, wall))
                    .collect(),
                usage: Vec::new(),
                next_id: end + 1,
            };
            store.commit(&changes)?;
            i = end + 1;
        }
    }
    println!("wrote {n} finished jobs in {:.2?}", t.elapsed());
    let t = Instant::now();
    let store = Store::open(&path)?;
    let opened = t.elapsed();
    let loaded = store.load(MAX_ENDED_JOBS)?;
    println!(
        "reopened in {:.2?} (open {:.2?}), {} jobs loaded; file {} MiB",
        t.elapsed(),
        opened,
        loaded.jobs.len(),
        std::fs::metadata(&path)?.len() >> 20
    );
    drop(store);
    std::fs::remove_file(&path)?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u64| -> anyhow::Result<u64> {
        Ok(args.get(i).map(|s| s.parse()).transpose()?.unwrap_or(d))
    };
    match args.first().map(String::as_str) {
        Some(mode @ ("pass" | "pass-quotas")) => pass(
            num(1, 100_000)?,
            num(2, 1_250)? as usize,
            num(3, 200)? as usize,
            mode == "pass-quotas",
        ),
        Some("store") => {
            let dir = args.get(2).map_or_else(std::env::temp_dir, Into::into);
            store(num(1, 1_000_000)?, &dir)?;
        }
        _ => anyhow::bail!(
            "usage: queue_bench pass|pass-quotas [JOBS] [AGENTS] [STEPS] | store [N] [DIR]"
        ),
    }
    Ok(())
}
