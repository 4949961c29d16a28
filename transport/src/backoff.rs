//! Capped exponential backoff with jitter, for reconnects and status-update retries.

use std::time::Duration;

/// Doubles from `initial` up to `max`; each delay is jittered into `[d/2, d]`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// Starts at `initial` and doubles up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            current: initial,
        }
    }

    /// The next delay to wait.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.current;
        self.current = (self.current * 2).min(self.max);
        let nanos = d.as_nanos() as u64;
        let jitter = if nanos > 1 {
            pseudo_random() % (nanos / 2)
        } else {
            0
        };
        Duration::from_nanos(nanos - jitter)
    }

    /// Jump to the largest delay (the peer is known to be down for a while).
    pub fn hold_off(&mut self) {
        self.current = self.max;
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

fn pseudo_random() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<_> = (0..6).map(|_| b.next_delay()).collect();
        assert!(delays[0] <= Duration::from_millis(100) && delays[0] >= Duration::from_millis(50));
        assert!(delays[5] <= Duration::from_secs(1) && delays[5] >= Duration::from_millis(500));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
