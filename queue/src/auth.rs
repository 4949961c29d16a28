//! Who may do what (pure): the ACL file, the caller of a request, and the decisions.
//!
//! Without an ACL file the queue runs in **dev mode**: every caller may do everything, as the
//! master without ACLs does (jobs are still recorded with the user a token or certificate
//! names). With one, callers must authenticate (a token from the tokens file, or an
//! `operator:NAME` client certificate of the cluster CA, read as user NAME) and:
//!
//! ```toml
//! # Queue administrators: may cancel any job and shut the queue down.
//! admins = ["root"]
//!
//! [teams.nlp]                       # a declared team; jobs for undeclared teams are refused
//! submit = { alice = "normal", dave = "high" }   # who may submit, up to which priority
//! admins = ["carol"]                # may cancel any of the team's jobs, submit up to critical
//!
//! [teams.cv]
//! submit = { bob = "critical" }
//! ```
//!
//! Everyone authenticated may read the queue (`list`, `show`); users cancel their own jobs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use crate::model::Priority;

/// The ACL file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Acl {
    /// Queue administrators.
    #[serde(default)]
    pub admins: BTreeSet<String>,
    /// The declared teams.
    #[serde(default)]
    pub teams: BTreeMap<String, TeamAcl>,
}

/// One team's rules.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamAcl {
    /// Users who may submit to the team, each up to a priority class.
    #[serde(default)]
    pub submit: BTreeMap<String, Priority>,
    /// The team's administrators.
    #[serde(default)]
    pub admins: BTreeSet<String>,
}

/// Why the ACL file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AclError {
    /// It cannot be read.
    #[error("reading the ACL file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// It does not parse.
    #[error("the ACL file {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// The error.
        source: toml::de::Error,
    },
    /// It declares no team.
    #[error("the ACL file {0} declares no team ([teams.NAME])")]
    NoTeams(String),
}

/// Who calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// An authenticated user.
    User(String),
    /// Nobody authenticated, and why.
    Anonymous(String),
}

impl Caller {
    /// The user's name, empty for anonymous callers.
    pub fn name(&self) -> &str {
        match self {
            Caller::User(n) => n,
            Caller::Anonymous(_) => "",
        }
    }
}

/// Why a request is refused (the API answers 400, 401 or 403 with the text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// A bad request: 400.
    #[error("{0}")]
    BadRequest(String),
    /// Nobody authenticated: 401.
    #[error("authentication required: {0}")]
    Unauthenticated(String),
    /// Not allowed: 403.
    #[error("{0}")]
    Forbidden(String),
}

impl Acl {
    /// Loads and checks an ACL file.
    pub fn load(path: &Path) -> Result<Acl, AclError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| AclError::Read {
            path: shown.clone(),
            source,
        })?;
        Acl::from_toml(&text, &shown)
    }

    /// Parses an ACL file's text (`path` only names it in errors).
    pub fn from_toml(text: &str, path: &str) -> Result<Acl, AclError> {
        let acl: Acl = toml::from_str(text).map_err(|source| AclError::Parse {
            path: path.to_string(),
            source,
        })?;
        if acl.teams.is_empty() {
            return Err(AclError::NoTeams(path.to_string()));
        }
        Ok(acl)
    }

    fn user(caller: &Caller) -> Result<&str, Denied> {
        match caller {
            Caller::User(n) => Ok(n),
            Caller::Anonymous(why) => Err(Denied::Unauthenticated(why.clone())),
        }
    }

    fn team(&self, team: &str) -> Result<&TeamAcl, Denied> {
        self.teams.get(team).ok_or_else(|| {
            let known: Vec<&str> = self.teams.keys().map(String::as_str).collect();
            Denied::BadRequest(format!(
                "unknown team {team:?} (declared: {})",
                known.join(", ")
            ))
        })
    }

    /// Whether `caller` may read the queue.
    pub fn may_read(&self, caller: &Caller) -> Result<(), Denied> {
        Self::user(caller).map(|_| ())
    }

    /// The user who may submit to `team` at `priority`, or why not.
    pub fn may_submit(
        &self,
        caller: &Caller,
        team: &str,
        priority: Priority,
    ) -> Result<String, Denied> {
        let user = Self::user(caller)?;
        let rules = self.team(team)?;
        if rules.admins.contains(user) || self.admins.contains(user) {
            return Ok(user.to_string());
        }
        match rules.submit.get(user) {
            Some(max) if priority <= *max => Ok(user.to_string()),
            Some(max) => Err(Denied::Forbidden(format!(
                "{user} may submit to team {team} up to priority {max}, not {priority}"
            ))),
            None => Err(Denied::Forbidden(format!(
                "{user} may not submit to team {team}"
            ))),
        }
    }

    /// Whether `caller` may cancel a job of `team` submitted by `owner`: its owner, the team's
    /// administrators and the queue's.
    pub fn may_cancel(&self, caller: &Caller, team: &str, owner: &str) -> Result<(), Denied> {
        let user = Self::user(caller)?;
        let team_admin = self
            .teams
            .get(team)
            .is_some_and(|t| t.admins.contains(user));
        if user == owner || team_admin || self.admins.contains(user) {
            return Ok(());
        }
        Err(Denied::Forbidden(format!(
            "{user} may not cancel a job of {owner} in team {team} (only its owner and the \
             team's administrators may)"
        )))
    }

    /// Whether `caller` may read the logs of a job of `owner` in `team`: as for cancelling,
    /// its owner, the team's administrators and the queue's.
    pub fn may_read_logs(&self, caller: &Caller, team: &str, owner: &str) -> Result<(), Denied> {
        self.may_cancel(caller, team, owner).map_err(|d| match d {
            Denied::Forbidden(_) => Denied::Forbidden(format!(
                "{} may not read the logs of a job of {owner} in team {team} (only its owner \
                 and the team's administrators may)",
                caller.name()
            )),
            other => other,
        })
    }

    /// Whether `caller` may shut the queue down (its administrators).
    pub fn may_shutdown(&self, caller: &Caller) -> Result<(), Denied> {
        let user = Self::user(caller)?;
        if self.admins.contains(user) {
            return Ok(());
        }
        Err(Denied::Forbidden(format!(
            "{user} may not shut the queue down (queue administrators only)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
admins = ["root"]
[teams.nlp]
submit = { alice = "normal", dave = "high" }
admins = ["carol"]
[teams.cv]
submit = { bob = "critical" }
"#;

    fn user(n: &str) -> Caller {
        Caller::User(n.into())
    }

    #[test]
    fn submissions_follow_team_and_priority() {
        let acl = Acl::from_toml(FILE, "acl.toml").unwrap();
        assert_eq!(
            acl.may_submit(&user("alice"), "nlp", Priority::Normal),
            Ok("alice".into())
        );
        assert_eq!(
            acl.may_submit(&user("alice"), "nlp", Priority::High),
            Err(Denied::Forbidden(
                "alice may submit to team nlp up to priority normal, not high".into()
            ))
        );
        assert_eq!(
            acl.may_submit(&user("bob"), "nlp", Priority::Low),
            Err(Denied::Forbidden("bob may not submit to team nlp".into()))
        );
        assert_eq!(
            acl.may_submit(&user("carol"), "nlp", Priority::Critical),
            Ok("carol".into())
        );
        assert_eq!(
            acl.may_submit(&user("alice"), "speech", Priority::Low),
            Err(Denied::BadRequest(
                "unknown team \"speech\" (declared: cv, nlp)".into()
            ))
        );
        assert!(matches!(
            acl.may_submit(&Caller::Anonymous("no token".into()), "nlp", Priority::Low),
            Err(Denied::Unauthenticated(_))
        ));
    }

    #[test]
    fn owners_team_admins_and_queue_admins_cancel() {
        let acl = Acl::from_toml(FILE, "acl.toml").unwrap();
        assert!(acl.may_cancel(&user("alice"), "nlp", "alice").is_ok());
        assert!(acl.may_cancel(&user("carol"), "nlp", "alice").is_ok());
        assert!(acl.may_cancel(&user("root"), "nlp", "alice").is_ok());
        assert!(matches!(
            acl.may_cancel(&user("bob"), "nlp", "alice"),
            Err(Denied::Forbidden(_))
        ));
        assert!(matches!(
            acl.may_cancel(&user("carol"), "cv", "bob"),
            Err(Denied::Forbidden(_))
        ));
        assert!(acl.may_shutdown(&user("root")).is_ok());
        assert!(acl.may_shutdown(&user("carol")).is_err());
        assert!(acl.may_read(&user("bob")).is_ok());
        assert!(acl.may_read(&Caller::Anonymous("x".into())).is_err());
    }

    #[test]
    fn a_bad_file_is_refused_with_its_name() {
        let err = Acl::from_toml("[teams.nlp]\nsubmit = { a = \"urgent\" }\n", "acl.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("acl.toml") && err.contains("unknown variant `urgent`"),
            "{err}"
        );
        let err = Acl::from_toml("admins = []\n", "acl.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("declares no team"), "{err}");
        let err = Acl::from_toml("[teams.nlp]\nsubmitters = []\n", "acl.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field"), "{err}");
    }
}
