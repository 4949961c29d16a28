//! What the store keeps of the core, and the core rebuilt from it.
//!
//! [`Core::take_changes`] returns the records of the jobs that changed since it was last
//! called (change tracking: every change to a job records its id in `touched`, and a digest of
//! each touched job drops those that ended up as the store has them) and the workers that ended meanwhile (usage history);
//! the runtime commits them before it sends the actions of the same step, so what the master
//! is asked to do is always in the store first (a launched task is never unknown after a
//! crash). [`Core::restore`] rebuilds the queue from the store's records. Times cross as Unix
//! milliseconds: the caller passes the wall clock (`wall_ms`) with `now`, so the core reads
//! no clock.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use super::{Action, Core, Job, Member};
use crate::model::{JobRecord, JobState, MemberRecord, UsageRecord};

/// What changed since the last [`Core::take_changes`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    /// Jobs whose record changed (new ones included).
    pub jobs: Vec<JobRecord>,
    /// Workers that ended.
    pub usage: Vec<UsageRecord>,
    /// The next job id.
    pub next_id: u64,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.usage.is_empty()
    }
}

/// `at` as Unix milliseconds, given that `now` is `wall_ms`.
pub(super) fn to_unix(at: Instant, now: Instant, wall_ms: u64) -> u64 {
    let back = now.saturating_duration_since(at).as_millis() as u64;
    let ahead = at.saturating_duration_since(now).as_millis() as u64;
    wall_ms.saturating_sub(back).saturating_add(ahead)
}

/// Unix milliseconds `ms` as an instant, given that `now` is `wall_ms` (`now` when it would
/// fall before the monotonic clock's origin).
fn from_unix(ms: u64, now: Instant, wall_ms: u64) -> Instant {
    if ms <= wall_ms {
        now.checked_sub(Duration::from_millis(wall_ms - ms))
            .unwrap_or(now)
    } else {
        now + Duration::from_millis(ms - wall_ms)
    }
}

/// A digest of everything a job's record holds that can change.
fn digest(job: &Job) -> u64 {
    let mut h = DefaultHasher::new();
    (
        job.state,
        job.preempting,
        job.lost,
        job.finished_members,
        job.next_index,
        job.preemptions,
        job.attempts,
        &job.message,
        job.on_deps,
        job.waiting_since,
        job.waited,
    )
        .hash(&mut h);
    (
        job.retries,
        job.retrying,
        job.not_before,
        job.attempt_started,
    )
        .hash(&mut h);
    for (i, m) in &job.members {
        (i, m.task_id, m.state, m.killing, &m.gpus, m.started).hash(&mut h);
    }
    h.finish()
}

fn record(job: &Job, now: Instant, wall_ms: u64) -> JobRecord {
    JobRecord {
        id: job.id,
        spec: job.spec.clone(),
        user: job.user.clone(),
        state: job.state,
        submitted_unix_ms: to_unix(job.submitted, now, wall_ms),
        waiting_since_unix_ms: to_unix(job.waiting_since, now, wall_ms),
        waited_ms: job.waited.as_millis() as u64,
        preemptions: job.preemptions,
        attempts: job.attempts,
        retries: job.retries,
        retrying: job.retrying,
        not_before_unix_ms: job.not_before.map(|t| to_unix(t, now, wall_ms)),
        attempt_started_unix_ms: job.attempt_started.map(|t| to_unix(t, now, wall_ms)),
        preempting: job.preempting,
        lost: job.lost,
        finished_members: job.finished_members,
        next_index: job.next_index,
        message: job.message.clone(),
        on_deps: job.on_deps,
        members: job
            .members
            .iter()
            .map(|(i, m)| MemberRecord {
                index: *i,
                task_id: m.task_id,
                agent_id: m.agent_id,
                hostname: m.hostname.clone(),
                gpus: m.gpus.clone(),
                state: m.state,
                killing: m.killing,
                started_unix_ms: to_unix(m.started, now, wall_ms),
            })
            .collect(),
    }
}

impl Core {
    /// The records of the jobs that changed since the last call and the workers that ended
    /// meanwhile; `now` is `wall_ms` Unix milliseconds.
    pub fn take_changes(&mut self, now: Instant, wall_ms: u64) -> Changes {
        self.set_wall_clock(now, wall_ms);
        // Change tracking: only the jobs touched since the last call can differ from what the
        // store has (the digest then drops those that did not change after all).
        let touched = std::mem::take(&mut self.touched);
        // The kept order looks at them again in the next pass.
        self.order_cache.note(&touched);
        let mut changed = Vec::new();
        for job in touched.iter().filter_map(|id| self.jobs.get(id)) {
            let d = digest(job);
            if self.persisted.get(&job.id) != Some(&d) {
                changed.push((job.id, d));
            }
        }
        // Tests check that every change was tracked: a full scan finds nothing more.
        #[cfg(test)]
        for job in self.jobs.values() {
            assert!(
                touched.contains(&job.id) || self.persisted.get(&job.id) == Some(&digest(job)),
                "job {} changed without being tracked",
                job.id
            );
        }
        let mut jobs = Vec::with_capacity(changed.len());
        for (id, d) in changed {
            if let Some(job) = self.jobs.get(&id) {
                jobs.push(record(job, now, wall_ms));
            }
            self.persisted.insert(id, d);
        }
        // Jobs forgotten in memory (`trim`) stay in the store as they were.
        if self.persisted.len() > self.jobs.len() {
            let jobs = &self.jobs;
            self.persisted.retain(|id, _| jobs.contains_key(id));
        }
        let usage: Vec<UsageRecord> = std::mem::take(&mut self.ended_members)
            .into_iter()
            .map(|e| {
                let (team, user) = self
                    .jobs
                    .get(&e.job)
                    .map(|j| (j.spec.team.clone(), j.user.clone()))
                    .unwrap_or_default();
                UsageRecord {
                    job: e.job,
                    team,
                    user,
                    attempt: e.attempt,
                    task_id: e.task_id,
                    gpus: e.gpus,
                    secs: e.secs,
                    ended_unix_ms: to_unix(e.at, now, wall_ms),
                    cost: e.cost,
                }
            })
            .collect();
        self.count_spending(&usage, wall_ms);
        Changes {
            jobs,
            usage,
            next_id: self.next_id,
        }
    }

    /// Rebuilds the queue from the store: `records` (every job not ended and the latest ended
    /// ones), GPU-seconds per team so far and the next job id; `now` is `wall_ms`. Returns the
    /// kills still owed (workers being killed on purpose when the queue stopped). The
    /// workers' states are then reconciled with the master ([`Core::task_ids`]).
    pub fn restore(
        &mut self,
        records: Vec<JobRecord>,
        gpu_secs: BTreeMap<String, f64>,
        next_id: u64,
        now: Instant,
        wall_ms: u64,
    ) -> Vec<Action> {
        self.set_wall_clock(now, wall_ms);
        // Restored jobs are not touched: the next pass keys every job.
        self.order_cache = Default::default();
        let mut out = Vec::new();
        let mut max_id = 0;
        for r in records {
            max_id = max_id.max(r.id);
            let mut members = BTreeMap::new();
            for m in r.members {
                self.tasks.insert(m.task_id, (r.id, m.index));
                if m.killing || r.state.is_terminal() {
                    out.push(Action::Kill(m.task_id));
                }
                members.insert(
                    m.index,
                    Member {
                        task_id: m.task_id,
                        agent_id: m.agent_id,
                        hostname: m.hostname,
                        gpus: m.gpus,
                        state: m.state,
                        killing: m.killing || r.state.is_terminal(),
                        started: from_unix(m.started_unix_ms, now, wall_ms),
                    },
                );
            }
            let job = Job {
                id: r.id,
                spec: r.spec,
                state: r.state,
                submitted: from_unix(r.submitted_unix_ms, now, wall_ms),
                waiting_since: from_unix(r.waiting_since_unix_ms, now, wall_ms),
                waited: Duration::from_millis(r.waited_ms),
                preemptions: r.preemptions,
                preempting: r.preempting,
                lost: r.lost,
                members,
                finished_members: r.finished_members,
                next_index: r.next_index,
                message: r.message,
                on_deps: r.on_deps,
                user: r.user,
                attempts: r.attempts,
                retries: r.retries,
                retrying: r.retrying,
                not_before: r.not_before_unix_ms.map(|t| from_unix(t, now, wall_ms)),
                attempt_started: r
                    .attempt_started_unix_ms
                    .map(|t| from_unix(t, now, wall_ms)),
            };
            self.persisted.insert(job.id, digest(&job));
            self.jobs.insert(job.id, job);
        }
        self.next_id = self.next_id.max(next_id).max(max_id + 1);
        self.stats.gpu_secs = gpu_secs;
        out
    }

    /// The framework is being torn down (`gantry-queue shutdown`): the master kills every
    /// worker, so jobs with workers end `CANCELLED`; pending jobs stay pending for the next
    /// framework.
    pub fn shutdown(&mut self) {
        for job in self.jobs.values_mut() {
            if job.members.is_empty() {
                continue;
            }
            self.touched.insert(job.id);
            for m in job.members.values() {
                self.tasks.remove(&m.task_id);
            }
            job.members.clear();
            job.preempting = false;
            if !job.state.is_terminal() {
                job.state = JobState::Cancelled;
                job.message = "the queue was shut down (framework torn down)".into();
            }
        }
        self.offers.clear();
    }
}

#[cfg(test)]
mod tests;
