//! The cluster's event history: every event of the operator event stream (task state
//! transitions, agents, frameworks, roles) with the time the master recorded it, bounded, and
//! kept in the registry so it survives a master restart and a failover (the local store
//! standalone, etcd in HA).
//!
//! Events fill pages of [`PAGE_EVENTS`]; a page is written to the registry as one record,
//! again each time it changed, at most once a second ([`FLUSH_EVERY`]: the last second of
//! events can be lost in a crash, the price of not writing etcd per task update), at most
//! [`MAX_PAGES_PER_FLUSH`] pages a time (under a sustained burst of more than about 500
//! events a second the stored history lags, and pages trimmed before their turn are not
//! written). Past the
//! bound (`--history-events`, default 16,384 events) the oldest pages are removed. A new leader
//! reads the pages with the rest of the registry and goes on after the last. PURE: the core
//! loop pushes, a shell task flushes the mutations to the registry writer.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;

use crate::registry::{HeldOffersBucket, HistoryEvent, HistoryPage, Mutation};

/// Events per page (one registry record).
pub const PAGE_EVENTS: usize = 256;
/// How often changed pages are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Pages written by one flush at most.
pub const MAX_PAGES_PER_FLUSH: usize = 2;
/// The default bound (`--history-events`).
pub const DEFAULT_EVENTS: usize = 16_384;

/// The history in memory, and what the registry does not have yet.
#[derive(Debug, Default)]
pub struct History {
    pages: BTreeMap<u64, Vec<HistoryEvent>>,
    unflushed: BTreeSet<u64>,
    removed: BTreeSet<u64>,
    max_pages: usize,
    /// Events pushed by this master, and how many of them the registry has (flushed and
    /// written).
    recorded: u64,
    stored: u64,
    /// Task use of every event recorded, added up for ever (`gantry_usage_*_total`).
    usage: super::usage::Meter,
    /// Resources held in outstanding offers (sampled by the core loop; written with the
    /// history's flush).
    pub held_offers: super::usage::HeldOffers,
}

impl History {
    /// A history of at most about `max_events` events (whole pages); 0 keeps none.
    pub fn new(max_events: usize) -> Self {
        Self {
            max_pages: max_events.div_ceil(PAGE_EVENTS),
            ..Self::default()
        }
    }

    /// Whether events are kept at all.
    pub fn enabled(&self) -> bool {
        self.max_pages > 0
    }

    /// Takes the registry's pages and held offers (a new leader), dropping what this master
    /// held before.
    pub fn restore(
        &mut self,
        pages: &BTreeMap<u64, HistoryPage>,
        held_offers: &BTreeMap<u64, HeldOffersBucket>,
    ) {
        self.pages = pages.iter().map(|(n, p)| (*n, p.events.clone())).collect();
        self.usage = super::usage::Meter::default();
        self.held_offers = super::usage::HeldOffers::restore(held_offers);
        for e in self.pages.values().flatten() {
            self.usage.observe(e);
        }
        self.unflushed.clear();
        self.removed.clear();
        self.trim();
    }

    /// Records one event at `at_unix_ms`.
    pub fn push(&mut self, at_unix_ms: u64, event: Value) {
        if !self.enabled() {
            return;
        }
        let last = self.pages.keys().next_back().copied();
        let page = match last {
            Some(n) if self.pages[&n].len() < PAGE_EVENTS => n,
            Some(n) => n + 1,
            None => 0,
        };
        let e = HistoryEvent { at_unix_ms, event };
        self.usage.observe(&e);
        self.pages.entry(page).or_default().push(e);
        self.unflushed.insert(page);
        self.recorded += 1;
        self.trim();
    }

    fn trim(&mut self) {
        while self.pages.len() > self.max_pages {
            let Some((n, _)) = self.pages.pop_first() else {
                break;
            };
            self.unflushed.remove(&n);
            self.removed.insert(n);
        }
    }

    /// [`History::flush`], and the count to pass to [`History::stored`] once written.
    pub fn flush_counted(&mut self) -> (Vec<Mutation>, u64) {
        (self.flush(), self.recorded)
    }

    /// The registry has the events pushed up to `recorded` (a count from
    /// [`History::flush_counted`]).
    pub fn stored(&mut self, recorded: u64) {
        self.stored = self.stored.max(recorded);
    }

    /// A flush whose write failed: its pages are written again with the next flush.
    pub fn unflushed(&mut self, failed: &[Mutation]) {
        for m in failed {
            match m {
                Mutation::PutHistoryPage(p) if self.pages.contains_key(&p.page) => {
                    self.unflushed.insert(p.page);
                }
                Mutation::RemoveHistoryPage(n) => {
                    self.removed.insert(*n);
                }
                _ => {}
            }
        }
        self.held_offers.unflushed(failed);
    }

    /// For `/state` (`history`): events held, pushed by this master, and stored of those.
    pub fn figures(&self) -> Value {
        serde_json::json!({
            "events": self.len(),
            "limit": self.max_pages * PAGE_EVENTS,
            "recorded": self.recorded,
            "stored": self.stored,
        })
    }

    /// The registry writes that bring the stored history up to date (empty when it is).
    pub fn flush(&mut self) -> Vec<Mutation> {
        let mut out: Vec<Mutation> = std::mem::take(&mut self.removed)
            .into_iter()
            .map(Mutation::RemoveHistoryPage)
            .collect();
        // Oldest first, a few pages a write (a registry transaction stays far below etcd's
        // request size even with the core's own mutations grouped in); the rest waits for the
        // next flush, and pages trimmed meanwhile are never written.
        let take: Vec<u64> = self
            .unflushed
            .iter()
            .copied()
            .take(MAX_PAGES_PER_FLUSH)
            .collect();
        for n in take {
            self.unflushed.remove(&n);
            if let Some(events) = self.pages.get(&n) {
                out.push(Mutation::PutHistoryPage(HistoryPage {
                    page: n,
                    events: events.clone(),
                }));
            }
        }
        out.extend(self.held_offers.flush());
        out
    }

    /// Events recorded at or after `since_unix_ms`, oldest first, at most `limit` (the newest
    /// of them).
    pub fn since(&self, since_unix_ms: u64, limit: usize) -> Vec<HistoryEvent> {
        let mut out: Vec<HistoryEvent> = self
            .pages
            .values()
            .flatten()
            .filter(|e| e.at_unix_ms >= since_unix_ms)
            .cloned()
            .collect();
        if out.len() > limit {
            out.drain(..out.len() - limit);
        }
        out
    }

    /// The state transitions of task `task_id` that the history holds, oldest first.
    pub fn task(&self, task_id: &str) -> Vec<HistoryEvent> {
        self.pages
            .values()
            .flatten()
            .filter(|e| e.event["type"] == "task_updated" && e.event["task_id"] == task_id)
            .cloned()
            .collect()
    }

    /// Task use since the history began (the `gantry_usage_*_total` counters).
    pub fn usage(&self) -> &super::usage::Meter {
        &self.usage
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.pages.values().map(Vec::len).sum()
    }

    /// True when no event is held.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(i: u64) -> Value {
        serde_json::json!({"type": "task_updated", "task_id": format!("t{}", i % 3), "n": i})
    }

    #[test]
    fn pages_fill_flush_once_and_the_oldest_go_past_the_bound() {
        let mut h = History::new(2 * PAGE_EVENTS);
        for i in 0..PAGE_EVENTS as u64 + 1 {
            h.push(i, ev(i));
        }
        let first = h.flush();
        assert_eq!(first.len(), 2, "two pages written");
        assert!(h.flush().is_empty(), "nothing changed since");
        h.push(1000, ev(1000));
        assert!(
            matches!(&h.flush()[..], [Mutation::PutHistoryPage(p)] if p.page == 1 && p.events.len() == 2)
        );
        // A third page pushes the first out: removed in the registry too.
        for i in 0..2 * PAGE_EVENTS as u64 {
            h.push(2000 + i, ev(i));
        }
        let m = h.flush();
        assert!(m.contains(&Mutation::RemoveHistoryPage(0)), "{:?}", &m[..1]);
        assert!(h.len() <= 2 * PAGE_EVENTS);
        // The first two pages are gone: the oldest event left is from the last pushes.
        assert!(h.since(0, usize::MAX)[0].at_unix_ms >= 2000);
    }

    #[test]
    fn a_new_leader_goes_on_after_the_stored_pages() {
        let mut h = History::new(DEFAULT_EVENTS);
        for i in 0..10 {
            h.push(i, ev(i));
        }
        let mut registry = crate::registry::Registry::default();
        for m in h.flush() {
            registry.apply(&m);
        }
        let mut next = History::new(DEFAULT_EVENTS);
        next.restore(&registry.history, &registry.held_offers);
        next.push(10, ev(10));
        assert_eq!(next.since(5, usize::MAX).len(), 6);
        assert_eq!(next.since(0, 3).first().map(|e| e.at_unix_ms), Some(8));
        assert_eq!(next.task("t1").len(), 4, "t1 is events 1, 4, 7, 10");
        assert!(History::new(0).flush().is_empty());
    }

    #[test]
    fn a_failed_write_is_written_again() {
        let mut h = History::new(DEFAULT_EVENTS);
        h.push(1, ev(1));
        let failed = h.flush();
        assert!(h.flush().is_empty());
        h.unflushed(&failed);
        assert_eq!(h.flush(), failed);
    }
}
