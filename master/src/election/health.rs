//! What a master answers on `/health` and tells connecting peers, from its leadership view.
//!
//! Pure functions of [`LeadershipStatus`] and the current time: the HTTP handler serialises
//! [`health`], the agent/framework session handlers call [`admission`] before accepting a
//! registration, [`lease_until_ms`] turns the lease deadline into the core's clock, and
//! [`Parked`] decides what a peer parked with a standby is told and when (the shell only sends
//! and waits).

use std::time::{Duration, Instant};

use gantry_proto::MasterRole;
use serde::Serialize;

use super::LeadershipStatus;

/// The `/health` body: `{"status":"ok","role":"leader"|"standby","leader":..,"epoch":..}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    /// Always `"ok"`: the process is up and serving HTTP (a standby is healthy too).
    pub status: &'static str,
    /// `"leader"` or `"standby"`.
    pub role: &'static str,
    /// The current leader's advertised address, if known.
    pub leader: Option<String>,
    /// The leader's epoch, when this master is the leader.
    pub epoch: Option<u64>,
    /// This master's own advertised address.
    pub advertise: String,
}

/// The `/health` answer for this leadership view at `now`.
pub fn health(status: &LeadershipStatus, now: Instant) -> Health {
    let leads = status.leads_at(now);
    Health {
        status: "ok",
        role: if leads { "leader" } else { "standby" },
        leader: if leads {
            Some(status.advertise.clone())
        } else {
            status.leader.clone().filter(|l| *l != status.advertise)
        },
        epoch: if leads { status.epoch } else { None },
        advertise: status.advertise.clone(),
    }
}

/// What to do with an agent or framework that connects to this master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// This master leads: serve the peer, stamping messages with `epoch`.
    Serve { epoch: u64 },
    /// Not the leader: answer `MasterRole::Standby { leader }` (`None`: no leader known yet)
    /// and park the connection until this master is elected.
    Standby { leader: Option<String> },
}

/// Serve or park, for a peer connecting at `now`.
pub fn admission(status: &LeadershipStatus, now: Instant) -> Admission {
    match (status.leads_at(now), status.epoch) {
        (true, Some(epoch)) => Admission::Serve { epoch },
        _ => Admission::Standby {
            // Never name ourselves as the leader while we are not leading.
            leader: status.leader.clone().filter(|l| *l != status.advertise),
        },
    }
}

/// The lease deadline for the master core ([`crate::state::Input::LeaseUntil`]), in
/// milliseconds since `start` (the core's clock), rounded down so the core stops no later than
/// [`LeadershipStatus::leads_at`]: `None` when leading without a lease (standalone), `Some(0)`
/// when not leading.
pub fn lease_until_ms(status: &LeadershipStatus, start: Instant) -> Option<u64> {
    if !status.is_leader {
        return Some(0);
    }
    status
        .lease_valid_until
        .map(|d| u64::try_from(d.saturating_duration_since(start).as_millis()).unwrap_or(u64::MAX))
}

/// News of another master's election reaches parked peers this long after it is known, plus
/// up to [`NEWS_SPREAD`]: the new leader announces itself to the peers parked with it, so the
/// others hear it spread out instead of adding a herd of messages to its re-registrations.
pub const NEWS_DELAY: Duration = Duration::from_millis(2_000);
/// See [`NEWS_DELAY`].
pub const NEWS_SPREAD: Duration = Duration::from_millis(3_000);

/// What the shell does next for a parked peer ([`Parked::step`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParkedStep {
    /// Send this role to the peer now; after `Leading`, serve it with that epoch.
    Tell(MasterRole),
    /// This master leads and the peer was told: serve it.
    Serve { epoch: u64 },
    /// Say nothing before this time (or a role change): spread news of another leader.
    WaitUntil(Instant),
    /// Nothing to say: wait for the role to change.
    Wait,
}

/// What one peer connected to a standby (or to a master not yet serving) has been told.
#[derive(Debug, Clone, Default)]
pub struct Parked {
    told: Option<MasterRole>,
    news_due: Option<Instant>,
}

impl Parked {
    /// A peer that was told nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// What to do for the peer, given this master's role for peers now (from [`admission`]),
    /// the time, and random bits that place news in the spread window. A peer always hears the
    /// first role at once, and of our own election at once; of a new leader elsewhere after
    /// [`NEWS_DELAY`] + a share of [`NEWS_SPREAD`]; "no leader right now" (between terms) after
    /// it was told something is not worth a message.
    pub fn step(&mut self, role: &MasterRole, now: Instant, random: u64) -> ParkedStep {
        let worth_telling = match (&self.told, role) {
            (None, _) => true,
            (Some(t), r) if t == r => false,
            (Some(_), MasterRole::Standby { leader: None }) => false,
            _ => true,
        };
        if worth_telling && self.told.is_some() && matches!(role, MasterRole::Standby { .. }) {
            let spread_ms = u64::try_from(NEWS_SPREAD.as_millis())
                .unwrap_or(u64::MAX)
                .max(1);
            let due = *self.news_due.get_or_insert_with(|| {
                now + NEWS_DELAY + Duration::from_millis(random % spread_ms)
            });
            if now < due {
                return ParkedStep::WaitUntil(due);
            }
        }
        self.news_due = None;
        if worth_telling {
            self.told = Some(role.clone());
            return ParkedStep::Tell(role.clone());
        }
        match role {
            MasterRole::Leading { epoch } => ParkedStep::Serve { epoch: *epoch },
            MasterRole::Standby { .. } => ParkedStep::Wait,
        }
    }
}

/// The role a peer hears for an admission decision.
pub fn role_for(admission: &Admission) -> MasterRole {
    match admission {
        Admission::Serve { epoch } => MasterRole::Leading { epoch: *epoch },
        Admission::Standby { leader } => MasterRole::Standby {
            leader: leader.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(is_leader: bool, epoch: Option<u64>, leader: Option<&str>) -> LeadershipStatus {
        LeadershipStatus {
            is_leader,
            epoch,
            leader: leader.map(str::to_string),
            advertise: "m1:5050".into(),
            lease_valid_until: None,
        }
    }

    #[test]
    fn leader_serves_and_reports_epoch() {
        let now = Instant::now();
        let s = st(true, Some(42), Some("m1:5050"));
        assert_eq!(admission(&s, now), Admission::Serve { epoch: 42 });
        let h = serde_json::to_value(health(&s, now)).unwrap();
        assert_eq!(h["role"], "leader");
        assert_eq!(h["epoch"], 42);
    }

    #[test]
    fn standby_names_the_leader_never_itself() {
        let now = Instant::now();
        let s = st(false, None, Some("m2:5050"));
        assert_eq!(
            admission(&s, now),
            Admission::Standby {
                leader: Some("m2:5050".into())
            }
        );
        assert_eq!(health(&s, now).role, "standby");
        let stale = st(false, None, Some("m1:5050"));
        assert_eq!(admission(&stale, now), Admission::Standby { leader: None });
    }

    #[test]
    fn a_leader_past_its_lease_deadline_is_a_standby_even_before_lost() {
        let t0 = Instant::now();
        let mut s = st(true, Some(7), Some("m1:5050"));
        s.lease_valid_until = Some(t0 + std::time::Duration::from_secs(1));
        assert_eq!(admission(&s, t0), Admission::Serve { epoch: 7 });
        let late = t0 + std::time::Duration::from_secs(1);
        assert_eq!(admission(&s, late), Admission::Standby { leader: None });
        let h = health(&s, late);
        assert_eq!(h.role, "standby");
        assert_eq!(h.epoch, None);
    }

    fn standby(leader: Option<&str>) -> MasterRole {
        MasterRole::Standby {
            leader: leader.map(str::to_string),
        }
    }

    #[test]
    fn a_parked_peer_hears_the_first_role_and_our_election_at_once() {
        let t0 = Instant::now();
        let mut p = Parked::new();
        let first = standby(None);
        assert_eq!(p.step(&first, t0, 7), ParkedStep::Tell(first.clone()));
        assert_eq!(p.step(&first, t0, 7), ParkedStep::Wait, "told already");
        let leading = MasterRole::Leading { epoch: 9 };
        assert_eq!(p.step(&leading, t0, 7), ParkedStep::Tell(leading.clone()));
        assert_eq!(p.step(&leading, t0, 7), ParkedStep::Serve { epoch: 9 });
    }

    #[test]
    fn news_of_another_leader_is_spread_out_and_no_leader_is_not_news() {
        let t0 = Instant::now();
        let mut p = Parked::new();
        assert_eq!(
            p.step(&standby(Some("m2:5050")), t0, 0),
            ParkedStep::Tell(standby(Some("m2:5050")))
        );
        // Between terms: not worth a message.
        assert_eq!(p.step(&standby(None), t0, 0), ParkedStep::Wait);
        // A new leader elsewhere: told within the spread window, not at once.
        let m3 = standby(Some("m3:5050"));
        let due = t0 + NEWS_DELAY + Duration::from_millis(1_234);
        assert_eq!(p.step(&m3, t0, 1_234), ParkedStep::WaitUntil(due));
        // The due time is kept across wake-ups (other random bits do not move it).
        let early = t0 + Duration::from_millis(100);
        assert_eq!(p.step(&m3, early, 99), ParkedStep::WaitUntil(due));
        assert_eq!(p.step(&m3, due, 99), ParkedStep::Tell(m3.clone()));
        assert_eq!(p.step(&m3, due, 99), ParkedStep::Wait);
        // The random bits never place news past the window.
        let mut q = Parked::new();
        q.step(&standby(None), t0, 0);
        let ParkedStep::WaitUntil(at) = q.step(&m3, t0, u64::MAX) else {
            panic!("news is delayed")
        };
        assert!(at < t0 + NEWS_DELAY + NEWS_SPREAD);
    }

    #[test]
    fn our_election_cuts_a_pending_delay_short() {
        let t0 = Instant::now();
        let mut p = Parked::new();
        p.step(&standby(None), t0, 0);
        assert!(matches!(
            p.step(&standby(Some("m2:5050")), t0, 500),
            ParkedStep::WaitUntil(_)
        ));
        let leading = MasterRole::Leading { epoch: 3 };
        assert_eq!(p.step(&leading, t0, 500), ParkedStep::Tell(leading.clone()));
        // A later standby role gets a fresh delay, not the stale one.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(
            p.step(&standby(Some("m4:5050")), later, 0),
            ParkedStep::WaitUntil(later + NEWS_DELAY)
        );
    }

    #[test]
    fn the_core_lease_is_in_core_milliseconds_and_lapsed_when_not_leading() {
        let start = Instant::now();
        let mut s = st(true, Some(1), Some("m1:5050"));
        assert_eq!(lease_until_ms(&s, start), None, "standalone: no lease");
        s.lease_valid_until = Some(start + Duration::from_micros(2_500_900));
        assert_eq!(lease_until_ms(&s, start), Some(2_500), "rounded down");
        s.is_leader = false;
        assert_eq!(lease_until_ms(&s, start), Some(0));
    }
}
