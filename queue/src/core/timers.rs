//! Time and dependencies: jobs waiting on others (`after`, Slurm's `afterok`), retries whose
//! backoff ended, attempts past their time limit, and pending jobs past their deadline's latest
//! start.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use gantry_sdk::protocol::*;

use super::{time_limit, Action, Core, JobSpec, JobState};

impl Core {
    /// Why `spec`'s dependencies cannot be waited for, if they cannot: an unknown job id (or one
    /// already forgotten), or a repeated one. A dependency that already ended `FAILED` or
    /// `CANCELLED` is accepted: the job is then cancelled at once, with the reason.
    pub fn dependency_problem(&self, spec: &JobSpec) -> Option<String> {
        let mut seen = BTreeSet::new();
        for d in &spec.after {
            if !seen.insert(*d) {
                return Some(format!("dependency {d} is listed twice"));
            }
            if !self.jobs.contains_key(d) {
                return Some(format!("dependency {d} is not a known job"));
            }
        }
        None
    }

    /// Dependencies (`afterok`): a pending job whose dependency ended `FAILED` or `CANCELLED`
    /// (or is unknown) is cancelled with the reason, transitively; one whose dependencies all
    /// `FINISHED` becomes eligible, and its wait (aging, `waited_secs`) starts then.
    ///
    /// Only the watched jobs ([`Watch`]) are looked at: every job waiting on a dependency is.
    pub(super) fn resolve_dependencies(&mut self, now: Instant) {
        self.update_watch();
        loop {
            let mut changed = false;
            let waiting: Vec<u64> = self
                .order_cache
                .watch
                .ids
                .iter()
                .filter(|id| {
                    self.jobs
                        .get(id)
                        .is_some_and(|j| j.state == JobState::Pending && j.on_deps)
                })
                .copied()
                .collect();
            #[cfg(test)]
            {
                let walked: Vec<u64> = self
                    .jobs
                    .values()
                    .filter(|j| j.state == JobState::Pending && j.on_deps)
                    .map(|j| j.id)
                    .collect();
                assert_eq!(waiting, walked, "jobs waiting on dependencies");
            }
            for id in waiting {
                let broken =
                    self.jobs[&id]
                        .spec
                        .after
                        .iter()
                        .find_map(|d| match self.jobs.get(d) {
                            None => Some(format!("dependency {d} is unknown")),
                            Some(j)
                                if matches!(j.state, JobState::Failed | JobState::Cancelled) =>
                            {
                                Some(format!(
                                    "dependency {d} ({}) ended {}",
                                    j.spec.name,
                                    j.state.as_str()
                                ))
                            }
                            Some(_) => None,
                        });
                let met = self.jobs[&id].spec.after.iter().all(|d| {
                    self.jobs
                        .get(d)
                        .is_some_and(|j| j.state == JobState::Finished)
                });
                if broken.is_some() || met {
                    self.touched.insert(id);
                }
                let Some(job) = self.jobs.get_mut(&id) else {
                    continue;
                };
                if let Some(why) = broken {
                    job.state = JobState::Cancelled;
                    job.on_deps = false;
                    job.message = format!("{why}: cancelled (afterok: runs only after its dependencies finish successfully)");
                    self.holds.done(&id);
                    changed = true;
                } else if met {
                    job.on_deps = false;
                    job.waiting_since = now;
                }
            }
            if !changed {
                break;
            }
        }
    }

    /// The latest time `spec`'s job may start and still end by its deadline (the deadline
    /// minus its time limit), as an instant; `None` without a deadline or a wall clock.
    pub(super) fn latest_start(&self, spec: &JobSpec) -> Option<Instant> {
        latest_start(&self.config, self.wall, spec)
    }

    /// Retries whose backoff is over become eligible; attempts past their time limit are
    /// killed and their jobs end `FAILED` (reason `time-limit`); pending jobs past their latest
    /// start are cancelled (reason `deadline`) unless their deadline is best-effort.
    ///
    /// Only the watched jobs ([`Watch`]: pending with a deadline, backing off, waiting on a
    /// dependency) and those with workers are looked at, not the whole queue.
    pub(super) fn timers(&mut self, now: Instant) -> Vec<Action> {
        self.update_watch();
        let mut ids = self.order_cache.watch.ids.clone();
        ids.extend(self.with_members().map(|j| j.id));
        #[cfg(test)]
        for j in self.jobs.values() {
            // Every job the walk of the queue would act on is among them.
            let deadline = j.state == JobState::Pending
                && !j.spec.deadline_best_effort
                && j.members.is_empty()
                && self.latest_start(&j.spec).is_some_and(|t| now > t);
            let backoff = j.not_before.is_some_and(|t| now >= t);
            let limit = j.state == JobState::Running
                && j.attempt_started.is_some()
                && time_limit(&self.config, &j.spec).is_some();
            assert!(
                !(deadline || backoff || limit) || ids.contains(&j.id),
                "job {} is not watched by the timers",
                j.id
            );
        }
        let mut out = Vec::new();
        // Per job, in id order and in this order: a missed deadline, a backoff's end, the
        // time limit.
        let (config, wall) = (&self.config, self.wall);
        for id in &ids {
            let Some(job) = self.jobs.get_mut(id) else {
                continue;
            };
            if job.state == JobState::Pending
                && !job.spec.deadline_best_effort
                && job.members.is_empty()
                && latest_start(config, wall, &job.spec).is_some_and(|t| now > t)
            {
                self.touched.insert(job.id);
                job.state = JobState::Cancelled;
                job.message = "deadline: it could not start in time to end by its deadline \
                               (deadline minus time limit); cancelled"
                    .into();
                self.holds.done(&job.id);
            }
            if job.not_before.is_some_and(|t| now >= t) {
                job.not_before = None;
                job.waiting_since = now;
                self.touched.insert(job.id);
            }
            let (Some(limit), Some(started)) = (time_limit(config, &job.spec), job.attempt_started)
            else {
                continue;
            };
            if job.state != JobState::Running
                || job.preempting
                || now.saturating_duration_since(started) < limit
            {
                continue;
            }
            self.touched.insert(job.id);
            job.state = JobState::Failed;
            job.message = format!(
                "time-limit: killed after its time limit of {} s",
                limit.as_secs()
            );
            for m in job.members.values_mut() {
                m.killing = true;
                out.push(Action::KillFor(m.task_id, TaskReason::TimeLimit));
            }
            self.holds.done(&job.id);
        }
        out
    }
}

/// [`Core::latest_start`] under `config` with the wall clock `wall` (an instant and the Unix
/// milliseconds then).
fn latest_start(
    config: &super::CoreConfig,
    wall: Option<(Instant, u64)>,
    spec: &JobSpec,
) -> Option<Instant> {
    let (at, wall) = wall?;
    let deadline_ms = spec.deadline_unix?.saturating_mul(1000);
    let limit = time_limit(config, spec).unwrap_or(Duration::ZERO);
    let deadline = if deadline_ms >= wall {
        at + Duration::from_millis(deadline_ms - wall)
    } else {
        at.checked_sub(Duration::from_millis(wall - deadline_ms))
            .unwrap_or(at)
    };
    Some(deadline.checked_sub(limit).unwrap_or(deadline.min(at)))
}

/// The jobs the timers and dependencies look at in a pass ([`Core::timers`],
/// [`Core::resolve_dependencies`]) besides those with workers: every job waiting on a
/// dependency, backing off before a retry, or pending with a deadline (a superset: each is
/// checked as the walk of the queue checked it). Kept across passes from the jobs changed
/// since the last (`touched`, and those a store commit took: [`Watch::note`]): those
/// conditions change only where the core touches a job. Kept with the order
/// ([`super::order_cache::OrderCache`]) but not reset with it (with team quotas the order is
/// keyed afresh each pass); reset on a restore. In tests each pass checks it against a walk.
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// Whether it holds every such job (false until the first pass, and after a reset).
    primed: bool,
    ids: BTreeSet<u64>,
    /// Jobs changed since the last pass whose change a store commit took.
    dirty: BTreeSet<u64>,
}

impl Watch {
    /// Notes jobs changed since the last pass (see `dirty`).
    pub(super) fn note(&mut self, ids: &BTreeSet<u64>) {
        if self.primed {
            self.dirty.extend(ids.iter().copied());
        }
    }
}

impl Core {
    /// Whether the timers and dependencies watch `job` (see [`Watch`]).
    fn watched(job: &super::Job) -> bool {
        job.on_deps
            || job.not_before.is_some()
            || (job.state == JobState::Pending && job.spec.deadline_unix.is_some())
    }

    /// Brings the [`Watch`] up to date with the jobs changed since it was.
    fn update_watch(&mut self) {
        let mut w = std::mem::take(&mut self.order_cache.watch);
        if !w.primed {
            w = Watch {
                primed: true,
                ids: self
                    .jobs
                    .values()
                    .filter(|j| Self::watched(j))
                    .map(|j| j.id)
                    .collect(),
                dirty: BTreeSet::new(),
            };
        } else {
            let dirty = std::mem::take(&mut w.dirty);
            for id in dirty.iter().chain(&self.touched) {
                if self.jobs.get(id).is_some_and(Self::watched) {
                    w.ids.insert(*id);
                } else {
                    w.ids.remove(id);
                }
            }
        }
        self.order_cache.watch = w;
    }
}
