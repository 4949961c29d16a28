//! GPU health policy (pure): which NVML events make a GPU unhealthy, and how it comes back.
//!
//! * A critical XID error or a double-bit ECC error marks the GPU unhealthy.
//! * Application-caused XIDs — 13 (graphics engine exception), 31 (MMU fault), 43 (channel
//!   stopped), 45 (preemptive cleanup), 68 (video processor exception), 109 (context switch
//!   timeout) — are the program's fault, not the GPU's, and are ignored.
//! * An XID NVML reports as unknown (999) counts as critical.
//! * An unhealthy GPU comes back when an operator clears it ([`HealthTracker::clear`]) or, when
//!   a recovery delay is configured, after no new fault for that long *and* a recovery check (an
//!   NVML query of the device by the caller) passes ([`HealthTracker::recovery_due`] then
//!   [`HealthTracker::recovery_checked`]).
//!
//! Time is an argument (`now: Instant`); nothing here reads a clock or does I/O.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// XIDs caused by applications, not by the GPU.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// What NVML reported about a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `nvmlEventTypeXidCriticalError` with this XID.
    Xid(u64),
    /// An XID NVML could not identify.
    XidUnknown,
    /// `nvmlEventTypeDoubleBitEccError`.
    DoubleBitEcc,
}

impl FaultKind {
    /// Whether this fault makes the GPU unhealthy.
    pub fn is_critical(self) -> bool {
        match self {
            FaultKind::Xid(x) => !APPLICATION_XIDS.contains(&x),
            FaultKind::XidUnknown | FaultKind::DoubleBitEcc => true,
        }
    }

    /// A human-readable reason.
    pub fn reason(self) -> String {
        match self {
            FaultKind::Xid(x) => format!("critical XID {x}"),
            FaultKind::XidUnknown => "critical XID (unknown number)".to_string(),
            FaultKind::DoubleBitEcc => "double-bit ECC error".to_string(),
        }
    }
}

/// A fault on one GPU, as the NVML watcher reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFault {
    pub uuid: String,
    pub kind: FaultKind,
}

/// A change of a GPU's health to report (withdraw/restore offers, notify tasks, tell the master).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthChange {
    pub uuid: String,
    pub healthy: bool,
    pub reason: String,
}

#[derive(Debug, Clone)]
struct Unhealthy {
    reason: String,
    last_fault: Instant,
}

/// Tracks which GPUs are unhealthy.
#[derive(Debug, Clone, Default)]
pub struct HealthTracker {
    /// `None`: only an operator brings a GPU back.
    recovery_after: Option<Duration>,
    unhealthy: BTreeMap<String, Unhealthy>,
}

impl HealthTracker {
    /// A tracker; with `recovery_after`, GPUs become eligible for a recovery check that long after
    /// their last fault.
    pub fn new(recovery_after: Option<Duration>) -> Self {
        Self {
            recovery_after,
            unhealthy: BTreeMap::new(),
        }
    }

    /// Whether `uuid` is healthy.
    pub fn is_healthy(&self, uuid: &str) -> bool {
        !self.unhealthy.contains_key(uuid)
    }

    /// The unhealthy GPUs with their reasons.
    pub fn unhealthy(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.unhealthy
            .iter()
            .map(|(u, h)| (u.as_str(), h.reason.as_str()))
    }

    /// Marks a GPU unhealthy (e.g. restored from a checkpoint).
    pub fn mark_unhealthy(
        &mut self,
        uuid: &str,
        reason: &str,
        now: Instant,
    ) -> Option<HealthChange> {
        let fresh = !self.unhealthy.contains_key(uuid);
        self.unhealthy.insert(
            uuid.to_string(),
            Unhealthy {
                reason: reason.to_string(),
                last_fault: now,
            },
        );
        fresh.then(|| HealthChange {
            uuid: uuid.to_string(),
            healthy: false,
            reason: reason.to_string(),
        })
    }

    /// Applies a fault; returns a change when a healthy GPU becomes unhealthy. Application XIDs
    /// return `None` and change nothing; a new fault on an unhealthy GPU restarts its recovery
    /// delay.
    pub fn on_fault(&mut self, fault: &GpuFault, now: Instant) -> Option<HealthChange> {
        if !fault.kind.is_critical() {
            return None;
        }
        self.mark_unhealthy(&fault.uuid, &fault.kind.reason(), now)
    }

    /// An operator cleared the GPU.
    pub fn clear(&mut self, uuid: &str) -> Option<HealthChange> {
        self.unhealthy.remove(uuid).map(|_| HealthChange {
            uuid: uuid.to_string(),
            healthy: true,
            reason: "cleared by operator".to_string(),
        })
    }

    /// GPUs whose recovery check should run now.
    pub fn recovery_due(&self, now: Instant) -> Vec<String> {
        let Some(after) = self.recovery_after else {
            return Vec::new();
        };
        self.unhealthy
            .iter()
            .filter(|(_, h)| now.saturating_duration_since(h.last_fault) >= after)
            .map(|(u, _)| u.clone())
            .collect()
    }

    /// When the next recovery check falls due, among the GPUs `skip` does not name (those being
    /// checked); `None` without recovery checks or unhealthy GPUs.
    pub fn next_recovery(&self, skip: impl Fn(&str) -> bool) -> Option<Instant> {
        let after = self.recovery_after?;
        self.unhealthy
            .iter()
            .filter(|(u, _)| !skip(u))
            .map(|(_, h)| h.last_fault + after)
            .min()
    }

    /// The result of a recovery check: a pass brings the GPU back (if no fault arrived since it
    /// became due); a failure restarts the delay.
    pub fn recovery_checked(
        &mut self,
        uuid: &str,
        passed: bool,
        now: Instant,
    ) -> Option<HealthChange> {
        let after = self.recovery_after?;
        let h = self.unhealthy.get_mut(uuid)?;
        if now.saturating_duration_since(h.last_fault) < after {
            return None;
        }
        if !passed {
            h.last_fault = now;
            return None;
        }
        self.unhealthy.remove(uuid);
        Some(HealthChange {
            uuid: uuid.to_string(),
            healthy: true,
            reason: "recovery check passed".to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(uuid: &str, kind: FaultKind) -> GpuFault {
        GpuFault {
            uuid: uuid.to_string(),
            kind,
        }
    }

    #[test]
    fn application_xids_are_ignored() {
        let mut t = HealthTracker::new(None);
        let now = Instant::now();
        for x in APPLICATION_XIDS {
            assert_eq!(t.on_fault(&fault("g", FaultKind::Xid(x)), now), None);
        }
        assert!(t.is_healthy("g"));
    }

    #[test]
    fn critical_faults_mark_unhealthy_once() {
        let mut t = HealthTracker::new(None);
        let now = Instant::now();
        let c = t.on_fault(&fault("g", FaultKind::Xid(79)), now).unwrap();
        assert!(!c.healthy);
        assert_eq!(c.reason, "critical XID 79");
        assert_eq!(t.on_fault(&fault("g", FaultKind::DoubleBitEcc), now), None);
        assert!(!t.is_healthy("g"));
        assert!(t
            .on_fault(&fault("h", FaultKind::XidUnknown), now)
            .is_some());
        assert_eq!(t.unhealthy().count(), 2);
    }

    #[test]
    fn operator_clear_brings_back() {
        let mut t = HealthTracker::new(None);
        let now = Instant::now();
        t.on_fault(&fault("g", FaultKind::DoubleBitEcc), now);
        assert!(t
            .recovery_due(now + Duration::from_secs(1_000_000))
            .is_empty());
        assert!(t.clear("g").unwrap().healthy);
        assert!(t.is_healthy("g"));
        assert_eq!(t.clear("g"), None);
    }

    #[test]
    fn recovery_check_after_quiet_period() {
        let d = Duration::from_secs(60);
        let mut t = HealthTracker::new(Some(d));
        let t0 = Instant::now();
        t.on_fault(&fault("g", FaultKind::Xid(48)), t0);
        assert!(t.recovery_due(t0 + Duration::from_secs(59)).is_empty());
        // A new fault restarts the clock.
        t.on_fault(
            &fault("g", FaultKind::Xid(48)),
            t0 + Duration::from_secs(30),
        );
        assert!(t.recovery_due(t0 + d).is_empty());
        let t1 = t0 + Duration::from_secs(90);
        assert_eq!(t.recovery_due(t1), vec!["g".to_string()]);
        // A failed check restarts it too.
        assert_eq!(t.recovery_checked("g", false, t1), None);
        assert!(t.recovery_due(t1 + Duration::from_secs(1)).is_empty());
        let t2 = t1 + d;
        assert!(t.recovery_checked("g", true, t2).unwrap().healthy);
        assert!(t.is_healthy("g"));
    }
}
