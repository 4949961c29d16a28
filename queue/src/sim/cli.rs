//! `gantry-queue simulate`: its arguments and what it prints.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::trace::{self, SpecError};
use super::{simulate, Policy, SimOptions};
use crate::core::CoreConfig;
use crate::model::TeamConfig;

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A file could not be read or written.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The trace or the cluster is malformed.
    #[error("{path}")]
    Spec {
        /// The file (or the `--cluster` text).
        path: String,
        /// What is wrong.
        source: SpecError,
    },
    /// An argument is wrong.
    #[error("{0}")]
    Usage(String),
}

/// The trace's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceFormat {
    /// The queue's trace format (docs/queue.md, "Simulator").
    Csv,
    /// An Alibaba `openb` pod list (shared/traces/alibaba-openb), converted as
    /// `trace::from_openb` documents.
    Openb,
}

/// Replay a job trace on emulated agents with the queue's own core (and, for comparison, FIFO
/// and EASY-backfill baselines); report wait, JCT, utilization, team shares, preemptions,
/// deadline misses, idle GPUs and ETA error.
#[derive(clap::Args, Debug, Clone)]
pub struct SimulateArgs {
    /// The trace (docs/queue.md, "Simulator").
    pub trace: PathBuf,
    /// The emulated cluster: `COUNTxGPUS[:MODEL],...` (e.g. `4x8:A100,2x8:H100`) or a TOML file
    /// with `[[agents]]` tables (count, gpus, model, cpus, mem_mib).
    #[arg(long)]
    pub cluster: String,
    /// The trace's format.
    #[arg(long, value_enum, default_value = "csv")]
    pub format: TraceFormat,
    /// openb only: divide the trace's times by this (compress a month into days).
    #[arg(long, default_value_t = 1.0)]
    pub openb_time_scale: f64,
    /// openb only: time limit = this × the duration, rounded up to an hour (0: none).
    #[arg(long, default_value_t = 2.0)]
    pub openb_limit_factor: f64,
    /// Write the trace as read (converted, for openb) to this file.
    #[arg(long)]
    pub write_trace: Option<PathBuf>,
    /// Policies to run, comma separated: queue, fifo, easy.
    #[arg(long, value_delimiter = ',', default_value = "queue")]
    pub policy: Vec<Policy>,
    /// A team: `NAME=WEIGHT[:GPU_QUOTA][,MODEL:GPUS]...` (repeatable), as `serve --team`.
    #[arg(long = "team")]
    pub teams: Vec<String>,
    /// The queue's aging: one priority class per this many seconds (0: none).
    #[arg(long, default_value_t = 300)]
    pub aging_secs: u64,
    /// Seconds between a preemption or time-limit warning and the worker's end.
    #[arg(long, default_value_t = 30)]
    pub grace_secs: u32,
    /// Tick the queue at least this often, simulated seconds.
    #[arg(long, default_value_t = 30.0)]
    pub tick_secs: f64,
    /// Stop at this simulated time, seconds (default: when every job has ended).
    #[arg(long)]
    pub horizon_secs: Option<f64>,
    /// Intervals of the per-team share over time.
    #[arg(long, default_value_t = 10)]
    pub buckets: usize,
    /// JSON (an array of reports, one per policy) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs the simulation `args` ask for, with `teams` parsed as `serve --team`; returns what to
/// print.
pub fn run(args: &SimulateArgs, teams: BTreeMap<String, TeamConfig>) -> Result<String, SimError> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).map_err(|source| SimError::Io {
            path: p.clone(),
            source,
        })
    };
    let text = read(&args.trace)?;
    let spec_err = |path: String| move |source| SimError::Spec { path, source };
    let jobs = match args.format {
        TraceFormat::Csv => trace::parse_trace(&text),
        TraceFormat::Openb => {
            trace::from_openb(&text, args.openb_time_scale, args.openb_limit_factor)
        }
    }
    .map_err(spec_err(args.trace.display().to_string()))?;
    if let Some(out) = &args.write_trace {
        std::fs::write(out, trace::write_trace(&jobs)).map_err(|source| SimError::Io {
            path: out.clone(),
            source,
        })?;
    }
    let cluster_text = if std::path::Path::new(&args.cluster).is_file() {
        read(&PathBuf::from(&args.cluster))?
    } else {
        args.cluster.clone()
    };
    let cluster = trace::parse_cluster(&cluster_text).map_err(spec_err(args.cluster.clone()))?;
    if !(args.tick_secs.is_finite() && args.tick_secs > 0.0) {
        return Err(SimError::Usage("--tick-secs must be positive".into()));
    }
    let opts = SimOptions {
        core: CoreConfig {
            teams,
            aging: Duration::from_secs(args.aging_secs),
            ..CoreConfig::default()
        },
        grace_secs: args.grace_secs,
        tick: args.tick_secs,
        horizon: args.horizon_secs,
        buckets: args.buckets,
        ..SimOptions::default()
    };
    let reports: Vec<_> = args
        .policy
        .iter()
        .map(|p| simulate(*p, &jobs, &cluster, &opts))
        .collect();
    if args.json {
        return serde_json::to_string_pretty(&reports)
            .map(|s| s + "\n")
            .map_err(|e| SimError::Usage(e.to_string()));
    }
    let gpus: u64 = cluster
        .iter()
        .map(|g| u64::from(g.count) * u64::from(g.gpus))
        .sum();
    let mut out = format!(
        "{} jobs on {} agents, {gpus} GPUs\n",
        jobs.len(),
        cluster.iter().map(|g| g.count).sum::<u32>()
    );
    for r in reports {
        out += &r.text();
    }
    Ok(out)
}
