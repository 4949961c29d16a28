//! The simulator's bookkeeping (what every policy's run records) and the report made of it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::trace::TraceJob;

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Not ended when the simulation stopped.
    Unfinished,
    /// Ran to its end.
    Finished,
    /// Killed at its time limit.
    TimeLimit,
    /// Ended otherwise (failed, cancelled: a deadline or a dependency).
    Other,
}

/// One job's record.
#[derive(Debug, Clone, Serialize)]
pub struct JobRecord {
    /// When its first attempt started, seconds.
    pub first_start: Option<f64>,
    /// When it ended, seconds.
    pub end: Option<f64>,
    /// How it ended.
    pub outcome: Outcome,
    /// Times it was preempted (requeued).
    pub preemptions: u32,
    /// Its estimated start as the queue gave it at submission, seconds.
    pub eta: Option<f64>,
}

/// One worker's run: its team, GPUs, start and end (seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Team.
    pub team: String,
    /// GPUs held.
    pub gpus: u64,
    /// Start.
    pub start: f64,
    /// End.
    pub end: f64,
}

/// What a policy's run records as it goes.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Per trace job (same order).
    pub jobs: Vec<JobRecord>,
    /// Every worker run.
    pub runs: Vec<Run>,
    /// GPUs of the cluster.
    pub total_gpus: u64,
    /// GPU-seconds idle while a waiting job's gang fit in the free GPUs.
    pub idle_while_eligible_gpu_secs: f64,
    /// Idle GPUs counted for the interval now running (set after each step).
    pub idle_now: u64,
    last: f64,
}

impl Recorder {
    /// Nothing recorded yet, for `jobs` jobs on `total_gpus` GPUs.
    pub fn new(jobs: usize, total_gpus: u64) -> Self {
        Recorder {
            jobs: vec![
                JobRecord {
                    first_start: None,
                    end: None,
                    outcome: Outcome::Unfinished,
                    preemptions: 0,
                    eta: None,
                };
                jobs
            ],
            runs: Vec::new(),
            total_gpus,
            idle_while_eligible_gpu_secs: 0.0,
            idle_now: 0,
            last: 0.0,
        }
    }

    /// Time moves to `t`: the interval since the last call is accounted with the idle GPUs of
    /// the state it had.
    pub fn advance(&mut self, t: f64) {
        if t > self.last {
            self.idle_while_eligible_gpu_secs += self.idle_now as f64 * (t - self.last);
            self.last = t;
        }
    }

    /// A job's attempt started.
    pub fn started(&mut self, job: usize, t: f64) {
        let r = &mut self.jobs[job];
        r.first_start.get_or_insert(t);
    }

    /// A job ended.
    pub fn ended(&mut self, job: usize, t: f64, outcome: Outcome) {
        let r = &mut self.jobs[job];
        r.end = Some(t);
        r.outcome = outcome;
    }
}

/// Whether a gang of `workers` × `gpus` fits free GPU counts per agent.
pub fn gang_fits(free: &[u64], workers: u32, gpus: u32) -> bool {
    if gpus == 0 {
        return false;
    }
    let mut need = u64::from(workers);
    for f in free {
        need = need.saturating_sub(f / u64::from(gpus));
        if need == 0 {
            return true;
        }
    }
    false
}

/// Mean, median and 99th percentile, seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// How many values.
    pub count: usize,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// The `q` quantile (nearest rank) of sorted values.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl Summary {
    /// Of these values.
    pub fn of(mut v: Vec<f64>) -> Summary {
        if v.is_empty() {
            return Summary::default();
        }
        v.sort_by(f64::total_cmp);
        Summary {
            count: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: quantile(&v, 0.5),
            p99: quantile(&v, 0.99),
        }
    }
}

/// Estimated start against actual start (seconds), over the jobs that had an estimate.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct EtaError {
    /// Jobs with an estimate that started.
    pub jobs: usize,
    /// Mean of |estimate − actual|.
    pub mean_abs: f64,
    /// Median of |estimate − actual|.
    pub p50_abs: f64,
    /// 90th percentile of |estimate − actual|.
    pub p90_abs: f64,
    /// Mean of (actual − estimate): positive when jobs start later than said.
    pub mean_late: f64,
}

/// Per-team share of the cluster's GPUs over one interval.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ShareBucket {
    /// Start, seconds.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// Per team: its GPU-seconds over the interval's GPU-seconds (0..1).
    pub share: BTreeMap<String, f64>,
}

/// What a simulation reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// The policy (`queue`, `fifo`, `easy`).
    pub policy: String,
    /// Jobs in the trace.
    pub jobs: usize,
    /// Jobs that ran to their end.
    pub finished: usize,
    /// Jobs killed at their time limit.
    pub time_limited: usize,
    /// Jobs that ended otherwise (failed, cancelled).
    pub other_ended: usize,
    /// Jobs not ended when the simulation stopped.
    pub unfinished: usize,
    /// Wait: submission to first start, seconds (jobs that started).
    pub wait: Summary,
    /// Job completion time: submission to end, seconds (jobs that ran to their end).
    pub jct: Summary,
    /// First submission to last end, seconds.
    pub makespan: f64,
    /// GPU-seconds used over GPU-seconds of the makespan (0..1).
    pub gpu_utilization: f64,
    /// Preemptions (a job requeued counts once per attempt).
    pub preemptions: u64,
    /// Jobs with a deadline.
    pub deadlines: usize,
    /// Of them, those that did not run to their end by it.
    pub deadline_misses: usize,
    /// GPU-seconds idle while a waiting job's gang fit in the free GPUs (the simulator's own
    /// measure, the same for every policy: reservations are not excused).
    pub idle_while_eligible_gpu_secs: f64,
    /// The queue's own measure of it (free GPUs outside its reservation while a job fits
    /// there): `queue` only.
    pub queue_idle_while_eligible_gpu_secs: Option<f64>,
    /// GPU-seconds free but held for a blocked gang's reservation: `queue` only.
    pub reserved_idle_gpu_secs: Option<f64>,
    /// Estimated against actual start, when the queue gives estimates.
    pub eta_error: Option<EtaError>,
    /// Per-team GPU share over time.
    pub team_share: Vec<ShareBucket>,
}

impl Report {
    /// The report of a finished run.
    pub fn build(policy: &str, trace: &[TraceJob], rec: &Recorder, buckets: usize) -> Report {
        let count = |o: Outcome| rec.jobs.iter().filter(|j| j.outcome == o).count();
        let wait = trace
            .iter()
            .zip(&rec.jobs)
            .filter_map(|(t, r)| r.first_start.map(|s| s - t.submit))
            .collect();
        let jct = trace
            .iter()
            .zip(&rec.jobs)
            .filter(|(_, r)| r.outcome == Outcome::Finished)
            .filter_map(|(t, r)| r.end.map(|e| e - t.submit))
            .collect();
        let first = trace.iter().map(|t| t.submit).fold(f64::INFINITY, f64::min);
        let first = if first.is_finite() { first } else { 0.0 };
        let last = rec
            .runs
            .iter()
            .map(|r| r.end)
            .chain(rec.jobs.iter().filter_map(|j| j.end))
            .fold(first, f64::max);
        let makespan = last - first;
        let used: f64 = rec
            .runs
            .iter()
            .map(|r| r.gpus as f64 * (r.end - r.start))
            .sum();
        let capacity = rec.total_gpus as f64 * makespan;
        let with_deadline: Vec<(&TraceJob, &JobRecord)> = trace
            .iter()
            .zip(&rec.jobs)
            .filter(|(t, _)| t.deadline.is_some())
            .collect();
        let misses = with_deadline
            .iter()
            .filter(|(t, r)| {
                r.outcome != Outcome::Finished
                    || r.end.zip(t.deadline).is_none_or(|(e, d)| e > d + 1e-9)
            })
            .count();
        let mut errors: Vec<(f64, f64)> = rec
            .jobs
            .iter()
            .filter_map(|r| r.eta.zip(r.first_start))
            .map(|(eta, start)| ((start - eta).abs(), start - eta))
            .collect();
        let eta_error = (!errors.is_empty()).then(|| {
            errors.sort_by(|a, b| a.0.total_cmp(&b.0));
            let abs: Vec<f64> = errors.iter().map(|e| e.0).collect();
            EtaError {
                jobs: errors.len(),
                mean_abs: abs.iter().sum::<f64>() / abs.len() as f64,
                p50_abs: quantile(&abs, 0.5),
                p90_abs: quantile(&abs, 0.9),
                mean_late: errors.iter().map(|e| e.1).sum::<f64>() / errors.len() as f64,
            }
        });
        Report {
            policy: policy.to_string(),
            jobs: trace.len(),
            finished: count(Outcome::Finished),
            time_limited: count(Outcome::TimeLimit),
            other_ended: count(Outcome::Other),
            unfinished: count(Outcome::Unfinished),
            wait: Summary::of(wait),
            jct: Summary::of(jct),
            makespan,
            gpu_utilization: if capacity > 0.0 { used / capacity } else { 0.0 },
            preemptions: rec.jobs.iter().map(|j| u64::from(j.preemptions)).sum(),
            deadlines: with_deadline.len(),
            deadline_misses: misses,
            idle_while_eligible_gpu_secs: rec.idle_while_eligible_gpu_secs,
            queue_idle_while_eligible_gpu_secs: None,
            reserved_idle_gpu_secs: None,
            eta_error,
            team_share: shares(rec, first, last, buckets),
        }
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let s = |x: &Summary| {
            format!(
                "mean {:.1} s, p50 {:.1} s, p99 {:.1} s",
                x.mean, x.p50, x.p99
            )
        };
        let _ = writeln!(
            o,
            "policy {}: {} jobs: {} finished, {} time-limited, {} other, {} unfinished",
            self.policy,
            self.jobs,
            self.finished,
            self.time_limited,
            self.other_ended,
            self.unfinished
        );
        let _ = writeln!(o, "  wait: {}", s(&self.wait));
        let _ = writeln!(o, "  JCT:  {}", s(&self.jct));
        let _ = writeln!(
            o,
            "  makespan {:.0} s, GPU utilization {:.1}%, preemptions {}",
            self.makespan,
            self.gpu_utilization * 100.0,
            self.preemptions
        );
        let _ = writeln!(
            o,
            "  deadline misses {} of {}",
            self.deadline_misses, self.deadlines
        );
        let _ = write!(
            o,
            "  idle while eligible {:.0} GPU-s",
            self.idle_while_eligible_gpu_secs
        );
        if let Some(q) = self.queue_idle_while_eligible_gpu_secs {
            let _ = write!(o, " (the queue's own measure {q:.0} GPU-s)");
        }
        if let Some(r) = self.reserved_idle_gpu_secs {
            let _ = write!(o, ", reserved idle {r:.0} GPU-s");
        }
        let _ = writeln!(o);
        match &self.eta_error {
            Some(e) => {
                let _ = writeln!(o, "  ETA error over {} jobs: mean |err| {:.1} s, p50 {:.1} s, p90 {:.1} s, mean lateness {:.1} s",
                    e.jobs, e.mean_abs, e.p50_abs, e.p90_abs, e.mean_late);
            }
            None => {
                let _ = writeln!(o, "  ETA error: no estimates");
            }
        }
        let _ = writeln!(o, "  team share of GPUs over time:");
        for b in &self.team_share {
            let parts: Vec<String> = b
                .share
                .iter()
                .map(|(t, s)| format!("{t} {:.0}%", s * 100.0))
                .collect();
            let _ = writeln!(
                o,
                "    {:>10.0}..{:<10.0} {}",
                b.start,
                b.end,
                parts.join(", ")
            );
        }
        o
    }
}

/// Per-team GPU share in `buckets` equal intervals of `[first, last]`.
fn shares(rec: &Recorder, first: f64, last: f64, buckets: usize) -> Vec<ShareBucket> {
    if last <= first || buckets == 0 || rec.total_gpus == 0 {
        return Vec::new();
    }
    let width = (last - first) / buckets as f64;
    let mut out: Vec<ShareBucket> = (0..buckets)
        .map(|i| ShareBucket {
            start: first + width * i as f64,
            end: first + width * (i + 1) as f64,
            share: BTreeMap::new(),
        })
        .collect();
    for r in &rec.runs {
        let lo = (((r.start - first) / width).floor().max(0.0) as usize).min(buckets - 1);
        let hi = (((r.end - first) / width).floor().max(0.0) as usize).min(buckets - 1);
        for b in out.iter_mut().take(hi + 1).skip(lo) {
            let overlap = r.end.min(b.end) - r.start.max(b.start);
            if overlap > 0.0 {
                *b.share.entry(r.team.clone()).or_default() +=
                    r.gpus as f64 * overlap / (width * rec.total_gpus as f64);
            }
        }
    }
    out
}
