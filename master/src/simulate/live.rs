//! `gantry-master simulate --openb NODES.csv PODS.csv --live`: the openb replay through the
//! master's state core ([`crate::state::Master`]) and its allocator, with the allocation rate
//! a user gets beside the cluster-wide one for the same seeds.
//!
//! Per seed: each openb node registers as an emulated agent (its CPU, memory and GPUs, named
//! by model, one `GpuInfo` per GPU); one framework subscribes with the GPU capability and holds
//! every offer it is made. Tasks arrive in [`super::openb::arrivals`] order (the cluster-wide
//! replay's order); for each, the framework scores the agents it holds offers on with
//! [`gantry_placement::across::OfferPlacer`] (the same policy as the cluster-wide replay, the
//! pod list as the workload), accepts that agent's offers with the task (a fraction pins the
//! GPU chosen; `refuse_seconds = 0`), and the master validates the accept, launches the task
//! and, in the next allocation cycle, offers the rest of the agent again. A task that fits no
//! offer held fails and is skipped, as in the paper's protocol. The allocation counted is what
//! the master launched (its `RunTask` messages), so the number includes every check the
//! master makes; an accept the master refuses is a failed task and is reported.
//!
//! With `--frameworks N`, every seed runs once more with the arrivals split round-robin
//! between N frameworks, each subscribed in its own role so that the allocator's DRF shares the
//! agents between them; each holds the offers it is made and places only its own tasks across
//! them, and the report puts that allocation beside the one-framework run. A task needing a
//! GPU model that fits none of its framework's offers is declared (`SetDemand` with its models,
//! `|`-separated): the allocator reclaims an idle offer of that model from another framework
//! (`allocator::models`) and the framework tries once more. Any other task that fits none of
//! its framework's offers fails even when another framework holds room.
//!
//! No I/O and no clock inside the core: the emulated agents never answer (tasks stay
//! staging, which holds their resources as running would), and simulated time stands still
//! (no timer fires; offers have no timeout).

use gantry_placement::across::OfferPlacer;
use gantry_placement::{Policy, TaskShape, Workload};
use gantry_proto::messages::{AgentToMaster, FrameworkToMaster, MasterToAgent, MasterToFramework};
use gantry_proto::{
    Capability, Demand, FrameworkInfo, GpuInfo, GpuSelector, Offer, Operation, Resources, TaskId,
    TaskInfo,
};

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde_json::{json, Value};

use super::compare::{paired, Interval, WINDOW_FROM};
use super::openb::{self, arrivals, OpenbTrace, SeedRun, MAX_PERCENT};
use super::SimError;
use crate::allocator::Millis;
use crate::state::{ConnId, Input, Master, MasterConfig, Output};

/// The first framework's connection id (agents use `1..=nodes`; framework `k` is
/// `FRAMEWORK - k`).
const FRAMEWORK: ConnId = u64::MAX - 1;

/// The most frameworks `--frameworks` takes.
pub const MAX_FRAMEWORKS: usize = 64;

/// Framework `k`'s connection id.
fn framework_conn(k: usize) -> ConnId {
    FRAMEWORK - k as ConnId
}

/// One seed through the master.
#[derive(Debug, Clone)]
pub struct LiveRun {
    pub seed: u64,
    /// Frameworks the arrivals were split between.
    pub frameworks: usize,
    /// Allocation ratio in percent at arrived request 0%, 1%, ..., 130% of capacity.
    pub allocation_percent: Vec<f64>,
    pub arrived_tasks: usize,
    pub failed_tasks: usize,
    /// Accepts the master refused (a task ended in an error instead of launching): 0 when the
    /// framework's view of its offers is right.
    pub refused_accepts: usize,
    /// Offers the frameworks received.
    pub offers: usize,
    /// Offers rescinded from a framework (reclaimed for another's GPU-model demand).
    pub rescinds: usize,
    /// Tasks each framework launched.
    pub launched: Vec<usize>,
}

fn resources(cpu_milli: u64, memory_mib: u64, gpu_milli: u64) -> Resources {
    let mut r = Resources::default();
    r.set_milli("cpus", cpu_milli);
    r.set_milli("mem", memory_mib * 1000);
    if gpu_milli > 0 {
        r.set_milli("gpus", gpu_milli);
    }
    r
}

/// The offers in `out` sent to framework `k`.
fn offers_in(out: &[Output], k: usize) -> Vec<Offer> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(c, MasterToFramework::Offers(v)) if *c == framework_conn(k) => {
                Some(v.clone())
            }
            _ => None,
        })
        .flatten()
        .collect()
}

/// Hands each framework's placer what `out` sent it: rescinds (forgotten), then offers.
/// Returns the offers and the rescinds.
fn deliver(out: &[Output], placers: &mut [OfferPlacer]) -> Result<(usize, usize), String> {
    let mut rescinds = 0;
    for o in out {
        if let Output::ToFramework(c, MasterToFramework::Rescind { offer_id }) = o {
            if let Some(placer) = (0..placers.len())
                .find(|k| framework_conn(*k) == *c)
                .and_then(|k| placers.get_mut(k))
            {
                placer.rescind(*offer_id).map_err(|e| e.to_string())?;
                rescinds += 1;
            }
        }
    }
    let mut offers = 0;
    for (k, placer) in placers.iter_mut().enumerate() {
        let next = offers_in(out, k);
        offers += next.len();
        placer.add_offers(&next).map_err(|e| e.to_string())?;
    }
    Ok((offers, rescinds))
}

/// A demand for one task of `task`'s shape (with its GPU models, `|`-separated, when it
/// names some), or none.
fn demand_for(trace: &OpenbTrace, task: Option<&TaskShape>) -> FrameworkToMaster {
    let demands = task
        .map(|t| {
            let d = Demand::new(resources(t.cpu_milli, t.memory_mib, t.gpu.milli()), 1);
            let names: Vec<&str> = t.models.names(&trace.models).collect();
            d.with_gpu_model(names.join("|"))
        })
        .into_iter()
        .collect();
    FrameworkToMaster::SetDemand { demands }
}

/// Runs one seed of `trace` through the master with `policy`, the arrivals split round-robin
/// between `frameworks` frameworks (each its own role, so that the allocator's DRF shares the
/// agents between them); each holds the offers it is made and places its own tasks across
/// them only.
pub fn run_seed(
    trace: &OpenbTrace,
    workload: &Workload,
    policy: Policy,
    seed: u64,
    frameworks: usize,
) -> Result<LiveRun, SimError> {
    let sim = |m: String| SimError::Trace(format!("live replay, seed {seed}: {m}"));
    let capacity = trace.capacity_milli();
    if capacity == 0 {
        return Err(SimError::Trace("the cluster has no GPU".into()));
    }
    if !(1..=MAX_FRAMEWORKS).contains(&frameworks) {
        return Err(SimError::Args(format!(
            "--frameworks must be 1 to {MAX_FRAMEWORKS}, not {frameworks}"
        )));
    }
    let config = MasterConfig {
        allocation_min_gap_ms: 0,
        gpu_placement: policy,
        ..MasterConfig::default()
    };
    let mut master = Master::new(config, u128::from(seed) + 1);
    let now: Millis = 1;
    let mut out = Vec::new();
    // The agents.
    for (i, node) in trace.nodes.iter().enumerate() {
        let conn = i as ConnId + 1;
        let model = trace.models.name(node.model).unwrap_or("").to_string();
        let gpus: Vec<GpuInfo> = (0..node.gpu_free.len() as u32)
            .map(|g| GpuInfo {
                uuid: format!("GPU-{i}-{g}"),
                name: model.clone(),
                memory_mib: 16_384,
                compute_capability: (8, 0),
                minor: g,
                pci_bus_id: format!("00000000:{g:02x}:00.0"),
                numa_node: Some(0),
                pci_root: None,
                healthy: true,
                mig_profile: None,
                parent_uuid: None,
            })
            .collect();
        master.handle_into(
            Input::AgentConnected {
                conn,
                name: format!("node-{i}"),
                address: "127.0.0.1:1".into(),
            },
            now,
            &mut out,
        );
        master.handle_into(
            Input::Agent {
                conn,
                msg: AgentToMaster::Register {
                    agent_id: None,
                    hostname: format!("node-{i}"),
                    resources: resources(
                        node.cpu_capacity,
                        node.memory_capacity,
                        node.gpu_free.len() as u64 * 1000,
                    ),
                    reserved: Default::default(),
                    attributes: Default::default(),
                    gpus,
                    running_tasks: vec![],
                    pending_updates: vec![],
                    task_user: "nobody".into(),
                },
            },
            now,
            &mut out,
        );
    }
    let registered = out
        .iter()
        .filter(|o| matches!(o, Output::ToAgent(_, MasterToAgent::Registered { .. })))
        .count();
    if registered != trace.nodes.len() {
        return Err(sim(format!(
            "{registered} of {} agents registered",
            trace.nodes.len()
        )));
    }
    out.clear();
    // The frameworks, one role each.
    for k in 0..frameworks {
        let name = if frameworks == 1 {
            "openb".to_string()
        } else {
            format!("openb-{k}")
        };
        master.handle_into(
            Input::FrameworkConnected {
                conn: framework_conn(k),
                principal: name.clone(),
            },
            now,
            &mut out,
        );
        master.handle_into(
            Input::Framework {
                conn: framework_conn(k),
                msg: FrameworkToMaster::Subscribe(FrameworkInfo {
                    framework_id: None,
                    name: name.clone(),
                    roles: vec![name],
                    capabilities: vec![Capability::GpuResources],
                    failover_timeout_secs: 3600.0,
                    min_allocatable: Vec::new(),
                    suppressed_roles: Vec::new(),
                }),
            },
            now,
            &mut out,
        );
    }
    let subscribed = out
        .iter()
        .filter(|o| {
            matches!(
                o,
                Output::ToFramework(_, MasterToFramework::Subscribed { .. })
            )
        })
        .count();
    if subscribed != frameworks {
        return Err(sim(format!(
            "{subscribed} of {frameworks} frameworks subscribed"
        )));
    }
    out.clear();
    master.allocate(now, &mut out);
    let mut placers: Vec<OfferPlacer> = (0..frameworks)
        .map(|k| {
            OfferPlacer::new(
                trace.models.clone(),
                policy,
                workload.clone(),
                seed.wrapping_add(k as u64),
            )
        })
        .collect();
    let (mut offers, first_rescinds) = deliver(&out, &mut placers).map_err(sim)?;
    let mut rescinds = first_rescinds;
    let held: usize = placers.iter().map(OfferPlacer::agents).sum();
    if held != trace.nodes.len() {
        return Err(sim(format!(
            "offers came for {held} of {} agents",
            trace.nodes.len()
        )));
    }
    let mut allocation = Vec::with_capacity(MAX_PERCENT + 1);
    allocation.push(0.0);
    let (mut arrived, mut allocated) = (0u64, 0u64);
    let (mut arrived_tasks, mut failed_tasks, mut refused_accepts) = (0, 0, 0);
    let mut launched_by = vec![0; frameworks];
    for i in arrivals(trace, seed) {
        if allocation.len() > MAX_PERCENT {
            break;
        }
        let task: &TaskShape = &trace.tasks[i];
        let owner = arrived_tasks % frameworks;
        arrived_tasks += 1;
        arrived += task.gpu.milli();
        let mut choice = placers[owner].place(task);
        if choice.is_none() && !task.models.is_any() {
            // A task that needs a GPU model none of its offers has room on: the framework
            // declares it (the allocator reclaims idle offers of that model others hold and
            // offers one to it first), tries once more, and withdraws the demand.
            for demand in [Some(task), None] {
                out.clear();
                master.handle_into(
                    Input::Framework {
                        conn: framework_conn(owner),
                        msg: demand_for(trace, demand),
                    },
                    now,
                    &mut out,
                );
                if demand.is_some() {
                    master.allocate(now, &mut out);
                    let (o, r) = deliver(&out, &mut placers).map_err(sim)?;
                    offers += o;
                    rescinds += r;
                    choice = placers[owner].place(task);
                }
            }
        }
        let placer = &mut placers[owner];
        let launched = match choice {
            None => false,
            Some(choice) => {
                let offer_ids = placer
                    .used(choice.agent_id)
                    .map_err(|e| sim(e.to_string()))?;
                let info = TaskInfo {
                    task_id: TaskId::from_u128(arrived_tasks as u128),
                    name: format!("pod-{i}"),
                    command: "true".into(),
                    resources: resources(task.cpu_milli, task.memory_mib, task.gpu.milli()),
                    env: Default::default(),
                    kill_grace_secs: None,
                    gpu_selector: choice.gpu.map(|uuid| GpuSelector {
                        uuids: vec![uuid],
                        ..Default::default()
                    }),
                    container: None,
                };
                out.clear();
                master.handle_into(
                    Input::Framework {
                        conn: framework_conn(owner),
                        msg: FrameworkToMaster::Accept {
                            offer_ids,
                            operations: vec![Operation::Launch { tasks: vec![info] }],
                            refuse_seconds: Some(0.0),
                        },
                    },
                    now,
                    &mut out,
                );
                let ran = out
                    .iter()
                    .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::RunTask { .. })));
                // The rest of the agent comes back in the next cycle.
                out.clear();
                master.allocate(now, &mut out);
                let (o, r) = deliver(&out, &mut placers).map_err(sim)?;
                offers += o;
                rescinds += r;
                if !ran {
                    refused_accepts += 1;
                }
                ran
            }
        };
        if launched {
            launched_by[owner] += 1;
            allocated += task.gpu.milli();
        } else {
            failed_tasks += 1;
        }
        let ratio = allocated as f64 * 100.0 / capacity as f64;
        while allocation.len() <= MAX_PERCENT && arrived * 100 >= allocation.len() as u64 * capacity
        {
            allocation.push(ratio);
        }
    }
    while allocation.len() <= MAX_PERCENT {
        let last = allocation.last().copied().unwrap_or(0.0);
        allocation.push(last);
    }
    Ok(LiveRun {
        seed,
        frameworks,
        allocation_percent: allocation,
        arrived_tasks,
        failed_tasks,
        refused_accepts,
        offers,
        rescinds,
        launched: launched_by,
    })
}

/// A seed's allocation at 100% arrived and its mean over 50–130% arrived.
fn points(curve: &[f64]) -> (f64, f64) {
    let w = &curve[WINDOW_FROM.min(curve.len())..];
    let mean = if w.is_empty() {
        0.0
    } else {
        w.iter().sum::<f64>() / w.len() as f64
    };
    (curve.get(100).copied().unwrap_or(0.0), mean)
}

/// Every seed, live and cluster-wide.
#[derive(Debug, Clone)]
pub struct LiveReport {
    pub list: String,
    pub policy: Policy,
    /// Per seed: the live run (one framework) and the cluster-wide run of the same arrivals.
    pub runs: Vec<(LiveRun, SeedRun)>,
    /// With `--frameworks N` (N > 1), per seed: the same arrivals split between N frameworks
    /// competing for offers (in `runs`' order); empty otherwise.
    pub several: Vec<LiveRun>,
    pub wall_seconds: f64,
}

/// Runs every seed live (one framework, and `frameworks` of them when more than one) and
/// cluster-wide (seeds spread over the machine's cores), a progress line per seed on
/// `progress`.
pub fn run<P: Write + Send>(
    trace: &OpenbTrace,
    list: &str,
    policy: Policy,
    seeds: &[u64],
    frameworks: usize,
    progress: &mut P,
) -> Result<LiveReport, SimError> {
    if !(1..=MAX_FRAMEWORKS).contains(&frameworks) {
        return Err(SimError::Args(format!(
            "--frameworks must be 1 to {MAX_FRAMEWORKS}, not {frameworks}"
        )));
    }
    let started = Instant::now();
    let workload = Workload::from_tasks(&trace.tasks);
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(seeds.len())
        .max(1);
    let next = AtomicUsize::new(0);
    type Pair = Result<(LiveRun, SeedRun, Option<LiveRun>), SimError>;
    let results: Mutex<BTreeMap<usize, Pair>> = Mutex::new(BTreeMap::new());
    let progress = Mutex::new(progress);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seed) = seeds.get(k) else { break };
                let t = Instant::now();
                let pair = run_seed(trace, &workload, policy, seed, 1).and_then(|live| {
                    let wide = openb::run_seed(trace, &workload, policy, seed)?;
                    let several = if frameworks > 1 {
                        Some(run_seed(trace, &workload, policy, seed, frameworks)?)
                    } else {
                        None
                    };
                    Ok((live, wide, several))
                });
                if let (Ok((l, w, m)), Ok(mut p)) = (&pair, progress.lock()) {
                    let at100 = |c: &[f64]| c.get(100).copied().unwrap_or(0.0);
                    let several = m
                        .as_ref()
                        .map(|m| {
                            format!(
                                ", {frameworks} frameworks {:.2}%",
                                at100(&m.allocation_percent)
                            )
                        })
                        .unwrap_or_default();
                    let _ = writeln!(
                        p,
                        "{list} seed {seed}: live {:.2}%{several}, cluster-wide {:.2}% at 100% arrived ({:.1} s)",
                        at100(&l.allocation_percent),
                        at100(&w.allocation_percent),
                        t.elapsed().as_secs_f64()
                    );
                }
                if let Ok(mut r) = results.lock() {
                    r.insert(k, pair);
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
    let mut runs = Vec::with_capacity(seeds.len());
    let mut several = Vec::new();
    for r in results.into_values() {
        let (l, w, m) = r?;
        runs.push((l, w));
        several.extend(m);
    }
    Ok(LiveReport {
        list: list.to_string(),
        policy,
        runs,
        several,
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}

impl LiveReport {
    /// `(live mean, cluster-wide mean, paired live − cluster-wide)` at 100% arrived, then over
    /// 50–130%.
    pub fn rows(&self) -> [(f64, f64, Interval); 2] {
        let n = self.runs.len().max(1) as f64;
        let row = |pick: fn((f64, f64)) -> f64| {
            let live: Vec<f64> = self
                .runs
                .iter()
                .map(|(l, _)| pick(points(&l.allocation_percent)))
                .collect();
            let wide: Vec<f64> = self
                .runs
                .iter()
                .map(|(_, w)| pick(points(&w.allocation_percent)))
                .collect();
            let diffs: Vec<f64> = live.iter().zip(&wide).map(|(l, w)| l - w).collect();
            (
                live.iter().sum::<f64>() / n,
                wide.iter().sum::<f64>() / n,
                paired(&diffs).unwrap_or(Interval {
                    mean: 0.0,
                    half_width: 0.0,
                    n: 0,
                }),
            )
        };
        [row(|p| p.0), row(|p| p.1)]
    }

    /// With several frameworks: `(several mean, paired several − one framework)` at 100%
    /// arrived, then over 50–130%; `None` with one framework.
    pub fn several_rows(&self) -> Option<[(f64, Interval); 2]> {
        if self.several.is_empty() || self.several.len() != self.runs.len() {
            return None;
        }
        let n = self.several.len() as f64;
        let row = |pick: fn((f64, f64)) -> f64| {
            let many: Vec<f64> = self
                .several
                .iter()
                .map(|m| pick(points(&m.allocation_percent)))
                .collect();
            let diffs: Vec<f64> = many
                .iter()
                .zip(&self.runs)
                .map(|(m, (l, _))| m - pick(points(&l.allocation_percent)))
                .collect();
            (
                many.iter().sum::<f64>() / n,
                paired(&diffs).unwrap_or(Interval {
                    mean: 0.0,
                    half_width: 0.0,
                    n: 0,
                }),
            )
        };
        Some([row(|p| p.0), row(|p| p.1)])
    }

    /// How many frameworks the `several` runs split the arrivals between (1 without them).
    pub fn frameworks(&self) -> usize {
        self.several.first().map_or(1, |m| m.frameworks)
    }

    pub fn to_json(&self) -> Value {
        let [at100, window] = self.rows();
        let row = |r: (f64, f64, Interval)| {
            json!({
                "live": r.0, "cluster_wide": r.1,
                "diff": r.2.mean, "low": r.2.low(), "high": r.2.high(),
            })
        };
        let several = self.several_rows().map(|[at100, window]| {
            let row = |r: (f64, Interval)| {
                json!({
                    "several": r.0, "diff_from_one": r.1.mean,
                    "low": r.1.low(), "high": r.1.high(),
                })
            };
            json!({
                "frameworks": self.frameworks(),
                "at_100": row(at100),
                "window_50_130": row(window),
                "seeds": self.several.iter().map(|m| json!({
                    "seed": m.seed,
                    "at_100": points(&m.allocation_percent).0,
                    "failed_tasks": m.failed_tasks,
                    "refused_accepts": m.refused_accepts,
                    "offers": m.offers,
                    "rescinds": m.rescinds,
                })).collect::<Vec<_>>(),
            })
        });
        json!({
            "list": self.list,
            "policy": self.policy.name(),
            "several_frameworks": several,
            "seeds": self.runs.iter().map(|(l, w)| json!({
                "seed": l.seed,
                "live_at_100": points(&l.allocation_percent).0,
                "cluster_wide_at_100": points(&w.allocation_percent).0,
                "live_failed_tasks": l.failed_tasks,
                "cluster_wide_failed_tasks": w.failed_tasks,
                "refused_accepts": l.refused_accepts,
                "offers": l.offers,
            })).collect::<Vec<_>>(),
            "at_100": row(at100),
            "window_50_130": row(window),
            "wall_seconds": self.wall_seconds,
        })
    }

    pub fn write_text<W: Write>(&self, out: &mut W) -> Result<(), SimError> {
        let [at100, window] = self.rows();
        writeln!(
            out,
            "openb live replay of {} ({} seeds, policy {}): through the master's state core and allocator, one framework placing across the offers it holds",
            self.list,
            self.runs.len(),
            self.policy
        )?;
        for (l, w) in &self.runs {
            writeln!(
                out,
                "seed {}: live {:.2}% / cluster-wide {:.2}% at 100% arrived; failed tasks {} / {}; {} accepts refused; {} offers",
                l.seed,
                points(&l.allocation_percent).0,
                points(&w.allocation_percent).0,
                l.failed_tasks,
                w.failed_tasks,
                l.refused_accepts,
                l.offers
            )?;
        }
        for (what, r) in [("at 100% arrived", at100), ("mean 50-130%", window)] {
            writeln!(
                out,
                "{what}: live {:.2}, cluster-wide {:.2}, live - cluster-wide {:+.2} [{:+.2}, {:+.2}]",
                r.0,
                r.1,
                r.2.mean,
                r.2.low(),
                r.2.high()
            )?;
        }
        if let Some(rows) = self.several_rows() {
            let k = self.frameworks();
            for m in &self.several {
                writeln!(
                    out,
                    "seed {}: {k} frameworks {:.2}% at 100% arrived; failed tasks {}; {} accepts refused; {} offers, {} rescinded for a GPU model",
                    m.seed,
                    points(&m.allocation_percent).0,
                    m.failed_tasks,
                    m.refused_accepts,
                    m.offers,
                    m.rescinds
                )?;
            }
            for (what, r) in [("at 100% arrived", rows[0]), ("mean 50-130%", rows[1])] {
                writeln!(
                    out,
                    "{what}: {k} frameworks {:.2}, {k} frameworks - one framework {:+.2} [{:+.2}, {:+.2}]",
                    r.0,
                    r.1.mean,
                    r.1.low(),
                    r.1.high()
                )?;
            }
        }
        writeln!(out, "wall time {:.1} s", self.wall_seconds)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
        n0,32000,65536,2,A\n\
        n1,32000,65536,4,B\n\
        n2,64000,131072,8,B\n";
    const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
        p0,4000,8192,1,500,\n\
        p1,4000,8192,1,1000,B\n\
        p2,8000,8192,0,0,\n\
        p3,4000,8192,2,1000,A|B\n\
        p4,2000,4096,1,250,\n";

    /// The live replay launches through the master exactly what the framework's view allows
    /// (no accept refused) and gives the cluster-wide replay's allocation on a small cluster:
    /// same policy, same arrivals.
    #[test]
    fn the_live_replay_goes_through_the_master_and_matches_the_cluster_wide_one() {
        let t = OpenbTrace::parse(NODES, PODS).expect("parses");
        let workload = Workload::from_tasks(&t.tasks);
        for seed in [1, 2, 3] {
            let live = run_seed(&t, &workload, Policy::FgdPack, seed, 1).expect("runs");
            let wide =
                super::super::openb::run_seed(&t, &workload, Policy::FgdPack, seed).expect("runs");
            assert_eq!(live.refused_accepts, 0);
            assert_eq!(live.allocation_percent.len(), MAX_PERCENT + 1);
            assert_eq!(live.arrived_tasks, wide.arrived_tasks);
            assert!(
                live.offers > t.nodes.len(),
                "offers came back after accepts"
            );
            // Here (14 GPUs, no ties the two replays break differently) the same curve.
            assert_eq!(
                live.allocation_percent, wide.allocation_percent,
                "seed {seed}"
            );
            assert_eq!(live.failed_tasks, wide.failed_tasks, "seed {seed}");
            assert!(live.allocation_percent[100] > 90.0);
        }
    }

    /// Two frameworks, each its own role: the allocator's DRF shares the agents between them
    /// (both get offers and both launch), every accept the master takes as the framework's view
    /// allows, and the split never allocates more than the cluster has.
    #[test]
    fn several_frameworks_compete_for_offers_through_the_allocator() {
        let t = OpenbTrace::parse(NODES, PODS).expect("parses");
        let workload = Workload::from_tasks(&t.tasks);
        for seed in [1, 2, 3] {
            let one = run_seed(&t, &workload, Policy::FgdPack, seed, 1).expect("runs");
            let two = run_seed(&t, &workload, Policy::FgdPack, seed, 2).expect("runs");
            assert_eq!(two.frameworks, 2);
            assert_eq!(two.refused_accepts, 0, "seed {seed}");
            assert_eq!(two.arrived_tasks, one.arrived_tasks);
            assert_eq!(two.launched.len(), 2);
            assert!(
                two.launched.iter().all(|&n| n > 0),
                "both frameworks launched: {:?}",
                two.launched
            );
            assert_eq!(
                two.launched.iter().sum::<usize>() + two.failed_tasks,
                two.arrived_tasks
            );
            assert_eq!(one.launched.len(), 1);
            assert!(two.allocation_percent.iter().all(|&a| a <= 100.0 + 1e-9));
        }
        assert!(matches!(
            run_seed(&t, &workload, Policy::FgdPack, 1, 0),
            Err(SimError::Args(_))
        ));
    }
}
