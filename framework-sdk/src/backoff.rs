//! Backoff helpers for schedulers: [`Backoff`] (capped exponential with jitter, re-exported
//! from the transport) and [`RestartBackoff`], a pure per-key exponential delay for restarting
//! what keeps failing (a service instance, a job) without a hot loop.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use gantry_sdk::backoff::RestartBackoff;
//! let mut b = RestartBackoff::new(Duration::from_secs(1), Duration::from_secs(60));
//! let t0 = Instant::now();
//! assert!(b.ready(&"web/0", t0));
//! b.failed("web/0", t0);
//! assert!(!b.ready(&"web/0", t0));
//! assert!(b.ready(&"web/0", t0 + Duration::from_secs(1)));
//! b.failed("web/0", t0);
//! assert_eq!(b.delay(&"web/0"), Duration::from_secs(2));
//! ```

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

pub use gantry_transport::backoff::Backoff;

/// Per-key exponential restart delays: after the n-th consecutive failure the key waits
/// `initial * 2^(n-1)` (at most `max`) before it is [`ready`](RestartBackoff::ready) again; a
/// success resets it. Pure: the time is an argument.
#[derive(Debug, Clone)]
pub struct RestartBackoff<K> {
    initial: Duration,
    max: Duration,
    state: HashMap<K, (u32, Instant)>,
}

impl<K: Hash + Eq> RestartBackoff<K> {
    /// Delays from `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            state: HashMap::new(),
        }
    }

    /// Records a failure of `key` at `now`; returns the delay before it may restart.
    pub fn failed(&mut self, key: K, now: Instant) -> Duration {
        let e = self.state.entry(key).or_insert((0, now));
        e.0 = e.0.saturating_add(1);
        let delay = self
            .initial
            .saturating_mul(1u32 << (e.0 - 1).min(20))
            .min(self.max);
        e.1 = now + delay;
        delay
    }

    /// Records a success: the next failure starts from `initial` again.
    pub fn succeeded(&mut self, key: &K) {
        self.state.remove(key);
    }

    /// True when `key` may be (re)started at `now`.
    pub fn ready(&self, key: &K, now: Instant) -> bool {
        self.state.get(key).is_none_or(|(_, at)| now >= *at)
    }

    /// The delay the last failure of `key` set (zero when it has not failed).
    pub fn delay(&self, key: &K) -> Duration {
        self.state.get(key).map_or(Duration::ZERO, |(n, _)| {
            self.initial
                .saturating_mul(1u32 << (n.saturating_sub(1)).min(20))
                .min(self.max)
        })
    }

    /// Consecutive failures of `key`.
    pub fn failures(&self, key: &K) -> u32 {
        self.state.get(key).map_or(0, |(n, _)| *n)
    }

    /// When the earliest waiting key becomes ready, if any waits past `now`.
    pub fn next_ready(&self, now: Instant) -> Option<Instant> {
        self.state
            .values()
            .map(|(_, at)| *at)
            .filter(|at| *at > now)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_the_cap_and_reset_on_success() {
        let mut b = RestartBackoff::new(Duration::from_millis(500), Duration::from_secs(4));
        let t = Instant::now();
        let d: Vec<Duration> = (0..6).map(|_| b.failed(1, t)).collect();
        assert_eq!(
            d.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
            vec![500, 1000, 2000, 4000, 4000, 4000]
        );
        assert_eq!(b.failures(&1), 6);
        assert!(!b.ready(&1, t + Duration::from_millis(3999)));
        assert_eq!(b.next_ready(t), Some(t + Duration::from_secs(4)));
        b.succeeded(&1);
        assert!(b.ready(&1, t));
        assert_eq!(b.delay(&1), Duration::ZERO);
        assert!(b.ready(&2, t));
    }
}
