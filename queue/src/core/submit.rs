//! Submissions: jobs and arrays added with their pass ([`Core::submit`]) or without one
//! ([`Core::enqueue_as`], the API's way: the runtime runs the owed pass once per group commit,
//! [`Core::pass_if_due`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{Action, Core, Job, JobSpec, JobState};

impl Core {
    /// Adds a job; returns its id.
    pub fn submit(&mut self, spec: JobSpec, now: Instant) -> (u64, Vec<Action>) {
        self.submit_as(spec, String::new(), now)
    }

    /// Adds a job submitted by `user`; returns its id.
    pub fn submit_as(&mut self, spec: JobSpec, user: String, now: Instant) -> (u64, Vec<Action>) {
        let id = self.insert(spec, user, now);
        let mut out = Vec::new();
        if self.suppressed {
            self.suppressed = false;
            out.push(Action::Revive);
        }
        out.extend(self.pass(now));
        (id, out)
    }

    /// Adds an array (`spec.array`): one job per index, named `NAME[INDEX]`, with the index in
    /// `GANTRY_QUEUE_ARRAY_INDEX`; returns their ids (the first is the array's id). A spec
    /// without `array` adds one job.
    pub fn submit_array(
        &mut self,
        spec: JobSpec,
        user: String,
        now: Instant,
    ) -> Result<(Vec<u64>, Vec<Action>), String> {
        let Some(indexes) = spec.array_indexes()? else {
            let (id, out) = self.submit_as(spec, user, now);
            return Ok((vec![id], out));
        };
        let ids = self.insert_array(spec, indexes, user, now);
        let mut out = Vec::new();
        if self.suppressed {
            self.suppressed = false;
            out.push(Action::Revive);
        }
        out.extend(self.pass(now));
        Ok((ids, out))
    }

    /// Adds a job submitted by `user` without running a pass: the next
    /// [`Core::pass_if_due`] (or any pass) considers it. The runtime submits so, and runs one
    /// pass per group commit, so a burst of submissions costs one pass, not one each.
    pub fn enqueue_as(&mut self, spec: JobSpec, user: String, now: Instant) -> u64 {
        self.pass_due = true;
        self.insert(spec, user, now)
    }

    /// [`Core::submit_array`] without the pass (see [`Core::enqueue_as`]).
    pub fn enqueue_array(
        &mut self,
        spec: JobSpec,
        user: String,
        now: Instant,
    ) -> Result<Vec<u64>, String> {
        let Some(indexes) = spec.array_indexes()? else {
            return Ok(vec![self.enqueue_as(spec, user, now)]);
        };
        self.pass_due = true;
        Ok(self.insert_array(spec, indexes, user, now))
    }

    /// The pass owed to jobs added by [`Core::enqueue_as`] since the last pass, if any
    /// (with a `Revive` first when offers were suppressed).
    pub fn pass_if_due(&mut self, now: Instant) -> Vec<Action> {
        if !self.pass_due {
            return Vec::new();
        }
        let mut out = Vec::new();
        if self.suppressed {
            self.suppressed = false;
            out.push(Action::Revive);
        }
        out.extend(self.pass(now));
        out
    }

    fn insert_array(
        &mut self,
        spec: JobSpec,
        indexes: Vec<u32>,
        user: String,
        now: Instant,
    ) -> Vec<u64> {
        let first = self.next_id;
        let mut ids = Vec::with_capacity(indexes.len());
        for i in indexes {
            let mut s = spec.clone();
            s.array = None;
            s.array_job = Some(first);
            s.array_index = Some(i);
            s.name = format!("{}[{i}]", spec.name);
            s.env
                .insert("GANTRY_QUEUE_ARRAY_INDEX".into(), i.to_string());
            ids.push(self.insert(s, user.clone(), now));
        }
        ids
    }

    fn insert(&mut self, spec: JobSpec, user: String, now: Instant) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.touched.insert(id);
        let spec_after_empty = spec.after.is_empty();
        self.jobs.insert(
            id,
            Job {
                id,
                spec,
                state: JobState::Pending,
                submitted: now,
                waiting_since: now,
                waited: Duration::ZERO,
                preemptions: 0,
                preempting: false,
                lost: false,
                members: BTreeMap::new(),
                finished_members: 0,
                next_index: 0,
                message: String::new(),
                on_deps: !spec_after_empty,
                user,
                attempts: 0,
                retries: 0,
                retrying: false,
                not_before: None,
                attempt_started: None,
            },
        );
        id
    }
}
