//! MPS control daemons in the core (`--gpu-sharing mps` on a GPU agent with
//! `nvidia-cuda-mps-control` installed): which GPU's daemon to start when. Every GPU holding a
//! live fractional task gets its daemon (also after an agent restart); a daemon that exited is
//! started again, at most once per [`RESTART_BACKOFF_MS`] (a daemon that keeps dying, or one
//! that cannot start because a daemon of a killed agent still serves its pipe directory, is
//! not restarted in a tight loop). A daemon once started is kept running until the agent
//! stops. The runtime owns the processes ([`crate::gpu::mps`]): it performs
//! [`Effect::StartMps`] and reports [`Input::MpsExited`](super::Input::MpsExited) when one
//! ends (or could not start).

use std::collections::BTreeMap;

use super::{AgentCore, Effect};

/// Least time between two starts of one GPU's daemon.
pub const RESTART_BACKOFF_MS: u64 = 2000;

/// What the core knows of one GPU's daemon.
#[derive(Debug, Clone, Default)]
pub(super) struct MpsDaemon {
    /// Started and not reported exited.
    running: bool,
    /// When it was last started (`None`: never).
    started_ms: Option<u64>,
    /// Starts after the first.
    restarts: u32,
}

/// The daemons the core started, by GPU uuid.
pub(super) type MpsDaemons = BTreeMap<String, MpsDaemon>;

impl AgentCore {
    /// GPUs whose daemon should run: those of live fractional tasks and those started before.
    fn mps_wanted(&self) -> Vec<String> {
        if !self.config.mps {
            return Vec::new();
        }
        let mut wanted: Vec<String> = self.mps.keys().cloned().collect();
        wanted.extend(self.shared_gpus());
        wanted.sort();
        wanted.dedup();
        wanted
    }

    /// Starts the wanted daemons that do not run and are out of their back-off.
    pub(super) fn mps_ensure(&mut self, now: u64) {
        for uuid in self.mps_wanted() {
            let d = self.mps.entry(uuid.clone()).or_default();
            if d.running {
                continue;
            }
            if d.started_ms.is_some_and(|t| now < t + RESTART_BACKOFF_MS) {
                continue;
            }
            if d.started_ms.is_some() {
                d.restarts += 1;
                tracing::warn!(gpu = %uuid, restarts = d.restarts, "MPS control daemon exited; restarting it");
            }
            d.running = true;
            d.started_ms = Some(now);
            self.emit(Effect::StartMps(uuid));
        }
    }

    /// A daemon exited (or could not start).
    pub(super) fn mps_exited(&mut self, uuid: &str, now: u64) {
        if let Some(d) = self.mps.get_mut(uuid) {
            d.running = false;
        }
        self.mps_ensure(now);
    }

    /// When a daemon that does not run may be started again.
    pub(super) fn mps_deadline(&self, now: u64) -> Option<u64> {
        self.mps_wanted()
            .iter()
            .filter_map(|u| match self.mps.get(u) {
                None => Some(now),
                Some(d) if d.running => None,
                Some(d) => Some(d.started_ms.map_or(now, |t| t + RESTART_BACKOFF_MS)),
            })
            .min()
    }

    /// Starts of `uuid`'s daemon after the first (for tests and `/metrics`).
    #[cfg(test)]
    pub(super) fn mps_restarts(&self, uuid: &str) -> Option<u32> {
        self.mps.get(uuid).map(|d| d.restarts)
    }
}
