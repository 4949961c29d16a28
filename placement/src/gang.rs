//! Gangs (pure): a group of identical members launched all together or not at all, and the
//! rule for holding offers while a gang waits.
//!
//! - [`GangRequest`]: a member's [`TaskRequest`] and `min..=max` members (`min == max`: a rigid
//!   gang; `min < max`: elastic, launched with as many members as fit, at least `min`).
//! - [`place_gang`]: a [`Plan`] for between `min` and `max` members, or `None` (then nothing is
//!   taken from the agents): never a partial gang. [`grow`] plans extra members for a running
//!   elastic gang; [`shrink_order`] says which members go first when it must shrink (the last
//!   launched, so members `0..min` stay).
//! - [`Holds`]: which waiting gang may hold offers. Gangs are given in the caller's
//!   deterministic order (e.g. priority, then submission); only the first one not backing off
//!   holds, so two gangs of one framework never hold halves of the cluster against each other.
//!   A hold lasts at most [`HoldPolicy::timeout`]; then the holder must release its offers and
//!   backs off (doubling from [`HoldPolicy::backoff_min`] up to [`HoldPolicy::backoff_max`],
//!   plus a fixed per-gang offset so gangs of different frameworks desynchronise), and the next
//!   gang in the order gets its turn. A launch clears the gang's backoff.
//!
//! Launching a plan "in one step": [`Plan::launches`] groups members per agent, and the caller
//! sends one accept per agent from the same callback, before any other offer decision.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use super::offers::{place_one, take, AgentView, Assignment, Plan, TaskRequest};

/// A gang: `min..=max` copies of `member`.
#[derive(Debug, Clone, PartialEq)]
pub struct GangRequest {
    /// What each member asks for.
    pub member: TaskRequest,
    /// Fewest members it can start with (at least 1).
    pub min: u32,
    /// Most members it can use (at least `min`).
    pub max: u32,
}

/// Plans `min..=max` members (as many as fit, greedily, each on its best agent given the ones
/// before). `None` when fewer than `min` fit; then `agents` is unchanged. On success `agents`
/// has what the plan takes removed. Assignment `task` indices are member indices `0..n`.
pub fn place_gang(agents: &mut Vec<AgentView>, gang: &GangRequest) -> Option<Plan> {
    let min = gang.min.max(1);
    if gang.max < min {
        return None;
    }
    let mut work = agents.clone();
    let mut assignments = Vec::new();
    while (assignments.len() as u32) < gang.max {
        let Some(c) = place_one(&work, &gang.member) else {
            break;
        };
        let gpus = take(&mut work, &gang.member, &c);
        assignments.push(Assignment {
            task: assignments.len(),
            agent: c.agent,
            gpus,
        });
    }
    if (assignments.len() as u32) < min {
        return None;
    }
    *agents = work;
    Some(Plan { assignments })
}

/// Plans up to `max - current` extra members for a running elastic gang (none when it is at
/// `max` or nothing fits). Member indices continue from `current`.
pub fn grow(agents: &mut Vec<AgentView>, member: &TaskRequest, current: u32, max: u32) -> Plan {
    if current >= max {
        return Plan::default();
    }
    let gang = GangRequest {
        member: member.clone(),
        min: 1,
        max: max - current,
    };
    let mut plan = place_gang(agents, &gang).unwrap_or_default();
    for a in &mut plan.assignments {
        a.task += current as usize;
    }
    plan
}

/// Members to stop, first to last, to shrink a gang of `current` members by `by`, never below
/// `min`: the highest indices first. Fewer than `by` when `min` stops it.
pub fn shrink_order(current: u32, min: u32, by: u32) -> Vec<u32> {
    let floor = min.max(1).min(current);
    let by = by.min(current - floor);
    (current - by..current).rev().collect()
}

/// How long a gang may hold offers and how it backs off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldPolicy {
    /// The longest one hold lasts.
    pub timeout: Duration,
    /// The first backoff after a hold times out.
    pub backoff_min: Duration,
    /// The longest backoff.
    pub backoff_max: Duration,
}

impl Default for HoldPolicy {
    fn default() -> Self {
        HoldPolicy {
            timeout: Duration::from_secs(30),
            backoff_min: Duration::from_secs(2),
            backoff_max: Duration::from_secs(60),
        }
    }
}

/// What [`Holds::update`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldDecision<K> {
    /// The gang that may hold offers now.
    pub holder: Option<K>,
    /// A gang whose hold timed out (or that stopped waiting): release what it holds.
    pub released: Option<K>,
}

/// Who holds offers (see the module documentation).
#[derive(Debug, Clone)]
pub struct Holds<K: Ord + Clone + Hash> {
    policy: HoldPolicy,
    holder: Option<(K, Instant)>,
    /// Failed holds so far and the end of the current backoff, per gang.
    backoff: BTreeMap<K, (u32, Instant)>,
}

impl<K: Ord + Clone + Hash> Holds<K> {
    /// Nobody holds yet.
    pub fn new(policy: HoldPolicy) -> Self {
        Holds {
            policy,
            holder: None,
            backoff: BTreeMap::new(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> HoldPolicy {
        self.policy
    }

    /// The current holder and since when.
    pub fn holder(&self) -> Option<(&K, Instant)> {
        self.holder.as_ref().map(|(k, t)| (k, *t))
    }

    /// Whether `key` is backing off at `now`.
    pub fn backing_off(&self, key: &K, now: Instant) -> bool {
        self.backoff.get(key).is_some_and(|&(_, until)| until > now)
    }

    /// Given the gangs that wait now, in the caller's deterministic order, decides who holds:
    /// the current holder while its hold lasts and it still waits; else the first waiting gang
    /// not backing off. A holder whose hold timed out is released and backs off.
    pub fn update(&mut self, waiting: &[K], now: Instant) -> HoldDecision<K> {
        let mut released = None;
        if let Some((k, since)) = self.holder.clone() {
            if !waiting.contains(&k) {
                self.holder = None;
                released = Some(k);
            } else if now.saturating_duration_since(since) >= self.policy.timeout {
                self.holder = None;
                let attempts = self.backoff.get(&k).map_or(0, |b| b.0) + 1;
                let until = now + self.backoff_for(&k, attempts);
                self.backoff.insert(k.clone(), (attempts, until));
                released = Some(k);
            } else {
                return HoldDecision {
                    holder: Some(k),
                    released: None,
                };
            }
        }
        let next = waiting.iter().find(|k| !self.backing_off(k, now)).cloned();
        if let Some(k) = &next {
            self.holder = Some((k.clone(), now));
        }
        HoldDecision {
            holder: next,
            released,
        }
    }

    /// The holder `key` waits for resources expected to free at `from` (a reservation's
    /// estimated start, from running work's time limits): its hold counts from then, so it
    /// lasts until `from` plus the policy's timeout, not only the timeout from when it began.
    /// A later `from` extends the hold; an earlier one, or another key, changes nothing.
    pub fn renew(&mut self, key: &K, from: Instant) {
        if let Some((k, since)) = self.holder.as_mut() {
            if k == key && from > *since {
                *since = from;
            }
        }
    }

    /// The gang launched (or was cancelled): it holds nothing and its backoff is cleared.
    pub fn done(&mut self, key: &K) {
        if self.holder.as_ref().is_some_and(|(k, _)| k == key) {
            self.holder = None;
        }
        self.backoff.remove(key);
    }

    /// When [`Holds::update`] next changes its answer on its own (a hold times out or a
    /// backoff ends), if ever.
    pub fn next_deadline(&self) -> Option<Instant> {
        let hold = self.holder.as_ref().map(|(_, t)| *t + self.policy.timeout);
        let backoff = self.backoff.values().map(|&(_, t)| t).min();
        match (hold, backoff) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Backoff after `attempts` failed holds: `backoff_min · 2^(attempts-1)` capped at
    /// `backoff_max`, plus a fixed offset in `[0, backoff_min)` derived from the gang's key.
    fn backoff_for(&self, key: &K, attempts: u32) -> Duration {
        let base = self
            .policy
            .backoff_min
            .saturating_mul(1u32 << attempts.saturating_sub(1).min(16))
            .min(self.policy.backoff_max);
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        let min_ms = self.policy.backoff_min.as_millis().max(1) as u64;
        base + Duration::from_millis(h.finish() % min_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::super::offers::tests::agent;
    use super::*;
    use gantry_proto::Resources;
    use proptest::prelude::*;

    fn member(res: &str) -> TaskRequest {
        TaskRequest::new(res.parse().unwrap())
    }

    #[test]
    fn a_renewed_hold_lasts_until_its_expected_start_plus_the_timeout() {
        let policy = HoldPolicy {
            timeout: Duration::from_secs(30),
            ..HoldPolicy::default()
        };
        let mut h: Holds<u32> = Holds::new(policy);
        let t0 = Instant::now();
        assert_eq!(h.update(&[1, 2], t0).holder, Some(1));
        // Resources expected to free in an hour: the hold lasts until then plus 30 s.
        h.renew(&1, t0 + Duration::from_secs(3600));
        h.renew(&2, t0 + Duration::from_secs(7200)); // not the holder: nothing
        h.renew(&1, t0 + Duration::from_secs(60)); // earlier: nothing
        let late = t0 + Duration::from_secs(3629);
        assert_eq!(h.update(&[1, 2], late).holder, Some(1));
        assert_eq!(h.next_deadline(), Some(t0 + Duration::from_secs(3630)));
        // Past it, the hold times out as before and the next gang holds.
        let d = h.update(&[1, 2], t0 + Duration::from_secs(3630));
        assert_eq!((d.holder, d.released), (Some(2), Some(1)));
    }

    #[test]
    fn rigid_gang_launches_whole_or_not_at_all() {
        let mut agents = vec![
            agent("a", "cpus:16;mem:65536;gpus:8"),
            agent("b", "cpus:16;mem:65536;gpus:8"),
        ];
        let before = agents.clone();
        let gang = GangRequest {
            member: member("cpus:2;mem:1024;gpus:8"),
            min: 3,
            max: 3,
        };
        assert!(place_gang(&mut agents, &gang).is_none());
        assert_eq!(agents, before);
        let gang = GangRequest {
            min: 2,
            max: 2,
            ..gang
        };
        let plan = place_gang(&mut agents, &gang).unwrap();
        assert_eq!(plan.launches().len(), 2, "one 8-GPU member per agent");
    }

    #[test]
    fn elastic_gang_takes_what_fits_and_grows() {
        let mut agents = vec![agent("a", "cpus:16;mem:65536;gpus:8")];
        let gang = GangRequest {
            member: member("cpus:1;mem:64;gpus:2"),
            min: 2,
            max: 6,
        };
        let plan = place_gang(&mut agents, &gang).unwrap();
        assert_eq!(plan.assignments.len(), 4);
        let mut more = vec![agent("b", "cpus:16;mem:65536;gpus:4")];
        let g = grow(&mut more, &gang.member, 4, 6);
        assert_eq!(
            g.assignments.iter().map(|a| a.task).collect::<Vec<_>>(),
            vec![4, 5]
        );
        assert!(grow(&mut more, &gang.member, 6, 6).assignments.is_empty());
        assert_eq!(shrink_order(6, 2, 3), vec![5, 4, 3]);
        assert_eq!(shrink_order(3, 2, 3), vec![2]);
    }

    #[test]
    fn one_holder_at_a_time_in_order_with_backoff() {
        let policy = HoldPolicy {
            timeout: Duration::from_secs(10),
            backoff_min: Duration::from_secs(2),
            backoff_max: Duration::from_secs(8),
        };
        let mut holds: Holds<u32> = Holds::new(policy);
        let t0 = Instant::now();
        let d = holds.update(&[1, 2], t0);
        assert_eq!(d.holder, Some(1));
        assert_eq!(
            holds.update(&[1, 2], t0 + Duration::from_secs(5)).holder,
            Some(1)
        );
        // Timed out: 1 releases and backs off, 2 holds.
        let d = holds.update(&[1, 2], t0 + Duration::from_secs(10));
        assert_eq!((d.holder, d.released), (Some(2), Some(1)));
        assert!(holds.backing_off(&1, t0 + Duration::from_secs(11)));
        // 2 times out too; 1's backoff (2..4 s) is over by then: 1 holds again.
        let d = holds.update(&[1, 2], t0 + Duration::from_secs(20));
        assert_eq!((d.holder, d.released), (Some(1), Some(2)));
        // A second failure doubles 1's backoff.
        let d = holds.update(&[1, 2], t0 + Duration::from_secs(30));
        assert_eq!(d.released, Some(1));
        assert!(holds.backing_off(&1, t0 + Duration::from_secs(33)));
        holds.done(&1);
        assert!(!holds.backing_off(&1, t0 + Duration::from_secs(31)));
    }

    proptest! {
        /// Never a partial gang: a plan has `min..=max` members that all fit together, or
        /// there is no plan and nothing was taken.
        #[test]
        fn never_a_partial_gang(
            free in prop::collection::vec((1u64..32, 0u64..=8), 1..5),
            gpus in 0u64..=8, cpus in 0u64..8, min in 1u32..6, extra in 0u32..4,
        ) {
            let agents: Vec<AgentView> = free.iter().enumerate().map(|(i, (c, g))| {
                let mut a = agent(&format!("a{i}"), &format!("cpus:{c};mem:65536;gpus:{g}"));
                a.gpus.truncate(*g as usize);
                a
            }).collect();
            let gang = GangRequest { member: member(&format!("cpus:{cpus};mem:64;gpus:{gpus}")), min, max: min + extra };
            let mut work = agents.clone();
            match place_gang(&mut work, &gang) {
                None => prop_assert_eq!(work, agents),
                Some(plan) => {
                    let n = plan.assignments.len() as u32;
                    prop_assert!(n >= min && n <= min + extra);
                    for (i, a) in agents.iter().enumerate() {
                        let mut used = Resources::new();
                        for _ in plan.assignments.iter().filter(|x| x.agent == i) {
                            used.add_assign(&gang.member.resources);
                        }
                        prop_assert!(a.resources.contains(&used));
                    }
                }
            }
        }

        /// At most one gang holds, it is a waiting one, and never one that is backing off.
        #[test]
        fn holds_are_exclusive(steps in prop::collection::vec((prop::collection::btree_set(0u32..5, 0..5), 0u64..20), 1..40)) {
            let mut holds: Holds<u32> = Holds::new(HoldPolicy {
                timeout: Duration::from_secs(5),
                backoff_min: Duration::from_secs(1),
                backoff_max: Duration::from_secs(8),
            });
            let mut now = Instant::now();
            for (waiting, dt) in steps {
                now += Duration::from_secs(dt);
                let waiting: Vec<u32> = waiting.into_iter().collect();
                let before: Vec<bool> = waiting.iter().map(|k| holds.backing_off(k, now)).collect();
                let d = holds.update(&waiting, now);
                if let Some(h) = d.holder {
                    prop_assert!(waiting.contains(&h));
                    let i = waiting.iter().position(|k| *k == h).unwrap();
                    // The holder is the first not backing off, or the one that already held.
                    prop_assert!(!before[i] || holds.holder().is_some());
                    prop_assert_eq!(holds.holder().map(|(k, _)| *k), Some(h));
                }
            }
        }
    }
}
