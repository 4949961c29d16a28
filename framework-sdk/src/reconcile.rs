//! Built-in reconciliation (Mesos "task reconciliation"): after a failover or a lost message
//! the framework and the master may disagree about tasks; asking the master for the state of
//! every task ("implicit" reconciliation, an empty list) makes it send a status update
//! (`reconciliation: true`) for each task it knows, so the scheduler converges.
//!
//! [`ReconcileConfig`] in [`DriverConfig::reconcile`](crate::DriverConfig) turns it on: the
//! driver reconciles right after every (re-)subscription (`on_subscribe`) and then every
//! `every`. Both are off by default, so schedulers that count updates see none they did not
//! ask for; a scheduler that keeps a [`TaskBook`](crate::book::TaskBook) ignores answers that
//! change nothing. [`Reconciler`] is the pure timing logic the driver uses (time is an
//! argument), usable on its own by schedulers that drive reconciliation themselves.

use std::time::{Duration, Instant};

/// When the driver reconciles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReconcileConfig {
    /// Reconcile every task right after each (re-)subscription (reconnect, master failover).
    pub on_subscribe: bool,
    /// Reconcile every task this often while subscribed (`None`: never periodically).
    pub every: Option<Duration>,
}

impl ReconcileConfig {
    /// On every subscription and every `every` (a sensible choice: `10 min`, as Mesos
    /// frameworks commonly do).
    pub fn periodic(every: Duration) -> Self {
        Self {
            on_subscribe: true,
            every: Some(every),
        }
    }
}

/// The reconciliation schedule: when to send an implicit reconciliation.
#[derive(Debug, Clone)]
pub struct Reconciler {
    config: ReconcileConfig,
    next: Option<Instant>,
}

impl Reconciler {
    /// A schedule for `config`; nothing is due before [`Reconciler::subscribed`].
    pub fn new(config: ReconcileConfig) -> Self {
        Self { config, next: None }
    }

    /// Called on each (re-)subscription at `now`: true when a reconciliation is due at once.
    pub fn subscribed(&mut self, now: Instant) -> bool {
        self.next = self.config.every.map(|e| now + e);
        self.config.on_subscribe
    }

    /// Called when the connection is lost: nothing is due until the next subscription.
    pub fn disconnected(&mut self) {
        self.next = None;
    }

    /// When the next periodic reconciliation is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.next
    }

    /// True when a periodic reconciliation is due at `now` (and schedules the next one).
    pub fn poll(&mut self, now: Instant) -> bool {
        match (self.next, self.config.every) {
            (Some(at), Some(every)) if now >= at => {
                self.next = Some(now + every);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciles_on_subscribe_and_periodically_only_while_subscribed() {
        let t = Instant::now();
        let mut r = Reconciler::new(ReconcileConfig::periodic(Duration::from_secs(10)));
        assert!(!r.poll(t + Duration::from_secs(100)), "not subscribed yet");
        assert!(r.subscribed(t));
        assert!(!r.poll(t + Duration::from_secs(9)));
        assert!(r.poll(t + Duration::from_secs(10)));
        assert!(!r.poll(t + Duration::from_secs(11)));
        assert_eq!(r.next_due(), Some(t + Duration::from_secs(20)));
        r.disconnected();
        assert!(!r.poll(t + Duration::from_secs(100)));
        let mut off = Reconciler::new(ReconcileConfig::default());
        assert!(!off.subscribed(t));
        assert!(!off.poll(t + Duration::from_secs(1_000_000)));
    }
}
