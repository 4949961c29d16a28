//! Timers a scheduler sets through its [`DriverHandle`](crate::DriverHandle): one-shot
//! ([`DriverHandle::after`](crate::DriverHandle::after)) and periodic
//! ([`DriverHandle::every`](crate::DriverHandle::every)), delivered as
//! [`Scheduler::wake`](crate::Scheduler::wake) in order with the master's messages. Pure: the
//! driver gives it the time; it says which tokens are due and when the next one is.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

/// Identifies a timer, to cancel it ([`DriverHandle::cancel_timer`](crate::DriverHandle::cancel_timer)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(pub(crate) u64);

/// The shortest period of a periodic timer (a zero period would spin the driver).
pub const MIN_PERIOD: Duration = Duration::from_millis(1);

#[derive(Debug)]
struct Timer {
    token: u64,
    every: Option<Duration>,
}

/// The pending timers, by due time.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    due: BTreeMap<(Instant, TimerId), Timer>,
    at: HashMap<TimerId, Instant>,
}

impl Timers {
    /// Sets timer `id` to fire `token` at `at`, then every `every` after it if given.
    pub(crate) fn add(&mut self, id: TimerId, at: Instant, token: u64, every: Option<Duration>) {
        self.cancel(id);
        let every = every.map(|p| p.max(MIN_PERIOD));
        self.due.insert((at, id), Timer { token, every });
        self.at.insert(id, at);
    }

    /// Cancels timer `id` (nothing if it already fired or never existed).
    pub(crate) fn cancel(&mut self, id: TimerId) {
        if let Some(at) = self.at.remove(&id) {
            self.due.remove(&(at, id));
        }
    }

    /// When the next timer is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.due.keys().next().map(|(at, _)| *at)
    }

    /// The tokens due at `now`, in due order. A periodic timer fires once however many of its
    /// periods passed (a driver that was busy does not get a burst) and is set again for its
    /// next period after `now`.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(entry) = self.due.first_entry() {
            let (at, id) = *entry.key();
            if at > now {
                break;
            }
            let timer = entry.remove();
            self.at.remove(&id);
            out.push(timer.token);
            if let Some(period) = timer.every {
                let late = now.saturating_duration_since(at).as_nanos();
                let periods = late / period.as_nanos() + 1;
                let next = at + period * u32::try_from(periods).unwrap_or(u32::MAX);
                self.due.insert((next, id), timer);
                self.at.insert(id, next);
            }
        }
        out
    }

    /// Pending timers.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.due.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shot_and_periodic_timers_fire_in_order_and_cancel() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = Timers::default();
        t.add(TimerId(1), t0 + ms(30), 1, None);
        t.add(TimerId(2), t0 + ms(10), 2, Some(ms(20)));
        t.add(TimerId(3), t0 + ms(20), 3, None);
        assert_eq!(t.next_due(), Some(t0 + ms(10)));
        assert!(t.due(t0 + ms(9)).is_empty());
        assert_eq!(t.due(t0 + ms(10)), vec![2]);
        // The periodic one is due again at 30, with the one-shot set for 30.
        assert_eq!(t.due(t0 + ms(30)), vec![3, 1, 2]);
        assert_eq!(t.next_due(), Some(t0 + ms(50)));
        // Late by three periods: it fires once, and next on its own grid after now.
        assert_eq!(t.due(t0 + ms(115)), vec![2]);
        assert_eq!(t.next_due(), Some(t0 + ms(130)));
        t.cancel(TimerId(2));
        assert_eq!((t.len(), t.next_due()), (0, None));
        // Setting an id again replaces its timer.
        t.add(TimerId(4), t0 + ms(5), 4, None);
        t.add(TimerId(4), t0 + ms(50), 5, None);
        assert_eq!(t.due(t0 + ms(60)), vec![5]);
        // A zero period is raised to the minimum: no spin.
        t.add(TimerId(6), t0, 6, Some(Duration::ZERO));
        assert_eq!(t.due(t0), vec![6]);
        assert_eq!(t.next_due(), Some(t0 + MIN_PERIOD));
    }
}
