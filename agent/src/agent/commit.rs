//! The commit pipeline: each batch's records are written to the log as one frame, and what
//! the batch produced (messages to the master, launches, cgroup releases) is held until a sync
//! of the log covers that frame. The sync runs off the loop, one at a time, each covering every
//! frame written before it started.

use super::*;

/// What committed batches produced, held until a sync of the log covers their records: the
/// messages to the master, the launches, the settled tasks' cgroups to release.
#[derive(Default)]
pub(super) struct Held {
    pub(super) outbox: Vec<AgentToMaster>,
    pub(super) launches: Vec<PendingLaunch>,
    pub(super) releases: Vec<(Option<TaskCgroup>, bool)>,
    /// A batch asked for a sync ([`Commit::Sync`]).
    pub(super) due: bool,
}

impl Agent {
    /// Commits the batch as the core decides ([`AgentCore::end_batch`]): the changed task
    /// records and queued changes are written to the log as one frame; the messages, launches
    /// and cgroup releases they protect are held until a sync of the log covers that frame.
    /// The sync runs off the loop (the commit pipeline, [`wal::SyncJob`]): one at a time, each
    /// covering every frame written before it started, so while one runs the loop goes on and
    /// the batches handled meanwhile share the next. A batch that sends and starts nothing
    /// (acknowledgements) is only written: a later sync makes it durable ([`wal::Wal::write`]).
    /// Starts a background compaction when the log has grown past [`wal::COMPACT_BYTES`].
    pub(super) fn commit(&mut self) -> anyhow::Result<()> {
        let (effects, commit) = self.core.end_batch(unix_ms());
        self.perform(effects)?;
        let started = Instant::now();
        // While a sync is due (waiting for the running one or for the commit gap), the
        // records stay in memory and go out as one frame just before that sync starts
        // ([`Agent::start_sync`]): nothing they announce leaves before it anyway. Otherwise
        // they are written now (acknowledgements: the page cache keeps them through the
        // agent's own crash).
        let records = if self.waiting.due {
            0
        } else {
            self.wal
                .write()
                .context("writing the agent's write-ahead log")?
        };
        // Whatever leaves waits for a sync, even from a batch that asked for none: it must not
        // overtake what earlier batches hold back.
        let leaving =
            !self.outbox.is_empty() || !self.launches.is_empty() || !self.releases.is_empty();
        tracing::debug!(
            records,
            sync = commit == Commit::Sync,
            sent = self.outbox.len(),
            launches = self.launches.len(),
            write_us = started.elapsed().as_micros() as u64,
            "committed"
        );
        if commit == Commit::Sync || leaving {
            self.waiting.outbox.append(&mut self.outbox);
            self.waiting.launches.append(&mut self.launches);
            self.waiting.releases.append(&mut self.releases);
            self.waiting.due = true;
            self.start_sync()?;
        }
        if !self.compacting && self.wal.size() > self.config.wal_compact_bytes {
            // The snapshot holds the state as of now: every record of it goes to the old log.
            self.wal
                .write()
                .context("writing the agent's write-ahead log")?;
            let gen = self.wal.rotate().context("starting a new log")?;
            let mut snapshot = self.core.checkpoint().clone();
            snapshot.log_gen = gen;
            self.core.checkpoint_mut().log_gen = gen;
            self.compacting = true;
            let dir = self.config.work_dir.clone();
            let tx = self.tx.clone();
            tokio::task::spawn_blocking(move || {
                let result = wal::write_snapshot(&dir, &snapshot).map_err(|e| e.to_string());
                tx.resource(Resource::Compacted(result));
            });
        }
        Ok(())
    }

    /// Starts a sync of the log for the held batches, unless one runs (its end starts the
    /// next), none is due, or the last one started less than [`AgentConfig::commit_gap`] ago
    /// (then the loop wakes at [`Agent::sync_at`] and starts it: the batches handled until then
    /// share it).
    pub(super) fn start_sync(&mut self) -> anyhow::Result<()> {
        if self.syncing.is_some() || !self.waiting.due {
            return Ok(());
        }
        let now = Instant::now();
        if let Some(at) = sync_start_at(self.sync_started, self.config.commit_gap, now) {
            self.sync_at = Some(at);
            return Ok(());
        }
        self.sync_at = None;
        self.sync_started = Some(now);
        // The records of the batches that waited for this sync, as one frame.
        self.wal
            .write()
            .context("writing the agent's write-ahead log")?;
        let job = self
            .wal
            .sync_job()
            .context("syncing the agent's write-ahead log")?;
        self.syncing = Some(std::mem::take(&mut self.waiting));
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || {
            tx.resource(Resource::Synced(job.run().map_err(|e| e.to_string())));
        });
        Ok(())
    }

    /// The loop's wake-up for a sync that waits for the commit gap: starts it if it is time.
    pub(super) fn sync_due(&mut self) -> anyhow::Result<()> {
        match self.sync_at {
            Some(at) if at <= Instant::now() => self.start_sync(),
            _ => Ok(()),
        }
    }

    /// What the synced batches held back leaves: the messages (in order, to the current
    /// connection), the launches, the settled tasks' cgroups (one blocking job: each empty one
    /// goes back to the pool or is removed; one found busy is removed).
    pub(super) fn release(&mut self, held: Held) {
        if let Some(m) = &self.master {
            for msg in held.outbox {
                let _ = m.send(msg);
            }
        }
        for launch in held.launches {
            self.launches_started += 1;
            tokio::spawn(launch);
        }
        if !held.releases.is_empty() {
            let releases = held.releases;
            let tx = self.tx.clone();
            let gate = self.pool_gate.clone();
            tokio::task::spawn_blocking(move || {
                for (cg, recycle) in releases {
                    release_cgroup(cg, recycle, &gate, &tx);
                }
            });
        }
    }

    /// A connection ended or a new one began: messages queued for the previous one are dropped
    /// (the core sends its unacknowledged updates again after `Register`).
    pub(super) fn drop_queued_messages(&mut self) {
        self.outbox.clear();
        self.waiting.outbox.clear();
        if let Some(held) = &mut self.syncing {
            held.outbox.clear();
        }
    }

    /// At shutdown: the log synced in place; what it held back is dropped (a restarted agent
    /// sends the updates again and gives up launches that never claimed their record).
    pub(super) fn finish_commits(&mut self) -> anyhow::Result<()> {
        self.wal
            .commit()
            .context("syncing the agent's write-ahead log")?;
        self.syncing = None;
        self.waiting = Held::default();
        self.sync_at = None;
        Ok(())
    }
}

/// When a due sync of the log must wait for the commit gap: the time it may start (`gap`
/// after the last one started), or `None` when it may start `now`.
pub(super) fn sync_start_at(
    last_start: Option<Instant>,
    gap: Duration,
    now: Instant,
) -> Option<Instant> {
    let at = last_start? + gap;
    (at > now).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_waits_for_the_gap_after_the_last_start_only() {
        let t0 = Instant::now();
        let gap = Duration::from_millis(5);
        // The first sync of a run does not wait.
        assert_eq!(sync_start_at(None, gap, t0), None);
        // One due before the gap has passed starts when it has.
        assert_eq!(
            sync_start_at(Some(t0), gap, t0 + Duration::from_millis(2)),
            Some(t0 + gap)
        );
        // At the gap or past it: at once.
        assert_eq!(sync_start_at(Some(t0), gap, t0 + gap), None);
        assert_eq!(sync_start_at(Some(t0), gap, t0 + 2 * gap), None);
        // No gap: never waits.
        assert_eq!(sync_start_at(Some(t0), Duration::ZERO, t0), None);
    }
}
