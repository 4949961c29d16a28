//! What a master answers on `/health` and tells connecting peers, from its leadership view.
//!
//! Pure functions of [`LeadershipStatus`] and the current time: the HTTP handler serialises
//! [`health`], and the agent/framework session handlers call [`admission`] before accepting a
//! registration.

use std::time::Instant;

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
}
