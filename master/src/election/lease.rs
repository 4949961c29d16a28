//! PURE: when must a leader consider its etcd lease lost?
//!
//! etcd expires a lease TTL seconds after it *processed* the last keep-alive. The master cannot
//! see that instant, but it knows when it *sent* the request that produced a successful answer,
//! which is earlier. So the local deadline is `sent + granted_ttl - margin`: it always falls
//! before the server-side expiry (by at least `margin`, plus the request's travel time), and a
//! leader that steps down at its local deadline is gone before etcd can let anyone else win.
//! Times are inputs; nothing here reads a clock.

use std::time::{Duration, Instant};

/// The step-down margin used when none is configured: a quarter of the TTL, at least 250 ms.
pub fn default_margin(ttl: Duration) -> Duration {
    (ttl / 4).max(Duration::from_millis(250))
}

/// How often to send keep-alives for a lease of `ttl`: three times per TTL-minus-margin window,
/// so two consecutive losses still leave time for a third try before the deadline.
pub fn keepalive_interval(ttl: Duration, margin: Duration) -> Duration {
    (ttl.saturating_sub(margin) / 3).max(Duration::from_millis(50))
}

/// The locally tracked validity of one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseDeadline {
    margin: Duration,
    deadline: Instant,
}

impl LeaseDeadline {
    /// A lease granted with `granted_ttl` by a grant request sent at `sent`.
    pub fn granted(sent: Instant, granted_ttl: Duration, margin: Duration) -> Self {
        LeaseDeadline {
            margin,
            deadline: (sent + granted_ttl).checked_sub(margin).unwrap_or(sent),
        }
    }

    /// A successful keep-alive answer (TTL > 0) to a request sent at `sent`. The deadline never
    /// moves backwards (a late answer to an older request must not shorten it).
    pub fn renewed(&mut self, sent: Instant, granted_ttl: Duration) {
        let candidate = (sent + granted_ttl)
            .checked_sub(self.margin)
            .unwrap_or(sent);
        if candidate > self.deadline {
            self.deadline = candidate;
        }
    }

    /// The instant after which the lease must be treated as lost.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the lease must be treated as lost at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        now >= self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_before_server_expiry_and_only_moves_forward() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(3);
        let margin = default_margin(ttl);
        assert_eq!(margin, Duration::from_millis(750));
        let mut d = LeaseDeadline::granted(t0, ttl, margin);
        assert_eq!(d.deadline(), t0 + Duration::from_millis(2250));
        assert!(!d.expired(t0 + Duration::from_secs(2)));
        assert!(d.expired(t0 + Duration::from_millis(2250)));
        d.renewed(t0 + Duration::from_secs(1), ttl);
        assert_eq!(d.deadline(), t0 + Duration::from_millis(3250));
        // An answer to an older request does not pull the deadline back.
        d.renewed(t0 + Duration::from_millis(500), ttl);
        assert_eq!(d.deadline(), t0 + Duration::from_millis(3250));
    }

    #[test]
    fn interval_leaves_three_tries_per_window() {
        let ttl = Duration::from_secs(3);
        let i = keepalive_interval(ttl, default_margin(ttl));
        assert_eq!(i, Duration::from_millis(750));
        assert_eq!(
            keepalive_interval(Duration::from_millis(100), Duration::from_millis(250)),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn margin_larger_than_ttl_means_already_expired() {
        let t0 = Instant::now();
        let d = LeaseDeadline::granted(t0, Duration::from_millis(100), Duration::from_secs(1));
        assert!(d.expired(t0));
    }
}
