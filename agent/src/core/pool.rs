//! The pool of prepared task cgroups (`--cgroup-pool LOW:HIGH`), as pure bookkeeping: which
//! empty cgroups are ready, how many are being made or returned, and when to make more.
//!
//! Making a task cgroup is a `mkdir` in up to six cgroup v1 hierarchies (one on v2) and
//! removing it an `rmdir` in each, with the kernel's cgroup locks and RCU work behind them:
//! about half a millisecond of CPU per task, on the task's path. The pool makes LOW cgroups
//! ahead (at start and whenever fewer are ready or on their way) and reuses them: a task takes
//! a ready one (its limits are written at launch, its counters reset or taken as a baseline,
//! [`crate::isolation::Isolator::create`]); when the task has ended, its terminal update is on
//! its way and the cgroup is empty, the cgroup goes back to the pool instead of being removed —
//! unless HIGH are ready or coming already. With none ready a task gets a new pool name, made
//! on its launch and pooled after it like the others: a burst of N tasks makes at most N - LOW
//! cgroups once, and the next burst of up to HIGH finds them all ready.
//!
//! Names are `pool-<tag>-<generation>-<n>` ([`pool_prefix`]): the tag is this agent's (from its
//! work directory: agents sharing a `--cgroup-root` leave each other's pools alone), the
//! generation this run's (a restarted agent removes the empty cgroups of its earlier runs and
//! never hands them out; a task still running in one is re-adopted by the name in its record).

use std::collections::VecDeque;

pub use crate::isolation::POOL_PREFIX;

/// `--cgroup-pool LOW:HIGH`; HIGH = 0 turns the pool off (one cgroup made and removed per
/// task, named after it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Refill when fewer are ready or on their way.
    pub low: usize,
    /// Never more ready (or on their way) than this.
    pub high: usize,
    /// This run's name prefix ([`pool_prefix`]).
    pub prefix: String,
}

impl PoolConfig {
    /// No pool.
    pub fn off() -> Self {
        PoolConfig {
            low: 0,
            high: 0,
            prefix: String::new(),
        }
    }
}

/// The default `--cgroup-pool` low-water mark.
pub const DEFAULT_LOW: usize = 32;
/// The default `--cgroup-pool` high-water mark: a burst of this many tasks ending together
/// keeps all their cgroups for the next burst (they are made by the first burst, not ahead).
pub const DEFAULT_HIGH: usize = 1024;

/// Pool cgroups made per background job: the pool fills in steps (ready ones are usable at
/// once, and cgroups of ended tasks can come back meanwhile).
pub const FILL_CHUNK: usize = 64;

/// After a fill job that failed, the next one waits this long.
pub const RETRY_FILL_MS: u64 = 5_000;

/// Ready cgroups above the low-water mark are removed after this long without a task taking
/// one (an idle agent does not keep HIGH empty cgroups and their kernel memory).
pub const TRIM_AFTER_MS: u64 = 60_000;

/// This agent's pool names: `pool-<tag>-`, with the tag a short hash of its work directory.
pub fn agent_prefix(work_dir: &std::path::Path) -> String {
    // FNV-1a: stable across builds and runs (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in work_dir.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{POOL_PREFIX}{:08x}-", h as u32)
}

/// This run's pool names: the agent's prefix and a generation (e.g. the start time in ms).
pub fn pool_prefix(agent_prefix: &str, generation: u64) -> String {
    format!("{agent_prefix}{generation:x}-")
}

/// What to do with a cgroup found under the root at start or clean-up, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// Not a pool name: a task's own cgroup.
    Task,
    /// A slot of this run's pool: the pool manages it.
    Current,
    /// A slot of an earlier run of this agent: removed unless a live task holds it.
    Stale,
    /// Another agent's pool (sharing the root): left alone.
    Foreign,
}

/// Classifies a cgroup name against this agent's prefix and this run's prefix.
pub fn classify(name: &str, agent_prefix: &str, run_prefix: &str) -> SlotKind {
    if !name.starts_with(POOL_PREFIX) {
        SlotKind::Task
    } else if !run_prefix.is_empty() && name.starts_with(run_prefix) {
        SlotKind::Current
    } else if !agent_prefix.is_empty() && name.starts_with(agent_prefix) {
        SlotKind::Stale
    } else {
        SlotKind::Foreign
    }
}

/// The pool's state.
#[derive(Debug)]
pub struct CgroupPool {
    config: PoolConfig,
    /// Ready cgroups: the last returned first (its kernel state is the warmest), those made
    /// ahead behind.
    free: VecDeque<String>,
    /// Being made (asked for, not reported yet).
    preparing: usize,
    /// Ended tasks' cgroups being readied to come back.
    recycling: usize,
    /// The next name's number.
    next: u64,
    /// When a task last took a cgroup (or cgroups were made for the pool).
    last_take_ms: u64,
    /// Filling up to the low-water mark.
    filling: bool,
    /// After a fill job that could not make all it was asked, none before this time.
    retry_at_ms: u64,
}

impl CgroupPool {
    pub fn new(config: PoolConfig) -> Self {
        CgroupPool {
            config,
            free: VecDeque::new(),
            preparing: 0,
            recycling: 0,
            next: 0,
            last_take_ms: 0,
            filling: false,
            retry_at_ms: 0,
        }
    }

    /// Whether the pool is on.
    pub fn enabled(&self) -> bool {
        self.config.high > 0
    }

    fn fresh_name(&mut self) -> String {
        let n = self.next;
        self.next += 1;
        format!("{}{n}", self.config.prefix)
    }

    /// Ready, being made and coming back.
    fn level(&self) -> usize {
        self.free.len() + self.preparing + self.recycling
    }

    /// The cgroup name for a new task: a ready one, else a new pool name (made by the launch).
    /// `None` when the pool is off (the task's cgroup is named after it).
    pub fn take(&mut self, now: u64) -> Option<String> {
        if !self.enabled() {
            return None;
        }
        self.last_take_ms = now;
        Some(match self.free.pop_front() {
            Some(name) => name,
            None => self.fresh_name(),
        })
    }

    /// Names to make now: once the level is under the low-water mark the pool fills up to it,
    /// [`FILL_CHUNK`] at a time (one job at a time).
    pub fn refill(&mut self, now: u64) -> Vec<String> {
        if !self.enabled() || now < self.retry_at_ms {
            return Vec::new();
        }
        let target = self.config.low.min(self.config.high);
        if self.level() < target {
            self.filling = true;
        }
        if !self.filling || self.preparing > 0 {
            return Vec::new();
        }
        if self.level() >= target {
            self.filling = false;
            return Vec::new();
        }
        let n = (target - self.level()).min(FILL_CHUNK);
        self.preparing += n;
        (0..n).map(|_| self.fresh_name()).collect()
    }

    /// `asked` names were being made; `ready` of them are.
    pub fn prepared(&mut self, asked: usize, ready: Vec<String>, now: u64) {
        self.last_take_ms = self.last_take_ms.max(now);
        if ready.len() < asked {
            // (The runtime logged why.) Not again at once: no loop of failing jobs.
            self.retry_at_ms = now + RETRY_FILL_MS;
        }
        self.preparing = self.preparing.saturating_sub(asked);
        self.free.extend(ready);
        if self.level() >= self.config.low {
            self.filling = false;
        }
    }

    /// Whether an ended task's cgroup `name` goes back to the pool (a name of this run's, with
    /// room under the high-water mark); if so the pool counts it as coming back until
    /// [`CgroupPool::recycled`].
    pub fn recycle(&mut self, name: &str) -> bool {
        let ours = self.enabled() && name.starts_with(&self.config.prefix);
        if ours && self.level() < self.config.high {
            self.recycling += 1;
            true
        } else {
            false
        }
    }

    /// A cgroup announced by [`CgroupPool::recycle`] is back (or was destroyed: `None`).
    pub fn recycled(&mut self, name: Option<String>) {
        self.recycling = self.recycling.saturating_sub(1);
        if let Some(name) = name {
            self.free.push_front(name);
        }
    }

    /// Ready cgroups beyond the low-water mark to remove now: the pool has been idle (no
    /// take) for [`TRIM_AFTER_MS`]. Those at the back (taken last) go.
    pub fn trim(&mut self, now: u64) -> Vec<String> {
        if now.saturating_sub(self.last_take_ms) < TRIM_AFTER_MS
            || self.free.len() <= self.config.low
        {
            return Vec::new();
        }
        self.free.split_off(self.config.low).into()
    }

    /// When [`CgroupPool::trim`] or a refill held back by a failure ([`CgroupPool::refill`])
    /// has something to do next.
    pub fn next_deadline(&self) -> Option<u64> {
        if !self.enabled() {
            return None;
        }
        let trim = (self.free.len() > self.config.low)
            .then(|| self.last_take_ms.saturating_add(TRIM_AFTER_MS));
        let target = self.config.low.min(self.config.high);
        let refill = (self.preparing == 0 && self.level() < target && self.retry_at_ms > 0)
            .then_some(self.retry_at_ms);
        trim.into_iter().chain(refill).min()
    }

    /// Empties the pool (shutdown): the ready names, to remove.
    pub fn drain(&mut self) -> Vec<String> {
        self.free.drain(..).collect()
    }

    /// Ready cgroups.
    pub fn ready(&self) -> usize {
        self.free.len()
    }

    /// This run's prefix.
    pub fn prefix(&self) -> &str {
        &self.config.prefix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(low: usize, high: usize) -> CgroupPool {
        CgroupPool::new(PoolConfig {
            low,
            high,
            prefix: "pool-abc-1-".into(),
        })
    }

    #[test]
    fn fills_to_low() {
        let mut p = pool(4, 8);
        let names = p.refill(0);
        assert_eq!(
            names,
            vec![
                "pool-abc-1-0",
                "pool-abc-1-1",
                "pool-abc-1-2",
                "pool-abc-1-3"
            ]
        );
        // Being made counts: no second request meanwhile.
        assert!(p.refill(0).is_empty());
        // Three made, one failed: the fill goes on to low, after a pause.
        p.prepared(4, names[..3].to_vec(), 0);
        assert_eq!(p.ready(), 3);
        assert!(p.refill(RETRY_FILL_MS - 1).is_empty());
        assert_eq!(p.refill(RETRY_FILL_MS), vec!["pool-abc-1-4"]);
        p.prepared(1, vec!["pool-abc-1-4".into()], 0);
        assert!(p.refill(RETRY_FILL_MS).is_empty(), "full");
        assert_eq!(p.take(0).as_deref(), Some("pool-abc-1-0"));
        assert_eq!(p.take(0).as_deref(), Some("pool-abc-1-1"));
        assert_eq!(p.take(0).as_deref(), Some("pool-abc-1-2"));
        assert_eq!(p.take(0).as_deref(), Some("pool-abc-1-4"));
        // None ready < low 4: made up to 4.
        assert_eq!(
            p.refill(RETRY_FILL_MS),
            vec![
                "pool-abc-1-5",
                "pool-abc-1-6",
                "pool-abc-1-7",
                "pool-abc-1-8"
            ]
        );
    }

    #[test]
    fn fills_in_chunks() {
        let mut p = pool(FILL_CHUNK + 10, 2 * FILL_CHUNK);
        let first = p.refill(0);
        assert_eq!(first.len(), FILL_CHUNK);
        assert!(p.refill(0).is_empty(), "one job at a time");
        p.prepared(FILL_CHUNK, first, 0);
        // The rest, up to low; then nothing.
        let second = p.refill(0);
        assert_eq!(second.len(), 10);
        p.prepared(10, second, 0);
        assert!(p.refill(0).is_empty());
        assert_eq!(p.ready(), FILL_CHUNK + 10);
    }

    #[test]
    fn an_empty_pool_still_names_the_task_cgroup() {
        let mut p = pool(1, 2);
        assert_eq!(p.take(0).as_deref(), Some("pool-abc-1-0"));
        assert_eq!(p.take(0).as_deref(), Some("pool-abc-1-1"));
        // Names are never handed out twice.
        let made = p.refill(0);
        assert_eq!(made, vec!["pool-abc-1-2"]);
    }

    #[test]
    fn recycles_own_names_up_to_high() {
        let mut p = pool(1, 2);
        let a = p.take(0).unwrap();
        let b = p.take(0).unwrap();
        let c = p.take(0).unwrap();
        assert!(p.recycle(&a));
        assert!(p.recycle(&b));
        // Two coming back reach the high-water mark: the third is removed.
        assert!(!p.recycle(&c));
        p.recycled(Some(a.clone()));
        // Recycling failed (destroyed instead).
        p.recycled(None);
        assert_eq!(p.ready(), 1);
        assert!(p.recycle(&c));
        p.recycled(Some(c.clone()));
        // The last returned is taken first.
        assert_eq!(p.take(0), Some(c));
        assert_eq!(p.take(0), Some(a));
        // Not ours (an earlier run's slot, a task-named cgroup): removed, not pooled.
        assert!(!p.recycle("pool-abc-0-7"));
        assert!(!p.recycle("0b7c5e1a-0000-4000-8000-000000000000"));
    }

    #[test]
    fn off_pool_does_nothing() {
        let mut p = CgroupPool::new(PoolConfig::off());
        assert_eq!(p.take(0), None);
        assert!(p.refill(0).is_empty());
        assert!(!p.recycle("pool-abc-1-0"));
        assert!(p.drain().is_empty());
    }

    #[test]
    fn idle_pool_is_trimmed_to_low() {
        let mut p = pool(1, 3);
        let made = p.refill(0);
        p.prepared(1, made, 0);
        let taken: Vec<String> = (0..3).map(|_| p.take(1000).unwrap()).collect();
        assert_eq!(taken, vec!["pool-abc-1-0", "pool-abc-1-1", "pool-abc-1-2"]);
        for name in &taken {
            assert!(p.recycle(name));
            p.recycled(Some(name.clone()));
        }
        assert_eq!(p.ready(), 3);
        assert!(
            p.trim(1000 + TRIM_AFTER_MS - 1).is_empty(),
            "not idle long enough"
        );
        // The ones taken last go (back of the queue).
        assert_eq!(
            p.trim(1000 + TRIM_AFTER_MS),
            vec!["pool-abc-1-1", "pool-abc-1-0"]
        );
        assert_eq!(p.ready(), 1);
        assert!(p.trim(1000 + 2 * TRIM_AFTER_MS).is_empty(), "at low");
    }

    #[test]
    fn drain_returns_ready_names() {
        let mut p = pool(1, 3);
        let names = p.refill(0);
        p.prepared(3, names.clone(), 0);
        assert_eq!(p.drain(), names);
        assert_eq!(p.ready(), 0);
    }

    #[test]
    fn names_are_classified() {
        let agent = agent_prefix(std::path::Path::new("/var/lib/gantry"));
        assert!(agent.starts_with("pool-") && agent.ends_with('-'));
        assert_eq!(agent, agent_prefix(std::path::Path::new("/var/lib/gantry")));
        assert_ne!(agent, agent_prefix(std::path::Path::new("/var/lib/other")));
        let run = pool_prefix(&agent, 0x1234);
        assert_eq!(run, format!("{agent}1234-"));
        assert_eq!(
            classify(&format!("{run}7"), &agent, &run),
            SlotKind::Current
        );
        let old = pool_prefix(&agent, 0x1000);
        assert_eq!(classify(&format!("{old}7"), &agent, &run), SlotKind::Stale);
        assert_eq!(
            classify("pool-ffffffff-1-0", &agent, &run),
            SlotKind::Foreign
        );
        assert_eq!(
            classify("0b7c5e1a-0000-4000-8000-000000000000", &agent, &run),
            SlotKind::Task
        );
        // Valid cgroup names for the isolator.
        assert!(format!("{run}12")
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    }
}
