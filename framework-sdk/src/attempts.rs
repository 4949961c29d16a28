//! [`AttemptsBook`]: the attempts of logical units of work (a trial, a shard, a job step):
//! which task is the current attempt of which unit, when a failed unit may be tried again
//! (capped exponential backoff), when it has failed too often, and which losses count.
//!
//! Pure: no I/O and no clock (times are the caller's milliseconds, as in
//! [`crate::book::TaskBook`]). A scheduler launches [`AttemptsBook::ready`] units, records each
//! launch ([`AttemptsBook::launched`]), feeds status updates ([`AttemptsBook::update`]) and acts
//! on the [`Verdict`]: a retry comes with the time it is due, for a driver timer
//! ([`DriverHandle::after`](crate::DriverHandle::after)).
//!
//! Which endings count against a unit's [`RetryPolicy::max_failures`]:
//!
//! | ending | counts | the unit |
//! |---|---|---|
//! | `FINISHED` | - | succeeded |
//! | `FAILED`, `ERROR`, `KILLED` (not asked for by the framework) | yes | retried after the backoff, or given up |
//! | `LOST`, `GONE`, `DROPPED` (the cluster lost it, or it never ran) | no | ready again at once |
//! | `KILLED` for a drain (reason `drain-deadline`), or on an agent being drained ([`AttemptsBook::drained`]) | no | ready again at once |
//! | `KILLED` to make room (reason `preempted`) | no | ready again at once |
//! | `KILLED` with reason `killed-by-request` or `operator-kill` that the book was not told of (a kill the framework asked for before a restart, its teardown, its failover timeout) | no | ready again at once |
//! | any ending but `FINISHED` after the framework's own kill ([`AttemptsBook::cancelled`]) | no | left alone (not retried) |
//!
//! These rules are pure functions of their own, for schedulers that keep their units another
//! way (the `gantry-queue` crate's jobs are gangs of workers): [`ending`] classifies how an
//! attempt ended, and [`RetryPolicy::retry_after`] says whether and when a unit with so many
//! counted failures runs again. [`AttemptsBook::update`] is built on both.
//!
//! ```
//! use std::time::Duration;
//! use gantry_sdk::attempts::{AttemptsBook, RetryPolicy, Verdict};
//! use gantry_sdk::protocol::*;
//!
//! let policy = RetryPolicy::new(2, Duration::from_millis(500), Duration::from_secs(5));
//! let mut book = AttemptsBook::new(policy);
//! book.add("trial-0");
//! assert_eq!(book.ready(0), vec!["trial-0"]);
//! let first = TaskId::random();
//! book.launched(&"trial-0", first, 0);
//! // The attempt exits non-zero: tried again after 500 ms.
//! let failed = StatusUpdate::new(first, FrameworkId::random(), TaskState::Failed);
//! assert_eq!(book.update(&failed, 100), Some(Verdict::Retry { unit: "trial-0", at: 600 }));
//! assert!(book.ready(599).is_empty());
//! assert_eq!(book.ready(600), vec!["trial-0"]);
//! let second = TaskId::random();
//! book.launched(&"trial-0", second, 600);
//! let done = StatusUpdate::new(second, FrameworkId::random(), TaskState::Finished);
//! assert_eq!(book.update(&done, 900), Some(Verdict::Succeeded { unit: "trial-0" }));
//! assert_eq!(book.attempts(&"trial-0").len(), 2);
//! assert!(book.all_ended());
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use crate::protocol::{StatusUpdate, TaskId, TaskReason, TaskState};

/// How often and how soon a unit is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Failures that count (see the module docs) a unit may have before it is given up: with
    /// 2, a unit runs at most 3 times unless the cluster loses attempts.
    pub max_failures: u32,
    /// The delay after the first failure; doubled after each further one.
    pub backoff_initial: Duration,
    /// The longest delay.
    pub backoff_max: Duration,
}

impl RetryPolicy {
    /// `max_failures` retries, backoff from `initial` doubling up to `max`.
    pub fn new(max_failures: u32, initial: Duration, max: Duration) -> Self {
        RetryPolicy {
            max_failures,
            backoff_initial: initial,
            backoff_max: max,
        }
    }

    /// The delay after the `n`-th failure (from 1): `backoff_initial` doubled `n - 1` times,
    /// at most `backoff_max`.
    pub fn delay(&self, n: u32) -> Duration {
        self.backoff_initial
            .saturating_mul(1u32 << n.saturating_sub(1).min(31))
            .min(self.backoff_max)
    }

    /// After the `failures`-th counted failure (from 1): `Some(delay)` when the unit runs again
    /// after that delay, `None` when it has failed more than [`RetryPolicy::max_failures`]
    /// times and is given up.
    pub fn retry_after(&self, failures: u32) -> Option<Duration> {
        (failures <= self.max_failures).then(|| self.delay(failures))
    }
}

/// How an attempt ended, by the rules in the module docs ([`ending`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// `FINISHED`.
    Succeeded,
    /// A failure that counts against [`RetryPolicy::max_failures`].
    Failed,
    /// Lost by the cluster, never started, drained away, preempted, or killed on a request the
    /// book did not know of: never counts; the unit may run again at once.
    Lost,
    /// Ended after the framework's own kill: never counts; the framework decides what follows.
    OwnKill,
}

/// How an attempt that reached `state` (with `reason`) ended. `own_kill`: the framework had
/// killed it itself; `drained`: it was on an agent being drained. `None` while `state` is not
/// terminal. Pure: the one place these rules live (see the module docs' table).
pub fn ending(
    state: TaskState,
    reason: Option<TaskReason>,
    own_kill: bool,
    drained: bool,
) -> Option<Ending> {
    if !state.is_terminal() {
        return None;
    }
    Some(match state {
        TaskState::Finished => Ending::Succeeded,
        _ if own_kill => Ending::OwnKill,
        TaskState::Lost | TaskState::Gone | TaskState::Dropped => Ending::Lost,
        TaskState::Killed
            if matches!(
                reason,
                Some(
                    TaskReason::Preempted
                        | TaskReason::DrainDeadline
                        | TaskReason::KilledByRequest
                        | TaskReason::OperatorKill
                )
            ) =>
        {
            Ending::Lost
        }
        _ if drained => Ending::Lost,
        _ => Ending::Failed,
    })
}

/// Where a unit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitState {
    /// Waiting to be launched, from this time on.
    Pending {
        /// When it may be launched (the caller's milliseconds).
        ready_at: u64,
    },
    /// An attempt is out (launched, not ended).
    Running(TaskId),
    /// An attempt finished.
    Succeeded,
    /// It failed more than [`RetryPolicy::max_failures`] times.
    GaveUp,
    /// The framework killed its attempt ([`AttemptsBook::cancelled`]).
    Cancelled,
}

/// What an attempt's ending means for its unit ([`AttemptsBook::update`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<K> {
    /// The attempt finished: the unit is done.
    Succeeded {
        /// The unit.
        unit: K,
    },
    /// The attempt failed (it counts): the unit is ready again at `at`.
    Retry {
        /// The unit.
        unit: K,
        /// When it may be launched again (the caller's milliseconds).
        at: u64,
    },
    /// The attempt was lost by the cluster (or drained away): the unit is ready again now,
    /// and the loss does not count.
    Relaunch {
        /// The unit.
        unit: K,
    },
    /// The attempt failed once too often: the unit is given up.
    GaveUp {
        /// The unit.
        unit: K,
    },
    /// The framework killed the attempt: the unit is left alone.
    Cancelled {
        /// The unit.
        unit: K,
    },
}

/// One unit's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Where it stands.
    pub state: UnitState,
    /// Every attempt launched, oldest first.
    pub attempts: Vec<TaskId>,
    /// Failures that counted.
    pub failures: u32,
    /// Attempts lost without counting.
    pub losses: u32,
}

/// The units and their attempts. See the module docs.
#[derive(Debug, Clone)]
pub struct AttemptsBook<K: Ord + Clone> {
    policy: RetryPolicy,
    units: BTreeMap<K, Unit>,
    by_task: HashMap<TaskId, K>,
    drained: HashSet<TaskId>,
    cancelled: HashSet<TaskId>,
}

impl<K: Ord + Clone> AttemptsBook<K> {
    /// An empty book under `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        AttemptsBook {
            policy,
            units: BTreeMap::new(),
            by_task: HashMap::new(),
            drained: HashSet::new(),
            cancelled: HashSet::new(),
        }
    }

    /// Adds a unit, ready at once (a unit already in the book is left as it is).
    pub fn add(&mut self, unit: K) {
        self.units.entry(unit).or_insert(Unit {
            state: UnitState::Pending { ready_at: 0 },
            attempts: Vec::new(),
            failures: 0,
            losses: 0,
        });
    }

    /// Units that may be launched at `now`, in key order.
    pub fn ready(&self, now: u64) -> Vec<K> {
        self.units
            .iter()
            .filter(|(_, u)| matches!(u.state, UnitState::Pending { ready_at } if ready_at <= now))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Units waiting (ready or backing off).
    pub fn pending(&self) -> usize {
        self.units
            .values()
            .filter(|u| matches!(u.state, UnitState::Pending { .. }))
            .count()
    }

    /// When the next unit backing off becomes ready, after `now` (for a timer).
    pub fn next_ready_at(&self, now: u64) -> Option<u64> {
        self.units
            .values()
            .filter_map(|u| match u.state {
                UnitState::Pending { ready_at } if ready_at > now => Some(ready_at),
                _ => None,
            })
            .min()
    }

    /// Records that `task` was launched as an attempt of `unit` at `now`.
    pub fn launched(&mut self, unit: &K, task: TaskId, _now: u64) {
        if let Some(u) = self.units.get_mut(unit) {
            u.state = UnitState::Running(task);
            u.attempts.push(task);
            self.by_task.insert(task, unit.clone());
        }
    }

    /// The tasks were on an agent being drained (a drain notice): if they end `KILLED` or
    /// lost, the loss does not count.
    pub fn drained(&mut self, tasks: impl IntoIterator<Item = TaskId>) {
        self.drained.extend(tasks);
    }

    /// The framework itself killed `task`: its `KILLED` cancels the unit instead of counting.
    pub fn cancelled(&mut self, task: TaskId) {
        self.cancelled.insert(task);
    }

    /// Applies a status update at `now`. `Some` when it ended the current attempt of a unit:
    /// what that means for the unit (see [`Verdict`]). Updates of older attempts, repeated
    /// terminal updates and non-terminal ones give `None`.
    pub fn update(&mut self, update: &StatusUpdate, now: u64) -> Option<Verdict<K>> {
        if !update.state.is_terminal() {
            return None;
        }
        let key = self.by_task.get(&update.task_id)?.clone();
        let unit = self.units.get_mut(&key)?;
        if unit.state != UnitState::Running(update.task_id) {
            return None;
        }
        let drained = self.drained.remove(&update.task_id);
        let cancelled = self.cancelled.remove(&update.task_id);
        let verdict = match ending(update.state, update.reason, cancelled, drained)? {
            Ending::Succeeded => {
                unit.state = UnitState::Succeeded;
                Verdict::Succeeded { unit: key }
            }
            Ending::OwnKill => {
                unit.state = UnitState::Cancelled;
                Verdict::Cancelled { unit: key }
            }
            Ending::Lost => {
                unit.losses += 1;
                unit.state = UnitState::Pending { ready_at: now };
                Verdict::Relaunch { unit: key }
            }
            Ending::Failed => {
                unit.failures += 1;
                match self.policy.retry_after(unit.failures) {
                    None => {
                        unit.state = UnitState::GaveUp;
                        Verdict::GaveUp { unit: key }
                    }
                    Some(delay) => {
                        let at = now.saturating_add(delay.as_millis().min(u64::MAX as u128) as u64);
                        unit.state = UnitState::Pending { ready_at: at };
                        Verdict::Retry { unit: key, at }
                    }
                }
            }
        };
        Some(verdict)
    }

    /// A unit's record.
    pub fn unit(&self, unit: &K) -> Option<&Unit> {
        self.units.get(unit)
    }

    /// A unit's attempts, oldest first.
    pub fn attempts(&self, unit: &K) -> &[TaskId] {
        self.units
            .get(unit)
            .map(|u| u.attempts.as_slice())
            .unwrap_or_default()
    }

    /// The unit `task` was an attempt of.
    pub fn unit_of(&self, task: TaskId) -> Option<&K> {
        self.by_task.get(&task)
    }

    /// Every unit with its record, in key order.
    pub fn units(&self) -> impl Iterator<Item = (&K, &Unit)> {
        self.units.iter()
    }

    /// Units that succeeded.
    pub fn succeeded(&self) -> usize {
        self.count(|s| s == UnitState::Succeeded)
    }

    /// Units given up.
    pub fn given_up(&self) -> usize {
        self.count(|s| s == UnitState::GaveUp)
    }

    /// True when no unit waits or runs (each succeeded, was given up or cancelled).
    pub fn all_ended(&self) -> bool {
        self.units.values().all(|u| {
            matches!(
                u.state,
                UnitState::Succeeded | UnitState::GaveUp | UnitState::Cancelled
            )
        })
    }

    fn count(&self, f: impl Fn(UnitState) -> bool) -> usize {
        self.units.values().filter(|u| f(u.state)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::FrameworkId;

    fn end(task: TaskId, state: TaskState) -> StatusUpdate {
        StatusUpdate::new(task, FrameworkId::from_u128(1), state)
    }

    fn book() -> AttemptsBook<u32> {
        AttemptsBook::new(RetryPolicy::new(
            2,
            Duration::from_millis(100),
            Duration::from_millis(250),
        ))
    }

    /// Launches unit `k`'s next attempt at `now`.
    fn launch(b: &mut AttemptsBook<u32>, k: u32, now: u64) -> TaskId {
        let t = TaskId::random();
        b.launched(&k, t, now);
        t
    }

    #[test]
    fn failures_back_off_exponentially_up_to_the_cap_then_give_up() {
        let mut b = book();
        b.add(7);
        let t1 = launch(&mut b, 7, 0);
        assert!(b.ready(0).is_empty(), "running");
        assert_eq!(
            b.update(&end(t1, TaskState::Failed), 10),
            Some(Verdict::Retry { unit: 7, at: 110 })
        );
        assert_eq!(b.next_ready_at(10), Some(110));
        let t2 = launch(&mut b, 7, 110);
        // ERROR counts too; the delay doubles.
        assert_eq!(
            b.update(&end(t2, TaskState::Error), 120),
            Some(Verdict::Retry { unit: 7, at: 320 })
        );
        let t3 = launch(&mut b, 7, 320);
        assert_eq!(
            b.update(&end(t3, TaskState::Failed), 330),
            Some(Verdict::GaveUp { unit: 7 })
        );
        assert_eq!((b.given_up(), b.attempts(&7).len()), (1, 3));
        assert!(b.all_ended());
        assert_eq!(
            RetryPolicy::new(9, Duration::from_millis(100), Duration::from_millis(250)).delay(3),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn losses_drains_and_own_kills_do_not_count() {
        let mut b = book();
        for k in 0..4 {
            b.add(k);
        }
        let lost = launch(&mut b, 0, 0);
        let gone = launch(&mut b, 1, 0);
        let drained = launch(&mut b, 2, 0);
        let mine = launch(&mut b, 3, 0);
        let mut l = end(lost, TaskState::Lost);
        l.reason = Some(TaskReason::AgentLost);
        assert_eq!(b.update(&l, 5), Some(Verdict::Relaunch { unit: 0 }));
        assert_eq!(
            b.update(&end(gone, TaskState::Gone), 5),
            Some(Verdict::Relaunch { unit: 1 })
        );
        b.drained([drained]);
        assert_eq!(
            b.update(&end(drained, TaskState::Killed), 5),
            Some(Verdict::Relaunch { unit: 2 })
        );
        // Preemption and a drain's deadline do not count either.
        for (k, reason) in [(5, TaskReason::Preempted), (6, TaskReason::DrainDeadline)] {
            b.add(k);
            let t = launch(&mut b, k, 0);
            let mut u = end(t, TaskState::Killed);
            u.reason = Some(reason);
            assert_eq!(b.update(&u, 5), Some(Verdict::Relaunch { unit: k }));
        }
        b.cancelled(mine);
        assert_eq!(
            b.update(&end(mine, TaskState::Killed), 5),
            Some(Verdict::Cancelled { unit: 3 })
        );
        assert_eq!(b.ready(5), vec![0, 1, 2, 5, 6], "ready again at once");
        for k in 0..3 {
            assert_eq!(b.unit(&k).map(|u| (u.failures, u.losses)), Some((0, 1)));
        }
    }

    #[test]
    fn stale_and_repeated_updates_are_ignored() {
        let mut b = book();
        b.add(1);
        let t1 = launch(&mut b, 1, 0);
        assert_eq!(b.update(&end(t1, TaskState::Running), 1), None);
        assert!(b.update(&end(t1, TaskState::Failed), 2).is_some());
        assert_eq!(b.update(&end(t1, TaskState::Failed), 3), None, "repeated");
        let t2 = launch(&mut b, 1, 200);
        // A late update of the first attempt does not touch the second.
        assert_eq!(b.update(&end(t1, TaskState::Finished), 201), None);
        assert_eq!(
            b.update(&end(TaskId::random(), TaskState::Failed), 201),
            None
        );
        assert_eq!(
            b.update(&end(t2, TaskState::Finished), 202),
            Some(Verdict::Succeeded { unit: 1 })
        );
        assert_eq!(b.unit_of(t1), Some(&1));
        assert_eq!(b.succeeded(), 1);
    }

    #[test]
    fn the_shared_rules_classify_every_ending() {
        use Ending::*;
        use TaskReason as R;
        use TaskState as S;
        let cases = [
            (S::Running, None, false, false, None),
            (S::Finished, None, true, false, Some(Succeeded)),
            (
                S::Failed,
                Some(R::CommandFailed),
                false,
                false,
                Some(Failed),
            ),
            (S::Error, Some(R::InvalidTask), false, false, Some(Failed)),
            (S::Failed, Some(R::GpuMemory), false, false, Some(Failed)),
            (S::Killed, None, false, false, Some(Failed)),
            (S::Killed, Some(R::TimeLimit), false, false, Some(Failed)),
            (S::Lost, Some(R::AgentLost), false, false, Some(Lost)),
            (S::Gone, None, false, false, Some(Lost)),
            (S::Dropped, Some(R::InvalidOffers), false, false, Some(Lost)),
            (S::Killed, Some(R::Preempted), false, false, Some(Lost)),
            (S::Killed, Some(R::DrainDeadline), false, false, Some(Lost)),
            (
                S::Killed,
                Some(R::KilledByRequest),
                false,
                false,
                Some(Lost),
            ),
            (S::Killed, Some(R::OperatorKill), false, false, Some(Lost)),
            (S::Failed, None, false, true, Some(Lost)),
            (S::Killed, None, true, false, Some(OwnKill)),
            (S::Failed, None, true, false, Some(OwnKill)),
            (S::Lost, None, true, true, Some(OwnKill)),
        ];
        for (state, reason, own, drained, want) in cases {
            assert_eq!(
                ending(state, reason, own, drained),
                want,
                "{state:?} {reason:?} own={own} drained={drained}"
            );
        }
    }

    #[test]
    fn retry_after_doubles_to_the_cap_and_gives_up_past_the_limit() {
        let p = RetryPolicy::new(3, Duration::from_millis(1), Duration::from_secs(600));
        let delays: Vec<_> = (1..=4).map(|n| p.retry_after(n)).collect();
        assert_eq!(
            delays,
            [1, 2, 4]
                .map(|ms| Some(Duration::from_millis(ms)))
                .into_iter()
                .chain([None])
                .collect::<Vec<_>>()
        );
        // Doubling goes on until the cap, however small the first delay.
        assert_eq!(p.delay(30), Duration::from_secs(600));
        assert_eq!(p.delay(u32::MAX), Duration::from_secs(600));
    }

    #[test]
    fn a_cancelled_attempt_that_fails_is_left_alone_and_an_unknown_kill_relaunches() {
        let mut b = book();
        b.add(1);
        b.add(2);
        let t1 = launch(&mut b, 1, 0);
        let t2 = launch(&mut b, 2, 0);
        b.cancelled(t1);
        // Killed with SIGTERM, it exited non-zero: still the framework's own kill.
        assert_eq!(
            b.update(&end(t1, TaskState::Failed), 5),
            Some(Verdict::Cancelled { unit: 1 })
        );
        let mut k = end(t2, TaskState::Killed);
        k.reason = Some(TaskReason::KilledByRequest);
        assert_eq!(b.update(&k, 5), Some(Verdict::Relaunch { unit: 2 }));
        assert_eq!(b.unit(&2).map(|u| (u.failures, u.losses)), Some((0, 1)));
    }
}
