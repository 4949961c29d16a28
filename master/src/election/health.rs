//! What a master answers on `/health` and how it redirects peers, from its leadership view.
//!
//! Pure functions of [`LeadershipStatus`]: the HTTP handler serialises [`health`], and the
//! agent/framework session handlers call [`redirect`] before accepting a registration.

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

/// The `/health` answer for this leadership view.
pub fn health(status: &LeadershipStatus) -> Health {
    Health {
        status: "ok",
        role: if status.is_leader {
            "leader"
        } else {
            "standby"
        },
        leader: status.leader.clone(),
        epoch: status.epoch,
        advertise: status.advertise.clone(),
    }
}

/// What to do with an agent or framework that connects to this master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// This master leads: serve the peer, stamping messages with `epoch`.
    Serve { epoch: u64 },
    /// Not the leader: answer `NotLeader { leader }` (`None`: no leader known yet, retry later)
    /// and close the connection.
    Redirect { leader: Option<String> },
}

/// Serve or redirect, for a peer connecting now.
pub fn redirect(status: &LeadershipStatus) -> Admission {
    match (status.is_leader, status.epoch) {
        (true, Some(epoch)) => Admission::Serve { epoch },
        _ => Admission::Redirect {
            // Never redirect a peer to ourselves while we are not leading.
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
        }
    }

    #[test]
    fn leader_serves_and_reports_epoch() {
        let s = st(true, Some(42), Some("m1:5050"));
        assert_eq!(redirect(&s), Admission::Serve { epoch: 42 });
        let h = serde_json::to_value(health(&s)).unwrap();
        assert_eq!(h["role"], "leader");
        assert_eq!(h["epoch"], 42);
    }

    #[test]
    fn standby_redirects_to_the_leader_never_to_itself() {
        let s = st(false, None, Some("m2:5050"));
        assert_eq!(
            redirect(&s),
            Admission::Redirect {
                leader: Some("m2:5050".into())
            }
        );
        assert_eq!(health(&s).role, "standby");
        let stale = st(false, None, Some("m1:5050"));
        assert_eq!(redirect(&stale), Admission::Redirect { leader: None });
    }
}
