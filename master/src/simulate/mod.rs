//! Scenario simulator, trace mode and benchmark: they drive the real [`crate::allocator`] in
//! simulated time (the allocator itself never reads a clock; only the trace mode and the
//! benchmark measure wall time around its calls). The openb replay drives
//! [`gantry_placement`] instead, timing each placement decision.
//!
//! - [`scenario`]: `gantry-master simulate FILE.toml`, JSON lines of offers, rescinds, summary.
//! - [`trace`]: `gantry-master simulate --trace JOBS.csv --cluster CLUSTER.toml`, plus a synthetic
//!   trace generator.
//! - [`bench`](mod@bench): `gantry-master bench`, the Mesos DeclineOffers and quota-roles setups.
//! - [`openb`]: `gantry-master simulate --openb NODES.csv PODS.csv`, the FGD paper's experiment
//!   on Alibaba's GPU trace, run on [`gantry_placement`].
//! - [`compare`]: `--openb ... --openb-compare A B`, two policies on the same seeds' arrivals,
//!   the paired mean difference with its 95% interval per pod list.
//! - [`live`]: `--openb ... --live`, the same arrivals through the master's state core and
//!   allocator with emulated agents and a framework placing across the offers it holds,
//!   beside the cluster-wide number; `--frameworks N` adds N frameworks competing for the
//!   agents through the allocator's DRF offers.

pub mod bench;
pub mod compare;
pub mod live;
pub mod openb;
pub mod scenario;
pub mod trace;

use std::io::Write;
use std::path::PathBuf;

/// Why a simulation stopped.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid scenario: {0}")]
    Parse(String),
    #[error("event {index} ({kind}): {message}")]
    Event {
        index: usize,
        kind: String,
        message: String,
    },
    #[error("invalid trace: {0}")]
    Trace(String),
    #[error("invalid arguments: {0}")]
    Args(String),
    #[error("write failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("json output failed: {0}")]
    Json(#[from] serde_json::Error),
}

impl SimError {
    pub(crate) fn event(index: usize, kind: &str, message: String) -> Self {
        SimError::Event {
            index,
            kind: kind.to_string(),
            message,
        }
    }
}

/// Arguments of `gantry-master simulate`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Scenario file (TOML) to replay.
    #[arg(required_unless_present_any = ["trace", "generate_trace", "openb"])]
    pub file: Option<PathBuf>,
    /// Job trace (CSV: arrival_ms,role,task,count,duration_ms) for trace mode.
    #[arg(long, requires = "cluster")]
    pub trace: Option<PathBuf>,
    /// Cluster file (TOML) for trace mode.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Trace mode: also write the time series as CSV here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write a synthetic job trace to this file and exit.
    #[arg(long, value_name = "OUT.csv")]
    pub generate_trace: Option<PathBuf>,
    /// Synthetic trace: number of jobs.
    #[arg(long, default_value_t = 200)]
    pub jobs: usize,
    /// Synthetic trace: number of roles.
    #[arg(long, default_value_t = 3)]
    pub roles: usize,
    /// Synthetic trace: random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replay the FGD paper's experiment on Alibaba's openb trace: node list and pod list (CSV;
    /// with --openb-compare, one or more pod lists).
    #[arg(long, num_args = 2.., value_names = ["NODES.csv", "PODS.csv"])]
    pub openb: Option<Vec<PathBuf>>,
    /// openb replay: a paired comparison of two policies A and B (the same seeds' arrivals
    /// through both): per pod list, the mean difference A − B of the allocation ratio with its
    /// 95% interval, at 100% arrived and averaged over 50–130%.
    #[arg(long, num_args = 2, value_names = ["A", "B"], requires = "openb", conflicts_with = "policy")]
    pub openb_compare: Option<Vec<String>>,
    /// openb replay: placement policy (fgd-scarce, fgd-fill, fgd-pack, fgd-blend, fgd, fgd-artifact,
    /// best-fit, random); default: fgd-blend.
    #[arg(long, requires = "openb")]
    pub policy: Option<String>,
    /// openb replay: seeds, e.g. 42-51, 42 or 1,5,9.
    #[arg(long, default_value = "42-51")]
    pub seeds: String,
    /// openb replay: also replay through the master's state core and allocator (emulated
    /// agents, one framework placing across the offers it holds) and report that allocation
    /// beside the cluster-wide one, per pod list.
    #[arg(long, requires = "openb", conflicts_with = "openb_compare")]
    pub live: bool,
    /// openb live replay: also split the arrivals round-robin between N frameworks (one role
    /// each) that compete for the agents through the allocator's DRF offers, each placing its
    /// own tasks across the offers it holds; reported beside the one-framework and
    /// cluster-wide numbers (1 to 64; 1: one framework only).
    #[arg(long, requires = "live", default_value_t = 1)]
    pub frameworks: usize,
    /// openb replay: print one JSON object instead of the table.
    #[arg(long, requires = "openb")]
    pub json: bool,
}

/// Runs `gantry-master simulate` with output to stdout.
pub fn run(args: SimulateArgs) -> Result<(), SimError> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let res = run_to(&args, &mut out);
    out.flush()?;
    res
}

/// Runs `gantry-master simulate` writing to `out`.
pub fn run_to<W: Write>(args: &SimulateArgs, out: &mut W) -> Result<(), SimError> {
    if let Some(path) = &args.generate_trace {
        let text = trace::generate(args.jobs, args.roles, args.seed);
        return std::fs::write(path, text).map_err(|source| SimError::Read {
            path: path.clone(),
            source,
        });
    }
    if let Some(paths) = &args.openb {
        if let Some(names) = &args.openb_compare {
            return openb_compare(args, paths, names, out);
        }
        if args.live {
            return openb_live(args, paths, out);
        }
        let [nodes, pods] = paths.as_slice() else {
            return Err(SimError::Args(
                "--openb needs NODES.csv PODS.csv (several pod lists only with --openb-compare or --live)"
                    .into(),
            ));
        };
        let policy: Option<gantry_placement::Policy> = match &args.policy {
            Some(p) => Some(
                p.parse()
                    .map_err(|e: gantry_placement::PlacementError| SimError::Args(e.to_string()))?,
            ),
            None => None,
        };
        let seeds = openb::parse_seeds(&args.seeds)?;
        let trace = openb::OpenbTrace::parse(&read(nodes)?, &read(pods)?)?;
        let report = openb::run(&trace, policy, &seeds)?;
        if args.json {
            serde_json::to_writer(&mut *out, &report.to_json())?;
            out.write_all(b"\n")?;
        } else {
            report.write_text(out)?;
        }
        return Ok(());
    }
    if let Some(trace_path) = &args.trace {
        let cluster_path = args
            .cluster
            .as_ref()
            .ok_or_else(|| SimError::Args("--trace needs --cluster".into()))?;
        let jobs = read(trace_path)?;
        let cluster = read(cluster_path)?;
        let report = trace::run_trace(
            &trace::parse_jobs(&jobs)?,
            &trace::TraceCluster::parse(&cluster)?,
        )?;
        serde_json::to_writer_pretty(&mut *out, &report.json)?;
        out.write_all(b"\n")?;
        if let Some(csv) = &args.csv {
            std::fs::write(csv, &report.csv).map_err(|source| SimError::Read {
                path: csv.clone(),
                source,
            })?;
        }
        return Ok(());
    }
    let file = args.file.as_ref().ok_or_else(|| {
        SimError::Args("a scenario FILE, --trace or --generate-trace is needed".into())
    })?;
    let text = read(file)?;
    let scenario = scenario::Scenario::parse(&text)?;
    scenario::run_scenario(&scenario, out)?;
    Ok(())
}

fn parse_policy(name: &str) -> Result<gantry_placement::Policy, SimError> {
    name.parse()
        .map_err(|e: gantry_placement::PlacementError| SimError::Args(e.to_string()))
}

/// `--openb NODES.csv PODS.csv... --openb-compare A B`: one table (or JSON line) per pod list,
/// progress on stderr.
fn openb_compare<W: Write>(
    args: &SimulateArgs,
    paths: &[PathBuf],
    names: &[String],
    out: &mut W,
) -> Result<(), SimError> {
    let [a, b] = names else {
        return Err(SimError::Args("--openb-compare needs two policies".into()));
    };
    let policies = [parse_policy(a)?, parse_policy(b)?];
    let Some((nodes, lists)) = paths.split_first() else {
        return Err(SimError::Args("--openb needs NODES.csv PODS.csv".into()));
    };
    let seeds = openb::parse_seeds(&args.seeds)?;
    let nodes = read(nodes)?;
    for pods in lists {
        let trace = openb::OpenbTrace::parse(&nodes, &read(pods)?)?;
        let name = list_name(pods);
        let mut progress = std::io::stderr();
        let c = compare::compare(&trace, &name, policies, &seeds, &mut progress)?;
        if args.json {
            serde_json::to_writer(&mut *out, &c.to_json())?;
            out.write_all(b"\n")?;
        } else {
            c.write_text(out)?;
        }
        out.flush()?;
    }
    Ok(())
}

/// `--openb NODES.csv PODS.csv... --live`: per pod list, the live replay beside the
/// cluster-wide one, progress on stderr.
fn openb_live<W: Write>(
    args: &SimulateArgs,
    paths: &[PathBuf],
    out: &mut W,
) -> Result<(), SimError> {
    let policy = match &args.policy {
        Some(p) => parse_policy(p)?,
        None => gantry_placement::Policy::DEFAULT,
    };
    let Some((nodes, lists)) = paths.split_first() else {
        return Err(SimError::Args("--openb needs NODES.csv PODS.csv".into()));
    };
    let seeds = openb::parse_seeds(&args.seeds)?;
    let nodes = read(nodes)?;
    for pods in lists {
        let trace = openb::OpenbTrace::parse(&nodes, &read(pods)?)?;
        let name = list_name(pods);
        let mut progress = std::io::stderr();
        let report = live::run(
            &trace,
            &name,
            policy,
            &seeds,
            args.frameworks,
            &mut progress,
        )?;
        if args.json {
            serde_json::to_writer(&mut *out, &report.to_json())?;
            out.write_all(b"\n")?;
        } else {
            report.write_text(out)?;
        }
        out.flush()?;
    }
    Ok(())
}

/// A pod list's name: its file name without `openb_pod_list_` and `.csv`.
fn list_name(pods: &std::path::Path) -> String {
    let name = pods
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.strip_prefix("openb_pod_list_")
        .map(str::to_string)
        .unwrap_or(name)
}

fn read(path: &PathBuf) -> Result<String, SimError> {
    std::fs::read_to_string(path).map_err(|source| SimError::Read {
        path: path.clone(),
        source,
    })
}
