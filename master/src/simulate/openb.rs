//! `gantry-master simulate --openb NODES.csv PODS.csv [--policy P] [--seeds 42-51] [--json]`:
//! the experiment of Weng et al. (USENIX ATC 2023) on Alibaba's openb GPU trace, run on
//! [`gantry_placement`] (the placement code schedulers use, not a copy).
//!
//! Per seed: the pod list, plus tasks drawn from it at random (with replacement) until the
//! tasks' GPU requests reach 130% of the cluster's GPU capacity, shuffled, arrive one at a time
//! with no departures; a task that fits nowhere fails and is skipped. Recorded: the GPU
//! allocation ratio (allocated milli-GPUs / capacity) when the arrived GPU request first reaches
//! each whole percent of capacity from 0 to 130, the failed tasks up to 130%, and the wall time
//! of each placement decision. The workload the fragmentation-aware policies score against is
//! the pod list itself (each distinct task shape weighted by how often it occurs).

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use gantry_placement::{GpuDemand, Models, Node, Placer, Policy, TaskShape, Workload};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde_json::{json, Value};

use super::bench::thread_cpu_ms;
use super::SimError;

/// Arrived GPU request, in percent of capacity, at which a run stops.
pub const MAX_PERCENT: usize = 130;

/// The parsed trace: nodes, pod list, GPU models.
#[derive(Debug, Clone)]
pub struct OpenbTrace {
    pub models: Models,
    pub nodes: Vec<Node>,
    pub tasks: Vec<TaskShape>,
}

impl OpenbTrace {
    /// Parses the node list (`sn,cpu_milli,memory_mib,gpu,model`) and a pod list (`name,
    /// cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`); columns are found by header.
    pub fn parse(nodes_csv: &str, pods_csv: &str) -> Result<OpenbTrace, SimError> {
        let mut models = Models::new();
        let mut nodes = Vec::new();
        let node_rows = Csv::parse(nodes_csv, "node list")?;
        let [cpu, mem, gpu, model] =
            node_rows.columns(["cpu_milli", "memory_mib", "gpu", "model"])?;
        for (line, row) in node_rows.rows() {
            let bad = |what: &str| SimError::Trace(format!("node list line {line}: {what}"));
            let model_name = row.get(model).copied().unwrap_or("");
            let model = models.intern(model_name).map_err(|e| bad(&e.to_string()))?;
            let gpus: usize = number(&row, gpu).ok_or_else(|| bad("bad gpu"))?;
            if gpus > 64 {
                return Err(bad("more than 64 GPUs"));
            }
            nodes.push(Node::idle(
                model,
                number(&row, cpu).ok_or_else(|| bad("bad cpu_milli"))?,
                number(&row, mem).ok_or_else(|| bad("bad memory_mib"))?,
                gpus,
            ));
        }
        if nodes.is_empty() {
            return Err(SimError::Trace("the node list has no nodes".into()));
        }
        let pod_rows = Csv::parse(pods_csv, "pod list")?;
        let [cpu, mem, num_gpu, gpu_milli] =
            pod_rows.columns(["cpu_milli", "memory_mib", "num_gpu", "gpu_milli"])?;
        let spec = pod_rows.column("gpu_spec");
        let mut tasks = Vec::new();
        for (line, row) in pod_rows.rows() {
            let bad = |what: &str| SimError::Trace(format!("pod list line {line}: {what}"));
            let n: u32 = number(&row, num_gpu).ok_or_else(|| bad("bad num_gpu"))?;
            let milli: u32 = number(&row, gpu_milli).ok_or_else(|| bad("bad gpu_milli"))?;
            let gpu = match n {
                0 => GpuDemand::None,
                1 => GpuDemand::fraction(milli).map_err(|e| bad(&e.to_string()))?,
                n => GpuDemand::whole(n),
            };
            let names = spec
                .and_then(|c| row.get(c).copied())
                .unwrap_or("")
                .split('|');
            tasks.push(TaskShape {
                cpu_milli: number(&row, cpu).ok_or_else(|| bad("bad cpu_milli"))?,
                memory_mib: number(&row, mem).ok_or_else(|| bad("bad memory_mib"))?,
                gpu,
                models: models.set(names).map_err(|e| bad(&e.to_string()))?,
            });
        }
        if tasks.iter().all(|t| t.gpu == GpuDemand::None) {
            return Err(SimError::Trace("the pod list has no GPU task".into()));
        }
        Ok(OpenbTrace {
            models,
            nodes,
            tasks,
        })
    }

    /// Milli-GPUs in the cluster.
    pub fn capacity_milli(&self) -> u64 {
        self.nodes.iter().map(Node::gpu_free_total).sum()
    }
}

fn number<T: std::str::FromStr>(row: &[&str], col: usize) -> Option<T> {
    row.get(col).and_then(|v| v.trim().parse().ok())
}

/// A header-indexed comma-separated file (the trace has no quoted fields).
struct Csv<'a> {
    what: &'static str,
    header: Vec<&'a str>,
    lines: Vec<(usize, &'a str)>,
}

impl<'a> Csv<'a> {
    fn parse(text: &'a str, what: &'static str) -> Result<Csv<'a>, SimError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty());
        let (_, header) = lines
            .next()
            .ok_or_else(|| SimError::Trace(format!("the {what} is empty")))?;
        Ok(Csv {
            what,
            header: header.split(',').map(str::trim).collect(),
            lines: lines.collect(),
        })
    }

    fn column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| *h == name)
    }

    fn columns<const N: usize>(&self, names: [&str; N]) -> Result<[usize; N], SimError> {
        let mut out = [0; N];
        for (slot, name) in out.iter_mut().zip(names) {
            *slot = self.column(name).ok_or_else(|| {
                SimError::Trace(format!("the {} has no {name:?} column", self.what))
            })?;
        }
        Ok(out)
    }

    fn rows(&self) -> impl Iterator<Item = (usize, Vec<&'a str>)> + '_ {
        self.lines
            .iter()
            .map(|&(n, l)| (n, l.split(',').map(str::trim).collect()))
    }
}

/// Parses `42-51`, `42` or `1,5,9` (and mixes: `1-3,7`).
pub fn parse_seeds(text: &str) -> Result<Vec<u64>, SimError> {
    let bad = || {
        SimError::Args(format!(
            "--seeds {text:?}: expected e.g. 42-51, 42 or 1,5,9"
        ))
    };
    let mut seeds = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => {
                let a: u64 = a.trim().parse().map_err(|_| bad())?;
                let b: u64 = b.trim().parse().map_err(|_| bad())?;
                if b < a || b - a >= 10_000 {
                    return Err(bad());
                }
                seeds.extend(a..=b);
            }
            None => seeds.push(part.parse().map_err(|_| bad())?),
        }
    }
    if seeds.is_empty() {
        return Err(bad());
    }
    Ok(seeds)
}

/// One seed's run.
#[derive(Debug, Clone)]
pub struct SeedRun {
    pub seed: u64,
    /// Allocation ratio in percent at arrived request 0%, 1%, ..., 130% of capacity.
    pub allocation_percent: Vec<f64>,
    pub arrived_tasks: usize,
    pub failed_tasks: usize,
    /// Placement decision wall times, microseconds, sorted.
    pub placement_us: Vec<f64>,
    /// Placement decision thread CPU times, microseconds, sorted (without the time spent
    /// waiting for a core on a busy machine).
    pub placement_cpu_us: Vec<f64>,
}

/// The arrival order for `seed`: the pod list plus random draws until 130% of capacity is
/// requested, shuffled.
pub fn arrivals(trace: &OpenbTrace, seed: u64) -> Vec<usize> {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let target = trace.capacity_milli() * MAX_PERCENT as u64 / 100;
    let mut order: Vec<usize> = (0..trace.tasks.len()).collect();
    let mut requested: u64 = trace.tasks.iter().map(|t| t.gpu.milli()).sum();
    // `parse` refuses lists without GPU tasks, so this ends.
    while requested < target {
        let i = rng.random_range(0..trace.tasks.len());
        order.push(i);
        requested += trace.tasks[i].gpu.milli();
    }
    order.shuffle(&mut rng);
    order
}

/// Runs one seed.
pub fn run_seed(
    trace: &OpenbTrace,
    workload: &Workload,
    policy: Policy,
    seed: u64,
) -> Result<SeedRun, SimError> {
    let typical;
    let workload = if policy == Policy::FgdArtifact {
        // The artifact scores against its typical pods, not the whole list.
        typical = Workload::typical(&trace.tasks);
        &typical
    } else {
        workload
    };
    let capacity = trace.capacity_milli();
    if capacity == 0 {
        return Err(SimError::Trace("the cluster has no GPU".into()));
    }
    let mut placer = Placer::new(trace.nodes.clone(), policy, workload.clone(), seed)
        .map_err(|e| SimError::Trace(e.to_string()))?;
    let mut allocation = Vec::with_capacity(MAX_PERCENT + 1);
    allocation.push(0.0);
    let (mut arrived, mut allocated) = (0u64, 0u64);
    let (mut arrived_tasks, mut failed_tasks) = (0, 0);
    let mut times = Vec::new();
    let mut cpu_times = Vec::new();
    for i in arrivals(trace, seed) {
        if allocation.len() > MAX_PERCENT {
            break;
        }
        let task = &trace.tasks[i];
        let start = Instant::now();
        let cpu_start = thread_cpu_ms();
        let placed = placer.place(task);
        cpu_times.push((thread_cpu_ms() - cpu_start).max(0.0) * 1e3);
        times.push(start.elapsed().as_secs_f64() * 1e6);
        arrived_tasks += 1;
        arrived += task.gpu.milli();
        match placed {
            Some(_) => allocated += task.gpu.milli(),
            None => failed_tasks += 1,
        }
        let ratio = allocated as f64 * 100.0 / capacity as f64;
        while allocation.len() <= MAX_PERCENT && arrived * 100 >= allocation.len() as u64 * capacity
        {
            allocation.push(ratio);
        }
    }
    // Only when the list stops short of 130% (it cannot: arrivals() reaches it).
    while allocation.len() <= MAX_PERCENT {
        let last = allocation.last().copied().unwrap_or(0.0);
        allocation.push(last);
    }
    times.sort_by(f64::total_cmp);
    cpu_times.sort_by(f64::total_cmp);
    Ok(SeedRun {
        seed,
        allocation_percent: allocation,
        arrived_tasks,
        failed_tasks,
        placement_us: times,
        placement_cpu_us: cpu_times,
    })
}

/// All seeds of a replay.
#[derive(Debug, Clone)]
pub struct OpenbReport {
    pub policy: Policy,
    pub nodes: usize,
    pub gpus: usize,
    pub pod_list_tasks: usize,
    pub runs: Vec<SeedRun>,
    pub wall_seconds: f64,
}

/// Runs every seed, spreading seeds over the machine's cores. Without a policy,
/// [`Policy::DEFAULT`].
pub fn run(
    trace: &OpenbTrace,
    policy: Option<Policy>,
    seeds: &[u64],
) -> Result<OpenbReport, SimError> {
    let started = Instant::now();
    let workload = Workload::from_tasks(&trace.tasks);
    let policy = policy.unwrap_or(Policy::DEFAULT);
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(seeds.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let results: Mutex<BTreeMap<usize, Result<SeedRun, SimError>>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seed) = seeds.get(k) else { break };
                let run = run_seed(trace, &workload, policy, seed);
                if let Ok(mut r) = results.lock() {
                    r.insert(k, run);
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| SimError::Trace("a replay thread panicked".into()))?;
    if results.len() != seeds.len() {
        return Err(SimError::Trace("a replay thread panicked".into()));
    }
    let runs = results.into_values().collect::<Result<Vec<_>, _>>()?;
    Ok(OpenbReport {
        policy,
        nodes: trace.nodes.len(),
        gpus: trace.nodes.iter().map(|n| n.gpu_free.len()).sum(),
        pod_list_tasks: trace.tasks.len(),
        runs,
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn timing(sorted: &[f64]) -> Value {
    json!({
        "p50": round3(percentile(sorted, 0.5)),
        "p99": round3(percentile(sorted, 0.99)),
        "max": round3(sorted.last().copied().unwrap_or(0.0)),
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

impl OpenbReport {
    /// Mean over seeds of the allocation ratio at each arrived percent.
    pub fn mean_allocation_percent(&self) -> Vec<f64> {
        let n = self.runs.len().max(1) as f64;
        (0..=MAX_PERCENT)
            .map(|x| {
                self.runs
                    .iter()
                    .map(|r| r.allocation_percent.get(x).copied().unwrap_or(0.0))
                    .sum::<f64>()
                    / n
            })
            .collect()
    }

    pub fn mean_failed_tasks(&self) -> f64 {
        self.runs.iter().map(|r| r.failed_tasks as f64).sum::<f64>() / self.runs.len().max(1) as f64
    }

    /// Every placement wall time of every seed, sorted.
    pub fn all_times(&self) -> Vec<f64> {
        self.all(|r| &r.placement_us)
    }

    /// Every placement thread CPU time of every seed, sorted.
    pub fn all_cpu_times(&self) -> Vec<f64> {
        self.all(|r| &r.placement_cpu_us)
    }

    fn all(&self, times: impl Fn(&SeedRun) -> &Vec<f64>) -> Vec<f64> {
        let mut all: Vec<f64> = self
            .runs
            .iter()
            .flat_map(|r| times(r).iter().copied())
            .collect();
        all.sort_by(f64::total_cmp);
        all
    }

    pub fn to_json(&self) -> Value {
        let seeds: Vec<Value> = self
            .runs
            .iter()
            .map(|r| {
                json!({
                    "seed": r.seed,
                    "allocation_percent": r.allocation_percent.iter().map(|&x| round3(x)).collect::<Vec<_>>(),
                    "arrived_tasks": r.arrived_tasks,
                    "failed_tasks": r.failed_tasks,
                    "placement_us": timing(&r.placement_us),
                    "placement_cpu_us": timing(&r.placement_cpu_us),
                })
            })
            .collect();
        json!({
            "policy": self.policy.name(),
            "nodes": self.nodes,
            "gpus": self.gpus,
            "pod_list_tasks": self.pod_list_tasks,
            "seeds": seeds,
            "mean_allocation_percent": self.mean_allocation_percent().iter().map(|&x| round3(x)).collect::<Vec<_>>(),
            "mean_failed_tasks": self.mean_failed_tasks(),
            "placement_us": timing(&self.all_times()),
            "placement_cpu_us": timing(&self.all_cpu_times()),
            "wall_seconds": round3(self.wall_seconds),
        })
    }

    /// The human-readable table and summary.
    pub fn write_text<W: Write>(&self, out: &mut W) -> Result<(), SimError> {
        writeln!(
            out,
            "openb replay: {} nodes, {} GPUs, {} tasks in the pod list, policy {}",
            self.nodes, self.gpus, self.pod_list_tasks, self.policy
        )?;
        write!(out, "{:>8} {:>7}", "arrived%", "mean")?;
        for r in &self.runs {
            write!(out, " {:>7}", format!("s{}", r.seed))?;
        }
        writeln!(out)?;
        let mean = self.mean_allocation_percent();
        for (x, m) in mean.iter().enumerate() {
            write!(out, "{x:>8} {m:>7.2}")?;
            for r in &self.runs {
                write!(
                    out,
                    " {:>7.2}",
                    r.allocation_percent.get(x).copied().unwrap_or(0.0)
                )?;
            }
            writeln!(out)?;
        }
        for r in &self.runs {
            writeln!(
                out,
                "seed {}: allocated {:.2}% at 100% arrived, {:.2}% at {MAX_PERCENT}%; {} of {} tasks failed; placement p50 {:.1} µs, p99 {:.1} µs",
                r.seed,
                r.allocation_percent.get(100).copied().unwrap_or(0.0),
                r.allocation_percent.get(MAX_PERCENT).copied().unwrap_or(0.0),
                r.failed_tasks,
                r.arrived_tasks,
                percentile(&r.placement_us, 0.5),
                percentile(&r.placement_us, 0.99),
            )?;
        }
        let all = self.all_times();
        let cpu = self.all_cpu_times();
        writeln!(
            out,
            "mean over {} seeds: allocated {:.2}% at 100% arrived, {:.2}% at {MAX_PERCENT}%; {:.1} tasks failed; placement p50 {:.1} µs, p99 {:.1} µs (thread CPU: p50 {:.1} µs, p99 {:.1} µs); {:.1} s",
            self.runs.len(),
            mean.get(100).copied().unwrap_or(0.0),
            mean.get(MAX_PERCENT).copied().unwrap_or(0.0),
            self.mean_failed_tasks(),
            percentile(&all, 0.5),
            percentile(&all, 0.99),
            percentile(&cpu, 0.5),
            percentile(&cpu, 0.99),
            self.wall_seconds,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
        n0,32000,65536,2,A\n\
        n1,32000,65536,4,B\n";
    const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
        p0,4000,8192,1,500,\n\
        p1,4000,8192,1,1000,B\n\
        p2,8000,8192,0,0,\n\
        p3,4000,8192,2,1000,A|B\n";

    #[test]
    fn parses_the_trace_format() {
        let t = OpenbTrace::parse(NODES, PODS).expect("parses");
        assert_eq!(t.nodes.len(), 2);
        assert_eq!(t.capacity_milli(), 6000);
        assert_eq!(t.tasks[0].gpu, GpuDemand::Fraction(500));
        assert_eq!(t.tasks[1].gpu, GpuDemand::Whole(1));
        assert!(t.tasks[1].models.accepts(t.models.get("B").expect("B")));
        assert!(!t.tasks[1].models.accepts(t.models.get("A").expect("A")));
        assert_eq!(t.tasks[2].gpu, GpuDemand::None);
        assert_eq!(t.tasks[3].gpu, GpuDemand::Whole(2));
        // Pod lists without gpu_spec (the multigpu ones) accept any model.
        let no_spec = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,250\n";
        let t = OpenbTrace::parse(NODES, no_spec).expect("parses");
        assert!(t.tasks[0].models.is_any());
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let e = OpenbTrace::parse("sn,cpu\n", PODS).expect_err("no columns");
        assert!(e.to_string().contains("no \"cpu_milli\" column"), "{e}");
        let e = OpenbTrace::parse(
            NODES,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,x\n",
        )
        .expect_err("bad number");
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = OpenbTrace::parse(
            NODES,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,0\n",
        )
        .expect_err("zero fraction");
        assert!(e.to_string().contains("milli"), "{e}");
        let e = OpenbTrace::parse(
            NODES,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,0\n",
        )
        .expect_err("no GPU task");
        assert!(e.to_string().contains("no GPU task"), "{e}");
        assert!(OpenbTrace::parse("", PODS).is_err());
    }

    #[test]
    fn seeds_parse() {
        assert_eq!(parse_seeds("42-45").ok(), Some(vec![42, 43, 44, 45]));
        assert_eq!(parse_seeds("7").ok(), Some(vec![7]));
        assert_eq!(parse_seeds("1,3-4").ok(), Some(vec![1, 3, 4]));
        assert!(parse_seeds("5-1").is_err());
        assert!(parse_seeds("x").is_err());
        assert!(parse_seeds("").is_err());
    }

    #[test]
    fn arrivals_reach_130_percent_and_are_deterministic() {
        let t = OpenbTrace::parse(NODES, PODS).expect("parses");
        let a = arrivals(&t, 42);
        assert_eq!(a, arrivals(&t, 42));
        let requested: u64 = a.iter().map(|&i| t.tasks[i].gpu.milli()).sum();
        assert!(requested * 100 >= t.capacity_milli() * 130);
        // Every listed task arrives at least once.
        for i in 0..t.tasks.len() {
            assert!(a.contains(&i));
        }
    }

    #[test]
    fn a_small_replay_has_131_points_and_sane_values() {
        let t = OpenbTrace::parse(NODES, PODS).expect("parses");
        for policy in Policy::ALL {
            let report = run(&t, Some(policy), &[1, 2]).expect("runs");
            let mean = report.mean_allocation_percent();
            assert_eq!(mean.len(), MAX_PERCENT + 1);
            assert_eq!(mean[0], 0.0);
            for r in &report.runs {
                assert_eq!(r.allocation_percent.len(), MAX_PERCENT + 1);
                // Never more allocated than arrived, never above capacity, never decreasing.
                for (x, w) in r.allocation_percent.windows(2).enumerate() {
                    assert!(w[0] <= w[1]);
                    assert!(w[1] <= 100.0 + 1e-9);
                    assert!(w[0] <= x as f64 + 100.0 * 4.0 / 6.0, "{x}: {}", w[0]);
                }
                assert_eq!(r.placement_us.len(), r.arrived_tasks);
            }
            let json = report.to_json();
            assert_eq!(
                json["mean_allocation_percent"].as_array().map(Vec::len),
                Some(MAX_PERCENT + 1)
            );
        }
    }
}
