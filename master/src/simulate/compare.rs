//! `gantry-master simulate --openb NODES.csv PODS.csv... --openb-compare A B --seeds 1-30`:
//! a paired comparison of two placement policies on the openb replay.
//!
//! Each seed's arrival sequence ([`super::openb::arrivals`]) goes through both policies in the
//! same run, so the two allocation curves of a seed differ only by the policy; per seed the
//! difference `A − B` is taken at 100% arrived and averaged over 50–130% arrived, and the table
//! gives the mean difference with a 95% confidence interval (Student's t interval on the paired
//! differences, [`paired`]). The statistics are hand-written (a mean, a standard deviation and a
//! table of t quantiles): no statistics crate is in the dependency tree, and these few lines do
//! not justify one.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use gantry_placement::{Policy, Workload};
use serde_json::{json, Value};

use super::openb::{run_seed, OpenbTrace, SeedRun, MAX_PERCENT};
use super::SimError;

/// The arrived percent where the averaged window starts.
pub const WINDOW_FROM: usize = 50;

/// A sample's mean with a 95% confidence interval `mean ± half_width`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// The sample mean.
    pub mean: f64,
    /// Half the width of the 95% interval (0 for one value).
    pub half_width: f64,
    /// The sample size.
    pub n: usize,
}

impl Interval {
    /// The interval's lower end.
    pub fn low(&self) -> f64 {
        self.mean - self.half_width
    }

    /// The interval's upper end.
    pub fn high(&self) -> f64 {
        self.mean + self.half_width
    }
}

/// Two-sided 97.5% quantiles of Student's t for 1..=30 degrees of freedom.
const T975: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// The 97.5% quantile of Student's t with `df` degrees of freedom (`df ≥ 1`): the table up to
/// 30, beyond it the Cornish–Fisher expansion around the normal quantile (error below 1e-3).
pub fn t975(df: usize) -> f64 {
    if let Some(&t) = df.checked_sub(1).and_then(|i| T975.get(i)) {
        return t;
    }
    let z: f64 = 1.959_964;
    let n = df.max(1) as f64;
    let z3 = z.powi(3);
    let z5 = z.powi(5);
    z + (z3 + z) / (4.0 * n) + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * n * n)
}

/// The mean of `sample` with its 95% t interval; `None` for an empty sample.
pub fn paired(sample: &[f64]) -> Option<Interval> {
    let n = sample.len();
    if n == 0 {
        return None;
    }
    let mean = sample.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return Some(Interval {
            mean,
            half_width: 0.0,
            n,
        });
    }
    let var = sample.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    Some(Interval {
        mean,
        half_width: t975(n - 1) * (var / n as f64).sqrt(),
        n,
    })
}

/// A seed run's mean allocation over 50–130% arrived.
pub fn window_mean(run: &SeedRun) -> f64 {
    let w = &run.allocation_percent[WINDOW_FROM.min(run.allocation_percent.len())..];
    if w.is_empty() {
        0.0
    } else {
        w.iter().sum::<f64>() / w.len() as f64
    }
}

fn at_100(run: &SeedRun) -> f64 {
    run.allocation_percent.get(100).copied().unwrap_or(0.0)
}

/// Both policies' runs of every seed on one pod list.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The pod list's name (its file name).
    pub list: String,
    /// The policies compared, `A` then `B`.
    pub policies: [Policy; 2],
    /// Per seed: `A`'s run, `B`'s run.
    pub runs: Vec<(SeedRun, SeedRun)>,
    /// Wall time of the whole comparison.
    pub wall_seconds: f64,
}

/// One row of the table: `A`'s and `B`'s means and the paired difference.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// `A`'s mean.
    pub a: f64,
    /// `B`'s mean.
    pub b: f64,
    /// The paired difference `A − B`.
    pub diff: Interval,
    /// Seeds where `A` is above `B`.
    pub wins: usize,
    /// Seeds where `A` is below `B`.
    pub losses: usize,
}

impl Comparison {
    fn row(&self, metric: impl Fn(&SeedRun) -> f64) -> Row {
        let n = self.runs.len().max(1) as f64;
        let diffs: Vec<f64> = self
            .runs
            .iter()
            .map(|(a, b)| metric(a) - metric(b))
            .collect();
        Row {
            a: self.runs.iter().map(|(a, _)| metric(a)).sum::<f64>() / n,
            b: self.runs.iter().map(|(_, b)| metric(b)).sum::<f64>() / n,
            diff: paired(&diffs).unwrap_or(Interval {
                mean: 0.0,
                half_width: 0.0,
                n: 0,
            }),
            wins: diffs.iter().filter(|&&d| d > 0.0).count(),
            losses: diffs.iter().filter(|&&d| d < 0.0).count(),
        }
    }

    /// The difference at 100% arrived.
    pub fn at_100(&self) -> Row {
        self.row(at_100)
    }

    /// The difference of the mean over 50–130% arrived.
    pub fn window(&self) -> Row {
        self.row(window_mean)
    }

    /// The lowest point of the mean difference curve from 50% arrived on: `(arrived, A − B)`.
    pub fn worst_point(&self) -> (usize, f64) {
        let n = self.runs.len().max(1) as f64;
        (WINDOW_FROM..=MAX_PERCENT)
            .map(|x| {
                let d = self
                    .runs
                    .iter()
                    .map(|(a, b)| a.allocation_percent[x] - b.allocation_percent[x])
                    .sum::<f64>()
                    / n;
                (x, d)
            })
            .fold((WINDOW_FROM, f64::INFINITY), |acc, p| {
                if p.1 < acc.1 {
                    p
                } else {
                    acc
                }
            })
    }

    /// Failed tasks up to 130% arrived.
    pub fn failed(&self) -> Row {
        self.row(|r| r.failed_tasks as f64)
    }

    /// The table.
    pub fn write_text<W: Write>(&self, out: &mut W) -> Result<(), SimError> {
        let [a, b] = self.policies;
        writeln!(
            out,
            "pod list {}: A = {a}, B = {b}, {} seeds paired ({:.1} s)",
            self.list,
            self.runs.len(),
            self.wall_seconds
        )?;
        writeln!(
            out,
            "  {:<22} {:>8} {:>8} {:>9} {:>22} {:>8}",
            "metric", "A", "B", "A−B", "95% CI", "A>B/A<B"
        )?;
        for (name, row) in [
            ("alloc % at 100%", self.at_100()),
            ("alloc % mean 50–130%", self.window()),
            ("failed tasks to 130%", self.failed()),
        ] {
            writeln!(
                out,
                "  {:<22} {:>8.2} {:>8.2} {:>+9.3} {:>22} {:>8}",
                name,
                row.a,
                row.b,
                row.diff.mean,
                format!("[{:+.3}, {:+.3}]", row.diff.low(), row.diff.high()),
                format!("{}/{}", row.wins, row.losses),
            )?;
        }
        let (x, d) = self.worst_point();
        writeln!(
            out,
            "  lowest mean A−B from {WINDOW_FROM}% arrived on: {d:+.3} at {x}%"
        )?;
        Ok(())
    }

    /// One JSON object.
    pub fn to_json(&self) -> Value {
        let row = |r: Row| {
            json!({
                "a": r.a, "b": r.b, "diff": r.diff.mean,
                "ci95": [r.diff.low(), r.diff.high()],
                "a_above_b": r.wins, "a_below_b": r.losses,
            })
        };
        let (x, d) = self.worst_point();
        json!({
            "list": self.list,
            "a": self.policies[0].name(),
            "b": self.policies[1].name(),
            "seeds": self.runs.iter().map(|(a, _)| a.seed).collect::<Vec<_>>(),
            "at_100": row(self.at_100()),
            "mean_50_130": row(self.window()),
            "failed": row(self.failed()),
            "worst_point": {"arrived": x, "diff": d},
            "wall_seconds": self.wall_seconds,
        })
    }
}

/// Runs both policies over every seed on one pod list (seeds spread over the cores; progress
/// to `progress`, one line per finished seed).
pub fn compare(
    trace: &OpenbTrace,
    list: &str,
    policies: [Policy; 2],
    seeds: &[u64],
    progress: &mut (dyn Write + Send),
) -> Result<Comparison, SimError> {
    let started = Instant::now();
    let workload = Workload::from_tasks(&trace.tasks);
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(seeds.len())
        .max(1);
    let next = AtomicUsize::new(0);
    type Both = Result<(SeedRun, SeedRun), SimError>;
    let results: Mutex<BTreeMap<usize, Both>> = Mutex::new(BTreeMap::new());
    let progress = Mutex::new(progress);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seed) = seeds.get(k) else { break };
                let both = run_seed(trace, &workload, policies[0], seed)
                    .and_then(|a| run_seed(trace, &workload, policies[1], seed).map(|b| (a, b)));
                if let (Ok((a, b)), Ok(mut p)) = (&both, progress.lock()) {
                    // Progress is best effort: a closed stderr does not stop the replay.
                    let _ = writeln!(
                        p,
                        "{list} seed {seed}: {} {:.2} / {} {:.2} at 100% ({:.0} s)",
                        policies[0],
                        at_100(a),
                        policies[1],
                        at_100(b),
                        started.elapsed().as_secs_f64()
                    );
                }
                if let Ok(mut r) = results.lock() {
                    r.insert(k, both);
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
    Ok(Comparison {
        list: list.to_string(),
        policies,
        runs,
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-3
    }

    #[test]
    fn a_known_sample_has_its_mean_and_t_interval() {
        // 1..=10: mean 5.5, sd = sqrt(55/6) = 3.02765, se = 0.957427, t(9) = 2.262.
        let sample: Vec<f64> = (1..=10).map(f64::from).collect();
        let i = paired(&sample).expect("a sample");
        assert!(close(i.mean, 5.5), "{i:?}");
        assert!(close(i.half_width, 2.262 * 0.957_427), "{i:?}");
        assert_eq!(i.n, 10);
        // A constant sample has a zero-width interval; one value has no spread.
        let c = paired(&[0.25; 30]).expect("a sample");
        assert!(close(c.mean, 0.25) && c.half_width.abs() < 1e-12);
        assert_eq!(paired(&[3.0]).map(|i| i.half_width), Some(0.0));
        assert!(paired(&[]).is_none());
        // Differences straddling zero give an interval containing zero.
        let d = paired(&[1.0, -1.0, 0.5, -0.5]).expect("a sample");
        assert!(d.low() < 0.0 && d.high() > 0.0);
    }

    #[test]
    fn t_quantiles_match_the_table_and_approach_the_normal() {
        assert!(close(t975(1), 12.706));
        assert!(close(t975(29), 2.045));
        // Beyond the table: t(40) = 2.021, t(60) = 2.000, t(120) = 1.980.
        assert!((t975(40) - 2.021).abs() < 2e-3, "{}", t975(40));
        assert!((t975(60) - 2.000).abs() < 2e-3, "{}", t975(60));
        assert!((t975(120) - 1.980).abs() < 2e-3, "{}", t975(120));
        assert!(t975(31) < t975(30) && t975(31) > 1.96);
    }

    fn run(seed: u64, curve: impl Fn(usize) -> f64) -> SeedRun {
        SeedRun {
            seed,
            allocation_percent: (0..=MAX_PERCENT).map(curve).collect(),
            arrived_tasks: 0,
            failed_tasks: 0,
            placement_us: Vec::new(),
            placement_cpu_us: Vec::new(),
        }
    }

    #[test]
    fn rows_are_paired_per_seed() {
        // A is B plus 0.1 on every seed, while seeds differ by far more: the paired interval
        // is exactly +0.1 wide zero.
        let runs = (0..5)
            .map(|s| {
                let base = s as f64 * 3.0;
                (
                    run(s, |x| (x as f64).min(90.0) + base + 0.1),
                    run(s, |x| (x as f64).min(90.0) + base),
                )
            })
            .collect();
        let c = Comparison {
            list: "t".into(),
            policies: [Policy::FgdPack, Policy::Fgd],
            runs,
            wall_seconds: 0.0,
        };
        let r = c.at_100();
        assert!(close(r.diff.mean, 0.1) && r.diff.half_width < 1e-9, "{r:?}");
        assert_eq!((r.wins, r.losses), (5, 0));
        assert!(close(c.window().diff.mean, 0.1));
        let (_, worst) = c.worst_point();
        assert!(close(worst, 0.1));
        let json = c.to_json();
        assert_eq!(json["a"], "fgd-pack");
    }
}
