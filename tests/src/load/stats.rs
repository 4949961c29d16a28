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
}
