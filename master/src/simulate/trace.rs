//! Trace mode: frameworks that launch tasks on offers, driven by a job trace, in simulated time.
//!
//! One framework per role (named `fw-ROLE`) runs that role's jobs first-come first-served: on an
//! offer it launches as many pending tasks as fit (earlier jobs first; a later job's tasks may
//! use what an earlier job's shape could not), accepts the used part with `refuse_seconds = 0`,
//! suppresses itself when its queue is empty and revives when a job arrives. With
//! `demand_aware = true` it declares the shape and count of the head job's pending tasks.
//!
//! The report has utilization per resource and dominant share per role over time (sampled at
//! every batch), Jain's fairness index over the roles that have work, job completion times and
//! the wall time of each allocation decision. A small deterministic synthetic trace generator
//! ([`generate`]) writes traces in the same CSV format.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::Instant;

use gantry_proto::messages::Demand;
use gantry_proto::{AgentId, FrameworkId, ResourceLimits, Resources};
use serde::Deserialize;
use serde_json::{json, Value};

use super::scenario::{ClusterSettings, RoleDecl};
use super::SimError;
use crate::allocator::{Allocator, AllocatorConfig, Millis, OfferResources};

/// One job of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub arrival_ms: Millis,
    pub role: String,
    pub task: Resources,
    pub count: u32,
    pub duration_ms: Millis,
}

/// Parses `arrival_ms,role,task,count,duration_ms` CSV (header line required; `#` comments).
pub fn parse_jobs(text: &str) -> Result<Vec<Job>, SimError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    let header = lines
        .next()
        .ok_or_else(|| SimError::Trace("empty trace".into()))?;
    let cols: Vec<&str> = header.1.split(',').map(str::trim).collect();
    if cols != ["arrival_ms", "role", "task", "count", "duration_ms"] {
        return Err(SimError::Trace(format!(
            "header must be arrival_ms,role,task,count,duration_ms, found {:?}",
            header.1
        )));
    }
    let mut jobs = Vec::new();
    for (n, line) in lines {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = |what: &str| SimError::Trace(format!("line {}: {what}: {line:?}", n + 1));
        if f.len() != 5 {
            return Err(bad("expected 5 fields"));
        }
        let job = Job {
            arrival_ms: f[0].parse().map_err(|_| bad("bad arrival_ms"))?,
            role: f[1].to_string(),
            task: Resources::parse(f[2]).map_err(|e| bad(&format!("bad task ({e})")))?,
            count: f[3].parse().map_err(|_| bad("bad count"))?,
            duration_ms: f[4].parse().map_err(|_| bad("bad duration_ms"))?,
        };
        if job.role.is_empty() || job.task.is_empty() || job.count == 0 {
            return Err(bad("role, task and a positive count are required"));
        }
        jobs.push(job);
    }
    jobs.sort_by_key(|j| j.arrival_ms);
    Ok(jobs)
}

/// A group of identical agents in the trace cluster file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentGroup {
    #[serde(default = "default_prefix")]
    pub name_prefix: String,
    pub count: usize,
    pub resources: String,
}

fn default_prefix() -> String {
    "agent".into()
}

/// `[trace]` options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceOptions {
    #[serde(default = "yes")]
    pub demand_aware: bool,
    /// Frameworks of these roles declare the GPU capability.
    #[serde(default)]
    pub gpu_roles: Vec<String>,
}

fn yes() -> bool {
    true
}

impl Default for TraceOptions {
    fn default() -> Self {
        Self {
            demand_aware: true,
            gpu_roles: Vec::new(),
        }
    }
}

/// The cluster file of trace mode: `[cluster]` and `[[roles]]` as in scenarios, `[[agents]]`
/// groups and `[trace]` options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceCluster {
    #[serde(default)]
    pub cluster: ClusterSettings,
    #[serde(default)]
    pub roles: Vec<RoleDecl>,
    pub agents: Vec<AgentGroup>,
    #[serde(default)]
    pub trace: TraceOptions,
}

impl TraceCluster {
    /// Parses the TOML cluster file.
    pub fn parse(text: &str) -> Result<Self, SimError> {
        let c: TraceCluster = toml::from_str(text).map_err(|e| SimError::Parse(e.to_string()))?;
        if c.cluster.allocation_interval_ms == 0 {
            return Err(SimError::Parse(
                "cluster.allocation_interval_ms must be positive".into(),
            ));
        }
        Ok(c)
    }
}

/// Trace-mode results: a JSON report and a CSV time series.
pub struct TraceReport {
    pub json: Value,
    pub csv: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrival(usize),
    TaskEnd { fw: usize, agent: usize, job: usize },
}

struct Fw {
    id: FrameworkId,
    role: String,
    queue: VecDeque<usize>,
    suppressed: bool,
}

struct JobState {
    to_launch: u32,
    running: u32,
    done: u32,
    finished_at: Option<Millis>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn jain(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq == 0.0 {
        1.0
    } else {
        sum * sum / (n * sq)
    }
}

/// Runs the trace on the cluster.
pub fn run_trace(jobs: &[Job], cluster: &TraceCluster) -> Result<TraceReport, SimError> {
    let c = &cluster.cluster;
    let mut alloc = Allocator::new(AllocatorConfig {
        filter_gpu_resources: c.filter_gpu_resources,
        fairness_excluded_resources: c.fairness_excluded_resources.clone(),
        offer_timeout_ms: c.offer_timeout_ms,
        ..Default::default()
    });
    for r in &cluster.roles {
        if let Some(w) = r.weight {
            if !(w.is_finite() && w > 0.0) {
                return Err(SimError::Parse(format!(
                    "role {:?}: weight must be positive",
                    r.name
                )));
            }
            alloc.set_weight(&r.name, w);
        }
        let bad = |e: String| SimError::Parse(format!("role {:?}: {e}", r.name));
        let g = r
            .quota_guarantee
            .as_deref()
            .map(Resources::parse)
            .transpose()
            .map_err(|e| bad(e.to_string()))?;
        let l = r
            .quota_limit
            .as_deref()
            .map(ResourceLimits::parse)
            .transpose()
            .map_err(|e| bad(e.to_string()))?;
        if g.is_some() || l.is_some() {
            alloc
                .set_quota(&r.name, g, l)
                .map_err(|e| bad(e.to_string()))?;
        }
    }
    let mut agent_ids = Vec::new();
    for g in &cluster.agents {
        let res = Resources::parse(&g.resources)
            .map_err(|e| SimError::Parse(format!("agents {:?}: {e}", g.name_prefix)))?;
        for i in 0..g.count {
            let id = AgentId::from_u128(1_000_000 + agent_ids.len() as u128);
            alloc.add_agent(
                id,
                &format!("{}{i}", g.name_prefix),
                res.clone(),
                BTreeMap::new(),
            );
            agent_ids.push(id);
        }
    }
    if agent_ids.is_empty() {
        return Err(SimError::Parse("the trace cluster has no agents".into()));
    }
    let agent_index: HashMap<AgentId, usize> =
        agent_ids.iter().enumerate().map(|(i, a)| (*a, i)).collect();
    let total = alloc.cluster_total();
    let kinds: Vec<String> = total.names().map(str::to_string).collect();

    // One framework per role, in order of first appearance.
    let mut fws: Vec<Fw> = Vec::new();
    let mut fw_of_role: HashMap<String, usize> = HashMap::new();
    for j in jobs {
        if !fw_of_role.contains_key(&j.role) {
            let id = FrameworkId::from_u128(1 + fws.len() as u128);
            let gpu = cluster.trace.gpu_roles.contains(&j.role);
            alloc.add_framework(
                id,
                &format!("fw-{}", j.role),
                std::slice::from_ref(&j.role),
                gpu,
                None,
            );
            alloc.suppress(id, None);
            fw_of_role.insert(j.role.clone(), fws.len());
            fws.push(Fw {
                id,
                role: j.role.clone(),
                queue: VecDeque::new(),
                suppressed: true,
            });
        }
    }
    let fw_index: HashMap<FrameworkId, usize> =
        fws.iter().enumerate().map(|(i, f)| (f.id, i)).collect();
    let mut states: Vec<JobState> = jobs
        .iter()
        .map(|j| JobState {
            to_launch: j.count,
            running: 0,
            done: 0,
            finished_at: None,
        })
        .collect();
    let mut heap: BinaryHeap<Reverse<(Millis, u64, Ev)>> = BinaryHeap::new();
    let mut seq = 0u64;
    for (i, j) in jobs.iter().enumerate() {
        heap.push(Reverse((j.arrival_ms, seq, Ev::Arrival(i))));
        seq += 1;
    }
    let interval = c.allocation_interval_ms;
    let mut in_use = Resources::new();
    let mut alloc_times: Vec<f64> = Vec::new();
    let mut series: Vec<Value> = Vec::new();
    let mut csv = String::new();
    csv.push_str("t_ms");
    for k in &kinds {
        csv.push_str(&format!(",util_{k}"));
    }
    for f in &fws {
        csv.push_str(&format!(",share_{}", f.role));
    }
    csv.push_str(",jain\n");
    let mut jain_samples = Vec::new();
    let mut util_sums: BTreeMap<String, f64> = BTreeMap::new();
    let mut t: Millis = 0;
    let mut idle_batches = 0u32;
    let unfinished =
        |states: &[JobState]| states.iter().filter(|s| s.finished_at.is_none()).count();

    loop {
        let mut need_alloc = false;
        while let Some(Reverse((at, _, ev))) = heap.peek().copied() {
            if at > t {
                break;
            }
            heap.pop();
            match ev {
                Ev::Arrival(j) => {
                    let fi = fw_of_role[&jobs[j].role];
                    fws[fi].queue.push_back(j);
                    if fws[fi].suppressed {
                        fws[fi].suppressed = false;
                        alloc.revive(fws[fi].id, None);
                    }
                    need_alloc = true;
                }
                Ev::TaskEnd { fw, agent, job } => {
                    let r = OfferResources::unreserved(jobs[job].task.clone());
                    alloc.recover(fws[fw].id, agent_ids[agent], &r);
                    in_use = in_use.saturating_sub(&jobs[job].task);
                    let s = &mut states[job];
                    s.running -= 1;
                    s.done += 1;
                    if s.done == jobs[job].count {
                        s.finished_at = Some(t);
                    }
                    need_alloc = true;
                }
            }
        }
        if cluster.trace.demand_aware {
            for f in &fws {
                let want = f.queue.front().map(|j| Demand {
                    task: jobs[*j].task.clone(),
                    count: states[*j].to_launch,
                    gpu_model: None,
                });
                if alloc.demand(f.id) != want {
                    alloc.set_demand(f.id, want);
                    need_alloc = true;
                }
            }
        }
        let batch = t.is_multiple_of(interval);
        let mut launched = 0usize;
        if need_alloc || batch {
            for o in alloc.expire_offers(t) {
                let _ = o;
            }
            let start = Instant::now();
            let offers = alloc.allocate(t);
            alloc_times.push(start.elapsed().as_secs_f64() * 1000.0);
            for o in offers {
                let fi = fw_index[&o.framework];
                let ai = agent_index[&o.agent];
                let mut left = o.resources.total();
                let mut used = Resources::new();
                let queue: Vec<usize> = fws[fi].queue.iter().copied().collect();
                for j in queue {
                    while states[j].to_launch > 0 && left.contains(&jobs[j].task) {
                        left = left.saturating_sub(&jobs[j].task);
                        used.add_assign(&jobs[j].task);
                        states[j].to_launch -= 1;
                        states[j].running += 1;
                        launched += 1;
                        heap.push(Reverse((
                            t + jobs[j].duration_ms.max(1),
                            seq,
                            Ev::TaskEnd {
                                fw: fi,
                                agent: ai,
                                job: j,
                            },
                        )));
                        seq += 1;
                    }
                }
                fws[fi].queue.retain(|j| states[*j].to_launch > 0);
                in_use.add_assign(&used);
                let used = o.resources.clone().carve(&mut used);
                alloc
                    .accept(o.id, &used, Some(0), t)
                    .map_err(|e| SimError::Trace(format!("accept failed: {e}")))?;
                if fws[fi].queue.is_empty() && !fws[fi].suppressed {
                    fws[fi].suppressed = true;
                    alloc.suppress(fws[fi].id, None);
                }
            }
        }
        if batch {
            let mut point = serde_json::Map::new();
            point.insert("t_ms".into(), json!(t));
            let mut util = serde_json::Map::new();
            csv.push_str(&t.to_string());
            for k in &kinds {
                let u = in_use.get(k) / total.get(k);
                *util_sums.entry(k.clone()).or_default() += u;
                util.insert(k.clone(), json!(u));
                csv.push_str(&format!(",{u:.6}"));
            }
            let mut shares = serde_json::Map::new();
            let mut active = Vec::new();
            for f in &fws {
                let s = alloc.role_share(&f.role);
                shares.insert(f.role.clone(), json!(s));
                csv.push_str(&format!(",{s:.6}"));
                let has_work = !f.queue.is_empty() || alloc.framework_share(f.id) > 0.0;
                if has_work {
                    active.push(s);
                }
            }
            let jn = jain(&active);
            if !active.is_empty() {
                jain_samples.push(jn);
            }
            csv.push_str(&format!(",{jn:.6}\n"));
            point.insert("utilization".into(), Value::Object(util));
            point.insert("dominant_share".into(), Value::Object(shares));
            point.insert("jain".into(), json!(jn));
            series.push(Value::Object(point));
            let running: u32 = states.iter().map(|s| s.running).sum();
            idle_batches = if launched == 0 && running == 0 && heap.is_empty() {
                idle_batches + 1
            } else {
                0
            };
        }
        if unfinished(&states) == 0 && heap.is_empty() {
            break;
        }
        // Jobs whose tasks fit nowhere: stop after a few idle batches with nothing running.
        if idle_batches >= 3 {
            break;
        }
        let next_batch = (t / interval + 1) * interval;
        t = match heap.peek() {
            Some(Reverse((at, _, _))) => (*at).min(next_batch),
            None => next_batch,
        };
    }

    let mut jct: Vec<f64> = jobs
        .iter()
        .zip(&states)
        .filter_map(|(j, s)| s.finished_at.map(|f| (f - j.arrival_ms) as f64))
        .collect();
    jct.sort_by(|a, b| a.total_cmp(b));
    let mut at = alloc_times.clone();
    at.sort_by(|a, b| a.total_cmp(b));
    let samples = series.len().max(1) as f64;
    let util_mean: BTreeMap<String, f64> = util_sums
        .into_iter()
        .map(|(k, v)| (k, v / samples))
        .collect();
    let json = json!({
        "framework_per": "role",
        "demand_aware": cluster.trace.demand_aware,
        "jobs": jobs.len(),
        "jobs_finished": jct.len(),
        "jobs_unfinished": jobs.len() - jct.len(),
        "makespan_ms": t,
        "job_completion_ms": {
            "mean": if jct.is_empty() { 0.0 } else { jct.iter().sum::<f64>() / jct.len() as f64 },
            "p50": percentile(&jct, 0.5),
            "p99": percentile(&jct, 0.99),
        },
        "jain_fairness_mean": if jain_samples.is_empty() { 1.0 } else { jain_samples.iter().sum::<f64>() / jain_samples.len() as f64 },
        "utilization_mean": util_mean,
        "allocation_ms": {
            "cycles": at.len(),
            "mean": if at.is_empty() { 0.0 } else { at.iter().sum::<f64>() / at.len() as f64 },
            "p50": percentile(&at, 0.5),
            "p99": percentile(&at, 0.99),
            "max": at.last().copied().unwrap_or(0.0),
        },
        "series": series,
    });
    Ok(TraceReport { json, csv })
}

/// splitmix64: a tiny deterministic generator for synthetic traces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A synthetic trace of `jobs` jobs over `roles` roles (`role0`, `role1`, ...): Poisson arrivals
/// (mean gap 400 ms), task shapes mixing CPU-heavy and memory-heavy jobs, heavy-tailed task
/// counts (1..=60) and durations of 2-30 s. Deterministic for a given seed.
pub fn generate(jobs: usize, roles: usize, seed: u64) -> String {
    let shapes = [
        "cpus:1;mem:2048",
        "cpus:4;mem:1024",
        "cpus:2;mem:8192",
        "cpus:1;mem:512",
        "cpus:8;mem:4096",
    ];
    let mut rng = Rng(seed);
    let roles = roles.max(1);
    let mut out = String::from("arrival_ms,role,task,count,duration_ms\n");
    let mut t = 0f64;
    for _ in 0..jobs {
        t += -400.0 * (1.0 - rng.unit()).ln();
        let role = rng.next() as usize % roles;
        let shape = shapes[(rng.next() as usize + role) % shapes.len()];
        let u = rng.unit();
        let count = 1 + (u * u * u * 59.0) as u32;
        let duration = 2000 + (rng.unit() * 28000.0) as u64;
        out.push_str(&format!(
            "{},role{role},{shape},{count},{duration}\n",
            t as u64
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = r#"
[cluster]
allocation_interval_ms = 1000

[[agents]]
name_prefix = "h"
count = 4
resources = "cpus:16;mem:32768"
"#;

    #[test]
    fn generated_trace_parses_and_is_deterministic() {
        let a = generate(50, 3, 7);
        assert_eq!(a, generate(50, 3, 7));
        assert_ne!(a, generate(50, 3, 8));
        let jobs = parse_jobs(&a).unwrap();
        assert_eq!(jobs.len(), 50);
        assert!(jobs
            .iter()
            .all(|j| j.count >= 1 && j.role.starts_with("role")));
    }

    #[test]
    fn trace_runs_every_job_to_completion() {
        let jobs = parse_jobs(&generate(40, 2, 3)).unwrap();
        let cluster = TraceCluster::parse(CLUSTER).unwrap();
        let r = run_trace(&jobs, &cluster).unwrap();
        assert_eq!(r.json["jobs_finished"], 40);
        let jain = r.json["jain_fairness_mean"].as_f64().unwrap();
        assert!(jain > 0.5 && jain <= 1.0 + 1e-9, "jain {jain}");
        let util = r.json["utilization_mean"]["cpus"].as_f64().unwrap();
        assert!(util > 0.0 && util <= 1.0);
        assert!(r.csv.starts_with("t_ms,util_cpus,util_mem,share_"));
        assert!(r.csv.lines().count() > 2);
    }

    #[test]
    fn unschedulable_job_does_not_hang() {
        let jobs = parse_jobs(
            "arrival_ms,role,task,count,duration_ms\n0,a,cpus:64,1,1000\n0,b,cpus:1,2,1000\n",
        )
        .unwrap();
        let cluster = TraceCluster::parse(CLUSTER).unwrap();
        let r = run_trace(&jobs, &cluster).unwrap();
        assert_eq!(r.json["jobs_finished"], 1);
        assert_eq!(r.json["jobs_unfinished"], 1);
    }

    #[test]
    fn bad_traces_are_rejected() {
        assert!(parse_jobs("").is_err());
        assert!(parse_jobs("a,b\n").is_err());
        assert!(parse_jobs("arrival_ms,role,task,count,duration_ms\n1,r,cpus:x,1,1\n").is_err());
        assert!(parse_jobs("arrival_ms,role,task,count,duration_ms\n1,r,cpus:1,0,1\n").is_err());
    }

    #[test]
    fn jain_index_bounds() {
        assert!((jain(&[0.5, 0.5]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
    }
}
