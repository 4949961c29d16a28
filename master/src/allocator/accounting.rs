//! Cost accounting: allocated resources integrated over time (resource-seconds per role and
//! per framework and role), behind `gantry_role_allocated_seconds_total` (formerly
//! `gantry_role_resource_seconds_total`; offers plus use, not use: `gantry_usage_*` counts use).
//!
//! PURE like the rest of the allocator: the caller says what time it is
//! ([`Allocator::accrue`]) before it changes allocations at that time; between two calls the
//! allocation is constant, so the integral is exact (milli-units times milliseconds, in
//! `u128`). The live master accrues at every event and allocation cycle with its core clock;
//! the simulator can do the same with simulated time.
//!
//! "Allocated" is what fairness counts: outstanding offers plus resources in use. A role's
//! series covers its subtree (as its dominant share does): sum only top-level roles, or the
//! framework series, to avoid counting a child twice.

use super::*;

/// Integrals of allocations since the allocator started (milli-units × milliseconds per kind).
#[derive(Debug, Default)]
pub(super) struct Accounting {
    /// The time of the last accrual (`None` before the first).
    last: Option<Millis>,
    /// Per role name (subtree allocation), per interned kind.
    roles: BTreeMap<Arc<str>, Vec<u128>>,
    /// Per live framework and role.
    frameworks: HashMap<(FrameworkId, u32), FrameworkUsage>,
}

#[derive(Debug)]
struct FrameworkUsage {
    name: Arc<str>,
    role: Arc<str>,
    acc: Vec<u128>,
}

/// Resource-seconds of one role (subtree) or one framework in one role.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ResourceSeconds {
    /// Role name.
    pub role: String,
    /// Framework id and name (`None` for a role's own series).
    pub framework: Option<(String, String)>,
    /// Per resource kind: amount × seconds (e.g. `gpus` → GPU-seconds, `mem` → MB-seconds).
    pub seconds: BTreeMap<String, f64>,
}

fn add_scaled(acc: &mut Vec<u128>, v: &[u64], dt: u128) {
    if acc.len() < v.len() {
        acc.resize(v.len(), 0);
    }
    for (a, x) in acc.iter_mut().zip(v) {
        *a = a.saturating_add(u128::from(*x) * dt);
    }
}

impl Allocator {
    /// Integrates the current allocations from the last accrual up to `now` (a `now` earlier
    /// than the last accrual counts nothing). Call it before changing allocations at `now`.
    pub fn accrue(&mut self, now: Millis) {
        let last = self
            .accounting
            .last
            .replace(now.max(self.accounting.last.unwrap_or(0)));
        let Some(last) = last else { return };
        let dt = u128::from(now.saturating_sub(last));
        if dt == 0 {
            return;
        }
        for role in self.roles.iter().skip(1) {
            if role.parent.is_none() || role.alloc.iter().all(|x| *x == 0) {
                continue;
            }
            let acc = self.accounting.roles.entry(role.name.clone()).or_default();
            add_scaled(acc, &role.alloc, dt);
        }
        for fw in self.frameworks.values() {
            for fr in &fw.roles {
                if fr.alloc.iter().all(|x| *x == 0) {
                    continue;
                }
                let role = &self.roles[fr.role as usize];
                let usage = self
                    .accounting
                    .frameworks
                    .entry((fw.id, fr.role))
                    .or_insert_with(|| FrameworkUsage {
                        name: fw.name.clone(),
                        role: role.name.clone(),
                        acc: Vec::new(),
                    });
                add_scaled(&mut usage.acc, &fr.alloc, dt);
            }
        }
    }

    /// Forgets a removed framework's series (its role's series keeps what it used).
    pub(super) fn forget_framework_usage(&mut self, id: FrameworkId) {
        self.accounting.frameworks.retain(|(f, _), _| *f != id);
    }

    /// Forgets a forgotten role's series (what is kept is bounded by the live roles, however
    /// many role names come and go; Prometheus keeps what it scraped).
    pub(super) fn forget_role_usage(&mut self, name: &str) {
        self.accounting.roles.remove(name);
    }

    fn seconds(&self, acc: &[u128]) -> BTreeMap<String, f64> {
        acc.iter()
            .enumerate()
            .filter(|(_, x)| **x > 0)
            // milli-units × ms = 1e-6 unit-seconds.
            .map(|(i, x)| (self.names.name(i).to_string(), *x as f64 / 1e6))
            .collect()
    }

    /// Resource-seconds accrued so far: one entry per role (subtree), then one per framework
    /// and role, in a stable order.
    pub fn resource_seconds(&self) -> Vec<ResourceSeconds> {
        let mut out: Vec<ResourceSeconds> = self
            .accounting
            .roles
            .iter()
            .map(|(role, acc)| ResourceSeconds {
                role: role.to_string(),
                framework: None,
                seconds: self.seconds(acc),
            })
            .collect();
        let mut fws: Vec<ResourceSeconds> = self
            .accounting
            .frameworks
            .iter()
            .map(|((id, _), u)| ResourceSeconds {
                role: u.role.to_string(),
                framework: Some((id.to_string(), u.name.to_string())),
                seconds: self.seconds(&u.acc),
            })
            .collect();
        fws.sort_by(|a, b| (&a.framework, &a.role).cmp(&(&b.framework, &b.role)));
        out.extend(fws);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(s: &str) -> Resources {
        Resources::parse(s).unwrap()
    }

    fn seconds(a: &Allocator, role: &str, fw: Option<&str>, kind: &str) -> f64 {
        a.resource_seconds()
            .into_iter()
            .find(|r| r.role == role && r.framework.as_ref().map(|f| f.1.as_str()) == fw)
            .and_then(|r| r.seconds.get(kind).copied())
            .unwrap_or(0.0)
    }

    #[test]
    fn allocations_are_integrated_exactly_between_accruals() {
        let mut a = Allocator::new(AllocatorConfig::default());
        a.accrue(0);
        a.add_framework(
            FrameworkId::from_u128(1),
            "train",
            &["eng/ml".into()],
            true,
            None,
        );
        a.add_agent(
            AgentId::from_u128(1),
            "h1",
            res("cpus:4;gpus:2"),
            BTreeMap::new(),
        );
        // Nothing allocated yet: nothing accrues.
        a.accrue(5_000);
        assert!(a.resource_seconds().is_empty());
        let offer = a.allocate(5_000).remove(0);
        // The whole agent is offered for 10 s: offers count as allocated.
        a.accrue(15_000);
        assert_eq!(seconds(&a, "eng/ml", None, "gpus"), 20.0);
        assert_eq!(
            seconds(&a, "eng", None, "gpus"),
            20.0,
            "a role covers its subtree"
        );
        assert_eq!(seconds(&a, "eng/ml", Some("train"), "cpus"), 40.0);
        // Accept half (one GPU, two cpus); the rest returns to the pool (filtered) for 3 s.
        let half = OfferResources::unreserved(res("cpus:2;gpus:1"));
        a.accept(offer.id, &half, Some(60_000), 15_000).unwrap();
        a.accrue(18_000);
        assert_eq!(seconds(&a, "eng/ml", Some("train"), "gpus"), 23.0);
        assert_eq!(seconds(&a, "eng/ml", Some("train"), "cpus"), 46.0);
        // Time going backwards counts nothing.
        a.accrue(17_000);
        assert_eq!(seconds(&a, "eng/ml", None, "gpus"), 23.0);
        // A removed framework's series goes; its role keeps what it used.
        a.remove_framework(FrameworkId::from_u128(1));
        a.accrue(30_000);
        assert_eq!(seconds(&a, "eng/ml", Some("train"), "gpus"), 0.0);
        assert_eq!(seconds(&a, "eng/ml", None, "gpus"), 23.0);
        // ...until the role itself is forgotten (nothing uses it any more): then it goes too,
        // with its parent's.
        assert_eq!(
            a.forget_role("eng/ml"),
            vec!["eng/ml".to_string(), "eng".to_string()]
        );
        assert!(a.resource_seconds().is_empty());
    }
}
