//! Resources held in outstanding offers (not use: `/api/v1/usage`'s `held_offers`),
//! integrated over time per framework and role in hourly buckets, and kept in the registry so
//! they survive a master restart and a failover like the event history
//! (`crate::server::history`).
//!
//! The core loop samples the offers at most once a second ([`OFFER_SAMPLE_MS`]; between two
//! samples the offers of the first are taken to be held), so offers that live less than a
//! second are counted approximately. Buckets of the last 31 days are kept. Each bucket is one
//! registry record (`Mutation::PutHeldOffers`; in etcd `{prefix}/registry/held-offers/{start}`),
//! written again while it changes, at most every [`PERSIST_EVERY_MS`] of sampled time: a crash
//! loses at most that much offer time. A new leader reads the buckets with the rest of the
//! registry and goes on adding to them. PURE: the history's flush carries the writes.

use std::collections::{BTreeMap, BTreeSet};

use gantry_placement::cost::Amounts;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::registry::{HeldOffersBucket, HeldOffersRow, Mutation};

/// How often the core loop samples the outstanding offers (at most).
pub const OFFER_SAMPLE_MS: u64 = 1000;
/// Changed buckets are written at most this often (of sampled time).
pub const PERSIST_EVERY_MS: u64 = 10_000;
/// Hourly buckets of held offers kept (31 days).
const HELD_BUCKETS: usize = 31 * 24;
const HOUR_MS: u64 = 3_600_000;

/// Offer-seconds of one framework and role in a bucket.
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Held {
    cpus: f64,
    mem: f64,
    gpus: f64,
}

#[derive(Debug, Default, Clone, PartialEq)]
struct Bucket {
    /// The first sample counted in it.
    first_ms: u64,
    rows: BTreeMap<(String, String), Held>,
}

/// Held offers by hour (see the module docs).
#[derive(Debug, Default)]
pub struct HeldOffers {
    buckets: BTreeMap<u64, Bucket>,
    last_ms: Option<u64>,
    /// Buckets changed (or removed) since they were last written.
    dirty: BTreeSet<u64>,
    removed: BTreeSet<u64>,
    persisted_ms: u64,
}

impl HeldOffers {
    /// The buckets the registry holds (a new leader); sampling starts afresh from the next
    /// sample (the time between the old leader's last sample and it is not counted).
    pub fn restore(buckets: &BTreeMap<u64, HeldOffersBucket>) -> HeldOffers {
        let buckets = buckets
            .values()
            .map(|b| {
                let rows = b
                    .rows
                    .iter()
                    .map(|r| {
                        let held = Held {
                            cpus: r.cpu_seconds,
                            mem: r.mem_mib_seconds,
                            gpus: r.gpu_seconds,
                        };
                        ((r.framework.clone(), r.role.clone()), held)
                    })
                    .collect();
                let bucket = Bucket {
                    first_ms: b.first_ms,
                    rows,
                };
                (b.start_ms, bucket)
            })
            .collect();
        HeldOffers {
            buckets,
            ..HeldOffers::default()
        }
    }

    /// Whether a sample is due at `now_ms`.
    pub fn due(&self, now_ms: u64) -> bool {
        self.last_ms
            .is_none_or(|l| now_ms >= l.saturating_add(OFFER_SAMPLE_MS))
    }

    /// Counts `offers` (framework, role, what is offered) as held since the last sample.
    pub fn sample(
        &mut self,
        now_ms: u64,
        offers: impl IntoIterator<Item = (String, String, Amounts)>,
    ) {
        let Some(last) = self.last_ms.replace(now_ms) else {
            return;
        };
        let secs = now_ms.saturating_sub(last) as f64 / 1000.0;
        if secs <= 0.0 {
            return;
        }
        let start = last / HOUR_MS * HOUR_MS;
        let bucket = self.buckets.entry(start).or_insert_with(|| Bucket {
            first_ms: last,
            rows: BTreeMap::new(),
        });
        let mut changed = false;
        for (fw, role, a) in offers {
            let b = bucket.rows.entry((fw, role)).or_default();
            b.cpus += a.cpus * secs;
            b.mem += a.mem * secs;
            b.gpus += a.gpus * secs;
            changed = true;
        }
        if changed {
            self.dirty.insert(start);
        }
        while self.buckets.len() > HELD_BUCKETS {
            if let Some((old, _)) = self.buckets.pop_first() {
                self.dirty.remove(&old);
                self.removed.insert(old);
            }
        }
    }

    /// The registry writes that bring the stored buckets up to date, when
    /// [`PERSIST_EVERY_MS`] of sampled time passed since the last ones (empty otherwise).
    pub fn flush(&mut self) -> Vec<Mutation> {
        let now = self.last_ms.unwrap_or(0);
        if now < self.persisted_ms.saturating_add(PERSIST_EVERY_MS) {
            return Vec::new();
        }
        self.persisted_ms = now;
        let mut out: Vec<Mutation> = std::mem::take(&mut self.removed)
            .into_iter()
            .map(Mutation::RemoveHeldOffers)
            .collect();
        for start in std::mem::take(&mut self.dirty) {
            if let Some(b) = self.buckets.get(&start) {
                out.push(Mutation::PutHeldOffers(self.record(start, b)));
            }
        }
        out
    }

    /// A flush whose write failed: its buckets are written again with the next flush.
    pub fn unflushed(&mut self, failed: &[Mutation]) {
        for m in failed {
            match m {
                Mutation::PutHeldOffers(b) if self.buckets.contains_key(&b.start_ms) => {
                    self.dirty.insert(b.start_ms);
                }
                Mutation::RemoveHeldOffers(start) => {
                    self.removed.insert(*start);
                }
                _ => {}
            }
        }
    }

    fn record(&self, start: u64, b: &Bucket) -> HeldOffersBucket {
        let rows = b
            .rows
            .iter()
            .map(|((fw, role), h)| HeldOffersRow {
                framework: fw.clone(),
                role: role.clone(),
                cpu_seconds: h.cpus,
                mem_mib_seconds: h.mem,
                gpu_seconds: h.gpus,
            })
            .collect();
        HeldOffersBucket {
            start_ms: start,
            first_ms: b.first_ms,
            rows,
        }
    }

    /// Offer-hours per framework and role in `[since_ms, until_ms)` (a bucket partly in the
    /// window counts in proportion), `framework_name` naming framework ids; `from_ms` is the
    /// first sample kept.
    pub fn report(
        &self,
        since_ms: u64,
        until_ms: u64,
        framework_name: impl Fn(&str) -> String,
    ) -> Value {
        let mut rows: BTreeMap<(String, String), Held> = BTreeMap::new();
        for (start, b) in &self.buckets {
            let end = start + HOUR_MS;
            let (s, e) = ((*start).max(since_ms), end.min(until_ms));
            if e <= s {
                continue;
            }
            let part = (e - s) as f64 / HOUR_MS as f64;
            for ((fw, role), a) in &b.rows {
                let r = rows.entry((framework_name(fw), role.clone())).or_default();
                r.cpus += a.cpus * part;
                r.mem += a.mem * part;
                r.gpus += a.gpus * part;
            }
        }
        let rows: Vec<Value> = rows
            .iter()
            .map(|((fw, role), a)| {
                json!({"framework": fw, "role": role, "cpu_hours": a.cpus / 3600.0,
                       "mem_gib_hours": a.mem / 1024.0 / 3600.0, "gpu_hours": a.gpus / 3600.0})
            })
            .collect();
        let from_ms = self.buckets.values().map(|b| b.first_ms).min();
        json!({"from_ms": from_ms, "rows": rows})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn held_offers_are_integrated_per_framework_and_role() {
        let mut held = HeldOffers::default();
        let gpu = Amounts {
            cpus: 2.0,
            mem: 1024.0,
            gpus: 1.0,
        };
        let offers = || vec![("f1".to_string(), "ml".to_string(), gpu)];
        assert!(held.due(0));
        held.sample(0, offers());
        assert!(!held.due(500) && held.due(1000));
        // Held for 2 h, sampled every half hour, across the hour's bucket edge.
        for i in 1..=4 {
            held.sample(i * HOUR_MS / 2, offers());
        }
        let name = |id: &str| {
            if id == "f1" {
                "batch".into()
            } else {
                id.into()
            }
        };
        let r = held.report(0, 4 * HOUR_MS, name);
        assert_eq!(r["rows"][0]["framework"], "batch");
        assert!(
            close(r["rows"][0]["gpu_hours"].as_f64().unwrap(), 2.0),
            "{r:#}"
        );
        assert!(
            close(r["rows"][0]["cpu_hours"].as_f64().unwrap(), 4.0),
            "{r:#}"
        );
        // Half of the second hour's bucket.
        let r = held.report(HOUR_MS + HOUR_MS / 2, 4 * HOUR_MS, name);
        assert!(
            close(r["rows"][0]["gpu_hours"].as_f64().unwrap(), 0.5),
            "{r:#}"
        );
    }
    #[test]
    fn held_offers_are_written_at_most_every_ten_seconds_and_restored_whole() {
        let mut held = HeldOffers::default();
        let gpu = Amounts {
            cpus: 1.0,
            mem: 512.0,
            gpus: 1.0,
        };
        let offers = || vec![("f1".to_string(), "ml".to_string(), gpu)];
        held.sample(0, offers());
        assert!(held.flush().is_empty(), "nothing held yet");
        held.sample(5_000, offers());
        assert!(held.flush().is_empty(), "written at most every 10 s");
        held.sample(10_000, offers());
        let written = held.flush();
        assert_eq!(written.len(), 1, "{written:?}");
        assert!(held.flush().is_empty(), "nothing changed since");
        // A failed write is written again.
        held.unflushed(&written);
        held.sample(20_000, Vec::new());
        assert_eq!(held.flush().len(), 1);
        // Restored from the registry: the same report, and sampling goes on adding.
        let mut registry = crate::registry::Registry::default();
        for m in &written {
            registry.apply(m);
        }
        let mut back = HeldOffers::restore(&registry.held_offers);
        let name = |id: &str| id.to_string();
        assert_eq!(back.report(0, HOUR_MS, name), held.report(0, HOUR_MS, name));
        let r = back.report(0, HOUR_MS, name);
        assert!(close(
            r["rows"][0]["gpu_hours"].as_f64().unwrap(),
            10.0 / 3600.0
        ));
        assert_eq!(r["from_ms"], 0);
        back.sample(30_000, offers());
        back.sample(40_000, offers());
        let r = back.report(0, HOUR_MS, name);
        assert!(close(
            r["rows"][0]["gpu_hours"].as_f64().unwrap(),
            20.0 / 3600.0
        ));
    }

    #[test]
    fn buckets_past_the_bound_are_removed_from_the_registry() {
        let mut held = HeldOffers::default();
        let one = Amounts {
            cpus: 1.0,
            mem: 0.0,
            gpus: 0.0,
        };
        for h in 0..=(HELD_BUCKETS as u64 + 1) {
            held.sample(h * HOUR_MS, vec![("f".into(), "r".into(), one)]);
        }
        let out = held.flush();
        assert!(
            out.contains(&Mutation::RemoveHeldOffers(0)),
            "{:?}",
            &out[..2]
        );
        assert_eq!(held.buckets.len(), HELD_BUCKETS);
    }
}
