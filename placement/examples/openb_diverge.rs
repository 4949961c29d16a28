//! Where two placement policies diverge on the openb replay (a diagnostic beside
//! `gantry-master simulate --openb-compare`, which gives the statistics of record).
//!
//! ```sh
//! T=../shared/traces/alibaba-openb
//! cargo run --release -p gantry-placement --example openb_diverge -- \
//!     $T/openb_node_list_gpu_node.csv $T/openb_pod_list_multigpu40.csv fgd-scarce fgd 42-51
//! cargo run --release -p gantry-placement --example openb_diverge -- \
//!     $T/openb_node_list_gpu_node.csv $T/openb_pod_list_multigpu40.csv fgd-fill fgd 42 --trace 0-100
//! ```
//!
//! Without `--trace`: the same arrival sequences as the simulator (the pod list plus draws to
//! 130% of the GPU capacity, shuffled per seed) through both policies, the paired difference
//! A − B at 100% arrived and over 50–130% (mean ± 95% half-width), then for each policy the
//! failed tasks by GPU demand up to 100% arrived and where the free GPU is at 100% arrived, per
//! node type: on idle nodes, idle GPUs on used nodes, partly used GPUs (slivers), and free GPU
//! on nodes with under 4 cores free.
//!
//! With `--trace FROM-TO` (one seed): A places every task; B chooses on A's state (the same
//! nodes, kept current with `Placer::set_free`) without committing; the placements where B
//! would take a node in another state (or another GPU), between FROM% and TO% arrived, are
//! counted by (task, A's node, B's node) and the most frequent printed.
//!
//! The parsing is a minimal copy of `master/src/simulate/openb.rs` (the trace has no quoted
//! fields); the arrivals are the simulator's (same generator and seed use).

use std::collections::BTreeMap;
use std::error::Error;

use gantry_placement::{GpuDemand, Models, Node, Placer, Policy, TaskShape, Workload};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

type Res<T> = Result<T, Box<dyn Error>>;

struct Trace {
    nodes: Vec<Node>,
    tasks: Vec<TaskShape>,
    models: Models,
}

fn field<T: std::str::FromStr>(row: &[&str], col: usize, line: usize) -> Res<T> {
    row.get(col)
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("line {line}: bad column {col}").into())
}

fn parse(nodes_csv: &str, pods_csv: &str) -> Res<Trace> {
    let mut models = Models::new();
    let mut nodes = Vec::new();
    for (line, l) in nodes_csv.lines().enumerate().skip(1) {
        let c: Vec<&str> = l.split(',').collect();
        if l.trim().is_empty() {
            continue;
        }
        let model = models.intern(c.get(4).map_or("", |m| m.trim()))?;
        nodes.push(Node::idle(
            model,
            field(&c, 1, line + 1)?,
            field(&c, 2, line + 1)?,
            field(&c, 3, line + 1)?,
        ));
    }
    let mut lines = pods_csv.lines();
    let header: Vec<&str> = lines.next().ok_or("empty pod list")?.split(',').collect();
    let col = |n: &str| -> Res<usize> {
        header
            .iter()
            .position(|h| h.trim() == n)
            .ok_or_else(|| format!("the pod list has no {n} column").into())
    };
    let (cpu, mem, ng, gm) = (
        col("cpu_milli")?,
        col("memory_mib")?,
        col("num_gpu")?,
        col("gpu_milli")?,
    );
    let spec = col("gpu_spec").ok();
    let mut tasks = Vec::new();
    for (line, l) in lines.enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let c: Vec<&str> = l.split(',').collect();
        let n: u32 = field(&c, ng, line + 2)?;
        let milli: u32 = field(&c, gm, line + 2)?;
        let gpu = match n {
            0 => GpuDemand::None,
            1 => GpuDemand::fraction(milli)?,
            n => GpuDemand::whole(n),
        };
        let names = spec.and_then(|s| c.get(s).copied()).unwrap_or("");
        tasks.push(TaskShape {
            cpu_milli: field(&c, cpu, line + 2)?,
            memory_mib: field(&c, mem, line + 2)?,
            gpu,
            models: models.set(names.split('|'))?,
        });
    }
    Ok(Trace {
        nodes,
        tasks,
        models,
    })
}

fn capacity(nodes: &[Node]) -> u64 {
    nodes.iter().map(Node::gpu_free_total).sum()
}

fn arrivals(t: &Trace, seed: u64) -> Vec<usize> {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let target = capacity(&t.nodes) * 130 / 100;
    let mut order: Vec<usize> = (0..t.tasks.len()).collect();
    let mut requested: u64 = t.tasks.iter().map(|x| x.gpu.milli()).sum();
    while requested < target && !t.tasks.is_empty() {
        let i = rng.random_range(0..t.tasks.len());
        order.push(i);
        requested += t.tasks[i].gpu.milli();
    }
    order.shuffle(&mut rng);
    order
}

fn workload(t: &Trace, policy: Policy) -> Workload {
    if policy == Policy::FgdArtifact {
        Workload::typical(&t.tasks)
    } else {
        Workload::from_tasks(&t.tasks)
    }
}

fn demand(t: &TaskShape) -> String {
    match t.gpu {
        GpuDemand::None => "cpu-only".into(),
        GpuDemand::Fraction(_) => "fraction".into(),
        GpuDemand::Whole(k) => format!("{k} GPU"),
    }
}

fn node_type(models: &Models, n: &Node) -> String {
    format!(
        "{}x{} {}c",
        models.name(n.model).unwrap_or("?"),
        n.gpu_free.len(),
        n.cpu_capacity / 1000
    )
}

#[derive(Default)]
struct Run {
    curve: Vec<f64>,
    /// Failed up to 100% arrived: (tasks, milli-GPU) by demand.
    failed: BTreeMap<String, (u64, u64)>,
    /// Free milli-GPU at 100% arrived by node type: idle nodes, idle GPUs on used nodes,
    /// slivers, on nodes with under 4 cores free.
    free: BTreeMap<String, [u64; 4]>,
}

fn run(t: &Trace, policy: Policy, seed: u64) -> Res<Run> {
    let cap = capacity(&t.nodes);
    let mut placer = Placer::new(t.nodes.clone(), policy, workload(t, policy), seed)?;
    let mut r = Run {
        curve: vec![0.0],
        ..Run::default()
    };
    let (mut arrived, mut allocated) = (0u64, 0u64);
    for i in arrivals(t, seed) {
        if r.curve.len() > 130 {
            break;
        }
        let task = &t.tasks[i];
        let placed = placer.place(task).is_some();
        arrived += task.gpu.milli();
        if placed {
            allocated += task.gpu.milli();
        } else if arrived <= cap {
            let e = r.failed.entry(demand(task)).or_default();
            e.0 += 1;
            e.1 += task.gpu.milli();
        }
        while r.curve.len() <= 130 && arrived * 100 >= r.curve.len() as u64 * cap {
            if r.curve.len() == 100 {
                for n in placer.nodes() {
                    let e = r.free.entry(node_type(&t.models, n)).or_default();
                    let idle = n.gpu_free.iter().filter(|&&f| f == 1000).count() as u64;
                    if idle as usize == n.gpu_free.len() {
                        e[0] += idle * 1000;
                    } else {
                        e[1] += idle * 1000;
                        e[2] += n.gpu_free_total() - idle * 1000;
                    }
                    if n.cpu_free < 4000 {
                        e[3] += n.gpu_free_total();
                    }
                }
            }
            r.curve.push(allocated as f64 * 100.0 / cap as f64);
        }
    }
    while r.curve.len() <= 130 {
        let last = r.curve.last().copied().unwrap_or(0.0);
        r.curve.push(last);
    }
    Ok(r)
}

/// Mean and 95% half-width (normal quantile: a diagnostic, not the table of record).
fn mean_ci(xs: &[f64]) -> (f64, f64) {
    let n = xs.len().max(1) as f64;
    let m = xs.iter().sum::<f64>() / n;
    let v = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (m, 1.96 * (v / n).sqrt())
}

fn describe(models: &Models, n: &Node) -> String {
    let idle = n.gpu_free.iter().filter(|&&f| f == 1000).count();
    let mut part: Vec<u32> = n
        .gpu_free
        .iter()
        .copied()
        .filter(|&f| f > 0 && f < 1000)
        .collect();
    part.sort_unstable();
    format!(
        "{} idle {idle} partly {part:?} cores free {}",
        node_type(models, n),
        n.cpu_free / 1000
    )
}

fn trace(t: &Trace, a: Policy, b: Policy, seed: u64, from: u64, to: u64) -> Res<()> {
    let cap = capacity(&t.nodes);
    let mut pa = Placer::new(t.nodes.clone(), a, workload(t, a), seed)?;
    let mut pb = Placer::new(t.nodes.clone(), b, workload(t, b), seed)?;
    let mut arrived = 0u64;
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0;
    for i in arrivals(t, seed) {
        let task = &t.tasks[i];
        arrived += task.gpu.milli();
        if arrived * 100 > cap * to {
            break;
        }
        let (ca, cb) = (pa.choose(task), pb.choose(task));
        let counted = arrived * 100 >= cap * from;
        match (&ca, &cb) {
            (Some(x), Some(y)) => {
                let (na, nb) = (&pa.nodes()[x.node], &pa.nodes()[y.node]);
                let ga = x.gpus.first().map(|g| na.gpu_free[g.gpu]);
                let gb = y.gpus.first().map(|g| nb.gpu_free[g.gpu]);
                if counted && (na != nb || ga != gb) {
                    total += 1;
                    let key = format!(
                        "{:?} {}c | A: {} (GPU free {ga:?}) | B: {} (GPU free {gb:?})",
                        task.gpu,
                        task.cpu_milli / 1000,
                        describe(&t.models, na),
                        describe(&t.models, nb)
                    );
                    *counts.entry(key).or_default() += 1;
                }
            }
            (None, Some(_)) if counted => {
                total += 1;
                *counts
                    .entry(format!("{:?}: A fails, B fits", task.gpu))
                    .or_default() += 1;
            }
            _ => {}
        }
        if let Some(x) = &ca {
            pa.commit(x, task)?;
            let n = pa.nodes()[x.node].clone();
            pb.set_free(x.node, n.cpu_free, n.memory_free, &n.gpu_free)?;
        }
    }
    let mut rows: Vec<_> = counts.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1));
    println!("seed {seed}: {total} placements where {b} would choose otherwise on {a}'s state, {from}–{to}% arrived");
    for (k, c) in rows.iter().take(40) {
        println!("{c:>5} {k}");
    }
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage =
        "usage: openb_diverge NODES.csv PODS.csv POLICY_A POLICY_B SEEDS(a-b) [--trace FROM-TO]";
    let [_, nodes, pods, a, b, seeds, rest @ ..] = args.as_slice() else {
        return Err(usage.into());
    };
    let t = parse(
        &std::fs::read_to_string(nodes)?,
        &std::fs::read_to_string(pods)?,
    )?;
    let (a, b): (Policy, Policy) = (a.parse()?, b.parse()?);
    let (s0, s1) = seeds.split_once('-').unwrap_or((seeds, seeds));
    let seeds: Vec<u64> = (s0.parse()?..=s1.parse()?).collect();
    if let [flag, range] = rest {
        let (from, to) = range.split_once('-').ok_or(usage)?;
        if flag != "--trace" {
            return Err(usage.into());
        }
        return trace(&t, a, b, seeds[0], from.parse()?, to.parse()?);
    }
    let mut runs = Vec::new();
    for &seed in &seeds {
        runs.push((run(&t, a, seed)?, run(&t, b, seed)?));
    }
    let window = |r: &Run| r.curve[50..].iter().sum::<f64>() / 81.0;
    let d100: Vec<f64> = runs
        .iter()
        .map(|(x, y)| x.curve[100] - y.curve[100])
        .collect();
    let dwin: Vec<f64> = runs.iter().map(|(x, y)| window(x) - window(y)).collect();
    let ((m, h), (mw, hw)) = (mean_ci(&d100), mean_ci(&dwin));
    let n = runs.len() as f64;
    println!(
        "{}: {a} {:.2} / {b} {:.2} at 100%; A − B at 100% {m:+.3} ± {h:.3}, over 50–130% {mw:+.3} ± {hw:.3}; seeds A > B {} / A < B {}",
        pods.rsplit('/').next().unwrap_or(pods),
        runs.iter().map(|r| r.0.curve[100]).sum::<f64>() / n,
        runs.iter().map(|r| r.1.curve[100]).sum::<f64>() / n,
        d100.iter().filter(|&&d| d > 0.0).count(),
        d100.iter().filter(|&&d| d < 0.0).count()
    );
    for (name, policy, pick) in [("A", a, 0), ("B", b, 1)] {
        let mut failed: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut free: BTreeMap<String, [u64; 4]> = BTreeMap::new();
        for r in &runs {
            let r = if pick == 0 { &r.0 } else { &r.1 };
            for (k, v) in &r.failed {
                let e = failed.entry(k.clone()).or_default();
                (e.0, e.1) = (e.0 + v.0, e.1 + v.1);
            }
            for (k, v) in &r.free {
                let e = free.entry(k.clone()).or_default();
                for (x, y) in e.iter_mut().zip(v) {
                    *x += y;
                }
            }
        }
        print!("{name} = {policy}, failed to 100% arrived (mean tasks, GPUs):");
        for (k, v) in &failed {
            print!(
                " {k} {:.1} ({:.1})",
                v.0 as f64 / n,
                v.1 as f64 / n / 1000.0
            );
        }
        println!();
        println!("  free GPUs at 100% arrived: on idle nodes / idle on used nodes / slivers / on nodes under 4 cores free");
        for (k, v) in &free {
            let g = |x: u64| x as f64 / n / 1000.0;
            println!(
                "  {k:<18} {:>7.1} {:>7.1} {:>7.1} {:>7.1}",
                g(v[0]),
                g(v[1]),
                g(v[2]),
                g(v[3])
            );
        }
    }
    Ok(())
}
