//! The queue's data: job specifications as submitted, priority classes, states, team settings
//! and the JSON views the HTTP API returns.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use gantry_sdk::protocol::{AgentId, CommandInfo, GpuSelector, Program, TaskId, TaskState};
use serde::{Deserialize, Serialize};

mod team;
pub use team::{TeamConfig, TeamLimit};

/// Priority classes, lowest first.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// May be preempted by `high` and `critical` jobs.
    Preemptible,
    /// Below normal.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Above normal; preempts lower classes when blocked.
    High,
    /// The highest; preempts lower classes when blocked.
    Critical,
}

impl Priority {
    /// Every class, lowest first.
    pub const ALL: [Priority; 5] = [
        Priority::Preemptible,
        Priority::Low,
        Priority::Normal,
        Priority::High,
        Priority::Critical,
    ];

    /// 0 (`preemptible`) to 4 (`critical`).
    pub fn rank(self) -> u8 {
        self as u8
    }

    /// The class of a rank (clamped).
    pub fn from_rank(rank: u8) -> Priority {
        Priority::ALL[usize::from(rank.min(4))]
    }

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Preemptible => "preemptible",
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Priority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s.to_ascii_lowercase())
            .ok_or_else(|| {
                format!("unknown priority {s:?} (critical, high, normal, low, preemptible)")
            })
    }
}

/// A job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum JobState {
    /// Waiting (also after a preemption).
    Pending,
    /// Its workers were launched.
    Running,
    /// Every worker finished successfully.
    Finished,
    /// A worker failed.
    Failed,
    /// Cancelled by a user.
    Cancelled,
}

impl JobState {
    /// Whether the job has ended.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Finished | JobState::Failed | JobState::Cancelled
        )
    }

    /// Upper-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Finished => "FINISHED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
        }
    }
}

/// GPUs per worker, in milli-GPUs: a fraction of one GPU (1..=999) or whole GPUs (multiples
/// of 1000), as the master reads a task's `gpus`. In JSON (the API and the store) a number:
/// whole GPUs as an integer (`8`, what stores written before fractions hold), a fraction as a
/// decimal (`0.5`); either form is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Gpus(u32);

/// Milli-GPUs in one GPU.
pub const GPU_MILLI: u64 = 1000;

impl Gpus {
    /// No GPU.
    pub const ZERO: Gpus = Gpus(0);

    /// `n` whole GPUs.
    pub const fn whole(n: u32) -> Gpus {
        Gpus(n.saturating_mul(GPU_MILLI as u32))
    }

    /// From milli-GPUs (not checked: see [`Gpus::problem`]).
    pub const fn from_milli(milli: u32) -> Gpus {
        Gpus(milli)
    }

    /// Milli-GPUs.
    pub fn milli(self) -> u64 {
        u64::from(self.0)
    }

    /// Whether it asks for no GPU.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Whether it is a fraction of one GPU (below one, above zero).
    pub fn is_fraction(self) -> bool {
        self.0 > 0 && u64::from(self.0) < GPU_MILLI
    }

    /// How many GPUs (devices) a worker is given: 1 for a fraction.
    pub fn devices(self) -> u64 {
        if self.is_fraction() {
            1
        } else {
            self.milli() / GPU_MILLI
        }
    }

    /// As a number of GPUs (`0.5`, `8`).
    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / GPU_MILLI as f64
    }

    /// Why it cannot be a worker's GPUs: above one and not whole (the master's rule), or
    /// above [`MAX_GPUS`].
    pub fn problem(self) -> Option<String> {
        if self.milli() > GPU_MILLI && !self.milli().is_multiple_of(GPU_MILLI) {
            return Some(format!(
                "gpus must be below 1 (a fraction of one GPU) or a whole number, got {self}"
            ));
        }
        if self.milli() > u64::from(MAX_GPUS) * GPU_MILLI {
            return Some(format!("at most {MAX_GPUS} GPUs per worker"));
        }
        None
    }

    /// Reads a number of GPUs (`0.5`, `2`): non-negative, finite, in thousandths.
    pub fn parse_f64(v: f64) -> Result<Gpus, String> {
        if !v.is_finite() || v < 0.0 {
            return Err(format!("gpus must be a non-negative number, got {v}"));
        }
        let milli = (v * GPU_MILLI as f64).round();
        if (milli - v * GPU_MILLI as f64).abs() > 1e-6 {
            return Err(format!(
                "gpus {v}: at most three decimals (milli-GPU precision)"
            ));
        }
        if milli > f64::from(u32::MAX) {
            return Err(format!("at most {MAX_GPUS} GPUs per worker"));
        }
        Ok(Gpus(milli as u32))
    }
}

/// At most this many GPUs per worker.
pub const MAX_GPUS: u32 = 64;

/// Milli-GPUs written as GPUs: `8`, `0.5`, `0.125`.
pub fn fmt_milli(milli: u64) -> String {
    if milli.is_multiple_of(GPU_MILLI) {
        (milli / GPU_MILLI).to_string()
    } else {
        let s = format!("{}.{:03}", milli / GPU_MILLI, milli % GPU_MILLI);
        s.trim_end_matches('0').to_string()
    }
}

impl fmt::Display for Gpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&fmt_milli(self.milli()))
    }
}

impl FromStr for Gpus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("gpus {s:?}: expected a number such as 0.5 or 2"))?;
        Gpus::parse_f64(v)
    }
}

impl Serialize for Gpus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.milli().is_multiple_of(GPU_MILLI) {
            s.serialize_u64(self.milli() / GPU_MILLI)
        } else {
            s.serialize_f64(self.as_f64())
        }
    }
}

impl<'de> Deserialize<'de> for Gpus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Gpus;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of GPUs (0.5, 2)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Gpus, E> {
                v.checked_mul(GPU_MILLI)
                    .and_then(|m| u32::try_from(m).ok())
                    .map(Gpus)
                    .ok_or_else(|| E::custom(format!("at most {MAX_GPUS} GPUs per worker")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Gpus, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("gpus must be a non-negative number, got {v}")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Gpus, E> {
                Gpus::parse_f64(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A job as submitted (the body of `POST /jobs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Name; workers' tasks are named `NAME/INDEX`.
    pub name: String,
    /// The team it is accounted to.
    pub team: String,
    /// Priority class.
    #[serde(default)]
    pub priority: Priority,
    /// What each worker runs: one string is a shell command, several an argv.
    pub command: Vec<String>,
    /// CPUs per worker.
    #[serde(default = "one")]
    pub cpus: f64,
    /// Memory per worker, MiB.
    #[serde(default = "mem")]
    pub mem: f64,
    /// GPUs per worker: a fraction of one GPU (`0.5`, milli-GPU precision) or whole GPUs.
    #[serde(default)]
    pub gpus: Gpus,
    /// GPU model substring (case-insensitive).
    #[serde(default)]
    pub gpu_model: Option<String>,
    /// Least GPU memory, MiB.
    #[serde(default)]
    pub gpu_min_memory: Option<u64>,
    /// Fewest workers (a gang when above 1).
    #[serde(default = "one_u32")]
    pub min_workers: u32,
    /// Most workers (elastic when above `min_workers`).
    #[serde(default = "one_u32")]
    pub max_workers: u32,
    /// Deadline, Unix seconds: the job should end by then. Its priority rises as its latest
    /// start (the deadline minus its time limit) approaches; a job still pending past its
    /// latest start is cancelled with the reason `deadline` unless `deadline_best_effort`.
    /// Earliest first among equals.
    #[serde(default)]
    pub deadline_unix: Option<u64>,
    /// `--deadline-policy best-effort`: a job that misses its deadline still runs.
    #[serde(default)]
    pub deadline_best_effort: bool,
    /// `--array 0-99` (ranges and single indexes, comma separated, e.g. `0-9,20`): one job per
    /// index, each named `NAME[INDEX]` with the index in `GANTRY_QUEUE_ARRAY_INDEX`. Input
    /// only: the jobs created carry `array_job` and `array_index` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<String>,
    /// The array this job belongs to: the id of its first job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_job: Option<u64>,
    /// Its index in the array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_index: Option<u32>,
    /// Seconds between the preemption warning (SIGTERM) and SIGKILL.
    #[serde(default = "grace")]
    pub grace_secs: u32,
    /// Extra environment for every worker.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Jobs this one waits for (Slurm's `afterok`): it stays `PENDING` until every one of them
    /// has `FINISHED`, and is `CANCELLED` when one of them ends `FAILED` or `CANCELLED`.
    #[serde(default)]
    pub after: Vec<u64>,
    /// Times the job is run again after a worker failed (exited non-zero), with backoff.
    /// Workers lost with their agent and preemptions are always requeued and do not count.
    #[serde(default)]
    pub max_retries: u32,
    /// Seconds an attempt may run (from its launch); past it every worker is killed and the
    /// job ends `FAILED` with the reason `time-limit`. `None`: no limit.
    #[serde(default)]
    pub time_limit_secs: Option<u64>,
}

fn one() -> f64 {
    1.0
}
fn mem() -> f64 {
    256.0
}
fn one_u32() -> u32 {
    1
}
fn grace() -> u32 {
    10
}

/// The longest job name (it is part of every task name).
pub const MAX_NAME: usize = 128;

/// The most retries a job may ask for.
pub const MAX_RETRIES: u32 = 100;

/// At most this many jobs in one array.
pub const MAX_ARRAY: usize = 1000;

/// The most jobs one job may depend on.
pub const MAX_DEPENDENCIES: usize = 64;

impl JobSpec {
    /// The indexes of `array`, in order without repeats (`None` when it is not an array), or
    /// why they are invalid.
    pub fn array_indexes(&self) -> Result<Option<Vec<u32>>, String> {
        let Some(a) = &self.array else {
            return Ok(None);
        };
        let bad = || format!("--array {a:?}: expected ranges like 0-99 or 0-9,20");
        let mut out = std::collections::BTreeSet::new();
        for part in a.split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo.trim(), hi.trim()),
                None => (part.trim(), part.trim()),
            };
            let lo: u32 = lo.parse().map_err(|_| bad())?;
            let hi: u32 = hi.parse().map_err(|_| bad())?;
            if lo > hi || (hi - lo) as usize >= MAX_ARRAY {
                return Err(bad());
            }
            out.extend(lo..=hi);
            if out.len() > MAX_ARRAY {
                return Err(format!(
                    "--array {a:?}: at most {MAX_ARRAY} jobs in an array"
                ));
            }
        }
        Ok(Some(out.into_iter().collect()))
    }

    /// Why the specification cannot run, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if self.name.is_empty() || self.name.len() > MAX_NAME || self.name.contains('/') {
            return Some(format!(
                "name must be 1..={MAX_NAME} characters without '/'"
            ));
        }
        if self.team.is_empty() || self.team.len() > MAX_NAME {
            return Some(format!("team must be 1..={MAX_NAME} characters"));
        }
        if !(self.cpus.is_finite() && self.cpus >= 0.0 && self.mem.is_finite() && self.mem >= 0.0) {
            return Some("cpus and mem must be non-negative numbers".into());
        }
        if self.min_workers == 0 || self.max_workers < self.min_workers || self.max_workers > 1024 {
            return Some("workers must be MIN..MAX with 1 <= MIN <= MAX <= 1024".into());
        }
        if let Some(p) = self.gpus.problem() {
            return Some(p);
        }
        if self.max_retries > MAX_RETRIES {
            return Some(format!("at most {MAX_RETRIES} retries"));
        }
        if self.time_limit_secs == Some(0) {
            return Some("the time limit must be at least one second".into());
        }
        if let Err(e) = self.array_indexes() {
            return Some(e);
        }
        if self.after.len() > MAX_DEPENDENCIES {
            return Some(format!("at most {MAX_DEPENDENCIES} dependencies (after)"));
        }
        self.command_info().problem()
    }

    /// The worker command.
    pub fn command_info(&self) -> CommandInfo {
        if self.command.len() == 1 {
            CommandInfo::shell(self.command[0].clone())
        } else {
            CommandInfo {
                program: Program::Argv(self.command.clone()),
                user: None,
            }
        }
    }

    /// The GPU selector, when a model or memory is asked for.
    pub fn selector(&self) -> Option<GpuSelector> {
        (!self.gpus.is_zero() && (self.gpu_model.is_some() || self.gpu_min_memory.is_some())).then(
            || GpuSelector {
                model: self.gpu_model.clone(),
                min_memory_mib: self.gpu_min_memory,
                mig_profile: None,
                uuids: Vec::new(),
            },
        )
    }
}

/// One worker, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberView {
    /// Worker index.
    pub index: u32,
    /// Task name (`JOBNAME/INDEX`).
    pub task: String,
    /// Task id.
    pub task_id: String,
    /// Agent hostname.
    pub agent: String,
    /// GPU UUIDs.
    pub gpus: Vec<String>,
    /// Task state.
    pub state: String,
}

/// A job, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// Job id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// Team.
    pub team: String,
    /// Priority class as submitted.
    pub priority: Priority,
    /// Priority class after aging.
    pub effective_priority: Priority,
    /// State.
    pub state: JobState,
    /// Workers running now.
    pub workers: u32,
    /// Fewest workers.
    pub min_workers: u32,
    /// Most workers.
    pub max_workers: u32,
    /// GPUs per worker (`0.5`: half a GPU each).
    pub gpus_per_worker: Gpus,
    /// Times it was preempted.
    pub preemptions: u32,
    /// Seconds spent waiting (all waits, the current one included).
    pub waited_secs: f64,
    /// Deadline, Unix seconds.
    pub deadline_unix: Option<u64>,
    /// Where it runs (agent hostnames).
    pub agents: Vec<String>,
    /// Its workers.
    pub members: Vec<MemberView>,
    /// Why it ended or was requeued.
    pub message: String,
    /// Seconds since submission.
    pub age_secs: f64,
    /// The jobs it depends on (`afterok`).
    #[serde(default)]
    pub after: Vec<u64>,
    /// Those of them not yet `FINISHED` (a `PENDING` job with any waits on its dependencies).
    #[serde(default)]
    pub waiting_on: Vec<u64>,
    /// Who submitted it.
    #[serde(default)]
    pub user: String,
    /// Times its workers were launched (each requeue starts a new attempt).
    #[serde(default)]
    pub attempts: u32,
    /// Times it was run again after a failure (of `max_retries`).
    #[serde(default)]
    pub retries: u32,
    /// Why a `PENDING` job waits, in words ("needs 16 GPUs on one agent; largest is 8",
    /// "team nlp at its quota 8/8", "behind 3 higher-priority jobs", "reserved for job 12").
    #[serde(default)]
    pub pending_reason: Option<String>,
    /// A job eligible to run: its place in the scheduling order of the whole queue (1: next).
    #[serde(default)]
    pub position: Option<u32>,
    /// The same among its team's jobs.
    #[serde(default)]
    pub team_position: Option<u32>,
    /// The array it belongs to (the id of the array's first job).
    #[serde(default)]
    pub array_job: Option<u64>,
    /// Its index in the array.
    #[serde(default)]
    pub array_index: Option<u32>,
    /// On an array's first job: how many of the array's jobs are in each state.
    #[serde(default)]
    pub array_summary: Option<BTreeMap<String, u32>>,
    /// A pending job's estimated start, Unix milliseconds: the queue simulated forward with
    /// time limits (as `squeue --start`). `None` when unknown (it waits behind work without a
    /// time limit, or is past the first jobs estimated).
    #[serde(default)]
    pub estimated_start_unix_ms: Option<u64>,
}

/// One worker of a job as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Worker index.
    pub index: u32,
    /// Its task.
    pub task_id: TaskId,
    /// The agent it was launched on.
    pub agent_id: AgentId,
    /// That agent's hostname.
    pub hostname: String,
    /// GPU UUIDs (planned, then as reported).
    pub gpus: Vec<String>,
    /// Its last known task state.
    pub state: TaskState,
    /// Killed on purpose (cancel, preemption, shrink): its end is expected.
    pub killing: bool,
    /// When it was launched, Unix milliseconds (usage and cost count from it; records written
    /// by earlier versions hold when it started running, if it had).
    pub started_unix_ms: u64,
}

/// A job as the store keeps it: its specification, who submitted it, its state, its attempts
/// and its workers. Times are Unix milliseconds (the core keeps monotonic instants; the
/// runtime converts with the wall clock it passes in).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Job id.
    pub id: u64,
    /// As submitted.
    pub spec: JobSpec,
    /// Who submitted it (the authenticated user; empty in dev mode without one).
    #[serde(default)]
    pub user: String,
    /// State.
    pub state: JobState,
    /// Submission time.
    pub submitted_unix_ms: u64,
    /// Start of the current wait.
    pub waiting_since_unix_ms: u64,
    /// Waiting before the current wait, milliseconds.
    pub waited_ms: u64,
    /// Times it was preempted.
    pub preemptions: u32,
    /// Times its workers were launched (a requeue starts a new attempt).
    pub attempts: u32,
    /// Times it was run again after a failure.
    #[serde(default)]
    pub retries: u32,
    /// The requeue is a retry after a failure (it waits out a backoff).
    #[serde(default)]
    pub retrying: bool,
    /// A retry waits until then (Unix milliseconds).
    #[serde(default)]
    pub not_before_unix_ms: Option<u64>,
    /// When the current attempt was launched (Unix milliseconds; the time limit counts from
    /// it).
    #[serde(default)]
    pub attempt_started_unix_ms: Option<u64>,
    /// Being requeued: every worker killed, pending again once all have ended.
    pub preempting: bool,
    /// The requeue is for a lost worker, not a preemption.
    pub lost: bool,
    /// Workers that finished successfully in the current attempt.
    pub finished_members: u32,
    /// The next worker index.
    pub next_index: u32,
    /// Why it ended or was requeued.
    pub message: String,
    /// Still waiting for a dependency.
    pub on_deps: bool,
    /// Its workers now.
    pub members: Vec<MemberRecord>,
}

/// One worker's use of GPUs, recorded when it ends (the usage history).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// The job.
    pub job: u64,
    /// Its team.
    pub team: String,
    /// Its user.
    pub user: String,
    /// The attempt the worker belonged to.
    pub attempt: u32,
    /// The worker's task.
    pub task_id: TaskId,
    /// GPUs it held (`0.5` for half a GPU; records written before fractions hold integers).
    pub gpus: Gpus,
    /// Seconds it held its resources: from its launch (staging included) to its end.
    pub secs: f64,
    /// When it ended, Unix milliseconds.
    pub ended_unix_ms: u64,
    /// What it cost: its agent's `price_per_hour` × its dominant share of the agent × its
    /// run time (`crate::usage`, "Cost"); `None` on an agent without a price (and in
    /// records written before the queue priced workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}
