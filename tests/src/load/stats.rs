//! Latency samples and their summary (count, p50, p99, max).

use std::sync::Mutex;
use std::time::Duration;

/// Latency samples in microseconds, recorded from many tasks at once.
#[derive(Default)]
pub struct Samples(Mutex<Vec<u32>>);

impl Samples {
    pub fn record(&self, d: Duration) {
        let us = u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(us);
    }

    pub fn summary(&self) -> Summary {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Summary::of(&mut v)
    }
}

/// Nearest-rank percentiles of a set of samples, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    pub fn of(us: &mut [u32]) -> Self {
        if us.is_empty() {
            return Self::default();
        }
        us.sort_unstable();
        let at = |p: f64| {
            let rank = ((us.len() as f64 * p).ceil() as usize).clamp(1, us.len());
            us[rank - 1] as f64 / 1000.0
        };
        Self {
            count: us.len(),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: us[us.len() - 1] as f64 / 1000.0,
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "count": self.count,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
        })
    }
}

/// The master's allocation cycles in a window, from two readings of its
/// `gantry_allocation_cycle_seconds` histogram (`GET /metrics`): every cycle counted, the mean
/// exact, percentiles as the upper bound of their bucket (the buckets grow 4× each).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cycles {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_le_ms: f64,
    pub p99_le_ms: f64,
    pub max_le_ms: f64,
}

/// One reading of the cycle histogram: (sum of seconds, count, cumulative (le, count) buckets).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CycleReading {
    sum_s: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl CycleReading {
    /// Reads the histogram out of an OpenMetrics text (`None` when it is not there).
    pub fn parse(text: &str) -> Option<Self> {
        const NAME: &str = "gantry_allocation_cycle_seconds";
        let mut r = CycleReading::default();
        let mut seen = false;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(NAME) else {
                continue;
            };
            let value = rest.rsplit(' ').next()?;
            if rest.starts_with("_sum ") {
                r.sum_s = value.parse().ok()?;
                seen = true;
            } else if rest.starts_with("_count ") {
                r.count = value.parse().ok()?;
            } else if let Some(b) = rest.strip_prefix("_bucket{le=\"") {
                let le = b.split('"').next()?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                r.buckets.push((le, value.parse().ok()?));
            }
        }
        seen.then_some(r)
    }

    /// The cycles between `earlier` and this reading.
    pub fn since(&self, earlier: &CycleReading) -> Cycles {
        let count = self.count.saturating_sub(earlier.count);
        if count == 0 {
            return Cycles::default();
        }
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0, |(_, n)| *n)
        };
        let cum: Vec<(f64, u64)> = self
            .buckets
            .iter()
            .map(|(le, n)| (*le, n.saturating_sub(before(*le))))
            .collect();
        let le_of = |q: f64| {
            let rank = ((count as f64) * q).ceil().max(1.0) as u64;
            cum.iter()
                .find(|(_, n)| *n >= rank)
                .map_or(f64::INFINITY, |(le, _)| le * 1000.0)
        };
        Cycles {
            count,
            mean_ms: (self.sum_s - earlier.sum_s) / count as f64 * 1000.0,
            p50_le_ms: le_of(0.5),
            p99_le_ms: le_of(0.99),
            max_le_ms: le_of(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<u32> = (1..=100).map(|i| i * 1000).collect();
        let s = Summary::of(&mut v);
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_ms, 50.0);
        assert_eq!(s.p99_ms, 99.0);
        assert_eq!(s.max_ms, 100.0);
        assert_eq!(Summary::of(&mut []), Summary::default());
        assert_eq!(Summary::of(&mut [7000]).p99_ms, 7.0);
    }

    #[test]
    fn cycles_between_two_readings_of_the_histogram() {
        let text = |sum: f64, count: u64, b: [u64; 3]| {
            format!(
                "# TYPE gantry_allocation_cycle_seconds histogram\n\
                 gantry_allocation_cycle_seconds_sum {sum}\n\
                 gantry_allocation_cycle_seconds_count {count}\n\
                 gantry_allocation_cycle_seconds_bucket{{le=\"0.00001\"}} {}\n\
                 gantry_allocation_cycle_seconds_bucket{{le=\"0.00004\"}} {}\n\
                 gantry_allocation_cycle_seconds_bucket{{le=\"+Inf\"}} {}\n\
                 gantry_leader 1\n",
                b[0], b[1], b[2]
            )
        };
        let a = CycleReading::parse(&text(0.001, 10, [10, 10, 10])).expect("parsed");
        let b = CycleReading::parse(&text(0.003, 110, [10, 109, 110])).expect("parsed");
        let c = b.since(&a);
        assert_eq!(c.count, 100);
        assert!((c.mean_ms - 0.02).abs() < 1e-9, "{c:?}");
        assert_eq!(c.p50_le_ms, 0.04);
        assert_eq!(c.p99_le_ms, 0.04);
        assert_eq!(c.max_le_ms, f64::INFINITY);
        assert_eq!(CycleReading::parse("gantry_leader 1\n"), None);
    }
}
