//! The core's clock: [`AgentCore::next_deadline`] (every timed rule's term: the runtime sleeps
//! until it or the next input) and the `Tick` that acts on it — heartbeats, kill escalation, the
//! pool's trim, usage samples and what they report, disk passes, GPU recovery checks, sandbox
//! collection, probes of re-adopted tasks, the operator files' polls, MPS daemons, due updates.

use gantry_proto::codec;
use gantry_proto::*;

use super::{AgentCore, Effect, ADOPTED_PROBE_MS, FILE_POLL_MS};

impl AgentCore {
    pub(super) fn tick(&mut self, now: u64) {
        self.escalate_kills(now);
        let idle = self.pool.trim(now);
        if !idle.is_empty() {
            self.emit(Effect::RemoveCgroups(idle));
        }
        self.adopted.retain(|id| {
            self.ckpt
                .tasks
                .get(id)
                .is_some_and(|t| !t.state.is_terminal())
        });
        if self.registered && now.saturating_sub(self.last_heartbeat) >= self.heartbeat_every {
            self.last_heartbeat = now;
            self.send(AgentToMaster::Heartbeat);
        }
        self.sample_if_due(now);
        self.measure_disk_if_due(now);
        self.recovery_checks_due(now);
        self.collect_garbage(now);
        self.probe_adopted_if_due(now);
        self.poll_files_if_due(now);
        self.mps_ensure(now);
        self.flush_updates(now);
    }

    /// Every [`FILE_POLL_MS`]: the termination notice (while registered: it is told to the
    /// master) and, on a GPU agent, the operator's clear requests.
    pub(super) fn poll_files_if_due(&mut self, now: u64) {
        if self.registered && now.saturating_sub(self.last_notice_poll) >= FILE_POLL_MS {
            self.last_notice_poll = now;
            self.emit(Effect::ReadTerminationNotice);
        }
        if self.config.gpu_agent && now.saturating_sub(self.last_clear_poll) >= FILE_POLL_MS {
            self.last_clear_poll = now;
            self.emit(Effect::ReadClearRequests);
        }
    }

    /// The earliest time (Unix ms) at which [`Input::Tick`](super::Input::Tick) has something
    /// to do, if any: the runtime sleeps until then or the next input, whichever comes first.
    /// A time at or before `now` means at once. Every timed rule of the core has its term here
    /// (the tests check that a tick before the deadline does nothing and one at it moves the
    /// deadline on).
    pub fn next_deadline(&self, now: u64) -> Option<u64> {
        let mut at: Option<u64> = None;
        let mut due = |t: Option<u64>| {
            if let Some(t) = t {
                at = Some(at.map_or(t, |a| a.min(t)));
            }
        };
        if self.registered {
            due(Some(self.last_heartbeat + self.heartbeat_every));
            due(Some(self.last_notice_poll + FILE_POLL_MS));
            if !self.sampling {
                due(Some(
                    self.last_sample + self.config.usage_interval.as_millis() as u64,
                ));
            }
            if self.connected {
                due(self.ckpt.updates.next_due(now));
            }
        }
        if self.config.gpu_agent {
            due(Some(self.last_clear_poll + FILE_POLL_MS));
            due(self
                .health
                .next_recovery(|u| self.checking.contains(u))
                .map(|i| {
                    self.epoch_ms + i.saturating_duration_since(self.epoch).as_millis() as u64
                }));
        }
        due(self.kill_deadline());
        due(self.pool.next_deadline());
        due(self.disk_deadline());
        if !self.gc_busy {
            let next = self
                .config
                .gc
                .next_due(&self.gc_queue, self.disk_used)
                .map(|t| t.max(self.last_gc + 1000));
            due(Some(next.map_or(self.last_gc + 5000, |t| {
                t.min(self.last_gc + 5000)
            })));
        }
        if !self.probing_adopted && !self.adopted_live().is_empty() {
            due(Some(self.last_adopted_probe + ADOPTED_PROBE_MS));
        }
        due(self.mps_deadline(now));
        at
    }

    /// Sandboxes due for collection ([`gc`]), at most one pass a second; a pass with nothing
    /// to remove still measures the disk every few seconds.
    pub(super) fn collect_garbage(&mut self, now: u64) {
        let since = now.saturating_sub(self.last_gc);
        if self.gc_busy || since < 1000 {
            return;
        }
        let mut due = self.config.gc.due(&mut self.gc_queue, now, self.disk_used);
        // A task id launched again meanwhile owns its directories.
        due.retain(|t| !self.ckpt.tasks.contains_key(t));
        if due.is_empty() && since < 5000 {
            return;
        }
        self.gc_busy = true;
        self.last_gc = now;
        self.emit(Effect::CollectGarbage(due));
    }

    /// Every `--usage-interval`: sample GPUs and task cgroups.
    pub(super) fn sample_if_due(&mut self, now: u64) {
        if self.sampling
            || !self.registered
            || now.saturating_sub(self.last_sample) < self.config.usage_interval.as_millis() as u64
        {
            return;
        }
        let snapshot: Vec<(TaskId, i32, Vec<String>)> = self
            .ckpt
            .tasks
            .iter()
            .filter(|(id, t)| !t.state.is_terminal() && !self.settling.contains(id))
            .filter_map(|(id, t)| Some((*id, t.launched?.task_pgid, t.gpus.clone())))
            .collect();
        if snapshot.is_empty() && !self.config.gpu_agent {
            self.last_sample = now;
            // Nothing to sample: /metrics drops the tasks that ended.
            self.emit(Effect::PublishMetrics(Vec::new()));
            return;
        }
        self.sampling = true;
        self.emit(Effect::Sample(snapshot));
    }

    pub(super) fn sampled(
        &mut self,
        tasks: Vec<(TaskId, TaskUsage)>,
        gpus: Vec<GpuSample>,
        now: u64,
    ) {
        self.sampling = false;
        self.last_sample = now;
        // Tasks that ended while sampling ran are not reported.
        let tasks: Vec<(TaskId, TaskUsage)> = tasks
            .into_iter()
            .filter(|(id, _)| {
                self.ckpt
                    .tasks
                    .get(id)
                    .is_some_and(|t| !t.state.is_terminal())
            })
            .collect();
        let tasks = self.gpu_memory_check(tasks, now);
        self.last_gpu_samples = gpus.clone();
        self.emit(Effect::PublishMetrics(tasks.clone()));
        if !tasks.is_empty() || !gpus.is_empty() {
            // Many tasks: as many messages as the frame limit needs.
            let split = codec::split_batches(tasks, |tasks| AgentToMaster::Usage {
                tasks,
                gpus: gpus.clone(),
            });
            if !split.oversized.is_empty() {
                tracing::warn!(
                    n = split.oversized.len(),
                    "usage samples too large to send; dropped"
                );
            }
            for msg in split.batches {
                self.send_registered(msg);
            }
        }
    }
}
