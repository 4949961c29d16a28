//! What the API shows: job views, queue depth, GPU time per team.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gantry_sdk::protocol::*;

use super::{Core, Job};
use crate::model::{JobState, JobView, MemberView, Priority};

impl Core {
    /// Every job, for the API.
    pub fn views(&self, now: Instant) -> Vec<JobView> {
        self.jobs.values().map(|j| self.view_of(j, now)).collect()
    }

    /// One job, for the API.
    pub fn view(&self, id: u64, now: Instant) -> Option<JobView> {
        self.jobs.get(&id).map(|j| self.view_of(j, now))
    }

    fn view_of(&self, j: &Job, now: Instant) -> JobView {
        let waiting = if j.state == JobState::Pending && !j.on_deps {
            now.saturating_duration_since(j.waiting_since)
        } else {
            Duration::ZERO
        };
        let waiting_on: Vec<u64> = if j.state == JobState::Pending {
            j.spec
                .after
                .iter()
                .copied()
                .filter(|d| {
                    self.jobs
                        .get(d)
                        .is_none_or(|dj| dj.state != JobState::Finished)
                })
                .collect()
        } else {
            Vec::new()
        };
        let message = if j.on_deps && !waiting_on.is_empty() {
            let ids: Vec<String> = waiting_on.iter().map(u64::to_string).collect();
            format!("waiting on dependencies: {}", ids.join(", "))
        } else {
            j.message.clone()
        };
        let mut agents: Vec<String> = j.members.values().map(|m| m.hostname.clone()).collect();
        agents.sort();
        agents.dedup();
        JobView {
            id: j.id,
            name: j.spec.name.clone(),
            team: j.spec.team.clone(),
            priority: j.spec.priority,
            effective_priority: self.effective(j, now),
            state: j.state,
            workers: j.running_members(),
            min_workers: j.spec.min_workers,
            max_workers: j.spec.max_workers,
            gpus_per_worker: j.spec.gpus,
            preemptions: j.preemptions,
            waited_secs: (j.waited + waiting).as_secs_f64(),
            deadline_unix: j.spec.deadline_unix,
            agents,
            members: j
                .members
                .iter()
                .map(|(i, m)| MemberView {
                    index: *i,
                    task: format!("{}/{i}", j.spec.name),
                    task_id: m.task_id.to_string(),
                    agent: m.hostname.clone(),
                    gpus: m.gpus.clone(),
                    state: m.state.as_str().to_string(),
                })
                .collect(),
            message,
            age_secs: now.saturating_duration_since(j.submitted).as_secs_f64(),
            after: j.spec.after.clone(),
            waiting_on,
            user: j.user.clone(),
            attempts: j.attempts,
        }
    }

    /// Pending jobs per (team, priority).
    pub fn depth(&self) -> BTreeMap<(String, Priority), u64> {
        let mut d = BTreeMap::new();
        for j in self.jobs.values().filter(|j| j.state == JobState::Pending) {
            *d.entry((j.spec.team.clone(), j.spec.priority)).or_default() += 1;
        }
        d
    }

    /// GPU-seconds per team so far, running members included.
    pub fn gpu_secs(&self, now: Instant) -> BTreeMap<String, f64> {
        let mut out = self.stats.gpu_secs.clone();
        for j in self.jobs.values() {
            for m in j.members.values().filter(|m| m.state == TaskState::Running) {
                *out.entry(j.spec.team.clone()).or_default() +=
                    m.gpus.len() as f64 * now.saturating_duration_since(m.started).as_secs_f64();
            }
        }
        out
    }
}
