//! The job-trace format (CSV) and the emulated cluster's specification.
//!
//! A trace is one job per line, `#` comments and blank lines ignored, an optional header line
//! (its first field `submit_s`):
//!
//! ```text
//! submit_s,team,priority,workers,gpus_per_worker,duration_s,time_limit_s,deadline_s,user,name
//! 0,vision,normal,2,8,3600,7200,,alice,resnet
//! 30,nlp,preemptible,1,1,600,,,,
//! ```
//!
//! `submit_s`, `duration_s`, `time_limit_s` and `deadline_s` are seconds from the trace's start
//! (decimals allowed); the last four fields may be empty or missing (no time limit, no deadline,
//! user `sim`, name `job-LINE`). Fields hold no commas.

use std::fmt::Write as _;

use crate::model::Priority;

/// A trace or cluster specification that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A trace line.
    #[error("trace line {line}: {message}")]
    Trace {
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The cluster specification.
    #[error("cluster: {0}")]
    Cluster(String),
}

/// One job of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    /// Name (unique names help reading the output; not required).
    pub name: String,
    /// Submission, seconds from the trace's start.
    pub submit: f64,
    /// Team.
    pub team: String,
    /// Who submits it.
    pub user: String,
    /// Priority class.
    pub priority: Priority,
    /// Workers (a gang when above 1).
    pub workers: u32,
    /// GPUs per worker.
    pub gpus: u32,
    /// Run time once all workers run, seconds (work already done survives a preemption: the
    /// job resumes from its checkpoint).
    pub duration: f64,
    /// Killed this long after an attempt's launch, seconds.
    pub time_limit: Option<f64>,
    /// Must have finished by then, seconds from the trace's start.
    pub deadline: Option<f64>,
}

impl TraceJob {
    /// GPUs of the whole gang.
    pub fn total_gpus(&self) -> u64 {
        u64::from(self.workers) * u64::from(self.gpus)
    }
}

/// The trace header.
pub const HEADER: &str =
    "submit_s,team,priority,workers,gpus_per_worker,duration_s,time_limit_s,deadline_s,user,name";

fn secs(field: &str, what: &str) -> Result<f64, String> {
    let v: f64 = field
        .trim()
        .parse()
        .map_err(|_| format!("{what} {field:?} is not a number of seconds"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{what} must be a non-negative number"));
    }
    Ok(v)
}

fn opt_secs(field: Option<&str>, what: &str) -> Result<Option<f64>, String> {
    match field.map(str::trim) {
        None | Some("") => Ok(None),
        Some(f) => secs(f, what).map(Some),
    }
}

fn parse_line(n: usize, line: &str) -> Result<TraceJob, String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 6 || f.len() > 10 {
        return Err(format!(
            "expected 6 to 10 fields ({HEADER}), got {}",
            f.len()
        ));
    }
    let count = |s: &str, what: &str| -> Result<u32, String> {
        s.parse::<u32>()
            .map_err(|_| format!("{what} {s:?} is not a whole number"))
    };
    let workers = count(f[3], "workers")?;
    if workers == 0 || workers > 1024 {
        return Err("workers must be 1..=1024".into());
    }
    let gpus = count(f[4], "gpus_per_worker")?;
    if gpus > 64 {
        return Err("at most 64 GPUs per worker".into());
    }
    if f[1].is_empty() {
        return Err("the team is empty".into());
    }
    let time_limit = opt_secs(f.get(6).copied(), "time_limit_s")?;
    if time_limit.is_some_and(|t| t < 1.0) {
        return Err("the time limit must be at least one second".into());
    }
    Ok(TraceJob {
        submit: secs(f[0], "submit_s")?,
        team: f[1].to_string(),
        priority: f[2].parse()?,
        workers,
        gpus,
        duration: secs(f[5], "duration_s")?,
        time_limit,
        deadline: opt_secs(f.get(7).copied(), "deadline_s")?,
        user: f
            .get(8)
            .filter(|u| !u.is_empty())
            .map_or("sim".to_string(), |u| u.to_string()),
        name: f
            .get(9)
            .filter(|u| !u.is_empty() && !u.contains('/'))
            .map_or(format!("job-{n}"), |u| u.to_string()),
    })
}

/// Reads a trace (see the module docs); jobs come out sorted by submission (stable).
pub fn parse_trace(text: &str) -> Result<Vec<TraceJob>, SpecError> {
    let mut jobs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("submit_s") {
            continue;
        }
        jobs.push(parse_line(i + 1, line).map_err(|message| SpecError::Trace {
            line: i + 1,
            message,
        })?);
    }
    jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit));
    Ok(jobs)
}

/// Writes a trace in the format [`parse_trace`] reads.
pub fn write_trace(jobs: &[TraceJob]) -> String {
    let mut out = format!("{HEADER}\n");
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| v.to_string());
    for j in jobs {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{}",
            j.submit,
            j.team,
            j.priority,
            j.workers,
            j.gpus,
            j.duration,
            opt(j.time_limit),
            opt(j.deadline),
            j.user,
            j.name
        );
    }
    out
}

/// Derives a trace from an Alibaba `openb` pod list (shared/traces/alibaba-openb, Weng et al.,
/// ATC '23; `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
/// deletion_time,scheduled_time`): every pod with `num_gpu >= 1` becomes a one-worker job of
/// `num_gpu` whole GPUs (a shared, fractional GPU counts as one whole GPU); submission is
/// `creation_time`, the duration `deletion_time - scheduled_time` (the time it ran in
/// production); the team is the pod's `qos` class in lower case (`ls`, `be`, ...); `BE`
/// (best-effort) pods are `preemptible`, the others `normal`; the time limit is
/// `limit_factor` times the duration rounded up to a whole hour (users overestimate limits, as
/// in Slurm traces) when `limit_factor > 0`. Times are divided by `time_scale`. CPU-only pods
/// and pods never scheduled in production (`Pending`, no `scheduled_time`: no run time) are
/// left out.
pub fn from_openb(
    text: &str,
    time_scale: f64,
    limit_factor: f64,
) -> Result<Vec<TraceJob>, SpecError> {
    let err = |line: usize, message: String| SpecError::Trace { line, message };
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = lines
        .next()
        .map(|(_, h)| h.split(',').map(str::trim).collect())
        .unwrap_or_default();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| err(1, format!("an openb pod list has a {name} column")))
    };
    let (gpu, qos, created, deleted, scheduled) = (
        col("num_gpu")?,
        col("qos")?,
        col("creation_time")?,
        col("deletion_time")?,
        col("scheduled_time")?,
    );
    let scale = if time_scale > 0.0 { time_scale } else { 1.0 };
    let mut jobs = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let num = |c: usize| -> Result<f64, SpecError> {
            f.get(c)
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| err(i + 1, format!("column {} is not a number", c + 1)))
        };
        let gpus = num(gpu)? as u32;
        // CPU-only pods, and pods never scheduled in production (no run time), are left out.
        if gpus == 0 || f.get(scheduled).is_none_or(|s| s.is_empty()) {
            continue;
        }
        let submit = num(created)? / scale;
        let duration = ((num(deleted)? - num(scheduled)?).max(1.0)) / scale;
        let class = f.get(qos).copied().unwrap_or("").to_ascii_lowercase();
        let time_limit = (limit_factor > 0.0)
            .then(|| ((duration * limit_factor / 3600.0).ceil() * 3600.0).max(1.0));
        jobs.push(TraceJob {
            name: f.first().copied().unwrap_or("pod").replace('/', "-"),
            submit,
            team: if class.is_empty() {
                "default".into()
            } else {
                class.clone()
            },
            user: "openb".into(),
            priority: if class == "be" {
                Priority::Preemptible
            } else {
                Priority::Normal
            },
            workers: 1,
            gpus,
            duration,
            time_limit,
            deadline: None,
        });
    }
    jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit));
    Ok(jobs)
}

/// A group of identical agents.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct AgentGroup {
    /// How many.
    pub count: u32,
    /// GPUs each.
    pub gpus: u32,
    /// Their GPU model.
    #[serde(default = "default_model")]
    pub model: String,
    /// CPUs each (default: 8 per GPU, at least 8).
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Memory each, MiB (default: 64 GiB per GPU, at least 64 GiB).
    #[serde(default)]
    pub mem_mib: Option<f64>,
}

fn default_model() -> String {
    "GPU".into()
}

impl AgentGroup {
    /// CPUs each agent has.
    pub fn cpus(&self) -> f64 {
        self.cpus.unwrap_or(f64::from(self.gpus.max(1) * 8))
    }
    /// Memory each agent has, MiB.
    pub fn mem(&self) -> f64 {
        self.mem_mib
            .unwrap_or(f64::from(self.gpus.max(1)) * 65536.0)
    }
}

#[derive(serde::Deserialize)]
struct ClusterFile {
    agents: Vec<AgentGroup>,
}

/// Reads a cluster specification: `COUNTxGPUS[:MODEL]` groups separated by commas
/// (`4x8:A100,2x8:H100`), or a TOML file's text with `[[agents]]` tables (`count`, `gpus`,
/// `model`, `cpus`, `mem_mib`).
pub fn parse_cluster(spec: &str) -> Result<Vec<AgentGroup>, SpecError> {
    let bad = |m: String| SpecError::Cluster(m);
    let groups = if spec.contains("[[agents]]") {
        toml::from_str::<ClusterFile>(spec)
            .map_err(|e| bad(e.to_string()))?
            .agents
    } else {
        let mut groups = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (shape, model) = part.split_once(':').unwrap_or((part, "GPU"));
            let (count, gpus) = shape
                .split_once('x')
                .ok_or_else(|| bad(format!("{part:?}: expected COUNTxGPUS[:MODEL]")))?;
            let num = |s: &str| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| bad(format!("{part:?}: {s:?} is not a whole number")))
            };
            groups.push(AgentGroup {
                count: num(count)?,
                gpus: num(gpus)?,
                model: model.trim().to_string(),
                cpus: None,
                mem_mib: None,
            });
        }
        groups
    };
    if groups.iter().map(|g| g.count).sum::<u32>() == 0 {
        return Err(bad("no agents".into()));
    }
    if groups.iter().any(|g| g.gpus > 64 || g.count > 100_000) {
        return Err(bad(
            "at most 64 GPUs per agent and 100000 agents per group".into()
        ));
    }
    Ok(groups)
}
